//! `tiergate train`.

use std::path::PathBuf;

use clap::Args;
use tiergate_train::train::{train, TrainOptions};

use super::DataArgs;

#[derive(Debug, Args)]
pub struct TrainArgs {
    /// The encoder: a local Hugging Face folder (config.json, model.safetensors, tokenizer.json).
    #[arg(long)]
    pub encoder: PathBuf,
    #[command(flatten)]
    pub data: DataArgs,
    /// Share of each label held out to fit the calibration temperature and report dev figures.
    #[arg(long, default_value_t = 0.1)]
    pub dev_fraction: f64,
    /// Also fine-tune the encoder (slower; writes the tuned encoder into OUT/encoder).
    #[arg(long)]
    pub fine_tune: bool,
    /// Epochs of encoder fine-tuning.
    #[arg(long, default_value_t = 1)]
    pub epochs: usize,
    /// Inputs are truncated to this many tokens.
    #[arg(long, default_value_t = 64)]
    pub max_tokens: usize,
    /// Seed for the split and shuffling.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Output folder (head.json, head.safetensors[, encoder/]).
    #[arg(long)]
    pub out: PathBuf,
    /// Arithmetic of the encoder the head is fitted on: auto (int8 with AVX-512 VNNI, else f32), f32, int8.
    /// Use what `prefilter.precision` will be when serving.
    #[arg(long, default_value = "auto")]
    pub precision: tiergate_config::Precision,
    /// Share of the in-scope dev rows the out-of-scope threshold keeps in scope (written to OUT/oos.json).
    #[arg(long, default_value_t = 0.95)]
    pub oos_recall: f64,
    /// Rows with this label are out-of-scope examples: not a label of the head; the dev share of them reports
    /// how many the threshold catches.
    #[arg(long)]
    pub oos_label: Option<String>,
    /// Train from at most K rows of each label (drawn with --seed, the dev share included): a few-shot head
    /// from one command.
    #[arg(long, value_name = "K")]
    pub per_label: Option<usize>,
    /// A labels file: one label per line, optionally a tab and a one-sentence description. The head's labels
    /// are exactly the file's (a row with another label is refused; a label without rows trains on its
    /// description); the descriptions reach the judge's prompts (`{description}`).
    #[arg(long, value_name = "FILE")]
    pub labels: Option<PathBuf>,
    /// Also write the rows drawn for training and dev to FILE (CSV `text,category,part`): what the head saw,
    /// so that replayed traffic or test rows can be kept apart from them.
    #[arg(long, value_name = "FILE")]
    pub rows_out: Option<PathBuf>,
}

pub fn run(args: &TrainArgs) -> anyhow::Result<()> {
    let opts = TrainOptions {
        encoder: args.encoder.clone(),
        data: args.data.spec(),
        dev_fraction: args.dev_fraction,
        seed: args.seed,
        fine_tune: args.fine_tune,
        fine_tune_epochs: args.epochs,
        max_tokens: args.max_tokens,
        out: args.out.clone(),
        precision: args.precision,
        oos_recall: args.oos_recall,
        oos_label: args.oos_label.clone(),
        per_label: args.per_label,
        labels: args.labels.clone(),
        rows_out: args.rows_out.clone(),
    };
    let report = train(&opts, &mut |line| eprintln!("train: {line}"))?;
    println!(
        "trained {} labels on {} rows in {:.1}s -> {}",
        report.labels,
        report.train_n,
        report.seconds,
        args.out.display()
    );
    println!(
        "dev: n={} accuracy={:.4} ECE={:.4} (uncalibrated {:.4}, temperature {:.3})",
        report.dev.n,
        report.dev.accuracy,
        report.dev.ece,
        report.dev.ece_uncalibrated,
        report.temperature
    );
    println!(
        "out of scope: {} threshold {:.4} ({:.0}% in-scope dev recall){}",
        report.oos.method.name(),
        report.oos.threshold,
        report.oos.recall_target * 100.0,
        report.oos.dev_oos_recall.map_or(String::new(), |r| format!(
            ", catches {:.1}% of {} out-of-scope dev rows",
            r * 100.0,
            report.oos.dev_oos_rows
        ))
    );
    if report.skipped > 0 {
        println!("skipped {} bad rows", report.skipped);
    }
    Ok(())
}
