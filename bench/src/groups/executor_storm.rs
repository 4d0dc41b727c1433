//! `executor_storm`: disrupted tasks of a client-go executor in each mode, and unrelated tasks beside them.

use crate::prelude::*;

/// The client-go executor (`tests/executor`, a model of Flyte's v2 pod
/// plugin) on a real node: N tasks' pods deleted gracefully at once (each
/// task takes its whole grace to stop), N unrelated tasks launched 3 s
/// later, while the colliding Creates wait; each mode side by side, with Flyte's 512 workers and with fewer
/// workers than collisions. Mode `conflict` (graceguard before `adaptive`)
/// is the same-run baseline of the request counts.
pub(crate) async fn executor_storm(quick: bool) -> Result<()> {
    use scenarios::storm::{self, MODES};
    use testbed::executor::Load;
    // The chart's defaults (mode adaptive, waits of at most 8 s); each
    // namespace's label picks its mode.
    let (bed, _webhook) = storm::bed_with_guard(&["--mode=adaptive"]).await?;
    let (tasks, grace) = if quick { (2, 10) } else { (6, 30) };
    for workers in [512, (tasks / 2).max(1)] {
        let load = Load {
            tasks,
            unrelated: tasks,
            workers,
            preempt: false,
            stop_after: None,
        };
        let rows = storm::run_with(&bed, &format!("bench-w{workers}"), grace, load, &MODES).await?;
        let total = |r: &storm::StormRow| r.requests.values().sum::<u64>();
        let baseline = rows
            .iter()
            .find(|r| r.mode == "conflict")
            .map(total)
            .unwrap_or(0);
        for r in &rows {
            let requests = total(r);
            let failed = r
                .report
                .tasks
                .iter()
                .filter(|t| t.failed_permanently)
                .count();
            emit(
                json!({"group": "executor_storm", "kube_version": r.kube_version, "mode": r.mode,
                "tasks": tasks, "unrelated": tasks, "workers": workers, "grace_seconds": grace,
                "requests_total": requests, "requests_ratio_vs_conflict": (baseline > 0).then(|| round3(requests as f64 / baseline as f64)),
                "pod_creates": r.pod_creates_sent, "pod_creates_409": r.report.sent("POST pods 409"), "pod_creates_429": r.report.sent("POST pods 429"),
                "quota_used": r.quota_used, "system_failures_recorded": r.system_failures_recorded, "system_failures_in_a_row_max": r.system_failures_charged,
                "tasks_failed": failed, "slowest_running_again_ms": r.running_again_after_ms, "longest_create_call_ms": r.longest_create_call_ms,
                "unrelated_created_ms_max": r.unrelated_created_ms_max, "unrelated_created_ms_median": r.unrelated_created_ms_median,
                "unrelated_running_ms_max": r.unrelated_running_ms_max, "requests": r.requests}),
            );
            let s = |v: Option<u64>| {
                v.map_or("-".to_string(), |ms| format!("{:.1} s", ms as f64 / 1000.0))
            };
            table(format!(
                "executor_storm  {:<8} {tasks} disrupted + {tasks} new, {workers:>3} workers: {requests:>5} requests ({:.2}× conflict), {:>4} pod Creates, quota {}, {failed} failed, slowest again {}, new tasks created within {} (median {}), longest Create {:.1} s",
                r.mode,
                if baseline > 0 { requests as f64 / baseline as f64 } else { 0.0 },
                r.pod_creates_sent,
                r.quota_used,
                s(r.running_again_after_ms),
                s(r.unrelated_created_ms_max),
                s(r.unrelated_created_ms_median),
                r.longest_create_call_ms as f64 / 1000.0
            ));
        }
    }
    Ok(())
}
