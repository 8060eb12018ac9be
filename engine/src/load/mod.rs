//! Load: the utilisation signal and its sampler ([`utilization`]), the brownout ladder ([`brownout`]), the
//! fleet's utilisation from Prometheus ([`fleet`]) and the console's time series ([`history`]).

pub(crate) mod brownout;
pub(crate) mod history;

use std::sync::Mutex;
use std::time::Instant;

/// The load part of the state.
pub(crate) struct Load {
    /// The brownout ladder (moved by the utilisation sampler, [`utilization::observe_brownout`]) and its
    /// step, read once per request.
    pub(crate) brownout: Mutex<brownout::Ladder>,
    pub(crate) brownout_step: std::sync::atomic::AtomicU8,
    /// The fleet's utilisation from the Prometheus source, with the time it was read.
    pub fleet_utilization: Mutex<Option<(Instant, f64)>>,
    /// The console's time series.
    pub history: history::History,
    /// The last decisions, for `/console`.
    pub decisions: crate::model::outcome::Decisions,
}

impl Load {
    /// At rest: the ladder at `normal`, no reading yet.
    pub(crate) fn new(cfg: &tiergate_config::BrownoutConfig) -> Self {
        Self {
            brownout: Mutex::new(brownout::Ladder::new(cfg)),
            brownout_step: std::sync::atomic::AtomicU8::new(0),
            fleet_utilization: Mutex::new(None),
            history: history::History::default(),
            decisions: crate::model::outcome::Decisions::default(),
        }
    }
}
