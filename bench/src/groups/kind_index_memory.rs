//! `kind_index_memory`: the memory of the other kinds' name indexes.

use crate::prelude::*;

/// Memory per indexed object for each kind the collision guard indexes when a
/// quota counts it: `n` real objects per kind in the test API server, then a
/// quota counting that kind; the webhook's resident memory before and after
/// its index of the kind has synced.
pub(crate) async fn kind_index_memory(n: usize) -> Result<()> {
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
