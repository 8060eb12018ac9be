//! What tests of the engine and of its doors share: a config of three labels over the tiny few-shot encoder
//! (no download) with a classify, an answer and a generate route, and a real `redis-server` on a loopback
//! port. Not for serving: a test fails loudly here.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use tiergate_config::{Config, FewShotLabel, HeadConfig, RouteConfig, RouteKind};
use tiergate_prefilter::testing::TinyModel;

/// Three labels over the tiny encoder, and a classify, an answer and a generate route.
pub fn config(tiny: &TinyModel) -> Config {
    let mut cfg = Config::default();
    cfg.prefilter.encoder = tiny.dir.path().to_path_buf();
    cfg.prefilter.max_tokens = 16;
    // Each test server keeps its batches in its own directory.
    cfg.batch.data_dir = tiny.dir.path().join("batches");
    // … and its decision records (in memory here: no durable ledger is mounted in-process).
    cfg.feedback.path = tiny.dir.path().join("feedback.sqlite");
    cfg.prefilter.head = HeadConfig::FewShot {
        labels: vec![
            FewShotLabel {
                label: "card_lost".into(),
                examples: vec!["card lost".into(), "card stolen".into()],
                reply: Some("Freeze your card.".into()),
                description: None,
            },
            FewShotLabel {
                label: "pay_bill".into(),
                examples: vec!["pay bill".into()],
                reply: Some("Go to Payments.".into()),
                description: None,
            },
            FewShotLabel {
                label: "greeting".into(),
                examples: vec!["hello hi".into()],
                reply: Some("Hello!".into()),
                description: None,
            },
        ],
        temperature: 0.05,
    };
    cfg.routes = [
        ("classify", RouteKind::Classify),
        ("answer", RouteKind::Answer),
        ("generate", RouteKind::Generate),
    ]
    .into_iter()
    .map(|(name, kind)| RouteConfig {
        prompts: None,
        name: name.into(),
        kind,
        head: None,
        out_of_scope: None,
        deadline_ms: None,
        max_deadline_ms: None,
        stages: None,
        cache_generations: false,
        steer: None,
        context_turns: 0,
        context_chars: 400,
        aliases: Vec::new(),
        default: false,
        max_tokens: None,
        max_text_chars: None,
    })
    .collect();
    cfg
}

/// A loopback port free at the time of asking (the engine's own tests).
#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(crate) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A real `redis-server` (Debian package `redis-server`; scripts/test.sh installs it) on the loopback `port`,
/// without persistence, once it accepts connections.
pub fn redis_server(port: u16) -> std::process::Child {
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};
    let port_arg = port.to_string();
    let args = ["--port", &port_arg, "--bind", "127.0.0.1"];
    let child = Command::new("redis-server")
        .args(args)
        .args(["--save", "", "--appendonly", "no"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server (Debian package `redis-server`; scripts/test.sh installs it)");
    let t = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "redis-server did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    child
}
