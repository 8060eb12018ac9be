//! The tiergate server: the OpenAI-compatible HTTP front end (axum), validation, the routing policy with live
//! tuning, metrics, and supervision of the reranker worker processes through the shared-memory queue.
//!
//! Must not depend on mistralrs: the LLM runs in `tiergate-reranker` processes, reached via `tiergate-queue`.

pub mod app;
pub mod auditor;
pub mod auth;
pub mod breaker;
pub mod brownout;
pub mod console;
pub mod deadline;
pub mod error;
pub mod experiments;
pub mod extract;
pub mod fair;
pub mod fleet;
pub mod fusion;
pub mod history;
pub mod judge;
pub mod ledger;
pub mod llm;
pub mod metrics;
pub mod openai;
pub mod out_of_scope;
pub mod outcome;
pub mod policy;
pub mod preflight;
pub mod priority;
pub mod product;
pub mod record;
pub mod risk;
pub mod routes;
pub mod second_opinion;
pub mod select;
pub mod serve;
pub mod store;
pub mod tenant_sync;
pub mod tenants;
pub mod trace;
pub mod util;
pub mod validate;
