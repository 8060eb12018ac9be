//! The server's side: submit a job into a free slot and receive its events (token chunks, then one final
//! reply or error) on a flume channel, usable from async code (`recv_async`) or threads.
//!
//! One dispatcher thread per client watches the slots this client has in flight: it forwards new response
//! frames, enforces deadlines, notices jobs whose receiver was dropped (cancel), and frees slots. A slot whose
//! job was abandoned while a worker still holds it is freed only when that worker finishes or is reaped.

use std::collections::HashMap;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicBool, AtomicUsize};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::error::{QueueError, Result};
use crate::futex::{self, now_ns};
use crate::layout::{state, Segment, MAX_WORKERS};
use crate::protocol::{decode_frames, Frame, Job, Reply};
use crate::slot;

/// What a job's receiver gets.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// A token chunk of a generation.
    Chunk(String),
    /// The final answer (last event).
    Reply(Reply),
    /// The final failure (last event).
    Error(QueueError),
}

/// How long the dispatcher polls before sleeping: a futex wake-up from idle costs tens of microseconds here.
const SPIN: Duration = Duration::from_micros(30);

struct Inflight {
    gen: u32,
    tx: flume::Sender<Event>,
    consumed: usize,
    deadline_ns: u64,
    /// The submitter has its outcome (or gave up); the slot waits for the worker to let go.
    resolved: bool,
}

struct Shared {
    seg: Arc<Segment>,
    inflight: Mutex<HashMap<usize, Inflight>>,
    stop: AtomicBool,
    next: AtomicUsize,
    heartbeat_timeout_ns: u64,
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

/// The outcome if `event` ends the job (chunks do not; a closed channel means the job was cancelled).
fn final_event(event: std::result::Result<Event, flume::RecvError>) -> Option<Result<Reply>> {
    match event {
        Ok(Event::Chunk(_)) => None,
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

    /// Jobs of this client in flight.
    pub fn in_flight(&self) -> usize {
        self.shared.inflight.lock().map_or(0, |m| m.len())
    }

    /// Submits `job` with a deadline `timeout` from now. Fails at once with `Full` (no free slot),
    /// `WorkerDown` (no live worker) or `Invalid` (does not fit a slot).
    pub fn submit(&self, job: &Job, timeout: Duration) -> Result<JobHandle> {
        let bytes = serde_json::to_vec(job).map_err(|e| QueueError::Invalid(e.to_string()))?;
        self.submit_bytes(&bytes, timeout)
    }

    /// Submits raw request bytes (tests use this to send garbage).
    pub fn submit_bytes(&self, bytes: &[u8], timeout: Duration) -> Result<JobHandle> {
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
        s.deadline_ns.store(deadline_ns, Relaxed);
        let (tx, rx) = flume::unbounded();
        {
            let mut map = self
                .shared
                .inflight
                .lock()
                .map_err(|_| QueueError::Protocol("client state poisoned".into()))?;
            map.insert(
                i,
                Inflight {
                    gen,
                    tx,
                    consumed: 0,
                    deadline_ns,
                    resolved: false,
                },
            );
        }
        if !slot::publish(s, gen) {
            return Err(QueueError::Protocol(
                "slot changed while being written".into(),
            ));
        }
        let h = seg.header();
        h.jobs_posted.fetch_add(1, Release);
        futex::wake(&h.jobs_posted, 1);
        Ok(JobHandle {
            events: rx,
            slot: i,
        })
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        self.shared.stop.store(true, Release);
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
    while !shared.stop.load(Acquire) {
        let seen = h.replies_posted.load(Acquire);
        let idle = shared.inflight.lock().map_or(true, |m| m.is_empty());
        if idle {
            futex::wait(&h.replies_posted, seen, Duration::from_millis(20));
            continue;
        }
        let progressed = sweep(shared);
        if !progressed {
            // Spin briefly for low round-trip latency, then sleep until a worker posts (deadlines: 1 ms grain).
            futex::wait_until(&h.replies_posted, Duration::from_millis(1), SPIN, || {
                h.replies_posted.load(Acquire) != seen || shared.stop.load(Acquire)
            });
        }
    }
    // Shutting down: every open job ends with Cancelled; slots still held by workers are left to them.
    if let Ok(mut map) = shared.inflight.lock() {
        for (i, f) in map.drain() {
            if !f.resolved {
                let _ = f.tx.send(Event::Error(QueueError::Cancelled));
            }
            if let Some(s) = seg.slot(i) {
                s.cancel.store(1, Release);
                slot::withdraw(s, f.gen);
            }
        }
    }
}

/// One pass over the in-flight slots; returns whether anything happened.
fn sweep(shared: &Shared) -> bool {
    let seg = &shared.seg;
    let Ok(mut map) = shared.inflight.lock() else {
        return false;
    };
    let now = now_ns();
    let mut progressed = false;
    let mut finished = Vec::new();
    for (&i, f) in map.iter_mut() {
        let Some(s) = seg.slot(i) else {
            finished.push(i);
            continue;
        };
        let (gen, st) = slot::load(s);
        if gen != f.gen {
            // Only this client releases its slots, so this is corruption by a peer.
            if !f.resolved {
                let _ = f.tx.send(Event::Error(QueueError::Protocol(
                    "slot generation changed".into(),
                )));
            }
            finished.push(i);
            continue;
        }
        if !f.resolved {
            progressed |= forward_frames(seg, i, f, st);
        }
        if st == state::DONE || st == state::ABORTED {
            if !f.resolved {
                f.resolved = true;
                let e = if st == state::ABORTED {
                    QueueError::WorkerDown("the worker running this job died".into())
                } else {
                    QueueError::Protocol("worker finished without a valid final frame".into())
                };
                let _ = f.tx.send(Event::Error(e));
            }
            slot::release(s, f.gen);
            finished.push(i);
            progressed = true;
            continue;
        }
        if f.resolved {
            continue;
        }
        let gone = f.tx.is_disconnected();
        let late = now >= f.deadline_ns;
        if gone || late {
            if !gone {
                let _ = f.tx.send(Event::Error(QueueError::DeadlineExceeded));
            }
            f.resolved = true;
            progressed = true;
            if st == state::READY && slot::withdraw(s, f.gen) {
                finished.push(i);
            } else {
                // A worker holds it: ask it to stop; the slot is freed when it finishes or is reaped.
                s.cancel.store(1, Release);
            }
        }
    }
    for i in finished {
        map.remove(&i);
    }
    progressed
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
                    Frame::Reply(r) => {
                        f.resolved = true;
                        let _ = f.tx.send(Event::Reply(r));
                    }
                    Frame::Error(m) => {
                        f.resolved = true;
                        let _ = f.tx.send(Event::Error(QueueError::Engine(m)));
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
