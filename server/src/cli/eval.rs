//! `tiergate eval`.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use tiergate_prefilter::eval::{evaluate, EvalOptions, EvalReport};
use tiergate_prefilter::Classifier;

use super::{ConfigArgs, DataArgs};

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
    let data = tiergate_prefilter::data::read(&args.data.spec())?;
    let classifier = Classifier::from_dir(
        &args.classifier,
        cfg.prefilter.max_tokens,
        cfg.prefilter.precision,
    )
    .with_context(|| format!("loading classifier {}", args.classifier.display()))?;
    let opts = EvalOptions {
        prefilter: cfg.prefilter.clone(),
        latency_samples: args.latency_samples,
    };
    let rows = match args.split {
        Split::All => data.examples,
        Split::Dev | Split::Train => {
            let (train, dev) =
                tiergate_prefilter::data::split(&data.examples, args.dev_fraction, args.seed);
            if args.split == Split::Dev {
                dev
            } else {
                train
            }
        }
    };
    let report = evaluate(classifier, &rows, &opts)?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print_table(&report, data.skipped);
    }
    Ok(())
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
