//! The server on real loopback sockets (`serve::run` in this process, port 0, a tiny classifier): stalled and
//! trickled bodies, connection limits, the admin listener, and the SIGTERM lame duck and drain under
//! keep-alive load. Clients are raw TCP so that a reset is seen as a reset.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tiergate_config::Config;
use tiergate_prefilter::testing::TinyModel;
use tiergate_server::serve::Bound;

mod common;

/// A server running on a runtime of its own; dropping it (or `stop`) triggers the shutdown sequence.
struct Server {
    bound: Bound,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    done: Option<std::thread::JoinHandle<anyhow::Result<()>>>,
    _tiny: TinyModel,
}

impl Server {
    fn start(tweak: impl FnOnce(&mut Config)) -> Self {
        let tiny = TinyModel::create(2).unwrap();
        let mut cfg = common::config(&tiny);
        cfg.reranker.workers = 0;
        cfg.server.listen = "127.0.0.1:0".parse().unwrap();
        cfg.server.admin_listen = "127.0.0.1:0".parse().unwrap();
        cfg.server.lame_duck_ms = 300;
        tweak(&mut cfg);
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let done = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()?;
            rt.block_on(async move {
                let (tx, rx) = tokio::sync::oneshot::channel();
                let server = tokio::spawn(tiergate_server::serve::run(
                    cfg,
                    Some(common::worker_program()),
                    async move {
                        let _ = stop_rx.await;
                    },
                    Some(tx),
                ));
                if let Ok(b) = rx.await {
                    let _ = ready_tx.send(b);
                }
                server.await?
            })
        });
        let bound = ready_rx
            .recv_timeout(Duration::from_secs(30))
            .expect("server did not start");
        Server {
            bound,
            stop: Some(stop_tx),
            done: Some(done),
            _tiny: tiny,
        }
    }

    /// Triggers the shutdown (as SIGTERM does) and waits for the server to finish.
    fn stop(&mut self) -> Duration {
        let t = Instant::now();
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(d) = self.done.take() {
            d.join().unwrap().unwrap();
        }
        t.elapsed()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.done.is_some() {
            self.stop();
        }
    }
}

/// One HTTP/1.1 response: status, lower-cased header block, body.
struct Resp {
    status: u16,
    headers: String,
    body: Vec<u8>,
}

/// Reads one response (Content-Length framed) from `s`.
fn read_response(s: &mut TcpStream) -> std::io::Result<Resp> {
    let mut buf = Vec::new();
    let mut byte = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        if s.read(&mut byte)? == 0 {
            return Err(ErrorKind::UnexpectedEof.into());
        }
        buf.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&buf).to_ascii_lowercase();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or(ErrorKind::InvalidData)?;
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    s.read_exact(&mut body)?;
    Ok(Resp {
        status,
        headers: head,
        body,
    })
}

fn request_bytes(method: &str, path: &str, body: &str, close: bool) -> Vec<u8> {
    format!(
        "{method} {path} HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\ncontent-length: {}\r\n{}\r\n{body}",
        body.len(),
        if close { "connection: close\r\n" } else { "" }
    )
    .into_bytes()
}

/// One request on a fresh connection.
fn once(addr: SocketAddr, method: &str, path: &str, body: &str) -> Resp {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(&request_bytes(method, path, body, true))
        .unwrap();
    read_response(&mut s).unwrap()
}

const CHAT: &str = r#"{"model":"classify","messages":[{"role":"user","content":"card lost"}]}"#;

fn assert_openai_error(r: &Resp, status: u16) {
    assert_eq!(r.status, status, "{}", String::from_utf8_lossy(&r.body));
    let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
    assert!(v["error"]["message"].is_string(), "{v}");
}

/// 200 connections that send headers and one byte of body hold no admission permit: with 8 permits, normal
/// requests still get 200 and the probes answer. (Before the fix, each stalled body held a permit: 429.)
#[test]
fn stalled_bodies_do_not_lock_out_normal_requests() {
    let srv = Server::start(|c| {
        c.server.max_in_flight = 8;
        c.server.body_timeout_ms = 20_000;
    });
    let mut stalled = Vec::new();
    for _ in 0..200 {
        let mut s = TcpStream::connect(srv.bound.public).unwrap();
        let mut head = request_bytes("POST", "/v1/chat/completions", "", false);
        head.truncate(head.len() - 2);
        let head = String::from_utf8(head)
            .unwrap()
            .replace("content-length: 0\r\n", "content-length: 100\r\n");
        s.write_all(head.as_bytes()).unwrap();
        s.write_all(b"\r\n{").unwrap();
        stalled.push(s);
    }
    std::thread::sleep(Duration::from_millis(200));
    for _ in 0..5 {
        let r = once(srv.bound.public, "POST", "/v1/chat/completions", CHAT);
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    }
    assert_eq!(once(srv.bound.public, "GET", "/health", "").status, 200);
    assert_eq!(once(srv.bound.public, "GET", "/ready", "").status, 200);
    drop(stalled);
}

/// A body trickled a byte at a time gets 408 once the total body deadline passes (a per-read timeout would
/// restart at every byte and never fire).
#[test]
fn a_trickled_body_hits_the_total_deadline() {
    let srv = Server::start(|c| c.server.body_timeout_ms = 800);
    let mut s = TcpStream::connect(srv.bound.public).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
    let head =
        "POST /v1/chat/completions HTTP/1.1\r\nhost: t\r\ncontent-type: application/json\r\n\
                content-length: 1000\r\n\r\n";
    s.write_all(head.as_bytes()).unwrap();
    let t = Instant::now();
    let mut got = Vec::new();
    while t.elapsed() < Duration::from_secs(10) {
        if s.write_all(b" ").is_err() {
            break;
        }
        let mut buf = [0u8; 4096];
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                got.extend_from_slice(&buf[..n]);
                if got.windows(4).any(|w| w == b"\r\n\r\n") && got.ends_with(b"}") {
                    break;
                }
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => break,
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let took = t.elapsed();
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 408"), "after {took:?}: {text}");
    assert!(text.contains("body_timeout_ms"), "{text}");
    assert!(took < Duration::from_secs(5), "408 after {took:?}");
}

/// Beyond `max_connections_per_peer` a connection is answered 503 (OpenAI error shape) and closed; closing
/// one frees its place.
#[test]
fn connections_beyond_the_per_peer_limit_get_503() {
    let srv = Server::start(|c| c.server.max_connections_per_peer = 4);
    let mut held: Vec<TcpStream> = (0..4)
        .map(|_| TcpStream::connect(srv.bound.public).unwrap())
        .collect();
    // Make sure the server has accepted all four.
    for s in &mut held {
        s.write_all(&request_bytes("GET", "/health", "", false))
            .unwrap();
        assert_eq!(read_response(s).unwrap().status, 200);
    }
    let mut extra = TcpStream::connect(srv.bound.public).unwrap();
    extra
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let r = read_response(&mut extra).unwrap();
    assert_openai_error(&r, 503);
    assert!(r.headers.contains("connection: close"));
    drop(held.pop());
    let t = Instant::now();
    loop {
        let mut s = TcpStream::connect(srv.bound.public).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.write_all(&request_bytes("GET", "/health", "", true))
            .unwrap();
        if read_response(&mut s).is_ok_and(|r| r.status == 200) {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "the freed place never came back"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A request head over the limits (too many headers, or too many bytes) gets 431 with the OpenAI error body,
/// not the HTTP layer's empty 431.
#[test]
fn oversized_headers_get_431_with_a_body() {
    let srv = Server::start(|c| c.server.max_header_bytes = 8 * 1024);
    let send = |extra: String| {
        let mut s = TcpStream::connect(srv.bound.public).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let req = format!("GET /health HTTP/1.1\r\nhost: t\r\n{extra}connection: close\r\n\r\n");
        s.write_all(req.as_bytes()).unwrap();
        read_response(&mut s).unwrap()
    };
    let many: String = (0..150).map(|i| format!("x-h{i}: v\r\n")).collect();
    let r = send(many);
    assert_openai_error(&r, 431);
    let big = format!("x-big: {}\r\n", "a".repeat(20_000));
    let r = send(big);
    assert_openai_error(&r, 431);
    assert!(String::from_utf8_lossy(&r.body).contains("max_header_bytes"));
    assert_eq!(send(String::new()).status, 200);
}

/// `/admin/*` and `/info` live on the admin listener only; the public one answers 404.
#[test]
fn admin_is_served_on_its_own_listener_only() {
    let srv = Server::start(|_| {});
    for path in ["/admin/routing", "/info"] {
        assert_openai_error(&once(srv.bound.public, "GET", path, ""), 404);
        // No token configured: loopback peers are admin on the admin listener.
        let r = once(srv.bound.admin, "GET", path, "");
        assert_eq!(
            r.status,
            200,
            "{path}: {}",
            String::from_utf8_lossy(&r.body)
        );
    }
    assert_openai_error(
        &once(srv.bound.admin, "POST", "/v1/chat/completions", CHAT),
        404,
    );
}

/// SIGTERM under keep-alive load: `/ready` turns 503 at once, responses carry `Connection: close` during the
/// lame duck, and no request a client has sent is reset; the server then exits.
#[test]
fn sigterm_under_keep_alive_load_resets_no_request() {
    let mut srv = Server::start(|c| {
        c.server.lame_duck_ms = 600;
        c.server.drain_ms = 3_000;
    });
    let addr = srv.bound.public;
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, reset, closes) = (
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
    );
    let clients: Vec<_> = (0..16)
        .map(|_| {
            let (stop, ok, reset, closes) =
                (stop.clone(), ok.clone(), reset.clone(), closes.clone());
            std::thread::spawn(move || {
                let req = request_bytes("POST", "/v1/chat/completions", CHAT, false);
                let mut failures = Vec::new();
                'connect: while !stop.load(Ordering::SeqCst) {
                    // Refused: the server no longer listens; nothing was sent.
                    let Ok(mut s) = TcpStream::connect(addr) else {
                        break;
                    };
                    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                    loop {
                        if let Err(e) = s.write_all(&req) {
                            failures.push(format!("write: {e}"));
                            break 'connect;
                        }
                        match read_response(&mut s) {
                            Ok(r) => {
                                assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
                                ok.fetch_add(1, Ordering::SeqCst);
                                if r.headers.contains("connection: close") {
                                    closes.fetch_add(1, Ordering::SeqCst);
                                    continue 'connect;
                                }
                            }
                            Err(e) => {
                                failures.push(format!("read: {e}"));
                                break 'connect;
                            }
                        }
                    }
                }
                reset.fetch_add(failures.len(), Ordering::SeqCst);
                failures
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let before = ok.load(Ordering::SeqCst);
    assert!(before > 0, "no request succeeded before the shutdown");
    // The probe must see 503 right away, while requests are still served.
    let probe = std::thread::spawn(move || {
        let t = Instant::now();
        loop {
            let r = once(addr, "GET", "/ready", "");
            if r.status == 503 {
                return t.elapsed();
            }
            assert!(
                t.elapsed() < Duration::from_millis(500),
                "/ready stayed {}",
                r.status
            );
        }
    });
    std::thread::sleep(Duration::from_millis(5));
    // The clients behave like a load balancer that saw `/ready` turn 503: they stop opening connections once
    // the lame duck is over. (A client that still connects as the listener closes is reset by the kernel
    // whatever the server does: its connection was never accepted.)
    let stopper = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(600));
            stop.store(true, Ordering::SeqCst);
        })
    };
    let took = srv.stop();
    let ready_503_after = probe.join().unwrap();
    stopper.join().unwrap();
    let failures: Vec<String> = clients
        .into_iter()
        .flat_map(|c| c.join().unwrap())
        .collect();
    assert!(failures.is_empty(), "requests reset: {failures:?}");
    assert_eq!(reset.load(Ordering::SeqCst), 0);
    assert!(
        closes.load(Ordering::SeqCst) > 0,
        "no Connection: close seen in the lame duck"
    );
    assert!(
        ok.load(Ordering::SeqCst) > before,
        "nothing served during the lame duck"
    );
    assert!(ready_503_after < Duration::from_millis(500));
    assert!(took < Duration::from_secs(6), "shutdown took {took:?}");
}
