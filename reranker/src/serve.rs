//! The worker's job loop: take jobs from the queue, run several at once on the engine, answer, heartbeat.

use std::sync::Arc;
use std::time::Duration;

use tiergate_queue::{Job, QueueWorker, Reply, RerankReply, Taken, TakenJob};

use crate::engine::Engine;
use crate::trace::JobTrace;

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
    if let Err(e) = start_heartbeat(&worker, cfg.heartbeat) {
        tracing::error!(error = %e, "cannot start the heartbeat thread");
        return 1;
    }
    worker.set_ready(true);
    tracing::info!(engine = engine.name(), "worker ready");
    // A fixed set of job threads, each taking jobs itself: no thread spawn and no hand-off on the job path.
    // Generations (long) may occupy all threads but one, so reranks (short, on the request path) always have
    // a thread.
    let threads_n = cfg.max_concurrent.max(1);
    let generations = Arc::new(GenerationSlots::new(threads_n.saturating_sub(1).max(1)));
    let mut threads = Vec::new();
    for i in 0..threads_n {
        let (worker, engine, generations) = (worker.clone(), engine.clone(), generations.clone());
        let spawned = std::thread::Builder::new()
            .name(format!("job-{i}"))
            .spawn(move || {
                // The heartbeat thread ends the process when the server is gone; here only the flag.
                while !worker.shutdown_requested() {
                    if let Some((taken, generating)) = generations.take(&worker) {
                        run_job(engine.as_ref(), taken);
                        generations.release(generating);
                    }
                }
            });
        match spawned {
            Ok(t) => threads.push(t),
            Err(e) => tracing::error!(error = %e, "cannot start a job thread"),
        }
    }
    if threads.is_empty() {
        return 1;
    }
    for t in threads {
        let _ = t.join();
    }
    0
}

/// Starts the heartbeat thread: liveness and busy time every `period`, and the process's exit when the server
/// is gone or shutting down. It runs on its own thread: a long job must not look like a hang, a frozen process
/// must.
pub fn start_heartbeat(worker: &Arc<QueueWorker>, period: Duration) -> std::io::Result<()> {
    let hb = worker.clone();
    std::thread::Builder::new()
        .name("heartbeat".into())
        .spawn(move || loop {
            if hb.should_exit() {
                tracing::info!("server gone or shutting down: exiting");
                tiergate_telemetry::flush();
                std::process::exit(0);
            }
            hb.heartbeat();
            std::thread::sleep(period);
        })
        .map(|_| ())
}

/// How many job threads (or requests in flight) may run generations at once.
pub struct GenerationSlots {
    limit: usize,
    running: std::sync::atomic::AtomicUsize,
}

impl GenerationSlots {
    /// At most `limit` generations at once.
    pub fn new(limit: usize) -> Self {
        Self {
            limit,
            running: std::sync::atomic::AtomicUsize::new(0),
        }
    }

    /// Reserves a place for a generation; false when all are taken (then take reranks only).
    pub fn reserve(&self) -> bool {
        use std::sync::atomic::Ordering::AcqRel;
        let prev = self.running.fetch_add(1, AcqRel);
        if prev < self.limit {
            return true;
        }
        self.running.fetch_sub(1, AcqRel);
        false
    }

    /// Takes the next job (waiting up to 100 ms), a generation only if a place is free; returns it and
    /// whether it holds a generation place, to give back with [`GenerationSlots::release`] when it ends.
    pub fn take(&self, worker: &QueueWorker) -> Option<(TakenJob, bool)> {
        let reserved = self.reserve();
        let Some(taken) = worker.take(Duration::from_millis(100), reserved) else {
            self.release(reserved);
            return None;
        };
        let generating = matches!(taken.job, Job::Generate { .. });
        self.release(reserved && !generating);
        Some((taken, generating))
    }

    /// Gives back a place reserved with [`GenerationSlots::reserve`] (when `held`).
    pub fn release(&self, held: bool) {
        if held {
            self.running
                .fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
        }
    }
}

/// Answers a rerank job with the engine's scores (the server fuses them with Tier-0's distribution).
pub fn answer_rerank(
    mut taken: Taken,
    candidates: &[tiergate_queue::Candidate],
    scored: Result<crate::engine::Scored, crate::engine::EngineError>,
) {
    match scored {
        Ok(scored) if scored.scores.len() == candidates.len() => {
            taken.reply(&Reply::Rerank(RerankReply {
                scores: scored.scores,
                prompt_tokens: scored.prompt_tokens,
            }));
        }
        Ok(_) => taken.fail("engine returned the wrong number of scores"),
        Err(e) => taken.fail(&e.to_string()),
    }
}

/// Answers a generation job with its usage, or its error. A generation cut because a chunk did not fit the
/// response area (not because the job was cancelled) ends as `length`, as a token limit would.
pub fn answer_generation(
    mut taken: Taken,
    result: Result<tiergate_queue::Usage, crate::engine::EngineError>,
) {
    match result {
        Ok(mut usage) => {
            if taken.response_full() {
                usage.finish_reason = "length".into();
            }
            taken.reply(&Reply::Generated(usage))
        }
        Err(e) => taken.fail(&e.to_string()),
    }
}

/// Runs one job and answers it, in the job's span.
pub fn run_job(engine: &dyn Engine, job: TakenJob) {
    let (job, mut taken, mut spans) = JobTrace::of(job);
    let _in_span = spans.span().clone().entered();
    if engine.on_job_start() {
        taken.corrupt(&[0xff, 0xff, 0xff, 0x7f, 9, b'g', b'a', b'r', b'b']);
        return;
    }
    match job {
        Job::Rerank {
            text,
            candidates,
            prompt,
        } => {
            let scored = engine.score(&text, &candidates, &prompt, &|| taken.cancelled());
            spans.scored(candidates.len(), &scored);
            answer_rerank(taken, &candidates, scored);
        }
        Job::Generate { messages, sampling } => {
            let result = engine.generate(&messages, &sampling, &mut |t| {
                spans.token();
                taken.chunk(t)
            });
            spans.generated(&result);
            answer_generation(taken, result);
        }
    }
}
