//! `sidecar_scale`: one `graceguard sidecar` running many tasks: its pod watches, API requests per task, memory.

use crate::prelude::*;

/// One `graceguard sidecar` running N concurrent tasks to completion: pod
/// watches it opens, API requests per task (alice's, from the audit log),
/// and its resident memory idle and with every task Running.
pub(crate) async fn sidecar_scale(n: usize) -> Result<()> {
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
