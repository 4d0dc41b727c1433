//! The audit log never holds up admission: with the webhook's stdout stalled
//! (a pipe nobody reads, as a stuck log pipeline), reviews keep being
//! answered; the records that cannot be written are dropped and counted.
//! And graceguard's decisions reach the API server's own audit log, the
//! trail no pod can write to.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use testbed::load::loadgen;
use testbed::pods::{self, CreateOutcome};
use testbed::webhook::{Hook, WebhookProcess};
use testbed::{TestBed, TestBedOptions};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceguards_decisions_are_in_the_api_servers_own_audit_log() -> anyhow::Result<()> {
    let bed = TestBed::start_with(TestBedOptions {
        audit: true,
        ..Default::default()
    })
    .await?;
    let webhook = WebhookProcess::start(&bed, &[]).await?;
    webhook
        .register(&bed, &[Hook::CollisionGuard, Hook::DeletionAudit])
        .await?;
    let ns = bed.namespace("trail").await?;
    let api: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);
    // Bound to a node with no kubelet: its graceful deletion stays pending.
    let pod = pods::task_pod("held", 60);
    assert_eq!(pods::create(&api, &pod).await?, CreateOutcome::Created);
    pods::delete_gracefully(&api, "held", None).await?;
    assert!(pods::create(&api, &pod).await?.is_already_exists());

    // The API server writes each webhook's auditAnnotations under the
    // webhook's name, on the event of the request it reviewed.
    let annotated =
        |verb: &str, code: u16, key: &str| -> anyhow::Result<Option<(String, String)>> {
            let events = bed.audit_log()?.events()?;
            Ok(events
                .iter()
                .filter(|e| e.is(verb, "pods", &ns) && e.stage == "ResponseComplete")
                .filter(|e| e.object_ref.as_ref().is_some_and(|o| o.name == "held"))
                .filter(|e| e.response_status.as_ref().is_some_and(|s| s.code == code))
                .find_map(|e| {
                    Some((
                        e.annotations.get(&format!("{key}/decision"))?.clone(),
                        e.annotations.get(&format!("{key}/reason"))?.clone(),
                    ))
                }))
        };
    let deadline = Instant::now() + Duration::from_secs(30);
    let (denied, deleted) = loop {
        let denied = annotated("create", 409, "collision-guard.graceguard.io")?;
        let deleted = annotated("delete", 200, "deletion-audit.graceguard.io")?;
        if (denied.is_some() && deleted.is_some()) || Instant::now() > deadline {
            break (denied, deleted);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(
        denied,
        Some(("deny".to_string(), "terminating".to_string())),
        "the denied Create's event"
    );
    let (decision, reason) = deleted.unwrap_or_default();
    assert_eq!(decision, "allow", "the audited deletion's event");
    assert!(!reason.is_empty(), "the deletion's reason");
    // The first Create's event: allowed, the name free.
    assert_eq!(
        annotated("create", 201, "collision-guard.graceguard.io")?,
        Some(("allow".to_string(), "name_free".to_string()))
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_stdout_never_stalls_admission_and_dropped_records_are_counted(
) -> anyhow::Result<()> {
    let bed = TestBed::start().await?;
    let webhook = WebhookProcess::start_with_stalled_stdout(
        &bed,
        &[],
        &[("GRACEGUARD_LOG_BUFFER_LINES", "64")],
    )
    .await?;
    let target = webhook.target("/validate/pods")?;
    let bodies = Arc::new(loadgen::review_bodies(0)?);
    // A writer that waited for stdout would stop answering after a few
    // hundred records (a 64 KiB pipe plus 64 buffered lines): this would never
    // end. The bound below is a deadline for a hang, not a speed target.
    let n = 2000;
    let stats = tokio::time::timeout(
        Duration::from_secs(240),
        loadgen::send_n(&target, bodies, n, 2),
    )
    .await
    .map_err(|_| {
        anyhow::anyhow!("admission stalled behind the log: {n} reviews not answered in 240 s")
    })??;
    assert_eq!(stats.errors, 0, "every review answered allowed");
    assert_eq!(stats.micros.len(), n);
    let dropped = webhook
        .metric("graceguard_audit_records_dropped_total")?
        .unwrap_or(0.0);
    assert!(
        dropped > 0.0,
        "records that could not be written are counted: {dropped}"
    );
    assert!(dropped < n as f64 + 100.0, "{dropped}");
    Ok(())
}
