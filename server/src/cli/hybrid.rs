//! `tiergate eval --hybrid` and `tiergate fit-fusion`: run the configured LLM (through the real worker and
//! queue) over the rows Tier-0 is least sure of, then report per θ what escalation buys, or fit the fusion.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;
use tiergate_config::{Config, RouteKind};
use tiergate_prefilter::heads::FittedFusion;
use tiergate_prefilter::Classifier;
use tiergate_queue::fusion::{argmax, fuse, llm_probs};
use tiergate_queue::{Candidate, Job, Reply};
use tiergate_train::data::Example;

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
    fn pick(&self, i: usize) -> bool {
        self.gold.is_some() && self.top.get(i).map(|t| t.0) == self.gold
    }
    fn tier0_right(&self) -> bool {
        self.pick(0)
    }
    fn llm_right(&self) -> bool {
        self.llm.as_ref().is_some_and(|s| self.pick(argmax(s)))
    }
    fn fused_right(&self, w: f32, t: f32) -> bool {
        match &self.llm {
            Some(s) => {
                let p0: Vec<f32> = self.top.iter().map(|x| x.1).collect();
                self.pick(argmax(&fuse(&p0, &llm_probs(s, t), w)))
            }
            None => self.tier0_right(),
        }
    }
}

/// One θ of the grid (`--json`: `grid[]`).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct GridPoint {
    /// The threshold: escalate when 1 − max p > θ.
    pub theta: f64,
    /// Share of rows escalated.
    pub escalated_share: f64,
    /// Rows escalated.
    pub escalated: usize,
    /// Accuracy of Tier-0 alone over all rows.
    pub tier0_accuracy: f64,
    /// Accuracy over all rows with the escalated ones answered by the fusion.
    pub hybrid_accuracy: f64,
    /// On the escalated rows: Tier-0 alone.
    pub escalated_tier0_accuracy: Option<f64>,
    /// On the escalated rows: the LLM alone (its best candidate).
    pub escalated_llm_accuracy: Option<f64>,
    /// On the escalated rows: the fusion.
    pub escalated_fused_accuracy: Option<f64>,
    /// Mean LLM seconds per escalation.
    pub llm_seconds_per_escalation: Option<f64>,
}

/// Figures per θ. Rows the LLM did not run on count as Tier-0 answers; θ values that would escalate rows
/// the LLM did not see are left out.
pub fn grid(rows: &[Row], thetas: &[f64], w: f32, t: f32) -> Vec<GridPoint> {
    let n = rows.len().max(1) as f64;
    let tier0 = rows.iter().filter(|r| r.tier0_right()).count() as f64 / n;
    let mut out = Vec::new();
    for &theta in thetas {
        let esc: Vec<&Row> = rows.iter().filter(|r| r.ambiguity > theta).collect();
        if esc.iter().any(|r| r.llm.is_none()) {
            continue;
        }
        let share = |f: &dyn Fn(&Row) -> bool| {
            (!esc.is_empty()).then(|| esc.iter().filter(|r| f(r)).count() as f64 / esc.len() as f64)
        };
        let hybrid = rows
            .iter()
            .filter(|r| {
                if r.ambiguity > theta {
                    r.fused_right(w, t)
                } else {
                    r.tier0_right()
                }
            })
            .count() as f64
            / n;
        out.push(GridPoint {
            theta,
            escalated_share: esc.len() as f64 / n,
            escalated: esc.len(),
            tier0_accuracy: tier0,
            hybrid_accuracy: hybrid,
            escalated_tier0_accuracy: share(&|r| r.tier0_right()),
            escalated_llm_accuracy: share(&|r| r.llm_right()),
            escalated_fused_accuracy: share(&|r| r.fused_right(w, t)),
            llm_seconds_per_escalation: (!esc.is_empty())
                .then(|| esc.iter().map(|r| r.llm_s).sum::<f64>() / esc.len() as f64),
        });
    }
    out
}

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
    /// The most accurate (weight, temperature) on the grid, before the significance check.
    pub best: (f32, f32),
    /// Rows it fixes and breaks relative to Tier-0.
    pub fixed: usize,
    /// Rows it breaks.
    pub broken: usize,
    /// One-sided sign-test p-value of fixed vs broken.
    pub p_value: f64,
}

/// P(X ≥ fixed) for X ~ Binomial(fixed + broken, 1/2): how likely the fusion's net gain is luck.
pub fn sign_test_p(fixed: usize, broken: usize) -> f64 {
    let n = fixed + broken;
    if n == 0 {
        return 1.0;
    }
    let ln_fact = |k: usize| (1..=k).map(|i| (i as f64).ln()).sum::<f64>();
    let ln_n = ln_fact(n);
    let ln_half = (0.5f64).ln() * n as f64;
    (fixed..=n)
        .map(|k| (ln_n - ln_fact(k) - ln_fact(n - k) + ln_half).exp())
        .sum::<f64>()
        .min(1.0)
}

/// The (weight, temperature) with the most correct fused answers on the rows the LLM saw (ties to the smaller
/// weight, then to temperature 1), kept only when its gain over Tier-0 passes the sign test at [`FIT_ALPHA`];
/// otherwise weight 0: an LLM is trusted only where the dev split shows it helps beyond chance.
pub fn fit(rows: &[Row]) -> Fit {
    let seen: Vec<&Row> = rows.iter().filter(|r| r.llm.is_some()).collect();
    let tier0 = seen.iter().filter(|r| r.tier0_right()).count();
    let mut best = (0.0, 1.0, tier0);
    for &w in &FIT_WEIGHTS[1..] {
        for &t in &FIT_TEMPERATURES {
            let c = seen.iter().filter(|r| r.fused_right(w, t)).count();
            if c > best.2 {
                best = (w, t, c);
            }
        }
    }
    let (w, t, correct) = best;
    let fixed = seen
        .iter()
        .filter(|r| r.fused_right(w, t) && !r.tier0_right())
        .count();
    let broken = seen
        .iter()
        .filter(|r| !r.fused_right(w, t) && r.tier0_right())
        .count();
    let p_value = sign_test_p(fixed, broken);
    let keep = w > 0.0 && p_value <= FIT_ALPHA;
    Fit {
        w: if keep { w } else { 0.0 },
        t: if keep { t } else { 1.0 },
        correct: if keep { correct } else { tier0 },
        tier0,
        best: (w, t),
        fixed,
        broken,
        p_value,
    }
}

/// Tier-0 over `rows` (batched), top-k candidates per row.
pub fn tier0_rows(classifier: &Classifier, rows: &[Example], k: usize) -> anyhow::Result<Vec<Row>> {
    let labels = classifier.labels();
    let mut out = Vec::with_capacity(rows.len());
    for chunk in rows.chunks(32) {
        let tokens = chunk
            .iter()
            .map(|e| classifier.tokenizer.encode(&e.text))
            .collect::<Result<Vec<_>, _>>()?;
        let refs: Vec<_> = tokens.iter().collect();
        let (probs, embeddings) = classifier.probabilities_and_embeddings(&refs)?;
        for ((e, p), embedding) in chunk.iter().zip(probs).zip(embeddings) {
            let mut idx: Vec<usize> = (0..p.len()).collect();
            idx.sort_by(|a, b| p[*b].total_cmp(&p[*a]));
            let top: Vec<(usize, f32)> = idx.iter().take(k.max(1)).map(|&i| (i, p[i])).collect();
            out.push(Row {
                gold: labels.iter().position(|l| *l == e.label),
                ambiguity: 1.0 - f64::from(top.first().map_or(0.0, |t| t.1)),
                top,
                llm: None,
                llm_s: 0.0,
                embedding,
            });
        }
    }
    Ok(out)
}

/// Loads a classifier folder with the config's token limit and precision (what serving would use),
/// grounded when the configured formulation shows examples nearest the query.
pub fn load_classifier(dir: &Path, config: &Config) -> anyhow::Result<Classifier> {
    let mut c = Classifier::from_dir(dir, config.prefilter.max_tokens, config.prefilter.precision)
        .with_context(|| format!("loading classifier {}", dir.display()))?;
    if tiergate_server::app::grounded(config, &route_prompts(config)) {
        c.ground()?;
    }
    Ok(c)
}

/// Tier-0 over `examples`, then the configured LLM over the `max_escalated` share Tier-0 is least sure of:
/// what `eval --hybrid` reports on and `fit-fusion` fits on. `scored` sees each row as soon as the LLM has
/// scored it (the most ambiguous first), so a run cut short keeps what it measured.
pub fn score_rows(
    config: &Config,
    classifier: &Classifier,
    examples: &[Example],
    max_escalated: f64,
    progress: &mut dyn FnMut(&str),
    scored: &mut dyn FnMut(usize, &Row) -> anyhow::Result<()>,
) -> anyhow::Result<Vec<Row>> {
    anyhow::ensure!(
        max_escalated > 0.0 && max_escalated <= 1.0,
        "--max-escalated must be in (0, 1]"
    );
    let mut rows = tier0_rows(classifier, examples, config.reranker.candidates)?;
    let low = theta_for_share(&rows, max_escalated);
    let texts: Vec<&str> = examples.iter().map(|r| r.text.as_str()).collect();
    run_llm(config, classifier, &texts, &mut rows, low, progress, scored)?;
    Ok(rows)
}

/// Runs the configured LLM over the rows with ambiguity above `theta_low` (through a real worker process
/// and the shared-memory queue, as the server does), one at a time so the seconds are the service time.
fn run_llm(
    config: &Config,
    classifier: &Classifier,
    texts: &[&str],
    rows: &mut [Row],
    theta_low: f64,
    progress: &mut dyn FnMut(&str),
    scored: &mut dyn FnMut(usize, &Row) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let program = super::serve::worker_program();
    let llm = tiergate_server::app::start_llm(config, program)?;
    let t = Instant::now();
    while llm.client.live_workers() == 0 {
        anyhow::ensure!(
            t.elapsed() < Duration::from_secs(300),
            "the LLM worker did not become ready in 300 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let prompt = route_prompts(config);
    let mut todo: Vec<usize> = (0..rows.len())
        .filter(|&i| rows[i].ambiguity > theta_low)
        .collect();
    todo.sort_by(|&a, &b| rows[b].ambiguity.total_cmp(&rows[a].ambiguity));
    progress(&format!("LLM: {} rows to score", todo.len()));
    for (n, &i) in todo.iter().enumerate() {
        let candidates = rows[i]
            .top
            .iter()
            .map(|&(l, p)| Candidate {
                label: classifier.labels()[l].clone(),
                description: classifier.replies.get(l).cloned().flatten(),
                examples: classifier.examples_for(l, &rows[i].embedding),
                p,
            })
            .collect();
        let job = Job::Rerank {
            text: texts[i].to_string(),
            candidates,
            llm_weight: 0.0,
            llm_temperature: 1.0,
            prompt: prompt.clone(),
        };
        let t = Instant::now();
        let reply = llm
            .client
            .call(&job, Duration::from_secs(120))
            .with_context(|| format!("LLM on row {i}"))?;
        let Reply::Rerank(r) = reply else {
            anyhow::bail!("the worker answered a rerank with another kind of reply")
        };
        anyhow::ensure!(
            r.scores.len() == rows[i].top.len(),
            "the worker returned {} scores for {} candidates",
            r.scores.len(),
            rows[i].top.len()
        );
        rows[i].llm_s = t.elapsed().as_secs_f64();
        rows[i].llm = Some(r.scores);
        scored(i, &rows[i])?;
        if (n + 1) % 50 == 0 {
            progress(&format!("LLM: {}/{} rows", n + 1, todo.len()));
        }
    }
    Ok(())
}

/// The prompt templates of the first classify route (else `[reranker.prompts]`).
fn route_prompts(config: &Config) -> tiergate_config::PromptConfig {
    config
        .routes
        .iter()
        .find(|r| r.kind == RouteKind::Classify)
        .and_then(|r| r.prompts.clone())
        .unwrap_or_else(|| config.reranker.prompts.clone())
}

/// The LLM's name for reports and `fusion.json` (see [`tiergate_server::app::llm_name`]).
pub fn llm_name(config: &Config) -> String {
    tiergate_server::app::llm_name(config, &route_prompts(config))
}

/// One line of an `eval --hybrid --rows FILE`: row `i` of the data, Tier-0's candidates, the LLM's scores.
pub fn row_line(i: usize, example: &Example, row: &Row, labels: &[String], llm: &str) -> String {
    serde_json::json!({
        "row": i,
        "text": example.text,
        "gold": example.label,
        "tier0": row.top.iter().map(|&(l, p)| serde_json::json!({"label": labels[l], "p": p})).collect::<Vec<_>>(),
        "ambiguity": row.ambiguity,
        "llm_scores": row.llm,
        "llm_s": row.llm.as_ref().map(|_| row.llm_s),
        "llm": llm,
    })
    .to_string()
}

/// The rows of an earlier `eval --hybrid --rows FILE` over the same data: Tier-0 is run again here (and must
/// give the candidates the file holds: the same head), the LLM's scores and seconds come from the file.
/// Lines name their data row (`row`); a file cut short (a killed run) gives the LLM scores it has, and rows
/// it lacks count as not escalated. Returns the rows, the LLM the file was written with (the configured one
/// when the file does not say) and how many of the data's rows the file holds.
pub fn rows_from_file(
    path: &Path,
    config: &Config,
    classifier: &Classifier,
    examples: &[Example],
) -> anyhow::Result<(Vec<Row>, String, usize)> {
    let k = config.reranker.candidates;
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let mut rows = tier0_rows(classifier, examples, k)?;
    let mut seen = vec![false; examples.len()];
    let mut llm = llm_name(config);
    for (n, line) in lines.iter().enumerate() {
        let at = || format!("{} line {}", path.display(), n + 1);
        let v: serde_json::Value = serde_json::from_str(line).with_context(at)?;
        // Files written before lines named their row hold every row in data order.
        let i = v["row"].as_u64().map_or(n, |i| i as usize);
        anyhow::ensure!(
            i < examples.len() && !seen[i],
            "{}: row {i} is outside the data ({} rows) or given twice (the same --data and split are needed)",
            at(),
            examples.len()
        );
        seen[i] = true;
        read_row_line(&v, &examples[i], &mut rows[i], classifier.labels()).with_context(at)?;
        if let Some(name) = v["llm"].as_str() {
            llm = name.to_string();
        }
    }
    Ok((rows, llm, lines.len()))
}

/// Checks one line against the data's row and Tier-0's candidates, and takes its LLM scores.
fn read_row_line(
    v: &serde_json::Value,
    example: &Example,
    row: &mut Row,
    labels: &[String],
) -> anyhow::Result<()> {
    anyhow::ensure!(
        v["text"].as_str() == Some(example.text.as_str()),
        "another text than the data's row (the same --data and split are needed)"
    );
    let top: Vec<&str> = v["tier0"]
        .as_array()
        .map(|a| a.iter().filter_map(|c| c["label"].as_str()).collect())
        .unwrap_or_default();
    let ours: Vec<&str> = row.top.iter().map(|&(l, _)| labels[l].as_str()).collect();
    anyhow::ensure!(
        top == ours,
        "Tier-0's candidates differ (written with another head or --set reranker.candidates)"
    );
    if let Some(scores) = v["llm_scores"].as_array() {
        let s: Vec<f32> = scores
            .iter()
            .filter_map(|x| x.as_f64())
            .map(|x| x as f32)
            .collect();
        anyhow::ensure!(s.len() == ours.len(), "scores for another candidate count");
        row.llm = Some(s);
        row.llm_s = v["llm_s"].as_f64().unwrap_or(0.0);
    }
    Ok(())
}

/// Writes the fit, made with the LLM named `llm`, into the head folder.
pub fn save_fit(dir: &Path, llm: &str, rows: &[Row]) -> anyhow::Result<FittedFusion> {
    let fit = fit(rows);
    let seen = rows.iter().filter(|r| r.llm.is_some()).count();
    let n = seen.max(1) as f64;
    let f = FittedFusion {
        llm_weight: fit.w,
        llm_temperature: fit.t,
        llm: llm.to_string(),
        rows: seen,
        tier0_accuracy: fit.tier0 as f64 / n,
        fused_accuracy: fit.correct as f64 / n,
        best_weight: fit.best.0,
        best_temperature: fit.best.1,
        rows_fixed: fit.fixed,
        rows_broken: fit.broken,
        p_value: fit.p_value,
    };
    f.save(dir)?;
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(gold: usize, top: &[(usize, f32)], llm: Option<&[f32]>) -> Row {
        Row {
            gold: Some(gold),
            top: top.to_vec(),
            ambiguity: 1.0 - f64::from(top[0].1),
            llm: llm.map(<[f32]>::to_vec),
            llm_s: 0.5,
            embedding: Vec::new(),
        }
    }

    /// Synthetic rows where the LLM is right whenever Tier-0's runner-up is gold: the fit recovers a weight
    /// that flips exactly those, and picks 0 for a scorer that knows nothing.
    #[test]
    fn fit_finds_a_helpful_weight_and_zero_for_a_useless_scorer() {
        let mut rows = Vec::new();
        for i in 0..40 {
            // Tier-0 0.55/0.45; gold is the runner-up on a quarter of the rows; the LLM is sure of the gold.
            let gold = if i % 4 == 0 { 1 } else { 0 };
            let llm: Vec<f32> = if gold == 1 {
                vec![0.0, 3.0]
            } else {
                vec![3.0, 0.0]
            };
            rows.push(row(gold, &[(0, 0.55), (1, 0.45)], Some(&llm)));
        }
        let f = fit(&rows);
        assert_eq!((f.correct, f.tier0, f.fixed, f.broken), (40, 30, 10, 0));
        assert!(f.w > 0.0 && f.p_value < 0.001, "{f:?}");
        // A gain too small to tell from luck (2 rows fixed, 1 broken): weight 0.
        let mut few = rows[..8].to_vec();
        few[1].llm = Some(vec![0.0, 3.0]);
        let f = fit(&few);
        assert_eq!((f.fixed, f.broken), (2, 1), "{f:?}");
        assert_eq!((f.w, f.t, f.correct), (0.0, 1.0, f.tier0));
        // A useless scorer: the same scores whatever the row.
        for r in &mut rows {
            r.llm = Some(vec![0.0, 1.0]);
        }
        let f = fit(&rows);
        assert_eq!((f.w, f.t, f.correct, f.tier0), (0.0, 1.0, 30, 30));
    }

    #[test]
    fn sign_test_matches_hand_computed_tails() {
        assert!((sign_test_p(3, 1) - 5.0 / 16.0).abs() < 1e-12);
        assert!((sign_test_p(10, 0) - 1.0 / 1024.0).abs() < 1e-12);
        assert_eq!(sign_test_p(0, 0), 1.0);
        assert!((sign_test_p(0, 5) - 1.0).abs() < 1e-12);
    }

    #[test]
    fn grid_counts_escalations_and_accuracies() {
        let rows = vec![
            row(0, &[(0, 0.9), (1, 0.1)], None),
            row(1, &[(0, 0.6), (1, 0.4)], Some(&[0.0, 5.0])),
            row(0, &[(0, 0.5), (1, 0.5)], Some(&[0.0, 5.0])),
        ];
        let g = grid(&rows, &[0.05, 0.3, 0.95], 1.0, 1.0);
        // θ = 0.05 would escalate the first row, which the LLM never saw: left out.
        assert_eq!(g.len(), 2);
        let p = &g[0];
        assert_eq!((p.theta, p.escalated), (0.3, 2));
        assert!((p.tier0_accuracy - 2.0 / 3.0).abs() < 1e-12);
        assert!((p.hybrid_accuracy - 2.0 / 3.0).abs() < 1e-12);
        assert_eq!(p.escalated_tier0_accuracy, Some(0.5));
        assert_eq!(p.escalated_llm_accuracy, Some(0.5));
        assert_eq!(g[1].escalated, 0);
        assert!((theta_for_share(&rows, 1.0 / 3.0) - 0.4).abs() < 1e-6);
    }
}
