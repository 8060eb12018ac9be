//! The operator's live controls: the routing policy (and a steered route's or a cascade stage's) read and
//! changed — validated, versioned, compare-and-set through the shared store, audited — the latency
//! experiments in force, and the tenants. Each returns data or an [`EngineError`]; the door parses its wire
//! form (a patch body, `If-Match`) and adds its auth.

use std::sync::Arc;
use std::time::Instant;

use serde_json::{json, Value};
use tiergate_config::{ExperimentConfig, RoutingConfig, RoutingPatch};

use super::Engine;
use crate::error::EngineError;
use crate::routing::policy::Policy;
use crate::state::AppState;

/// Which policy a change or a read is about: the routing policy, a steered generate route's (`route`) or a
/// cascade stage's (`route` and `stage`, the stage's name).
#[derive(Debug, Clone, Default)]
pub struct PolicyTarget {
    pub route: Option<String>,
    pub stage: Option<String>,
}

/// A policy change as the operator asked it.
#[derive(Debug, Clone)]
pub struct PolicyChange {
    /// The fields to change, as a JSON object of policy fields.
    pub patch: Value,
    /// Every field must be given (`PUT`), not a subset (`PATCH`).
    pub full: bool,
    /// Replace only if the policy is still at this version (`If-Match`); without it a concurrent writer's
    /// change is merged onto, never lost.
    pub if_match: Option<u64>,
    /// Who asked (the audit line).
    pub peer: Option<String>,
}

impl Engine {
    /// The policy `target` names, with its live view (θ in force, utilisation, escalated shares, queue
    /// depth, the error bound's per-route view), and its version.
    pub fn policy(&self, target: &PolicyTarget) -> Result<(Value, u64), EngineError> {
        let stage = stage_policy(&self.state, target)?;
        Ok(viewed(&self.state, stage.as_deref()))
    }

    /// Changes the policy `target` names ([`PolicyChange`]): merged onto the version read and replaced only
    /// if still current (through the shared store when there is one); the new view and version.
    pub async fn change_policy(
        &self,
        target: &PolicyTarget,
        c: PolicyChange,
    ) -> Result<(Value, u64), EngineError> {
        let state = &*self.state;
        let stage = stage_policy(state, target)?;
        let stage = stage.as_deref();
        let patch = RoutingPatch::parse(c.patch).map_err(invalid_policy)?;
        if c.full {
            if let Some(missing) = patch.missing() {
                return Err(EngineError::invalid(
                    missing.clone(),
                    format!(
                        "PUT needs every policy field; `{missing}` is missing (use PATCH for a subset)"
                    ),
                ));
            }
        }
        let change = patch.as_json().to_string();
        let policy = stage.unwrap_or(&state.routing.policy);
        let (from, to) = loop {
            let current = policy.current();
            let cfg = patch.apply(&current.cfg).map_err(invalid_policy)?;
            if stage.is_some() {
                cfg.validate_stage("routing")
                    .map_err(|e| EngineError::invalid("max_error", e.to_string()))?;
            }
            let expected = c.if_match.unwrap_or(current.version);
            let outcome = match &state.routing.store {
                Some(store) => {
                    let key = match &target.route {
                        Some(r) => store.policy_key(r, target.stage.as_deref()),
                        None => store.routing_key().to_string(),
                    };
                    let audit = json!({"from_version": expected, "peer": c.peer,
                        "change": change, "route": target.route, "stage": target.stage});
                    store_change(policy, store, &key, expected, cfg, audit).await?
                }
                None => policy
                    .replace(cfg, Some(expected))
                    .map(|(old, new)| (old.version, new.version)),
            };
            match outcome {
                Ok(changed) => break changed,
                Err(_) if c.if_match.is_none() => continue,
                Err(v) => {
                    return Err(EngineError::PreconditionFailed(format!(
                        "policy is at version {v}, not the If-Match version"
                    )))
                }
            }
        };
        tracing::info!(
            target: "tiergate::audit",
            from_version = from,
            to_version = to,
            peer = ?c.peer,
            change = %change,
            route = target.route.as_deref(),
            stage = target.stage.as_deref(),
            "routing policy changed"
        );
        Ok(viewed(state, stage))
    }

    /// The latency experiments in force.
    pub fn experiments(&self) -> Value {
        json!({"experiments": *self.state.routing.experiments.current()})
    }

    /// Replaces the latency experiments (an empty list stops them all), validated as the config's
    /// `[[experiments]]` against this engine's routes.
    pub fn replace_experiments(
        &self,
        list: Vec<ExperimentConfig>,
        peer: Option<String>,
    ) -> Result<Value, EngineError> {
        let routes: Vec<&str> = self
            .state
            .routing
            .route_order
            .iter()
            .map(String::as_str)
            .collect();
        tiergate_config::validate_experiments(&list, &routes, "experiments")
            .map_err(|e| EngineError::invalid("experiments", e.to_string()))?;
        let said = serde_json::to_string(&list).unwrap_or_default();
        tracing::info!(target: "tiergate::audit", peer = ?peer, experiments = %said, "latency experiments replaced");
        self.state.routing.experiments.replace(list);
        Ok(self.experiments())
    }

    /// The tenants in force (names, routes, limits; never a key digest).
    pub fn tenants(&self) -> Value {
        json!({"tenants": self.state.tenants().describe()})
    }
}

/// The policy of a steered route or a cascade stage `target` names (`None`: the routing policy).
fn stage_policy(state: &AppState, t: &PolicyTarget) -> Result<Option<Arc<Policy>>, EngineError> {
    match (&t.route, &t.stage) {
        (None, None) => Ok(None),
        (Some(r), stage) => state
            .route_policy(r, stage.as_deref())
            .map(Some)
            .ok_or_else(|| {
                EngineError::NotFound(match stage {
                    Some(st) => format!(
                        "route `{r}` has no stage `{st}` after its first (stages after the first have a policy)"
                    ),
                    None => format!(
                        "route `{r}` has no policy of its own (a steered generate route has; name a `stage` for a cascade stage's)"
                    ),
                })
            }),
        (None, Some(_)) => Err(EngineError::invalid(
            "stage",
            "a stage's policy needs its `route` too",
        )),
    }
}

/// A policy's view and its version.
fn viewed(state: &AppState, stage: Option<&Policy>) -> (Value, u64) {
    let version = stage.unwrap_or(&state.routing.policy).current().version;
    (view(state, stage), version)
}

/// An invalid policy, naming its field where it can (serde's message names an unknown field).
fn invalid_policy(e: tiergate_config::ConfigError) -> EngineError {
    let param = match &e {
        tiergate_config::ConfigError::Invalid { field, .. } => {
            Some(field.trim_start_matches("routing.").to_string())
        }
        tiergate_config::ConfigError::Parse { message, .. } => message
            .split('`')
            .nth(1)
            .filter(|_| message.starts_with("unknown field"))
            .map(str::to_string),
        _ => None,
    };
    EngineError::invalid(param.unwrap_or_default(), format!("invalid policy: {e}"))
}

fn view(state: &AppState, stage: Option<&Policy>) -> Value {
    let policy = stage.unwrap_or(&state.routing.policy);
    let p = policy.current();
    let live = policy.live_view(Instant::now());
    let mut v = serde_json::to_value(&p.cfg).unwrap_or_default();
    if let Some(o) = v.as_object_mut() {
        o.insert("theta_eff".into(), json!(live.theta_eff));
        o.insert("utilization".into(), json!(live.utilization));
        o.insert("utilization_in_use".into(), json!(live.utilization_in_use));
        o.insert(
            "escalated_share_10s".into(),
            json!(live.escalated_share_10s),
        );
        o.insert(
            "escalated_share_60s".into(),
            json!(live.escalated_share_60s),
        );
        o.insert("queue_depth".into(), json!(state.in_flight()));
        o.insert("version".into(), json!(p.version));
        if stage.is_none() && p.cfg.max_error.is_some() {
            o.insert("risk".into(), risk_view(state, &p.cfg, live.theta_eff));
        }
    }
    v
}

/// Per route, the error bound's θ, its evidence, and the θ in force once the bound caps the policy's.
fn risk_view(state: &AppState, cfg: &RoutingConfig, theta_eff: f64) -> Value {
    state
        .routing
        .routes
        .iter()
        .filter(|(_, r)| r.prefilter.is_some())
        .filter_map(|(name, r)| {
            let v = r.risk.view(cfg)?;
            let mut j = serde_json::to_value(&v).ok()?;
            // Below the grid's first θ the fixed-sequence proof says nothing: flagged, not capped.
            let (in_force, outside) = v.in_force(theta_eff);
            j["theta_eff"] = json!(in_force);
            j["outside_proof"] = json!(outside);
            Some((name.clone(), j))
        })
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// A change of `policy` (stored in the hash `key`) through the shared store: compare-and-set on the version
/// there (the audit line goes to the shared log in the same step); on a conflict this replica installs the
/// stored version and reports it. Redis unreachable: 503, the policy in force stays; a policy there written in
/// a newer format: 409 (this replica would drop what it does not know).
async fn store_change(
    policy: &Policy,
    store: &crate::routing::store::RedisStore,
    key: &str,
    expected: u64,
    cfg: RoutingConfig,
    audit: Value,
) -> Result<Result<(u64, u64), u64>, EngineError> {
    use crate::routing::store::{Cas, Stored};
    let unreachable = |e: redis::RedisError| {
        EngineError::StoreUnavailable(format!("the shared policy store is unreachable: {e}"))
    };
    match store
        .compare_and_set(key, expected, &cfg, &audit.to_string())
        .await
        .map_err(unreachable)?
    {
        Cas::Stored(v) => {
            policy.install(cfg, v, false);
            Ok(Ok((expected, v)))
        }
        Cas::Conflict(v) => {
            if let Stored::Policy(stored, version) = store.fetch(key).await.map_err(unreachable)? {
                policy.install(stored, version, false);
            }
            Ok(Err(v))
        }
        Cas::Newer(f) => Err(EngineError::Conflict(format!(
            "the shared policy was written in format {f} by a newer replica; this one writes format {} \
             and would drop what it does not know: change it through an upgraded replica",
            crate::routing::store::FORMAT
        ))),
    }
}
