//! Command-line interface: `tiergate serve`, `tiergate train`, `tiergate eval`, `tiergate fit-fusion`,
//! `tiergate distill`, `tiergate config`.

mod cache;
mod config;
mod distill;
mod eval;
mod fit;
mod hybrid;
mod serve;
mod train;

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

/// tiergate: a two-tier inference server (Tier-0 encoder classifier + escalation to an LLM).
#[derive(Debug, Parser)]
#[command(name = "tiergate", version, about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the OpenAI-compatible API (embedded default config unless --config is given).
    Serve(serve::ServeArgs),
    /// Train a softmax head (optionally fine-tuning the encoder) and calibrate it on a dev split.
    Train(train::TrainArgs),
    /// Evaluate a classifier: accuracy, macro-F1, top-5 recall, ECE, selective prediction, speed; with
    /// --hybrid, what escalating to the configured LLM buys per θ.
    Eval(eval::EvalArgs),
    /// Fit the fusion of the LLM's scores with Tier-0's on a dev split and write it into the head folder.
    FitFusion(fit::FitArgs),
    /// Refresh a trained head with the LLM's verdicts recorded on escalations (`server.record_escalations`):
    /// soft targets mixed with the original training data, recalibrated, compared before/after.
    Distill(distill::DistillArgs),
    /// Print the embedded default config (`--default`), or check a config file (`--check FILE`).
    Config(config::ConfigArgs),
    /// Measure the answer cache's semantic hits on an adversarial set of query pairs (paraphrases that must
    /// hit; negations, numbers, antonyms, entities that must not): τ chosen on one half, figures on the other.
    CachePairs(cache::CachePairsArgs),
}

/// Where the data comes from and how to read it.
#[derive(Debug, Clone, Args)]
pub struct DataArgs {
    /// CSV file with a header row, or JSONL (`.jsonl`) with `text` and `label` fields.
    #[arg(long)]
    pub data: PathBuf,
    /// CSV column holding the text.
    #[arg(long, default_value = "text")]
    pub text_column: String,
    /// CSV column holding the label.
    #[arg(long, default_value = "category")]
    pub label_column: String,
    /// Skip and count bad rows instead of failing on the first one.
    #[arg(long)]
    pub skip_bad_rows: bool,
}

impl DataArgs {
    fn spec(&self) -> tiergate_train::data::DataSpec {
        tiergate_train::data::DataSpec {
            path: self.data.clone(),
            text_column: self.text_column.clone(),
            label_column: self.label_column.clone(),
            skip_bad_rows: self.skip_bad_rows,
        }
    }
}

/// Config file and overrides, shared by commands that need the prefilter settings.
#[derive(Debug, Clone, Args)]
pub struct ConfigArgs {
    /// TOML config file (defaults are built in).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Override a config field: `--set prefilter.max_batch=16` (repeatable).
    #[arg(long = "set", value_name = "FIELD=VALUE")]
    pub overrides: Vec<String>,
}

/// Runs a parsed command. `env` is the process environment (for `TIERGATE__…` overrides).
pub fn run(cli: Cli, env: impl IntoIterator<Item = (String, String)>) -> anyhow::Result<()> {
    if let Command::Serve(args) = &cli.command {
        return serve::run(args, env);
    }
    let _logs = tiergate_telemetry::init(None)?;
    match cli.command {
        Command::Serve(_) => Ok(()),
        Command::Train(args) => train::run(&args),
        Command::Eval(args) => eval::run(&args, env),
        Command::FitFusion(args) => fit::run(&args, env),
        Command::Distill(args) => distill::run(&args),
        Command::Config(args) => config::run(&args, env),
        Command::CachePairs(args) => cache::run_pairs(&args, env),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_train_with_defaults_and_flags() {
        let cli = Cli::try_parse_from([
            "tiergate",
            "train",
            "--encoder",
            "enc",
            "--data",
            "d.csv",
            "--out",
            "o",
            "--fine-tune",
        ])
        .unwrap();
        let Command::Train(a) = cli.command else {
            panic!("not train")
        };
        assert_eq!(a.encoder, PathBuf::from("enc"));
        assert_eq!(a.data.text_column, "text");
        assert_eq!(a.data.label_column, "category");
        assert!((a.dev_fraction - 0.1).abs() < 1e-12);
        assert!(a.fine_tune);
    }

    #[test]
    fn parses_eval_json_and_rejects_missing_args() {
        let cli = Cli::try_parse_from([
            "tiergate",
            "eval",
            "--classifier",
            "c",
            "--data",
            "d.jsonl",
            "--json",
            "--skip-bad-rows",
        ])
        .unwrap();
        let Command::Eval(a) = cli.command else {
            panic!("not eval")
        };
        assert!(a.json && a.data.skip_bad_rows);
        assert!(Cli::try_parse_from(["tiergate", "eval", "--data", "d.csv"]).is_err());
        assert!(
            Cli::try_parse_from(["tiergate", "train", "--data", "d.csv", "--out", "o"]).is_err()
        );
        assert!(Cli::try_parse_from([
            "tiergate",
            "train",
            "--encoder",
            "e",
            "--data",
            "d",
            "--out",
            "o",
            "--dev-fraction",
            "abc"
        ])
        .is_err());
    }
}
