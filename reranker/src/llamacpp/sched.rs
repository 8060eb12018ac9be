//! The one thread that owns the llama.cpp context: continuous batching with chunked prefill.
//!
//! Every step builds one batch of at most `chunk` tokens: one token for each sequence that is decoding, then
//! prompt chunks of the sequences still reading their prompt, in the order they arrived. So a long prompt is
//! read a chunk per step while the streams already decoding keep producing a token per step, and a request is
//! cancelled between steps. The KV cache is one pool (`n_ctx` cells) shared by `slots` sequence ids: a finished
//! sequence keeps its cells as a cached prefix until the space is needed (least recently used goes first), and a
//! new request starts from the cached sequence sharing the longest prefix with its prompt.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender};
use std::sync::Arc;

use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::llama_batch::LlamaBatch;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::sampling::LlamaSampler;
use llama_cpp_2::token::LlamaToken;

/// How a generation samples.
#[derive(Debug, Clone, Default)]
pub struct SamplerSpec {
    /// 0 or less: greedy.
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub seed: Option<u64>,
    /// A GBNF grammar the output must follow (from a JSON Schema).
    pub grammar: Option<String>,
}

/// A generation for the scheduler.
pub struct Work {
    pub tokens: Vec<LlamaToken>,
    /// Tokens to generate at most (already within the context window).
    pub max_tokens: u32,
    pub sampler: SamplerSpec,
    pub events: Sender<Event>,
    /// Set by the submitter when it gives up (client gone, stop sequence seen).
    pub cancel: Arc<AtomicBool>,
}

/// What the scheduler reports to the submitter.
#[derive(Debug)]
pub enum Event {
    /// Newly decoded text and the tokens generated so far.
    Text(String, u32),
    /// A prompt chunk was read (no text yet): the submitter checks whether it still wants the answer.
    Progress,
    /// The end: usage, or why it failed.
    Done(Result<Done, String>),
}

/// A finished generation.
#[derive(Debug, Clone, PartialEq)]
pub struct Done {
    pub prompt_tokens: u32,
    /// Prompt tokens found in the prefix cache (not read again).
    pub cached_tokens: u32,
    pub completion_tokens: u32,
    /// The token limit ended it (rather than the model's end of turn).
    pub length: bool,
}

/// Prompt tokens over the engine's life: read by a forward pass, or found in the prefix cache; and the reranks
/// being scored right now.
#[derive(Debug, Default)]
pub struct Stats {
    pub read: std::sync::atomic::AtomicU64,
    pub cached: std::sync::atomic::AtomicU64,
    /// Reranks the scorer is running on these cores now: decode steps wait for them ([`yield_to_scoring`]).
    pub scoring: std::sync::atomic::AtomicUsize,
}

/// Most time one decode step waits for reranks, so generations never starve under a stream of them.
const MAX_YIELD: std::time::Duration = std::time::Duration::from_millis(200);

/// Reranks first: a rerank is on a request's path and takes ~80 ms alone, but several times that with a decode
/// step on the same cores (measured: docs/benchmarks.md, "Threads beside Tier-0"); so while one is scored the
/// next step waits, up to [`MAX_YIELD`].
fn yield_to_scoring(stats: &Stats) {
    let start = std::time::Instant::now();
    while stats.scoring.load(Ordering::Acquire) > 0 && start.elapsed() < MAX_YIELD {
        std::thread::sleep(std::time::Duration::from_micros(500));
    }
}

/// The scheduler's shape.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    /// KV cells shared by all sequences.
    pub n_ctx: u32,
    /// Sequence ids (running and cached).
    pub slots: usize,
    /// Finished sequences kept as cached prefixes at most (their cells count in every decode's attention span,
    /// so more is not free).
    pub cached: usize,
    /// Most tokens in one decode.
    pub chunk: usize,
}

struct Running {
    work: Work,
    /// Prompt tokens still to read.
    pending: VecDeque<LlamaToken>,
    cached_tokens: u32,
    sampler: LlamaSampler,
    generated: u32,
    /// The last sampled token, to be decoded next.
    next: Option<LlamaToken>,
    /// Bytes of a character not yet complete.
    partial: Vec<u8>,
    /// KV cells held for it (prompt + max tokens).
    reserved: usize,
}

struct Slot {
    /// The tokens in this sequence's KV cells.
    tokens: Vec<LlamaToken>,
    running: Option<Running>,
    last_used: u64,
}

/// Runs until every [`Work`] sender is gone.
pub fn run(
    model: &LlamaModel,
    mut ctx: LlamaContext<'_>,
    shape: Shape,
    rx: Receiver<Work>,
    stats: &Stats,
) {
    let mut slots: Vec<Slot> = (0..shape.slots)
        .map(|_| Slot {
            tokens: Vec::new(),
            running: None,
            last_used: 0,
        })
        .collect();
    let mut waiting: VecDeque<Work> = VecDeque::new();
    let mut batch = LlamaBatch::new(shape.chunk.max(shape.slots), shape.slots as i32);
    let mut clock = 0u64;
    loop {
        let idle = slots.iter().all(|s| s.running.is_none()) && waiting.is_empty();
        if idle {
            match rx.recv() {
                Ok(w) => waiting.push_back(w),
                Err(_) => return,
            }
        }
        waiting.extend(rx.try_iter());
        clock += 1;
        admit(
            model,
            &mut ctx,
            shape,
            &mut slots,
            &mut waiting,
            clock,
            stats,
        );
        drop_cancelled(&mut slots);
        let fed = fill(&mut batch, &mut slots, shape.chunk);
        if fed.is_empty() {
            continue;
        }
        yield_to_scoring(stats);
        if let Err(e) = ctx.decode(&mut batch) {
            fail_all(
                &mut ctx,
                &mut slots,
                &fed,
                &format!("llama.cpp decode failed: {e}"),
            );
            continue;
        }
        for (i, tokens, logits_at) in fed.iter().cloned() {
            let slot = &mut slots[i];
            slot.tokens.extend_from_slice(&tokens);
            slot.last_used = clock;
            match logits_at {
                Some(at) => sample(model, &ctx, slot, at),
                None => {
                    if let Some(r) = &slot.running {
                        let _ = r.work.events.send(Event::Progress);
                    }
                }
            }
        }
        trim_cache(&mut ctx, &mut slots, shape.cached);
    }
}

/// Gives up the least recently used finished sequences beyond `keep`.
fn trim_cache(ctx: &mut LlamaContext<'_>, slots: &mut [Slot], keep: usize) {
    let mut idle: Vec<usize> = (0..slots.len())
        .filter(|&i| slots[i].running.is_none() && !slots[i].tokens.is_empty())
        .collect();
    if idle.len() <= keep {
        return;
    }
    idle.sort_by_key(|&i| std::cmp::Reverse(slots[i].last_used));
    for &i in &idle[keep..] {
        let _ = ctx.clear_kv_cache_seq(Some(i as u32), None, None);
        slots[i].tokens.clear();
    }
}

/// Starts waiting work in arrival order while its KV cells can be found.
fn admit(
    model: &LlamaModel,
    ctx: &mut LlamaContext<'_>,
    shape: Shape,
    slots: &mut [Slot],
    waiting: &mut VecDeque<Work>,
    clock: u64,
    stats: &Stats,
) {
    while let Some(work) = waiting.front() {
        if work.cancel.load(Ordering::Relaxed) {
            waiting.pop_front();
            continue;
        }
        let need = work.tokens.len() + work.max_tokens as usize;
        let Some(i) = place(ctx, shape, slots, &work.tokens, need) else {
            return;
        };
        let Some(work) = waiting.pop_front() else {
            return;
        };
        let slot = &mut slots[i];
        // Keep the longest shared prefix, at least one prompt token to read (its logits start the answer).
        let keep = common_prefix(&slot.tokens, &work.tokens).min(work.tokens.len() - 1);
        if !matches!(
            ctx.clear_kv_cache_seq(Some(i as u32), Some(keep as u32), None),
            Ok(true)
        ) {
            let _ = ctx.clear_kv_cache_seq(Some(i as u32), None, None);
            slot.tokens.clear();
        }
        slot.tokens.truncate(keep);
        let keep = slot.tokens.len();
        let sampler = match sampler(model, &work.sampler) {
            Ok(s) => s,
            Err(e) => {
                let _ = work.events.send(Event::Done(Err(e)));
                continue;
            }
        };
        slot.last_used = clock;
        stats.cached.fetch_add(keep as u64, Ordering::Relaxed);
        stats
            .read
            .fetch_add((work.tokens.len() - keep) as u64, Ordering::Relaxed);
        slot.running = Some(Running {
            pending: work.tokens[keep..].iter().copied().collect(),
            cached_tokens: keep as u32,
            sampler,
            generated: 0,
            next: None,
            partial: Vec::new(),
            reserved: need,
            work,
        });
    }
}

/// A free sequence id for a prompt needing `need` cells: the idle one sharing the longest prefix (else the
/// least recently used), evicting idle cached sequences until the pool has room. `None`: wait. When the
/// sequence sharing the longest prefix holds more than that prefix — another conversation that only opens
/// the same way — it is kept whole: the prompt takes an empty sequence (else the least recently used other
/// one) with the shared prefix copied into it (the unified KV cache shares those cells), so a conversation's
/// cached turns survive another conversation with the same opening.
fn place(
    ctx: &mut LlamaContext<'_>,
    shape: Shape,
    slots: &mut [Slot],
    prompt: &[LlamaToken],
    need: usize,
) -> Option<usize> {
    let idle = |s: &Slot| s.running.is_none();
    let best = (0..slots.len())
        .filter(|&i| idle(&slots[i]))
        .max_by_key(|&i| {
            (
                common_prefix(&slots[i].tokens, prompt),
                std::cmp::Reverse(slots[i].last_used),
            )
        })?;
    let chosen = match spare(slots, best, prompt) {
        Some(to) => {
            let shared = common_prefix(&slots[best].tokens, prompt);
            let _ = ctx.clear_kv_cache_seq(Some(to as u32), None, None);
            let copied =
                ctx.copy_kv_cache_seq(best as i32, to as i32, Some(0), Some(shared as u32));
            slots[to].tokens = match copied {
                Ok(()) => slots[best].tokens[..shared].to_vec(),
                Err(_) => Vec::new(),
            };
            to
        }
        None => best,
    };
    let held = |slots: &[Slot]| -> usize {
        slots
            .iter()
            .enumerate()
            .map(|(i, s)| match &s.running {
                Some(r) => r.reserved,
                None if i == chosen => 0,
                None => s.tokens.len(),
            })
            .sum()
    };
    let running: usize = slots
        .iter()
        .filter_map(|s| s.running.as_ref().map(|r| r.reserved))
        .sum();
    if running + need > shape.n_ctx as usize {
        return None;
    }
    while held(slots) + need > shape.n_ctx as usize {
        let victim = (0..slots.len())
            .filter(|&i| i != chosen && idle(&slots[i]) && !slots[i].tokens.is_empty())
            .min_by_key(|&i| slots[i].last_used)?;
        let _ = ctx.clear_kv_cache_seq(Some(victim as u32), None, None);
        slots[victim].tokens.clear();
    }
    Some(chosen)
}

/// Where a prompt goes instead of `best` (the idle sequence sharing its longest prefix) when `best` holds a
/// longer conversation than the prefix they share: an empty idle sequence, else the least recently used idle
/// one used before `best` was. `None`: `best` itself (it is the prompt's own conversation, the least recently
/// used, or the only idle one).
fn spare(slots: &[Slot], best: usize, prompt: &[LlamaToken]) -> Option<usize> {
    let shared = common_prefix(&slots[best].tokens, prompt);
    if shared == 0 || slots[best].tokens.len() <= shared {
        return None;
    }
    let others = || (0..slots.len()).filter(|&i| i != best && slots[i].running.is_none());
    if let Some(empty) = others().find(|&i| slots[i].tokens.is_empty()) {
        return Some(empty);
    }
    others()
        .min_by_key(|&i| slots[i].last_used)
        .filter(|&i| slots[i].last_used < slots[best].last_used)
}

fn common_prefix(a: &[LlamaToken], b: &[LlamaToken]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Ends the work whose submitter gave up; its cells stay as a cached prefix.
fn drop_cancelled(slots: &mut [Slot]) {
    for slot in slots.iter_mut() {
        if slot
            .running
            .as_ref()
            .is_some_and(|r| r.work.cancel.load(Ordering::Relaxed))
        {
            slot.running = None;
        }
    }
}

/// Fills the batch: a token per decoding sequence, then prompt chunks. Returns, per sequence fed, its index,
/// the tokens fed and the batch index of its logits (when it samples after this step).
fn fill(
    batch: &mut LlamaBatch,
    slots: &mut [Slot],
    chunk: usize,
) -> Vec<(usize, Vec<LlamaToken>, Option<i32>)> {
    batch.clear();
    let mut fed = Vec::new();
    let mut n = 0usize;
    for (i, slot) in slots.iter_mut().enumerate() {
        let pos = slot.tokens.len() as i32;
        let Some(r) = &mut slot.running else { continue };
        if let Some(t) = r.next.take() {
            if batch.add(t, pos, &[i as i32], true).is_ok() {
                fed.push((i, vec![t], Some(n as i32)));
                n += 1;
            }
        }
    }
    let mut order: Vec<usize> = (0..slots.len())
        .filter(|&i| {
            slots[i]
                .running
                .as_ref()
                .is_some_and(|r| !r.pending.is_empty())
        })
        .collect();
    order.sort_by_key(|&i| slots[i].last_used);
    for i in order {
        if n >= chunk {
            break;
        }
        let pos0 = slots[i].tokens.len();
        let Some(r) = &mut slots[i].running else {
            continue;
        };
        let take = r.pending.len().min(chunk - n);
        let tokens: Vec<LlamaToken> = r.pending.drain(..take).collect();
        let last = r.pending.is_empty();
        let mut logits_at = None;
        for (k, &t) in tokens.iter().enumerate() {
            let wants = last && k + 1 == tokens.len();
            if batch.add(t, (pos0 + k) as i32, &[i as i32], wants).is_err() {
                break;
            }
            if wants {
                logits_at = Some((n + k) as i32);
            }
        }
        n += tokens.len();
        fed.push((i, tokens, logits_at));
    }
    fed
}

/// Samples the next token of `slot` from the logits at batch index `at`, and reports it (or the end).
fn sample(model: &LlamaModel, ctx: &LlamaContext<'_>, slot: &mut Slot, at: i32) {
    let Some(r) = &mut slot.running else { return };
    let token = r.sampler.sample(ctx, at);
    r.generated += 1;
    let vocab = model.vocab();
    let end = vocab.is_eog(token);
    if !end {
        // Special tokens as text: a call's `<tool_call>` tag is one (Qwen2.5), and the output filter needs it;
        // the end-of-turn tokens never get here.
        vocab.token_to_piece_into(token, &mut r.partial, true, None);
        let text = take_text(&mut r.partial);
        if !text.is_empty() {
            let _ = r.work.events.send(Event::Text(text, r.generated));
        }
    }
    let length = !end && r.generated >= r.work.max_tokens;
    if end || length {
        let done = Done {
            prompt_tokens: r.work.tokens.len() as u32,
            cached_tokens: r.cached_tokens,
            completion_tokens: r.generated,
            length,
        };
        let _ = r.work.events.send(Event::Done(Ok(done)));
        slot.running = None;
    } else {
        r.next = Some(token);
    }
}

/// The longest complete UTF-8 prefix of `bytes` as text (invalid bytes replaced), the rest kept.
fn take_text(bytes: &mut Vec<u8>) -> String {
    let valid = match std::str::from_utf8(bytes) {
        Ok(_) => bytes.len(),
        Err(e) if e.error_len().is_none() => e.valid_up_to(),
        Err(_) => bytes.len(),
    };
    let text = String::from_utf8_lossy(&bytes[..valid]).into_owned();
    bytes.drain(..valid);
    text
}

/// A failed decode ends the work it carried; those sequences' cells are cleared.
fn fail_all(
    ctx: &mut LlamaContext<'_>,
    slots: &mut [Slot],
    fed: &[(usize, Vec<LlamaToken>, Option<i32>)],
    why: &str,
) {
    for (i, _, _) in fed {
        let _ = ctx.clear_kv_cache_seq(Some(*i as u32), None, None);
        slots[*i].tokens.clear();
        if let Some(r) = slots[*i].running.take() {
            let _ = r.work.events.send(Event::Done(Err(why.to_string())));
        }
    }
}

/// The sampler chain of a generation.
fn sampler(model: &LlamaModel, spec: &SamplerSpec) -> Result<LlamaSampler, String> {
    let mut chain = Vec::new();
    if let Some(g) = &spec.grammar {
        chain.push(
            LlamaSampler::grammar(model, g, "root")
                .map_err(|e| format!("the JSON schema's grammar: {e}"))?,
        );
    }
    match spec.temperature {
        Some(t) if t > 0.0 => {
            if let Some(p) = spec.top_p.filter(|p| *p < 1.0) {
                chain.push(LlamaSampler::top_p(p, 1));
            }
            chain.push(LlamaSampler::temp(t));
            let seed = spec.seed.map_or_else(rand_seed, |s| s as u32);
            chain.push(LlamaSampler::dist(seed));
        }
        // No temperature: greedy, as the other engines (and `temperature: 0`).
        _ => chain.push(LlamaSampler::greedy()),
    }
    Ok(LlamaSampler::chain_simple(chain))
}

fn rand_seed() -> u32 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_waits_for_a_whole_character() {
        let mut b = "é".as_bytes()[..1].to_vec();
        assert_eq!(take_text(&mut b), "");
        b.extend_from_slice(&"é".as_bytes()[1..]);
        b.extend_from_slice(b"x");
        assert_eq!(take_text(&mut b), "éx");
        assert!(b.is_empty());
    }

    #[test]
    fn decode_waits_for_a_rerank_at_most_its_bound() {
        let stats = Stats::default();
        let t = std::time::Instant::now();
        yield_to_scoring(&stats);
        assert!(
            t.elapsed() < std::time::Duration::from_millis(50),
            "no rerank: no wait"
        );
        // A rerank that never ends: the step goes on after MAX_YIELD.
        stats.scoring.store(1, Ordering::Release);
        let t = std::time::Instant::now();
        yield_to_scoring(&stats);
        assert!(t.elapsed() >= MAX_YIELD, "{:?}", t.elapsed());
        // One that ends while the step waits: it goes on then.
        let stats = std::sync::Arc::new(stats);
        let s2 = stats.clone();
        let ender = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(20));
            s2.scoring.store(0, Ordering::Release);
        });
        let t = std::time::Instant::now();
        yield_to_scoring(&stats);
        ender.join().unwrap();
        assert!(t.elapsed() < MAX_YIELD, "{:?}", t.elapsed());
    }
}
