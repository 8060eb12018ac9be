//! The one mapping from errors to HTTP: every error body is OpenAI's
//! `{"error":{"message","type","param","code"}}`, with the status that fits.

use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// An error answered to an HTTP client.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ApiError {
    /// Malformed or invalid request (400); `param` names the field.
    #[error("{message}")]
    Invalid {
        message: String,
        param: Option<String>,
    },
    /// Unknown `model` (404).
    #[error("{0}")]
    UnknownModel(String),
    /// A `previous_response_id` this tenant has no stored response for — unknown, expired, another
    /// tenant's, or the server stores none (400 `previous_response_not_found`, as OpenAI answers).
    #[error("{0}")]
    PreviousResponseNotFound(String),
    /// No such path (404).
    #[error("{0}")]
    NotFound(String),
    /// Wrong method on a path (405).
    #[error("method not allowed")]
    MethodNotAllowed,
    /// Body over the limit (413).
    #[error("{0}")]
    TooLarge(String),
    /// Admin credentials missing or wrong (401).
    #[error("{0}")]
    Unauthorized(String),
    /// The request head exceeds the limits (431).
    #[error("{0}")]
    HeadersTooLarge(String),
    /// Authenticated as nobody allowed to do this (403).
    #[error("{0}")]
    Forbidden(String),
    /// The request body did not arrive within the server's total deadline (408).
    #[error("{0}")]
    BodyTimeout(String),
    /// `If-Match` does not match the current version (412).
    #[error("{0}")]
    PreconditionFailed(String),
    /// The shared store holds a state this replica may not overwrite (409), e.g. a newer format's policy.
    #[error("{0}")]
    Conflict(String),
    /// Too many requests (429), with a retry hint in seconds.
    #[error("{message}")]
    Overloaded { message: String, retry_after_s: u64 },
    /// A tenant over its request rate (429 `rate_limit_exceeded`), with a retry hint in seconds.
    #[error("{message}")]
    RateLimited { message: String, retry_after_s: u64 },
    /// A tenant's quota (stored bytes, unfinished batches) is used up (429 `insufficient_quota`; no retry
    /// hint: it frees when the tenant's batches end or its files go).
    #[error("{0}")]
    QuotaExceeded(String),
    /// The LLM side cannot serve this request now (503).
    #[error("{0}")]
    Unavailable(String),
    /// A store the request needs cannot be reached now (503 `store_unavailable`).
    #[error("{0}")]
    StoreUnavailable(String),
    /// The error bound needs the LLM for this request and it cannot take it (503 `risk_bound`,
    /// `routing.on_breach = "reject"`).
    #[error("{0}")]
    RiskBound(String),
    /// The answer did not come in time (504).
    #[error("{0}")]
    Timeout(String),
    /// A bug or an unexpected failure (500).
    #[error("{0}")]
    Internal(String),
}

impl ApiError {
    /// A 413 naming the body limit (`limit` bytes when the caller knows it) and its config key.
    pub fn too_large(limit: Option<usize>) -> Self {
        let what = limit.map_or_else(
            || "the server's size limit".to_string(),
            |l| format!("{l} bytes"),
        );
        ApiError::TooLarge(format!(
            "the request body exceeds {what} (server.max_body_bytes)"
        ))
    }

    /// A 400 naming the offending field.
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> Self {
        ApiError::Invalid {
            message: message.into(),
            param: Some(param.into()),
        }
    }

    /// HTTP status, OpenAI error type and code.
    pub fn parts(&self) -> (StatusCode, &'static str, &'static str) {
        match self {
            ApiError::Invalid { .. } => (
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                "invalid_request",
            ),
            ApiError::UnknownModel(_) => (
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                "model_not_found",
            ),
            ApiError::NotFound(_) => (StatusCode::NOT_FOUND, "invalid_request_error", "not_found"),
            ApiError::PreviousResponseNotFound(_) => (
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                "previous_response_not_found",
            ),
            ApiError::MethodNotAllowed => (
                StatusCode::METHOD_NOT_ALLOWED,
                "invalid_request_error",
                "method_not_allowed",
            ),
            ApiError::TooLarge(_) => (
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request_error",
                "request_too_large",
            ),
            ApiError::Unauthorized(_) => (
                StatusCode::UNAUTHORIZED,
                "authentication_error",
                "invalid_api_key",
            ),
            ApiError::HeadersTooLarge(_) => (
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                "invalid_request_error",
                "headers_too_large",
            ),
            ApiError::Forbidden(_) => (StatusCode::FORBIDDEN, "permission_error", "forbidden"),
            ApiError::BodyTimeout(_) => (
                StatusCode::REQUEST_TIMEOUT,
                "invalid_request_error",
                "body_timeout",
            ),
            ApiError::PreconditionFailed(_) => (
                StatusCode::PRECONDITION_FAILED,
                "invalid_request_error",
                "version_mismatch",
            ),
            ApiError::Conflict(_) => (StatusCode::CONFLICT, "invalid_request_error", "conflict"),
            ApiError::Overloaded { .. } => (
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_error",
                "overloaded",
            ),
            ApiError::RateLimited { .. } => (
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_error",
                "rate_limit_exceeded",
            ),
            ApiError::QuotaExceeded(_) => (
                StatusCode::TOO_MANY_REQUESTS,
                "insufficient_quota",
                "insufficient_quota",
            ),
            ApiError::Unavailable(_) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                "llm_unavailable",
            ),
            ApiError::StoreUnavailable(_) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                "store_unavailable",
            ),
            ApiError::RiskBound(_) => (
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                "risk_bound",
            ),
            ApiError::Timeout(_) => (StatusCode::GATEWAY_TIMEOUT, "server_error", "timeout"),
            ApiError::Internal(_) => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                "internal_error",
            ),
        }
    }

    /// The OpenAI-shaped body.
    pub fn body(&self) -> serde_json::Value {
        let (_, kind, code) = self.parts();
        let param = match self {
            ApiError::Invalid { param, .. } => param.clone(),
            ApiError::UnknownModel(_) => Some("model".into()),
            ApiError::PreviousResponseNotFound(_) => Some("previous_response_id".into()),
            _ => None,
        };
        json!({"error": {"message": self.to_string(), "type": kind, "param": param, "code": code}})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, _, _) = self.parts();
        let mut resp = (status, axum::Json(self.body())).into_response();
        if let ApiError::Overloaded { retry_after_s, .. }
        | ApiError::RateLimited { retry_after_s, .. } = &self
        {
            if let Ok(v) = HeaderValue::from_str(&retry_after_s.to_string()) {
                resp.headers_mut().insert("retry-after", v);
            }
        }
        if matches!(
            self,
            ApiError::Unavailable(_) | ApiError::StoreUnavailable(_) | ApiError::RiskBound(_)
        ) {
            resp.headers_mut()
                .insert("retry-after", HeaderValue::from_static("1"));
        }
        resp
    }
}

impl From<tiergate_engine::error::EngineError> for ApiError {
    /// The engine's refusals, each with its status.
    fn from(e: tiergate_engine::error::EngineError) -> Self {
        use tiergate_engine::error::EngineError as E;
        match e {
            E::Invalid { param, message } => ApiError::Invalid {
                message,
                param: (!param.is_empty()).then_some(param),
            },
            E::UnknownRoute(m) => ApiError::UnknownModel(m),
            E::Forbidden(m) => ApiError::Forbidden(m),
            E::Overloaded {
                message,
                retry_after_s,
            } => ApiError::Overloaded {
                message,
                retry_after_s,
            },
            E::RateLimited {
                message,
                retry_after_s,
            } => ApiError::RateLimited {
                message,
                retry_after_s,
            },
            E::Unavailable(m) => ApiError::Unavailable(m),
            E::StoreUnavailable(m) => ApiError::StoreUnavailable(m),
            E::RiskBound(m) => ApiError::RiskBound(m),
            E::Timeout(m) => ApiError::Timeout(m),
            E::Unauthorized(m) => ApiError::Unauthorized(m),
            E::NotFound(m) => ApiError::NotFound(m),
            E::PreconditionFailed(m) => ApiError::PreconditionFailed(m),
            E::Conflict(m) => ApiError::Conflict(m),
            E::Internal(m) => ApiError::Internal(m),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_have_the_openai_shape() {
        let e = ApiError::invalid("temperature", "must be between 0 and 2");
        let b = e.body();
        assert_eq!(b["error"]["param"], "temperature");
        assert_eq!(b["error"]["type"], "invalid_request_error");
        assert_eq!(e.parts().0, StatusCode::BAD_REQUEST);
        for (e, status) in [
            (ApiError::UnknownModel("x".into()), 404),
            (ApiError::MethodNotAllowed, 405),
            (ApiError::too_large(Some(1)), 413),
            (
                ApiError::Overloaded {
                    message: "busy".into(),
                    retry_after_s: 1,
                },
                429,
            ),
            (ApiError::Unavailable("down".into()), 503),
            (ApiError::StoreUnavailable("paused".into()), 503),
            (ApiError::Timeout("late".into()), 504),
            (ApiError::Forbidden("no".into()), 403),
            (ApiError::HeadersTooLarge("big".into()), 431),
            (ApiError::BodyTimeout("slow".into()), 408),
        ] {
            assert_eq!(e.parts().0.as_u16(), status);
            let b = e.body();
            assert!(b["error"]["message"].is_string() && b["error"]["code"].is_string());
        }
    }
}
