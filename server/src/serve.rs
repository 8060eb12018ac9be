//! `tiergate serve`: build the state, start the utilisation sampler, accept connections (header-read timeout,
//! body timeout, graceful drain on SIGTERM/SIGINT), then stop the workers and remove the segment.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::ConnectInfo;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use tiergate_config::Config;
use tokio::net::TcpListener;
use tower::ServiceExt;

use crate::app::AppState;
use crate::routes::router;
use crate::util::sample_utilization;

/// Runs the server until `shutdown` resolves. `ready` receives the bound address (port 0 → real port).
pub async fn run(
    config: Config,
    worker_program: Option<PathBuf>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
    ready: Option<tokio::sync::oneshot::Sender<SocketAddr>>,
) -> anyhow::Result<()> {
    let metrics = crate::metrics::install().ok();
    let listener = TcpListener::bind(config.server.listen).await?;
    let addr = listener.local_addr()?;
    let cfg = config.clone();
    let state = Arc::new(
        tokio::task::spawn_blocking(move || AppState::build(cfg, metrics, worker_program))
            .await??,
    );
    tokio::spawn(sample_utilization(Arc::downgrade(&state)));
    let app = router(state.clone()).layer(tower_http::timeout::RequestBodyTimeoutLayer::new(
        Duration::from_millis(config.server.body_timeout_ms),
    ));
    tracing::info!(%addr, routes = ?state.route_order, "tiergate listening");
    if let Some(tx) = ready {
        let _ = tx.send(addr);
    }
    let graceful = GracefulShutdown::new();
    let header_timeout = Duration::from_millis(config.server.header_timeout_ms);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (stream, peer) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                };
                let app = app.clone();
                let service = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
                    req.extensions_mut().insert(ConnectInfo(peer));
                    app.clone().oneshot(req.map(axum::body::Body::new))
                });
                let conn = hyper::server::conn::http1::Builder::new()
                    .timer(TokioTimer::new())
                    .header_read_timeout(header_timeout)
                    .serve_connection(TokioIo::new(stream), service);
                let conn = graceful.watch(conn);
                tokio::spawn(async move {
                    if let Err(e) = conn.await {
                        tracing::debug!(error = %e, "connection ended with an error");
                    }
                });
            }
            () = &mut shutdown => break,
        }
    }
    drop(listener);
    let drain = Duration::from_millis(config.server.drain_ms);
    tracing::info!(?drain, "shutting down: draining in-flight requests");
    let t = Instant::now();
    if tokio::time::timeout(drain, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("drain deadline passed; closing remaining connections");
    }
    tracing::info!(took = ?t.elapsed(), "drained; stopping workers");
    // Dropping the last state reference stops the supervisor (workers exit) and unlinks the segment.
    drop(app);
    tokio::task::spawn_blocking(move || drop(state)).await?;
    Ok(())
}

/// Resolves on SIGTERM or SIGINT.
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
