//! One turn of a session ([`crate::routing::sessions`]): the pin read before the stage is chosen — a session
//! goes to its pinned stage or a stronger one (a later stage of the route), never a weaker one, and to its
//! pinned backend first when that backend's breaker lets it and it fits the budget ([`crate::answer::select`])
//! — and written once a backend has started the turn.

use std::borrow::Cow;

use crate::error::EngineError;
use crate::metrics as m;
use crate::model::outcome::{Outcome, Tier};
use crate::model::request::Request;
use crate::routing::sessions::{Pin, SessionKey};
use crate::state::{AppState, Route, Stage};

/// A turn: its session's key and pin (none without a session key, or with sessions off).
pub(super) struct Turn {
    key: Option<SessionKey>,
    pin: Option<Pin>,
    tenant: String,
}

impl Turn {
    /// Reads `v`'s session pin on `route`.
    pub(crate) async fn open(state: &AppState, route: &Route, v: &Request) -> Self {
        let sessions = &state.routing.sessions;
        let key = v
            .session
            .as_deref()
            .filter(|_| sessions.enabled())
            .map(|s| SessionKey::of(&v.tenant.0, &route.name, s));
        let pin = match &key {
            Some(k) => sessions.get(k).await,
            None => None,
        };
        Self {
            key,
            pin,
            tenant: v.tenant.0.to_string(),
        }
    }

    /// The stage the turn runs on (`steered`, or the pinned stage when that is stronger) and that stage as
    /// this turn sees it (its pinned backend first).
    pub(crate) fn stage<'r>(
        &self,
        route: &'r Route,
        steered: usize,
    ) -> Result<(usize, Cow<'r, Stage>), EngineError> {
        let pinned = self.pin.as_ref().filter(|p| p.stage < route.stages.len());
        let k = pinned.map_or(steered, |p| p.stage.max(steered));
        let stage = route.stages.get(k).ok_or_else(|| {
            EngineError::Internal(format!("route `{}` has no stage {k}", route.name))
        })?;
        Ok(match pinned {
            Some(p) if p.stage == k => (k, Cow::Owned(stage.pinned_to(&p.backend))),
            _ => (k, Cow::Borrowed(stage)),
        })
    }

    /// Pins the session to the stage and backend that started this turn (an LLM turn; a cached answer moves
    /// nothing), and says in `out` what the pin did.
    pub(crate) fn close(self, state: &AppState, route: &Route, k: usize, out: &mut Outcome) {
        let Some(key) = self.key else {
            return;
        };
        let (Tier::Llm, Some(backend)) = (out.tier, out.backend.clone()) else {
            return;
        };
        let what = match &self.pin {
            None => "new",
            Some(p) if p.stage < k => "up",
            Some(p) if p.backend == backend => "kept",
            Some(_) => "switched",
        };
        out.session = Some(what);
        let labels = [("route", route.name.clone()), ("outcome", what.to_string())];
        metrics::counter!(m::SESSION_TURNS_TOTAL, &labels).increment(1);
        let pin = Pin { stage: k, backend };
        state.routing.sessions.put(&key, &self.tenant, pin);
    }
}
