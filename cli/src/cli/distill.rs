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
    /// The server's records (`server.record_escalations`): LLM verdicts, labelled audits, trusted feedback.
    #[arg(long)]
    pub records: PathBuf,
    /// The head's original training data, mixed in so nothing is forgotten.
    #[command(flatten)]
    pub data: DataArgs,
    /// The dev fraction `tiergate train` used (default: the one the head recorded, else 0.1).
    #[arg(long)]
    pub dev_fraction: Option<f64>,
    /// The seed `tiergate train` used (default: the head's, else 42).
    #[arg(long)]
    pub seed: Option<u64>,
    /// The `--per-label K` `tiergate train` used (default: the head's).
    #[arg(long)]
    pub per_label: Option<usize>,
    /// Softening temperature of the LLM's distributions.
    #[arg(long, default_value_t = 2.0)]
    pub temperature: f64,
    /// How many training rows one record counts as.
    #[arg(long, default_value_t = 1.0)]
    pub weight: f64,
    /// Passes over the training rows and records.
    #[arg(long, default_value_t = 5)]
    pub epochs: usize,
    /// How many training rows one Tier-0 pseudo-label (`server.record_tier0`) counts as.
    #[arg(long, default_value_t = 1.0)]
    pub tier0_weight: f64,
    /// A labelled audit counts 1/p training rows (p: the rate it was drawn at), at most this many.
    #[arg(long, default_value_t = 20.0)]
    pub max_audit_weight: f64,
    /// Share of the labelled audits held out of training, to compare both heads on.
    #[arg(long, default_value_t = 0.2)]
    pub holdout_audits: f64,
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
        per_label: a.per_label,
        temperature: a.temperature,
        weight: a.weight,
        max_audit_weight: a.max_audit_weight,
        tier0_weight: a.tier0_weight,
        holdout_audits: a.holdout_audits,
        epochs: a.epochs,
        theta: a.theta,
        max_tokens: a.max_tokens,
        precision: a.precision,
        out: a.out.clone(),
    };
    let r = distill(&opts, &mut |line| eprintln!("distill: {line}"))?;
    let h = &r.harvest;
    println!(
        "distilled {} records ({} LLM verdicts, {} labelled audits, {} trusted feedback, {} Tier-0 pseudo-labels; \
         {} skipped; {} dropped as dev rows; {} LLM verdicts replaced by a gold label, {} of them wrong; {} audits \
         held out) with {} training rows -> {}",
        r.records_used,
        h.llm,
        h.audit - r.audits_held_out,
        h.feedback,
        h.tier0,
        h.skipped,
        r.records_in_dev,
        h.llm_overridden,
        h.llm_contradicted,
        r.audits_held_out,
        r.train_rows,
        a.out.display()
    );
    for (name, f) in [("before", &r.before), ("after", &r.after)] {
        let audits = f
            .audit_accuracy
            .map_or(String::new(), |x| format!(", held-out audits {x:.4}"));
        println!(
            "{name:>6}: dev accuracy {:.4} ({} rows), ECE {:.4}, escalated at θ={} {:.1}%, agrees with the LLM on {:.1}% of its records{audits}",
            f.dev_accuracy,
            r.dev_rows,
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
