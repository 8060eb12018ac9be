//! Metric names (units in the names), their descriptions and histogram buckets, all in one place.

use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// Requests by route, tier and outcome.
pub(crate) const REQUESTS_TOTAL: &str = "tiergate_requests_total";
/// End-to-end latency by route and tier.
pub(crate) const REQUEST_SECONDS: &str = "tiergate_request_duration_seconds";
/// Prefilter batch sizes.
pub(crate) const PREFILTER_BATCH_SIZE: &str = "tiergate_prefilter_batch_size";
/// Prefilter forward time per request's batch.
pub(crate) const PREFILTER_SECONDS: &str = "tiergate_prefilter_infer_seconds";
/// Prefilter queue wait.
pub(crate) const PREFILTER_QUEUE_SECONDS: &str = "tiergate_prefilter_queue_seconds";
/// Escalations waiting for a worker (submitted, not yet taken).
pub(crate) const QUEUE_WAITING: &str = "tiergate_escalation_waiting";
/// Escalation queue depth (jobs in flight).
pub(crate) const QUEUE_DEPTH: &str = "tiergate_escalation_queue_depth";
/// Time from submitting an escalation to its first event.
pub(crate) const QUEUE_WAIT_SECONDS: &str = "tiergate_escalation_first_event_seconds";
/// Rerank round trip.
pub(crate) const RERANK_SECONDS: &str = "tiergate_rerank_seconds";
/// Time to first token of streamed LLM replies.
pub(crate) const TTFT_SECONDS: &str = "tiergate_time_to_first_token_seconds";
/// Share of classified requests escalated (last 60 s).
pub(crate) const ESCALATION_SHARE: &str = "tiergate_escalation_share_ratio";
/// θ in force.
pub(crate) const THETA_EFF: &str = "tiergate_theta_eff_ratio";
/// Utilisation u.
pub(crate) const UTILIZATION: &str = "tiergate_utilization_ratio";
/// Worker restarts.
pub(crate) const WORKER_RESTARTS: &str = "tiergate_worker_restarts_total";
/// Policy version.
pub(crate) const POLICY_VERSION: &str = "tiergate_policy_version";
/// 1 while the shared policy store answers, 0 while this replica serves its last policy without it.
pub(crate) const POLICY_STORE_UP: &str = "tiergate_policy_store_up";

/// 1 while a dependency's breaker is closed (its last call answered in time), 0 while it is served from local
/// state, by dependency.
pub(crate) const DEPENDENCY_UP: &str = "tiergate_dependency_up";
/// Calls to a dependency by dependency and outcome (`ok`, `failed`, `late`, `skipped` while its breaker is open).
pub(crate) const DEPENDENCY_CALLS_TOTAL: &str = "tiergate_dependency_calls_total";

/// Requests of routes under a latency experiment, by variant (`control` included) and route.
pub(crate) const EXPERIMENT_REQUESTS_TOTAL: &str = "tiergate_experiment_requests_total";
/// Their server-side latency, the injected delay included.
pub(crate) const EXPERIMENT_REQUEST_SECONDS: &str = "tiergate_experiment_request_duration_seconds";
/// The delay injected per request.
pub(crate) const EXPERIMENT_DELAY_SECONDS: &str = "tiergate_experiment_delay_seconds";

/// Batch LLM jobs cancelled for an interactive escalation (the line runs again later).
pub const BATCH_PREEMPTIONS_TOTAL: &str = "tiergate_batch_preemptions_total";

/// Tenants in force (after the last reload).
pub(crate) const TENANTS: &str = "tiergate_tenants";
/// The brownout ladder's step (0 normal, 1 rerank only, 2 Tier-0 only, 3 shed).
pub(crate) const BROWNOUT_STEP: &str = "tiergate_brownout_step";
/// The pressure the ladder follows (its largest signal; 1 = at its limit).
pub(crate) const BROWNOUT_PRESSURE: &str = "tiergate_brownout_pressure";
/// Rerank jobs run again on the same backend after an engine error (a stage's `retries`).
pub(crate) const RETRIES_TOTAL: &str = "tiergate_llm_retries_total";
/// 1 while the LLM backend's circuit breaker is open or probing.
pub(crate) const BREAKER_OPEN: &str = "tiergate_llm_breaker_open";
/// Times the breaker opened.
pub(crate) const BREAKER_TRIPS_TOTAL: &str = "tiergate_llm_breaker_trips_total";
/// Escalations never queued: predicted not to finish within their budget.
pub(crate) const UNREACHABLE_TOTAL: &str = "tiergate_escalations_unreachable_total";
/// Jobs whose deadline passed before any worker started them (taken back from the queue, never computed).
pub(crate) const EXPIRED_UNSTARTED_TOTAL: &str = "tiergate_jobs_expired_unstarted_total";
/// LLM time each tenant's jobs held a worker, microseconds.
pub(crate) const TENANT_LLM_SECONDS_TOTAL: &str = "tiergate_tenant_llm_microseconds_total";
/// 1 while tenants' limits are shared with the other replicas through Redis, 0 while each enforces them alone.
pub(crate) const TENANT_LIMITS_SHARED: &str = "tiergate_tenant_limits_shared";
/// Reloads of the tenants that failed (the keys in force stayed).
pub(crate) const TENANTS_RELOAD_FAILURES_TOTAL: &str = "tiergate_tenants_reload_failures_total";

/// Escalations the error bound needed that Tier-0 answered (or that were rejected), by route and action
/// (`degrade`, `reject`); each is logged with its cause.
pub(crate) const RISK_BREACHES_TOTAL: &str = "tiergate_risk_breaches_total";
/// The θ the error bound allows per route (`routing.max_error` set).
pub(crate) const RISK_THETA: &str = "tiergate_risk_theta_ratio";
/// 1 while a route's head has flawed calibration rows (in-sample halves, labels left out) and the bound is
/// set, else 0: refused (θ 0) unless `routing.allow_flawed_calibration`, flagged either way.
pub(crate) const RISK_CALIBRATION_FLAWED: &str = "tiergate_risk_calibration_flawed";
/// 1 while a route's labelled audits show the error bound broken on live traffic at the calibration rows' θ
/// (then θ is chosen on the audits), else 0 (also without a bound).
pub(crate) const RISK_AUDIT_BREACH: &str = "tiergate_risk_audit_breach";
/// The upper confidence bound on the calibration rows' error at that θ, per route.
pub(crate) const RISK_UPPER_BOUND: &str = "tiergate_risk_error_upper_bound_ratio";

/// Decision records dropped (the writer's queue was full, or the store failed).
pub(crate) const LEDGER_DROPPED_TOTAL: &str = "tiergate_decision_records_dropped_total";
/// Decision records the ledger's writer holds because its store fails (written once it answers).
pub(crate) const LEDGER_SPOOLED: &str = "tiergate_decision_records_spooled";
/// Feedback given, by route, channel, trusted and correct.
pub(crate) const FEEDBACK_TOTAL: &str = "tiergate_feedback_total";
/// Tier-0's silent error from labelled audits per route: `estimate`, and the 95% interval's `lower`, `upper`.
pub(crate) const SILENT_ERROR: &str = "tiergate_tier0_silent_error_ratio";
/// Audit items per route and state (`pending`, `labelled`).
pub(crate) const AUDITS: &str = "tiergate_audits";
/// Audited answers the LLM scored in the background, by route and result (`agree`, `disagree`, `shed`,
/// `failed`).
pub(crate) const AUDIT_LLM_TOTAL: &str = "tiergate_audit_llm_total";
/// Agreement between the LLM and Tier-0 on the audited answers the LLM scored, by route (a proxy, not
/// accuracy).
pub(crate) const AUDIT_LLM_AGREEMENT: &str = "tiergate_audit_llm_agreement_ratio";
/// Accuracy by feedback per route and channel.
pub(crate) const FEEDBACK_ACCURACY: &str = "tiergate_feedback_accuracy_ratio";

/// Tier-0's out-of-scope score per request, on routes with an out-of-scope outcome (what the threshold is
/// tuned against).
pub(crate) const OOS_SCORE: &str = "tiergate_oos_score";

/// Live head swaps by route and outcome (`promoted`, `refused`, `abandoned`, `rolled_back`, `adopted`).
pub(crate) const HEAD_SWAPS_TOTAL: &str = "tiergate_head_swaps_total";
/// 1 while a replica does not serve the head the shared store says is promoted (it lacks the files).
pub(crate) const HEAD_BEHIND: &str = "tiergate_head_behind";
/// Requests a shadow head did not score because the prefilter's queue was above half full.
pub(crate) const SHADOW_SKIPPED_TOTAL: &str = "tiergate_shadow_skipped_total";

/// Answer-cache lookups by route, stage and result (`exact`, `semantic`, `miss`).
pub(crate) const CACHE_LOOKUPS_TOTAL: &str = "tiergate_cache_lookups_total";
/// Semantic candidates above τ the guards refused, by guard (`negation`, `quantity`, `exclusive`).
pub(crate) const CACHE_GUARD_REFUSALS_TOTAL: &str = "tiergate_cache_guard_refusals_total";
/// Verdicts stored in the answer cache, by route.
pub(crate) const CACHE_STORES_TOTAL: &str = "tiergate_cache_stores_total";
/// Entries and bytes the in-process answer cache holds.
pub(crate) const CACHE_ENTRIES: &str = "tiergate_cache_entries";
pub(crate) const CACHE_BYTES: &str = "tiergate_cache_bytes";
/// 1 while the shared (Redis) answer cache answers, 0 while lookups miss without it.
pub(crate) const CACHE_SHARED_UP: &str = "tiergate_cache_shared_up";

/// θ in force of each route's own policy (a steered route's, a cascade stage's), by route and stage.
pub(crate) const ROUTE_THETA_EFF: &str = "tiergate_route_theta_eff_ratio";
/// u that policy reads, by route and stage.
pub(crate) const ROUTE_UTILIZATION: &str = "tiergate_route_utilization_ratio";
/// Steered generate requests by route, stage and whether Tier-0 was sure.
pub(crate) const STEERED_TOTAL: &str = "tiergate_steered_total";
/// Session turns by route and what the pin did (`new`, `kept`, `up`, `switched`, `unpinned`).
pub(crate) const SESSION_TURNS_TOTAL: &str = "tiergate_session_turns_total";
/// Request fields set aside (accepted, not honoured), by door and field (`other` for a field no rule names).
pub(crate) const FIELDS_SET_ASIDE_TOTAL: &str = "tiergate_request_fields_set_aside_total";
/// Requests whose `max_tokens` was above what their route allows and was lowered to it, by door.
pub(crate) const MAX_TOKENS_CLAMPED_TOTAL: &str = "tiergate_max_tokens_clamped_total";
/// Session pins this replica holds in memory.
pub(crate) const SESSION_PINS: &str = "tiergate_session_pins";

const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.15, 0.3, 0.6, 1.2, 2.5, 4.5, 8.0, 12.0, 30.0,
    60.0,
];
const BATCH_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0];
const SCORE_BUCKETS: &[f64] = &[
    0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0,
];

/// Installs the global recorder and returns the handle that renders `/metrics`.
pub fn install() -> anyhow::Result<PrometheusHandle> {
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), LATENCY_BUCKETS)?
        .set_buckets_for_metric(Matcher::Full(PREFILTER_BATCH_SIZE.into()), BATCH_BUCKETS)?
        .set_buckets_for_metric(Matcher::Full(OOS_SCORE.into()), SCORE_BUCKETS)?
        .install_recorder()?;
    describe();
    Ok(handle)
}

fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(
        REQUESTS_TOTAL,
        "Chat requests by route, tier, channel (tier0, escalated, degraded, error) and outcome"
    );
    describe_gauge!(QUEUE_WAITING, "Escalations waiting for a worker");
    describe_counter!(
        FIELDS_SET_ASIDE_TOTAL,
        "Request fields accepted but not honoured, by door and field (other: a field no rule names)"
    );
    describe_counter!(
        MAX_TOKENS_CLAMPED_TOTAL,
        "Requests whose max_tokens was lowered to the route's ceiling, by door"
    );
    describe_counter!(
        EXPERIMENT_REQUESTS_TOTAL,
        "Requests on routes under a latency-injection experiment, by variant and route"
    );
    describe_histogram!(
        EXPERIMENT_REQUEST_SECONDS,
        Unit::Seconds,
        "Server-side latency of requests under an experiment (injected delay included), by variant"
    );
    describe_histogram!(
        EXPERIMENT_DELAY_SECONDS,
        Unit::Seconds,
        "Delay injected per request, by variant"
    );
    describe_gauge!(
        DEPENDENCY_UP,
        "1 while a dependency answers in time; 0 while its breaker is open and local state serves"
    );
    describe_counter!(
        DEPENDENCY_CALLS_TOTAL,
        "Calls to a dependency by outcome: ok, failed, late (past its deadline), skipped (breaker open)"
    );
    describe_gauge!(
        POLICY_STORE_UP,
        "1 while the shared policy store (Redis) answers; 0 while the last policy is served without it"
    );
    describe_histogram!(
        REQUEST_SECONDS,
        Unit::Seconds,
        "End-to-end request latency by route and tier"
    );
    describe_histogram!(PREFILTER_BATCH_SIZE, "Requests per prefilter forward pass");
    describe_gauge!(TENANTS, "Tenants in force");
    describe_gauge!(
        BROWNOUT_STEP,
        "The brownout ladder's step: 0 normal, 1 rerank only, 2 Tier-0 only, 3 shed"
    );
    describe_gauge!(
        BROWNOUT_PRESSURE,
        "The pressure the brownout ladder follows: the largest of queue fill, P95 against its limit, utilisation"
    );
    describe_counter!(
        RETRIES_TOTAL,
        "Rerank jobs run again on the same backend after an engine or protocol error"
    );
    describe_gauge!(
        BREAKER_OPEN,
        "1 while the LLM backend's circuit breaker is open or probing, 0 when closed"
    );
    describe_counter!(
        BREAKER_TRIPS_TOTAL,
        "Times the LLM backend's circuit breaker opened"
    );
    describe_counter!(
        UNREACHABLE_TOTAL,
        "LLM jobs not queued because they were predicted not to finish within their budget"
    );
    describe_counter!(
        EXPIRED_UNSTARTED_TOTAL,
        "LLM jobs whose deadline passed before a worker started them (taken back, never computed)"
    );
    describe_counter!(
        TENANT_LLM_SECONDS_TOTAL,
        "LLM time each tenant's jobs held a worker slot, microseconds"
    );
    describe_gauge!(
        TENANT_LIMITS_SHARED,
        "1 while tenants' rate and budget limits are shared through Redis, 0 while this replica enforces them alone"
    );
    describe_counter!(
        TENANTS_RELOAD_FAILURES_TOTAL,
        "Tenant reloads that failed (the keys in force stayed)"
    );
    describe_counter!(
        RISK_BREACHES_TOTAL,
        "Requests the error bound needed the LLM for that it could not take, by route and action"
    );
    describe_gauge!(
        RISK_THETA,
        "The theta the error bound (routing.max_error) allows, by route"
    );
    describe_gauge!(
        RISK_CALIBRATION_FLAWED,
        "1 while a route's error bound rests on flawed (in-sample or incomplete) calibration rows, by route"
    );
    describe_gauge!(
        RISK_AUDIT_BREACH,
        "1 while the labelled audits show the error bound broken on live traffic, by route"
    );
    describe_gauge!(
        RISK_UPPER_BOUND,
        "Clopper-Pearson upper bound on the calibration rows' error at the bound's theta, by route"
    );
    describe_gauge!(
        ROUTE_THETA_EFF,
        "Theta in force of a route's own policy (a steered generate route's: stage=\"\"; a cascade stage's), by route and stage"
    );
    describe_gauge!(
        ROUTE_UTILIZATION,
        "Utilisation u a route's own policy reads, by route and stage"
    );
    describe_counter!(
        STEERED_TOTAL,
        "Steered generate requests, by route, stage chosen and sure (Tier-0 sure of a mapped label)"
    );
    describe_counter!(
        SESSION_TURNS_TOTAL,
        "Turns of pinned sessions by route and outcome (new, kept, up: a stronger stage, switched: the pinned backend unhealthy or out of budget, unpinned: sessions off)"
    );
    describe_gauge!(SESSION_PINS, "Session pins held in this replica's memory");
    describe_gauge!(
        LEDGER_SPOOLED,
        "Decision records held by the ledger's writer while its store fails (written once it answers)"
    );
    describe_counter!(
        LEDGER_DROPPED_TOTAL,
        "Decision records dropped: the writer's queue was full, or the store failed with the spool full"
    );
    describe_counter!(
        FEEDBACK_TOTAL,
        "Feedback given, by route, channel, trusted and correct"
    );
    describe_gauge!(
        SILENT_ERROR,
        "Tier-0's silent error from labelled audits, by route and bound (estimate, lower, upper of a 95% Clopper-Pearson interval)"
    );
    describe_gauge!(AUDITS, "Audit items by route and state (pending, labelled)");
    describe_counter!(
        AUDIT_LLM_TOTAL,
        "Audited answers handed to the LLM in the background, by route and result (agree, disagree, shed, failed)"
    );
    describe_gauge!(
        AUDIT_LLM_AGREEMENT,
        "Agreement between the LLM and Tier-0 on audited answers, by route (a proxy, not accuracy)"
    );
    describe_gauge!(
        FEEDBACK_ACCURACY,
        "Accuracy of the answers by feedback, by route and channel (self-selected: not an estimate of error)"
    );
    describe_counter!(
        HEAD_SWAPS_TOTAL,
        "Live head swaps by route and outcome (promoted, refused, abandoned, rolled_back, adopted)"
    );
    describe_gauge!(
        HEAD_BEHIND,
        "1 while this replica lacks the files of the head the shared store says is promoted"
    );
    describe_counter!(
        SHADOW_SKIPPED_TOTAL,
        "Requests a shadow head did not score: the prefilter's queue was above half full"
    );
    describe_counter!(
        CACHE_LOOKUPS_TOTAL,
        "Answer-cache lookups before the LLM, by route, stage and result (exact, semantic, miss)"
    );
    describe_counter!(
        CACHE_GUARD_REFUSALS_TOTAL,
        "Semantic cache candidates above tau that a guard refused, by guard (negation, quantity, exclusive)"
    );
    describe_counter!(
        CACHE_STORES_TOTAL,
        "LLM verdicts stored in the answer cache, by route"
    );
    describe_gauge!(CACHE_ENTRIES, "Entries in the in-process answer cache");
    describe_gauge!(
        CACHE_BYTES,
        "Bytes the in-process answer cache holds (as its bound counts them)"
    );
    describe_gauge!(
        CACHE_SHARED_UP,
        "1 while the shared answer cache (Redis) answers, 0 while it is skipped (lookups miss, nothing fails)"
    );
    describe_histogram!(
        OOS_SCORE,
        "Tier-0's out-of-scope score per request (routes with an out-of-scope outcome)"
    );
    describe_histogram!(PREFILTER_SECONDS, Unit::Seconds, "Prefilter forward time");
    describe_histogram!(
        PREFILTER_QUEUE_SECONDS,
        Unit::Seconds,
        "Wait for the prefilter batching thread"
    );
    describe_gauge!(QUEUE_DEPTH, "Escalation jobs in flight");
    describe_histogram!(
        QUEUE_WAIT_SECONDS,
        Unit::Seconds,
        "Escalation submit to first event"
    );
    describe_histogram!(
        RERANK_SECONDS,
        Unit::Seconds,
        "Rerank round trip, by cascade stage and the backend that answered"
    );
    describe_histogram!(
        TTFT_SECONDS,
        Unit::Seconds,
        "Time to first streamed LLM token"
    );
    describe_gauge!(
        ESCALATION_SHARE,
        "Share of classified requests escalated over 60 s"
    );
    describe_gauge!(THETA_EFF, "Escalation threshold in force");
    describe_gauge!(UTILIZATION, "Smoothed accelerator utilisation u");
    describe_counter!(WORKER_RESTARTS, "Reranker worker restarts");
    describe_gauge!(POLICY_VERSION, "Routing policy version");
}
