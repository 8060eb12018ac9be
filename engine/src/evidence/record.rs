//! `server.record_escalations`: what traffic teaches Tier-0, one JSON line per record, for `tiergate distill`:
//! every rerank the LLM answered (`"source": "llm"`: the query text, Tier-0's candidates and distribution, the
//! LLM's and the fused distribution), every audit an operator labels (`"audit"`: the text, the true label, the
//! probability it was drawn with) and every trusted tenant's feedback that names the true label of an answer
//! whose text was kept (`"feedback"`, with `server.record_text`). Opt-in (the
//! text of users' requests lands on disk only when a path is set), size-capped with one rotation: past
//! `server.record_max_bytes` the file moves to `FILE.1` (replacing the previous one) and a new one starts.
//! A failed write is logged and never fails the request.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde_json::Value;

/// The record file.
pub(crate) struct Recorder {
    path: PathBuf,
    max_bytes: u64,
    file: Mutex<(File, u64)>,
}

fn open(path: &Path) -> std::io::Result<(File, u64)> {
    let f = OpenOptions::new().create(true).append(true).open(path)?;
    let len = f.metadata()?.len();
    Ok((f, len))
}

impl Recorder {
    /// Opens (appending) `path`, creating its folder.
    pub(crate) fn open(path: &Path, max_bytes: u64) -> std::io::Result<Self> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)?;
        }
        Ok(Self {
            path: path.to_path_buf(),
            max_bytes,
            file: Mutex::new(open(path)?),
        })
    }

    /// Appends one record (one `write` of the whole line, so lines never interleave).
    pub(crate) fn write(&self, record: &Value) {
        let mut line = record.to_string();
        line.push('\n');
        let Ok(mut g) = self.file.lock() else { return };
        if g.1 > 0 && g.1 + line.len() as u64 > self.max_bytes {
            let rotated = self.path.with_extension(match self.path.extension() {
                Some(e) => format!("{}.1", e.to_string_lossy()),
                None => "1".into(),
            });
            match std::fs::rename(&self.path, &rotated).and_then(|_| open(&self.path)) {
                Ok(fresh) => *g = fresh,
                Err(e) => tracing::warn!(error = %e, "cannot rotate the escalation records"),
            }
        }
        match g.0.write_all(line.as_bytes()) {
            Ok(()) => g.1 += line.len() as u64,
            Err(e) => tracing::warn!(error = %e, "cannot write an escalation record"),
        }
    }
}

impl Recorder {
    /// Appends a label Tier-0 answered alone and sure, at `ambiguity` (a pseudo-label).
    pub(crate) fn write_tier0(&self, route: &str, text: &str, label: &str, ambiguity: f64) {
        self.write(&serde_json::json!({
            "source": "tier0",
            "ts": crate::evidence::ledger::now_ms() / 1000,
            "route": route,
            "text": text,
            "label": label,
            "ambiguity": ambiguity,
        }));
    }
}

/// A gold record: the true `label` of an answer, from an operator's audit (`probability`: the rate it was
/// drawn at) or a trusted tenant's feedback.
pub(crate) struct Gold<'a> {
    pub source: &'a str,
    pub route: &'a str,
    pub text: &'a str,
    pub label: &'a str,
    pub answered: Option<&'a str>,
    pub ambiguity: Option<f64>,
    pub probability: Option<f64>,
}

impl Recorder {
    /// Appends a gold record.
    pub(crate) fn write_gold(&self, g: &Gold<'_>) {
        self.write(&serde_json::json!({
            "source": g.source,
            "ts": crate::evidence::ledger::now_ms() / 1000,
            "route": g.route,
            "text": g.text,
            "label": g.label,
            "answered": g.answered,
            "ambiguity": g.ambiguity,
            "probability": g.probability,
        }));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn records_rotate_at_the_cap_and_keep_whole_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rec/escalations.jsonl");
        let r = Recorder::open(&path, 200).unwrap();
        for i in 0..10 {
            r.write(&json!({"i": i, "text": "x".repeat(30)}));
        }
        let cur = std::fs::read_to_string(&path).unwrap();
        let old = std::fs::read_to_string(dir.path().join("rec/escalations.jsonl.1")).unwrap();
        assert!(cur.len() <= 200 && old.len() <= 200);
        let lines: Vec<Value> = old
            .lines()
            .chain(cur.lines())
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        // One rotation kept: the newest records, whole and in order.
        let ids: Vec<i64> = lines.iter().map(|v| v["i"].as_i64().unwrap()).collect();
        assert!(ids.windows(2).all(|w| w[1] == w[0] + 1), "{ids:?}");
        assert_eq!(*ids.last().unwrap(), 9);
        // Reopening appends.
        drop(r);
        let r = Recorder::open(&path, 10_000).unwrap();
        r.write(&json!({"i": 10}));
        assert!(std::fs::read_to_string(&path)
            .unwrap()
            .ends_with("{\"i\":10}\n"));
    }
}
