//! A pinned session's move between stages, priced in one unit: milliseconds of backend time. A genuine user
//! turn that Tier-0 steers away from the session's pinned stage moves when
//!
//! - **down** (the target's turn is cheaper): the expected saving — Tier-0's confidence that the target is
//!   right × `sessions.switch_horizon_turns` × (a turn's time on the pinned backend − on the target) —
//!   outweighs the cost of moving, and the move fits the budget;
//! - **up** (the target's turn is dearer: Tier-0 asks for the stronger stage): the move fits the budget.
//!
//! The cost of moving is reading again, on the target, what the pinned backend holds warm: the conversation's
//! tokens before this turn — less what the target still holds from the session's earlier turns there (a move
//! back to the backend it left, while that backend's prompt cache has room for the sessions it holds) — × the
//! target's measured cold prefill time per token. A move down also saves, this turn only, the difference of the
//! two backends' predicted waits for a slot (a busy pinned backend is worth leaving). A turn's time on a backend is
//! its new tokens × its prefill time per token + its answer's tokens × its decode time per token (each
//! measured there: [`crate::backends::llm::Rates`]). The budget: all of a session's moves together cost at most
//! `max_switch_spend_pct` of its spend (its turns' time, moves included). A backend not yet measured cannot be
//! priced: the turn follows Tier-0 (`unmeasured`) and measures it.

use crate::backends::llm::RateView;
pub use crate::model::outcome::SwitchPrice;
pub(crate) use crate::routing::sessions::Spend;

/// The conversation as a move sees it, in tokens: what came before this turn (what the pinned backend holds)
/// and what this turn adds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Tokens {
    pub held: f64,
    pub new: f64,
}

/// One turn's time on a backend with figures `r`, ms: its `new` tokens read and an answer written (`None`
/// before the backend has figures).
pub(crate) fn turn_ms(r: &RateView, new: f64) -> Option<f64> {
    Some(r.prefill? * new + r.decode? * r.completion?)
}

/// Reading `held` tokens again on a backend with figures `r`, ms: its cold rate, else its effective one (which
/// a warm prefix cache makes lower: then the cost is under-, never over-stated).
pub(crate) fn reread_ms(r: &RateView, held: f64) -> Option<f64> {
    Some(r.cold_prefill.or(r.prefill)? * held)
}

/// The rule's inputs besides the two backends.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Terms {
    /// Tier-0's confidence that the target stage is right.
    pub confidence: f64,
    pub tokens: Tokens,
    /// Tokens of the conversation the target still holds (a move back to where the session was).
    pub retained: f64,
    /// Each backend's predicted wait for a slot now, ms: the pinned one's, the target's.
    pub waits_ms: (f64, f64),
    pub horizon_turns: f64,
    pub budget_pct: f64,
    pub spent: Spend,
}

/// Prices moving a session from the backend with figures `from` to the one with `to`.
pub(crate) fn price(from: &RateView, to: &RateView, t: Terms) -> SwitchPrice {
    let priced = (
        turn_ms(from, t.tokens.new),
        turn_ms(to, t.tokens.new),
        reread_ms(to, (t.tokens.held - t.retained).max(0.0)),
    );
    let (Some(stay), Some(go), Some(cost)) = priced else {
        return SwitchPrice::unpriced(true, "unmeasured");
    };
    let budget = t.budget_pct / 100.0 * (t.spent.total_ms + cost + go) - t.spent.moves_ms;
    let saving = t.confidence * (t.horizon_turns * (stay - go) + (t.waits_ms.0 - t.waits_ms.1));
    let fits = cost <= budget;
    let (moved, why) = match (go > stay, fits) {
        (_, false) => (false, "budget"),
        (true, true) => (true, "quality"),
        (false, true) if saving > cost => (true, "saving"),
        (false, true) => (false, "dear"),
    };
    SwitchPrice {
        moved,
        why: why.into(),
        saving_ms: saving,
        cost_ms: cost,
        budget_ms: budget.max(0.0),
    }
}

/// `text`'s tokens, estimated: four bytes a token (English text in the common BPE vocabularies; the move's
/// price needs its scale, not its last token).
pub(crate) fn tokens_of(text_bytes: usize) -> f64 {
    text_bytes as f64 / 4.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rates(prefill: f64, cold: f64, decode: f64, completion: f64) -> RateView {
        RateView {
            prompt: None,
            prefill: Some(prefill),
            cold_prefill: Some(cold),
            decode: Some(decode),
            completion: Some(completion),
        }
    }

    fn terms(held: f64, spent: f64, moves: f64) -> Terms {
        Terms {
            confidence: 0.9,
            tokens: Tokens { held, new: 20.0 },
            retained: 0.0,
            waits_ms: (0.0, 0.0),
            horizon_turns: 2.0,
            budget_pct: 100.0,
            spent: Spend {
                total_ms: spent,
                moves_ms: moves,
            },
        }
    }

    // A big backend: 2 ms a token warm, 4 cold, 50 ms a decoded token, 40-token answers (2,040 ms a turn of
    // 20 new tokens); a small one: 0.5 / 1 / 10, 40 tokens (410 ms).
    const BIG: (f64, f64, f64, f64) = (2.0, 4.0, 50.0, 40.0);
    const SMALL: (f64, f64, f64, f64) = (0.5, 1.0, 10.0, 40.0);

    fn r(x: (f64, f64, f64, f64)) -> RateView {
        rates(x.0, x.1, x.2, x.3)
    }

    #[test]
    fn a_move_down_goes_when_its_saving_outweighs_reading_the_conversation_again() {
        // Saving 0.9 × 2 × (2,040 − 410) = 2,934 ms; reading 1,000 tokens on small costs 1,000 ms.
        let p = price(&r(BIG), &r(SMALL), terms(1000.0, 10_000.0, 0.0));
        assert!(p.moved && p.why == "saving", "{p:?}");
        assert!((p.saving_ms - 2934.0).abs() < 1e-6 && (p.cost_ms - 1000.0).abs() < 1e-9);
        // 4,000 tokens cost 4,000 ms: more than the saving.
        let p = price(&r(BIG), &r(SMALL), terms(4000.0, 100_000.0, 0.0));
        assert!(!p.moved && p.why == "dear", "{p:?}");
    }

    #[test]
    fn a_move_up_goes_within_the_budget_only() {
        // Reading 1,000 tokens on big costs 4,000 ms; the session spent 10,000, none on moves.
        let p = price(&r(SMALL), &r(BIG), terms(1000.0, 10_000.0, 0.0));
        assert!(p.moved && p.why == "quality", "{p:?}");
        // With 15,000 of its 16,040 allowed already spent on moves, the 4,000 does not fit.
        let p = price(&r(SMALL), &r(BIG), terms(1000.0, 10_000.0, 15_000.0));
        assert!(!p.moved && p.why == "budget", "{p:?}");
        let mut t = terms(1000.0, 10_000.0, 0.0);
        t.budget_pct = 10.0;
        let p = price(&r(SMALL), &r(BIG), t);
        assert!(
            !p.moved && p.why == "budget",
            "a lower budget refuses it: {p:?}"
        );
    }

    #[test]
    fn a_move_back_pays_only_for_what_came_since_and_a_busy_pin_is_worth_leaving() {
        // 4,000 tokens, 3,900 of them still held where the session was: 100 ms to read the rest.
        let mut t = terms(4000.0, 100_000.0, 0.0);
        t.retained = 3900.0;
        let p = price(&r(BIG), &r(SMALL), t);
        assert!(
            p.moved && p.why == "saving" && (p.cost_ms - 100.0).abs() < 1e-9,
            "{p:?}"
        );
        // Without it, dear (above); with the pinned backend 3 s busier, the move saves that wait too.
        let mut t = terms(4000.0, 100_000.0, 0.0);
        t.waits_ms = (3000.0, 0.0);
        let p = price(&r(BIG), &r(SMALL), t);
        assert!(
            p.moved && (p.saving_ms - 0.9 * (2.0 * 1630.0 + 3000.0)).abs() < 1e-6,
            "{p:?}"
        );
    }

    #[test]
    fn an_unmeasured_backend_is_not_priced_and_tier0_is_followed() {
        let p = price(&r(BIG), &RateView::default(), terms(1000.0, 0.0, 0.0));
        assert!(p.moved && p.why == "unmeasured", "{p:?}");
    }

    #[test]
    fn without_a_cold_rate_the_effective_one_prices_the_reread() {
        let mut to = r(SMALL);
        to.cold_prefill = None;
        assert_eq!(reread_ms(&to, 100.0), Some(50.0));
    }
}
