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
                Ok(())
            }
            StoreKind::Redis => Err(ConfigError::invalid(
                format!("{at}.url"),
                "must be a redis:// URL",
            )),
        }
    }
}
