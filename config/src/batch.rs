//! `[batch]`: the OpenAI Batch API (`/v1/files`, `/v1/batches`): Tier-4 work run in the background, its
//! state in an embedded database under `data_dir`, surviving restarts.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::ConfigError;

/// The batch store and runner.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BatchConfig {
    /// Serve the Batch API (off: `/v1/files` and `/v1/batches` answer 404).
    pub enabled: bool,
    /// Where the database and the files live (one server per directory: a second one finds it locked and
    /// serves no batches).
    pub data_dir: PathBuf,
    /// Largest uploaded file, bytes.
    pub max_file_bytes: u64,
    /// All stored files together, bytes (uploads beyond are refused).
    pub max_total_bytes: u64,
    /// A tenant's stored files together, bytes, unless its `[[tenants]] max_stored_bytes` says otherwise.
    pub max_stored_bytes_per_tenant: u64,
    /// Files one tenant may store at once (uploads beyond are refused; a batch's output files always land).
    pub max_files_per_tenant: usize,
    /// Batches one tenant may have unfinished at once, unless its `[[tenants]] max_active_batches` says
    /// otherwise.
    pub max_active_batches_per_tenant: usize,
    /// How long files and finished batches are kept, seconds (30 days): older ones are deleted, with their
    /// results — except the input of a batch still running.
    pub retention_s: u64,
    /// Most request lines in one batch.
    pub max_lines: usize,
    /// Lines of a batch run at once (their Tier-0 work; LLM work is taken one job at a time, only while no
    /// interactive escalation is in flight).
    pub concurrency: usize,
    /// Longest a batch line waits for the LLM to be free of interactive work before it goes anyway, ms.
    pub max_llm_wait_ms: u64,
    /// POSTed when a batch ends (empty: none): `{"id", "object": "batch", "status", …}`, signed with
    /// HMAC-SHA256 of the body in `x-tiergate-signature: sha256=<hex>`, retried with backoff.
    pub webhook_url: String,
    /// The environment variable holding the webhook's signing secret.
    pub webhook_secret_env: String,
}

impl Default for BatchConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            data_dir: PathBuf::from("data/batches"),
            max_file_bytes: 100 << 20,
            max_total_bytes: 2 << 30,
            max_stored_bytes_per_tenant: 1 << 30,
            max_files_per_tenant: 10_000,
            max_active_batches_per_tenant: 100,
            retention_s: 30 * 24 * 3600,
            max_lines: 50_000,
            concurrency: 4,
            max_llm_wait_ms: 30_000,
            webhook_url: String::new(),
            webhook_secret_env: String::new(),
        }
    }
}

impl BatchConfig {
    /// Checks the section; errors name the field.
    pub fn validate(&self, at: &str) -> Result<(), ConfigError> {
        if self.enabled && self.data_dir.as_os_str().is_empty() {
            return Err(ConfigError::invalid(
                format!("{at}.data_dir"),
                "must be set",
            ));
        }
        for (name, v) in [
            ("max_file_bytes", self.max_file_bytes),
            ("max_total_bytes", self.max_total_bytes),
            ("max_lines", self.max_lines as u64),
            (
                "max_stored_bytes_per_tenant",
                self.max_stored_bytes_per_tenant,
            ),
            ("max_files_per_tenant", self.max_files_per_tenant as u64),
            (
                "max_active_batches_per_tenant",
                self.max_active_batches_per_tenant as u64,
            ),
            ("retention_s", self.retention_s),
            ("concurrency", self.concurrency as u64),
        ] {
            if v == 0 {
                return Err(ConfigError::invalid(
                    format!("{at}.{name}"),
                    "must be at least 1",
                ));
            }
        }
        if self.max_file_bytes > self.max_total_bytes {
            return Err(ConfigError::invalid(
                format!("{at}.max_file_bytes"),
                "must not exceed max_total_bytes",
            ));
        }
        let url = &self.webhook_url;
        if !(url.is_empty() || url.starts_with("http://") || url.starts_with("https://")) {
            return Err(ConfigError::invalid(
                format!("{at}.webhook_url"),
                "must be an http:// or https:// URL",
            ));
        }
        Ok(())
    }
}
