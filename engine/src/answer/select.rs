//! Latency-graded selection within a cascade stage (`{ any = [...], prefer, retries }` or a `grade`): the
//! alternatives whose predicted completion ([`crate::backends::llm::Llm::predict`]) fits the request's remaining budget,
//! in the order of the stage's preference — `quality` as listed, `latency` fastest first —, each tried up to
//! `retries` more times on a failure worth retrying, then the next. None fitting: the stage is not tried.

use std::time::Duration;

use tiergate_config::Prefer;
use tiergate_queue::QueueError;

/// The order to try `alternatives` (backend, predicted completion) in with `left` of the budget (`None`: no
/// budget beyond each job kind's deadline, which `Llm::submit` checks).
pub(crate) fn order(
    alternatives: &[(usize, Duration)],
    prefer: Prefer,
    left: Option<Duration>,
) -> Vec<usize> {
    let mut fit: Vec<(usize, usize, Duration)> = alternatives
        .iter()
        .enumerate()
        .filter(|(_, (_, p))| left.is_none_or(|l| *p <= l))
        .map(|(listed, (b, p))| (listed, *b, *p))
        .collect();
    if prefer == Prefer::Latency {
        fit.sort_by(|a, b| a.2.cmp(&b.2).then(a.0.cmp(&b.0)));
    }
    fit.into_iter().map(|(_, b, _)| b).collect()
}

/// `order` with `pinned` first when it is there (a session's backend, when it fits the budget: a pin never
/// puts back an alternative the budget ruled out).
pub(crate) fn pin_first(mut order: Vec<usize>, pinned: Option<usize>) -> Vec<usize> {
    if let Some(i) = pinned.and_then(|p| order.iter().position(|b| *b == p)) {
        let b = order.remove(i);
        order.insert(0, b);
    }
    order
}

/// Whether a job that ended with `e` is worth running again on the same backend: an engine or upstream error,
/// or a reply that broke the protocol. Not a dead worker (the supervisor already ran its job again once: a
/// request is never retried twice for one failure), not a deadline (no time left), not load.
pub(crate) fn retry_same(e: &QueueError) -> bool {
    matches!(e, QueueError::Engine(_) | QueueError::Protocol(_))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    #[test]
    fn alternatives_that_fit_in_preference_order() {
        // Backends 7 (slow, listed first), 3 (fast), 5 (middling).
        let alts = [(7, ms(900)), (3, ms(120)), (5, ms(400))];
        assert_eq!(order(&alts, Prefer::Quality, None), vec![7, 3, 5]);
        assert_eq!(order(&alts, Prefer::Latency, None), vec![3, 5, 7]);
        // 500 ms left: the slow one does not fit.
        assert_eq!(order(&alts, Prefer::Quality, Some(ms(500))), vec![3, 5]);
        assert_eq!(order(&alts, Prefer::Latency, Some(ms(500))), vec![3, 5]);
        // Nothing fits.
        assert!(order(&alts, Prefer::Latency, Some(ms(100))).is_empty());
        // Ties keep the listed order.
        assert_eq!(
            order(&[(1, ms(5)), (2, ms(5))], Prefer::Latency, None),
            vec![1, 2]
        );
    }

    #[test]
    fn a_pinned_backend_goes_first_only_when_it_fits() {
        let alts = [(7, ms(900)), (3, ms(120)), (5, ms(400))];
        let fit = order(&alts, Prefer::Latency, Some(ms(500)));
        assert_eq!(pin_first(fit.clone(), Some(5)), vec![5, 3]);
        assert_eq!(
            pin_first(fit.clone(), Some(7)),
            vec![3, 5],
            "7 is over the budget"
        );
        assert_eq!(pin_first(fit, None), vec![3, 5]);
    }

    #[test]
    fn only_backend_errors_are_retried_on_the_same_backend() {
        assert!(retry_same(&QueueError::Engine("upstream 503".into())));
        assert!(retry_same(&QueueError::Protocol("garbage".into())));
        assert!(!retry_same(&QueueError::WorkerDown("died".into())));
        assert!(!retry_same(&QueueError::DeadlineExceeded));
        assert!(!retry_same(&QueueError::Full { slots: 4 }));
    }
}
