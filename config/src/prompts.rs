//! Prompt templates: what the LLM sees when it scores candidates and when it writes an answer. The text lives
//! in `prompts/neutral.toml` (the defaults) and in deployments' config files, never in Rust source.

use serde::{Deserialize, Serialize};

use crate::ConfigError;

/// The neutral templates, parsed once for [`PromptConfig::default`].
pub const NEUTRAL_PROMPTS: &str = include_str!("../prompts/neutral.toml");

/// How the LLM scores Tier-0's candidates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScoringMethod {
    /// P(query | the candidate's examples): one label prefix per candidate, cached across requests.
    Channel,
    /// P(candidate text | a prompt holding the query): one shared prompt, every candidate scored off it.
    Likelihood,
    /// One multiple-choice prompt in the model's chat template, the candidates as letters: the next-token
    /// distribution over the letters, averaged over cyclic shifts of the options.
    Choice,
    /// Whatever the worker's model profile says (`models/profiles.toml`).
    Auto,
}

impl ScoringMethod {
    /// The name used in config files.
    pub fn name(self) -> &'static str {
        match self {
            Self::Channel => "channel",
            Self::Likelihood => "likelihood",
            Self::Choice => "choice",
            Self::Auto => "auto",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        [Self::Channel, Self::Likelihood, Self::Choice, Self::Auto]
            .into_iter()
            .find(|m| m.name() == s)
    }
}

/// Templates for one route (placeholders: `{label}`, `{description}`, `{examples}`, `{example}`, `{reply}`,
/// `{query}`, `{candidates}`; see `prompts/neutral.toml`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PromptConfig {
    /// How candidates are scored.
    pub method: ScoringMethod,
    /// Channel: the text before the query, per candidate (`{label}`, `{description}`, `{examples}`,
    /// `{reply}`).
    pub label_prefix: String,
    /// A label's description inside `{description}` (`{description}`); a label without one shows nothing.
    pub description_line: String,
    /// Channel: one example line inside `{examples}` (`{example}`).
    pub example_line: String,
    /// Channel: the scored text after a label prefix (`{query}`).
    pub query: String,
    /// Likelihood: the shared prompt (`{query}`).
    pub likelihood_prompt: String,
    /// Likelihood: the scored text per candidate (`{label}`, `{reply}`).
    pub likelihood_candidate: String,
    /// Scored in place of the query to estimate each candidate's prior, which is then subtracted; empty: off.
    pub content_free: String,
    /// Examples shown per candidate at most.
    pub max_examples: usize,
    /// Answer routes: the system message of an escalated answer (`{candidates}`).
    pub answer_system: String,
    /// Answer routes: one line per candidate inside `{candidates}` (`{label}`, `{reply}`).
    pub answer_candidate: String,
    /// Choice: the multiple-choice question (`{query}`, `{options}`), answered with one letter.
    pub choice_prompt: String,
    /// Choice: one option line inside `{options}` (`{letter}`, `{label}`, `{description}`, `{reply}`,
    /// `{examples}`).
    pub choice_option: String,
    /// Choice: one example line inside an option's `{examples}` (`{example}`).
    pub choice_example: String,
    /// Choice (when `method = "choice"`; `auto` takes the profile's): examples shown per option.
    pub choice_examples: usize,
    /// Choice (same precedence): cyclic shifts of the options, their letter distributions averaged.
    pub choice_orders: usize,
}

impl Default for PromptConfig {
    /// The neutral templates of `prompts/neutral.toml`, parsed once per process (serde builds a default for
    /// every deserialised `PromptConfig`, so every queued job would otherwise parse the file).
    fn default() -> Self {
        static NEUTRAL: std::sync::OnceLock<PromptConfig> = std::sync::OnceLock::new();
        NEUTRAL.get_or_init(PromptConfig::neutral).clone()
    }
}

impl PromptConfig {
    /// Reads `prompts/neutral.toml` field by field from a TOML table: deserialising `PromptConfig` itself would
    /// ask `default` for the fields the file leaves out.
    fn neutral() -> Self {
        let table: toml::Table = toml::from_str(NEUTRAL_PROMPTS).unwrap_or_default();
        let text = |k: &str| {
            table
                .get(k)
                .and_then(|v| v.as_str())
                .unwrap_or_default()
                .to_string()
        };
        let count = |k: &str| {
            table
                .get(k)
                .and_then(|v| v.as_integer())
                .map_or(0, |n| n.max(0) as usize)
        };
        Self {
            method: ScoringMethod::parse(&text("method")).unwrap_or(ScoringMethod::Auto),
            label_prefix: text("label_prefix"),
            description_line: text("description_line"),
            example_line: text("example_line"),
            query: text("query"),
            likelihood_prompt: text("likelihood_prompt"),
            likelihood_candidate: text("likelihood_candidate"),
            content_free: text("content_free"),
            max_examples: count("max_examples"),
            answer_system: text("answer_system"),
            answer_candidate: text("answer_candidate"),
            choice_prompt: text("choice_prompt"),
            choice_option: text("choice_option"),
            choice_example: text("choice_example"),
            choice_examples: count("choice_examples"),
            choice_orders: count("choice_orders"),
        }
    }
}

impl PromptConfig {
    /// Checks that each template carries the placeholder it exists for.
    pub fn validate(&self, at: &str) -> Result<(), ConfigError> {
        let need = |field: &str, text: &str, placeholder: &str| {
            if text.contains(placeholder) {
                Ok(())
            } else {
                Err(ConfigError::invalid(
                    format!("{at}.{field}"),
                    format!("must contain {placeholder}"),
                ))
            }
        };
        need("query", &self.query, "{query}")?;
        need("likelihood_prompt", &self.likelihood_prompt, "{query}")?;
        need("example_line", &self.example_line, "{example}")?;
        need("description_line", &self.description_line, "{description}")?;
        need("answer_system", &self.answer_system, "{candidates}")?;
        need("choice_prompt", &self.choice_prompt, "{query}")?;
        need("choice_prompt", &self.choice_prompt, "{options}")?;
        need("choice_option", &self.choice_option, "{letter}")?;
        if self.likelihood_candidate.trim().is_empty() {
            return Err(ConfigError::invalid(
                format!("{at}.likelihood_candidate"),
                "must not be empty",
            ));
        }
        need("choice_example", &self.choice_example, "{example}")?;
        if !(1..=10).contains(&self.choice_orders) {
            return Err(ConfigError::invalid(
                format!("{at}.choice_orders"),
                "1 to 10",
            ));
        }
        if self.max_examples > 16 || self.choice_examples > 16 {
            return Err(ConfigError::invalid(
                format!("{at}.max_examples"),
                "at most 16 (choice_examples too)",
            ));
        }
        Ok(())
    }
}

/// Fills `{name}` placeholders; unknown placeholders stay as written.
pub fn render(template: &str, vars: &[(&str, &str)]) -> String {
    // One pass: a value is never scanned for placeholders (a query containing `{examples}` stays as typed).
    let mut out =
        String::with_capacity(template.len() + vars.iter().map(|(_, v)| v.len()).sum::<usize>());
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let var = after.find('}').and_then(|close| {
            vars.iter()
                .find(|(k, _)| *k == &after[..close])
                .map(|(_, v)| (close, *v))
        });
        match var {
            Some((close, v)) => {
                out.push_str(v);
                rest = &after[close + 1..];
            }
            None => {
                out.push('{');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// A label as the LLM reads it: `card_not_arrived` → `card not arrived`.
pub fn display_label(label: &str) -> String {
    label.replace(['_', '-'], " ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_substitutes_once_and_keeps_unknown_braces() {
        let out = render("{a} and {b} {unknown} {a}}", &[("a", "x{b}"), ("b", "{a}")]);
        assert_eq!(out, "x{b} and {a} {unknown} x{b}}");
        assert_eq!(render("no vars {", &[("a", "1")]), "no vars {");
        assert_eq!(render("", &[]), "");
    }

    #[test]
    fn neutral_prompts_parse_and_validate() {
        let p = PromptConfig::default();
        p.validate("reranker.prompts").unwrap();
        assert_eq!(p.method, ScoringMethod::Auto);
        assert!(p.max_examples > 0);
        // Every key of the file is a field (deny_unknown_fields), and a partial table keeps the rest neutral.
        let full: PromptConfig = toml::from_str(NEUTRAL_PROMPTS).unwrap();
        assert_eq!(full, p);
        let partial: PromptConfig = toml::from_str("method = \"likelihood\"").unwrap();
        assert_eq!(partial.method, ScoringMethod::Likelihood);
        assert_eq!(partial.query, p.query);
        let mut bad = p.clone();
        bad.query = "no placeholder".into();
        let e = bad.validate("reranker.prompts").unwrap_err().to_string();
        assert!(e.contains("reranker.prompts.query"), "{e}");
    }

    #[test]
    fn render_fills_known_placeholders_only() {
        assert_eq!(
            render("{label}: {x} {label}", &[("label", "a b")]),
            "a b: {x} a b"
        );
        assert_eq!(display_label("card_not-arrived"), "card not arrived");
    }
}
