//! `tiergate eval --risk`: for each stated error ε, the θ `mode = "risk"` would choose on the head's stored
//! calibration rows (`calibration.json`), and what it does on other labelled rows: the share escalated and
//! the realised error of the answers Tier-0 gives alone. With `--coverage N` the calibration and test rows are
//! pooled and re-split N times (same sizes), θ chosen again each time, to count how often the bound held,
//! beside the naive choice (the largest θ whose empirical error is ≤ ε).

use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde::Serialize;
use tiergate_core::risk::{choose, choose_naive, Row};

/// The ε values reported.
pub const MAX_ERRORS: [f64; 4] = [0.01, 0.02, 0.05, 0.10];

/// One ε of the report.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct RiskRow {
    /// ε: the largest error allowed among the answers Tier-0 gives alone.
    pub max_error: f64,
    /// 1 − δ.
    pub confidence: f64,
    /// θ chosen on the calibration rows (0: everything escalates).
    pub theta: f64,
    /// Calibration rows the choice was made on.
    pub n_calibration: usize,
    /// Clopper–Pearson upper bound on the calibration rows' accepted error at θ.
    pub upper_bound: f64,
    /// On the evaluated rows: share with ambiguity above θ.
    pub escalated_share: f64,
    /// On the evaluated rows: error of those at or below θ (`null` when none is).
    pub realised_error: Option<f64>,
    /// Why θ is 0, when it is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<&'static str>,
}

/// Escalated share and realised error of `theta` on `rows`.
pub fn realised(rows: &[Row], theta: f64) -> (f64, Option<f64>) {
    let kept: Vec<&Row> = rows.iter().filter(|r| r.ambiguity <= theta).collect();
    let escalated = 1.0 - kept.len() as f64 / rows.len().max(1) as f64;
    let wrong = kept.iter().filter(|r| r.wrong).count();
    (
        escalated,
        (!kept.is_empty()).then(|| wrong as f64 / kept.len() as f64),
    )
}

/// The report for every ε of [`MAX_ERRORS`].
pub fn report(
    ordering: &[Row],
    calibration: &[Row],
    test: &[Row],
    confidence: f64,
) -> Vec<RiskRow> {
    MAX_ERRORS
        .iter()
        .map(|&eps| {
            let c = choose(ordering, calibration, eps, 1.0 - confidence);
            let (escalated_share, realised_error) = realised(test, c.theta);
            RiskRow {
                max_error: eps,
                confidence,
                theta: c.theta,
                n_calibration: calibration.len(),
                upper_bound: c.upper_bound,
                escalated_share,
                realised_error,
                note: c.reason,
            }
        })
        .collect()
}

/// Where a head's calibration rows came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CalibrationSource {
    /// The head's `calibration.json` (held out at training; the evaluated rows are all test rows).
    Head,
    /// Drawn from the evaluated rows, for a head without calibration rows (a checkpoint, a head trained before
    /// them): a quarter orders the grid, a quarter calibrates, the other half is what θ is measured on.
    Data,
}

/// The evaluated rows in three disjoint parts drawn with `seed`: (ordering, calibration, test), a quarter, a
/// quarter and the rest: what `eval --risk` uses for a head without `calibration.json`.
pub fn split_rows(rows: &[Row], seed: u64) -> (Vec<Row>, Vec<Row>, Vec<Row>) {
    let mut pool = rows.to_vec();
    pool.shuffle(&mut rand::rngs::StdRng::seed_from_u64(seed));
    let q = pool.len() / 4;
    let test = pool.split_off(2 * q);
    let calibration = pool.split_off(q);
    (pool, calibration, test)
}

/// Coverage of one ε over many re-splits, for the bound and for the naive choice.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Coverage {
    /// ε.
    pub max_error: f64,
    /// 1 − δ.
    pub confidence: f64,
    /// Re-splits.
    pub splits: usize,
    /// Re-splits whose realised test error (0 when nothing is accepted) was ≤ ε, with the bound's θ.
    pub held: usize,
    /// Mean escalated share on the test rows with the bound's θ.
    pub escalated_share: f64,
    /// Mean θ chosen.
    pub mean_theta: f64,
    /// The same with the naive choice.
    pub naive_held: usize,
    /// Mean escalated share with the naive choice.
    pub naive_escalated_share: f64,
}

/// Pools `calibration` and `test`, re-splits them `splits` times into parts of the same sizes (seeded),
/// chooses θ on the first part each time and measures it on the second.
pub fn coverage(
    ordering: &[Row],
    calibration: &[Row],
    test: &[Row],
    eps: f64,
    confidence: f64,
    splits: usize,
    seed: u64,
) -> Coverage {
    let mut pool: Vec<Row> = calibration.iter().chain(test).copied().collect();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut out = Coverage {
        max_error: eps,
        confidence,
        splits,
        held: 0,
        escalated_share: 0.0,
        mean_theta: 0.0,
        naive_held: 0,
        naive_escalated_share: 0.0,
    };
    for _ in 0..splits {
        pool.shuffle(&mut rng);
        let (cal, tst) = pool.split_at(calibration.len());
        let theta = choose(ordering, cal, eps, 1.0 - confidence).theta;
        let (esc, err) = realised(tst, theta);
        out.held += usize::from(err.unwrap_or(0.0) <= eps);
        out.escalated_share += esc / splits as f64;
        out.mean_theta += theta / splits as f64;
        let (esc, err) = realised(tst, choose_naive(cal, eps));
        out.naive_held += usize::from(err.unwrap_or(0.0) <= eps);
        out.naive_escalated_share += esc / splits as f64;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(n: usize, wrong_above: f64) -> Vec<Row> {
        (0..n)
            .map(|i| {
                let a = i as f64 / n as f64;
                Row {
                    ambiguity: a,
                    wrong: a > wrong_above,
                }
            })
            .collect()
    }

    #[test]
    fn a_clean_low_ambiguity_region_is_accepted_and_measured() {
        // Wrong only above 0.6: ε = 5% at 95% accepts up to about 0.6 and the realised error there is small.
        let (order, cal, test) = (rows(400, 0.6), rows(1000, 0.6), rows(500, 0.6));
        let r = report(&order, &cal, &test, 0.95);
        assert_eq!(r.len(), 4);
        let five = &r[2];
        assert!(five.theta > 0.55 && five.theta <= 0.64, "{five:?}");
        assert!(five.upper_bound <= 0.05);
        assert!(five.realised_error.unwrap() <= 0.05);
        assert!((five.escalated_share - (1.0 - five.theta)).abs() < 0.01);
    }

    /// Rows of a calibrated head: ambiguity `u³` (most answers confident) and wrong with probability equal to
    /// the ambiguity, so the error of the answers with ambiguity ≤ θ is θ / 4 and the largest θ that holds
    /// ε = 5 % is 0.2. Random, unlike [`rows`]: the naive choice reads noise as room and fails often.
    fn noisy_rows(n: usize, rng: &mut rand::rngs::StdRng) -> Vec<Row> {
        use rand::Rng;
        (0..n)
            .map(|_| {
                let a = rng.gen::<f64>().powi(3);
                Row {
                    ambiguity: a,
                    wrong: rng.gen::<f64>() < a,
                }
            })
            .collect()
    }

    #[test]
    fn coverage_counts_both_choices() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let order = noisy_rows(500, &mut rng);
        let cal = noisy_rows(1000, &mut rng);
        // Many test rows: the realised error is then the true error of θ's accepted answers, not a noisy count.
        let test = noisy_rows(20_000, &mut rng);
        let c = coverage(&order, &cal, &test, 0.05, 0.95, 40, 1);
        assert_eq!(c.splits, 40);
        // Learn-then-Test holds in at least 1 − δ of the re-splits (allowing one of 40 for the draw); the naive
        // choice, made to the edge of ε on noisy rows, breaks the bound in a good share of them.
        assert!(c.held >= 37, "{c:?}");
        assert!(
            c.naive_held <= 32,
            "the naive choice should fail on noisy rows: {c:?}"
        );
        assert!(c.held > c.naive_held, "{c:?}");
        // The bound pays for its guarantee with a smaller θ (more escalation), never a larger one.
        assert!(c.mean_theta < 0.2 && c.mean_theta > 0.1, "{c:?}");
        assert!(c.naive_escalated_share < c.escalated_share, "{c:?}");
        assert_eq!(realised(&[], 0.5), (1.0, None));
    }

    #[test]
    fn rows_without_a_heads_calibration_split_in_three_disjoint_parts() {
        let rows: Vec<Row> = (0..103)
            .map(|i| Row {
                ambiguity: f64::from(i) / 103.0,
                wrong: i % 3 == 0,
            })
            .collect();
        let (o, c, t) = split_rows(&rows, 5);
        assert_eq!((o.len(), c.len(), t.len()), (25, 25, 53));
        let mut all: Vec<f64> = o.iter().chain(&c).chain(&t).map(|r| r.ambiguity).collect();
        all.sort_by(f64::total_cmp);
        assert_eq!(
            all,
            rows.iter().map(|r| r.ambiguity).collect::<Vec<_>>(),
            "each row once"
        );
        assert_eq!(split_rows(&rows, 5), (o.clone(), c, t), "seeded");
        assert_ne!(split_rows(&rows, 6).0, o);
    }
}
