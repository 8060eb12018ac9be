//! `[responses]`: whether `POST /v1/responses` keeps what it answered, so that `previous_response_id` and
//! `GET /v1/responses/{id}` can find it. Off by default: tiergate keeps no request text unless told to
//! (OpenAI's API stores by default; here the operator decides).

use serde::{Deserialize, Serialize};

use crate::ConfigError;

/// The Responses API's store.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ResponsesConfig {
    /// Keep responses (their conversation and output) for `ttl_s`: in Redis under the policy store's key
    /// when `[policy_store] kind = "redis"` (every replica finds them), else in the SQLite file `path` (the
    /// `tiergate` binary; in-process servers keep them in memory).
    pub store: bool,
    /// The local file (`tiergate serve` without the Redis policy store).
    pub path: std::path::PathBuf,
    /// How long a stored response is kept, seconds.
    pub ttl_s: u64,
    /// The most responses kept in all (memory and SQLite; past it, the oldest of the tenant that holds the
    /// most goes first, so a tenant filling its share evicts no other's).
    pub max_entries: usize,
    /// The most responses one tenant keeps (every backend, Redis included; its own oldest go first).
    pub max_per_tenant: usize,
}

impl Default for ResponsesConfig {
    fn default() -> Self {
        Self {
            store: false,
            path: std::path::PathBuf::from("data/responses.sqlite"),
            ttl_s: 3600,
            max_entries: 10_000,
            max_per_tenant: 1_000,
        }
    }
}

impl ResponsesConfig {
    /// Checks the section; errors name the field.
    pub fn validate(&self, at: &str) -> Result<(), ConfigError> {
        if self.ttl_s == 0 {
            return Err(ConfigError::invalid(
                format!("{at}.ttl_s"),
                "must be at least 1",
            ));
        }
        if self.max_entries == 0 {
            return Err(ConfigError::invalid(
                format!("{at}.max_entries"),
                "must be at least 1",
            ));
        }
        if self.max_per_tenant == 0 || self.max_per_tenant > self.max_entries {
            return Err(ConfigError::invalid(
                format!("{at}.max_per_tenant"),
                "must be at least 1 and at most max_entries",
            ));
        }
        Ok(())
    }
}
