//! `tiergate config`: the embedded default config (`--default`), a check of a config file with the
//! environment and `--set` overrides as `serve` would read it (`--check`), and every value with the layer it
//! came from (`--explain`).

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
    /// Print every value `serve` would run with (the embedded example, or --config FILE, with the
    /// environment and --set) and the layer it came from: `default` (the field's documented default),
    /// `example`, a file, `env TIERGATE__…`, `--set …`.
    #[arg(long, conflicts_with_all = ["check", "default"])]
    pub explain: bool,
    /// The config file --explain reads (default: the embedded example).
    #[arg(long, value_name = "FILE", requires = "explain")]
    pub config: Option<PathBuf>,
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
    if args.explain {
        let mut out = std::io::stdout().lock();
        for (path, value, layer) in
            tiergate_config::explain(args.config.as_deref(), env, &args.overrides)?
        {
            writeln!(out, "{path} = {value}    # {layer}")?;
        }
        return Ok(());
    }
    if !args.default {
        anyhow::bail!(
            "say what to do: --default (print the embedded default), --check FILE or --explain [--config FILE]"
        );
    }
    std::io::stdout().write_all(tiergate_config::DEFAULT_CONFIG.as_bytes())?;
    Ok(())
}
