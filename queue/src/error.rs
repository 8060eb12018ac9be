//! The queue crate's one error type.

/// Why a job did not get (all of) its answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueueError {
    /// Every slot is taken: the escalation channel is saturated (the server degrades to Tier-0).
    #[error("escalation queue full ({slots} slots in use)")]
    Full { slots: usize },
    /// No live worker, or the worker running the job died and the job could not be retried.
    #[error("reranker worker down: {0}")]
    WorkerDown(String),
    /// The job's deadline passed before its answer was complete.
    #[error("deadline exceeded")]
    DeadlineExceeded,
    /// The job was cancelled (by its submitter, or because the queue is shutting down).
    #[error("cancelled")]
    Cancelled,
    /// The peer wrote something that breaks the protocol; only this job fails.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// The worker ran the job and its engine reported an error.
    #[error("reranker engine: {0}")]
    Engine(String),
    /// The job does not fit a slot, or is otherwise unusable.
    #[error("invalid job: {0}")]
    Invalid(String),
    /// The segment could not be created or opened.
    #[error("shared memory: {0}")]
    Segment(String),
}

/// Result alias for the queue.
pub type Result<T> = std::result::Result<T, QueueError>;
