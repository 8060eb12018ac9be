//! OpenTelemetry traces across the queue, checked with a receiver that decodes real OTLP
//! (`tests/python/otlp_receiver.py`: the opentelemetry-proto classes behind an HTTP handler and a gRPC
//! server): one escalated request → one trace holding the server's spans and the worker process's spans,
//! correctly parented, with the decision's attributes; the client's `traceparent` continued; the trace id in
//! the response header; both OTLP transports; a collector that never answers slows no request.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tiergate_tests::root;

mod common;
use common::{start_env, Killed, Server};

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";

/// The receiver and where its spans land.
struct Receiver {
    _child: Killed,
    out: PathBuf,
    http: u16,
    grpc: u16,
}

fn receiver(dir: &Path) -> Receiver {
    let out = dir.join("spans.jsonl");
    let mut child = Command::new("python3")
        .arg(root().join("tests/python/otlp_receiver.py"))
        .arg(&out)
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3 with opentelemetry-proto and grpcio (scripts/test.sh installs them)");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let ports: HashMap<&str, u16> = line
        .trim()
        .strip_prefix("ready ")
        .unwrap_or_else(|| panic!("receiver did not start: {line:?}"))
        .split(' ')
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap();
            (k, v.parse().unwrap())
        })
        .collect();
    Receiver {
        _child: Killed(child),
        out,
        http: ports["http"],
        grpc: ports["grpc"],
    }
}

/// The spans of `trace` received so far.
fn spans(r: &Receiver, trace: &str) -> Vec<Value> {
    std::fs::read_to_string(&r.out)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|s| s["trace_id"] == trace)
        .collect()
}

/// Waits until the trace holds spans named `names` (the worker's arrive after its batch delay).
fn wait_for(r: &Receiver, trace: &str, names: &[&str]) -> Vec<Value> {
    let t = Instant::now();
    loop {
        let got = spans(r, trace);
        if names.iter().all(|n| got.iter().any(|s| s["name"] == *n)) {
            return got;
        }
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "trace {trace}: waited for {names:?}, got {:#?}",
            got.iter().map(|s| &s["name"]).collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn one<'a>(spans: &'a [Value], name: &str) -> &'a Value {
    let found: Vec<&Value> = spans.iter().filter(|s| s["name"] == name).collect();
    assert_eq!(found.len(), 1, "one `{name}` span: {spans:#?}");
    found[0]
}

fn assert_child(spans: &[Value], child: &str, parent: &str) {
    let (c, p) = (one(spans, child), one(spans, parent));
    assert_eq!(
        c["parent_span_id"], p["span_id"],
        "`{child}` is a child of `{parent}`"
    );
}

fn server(r_url: &str, protocol: &str, ratio: &str) -> Server {
    start_env(
        &[
            "--set",
            "reranker.engine=\"stub\"",
            // θ = 0: every classify request escalates (a rerank by the stub worker).
            "--set",
            "routing.mode=\"static\"",
            "--set",
            "routing.theta_base=0.0",
            "--set",
            &format!("server.otlp_endpoint=\"{r_url}\""),
            "--set",
            &format!("server.otlp_protocol=\"{protocol}\""),
            "--set",
            &format!("server.trace_sample_ratio={ratio}"),
        ],
        &[("OTEL_BSP_SCHEDULE_DELAY", "100")],
    )
}

fn chat(s: &Server, traceparent: Option<&str>) -> ureq::Response {
    let mut req = ureq::post(&format!("{}/v1/chat/completions", s.base));
    if let Some(tp) = traceparent {
        req = req
            .set("traceparent", tp)
            .set("tracestate", "congo=t61rcWkgMzE");
    }
    req.send_json(json!({"model": "classify", "messages": [{"role": "user", "content": "my card has not arrived yet"}]}))
        .unwrap()
}

/// The root span's name (HTTP semantic conventions: method and route).
const ROOT: &str = "POST /v1/chat/completions";

const ALL: [&str; 11] = [
    ROOT,
    "validate",
    "prefilter",
    "tokenise",
    "queue_wait",
    "infer",
    "decision",
    "escalation",
    "response",
    "worker.job",
    "prefill",
];

#[test]
fn an_escalated_request_is_one_trace_across_the_server_and_the_worker() {
    let dir = tempfile::tempdir().unwrap();
    let r = receiver(dir.path());
    let s = server(
        &format!("http://127.0.0.1:{}", r.http),
        "http/protobuf",
        "1.0",
    );

    // The client's context is continued: same trace id, its span the root's parent, its state carried.
    let resp = chat(&s, Some(&format!("00-{TRACE}-{CLIENT_SPAN}-01")));
    assert_eq!(resp.header("x-tiergate-tier"), Some("llm"), "escalated");
    assert_eq!(resp.header("x-tiergate-trace-id"), Some(TRACE));
    let got = wait_for(&r, TRACE, &ALL);
    let root = one(&got, ROOT);
    assert_eq!(root["parent_span_id"], CLIENT_SPAN);
    assert_eq!(root["trace_state"], "congo=t61rcWkgMzE");
    assert_eq!(root["kind"], 2, "SERVER");
    assert_eq!(root["attributes"]["http.response.status_code"], 200);
    assert_eq!(root["transport"], "http");
    for child in [
        "validate",
        "prefilter",
        "decision",
        "escalation",
        "response",
    ] {
        assert_child(&got, child, ROOT);
    }
    for step in ["tokenise", "queue_wait", "infer"] {
        assert_child(&got, step, "prefilter");
    }
    // The worker process's spans, exported by the worker itself, under the server's escalation span.
    assert_child(&got, "worker.job", "escalation");
    assert_child(&got, "prefill", "worker.job");
    for s in &got {
        let (name, service) = (s["name"].as_str().unwrap(), s["service"].as_str().unwrap());
        let expected = if ["worker.job", "prefill"].contains(&name) {
            "tiergate-worker"
        } else {
            "tiergate"
        };
        assert_eq!(service, expected, "{name}");
        assert!(s["end_ns"].as_u64() >= s["start_ns"].as_u64(), "{s}");
    }
    let job = one(&got, "worker.job");
    assert_eq!(job["attributes"]["job.kind"], "rerank");
    assert_eq!(one(&got, "prefill")["attributes"]["llm.candidates"], 5);
    // The decision's attributes.
    let d = &one(&got, "decision")["attributes"];
    assert!(d["tiergate.ambiguity"].as_f64().unwrap() > 0.0, "{d}");
    assert_eq!(d["tiergate.theta_eff"], 0.0);
    assert_eq!(d["tiergate.mode"], "static");
    assert_eq!(d["tiergate.policy_version"], 1);
    assert_eq!(d["tiergate.escalated"], true);
    assert_eq!(d["tiergate.forced"], false);
    assert_eq!(
        one(&got, "infer")["attributes"]["batch.size"].as_i64(),
        Some(1)
    );

    // Without a traceparent a new trace starts: its id in the header, the request span its root.
    let resp = chat(&s, None);
    let id = resp.header("x-tiergate-trace-id").unwrap().to_string();
    assert!(
        id.len() == 32 && id.chars().all(|c| c.is_ascii_hexdigit()) && id != TRACE,
        "{id}"
    );
    let got = wait_for(&r, &id, &[ROOT, "worker.job"]);
    assert_eq!(one(&got, ROOT)["parent_span_id"], "");
    assert_child(&got, "worker.job", "escalation");

    // A malformed traceparent is ignored (W3C): a new trace, and the request still answered.
    let resp = chat(&s, Some("00-zz-not-a-trace"));
    assert_eq!(resp.status(), 200);
    assert_ne!(resp.header("x-tiergate-trace-id"), Some("zz"));
}

#[test]
fn a_streamed_generation_has_prefill_and_decode_spans_in_the_worker() {
    let dir = tempfile::tempdir().unwrap();
    let r = receiver(dir.path());
    let s = server(
        &format!("http://127.0.0.1:{}", r.http),
        "http/protobuf",
        "1.0",
    );
    let trace = "0af7651916cd43dd8448eb211c80319c";
    let resp = ureq::post(&format!("{}/v1/chat/completions", s.base))
        .set("traceparent", &format!("00-{trace}-b7ad6b7169203331-01"))
        .send_json(json!({"model": "generate", "stream": true, "max_tokens": 8,
                          "messages": [{"role": "user", "content": "say something"}]}))
        .unwrap();
    assert_eq!(resp.header("x-tiergate-trace-id"), Some(trace));
    let body = resp.into_string().unwrap();
    assert!(body.trim_end().ends_with("data: [DONE]"), "{body}");
    let got = wait_for(
        &r,
        trace,
        &[
            ROOT,
            "generation",
            "stream",
            "worker.job",
            "prefill",
            "decode",
        ],
    );
    assert_child(&got, "generation", ROOT);
    assert_child(&got, "stream", "generation");
    assert_child(&got, "worker.job", "generation");
    assert_child(&got, "prefill", "worker.job");
    assert_child(&got, "decode", "worker.job");
    assert_eq!(
        one(&got, "worker.job")["attributes"]["job.kind"],
        "generate"
    );
    assert!(
        one(&got, "decode")["attributes"]["llm.completion_tokens"]
            .as_i64()
            .unwrap()
            > 0
    );
    // The stream span lasts until the last event, past the handler's return.
    let (stream, root) = (one(&got, "stream"), one(&got, ROOT));
    assert!(
        stream["end_ns"].as_u64() >= root["end_ns"].as_u64(),
        "{stream} {root}"
    );
}

#[test]
fn grpc_export_carries_the_same_trace() {
    let dir = tempfile::tempdir().unwrap();
    let r = receiver(dir.path());
    let s = server(&format!("http://127.0.0.1:{}", r.grpc), "grpc", "1.0");
    let resp = chat(&s, Some(&format!("00-{TRACE}-{CLIENT_SPAN}-01")));
    assert_eq!(resp.header("x-tiergate-trace-id"), Some(TRACE));
    let got = wait_for(&r, TRACE, &ALL);
    assert!(got.iter().all(|s| s["transport"] == "grpc"), "{got:#?}");
    assert_child(&got, "worker.job", "escalation");
    assert_eq!(one(&got, ROOT)["parent_span_id"], CLIENT_SPAN);
}

#[test]
fn sampling_keeps_ids_and_exports_only_sampled_traces() {
    let dir = tempfile::tempdir().unwrap();
    let r = receiver(dir.path());
    let s = server(
        &format!("http://127.0.0.1:{}", r.http),
        "http/protobuf",
        "0.0",
    );
    // Ratio 0: a new trace is not recorded, yet has an id.
    let unsampled = chat(&s, None)
        .header("x-tiergate-trace-id")
        .unwrap()
        .to_string();
    // A client that sampled its trace decides for it (parent-based).
    let resp = chat(&s, Some(&format!("00-{TRACE}-{CLIENT_SPAN}-01")));
    assert_eq!(resp.header("x-tiergate-trace-id"), Some(TRACE));
    wait_for(&r, TRACE, &ALL);
    // The sampled trace arrived after the unsampled request: had that one been exported, it would be here.
    std::thread::sleep(Duration::from_millis(500));
    assert!(spans(&r, &unsampled).is_empty(), "ratio 0 exported a trace");
}

#[test]
fn a_collector_that_never_answers_slows_no_request() {
    // Accepts connections and never reads or answers: every export hangs until its timeout (5 s).
    let hole = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = hole.local_addr().unwrap().port();
    let held = std::thread::spawn(move || {
        let mut conns = Vec::new();
        for c in hole.incoming().take(64) {
            conns.push(c);
        }
    });
    let s = server(&format!("http://127.0.0.1:{port}"), "http/protobuf", "1.0");
    let t = Instant::now();
    for i in 0..30 {
        let started = Instant::now();
        let resp = chat(&s, None);
        assert_eq!(resp.header("x-tiergate-tier"), Some("llm"), "request {i}");
        assert!(resp.header("x-tiergate-degraded").is_none(), "request {i}");
        // The stub answers in milliseconds; an export on the request's or the job's path would cost 5 s.
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "request {i}: {:?}",
            started.elapsed()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(t.elapsed() < Duration::from_secs(30));
    drop(s);
    drop(held);
}
