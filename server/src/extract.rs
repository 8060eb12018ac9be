//! A JSON extractor whose rejections use our error shape (malformed JSON, wrong types, wrong content type,
//! oversize body).

use axum::extract::rejection::JsonRejection;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use serde::de::DeserializeOwned;

use crate::error::ApiError;

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
        return ApiError::TooLarge;
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
