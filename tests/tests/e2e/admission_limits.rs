//! The admission port's per-address caps against the API server itself:
//! the API server sends every review from one address, so a cap meant for
//! "one client" would refuse its reviews once it sends more at once than
//! the cap (a re-create storm on a loaded API server), and under the chart's
//! `failurePolicy: Ignore` those Creates would pass unguarded and unaudited.
//! The API server named in `--trusted-peers` is never held to them.

use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use testbed::pods::{self, CreateOutcome};
use testbed::webhook::{Hook, WebhookProcess};
use testbed::TestBed;

type R = anyhow::Result<()>;

/// Creates that the API server sends at once in one burst.
const BURST: usize = 64;

/// Sends `BURST` Creates of new names at once; returns how many were created.
async fn burst(api: &Api<Pod>, round: usize) -> anyhow::Result<usize> {
    let creates = (0..BURST).map(|i| {
        let api = api.clone();
        async move {
            let pod = pods::task_pod_on(&format!("b{round}-{i}"), 1, None);
            pods::create(&api, &pod).await
        }
    });
    let outcomes = futures::future::join_all(creates).await;
    let mut created = 0;
    for o in outcomes {
        if o? == CreateOutcome::Created {
            created += 1;
        }
    }
    Ok(created)
}

fn share_refusals(webhook: &WebhookProcess) -> anyhow::Result<f64> {
    Ok(webhook
        .metric("graceguard_admission_limited_total{limit=\"per_client_share\"}")?
        .unwrap_or(0.0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_servers_reviews_are_never_refused_by_a_per_address_cap() -> R {
    let bed = TestBed::start().await?;
    // A cap of one review at a time per address, so a burst of a few dozen
    // Creates overlaps at the webhook even on two shared cores.
    let capped = WebhookProcess::start(&bed, &["--max-in-flight-per-client=1"]).await?;
    capped.register(&bed, &[Hook::CollisionGuard]).await?;
    let ns = bed.namespace("capped").await?;
    let api: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);
    // Without trust the API server is one address like any other: its
    // overlapping reviews are refused (503) and the Creates pass unreviewed.
    let mut round = 0;
    while share_refusals(&capped)? == 0.0 {
        anyhow::ensure!(
            round < 10,
            "{round} bursts of {BURST} Creates never overlapped at the webhook: the control shows nothing"
        );
        assert_eq!(burst(&api, round).await?, BURST);
        round += 1;
    }
    let reviewed: Vec<_> = capped
        .audit_records()?
        .into_iter()
        .filter(|r| r["namespace"] == ns.as_str())
        .collect();
    assert!(
        reviewed.len() < round * BURST,
        "refused reviews leave no record"
    );
    // Nothing proves who sent those: an untrusted address.
    assert!(
        reviewed
            .iter()
            .all(|r| r["peer"] == "127.0.0.1" && r["peer_authenticated"] == "no"),
        "{:?}",
        reviewed.first()
    );

    // The same cap, with the API server's address trusted.
    Api::<ValidatingWebhookConfiguration>::all(bed.client.clone())
        .delete("graceguard", &Default::default())
        .await?;
    let trusted = WebhookProcess::start(
        &bed,
        &["--max-in-flight-per-client=1", "--trusted-peers=127.0.0.1"],
    )
    .await?;
    trusted.register(&bed, &[Hook::CollisionGuard]).await?;
    let ns = bed.namespace("trusted").await?;
    let api: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);
    const ROUNDS: usize = 5;
    for round in 0..ROUNDS {
        assert_eq!(burst(&api, round).await?, BURST);
    }
    assert_eq!(share_refusals(&trusted)?, 0.0, "a trusted review refused");
    // Every Create was reviewed and audited, each record naming the sender
    // as the connection showed it.
    let records = trusted
        .wait_matching(ROUNDS * BURST, |r| {
            r["namespace"] == ns.as_str() && r["endpoint"] == "collision_guard"
        })
        .await?;
    assert_eq!(records.len(), ROUNDS * BURST);
    assert!(
        records
            .iter()
            .all(|r| r["peer"] == "127.0.0.1" && r["peer_authenticated"] == "trusted_address"),
        "{:?}",
        records.first()
    );
    Ok(())
}

/// Connections end by themselves: an idle one after
/// `--connection-idle-timeout`, any after `--max-connection-age`, both
/// gracefully (HTTP/2 GOAWAY). Through the real API server, reviews keep
/// flowing across those ends: every Create is reviewed and admitted, and the
/// API server never fails open on a call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_and_old_connections_end_gracefully_and_no_review_is_lost() -> R {
    let bed = TestBed::start().await?;
    let webhook = WebhookProcess::start(
        &bed,
        &["--connection-idle-timeout=1s", "--max-connection-age=4s"],
    )
    .await?;
    webhook.register(&bed, &[Hook::CollisionGuard]).await?;
    let ns = bed.namespace("lifetime").await?;
    let api: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);
    let ended = |reason: &str| -> anyhow::Result<f64> {
        Ok(webhook
            .metric(&format!(
                "graceguard_connections_ended_total{{reason=\"{reason}\"}}"
            ))?
            .unwrap_or(0.0))
    };
    let mut created = 0usize;
    let mut create = |name: String| {
        let api = api.clone();
        created += 1;
        async move {
            let pod = pods::task_pod_on(&name, 1, None);
            assert_eq!(pods::create(&api, &pod).await?, CreateOutcome::Created);
            anyhow::Ok(())
        }
    };
    // Creates one after another for 6 s: never quiet for 1 s, so the
    // connection in use reaches its age (at most 4.4 s) while busy.
    let until = std::time::Instant::now() + Duration::from_secs(6);
    let mut i = 0;
    while std::time::Instant::now() < until {
        create(format!("busy-{i}")).await?;
        i += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Quiet for 6 s: every connection has ended (idle after 1 s, or by age).
    // Then one Create, on a new connection, and quiet again: it ends idle
    // after 1 s, well before its age.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let idle_before = ended("idle")?;
    create("alone".into()).await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        ended("max_age")? >= 1.0,
        "no connection reached its age limit"
    );
    assert!(
        ended("idle")? > idle_before,
        "the connection of the lone Create was not closed when idle"
    );
    let metrics = bed.apiserver_metrics().await?;
    let failed_open =
        testbed::load::histogram::sum(&metrics, "apiserver_admission_webhook_fail_open_count", &[]);
    assert_eq!(
        failed_open, 0.0,
        "the API server failed open on a call while connections ended"
    );
    // Records are written off the admission path: wait for them to land.
    let reviewed = webhook
        .wait_matching(created, |r| {
            r["namespace"] == ns.as_str() && r["endpoint"] == "collision_guard"
        })
        .await?
        .len();
    assert_eq!(reviewed, created, "every Create reviewed once");
    Ok(())
}
