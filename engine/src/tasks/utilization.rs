//! The utilisation signal u: NVML (GPU) when it initialises, the fleet's Prometheus query when configured and
//! fresh, else the reranker workers' busy fraction, else a value an operator sets; smoothed, with the source in
//! use visible in `/admin/routing`. Each policy reads the workers of its own backends: the routing policy
//! those of the routes' first stages, a later stage's policy those of its stage; every backend's queue feeds
//! the brownout ladder, read here every period with the console's series.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Weak;
use std::time::{Duration, Instant};

use tiergate_config::UtilizationSource;
use tiergate_queue::layout::MAX_WORKERS;

use crate::state::{AppState, Llm};

const PERIOD: Duration = Duration::from_millis(500);
const ALPHA: f64 = 0.3;

/// Samples u every 500 ms into the policies, until the state is dropped (it holds only a weak reference).
pub(crate) async fn sample_utilization(state: Weak<AppState>) {
    let nvml = tokio::task::spawn_blocking(|| nvml_wrapper::Nvml::init().ok())
        .await
        .ok()
        .flatten();
    if nvml.is_some() {
        tracing::info!("NVML initialised: GPU utilisation drives the load-adaptive threshold");
    }
    let mut busy = Busy::default();
    let mut smooth: HashMap<String, f64> = HashMap::new();
    loop {
        tokio::time::sleep(PERIOD).await;
        let Some(state) = state.upgrade() else {
            return;
        };
        for (_, llm) in state.llms() {
            metrics::counter!(crate::metrics::EXPIRED_UNSTARTED_TOTAL, "backend" => llm.name.clone())
                .absolute(llm.client.expired_unstarted());
        }
        let signals = Signals {
            gpu: nvml
                .as_ref()
                .and_then(|n| n.device_by_index(0).ok())
                .and_then(|d| d.utilization_rates().ok())
                .map(|u| f64::from(u.gpu) / 100.0),
            fleet: fleet(&state),
            workers: busy.read(&state),
        };
        let firsts: Vec<usize> = state
            .routing
            .routes
            .values()
            .flat_map(|r| {
                let first = r.stages.first();
                first.map_or_else(Vec::new, |s| {
                    s.alternatives.iter().map(|(b, _)| *b).collect()
                })
            })
            .collect();
        let u = feed(
            &state.routing.policy,
            &signals,
            &firsts,
            smooth.entry(String::new()).or_default(),
        );
        for rp in state.route_policies() {
            let smoothed = smooth.entry(rp.key()).or_default();
            feed(&rp.policy, &signals, &rp.backends, smoothed);
        }
        observe_brownout(&state, u);
        sample_history(&state);
    }
}

/// One reading of the pressure for the ladder: the largest over the LLM backends of each one's queue fill
/// and recent P95, and utilisation `u`.
pub(crate) fn observe_brownout(state: &AppState, u: f64) {
    let cfg = &state.config.brownout;
    if !cfg.enabled {
        metrics::gauge!(crate::metrics::BROWNOUT_STEP).set(0.0);
        return;
    }
    let limit = Duration::from_millis(cfg.p95_limit_ms);
    // Each backend's own pressure (kept: a calm stage may generate while a busy one holds the step up). u is
    // its own part only when it is a shared device's (NVML, the fleet's query, a manual value): the workers'
    // u is the busiest first stage's, not every backend's.
    let workers = state.routing.policy.utilization_source() == "workers";
    let shared_u = if workers { 0.0 } else { u };
    let llm = state
        .llms()
        .map(|(_, l)| {
            let (_, waiting) = l.share.load();
            let room = l.limits.in_flight.saturating_sub(l.limits.capacity);
            let p95 = l.rerank_times.recent_p95(Duration::from_secs(30));
            let own = crate::load::brownout::pressure(
                waiting,
                room,
                p95.unwrap_or_default(),
                limit,
                shared_u,
            );
            l.pressure.store(own.to_bits(), Ordering::Relaxed);
            own
        })
        .fold(u, f64::max);
    let max = state.config.server.max_in_flight.max(1);
    let own = max.saturating_sub(state.admission.available_permits()) as f64 / max as f64;
    let Ok(mut ladder) = state.load.brownout.lock() else {
        return;
    };
    let pressure = ladder.fed(llm, own);
    let before = ladder.step();
    let now = ladder.observe(pressure, std::time::Instant::now());
    if now != before {
        tracing::warn!(
            from = before.as_str(),
            to = now.as_str(),
            pressure,
            "brownout step"
        );
    }
    state
        .load
        .brownout_step
        .store(now as u8, std::sync::atomic::Ordering::Relaxed);
    metrics::gauge!(crate::metrics::BROWNOUT_STEP).set(now as u8 as f64);
    metrics::gauge!(crate::metrics::BROWNOUT_PRESSURE).set(pressure);
}

/// Adds a point to the console's series when one is due.
pub(crate) fn sample_history(state: &AppState) {
    let now = std::time::Instant::now();
    if !state.load.history.due(now) {
        return;
    }
    let live = state.routing.policy.live_view(now);
    let recent = state.load.decisions.recent();
    let minute = Duration::from_secs(60);
    let last: Vec<&crate::model::outcome::Decision> =
        recent.iter().filter(|d| d.age(now) < minute).collect();
    let degraded = last
        .iter()
        .filter(|d| d.channel == crate::model::outcome::Channel::Degraded.as_str())
        .count() as f64
        / last.len().max(1) as f64;
    state.load.history.push(
        now,
        crate::load::history::Point {
            t_ms: 0,
            theta_eff: live.theta_eff,
            stage_theta: state
                .route_policies()
                .into_iter()
                .map(|rp| (rp.key(), rp.policy.theta_eff(now)))
                .collect(),
            escalated_share: live.escalated_share_60s,
            degraded_share: degraded,
            p95_ms: crate::load::history::p95_by_channel(&recent, now, minute),
            brownout: state.brownout() as u8,
        },
    );
}

/// One reading of every source.
struct Signals {
    gpu: Option<f64>,
    fleet: Option<f64>,
    /// Each backend's busy fraction (by [`AppState::backend`] index).
    workers: Vec<Option<f64>>,
}

impl Signals {
    /// The busiest of `backends`' workers.
    fn workers(&self, backends: &[usize]) -> Option<f64> {
        backends
            .iter()
            .filter_map(|b| self.workers.get(*b).copied().flatten())
            .reduce(f64::max)
    }
}

/// Feeds `policy` its u from the source it asks for (its backends' workers where workers count), smoothed
/// in `smooth`; returns the smoothed u.
fn feed(
    policy: &crate::routing::policy::Policy,
    s: &Signals,
    backends: &[usize],
    smooth: &mut f64,
) -> f64 {
    let cfg = policy.current().cfg.clone();
    let workers = || s.workers(backends);
    let (sample, source) = match cfg.utilization_source {
        UtilizationSource::Manual => (Some(cfg.manual_utilization), "manual"),
        UtilizationSource::Nvml => (s.gpu, "nvml"),
        UtilizationSource::Workers => (workers(), "workers"),
        // The fleet's value while fresh; the workers' while the query fails or is stale.
        UtilizationSource::Prometheus => match s.fleet {
            Some(u) => (Some(u), "prometheus"),
            None => (workers(), "workers"),
        },
        UtilizationSource::Auto => match (s.gpu, s.fleet) {
            (Some(g), _) => (Some(g), "nvml"),
            (None, Some(u)) => (Some(u), "prometheus"),
            (None, None) => (workers(), "workers"),
        },
    };
    match sample {
        Some(u) => {
            *smooth = if source == "manual" {
                u
            } else {
                tiergate_core::stats::ewma(Some(*smooth), u, ALPHA)
            };
            policy.set_utilization(*smooth, source);
        }
        None => policy.set_utilization(*smooth, "none"),
    }
    *smooth
}

/// The fleet's utilisation from the Prometheus source, while fresh.
fn fleet(state: &AppState) -> Option<f64> {
    let stale = Duration::from_millis(state.config.utilization.stale_ms);
    state
        .load
        .fleet_utilization
        .lock()
        .ok()
        .and_then(|v| *v)
        .filter(|(at, _)| at.elapsed() < stale)
        .map(|(_, u)| u)
}

/// Each backend's workers' busy time at the last reading.
#[derive(Default)]
struct Busy {
    last: HashMap<usize, (Instant, u64)>,
}

impl Busy {
    /// Each backend's busy fraction since the last reading (`None`: no workers, or its first reading).
    fn read(&mut self, state: &AppState) -> Vec<Option<f64>> {
        let mut out = vec![None; state.backends.len()];
        for (i, llm) in state.llms() {
            let busy = busy_ns(llm);
            let now = Instant::now();
            if let (Some((t0, b0)), Some(slot)) = (self.last.insert(i, (now, busy)), out.get_mut(i))
            {
                let live = llm.client.live_workers().max(1) as f64;
                let dt = now.duration_since(t0).as_nanos() as f64;
                *slot = Some((busy.saturating_sub(b0) as f64 / (dt * live)).clamp(0.0, 1.0));
            }
        }
        out
    }
}

/// The nanoseconds `llm`'s workers have been busy, all together.
fn busy_ns(llm: &Llm) -> u64 {
    let h = llm.client.segment().header();
    h.workers
        .iter()
        .take(MAX_WORKERS)
        .map(|w| w.busy_ns.load(Ordering::Relaxed))
        .sum()
}

/// Seconds since the Unix epoch (0 on a clock before it).
pub(crate) fn unix_now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The labelled rows of a file: CSV with a header (`text`, `category` or `label`) or JSONL (`.jsonl`, `text`
/// and `label` fields). A head swap's held-out rows.
pub(crate) fn labelled_rows(path: &std::path::Path) -> Result<Vec<(String, String)>, String> {
    let at = |e: &dyn std::fmt::Display| format!("{}: {e}", path.display());
    let jsonl = path
        .extension()
        .is_some_and(|e| e == "jsonl" || e == "ndjson");
    if jsonl {
        let raw = std::fs::read_to_string(path).map_err(|e| at(&e))?;
        return raw
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
            .map(|(i, l)| {
                let v: serde_json::Value =
                    serde_json::from_str(l).map_err(|e| at(&format!("line {}: {e}", i + 1)))?;
                match (v["text"].as_str(), v["label"].as_str()) {
                    (Some(t), Some(l)) => Ok((t.to_string(), l.to_string())),
                    _ => Err(at(&format!("line {}: needs `text` and `label`", i + 1))),
                }
            })
            .collect();
    }
    let mut r = csv::Reader::from_path(path).map_err(|e| at(&e))?;
    let headers = r.headers().map_err(|e| at(&e))?.clone();
    let col = |names: &[&str]| headers.iter().position(|h| names.contains(&h));
    let (Some(t), Some(l)) = (col(&["text"]), col(&["category", "label"])) else {
        return Err(at(&"needs a `text` and a `category` (or `label`) column"));
    };
    r.records()
        .map(|rec| {
            let rec = rec.map_err(|e| at(&e))?;
            match (rec.get(t), rec.get(l)) {
                (Some(a), Some(b)) => Ok((a.to_string(), b.to_string())),
                _ => Err(at(&"a row is short of columns")),
            }
        })
        .collect()
}
