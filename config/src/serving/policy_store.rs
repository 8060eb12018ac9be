//! `[policy_store]`: where the routing policy lives (this process, or Redis shared by replicas).

use super::*;

/// Where the routing policy lives: in this process (`memory`, the default), or in Redis, shared by every
/// replica that names the same `url` and `key` (changes through any replica reach all of them).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PolicyStoreConfig {
    /// `memory` or `redis`.
    pub kind: StoreKind,
    /// `redis`: e.g. `redis://127.0.0.1:6379/0`.
    pub url: String,
    /// `redis`: the key prefix (`{key}` holds the policy and its version, `{key}:audit` the audit log,
    /// `{key}:changes` is the channel changes are published on).
    pub key: String,
    /// `redis`: how often a replica reads the shared policy, milliseconds.
    pub sync_ms: u64,
    /// `redis`: how long a call on a request's path may wait for Redis (a session pin, a stored response, a
    /// ledger read), milliseconds; a late call is a failure, opens the dependency's breaker and the request is
    /// served from local state. Background calls (the syncs) get ten times as long.
    pub timeout_ms: u64,
}

/// The policy store's kind (`policy_store.kind`; any other value is refused when the config is read).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreKind {
    Memory,
    Redis,
}

impl Default for PolicyStoreConfig {
    fn default() -> Self {
        Self {
            kind: StoreKind::Memory,
            url: String::new(),
            key: "tiergate:policy".into(),
            sync_ms: 500,
            timeout_ms: 100,
        }
    }
}

impl PolicyStoreConfig {
    /// Checks the section.
    pub fn validate(&self, at: &str) -> Result<(), ConfigError> {
        match self.kind {
            StoreKind::Memory => Ok(()),
            StoreKind::Redis
                if self.url.starts_with("redis://") || self.url.starts_with("rediss://") =>
            {
                if self.key.trim().is_empty() || !(50..=2_000).contains(&self.sync_ms) {
                    return Err(ConfigError::invalid(
                        format!("{at}.key"),
                        "a non-empty key and sync_ms in 50..=2000 (changes must reach every replica within 2 s)",
                    ));
                }
                if !(5..=5_000).contains(&self.timeout_ms) {
                    return Err(ConfigError::invalid(
                        format!("{at}.timeout_ms"),
                        "must be in 5..=5000 (a request waits at most this long for Redis)",
                    ));
                }
                Ok(())
            }
            StoreKind::Redis => Err(ConfigError::invalid(
                format!("{at}.url"),
                "must be a redis:// URL",
            )),
        }
    }
}
