//! Tier-4 as asynchronous batch jobs: the OpenAI Batch API (`/v1/files`, `/v1/batches`) over a persistent
//! store ([`store`]) and a background runner ([`runner`]). Batch lines go through the same routing as any
//! request; their LLM work is taken one job at a time and only while no interactive escalation is in flight.

pub mod runner;
pub mod store;

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Multipart, Path, Query, State};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};
use tiergate_config::BatchConfig;

use crate::app::AppState;
use crate::error::ApiError;
use crate::extract::ApiJson;
use store::Store;

/// Marks a request as a batch line (set by the runner as a request extension; a client cannot set it).
#[derive(Debug, Clone, Default)]
pub struct BatchLine {
    /// Set while the line holds the batch's LLM turn.
    holds_llm: Arc<std::sync::atomic::AtomicBool>,
    /// An interactive escalation may cancel this line's LLM job (it is run again later); false after a few
    /// preemptions, so a batch always progresses.
    preemptible: bool,
}

impl PartialEq for BatchLine {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.holds_llm, &other.holds_llm)
    }
}

impl BatchLine {
    /// A line; `preemptible`: its LLM job yields to interactive escalations.
    pub fn new(preemptible: bool) -> Self {
        Self {
            holds_llm: Arc::default(),
            preemptible,
        }
    }

    /// Its LLM job is running and may be cancelled for an interactive one.
    pub fn preemptible_now(&self) -> bool {
        self.preemptible && self.holds_llm.load(std::sync::atomic::Ordering::Acquire)
    }
}

/// A batch line's turn at the LLM (released on drop).
pub struct Turn<'a> {
    _permit: tokio::sync::SemaphorePermit<'a>,
    line: BatchLine,
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        self.line
            .holds_llm
            .store(false, std::sync::atomic::Ordering::Release);
    }
}

/// The Batch API's state.
pub struct Batches {
    pub store: Store,
    pub cfg: BatchConfig,
    /// Wakes the runner when a batch is created or cancelled.
    pub wake: tokio::sync::Notify,
    /// One batch LLM job at a time.
    llm_gate: tokio::sync::Semaphore,
    /// Notified when an interactive escalation wants the LLM.
    pub preempt: tokio::sync::Notify,
}

impl Batches {
    /// Opens the store under `cfg.data_dir`.
    pub fn open(cfg: &BatchConfig) -> anyhow::Result<Self> {
        Ok(Self {
            store: Store::open(&cfg.data_dir)?,
            cfg: cfg.clone(),
            wake: tokio::sync::Notify::new(),
            llm_gate: tokio::sync::Semaphore::new(1),
            preempt: tokio::sync::Notify::new(),
        })
    }
}

/// Before an LLM job. An interactive request passes at once (`None`) and asks a running batch job to yield.
/// A batch line waits until a worker is live and the LLM is free of interactive work (at most
/// `batch.max_llm_wait_ms`); the returned turn is held until the LLM answered.
pub async fn llm_turn<'a>(state: &'a AppState, line: Option<&BatchLine>) -> Option<Turn<'a>> {
    let b = state.batches.as_ref()?;
    let Some(line) = line else {
        b.preempt.notify_waiters();
        return None;
    };
    let permit = b.llm_gate.acquire().await.ok()?;
    let waited = std::time::Instant::now();
    let max = Duration::from_millis(b.cfg.max_llm_wait_ms);
    let busy = |l: &crate::app::Llm| l.client.in_flight() > 0 || l.client.live_workers() == 0;
    while state.llm.as_ref().is_some_and(busy) && waited.elapsed() < max {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    line.holds_llm
        .store(true, std::sync::atomic::Ordering::Release);
    Some(Turn {
        _permit: permit,
        line: line.clone(),
    })
}

fn batches(state: &AppState) -> Result<&Arc<Batches>, ApiError> {
    state
        .batches
        .as_ref()
        .ok_or_else(|| match &state.batch_unavailable {
            Some(why) => ApiError::Unavailable(format!("the Batch API is unavailable: {why}")),
            None => ApiError::NotFound("the Batch API is off (batch.enabled = false)".into()),
        })
}

fn internal(e: anyhow::Error) -> ApiError {
    ApiError::Internal(format!("batch store: {e}"))
}

/// `POST /v1/files`: a multipart upload (`file`, `purpose = batch`).
pub async fn upload(State(state): State<Arc<AppState>>, mut form: Multipart) -> Response {
    let run = async {
        let b = batches(&state)?;
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
        let total = b.store.total_bytes().map_err(internal)?;
        if total + bytes.len() as u64 > b.cfg.max_total_bytes {
            return Err(ApiError::Unavailable(format!(
                "the file store is full ({total} of batch.max_total_bytes = {} bytes)",
                b.cfg.max_total_bytes
            )));
        }
        let row = b
            .store
            .put_file(&name, &purpose, &bytes)
            .map_err(internal)?;
        Ok::<_, ApiError>(axum::Json(row.to_json()).into_response())
    };
    run.await.unwrap_or_else(IntoResponse::into_response)
}

/// `GET /v1/files/{id}`.
pub async fn file(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Response {
    let run = || {
        let b = batches(&state)?;
        let f = b.store.file(&id).map_err(internal)?;
        let f = f.ok_or_else(|| ApiError::NotFound(format!("no file `{id}`")))?;
        Ok::<_, ApiError>(axum::Json(f.to_json()).into_response())
    };
    run().unwrap_or_else(IntoResponse::into_response)
}

/// `GET /v1/files/{id}/content`.
pub async fn content(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Response {
    let run = async {
        let b = batches(&state)?;
        b.store
            .file(&id)
            .map_err(internal)?
            .ok_or_else(|| ApiError::NotFound(format!("no file `{id}`")))?;
        let bytes = tokio::fs::read(b.store.file_path(&id))
            .await
            .map_err(|e| ApiError::Internal(format!("file `{id}`: {e}")))?;
        Ok::<_, ApiError>(([("content-type", "application/jsonl")], bytes).into_response())
    };
    run.await.unwrap_or_else(IntoResponse::into_response)
}

/// `POST /v1/batches`.
pub async fn create(State(state): State<Arc<AppState>>, ApiJson(body): ApiJson<Value>) -> Response {
    let run = || {
        let b = batches(&state)?;
        let input = body["input_file_id"]
            .as_str()
            .ok_or_else(|| ApiError::invalid("input_file_id", "missing `input_file_id`"))?;
        let f = b.store.file(input).map_err(internal)?;
        let f =
            f.ok_or_else(|| ApiError::invalid("input_file_id", format!("no file `{input}`")))?;
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
        let metadata = Some(&body["metadata"]).filter(|m| m.is_object());
        let row = b
            .store
            .create_batch(input, endpoint, window, metadata)
            .map_err(internal)?;
        b.wake.notify_one();
        Ok::<_, ApiError>(axum::Json(row.to_json()).into_response())
    };
    run().unwrap_or_else(IntoResponse::into_response)
}

/// `GET /v1/batches/{id}`.
pub async fn get(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Response {
    let run = || {
        let b = batches(&state)?;
        let row = b.store.batch(&id).map_err(internal)?;
        let row = row.ok_or_else(|| ApiError::NotFound(format!("no batch `{id}`")))?;
        Ok::<_, ApiError>(axum::Json(row.to_json()).into_response())
    };
    run().unwrap_or_else(IntoResponse::into_response)
}

/// `POST /v1/batches/{id}/cancel`: an open batch moves to `cancelling`, then `cancelled` once the lines in
/// flight end (their results, and those before, are in its files).
pub async fn cancel(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Response {
    let run = || {
        let b = batches(&state)?;
        let row = b.store.batch(&id).map_err(internal)?;
        let row = row.ok_or_else(|| ApiError::NotFound(format!("no batch `{id}`")))?;
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
    State(state): State<Arc<AppState>>,
    Query(q): Query<std::collections::HashMap<String, String>>,
) -> Response {
    let run = || {
        let b = batches(&state)?;
        let limit = match q.get("limit").map(|l| l.parse::<usize>()) {
            None => 20,
            Some(Ok(n)) if (1..=100).contains(&n) => n,
            Some(_) => return Err(ApiError::invalid("limit", "must be 1–100")),
        };
        let rows = b
            .store
            .list(q.get("after").map(String::as_str), limit + 1)
            .map_err(internal)?;
        let more = rows.len() > limit;
        let data: Vec<Value> = rows.iter().take(limit).map(|r| r.to_json()).collect();
        Ok::<_, ApiError>(
            axum::Json(json!({"object": "list", "data": data,
                "first_id": data.first().map(|d| d["id"].clone()),
                "last_id": data.last().map(|d| d["id"].clone()), "has_more": more}))
            .into_response(),
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
    let secret = std::env::var(&b.cfg.webhook_secret_env).unwrap_or_default();
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
