//! The scoring task of the LLM's second opinion on audited answers ([`crate::evidence::auditor`]): one item at a time,
//! on the route's first stage, only on a backend with a slot to spare, cancelled when a request waits.

use std::sync::Weak;
use std::time::Duration;

use tiergate_queue::{Job, Reply};

use crate::evidence::auditor::{best, Auditor, Item, Scored};
use crate::state::{AppState, Route};

/// Slots a scoring job leaves free for requests.
const SPARE: usize = 1;
/// How often a running scoring job checks whether a request waits for its backend.
const CHECK: Duration = Duration::from_millis(10);

/// The background task: scores items one at a time while the server lives.
pub(crate) async fn run(state: Weak<AppState>) {
    let rx = {
        let Some(s) = state.upgrade() else { return };
        let Some(rx) = s.evidence.auditor.as_ref().and_then(Auditor::take_queue) else {
            return;
        };
        rx
    };
    while let Ok(item) = rx.recv_async().await {
        let Some(s) = state.upgrade() else { return };
        let Some(a) = &s.evidence.auditor else { return };
        let result = score(&s, &item).await;
        a.count(&item.route, result);
    }
}

/// Scores one item, or sheds it.
async fn score(state: &AppState, item: &Item) -> Scored {
    let Some(route) = state.routing.routes.get(&item.route) else {
        return Scored::Failed;
    };
    if state.brownout() > crate::load::brownout::Step::Normal {
        return Scored::Shed;
    }
    let Some(stage) = route.stages.first() else {
        return Scored::Shed;
    };
    // The first backend of the stage with a slot to spare.
    let spare = stage.alternatives.iter().find_map(|(b, _)| {
        let llm = state.backend(*b)?;
        if llm.client.live_workers() == 0 || !llm.breaker_closed() {
            return None;
        }
        Some((llm, llm.share.try_spare(SPARE)?))
    });
    let Some((llm, slot)) = spare else {
        return Scored::Shed;
    };
    // Built only once it can run: a shed item costs nothing.
    let Some((job, labels)) = job_of(&route, item) else {
        return Scored::Failed;
    };
    let Ok(handle) = llm
        .client
        .submit_traced(&job, None, llm.limits.rerank_deadline)
    else {
        return Scored::Failed;
    };
    let reply = handle.reply();
    tokio::pin!(reply);
    let reply = loop {
        tokio::select! {
            r = &mut reply => break r,
            _ = tokio::time::sleep(CHECK) => {
                if llm.share.load().1 > 0 {
                    // A request waits for this backend: the scoring job gives its slot up (dropped: cancelled).
                    return Scored::Shed;
                }
            }
        }
    };
    drop(slot);
    match reply {
        Ok(Reply::Rerank(r)) if r.scores.len() == labels.len() => {
            match best(&r.scores).and_then(|i| labels.get(i)) {
                Some(l) if *l == item.answered => Scored::Agreed,
                Some(_) => Scored::Disagreed,
                None => Scored::Failed,
            }
        }
        _ => Scored::Failed,
    }
}

/// The rerank job an escalation of `item` would send (the route's prompts, Tier-0's candidates with the
/// head's examples), and the candidates' labels in its order.
fn job_of(route: &Route, item: &Item) -> Option<(Job, Vec<String>)> {
    let prefilter = route.prefilter.as_ref()?;
    let labels = prefilter.labels();
    let top: Vec<(usize, f32)> = item
        .top
        .iter()
        .filter_map(|(l, p)| Some((labels.iter().position(|x| x == l)?, *p)))
        .collect();
    if top.is_empty() {
        return None;
    }
    let candidates = crate::model::judge::candidates(
        &top,
        labels,
        prefilter.replies(),
        prefilter.descriptions(),
        |i| prefilter.examples().get(i).cloned().unwrap_or_default(),
        None,
    );
    let names = top.iter().map(|(i, _)| labels[*i].clone()).collect();
    let job = Job::Rerank {
        text: item.text.clone(),
        candidates,
        prompt: route.prompts.clone(),
    };
    Some((job, names))
}
