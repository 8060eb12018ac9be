//! Queue benchmarks, printed as figures:
//! 1. round trip of a ~1.2 KB rerank job through the shared-memory queue to a stub worker *process* and back,
//!    next to a round trip of the same size over a loopback Unix socket to an echo *process*, in the same run:
//!    the queue both ways a caller can wait (`Client::call`, blocking on its own slot; `Client::submit`,
//!    events through the dispatcher thread, as async code waits);
//! 2. how fast a flooded queue answers `Full`.
//!
//! `cargo build --workspace --all-targets && target/debug/examples/queue_bench [ROUND_TRIPS]` (building the
//! whole workspace, as the tests do: `-p tiergate-reranker` alone would unify features differently and
//! compile mistralrs again)

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tiergate_queue::{
    Candidate, Client, Geometry, Job, QueueError, Segment, Supervisor, SupervisorConfig,
};

/// The nearest-rank `q` quantile of `v` (NaN when empty), by the one implementation (`core::stats`).
fn pct(v: &mut [f64], q: f64) -> f64 {
    tiergate_core::stats::quantile(v.to_vec(), q).unwrap_or(f64::NAN)
}

/// Encoded size of the benchmark's rerank job (a 1.2 KB job).
const JOB_BYTES: usize = 1200;
/// Round trips per method per round.
const ROUND: usize = 2000;

/// A 5-candidate rerank job with the default templates whose text pads its encoding to `bytes`.
fn job_of(bytes: usize) -> anyhow::Result<Job> {
    let base = tiergate_queue::encode_job(&job_with_text(String::new()))?.len();
    // The text's length prefix grows by a byte past 127 characters.
    let text = "x".repeat(bytes.saturating_sub(base + 1));
    Ok(job_with_text(text))
}

fn job_with_text(text: String) -> Job {
    Job::Rerank {
        text,
        candidates: (0..5)
            .map(|i| Candidate {
                label: format!("label_{i}"),
                reply: None,
                description: None,
                examples: vec![],
                p: 0.2,
            })
            .collect(),
        prompt: Default::default(),
    }
}

fn echo_server(path: &str, bytes: usize) -> anyhow::Result<()> {
    let listener = UnixListener::bind(path)?;
    let (mut s, _) = listener.accept()?;
    let mut buf = vec![0u8; bytes];
    loop {
        if s.read_exact(&mut buf).is_err() {
            return Ok(());
        }
        s.write_all(&buf)?;
    }
}

/// An echo process on a loopback Unix socket, connected.
fn echo_peer(
    bytes: usize,
) -> anyhow::Result<(UnixStream, std::process::Child, std::path::PathBuf)> {
    let path = std::env::temp_dir().join(format!("tiergate-bench-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let child = std::process::Command::new(std::env::current_exe()?)
        .args(["--echo-server", &path.to_string_lossy(), &bytes.to_string()])
        .spawn()?;
    let t = Instant::now();
    loop {
        match UnixStream::connect(&path) {
            Ok(s) => return Ok((s, child, path)),
            Err(_) if t.elapsed() < Duration::from_secs(5) => {
                std::thread::sleep(Duration::from_millis(5))
            }
            Err(e) => return Err(e.into()),
        }
    }
}

fn supervisor(seg: &Arc<Segment>, name: &str, delay_ms: u64) -> anyhow::Result<Supervisor> {
    let exe = std::env::current_exe()?;
    let program = exe
        .parent()
        .and_then(|p| p.parent())
        .map(|p| p.join("tiergate-reranker"))
        .ok_or_else(|| anyhow::anyhow!("cannot locate tiergate-reranker"))?;
    Ok(Supervisor::start(
        seg.clone(),
        SupervisorConfig {
            workers: 1,
            program,
            // No `--spec`: the stub.
            args: vec!["--stub-delay-ms".into(), delay_ms.to_string()],
            segment: name.into(),
            heartbeat_timeout: Duration::from_secs(2),
            load_timeout: Duration::from_secs(60),
            backoff_initial: Duration::from_millis(50),
            backoff_max: Duration::from_secs(1),
            retry: true,
        },
    )?)
}

fn wait_ready(client: &Client) -> anyhow::Result<()> {
    let t = Instant::now();
    while client.live_workers() == 0 {
        anyhow::ensure!(
            t.elapsed() < Duration::from_secs(10),
            "worker did not start"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

/// Median microseconds of the CPU work a round trip does besides moving bytes: encoding and decoding the job,
/// the stub engine, encoding and decoding the reply (what the socket comparison does not do).
fn cpu_per_job(job: &Job) -> anyhow::Result<[f64; 4]> {
    use tiergate_reranker::engine::Engine;
    let stub = tiergate_reranker::stub::StubEngine::new(Default::default());
    let mut t = [Vec::new(), Vec::new(), Vec::new(), Vec::new()];
    for _ in 0..5000 {
        let s = Instant::now();
        let bytes = tiergate_queue::encode_job(job)?;
        t[0].push(s.elapsed().as_secs_f64() * 1e6);
        let s = Instant::now();
        let back: Job = tiergate_queue::decode_job(&bytes)?;
        t[1].push(s.elapsed().as_secs_f64() * 1e6);
        let Job::Rerank {
            text,
            candidates,
            prompt,
            ..
        } = back
        else {
            anyhow::bail!("not a rerank job");
        };
        let s = Instant::now();
        let scored = stub.score(&text, &candidates, &prompt, &|| false)?;
        t[2].push(s.elapsed().as_secs_f64() * 1e6);
        let s = Instant::now();
        let reply = tiergate_queue::Reply::Rerank(tiergate_queue::RerankReply {
            scores: scored.scores,
            prompt_tokens: scored.prompt_tokens,
        });
        let r = tiergate_queue::encode_reply(&reply)?;
        tiergate_queue::decode_reply(&r)?;
        t[3].push(s.elapsed().as_secs_f64() * 1e6);
    }
    Ok(t.map(|mut v| pct(&mut v, 0.5)))
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--echo-server") {
        return echo_server(&args[2], args[3].parse()?);
    }
    let n: usize = args.get(1).map_or(Ok(20_000), |s| s.parse())?;

    // 1. Round trips. Both peer processes live throughout; the three ways alternate in rounds of ROUND round
    //    trips, so a noisy phase of the machine hits all three alike; the first round of each is a warm-up.
    let name = format!("tiergate-bench-{}", std::process::id());
    let seg = Arc::new(Segment::create(
        &name,
        Geometry {
            slots: 64,
            req_cap: 4096,
            resp_cap: 8192,
        },
    )?);
    let sup = supervisor(&seg, &name, 0)?;
    let client = Client::new(seg.clone(), Duration::from_secs(2))?;
    wait_ready(&client)?;
    let job = job_of(JOB_BYTES)?;
    let bytes = tiergate_queue::encode_job(&job)?.len();
    let (mut sock, mut child, path) = echo_peer(bytes)?;
    let payload = vec![7u8; bytes];
    let mut back = vec![0u8; bytes];
    let (mut q, mut d, mut u) = (Vec::new(), Vec::new(), Vec::new());
    let timed = |out: &mut Vec<f64>, keep: bool, f: &mut dyn FnMut() -> anyhow::Result<()>| {
        for _ in 0..ROUND {
            let t = Instant::now();
            f()?;
            if keep {
                out.push(t.elapsed().as_secs_f64() * 1e6);
            }
        }
        anyhow::Ok(())
    };
    for round in 0..=n.div_ceil(ROUND) {
        let keep = round > 0;
        timed(&mut q, keep, &mut || {
            client.call(&job, Duration::from_secs(5))?;
            Ok(())
        })?;
        timed(&mut d, keep, &mut || {
            client.submit(&job, Duration::from_secs(5))?.wait_reply()?;
            Ok(())
        })?;
        timed(&mut u, keep, &mut || {
            sock.write_all(&payload)?;
            sock.read_exact(&mut back)?;
            Ok(())
        })?;
    }
    drop(client);
    drop(sup);
    drop(sock);
    let _ = child.wait();
    let _ = std::fs::remove_file(&path);
    let cpu = cpu_per_job(&job)?;

    let (q50, q99, q999) = (pct(&mut q, 0.5), pct(&mut q, 0.99), pct(&mut q, 0.999));
    let (d50, d99, d999) = (pct(&mut d, 0.5), pct(&mut d, 0.99), pct(&mut d, 0.999));
    let (u50, u99, u999) = (pct(&mut u, 0.5), pct(&mut u, 0.99), pct(&mut u, 0.999));
    println!(
        "round trip, {bytes}-byte rerank job, stub worker process, {} round trips each, interleaved:",
        q.len()
    );
    println!(
        "  queue, call (own slot)    : p50 {q50:7.1} us  p99 {q99:7.1} us  p99.9 {q999:7.1} us"
    );
    println!(
        "  queue, submit (dispatcher): p50 {d50:7.1} us  p99 {d99:7.1} us  p99.9 {d999:7.1} us"
    );
    println!(
        "  unix socket, same bytes   : p50 {u50:7.1} us  p99 {u99:7.1} us  p99.9 {u999:7.1} us"
    );
    println!(
        "  ratio call/socket         : p50 {:.2}  p99 {:.2}",
        q50 / u50,
        q99 / u99
    );
    println!(
        "  CPU per job, in one thread: encode job {:.1} us, decode job {:.1} us, stub engine {:.1} us, \
         reply encode+decode {:.1} us",
        cpu[0], cpu[1], cpu[2], cpu[3]
    );

    // 2. Flood: a slow worker, all slots taken, then time the refusals.
    let name = format!("tiergate-bench-flood-{}", std::process::id());
    let seg = Arc::new(Segment::create(
        &name,
        Geometry {
            slots: 32,
            req_cap: 4096,
            resp_cap: 8192,
        },
    )?);
    let job = job_of(JOB_BYTES)?;
    let sup = supervisor(&seg, &name, 10_000)?;
    let client = Client::new(seg.clone(), Duration::from_secs(2))?;
    wait_ready(&client)?;
    let mut held = Vec::new();
    let mut full = Vec::new();
    for _ in 0..20_000 {
        let t = Instant::now();
        match client.submit(&job, Duration::from_secs(30)) {
            Ok(h) => held.push(h),
            Err(QueueError::Full { .. }) => full.push(t.elapsed().as_secs_f64() * 1e6),
            Err(e) => return Err(e.into()),
        }
    }
    println!(
        "flood: {} accepted (= slots), {} refused with Full: p50 {:.1} us, p99 {:.1} us, max {:.1} us",
        held.len(),
        full.len(),
        pct(&mut full, 0.5),
        pct(&mut full, 0.99),
        pct(&mut full, 1.0)
    );
    drop(held);
    drop(client);
    drop(sup);
    Ok(())
}
