//! `scripts/reliability`: graceguard under the conditions a production
//! cluster puts it in — hours of load, certificate rotation, a restarted
//! kube-apiserver, a replica killed — against the real binaries on a real
//! control plane. Each group checks its target and prints its figures.
//!
//! stdout: one JSON object per group (field `group`, field `pass`); stderr: a
//! table. Exits 1 when a group misses its target.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use futures::future::join_all;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, PostParams};
use kube::Api;
use serde_json::{json, Value};
use testbed::balancer::Balancer;
use testbed::load::procfs;
use testbed::load::{attack, loadgen};
use testbed::pods::{self, CreateOutcome};
use testbed::webhook::{Hook, Registration, WebhookProcess};
use testbed::TestBed;

#[derive(Parser)]
#[command(
    name = "graceguard-reliability",
    about = "Soak, certificate rotation, API server restart and replica loss, on a real control plane"
)]
struct Args {
    /// Short runs (scripts/test): the soak's memory figure is printed but
    /// not checked (too short to tell growth from warm-up).
    #[arg(long)]
    quick: bool,
    /// Seconds of the soak (default 600; 20 with --quick).
    #[arg(long)]
    soak_seconds: Option<u64>,
    /// Reviews per second of the soak.
    #[arg(long, default_value_t = 1000)]
    rate: u32,
    /// Groups to run (soak, rotation, apiserver_restart, replica_kill,
    /// port_attack); all by default.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Internal: run as port_attack's attacker against this address (the
    /// group starts this binary again with it), printing one JSON report.
    #[arg(long, hide = true)]
    attack: Option<std::net::SocketAddr>,
    /// Internal, with --attack: the CA file, and seconds to attack.
    #[arg(long, hide = true)]
    attack_ca: Option<std::path::PathBuf>,
    #[arg(long, hide = true, default_value_t = 10)]
    attack_seconds: u64,
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    match run(&args).await {
        Ok(true) => {}
        Ok(false) => {
            eprintln!("reliability: a group missed its target (see `\"pass\":false` above)");
            std::process::exit(1);
        }
        Err(e) => {
            eprintln!("reliability failed: {e:#}");
            std::process::exit(1);
        }
    }
}

/// Prints a group's figures; returns its `pass`.
fn report(v: Value, line: String) -> bool {
    println!("{v}");
    eprintln!("{line}");
    v["pass"].as_bool().unwrap_or(false)
}

async fn run(args: &Args) -> Result<bool> {
    graceguard_certs::install_crypto_provider();
    if let Some(target) = args.attack {
        let ca = args
            .attack_ca
            .as_ref()
            .context("--attack needs --attack-ca")?;
        let report = attack::run(attacker(
            target,
            std::fs::read_to_string(ca)?,
            args.attack_seconds,
        ))
        .await?;
        println!("{}", serde_json::to_string(&report)?);
        return Ok(true);
    }
    let wanted = |g: &str| args.only.is_empty() || args.only.iter().any(|o| o == g);
    let q = args.quick;
    let mut pass = true;
    if wanted("soak") {
        let secs = args.soak_seconds.unwrap_or(if q { 20 } else { 600 });
        pass &= soak(secs, args.rate, !q).await?;
    }
    if wanted("rotation") {
        pass &= rotation(Duration::from_secs(if q { 8 } else { 30 })).await?;
    }
    if wanted("apiserver_restart") {
        pass &= apiserver_restart().await?;
    }
    if wanted("replica_kill") {
        pass &= replica_kill(Duration::from_secs(if q { 9 } else { 30 })).await?;
    }
    if wanted("port_attack") {
        pass &= port_attack(Duration::from_secs(if q { 12 } else { 60 })).await?;
    }
    // Not part of the default set: its quick form is an end-to-end test
    // (tests/tests/e2e/guard_chaos.rs); `--only guard_chaos` runs the full one.
    if args.only.iter().any(|o| o == "guard_chaos") {
        pass &= guard_chaos(if q { 40 } else { 1000 }, false).await?;
    }
    // The same on a real node (kubelet, containerd, runc): its
    // quick form is tests/tests/e2e/real_nodes.rs's guard_chaos test.
    if args.only.iter().any(|o| o == "guard_chaos_real_nodes") {
        pass &= guard_chaos(if q { 12 } else { 200 }, true).await?;
    }
    Ok(pass)
}

/// `tasks` tasks through one sidecar while it is SIGKILLed five times, the
/// API server restarts twice, and every fourth running pod is deleted or
/// evicted (see `scenarios::guard_chaos`); on the simulated kubelet, or on a
/// real node with `real_nodes`.
async fn guard_chaos(tasks: usize, real_nodes: bool) -> Result<bool> {
    use scenarios::guard_chaos::{run, ChaosOptions};
    let bed = TestBed::start_with(testbed::TestBedOptions {
        audit: true,
        real_nodes: u8::from(real_nodes),
        ..Default::default()
    })
    .await?;
    let ns = bed.namespace("chaos").await?;
    let mut bed = bed;
    let opts = ChaosOptions {
        tasks,
        sidecar_kills: 5,
        apiserver_restarts: 2,
        disrupt_every: 4,
        deadline: Duration::from_secs(1800),
        real_nodes,
    };
    let r = run(&mut bed, &ns, &opts).await?;
    let line = format!(
        "{}  {} tasks in {:.0} s: {} results acknowledged ({} delivered), {} sidecar kills, {} API server restarts, {} pods deleted, {} evicted; {} pods created, {} Creates answered 409, {} names created twice ({} of tasks never disrupted), {} done-marks before their acknowledgement, {} pods left running",
        if real_nodes { "guard_chaos (real node)" } else { "guard_chaos      " },
        r.tasks,
        r.seconds,
        r.results_acknowledged,
        r.results_delivered,
        r.sidecar_kills,
        r.apiserver_restarts,
        r.pods_deleted,
        r.pods_evicted,
        r.pods_created,
        r.create_conflicts,
        r.names_created_twice.len(),
        r.names_created_twice_undisrupted.len(),
        r.done_before_ack.len(),
        r.left_running.len()
    );
    let mut v = serde_json::to_value(&r)?;
    v["group"] = json!(if real_nodes {
        "guard_chaos_real_nodes"
    } else {
        "guard_chaos"
    });
    v["pass"] = json!(r.pass());
    Ok(report(v, line))
}

/// The attack port_attack runs: slow clients from four addresses, 100
/// connections each (past the 64 one address may hold, and its 32 requests
/// in flight), and a flood of 256 KiB bodies over 16 connections from a
/// fifth, as fast as they are answered. Every address is loopback (all of 127/8 is), none the API
/// server's 127.0.0.1.
fn attacker(target: std::net::SocketAddr, ca_pem: String, seconds: u64) -> attack::Attack {
    attack::Attack {
        target,
        ca_pem,
        duration: Duration::from_secs(seconds),
        slow_from: (2..=5u8)
            .map(|i| std::net::IpAddr::from([127, 0, 0, i]))
            .collect(),
        slow_per_address: 100,
        flood_from: std::net::IpAddr::from([127, 0, 0, 6]),
        flood_connections: 16,
        flood_body_bytes: 256 * 1024,
    }
}

/// The admission port under attack from another process (see [`attacker`])
/// while four clients create pods through the API server, which calls the
/// webhook over its own connections (timeoutSeconds 2, failurePolicy
/// Ignore). Target: every Create succeeds within the webhook's timeout, the
/// API server never had to fail a call open (its own counter, 1.28+: every
/// review was answered), and each limit was reached (so the attack did
/// press on it): connections per address, the body deadline, one address's
/// share.
async fn port_attack(duration: Duration) -> Result<bool> {
    let bed = TestBed::start().await?;
    let webhook = WebhookProcess::start(&bed, &[]).await?;
    webhook.register(&bed, &[Hook::CollisionGuard]).await?;
    let ns = bed.namespace("attacked").await?;
    let api: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);
    // The API server's connection to the webhook, before the attack.
    for i in 0..5 {
        pods::create(&api, &pods::task_pod(&format!("warm-{i}"), 0)).await?;
    }
    let fail_open_before = apiserver_fail_open(&bed).await?;
    let target = webhook.target("/")?.addr;
    let ca = bed.dir().join("attack-ca.pem");
    std::fs::write(&ca, &webhook.ca_pem)?;
    let exe = std::env::current_exe().context("finding this binary to start the attacker")?;
    let child = tokio::process::Command::new(exe)
        .arg(format!("--attack={target}"))
        .arg(format!("--attack-ca={}", ca.display()))
        .arg(format!("--attack-seconds={}", duration.as_secs()))
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("starting the attacker")?;
    // Let the attack take hold, then create pods while it lasts.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let create_for = duration.saturating_sub(Duration::from_secs(3));
    let start = Instant::now();
    let clients = (0..4).map(|c| {
        let api = api.clone();
        async move {
            let (mut ok, mut failed, mut slowest) = (0usize, Vec::new(), Duration::ZERO);
            let mut k = 0;
            while start.elapsed() < create_for {
                let name = format!("a-{c}-{k}");
                k += 1;
                let t = Instant::now();
                let out = pods::create(&api, &pods::task_pod(&name, 0)).await;
                slowest = slowest.max(t.elapsed());
                match out {
                    Ok(CreateOutcome::Created) => ok += 1,
                    other => failed.push(format!("{name}: {other:?}")),
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            (ok, failed, slowest)
        }
    });
    let results = join_all(clients).await;
    let out = child
        .wait_with_output()
        .await
        .context("waiting for the attacker")?;
    let seen: attack::AttackReport = serde_json::from_slice(&out.stdout).with_context(|| {
        format!(
            "the attacker's report: {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })?;
    let ok: usize = results.iter().map(|r| r.0).sum();
    let slowest = results.iter().map(|r| r.2).max().unwrap_or_default();
    let failed: Vec<String> = results.into_iter().flat_map(|r| r.1).collect();
    let fail_open = match (apiserver_fail_open(&bed).await?, fail_open_before) {
        (Some(after), Some(before)) => Some(after.saturating_sub(before)),
        _ => None,
    };
    let limited = |limit: &str| -> Result<f64> {
        Ok(webhook
            .metric(&format!(
                "graceguard_admission_limited_total{{limit=\"{limit}\"}}"
            ))?
            .unwrap_or(0.0))
    };
    let (per_address, body_timeout, share, budget, in_flight) = (
        limited("connections_per_client")?,
        limited("body_timeout")?,
        limited("per_client_share")?,
        limited("body_bytes")?,
        limited("in_flight")?,
    );
    let timeout = Duration::from_secs(2);
    let pass = failed.is_empty()
        && ok > 0
        && slowest < timeout
        && fail_open.unwrap_or(0) == 0
        && per_address > 0.0
        && body_timeout > 0.0
        && share > 0.0;
    Ok(report(
        json!({"group": "port_attack", "seconds": duration.as_secs(), "creates_ok": ok,
        "creates_failed": failed.len(), "failures": failed.iter().take(5).collect::<Vec<_>>(),
        "slowest_create_ms": slowest.as_millis() as u64, "webhook_timeout_ms": timeout.as_millis() as u64,
        "apiserver_fail_open_calls": fail_open, "attacker": seen,
        "limited": {"connections_per_client": per_address, "body_timeout": body_timeout,
            "per_client_share": share, "body_bytes": budget, "in_flight": in_flight},
        "pass": pass}),
        format!(
            "port_attack        {} s: {} slow connections opened ({} closed by graceguard), flood answers {:?}; {ok} pod Creates, {} failed, slowest {} ms (timeout 2000); {} calls failed open at the API server; refused: {per_address} connections past an address's cap, {body_timeout} bodies past the deadline, {share} requests past an address's share",
            duration.as_secs(),
            seen.slow_connections_opened,
            seen.slow_connections_closed_by_server,
            seen.flood_answers,
            failed.len(),
            slowest.as_millis(),
            fail_open.map(|n| n.to_string()).unwrap_or_else(|| "? (no metric on this version)".into())
        ),
    ))
}

/// The namespace of the load generator's reviews, with `n` real pods whose
/// names 1% of the reviews reuse (each such hit costs a live read).
async fn indexed_namespace(bed: &TestBed, webhook: &WebhookProcess, n: usize) -> Result<()> {
    let ns = "bench-index";
    bed.namespace_named(ns, false).await?;
    let api: Api<Pod> = Api::namespaced(bed.client.clone(), ns);
    for i in 0..n {
        api.create(
            &PostParams::default(),
            &pods::task_pod(&format!("idx-{i}"), 30),
        )
        .await?;
    }
    webhook
        .wait_metric("graceguard_index_pods", n as f64, Duration::from_secs(60))
        .await
}

/// `secs` of reviews at `rate`/s in 30 s windows (5 s when short), resident
/// memory read after each. Target: 0 failed reviews; with `check_memory`,
/// resident memory after the last window within 10% of the first window's
/// (the first is warm-up: connection buffers, caches, allocator arenas).
async fn soak(secs: u64, rate: u32, check_memory: bool) -> Result<bool> {
    let bed = TestBed::start().await?;
    let webhook = WebhookProcess::start(&bed, &[]).await?;
    indexed_namespace(&bed, &webhook, 100).await?;
    let target = webhook.target("/validate/pods")?;
    let bodies = Arc::new(loadgen::review_bodies(100)?);
    let window = Duration::from_secs(if secs >= 120 { 30 } else { 5 });
    let windows = (secs / window.as_secs()).max(2);
    let (mut ok, mut errors, mut late) = (0usize, 0u64, 0u64);
    let mut rss = Vec::new();
    let mut p99 = Vec::new();
    for _ in 0..windows {
        let mut s = loadgen::fixed_rate(&target, Arc::clone(&bodies), rate, 4, window).await?;
        ok += s.micros.len();
        errors += s.errors;
        late += s.late_sends;
        p99.push(s.percentile(99.0) as f64 / 1000.0);
        rss.push(procfs::rss_bytes(webhook.pid())?);
    }
    let first = rss[0] as f64;
    let last = rss[rss.len() - 1] as f64;
    let max = rss.iter().copied().max().unwrap_or_default() as f64;
    let growth = (last - first) / first;
    let dropped = webhook
        .metric("graceguard_audit_records_dropped_total")?
        .unwrap_or(0.0);
    let pass = errors == 0 && (!check_memory || growth <= 0.10);
    let p99_max = p99.iter().copied().fold(0.0, f64::max);
    Ok(report(
        json!({"group": "soak", "seconds": windows * window.as_secs(), "rate": rate, "reviews_ok": ok,
        "errors": errors, "late_sends": late, "rss_first_window_bytes": rss[0], "rss_last_window_bytes": rss[rss.len() - 1],
        "rss_max_bytes": max, "rss_growth_ratio": (growth * 1000.0).round() / 1000.0, "memory_checked": check_memory,
        "p99_ms_worst_window": p99_max, "audit_records_dropped": dropped, "pass": pass}),
        format!(
            "soak               {} s at {rate}/s: {ok} reviews, {errors} errors, {late} late sends; rss {:.1} → {:.1} MB (max {:.1}, growth {:+.1}%{}); worst window p99 {p99_max:.2} ms; {dropped} audit records dropped",
            windows * window.as_secs(),
            first / 1e6,
            last / 1e6,
            max / 1e6,
            growth * 100.0,
            if check_memory { "" } else { ", not checked: short run" }
        ),
    ))
}

/// Reviews on live connections and on a new connection each, while the
/// serving pair is replaced every second (reload interval 1 s). Target: 0
/// failed reviews, and the webhook reloaded the pair more than once.
async fn rotation(duration: Duration) -> Result<bool> {
    let bed = TestBed::start().await?;
    let webhook = WebhookProcess::start(&bed, &["--cert-reload-interval=1s"]).await?;
    let target = webhook.target("/validate/pods")?;
    let bodies = Arc::new(loadgen::review_bodies(1)?);
    let rotations = Arc::new(AtomicU64::new(0));
    let rotate = {
        let rotations = Arc::clone(&rotations);
        let webhook = &webhook;
        async move {
            let start = Instant::now();
            while start.elapsed() < duration {
                tokio::time::sleep(Duration::from_millis(1000)).await;
                webhook.rotate_certificate()?;
                rotations.fetch_add(1, Ordering::Relaxed);
            }
            anyhow::Ok(())
        }
    };
    let (live, fresh, rotated) = tokio::join!(
        loadgen::fixed_rate(&target, Arc::clone(&bodies), 300, 2, duration),
        loadgen::handshake_each(&target, Arc::clone(&bodies), 2, duration),
        rotate
    );
    rotated?;
    let (live, fresh) = (live?, fresh?);
    let reloads = webhook.log_lines_with("serving certificate reloaded")?;
    let errors = live.errors + fresh.errors;
    let pass = errors == 0 && reloads >= 2;
    Ok(report(
        json!({"group": "rotation", "seconds": duration.as_secs(), "rotations": rotations.load(Ordering::Relaxed),
        "reloads": reloads, "reviews_on_live_connections": live.micros.len(), "reviews_on_new_connections": fresh.micros.len(),
        "errors": errors, "pass": pass}),
        format!(
            "rotation           {} s: {} pairs written, {reloads} reloaded; {} reviews on live connections, {} on a new connection each; {errors} errors",
            duration.as_secs(),
            rotations.load(Ordering::Relaxed),
            live.micros.len(),
            fresh.micros.len()
        ),
    ))
}

/// kube-apiserver killed and restarted under a running webhook. Before the
/// restart, nine live pods are denied re-creation (so their holders sit in
/// the confirmation cache) and a tenth is put in a graceful deletion. Target:
/// readiness drops while the API server is gone and returns; afterwards the
/// nine, force-deleted, are re-created at once (a stale index or cache would
/// deny them: a wrong denial) and the terminating tenth is still denied.
async fn apiserver_restart() -> Result<bool> {
    let mut bed = TestBed::start().await?;
    let webhook = WebhookProcess::start(&bed, &[]).await?;
    webhook.register(&bed, &[Hook::CollisionGuard]).await?;
    let ns = bed.namespace("restart").await?;
    let api: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);
    let names: Vec<String> = (0..10).map(|i| format!("keep-{i}")).collect();
    for n in &names {
        api.create(&PostParams::default(), &pods::task_pod(n, 30))
            .await?;
    }
    webhook
        .wait_metric("graceguard_index_pods", 11.0, Duration::from_secs(30))
        .await?;
    api.delete(&names[0], &DeleteParams::default()).await?;
    for n in &names {
        let out = pods::create(&api, &pods::task_pod(n, 30)).await?;
        if !matches!(out, CreateOutcome::Refused { code: 409, .. }) {
            bail!("before the restart, re-creating {n} was not refused 409: {out:?}");
        }
    }

    let down = Instant::now();
    let mut unready_after = None;
    bed.restart_apiserver(|| async {
        // Down for 10 s (a control-plane node rebooting): readiness must drop.
        while down.elapsed() < Duration::from_secs(10) {
            if unready_after.is_none() && !matches!(webhook.http_get("/readyz"), Ok((200, _))) {
                unready_after = Some(down.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    })
    .await?;
    let back = Instant::now();
    let deadline = back + Duration::from_secs(120);
    while !matches!(webhook.http_get("/readyz"), Ok((200, _))) {
        if Instant::now() > deadline {
            bail!("the webhook was not ready 120 s after kube-apiserver came back");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let ready_after_back = back.elapsed();

    let force = DeleteParams {
        grace_period_seconds: Some(0),
        ..Default::default()
    };
    let mut wrong_denials = Vec::new();
    for n in &names[1..] {
        api.delete(n, &force).await?;
        // The delete is acknowledged; a Create of the name must now succeed
        // (retried only while the API server itself still has the pod).
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match pods::create(&api, &pods::task_pod(n, 30)).await? {
                CreateOutcome::Created => break,
                CreateOutcome::Refused { message, .. } if message.contains("graceguard") => {
                    wrong_denials.push(format!("{n}: {message}"));
                    break;
                }
                other if Instant::now() > deadline => bail!("re-creating {n}: {other:?}"),
                _ => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }
    let terminating = pods::create(&api, &pods::task_pod(&names[0], 30)).await?;
    let still_denied = matches!(&terminating, CreateOutcome::Refused { code: 409, message, .. } if message.contains("graceguard"));
    let pass = unready_after.is_some() && wrong_denials.is_empty() && still_denied;
    Ok(report(
        json!({"group": "apiserver_restart", "down_seconds": 10, "readiness_dropped": unready_after.is_some(),
        "unready_after_seconds": unready_after.map(|d| d.as_secs_f64()), "ready_seconds_after_return": ready_after_back.as_secs_f64(),
        "recreated_after_restart": names.len() - 1 - wrong_denials.len(), "wrong_denials": wrong_denials,
        "terminating_still_denied": still_denied, "pass": pass}),
        format!(
            "apiserver_restart  down 10 s: readiness dropped {}; ready {:.1} s after it returned; {} of 9 force-deleted pods re-created with no wrong denial; terminating pod still denied: {still_denied}",
            unready_after.map(|d| format!("after {:.1} s", d.as_secs_f64())).unwrap_or_else(|| "never".into()),
            ready_after_back.as_secs_f64(),
            names.len() - 1 - wrong_denials.len(),
        ),
    ))
}

/// Two replicas behind one registration (a balancer standing in for the
/// Service), registered `failurePolicy: Ignore`; four clients create pods
/// for `duration`, and one replica is killed (SIGKILL) a third of the way in.
/// Target: 0 failed pod Creates, and the survivor served reviews after the kill.
async fn replica_kill(duration: Duration) -> Result<bool> {
    let bed = TestBed::start().await?;
    let mut a = WebhookProcess::start(&bed, &[]).await?;
    let b = WebhookProcess::start_replica(&bed, &[], &a).await?;
    let addr = |w: &WebhookProcess| -> Result<std::net::SocketAddr> { Ok(w.target("/")?.addr) };
    let lb = Balancer::start(vec![addr(&a)?, addr(&b)?]).await?;
    a.register_with(
        &bed,
        &[Hook::CollisionGuard],
        Registration {
            url: Some(format!("https://{}", lb.addr)),
            ..Default::default()
        },
    )
    .await?;
    let ns = bed.namespace("replicas").await?;
    let api: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);
    let start = Instant::now();
    let clients = (0..4).map(|c| {
        let api = api.clone();
        async move {
            let (mut ok, mut failed) = (0usize, Vec::new());
            let mut k = 0;
            while start.elapsed() < duration {
                let name = format!("r-{c}-{k}");
                k += 1;
                match pods::create(&api, &pods::task_pod(&name, 0)).await {
                    Ok(CreateOutcome::Created) => ok += 1,
                    other => failed.push(format!("{name}: {other:?}")),
                }
            }
            (ok, failed)
        }
    });
    let kill = async {
        tokio::time::sleep(duration / 3).await;
        let served = count_reviews(&a, &ns)?;
        a.kill();
        anyhow::Ok((served, Instant::now()))
    };
    let (results, killed) = tokio::join!(join_all(clients), kill);
    let (a_served, killed_at) = killed?;
    let ok: usize = results.iter().map(|r| r.0).sum();
    let failed: Vec<String> = results.into_iter().flat_map(|r| r.1).collect();
    let b_served = count_reviews(&b, &ns)?;
    let fail_open = apiserver_fail_open(&bed).await?;
    let pass = failed.is_empty() && a_served > 0 && b_served > 0;
    let after_kill = start
        .elapsed()
        .saturating_sub(killed_at.duration_since(start));
    Ok(report(
        json!({"group": "replica_kill", "seconds": duration.as_secs(), "creates_ok": ok, "creates_failed": failed.len(),
        "failures": failed.iter().take(5).collect::<Vec<_>>(), "reviews_by_killed_replica": a_served,
        "reviews_by_survivor": b_served, "apiserver_fail_open_calls": fail_open,
        "seconds_after_kill": after_kill.as_secs_f64(), "pass": pass}),
        format!(
            "replica_kill       {} s, 4 clients: {ok} pod Creates, {} failed; killed replica served {a_served} reviews, survivor {b_served}; {} calls failed open at the API server",
            duration.as_secs(),
            failed.len(),
            fail_open.map(|n| n.to_string()).unwrap_or_else(|| "? (no metric on this version)".into())
        ),
    ))
}

/// Collision-guard reviews of namespace `ns` in a replica's audit log.
fn count_reviews(w: &WebhookProcess, ns: &str) -> Result<usize> {
    Ok(w.audit_records()?
        .iter()
        .filter(|r| r["endpoint"] == Hook::CollisionGuard.endpoint() && r["namespace"] == ns)
        .count())
}

/// The API server's count of webhook calls that failed and were let through
/// (`apiserver_admission_webhook_fail_open_count`), if this version has it.
async fn apiserver_fail_open(bed: &TestBed) -> Result<Option<u64>> {
    let req = http::Request::get("/metrics")
        .body(Vec::new())
        .context("building a /metrics request")?;
    let text = bed.client.request_text(req).await?;
    let mut found = None;
    for line in text.lines() {
        if line.starts_with("apiserver_admission_webhook_fail_open_count{") {
            let n: f64 = line
                .rsplit_once(' ')
                .and_then(|(_, v)| v.parse().ok())
                .unwrap_or(0.0);
            *found.get_or_insert(0) += n as u64;
        }
    }
    // A counter with no series prints nothing: 0.
    Ok(Some(found.unwrap_or(0)))
}
