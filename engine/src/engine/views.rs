//! The read-only views the doors serve: the routes a tenant may use (`/v1/models`), readiness (`/ready`), the
//! effective config and what is in force (`/info`), Prometheus text (`/metrics`) and the operator's console
//! (`/admin/console`). Each returns data; the door adds its status and its auth.

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tiergate_config::RouteKind;

use super::Engine;
use crate::metrics as m;
use crate::model::outcome::{Channel, Decision};
use crate::state::AppState;
use crate::tenancy::tenants::TenantId;

/// Histogram bins over ambiguity [0, 1].
const BINS: usize = 40;

impl Engine {
    /// What the operator's console shows (`GET /admin/console`): the live policy view, the ambiguity
    /// histogram of the last 60 s, per-channel P95 of recent answers, per-tenant figures, the backends, the
    /// last 15 minutes as time series, the answer cache, and the last decisions (no request text is kept).
    pub fn console(&self) -> Value {
        let state = &*self.state;
        let now = Instant::now();
        let mut bins = vec![0u32; BINS];
        for a in state.routing.policy.recent_ambiguity(now) {
            let i = ((a.clamp(0.0, 1.0) * BINS as f64) as usize).min(BINS - 1);
            bins[i] += 1;
        }
        let recent: Vec<Decision> = state.load.decisions.recent();
        let live = state.routing.policy.live_view(now);
        let current = state.routing.policy.current();
        let degraded = recent
            .iter()
            .filter(|d| d.channel == Channel::Degraded.as_str())
            .count() as f64
            / recent.len().max(1) as f64;
        // θ in force once the error bound caps the policy's (the smallest over the routes it caps).
        let capped = state
            .routing
            .routes
            .values()
            .filter(|r| r.prefilter.is_some())
            .filter_map(|r| r.risk.theta(&current.cfg))
            .map(|b| crate::routing::risk::cap(live.theta_eff, Some(b)))
            .reduce(f64::min);
        json!({
            "version": current.version,
            "policy": current.cfg,
            "theta_eff": capped.unwrap_or(live.theta_eff),
            "theta_policy": live.theta_eff,
            "theta_capped_by_bound": capped.is_some_and(|c| c < live.theta_eff),
            "utilization": live.utilization,
            "utilization_in_use": live.utilization_in_use,
            "escalated_share_60s": live.escalated_share_60s,
            "degraded_share_recent": degraded,
            "queue_depth": state.in_flight(),
            "dependencies": state.deps.views().1,
            "p95_ms": crate::load::history::p95_by_channel(&recent, now, Duration::from_secs(60)),
            "bands_ms": tiergate_core::bands::BANDS
                .iter()
                .map(|(_, key, max)| (key.to_string(), json!(max)))
                .collect::<serde_json::Map<_, _>>(),
            "ambiguity_histogram": bins,
            "decisions": recent.iter().rev().take(50).collect::<Vec<_>>(),
            "tenants": tenants(state),
            "brownout": state.brownout().as_str(),
            "breaker": state.default_llm().is_some().then(|| if state.breakers_closed() { "closed" } else { "open" }),
            "backends": backends(state),
            "history": state.load.history.points(),
            "sessions": state.routing.sessions.len(),
            "stages": state.route_policies().into_iter().map(|rp| {
                let (live, p) = (rp.policy.live_view(now), rp.policy.current());
                json!({
                    "route": rp.route, "stage": rp.stage, "theta_eff": live.theta_eff, "version": p.version,
                    "mode": p.cfg.mode, "utilization": live.utilization,
                    "escalated_share_60s": live.escalated_share_60s,
                })
            }).collect::<Vec<_>>(),
            "quality": quality(state, live.theta_eff),
            "cache": cache(state, &recent),
            "token_required": state.config.server.admin_token.is_some(),
        })
    }

    /// The routes `tenant` may use, as OpenAI's model objects (with tiergate's own fields).
    pub fn models(&self, tenant: &TenantId) -> Vec<Value> {
        let state = &*self.state;
        let tenant = tenant.clone();
        // When the routes were loaded (the server's start), as Unix seconds.
        let created = crate::tasks::utilization::unix_now_s()
            .saturating_sub(state.started.elapsed().as_secs());
        let data: Vec<_> = state.routing.in_order()
            .filter(|r| state.tenants().permit(&tenant, &r.name).is_ok())
            .map(|r| {
                let kind = match r.kind {
                    RouteKind::Classify => "classify",
                    RouteKind::Answer => "answer",
                    RouteKind::Generate => "generate",
                };
                json!({"id": r.name, "object": "model", "created": created, "owned_by": "tiergate",
                       "tiergate_kind": kind, "tiergate_aliases": r.aliases, "tiergate_default": r.default,
                       "tiergate_max_tokens": r.max_tokens, "tiergate_max_text_chars": r.max_text_chars})
            })
            .collect();
        data
    }

    /// Prometheus text, its sampled gauges refreshed first; `None` when metrics are off.
    pub fn render_metrics(&self) -> Option<String> {
        refresh_gauges(&self.state);
        self.state.metrics.as_ref().map(|h| h.render())
    }

    /// Whether the engine is ready — not draining, and every generate route's first stage with a live worker
    /// on one of its backends (a classify route degrades to Tier-0 without one) — and the detail.
    pub fn readiness(&self) -> (bool, Value) {
        let state = &*self.state;
        let unserved = state.unserved();
        let live = state.live_workers();
        let draining = self.draining();
        let ok = !draining && unserved.is_empty();
        // A dependency whose breaker is open is served around (local pins, the last policy, the ledger's
        // spool): still ready, and said.
        let (deps_up, deps) = state.deps.views();
        (
            ok,
            json!({
                "ready": ok,
                "draining": draining,
                // A replica without its shared store keeps serving its last policy (still ready), and says so.
                "policy_store": state.routing.store.as_ref().map(|s| if s.is_up() { "reachable" } else { "unreachable: serving the last policy" }),
                "prefilter": true,
                "dependencies": deps,
                "degraded": !deps_up,
                "ledger_spooled": state.evidence.ledger.as_ref().map(|l| l.spooled()),
                "live_workers": live,
                "unserved_routes": unserved,
                "backends": state.llms().map(|(_, l)| json!({"name": l.name, "live_workers": l.client.live_workers()})).collect::<Vec<_>>(),
            }),
        )
    }

    /// The effective config (secrets redacted) and what is in force: heads, fusion, stages, segments.
    pub fn info(&self) -> Value {
        let state = &*self.state;
        let cfg = tiergate_config::redact::redacted(&state.config);
        let fusion: serde_json::Map<String, serde_json::Value> = state
            .routing
            .classified()
            .map(|r| {
                (
                    r.name.clone(),
                    serde_json::to_value(&r.fusion).unwrap_or_default(),
                )
            })
            .collect();
        let stages: serde_json::Map<String, serde_json::Value> = state
            .routing
            .in_order()
            .map(|r| {
                let names: Vec<&str> = r.stages.iter().map(|s| s.name.as_str()).collect();
                (r.name.clone(), json!(names))
            })
            .collect();
        // Each stage's fusion per alternative backend (where its values come from: a fit or the config).
        let stage_fusion: serde_json::Map<String, serde_json::Value> = state
            .routing
            .classified()
            .map(|r| {
                let per_stage: Vec<serde_json::Value> = r
                    .stages
                    .iter()
                    .map(|s| {
                        let by: serde_json::Map<String, serde_json::Value> = s
                            .alternatives
                            .iter()
                            .zip(&s.fusions)
                            .map(|((_, n), f)| {
                                (n.clone(), serde_json::to_value(f).unwrap_or_default())
                            })
                            .collect();
                        json!(by)
                    })
                    .collect();
                (r.name.clone(), json!(per_stage))
            })
            .collect();
        // Each classified route's head in force (a live swap's, with its folder) and the one in shadow.
        let heads: serde_json::Map<String, serde_json::Value> = state.routing.classified()
            .map(|r| {
                let shadow = state.routing.heads.shadow_of(&r.name).map(|s| s.candidate.head_version.clone());
                (r.name.clone(), json!({"version": r.head_version, "dir": state.routing.heads.dir_of(&r.name), "shadow": shadow}))
            })
            .collect();
        json!({"version": env!("CARGO_PKG_VERSION"), "config": cfg, "live_workers": state.live_workers(),
                          "heads": heads,
                          "segment": state.default_llm().map(|l| l.segment.clone()),
                          "segments": state.llms().map(|(_, l)| l.segment.clone()).collect::<Vec<_>>(), "fusion": fusion,
                          "backends": state.backends.iter().map(|b| &b.name).collect::<Vec<_>>(), "stages": stages,
                          "stage_fusion": stage_fusion})
    }
}

/// Per tenant: its figures since start, the jobs it has waiting for the LLM, and its LLM budget left.
fn tenants(state: &AppState) -> Vec<serde_json::Value> {
    let configured = state.tenants();
    let now = Instant::now();
    state
        .tenancy
        .figures
        .snapshot()
        .into_iter()
        .map(|(name, c)| {
            let t = configured.named(&name);
            json!({
                "name": name,
                "counts": c,
                "waiting": state.waiting(&name),
                "weight": t.map_or(1.0, |t| t.weight),
                "llm_seconds_left": t
                    .and_then(|t| t.budget())
                    .and_then(|b| b.lock().ok().map(|mut b| b.left(now))),
            })
        })
        .collect()
}

/// Per LLM backend: its live workers, jobs running and waiting, recent P95 service time and breaker.
fn backends(state: &AppState) -> Vec<serde_json::Value> {
    state
        .backends
        .iter()
        .map(|b| match &b.llm {
            Some(l) => {
                let (running, waiting) = l.share.load();
                let rates = l.rates.view();
                json!({
                    "name": b.name,
                    "live_workers": l.client.live_workers(),
                    "running": running,
                    "waiting": waiting,
                    "rerank_p95_ms": l
                        .rerank_times
                        .recent_p95(Duration::from_secs(60))
                        .map(|d| d.as_secs_f64() * 1e3),
                    "breaker": if l.breaker_closed() { "closed" } else { "open" },
                    "prefill_ms_per_token": rates.prefill,
                    "cold_prefill_ms_per_token": rates.cold_prefill,
                    "decode_ms_per_token": rates.decode,
                    "completion_tokens": rates.completion,
                })
            }
            None => json!({"name": b.name, "live_workers": 0, "breaker": null}),
        })
        .collect()
}

/// Per classified route: the ledger's figures (silent error, audits, feedback) and the error bound in force.
fn quality(state: &AppState, theta_eff: f64) -> Vec<serde_json::Value> {
    let summary = state
        .evidence
        .ledger
        .as_ref()
        .map(|l| l.summary())
        .unwrap_or_default();
    let cfg = state.routing.policy.current().cfg.clone();
    let agreement = state.agreement();
    state
        .routing
        .classified()
        .map(|r| {
            let name = &r.name;
            let mut v = summary
                .routes
                .get(name)
                .cloned()
                .unwrap_or_default()
                .view(Some(&r.head_version));
            v["route"] = json!(name);
            let risk = r.risk.view(&cfg);
            v["risk"] = json!(risk);
            if let Some(b) = &risk {
                // Below the grid's first θ the bound's proof says nothing: flagged, not capped.
                v["risk"]["outside_proof"] = json!(b.in_force(theta_eff).1);
            }
            v["llm_agreement"] = agreement.get(name).map(|a| a.view()).into();
            v
        })
        .collect()
}

/// The answer cache (`null` when off): its size, and the share of the recent decisions it answered.
fn cache(state: &AppState, recent: &[Decision]) -> serde_json::Value {
    let Some(cache) = &state.cache else {
        return serde_json::Value::Null;
    };
    let (entries, bytes) = cache.size();
    let hits = recent
        .iter()
        .filter(|d| d.channel == Channel::Cache.as_str())
        .count();
    json!({
        "entries": entries, "bytes": bytes, "max_bytes": state.config.cache.max_bytes,
        "hits_recent": hits, "hit_share_recent": hits as f64 / recent.len().max(1) as f64,
        "shared_up": cache.shared_up(),
    })
}

/// Updates the gauges that are sampled rather than counted.
fn refresh_gauges(state: &AppState) {
    let view = state.routing.policy.live_view(Instant::now());
    metrics::gauge!(m::THETA_EFF).set(view.theta_eff);
    metrics::gauge!(m::UTILIZATION).set(view.utilization);
    metrics::gauge!(m::ESCALATION_SHARE).set(view.escalated_share_60s);
    let policy = state.routing.policy.current();
    metrics::gauge!(m::POLICY_VERSION).set(policy.version as f64);
    let now = Instant::now();
    for rp in state.route_policies() {
        let labels = [
            ("route", rp.route.clone()),
            ("stage", rp.stage.clone().unwrap_or_default()),
        ];
        let live = rp.policy.live_view(now);
        metrics::gauge!(m::ROUTE_THETA_EFF, &labels).set(live.theta_eff);
        metrics::gauge!(m::ROUTE_UTILIZATION, &labels).set(live.utilization);
    }
    if let Some(ledger) = &state.evidence.ledger {
        ledger_gauges(state, &ledger.summary());
    }
    for (name, route) in state
        .routing
        .routes
        .iter()
        .filter(|(_, r)| r.prefilter.is_some())
    {
        let view = route.risk.view(&policy.cfg);
        let broken = view.as_ref().is_some_and(|v| v.theta_audits.is_some());
        metrics::gauge!(m::RISK_AUDIT_BREACH, "route" => name.clone())
            .set(f64::from(u8::from(broken)));
        if let Some(v) = view {
            metrics::gauge!(m::RISK_THETA, "route" => name.clone()).set(v.theta);
            metrics::gauge!(m::RISK_CALIBRATION_FLAWED, "route" => name.clone())
                .set(f64::from(u8::from(v.calibration_flaw.is_some())));
            metrics::gauge!(m::RISK_UPPER_BOUND, "route" => name.clone()).set(v.upper_bound);
        }
    }
    for (_, llm) in state.llms() {
        metrics::gauge!(m::QUEUE_DEPTH, "backend" => llm.name.clone())
            .set(llm.client.in_flight() as f64);
        metrics::gauge!(m::QUEUE_WAITING, "backend" => llm.name.clone()).set(llm.waiting() as f64);
        metrics::counter!(m::WORKER_RESTARTS, "backend" => llm.name.clone()).absolute(
            llm.supervisor
                .stats
                .restarts
                .load(std::sync::atomic::Ordering::Relaxed),
        );
    }
}

/// The ledger's gauges, of each route's head in force: silent error with its interval, audits, feedback
/// accuracy (trusted feedback).
fn ledger_gauges(state: &AppState, s: &crate::evidence::ledger::Summary) {
    for (route, r) in &s.routes {
        let head = state
            .routing
            .routes
            .get(route)
            .map(|x| x.head_version.clone());
        let head = head.as_deref();
        metrics::gauge!(m::AUDITS, "route" => route.clone(), "state" => "pending")
            .set(r.pending_of(head) as f64);
        metrics::gauge!(m::AUDITS, "route" => route.clone(), "state" => "labelled")
            .set(r.audits(head, crate::evidence::ledger::summary::TIER0).n as f64);
        if let Some(e) = r.silent_error(head) {
            for (bound, v) in [
                ("estimate", e.estimate),
                ("lower", e.lower),
                ("upper", e.upper),
            ] {
                metrics::gauge!(m::SILENT_ERROR, "route" => route.clone(), "bound" => bound).set(v);
            }
        }
        for (channel, c) in &r.feedback {
            if let Some(a) = c.accuracy() {
                metrics::gauge!(m::FEEDBACK_ACCURACY, "route" => route.clone(), "channel" => channel.clone()).set(a);
            }
        }
    }
}
