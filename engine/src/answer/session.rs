//! One turn of a session ([`crate::routing::sessions`]): the pin read before the stage is chosen, written once
//! a backend has started the turn. A turn that continues an agent loop — its last message a tool's result
//! (chat's `tool` message, a Responses `function_call_output`, a Messages user turn of `tool_result` blocks:
//! each door makes them `tool` messages) — keeps its pinned stage; a genuine user turn goes to the stage Tier-0
//! steers it to now, up or down (one unsure turn does not hold a conversation on the dear stage for good). On
//! its stage a session goes to its pinned backend first when that backend's breaker lets it and it fits the
//! budget ([`crate::answer::select`]). A pin made under other stages (a config change, a rollout) or older
//! than `sessions.max_age_s` is not applied.

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
    /// Its route's stages as a pin records them.
    route: u64,
    /// It continues an agent loop: its last message is a tool's result.
    in_loop: bool,
    /// A digest of its conversation (its first user message).
    conversation: u64,
}

impl Turn {
    /// Reads `v`'s session pin on `route` (one made under other stages, or past its age, is none).
    pub(crate) async fn open(state: &AppState, route: &Route, v: &Request) -> Self {
        let sessions = &state.routing.sessions;
        let key = v
            .session
            .as_deref()
            .filter(|_| sessions.enabled())
            .map(|s| SessionKey::of(&v.tenant.0, &route.name, &v.asked_model, s));
        let fingerprint = route.stage_fingerprint;
        let max_age_ms = state.config.sessions.max_age_s.saturating_mul(1000);
        let now = crate::model::request::unix_ms();
        let pin = match &key {
            Some(k) => sessions.get(k).await,
            None => None,
        };
        let pin = pin.filter(|p| applies(p, fingerprint, now, max_age_ms));
        Self {
            key,
            pin,
            tenant: v.tenant.0.to_string(),
            route: fingerprint,
            in_loop: v.messages.last().is_some_and(|m| m.role == "tool"),
            conversation: conversation_of(v),
        }
    }

    /// Whether the pin's key is one several conversations share (this turn's or earlier ones').
    fn shared(&self) -> bool {
        self.pin
            .as_ref()
            .is_some_and(|p| p.shared || p.conversation != self.conversation)
    }

    /// The stage the turn runs on (the pinned one within an agent loop, else `steered`) and that stage as
    /// this turn sees it: its pinned backend first, or — a new session on a stage that prefers latency — the
    /// backend [`place`] chooses.
    pub(crate) fn stage<'r>(
        &self,
        state: &AppState,
        route: &'r Route,
        steered: usize,
    ) -> Result<(usize, Cow<'r, Stage>), EngineError> {
        let pinned = self.pin.as_ref().filter(|p| p.stage < route.stages.len());
        let k = match pinned {
            Some(p) if self.in_loop => p.stage,
            _ => steered,
        };
        let stage = route.stages.get(k).ok_or_else(|| {
            EngineError::Internal(format!("route `{}` has no stage {k}", route.name))
        })?;
        Ok(match pinned {
            Some(p)
                if p.stage == k
                    && !self.in_loop
                    && self.shared()
                    && loaded(state, stage, &p.backend) =>
            {
                (k, Cow::Borrowed(stage))
            }
            Some(p) if p.stage == k => (k, Cow::Owned(stage.pinned_to(&p.backend))),
            _ if self.key.is_some() => match place(state, stage) {
                Some(b) => (k, Cow::Owned(stage.pinned_to(&b))),
                None => (k, Cow::Borrowed(stage)),
            },
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
            Some(p) if p.stage > k => "down",
            Some(p) if p.backend == backend => "kept",
            Some(_) => "switched",
        };
        out.session = Some(what);
        let labels = [("route", route.name.clone()), ("outcome", what.to_string())];
        metrics::counter!(m::SESSION_TURNS_TOTAL, &labels).increment(1);
        let born_ms = self
            .pin
            .as_ref()
            .map_or_else(crate::model::request::unix_ms, |p| p.born_ms);
        let shared = self.shared();
        let pin = Pin {
            stage: k,
            backend,
            route: self.route,
            born_ms,
            conversation: self.conversation,
            shared,
        };
        state.routing.sessions.put(&key, &self.tenant, pin);
    }
}

/// Where a new session goes on `stage` when it prefers latency: the backend whose expected wait is lowest
/// given the sessions it already holds — its mean service time × (sessions held + 1) ÷ its slots — among those
/// whose breaker is closed. A backend not yet measured counts at the lowest measured mean (else its prior),
/// so that a conservative prior does not keep every session off it: its first sessions measure it. `None` on
/// a stage that prefers quality (its listed order is the operator's), or with one alternative.
fn place(state: &AppState, stage: &Stage) -> Option<String> {
    use std::time::Duration;
    if stage.prefer != tiergate_config::Prefer::Latency || stage.alternatives.len() < 2 {
        return None;
    }
    let seen: Vec<(&String, Duration, bool, usize)> = stage
        .alternatives
        .iter()
        .filter_map(|(i, name)| {
            let llm = state.backend(*i).filter(|l| l.breaker_closed())?;
            let (mean, measured, slots) = llm.placement();
            Some((name, mean, measured, slots))
        })
        .collect();
    let lowest_measured = seen.iter().filter(|s| s.2).map(|s| s.1).min();
    let sessions = &state.routing.sessions;
    seen.iter()
        .map(|(name, mean, measured, slots)| {
            let mean = match lowest_measured {
                Some(m) if !*measured => m.min(*mean),
                _ => *mean,
            };
            let held = sessions.held_on(name);
            (
                mean.mul_f64((held + 1) as f64 / (*slots).max(1) as f64),
                *name,
            )
        })
        .min_by_key(|c| c.0)
        .map(|(_, n)| n.clone())
}

/// A digest of `v`'s conversation: its first user message (what stays the same from turn to turn of one
/// conversation and differs between conversations sharing a key).
fn conversation_of(v: &Request) -> u64 {
    use sha2::{Digest, Sha256};
    let first = v.messages.iter().find(|m| m.role == "user");
    let d = Sha256::digest(first.map_or("", |m| m.content.as_str()).as_bytes());
    u64::from_le_bytes([d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]])
}

/// Whether `backend` is loaded on `stage`: its predicted completion of a new generation is more than 1.5 times
/// the stage's best (a shared key's pin then yields, and the stage chooses).
fn loaded(state: &AppState, stage: &Stage, backend: &str) -> bool {
    let predicted = |i: usize| state.backend(i).map(|l| l.predict(false, "").0);
    let all: Vec<(&String, std::time::Duration)> = stage
        .alternatives
        .iter()
        .filter_map(|(i, n)| Some((n, predicted(*i)?)))
        .collect();
    let best = all.iter().map(|a| a.1).min();
    let mine = all.iter().find(|a| a.0 == backend).map(|a| a.1);
    matches!((mine, best), (Some(m), Some(b)) if m.as_secs_f64() > 1.5 * b.as_secs_f64())
}

/// Whether a pin read for a route whose stages are `fingerprint` still applies at `now_ms`: made under the
/// same stages and younger than `max_age_ms`.
fn applies(pin: &Pin, fingerprint: u64, now_ms: u64, max_age_ms: u64) -> bool {
    pin.route == fingerprint && now_ms.saturating_sub(pin.born_ms) < max_age_ms
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pin_applies_only_under_its_routes_stages_and_within_its_age() {
        let pin = Pin {
            stage: 1,
            backend: "big".into(),
            route: 42,
            born_ms: 10_000,
            conversation: 1,
            shared: false,
        };
        assert!(applies(&pin, 42, 10_500, 1_000));
        assert!(!applies(&pin, 43, 10_500, 1_000), "stages changed since");
        assert!(!applies(&pin, 42, 11_000, 1_000), "past its age");
    }
}
