//! `scripts/bench`: what graceguard costs, measured against baselines run in
//! the same process, on the same machine, at the same time.
//!
//! stdout: one JSON object per measurement (field `group`); stderr: a table.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use futures::{stream, StreamExt};
use hyper::body::Bytes;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::Api;
use serde_json::{json, Value};
use testbed::bench::histogram;
use testbed::bench::loadgen::{self, Protocol, Target};
use testbed::bench::pin;
use testbed::bench::procfs;
use testbed::bench::stats::{percentile_f64, round3};
use testbed::guard_task::{spec, RunningTask};
use testbed::kubelet::{now_rfc3339, Kubelet, KubeletOptions, Terminal};
use testbed::pods::{self, CreateOutcome};
use testbed::process::free_port;
use testbed::sidecar::SidecarProcess;
use testbed::webhook::{register_noop, Hook, Registration, WebhookProcess};
use testbed::{TestBed, TestBedOptions};

#[derive(Parser)]
#[command(
    name = "graceguard-bench",
    about = "Measure graceguard against same-run baselines"
)]
struct Args {
    #[command(subcommand)]
    helper: Option<Helper>,
    /// Small sizes, for scripts/test (well under 2 minutes).
    #[arg(long)]
    quick: bool,
    /// Accepted for symmetry with scripts/demo; stdout is always JSON lines.
    #[arg(long)]
    json: bool,
    /// Pods in the webhook's index (created in the real API server).
    #[arg(long)]
    pods: Option<usize>,
    /// Pods created per side for the API-server overhead.
    #[arg(long)]
    api_pods: Option<usize>,
    /// Pods fed synthetically into an index for the memory figure.
    #[arg(long)]
    synthetic_pods: Option<usize>,
    /// Only these groups (comma-separated): webhook (index memory,
    /// saturation, fixed rate), apiserver_overhead, livelock_storm,
    /// guard_recovery, tag_delay, kind_index_memory, kind_index_peak, match_conditions_share,
    /// index_memory_scale, sidecar_scale, sidecar_rss, executor_storm,
    /// cluster_churn, preemption_trace, relaunch_delay.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Hollow nodes of cluster_churn (50; 3 with --quick).
    #[arg(long)]
    hollow_nodes: Option<usize>,
    /// Seconds of each cluster_churn phase (60; 8 with --quick).
    #[arg(long)]
    churn_seconds: Option<f64>,
    /// Times each cluster_churn phase runs (3; 1 with --quick).
    #[arg(long)]
    churn_repetitions: Option<usize>,
    /// Preemptions per phase and repetition of preemption_trace (8; 1 with --quick).
    #[arg(long)]
    preemptions: Option<usize>,
    /// Times each preemption_trace phase runs (3; 1 with --quick).
    #[arg(long)]
    preemption_repetitions: Option<usize>,
    /// Real pods in the API server when a webhook starts, for its start-to-ready
    /// time and memory (150,000, Kubernetes' documented per-cluster limit;
    /// 1,000 with --quick).
    #[arg(long)]
    scale_pods: Option<usize>,
    /// Concurrent tasks in one sidecar for sidecar_scale (1,000; 50 with --quick).
    #[arg(long)]
    scale_tasks: Option<usize>,
    /// Seconds per load-generator run.
    #[arg(long)]
    seconds: Option<f64>,
    /// Seconds of the livelock storm.
    #[arg(long)]
    storm_seconds: Option<f64>,
    /// Connections of the load generator.
    #[arg(long, default_value_t = 4)]
    connections: usize,
    /// Reviews per second of the fixed-rate run.
    #[arg(long, default_value_t = 2000)]
    rate: u32,
}

#[derive(Subcommand)]
enum Helper {
    /// (internal) the baseline HTTPS server.
    BaselineServer {
        #[arg(long)]
        listen: SocketAddr,
        #[arg(long)]
        cert: PathBuf,
        #[arg(long)]
        key: PathBuf,
        /// Answer the tagger's path with the tags in admission.
        #[arg(long)]
        tag_inline: bool,
    },
    /// (internal) build a pod index of N synthetic pods and print this process's RSS.
    SyntheticIndex {
        #[arg(long)]
        pods: usize,
    },
}

struct Sizes {
    pods: usize,
    api_pods: usize,
    synthetic: usize,
    seconds: f64,
    storm: f64,
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let res = match &args.helper {
        Some(Helper::BaselineServer {
            listen,
            cert,
            key,
            tag_inline,
        }) => loadgen::serve_baseline(*listen, cert, key, *tag_inline).await,
        Some(Helper::SyntheticIndex { pods }) => synthetic_index(*pods),
        None => run(&args).await,
    };
    if let Err(e) = res {
        eprintln!("bench failed: {e:#}");
        std::process::exit(1);
    }
}

fn emit(v: Value) {
    println!("{v}");
}

fn table(line: String) {
    eprintln!("{line}");
}

async fn run(args: &Args) -> Result<()> {
    graceguard_certs::install_crypto_provider();
    let q = args.quick;
    let s = Sizes {
        pods: args.pods.unwrap_or(if q { 500 } else { 10_000 }),
        api_pods: args.api_pods.unwrap_or(if q { 50 } else { 500 }),
        synthetic: args
            .synthetic_pods
            .unwrap_or(if q { 10_000 } else { 100_000 }),
        seconds: args.seconds.unwrap_or(if q { 2.0 } else { 10.0 }),
        storm: args.storm_seconds.unwrap_or(if q { 2.0 } else { 10.0 }),
    };
    let started = Instant::now();
    table(format!(
        "graceguard bench ({}): {} indexed pods, {} API pods per side, {} s per load run; {} cores",
        if q { "quick" } else { "full" },
        s.pods,
        s.api_pods,
        s.seconds,
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0)
    ));

    let wanted = |g: &str| args.only.is_empty() || args.only.iter().any(|o| o == g);
    if ["webhook", "apiserver_overhead", "livelock_storm"]
        .iter()
        .any(|g| wanted(g))
    {
        let bed = TestBed::start().await?;
        let webhook = WebhookProcess::start(&bed, &[]).await?;
        if wanted("webhook") {
            memory_and_throughput(args, &s, &bed, &webhook).await?;
        }
        webhook.register(&bed, &[Hook::CollisionGuard]).await?;
        if wanted("apiserver_overhead") {
            apiserver_overhead(&s, &bed, &webhook).await?;
        }
        if wanted("livelock_storm") {
            livelock_storm(&s, &bed, &webhook).await?;
        }
    }
    if wanted("guard_recovery") {
        guard_recovery().await?;
    }
    if wanted("tag_delay") {
        tag_delay(if q { 5 } else { 20 }).await?;
    }
    if wanted("kind_index_memory") {
        kind_index_memory(if q { 100 } else { 2000 }).await?;
    }
    if wanted("kind_index_peak") {
        kind_index_peak(if q { 1000 } else { 20_000 }).await?;
    }
    if wanted("match_conditions_share") {
        match_conditions_share(if q { 10 } else { 100 }).await?;
    }
    if wanted("index_memory_scale") {
        index_memory_at_scale(args.scale_pods.unwrap_or(if q { 1000 } else { 150_000 })).await?;
    }
    if wanted("sidecar_scale") {
        sidecar_scale(args.scale_tasks.unwrap_or(if q { 50 } else { 1000 })).await?;
    }
    if wanted("sidecar_rss") {
        for events in [false, true] {
            sidecar_rss(if q { 300 } else { 10_000 }, events).await?;
        }
    }
    if wanted("executor_storm") {
        executor_storm(q).await?;
    }
    if wanted("relaunch_delay") {
        relaunch_delay(q).await?;
    }
    if wanted("cluster_churn") {
        cluster_churn(args).await?;
    }
    if wanted("preemption_trace") {
        preemption_trace(args).await?;
    }
    table(format!("done in {:.0} s", started.elapsed().as_secs_f64()));
    Ok(())
}

/// One `graceguard sidecar` running N concurrent tasks to completion: pod
/// watches it opens, API requests per task (alice's, from the audit log),
/// and its resident memory idle and with every task Running.
async fn sidecar_scale(n: usize) -> Result<()> {
    let bed = TestBed::start_with(TestBedOptions {
        audit: true,
        ..Default::default()
    })
    .await?;
    let ns = bed.namespace("scale").await?;
    let kubelet = Kubelet::start(&bed, KubeletOptions::default()).await?;
    let sidecar = SidecarProcess::start(&bed, "scale", &ns).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss_idle = procfs::rss_bytes(sidecar.pid()?)?;
    let mark = bed.audit_log()?.events()?.len();
    let template = serde_json::to_value(pods::task_pod("template", 30))?;
    let started = Instant::now();
    let body = json!({"template": template, "retries": 0});
    create_all(n, |i| {
        let (sidecar, ns, body) = (&sidecar, &ns, &body);
        async move { put_task(sidecar, ns, &format!("task-{i}"), body).await }
    })
    .await?;
    let api: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let running = api
            .list(&Default::default())
            .await?
            .items
            .iter()
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
            .count();
        if running >= n {
            break;
        }
        if Instant::now() > deadline {
            bail!("only {running} of {n} tasks Running after 600 s");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let to_running = started.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss_running = procfs::rss_bytes(sidecar.pid()?)?;
    stream::iter(0..n)
        .map(|i| {
            let (kubelet, ns) = (&kubelet, &ns);
            async move {
                kubelet
                    .end_pod(ns, &format!("task-{i}-0"), Terminal::Succeeded)
                    .await
            }
        })
        .buffer_unordered(8)
        .collect::<Vec<Result<()>>>()
        .await
        .into_iter()
        .collect::<Result<Vec<()>>>()?;
    // Take every result, acknowledging as a client does (each done-mark is a PATCH).
    let (mut results, mut after) = (0usize, 0u64);
    let mut epoch = String::new();
    while results < n {
        let (_, v) = sidecar
            .request(
                "GET",
                &format!("/v1/events?after={after}&epoch={epoch}&wait=10&limit=1000"),
                None,
            )
            .await?;
        epoch = v["epoch"].as_str().unwrap_or_default().to_string();
        let events = v["events"].as_array().cloned().unwrap_or_default();
        if events.is_empty() && Instant::now() > deadline {
            bail!("only {results} of {n} results after 600 s");
        }
        for e in &events {
            after = e["seq"].as_u64().unwrap_or(after);
            results += usize::from(e["type"] == "result");
        }
        sidecar
            .request(
                "POST",
                "/v1/events/ack",
                Some(&json!({"epoch": epoch, "seq": after})),
            )
            .await?;
    }
    let total = started.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let events = bed.audit_log()?.events()?;
    let mut by_verb: BTreeMap<String, u64> = BTreeMap::new();
    let mut create_codes: BTreeMap<String, u64> = BTreeMap::new();
    for e in events[mark.min(events.len())..]
        .iter()
        .filter(|e| e.user.username == "alice")
    {
        let key = match &e.object_ref {
            Some(o) => format!("{}:{}", e.verb, o.resource),
            None => e.verb.clone(),
        };
        if key == "create:pods" {
            let code = e.response_status.as_ref().map_or(0, |r| r.code);
            *create_codes.entry(code.to_string()).or_default() += 1;
        }
        *by_verb.entry(key).or_default() += 1;
    }
    let count = |k: &str| by_verb.get(k).copied().unwrap_or(0);
    let all: u64 = by_verb.values().sum();
    // Watches are opened when the sidecar starts and are still open: count
    // the started ones over its whole life.
    let pod_watches = bed
        .audit_log()?
        .events_at("ResponseStarted")?
        .iter()
        .filter(|e| {
            e.user.username == "alice"
                && e.verb == "watch"
                && e.object_ref.as_ref().is_some_and(|o| o.resource == "pods")
        })
        .count();
    let per_task = all as f64 / n as f64;
    emit(
        json!({"group": "sidecar_scale", "tasks": n, "pod_watches": pod_watches,
        "pod_creates_per_task": round3(count("create:pods") as f64 / n as f64),
        "requests_per_task": round3(per_task), "requests_by_verb": by_verb, "pod_create_codes": create_codes,
        "rss_bytes_idle": rss_idle, "rss_bytes_running": rss_running,
        "bytes_per_task": ((rss_running.saturating_sub(rss_idle)) as f64 / n as f64).round(),
        "seconds_to_all_running": round3(to_running), "seconds_total": round3(total),
        "note": "alice's requests (the sidecar's identity) from the first PUT to the last acknowledgement, from the apiserver audit log; events are the Kubernetes Events of each transition; a one-watch-per-task executor would open one pod watch per task"}),
    );
    table(format!(
        "sidecar_scale  {n} tasks: {pod_watches} pod watch(es); {per_task:.2} requests per task ({by_verb:?}); RSS {:.1} MB idle, {:.1} MB with all Running; all Running after {to_running:.1} s",
        rss_idle as f64 / 1e6,
        rss_running as f64 / 1e6
    ));
    Ok(())
}

/// One `graceguard sidecar` running `n` tasks one wave of 100 after
/// another, as a long-lived executor does: each task is PUT, runs, succeeds,
/// its result is acknowledged and its pod deleted (as a TTL would), and the
/// sidecar forgets it a second later (`--forget-after-seconds 1`). Its RSS
/// after the first tenth of the tasks is the same-run baseline; RSS at the
/// end over it should stay near 1 (memory does not grow with tasks run).
/// With `kube_events`, kube's event recorder also keeps every Event it
/// published for six minutes (its series cache): memory then grows with the
/// Events of the last six minutes, whatever the tasks.
async fn sidecar_rss(n: usize, kube_events: bool) -> Result<()> {
    const WAVE: usize = 100;
    let bed = TestBed::start().await?;
    let ns = bed.namespace("rss").await?;
    let kubelet = Kubelet::start(&bed, KubeletOptions::default()).await?;
    let mut args = vec!["--forget-after-seconds", "1"];
    if !kube_events {
        args.push("--no-kube-events");
    }
    let sidecar = SidecarProcess::start_with_args(&bed, "rss", &ns, &args).await?;
    let api: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);
    let body = json!({"template": pods::task_pod("template", 30)});
    let started = Instant::now();
    let (mut after, mut epoch) = (0u64, String::new());
    let (mut rss_base, mut samples) = (0u64, Vec::new());
    let baseline_at = (n / 10).max(WAVE);
    for wave in 0..n.div_ceil(WAVE) {
        let names: Vec<String> = (wave * WAVE..((wave + 1) * WAVE).min(n))
            .map(|i| format!("t{i}"))
            .collect();
        create_all(names.len(), |i| put_task(&sidecar, &ns, &names[i], &body)).await?;
        let deadline = Instant::now() + Duration::from_secs(300);
        for t in &names {
            while !api.get_opt(&format!("{t}-0")).await?.is_some_and(|p| {
                p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
            }) {
                if Instant::now() > deadline {
                    bail!("{t}-0 not Running within 300 s");
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        stream::iter(&names)
            .map(|t| {
                let (kubelet, ns) = (&kubelet, &ns);
                async move {
                    kubelet
                        .end_pod(ns, &format!("{t}-0"), Terminal::Succeeded)
                        .await
                }
            })
            .buffer_unordered(8)
            .collect::<Vec<Result<()>>>()
            .await
            .into_iter()
            .collect::<Result<Vec<()>>>()?;
        let mut left: std::collections::HashSet<&str> = names.iter().map(String::as_str).collect();
        while !left.is_empty() {
            let (_, v) = sidecar
                .request(
                    "GET",
                    &format!("/v1/events?after={after}&epoch={epoch}&wait=10&limit=1000"),
                    None,
                )
                .await?;
            epoch = v["epoch"].as_str().unwrap_or_default().to_string();
            for e in v["events"].as_array().cloned().unwrap_or_default() {
                after = e["seq"].as_u64().unwrap_or(after);
                if e["type"] == "result" {
                    left.remove(e["task"].as_str().unwrap_or_default());
                }
            }
            if Instant::now() > deadline {
                bail!("results missing after 300 s: {left:?}");
            }
            let ack = json!({"epoch": epoch, "seq": after});
            let (code, v) = sidecar
                .request("POST", "/v1/events/ack", Some(&ack))
                .await?;
            if code != 200 {
                bail!("ack: {code} {v}");
            }
        }
        create_all(names.len(), |i| {
            let (api, pod) = (&api, format!("{}-0", names[i]));
            async move { pods::delete_gracefully(api, &pod, None).await }
        })
        .await?;
        let done = (wave + 1) * WAVE;
        if done == baseline_at || done >= n || done.is_multiple_of(n / 5) {
            // Forgotten after a second; the deleted pods leave the index.
            tokio::time::sleep(Duration::from_secs(2)).await;
            let rss = procfs::rss_bytes(sidecar.pid()?)?;
            if done == baseline_at {
                rss_base = rss;
            }
            samples.push(json!({"tasks": done.min(n), "rss_bytes": rss}));
        }
    }
    let rss_end = procfs::rss_bytes(sidecar.pid()?)?;
    let (_, health) = sidecar.request("GET", "/healthz", None).await?;
    let ratio = rss_end as f64 / rss_base.max(1) as f64;
    let seconds = started.elapsed().as_secs_f64();
    emit(
        json!({"group": "sidecar_rss", "kube_events": kube_events, "tasks": n, "wave": WAVE, "rss_bytes_baseline": rss_base,
        "baseline_after_tasks": baseline_at, "rss_bytes_end": rss_end, "end_over_baseline": round3(ratio),
        "samples": samples, "healthz": health, "seconds": round3(seconds),
        "note": "one sidecar, tasks in waves of 100: PUT, Running, Succeeded, acknowledged, pod deleted, forgotten after 1 s; RSS from /proc"}),
    );
    table(format!(
        "sidecar_rss    {n} tasks in {seconds:.0} s (Kubernetes Events {}): RSS {:.1} MB after {baseline_at}, {:.1} MB after {n} ({ratio:.2}x)",
        if kube_events { "on" } else { "off" },
        mb(rss_base),
        mb(rss_end)
    ));
    Ok(())
}

/// Index memory (0 and N real pods, and a synthetic index), then throughput
/// and latency over TLS against the baseline.
async fn memory_and_throughput(
    args: &Args,
    s: &Sizes,
    bed: &TestBed,
    webhook: &WebhookProcess,
) -> Result<()> {
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss0 = procfs::rss_bytes(webhook.pid())?;
    emit(
        json!({"group": "index_memory", "pods": 0, "rss_bytes": rss0, "bytes_per_pod": Value::Null, "synthetic": false}),
    );

    let ns = "bench-index";
    bed.namespace_named(ns, false).await?;
    let api: Api<Pod> = Api::namespaced(bed.client.clone(), ns);
    let t = Instant::now();
    create_all(s.pods, |i| {
        let api = api.clone();
        async move {
            let mut p = pods::task_pod(&format!("idx-{i}"), 30);
            if let Some(spec) = p.spec.as_mut() {
                spec.node_name = None;
            }
            api.create(&PostParams::default(), &p).await?;
            Ok(())
        }
    })
    .await?;
    webhook
        .wait_metric(
            "graceguard_index_pods",
            s.pods as f64,
            Duration::from_secs(120),
        )
        .await?;
    table(format!(
        "created and indexed {} pods in {:.1} s",
        s.pods,
        t.elapsed().as_secs_f64()
    ));
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss_n = procfs::rss_bytes(webhook.pid())?;
    let per_pod = rss_n.saturating_sub(rss0) as f64 / s.pods as f64;
    emit(
        json!({"group": "index_memory", "pods": s.pods, "rss_bytes": rss_n, "bytes_per_pod": per_pod.round(), "synthetic": false}),
    );
    table(format!("index_memory   real: {:>7} pods  rss {:>6.1} MB  ({per_pod:.0} B/pod over the empty process)", s.pods, mb(rss_n)));

    let (syn0, syn_n) = (synthetic_rss(0)?, synthetic_rss(s.synthetic)?);
    let syn_per_pod = syn_n.saturating_sub(syn0) as f64 / s.synthetic as f64;
    emit(
        json!({"group": "index_memory", "pods": s.synthetic, "rss_bytes": syn_n, "bytes_per_pod": syn_per_pod.round(), "synthetic": true,
        "note": "the webhook's index type fed synthetic watch events in a process of its own (index only)",
        "estimated_webhook_rss_bytes": (rss0 as f64 + syn_per_pod * s.synthetic as f64).round()}),
    );
    table(format!(
        "index_memory   synthetic: {:>7} pods  rss {:>6.1} MB  ({syn_per_pod:.0} B/pod); webhook estimate {:.1} MB",
        s.synthetic,
        mb(syn_n),
        (rss0 as f64 + syn_per_pod * s.synthetic as f64) / 1e6
    ));

    // Throughput and latency.
    let baseline = BaselineServer::start(webhook).await?;
    let bodies = Arc::new(loadgen::review_bodies(s.pods)?);
    // Load generator on CPU 0, the server under test on CPU 1 (both servers
    // are pinned there and measured in turn); unpinned again afterwards.
    let pinned = pin::online_cpus() >= 2;
    let procs = [std::process::id(), webhook.pid(), baseline.pid()];
    if pinned {
        pin::pin(procs[0], &[0])?;
        pin::pin(procs[1], &[1])?;
        pin::pin(procs[2], &[1])?;
    } else {
        table("webhook groups: fewer than 2 CPUs online, so load generator and servers are not pinned".into());
    }
    let mut result = Ok(());
    for protocol in [Protocol::H2, Protocol::Http1] {
        result = throughput_rows(args, s, webhook, baseline.port, &bodies, protocol, pinned).await;
        if result.is_err() {
            break;
        }
    }
    if pinned {
        for pid in procs {
            pin::pin(pid, &pin::all_cpus())?;
        }
    }
    result
}

/// The baseline server (`graceguard-bench baseline-server`) in a process of
/// its own, serving the webhook's certificate; killed when dropped.
struct BaselineServer {
    child: std::process::Child,
    port: u16,
}

impl BaselineServer {
    async fn start(webhook: &WebhookProcess) -> Result<Self> {
        Self::serving(&webhook.dir.join("tls.crt"), &webhook.dir.join("tls.key")).await
    }

    /// The server with certificate `cert` and key `key`.
    async fn serving(cert: &std::path::Path, key: &std::path::Path) -> Result<Self> {
        Self::spawn(cert, key, false).await
    }

    /// [`BaselineServer::serving`], answering the tagger's path with the
    /// tags in admission when `tag_inline`.
    async fn spawn(
        cert: &std::path::Path,
        key: &std::path::Path,
        tag_inline: bool,
    ) -> Result<Self> {
        let port = free_port()?;
        let mut cmd = Command::new(std::env::current_exe()?);
        if tag_inline {
            cmd.arg("baseline-server").arg("--tag-inline");
        } else {
            cmd.arg("baseline-server");
        }
        let child = cmd
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .arg("--cert")
            .arg(cert)
            .arg("--key")
            .arg(key)
            .stdin(Stdio::null())
            .spawn()
            .context("starting the baseline server")?;
        let server = Self { child, port };
        let deadline = Instant::now() + Duration::from_secs(10);
        while tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
        {
            if Instant::now() > deadline {
                bail!("the baseline server did not start listening on port {port} within 10 s");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(server)
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for BaselineServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Saturation and fixed-rate rows for one protocol.
async fn throughput_rows(
    args: &Args,
    s: &Sizes,
    webhook: &WebhookProcess,
    baseline_port: u16,
    bodies: &Arc<Vec<Bytes>>,
    protocol: Protocol,
    pinned: bool,
) -> Result<()> {
    let gg = Target {
        protocol,
        ..webhook.target("/validate/pods")?
    };
    let base = Target {
        addr: SocketAddr::from(([127, 0, 0, 1], baseline_port)),
        ..gg.clone()
    };
    let dur = Duration::from_secs_f64(s.seconds);
    let c = args.connections;
    let p = protocol.as_str();
    // Warm both up (TLS sessions, caches, allocator) before measuring.
    loadgen::saturate(&gg, Arc::clone(bodies), c, Duration::from_millis(500)).await?;
    loadgen::saturate(&base, Arc::clone(bodies), c, Duration::from_millis(500)).await?;
    let mut sat_base = loadgen::saturate(&base, Arc::clone(bodies), c, dur).await?;
    let mut sat_gg = loadgen::saturate(&gg, Arc::clone(bodies), c, dur).await?;
    let ratio = sat_gg.rps() / sat_base.rps().max(1.0);
    emit(
        json!({"group": "webhook_saturation", "protocol": p, "pinned": pinned, "connections": c, "indexed_pods": s.pods,
        "graceguard_rps": sat_gg.rps().round(), "baseline_rps": sat_base.rps().round(), "throughput_ratio": round3(ratio),
        "graceguard_p50_us": sat_gg.percentile(50.0), "graceguard_p99_us": sat_gg.percentile(99.0), "graceguard_p999_us": sat_gg.percentile(99.9),
        "baseline_p50_us": sat_base.percentile(50.0), "baseline_p99_us": sat_base.percentile(99.0),
        "errors": sat_gg.errors + sat_base.errors}),
    );
    table(format!(
        "webhook_saturation  {p:<5} graceguard {:>7.0}/s  baseline {:>7.0}/s  ratio {ratio:.2}  (p99 {} us vs {} us, {c} {})",
        sat_gg.rps(),
        sat_base.rps(),
        sat_gg.percentile(99.0),
        sat_base.percentile(99.0),
        if protocol == Protocol::H2 { "streams on 1 connection" } else { "connections" }
    ));

    let mut fr_base = loadgen::fixed_rate(&base, Arc::clone(bodies), args.rate, c, dur).await?;
    let mut fr_gg = loadgen::fixed_rate(&gg, Arc::clone(bodies), args.rate, c, dur).await?;
    let p99_ratio = fr_gg.percentile(99.0) as f64 / fr_base.percentile(99.0).max(1) as f64;
    emit(
        json!({"group": "webhook_fixed_rate", "protocol": p, "pinned": pinned, "rate": args.rate, "connections": c,
        "p50_us": fr_gg.percentile(50.0), "p99_us": fr_gg.percentile(99.0), "p999_us": fr_gg.percentile(99.9),
        "baseline_p50_us": fr_base.percentile(50.0), "baseline_p99_us": fr_base.percentile(99.0), "baseline_p999_us": fr_base.percentile(99.9),
        "p99_ratio": round3(p99_ratio), "achieved_rps": fr_gg.rps().round(), "late_sends": fr_gg.late_sends, "errors": fr_gg.errors}),
    );
    table(format!(
        "webhook_fixed_rate  {p:<5} {}/s: graceguard p50 {} us p99 {} us p99.9 {} us; baseline p99 {} us (ratio {p99_ratio:.2})",
        args.rate,
        fr_gg.percentile(50.0),
        fr_gg.percentile(99.0),
        fr_gg.percentile(99.9),
        fr_base.percentile(99.0)
    ));
    Ok(())
}

/// Pod-CREATE reviews as the API server sends them: 99% free names, 1% names
/// held by indexed pods.
fn synthetic_index(pods: usize) -> Result<()> {
    use graceguard_webhook::meta_index::MetaIndex;
    use graceguard_webhook::pod_index::HeldPod;
    use kube::runtime::watcher::Event;
    let idx: MetaIndex<HeldPod> = MetaIndex::new("pods");
    let project = |m: &ObjectMeta| Some(HeldPod::from_meta(m));
    idx.apply(Event::Init, project);
    for i in 0..pods {
        // Realistic shapes: 100 namespaces, task-attempt names, uuid uids.
        let m = ObjectMeta {
            namespace: Some(format!("team-{}", i % 100)),
            name: Some(format!("train-job-{:08}-{}", i / 3, i % 3)),
            uid: Some(format!("{:08x}-8d2c-4f5e-9a1b-{:012x}", i, i * 7919)),
            ..Default::default()
        };
        idx.apply(Event::InitApply(&m), project);
    }
    idx.apply(Event::InitDone, project);
    if idx.len() != pods {
        bail!("indexed {} of {pods} pods", idx.len());
    }
    println!("{}", procfs::rss_bytes(std::process::id())?);
    Ok(())
}

fn synthetic_rss(pods: usize) -> Result<u64> {
    let out = Command::new(std::env::current_exe()?)
        .args(["synthetic-index", "--pods", &pods.to_string()])
        .output()?;
    if !out.status.success() {
        bail!(
            "synthetic-index {pods} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().parse()?)
}

/// Create latency through the real API server on three sides, in
/// interleaved batches so all see the same server state: no webhook (a
/// namespace graceguard is told to skip), graceguard's collision guard, and
/// the floor: a no-op webhook (the baseline server) registered exactly like
/// the collision guard, called only in its own namespace.
async fn apiserver_overhead(s: &Sizes, bed: &TestBed, webhook: &WebhookProcess) -> Result<()> {
    const NOOP_LABEL: &str = "bench.graceguard.io/noop";
    bed.namespace_named("ovh-with", false).await?;
    bed.namespace_named("ovh-without", true).await?;
    bed.namespace_named("ovh-noop", true).await?;
    let label = json!({"metadata": {"labels": {NOOP_LABEL: "true"}}});
    Api::<Namespace>::all(bed.client.clone())
        .patch("ovh-noop", &PatchParams::default(), &Patch::Merge(&label))
        .await?;
    let noop = BaselineServer::start(webhook).await?;
    let noop_url = format!("https://127.0.0.1:{}", noop.port);
    register_noop(
        bed,
        &noop_url,
        &webhook.ca_pem,
        NOOP_LABEL,
        "ovh-noop",
        false,
    )
    .await?;

    let sides = ["ovh-without", "ovh-with", "ovh-noop"];
    let apis: Vec<Api<Pod>> = sides
        .iter()
        .map(|ns| Api::namespaced(bed.client.clone(), ns))
        .collect();
    let mut lat: Vec<Vec<f64>> = vec![Vec::new(); sides.len()];
    let batch = 25;
    let mut i = 0;
    while i < s.api_pods {
        for (api, lat) in apis.iter().zip(lat.iter_mut()) {
            let mut names = Vec::new();
            for k in i..(i + batch).min(s.api_pods) {
                let name = format!("ovh-{k}");
                let p = pods::task_pod(&name, 0);
                let t = Instant::now();
                let out = pods::create(api, &p).await?;
                lat.push(t.elapsed().as_secs_f64() * 1000.0);
                if out != CreateOutcome::Created {
                    bail!("create {name} failed: {out:?}");
                }
                names.push(name);
            }
            for name in names {
                api.delete(
                    &name,
                    &DeleteParams {
                        grace_period_seconds: Some(0),
                        ..Default::default()
                    },
                )
                .await?;
            }
        }
        i += batch;
    }
    let med: Vec<f64> = lat.iter_mut().map(|l| percentile_f64(l, 50.0)).collect();
    let p99: Vec<f64> = lat.iter_mut().map(|l| percentile_f64(l, 99.0)).collect();
    let (mo, mw, mn) = (med[0], med[1], med[2]);
    let (added_gg, added_noop) = (mw - mo, mn - mo);
    // Below 10 us the floor is noise and a ratio against it means nothing.
    let vs_noop = (added_noop > 0.01).then(|| round3(added_gg / added_noop));
    let ratio = mw / mo.max(1e-9);
    emit(
        json!({"group": "apiserver_overhead", "pods": s.api_pods, "median_ms_without": round3(mo), "median_ms_with": round3(mw),
        "median_ms_noop": round3(mn), "p99_ms_without": round3(p99[0]), "p99_ms_with": round3(p99[1]), "p99_ms_noop": round3(p99[2]),
        "added_latency_ratio": round3(ratio), "added_ms_graceguard": round3(added_gg), "added_ms_noop": round3(added_noop),
        "added_latency_ratio_vs_noop": vs_noop}),
    );
    table(format!(
        "apiserver_overhead  {} pods/side: median {mw:.2} ms graceguard, {mn:.2} ms no-op webhook, {mo:.2} ms none; added {added_gg:+.2} ms vs the no-op's {added_noop:+.2} ms (ratio {}); p99 {:.2} / {:.2} / {:.2} ms",
        s.api_pods,
        vs_noop.map(|r| format!("{r:.2}")).unwrap_or_else(|| "n/a: the floor is below 10 us".into()),
        p99[1],
        p99[2],
        p99[0]
    ));
    Ok(())
}

/// Kubernetes >= 1.30 with the chart's `matchConditions`: which pod writes
/// still reach graceguard. A workload shaped like a cluster's: half the pods
/// named by a client, half by `generateName` (controllers); each gets three
/// ordinary status updates from its node's kubelet, every tenth a
/// `DisruptionTarget` as well; then each is deleted.
async fn match_conditions_share(n: usize) -> Result<()> {
    let bed = TestBed::start().await?;
    let webhook = WebhookProcess::start(&bed, &[]).await?;
    let hooks = [
        Hook::CollisionGuard,
        Hook::DisruptionTagger,
        Hook::DeletionAudit,
    ];
    webhook
        .register_with(
            &bed,
            &hooks,
            Registration {
                match_conditions: true,
                ..Default::default()
            },
        )
        .await?;
    let ns = bed.namespace("share").await?;
    let api: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);
    let node: Api<Pod> = Api::namespaced(bed.client_as(pods::NODE).await?, &ns);
    let (mut creates, mut updates, mut deletes) = (0usize, 0usize, 0usize);
    let mut names = Vec::new();
    for i in 0..n {
        let mut p = pods::task_pod(&format!("named-{i}"), 0);
        if i % 2 == 1 {
            p.metadata.name = None;
            p.metadata.generate_name = Some("generated-".into());
        }
        let created = api.create(&PostParams::default(), &p).await?;
        creates += 1;
        names.push(created.metadata.name.unwrap_or_default());
    }
    for (i, name) in names.iter().enumerate() {
        for k in 0..3 {
            let st = json!({"status": {"phase": "Running", "message": format!("heartbeat {k}")}});
            node.patch_status(name, &PatchParams::default(), &Patch::Merge(&st))
                .await?;
            updates += 1;
        }
        if i % 10 == 0 {
            let st = json!({"status": {"conditions": [{"type": "DisruptionTarget", "status": "True",
                "reason": "TerminationByKubelet", "message": "bench", "lastTransitionTime": now_rfc3339()}]}});
            node.patch_status(name, &PatchParams::default(), &Patch::Strategic(&st))
                .await?;
            updates += 1;
        }
    }
    for name in &names {
        api.delete(
            name,
            &DeleteParams {
                grace_period_seconds: Some(0),
                ..Default::default()
            },
        )
        .await?;
        deletes += 1;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let records = webhook.audit_records()?;
    // Distinct values of `field` among the records of `endpoint`: calls by
    // request uid; deletes by pod name, since the API server validates one
    // DELETE again (a new call) whenever its cached copy of the pod was stale.
    let distinct = |endpoint: &str, field: &str| {
        records
            .iter()
            .filter(|r| {
                r["namespace"] == ns.as_str()
                    && r["endpoint"] == endpoint
                    && r["event"] == "admission"
            })
            .filter_map(|r| r[field].as_str())
            .collect::<std::collections::BTreeSet<_>>()
            .len()
    };
    let (rc, ru, rd) = (
        distinct(Hook::CollisionGuard.endpoint(), "request_uid"),
        distinct(Hook::DisruptionTagger.endpoint(), "request_uid"),
        distinct(Hook::DeletionAudit.endpoint(), "name"),
    );
    let delete_calls = distinct(Hook::DeletionAudit.endpoint(), "request_uid");
    let writes = creates + updates + deletes;
    let share = (rc + ru + rd) as f64 / writes as f64;
    emit(
        json!({"group": "match_conditions_share", "pods": n, "writes": writes, "reached": rc + ru + rd, "share": round3(share),
        "creates": creates, "creates_reached": rc, "status_updates": updates, "status_updates_reached": ru,
        "deletes": deletes, "deletes_reached": rd, "delete_calls": delete_calls}),
    );
    table(format!(
        "match_conditions_share  {writes} pod writes, {} reached graceguard ({:.0}%): creates {rc}/{creates}, status updates {ru}/{updates}, deletes {rd}/{deletes} (in {delete_calls} calls: the API server re-validates a DELETE whose cached pod was stale)",
        rc + ru + rd,
        share * 100.0
    ));
    Ok(())
}

/// The pod index at scale, with real objects: `n` pods in 100 namespaces of
/// a test API server, then a webhook started against it: the time from start
/// to ready (the initial list) and its resident memory once ready.
async fn index_memory_at_scale(n: usize) -> Result<()> {
    let bed = TestBed::start().await?;
    let namespaces = 100.min(n.max(1));
    for k in 0..namespaces {
        bed.namespace_named(&format!("scale-{k}"), false).await?;
    }
    let t = Instant::now();
    let apis: Vec<Api<Pod>> = (0..namespaces)
        .map(|k| Api::namespaced(bed.client.clone(), &format!("scale-{k}")))
        .collect();
    let results: Vec<Result<()>> = stream::iter(0..n)
        .map(|i| {
            let api = apis[i % namespaces].clone();
            async move {
                let mut p = pods::task_pod(&format!("train-job-{:08}-{}", i / 3, i % 3), 30);
                if let Some(spec) = p.spec.as_mut() {
                    spec.node_name = None;
                }
                api.create(&PostParams::default(), &p).await?;
                Ok(())
            }
        })
        .buffer_unordered(32)
        .collect()
        .await;
    results.into_iter().collect::<Result<()>>()?;
    table(format!(
        "created {n} pods in {:.0} s",
        t.elapsed().as_secs_f64()
    ));
    let t = Instant::now();
    let webhook = WebhookProcess::start(&bed, &[]).await?;
    let ready = t.elapsed().as_secs_f64();
    let indexed = webhook.metric("graceguard_index_pods")?.unwrap_or(0.0);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss = procfs::rss_bytes(webhook.pid())?;
    drop(webhook);
    // The chart's two replicas starting at once against the same pods (a
    // rollout, or both lost): what their initial lists do to the API
    // server's LIST latency, which its SLO bounds (cluster-scoped LIST:
    // p99 <= 30 s).
    let list = [("verb", "LIST"), ("resource", "pods")];
    let before = bed.apiserver_metrics().await?;
    let t = Instant::now();
    let (a, b) = tokio::join!(
        WebhookProcess::start(&bed, &[]),
        WebhookProcess::start(&bed, &[])
    );
    let both_ready = t.elapsed().as_secs_f64();
    let (a, b) = (a?, b?);
    let after = bed.apiserver_metrics().await?;
    let lists = histogram::buckets(&after, "apiserver_request_duration_seconds", &list).since(
        &histogram::buckets(&before, "apiserver_request_duration_seconds", &list),
    );
    let list_p99 = lists.quantile(0.99).unwrap_or(0.0);
    let rss_two = [procfs::rss_bytes(a.pid())?, procfs::rss_bytes(b.pid())?];
    drop((a, b));
    let met = json!({
        "rss": rss as f64 <= INDEX_RSS_TARGET_BYTES,
        "ready": ready <= INDEX_READY_TARGET_S,
        "list_p99": list_p99 <= LIST_SLO_S,
    });
    emit(
        json!({"group": "index_memory", "pods": n, "rss_bytes": rss, "ready_seconds": round3(ready), "indexed": indexed,
        "synthetic": false, "note": "a webhook started against an API server already holding the pods: start to ready is the initial list",
        "two_replicas_ready_seconds": round3(both_ready), "two_replicas_rss_bytes": rss_two,
        "two_replicas_list_requests": lists.count(), "two_replicas_list_p99_seconds": round3(list_p99),
        "targets": {"rss_bytes_max": INDEX_RSS_TARGET_BYTES, "ready_seconds_max": INDEX_READY_TARGET_S, "list_p99_seconds_max": LIST_SLO_S, "met": met}}),
    );
    table(format!(
        "index_memory   real, at start: {n:>7} pods  rss {:>6.1} MB  ready {ready:.1} s after start ({indexed} indexed); two replicas at once: ready {both_ready:.1} s, {} LIST requests, p99 {list_p99:.2} s (SLO 30 s)",
        mb(rss),
        lists.count()
    ));
    index_list_options(&bed, n).await
}

/// The pod index's initial list made each way the webhook offers, against
/// the same pods, one replica at a time: start to ready, resident memory
/// once ready and its peak (`VmHWM`), and the pods indexed (ready means the
/// whole list: each must index all `n`).
async fn index_list_options(bed: &TestBed, n: usize) -> Result<()> {
    let options: [(&str, &[&str]); 4] = [
        ("paged_500", &["--pod-list-page-size=500"]),
        ("paged_2000", &["--pod-list-page-size=2000"]),
        ("paged_10000", &["--pod-list-page-size=10000"]),
        ("streaming", &["--pod-list-streaming=true"]),
    ];
    for (option, args) in options {
        let t = Instant::now();
        let webhook = WebhookProcess::start(bed, args).await?;
        let ready = t.elapsed().as_secs_f64();
        let indexed = webhook.metric("graceguard_index_pods")?.unwrap_or(0.0);
        let streamed = webhook.log_lines_with("does not serve streaming lists")? == 0;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let rss = procfs::rss_bytes(webhook.pid())?;
        let peak = procfs::peak_rss_bytes(webhook.pid())?;
        drop(webhook);
        emit(
            json!({"group": "index_list_options", "option": option, "pods": n, "kube_version": bed.version.as_str(),
            "ready_seconds": round3(ready), "indexed": indexed, "rss_bytes": rss, "peak_rss_bytes": peak,
            "streamed": option == "streaming" && streamed,
            "targets": {"ready_seconds_max": INDEX_READY_TARGET_S, "rss_bytes_max": INDEX_RSS_TARGET_BYTES,
                "met": ready <= INDEX_READY_TARGET_S && (rss as f64) <= INDEX_RSS_TARGET_BYTES}}),
        );
        table(format!(
            "index_list_options {option:<11} {n:>7} pods: ready {ready:.1} s ({indexed} indexed), rss {:.1} MB, peak {:.1} MB{}",
            mb(rss),
            mb(peak),
            if option == "streaming" && !streamed { " (the API server refused the streaming list: listed in pages)" } else { "" }
        ));
    }
    Ok(())
}

/// The index's targets at Kubernetes' documented 150,000 pods per cluster.
const INDEX_RSS_TARGET_BYTES: f64 = 80e6;
const INDEX_READY_TARGET_S: f64 = 15.0;
/// sig-scalability's API call latency SLO for a cluster-scoped LIST (p99).
const LIST_SLO_S: f64 = 30.0;

/// The no-op floor's own CA, with a serving pair for 127.0.0.1 written into
/// `dir` (`tls.crt`, `tls.key`): its server runs on this machine.
fn floor_certificate(dir: &std::path::Path) -> Result<graceguard_certs::Ca> {
    let ca = graceguard_certs::Ca::new("graceguard-bench-noop")?;
    let pair = ca.issue_server(&["localhost".to_string()], &["127.0.0.1".parse()?])?;
    ca.write_files(&pair, dir)?;
    Ok(ca)
}

/// The cluster at scale ([`testbed::bench::cluster_churn`]): hollow nodes,
/// a churning workload, the API server's latency SLIs with no webhook, the
/// no-op floor and graceguard installed by its chart.
async fn cluster_churn(args: &Args) -> Result<()> {
    use testbed::bench::cluster_churn::{self, Options};
    let q = args.quick;
    let dir = tempfile::tempdir()?;
    let ca = floor_certificate(dir.path())?;
    let noop =
        BaselineServer::serving(&dir.path().join("tls.crt"), &dir.path().join("tls.key")).await?;
    let opts = Options {
        hollow_nodes: args.hollow_nodes.unwrap_or(if q { 3 } else { 50 }),
        seconds: args.churn_seconds.unwrap_or(if q { 8.0 } else { 60.0 }),
        repetitions: args
            .churn_repetitions
            .unwrap_or(if q { 1 } else { 3 })
            .max(1),
        quick: q,
        noop_url: format!("https://127.0.0.1:{}", noop.port),
        noop_ca_pem: ca.cert_pem(),
        api_audit: std::env::var("GRACEGUARD_CHURN_API_AUDIT").is_ok_and(|v| v == "1"),
    };
    anyhow::ensure!(
        opts.seconds.is_finite() && opts.seconds >= 1.0,
        "--churn-seconds must be a number of seconds of at least 1, got {}",
        opts.seconds
    );
    anyhow::ensure!(
        opts.hollow_nodes >= 2,
        "--hollow-nodes must be at least 2 for cluster_churn (one is drained while the others take its pods), got {}",
        opts.hollow_nodes
    );
    for row in cluster_churn::run(&opts, table).await? {
        emit(row);
    }
    drop(noop);
    Ok(())
}

/// Scheduler preemptions on a real node with no webhook, the no-op floor,
/// the floor tagging in admission, and graceguard ([`testbed::bench::preemption_trace`]).
async fn preemption_trace(args: &Args) -> Result<()> {
    use testbed::bench::preemption_trace::{self, Options};
    let q = args.quick;
    let dir = tempfile::tempdir()?;
    let ca = floor_certificate(dir.path())?;
    let (cert, key) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    let noop = BaselineServer::spawn(&cert, &key, false).await?;
    let tagging = BaselineServer::spawn(&cert, &key, true).await?;
    let opts = Options {
        preemptions: args.preemptions.unwrap_or(if q { 1 } else { 8 }).max(1),
        repetitions: args
            .preemption_repetitions
            .unwrap_or(if q { 1 } else { 3 })
            .max(1),
        noop_url: format!("https://127.0.0.1:{}", noop.port),
        tagging_url: format!("https://127.0.0.1:{}", tagging.port),
        ca_pem: ca.cert_pem(),
    };
    for row in preemption_trace::run(&opts, table).await? {
        emit(row);
    }
    drop((noop, tagging));
    Ok(())
}

/// One client re-creating a terminating pod's name as fast as it can.
async fn livelock_storm(s: &Sizes, bed: &TestBed, webhook: &WebhookProcess) -> Result<()> {
    let ns = bed.namespace("storm").await?;
    let api: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);
    let pod = pods::task_pod("storm-0", 600);
    if pods::create(&api, &pod).await? != CreateOutcome::Created {
        bail!("creating the storm pod failed");
    }
    pods::delete_gracefully(&api, "storm-0", None).await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let gets0 = webhook
        .metric("graceguard_confirmation_gets_total")?
        .unwrap_or(0.0);
    let cpu0 = procfs::cpu_seconds(webhook.pid())?;
    let t = Instant::now();
    let (mut denials, mut other) = (0u64, 0u64);
    while t.elapsed().as_secs_f64() < s.storm {
        match pods::create(&api, &pod).await? {
            o if o.is_already_exists() => denials += 1,
            _ => other += 1,
        }
    }
    let wall = t.elapsed().as_secs_f64();
    let cpu = procfs::cpu_seconds(webhook.pid())? - cpu0;
    let gets = webhook
        .metric("graceguard_confirmation_gets_total")?
        .unwrap_or(0.0)
        - gets0;
    let share = cpu / wall;
    emit(
        json!({"group": "livelock_storm", "seconds": round3(wall), "denials": denials, "denials_per_s": (denials as f64 / wall).round(),
        "confirmation_gets": gets, "confirmation_cache_ttl_s": 1.0, "webhook_cpu_share": round3(share), "other_answers": other}),
    );
    table(format!(
        "livelock_storm  {:.0} denials/s for {wall:.1} s, {gets} confirmation GETs, webhook CPU {:.1}% of one core",
        denials as f64 / wall,
        share * 100.0
    ));
    Ok(())
}

/// The client-go executor (`tests/executor`, a model of Flyte's v2 pod
/// plugin) on a real node: N tasks' pods deleted gracefully at once (each
/// task takes its whole grace to stop), N unrelated tasks launched 3 s
/// later, while the colliding Creates wait; each mode side by side, with Flyte's 512 workers and with fewer
/// workers than collisions. Mode `conflict` (graceguard before `adaptive`)
/// is the same-run baseline of the request counts.
async fn executor_storm(quick: bool) -> Result<()> {
    use testbed::executor::Load;
    use testbed::storm::{self, MODES};
    // The chart's defaults (mode adaptive, waits of at most 8 s); each
    // namespace's label picks its mode.
    let (bed, _webhook) = storm::bed_with_guard(&["--mode=adaptive"]).await?;
    let (tasks, grace) = if quick { (2, 10) } else { (6, 30) };
    for workers in [512, (tasks / 2).max(1)] {
        let load = Load {
            tasks,
            unrelated: tasks,
            workers,
            preempt: false,
            stop_after: None,
        };
        let rows = storm::run_with(&bed, &format!("bench-w{workers}"), grace, load, &MODES).await?;
        let total = |r: &storm::StormRow| r.requests.values().sum::<u64>();
        let baseline = rows
            .iter()
            .find(|r| r.mode == "conflict")
            .map(total)
            .unwrap_or(0);
        for r in &rows {
            let requests = total(r);
            let failed = r
                .report
                .tasks
                .iter()
                .filter(|t| t.failed_permanently)
                .count();
            emit(
                json!({"group": "executor_storm", "kube_version": r.kube_version, "mode": r.mode,
                "tasks": tasks, "unrelated": tasks, "workers": workers, "grace_seconds": grace,
                "requests_total": requests, "requests_ratio_vs_conflict": (baseline > 0).then(|| round3(requests as f64 / baseline as f64)),
                "pod_creates": r.pod_creates_sent, "pod_creates_409": r.report.sent("POST pods 409"), "pod_creates_429": r.report.sent("POST pods 429"),
                "quota_used": r.quota_used, "system_failures_recorded": r.system_failures_recorded, "system_failures_in_a_row_max": r.system_failures_charged,
                "tasks_failed": failed, "slowest_running_again_ms": r.running_again_after_ms, "longest_create_call_ms": r.longest_create_call_ms,
                "unrelated_created_ms_max": r.unrelated_created_ms_max, "unrelated_created_ms_median": r.unrelated_created_ms_median,
                "unrelated_running_ms_max": r.unrelated_running_ms_max, "requests": r.requests}),
            );
            let s = |v: Option<u64>| {
                v.map_or("-".to_string(), |ms| format!("{:.1} s", ms as f64 / 1000.0))
            };
            table(format!(
                "executor_storm  {:<8} {tasks} disrupted + {tasks} new, {workers:>3} workers: {requests:>5} requests ({:.2}× conflict), {:>4} pod Creates, quota {}, {failed} failed, slowest again {}, new tasks created within {} (median {}), longest Create {:.1} s",
                r.mode,
                if baseline > 0 { requests as f64 / baseline as f64 } else { 0.0 },
                r.pod_creates_sent,
                r.quota_used,
                s(r.running_again_after_ms),
                s(r.unrelated_created_ms_max),
                s(r.unrelated_created_ms_median),
                r.longest_create_call_ms as f64 / 1000.0
            ));
        }
    }
    Ok(())
}

/// How soon a client-go executor (the model of Flyte's v2 pod plugin)
/// re-creates a disrupted task's pod once its old pod is gone, in mode
/// `adaptive` (graceguard's default) and in `conflict` (a 409 at once: as soon
/// as a client can), for a holder that takes its whole grace and for one
/// whose container exits at SIGTERM. From the executor's informer seeing the
/// old pod deleted to its successor's Create returning 201, per task.
async fn relaunch_delay(quick: bool) -> Result<()> {
    use testbed::executor::Load;
    use testbed::storm;
    let (bed, _webhook) = storm::bed_with_guard(&["--mode=adaptive"]).await?;
    let (tasks, grace) = if quick { (1, 10) } else { (6, 30) };
    for (holder, stop_after) in [("whole_grace", None), ("early_exit", Some(0))] {
        let load = Load {
            tasks,
            stop_after,
            ..Load::default()
        };
        let prefix = format!("relaunch-{}", holder.replace('_', "-"));
        let rows = storm::run_with(&bed, &prefix, grace, load, &["conflict", "adaptive"]).await?;
        for r in &rows {
            let mut creates: Vec<u64> = r
                .report
                .tasks
                .iter()
                .map(|t| t.relaunch_pod_creates)
                .collect();
            creates.sort_unstable();
            let creates_max = creates.last().copied();
            let creates_median = creates.get(creates.len() / 2).copied();
            emit(
                json!({"group": "relaunch_delay", "kube_version": r.kube_version, "holder": holder, "mode": r.mode,
                "tasks": tasks, "grace_seconds": grace,
                "after_name_free_ms_median": r.relaunched_after_gone_ms_median, "after_name_free_ms_max": r.relaunched_after_gone_ms_max,
                "relaunch_creates_per_task_median": creates_median, "relaunch_creates_per_task_max": creates_max,
                "quota_used": r.quota_used}),
            );
            let s = |v: Option<i64>| {
                v.map_or("-".to_string(), |ms| format!("{:.2} s", ms as f64 / 1000.0))
            };
            table(format!(
                "relaunch_delay  {holder:<11} {:<8} {tasks} tasks, grace {grace} s: successor created {} after the name was free (median; slowest {}), Creates per task {} (max {})",
                r.mode,
                s(r.relaunched_after_gone_ms_median),
                s(r.relaunched_after_gone_ms_max),
                creates_median.map_or("-".into(), |c| c.to_string()),
                creates_max.map_or("-".into(), |c| c.to_string()),
            ));
        }
    }
    Ok(())
}

/// The guard's recovery from a graceful delete: API requests by verb (from the
/// apiserver audit log) and the delay from the old pod's disappearance to the
/// next attempt's Create.
async fn guard_recovery() -> Result<()> {
    let bed = TestBed::start_with(TestBedOptions {
        audit: true,
        ..Default::default()
    })
    .await?;
    let ns = bed.namespace("recovery").await?;
    let kubelet = Kubelet::start(&bed, KubeletOptions::default()).await?;
    let alice = bed.client_as("alice").await?;
    let mut task = RunningTask::start(alice, spec("train", &ns), pods::task_pod("template", 30));
    let minute = Duration::from_secs(60);
    task.wait_for(minute, |t| t.phase == "Running" && t.attempt == 0)
        .await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let api: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);
    let mark = bed.audit_log()?.events()?.len();
    pods::delete_gracefully(&api, "train-0", None).await?;
    task.wait_for(minute, |t| t.phase == "ShuttingDown").await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    kubelet.finish_deletion(&ns, "train-0").await?;
    task.wait_for(minute, |t| t.phase == "Running" && t.attempt == 1)
        .await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let events = bed.audit_log()?.events()?;
    let after = &events[mark.min(events.len())..];
    let mut by_verb: BTreeMap<String, u64> = BTreeMap::new();
    for e in after.iter().filter(|e| e.user.username == "alice") {
        let key = match &e.object_ref {
            Some(o) if !o.subresource.is_empty() => {
                format!("{}:{}/{}", e.verb, o.resource, o.subresource)
            }
            Some(o) => format!("{}:{}", e.verb, o.resource),
            None => e.verb.clone(),
        };
        *by_verb.entry(key).or_default() += 1;
    }
    let creates = after
        .iter()
        .filter(|e| e.is("create", "pods", &ns) && e.user.username == "alice")
        .count();
    // The simulated kubelet's finishing delete, sent as its node.
    let gone = after
        .iter()
        .filter(|e| {
            e.is("delete", "pods", &ns)
                && e.name() == "train-0"
                && e.user.username == "system:node:node-1"
        })
        .filter_map(|e| e.completed_us())
        .next_back();
    let created = after
        .iter()
        .find(|e| e.is("create", "pods", &ns) && e.name() == "train-1")
        .and_then(|e| e.received_us());
    let delay_ms = match (gone, created) {
        (Some(g), Some(c)) => (c - g) as f64 / 1000.0,
        _ => bail!("could not find the finishing delete and the next Create in the audit log"),
    };
    kubelet.end_pod(&ns, "train-1", Terminal::Succeeded).await?;
    task.finish(minute).await?;
    emit(
        json!({"group": "guard_recovery", "creates": creates, "requests_by_verb": by_verb, "delay_ms": round3(delay_ms),
        "note": "alice's requests from the graceful delete of attempt 0 until attempt 1 ran; delay from the finishing delete's completion to the next Create's arrival (apiserver audit timestamps)"}),
    );
    table(format!("guard_recovery  {creates} Create(s); {delay_ms:.1} ms from the old pod gone to the next Create; requests: {by_verb:?}"));
    Ok(())
}

/// How long a DisruptionTarget stays untagged when graceguard must tag it
/// afterwards: a kubelet's own `TerminationByKubelet` (never changed in the
/// node's request) and an eviction (condition written outside
/// admission). Measured from the request's return to the label being readable
/// (GET every 5 ms), and as the webhook's own follow-up latency (request seen
/// to tag written, from its audit records).
async fn tag_delay(n: usize) -> Result<()> {
    let bed = TestBed::start().await?;
    let ns = bed.namespace("tag-delay").await?;
    let webhook = WebhookProcess::start(&bed, &[]).await?;
    webhook.register(&bed, testbed::webhook::ALL_HOOKS).await?;
    let kubelet = Kubelet::start(&bed, KubeletOptions::default()).await?;
    let api: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);
    let alice = bed.client_as("alice").await?;
    for source in ["node_status_update", "eviction"] {
        let mut seen_ms = Vec::new();
        for i in 0..n {
            let name = format!(
                "{}-{i}",
                if source == "eviction" {
                    "evicted"
                } else {
                    "ended"
                }
            );
            let out = pods::create(&api, &pods::task_pod(&name, 30)).await?;
            if out != CreateOutcome::Created {
                bail!("creating {ns}/{name}: {out:?}");
            }
            pods::wait_running(&api, &name).await?;
            let want = if source == "eviction" {
                pods::evict(&alice, &ns, &name, None, false).await?;
                "EvictionByEvictionAPI"
            } else {
                pods::delete_gracefully(&api, &name, None).await?;
                kubelet
                    .terminate_with_disruption(&ns, &name, "TerminationByKubelet", "bench")
                    .await?;
                "TerminationByKubelet"
            };
            let t0 = Instant::now();
            loop {
                let pod = api.get(&name).await?;
                if pods::disruption_label(&pod) == Some(want) {
                    break;
                }
                if t0.elapsed() > Duration::from_secs(30) {
                    bail!("{ns}/{name} was not tagged {want} within 30 s");
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            seen_ms.push(t0.elapsed().as_secs_f64() * 1000.0);
            kubelet.finish_deletion(&ns, &name).await?;
        }
        let mut follow_up_ms: Vec<f64> = webhook
            .audit_records()?
            .iter()
            .filter(|r| {
                r["event"] == "follow_up" && r["source"] == source && r["reason"] == "tagged"
            })
            .filter_map(|r| r["latency_us"].as_f64())
            .map(|us| us / 1000.0)
            .collect();
        let med = percentile_f64(&mut seen_ms, 50.0);
        let max = seen_ms.iter().copied().fold(0.0, f64::max);
        let fu = percentile_f64(&mut follow_up_ms, 50.0);
        emit(
            json!({"group": "tag_delay", "source": source, "kube_version": bed.version.as_str(), "pods": n,
            "median_ms": round3(med), "max_ms": round3(max), "follow_up_median_ms": round3(fu), "follow_ups_tagged": follow_up_ms.len(),
            "note": "from the disrupting request's return to the label being readable (GET every 5 ms); follow_up: the webhook's own request-to-tag latency"}),
        );
        table(format!("tag_delay       {source}: median {med:.1} ms, max {max:.1} ms to the label ({n} pods); follow-up {fu:.1} ms median inside the webhook"));
    }
    Ok(())
}

/// Memory per indexed object for each kind the collision guard indexes when a
/// quota counts it: `n` real objects per kind in the test API server, then a
/// quota counting that kind; the webhook's resident memory before and after
/// its index of the kind has synced.
async fn kind_index_memory(n: usize) -> Result<()> {
    use testbed::webhook::COLLISION_KINDS;
    let bed = TestBed::start().await?;
    let ns = "kind-memory";
    bed.namespace_named(ns, false).await?;
    let webhook = WebhookProcess::start(&bed, &["--collision-kinds", COLLISION_KINDS]).await?;
    // (kind for --collision-kinds and the metric, quota resource name, object JSON)
    type KindCase = (&'static str, &'static str, fn(usize) -> Value);
    let kinds: [KindCase; 4] = [
        (
            "configmaps",
            "count/configmaps",
            |i| json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": format!("cm-{i}")}, "data": {"k": "v"}}),
        ),
        (
            "services",
            "count/services",
            |i| json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": format!("svc-{i}")}, "spec": {"clusterIP": "None", "selector": {"app": "none"}, "ports": [{"port": 80}]}}),
        ),
        (
            "persistentvolumeclaims",
            "count/persistentvolumeclaims",
            |i| json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": format!("pvc-{i}")}, "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}),
        ),
        (
            "jobs.batch",
            "count/jobs.batch",
            |i| json!({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": format!("job-{i}")}, "spec": {"suspend": true, "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": "busybox:1.36"}]}}}}),
        ),
    ];
    for (kind, quota_name, object) in kinds {
        let gr = graceguard_webhook::quota_kinds::GroupResource::parse(kind)
            .with_context(|| format!("bad kind {kind}"))?;
        let discovered = kube::discovery::group(&bed.client, &gr.group).await?;
        let (ar, _) = discovered
            .recommended_resources()
            .into_iter()
            .find(|(ar, _)| ar.plural == gr.resource)
            .with_context(|| format!("the API server serves no {kind}"))?;
        let api: Api<kube::core::DynamicObject> = Api::namespaced_with(bed.client.clone(), ns, &ar);
        create_all(n, |i| {
            let api = api.clone();
            async move {
                let obj: kube::core::DynamicObject = serde_json::from_value(object(i))?;
                api.create(&PostParams::default(), &obj).await?;
                Ok(())
            }
        })
        .await?;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let before = procfs::rss_bytes(webhook.pid())?;
        let limit = (n + 100).to_string();
        testbed::quota::create_named(
            &bed,
            ns,
            &format!("q-{}", gr.resource),
            &[(quota_name, &limit)],
        )
        .await?;
        webhook.wait_kind_indexed(kind).await?;
        let sample = format!("graceguard_kind_index_objects{{kind=\"{kind}\"}}");
        webhook
            .wait_metric(&sample, n as f64, Duration::from_secs(60))
            .await?;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let after = procfs::rss_bytes(webhook.pid())?;
        let per = after.saturating_sub(before) as f64 / n as f64;
        emit(
            json!({"group": "kind_index_memory", "kind": kind, "objects": n, "rss_before_bytes": before, "rss_after_bytes": after,
            "bytes_per_object": per.round(), "kube_version": bed.version.as_str(),
            "note": "webhook RSS growth when a quota starts counting the kind (its watch, index and confirmation cache), divided by the objects indexed"}),
        );
        table(format!(
            "kind_index_memory {kind}: {n} objects, rss {:.1} -> {:.1} MB ({per:.0} B/object)",
            mb(before),
            mb(after)
        ));
    }
    Ok(())
}

/// The peak resident memory of a replica starting against `n` ConfigMaps,
/// each with a 10 KiB annotation (as `kubectl apply` leaves
/// `last-applied-configuration`) and the managedFields every object carries,
/// counted by a quota: a metadata list still carries both. Same run: a replica
/// listing 500 per page (kube-rs's default, what graceguard used) against one
/// listing 100 (today's default), and one capped below `n` objects, whose
/// index must go over its cap (dropped, fail open) with the smallest peak.
async fn kind_index_peak(n: usize) -> Result<()> {
    let bed = TestBed::start().await?;
    let ns = "kind-peak";
    bed.namespace_named(ns, false).await?;
    let api: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(bed.client.clone(), ns);
    let filler = "x".repeat(10 * 1024);
    create_all(n, |i| {
        let (api, filler) = (api.clone(), filler.clone());
        async move {
            let cm: k8s_openapi::api::core::v1::ConfigMap = serde_json::from_value(json!({
                "metadata": {"name": format!("cm-{i}"), "annotations": {"kubectl.kubernetes.io/last-applied-configuration": filler}},
                "data": {"k": "v"},
            }))?;
            api.create(&PostParams::default(), &cm).await?;
            Ok(())
        }
    })
    .await?;
    let limit = (n + 100).to_string();
    testbed::quota::create_named(&bed, ns, "q-configmaps", &[("count/configmaps", &limit)]).await?;
    let sample = "graceguard_kind_index_objects{kind=\"configmaps\"}";
    let mut peaks = Vec::new();
    for (page, cap) in [(500u32, None), (100, None), (100, Some(n / 2))] {
        let mut args = vec![
            "--collision-kinds".to_string(),
            "configmaps".to_string(),
            format!("--kind-page-size={page}"),
        ];
        if let Some(c) = cap {
            args.push(format!("--kind-index-max-objects={c}"));
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let webhook = WebhookProcess::start(&bed, &args).await?;
        let over_cap = match cap {
            None => {
                webhook
                    .wait_metric(sample, n as f64, Duration::from_secs(300))
                    .await?;
                false
            }
            Some(_) => {
                webhook
                    .wait_metric(
                        "graceguard_kind_index_over_cap{kind=\"configmaps\"}",
                        1.0,
                        Duration::from_secs(300),
                    )
                    .await?;
                true
            }
        };
        tokio::time::sleep(Duration::from_secs(1)).await;
        let peak = procfs::peak_rss_bytes(webhook.pid())?;
        let now = procfs::rss_bytes(webhook.pid())?;
        emit(
            json!({"group": "kind_index_peak", "configmaps": n, "annotation_bytes": filler.len(),
            "page_size": page, "max_objects": cap, "over_cap": over_cap, "peak_rss_bytes": peak, "rss_bytes": now,
            "kube_version": bed.version.as_str()}),
        );
        table(format!(
            "kind_index_peak    {n} ConfigMaps x 10 KiB annotation, page {page}{}: peak RSS {:.1} MB, then {:.1} MB{}",
            cap.map(|c| format!(", cap {c}")).unwrap_or_default(),
            mb(peak),
            mb(now),
            if over_cap { " (over its cap: index dropped, fail open)" } else { "" }
        ));
        peaks.push(peak);
    }
    if let [old, new, capped] = peaks[..] {
        let ratio = new as f64 / old.max(1) as f64;
        emit(
            json!({"group": "kind_index_peak", "summary": true, "peak_page_100_over_page_500": (ratio * 1000.0).round() / 1000.0,
            "capped_peak_over_page_100": ((capped as f64 / new.max(1) as f64) * 1000.0).round() / 1000.0}),
        );
        table(format!(
            "kind_index_peak    page 100 / page 500 peak: {ratio:.2}; capped / page 100: {:.2}",
            capped as f64 / new.max(1) as f64
        ));
    }
    Ok(())
}

/// Runs `create(i)` for every i below `n`, 16 at a time; any error fails it.
/// PUTs task `task` in `ns` with `body`; any answer but 201 (created) or
/// 200 (already there) is an error.
async fn put_task(sidecar: &SidecarProcess, ns: &str, task: &str, body: &Value) -> Result<()> {
    let (code, v) = sidecar
        .request("PUT", &format!("/v1/tasks/{ns}/{task}"), Some(body))
        .await?;
    if code != 201 && code != 200 {
        bail!("PUT {task}: {code} {v}");
    }
    Ok(())
}

async fn create_all<F, Fut>(n: usize, create: F) -> Result<()>
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    let results: Vec<Result<()>> = stream::iter(0..n)
        .map(create)
        .buffer_unordered(16)
        .collect()
        .await;
    results.into_iter().collect()
}

fn mb(b: u64) -> f64 {
    b as f64 / 1e6
}
