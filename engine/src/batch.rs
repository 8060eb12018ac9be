//! What the engine asks of the Batch API, and what it offers it, as two traits the cli wires together: the
//! server mounts the HTTP routes of `/v1/files` and `/v1/batches` over a [`BatchService`] (it never sees the
//! store, SQLite, or the batch crate), and the service's runner has each line answered through a [`Door`]
//! the server gives it when it starts (the batch crate never sees the server). Objects are the API's own JSON
//! (a file, a batch, a page of them), built by the service; errors are [`BatchError`] kinds each door maps
//! to its shape.

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;

use serde_json::{Map, Value};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::backends::priority::BatchLine;
use crate::tenancy::tenants::TenantId;

/// Why the Batch API refused a call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchError {
    /// No such file or batch for this tenant (another tenant's is not said to exist), or the API is off.
    NotFound(String),
    /// A bad argument, named.
    Invalid {
        param: &'static str,
        message: String,
    },
    /// The tenant's quota (stored bytes, open batches) would be passed.
    Quota(String),
    /// The store is full or could not be opened.
    Unavailable(String),
    /// The store failed.
    Internal(String),
}

/// One page of a list, newest first.
#[derive(Debug, Clone, PartialEq)]
pub struct Page {
    pub data: Vec<Value>,
    /// Whether more follow the page's last item.
    pub more: bool,
}

/// An uploaded file as the door read it: its bytes were streamed to disk, at the path [`BatchService::stage`]
/// gave, and never held in memory.
pub struct Upload<'a> {
    pub purpose: Option<&'a str>,
    /// The file's name, where its bytes are and how many, when the upload had a file.
    pub file: Option<Staged<'a>>,
}

/// A file the door wrote to disk.
pub struct Staged<'a> {
    pub name: &'a str,
    pub path: &'a std::path::Path,
    pub bytes: u64,
}

/// The Batch API behind the server's routes. Every call is the tenant's own: ids of other tenants' files and
/// batches are not found.
pub trait BatchService: Send + Sync {
    /// The largest upload accepted (`batch.max_file_bytes`).
    fn max_file_bytes(&self) -> u64;
    /// Before an upload's body is read: refuses a file of `at_least` bytes (what its declared length says,
    /// less the door's framing) that would pass the tenant's `max_stored_bytes` or the store's size, and gives
    /// the path the door streams the file to (the door removes it unless [`BatchService::upload`] took it).
    fn stage(
        &self,
        engine: &crate::engine::Engine,
        tenant: &TenantId,
        at_least: u64,
    ) -> Result<PathBuf, BatchError>;
    /// Stores a staged upload (`purpose` must be `batch`), within the tenant's `max_stored_bytes` and the
    /// store's size: the file moves into the store.
    fn upload(
        &self,
        engine: &crate::engine::Engine,
        tenant: &TenantId,
        up: Upload<'_>,
    ) -> Result<Value, BatchError>;
    /// The tenant's files after `after`, at most `limit`.
    fn files(
        &self,
        tenant: &TenantId,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Page, BatchError>;
    /// One file's object.
    fn file(&self, tenant: &TenantId, id: &str) -> Result<Value, BatchError>;
    /// Where one file's content is.
    fn content(&self, tenant: &TenantId, id: &str) -> Result<PathBuf, BatchError>;
    /// Creates a batch from a request body (`input_file_id`, `endpoint`, `completion_window`, `metadata`).
    fn create(
        &self,
        engine: &crate::engine::Engine,
        tenant: &TenantId,
        body: &Value,
    ) -> Result<Value, BatchError>;
    /// One batch's object.
    fn batch(&self, tenant: &TenantId, id: &str) -> Result<Value, BatchError>;
    /// Moves an open batch to `cancelling`; its object after.
    fn cancel(&self, tenant: &TenantId, id: &str) -> Result<Value, BatchError>;
    /// The tenant's batches after `after`, at most `limit`.
    fn list(
        &self,
        tenant: &TenantId,
        after: Option<&str>,
        limit: usize,
    ) -> Result<Page, BatchError>;
    /// For the operator: per tenant, its files, their bytes and its batches by status; with `tenant`, also
    /// that tenant's newest batches.
    fn overview(&self, tenant: Option<&str>) -> Result<Value, BatchError>;
    /// Starts the runner, which answers lines through `door` until `stop` turns true; none while the API is
    /// off.
    fn start(
        &self,
        engine: crate::engine::WeakEngine,
        door: Arc<dyn Door>,
        stop: watch::Receiver<bool>,
    ) -> Option<JoinHandle<()>>;
}

/// A line's request as the runner hands it to a door.
pub struct LineRequest {
    /// The request body (a Chat Completions request; the runner turns streaming off).
    pub body: Value,
    /// The batch's owner: set in process, never by a client.
    pub tenant: TenantId,
    /// The marker that makes its LLM jobs batch work.
    pub line: BatchLine,
}

/// What a door answered for a line: the status, the body (the API's object or its error), and tiergate's
/// own headers as a map, since a batch result has no headers of its own.
#[derive(Debug, Clone)]
pub struct LineAnswer {
    pub status: u16,
    pub body: Value,
    pub headers: Map<String, Value>,
}

/// A door that answers one request in process, with the same validation, admission, tenant budget and
/// records as a live request through it.
pub trait Door: Send + Sync {
    /// Answers `req`; dropping the future cancels it (its LLM job with it).
    fn answer<'a>(
        &'a self,
        engine: &'a crate::engine::Engine,
        req: LineRequest,
    ) -> Pin<Box<dyn Future<Output = LineAnswer> + Send + 'a>>;
}
