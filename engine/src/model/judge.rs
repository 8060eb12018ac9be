//! The judge as the server describes it: the formulation the worker scores with for a route's templates, whether
//! its candidates' examples are ranked per query, what it is shown of each candidate, and its name in reports
//! and `fusion.json`.

use crate::model::out_of_scope::{OutOfScopeRoute, NONE};
use tiergate_config::{EngineKind, PromptConfig, RerankerConfig, ScoringMethod};
use tiergate_queue::Candidate;

/// The formulation the worker will use for these templates and the examples per candidate it shows
/// (under `method = "auto"`, what the model's profile says; the remote engine always asks its choice question).
pub(crate) fn formulation(r: &RerankerConfig, prompts: &PromptConfig) -> (ScoringMethod, usize) {
    let Ok(profile) = tiergate_config::profile_for(&r.model.to_string_lossy(), &r.profile) else {
        return (prompts.method, prompts.choice_examples);
    };
    let f = profile.resolve(prompts);
    if r.engine == EngineKind::Openai && prompts.method == ScoringMethod::Auto {
        (ScoringMethod::Choice, f.examples)
    } else {
        (f.method, f.examples)
    }
}

/// Whether candidates' examples should be ranked by nearness to the query: the choice formulation shows
/// a few per candidate, and they may differ per query (the channel form's fixed examples are its cache key).
pub fn grounded(r: &RerankerConfig, prompts: &PromptConfig) -> bool {
    matches!(formulation(r, prompts), (ScoringMethod::Choice, k) if k > 0)
}

/// The LLM's name for reports and `fusion.json`: the model file and the formulation it scores with (under
/// `method = "auto"`, the one its profile picks), e.g. `qwen2.5-coder-0.5b-instruct-q4_k_m.gguf (choice)`.
pub fn llm_name(r: &RerankerConfig, prompts: &PromptConfig) -> String {
    let model = if r.engine == EngineKind::Stub {
        "stub".to_string()
    } else {
        r.model
            .file_name()
            .map_or_else(|| "llm".into(), |f| f.to_string_lossy().into_owned())
    };
    let (method, examples) = formulation(r, prompts);
    let grounding = if method == ScoringMethod::Choice && examples > 0 {
        format!(", {examples} nearest examples")
    } else {
        String::new()
    };
    format!("{model} ({}{grounding})", method.name()).to_lowercase()
}

/// Tier-0's top candidates `(label index, p)` as the judge sees them: the label, its reply text, its
/// description (`descriptions`, where the head has one), and its examples (`examples(label)`: nearest the query first for a grounded route); the index
/// [`NONE`] is the route's "none of these" (`oos`), with its reply — the one way serving and `tiergate eval
/// --hybrid` / `fit-fusion` build them.
pub fn candidates(
    top: &[(usize, f32)],
    labels: &[String],
    replies: &[Option<String>],
    descriptions: &[Option<String>],
    examples: impl Fn(usize) -> Vec<String>,
    oos: Option<&OutOfScopeRoute>,
) -> Vec<Candidate> {
    top.iter()
        .filter_map(|&(i, p)| match (labels.get(i), oos) {
            (Some(label), _) => Some(Candidate {
                label: label.clone(),
                reply: replies.get(i).cloned().flatten(),
                description: descriptions.get(i).cloned().flatten(),
                examples: examples(i),
                p,
            }),
            (None, Some(o)) if i == NONE => Some(Candidate {
                label: o.none_candidate.clone(),
                reply: o.reply.clone(),
                description: None,
                examples: Vec::new(),
                p,
            }),
            _ => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_carry_each_labels_reply_description_and_examples() {
        let labels = ["a".to_string(), "b".to_string()];
        let replies = [Some("reply a".to_string()), None];
        let descriptions = [None, Some("what b means".to_string())];
        let c = candidates(
            &[(1, 0.6), (0, 0.3), (7, 0.1)],
            &labels,
            &replies,
            &descriptions,
            |i| vec![format!("example {i}")],
            None,
        );
        assert_eq!(
            c.len(),
            2,
            "an index past the labels without `oos` is dropped"
        );
        assert_eq!(
            (
                c[0].label.as_str(),
                c[0].reply.as_deref(),
                c[0].description.as_deref()
            ),
            ("b", None, Some("what b means"))
        );
        assert_eq!(
            (
                c[1].label.as_str(),
                c[1].reply.as_deref(),
                c[1].description.as_deref()
            ),
            ("a", Some("reply a"), None)
        );
        assert_eq!(c[1].examples, ["example 0"]);
        assert!((c[0].p - 0.6).abs() < 1e-6);
    }
}
