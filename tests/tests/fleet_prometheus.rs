//! The Prometheus utilisation source against a real Prometheus (Debian `prometheus`, started by the test on a
//! free loopback port): server A publishes a utilisation an operator sets (`manual`) on `/metrics`, Prometheus
//! scrapes it every second, server B runs the `load` policy with `utilization_source = "prometheus"` and a
//! query over A's series. B's θ moves with A's value, and falls back to its workers when Prometheus is gone.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

use std::time::{Duration, Instant};

use serde_json::{json, Value};

mod common;
use common::start;

fn routing(admin: &str) -> Value {
    ureq::get(&format!("{admin}/admin/routing"))
        .call()
        .unwrap()
        .into_json()
        .unwrap()
}

/// Waits until `ok` holds for B's routing view; returns that view.
fn wait_for(admin: &str, what: &str, ok: impl Fn(&Value) -> bool) -> Value {
    let t = Instant::now();
    loop {
        let v = routing(admin);
        if ok(&v) {
            return v;
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "{what}: last view {v}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn theta_follows_the_fleet_utilisation_from_a_real_prometheus() {
    let a = start(&[
        "--set",
        "reranker.workers=0",
        "--set",
        "routing.utilization_source=\"manual\"",
        "--set",
        "routing.manual_utilization=0.9",
    ]);
    let dir = tempfile::tempdir().unwrap();
    let target = a.base.trim_start_matches("http://");
    let config = format!(
        "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: a\n    static_configs:\n      - targets: ['{target}']\n"
    );
    let (prom, prom_url) = common::prometheus(dir.path(), &config);
    let b = start(&[
        "--set",
        "reranker.engine=\"stub\"",
        "--set",
        "routing.mode=\"load\"",
        "--set",
        "routing.utilization_source=\"prometheus\"",
        "--set",
        &format!("utilization.prometheus_url=\"{prom_url}\""),
        "--set",
        "utilization.prometheus_query='max(tiergate_utilization_ratio{job=\"a\"})'",
        "--set",
        "utilization.poll_ms=300",
        "--set",
        "utilization.stale_ms=2000",
    ]);
    // θ_eff = θ_base + k·u = 0.65 + 0.15·0.9 once B has A's 0.9 (smoothed).
    let v = wait_for(&b.admin, "B takes A's 0.9 from Prometheus", |v| {
        v["utilization_in_use"] == "prometheus"
            && (v["utilization"].as_f64().unwrap() - 0.9).abs() < 0.02
    });
    assert!(
        (v["theta_eff"].as_f64().unwrap() - 0.785).abs() < 0.01,
        "{v}"
    );
    // The operator lowers A's utilisation: B's θ follows within a few scrapes.
    let r = ureq::request("PATCH", &format!("{}/admin/routing", a.admin))
        .send_json(json!({"manual_utilization": 0.1}))
        .unwrap();
    assert_eq!(r.status(), 200);
    let v = wait_for(&b.admin, "B follows A down to 0.1", |v| {
        (v["utilization"].as_f64().unwrap() - 0.1).abs() < 0.02
    });
    assert!(
        (v["theta_eff"].as_f64().unwrap() - 0.665).abs() < 0.01,
        "{v}"
    );
    // Prometheus gone: once the value is stale, B falls back to its own workers' busy time.
    drop(prom);
    wait_for(&b.admin, "B falls back to its workers", |v| {
        v["utilization_in_use"] == "workers"
    });
}
