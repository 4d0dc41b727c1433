//! `relaunch_delay`: how soon a client-go executor re-creates a disrupted task's pod once its name is free.

use crate::prelude::*;

/// How soon a client-go executor (the model of Flyte's v2 pod plugin)
/// re-creates a disrupted task's pod once its old pod is gone, in mode
/// `adaptive` (graceguard's default) and in `conflict` (a 409 at once: as soon
/// as a client can), for a holder that takes its whole grace and for one
/// whose container exits at SIGTERM. From the executor's informer seeing the
/// old pod deleted to its successor's Create returning 201, per task.
pub(crate) async fn relaunch_delay(quick: bool) -> Result<()> {
    use scenarios::storm;
    use testbed::executor::Load;
    let (bed, _webhook) = storm::bed_with_guard(&["--mode=adaptive"]).await?;
    let (tasks, grace) = if quick { (1, 10) } else { (6, 30) };
    for (holder, stop_after) in [("whole_grace", None), ("early_exit", Some(0))] {
        let load = Load {
            tasks,
            stop_after,
            ..Load::default()
        };
        let prefix = format!("relaunch-{}", holder.replace('_', "-"));
        let rows = storm::run_with(&bed, &prefix, grace, load, &["conflict", "adaptive"]).await?;
        for r in &rows {
            let mut creates: Vec<u64> = r
                .report
                .tasks
                .iter()
                .map(|t| t.relaunch_pod_creates)
                .collect();
            creates.sort_unstable();
            let creates_max = creates.last().copied();
            let creates_median = creates.get(creates.len() / 2).copied();
            emit(
                json!({"group": "relaunch_delay", "kube_version": r.kube_version, "holder": holder, "mode": r.mode,
                "tasks": tasks, "grace_seconds": grace,
                "after_name_free_ms_median": r.relaunched_after_gone_ms_median, "after_name_free_ms_max": r.relaunched_after_gone_ms_max,
                "relaunch_creates_per_task_median": creates_median, "relaunch_creates_per_task_max": creates_max,
                "quota_used": r.quota_used}),
            );
            let s = |v: Option<i64>| {
                v.map_or("-".to_string(), |ms| format!("{:.2} s", ms as f64 / 1000.0))
            };
            table(format!(
                "relaunch_delay  {holder:<11} {:<8} {tasks} tasks, grace {grace} s: successor created {} after the name was free (median; slowest {}), Creates per task {} (max {})",
                r.mode,
                s(r.relaunched_after_gone_ms_median),
                s(r.relaunched_after_gone_ms_max),
                creates_median.map_or("-".into(), |c| c.to_string()),
                creates_max.map_or("-".into(), |c| c.to_string()),
            ));
        }
    }
    Ok(())
}
