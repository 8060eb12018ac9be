//! The batch runner: one background task that takes open batches oldest first, validates the input, has the
//! engine answer each line (the chat door's validation and body, the engine's admission, tenant budget and
//! decision records, as for any request — marked as batch work so its LLM jobs wait for the interactive
//! channel to be idle), commits each line's result as it finishes, then writes the output and error files.
//! A stopped or killed server resumes at the lines without a result.

use std::time::Duration;

use futures_util::StreamExt;
use serde_json::{json, Value};
use tokio::sync::watch;

use std::sync::Arc;

use tiergate_engine::batch::{Door, LineRequest};
use tiergate_engine::model::request::BatchLine;
use tiergate_engine::Gate;
use tiergate_engine::{Engine, WeakEngine};

use super::store::new_id;
use super::Batches;

/// One validated input line.
#[derive(Debug)]
struct Line {
    no: usize,
    custom_id: String,
    body: Value,
}

/// How often files and batches past `batch.retention_s` are deleted.
const SWEEP_EVERY: Duration = Duration::from_secs(3600);

/// Runs batches until `stop` turns true or the server is gone.
pub async fn run(
    engine: WeakEngine,
    b: Arc<Batches>,
    door: Arc<dyn Door>,
    mut stop: watch::Receiver<bool>,
) {
    let mut swept: Option<std::time::Instant> = None;
    loop {
        if engine.upgrade().is_none() {
            return;
        }
        if swept.is_none_or(|t| t.elapsed() >= SWEEP_EVERY) {
            match b.store.sweep(b.cfg.retention_s) {
                Ok((0, 0)) => {}
                Ok((batches, files)) => {
                    tracing::info!(
                        batches,
                        files,
                        "batches and files past batch.retention_s deleted"
                    )
                }
                Err(e) => tracing::warn!(error = %e, "batch retention sweep failed"),
            }
            swept = Some(std::time::Instant::now());
        }
        let next = b
            .store
            .open_batches()
            .ok()
            .and_then(|v| v.into_iter().next());
        match next {
            Some(id) => {
                if let Err(e) = run_batch(&engine, &b, door.as_ref(), &id, &mut stop).await {
                    tracing::error!(batch = %id, error = %e, "batch runner error; retrying in 1 s");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
            None => {
                tokio::select! {
                    _ = b.wake.notified() => {}
                    _ = tokio::time::sleep(Duration::from_secs(5)) => {}
                    _ = stop.changed() => {}
                }
            }
        }
        if *stop.borrow() {
            return;
        }
    }
}

/// Takes one batch as far as it goes (to its end, or until `stop`).
async fn run_batch(
    weak: &WeakEngine,
    b: &Arc<Batches>,
    door: &dyn Door,
    id: &str,
    stop: &mut watch::Receiver<bool>,
) -> anyhow::Result<()> {
    let state = weak
        .upgrade()
        .ok_or_else(|| anyhow::anyhow!("server gone"))?;
    let store = &b.store;
    let row = store
        .batch(id)?
        .ok_or_else(|| anyhow::anyhow!("no batch {id}"))?;
    let input = store.file_path(&row.input_file_id);
    let total = match check_input(&input, &row.endpoint, b.cfg.max_lines) {
        Ok(total) => total,
        Err(errors) => {
            tracing::warn!(batch = %id, "batch input refused");
            store.fail(id, &errors)?;
            super::notify_webhook(b, store.batch(id)?);
            return Ok(());
        }
    };
    store.set_total(id, total)?;
    // Not `set_status`: a cancel between reading the row and here would be overwritten (and the batch run).
    store.begin_running(id)?;
    if store.status(id)?.as_deref() == Some("cancelling") {
        return finish(b, id);
    }
    let done = store.done_lines(id)?;
    // Without an LLM side no line holds an LLM turn, so none is ever preempted.
    let gate = state.batch_gate();
    // Its lines run as its owner: that tenant's routes, its name in the metrics.
    let owner = tiergate_engine::model::request::TenantId(std::sync::Arc::from(row.owner.as_str()));
    let todo = read_lines(&input)?.filter(|l| !done.contains(&l.no));
    let mut results = futures_util::stream::iter(todo)
        .map(|l| {
            let state = state.clone();
            let mut stop = stop.clone();
            let (gate, owner) = (gate.clone(), owner.clone());
            async move {
                tokio::select! {
                    r = run_line(&state, door, &owner, gate.as_deref(), id, &l) => Some((l.no, r)),
                    _ = stop.wait_for(|s| *s) => None,
                }
            }
        })
        .buffer_unordered(b.cfg.concurrency);
    while let Some(r) = results.next().await {
        let Some((no, (ok, out))) = r else { break };
        store.put_result(id, no, ok, &out)?;
        if store.status(id)?.as_deref() == Some("cancelling") || *stop.borrow() {
            break;
        }
    }
    drop(results);
    drop(state);
    if *stop.borrow() {
        return Ok(()); // resumed at the next start
    }
    finish(b, id)
}

/// Writes the files and closes the batch (`completed`, or `cancelled` when it was asked to stop).
fn finish(b: &Batches, id: &str) -> anyhow::Result<()> {
    let store = &b.store;
    // One statement decides between a cancel and the end of the lines (checking first and writing after left
    // a window in which an acknowledged cancel was overwritten by `finalizing`).
    let cancelling =
        !store.begin_finalizing(id)? && store.batch(id)?.is_some_and(|r| r.status == "cancelling");
    store.finish_files(id)?;
    store.set_status(id, if cancelling { "cancelled" } else { "completed" })?;
    let row = store.batch(id)?;
    if let Some(r) = &row {
        tracing::info!(batch = %id, status = %r.status, total = r.total, completed = r.completed,
            failed = r.failed, "batch finished");
    }
    super::notify_webhook(b, row);
    Ok(())
}

/// The input's non-empty lines with their numbers (0-based), read as they are needed.
fn input_lines(
    path: &std::path::Path,
) -> std::io::Result<impl Iterator<Item = (usize, std::io::Result<String>)>> {
    use std::io::BufRead;
    let file = std::io::BufReader::new(std::fs::File::open(path)?);
    Ok(file
        .lines()
        .enumerate()
        .filter(|(_, t)| t.as_ref().map_or(true, |t| !t.trim().is_empty())))
}

/// The lines of a checked input, read from disk one at a time as the runner takes them (numbered among the
/// requests: a checked input has no other lines).
fn read_lines(path: &std::path::Path) -> anyhow::Result<impl Iterator<Item = Line>> {
    Ok(input_lines(path)?
        .map_while(|(_, t)| t.ok())
        .filter_map(|t| serde_json::from_str::<Value>(&t).ok())
        .enumerate()
        .map(|(no, mut v)| Line {
            no,
            custom_id: v["custom_id"].as_str().unwrap_or_default().to_string(),
            body: v["body"].take(),
        }))
}

/// Checks the input file as it reads it: every line a JSON request for `endpoint` with a unique `custom_id`.
/// Its requests' count, or the OpenAI `errors.data` list (at most 20 entries).
fn check_input(path: &std::path::Path, endpoint: &str, max_lines: usize) -> Result<usize, Value> {
    let err = |line: Option<usize>, code: &str, message: String| json!({"code": code, "message": message, "param": null, "line": line.map(|l| l + 1)});
    let unreadable = |e: std::io::Error| {
        json!([err(
            None,
            "invalid_file",
            format!("cannot read the input: {e}")
        )])
    };
    let mut errors = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let mut requests = 0;
    for (no, text) in input_lines(path).map_err(unreadable)? {
        let v: Value = match serde_json::from_str(&text.map_err(unreadable)?) {
            Ok(v) => v,
            Err(e) => {
                errors.push(err(Some(no), "invalid_json", e.to_string()));
                continue;
            }
        };
        match line_error(&v, endpoint, &mut seen) {
            Some((code, message)) => errors.push(err(Some(no), code, message)),
            None => requests += 1,
        }
    }
    if requests + errors.len() > max_lines {
        let message = format!("more than batch.max_lines = {max_lines} requests");
        errors.insert(0, err(None, "too_many_lines", message));
    }
    if requests == 0 && errors.is_empty() {
        errors.push(err(None, "empty_file", "the input holds no request".into()));
    }
    if errors.is_empty() {
        Ok(requests)
    } else {
        errors.truncate(20);
        Err(Value::Array(errors))
    }
}

/// What is wrong with one parsed input line, if anything: its error code and message. `seen` holds the
/// `custom_id`s before it.
fn line_error(
    v: &Value,
    endpoint: &str,
    seen: &mut std::collections::HashSet<String>,
) -> Option<(&'static str, String)> {
    let custom_id = v["custom_id"].as_str().unwrap_or_default();
    if custom_id.is_empty() || !seen.insert(custom_id.to_string()) {
        let message = "`custom_id` must be a non-empty string, unique in the file";
        Some(("invalid_custom_id", message.into()))
    } else if v["method"] != "POST" || v["url"] != endpoint {
        let message = format!("each line must be `\"method\": \"POST\", \"url\": \"{endpoint}\"`");
        Some(("invalid_url", message))
    } else if !v["body"].is_object() {
        Some(("invalid_body", "`body` must be a JSON object".into()))
    } else {
        None
    }
}

/// Preemptions after which a line's LLM job no longer yields.
const MAX_PREEMPTIONS: u32 = 3;

/// Has the engine answer one line; runs it again when the server sheds load (429) or when an interactive
/// escalation preempted its LLM job (at most [`MAX_PREEMPTIONS`] times). Returns whether it succeeded and
/// its output line.
async fn run_line(
    state: &Engine,
    door: &dyn Door,
    owner: &tiergate_engine::model::request::TenantId,
    gate: Option<&Gate>,
    batch: &str,
    l: &Line,
) -> (bool, Value) {
    let mut body = l.body.clone();
    if let Some(o) = body.as_object_mut() {
        o.insert("stream".into(), json!(false));
    }
    let request_id = format!("{batch}-{}", l.no);
    let mut backoff = Duration::from_millis(100);
    let mut preempted = 0;
    loop {
        let line = BatchLine::new(preempted < MAX_PREEMPTIONS).with_alias(batch, &l.custom_id);
        // The batch's owner, in process: no client sets it, so it cannot be forged. No headers: a line's
        // budget is its route's default.
        let req = LineRequest {
            body: body.clone(),
            tenant: owner.clone(),
            line: line.clone(),
        };
        let answer = door.answer(state, req);
        tokio::pin!(answer);
        let done = match gate {
            None => Some(answer.await),
            Some(gate) => loop {
                let yield_now = gate.preempted();
                tokio::select! {
                    r = &mut answer => break Some(r),
                    _ = yield_now => if line.preemptible_now() { break None },
                }
            },
        };
        // Preempted: dropping the answer cancels its LLM job; the line runs again at its next turn.
        let Some(done) = done else {
            preempted += 1;
            metrics::counter!(tiergate_engine::metrics::BATCH_PREEMPTIONS_TOTAL).increment(1);
            continue;
        };
        if done.status == 429 {
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(2));
            continue;
        }
        // tiergate's own headers (tier, degraded, confidence, threshold) ride along: a batch has no headers.
        let out = json!({
            "id": new_id("batch_req_"),
            "custom_id": l.custom_id,
            "response": {"status_code": done.status, "request_id": request_id, "body": done.body,
                         "headers": done.headers},
            "error": null,
        });
        return ((200..300).contains(&done.status), out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;

    #[test]
    fn inputs_are_checked_line_by_line() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        let ok = "{\"custom_id\":\"a\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{\"model\":\"m\"}}\n\n{\"custom_id\":\"b\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{}}\n";
        let f = s
            .put_file("default", "in.jsonl", "batch", ok.as_bytes())
            .unwrap();
        let path = s.file_path(&f.id);
        assert_eq!(check_input(&path, "/v1/chat/completions", 10), Ok(2));
        let lines: Vec<Line> = read_lines(&path).unwrap().collect();
        assert_eq!(lines.len(), 2);
        assert_eq!((lines[1].no, lines[1].custom_id.as_str()), (1, "b"));
        assert_eq!(lines[0].body, json!({"model": "m"}));
        assert!(check_input(&path, "/v1/chat/completions", 1).is_err());
        let bad = "{\"custom_id\":\"a\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{}}\n{\"custom_id\":\"a\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{}}\nnot json\n{\"custom_id\":\"c\",\"method\":\"GET\",\"url\":\"/v1/models\",\"body\":{}}\n";
        let f = s
            .put_file("default", "bad.jsonl", "batch", bad.as_bytes())
            .unwrap();
        let errors = check_input(&s.file_path(&f.id), "/v1/chat/completions", 10).unwrap_err();
        let codes: Vec<&str> = errors
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["code"].as_str().unwrap())
            .collect();
        assert_eq!(codes, ["invalid_custom_id", "invalid_json", "invalid_url"]);
        assert_eq!(errors[1]["line"], 3);
        let f = s
            .put_file("default", "empty.jsonl", "batch", b"\n")
            .unwrap();
        assert!(check_input(&s.file_path(&f.id), "/v1/chat/completions", 10).is_err());
    }
}
