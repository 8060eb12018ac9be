//! The reranker worker: an [`Engine`] trait with the LLM engine (`llm`, the only module that uses mistralrs:
//! generation and tokenisation) and a deterministic stub engine; one-pass candidate scoring on a llama
//! forward of our own (`llama`, `scoring`) with prompts rendered from the route's templates (`prompt`); and
//! the job loop that serves the shared-memory queue. Must not depend on axum; the server talks to this
//! process only through the queue. It uses `tiergate-prefilter` for one thing only: the int8 VNNI kernel
//! (`int8::QDense`), shared with Tier-0's encoder.

pub mod engine;
pub mod llama;
#[cfg(feature = "llm")]
pub mod llm;
pub mod prompt;
pub mod remote;
pub mod scoring;
pub mod serve;
pub mod stub;
pub mod trace;

pub use engine::{Engine, EngineError, Scored};
