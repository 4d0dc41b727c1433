//! `scripts/demo --json`, end to end: the numbers it prints come from the API
//! server, and they must show the leak without graceguard and none with it.

use std::process::Command;

use serde_json::Value;

#[test]
fn the_demo_shows_the_leak_bare_and_none_with_graceguard_or_the_guard() -> anyhow::Result<()> {
    let out = Command::new(env!("CARGO_BIN_EXE_graceguard-demo"))
        .args(["--json", "--creates", "7"])
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
    let mode = |m: &str| {
        runs.iter()
            .find(|r| r["scenario"] == "graceful-delete-collision" && r["mode"] == m)
            .cloned()
            .unwrap_or(Value::Null)
    };
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
    Ok(())
}
