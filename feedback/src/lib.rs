//! The local SQLite stores of a server whose policy store is not Redis, each a file that survives restarts,
//! wired in by the `tiergate` binary: the decision ledger ([`ledger_store`], `[feedback] path`) and the
//! Responses API's stored responses ([`responses_store`], `[responses] path`). The server never compiles
//! SQLite (in-memory stores serve the in-process tests); with the Redis policy store both live in Redis and
//! these are not used.

pub mod responses;
pub mod sqlite;

use std::sync::Arc;

use tiergate_config::Config;
use tiergate_engine::answer::stored::ResponseStore;
use tiergate_engine::evidence::ledger::Store;

/// Opens the ledger file `[feedback] path` (bounded by `max_bytes` and `max_per_tenant`, records kept for
/// `window_s`).
pub fn ledger_store(config: &Config) -> anyhow::Result<Arc<dyn Store>> {
    let f = &config.feedback;
    let store = sqlite::SqliteStore::open(&f.path, f.max_bytes, f.window_s)
        .map_err(|e| anyhow::anyhow!("feedback.path {}: {e}", f.path.display()))?;
    Ok(Arc::new(store.per_tenant(f.max_per_tenant)))
}

/// Opens the stored responses' file `[responses] path` when `[responses] store` is on (`None` when off).
pub fn responses_store(config: &Config) -> anyhow::Result<Option<Arc<dyn ResponseStore>>> {
    let r = &config.responses;
    if !r.store {
        return Ok(None);
    }
    let store = responses::SqliteResponses::open(&r.path, r.ttl_s, r.max_entries, r.max_per_tenant)
        .map_err(|e| anyhow::anyhow!("responses.path {}: {e}", r.path.display()))?;
    Ok(Some(Arc::new(store)))
}
