//! The worker's job loop: take jobs from the queue, run several at once on the engine, answer, heartbeat.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tiergate_queue::{Job, QueueWorker, Reply, RerankReply, Taken};

use crate::engine::Engine;
use crate::fusion::fuse;

/// Loop settings.
#[derive(Debug, Clone, Copy)]
pub struct ServeConfig {
    /// Jobs run at once (each on its own thread; the engine batches them).
    pub max_concurrent: usize,
    /// Heartbeat period.
    pub heartbeat: Duration,
}

/// Serves jobs until the server shuts down or disappears. Returns the process exit code.
pub fn serve(worker: QueueWorker, engine: Arc<dyn Engine>, cfg: ServeConfig) -> i32 {
    let worker = Arc::new(worker);
    let hb = worker.clone();
    let period = cfg.heartbeat;
    // The heartbeat runs on its own thread: a long job must not look like a hang, a frozen process must.
    let spawned = std::thread::Builder::new()
        .name("heartbeat".into())
        .spawn(move || loop {
            if hb.should_exit() {
                tracing::info!("server gone or shutting down: exiting");
                std::process::exit(0);
            }
            hb.heartbeat();
            std::thread::sleep(period);
        });
    if let Err(e) = spawned {
        tracing::error!(error = %e, "cannot start the heartbeat thread");
        return 1;
    }
    worker.set_ready(true);
    tracing::info!(engine = engine.name(), "worker ready");
    let active = Arc::new(AtomicUsize::new(0));
    loop {
        if worker.should_exit() {
            return 0;
        }
        if active.load(Ordering::Acquire) >= cfg.max_concurrent.max(1) {
            std::thread::sleep(Duration::from_millis(1));
            continue;
        }
        let Some(taken) = worker.take(Duration::from_millis(100)) else {
            continue;
        };
        active.fetch_add(1, Ordering::AcqRel);
        let (engine, active2) = (engine.clone(), active.clone());
        let run = move || {
            run_job(engine.as_ref(), taken.job, taken.taken);
            active2.fetch_sub(1, Ordering::AcqRel);
        };
        if let Err(e) = std::thread::Builder::new().name("job".into()).spawn(run) {
            // The job's `Taken` was moved into the failed closure and dropped: it answered with an error.
            tracing::error!(error = %e, "cannot start a job thread");
            active.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// Runs one job and answers it.
pub fn run_job(engine: &dyn Engine, job: Job, mut taken: Taken) {
    if engine.on_job_start() {
        taken.corrupt(&[0xff, 0xff, 0xff, 0x7f, 9, b'g', b'a', b'r', b'b']);
        return;
    }
    match job {
        Job::Rerank {
            text,
            candidates,
            llm_weight,
        } => match engine.score(&text, &candidates) {
            Ok(scored) if scored.probs.len() == candidates.len() => {
                let tier0: Vec<f32> = candidates.iter().map(|c| c.p).collect();
                let fused = fuse(&tier0, &scored.probs, llm_weight);
                taken.reply(&Reply::Rerank(RerankReply {
                    llm: scored.probs,
                    fused,
                    prompt_tokens: scored.prompt_tokens,
                }));
            }
            Ok(_) => taken.fail("engine returned the wrong number of scores"),
            Err(e) => taken.fail(&e.to_string()),
        },
        Job::Generate { messages, sampling } => {
            let result = engine.generate(&messages, &sampling, &mut |t| taken.chunk(t));
            match result {
                Ok(usage) => taken.reply(&Reply::Generated(usage)),
                Err(e) => taken.fail(&e.to_string()),
            }
        }
    }
}
