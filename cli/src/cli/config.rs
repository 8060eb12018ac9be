//! `tiergate config`: the embedded default config (`--default`), and a check of a config file with the
//! environment and `--set` overrides as `serve` would read it (`--check`).

use std::io::Write;
use std::path::PathBuf;

use clap::Args;

/// What `tiergate config` prints or checks.
#[derive(Debug, Args)]
pub struct ConfigArgs {
    /// Print the embedded default config (the one `serve` uses without --config): a file to start from.
    #[arg(long, conflicts_with = "check")]
    pub default: bool,
    /// Check a config file (with the environment's `TIERGATE__…` and the --set overrides) and say whether
    /// `serve` would accept it.
    #[arg(long, value_name = "FILE")]
    pub check: Option<PathBuf>,
    /// Override a config field, as for `serve`.
    #[arg(long = "set", value_name = "KEY=VALUE")]
    pub overrides: Vec<String>,
}

/// Runs `tiergate config`.
pub fn run(
    args: &ConfigArgs,
    env: impl IntoIterator<Item = (String, String)>,
) -> anyhow::Result<()> {
    if let Some(file) = &args.check {
        let c = tiergate_config::load(Some(file), env, &args.overrides)?.resolve()?;
        println!(
            "{}: valid ({} routes, {} LLM backends)",
            file.display(),
            c.routes.len(),
            c.backends.len()
        );
        return Ok(());
    }
    if !args.default {
        anyhow::bail!("say what to do: --default (print the embedded default) or --check FILE");
    }
    std::io::stdout().write_all(tiergate_config::DEFAULT_CONFIG.as_bytes())?;
    Ok(())
}
