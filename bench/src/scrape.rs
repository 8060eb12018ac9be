//! What the server says while the load runs: θ_eff, utilisation, LLM queue depth (GET /admin/routing,
//! once a second), and which routes it serves (GET /v1/models).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hyper::Method;
use serde::Serialize;
use serde_json::Value;
use tokio::sync::watch;

use crate::http::HttpClient;

/// One scrape.
#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    /// Seconds from the start of the run.
    pub t: f64,
    pub theta_eff: Option<f64>,
    pub utilization: Option<f64>,
    pub queue_depth: Option<f64>,
    pub escalated_share_10s: Option<f64>,
    pub mode: Option<String>,
    pub version: Option<u64>,
    /// The run's route's silent error and error bound (runs with `--feedback`, `--label-audits` or
    /// `--drift-at`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quality: Option<crate::operator::Quality>,
}

/// The scrape record of a run.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Scrape {
    pub samples: Vec<Sample>,
    /// Why there are no samples (no admin access, not a tiergate server, …).
    pub unavailable: Option<String>,
}

impl Sample {
    pub fn from_view(t: f64, v: &Value) -> Self {
        Self {
            t,
            theta_eff: v["theta_eff"].as_f64(),
            utilization: v["utilization"].as_f64(),
            queue_depth: v["queue_depth"].as_f64(),
            escalated_share_10s: v["escalated_share_10s"].as_f64(),
            mode: v["mode"].as_str().map(str::to_string),
            version: v["version"].as_u64(),
            quality: None,
        }
    }
}

/// GET /admin/routing.
pub async fn routing(client: &HttpClient, token: Option<&str>) -> Result<Value, String> {
    let (status, v) = client
        .json(Method::GET, "/admin/routing", token, None)
        .await?;
    if status != 200 {
        let msg = v["error"]["message"].as_str().unwrap_or("").to_string();
        return Err(format!("GET /admin/routing → {status} {msg}")
            .trim()
            .to_string());
    }
    Ok(v)
}

/// Scrape once a second until `stop` turns true; runs that follow the server's quality (`quality_of`) scrape
/// once more then, so the report ends with the state the run left.
pub async fn scrape_loop(
    client: HttpClient,
    token: Option<String>,
    start: Instant,
    mut stop: watch::Receiver<bool>,
    out: Arc<Mutex<Scrape>>,
    quality_of: Option<String>,
) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let last = tokio::select! {
            _ = tick.tick() => *stop.borrow(),
            _ = stop.changed() => true,
        };
        if last && quality_of.is_none() {
            return;
        }
        let got = routing(&client, token.as_deref()).await;
        let feedback = match (&quality_of, &got) {
            (Some(_), Ok(_)) => client
                .json(Method::GET, "/admin/feedback", token.as_deref(), None)
                .await
                .ok()
                .map(|(_, v)| v),
            _ => None,
        };
        let t = start.elapsed().as_secs_f64();
        let Ok(mut rec) = out.lock() else { return };
        match got {
            Ok(v) => {
                let mut sample = Sample::from_view(t, &v);
                if let (Some(route), Some(f)) = (&quality_of, &feedback) {
                    sample.quality = Some(crate::operator::Quality::of(f, &v, route));
                }
                rec.samples.push(sample);
            }
            Err(e) => {
                if rec.samples.is_empty() {
                    rec.unavailable = Some(e);
                    return;
                }
            }
        }
        if last {
            return;
        }
    }
}

/// A route the server lists.
#[derive(Debug, Clone, Serialize)]
pub struct Route {
    pub id: String,
    /// tiergate's `tiergate_kind` (classify, answer, generate); `None` for other servers.
    pub kind: Option<String>,
}

/// GET /v1/models.
pub async fn models(client: &HttpClient, api_key: Option<&str>) -> Result<Vec<Route>, String> {
    let (status, v) = client
        .json(Method::GET, "/v1/models", api_key, None)
        .await?;
    if status != 200 {
        return Err(format!("GET /v1/models → {status}"));
    }
    Ok(v["data"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|m| {
                    Some(Route {
                        id: m["id"].as_str()?.to_string(),
                        kind: m["tiergate_kind"].as_str().map(str::to_string),
                    })
                })
                .collect()
        })
        .unwrap_or_default())
}

/// The route to use without --route: the first classify route, else the first listed.
pub fn default_route(routes: &[Route]) -> Option<&Route> {
    routes
        .iter()
        .find(|r| r.kind.as_deref() == Some("classify"))
        .or_else(|| routes.first())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_the_first_classify_route() {
        let r = |id: &str, k: Option<&str>| Route {
            id: id.into(),
            kind: k.map(str::to_string),
        };
        let routes = vec![
            r("gen", Some("generate")),
            r("c1", Some("classify")),
            r("c2", Some("classify")),
        ];
        assert_eq!(default_route(&routes).unwrap().id, "c1");
        assert_eq!(default_route(&[r("gpt", None)]).unwrap().id, "gpt");
        assert!(default_route(&[]).is_none());
    }
}
