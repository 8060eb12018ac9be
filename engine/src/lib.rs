//! The tiergate engine: everything a request goes through between a door (the HTTP adapter,
//! `tiergate-server`; the batch runner) and the models, with no HTTP in it. [`state::AppState`] is built once
//! from the config; a door validates its request into an [`answer::request::Request`] and makes the one
//! call, [`answer::answer`], which returns a value (a label, a text, or a started generation) with its
//! [`answer::outcome::Outcome`], or refuses with an [`error::EngineError`] that each door maps to its own
//! error shape in one place.
//!
//! The state lives in wings, one folder each:
//!
//! | wing | what lives there |
//! |---|---|
//! | [`answer`] | the request path: the one call, Tier-0's decision, the cascade, one generation path, the records of an answer |
//! | [`routing`] | routes and their stages, the θ policy and its shared store, the error bound, live head swaps, experiments, fusion |
//! | [`backends`] | the LLM side: submission, fair share, service times, the batch gate, the worker's preflight |
//! | [`load`] | utilisation, the brownout ladder, the fleet's Prometheus signal, the console's history |
//! | [`tenancy`] | tenants (keys, routes, weights, budgets) and their sync across replicas |
//! | [`deps`] | the dependencies (Redis in its uses): each call behind a deadline and a breaker; the breaker |
//! | [`evidence`] | the decision ledger, audits, the LLM's second opinion, distillation records |
//! | [`cache`] | Tier −1, the answer cache, and its step in the cascade |
//!
//! Beside them, [`batch`] holds the two traits that join the Batch API to the server without either crate
//! naming the other: the service the server's routes call, and the door the service's runner answers lines
//! through.
//!
//! Must not depend on axum or any HTTP crate (tests/tests/layout.rs), nor on mistralrs: the LLM runs in
//! `tiergate-reranker` processes, reached through `tiergate-queue`.

pub mod answer;
mod backends;
pub mod batch;
pub(crate) mod cache;
#[cfg(test)]
mod costs;
mod deps;
mod engine;
pub mod error;
pub mod evidence;
mod load;
pub mod metrics;
pub mod model;
mod routing;
mod state;
mod tasks;
mod tenancy;
#[doc(hidden)]
pub mod testing;

pub use backends::llm::Llm;
pub use backends::priority::Gate;
pub use engine::{Engine, PolicyChange, PolicyTarget, Verdict, WeakEngine};
pub use routing::heads::StartRequest;
pub use state::start_llm;
pub use tenancy::tenants::Quotas;
