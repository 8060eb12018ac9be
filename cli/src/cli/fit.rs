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
    /// Fit a cascade stage after the first (its backend's name; written as `fusion.STAGE.json`): its LLM's
    /// scores come from --from-rows, and it fuses with what the stages before it leave, given in cascade order
    /// by --prior-rows (each already fitted: the first in `fusion.json`, later ones by `--stage`). The fit
    /// sees every row the previous stage scored, not only those a θ would send on.
    #[arg(long, requires_all = ["from_rows", "prior_rows"])]
    pub stage: Option<String>,
    /// With --stage: the rows files of the stages before it (`eval --hybrid --rows`), in cascade order.
    #[arg(long)]
    pub prior_rows: Vec<PathBuf>,
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
    if let Some(stage) = &args.stage {
        return fit_stage(args, stage, &cfg, &classifier, &rows);
    }
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
            hybrid::llm_name(&cfg)?,
        ),
    };
    let f = hybrid::save_fit(&args.classifier, &llm, &scored, None)?;
    report(args, &f, None);
    Ok(())
}

/// `--stage`: the stages before it chained with their fits, then this stage's fit on what they leave.
fn fit_stage(
    args: &FitArgs,
    stage: &str,
    cfg: &tiergate_config::Config,
    classifier: &tiergate_prefilter::Classifier,
    rows: &[tiergate_train::data::Example],
) -> anyhow::Result<()> {
    let mut files = args.prior_rows.clone();
    files.extend(args.from_rows.clone());
    let stages = hybrid::read_stages(&files, cfg, classifier, rows)?;
    let seen = tiergate_train::fusion::stages::chain(classifier, &stages)?;
    let after: Vec<String> = stages[..stages.len() - 1]
        .iter()
        .map(|s| s.llm.clone())
        .collect();
    let llm = stages[stages.len() - 1].llm.clone();
    let f = hybrid::save_fit(&args.classifier, &llm, &seen, Some((stage, &after)))?;
    report(args, &f, Some(stage));
    Ok(())
}

fn report(args: &FitArgs, f: &tiergate_prefilter::heads::FittedFusion, stage: Option<&str>) {
    if !f.after.is_empty() {
        println!(
            "stage {} after {}",
            stage.unwrap_or(""),
            f.after.join(" → ")
        );
    }
    println!(
        "fit on {} escalated rows with {}: llm_weight {} llm_temperature {}; accuracy on them: Tier-0 {:.4}, fused {:.4}",
        f.rows, f.llm, f.llm_weight, f.llm_temperature, f.tier0_accuracy, f.fused_accuracy
    );
    let chosen = f.chosen_on.map_or(String::new(), |(fx, br)| {
        format!(" on the half it was chosen on: fixes {fx}, breaks {br};")
    });
    println!(
        "best on the grid: weight {} temperature {}:{chosen} on the other half: fixes {} rows, breaks {} (sign test p = {:.3}; the LLM gets weight only at p <= {})",
        f.best_weight, f.best_temperature, f.rows_fixed, f.rows_broken, f.p_value, tiergate_train::fusion::fit::FIT_ALPHA
    );
    if f.llm_weight == 0.0 {
        println!("escalation adds no accuracy with this LLM on the dev split; θ = 1 recommended");
    }
    let file = stage.map_or_else(
        || tiergate_prefilter::heads::FittedFusion::FILE.to_string(),
        tiergate_prefilter::heads::FittedFusion::stage_file,
    );
    println!("wrote {}", args.classifier.join(file).display());
}
