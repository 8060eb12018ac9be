//! `[heads]`: a head promoted live (`POST /admin/heads/{route}`) runs in shadow beside the one in force and is
//! promoted only if these checks pass.

use serde::{Deserialize, Serialize};

use crate::ConfigError;

/// The shadow and its checks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HeadsConfig {
    /// Live Tier-0 requests the candidate classifies in shadow before it is judged.
    pub shadow_requests: usize,
    /// Held-out accuracy it may lose against the head in force (0.01: one point).
    pub max_accuracy_drop: f64,
    /// Share of the shadowed requests it may escalate beyond the head in force's share (0.02: two points).
    pub max_escalated_increase: f64,
    /// Its forward's p50 against the head in force's on the same requests, at most (1.2: within 20%).
    pub max_p50_ratio: f64,
    /// A shadow that has not seen `shadow_requests` requests by then is abandoned, seconds.
    pub shadow_timeout_s: u64,
}

impl Default for HeadsConfig {
    fn default() -> Self {
        Self {
            shadow_requests: 200,
            max_accuracy_drop: 0.01,
            max_escalated_increase: 0.02,
            max_p50_ratio: 1.2,
            shadow_timeout_s: 600,
        }
    }
}

impl HeadsConfig {
    /// Checks the section; errors name the field.
    pub fn validate(&self, at: &str) -> Result<(), ConfigError> {
        if self.shadow_requests == 0 {
            return Err(ConfigError::invalid(
                format!("{at}.shadow_requests"),
                "must be at least 1",
            ));
        }
        for (name, v) in [
            ("max_accuracy_drop", self.max_accuracy_drop),
            ("max_escalated_increase", self.max_escalated_increase),
        ] {
            if !(0.0..=1.0).contains(&v) {
                return Err(ConfigError::invalid(
                    format!("{at}.{name}"),
                    "must be in [0, 1]",
                ));
            }
        }
        if !(self.max_p50_ratio.is_finite() && self.max_p50_ratio >= 1.0) {
            return Err(ConfigError::invalid(
                format!("{at}.max_p50_ratio"),
                "must be at least 1",
            ));
        }
        if self.shadow_timeout_s == 0 {
            return Err(ConfigError::invalid(
                format!("{at}.shadow_timeout_s"),
                "must be at least 1",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)] // test code: failing loudly is the point

    use super::*;

    /// A change that makes the section invalid.
    type Bad = fn(&mut HeadsConfig);

    fn field(c: &HeadsConfig) -> Option<String> {
        match c.validate("heads") {
            Ok(()) => None,
            Err(ConfigError::Invalid { field, .. }) => Some(field),
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn every_bad_value_is_refused_naming_its_field() {
        assert_eq!(field(&HeadsConfig::default()), None);
        let cases: [(Bad, &str); 8] = [
            (|c| c.shadow_requests = 0, "heads.shadow_requests"),
            (|c| c.max_accuracy_drop = -0.01, "heads.max_accuracy_drop"),
            (
                |c| c.max_accuracy_drop = f64::NAN,
                "heads.max_accuracy_drop",
            ),
            (
                |c| c.max_escalated_increase = 1.5,
                "heads.max_escalated_increase",
            ),
            (|c| c.max_p50_ratio = 0.99, "heads.max_p50_ratio"),
            (|c| c.max_p50_ratio = f64::INFINITY, "heads.max_p50_ratio"),
            (|c| c.shadow_timeout_s = 0, "heads.shadow_timeout_s"),
            (
                |c| c.max_escalated_increase = -1.0,
                "heads.max_escalated_increase",
            ),
        ];
        for (bad, name) in cases {
            let mut c = HeadsConfig::default();
            bad(&mut c);
            assert_eq!(field(&c).as_deref(), Some(name), "{c:?}");
        }
        let edges = HeadsConfig {
            shadow_requests: 1,
            max_accuracy_drop: 1.0,
            max_escalated_increase: 0.0,
            max_p50_ratio: 1.0,
            shadow_timeout_s: 1,
        };
        assert_eq!(field(&edges), None);
    }
}
