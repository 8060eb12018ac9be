//! The [`Fusion`] in force for a route's stage, and where its values come from: the head's fit when it was
//! made with this LLM at this place in the cascade, else the backend's configured values. The fusion itself
//! (one step of the cascade, the go-on rule) is `tiergate_core::fusion`, shared with the offline fit in
//! `tiergate-train`.

use tiergate_config::{PromptConfig, RerankerConfig};
use tiergate_prefilter::heads::FittedFusion;

/// The fusion in force for a route, and where it comes from.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub(crate) struct Fusion {
    /// Weight of the LLM's distribution.
    pub llm_weight: f32,
    /// Temperature of the LLM's scores.
    pub llm_temperature: f32,
    /// `fitted` (the head's `fusion.json`) or `config` (`reranker.llm_weight` / `llm_temperature`).
    pub source: &'static str,
    /// The fit, when there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fit: Option<FittedFusion>,
}

impl Fusion {
    /// The fusion of a stage whose backend is `backend`: `fit` (the head's `fusion.json` for the first stage,
    /// its `fusion.STAGE.json` after) when it was fitted with this LLM after the same stages `after`, else the
    /// backend's configured values (a fit made with another judge says nothing about this one).
    pub(crate) fn resolve(
        backend: &RerankerConfig,
        prompts: &PromptConfig,
        fit: Option<&FittedFusion>,
        after: &[String],
    ) -> Self {
        let running = crate::model::judge::llm_name(backend, prompts);
        match tiergate_prefilter::heads::fit_for(fit, &running, after) {
            Some(f) => Self {
                llm_weight: f.llm_weight,
                llm_temperature: f.llm_temperature,
                source: "fitted",
                fit: Some(f.clone()),
            },
            None => Self {
                llm_weight: backend.llm_weight,
                llm_temperature: backend.llm_temperature,
                source: "config",
                fit: None,
            },
        }
    }

    /// Says at start which fit is in force for `route`, and when the fit found that the LLM adds no accuracy.
    pub(crate) fn log_for(&self, route: &str) {
        let Some(fit) = &self.fit else { return };
        if fit.llm_weight == 0.0 || fit.fused_accuracy <= fit.tier0_accuracy {
            tracing::warn!(
                route,
                llm = %fit.llm,
                rows = fit.rows,
                tier0_accuracy = fit.tier0_accuracy,
                "escalation adds no accuracy with this LLM on the dev split; θ = 1 recommended"
            );
        } else {
            tracing::info!(
                route,
                llm_weight = fit.llm_weight,
                llm_temperature = fit.llm_temperature,
                tier0_accuracy = fit.tier0_accuracy,
                fused_accuracy = fit.fused_accuracy,
                "fitted fusion in force"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fit is used only with its LLM after the same stages; otherwise the backend's values stand.
    #[test]
    fn a_fit_holds_for_its_llm_and_its_place_in_the_cascade() {
        let fit = FittedFusion {
            llm_weight: 0.4,
            llm_temperature: 2.0,
            llm: "stub (channel)".into(),
            rows: 10,
            tier0_accuracy: 0.5,
            fused_accuracy: 0.7,
            best_weight: 0.4,
            best_temperature: 2.0,
            rows_fixed: 3,
            rows_broken: 1,
            p_value: 0.3,
            chosen_on: None,
            after: vec!["small (channel)".into()],
            head: None,
        };
        let backend = RerankerConfig {
            engine: tiergate_config::EngineKind::Stub,
            llm_weight: 0.1,
            ..RerankerConfig::default()
        };
        let prompts = PromptConfig {
            method: tiergate_config::ScoringMethod::Channel,
            ..PromptConfig::default()
        };
        let after = ["small (channel)".to_string()];
        let f = Fusion::resolve(&backend, &prompts, Some(&fit), &after);
        assert_eq!((f.source, f.llm_weight), ("fitted", 0.4));
        // As a first stage, or after another stage: the backend's own value.
        let f = Fusion::resolve(&backend, &prompts, Some(&fit), &[]);
        assert_eq!((f.source, f.llm_weight), ("config", 0.1));
        let f = Fusion::resolve(&backend, &prompts, Some(&fit), &["other".to_string()]);
        assert_eq!(f.source, "config");
    }
}
