//! A request's records, settled once when its answer ends: the request metrics by tier, channel and outcome
//! (`tiergate_request_duration_seconds` is the whole request: a generation's last event, not its first), the
//! console's decision, the tenant's figures, the ledger's decision record and the audit draw. A label or a
//! text settles at once; a generation carries its [`Settle`] and settles at its end, its error, or its drop
//! (a client that went away: outcome `cancelled`). A request that failed after admission is counted by its
//! error's status, so no door has to call back.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::answer::answered::Asked;
use crate::error::EngineError;
use crate::metrics as m;
use crate::model::outcome::Outcome;
use crate::model::request::Request;
use crate::state::AppState;
use crate::tenancy::tenants::TenantId;

/// What the records of one request need, taken when it was admitted.
pub(crate) struct Settle {
    state: Arc<AppState>,
    route: String,
    tenant: TenantId,
    door: &'static str,
    started: Instant,
    asked: Option<Asked>,
    /// A latency experiment's injected delay: left out of the request's duration (its own metrics have it).
    delay: Duration,
}

impl Settle {
    pub(crate) fn of(state: &Arc<AppState>, v: &Request) -> Self {
        Self {
            state: state.clone(),
            route: v.route.clone(),
            tenant: v.tenant.clone(),
            door: v.door,
            started: v.started,
            asked: Asked::of(state, v),
            delay: Duration::ZERO,
        }
    }

    /// The experiment's delay, left out of the request's duration.
    pub(crate) fn delayed(&mut self, delay: Duration) {
        self.delay = delay;
    }

    fn took(&self) -> Duration {
        self.started.elapsed().saturating_sub(self.delay)
    }

    /// An answered request (`ok`), or one whose generation its client left (`cancelled`): every record.
    pub(crate) fn settled(self, out: &Outcome, outcome: &'static str) {
        let took = self.took();
        let (tier, channel) = (out.tier.as_str(), out.channel().as_str());
        metrics::counter!(m::REQUESTS_TOTAL, "route" => self.route.clone(), "tier" => tier, "channel" => channel, "outcome" => outcome, "tenant" => self.tenant.0.to_string(), "door" => self.door).increment(1);
        metrics::histogram!(m::REQUEST_SECONDS, "route" => self.route.clone(), "tier" => tier, "channel" => channel)
            .record(took.as_secs_f64());
        self.state.load.decisions.record(&self.route, out, took);
        self.state.tenancy.figures.answered(&self.tenant, out);
        crate::answer::answered::answered(&self.state, self.asked, out);
    }

    /// An answered request.
    pub(crate) fn ok(self, out: &Outcome) {
        self.settled(out, "ok");
    }

    /// A request that ran and failed: counted by its error's status, and in the tenant's figures.
    pub(crate) fn failed(self, e: &EngineError) {
        metrics::counter!(m::REQUESTS_TOTAL, "route" => self.route.clone(), "tier" => "none", "channel" => "error", "outcome" => e.status(), "tenant" => self.tenant.0.to_string(), "door" => self.door).increment(1);
        self.state.tenancy.figures.failed(&self.tenant);
    }
}
