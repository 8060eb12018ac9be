//! A dependency that hangs, not one that dies: a real `redis-server` (the policy store, session pins, stored
//! responses and the ledger of two `tiergate serve` replicas) paused with `SIGSTOP` while 32 clients mix
//! classify, generate with sessions (the stub engine, so the LLM's CPU does not decide Tier-0's latency),
//! Responses chains and feedback. While it is paused nothing waits past its deadline, classify and generate
//! answer 200 (Tier-0's p99 inside its band), the only refusals are the stated ones (a continuation or
//! feedback whose store cannot be reached: 503 saying so), a response answered meanwhile says `store: false`;
//! `/ready` stays 200 and says which dependencies are served around. On `SIGCONT` the replicas converge:
//! dependencies up, the spooled decision records written (an answer given during the pause takes feedback),
//! every response acknowledged as stored retrievable, every feedback acknowledged still there, a policy change
//! through one replica seen by the other.
//!
//! The pause here is 6 s; `TIERGATE_STALL_S` sets another (`bench/stall.sh` runs it with 30 s and prints
//! each kind's figures per phase: docs/benchmarks.md).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

mod common;
use common::{free_port, redis, start};

/// The phases of the run.
const BEFORE: u8 = 0;
const PAUSED: u8 = 1;
const AFTER: u8 = 2;

/// One request as a client saw it.
#[derive(Debug, Clone)]
struct Seen {
    kind: &'static str,
    phase: u8,
    status: u16,
    ms: f64,
    body: Value,
}

fn agent() -> ureq::Agent {
    ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(20))
        .build()
}

fn post(a: &ureq::Agent, url: &str, headers: &[(&str, &str)], body: &Value) -> (u16, f64, Value) {
    let t = Instant::now();
    let mut r = a.post(url);
    for (k, v) in headers {
        r = r.set(k, v);
    }
    let (code, v) = match r.send_json(body.clone()) {
        Ok(r) => (r.status(), r.into_json().unwrap_or(Value::Null)),
        Err(ureq::Error::Status(code, r)) => (code, r.into_json().unwrap_or(Value::Null)),
        Err(e) => panic!("{url}: {e}"),
    };
    (code, t.elapsed().as_secs_f64() * 1000.0, v)
}

/// One client's loop until `stop`: its kind by `i`, against `base`.
fn client(i: usize, base: String, phase: Arc<AtomicU8>, stop: Arc<AtomicBool>) -> Vec<Seen> {
    let a = agent();
    let mut seen = Vec::new();
    // The last response stored: every other Responses request continues it.
    let mut anchor: Option<String> = None;
    let mut n = 0;
    while !stop.load(Ordering::Acquire) {
        n += 1;
        let p = phase.load(Ordering::Acquire);
        let mut push = |kind, (status, ms, body): (u16, f64, Value)| {
            seen.push(Seen {
                kind,
                phase: p,
                status,
                ms,
                body,
            });
        };
        let chat = format!("{base}/v1/chat/completions");
        match i % 4 {
            0 => push(
                "classify",
                post(
                    &a,
                    &chat,
                    &[],
                    &json!({"model": "classify", "messages": [{"role": "user", "content": format!("my card {i} was stolen {n}")}]}),
                ),
            ),
            1 => {
                let session = format!("s-{i}-{}", n % 3);
                push(
                    "generate",
                    post(
                        &a,
                        &chat,
                        &[("x-session-id", &session)],
                        &json!({"model": "generate", "max_tokens": 4, "messages": [{"role": "user", "content": "hello"}]}),
                    ),
                );
            }
            2 => {
                let mut body =
                    json!({"model": "generate", "input": "and on", "max_output_tokens": 4});
                let kind = match anchor.as_ref().filter(|_| n % 2 == 0) {
                    Some(id) => {
                        body["previous_response_id"] = json!(id);
                        "continue"
                    }
                    None => "respond",
                };
                let r = post(&a, &format!("{base}/v1/responses"), &[], &body);
                if r.0 == 200 && r.2["store"] == true {
                    anchor = r.2["id"].as_str().map(str::to_string);
                }
                push(kind, r);
            }
            _ => {
                let r = post(
                    &a,
                    &chat,
                    &[],
                    &json!({"model": "classify", "messages": [{"role": "user", "content": format!("where is my refund {i} {n}")}]}),
                );
                let id = r.2["id"].as_str().unwrap_or_default().to_string();
                push("classify", r);
                let mut fb = post(
                    &a,
                    &format!("{base}/v1/feedback"),
                    &[],
                    &json!({"id": id, "correct": true}),
                );
                fb.2["_target"] = json!(id);
                push("feedback", fb);
            }
        }
    }
    seen
}

fn p99(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[((xs.len() as f64 * 0.99).ceil() as usize).clamp(1, xs.len()) - 1]
}

/// Prints each kind's figures per phase (count, 503s, p50, p99, max).
fn report(seen: &[Seen]) {
    for phase in [BEFORE, PAUSED, AFTER] {
        for kind in ["classify", "generate", "respond", "continue", "feedback"] {
            let xs: Vec<&Seen> = seen
                .iter()
                .filter(|s| s.phase == phase && s.kind == kind)
                .collect();
            if xs.is_empty() {
                continue;
            }
            let ms: Vec<f64> = xs.iter().map(|s| s.ms).collect();
            let mut sorted = ms.clone();
            sorted.sort_by(f64::total_cmp);
            eprintln!(
                "phase {phase} {kind:9} n={:5} 503={:4} store_false={:4} p50={:7.1} p99={:7.1} max={:7.1} ms",
                xs.len(),
                xs.iter().filter(|s| s.status == 503).count(),
                xs.iter().filter(|s| s.body["store"] == false).count(),
                sorted[sorted.len() / 2],
                p99(ms),
                sorted[sorted.len() - 1]
            );
        }
    }
}

fn ready(base: &str) -> (u16, Value) {
    match ureq::get(&format!("{base}/ready")).call() {
        Ok(r) => (r.status(), r.into_json().unwrap()),
        Err(ureq::Error::Status(c, r)) => (c, r.into_json().unwrap_or(Value::Null)),
        Err(e) => panic!("{e}"),
    }
}

fn signal(pid: u32, sig: i32) {
    assert_eq!(unsafe { libc::kill(pid as i32, sig) }, 0);
}

#[test]
fn a_paused_redis_stalls_nothing_and_the_replicas_converge_after() {
    let port = free_port();
    let redis_proc = redis(port);
    let url = format!("policy_store.url=\"redis://127.0.0.1:{port}\"");
    let args = [
        "--set",
        "policy_store.kind=\"redis\"",
        "--set",
        &url,
        "--set",
        "reranker.engine=\"stub\"",
        // Room for every client's generation at once: a full queue is load, not the stall under test.
        "--set",
        "reranker.slots=64",
        "--set",
        "reranker.max_in_flight=64",
        "--set",
        "reranker.max_concurrent=16",
        "--set",
        "responses.store=true",
        // Every response of the run kept (the per-tenant bound is tested on its own).
        "--set",
        "responses.max_entries=1000000",
        "--set",
        "responses.max_per_tenant=1000000",
    ];
    let a = start(&args);
    let b = start(&args);
    let phase = Arc::new(AtomicU8::new(BEFORE));
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..32)
        .map(|i| {
            // Each kind on both replicas: clients 0–3 on A, 4–7 on B, …
            let base = if (i / 4) % 2 == 0 { &a.base } else { &b.base }.clone();
            let (phase, stop) = (phase.clone(), stop.clone());
            std::thread::spawn(move || client(i, base, phase, stop))
        })
        .collect();
    std::thread::sleep(Duration::from_secs(3));
    let pause: u64 = std::env::var("TIERGATE_STALL_S")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(6)
        .max(4);
    signal(redis_proc.0.id(), libc::SIGSTOP);
    phase.store(PAUSED, Ordering::Release);
    std::thread::sleep(Duration::from_secs(pause / 2));
    let (code, mid) = ready(&a.base);
    assert_eq!(code, 200, "a replica without Redis is still ready: {mid}");
    assert_eq!(mid["degraded"], true, "{mid}");
    assert!(
        mid["ledger_spooled"].as_u64() > Some(0),
        "decision records wait in the spool: {mid}"
    );
    assert!(
        mid["dependencies"]
            .as_array()
            .unwrap()
            .iter()
            .any(|d| d["state"] != "up"),
        "{mid}"
    );
    std::thread::sleep(Duration::from_secs(pause - pause / 2));
    signal(redis_proc.0.id(), libc::SIGCONT);
    phase.store(AFTER, Ordering::Release);
    std::thread::sleep(Duration::from_secs(4));
    stop.store(true, Ordering::Release);
    let seen: Vec<Seen> = clients
        .into_iter()
        .flat_map(|c| c.join().unwrap())
        .collect();
    check_answers(&seen);
    check_converged(&a.base, &b.base, &a.admin, &b.admin, &seen);
    drop(redis_proc);
}

/// During the pause: classify and generate always 200, Tier-0 in its band, nothing past its deadline, the
/// only refusals the stated ones.
fn check_answers(seen: &[Seen]) {
    let paused = |k: &'static str| {
        seen.iter()
            .filter(move |s| s.phase == PAUSED && s.kind == k)
    };
    for kind in ["classify", "generate", "respond", "continue", "feedback"] {
        assert!(paused(kind).count() >= 5, "too few {kind} while paused");
    }
    report(seen);
    for s in seen {
        let stated = matches!(s.kind, "continue" | "feedback")
            && s.status == 503
            && s.body["error"]["code"] == "store_unavailable"
            && s.body["error"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("cannot be reached"));
        assert!(
            s.status == 200 || stated,
            "{} in phase {}: {} {}",
            s.kind,
            s.phase,
            s.status,
            s.body
        );
        // The longest deadline on a request's path: the Responses store's 2 s outer bound.
        assert!(
            s.ms < 2_500.0,
            "{} took {} ms in phase {}",
            s.kind,
            s.ms,
            s.phase
        );
    }
    let tier0: Vec<f64> = paused("classify").map(|s| s.ms).collect();
    let p = p99(tier0);
    assert!(
        p <= 80.0,
        "Tier-0 p99 {p} ms while Redis is paused: past its band"
    );
    let gen = p99(paused("generate").map(|s| s.ms).collect());
    assert!(gen < 1_000.0, "generate p99 {gen} ms while paused");
    assert!(
        paused("respond").any(|s| s.body["store"] == false),
        "a response answered while the store is paused says store: false"
    );
}

/// After `SIGCONT`: dependencies up and the spool empty on both, what was acknowledged is there, the spooled
/// records joinable, a policy change through A seen by B.
fn check_converged(a: &str, b: &str, admin_a: &str, admin_b: &str, seen: &[Seen]) {
    let t = Instant::now();
    for base in [a, b] {
        loop {
            let (_, r) = ready(base);
            let up = r["dependencies"]
                .as_array()
                .unwrap()
                .iter()
                .all(|d| d["state"] == "up");
            if up && r["ledger_spooled"] == 0 && r["degraded"] == false {
                break;
            }
            assert!(t.elapsed() < Duration::from_secs(10), "not converged: {r}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    let agent = agent();
    // Every response acknowledged as stored is there, on either replica.
    for s in seen.iter().filter(|s| s.body["store"] == true) {
        let id = s.body["id"].as_str().unwrap();
        let r = agent.get(&format!("{b}/v1/responses/{id}")).call();
        assert!(
            r.is_ok(),
            "stored response {id} (phase {}) lost: {r:?}",
            s.phase
        );
    }
    // Every feedback acknowledged stands (a second one is a duplicate), and an answer given while Redis was
    // paused (its record spooled) takes feedback now.
    let acked: Vec<&Seen> = seen
        .iter()
        .filter(|s| s.kind == "feedback" && s.status == 200)
        .collect();
    assert!(!acked.is_empty());
    for s in acked.iter().step_by(7) {
        let id = s.body["_target"].as_str().unwrap();
        let (code, _, v) = post(
            &agent,
            &format!("{a}/v1/feedback"),
            &[],
            &json!({"id": id, "correct": true}),
        );
        assert_eq!(
            (code, v["duplicate"].as_bool()),
            (200, Some(true)),
            "{id}: {v}"
        );
    }
    let answered_paused: Vec<&str> = seen
        .iter()
        .filter(|s| s.kind == "classify" && s.phase == PAUSED)
        .filter_map(|s| s.body["id"].as_str())
        .take(10)
        .collect();
    for id in answered_paused {
        let (code, _, v) = post(
            &agent,
            &format!("{b}/v1/feedback"),
            &[],
            &json!({"id": id, "correct": false}),
        );
        assert_eq!(
            code, 200,
            "an answer given while Redis was paused takes feedback after: {id} {v}"
        );
    }
    // One policy again.
    let routing = |admin: &str| -> Value {
        agent
            .get(&format!("{admin}/admin/routing"))
            .call()
            .unwrap()
            .into_json()
            .unwrap()
    };
    let before = routing(admin_a);
    let v = before["version"].as_u64().unwrap();
    let changed: Value = agent
        .request("PATCH", &format!("{admin_a}/admin/routing"))
        .send_json(json!({"k": 0.25}))
        .unwrap()
        .into_json()
        .unwrap();
    assert!(changed["version"].as_u64().unwrap() > v, "{changed}");
    let t = Instant::now();
    loop {
        let seen_b = routing(admin_b);
        if seen_b["version"] == changed["version"] {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "B did not converge: {seen_b}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
