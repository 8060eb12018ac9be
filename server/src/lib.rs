//! The tiergate server: the HTTP adapter (axum) over `tiergate-engine` — the OpenAI-compatible API (chat, SSE,
//! models), validation into the engine's request, the admin and ops endpoints, the console, the one mapping from
//! errors to HTTP, and the listeners with their graceful shutdown. What a request goes through between the
//! HTTP edge and the models is the engine's; nothing here decides, escalates or schedules.
//!
//! Must not depend on mistralrs: the LLM runs in `tiergate-reranker` processes, reached via `tiergate-queue`.

pub mod adapt;
pub mod anthropic;
pub mod auth;
pub mod console;
pub mod early;
pub mod error;
pub mod extract;
pub mod fields;
pub mod openai;
pub mod openai_responses;
pub mod openai_tools;
pub mod routes;
pub mod serve;
pub mod trace;
pub mod validate;
