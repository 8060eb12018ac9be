//! The Batch API's door: `/v1/files` and `/v1/batches` (OpenAI's shapes) and `/admin/batches`, over the
//! [`BatchService`] the binary wires in (the store and its runner live in `tiergate-batch`, which this crate
//! never names). Each handler reads the request, makes one call and renders its value or its error.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Multipart, Path, Query, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use serde_json::{json, Value};
use tiergate_engine::batch::{BatchError, BatchService, Page, Staged, Upload};
use tiergate_engine::model::request::TenantId;
use tiergate_engine::Engine;

use crate::error::ApiError;
use crate::extract::ApiJson;

/// The service as the handlers hold it.
type Service = Arc<dyn BatchService>;

/// What a multipart upload's body may hold besides the file's bytes (boundaries, part headers, `purpose`).
const FRAMING: u64 = 64 << 10;

/// The public routes; an upload may be `batch.max_file_bytes` plus its multipart framing.
pub fn routes(service: Service) -> Router<Engine> {
    let files_limit = usize::try_from(service.max_file_bytes().saturating_add(FRAMING));
    Router::new()
        .route(
            "/v1/files",
            post(upload).layer(axum::extract::DefaultBodyLimit::max(
                files_limit.unwrap_or(usize::MAX),
            )),
        )
        .route("/v1/files", get(list_files))
        .route("/v1/files/{id}", get(file))
        .route("/v1/files/{id}/content", get(content))
        .route("/v1/batches", post(create).get(list))
        .route("/v1/batches/{id}", get(batch))
        .route("/v1/batches/{id}/cancel", post(cancel))
        .layer(Extension(service))
}

/// The admin route.
pub fn admin_routes(service: Service) -> Router<Engine> {
    Router::new()
        .route("/admin/batches", get(overview))
        .layer(Extension(service))
}

impl From<BatchError> for ApiError {
    fn from(e: BatchError) -> Self {
        match e {
            BatchError::NotFound(m) => ApiError::NotFound(m),
            BatchError::Invalid { param, message } => ApiError::invalid(param, message),
            BatchError::Quota(m) => ApiError::QuotaExceeded(m),
            BatchError::Unavailable(m) => ApiError::StoreUnavailable(m),
            BatchError::Internal(m) => ApiError::Internal(m),
        }
    }
}

/// A value as JSON, or the error in OpenAI's shape.
fn reply(r: Result<Value, BatchError>) -> Response {
    match r {
        Ok(v) => Json(v).into_response(),
        Err(e) => ApiError::from(e).into_response(),
    }
}

/// `limit` of a list request: 20 unless given, 1–100.
fn page_limit(q: &HashMap<String, String>) -> Result<usize, ApiError> {
    match q.get("limit").map(|l| l.parse::<usize>()) {
        None => Ok(20),
        Some(Ok(n)) if (1..=100).contains(&n) => Ok(n),
        Some(_) => Err(ApiError::invalid("limit", "must be 1–100")),
    }
}

/// One page of a list (`?after=&limit=`) in OpenAI's shape.
fn listed(
    q: &HashMap<String, String>,
    fetch: impl FnOnce(Option<&str>, usize) -> Result<Page, BatchError>,
) -> Response {
    let limit = match page_limit(q) {
        Ok(l) => l,
        Err(e) => return e.into_response(),
    };
    reply(fetch(q.get("after").map(String::as_str), limit).map(|p| {
        json!({"object": "list",
            "first_id": p.data.first().map(|d| d["id"].clone()),
            "last_id": p.data.last().map(|d| d["id"].clone()),
            "has_more": p.more, "data": p.data})
    }))
}

/// `GET /v1/files?after=&limit=`: the caller's files, newest first.
async fn list_files(
    Extension(s): Extension<Service>,
    Extension(tenant): Extension<TenantId>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    listed(&q, |after, n| s.files(&tenant, after, n))
}

/// `GET /v1/batches?after=&limit=`, newest first.
async fn list(
    Extension(s): Extension<Service>,
    Extension(tenant): Extension<TenantId>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    listed(&q, |after, n| s.list(&tenant, after, n))
}

/// `POST /v1/files`: a multipart upload (`file`, `purpose = batch`). Checked from its declared length before
/// a byte is read (`batch.max_file_bytes`, the tenant's quota, the store's size), then streamed to disk within
/// the body's deadline: the file is never held in memory.
async fn upload(
    State(engine): State<Engine>,
    Extension(s): Extension<Service>,
    Extension(tenant): Extension<TenantId>,
    headers: axum::http::HeaderMap,
    form: Multipart,
) -> Response {
    let max = s.max_file_bytes();
    let declared = headers
        .get("content-length")
        .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if let Some(n) = declared.filter(|n| *n > max.saturating_add(FRAMING)) {
        return ApiError::TooLarge(format!(
            "the upload declares {n} bytes; a file may have {max} (batch.max_file_bytes)"
        ))
        .into_response();
    }
    let at_least = declared.map_or(0, |n| n.saturating_sub(FRAMING));
    let staged = match s.stage(&engine, &tenant, at_least) {
        Ok(path) => Removed(path),
        Err(e) => return ApiError::from(e).into_response(),
    };
    let deadline = upload_deadline(&engine, declared.unwrap_or(max));
    let (purpose, file) =
        match tokio::time::timeout(deadline, read_upload(form, &staged.0, max)).await {
            Ok(Ok(parts)) => parts,
            Ok(Err(e)) => return e.into_response(),
            Err(_) => {
                return ApiError::BodyTimeout(format!(
                    "the upload did not arrive within {} ms (server.body_timeout_ms for each \
                 server.max_body_bytes it declares)",
                    deadline.as_millis()
                ))
                .into_response()
            }
        };
    // The file is synced and recorded off the async threads.
    let stored = tokio::task::spawn_blocking(move || {
        let file = file.as_ref().map(|(name, bytes)| Staged {
            name,
            path: &staged.0,
            bytes: *bytes,
        });
        let up = Upload {
            purpose: purpose.as_deref(),
            file,
        };
        s.upload(&engine, &tenant, up)
    });
    match stored.await {
        Ok(r) => reply(r),
        Err(e) => {
            ApiError::Internal(format!("the upload's store task failed: {e}")).into_response()
        }
    }
}

/// A staged file, removed when dropped (a no-op once the store moved it in).
struct Removed(std::path::PathBuf);

impl Drop for Removed {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// An upload's deadline: `server.body_timeout_ms` for each `server.max_body_bytes` (or part) of `bytes`.
fn upload_deadline(engine: &Engine, bytes: u64) -> std::time::Duration {
    let server = &engine.config().server;
    let shares = bytes.div_ceil(server.max_body_bytes.max(1) as u64).max(1);
    std::time::Duration::from_millis(server.body_timeout_ms.saturating_mul(shares))
}

/// The `purpose` and `file` fields of an upload, the file's bytes written to `to` as they arrive: its name
/// and size.
async fn read_upload(
    mut form: Multipart,
    to: &std::path::Path,
    max_file_bytes: u64,
) -> Result<(Option<String>, Option<(String, u64)>), ApiError> {
    let (mut purpose, mut file) = (None, None);
    while let Some(field) = form.next_field().await.map_err(bad_multipart)? {
        match field.name() {
            Some("purpose") => {
                let text = field.text().await;
                purpose = Some(text.map_err(|e| ApiError::invalid("purpose", e.to_string()))?);
            }
            Some("file") if file.is_some() => {
                return Err(ApiError::invalid("file", "more than one `file` part"))
            }
            Some("file") => {
                let name = field.file_name().unwrap_or("upload.jsonl").to_string();
                file = Some((name, write_field(field, to, max_file_bytes).await?));
            }
            _ => {}
        }
    }
    Ok((purpose, file))
}

/// A multipart error: 413 past the route's body limit, else 400.
fn bad_multipart(e: axum::extract::multipart::MultipartError) -> ApiError {
    if e.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
        return ApiError::TooLarge(format!(
            "the upload passes its limit: {e} (batch.max_file_bytes)"
        ));
    }
    ApiError::invalid("file", format!("bad multipart body: {e}"))
}

/// Streams one multipart field to `to`, at most `max` bytes; how many it held.
async fn write_field(
    mut field: axum::extract::multipart::Field<'_>,
    to: &std::path::Path,
    max: u64,
) -> Result<u64, ApiError> {
    use tokio::io::AsyncWriteExt;
    let failed = |e: std::io::Error| ApiError::Internal(format!("cannot stage the upload: {e}"));
    let file = tokio::fs::File::create(to).await.map_err(failed)?;
    let mut out = tokio::io::BufWriter::with_capacity(1 << 20, file);
    let mut n = 0u64;
    while let Some(chunk) = field.chunk().await.map_err(bad_multipart)? {
        n += chunk.len() as u64;
        if n > max {
            return Err(ApiError::TooLarge(format!(
                "the file passes {max} bytes (batch.max_file_bytes)"
            )));
        }
        out.write_all(&chunk).await.map_err(failed)?;
    }
    out.flush().await.map_err(failed)?;
    Ok(n)
}

/// `GET /v1/files/{id}`.
async fn file(
    Extension(s): Extension<Service>,
    Extension(tenant): Extension<TenantId>,
    Path(id): Path<String>,
) -> Response {
    reply(s.file(&tenant, &id))
}

/// `GET /v1/files/{id}/content`, streamed from disk.
async fn content(
    Extension(s): Extension<Service>,
    Extension(tenant): Extension<TenantId>,
    Path(id): Path<String>,
) -> Response {
    let open = async {
        let path = s.content(&tenant, &id)?;
        let file = tokio::fs::File::open(path)
            .await
            .map_err(|e| ApiError::Internal(format!("file `{id}`: {e}")))?;
        let len = file.metadata().await.map(|m| m.len()).ok();
        Ok::<_, ApiError>((file, len))
    };
    match open.await {
        Ok((file, len)) => {
            let mut resp = axum::body::Body::from_stream(chunks(file)).into_response();
            let h = resp.headers_mut();
            h.insert(
                "content-type",
                axum::http::HeaderValue::from_static("application/jsonl"),
            );
            if let Some(len) = len {
                h.insert("content-length", axum::http::HeaderValue::from(len));
            }
            resp
        }
        Err(e) => e.into_response(),
    }
}

/// A file's bytes, 64 KiB at a time.
fn chunks(
    file: tokio::fs::File,
) -> impl futures_util::Stream<Item = std::io::Result<axum::body::Bytes>> {
    futures_util::stream::try_unfold(file, |mut file| async move {
        use tokio::io::AsyncReadExt;
        let mut buf = vec![0u8; 64 << 10];
        let n = file.read(&mut buf).await?;
        buf.truncate(n);
        Ok((n > 0).then(|| (axum::body::Bytes::from(buf), file)))
    })
}

/// `POST /v1/batches`.
async fn create(
    State(engine): State<Engine>,
    Extension(s): Extension<Service>,
    Extension(tenant): Extension<TenantId>,
    ApiJson(body): ApiJson<Value>,
) -> Response {
    reply(s.create(&engine, &tenant, &body))
}

/// `GET /v1/batches/{id}`.
async fn batch(
    Extension(s): Extension<Service>,
    Extension(tenant): Extension<TenantId>,
    Path(id): Path<String>,
) -> Response {
    reply(s.batch(&tenant, &id))
}

/// `POST /v1/batches/{id}/cancel`: an open batch moves to `cancelling`, then `cancelled` once the lines in
/// flight end.
async fn cancel(
    Extension(s): Extension<Service>,
    Extension(tenant): Extension<TenantId>,
    Path(id): Path<String>,
) -> Response {
    reply(s.cancel(&tenant, &id))
}

/// `GET /admin/batches` (admin listener): per tenant, its files, their bytes and its batches by status;
/// `?tenant=NAME` also lists that tenant's batches (newest 100).
async fn overview(
    Extension(s): Extension<Service>,
    State(engine): State<Engine>,
    crate::auth::Peer(peer): crate::auth::Peer,
    headers: axum::http::HeaderMap,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    if let Err(e) = crate::auth::authorize_admin(engine.admin_token(), &headers, peer) {
        return e.into_response();
    }
    reply(s.overview(q.get("tenant").map(String::as_str)))
}
