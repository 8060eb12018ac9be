//! The chat handler's extractors: [`Asking`], what a request says besides its body, read off its parts once;
//! and a JSON extractor whose rejections use our error shape (malformed JSON, wrong types, wrong content type,
//! oversize body).

use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode};
use serde::de::DeserializeOwned;
use tiergate_engine::model::request::TenantId;
use tiergate_engine::Engine;

use crate::error::ApiError;

/// What a chat request says besides its body, read once: who asks (the tenant the key middleware found, else
/// anonymous), a θ it forces (`x-tiergate-threshold`, with whether it presents the admin token: the engine
/// decides whether it may; its error is kept for the routes that classify, which alone read it), its
/// `x-request-id`, and its headers for validation (the budget).
pub struct Asking {
    pub tenant: TenantId,
    pub forced: Result<Option<(f64, bool)>, ApiError>,
    pub request_id: Option<String>,
    pub headers: HeaderMap,
}

impl FromRequestParts<Engine> for Asking {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut Parts,
        engine: &Engine,
    ) -> Result<Self, Self::Rejection> {
        Ok(Self {
            tenant: parts
                .extensions
                .get::<TenantId>()
                .cloned()
                .unwrap_or_else(TenantId::anonymous),
            forced: crate::auth::threshold_asked(engine.admin_token(), &parts.headers),
            request_id: parts
                .headers
                .get("x-request-id")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string),
            headers: parts.headers.clone(),
        })
    }
}

/// `axum::Json` with OpenAI-shaped rejections.
pub struct ApiJson<T>(pub T);

impl<S, T> FromRequest<S> for ApiJson<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        match axum::Json::<T>::from_request(req, state).await {
            Ok(axum::Json(v)) => Ok(ApiJson(v)),
            Err(rejection) => Err(map_rejection(rejection)),
        }
    }
}

fn map_rejection(r: JsonRejection) -> ApiError {
    if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
        return ApiError::too_large(None);
    }
    match r {
        JsonRejection::JsonDataError(e) => ApiError::Invalid {
            message: format!("invalid request body: {}", e.body_text()),
            param: None,
        },
        JsonRejection::JsonSyntaxError(e) => ApiError::Invalid {
            message: format!("malformed JSON: {}", e.body_text()),
            param: None,
        },
        JsonRejection::MissingJsonContentType(_) => ApiError::Invalid {
            message: "expected `Content-Type: application/json`".into(),
            param: None,
        },
        other => ApiError::Invalid {
            message: other.body_text(),
            param: None,
        },
    }
}
