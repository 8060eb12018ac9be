//! `[utilization]`: where the utilisation u comes from.

use super::*;

/// Where the utilisation u comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UtilizationSource {
    /// NVML when it initialises, else the workers' busy fraction.
    Auto,
    /// The GPU via NVML.
    Nvml,
    /// The reranker workers' measured busy fraction.
    Workers,
    /// `manual_utilization`, set by an operator.
    Manual,
    /// A PromQL query on the fleet's Prometheus (`[utilization]`), else the workers' busy fraction while the
    /// query fails or its value is stale.
    Prometheus,
}

/// The Prometheus utilisation source: a PromQL query returning one number in [0, 1], e.g.
/// `avg(DCGM_FI_DEV_GPU_UTIL)/100` (DCGM exporter), `sum(vllm:num_requests_running)/64` (vLLM, 64 = the
/// fleet's capacity), `avg(llamacpp:requests_processing)` (llama.cpp server with one slot).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct UtilizationConfig {
    /// Prometheus base URL (e.g. `http://prometheus:9090`); empty: no Prometheus source.
    pub prometheus_url: String,
    /// The PromQL query (one series or a scalar; values are clamped to [0, 1]).
    pub prometheus_query: String,
    /// How often the query is run, milliseconds.
    pub poll_ms: u64,
    /// Timeout of one query, milliseconds.
    pub timeout_ms: u64,
    /// A value older than this (the query failing since) no longer counts: the next source is used.
    pub stale_ms: u64,
}

impl Default for UtilizationConfig {
    fn default() -> Self {
        Self {
            prometheus_url: String::new(),
            prometheus_query: String::new(),
            poll_ms: 2_000,
            timeout_ms: 1_000,
            stale_ms: 10_000,
        }
    }
}

impl UtilizationConfig {
    /// Checks the section.
    pub fn validate(&self, at: &str) -> Result<(), ConfigError> {
        if !self.prometheus_url.is_empty() {
            if !self.prometheus_url.starts_with("http://")
                && !self.prometheus_url.starts_with("https://")
            {
                return Err(ConfigError::invalid(
                    format!("{at}.prometheus_url"),
                    "must be an http:// or https:// URL",
                ));
            }
            if self.prometheus_query.trim().is_empty() {
                return Err(ConfigError::invalid(
                    format!("{at}.prometheus_query"),
                    "must be a PromQL query when prometheus_url is set",
                ));
            }
        }
        if self.poll_ms < 100 || self.timeout_ms == 0 || self.stale_ms < self.poll_ms {
            return Err(ConfigError::invalid(
                format!("{at}.poll_ms"),
                "poll_ms >= 100, timeout_ms >= 1 and stale_ms >= poll_ms",
            ));
        }
        Ok(())
    }
}
