//! `tiergate eval`.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use tiergate_prefilter::Classifier;
use tiergate_train::eval::{evaluate, EvalOptions, EvalReport};

use super::{hybrid, ConfigArgs, DataArgs};

#[derive(Debug, Args)]
pub struct EvalArgs {
    /// A folder written by `tiergate train`, or a Hugging Face sequence-classification checkpoint.
    #[arg(long)]
    pub classifier: PathBuf,
    #[command(flatten)]
    pub data: DataArgs,
    /// Print one JSON object instead of tables.
    #[arg(long)]
    pub json: bool,
    /// Which rows to evaluate: `all`, or the `dev`/`train` part of the same stratified split `tiergate train`
    /// makes (with the same `--dev-fraction` and `--seed`), so a head is scored on rows it never saw.
    #[arg(long, value_enum, default_value_t = Split::All)]
    pub split: Split,
    /// Dev share of the split (as given to `tiergate train`).
    #[arg(long, default_value_t = 0.1)]
    pub dev_fraction: f64,
    /// Seed of the split (as given to `tiergate train`).
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Also run the configured LLM over the rows Tier-0 would escalate and report, per θ, what escalation
    /// buys (accuracy of Tier-0, the LLM and the fusion on the escalated rows, LLM seconds per escalation).
    #[arg(long)]
    pub hybrid: bool,
    /// With --hybrid: the LLM runs on this share of the rows (the most ambiguous); θ values escalating
    /// more are not reported.
    #[arg(long, default_value_t = 0.3)]
    pub max_escalated: f64,
    /// With --hybrid: write one JSON line per row here (text, gold, Tier-0's candidates and probabilities,
    /// the LLM's raw scores and seconds), so later features can be evaluated offline.
    #[arg(long)]
    pub rows: Option<PathBuf>,
    /// With --hybrid: take the LLM's scores from an earlier `--rows FILE` of the same rows instead of running
    /// the LLM (Tier-0 is run again and must agree with the file).
    #[arg(long)]
    pub from_rows: Option<PathBuf>,
    /// With --hybrid --from-rows FIRST: a second LLM stage's rows file over the same rows; reports the
    /// cascade Tier-0 → FIRST → this per first-stage escalation share and second-stage θ (each stage fused
    /// with its fit in the head folder: `fusion.json`, then the `fit-fusion --stage` one).
    #[arg(long, requires = "from_rows")]
    pub stage_rows: Option<PathBuf>,
    /// Score out-of-scope detection instead: rows whose label the head does not know (or `--oos-label`) are out
    /// of scope; prints accuracy over all classes (unknown as one), macro-F1 over the known labels and unknown,
    /// out-of-scope recall and precision, and in-scope accuracy.
    #[arg(long)]
    pub oos: bool,
    /// With --oos: rows with this label are out of scope.
    #[arg(long)]
    pub oos_label: Option<String>,
    /// With --oos: scores above this are called out of scope (default: the head's fitted threshold).
    #[arg(long)]
    pub oos_threshold: Option<f32>,
    /// Report the θ `mode = "risk"` chooses on the head's calibration rows (`calibration.json`) for ε = 1%,
    /// 2%, 5%, 10%, and on these rows the escalated share and the realised error of Tier-0's lone answers.
    #[arg(long)]
    pub risk: bool,
    /// With --risk: the confidence 1 − δ of the bound.
    #[arg(long, default_value_t = 0.95, requires = "risk")]
    pub confidence: f64,
    /// With --risk: also pool the calibration rows with these rows, re-split them this many times (same
    /// sizes), choose θ each time and count how often the realised error stayed ≤ ε (and the naive choice's).
    #[arg(long, requires = "risk")]
    pub coverage: Option<usize>,
    /// Replay the rows through the answer cache with a Zipf repetition profile: LLM jobs saved, false hits
    /// (a hit whose cached label is not the gold one), lookup time; exact and semantic.
    #[arg(long)]
    pub cache: bool,
    /// With --cache: requests drawn.
    #[arg(long, default_value_t = 5000, requires = "cache")]
    pub cache_requests: usize,
    /// With --cache: the Zipf exponent of the repetition profile (rank r drawn ∝ r^-s).
    #[arg(long, default_value_t = 1.0, requires = "cache")]
    pub zipf_s: f64,
    /// With --cache: θ (requests with ambiguity above it escalate and meet the cache).
    #[arg(long, default_value_t = 0.25, requires = "cache")]
    pub cache_theta: f64,
    /// With --cache: τ (default: `[cache] tau`).
    #[arg(long, requires = "cache")]
    pub cache_tau: Option<f32>,
    /// Queries timed one at a time for the latency figures.
    #[arg(long, default_value_t = 300)]
    pub latency_samples: usize,
    #[command(flatten)]
    pub config: ConfigArgs,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Split {
    All,
    Dev,
    Train,
}

pub fn run(args: &EvalArgs, env: impl IntoIterator<Item = (String, String)>) -> anyhow::Result<()> {
    let cfg = tiergate_config::load(args.config.config.as_deref(), env, &args.config.overrides)?;
    let data = tiergate_train::data::read(&args.data.spec())?;
    let classifier = hybrid::load_classifier(&args.classifier, &cfg)?;
    let opts = EvalOptions {
        prefilter: cfg.prefilter.clone(),
        latency_samples: args.latency_samples,
    };
    let rows = select_rows(data.examples, args.split, args.dev_fraction, args.seed);
    if args.hybrid {
        return run_hybrid(args, &cfg, &classifier, &rows);
    }
    if args.oos {
        return run_oos(args, &cfg, classifier, &rows);
    }
    if args.risk {
        return run_risk(args, &cfg, classifier, &rows);
    }
    if args.cache {
        let replay = super::cache::ReplayArgs {
            json: args.json,
            cache_requests: args.cache_requests,
            zipf_s: args.zipf_s,
            cache_theta: args.cache_theta,
            cache_tau: args.cache_tau,
            seed: args.seed,
        };
        return super::cache::run_replay(&replay, &cfg, classifier, &rows);
    }
    let report = evaluate(classifier, &rows, &opts)?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print_table(&report, data.skipped);
    }
    Ok(())
}

fn run_risk(
    args: &EvalArgs,
    cfg: &tiergate_config::Config,
    classifier: Classifier,
    rows: &[tiergate_train::data::Example],
) -> anyhow::Result<()> {
    use tiergate_prefilter::risk_rows::CalibrationRows;
    anyhow::ensure!(
        args.confidence > 0.0 && args.confidence < 1.0,
        "--confidence {} must be in (0, 1)",
        args.confidence
    );
    use tiergate_train::risk::CalibrationSource;
    let evaluated = tiergate_train::eval::risk_rows(classifier, rows, &cfg.prefilter)?;
    // A head without calibration rows (a checkpoint, a head trained before them) is calibrated on a quarter of
    // the evaluated rows and measured on the half that neither ordered nor calibrated θ.
    let cal = CalibrationRows::load(&args.classifier)?;
    let (ordering, calibration, test, source) = match &cal {
        Some(c) => (
            c.ordering_rows(),
            c.calibration_rows(),
            evaluated,
            CalibrationSource::Head,
        ),
        None => {
            let (o, c, t) = tiergate_train::risk::split_rows(&evaluated, args.seed);
            (o, c, t, CalibrationSource::Data)
        }
    };
    let flaw = cal.as_ref().and_then(CalibrationRows::flaw);
    let risk = tiergate_train::risk::report(&ordering, &calibration, &test, args.confidence);
    let coverage: Vec<_> = args.coverage.map_or_else(Vec::new, |n| {
        tiergate_train::risk::MAX_ERRORS
            .iter()
            .map(|&eps| {
                tiergate_train::risk::coverage(
                    &ordering,
                    &calibration,
                    &test,
                    eps,
                    args.confidence,
                    n,
                    args.seed,
                )
            })
            .collect()
    });
    if args.json {
        let mut out = serde_json::json!({ "rows": test.len(), "risk": risk,
            "calibration_source": source, "calibration_flaw": flaw });
        if args.coverage.is_some() {
            out["coverage"] = serde_json::to_value(&coverage)?;
        }
        println!("{out}");
        return Ok(());
    }
    println!(
        "θ chosen on {} calibration rows at confidence {}; measured on {} rows",
        calibration.len(),
        args.confidence,
        test.len()
    );
    if source == CalibrationSource::Data {
        println!(
            "{} has no {}: θ ordered on {} and calibrated on {} of these rows (seed {}), measured on the other {}",
            args.classifier.display(),
            CalibrationRows::FILE,
            ordering.len(),
            calibration.len(),
            args.seed,
            test.len()
        );
    }
    if let Some(f) = &flaw {
        println!("WARNING: the head's calibration rows are flawed: {f}");
    }
    println!("max_error  theta   upper_bound  escalated  realised_error");
    for r in &risk {
        let realised = r
            .realised_error
            .map_or("-".to_string(), |e| format!("{:.2}%", e * 100.0));
        println!(
            "{:>8.0}%  {:.4}  {:>10.2}%  {:>8.1}%  {:>14}{}",
            r.max_error * 100.0,
            r.theta,
            r.upper_bound * 100.0,
            r.escalated_share * 100.0,
            realised,
            r.note.map_or(String::new(), |n| format!("  ({n})"))
        );
    }
    for c in &coverage {
        println!(
            "coverage ε={:.0}%: held {}/{} (escalated {:.1}%, mean θ {:.3}); naive held {}/{} (escalated {:.1}%)",
            c.max_error * 100.0,
            c.held,
            c.splits,
            c.escalated_share * 100.0,
            c.mean_theta,
            c.naive_held,
            c.splits,
            c.naive_escalated_share * 100.0
        );
    }
    Ok(())
}

fn run_oos(
    args: &EvalArgs,
    cfg: &tiergate_config::Config,
    classifier: Classifier,
    rows: &[tiergate_train::data::Example],
) -> anyhow::Result<()> {
    let r = tiergate_train::eval::evaluate_out_of_scope(
        classifier,
        rows,
        &cfg.prefilter,
        args.oos_label.as_deref(),
        args.oos_threshold,
    )?;
    if args.json {
        println!("{}", serde_json::to_string(&r)?);
        return Ok(());
    }
    let pct = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{:.2}", v * 100.0));
    println!(
        "{} rows: {} in scope ({} labels), {} out of scope; {} score, threshold {:.4}",
        r.figures.n, r.in_scope_rows, r.known_labels, r.oos_rows, r.method, r.figures.threshold
    );
    println!("| accuracy | macro-F1 | out-of-scope recall | out-of-scope precision | in-scope accuracy |");
    println!("|---|---|---|---|---|");
    let f = &r.figures;
    println!(
        "| {} | {} | {} | {} | {} |",
        pct(Some(f.accuracy)),
        pct(Some(f.macro_f1)),
        pct(f.oos_recall),
        pct(f.oos_precision),
        pct(f.in_scope_accuracy)
    );
    Ok(())
}

/// The rows of `split` (the same stratified split `tiergate train` makes).
pub fn select_rows(
    examples: Vec<tiergate_train::data::Example>,
    split: Split,
    dev_fraction: f64,
    seed: u64,
) -> Vec<tiergate_train::data::Example> {
    match split {
        Split::All => examples,
        Split::Dev | Split::Train => {
            let (train, dev) = tiergate_train::data::split(&examples, dev_fraction, seed);
            if split == Split::Dev {
                dev
            } else {
                train
            }
        }
    }
}

/// `--hybrid --json` output.
#[derive(Debug, serde::Serialize)]
pub struct HybridReport {
    /// Rows evaluated.
    pub n: usize,
    /// The LLM and scoring method.
    pub llm: String,
    /// Fusion weight used.
    pub llm_weight: f32,
    /// Fusion temperature used.
    pub llm_temperature: f32,
    /// `fitted` (the head's fusion.json) or `config`.
    pub fusion_source: &'static str,
    /// Rows the LLM scored.
    pub llm_rows: usize,
    /// LLM seconds per escalation over all the rows it scored, one at a time: p50.
    pub llm_seconds_p50: Option<f64>,
    /// The same, p95.
    pub llm_seconds_p95: Option<f64>,
    /// Per θ (ascending), including the θ that escalates 10% of the rows.
    pub grid: Vec<hybrid::GridPoint>,
}

fn run_hybrid(
    args: &EvalArgs,
    cfg: &tiergate_config::Config,
    classifier: &Classifier,
    rows: &[tiergate_train::data::Example],
) -> anyhow::Result<()> {
    if let (Some(first), Some(second)) = (&args.from_rows, &args.stage_rows) {
        return run_cascade(args, cfg, classifier, rows, [first.clone(), second.clone()]);
    }
    let quiet = args.json;
    let (scored, llm) = match &args.from_rows {
        Some(path) => {
            let (scored, llm, held) = hybrid::rows_from_file(path, cfg, classifier, rows)?;
            if held < rows.len() {
                eprintln!(
                    "{}: {held} of {} rows (a run cut short?): the rest count as not escalated",
                    path.display(),
                    rows.len()
                );
            }
            if let Some(out) = &args.rows {
                let mut file = RowsFile::create(out, cfg, classifier, rows, &llm)?;
                file.rest(&scored)?;
            }
            (scored, llm)
        }
        None => {
            let llm = hybrid::llm_name(cfg)?;
            let mut file = match &args.rows {
                Some(out) => Some(RowsFile::create(out, cfg, classifier, rows, &llm)?),
                None => None,
            };
            let scored = hybrid::score_rows(
                cfg,
                classifier,
                rows,
                args.max_escalated,
                &mut |m| {
                    if !quiet {
                        eprintln!("{m}");
                    }
                },
                &mut |i, r| file.as_mut().map_or(Ok(()), |f| f.line(i, r)),
            )?;
            if let Some(f) = &mut file {
                f.rest(&scored)?;
            }
            (scored, llm)
        }
    };
    let (w, t, source) =
        match tiergate_prefilter::heads::fit_for(classifier.fusion.as_ref(), &llm, &[]) {
            Some(f) => (f.llm_weight, f.llm_temperature, "fitted"),
            None => {
                let (judge, _) = hybrid::judge(cfg)?;
                (
                    judge.config.llm_weight,
                    judge.config.llm_temperature,
                    "config",
                )
            }
        };
    let mut thetas: Vec<f64> = (1..20).map(|i| f64::from(i) * 0.05).collect();
    thetas.push(hybrid::theta_for_share(&scored, 0.1));
    thetas.sort_by(f64::total_cmp);
    let seconds: Vec<f64> = scored
        .iter()
        .filter(|r| r.llm.is_some())
        .map(|r| r.llm_s)
        .collect();
    let report = HybridReport {
        n: scored.len(),
        llm,
        llm_weight: w,
        llm_temperature: t,
        fusion_source: source,
        llm_rows: seconds.len(),
        llm_seconds_p50: tiergate_core::stats::quantile(seconds.clone(), 0.5),
        llm_seconds_p95: tiergate_core::stats::quantile(seconds, 0.95),
        grid: hybrid::grid(&scored, &thetas, w, t),
    };
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print_hybrid(&report);
    }
    Ok(())
}

/// `--hybrid --json --from-rows FIRST --stage-rows SECOND` output.
#[derive(Debug, serde::Serialize)]
pub struct CascadeReport {
    /// Rows evaluated.
    pub n: usize,
    /// The two stages' LLMs.
    pub llms: [String; 2],
    /// Each stage's fusion (weight, temperature) and where it comes from (`fitted` or `config`).
    pub fusions: tiergate_train::fusion::stages::Fusions,
    pub fusion_sources: [&'static str; 2],
    /// Tier-0 alone over all rows.
    pub tier0_accuracy: f64,
    /// Per first-stage share (ascending) and second-stage θ (descending: 1 is the first stage alone).
    pub cascade: Vec<tiergate_train::fusion::stages::CascadePoint>,
}

fn run_cascade(
    args: &EvalArgs,
    cfg: &tiergate_config::Config,
    classifier: &Classifier,
    rows: &[tiergate_train::data::Example],
    files: [PathBuf; 2],
) -> anyhow::Result<()> {
    let stages = hybrid::read_stages(&files, cfg, classifier, rows)?;
    let (judge, _) = hybrid::judge(cfg)?;
    let r = &judge.config;
    let fit = |k: usize, after: &[String]| {
        tiergate_train::fusion::stages::stage_fit(classifier, k, &stages[k].llm, after)
            .map_or(((r.llm_weight, r.llm_temperature), "config"), |f| {
                ((f.llm_weight, f.llm_temperature), "fitted")
            })
    };
    let (first, s1) = fit(0, &[]);
    let (second, s2) = fit(1, std::slice::from_ref(&stages[0].llm));
    let fusions = tiergate_train::fusion::stages::Fusions { first, second };
    let shares = [0.05, 0.1, 0.15, 0.2, 0.25, 0.3];
    let thetas: Vec<f64> = (0..=20).rev().map(|i| f64::from(i) * 0.05).collect();
    let n = stages[0].rows.len().max(1) as f64;
    let report = CascadeReport {
        n: stages[0].rows.len(),
        llms: [stages[0].llm.clone(), stages[1].llm.clone()],
        fusions,
        fusion_sources: [s1, s2],
        tier0_accuracy: stages[0].rows.iter().filter(|r| r.tier0_right()).count() as f64 / n,
        cascade: tiergate_train::fusion::stages::grid(
            &stages[0].rows,
            &stages[1].rows,
            fusions,
            &shares,
            &thetas,
        ),
    };
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
        return Ok(());
    }
    println!(
        "n {}  Tier-0 {:.4}  stage 1 {} (w {} T {}, {s1})  stage 2 {} (w {} T {}, {s2})",
        report.n,
        report.tier0_accuracy,
        report.llms[0],
        first.0,
        first.1,
        report.llms[1],
        second.0,
        second.1
    );
    println!("share1  θ1      θ2     stage-1 rows  stage-2 rows  accuracy  LLM s/row");
    for p in &report.cascade {
        println!(
            "{:.2}    {:.4}  {:.2}   {:>12}  {:>12}  {:.4}    {:.3}",
            p.first_share,
            p.first_theta,
            p.second_theta,
            p.first_rows,
            p.second_rows,
            p.accuracy,
            p.llm_seconds_per_row
        );
    }
    Ok(())
}

/// `--rows FILE`: one JSON line per evaluated row, flushed as the LLM scores it (the most ambiguous first),
/// then the rows the LLM did not see.
struct RowsFile<'a> {
    out: std::fs::File,
    labels: &'a [String],
    oos: Option<hybrid::OfflineOos>,
    examples: &'a [tiergate_train::data::Example],
    llm: String,
    written: Vec<bool>,
}

impl<'a> RowsFile<'a> {
    fn create(
        path: &std::path::Path,
        cfg: &tiergate_config::Config,
        classifier: &'a Classifier,
        examples: &'a [tiergate_train::data::Example],
        llm: &str,
    ) -> anyhow::Result<Self> {
        let out =
            std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
        Ok(Self {
            out,
            labels: classifier.labels(),
            oos: hybrid::OfflineOos::of(cfg, classifier)?,
            examples,
            llm: llm.to_string(),
            written: vec![false; examples.len()],
        })
    }

    fn line(&mut self, i: usize, row: &hybrid::Row) -> anyhow::Result<()> {
        use std::io::Write;
        let line = hybrid::row_line(
            i,
            &self.examples[i],
            row,
            self.labels,
            self.oos.as_ref(),
            &self.llm,
        );
        writeln!(self.out, "{line}")?;
        self.written[i] = true;
        Ok(())
    }

    /// Every row not written yet.
    fn rest(&mut self, rows: &[hybrid::Row]) -> anyhow::Result<()> {
        for (i, r) in rows.iter().enumerate() {
            if !self.written[i] {
                self.line(i, r)?;
            }
        }
        Ok(())
    }
}

fn print_hybrid(r: &HybridReport) {
    let opt = |v: Option<f64>| v.map_or("     -".to_string(), |a| format!("{a:.4}"));
    println!(
        "n {}  llm {}  fusion w = {} T = {} ({})  LLM rows {}",
        r.n, r.llm, r.llm_weight, r.llm_temperature, r.fusion_source, r.llm_rows
    );
    if let (Some(p50), Some(p95)) = (r.llm_seconds_p50, r.llm_seconds_p95) {
        println!("LLM seconds per escalation, one at a time: p50 {p50:.3}, p95 {p95:.3}");
    }
    println!("θ       escalated  tier0    hybrid   | on escalated: tier0   llm      fused    | LLM s/esc");
    for g in &r.grid {
        println!(
            "{:.4}  {:>7.1}%   {:.4}   {:.4}   |               {}  {}  {}   | {}",
            g.theta,
            g.escalated_share * 100.0,
            g.tier0_accuracy,
            g.hybrid_accuracy,
            opt(g.escalated_tier0_accuracy),
            opt(g.escalated_llm_accuracy),
            opt(g.escalated_fused_accuracy),
            g.llm_seconds_per_escalation
                .map_or("    -".to_string(), |s| format!("{s:.3}"))
        );
    }
}

fn print_table(r: &EvalReport, skipped: usize) {
    println!("n            {}", r.n);
    if skipped > 0 {
        println!("skipped      {skipped} bad rows");
    }
    if r.unknown_labels > 0 {
        println!(
            "unknown      {} rows with a label the classifier does not know (counted wrong)",
            r.unknown_labels
        );
    }
    println!("accuracy     {:.4}", r.accuracy);
    println!("macro-F1     {:.4}", r.macro_f1);
    println!("top-5 recall {:.4}", r.top5_recall);
    println!("ECE          {:.4}", r.ece);
    println!(
        "latency      p50 {:.2} ms, p95 {:.2} ms (one query at a time)",
        r.latency_ms.p50, r.latency_ms.p95
    );
    println!(
        "throughput   {:.0} queries/s (mean batch {:.1})",
        r.throughput_per_s, r.mean_batch
    );
    println!();
    println!("selective prediction (escalate when 1 - max p > θ)");
    println!("  θ     escalated  accuracy on kept");
    for s in &r.selective {
        let kept = s
            .accuracy_kept
            .map_or("-".to_string(), |a| format!("{a:.4}"));
        println!(
            "  {:.2}  {:>8.1}%  {kept}",
            s.threshold,
            s.escalated * 100.0
        );
    }
}
