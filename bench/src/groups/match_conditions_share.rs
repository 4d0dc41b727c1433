//! `match_conditions_share`: the share of pod status writes that reach the tagger past its matchConditions.

use crate::prelude::*;

/// Kubernetes >= 1.30 with the chart's `matchConditions`: which pod writes
/// still reach graceguard. A workload shaped like a cluster's: half the pods
/// named by a client, half by `generateName` (controllers); each gets three
/// ordinary status updates from its node's kubelet, every tenth a
/// `DisruptionTarget` as well; then each is deleted.
pub(crate) async fn match_conditions_share(n: usize) -> Result<()> {
    let bed = TestBed::start().await?;
    let webhook = WebhookProcess::start(&bed, &[]).await?;
    let hooks = [
        Hook::CollisionGuard,
        Hook::DisruptionTagger,
        Hook::DeletionAudit,
    ];
    webhook
        .register_with(
            &bed,
            &hooks,
            Registration {
                match_conditions: true,
                ..Default::default()
            },
        )
        .await?;
    let ns = bed.namespace("share").await?;
    let api: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);
    let node: Api<Pod> = Api::namespaced(bed.client_as(pods::NODE).await?, &ns);
    let (mut creates, mut updates, mut deletes) = (0usize, 0usize, 0usize);
    let mut names = Vec::new();
    for i in 0..n {
        let mut p = pods::task_pod(&format!("named-{i}"), 0);
        if i % 2 == 1 {
            p.metadata.name = None;
            p.metadata.generate_name = Some("generated-".into());
        }
        let created = api.create(&PostParams::default(), &p).await?;
        creates += 1;
        names.push(created.metadata.name.unwrap_or_default());
    }
    for (i, name) in names.iter().enumerate() {
        for k in 0..3 {
            let st = json!({"status": {"phase": "Running", "message": format!("heartbeat {k}")}});
            node.patch_status(name, &PatchParams::default(), &Patch::Merge(&st))
                .await?;
            updates += 1;
        }
        if i % 10 == 0 {
            let st = json!({"status": {"conditions": [{"type": "DisruptionTarget", "status": "True",
                "reason": "TerminationByKubelet", "message": "bench", "lastTransitionTime": now_rfc3339()}]}});
            node.patch_status(name, &PatchParams::default(), &Patch::Strategic(&st))
                .await?;
            updates += 1;
        }
    }
    for name in &names {
        api.delete(
            name,
            &DeleteParams {
                grace_period_seconds: Some(0),
                ..Default::default()
            },
        )
        .await?;
        deletes += 1;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let records = webhook.audit_records()?;
    // Distinct values of `field` among the records of `endpoint`: calls by
    // request uid; deletes by pod name, since the API server validates one
    // DELETE again (a new call) whenever its cached copy of the pod was stale.
    let distinct = |endpoint: &str, field: &str| {
        records
            .iter()
            .filter(|r| {
                r["namespace"] == ns.as_str()
                    && r["endpoint"] == endpoint
                    && r["event"] == "admission"
            })
            .filter_map(|r| r[field].as_str())
            .collect::<std::collections::BTreeSet<_>>()
            .len()
    };
    let (rc, ru, rd) = (
        distinct(Hook::CollisionGuard.endpoint(), "request_uid"),
        distinct(Hook::DisruptionTagger.endpoint(), "request_uid"),
        distinct(Hook::DeletionAudit.endpoint(), "name"),
    );
    let delete_calls = distinct(Hook::DeletionAudit.endpoint(), "request_uid");
    let writes = creates + updates + deletes;
    let share = (rc + ru + rd) as f64 / writes as f64;
    emit(
        json!({"group": "match_conditions_share", "pods": n, "writes": writes, "reached": rc + ru + rd, "share": round3(share),
        "creates": creates, "creates_reached": rc, "status_updates": updates, "status_updates_reached": ru,
        "deletes": deletes, "deletes_reached": rd, "delete_calls": delete_calls}),
    );
    table(format!(
        "match_conditions_share  {writes} pod writes, {} reached graceguard ({:.0}%): creates {rc}/{creates}, status updates {ru}/{updates}, deletes {rd}/{deletes} (in {delete_calls} calls: the API server re-validates a DELETE whose cached pod was stale)",
        rc + ru + rd,
        share * 100.0
    ));
    Ok(())
}
