//! One try of a cascade stage, for every job kind: its alternatives predicted to finish in time, in its
//! preferred order ([`crate::answer::select`]), each up to `retries` more times after a backend failure worth retrying
//! while time is left, then the next alternative. A generation counts as failed only before its first event:
//! once a token has come, the answer is this backend's (nothing is retried or switched after a byte was sent).

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tiergate_queue::{Event, Job, JobHandle, QueueError, Reply};

use crate::backends::llm::{Held, Llm, Refused, Submitted};
use crate::metrics as m;
use crate::model::request::Request;
use crate::state::{AppState, Stage};

/// Runs `job` on `stage`: `run` turns a submitted job into its outcome (`Err`: the backend failed, recorded by
/// the backend's breaker and retried per [`crate::answer::select::retry_same`]). The outcome and the backend that gave
/// it, or why no alternative did (the last refusal or failure).
pub(crate) async fn attempt<'a, T, F, Fut>(
    state: &'a Arc<AppState>,
    stage: &Stage,
    v: &Request,
    job: &Job,
    mut run: F,
) -> Result<(T, String), Refused>
where
    F: FnMut(Submitted<'a>) -> Fut,
    Fut: Future<Output = Result<T, QueueError>> + 'a,
{
    let tenant = &v.tenant.0;
    let rerank = matches!(job, Job::Rerank { .. });
    let predicted: Vec<(usize, Duration)> = stage
        .alternatives
        .iter()
        .filter_map(|(b, _)| Some((*b, state.backend(*b)?.predict(rerank, tenant).0)))
        .collect();
    let left = v.deadline.map(crate::backends::deadline::left);
    let order = crate::answer::select::order(&predicted, stage.prefer, left);
    let order = crate::answer::select::pin_first(order, stage.pinned);
    if order.is_empty() && !predicted.is_empty() {
        metrics::counter!(m::UNREACHABLE_TOTAL).increment(1);
    }
    let mut last = if predicted.is_empty() {
        Refused::NoLlm
    } else {
        Refused::Unreachable
    };
    for b in order {
        for tried in 0..=stage.retries {
            let submitted = match state
                .submit(job, b, &v.tenant, v.batch.as_ref(), v.deadline)
                .await
            {
                Ok(s) => s,
                Err(r) => {
                    last = r;
                    break;
                }
            };
            let llm: &Llm = submitted.llm;
            let outcome = run(submitted).await;
            llm.record_outcome(outcome.as_ref().map(|_| ()));
            match outcome {
                Ok(t) => return Ok((t, llm.name.clone())),
                Err(e) => {
                    let again = crate::answer::select::retry_same(&e) && tried < stage.retries;
                    last = Refused::Queue(e);
                    if !again {
                        break;
                    }
                    metrics::counter!(m::RETRIES_TOTAL, "backend" => llm.name.clone()).increment(1);
                }
            }
        }
    }
    Err(last)
}

/// A rerank's outcome: its `n` scores.
pub(crate) async fn scores(s: Submitted<'_>, n: usize) -> Result<Vec<f32>, QueueError> {
    match s.handle.reply().await {
        Ok(Reply::Rerank(r)) if r.scores.len() == n => Ok(r.scores),
        Ok(_) => Err(QueueError::Protocol("unexpected reply".into())),
        Err(e) => Err(e),
    }
}

/// A generation that has produced its first event (a token, or its end): from here on it is this backend's.
pub(crate) struct Started {
    pub handle: JobHandle,
    pub slot: crate::backends::fair::Slot,
    pub held: Held,
    pub first: Event,
    /// From submission to the first event.
    pub waited: Duration,
    /// Where the backend's per-token times are measured.
    pub rates: Arc<crate::backends::llm::Rates>,
}

/// A generation's outcome: its first event, or the failure that came instead (an error before any byte).
pub(crate) async fn first_event(s: Submitted<'_>) -> Result<Started, QueueError> {
    let rates = s.llm.rates.clone();
    let (handle, slot, held) = s.split();
    let t = Instant::now();
    match handle.events.recv_async().await {
        Ok(Event::Error(e)) => Err(e),
        Err(_) => Err(QueueError::Protocol("the job's channel closed".into())),
        Ok(first) => Ok(Started {
            handle,
            slot,
            held,
            first,
            waited: t.elapsed(),
            rates,
        }),
    }
}
