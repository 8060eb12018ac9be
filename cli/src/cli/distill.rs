//! `tiergate distill`.

use std::path::PathBuf;

use clap::Args;
use tiergate_train::distill::{distill, DistillOptions};

use super::DataArgs;

#[derive(Debug, Args)]
pub struct DistillArgs {
    /// The trained head to refresh (a `tiergate train` folder).
    #[arg(long)]
    pub classifier: PathBuf,
    /// The server's escalation records (`server.record_escalations`).
    #[arg(long)]
    pub records: PathBuf,
    /// The head's original training data, mixed in so nothing is forgotten.
    #[command(flatten)]
    pub data: DataArgs,
    /// The dev fraction `tiergate train` used (its dev rows recalibrate and measure).
    #[arg(long, default_value_t = 0.1)]
    pub dev_fraction: f64,
    /// The seed `tiergate train` used.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Softening temperature of the LLM's distributions.
    #[arg(long, default_value_t = 2.0)]
    pub temperature: f64,
    /// How many training rows one record counts as.
    #[arg(long, default_value_t = 1.0)]
    pub weight: f64,
    /// Passes over the training rows and records.
    #[arg(long, default_value_t = 5)]
    pub epochs: usize,
    /// θ at which the escalated share is compared before and after.
    #[arg(long, default_value_t = 0.65)]
    pub theta: f64,
    /// Inputs are truncated to this many tokens.
    #[arg(long, default_value_t = 64)]
    pub max_tokens: usize,
    /// Arithmetic of the encoder (as serving uses it).
    #[arg(long, default_value = "auto")]
    pub precision: tiergate_config::Precision,
    /// Where the refreshed head goes.
    #[arg(long)]
    pub out: PathBuf,
    /// Also write the report as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

pub fn run(a: &DistillArgs) -> anyhow::Result<()> {
    let opts = DistillOptions {
        head: a.classifier.clone(),
        records: a.records.clone(),
        data: a.data.spec(),
        dev_fraction: a.dev_fraction,
        seed: a.seed,
        temperature: a.temperature,
        weight: a.weight,
        epochs: a.epochs,
        theta: a.theta,
        max_tokens: a.max_tokens,
        precision: a.precision,
        out: a.out.clone(),
    };
    let r = distill(&opts, &mut |line| eprintln!("distill: {line}"))?;
    println!(
        "distilled {} records ({} skipped) with {} training rows -> {}",
        r.records_used,
        r.records_skipped,
        r.train_rows,
        a.out.display()
    );
    for (name, f) in [("before", &r.before), ("after", &r.after)] {
        println!(
            "{name:>6}: dev accuracy {:.4}, ECE {:.4}, escalated at θ={} {:.1}%, agrees with the LLM on {:.1}% of records",
            f.dev_accuracy,
            f.dev_ece,
            r.theta,
            f.dev_escalated_share * 100.0,
            f.records_agreement * 100.0
        );
    }
    if let Some(p) = &a.json {
        std::fs::write(p, serde_json::to_vec_pretty(&r)?)?;
    }
    Ok(())
}
