//! The Airflow seed with Airflow's own code: the cncf.kubernetes provider's
//! real KubernetesExecutor (10.18.0, the version apache/airflow#68683 was
//! filed against, and 10.25.0, the newest), Airflow 3.3.2 with a
//! PostgreSQL metadata database, against the test bed; and graceguard's
//! subclass (`integrations/airflow`) on 10.25.0. Completed pods of a dead
//! scheduler are adopted while `sync()` runs (one scheduler, or two at
//! once) and results arrive; the executors' PATCHes are counted from the
//! API server's audit log, and a watch sees which executors claimed a pod.

use scenarios::airflow_executor::{run, AirflowRun, Case, GRACEGUARD_EXECUTOR};
use testbed::kubelet::{Kubelet, KubeletOptions};
use testbed::postgres::Postgres;

const PODS: usize = 20;
const SYNCS: usize = 10;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_real_executor_re_patches_until_10_25_and_adopts_twice_with_two_schedulers(
) -> anyhow::Result<()> {
    let (bed, ns) = scenarios::guard_task::audited_bed("airflow").await?;
    let kubelet = Kubelet::start(&bed, KubeletOptions::default()).await?;
    let pg = Postgres::start(&bed.dir().join("postgres")).await?;
    let mut rows: Vec<AirflowRun> = Vec::new();
    for (provider, executor) in [
        ("10.18.0", "KubernetesExecutor"),
        ("10.25.0", "KubernetesExecutor"),
        ("10.25.0", GRACEGUARD_EXECUTOR),
    ] {
        for executors in [1, 2] {
            let case = Case {
                provider,
                executor,
                executors,
                pods: PODS,
                syncs: SYNCS,
            };
            let r = run(&bed, &kubelet, &pg, &ns, case).await?;
            eprintln!("{}", serde_json::to_string(&r)?);
            rows.push(r);
        }
    }
    let row = |name: &str, e: usize| {
        rows.iter()
            .find(|r| r.row == name && r.executors == e)
            .cloned()
            .ok_or_else(|| anyhow::anyhow!("no row {name} x{e}"))
    };
    // 10.18.0: the adopted set is never drained; each sync with a result
    // re-patches every pod adopted so far (apache/airflow#68683).
    let old = row("airflow-10.18.0", 1)?;
    assert!(old.max_patches_of_a_pod > 10, "{old:?}");
    // 10.25.0, one scheduler: a relabel and done-marks, bounded.
    let new = row("airflow-10.25.0", 1)?;
    assert!(new.max_patches_of_a_pod <= 3, "{new:?}");
    assert_eq!(new.adopted_twice, 0, "{new:?}");
    // 10.25.0, two schedulers syncing at once: both claim the pods.
    let ha = row("airflow-10.25.0", 2)?;
    assert!(ha.adopted_twice > 0, "the race did not show: {ha:?}");
    // graceguard's executor: one claim per pod with any number of
    // schedulers; each other scheduler's claim is one PATCH refused (409).
    for e in [1, 2] {
        let ours = row("airflow-graceguard", e)?;
        assert_eq!(ours.adopted_twice, 0, "{ours:?}");
        assert!(ours.max_patches_of_a_pod <= 2 + e, "{ours:?}");
    }
    Ok(())
}
