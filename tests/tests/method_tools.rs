//! The latency-tier method's tools against a real `tiergate serve`: a latency-injection experiment (stable
//! assignment by `user`, the delay added on the server, the variant in a header and in the metrics, live
//! changes through `/admin/experiments`, never on a route it does not name, on every door), then the real `tiergate-bench`
//! reporting the variants side by side with client patience and the run's cost per tier, and
//! `tiergate-bench slo derive` measuring the overhead from that run's JSON and writing an SLO file the bench
//! then checks.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

use std::collections::HashMap;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tiergate_tests::{binary, root};

mod common;
use common::{start, Server};

const SLOW: &str = "experiments=[{name=\"slow\",share=0.5,delay={dist=\"uniform\",min_ms=150,max_ms=250},routes=[\"classify\"]}]";

fn server() -> Server {
    start(&[
        "--set",
        "reranker.workers=0",
        "--set",
        "routing.mode=\"static\"",
        "--set",
        "routing.theta_base=1.0",
        "--set",
        SLOW,
    ])
}

fn chat(s: &Server, model: &str, user: Option<&str>) -> (ureq::Response, Duration) {
    let mut body = json!({"model": model, "messages": [{"role": "user", "content": "my card has not arrived"}]});
    if let Some(u) = user {
        body["user"] = json!(u);
    }
    let t = Instant::now();
    let r = ureq::post(&format!("{}/v1/chat/completions", s.base))
        .send_json(body)
        .unwrap();
    (r, t.elapsed())
}

fn metric(s: &Server, prefix: &str) -> f64 {
    let text = ureq::get(&format!("{}/metrics", s.base))
        .call()
        .unwrap()
        .into_string()
        .unwrap();
    text.lines()
        .filter(|l| l.starts_with(prefix))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum()
}

#[test]
fn a_latency_experiment_assigns_stably_delays_and_labels() {
    let s = server();
    let mut seen: HashMap<String, u32> = HashMap::new();
    for i in 0..40 {
        let user = format!("user-{i}");
        let (r, took) = chat(&s, "classify", Some(&user));
        let v = r.header("x-tiergate-variant").unwrap().to_string();
        // The same user gets the same variant every time.
        let (again, _) = chat(&s, "classify", Some(&user));
        assert_eq!(again.header("x-tiergate-variant"), Some(v.as_str()));
        if v == "slow" {
            // The delay is added on the server: the client waits at least its minimum.
            assert!(took >= Duration::from_millis(150), "{user}: {took:?}");
        } else {
            assert_eq!(v, "control");
        }
        *seen.entry(v).or_insert(0) += 2;
    }
    // 40 users at a 0.5 share: both variants (all on one side has probability 2^-39).
    assert!(seen["slow"] > 0 && seen["control"] > 0, "{seen:?}");
    // A route the experiment does not name gets no variant and no delay.
    let (r, _) = chat(&s, "answer", Some("user-1"));
    assert!(r.header("x-tiergate-variant").is_none());
    // The metrics carry the variant, counts exactly as the headers said, delays within the distribution.
    let count = |v: &str| {
        metric(
            &s,
            &format!("tiergate_experiment_requests_total{{variant=\"{v}\",route=\"classify\"}}"),
        )
    };
    assert_eq!(count("slow"), f64::from(seen["slow"]));
    assert_eq!(count("control"), f64::from(seen["control"]));
    let sum = metric(
        &s,
        "tiergate_experiment_delay_seconds_sum{variant=\"slow\",route=\"classify\"}",
    );
    let n = metric(
        &s,
        "tiergate_experiment_delay_seconds_count{variant=\"slow\",route=\"classify\"}",
    );
    let mean_ms = sum / n * 1e3;
    assert!((150.0..=250.0).contains(&mean_ms), "{mean_ms}");

    // Live changes: refused with the field named, then a new list takes effect at once.
    let admin = |body: Value| {
        ureq::put(&format!("{}/admin/experiments", s.admin))
            .send_json(body)
            .map_err(Box::new)
    };
    let err = admin(json!({"experiments": [{"name": "x", "share": 0.5,
        "delay": {"dist": "fixed", "ms": 10}, "routes": ["nope"]}]}))
    .unwrap_err();
    let ureq::Error::Status(400, resp) = *err else {
        panic!("{err:?}")
    };
    let body: Value = resp.into_json().unwrap();
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("`nope` is not a configured route"),
        "{body}"
    );
    admin(
        json!({"experiments": [{"name": "answer-fixed", "share": 1.0,
        "delay": {"dist": "fixed", "ms": 120}, "routes": ["answer"]}]}),
    )
    .unwrap();
    let (r, took) = chat(&s, "answer", None);
    assert_eq!(r.header("x-tiergate-variant"), Some("answer-fixed"));
    assert!(took >= Duration::from_millis(120));
    // Every door reaches the experiment through the engine's one call: Messages and Responses too.
    let asked = "my card has not arrived";
    for (path, body) in [
        (
            "/v1/messages",
            json!({"model": "answer", "max_tokens": 16,
            "messages": [{"role": "user", "content": asked}]}),
        ),
        (
            "/v1/responses",
            json!({"model": "answer", "input": asked, "store": false}),
        ),
    ] {
        let t = Instant::now();
        let r = ureq::post(&format!("{}{path}", s.base))
            .send_json(body)
            .unwrap();
        assert_eq!(
            r.header("x-tiergate-variant"),
            Some("answer-fixed"),
            "{path}"
        );
        assert!(t.elapsed() >= Duration::from_millis(120), "{path}");
    }
    let (r, _) = chat(&s, "classify", Some("user-1"));
    assert!(
        r.header("x-tiergate-variant").is_none(),
        "classify left the experiment"
    );
    let listed: Value = ureq::get(&format!("{}/admin/experiments", s.admin))
        .call()
        .unwrap()
        .into_json()
        .unwrap();
    assert_eq!(listed["experiments"][0]["name"], "answer-fixed");
    admin(json!({"experiments": []})).unwrap();
    let (r, _) = chat(&s, "answer", None);
    assert!(r.header("x-tiergate-variant").is_none(), "stopped");
}

/// The stdout of a run that must have succeeded (its stdout and stderr shown otherwise).
fn succeeded(out: &std::process::Output) -> String {
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

fn bench(args: &[&str]) -> std::process::Output {
    Command::new(binary("tiergate-bench"))
        .current_dir(root())
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn the_bench_reports_variants_costs_and_derives_an_slo_from_the_run() {
    let s = server();
    let dir = tempfile::tempdir().unwrap();
    let json_path = dir.path().join("run.json");
    let html_path = dir.path().join("run.html");
    let out = bench(&[
        "--url",
        &s.base,
        "--admin-url",
        &s.admin,
        "--route",
        "classify",
        "--data",
        "bench/workloads/bank24.jsonl",
        "--rate",
        "40",
        "--duration",
        "4s",
        "--patience",
        "uniform:0s..1s",
        "--cost",
        "bench/costs/example-cpu-gpu.toml",
        "--json",
        json_path.to_str().unwrap(),
        "--html",
        html_path.to_str().unwrap(),
        "--quiet",
    ]);
    let text = succeeded(&out);
    assert!(
        text.contains("latency experiment") && text.contains("cost (USD"),
        "{text}"
    );
    let report: Value = serde_json::from_slice(&std::fs::read(&json_path).unwrap()).unwrap();
    let run = &report["runs"][0];
    // Without a `user` each request is keyed by chance: both variants, side by side.
    let variants = run["variants"].as_array().unwrap();
    let v = |name: &str| variants.iter().find(|v| v["variant"] == name).unwrap();
    let (control, slow) = (v("control"), v("slow"));
    let p50 = |v: &Value| v["stats"]["latency"]["p50_ms"].as_f64().unwrap();
    assert!(
        p50(slow) >= 150.0 && p50(slow) > p50(control),
        "{variants:?}"
    );
    // Patience uniform on [0, 1 s]: a request of L ms is abandoned with probability L/1000.
    let (a_control, a_slow) = (
        control["abandoned"].as_f64().unwrap(),
        slow["abandoned"].as_f64().unwrap(),
    );
    assert!(
        (0.15..=0.3).contains(&a_slow) && a_control < a_slow,
        "{a_control} {a_slow}"
    );
    // Cost: all answers are Tier-0 here (θ = 1), so the GPU is idle cost and nothing is escalated.
    let cost = &run["cost"];
    assert_eq!(cost["fleet_hourly"].as_f64(), Some(3.3));
    assert_eq!(cost["idle_hourly"].as_f64(), Some(2.5));
    let served = run["channels"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["channel"] == "served")
        .unwrap()["requests_per_s"]
        .as_f64()
        .unwrap();
    // The injected delays push Tier-0's P95 out of its band (80 ms): its CPU share (0.8/h) costs 1.5×.
    let tier0 = &cost["channels"][0];
    assert_eq!(tier0["channel"], "tier0");
    assert_eq!(tier0["out_of_band"], true, "{cost}");
    let blended = cost["blended_per_1k"].as_f64().unwrap();
    let expected = (2.5 + 0.8 * 1.5) / (served * 3.6);
    assert!((blended - expected).abs() < 1e-9, "{blended} {expected}");
    let html = std::fs::read_to_string(&html_path).unwrap();
    assert!(html.contains("<h3>cost") && html.contains("<h3>latency experiment"));

    // The run reported model time (Server-Timing) and the overhead; derive an SLO from it.
    let overhead = run["channels"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["channel"] == "tier0")
        .unwrap()["overhead"]["p95_ms"]
        .as_f64()
        .unwrap();
    let slo = dir.path().join("slo.toml");
    let out = bench(&[
        "slo",
        "derive",
        "--sla-p95-ms",
        "2000",
        "--from-run",
        json_path.to_str().unwrap(),
        "--channel",
        "tier0",
        "--route",
        "classify",
        "--min-qps",
        "10",
        "--out",
        slo.to_str().unwrap(),
    ]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let budget = ((2000.0 - overhead) * 0.85 * 10.0_f64).round() / 10.0;
    assert!(
        said.contains(&format!("= {budget} ms")),
        "{said} (overhead {overhead})"
    );
    // The derived file is one the bench checks: a fresh run against it passes (the model is MiniLM, ms).
    let out = bench(&[
        "--url",
        &s.base,
        "--route",
        "classify",
        "--rate",
        "20",
        "--duration",
        "2s",
        "--slo",
        slo.to_str().unwrap(),
        "--fail-on-slo",
        "--quiet",
    ]);
    let text = succeeded(&out);
    assert!(
        text.contains("model P95 ≤") && text.contains("PASS"),
        "{text}"
    );
    // A mismatched route is refused with a reason.
    let out = bench(&[
        "slo",
        "derive",
        "--sla-p95-ms",
        "800",
        "--from-run",
        json_path.to_str().unwrap(),
        "--route",
        "answer",
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not `answer`"));
}
