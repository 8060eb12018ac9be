//! Out of scope on the in-process rig: Tier-0's call, its live threshold, and an uncertain call asked of the
//! (stub) LLM, which may say "none of these".

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

use serde_json::{json, Value};

mod common;
use common::rig::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_route_answers_out_of_scope_at_tier0_and_the_threshold_moves_live() {
    let r = rig(0, guarded);
    // Threshold 2: no score is above it — in scope, with the score reported.
    let (h, v) = json_answer(&r, "guarded", "card lost").await;
    assert_eq!(
        (v["label"].as_str(), v["out_of_scope"].as_bool()),
        (Some("card_lost"), Some(false))
    );
    let score: f32 = h["x-tiergate-oos-score"].to_str().unwrap().parse().unwrap();
    assert!((0.0..=1.0).contains(&score), "1 - max p: {score}");
    assert!(h.get("x-tiergate-out-of-scope").is_none());
    // A route without the outcome reports no score.
    let (_, h, _) = call(
        &r.app,
        post("/v1/chat/completions", chat("classify", "card lost")),
    )
    .await;
    assert!(h.get("x-tiergate-oos-score").is_none());

    // The live override puts every query out of scope (scores are >= 0 > -1).
    patch_routing(&r, json!({"oos_threshold": -1.0})).await;
    let (h, v) = json_answer(&r, "guarded", "card lost").await;
    assert_eq!(v["label"], "out_of_scope", "{v}");
    assert_eq!(v["out_of_scope"], true);
    assert_eq!(v["tier"], "tier0");
    assert_eq!(h["x-tiergate-out-of-scope"], "1");
    assert_eq!(h["x-tiergate-tier"], "tier0");
    // Plain classify: the label; answer route: the configured reply.
    let (_, _, b) = call(
        &r.app,
        post("/v1/chat/completions", chat("guarded", "card lost")),
    )
    .await;
    let v: Value = serde_json::from_slice(&b).unwrap();
    assert_eq!(v["choices"][0]["message"]["content"], "out_of_scope");
    let (_, h, b) = call(
        &r.app,
        post("/v1/chat/completions", chat("guarded_answer", "pay bill")),
    )
    .await;
    let v: Value = serde_json::from_slice(&b).unwrap();
    assert_eq!(
        v["choices"][0]["message"]["content"],
        "I can only help with cards and bills."
    );
    assert_eq!(h["x-tiergate-out-of-scope"], "1");
    // Routes without the outcome are untouched by the override.
    let (_, h, b) = call(
        &r.app,
        post("/v1/chat/completions", chat("classify", "card lost")),
    )
    .await;
    let v: Value = serde_json::from_slice(&b).unwrap();
    assert_eq!(v["choices"][0]["message"]["content"], "card_lost");
    assert!(h.get("x-tiergate-out-of-scope").is_none());
    // The console's decisions count it in its own channel.
    // (Newest first.)
    let recent = decisions(&r);
    let last_guarded = recent
        .iter()
        .find(|d| d["route"] == "guarded_answer")
        .unwrap();
    assert_eq!(last_guarded["channel"], "out_of_scope");
    assert!(last_guarded["out_of_scope"] == true && last_guarded["oos"].is_number());
    assert_eq!(recent[0]["channel"], "tier0");

    // Back to each route's own threshold; a bad value is refused naming the field.
    patch_routing(&r, json!({"oos_threshold": null})).await;
    let (_, v) = json_answer(&r, "guarded", "card lost").await;
    assert_eq!(v["out_of_scope"], false);
    let (s, _, b) = call(
        &r.admin,
        admin("PATCH", Some(json!({"oos_margin": 2})), true, None),
    )
    .await;
    assert!(assert_openai_error(s, &b, 400)["error"]["message"]
        .to_string()
        .contains("oos_margin"));
}

/// An uncertain out-of-scope call goes to the LLM with "none of these" as its last candidate: the stub worker
/// scores a candidate by the words it shares with the text, so a query naming "none of these" gets it and a
/// query naming a label gets the label.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_uncertain_out_of_scope_call_asks_the_llm_which_may_say_none() {
    let r = rig(1, guarded);
    // Every score within the band: every request escalates.
    patch_routing(
        &r,
        json!({"oos_threshold": 0.5, "oos_margin": 1.0, "theta_base": 1.0, "mode": "static"}),
    )
    .await;
    let (h, v) = json_answer(&r, "guarded", "none of these things").await;
    assert_eq!(h["x-tiergate-tier"], "llm", "{v}");
    assert_eq!(v["label"], "out_of_scope", "{v}");
    assert_eq!(v["out_of_scope"], true);
    assert_eq!(h["x-tiergate-out-of-scope"], "1");
    let labels: Vec<&str> = v["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["label"].as_str().unwrap())
        .collect();
    assert!(
        labels.contains(&"card_lost") && labels[0] == "out_of_scope",
        "{labels:?}"
    );
    let (h, v) = json_answer(&r, "guarded", "card lost").await;
    assert_eq!(h["x-tiergate-tier"], "llm");
    assert_eq!(
        (v["label"].as_str(), v["out_of_scope"].as_bool()),
        (Some("card_lost"), Some(false)),
        "{v}"
    );
    // The LLM's "none" is counted in the escalated channel, flagged out of scope.
    let d = decisions(&r);
    let none = d.iter().find(|d| d["out_of_scope"] == true).unwrap();
    assert_eq!(none["channel"], "escalated");

    // Without workers the escalation degrades to Tier-0's own call: out of scope above the threshold.
    let r = rig(0, guarded);
    patch_routing(&r, json!({"oos_threshold": -0.5, "oos_margin": 1.0})).await;
    let (h, v) = json_answer(&r, "guarded", "card lost").await;
    assert_eq!(h["x-tiergate-degraded"], "no_llm");
    assert_eq!(v["label"], "out_of_scope", "{v}");
    assert_eq!(decisions(&r)[0]["channel"], "degraded");
}

/// The console's recent decisions, newest first.
fn decisions(r: &Rig) -> Vec<Value> {
    r.engine.console()["decisions"].as_array().unwrap().clone()
}
