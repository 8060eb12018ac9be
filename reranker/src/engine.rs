//! The contract between the job loop and an LLM engine.

use tiergate_config::PromptConfig;
use tiergate_queue::{Candidate, Message, Sampling, ToolCall, Tools, Usage};

/// An engine failure (reported to the submitter as the job's error).
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The submitter gave up; the work was stopped.
    #[error("cancelled")]
    Cancelled,
    /// The request cannot be run (empty candidates, prompt too long, …).
    #[error("invalid request: {0}")]
    Invalid(String),
    /// The engine failed while running it.
    #[error("engine failed: {0}")]
    Failed(String),
}

/// The LLM's view of a rerank job.
#[derive(Debug, Clone, PartialEq)]
pub struct Scored {
    /// Score per candidate (input order), log domain: the LLM's distribution is their softmax.
    pub scores: Vec<f32>,
    /// Prompt tokens read.
    pub prompt_tokens: u32,
}

/// An LLM engine. Methods block; the job loop calls them from several threads at once.
pub trait Engine: Send + Sync {
    /// Short name for logs.
    fn name(&self) -> &str;

    /// Scores `candidates` as answers for `text` (prefill only) with the route's prompt templates.
    /// `cancelled` says whether the submitter has given up (deadline, disconnect): an engine checks it
    /// between passes and stops early.
    fn score(
        &self,
        text: &str,
        candidates: &[Candidate],
        prompt: &PromptConfig,
        cancelled: &dyn Fn() -> bool,
    ) -> Result<Scored, EngineError>;

    /// Called as each job starts; fault injection (only the stub does anything here). True: answer this job
    /// with garbage.
    fn on_job_start(&self) -> bool {
        false
    }

    /// Generates a reply, calling `on_piece` with each text chunk and each whole tool call; `on_piece`
    /// returning false stops early (cancelled). `tools`: the functions it may call — an engine that cannot
    /// honour them (or their choice) answers [`EngineError::Invalid`], never a silent plain text. Returns the
    /// usage (`finish_reason` `tool_calls` when it called).
    fn generate(
        &self,
        messages: &[Message],
        sampling: &Sampling,
        tools: Option<&Tools>,
        on_piece: &mut dyn FnMut(Piece<'_>) -> bool,
    ) -> Result<Usage, EngineError>;
}

/// What a generation produces, piece by piece.
#[derive(Debug, Clone, PartialEq)]
pub enum Piece<'a> {
    /// A text chunk.
    Text(&'a str),
    /// A whole tool call.
    Call(ToolCall),
    /// A forward pass that produced no output yet (a prompt chunk read): `on_piece` counts the progress and
    /// answers false when the submitter has given up, so a long prefill stops between chunks.
    Progress,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_request_says_so_in_the_queues_words() {
        let e = EngineError::Invalid("the prompt is too long".into()).to_string();
        assert!(
            e.starts_with(tiergate_queue::protocol::INVALID_REQUEST),
            "{e}"
        );
    }
}
