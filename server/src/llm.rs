//! The LLM tier as the server sees it: the worker pool's client and supervisor, and [`Llm::submit`] — the one way
//! a request reaches the LLM. Classify (rerank), answer and generate requests, interactive or from a batch,
//! all pass the same checks in the same order: a batch line's turn (it waits for the interactive channel),
//! for reranks whether the job can still finish before its deadline, a slot in the tenants' fair share
//! ([`crate::fair`]: waiting in its tenant's lane while the workers are busy), then the deadline of its kind
//! (less the wait) and the trace context. The slot is held until the answer is read, and its time is
//! charged to the tenant's LLM budget.

use std::time::Duration;

use tiergate_queue::{Client, Job, JobHandle, QueueError, Supervisor};

use tiergate_config::RerankerConfig;

use crate::fair::NoSlot;
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
    /// The workers' slots, shared fairly between tenants.
    pub share: std::sync::Arc<crate::fair::Share>,
}

/// The `[reranker]` bounds a submission is checked against.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Jobs in flight at most (`reranker.max_in_flight`, or twice the worker slots).
    pub in_flight: usize,
    /// Jobs the workers run at once; the rest of `in_flight` waits in each tenant's lane.
    pub capacity: usize,
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
            capacity: r.capacity(),
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

    /// True when a new rerank with `ahead` jobs before it (itself included) would likely miss `deadline`
    /// (reranks are scored one at a time per worker).
    pub fn rerank_out_of_reach(&self, deadline: Duration, ahead: usize) -> bool {
        let ewma = self.rerank_ewma();
        ewma > Duration::ZERO && ewma * ahead as u32 / self.limits.workers.max(1) as u32 > deadline
    }

    fn rerank_ewma(&self) -> Duration {
        Duration::from_nanos(
            self.rerank_ewma_ns
                .load(std::sync::atomic::Ordering::Relaxed),
        )
    }

    /// How long a job may wait for a slot: its deadline less a rerank's service time; a generation half
    /// its deadline (its length is unknown).
    fn max_wait(&self, rerank: bool, deadline: Duration) -> Duration {
        if rerank {
            deadline.saturating_sub(self.rerank_ewma())
        } else {
            deadline / 2
        }
    }
}

/// Who asks for the LLM: the tenant (its fair-share weight, LLM budget and figures), and a batch line's marker.
#[derive(Default)]
pub struct Ask<'a> {
    pub tenant: Option<std::sync::Arc<str>>,
    pub weight: f64,
    pub budget: Option<std::sync::Arc<std::sync::Mutex<crate::tenants::Budget>>>,
    /// Where the LLM time it used is added up.
    pub figures: Option<std::sync::Arc<crate::tenants::Figures>>,
    pub batch: Option<&'a BatchLine>,
}

/// Why a job did not reach the LLM.
#[derive(Debug)]
pub enum Refused {
    /// This server runs no LLM workers.
    NoLlm,
    /// The queue is full, the job could not finish in time, or the queue refused it.
    Queue(QueueError),
    /// The tenant has spent its LLM budget; it may ask again after this long.
    Budget(Duration),
}

/// A job on its way: its handle, how many jobs were running with it when it was dispatched (itself
/// included), its slot and a batch line's turn, held until the caller is done with the answer.
pub struct Submitted<'a> {
    pub handle: JobHandle,
    pub ahead: u32,
    /// The LLM side it went to.
    pub llm: &'a Llm,
    /// Its place at the workers (released on drop).
    pub slot: crate::fair::Slot,
    _turn: Option<Turn<'a>>,
}

/// A batch line's turn at the LLM, held apart from the job (see [`Submitted::split`]).
pub struct Held<'a> {
    _turn: Option<Turn<'a>>,
}

impl<'a> Submitted<'a> {
    /// The handle and the slot (which a streamed answer carries to its last token), and the turn.
    pub fn split(self) -> (JobHandle, crate::fair::Slot, Held<'a>) {
        (self.handle, self.slot, Held { _turn: self._turn })
    }
}

impl Llm {
    /// Submits `job` for `ask` (an interactive request, or a batch line when `ask.batch` is set).
    pub async fn submit<'a>(&'a self, job: &Job, ask: Ask<'_>) -> Result<Submitted<'a>, Refused> {
        let turn = self.gate.turn(&self.client, ask.batch).await;
        let rerank = matches!(job, Job::Rerank { .. });
        let deadline = if rerank {
            self.limits.rerank_deadline
        } else {
            self.limits.generate_deadline
        };
        let asked = std::time::Instant::now();
        let tenant = ask
            .tenant
            .unwrap_or_else(|| std::sync::Arc::from("default"));
        let weight = if ask.weight > 0.0 { ask.weight } else { 1.0 };
        if rerank && self.rerank_out_of_reach(deadline, self.share.ahead(&tenant, weight)) {
            return Err(Refused::Queue(QueueError::DeadlineExceeded));
        }
        let mut slot = self
            .share
            .acquire(&tenant, weight, self.max_wait(rerank, deadline))
            .await
            .map_err(|e| {
                Refused::Queue(match e {
                    NoSlot::Full => QueueError::Full {
                        slots: self.limits.in_flight,
                    },
                    NoSlot::Timeout => QueueError::DeadlineExceeded,
                })
            })?;
        let (budget, figures, name) = (ask.budget, ask.figures, tenant.clone());
        slot.on_release(move |held| {
            let secs = held.as_secs_f64();
            if let Some(b) = budget {
                if let Ok(mut b) = b.lock() {
                    b.charge(std::time::Instant::now(), secs);
                }
            }
            if let Some(f) = figures {
                f.llm(&name, secs);
            }
            metrics::counter!(crate::metrics::TENANT_LLM_SECONDS_TOTAL, "tenant" => name.to_string())
                .increment((secs * 1e6) as u64);
        });
        let ahead = self.client.in_flight() as u32 + 1;
        let left = deadline.saturating_sub(asked.elapsed());
        let handle = self
            .client
            .submit_traced(job, crate::trace::job_parent().as_ref(), left)
            .map_err(Refused::Queue)?;
        Ok(Submitted {
            handle,
            ahead,
            llm: self,
            slot,
            _turn: turn,
        })
    }
}
