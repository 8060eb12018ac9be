//! The LLM tier as the server sees it: the worker pool's client and supervisor, and [`Llm::submit`] — the one way
//! a request reaches the LLM. Classify (rerank), answer and generate requests, interactive or from a batch,
//! all pass the same checks in the same order: a batch line's turn (it waits for the interactive channel),
//! the in-flight limit, for reranks whether the job can still finish before its deadline, then the deadline
//! of its kind and the trace context.

use std::time::Duration;

use tiergate_queue::{Client, Job, JobHandle, QueueError, Supervisor};

use tiergate_config::RerankerConfig;

use crate::priority::{BatchLine, Gate, Turn};

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
    /// Interactive work before batch work (shared with the Batch API's runner, which yields on it).
    pub gate: std::sync::Arc<Gate>,
    /// What a submission is checked against.
    pub limits: Limits,
}

/// The `[reranker]` bounds a submission is checked against.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Jobs in flight at most (`reranker.max_in_flight`, or twice the worker slots).
    pub in_flight: usize,
    /// A rerank's deadline.
    pub rerank_deadline: Duration,
    /// A generation's deadline.
    pub generate_deadline: Duration,
    /// Worker processes (reranks are scored one at a time per worker).
    pub workers: usize,
}

impl Limits {
    /// The bounds `[reranker]` sets.
    pub fn of(r: &RerankerConfig) -> Self {
        Self {
            in_flight: r.in_flight_limit(),
            rerank_deadline: Duration::from_millis(r.rerank_deadline_ms),
            generate_deadline: Duration::from_millis(r.generate_deadline_ms),
            workers: r.workers,
        }
    }
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
    pub fn rerank_out_of_reach(&self, deadline: Duration) -> bool {
        let workers = self.limits.workers;
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

impl Llm {
    /// Submits `job` for an interactive request (`batch` is `None`) or a batch line.
    pub async fn submit<'a>(
        &'a self,
        job: &Job,
        batch: Option<&BatchLine>,
    ) -> Result<Submitted<'a>, Refused> {
        let turn = self.gate.turn(&self.client, batch).await;
        let rerank = matches!(job, Job::Rerank { .. });
        let deadline = if rerank {
            self.limits.rerank_deadline
        } else {
            self.limits.generate_deadline
        };
        let in_flight = self.client.in_flight();
        if in_flight >= self.limits.in_flight {
            return Err(Refused::Queue(QueueError::Full { slots: in_flight }));
        }
        if rerank && self.rerank_out_of_reach(deadline) {
            return Err(Refused::Queue(QueueError::DeadlineExceeded));
        }
        let handle = self
            .client
            .submit_traced(job, crate::trace::job_parent().as_ref(), deadline)
            .map_err(Refused::Queue)?;
        Ok(Submitted {
            handle,
            ahead: in_flight as u32 + 1,
            llm: self,
            _turn: turn,
        })
    }
}
