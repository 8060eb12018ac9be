//! The Batch API (Tier-4 as asynchronous jobs): OpenAI's `/v1/files` and `/v1/batches` over a persistent store
//! ([`store`], SQLite) and a background runner ([`runner`]), mounted on the tiergate server as a
//! [`Product`]. Batch lines go through the server's public router like any request, marked as batch work
//! ([`tiergate_engine::priority::BatchLine`]): their LLM jobs take one turn at a time, only while no interactive escalation is in flight.

pub mod runner;
pub mod store;

use std::sync::{Arc, Weak};
use std::time::Duration;

use axum::extract::{Multipart, Path, Query};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Extension;
use serde_json::{json, Value};
use tiergate_config::BatchConfig;
use tiergate_engine::state::AppState;
use tiergate_engine::tenants::TenantId;
use tiergate_server::error::ApiError;
use tiergate_server::extract::ApiJson;
use tiergate_server::product::Product;
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

/// The Batch API as the server mounts it: its routes answer with an error while it is off or its store
/// could not be opened.
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

    fn batches(&self) -> Result<&Arc<Batches>, ApiError> {
        self.batches
            .as_ref()
            .ok_or_else(|| match &self.unavailable {
                Some(why) => ApiError::Unavailable(format!("the Batch API is unavailable: {why}")),
                None => ApiError::NotFound("the Batch API is off (batch.enabled = false)".into()),
            })
    }
}

impl Product for BatchApi {
    fn routes(&self) -> axum::Router<Arc<AppState>> {
        let files_limit = usize::try_from(self.max_file_bytes).unwrap_or(usize::MAX);
        axum::Router::new()
            .route(
                "/v1/files",
                post(upload).layer(axum::extract::DefaultBodyLimit::max(
                    files_limit.saturating_add(64 << 10),
                )),
            )
            .route("/v1/files", get(list_files))
            .route("/v1/files/{id}", get(file))
            .route("/v1/files/{id}/content", get(content))
            .route("/v1/batches", post(create).get(list))
            .route("/v1/batches/{id}", get(batch))
            .route("/v1/batches/{id}/cancel", post(cancel))
            .layer(Extension(self.clone()))
    }

    fn admin_routes(&self) -> axum::Router<Arc<AppState>> {
        axum::Router::new()
            .route("/admin/batches", get(admin_batches))
            .layer(Extension(self.clone()))
    }

    fn start(&self, state: Weak<AppState>, stop: watch::Receiver<bool>) -> Option<JoinHandle<()>> {
        let b = self.batches.clone()?;
        Some(tokio::spawn(runner::run(state, b, stop)))
    }
}

fn internal(e: anyhow::Error) -> ApiError {
    ApiError::Internal(format!("batch store: {e}"))
}

/// The file `id` when `tenant` owns it; 404 otherwise (another tenant's file is not said to exist).
fn owned_file(b: &Batches, tenant: &TenantId, id: &str) -> Result<store::FileRow, ApiError> {
    b.store
        .file(id)
        .map_err(internal)?
        .filter(|f| *f.owner == *tenant.0)
        .ok_or_else(|| ApiError::NotFound(format!("no file `{id}`")))
}

/// The batch `id` when `tenant` owns it; 404 otherwise.
fn owned_batch(b: &Batches, tenant: &TenantId, id: &str) -> Result<store::BatchRow, ApiError> {
    b.store
        .batch(id)
        .map_err(internal)?
        .filter(|r| *r.owner == *tenant.0)
        .ok_or_else(|| ApiError::NotFound(format!("no batch `{id}`")))
}

/// `tenant`'s batch quotas (none for identities that are no configured tenant).
fn quotas(state: &AppState, tenant: &TenantId) -> tiergate_engine::tenants::Quotas {
    state
        .tenants()
        .named(&tenant.0)
        .map(|t| t.quotas)
        .unwrap_or_default()
}

/// 429 `insufficient_quota` when `tenant`'s files would pass its `max_stored_bytes` with `adding` more.
fn check_stored_bytes(
    state: &AppState,
    b: &Batches,
    tenant: &TenantId,
    adding: u64,
) -> Result<(), ApiError> {
    let Some(quota) = quotas(state, tenant).max_stored_bytes else {
        return Ok(());
    };
    let used = b.store.owner_bytes(&tenant.0).map_err(internal)?;
    if used + adding > quota {
        return Err(ApiError::QuotaExceeded(format!(
            "tenant `{}` stores {used} bytes; {adding} more would pass its max_stored_bytes = {quota}",
            tenant.0
        )));
    }
    Ok(())
}

/// 429 `insufficient_quota` when `tenant` already has its `max_active_batches` unfinished.
fn check_open_batches(state: &AppState, b: &Batches, tenant: &TenantId) -> Result<(), ApiError> {
    let Some(quota) = quotas(state, tenant).max_active_batches else {
        return Ok(());
    };
    let open = b.store.owner_open_batches(&tenant.0).map_err(internal)?;
    if open >= quota {
        return Err(ApiError::QuotaExceeded(format!(
            "tenant `{}` has {open} unfinished batches, its max_active_batches",
            tenant.0
        )));
    }
    Ok(())
}

/// `GET /v1/files?after=&limit=`: the caller's files, newest first.
pub async fn list_files(
    Extension(api): Extension<BatchApi>,
    Extension(tenant): Extension<TenantId>,
    Query(q): Query<std::collections::HashMap<String, String>>,
) -> Response {
    let run = || {
        let b = api.batches()?;
        listed(
            &q,
            |after, n| b.store.files(&tenant.0, after, n),
            store::FileRow::to_json,
        )
    };
    run().unwrap_or_else(IntoResponse::into_response)
}

/// One page of `fetch(after, limit + 1)` in OpenAI's list shape.
fn listed<R>(
    q: &std::collections::HashMap<String, String>,
    fetch: impl FnOnce(Option<&str>, usize) -> anyhow::Result<Vec<R>>,
    json: impl Fn(&R) -> Value,
) -> Result<Response, ApiError> {
    let limit = page_limit(q)?;
    let rows = fetch(q.get("after").map(String::as_str), limit + 1).map_err(internal)?;
    let data: Vec<Value> = rows.iter().take(limit).map(json).collect();
    Ok(axum::Json(page(data, rows.len() > limit)).into_response())
}

/// `limit` of a list request: 20 unless given, 1–100.
fn page_limit(q: &std::collections::HashMap<String, String>) -> Result<usize, ApiError> {
    match q.get("limit").map(|l| l.parse::<usize>()) {
        None => Ok(20),
        Some(Ok(n)) if (1..=100).contains(&n) => Ok(n),
        Some(_) => Err(ApiError::invalid("limit", "must be 1–100")),
    }
}

/// One page of a list, in OpenAI's shape.
fn page(data: Vec<Value>, more: bool) -> Value {
    json!({"object": "list",
        "first_id": data.first().map(|d| d["id"].clone()),
        "last_id": data.last().map(|d| d["id"].clone()),
        "has_more": more, "data": data})
}

/// `GET /admin/batches` (admin listener): per tenant, its files, their bytes and its batches by status;
/// `?tenant=NAME` also lists that tenant's batches (newest 100).
pub async fn admin_batches(
    Extension(api): Extension<BatchApi>,
    axum::extract::State(state): axum::extract::State<Arc<AppState>>,
    tiergate_server::auth::Peer(peer): tiergate_server::auth::Peer,
    headers: axum::http::HeaderMap,
    Query(q): Query<std::collections::HashMap<String, String>>,
) -> Response {
    let run = || {
        tiergate_server::auth::authorize_admin(state.admin_token(), &headers, peer)?;
        let b = api.batches()?;
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
        if let Some(t) = q.get("tenant") {
            let rows = b.store.list(t, None, 100).map_err(internal)?;
            out["batches"] = rows.iter().map(|r| r.to_json()).collect();
        }
        Ok::<_, ApiError>(axum::Json(out).into_response())
    };
    run().unwrap_or_else(IntoResponse::into_response)
}

/// `POST /v1/files`: a multipart upload (`file`, `purpose = batch`).
pub async fn upload(
    axum::extract::State(state): axum::extract::State<Arc<AppState>>,
    Extension(api): Extension<BatchApi>,
    Extension(tenant): Extension<TenantId>,
    mut form: Multipart,
) -> Response {
    let run = async {
        let b = api.batches()?;
        let (mut purpose, mut file) = (None, None);
        while let Some(field) = form
            .next_field()
            .await
            .map_err(|e| ApiError::invalid("file", format!("bad multipart body: {e}")))?
        {
            match field.name() {
                Some("purpose") => {
                    purpose = Some(
                        field
                            .text()
                            .await
                            .map_err(|e| ApiError::invalid("purpose", e.to_string()))?,
                    )
                }
                Some("file") => {
                    let name = field.file_name().unwrap_or("upload.jsonl").to_string();
                    let bytes = field.bytes().await.map_err(|e| {
                        ApiError::invalid(
                            "file",
                            format!("{e} (batch.max_file_bytes = {})", b.cfg.max_file_bytes),
                        )
                    })?;
                    file = Some((name, bytes));
                }
                _ => {}
            }
        }
        let purpose = purpose.ok_or_else(|| ApiError::invalid("purpose", "missing `purpose`"))?;
        if purpose != "batch" {
            return Err(ApiError::invalid(
                "purpose",
                format!("purpose `{purpose}`: only `batch` is supported"),
            ));
        }
        let (name, bytes) = file.ok_or_else(|| ApiError::invalid("file", "missing `file`"))?;
        check_stored_bytes(&state, b, &tenant, bytes.len() as u64)?;
        let total = b.store.total_bytes().map_err(internal)?;
        if total + bytes.len() as u64 > b.cfg.max_total_bytes {
            return Err(ApiError::Unavailable(format!(
                "the file store is full ({total} of batch.max_total_bytes = {} bytes)",
                b.cfg.max_total_bytes
            )));
        }
        let row = b
            .store
            .put_file(&tenant.0, &name, &purpose, &bytes)
            .map_err(internal)?;
        Ok::<_, ApiError>(axum::Json(row.to_json()).into_response())
    };
    run.await.unwrap_or_else(IntoResponse::into_response)
}

/// `GET /v1/files/{id}`.
pub async fn file(
    Extension(api): Extension<BatchApi>,
    Extension(tenant): Extension<TenantId>,
    Path(id): Path<String>,
) -> Response {
    let run = || {
        let b = api.batches()?;
        let f = owned_file(b, &tenant, &id)?;
        Ok::<_, ApiError>(axum::Json(f.to_json()).into_response())
    };
    run().unwrap_or_else(IntoResponse::into_response)
}

/// `GET /v1/files/{id}/content`.
pub async fn content(
    Extension(api): Extension<BatchApi>,
    Extension(tenant): Extension<TenantId>,
    Path(id): Path<String>,
) -> Response {
    let run = async {
        let b = api.batches()?;
        owned_file(b, &tenant, &id)?;
        let bytes = tokio::fs::read(b.store.file_path(&id))
            .await
            .map_err(|e| ApiError::Internal(format!("file `{id}`: {e}")))?;
        Ok::<_, ApiError>(([("content-type", "application/jsonl")], bytes).into_response())
    };
    run.await.unwrap_or_else(IntoResponse::into_response)
}

/// `POST /v1/batches`.
pub async fn create(
    axum::extract::State(state): axum::extract::State<Arc<AppState>>,
    Extension(api): Extension<BatchApi>,
    Extension(tenant): Extension<TenantId>,
    ApiJson(body): ApiJson<Value>,
) -> Response {
    let run = || {
        let b = api.batches()?;
        let input = body["input_file_id"]
            .as_str()
            .ok_or_else(|| ApiError::invalid("input_file_id", "missing `input_file_id`"))?;
        let f = owned_file(b, &tenant, input)
            .map_err(|_| ApiError::invalid("input_file_id", format!("no file `{input}`")))?;
        if f.purpose != "batch" {
            return Err(ApiError::invalid(
                "input_file_id",
                format!("file `{input}` has purpose `{}`, not `batch`", f.purpose),
            ));
        }
        let endpoint = body["endpoint"].as_str().unwrap_or_default();
        if endpoint != "/v1/chat/completions" {
            return Err(ApiError::invalid(
                "endpoint",
                format!("endpoint `{endpoint}`: only `/v1/chat/completions` is supported"),
            ));
        }
        let window = body["completion_window"].as_str().unwrap_or_default();
        if window != "24h" {
            return Err(ApiError::invalid(
                "completion_window",
                format!("completion_window `{window}`: only `24h` is supported"),
            ));
        }
        check_open_batches(&state, b, &tenant)?;
        let metadata = Some(&body["metadata"]).filter(|m| m.is_object());
        let row = b
            .store
            .create_batch(&tenant.0, input, endpoint, window, metadata)
            .map_err(internal)?;
        b.wake.notify_one();
        Ok::<_, ApiError>(axum::Json(row.to_json()).into_response())
    };
    run().unwrap_or_else(IntoResponse::into_response)
}

/// `GET /v1/batches/{id}`.
pub async fn batch(
    Extension(api): Extension<BatchApi>,
    Extension(tenant): Extension<TenantId>,
    Path(id): Path<String>,
) -> Response {
    let run = || {
        let b = api.batches()?;
        let row = owned_batch(b, &tenant, &id)?;
        Ok::<_, ApiError>(axum::Json(row.to_json()).into_response())
    };
    run().unwrap_or_else(IntoResponse::into_response)
}

/// `POST /v1/batches/{id}/cancel`: an open batch moves to `cancelling`, then `cancelled` once the lines in
/// flight end (their results, and those before, are in its files).
pub async fn cancel(
    Extension(api): Extension<BatchApi>,
    Extension(tenant): Extension<TenantId>,
    Path(id): Path<String>,
) -> Response {
    let run = || {
        let b = api.batches()?;
        let row = owned_batch(b, &tenant, &id)?;
        if !b.store.cancel(&id).map_err(internal)? && row.status != "cancelling" {
            return Err(ApiError::invalid(
                "batch_id",
                format!("batch `{id}` is {} and cannot be cancelled", row.status),
            ));
        }
        b.wake.notify_one();
        let row = b.store.batch(&id).map_err(internal)?.unwrap_or(row);
        Ok::<_, ApiError>(axum::Json(row.to_json()).into_response())
    };
    run().unwrap_or_else(IntoResponse::into_response)
}

/// `GET /v1/batches?after=&limit=` (newest first).
pub async fn list(
    Extension(api): Extension<BatchApi>,
    Extension(tenant): Extension<TenantId>,
    Query(q): Query<std::collections::HashMap<String, String>>,
) -> Response {
    let run = || {
        let b = api.batches()?;
        listed(
            &q,
            |after, n| b.store.list(&tenant.0, after, n),
            store::BatchRow::to_json,
        )
    };
    run().unwrap_or_else(IntoResponse::into_response)
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
