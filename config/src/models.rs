//! Per-model scoring profiles and chat templates (the text is in `models/*.toml`, embedded at build time).
//!
//! With `method = "auto"` a worker scores the way its model's profile says, so `--set reranker.model=…`
//! alone switches the judge: formulation, examples per option, option orders and the chat template.

use serde::{Deserialize, Serialize};

use crate::{render, ConfigError, PromptConfig, ScoringMethod};

const PROFILES: &str = include_str!("../models/profiles.toml");
const TEMPLATES: &[(&str, &str)] = &[
    ("qwen2", include_str!("../models/qwen2.toml")),
    ("smollm2", include_str!("../models/smollm2.toml")),
    ("plain", include_str!("../models/plain.toml")),
];

/// How one model family scores candidates.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelProfile {
    /// Profile name (`reranker.profile` picks it outright).
    pub name: String,
    /// Parts of a model file name (lower case) this profile applies to.
    #[serde(rename = "match")]
    pub matches: Vec<String>,
    /// The formulation (never `auto`).
    pub method: ScoringMethod,
    /// Choice: examples shown per option.
    pub examples: usize,
    /// Choice: cyclic shifts of the options whose letter distributions are averaged.
    pub orders: usize,
    /// The chat template's name (a file under `models/`).
    pub template: String,
}

/// What one job is scored with: the route's method, or under `auto` the profile's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Formulation {
    /// Never `auto`.
    pub method: ScoringMethod,
    /// Choice: examples per option.
    pub examples: usize,
    /// Choice: option orders.
    pub orders: usize,
}

impl ModelProfile {
    /// The formulation a job with templates `p` gets on this model: the profile's under `method = "auto"`,
    /// else the route's method with its `choice_examples` and `choice_orders`.
    pub fn resolve(&self, p: &PromptConfig) -> Formulation {
        match p.method {
            ScoringMethod::Auto => Formulation {
                method: self.method,
                examples: self.examples,
                orders: self.orders,
            },
            method => Formulation {
                method,
                examples: p.choice_examples,
                orders: p.choice_orders,
            },
        }
    }
}

/// A chat template: how a system line, a user turn and the start of the assistant's turn are written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChatTemplate {
    /// The system turn (`{content}`).
    pub system: String,
    /// The system line used when the prompt has none; empty: no system turn.
    pub default_system: String,
    /// A user turn (`{content}`).
    pub user: String,
    /// What precedes the assistant's reply.
    pub assistant: String,
}

impl ChatTemplate {
    /// One user turn under the default system line, ready for the assistant's first token.
    pub fn single_turn(&self, user: &str) -> String {
        let mut out = String::new();
        if !self.default_system.is_empty() {
            out.push_str(&render(
                &self.system,
                &[("content", self.default_system.as_str())],
            ));
        }
        out.push_str(&render(&self.user, &[("content", user)]));
        out.push_str(&self.assistant);
        out
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ProfileFile {
    profile: Vec<ModelProfile>,
}

/// The embedded profiles, in file order.
pub fn profiles() -> Result<Vec<ModelProfile>, ConfigError> {
    let file: ProfileFile = toml::from_str(PROFILES).map_err(|e| ConfigError::Parse {
        origin: "models/profiles.toml".into(),
        message: e.to_string(),
    })?;
    for p in &file.profile {
        if p.method == ScoringMethod::Auto {
            return Err(ConfigError::invalid(
                format!("profile {}.method", p.name),
                "a profile names a formulation, not auto",
            ));
        }
        if p.orders == 0 || p.orders > 10 || p.examples > 16 {
            return Err(ConfigError::invalid(
                format!("profile {}", p.name),
                "orders must be 1..=10 and examples at most 16",
            ));
        }
        template(&p.template)?;
    }
    Ok(file.profile)
}

/// The profile for a model: the one named by `forced` when it is not empty, else the first whose `match`
/// is part of the model's file name, else `default`.
pub fn profile_for(model: &str, forced: &str) -> Result<ModelProfile, ConfigError> {
    let all = profiles()?;
    if !forced.is_empty() {
        return all.into_iter().find(|p| p.name == forced).ok_or_else(|| {
            ConfigError::invalid("reranker.profile", format!("no profile `{forced}`"))
        });
    }
    let file = std::path::Path::new(model).file_name().map_or_else(
        || model.to_lowercase(),
        |f| f.to_string_lossy().to_lowercase(),
    );
    let hit = all
        .iter()
        .find(|p| p.matches.iter().any(|m| file.contains(m.as_str())))
        .or_else(|| all.iter().find(|p| p.name == "default"))
        .cloned();
    hit.ok_or_else(|| ConfigError::invalid("models/profiles.toml", "no `default` profile"))
}

/// A chat template by name.
pub fn template(name: &str) -> Result<ChatTemplate, ConfigError> {
    let Some((_, text)) = TEMPLATES.iter().find(|(n, _)| *n == name) else {
        let known: Vec<&str> = TEMPLATES.iter().map(|(n, _)| *n).collect();
        return Err(ConfigError::invalid(
            "template",
            format!("no chat template `{name}` (known: {})", known.join(", ")),
        ));
    };
    toml::from_str(text).map_err(|e| ConfigError::Parse {
        origin: format!("models/{name}.toml"),
        message: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profiles_parse_and_match_file_names() {
        assert!(profiles().unwrap().len() >= 3);
        let q = profile_for(
            "models/qwen2.5-coder-0.5b-instruct/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            "",
        )
        .unwrap();
        assert_eq!(
            (q.name.as_str(), q.method),
            ("qwen2.5", ScoringMethod::Channel)
        );
        let s = profile_for("models/x/SmolLM2-135M-Instruct.Q4_1.gguf", "").unwrap();
        assert_eq!(s.method, ScoringMethod::Channel);
        assert_eq!(profile_for("my-own.gguf", "").unwrap().name, "default");
        assert_eq!(
            profile_for("my-own.gguf", "qwen2.5").unwrap().name,
            "qwen2.5"
        );
        let e = profile_for("x.gguf", "nope").unwrap_err().to_string();
        assert!(e.contains("reranker.profile") && e.contains("nope"), "{e}");
    }

    #[test]
    fn chatml_single_turn_is_what_the_model_was_trained_on() {
        let t = template("qwen2").unwrap();
        let s = t.single_turn("hi");
        assert!(s.starts_with("<|im_start|>system\nYou are Qwen"), "{s}");
        assert!(
            s.ends_with("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"),
            "{s}"
        );
        assert_eq!(template("plain").unwrap().single_turn("q"), "q\nAnswer:");
        assert!(template("nope").unwrap_err().to_string().contains("qwen2"));
    }
}
