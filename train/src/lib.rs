//! Tier-0's offline ML, apart from serving: labelled data files (CSV/JSONL), training a head on a frozen or
//! fine-tuned encoder, distilling recorded escalations into a head, and evaluation (accuracy, calibration,
//! latency, the hybrid's escalation curve). The server's `tiergate train / eval / distill` commands call it;
//! the serving crates do not depend on it (`tests/tests/layout.rs`).

pub mod cache_eval;
pub mod data;
pub mod distill;
pub mod eval;
pub mod fusion;
pub mod harvest;
pub mod open_intent;
pub mod risk;
pub mod train;
