//! `tiergate serve`: build the state, start the utilisation sampler, accept connections on the public and the
//! admin listener (connection limits, header-read timeout), lame duck and drain on SIGTERM/SIGINT, then stop
//! the workers and remove the segment.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::ConnectInfo;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tiergate_config::Config;
use tokio::net::TcpListener;
use tower::ServiceExt;

use crate::routes::{admin_router_with, router_with};
use tiergate_engine::Engine;

/// Headers the HTTP layer parses at most (the router refuses more than [`crate::routes::MAX_HEADERS`]).
const HTTP_MAX_HEADERS: usize = 1024;
/// Bytes of request head the HTTP layer reads at most (the router refuses more than the configured limit).
const HTTP_MAX_HEAD_BYTES: usize = (1 << 20) + 64 * 1024;

/// After the lame duck: the listener closes once no connection has arrived for this long …
const QUIET: Duration = Duration::from_millis(50);
/// … or after this long at most.
const CLOSE_BOUND: Duration = Duration::from_secs(1);
/// Most connections taken from the backlog in the last sweep before the listener closes.
const BACKLOG_SWEEP: usize = 1024;

/// At the drain, how long a connection that has not begun a request yet gets to begin one (its client may have
/// sent it already; closing the connection would reset it). Bounded by the header timeout and the drain.
const FIRST_REQUEST_GRACE: Duration = Duration::from_secs(1);

/// The addresses the server listens on (port 0 in the config → the real port).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bound {
    /// The public listener (the OpenAI API, probes, metrics).
    pub public: SocketAddr,
    /// The admin listener (`/admin/*`, `/info`).
    pub admin: SocketAddr,
}

/// Runs the server until `shutdown` resolves. `ready` receives the bound addresses.
///
/// At `shutdown`: `/ready` turns 503 and every response says `Connection: close` for `server.lame_duck_ms`
/// while the listener still accepts (load balancers see the probe and stop sending); then the listeners close,
/// idle connections are closed and in-flight requests finish within `server.drain_ms`.
pub async fn run(
    config: Config,
    worker_program: Option<PathBuf>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ready: Option<tokio::sync::oneshot::Sender<Bound>>,
) -> anyhow::Result<()> {
    run_with(config, worker_program, Wiring::default(), shutdown, ready).await
}

/// Connections refused at accept (the listener's connection limits).
pub const CONNECTIONS_REFUSED: &str = "tiergate_connections_refused_total";

/// What a binary wires into the server besides the config: the Batch API (its routes on both listeners, its
/// runner answering lines through the in-process chat door and stopped after the drain), and the durable
/// store of decision records (the `[feedback]` ledger when the policy store is not Redis).
#[derive(Default)]
pub struct Wiring {
    pub batches: Option<Arc<dyn tiergate_engine::batch::BatchService>>,
    /// The Responses API's durable store (`[responses] store` without the Redis policy store).
    pub responses_store: Option<Arc<dyn tiergate_engine::answer::stored::ResponseStore>>,
    pub ledger_store: Option<Arc<dyn tiergate_engine::evidence::ledger::Store>>,
}

/// [`run`] with what `wiring` adds.
pub async fn run_with(
    config: Config,
    worker_program: Option<PathBuf>,
    wiring: Wiring,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ready: Option<tokio::sync::oneshot::Sender<Bound>>,
) -> anyhow::Result<()> {
    let metrics = tiergate_engine::metrics::install().ok();
    metrics::describe_counter!(
        CONNECTIONS_REFUSED,
        "Connections refused at accept by server.max_connections or max_connections_per_peer"
    );
    let listener = TcpListener::bind(config.server.listen).await?;
    let admin_listener = TcpListener::bind(config.server.admin_listen).await?;
    let addr = listener.local_addr()?;
    let admin_addr = admin_listener.local_addr()?;
    let cfg = config.clone();
    let engine = tokio::task::spawn_blocking(move || {
        Engine::build(cfg, metrics, worker_program, wiring.ledger_store)
    })
    .await??;
    reload_tenants_on_sighup(&engine);
    let (stop_batches, batches_stopped) = tokio::sync::watch::channel(false);
    let batches = wiring.batches;
    let responses_store = wiring.responses_store;
    let tasks = start_background(&engine, batches.as_ref(), batches_stopped);
    if config.server.admin_token.is_none() {
        tracing::warn!(
            %admin_addr,
            "no server.admin_token: every loopback client of the admin listener is admin"
        );
    }
    let shadowed = config.shadowed_reranker_fields();
    if !shadowed.is_empty() {
        tracing::warn!(
            fields = ?shadowed,
            "[reranker] sets fields every [[llm]] entry sets too: the entries' values win, these have no effect"
        );
    }
    if config.all_tenants().is_ok_and(|t| t.is_empty()) && !addr.ip().is_loopback() {
        tracing::warn!(
            %addr,
            "no [[tenants]]: the public API is open to every client that reaches it"
        );
    }
    tracing::info!(%addr, routes = ?config.routes.iter().map(|r| &r.name).collect::<Vec<_>>(), tenants = config.tenants.len(), "tiergate listening");
    tracing::info!(%admin_addr, "tiergate admin listening");
    if let Some(tx) = ready {
        let _ = tx.send(Bound {
            public: addr,
            admin: admin_addr,
        });
    }
    let graceful = Arc::new(Drain::new());
    let header_timeout = Duration::from_millis(config.server.header_timeout_ms);
    let stop = Arc::new(tokio::sync::Notify::new());
    let limits = Arc::new(ConnLimits::new(
        config.server.max_connections,
        config.server.max_connections_per_peer,
    ));
    let public = tokio::spawn(accept_loop(
        listener,
        router_with(engine.clone(), batches.as_ref(), responses_store),
        Some(limits),
        header_timeout,
        graceful.clone(),
        stop.clone(),
    ));
    let admin = tokio::spawn(accept_loop(
        admin_listener,
        admin_router_with(engine.clone(), batches.as_ref()),
        None,
        header_timeout,
        graceful.clone(),
        stop.clone(),
    ));
    shutdown.await;
    engine.drain();
    let lame = Duration::from_millis(config.server.lame_duck_ms);
    tracing::info!(
        ?lame,
        "shutting down: lame duck (/ready 503, Connection: close)"
    );
    tokio::time::sleep(lame).await;
    stop.notify_waiters();
    let _ = tokio::join!(public, admin);
    let drain = Duration::from_millis(config.server.drain_ms);
    tracing::info!(?drain, "listeners closed: draining in-flight requests");
    let t = Instant::now();
    if tokio::time::timeout(drain, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("drain deadline passed; closing remaining connections");
    }
    // The batch runner stops between lines (a line cut short runs again at the next start).
    let _ = stop_batches.send(true);
    stop_tasks(tasks).await;
    tracing::info!(took = ?t.elapsed(), "drained; stopping workers");
    // The answers' records still waiting for the writer are written before the process goes; dropping the
    // last handle stops the supervisor (workers exit) and unlinks the segment.
    engine.shutdown(Duration::from_secs(5)).await;
    Ok(())
}

/// Starts the engine's background tasks ([`tiergate_engine::tasks::start`]) and the Batch API's runner,
/// given the in-process chat door to answer its lines; the runner is returned to be awaited at shutdown.
fn start_background(
    engine: &Engine,
    batches: Option<&Arc<dyn tiergate_engine::batch::BatchService>>,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    engine.start();
    let door = Arc::new(crate::routes::in_process::ChatDoor);
    batches
        .and_then(|b| b.start(engine.downgrade(), door, stop))
        .into_iter()
        .collect()
}

/// Waits up to 5 s for each stopped task.
async fn stop_tasks(tasks: Vec<tokio::task::JoinHandle<()>>) {
    for task in tasks {
        if tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .is_err()
        {
            tracing::warn!("a background task did not stop within 5 s");
        }
    }
}

/// Accepts connections until `stop` is notified, each served by `app` under the connection limits. At `stop`
/// the connections already waiting in the kernel's backlog are accepted and served too (closing a listener
/// resets them, and their clients may have sent a request already).
async fn accept_loop(
    listener: TcpListener,
    app: axum::Router,
    limits: Option<Arc<ConnLimits>>,
    header_timeout: Duration,
    graceful: Arc<Drain>,
    stop: Arc<tokio::sync::Notify>,
) {
    let serve = |stream, peer| {
        serve_conn(
            stream,
            peer,
            &app,
            limits.as_ref(),
            header_timeout,
            &graceful,
        )
    };
    let stopped = stop.notified();
    tokio::pin!(stopped);
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => serve(stream, peer),
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
            () = &mut stopped => break,
        }
    }
    // Then keep accepting until no connection has arrived for QUIET (a load balancer that saw `/ready` turn
    // 503 has stopped sending by now), at most CLOSE_BOUND: a connection still arriving as the listener closes
    // would be reset with its request unanswered.
    let bound = Instant::now() + CLOSE_BOUND;
    loop {
        let wait = QUIET.min(bound.saturating_duration_since(Instant::now()));
        match tokio::time::timeout(wait, listener.accept()).await {
            Ok(Ok((stream, peer))) => serve(stream, peer),
            _ => break,
        }
    }
    // At the bound, connections may still wait in the backlog (clients that kept arriving, or a runtime too
    // busy to accept them in time): take every one already there (a bounded sweep) before the listener closes.
    for _ in 0..BACKLOG_SWEEP {
        match tokio::time::timeout(Duration::ZERO, listener.accept()).await {
            Ok(Ok((stream, peer))) => serve(stream, peer),
            _ => break,
        }
    }
}

/// Serves one accepted connection (or refuses it when over the limits).
fn serve_conn(
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    app: &axum::Router,
    limits: Option<&Arc<ConnLimits>>,
    header_timeout: Duration,
    graceful: &Drain,
) {
    let guard = match limits.map(|l| l.admit(peer)) {
        Some(Err(why)) => return refuse(stream, why),
        Some(Ok(g)) => Some(g),
        None => None,
    };
    let app = app.clone();
    let begun = Arc::new(tokio::sync::Notify::new());
    let first = begun.clone();
    let service = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
        first.notify_one();
        req.extensions_mut().insert(ConnectInfo(peer));
        app.clone().oneshot(req.map(axum::body::Body::new))
    });
    // The HTTP layer's own limits sit above the configured ones, so that requests over the configured limits
    // reach the router and get a 431 with a body (the HTTP layer's 431 has none).
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout)
        .max_headers(HTTP_MAX_HEADERS)
        .max_header_size(HTTP_MAX_HEAD_BYTES)
        .max_buf_size(HTTP_MAX_HEAD_BYTES + 64 * 1024)
        .serve_connection(TokioIo::new(stream), service);
    let grace = FIRST_REQUEST_GRACE.min(header_timeout);
    let conn = graceful.watch(conn, begun, grace);
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(error = %e, "connection ended with an error");
        }
        drop(guard);
    });
}

/// The drain of open connections: at `shutdown`, a connection serving a request finishes it (its response
/// says `Connection: close`), an idle keep-alive connection closes, and a connection that has not begun its
/// first request gets a grace to begin one (as Go's `http.Server.Shutdown` spares new connections).
struct Drain {
    tx: tokio::sync::watch::Sender<bool>,
}

impl Drain {
    fn new() -> Self {
        Self {
            tx: tokio::sync::watch::channel(false).0,
        }
    }

    /// `conn`, shut down gracefully at the drain; `begun` is notified when a request has begun on it.
    fn watch<I, S>(
        &self,
        conn: hyper::server::conn::http1::Connection<I, S>,
        begun: Arc<tokio::sync::Notify>,
        grace: Duration,
    ) -> impl std::future::Future<Output = hyper::Result<()>> + use<I, S>
    where
        S: hyper::service::HttpService<Incoming>,
        S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
        I: hyper::rt::Read + hyper::rt::Write + Unpin + 'static,
        S::ResBody: 'static,
        <S::ResBody as hyper::body::Body>::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    {
        let mut rx = self.tx.subscribe();
        async move {
            tokio::pin!(conn);
            tokio::select! {
                r = conn.as_mut() => return r,
                _ = rx.wait_for(|draining| *draining) => {}
            }
            // A request that has begun holds a permit (or takes it now); otherwise wait for one, briefly.
            tokio::select! {
                r = conn.as_mut() => return r,
                _ = tokio::time::timeout(grace, begun.notified()) => {}
            }
            conn.as_mut().graceful_shutdown();
            let r = conn.await;
            drop(rx);
            r
        }
    }

    /// Signals the drain and waits until every watched connection has ended.
    async fn shutdown(&self) {
        let _ = self.tx.send(true);
        self.tx.closed().await;
    }
}

/// Answers a connection over the limits with a 503 in the OpenAI error shape (best effort, never blocking) and
/// closes it.
fn refuse(stream: tokio::net::TcpStream, why: &'static str) {
    let body = crate::error::ApiError::Overloaded {
        message: why.into(),
        retry_after_s: 1,
    }
    .body()
    .to_string();
    let resp = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\n\
         connection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.try_write(resp.as_bytes());
    metrics::counter!(CONNECTIONS_REFUSED).increment(1);
}

/// Open connections, overall and per client IP.
struct ConnLimits {
    max: usize,
    per_peer: usize,
    open: std::sync::Mutex<(usize, HashMap<IpAddr, usize>)>,
}

/// Releases a connection's place when the connection ends.
struct ConnGuard {
    limits: Arc<ConnLimits>,
    ip: IpAddr,
}

impl ConnLimits {
    fn new(max: usize, per_peer: usize) -> Self {
        Self {
            max,
            per_peer,
            open: std::sync::Mutex::new((0, HashMap::new())),
        }
    }

    fn admit(self: &Arc<Self>, peer: SocketAddr) -> Result<ConnGuard, &'static str> {
        let ip = peer.ip().to_canonical();
        let mut open = self.open.lock().map_err(|_| "connection table poisoned")?;
        if open.0 >= self.max {
            return Err("server at its connection limit (server.max_connections)");
        }
        let mine = open.1.entry(ip).or_insert(0);
        if *mine >= self.per_peer {
            return Err("too many connections from this address (server.max_connections_per_peer)");
        }
        *mine += 1;
        open.0 += 1;
        Ok(ConnGuard {
            limits: self.clone(),
            ip,
        })
    }
}

impl Drop for ConnGuard {
    fn drop(&mut self) {
        if let Ok(mut open) = self.limits.open.lock() {
            open.0 = open.0.saturating_sub(1);
            if let Some(n) = open.1.get_mut(&self.ip) {
                *n -= 1;
                if *n == 0 {
                    open.1.remove(&self.ip);
                }
            }
        }
    }
}

/// Resolves on SIGTERM or SIGINT.
/// SIGHUP reloads the tenants (`Engine::reload_tenants`: a file that fails to load keeps the keys in force).
fn reload_tenants_on_sighup(engine: &Engine) {
    let weak = engine.downgrade();
    tokio::spawn(async move {
        use tokio::signal::unix::{signal, SignalKind};
        let Ok(mut hup) = signal(SignalKind::hangup()) else {
            tracing::warn!("cannot listen for SIGHUP: tenants reload through the admin API only");
            return;
        };
        while hup.recv().await.is_some() {
            let Some(engine) = weak.upgrade() else { break };
            let _ = engine.reload_tenants();
        }
    });
}

pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
}
