//! `[brownout]`: the ladder the server steps down under overload.

use super::*;

/// `[brownout]`: the ladder the server steps down under overload (off by default).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BrownoutConfig {
    /// Step down under overload (`normal` → `rerank_only` → `tier0_only` → `shed`).
    pub enabled: bool,
    /// Pressure at which each step is entered from the one below (`rerank_only`, `tier0_only`, `shed`).
    pub enter: [f64; 3],
    /// Pressure below which each step is left for the one below (each below its `enter`).
    pub leave: [f64; 3],
    /// How long the pressure must stay at or above `enter` before the step goes up, ms.
    pub hold_ms: u64,
    /// How long it must stay below `leave` before the step comes down, ms.
    pub cool_ms: u64,
    /// The LLM's P95 service time that counts as pressure 1, ms.
    pub p95_limit_ms: u64,
}

impl Default for BrownoutConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            enter: [0.9, 1.2, 1.6],
            leave: [0.6, 0.9, 1.2],
            hold_ms: 2_000,
            cool_ms: 10_000,
            p95_limit_ms: 2_000,
        }
    }
}

impl BrownoutConfig {
    /// Checks the section.
    pub fn validate(&self, at: &str) -> Result<(), ConfigError> {
        let ok = (0..3).all(|k| {
            self.leave[k] > 0.0
                && self.leave[k] < self.enter[k]
                && (k == 0
                    || (self.enter[k] > self.enter[k - 1] && self.leave[k] > self.leave[k - 1]))
        });
        if !ok || self.enter.iter().chain(&self.leave).any(|v| !v.is_finite()) {
            return Err(ConfigError::invalid(
                format!("{at}.enter"),
                "enter and leave must rise step by step, each leave positive and below its enter",
            ));
        }
        if self.hold_ms > 600_000 || self.cool_ms > 600_000 || self.p95_limit_ms == 0 {
            return Err(ConfigError::invalid(
                format!("{at}.hold_ms"),
                "hold_ms and cool_ms at most 600000, p95_limit_ms positive",
            ));
        }
        Ok(())
    }
}
