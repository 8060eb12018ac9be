//! `/console` in a real browser: headless Chromium (Debian `chromium`) driven over the Chrome DevTools
//! Protocol by `tests/python/console_browser.py` against the real `tiergate serve` under a little traffic:
//! the page shows live data, moving θ_base and applying it changes the policy (seen on the page and in
//! `GET /admin/routing`), and a refused change shows the server's error.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

use std::process::Command;
use std::time::Duration;

use serde_json::{json, Value};
use tiergate_tests::root;

mod common;
use common::start;

#[test]
fn the_console_shows_live_data_and_changes_the_policy_in_a_real_browser() {
    let s = start(&[
        "--set",
        "reranker.engine=\"stub\"",
        "--set",
        "routing.mode=\"static\"",
        // Every request escalates, and the answer cache is on: the repeated question is a hit.
        "--set",
        "routing.theta_base=0.0",
        "--set",
        "cache.enabled=true",
    ]);
    for text in [
        "my card was stolen",
        "hmm something odd",
        "what is the exchange rate",
        "my card was stolen",
    ] {
        let _ = ureq::post(&format!("{}/v1/chat/completions", s.base)).send_json(
            json!({"model": "classify", "messages": [{"role": "user", "content": text}]}),
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let shot = dir.path().join("console.png");
    let out = Command::new("python3")
        .arg(root().join("tests/python/console_browser.py"))
        .arg(&s.admin)
        .arg(&shot)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "console_browser.py (chromium, websocket-client):\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let seen: Value = serde_json::from_slice(&out.stdout).unwrap();
    let (v0, v1) = (seen["v0"].as_u64().unwrap(), seen["v1"].as_u64().unwrap());
    assert_eq!(v1, v0 + 1, "{seen}");
    assert!(
        seen["ok"]
            .as_str()
            .unwrap()
            .contains(&format!("version {v1}")),
        "{seen}"
    );
    assert_eq!(seen["theta_after"], "0.330", "{seen}");
    assert!(
        seen["error"].as_str().unwrap().contains("refused (400)"),
        "{seen}"
    );
    assert!(seen["decision_rows"].as_u64().unwrap() >= 3, "{seen}");
    // The time series: at least the point taken at start, drawn.
    assert!(seen["series_points"].as_u64().unwrap() >= 1, "{seen}");
    // The server agrees: the page's change is the policy in force, the refused one is not.
    let r: Value = ureq::get(&format!("{}/admin/routing", s.admin))
        .call()
        .unwrap()
        .into_json()
        .unwrap();
    assert_eq!(r["version"].as_u64(), Some(v1));
    assert_eq!(r["theta_base"].as_f64(), Some(0.33));
    assert_eq!(r["k"].as_f64(), Some(0.15));
    // The cache card: one hit among the four decisions, as the data behind it says.
    let live: Value = ureq::get(&format!("{}/admin/console", s.admin))
        .call()
        .unwrap()
        .into_json()
        .unwrap();
    assert_eq!(live["cache"]["hits_recent"], 1, "{}", live["cache"]);
    let share = live["cache"]["hit_share_recent"].as_f64().unwrap();
    assert!(
        seen["cache"]
            .as_str()
            .unwrap()
            .starts_with(&format!("{:.1}% hits · ", 100.0 * share)),
        "{seen}"
    );
    let png = std::fs::read(&shot).unwrap();
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 10_000,
        "{} bytes",
        png.len()
    );
    std::thread::sleep(Duration::from_millis(10));
}
