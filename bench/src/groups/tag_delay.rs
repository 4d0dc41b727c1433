//! `tag_delay`: how long after a disruption its pod carries the tag, by source.

use crate::prelude::*;

/// How long a DisruptionTarget stays untagged when graceguard must tag it
/// afterwards: a kubelet's own `TerminationByKubelet` (never changed in the
/// node's request) and an eviction (condition written outside
/// admission). Measured from the request's return to the label being readable
/// (GET every 5 ms), and as the webhook's own follow-up latency (request seen
/// to tag written, from its audit records).
pub(crate) async fn tag_delay(n: usize) -> Result<()> {
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
