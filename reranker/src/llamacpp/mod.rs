//! The llama.cpp engine (through the `llama-cpp-2` binding): generation on llama.cpp's CPU kernels, with the
//! GGUF's own chat template ([`template`]), Hermes tool calls and stop sequences ([`output`]), and one thread
//! that owns the context and batches every running generation ([`sched`]). Candidate scoring runs on our own
//! forward over the same file ([`crate::scoring`]), tokenised by llama.cpp.

pub mod output;
pub mod sched;
pub mod template;

use std::num::NonZeroU32;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex, OnceLock};

use llama_cpp_2::context::params::LlamaContextParams;
use llama_cpp_2::llama_backend::LlamaBackend;
use llama_cpp_2::model::params::LlamaModelParams;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::token::LlamaToken;
use tiergate_config::PromptConfig;
use tiergate_queue::{Candidate, Message, Sampling, ToolChoice, Tools, Usage};

use crate::engine::{Engine, EngineError, Piece, Scored};
use crate::llama::WeightFormat;
use crate::scoring::{Scorer, Tokenize};
use output::{Out, Output};
use sched::{Event, SamplerSpec, Shape, Work};
use template::{ChatTemplate, Segment};

/// How to load the model and run it.
#[derive(Debug, Clone)]
pub struct LlamaCppOptions {
    /// A `.gguf` file.
    pub model: PathBuf,
    /// Threads of a decode step (0: the machine's cores).
    pub threads: usize,
    /// Threads of a prompt chunk (0: as `threads`).
    pub batch_threads: usize,
    /// KV cells shared by all sequences (running and cached).
    pub context_tokens: u32,
    /// Generations that run at once.
    pub running: usize,
    /// Finished sequences kept as cached prefixes besides them.
    pub cached: usize,
    /// Most tokens in one decode (prompt chunks are cut to it).
    pub chunk_tokens: usize,
    /// Arithmetic of the scoring forward.
    pub scoring_weights: WeightFormat,
    /// Bytes of cached label prefixes (scoring).
    pub prefix_cache_bytes: usize,
    /// The scoring profile; empty: by the file name.
    pub profile: String,
}

/// A loaded llama.cpp model and its scheduler thread.
pub struct LlamaCppEngine {
    model: Arc<LlamaModel>,
    template: ChatTemplate,
    jobs: Mutex<Sender<Work>>,
    name: String,
    /// The longest prompt plus answer one sequence may hold.
    window: u32,
    scorer: Option<Scorer>,
    stats: Arc<sched::Stats>,
}

/// A rerank being scored, counted while it lives.
struct Scoring<'a>(&'a std::sync::atomic::AtomicUsize);

impl<'a> Scoring<'a> {
    fn start(n: &'a std::sync::atomic::AtomicUsize) -> Self {
        n.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        Self(n)
    }
}

impl Drop for Scoring<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

fn failed(e: impl std::fmt::Display) -> EngineError {
    EngineError::Failed(e.to_string())
}

/// llama.cpp's backend, initialised once per process.
fn backend() -> Result<&'static LlamaBackend, EngineError> {
    static BACKEND: OnceLock<Result<LlamaBackend, String>> = OnceLock::new();
    BACKEND
        .get_or_init(|| {
            let logs = std::env::var_os("TIERGATE_LLAMACPP_LOG").is_some();
            llama_cpp_2::send_logs_to_tracing(
                llama_cpp_2::LogOptions::default().with_logs_enabled(logs),
            );
            LlamaBackend::init().map_err(|e| e.to_string())
        })
        .as_ref()
        .map_err(|e| EngineError::Failed(format!("llama.cpp backend: {e}")))
}

/// (decode, prompt-chunk) thread counts: 0 = the machine's cores; `batch_threads` 0 = as `threads`.
fn thread_counts(opts: &LlamaCppOptions) -> (i32, i32) {
    let decode = threads(opts.threads);
    let batch = match opts.batch_threads {
        0 => decode,
        n => threads(n),
    };
    (decode, batch)
}

fn threads(n: usize) -> i32 {
    let n = if n == 0 {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    } else {
        n
    };
    n.min(i32::MAX as usize) as i32
}

impl LlamaCppEngine {
    /// Loads the model, its chat template and the scorer, and starts the scheduler thread.
    pub fn load(opts: &LlamaCppOptions) -> Result<Self, EngineError> {
        let path = &opts.model;
        if !path.is_file() {
            return Err(EngineError::Invalid(format!(
                "model {} not found (the llama.cpp engine reads a .gguf file)",
                path.display()
            )));
        }
        let backend = backend()?;
        let t = std::time::Instant::now();
        let model = Arc::new(
            LlamaModel::load_from_file(backend, path, &LlamaModelParams::default())
                .map_err(failed)?,
        );
        let template = chat_template(&model, path)?;
        let running = opts.running.max(1);
        let shape = Shape {
            n_ctx: opts.context_tokens.max(256),
            slots: running + opts.cached,
            cached: opts.cached,
            chunk: opts.chunk_tokens.clamp(1, 4096),
        };
        let window = shape.n_ctx.min(model.n_ctx_train().max(1));
        let stats = Arc::new(sched::Stats::default());
        let jobs = start(&model, opts, shape, stats.clone())?;
        tracing::info!(
            took = ?t.elapsed(),
            n_ctx = shape.n_ctx,
            slots = shape.slots,
            chunk = shape.chunk,
            window,
            threads = thread_counts(opts).0,
            batch_threads = thread_counts(opts).1,
            "llama.cpp model loaded"
        );
        let scorer = match crate::scoring::gguf_scorer(
            path,
            opts.scoring_weights,
            opts.prefix_cache_bytes,
            &opts.profile,
        ) {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!(error = %e, "no candidate scoring on this model");
                None
            }
        };
        let name = path
            .file_name()
            .map_or_else(|| "llm".into(), |n| n.to_string_lossy().into_owned());
        Ok(Self {
            model,
            template,
            jobs: Mutex::new(jobs),
            name,
            window,
            scorer,
            stats,
        })
    }

    /// Prompt tokens so far: (read by a forward pass, found in the prefix cache).
    pub fn prompt_stats(&self) -> (u64, u64) {
        (
            self.stats.read.load(Ordering::Relaxed),
            self.stats.cached.load(Ordering::Relaxed),
        )
    }

    /// The longest prompt plus answer a generation may have, in tokens.
    pub fn window(&self) -> u32 {
        self.window
    }

    /// The prompt's tokens: the template's text with special tokens parsed, the messages' contents without.
    pub fn prompt_tokens(&self, segments: &[Segment]) -> Vec<LlamaToken> {
        let vocab = self.model.vocab();
        let mut tokens = Vec::new();
        for (i, s) in segments.iter().enumerate() {
            let (text, special) = match s {
                Segment::Template(t) => (t, true),
                Segment::Content(t) => (t, false),
            };
            tokens.extend(vocab.tokenize(
                text.as_bytes(),
                i == 0 && vocab.should_add_bos(),
                special,
            ));
        }
        tokens
    }

    fn submit(&self, work: Work) -> Result<(), EngineError> {
        let jobs = self
            .jobs
            .lock()
            .map_err(|_| EngineError::Failed("scheduler lock poisoned".into()))?;
        jobs.send(work)
            .map_err(|_| EngineError::Failed("the llama.cpp scheduler thread is gone".into()))
    }
}

/// The chat template a GGUF file carries, with its special tokens.
fn chat_template(model: &LlamaModel, path: &std::path::Path) -> Result<ChatTemplate, EngineError> {
    let source = model
        .meta_val_str("tokenizer.chat_template")
        .map_err(|_| EngineError::Invalid(format!("{} has no chat template", path.display())))?;
    let vocab = model.vocab();
    let special =
        |t: LlamaToken| String::from_utf8_lossy(&vocab.token_to_piece(t, true, None)).into_owned();
    ChatTemplate::new(&source, &special(vocab.bos()), &special(vocab.eos()))
        .map_err(EngineError::Invalid)
}

/// The chat template of the GGUF file at `path` (its vocabulary only is read), and its source.
pub fn gguf_chat_template(path: &std::path::Path) -> Result<(ChatTemplate, String), EngineError> {
    let params = LlamaModelParams::default().with_vocab_only(true);
    let model = LlamaModel::load_from_file(backend()?, path, &params).map_err(failed)?;
    let source = model
        .meta_val_str("tokenizer.chat_template")
        .map_err(|_| EngineError::Invalid(format!("{} has no chat template", path.display())))?;
    Ok((chat_template(&model, path)?, source))
}

/// Starts the scheduler thread, which creates the context and owns it.
fn start(
    model: &Arc<LlamaModel>,
    opts: &LlamaCppOptions,
    shape: Shape,
    stats: Arc<sched::Stats>,
) -> Result<Sender<Work>, EngineError> {
    let (tx, rx) = mpsc::channel::<Work>();
    let (ready_tx, ready_rx) = mpsc::channel::<Result<(), String>>();
    let model = model.clone();
    let (n_threads, batch_threads) = thread_counts(opts);
    std::thread::Builder::new()
        .name("llamacpp".into())
        .spawn(move || {
            let params = LlamaContextParams::default()
                .with_n_ctx(NonZeroU32::new(shape.n_ctx))
                .with_n_batch(shape.chunk as u32)
                .with_n_ubatch(shape.chunk as u32)
                .with_n_seq_max(shape.slots as u32)
                .with_kv_unified(true)
                .with_n_threads(n_threads)
                .with_n_threads_batch(batch_threads);
            let ctx = match backend().and_then(|b| model.new_context(b, params).map_err(failed)) {
                Ok(c) => c,
                Err(e) => {
                    let _ = ready_tx.send(Err(e.to_string()));
                    return;
                }
            };
            let _ = ready_tx.send(Ok(()));
            sched::run(&model, ctx, shape, rx, &stats);
        })
        .map_err(failed)?;
    match ready_rx.recv() {
        Ok(Ok(())) => Ok(tx),
        Ok(Err(e)) => Err(EngineError::Failed(format!("llama.cpp context: {e}"))),
        Err(_) => Err(EngineError::Failed("llama.cpp context: thread died".into())),
    }
}

impl Tokenize for LlamaCppEngine {
    fn encode(&self, text: &str) -> Result<Vec<u32>, EngineError> {
        let tokens = self.model.vocab().tokenize(text.as_bytes(), false, false);
        Ok(tokens.into_iter().map(|t| t.0 as u32).collect())
    }
}

/// The text the template's assistant turn starts with when a call is forced (`tool_choice` `required` or a
/// named function): the model continues inside the call.
fn forced_call(choice: &ToolChoice) -> Option<String> {
    match choice {
        ToolChoice::Required => Some("<tool_call>\n".into()),
        ToolChoice::Function(name) => Some(format!(
            "<tool_call>\n{{\"name\": {}, \"arguments\": ",
            serde_json::Value::String(name.clone())
        )),
        ToolChoice::Auto | ToolChoice::None => None,
    }
}

/// A generation as the scheduler takes it, and what the client's side needs to read its events.
struct Prepared {
    tokens: Vec<LlamaToken>,
    max_tokens: u32,
    sampler: SamplerSpec,
    /// Parse calls from the output.
    calls: bool,
    /// Text the prompt already wrote into the answer (a forced call's opening).
    forced: Option<String>,
}

impl LlamaCppEngine {
    /// Renders, tokenises and checks a generation: a NUL byte, tools the template cannot render, a prompt
    /// longer than the window are refused; `max_tokens` is lowered to what the window leaves.
    fn prepare(
        &self,
        messages: &[Message],
        sampling: &Sampling,
        tools: Option<&Tools>,
    ) -> Result<Prepared, EngineError> {
        if messages.is_empty() {
            return Err(EngineError::Invalid("no messages".into()));
        }
        if messages.iter().any(|m| m.content.contains('\0')) {
            return Err(EngineError::Invalid("a message contains a NUL byte".into()));
        }
        let offered = tools.filter(|t| !t.list.is_empty() && t.choice != ToolChoice::None);
        if offered.is_some() && self.template.calls().is_none() {
            return Err(EngineError::Invalid(format!(
                "the chat template of {} renders no tools",
                self.name
            )));
        }
        let forced = offered.and_then(|t| forced_call(&t.choice));
        if let Some(ToolChoice::Function(name)) = offered.map(|t| &t.choice) {
            if !offered.is_some_and(|t| t.list.iter().any(|f| &f.name == name)) {
                return Err(EngineError::Invalid(format!(
                    "tool_choice names `{name}`, not a tool"
                )));
            }
        }
        let segments = self
            .template
            .render_segments(messages, offered.map(|t| t.list.as_slice()))
            .map_err(EngineError::Invalid)?;
        let mut tokens = self.prompt_tokens(&segments);
        if let Some(f) = &forced {
            tokens.extend(self.model.vocab().tokenize(f.as_bytes(), false, true));
        }
        let n = tokens.len() as u32;
        if n >= self.window {
            return Err(EngineError::Invalid(format!(
                "the prompt is {n} tokens; the model's context window here is {} tokens",
                self.window
            )));
        }
        let grammar = match sampling.json_schema.as_deref() {
            Some(schema) => Some(llama_cpp_2::json_schema_to_grammar(schema).map_err(|e| {
                EngineError::Invalid(format!("response_format's JSON schema: {e}"))
            })?),
            None => None,
        };
        Ok(Prepared {
            tokens,
            max_tokens: sampling.max_tokens.max(1).min(self.window - n),
            sampler: SamplerSpec {
                temperature: sampling.temperature,
                top_p: sampling.top_p,
                seed: sampling.seed,
                grammar,
            },
            calls: offered.is_some(),
            forced,
        })
    }
}

impl Engine for LlamaCppEngine {
    fn name(&self) -> &str {
        &self.name
    }

    fn score(
        &self,
        text: &str,
        candidates: &[Candidate],
        prompt: &PromptConfig,
        cancelled: &dyn Fn() -> bool,
    ) -> Result<Scored, EngineError> {
        // The generations' decode steps wait while this runs (reranks first).
        let _first = Scoring::start(&self.stats.scoring);
        crate::scoring::score_checked(
            self.scorer.as_ref(),
            self,
            text,
            candidates,
            prompt,
            cancelled,
        )
    }

    fn generate(
        &self,
        messages: &[Message],
        sampling: &Sampling,
        tools: Option<&Tools>,
        on_piece: &mut dyn FnMut(Piece<'_>) -> bool,
    ) -> Result<Usage, EngineError> {
        let p = self.prepare(messages, sampling, tools)?;
        if sampling.count_only {
            // The prompt as the answer would read it, counted; nothing read or generated.
            return Ok(Usage {
                prompt_tokens: p.tokens.len() as u32,
                completion_tokens: 0,
                cached_tokens: None,
                finish_reason: "length".into(),
                stop_sequence: None,
            });
        }
        let parallel = tools.is_some_and(|t| t.parallel);
        let (events, rx) = mpsc::channel();
        let cancel = Arc::new(AtomicBool::new(false));
        let prompt_tokens = p.tokens.len() as u32;
        self.submit(Work {
            tokens: p.tokens,
            max_tokens: p.max_tokens,
            sampler: p.sampler,
            events,
            cancel: cancel.clone(),
        })?;
        // The scheduler stops this work when we leave, however we leave.
        let _stop = StopOnDrop(cancel);
        let names: Vec<String> = match tools.filter(|_| p.calls) {
            Some(t) => t.list.iter().map(|f| f.name.clone()).collect(),
            None => Vec::new(),
        };
        let mut out = Output::with_tools(&sampling.stop, p.calls, &names);
        if let Some(f) = &p.forced {
            out.push(f);
        }
        let mut usage = Usage {
            prompt_tokens,
            completion_tokens: 0,
            cached_tokens: None,
            finish_reason: "stop".into(),
            stop_sequence: None,
        };
        loop {
            let event = rx.recv().map_err(|_| {
                EngineError::Failed("the llama.cpp scheduler thread is gone".into())
            })?;
            match event {
                Event::Text(text, n) => {
                    usage.completion_tokens = n;
                    let outs = out.push(&text);
                    if !send(on_piece, outs, parallel, out.calls_made()) {
                        usage.finish_reason = "cancelled".into();
                        return Ok(usage);
                    }
                    if out.stopped.is_some() || (!parallel && out.calls_made() > 0) {
                        break;
                    }
                }
                Event::Progress => {
                    if !on_piece(Piece::Progress) {
                        usage.finish_reason = "cancelled".into();
                        return Ok(usage);
                    }
                }
                Event::Done(Ok(done)) => {
                    usage.completion_tokens = done.completion_tokens;
                    usage.cached_tokens = Some(done.cached_tokens);
                    if done.length {
                        usage.finish_reason = "length".into();
                    }
                    break;
                }
                Event::Done(Err(e)) => return Err(EngineError::Failed(e)),
            }
        }
        let rest = out.finish();
        if !send(on_piece, rest, parallel, out.calls_made()) {
            usage.finish_reason = "cancelled".into();
            return Ok(usage);
        }
        if out.calls_made() > 0 {
            usage.finish_reason = "tool_calls".into();
        } else if out.stopped.is_some() {
            usage.finish_reason = "stop".into();
            usage.stop_sequence = out.stopped.clone();
        }
        Ok(usage)
    }
}

/// Hands `outs` to the client; false when it has gone. Without parallel calls, only the turn's first call
/// goes (`made`: calls made so far, these included).
fn send(
    on_piece: &mut dyn FnMut(Piece<'_>) -> bool,
    outs: Vec<Out>,
    parallel: bool,
    made: usize,
) -> bool {
    let calls = outs.iter().filter(|o| matches!(o, Out::Call(_))).count();
    let mut index = made - calls;
    for o in outs {
        let ok = match o {
            Out::Text(t) => on_piece(Piece::Text(&t)),
            Out::Call(c) => {
                index += 1;
                if !parallel && index > 1 {
                    continue;
                }
                on_piece(Piece::Call(c))
            }
        };
        if !ok {
            return false;
        }
    }
    true
}

/// Sets the cancel flag when dropped.
struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}
