//! `[[experiments]]`: latency-injection A/B tests. A share of a route's traffic (chosen by a stable hash of
//! the request's `user`) gets an extra delay drawn from a distribution, to measure what latency costs before
//! paying for it. Off by default: no experiment, no delay, on no route the experiment does not name.

use serde::{Deserialize, Serialize};

use crate::ConfigError;

/// The longest delay an experiment may add, milliseconds.
pub const MAX_DELAY_MS: u64 = 60_000;

/// One experiment (a variant: the rest of its routes' traffic is `control`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExperimentConfig {
    /// The variant's name (in `x-tiergate-variant` and the metrics); `[a-z0-9_-]`, not `control`.
    pub name: String,
    /// The share of its routes' traffic assigned to it, in (0, 1]; the shares of all experiments add up to
    /// at most 1 (each gets its own slice of the hash space, in order).
    pub share: f64,
    /// The delay added to each of its requests.
    pub delay: DelayConfig,
    /// The routes it runs on (by name; at least one, each a configured route).
    pub routes: Vec<String>,
}

/// A delay distribution.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "dist", rename_all = "snake_case")]
pub enum DelayConfig {
    /// Always `ms`.
    Fixed {
        /// The delay.
        ms: u64,
    },
    /// Uniform in [`min_ms`, `max_ms`].
    Uniform {
        /// Lower bound.
        min_ms: u64,
        /// Upper bound.
        max_ms: u64,
    },
    /// Exponential with mean `mean_ms`, cut at `max_ms`.
    Exponential {
        /// The mean before the cut.
        mean_ms: f64,
        /// The cut.
        max_ms: u64,
    },
}

impl DelayConfig {
    /// The most this distribution can add.
    pub fn max_ms(&self) -> u64 {
        match *self {
            Self::Fixed { ms } => ms,
            Self::Uniform { max_ms, .. } | Self::Exponential { max_ms, .. } => max_ms,
        }
    }
}

/// Checks a list of experiments against the configured route names; errors name the field.
pub fn validate_experiments(
    list: &[ExperimentConfig],
    routes: &[&str],
    at: &str,
) -> Result<(), ConfigError> {
    let mut total = 0.0;
    let mut names = std::collections::HashSet::new();
    for (i, e) in list.iter().enumerate() {
        let field = |f: &str| format!("{at}[{i}].{f}");
        let valid_name = !e.name.is_empty()
            && e.name.len() <= 32
            && e.name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-');
        if !valid_name || e.name == "control" || !names.insert(e.name.as_str()) {
            return Err(ConfigError::invalid(
                field("name"),
                "must be 1–32 characters of a-z, 0-9, _ or -, unique, and not `control`",
            ));
        }
        if !(e.share > 0.0 && e.share <= 1.0) {
            return Err(ConfigError::invalid(field("share"), "must be in (0, 1]"));
        }
        total += e.share;
        if e.routes.is_empty() {
            return Err(ConfigError::invalid(
                field("routes"),
                "must name at least one route: an experiment never runs on a route it does not name",
            ));
        }
        if let Some(r) = e.routes.iter().find(|r| !routes.contains(&r.as_str())) {
            return Err(ConfigError::invalid(
                field("routes"),
                format!("`{r}` is not a configured route ({})", routes.join(", ")),
            ));
        }
        let ok = match e.delay {
            DelayConfig::Fixed { .. } => true,
            DelayConfig::Uniform { min_ms, max_ms } => min_ms <= max_ms,
            DelayConfig::Exponential { mean_ms, max_ms } => {
                mean_ms.is_finite() && mean_ms > 0.0 && (max_ms as f64) >= mean_ms
            }
        };
        if !ok || e.delay.max_ms() > MAX_DELAY_MS {
            return Err(ConfigError::invalid(
                field("delay"),
                format!(
                    "needs min_ms ≤ max_ms (uniform), 0 < mean_ms ≤ max_ms (exponential), and at most \
                     {MAX_DELAY_MS} ms"
                ),
            ));
        }
    }
    if total > 1.0 + 1e-9 {
        return Err(ConfigError::invalid(
            at.to_string(),
            format!("the shares add up to {total}: at most 1"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exp(name: &str, share: f64, delay: DelayConfig, routes: &[&str]) -> ExperimentConfig {
        ExperimentConfig {
            name: name.into(),
            share,
            delay,
            routes: routes.iter().map(|r| r.to_string()).collect(),
        }
    }

    #[test]
    fn parses_from_toml_and_validates() {
        #[derive(Deserialize)]
        struct F {
            experiments: Vec<ExperimentConfig>,
        }
        let f: F = toml::from_str(
            r#"
            [[experiments]]
            name = "slow-300-800"
            share = 0.2
            delay = { dist = "uniform", min_ms = 300, max_ms = 800 }
            routes = ["classify"]
            [[experiments]]
            name = "fixed-1s"
            share = 0.1
            delay = { dist = "fixed", ms = 1000 }
            routes = ["classify", "answer"]
            "#,
        )
        .unwrap();
        assert_eq!(
            f.experiments[0].delay,
            DelayConfig::Uniform {
                min_ms: 300,
                max_ms: 800
            }
        );
        validate_experiments(&f.experiments, &["classify", "answer"], "experiments").unwrap();
    }

    #[test]
    fn refusals_name_the_field() {
        let u = DelayConfig::Uniform {
            min_ms: 10,
            max_ms: 20,
        };
        let err = |l: Vec<ExperimentConfig>| {
            validate_experiments(&l, &["classify"], "experiments")
                .unwrap_err()
                .to_string()
        };
        assert!(err(vec![exp("a", 0.0, u.clone(), &["classify"])]).contains("experiments[0].share"));
        assert!(err(vec![exp("control", 0.1, u.clone(), &["classify"])]).contains(".name"));
        assert!(err(vec![exp("Bad Name", 0.1, u.clone(), &["classify"])]).contains(".name"));
        assert!(err(vec![exp("a", 0.1, u.clone(), &[])]).contains(".routes"));
        assert!(err(vec![exp("a", 0.1, u.clone(), &["generate"])]).contains("not a configured"));
        assert!(err(vec![
            exp("a", 0.6, u.clone(), &["classify"]),
            exp("b", 0.6, u.clone(), &["classify"])
        ])
        .contains("add up to"));
        assert!(err(vec![
            exp("a", 0.1, u.clone(), &["classify"]),
            exp("a", 0.1, u.clone(), &["classify"])
        ])
        .contains("unique"));
        let wide = DelayConfig::Uniform {
            min_ms: 30,
            max_ms: 20,
        };
        assert!(err(vec![exp("a", 0.1, wide, &["classify"])]).contains(".delay"));
        let long = DelayConfig::Fixed { ms: 60_001 };
        assert!(err(vec![exp("a", 0.1, long, &["classify"])]).contains(".delay"));
    }
}
