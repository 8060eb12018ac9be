//! The escalation channel across real processes: the server-side client and supervisor in this test process,
//! `tiergate-reranker` workers (stub engine) as children. Covers round trips, streaming, `Full`, deadlines,
//! `kill -9` mid-flight with retry and restart, hangs, garbage replies, and stale segments.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test code: failing loudly is the point

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tiergate_queue::{
    Candidate, Client, Event, Geometry, Job, Message, QueueError, Reply, Sampling, Segment,
    Supervisor, SupervisorConfig,
};
use tiergate_tests::binary;

static COUNTER: AtomicUsize = AtomicUsize::new(0);

fn name() -> String {
    format!(
        "tiergate-test-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::SeqCst)
    )
}

fn geo(slots: usize) -> Geometry {
    Geometry {
        slots,
        req_cap: 8192,
        resp_cap: 16384,
    }
}

struct Rig {
    client: Client,
    sup: Supervisor,
    seg: Arc<Segment>,
}

fn rig(slots: usize, workers: usize, stub_args: &[&str]) -> Rig {
    let r = rig_with(slots, workers, stub_args, |_| {});
    wait_live(&r.client, workers, "workers did not become ready");
    r
}

/// Waits up to 10 s for `n` live workers, failing with `why`.
fn wait_live(client: &Client, n: usize, why: &str) {
    let start = Instant::now();
    while client.live_workers() < n {
        assert!(start.elapsed() < Duration::from_secs(10), "{why}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A rig whose supervisor settings `tweak` may change; does not wait for the workers.
fn rig_with(
    slots: usize,
    workers: usize,
    stub_args: &[&str],
    tweak: impl FnOnce(&mut SupervisorConfig),
) -> Rig {
    let n = name();
    let seg = Arc::new(Segment::create(&n, geo(slots)).unwrap());
    // `--max-concurrent N` among the stub's flags sets the spec's field (the worker takes it there).
    let mut spec = tiergate_config::WorkerSpec {
        heartbeat_ms: 20,
        ..tiergate_config::WorkerSpec::stub()
    };
    let mut flags = Vec::new();
    let mut it = stub_args.iter();
    while let Some(a) = it.next() {
        match *a {
            "--max-concurrent" => spec.max_concurrent = it.next().unwrap().parse().unwrap(),
            other => flags.push(other.to_string()),
        }
    }
    let mut args = vec!["--spec".to_string(), spec.to_arg()];
    args.extend(flags);
    let mut cfg = SupervisorConfig {
        workers,
        program: binary("tiergate-reranker"),
        args,
        segment: n,
        heartbeat_timeout: Duration::from_millis(400),
        load_timeout: Duration::from_secs(10),
        backoff_initial: Duration::from_millis(50),
        backoff_max: Duration::from_millis(500),
        retry: true,
    };
    tweak(&mut cfg);
    let sup = Supervisor::start(seg.clone(), cfg).unwrap();
    let client = Client::new(seg.clone(), Duration::from_millis(400)).unwrap();
    Rig { client, sup, seg }
}

fn rerank_job(text: &str) -> Job {
    Job::Rerank {
        text: text.into(),
        candidates: vec![
            Candidate {
                label: "card_arrival".into(),
                reply: None,
                description: None,
                examples: vec![],
                p: 0.4,
            },
            Candidate {
                label: "exchange_rate".into(),
                reply: None,
                description: None,
                examples: vec![],
                p: 0.6,
            },
        ],
        prompt: Default::default(),
    }
}

/// The route's templates travel in the job and are what the engine renders: the stub counts the words of
/// the channel prompts it renders, so a longer template shows up in the reply's prompt_tokens, and the
/// candidates' examples are part of them.
#[test]
fn prompt_templates_and_examples_reach_the_engine() {
    let r = rig(8, 1, &[]);
    let run = |job: &Job| {
        let h = r.client.submit(job, Duration::from_secs(5)).unwrap();
        let Reply::Rerank(rr) = h.wait_reply().unwrap() else {
            panic!("not a rerank reply")
        };
        rr.prompt_tokens
    };
    let mut job = rerank_job("my card has not arrived");
    let Job::Rerank { prompt, .. } = &mut job else {
        unreachable!()
    };
    prompt.label_prefix = "Topic {label}:\n{examples}-".into();
    prompt.query = " {query}\n".into();
    // "Topic card arrival:" + "-" (4 words) + query (5 words); the other candidate likewise (4 + 5).
    assert_eq!(run(&job), 18);
    let Job::Rerank {
        prompt, candidates, ..
    } = &mut job
    else {
        unreachable!()
    };
    prompt.label_prefix = "Five extra words right here {label}:\n{examples}-".into();
    candidates[0].examples = vec!["where is it".into()];
    // "Five extra words right here card arrival: - where is it -" (12) + 5; "Five … here exchange rate: -"
    // (8) + 5.
    assert_eq!(run(&job), 30);
}

#[test]
fn rerank_round_trip_and_streamed_generation() {
    let r = rig(8, 1, &[]);
    let h = r
        .client
        .submit(
            &rerank_job("my card has not arrived"),
            Duration::from_secs(5),
        )
        .unwrap();
    let Reply::Rerank(rr) = h.wait_reply().unwrap() else {
        panic!("not a rerank reply")
    };
    assert!(
        rr.scores.len() == 2 && rr.scores[0] > rr.scores[1],
        "stub prefers the label sharing words: {rr:?}"
    );

    let job = Job::Generate {
        messages: vec![Message {
            role: "user".into(),
            content: "tell me about fees".into(),
            ..Default::default()
        }],
        sampling: Sampling {
            max_tokens: 16,
            ..Default::default()
        },
        tools: None,
    };
    let h = r.client.submit(&job, Duration::from_secs(5)).unwrap();
    let mut text = String::new();
    let mut chunks = 0;
    let usage = loop {
        match h.events.recv_timeout(Duration::from_secs(5)).unwrap() {
            Event::Chunk(c) => {
                chunks += 1;
                text.push_str(&c);
            }
            Event::Reply(Reply::Generated(u)) => break u,
            other => panic!("unexpected {other:?}"),
        }
    };
    assert_eq!(text, "stub: tell me about fees");
    assert_eq!(chunks, 5);
    assert_eq!(usage.completion_tokens, 5);
    assert_eq!(r.client.in_flight(), 0);
}

/// Generations may fill all of a worker's job threads but one: with two threads and three long generations
/// queued first, a rerank still runs beside the first generation and finishes before the second one does
/// (before the limit, both threads went to generations and the rerank waited behind them).
#[test]
fn generations_never_take_the_last_job_thread_from_reranks() {
    let r = rig(8, 1, &["--stub-delay-ms", "600", "--max-concurrent", "2"]);
    let gen = Job::Generate {
        messages: vec![Message {
            role: "user".into(),
            content: "a b c".into(),
            ..Default::default()
        }],
        sampling: Sampling {
            max_tokens: 3,
            ..Default::default()
        },
        tools: None,
    };
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for g in 0..3 {
        let h = r.client.submit(&gen, Duration::from_secs(20)).unwrap();
        let order = order.clone();
        waiters.push(std::thread::spawn(move || {
            assert!(h.wait_reply().is_ok());
            order.lock().unwrap().push(format!("generate {g}"));
        }));
        std::thread::sleep(Duration::from_millis(30));
    }
    let reply = r.client.call(&rerank_job("card"), Duration::from_secs(20));
    assert!(reply.is_ok(), "{reply:?}");
    order.lock().unwrap().push("rerank".into());
    for w in waiters {
        w.join().unwrap();
    }
    let order = order.lock().unwrap().clone();
    let rerank_at = order.iter().position(|e| e == "rerank").unwrap();
    assert!(
        rerank_at <= 1,
        "the rerank waited behind the generations: {order:?}"
    );
}

/// A generation that fills the slot's response area ends with `finish_reason: "length"`, not `"stop"`.
#[test]
fn a_generation_cut_by_the_response_area_ends_with_length() {
    let r = rig(2, 1, &[]);
    let job = Job::Generate {
        messages: vec![Message {
            role: "user".into(),
            content: "ab ".repeat(2600),
            ..Default::default()
        }],
        sampling: Sampling {
            max_tokens: 100_000,
            ..Default::default()
        },
        tools: None,
    };
    let h = r.client.submit(&job, Duration::from_secs(10)).unwrap();
    let mut text = String::new();
    let usage = loop {
        match h.events.recv_timeout(Duration::from_secs(10)).unwrap() {
            Event::Chunk(c) => text.push_str(&c),
            Event::Reply(Reply::Generated(u)) => break u,
            other => panic!("unexpected {other:?}"),
        }
    };
    assert_eq!(usage.finish_reason, "length", "{usage:?}");
    // Each token is a 5-byte frame header plus " ab": the 12 KB left for chunks hold ~1,500 of 2,600.
    assert!(
        text.len() < 7_800 && text.len() > 3_000,
        "{} bytes",
        text.len()
    );
}

#[test]
fn a_flooded_queue_answers_full_at_once() {
    let r = rig(4, 1, &["--stub-delay-ms", "2000", "--max-concurrent", "1"]);
    let mut handles = Vec::new();
    for _ in 0..4 {
        handles.push(
            r.client
                .submit(&rerank_job("x"), Duration::from_secs(10))
                .unwrap(),
        );
    }
    let t = Instant::now();
    let err = r
        .client
        .submit(&rerank_job("x"), Duration::from_secs(10))
        .err()
        .unwrap();
    let took = t.elapsed();
    assert_eq!(err, QueueError::Full { slots: 4 });
    // Microseconds in practice (see the queue bench); the bound only catches a submit that blocks until a
    // slot frees (2 s here), with room for a loaded CI machine.
    assert!(took < Duration::from_secs(1), "Full took {took:?}");
    drop(handles);
}

#[test]
fn deadlines_are_enforced_and_the_slot_comes_back() {
    let r = rig(2, 1, &["--stub-delay-ms", "2000", "--max-concurrent", "1"]);
    let t = Instant::now();
    let h = r
        .client
        .submit(&rerank_job("slow"), Duration::from_millis(100))
        .unwrap();
    assert_eq!(h.wait_reply().unwrap_err(), QueueError::DeadlineExceeded);
    assert!(
        // Well before the 2 s job would end; loose enough for a loaded CI machine.
        t.elapsed() < Duration::from_millis(1500),
        "deadline reported after {:?}",
        t.elapsed()
    );
    // The worker lets go of the cancelled job; both slots serve again.
    let start = Instant::now();
    loop {
        match r
            .client
            .submit(&rerank_job("again"), Duration::from_secs(5))
        {
            Ok(h) => {
                assert!(h.wait_reply().is_ok());
                break;
            }
            Err(QueueError::Full { .. }) if start.elapsed() < Duration::from_secs(3) => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(e) => panic!("{e}"),
        }
    }
}

/// A job whose deadline passes while it waits behind a busy worker is never computed: the client takes it
/// back from the queue at its deadline (and counts it), and a worker never starts a job already past its
/// deadline.
#[test]
fn a_job_past_its_deadline_before_it_starts_is_never_computed() {
    let r = rig(4, 1, &["--stub-delay-ms", "600", "--max-concurrent", "1"]);
    let busy = r
        .client
        .submit(&rerank_job("busy"), Duration::from_secs(5))
        .unwrap();
    std::thread::sleep(Duration::from_millis(50));
    // Queued behind the busy one, with 100 ms to live: it expires before the worker is free.
    let late = r
        .client
        .submit(&rerank_job("late"), Duration::from_millis(100))
        .unwrap();
    assert_eq!(late.wait_reply().unwrap_err(), QueueError::DeadlineExceeded);
    assert!(busy.wait_reply().is_ok());
    assert_eq!(r.client.expired_unstarted(), 1, "taken back unstarted");
    // The worker is free again and the slot came back.
    let again = r
        .client
        .submit(&rerank_job("again"), Duration::from_secs(5))
        .unwrap();
    assert!(again.wait_reply().is_ok());
    all_slots_come_back(&r.seg);
}

/// Every slot is FREE again (nothing leaked) within a few seconds.
fn all_slots_come_back(seg: &Segment) {
    let start = Instant::now();
    loop {
        let busy: Vec<usize> = (0..seg.slots())
            .filter(|&i| {
                let word = seg.slot(i).unwrap().word.load(Ordering::SeqCst);
                word as u32 != tiergate_queue::layout::state::FREE
            })
            .collect();
        if busy.is_empty() {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "slots never freed: {busy:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A blocking `call` watches its own slot: replies, deadlines (the slot a worker still holds is freed later
/// by the dispatcher), and the error kinds arrive as with `submit`.
#[test]
fn a_blocking_call_gets_replies_deadlines_and_errors_on_its_own_slot() {
    let r = rig(2, 1, &["--stub-delay-ms", "2000", "--max-concurrent", "1"]);
    let t = Instant::now();
    let late = r
        .client
        .call(&rerank_job("slow"), Duration::from_millis(100));
    assert_eq!(late.unwrap_err(), QueueError::DeadlineExceeded);
    assert!(
        // Well before the 2 s job would end; loose enough for a loaded CI machine.
        t.elapsed() < Duration::from_millis(1500),
        "deadline reported after {:?}",
        t.elapsed()
    );
    // The caller handed the slot (still held by the worker) to the dispatcher, which frees it when the worker
    // lets go: both slots serve again and nothing leaks.
    all_slots_come_back(&r.seg);
    let Reply::Rerank(rr) = r
        .client
        .call(&rerank_job("card arrival"), Duration::from_secs(5))
        .unwrap()
    else {
        panic!("not a rerank reply")
    };
    assert_eq!(rr.scores.len(), 2);
    assert!(
        rr.scores[0] > rr.scores[1],
        "the stub favours the label sharing words"
    );
    all_slots_come_back(&r.seg);

    let g = rig(4, 1, &["--stub-garbage-every", "2"]);
    assert!(g
        .client
        .call(&rerank_job("one"), Duration::from_secs(5))
        .is_ok());
    let garbage = g.client.call(&rerank_job("two"), Duration::from_secs(5));
    assert!(
        matches!(garbage, Err(QueueError::Protocol(_))),
        "{garbage:?}"
    );
    assert!(g
        .client
        .call(&rerank_job("three"), Duration::from_secs(5))
        .is_ok());
    let bad = g.client.call_bytes(b"{not a job", Duration::from_secs(5));
    assert!(matches!(bad, Err(QueueError::Engine(_))), "{bad:?}");
    all_slots_come_back(&g.seg);

    let c = rig(4, 1, &["--stub-crash-after", "1"]);
    let down = c.client.call(&rerank_job("boom"), Duration::from_secs(8));
    assert!(matches!(down, Err(QueueError::WorkerDown(_))), "{down:?}");
    all_slots_come_back(&c.seg);

    let h = rig(4, 1, &["--stub-hang-after", "2"]);
    assert!(h
        .client
        .call(&rerank_job("fine"), Duration::from_secs(5))
        .is_ok());
    let t = Instant::now();
    let retried = h.client.call(&rerank_job("freeze"), Duration::from_secs(8));
    assert!(
        retried.is_ok(),
        "retried on the restarted worker: {retried:?}"
    );
    assert!(t.elapsed() < Duration::from_secs(6));
    assert!(h.sup.stats.retried.load(Ordering::SeqCst) >= 1);
}

#[test]
fn kill_9_mid_flight_every_job_ends_exactly_once_and_the_worker_restarts() {
    let r = rig(64, 2, &["--stub-delay-ms", "150", "--max-concurrent", "4"]);
    let client = Arc::new(r.client);
    let outcomes = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut producers = Vec::new();
    // Producers 0 and 1 wait on the dispatcher's events, 2 and 3 block in `call` on their own slots.
    for p in 0..4 {
        let (client, outcomes) = (client.clone(), outcomes.clone());
        producers.push(std::thread::spawn(move || {
            for k in 0..10 {
                if p >= 2 {
                    let t = Instant::now();
                    let outcome = loop {
                        match client
                            .call(&rerank_job(&format!("job {p} {k}")), Duration::from_secs(3))
                        {
                            Err(QueueError::Full { .. })
                                if t.elapsed() < Duration::from_secs(1) =>
                            {
                                std::thread::sleep(Duration::from_millis(5))
                            }
                            other => break other,
                        }
                    };
                    assert!(
                        t.elapsed() < Duration::from_secs(9),
                        "a call hung past its deadline"
                    );
                    // A call returns exactly one outcome by construction; map it to the same event shape.
                    let event = match outcome {
                        Ok(r) => Event::Reply(r),
                        Err(e) => Event::Error(e),
                    };
                    outcomes.lock().unwrap().push(vec![event]);
                    continue;
                }
                let h = loop {
                    match client
                        .submit(&rerank_job(&format!("job {p} {k}")), Duration::from_secs(3))
                    {
                        Ok(h) => break h,
                        Err(QueueError::Full { .. }) | Err(QueueError::WorkerDown(_)) => {
                            std::thread::sleep(Duration::from_millis(5))
                        }
                        Err(e) => panic!("submit: {e}"),
                    }
                };
                let t = Instant::now();
                let mut events = Vec::new();
                while let Ok(e) = h.events.recv_timeout(Duration::from_secs(5)) {
                    events.push(e);
                }
                assert!(
                    t.elapsed() < Duration::from_secs(9),
                    "a job hung past its deadline"
                );
                outcomes.lock().unwrap().push(events);
            }
        }));
    }
    std::thread::sleep(Duration::from_millis(200));
    let victim = r.seg.header().workers[0].pid.load(Ordering::SeqCst);
    assert!(victim > 0);
    unsafe { libc::kill(victim as i32, libc::SIGKILL) };
    for p in producers {
        p.join().unwrap();
    }
    let outcomes = outcomes.lock().unwrap();
    assert_eq!(outcomes.len(), 40);
    let mut down = 0;
    for events in outcomes.iter() {
        // Exactly one terminal event per job, and nothing after it.
        assert_eq!(events.len(), 1, "{events:?}");
        match &events[0] {
            Event::Reply(_) => {}
            Event::Error(QueueError::WorkerDown(_)) => down += 1,
            other => panic!("unexpected outcome {other:?}"),
        }
    }
    assert!(
        down <= 4,
        "retry should save most of the victim's jobs ({down} failed)"
    );
    // No slot leaked, whichever way its job was waited for.
    all_slots_come_back(&r.seg);
    assert!(r.sup.stats.restarts.load(Ordering::SeqCst) >= 1);
    // The restarted worker registers again and serves.
    let start = Instant::now();
    loop {
        let pid = r.seg.header().workers[0].pid.load(Ordering::SeqCst);
        if pid != 0 && pid != victim && client.live_workers() == 2 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "worker 0 did not come back"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let h = client
        .submit(&rerank_job("after restart"), Duration::from_secs(5))
        .unwrap();
    assert!(h.wait_reply().is_ok());
}

#[test]
fn a_hung_worker_is_killed_and_its_job_retried() {
    // Job 2 of each worker process freezes the whole process (heartbeat included): the supervisor must notice,
    // kill, reap, and retry the job on the restarted worker (where it is job 1).
    let r = rig(4, 1, &["--stub-hang-after", "2"]);
    assert!(r
        .client
        .submit(&rerank_job("fine"), Duration::from_secs(5))
        .unwrap()
        .wait_reply()
        .is_ok());
    let t = Instant::now();
    let h = r
        .client
        .submit(&rerank_job("freeze"), Duration::from_secs(8))
        .unwrap();
    let reply = h.wait_reply();
    assert!(reply.is_ok(), "retried on the restarted worker: {reply:?}");
    assert!(t.elapsed() < Duration::from_secs(6));
    assert!(r.sup.stats.retried.load(Ordering::SeqCst) >= 1);
}

/// An engine call that never returns (the worker's heartbeat still beating): the caller gets its deadline, and
/// once the deadline is a grace period behind, the supervisor kills the worker holding the job, frees the slot
/// and restarts the worker.
#[test]
fn a_job_stuck_in_the_engine_gets_its_worker_killed_and_restarted() {
    let r = rig(4, 1, &["--stub-stuck-after", "1"]);
    let late = r
        .client
        .call(&rerank_job("stuck"), Duration::from_millis(300));
    assert_eq!(late.unwrap_err(), QueueError::DeadlineExceeded);
    let t = Instant::now();
    while r.sup.stats.restarts.load(Ordering::SeqCst) == 0 {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the stuck worker was never killed"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    all_slots_come_back(&r.seg);
    // The restarted worker registers and is live again (its own first job would get stuck too: the knob
    // counts per process).
    wait_live(&r.client, 1, "the worker did not come back");
}

/// A worker past a job's deadline that is still making progress (its engine's count of finished work
/// advancing: a cold judge building label prefixes) is not killed: the caller gets its deadline, the job runs
/// to its end, the slot comes back and the same process (with what it built) takes the next job. Without
/// progress the same lateness gets the worker killed
/// (`a_job_stuck_in_the_engine_gets_its_worker_killed_and_restarted`).
#[test]
fn a_late_worker_that_makes_progress_is_not_killed() {
    let r = rig(4, 1, &["--stub-delay-ms", "1500", "--stub-progress"]);
    let pid = r.seg.header().workers[0].pid.load(Ordering::SeqCst);
    let late = r
        .client
        .call(&rerank_job("slow"), Duration::from_millis(300));
    assert_eq!(late.unwrap_err(), QueueError::DeadlineExceeded);
    // 1.2 s past the deadline, three times the 400 ms grace after which a silent worker is killed.
    std::thread::sleep(Duration::from_millis(1500));
    all_slots_come_back(&r.seg);
    assert_eq!(
        r.sup.stats.restarts.load(Ordering::SeqCst),
        0,
        "killed while working"
    );
    assert_eq!(r.seg.header().workers[0].pid.load(Ordering::SeqCst), pid);
    assert!(r.seg.header().workers[0].progress.load(Ordering::SeqCst) > 50);
    let on_time = r.client.call(&rerank_job("next"), Duration::from_secs(5));
    assert!(on_time.is_ok(), "{on_time:?}");
}

/// A worker that never becomes ready (a hung model load) is killed after the load timeout and restarted.
#[test]
fn a_worker_hung_while_loading_is_killed() {
    let r = rig_with(4, 1, &["--stub-load-ms", "60000"], |c| {
        c.load_timeout = Duration::from_millis(300)
    });
    let t = Instant::now();
    while r.sup.stats.restarts.load(Ordering::SeqCst) < 2 {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "the loading worker was never killed"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(r.client.live_workers(), 0);
}

#[test]
fn a_crash_with_no_retry_left_is_worker_down() {
    // Every fresh worker crashes on its first job: the job is retried once, then fails WorkerDown.
    let r = rig(4, 1, &["--stub-crash-after", "1"]);
    let h = r
        .client
        .submit(&rerank_job("boom"), Duration::from_secs(8))
        .unwrap();
    assert!(matches!(h.wait_reply(), Err(QueueError::WorkerDown(_))));
}

#[test]
fn garbage_fails_one_job_only() {
    let r = rig(4, 1, &["--stub-garbage-every", "2"]);
    let first = r
        .client
        .submit(&rerank_job("one"), Duration::from_secs(5))
        .unwrap()
        .wait_reply();
    let second = r
        .client
        .submit(&rerank_job("two"), Duration::from_secs(5))
        .unwrap()
        .wait_reply();
    let third = r
        .client
        .submit(&rerank_job("three"), Duration::from_secs(5))
        .unwrap()
        .wait_reply();
    assert!(first.is_ok());
    assert!(matches!(second, Err(QueueError::Protocol(_))), "{second:?}");
    assert!(third.is_ok());
    // Garbage request bytes fail their job only, too.
    let bad = r
        .client
        .submit_bytes(b"{not json", Duration::from_secs(5))
        .unwrap()
        .wait_reply();
    assert!(matches!(bad, Err(QueueError::Engine(_))), "{bad:?}");
    assert!(r
        .client
        .submit(&rerank_job("four"), Duration::from_secs(5))
        .unwrap()
        .wait_reply()
        .is_err());
    assert!(r
        .client
        .submit(&rerank_job("five"), Duration::from_secs(5))
        .unwrap()
        .wait_reply()
        .is_ok());
}

#[test]
fn no_live_worker_is_worker_down_at_once() {
    let seg = Arc::new(Segment::create(&name(), geo(4)).unwrap());
    let client = Client::new(seg, Duration::from_millis(200)).unwrap();
    let err = client
        .submit(&rerank_job("x"), Duration::from_secs(1))
        .err()
        .unwrap();
    assert!(matches!(err, QueueError::WorkerDown(_)));
}

#[test]
fn stale_segments_are_removed_and_live_ones_never_touched() {
    let n = name();
    let mut live_child = std::process::Command::new("sleep")
        .arg("30")
        .spawn()
        .unwrap();
    let seg = Segment::create(&n, geo(2)).unwrap();
    // Pretend the segment belongs to the live child.
    let creator = &seg.header().creator_pid as *const u32 as *mut u32;
    unsafe { creator.write_volatile(live_child.id()) };
    std::mem::forget(seg); // leave the name behind, as a killed process would
    let err = Segment::create(&n, geo(2)).err().unwrap();
    assert!(err.to_string().contains("running instance"), "{err}");
    live_child.kill().unwrap();
    live_child.wait().unwrap();
    // Now its creator is dead: the next start removes it and creates a fresh one.
    let mut fresh = Segment::create(&n, geo(2)).unwrap();
    assert_eq!(fresh.header().creator_pid, std::process::id());
    fresh.set_owner(true);
    drop(fresh);
    // A segment of a dead creator under a name nobody will reuse is found by the sweep at start-up.
    let other = name();
    let mut dead = std::process::Command::new("true").spawn().unwrap();
    dead.wait().unwrap();
    let seg = Segment::create(&other, geo(2)).unwrap();
    let creator = &seg.header().creator_pid as *const u32 as *mut u32;
    unsafe { creator.write_volatile(dead.id()) };
    std::mem::forget(seg);
    assert!(std::path::Path::new(&format!("/dev/shm/{other}")).exists());
    assert!(tiergate_queue::layout::sweep_stale(&other) >= 1);
    assert!(!std::path::Path::new(&format!("/dev/shm/{other}")).exists());
}

/// A worker program that is not there yet (`scripts/tiergate` serves while cargo still builds the worker) is
/// waited for, not given up on: once it appears the supervisor starts it and it serves.
#[test]
fn a_worker_program_that_appears_later_is_started() {
    let dir = tempfile::tempdir().unwrap();
    let later = dir.path().join("tiergate-reranker");
    let r = rig_with(8, 1, &[], |c| c.program = later.clone());
    std::thread::sleep(Duration::from_millis(700));
    assert_eq!(r.client.live_workers(), 0);
    std::os::unix::fs::symlink(binary("tiergate-reranker"), &later).unwrap();
    wait_live(
        &r.client,
        1,
        "the worker was not started once its program appeared",
    );
    let h = r
        .client
        .submit(
            &rerank_job("my card has not arrived"),
            Duration::from_secs(5),
        )
        .unwrap();
    assert!(matches!(h.wait_reply().unwrap(), Reply::Rerank(_)));
}
