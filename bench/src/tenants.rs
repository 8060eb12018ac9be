//! A multi-tenant run (`--tenant`, repeated): every tenant's open-loop workload runs at the same time with its
//! own API key, and each gets its own report (channels, latency band, SLO lines), so one run shows whether one
//! tenant's flood reaches another's escalations.

use std::sync::Arc;

use serde_json::Value;
use tokio::sync::watch;

use crate::args::TenantMix;
use crate::http::HttpClient;
use crate::report::RunReport;
use crate::run::{execute, Load, Plan};
use crate::slo::SloLine;

/// Runs `mixes` together against `url`, each on `base` with its own key, rate, workload and route.
pub async fn run(
    url: &str,
    mixes: &[TenantMix],
    base: &Plan,
    settings: &Value,
    slo: &[SloLine],
    patience: Option<&crate::patience::Patience>,
    stop: watch::Receiver<bool>,
) -> Result<Vec<RunReport>, String> {
    let mut tasks = Vec::new();
    for (i, m) in mixes.iter().enumerate() {
        let mut plan = base.clone();
        if let Some(p) = &m.data {
            plan.items = Arc::new(crate::workload::load(p)?);
        }
        if let Some(r) = &m.route {
            plan.route = r.clone();
        }
        if let Load::Open { schedule, .. } = &mut plan.load {
            schedule.base = m.rate;
        }
        plan.name = m.name.clone();
        plan.seed = base.seed.wrapping_add(i as u64);
        let client = HttpClient::new(url, m.key.clone());
        let stop = stop.clone();
        tasks.push(tokio::spawn(async move {
            let data = execute(&client, &plan, stop).await;
            (plan, data)
        }));
    }
    let mut runs = Vec::new();
    for (m, t) in mixes.iter().zip(tasks) {
        let (plan, data) = t.await.map_err(|e| format!("tenant {}: {e}", m.name))?;
        let mut s = settings.clone();
        s["tenant"] = Value::from(m.name.as_str());
        s["rate"] = Value::from(m.rate);
        s["route"] = Value::from(plan.route.as_str());
        s["workload_items"] = Value::from(plan.items.len());
        if let Some(p) = &m.data {
            s["data"] = Value::from(p.display().to_string());
        }
        runs.push(RunReport::build(&m.name, s, &data, slo, patience));
    }
    Ok(runs)
}
