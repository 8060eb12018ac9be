//! One-pass candidate scoring on our own llama forward ([`crate::llama`]).
//!
//! - **channel**: score_i = mean log P(query | prefix_i), prefix_i = the candidate's label and examples. Each
//!   prefix is prefilled once and cached (keys/values and its last hidden state) across requests; a rerank
//!   is then one forward of k copies of the query, copy i attending to prefix i only.
//! - **likelihood**: score_i = mean log P(candidate_i | prompt with the query): prompt and all candidates in
//!   one forward, each candidate attending to the prompt and to itself.
//!
//! - **choice**: one multiple-choice question in the model's chat template, the candidates as letters; the
//!   next-token distribution over the letters (only those logits are computed), averaged over cyclic shifts
//!   of the options. The shifts share their common token prefix (system line, query) in one forward.
//!
//! Channel and likelihood subtract a content-free prior per candidate (the same score with
//! `prompt.content_free` in place of the query, cached), which removes the bias a small model has for some
//! labels whatever the message says; choice subtracts a content-free prior per letter and option count
//! (the question asked about `content_free` with every option reading `content_free`), when it is set.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use candle_core::{Device, IndexOp, Tensor};
use tiergate_config::{ChatTemplate, Formulation, ModelProfile, PromptConfig, ScoringMethod};
use tiergate_queue::Candidate;

use crate::engine::{EngineError, Scored};
use crate::llama::{KvCache, Llama, Segment};
use crate::prompt;

/// Longest scored text, in tokens (longer queries are cut at the end).
const MAX_QUERY_TOKENS: usize = 96;
/// Longest prefix or prompt, in tokens.
const MAX_PREFIX_TOKENS: usize = 768;
/// Most cached likelihood priors.
const MAX_PRIORS: usize = 100_000;
/// Longest choice prompt, in tokens (a longer one is refused: cutting it would cut off the question).
const MAX_CHOICE_TOKENS: usize = 2048;

/// Text to token ids (no special tokens).
pub trait Tokenize: Send + Sync {
    /// Encodes `text`.
    fn encode(&self, text: &str) -> Result<Vec<u32>, EngineError>;
}

/// Most candidates per rerank job.
pub const MAX_CANDIDATES: usize = 10;

/// The scorer of a local GGUF model (`llama` or `qwen2`), with the profile `profile` names (empty: by the file
/// name): every local engine scores on this forward.
pub fn gguf_scorer(
    path: &std::path::Path,
    weights: crate::llama::WeightFormat,
    prefix_cache_bytes: usize,
    profile: &str,
) -> Result<Scorer, EngineError> {
    let t = std::time::Instant::now();
    let llama = crate::llama::Llama::load(path, weights).map_err(failed)?;
    let profile = tiergate_config::profile_for(&path.to_string_lossy(), profile).map_err(failed)?;
    let template = tiergate_config::template(&profile.template).map_err(failed)?;
    tracing::info!(
        took = ?t.elapsed(),
        weights = ?weights,
        arch = llama.config().arch.name(),
        profile = %profile.name,
        method = profile.method.name(),
        "scoring model loaded"
    );
    Ok(Scorer::with_profile(
        llama,
        prefix_cache_bytes,
        profile,
        template,
    ))
}

/// A rerank on `scorer` (none: the model cannot score), its candidates checked first.
pub fn score_checked(
    scorer: Option<&Scorer>,
    tok: &dyn Tokenize,
    text: &str,
    candidates: &[Candidate],
    prompt: &PromptConfig,
    cancelled: &dyn Fn() -> bool,
) -> Result<Scored, EngineError> {
    if candidates.is_empty() || candidates.len() > MAX_CANDIDATES {
        return Err(EngineError::Invalid(format!(
            "a rerank job needs 1..={MAX_CANDIDATES} candidates, got {}",
            candidates.len()
        )));
    }
    let scorer = scorer.ok_or_else(|| {
        EngineError::Invalid("scoring needs a .gguf model (llama or qwen2 architecture)".into())
    })?;
    scorer.score(tok, text, candidates, prompt, cancelled)
}

fn failed(e: impl std::fmt::Display) -> EngineError {
    EngineError::Failed(e.to_string())
}

/// A prefilled channel prefix.
struct Prefix {
    kv: KvCache,
    /// Final hidden state of its last token (predicts the first scored token).
    last: Tensor,
    /// Content-free prior (0 when off).
    prior: f32,
}

/// Cached prefixes and priors, bounded by bytes, least recently used out first.
struct Cache {
    prefixes: HashMap<String, (Arc<Prefix>, u64)>,
    priors: HashMap<String, f32>,
    /// Choice: content-free prior per letter, keyed by the option count and the prompt templates.
    letter_priors: HashMap<String, Vec<f32>>,
    bytes: usize,
    budget: usize,
    clock: u64,
}

impl Cache {
    fn get(&mut self, key: &str) -> Option<Arc<Prefix>> {
        self.clock += 1;
        let now = self.clock;
        self.prefixes.get_mut(key).map(|(p, t)| {
            *t = now;
            p.clone()
        })
    }

    fn put(&mut self, key: String, p: Arc<Prefix>) {
        self.clock += 1;
        self.bytes += p.kv.bytes();
        if let Some((old, _)) = self.prefixes.insert(key, (p, self.clock)) {
            self.bytes -= old.kv.bytes();
        }
        while self.bytes > self.budget && self.prefixes.len() > 1 {
            let Some(oldest) = self
                .prefixes
                .iter()
                .min_by_key(|(_, (_, t))| *t)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            if let Some((p, _)) = self.prefixes.remove(&oldest) {
                self.bytes -= p.kv.bytes();
            }
        }
    }
}

/// The scorer: the model, its caches, and a lock so that one forward runs at a time (a forward already uses
/// every core).
pub struct Scorer {
    model: Llama,
    profile: ModelProfile,
    template: ChatTemplate,
    cache: Mutex<Cache>,
    forward: Mutex<()>,
    /// Choice and channel jobs waiting for a forward (see [`Scorer::batched`]).
    pending: Mutex<Vec<Pending>>,
    /// Batched forwards run, and the jobs they answered.
    batching: [std::sync::atomic::AtomicU64; 2],
}

/// What a batched job computes.
enum Work {
    /// Choice: each prompt's letter log-probabilities (one row per prompt).
    Choice {
        prompts: Vec<Vec<u32>>,
        letters: Vec<Vec<u32>>,
    },
    /// Channel: the query's mean log-probability after each cached prefix (one row, one score per prefix).
    Channel {
        prefixes: Vec<Arc<Prefix>>,
        query: Vec<u32>,
    },
}

impl Work {
    /// Tokens it adds to a forward.
    fn tokens(&self) -> usize {
        match self {
            Work::Choice { prompts, .. } => prompts.iter().map(Vec::len).sum(),
            Work::Channel { prefixes, query } => prefixes.len() * query.len(),
        }
    }

    fn same_kind(&self, other: &Work) -> bool {
        std::mem::discriminant(self) == std::mem::discriminant(other)
    }
}

/// A job waiting for a forward, and where its answer goes.
struct Pending {
    work: Work,
    reply: std::sync::mpsc::Sender<Result<Vec<Vec<f32>>, String>>,
}

/// Most tokens one batched forward takes (the first job always goes, whatever its size).
const MAX_BATCH_TOKENS: usize = 4096;

/// The oldest waiting job and the later ones of its kind, up to [`MAX_BATCH_TOKENS`] tokens, in order; the
/// rest keep waiting.
fn take_batch(pending: &mut Vec<Pending>) -> Vec<Pending> {
    let mut taken: Vec<Pending> = Vec::new();
    let mut kept = Vec::new();
    let mut tokens = 0;
    for j in pending.drain(..) {
        let fits = match taken.first() {
            None => true,
            Some(first) => {
                j.work.same_kind(&first.work) && tokens + j.work.tokens() <= MAX_BATCH_TOKENS
            }
        };
        if fits {
            tokens += j.work.tokens();
            taken.push(j);
        } else {
            kept.push(j);
        }
    }
    *pending = kept;
    taken
}

impl Scorer {
    /// Wraps a loaded model under the `default` profile; `cache_bytes` bounds the cached prefixes.
    pub fn new(model: Llama, cache_bytes: usize) -> Result<Self, EngineError> {
        let profile = tiergate_config::profile_for("", "default").map_err(failed)?;
        let template = tiergate_config::template(&profile.template).map_err(failed)?;
        Ok(Self::with_profile(model, cache_bytes, profile, template))
    }

    /// Wraps a loaded model that scores as `profile` says under `method = "auto"`, in `template`.
    pub fn with_profile(
        model: Llama,
        cache_bytes: usize,
        profile: ModelProfile,
        template: ChatTemplate,
    ) -> Self {
        Self {
            model,
            profile,
            template,
            cache: Mutex::new(Cache {
                prefixes: HashMap::new(),
                priors: HashMap::new(),
                letter_priors: HashMap::new(),
                bytes: 0,
                budget: cache_bytes,
                clock: 0,
            }),
            forward: Mutex::new(()),
            pending: Mutex::new(Vec::new()),
            batching: Default::default(),
        }
    }

    /// Batched (choice and channel) forwards run so far and the jobs they answered (more jobs than forwards:
    /// jobs were batched).
    pub fn batching(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        (
            self.batching[0].load(Relaxed),
            self.batching[1].load(Relaxed),
        )
    }

    /// The formulation a job with these templates gets.
    pub fn formulation(&self, p: &PromptConfig) -> Formulation {
        self.profile.resolve(p)
    }

    /// The chat template of the model.
    pub fn template(&self) -> &ChatTemplate {
        &self.template
    }

    /// The model.
    pub fn model(&self) -> &Llama {
        &self.model
    }

    /// Scores `candidates` for `text` (see the module docs): one score per candidate, log domain.
    pub fn score(
        &self,
        tok: &dyn Tokenize,
        text: &str,
        candidates: &[Candidate],
        p: &PromptConfig,
        cancelled: &dyn Fn() -> bool,
    ) -> Result<Scored, EngineError> {
        let f = self.formulation(p);
        match f.method {
            // Channel and choice take the forward lock in `batched`, with the other jobs waiting for it.
            ScoringMethod::Channel => self.channel(tok, text, candidates, p, cancelled),
            ScoringMethod::Likelihood => {
                let _one = self.forward.lock().map_err(failed)?;
                self.likelihood(tok, text, candidates, p, cancelled)
            }
            ScoringMethod::Choice | ScoringMethod::Auto => {
                self.choice(tok, text, candidates, p, f, cancelled)
            }
        }
    }

    /// Jobs that arrive while a forward runs wait for the lock; the thread that takes it next runs every
    /// waiting job of the oldest one's kind (up to [`MAX_BATCH_TOKENS`]) in one forward and hands each its
    /// rows. Returns this job's.
    fn batched(&self, work: Work) -> Result<Vec<Vec<f32>>, EngineError> {
        let (reply, answer) = std::sync::mpsc::channel();
        self.pending
            .lock()
            .map_err(failed)?
            .push(Pending { work, reply });
        loop {
            let _one = self.forward.lock().map_err(failed)?;
            // A forward that held the lock before this one may have run this job: its answer is here then.
            if let Ok(r) = answer.try_recv() {
                return r.map_err(EngineError::Failed);
            }
            let batch = take_batch(&mut *self.pending.lock().map_err(failed)?);
            if batch.is_empty() {
                // Forwards answer their jobs before they release the lock: an unanswered job is still waiting.
                return Err(EngineError::Failed("a scoring job was lost".into()));
            }
            tracing::debug!(jobs = batch.len(), "batched scoring forward");
            self.batching[0].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.batching[1].fetch_add(batch.len() as u64, std::sync::atomic::Ordering::Relaxed);
            match self.run_batch(&batch) {
                Ok(all) => {
                    for (j, r) in batch.iter().zip(all) {
                        let _ = j.reply.send(Ok(r));
                    }
                }
                Err(e) => {
                    for j in &batch {
                        let _ = j.reply.send(Err(e.to_string()));
                    }
                }
            }
        }
    }

    /// One forward for jobs of one kind (see [`take_batch`]).
    fn run_batch(&self, batch: &[Pending]) -> candle_core::Result<Vec<Vec<Vec<f32>>>> {
        match batch.first().map(|j| &j.work) {
            Some(Work::Choice { .. }) => {
                let jobs: Vec<LetterJob> = batch
                    .iter()
                    .filter_map(|j| match &j.work {
                        Work::Choice { prompts, letters } => {
                            Some((prompts.as_slice(), letters.as_slice()))
                        }
                        Work::Channel { .. } => None,
                    })
                    .collect();
                letter_logprobs_many(&self.model, &jobs)
            }
            Some(Work::Channel { .. }) => {
                let jobs: Vec<(&[Arc<Prefix>], &[u32])> = batch
                    .iter()
                    .filter_map(|j| match &j.work {
                        Work::Channel { prefixes, query } => {
                            Some((prefixes.as_slice(), query.as_slice()))
                        }
                        Work::Choice { .. } => None,
                    })
                    .collect();
                Ok(self
                    .score_after_many(&jobs)?
                    .into_iter()
                    .map(|scores| vec![scores])
                    .collect())
            }
            None => Ok(Vec::new()),
        }
    }

    fn choice(
        &self,
        tok: &dyn Tokenize,
        text: &str,
        candidates: &[Candidate],
        p: &PromptConfig,
        f: Formulation,
        cancelled: &dyn Fn() -> bool,
    ) -> Result<Scored, EngineError> {
        let k = candidates.len();
        let letters = letter_tokens(tok, k)?;
        let prior = self.letter_prior(tok, k, p, &letters)?;
        if cancelled() {
            return Err(EngineError::Cancelled);
        }
        let orders = prompt::choice_orders(k, f.orders);
        let prompts: Vec<Vec<u32>> = orders
            .iter()
            .map(|o| {
                let q = prompt::choice_question(text, candidates, o, p, f.examples);
                encode_whole(tok, &self.template.single_turn(&q), MAX_CHOICE_TOKENS)
            })
            .collect::<Result<_, _>>()?;
        let prompt_tokens = prompts.iter().map(Vec::len).sum::<usize>() as u32;
        let letter_lp = self.batched(Work::Choice { prompts, letters })?;
        Ok(Scored {
            scores: prompt::average_over_orders(&orders, &letter_lp, &prior, k),
            prompt_tokens,
        })
    }

    /// Choice: the content-free prior per letter for `k` options (zeros when `content_free` is empty).
    fn letter_prior(
        &self,
        tok: &dyn Tokenize,
        k: usize,
        p: &PromptConfig,
        letters: &[Vec<u32>],
    ) -> Result<Vec<f32>, EngineError> {
        if p.content_free.trim().is_empty() {
            return Ok(vec![0.0; k]);
        }
        let key = format!(
            "{k}\u{1f}{}\u{1f}{}\u{1f}{}",
            p.content_free, p.choice_prompt, p.choice_option
        );
        if let Some(v) = self.cache.lock().map_err(failed)?.letter_priors.get(&key) {
            return Ok(v.clone());
        }
        let blank: Vec<Candidate> = (0..k)
            .map(|_| Candidate {
                label: p.content_free.clone(),
                reply: Some(p.content_free.clone()),
                description: None,
                examples: Vec::new(),
                p: 0.0,
            })
            .collect();
        let order: Vec<usize> = (0..k).collect();
        let q = prompt::choice_question(&p.content_free, &blank, &order, p, 0);
        let ids = encode_whole(tok, &self.template.single_turn(&q), MAX_CHOICE_TOKENS)?;
        let lp = self.batched(Work::Choice {
            prompts: vec![ids],
            letters: letters.to_vec(),
        })?;
        let v = lp.into_iter().next().unwrap_or_else(|| vec![0.0; k]);
        let mut cache = self.cache.lock().map_err(failed)?;
        if cache.letter_priors.len() > MAX_PRIORS {
            cache.letter_priors.clear();
        }
        cache.letter_priors.insert(key, v.clone());
        Ok(v)
    }

    fn channel(
        &self,
        tok: &dyn Tokenize,
        text: &str,
        candidates: &[Candidate],
        p: &PromptConfig,
        cancelled: &dyn Fn() -> bool,
    ) -> Result<Scored, EngineError> {
        let query = encode_bounded(tok, &prompt::channel_query(text, p), MAX_QUERY_TOKENS)?;
        let cf = if p.content_free.trim().is_empty() {
            Vec::new()
        } else {
            encode_bounded(
                tok,
                &prompt::channel_query(&p.content_free, p),
                MAX_QUERY_TOKENS,
            )?
        };
        let keys: Vec<String> = candidates
            .iter()
            .map(|c| prompt::channel_prefix(c, p))
            .collect();
        let prefixes = self.prefixes(tok, &keys, &cf)?;
        if cancelled() {
            return Err(EngineError::Cancelled);
        }
        let prompt_tokens =
            query.len() * candidates.len() + prefixes.iter().map(|x| x.kv.len).sum::<usize>();
        let priors: Vec<f32> = prefixes.iter().map(|x| x.prior).collect();
        let after = self
            .batched(Work::Channel { prefixes, query })?
            .pop()
            .unwrap_or_default();
        let scores = after
            .into_iter()
            .zip(priors)
            .map(|(s, prior)| s - prior)
            .collect();
        Ok(Scored {
            scores,
            prompt_tokens: prompt_tokens as u32,
        })
    }

    /// Cached prefixes for `keys`, prefilling the missing ones (and their priors) in one forward.
    fn prefixes(
        &self,
        tok: &dyn Tokenize,
        keys: &[String],
        cf: &[u32],
    ) -> Result<Vec<Arc<Prefix>>, EngineError> {
        let mut found: Vec<Option<Arc<Prefix>>> = {
            let mut cache = self.cache.lock().map_err(failed)?;
            keys.iter().map(|k| cache.get(k)).collect()
        };
        let mut unique: Vec<usize> = Vec::new();
        for i in (0..keys.len()).filter(|&i| found[i].is_none()) {
            if !unique.iter().any(|&j| keys[j] == keys[i]) {
                unique.push(i);
            }
        }
        if !unique.is_empty() {
            let texts: Vec<Vec<u32>> = unique
                .iter()
                .map(|&i| encode_bounded(tok, &keys[i], MAX_PREFIX_TOKENS))
                .collect::<Result<_, _>>()?;
            let built = {
                let _one = self.forward.lock().map_err(failed)?;
                self.prefill(&texts, cf).map_err(failed)?
            };
            let mut cache = self.cache.lock().map_err(failed)?;
            for (&i, pre) in unique.iter().zip(built) {
                cache.put(keys[i].clone(), pre);
            }
            for (i, slot) in found.iter_mut().enumerate() {
                if slot.is_none() {
                    *slot = cache.get(&keys[i]);
                }
            }
        }
        found
            .into_iter()
            .map(|f| f.ok_or_else(|| failed("prefix cache too small for one rerank")))
            .collect()
    }

    /// Prefills prefixes (each on its own) and, when `cf` is given, scores it after each of them.
    fn prefill(&self, texts: &[Vec<u32>], cf: &[u32]) -> candle_core::Result<Vec<Arc<Prefix>>> {
        let mut segments = Vec::new();
        for t in texts {
            let at = segments.len();
            segments.push(Segment {
                tokens: t.clone(),
                start_pos: 0,
                sees_past: 0..0,
                sees_segments: vec![],
            });
            if !cf.is_empty() {
                segments.push(Segment {
                    tokens: cf.to_vec(),
                    start_pos: t.len(),
                    sees_past: 0..0,
                    sees_segments: vec![at],
                });
            }
        }
        let (hidden, kv) = self.model.forward(&segments, None)?;
        tiergate_queue::worker::note_progress();
        let mut out = Vec::with_capacity(texts.len());
        let mut at = 0usize;
        for t in texts {
            let len = t.len();
            let layers = kv
                .layers
                .iter()
                .map(|(k, v)| Ok((k.narrow(2, at, len)?.copy()?, v.narrow(2, at, len)?.copy()?)))
                .collect::<candle_core::Result<Vec<_>>>()?;
            let last = hidden.i(at + len - 1)?.copy()?;
            let prior = if cf.is_empty() {
                0.0
            } else {
                let mut rows = vec![last.unsqueeze(0)?];
                if cf.len() > 1 {
                    rows.push(hidden.narrow(0, at + len, cf.len() - 1)?);
                }
                mean_logprob(&self.model, &Tensor::cat(&rows, 0)?, cf)?
            };
            at += len + cf.len();
            out.push(Arc::new(Prefix {
                kv: KvCache { layers, len },
                last,
                prior,
            }));
        }
        Ok(out)
    }

    /// For each job, the mean log-probability of its query after each of its prefixes, all in one forward:
    /// every distinct prefix's keys and values once in the past (jobs of one route share their labels'),
    /// each copy of a query attending to its own prefix only.
    fn score_after_many(
        &self,
        jobs: &[(&[Arc<Prefix>], &[u32])],
    ) -> candle_core::Result<Vec<Vec<f32>>> {
        let mut distinct: Vec<(&Arc<Prefix>, usize)> = Vec::new();
        let mut cols = 0;
        let mut segments = Vec::new();
        for (prefixes, query) in jobs {
            for p in prefixes.iter() {
                let col = match distinct.iter().find(|(d, _)| Arc::ptr_eq(d, p)) {
                    Some(&(_, col)) => col,
                    None => {
                        distinct.push((p, cols));
                        cols += p.kv.len;
                        cols - p.kv.len
                    }
                };
                segments.push(Segment {
                    tokens: query.to_vec(),
                    start_pos: p.kv.len,
                    sees_past: col..col + p.kv.len,
                    sees_segments: vec![],
                });
            }
        }
        if segments.is_empty() {
            return Ok(jobs.iter().map(|_| Vec::new()).collect());
        }
        let caches: Vec<&KvCache> = distinct.iter().map(|(p, _)| &p.kv).collect();
        let past = KvCache::concat(&caches)?;
        let (hidden, _) = self.model.forward(&segments, Some(&past))?;
        tiergate_queue::worker::note_progress();
        let mut rows = Vec::with_capacity(segments.len() * 2);
        let mut targets = Vec::new();
        let mut at = 0;
        for (prefixes, query) in jobs {
            let n = query.len();
            for p in prefixes.iter() {
                rows.push(p.last.unsqueeze(0)?);
                if n > 1 {
                    rows.push(hidden.narrow(0, at, n - 1)?);
                }
                targets.extend_from_slice(query);
                at += n;
            }
        }
        let lp = token_logprobs(&self.model, &Tensor::cat(&rows, 0)?, &targets)?;
        let mut lp = lp.as_slice();
        Ok(jobs
            .iter()
            .map(|(prefixes, query)| {
                prefixes
                    .iter()
                    .map(|_| {
                        let (mine, rest) = lp.split_at(query.len());
                        lp = rest;
                        mine.iter().sum::<f32>() / query.len().max(1) as f32
                    })
                    .collect()
            })
            .collect())
    }

    fn likelihood(
        &self,
        tok: &dyn Tokenize,
        text: &str,
        candidates: &[Candidate],
        p: &PromptConfig,
        cancelled: &dyn Fn() -> bool,
    ) -> Result<Scored, EngineError> {
        let cands: Vec<Vec<u32>> = candidates
            .iter()
            .map(|c| encode_bounded(tok, &prompt::likelihood_candidate(c, p), MAX_QUERY_TOKENS))
            .collect::<Result<_, _>>()?;
        let priors = self.likelihood_priors(tok, candidates, &cands, p)?;
        if cancelled() {
            return Err(EngineError::Cancelled);
        }
        let head = encode_bounded(tok, &prompt::likelihood_prompt(text, p), MAX_PREFIX_TOKENS)?;
        let scores = shared_prompt_scores(&self.model, &head, &cands)
            .map_err(failed)?
            .into_iter()
            .zip(priors)
            .map(|(s, prior)| s - prior)
            .collect();
        Ok(Scored {
            scores,
            prompt_tokens: (head.len() + cands.iter().map(Vec::len).sum::<usize>()) as u32,
        })
    }

    fn likelihood_priors(
        &self,
        tok: &dyn Tokenize,
        candidates: &[Candidate],
        cands: &[Vec<u32>],
        p: &PromptConfig,
    ) -> Result<Vec<f32>, EngineError> {
        if p.content_free.trim().is_empty() {
            return Ok(vec![0.0; cands.len()]);
        }
        let cf_prompt = prompt::likelihood_prompt(&p.content_free, p);
        let key =
            |c: &Candidate| format!("{cf_prompt}\u{1f}{}", prompt::likelihood_candidate(c, p));
        let known: Vec<Option<f32>> = {
            let cache = self.cache.lock().map_err(failed)?;
            candidates
                .iter()
                .map(|c| cache.priors.get(&key(c)).copied())
                .collect()
        };
        if known.iter().all(Option::is_some) {
            return Ok(known.into_iter().flatten().collect());
        }
        let head = encode_bounded(tok, &cf_prompt, MAX_PREFIX_TOKENS)?;
        let priors = shared_prompt_scores(&self.model, &head, cands).map_err(failed)?;
        let mut cache = self.cache.lock().map_err(failed)?;
        // Priors are a few bytes each; a bound keeps an unbounded label stream from growing the map forever.
        if cache.priors.len() > MAX_PRIORS {
            cache.priors.clear();
        }
        for (c, v) in candidates.iter().zip(&priors) {
            cache.priors.insert(key(c), *v);
        }
        Ok(priors)
    }
}

/// Mean log-probability of each candidate's tokens after `head`: one forward, each candidate seeing `head`
/// and itself.
pub fn shared_prompt_scores(
    model: &Llama,
    head: &[u32],
    cands: &[Vec<u32>],
) -> candle_core::Result<Vec<f32>> {
    let mut segments = vec![Segment {
        tokens: head.to_vec(),
        start_pos: 0,
        sees_past: 0..0,
        sees_segments: vec![],
    }];
    for c in cands {
        segments.push(Segment {
            tokens: c.clone(),
            start_pos: head.len(),
            sees_past: 0..0,
            sees_segments: vec![0],
        });
    }
    let (hidden, _) = model.forward(&segments, None)?;
    let last = hidden.narrow(0, head.len() - 1, 1)?;
    let mut out = Vec::with_capacity(cands.len());
    let mut at = head.len();
    for c in cands {
        let mut rows = vec![last.clone()];
        if c.len() > 1 {
            rows.push(hidden.narrow(0, at, c.len() - 1)?);
        }
        out.push(mean_logprob(model, &Tensor::cat(&rows, 0)?, c)?);
        at += c.len();
    }
    Ok(out)
}

/// Mean log-probability of the tokens of `text` after `prefix`, by a plain causal forward of the whole
/// sequence: the k-prefill reference the one-pass scores are tested against.
pub fn full_prefill_score(model: &Llama, prefix: &[u32], text: &[u32]) -> candle_core::Result<f32> {
    let tokens: Vec<u32> = prefix.iter().chain(text).copied().collect();
    let (hidden, _) = model.forward(
        &[Segment {
            tokens,
            start_pos: 0,
            sees_past: 0..0,
            sees_segments: vec![],
        }],
        None,
    )?;
    let rows = hidden.narrow(0, prefix.len() - 1, text.len())?;
    mean_logprob(model, &rows, text)
}

fn mean_logprob(model: &Llama, rows: &Tensor, targets: &[u32]) -> candle_core::Result<f32> {
    let lp = token_logprobs(model, rows, targets)?;
    Ok(lp.iter().sum::<f32>() / lp.len().max(1) as f32)
}

/// log P(targets[r]) under row r's next-token distribution.
fn token_logprobs(model: &Llama, rows: &Tensor, targets: &[u32]) -> candle_core::Result<Vec<f32>> {
    let lp = model.log_probs(rows)?;
    let idx = Tensor::new(targets, &Device::Cpu)?.unsqueeze(1)?;
    lp.gather(&idx, 1)?.squeeze(1)?.to_vec1::<f32>()
}

/// The token ids an option letter can be written as at the start of the reply (`A` and ` A`, whichever
/// are single tokens), for the first `k` letters.
fn letter_tokens(tok: &dyn Tokenize, k: usize) -> Result<Vec<Vec<u32>>, EngineError> {
    if k == 0 || k > prompt::LETTERS.len() {
        return Err(EngineError::Invalid(format!(
            "{k} candidates: the multiple-choice prompt takes 1 to {}",
            prompt::LETTERS.len()
        )));
    }
    prompt::LETTERS[..k]
        .iter()
        .map(|&l| {
            let mut ids = Vec::new();
            for form in [format!("{}", l as char), format!(" {}", l as char)] {
                if let [id] = tok.encode(&form)?.as_slice() {
                    if !ids.contains(id) {
                        ids.push(*id);
                    }
                }
            }
            if ids.is_empty() {
                return Err(EngineError::Invalid(format!(
                    "the tokenizer splits the option letter {}",
                    l as char
                )));
            }
            Ok(ids)
        })
        .collect()
}

/// For each prompt, log-probabilities of the letters (each letter the log-sum of its token forms) as the
/// next token, normalised over the letters. All prompts go through one forward: their common token prefix
/// once, each remainder seeing it.
pub fn letter_logprobs(
    model: &Llama,
    prompts: &[Vec<u32>],
    letters: &[Vec<u32>],
) -> candle_core::Result<Vec<Vec<f32>>> {
    Ok(letter_logprobs_many(model, &[(prompts, letters)])?
        .pop()
        .unwrap_or_default())
}

/// One job of [`letter_logprobs_many`]: its prompts (token ids) and its letters' token forms.
pub type LetterJob<'a> = (&'a [Vec<u32>], &'a [Vec<u32>]);

/// [`letter_logprobs`] for several jobs (their prompts and letters) in one forward: each job's common prefix
/// once, its remainders seeing only it; nothing of one job sees another.
pub fn letter_logprobs_many(
    model: &Llama,
    jobs: &[LetterJob],
) -> candle_core::Result<Vec<Vec<Vec<f32>>>> {
    let mut segments = Vec::new();
    let mut last_rows = Vec::new();
    let mut at = 0;
    for (prompts, _) in jobs {
        let Some(first) = prompts.first() else {
            continue;
        };
        let shortest = prompts.iter().map(Vec::len).min().unwrap_or(0);
        // Every remainder keeps at least one token: its last hidden state is the one read.
        let common = (0..shortest.saturating_sub(1))
            .take_while(|&i| prompts.iter().all(|p| p[i] == first[i]))
            .count();
        let shared = (common > 0).then(|| {
            segments.push(Segment {
                tokens: first[..common].to_vec(),
                start_pos: 0,
                sees_past: 0..0,
                sees_segments: vec![],
            });
            at += common;
            segments.len() - 1
        });
        for p in prompts.iter() {
            segments.push(Segment {
                tokens: p[common..].to_vec(),
                start_pos: common,
                sees_past: 0..0,
                sees_segments: shared.into_iter().collect(),
            });
            at += p.len() - common;
            last_rows.push((at - 1) as u32);
        }
    }
    if segments.is_empty() {
        return Ok(jobs.iter().map(|_| Vec::new()).collect());
    }
    let (hidden, _) = model.forward(&segments, None)?;
    let rows = hidden.index_select(&Tensor::new(last_rows.as_slice(), &Device::Cpu)?, 0)?;
    // The letters' token forms of every job, each once.
    let mut ids: Vec<u32> = jobs
        .iter()
        .flat_map(|(_, l)| l.iter().flatten().copied())
        .collect();
    ids.sort_unstable();
    ids.dedup();
    let logits = model.token_logits(&rows, &ids)?.to_vec2::<f32>()?;
    let col = |t: u32| ids.binary_search(&t).unwrap_or(0);
    let mut rows = logits.iter();
    Ok(jobs
        .iter()
        .map(|(prompts, letters)| {
            prompts
                .iter()
                .filter_map(|_| rows.next())
                .map(|row| {
                    let per_letter: Vec<f32> = letters
                        .iter()
                        .map(|forms| {
                            let v: Vec<f32> = forms.iter().map(|&t| row[col(t)]).collect();
                            log_sum_exp(&v)
                        })
                        .collect();
                    let norm = log_sum_exp(&per_letter);
                    per_letter.iter().map(|v| v - norm).collect()
                })
                .collect()
        })
        .collect())
}

/// log Σ exp(v), stable (−∞ for an empty or all −∞ slice).
pub(crate) fn log_sum_exp(v: &[f32]) -> f32 {
    let m = v.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if !m.is_finite() {
        return m;
    }
    m + v.iter().map(|x| (x - m).exp()).sum::<f32>().ln()
}

/// Encodes a whole prompt; longer than `max` tokens is refused, not cut.
fn encode_whole(tok: &dyn Tokenize, text: &str, max: usize) -> Result<Vec<u32>, EngineError> {
    let ids = tok.encode(text)?;
    if ids.is_empty() || ids.len() > max {
        return Err(EngineError::Invalid(format!(
            "the choice prompt has {} tokens (1 to {max})",
            ids.len()
        )));
    }
    Ok(ids)
}

fn encode_bounded(tok: &dyn Tokenize, text: &str, max: usize) -> Result<Vec<u32>, EngineError> {
    let mut ids = tok.encode(text)?;
    if ids.is_empty() {
        return Err(EngineError::Invalid(format!(
            "`{}` has no tokens",
            text.chars().take(40).collect::<String>()
        )));
    }
    ids.truncate(max);
    Ok(ids)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prefix(tokens: usize) -> Arc<Prefix> {
        // One layer, one KV head, head dim 4: 32 bytes per token for k and v together.
        let t = Tensor::zeros((1, 1, tokens, 4), candle_core::DType::F32, &Device::Cpu).unwrap();
        Arc::new(Prefix {
            kv: KvCache {
                layers: vec![(t.clone(), t)],
                len: tokens,
            },
            last: Tensor::zeros(4, candle_core::DType::F32, &Device::Cpu).unwrap(),
            prior: 0.0,
        })
    }

    #[test]
    fn prefix_cache_stays_within_its_bytes_and_drops_the_least_recently_used() {
        let mut c = Cache {
            prefixes: HashMap::new(),
            priors: HashMap::new(),
            letter_priors: HashMap::new(),
            bytes: 0,
            budget: 3 * 10 * 32,
            clock: 0,
        };
        c.put("a".into(), prefix(10));
        c.put("b".into(), prefix(10));
        c.put("c".into(), prefix(10));
        assert_eq!(c.bytes, 960);
        assert!(c.get("a").is_some(), "a is now the most recently used");
        c.put("d".into(), prefix(10));
        assert!(c.bytes <= c.budget);
        assert!(c.get("b").is_none(), "b was the least recently used");
        assert!(c.get("a").is_some() && c.get("c").is_some() && c.get("d").is_some());
        // Replacing a key does not count it twice.
        c.put("d".into(), prefix(10));
        assert_eq!(c.bytes, 960);
        // One prefix larger than the whole budget is still kept (a rerank needs it), alone.
        c.put("huge".into(), prefix(100));
        assert_eq!(c.prefixes.len(), 1);
        assert!(c.get("huge").is_some());
    }
}
