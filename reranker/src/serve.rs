//! The worker's job loop: take jobs from the queue, run several at once on the engine, answer, heartbeat.

use std::sync::Arc;
use std::time::Duration;

use std::future::Future;

use tiergate_config::PromptConfig;
use tiergate_queue::{
    Candidate, Job, Message, QueueWorker, Reply, RerankReply, Sampling, Taken, TakenJob, Tools,
    Usage,
};

use crate::engine::{Engine, EngineError, Piece, Scored};
use crate::trace::JobTrace;

/// Loop settings.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// Jobs run at once (each on its own thread; the engine batches them).
    pub max_concurrent: usize,
    /// Heartbeat period.
    pub heartbeat: Duration,
    /// Rerank jobs scored before the worker says it is ready (the server's warm-up), and the most time they
    /// may take.
    pub warmup: Vec<Job>,
    pub warmup_budget: Duration,
}

/// Serves jobs until the server shuts down or disappears. Returns the process exit code.
pub fn serve(worker: QueueWorker, engine: Arc<dyn Engine>, cfg: ServeConfig) -> i32 {
    let worker = Arc::new(worker);
    if let Err(e) = start_heartbeat(&worker, cfg.heartbeat) {
        tracing::error!(error = %e, "cannot start the heartbeat thread");
        return 1;
    }
    warm(engine.as_ref(), &cfg.warmup, cfg.warmup_budget);
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

/// Scores the warm-up jobs one after another (the heartbeat runs; the worker is not ready yet), stopping at
/// `budget`: the label prefixes and the first passes are then built before the first real escalation.
/// A failing job is logged and skipped: a warm-up never keeps a worker from serving.
pub fn warm(engine: &dyn Engine, jobs: &[Job], budget: Duration) {
    if jobs.is_empty() {
        return;
    }
    let start = std::time::Instant::now();
    let over = || start.elapsed() >= budget;
    let mut done = 0;
    for job in jobs {
        let Job::Rerank {
            text,
            candidates,
            prompt,
        } = job
        else {
            continue;
        };
        if over() {
            break;
        }
        match engine.score(text, candidates, prompt, &over) {
            Ok(_) => done += 1,
            Err(EngineError::Cancelled) => break,
            Err(e) => tracing::warn!(error = %e, "warm-up job failed"),
        }
    }
    tracing::info!(
        jobs = done,
        of = jobs.len(),
        seconds = start.elapsed().as_secs_f64(),
        complete = done == jobs.len(),
        "warm-up done"
    );
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

/// How an engine runs a job's work: in place (the local engines: mistralrs, the scoring forward, the stub) or
/// against its upstream (the remote `openai` engine). [`dispatch`] is the one job path both take.
pub(crate) trait Runner {
    /// The stub's fault knob: answer with a corrupt frame instead of running.
    fn corrupts(&self) -> bool {
        false
    }

    /// Scores `candidates` for `text` (`left`: the job's time left; `cancelled`: the submitter gave up).
    async fn score(
        &self,
        text: &str,
        candidates: &[Candidate],
        prompt: &PromptConfig,
        cancelled: &(dyn Fn() -> bool + Sync),
        left: Option<Duration>,
    ) -> Result<Scored, EngineError>;

    /// Generates, calling `on_piece` with each chunk and tool call (false: stop).
    async fn generate(
        &self,
        messages: &[Message],
        sampling: &Sampling,
        tools: Option<&Tools>,
        on_piece: &mut (dyn FnMut(Piece<'_>) -> bool + Send),
        left: Option<Duration>,
    ) -> Result<Usage, EngineError>;
}

/// A local engine: its calls finish in place.
struct InPlace<'a>(&'a dyn Engine);

impl Runner for InPlace<'_> {
    fn corrupts(&self) -> bool {
        self.0.on_job_start()
    }

    async fn score(
        &self,
        text: &str,
        candidates: &[Candidate],
        prompt: &PromptConfig,
        cancelled: &(dyn Fn() -> bool + Sync),
        _left: Option<Duration>,
    ) -> Result<Scored, EngineError> {
        self.0.score(text, candidates, prompt, &|| cancelled())
    }

    async fn generate(
        &self,
        messages: &[Message],
        sampling: &Sampling,
        tools: Option<&Tools>,
        on_piece: &mut (dyn FnMut(Piece<'_>) -> bool + Send),
        _left: Option<Duration>,
    ) -> Result<Usage, EngineError> {
        self.0
            .generate(messages, sampling, tools, &mut |p| on_piece(p))
    }
}

/// Runs one job on a local engine and answers it, in the job's span.
pub fn run_job(engine: &dyn Engine, job: TakenJob) {
    let runner = InPlace(engine);
    let mut run = std::pin::pin!(dispatch(&runner, job));
    // A local engine's calls never wait: the job is done at the first poll.
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    while run.as_mut().poll(&mut cx).is_pending() {
        std::thread::yield_now();
    }
}

/// Runs one job and answers it, in the job's span: the one job path of every engine.
pub(crate) async fn dispatch(runner: &impl Runner, job: TakenJob) {
    use tracing::Instrument;
    let (job, mut taken, mut spans) = JobTrace::of(job);
    let span = spans.span().clone();
    async move {
        if runner.corrupts() {
            taken.corrupt(&[0xff, 0xff, 0xff, 0x7f, 9, b'g', b'a', b'r', b'b']);
            return;
        }
        let left = taken.time_left();
        match job {
            Job::Rerank {
                text,
                candidates,
                prompt,
            } => {
                let cancelled = || taken.cancelled();
                let scored = runner
                    .score(&text, &candidates, &prompt, &cancelled, left)
                    .await;
                spans.scored(candidates.len(), &scored);
                answer_rerank(taken, &candidates, scored);
            }
            Job::Generate {
                messages,
                sampling,
                tools,
            } => {
                let result = runner
                    .generate(
                        &messages,
                        &sampling,
                        tools.as_ref(),
                        &mut |p| {
                            tiergate_queue::worker::note_progress();
                            match p {
                                Piece::Text(t) => {
                                    spans.token();
                                    taken.chunk(t)
                                }
                                Piece::Call(c) => {
                                    spans.token();
                                    taken.tool_call(&c)
                                }
                                Piece::Progress => !taken.cancelled(),
                            }
                        },
                        left,
                    )
                    .await;
                spans.generated(&result);
                answer_generation(taken, result);
            }
        }
    }
    .instrument(span)
    .await
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// An engine whose scoring takes `each` and counts its calls (what `warm` does with jobs is the question
    /// here, not what a model does with them).
    struct Counting {
        each: Duration,
        calls: AtomicUsize,
    }

    impl Engine for Counting {
        fn name(&self) -> &str {
            "counting"
        }
        fn score(
            &self,
            _: &str,
            candidates: &[Candidate],
            _: &PromptConfig,
            cancelled: &dyn Fn() -> bool,
        ) -> Result<Scored, EngineError> {
            self.calls.fetch_add(1, Ordering::Relaxed);
            std::thread::sleep(self.each);
            if cancelled() {
                return Err(EngineError::Cancelled);
            }
            Ok(Scored {
                scores: vec![0.0; candidates.len()],
                prompt_tokens: 1,
            })
        }
        fn generate(
            &self,
            _: &[Message],
            _: &Sampling,
            _: Option<&Tools>,
            _: &mut dyn FnMut(Piece<'_>) -> bool,
        ) -> Result<Usage, EngineError> {
            Err(EngineError::Invalid("no generation here".into()))
        }
    }

    fn jobs(n: usize) -> Vec<Job> {
        (0..n)
            .map(|i| Job::Rerank {
                text: format!("query {i}"),
                candidates: vec![Candidate {
                    label: format!("label {i}"),
                    reply: None,
                    description: None,
                    examples: vec![],
                    p: 1.0,
                }],
                prompt: PromptConfig::default(),
            })
            .collect()
    }

    #[test]
    fn the_warm_up_scores_every_job_within_its_budget() {
        let e = Counting {
            each: Duration::from_millis(1),
            calls: AtomicUsize::new(0),
        };
        warm(&e, &jobs(5), Duration::from_secs(10));
        assert_eq!(e.calls.load(Ordering::Relaxed), 5);
    }

    #[test]
    fn the_warm_up_stops_at_its_budget() {
        let e = Counting {
            each: Duration::from_millis(40),
            calls: AtomicUsize::new(0),
        };
        let t = std::time::Instant::now();
        warm(&e, &jobs(50), Duration::from_millis(100));
        let calls = e.calls.load(Ordering::Relaxed);
        assert!((2..=4).contains(&calls), "{calls} jobs started");
        assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    }
}
