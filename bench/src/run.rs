//! One load run: open loop (arrivals on a schedule, latency from the intended send time) or closed loop
//! (N clients back to back), collected into outcomes, with the server scraped alongside.

use std::collections::HashMap;
use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::{mpsc, watch, Semaphore};

use crate::http::{chat_body, Api, ChatResult, HttpClient};
use crate::schedule::Schedule;
use crate::scrape::{scrape_loop, Scrape};
use crate::stats::{Channel, Outcome, Served};
use crate::workload::{Item, Sampler};

/// Open or closed loop.
#[derive(Debug, Clone)]
pub enum Load {
    Open {
        schedule: Schedule,
        poisson: bool,
        max_in_flight: usize,
    },
    Closed {
        clients: usize,
    },
}

/// Everything one run needs.
#[derive(Clone)]
pub struct Plan {
    pub items: Arc<Vec<Item>>,
    /// The route for items without their own.
    pub route: String,
    /// `tiergate_kind` of each listed route; labels are checked on classify routes and on servers that
    /// do not say.
    pub route_kinds: HashMap<String, Option<String>>,
    /// The dialect it speaks (`--api`).
    pub api: Api,
    pub stream: bool,
    pub max_tokens: Option<u32>,
    pub timeout: Duration,
    pub load: Load,
    pub window: Option<Duration>,
    pub requests: Option<u64>,
    pub seed: u64,
    /// Draw rows with this Zipf exponent (`--zipf`), else uniformly.
    pub zipf: Option<f64>,
    pub extra_headers: Vec<(String, String)>,
    pub admin_token: Option<String>,
    /// The server's admin listener (scraped once a second).
    pub admin: HttpClient,
    pub progress: bool,
    /// Shown in the progress line.
    pub name: String,
    /// Each request's budget (`x-tiergate-deadline-ms`), when set.
    pub deadline: Option<crate::deadlines::DeadlineSpec>,
    /// Requests prepared so far (draws the budgets).
    pub prepared: Arc<AtomicU64>,
    /// Feedback, audit labels and drift (`--feedback`, `--label-audits`, `--drift-at`).
    pub operator: Arc<crate::operator::Operator>,
}

/// What a run produced.
#[derive(Debug, Clone)]
pub struct RunData {
    pub outcomes: Vec<Outcome>,
    /// Requests the bench gave up on (`--timeout`).
    pub gave_up: GaveUp,
    /// The client's timeout, seconds.
    pub timeout_s: f64,
    /// Start to last answer, seconds.
    pub elapsed_s: f64,
    pub scrape: Scrape,
    /// CPU time the bench process spent (user + system), seconds.
    pub client_cpu_s: f64,
    pub interrupted: bool,
    /// What the operator did (`None`: nothing asked).
    pub operator: Option<crate::operator::Done>,
}

/// User + system CPU time of this process, seconds.
pub fn cpu_seconds() -> f64 {
    // SAFETY: getrusage writes into the zeroed struct we own; RUSAGE_SELF is always valid.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        if libc::getrusage(libc::RUSAGE_SELF, &mut ru) != 0 {
            return 0.0;
        }
        ru
    };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

struct Shared {
    client: HttpClient,
    operator: Arc<crate::operator::Operator>,
    api: Api,
    stream: bool,
    extra: Vec<(String, String)>,
    start: Instant,
    timeout: Duration,
    gave_up: Mutex<GaveUp>,
}

struct Prepared {
    body: Bytes,
    label: Option<String>,
    check_label: bool,
    budget_ms: Option<u32>,
    /// Post feedback on the answer.
    feedback: bool,
}

impl Plan {
    fn prepare(&self, idx: usize) -> Prepared {
        let item = &self.items[idx];
        let route = item.route.as_deref().unwrap_or(&self.route);
        let check_label = match self.route_kinds.get(route) {
            Some(Some(kind)) => kind == "classify",
            _ => true,
        };
        let n = self.prepared.fetch_add(1, Ordering::Relaxed);
        let text = self
            .operator
            .text(&item.text, item.label.as_deref(), self.seed, n);
        Prepared {
            body: chat_body(self.api, route, &text, self.stream, self.max_tokens),
            label: item.label.clone(),
            check_label,
            budget_ms: self.deadline.map(|d| d.draw(self.seed, n)),
            feedback: check_label && self.operator.gives_feedback(self.seed, n),
        }
    }
}

async fn one(s: &Shared, p: Prepared, intended: Instant) -> Outcome {
    let deadline = intended + s.timeout;
    let sent = Instant::now();
    let budget;
    let extra: &[(String, String)] = match p.budget_ms {
        Some(ms) => {
            budget = s
                .extra
                .iter()
                .cloned()
                .chain([("x-tiergate-deadline-ms".to_string(), ms.to_string())])
                .collect::<Vec<_>>();
            &budget
        }
        None => &s.extra,
    };
    let r = s
        .client
        .chat(s.api, p.body.clone(), s.stream, extra, deadline)
        .await;
    if r.error == Some(crate::http::TIMEOUT) {
        s.note_timeout(&r, &p, intended, sent);
    }
    let id = r.id.clone();
    let o = finish(s, r, intended, sent, &p);
    if let (true, Some(id), Some(label), None) = (p.feedback, id, &p.label, o.error) {
        s.operator.post_feedback(&s.client, &id, label).await;
    }
    o
}

fn finish(s: &Shared, r: ChatResult, intended: Instant, sent: Instant, p: &Prepared) -> Outcome {
    let end = Instant::now();
    let us = |t: Instant| t.saturating_duration_since(intended).as_micros() as u64;
    let correct = match (&r.error, &p.label) {
        (None, Some(l)) if p.check_label => Some(r.content.trim().eq_ignore_ascii_case(l.trim())),
        _ => None,
    };
    Outcome {
        at_s: intended.saturating_duration_since(s.start).as_secs_f64(),
        decode_tps: decode_rate(&r),
        latency_us: us(end),
        ttft_us: if r.error.is_none() {
            Some(us(r.first_token.unwrap_or(end)))
        } else {
            None
        },
        lag_us: us(sent),
        status: r.status,
        error: r.error,
        tier: r.tier,
        degraded: r.degraded,
        out_of_scope: r.out_of_scope,
        tokens_out: r.tokens_out,
        correct,
        model_us: r
            .model_ms
            .map(|ms| (ms * 1e3).min(f64::from(u32::MAX)) as u32),
        variant: r.variant,
        budget_ms: p.budget_ms,
        stage: r.stage,
        head: r.head,
    }
}

/// A generating stream's decode rate: tokens after the first ÷ the time from the first content event to the
/// last. `None` for an answer in fewer than two events (a label, a JSON answer) or one that failed.
fn decode_rate(r: &ChatResult) -> Option<f32> {
    if r.error.is_some() || r.events < 2 || r.tokens_out < 2 {
        return None;
    }
    let span = r.last_token?.checked_duration_since(r.first_token?)?;
    (span > Duration::ZERO).then(|| (f64::from(r.tokens_out - 1) / span.as_secs_f64()) as f32)
}

/// Most timed-out requests named in the report (the rest are counted).
const TIMED_OUT_NAMED: usize = 20;

/// A request the bench gave up on, with what the server had sent by then.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TimedOut {
    /// Intended send time, seconds from the start of the run.
    pub at_s: f64,
    /// The start of the request's text.
    pub sent: String,
    /// HTTP status, 0 when no response had started.
    pub status: u16,
    pub tier: Option<&'static str>,
    /// Content events received and the time of the first, seconds after sending.
    pub events: u32,
    pub first_token_s: Option<f64>,
    /// The start of the content received.
    pub received: String,
}

/// Requests given up on: the first few named, all counted.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct GaveUp {
    pub count: u64,
    /// … of which the server had started its response.
    pub responded: u64,
    pub named: Vec<TimedOut>,
}

/// The first `n` characters of `s`, with `…` when cut.
fn excerpt(s: &str, n: usize) -> String {
    let mut out: String = s.chars().take(n).collect();
    if s.chars().nth(n).is_some() {
        out.push('…');
    }
    out
}

/// The user text of a request body in any dialect.
fn sent_text(body: &[u8]) -> String {
    let v: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
    let text = v["messages"][0]["content"]
        .as_str()
        .or_else(|| v["input"].as_str())
        .unwrap_or_default();
    excerpt(text, 60)
}

impl Shared {
    fn note_timeout(&self, r: &ChatResult, p: &Prepared, intended: Instant, sent: Instant) {
        let Ok(mut g) = self.gave_up.lock() else {
            return;
        };
        g.count += 1;
        g.responded += u64::from(r.status != 0);
        if g.named.len() >= TIMED_OUT_NAMED {
            return;
        }
        g.named.push(TimedOut {
            at_s: intended.saturating_duration_since(self.start).as_secs_f64(),
            sent: sent_text(&p.body),
            status: r.status,
            tier: r.tier,
            events: r.events,
            first_token_s: r
                .first_token
                .map(|t| t.saturating_duration_since(sent).as_secs_f64()),
            received: excerpt(&r.content, 60),
        });
    }
}

/// Run one load pass.
pub async fn execute(client: &HttpClient, plan: &Plan, stop: watch::Receiver<bool>) -> RunData {
    let cpu0 = cpu_seconds();
    let start = Instant::now();
    let shared = Arc::new(Shared {
        client: client.clone(),
        operator: plan.operator.clone(),
        api: plan.api,
        stream: plan.stream,
        extra: plan.extra_headers.clone(),
        start,
        timeout: plan.timeout,
        gave_up: Mutex::new(GaveUp::default()),
    });
    let (tx, mut rx) = mpsc::unbounded_channel::<Outcome>();
    let sent = Arc::new(AtomicU64::new(0));

    // The server's view, once a second.
    let scrape = Arc::new(Mutex::new(Scrape::default()));
    let (scrape_stop, scrape_stop_rx) = watch::channel(false);
    let quality_of = plan.operator.active().then(|| plan.route.clone());
    let scraper = tokio::spawn(scrape_loop(
        plan.admin.clone(),
        plan.admin_token.clone(),
        start,
        scrape_stop_rx,
        scrape.clone(),
        quality_of,
    ));
    let labeller = plan.operator.label_audits.then(|| {
        let (op, admin, token, route) = (
            plan.operator.clone(),
            plan.admin.clone(),
            plan.admin_token.clone(),
            plan.route.clone(),
        );
        let (tx, stop) = watch::channel(false);
        let task = tokio::spawn(async move {
            op.label_loop(admin, token, route, Duration::from_secs(2), stop)
                .await
        });
        (tx, task)
    });

    let driver = {
        let plan = plan.clone();
        let shared = shared.clone();
        let sent = sent.clone();
        let stop = stop.clone();
        match plan.load.clone() {
            Load::Open {
                schedule,
                poisson,
                max_in_flight,
            } => {
                let rt = tokio::runtime::Handle::current();
                tokio::task::spawn_blocking(move || {
                    open_loop(
                        rt,
                        plan,
                        shared,
                        schedule,
                        poisson,
                        max_in_flight,
                        tx,
                        sent,
                        stop,
                    )
                })
            }
            Load::Closed { clients } => {
                tokio::spawn(closed_loop(plan, shared, clients, tx, sent, stop))
            }
        }
    };

    let mut outcomes: Vec<Outcome> = Vec::new();
    let tty = std::io::stderr().is_terminal();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last = 0usize;
    loop {
        tokio::select! {
            o = rx.recv() => match o {
                Some(o) => outcomes.push(o),
                None => break,
            },
            _ = tick.tick(), if plan.progress => {
                let secs = start.elapsed().as_secs();
                if tty || secs.is_multiple_of(5) {
                    let theta = scrape
                        .lock()
                        .ok()
                        .and_then(|s| s.samples.last().and_then(|x| x.theta_eff));
                    progress_line(&plan.name, start, &sent, &outcomes[last..], outcomes.len(), theta, tty);
                }
                last = outcomes.len();
            }
        }
    }
    if plan.progress && tty {
        eprintln!();
    }
    let _ = driver.await;
    let elapsed_s = start.elapsed().as_secs_f64();
    // The audits' last labels first, then the scraper's last look.
    if let Some((tx, task)) = labeller {
        let _ = tx.send(true);
        let _ = task.await;
    }
    let _ = scrape_stop.send(true);
    let _ = scraper.await;
    let scrape = scrape.lock().map(|s| s.clone()).unwrap_or_default();
    RunData {
        outcomes,
        gave_up: shared.gave_up.lock().map(|g| g.clone()).unwrap_or_default(),
        timeout_s: plan.timeout.as_secs_f64(),
        elapsed_s,
        scrape,
        client_cpu_s: cpu_seconds() - cpu0,
        interrupted: *stop.borrow(),
        operator: plan.operator.active().then(|| plan.operator.done()),
    }
}

fn progress_line(
    name: &str,
    start: Instant,
    sent: &AtomicU64,
    recent: &[Outcome],
    done: usize,
    theta: Option<f64>,
    tty: bool,
) {
    let mut lat: Vec<u64> = recent.iter().map(|o| o.latency_us).collect();
    lat.sort_unstable();
    let p99 = tiergate_core::stats::quantile_sorted(&lat, 0.99)
        .map_or("-".to_string(), |v| format!("{:.1}", v as f64 / 1e3));
    let errs = recent.iter().filter(|o| o.error.is_some()).count();
    let served = recent.len() - errs;
    let esc = recent
        .iter()
        .filter(|o| {
            matches!(
                Channel::of(o),
                Channel::Served(Served::Escalated) | Channel::Served(Served::Degraded)
            )
        })
        .count();
    let share = if served > 0 {
        format!("{:.0}%", 100.0 * esc as f64 / served as f64)
    } else {
        "-".into()
    };
    let line = format!(
        "{name} {:>4}s sent {} done {done} | last 1s: {} answers, {errs} errors, p99 {p99} ms, escalated {share}{}",
        start.elapsed().as_secs(),
        sent.load(Ordering::Relaxed),
        recent.len(),
        theta.map_or(String::new(), |t| format!(", θ_eff {t:.3}")),
    );
    let mut err = std::io::stderr().lock();
    if tty {
        let _ = write!(err, "\r\x1b[2K{line}");
    } else {
        let _ = writeln!(err, "{line}");
    }
    let _ = err.flush();
}

/// The open-loop dispatcher. It runs on its own OS thread: `std::thread::sleep` wakes within tens of
/// microseconds of the intended time, where tokio's millisecond timer wheel would add up to a millisecond
/// of send lag (and spinning to avoid that would take a core from the server under test).
#[allow(clippy::too_many_arguments)]
fn open_loop(
    rt: tokio::runtime::Handle,
    plan: Plan,
    shared: Arc<Shared>,
    schedule: Schedule,
    poisson: bool,
    max_in_flight: usize,
    tx: mpsc::UnboundedSender<Outcome>,
    sent: Arc<AtomicU64>,
    stop: watch::Receiver<bool>,
) {
    let sem = Arc::new(Semaphore::new(max_in_flight));
    let mut sampler = Sampler::new(plan.items.len(), plan.seed, plan.zipf);
    let start = shared.start;
    'arrivals: for (n, offset) in schedule.arrivals(poisson, plan.seed).enumerate() {
        if plan.requests.is_some_and(|r| n as u64 >= r) || *stop.borrow() {
            break;
        }
        let intended = start + offset;
        loop {
            let now = Instant::now();
            if now >= intended {
                break;
            }
            std::thread::sleep((intended - now).min(Duration::from_millis(50)));
            if *stop.borrow() {
                break 'arrivals;
            }
        }
        let p = plan.prepare(sampler.next_index());
        sent.fetch_add(1, Ordering::Relaxed);
        let permit = match sem.clone().try_acquire_owned() {
            Ok(p) => Some(p),
            Err(_) => rt
                .block_on(tokio::time::timeout_at(
                    (intended + shared.timeout).into(),
                    sem.clone().acquire_owned(),
                ))
                .ok()
                .and_then(Result::ok),
        };
        let Some(permit) = permit else {
            let now = Instant::now();
            let _ = tx.send(finish(
                &shared,
                ChatResult::failed("client_backlog"),
                intended,
                now,
                &p,
            ));
            continue;
        };
        let tx = tx.clone();
        let shared = shared.clone();
        rt.spawn(async move {
            let o = one(&shared, p, intended).await;
            drop(permit);
            let _ = tx.send(o);
        });
    }
}

async fn closed_loop(
    plan: Plan,
    shared: Arc<Shared>,
    clients: usize,
    tx: mpsc::UnboundedSender<Outcome>,
    sent: Arc<AtomicU64>,
    stop: watch::Receiver<bool>,
) {
    let sampler = Arc::new(Mutex::new(Sampler::new(
        plan.items.len(),
        plan.seed,
        plan.zipf,
    )));
    let end = plan.window.map(|w| shared.start + w);
    let plan = Arc::new(plan);
    let mut tasks = Vec::with_capacity(clients);
    for _ in 0..clients {
        let (plan, shared, tx, sent, stop, sampler) = (
            plan.clone(),
            shared.clone(),
            tx.clone(),
            sent.clone(),
            stop.clone(),
            sampler.clone(),
        );
        tasks.push(tokio::spawn(async move {
            loop {
                if *stop.borrow() || end.is_some_and(|e| Instant::now() >= e) {
                    break;
                }
                let n = sent.fetch_add(1, Ordering::Relaxed);
                if plan.requests.is_some_and(|r| n >= r) {
                    sent.fetch_sub(1, Ordering::Relaxed);
                    break;
                }
                let Ok(idx) = sampler.lock().map(|mut s| s.next_index()) else {
                    break;
                };
                let p = plan.prepare(idx);
                let o = one(&shared, p, Instant::now()).await;
                if tx.send(o).is_err() {
                    break;
                }
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
}
