//! Loading in two phases: raw TOML layers (file, then environment, then `--set` overrides) merged into one
//! table, then deserialised into the typed schema (`deny_unknown_fields`) and validated once.

use std::path::Path;

use toml::{Table, Value};

use crate::{Config, ConfigError};

/// Environment variables that start with this prefix override config fields: `TIERGATE__PREFILTER__MAX_BATCH=8`
/// sets `prefilter.max_batch`. Path segments are separated by a double underscore and lower-cased.
pub const ENV_PREFIX: &str = "TIERGATE__";

/// The embedded default configuration (`config/default.toml`): used when no file is given.
pub const DEFAULT_CONFIG: &str = include_str!("../default.toml");

/// Loads the configuration.
///
/// * `file`: a TOML file (fields it leaves out take the schema defaults); `None` uses [`DEFAULT_CONFIG`].
/// * `env`: the process environment as `(name, value)` pairs (only `main` reads the real environment).
/// * `overrides`: `dotted.path=value` strings from the command line, applied last.
///
/// Values in `env` and `overrides` are parsed as TOML (`8`, `true`, `"x"`, `[1, 2]`), and taken as a plain
/// string when they are not valid TOML.
pub fn load(
    file: Option<&Path>,
    env: impl IntoIterator<Item = (String, String)>,
    overrides: &[String],
) -> Result<Config, ConfigError> {
    let mut lacks = Vec::new();
    let mut table = match file {
        Some(path) => {
            let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
                path: path.to_path_buf(),
                source,
            })?;
            let t = text.parse::<Table>().map_err(|e| ConfigError::Parse {
                origin: path.display().to_string(),
                message: e.to_string(),
            })?;
            lacks = lacking(&t);
            t
        }
        None => DEFAULT_CONFIG
            .parse::<Table>()
            .map_err(|e| ConfigError::Parse {
                origin: "embedded default config".into(),
                message: e.to_string(),
            })?,
    };
    let mut env: Vec<(String, String)> = env
        .into_iter()
        .filter(|(k, _)| k.starts_with(ENV_PREFIX))
        .collect();
    env.sort();
    for (key, value) in env {
        let path: Vec<String> = key[ENV_PREFIX.len()..]
            .split("__")
            .map(|s| s.to_ascii_lowercase())
            .collect();
        set_path(&mut table, &path, parse_value(&value), &key)?;
    }
    for item in overrides {
        let (key, value) = item.split_once('=').ok_or_else(|| ConfigError::Parse {
            origin: format!("--set {item}"),
            message: "expected `dotted.path=value`".into(),
        })?;
        let path: Vec<String> = key.trim().split('.').map(str::to_string).collect();
        set_path(
            &mut table,
            &path,
            parse_value(value.trim()),
            &format!("--set {item}"),
        )?;
    }
    let config: Config = Value::Table(table)
        .try_into()
        .map_err(|e: toml::de::Error| ConfigError::Parse {
            origin: file.map_or_else(
                || "defaults + overrides".into(),
                |p| p.display().to_string(),
            ),
            message: e.message().to_string(),
        })?;
    config.validate().map_err(|cause| match file {
        Some(path) if !lacks.is_empty() => ConfigError::Replaces {
            path: path.to_path_buf(),
            lacks: lacks.join(", "),
            cause: Box::new(cause),
        },
        _ => cause,
    })?;
    Ok(config)
}

/// The embedded default's sections a config file leaves out (it replaces the default, so it has none of them).
fn lacking(file: &Table) -> Vec<String> {
    let has = |p: &[&str]| {
        let mut cur = file;
        for (i, k) in p.iter().enumerate() {
            match cur.get(*k) {
                Some(Value::Table(next)) => cur = next,
                Some(_) => return i + 1 == p.len(),
                None => return false,
            }
        }
        true
    };
    [
        (&["prefilter", "head"][..], "`prefilter.head`"),
        (&["prefilter", "encoder"], "`prefilter.encoder`"),
        (&["routes"], "[[routes]]"),
        (&["reranker", "model"], "`reranker.model`"),
    ]
    .iter()
    .filter(|(p, _)| !has(p))
    .map(|(_, name)| name.to_string())
    .collect()
}

fn parse_value(text: &str) -> Value {
    format!("v = {text}")
        .parse::<Table>()
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| Value::String(text.to_string()))
}

fn set_path(
    table: &mut Table,
    path: &[String],
    value: Value,
    origin: &str,
) -> Result<(), ConfigError> {
    let bad = |message: &str| ConfigError::Parse {
        origin: origin.to_string(),
        message: message.to_string(),
    };
    let Some((last, parents)) = path.split_last() else {
        return Err(bad("empty field path"));
    };
    if path.iter().any(|s| s.is_empty()) {
        return Err(bad("empty segment in field path"));
    }
    let mut cur = table;
    for seg in parents {
        let entry = cur
            .entry(seg.clone())
            .or_insert_with(|| Value::Table(Table::new()));
        cur = entry
            .as_table_mut()
            .ok_or_else(|| bad(&format!("`{seg}` is not a table")))?;
    }
    cur.insert(last.clone(), value);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::HeadConfig;

    fn few_shot_toml() -> &'static str {
        r#"
[prefilter]
max_batch = 16
[prefilter.head]
kind = "few_shot"
labels = [
  { label = "a", examples = ["x"] },
  { label = "b", examples = ["y"], reply = "hi" },
]
"#
    }

    #[test]
    fn file_env_and_cli_layers_apply_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, few_shot_toml()).unwrap();
        let env = vec![
            (
                "TIERGATE__PREFILTER__MAX_BATCH".to_string(),
                "8".to_string(),
            ),
            ("TIERGATE__PREFILTER__TOP_K".to_string(), "6".to_string()),
            ("UNRELATED".to_string(), "1".to_string()),
        ];
        let cfg = load(Some(&path), env, &["prefilter.top_k=7".into()]).unwrap();
        assert_eq!(cfg.prefilter.max_batch, 8, "env overrides the file");
        assert_eq!(cfg.prefilter.top_k, 7, "--set overrides env");
        assert_eq!(
            cfg.prefilter.max_tokens, 64,
            "untouched fields keep defaults"
        );
        match cfg.prefilter.head {
            HeadConfig::FewShot { labels, .. } => {
                assert_eq!(labels[1].reply.as_deref(), Some("hi"))
            }
            other => panic!("unexpected head {other:?}"),
        }
    }

    #[test]
    fn unknown_field_is_rejected_with_its_name() {
        let err = load(None, Vec::new(), &["prefilter.max_bacth=3".into()]).unwrap_err();
        assert!(err.to_string().contains("max_bacth"), "{err}");
    }

    #[test]
    fn invalid_value_names_the_field() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, few_shot_toml()).unwrap();
        let err = load(Some(&path), Vec::new(), &["prefilter.max_batch=0".into()]).unwrap_err();
        assert!(err.to_string().contains("prefilter.max_batch"), "{err}");
        let err = load(
            Some(&path),
            Vec::new(),
            &["prefilter.token_budget=10".into()],
        )
        .unwrap_err();
        assert!(err.to_string().contains("prefilter.token_budget"), "{err}");
    }

    #[test]
    fn few_shot_head_needs_two_distinct_labels() {
        let toml = r#"
[prefilter.head]
kind = "few_shot"
labels = [{ label = "a", examples = ["x"] }, { label = "a", examples = ["y"] }]
"#;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, toml).unwrap();
        let err = load(Some(&path), Vec::new(), &[]).unwrap_err();
        assert!(
            err.to_string().contains("prefilter.head.labels[1].label"),
            "{err}"
        );
    }

    #[test]
    fn a_file_with_only_backends_is_refused_saying_it_replaces_the_default() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("llm.toml");
        std::fs::write(&path, "[[llm]]\nname = \"small\"\nengine = \"stub\"\n").unwrap();
        let err = load(Some(&path), std::iter::empty(), &[])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("a few-shot head needs at least 2 labels"),
            "{err}"
        );
        assert!(
            err.contains("replaces the embedded default config (it is not layered over it)"),
            "{err}"
        );
        assert!(
            err.contains("`prefilter.head`") && err.contains("[[routes]]"),
            "{err}"
        );
        assert!(err.contains("tiergate config --default"), "{err}");
        // The default itself, written to a file, is a valid file.
        std::fs::write(&path, DEFAULT_CONFIG).unwrap();
        load(Some(&path), std::iter::empty(), &[]).unwrap();
    }

    #[test]
    fn missing_file_and_bad_toml_are_clear_errors() {
        let err = load(Some(Path::new("/nonexistent/x.toml")), Vec::new(), &[]).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/x.toml"), "{err}");
        let err = load(None, Vec::new(), &["novalue".into()]).unwrap_err();
        assert!(err.to_string().contains("dotted.path=value"), "{err}");
    }

    #[test]
    fn embedded_default_is_valid_and_has_a_real_label_set() {
        let cfg = load(None, Vec::new(), &[]).unwrap();
        let HeadConfig::FewShot { labels, .. } = &cfg.prefilter.head else {
            panic!("default head is not few-shot")
        };
        assert!(labels.len() >= 20, "{} labels", labels.len());
        for l in labels {
            assert!(
                l.examples.len() >= 5,
                "{} has {} examples",
                l.label,
                l.examples.len()
            );
            assert!(
                l.reply.as_deref().is_some_and(|r| !r.is_empty()),
                "{} has no reply",
                l.label
            );
        }
    }

    #[test]
    fn top_k_below_the_llm_candidates_is_refused() {
        let err = load(None, Vec::new(), &["prefilter.top_k=3".into()]).unwrap_err();
        assert!(err.to_string().contains("prefilter.top_k"), "{err}");
        // Without workers nothing is sent to an LLM, so a smaller top_k is fine.
        assert!(load(
            None,
            Vec::new(),
            &["prefilter.top_k=3".into(), "reranker.workers=0".into()]
        )
        .is_ok());
    }

    #[test]
    fn string_values_need_no_quotes() {
        let cfg = load(
            None,
            Vec::new(),
            &[
                "prefilter.encoder=/tmp/enc".into(),
                // A tagged section is replaced whole with an inline table.
                r#"prefilter.head={ kind = "trained", dir = "/tmp/h" }"#.into(),
            ],
        )
        .unwrap();
        assert_eq!(cfg.prefilter.encoder, Path::new("/tmp/enc"));
        assert!(matches!(cfg.prefilter.head, HeadConfig::Trained(_)));
    }

    #[test]
    fn the_policy_store_kind_is_one_of_two() {
        let cfg = load(
            None,
            Vec::new(),
            &[
                "policy_store.kind=redis".into(),
                "policy_store.url=redis://127.0.0.1:6379/0".into(),
            ],
        )
        .unwrap();
        assert_eq!(cfg.policy_store.kind, crate::StoreKind::Redis);
        let e = load(None, Vec::new(), &["policy_store.kind=etcd".into()])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("etcd") && e.contains("memory") && e.contains("redis"),
            "{e}"
        );
    }
}
