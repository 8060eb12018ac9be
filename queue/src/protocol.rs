//! What travels through a slot. Requests are one document written once into the slot. Responses are a
//! sequence of frames `[u32 little-endian length][u8 kind][payload]` appended by the worker: token chunks while
//! generating, then exactly one final frame (reply or error).
//!
//! Jobs and replies are encoded with `postcard` (compact binary serde; both ends are the same build, checked by
//! the segment's layout version): JSON cost ~10 µs of CPU per round trip of a 1.2 KB rerank job, most of the
//! queue's latency budget. Decoding is bounds-checked and fails with an error on any malformed input.

use serde::{Deserialize, Serialize};

use crate::error::{QueueError, Result};
use tiergate_config::PromptConfig;

/// One candidate label for a rerank job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Candidate {
    /// Label name.
    pub label: String,
    /// The label's reply text (answer routes).
    #[serde(default)]
    pub reply: Option<String>,
    /// One sentence saying what the label means (a head's label descriptions), shown to the judge.
    #[serde(default)]
    pub description: Option<String>,
    /// Representative utterances of the label (what the LLM reads to know what the label means).
    #[serde(default)]
    pub examples: Vec<String>,
    /// Tier-0's probability for this label.
    pub p: f32,
}

/// A chat message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Message {
    /// `system`, `user`, `assistant` or `tool` (a tool's result).
    pub role: String,
    /// The text (a tool message: the tool's output).
    pub content: String,
    /// The calls an assistant turn made.
    #[serde(default)]
    pub tool_calls: Vec<ToolCall>,
    /// The call a tool message answers.
    #[serde(default)]
    pub tool_call_id: Option<String>,
}

impl Message {
    /// A turn of text alone (no calls, answering none).
    pub fn text(role: &str, content: &str) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
            ..Self::default()
        }
    }
}

/// A function call the model made (or an earlier turn made).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The call's id (a tool message names it).
    pub id: String,
    /// The function's name.
    pub name: String,
    /// Its arguments, a JSON document as text.
    pub arguments: String,
}

/// A function the model may call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tool {
    /// The function's name.
    pub name: String,
    /// What it does.
    #[serde(default)]
    pub description: Option<String>,
    /// Its parameters' JSON Schema, as text (postcard cannot carry a self-describing JSON value).
    pub parameters: String,
}

/// Whether and which tool the model must call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ToolChoice {
    /// The model decides.
    #[default]
    Auto,
    /// No call.
    None,
    /// At least one call (not every engine can force this: it says so).
    Required,
    /// A call of this function.
    Function(String),
}

/// The tools of a generation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Tools {
    /// The functions offered.
    pub list: Vec<Tool>,
    /// What the model must do with them.
    pub choice: ToolChoice,
    /// Several calls in one turn are allowed.
    pub parallel: bool,
}

/// Sampling parameters for generation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Sampling {
    /// Most tokens to generate.
    pub max_tokens: u32,
    /// Temperature (0: greedy).
    #[serde(default)]
    pub temperature: Option<f32>,
    /// Nucleus sampling mass.
    #[serde(default)]
    pub top_p: Option<f32>,
    /// Stop strings.
    #[serde(default)]
    pub stop: Vec<String>,
    /// Sampling seed.
    #[serde(default)]
    pub seed: Option<u64>,
    /// A JSON Schema the answer must follow (constrained decoding), as JSON text.
    #[serde(default)]
    pub json_schema: Option<String>,
    /// Only count the prompt's tokens (`count_tokens`): an engine that can tokenises the rendered prompt and
    /// ends with 0 completion tokens, reading nothing; the others generate `max_tokens` (1) as usual.
    #[serde(default)]
    pub count_only: bool,
}

/// A job for a worker (externally tagged: an internally tagged enum cannot be decoded from a non-self-describing
/// format, and makes serde buffer the whole document).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
// A rerank carries the route's templates inline; a job is built once per escalation and moved, never stored in
// bulk, so boxing them would only add an allocation.
#[allow(clippy::large_enum_variant)]
pub enum Job {
    /// Score Tier-0's candidates for `text` with the LLM (the server fuses the scores with Tier-0's).
    Rerank {
        /// The user text.
        text: String,
        /// Candidates, most likely first.
        candidates: Vec<Candidate>,
        /// The route's prompt templates.
        #[serde(default)]
        prompt: PromptConfig,
    },
    /// Generate a chat reply, streamed.
    Generate {
        /// The conversation.
        messages: Vec<Message>,
        /// Sampling parameters.
        sampling: Sampling,
        /// The functions it may call; none: a plain generation.
        #[serde(default)]
        tools: Option<Tools>,
    },
}

/// A rerank answer: the LLM's scores, which the server turns into a distribution and fuses.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RerankReply {
    /// The LLM's raw score per candidate, input order (log-domain: higher is likelier).
    pub scores: Vec<f32>,
    /// Prompt tokens the LLM read.
    pub prompt_tokens: u32,
}

/// Token usage at the end of a generation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// Generated tokens.
    pub completion_tokens: u32,
    /// Prompt tokens found in the engine's prompt cache, not read again (`None`: the engine does not say).
    #[serde(default)]
    pub cached_tokens: Option<u32>,
    /// `stop`, `length`, `tool_calls` or `cancelled`.
    pub finish_reason: String,
    /// The stop sequence that ended it, when one did (engines that know which).
    #[serde(default)]
    pub stop_sequence: Option<String>,
}

/// How a worker's error message starts when the engine refused the request itself (a prompt longer than the
/// context window, a NUL byte): the server answers it as the client's error (400), never retries it.
pub const INVALID_REQUEST: &str = "invalid request: ";

/// The final answer of a job (externally tagged, as [`Job`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reply {
    /// Answer to [`Job::Rerank`].
    Rerank(RerankReply),
    /// End of a [`Job::Generate`] stream.
    Generated(Usage),
}

/// Frame kinds.
pub mod frame {
    /// A UTF-8 token chunk.
    pub const CHUNK: u8 = 1;
    /// The final reply ([`super::Reply`], see [`super::encode_reply`]).
    pub const REPLY: u8 = 2;
    /// The final error (UTF-8 message).
    pub const ERROR: u8 = 3;
    /// One whole tool call ([`super::ToolCall`], postcard).
    pub const TOOL_CALL: u8 = 4;
}

/// The submitter's trace context (W3C header values), carried with a job so that the worker's spans continue
/// the request's trace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct TraceParent {
    /// `traceparent`.
    pub traceparent: String,
    /// `tracestate` (may be empty).
    pub tracestate: String,
}

/// Encodes a job for a slot.
pub fn encode_job(job: &Job) -> Result<Vec<u8>> {
    encode_job_traced(job, None)
}

/// Encodes a job and its trace context for a slot: the document is `(Option<TraceParent>, Job)`.
pub fn encode_job_traced(job: &Job, trace: Option<&TraceParent>) -> Result<Vec<u8>> {
    postcard::to_allocvec(&(trace, job))
        .map_err(|e| QueueError::Invalid(format!("cannot encode job: {e}")))
}

/// Decodes a job read from a slot (untrusted bytes).
pub fn decode_job(bytes: &[u8]) -> Result<Job> {
    decode_job_traced(bytes).map(|(job, _)| job)
}

/// Decodes a job and its trace context read from a slot (untrusted bytes).
pub fn decode_job_traced(bytes: &[u8]) -> Result<(Job, Option<TraceParent>)> {
    postcard::from_bytes::<(Option<TraceParent>, Job)>(bytes)
        .map(|(trace, job)| (job, trace))
        .map_err(|e| QueueError::Protocol(format!("bad job: {e}")))
}

/// Encodes a final reply.
pub fn encode_reply(reply: &Reply) -> Result<Vec<u8>> {
    postcard::to_allocvec(reply)
        .map_err(|e| QueueError::Protocol(format!("cannot encode reply: {e}")))
}

/// Decodes a final reply (untrusted bytes).
pub fn decode_reply(bytes: &[u8]) -> Result<Reply> {
    postcard::from_bytes(bytes).map_err(|e| QueueError::Protocol(format!("bad reply: {e}")))
}

/// Bytes of a frame header.
pub const FRAME_HEADER: usize = 5;

/// Encodes one frame.
pub fn encode_frame(kind: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(FRAME_HEADER + payload.len());
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.push(kind);
    out.extend_from_slice(payload);
    out
}

/// A decoded frame.
#[derive(Debug, Clone, PartialEq)]
pub enum Frame {
    /// A token chunk.
    Chunk(String),
    /// The final reply.
    Reply(Reply),
    /// The final error.
    Error(String),
    /// A whole tool call.
    ToolCall(ToolCall),
}

/// Encodes a tool call for a [`frame::TOOL_CALL`] frame.
pub fn encode_tool_call(call: &ToolCall) -> Result<Vec<u8>> {
    postcard::to_allocvec(call)
        .map_err(|e| QueueError::Protocol(format!("cannot encode tool call: {e}")))
}

/// Decodes the complete frames in `bytes`; returns them and the number of bytes consumed. A frame that claims
/// more bytes than present is left for later; a malformed one is a protocol error.
pub fn decode_frames(bytes: &[u8]) -> Result<(Vec<Frame>, usize)> {
    let mut frames = Vec::new();
    let mut at = 0usize;
    while bytes.len() - at >= FRAME_HEADER {
        let mut len = [0u8; 4];
        len.copy_from_slice(&bytes[at..at + 4]);
        let len = u32::from_le_bytes(len) as usize;
        let kind = bytes[at + 4];
        let Some(end) = (at + FRAME_HEADER).checked_add(len) else {
            return Err(QueueError::Protocol("frame length overflows".into()));
        };
        if end > bytes.len() {
            break;
        }
        let payload = &bytes[at + FRAME_HEADER..end];
        let text = || {
            std::str::from_utf8(payload)
                .map(str::to_string)
                .map_err(|_| QueueError::Protocol("frame payload is not UTF-8".into()))
        };
        frames.push(match kind {
            frame::CHUNK => Frame::Chunk(text()?),
            frame::REPLY => Frame::Reply(decode_reply(payload)?),
            frame::ERROR => Frame::Error(text()?),
            frame::TOOL_CALL => Frame::ToolCall(
                postcard::from_bytes(payload)
                    .map_err(|e| QueueError::Protocol(format!("bad tool call: {e}")))?,
            ),
            other => return Err(QueueError::Protocol(format!("unknown frame kind {other}"))),
        });
        at = end;
    }
    Ok((frames, at))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_partial_frames_wait() {
        let reply = Reply::Generated(Usage {
            prompt_tokens: 3,
            completion_tokens: 2,
            cached_tokens: Some(1),
            finish_reason: "stop".into(),
            stop_sequence: None,
        });
        let mut bytes = encode_frame(frame::CHUNK, "Hel".as_bytes());
        bytes.extend(encode_frame(frame::CHUNK, "lo".as_bytes()));
        let encoded = encode_reply(&reply).unwrap();
        bytes.extend(encode_frame(frame::REPLY, &encoded));
        let (frames, used) = decode_frames(&bytes[..bytes.len() - 1]).unwrap();
        assert_eq!(
            frames,
            vec![Frame::Chunk("Hel".into()), Frame::Chunk("lo".into())]
        );
        let (rest, used2) = decode_frames(&bytes[used..]).unwrap();
        let call = ToolCall {
            id: "call_1".into(),
            name: "get_weather".into(),
            arguments: r#"{"city":"Zürich"}"#.into(),
        };
        let framed = encode_frame(frame::TOOL_CALL, &encode_tool_call(&call).unwrap());
        assert_eq!(
            decode_frames(&framed).unwrap().0,
            vec![Frame::ToolCall(call)]
        );
        assert!(decode_frames(&encode_frame(frame::TOOL_CALL, b"\xff")).is_err());
        assert_eq!(rest, vec![Frame::Reply(reply)]);
        assert_eq!(used + used2, bytes.len());
    }

    #[test]
    fn jobs_and_replies_round_trip_and_garbage_fails() {
        let job = Job::Rerank {
            text: "my card has not arrived ü".into(),
            candidates: vec![Candidate {
                label: "card_arrival".into(),
                reply: Some("It is on its way.".into()),
                description: Some("The card has not arrived.".into()),
                examples: vec!["where is my card".into()],
                p: 0.7,
            }],
            prompt: PromptConfig::default(),
        };
        let bytes = encode_job(&job).unwrap();
        assert_eq!(decode_job(&bytes).unwrap(), job);
        let trace = TraceParent {
            traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".into(),
            tracestate: "congo=t61rcWkgMzE".into(),
        };
        let traced = encode_job_traced(&job, Some(&trace)).unwrap();
        assert_eq!(
            decode_job_traced(&traced).unwrap(),
            (job.clone(), Some(trace))
        );
        assert_eq!(decode_job_traced(&bytes).unwrap(), (job.clone(), None));
        for cut in 0..bytes.len() {
            // Truncated anywhere: an error (or, at a boundary postcard cannot see, a different job), never a panic.
            let _ = decode_job(&bytes[..cut]);
        }
        assert!(decode_job(b"{not a job").is_err());
        // A length prefix claiming far more than the input fails instead of allocating it.
        assert!(decode_job(&[0, 0xff, 0xff, 0xff, 0xff, 0x0f]).is_err());
        let reply = Reply::Rerank(RerankReply {
            scores: vec![-1.0, -0.5],
            prompt_tokens: 40,
        });
        assert_eq!(decode_reply(&encode_reply(&reply).unwrap()).unwrap(), reply);
    }

    #[test]
    fn garbage_is_a_protocol_error_not_a_panic() {
        assert!(
            decode_frames(&[1, 0, 0, 0, 9, b'x']).is_err(),
            "unknown kind"
        );
        assert!(
            decode_frames(&[2, 0, 0, 0, frame::CHUNK, 0xff, 0xfe]).is_err(),
            "not UTF-8"
        );
        assert!(
            decode_frames(&[3, 0, 0, 0, frame::REPLY, 9, b'x', b'}']).is_err(),
            "bad reply"
        );
        let (f, used) = decode_frames(&[0xff, 0xff, 0xff, 0xff, frame::CHUNK]).unwrap();
        assert!(
            f.is_empty() && used == 0,
            "a frame claiming 4 GB just waits (the reader bounds it)"
        );
    }
}
