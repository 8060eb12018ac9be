//! `[[llm]]`: several LLM backends, each a named `[reranker]`-shaped section. `[reranker]` stays the short
//! form of one backend: without `[[llm]]` it is the only backend (named `default`); with `[[llm]]` it holds
//! the defaults every entry starts from, and an entry's own fields win over it (`--set reranker.model=…`
//! changes every entry that does not set its own `model`).

use serde::{Deserialize, Serialize};

use crate::{ConfigError, RerankerConfig};

/// The name of the backend `[reranker]` alone describes.
pub const DEFAULT_BACKEND: &str = "default";

/// One `[[llm]]` entry: its name and the `[reranker]` fields it sets.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LlmEntry {
    /// Its name (routes' `stages`, metrics, the console).
    pub name: String,
    /// `[reranker]` fields of its own.
    #[serde(flatten)]
    pub fields: toml::Table,
}

/// The backends in force, in order: `[[llm]]` entries over `[reranker]`, or `[reranker]` alone.
pub fn backends(
    reranker: &RerankerConfig,
    entries: &[LlmEntry],
) -> Result<Vec<(String, RerankerConfig)>, ConfigError> {
    if entries.is_empty() {
        return Ok(vec![(DEFAULT_BACKEND.to_string(), reranker.clone())]);
    }
    let base = toml::Table::try_from(reranker).map_err(|e| ConfigError::Parse {
        origin: "reranker".into(),
        message: e.to_string(),
    })?;
    let mut seen = std::collections::HashSet::new();
    entries
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let at = format!("llm[{i}]");
            if e.name.trim().is_empty() || !seen.insert(e.name.as_str()) {
                return Err(ConfigError::invalid(
                    format!("{at}.name"),
                    "must be non-empty and unique",
                ));
            }
            let mut merged = base.clone();
            for (k, v) in &e.fields {
                merged.insert(k.clone(), v.clone());
            }
            let r: RerankerConfig =
                merged
                    .try_into()
                    .map_err(|err: toml::de::Error| ConfigError::Parse {
                        origin: at.clone(),
                        message: err.to_string(),
                    })?;
            r.validate(&at)?;
            Ok((e.name.clone(), r))
        })
        .collect()
}

/// The `[reranker]` fields set away from their defaults that no `[[llm]]` entry takes, because every entry
/// sets its own: they have no effect (the server warns at start).
pub fn shadowed(reranker: &RerankerConfig, entries: &[LlmEntry]) -> Vec<String> {
    if entries.is_empty() {
        return Vec::new();
    }
    let (Ok(set), Ok(default)) = (
        toml::Table::try_from(reranker),
        toml::Table::try_from(RerankerConfig::default()),
    ) else {
        return Vec::new();
    };
    set.iter()
        .filter(|(k, v)| default.get(*k) != Some(*v))
        .filter(|(k, _)| entries.iter().all(|e| e.fields.contains_key(*k)))
        .map(|(k, _)| k.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str, fields: &str) -> LlmEntry {
        LlmEntry {
            name: name.into(),
            fields: toml::from_str(fields).unwrap(),
        }
    }

    #[test]
    fn entries_start_from_the_reranker_section_and_win_over_it() {
        let mut r = RerankerConfig {
            workers: 2,
            ..RerankerConfig::default()
        };
        r.slots = 32;
        let only = backends(&r, &[]).unwrap();
        assert_eq!(only.len(), 1);
        assert_eq!(only[0].0, DEFAULT_BACKEND);
        let two = backends(
            &r,
            &[
                entry("small", "engine = \"stub\""),
                entry("big", "engine = \"stub\"\nworkers = 1\nslots = 8"),
            ],
        )
        .unwrap();
        assert_eq!((two[0].1.workers, two[0].1.slots), (2, 32), "the defaults");
        assert_eq!(
            (two[1].1.workers, two[1].1.slots),
            (1, 8),
            "its own fields win"
        );
        let e = backends(&r, &[entry("a", ""), entry("a", "")]).unwrap_err();
        assert!(e.to_string().contains("llm[1].name"), "{e}");
        assert!(shadowed(&r, &[]).is_empty());
        let entries = [
            entry("a", "workers = 1"),
            entry("b", "workers = 3\nslots = 4"),
        ];
        assert_eq!(
            shadowed(&r, &entries),
            vec!["workers".to_string()],
            "slots: `a` takes it"
        );
        let e = backends(&r, &[entry("a", "wrokers = 3")]).unwrap_err();
        assert!(e.to_string().contains("llm[0]"), "{e}");
    }
}
