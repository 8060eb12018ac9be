//! The utilisation signal u: NVML (GPU) when it initialises, the fleet's Prometheus query when configured and
//! fresh, else the reranker workers' busy fraction, else a value an operator sets; smoothed, with the source in
//! use visible in `/admin/routing`.

use std::sync::atomic::Ordering;
use std::sync::Weak;
use std::time::{Duration, Instant};

use tiergate_config::UtilizationSource;
use tiergate_queue::layout::MAX_WORKERS;

use crate::app::AppState;

const PERIOD: Duration = Duration::from_millis(500);
const ALPHA: f64 = 0.3;

/// Samples u every 500 ms into the policy, until the state is dropped (it holds only a weak reference).
pub async fn sample_utilization(state: Weak<AppState>) {
    let nvml = tokio::task::spawn_blocking(|| nvml_wrapper::Nvml::init().ok())
        .await
        .ok()
        .flatten();
    if nvml.is_some() {
        tracing::info!("NVML initialised: GPU utilisation drives the load-adaptive threshold");
    }
    let mut last_busy: Option<(Instant, u64)> = None;
    let mut smooth = 0.0f64;
    loop {
        tokio::time::sleep(PERIOD).await;
        let Some(state) = state.upgrade() else {
            return;
        };
        if let Some(llm) = &state.llm {
            metrics::counter!(crate::metrics::EXPIRED_UNSTARTED_TOTAL)
                .absolute(llm.client.expired_unstarted());
        }
        let policy = state.policy.current();
        let want = policy.cfg.utilization_source;
        let gpu = || {
            nvml.as_ref()
                .and_then(|n| n.device_by_index(0).ok())
                .and_then(|d| d.utilization_rates().ok())
                .map(|u| f64::from(u.gpu) / 100.0)
        };
        let mut workers = || -> Option<f64> {
            let llm = state.llm.as_ref()?;
            let h = llm.client.segment().header();
            let live = llm.client.live_workers().max(1) as f64;
            let busy: u64 = h
                .workers
                .iter()
                .take(MAX_WORKERS)
                .map(|w| w.busy_ns.load(Ordering::Relaxed))
                .sum();
            let now = Instant::now();
            let (t0, b0) = last_busy.replace((now, busy))?;
            let dt = now.duration_since(t0).as_nanos() as f64;
            Some((busy.saturating_sub(b0) as f64 / (dt * live)).clamp(0.0, 1.0))
        };
        let stale = Duration::from_millis(state.config.utilization.stale_ms);
        let fleet = state
            .fleet_utilization
            .lock()
            .ok()
            .and_then(|v| *v)
            .filter(|(at, _)| at.elapsed() < stale)
            .map(|(_, u)| u);
        let (sample, source) = match want {
            UtilizationSource::Manual => (Some(policy.cfg.manual_utilization), "manual"),
            UtilizationSource::Nvml => (gpu(), "nvml"),
            UtilizationSource::Workers => (workers(), "workers"),
            // The fleet's value while fresh; the workers' while the query fails or is stale.
            UtilizationSource::Prometheus => match fleet {
                Some(u) => (Some(u), "prometheus"),
                None => (workers(), "workers"),
            },
            UtilizationSource::Auto => match (gpu(), fleet) {
                (Some(g), _) => (Some(g), "nvml"),
                (None, Some(u)) => (Some(u), "prometheus"),
                (None, None) => (workers(), "workers"),
            },
        };
        if let Some(u) = sample {
            smooth = if source == "manual" {
                u
            } else {
                tiergate_core::stats::ewma(Some(smooth), u, ALPHA)
            };
            state.policy.set_utilization(smooth, source);
            for (_, _, p) in state.stage_policies() {
                p.set_utilization(smooth, source);
            }
        } else {
            state.policy.set_utilization(smooth, "none");
        }
        state.observe_brownout(smooth);
        state.sample_history();
    }
}

/// Seconds since the Unix epoch (0 on a clock before it).
pub fn unix_now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
