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
use tiergate_engine::batch::{BatchError, BatchService, Page, Upload};
use tiergate_engine::model::request::TenantId;
use tiergate_engine::Engine;

use crate::error::ApiError;
use crate::extract::ApiJson;

/// The service as the handlers hold it.
type Service = Arc<dyn BatchService>;

/// The public routes; an upload may be `batch.max_file_bytes` plus its multipart framing.
pub fn routes(service: Service) -> Router<Engine> {
    let files_limit = usize::try_from(service.max_file_bytes()).unwrap_or(usize::MAX);
    Router::new()
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
            BatchError::Unavailable(m) => ApiError::Unavailable(m),
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

/// `POST /v1/files`: a multipart upload (`file`, `purpose = batch`).
async fn upload(
    State(engine): State<Engine>,
    Extension(s): Extension<Service>,
    Extension(tenant): Extension<TenantId>,
    form: Multipart,
) -> Response {
    let (purpose, file) = match read_upload(form, s.max_file_bytes()).await {
        Ok(parts) => parts,
        Err(e) => return e.into_response(),
    };
    let up = Upload {
        purpose: purpose.as_deref(),
        file: file.as_ref().map(|(n, b)| (n.as_str(), b.as_ref())),
    };
    reply(s.upload(&engine, &tenant, up))
}

/// The `purpose` and `file` fields of an upload.
async fn read_upload(
    mut form: Multipart,
    max_file_bytes: u64,
) -> Result<(Option<String>, Option<(String, axum::body::Bytes)>), ApiError> {
    let (mut purpose, mut file) = (None, None);
    while let Some(field) = form
        .next_field()
        .await
        .map_err(|e| ApiError::invalid("file", format!("bad multipart body: {e}")))?
    {
        match field.name() {
            Some("purpose") => {
                let text = field.text().await;
                purpose = Some(text.map_err(|e| ApiError::invalid("purpose", e.to_string()))?);
            }
            Some("file") => {
                let name = field.file_name().unwrap_or("upload.jsonl").to_string();
                let bytes = field.bytes().await.map_err(|e| {
                    ApiError::invalid(
                        "file",
                        format!("{e} (batch.max_file_bytes = {max_file_bytes})"),
                    )
                })?;
                file = Some((name, bytes));
            }
            _ => {}
        }
    }
    Ok((purpose, file))
}

/// `GET /v1/files/{id}`.
async fn file(
    Extension(s): Extension<Service>,
    Extension(tenant): Extension<TenantId>,
    Path(id): Path<String>,
) -> Response {
    reply(s.file(&tenant, &id))
}

/// `GET /v1/files/{id}/content`.
async fn content(
    Extension(s): Extension<Service>,
    Extension(tenant): Extension<TenantId>,
    Path(id): Path<String>,
) -> Response {
    let read = async {
        let path = s.content(&tenant, &id)?;
        tokio::fs::read(path)
            .await
            .map_err(|e| ApiError::Internal(format!("file `{id}`: {e}")))
    };
    match read.await {
        Ok(bytes) => ([("content-type", "application/jsonl")], bytes).into_response(),
        Err(e) => e.into_response(),
    }
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
