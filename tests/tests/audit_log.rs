//! The audit log never holds up admission: with the webhook's stdout stalled
//! (a pipe nobody reads, as a stuck log pipeline), reviews keep being
//! answered; the records that cannot be written are dropped and counted.

use std::sync::Arc;
use std::time::Duration;

use testbed::bench::loadgen;
use testbed::webhook::WebhookProcess;
use testbed::TestBed;

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
