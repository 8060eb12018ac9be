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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic)] // test code: failing loudly is the point

    use super::*;

    /// A change that makes the section invalid.
    type Bad = fn(&mut CacheConfig);

    fn field(c: &CacheConfig) -> Option<String> {
        match c.validate("cache") {
            Ok(()) => None,
            Err(ConfigError::Invalid { field, .. }) => Some(field),
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn every_bad_value_is_refused_naming_its_field() {
        assert_eq!(field(&CacheConfig::default()), None);
        let cases: [(Bad, &str); 9] = [
            (|c| c.max_bytes = 4095, "cache.max_bytes"),
            (|c| c.ttl_s = 0, "cache.ttl_s"),
            (|c| c.tau = 0.0, "cache.tau"),
            (|c| c.tau = 1.01, "cache.tau"),
            (|c| c.tau = f32::NAN, "cache.tau"),
            (|c| c.bucket_cap = 0, "cache.bucket_cap"),
            (|c| c.bucket_cap = 100_001, "cache.bucket_cap"),
            (
                |c| (c.kind, c.url) = (CacheKind::Redis, String::new()),
                "cache.url",
            ),
            (
                |c| (c.kind, c.namespace) = (CacheKind::Redis, String::new()),
                "cache.namespace",
            ),
        ];
        for (bad, name) in cases {
            let mut c = CacheConfig::default();
            bad(&mut c);
            assert_eq!(field(&c).as_deref(), Some(name), "{c:?}");
        }
        let mut c = CacheConfig {
            kind: CacheKind::Redis,
            redis_timeout_ms: 0,
            ..CacheConfig::default()
        };
        assert_eq!(field(&c).as_deref(), Some("cache.redis_timeout_ms"));
        // The Redis fields matter only for `redis`; the edges of each range are allowed.
        (c.kind, c.url, c.namespace) = (CacheKind::Memory, String::new(), String::new());
        (c.max_bytes, c.ttl_s, c.tau, c.bucket_cap) = (4096, 1, 1.0, 100_000);
        assert_eq!(field(&c), None);
    }
}
