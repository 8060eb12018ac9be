//! The reranker worker: an [`Engine`] trait with the LLM engines (`llamacpp` on llama.cpp, the CPU default;
//! `llm`, the only module that uses mistralrs: generation and tokenisation) and a deterministic stub engine; one-pass candidate scoring on a llama
//! forward of our own (`llama`, `scoring`) with prompts rendered from the route's templates (`prompt`); and
//! the job loop that serves the shared-memory queue. Must not depend on axum; the server talks to this
//! process only through the queue. The int8 VNNI kernel (`tiergate_kernels::int8::QDense`) is shared with
//! Tier-0's encoder through the kernels crate; the worker does not depend on Tier-0 (`tests/tests/layout.rs`).

pub mod engine;
pub mod llama;
#[cfg(feature = "llamacpp")]
pub mod llamacpp;
#[cfg(feature = "llm")]
pub mod llm;
pub mod prompt;
pub mod remote;
pub mod scoring;
pub mod serve;
pub mod stub;
pub mod trace;

pub use engine::{Engine, EngineError, Scored};
