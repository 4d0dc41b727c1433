//! `index_memory` at scale and `index_list_options`: a webhook started on a cluster of many pods, its time to ready and memory, by list option.

use crate::prelude::*;

/// The pod index at scale, with real objects: `n` pods in 100 namespaces of
/// a test API server, then a webhook started against it: the time from start
/// to ready (the initial list) and its resident memory once ready.
pub(crate) async fn index_memory_at_scale(n: usize) -> Result<()> {
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
pub(crate) async fn index_list_options(bed: &TestBed, n: usize) -> Result<()> {
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
pub(crate) const INDEX_RSS_TARGET_BYTES: f64 = 80e6;

pub(crate) const INDEX_READY_TARGET_S: f64 = 15.0;

/// sig-scalability's API call latency SLO for a cluster-scoped LIST (p99).
pub(crate) const LIST_SLO_S: f64 = 30.0;
