//! The ledger in one local SQLite file (`[feedback] path`): decisions expire after the window; a tenant keeps
//! its newest `max_per_tenant`; past `max_bytes` — counted twice, as the records' JSON and as the file's pages
//! in use (tables and indexes: what the file holds; SQLite reuses the pages freed, so the file stays near the
//! bound) — the tenants holding the most give way, their oldest first, until every tenant holds at most an
//! equal cut of 90% of the bound or less (one tenant's flood evicts the others' records only once it holds no
//! more than they do); the WAL is cut back to 64 MiB after each checkpoint; labelled audits are kept (without
//! their text) as the evidence they are.

use std::path::Path;
use std::sync::Mutex;

use rusqlite::{params, Connection, OptionalExtension};
use tiergate_engine::evidence::ledger::{
    AuditItem, Entry, Feedback, First, Record, Store, StoreError, Summary,
};

/// What can go wrong here; the server sees it as a [`StoreError`].
#[derive(Debug, thiserror::Error)]
pub enum LocalError {
    #[error("sqlite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("json: {0}")]
    Json(#[from] serde_json::Error),
    #[error("{0}")]
    Other(String),
}

impl From<LocalError> for StoreError {
    fn from(e: LocalError) -> Self {
        StoreError(e.to_string())
    }
}

type Result<T> = std::result::Result<T, LocalError>;

/// The store.
pub struct SqliteStore {
    conn: Mutex<Connection>,
    max_bytes: u64,
    /// The most decisions one tenant keeps.
    per_tenant: usize,
    window_ms: u64,
    /// When expired and over-cap rows were last deleted: at most once a second (the sum over the table is not
    /// free on every batch).
    pruned: Mutex<Option<std::time::Instant>>,
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS decisions (
  id TEXT PRIMARY KEY, alias TEXT, tenant TEXT NOT NULL, route TEXT NOT NULL, channel TEXT NOT NULL,
  at_ms INTEGER NOT NULL, expires_ms INTEGER NOT NULL, bytes INTEGER NOT NULL, record TEXT NOT NULL,
  feedback TEXT, fb_correct INTEGER, fb_trusted INTEGER, fb_tier0 INTEGER);
CREATE INDEX IF NOT EXISTS decisions_alias ON decisions(alias);
CREATE INDEX IF NOT EXISTS decisions_at ON decisions(at_ms);
CREATE INDEX IF NOT EXISTS decisions_expires ON decisions(expires_ms);
CREATE INDEX IF NOT EXISTS decisions_tenant ON decisions(tenant, at_ms);
CREATE TABLE IF NOT EXISTS audits (
  id TEXT PRIMARY KEY, route TEXT NOT NULL, at_ms INTEGER NOT NULL, expires_ms INTEGER NOT NULL,
  item TEXT NOT NULL, label TEXT, wrong INTEGER, ambiguity REAL NOT NULL);
CREATE INDEX IF NOT EXISTS audits_pending ON audits(route, at_ms) WHERE label IS NULL;
CREATE INDEX IF NOT EXISTS audits_labelled ON audits(route, at_ms) WHERE label IS NOT NULL;
CREATE INDEX IF NOT EXISTS decisions_trusted ON decisions(route, at_ms) WHERE fb_trusted = 1 AND fb_tier0 = 1;
";

impl SqliteStore {
    /// Opens (creating) the file and its folder.
    pub fn open(path: &Path, max_bytes: u64, window_s: u64) -> Result<Self> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .map_err(|e| LocalError::Other(format!("{}: {e}", dir.display())))?;
        }
        let conn = Connection::open(path)?;
        // Several servers may share one file (each waits for the other's write).
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        init(&conn)?;
        Ok(Self {
            conn: Mutex::new(conn),
            max_bytes,
            per_tenant: usize::MAX,
            window_ms: window_s.saturating_mul(1000),
            pruned: Mutex::new(None),
        })
    }

    /// At most `n` decisions of one tenant (`feedback.max_per_tenant`).
    pub fn per_tenant(mut self, n: usize) -> Self {
        self.per_tenant = n;
        self
    }

    fn conn(&self) -> std::sync::MutexGuard<'_, Connection> {
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// WAL mode and the schema. Servers started together on a file nobody created yet race here, and SQLite
/// answers some of those races "busy" at once instead of calling the busy handler (the WAL switch, a read
/// snapshot that went stale before its write): such a start waits and tries again, up to 10 s.
fn init(conn: &Connection) -> Result<()> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let mut pause = std::time::Duration::from_millis(5);
    loop {
        match try_init(conn) {
            Err(LocalError::Sqlite(e)) if is_busy(&e) && std::time::Instant::now() < deadline => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(std::time::Duration::from_millis(200));
            }
            other => return other,
        }
    }
}

fn try_init(conn: &Connection) -> Result<()> {
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    conn.pragma_update(None, "journal_size_limit", 64i64 << 20)?;
    // One write transaction from its start, so that the busy handler covers the whole schema.
    conn.execute_batch(&format!("BEGIN IMMEDIATE;{SCHEMA}COMMIT;"))
        .inspect_err(|_| {
            let _ = conn.execute_batch("ROLLBACK");
        })?;
    Ok(())
}

fn is_busy(e: &rusqlite::Error) -> bool {
    matches!(
        e.sqlite_error_code(),
        Some(rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked)
    )
}

/// Deletes expired decisions and pending audits, each tenant's oldest past `per_tenant`, then — while the
/// records' JSON, or the file's pages in use, are over `max_bytes` — the heaviest tenants' oldest, down to 90%
/// of it (each tenant's newest record kept).
fn prune(
    tx: &rusqlite::Transaction<'_>,
    now_ms: u64,
    max_bytes: u64,
    per_tenant: usize,
) -> Result<()> {
    tx.execute(
        "DELETE FROM decisions WHERE expires_ms <= ?1",
        params![now_ms as i64],
    )?;
    tx.execute(
        "DELETE FROM audits WHERE label IS NULL AND expires_ms <= ?1",
        params![now_ms as i64],
    )?;
    let per_tenant = i64::try_from(per_tenant).unwrap_or(i64::MAX);
    let mut held = tenants(tx)?;
    let over: Vec<&(String, i64, i64)> = held.iter().filter(|t| t.1 > per_tenant).collect();
    for (tenant, n, _) in &over {
        tx.execute(
            "DELETE FROM decisions WHERE id IN (SELECT id FROM decisions WHERE tenant = ?1 \
             ORDER BY at_ms, id LIMIT ?2)",
            params![tenant, n - per_tenant],
        )?;
    }
    if !over.is_empty() {
        held = tenants(tx)?;
    }
    let total: i64 = held.iter().map(|t| t.2).sum();
    if total as u64 > max_bytes {
        // Down to 90% of the cap, so that pruning does not run on every batch.
        keep_newest(tx, &held, max_bytes as f64 * 0.9)?;
        held = tenants(tx)?;
    }
    let pragma = |name: &str| -> rusqlite::Result<i64> {
        tx.query_row(&format!("PRAGMA {name}"), [], |r| r.get(0))
    };
    let used = (pragma("page_count")? - pragma("freelist_count")?) * pragma("page_size")?;
    if used as u64 > max_bytes {
        // As if the pages were spread evenly over the records' JSON: the share of it past 90% of the cap.
        let json: i64 = held.iter().map(|t| t.2).sum();
        keep_newest(
            tx,
            &held,
            json as f64 * 0.9 * max_bytes as f64 / used as f64,
        )?;
    }
    Ok(())
}

/// Each tenant's decisions: (tenant, records, bytes of JSON).
fn tenants(tx: &rusqlite::Transaction<'_>) -> Result<Vec<(String, i64, i64)>> {
    let mut q = tx.prepare("SELECT tenant, COUNT(*), SUM(bytes) FROM decisions GROUP BY tenant")?;
    let rows = q.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
    Ok(rows.collect::<rusqlite::Result<_>>()?)
}

/// Deletes the oldest decisions of the tenants holding the most until all hold `target` bytes together: each
/// keeps its newest up to an equal cut (tenants under it keep everything, their share going to the others) and
/// its newest record in any case.
fn keep_newest(
    tx: &rusqlite::Transaction<'_>,
    held: &[(String, i64, i64)],
    target: f64,
) -> Result<()> {
    let Some(cut) = equal_cut(held.iter().map(|t| t.2 as f64).collect(), target) else {
        return Ok(());
    };
    for (tenant, _, _) in held.iter().filter(|t| t.2 as f64 > cut) {
        tx.execute(
            "DELETE FROM decisions WHERE id IN (SELECT id FROM (SELECT id, bytes, SUM(bytes) OVER \
             (ORDER BY at_ms DESC, id DESC) AS run FROM decisions WHERE tenant = ?1) \
             WHERE run > ?2 AND run > bytes)",
            params![tenant, cut as i64],
        )?;
    }
    Ok(())
}

/// The cut `c` at which the holdings `b`, each capped at `c`, sum to `target` (water filling); `None` when they
/// are within it already.
fn equal_cut(mut b: Vec<f64>, target: f64) -> Option<f64> {
    b.sort_by(f64::total_cmp);
    let mut left = target;
    for (i, x) in b.iter().enumerate() {
        let share = left / (b.len() - i) as f64;
        if *x > share {
            return Some(share.max(0.0));
        }
        left -= x;
    }
    None
}

/// The JSON column of the one row `sql` selects, parsed (`None`: no row).
fn json_one<T: serde::de::DeserializeOwned>(
    conn: &Connection,
    sql: &str,
    p: impl rusqlite::Params,
) -> Result<Option<T>> {
    let text: Option<String> = conn.query_row(sql, p, |r| r.get(0)).optional()?;
    Ok(match text {
        Some(t) => Some(serde_json::from_str(&t)?),
        None => None,
    })
}

/// The JSON column of every row `sql` selects, parsed.
fn json_all<T: serde::de::DeserializeOwned>(
    conn: &Connection,
    sql: &str,
    p: impl rusqlite::Params,
) -> Result<Vec<T>> {
    let mut stmt = conn.prepare(sql)?;
    let rows = stmt.query_map(p, |r| r.get::<_, String>(0))?;
    let mut out = Vec::new();
    for t in rows {
        out.push(serde_json::from_str(&t?)?);
    }
    Ok(out)
}

impl SqliteStore {
    /// Trusted feedback on `route`'s Tier-0-alone answers by head `head` since `since_ms`, as evidence rows.
    pub fn trusted_feedback(
        &self,
        route: &str,
        head: &str,
        since_ms: u64,
    ) -> Result<Vec<tiergate_core::risk::Audited>> {
        let conn = self.conn();
        let mut stmt = conn.prepare(
            "SELECT record, feedback FROM decisions WHERE route = ?1 AND at_ms >= ?2 AND fb_trusted = 1 \
             AND fb_tier0 = 1",
        )?;
        let rows = stmt.query_map(params![route, since_ms as i64], |r| {
            Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?))
        })?;
        let mut out = Vec::new();
        for row in rows {
            let (rec, fb) = row?;
            let rec: Record = serde_json::from_str(&rec)?;
            if rec.head != head {
                continue;
            }
            let fb: Feedback = serde_json::from_str(&fb)?;
            out.extend(rec.as_evidence(&fb));
        }
        Ok(out)
    }

    /// Labelled audits of `route`'s head `head` drawn since `since_ms`.
    pub fn labelled(
        &self,
        route: &str,
        head: &str,
        since_ms: u64,
    ) -> Result<Vec<tiergate_core::risk::Audited>> {
        let items: Vec<AuditItem> = json_all(
            &self.conn(),
            "SELECT item FROM audits WHERE route = ?1 AND label IS NOT NULL AND at_ms >= ?2",
            params![route, since_ms as i64],
        )?;
        Ok(items.iter().filter_map(|a| a.audited(head)).collect())
    }

    /// See [`Store::put`].
    pub fn put(&self, entries: &[Entry], now_ms: u64) -> Result<()> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let expires = (now_ms + self.window_ms) as i64;
        for e in entries {
            match e {
                Entry::Decision(r) => {
                    let text = serde_json::to_string(r)?;
                    tx.execute(
                        "INSERT OR IGNORE INTO decisions (id, alias, tenant, route, channel, at_ms, expires_ms, bytes, record) \
                         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
                        params![r.id, r.alias, r.tenant, r.route, r.feedback_channel(), r.at_ms as i64, expires, text.len() as i64, text],
                    )?;
                }
                Entry::Audit(a) => {
                    tx.execute(
                        "INSERT OR IGNORE INTO audits (id, route, at_ms, expires_ms, item, ambiguity) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                        params![a.id, a.route, a.at_ms as i64, expires, serde_json::to_string(a)?, a.ambiguity],
                    )?;
                }
            }
        }
        let mut pruned = self.pruned.lock().unwrap_or_else(|p| p.into_inner());
        if pruned.is_none_or(|t| t.elapsed() >= std::time::Duration::from_secs(1)) {
            prune(&tx, now_ms, self.max_bytes, self.per_tenant)?;
            *pruned = Some(std::time::Instant::now());
        }
        tx.commit()?;
        Ok(())
    }

    /// See [`Store::decision`].
    pub fn decision(&self, id: &str, now_ms: u64) -> Result<Option<Record>> {
        json_one(
            &self.conn(),
            "SELECT record FROM decisions WHERE (id = ?1 OR alias = ?1) AND expires_ms > ?2 LIMIT 1",
            params![id, now_ms as i64],
        )
    }

    /// See [`Store::decision_of`]: the tenant is matched in SQL, so another tenant's record is never read.
    pub fn decision_of(&self, id: &str, tenant: &str, now_ms: u64) -> Result<Option<Record>> {
        json_one(
            &self.conn(),
            "SELECT record FROM decisions WHERE (id = ?1 OR alias = ?1) AND expires_ms > ?2 AND tenant = ?3 \
             LIMIT 1",
            params![id, now_ms as i64, tenant],
        )
    }

    /// See [`Store::feedback`].
    pub fn feedback(&self, id: &str, fb: &Feedback) -> Result<First<Feedback>> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let row: Option<(String, Option<String>)> = tx
            .query_row(
                "SELECT record, feedback FROM decisions WHERE id = ?1 OR alias = ?1 LIMIT 1",
                params![id],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?;
        let Some((record, existing)) = row else {
            return Ok(First::Gone);
        };
        if let Some(e) = existing {
            return Ok(First::Already(serde_json::from_str(&e)?));
        }
        let rec: Record = serde_json::from_str(&record)?;
        tx.execute(
            "UPDATE decisions SET feedback = ?2, fb_correct = ?3, fb_trusted = ?4, fb_tier0 = ?5 WHERE id = ?1",
            params![rec.id, serde_json::to_string(fb)?, fb.correct, fb.trusted, rec.is_evidence()],
        )?;
        tx.commit()?;
        Ok(First::Written(fb.clone()))
    }

    /// See [`Store::pending`].
    pub fn pending(
        &self,
        route: Option<&str>,
        heads: Option<&tiergate_engine::evidence::ledger::Heads>,
        limit: usize,
    ) -> Result<Vec<AuditItem>> {
        // With a head filter every pending item is read (oldest first) and those of other heads skipped.
        let all: Vec<AuditItem> = json_all(
            &self.conn(),
            "SELECT item FROM audits WHERE label IS NULL AND (?1 IS NULL OR route = ?1) ORDER BY at_ms LIMIT ?2",
            params![route, if heads.is_some() { -1 } else { limit as i64 }],
        )?;
        Ok(all
            .into_iter()
            .filter(|a| a.of_heads(heads))
            .take(limit)
            .collect())
    }

    /// See [`Store::audit`].
    pub fn audit(&self, id: &str) -> Result<Option<AuditItem>> {
        json_one(
            &self.conn(),
            "SELECT item FROM audits WHERE id = ?1",
            params![id],
        )
    }

    /// See [`Store::label`].
    pub fn label(&self, id: &str, label: &str) -> Result<First<String>> {
        let mut conn = self.conn();
        let tx = conn.transaction()?;
        let item: Option<AuditItem> =
            json_one(&tx, "SELECT item FROM audits WHERE id = ?1", params![id])?;
        let Some(mut a) = item else {
            return Ok(First::Gone);
        };
        if let Some(l) = a.label {
            return Ok(First::Already(l));
        }
        a.label = Some(label.to_string());
        a.text = None;
        tx.execute(
            "UPDATE audits SET item = ?2, label = ?3, wrong = ?4 WHERE id = ?1",
            params![id, serde_json::to_string(&a)?, label, a.answered != label],
        )?;
        tx.commit()?;
        Ok(First::Written(label.to_string()))
    }

    /// See [`Store::summary`].
    pub fn summary(&self, now_ms: u64) -> Result<Summary> {
        let conn = self.conn();
        let mut s = Summary::default();
        // Audits in the window, by the head that answered, aggregated in SQL (the items, texts included, are
        // not read): pending ones not expired; labelled ones drawn within the window, with the sums of their
        // weights 1/p that the weighted estimate needs.
        let head = "COALESCE(json_extract(item, '$.head'), '')";
        let mut stmt = conn.prepare(&format!(
            "SELECT route, {head}, COUNT(*) FROM audits WHERE label IS NULL AND expires_ms > ?1 \
             GROUP BY 1, 2"
        ))?;
        let rows = stmt.query_map(params![now_ms as i64], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, i64>(2)?,
            ))
        })?;
        for row in rows {
            let (route, head, n) = row?;
            s.route(&route).add_pending(&head, n as u64);
        }
        let w = "(1.0 / MAX(COALESCE(json_extract(item, '$.probability'), 1.0), 1e-12))";
        let mut stmt = conn.prepare(&format!(
            "SELECT route, {head}, COALESCE(json_extract(item, '$.channel'), 'tier0'), COUNT(*), \
             COALESCE(SUM(wrong), 0), SUM({w}), SUM({w} * {w}), COALESCE(SUM(CASE WHEN wrong THEN {w} END), 0) \
             FROM audits WHERE label IS NOT NULL AND at_ms >= ?1 GROUP BY 1, 2, 3"
        ))?;
        let rows = stmt.query_map(params![now_ms.saturating_sub(self.window_ms) as i64], |r| {
            Ok((
                (
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, String>(2)?,
                ),
                tiergate_core::risk::WeightedCount {
                    n: r.get::<_, i64>(3)? as u64,
                    k: r.get::<_, i64>(4)? as u64,
                    w: r.get(5)?,
                    w2: r.get(6)?,
                    wk: r.get(7)?,
                },
            ))
        })?;
        for row in rows {
            let ((route, head, channel), c) = row?;
            s.route(&route).add_audits(&head, &channel, &c);
        }
        let mut stmt = conn.prepare(
            "SELECT route, channel, fb_trusted, COUNT(*), COALESCE(SUM(fb_correct), 0) FROM decisions \
             WHERE feedback IS NOT NULL GROUP BY route, channel, fb_trusted",
        )?;
        let rows = stmt.query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, bool>(2)?,
                r.get::<_, i64>(3)?,
                r.get::<_, i64>(4)?,
            ))
        })?;
        for row in rows {
            let (route, channel, trusted, n, correct) = row?;
            s.route(&route)
                .add_feedback(&channel, trusted, n as u64, correct as u64);
        }
        let mut stmt = conn.prepare(
            "SELECT route, COUNT(*) FROM decisions WHERE expires_ms > ?1 GROUP BY route",
        )?;
        let rows = stmt.query_map(params![now_ms as i64], |r| {
            Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?))
        })?;
        for row in rows {
            let (route, n) = row?;
            s.route(&route).decisions = n as u64;
        }
        Ok(s)
    }
}

impl Store for SqliteStore {
    fn put(&self, entries: &[Entry], now_ms: u64) -> std::result::Result<(), StoreError> {
        Self::put(self, entries, now_ms).map_err(Into::into)
    }
    fn decision(&self, id: &str, now_ms: u64) -> std::result::Result<Option<Record>, StoreError> {
        Self::decision(self, id, now_ms).map_err(Into::into)
    }
    fn decision_of(
        &self,
        id: &str,
        tenant: &str,
        now_ms: u64,
    ) -> std::result::Result<Option<Record>, StoreError> {
        Self::decision_of(self, id, tenant, now_ms).map_err(Into::into)
    }
    fn feedback(
        &self,
        id: &str,
        fb: &Feedback,
    ) -> std::result::Result<First<Feedback>, StoreError> {
        Self::feedback(self, id, fb).map_err(Into::into)
    }
    fn pending(
        &self,
        route: Option<&str>,
        heads: Option<&tiergate_engine::evidence::ledger::Heads>,
        limit: usize,
    ) -> std::result::Result<Vec<AuditItem>, StoreError> {
        Self::pending(self, route, heads, limit).map_err(Into::into)
    }
    fn audit(&self, id: &str) -> std::result::Result<Option<AuditItem>, StoreError> {
        Self::audit(self, id).map_err(Into::into)
    }
    fn label(&self, id: &str, label: &str) -> std::result::Result<First<String>, StoreError> {
        Self::label(self, id, label).map_err(Into::into)
    }
    fn summary(&self, now_ms: u64) -> std::result::Result<Summary, StoreError> {
        Self::summary(self, now_ms).map_err(Into::into)
    }
    fn labelled(
        &self,
        route: &str,
        head: &str,
        since_ms: u64,
    ) -> std::result::Result<Vec<tiergate_core::risk::Audited>, StoreError> {
        Self::labelled(self, route, head, since_ms).map_err(Into::into)
    }
    fn trusted_feedback(
        &self,
        route: &str,
        head: &str,
        since_ms: u64,
    ) -> std::result::Result<Vec<tiergate_core::risk::Audited>, StoreError> {
        Self::trusted_feedback(self, route, head, since_ms).map_err(Into::into)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: &str, tenant: &str, at_ms: u64) -> Record {
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
            head: String::new(),
            text: None,
            forced: false,
            session: None,
            switch: None,
        }
    }

    fn store(dir: &Path, max_bytes: u64) -> SqliteStore {
        SqliteStore::open(&dir.join("ledger/f.sqlite"), max_bytes, 60).unwrap()
    }

    #[test]
    fn servers_opening_one_fresh_file_at_once_all_succeed() {
        // Replicas (and parallel tests) start together on a file nobody created yet: the schema and the WAL
        // switch race, and a lost race must wait, not fail the start.
        for round in 0..20 {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join(format!("f{round}.sqlite"));
            let opened: Vec<_> = (0..6)
                .map(|_| {
                    let path = path.clone();
                    std::thread::spawn(move || SqliteStore::open(&path, 1 << 20, 60).map(|_| ()))
                })
                .collect();
            for t in opened {
                if let Err(e) = t.join().unwrap() {
                    panic!("round {round}: {e}");
                }
            }
        }
    }

    #[test]
    fn feedback_joins_once_expires_and_survives_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(dir.path(), 1 << 20);
        let t0 = 1_000_000;
        let mut r = record("chatcmpl-a", "acme", t0);
        r.alias = Some("batch_1/line-7".into());
        s.put(&[Entry::Decision(Box::new(r.clone()))], t0).unwrap();
        assert_eq!(s.decision("chatcmpl-a", t0).unwrap(), Some(r.clone()));
        // Its tenant's; another tenant's lookup reads as absent (matched in SQL, the record never read).
        assert_eq!(
            s.decision_of("chatcmpl-a", "acme", t0).unwrap(),
            Some(r.clone())
        );
        assert_eq!(s.decision_of("chatcmpl-a", "other", t0).unwrap(), None);
        assert_eq!(
            s.decision("batch_1/line-7", t0).unwrap(),
            Some(r.clone()),
            "by batch line"
        );
        let fb = Feedback {
            label: Some("card_lost".into()),
            correct: true,
            trusted: true,
            at_ms: t0,
        };
        assert_eq!(
            s.feedback("chatcmpl-a", &fb).unwrap(),
            First::Written(fb.clone())
        );
        // Trusted feedback on a Tier-0 answer is evidence for the bound: right, decided under θ = 0.5.
        let ev = s.trusted_feedback("classify", "", 0).unwrap();
        assert_eq!(ev.len(), 1);
        assert!(
            s.trusted_feedback("classify", "another-head", 0)
                .unwrap()
                .is_empty(),
            "evidence about another head"
        );
        assert!(!ev[0].row.wrong && (ev[0].drawn_at - 0.5).abs() < 1e-12);
        let other = Feedback {
            correct: false,
            ..fb.clone()
        };
        assert_eq!(
            s.feedback("chatcmpl-a", &other).unwrap(),
            First::Already(fb.clone()),
            "the first stands"
        );
        drop(s);
        // A restart keeps records and feedback.
        let s = store(dir.path(), 1 << 20);
        assert_eq!(
            s.feedback("batch_1/line-7", &other).unwrap(),
            First::Already(fb)
        );
        let sum = s.summary(t0).unwrap();
        let c = &sum.routes["classify"];
        assert_eq!(
            (
                c.decisions,
                c.feedback["tier0"].trusted_n,
                c.feedback["tier0"].trusted_correct
            ),
            (1, 1, 1)
        );
        // Past the window (60 s) it is gone.
        assert_eq!(s.decision("chatcmpl-a", t0 + 61_000).unwrap(), None);
    }

    #[test]
    fn the_oldest_records_go_first_past_the_byte_cap() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(dir.path(), 4_000);
        for i in 0..40u64 {
            // Pruning runs at most once a second; the test asks for it on every batch.
            *s.pruned.lock().unwrap() = None;
            s.put(
                &[Entry::Decision(Box::new(record(
                    &format!("c-{i}"),
                    "t",
                    1_000 + i,
                )))],
                1_000 + i,
            )
            .unwrap();
        }
        let total: i64 = s
            .conn()
            .query_row("SELECT SUM(bytes) FROM decisions", [], |r| r.get(0))
            .unwrap();
        assert!(total <= 4_000, "{total}");
        assert!(
            s.decision("c-39", 1_040).unwrap().is_some(),
            "the newest stays"
        );
        assert!(
            s.decision("c-0", 1_040).unwrap().is_none(),
            "the oldest went"
        );
    }

    /// The file itself (its pages in use: records, their indexes) stays near `max_bytes`, not only the
    /// records' JSON: 12,000 records (over 2 MiB of JSON alone) through a 1 MiB cap.
    #[test]
    fn the_files_pages_stay_within_the_byte_cap() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(dir.path(), 1 << 20);
        let (mut id, mut written) = (0u64, 0usize);
        for batch in 0..48u64 {
            *s.pruned.lock().unwrap() = None;
            let entries: Vec<Entry> = (0..250)
                .map(|_| {
                    id += 1;
                    let r = record(&format!("chatcmpl-{id:020}"), "t", 1_000 + batch);
                    written += serde_json::to_string(&r).unwrap().len();
                    Entry::Decision(Box::new(r))
                })
                .collect();
            s.put(&entries, 1_000 + batch).unwrap();
        }
        assert!(written > 2 << 20, "{written}");
        let c = s.conn();
        let pragma = |n: &str| -> i64 {
            c.query_row(&format!("PRAGMA {n}"), [], |r| r.get(0))
                .unwrap()
        };
        let file = pragma("page_count") * pragma("page_size");
        assert!(
            file <= (1 << 20) * 13 / 10,
            "the file holds {file} bytes under a 1 MiB cap"
        );
        drop(c);
        let newest = format!("chatcmpl-{id:020}");
        assert!(s.decision(&newest, 1_048).unwrap().is_some());
    }

    #[test]
    fn audits_are_listed_labelled_once_and_lose_their_text() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(dir.path(), 1 << 20);
        let item = |id: &str, at: u64| AuditItem {
            id: id.into(),
            route: "classify".into(),
            at_ms: at,
            probability: 0.5,
            theta: 0.4,
            ambiguity: 0.2,
            answered: "card_lost".into(),
            channel: "tier0".into(),
            text: Some("my card is gone".into()),
            head: "h1".into(),
            label: None,
        };
        s.put(
            &[
                Entry::Audit(Box::new(item("a1", 10))),
                Entry::Audit(Box::new(item("a2", 20))),
            ],
            20,
        )
        .unwrap();
        let p = s.pending(Some("classify"), None, 10).unwrap();
        assert_eq!(
            p.iter().map(|a| a.id.as_str()).collect::<Vec<_>>(),
            ["a1", "a2"]
        );
        assert!(s.pending(Some("other"), None, 10).unwrap().is_empty());
        assert_eq!(
            s.label("a1", "card_stolen").unwrap(),
            First::Written("card_stolen".into())
        );
        assert_eq!(
            s.label("a1", "card_lost").unwrap(),
            First::Already("card_stolen".into())
        );
        let a = s.audit("a1").unwrap().unwrap();
        assert_eq!((a.label.as_deref(), a.text), (Some("card_stolen"), None));
        assert_eq!(s.pending(None, None, 10).unwrap().len(), 1);
        // The labelled one is live evidence for the bound: wrong, drawn under θ = 0.4.
        let live = s.labelled("classify", "h1", 0).unwrap();
        assert_eq!(live.len(), 1);
        assert!(live[0].row.wrong && (live[0].drawn_at - 0.4).abs() < 1e-12);
        assert!(
            s.labelled("classify", "h1", 11).unwrap().is_empty(),
            "drawn before `since`"
        );
        assert!(
            s.labelled("classify", "h2", 0).unwrap().is_empty(),
            "another head's evidence"
        );
        let sum = s.summary(20).unwrap();
        let c = &sum.routes["classify"];
        let e = c.silent_error(Some("h1")).unwrap();
        assert_eq!((c.pending_of(Some("h1")), e.n, e.wrong), (1, 1, 1));
        assert_eq!(c.silent_error(Some("h2")), None);
        // A second audit drawn at another rate: the estimate is weighted by 1/p (2 wrong of 2 + 4).
        let mut a3 = item("a3", 20);
        a3.probability = 0.25;
        s.put(&[Entry::Audit(Box::new(a3))], 20).unwrap();
        s.label("a3", "card_lost").unwrap();
        let sum = s.summary(20).unwrap();
        let e = sum.routes["classify"].silent_error(Some("h1")).unwrap();
        assert_eq!((e.n, e.wrong), (2, 1));
        assert!((e.estimate - 2.0 / 6.0).abs() < 1e-12, "{e:?}");
        assert!((e.effective_n - 36.0 / 20.0).abs() < 1e-9, "{e:?}");
        assert_eq!(
            s.label("nope", "x").unwrap(),
            First::Gone,
            "gone, not a store failure"
        );
    }

    /// One tenant's flood: past `max_per_tenant` it loses its own oldest; past `max_bytes` the tenant holding
    /// the most gives way — another tenant's records stay.
    #[test]
    fn one_tenants_flood_evicts_no_other_tenants_records() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(dir.path(), 1 << 20).per_tenant(50);
        let put = |id: String, tenant: &str, at: u64| {
            *s.pruned.lock().unwrap() = None;
            s.put(&[Entry::Decision(Box::new(record(&id, tenant, at)))], at)
                .unwrap();
        };
        for i in 0..5 {
            put(format!("b-{i}"), "b", 1_000 + i);
        }
        for i in 0..200 {
            put(format!("a-{i}"), "a", 1_100 + i);
        }
        let count = |t: &str| -> i64 {
            s.conn()
                .query_row(
                    "SELECT COUNT(*) FROM decisions WHERE tenant = ?1",
                    [t],
                    |r| r.get(0),
                )
                .unwrap()
        };
        assert_eq!((count("a"), count("b")), (50, 5));
        assert!(s.decision_of("a-199", "a", 2_000).unwrap().is_some());
        assert!(s.decision_of("a-149", "a", 2_000).unwrap().is_none());
        // Under a 256 KiB cap (the JSON of ~600 records; the file's pages count too), a's flood of 1,500 keeps
        // b's five (the oldest of all).
        let s = store(&dir.path().join("2"), 256 << 10);
        let put = |id: String, tenant: &str, at: u64| {
            *s.pruned.lock().unwrap() = None;
            s.put(&[Entry::Decision(Box::new(record(&id, tenant, at)))], at)
                .unwrap();
        };
        for i in 0..5 {
            put(format!("b-{i}"), "b", 1_000 + i);
        }
        for i in 1000..2500 {
            put(format!("a-{i}"), "a", 1_100 + i);
        }
        for i in 0..5 {
            assert!(
                s.decision_of(&format!("b-{i}"), "b", 9_000)
                    .unwrap()
                    .is_some(),
                "b-{i}"
            );
        }
        assert!(s.decision_of("a-2499", "a", 9_000).unwrap().is_some());
        assert!(s.decision_of("a-1000", "a", 9_000).unwrap().is_none());
    }

    #[test]
    fn the_equal_cut_fills_the_target_from_the_smallest_up() {
        assert_eq!(equal_cut(vec![10.0, 20.0], 40.0), None);
        assert_eq!(equal_cut(vec![5.0, 100.0], 45.0), Some(40.0));
        assert_eq!(equal_cut(vec![30.0, 50.0, 5.0], 45.0), Some(20.0));
        assert_eq!(equal_cut(vec![30.0, 30.0], 30.0), Some(15.0));
    }
}
