//! The agents people run, end to end through tiergate: Claude Code (`claude -p`, the Messages door) and Codex
//! CLI (`codex exec`, the Responses door), at the pinned versions `scripts/test.sh` installs from npm, each run
//! non-interactively against a real server in a scratch directory holding a file with a secret word drawn
//! for this run. Each reads the file through its own tool (Claude Code's `Read`, Codex's `exec_command`),
//! sends the result back and prints an answer holding the word.
//!
//! The model is a fake, and says so: the stub engine behind a real worker process with a script
//! (`--stub-script`) that calls the scripted tool a conversation offers and, given the tool's result,
//! answers with that result's text. No model that runs on this machine calls an agent's tools reliably; what
//! is under test is every byte between the client and the engine — the first request's fields (`thinking`,
//! `reasoning`, `include`, `namespace` and `web_search` tools, 32,000 `max_tokens`, …), the tool call in
//! the client's shape, the tool result carried back, the streamed answer. The word is in no prompt: it
//! can only reach the answer through the tool-result block, and the worker's log line shows it did.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::Server;

/// The folder holding the pinned CLIs (`node_modules/.bin/claude`, `…/codex`): `TIERGATE_AGENTS_DIR`, else
/// `~/.cache/tiergate/agents`, where `scripts/test.sh` installs them.
fn agents_dir() -> PathBuf {
    std::env::var_os("TIERGATE_AGENTS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                .join(".cache/tiergate/agents")
        })
}

fn cli(name: &str) -> PathBuf {
    let bin = agents_dir().join("node_modules/.bin").join(name);
    assert!(
        bin.exists(),
        "{} is missing: scripts/test.sh installs the agent CLIs from npm",
        bin.display()
    );
    bin
}

/// A word no prompt holds, different on every run.
fn secret_word() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos(),
    );
    format!("walrus{:x}", h.finish() & 0xff_ffff_ffff)
}

/// A scratch directory with `notes.txt`, the stub's script for it, and a home for the clients' state.
struct Scratch {
    dir: tempfile::TempDir,
    word: String,
}

impl Scratch {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let word = secret_word();
        std::fs::create_dir_all(dir.path().join("work")).unwrap();
        std::fs::create_dir_all(dir.path().join("home")).unwrap();
        std::fs::write(
            dir.path().join("work/notes.txt"),
            format!("The secret word is {word}.\n"),
        )
        .unwrap();
        let notes = dir.path().join("work/notes.txt");
        let script = serde_json::json!({"calls": [
            ["Read", {"file_path": notes}],
            ["exec_command", {"cmd": "cat notes.txt"}],
            ["shell", {"command": ["cat", "notes.txt"]}],
            ["local_shell", {"command": ["cat", "notes.txt"]}],
        ]});
        std::fs::write(dir.path().join("script.json"), script.to_string()).unwrap();
        Self { dir, word }
    }

    fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }

    /// The `--set` that keeps a test server's decision records here.
    fn ledger(&self) -> String {
        format!("feedback.path=\"{}\"", self.path("ledger.sqlite").display())
    }
}

/// A server whose `generate` route answers every model name these clients send (Claude Code's background
/// calls name a `claude-haiku-*`), on the scripted stub, its log (with the access log) in `server.log`.
fn server(s: &Scratch) -> Server {
    let log = std::fs::File::create(s.path("server.log")).unwrap();
    let args = format!(
        "reranker.extra_args=[\"--stub-script\", \"{}\"]",
        s.path("script.json").display()
    );
    let ledger = s.ledger();
    common::start_logged(
        &[
            "--set",
            "reranker.engine=\"stub\"",
            "--set",
            "reranker.tools=true",
            "--set",
            &args,
            "--set",
            &ledger,
            "--set",
            "routes=[{ name = \"classify\", kind = \"classify\" }, \
             { name = \"generate\", kind = \"generate\", aliases = [\"claude-*\", \"gpt-*\"], default = true }]",
        ],
        &[("RUST_LOG", "info,tiergate::access=debug")],
        Stdio::from(log),
    )
}

/// Runs `cmd` to its end (at most `limit`), returning its exit status and its output.
fn run(mut cmd: Command, limit: Duration) -> (bool, String) {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t = std::time::Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let out = child.wait_with_output().unwrap();
            let text = format!(
                "{}\n--- stderr ---\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            return (status.success(), text);
        }
        if t.elapsed() > limit {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "did not finish within {limit:?}:\n{}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The requests the server answered on `path`, from its access log: each line's status.
fn statuses(log: &str, path: &str) -> Vec<u16> {
    log.lines()
        .filter(|l| l.contains("request done") && l.contains(&format!("POST {path}")))
        .filter_map(|l| {
            let at = l.find("status=")? + "status=".len();
            l[at..]
                .split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse()
                .ok()
        })
        .collect()
}

/// What every run must show: the client exited 0 and printed the word; every request it made was answered
/// 2xx (at least a tool turn and the answer); the worker answered from the tool result holding the word.
fn assert_agent_run(s: &Scratch, ok: bool, out: &str, path: &str) {
    let log = std::fs::read_to_string(s.path("server.log")).unwrap();
    assert!(ok, "the client failed:\n{out}\n--- server log ---\n{log}");
    assert!(
        out.contains(&s.word),
        "the answer lacks the word {}:\n{out}\n--- server log ---\n{log}",
        s.word
    );
    let codes = statuses(&log, path);
    assert!(
        codes.len() >= 2,
        "{codes:?}: expected a tool turn and the answer\n{log}"
    );
    assert!(
        codes.iter().all(|c| (200..300).contains(c)),
        "a request was not answered 2xx: {codes:?}\n{log}"
    );
    assert!(
        log.lines()
            .any(|l| l.contains("answering from the tool result") && l.contains(&s.word)),
        "the worker did not answer from a tool result holding the word:\n{log}"
    );
}

/// Claude Code: `claude -p` reads `notes.txt` with its `Read` tool through the Messages door.
#[test]
fn claude_code_reads_a_file_through_its_tool_and_answers() {
    let s = Scratch::new();
    let server = server(&s);
    let mut cmd = Command::new(cli("claude"));
    cmd.current_dir(s.path("work"))
        .args([
            "-p",
            "What is the secret word in notes.txt?",
            "--model",
            "generate",
            "--allowedTools",
            "Read",
        ])
        .env("HOME", s.path("home"))
        .env("ANTHROPIC_BASE_URL", &server.base)
        .env("ANTHROPIC_API_KEY", "sk-tiergate-test")
        .env("DISABLE_AUTOUPDATER", "1")
        .env("DISABLE_TELEMETRY", "1")
        .env("DISABLE_ERROR_REPORTING", "1")
        .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1");
    let (ok, out) = run(cmd, Duration::from_secs(180));
    assert_agent_run(&s, ok, &out, "/v1/messages");
}

/// Codex CLI's config for this server: the Responses wire, no update check, no analytics.
fn codex_home(s: &Scratch, base: &str) -> PathBuf {
    let home = s.path("codex");
    std::fs::create_dir_all(&home).unwrap();
    let config = format!(
        "model = \"generate\"\nmodel_provider = \"tiergate\"\ncheck_for_update_on_startup = false\n\
         [analytics]\nenabled = false\n\
         [model_providers.tiergate]\nname = \"tiergate\"\nbase_url = \"{base}/v1\"\nwire_api = \"responses\"\n\
         request_max_retries = 0\nstream_max_retries = 0\n"
    );
    std::fs::write(home.join("config.toml"), config).unwrap();
    home
}

/// Codex CLI: `codex exec` runs `cat notes.txt` with its `exec_command` tool through the Responses door.
#[test]
fn codex_runs_a_command_through_its_tool_and_answers() {
    let s = Scratch::new();
    let server = server(&s);
    let home = codex_home(&s, &server.base);
    let mut cmd = Command::new(cli("codex"));
    cmd.current_dir(s.path("work"))
        .args([
            "exec",
            "--skip-git-repo-check",
            "--dangerously-bypass-approvals-and-sandbox",
            "What is the secret word in notes.txt?",
        ])
        .env("HOME", s.path("home"))
        .env("CODEX_HOME", &home);
    let (ok, out) = run(cmd, Duration::from_secs(180));
    assert_agent_run(&s, ok, &out, "/v1/responses");
}

/// The clients' own session ids keep a conversation on one backend: on a stage of two alternatives chosen
/// by latency, a second turn carrying the same Claude Code session id (no `x-session-id`) or Codex
/// `prompt_cache_key` lands where the first did, and the response says the session was kept.
#[test]
fn a_clients_own_session_id_keeps_its_backend() {
    let s = Scratch::new();
    let ledger = s.ledger();
    let server = common::start(&[
        "--set",
        "llm=[{ name = \"a\", engine = \"stub\", workers = 1 }, { name = \"b\", engine = \"stub\", workers = 1 }]",
        "--set",
        "routes=[{ name = \"classify\", kind = \"classify\" }, \
         { name = \"generate\", kind = \"generate\", aliases = [\"claude-*\", \"gpt-*\"], \
         stages = [{ any = [\"a\", \"b\"], prefer = \"latency\" }] }]",
        "--set",
        &ledger,
    ]);
    let turn = |path: &str, body: serde_json::Value, header: Option<(&str, &str)>| {
        let mut r = ureq::post(&format!("{}{path}", server.base));
        if let Some((k, v)) = header {
            r = r.set(k, v);
        }
        let r = r.send_json(body).unwrap();
        (
            r.header("x-tiergate-backend")
                .unwrap_or_default()
                .to_string(),
            r.header("x-tiergate-session")
                .unwrap_or_default()
                .to_string(),
        )
    };
    for i in 0..4 {
        let id = format!("claude-session-{i}");
        let body = serde_json::json!({"model": "claude-haiku-4-5", "max_tokens": 64000,
            "messages": [{"role": "user", "content": format!("hello {i}")}]});
        let first = turn(
            "/v1/messages",
            body.clone(),
            Some(("x-claude-code-session-id", &id)),
        );
        let second = turn(
            "/v1/messages",
            body,
            Some(("x-claude-code-session-id", &id)),
        );
        assert_eq!(first.1, "new", "{first:?}");
        assert_eq!(second, (first.0.clone(), "kept".to_string()));
        let key = format!("codex-{i}");
        let body = serde_json::json!({"model": "gpt-5", "input": "hi", "prompt_cache_key": key});
        let first = turn("/v1/responses", body.clone(), None);
        let second = turn("/v1/responses", body, None);
        assert_eq!(first.1, "new", "{first:?}");
        assert_eq!(second, (first.0.clone(), "kept".to_string()));
    }
}

/// Bytes while the model prefills: a streamed request whose answer has not started within
/// `server.stream_head_ms` gets its head then and keep-alive events until the first token (Anthropic's
/// `ping` events, SSE comments on the OpenAI doors), so an agent's idle timeout does not fire and retry the
/// prompt. Here the stub takes 2 s to its first token, the head is due after 100 ms, a keep-alive after
/// every 200 ms of quiet.
#[test]
fn a_slow_first_token_gets_its_head_early_and_keep_alives() {
    let s = Scratch::new();
    let ledger = s.ledger();
    let server = common::start(&[
        "--set",
        "reranker.engine=\"stub\"",
        "--set",
        "reranker.extra_args=[\"--stub-delay-ms\", \"4000\"]",
        "--set",
        "server.stream_head_ms=100",
        "--set",
        "server.keepalive_ms=200",
        "--set",
        &ledger,
    ]);
    let cases = [
        (
            "/v1/messages",
            serde_json::json!({"model": "generate", "max_tokens": 8, "stream": true,
                               "messages": [{"role": "user", "content": "hello"}]}),
            "event: ping",
            "event: message_start",
        ),
        (
            "/v1/responses",
            serde_json::json!({"model": "generate", "input": "hello", "stream": true}),
            ": keep-alive",
            "event: response.created",
        ),
    ];
    for (path, body, ping, first) in cases {
        let t = std::time::Instant::now();
        let r = ureq::post(&format!("{}{path}", server.base))
            .send_json(body)
            .unwrap();
        let head = t.elapsed();
        assert_eq!(r.status(), 200);
        assert!(
            head < Duration::from_millis(1500),
            "{path}: head after {head:?}"
        );
        let text = r.into_string().unwrap();
        let before = &text[..text.find(first).unwrap_or(0)];
        assert!(
            before.matches(ping).count() >= 3,
            "{path}: keep-alives before the first event:\n{text}"
        );
        assert!(
            text.contains("stub:") && text.contains("hello"),
            "{path}: {text}"
        );
    }
}
