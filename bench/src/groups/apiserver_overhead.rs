//! `apiserver_overhead`: what the collision guard adds to a pod Create through the API server, against the no-op floor.

use crate::prelude::*;

/// What the no-op floor must add (ms) for a ratio against it: below 10 us
/// (or below the no-webhook median, on a busy machine) the floor is noise
/// and a ratio means nothing, so none is printed.
pub const FLOOR_MIN_MS: f64 = 0.01;

/// Create latency through the real API server on three sides, in
/// interleaved batches so all see the same server state: no webhook (a
/// namespace graceguard is told to skip), graceguard's collision guard, and
/// the floor: a no-op webhook (the baseline server) registered exactly like
/// the collision guard, called only in its own namespace.
pub(crate) async fn apiserver_overhead(
    s: &Sizes,
    bed: &TestBed,
    webhook: &WebhookProcess,
) -> Result<()> {
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
    let vs_noop = (added_noop > FLOOR_MIN_MS).then(|| round3(added_gg / added_noop));
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
