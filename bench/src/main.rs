//! `tiergate-bench`: see `tiergate_bench` and `tiergate-bench --help`.

use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use serde_json::json;
use tiergate_bench::args::{Args, Command, SloCommand};
use tiergate_bench::http::HttpClient;
use tiergate_bench::output::Report;
use tiergate_bench::report::RunReport;
use tiergate_bench::run::{execute, Load, Plan};
use tiergate_bench::schedule::Schedule;
use tiergate_bench::{compare, html, scrape, slo, workload};
use tokio::sync::watch;

fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(Command::Slo(SloCommand::Derive(a))) = &args.command {
        return slo_derive(a);
    }
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("tiergate-bench: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    match rt.block_on(bench(args)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("tiergate-bench: {e}");
            ExitCode::from(1)
        }
    }
}

async fn bench(args: Args) -> Result<ExitCode, String> {
    args.check()?;
    // A multi-tenant run lists the routes with its first tenant's key.
    let api_key = args
        .api_key
        .clone()
        .or_else(|| args.tenants.first().and_then(|t| t.key.clone()));
    let client = HttpClient::new(&args.url, api_key.clone());
    let admin = HttpClient::new(args.admin_url.as_deref().unwrap_or(&args.url), None);
    let items = match &args.data {
        Some(p) => workload::load(p)?,
        None => workload::synthetic(1000, args.seed),
    };
    let prices = args
        .cost
        .as_deref()
        .map(tiergate_bench::cost::CostFile::load)
        .transpose()?;
    let slo_lines = match &args.slo {
        Some(p) => slo::load(p)?,
        None => slo::defaults(),
    };
    let routes = scrape::models(&client, api_key.as_deref()).await;
    let route = match (&args.route, &routes) {
        (Some(r), _) => r.clone(),
        (None, Ok(rs)) => scrape::default_route(rs)
            .ok_or("the server lists no routes in /v1/models; pass --route")?
            .id
            .clone(),
        (None, Err(e)) => {
            return Err(format!(
                "cannot list the server's routes ({e}); pass --route"
            ))
        }
    };
    let mut notes = Vec::new();
    if let Ok(rs) = &routes {
        if !rs.iter().any(|r| r.id == route) {
            notes.push(format!("route `{route}` is not listed in /v1/models"));
        }
    }
    let route_kinds = routes
        .map(|rs| rs.into_iter().map(|r| (r.id, r.kind)).collect())
        .unwrap_or_default();

    let (stop_tx, stop_rx) = watch::channel(false);
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            eprintln!("\ninterrupted: no new requests; waiting for those in flight");
            let _ = stop_tx.send(true);
        }
    });

    let window = args.window();
    // Each tenant of a multi-tenant run replaces the rate with its own.
    let rate = args.rate.or(args.tenants.first().map(|t| t.rate));
    let load = match (rate, args.concurrency) {
        (Some(rate), _) => Load::Open {
            schedule: Schedule {
                base: rate,
                spec: args.schedule.clone(),
                window,
            },
            poisson: args.poisson,
            max_in_flight: args.max_in_flight,
        },
        (None, Some(clients)) => Load::Closed { clients },
        (None, None) => return Err("give --rate or --concurrency".into()),
    };
    let settings = json!({
        "url": args.url,
        "route": route,
        "data": args.data.as_ref().map(|p| p.display().to_string()),
        "workload_items": items.len(),
        "rate": args.rate,
        "poisson": args.poisson,
        "concurrency": args.concurrency,
        "schedule": args.schedule,
        "window_s": window.map(|w| w.as_secs_f64()),
        "requests": args.requests,
        "stream": args.stream,
        "api": args.api.as_str(),
        "seed": args.seed,
        "timeout_s": args.timeout.as_secs_f64(),
        "headers": args.headers.iter().map(|(k, v)| format!("{k}: {v}")).collect::<Vec<_>>(),
        "patience": args.patience,
        "deadline_ms": args.deadline,
        "feedback": args.feedback,
        "label_audits": args.label_audits,
        "drift_at": args.drift_at,
        "zipf": args.zipf,
    });
    let plan = Plan {
        items: Arc::new(items),
        route: route.clone(),
        route_kinds,
        api: args.api,
        stream: args.stream,
        max_tokens: args.max_tokens,
        timeout: args.timeout,
        load,
        window,
        requests: args.requests,
        seed: args.seed,
        zipf: args.zipf,
        extra_headers: args.headers.clone(),
        admin_token: args.admin_token.clone(),
        admin: admin.clone(),
        progress: !args.quiet,
        name: "run".into(),
        deadline: args.deadline,
        prepared: Arc::default(),
        operator: Arc::new(tiergate_bench::operator::Operator::new(
            args.feedback,
            args.label_audits,
            args.drift_at,
        )),
    };
    let token = args.admin_token.as_deref();

    let mut runs = if !args.tenants.is_empty() {
        tiergate_bench::tenants::run(
            &args.url,
            &args.tenants,
            &plan,
            &settings,
            &slo_lines,
            args.patience.as_ref(),
            stop_rx.clone(),
        )
        .await?
    } else if args.compare {
        let view = scrape::routing(&admin, token)
            .await
            .map_err(|e| format!("--compare sets the policy through /admin/routing: {e}"))?;
        let saved = compare::saved_policy(&view)?;
        let mut runs = Vec::new();
        let mut failure = None;
        for v in compare::variants(&saved) {
            if *stop_rx.borrow() {
                break;
            }
            let waited = compare::drain(&admin, token, args.drain_timeout).await;
            if let Err(e) = compare::patch(&admin, token, &v.patch).await {
                failure = Some(e);
                break;
            }
            if !args.quiet {
                eprintln!(
                    "variant {} (policy {}; waited {:.1} s for the LLM queue to drain)",
                    v.name,
                    v.patch,
                    waited.as_secs_f64()
                );
            }
            let p = Plan {
                name: v.name.to_string(),
                ..plan.clone()
            };
            let data = execute(&client, &p, stop_rx.clone()).await;
            let mut s = settings.clone();
            s["policy"] = v.patch.clone();
            runs.push(RunReport::build(
                v.name,
                s,
                &data,
                &slo_lines,
                args.patience.as_ref(),
            ));
        }
        // Put the server's own policy back whatever happened.
        if let Err(e) = compare::patch(&admin, token, &saved).await {
            eprintln!("tiergate-bench: WARNING: could not restore the routing policy ({e}); it was: {saved}");
            notes.push(format!("policy not restored: {e}"));
        }
        if let Some(e) = failure {
            return Err(e);
        }
        runs
    } else {
        let data = execute(&client, &plan, stop_rx.clone()).await;
        vec![RunReport::build(
            "run",
            settings,
            &data,
            &slo_lines,
            args.patience.as_ref(),
        )]
    };
    if let Some(f) = &prices {
        for r in &mut runs {
            r.cost = Some(tiergate_bench::cost::of(f, &r.channels));
        }
    }
    // The comparison reads the runs' costs: made once they are in.
    let rows = args.compare.then(|| compare::rows(&runs));
    let mut text: String = runs.iter().map(RunReport::render).collect();
    if let Some(rows) = &rows {
        text.push_str(&compare::render(rows));
    }
    for n in &notes {
        text.push_str(&format!("note: {n}\n"));
    }
    print!("{text}");

    // Reached: every request but those that never got a response (a timeout after the response started
    // reached the server).
    let answered = runs
        .iter()
        .map(|r| {
            let all = r.channels.iter().find(|c| c.channel == "all");
            all.map_or(0, |c| {
                c.count
                    - c.errors
                        .iter()
                        .filter(|(k, _)| is_transport(k))
                        .map(|(_, v)| v)
                        .sum::<u64>()
            }) + r.gave_up.responded
        })
        .sum::<u64>();
    let verdict_run = if args.compare {
        runs.iter().find(|r| r.name == "hybrid-load")
    } else {
        runs.first()
    };
    let slo_ok = verdict_run.is_none_or(RunReport::slo_passed);
    let report = Report {
        tool: "tiergate-bench",
        version: env!("CARGO_PKG_VERSION"),
        url: args.url.clone(),
        route,
        runs,
        comparison: rows,
        notes,
    };
    if let Some(p) = &args.json {
        let body = serde_json::to_vec_pretty(&report).map_err(|e| e.to_string())?;
        std::fs::write(p, body).map_err(|e| format!("cannot write {}: {e}", p.display()))?;
    }
    if let Some(p) = &args.html {
        std::fs::write(p, html::page(&report, &text))
            .map_err(|e| format!("cannot write {}: {e}", p.display()))?;
    }
    if answered == 0 {
        return Err(format!(
            "no request reached {} (see the errors above)",
            args.url
        ));
    }
    if args.fail_on_slo && !slo_ok {
        eprintln!("tiergate-bench: SLO failed");
        return Ok(ExitCode::from(2));
    }
    Ok(ExitCode::SUCCESS)
}

/// `slo derive`: prints the derivation, writes (or prints) the SLO file.
fn slo_derive(a: &tiergate_bench::derive::DeriveArgs) -> ExitCode {
    match tiergate_bench::derive::run(a) {
        Ok((d, text)) => {
            print!("{}", tiergate_bench::derive::render(&d));
            match &a.out {
                Some(p) => {
                    if let Err(e) = std::fs::write(p, &text) {
                        eprintln!("tiergate-bench: cannot write {}: {e}", p.display());
                        return ExitCode::from(1);
                    }
                    println!("SLO file written to {} (use it with --slo)", p.display());
                }
                None => print!("\n{text}"),
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("tiergate-bench: slo derive: {e}");
            ExitCode::from(1)
        }
    }
}

fn is_transport(kind: &str) -> bool {
    matches!(
        kind,
        "connection_error" | "transport_error" | "timeout" | "client_backlog" | "client_error"
    )
}
