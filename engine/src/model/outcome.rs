//! What became of a request ([`Outcome`]), as a value the engine returns with its answer, and the last
//! decisions kept for the console ([`Decisions`]).

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

pub(crate) use tiergate_core::outcome::{Channel, DegradeReason, Tier};

/// Decisions kept for the console.
const KEEP: usize = 200;

/// What became of a request: the tier whose answer the client got, why it degraded, the stage and backend
/// that answered, θ, the cache and the timings. The engine fills it in as the request goes; the doors render
/// their headers from it, and metrics, the console's decision table ([`Decisions`]) and the ledger read it.
#[derive(Debug, Clone, Default)]
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
    /// The answer is the route's out-of-scope outcome.
    pub out_of_scope: bool,
    /// Tier-0's out-of-scope score (routes with an out-of-scope outcome).
    pub oos_score: Option<f32>,
    /// Tier-0's ambiguity (classified routes).
    pub ambiguity: Option<f64>,
    /// Tier-0's top candidates by label (classified routes).
    pub top: Vec<(String, f32)>,
    /// The cascade stage that answered, by its name in the route, when an LLM did.
    pub stage: Option<String>,
    /// The backend of that stage that answered (one of its alternatives).
    pub backend: Option<String>,
    /// Earlier user turns Tier-0 read with the last one (`context_turns`): such an answer is outside the
    /// error bound's calibration.
    pub context: usize,
    /// What the session's pin did (`new`, `kept`, `up`, `down`, `switched`), for a turn with a session key.
    pub session: Option<&'static str>,
    /// The price of a move between stages this turn was steered to (a pinned session's genuine turn).
    pub switch: Option<SwitchPrice>,
    /// The version of the head that classified it (classified routes).
    pub head: Option<String>,
    /// θ was forced by an operator's override header: the answer is no evidence about the traffic.
    pub forced: bool,
    /// How the answer cache answered, when it did.
    pub cache: Option<CacheHit>,
    /// The brownout step the request was admitted under.
    pub brownout: Step,
    /// The version of the routing policy in force when it was admitted.
    pub policy_version: u64,
    /// The latency experiment's variant it was assigned (`control` included), on a route one names.
    pub variant: Option<String>,
    /// Where its time went.
    pub timings: Timings,
}

/// An answer from the cache: `exact` or `semantic`, and the cosine to the cached query.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CacheHit {
    pub kind: tiergate_cache::HitKind,
    pub similarity: f32,
}

/// Where a request's time went, in milliseconds (a door's `Server-Timing`).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Timings {
    /// From arrival to Tier-0's prediction.
    pub prefilter_ms: f64,
    /// The encoder's forward pass (Tier-0's model time).
    pub infer_ms: f64,
    /// From an LLM job's submission to its first event.
    pub queue_ms: f64,
    /// The LLM's reranks.
    pub rerank_ms: f64,
    /// A collected generation, from submit to its last token (the LLM's time).
    pub generation_ms: f64,
}

impl Timings {
    /// Time spent in models (Tier-0's forward, the LLM's rerank or collected generation), as known when the
    /// headers are written: everything else is the serving overhead.
    pub fn model_ms(&self) -> f64 {
        self.infer_ms + self.rerank_ms + self.generation_ms
    }
}

impl Outcome {
    /// The channel it is counted in.
    pub(crate) fn channel(&self) -> Channel {
        Channel::of(self.tier, self.degraded.is_some(), self.out_of_scope)
    }
}

/// One answered request, as the console lists it.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Decision {
    /// Unix time, milliseconds.
    pub t_ms: u64,
    /// The route (`model`).
    pub route: String,
    /// Ambiguity 1 − max p (classified routes).
    pub a: Option<f64>,
    /// θ the decision used.
    pub theta: Option<f64>,
    /// `tier0`, `escalated`, `degraded` or `out_of_scope`.
    pub channel: &'static str,
    /// Tier-0's out-of-scope score (routes with an out-of-scope outcome).
    pub oos: Option<f32>,
    /// The answer is the route's out-of-scope outcome (also when the LLM chose "none of these").
    pub out_of_scope: bool,
    /// The label answered (classified routes).
    pub label: Option<String>,
    /// End-to-end latency, milliseconds.
    pub latency_ms: f64,
    /// What the turn did to its session's pin, when it had a session.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session: Option<&'static str>,
    /// The price of a move between stages it was steered to.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub switch: Option<SwitchPrice>,
    #[serde(skip)]
    at: Option<Instant>,
}

impl Decision {
    /// How long ago it was recorded (never for a decision without a time).
    pub(crate) fn age(&self, now: Instant) -> Duration {
        self.at
            .map_or(Duration::MAX, |t| now.saturating_duration_since(t))
    }
}

/// The last answered requests (at most [`KEEP`]), for the console.
#[derive(Debug, Default)]
pub(crate) struct Decisions(Mutex<VecDeque<Decision>>);

impl Decisions {
    /// The kept decisions, oldest first.
    pub(crate) fn recent(&self) -> Vec<Decision> {
        self.0
            .lock()
            .map(|q| q.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Records an answered request's outcome.
    pub(crate) fn record(&self, route: &str, outcome: &Outcome, took: Duration) {
        let d = Decision {
            t_ms: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            route: route.to_string(),
            a: outcome.confidence.map(|c| 1.0 - f64::from(c)),
            theta: outcome.threshold,
            channel: outcome.channel().as_str(),
            oos: outcome.oos_score,
            out_of_scope: outcome.out_of_scope,
            label: outcome.label.clone(),
            latency_ms: took.as_secs_f64() * 1e3,
            session: outcome.session,
            switch: outcome.switch.clone(),
            at: Some(Instant::now()),
        };
        if let Ok(mut q) = self.0.lock() {
            q.push_back(d);
            while q.len() > KEEP {
                q.pop_front();
            }
        }
    }
}

/// The brownout ladder's step a request is admitted under ([`crate::load::brownout`] climbs it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub enum Step {
    #[default]
    Normal = 0,
    RerankOnly = 1,
    Tier0Only = 2,
    Shed = 3,
}

impl Step {
    pub(crate) const ALL: [Step; 4] = [Step::Normal, Step::RerankOnly, Step::Tier0Only, Step::Shed];

    /// Its name (header, console, logs).
    pub fn as_str(self) -> &'static str {
        match self {
            Step::Normal => "normal",
            Step::RerankOnly => "rerank_only",
            Step::Tier0Only => "tier0_only",
            Step::Shed => "shed",
        }
    }

    pub(crate) fn up(self) -> Step {
        Step::ALL[(self as usize + 1).min(3)]
    }

    pub(crate) fn down(self) -> Step {
        Step::ALL[(self as usize).saturating_sub(1)]
    }

    /// Whether a generation (a generate route's, or an answer route's escalation) may run an LLM job: not
    /// from `rerank_only` on (the answer cache still answers what it holds).
    pub(crate) fn generates(self) -> bool {
        self < Step::RerankOnly
    }

    /// Whether a rerank may run an LLM job: not from `tier0_only` on.
    pub(crate) fn reranks(self) -> bool {
        self < Step::Tier0Only
    }

    /// Whether a cascade goes past its first stage: only at `normal` (it sheds its bigger stages first).
    pub(crate) fn cascades(self) -> bool {
        self == Step::Normal
    }

    /// From its number (0 beyond the ladder).
    pub(crate) fn of(n: u8) -> Step {
        Step::ALL.get(n as usize).copied().unwrap_or(Step::Normal)
    }
}

/// What moving would save and cost, and whether the turn moved.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SwitchPrice {
    pub moved: bool,
    /// `saving` (down, worth it), `quality` (up), `dear` (down, not worth it), `budget` (past the session's
    /// switch budget), `unmeasured` (no figures to price it: Tier-0 followed), `stay` (`switch = "stay"`).
    pub why: String,
    pub saving_ms: f64,
    pub cost_ms: f64,
    /// What the session's budget had left for this move.
    pub budget_ms: f64,
}

impl SwitchPrice {
    /// A decision made without a price (`stay`, `unmeasured`).
    pub(crate) fn unpriced(moved: bool, why: &str) -> Self {
        Self {
            moved,
            why: why.into(),
            saving_ms: 0.0,
            cost_ms: 0.0,
            budget_ms: 0.0,
        }
    }
}

/// As the `x-tiergate-switch` header says it.
impl std::fmt::Display for SwitchPrice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}; why={}; saving_ms={:.0}; cost_ms={:.0}; budget_ms={:.0}",
            if self.moved { "moved" } else { "stayed" },
            self.why,
            self.saving_ms,
            self.cost_ms,
            self.budget_ms
        )
    }
}
