//! The Batch API on a real `tiergate serve` (stub LLM worker, θ = 0 so every line escalates): the official
//! `openai` Python client unchanged (upload, create, poll, download, cancel, list, a refused create), a server
//! SIGKILLed mid-batch that resumes after restart with exactly one output line per input line, and the signed
//! completion webhook.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use tiergate_tests::root;

mod common;
use common::{start_env, Server};

fn input(dir: &std::path::Path, n: usize) -> std::path::PathBuf {
    let texts = [
        "my card has not arrived",
        "how do I top up",
        "someone stole my card",
        "hmm",
    ];
    let body: String = (0..n)
        .map(|i| {
            json!({"custom_id": format!("req-{i}"), "method": "POST", "url": "/v1/chat/completions",
                   "body": {"model": "classify", "messages": [{"role": "user", "content": texts[i % 4]}]}})
            .to_string()
                + "\n"
        })
        .collect();
    let p = dir.join("input.jsonl");
    std::fs::write(&p, body).unwrap();
    p
}

fn server(data: &std::path::Path, extra: &[&str], env: &[(&str, &str)]) -> Server {
    let dir = format!("batch.data_dir=\"{}\"", data.display());
    let mut args = vec![
        "--set",
        "reranker.engine=\"stub\"",
        "--set",
        "routing.mode=\"static\"",
        "--set",
        "routing.theta_base=0.0",
        "--set",
        &dir,
    ];
    args.extend_from_slice(extra);
    start_env(&args, env)
}

#[test]
fn the_openai_client_runs_a_batch_unchanged() {
    let tmp = tempfile::tempdir().unwrap();
    // 50 ms a line: the second batch is still running when the client cancels it (without a delay its twelve
    // lines could all finish before the cancel arrives, and a finished batch cannot be cancelled).
    let s = server(
        &tmp.path().join("data"),
        &["--set", "reranker.extra_args=[\"--stub-delay-ms\", \"50\"]"],
        &[],
    );
    let out = Command::new("python3")
        .arg(root().join("tests/python/batch_openai.py"))
        .arg(&s.base)
        .arg(input(tmp.path(), 12))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "batch_openai.py (openai package):\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["file"]["purpose"], "batch");
    assert_eq!(r["batch"]["status"], "completed");
    assert_eq!(
        r["batch"]["counts"],
        json!({"total": 12, "completed": 12, "failed": 0})
    );
    assert_eq!(r["batch"]["metadata"]["suite"], "batch_openai");
    assert!(r["batch"]["error_file_id"].is_null());
    let lines = r["lines"].as_array().unwrap();
    let ids: Vec<&str> = lines
        .iter()
        .map(|l| l["custom_id"].as_str().unwrap())
        .collect();
    let want: Vec<String> = (0..12).map(|i| format!("req-{i}")).collect();
    assert_eq!(ids, want, "one line per request, in input order");
    assert!(lines
        .iter()
        .all(|l| l["status"] == 200 && !l["content"].as_str().unwrap().is_empty()));
    // θ = 0: every line went through the same routing as a live request and was escalated.
    assert!(lines.iter().all(|l| l["tier"] == "llm"), "{lines:?}");
    assert_eq!(r["cancelled"]["status"], "cancelled");
    let listed: Vec<&str> = r["listed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(
        listed[..2],
        [
            r["cancelled"]["id"].as_str().unwrap(),
            r["batch"]["id"].as_str().unwrap()
        ]
    );
    assert!(
        r["refused"]
            .as_str()
            .unwrap()
            .contains("no file `file-nope`"),
        "{r}"
    );
}

fn get(s: &Server, path: &str) -> Value {
    ureq::get(&format!("{}{path}", s.base))
        .call()
        .unwrap()
        .into_json()
        .unwrap()
}

fn upload_and_create(s: &Server, input: &std::path::Path) -> String {
    let boundary = "tgboundary";
    let mut body = format!(
        "--{boundary}\r\ncontent-disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n--{boundary}\r\n\
         content-disposition: form-data; name=\"file\"; filename=\"in.jsonl\"\r\ncontent-type: application/jsonl\r\n\r\n"
    )
    .into_bytes();
    body.extend(std::fs::read(input).unwrap());
    body.extend(format!("\r\n--{boundary}--\r\n").into_bytes());
    let f: Value = ureq::post(&format!("{}/v1/files", s.base))
        .set(
            "content-type",
            &format!("multipart/form-data; boundary={boundary}"),
        )
        .send_bytes(&body)
        .unwrap()
        .into_json()
        .unwrap();
    let b: Value = ureq::post(&format!("{}/v1/batches", s.base))
        .send_json(json!({"input_file_id": f["id"], "endpoint": "/v1/chat/completions", "completion_window": "24h"}))
        .unwrap()
        .into_json()
        .unwrap();
    b["id"].as_str().unwrap().to_string()
}

/// The output file of a finished batch.
fn output_file(s: &Server, b: &Value) -> String {
    let id = b["output_file_id"].as_str().unwrap();
    ureq::get(&format!("{}/v1/files/{id}/content", s.base))
        .call()
        .unwrap()
        .into_string()
        .unwrap()
}

fn wait_status(s: &Server, id: &str, status: &str) -> Value {
    let t = Instant::now();
    loop {
        let b = get(s, &format!("/v1/batches/{id}"));
        if b["status"] == status {
            return b;
        }
        assert!(t.elapsed() < Duration::from_secs(120), "still {b}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_server_killed_mid_batch_resumes_and_loses_no_line() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let n = 40;
    let input = input(tmp.path(), n);
    // 150 ms per rerank: the batch takes seconds, long enough to kill the server in the middle.
    let slow = [
        "--set",
        "reranker.extra_args=[\"--stub-delay-ms\", \"150\"]",
    ];
    let mut s = server(&data, &slow, &[]);
    let id = upload_and_create(&s, &input);
    let t = Instant::now();
    loop {
        let b = get(&s, &format!("/v1/batches/{id}"));
        let done = b["request_counts"]["completed"].as_u64().unwrap();
        if done >= 5 {
            assert!(done < n as u64, "the batch finished before the kill: {b}");
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(60), "{b}");
        std::thread::sleep(Duration::from_millis(50));
    }
    s.child.kill().unwrap(); // SIGKILL: no drain, no goodbye
    s.child.wait().unwrap();
    drop(s);
    // A new server on the same data directory resumes the batch.
    let s = server(&data, &slow, &[]);
    let b = wait_status(&s, &id, "completed");
    assert_eq!(
        b["request_counts"],
        json!({"total": n, "completed": n, "failed": 0}),
        "{b}"
    );
    let out = output_file(&s, &b);
    let mut per_id: HashMap<String, u32> = HashMap::new();
    for l in out.lines() {
        let v: Value = serde_json::from_str(l).unwrap();
        assert_eq!(v["response"]["status_code"], 200, "{v}");
        // Answered by the LLM, not degraded: after the restart, lines wait for the new worker.
        assert_eq!(v["response"]["headers"]["x-tiergate-tier"], "llm", "{v}");
        assert!(
            v["response"]["headers"]["x-tiergate-degraded"].is_null(),
            "{v}"
        );
        *per_id
            .entry(v["custom_id"].as_str().unwrap().to_string())
            .or_default() += 1;
    }
    assert_eq!(per_id.len(), n, "every input line has an output line");
    assert!(
        per_id.values().all(|&c| c == 1),
        "and exactly one: {per_id:?}"
    );
}

#[test]
fn a_finished_batch_is_posted_to_the_webhook_signed() {
    let hook = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("webhook_url=\"http://{}/hook\"", hook.local_addr().unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        // The first attempt is refused (500): the webhook is retried.
        for (i, conn) in hook.incoming().enumerate() {
            let mut c = conn.unwrap();
            let mut r = BufReader::new(c.try_clone().unwrap());
            let mut headers = HashMap::new();
            loop {
                let mut line = String::new();
                r.read_line(&mut line).unwrap();
                if line.trim().is_empty() {
                    break;
                }
                if let Some((k, v)) = line.split_once(':') {
                    headers.insert(k.trim().to_lowercase(), v.trim().to_string());
                }
            }
            let mut body = vec![0; headers["content-length"].parse().unwrap()];
            r.read_exact(&mut body).unwrap();
            let status = if i == 0 {
                "500 Internal Server Error"
            } else {
                "200 OK"
            };
            c.write_all(format!("HTTP/1.1 {status}\r\ncontent-length: 0\r\n\r\n").as_bytes())
                .unwrap();
            if i > 0 {
                tx.send((headers, body)).unwrap();
                return;
            }
        }
    });
    let tmp = tempfile::tempdir().unwrap();
    let webhook = format!("batch.{url}");
    let s = server(
        &tmp.path().join("data"),
        &[
            "--set",
            &webhook,
            "--set",
            "batch.webhook_secret_env=\"HOOK_SECRET\"",
        ],
        &[("HOOK_SECRET", "s3cret-for-the-test")],
    );
    let id = upload_and_create(&s, &input(tmp.path(), 3));
    let (headers, body) = rx.recv_timeout(Duration::from_secs(60)).expect("webhook");
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        (v["id"].as_str(), v["status"].as_str()),
        (Some(id.as_str()), Some("completed"))
    );
    let want = format!(
        "sha256={}",
        tiergate_batch::sign(b"s3cret-for-the-test", &body)
    );
    assert_eq!(headers["x-tiergate-signature"], want);
}

#[test]
fn interactive_escalations_preempt_batch_llm_jobs() {
    let tmp = tempfile::tempdir().unwrap();
    // Every rerank takes 300 ms: a batch line holds the LLM long enough for interactive requests to arrive.
    let slow = [
        "--set",
        "reranker.extra_args=[\"--stub-delay-ms\", \"300\"]",
    ];
    let s = server(&tmp.path().join("data"), &slow, &[]);
    let n = 12;
    let id = upload_and_create(&s, &input(tmp.path(), n));
    std::thread::sleep(Duration::from_millis(400));
    for _ in 0..6 {
        let r = ureq::post(&format!("{}/v1/chat/completions", s.base))
            .send_json(
                json!({"model": "classify", "messages": [{"role": "user", "content": "hmm"}]}),
            )
            .unwrap();
        assert_eq!(r.header("x-tiergate-tier"), Some("llm"));
        assert!(r.header("x-tiergate-degraded").is_none());
        std::thread::sleep(Duration::from_millis(150));
    }
    let b = wait_status(&s, &id, "completed");
    assert_eq!(
        b["request_counts"],
        json!({"total": n, "completed": n, "failed": 0}),
        "{b}"
    );
    let metrics = ureq::get(&format!("{}/metrics", s.base))
        .call()
        .unwrap()
        .into_string()
        .unwrap();
    let preempted: f64 = metrics
        .lines()
        .find(|l| l.starts_with("tiergate_batch_preemptions_total"))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0.0);
    assert!(preempted >= 1.0, "no batch job yielded:\n{metrics}");
    // A preempted line ran again: still exactly one output line per input line.
    let out = output_file(&s, &b);
    let mut ids: Vec<String> = out
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["custom_id"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), n);
}

/// Batches and files belong to the tenant that created them: another key gets 404 for them, never sees them
/// in its lists (`GET /v1/batches`, `GET /v1/files`), and cannot start a batch on them; the lines run as their
/// owner (its routes: a line for a route it may not use fails with 403; its name in the metrics); quotas
/// (unfinished batches, stored bytes) are 429 `insufficient_quota`; the admin API lists batches per tenant.
#[test]
fn batches_and_files_belong_to_their_tenant() {
    let sha = common::key_sha256;
    let tenants = format!(
        "tenants=[{{ name = \"a\", key_sha256 = \"{}\", routes = [\"classify\"], max_active_batches = 1 }}, \
         {{ name = \"b\", key_sha256 = \"{}\", max_stored_bytes = 100 }}]",
        sha("key-a"),
        sha("key-b")
    );
    let tmp = tempfile::tempdir().unwrap();
    let s = server(
        &tmp.path().join("data"),
        &[
            "--set",
            &tenants,
            "--set",
            "reranker.extra_args=[\"--stub-delay-ms\", \"200\"]",
        ],
        &[],
    );
    let url = |p: &str| format!("{}{p}", s.base);
    let auth = |key: &str| format!("Bearer {key}");
    // Tenant a's input: three classify lines and one for `generate`, a route a may not use.
    let mut body = std::fs::read_to_string(input(tmp.path(), 3)).unwrap();
    body.push_str(
        &(json!({"custom_id": "gen", "method": "POST", "url": "/v1/chat/completions",
        "body": {"model": "generate", "messages": [{"role": "user", "content": "hello"}]}})
        .to_string()
            + "\n"),
    );
    let boundary = "tgboundary";
    let form = format!(
        "--{boundary}\r\ncontent-disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n--{boundary}\r\n\
         content-disposition: form-data; name=\"file\"; filename=\"in.jsonl\"\r\n\r\n{body}\r\n--{boundary}--\r\n"
    );
    // Without a key the Batch API is closed too.
    assert!(matches!(
        ureq::get(&url("/v1/batches")).call(),
        Err(ureq::Error::Status(401, _))
    ));
    let f: Value = ureq::post(&url("/v1/files"))
        .set("authorization", &auth("key-a"))
        .set(
            "content-type",
            &format!("multipart/form-data; boundary={boundary}"),
        )
        .send_string(&form)
        .unwrap()
        .into_json()
        .unwrap();
    let fid = f["id"].as_str().unwrap();
    let create = json!({"input_file_id": fid, "endpoint": "/v1/chat/completions", "completion_window": "24h"});
    let b: Value = ureq::post(&url("/v1/batches"))
        .set("authorization", &auth("key-a"))
        .send_json(create.clone())
        .unwrap()
        .into_json()
        .unwrap();
    let bid = b["id"].as_str().unwrap().to_string();
    // a's quota of one unfinished batch: a second one now is 429 insufficient_quota.
    match ureq::post(&url("/v1/batches"))
        .set("authorization", &auth("key-a"))
        .send_json(create.clone())
    {
        Err(ureq::Error::Status(429, r)) => {
            let v: Value = r.into_json().unwrap();
            assert_eq!(v["error"]["code"], "insufficient_quota", "{v}");
        }
        other => panic!("expected 429, got {other:?}"),
    }
    // b's quota of 100 stored bytes: the same upload is 429.
    match ureq::post(&url("/v1/files"))
        .set("authorization", &auth("key-b"))
        .set(
            "content-type",
            &format!("multipart/form-data; boundary={boundary}"),
        )
        .send_string(&form)
    {
        Err(ureq::Error::Status(429, _)) => {}
        other => panic!("expected 429, got {other:?}"),
    }
    // Tenant b: 404 for a's batch and file, empty lists, and a's file cannot start a batch.
    let status_b = |p: &str| -> u16 {
        match ureq::get(&url(p))
            .set("authorization", &auth("key-b"))
            .call()
        {
            Ok(r) => r.status(),
            Err(ureq::Error::Status(code, _)) => code,
            Err(e) => panic!("{p}: {e}"),
        }
    };
    let list: Value = ureq::get(&url("/v1/batches"))
        .set("authorization", &auth("key-b"))
        .call()
        .unwrap()
        .into_json()
        .unwrap();
    assert_eq!(list["data"].as_array().unwrap().len(), 0, "{list}");
    let files: Value = ureq::get(&url("/v1/files"))
        .set("authorization", &auth("key-b"))
        .call()
        .unwrap()
        .into_json()
        .unwrap();
    assert_eq!(files["data"].as_array().unwrap().len(), 0, "{files}");
    assert_eq!(status_b(&format!("/v1/files/{fid}")), 404);
    let r = ureq::post(&url("/v1/batches"))
        .set("authorization", &auth("key-b"))
        .send_json(create);
    assert!(matches!(r, Err(ureq::Error::Status(400, _))));
    assert!(matches!(
        ureq::post(&url(&format!("/v1/batches/{bid}/cancel")))
            .set("authorization", &auth("key-b"))
            .call(),
        Err(ureq::Error::Status(404, _))
    ));
    // Tenant a sees and finishes its batch; the output files are a's too.
    let as_a = |p: &str| -> Value {
        ureq::get(&url(p))
            .set("authorization", &auth("key-a"))
            .call()
            .unwrap()
            .into_json()
            .unwrap()
    };
    assert_eq!(as_a("/v1/batches")["data"][0]["id"], bid.as_str());
    let t = Instant::now();
    let done = loop {
        let b = as_a(&format!("/v1/batches/{bid}"));
        if b["status"] == "completed" {
            break b;
        }
        assert!(t.elapsed() < Duration::from_secs(120), "still {b}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(
        done["request_counts"],
        json!({"total": 4, "completed": 3, "failed": 1}),
        "{done}"
    );
    let err_id = done["error_file_id"].as_str().unwrap();
    let errors = ureq::get(&url(&format!("/v1/files/{err_id}/content")))
        .set("authorization", &auth("key-a"))
        .call()
        .unwrap()
        .into_string()
        .unwrap();
    let line: Value = serde_json::from_str(errors.lines().next().unwrap()).unwrap();
    assert_eq!(
        (
            line["custom_id"].as_str(),
            line["response"]["status_code"].as_u64()
        ),
        (Some("gen"), Some(403)),
        "{line}"
    );
    let out_id = done["output_file_id"].as_str().unwrap();
    assert_eq!(status_b(&format!("/v1/files/{out_id}/content")), 404);
    // a's files: its input and the batch's two outputs, newest first.
    let files = as_a("/v1/files?limit=2");
    assert_eq!(files["data"].as_array().unwrap().len(), 2, "{files}");
    assert_eq!(files["has_more"], true);
    let rest = as_a(&format!(
        "/v1/files?after={}",
        files["last_id"].as_str().unwrap()
    ));
    assert_eq!(rest["data"][0]["id"], fid, "{rest}");
    // The admin API, per tenant.
    let admin: Value = ureq::get(&format!("{}/admin/batches?tenant=a", s.admin))
        .call()
        .unwrap()
        .into_json()
        .unwrap();
    let a = admin["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["tenant"] == "a")
        .unwrap();
    assert_eq!(
        (a["files"].as_u64(), a["batches"]["completed"].as_u64()),
        (Some(3), Some(1)),
        "{admin}"
    );
    assert_eq!(admin["batches"][0]["id"], bid.as_str());
    let metrics = ureq::get(&url("/metrics"))
        .call()
        .unwrap()
        .into_string()
        .unwrap();
    assert!(
        metrics.contains("tenant=\"a\""),
        "the lines ran as their owner"
    );
}

/// The server's resident set, bytes.
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// The highest resident set of `pid` while `work` runs, sampled every 5 ms.
fn peak_rss_during<T>(pid: u32, work: impl FnOnce() -> T) -> (u64, T) {
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut peak = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                peak = peak.max(rss(pid));
                std::thread::sleep(Duration::from_millis(5));
            }
            peak.max(rss(pid))
        })
    };
    let out = work();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    (sampler.join().unwrap(), out)
}

/// The status line of a bare HTTP request `head` (no body sent after it), read within 5 s.
fn status_of_head_alone(base: &str, head: &str) -> String {
    let addr = base.trim_start_matches("http://");
    let mut c = std::net::TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    c.write_all(head.as_bytes()).unwrap();
    let mut line = String::new();
    BufReader::new(c).read_line(&mut line).unwrap();
    line
}

/// A multipart upload head declaring `len` bytes.
fn upload_head(len: u64) -> String {
    format!(
        "POST /v1/files HTTP/1.1\r\nhost: x\r\ncontent-type: multipart/form-data; boundary=tgb\r\n\
         content-length: {len}\r\n\r\n"
    )
}

#[test]
fn uploads_and_downloads_stream_and_declared_lengths_are_checked_before_reading() {
    const MIB: u64 = 1 << 20;
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let s = server(
        &data,
        &[
            "--set",
            "batch.max_total_bytes=157286400", // 150 MiB
            "--set",
            "server.body_timeout_ms=1000",
        ],
        &[],
    );
    let pid = s.child.id();
    // A 100 MiB JSONL file (batch.max_file_bytes), its last bytes empty lines.
    let path = tmp.path().join("big.jsonl");
    {
        let mut f = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
        let mut n = 0u64;
        for i in 0.. {
            let line = json!({"custom_id": format!("req-{i}"), "method": "POST", "url": "/v1/chat/completions",
                              "body": {"model": "classify", "messages": [{"role": "user", "content": "my card has not arrived"}]}})
                .to_string() + "\n";
            if n + line.len() as u64 > 100 * MIB {
                break;
            }
            f.write_all(line.as_bytes()).unwrap();
            n += line.len() as u64;
        }
        f.write_all(&vec![b'\n'; (100 * MIB - n) as usize]).unwrap();
    }
    let head =
        "--tgb\r\ncontent-disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n--tgb\r\n\
                content-disposition: form-data; name=\"file\"; filename=\"big.jsonl\"\r\n\r\n";
    let tail = "\r\n--tgb--\r\n";
    let len = (head.len() + tail.len()) as u64 + 100 * MIB;
    get(&s, "/v1/files");
    let before = rss(pid);
    let (peak, f) = peak_rss_during(pid, || {
        let body = std::io::Cursor::new(head)
            .chain(std::fs::File::open(&path).unwrap())
            .chain(std::io::Cursor::new(tail));
        ureq::post(&format!("{}/v1/files", s.base))
            .set("content-type", "multipart/form-data; boundary=tgb")
            .set("content-length", &len.to_string())
            .send(body)
            .unwrap()
            .into_json::<Value>()
            .unwrap()
    });
    assert_eq!(f["bytes"], 100 * MIB, "{f}");
    let rise = peak.saturating_sub(before);
    eprintln!(
        "a 100 MiB upload: RSS {before} -> peak {peak} (+{:.1} MiB)",
        rise as f64 / MIB as f64
    );
    assert!(
        rise < 20 * MIB,
        "the server's RSS rose by {rise} bytes during a 100 MiB upload"
    );
    // The download streams too, and returns the same bytes.
    let id = f["id"].as_str().unwrap();
    let before = rss(pid);
    let (peak, (n, sum)) = peak_rss_during(pid, || {
        let r = ureq::get(&format!("{}/v1/files/{id}/content", s.base))
            .call()
            .unwrap();
        assert_eq!(
            r.header("content-length"),
            Some((100 * MIB).to_string().as_str())
        );
        let (mut n, mut sum, mut buf) = (0u64, 0u64, vec![0u8; 1 << 16]);
        let mut rd = r.into_reader();
        loop {
            let k = rd.read(&mut buf).unwrap();
            if k == 0 {
                break (n, sum);
            }
            n += k as u64;
            sum = buf[..k]
                .iter()
                .fold(sum, |a, b| a.wrapping_mul(31).wrapping_add(u64::from(*b)));
        }
    });
    let want = std::fs::read(&path)
        .unwrap()
        .iter()
        .fold(0u64, |a, b| a.wrapping_mul(31).wrapping_add(u64::from(*b)));
    assert_eq!(
        (n, sum),
        (100 * MIB, want),
        "the download differs from the upload"
    );
    let rise = peak.saturating_sub(before);
    eprintln!(
        "a 100 MiB download: RSS {before} -> peak {peak} (+{:.1} MiB)",
        rise as f64 / MIB as f64
    );
    assert!(
        rise < 20 * MIB,
        "the server's RSS rose by {rise} bytes during a 100 MiB download"
    );
    // A 2 GiB declared length is refused before a byte of it is sent.
    let line = status_of_head_alone(&s.base, &upload_head(2 << 30));
    assert!(line.starts_with("HTTP/1.1 413"), "{line}");
    // 60 MiB more would pass the store's 150 MiB: refused from the declared length, again before any byte.
    let line = status_of_head_alone(&s.base, &upload_head(60 * MIB));
    assert!(line.starts_with("HTTP/1.1 503"), "{line}");
    // A body that stops arriving meets the deadline (1 s for its one max_body_bytes share).
    let t = Instant::now();
    let line = status_of_head_alone(&s.base, &upload_head(1000));
    assert!(line.starts_with("HTTP/1.1 408"), "{line}");
    assert!(t.elapsed() < Duration::from_secs(4), "{:?}", t.elapsed());
    // Nothing half written is left behind.
    let parts: Vec<_> = std::fs::read_dir(data.join("files"))
        .unwrap()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "part"))
        .collect();
    assert!(parts.is_empty(), "{parts:?}");
    assert_eq!(get(&s, "/v1/files")["data"].as_array().unwrap().len(), 1);
}

#[test]
fn a_tenants_files_are_bounded_by_count() {
    let tmp = tempfile::tempdir().unwrap();
    let s = server(
        &tmp.path().join("data"),
        &["--set", "batch.max_files_per_tenant=1"],
        &[],
    );
    let path = input(tmp.path(), 2);
    let upload = || {
        let body = std::fs::read(&path).unwrap();
        let mut form =
            b"--tgb\r\ncontent-disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n--tgb\r\n\
            content-disposition: form-data; name=\"file\"; filename=\"in.jsonl\"\r\n\r\n"
                .to_vec();
        form.extend(body);
        form.extend(b"\r\n--tgb--\r\n");
        let sent = ureq::post(&format!("{}/v1/files", s.base))
            .set("content-type", "multipart/form-data; boundary=tgb")
            .send_bytes(&form);
        let r = match sent {
            Ok(r) => r,
            Err(ureq::Error::Status(_, r)) => r,
            Err(e) => panic!("{e}"),
        };
        (r.status(), r.into_json::<Value>().unwrap())
    };
    assert_eq!(upload().0, 200);
    let (status, body) = upload();
    assert_eq!(
        status, 429,
        "a second file past batch.max_files_per_tenant = 1: {body}"
    );
    assert_eq!(body["error"]["code"], "insufficient_quota", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("max_files_per_tenant"), "{message}");
}
