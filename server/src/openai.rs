//! OpenAI chat wire types (what clients send and receive). A request field this server does not honour is set
//! aside by the rule in [`tiergate_engine::answer::fields`] and named in `x-tiergate-set-aside`, never
//! dropped in silence.

use serde::{Deserialize, Serialize};

/// `POST /v1/chat/completions` body, as sent. Validation turns it into [`crate::validate::ValidChat`].
#[derive(Debug, Clone, Deserialize)]
pub struct ChatRequest {
    /// The route name.
    pub model: String,
    /// The conversation.
    pub messages: Vec<WireMessage>,
    /// Stream as server-sent events.
    #[serde(default)]
    pub stream: Option<bool>,
    /// Streaming options.
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    /// Most tokens to generate (legacy name).
    #[serde(default)]
    pub max_tokens: Option<i64>,
    /// Most tokens to generate.
    #[serde(default)]
    pub max_completion_tokens: Option<i64>,
    /// Sampling temperature, 0..=2.
    #[serde(default)]
    pub temperature: Option<f64>,
    /// Nucleus mass, (0, 1].
    #[serde(default)]
    pub top_p: Option<f64>,
    /// Stop string or strings.
    #[serde(default)]
    pub stop: Option<Stop>,
    /// Sampling seed.
    #[serde(default)]
    pub seed: Option<i64>,
    /// End-user id (logged).
    #[serde(default)]
    pub user: Option<String>,
    /// Choices wanted (only 1 is supported).
    #[serde(default)]
    pub n: Option<i64>,
    /// Return log-probabilities (classify routes: the label probabilities).
    #[serde(default)]
    pub logprobs: Option<bool>,
    /// How many alternatives per position, 0..=20.
    #[serde(default)]
    pub top_logprobs: Option<i64>,
    /// `{"type":"text"}` or `{"type":"json_object"}`.
    #[serde(default)]
    pub response_format: Option<ResponseFormat>,
    /// Tool use (`tools`, `tool_choice`, `parallel_tool_calls`; the older `functions`/`function_call` are
    /// read so that they are refused by name, never answered as if they were not there).
    #[serde(default)]
    pub tools: Option<serde_json::Value>,
    #[serde(default)]
    pub tool_choice: Option<serde_json::Value>,
    #[serde(default)]
    pub parallel_tool_calls: Option<serde_json::Value>,
    #[serde(default)]
    pub functions: Option<serde_json::Value>,
    #[serde(default)]
    pub function_call: Option<serde_json::Value>,
    /// OpenAI's prompt-cache key: a session key here (a conversation's turns stay on one backend, whose
    /// prompt cache is warm).
    #[serde(default)]
    pub prompt_cache_key: Option<String>,
    /// Every other field, by name: set aside (named in the response's `x-tiergate-set-aside`).
    #[serde(flatten)]
    pub other: serde_json::Map<String, serde_json::Value>,
    /// Fields another door set aside before mapping its request onto this one (`thinking`, `reasoning`, …).
    #[serde(skip)]
    pub set_aside: Vec<String>,
    /// Session keys the client's own wire carries, most specific first (Claude Code's and Codex's session ids,
    /// `prompt_cache_key`), set by the door that read them.
    #[serde(skip)]
    pub client_sessions: Vec<String>,
}

/// A message as sent.
#[derive(Debug, Clone, Deserialize)]
pub struct WireMessage {
    /// `system`, `developer`, `user`, `assistant` or `tool`.
    pub role: String,
    /// Text, or a list of content parts (text parts are joined).
    #[serde(default)]
    pub content: Option<Content>,
    /// An assistant turn's tool calls.
    #[serde(default)]
    pub tool_calls: Option<serde_json::Value>,
    /// The call a `tool` message answers.
    #[serde(default)]
    pub tool_call_id: Option<String>,
}

/// Message content.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Content {
    /// Plain text.
    Text(String),
    /// Content parts.
    Parts(Vec<ContentPart>),
}

/// One content part.
#[derive(Debug, Clone, Deserialize)]
pub struct ContentPart {
    /// Part type (`text` is used; others are rejected).
    #[serde(rename = "type")]
    pub kind: String,
    /// The text of a text part.
    #[serde(default)]
    pub text: Option<String>,
}

/// `stop`: one string or several.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    /// One.
    One(String),
    /// Several.
    Many(Vec<String>),
}

/// Streaming options.
#[derive(Debug, Clone, Deserialize)]
pub struct StreamOptions {
    /// Send a last chunk with usage.
    #[serde(default)]
    pub include_usage: Option<bool>,
}

/// Response format.
#[derive(Debug, Clone, Deserialize)]
pub struct ResponseFormat {
    /// `text`, `json_object` or `json_schema`.
    #[serde(rename = "type")]
    pub kind: String,
    /// `json_schema`'s `{name, schema, strict}`.
    #[serde(default)]
    pub json_schema: Option<serde_json::Value>,
}

/// Token usage.
#[derive(Debug, Clone, Serialize, PartialEq, Default)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// Completion tokens.
    pub completion_tokens: u32,
    /// Sum.
    pub total_tokens: u32,
    /// `cached_tokens`: prompt tokens the backend found in its prompt cache (0 where it does not say).
    pub prompt_tokens_details: PromptTokensDetails,
}

/// `usage.prompt_tokens_details`.
#[derive(Debug, Clone, Serialize, PartialEq, Default)]
pub struct PromptTokensDetails {
    /// Prompt tokens read from a prompt cache.
    pub cached_tokens: u32,
}

impl Usage {
    /// Usage from the two counts.
    pub fn new(prompt: u32, completion: u32) -> Self {
        Self {
            prompt_tokens: prompt,
            completion_tokens: completion,
            total_tokens: prompt + completion,
            prompt_tokens_details: PromptTokensDetails::default(),
        }
    }

    /// With the prompt tokens the backend found cached.
    pub fn cached(mut self, cached: u32) -> Self {
        self.prompt_tokens_details.cached_tokens = cached.min(self.prompt_tokens);
        self
    }
}

/// One alternative in `top_logprobs`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TopLogprob {
    /// The label.
    pub token: String,
    /// Its natural-log probability.
    pub logprob: f64,
    /// UTF-8 bytes (OpenAI sends them; may be null).
    pub bytes: Option<Vec<u8>>,
}

/// Log-probability of one output position.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TokenLogprob {
    /// The label returned.
    pub token: String,
    /// Its log-probability.
    pub logprob: f64,
    /// UTF-8 bytes.
    pub bytes: Option<Vec<u8>>,
    /// The most likely labels.
    pub top_logprobs: Vec<TopLogprob>,
}

/// `choices[].logprobs`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Logprobs {
    /// One entry (the label is one "token").
    pub content: Vec<TokenLogprob>,
}
