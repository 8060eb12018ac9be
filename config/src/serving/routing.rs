//! `[routing]`: the escalation policy (live-tunable through `/admin/routing`) and a change to it.

use super::*;

/// How θ_eff is computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RoutingMode {
    /// θ_eff = θ_base.
    Static,
    /// θ_eff = clamp(θ_base + k·u, θ_min, θ_max).
    Load,
    /// θ tracks the (1 − target_share) quantile of recent ambiguity.
    Target,
    /// A bounded controller keeps the escalated channel's p95 under `slo_p95_ms`.
    Slo,
    /// θ is the largest one whose error bound on Tier-0's lone answers holds: error ≤ `max_error` with
    /// confidence `confidence`, chosen by Learn-then-Test on the head's labelled calibration rows.
    Risk,
}

/// What the server does when an answer must escalate to hold the error bound and the LLM cannot take it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnBreach {
    /// Tier-0 answers, flagged `x-tiergate-degraded: risk_bound`.
    Degrade,
    /// 503 in the OpenAI error shape (`risk_bound`): the client may retry.
    Reject,
}

/// The escalation policy (live-tunable through `/admin/routing`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RoutingConfig {
    /// How θ_eff is computed.
    pub mode: RoutingMode,
    /// Base threshold on the ambiguity 1 − max p.
    pub theta_base: f64,
    /// Load sensitivity: θ rises by k at full utilisation.
    pub k: f64,
    /// Lowest θ_eff.
    pub theta_min: f64,
    /// Highest θ_eff.
    pub theta_max: f64,
    /// `target` mode: share of traffic to escalate.
    pub target_share: f64,
    /// `slo` mode: p95 target of the escalated channel, milliseconds.
    pub slo_p95_ms: f64,
    /// Where u comes from.
    pub utilization_source: UtilizationSource,
    /// u used when the source is `manual`.
    pub manual_utilization: f64,
    /// Honour the request header `x-tiergate-threshold` (in [0, 1]) from clients that present the admin
    /// token; such requests are left out of the policy's statistics. Off by default.
    pub allow_header_override: bool,
    /// The out-of-scope threshold of every route that has an out-of-scope outcome (`null`: each route's
    /// own, fitted or configured).
    pub oos_threshold: Option<f64>,
    /// Out-of-scope scores within this of the threshold are uncertain calls, escalated to the LLM (which
    /// may answer "none of these"); 0: Tier-0's call stands.
    pub oos_margin: f64,
    /// The largest error allowed among the answers Tier-0 gives alone (ε, in (0, 1)); required by `risk`
    /// mode. Set in another mode, it caps that mode's θ: under load θ_eff never rises above the risk θ.
    pub max_error: Option<f64>,
    /// The confidence 1 − δ with which the error stays ≤ `max_error`.
    pub confidence: f64,
    /// When a request must escalate to hold the bound and the LLM cannot take it: `degrade` or `reject`.
    pub on_breach: OnBreach,
    /// Share of the answers Tier-0 gives alone (degraded ones included) kept with their text in the audit
    /// queue for labelling (`/admin/audits`), drawn at random: an unbiased sample of Tier-0's silent error.
    pub audit_rate: f64,
    /// Use a head's calibration rows for `max_error` even when they are flawed (in-sample halves of a dev
    /// split too small to halve, or labels with no calibration row): off, such a head's bound allows θ = 0
    /// (every request escalates) and says why. On, the bound is used and shown flagged — its proof does not
    /// hold on such rows.
    pub allow_flawed_calibration: bool,
}

impl Default for RoutingConfig {
    fn default() -> Self {
        Self {
            mode: RoutingMode::Load,
            theta_base: 0.65,
            k: 0.15,
            theta_min: 0.0,
            theta_max: 1.0,
            target_share: 0.1,
            slo_p95_ms: 4_500.0,
            utilization_source: UtilizationSource::Auto,
            manual_utilization: 0.0,
            allow_header_override: false,
            oos_threshold: None,
            oos_margin: 0.0,
            max_error: None,
            confidence: 0.95,
            on_breach: OnBreach::Degrade,
            audit_rate: 0.0,
            allow_flawed_calibration: false,
        }
    }
}

/// A change to the routing policy (`/admin/routing`): some of its fields (PATCH) or all (PUT), as JSON. It is
/// applied by deserialising the policy it yields, so an unknown field is refused by the policy's own
/// `deny_unknown_fields` and a wrong type by its field's type: no list of fields is kept by hand.
#[derive(Debug, Clone, PartialEq)]
pub struct RoutingPatch(serde_json::Map<String, serde_json::Value>);

impl RoutingPatch {
    /// A patch from a JSON body: an object whose every key is a policy field.
    pub fn parse(body: serde_json::Value) -> Result<Self, ConfigError> {
        let serde_json::Value::Object(m) = body else {
            return Err(ConfigError::invalid("routing", "expected a JSON object"));
        };
        let patch = Self(m);
        match patch.apply(&RoutingConfig::default()) {
            // A value out of range is checked again on the policy in force, where it is applied.
            Ok(_) | Err(ConfigError::Invalid { .. }) => Ok(patch),
            Err(e) => Err(e),
        }
    }

    /// The first policy field it does not set (a PUT must set them all).
    pub fn missing(&self) -> Option<String> {
        RoutingConfig::fields()
            .into_iter()
            .find(|f| !self.0.contains_key(f))
    }

    /// `base` with its fields, validated.
    pub fn apply(&self, base: &RoutingConfig) -> Result<RoutingConfig, ConfigError> {
        let mut merged = serde_json::to_value(base).map_err(|e| ConfigError::Parse {
            origin: "routing".into(),
            message: e.to_string(),
        })?;
        if let Some(m) = merged.as_object_mut() {
            m.extend(self.0.clone());
        }
        let cfg: RoutingConfig =
            serde_json::from_value(merged).map_err(|e| ConfigError::Parse {
                origin: "routing".into(),
                message: e.to_string(),
            })?;
        cfg.validate("routing")?;
        Ok(cfg)
    }

    /// The patch as sent (for the audit log).
    pub fn as_json(&self) -> serde_json::Value {
        serde_json::Value::Object(self.0.clone())
    }
}

impl RoutingConfig {
    /// The policy's field names, read off the type (its serialised form): what `/admin/routing` accepts
    /// (PATCH: any subset, PUT: all) and what a client saves to put a policy back.
    pub fn fields() -> Vec<String> {
        match serde_json::to_value(Self::default()) {
            Ok(serde_json::Value::Object(m)) => m.keys().cloned().collect(),
            _ => Vec::new(),
        }
    }

    /// Checks the policy; errors name the field.
    pub fn validate(&self, at: &str) -> Result<(), ConfigError> {
        let unit = |name: &str, v: f64| {
            if v.is_finite() && (0.0..=1.0).contains(&v) {
                Ok(())
            } else {
                Err(ConfigError::invalid(
                    format!("{at}.{name}"),
                    format!("{v} is outside [0, 1]"),
                ))
            }
        };
        unit("theta_base", self.theta_base)?;
        unit("theta_min", self.theta_min)?;
        unit("theta_max", self.theta_max)?;
        unit("target_share", self.target_share)?;
        unit("manual_utilization", self.manual_utilization)?;
        unit("audit_rate", self.audit_rate)?;
        if !(self.k.is_finite() && (-1.0..=1.0).contains(&self.k)) {
            return Err(ConfigError::invalid(
                format!("{at}.k"),
                format!("{} is outside [-1, 1]", self.k),
            ));
        }
        if self.theta_min > self.theta_max {
            return Err(ConfigError::invalid(
                format!("{at}.theta_min"),
                format!("{} is above theta_max {}", self.theta_min, self.theta_max),
            ));
        }
        if self.oos_threshold.is_some_and(|t| !t.is_finite()) {
            return Err(ConfigError::invalid(
                format!("{at}.oos_threshold"),
                "must be a number or null",
            ));
        }
        if !(self.oos_margin.is_finite() && (0.0..=1.0).contains(&self.oos_margin)) {
            return Err(ConfigError::invalid(
                format!("{at}.oos_margin"),
                format!("{} is outside [0, 1]", self.oos_margin),
            ));
        }
        if !(self.slo_p95_ms.is_finite() && self.slo_p95_ms > 0.0) {
            return Err(ConfigError::invalid(
                format!("{at}.slo_p95_ms"),
                "must be a positive number",
            ));
        }
        self.validate_risk(at)
    }

    /// A static θ of `theta` over these fields, without an error bound or audits: the policy of a stage or a
    /// steered route that sets none of its own.
    pub fn fixed_at(&self, theta: f64) -> RoutingConfig {
        RoutingConfig {
            mode: RoutingMode::Static,
            theta_base: theta,
            max_error: None,
            audit_rate: 0.0,
            ..self.clone()
        }
    }

    /// Checks a cascade stage's (or a steered route's) policy: the error bound and the audits are about the
    /// answers Tier-0 gives alone, decided by the routing policy, not by a later stage's.
    pub fn validate_stage(&self, at: &str) -> Result<(), ConfigError> {
        self.validate(at)?;
        if self.mode == RoutingMode::Risk || self.max_error.is_some() || self.audit_rate > 0.0 {
            return Err(ConfigError::invalid(
                format!("{at}.max_error"),
                "mode \"risk\", max_error and audit_rate belong to the routing policy (Tier-0's lone answers), \
                 not to a later stage's",
            ));
        }
        Ok(())
    }

    fn validate_risk(&self, at: &str) -> Result<(), ConfigError> {
        let open = |v: f64| v.is_finite() && v > 0.0 && v < 1.0;
        match self.max_error {
            Some(e) if !open(e) => {
                return Err(ConfigError::invalid(
                    format!("{at}.max_error"),
                    format!("{e} is outside (0, 1)"),
                ))
            }
            None if self.mode == RoutingMode::Risk => {
                return Err(ConfigError::invalid(
                    format!("{at}.max_error"),
                    "mode \"risk\" needs max_error (the error allowed among Tier-0's lone answers)",
                ))
            }
            _ => {}
        }
        if !open(self.confidence) {
            return Err(ConfigError::invalid(
                format!("{at}.confidence"),
                format!("{} is outside (0, 1)", self.confidence),
            ));
        }
        Ok(())
    }
}
