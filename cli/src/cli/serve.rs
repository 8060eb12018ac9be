//! `tiergate serve`.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Args;

use super::ConfigArgs;

#[derive(Debug, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub config: ConfigArgs,
    /// Address to listen on (overrides server.listen); port 0 picks a free port.
    #[arg(long)]
    pub listen: Option<SocketAddr>,
    /// Address of the admin listener (overrides server.admin_listen); port 0 picks a free port.
    #[arg(long)]
    pub admin_listen: Option<SocketAddr>,
}

/// The worker program of a backend whose `program` is empty: `TIERGATE_WORKER_PROGRAM` where set, else the
/// binary shipped next to this one. It may not be there yet (`scripts/tiergate` serves while cargo still builds
/// it, and links it there when done): the supervisor starts it once it is.
pub fn worker_program() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("TIERGATE_WORKER_PROGRAM").filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    let exe = std::env::current_exe().ok()?;
    Some(exe.parent()?.join("tiergate-reranker"))
}

pub fn run(
    args: &ServeArgs,
    env: impl IntoIterator<Item = (String, String)>,
) -> anyhow::Result<()> {
    let mut cfg =
        tiergate_config::load(args.config.config.as_deref(), env, &args.config.overrides)?;
    if let Some(listen) = args.listen {
        cfg.server.listen = listen;
    }
    if let Some(listen) = args.admin_listen {
        cfg.server.admin_listen = listen;
    }
    cfg.server.validate("server")?;
    // Logs and traces: the config's OTLP settings, else the standard OTEL_* variables.
    let export = tiergate_telemetry::Export::resolve(
        &cfg.server.otlp_endpoint,
        cfg.server.otlp_protocol.as_str(),
        cfg.server.trace_sample_ratio,
        "tiergate",
        |k| std::env::var(k).ok(),
    )?;
    let telemetry = tiergate_telemetry::init(export)?;
    // The Batch API, served by the server over the engine's BatchService trait; its webhook key comes from the variable the config names.
    let secret = std::env::var(&cfg.batch.webhook_secret_env).unwrap_or_default();
    let batch = tiergate_batch::BatchApi::new(&cfg.batch, secret);
    // The durable (SQLite) ledger of decisions that feedback and audits join.
    let ledger_store = Some(tiergate_feedback::ledger_store(&cfg)?);
    // The Responses API's stored responses (SQLite), when `[responses] store` is on and the policy store is
    // not Redis.
    let responses_store = match cfg.policy_store.kind {
        tiergate_config::StoreKind::Memory => tiergate_feedback::responses_store(&cfg)?,
        tiergate_config::StoreKind::Redis => None,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let result = rt.block_on(async move {
        let (tx, rx) = tokio::sync::oneshot::channel::<tiergate_server::serve::Bound>();
        let reporter = tokio::spawn(async move {
            if let Ok(b) = rx.await {
                // Machine-readable lines on stdout, for scripts and tests that start us on port 0.
                println!("tiergate listening on http://{}", b.public);
                println!("tiergate admin listening on http://{}", b.admin);
            }
        });
        let result = tiergate_server::serve::run_with(
            cfg,
            worker_program(),
            tiergate_server::serve::Wiring {
                batches: Some(std::sync::Arc::new(batch)),
                ledger_store,
                responses_store,
            },
            tiergate_server::serve::shutdown_signal(),
            Some(tx),
        )
        .await;
        reporter.abort();
        result
    });
    drop(rt);
    drop(telemetry);
    result
}
