//! The LLM tier as the server sees it: the worker pool's client and supervisor, and [`submit`] — the one way
//! a request reaches the LLM. Classify (rerank), answer and generate requests, interactive or from a batch,
//! all pass the same checks in the same order: a batch line's turn (it waits for the interactive channel),
//! the in-flight limit, for reranks whether the job can still finish before its deadline, then the deadline
//! of its kind and the trace context.

use std::time::Duration;

use tiergate_queue::{Client, Job, JobHandle, QueueError, Supervisor};

use crate::app::AppState;
use crate::priority::{BatchLine, Turn};

/// The LLM side.
pub struct Llm {
    /// Submits jobs.
    pub client: Client,
    /// Runs the workers (dropped after the client at shutdown).
    pub supervisor: Supervisor,
    /// The shared-memory segment's name.
    pub segment: String,
    /// Smoothed service time of one rerank, nanoseconds (0 until the first one): predicts whether a new
    /// escalation can finish before its deadline.
    pub rerank_ewma_ns: std::sync::atomic::AtomicU64,
}

impl Llm {
    /// Records a rerank's service time.
    pub fn record_rerank(&self, d: Duration) {
        use std::sync::atomic::Ordering::Relaxed;
        let old = self.rerank_ewma_ns.load(Relaxed);
        let new =
            tiergate_core::stats::ewma((old > 0).then_some(old as f64), d.as_nanos() as f64, 0.3);
        self.rerank_ewma_ns.store(new.max(1.0) as u64, Relaxed);
    }

    /// True when a new rerank queued behind the ones in flight would likely miss `deadline` (reranks are
    /// scored one at a time per worker).
    pub fn rerank_out_of_reach(&self, deadline: Duration, workers: usize) -> bool {
        let ewma = self
            .rerank_ewma_ns
            .load(std::sync::atomic::Ordering::Relaxed);
        let ahead = self.client.in_flight() as u64 + 1;
        ewma > 0 && ahead * ewma / workers.max(1) as u64 > deadline.as_nanos() as u64
    }
}

/// Why a job did not reach the LLM.
#[derive(Debug)]
pub enum Refused {
    /// This server runs no LLM workers.
    NoLlm,
    /// The queue is full, the job could not finish in time, or the queue refused it.
    Queue(QueueError),
}

/// A job on its way: its handle, how many jobs were in flight with it (itself included), and a batch line's
/// turn, held until the caller is done with the answer.
pub struct Submitted<'a> {
    pub handle: JobHandle,
    pub ahead: u32,
    /// The LLM side it went to.
    pub llm: &'a Llm,
    _turn: Option<Turn<'a>>,
}

/// Submits `job` for an interactive request (`batch` is `None`) or a batch line.
pub async fn submit<'a>(
    state: &'a AppState,
    job: &Job,
    batch: Option<&BatchLine>,
) -> Result<Submitted<'a>, Refused> {
    let llm = state.llm.as_ref().ok_or(Refused::NoLlm)?;
    let turn = state.priority.turn(llm, batch).await;
    let cfg = &state.config.reranker;
    let rerank = matches!(job, Job::Rerank { .. });
    let deadline = Duration::from_millis(if rerank {
        cfg.rerank_deadline_ms
    } else {
        cfg.generate_deadline_ms
    });
    let in_flight = llm.client.in_flight();
    if in_flight >= cfg.in_flight_limit() {
        return Err(Refused::Queue(QueueError::Full { slots: in_flight }));
    }
    if rerank && llm.rerank_out_of_reach(deadline, cfg.workers) {
        return Err(Refused::Queue(QueueError::DeadlineExceeded));
    }
    let handle = llm
        .client
        .submit_traced(job, crate::trace::job_parent().as_ref(), deadline)
        .map_err(Refused::Queue)?;
    Ok(Submitted {
        handle,
        ahead: in_flight as u32 + 1,
        llm,
        _turn: turn,
    })
}
