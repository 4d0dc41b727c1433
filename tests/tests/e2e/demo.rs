//! `scripts/demo --json`, end to end on the version `GRACEGUARD_KUBE` names
//! (scripts/test runs it on both): the numbers it prints come from the API
//! server, and they must show the leak without graceguard and none with it;
//! also with a real preemption (the Flyte seed) and a real drain.

use std::process::Command;

use serde_json::Value;

#[test]
fn the_demo_shows_the_leak_bare_and_none_with_graceguard_or_the_guard() -> anyhow::Result<()> {
    let version = testbed::KubeVersion::from_env()?;
    let out = Command::new(env!("CARGO_BIN_EXE_graceguard-demo"))
        .args(["--json", "--creates", "7", "--kube"])
        .arg(format!("1.{}", version.minor()))
        .output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "demo failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let runs: Vec<Value> = stdout
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?;
    assert!(
        runs.iter().all(|r| r["kube_version"] == version.as_str()),
        "every object names the version: {runs:?}"
    );
    assert!(
        runs.iter()
            .all(|r| r["kubelet"] == "real" || r["kubelet"] == "simulated"),
        "every object names who ran its pods: {runs:?}"
    );
    let find = |scenario: &str, m: &str| {
        runs.iter()
            .find(|r| r["scenario"] == scenario && r["mode"] == m)
            .cloned()
            .unwrap_or(Value::Null)
    };
    let mode = |m: &str| find("graceful-delete-collision", m);
    let (bare, gg, guard) = (mode("bare"), mode("graceguard"), mode("guard"));
    assert_eq!(bare["creates"], 7);
    assert_eq!(bare["already_exists"], 7);
    assert_eq!(bare["leaked_quota_charges"], 7, "{bare}");
    assert_eq!(gg["already_exists"], 7);
    assert_eq!(gg["leaked_quota_charges"], 0, "{gg}");
    assert_eq!(guard["creates"], 1, "{guard}");
    assert_eq!(guard["creates_while_terminating"], 0, "{guard}");
    assert_eq!(guard["attempts_burned"], 0, "{guard}");
    assert_eq!(guard["leaked_quota_charges"], 0, "{guard}");
    let pre = runs
        .iter()
        .find(|r| r["scenario"] == "preemption")
        .cloned()
        .unwrap_or(Value::Null);
    assert_eq!(pre["disruption_label"], "PreemptionByScheduler", "{pre}");
    assert_eq!(pre["deletion_audit"]["user"], "alice");
    assert_eq!(pre["deletion_audit"]["grace_period_seconds"], 45);

    // A PVC held by pvc-protection: each colliding Create charges a claim and
    // its storage without graceguard, nothing with it.
    let (pvc_bare, pvc_gg) = (
        find("pvc-collision", "bare"),
        find("pvc-collision", "graceguard"),
    );
    assert_eq!(pvc_bare["already_exists"], 5, "{pvc_bare}");
    assert_eq!(pvc_bare["leaked_pvcs"], 5, "{pvc_bare}");
    assert_eq!(pvc_bare["leaked_storage_gi"], 5, "{pvc_bare}");
    assert_eq!(pvc_gg["already_exists"], 5, "{pvc_gg}");
    assert_eq!(pvc_gg["leaked_pvcs"], 0, "{pvc_gg}");
    assert_eq!(pvc_gg["leaked_storage_gi"], 0, "{pvc_gg}");

    // The Airflow seed: the naive adopter re-patches its whole adopted set on
    // every sync (2 + 4 + ... + 100 = 2,550 PATCHes); the guard's adopter
    // claims and marks each pod once (200, plus a conditional write retried
    // when another writer touched the pod in between), each result once.
    let (naive, guarded) = (find("airflow-seed", "naive"), find("airflow-seed", "guard"));
    assert_eq!(naive["patches"], 2550, "{naive}");
    let p = guarded["patches"].as_u64().unwrap_or(0);
    assert!((200..300).contains(&p), "{guarded}");
    assert_eq!(guarded["delivered"], 100, "{guarded}");
    assert_eq!(guarded["delivered_distinct"], 100, "{guarded}");

    // With Airflow's own executor: 10.18.0 re-patches adopted pods every
    // sync; 10.25.0 with two schedulers at once adopts pods twice;
    // graceguard's executor (integrations/airflow) once.
    let row = |name: &str| {
        runs.iter()
            .find(|r| r["row"] == name)
            .cloned()
            .unwrap_or(Value::Null)
    };
    let (old, new, ours) = (
        row("airflow-10.18.0"),
        row("airflow-10.25.0"),
        row("airflow-graceguard"),
    );
    assert!(
        old["max_patches_of_a_pod"].as_u64().unwrap_or(0) > 10,
        "{old}"
    );
    assert!(new["adopted_twice"].as_u64().unwrap_or(0) > 0, "{new}");
    assert_eq!(ours["adopted_twice"], 0, "{ours}");
    assert_eq!(ours["executors"], 2, "{ours}");

    let scenario = |s: &str| runs.iter().find(|r| r["scenario"] == s).cloned();
    // The Flyte seed with a real preemption on a real node (the kubelet
    // terminates the victim): the naive loop leaks one pod of quota per lap
    // (read from the real quota controller's status), not with the webhook,
    // and the guard creates nothing while the pod terminates.
    let (bare, gg, guard) = (
        find("flyte-seed", "bare"),
        find("flyte-seed", "graceguard"),
        find("flyte-seed", "guard"),
    );
    for r in [&bare, &gg, &guard] {
        assert_eq!(r["kubelet"], "real", "{r}");
    }
    assert_eq!(bare["still_terminating_after"], true, "{bare}");
    assert_eq!(bare["already_exists"], 7, "{bare}");
    assert_eq!(bare["leaked_quota_charges"], 7, "{bare}");
    assert_eq!(gg["already_exists"], 7, "{gg}");
    assert_eq!(gg["leaked_quota_charges"], 0, "{gg}");
    assert_eq!(guard["creates_while_terminating"], 0, "{guard}");
    assert_eq!(guard["leaked_quota_charges"], 0, "{guard}");
    assert_eq!(guard["attempts_burned"], 0, "{guard}");
    let s = scenario("scheduler-preemption").unwrap_or(Value::Null);
    assert_eq!(s["tagged"], true, "{s}");
    // The scheduler's DELETE is audited, as the scheduler's. A loaded CI run
    // saw two such records, both before graceguard's index showed the pod
    // terminating: the scheduler sending its DELETE again, or the API
    // server calling the webhook again after a connection error (not told
    // apart: that bed's logs were not kept).
    assert!(s["delete_audit_records"].as_u64() >= Some(1), "{s}");
    assert_eq!(s["deleted_by"], "system:kube-scheduler", "{s}");
    let d = scenario("drain").unwrap_or(Value::Null);
    assert_eq!(d["kubelet"], "real", "{d}");
    assert_eq!(d["drain_completed"], true, "{d}");
    assert_eq!(d["pods"], 3, "{d}");
    assert_eq!(d["tagged"], 3, "{d}");
    assert_eq!(d["eviction_audit_records"], 3, "{d}");
    // The client-go executor per mode: no quota leak in any; conflict storms,
    // adaptive sends at most 10 Creates for the graceful deletion.
    let storm: Vec<&Value> = runs
        .iter()
        .filter(|r| r["scenario"] == "flyte-seed-client-go")
        .collect();
    assert_eq!(storm.len(), 3, "{storm:?}");
    for r in &storm {
        assert_eq!(r["kubelet"], "real", "{r}");
        assert_eq!(r["quota_used"], 1, "{r}");
        assert_eq!(r["attempts"], 2, "{r}");
    }
    let relaunch = |m: &str| {
        storm
            .iter()
            .find(|r| r["mode"] == m)
            .and_then(|r| r["relaunch_pod_creates"].as_u64())
            .unwrap_or(0)
    };
    assert!(relaunch("conflict") >= 20, "{storm:?}");
    assert!(
        (3..=scenarios::storm::ADAPTIVE_RELAUNCH_MAX).contains(&relaunch("adaptive")),
        "{storm:?}"
    );
    Ok(())
}
