//! The endpoints a client or an operator can misuse, against the real server: feedback under bogus and
//! foreign ids and floods of them, … Each test is one way in, tried the way an attacker or a race would.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::{Duration, Instant};

use common::{key_sha256, start};
use serde_json::{json, Value};

/// A POST with an API key: status and JSON body.
fn post(url: &str, key: &str, body: &Value) -> (u16, Value) {
    let r = ureq::post(url)
        .set("authorization", &format!("Bearer {key}"))
        .timeout(Duration::from_secs(30))
        .send_json(body.clone());
    match r {
        Ok(r) => (r.status(), r.into_json().unwrap()),
        Err(ureq::Error::Status(code, r)) => (code, r.into_json().unwrap()),
        Err(e) => panic!("{url}: {e}"),
    }
}

/// A server with tenants `a` and `b` (keys `key-a`, `key-b`) and its ledger in a temporary folder.
fn two_tenants(extra: &[&str]) -> (common::Server, tempfile::TempDir) {
    let work = tempfile::tempdir().unwrap();
    let ledger = format!(
        "feedback.path=\"{}\"",
        work.path().join("feedback.sqlite").display()
    );
    let tenants = format!(
        "tenants=[{{ name = \"a\", key_sha256 = \"{}\" }}, {{ name = \"b\", key_sha256 = \"{}\" }}]",
        key_sha256("key-a"),
        key_sha256("key-b")
    );
    let mut args = vec![
        "--set",
        &tenants,
        "--set",
        &ledger,
        "--set",
        "routing.mode=\"static\"",
        "--set",
        "routing.theta_base=1.0",
    ];
    args.extend_from_slice(extra);
    (start(&args), work)
}

fn chat(base: &str, key: &str) -> (u16, Value) {
    post(
        &format!("{base}/v1/chat/completions"),
        key,
        &json!({"model": "classify", "messages": [{"role": "user", "content": "I lost my card"}]}),
    )
}

/// A completion id of the served shape that no server gave: a time `age` ago and 64 random bits.
fn bogus_id(age: Duration, n: u64) -> String {
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .saturating_sub(age)
        .as_millis() as u64;
    // A fixed odd multiplier spreads `n` over the 64 bits (any value the server never minted will do).
    format!(
        "chatcmpl-{ms:012x}{:016x}",
        n.wrapping_mul(0x9E37_79B9_7F4A_7C15)
    )
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Feedback on an unknown id and on another tenant's id: the same 404 (its message differs only by the id it
/// names) in the same time, each well under 100 ms once the id is older than the ledger's write window (the
/// old lookup retried every unknown id for 250 ms, while a foreign id answered at once); a young unknown id
/// waits out the write window only. One's own consecutive ids share no guessable part.
#[test]
fn unknown_and_foreign_ids_are_answered_alike_and_fast() {
    let (s, _work) = two_tenants(&[]);
    let (code, mine) = chat(&s.base, "key-b");
    assert_eq!(code, 200, "{mine}");
    let (_, next) = chat(&s.base, "key-b");
    let ids = [mine["id"].as_str().unwrap(), next["id"].as_str().unwrap()];
    // chatcmpl- + 12 hex digits of time + 16 random ones: consecutive ids differ in most random digits (a
    // counter would differ in one or two).
    let differing = ids[0][21..]
        .chars()
        .zip(ids[1][21..].chars())
        .filter(|(a, b)| a != b)
        .count();
    assert!(
        ids.iter().all(|i| i.len() == 37) && differing >= 8,
        "ids {ids:?}: {differing} of 16 random digits differ"
    );
    std::thread::sleep(Duration::from_millis(200));
    let fb = format!("{}/v1/feedback", s.base);
    let (mut unknown, mut foreign) = (Vec::new(), Vec::new());
    for n in 0..30u64 {
        let bogus = bogus_id(Duration::from_secs(5), n + 1);
        for (id, times) in [(bogus.as_str(), &mut unknown), (ids[0], &mut foreign)] {
            let t = Instant::now();
            let (code, v) = post(&fb, "key-a", &json!({"id": id, "correct": true}));
            times.push(t.elapsed().as_secs_f64() * 1000.0);
            assert_eq!(code, 404, "{v}");
            assert_eq!(v["error"]["code"], "not_found", "{v}");
            let shown = v["error"]["message"].as_str().unwrap().replace(id, "ID");
            assert_eq!(
                shown, "no answer `ID` of this key within the feedback window (604800 s)",
                "{v}"
            );
        }
    }
    let (u, f) = (median(unknown.clone()), median(foreign.clone()));
    eprintln!("feedback 404 ms, median: unknown {u:.1}, foreign {f:.1}");
    assert!(
        u < 100.0 && f < 100.0,
        "unknown {unknown:?} foreign {foreign:?}"
    );
    // The owner's feedback on the same id is taken.
    let (code, v) = post(&fb, "key-b", &json!({"id": ids[0], "correct": true}));
    assert_eq!((code, v["duplicate"].as_bool()), (200, Some(false)), "{v}");
    // A young unknown id waits out the write window (its record could be on its way), then 404 — no longer.
    let t = Instant::now();
    let (code, _) = post(
        &fb,
        "key-a",
        &json!({"id": bogus_id(Duration::ZERO, 99), "correct": true}),
    );
    let took = t.elapsed();
    assert_eq!(code, 404);
    assert!(
        took >= Duration::from_millis(40) && took < Duration::from_millis(250),
        "{took:?}"
    );
}

/// A flood of feedback on bogus ids from tenant a takes no admission permit: with one request in flight
/// allowed, tenant b's chats made during the flood are all answered (before, each lookup held a permit for up
/// to 250 ms and b got 429).
#[test]
fn a_feedback_flood_takes_no_admission_permit() {
    let (s, _work) = two_tenants(&["--set", "server.max_in_flight=1"]);
    let fb = format!("{}/v1/feedback", s.base);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sent = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let flood: Vec<_> = (0..8u64)
        .map(|t| {
            let (fb, stop, sent) = (fb.clone(), stop.clone(), sent.clone());
            std::thread::spawn(move || {
                let mut n = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    n += 1;
                    let id = bogus_id(Duration::from_millis(n % 100), t << 32 | n);
                    let (code, v) = post(&fb, "key-a", &json!({"id": id, "correct": false}));
                    assert_eq!(code, 404, "{v}");
                    sent.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let codes: Vec<u16> = (0..20).map(|_| chat(&s.base, "key-b").0).collect();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for t in flood {
        t.join().unwrap();
    }
    let n = sent.load(std::sync::atomic::Ordering::Relaxed);
    assert!(n >= 20, "the flood sent {n} feedback requests");
    assert!(
        codes.iter().all(|&c| c == 200),
        "b's chats during a flood of {n}: {codes:?}"
    );
}

/// A POST whose head declares a 300 KiB body and sends none: status and body.
fn declared_too_large(base: &str, path: &str, key: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let addr = base.trim_start_matches("http://");
    let mut c = std::net::TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        c,
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {key}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        (4 << 20) + 1024
    )
    .unwrap();
    let mut raw = String::new();
    let _ = c.read_to_string(&mut raw);
    let code = raw
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = raw.split("\r\n\r\n").nth(1).unwrap_or_default().to_string();
    (code, body)
}

/// A raw POST with an API key: status and body as text.
fn post_raw(url: &str, key: &str, body: &str) -> (u16, String) {
    let r = ureq::post(url)
        .set("authorization", &format!("Bearer {key}"))
        .set("content-type", "application/json")
        .send_string(body);
    match r {
        Ok(r) => (r.status(), r.into_string().unwrap()),
        Err(ureq::Error::Status(code, r)) => (code, r.into_string().unwrap()),
        Err(e) => panic!("{url}: {e}"),
    }
}

/// Bad input on the feedback and admin endpoints is a clear error in OpenAI's shape (wrong types, an
/// oversized body, an expired id, a label of an audit that does not exist); feedback given eight times at once
/// on one answer is written once (one `duplicate: false`, the others `true`, all with the first's verdict).
#[test]
fn bad_input_is_a_clear_error_and_concurrent_feedback_is_written_once() {
    let (s, _work) = two_tenants(&["--set", "feedback.window_s=2"]);
    let fb = format!("{}/v1/feedback", s.base);
    let shape = |code: u16, body: &str, want: u16| -> Value {
        assert_eq!(code, want, "{body}");
        let v: Value = serde_json::from_str(body).unwrap_or_else(|_| panic!("not JSON: {body}"));
        assert!(
            v["error"]["message"].is_string() && v["error"]["type"].is_string(),
            "{v}"
        );
        v
    };
    for bad in [
        r#"{"id": 5, "correct": true}"#,
        r#"{"id": "x", "correct": "yes"}"#,
        r#"{"id": "x", "correct": true, "extra": 1}"#,
        r#"{"id": ""}"#,
        "not json",
    ] {
        let (code, body) = post_raw(&fb, "key-a", bad);
        shape(code, &body, 400);
    }
    // A body declared over the cap is refused before it is read: a raw request whose head says 4 MiB + 1 KiB and
    // which sends none of it (a client sending the whole body may see the connection close mid-send).
    let (code, body) = declared_too_large(&s.base, "/v1/feedback", "key-a");
    shape(code, &body, 413);

    // Eight at once on one answer: one written.
    let (_, answer) = chat(&s.base, "key-b");
    let id = answer["id"].as_str().unwrap().to_string();
    let all: Vec<_> = (0..8)
        .map(|i| {
            let (fb, id) = (fb.clone(), id.clone());
            std::thread::spawn(move || {
                post(&fb, "key-b", &json!({"id": id, "correct": i % 2 == 0}))
            })
        })
        .collect();
    let got: Vec<(u16, Value)> = all.into_iter().map(|t| t.join().unwrap()).collect();
    assert!(got.iter().all(|(c, _)| *c == 200), "{got:?}");
    let firsts = got.iter().filter(|(_, v)| v["duplicate"] == false).count();
    assert_eq!(firsts, 1, "{got:?}");
    let verdicts: std::collections::HashSet<bool> = got
        .iter()
        .map(|(_, v)| v["correct"].as_bool().unwrap())
        .collect();
    assert_eq!(
        verdicts.len(),
        1,
        "every reply states the first verdict: {got:?}"
    );

    // Expired: past the window, the answer is gone.
    std::thread::sleep(Duration::from_millis(2200));
    let (code, v) = post(&fb, "key-b", &json!({"id": id, "correct": true}));
    assert_eq!(
        (code, v["error"]["code"].as_str()),
        (404, Some("not_found")),
        "{v}"
    );

    // Admin endpoints: wrong types, unknown ids.
    let admin = |method: &str, path: &str, body: Option<&str>| -> (u16, String) {
        let req = ureq::request(method, &format!("{}{path}", s.admin));
        let r = match body {
            Some(b) => req.set("content-type", "application/json").send_string(b),
            None => req.call(),
        };
        match r {
            Ok(r) => (r.status(), r.into_string().unwrap()),
            Err(ureq::Error::Status(code, r)) => (code, r.into_string().unwrap()),
            Err(e) => panic!("{path}: {e}"),
        }
    };
    let (code, body) = admin(
        "POST",
        "/admin/audits/nope",
        Some(r#"{"label": "card_lost"}"#),
    );
    shape(code, &body, 404);
    let (code, body) = admin("POST", "/admin/audits/nope", Some(r#"{"label": 3}"#));
    shape(code, &body, 400);
    let (code, body) = admin("POST", "/admin/heads/classify", Some(r#"{"dir": 3}"#));
    shape(code, &body, 400);
    let (code, body) = admin(
        "POST",
        "/admin/heads/classify",
        Some(r#"{"dir": "models", "requests": "many"}"#),
    );
    shape(code, &body, 400);
    let (code, body) = admin("POST", "/admin/heads/nope/rollback", None);
    shape(code, &body, 404);
}
