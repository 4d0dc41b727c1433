//! `guard_recovery`: the guard's requests and delay across a disrupted attempt.

use crate::prelude::*;

/// The guard's recovery from a graceful delete: API requests by verb (from the
/// apiserver audit log) and the delay from the old pod's disappearance to the
/// next attempt's Create.
pub(crate) async fn guard_recovery() -> Result<()> {
    let bed = TestBed::start_with(TestBedOptions {
        audit: true,
        ..Default::default()
    })
    .await?;
    let ns = bed.namespace("recovery").await?;
    let kubelet = Kubelet::start(&bed, KubeletOptions::default()).await?;
    let alice = bed.client_as("alice").await?;
    let mut task = RunningTask::start(alice, spec("train", &ns), pods::task_pod("template", 30));
    let minute = Duration::from_secs(60);
    task.wait_for(minute, |t| t.phase == "Running" && t.attempt == 0)
        .await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let api: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);
    let mark = bed.audit_log()?.events()?.len();
    pods::delete_gracefully(&api, "train-0", None).await?;
    task.wait_for(minute, |t| t.phase == "ShuttingDown").await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    kubelet.finish_deletion(&ns, "train-0").await?;
    task.wait_for(minute, |t| t.phase == "Running" && t.attempt == 1)
        .await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let events = bed.audit_log()?.events()?;
    let after = &events[mark.min(events.len())..];
    let mut by_verb: BTreeMap<String, u64> = BTreeMap::new();
    for e in after.iter().filter(|e| e.user.username == "alice") {
        let key = match &e.object_ref {
            Some(o) if !o.subresource.is_empty() => {
                format!("{}:{}/{}", e.verb, o.resource, o.subresource)
            }
            Some(o) => format!("{}:{}", e.verb, o.resource),
            None => e.verb.clone(),
        };
        *by_verb.entry(key).or_default() += 1;
    }
    let creates = after
        .iter()
        .filter(|e| e.is("create", "pods", &ns) && e.user.username == "alice")
        .count();
    // The simulated kubelet's finishing delete, sent as its node.
    let gone = after
        .iter()
        .filter(|e| {
            e.is("delete", "pods", &ns)
                && e.name() == "train-0"
                && e.user.username == "system:node:node-1"
        })
        .filter_map(|e| e.completed_us())
        .next_back();
    let created = after
        .iter()
        .find(|e| e.is("create", "pods", &ns) && e.name() == "train-1")
        .and_then(|e| e.received_us());
    let delay_ms = match (gone, created) {
        (Some(g), Some(c)) => (c - g) as f64 / 1000.0,
        _ => bail!("could not find the finishing delete and the next Create in the audit log"),
    };
    kubelet.end_pod(&ns, "train-1", Terminal::Succeeded).await?;
    task.finish(minute).await?;
    emit(
        json!({"group": "guard_recovery", "creates": creates, "requests_by_verb": by_verb, "delay_ms": round3(delay_ms),
        "note": "alice's requests from the graceful delete of attempt 0 until attempt 1 ran; delay from the finishing delete's completion to the next Create's arrival (apiserver audit timestamps)"}),
    );
    table(format!("guard_recovery  {creates} Create(s); {delay_ms:.1} ms from the old pod gone to the next Create; requests: {by_verb:?}"));
    Ok(())
}
