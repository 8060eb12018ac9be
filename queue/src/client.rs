//! The server's side: submit a job into a free slot and receive its events (token chunks, then one final
//! reply or error).
//!
//! Two ways to wait. [`Client::call`] blocks the calling thread and watches the job's own slot: it spins
//! briefly, then sleeps on the slot's futex, which the worker bumps at every response write, so a reply
//! reaches the caller with no thread in between. [`Client::submit`] returns a [`JobHandle`] whose events
//! arrive on a flume channel (for async code and streams): one dispatcher thread per client watches those
//! slots, forwards new response frames, enforces deadlines, notices jobs whose receiver was dropped (cancel),
//! and frees slots. Both run the same per-slot step. A slot whose job was given up while a worker still holds
//! it is handed to the dispatcher and freed only when that worker finishes or is reaped.

use std::collections::HashMap;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::error::{QueueError, Result};
use crate::futex::{self, now_ns};
use crate::layout::{job_kind, state, Segment, MAX_WORKERS};
use crate::protocol::{
    decode_frames, encode_job, encode_job_traced, Frame, Job, Reply, TraceParent,
};
use crate::slot;

/// What a job's receiver gets.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A token chunk of a generation.
    Chunk(String),
    /// A whole tool call of a generation.
    ToolCall(crate::protocol::ToolCall),
    /// The final answer (last event).
    Reply(Reply),
    /// The final failure (last event).
    Error(QueueError),
}

/// How long the dispatcher polls before sleeping: a futex wake-up from idle costs tens of microseconds here.
const SPIN: Duration = Duration::from_micros(30);
/// How long a blocking caller polls its slot before sleeping on it.
const CALL_SPIN: Duration = Duration::from_micros(200);
/// How long a caller that has its outcome waits for the worker to mark the slot done before leaving the
/// slot to the dispatcher (the worker writes its last frame, then marks the slot: microseconds apart).
const RELEASE_WAIT: Duration = Duration::from_millis(2);
/// How late a blocking caller may notice its deadline.
const DEADLINE_GRAIN: Duration = Duration::from_millis(5);

struct Inflight {
    gen: u32,
    tx: flume::Sender<Event>,
    consumed: usize,
    deadline_ns: u64,
    /// The submitter has its outcome (or gave up); the slot waits for the worker to let go.
    resolved: bool,
    /// The outcome is the worker's final frame (so the worker is about to mark the slot done).
    from_worker: bool,
}

impl Inflight {
    fn new(posted: &Posted, tx: flume::Sender<Event>) -> Self {
        Self {
            gen: posted.gen,
            tx,
            consumed: 0,
            deadline_ns: posted.deadline_ns,
            resolved: false,
            from_worker: false,
        }
    }

    /// Ends the job with `e` unless it already has its outcome.
    fn resolve_err(&mut self, e: QueueError) {
        if !self.resolved {
            self.resolved = true;
            let _ = self.tx.send(Event::Error(e));
        }
    }
}

/// A job written into a slot (state WRITING until published).
struct Posted {
    slot: usize,
    gen: u32,
    deadline_ns: u64,
}

struct Shared {
    seg: Arc<Segment>,
    inflight: Mutex<HashMap<usize, Inflight>>,
    stop: AtomicBool,
    next: AtomicUsize,
    heartbeat_timeout_ns: u64,
    /// Bumped when the dispatcher gets a slot to watch; an idle dispatcher sleeps on it (not on the segment's
    /// reply counter, so the replies of blocking callers do not wake it).
    work: AtomicU32,
    work_sleepers: AtomicU32,
    /// Jobs whose deadline passed while no worker had started them (taken back, never computed).
    expired_unstarted: AtomicU64,
}

impl Shared {
    fn work_waiters(&self) -> futex::Waiters<'_> {
        futex::Waiters {
            word: &self.work,
            sleepers: &self.work_sleepers,
            spinners: None,
        }
    }
}

/// Handle used by the server to submit jobs. Dropping it stops the dispatcher (in-flight jobs get `Cancelled`).
pub struct Client {
    shared: Arc<Shared>,
    dispatcher: Option<std::thread::JoinHandle<()>>,
}

/// The receiving end of one job.
pub struct JobHandle {
    /// Events of the job; the last one is `Reply` or `Error`.
    pub events: flume::Receiver<Event>,
    /// The slot the job occupies (diagnostics).
    pub slot: usize,
}

impl JobHandle {
    /// Waits for the final reply, ignoring chunks (for rerank jobs and tests). Blocks this thread.
    pub fn wait_reply(&self) -> Result<Reply> {
        loop {
            if let Some(r) = final_event(self.events.recv()) {
                return r;
            }
        }
    }

    /// [`JobHandle::wait_reply`] for async callers.
    pub async fn reply(&self) -> Result<Reply> {
        loop {
            if let Some(r) = final_event(self.events.recv_async().await) {
                return r;
            }
        }
    }
}

/// The slot header's kind of `job`.
fn kind_of(job: &Job) -> u32 {
    match job {
        Job::Generate { .. } => job_kind::GENERATE,
        Job::Rerank { .. } => job_kind::RERANK,
    }
}

/// The outcome if `event` ends the job (chunks do not; a closed channel means the job was cancelled).
fn final_event(event: std::result::Result<Event, flume::RecvError>) -> Option<Result<Reply>> {
    match event {
        Ok(Event::Chunk(_) | Event::ToolCall(_)) => None,
        Ok(Event::Reply(r)) => Some(Ok(r)),
        Ok(Event::Error(e)) => Some(Err(e)),
        Err(_) => Some(Err(QueueError::Cancelled)),
    }
}

impl Client {
    /// Starts a client on `seg`. A worker whose heartbeat is older than `heartbeat_timeout` does not count as
    /// live for admission.
    pub fn new(seg: Arc<Segment>, heartbeat_timeout: Duration) -> Result<Self> {
        let shared = Arc::new(Shared {
            seg,
            inflight: Mutex::new(HashMap::new()),
            stop: AtomicBool::new(false),
            next: AtomicUsize::new(0),
            heartbeat_timeout_ns: heartbeat_timeout.as_nanos() as u64,
            work: AtomicU32::new(0),
            work_sleepers: AtomicU32::new(0),
            expired_unstarted: AtomicU64::new(0),
        });
        let s = shared.clone();
        let dispatcher = std::thread::Builder::new()
            .name("tiergate-queue-dispatch".into())
            .spawn(move || dispatch(&s))
            .map_err(|e| QueueError::Segment(format!("cannot start the dispatcher: {e}")))?;
        Ok(Self {
            shared,
            dispatcher: Some(dispatcher),
        })
    }

    /// The segment.
    pub fn segment(&self) -> &Arc<Segment> {
        &self.shared.seg
    }

    /// Workers that are ready and have a fresh heartbeat.
    pub fn live_workers(&self) -> usize {
        live_workers(&self.shared.seg, self.shared.heartbeat_timeout_ns)
    }

    /// Jobs the dispatcher watches: submitted ones, and abandoned calls whose slot a worker still holds (a
    /// blocking [`Client::call`] in progress is not counted).
    pub fn in_flight(&self) -> usize {
        self.shared.inflight.lock().map_or(0, |m| m.len())
    }

    /// Jobs whose deadline passed before any worker started them: taken back from the queue, never computed.
    pub fn expired_unstarted(&self) -> u64 {
        self.shared.expired_unstarted.load(Relaxed)
    }

    /// Submits `job` with a deadline `timeout` from now. Fails at once with `Full` (no free slot),
    /// `WorkerDown` (no live worker) or `Invalid` (does not fit a slot).
    pub fn submit(&self, job: &Job, timeout: Duration) -> Result<JobHandle> {
        self.submit_traced(job, None, timeout)
    }

    /// [`Client::submit`] with the submitter's trace context, which the worker's spans continue.
    pub fn submit_traced(
        &self,
        job: &Job,
        trace: Option<&TraceParent>,
        timeout: Duration,
    ) -> Result<JobHandle> {
        let bytes = encode_job_traced(job, trace)?;
        self.submit_kind(&bytes, kind_of(job), timeout)
    }

    /// Submits raw request bytes (tests use this to send garbage).
    pub fn submit_bytes(&self, bytes: &[u8], timeout: Duration) -> Result<JobHandle> {
        self.submit_kind(bytes, job_kind::RERANK, timeout)
    }

    fn submit_kind(&self, bytes: &[u8], kind: u32, timeout: Duration) -> Result<JobHandle> {
        let posted = self.write_job(bytes, kind, timeout)?;
        let (tx, rx) = flume::unbounded();
        self.shared
            .inflight
            .lock()
            .map_err(|_| QueueError::Protocol("client state poisoned".into()))?
            .insert(posted.slot, Inflight::new(&posted, tx));
        self.publish(&posted)?;
        futex::notify(self.shared.work_waiters(), 1);
        Ok(JobHandle {
            events: rx,
            slot: posted.slot,
        })
    }

    /// Runs `job` and blocks this thread until its final reply (chunks of a generation are dropped), watching
    /// the job's own slot: the low-latency path for threads that wait anyway. Fails like [`Client::submit`],
    /// then with the job's error; `DeadlineExceeded` after `timeout`.
    pub fn call(&self, job: &Job, timeout: Duration) -> Result<Reply> {
        let bytes = encode_job(job)?;
        self.call_kind(&bytes, kind_of(job), timeout)
    }

    /// [`Client::call`] with raw request bytes.
    pub fn call_bytes(&self, bytes: &[u8], timeout: Duration) -> Result<Reply> {
        self.call_kind(bytes, job_kind::RERANK, timeout)
    }

    fn call_kind(&self, bytes: &[u8], kind: u32, timeout: Duration) -> Result<Reply> {
        let posted = self.write_job(bytes, kind, timeout)?;
        let (tx, rx) = flume::unbounded();
        let mut f = Inflight::new(&posted, tx);
        self.publish(&posted)?;
        if !self.wait_own_slot(posted.slot, &mut f) {
            // Outcome known, slot still held (a worker runs the abandoned job): the dispatcher frees it later.
            if let Ok(mut map) = self.shared.inflight.lock() {
                map.insert(posted.slot, f);
            }
            futex::notify(self.shared.work_waiters(), 1);
        }
        rx.try_iter()
            .find_map(|e| final_event(Ok(e)))
            .unwrap_or(Err(QueueError::Cancelled))
    }

    /// Polls slot `i` until the job has its outcome; returns whether the slot was also freed.
    fn wait_own_slot(&self, i: usize, f: &mut Inflight) -> bool {
        let seg = &self.shared.seg;
        let Some(s) = seg.slot(i) else {
            f.resolve_err(QueueError::Protocol("slot vanished".into()));
            return true;
        };
        let mut finished = false;
        // The deadline bounds this loop: `step` ends the job once it has passed (DEADLINE_GRAIN late at most).
        while !f.resolved {
            futex::wait_until(
                s.waiters(),
                Duration::from_secs(1),
                CALL_SPIN,
                DEADLINE_GRAIN,
                || {
                    finished = step(seg, i, f, now_ns(), &self.shared.expired_unstarted).finished;
                    f.resolved
                },
            );
        }
        if !finished && f.from_worker {
            futex::wait_until(s.waiters(), RELEASE_WAIT, CALL_SPIN, RELEASE_WAIT, || {
                finished = step(seg, i, f, now_ns(), &self.shared.expired_unstarted).finished;
                finished
            });
        }
        finished
    }

    /// Claims a free slot and writes the job into it (not yet visible to workers).
    fn write_job(&self, bytes: &[u8], kind: u32, timeout: Duration) -> Result<Posted> {
        let seg = &self.shared.seg;
        if bytes.len() > seg.req_cap() {
            return Err(QueueError::Invalid(format!(
                "job of {} bytes exceeds the slot capacity of {}",
                bytes.len(),
                seg.req_cap()
            )));
        }
        if self.live_workers() == 0 {
            return Err(QueueError::WorkerDown("no live reranker worker".into()));
        }
        let n = seg.slots();
        let start = self.shared.next.fetch_add(1, Relaxed);
        let claimed = (0..n).find_map(|k| {
            let i = (start + k) % n;
            seg.slot(i).and_then(slot::claim).map(|gen| (i, gen))
        });
        let Some((i, gen)) = claimed else {
            return Err(QueueError::Full { slots: n });
        };
        let Some(s) = seg.slot(i) else {
            return Err(QueueError::Protocol("slot vanished".into()));
        };
        seg.write_request(i, bytes)?;
        let deadline_ns = now_ns().saturating_add(timeout.as_nanos() as u64);
        s.req_len.store(bytes.len() as u32, Relaxed);
        s.resp_len.store(0, Relaxed);
        s.cancel.store(0, Relaxed);
        s.worker.store(0, Relaxed);
        s.retried.store(0, Relaxed);
        s.kind.store(kind, Relaxed);
        s.deadline_ns.store(deadline_ns, Relaxed);
        Ok(Posted {
            slot: i,
            gen,
            deadline_ns,
        })
    }

    /// Makes a written job visible to workers and wakes one if all sleep.
    fn publish(&self, posted: &Posted) -> Result<()> {
        let seg = &self.shared.seg;
        let published = seg
            .slot(posted.slot)
            .is_some_and(|s| slot::publish(s, posted.gen));
        if !published {
            return Err(QueueError::Protocol(
                "slot changed while being written".into(),
            ));
        }
        let h = seg.header();
        futex::notify(h.job_waiters(), 1);
        Ok(())
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        self.shared.stop.store(true, Release);
        futex::notify(self.shared.work_waiters(), 1);
        futex::wake(&self.shared.seg.header().replies_posted, i32::MAX);
        if let Some(t) = self.dispatcher.take() {
            let _ = t.join();
        }
    }
}

/// Workers that are ready and whose heartbeat is fresh.
pub fn live_workers(seg: &Segment, timeout_ns: u64) -> usize {
    let now = now_ns();
    seg.header()
        .workers
        .iter()
        .take(MAX_WORKERS)
        .filter(|w| {
            w.ready.load(Acquire) == 1
                && now.saturating_sub(w.heartbeat_ns.load(Acquire)) < timeout_ns
        })
        .count()
}

fn dispatch(shared: &Shared) {
    let seg = &shared.seg;
    let h = seg.header();
    let has_work = || shared.inflight.lock().is_ok_and(|m| !m.is_empty());
    while !shared.stop.load(Acquire) {
        if !has_work() {
            futex::wait_until(
                shared.work_waiters(),
                Duration::from_millis(20),
                Duration::ZERO,
                Duration::from_millis(20),
                || has_work() || shared.stop.load(Acquire),
            );
            continue;
        }
        let seen = h.replies_posted.load(Acquire);
        if !sweep(shared) {
            // Spin briefly for low round-trip latency, then sleep until a worker posts (deadlines: 1 ms grain).
            futex::wait_until(
                h.reply_waiters(),
                Duration::from_millis(1),
                SPIN,
                Duration::from_millis(1),
                || h.replies_posted.load(Acquire) != seen || shared.stop.load(Acquire),
            );
        }
    }
    // Shutting down: every open job ends with Cancelled; slots still held by workers are left to them.
    if let Ok(mut map) = shared.inflight.lock() {
        for (i, mut f) in map.drain() {
            f.resolve_err(QueueError::Cancelled);
            if let Some(s) = seg.slot(i) {
                s.cancel.store(1, Release);
                slot::withdraw(s, f.gen);
            }
        }
    }
}

/// One pass over the dispatcher's slots; returns whether anything happened.
fn sweep(shared: &Shared) -> bool {
    let Ok(mut map) = shared.inflight.lock() else {
        return false;
    };
    let now = now_ns();
    let mut progressed = false;
    map.retain(|&i, f| {
        let st = step(&shared.seg, i, f, now, &shared.expired_unstarted);
        progressed |= st.progressed;
        !st.finished
    });
    progressed
}

/// What one look at a slot did.
#[derive(Default)]
struct Step {
    /// Something happened (frames forwarded, the job ended, the slot freed).
    progressed: bool,
    /// The slot is no longer this job's: stop watching it.
    finished: bool,
}

/// Looks at slot `i` once: forwards new frames, ends the job when the worker is done or died, enforces the
/// deadline and cancellation (a dropped receiver), and frees the slot once nobody holds it.
fn step(seg: &Segment, i: usize, f: &mut Inflight, now: u64, expired: &AtomicU64) -> Step {
    let finished = Step {
        progressed: true,
        finished: true,
    };
    let Some(s) = seg.slot(i) else {
        f.resolve_err(QueueError::Protocol("slot vanished".into()));
        return finished;
    };
    let (gen, st) = slot::load(s);
    if gen != f.gen {
        // Only this client releases its slots, so this is corruption by a peer.
        f.resolve_err(QueueError::Protocol("slot generation changed".into()));
        return finished;
    }
    let mut progressed = !f.resolved && forward_frames(seg, i, f, st);
    if st == state::DONE || st == state::ABORTED {
        f.resolve_err(if st == state::ABORTED {
            QueueError::WorkerDown("the worker running this job died".into())
        } else {
            QueueError::Protocol("worker finished without a valid final frame".into())
        });
        slot::release(s, f.gen);
        return finished;
    }
    let gone = f.tx.is_disconnected();
    if !f.resolved && (gone || now >= f.deadline_ns) {
        f.resolve_err(QueueError::DeadlineExceeded);
        if st == state::READY && slot::withdraw(s, f.gen) {
            if !gone {
                expired.fetch_add(1, Relaxed);
            }
            return finished;
        }
        // A worker holds it: ask it to stop; the slot is freed when it finishes or is reaped.
        s.cancel.store(1, Release);
        progressed = true;
    }
    Step {
        progressed,
        finished: false,
    }
}

/// Forwards newly committed frames of slot `i`; returns whether any were read.
fn forward_frames(seg: &Segment, i: usize, f: &mut Inflight, st: u32) -> bool {
    let Some(s) = seg.slot(i) else {
        return false;
    };
    let committed = s.resp_len.load(Acquire) as usize;
    if committed <= f.consumed {
        return false;
    }
    let fail = |f: &mut Inflight, e: QueueError| {
        f.resolved = true;
        let _ = f.tx.send(Event::Error(e));
        if let Some(s) = seg.slot(i) {
            s.cancel.store(1, Release);
        }
    };
    if committed > seg.resp_cap() {
        fail(
            f,
            QueueError::Protocol(format!("response length {committed} exceeds the slot")),
        );
        return true;
    }
    let bytes = match seg.read_response(i, f.consumed, committed) {
        Ok(b) => b,
        Err(e) => {
            fail(f, e);
            return true;
        }
    };
    match decode_frames(&bytes) {
        Ok((frames, used)) => {
            f.consumed += used;
            for frame in frames {
                match frame {
                    Frame::Chunk(c) => {
                        let _ = f.tx.send(Event::Chunk(c));
                    }
                    Frame::ToolCall(c) => {
                        let _ = f.tx.send(Event::ToolCall(c));
                    }
                    Frame::Reply(r) => {
                        f.resolved = true;
                        f.from_worker = true;
                        let _ = f.tx.send(Event::Reply(r));
                    }
                    Frame::Error(m) => {
                        f.resolved = true;
                        f.from_worker = true;
                        // Past the deadline, a worker's error is its reaction to the deadline (it stopped).
                        let e = if now_ns() >= f.deadline_ns {
                            QueueError::DeadlineExceeded
                        } else if let Some(why) = m.strip_prefix(crate::protocol::INVALID_REQUEST) {
                            // The engine refused the request itself (too long, a NUL byte): the client's error.
                            QueueError::Invalid(why.to_string())
                        } else {
                            QueueError::Engine(m)
                        };
                        let _ = f.tx.send(Event::Error(e));
                    }
                }
                if f.resolved {
                    break;
                }
            }
            if !f.resolved && st == state::DONE && f.consumed < committed {
                fail(
                    f,
                    QueueError::Protocol("trailing garbage after the last frame".into()),
                );
            }
        }
        Err(e) => fail(f, e),
    }
    true
}
