//! Tier −1: the answer cache in front of the LLM tier, as pure state that the engine drives and unit tests
//! drive directly. A verdict is found by its exact key (a fingerprint of everything that makes it valid and
//! the normalised text, [`normalise`]) or, failing that, inside Tier-0's top-label bucket by cosine on the
//! Tier-0 embedding — and then only when the [`guards`] agree (same negation, same numbers, amounts, dates
//! and currency, no antonym or entity swap).
//!
//! Owns no I/O (the Redis-shared exact store is the engine's) and must not depend on any tiergate crate but
//! `tiergate-core`.

pub mod guards;
pub mod normalise;
pub mod store;

pub use guards::{Features, GuardError, GuardWords, Guards, Refusal};
pub use normalise::{normalise, tokens};
pub use store::{Hit, HitKind, Limits, Query, Semantic, Store, Weighed};
