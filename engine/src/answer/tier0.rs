//! Tier-0 on a request: the route's head classifies its last user turn, with its metrics and timings in the
//! outcome. Both kinds of answer use it: a label's decision ([`super::label`]) and a steered generate
//! route's choice of stage ([`super::generation`]).

use tiergate_prefilter::{Prediction, PrefilterError};
use tiergate_telemetry::TARGET;
use tracing::Instrument;

use crate::error::EngineError;
use crate::metrics as m;
use crate::model::outcome::{Outcome, Tier};
use crate::model::request::Request;
use crate::state::Route;

/// Tier-0's prediction, its metrics and timings.
pub(super) async fn tier0(
    route: &Route,
    v: &Request,
    out: &mut Outcome,
) -> Result<Prediction, EngineError> {
    let prefilter = route
        .prefilter
        .as_ref()
        .ok_or_else(|| EngineError::Internal("route without a classifier".into()))?;
    let span = tracing::info_span!(target: TARGET, "prefilter");
    let at = std::time::SystemTime::now();
    let pred = prefilter
        .classify(&v.text)
        .instrument(span.clone())
        .await
        .map_err(prefilter_error)?;
    crate::model::trace::prefilter_steps(&span, at, &pred);
    metrics::histogram!(m::PREFILTER_BATCH_SIZE).record(pred.batch_size as f64);
    metrics::histogram!(m::PREFILTER_SECONDS).record(pred.timings.infer.as_secs_f64());
    metrics::histogram!(m::PREFILTER_QUEUE_SECONDS).record(pred.timings.queue.as_secs_f64());
    out.tier = Tier::Tier0;
    out.confidence = Some(pred.confidence);
    out.head = Some(route.head_version.clone());
    out.timings.prefilter_ms = v.started.elapsed().as_secs_f64() * 1e3;
    out.timings.infer_ms = pred.timings.infer.as_secs_f64() * 1e3;
    Ok(pred)
}

fn prefilter_error(e: PrefilterError) -> EngineError {
    match e {
        PrefilterError::Overloaded { .. } => EngineError::Overloaded {
            message: e.to_string(),
            retry_after_s: 1,
        },
        PrefilterError::InvalidInput(m) => EngineError::Invalid {
            param: "messages".into(),
            message: m,
        },
        PrefilterError::Closed => EngineError::Unavailable("the prefilter is shutting down".into()),
        other => EngineError::Internal(other.to_string()),
    }
}
