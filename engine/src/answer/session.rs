//! One turn of a session ([`crate::routing::sessions`]): the pin read before the stage is chosen, written once
//! a backend has started the turn. A turn that continues an agent loop — its last message a tool's result
//! (chat's `tool` message, a Responses `function_call_output`, a Messages user turn of `tool_result` blocks:
//! each door makes them `tool` messages) — keeps its pinned stage; a genuine user turn goes to the stage Tier-0
//! steers it to now, up or down (one unsure turn does not hold a conversation on the dear stage for good). On
//! its stage a session goes to its pinned backend first when that backend's breaker lets it and it fits the
//! budget ([`crate::answer::select`]). A pin made under other stages (a config change, a rollout) or older
//! than `sessions.max_age_s` is not applied. Whether a genuine turn that Tier-0 steers away from the pinned
//! stage moves is `sessions.switch`: priced by default ([`crate::answer::switch`]).

use std::borrow::Cow;

use super::steer::Steer;
use super::switch::{price, reread_ms, tokens_of, turn_ms, Spend, SwitchPrice, Terms, Tokens};
use crate::backends::llm::RateView;
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
    /// Its conversation in tokens: before this turn, and this turn's.
    tokens: Tokens,
    /// Its switch budget, percent of its session's spend (the route's, lowered by the request's header).
    budget_pct: f64,
    /// The price of a move this turn was steered to, once [`Turn::stage`] weighed it.
    price: Option<SwitchPrice>,
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
        // What only a session's turn weighs: a turn without a key reads no digest or size of its conversation.
        let pinned = key.is_some();
        let route_pct = route
            .steer
            .as_ref()
            .map_or(100.0, |s| s.max_switch_spend_pct);
        Self {
            key,
            pin,
            tenant: v.tenant.0.to_string(),
            route: fingerprint,
            in_loop: v.messages.last().is_some_and(|m| m.role == "tool"),
            conversation: if pinned { conversation_of(v) } else { 0 },
            tokens: if pinned {
                tokens_in(v)
            } else {
                Tokens {
                    held: 0.0,
                    new: 0.0,
                }
            },
            budget_pct: v
                .max_switch_spend_pct
                .map_or(route_pct, |h| h.min(route_pct)),
            price: None,
        }
    }

    /// Whether the pin's key is one several conversations share (this turn's or earlier ones').
    fn shared(&self) -> bool {
        self.pin
            .as_ref()
            .is_some_and(|p| p.shared || p.conversation != self.conversation)
    }

    /// The stage the turn runs on (the pinned one within an agent loop; a genuine turn's steered one when
    /// `sessions.switch` lets it move there) and that stage as this turn sees it: its pinned backend first,
    /// or — a new session on a stage that prefers latency — the backend [`place`] chooses.
    pub(crate) fn stage<'r>(
        &mut self,
        state: &AppState,
        route: &'r Route,
        steered: Steer,
    ) -> Result<(usize, Cow<'r, Stage>), EngineError> {
        let pinned = self.pin.clone().filter(|p| p.stage < route.stages.len());
        let k = match &pinned {
            Some(p) if self.in_loop => p.stage,
            Some(p) if p.stage != steered.stage => self.moved_to(state, route, p, steered),
            _ => steered.stage,
        };
        let stage = route.stages.get(k).ok_or_else(|| {
            EngineError::Internal(format!("route `{}` has no stage {k}", route.name))
        })?;
        Ok(match &pinned {
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

    /// Where a genuine turn steered to another stage than its pin's goes, by `sessions.switch`; a priced
    /// move's price is kept for the turn's outcome.
    fn moved_to(&mut self, state: &AppState, route: &Route, pin: &Pin, steered: Steer) -> usize {
        use tiergate_config::SwitchMode;
        let (to, from) = (steered.stage, pin.stage);
        match state.config.sessions.switch {
            SwitchMode::Follow => to,
            SwitchMode::Stay => {
                self.price = Some(SwitchPrice::unpriced(false, "stay"));
                from
            }
            SwitchMode::Priced => {
                let target = route
                    .stages
                    .get(to)
                    .map(|s| target_of(state, s))
                    .unwrap_or_default();
                let terms = Terms {
                    confidence: steered.confidence,
                    tokens: self.tokens,
                    retained: retained(state, pin, &target, self.tokens.held),
                    waits_ms: (
                        wait_ms(state, &pin.backend, &self.tenant),
                        wait_ms(state, &target, &self.tenant),
                    ),
                    horizon_turns: state.config.sessions.switch_horizon_turns,
                    budget_pct: self.budget_pct,
                    spent: pin.spent,
                };
                let p = price(
                    &rates_of(state, &pin.backend),
                    &rates_of(state, &target),
                    terms,
                );
                let k = if p.moved { to } else { from };
                self.price = Some(p);
                k
            }
        }
    }

    /// Pins the session to the stage and backend that started this turn (an LLM turn; a cached answer moves
    /// nothing), and says in `out` what the pin did.
    pub(crate) fn close(mut self, state: &AppState, route: &Route, k: usize, out: &mut Outcome) {
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
        let spent = self.spent(state, &backend);
        // Where the session leaves, and what that backend holds of its conversation.
        let left = match &self.pin {
            Some(p) if p.backend != backend => {
                (Pin::backend_digest(&p.backend), self.tokens.held as u32)
            }
            Some(p) => p.left,
            None => (0, 0),
        };
        out.switch = self.price.take();
        let pin = Pin {
            stage: k,
            backend,
            route: self.route,
            born_ms,
            conversation: self.conversation,
            shared,
            spent,
            left,
        };
        state.routing.sessions.put(&key, &self.tenant, pin);
    }
}

impl Turn {
    /// The session's spend with this turn on `backend`: the turn's time there (a new session's whole
    /// conversation read) and a move's cost.
    fn spent(&self, state: &AppState, backend: &str) -> Spend {
        let mut spent = self.pin.as_ref().map(|p| p.spent).unwrap_or_default();
        let r = rates_of(state, backend);
        let read = match &self.pin {
            None => reread_ms(&r, self.tokens.held),
            Some(_) => Some(0.0),
        };
        spent.total_ms += turn_ms(&r, self.tokens.new).unwrap_or(0.0) + read.unwrap_or(0.0);
        if let Some(p) = self.price.as_ref().filter(|p| p.moved) {
            spent.total_ms += p.cost_ms;
            spent.moves_ms += p.cost_ms;
        }
        spent
    }
}

/// Where a turn steered to `stage` would go there: the backend [`place`] chooses, else its first whose
/// breaker is closed, else its first.
fn target_of(state: &AppState, stage: &Stage) -> String {
    place(state, stage)
        .or_else(|| {
            let open = |i: &usize| state.backend(*i).is_some_and(|l| l.breaker_closed());
            stage
                .alternatives
                .iter()
                .find(|(i, _)| open(i))
                .map(|a| a.1.clone())
        })
        .or_else(|| stage.alternatives.first().map(|a| a.1.clone()))
        .unwrap_or_default()
}

/// The backend named `name`.
fn llm_of<'s>(state: &'s AppState, name: &str) -> Option<&'s crate::backends::llm::Llm> {
    state
        .backends
        .iter()
        .find(|b| b.name == name)
        .and_then(|b| b.llm.as_ref())
}

/// The measured figures of the backend named `name` (none for a name no backend has).
fn rates_of(state: &AppState, name: &str) -> RateView {
    llm_of(state, name)
        .map(|l| l.rates.view())
        .unwrap_or_default()
}

/// `tenant`'s predicted wait for a slot on the backend named `name` now, ms.
fn wait_ms(state: &AppState, name: &str, tenant: &str) -> f64 {
    llm_of(state, name).map_or(0.0, |l| {
        let (done, service) = l.predict(false, tenant);
        done.saturating_sub(service).as_secs_f64() * 1e3
    })
}

/// Tokens of the conversation (`held` now) that `target` still holds: what it held when the session left it,
/// while its prompt cache has room for the sessions pinned to it (`prompt_cache_sessions`; unknown: none).
fn retained(state: &AppState, pin: &Pin, target: &str, held: f64) -> f64 {
    let was_there = pin.left.0 != 0 && pin.left.0 == Pin::backend_digest(target);
    let room = llm_of(state, target).is_some_and(|l| {
        let warm = l.limits.warm_sessions;
        warm > 0 && state.routing.sessions.held_on(target) < warm
    });
    if was_there && room {
        f64::from(pin.left.1).min(held)
    } else {
        0.0
    }
}

/// `v`'s conversation in tokens (estimated): up to its last assistant turn (what a backend that wrote that
/// turn holds), and after it.
fn tokens_in(v: &Request) -> Tokens {
    let bytes = |ms: &[crate::model::request::ValidMessage]| -> usize {
        ms.iter()
            .map(|m| {
                m.content.len()
                    + m.tool_calls
                        .iter()
                        .map(|c| c.arguments.len() + c.name.len())
                        .sum::<usize>()
            })
            .sum()
    };
    let split = v
        .messages
        .iter()
        .rposition(|m| m.role == "assistant")
        .map_or(0, |i| i + 1);
    Tokens {
        held: tokens_of(bytes(&v.messages[..split])),
        new: tokens_of(bytes(&v.messages[split..])),
    }
}

/// Whether a turn whose pin did `session` found no warm conversation on its backend (its prefill is a cold
/// one): a new session, a move to another stage or backend.
pub(crate) fn cold(session: Option<&str>) -> bool {
    matches!(session, Some("new" | "up" | "down" | "switched"))
}

/// Where a new session goes on `stage` when it prefers latency: the backend whose expected wait is lowest
/// given the sessions it already holds — its mean service time × (sessions held + 1) ÷ its slots — and its
/// prompt cache's room: on a backend that already keeps as many conversations warm as its cache holds
/// (`prompt_cache_sessions`; the llama.cpp engine's `workers × cached_sequences`), a new session pushes one
/// out, whose next turn reads its conversation again (its mean prompt × its cold prefill time per token is
/// added). Among backends whose breaker is closed; one not yet measured counts at the lowest measured mean
/// (else its prior), so that a conservative prior does not keep every session off it: its first sessions
/// measure it. `None` on a stage that prefers quality (its listed order is the operator's), or with one
/// alternative.
fn place(state: &AppState, stage: &Stage) -> Option<String> {
    if stage.prefer != tiergate_config::Prefer::Latency || stage.alternatives.len() < 2 {
        return None;
    }
    let seen: Vec<Seen> = stage
        .alternatives
        .iter()
        .filter_map(|(i, name)| {
            let llm = state.backend(*i).filter(|l| l.breaker_closed())?;
            let (mean, measured, slots) = llm.placement();
            let r = llm.rates.view();
            let reread = r
                .cold_prefill
                .or(r.prefill)
                .zip(r.prompt)
                .map(|(a, b)| a * b);
            let warm = llm.limits.warm_sessions;
            Some(Seen {
                name,
                mean,
                measured,
                slots,
                warm,
                reread,
            })
        })
        .collect();
    let lowest_measured = seen.iter().filter(|s| s.measured).map(|s| s.mean).min();
    let sessions = &state.routing.sessions;
    seen.iter()
        .map(|s| {
            let mean = match lowest_measured {
                Some(m) if !s.measured => m.min(s.mean),
                _ => s.mean,
            };
            (s.expected_ms(mean, sessions.held_on(s.name)), s.name)
        })
        .min_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, n)| n.clone())
}

/// A backend as [`place`] weighs it.
struct Seen<'a> {
    name: &'a String,
    mean: std::time::Duration,
    measured: bool,
    slots: usize,
    /// Conversations its prompt cache keeps warm (0: not modelled).
    warm: usize,
    /// Reading a mean prompt cold there, ms.
    reread: Option<f64>,
}

impl Seen<'_> {
    /// What one more session there is expected to cost, ms, while it holds `held`: the wait for a slot at
    /// service time `mean`, and — its prompt cache full — the conversation pushed out read again.
    fn expected_ms(&self, mean: std::time::Duration, held: usize) -> f64 {
        let wait = mean.as_secs_f64() * 1e3 * (held + 1) as f64 / self.slots.max(1) as f64;
        let full = self.warm > 0 && held >= self.warm;
        wait + if full {
            self.reread.unwrap_or(0.0)
        } else {
            0.0
        }
    }
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
    fn a_backend_whose_prompt_cache_is_full_costs_a_conversation_read_again() {
        let name = "a".to_string();
        let s = Seen {
            name: &name,
            mean: std::time::Duration::from_millis(100),
            measured: true,
            slots: 2,
            warm: 4,
            reread: Some(900.0),
        };
        let mean = s.mean;
        assert!((s.expected_ms(mean, 0) - 50.0).abs() < 1e-9);
        assert!(
            (s.expected_ms(mean, 3) - 200.0).abs() < 1e-9,
            "room for a 4th"
        );
        assert!(
            (s.expected_ms(mean, 4) - 1150.0).abs() < 1e-9,
            "full: one pushed out"
        );
        let unmodelled = Seen { warm: 0, ..s };
        assert!((unmodelled.expected_ms(mean, 40) - 2050.0).abs() < 1e-9);
    }

    #[test]
    fn a_pin_applies_only_under_its_routes_stages_and_within_its_age() {
        let pin = Pin {
            stage: 1,
            backend: "big".into(),
            route: 42,
            born_ms: 10_000,
            conversation: 1,
            shared: false,
            spent: Default::default(),
            left: (0, 0),
        };
        assert!(applies(&pin, 42, 10_500, 1_000));
        assert!(!applies(&pin, 43, 10_500, 1_000), "stages changed since");
        assert!(!applies(&pin, 42, 11_000, 1_000), "past its age");
    }
}
