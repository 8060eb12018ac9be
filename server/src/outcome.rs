//! What became of an answered chat request, as a value the handlers return beside the response: metrics,
//! the console's decision table and the escalation records read it, never the response's headers.

pub use tiergate_core::outcome::{Channel, DegradeReason, Tier};

/// An answered request's outcome.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The tier whose answer the client got.
    pub tier: Tier,
    /// Why an escalation fell back to Tier-0, when one did.
    pub degraded: Option<DegradeReason>,
    /// The answer's confidence (classified routes).
    pub confidence: Option<f32>,
    /// The θ it was decided with (classified routes).
    pub threshold: Option<f64>,
    /// The label answered (classified routes, not an LLM-written answer).
    pub label: Option<String>,
}

impl Outcome {
    /// The channel it is counted in.
    pub fn channel(&self) -> Channel {
        Channel::of(self.tier, self.degraded.is_some())
    }
}
