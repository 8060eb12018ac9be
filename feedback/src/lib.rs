//! The local decision ledger: the [`tiergate_engine::ledger::Store`] of a server whose policy store is not
//! Redis — one SQLite file (`[feedback] path`) that survives restarts — mounted on the server as a
//! [`Product`] by the `tiergate` binary. The server itself never compiles SQLite (its in-memory ledger serves
//! the in-process tests); with the Redis policy store the ledger is Redis and this one is not used.

pub mod sqlite;

use std::sync::Arc;

use tiergate_config::Config;
use tiergate_engine::ledger::Store;
use tiergate_engine::state::AppState;
use tiergate_server::product::Product;

/// The product: no routes of its own (feedback and audits are the server's API), only the store.
#[derive(Debug, Default)]
pub struct LocalLedger;

impl Product for LocalLedger {
    fn routes(&self) -> axum::Router<Arc<AppState>> {
        axum::Router::new()
    }

    fn start(
        &self,
        _state: std::sync::Weak<AppState>,
        _stop: tokio::sync::watch::Receiver<bool>,
    ) -> Option<tokio::task::JoinHandle<()>> {
        None
    }

    fn ledger_store(&self, config: &Config) -> anyhow::Result<Option<Arc<dyn Store>>> {
        let f = &config.feedback;
        let store = sqlite::SqliteStore::open(&f.path, f.max_bytes, f.window_s)
            .map_err(|e| anyhow::anyhow!("feedback.path {}: {e}", f.path.display()))?;
        Ok(Some(Arc::new(store)))
    }
}
