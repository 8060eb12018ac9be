//! What became of a chat request, as values: which tier answered and which channel the request is counted
//! in (metrics, the console, the bench), and the response headers that carry them to clients.

/// The tier whose answer the client got.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Tier {
    /// Tier-0 (the encoder), also when an escalation degraded to it.
    #[default]
    Tier0,
    /// The LLM tier.
    Llm,
    /// Tier −1: an LLM verdict found again in the answer cache (exact or semantic), not computed.
    Cache,
}

impl Tier {
    /// Every tier.
    pub const ALL: [Tier; 3] = [Tier::Tier0, Tier::Llm, Tier::Cache];

    /// The tier named by an `x-tiergate-tier` value.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.as_str() == s)
    }

    /// The `x-tiergate-tier` value and metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Tier0 => "tier0",
            Tier::Llm => "llm",
            Tier::Cache => "cache",
        }
    }
}

/// The channel an answered request is counted in (ordered as listed: reports list them so).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Channel {
    /// Tier-0 answered and no escalation was tried.
    Tier0,
    /// The LLM answered.
    Escalated,
    /// An escalation was tried and Tier-0 answered instead.
    Degraded,
    /// Tier-0 answered that no label covers the query, without an escalation.
    OutOfScope,
    /// An escalation answered from the answer cache (Tier −1): no LLM job ran for it.
    Cache,
}

impl Channel {
    /// Every channel.
    pub const ALL: [Channel; 5] = [
        Channel::Tier0,
        Channel::Escalated,
        Channel::Degraded,
        Channel::OutOfScope,
        Channel::Cache,
    ];

    /// The channel of an answer by `tier`, `degraded` when an escalation fell back, `out_of_scope` when the
    /// answer is the route's out-of-scope outcome (an escalated one stays in its escalation's channel).
    pub fn of(tier: Tier, degraded: bool, out_of_scope: bool) -> Self {
        match (degraded, tier) {
            (true, _) => Channel::Degraded,
            (false, Tier::Llm) => Channel::Escalated,
            (false, Tier::Cache) => Channel::Cache,
            (false, Tier::Tier0) if out_of_scope => Channel::OutOfScope,
            (false, Tier::Tier0) => Channel::Tier0,
        }
    }

    /// The metric label (`channel="…"`), the console's and the bench's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Channel::Tier0 => "tier0",
            Channel::Escalated => "escalated",
            Channel::Degraded => "degraded",
            Channel::OutOfScope => "out_of_scope",
            Channel::Cache => "cache",
        }
    }
}

/// Why an escalation fell back to Tier-0's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DegradeReason {
    /// The server runs no LLM workers.
    NoLlm,
    /// The LLM's in-flight limit (or its queue) is full.
    QueueFull,
    /// No live worker could take the job, or its worker died.
    WorkerDown,
    /// It would not, or did not, finish before its deadline.
    Deadline,
    /// The LLM answered with an error or an unexpected reply.
    LlmError,
    /// The tenant has spent its LLM budget (`llm_seconds_per_min`).
    Budget,
    /// Predicted not to finish within the request's budget: never queued.
    DeadlineUnreachable,
    /// The brownout ladder is at `rerank_only` (answer routes) or `tier0_only`: no escalation.
    Brownout,
    /// The LLM backend's circuit breaker is open (it kept failing).
    BreakerOpen,
    /// The request had to escalate to hold the error bound (`routing.max_error`) and the LLM could not take
    /// it: Tier-0's answer is outside the bound.
    RiskBound,
}

impl DegradeReason {
    /// Every reason.
    pub const ALL: [DegradeReason; 10] = [
        DegradeReason::NoLlm,
        DegradeReason::QueueFull,
        DegradeReason::WorkerDown,
        DegradeReason::Deadline,
        DegradeReason::LlmError,
        DegradeReason::Budget,
        DegradeReason::DeadlineUnreachable,
        DegradeReason::Brownout,
        DegradeReason::BreakerOpen,
        DegradeReason::RiskBound,
    ];

    /// The `x-tiergate-degraded` value and trace attribute.
    pub fn as_str(self) -> &'static str {
        match self {
            DegradeReason::NoLlm => "no_llm",
            DegradeReason::QueueFull => "queue_full",
            DegradeReason::WorkerDown => "worker_down",
            DegradeReason::Deadline => "deadline",
            DegradeReason::LlmError => "llm_error",
            DegradeReason::Budget => "budget",
            DegradeReason::DeadlineUnreachable => "deadline_unreachable",
            DegradeReason::Brownout => "brownout",
            DegradeReason::BreakerOpen => "breaker_open",
            DegradeReason::RiskBound => "risk_bound",
        }
    }
}

/// Response headers that say what became of a request.
pub mod header {
    /// `tier0`, `llm` or `cache`.
    pub const TIER: &str = "x-tiergate-tier";
    /// Why an escalation fell back to Tier-0 (absent when none did).
    pub const DEGRADED: &str = "x-tiergate-degraded";
    /// The answer's confidence.
    pub const CONFIDENCE: &str = "x-tiergate-confidence";
    /// The θ the request was decided with.
    pub const THRESHOLD: &str = "x-tiergate-threshold";
    /// `1` when the answer is the route's out-of-scope outcome (absent otherwise).
    pub const OUT_OF_SCOPE: &str = "x-tiergate-out-of-scope";
    /// The out-of-scope score of a route with an out-of-scope outcome.
    pub const OOS_SCORE: &str = "x-tiergate-oos-score";
    /// The cascade stage whose answer the client got (its name in the route: `stages[].name`, by default its
    /// first backend's).
    pub const STAGE: &str = "x-tiergate-stage";
    /// The LLM backend of that stage that answered (one of the stage's alternatives).
    pub const BACKEND: &str = "x-tiergate-backend";
    /// The version of the head that classified the request (classified routes).
    pub const HEAD_VERSION: &str = "x-tiergate-head-version";
    /// `exact` or `semantic` when the answer came from the answer cache (absent otherwise).
    pub const CACHE: &str = "x-tiergate-cache";
    /// The cosine between the query and the cached one (1 for an exact hit).
    pub const CACHE_SIMILARITY: &str = "x-tiergate-cache-similarity";
    /// The latency experiment's variant a request was assigned (`control` included), on a route one names.
    pub const VARIANT: &str = "x-tiergate-variant";
    /// A request's own time budget in ms (at most its route's `max_deadline_ms`).
    pub const DEADLINE: &str = "x-tiergate-deadline-ms";
    /// The brownout ladder's step, while it is above `normal`.
    pub const BROWNOUT: &str = "x-tiergate-brownout";
    /// Earlier user turns Tier-0 read with the last one (absent when none).
    pub const CONTEXT: &str = "x-tiergate-context-turns";
    /// What a session's pin did for this turn: `new`, `kept`, `up` / `down` (a later / earlier stage than the
    /// pin's), `switched` (its backend could not take it: breaker or budget); absent without a session key.
    pub const SESSION: &str = "x-tiergate-session";
    /// A pinned session's turn that Tier-0 steered to another stage: whether it moved and the move's price
    /// (`moved; why=saving; saving_ms=…; cost_ms=…; budget_ms=…`).
    pub const SWITCH: &str = "x-tiergate-switch";
    /// A request's switch budget, percent of its session's spend (lowers its route's
    /// `steer.max_switch_spend_pct`).
    pub const MAX_SWITCH_SPEND_PCT: &str = "x-tiergate-max-switch-spend-pct";
    /// The session key a request named (`x-session-id`; else its `user`).
    pub const SESSION_ID: &str = "x-session-id";
    /// The request fields accepted but not honoured, by name (docs/api.md, "Fields set aside").
    pub const SET_ASIDE: &str = "x-tiergate-set-aside";
    /// The `max_tokens` a request was given when it asked for more than its route allows.
    pub const MAX_TOKENS: &str = "x-tiergate-max-tokens";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channels_from_tier_and_fallback() {
        assert_eq!(Channel::of(Tier::Tier0, false, false), Channel::Tier0);
        assert_eq!(Channel::of(Tier::Llm, false, false), Channel::Escalated);
        assert_eq!(Channel::of(Tier::Tier0, true, false), Channel::Degraded);
        assert_eq!(Channel::of(Tier::Tier0, false, true), Channel::OutOfScope);
        // The LLM's "none of these", and a degraded escalation's out-of-scope fallback, keep their channel.
        assert_eq!(Channel::of(Tier::Llm, false, true), Channel::Escalated);
        assert_eq!(Channel::of(Tier::Tier0, true, true), Channel::Degraded);
        assert_eq!(Channel::of(Tier::Cache, false, false), Channel::Cache);
        assert_eq!(Channel::of(Tier::Cache, false, true), Channel::Cache);
        assert_eq!(Channel::of(Tier::Cache, true, false), Channel::Degraded);
        assert_eq!(Tier::default().as_str(), "tier0");
        assert_eq!(Channel::Degraded.as_str(), "degraded");
        assert_eq!(DegradeReason::QueueFull.as_str(), "queue_full");
        for t in Tier::ALL {
            assert_eq!(Tier::parse(t.as_str()), Some(t));
        }
        assert_eq!(Tier::parse("tier9"), None);
    }
}
