//! `[sessions]`: a conversation stays with the stage and backend that wrote its last turn. A request names its
//! session with the `x-session-id` header, else a client's own session id (`X-Claude-Code-Session-Id`, the
//! session in `metadata.user_id`, `client_metadata.session_id`, `prompt_cache_key`), else — on Responses —
//! the first response of its `previous_response_id` chain; its `user` only when `user_is_session` says so. The
//! pin holds while that backend's breaker is closed and it is predicted to finish within the request's budget;
//! it expires after `ttl_s` without a turn and `max_age_s` after it was made, at most `max_pins` are kept per
//! replica (the least recently used dropped first), and with `[policy_store] kind = "redis"` they live in
//! Redis, so every replica keeps a session where it was.

use serde::{Deserialize, Serialize};

use crate::ConfigError;

/// Session pins.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SessionsConfig {
    /// Pin sessions (a request without a session key is never pinned).
    pub enabled: bool,
    /// A pin expires this long after its session's last turn, seconds.
    pub ttl_s: u64,
    /// The most pins one replica keeps in memory (past it, the least recently used of the tenant holding
    /// the most goes).
    pub max_pins: usize,
    /// The most pins one tenant keeps in one replica's memory, and in Redis when the policy store is Redis
    /// (its least recently used goes first), so that one tenant's flood of sessions evicts no other tenant's
    /// pins.
    pub max_pins_per_tenant: usize,
    /// A pin's whole life, seconds (renewed turns or not): past it the session is placed anew.
    pub max_age_s: u64,
    /// `user` (Chat Completions, Responses) is a session key — off by default: one end user's conversations
    /// would share one pin.
    pub user_is_session: bool,
    /// What a genuine user turn of a pinned session does when Tier-0 steers it to another stage: `priced`
    /// (move when the expected saving outweighs reading the conversation again on the target, within the
    /// route's switch budget), `follow` (always move) or `stay` (never move: the first stage for good).
    pub switch: SwitchMode,
    /// How many turns a move down to a cheaper stage is expected to pay off over (its saving per turn is
    /// counted this many times).
    pub switch_horizon_turns: f64,
}

/// How a pinned session's genuine turn moves between stages (`[sessions] switch`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SwitchMode {
    /// Saving against the cost of reading the conversation again, within the switch budget.
    #[default]
    Priced,
    /// Every genuine turn goes where Tier-0 steers it.
    Follow,
    /// A session stays on the stage of its first turn.
    Stay,
}

impl SwitchMode {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Priced => "priced",
            Self::Follow => "follow",
            Self::Stay => "stay",
        }
    }
}

impl Default for SessionsConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            ttl_s: 1800,
            max_pins: 100_000,
            max_pins_per_tenant: 10_000,
            max_age_s: 24 * 3600,
            user_is_session: false,
            switch: SwitchMode::Priced,
            switch_horizon_turns: 2.0,
        }
    }
}

impl SessionsConfig {
    /// Checks the section; errors name the field.
    pub fn validate(&self, at: &str) -> Result<(), ConfigError> {
        if self.ttl_s == 0 {
            return Err(ConfigError::invalid(
                format!("{at}.ttl_s"),
                "must be at least 1",
            ));
        }
        if self.max_age_s == 0 {
            return Err(ConfigError::invalid(
                format!("{at}.max_age_s"),
                "must be at least 1",
            ));
        }
        if !(self.switch_horizon_turns.is_finite() && self.switch_horizon_turns >= 0.0) {
            return Err(ConfigError::invalid(
                format!("{at}.switch_horizon_turns"),
                "must be a number at least 0",
            ));
        }
        if self.max_pins == 0 {
            return Err(ConfigError::invalid(
                format!("{at}.max_pins"),
                "must be at least 1 (set enabled = false to pin nothing)",
            ));
        }
        if self.max_pins_per_tenant == 0 || self.max_pins_per_tenant > self.max_pins {
            return Err(ConfigError::invalid(
                format!("{at}.max_pins_per_tenant"),
                "must be at least 1 and at most max_pins",
            ));
        }
        Ok(())
    }
}
