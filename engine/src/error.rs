//! Why the engine refuses a request, in kinds every door can say in its own API's shape: each door maps each
//! to its status and error body in one place (`tiergate_server::error`). A refusal that degrades instead
//! (Tier-0 answers) is a [`crate::model::outcome::DegradeReason`], never an error.

use std::time::Duration;

use tiergate_queue::QueueError;

/// A request the engine will not answer.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EngineError {
    /// The request is one the LLM side cannot take as it is (e.g. a conversation too long for a job);
    /// `param` names the field.
    #[error("{message}")]
    Invalid { param: String, message: String },
    /// No route by this name.
    #[error("{0}")]
    UnknownRoute(String),
    /// The tenant may not use this route.
    #[error("{0}")]
    Forbidden(String),
    /// The server is at its in-flight limit, or the brownout ladder sheds this request (retry after
    /// `retry_after_s`).
    #[error("{message}")]
    Overloaded { message: String, retry_after_s: u64 },
    /// The tenant has spent its LLM budget (retry after `retry_after_s`).
    #[error("{message}")]
    RateLimited { message: String, retry_after_s: u64 },
    /// The LLM side cannot serve this request now (full, down, broken, or no LLM at all).
    #[error("{0}")]
    Unavailable(String),
    /// A store this request needs (the feedback ledger, the stored responses, the shared policy) cannot be
    /// reached now, or has not caught up yet; retry.
    #[error("{0}")]
    StoreUnavailable(String),
    /// The error bound needs the LLM for this request and it cannot take it (`routing.on_breach = "reject"`).
    #[error("{0}")]
    RiskBound(String),
    /// The answer did not come, or is predicted not to come, within the request's budget.
    #[error("{0}")]
    Timeout(String),
    /// The caller did not say who it is, or said it with a key this server does not know.
    #[error("{0}")]
    Unauthorized(String),
    /// No such thing (a feedback id, an audit item, a route's stage policy), or this server keeps none.
    #[error("{0}")]
    NotFound(String),
    /// A change named a version that is no longer current (`If-Match`).
    #[error("{0}")]
    PreconditionFailed(String),
    /// The shared store holds a state this replica may not overwrite (a newer format's policy).
    #[error("{0}")]
    Conflict(String),
    /// A bug or an unexpected failure.
    #[error("{0}")]
    Internal(String),
}

impl EngineError {
    /// The HTTP status every door answers this refusal with (the `outcome` of the request metrics; each door
    /// renders it in its own error shape, `tiergate_server::error`).
    pub fn status(&self) -> &'static str {
        match self {
            EngineError::Invalid { .. } => "400",
            EngineError::Unauthorized(_) => "401",
            EngineError::Forbidden(_) => "403",
            EngineError::UnknownRoute(_) | EngineError::NotFound(_) => "404",
            EngineError::Conflict(_) => "409",
            EngineError::PreconditionFailed(_) => "412",
            EngineError::Overloaded { .. } | EngineError::RateLimited { .. } => "429",
            EngineError::Internal(_) => "500",
            EngineError::Unavailable(_)
            | EngineError::StoreUnavailable(_)
            | EngineError::RiskBound(_) => "503",
            EngineError::Timeout(_) => "504",
        }
    }

    /// An invalid field.
    pub(crate) fn invalid(param: impl Into<String>, message: impl Into<String>) -> Self {
        EngineError::Invalid {
            param: param.into(),
            message: message.into(),
        }
    }

    /// The server's one admission limit is reached.
    pub(crate) fn busy() -> Self {
        EngineError::Overloaded {
            message: "server at its in-flight limit; retry shortly".into(),
            retry_after_s: 1,
        }
    }
}

/// A `Retry-After` in whole seconds, at least 1.
pub(crate) fn retry_after(wait: Duration) -> u64 {
    wait.as_secs_f64().ceil().max(1.0) as u64
}

impl From<QueueError> for EngineError {
    /// A failed LLM job where no Tier-0 answer stands in (a generation, or `on_escalation_failure = reject`).
    fn from(e: QueueError) -> Self {
        match e {
            QueueError::Full { .. } => EngineError::Unavailable(format!("{e}: retry later")),
            QueueError::WorkerDown(_) => EngineError::Unavailable(e.to_string()),
            QueueError::DeadlineExceeded => {
                EngineError::Timeout("the LLM did not answer in time".into())
            }
            QueueError::Invalid(m) => EngineError::Invalid {
                param: "messages".into(),
                message: m,
            },
            other => EngineError::Internal(other.to_string()),
        }
    }
}
