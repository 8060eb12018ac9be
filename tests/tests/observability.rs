//! The Prometheus rules and the Grafana dashboard against the real thing: `promtool check rules`, then a real
//! Prometheus (Debian package, started by the test) scrapes a real `tiergate serve` under a little traffic and
//! evaluates `deploy/prometheus/rules.yml`; every rule must evaluate without error, every recording rule and
//! every alert's measured side must return data, and so must every query of `deploy/grafana/tiergate.json`
//! (no typo'd metric name, no empty panel).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tiergate_tests::root;

mod common;
use common::start;

/// The result vector of an instant query (panics on a query error).
fn query(prom: &str, q: &str) -> Vec<Value> {
    let v: Value = ureq::get(&format!("{prom}/api/v1/query"))
        .query("query", q)
        .call()
        .unwrap_or_else(|e| panic!("{q}: {e}"))
        .into_json()
        .unwrap();
    assert_eq!(v["status"], "success", "{q}: {v}");
    match &v["data"]["result"] {
        Value::Array(a) => a.clone(),
        scalar => vec![scalar.clone()],
    }
}

/// The measured sides of an alert expression: `A > c and B > c` → [A, B].
fn measured_sides(expr: &str) -> Vec<String> {
    expr.split(" and ")
        .map(|part| {
            part.rsplit_once(" > ")
                .map_or(part, |(lhs, _)| lhs)
                .trim()
                .to_string()
        })
        .collect()
}

#[test]
fn rules_and_dashboard_queries_return_data_from_a_real_prometheus() {
    let rules = root().join("deploy/prometheus/rules.yml");
    let check = Command::new("promtool")
        .arg("check")
        .arg("rules")
        .arg(&rules)
        .output()
        .expect("promtool (Debian package `prometheus`)");
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stdout)
    );

    let s = start(&[
        "--set",
        "reranker.engine=\"stub\"",
        "--set",
        "reranker.extra_args=[\"--stub-delay-ms\", \"20\"]",
        "--set",
        "routing.allow_header_override=true",
        "--set",
        "server.admin_token=\"observability-token\"",
    ]);
    // Rules evaluated every second instead of every 15 s, so the test need not wait.
    let dir = tempfile::tempdir().unwrap();
    let fast = std::fs::read_to_string(&rules)
        .unwrap()
        .replace("interval: 15s", "interval: 1s");
    std::fs::write(dir.path().join("rules.yml"), fast).unwrap();
    let target = s.base.trim_start_matches("http://");
    let config = format!(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files: ['{}']\n\
         scrape_configs:\n  - job_name: tiergate\n    static_configs:\n      - targets: ['{target}']\n",
        dir.path().join("rules.yml").display()
    );
    let (_prom, prom) = common::prometheus(dir.path(), &config);

    // A little traffic on every channel: Tier-0 answers, forced escalations, a generation, an error.
    let chat = |model: &str, text: &str, force: bool| {
        let mut r = ureq::post(&format!("{}/v1/chat/completions", s.base));
        if force {
            r = r
                .set("x-tiergate-threshold", "0")
                .set("x-tiergate-admin-token", "observability-token");
        }
        let _ = r.send_json(json!({"model": model, "max_tokens": 4,
            "messages": [{"role": "user", "content": text}]}));
    };
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(8) {
        chat("classify", "my card was stolen", false);
        chat("classify", "what is the exchange rate", true);
        chat("generate", "hello there", false);
        chat("no-such-model", "x", false);
        std::thread::sleep(Duration::from_millis(100));
    }

    // Every rule evaluates without error (and has been evaluated).
    let t = Instant::now();
    let rules_state = loop {
        let v: Value = ureq::get(&format!("{prom}/api/v1/rules"))
            .call()
            .unwrap()
            .into_json()
            .unwrap();
        let all: Vec<Value> = v["data"]["groups"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|g| g["rules"].as_array().unwrap().clone())
            .collect();
        let evaluated = all.len() == 21
            && all.iter().all(|r| {
                r["lastEvaluation"]
                    .as_str()
                    .is_some_and(|e| !e.starts_with("0001"))
            });
        if evaluated || t.elapsed() > Duration::from_secs(30) {
            break all;
        }
        std::thread::sleep(Duration::from_millis(500));
    };
    assert_eq!(rules_state.len(), 21, "rules loaded: {rules_state:?}");
    for r in &rules_state {
        assert_eq!(r["health"], "ok", "{r}");
    }

    // Recording rules and the measured sides of the alerts return data.
    let mut queries: Vec<String> = Vec::new();
    for r in &rules_state {
        if r["type"] == "recording" {
            queries.push(r["name"].as_str().unwrap().to_string());
        } else {
            queries.extend(measured_sides(r["query"].as_str().unwrap()));
        }
    }
    // Every panel query of the dashboard returns data.
    let dash: Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("deploy/grafana/tiergate.json")).unwrap(),
    )
    .unwrap();
    let panels = dash["panels"].as_array().unwrap();
    assert!(panels.len() >= 8);
    for p in panels {
        let targets = p["targets"].as_array().unwrap();
        assert!(!targets.is_empty(), "panel {} has no query", p["title"]);
        for tg in targets {
            queries.push(
                tg["expr"]
                    .as_str()
                    .unwrap()
                    .replace("$__rate_interval", "1m"),
            );
        }
    }
    let t = Instant::now();
    let mut empty: Vec<String> = queries.clone();
    while !empty.is_empty() && t.elapsed() < Duration::from_secs(30) {
        empty.retain(|q| query(&prom, q).is_empty());
        if !empty.is_empty() {
            std::thread::sleep(Duration::from_millis(500));
        }
    }
    assert!(empty.is_empty(), "queries without data: {empty:#?}");
    // The per-channel series exist for the channels the traffic produced.
    let p95 = query(&prom, "tiergate:request_duration_seconds:p95_5m");
    let channels: Vec<&str> = p95
        .iter()
        .filter_map(|s| s["metric"]["channel"].as_str())
        .collect();
    assert!(
        channels.contains(&"tier0") && channels.contains(&"escalated"),
        "{channels:?}"
    );
}
