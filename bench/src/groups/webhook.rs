//! `index_memory`, `webhook_saturation`, `webhook_fixed_rate`: the webhook's index memory and its admission throughput and latency, against a baseline server in the same run.

use crate::prelude::*;

/// Index memory (0 and N real pods, and a synthetic index), then throughput
/// and latency over TLS against the baseline.
pub(crate) async fn memory_and_throughput(
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
pub(crate) struct BaselineServer {
    child: std::process::Child,
    pub(crate) port: u16,
}

impl BaselineServer {
    /// A CA of the floor's own, with a serving pair for 127.0.0.1 written
    /// into `dir` (`tls.crt`, `tls.key`), for a floor registered beside
    /// graceguard rather than serving the webhook's certificate.
    pub(crate) fn own_certificate(dir: &std::path::Path) -> Result<graceguard_certs::Ca> {
        let ca = graceguard_certs::Ca::new("graceguard-bench-noop")?;
        let pair = ca.issue_server(&["localhost".to_string()], &["127.0.0.1".parse()?])?;
        ca.write_files(&pair, dir)?;
        Ok(ca)
    }

    pub(crate) async fn start(webhook: &WebhookProcess) -> Result<Self> {
        Self::serving(&webhook.dir.join("tls.crt"), &webhook.dir.join("tls.key")).await
    }

    /// The server with certificate `cert` and key `key`.
    pub(crate) async fn serving(cert: &std::path::Path, key: &std::path::Path) -> Result<Self> {
        Self::spawn(cert, key, false).await
    }

    /// [`BaselineServer::serving`], answering the tagger's path with the
    /// tags in admission when `tag_inline`.
    pub(crate) async fn spawn(
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

    pub(crate) fn pid(&self) -> u32 {
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
pub(crate) async fn throughput_rows(
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
pub(crate) fn synthetic_index(pods: usize) -> Result<()> {
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

pub(crate) fn synthetic_rss(pods: usize) -> Result<u64> {
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
