//! The ledger: the decision behind every answer, kept for `[feedback] window_s` so that a client's feedback
//! (`POST /v1/feedback`) and an operator's audit labels (`/admin/audits`) can be joined to it, and what they
//! say about Tier-0's silent error. Records are written off the response path: the handler hands a record to
//! a bounded channel ([`Ledger::record`], never blocking; a full channel drops and counts it) and one
//! background thread writes them in batches to the store — a local SQLite file (the `tiergate-feedback`
//! store the `tiergate` binary hands over), or Redis with a TTL when the policy store is Redis ([`redis`]), so
//! feedback reaching any replica joins; a server built without either keeps them in memory ([`memory`]).

pub(crate) mod memory;
pub(crate) mod redis;
pub(crate) mod summary;

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// A decision record: what the server decided and answered, without the request's text unless
/// `server.record_text` is on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// The completion id the client got (`chatcmpl-…`).
    pub id: String,
    /// `batch_id/custom_id` for a batch line (feedback may name the line instead of the id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub alias: Option<String>,
    /// Unix time, milliseconds.
    pub at_ms: u64,
    /// The tenant that asked.
    pub tenant: String,
    /// The route (`model`).
    pub route: String,
    /// `tier0`, `escalated`, `degraded` or `out_of_scope`.
    pub channel: String,
    /// The tier whose answer the client got.
    pub tier: String,
    /// Why an escalation fell back, when one did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub degraded: Option<String>,
    /// The cascade stage (backend) that answered, when an LLM did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stage: Option<String>,
    /// The label answered (classified routes; none for a written answer or a generation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// Tier-0's ambiguity 1 − max p.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ambiguity: Option<f64>,
    /// Tier-0's top candidates, most likely first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub top: Vec<(String, f32)>,
    /// θ_eff the decision used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub theta: Option<f64>,
    /// The routing policy's version.
    pub policy_version: u64,
    /// The head's version (a fingerprint of its labels and temperature).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub head: String,
    /// The request's text (`server.record_text`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// θ was forced by an operator (`x-tiergate-threshold`): the answer says nothing about the traffic, so it
    /// is never drawn for audit and its feedback is no evidence (counted in the `forced` channel).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub forced: bool,
    /// What the turn did to its session's pin (`new`, `kept`, `up`, `down`, `switched`), when it had a session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// The price of a move between stages the turn was steered to, and whether it moved.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub switch: Option<crate::model::outcome::SwitchPrice>,
}

/// The feedback channel of answers decided under a forced θ.
pub(crate) const FORCED: &str = "forced";

impl Record {
    /// Tier-0 gave this answer alone (not escalated, or escalated and degraded back to Tier-0).
    pub(crate) fn tier0_alone(&self) -> bool {
        self.tier == "tier0" && self.label.is_some()
    }

    /// Tier-0's lone answer under the policy's own θ: what audits and trusted feedback are evidence about.
    pub fn is_evidence(&self) -> bool {
        self.tier0_alone() && !self.forced
    }

    /// The channel its feedback is counted in: its own, or `forced`.
    pub fn feedback_channel(&self) -> &str {
        if self.forced {
            FORCED
        } else {
            &self.channel
        }
    }
}

/// Feedback on one answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Feedback {
    /// The true label, when the client gave one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    /// Whether the answer was right (given, or from `label` against the answered label).
    pub correct: bool,
    /// The tenant's feedback is trusted (`feedback = "trusted"`).
    pub trusted: bool,
    /// Unix time, milliseconds.
    pub at_ms: u64,
}

/// An answer drawn for audit, with its text, until it is labelled.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditItem {
    /// The completion id.
    pub id: String,
    pub route: String,
    /// Unix time, milliseconds.
    pub at_ms: u64,
    /// The probability it was drawn with (`routing.audit_rate` then).
    pub probability: f64,
    /// θ_eff when it was drawn: only answers with ambiguity ≤ it could be drawn.
    #[serde(default)]
    pub theta: f64,
    /// Tier-0's ambiguity.
    pub ambiguity: f64,
    /// The label Tier-0 answered.
    pub answered: String,
    /// `tier0` or `degraded`.
    pub channel: String,
    /// The request's text (dropped once labelled).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// The version of the head that answered (empty in items from before it was recorded): evidence about
    /// that head only.
    #[serde(default)]
    pub head: String,
    /// The true label, once labelled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
}

/// Route → the version of its head in force.
pub type Heads = std::collections::HashMap<String, String>;

impl AuditItem {
    /// Whether it is about the head `heads` names for its route (every item when `heads` is `None`).
    pub fn of_heads(&self, heads: Option<&Heads>) -> bool {
        heads.is_none_or(|h| h.get(&self.route) == Some(&self.head))
    }
}

/// What the background writer stores.
#[derive(Debug, Clone)]
pub enum Entry {
    Decision(Box<Record>),
    Audit(Box<AuditItem>),
}

/// A first write, or the one that was there.
#[derive(Debug, Clone, PartialEq)]
pub enum First<T> {
    /// Written now.
    Written(T),
    /// Already given: the first stands.
    Already(T),
    /// Nothing to write to: the record expired or was swept after it was read.
    Gone,
}

/// Per route, what feedback and audits say (see [`summary`]).
pub use summary::{RouteSummary, Summary};

/// A store failure (logged; the request path never sees one).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct StoreError(pub String);

impl From<::redis::RedisError> for StoreError {
    fn from(e: ::redis::RedisError) -> Self {
        Self(format!("redis: {e}"))
    }
}

impl From<serde_json::Error> for StoreError {
    fn from(e: serde_json::Error) -> Self {
        Self(format!("json: {e}"))
    }
}

/// Where records, feedback and audits live. Synchronous: the writer thread and `spawn_blocking` call it.
pub trait Store: Send + Sync {
    /// Writes a batch of records and audit items.
    fn put(&self, entries: &[Entry], now_ms: u64) -> Result<(), StoreError>;
    /// The record of completion `id` (or of the batch line `batch_id/custom_id`), unless expired.
    fn decision(&self, id: &str, now_ms: u64) -> Result<Option<Record>, StoreError>;
    /// The record of `id` when `tenant` owns it: another tenant's is as absent as an unknown one, and a store
    /// that can should make the two cost the same (filter before reading the record).
    fn decision_of(
        &self,
        id: &str,
        tenant: &str,
        now_ms: u64,
    ) -> Result<Option<Record>, StoreError> {
        Ok(self.decision(id, now_ms)?.filter(|r| &*r.tenant == tenant))
    }
    /// Feedback on `id`'s record; the first stands.
    fn feedback(&self, id: &str, fb: &Feedback) -> Result<First<Feedback>, StoreError>;
    /// Audit items waiting for a label, oldest first; with `heads` (route → head version) only those of
    /// each route's head (the one in force: an item about another head is no evidence about it).
    fn pending(
        &self,
        route: Option<&str>,
        heads: Option<&Heads>,
        limit: usize,
    ) -> Result<Vec<AuditItem>, StoreError>;
    /// One audit item, pending or labelled.
    fn audit(&self, id: &str) -> Result<Option<AuditItem>, StoreError>;
    /// Labels an audit item (its text dropped); the first label stands.
    fn label(&self, id: &str, label: &str) -> Result<First<String>, StoreError>;
    /// Per route counts of audits and feedback.
    fn summary(&self, now_ms: u64) -> Result<Summary, StoreError>;
    /// Route `route`'s labelled audits of head `head`'s lone Tier-0 answers (not the degraded ones) drawn
    /// since `since_ms`: the live evidence of the error bound.
    fn labelled(
        &self,
        route: &str,
        head: &str,
        since_ms: u64,
    ) -> Result<Vec<tiergate_core::risk::Audited>, StoreError>;
    /// Route `route`'s trusted feedback on answers head `head` gave alone under the policy's θ since
    /// `since_ms`, as rows (the answer's ambiguity, wrong, the θ it was decided with).
    fn trusted_feedback(
        &self,
        route: &str,
        head: &str,
        since_ms: u64,
    ) -> Result<Vec<tiergate_core::risk::Audited>, StoreError>;
}

/// The handle: the store and the writer's channel.
pub struct Ledger {
    tx: flume::Sender<Entry>,
    store: Arc<dyn Store>,
    window_ms: u64,
    /// The last summary the writer computed (every few seconds), for `/metrics` and the console.
    summary: Arc<std::sync::Mutex<Summary>>,
    /// Entries handed to the writer, and those it has finished with (stored, or failed and counted).
    sent: std::sync::atomic::AtomicU64,
    done: Arc<std::sync::atomic::AtomicU64>,
    /// The store's dependency, when it is remote (Redis).
    dependency: Option<Arc<crate::deps::Dependency>>,
    /// Records the writer holds because the store failed, to write once it answers.
    spooled: Arc<std::sync::atomic::AtomicUsize>,
}

/// Unix time, milliseconds.
pub fn now_ms() -> u64 {
    crate::model::request::unix_ms()
}

impl Ledger {
    /// Starts the writer thread over `store`, with `queue` entries waiting at most.
    pub fn start(store: Arc<dyn Store>, queue: usize, window_s: u64) -> Arc<Self> {
        Self::start_with(store, queue, window_s, None)
    }

    /// [`Self::start`] for a store behind `dependency`: while it fails, the writer spools up to ten times
    /// `queue` records and writes them once it answers (older ones first; past that bound new ones are
    /// dropped and counted).
    pub(crate) fn start_with(
        store: Arc<dyn Store>,
        queue: usize,
        window_s: u64,
        dependency: Option<Arc<crate::deps::Dependency>>,
    ) -> Arc<Self> {
        let (tx, rx) = flume::bounded::<Entry>(queue);
        let spooled = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let spool = Spool::new(queue.saturating_mul(10), spooled.clone());
        let writer = store.clone();
        let summary = Arc::new(std::sync::Mutex::new(Summary::default()));
        let shown = summary.clone();
        let done = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let flag = done.clone();
        let spawned = std::thread::Builder::new()
            .name("tiergate-ledger".into())
            .spawn(move || write_loop(&rx, &*writer, &shown, &flag, spool));
        if let Err(e) = spawned {
            tracing::error!(error = %e, "cannot start the ledger writer: no decision is recorded");
        }
        Arc::new(Self {
            tx,
            store,
            window_ms: window_s.saturating_mul(1000),
            summary,
            sent: std::sync::atomic::AtomicU64::new(0),
            done,
            dependency,
            spooled,
        })
    }

    /// The store's dependency, when it is remote.
    pub(crate) fn dependency(&self) -> Option<&Arc<crate::deps::Dependency>> {
        self.dependency.as_ref()
    }

    /// Records held until the store answers again.
    pub(crate) fn spooled(&self) -> usize {
        self.spooled.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Waits (up to `max`) until every record handed over so far is stored: at shutdown, so that answers
    /// given just before it can still take feedback after a restart.
    pub(crate) fn drain(&self, max: Duration) {
        let until = std::time::Instant::now() + max;
        use std::sync::atomic::Ordering::Acquire;
        while self.done.load(Acquire) < self.sent.load(Acquire) && std::time::Instant::now() < until
        {
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Waits (up to `max`, without blocking the runtime) until the records handed over before the call are
    /// stored or spooled: a lookup after it sees every answer this replica gave before it, or knows (by
    /// [`Self::spooled`]) that some wait for the store. Whether they were, in time.
    pub(crate) async fn written(&self, max: Duration) -> bool {
        use std::sync::atomic::Ordering::Acquire;
        let target = self.sent.load(Acquire);
        let until = tokio::time::Instant::now() + max;
        loop {
            let handled = self.done.load(Acquire) + self.spooled() as u64;
            if handled >= target {
                return true;
            }
            if tokio::time::Instant::now() >= until {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    /// The summary as of the writer's last refresh (at most a few seconds old).
    pub(crate) fn summary(&self) -> Summary {
        self.summary.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Hands `entry` to the writer without waiting; a full queue drops it (counted).
    pub fn record(&self, entry: Entry) {
        match self.tx.try_send(entry) {
            Ok(()) => {
                self.sent.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
            }
            Err(_) => metrics::counter!(crate::metrics::LEDGER_DROPPED_TOTAL).increment(1),
        }
    }

    /// The store (call it off the async runtime).
    pub fn store(&self) -> Arc<dyn Store> {
        self.store.clone()
    }

    /// How long a record stays joinable, milliseconds.
    pub(crate) fn window_ms(&self) -> u64 {
        self.window_ms
    }

    /// Records waiting for the writer.
    pub(crate) fn waiting(&self) -> usize {
        self.tx.len()
    }
}

/// How often the writer refreshes the summary (an aggregate over the whole window: not on every batch; a
/// Prometheus scrape interval is 15 s; `/admin/feedback` reads the store itself).
const SUMMARY_EVERY: Duration = Duration::from_secs(10);

/// How long the writer gathers entries after the first before it writes them.
pub(crate) const GATHER: Duration = Duration::from_millis(20);

/// Records the store did not take, held in order until it does: at most `max`.
struct Spool {
    held: std::collections::VecDeque<Entry>,
    max: usize,
    shown: Arc<std::sync::atomic::AtomicUsize>,
}

impl Spool {
    fn new(max: usize, shown: Arc<std::sync::atomic::AtomicUsize>) -> Self {
        Self {
            held: std::collections::VecDeque::new(),
            max,
            shown,
        }
    }

    /// Holds `batch` after what is held; returns how many of it did not fit (dropped).
    fn hold(&mut self, batch: Vec<Entry>) -> usize {
        let room = self.max.saturating_sub(self.held.len());
        let dropped = batch.len().saturating_sub(room);
        self.held.extend(batch.into_iter().take(room));
        self.show();
        dropped
    }

    /// Writes what is held, oldest first, 512 at a time, until the store fails; returns how many were written.
    fn flush(&mut self, store: &dyn Store) -> usize {
        let mut written = 0;
        while !self.held.is_empty() {
            let n = self.held.len().min(512);
            let chunk: Vec<Entry> = self.held.iter().take(n).cloned().collect();
            if store.put(&chunk, now_ms()).is_err() {
                break;
            }
            self.held.drain(..n);
            written += n;
        }
        self.show();
        written
    }

    fn show(&self) {
        self.shown
            .store(self.held.len(), std::sync::atomic::Ordering::Release);
        metrics::gauge!(crate::metrics::LEDGER_SPOOLED).set(self.held.len() as f64);
    }
}

/// Takes what is waiting (up to 512 entries, or what came within [`GATHER`] of the first) and writes it at once
/// — after what the spool holds, which goes first; a batch the store does not take is spooled. Refreshes the
/// summary every [`SUMMARY_EVERY`].
fn write_loop(
    rx: &flume::Receiver<Entry>,
    store: &dyn Store,
    shown: &std::sync::Mutex<Summary>,
    done: &std::sync::atomic::AtomicU64,
    mut spool: Spool,
) {
    use std::sync::atomic::Ordering::AcqRel;
    let mut refreshed: Option<std::time::Instant> = None;
    loop {
        if refreshed.is_none_or(|t| t.elapsed() >= SUMMARY_EVERY) {
            match store.summary(now_ms()) {
                Ok(s) => {
                    if let Ok(mut g) = shown.lock() {
                        *g = s;
                    }
                }
                Err(e) => tracing::debug!(error = %e, "ledger summary not refreshed"),
            }
            refreshed = Some(std::time::Instant::now());
        }
        if !spool.held.is_empty() {
            done.fetch_add(spool.flush(store) as u64, AcqRel);
        }
        let wait = if spool.held.is_empty() {
            SUMMARY_EVERY
        } else {
            RETRY_EVERY
        };
        let first = match rx.recv_timeout(wait) {
            Ok(e) => e,
            Err(flume::RecvTimeoutError::Timeout) => continue,
            Err(flume::RecvTimeoutError::Disconnected) => return,
        };
        let mut batch = vec![first];
        let until = std::time::Instant::now() + GATHER;
        while batch.len() < 512 {
            match rx.recv_deadline(until) {
                Ok(e) => batch.push(e),
                Err(_) => break,
            }
        }
        let n = batch.len() as u64;
        let stored = spool.held.is_empty() && store.put(&batch, now_ms()).is_ok();
        if stored {
            done.fetch_add(n, AcqRel);
            continue;
        }
        let dropped = spool.hold(batch);
        if dropped > 0 {
            metrics::counter!(crate::metrics::LEDGER_DROPPED_TOTAL).increment(dropped as u64);
            tracing::warn!(
                records = dropped,
                "decision records dropped: the store fails and the spool is full"
            );
            done.fetch_add(dropped as u64, AcqRel);
        }
    }
}

/// How often the writer tries the store again while it spools.
const RETRY_EVERY: Duration = Duration::from_millis(250);

/// The ledger `config` asks for: none when `[feedback]` is off; in Redis (under the policy store's key) when
/// the policy store is Redis; else in `local` (the SQLite file the binary hands over), or in memory without one
/// (not durable: said at start).
pub(crate) fn open(
    config: &tiergate_config::Config,
    local: Option<Arc<dyn Store>>,
) -> anyhow::Result<Option<Arc<Ledger>>> {
    let f = &config.feedback;
    if !f.enabled {
        return Ok(None);
    }
    let mut dependency = None;
    let store: Arc<dyn Store> = match (config.policy_store.kind, local) {
        (tiergate_config::StoreKind::Redis, _) => {
            let dep = crate::deps::Dependency::new(
                "ledger",
                Duration::from_millis(config.policy_store.timeout_ms) * 10,
            );
            dependency = Some(dep.clone());
            Arc::new(
                redis::RedisLedger::new(
                    &config.policy_store.url,
                    &config.policy_store.key,
                    f.window_s,
                    dep,
                )?
                .per_tenant(f.max_per_tenant),
            )
        }
        (tiergate_config::StoreKind::Memory, Some(store)) => store,
        (tiergate_config::StoreKind::Memory, None) => {
            tracing::info!(
                "decision records kept in memory (no durable ledger mounted): lost at exit"
            );
            Arc::new(memory::MemoryStore::new(f.max_bytes, f.window_s).per_tenant(f.max_per_tenant))
        }
    };
    Ok(Some(Ledger::start_with(
        store, f.queue, f.window_s, dependency,
    )))
}

impl Record {
    /// Trusted feedback `fb` on this answer as a row of evidence for the bound (Tier-0's lone label answers
    /// only).
    pub fn as_evidence(&self, fb: &Feedback) -> Option<tiergate_core::risk::Audited> {
        (fb.trusted && self.is_evidence()).then(|| tiergate_core::risk::Audited {
            row: tiergate_core::risk::Row {
                ambiguity: self.ambiguity.unwrap_or(1.0),
                wrong: !fb.correct,
            },
            drawn_at: self.theta.unwrap_or(0.0),
        })
    }
}

impl AuditItem {
    /// As evidence for the bound about head `head`, once labelled (an audit of a degraded answer or of
    /// another head is not).
    pub fn audited(&self, head: &str) -> Option<tiergate_core::risk::Audited> {
        if self.head != head || self.channel != summary::TIER0 {
            return None;
        }
        let label = self.label.as_ref()?;
        Some(tiergate_core::risk::Audited {
            row: tiergate_core::risk::Row {
                ambiguity: self.ambiguity,
                wrong: *label != self.answered,
            },
            drawn_at: self.theta,
        })
    }
}

/// A head's version: FNV-1a of its labels and temperature, hex.
pub(crate) fn head_version(labels: &[String], temperature: f64) -> String {
    let mut h = tiergate_core::fnv::Fnv::new();
    for l in labels {
        h.eat(l.as_bytes()).eat(&[0]);
    }
    h.eat(&temperature.to_bits().to_le_bytes()).hex()
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn record(id: &str, tenant: &str, at_ms: u64) -> Record {
        Record {
            id: id.into(),
            alias: None,
            at_ms,
            tenant: tenant.into(),
            route: "classify".into(),
            channel: "tier0".into(),
            tier: "tier0".into(),
            degraded: None,
            stage: None,
            label: Some("card_lost".into()),
            ambiguity: Some(0.1),
            top: vec![("card_lost".into(), 0.9)],
            theta: Some(0.5),
            policy_version: 1,
            head: head_version(&["a".into()], 1.0),
            text: None,
            forced: false,
            session: None,
            switch: None,
        }
    }

    #[test]
    fn records_written_through_the_channel_are_joinable() {
        let store: Arc<dyn Store> = Arc::new(memory::MemoryStore::new(1 << 20, 60));
        let ledger = Ledger::start(store, 16, 60);
        let now = now_ms();
        let mut r = record("chatcmpl-1", "acme", now);
        r.session = Some("kept".into());
        r.switch = Some(crate::model::outcome::SwitchPrice {
            moved: false,
            why: "dear".into(),
            saving_ms: 1800.0,
            cost_ms: 14_000.0,
            budget_ms: 30_000.0,
        });
        // As the SQLite and Redis ledgers keep it: JSON, the turn's pin decision and its price included.
        let json = serde_json::to_string(&r).unwrap();
        let back: Record = serde_json::from_str(&json).unwrap();
        assert_eq!((&back.session, &back.switch), (&r.session, &r.switch));
        ledger.record(Entry::Decision(Box::new(r.clone())));
        let t = std::time::Instant::now();
        let read = loop {
            if let Some(d) = ledger.store().decision("chatcmpl-1", now).unwrap() {
                break d;
            }
            assert!(t.elapsed() < Duration::from_secs(5), "not written");
            std::thread::sleep(Duration::from_millis(10));
        };
        assert_eq!(read.switch, r.switch);
        assert_ne!(
            head_version(&["a".into()], 1.0),
            head_version(&["a".into()], 2.0)
        );
    }
}
