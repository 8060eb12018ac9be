//! The real `tiergate-bench` binary against an in-process mock of tiergate's HTTP surface, whose channels
//! and answers are known: "easy" requests are answered by Tier-0 (right), "hard" ones escalate (100 ms, right)
//! or, when the threshold keeps them at Tier-0, get a wrong answer; "busy" ones come back degraded; "fail"
//! ones get a 429. /admin/routing needs `Bearer secret` and honours PATCH.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::SocketAddr;
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};

#[derive(Clone)]
struct Mock {
    policy: Arc<Mutex<Value>>,
    patches: Arc<Mutex<Vec<Value>>>,
}

fn authorized(h: &HeaderMap) -> bool {
    h.get("authorization").and_then(|v| v.to_str().ok()) == Some("Bearer secret")
}

async fn models() -> Json<Value> {
    Json(json!({"object": "list", "data": [
        {"id": "gen", "object": "model", "tiergate_kind": "generate"},
        {"id": "classify", "object": "model", "tiergate_kind": "classify"},
    ]}))
}

async fn routing_get(State(m): State<Mock>, h: HeaderMap) -> Response {
    if !authorized(&h) {
        return (
            StatusCode::UNAUTHORIZED,
            Json(json!({"error": {"message": "token", "type": "authentication_error"}})),
        )
            .into_response();
    }
    let mut v = m.policy.lock().unwrap().clone();
    v["theta_eff"] = v["theta_base"].clone();
    v["utilization"] = json!(0.0);
    v["queue_depth"] = json!(0);
    v["escalated_share_10s"] = json!(0.25);
    v["version"] = json!(m.patches.lock().unwrap().len());
    Json(v).into_response()
}

async fn routing_patch(State(m): State<Mock>, h: HeaderMap, Json(body): Json<Value>) -> Response {
    if !authorized(&h) {
        return StatusCode::UNAUTHORIZED.into_response();
    }
    let mut p = m.policy.lock().unwrap();
    for (k, v) in body.as_object().unwrap() {
        p[k] = v.clone();
    }
    m.patches.lock().unwrap().push(body);
    Json(p.clone()).into_response()
}

async fn chat(State(m): State<Mock>, h: HeaderMap, Json(req): Json<Value>) -> Response {
    let text = req["messages"][0]["content"]
        .as_str()
        .unwrap_or("")
        .to_string();
    let stream = req["stream"].as_bool().unwrap_or(false);
    let theta = match h.get("x-tiergate-threshold") {
        Some(v) => v.to_str().unwrap().parse::<f64>().unwrap(),
        None => m.policy.lock().unwrap()["theta_base"].as_f64().unwrap(),
    };
    let kind = text.split_whitespace().next().unwrap_or("");
    let ambiguity = if kind == "easy" { 0.05 } else { 0.5 };
    let escalate = ambiguity > theta;
    let (tier, degraded, answer) = match (kind, escalate) {
        ("fail", _) => {
            return (
                StatusCode::TOO_MANY_REQUESTS,
                Json(json!({"error": {"message": "slow down", "type": "rate_limit_exceeded", "param": null, "code": null}})),
            )
                .into_response()
        }
        ("busy", true) => ("tier0", Some("queue_full"), "c"),
        ("busy", false) => ("tier0", None, "c"),
        ("hard", false) => ("tier0", None, "a"),
        (_, true) => ("llm", None, if kind == "easy" { "a" } else { "b" }),
        (_, false) => ("tier0", None, "a"),
    };
    if tier == "llm" {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut resp = if stream {
        let chunk = |delta: Value, finish: Value| json!({"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
        let body = format!(
            "data: {}\n\ndata: {}\n\ndata: {}\n\ndata: {}\n\ndata: [DONE]\n\n",
            chunk(json!({"role": "assistant"}), Value::Null),
            chunk(json!({"content": answer}), Value::Null),
            chunk(json!({}), json!("stop")),
            json!({"object": "chat.completion.chunk", "choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7}}),
        );
        Response::builder()
            .header("content-type", "text/event-stream")
            .body(Body::from(body))
            .unwrap()
    } else {
        Json(json!({
            "object": "chat.completion",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": answer}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7},
        }))
        .into_response()
    };
    resp.headers_mut()
        .insert("x-tiergate-tier", tier.parse().unwrap());
    if let Some(d) = degraded {
        resp.headers_mut()
            .insert("x-tiergate-degraded", d.parse().unwrap());
    }
    resp
}

/// Start the mock on its own thread; returns its address and state.
fn mock() -> (SocketAddr, Mock) {
    let m = Mock {
        policy: Arc::new(Mutex::new(json!({
            "mode": "load", "theta_base": 0.3, "k": 0.15, "theta_min": 0.0, "theta_max": 1.0,
            "target_share": 0.1, "slo_p95_ms": 4500.0, "utilization_source": "auto",
            "manual_utilization": null, "allow_header_override": true,
            "oos_threshold": null, "oos_margin": 0.0,
            "max_error": null, "confidence": 0.95, "on_breach": "degrade", "audit_rate": 0.0,
            "allow_flawed_calibration": false,
        }))),
        patches: Arc::new(Mutex::new(Vec::new())),
    };
    let state = m.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let app = Router::new()
                .route("/v1/models", get(models))
                .route("/v1/chat/completions", post(chat))
                .route("/admin/routing", get(routing_get).patch(routing_patch))
                .with_state(state);
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(l.local_addr().unwrap()).unwrap();
            axum::serve(l, app).await.unwrap();
        });
    });
    (rx.recv().unwrap(), m)
}

/// 10 easy (label a), 4 hard (label b), 3 busy (label c), 3 fail.
fn workload(dir: &std::path::Path) -> std::path::PathBuf {
    let mut lines = Vec::new();
    for i in 0..10 {
        lines.push(json!({"text": format!("easy {i}"), "label": "a"}).to_string());
    }
    for i in 0..4 {
        lines.push(json!({"text": format!("hard {i}"), "label": "b"}).to_string());
    }
    for i in 0..3 {
        lines.push(json!({"text": format!("busy {i}"), "label": "c"}).to_string());
    }
    for i in 0..3 {
        lines.push(json!({"text": format!("fail {i}")}).to_string());
    }
    let p = dir.join("w.jsonl");
    std::fs::write(&p, lines.join("\n")).unwrap();
    p
}

/// A mock server, a temp dir and the workload in it.
struct Fixture {
    url: String,
    mock: Mock,
    dir: tempfile::TempDir,
    data: String,
}

impl Fixture {
    fn new() -> Self {
        let (addr, mock) = mock();
        let dir = tempfile::tempdir().unwrap();
        let data = workload(dir.path()).to_str().unwrap().to_string();
        Self {
            url: format!("http://{addr}"),
            mock,
            dir,
            data,
        }
    }

    /// A path in the temp dir.
    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).to_str().unwrap().to_string()
    }

    /// The JSON report written to `name`.
    fn report(&self, name: &str) -> Value {
        serde_json::from_slice(&std::fs::read(self.path(name)).unwrap()).unwrap()
    }
}

fn bench(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tiergate-bench"))
        .args(args)
        .env_remove("TIERGATE_ADMIN_TOKEN")
        .env_remove("OPENAI_API_KEY")
        .output()
        .unwrap()
}

fn channel<'a>(run: &'a Value, name: &str) -> &'a Value {
    run["channels"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["channel"] == name)
        .unwrap()
}

fn count(run: &Value, name: &str) -> u64 {
    channel(run, name)["count"].as_u64().unwrap()
}

#[test]
fn open_loop_splits_channels_and_scores_labels() {
    let f = Fixture::new();
    let json_path = f.path("r.json");
    let out = bench(&[
        "--url",
        &f.url,
        "--data",
        &f.data,
        "--rate",
        "200",
        "--poisson",
        "--requests",
        "300",
        "--seed",
        "3",
        "--json",
        &json_path,
        "--admin-token",
        "secret",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: Value = f.report("r.json");
    assert_eq!(
        r["route"], "classify",
        "the first classify route is the default"
    );
    let run = &r["runs"][0];
    assert_eq!(run["requests"], 300);
    let (t0, esc, deg, err) = (
        count(run, "tier0"),
        count(run, "escalated"),
        count(run, "degraded"),
        count(run, "errors"),
    );
    assert_eq!(t0 + esc + deg + err, 300);
    assert!(
        t0 > 0 && esc > 0 && deg > 0 && err > 0,
        "{t0} {esc} {deg} {err}"
    );
    assert_eq!(count(run, "untiered"), 0);
    // Errors are typed from the OpenAI error body.
    assert_eq!(
        channel(run, "errors")["errors"]["rate_limit_exceeded"].as_u64(),
        Some(err)
    );
    // Every answer in this mock is right at theta 0.3 (easy by Tier-0, hard by the LLM, busy degraded).
    assert_eq!(channel(run, "served")["accuracy"].as_f64(), Some(1.0));
    assert_eq!(
        channel(run, "served")["labelled"].as_u64(),
        Some(t0 + esc + deg)
    );
    // Escalations sleep 100 ms: the escalated channel's latency and band show it.
    let esc_lat = &channel(run, "escalated")["latency"];
    assert!(esc_lat["p50_ms"].as_f64().unwrap() >= 100.0, "{esc_lat}");
    assert_eq!(channel(run, "escalated")["band"], "Tier-1");
    assert!(channel(run, "tier0")["latency"]["p50_ms"].as_f64().unwrap() < 100.0);
    // Tokens from usage.
    assert_eq!(
        channel(run, "served")["tokens_out"].as_u64(),
        Some(3 * (t0 + esc + deg))
    );
    // Time series covers the ~1.5 s run; the server was scraped.
    let series = run["series"].as_array().unwrap();
    let per_second: u64 = series
        .iter()
        .flat_map(|s| s["count"].as_object().unwrap().values())
        .map(|v| v.as_u64().unwrap())
        .sum();
    assert_eq!(per_second, 300);
    assert!(
        !run["scrape"]["samples"].as_array().unwrap().is_empty(),
        "{}",
        run["scrape"]
    );
    assert_eq!(run["scrape"]["samples"][0]["theta_eff"].as_f64(), Some(0.3));
    // The terminal report.
    assert!(stdout.contains("escalated P95"), "{stdout}");
    assert!(stdout.contains("→ Tier-1"), "{stdout}");
    assert!(stdout.contains("rate_limit_exceeded ×"), "{stdout}");
    assert!(stdout.contains("SLO"), "{stdout}");
}

#[test]
fn streaming_closed_loop_measures_ttft_and_reports_missing_admin() {
    let f = Fixture::new();
    let json_path = f.path("r.json");
    let out = bench(&[
        "--url",
        &f.url,
        "--data",
        &f.data,
        "--concurrency",
        "4",
        "--requests",
        "60",
        "--stream",
        "--json",
        &json_path,
        "--quiet",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: Value = f.report("r.json");
    let run = &r["runs"][0];
    assert_eq!(run["requests"], 60);
    let served = channel(run, "served");
    let ttft = served["ttft"]["p50_ms"].as_f64().unwrap();
    assert!(ttft > 0.0 && ttft <= served["latency"]["p50_ms"].as_f64().unwrap());
    assert_eq!(
        served["tokens_out"].as_u64(),
        Some(3 * served["count"].as_u64().unwrap())
    );
    assert_eq!(served["accuracy"].as_f64(), Some(1.0));
    // Without the token the scrape is refused, and the report says so.
    assert!(
        run["scrape"]["unavailable"]
            .as_str()
            .unwrap()
            .contains("401"),
        "{}",
        run["scrape"]
    );
}

#[test]
fn slo_verdict_sets_the_exit_code_only_when_asked() {
    let f = Fixture::new();
    let slo = f.path("slo.toml");
    std::fs::write(&slo, "[[slo]]\nname = \"escalations in 1 ms\"\nchannel = \"escalated\"\nmetric = \"p99_ms\"\nmax = 1\n").unwrap();
    let base = [
        "--url",
        &f.url,
        "--data",
        &f.data,
        "--rate",
        "100",
        "--requests",
        "60",
        "--quiet",
        "--slo",
        &slo,
    ];
    let out = bench(&base);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("FAIL"));
    let mut strict = base.to_vec();
    strict.push("--fail-on-slo");
    assert_eq!(bench(&strict).status.code(), Some(2));
    std::fs::write(&slo, "[[slo]]\nname = \"escalations in 5 s\"\nchannel = \"escalated\"\nmetric = \"p99_ms\"\nmax = 5000\n").unwrap();
    let out = bench(&strict);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("PASS"));
}

#[test]
fn compare_runs_four_policies_and_restores_the_server_policy() {
    let f = Fixture::new();
    let (json_path, html_path) = (f.path("r.json"), f.path("r.html"));
    let out = bench(&[
        "--url",
        &f.url,
        "--data",
        &f.data,
        "--rate",
        "150",
        "--requests",
        "90",
        "--compare",
        "--admin-token",
        "secret",
        "--json",
        &json_path,
        "--html",
        &html_path,
        "--quiet",
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: Value = f.report("r.json");
    let rows = r["comparison"].as_array().unwrap();
    let names: Vec<&str> = rows
        .iter()
        .map(|x| x["variant"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["tier0-only", "llm-only", "hybrid-static", "hybrid-load"]
    );
    let share = |i: usize| rows[i]["escalation_share"].as_f64().unwrap();
    let acc = |i: usize| rows[i]["accuracy"].as_f64().unwrap();
    assert_eq!(share(0), 0.0);
    assert_eq!(share(1), 1.0);
    assert!(share(2) > 0.0 && share(2) < 1.0 && share(3) > 0.0 && share(3) < 1.0);
    // Tier-0 alone gets the hard ones wrong; the hybrids get them right.
    assert!(acc(0) < 1.0 && acc(2) == 1.0 && acc(3) == 1.0, "{rows:?}");
    assert_eq!(rows[3]["throughput_ratio"].as_f64(), Some(1.0));
    // LLM-only pays 100 ms on every request.
    assert!(
        rows[1]["p99_served_ms"].as_f64().unwrap() > rows[0]["p99_served_ms"].as_f64().unwrap()
    );
    assert!(stdout.contains("comparison (ratios against hybrid-load)"));
    // The server's policy is back: mode load, theta 0.3 — the last PATCH is the restore.
    let p = f.mock.policy.lock().unwrap().clone();
    assert_eq!(p["mode"], "load");
    assert_eq!(p["theta_base"].as_f64(), Some(0.3));
    assert_eq!(f.mock.patches.lock().unwrap().len(), 5);
    // One self-contained page with the charts of each variant.
    let html = std::fs::read_to_string(f.path("r.html")).unwrap();
    for title in [
        "Latency over time per channel",
        "θ_eff and utilisation over time",
        "Latency CDF per channel",
        "Escalation share over time",
    ] {
        assert_eq!(html.matches(title).count(), 4, "{title}");
    }
    assert!(html.contains("<polyline"));
    assert!(!html.contains("<script") && !html.contains("src=\"http"));
}

#[test]
fn bad_input_is_refused_with_a_clear_message() {
    let (addr, _) = mock();
    let url = format!("http://{addr}");
    let err = |args: &[&str]| {
        let out = bench(args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        String::from_utf8_lossy(&out.stderr).to_string()
    };
    assert!(err(&[
        "--url",
        &url,
        "--rate",
        "10",
        "--data",
        "/nonexistent/w.csv"
    ])
    .contains("cannot read workload /nonexistent/w.csv"));
    assert!(err(&[
        "--url",
        &url,
        "--concurrency",
        "2",
        "--schedule",
        "surge",
        "--duration",
        "1s"
    ])
    .contains("use it with --rate"));
    assert!(
        err(&["--url", &url, "--rate", "10", "--schedule", "surge"]).contains("needs --duration")
    );
    assert!(err(&["--url", &url, "--rate", "0"]).contains("--rate 0"));
    assert!(
        err(&["--url", "https://example.invalid", "--rate", "1"]).contains("TLS is not supported")
    );
    assert!(err(&[
        "--url",
        &url,
        "--compare",
        "--rate",
        "10",
        "--requests",
        "5"
    ])
    .contains("/admin/routing"));
    // Nothing listening: every request fails to connect and the run says so.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let msg = err(&[
        "--url",
        &format!("http://{closed}"),
        "--route",
        "x",
        "--rate",
        "50",
        "--requests",
        "5",
        "--quiet",
    ]);
    assert!(msg.contains("no request reached"), "{msg}");
    // Missing --rate/--concurrency is clap's error (exit 2).
    assert_eq!(bench(&["--url", &url]).status.code(), Some(2));
}

#[test]
fn extra_headers_reach_the_server() {
    let f = Fixture::new();
    let json_path = f.path("r.json");
    let run = |theta: &str| {
        let header = format!("x-tiergate-threshold: {theta}");
        let out = bench(&[
            "--url",
            &f.url,
            "--data",
            &f.data,
            "--rate",
            "200",
            "--requests",
            "40",
            "--quiet",
            "--header",
            &header,
            "--json",
            &json_path,
        ]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let r = f.report("r.json");
        assert_eq!(r["runs"][0]["settings"]["headers"][0], header);
        r["runs"][0].clone()
    };
    // θ = 1 in the header: nothing escalates although the server's policy says 0.3.
    let never = run("1.0");
    assert_eq!(count(&never, "escalated") + count(&never, "degraded"), 0);
    // θ = 0: everything answerable escalates.
    let always = run("0.0");
    assert_eq!(count(&always, "tier0"), 0);
    assert!(count(&always, "escalated") > 0);
    assert_eq!(
        bench(&["--url", &f.url, "--rate", "1", "--header", "nocolon"])
            .status
            .code(),
        Some(2)
    );
}
