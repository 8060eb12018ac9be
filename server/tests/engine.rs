//! The engine called directly, with no HTTP: `Engine::answer` for a Tier-0 answer, an escalation, a generation
//! and a declined request, each asserting the records it settles — the request metrics (a Prometheus recorder
//! installed in this test's process), the console's decisions, and the ledger's decision record (feedback on
//! the answer's id finds it only once it is settled). A generation settles at its end, not its first event:
//! `tiergate_request_duration_seconds` for a 2 s generation reads ≈ 2 s, time to first token its own histogram.
//! The requests are validated as the chat door validates them (`tiergate_server::validate`), over the real
//! state of the in-process rig (the tiny few-shot classifier, stub workers behind the real queue).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

mod common;

use metrics_exporter_prometheus::PrometheusHandle;
use serde_json::Value;
use tiergate_engine::answer::{Body, Delta};
use tiergate_engine::model::request::TenantId;
use tiergate_engine::{Engine, Verdict};

use common::rig::*;

/// The sum of the samples of `name` whose labels include every one of `labels`.
fn metric(h: &PrometheusHandle, name: &str, labels: &[&str]) -> f64 {
    h.render()
        .lines()
        .filter(|l| l.starts_with(name) && labels.iter().all(|x| l.contains(x)))
        .filter(|l| l[name.len()..].starts_with([' ', '{']))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum()
}

/// The console's recent decisions.
fn decisions(engine: &Engine) -> Vec<Value> {
    engine.console()["decisions"].as_array().unwrap().clone()
}

/// Whether the ledger holds `id`'s decision record (feedback on it is taken).
async fn recorded(engine: &Engine, id: &str) -> bool {
    engine
        .feedback(&TenantId::anonymous(), id, Verdict::Correct(true))
        .await
        .is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_answer_settles_its_records_and_a_generation_at_its_end() {
    let h = tiergate_engine::metrics::install().unwrap();
    // A 2 s generation: the stub spreads its delay over the tokens it writes.
    let r = rig(1, |c| {
        c.reranker.extra_args = vec!["--stub-delay-ms".into(), "2000".into()];
    });
    let e = &r.engine;

    // Tier-0 alone: settled before the door has the answer.
    let v = valid(e, "classify", "card lost", None);
    let a = e.answer(&v).await.unwrap();
    assert!(matches!(a.body, Body::Label(_)));
    assert_eq!(a.outcome.tier.as_str(), "tier0");
    let ok = ["outcome=\"ok\"", "door=\"chat\""];
    let tier0 = [&ok[..], &["route=\"classify\"", "tier=\"tier0\""]].concat();
    assert_eq!(metric(&h, "tiergate_requests_total", &tier0), 1.0);
    assert_eq!(decisions(e).len(), 1);
    assert!(recorded(e, &v.id).await);
    drop(a);

    // An escalation (θ forced to 0): the LLM reranks, settled when the answer is returned.
    let v = valid(e, "classify", "card lost", Some(0.0));
    let a = e.answer(&v).await.unwrap();
    assert_eq!(a.outcome.tier.as_str(), "llm");
    let llm = [&ok[..], &["route=\"classify\"", "tier=\"llm\""]].concat();
    assert_eq!(metric(&h, "tiergate_requests_total", &llm), 1.0);
    // Newest first.
    assert_eq!(decisions(e)[0]["channel"], "escalated");
    drop(a);

    // A generation: returned at its first event, settled at its end.
    let v = valid(e, "generate", "please write four words", None);
    let a = e.answer(&v).await.unwrap();
    let Body::Stream(mut g) = a.body else {
        panic!("a generation streams")
    };
    let gen = [&ok[..], &["route=\"generate\""]].concat();
    assert_eq!(metric(&h, "tiergate_requests_total", &gen), 0.0);
    assert!(!recorded(e, &v.id).await, "recorded before its end");
    let seen = decisions(e).len();
    while let Some(d) = g.next().await {
        if matches!(d.unwrap(), Delta::End { .. }) {
            break;
        }
    }
    assert_eq!(metric(&h, "tiergate_requests_total", &gen), 1.0);
    assert_eq!(decisions(e).len(), seen + 1);
    assert!(recorded(e, &v.id).await);
    let route = ["route=\"generate\""];
    let took = metric(&h, "tiergate_request_duration_seconds_sum", &route);
    eprintln!(
        "a 2 s generation: duration {took:.3} s, time to first token {:.3} s",
        metric(&h, "tiergate_time_to_first_token_seconds_sum", &[])
    );
    assert!((1.8..4.0).contains(&took), "duration {took} s");
    let ttft = metric(&h, "tiergate_time_to_first_token_seconds_sum", &[]);
    assert!(ttft > 0.0 && ttft < took * 0.7, "ttft {ttft} s of {took} s");
    assert!(g.outcome().timings.generation_ms >= 1500.0);
    drop(g);

    // A generation whose client goes away is settled as cancelled.
    let v = valid(e, "generate", "please write four words", None);
    let a = e.answer(&v).await.unwrap();
    drop(a);
    let cancelled = ["route=\"generate\"", "outcome=\"cancelled\""];
    assert_eq!(metric(&h, "tiergate_requests_total", &cancelled), 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declined_request_is_counted_by_its_status_only_when_it_ran() {
    let h = tiergate_engine::metrics::install().unwrap();
    // No workers: a generation cannot start.
    let r = rig(0, |_| {});
    let e = &r.engine;
    let v = valid(e, "generate", "hello there", None);
    let d = e.answer(&v).await.err().expect("no LLM to generate");
    assert!(d.ran);
    let status = d.error.status();
    assert_eq!(status, "503", "{:?}", d.error);
    let failed = [
        "route=\"generate\"",
        "channel=\"error\"",
        "outcome=\"503\"",
        "door=\"chat\"",
    ];
    assert_eq!(metric(&h, "tiergate_requests_total", &failed), 1.0);
    assert!(decisions(e).is_empty());
    assert!(!recorded(e, &v.id).await);
    // Refused before it ran (no such route): not counted among the requests.
    let mut v = valid(e, "classify", "card lost", None);
    v.route = "no-such-route".into();
    let d = e.answer(&v).await.err().expect("unknown route");
    assert!(!d.ran);
    assert_eq!(
        metric(&h, "tiergate_requests_total", &["route=\"no-such-route\""]),
        0.0
    );
}
