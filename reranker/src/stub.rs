//! A deterministic stub engine: fixed scores and tokens, with knobs for delay, crash, hang and garbage, so the
//! queue, the supervision and the server can be tested (and run) without a model.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tiergate_queue::{Candidate, Message, Sampling, ToolCall, ToolChoice, Tools, Usage};

use crate::engine::{Engine, EngineError, Piece, Scored};
use tiergate_config::PromptConfig;

/// Fault-injection and timing knobs.
#[derive(Debug, Clone, Default)]
pub struct StubKnobs {
    /// Time each job takes.
    pub delay: Duration,
    /// Abort the process when starting job number N (1-based).
    pub crash_after: Option<u64>,
    /// Freeze the whole process (heartbeat included) when starting job number N.
    pub hang_after: Option<u64>,
    /// Answer every N-th job with bytes that break the protocol.
    pub garbage_every: Option<u64>,
    /// Job number N never returns from the engine (only its thread blocks; the heartbeat goes on).
    pub stuck_after: Option<u64>,
    /// Every generation fails after its first token.
    pub fail_mid_stream: bool,
    /// A job's delay runs uninterrupted (a forward pass cannot be cancelled half-way) and counts progress every
    /// 10 ms, as a model's forward passes would.
    pub progress: bool,
    /// An agent's script: which tool to call, with which arguments, when a conversation offers it.
    pub script: Option<AgentScript>,
}

/// A scripted agent turn for the real agent CLIs' tests (a fake model: none that runs here calls tools
/// reliably): offered one of the scripted tools, the stub calls the first it finds, with its scripted
/// arguments; given the tool's result, it answers with that result's text — so a word in the answer can
/// only have come through the tool-result block the client sent back.
#[derive(Debug, Clone, Default, serde::Deserialize)]
pub struct AgentScript {
    /// Tool name → the arguments of its call (a JSON object), in the order they are tried.
    pub calls: Vec<(String, serde_json::Value)>,
}

/// The stub engine.
pub struct StubEngine {
    knobs: StubKnobs,
    jobs: AtomicU64,
    /// Words of each rendered label prefix, by a hash of what renders it: the stub keeps its own cost near
    /// zero (the queue bench measures the queue), and caches per label prefix as the channel scorer does.
    prefix_words: std::sync::Mutex<std::collections::HashMap<u64, usize>>,
}

/// Entries kept in the stub's word-count cache before it is cleared.
const PREFIX_CACHE_ENTRIES: usize = 4096;

impl StubEngine {
    /// A stub with these knobs.
    pub fn new(knobs: StubKnobs) -> Self {
        Self {
            knobs,
            jobs: AtomicU64::new(0),
            prefix_words: Default::default(),
        }
    }

    fn start_job(&self) -> bool {
        let n = self.jobs.fetch_add(1, Ordering::SeqCst) + 1;
        if self.knobs.crash_after == Some(n) {
            tracing::error!(job = n, "stub engine: crashing as configured");
            std::process::abort();
        }
        if self.knobs.stuck_after == Some(n) {
            tracing::error!(
                job = n,
                "stub engine: this job never returns, as configured"
            );
            loop {
                std::thread::park();
            }
        }
        if self.knobs.hang_after == Some(n) {
            tracing::error!(job = n, "stub engine: freezing the process as configured");
            // SAFETY: raise only sends a signal to this process; SIGSTOP stops every thread until SIGCONT/SIGKILL.
            unsafe { libc::raise(libc::SIGSTOP) };
        }
        self.knobs
            .garbage_every
            .is_some_and(|k| k > 0 && n.is_multiple_of(k))
    }

    /// Words of candidate `c`'s rendered label prefix; `prompt_key`: [`prefix_key`] of the templates.
    fn prefix_words(&self, c: &Candidate, prompt: &PromptConfig, prompt_key: u64) -> usize {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (prompt_key, &c.label, &c.reply, &c.description, &c.examples).hash(&mut h);
        let key = h.finish();
        let Ok(mut cache) = self.prefix_words.lock() else {
            return 0;
        };
        if let Some(&n) = cache.get(&key) {
            return n;
        }
        if cache.len() >= PREFIX_CACHE_ENTRIES {
            cache.clear();
        }
        let n = crate::prompt::channel_prefix(c, prompt)
            .split_ascii_whitespace()
            .count();
        cache.insert(key, n);
        n
    }
}

/// Sleeps `d` in short steps, as an engine works in passes; false when `cancelled` said stop first.
fn sleep_unless_cancelled(d: Duration, cancelled: &dyn Fn() -> bool, progress: bool) -> bool {
    let end = std::time::Instant::now() + d;
    loop {
        let left = end.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return true;
        }
        if cancelled() && !progress {
            return false;
        }
        std::thread::sleep(left.min(Duration::from_millis(10)));
        if progress {
            tiergate_queue::worker::note_progress();
        }
    }
}

/// A hash of the templates that render a label prefix.
fn prefix_key(prompt: &PromptConfig) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (
        &prompt.label_prefix,
        &prompt.example_line,
        prompt.max_examples,
    )
        .hash(&mut h);
    h.finish()
}

/// Lower-cased words of `text` (`card_arrival` → `card`, `arrival`): split at ASCII punctuation and spaces,
/// bytewise (every non-ASCII character counts as a word character, so the cuts are always at character
/// boundaries).
fn words(text: &str) -> Vec<String> {
    text.as_bytes()
        .split(|b| b.is_ascii() && !b.is_ascii_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(|w| String::from_utf8_lossy(w).to_ascii_lowercase())
        .collect()
}

impl Engine for StubEngine {
    fn name(&self) -> &str {
        "stub"
    }

    /// Counts the job and applies the crash / hang / garbage knobs.
    fn on_job_start(&self) -> bool {
        self.start_job()
    }

    /// Score = ln(1 + 3 × words the text shares with the label): deterministic and easy to predict in tests.
    /// `prompt_tokens` counts the words of the channel prompts the templates render (so tests see which
    /// templates reached the engine).
    fn score(
        &self,
        text: &str,
        candidates: &[Candidate],
        prompt: &PromptConfig,
        cancelled: &dyn Fn() -> bool,
    ) -> Result<Scored, EngineError> {
        if candidates.is_empty() {
            return Err(EngineError::Invalid("no candidates".into()));
        }
        if !sleep_unless_cancelled(self.knobs.delay, cancelled, self.knobs.progress) {
            return Err(EngineError::Cancelled);
        }
        let words = words(text);
        let raw: Vec<f32> = candidates
            .iter()
            .map(|c| {
                1.0 + self::words(&c.label)
                    .iter()
                    .filter(|w| words.contains(w))
                    .count() as f32
                    * 3.0
            })
            .collect();
        let query_words = crate::prompt::channel_query(text, prompt)
            .split_ascii_whitespace()
            .count();
        let key = prefix_key(prompt);
        let rendered: usize = candidates
            .iter()
            .map(|c| self.prefix_words(c, prompt, key) + query_words)
            .sum();
        Ok(Scored {
            scores: raw.iter().map(|r| r.ln()).collect(),
            prompt_tokens: rendered as u32,
        })
    }

    /// Echoes the last user message word by word: `stub: w1 w2 …`, at most `max_tokens` tokens.
    fn generate(
        &self,
        messages: &[Message],
        sampling: &Sampling,
        tools: Option<&Tools>,
        on_piece: &mut dyn FnMut(Piece<'_>) -> bool,
    ) -> Result<Usage, EngineError> {
        if let Some(script) = &self.knobs.script {
            if let Some(out) = scripted(script, messages, tools, sampling, on_piece) {
                return Ok(out);
            }
        }
        if let Some(calls) = tools.and_then(|t| stub_calls(messages, t)) {
            let n = calls.len() as u32;
            for c in calls {
                if !on_piece(Piece::Call(c)) {
                    return Ok(usage(messages, 0, "cancelled"));
                }
            }
            return Ok(usage(messages, n, "tool_calls"));
        }
        let on_token = &mut |t: &str| on_piece(Piece::Text(t));
        let last = messages
            .iter()
            .rev()
            .find(|m| m.role == "user")
            .map_or("", |m| m.content.as_str());
        let tokens: Vec<String> = std::iter::once("stub:".to_string())
            .chain(last.split_whitespace().map(|w| format!(" {w}")))
            .collect();
        let max = sampling.max_tokens.max(1) as usize;
        let step = self.knobs.delay / (tokens.len().min(max) as u32).max(1);
        let mut sent = 0u32;
        let mut reason = if tokens.len() > max { "length" } else { "stop" };
        for t in tokens.iter().take(max) {
            std::thread::sleep(step);
            if !on_token(t) {
                reason = "cancelled";
                break;
            }
            sent += 1;
            if self.knobs.fail_mid_stream {
                return Err(EngineError::Failed(
                    "the stub fails mid-stream, as configured".into(),
                ));
            }
        }
        Ok(usage(messages, sent, reason))
    }
}

/// The scripted turn, when the script has one for this conversation: after a tool's result, text from
/// that result; offered a scripted tool (and no result yet), its call. `None`: the stub's usual turn.
fn scripted(
    script: &AgentScript,
    messages: &[Message],
    tools: Option<&Tools>,
    sampling: &Sampling,
    on_piece: &mut dyn FnMut(Piece<'_>) -> bool,
) -> Option<Usage> {
    let last = messages.last()?;
    if last.role == "tool" {
        let result: String = last.content.chars().take(400).collect();
        tracing::info!(call = ?last.tool_call_id, result = ?result, "stub: answering from the tool result");
        let text = format!("stub: the tool returned: {result}");
        let max = sampling.max_tokens.max(1) as usize;
        let mut sent = 0u32;
        for w in text.split_inclusive(' ').take(max) {
            if !on_piece(Piece::Text(w)) {
                return Some(usage(messages, sent, "cancelled"));
            }
            sent += 1;
        }
        return Some(usage(messages, sent, "stop"));
    }
    let offered = tools?;
    let (name, arguments) = script
        .calls
        .iter()
        .find(|(name, _)| offered.list.iter().any(|t| &t.name == name))?;
    let call = ToolCall {
        id: format!("call_{}_0", messages.len()),
        name: name.clone(),
        arguments: arguments.to_string(),
    };
    tracing::info!(tool = %name, "stub: calling the scripted tool");
    if !on_piece(Piece::Call(call)) {
        return Some(usage(messages, 0, "cancelled"));
    }
    Some(usage(messages, 1, "tool_calls"))
}

fn usage(messages: &[Message], completion: u32, finish: &str) -> Usage {
    Usage {
        prompt_tokens: messages
            .iter()
            .map(|m| m.content.split_whitespace().count() as u32)
            .sum(),
        completion_tokens: completion,
        cached_tokens: None,
        finish_reason: finish.into(),
        stop_sequence: None,
    }
}

/// The stub's tool calls, deterministic so that tests can assert them: none when the choice is `none` or
/// (with `auto`) when the last turn is a tool's result (the stub then writes its text); else a call of the
/// named function, or of the first tool — and of the second too when parallel calls are allowed and the
/// choice is `auto` — with `{"query": <the last user text>}` as arguments. Call ids are `call_<n>_<i>`.
fn stub_calls(messages: &[Message], tools: &Tools) -> Option<Vec<ToolCall>> {
    let last = messages.last()?;
    let names: Vec<&str> = match &tools.choice {
        ToolChoice::None => return None,
        ToolChoice::Auto if last.role == "tool" => return None,
        ToolChoice::Function(name) => vec![name.as_str()],
        ToolChoice::Auto if tools.parallel => {
            tools.list.iter().take(2).map(|t| t.name.as_str()).collect()
        }
        ToolChoice::Auto | ToolChoice::Required => vec![tools.list.first()?.name.as_str()],
    };
    let query = messages
        .iter()
        .rev()
        .find(|m| m.role == "user")
        .map_or("", |m| m.content.as_str());
    let arguments = serde_json::json!({ "query": query }).to_string();
    let turn = messages.len();
    Some(
        names
            .into_iter()
            .enumerate()
            .map(|(i, name)| ToolCall {
                id: format!("call_{turn}_{i}"),
                name: name.to_string(),
                arguments: arguments.clone(),
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cand(label: &str) -> Candidate {
        Candidate {
            label: label.into(),
            reply: None,
            description: None,
            examples: vec![],
            p: 0.5,
        }
    }

    #[test]
    fn stub_scores_shared_words_and_echoes() {
        let e = StubEngine::new(StubKnobs::default());
        let s = e
            .score(
                "my card has not arrived",
                &[cand("card_arrival"), cand("exchange_rate")],
                &PromptConfig::default(),
                &|| false,
            )
            .unwrap();
        assert!(s.scores[0] > s.scores[1]);
        assert!((s.scores[0] - 4f32.ln()).abs() < 1e-6 && s.scores[1].abs() < 1e-6);
        let mut out = String::new();
        let msgs = vec![Message {
            role: "user".into(),
            content: "hello there world".into(),
            ..Default::default()
        }];
        let u = e
            .generate(
                &msgs,
                &Sampling {
                    max_tokens: 3,
                    ..Default::default()
                },
                None,
                &mut |p| {
                    if let Piece::Text(t) = p {
                        out.push_str(t);
                    }
                    true
                },
            )
            .unwrap();
        assert_eq!(out, "stub: hello there");
        assert_eq!(
            (u.completion_tokens, u.finish_reason.as_str()),
            (3, "length")
        );
        // With tools: a call of the first (and, parallel, the second) tool; after a tool's result, text.
        let tool = |name: &str| tiergate_queue::Tool {
            name: name.into(),
            description: None,
            parameters: "{}".into(),
        };
        let mut tools = Tools {
            list: vec![tool("search"), tool("weather")],
            choice: ToolChoice::Auto,
            parallel: false,
        };
        let long = Sampling {
            max_tokens: 16,
            ..Default::default()
        };
        let run = |msgs: &[Message], tools: &Tools| {
            let mut pieces = Vec::new();
            let u = e
                .generate(msgs, &long, Some(tools), &mut |p| {
                    pieces.push(match p {
                        Piece::Text(t) => t.to_string(),
                        Piece::Call(c) => format!("{}({})", c.name, c.arguments),
                        Piece::Progress => String::new(),
                    });
                    true
                })
                .unwrap();
            (pieces, u.finish_reason)
        };
        let (pieces, finish) = run(&msgs, &tools);
        assert_eq!(pieces, [r#"search({"query":"hello there world"})"#]);
        assert_eq!(finish, "tool_calls");
        tools.parallel = true;
        assert_eq!(run(&msgs, &tools).0.len(), 2);
        tools.choice = ToolChoice::Function("weather".into());
        assert_eq!(
            run(&msgs, &tools).0,
            [r#"weather({"query":"hello there world"})"#]
        );
        tools.choice = ToolChoice::None;
        assert_eq!(run(&msgs, &tools).1, "stop");
        tools.choice = ToolChoice::Auto;
        let mut answered = msgs.clone();
        answered.push(Message {
            role: "tool".into(),
            content: "sunny".into(),
            tool_call_id: Some("call_1_0".into()),
            ..Default::default()
        });
        assert_eq!(run(&answered, &tools).1, "stop");
        assert!(e
            .score("x", &[], &PromptConfig::default(), &|| false)
            .is_err());
    }
}
