//! Worker supervision (server side, no async runtime): spawn N worker processes, notice death at once (child
//! exit) and hangs (stale heartbeat), kill and reap a suspect *before* reclaiming its slots, then retry each
//! of its jobs once (when nothing was streamed yet and the deadline allows) or fail it with `WorkerDown`, and
//! restart it with exponential backoff. A worker holding a job past its deadline is killed as stuck unless it is
//! making progress — its engine's count of finished work ([`crate::worker::note_progress`]: forward passes,
//! tokens) advanced within the grace — and for at most the load timeout past it: a slow job (a cold judge
//! building its label prefixes) is let finish, keeping what it built; a job that never returns is not.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::futex::{self, now_ns};
use crate::layout::{Segment, MAX_WORKERS};
use crate::slot;

/// How to run the workers.
#[derive(Debug, Clone)]
pub struct SupervisorConfig {
    /// Number of worker processes.
    pub workers: usize,
    /// The worker program.
    pub program: PathBuf,
    /// Arguments; `--segment NAME --worker-index I` are appended.
    pub args: Vec<String>,
    /// The segment name.
    pub segment: String,
    /// A ready worker whose heartbeat is older than this is killed as hung; also the grace after a job's
    /// deadline before the worker still holding it is killed as stuck (its heartbeat thread may be fine while
    /// an engine call never returns).
    pub heartbeat_timeout: Duration,
    /// A worker not ready this long after its start (model load) is killed as hung.
    pub load_timeout: Duration,
    /// First restart delay; doubles per consecutive failure up to `backoff_max`.
    pub backoff_initial: Duration,
    /// Longest restart delay.
    pub backoff_max: Duration,
    /// Retry a dead worker's jobs once on another worker.
    pub retry: bool,
}

/// Counters the supervisor keeps.
#[derive(Debug, Default)]
pub struct SupervisorStats {
    /// Workers restarted after a death or a hang.
    pub restarts: AtomicU64,
    /// Jobs re-queued after their worker died.
    pub retried: AtomicU64,
    /// Jobs failed with `WorkerDown`.
    pub aborted: AtomicU64,
}

struct Proc {
    child: Option<Child>,
    next_start: Instant,
    failures: u32,
    started: Instant,
    watch: Watch,
}

/// What the supervisor remembers of a worker's progress.
struct Watch {
    /// The last progress count seen and when it last advanced.
    progress: (u64, Instant),
    /// Since when it has held a job past its deadline (while spared for its progress).
    stuck_since: Option<Instant>,
}

impl Watch {
    fn new() -> Self {
        Self {
            progress: (0, Instant::now()),
            stuck_since: None,
        }
    }
}

/// Runs the supervision thread; dropping it stops the workers.
pub struct Supervisor {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// Counters.
    pub stats: Arc<SupervisorStats>,
}

impl Supervisor {
    /// Starts supervising `cfg.workers` workers on `seg`.
    pub fn start(seg: Arc<Segment>, cfg: SupervisorConfig) -> std::io::Result<Self> {
        let stop = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(SupervisorStats::default());
        let (s, st) = (stop.clone(), stats.clone());
        let thread = std::thread::Builder::new()
            .name("tiergate-supervisor".into())
            .spawn(move || run(&seg, &cfg, &s, &st))?;
        Ok(Self {
            stop,
            thread: Some(thread),
            stats,
        })
    }
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        self.stop.store(true, Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn run(seg: &Segment, cfg: &SupervisorConfig, stop: &AtomicBool, stats: &SupervisorStats) {
    let n = cfg.workers.min(MAX_WORKERS);
    let mut procs: Vec<Proc> = (0..n)
        .map(|_| Proc {
            child: None,
            next_start: Instant::now(),
            failures: 0,
            started: Instant::now(),
            watch: Watch::new(),
        })
        .collect();
    let mut stuck = Vec::new();
    let mut scanned = Instant::now();
    while !stop.load(Acquire) {
        if scanned.elapsed() >= STUCK_SCAN {
            stuck = stuck_workers(seg, cfg.heartbeat_timeout);
            scanned = Instant::now();
        }
        for (i, p) in procs.iter_mut().enumerate() {
            match &mut p.child {
                None if Instant::now() >= p.next_start => spawn(cfg, i, p),
                None => {}
                Some(child) => {
                    let exited = matches!(child.try_wait(), Ok(Some(_)) | Err(_));
                    let hung = (!exited)
                        .then(|| suspect(seg, cfg, i, p.started, &mut p.watch, &stuck))
                        .flatten();
                    if exited || hung.is_some() {
                        if let Some(why) = hung {
                            tracing::warn!(worker = i, why, "killing the reranker worker");
                            let _ = child.kill();
                        }
                        // Reap before touching its slots: a dead process can no longer write into them.
                        let status = child.wait();
                        tracing::warn!(worker = i, ?status, "reranker worker died");
                        p.child = None;
                        reclaim(seg, i, cfg.retry, stats);
                        stats.restarts.fetch_add(1, Relaxed);
                        if p.started.elapsed() > Duration::from_secs(30) {
                            p.failures = 0;
                        }
                        let backoff = cfg
                            .backoff_initial
                            .saturating_mul(1u32 << p.failures.min(16))
                            .min(cfg.backoff_max);
                        p.failures += 1;
                        p.next_start = Instant::now() + backoff;
                    }
                }
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    // Shutdown: ask the workers to exit, give them a moment, then kill what is left.
    let h = seg.header();
    h.shutdown.store(1, Release);
    futex::wake(&h.jobs_posted, i32::MAX);
    let deadline = Instant::now() + Duration::from_secs(3);
    for p in &mut procs {
        if let Some(child) = &mut p.child {
            while Instant::now() < deadline && matches!(child.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(10));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// How often the slots are scanned for jobs held past their deadline.
const STUCK_SCAN: Duration = Duration::from_millis(100);

/// Why live worker `i` should be killed, if it should: a stale heartbeat, no readiness within the load
/// timeout, or a job held past its deadline plus grace.
fn suspect(
    seg: &Segment,
    cfg: &SupervisorConfig,
    i: usize,
    started: Instant,
    w: &mut Watch,
    stuck: &[usize],
) -> Option<&'static str> {
    let rec = &seg.header().workers[i];
    let ready = rec.ready.load(Acquire) == 1;
    let beat_age = now_ns().saturating_sub(rec.heartbeat_ns.load(Acquire));
    let now = Instant::now();
    let count = rec.progress.load(Acquire);
    if count != w.progress.0 {
        w.progress = (count, now);
    }
    if !stuck.contains(&i) {
        w.stuck_since = None;
    }
    if ready && beat_age > cfg.heartbeat_timeout.as_nanos() as u64 {
        Some("heartbeat is stale")
    } else if !ready && started.elapsed() > cfg.load_timeout {
        Some("not ready within the load timeout")
    } else if stuck.contains(&i) {
        let since = *w.stuck_since.get_or_insert(now);
        let advancing = now.duration_since(w.progress.1) < cfg.heartbeat_timeout;
        if advancing && now.duration_since(since) < cfg.load_timeout {
            return None;
        }
        Some(if advancing {
            "holds a job past its deadline, still working, for longer than the load timeout"
        } else {
            "holds a job past its deadline and makes no progress"
        })
    } else {
        None
    }
}

/// Workers (indices) holding a job whose deadline passed more than `grace` ago.
fn stuck_workers(seg: &Segment, grace: Duration) -> Vec<usize> {
    let now = now_ns();
    let grace = grace.as_nanos() as u64;
    let mut out = Vec::new();
    for i in 0..seg.slots() {
        let Some(s) = seg.slot(i) else { continue };
        let Some(taker) = slot::taker(s) else {
            continue;
        };
        let deadline = s.deadline_ns.load(Acquire);
        let index = (taker as usize).wrapping_sub(1);
        let late = deadline != 0 && now > deadline.saturating_add(grace);
        if late && index < MAX_WORKERS && !out.contains(&index) {
            out.push(index);
        }
    }
    out
}

fn spawn(cfg: &SupervisorConfig, i: usize, p: &mut Proc) {
    let mut cmd = Command::new(&cfg.program);
    cmd.args(&cfg.args)
        .args(["--segment", &cfg.segment, "--worker-index", &i.to_string()])
        .stdin(Stdio::null());
    match cmd.spawn() {
        Ok(child) => {
            tracing::info!(worker = i, pid = child.id(), "reranker worker started");
            p.child = Some(child);
            p.started = Instant::now();
            p.watch = Watch::new();
        }
        // Not there (yet): `scripts/tiergate` starts the server while cargo still builds the worker. Said once,
        // then looked for every backoff_initial × 10.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if p.failures == 0 {
                tracing::warn!(worker = i, program = %cfg.program.display(), "worker program not found (still building?): waiting for it");
            }
            p.failures = 1;
            p.next_start = Instant::now() + cfg.backoff_initial * 10;
        }
        Err(e) => {
            tracing::error!(worker = i, error = %e, program = %cfg.program.display(), "cannot start worker");
            p.failures += 1;
            p.next_start = Instant::now() + cfg.backoff_max;
        }
    }
}

/// Clears a dead worker's record and settles every job it held: re-queued once when nothing was streamed and
/// the deadline is still ahead, otherwise aborted (the submitter gets `WorkerDown`).
pub fn reclaim(seg: &Segment, index: usize, retry: bool, stats: &SupervisorStats) {
    let h = seg.header();
    let rec = &h.workers[index];
    rec.ready.store(0, Release);
    rec.pid.store(0, Release);
    let now = now_ns();
    for i in 0..seg.slots() {
        let Some(s) = seg.slot(i) else { continue };
        let (gen, _) = slot::load(s);
        let me = index as u32 + 1;
        if slot::taker(s) != Some(me) {
            continue;
        }
        let deadline = s.deadline_ns.load(Acquire);
        let can_retry = retry
            && s.retried.load(Acquire) == 0
            && s.resp_len.load(Acquire) == 0
            && s.cancel.load(Acquire) == 0
            && (deadline == 0 || deadline > now);
        if can_retry {
            s.retried.store(1, Release);
            if slot::requeue(s, gen, me) {
                stats.retried.fetch_add(1, Relaxed);
                futex::notify(h.job_waiters(), 1);
            }
        } else if slot::abort(s, gen, me) {
            stats.aborted.fetch_add(1, Relaxed);
            futex::notify(s.waiters(), i32::MAX);
            futex::notify(h.reply_waiters(), i32::MAX);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{state, Geometry};

    /// The worker is recorded in the same CAS that takes the job, so a worker killed right after taking one
    /// is found by `reclaim` (the job is retried once, then aborted), never left TAKEN by nobody.
    #[test]
    fn a_job_taken_by_a_dead_worker_is_always_reclaimed() {
        let name = format!("tiergate-unit-reclaim-{}", std::process::id());
        let seg = Segment::create(
            &name,
            Geometry {
                slots: 2,
                req_cap: 64,
                resp_cap: 64,
            },
        )
        .unwrap();
        let s = seg.slot(1).unwrap();
        let gen = slot::claim(s).unwrap();
        assert!(slot::publish(s, gen));
        // Worker 3 (index 2) takes the job and dies before doing anything else.
        assert_eq!(slot::take(s, 3), Some(gen));
        let stats = SupervisorStats::default();
        reclaim(&seg, 0, true, &stats);
        assert_eq!(
            slot::load(s),
            (gen, state::TAKEN),
            "another worker's job is left alone"
        );
        reclaim(&seg, 2, true, &stats);
        assert_eq!(slot::load(s), (gen, state::READY), "retried");
        assert_eq!(stats.retried.load(Relaxed), 1);
        assert_eq!(slot::take(s, 1), Some(gen));
        reclaim(&seg, 0, true, &stats);
        assert_eq!(slot::load(s), (gen, state::ABORTED), "no second retry");
        assert_eq!(stats.aborted.load(Relaxed), 1);
    }
}
