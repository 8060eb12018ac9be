//! The cascade on recorded rows: several `eval --hybrid --rows` files over the same rows, one per LLM stage in
//! cascade order. Stage k+1 starts from stage k's fused distribution by the same step serving takes
//! (`tiergate_core::fusion::step`, through [`after_stage`]) and goes on by the same rule (`tiergate_core::fusion::goes_on`), so its fusion
//! is fitted on what stage k leaves (`fit-fusion --stage`) and the cascade is measured per (first stage's
//! escalation share, next stage's θ) (`eval --hybrid --from-rows FIRST --stage-rows NEXT`).

use serde::Serialize;
use tiergate_prefilter::heads::FittedFusion;
use tiergate_prefilter::Classifier;

use super::fit::{after_stage, Row};

/// The θ that escalates `share` of the rows (the ambiguity quantile); −1 (below every ambiguity, even a
/// certain row's 0) when the share is all of them.
pub fn theta_for_share(rows: &[Row], share: f64) -> f64 {
    let mut a: Vec<f64> = rows.iter().map(|r| r.ambiguity).collect();
    a.sort_by(|x, y| y.total_cmp(x));
    let k = ((share * a.len() as f64).round() as usize).min(a.len());
    match k {
        0 => 1.0,
        k => a.get(k).copied().unwrap_or(-1.0),
    }
}

/// One LLM stage read back from its rows file.
pub struct StageRows {
    /// Its LLM (as the file names it).
    pub llm: String,
    /// Tier-0's rows with this LLM's scores (rows it did not score have none).
    pub rows: Vec<Row>,
}

/// The fit in force for stage `k` of a cascade whose LLMs before it are `after`: the head's `fusion.json`
/// for the first stage, else a `fusion.STAGE.json` made with this LLM after the same stages.
pub fn stage_fit<'a>(
    classifier: &'a Classifier,
    k: usize,
    llm: &str,
    after: &[String],
) -> Option<&'a FittedFusion> {
    if k == 0 {
        return tiergate_prefilter::heads::fit_for(classifier.fusion.as_ref(), llm, after);
    }
    classifier
        .stage_fusions
        .iter()
        .map(|(_, f)| f)
        .find(|f| f.llm == llm && f.after == after)
}

/// The rows the last of `stages` sees, each stage fused with its fit: the distribution the stages before it
/// leave (most likely first) with its LLM's scores, on the rows every stage before it scored. Stages before
/// the last must have a fit (`Err` names the missing one).
pub fn chain(classifier: &Classifier, stages: &[StageRows]) -> anyhow::Result<Vec<Row>> {
    let Some((first, rest)) = stages.split_first() else {
        anyhow::bail!("no stage rows");
    };
    let mut current = first.rows.clone();
    let mut after = vec![first.llm.clone()];
    let mut prev_llm = first.llm.clone();
    for (k, next) in rest.iter().enumerate() {
        let fit = stage_fit(classifier, k, &prev_llm, &after[..k]).ok_or_else(|| {
            anyhow::anyhow!(
                "stage {} ({prev_llm}) has no fit in the head folder: fit it first (tiergate fit-fusion{})",
                k + 1,
                if k == 0 { String::new() } else { " --stage NAME --prior-rows …".into() }
            )
        })?;
        current = current
            .iter()
            .zip(&next.rows)
            .map(
                |(row, n)| match after_stage(row, fit.llm_weight, fit.llm_temperature) {
                    Some((mut r, order)) => {
                        r.llm = n.llm.as_ref().map(|s| Row::reordered(s, &order));
                        r.llm_s = n.llm_s;
                        r
                    }
                    // Not escalated this far: the row keeps its answer and goes no further.
                    None => Row::scored(row.gold, row.top.clone(), None),
                },
            )
            .collect();
        prev_llm = next.llm.clone();
        after.push(next.llm.clone());
    }
    Ok(current)
}

/// One point of a two-stage cascade (`--json`: `cascade[]`).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct CascadePoint {
    /// The first LLM stage's escalation share (of all rows) and θ.
    pub first_share: f64,
    pub first_theta: f64,
    /// The second stage's θ on the first stage's fused ambiguity.
    pub second_theta: f64,
    /// Rows each stage scored.
    pub first_rows: usize,
    pub second_rows: usize,
    /// Accuracy over all rows.
    pub accuracy: f64,
    /// LLM seconds per row over all rows (both stages).
    pub llm_seconds_per_row: f64,
}

/// Fusion weights and temperatures of the two stages.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Fusions {
    pub first: (f32, f32),
    pub second: (f32, f32),
}

/// The cascade over Tier-0 rows with the first stage's scores (`first`) and the second's (`second`, over the
/// same rows in Tier-0's candidate order), per first-stage share and second-stage θ. Points that would send
/// a row to a stage that did not score it are left out.
pub fn grid(
    first: &[Row],
    second: &[Row],
    f: Fusions,
    shares: &[f64],
    thetas: &[f64],
) -> Vec<CascadePoint> {
    let n = first.len().max(1) as f64;
    let mut out = Vec::new();
    for &share in shares {
        let theta1 = theta_for_share(first, share);
        let escalated: Vec<usize> = (0..first.len())
            .filter(|&i| first[i].ambiguity > theta1)
            .collect();
        if escalated.iter().any(|&i| first[i].llm.is_none()) {
            continue;
        }
        'theta: for &theta2 in thetas {
            let (mut right, mut seconds, mut second_rows) = (0usize, 0.0, 0usize);
            for (i, row) in first.iter().enumerate() {
                let Some((fused, order)) = (row.ambiguity > theta1)
                    .then(|| after_stage(row, f.first.0, f.first.1))
                    .flatten()
                else {
                    right += usize::from(row.tier0_right());
                    continue;
                };
                seconds += row.llm_s;
                if !tiergate_core::fusion::goes_on(fused.ambiguity, theta2) {
                    right += usize::from(fused.tier0_right());
                    continue;
                }
                let Some(scores) = &second[i].llm else {
                    continue 'theta;
                };
                let mut r = fused;
                r.llm = Some(Row::reordered(scores, &order));
                right += usize::from(r.fused_right(f.second.0, f.second.1));
                seconds += second[i].llm_s;
                second_rows += 1;
            }
            out.push(CascadePoint {
                first_share: share,
                first_theta: theta1,
                second_theta: theta2,
                first_rows: escalated.len(),
                second_rows,
                accuracy: right as f64 / n,
                llm_seconds_per_row: seconds / n,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(gold: usize, top: &[(usize, f32)], llm: Option<&[f32]>, s: f64) -> Row {
        let mut r = Row::scored(Some(gold), top.to_vec(), llm.map(<[f32]>::to_vec));
        r.llm_s = s;
        r
    }

    /// Four rows: two Tier-0 is sure of (right), two ambiguous ones the first LLM half-fixes and the second
    /// finishes. The grid counts each stage's rows and seconds and the accuracy of what the last stage left.
    #[test]
    fn a_second_stage_runs_where_the_first_left_doubt() {
        let sure = [(0, 0.95), (1, 0.05)];
        let unsure = [(0, 0.55), (1, 0.45)];
        // First LLM: no opinion on row 2, sure of the right label on row 3.
        let first = vec![
            row(0, &sure, None, 0.0),
            row(0, &sure, None, 0.0),
            row(1, &unsure, Some(&[0.0, 0.0]), 1.0),
            row(1, &unsure, Some(&[0.0, 9.0]), 1.0),
        ];
        // Second LLM (candidates in Tier-0's order): sure of label 1 on both ambiguous rows.
        let second = vec![
            row(0, &sure, None, 0.0),
            row(0, &sure, None, 0.0),
            row(1, &unsure, Some(&[0.0, 9.0]), 3.0),
            row(1, &unsure, Some(&[0.0, 9.0]), 3.0),
        ];
        let f = Fusions {
            first: (0.5, 1.0),
            second: (0.5, 1.0),
        };
        let g = grid(&first, &second, f, &[0.5], &[1.0, 0.4]);
        assert_eq!(g.len(), 2);
        // θ2 = 1: the first stage alone; row 2 stays wrong (0.55 / 0.45 fused with a uniform), row 3 fixed.
        assert_eq!((g[0].first_rows, g[0].second_rows), (2, 0));
        assert!((g[0].accuracy - 0.75).abs() < 1e-9);
        assert!((g[0].llm_seconds_per_row - 0.5).abs() < 1e-9);
        // θ2 = 0.4: row 2's fused ambiguity (0.475) goes on and is fixed; row 3's (0.275) stops.
        assert_eq!(g[1].second_rows, 1);
        assert!((g[1].accuracy - 1.0).abs() < 1e-9);
        assert!((g[1].llm_seconds_per_row - 1.25).abs() < 1e-9);
        // A share that escalates rows the first LLM never saw is left out.
        assert!(grid(&first, &second, f, &[1.0], &[1.0]).is_empty());
    }
}
