//! Why the engine refuses a request. The HTTP adapter maps each to its status and OpenAI error type in one
//! place (`tiergate_server::error`); a refusal that degrades instead (Tier-0 answers) is a
//! [`crate::outcome::DegradeReason`], never an error.

/// A request the engine will not answer.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum EngineError {
    /// The LLM job failed where no Tier-0 answer stands in (a generation, or `on_escalation_failure = reject`).
    #[error("{0}")]
    Queue(tiergate_queue::QueueError),
    /// The brownout ladder sheds this request (retry after `retry_after_s`).
    #[error("{message}")]
    Overloaded { message: String, retry_after_s: u64 },
    /// The tenant may not use this route.
    #[error("{0}")]
    Forbidden(String),
    /// The error bound needs the LLM for this request and it cannot take it (`routing.on_breach = "reject"`).
    #[error("{0}")]
    RiskBound(String),
}

impl From<tiergate_queue::QueueError> for EngineError {
    fn from(e: tiergate_queue::QueueError) -> Self {
        EngineError::Queue(e)
    }
}
