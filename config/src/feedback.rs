//! `[feedback]`: the decision behind every answer, kept for a window so that clients' feedback and labelled
//! audits can be joined to it (`POST /v1/feedback`, `/admin/audits`): in a local SQLite file, or in Redis
//! when the policy store is Redis (every replica then joins feedback that reaches any of them).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::ConfigError;

/// The decision records and audits.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FeedbackConfig {
    /// Keep decision records and take feedback (off: `/v1/feedback` and `/admin/audits` answer 404).
    pub enabled: bool,
    /// How long a decision stays joinable, seconds (7 days by default).
    pub window_s: u64,
    /// Largest size of the kept records together, bytes: past it the tenants holding the most give way, their
    /// oldest first (SQLite and memory; in Redis `max_per_tenant`, the window's TTL and Redis's own `maxmemory`
    /// bound them).
    pub max_bytes: u64,
    /// The most decision records one tenant keeps (its oldest go first), in every backend.
    pub max_per_tenant: usize,
    /// The SQLite file (used when the policy store is not Redis).
    pub path: PathBuf,
    /// Records waiting for the background writer at most; beyond, a record is dropped and counted (the
    /// response never waits for a write).
    pub queue: usize,
    /// Also score each audited item with this replica's first-stage LLM, in the background and only while a
    /// worker slot would stay free for escalations (shed first, never delaying a response); reported as
    /// agreement between the LLM and Tier-0 — a proxy, not accuracy.
    pub audit_llm: bool,
}

impl Default for FeedbackConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            window_s: 7 * 24 * 3600,
            max_bytes: 256 << 20,
            max_per_tenant: 250_000,
            path: PathBuf::from("data/feedback.sqlite"),
            queue: 10_000,
            audit_llm: false,
        }
    }
}

impl FeedbackConfig {
    /// Checks the section; errors name the field.
    pub fn validate(&self, at: &str) -> Result<(), ConfigError> {
        if self.window_s == 0 {
            return Err(ConfigError::invalid(
                format!("{at}.window_s"),
                "must be at least 1",
            ));
        }
        if self.max_bytes < 1 << 16 {
            return Err(ConfigError::invalid(
                format!("{at}.max_bytes"),
                "must be at least 65536",
            ));
        }
        if self.max_per_tenant == 0 {
            return Err(ConfigError::invalid(
                format!("{at}.max_per_tenant"),
                "must be at least 1",
            ));
        }
        if self.queue == 0 {
            return Err(ConfigError::invalid(
                format!("{at}.queue"),
                "must be at least 1",
            ));
        }
        if self.enabled && self.path.as_os_str().is_empty() {
            return Err(ConfigError::invalid(format!("{at}.path"), "must be set"));
        }
        Ok(())
    }
}

/// Whether a tenant's feedback may move the policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum FeedbackTrust {
    /// Recorded and reported, never used for the bound (the default).
    #[default]
    Untrusted,
    /// Recorded, reported, and counted as evidence.
    Trusted,
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)] // test code: failing loudly is the point

    use super::*;

    /// A change that makes the section invalid.
    type Bad = fn(&mut FeedbackConfig);

    fn field(c: &FeedbackConfig) -> Option<String> {
        match c.validate("feedback") {
            Ok(()) => None,
            Err(ConfigError::Invalid { field, .. }) => Some(field),
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn every_bad_value_is_refused_naming_its_field() {
        assert_eq!(field(&FeedbackConfig::default()), None);
        let cases: [(Bad, &str); 4] = [
            (|c| c.window_s = 0, "feedback.window_s"),
            (|c| c.max_bytes = (1 << 16) - 1, "feedback.max_bytes"),
            (|c| c.queue = 0, "feedback.queue"),
            (|c| c.path = PathBuf::new(), "feedback.path"),
        ];
        for (bad, name) in cases {
            let mut c = FeedbackConfig::default();
            bad(&mut c);
            assert_eq!(field(&c).as_deref(), Some(name), "{c:?}");
        }
        // Switched off, it needs no file; the edges of each range are allowed.
        let off = FeedbackConfig {
            enabled: false,
            path: PathBuf::new(),
            window_s: 1,
            max_bytes: 1 << 16,
            queue: 1,
            ..FeedbackConfig::default()
        };
        assert_eq!(field(&off), None);
    }
}
