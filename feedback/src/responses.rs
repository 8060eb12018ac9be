//! Stored responses in a local SQLite file (`[responses] path`): the
//! [`tiergate_engine::answer::stored::ResponseStore`] of a server whose policy store is not Redis, so that a
//! kept conversation survives a restart. One row per response, its tenant beside it (a lookup matches both in
//! SQL), expired rows deleted as rows are added, then a tenant's oldest past `max_per_tenant`, then — past
//! `max_entries` in all — the oldest of the tenant holding the most (one tenant filling its share evicts no
//! other's).

use std::path::Path;
use std::sync::Mutex;

use rusqlite::{params, Connection, OptionalExtension};
use tiergate_engine::answer::stored::{ResponseStore, StoredResponse};

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS responses (
  id TEXT PRIMARY KEY, tenant TEXT NOT NULL, at_ms INTEGER NOT NULL, expires_ms INTEGER NOT NULL,
  body TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS responses_at ON responses(at_ms);
CREATE INDEX IF NOT EXISTS responses_tenant_at ON responses(tenant, at_ms);
";

/// The file.
pub struct SqliteResponses {
    conn: Mutex<Connection>,
    ttl_ms: u64,
    max: usize,
    per_tenant: usize,
}

impl SqliteResponses {
    /// Opens (creating) the file and its folder.
    pub fn open(
        path: &Path,
        ttl_s: u64,
        max_entries: usize,
        max_per_tenant: usize,
    ) -> Result<Self, String> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        }
        let conn = Connection::open(path).map_err(|e| e.to_string())?;
        conn.busy_timeout(std::time::Duration::from_secs(5))
            .map_err(|e| e.to_string())?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(|e| e.to_string())?;
        conn.execute_batch(SCHEMA).map_err(|e| e.to_string())?;
        Ok(Self {
            conn: Mutex::new(conn),
            ttl_ms: ttl_s.saturating_mul(1000),
            max: max_entries,
            per_tenant: max_per_tenant,
        })
    }
}

impl ResponseStore for SqliteResponses {
    fn put(&self, r: &StoredResponse) -> Result<(), String> {
        let body = serde_json::to_string(r).map_err(|e| e.to_string())?;
        let mut c = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        let tx = c.transaction().map_err(|e| e.to_string())?;
        let now = r.at_ms as i64;
        let run = || -> rusqlite::Result<()> {
            tx.execute(
                "INSERT OR REPLACE INTO responses (id, tenant, at_ms, expires_ms, body) VALUES (?1, ?2, ?3, ?4, ?5)",
                params![r.id, r.tenant, now, now + self.ttl_ms as i64, body],
            )?;
            tx.execute("DELETE FROM responses WHERE expires_ms <= ?1", params![now])?;
            tx.execute(
                "DELETE FROM responses WHERE id IN (SELECT id FROM responses WHERE tenant = ?1 ORDER BY at_ms DESC LIMIT -1 OFFSET ?2)",
                params![r.tenant, self.per_tenant as i64],
            )?;
            let total: i64 =
                tx.query_row("SELECT COUNT(*) FROM responses", [], |row| row.get(0))?;
            let over = total - self.max as i64;
            if over > 0 {
                tx.execute(
                    "DELETE FROM responses WHERE id IN (SELECT id FROM responses WHERE tenant = \
                     (SELECT tenant FROM responses GROUP BY tenant ORDER BY COUNT(*) DESC LIMIT 1) \
                     ORDER BY at_ms LIMIT ?1)",
                    params![over],
                )?;
            }
            Ok(())
        };
        run().map_err(|e| e.to_string())?;
        tx.commit().map_err(|e| e.to_string())
    }

    fn get(&self, id: &str, tenant: &str) -> Result<Option<StoredResponse>, String> {
        let now = tiergate_engine::evidence::ledger::now_ms() as i64;
        let c = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        let body: Option<String> = c
            .query_row(
                "SELECT body FROM responses WHERE id = ?1 AND tenant = ?2 AND expires_ms > ?3",
                params![id, tenant, now],
                |row| row.get(0),
            )
            .optional()
            .map_err(|e| e.to_string())?;
        body.map(|b| serde_json::from_str(&b).map_err(|e| e.to_string()))
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(id: &str, tenant: &str, at_ms: u64) -> StoredResponse {
        StoredResponse {
            id: id.into(),
            tenant: tenant.into(),
            at_ms,
            messages: vec![serde_json::json!({"role": "user", "content": "hi"})],
            response: serde_json::json!({"id": id}),
            session: None,
        }
    }

    #[test]
    fn rows_keep_their_tenant_their_ttl_and_the_bound_and_survive_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("r/responses.sqlite");
        let now = tiergate_engine::evidence::ledger::now_ms();
        {
            let s = SqliteResponses::open(&path, 60, 2, 2).unwrap();
            s.put(&stored("old", "a", now - 120_000)).unwrap();
            for i in 0..3 {
                s.put(&stored(&format!("r{i}"), "a", now + i)).unwrap();
            }
            assert!(s.get("old", "a").unwrap().is_none(), "expired");
            assert!(
                s.get("r0", "a").unwrap().is_none(),
                "past max_entries, oldest first"
            );
            assert!(s.get("r2", "b").unwrap().is_none(), "another tenant's");
        }
        let s = SqliteResponses::open(&path, 60, 2, 2).unwrap();
        assert_eq!(s.get("r2", "a").unwrap(), Some(stored("r2", "a", now + 2)));
    }

    #[test]
    fn one_tenant_filling_its_share_evicts_none_of_anothers() {
        let dir = tempfile::tempdir().unwrap();
        let s = SqliteResponses::open(&dir.path().join("r.sqlite"), 60, 6, 3).unwrap();
        let now = tiergate_engine::evidence::ledger::now_ms();
        s.put(&stored("b0", "b", now)).unwrap();
        s.put(&stored("b1", "b", now + 1)).unwrap();
        for i in 0..100 {
            s.put(&stored(&format!("a{i}"), "a", now + 2 + i)).unwrap();
        }
        assert!(s.get("b0", "b").unwrap().is_some());
        assert!(s.get("a99", "a").unwrap().is_some());
        assert!(s.get("a96", "a").unwrap().is_none(), "a's own oldest went");
        s.put(&stored("c0", "c", now + 200)).unwrap();
        s.put(&stored("c1", "c", now + 201)).unwrap();
        assert!(
            s.get("b0", "b").unwrap().is_some(),
            "past the total, a gave way"
        );
        assert!(s.get("a97", "a").unwrap().is_none());
        assert!(s.get("c1", "c").unwrap().is_some());
    }
}
