//! After an answer: its decision record for the ledger (`[feedback]`), and the audit draw — a random
//! `routing.audit_rate` share of the label answers Tier-0 gave alone (degraded ones included) is kept with its
//! text for labelling (and, with `[feedback] audit_llm`, to the LLM's background scoring). All are handed
//! over without waiting.

use std::sync::Arc;

use crate::evidence::ledger::{now_ms, AuditItem, Entry, Record};
use crate::model::outcome::Outcome;
use crate::model::request::Request;
use crate::state::AppState;

/// What the record needs from the request, taken before the handler consumes it.
pub(crate) struct Asked {
    id: String,
    route: String,
    tenant: String,
    alias: Option<Arc<str>>,
    /// The text, only when a record may keep it (`record_text`) or an audit may be drawn.
    text: Option<String>,
}

impl Asked {
    pub(crate) fn of(state: &AppState, v: &Request) -> Option<Self> {
        state.evidence.ledger.as_ref()?;
        let audits = state.routing.policy.current().cfg.audit_rate > 0.0;
        Some(Self {
            id: v.id.clone(),
            route: v.route.clone(),
            tenant: v.tenant.0.to_string(),
            alias: v.batch.as_ref().and_then(|b| b.alias.clone()),
            text: (state.config.server.record_text || audits).then(|| v.text.clone()),
        })
    }
}

/// Records an answered request, and draws it for audit.
pub(crate) fn answered(state: &AppState, asked: Option<Asked>, o: &Outcome) {
    let (Some(ledger), Some(a)) = (&state.evidence.ledger, asked) else {
        return;
    };
    let policy = state.routing.policy.current();
    // The head that classified it (a head promoted since is not the one that answered).
    let head = o.head.clone().unwrap_or_default();
    let rec = Record {
        id: a.id,
        alias: a.alias.map(|s| s.to_string()),
        at_ms: now_ms(),
        tenant: a.tenant,
        route: a.route,
        channel: o.channel().as_str().to_string(),
        tier: o.tier.as_str().to_string(),
        degraded: o.degraded.map(|d| d.as_str().to_string()),
        stage: o.stage.clone(),
        label: o.label.clone(),
        ambiguity: o.ambiguity,
        top: o.top.clone(),
        theta: o.threshold,
        policy_version: policy.version,
        head,
        text: state
            .config
            .server
            .record_text
            .then(|| a.text.clone())
            .flatten(),
        forced: o.forced,
        session: o.session.map(str::to_string),
        switch: o.switch.clone(),
    };
    let rate = policy.cfg.audit_rate;
    // Only answers decided under the policy's own θ are drawn: a forced θ says nothing about the traffic; nor
    // are answers classified with context (the bound's calibration is single utterances).
    let drawn = rec.is_evidence() && !o.out_of_scope && o.context == 0;
    if drawn && rate > 0.0 && rand::random::<f64>() < rate {
        if let (Some(auditor), Some(text)) = (&state.evidence.auditor, &a.text) {
            auditor.offer(crate::evidence::auditor::Item {
                route: rec.route.clone(),
                text: text.clone(),
                top: rec.top.clone(),
                answered: rec.label.clone().unwrap_or_default(),
            });
        }
        ledger.record(Entry::Audit(Box::new(AuditItem {
            id: rec.id.clone(),
            route: rec.route.clone(),
            at_ms: rec.at_ms,
            probability: rate,
            theta: o.threshold.unwrap_or(0.0),
            ambiguity: rec.ambiguity.unwrap_or(1.0),
            answered: rec.label.clone().unwrap_or_default(),
            channel: rec.channel.clone(),
            text: a.text,
            head: rec.head.clone(),
            label: None,
        })));
    }
    ledger.record(Entry::Decision(Box::new(rec)));
}
