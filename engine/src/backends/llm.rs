//! The LLM tier as the server sees it: the worker pool's client and supervisor, and [`Llm::submit`] — the one way
//! a request reaches the LLM. Classify (rerank), answer and generate requests, interactive or from a batch,
//! all pass the same checks in the same order: a batch line's turn (it waits for the interactive channel),
//! whether the job is predicted to finish before its deadline (the request's budget, at most its kind's
//! deadline; [`crate::backends::deadline`]) — if not it is never queued —, a slot in the tenants' fair share
//! ([`crate::backends::fair`]: waiting in its tenant's lane while the workers are busy, no longer than leaves time for
//! the job), then the deadline left and the trace context. The slot is held until the answer is read, and its time is
//! charged to the tenant's LLM budget.

use std::time::Duration;

use tiergate_queue::{Client, Job, JobHandle, QueueError, Supervisor};

use tiergate_config::RerankerConfig;

use crate::backends::fair::NoSlot;
use crate::backends::priority::{BatchLine, Gate, Turn};
use crate::error::EngineError;

/// One LLM backend.
pub struct Llm {
    /// Its name (`default`, or its `[[llm]]` entry's).
    pub(crate) name: String,
    /// Submits jobs.
    pub client: Client,
    /// Runs the workers (dropped after the client at shutdown).
    pub(crate) supervisor: Supervisor,
    /// The shared-memory segment's name.
    pub(crate) segment: String,
    /// Recent service times of reranks and of generations: predict whether a new job can finish before its
    /// deadline.
    pub(crate) rerank_times: std::sync::Arc<crate::backends::deadline::ServiceTimes>,
    pub(crate) generate_times: std::sync::Arc<crate::backends::deadline::ServiceTimes>,
    /// Its generations' measured per-token times.
    pub(crate) rates: std::sync::Arc<Rates>,
    /// Interactive work before batch work (shared with the Batch API's runner, which yields on it).
    pub(crate) gate: std::sync::Arc<Gate>,
    /// What a submission is checked against.
    pub(crate) limits: Limits,
    /// The workers' slots, shared fairly between tenants.
    pub(crate) share: std::sync::Arc<crate::backends::fair::Share>,
    /// Opens when the backend keeps failing ([`crate::backends::breaker`]).
    pub(crate) breaker: std::sync::Mutex<crate::deps::breaker::Breaker>,
    /// It calls tools (`tools = true` in its config).
    pub(crate) tools: bool,
    /// Its own brownout pressure at the last reading (f64 bits; [`crate::load::brownout::pressure`]).
    pub(crate) pressure: std::sync::atomic::AtomicU64,
    /// The warm-up file its workers read at each start (removed when the backend is dropped).
    pub(crate) _warmup: Option<tempfile::TempPath>,
}

/// The `[reranker]` bounds a submission is checked against.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// Jobs in flight at most (`reranker.max_in_flight`, or twice the worker slots).
    pub in_flight: usize,
    /// Jobs the workers run at once; the rest of `in_flight` waits in each tenant's lane.
    pub capacity: usize,
    /// A rerank's deadline.
    pub rerank_deadline: Duration,
    /// A generation's deadline.
    pub generate_deadline: Duration,
    /// Conversations its prompt cache keeps warm (0: not modelled).
    pub warm_sessions: usize,
}

impl Limits {
    /// The bounds `[reranker]` sets.
    pub(crate) fn of(r: &RerankerConfig) -> Self {
        Self {
            in_flight: r.in_flight_limit(),
            capacity: r.capacity(),
            rerank_deadline: Duration::from_millis(r.rerank_deadline_ms),
            generate_deadline: Duration::from_millis(r.generate_deadline_ms),
            warm_sessions: r.warm_sessions(),
        }
    }
}

impl Llm {
    /// Its own brownout pressure at the last reading.
    pub(crate) fn pressure(&self) -> f64 {
        f64::from_bits(self.pressure.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// Jobs waiting in the segment for a worker to take them.
    pub(crate) fn waiting(&self) -> usize {
        let seg = self.client.segment();
        (0..seg.slots())
            .filter_map(|i| seg.slot(i))
            .filter(|s| tiergate_queue::slot::load(s).1 == tiergate_queue::layout::state::READY)
            .count()
    }

    /// The service times of `job`'s kind.
    fn times(&self, rerank: bool) -> &std::sync::Arc<crate::backends::deadline::ServiceTimes> {
        if rerank {
            &self.rerank_times
        } else {
            &self.generate_times
        }
    }

    /// Whether the breaker lets a job through now.
    fn breaker_allows(&self) -> Result<(), Refused> {
        let now = std::time::Instant::now();
        let Ok(mut b) = self.breaker.lock() else {
            return Ok(());
        };
        if b.allow(now) {
            Ok(())
        } else {
            Err(Refused::BreakerOpen(b.retry_after(now)))
        }
    }

    /// Records how a job the breaker let through ended: `Ok`, or the error it ended with (a full queue is
    /// load, not a failure, and is not passed here).
    pub(crate) fn record_outcome(&self, outcome: Result<(), &QueueError>) {
        let Ok(mut b) = self.breaker.lock() else {
            return;
        };
        let trips = b.trips();
        match outcome {
            Ok(()) => b.success(),
            Err(QueueError::Full { .. } | QueueError::Invalid(_) | QueueError::Cancelled) => {
                b.abandon()
            }
            Err(_) => b.failure(std::time::Instant::now()),
        }
        if b.trips() > trips {
            tracing::warn!(segment = %self.segment, "LLM circuit breaker open: escalations degrade until a probe answers");
            metrics::counter!(crate::metrics::BREAKER_TRIPS_TOTAL, "backend" => self.name.clone())
                .increment(1);
        }
        let open = !matches!(b.state(), crate::deps::breaker::State::Closed);
        metrics::gauge!(crate::metrics::BREAKER_OPEN, "backend" => self.name.clone())
            .set(if open { 1.0 } else { 0.0 });
    }

    /// Whether the breaker is closed.
    pub(crate) fn breaker_closed(&self) -> bool {
        self.breaker
            .lock()
            .map_or(true, |b| b.state() == crate::deps::breaker::State::Closed)
    }

    /// What placing a new session here costs: its generations' mean service time (the prior until measured),
    /// whether it is measured, and its slots.
    pub(crate) fn placement(&self) -> (Duration, bool, usize) {
        let times = self.times(false);
        (times.estimate().0, times.measured(), self.limits.capacity)
    }

    /// Predicted completion of a new job of `tenant`: the wait for a slot behind the jobs its lane and the
    /// others' put before it, plus its kind's P95 service time (also returned: the longest a job may wait
    /// for a slot leaves room for it).
    pub(crate) fn predict(&self, rerank: bool, tenant: &str) -> (Duration, Duration) {
        crate::backends::deadline::predict(
            &self.share,
            self.times(rerank),
            self.limits.capacity,
            tenant,
        )
    }
}

/// A backend's measured figures of its generations, smoothed (EWMA, α = 0.1): prefill — from a job's slot to
/// its first token, per prompt token, ms (an effective rate: what a warm prefix cache saved is in it); cold
/// prefill — the same on turns that found no warm conversation there (a session's first turn on it, one that
/// moved to it); decode, per token after the first, ms; and the tokens an answer has. What a session's switch
/// would cost and save is priced in them ([`crate::answer::session`]).
#[derive(Debug, Default)]
pub(crate) struct Rates(std::sync::Mutex<RateView>);

/// [`Rates`] as read.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub(crate) struct RateView {
    /// Prompt tokens of a generation.
    pub prompt: Option<f64>,
    pub prefill: Option<f64>,
    pub cold_prefill: Option<f64>,
    pub decode: Option<f64>,
    pub completion: Option<f64>,
}

impl Rates {
    /// One generation's figures (any may be unknown: no prompt tokens counted, nothing read, one token only).
    pub(crate) fn observe(&self, sample: RateView) {
        let step = |slot: &mut Option<f64>, x: Option<f64>| {
            if let Some(x) = x.filter(|x| x.is_finite()) {
                *slot = Some(slot.map_or(x, |old| old + 0.1 * (x - old)));
            }
        };
        if let Ok(mut r) = self.0.lock() {
            step(&mut r.prompt, sample.prompt);
            step(&mut r.prefill, sample.prefill);
            step(&mut r.cold_prefill, sample.cold_prefill);
            step(&mut r.decode, sample.decode);
            step(&mut r.completion, sample.completion);
        }
    }

    pub(crate) fn view(&self) -> RateView {
        self.0.lock().map_or_else(|_| RateView::default(), |r| *r)
    }
}

/// Who asks for the LLM: the tenant (its fair-share weight, LLM budget and figures), and a batch line's marker.
#[derive(Default)]
pub(crate) struct Ask<'a> {
    pub tenant: Option<std::sync::Arc<str>>,
    pub weight: f64,
    pub budget: Option<std::sync::Arc<std::sync::Mutex<crate::tenancy::tenants::Budget>>>,
    /// Where the LLM time it used is added up.
    pub figures: Option<std::sync::Arc<crate::tenancy::tenants::Figures>>,
    /// When the request's budget ends (`None`: only the job kind's deadline applies).
    pub deadline: Option<std::time::Instant>,
    pub batch: Option<&'a BatchLine>,
}

/// Why a job did not reach the LLM.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Refused {
    /// This server runs no LLM workers.
    NoLlm,
    /// The queue is full, the job could not finish in time, or the queue refused it.
    Queue(QueueError),
    /// The tenant has spent its LLM budget; it may ask again after this long.
    Budget(Duration),
    /// The job is predicted not to finish within the request's budget (or its kind's deadline): not queued.
    Unreachable,
    /// The backend's circuit breaker is open; a probe goes through after this long.
    BreakerOpen(Duration),
}

impl Refused {
    /// A generation's refused submission as an error (it has no Tier-0 answer to degrade to); a classify or
    /// answer route degrades instead ([`crate::answer::cascade::reason_of`]).
    pub(crate) fn into_error(self, tenant: &str) -> EngineError {
        match self {
            Refused::NoLlm => EngineError::Unavailable("this server runs no LLM workers".into()),
            Refused::Queue(e) => EngineError::from(e),
            Refused::BreakerOpen(wait) => EngineError::Unavailable(format!(
                "the LLM backend keeps failing (circuit breaker open, {} ms until a probe): retry later",
                wait.as_millis()
            )),
            Refused::Unreachable => EngineError::Timeout(format!(
                "the LLM is predicted not to finish within this request's budget ({})",
                crate::backends::deadline::HEADER
            )),
            Refused::Budget(wait) => EngineError::RateLimited {
                message: format!(
                    "tenant `{tenant}` has spent its LLM budget: retry after the Retry-After seconds"
                ),
                retry_after_s: crate::error::retry_after(wait),
            },
        }
    }
}

/// A job on its way: its handle, its slot and a batch line's turn, held until the caller is done with the
/// answer.
pub(crate) struct Submitted<'a> {
    pub handle: JobHandle,
    /// The LLM side it went to.
    pub llm: &'a Llm,
    /// Its place at the workers (released on drop).
    pub slot: crate::backends::fair::Slot,
    _turn: Option<Turn>,
}

/// A batch line's turn at the LLM, held apart from the job (see [`Submitted::split`]).
pub(crate) struct Held {
    _turn: Option<Turn>,
}

impl<'a> Submitted<'a> {
    /// The handle and the slot (which a streamed answer carries to its last token), and the turn.
    pub(crate) fn split(self) -> (JobHandle, crate::backends::fair::Slot, Held) {
        (self.handle, self.slot, Held { _turn: self._turn })
    }
}

impl Llm {
    /// Submits `job` for `ask` (an interactive request, or a batch line when `ask.batch` is set).
    pub(crate) async fn submit<'a>(
        &'a self,
        job: &Job,
        ask: Ask<'_>,
    ) -> Result<Submitted<'a>, Refused> {
        let turn = self.gate.turn(&self.client, ask.batch).await;
        let rerank = matches!(job, Job::Rerank { .. });
        let kind_deadline = if rerank {
            self.limits.rerank_deadline
        } else {
            self.limits.generate_deadline
        };
        let deadline = std::time::Instant::now()
            + ask.deadline.map_or(kind_deadline, |d| {
                crate::backends::deadline::left(d).min(kind_deadline)
            });
        let tenant = ask
            .tenant
            .unwrap_or_else(|| std::sync::Arc::from("default"));
        let weight = if ask.weight > 0.0 { ask.weight } else { 1.0 };
        let (done, p95) = self.predict(rerank, &tenant);
        if done > crate::backends::deadline::left(deadline) {
            metrics::counter!(crate::metrics::UNREACHABLE_TOTAL).increment(1);
            return Err(Refused::Unreachable);
        }
        self.breaker_allows()?;
        // Wait for a slot no longer than leaves time for a P95 service.
        let wait = crate::backends::deadline::left(deadline).saturating_sub(p95);
        let mut slot = match self.share.acquire(&tenant, weight, wait, !rerank).await {
            Ok(slot) => slot,
            Err(e) => {
                // Not run: a probe the breaker let through hands its turn on.
                self.record_outcome(Err(&QueueError::Cancelled));
                return Err(match e {
                    NoSlot::Full => Refused::Queue(QueueError::Full {
                        slots: self.limits.in_flight,
                    }),
                    NoSlot::Timeout => Refused::Unreachable,
                });
            }
        };
        let (budget, figures, name) = (ask.budget, ask.figures, tenant.clone());
        let times = self.times(rerank).clone();
        slot.on_release(move |held| {
            let secs = held.as_secs_f64();
            times.record(held);
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
        let handle = self
            .client
            .submit_traced(
                job,
                crate::model::trace::job_parent().as_ref(),
                crate::backends::deadline::left(deadline),
            )
            .map_err(|e| {
                self.record_outcome(Err(&e));
                Refused::Queue(e)
            })?;
        Ok(Submitted {
            handle,
            llm: self,
            slot,
            _turn: turn,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::{RateView, Rates};

    #[test]
    fn rates_start_at_their_first_sample_and_move_a_tenth_of_the_way() {
        let r = Rates::default();
        let v = |r: &Rates| {
            let v = r.view();
            [v.prefill, v.cold_prefill, v.decode, v.completion]
        };
        assert_eq!(v(&r), [None; 4]);
        let sample = |prefill, cold_prefill, decode, completion| RateView {
            prompt: None,
            prefill,
            cold_prefill,
            decode,
            completion,
        };
        r.observe(sample(Some(2.0), Some(2.0), None, Some(10.0)));
        assert_eq!(v(&r), [Some(2.0), Some(2.0), None, Some(10.0)]);
        r.observe(sample(Some(12.0), None, Some(40.0), Some(20.0)));
        assert_eq!(
            v(&r),
            [Some(3.0), Some(2.0), Some(40.0), Some(11.0)],
            "a warm turn's prefill is no cold one"
        );
        r.observe(sample(None, None, Some(f64::NAN), None));
        assert_eq!(
            v(&r),
            [Some(3.0), Some(2.0), Some(40.0), Some(11.0)],
            "unknown and non-finite samples change nothing"
        );
    }
}
