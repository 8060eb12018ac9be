//! The tiergate engine: everything a request goes through between the HTTP adapter (`tiergate-server`) and
//! the models, with no HTTP in it. [`state::AppState`] is built once from the config; a request is a
//! [`request::ValidChat`]; [`cascade`] decides (θ against ambiguity, the out-of-scope verdict, the error bound)
//! and escalates through the route's stages ([`attempt`], [`select`], [`fusion`], [`judge`]) to the LLM side
//! ([`llm`]: submit, [`fair`] share, [`breaker`], [`deadline`] service times, [`priority`]); what became of it
//! is a [`cascade::Meta`] and an [`outcome::Outcome`]. Refusals are [`error::EngineError`], which the adapter
//! maps to its status codes in one place.
//!
//! Must not depend on axum or any HTTP crate (tests/tests/layout.rs), nor on mistralrs: the LLM runs in
//! `tiergate-reranker` processes, reached through `tiergate-queue`.

pub mod answered;
pub mod attempt;
pub mod auditor;
pub mod breaker;
pub mod brownout;
pub mod cache;
pub mod cached;
pub mod cascade;
pub mod deadline;
pub mod error;
pub mod experiments;
pub mod fair;
pub mod fleet;
pub mod fusion;
pub mod head_swap;
pub mod heads;
pub mod history;
pub mod judge;
pub mod ledger;
pub mod llm;
pub mod metrics;
pub mod out_of_scope;
pub mod outcome;
pub mod policy;
pub mod preflight;
pub mod priority;
pub mod record;
pub mod request;
pub mod risk;
pub mod route;
pub mod route_table;
pub mod second_opinion;
pub mod select;
pub mod state;
pub mod store;
pub mod tenant_sync;
pub mod tenants;
pub mod trace;
pub mod util;
