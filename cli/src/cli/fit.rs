//! `tiergate fit-fusion`.

use std::path::PathBuf;

use clap::Args;

use super::eval::{select_rows, Split};
use super::{hybrid, ConfigArgs, DataArgs};

#[derive(Debug, Args)]
pub struct FitArgs {
    /// A folder written by `tiergate train`: the fit is written there as `fusion.json`.
    #[arg(long)]
    pub classifier: PathBuf,
    #[command(flatten)]
    pub data: DataArgs,
    /// Rows to fit on (`dev`: the part `tiergate train` held out, with the same --dev-fraction and --seed).
    #[arg(long, value_enum, default_value_t = Split::Dev)]
    pub split: Split,
    /// Dev share of the split (as given to `tiergate train`).
    #[arg(long, default_value_t = 0.1)]
    pub dev_fraction: f64,
    /// Seed of the split (as given to `tiergate train`).
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Fit on the LLM scores of an earlier `tiergate eval --hybrid --rows FILE` over the same rows instead of
    /// running the LLM again (Tier-0 is run again and must agree with the file).
    #[arg(long)]
    pub from_rows: Option<PathBuf>,
    /// The LLM runs on (and the fit sees) this share of the rows, the most ambiguous: the escalations of the
    /// operating range.
    #[arg(long, default_value_t = 0.3)]
    pub max_escalated: f64,
    #[command(flatten)]
    pub config: ConfigArgs,
}

pub fn run(args: &FitArgs, env: impl IntoIterator<Item = (String, String)>) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.classifier.join("head.json").is_file(),
        "{} is not a `tiergate train` folder (no head.json)",
        args.classifier.display()
    );
    let cfg = tiergate_config::load(args.config.config.as_deref(), env, &args.config.overrides)?;
    let data = tiergate_train::data::read(&args.data.spec())?;
    let classifier = hybrid::load_classifier(&args.classifier, &cfg)?;
    let rows = select_rows(data.examples, args.split, args.dev_fraction, args.seed);
    let (scored, llm) = match &args.from_rows {
        Some(path) => {
            let (scored, llm, _) = hybrid::rows_from_file(path, &cfg, &classifier, &rows)?;
            (scored, llm)
        }
        None => (
            hybrid::score_rows(
                &cfg,
                &classifier,
                &rows,
                args.max_escalated,
                &mut |m| eprintln!("{m}"),
                &mut |_, _| Ok(()),
            )?,
            hybrid::llm_name(&cfg),
        ),
    };
    let f = hybrid::save_fit(&args.classifier, &llm, &scored)?;
    println!(
        "fit on {} escalated rows with {}: llm_weight {} llm_temperature {}; accuracy on them: Tier-0 {:.4}, fused {:.4}",
        f.rows, f.llm, f.llm_weight, f.llm_temperature, f.tier0_accuracy, f.fused_accuracy
    );
    println!(
        "best on the grid: weight {} temperature {}: fixes {} rows, breaks {} (sign test p = {:.3}; the LLM gets weight only at p <= {})",
        f.best_weight, f.best_temperature, f.rows_fixed, f.rows_broken, f.p_value, tiergate_server::fusion::fit::FIT_ALPHA
    );
    if f.llm_weight == 0.0 {
        println!("escalation adds no accuracy with this LLM on the dev split; θ = 1 recommended");
    }
    println!(
        "wrote {}",
        args.classifier
            .join(tiergate_prefilter::heads::FittedFusion::FILE)
            .display()
    );
    Ok(())
}
