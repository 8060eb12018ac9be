//! The Prometheus utilisation source: polls a PromQL query on the fleet's Prometheus and keeps the latest value
//! with its time, for the sampler (`util.rs`) to use while it is fresh.

use std::sync::Weak;
use std::time::{Duration, Instant};

use serde_json::Value;
use tiergate_config::UtilizationConfig;

use crate::state::AppState;

/// Polls `cfg.prometheus_query` every `poll_ms` until the state is dropped; each good answer is stored in
/// `AppState::fleet_utilization` with its time. Failures are logged (once per change of message) and leave
/// the last value to go stale.
pub(crate) async fn poll_prometheus(state: Weak<AppState>, cfg: UtilizationConfig) {
    let client = match reqwest::Client::builder()
        .timeout(Duration::from_millis(cfg.timeout_ms))
        .build()
    {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(error = %e, "cannot build the Prometheus client: source disabled");
            return;
        }
    };
    let url = format!("{}/api/v1/query", cfg.prometheus_url.trim_end_matches('/'));
    let mut last_error = String::new();
    loop {
        let Some(state) = state.upgrade() else {
            return;
        };
        match query(&client, &url, &cfg.prometheus_query).await {
            Ok(u) => {
                if !last_error.is_empty() {
                    tracing::info!("Prometheus utilisation query answers again");
                    last_error.clear();
                }
                if let Ok(mut slot) = state.load.fleet_utilization.lock() {
                    *slot = Some((Instant::now(), u));
                }
            }
            Err(e) => {
                if e != last_error {
                    tracing::warn!(error = %e, query = %cfg.prometheus_query, "Prometheus utilisation query failed");
                    last_error = e;
                }
            }
        }
        drop(state);
        tokio::time::sleep(Duration::from_millis(cfg.poll_ms)).await;
    }
}

/// Runs one instant query; the answer must be a scalar or exactly one series, a finite number.
async fn query(client: &reqwest::Client, url: &str, q: &str) -> Result<f64, String> {
    let resp = client
        .get(url)
        .query(&[("query", q)])
        .send()
        .await
        .map_err(|e| format!("Prometheus unreachable: {e}"))?;
    let status = resp.status();
    let v: Value = resp
        .json()
        .await
        .map_err(|e| format!("Prometheus answered {status} without JSON: {e}"))?;
    parse(&v)
}

/// The number in a Prometheus instant-query answer, clamped to [0, 1].
pub(crate) fn parse(v: &Value) -> Result<f64, String> {
    if v["status"] != "success" {
        return Err(format!(
            "query failed: {}",
            v["error"].as_str().unwrap_or("no error message")
        ));
    }
    let data = &v["data"];
    let value = match data["resultType"].as_str() {
        Some("scalar") => &data["result"],
        Some("vector") => {
            let series = data["result"].as_array().map_or(&[][..], Vec::as_slice);
            match series {
                [one] => &one["value"],
                [] => return Err("the query returned no series".into()),
                many => {
                    return Err(format!(
                        "the query returned {} series: aggregate it (avg, max, sum …) to one",
                        many.len()
                    ))
                }
            }
        }
        other => return Err(format!("unsupported result type {other:?}")),
    };
    let x: f64 = value[1]
        .as_str()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("no number in {value}"))?;
    if !x.is_finite() {
        return Err(format!("the query's value is {x}"));
    }
    Ok(x.clamp(0.0, 1.0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn vector_and_scalar_answers_parse_and_clamp() {
        let vector = json!({"status": "success", "data": {"resultType": "vector",
            "result": [{"metric": {}, "value": [1.0, "0.42"]}]}});
        assert_eq!(parse(&vector), Ok(0.42));
        let scalar =
            json!({"status": "success", "data": {"resultType": "scalar", "result": [1.0, "1.7"]}});
        assert_eq!(parse(&scalar), Ok(1.0));
        let two = json!({"status": "success", "data": {"resultType": "vector",
            "result": [{"value": [1.0, "0.1"]}, {"value": [1.0, "0.2"]}]}});
        assert!(parse(&two).unwrap_err().contains("aggregate"));
        let none = json!({"status": "success", "data": {"resultType": "vector", "result": []}});
        assert!(parse(&none).is_err());
        let nan =
            json!({"status": "success", "data": {"resultType": "scalar", "result": [1.0, "NaN"]}});
        assert!(parse(&nan).is_err());
        let bad = json!({"status": "error", "error": "parse error"});
        assert!(parse(&bad).unwrap_err().contains("parse error"));
    }
}
