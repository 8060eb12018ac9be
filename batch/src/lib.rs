//! The Batch API (Tier-4 as asynchronous jobs): OpenAI's `/v1/files` and `/v1/batches` over a persistent store
//! ([`store`], SQLite) and a background runner ([`runner`]), offered as the engine's
//! [`tiergate_engine::batch::BatchService`]: the server mounts its HTTP routes over the trait and the cli
//! hands it this crate's [`BatchApi`], so neither crate names the other. The runner has each line answered
//! through the [`tiergate_engine::batch::Door`] the server gives it, marked as batch work
//! ([`tiergate_engine::model::request::BatchLine`]): its LLM jobs take one turn at a time, only while no
//! interactive escalation is in flight.

pub mod runner;
pub mod store;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tiergate_config::BatchConfig;
use tiergate_engine::batch::{BatchError, BatchService, Door, Page, Upload};
use tiergate_engine::model::request::TenantId;
use tiergate_engine::{Engine, WeakEngine};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use store::Store;

/// The Batch API's state.
pub struct Batches {
    pub store: Store,
    pub cfg: BatchConfig,
    /// The webhook's HMAC key (read by the caller from `batch.webhook_secret_env`).
    webhook_secret: String,
    /// Wakes the runner when a batch is created or cancelled.
    pub wake: tokio::sync::Notify,
}

impl Batches {
    /// Opens the store under `cfg.data_dir`; `webhook_secret` signs the webhook's body.
    pub fn open(cfg: &BatchConfig, webhook_secret: String) -> anyhow::Result<Self> {
        Ok(Self {
            store: Store::open(&cfg.data_dir)?,
            cfg: cfg.clone(),
            webhook_secret,
            wake: tokio::sync::Notify::new(),
        })
    }
}

/// The Batch API as the cli wires it: every call answers with an error while it is off or its store could
/// not be opened.
#[derive(Clone)]
pub struct BatchApi {
    batches: Option<Arc<Batches>>,
    /// Why it is unavailable although enabled.
    unavailable: Option<String>,
    /// `batch.max_file_bytes`, the upload's body limit.
    max_file_bytes: u64,
}

impl BatchApi {
    /// Opens the store when `batch.enabled` (a store that cannot be opened leaves the API unavailable, with the
    /// reason, and the server up).
    pub fn new(cfg: &BatchConfig, webhook_secret: String) -> Self {
        let (batches, unavailable) = if !cfg.enabled {
            (None, None)
        } else {
            match Batches::open(cfg, webhook_secret) {
                Ok(b) => (Some(Arc::new(b)), None),
                Err(e) => {
                    tracing::warn!(error = %e, "the Batch API is unavailable");
                    (None, Some(e.to_string()))
                }
            }
        };
        Self {
            batches,
            unavailable,
            max_file_bytes: cfg.max_file_bytes,
        }
    }

    fn batches(&self) -> Result<&Arc<Batches>, BatchError> {
        self.batches
            .as_ref()
            .ok_or_else(|| match &self.unavailable {
                Some(why) => {
                    BatchError::Unavailable(format!("the Batch API is unavailable: {why}"))
                }
                None => BatchError::NotFound("the Batch API is off (batch.enabled = false)".into()),
            })
    }
}

fn internal(e: anyhow::Error) -> BatchError {
    BatchError::Internal(format!("batch store: {e}"))
}

fn invalid(param: &'static str, message: impl Into<String>) -> BatchError {
    BatchError::Invalid {
        param,
        message: message.into(),
    }
}

/// The file `id` when `tenant` owns it; not found otherwise (another tenant's file is not said to exist).
fn owned_file(b: &Batches, tenant: &TenantId, id: &str) -> Result<store::FileRow, BatchError> {
    b.store
        .file(id)
        .map_err(internal)?
        .filter(|f| *f.owner == *tenant.0)
        .ok_or_else(|| BatchError::NotFound(format!("no file `{id}`")))
}

/// The batch `id` when `tenant` owns it; not found otherwise.
fn owned_batch(b: &Batches, tenant: &TenantId, id: &str) -> Result<store::BatchRow, BatchError> {
    b.store
        .batch(id)
        .map_err(internal)?
        .filter(|r| *r.owner == *tenant.0)
        .ok_or_else(|| BatchError::NotFound(format!("no batch `{id}`")))
}

/// `tenant`'s batch quotas (none for identities that are no configured tenant).
fn quotas(engine: &Engine, tenant: &TenantId) -> tiergate_engine::Quotas {
    engine.quotas(tenant)
}

/// Over quota when `tenant`'s files would pass its `max_stored_bytes` with `adding` more.
fn check_stored_bytes(
    engine: &Engine,
    b: &Batches,
    tenant: &TenantId,
    adding: u64,
) -> Result<(), BatchError> {
    let quota = quotas(engine, tenant)
        .max_stored_bytes
        .unwrap_or(b.cfg.max_stored_bytes_per_tenant);
    let used = b.store.owner_bytes(&tenant.0).map_err(internal)?;
    if used + adding > quota {
        return Err(BatchError::Quota(format!(
            "tenant `{}` stores {used} bytes; {adding} more would pass its max_stored_bytes = {quota}",
            tenant.0
        )));
    }
    Ok(())
}

/// Over quota when `tenant` already stores `batch.max_files_per_tenant` files.
fn check_file_count(b: &Batches, tenant: &TenantId) -> Result<(), BatchError> {
    let n = b.store.owner_files(&tenant.0).map_err(internal)?;
    if n >= b.cfg.max_files_per_tenant as u64 {
        return Err(BatchError::Quota(format!(
            "tenant `{}` stores {n} files, batch.max_files_per_tenant",
            tenant.0
        )));
    }
    Ok(())
}

/// Unavailable when the store's files would pass `batch.max_total_bytes` with `adding` more.
fn check_total_bytes(b: &Batches, adding: u64) -> Result<(), BatchError> {
    let total = b.store.total_bytes().map_err(internal)?;
    if total + adding > b.cfg.max_total_bytes {
        return Err(BatchError::Unavailable(format!(
            "the file store is full ({total} of batch.max_total_bytes = {} bytes)",
            b.cfg.max_total_bytes
        )));
    }
    Ok(())
}

/// Over quota when `tenant` already has its `max_active_batches` unfinished.
fn check_open_batches(engine: &Engine, b: &Batches, tenant: &TenantId) -> Result<(), BatchError> {
    let quota = quotas(engine, tenant)
        .max_active_batches
        .unwrap_or(b.cfg.max_active_batches_per_tenant);
    let open = b.store.owner_open_batches(&tenant.0).map_err(internal)?;
    if open >= quota {
        return Err(BatchError::Quota(format!(
            "tenant `{}` has {open} unfinished batches, its max_active_batches",
            tenant.0
        )));
    }
    Ok(())
}

/// One page of `fetch(after, limit + 1)`.
fn page<R>(
    after: Option<&str>,
    limit: usize,
    fetch: impl FnOnce(Option<&str>, usize) -> anyhow::Result<Vec<R>>,
    json: impl Fn(&R) -> Value,
) -> Result<Page, BatchError> {
    let rows = fetch(after, limit + 1).map_err(internal)?;
    Ok(Page {
        data: rows.iter().take(limit).map(json).collect(),
        more: rows.len() > limit,
    })
}

/// The checks of `POST /v1/batches`' body: the input file's id (owned, purpose `batch`), the endpoint and the
/// window.
fn batch_request<'a>(
    b: &Batches,
    tenant: &TenantId,
    body: &'a Value,
) -> Result<(&'a str, &'a str, &'a str), BatchError> {
    let input = body["input_file_id"]
        .as_str()
        .ok_or_else(|| invalid("input_file_id", "missing `input_file_id`"))?;
    let f = owned_file(b, tenant, input)
        .map_err(|_| invalid("input_file_id", format!("no file `{input}`")))?;
    if f.purpose != "batch" {
        return Err(invalid(
            "input_file_id",
            format!("file `{input}` has purpose `{}`, not `batch`", f.purpose),
        ));
    }
    let endpoint = body["endpoint"].as_str().unwrap_or_default();
    if endpoint != "/v1/chat/completions" {
        return Err(invalid(
            "endpoint",
            format!("endpoint `{endpoint}`: only `/v1/chat/completions` is supported"),
        ));
    }
    let window = body["completion_window"].as_str().unwrap_or_default();
    if window != "24h" {
        return Err(invalid(
            "completion_window",
            format!("completion_window `{window}`: only `24h` is supported"),
        ));
    }
    Ok((input, endpoint, window))
}

impl BatchService for BatchApi {
    fn max_file_bytes(&self) -> u64 {
        self.max_file_bytes
    }

    fn stage(
        &self,
        engine: &Engine,
        tenant: &TenantId,
        at_least: u64,
    ) -> Result<PathBuf, BatchError> {
        let b = self.batches()?;
        check_file_count(b, tenant)?;
        check_stored_bytes(engine, b, tenant, at_least)?;
        check_total_bytes(b, at_least)?;
        Ok(b.store.stage_path())
    }

    fn upload(
        &self,
        engine: &Engine,
        tenant: &TenantId,
        up: Upload<'_>,
    ) -> Result<Value, BatchError> {
        let b = self.batches()?;
        let purpose = up
            .purpose
            .ok_or_else(|| invalid("purpose", "missing `purpose`"))?;
        if purpose != "batch" {
            return Err(invalid(
                "purpose",
                format!("purpose `{purpose}`: only `batch` is supported"),
            ));
        }
        let file = up.file.ok_or_else(|| invalid("file", "missing `file`"))?;
        check_file_count(b, tenant)?;
        check_stored_bytes(engine, b, tenant, file.bytes)?;
        check_total_bytes(b, file.bytes)?;
        let row = b
            .store
            .put_staged(&tenant.0, file.name, purpose, file.path)
            .map_err(internal)?;
        Ok(row.to_json())
    }

    fn files(
        &self,
        tenant: &TenantId,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Page, BatchError> {
        let b = self.batches()?;
        page(
            after,
            limit,
            |after, n| b.store.files(&tenant.0, after, n),
            store::FileRow::to_json,
        )
    }

    fn file(&self, tenant: &TenantId, id: &str) -> Result<Value, BatchError> {
        Ok(owned_file(self.batches()?, tenant, id)?.to_json())
    }

    fn content(&self, tenant: &TenantId, id: &str) -> Result<PathBuf, BatchError> {
        let b = self.batches()?;
        owned_file(b, tenant, id)?;
        Ok(b.store.file_path(id))
    }

    fn create(
        &self,
        engine: &Engine,
        tenant: &TenantId,
        body: &Value,
    ) -> Result<Value, BatchError> {
        let b = self.batches()?;
        let (input, endpoint, window) = batch_request(b, tenant, body)?;
        check_open_batches(engine, b, tenant)?;
        let metadata = Some(&body["metadata"]).filter(|m| m.is_object());
        let row = b
            .store
            .create_batch(&tenant.0, input, endpoint, window, metadata)
            .map_err(internal)?;
        b.wake.notify_one();
        Ok(row.to_json())
    }

    fn batch(&self, tenant: &TenantId, id: &str) -> Result<Value, BatchError> {
        Ok(owned_batch(self.batches()?, tenant, id)?.to_json())
    }

    /// An open batch moves to `cancelling`, then `cancelled` once the lines in flight end (their results, and
    /// those before, are in its files).
    fn cancel(&self, tenant: &TenantId, id: &str) -> Result<Value, BatchError> {
        let b = self.batches()?;
        let row = owned_batch(b, tenant, id)?;
        if !b.store.cancel(id).map_err(internal)? && row.status != "cancelling" {
            return Err(invalid(
                "batch_id",
                format!("batch `{id}` is {} and cannot be cancelled", row.status),
            ));
        }
        b.wake.notify_one();
        let row = b.store.batch(id).map_err(internal)?.unwrap_or(row);
        Ok(row.to_json())
    }

    fn list(
        &self,
        tenant: &TenantId,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Page, BatchError> {
        let b = self.batches()?;
        page(
            after,
            limit,
            |after, n| b.store.list(&tenant.0, after, n),
            store::BatchRow::to_json,
        )
    }

    fn overview(&self, tenant: Option<&str>) -> Result<Value, BatchError> {
        let b = self.batches()?;
        let owners: Vec<Value> = b
            .store
            .by_owner()
            .map_err(internal)?
            .into_iter()
            .map(|(owner, u)| {
                let batches: serde_json::Map<String, Value> =
                    u.batches.into_iter().map(|(s, n)| (s, Value::from(n))).collect();
                json!({"tenant": owner, "files": u.files, "stored_bytes": u.bytes, "batches": batches})
            })
            .collect();
        let mut out = json!({"tenants": owners});
        if let Some(t) = tenant {
            let rows = b.store.list(t, None, 100).map_err(internal)?;
            out["batches"] = rows.iter().map(|r| r.to_json()).collect();
        }
        Ok(out)
    }

    fn start(
        &self,
        engine: WeakEngine,
        door: Arc<dyn Door>,
        stop: watch::Receiver<bool>,
    ) -> Option<JoinHandle<()>> {
        let b = self.batches.clone()?;
        Some(tokio::spawn(runner::run(engine, b, door, stop)))
    }
}

/// HMAC-SHA256 (RFC 2104) of `body` under `key`, in hex.
pub fn sign(key: &[u8], body: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    let mut k = [0u8; 64];
    if key.len() > 64 {
        k[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        k[..key.len()].copy_from_slice(key);
    }
    let pad = |b: u8| k.iter().map(|x| x ^ b).collect::<Vec<u8>>();
    let inner = Sha256::new()
        .chain_update(pad(0x36))
        .chain_update(body)
        .finalize();
    let outer = Sha256::new()
        .chain_update(pad(0x5c))
        .chain_update(inner)
        .finalize();
    outer.iter().map(|b| format!("{b:02x}")).collect()
}

/// POSTs a finished batch to `batch.webhook_url` (signed, up to 5 tries with backoff), in the background.
pub fn notify_webhook(b: &Batches, row: Option<store::BatchRow>) {
    let (Some(row), false) = (row, b.cfg.webhook_url.is_empty()) else {
        return;
    };
    let url = b.cfg.webhook_url.clone();
    let secret = b.webhook_secret.clone();
    let body = row.to_json().to_string();
    tokio::spawn(async move {
        let client = reqwest::Client::new();
        let signature = format!("sha256={}", sign(secret.as_bytes(), body.as_bytes()));
        let mut wait = Duration::from_millis(500);
        for attempt in 1..=5 {
            let sent = client
                .post(&url)
                .header("content-type", "application/json")
                .header("x-tiergate-signature", &signature)
                .timeout(Duration::from_secs(10))
                .body(body.clone())
                .send()
                .await;
            match sent {
                Ok(r) if r.status().is_success() => return,
                Ok(r) => tracing::warn!(attempt, status = %r.status(), "batch webhook refused"),
                Err(e) => tracing::warn!(attempt, error = %e, "batch webhook failed"),
            }
            tokio::time::sleep(wait).await;
            wait *= 2;
        }
        tracing::error!(%url, "batch webhook given up after 5 tries");
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hmac_sha256_matches_rfc_4231() {
        // Test case 2 of RFC 4231.
        assert_eq!(
            sign(b"Jefe", b"what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        // Test case 6: a key longer than the block.
        assert_eq!(
            sign(
                &[0xaa; 131],
                b"Test Using Larger Than Block-Size Key - Hash Key First"
            ),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
        );
    }
}
