//! `kind_index_peak`: a kind index's peak memory while it lists, by page size, and its cap.

use crate::prelude::*;

/// The peak resident memory of a replica starting against `n` ConfigMaps,
/// each with a 10 KiB annotation (as `kubectl apply` leaves
/// `last-applied-configuration`) and the managedFields every object carries,
/// counted by a quota: a metadata list still carries both. Same run: a replica
/// listing 500 per page (kube-rs's default, what graceguard used) against one
/// listing 100 (today's default), and one capped below `n` objects, whose
/// index must go over its cap (dropped, fail open) with the smallest peak.
pub(crate) async fn kind_index_peak(n: usize) -> Result<()> {
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
