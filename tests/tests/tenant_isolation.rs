//! Two tenants on one real `tiergate serve` (stub LLM, θ = 0 so every question escalates, the answer cache
//! and the Responses store on): tenant b learns nothing of what tenant a asked — not by a header, a body, a
//! cache hit, feedback or a stored response's id — cannot plant an answer a will be served, and filling its
//! own stored responses evicts none of a's.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

use std::collections::BTreeMap;

use serde_json::{json, Value};

mod common;
use common::{key_sha256, start, Server};

/// Status, the headers that do not change from one request to the next of the same kind (not its id, date
/// or timings), and the body.
fn call(
    s: &Server,
    key: &str,
    path: &str,
    body: Option<&Value>,
) -> (u16, BTreeMap<String, String>, Value) {
    let url = format!("{}{path}", s.base);
    let req = match body {
        Some(_) => ureq::post(&url),
        None => ureq::get(&url),
    }
    .set("authorization", &format!("Bearer {key}"));
    let sent = match body {
        Some(b) => req.send_json(b.clone()),
        None => req.call(),
    };
    let r = match sent {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("{e}"),
    };
    let varying = [
        "date",
        "x-request-id",
        "x-tiergate-trace-id",
        "server-timing",
        "content-length",
    ];
    let headers = r
        .headers_names()
        .into_iter()
        .filter(|h| !varying.contains(&h.as_str()))
        .map(|h| {
            let v = r.header(&h).unwrap_or_default().to_string();
            (h, v)
        })
        .collect();
    (r.status(), headers, r.into_json().unwrap_or(Value::Null))
}

fn chat(text: &str) -> Value {
    json!({"model": "classify", "messages": [{"role": "user", "content": text}]})
}

/// A chat answer without what differs between any two answers (its id and time).
fn answer_body(mut v: Value) -> Value {
    for k in ["id", "created"] {
        v.as_object_mut().unwrap().remove(k);
    }
    v
}

/// An error body with `id` written as `<id>`.
fn unnamed(v: &Value, id: &str) -> String {
    v.to_string().replace(id, "<id>")
}

#[test]
fn a_tenant_learns_nothing_of_anothers_traffic_and_evicts_none_of_its_responses() {
    let tenants = format!(
        "tenants=[{{name=\"a\",key_sha256=\"{}\"}},{{name=\"b\",key_sha256=\"{}\"}}]",
        key_sha256("key-a"),
        key_sha256("key-b")
    );
    let s = start(&[
        "--set",
        "reranker.engine=\"stub\"",
        "--set",
        "routing.mode=\"static\"",
        "--set",
        "routing.theta_base=0.0",
        "--set",
        "cache.enabled=true",
        "--set",
        "responses.store=true",
        "--set",
        "responses.max_per_tenant=5",
        "--set",
        &tenants,
    ]);
    // 1. a asks first (nobody had); b then asks the same: b's answer is what a's was — the LLM's, no cache
    //    header, the same headers and body but for the answer's id and time.
    let question = chat("my card was lost yesterday");
    let (sa, ha, ba) = call(&s, "key-a", "/v1/chat/completions", Some(&question));
    assert_eq!(sa, 200, "{ba}");
    assert_eq!(ha["x-tiergate-tier"], "llm", "{ha:?}");
    let (_, again, _) = call(&s, "key-a", "/v1/chat/completions", Some(&question));
    assert_eq!(
        again["x-tiergate-tier"], "cache",
        "a's own verdict is a's hit: {again:?}"
    );
    let (sb, hb, bb) = call(&s, "key-b", "/v1/chat/completions", Some(&question));
    assert_eq!(sb, 200);
    assert_eq!(hb, ha, "b's headers after a asked are a's when nobody had");
    assert_eq!(answer_body(bb.clone()), answer_body(ba.clone()));
    // 2. b cannot plant: what b asked first is no hit of a's — the same words (exact) or near ones (semantic).
    for text in [
        "I have lost my card, what now",
        "how do I top up my account",
    ] {
        let (_, h, _) = call(&s, "key-b", "/v1/chat/completions", Some(&chat(text)));
        assert_eq!(h["x-tiergate-tier"], "llm");
        let (_, h, _) = call(&s, "key-b", "/v1/chat/completions", Some(&chat(text)));
        assert_eq!(h["x-tiergate-tier"], "cache", "b's own verdict is b's hit");
    }
    for text in [
        "I have lost my card, what now",
        "how can I top up my account please",
    ] {
        let (_, h, _) = call(&s, "key-a", "/v1/chat/completions", Some(&chat(text)));
        assert_eq!(
            h["x-tiergate-tier"], "llm",
            "b's verdict served to a for {text:?}: {h:?}"
        );
        assert!(!h.contains_key("x-tiergate-cache"), "{h:?}");
    }
    // The near question is a hit where the plant is in scope — b's own (so the check above could fail).
    let near = chat("how can I top up my account please");
    let (_, h, _) = call(&s, "key-b", "/v1/chat/completions", Some(&near));
    assert_eq!(
        h.get("x-tiergate-cache").map(String::as_str),
        Some("semantic"),
        "{h:?}"
    );
    // 3. Feedback: a's answer and an id nobody was given read the same to b.
    let a_id = ba["id"].as_str().unwrap();
    let unknown = format!("{}0", &a_id[..a_id.len() - 1]);
    let unknown = if unknown == a_id {
        format!("{}1", &a_id[..a_id.len() - 1])
    } else {
        unknown
    };
    let fb = |id: &str| {
        call(
            &s,
            "key-b",
            "/v1/feedback",
            Some(&json!({"id": id, "correct": false})),
        )
    };
    let (s1, h1, b1) = fb(a_id);
    let (s2, h2, b2) = fb(&unknown);
    assert_eq!((s1, s2), (404, 404));
    assert_eq!(h1, h2);
    assert_eq!(unnamed(&b1, a_id), unnamed(&b2, &unknown));
    // 4. Stored responses: a keeps 3; b writes 8 past its share of 5 — b loses its own oldest 3, a none.
    let respond = |key: &str, i: usize| {
        let (st, _, b) = call(
            &s,
            key,
            "/v1/responses",
            Some(
                &json!({"model": "classify", "input": format!("where is my refund {i}"), "store": true}),
            ),
        );
        assert_eq!(st, 200, "{b}");
        assert_eq!(b["store"], true, "{b}");
        b["id"].as_str().unwrap().to_string()
    };
    let mine: Vec<String> = (0..3).map(|i| respond("key-a", i)).collect();
    let theirs: Vec<String> = (0..8).map(|i| respond("key-b", 100 + i)).collect();
    let status = |key: &str, id: &str| call(&s, key, &format!("/v1/responses/{id}"), None).0;
    for id in &mine {
        assert_eq!(
            status("key-a", id),
            200,
            "a's response {id} after b's flood"
        );
    }
    for (i, id) in theirs.iter().enumerate() {
        assert_eq!(
            status("key-b", id),
            if i < 3 { 404 } else { 200 },
            "b's response {i}"
        );
    }
    // And b reading a's stored response learns no more than from an id nobody was given.
    let (s1, h1, b1) = call(&s, "key-b", &format!("/v1/responses/{}", mine[0]), None);
    let never = format!("{}0000", &mine[0][..mine[0].len() - 4]);
    let (s2, h2, b2) = call(&s, "key-b", &format!("/v1/responses/{never}"), None);
    assert_eq!((s1, s2), (404, 404));
    assert_eq!(h1, h2);
    assert_eq!(unnamed(&b1, &mine[0]), unnamed(&b2, &never));
}
