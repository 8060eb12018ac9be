//! The batching runtime: worker threads (by default one per core) share the read-only classifier; callers tokenise on their own thread and send the
//! tokens over a bounded flume channel with a oneshot reply. The thread groups waiting requests into batches
//! (max batch, max wait, padded-token budget) and skips requests whose caller has gone.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tiergate_config::PrefilterConfig;
use tokio::sync::oneshot;

use crate::calibrate::argmax;
use crate::classifier::Classifier;
use crate::error::{PrefilterError, Result};
use crate::tokenize::{TextTokenizer, Tokens};

/// Where the time of one request went.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Timings {
    /// Tokenising (on the caller's thread).
    pub tokenize: Duration,
    /// Waiting for the batching thread.
    pub queue: Duration,
    /// The forward pass of the batch this request ran in.
    pub infer: Duration,
}

/// The prefilter's answer for one input.
#[derive(Debug, Clone, PartialEq)]
pub struct Prediction {
    /// Calibrated probability per label (in [`PrefilterHandle::labels`] order).
    pub probs: Vec<f32>,
    /// The `top_k` most likely labels as `(label index, probability)`, most likely first.
    pub top: Vec<(usize, f32)>,
    /// Index of the most likely label.
    pub label: usize,
    /// The pooled embedding of the input when the classifier is grounded (else empty): the examples
    /// nearest it are the ones shown to a judge.
    pub embedding: Vec<f32>,
    /// Its probability.
    pub confidence: f32,
    /// The out-of-scope score when the classifier has a scorer (higher: less like every label).
    pub oos_score: Option<f32>,
    /// Tokens the encoder saw (after truncation).
    pub tokens: usize,
    /// The input was cut to `max_tokens`.
    pub truncated: bool,
    /// How many requests shared the forward pass.
    pub batch_size: usize,
    /// Where the time went.
    pub timings: Timings,
}

/// Batching limits (from [`PrefilterConfig`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchLimits {
    /// Most requests per forward pass.
    pub max_batch: usize,
    /// Most padded tokens (batch size x longest input) per forward pass.
    pub token_budget: usize,
    /// How long to wait for more requests once one is waiting.
    pub max_wait: Duration,
}

/// What the batching state needs to know about a waiting request.
pub trait Pending {
    /// Its token count.
    fn len_tokens(&self) -> usize;
    /// True when nobody waits for the answer any more.
    fn is_cancelled(&self) -> bool;
}

/// The pure part of the batcher: a FIFO of waiting requests and the rule that cuts a batch from it.
#[derive(Debug)]
pub struct BatchState<T> {
    limits: BatchLimits,
    waiting: VecDeque<T>,
    /// Requests dropped because their caller had gone.
    pub cancelled: u64,
}

impl<T: Pending> BatchState<T> {
    /// An empty state.
    pub fn new(limits: BatchLimits) -> Self {
        Self {
            limits,
            waiting: VecDeque::new(),
            cancelled: 0,
        }
    }

    /// Adds a request at the back.
    pub fn push(&mut self, item: T) {
        self.waiting.push_back(item);
    }

    /// Requests waiting.
    pub fn len(&self) -> usize {
        self.waiting.len()
    }

    /// True when nothing waits.
    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }

    /// True when a full batch is already waiting (no point in waiting for more).
    pub fn has_full_batch(&self) -> bool {
        self.waiting.len() >= self.limits.max_batch
    }

    /// Cuts the next batch in arrival order: cancelled requests are dropped, and the batch stops before the
    /// request that would exceed `max_batch` or the padded-token budget. The first live request always runs,
    /// even alone over budget, so nothing starves.
    pub fn next_batch(&mut self) -> Vec<T> {
        let mut batch: Vec<T> = Vec::new();
        let mut longest = 0usize;
        while let Some(front) = self.waiting.front() {
            if front.is_cancelled() {
                self.waiting.pop_front();
                self.cancelled += 1;
                continue;
            }
            let len = longest.max(front.len_tokens());
            if !batch.is_empty()
                && (batch.len() >= self.limits.max_batch
                    || (batch.len() + 1) * len > self.limits.token_budget)
            {
                break;
            }
            longest = len;
            if let Some(item) = self.waiting.pop_front() {
                batch.push(item);
            }
        }
        batch
    }
}

struct Job {
    tokens: Tokens,
    tokenize: Duration,
    enqueued: Instant,
    reply: oneshot::Sender<Result<Prediction>>,
}

impl Pending for Job {
    fn len_tokens(&self) -> usize {
        self.tokens.ids.len()
    }
    fn is_cancelled(&self) -> bool {
        self.reply.is_closed()
    }
}

/// A cheap, cloneable handle to the batching thread. The thread stops when the last handle is dropped.
#[derive(Clone)]
pub struct PrefilterHandle {
    tx: flume::Sender<Job>,
    tokenizer: Arc<TextTokenizer>,
    labels: Arc<Vec<String>>,
    replies: Arc<Vec<Option<String>>>,
    descriptions: Arc<Vec<Option<String>>>,
    examples: Arc<Vec<Vec<String>>>,
    representatives: Option<Arc<crate::grounding::Representatives>>,
    fusion: Option<crate::heads::FittedFusion>,
    stage_fusions: Vec<(String, crate::heads::FittedFusion)>,
    calibration: Option<Arc<crate::risk_rows::CalibrationRows>>,
    oos: Option<(crate::oos::OosMethod, f32)>,
    capacity: usize,
    trained: Option<Arc<crate::classifier::TrainedFacts>>,
}

impl PrefilterHandle {
    /// Starts the batching thread that owns `classifier`.
    pub fn start(classifier: Classifier, cfg: &PrefilterConfig) -> Result<Self> {
        let limits = BatchLimits {
            max_batch: cfg.max_batch,
            token_budget: cfg.token_budget,
            max_wait: Duration::from_micros(cfg.max_wait_us),
        };
        let (tx, rx) = flume::bounded::<Job>(cfg.queue_capacity);
        let handle = Self {
            tx,
            tokenizer: classifier.tokenizer.clone(),
            labels: Arc::new(classifier.labels().to_vec()),
            replies: Arc::new(classifier.replies.clone()),
            descriptions: Arc::new(classifier.descriptions.clone()),
            examples: Arc::new(classifier.examples.clone()),
            representatives: classifier.representatives.clone(),
            fusion: classifier.fusion.clone(),
            stage_fusions: classifier.stage_fusions.clone(),
            calibration: classifier.calibration.clone().map(Arc::new),
            oos: classifier
                .out_of_scope
                .as_ref()
                .map(|s| (s.method, s.threshold)),
            capacity: cfg.queue_capacity,
            trained: classifier.trained.clone().map(Arc::new),
        };
        let top_k = cfg.top_k;
        let workers = match cfg.workers {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        };
        let classifier = Arc::new(classifier);
        let lend = Lend {
            busy: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
            helper: helper_pool(cfg)?,
        };
        for i in 0..workers {
            let (classifier, rx, lend) = (classifier.clone(), rx.clone(), lend.clone());
            // Each worker runs inside its own one-thread rayon pool, so candle's matmuls stay on this thread
            // instead of contending for the global pool with the other workers.
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(1)
                .thread_name(move |_| format!("tiergate-prefilter-{i}"))
                .build()
                .map_err(|e| {
                    PrefilterError::Unsupported(format!("cannot start prefilter worker: {e}"))
                })?;
            std::thread::Builder::new()
                .name(format!("tiergate-prefilter-{i}-owner"))
                .spawn(move || pool.install(|| run(&classifier, rx, limits, top_k, &lend)))
                .map_err(|e| {
                    PrefilterError::Unsupported(format!("cannot start the prefilter thread: {e}"))
                })?;
        }
        Ok(handle)
    }

    /// Label names, in probability order.
    pub fn labels(&self) -> &[String] {
        &self.labels
    }

    /// Reply text per label, where configured.
    pub fn replies(&self) -> &[Option<String>] {
        &self.replies
    }

    /// One sentence per label saying what it means, where the head has one.
    pub fn descriptions(&self) -> &[Option<String>] {
        &self.descriptions
    }

    /// Example utterances per label (empty where none are known).
    pub fn examples(&self) -> &[Vec<String>] {
        &self.examples
    }

    /// The label's examples for a prediction: nearest its embedding first when the classifier was grounded
    /// ([`Classifier::ground`]), else as stored.
    pub fn examples_for(&self, label: usize, prediction: &Prediction) -> Vec<String> {
        match &self.representatives {
            Some(r) => r.nearest(label, &prediction.embedding),
            None => self.examples.get(label).cloned().unwrap_or_default(),
        }
    }

    /// The fusion fitted for this head, when its folder has one.
    pub fn fitted_fusion(&self) -> Option<&crate::heads::FittedFusion> {
        self.fusion.as_ref()
    }

    /// The fit of cascade stage `stage` (after the first), when the head's folder has one.
    pub fn stage_fusion(&self, stage: &str) -> Option<&crate::heads::FittedFusion> {
        self.stage_fusions
            .iter()
            .find(|(s, _)| s == stage)
            .map(|(_, f)| f)
    }

    /// The head's held-out calibration rows (`calibration.json`), when its folder has them.
    pub fn calibration(&self) -> Option<&crate::risk_rows::CalibrationRows> {
        self.calibration.as_deref()
    }

    /// The out-of-scope score predictions carry and its fitted (or configured) threshold, when scored.
    pub fn out_of_scope(&self) -> Option<(crate::oos::OosMethod, f32)> {
        self.oos
    }

    /// A trained head's fingerprint, dev accuracy and notes (none for few-shot and checkpoint heads).
    pub fn trained(&self) -> Option<&crate::classifier::TrainedFacts> {
        self.trained.as_deref()
    }

    /// The queue's capacity (`prefilter.queue_capacity`).
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Requests waiting for the batching thread now.
    pub fn queue_depth(&self) -> usize {
        self.tx.len()
    }

    /// Tokenises `text` here and queues it; the receiver yields the prediction. A full queue is
    /// [`PrefilterError::Overloaded`], at once.
    pub fn submit(&self, text: &str) -> Result<oneshot::Receiver<Result<Prediction>>> {
        if text.trim().is_empty() {
            return Err(PrefilterError::InvalidInput("text is empty".into()));
        }
        let start = Instant::now();
        let tokens = self.tokenizer.encode(text)?;
        let (reply, rx) = oneshot::channel();
        let job = Job {
            tokens,
            tokenize: start.elapsed(),
            enqueued: Instant::now(),
            reply,
        };
        self.tx.try_send(job).map_err(|e| match e {
            flume::TrySendError::Full(_) => PrefilterError::Overloaded {
                capacity: self.capacity,
            },
            flume::TrySendError::Disconnected(_) => PrefilterError::Closed,
        })?;
        Ok(rx)
    }

    /// Classifies `text` (async).
    pub async fn classify(&self, text: &str) -> Result<Prediction> {
        self.submit(text)?
            .await
            .map_err(|_| PrefilterError::Closed)?
    }

    /// Classifies `text`, blocking this thread (not for async contexts).
    pub fn classify_blocking(&self, text: &str) -> Result<Prediction> {
        self.submit(text)?
            .blocking_recv()
            .map_err(|_| PrefilterError::Closed)?
    }
}

/// The helper thread a forward may borrow while the other workers are idle (`prefilter.lend_idle_core`, on a
/// machine with more than one core).
fn helper_pool(cfg: &PrefilterConfig) -> Result<Option<Arc<rayon::ThreadPool>>> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    if !cfg.lend_idle_core || cores < 2 {
        return Ok(None);
    }
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .thread_name(|_| "tiergate-prefilter-helper".into())
        .build()
        .map_err(|e| {
            PrefilterError::Unsupported(format!("cannot start the prefilter helper: {e}"))
        })?;
    Ok(Some(Arc::new(pool)))
}

/// What the workers share to decide whether a forward may borrow the helper thread.
#[derive(Clone)]
struct Lend {
    /// Workers running a forward now.
    busy: Arc<std::sync::atomic::AtomicUsize>,
    helper: Option<Arc<rayon::ThreadPool>>,
}

impl Lend {
    /// Runs `f` (one forward), with the helper lent when no other worker is busy and nothing waits.
    fn run<T>(&self, waiting: bool, f: impl FnOnce() -> T) -> T {
        use std::sync::atomic::Ordering;
        let others = self.busy.fetch_add(1, Ordering::AcqRel);
        let out = match &self.helper {
            Some(h) if others == 0 && !waiting => {
                tiergate_kernels::int8::with_helper(h, Some(self.busy.clone()), f)
            }
            _ => f(),
        };
        self.busy.fetch_sub(1, Ordering::AcqRel);
        out
    }
}

fn run(
    classifier: &Classifier,
    rx: flume::Receiver<Job>,
    limits: BatchLimits,
    top_k: usize,
    lend: &Lend,
) {
    let mut state = BatchState::new(limits);
    loop {
        if state.is_empty() {
            match rx.recv() {
                Ok(job) => state.push(job),
                Err(_) => break,
            }
        }
        // Take whatever is already queued, then wait up to max_wait for a fuller batch.
        while !state.has_full_batch() {
            match rx.try_recv() {
                Ok(job) => state.push(job),
                Err(_) => break,
            }
        }
        if !state.has_full_batch() && !limits.max_wait.is_zero() {
            let deadline = Instant::now() + limits.max_wait;
            while !state.has_full_batch() {
                match rx.recv_deadline(deadline) {
                    Ok(job) => state.push(job),
                    Err(_) => break,
                }
            }
        }
        let batch = state.next_batch();
        if batch.is_empty() {
            continue;
        }
        let started = Instant::now();
        let inputs: Vec<&Tokens> = batch.iter().map(|j| &j.tokens).collect();
        let result = lend.run(!rx.is_empty(), || classifier.forward(&inputs));
        let infer = started.elapsed();
        let n = batch.len();
        match result {
            Ok(f) => {
                let mut oos = f.oos.into_iter();
                for ((job, probs), embedding) in batch.into_iter().zip(f.probs).zip(f.embeddings) {
                    let mut prediction = predict(probs, &job, top_k, n, started, infer);
                    prediction.embedding = embedding;
                    prediction.oos_score = oos.next();
                    // The caller may have gone meanwhile; nothing to do then.
                    let _ = job.reply.send(Ok(prediction));
                }
            }
            Err(e) => {
                tracing::error!(error = %e, batch = n, "prefilter forward pass failed");
                let message = e.to_string();
                for job in batch {
                    let _ = job.reply.send(Err(PrefilterError::Unsupported(format!(
                        "forward pass failed: {message}"
                    ))));
                }
            }
        }
    }
    tracing::debug!("prefilter thread stopped");
}

fn predict(
    probs: Vec<f32>,
    job: &Job,
    top_k: usize,
    batch_size: usize,
    started: Instant,
    infer: Duration,
) -> Prediction {
    let (label, confidence) = argmax(&probs);
    let mut order: Vec<usize> = (0..probs.len()).collect();
    order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]));
    let top = order
        .into_iter()
        .take(top_k)
        .map(|i| (i, probs[i]))
        .collect();
    Prediction {
        label,
        embedding: Vec::new(),
        confidence,
        oos_score: None,
        top,
        tokens: job.tokens.ids.len(),
        truncated: job.tokens.truncated,
        batch_size,
        timings: Timings {
            tokenize: job.tokenize,
            queue: started.saturating_duration_since(job.enqueued),
            infer,
        },
        probs,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, PartialEq)]
    struct Fake {
        id: usize,
        len: usize,
        gone: bool,
    }
    impl Pending for Fake {
        fn len_tokens(&self) -> usize {
            self.len
        }
        fn is_cancelled(&self) -> bool {
            self.gone
        }
    }
    fn fake(id: usize, len: usize) -> Fake {
        Fake {
            id,
            len,
            gone: false,
        }
    }
    fn limits(max_batch: usize, token_budget: usize) -> BatchLimits {
        BatchLimits {
            max_batch,
            token_budget,
            max_wait: Duration::ZERO,
        }
    }
    fn ids(b: &[Fake]) -> Vec<usize> {
        b.iter().map(|f| f.id).collect()
    }

    #[test]
    fn batches_respect_max_batch_in_fifo_order() {
        let mut s = BatchState::new(limits(3, 1000));
        for i in 0..7 {
            s.push(fake(i, 10));
        }
        assert!(s.has_full_batch());
        assert_eq!(ids(&s.next_batch()), vec![0, 1, 2]);
        assert_eq!(ids(&s.next_batch()), vec![3, 4, 5]);
        assert_eq!(ids(&s.next_batch()), vec![6]);
        assert!(s.next_batch().is_empty());
    }

    #[test]
    fn token_budget_counts_padding_to_the_longest() {
        let mut s = BatchState::new(limits(32, 100));
        s.push(fake(0, 10));
        s.push(fake(1, 10));
        s.push(fake(2, 40)); // 3 x 40 = 120 > 100: stops before it
        s.push(fake(3, 10));
        assert_eq!(ids(&s.next_batch()), vec![0, 1]);
        assert_eq!(ids(&s.next_batch()), vec![2, 3], "2 x 40 = 80 fits");
    }

    #[test]
    fn an_oversized_request_still_runs_alone() {
        let mut s = BatchState::new(limits(32, 50));
        s.push(fake(0, 80));
        s.push(fake(1, 5));
        assert_eq!(ids(&s.next_batch()), vec![0]);
        assert_eq!(ids(&s.next_batch()), vec![1]);
    }

    #[test]
    fn cancelled_requests_are_skipped_and_counted() {
        let mut s = BatchState::new(limits(2, 1000));
        s.push(Fake {
            id: 0,
            len: 5,
            gone: true,
        });
        s.push(fake(1, 5));
        s.push(Fake {
            id: 2,
            len: 5,
            gone: true,
        });
        s.push(fake(3, 5));
        s.push(fake(4, 5));
        assert_eq!(ids(&s.next_batch()), vec![1, 3]);
        assert_eq!(s.cancelled, 2);
        assert_eq!(ids(&s.next_batch()), vec![4]);
    }

    proptest::proptest! {
        /// Every live request comes out exactly once, in order, and no batch breaks a limit unless it is a
        /// single request.
        #[test]
        fn batching_conserves_requests(lens in proptest::collection::vec((1usize..64, proptest::bool::ANY), 0..80),
                                       max_batch in 1usize..16, budget in 1usize..400) {
            let mut s = BatchState::new(limits(max_batch, budget));
            for (i, (len, gone)) in lens.iter().enumerate() {
                s.push(Fake { id: i, len: *len, gone: *gone });
            }
            let mut out = Vec::new();
            loop {
                let b = s.next_batch();
                if b.is_empty() { break; }
                let longest = b.iter().map(|f| f.len).max().unwrap_or(0);
                proptest::prop_assert!(b.len() <= max_batch);
                proptest::prop_assert!(b.len() == 1 || b.len() * longest <= budget);
                out.extend(ids(&b));
            }
            let live: Vec<usize> = lens.iter().enumerate().filter(|(_, (_, g))| !g).map(|(i, _)| i).collect();
            proptest::prop_assert_eq!(out, live);
        }
    }
}
