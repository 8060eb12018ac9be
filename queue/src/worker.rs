//! The worker's side: register in the header, heartbeat, take READY jobs, stream frames back, finish.

use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release, SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::{QueueError, Result};
use crate::futex::{self, now_ns};
use crate::layout::{job_kind, pid_alive, Segment, WorkerRecord, MAX_WORKERS};
use crate::protocol::{
    decode_job_traced, encode_frame, encode_reply, frame, Job, Reply, TraceParent, FRAME_HEADER,
};
use crate::slot;

/// How long a job thread polls for the next job before sleeping: jobs that follow each other closely are taken
/// without a wake-up (which costs tens of microseconds); one thread polls at a time per finished job.
const TAKE_SPIN: Duration = Duration::from_micros(100);

/// Work this process's engine has finished (forward passes, generated tokens), published with each heartbeat.
static PROGRESS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Counts a unit of work the engine finished (a forward pass, a token): a worker whose count advances is making
/// progress, and the supervisor does not kill it for a job past its deadline ([`crate::supervise`]).
pub fn note_progress() {
    PROGRESS.fetch_add(1, Relaxed);
}

/// Bytes kept free in every response area for the final frame.
pub const FINAL_RESERVE: usize = 4096;

/// A worker process's attachment to the queue.
pub struct QueueWorker {
    seg: Arc<Segment>,
    index: usize,
    creator_pid: u32,
    /// Jobs this process is running now (shared with each `Taken`).
    active: Arc<AtomicUsize>,
    /// Last heartbeat, for the busy-time accounting.
    last_beat: std::sync::Mutex<Instant>,
}

impl QueueWorker {
    /// Registers as worker `index` (0-based, below [`MAX_WORKERS`]).
    pub fn attach(seg: Arc<Segment>, index: usize) -> Result<Self> {
        if index >= MAX_WORKERS {
            return Err(QueueError::Invalid(format!(
                "worker index {index} >= {MAX_WORKERS}"
            )));
        }
        let creator_pid = seg.header().creator_pid;
        let w = Self {
            seg,
            index,
            creator_pid,
            active: Arc::new(AtomicUsize::new(0)),
            last_beat: std::sync::Mutex::new(Instant::now()),
        };
        let r = w.record();
        r.pid.store(std::process::id(), Release);
        r.heartbeat_ns.store(now_ns(), Release);
        Ok(w)
    }

    fn record(&self) -> &WorkerRecord {
        &self.seg.header().workers[self.index]
    }

    /// The segment.
    pub fn segment(&self) -> &Arc<Segment> {
        &self.seg
    }

    /// Marks the worker ready (model loaded) or not.
    pub fn set_ready(&self, ready: bool) {
        self.record().ready.store(u32::from(ready), Release);
    }

    /// Publishes liveness, and adds the time since the last heartbeat to the busy counter when at least one
    /// job was running: a continuous busy fraction, not bursts credited when long jobs end.
    pub fn heartbeat(&self) {
        let r = self.record();
        r.progress.store(PROGRESS.load(Relaxed), Release);
        r.heartbeat_ns.store(now_ns(), Release);
        if let Ok(mut last) = self.last_beat.lock() {
            let elapsed = last.elapsed();
            *last = Instant::now();
            if self.active.load(Acquire) > 0 {
                r.busy_ns.fetch_add(elapsed.as_nanos() as u64, Relaxed);
            }
        }
    }

    /// True when the server asked workers to stop or is gone (a system call: for the heartbeat, not per job).
    pub fn should_exit(&self) -> bool {
        self.shutdown_requested() || !pid_alive(self.creator_pid)
    }

    /// True when the server asked workers to stop (one load: cheap enough for every job).
    pub fn shutdown_requested(&self) -> bool {
        self.seg.header().shutdown.load(Acquire) == 1
    }

    fn any_ready(&self) -> bool {
        (0..self.seg.slots()).any(|i| {
            self.seg
                .slot(i)
                .is_some_and(|s| slot::load(s).1 == crate::layout::state::READY)
        })
    }

    /// Takes the next READY job, waiting up to `timeout`; generations only when `generations` is true (a
    /// worker keeps a job thread free for reranks). A request that cannot be read or parsed, or whose slot
    /// header lies about its kind, is answered with an error frame at once (only that job fails) and `None` is
    /// returned for it.
    pub fn take(&self, timeout: Duration, generations: bool) -> Option<TakenJob> {
        let h = self.seg.header();
        let n = self.seg.slots();
        let offset = self.index * 7919;
        let mut found = None;
        futex::wait_until(h.job_waiters(), timeout, TAKE_SPIN, timeout, || {
            found = (0..n).find_map(|k| {
                let i = (offset + k) % n;
                let s = self.seg.slot(i)?;
                if !generations && s.kind.load(Acquire) == job_kind::GENERATE {
                    return None;
                }
                slot::take(s, self.index as u32 + 1).map(|gen| (i, gen))
            });
            found.is_some() || h.shutdown.load(Acquire) == 1
        });
        let (i, gen) = found?;
        // A post wakes one sleeper, and a spinning thread may have taken that job: pass the wake-up on while
        // more jobs wait, so none sits until a sleeper's timeout.
        if h.job_sleepers.load(SeqCst) > 0 && self.any_ready() {
            futex::wake(&h.jobs_posted, 1);
        }
        let s = self.seg.slot(i)?;
        self.active.fetch_add(1, AcqRel);
        let mut taken = Taken {
            seg: self.seg.clone(),
            worker: self.index,
            slot: i,
            gen,
            written: s.resp_len.load(Acquire) as usize,
            active: self.active.clone(),
            deadline_ns: s.deadline_ns.load(Relaxed),
            finished: false,
            overflowed: false,
        };
        // A job whose deadline (or cancel) came before any work is answered at once, never computed (the
        // submitter takes back jobs nobody started at their deadline; this closes the window between the two).
        if taken.cancelled() {
            taken.fail("the job's deadline passed before it started");
            return None;
        }
        let len = s.req_len.load(Acquire) as usize;
        let declared = s.kind.load(Acquire);
        let parsed = self
            .seg
            .read_request(i, len)
            .and_then(|b| decode_job_traced(&b))
            .and_then(|(job, trace)| {
                let generate = matches!(job, Job::Generate { .. });
                if generate != (declared == job_kind::GENERATE) {
                    return Err(QueueError::Protocol(
                        "the job's kind does not match its slot header".into(),
                    ));
                }
                Ok((job, trace))
            });
        match parsed {
            Ok((job, trace)) => Some(TakenJob { job, trace, taken }),
            Err(e) => {
                tracing::warn!(slot = i, error = %e, "rejecting unreadable job");
                taken.fail(&e.to_string());
                None
            }
        }
    }
}

/// The longest prefix of `s` of at most `max` bytes that ends on a character boundary.
pub fn truncate_at_char(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// A job this worker holds. Dropping it without finishing answers with an error frame.
pub struct Taken {
    seg: Arc<Segment>,
    worker: usize,
    slot: usize,
    gen: u32,
    written: usize,
    active: Arc<AtomicUsize>,
    deadline_ns: u64,
    finished: bool,
    /// A frame did not fit the response area.
    overflowed: bool,
}

/// A taken job and its request.
pub struct TakenJob {
    /// The request.
    pub job: Job,
    /// The submitter's trace context, when it sent one.
    pub trace: Option<TraceParent>,
    /// The handle to answer it.
    pub taken: Taken,
}

impl Taken {
    /// Time until the job's deadline (`None`: no deadline; zero: passed).
    pub fn time_left(&self) -> Option<Duration> {
        (self.deadline_ns != 0)
            .then(|| Duration::from_nanos(self.deadline_ns.saturating_sub(now_ns())))
    }

    /// True when the submitter cancelled or the deadline passed: stop working on it.
    pub fn cancelled(&self) -> bool {
        let Some(s) = self.seg.slot(self.slot) else {
            return true;
        };
        s.cancel.load(Acquire) == 1 || (self.deadline_ns != 0 && now_ns() > self.deadline_ns)
    }

    /// Appends a frame; `notify`: wake the submitter now (a final frame waits for `complete`, so the
    /// submitter wakes once, to a finished slot).
    fn append(&mut self, kind: u8, payload: &[u8], reserve: usize, notify: bool) -> bool {
        let bytes = encode_frame(kind, payload);
        if self.written + bytes.len() + reserve > self.seg.resp_cap() {
            self.overflowed = true;
            return false;
        }
        if !self.seg.write_response(self.slot, self.written, &bytes) {
            return false;
        }
        self.written += bytes.len();
        if let Some(s) = self.seg.slot(self.slot) {
            s.resp_len.store(self.written as u32, Release);
        }
        if notify {
            self.notify_submitter();
        }
        true
    }

    /// Wakes whoever waits for this slot: a caller sleeping on the slot itself, or the dispatcher.
    fn notify_submitter(&self) {
        if let Some(s) = self.seg.slot(self.slot) {
            futex::notify(s.waiters(), i32::MAX);
        }
        futex::notify(self.seg.header().reply_waiters(), i32::MAX);
    }

    /// Streams a token chunk. False when the job was cancelled or the response area is full.
    pub fn chunk(&mut self, text: &str) -> bool {
        !self.cancelled() && self.append(frame::CHUNK, text.as_bytes(), FINAL_RESERVE, true)
    }

    /// Streams a whole tool call. False when the job was cancelled or the response area is full.
    pub fn tool_call(&mut self, call: &crate::protocol::ToolCall) -> bool {
        match crate::protocol::encode_tool_call(call) {
            Ok(bytes) => {
                !self.cancelled() && self.append(frame::TOOL_CALL, &bytes, FINAL_RESERVE, true)
            }
            Err(_) => false,
        }
    }

    /// Sends the final reply and hands the slot back.
    pub fn reply(mut self, reply: &Reply) {
        match encode_reply(reply) {
            Ok(bytes) if bytes.len() + FRAME_HEADER <= FINAL_RESERVE => {
                self.append(frame::REPLY, &bytes, 0, false);
                self.complete();
            }
            Ok(_) => self.fail("reply does not fit the response area"),
            Err(e) => self.fail(&format!("cannot encode reply: {e}")),
        }
    }

    /// Fault injection (the stub engine's `garbage` knob): commits `bytes` as the response, unframed, and hands
    /// the slot back, so the submitter's reader meets a protocol violation.
    pub fn corrupt(mut self, bytes: &[u8]) {
        if self.seg.write_response(self.slot, self.written, bytes) {
            self.written += bytes.len();
            if let Some(s) = self.seg.slot(self.slot) {
                s.resp_len.store(self.written as u32, Release);
            }
        }
        self.complete();
    }

    /// Sends a final error and hands the slot back. A message longer than the space kept for the final frame
    /// is cut at a character boundary, never dropped.
    pub fn fail(&mut self, message: &str) {
        let cut = truncate_at_char(message, FINAL_RESERVE - FRAME_HEADER);
        self.append(frame::ERROR, cut.as_bytes(), 0, false);
        self.complete();
    }

    /// True once a frame did not fit the response area (a generation cut by it ends with `length`).
    pub fn response_full(&self) -> bool {
        self.overflowed
    }

    fn complete(&mut self) {
        if self.finished {
            return;
        }
        self.finished = true;
        self.active.fetch_sub(1, AcqRel);
        self.seg.header().workers[self.worker]
            .jobs_done
            .fetch_add(1, Relaxed);
        if let Some(s) = self.seg.slot(self.slot) {
            if !slot::finish(s, self.gen, self.worker as u32 + 1) {
                tracing::warn!(
                    slot = self.slot,
                    "job no longer ours (reclaimed); reply dropped"
                );
            }
        }
        self.notify_submitter();
    }
}

impl Drop for Taken {
    fn drop(&mut self) {
        if !self.finished {
            self.fail("worker dropped the job without answering");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::Geometry;
    use crate::protocol::{decode_frames, encode_job, Frame, Sampling};

    #[test]
    fn truncation_keeps_whole_characters() {
        assert_eq!(truncate_at_char("héllo", 2), "h");
        assert_eq!(truncate_at_char("héllo", 3), "hé");
        assert_eq!(truncate_at_char("abc", 10), "abc");
    }

    /// An error message of 10,000 bytes of 2-byte characters still arrives as the final frame, cut to fit.
    #[test]
    fn a_long_error_is_cut_not_lost() {
        let name = format!("tiergate-unit-longerr-{}", std::process::id());
        let seg = Arc::new(
            Segment::create(
                &name,
                Geometry {
                    slots: 1,
                    req_cap: 1024,
                    resp_cap: 8192,
                },
            )
            .unwrap(),
        );
        let job = Job::Generate {
            messages: vec![],
            sampling: Sampling::default(),
            tools: None,
        };
        let bytes = encode_job(&job).unwrap();
        let s = seg.slot(0).unwrap();
        let gen = slot::claim(s).unwrap();
        seg.write_request(0, &bytes).unwrap();
        s.req_len.store(bytes.len() as u32, Release);
        s.kind.store(job_kind::GENERATE, Release);
        assert!(slot::publish(s, gen));
        let w = QueueWorker::attach(seg.clone(), 0).unwrap();
        let mut taken = w.take(Duration::from_millis(100), true).unwrap().taken;
        taken.fail(&"é".repeat(5000));
        let committed = s.resp_len.load(Acquire) as usize;
        let (frames, _) = decode_frames(&seg.read_response(0, 0, committed).unwrap()).unwrap();
        let [Frame::Error(m)] = frames.as_slice() else {
            panic!("{frames:?}")
        };
        assert!(m.len() <= FINAL_RESERVE && m.len() > 4000 && m.starts_with('é'));
        assert_eq!(slot::load(s).1, crate::layout::state::DONE);
    }
}
