//! The real `tiergate serve` process for end-to-end tests: started on port 0 (both listeners), ready when
//! `/ready` says so, SIGTERM on drop.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)] // shared by several test files

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use tiergate_tests::{binary, minilm_dir, root};

pub struct Server {
    pub child: Child,
    pub base: String,
    /// The admin listener (`/admin/*`, `/info`).
    pub admin: String,
}

impl Drop for Server {
    /// SIGTERM first (the server removes its segment and stops its workers), SIGKILL after 10 s.
    fn drop(&mut self) {
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(10) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn start(extra: &[&str]) -> Server {
    start_env(extra, &[])
}

/// [`start`] with extra environment variables.
pub fn start_env(extra: &[&str], env: &[(&str, &str)]) -> Server {
    start_logged(extra, env, Stdio::inherit())
}

/// [`start_env`] with the server's (and its workers') log going to `stderr`.
pub fn start_logged(extra: &[&str], env: &[(&str, &str)], stderr: Stdio) -> Server {
    minilm_dir();
    let mut child = Command::new(binary("tiergate"))
        .envs(env.iter().copied())
        .current_dir(root())
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
        ])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(addr) = line.strip_prefix("tiergate listening on ") {
                let _ = tx.send(addr.to_string());
            } else if let Some(addr) = line.strip_prefix("tiergate admin listening on ") {
                let _ = tx.send(addr.to_string());
            }
        }
    });
    let addr = || {
        rx.recv_timeout(Duration::from_secs(120))
            .expect("server did not start")
    };
    let (base, admin) = (addr(), addr());
    let s = Server { child, base, admin };
    // Wait for readiness (a live worker where the generate route needs one).
    let t = Instant::now();
    loop {
        if let Ok(r) = ureq::get(&format!("{}/ready", s.base)).call() {
            if r.status() == 200 {
                break;
            }
        }
        assert!(t.elapsed() < Duration::from_secs(120), "not ready");
        std::thread::sleep(Duration::from_millis(50));
    }
    s
}

/// A child process (a real Prometheus, Redis, llama.cpp server …) killed and reaped on drop.
pub struct Killed(pub Child);

impl Killed {
    /// Kills and reaps it now.
    pub fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Killed {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The hex SHA-256 of an API key as an operator computes it for `key_sha256` (`printf %s KEY | sha256sum`).
pub fn key_sha256(key: &str) -> String {
    let out = Command::new("sh")
        .args(["-c", &format!("printf %s '{key}' | sha256sum")])
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap()[..64].to_string()
}

/// A loopback port free at the time of asking.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Starts a real Prometheus (Debian package `prometheus`) on a free loopback port with `config`
/// (prometheus.yml text) written into `dir`; returns the process and its base URL.
pub fn prometheus(dir: &std::path::Path, config: &str) -> (Killed, String) {
    let file = dir.join("prometheus.yml");
    std::fs::write(&file, config).unwrap();
    let port = free_port();
    let child = Command::new("prometheus")
        .arg(format!("--config.file={}", file.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("prometheus (Debian package `prometheus`; scripts/test.sh installs it)");
    (Killed(child), format!("http://127.0.0.1:{port}"))
}

/// A `tiergate-reranker` worker (mistralrs engine) on `model` behind a fresh shared-memory queue, ready
/// (waits up to `ready_within` for the model to load). Drop the supervisor to stop it.
pub fn llm_worker(
    model: &std::path::Path,
    tag: &str,
    ready_within: Duration,
) -> (tiergate_queue::Client, tiergate_queue::Supervisor) {
    use tiergate_queue::{Client, Geometry, Segment, Supervisor, SupervisorConfig};
    let name = format!("tiergate-test-{tag}-{}", std::process::id());
    let seg = std::sync::Arc::new(
        Segment::create(
            &name,
            Geometry {
                slots: 8,
                req_cap: 8192,
                resp_cap: 65536,
            },
        )
        .unwrap(),
    );
    let sup = Supervisor::start(
        seg.clone(),
        SupervisorConfig {
            workers: 1,
            program: binary("tiergate-reranker"),
            args: {
                let mut r = tiergate_config::Config::default().reranker;
                r.engine = tiergate_config::EngineKind::Mistralrs;
                r.model = model.to_path_buf();
                vec![
                    "--spec".into(),
                    tiergate_config::WorkerSpec::of(&r).to_arg(),
                ]
            },
            segment: name,
            heartbeat_timeout: Duration::from_secs(10),
            load_timeout: Duration::from_secs(600),
            backoff_initial: Duration::from_millis(200),
            backoff_max: Duration::from_secs(2),
            retry: false,
        },
    )
    .unwrap();
    let client = Client::new(seg, Duration::from_secs(5)).unwrap();
    let t = Instant::now();
    while client.live_workers() == 0 {
        assert!(
            t.elapsed() < ready_within,
            "the {tag} worker did not become ready"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    (client, sup)
}

/// A real `redis-server` on `port` (loopback, no persistence), ready when it accepts a connection.
pub fn redis(port: u16) -> Killed {
    Killed(tiergate_engine::testing::redis_server(port))
}

/// A generation's events read to its end (each within `wait`): its text, its tool calls and its usage.
pub fn generated(
    h: &tiergate_queue::JobHandle,
    wait: Duration,
) -> (String, Vec<tiergate_queue::ToolCall>, tiergate_queue::Usage) {
    use tiergate_queue::{Event, Reply};
    let (mut text, mut calls) = (String::new(), Vec::new());
    let usage = loop {
        match h.events.recv_timeout(wait).unwrap() {
            Event::Chunk(c) => text.push_str(&c),
            Event::ToolCall(c) => calls.push(c),
            Event::Reply(Reply::Generated(u)) => break u,
            other => panic!("unexpected {other:?}"),
        }
    };
    eprintln!("text {text:?} calls {calls:?} {usage:?}");
    (text, calls, usage)
}
