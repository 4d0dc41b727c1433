//! `sidecar_rss`: a sidecar's resident memory as tasks come and go, with and without Kubernetes Events.

use crate::prelude::*;

/// One `graceguard sidecar` running `n` tasks one wave of 100 after
/// another, as a long-lived executor does: each task is PUT, runs, succeeds,
/// its result is acknowledged and its pod deleted (as a TTL would), and the
/// sidecar forgets it a second later (`--forget-after-seconds 1`). Its RSS
/// after the first tenth of the tasks is the same-run baseline; RSS at the
/// end over it should stay near 1 (memory does not grow with tasks run).
/// With `kube_events`, kube's event recorder also keeps every Event it
/// published for six minutes (its series cache): memory then grows with the
/// Events of the last six minutes, whatever the tasks.
pub(crate) async fn sidecar_rss(n: usize, kube_events: bool) -> Result<()> {
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
