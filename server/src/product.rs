//! A product served beside the OpenAI API by the same server (the Batch API is one, in its own crate): its
//! routes on the public listener, under the same outer layers (head limits, request ids, lame duck), and a
//! background task that runs while the server does.

use std::sync::{Arc, Weak};

use tokio::sync::watch;
use tokio::task::JoinHandle;

use tiergate_engine::state::AppState;

/// What the server mounts and runs for a product.
pub trait Product: Send + Sync {
    /// Its routes, merged into the public router.
    fn routes(&self) -> axum::Router<Arc<AppState>>;

    /// Its routes on the admin listener (each handler checks the admin token); none by default.
    fn admin_routes(&self) -> axum::Router<Arc<AppState>> {
        axum::Router::new()
    }

    /// The durable store of decision records it provides (the `[feedback]` ledger when the policy store is
    /// not Redis); none by default.
    fn ledger_store(
        &self,
        _config: &tiergate_config::Config,
    ) -> anyhow::Result<Option<Arc<dyn tiergate_engine::ledger::Store>>> {
        Ok(None)
    }

    /// Starts its background task once the state is built; `stop` turns true after the drain (in-flight
    /// requests have finished), and the server waits a few seconds for the task to end.
    fn start(&self, state: Weak<AppState>, stop: watch::Receiver<bool>) -> Option<JoinHandle<()>>;
}
