//! Rendering the route's prompt templates for one rerank (the text is config, see `tiergate_config`).

use tiergate_config::{display_label, render, PromptConfig};
use tiergate_queue::Candidate;

/// Channel scoring: the text a candidate's score is conditioned on (its label and examples).
pub fn channel_prefix(c: &Candidate, p: &PromptConfig) -> String {
    let examples: String = c
        .examples
        .iter()
        .map(|e| e.trim())
        .filter(|e| !e.is_empty())
        .take(p.max_examples)
        .map(|e| render(&p.example_line, &[("example", e)]))
        .collect();
    let label = display_label(&c.label);
    render(
        &p.label_prefix,
        &[
            ("label", &label),
            ("examples", &examples),
            ("reply", c.description.as_deref().unwrap_or("")),
        ],
    )
}

/// Channel scoring: the scored text.
pub fn channel_query(text: &str, p: &PromptConfig) -> String {
    render(&p.query, &[("query", text.trim())])
}

/// Likelihood scoring: the shared prompt.
pub fn likelihood_prompt(text: &str, p: &PromptConfig) -> String {
    render(&p.likelihood_prompt, &[("query", text.trim())])
}

/// Likelihood scoring: a candidate's scored text.
pub fn likelihood_candidate(c: &Candidate, p: &PromptConfig) -> String {
    let label = display_label(&c.label);
    render(
        &p.likelihood_candidate,
        &[
            ("label", &label),
            ("reply", c.description.as_deref().unwrap_or("")),
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channel_prefix_shows_label_and_bounded_examples() {
        let p = PromptConfig {
            max_examples: 2,
            ..PromptConfig::default()
        };
        let c = Candidate {
            label: "card_arrival".into(),
            description: None,
            examples: vec!["a".into(), " ".into(), "b".into(), "c".into()],
            p: 0.5,
        };
        assert_eq!(
            channel_prefix(&c, &p),
            "Messages about card arrival:\n- a\n- b\n-"
        );
        assert_eq!(channel_query(" hi ", &p), " hi\n");
    }
}
