//! The reranker worker: an [`Engine`] trait with a mistralrs engine (`llm`, the only module that uses
//! mistralrs) and a deterministic stub engine, the score fusion, and the job loop that serves the
//! shared-memory queue. Must not depend on axum; the server talks to this process only through the queue.

pub mod engine;
pub mod fusion;
#[cfg(feature = "llm")]
pub mod llm;
pub mod serve;
pub mod stub;

pub use engine::{Engine, EngineError, Scored};
