//! `[cache]`: Tier −1, the answer cache in front of the LLM tier (off by default). A rerank verdict is cached
//! under a fingerprint of everything that makes it valid and found again by the same text (exact) or, inside
//! Tier-0's top-label bucket, by a near query the guards let through (semantic).

use serde::{Deserialize, Serialize};

use crate::ConfigError;

/// Where exact entries live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum CacheKind {
    /// In this process only.
    #[default]
    Memory,
    /// Also in Redis, shared by every replica on it (the semantic index stays in each replica: Debian's Redis
    /// has no vector search).
    Redis,
}

/// The cache.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CacheConfig {
    /// Look verdicts up before the LLM and store the LLM's.
    pub enabled: bool,
    /// `memory` or `redis`.
    pub kind: CacheKind,
    /// Bytes the in-process store holds at most (keys, verdicts, embeddings); least recently used first out.
    pub max_bytes: u64,
    /// A verdict is served this long after it was computed, seconds (also the Redis keys' expiry).
    pub ttl_s: u64,
    /// Semantic hits (near queries in Tier-0's top-label bucket); off: exact hits only.
    pub semantic: bool,
    /// A semantic hit's cosine on the Tier-0 embedding, at least.
    pub tau: f32,
    /// Entries per semantic bucket (fingerprint × Tier-0 top label) at most: a lookup scans one bucket. 256
    /// keeps a full scan's p99 under 50 µs on AVX2 (`cargo run -p tiergate-cache --example lookup`).
    pub bucket_cap: usize,
    /// The guards' word lists (TOML); unset: the embedded English lists (`cache/guards-en.toml`).
    pub guards: Option<std::path::PathBuf>,
    /// `redis`: e.g. `redis://127.0.0.1:6379/0`.
    pub url: String,
    /// `redis`: the key prefix of every entry.
    pub namespace: String,
    /// `redis`: the longest a lookup or a write waits for Redis, milliseconds (then it is a miss: the cache
    /// fails open).
    pub redis_timeout_ms: u64,
}

impl Default for CacheConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            kind: CacheKind::Memory,
            max_bytes: 64 << 20,
            ttl_s: 3600,
            semantic: true,
            tau: 0.94,
            bucket_cap: 256,
            guards: None,
            url: "redis://127.0.0.1:6379/0".into(),
            namespace: "tiergate:cache".into(),
            redis_timeout_ms: 50,
        }
    }
}

impl CacheConfig {
    /// Checks the section; errors name the field.
    pub fn validate(&self, at: &str) -> Result<(), ConfigError> {
        let bad = |f: &str, why: &str| Err(ConfigError::invalid(format!("{at}.{f}"), why));
        if self.max_bytes < 4096 {
            return bad("max_bytes", "must be at least 4096");
        }
        if self.ttl_s == 0 {
            return bad("ttl_s", "must be at least 1");
        }
        if !(self.tau.is_finite() && self.tau > 0.0 && self.tau <= 1.0) {
            return bad("tau", "must be in (0, 1]");
        }
        if self.bucket_cap == 0 || self.bucket_cap > 100_000 {
            return bad("bucket_cap", "must be in [1, 100000]");
        }
        if self.kind == CacheKind::Redis {
            if self.url.is_empty() {
                return bad("url", "`redis` needs a url");
            }
            if self.namespace.is_empty() {
                return bad("namespace", "`redis` needs a key prefix");
            }
            if self.redis_timeout_ms == 0 {
                return bad("redis_timeout_ms", "must be at least 1");
            }
        }
        Ok(())
    }
}
