//! Fitting the fusion on a dev split (`tiergate fit-fusion`, `eval --hybrid`): the weight and temperature with
//! the most correct fused answers on one half of the rows the LLM saw, kept only when a sign test on the other
//! half (rows the choice never saw) says the gain over Tier-0 is not luck. Testing the best of ~160 grid points
//! on the rows it was picked on would pass almost any LLM.

use tiergate_core::fusion::{argmax, fuse, llm_probs};

/// One evaluated row.
#[derive(Debug, Clone)]
pub struct Row {
    /// Gold label index (None: a label the head does not know).
    pub gold: Option<usize>,
    /// Tier-0's top candidates (label index, probability).
    pub top: Vec<(usize, f32)>,
    /// 1 − max p.
    pub ambiguity: f64,
    /// The LLM's scores over `top` (rows the LLM ran on).
    pub llm: Option<Vec<f32>>,
    /// LLM seconds for this row.
    pub llm_s: f64,
    /// The query's embedding when the classifier is grounded (else empty).
    pub embedding: Vec<f32>,
}

impl Row {
    /// A row the LLM scored with `llm` (or did not, `None`) over Tier-0's candidates `top`, most likely first;
    /// no timing, no embedding (synthetic rows, rows read back from a file).
    pub fn scored(gold: Option<usize>, top: Vec<(usize, f32)>, llm: Option<Vec<f32>>) -> Self {
        let ambiguity = 1.0 - top.first().map_or(0.0, |t| f64::from(t.1));
        Self {
            gold,
            top,
            ambiguity,
            llm,
            llm_s: 0.0,
            embedding: Vec::new(),
        }
    }

    /// Whether candidate `i` is the gold label.
    pub fn pick(&self, i: usize) -> bool {
        self.gold.is_some() && self.top.get(i).map(|t| t.0) == self.gold
    }
    /// Tier-0's first candidate is right.
    pub fn tier0_right(&self) -> bool {
        self.pick(0)
    }
    /// The LLM's best-scored candidate is right.
    pub fn llm_right(&self) -> bool {
        self.llm.as_ref().is_some_and(|s| self.pick(argmax(s)))
    }
    /// The fusion at weight `w`, temperature `t` is right (Tier-0's answer on rows the LLM did not see).
    pub fn fused_right(&self, w: f32, t: f32) -> bool {
        match &self.llm {
            Some(s) => {
                let p0: Vec<f32> = self.top.iter().map(|x| x.1).collect();
                self.pick(argmax(&fuse(&p0, &llm_probs(s, t), w)))
            }
            None => self.tier0_right(),
        }
    }
}

/// A cascade's next stage sees a row as the previous stage left it: its candidates with the fused mass (at
/// weight `w`, temperature `t`), most likely first, as that stage's prior; `None` for a row the previous
/// stage's LLM did not score (the cascade stopped before it). With it, the order of the candidates
/// (`order[j]`: the index in `row.top` of the new `j`-th), to line up the next LLM's scores with
/// [`Row::reordered`].
pub fn after_stage(row: &Row, w: f32, t: f32) -> Option<(Row, Vec<usize>)> {
    let scores = row.llm.as_ref()?;
    let s = tiergate_core::fusion::step(&row.top, scores, w, t);
    let mut next = Row::scored(row.gold, s.fused, None);
    next.embedding.clone_from(&row.embedding);
    Some((next, s.order))
}

impl Row {
    /// `scores` (over the candidates in their earlier order) in the order `order` of [`after_stage`].
    pub fn reordered(scores: &[f32], order: &[usize]) -> Vec<f32> {
        order
            .iter()
            .map(|&i| scores.get(i).copied().unwrap_or(f32::NEG_INFINITY))
            .collect()
    }
}

/// Weights and temperatures tried by the fit (weight 0 first: it wins every tie).
pub const FIT_WEIGHTS: [f32; 21] = [
    0.0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7, 0.75, 0.8,
    0.85, 0.9, 0.95, 1.0,
];
/// Temperatures tried by the fit.
pub const FIT_TEMPERATURES: [f32; 8] = [0.05, 0.1, 0.2, 0.35, 0.5, 1.0, 2.0, 4.0];

/// Evidence the fit needs before the LLM gets any weight: a one-sided sign test on the rows the fusion fixes
/// against the rows it breaks (relative to Tier-0) must reach this level.
pub const FIT_ALPHA: f64 = 0.05;

/// The outcome of [`fit`].
#[derive(Debug, Clone, PartialEq)]
pub struct Fit {
    /// The weight in force (0 unless the gain is significant).
    pub w: f32,
    /// The temperature in force.
    pub t: f32,
    /// Correct fused answers with (w, t) on the rows the LLM saw.
    pub correct: usize,
    /// Correct Tier-0 answers on them.
    pub tier0: usize,
    /// The most accurate (weight, temperature) on the choosing half, before the significance check.
    pub best: (f32, f32),
    /// Rows it fixes relative to Tier-0 on the testing half (rows the choice did not see).
    pub fixed: usize,
    /// Rows it breaks there.
    pub broken: usize,
    /// One-sided sign-test p-value of fixed vs broken there.
    pub p_value: f64,
    /// Rows it fixes and breaks on the choosing half (in-sample: optimistic, reported beside the test).
    pub chosen_on: (usize, usize),
}

/// The halves of the rows the LLM saw, by a fixed hash of each row's position (not its parity: a dev file
/// sorted by label would put a periodic pattern in one half): one chooses, the other tests.
fn halves(rows: &[Row]) -> (Vec<&Row>, Vec<&Row>) {
    let seen: Vec<&Row> = rows.iter().filter(|r| r.llm.is_some()).collect();
    let (mut choose, mut test) = (Vec::new(), Vec::new());
    for (i, r) in seen.into_iter().enumerate() {
        // SplitMix64's finaliser of the position.
        let mut z = (i as u64).wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        if (z ^ (z >> 31)) & 1 == 0 {
            choose.push(r);
        } else {
            test.push(r);
        }
    }
    (choose, test)
}

fn fixed_broken(rows: &[&Row], w: f32, t: f32) -> (usize, usize) {
    rows.iter().fold((0, 0), |(f, b), r| {
        match (r.fused_right(w, t), r.tier0_right()) {
            (true, false) => (f + 1, b),
            (false, true) => (f, b + 1),
            _ => (f, b),
        }
    })
}

/// P(X ≥ fixed) for X ~ Binomial(fixed + broken, 1/2): how likely the fusion's net gain is luck.
pub fn sign_test_p(fixed: usize, broken: usize) -> f64 {
    if fixed + broken == 0 {
        return 1.0;
    }
    tiergate_core::risk::binomial_sf(fixed as u64, (fixed + broken) as u64, 0.5)
}

/// The (weight, temperature) with the most correct fused answers on the choosing half of the rows the LLM saw
/// (ties to the smaller weight, then to temperature 1), kept only when its gain over Tier-0 on the testing half
/// passes the sign test at [`FIT_ALPHA`]; otherwise weight 0: an LLM is trusted only where rows the choice
/// never saw show it helps beyond chance.
pub fn fit(rows: &[Row]) -> Fit {
    let (choose, test) = halves(rows);
    let count = |w: f32, t: f32| choose.iter().filter(|r| r.fused_right(w, t)).count();
    let mut best = (0.0, 1.0, count(0.0, 1.0));
    for &w in &FIT_WEIGHTS[1..] {
        for &t in &FIT_TEMPERATURES {
            let c = count(w, t);
            if c > best.2 {
                best = (w, t, c);
            }
        }
    }
    let (w, t, _) = best;
    let (fixed, broken) = fixed_broken(&test, w, t);
    let p_value = sign_test_p(fixed, broken);
    let keep = w > 0.0 && p_value <= FIT_ALPHA;
    let (w_in, t_in) = if keep { (w, t) } else { (0.0, 1.0) };
    let seen = choose.iter().chain(&test);
    Fit {
        w: w_in,
        t: t_in,
        correct: seen.clone().filter(|r| r.fused_right(w_in, t_in)).count(),
        tier0: seen.filter(|r| r.tier0_right()).count(),
        best: (w, t),
        fixed,
        broken,
        p_value,
        chosen_on: fixed_broken(&choose, w, t),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(gold: usize, top: &[(usize, f32)], llm: Option<&[f32]>) -> Row {
        Row::scored(Some(gold), top.to_vec(), llm.map(<[f32]>::to_vec))
    }

    /// Synthetic rows where the LLM is right whenever Tier-0's runner-up is gold: the fit recovers a weight
    /// that flips exactly those, and picks 0 for a scorer that knows nothing.
    #[test]
    fn fit_finds_a_helpful_weight_and_zero_for_a_useless_scorer() {
        let mut rows = Vec::new();
        for i in 0..80 {
            // Tier-0 0.55/0.45; gold is the runner-up on a quarter of the rows; the LLM is sure of the gold.
            let gold = if i % 4 == 0 { 1 } else { 0 };
            let llm: Vec<f32> = if gold == 1 {
                vec![0.0, 3.0]
            } else {
                vec![3.0, 0.0]
            };
            rows.push(row(gold, &[(0, 0.55), (1, 0.45)], Some(&llm)));
        }
        // Chosen on one half, tested on the other: the 20 fixes split between them, none broken.
        let f = fit(&rows);
        assert_eq!((f.correct, f.tier0), (80, 60));
        assert_eq!((f.fixed + f.chosen_on.0, f.broken + f.chosen_on.1), (20, 0));
        assert!(f.w > 0.0 && f.p_value < 0.01, "{f:?}");
        // A gain too small to tell from luck (2 rows fixed, 1 broken, whichever half they fall in): weight 0.
        let mut few = rows[..8].to_vec();
        few[1].llm = Some(vec![0.0, 3.0]);
        let f = fit(&few);
        assert!(f.fixed <= 2 && f.fixed + f.chosen_on.0 == 2, "{f:?}");
        assert_eq!((f.w, f.t, f.correct), (0.0, 1.0, f.tier0));
        // A useless scorer: the same scores whatever the row.
        for r in &mut rows {
            r.llm = Some(vec![0.0, 1.0]);
        }
        let f = fit(&rows);
        assert_eq!((f.w, f.t, f.correct, f.tier0), (0.0, 1.0, 60, 60));
    }

    /// An LLM that knows nothing, fitted on many small dev sets: choosing on one half and testing on the other
    /// passes it at most about α of the time (testing on the rows it was chosen on passes it more often).
    #[test]
    fn the_guard_tests_on_rows_the_choice_did_not_see() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 11) as f64 / (1u64 << 53) as f64
        };
        let (mut passed, mut in_sample, sets) = (0, 0, 300);
        for _ in 0..sets {
            // 80 rows; Tier-0 unsure (0.36/0.33/0.31) and right 40% of the time; the LLM's scores are noise,
            // so many (w, T) flip many rows and the best of them looks good on the rows it was picked on.
            let rows: Vec<Row> = (0..80)
                .map(|_| {
                    let gold = if next() < 0.4 {
                        0
                    } else {
                        1 + usize::from(next() < 0.5)
                    };
                    let llm: Vec<f32> = (0..3).map(|_| (next() * 3.0) as f32).collect();
                    row(gold, &[(0, 0.36), (1, 0.33), (2, 0.31)], Some(&llm))
                })
                .collect();
            let f = fit(&rows);
            passed += usize::from(f.w > 0.0);
            in_sample += usize::from(
                f.best.0 > 0.0 && sign_test_p(f.chosen_on.0, f.chosen_on.1) <= FIT_ALPHA,
            );
        }
        eprintln!("a useless LLM: weight in {passed} of {sets} fits; the in-sample test would pass {in_sample}");
        // α = 5% of 300 is 15; 30 is far above its binomial spread.
        assert!(
            passed <= 30,
            "a useless LLM got weight in {passed} of {sets} fits"
        );
        assert!(
            in_sample > passed,
            "the in-sample test is the optimistic one"
        );
    }

    /// The next stage's prior is the fused distribution, most likely first, with the gold kept and the next
    /// LLM's scores following their candidates; rows the stage did not score go no further.
    #[test]
    fn a_later_stage_starts_from_the_fused_distribution() {
        // Tier-0 0.6 / 0.4 on labels 7 / 9; the LLM is sure of label 9: at w = 0.5 the fusion flips the order.
        let r = row(9, &[(7, 0.6), (9, 0.4)], Some(&[0.0, 10.0]));
        let (next, order) = after_stage(&r, 0.5, 1.0).unwrap();
        assert_eq!(order, vec![1, 0]);
        assert_eq!(next.top[0].0, 9);
        assert!(next.tier0_right(), "the prior's answer is now the gold");
        assert!((next.top[0].1 - 0.7).abs() < 1e-3, "{:?}", next.top);
        assert!((next.ambiguity - 0.3).abs() < 1e-3);
        // The next LLM's scores (over 7, 9 as the earlier stage saw them) follow their candidates.
        assert_eq!(Row::reordered(&[1.0, 2.0], &order), vec![2.0, 1.0]);
        assert!(after_stage(&row(9, &[(7, 0.6), (9, 0.4)], None), 0.5, 1.0).is_none());
        // At weight 0 the order is the earlier one.
        let (same, order) = after_stage(&r, 0.0, 1.0).unwrap();
        assert_eq!((same.top[0].0, order), (7, vec![0, 1]));
    }

    #[test]
    fn sign_test_matches_hand_computed_tails() {
        assert!((sign_test_p(3, 1) - 5.0 / 16.0).abs() < 1e-12);
        assert!((sign_test_p(10, 0) - 1.0 / 1024.0).abs() < 1e-12);
        assert_eq!(sign_test_p(0, 0), 1.0);
        assert!((sign_test_p(0, 5) - 1.0).abs() < 1e-12);
    }
}
