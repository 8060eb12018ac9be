//! `[[tenants]]`: who may use the public API, identified by the SHA-256 of their API key (never the key), what
//! each may use and how fast.

use serde::{Deserialize, Serialize};

use crate::ConfigError;

/// One tenant.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantConfig {
    /// Its name (metrics, logs, the admin API).
    pub name: String,
    /// The hex SHA-256 of its API key (`printf %s "$KEY" | sha256sum`).
    pub key_sha256: String,
    /// The routes (`model` names) it may use; all when unset.
    #[serde(default)]
    pub routes: Option<Vec<String>>,
    /// Requests per second it may send on average (a token bucket); unlimited when unset.
    #[serde(default)]
    pub rate_per_s: Option<f64>,
    /// Requests it may send at once above the rate (the bucket's size); `rate_per_s` rounded up when unset.
    #[serde(default)]
    pub burst: Option<f64>,
    /// LLM time it may use, in LLM-seconds per minute (the time its jobs hold a worker; a bucket of one
    /// minute's worth): over it, its escalations are answered by Tier-0 (`x-tiergate-degraded: budget`) and its
    /// generations get 429. Unlimited when unset.
    #[serde(default)]
    pub llm_seconds_per_min: Option<f64>,
    /// Its share of a contended LLM relative to the other tenants' weights (1 when unset).
    #[serde(default)]
    pub weight: Option<f64>,
    /// Batches it may have unfinished at once (validating, in progress, finalizing, cancelling); unlimited when unset.
    #[serde(default)]
    pub max_active_batches: Option<usize>,
    /// Bytes its stored files may take together; `[batch] max_total_bytes` alone when unset.
    #[serde(default)]
    pub max_stored_bytes: Option<u64>,
    /// `trusted`: its feedback counts as evidence about Tier-0's error; `untrusted` (default): recorded and
    /// reported apart, never used for the bound.
    #[serde(default)]
    pub feedback: crate::FeedbackTrust,
    /// The answer cache's verdicts it shares: tenants naming the same group read and write one set of cached
    /// verdicts (their questions answer each other's); unset, its own — no other tenant's question is ever
    /// its cache hit, nor its question another's.
    #[serde(default)]
    pub cache_group: Option<String>,
}

impl TenantConfig {
    /// Its fair-share weight.
    pub fn weight_in_force(&self) -> f64 {
        self.weight.unwrap_or(1.0)
    }

    /// The bucket size in force.
    pub fn burst_in_force(&self) -> Option<f64> {
        self.rate_per_s
            .map(|r| self.burst.unwrap_or_else(|| r.ceil().max(1.0)))
    }
}

/// Reads a keys file (`[[tenants]]` entries, the same fields as in the config) named by `tenants_file`.
pub fn load_tenants_file(path: &std::path::Path) -> Result<Vec<TenantConfig>, ConfigError> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct File {
        #[serde(default)]
        tenants: Vec<TenantConfig>,
    }
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let f: File = toml::from_str(&text).map_err(|e| ConfigError::Parse {
        origin: path.display().to_string(),
        message: e.to_string(),
    })?;
    Ok(f.tenants)
}

/// Checks the tenants: names and key digests unique and well-formed, known routes, positive rates.
pub fn validate_tenants(
    tenants: &[TenantConfig],
    routes: &[&str],
    at: &str,
) -> Result<(), ConfigError> {
    let mut names = std::collections::HashSet::new();
    let mut digests = std::collections::HashSet::new();
    for (i, t) in tenants.iter().enumerate() {
        let here = |field: &str| format!("{at}[{i}].{field}");
        if t.name.trim().is_empty() || !names.insert(t.name.as_str()) {
            return Err(ConfigError::invalid(
                here("name"),
                "must be non-empty and unique",
            ));
        }
        let hex = t.key_sha256.trim().to_ascii_lowercase();
        if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(ConfigError::invalid(
                here("key_sha256"),
                "must be the 64 hex digits of the key's SHA-256 (printf %s \"$KEY\" | sha256sum), never the key",
            ));
        }
        if !digests.insert(hex) {
            return Err(ConfigError::invalid(
                here("key_sha256"),
                "two tenants share one key",
            ));
        }
        if let Some(unknown) = t
            .routes
            .iter()
            .flatten()
            .find(|r| !routes.contains(&r.as_str()))
        {
            return Err(ConfigError::invalid(
                here("routes"),
                format!("`{unknown}` is not a route (routes: {})", routes.join(", ")),
            ));
        }
        let positive = |v: Option<f64>| v.is_none_or(|x| x.is_finite() && x > 0.0);
        if !positive(t.rate_per_s) || !positive(t.burst) {
            return Err(ConfigError::invalid(
                here("rate_per_s"),
                "rate_per_s and burst must be positive",
            ));
        }
        if !positive(t.llm_seconds_per_min) {
            return Err(ConfigError::invalid(
                here("llm_seconds_per_min"),
                "must be positive",
            ));
        }
        if t.weight.is_some_and(|w| !(0.01..=100.0).contains(&w)) {
            return Err(ConfigError::invalid(
                here("weight"),
                "must be in 0.01..=100",
            ));
        }
        if t.max_active_batches == Some(0) || t.max_stored_bytes == Some(0) {
            return Err(ConfigError::invalid(
                here("max_active_batches"),
                "batch quotas must be at least 1 (leave them unset for none)",
            ));
        }
        if t.burst.is_some() && t.rate_per_s.is_none() {
            return Err(ConfigError::invalid(
                here("burst"),
                "a burst needs a rate_per_s",
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tenant(name: &str, digest: &str) -> TenantConfig {
        TenantConfig {
            name: name.into(),
            key_sha256: digest.into(),
            ..TenantConfig::default()
        }
    }

    const D1: &str = "2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae";
    const D2: &str = "fcde2b2edba56bf408601fb721fe9b5c338d10ee429ea04fae5511b68fbf8fb9";

    #[test]
    fn tenants_are_checked_field_by_field() {
        let ok = [tenant("a", D1), tenant("b", D2)];
        assert!(validate_tenants(&ok, &["classify"], "tenants").is_ok());
        let e = |t: &[TenantConfig]| {
            validate_tenants(t, &["classify"], "tenants")
                .unwrap_err()
                .to_string()
        };
        assert!(e(&[tenant("a", D1), tenant("a", D2)]).contains("tenants[1].name"));
        assert!(e(&[tenant("a", "secret-key")]).contains("tenants[0].key_sha256"));
        assert!(e(&[tenant("a", D1), tenant("b", &D1.to_uppercase())]).contains("share one key"));
        let mut t = tenant("a", D1);
        t.routes = Some(vec!["generate".into()]);
        assert!(e(&[t]).contains("`generate` is not a route"));
        let mut t = tenant("a", D1);
        t.rate_per_s = Some(0.0);
        assert!(e(&[t]).contains("rate_per_s"));
        let mut t = tenant("a", D1);
        t.burst = Some(3.0);
        assert!(e(&[t]).contains("needs a rate_per_s"));
        let mut t = tenant("a", D1);
        t.rate_per_s = Some(2.5);
        assert_eq!(t.burst_in_force(), Some(3.0));
        let mut t = tenant("a", D1);
        t.weight = Some(0.0);
        assert!(e(&[t]).contains("tenants[0].weight"));
        let mut t = tenant("a", D1);
        t.llm_seconds_per_min = Some(-1.0);
        assert!(e(&[t]).contains("llm_seconds_per_min"));
        let mut t = tenant("a", D1);
        t.max_active_batches = Some(0);
        assert!(e(&[t]).contains("max_active_batches"));
    }
}
