//! `livelock_storm`: a looping client's denials per second and what the livelock detector makes of them.

use crate::prelude::*;

/// One client re-creating a terminating pod's name as fast as it can.
pub(crate) async fn livelock_storm(
    s: &Sizes,
    bed: &TestBed,
    webhook: &WebhookProcess,
) -> Result<()> {
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
