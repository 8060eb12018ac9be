//! The other dialects' doors against the real server, through their official SDKs: Anthropic Messages
//! (`tests/python/anthropic_messages.py`, the `anthropic` package that scripts/test.sh installs) and OpenAI
//! Responses (`tests/python/openai_responses.py`) on every route, plain and streamed, with errors in each
//! door's shape and Anthropic keys as `x-api-key`; tool calls through all three doors
//! (`tests/python/tool_calls.py`).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::process::Command;

use common::{key_sha256, start};
use tiergate_tests::root;

fn sdk(script: &str, base: &str, keys: &[&str]) -> String {
    let out = Command::new("python3")
        .arg(root().join("tests/python").join(script))
        .arg(base)
        .args(keys)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{script} failed (are the `anthropic` and `openai` packages installed? scripts/test.sh installs them):\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout).to_string();
    eprint!("{stdout}");
    stdout
}

/// `--set` values that keep a test server's decision records and stored responses in `work`.
fn ledger_in(work: &tempfile::TempDir) -> String {
    format!(
        "feedback.path=\"{}\"",
        work.path().join("f.sqlite").display()
    )
}

fn responses_in(work: &tempfile::TempDir) -> String {
    format!(
        "responses.path=\"{}\"",
        work.path().join("responses.sqlite").display()
    )
}

/// Every route through `POST /v1/messages` with the official `anthropic` SDK (stub LLM engine).
#[test]
fn the_anthropic_sdk_talks_to_every_route() {
    let work = tempfile::tempdir().unwrap();
    let ledger = ledger_in(&work);
    let s = start(&["--set", "reranker.engine=\"stub\"", "--set", &ledger]);
    sdk("anthropic_messages.py", &s.base, &[]);
    assert_door_counted(&s.base, "messages");
}

/// The request counter names the door its requests came through.
fn assert_door_counted(base: &str, door: &str) {
    let m = ureq::get(&format!("{base}/metrics"))
        .call()
        .unwrap()
        .into_string()
        .unwrap();
    let want = format!("door=\"{door}\"");
    assert!(
        m.lines()
            .any(|l| l.starts_with("tiergate_requests_total{") && l.contains(&want)),
        "no tiergate_requests_total with {want}:\n{m}"
    );
}

/// With tenants, the SDK's `x-api-key` is the tenant's key; an unknown key is a 401 `authentication_error`.
#[test]
fn an_anthropic_key_is_a_tenant_key() {
    let work = tempfile::tempdir().unwrap();
    let ledger = ledger_in(&work);
    let tenants = format!(
        "tenants=[{{ name = \"a\", key_sha256 = \"{}\" }}]",
        key_sha256("key-a")
    );
    let s = start(&[
        "--set",
        "reranker.engine=\"stub\"",
        "--set",
        &ledger,
        "--set",
        &tenants,
    ]);
    sdk("anthropic_messages.py", &s.base, &["key-a", "key-wrong"]);
}

/// Every route through `POST /v1/responses` with the official `openai` SDK (stub LLM engine).
#[test]
fn the_openai_sdk_talks_to_every_route_through_responses() {
    let work = tempfile::tempdir().unwrap();
    let ledger = ledger_in(&work);
    let s = start(&["--set", "reranker.engine=\"stub\"", "--set", &ledger]);
    sdk("openai_responses.py", &s.base, &[]);
    assert_door_counted(&s.base, "responses");
}

/// `tiergate-bench --api responses|messages` load-tests those doors as it does Chat Completions: every
/// request answered, the channels and their bands reported, time to first token measured on a stream, and
/// the Messages key sent as `x-api-key` (the server has a tenant, so a wrong header would be 401s).
#[test]
fn the_bench_speaks_every_dialect() {
    let work = tempfile::tempdir().unwrap();
    let ledger = ledger_in(&work);
    let tenants = format!(
        "tenants=[{{ name = \"a\", key_sha256 = \"{}\" }}]",
        key_sha256("key-a")
    );
    let s = start(&[
        "--set",
        "reranker.engine=\"stub\"",
        "--set",
        &ledger,
        "--set",
        &tenants,
    ]);
    for (api, route, stream) in [
        ("chat", "classify", false),
        ("responses", "classify", false),
        ("responses", "generate", true),
        ("messages", "answer", false),
        ("messages", "generate", true),
    ] {
        let out = work.path().join(format!("{api}-{route}.json"));
        let mut cmd = Command::new(tiergate_tests::binary("tiergate-bench"));
        cmd.current_dir(root())
            .args(["--url", &s.base, "--api-key", "key-a", "--api", api])
            .args(["--route", route, "--data", "bench/workloads/bank24.jsonl"])
            .args([
                "--requests",
                "20",
                "--concurrency",
                "2",
                "--max-tokens",
                "8",
            ])
            .arg("--json")
            .arg(&out)
            .arg("--quiet");
        if stream {
            cmd.arg("--stream");
        }
        let o = cmd.output().unwrap();
        assert!(
            o.status.success(),
            "{api} {route}: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
        let run = &v["runs"][0];
        assert_eq!(run["settings"]["api"], api);
        let all = run["channels"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["channel"] == "all")
            .unwrap_or_else(|| panic!("{api}: {run}"));
        assert_eq!(all["count"], 20, "{api} {route}: {all}");
        let errors: u64 = all["errors"]
            .as_object()
            .unwrap()
            .values()
            .map(|n| n.as_u64().unwrap())
            .sum();
        assert_eq!(errors, 0, "{api} {route}: {all}");
        assert!(all["band"].is_string(), "{api} {route}: {all}");
        if stream {
            assert!(all["ttft"]["p50_ms"].as_f64().unwrap() > 0.0, "{all}");
            assert!(all["tokens_out"].as_u64().unwrap() >= 20, "{all}");
        }
    }
}

/// With `[responses] store = true`: a response is retrieved, `previous_response_id` continues it (plain and
/// streamed), `store: false` keeps nothing, and another tenant's response is neither shown nor continued;
/// kept in the SQLite file, a response is still there after a restart.
#[test]
fn stored_responses_continue_for_their_tenant_only() {
    let work = tempfile::tempdir().unwrap();
    let ledger = ledger_in(&work);
    let tenants = format!(
        "tenants=[{{ name = \"a\", key_sha256 = \"{}\" }}, {{ name = \"b\", key_sha256 = \"{}\" }}]",
        key_sha256("key-a"),
        key_sha256("key-b")
    );
    let file = responses_in(&work);
    let args = [
        "--set",
        "reranker.engine=\"stub\"",
        "--set",
        &ledger,
        "--set",
        &tenants,
        "--set",
        "responses.store=true",
        "--set",
        &file,
    ];
    let s = start(&args);
    let out = sdk("openai_responses_store.py", &s.base, &["key-a", "key-b"]);
    let id = out
        .lines()
        .find_map(|l| l.strip_prefix("first-id "))
        .unwrap()
        .to_string();
    drop(s);
    assert!(work.path().join("responses.sqlite").is_file());
    let s = start(&args);
    let v: serde_json::Value = ureq::get(&format!("{}/v1/responses/{id}", s.base))
        .set("authorization", "Bearer key-a")
        .call()
        .unwrap()
        .into_json()
        .unwrap();
    assert_eq!(v["id"], id.as_str(), "{v}");
}

/// Tool calls end to end through Chat Completions, Responses and Messages with the official SDKs: a worker
/// process (`tools = true`) receives the tools and the conversation's tool calls and results through the
/// queue and streams its calls back; the server renders them in each dialect. On both local engines (llama.cpp,
/// the default, and mistralrs) with the Qwen2.5-Coder-0.5B file (a real model's calls), then on the stub engine
/// (the cases a 0.5B model cannot be held to: parallel and named calls, a 20-turn conversation at the size
/// limits).
#[test]
fn tool_calls_travel_through_every_door() {
    let qwen = tiergate_tests::qwen_judge();
    for engine in ["llamacpp", "mistralrs"] {
        tool_calls_on(
            &format!("reranker.model=\"{}\"", qwen.display()),
            &format!("reranker.engine=\"{engine}\""),
            "model",
        );
    }
    tool_calls_on("reranker.engine=\"stub\"", "reranker.workers=1", "stub");
}

/// A generation's deadline for these runs (the Qwen one needs it): mistralrs spends about 160 ms a token
/// on this model on two cores, prompt tokens included (a tool turn's prompt is 140–200), so one turn takes up
/// to ~35 s alone and twice that when another test shares the cores. The cases assert what travels through
/// the doors, not how fast: five minutes, the same as the client's timeout in `tool_calls.py`.
const GENERATE_DEADLINE: &str = "reranker.generate_deadline_ms=300000";

/// A server whose backend calls tools, with a ledger and a Responses store in `work`, and `extra` settings.
fn tools_server(work: &tempfile::TempDir, extra: &[&str]) -> common::Server {
    let (ledger, file) = (ledger_in(work), responses_in(work));
    let mut args = vec![
        "--set",
        "reranker.tools=true",
        "--set",
        &ledger,
        "--set",
        "responses.store=true",
        "--set",
        &file,
    ];
    args.extend_from_slice(extra);
    start(&args)
}

fn tool_calls_on(engine: &str, also: &str, mode: &str) {
    let work = tempfile::tempdir().unwrap();
    let s = tools_server(
        &work,
        &["--set", engine, "--set", also, "--set", GENERATE_DEADLINE],
    );
    let out = sdk("tool_calls.py", &s.base, &[mode]);
    assert!(out.contains("cases passed"), "{out}");
}

/// The conformance matrix (`tests/python/conformance_matrix.py`, ≥ 50 named cases): {chat, responses,
/// messages} × {plain, streamed} × {classify, answer, generate} text, the tool loop on generate and JSON output
/// on classify, then each door's errors in its own shape (bad field, missing `max_tokens`, unknown model, over
/// the body cap, bad key, a tool result without its call, an unknown, unstored or another tenant's
/// `previous_response_id`), then what agents send (Claude Code's and Codex's first requests, every field set
/// aside by name, usage on streams, `count_tokens` against the backend's own count, `max_tokens` 64,000, a
/// 1 MB conversation, model aliases, Codex's freeform and shell tools), with the official SDKs, 0 failures.
#[test]
fn the_conformance_matrix_passes() {
    let work = tempfile::tempdir().unwrap();
    let tenants = format!(
        "tenants=[{{ name = \"a\", key_sha256 = \"{}\" }}, {{ name = \"b\", key_sha256 = \"{}\" }}]",
        key_sha256("key-a"),
        key_sha256("key-b")
    );
    let s = tools_server(
        &work,
        &[
            "--set",
            "reranker.engine=\"stub\"",
            "--set",
            &tenants,
            "--set",
            "routes=[{ name = \"classify\", kind = \"classify\" }, { name = \"answer\", kind = \"answer\" }, \
             { name = \"generate\", kind = \"generate\", aliases = [\"claude-*\", \"gpt-5*\"] }]",
        ],
    );
    let out = sdk(
        "conformance_matrix.py",
        &s.base,
        &["key-a", "key-b", "key-wrong"],
    );
    let passed: usize = out
        .lines()
        .find_map(|l| l.strip_suffix(" cases passed"))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    assert!(passed >= 50, "{passed} cases: {out}");
}

/// The prompt cache the llama.cpp engine read from is in every door's usage: a conversation's second turn
/// (its first turn and answer sent again, then a question) starts from the sequence the first turn left
/// cached, and says how many of its prompt tokens came from it — Chat Completions'
/// `prompt_tokens_details.cached_tokens` (within `prompt_tokens`), Responses' `input_tokens_details`, Messages'
/// `cache_read_input_tokens` (with `input_tokens` the rest). A first turn with nothing cached before it says
/// fewer than its whole prompt (a fresh conversation shares at most the template's opening).
#[test]
fn every_door_says_what_the_llama_cpp_prompt_cache_held() {
    let model = root().join("models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf");
    let s = start(&[
        "--set",
        "reranker.engine=\"llamacpp\"",
        "--set",
        &format!("reranker.model=\"{}\"", model.display()),
        "--set",
        "reranker.workers=1",
        "--set",
        "reranker.warmup_ms=0",
        "--set",
        "routes=[{ name = \"generate\", kind = \"generate\" }]",
    ]);
    let post = |path: &str, body: serde_json::Value| -> serde_json::Value {
        ureq::post(&format!("{}{path}", s.base))
            .set("x-api-key", "unused")
            .set("anthropic-version", "2023-06-01")
            .send_json(body)
            .unwrap()
            .into_json()
            .unwrap()
    };
    let opening = "Here is a long note about a bank account that the assistant should keep in mind: \
                   the card ending 4242 was ordered on Monday, posted on Tuesday, and has not arrived.";
    for (door, n) in [("chat", 0), ("responses", 1), ("messages", 2)] {
        // Each door's conversation starts apart from the others' (the cache holds theirs too).
        let first = format!("Question {n}. {opening} When will it come?");
        let turns = |second: bool| {
            let mut m = vec![serde_json::json!({"role": "user", "content": first})];
            if second {
                m.push(serde_json::json!({"role": "assistant", "content": "Soon."}));
                m.push(serde_json::json!({"role": "user", "content": "And if it does not?"}));
            }
            m
        };
        let ask = |second: bool| -> (u64, u64) {
            match door {
                "chat" => {
                    let v = post(
                        "/v1/chat/completions",
                        serde_json::json!({"model": "generate", "max_tokens": 4, "messages": turns(second)}),
                    );
                    let u = &v["usage"];
                    (
                        u["prompt_tokens"].as_u64().unwrap(),
                        u["prompt_tokens_details"]["cached_tokens"]
                            .as_u64()
                            .unwrap(),
                    )
                }
                "responses" => {
                    let v = post(
                        "/v1/responses",
                        serde_json::json!({"model": "generate", "max_output_tokens": 4, "input": turns(second)}),
                    );
                    let u = &v["usage"];
                    (
                        u["input_tokens"].as_u64().unwrap(),
                        u["input_tokens_details"]["cached_tokens"].as_u64().unwrap(),
                    )
                }
                _ => {
                    let v = post(
                        "/v1/messages",
                        serde_json::json!({"model": "generate", "max_tokens": 4, "messages": turns(second)}),
                    );
                    let u = &v["usage"];
                    let cached = u["cache_read_input_tokens"].as_u64().unwrap();
                    (u["input_tokens"].as_u64().unwrap() + cached, cached)
                }
            }
        };
        let (prompt1, cached1) = ask(false);
        assert!(cached1 < prompt1 / 2, "{door}: {cached1} of {prompt1}");
        let (prompt2, cached2) = ask(true);
        assert!(
            cached2 >= prompt1 - 2 && cached2 < prompt2,
            "{door}: the second turn read its first from the cache: {cached2} of {prompt2} (first {prompt1})"
        );
    }
}
