//! The worker's spans: one per job, a child of the span that submitted it (the trace context travels with the
//! job through the queue), with the model's steps as its children: `prefill` (a rerank's scoring pass, or a
//! generation's prompt up to its first token) and `decode` (the generated tokens).

use std::time::SystemTime;

use tiergate_queue::{Job, TraceParent, Usage};
use tiergate_telemetry::{record_child, w3c, KeyValue, TARGET};

use crate::engine::{EngineError, Scored};

/// One job's trace.
pub struct JobTrace {
    span: tracing::Span,
    started: SystemTime,
    first_token: Option<SystemTime>,
}

impl JobTrace {
    /// Opens the job's span under the submitter's context (a new trace without one: then it is not sampled).
    pub fn start(job: &Job, trace: Option<&TraceParent>) -> Self {
        let kind = match job {
            Job::Rerank { .. } => "rerank",
            Job::Generate { .. } => "generate",
        };
        let span = tracing::info_span!(target: TARGET, "worker.job", otel.kind = "consumer", job.kind = kind);
        if let Some(t) = trace {
            tiergate_telemetry::set_parent(
                &span,
                w3c::extract(Some(&t.traceparent), Some(&t.tracestate)),
            );
        }
        Self {
            span,
            started: SystemTime::now(),
            first_token: None,
        }
    }

    /// Opens the span of a taken job: returns the job, its handle and its trace.
    pub fn of(taken: tiergate_queue::TakenJob) -> (Job, tiergate_queue::Taken, Self) {
        let trace = Self::start(&taken.job, taken.trace.as_ref());
        (taken.job, taken.taken, trace)
    }

    /// The job's span.
    pub fn span(&self) -> &tracing::Span {
        &self.span
    }

    /// Notes a generated chunk (the first one ends the prefill).
    pub fn token(&mut self) {
        self.first_token.get_or_insert_with(SystemTime::now);
    }

    /// Records a rerank's scoring pass.
    pub fn scored(&self, candidates: usize, result: &Result<Scored, EngineError>) {
        let mut attrs = vec![KeyValue::new("llm.candidates", candidates as i64)];
        if let Ok(s) = result {
            attrs.push(KeyValue::new(
                "llm.prompt_tokens",
                i64::from(s.prompt_tokens),
            ));
        }
        record_child(
            &self.span,
            "prefill",
            self.started,
            SystemTime::now(),
            attrs,
        );
        self.outcome(result.as_ref().err());
    }

    /// Records a generation's prefill (to the first token) and decode (the rest).
    pub fn generated(&self, result: &Result<Usage, EngineError>) {
        let end = SystemTime::now();
        let first = self.first_token.unwrap_or(end);
        let (prompt, completion) = result.as_ref().map_or((0, 0), |u| {
            (i64::from(u.prompt_tokens), i64::from(u.completion_tokens))
        });
        record_child(
            &self.span,
            "prefill",
            self.started,
            first,
            vec![KeyValue::new("llm.prompt_tokens", prompt)],
        );
        if self.first_token.is_some() {
            record_child(
                &self.span,
                "decode",
                first,
                end,
                vec![KeyValue::new("llm.completion_tokens", completion)],
            );
        }
        self.outcome(result.as_ref().err());
    }

    fn outcome(&self, error: Option<&EngineError>) {
        if let Some(e) = error {
            tiergate_telemetry::set_error(&self.span, &e.to_string());
        }
    }
}
