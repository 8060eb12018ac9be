//! The prefilter crate's one error type.

use std::path::PathBuf;

/// Everything that can go wrong in the prefilter.
#[derive(Debug, thiserror::Error)]
pub enum PrefilterError {
    /// A model or head file is missing or unreadable.
    #[error("cannot read {path}: {message}")]
    File { path: PathBuf, message: String },
    /// A model or head file is present but its content is wrong (bad JSON, missing tensor, bad shape).
    #[error("invalid {path}: {message}")]
    Corrupt { path: PathBuf, message: String },
    /// The model type or head is not supported.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// The tokenizer failed on an input.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// A tensor operation failed.
    #[error("inference: {0}")]
    Candle(#[from] candle_core::Error),
    /// The batching queue is full: the caller should back off (HTTP 429).
    #[error("prefilter overloaded: {capacity} requests already waiting")]
    Overloaded { capacity: usize },
    /// The batching thread has stopped.
    #[error("prefilter is shut down")]
    Closed,
    /// A request the prefilter cannot run (e.g. empty text).
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// A training or evaluation data file has a bad row or is unusable.
    #[error("{path}:{line}: {message}")]
    Data {
        path: PathBuf,
        line: usize,
        message: String,
    },
    /// Training could not proceed (too few rows, a label with no examples, …).
    #[error("training: {0}")]
    Training(String),
}

impl PrefilterError {
    pub fn file(path: impl Into<PathBuf>, err: impl std::fmt::Display) -> Self {
        PrefilterError::File {
            path: path.into(),
            message: err.to_string(),
        }
    }
    pub fn corrupt(path: impl Into<PathBuf>, err: impl std::fmt::Display) -> Self {
        PrefilterError::Corrupt {
            path: path.into(),
            message: err.to_string(),
        }
    }
}

/// Result alias for the prefilter.
pub type Result<T> = std::result::Result<T, PrefilterError>;
