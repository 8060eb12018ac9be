//! Loading in two phases: raw TOML layers (file, then environment, then `--set` overrides) merged into one
//! table, then deserialised into the typed schema (`deny_unknown_fields`) and validated once.

use std::path::Path;

use toml::{Table, Value};

use crate::origins::Origins;
use crate::{Config, ConfigError};

/// Environment variables that start with this prefix override config fields: `TIERGATE__PREFILTER__MAX_BATCH=8`
/// sets `prefilter.max_batch`. Path segments are separated by a double underscore and lower-cased.
pub const ENV_PREFIX: &str = "TIERGATE__";

/// The embedded default configuration (`config/default.toml`): used when no file is given.
pub const DEFAULT_CONFIG: &str = include_str!("../default.toml");

/// Loads the configuration.
///
/// * `file`: a TOML file (fields it leaves out take the schema defaults; `extends` names a base it builds on,
///   [`crate::origins`]); `None` uses [`DEFAULT_CONFIG`].
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
    Ok(layered(file, env, overrides)?.0)
}

/// Every value of the configuration `load` would give, with the layer it came from (`default`, `example`,
/// a base or config file's path, `env TIERGATE__…`, `--set …`), in the schema's order.
pub fn explain(
    file: Option<&Path>,
    env: impl IntoIterator<Item = (String, String)>,
    overrides: &[String],
) -> Result<Vec<(String, Value, String)>, ConfigError> {
    let (config, origins) = layered(file, env, overrides)?;
    let value = Value::try_from(&config).map_err(|e| ConfigError::Parse {
        origin: "the loaded config".into(),
        message: e.to_string(),
    })?;
    let mut out = Vec::new();
    crate::origins::leaves(&value, "", &mut out);
    Ok(out
        .into_iter()
        .map(|(path, v)| {
            let layer = origins.of(&path).to_string();
            (path, v, layer)
        })
        .collect())
}

/// The layers merged, deserialised and validated, and where each value came from.
fn layered(
    file: Option<&Path>,
    env: impl IntoIterator<Item = (String, String)>,
    overrides: &[String],
) -> Result<(Config, Origins), ConfigError> {
    let mut origins = Origins::default();
    let mut lacks = Vec::new();
    let mut table = match file {
        Some(path) => {
            let (t, extends) = read_file(path, &mut origins, 0)?;
            if !extends {
                lacks = lacking(&t);
            }
            t
        }
        None => {
            let t = embedded()?;
            origins.mark("", &Value::Table(t.clone()), "example");
            t
        }
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
        let value = parse_value(&value);
        origins.mark(&path.join("."), &value, &format!("env {key}"));
        set_path(&mut table, &path, value, &key)?;
    }
    for item in overrides {
        let (key, value) = item.split_once('=').ok_or_else(|| ConfigError::Parse {
            origin: format!("--set {item}"),
            message: "expected `dotted.path=value`".into(),
        })?;
        let path: Vec<String> = key.trim().split('.').map(str::to_string).collect();
        let value = parse_value(value.trim());
        origins.mark(&path.join("."), &value, &format!("--set {}", key.trim()));
        set_path(&mut table, &path, value, &format!("--set {item}"))?;
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
    Ok((config, origins))
}

/// The embedded example (`config/default.toml`) as a table.
fn embedded() -> Result<Table, ConfigError> {
    DEFAULT_CONFIG
        .parse::<Table>()
        .map_err(|e| ConfigError::Parse {
            origin: "embedded default config".into(),
            message: e.to_string(),
        })
}

/// How deep `extends` may chain (a file extending a file extending the example is 2).
const MAX_EXTENDS: usize = 4;

/// `path` as a table, over the base its `extends` names (`"example"`: the embedded default; else a file,
/// relative to `path`'s folder), and whether it extends one.
fn read_file(
    path: &Path,
    origins: &mut Origins,
    depth: usize,
) -> Result<(Table, bool), ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let mut t = text.parse::<Table>().map_err(|e| ConfigError::Parse {
        origin: path.display().to_string(),
        message: e.to_string(),
    })?;
    let bad = |message: String| ConfigError::Invalid {
        field: format!("{}: extends", path.display()),
        message,
    };
    let Some(extends) = t.remove("extends") else {
        origins.mark("", &Value::Table(t.clone()), &path.display().to_string());
        return Ok((t, false));
    };
    let Value::String(base) = extends else {
        return Err(bad(
            "a string: \"example\" (the embedded default) or a file".into(),
        ));
    };
    if depth >= MAX_EXTENDS {
        return Err(bad(format!(
            "more than {MAX_EXTENDS} files deep (a loop of extends?)"
        )));
    }
    let mut table = if base == "example" {
        let e = embedded()?;
        origins.mark("", &Value::Table(e.clone()), "example");
        e
    } else {
        let dir = path.parent().unwrap_or(Path::new("."));
        read_file(&dir.join(&base), origins, depth + 1)?.0
    };
    crate::origins::merge(&mut table, t, "", &path.display().to_string(), origins);
    Ok((table, true))
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
    fn a_file_extends_the_example_and_says_only_what_differs() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("two.toml");
        // Ten lines: the example's head, prompts and routes, and two more backends.
        std::fs::write(
            &path,
            "extends = \"example\"\n[[llm]]\nname = \"small\"\nengine = \"stub\"\n\
             [[llm]]\nname = \"big\"\nengine = \"stub\"\n[prefilter]\nmax_batch = 8\n",
        )
        .unwrap();
        assert!(std::fs::read_to_string(&path).unwrap().lines().count() <= 10);
        let cfg = load(Some(&path), Vec::new(), &[]).unwrap();
        let example = load(None, Vec::new(), &[]).unwrap();
        assert_eq!(cfg.llm.len(), 2);
        assert_eq!(cfg.routes, example.routes, "the example's routes");
        assert_eq!(cfg.prefilter.head, example.prefilter.head, "and head");
        assert_eq!(cfg.prefilter.max_batch, 8, "a table merges key by key");
        assert_eq!(cfg.prefilter.encoder, example.prefilter.encoder);
        // A tagged table replaces whole: a trained head keeps none of the example's labels.
        std::fs::write(
            &path,
            "extends = \"example\"\n[prefilter.head]\nkind = \"trained\"\ndir = \"/tmp/h\"\n",
        )
        .unwrap();
        let cfg = load(Some(&path), Vec::new(), &[]).unwrap();
        assert!(matches!(cfg.prefilter.head, HeadConfig::Trained(_)));
        // A file may extend a file (relative to its own folder), which extends the example.
        let top = dir.path().join("top.toml");
        std::fs::write(&path, "extends = \"example\"\n[prefilter]\nmax_batch = 8\n").unwrap();
        std::fs::write(&top, "extends = \"two.toml\"\n[prefilter]\ntop_k = 9\n").unwrap();
        let cfg = load(Some(&top), Vec::new(), &[]).unwrap();
        assert_eq!((cfg.prefilter.max_batch, cfg.prefilter.top_k), (8, 9));
        // A loop is refused, so is a field the schema does not have (naming it and the file).
        std::fs::write(&path, "extends = \"top.toml\"\n").unwrap();
        let e = load(Some(&top), Vec::new(), &[]).unwrap_err().to_string();
        assert!(e.contains("extends") && e.contains("deep"), "{e}");
        std::fs::write(&path, "extends = \"example\"\n[prefilter]\nmax_bacth = 8\n").unwrap();
        let e = load(Some(&path), Vec::new(), &[]).unwrap_err().to_string();
        assert!(e.contains("max_bacth") && e.contains("two.toml"), "{e}");
    }

    #[test]
    fn explain_names_the_layer_of_every_value() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(
            &path,
            "extends = \"example\"\n[[llm]]\nname = \"small\"\nengine = \"stub\"\n[prefilter]\ntop_k = 9\n",
        )
        .unwrap();
        let env = vec![(
            "TIERGATE__PREFILTER__MAX_BATCH".to_string(),
            "8".to_string(),
        )];
        let all = explain(Some(&path), env, &["routing.theta_base=0.4".into()]).unwrap();
        let layer = |p: &str| {
            all.iter()
                .find(|(k, _, _)| k == p)
                .map(|(_, v, l)| (v.to_string(), l.clone()))
                .unwrap_or_else(|| panic!("{p} not listed"))
        };
        let file = path.display().to_string();
        assert_eq!(layer("prefilter.top_k"), ("9".into(), file.clone()));
        assert_eq!(
            layer("prefilter.max_batch").1,
            "env TIERGATE__PREFILTER__MAX_BATCH"
        );
        assert_eq!(
            layer("routing.theta_base"),
            ("0.4".into(), "--set routing.theta_base".into())
        );
        assert_eq!(layer("prefilter.encoder").1, "example");
        assert_eq!(layer("prefilter.head.kind").1, "example");
        assert_eq!(layer("llm").1, file);
        assert_eq!(layer("sessions.ttl_s").1, "default");
        assert!(all.len() > 100, "every value: {}", all.len());
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
