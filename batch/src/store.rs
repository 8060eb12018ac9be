//! The batch store: one SQLite database (files, batches, one row per finished request line) and the files'
//! bytes on disk, under `[batch] data_dir`. A line's result is committed as it finishes, so a killed server
//! resumes a batch where it stopped, and every input line ends with exactly one result (its primary key).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use rusqlite::{params, Connection, OptionalExtension};
use serde_json::{json, Value};

/// A stored file.
#[derive(Debug, Clone, PartialEq)]
pub struct FileRow {
    pub id: String,
    /// The tenant that created it (`default`: created before tenants, or on a server without them).
    pub owner: String,
    pub filename: String,
    pub purpose: String,
    pub bytes: u64,
    pub created_at: i64,
}

impl FileRow {
    /// The OpenAI `file` object.
    pub fn to_json(&self) -> Value {
        json!({"id": self.id, "object": "file", "bytes": self.bytes, "created_at": self.created_at,
               "filename": self.filename, "purpose": self.purpose, "status": "processed"})
    }
}

/// A batch.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchRow {
    pub id: String,
    /// The tenant that created it.
    pub owner: String,
    pub input_file_id: String,
    pub endpoint: String,
    pub completion_window: String,
    pub status: String,
    pub created_at: i64,
    pub in_progress_at: Option<i64>,
    pub finalizing_at: Option<i64>,
    pub completed_at: Option<i64>,
    pub failed_at: Option<i64>,
    pub cancelling_at: Option<i64>,
    pub cancelled_at: Option<i64>,
    pub output_file_id: Option<String>,
    pub error_file_id: Option<String>,
    /// `errors.data` when the input was refused.
    pub errors: Option<Value>,
    pub metadata: Option<Value>,
    pub total: u64,
    pub completed: u64,
    pub failed: u64,
}

impl BatchRow {
    /// The OpenAI `batch` object.
    pub fn to_json(&self) -> Value {
        json!({
            "id": self.id, "object": "batch", "endpoint": self.endpoint,
            "errors": self.errors.as_ref().map(|d| json!({"object": "list", "data": d})),
            "input_file_id": self.input_file_id, "completion_window": self.completion_window,
            "status": self.status, "output_file_id": self.output_file_id,
            "error_file_id": self.error_file_id, "created_at": self.created_at,
            "in_progress_at": self.in_progress_at, "expires_at": self.created_at + 24 * 3600,
            "finalizing_at": self.finalizing_at, "completed_at": self.completed_at,
            "failed_at": self.failed_at, "expired_at": null, "cancelling_at": self.cancelling_at,
            "cancelled_at": self.cancelled_at,
            "request_counts": {"total": self.total, "completed": self.completed, "failed": self.failed},
            "metadata": self.metadata,
        })
    }

    /// Still to run (or to finish cancelling).
    pub fn is_open(&self) -> bool {
        matches!(
            self.status.as_str(),
            "validating" | "in_progress" | "finalizing" | "cancelling"
        )
    }
}

/// The store.
pub struct Store {
    db: Mutex<Connection>,
    dir: PathBuf,
    /// Held while the process lives: one server per data directory.
    _lock: File,
}

fn now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// One owner's use of the store.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct OwnerUse {
    pub files: u64,
    pub bytes: u64,
    /// (status, batches), by status.
    pub batches: Vec<(String, u64)>,
}

/// A fresh id with `prefix` (`file-…`, `batch_…`).
pub fn new_id(prefix: &str) -> String {
    use rand::Rng;
    let n: u128 = rand::thread_rng().gen();
    format!("{prefix}{:024x}", n & ((1u128 << 96) - 1))
}

/// Removes the `*.part` files a stopped server left half written (called once the store's lock is held).
fn remove_parts(files: &Path) {
    let Ok(entries) = std::fs::read_dir(files) else {
        return;
    };
    for e in entries.flatten() {
        if e.path().extension().is_some_and(|x| x == "part") {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// The owner of what was stored before tenants existed.
pub const DEFAULT_OWNER: &str = "default";

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS files (
    id TEXT PRIMARY KEY, filename TEXT NOT NULL, purpose TEXT NOT NULL, bytes INTEGER NOT NULL,
    created_at INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS batches (
    id TEXT PRIMARY KEY, input_file_id TEXT NOT NULL, endpoint TEXT NOT NULL,
    completion_window TEXT NOT NULL, status TEXT NOT NULL, created_at INTEGER NOT NULL,
    in_progress_at INTEGER, finalizing_at INTEGER, completed_at INTEGER, failed_at INTEGER,
    cancelling_at INTEGER, cancelled_at INTEGER, output_file_id TEXT, error_file_id TEXT, errors TEXT,
    metadata TEXT, total INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS results (
    batch_id TEXT NOT NULL, line INTEGER NOT NULL, ok INTEGER NOT NULL, output TEXT NOT NULL,
    PRIMARY KEY (batch_id, line));
";

impl Store {
    /// Opens (creating) the store under `dir`; fails when another process holds it.
    pub fn open(dir: &Path) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir.join("files"))?;
        let lock = File::create(dir.join("lock"))?;
        // SAFETY: flock on a descriptor we own; LOCK_NB never blocks.
        let rc = unsafe {
            libc::flock(
                std::os::fd::AsRawFd::as_raw_fd(&lock),
                libc::LOCK_EX | libc::LOCK_NB,
            )
        };
        if rc != 0 {
            anyhow::bail!(
                "{} is in use by another tiergate process (one server per batch data directory)",
                dir.display()
            );
        }
        remove_parts(&dir.join("files"));
        let db = Connection::open(dir.join("batches.sqlite3"))?;
        db.execute_batch("PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL;")?;
        db.execute_batch(SCHEMA)?;
        // Stores written before tenants: their files and batches belong to the tenant named `default`.
        for table in ["files", "batches"] {
            let has: bool = db.query_row(
                &format!("SELECT COUNT(*) FROM pragma_table_info('{table}') WHERE name = 'owner'"),
                [],
                |r| r.get::<_, i64>(0).map(|n| n > 0),
            )?;
            if !has {
                db.execute_batch(&format!(
                    "ALTER TABLE {table} ADD COLUMN owner TEXT NOT NULL DEFAULT '{DEFAULT_OWNER}'"
                ))?;
            }
        }
        Ok(Self {
            db: Mutex::new(db),
            dir: dir.to_path_buf(),
            _lock: lock,
        })
    }

    fn db(&self) -> anyhow::Result<std::sync::MutexGuard<'_, Connection>> {
        self.db
            .lock()
            .map_err(|_| anyhow::anyhow!("batch store poisoned"))
    }

    /// Where a file's bytes live.
    pub fn file_path(&self, id: &str) -> PathBuf {
        self.dir.join("files").join(id)
    }

    /// All stored files' bytes.
    pub fn total_bytes(&self) -> anyhow::Result<u64> {
        let n: i64 =
            self.db()?
                .query_row("SELECT COALESCE(SUM(bytes), 0) FROM files", [], |r| {
                    r.get(0)
                })?;
        Ok(n as u64)
    }

    /// `owner`'s stored files' bytes.
    pub fn owner_bytes(&self, owner: &str) -> anyhow::Result<u64> {
        let n: i64 = self.db()?.query_row(
            "SELECT COALESCE(SUM(bytes), 0) FROM files WHERE owner = ?1",
            [owner],
            |r| r.get(0),
        )?;
        Ok(n as u64)
    }

    /// `owner`'s stored files.
    pub fn owner_files(&self, owner: &str) -> anyhow::Result<u64> {
        let n: i64 = self.db()?.query_row(
            "SELECT COUNT(*) FROM files WHERE owner = ?1",
            [owner],
            |r| r.get(0),
        )?;
        Ok(n as u64)
    }

    /// Deletes what is older than `retention_s`: finished batches (by when they ended) with their results, and
    /// files (by when they were made) that no unfinished batch reads — their bytes on disk too. Returns how
    /// many batches and files went.
    pub fn sweep(&self, retention_s: u64) -> anyhow::Result<(usize, usize)> {
        let cutoff = now().saturating_sub(i64::try_from(retention_s).unwrap_or(i64::MAX));
        let (batches, files) = {
            let mut db = self.db()?;
            let tx = db.transaction()?;
            let batches = tx.execute(
                "DELETE FROM results WHERE batch_id IN (SELECT id FROM batches WHERE status IN \
                 ('completed', 'failed', 'cancelled', 'expired') AND \
                 COALESCE(completed_at, failed_at, cancelled_at, created_at) < ?1)",
                [cutoff],
            )
            .and_then(|_| {
                tx.execute(
                    "DELETE FROM batches WHERE status IN ('completed', 'failed', 'cancelled', 'expired') \
                     AND COALESCE(completed_at, failed_at, cancelled_at, created_at) < ?1",
                    [cutoff],
                )
            })?;
            let gone: Vec<String> = {
                let mut q = tx.prepare(
                    "SELECT id FROM files WHERE created_at < ?1 AND id NOT IN (SELECT input_file_id \
                     FROM batches WHERE status IN ('validating', 'in_progress', 'finalizing', 'cancelling'))",
                )?;
                let rows = q.query_map([cutoff], |r| r.get(0))?;
                rows.collect::<rusqlite::Result<_>>()?
            };
            for id in &gone {
                tx.execute("DELETE FROM files WHERE id = ?1", [id])?;
            }
            tx.commit()?;
            (batches, gone)
        };
        for id in &files {
            let _ = std::fs::remove_file(self.file_path(id));
        }
        Ok((batches, files.len()))
    }

    /// `owner`'s unfinished batches (validating, in progress, finalizing, cancelling).
    pub fn owner_open_batches(&self, owner: &str) -> anyhow::Result<usize> {
        let n: i64 = self.db()?.query_row(
            "SELECT COUNT(*) FROM batches WHERE owner = ?1
               AND status IN ('validating', 'in_progress', 'finalizing', 'cancelling')",
            [owner],
            |r| r.get(0),
        )?;
        Ok(n as usize)
    }

    /// `owner`'s files, newest first, after the one named `after`.
    pub fn files(
        &self,
        owner: &str,
        after: Option<&str>,
        limit: usize,
    ) -> anyhow::Result<Vec<FileRow>> {
        let ids: Vec<String> = {
            let db = self.db()?;
            let mut q = db.prepare(
                "SELECT id FROM files WHERE owner = ?3
                   AND (?1 IS NULL OR rowid < (SELECT rowid FROM files WHERE id = ?1))
                 ORDER BY rowid DESC LIMIT ?2",
            )?;
            let rows = q.query_map(params![after, limit as i64, owner], |r| r.get(0))?;
            rows.collect::<Result<_, _>>()?
        };
        ids.iter()
            .filter_map(|id| self.file(id).transpose())
            .collect()
    }

    /// Per owner, by name: its files, their bytes, and its batches by status (the admin API's per-tenant view).
    pub fn by_owner(&self) -> anyhow::Result<std::collections::BTreeMap<String, OwnerUse>> {
        let db = self.db()?;
        let mut owners: std::collections::BTreeMap<String, OwnerUse> = Default::default();
        let mut q = db
            .prepare("SELECT owner, COUNT(*), COALESCE(SUM(bytes), 0) FROM files GROUP BY owner")?;
        for row in q.query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, i64>(1)?,
                r.get::<_, i64>(2)?,
            ))
        })? {
            let (owner, n, bytes) = row?;
            let e = owners.entry(owner).or_default();
            (e.files, e.bytes) = (n as u64, bytes as u64);
        }
        let mut q = db.prepare(
            "SELECT owner, status, COUNT(*) FROM batches GROUP BY owner, status ORDER BY status",
        )?;
        for row in q.query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, i64>(2)?,
            ))
        })? {
            let (owner, status, n) = row?;
            owners
                .entry(owner)
                .or_default()
                .batches
                .push((status, n as u64));
        }
        Ok(owners)
    }

    /// Stores `bytes` as a new file (written and synced before it is recorded).
    pub fn put_file(
        &self,
        owner: &str,
        filename: &str,
        purpose: &str,
        bytes: &[u8],
    ) -> anyhow::Result<FileRow> {
        let tmp = self.stage_path();
        let written = std::fs::write(&tmp, bytes)
            .map_err(anyhow::Error::from)
            .and_then(|()| self.put_staged(owner, filename, purpose, &tmp));
        if written.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        written
    }

    /// A fresh path in the store's directory for a file being written (`*.part`: removed at the next open if
    /// it was never stored).
    pub fn stage_path(&self) -> PathBuf {
        self.dir
            .join("files")
            .join(format!("{}.part", new_id("upload-")))
    }

    /// Stores the file written at `staged` (a [`Store::stage_path`]): synced, moved into place, then
    /// recorded.
    pub fn put_staged(
        &self,
        owner: &str,
        filename: &str,
        purpose: &str,
        staged: &Path,
    ) -> anyhow::Result<FileRow> {
        let file = File::open(staged)?;
        file.sync_all()?;
        let row = FileRow {
            id: new_id("file-"),
            owner: owner.to_string(),
            filename: filename.to_string(),
            purpose: purpose.to_string(),
            bytes: file.metadata()?.len(),
            created_at: now(),
        };
        std::fs::rename(staged, self.file_path(&row.id))?;
        self.db()?.execute(
            "INSERT INTO files (id, filename, purpose, bytes, created_at, owner) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            params![row.id, row.filename, row.purpose, row.bytes as i64, row.created_at, row.owner],
        )?;
        Ok(row)
    }

    /// A file's record.
    pub fn file(&self, id: &str) -> anyhow::Result<Option<FileRow>> {
        Ok(self
            .db()?
            .query_row(
                "SELECT id, filename, purpose, bytes, created_at, owner FROM files WHERE id = ?1",
                [id],
                |r| {
                    Ok(FileRow {
                        owner: r.get(5)?,
                        id: r.get(0)?,
                        filename: r.get(1)?,
                        purpose: r.get(2)?,
                        bytes: r.get::<_, i64>(3)? as u64,
                        created_at: r.get(4)?,
                    })
                },
            )
            .optional()?)
    }

    /// Records a new batch (status `validating`).
    pub fn create_batch(
        &self,
        owner: &str,
        input_file_id: &str,
        endpoint: &str,
        window: &str,
        metadata: Option<&Value>,
    ) -> anyhow::Result<BatchRow> {
        let id = new_id("batch_");
        self.db()?.execute(
            "INSERT INTO batches (id, input_file_id, endpoint, completion_window, status, created_at, metadata, owner)
             VALUES (?1, ?2, ?3, ?4, 'validating', ?5, ?6, ?7)",
            params![id, input_file_id, endpoint, window, now(), metadata.map(Value::to_string), owner],
        )?;
        self.batch(&id)?
            .ok_or_else(|| anyhow::anyhow!("batch vanished"))
    }

    /// A batch, with its request counts.
    pub fn batch(&self, id: &str) -> anyhow::Result<Option<BatchRow>> {
        let db = self.db()?;
        let row = db
            .query_row(
                "SELECT id, input_file_id, endpoint, completion_window, status, created_at, in_progress_at,
                        finalizing_at, completed_at, failed_at, cancelling_at, cancelled_at, output_file_id,
                        error_file_id, errors, metadata, total,
                        (SELECT COUNT(*) FROM results WHERE batch_id = b.id AND ok = 1),
                        (SELECT COUNT(*) FROM results WHERE batch_id = b.id AND ok = 0), owner
                 FROM batches b WHERE id = ?1",
                [id],
                |r| {
                    let json = |s: Option<String>| s.and_then(|s| serde_json::from_str(&s).ok());
                    Ok(BatchRow {
                        owner: r.get(19)?,
                        id: r.get(0)?,
                        input_file_id: r.get(1)?,
                        endpoint: r.get(2)?,
                        completion_window: r.get(3)?,
                        status: r.get(4)?,
                        created_at: r.get(5)?,
                        in_progress_at: r.get(6)?,
                        finalizing_at: r.get(7)?,
                        completed_at: r.get(8)?,
                        failed_at: r.get(9)?,
                        cancelling_at: r.get(10)?,
                        cancelled_at: r.get(11)?,
                        output_file_id: r.get(12)?,
                        error_file_id: r.get(13)?,
                        errors: json(r.get(14)?),
                        metadata: json(r.get(15)?),
                        total: r.get::<_, i64>(16)? as u64,
                        completed: r.get::<_, i64>(17)? as u64,
                        failed: r.get::<_, i64>(18)? as u64,
                    })
                },
            )
            .optional()?;
        Ok(row)
    }

    /// A batch's status alone (what the runner checks after each line).
    pub fn status(&self, id: &str) -> anyhow::Result<Option<String>> {
        Ok(self
            .db()?
            .query_row("SELECT status FROM batches WHERE id = ?1", [id], |r| {
                r.get(0)
            })
            .optional()?)
    }

    /// `owner`'s batches, newest first, after the one named `after`.
    pub fn list(
        &self,
        owner: &str,
        after: Option<&str>,
        limit: usize,
    ) -> anyhow::Result<Vec<BatchRow>> {
        let ids: Vec<String> = {
            let db = self.db()?;
            let mut q = db.prepare(
                "SELECT id FROM batches WHERE owner = ?3
                   AND (?1 IS NULL OR rowid < (SELECT rowid FROM batches WHERE id = ?1))
                 ORDER BY rowid DESC LIMIT ?2",
            )?;
            let rows = q.query_map(params![after, limit as i64, owner], |r| r.get(0))?;
            rows.collect::<Result<_, _>>()?
        };
        ids.iter()
            .filter_map(|id| self.batch(id).transpose())
            .collect()
    }

    /// The batches still to run, oldest first.
    pub fn open_batches(&self) -> anyhow::Result<Vec<String>> {
        let db = self.db()?;
        let mut q = db.prepare(
            "SELECT id FROM batches WHERE status IN ('validating', 'in_progress', 'finalizing', 'cancelling')
             ORDER BY rowid",
        )?;
        let rows = q.query_map([], |r| r.get(0))?;
        Ok(rows.collect::<Result<_, _>>()?)
    }

    /// Moves a batch to `status`, stamping `<status>_at`.
    pub fn set_status(&self, id: &str, status: &str) -> anyhow::Result<()> {
        let column = match status {
            "in_progress" => "in_progress_at",
            "finalizing" => "finalizing_at",
            "completed" => "completed_at",
            "failed" => "failed_at",
            "cancelling" => "cancelling_at",
            "cancelled" => "cancelled_at",
            other => anyhow::bail!("unknown batch status {other}"),
        };
        self.db()?.execute(
            &format!(
                "UPDATE batches SET status = ?2, {column} = COALESCE({column}, ?3) WHERE id = ?1"
            ),
            params![id, status, now()],
        )?;
        Ok(())
    }

    /// Moves a `validating` batch to `in_progress` (one conditional update: a cancel that came first stays).
    pub fn begin_running(&self, id: &str) -> anyhow::Result<()> {
        self.db()?.execute(
            "UPDATE batches SET status = 'in_progress', in_progress_at = COALESCE(in_progress_at, ?2)
             WHERE id = ?1 AND status = 'validating'",
            params![id, now()],
        )?;
        Ok(())
    }

    /// Moves an open batch to `finalizing`, atomically with [`Store::cancel`]: `false` when it was asked to
    /// stop first (it is `cancelling`, and ends `cancelled`). A cancel acknowledged is never overtaken.
    pub fn begin_finalizing(&self, id: &str) -> anyhow::Result<bool> {
        let n = self.db()?.execute(
            "UPDATE batches SET status = 'finalizing', finalizing_at = COALESCE(finalizing_at, ?2)
             WHERE id = ?1 AND status IN ('validating', 'in_progress')",
            params![id, now()],
        )?;
        Ok(n == 1)
    }

    /// Asks a batch to stop: `cancelling` when it is still open (the runner finishes it as `cancelled`).
    pub fn cancel(&self, id: &str) -> anyhow::Result<bool> {
        let n = self.db()?.execute(
            "UPDATE batches SET status = 'cancelling', cancelling_at = ?2
             WHERE id = ?1 AND status IN ('validating', 'in_progress')",
            params![id, now()],
        )?;
        Ok(n == 1)
    }

    /// Refuses a batch's input: `failed` with `errors`.
    pub fn fail(&self, id: &str, errors: &Value) -> anyhow::Result<()> {
        self.db()?.execute(
            "UPDATE batches SET errors = ?2 WHERE id = ?1",
            params![id, errors.to_string()],
        )?;
        self.set_status(id, "failed")
    }

    /// Records how many lines the input holds.
    pub fn set_total(&self, id: &str, total: usize) -> anyhow::Result<()> {
        self.db()?.execute(
            "UPDATE batches SET total = ?2 WHERE id = ?1",
            params![id, total as i64],
        )?;
        Ok(())
    }

    /// The lines of a batch that have a result.
    pub fn done_lines(&self, id: &str) -> anyhow::Result<std::collections::HashSet<usize>> {
        let db = self.db()?;
        let mut q = db.prepare("SELECT line FROM results WHERE batch_id = ?1")?;
        let rows = q.query_map([id], |r| r.get::<_, i64>(0))?;
        Ok(rows
            .map(|r| r.map(|n| n as usize))
            .collect::<Result<_, _>>()?)
    }

    /// Commits one line's result (a line already answered keeps its first result).
    pub fn put_result(
        &self,
        id: &str,
        line: usize,
        ok: bool,
        output: &Value,
    ) -> anyhow::Result<()> {
        self.db()?.execute(
            "INSERT OR IGNORE INTO results (batch_id, line, ok, output) VALUES (?1, ?2, ?3, ?4)",
            params![id, line as i64, ok, output.to_string()],
        )?;
        Ok(())
    }

    /// Writes the output and error files (results in line order, streamed from the database to disk) and
    /// records them on the batch.
    pub fn finish_files(&self, id: &str) -> anyhow::Result<()> {
        let owner = self
            .batch(id)?
            .map_or_else(|| DEFAULT_OWNER.to_string(), |b| b.owner);
        let (out, err) = (self.stage_path(), self.stage_path());
        let written = self
            .write_results(id, &out, &err)
            .and_then(|[n_out, n_err]| {
                let store = |n: u64, path: &Path, name: &str| -> anyhow::Result<Option<String>> {
                    if n == 0 {
                        let _ = std::fs::remove_file(path);
                        return Ok(None);
                    }
                    let name = format!("{id}_{name}.jsonl");
                    Ok(Some(
                        self.put_staged(&owner, &name, "batch_output", path)?.id,
                    ))
                };
                Ok((store(n_out, &out, "output")?, store(n_err, &err, "error")?))
            });
        let (out_id, err_id) = match written {
            Ok(ids) => ids,
            Err(e) => {
                let _ = (std::fs::remove_file(&out), std::fs::remove_file(&err));
                return Err(e);
            }
        };
        self.db()?.execute(
            "UPDATE batches SET output_file_id = ?2, error_file_id = ?3 WHERE id = ?1",
            params![id, out_id, err_id],
        )?;
        Ok(())
    }

    /// Writes batch `id`'s results to `out` (succeeded) and `err` (failed), one line each in line order;
    /// returns how many went to each.
    fn write_results(&self, id: &str, out: &Path, err: &Path) -> anyhow::Result<[u64; 2]> {
        use std::io::Write;
        let mut files = [
            std::io::BufWriter::new(File::create(out)?),
            std::io::BufWriter::new(File::create(err)?),
        ];
        let mut counts = [0u64; 2];
        let db = self.db()?;
        let mut q =
            db.prepare("SELECT ok, output FROM results WHERE batch_id = ?1 ORDER BY line")?;
        let mut rows = q.query([id])?;
        while let Some(r) = rows.next()? {
            let which = usize::from(!r.get::<_, bool>(0)?);
            let line = r.get_ref(1)?.as_str()?;
            files[which].write_all(line.as_bytes())?;
            files[which].write_all(b"\n")?;
            counts[which] += 1;
        }
        for f in &mut files {
            f.flush()?;
        }
        Ok(counts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_survive_a_reopen_and_one_process_holds_the_directory() {
        let dir = tempfile::tempdir().unwrap();
        let id;
        {
            let s = Store::open(dir.path()).unwrap();
            assert!(
                Store::open(dir.path()).is_err(),
                "a second store on the same directory"
            );
            let f = s
                .put_file("default", "in.jsonl", "batch", b"{}\n{}\n")
                .unwrap();
            assert_eq!(s.file(&f.id).unwrap().unwrap().bytes, 6);
            let b = s
                .create_batch("default", &f.id, "/v1/chat/completions", "24h", None)
                .unwrap();
            id = b.id.clone();
            s.set_total(&id, 3).unwrap();
            s.set_status(&id, "in_progress").unwrap();
            s.put_result(&id, 0, true, &json!({"custom_id": "a"}))
                .unwrap();
            // A line answered twice (a resume racing a late finish) keeps one result.
            s.put_result(&id, 0, false, &json!({"custom_id": "a-again"}))
                .unwrap();
            s.put_result(&id, 2, false, &json!({"custom_id": "c"}))
                .unwrap();
        }
        let s = Store::open(dir.path()).unwrap();
        assert_eq!(s.open_batches().unwrap(), vec![id.clone()]);
        assert_eq!(s.done_lines(&id).unwrap(), [0, 2].into_iter().collect());
        s.put_result(&id, 1, true, &json!({"custom_id": "b"}))
            .unwrap();
        s.finish_files(&id).unwrap();
        s.set_status(&id, "completed").unwrap();
        let b = s.batch(&id).unwrap().unwrap();
        assert_eq!((b.total, b.completed, b.failed), (3, 2, 1));
        assert!(!b.is_open() && b.completed_at.is_some());
        let out = std::fs::read_to_string(s.file_path(b.output_file_id.as_ref().unwrap())).unwrap();
        assert_eq!(out, "{\"custom_id\":\"a\"}\n{\"custom_id\":\"b\"}\n");
        let err = std::fs::read_to_string(s.file_path(b.error_file_id.as_ref().unwrap())).unwrap();
        assert_eq!(err, "{\"custom_id\":\"c\"}\n");
        assert_eq!(b.to_json()["request_counts"]["total"], 3);
        assert!(s.open_batches().unwrap().is_empty());
        assert!(
            !s.cancel(&id).unwrap(),
            "a finished batch cannot be cancelled"
        );
    }

    /// Past `retention_s`: finished batches go with their results, files go from the database and the disk —
    /// except the input of a batch still running; what is younger stays.
    #[test]
    fn the_sweep_deletes_what_is_past_its_retention() {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path()).unwrap();
        let old_in = s.put_file("t", "old.jsonl", "batch", b"{}\n").unwrap();
        let running_in = s.put_file("t", "run.jsonl", "batch", b"{}\n").unwrap();
        let fresh = s.put_file("t", "new.jsonl", "batch", b"{}\n").unwrap();
        let done = s
            .create_batch("t", &old_in.id, "/v1/chat/completions", "24h", None)
            .unwrap();
        s.put_result(&done.id, 0, true, &json!({"custom_id": "a"}))
            .unwrap();
        s.finish_files(&done.id).unwrap();
        s.set_status(&done.id, "completed").unwrap();
        let out = s.batch(&done.id).unwrap().unwrap().output_file_id.unwrap();
        let running = s
            .create_batch("t", &running_in.id, "/v1/chat/completions", "24h", None)
            .unwrap();
        // Everything but `fresh` and the running batch made (or ended) two days ago.
        {
            let db = s.db().unwrap();
            let ago = now() - 2 * 86_400;
            db.execute(
                "UPDATE files SET created_at = ?1 WHERE id != ?2",
                params![ago, fresh.id],
            )
            .unwrap();
            db.execute(
                "UPDATE batches SET created_at = ?1, completed_at = ?1 WHERE id = ?2",
                params![ago, done.id],
            )
            .unwrap();
        }
        assert_eq!(
            s.sweep(86_400).unwrap(),
            (1, 2),
            "the finished batch; its input and output files"
        );
        assert!(s.batch(&done.id).unwrap().is_none());
        assert!(s.done_lines(&done.id).unwrap().is_empty());
        for gone in [&old_in.id, &out] {
            assert!(
                s.file(gone).unwrap().is_none() && !s.file_path(gone).exists(),
                "{gone}"
            );
        }
        for kept in [&running_in.id, &fresh.id] {
            assert!(
                s.file(kept).unwrap().is_some() && s.file_path(kept).exists(),
                "{kept}"
            );
        }
        assert!(s.batch(&running.id).unwrap().is_some());
        assert_eq!(s.sweep(86_400).unwrap(), (0, 0));
    }
}
