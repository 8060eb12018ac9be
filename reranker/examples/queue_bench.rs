//! Queue benchmarks, printed as figures:
//! 1. round trip of a 1 KB rerank job through the shared-memory queue to a stub worker *process* and back,
//!    next to a 1 KB round trip over a loopback Unix socket to an echo *process*, in the same run;
//! 2. how fast a flooded queue answers `Full`.
//!
//! `cargo run -p tiergate-reranker --example queue_bench [-- ROUND_TRIPS]`

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tiergate_queue::{
    Candidate, Client, Geometry, Job, QueueError, Segment, Supervisor, SupervisorConfig,
};

fn pct(v: &mut [f64], q: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((q * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1]
}

fn job_1kb() -> Job {
    Job::Rerank {
        text: "x".repeat(880),
        candidates: (0..5)
            .map(|i| Candidate {
                label: format!("label_{i}"),
                description: None,
                examples: vec![],
                p: 0.2,
            })
            .collect(),
        llm_weight: 0.5,
        llm_temperature: 1.0,
        prompt: Default::default(),
    }
}

fn echo_server(path: &str) -> anyhow::Result<()> {
    let listener = UnixListener::bind(path)?;
    let (mut s, _) = listener.accept()?;
    let mut buf = vec![0u8; 1024];
    loop {
        if s.read_exact(&mut buf).is_err() {
            return Ok(());
        }
        s.write_all(&buf)?;
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
            args: vec![
                "--engine".into(),
                "stub".into(),
                "--stub-delay-ms".into(),
                delay_ms.to_string(),
            ],
            segment: name.into(),
            heartbeat_timeout: Duration::from_secs(2),
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

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--echo-server") {
        return echo_server(&args[2]);
    }
    let n: usize = args.get(1).map_or(Ok(20_000), |s| s.parse())?;

    // 1. Queue round trip.
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
    let job = job_1kb();
    let bytes = serde_json::to_vec(&job)?.len();
    let mut q = Vec::with_capacity(n);
    for i in 0..n + 1000 {
        let t = Instant::now();
        client.submit(&job, Duration::from_secs(5))?.wait_reply()?;
        if i >= 1000 {
            q.push(t.elapsed().as_secs_f64() * 1e6);
        }
    }
    drop(client);
    drop(sup);

    // Unix socket round trip to another process, same payload size.
    let path = std::env::temp_dir().join(format!("tiergate-bench-{}.sock", std::process::id()));
    let _ = std::fs::remove_file(&path);
    let mut child = std::process::Command::new(std::env::current_exe()?)
        .args(["--echo-server", &path.to_string_lossy()])
        .spawn()?;
    let t = Instant::now();
    let mut sock = loop {
        match UnixStream::connect(&path) {
            Ok(s) => break s,
            Err(_) if t.elapsed() < Duration::from_secs(5) => {
                std::thread::sleep(Duration::from_millis(5))
            }
            Err(e) => return Err(e.into()),
        }
    };
    let payload = vec![7u8; 1024];
    let mut back = vec![0u8; 1024];
    let mut u = Vec::with_capacity(n);
    for i in 0..n + 1000 {
        let t = Instant::now();
        sock.write_all(&payload)?;
        sock.read_exact(&mut back)?;
        if i >= 1000 {
            u.push(t.elapsed().as_secs_f64() * 1e6);
        }
    }
    drop(sock);
    let _ = child.wait();
    let _ = std::fs::remove_file(&path);

    let (q50, q99, q999) = (pct(&mut q, 0.5), pct(&mut q, 0.99), pct(&mut q, 0.999));
    let (u50, u99, u999) = (pct(&mut u, 0.5), pct(&mut u, 0.99), pct(&mut u, 0.999));
    println!("round trip, {bytes}-byte rerank job, stub worker process, {n} sequential jobs:");
    println!("  shared-memory queue : p50 {q50:7.1} us  p99 {q99:7.1} us  p99.9 {q999:7.1} us");
    println!("  unix socket (1 KB)  : p50 {u50:7.1} us  p99 {u99:7.1} us  p99.9 {u999:7.1} us");
    println!(
        "  ratio queue/socket  : p50 {:.2}  p99 {:.2}",
        q50 / u50,
        q99 / u99
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
