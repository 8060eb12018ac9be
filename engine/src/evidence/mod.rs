//! Evidence: the decision ledger that feedback and audits join ([`ledger`]), the LLM's background scoring of
//! audited answers ([`auditor`], [`second_opinion`]) and the records `tiergate distill` learns from
//! ([`record`]).

pub(crate) mod auditor;
pub mod ledger;
pub(crate) mod record;

use std::sync::Arc;

/// The evidence part of the state.
pub(crate) struct Evidence {
    /// Decision records, feedback and audits (`[feedback]`).
    pub ledger: Option<Arc<ledger::Ledger>>,
    /// The LLM's background scoring of audited answers (`[feedback] audit_llm`, with a ledger).
    pub auditor: Option<auditor::Auditor>,
    /// Where escalations are recorded for distillation (`server.record_escalations`).
    pub recorder: Option<record::Recorder>,
}
