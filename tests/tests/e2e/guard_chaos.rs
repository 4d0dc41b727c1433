//! `guard_chaos`, quick form (the full one is `scripts/reliability --only
//! guard_chaos`): tasks through one sidecar while it is SIGKILLed, the API
//! server restarts and running pods are deleted and evicted. See
//! `scenarios::guard_chaos` for what is checked.

use std::time::Duration;

use scenarios::guard_chaos::{run, ChaosOptions};
use scenarios::guard_task::audited_bed;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_kills_restarts_and_disruptions_every_result_arrives_and_no_name_is_created_twice(
) -> anyhow::Result<()> {
    let (mut bed, ns) = audited_bed("chaos").await?;
    let opts = ChaosOptions {
        tasks: 40,
        sidecar_kills: 2,
        apiserver_restarts: 1,
        disrupt_every: 4,
        deadline: Duration::from_secs(240),
        real_nodes: false,
    };
    let report = run(&mut bed, &ns, &opts).await?;
    eprintln!("{}", serde_json::to_string(&report)?);
    report.assert_held(&opts);
    Ok(())
}
