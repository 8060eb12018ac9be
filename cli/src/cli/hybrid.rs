//! `tiergate eval --hybrid` and `tiergate fit-fusion`: run the configured LLM (through the real worker and
//! queue) over the rows Tier-0 is least sure of, then report per θ what escalation buys, or fit the fusion.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;
use tiergate_config::{Config, RouteKind};
use tiergate_engine::model::out_of_scope::{with_none, Call, OutOfScopeRoute, NONE};
use tiergate_prefilter::heads::FittedFusion;
use tiergate_prefilter::Classifier;
use tiergate_queue::{Job, Reply};
use tiergate_train::data::Example;
use tiergate_train::fusion::fit::fit;
pub use tiergate_train::fusion::fit::Row;

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

pub use tiergate_train::fusion::stages::theta_for_share;

/// The out-of-scope outcome of the route the offline tools measure (the first classify route), resolved
/// against the head, with the policy's threshold override and margin: what serving would decide with.
pub struct OfflineOos {
    pub route: OutOfScopeRoute,
    pub threshold: f64,
    pub margin: f64,
}

impl OfflineOos {
    /// `None` when the route declares no out-of-scope outcome.
    pub fn of(config: &Config, classifier: &Classifier) -> anyhow::Result<Option<Self>> {
        let Some((name, cfg)) = config
            .routes
            .iter()
            .find(|r| r.kind == RouteKind::Classify)
            .and_then(|r| Some((r.name.as_str(), r.out_of_scope.as_ref()?)))
        else {
            return Ok(None);
        };
        let fitted = classifier
            .out_of_scope
            .as_ref()
            .map(|s| (s.method, s.threshold));
        let route = OutOfScopeRoute::resolve(name, cfg, fitted)?;
        Ok(Some(Self {
            threshold: config.routing.oos_threshold.unwrap_or(route.threshold),
            margin: config.routing.oos_margin,
            route,
        }))
    }

    /// A candidate index's name: the label, or the out-of-scope label for "none of these".
    pub fn name<'a>(oos: Option<&'a Self>, labels: &'a [String], i: usize) -> &'a str {
        match (labels.get(i), oos) {
            (Some(l), _) => l,
            (None, Some(o)) => &o.route.label,
            (None, None) => "",
        }
    }
}

/// Tier-0 over `rows` (batched), top-k candidates per row; with an out-of-scope outcome, "none of these"
/// among them ([`with_none`]) and rows of its label gold for it.
pub fn tier0_rows(
    classifier: &Classifier,
    rows: &[Example],
    k: usize,
    oos: Option<&OfflineOos>,
) -> anyhow::Result<Vec<Row>> {
    let labels = classifier.labels();
    let mut out = Vec::with_capacity(rows.len());
    for chunk in rows.chunks(32) {
        let tokens = chunk
            .iter()
            .map(|e| classifier.tokenizer.encode(&e.text))
            .collect::<Result<Vec<_>, _>>()?;
        let refs: Vec<_> = tokens.iter().collect();
        let f = classifier.forward(&refs)?;
        for (j, ((e, p), embedding)) in chunk.iter().zip(f.probs).zip(f.embeddings).enumerate() {
            let mut idx: Vec<usize> = (0..p.len()).collect();
            idx.sort_by(|a, b| p[*b].total_cmp(&p[*a]));
            let mut top: Vec<(usize, f32)> =
                idx.iter().take(k.max(1)).map(|&i| (i, p[i])).collect();
            let ambiguity = 1.0 - f64::from(top.first().map_or(0.0, |t| t.1));
            let mut gold = labels.iter().position(|l| *l == e.label);
            if let Some(o) = oos {
                let call = Call {
                    score: f.oos.get(j).copied().unwrap_or(ambiguity as f32),
                    threshold: o.threshold,
                    margin: o.margin,
                };
                top = with_none(&top, &call);
                if e.label == o.route.label {
                    gold = Some(NONE);
                }
            }
            out.push(Row {
                gold,
                ambiguity,
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
    let (judge, prompts) = judge(config)?;
    if tiergate_engine::model::judge::grounded(&judge.config, &prompts) {
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
    let oos = OfflineOos::of(config, classifier)?;
    let mut rows = tier0_rows(
        classifier,
        examples,
        judge(config)?.0.config.candidates,
        oos.as_ref(),
    )?;
    let low = theta_for_share(&rows, max_escalated);
    let texts: Vec<&str> = examples.iter().map(|r| r.text.as_str()).collect();
    let oos_route = oos.as_ref().map(|o| &o.route);
    run_llm(
        config, classifier, oos_route, &texts, &mut rows, low, progress, scored,
    )?;
    Ok(rows)
}

/// Runs the configured LLM over the rows with ambiguity above `theta_low` (through a real worker process
/// and the shared-memory queue, as the server does), one at a time so the seconds are the service time.
#[allow(clippy::too_many_arguments)] // the run's inputs, its rows and two callbacks
fn run_llm(
    config: &Config,
    classifier: &Classifier,
    oos: Option<&OutOfScopeRoute>,
    texts: &[&str],
    rows: &mut [Row],
    theta_low: f64,
    progress: &mut dyn FnMut(&str),
    scored: &mut dyn FnMut(usize, &Row) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let program = super::serve::worker_program();
    let wait = Duration::from_millis(config.batch.max_llm_wait_ms);
    let (backend, prompt) = judge(config)?;
    let llm = tiergate_engine::start_llm(&backend, wait, program)?;
    let t = Instant::now();
    while llm.client.live_workers() == 0 {
        anyhow::ensure!(
            t.elapsed() < Duration::from_secs(300),
            "the LLM worker did not become ready in 300 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut todo: Vec<usize> = (0..rows.len())
        .filter(|&i| rows[i].ambiguity > theta_low)
        .collect();
    todo.sort_by(|&a, &b| rows[b].ambiguity.total_cmp(&rows[a].ambiguity));
    progress(&format!("LLM: {} rows to score", todo.len()));
    for (n, &i) in todo.iter().enumerate() {
        // Representatives exist only when the route is grounded (`ground` above), as in serving.
        let candidates = tiergate_engine::model::judge::candidates(
            &rows[i].top,
            classifier.labels(),
            &classifier.replies,
            &classifier.descriptions,
            |l| classifier.examples_for(l, &rows[i].embedding),
            oos,
        );
        let job = Job::Rerank {
            text: texts[i].to_string(),
            candidates,
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

/// The judge the offline tools run and its prompt templates: the first classify route's first stage, as the
/// server would escalate to ([`tiergate_config::Resolved::offline_judge`]).
pub fn judge(
    config: &Config,
) -> anyhow::Result<(tiergate_config::Backend, tiergate_config::PromptConfig)> {
    let resolved = config.resolve()?;
    let (b, p) = resolved.offline_judge();
    Ok((b.clone(), p.clone()))
}

/// The LLM's name for reports and `fusion.json` (see [`tiergate_engine::model::judge::llm_name`]).
pub fn llm_name(config: &Config) -> anyhow::Result<String> {
    let (judge, prompts) = judge(config)?;
    Ok(tiergate_engine::model::judge::llm_name(
        &judge.config,
        &prompts,
    ))
}

/// The rows files `files`, one per stage in cascade order, over `examples` (their Tier-0 rows run again here).
pub fn read_stages(
    files: &[std::path::PathBuf],
    config: &Config,
    classifier: &Classifier,
    examples: &[Example],
) -> anyhow::Result<Vec<tiergate_train::fusion::stages::StageRows>> {
    files
        .iter()
        .map(|f| {
            let (rows, llm, _) = rows_from_file(f, config, classifier, examples)?;
            Ok(tiergate_train::fusion::stages::StageRows { llm, rows })
        })
        .collect()
}

/// One line of an `eval --hybrid --rows FILE`: row `i` of the data, Tier-0's candidates, the LLM's scores.
pub fn row_line(
    i: usize,
    example: &Example,
    row: &Row,
    labels: &[String],
    oos: Option<&OfflineOos>,
    llm: &str,
) -> String {
    let name = |l: usize| OfflineOos::name(oos, labels, l);
    serde_json::json!({
        "row": i,
        "text": example.text,
        "gold": example.label,
        "tier0": row.top.iter().map(|&(l, p)| serde_json::json!({"label": name(l), "p": p})).collect::<Vec<_>>(),
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
    let k = judge(config)?.0.config.candidates;
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let oos = OfflineOos::of(config, classifier)?;
    let mut rows = tier0_rows(classifier, examples, k, oos.as_ref())?;
    let mut seen = vec![false; examples.len()];
    let mut llm = llm_name(config)?;
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
        let name = |l: usize| OfflineOos::name(oos.as_ref(), classifier.labels(), l);
        read_row_line(&v, &examples[i], &mut rows[i], &name).with_context(at)?;
        if let Some(name) = v["llm"].as_str() {
            llm = name.to_string();
        }
    }
    Ok((rows, llm, lines.len()))
}

/// Checks one line against the data's row and Tier-0's candidates, and takes its LLM scores.
fn read_row_line<'a>(
    v: &serde_json::Value,
    example: &Example,
    row: &mut Row,
    name: &dyn Fn(usize) -> &'a str,
) -> anyhow::Result<()> {
    anyhow::ensure!(
        v["text"].as_str() == Some(example.text.as_str()),
        "another text than the data's row (the same --data and split are needed)"
    );
    let top: Vec<&str> = v["tier0"]
        .as_array()
        .map(|a| a.iter().filter_map(|c| c["label"].as_str()).collect())
        .unwrap_or_default();
    let ours: Vec<&str> = row.top.iter().map(|&(l, _)| name(l)).collect();
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

/// Writes the fit, made with the LLM named `llm` after the stages `after` (a cascade stage's fit, saved as
/// `fusion.STAGE.json`; none: the head's `fusion.json`), into the head folder.
pub fn save_fit(
    dir: &Path,
    llm: &str,
    rows: &[Row],
    stage: Option<(&str, &[String])>,
) -> anyhow::Result<FittedFusion> {
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
        chosen_on: Some(fit.chosen_on),
        after: stage.map(|(_, a)| a.to_vec()).unwrap_or_default(),
        head: Some(tiergate_prefilter::heads::fingerprint(dir)?),
    };
    f.save(dir, stage.map(|(s, _)| s))?;
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(gold: usize, top: &[(usize, f32)], llm: Option<&[f32]>) -> Row {
        Row::scored(Some(gold), top.to_vec(), llm.map(<[f32]>::to_vec))
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
