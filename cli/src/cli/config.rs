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
    /// Print the cargo features of the LLM worker this config needs (`llamacpp` for `auto` and `llamacpp`,
    /// `llm` for `mistralrs`; none for `stub` and `openai`), comma-separated: `scripts/tiergate` builds the
    /// worker with these only.
    #[arg(long, conflicts_with_all = ["check", "default", "explain"])]
    pub worker_features: bool,
    /// The config file --explain or --worker-features reads (default: the embedded example).
    #[arg(long, value_name = "FILE")]
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
    if args.worker_features {
        let c = tiergate_config::load(args.config.as_deref(), env, &args.overrides)?.resolve()?;
        println!("{}", worker_features(&c).join(","));
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

/// The worker's cargo features the config's backends need, sorted.
fn worker_features(c: &tiergate_config::Resolved) -> Vec<&'static str> {
    use tiergate_config::EngineKind;
    let mut f: Vec<&'static str> = c
        .backends
        .iter()
        .filter_map(|b| match b.config.engine {
            EngineKind::Auto | EngineKind::Llamacpp => Some("llamacpp"),
            EngineKind::Mistralrs => Some("llm"),
            EngineKind::Stub | EngineKind::Openai => None,
        })
        .collect();
    f.sort_unstable();
    f.dedup();
    f
}

#[cfg(test)]
mod tests {
    use super::*;

    fn features(sets: &[&str]) -> Vec<&'static str> {
        let sets: Vec<String> = sets.iter().map(|s| s.to_string()).collect();
        let c = tiergate_config::load(None, Vec::new(), &sets)
            .unwrap()
            .resolve()
            .unwrap();
        worker_features(&c)
    }

    #[test]
    fn the_worker_is_built_with_the_engines_the_config_uses() {
        // The embedded default (`auto`) is llama.cpp on a build without CUDA.
        assert_eq!(features(&[]), ["llamacpp"]);
        assert_eq!(features(&["reranker.engine=\"mistralrs\""]), ["llm"]);
        assert!(features(&["reranker.engine=\"stub\""]).is_empty());
        let two = "llm=[{ name = \"a\", engine = \"mistralrs\", model = \"m.gguf\" }, \
                   { name = \"b\", engine = \"llamacpp\", model = \"m.gguf\" }]";
        assert_eq!(features(&[two]), ["llamacpp", "llm"]);
    }
}
