//! The brownout ladder (`[brownout]`): under overload the server steps down explicitly instead of letting
//! queues grow — `normal` → `rerank_only` (generations get 429 with `Retry-After`, answer routes their label's
//! configured reply) → `tier0_only` (no escalation: Tier-0 answers, `x-tiergate-degraded: brownout`) → `shed`
//! (429 for every chat request). The step follows one pressure figure, the largest of the LLM's queue (jobs
//! waiting ÷ the room to wait), its P95 service time ÷ `p95_limit_ms`, and the utilisation the policy uses: it
//! goes up one step once the pressure has stayed at or above that step's `enter` for `hold_ms`, and down one
//! once it has stayed below the current step's `leave` for `cool_ms` (hysteresis: `leave` < `enter`).
//! Shedding is for the server's own overload: from `tier0_only` on nothing new reaches the LLM, so its queue
//! and P95 can hold the ladder at `tier0_only` but not push it to `shed` (429 for requests Tier-0 could
//! answer); `shed` is entered and left on the server's own load, its requests in flight ÷
//! `server.max_in_flight` ([`Ladder::fed`]).
//! The step follows the busiest backend, so on its own it would pause a cheap stage beside a saturated strong
//! one; a generation is paused only where its stage is pressed too ([`stage_generates`]): at `rerank_only`
//! and `tier0_only` a stage with an alternative whose own pressure is below the ladder's first `leave` still
//! writes.
//! Every answer carries `x-tiergate-brownout` while the ladder is above `normal`; `tiergate_brownout_step`
//! and the console show the step.

use std::time::{Duration, Instant};

use tiergate_config::BrownoutConfig;

pub(crate) use crate::model::outcome::Step;

/// The ladder's state (a pure state machine over observed pressure).
#[derive(Debug, Clone)]
pub(crate) struct Ladder {
    step: Step,
    /// Since when the pressure has been past the threshold that would move the step (`None`: it is not).
    pending: Option<(Step, Instant)>,
    /// Pressure to enter step k + 1 from step k.
    enter: [f64; 3],
    /// Pressure below which step k + 1 is left for step k.
    leave: [f64; 3],
    hold: Duration,
    cool: Duration,
}

impl Ladder {
    /// A ladder at `normal`.
    pub(crate) fn new(cfg: &BrownoutConfig) -> Self {
        Self {
            step: Step::Normal,
            pending: None,
            enter: cfg.enter,
            leave: cfg.leave,
            hold: Duration::from_millis(cfg.hold_ms),
            cool: Duration::from_millis(cfg.cool_ms),
        }
    }

    /// The step in force.
    pub(crate) fn step(&self) -> Step {
        self.step
    }

    /// The pressure the ladder reads at its current step from the LLM side's (`llm`: queue, P95, utilisation)
    /// and the server's own (`own`: requests in flight ÷ the admission limit): below `tier0_only` the larger;
    /// at `tier0_only` the LLM side can keep the step (up to just below `shed`'s `enter`) but only the server's
    /// own load can go on to `shed`; at `shed`, the server's own load alone.
    pub(crate) fn fed(&self, llm: f64, own: f64) -> f64 {
        match self.step {
            Step::Normal | Step::RerankOnly => llm.max(own),
            Step::Tier0Only => own.max(llm.min(self.enter[2] * (1.0 - 1e-9))),
            Step::Shed => own,
        }
    }

    /// Takes one pressure reading at `now`; returns the step in force after it.
    pub(crate) fn observe(&mut self, pressure: f64, now: Instant) -> Step {
        let k = self.step as usize;
        let target = if k < 3 && pressure >= self.enter[k] {
            Some((self.step.up(), self.hold))
        } else if k > 0 && pressure < self.leave[k - 1] {
            Some((self.step.down(), self.cool))
        } else {
            None
        };
        match target {
            None => self.pending = None,
            Some((to, after)) => match self.pending {
                Some((p, since)) if p == to => {
                    if now.saturating_duration_since(since) >= after {
                        self.step = to;
                        self.pending = None;
                    }
                }
                _ => self.pending = Some((to, now)),
            },
        }
        self.step
    }
}

/// Whether a stage whose alternatives' own pressures are `pressures` may generate at `step`: always at
/// `normal`, never at `shed`, and in between while one of them is calm (below `calm`, the first `leave`).
pub(crate) fn stage_generates(
    step: Step,
    mut pressures: impl Iterator<Item = f64>,
    calm: f64,
) -> bool {
    step.generates() || (step < Step::Shed && pressures.any(|p| p < calm))
}

/// What a step refuses outright: every chat request at `shed`, generations from `rerank_only` on (429 with
/// `Retry-After`; the client should back off).
pub(crate) fn refusal(
    step: Step,
    kind: tiergate_config::RouteKind,
) -> Option<crate::error::EngineError> {
    let message = match (step, kind) {
        (Step::Shed, _) => "the server is shedding load (brownout step `shed`): retry later",
        (Step::RerankOnly | Step::Tier0Only, tiergate_config::RouteKind::Generate) => {
            "generation is paused under load (brownout): retry later"
        }
        _ => return None,
    };
    Some(crate::error::EngineError::Overloaded {
        message: message.into(),
        retry_after_s: 5,
    })
}

/// The pressure: the largest of the queue's fill, the P95 service time against its limit, and utilisation.
pub(crate) fn pressure(
    waiting: usize,
    room: usize,
    p95: Duration,
    p95_limit: Duration,
    utilization: f64,
) -> f64 {
    let queue = waiting as f64 / room.max(1) as f64;
    let slow = p95.as_secs_f64() / p95_limit.as_secs_f64().max(1e-3);
    queue.max(slow).max(utilization)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_calm_stage_generates_while_the_ladder_is_up_for_a_busy_one() {
        let calm = 0.6;
        assert!(stage_generates(Step::Normal, [2.0].into_iter(), calm));
        assert!(stage_generates(
            Step::RerankOnly,
            [1.5, 0.1].into_iter(),
            calm
        ));
        assert!(stage_generates(Step::Tier0Only, [0.2].into_iter(), calm));
        assert!(!stage_generates(
            Step::RerankOnly,
            [1.5, 0.7].into_iter(),
            calm
        ));
        assert!(!stage_generates(Step::Shed, [0.0].into_iter(), calm));
        assert!(!stage_generates(Step::RerankOnly, std::iter::empty(), calm));
    }

    fn ladder() -> Ladder {
        Ladder::new(&BrownoutConfig {
            enabled: true,
            enter: [0.9, 1.2, 1.6],
            leave: [0.6, 0.9, 1.2],
            hold_ms: 1000,
            cool_ms: 3000,
            p95_limit_ms: 2000,
        })
    }

    fn at(t0: Instant, ms: u64) -> Instant {
        t0 + Duration::from_millis(ms)
    }

    #[test]
    fn it_climbs_one_step_after_the_hold_and_a_spike_does_not_move_it() {
        let t0 = Instant::now();
        let mut l = ladder();
        // A short spike: back below before the hold ends.
        assert_eq!(l.observe(2.0, at(t0, 0)), Step::Normal);
        assert_eq!(l.observe(2.0, at(t0, 500)), Step::Normal);
        assert_eq!(l.observe(0.5, at(t0, 900)), Step::Normal);
        assert_eq!(
            l.observe(2.0, at(t0, 1500)),
            Step::Normal,
            "the hold starts again"
        );
        // Held: one step at a time, each after its own hold.
        assert_eq!(l.observe(2.0, at(t0, 2500)), Step::RerankOnly);
        assert_eq!(l.observe(2.0, at(t0, 2600)), Step::RerankOnly);
        assert_eq!(l.observe(2.0, at(t0, 3600)), Step::Tier0Only);
        assert_eq!(l.observe(2.0, at(t0, 3700)), Step::Tier0Only);
        assert_eq!(l.observe(2.0, at(t0, 4700)), Step::Shed);
        assert_eq!(
            l.observe(9.0, at(t0, 9000)),
            Step::Shed,
            "no step past shed"
        );
    }

    #[test]
    fn it_comes_down_only_below_leave_for_the_cool_down() {
        let t0 = Instant::now();
        let mut l = ladder();
        l.observe(1.0, at(t0, 0));
        assert_eq!(l.observe(1.0, at(t0, 1000)), Step::RerankOnly);
        // Between leave (0.6) and enter (0.9 → next needs 1.2): it stays.
        for ms in (1100..10_000).step_by(500) {
            assert_eq!(l.observe(0.8, at(t0, ms)), Step::RerankOnly, "{ms}");
        }
        // Below leave, but not for the whole cool-down: it stays.
        l.observe(0.3, at(t0, 10_000));
        assert_eq!(l.observe(0.7, at(t0, 12_000)), Step::RerankOnly);
        l.observe(0.3, at(t0, 12_500));
        assert_eq!(l.observe(0.3, at(t0, 15_000)), Step::RerankOnly);
        assert_eq!(l.observe(0.3, at(t0, 15_500)), Step::Normal);
    }

    #[test]
    fn only_the_servers_own_load_sheds() {
        let t0 = Instant::now();
        let mut l = ladder();
        // The LLM side far past every threshold, the server itself idle: up to tier0_only, never to shed.
        for ms in (0..20_000).step_by(100) {
            let p = l.fed(5.0, 0.1);
            l.observe(p, at(t0, ms));
        }
        assert_eq!(l.step(), Step::Tier0Only);
        // The server's own load past shed's enter: shed; then its own load down: back to tier0_only even
        // though the LLM side is still pressed.
        for ms in (20_000..22_000).step_by(100) {
            let p = l.fed(5.0, 2.0);
            l.observe(p, at(t0, ms));
        }
        assert_eq!(l.step(), Step::Shed);
        for ms in (22_000..30_000).step_by(100) {
            let p = l.fed(5.0, 0.1);
            l.observe(p, at(t0, ms));
        }
        assert_eq!(l.step(), Step::Tier0Only);
    }

    #[test]
    fn pressure_is_the_worst_signal() {
        let s = Duration::from_millis;
        assert_eq!(pressure(0, 8, s(100), s(2000), 0.2), 0.2);
        assert_eq!(pressure(8, 8, s(100), s(2000), 0.2), 1.0);
        assert_eq!(pressure(0, 8, s(3000), s(2000), 0.2), 1.5);
        assert_eq!(pressure(3, 0, s(0), s(2000), 0.0), 3.0);
        assert_eq!(Step::of(2), Step::Tier0Only);
        assert_eq!(Step::of(7), Step::Normal);
    }
}
