//! The error bound of Tier-0's lone answers: exact binomial tails, Clopper–Pearson intervals, and the choice
//! of θ by Learn-then-Test with fixed-sequence testing (Angelopoulos, Bates, Candès, Jordan, Lei 2021,
//! "Learn then Test: Calibrating Predictive Algorithms to Achieve Risk Control", §4 and their fixed-sequence
//! procedure).
//!
//! The guarantee. Calibration rows `(a, wrong)` are exchangeable with the traffic the policy will answer.
//! For each θ on a grid fixed before the rows are seen, H_θ says "the error of the answers with ambiguity
//! ≤ θ is above ε". Conditional on the number n_θ of rows with `a ≤ θ`, those rows are an i.i.d. sample of
//! that conditional distribution, so the errors among them are Binomial(n_θ, R(θ)) and
//! `p_θ = P(Binomial(n_θ, ε) ≤ k_θ)` is a valid p-value for H_θ. Testing the grid in a fixed order, each at
//! level δ, and stopping at the first p-value above δ controls the family-wise error at δ; the chosen θ is
//! the last one rejected, so P(R(θ̂) > ε) ≤ δ. θ = 0 (escalate everything: Tier-0 answers nothing alone)
//! satisfies every ε and is the answer when no H_θ can be rejected.
//!
//! The order. Fixed-sequence testing loses its power when its first hypotheses have too few rows to reject
//! anything, so the grid comes from rows the test never sees (the half of the dev split that fitted the
//! temperature): θ_j are that half's ambiguity quantiles, and testing starts at the quantile where that
//! half's own p-value is smallest. Only the independent half fixes the grid, never the calibration rows, so
//! the proof above holds (LTT §5 learns the order on a split of its own the same way).

/// `ln P(Binomial(n, p) = i)` terms are summed in log space up to `k`: `P(Binomial(n, p) ≤ k)`.
pub fn binomial_cdf(k: u64, n: u64, p: f64) -> f64 {
    if k >= n || p <= 0.0 {
        return 1.0;
    }
    if p >= 1.0 {
        return 0.0;
    }
    let (lp, lq) = (p.ln(), (-p).ln_1p());
    let mut term = n as f64 * lq;
    let mut acc = term;
    for i in 0..k {
        term += ((n - i) as f64).ln() - ((i + 1) as f64).ln() + lp - lq;
        let (hi, lo) = if acc > term { (acc, term) } else { (term, acc) };
        acc = hi + (lo - hi).exp().ln_1p();
    }
    acc.exp().min(1.0)
}

/// `P(Binomial(n, p) ≥ k)`, the upper tail, summed in log space from `k` (so that small tails keep their
/// precision instead of being 1 minus a number close to 1).
pub fn binomial_sf(k: u64, n: u64, p: f64) -> f64 {
    if k == 0 || p >= 1.0 {
        return 1.0;
    }
    if k > n || p <= 0.0 {
        return 0.0;
    }
    let (lp, lq) = (p.ln(), (-p).ln_1p());
    // ln C(n, k) + k ln p + (n − k) ln q, then the terms above it by the ratio of neighbours.
    let ln_choose: f64 = (1..=k)
        .map(|j| ((n - k + j) as f64).ln() - (j as f64).ln())
        .sum();
    let mut term = ln_choose + k as f64 * lp + (n - k) as f64 * lq;
    let mut acc = term;
    for i in k..n {
        term += ((n - i) as f64).ln() - ((i + 1) as f64).ln() + lp - lq;
        let (hi, lo) = if acc > term { (acc, term) } else { (term, acc) };
        acc = hi + (lo - hi).exp().ln_1p();
    }
    acc.exp().min(1.0)
}

/// One-sided Clopper–Pearson upper bound at confidence `1 − delta` on a rate with `k` events in `n` trials:
/// the largest p with `P(Binomial(n, p) ≤ k) ≥ delta` (1 when `n` = 0 or `k` = `n`).
pub fn clopper_pearson_upper(k: u64, n: u64, delta: f64) -> f64 {
    if n == 0 || k >= n {
        return 1.0;
    }
    let (mut lo, mut hi) = (k as f64 / n as f64, 1.0);
    for _ in 0..60 {
        let mid = 0.5 * (lo + hi);
        if binomial_cdf(k, n, mid) >= delta {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    lo
}

/// One-sided Clopper–Pearson lower bound at confidence `1 − delta` (0 when `k` = 0).
pub fn clopper_pearson_lower(k: u64, n: u64, delta: f64) -> f64 {
    if n == 0 || k == 0 {
        return 0.0;
    }
    // P(X ≥ k; p) increases with p.
    let (mut lo, mut hi) = (0.0, k as f64 / n as f64);
    for _ in 0..60 {
        let mid = 0.5 * (lo + hi);
        if binomial_sf(k, n, mid) >= delta {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    hi
}

/// The two-sided Clopper–Pearson interval at confidence `confidence` on `k` events in `n` trials.
pub fn clopper_pearson(k: u64, n: u64, confidence: f64) -> (f64, f64) {
    let tail = (1.0 - confidence) / 2.0;
    (
        clopper_pearson_lower(k, n, tail),
        clopper_pearson_upper(k, n, tail),
    )
}

/// ln Γ(x) for x > 0 (Lanczos, g = 7, nine terms: ~1e-15 relative).
fn ln_gamma(x: f64) -> f64 {
    const G: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        // Reflection.
        return (std::f64::consts::PI / (std::f64::consts::PI * x).sin()).ln() - ln_gamma(1.0 - x);
    }
    let x = x - 1.0;
    let t = x + 7.5;
    let sum = G[1..]
        .iter()
        .enumerate()
        .fold(G[0], |s, (i, g)| s + g / (x + i as f64 + 1.0));
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + sum.ln()
}

/// The continued fraction of the incomplete beta function (modified Lentz).
fn beta_cf(a: f64, b: f64, x: f64) -> f64 {
    const TINY: f64 = 1e-300;
    let (qab, qap, qam) = (a + b, a + 1.0, a - 1.0);
    let mut c = 1.0;
    let mut d = 1.0 - qab * x / qap;
    d = 1.0 / if d.abs() < TINY { TINY } else { d };
    let mut h = d;
    for m in 1..=300 {
        let m = f64::from(m);
        let m2 = 2.0 * m;
        let aa = m * (b - m) * x / ((qam + m2) * (a + m2));
        d = 1.0 + aa * d;
        d = 1.0 / if d.abs() < TINY { TINY } else { d };
        c = 1.0 + aa / c;
        c = if c.abs() < TINY { TINY } else { c };
        h *= d * c;
        let aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2));
        d = 1.0 + aa * d;
        d = 1.0 / if d.abs() < TINY { TINY } else { d };
        c = 1.0 + aa / c;
        c = if c.abs() < TINY { TINY } else { c };
        let del = d * c;
        h *= del;
        if (del - 1.0).abs() < 1e-15 {
            break;
        }
    }
    h
}

/// The regularized incomplete beta function I_x(a, b), a, b > 0, x in [0, 1].
pub fn beta_inc(a: f64, b: f64, x: f64) -> f64 {
    if x <= 0.0 {
        return 0.0;
    }
    if x >= 1.0 {
        return 1.0;
    }
    let front =
        (ln_gamma(a + b) - ln_gamma(a) - ln_gamma(b) + a * x.ln() + b * (1.0 - x).ln()).exp();
    if x < (a + 1.0) / (a + b + 2.0) {
        front * beta_cf(a, b, x) / a
    } else {
        1.0 - front * beta_cf(b, a, 1.0 - x) / b
    }
}

/// The two-sided Clopper–Pearson interval for a real-valued count: `k` events in `n` trials (the beta
/// quantiles `B(tail; k, n − k + 1)` and `B(1 − tail; k + 1, n − k)`). For whole numbers it is
/// [`clopper_pearson`] up to the bisection's precision.
pub fn clopper_pearson_real(k: f64, n: f64, confidence: f64) -> (f64, f64) {
    let tail = (1.0 - confidence) / 2.0;
    if n.is_nan() || n <= 0.0 {
        return (0.0, 1.0);
    }
    let k = k.clamp(0.0, n);
    // I_p(a, b) increases with p: the p where it crosses `target`.
    let solve = |a: f64, b: f64, target: f64| {
        let (mut lo, mut hi) = (0.0, 1.0);
        for _ in 0..100 {
            let mid = 0.5 * (lo + hi);
            if beta_inc(a, b, mid) < target {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        0.5 * (lo + hi)
    };
    let lower = if k <= 0.0 {
        0.0
    } else {
        solve(k, n - k + 1.0, tail)
    };
    let upper = if k >= n {
        1.0
    } else {
        solve(k + 1.0, n - k, 1.0 - tail)
    };
    (lower, upper)
}

/// Sums over weighted observations of a rate (each weight the inverse of the probability it was sampled
/// with): enough for the weighted estimate and its Kish effective sample size.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct WeightedCount {
    /// Observations, and how many were events (unweighted).
    pub n: u64,
    pub k: u64,
    /// Σw, Σw², Σw over the events.
    pub w: f64,
    pub w2: f64,
    pub wk: f64,
}

impl WeightedCount {
    /// Adds one observation with weight `w`.
    pub fn add(&mut self, w: f64, event: bool) {
        self.n += 1;
        self.k += u64::from(event);
        self.w += w;
        self.w2 += w * w;
        if event {
            self.wk += w;
        }
    }

    /// Adds another's sums.
    pub fn merge(&mut self, o: &WeightedCount) {
        self.n += o.n;
        self.k += o.k;
        self.w += o.w;
        self.w2 += o.w2;
        self.wk += o.wk;
    }

    /// The weighted (Horvitz–Thompson ratio) estimate Σw·event / Σw.
    pub fn estimate(&self) -> Option<f64> {
        (self.w > 0.0).then(|| self.wk / self.w)
    }

    /// Kish's effective sample size (Σw)² / Σw²: `n` when every weight is the same.
    pub fn effective_n(&self) -> f64 {
        if self.w2 > 0.0 {
            self.w * self.w / self.w2
        } else {
            0.0
        }
    }

    /// The estimate with a Clopper–Pearson interval on the Kish effective sample size (Korn and Graubard's
    /// adaptation for weighted samples): `p̂·n_eff` events in `n_eff` trials. With equal weights n_eff = n and
    /// p̂·n_eff = k, and the interval is the exact one ([`clopper_pearson`]).
    pub fn interval(&self, confidence: f64) -> Option<(f64, f64, f64)> {
        let p = self.estimate()?;
        let n_eff = self.effective_n();
        let equal = (n_eff - self.n as f64).abs() < 1e-6 * self.n as f64
            && (p * self.n as f64 - self.k as f64).abs() < 1e-6;
        let (lo, hi) = if equal {
            clopper_pearson(self.k, self.n, confidence)
        } else {
            clopper_pearson_real(p * n_eff, n_eff, confidence)
        };
        Some((p, lo, hi))
    }
}

/// One labelled calibration row: Tier-0's ambiguity and whether its answer was wrong.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Row {
    /// Ambiguity `1 − max p`.
    pub ambiguity: f64,
    /// Tier-0's top label was not the true one.
    pub wrong: bool,
}

/// What the θ choice found.
#[derive(Debug, Clone, PartialEq)]
pub struct Choice {
    /// The largest θ whose bound held (0: escalate everything).
    pub theta: f64,
    /// Calibration rows with ambiguity ≤ θ.
    pub accepted: u64,
    /// Of those, wrong.
    pub errors: u64,
    /// Clopper–Pearson upper bound (at the stated confidence) on their error.
    pub upper_bound: f64,
    /// Hypotheses tested (grid points, in order, up to the first not rejected).
    pub tested: usize,
    /// Why θ is 0, when it is.
    pub reason: Option<&'static str>,
}

/// `n_min`: the fewest rows that can show an error rate ≤ `eps` at level `delta` when none of them is wrong.
pub fn min_rows(eps: f64, delta: f64) -> u64 {
    if eps <= 0.0 || eps >= 1.0 || delta <= 0.0 || delta >= 1.0 {
        return u64::MAX;
    }
    (delta.ln() / (-eps).ln_1p()).ceil() as u64
}

/// The θ grid, in testing order (ascending): the ambiguity quantiles of `order_rows` (rows the test never
/// sees) at levels 1%, 2%, …, 100%, from the level where those rows' own p-value is smallest (the hypothesis
/// most likely to be rejected first); without ordering rows, θ = 0.01, 0.02, …, 1. Duplicates are dropped.
pub fn grid(order_rows: &[Row], eps: f64) -> Vec<f64> {
    let mut sorted: Vec<f64> = order_rows
        .iter()
        .map(|r| r.ambiguity)
        .filter(|a| a.is_finite())
        .collect();
    if sorted.is_empty() {
        return (1..=100).map(|j| f64::from(j) / 100.0).collect();
    }
    sorted.sort_by(f64::total_cmp);
    let mut out: Vec<f64> = (1..=100u32)
        .filter_map(|l| crate::stats::quantile_sorted(&sorted, f64::from(l) / 100.0))
        .collect();
    out.dedup_by(|a, b| (*a - *b).abs() < 1e-12);
    let start = out
        .iter()
        .enumerate()
        .map(|(i, &t)| {
            let (n, k) = counts(order_rows, t);
            (i, binomial_cdf(k, n, eps))
        })
        .fold(
            (0, f64::INFINITY),
            |best, (i, p)| if p <= best.1 { (i, p) } else { best },
        )
        .0;
    out.split_off(start)
}

fn counts(rows: &[Row], theta: f64) -> (u64, u64) {
    rows.iter()
        .filter(|r| r.ambiguity <= theta)
        .fold((0, 0), |(n, k), r| (n + 1, k + u64::from(r.wrong)))
}

/// A labelled audit of live traffic: the row, and the θ in force when it was drawn (only answers with
/// ambiguity ≤ that θ could be drawn, so it is evidence about hypotheses at or below it only).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Audited {
    pub row: Row,
    /// θ_eff at the draw.
    pub drawn_at: f64,
}

/// Counts for H_θ among audits: those drawn with θ_eff ≥ θ (an i.i.d. sample of the traffic's answers with
/// ambiguity ≤ θ once restricted to them) with ambiguity ≤ θ.
pub fn audit_counts(rows: &[Audited], theta: f64) -> (u64, u64) {
    rows.iter()
        .filter(|a| a.drawn_at >= theta && a.row.ambiguity <= theta)
        .fold((0, 0), |(n, k), a| (n + 1, k + u64::from(a.row.wrong)))
}

/// Learn-then-Test with fixed-sequence testing: the largest θ on [`grid`] (tested in order, stopping at the
/// first hypothesis not rejected) for which the error of answers with ambiguity ≤ θ is ≤ `eps` with
/// confidence `1 − delta`. See the module documentation for the proof.
pub fn choose(order_rows: &[Row], rows: &[Row], eps: f64, delta: f64) -> Choice {
    fixed_sequence(order_rows, rows.len() as u64, eps, delta, |t| {
        counts(rows, t)
    })
}

/// Whether the audits show the bound broken at `theta` on the traffic they sampled: the one-sided p-value of
/// "the error of answers with ambiguity ≤ θ is at most ε", `P(Binomial(n, ε) ≥ k)` over the audits that
/// could have been drawn under θ ([`audit_counts`]), with `n` and `k`.
pub fn breach(rows: &[Audited], theta: f64, eps: f64) -> (u64, u64, f64) {
    let (n, k) = audit_counts(rows, theta);
    (n, k, binomial_sf(k, n, eps))
}

/// [`choose`] on labelled audits of live traffic: the same grid and test, each hypothesis on the audits that
/// could have been drawn under it ([`Audited`]). Its guarantee is about the traffic the audits sampled.
pub fn choose_audited(order_rows: &[Row], rows: &[Audited], eps: f64, delta: f64) -> Choice {
    fixed_sequence(order_rows, rows.len() as u64, eps, delta, |t| {
        audit_counts(rows, t)
    })
}

fn fixed_sequence(
    order_rows: &[Row],
    n: u64,
    eps: f64,
    delta: f64,
    counts: impl Fn(f64) -> (u64, u64),
) -> Choice {
    let mut best = Choice {
        theta: 0.0,
        accepted: 0,
        errors: 0,
        upper_bound: 0.0,
        tested: 0,
        reason: Some("no θ on the grid could be shown to hold the bound: every request escalates"),
    };
    if !(eps > 0.0 && eps < 1.0 && delta > 0.0 && delta < 1.0) {
        best.reason = Some("max_error and 1 − confidence must be in (0, 1)");
        return best;
    }
    if n < min_rows(eps, delta) {
        best.reason = Some("too few calibration rows for this max_error and confidence");
        return best;
    }
    for (i, theta) in grid(order_rows, eps).into_iter().enumerate() {
        let (accepted, errors) = counts(theta);
        if binomial_cdf(errors, accepted, eps) > delta {
            best.tested = i + 1;
            break;
        }
        best = Choice {
            theta,
            accepted,
            errors,
            upper_bound: clopper_pearson_upper(errors, accepted, delta),
            tested: i + 1,
            reason: None,
        };
    }
    best
}

/// The naive choice, for comparison only (no guarantee): the largest θ on the grid whose empirical error on
/// the calibration rows is ≤ `eps`.
pub fn choose_naive(rows: &[Row], eps: f64) -> f64 {
    grid(&[], eps)
        .into_iter()
        .filter(|&t| {
            let (n, k) = counts(rows, t);
            n > 0 && k as f64 <= eps * n as f64
        })
        .fold(0.0, f64::max)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small deterministic generator (SplitMix64), so the coverage test needs no dependency.
    struct Rng(u64);
    impl Rng {
        fn uniform(&mut self) -> f64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64
        }
        /// A calibrated head's row: ambiguity `u³` (most answers confident) and wrong with probability `a`,
        /// so the error of answers with ambiguity ≤ θ is exactly θ / 4 (E[u³ | u³ ≤ θ]).
        fn row(&mut self) -> Row {
            let a = self.uniform().powi(3);
            Row {
                ambiguity: a,
                wrong: self.uniform() < a,
            }
        }
    }

    #[test]
    fn binomial_tails_match_exact_sums() {
        // P(Bin(10, 0.3) ≤ 2) = 0.3827827864
        assert!((binomial_cdf(2, 10, 0.3) - 0.382_782_786_4).abs() < 1e-9);
        assert_eq!(binomial_cdf(10, 10, 0.3), 1.0);
        assert!((binomial_cdf(0, 5, 0.5) - 1.0 / 32.0).abs() < 1e-12);
        // The upper tail is the complement, and keeps its precision far out.
        assert!((binomial_sf(3, 10, 0.3) - (1.0 - 0.382_782_786_4)).abs() < 1e-9);
        assert!((binomial_sf(10, 10, 0.5) - 1.0 / 1024.0).abs() < 1e-15);
        assert_eq!((binomial_sf(0, 5, 0.1), binomial_sf(6, 5, 0.1)), (1.0, 0.0));
        // Large n stays finite (log space): P(Bin(10000, 0.1) ≤ 1000) ≈ 0.5 + a small continuity term.
        let mid = binomial_cdf(1000, 10_000, 0.1);
        assert!(mid > 0.5 && mid < 0.53, "{mid}");
    }

    #[test]
    fn clopper_pearson_bounds_match_reference_values() {
        // k = 0: the upper bound solves (1 − p)^n = δ.
        let u = clopper_pearson_upper(0, 100, 0.05);
        assert!((u - (1.0 - 0.05f64.powf(0.01))).abs() < 1e-9, "{u}");
        // Two-sided 95% for 5 of 100: (0.01643, 0.11284) (the Beta quantiles).
        let (lo, hi) = clopper_pearson(5, 100, 0.95);
        assert!(
            (lo - 0.016_431).abs() < 1e-5 && (hi - 0.112_835).abs() < 1e-5,
            "{lo} {hi}"
        );
        assert_eq!(clopper_pearson(0, 0, 0.95), (0.0, 1.0));
        assert_eq!(clopper_pearson(7, 7, 0.95).1, 1.0);
    }

    #[test]
    fn min_rows_is_the_zero_error_sample_size() {
        assert_eq!(min_rows(0.05, 0.05), 59);
        assert_eq!(min_rows(0.02, 0.05), 149);
        assert!(0.95f64.powi(59) <= 0.05 && 0.95f64.powi(58) > 0.05);
    }

    /// Over many independent calibration sets with a known error curve, the chosen θ breaks the bound in at
    /// most about δ of them (binomial slack), while the naive choice breaks it about half the time.
    #[test]
    fn the_bound_holds_with_the_stated_confidence_over_many_seeds() {
        let (eps, delta, seeds) = (0.05, 0.1, 400);
        let (mut broken, mut naive_broken, mut thetas) = (0, 0, 0.0);
        for seed in 0..seeds {
            let mut rng = Rng(seed);
            let order: Vec<Row> = (0..500).map(|_| rng.row()).collect();
            let rows: Vec<Row> = (0..1000).map(|_| rng.row()).collect();
            let c = choose(&order, &rows, eps, delta);
            // The true error of the accepted answers is θ / 4; the best θ is 0.2.
            broken += usize::from(c.theta / 4.0 > eps);
            naive_broken += usize::from(choose_naive(&rows, eps) / 4.0 > eps);
            thetas += c.theta;
            if c.theta > 0.0 {
                assert!(c.upper_bound <= eps + 1e-9, "{c:?}");
            }
        }
        // δ · seeds = 40 expected at most; 58 is the 99.8% point of Binomial(400, 0.1).
        assert!(broken <= 58, "the bound broke in {broken} of {seeds}");
        assert!(
            naive_broken > 120,
            "the naive choice broke in only {naive_broken}"
        );
        let mean = thetas / f64::from(seeds as u32);
        eprintln!(
            "bound broken {broken}/{seeds}, naive broken {naive_broken}/{seeds}, mean θ {mean:.3}"
        );
        assert!(
            mean > 0.1 && mean < 0.2,
            "mean θ {mean} (best 0.2): the test has power"
        );
    }

    /// Audits drawn under θ = 0.3 say nothing about θ above it: the choice on them never passes 0.3, and on
    /// audits of a traffic worse than the calibration rows it is lower.
    #[test]
    fn audits_bound_only_the_thetas_they_were_drawn_under() {
        let mut rng = Rng(11);
        let order: Vec<Row> = (0..500).map(|_| rng.row()).collect();
        let drawn = |rng: &mut Rng, worse: bool| -> Vec<Audited> {
            let mut out = Vec::new();
            for _ in 0..4000 {
                let mut r = rng.row();
                if r.ambiguity > 0.3 {
                    continue;
                }
                // The worse traffic: 5 points more errors at every ambiguity.
                r.wrong |= worse && rng.uniform() < 0.05;
                out.push(Audited {
                    row: r,
                    drawn_at: 0.3,
                });
            }
            out
        };
        let (clean, worse) = (drawn(&mut rng, false), drawn(&mut rng, true));
        let same = choose_audited(&order, &clean, 0.05, 0.1);
        assert!(same.theta <= 0.3 && same.theta > 0.1, "{same:?}");
        let lower = choose_audited(&order, &worse, 0.05, 0.1);
        assert!(lower.theta < same.theta, "{lower:?} vs {same:?}");
        // At θ = 0.2 the clean traffic's error is 5%: no breach; 5 points more is one, clearly.
        assert!(breach(&clean, 0.2, 0.05).2 > 0.1);
        let (n, k, p) = breach(&worse, 0.2, 0.05);
        assert!(p < 0.001 && k as f64 > 0.08 * n as f64, "{n} {k} {p}");
        assert_eq!(
            breach(&worse, 0.35, 0.05).0,
            0,
            "nothing was drawn under θ = 0.35"
        );
    }

    #[test]
    fn too_small_an_error_for_the_rows_escalates_everything() {
        let mut rng = Rng(7);
        let rows: Vec<Row> = (0..100).map(|_| rng.row()).collect();
        let c = choose(&[], &rows, 0.01, 0.05);
        assert_eq!(c.theta, 0.0);
        assert!(c.reason.is_some_and(|r| r.contains("too few")));
        // Enough rows but a head wrong on every row: nothing is rejected.
        let bad: Vec<Row> = (0..1000)
            .map(|i| Row {
                ambiguity: f64::from(i) / 1000.0,
                wrong: true,
            })
            .collect();
        let c = choose(&[], &bad, 0.05, 0.05);
        assert_eq!((c.theta, c.tested), (0.0, 1));
        assert!(c.reason.is_some());
    }

    #[test]
    fn grid_starts_where_the_ordering_rows_are_surest() {
        // Ordering rows wrong only above ambiguity 0.5: the p-value at ε = 5% is smallest at the last quantile
        // before the errors start.
        let order: Vec<Row> = (0..100)
            .map(|i| Row {
                ambiguity: f64::from(i) / 100.0,
                wrong: i >= 50,
            })
            .collect();
        let g = grid(&order, 0.05);
        assert_eq!(g.first().copied(), Some(0.49), "{g:?}");
        assert_eq!(g.last().copied(), Some(0.99));
        assert!(g.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(grid(&[], 0.05).len(), 100);
    }

    #[test]
    fn the_real_valued_interval_matches_the_exact_one_on_whole_counts() {
        for (k, n) in [(0u64, 10u64), (1, 2), (5, 100), (10, 10), (3, 47)] {
            let exact = clopper_pearson(k, n, 0.95);
            let real = clopper_pearson_real(k as f64, n as f64, 0.95);
            assert!(
                (exact.0 - real.0).abs() < 1e-7 && (exact.1 - real.1).abs() < 1e-7,
                "{k}/{n}: {exact:?} vs {real:?}"
            );
        }
        assert!((beta_inc(2.0, 3.0, 0.4) - 0.5248).abs() < 1e-12);
    }

    #[test]
    fn weighted_counts_use_the_kish_effective_size_and_reduce_to_the_exact_interval() {
        // A constant rate: every weight 1 / 0.2 = 5, so the figures are the unweighted ones, exactly.
        let mut same = WeightedCount::default();
        for i in 0..100 {
            same.add(5.0, i % 20 == 0);
        }
        let (p, lo, hi) = same.interval(0.95).unwrap();
        assert_eq!((p, (lo, hi)), (0.05, clopper_pearson(5, 100, 0.95)));
        assert!((same.effective_n() - 100.0).abs() < 1e-9);
        // Two rates: 50 audits drawn at 0.5 (weight 2, none wrong) and 50 at 0.05 (weight 20, 10 wrong). The
        // unweighted share (10%) understates the traffic's error; weighted it is 200 / 1100.
        let mut mixed = WeightedCount::default();
        for _ in 0..50 {
            mixed.add(2.0, false);
        }
        for i in 0..50 {
            mixed.add(20.0, i % 5 == 0);
        }
        let (p, lo, hi) = mixed.interval(0.95).unwrap();
        assert!((p - 200.0 / 1100.0).abs() < 1e-12);
        let n_eff = mixed.effective_n();
        assert!((n_eff - 1100.0 * 1100.0 / 20200.0).abs() < 1e-9 && n_eff < 100.0);
        // Wider than an interval on 100 unweighted rows at the same share.
        let plain = clopper_pearson_real(p * 100.0, 100.0, 0.95);
        assert!(
            lo < plain.0 && hi > plain.1 && lo < p && p < hi,
            "{lo} {hi} {plain:?}"
        );
        assert_eq!(WeightedCount::default().interval(0.95), None);
    }
}
