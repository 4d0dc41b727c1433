//! The collision guard against a real kube-apiserver: the webhook runs as its
//! own process on loopback, registered by URL with failurePolicy Ignore.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Patch, PatchParams};
use kube::{Api, ResourceExt};
use scenarios::objects;
use scenarios::scenario::{graceful_delete_collision, POD};
use testbed::kubelet::{Kubelet, KubeletOptions};
use testbed::pods::{self, CreateOutcome};
use testbed::webhook::{Hook, WebhookProcess};
use testbed::{quota, TestBed, TestBedOptions};

type R = anyhow::Result<()>;

async fn bed_with_webhook(
    args: &[&str],
    audit: bool,
) -> anyhow::Result<(TestBed, WebhookProcess, String)> {
    let bed = TestBed::start_with(TestBedOptions {
        audit,
        ..Default::default()
    })
    .await?;
    let ns = bed.namespace("guard").await?;
    let webhook = WebhookProcess::start(&bed, args).await?;
    webhook.register(&bed, &[Hook::CollisionGuard]).await?;
    Ok((bed, webhook, ns))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn colliding_creates_are_already_exists_and_charge_no_quota() -> R {
    let (bed, webhook, ns) = bed_with_webhook(&[], false).await?;
    let kubelet = Kubelet::start(&bed, KubeletOptions::default()).await?;
    let r = graceful_delete_collision(&bed, &ns, "graceguard", 50, 100).await?;
    assert_eq!(r.already_exists, 50, "{r:?}");
    assert_eq!(r.first_answer_code, 409, "{r:?}");
    assert!(r.first_answer.contains("no quota was charged"), "{r:?}");
    assert!(r.first_answer.contains("is terminating"), "{r:?}");
    assert_eq!(r.leaked_quota_charges, 0, "{r:?}");

    // A Create of another name in the same namespace goes through and is charged once.
    let api: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);
    let before = quota::used_pods(&bed.client, &ns).await?;
    assert_eq!(
        pods::create(&api, &pods::task_pod("other", 30)).await?,
        CreateOutcome::Created
    );
    assert_eq!(quota::used_pods(&bed.client, &ns).await?, before + 1);

    // Once the deletion finishes, the original name is free again.
    let uid = api.get(POD).await?.uid().unwrap_or_default();
    kubelet.finish_deletion(&ns, POD).await?;
    pods::wait_gone(&api, POD, &uid).await?;
    let late_denials = objects::create_once_free(&api, &pods::task_pod(POD, 60)).await?;

    // Every denial was audited with the fields docs/webhook.md documents.
    let denials: Vec<_> = webhook
        .wait_records("collision_guard", &ns, POD, 51 + late_denials as usize)
        .await?
        .into_iter()
        .filter(|r| r["event"] == "admission" && r["decision"] == "deny")
        .collect();
    assert_eq!(denials.len(), 50 + late_denials as usize);
    let d = &denials[0];
    assert_eq!(d["reason"], "terminating");
    assert_eq!(d["user"], "admin");
    assert_eq!(d["dry_run"], false);
    assert_eq!(d["code"], 409);
    assert!(d["latency_us"].as_u64().is_some(), "{d}");
    assert_eq!(
        webhook.metric("graceguard_quota_charges_prevented_total")?,
        Some(50.0 + f64::from(late_denials))
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_quota_full_the_colliding_create_is_409_not_403() -> R {
    let (bed, _webhook, ns) = bed_with_webhook(&[], false).await?;
    let r = graceful_delete_collision(&bed, &ns, "graceguard", 3, 1).await?;
    assert_eq!(r.already_exists, 3, "{r:?}");
    assert_eq!(r.forbidden, 0, "{r:?}");
    assert_eq!(r.first_answer_code, 409, "{r:?}");
    Ok(())
}

fn assert_retry(out: &CreateOutcome, max_left: u32) {
    match out {
        CreateOutcome::Refused {
            code,
            reason,
            retry_after_seconds,
            ..
        } => {
            assert_eq!(*code, 429, "{out:?}");
            assert_eq!(reason, "TooManyRequests", "{out:?}");
            assert!((1..=max_left).contains(retry_after_seconds), "{out:?}");
        }
        other => panic!("expected 429, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_mode_answers_429_with_the_grace_time_left() -> R {
    let (bed, _webhook, ns) = bed_with_webhook(&["--mode", "retry"], false).await?;
    let r = graceful_delete_collision(&bed, &ns, "graceguard-retry", 1, 100).await?;
    assert_eq!(r.first_answer_code, 429, "{r:?}");
    let api: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);
    // The pod was deleted with its 60 s grace: at most 60 s are left.
    assert_retry(&pods::create(&api, &pods::task_pod(POD, 60)).await?, 60);
    assert_eq!(r.leaked_quota_charges, 0, "{r:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_namespace_label_overrides_the_install_wide_mode() -> R {
    let (bed, _webhook, ns) = bed_with_webhook(&[], false).await?;
    let r = graceful_delete_collision(&bed, &ns, "graceguard", 1, 100).await?;
    assert_eq!(r.first_answer_code, 409, "{r:?}");
    let label = serde_json::json!({"metadata": {"labels": {"graceguard.io/mode": "retry"}}});
    Api::<Namespace>::all(bed.client.clone())
        .patch(&ns, &PatchParams::default(), &Patch::Merge(&label))
        .await?;
    // The webhook learns labels through its namespace watch: wait for it.
    let api: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);
    let deadline = Instant::now() + Duration::from_secs(10);
    let out = loop {
        let out = pods::create(&api, &pods::task_pod(POD, 60)).await?;
        if out.code() == 429 || Instant::now() > deadline {
            break out;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_retry(&out, 60);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_webhook_fails_open() -> R {
    let (bed, mut webhook, ns) = bed_with_webhook(&[], false).await?;
    let r = graceful_delete_collision(&bed, &ns, "graceguard", 1, 100).await?;
    assert_eq!(r.leaked_quota_charges, 0, "{r:?}");
    webhook.kill();
    let api: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);
    // New names are still created...
    for i in 0..3 {
        assert_eq!(
            pods::create(&api, &pods::task_pod(&format!("after-{i}"), 30)).await?,
            CreateOutcome::Created
        );
    }
    // ...and a colliding Create gets the API server's own answer (and its quota charge).
    let before = quota::used_pods(&bed.client, &ns).await?;
    let out = pods::create(&api, &pods::task_pod(POD, 60)).await?;
    assert!(out.is_already_exists(), "{out:?}");
    assert!(!format!("{out:?}").contains("graceguard"), "{out:?}");
    assert_eq!(quota::used_pods(&bed.client, &ns).await?, before + 1);
    Ok(())
}

/// Create -> AlreadyExists -> Create ... of `name` at ~12/s for 5 s and at
/// least 40 Creates (a loaded machine answers slower: the count is kept, the
/// loop lasts longer), as flyteorg/flyte#8066 does; every answer must be
/// AlreadyExists. Returns the Creates sent and how long the loop ran.
async fn recreate_loop(api: &Api<Pod>, name: &str) -> anyhow::Result<(usize, Duration)> {
    let start = Instant::now();
    let mut sent = 0;
    while start.elapsed() < Duration::from_secs(5) || sent < 40 {
        let out = pods::create(api, &pods::task_pod(name, 60)).await?;
        assert!(out.is_already_exists(), "{out:?}");
        sent += 1;
        tokio::time::sleep(Duration::from_millis(83)).await;
    }
    Ok((sent, start.elapsed()))
}

/// The confirmation GETs a loop of `took` may cost: one per cache lifetime
/// (1 s) it lasted, the first read and one at a lifetime's edge.
fn gets_allowed(took: Duration) -> usize {
    usize::try_from(took.as_secs())
        .unwrap_or(usize::MAX)
        .saturating_add(3)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_looping_client_is_named_once_and_costs_a_handful_of_gets_whether_its_holder_terminates_or_not(
) -> R {
    let (bed, webhook, ns) = bed_with_webhook(&[], true).await?;
    let r = graceful_delete_collision(&bed, &ns, "graceguard", 1, 100).await?;
    assert_eq!(r.already_exists, 1, "{r:?}");
    let alice = bed.client_as("alice").await?;
    let api: Api<Pod> = Api::namespaced(alice, &ns);
    let (sent, took) = recreate_loop(&api, POD).await?;
    webhook
        .wait_records("collision_guard", &ns, POD, sent + 1)
        .await?;
    let suspects: Vec<_> = webhook
        .audit_records()?
        .into_iter()
        .filter(|r| r["event"] == "livelock_suspected")
        .collect();
    assert_eq!(suspects.len(), 1, "{suspects:?}");
    assert_eq!(suspects[0]["user"], "alice");
    assert_eq!(suspects[0]["name"], POD);
    assert_eq!(
        webhook.metric("graceguard_livelock_suspected_total")?,
        Some(1.0)
    );

    // Confirmation GETs, counted by the API server: about one per second
    // (the cache TTL) per looping client, not one per denial, for a
    // terminating holder as for a live one.
    let gets = |name: &str| {
        bed.audit_log().and_then(|log| {
            log.count(|e| {
                e.is("get", "pods", &ns) && e.name() == name && e.user.username == "graceguard"
            })
        })
    };
    let terminating_gets = gets(POD)?;
    assert!(
        (1..=gets_allowed(took)).contains(&terminating_gets),
        "{terminating_gets} confirmation GETs for {} denials of a terminating holder in {took:?}",
        sent + 1
    );
    // The wrong-denial bound: once the holder is gone (here force-deleted),
    // a Create is denied at most until the read that denied the last one is
    // a TTL (1 s) old, whatever the watch does; past it, the name is free.
    let holder_uid = api.get(POD).await?.metadata.uid.unwrap_or_default();
    let admin: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);
    pods::delete_gracefully(&admin, POD, Some(0)).await?;
    pods::wait_gone(&admin, POD, &holder_uid).await?;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(
        pods::create(&api, &pods::task_pod(POD, 60)).await?,
        CreateOutcome::Created,
        "a Create more than a cache TTL after its holder was gone was not allowed"
    );
    // A live holder: the same.
    let live = "live-holder";
    assert_eq!(
        pods::create(&admin, &pods::task_pod(live, 60)).await?,
        CreateOutcome::Created
    );
    let (live_sent, live_took) = recreate_loop(&api, live).await?;
    webhook
        .wait_records("collision_guard", &ns, live, live_sent + 1)
        .await?;
    let live_gets = gets(live)?;
    assert!(
        (1..=gets_allowed(live_took)).contains(&live_gets),
        "{live_gets} confirmation GETs for {live_sent} denials of a live holder in {live_took:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_turns_readiness_off_keeps_serving_then_exits_cleanly() -> R {
    let (bed, mut webhook, ns) = bed_with_webhook(&["--shutdown-delay", "3s"], false).await?;
    let r = graceful_delete_collision(&bed, &ns, "graceguard", 2, 100).await?;
    assert_eq!(r.leaked_quota_charges, 0, "{r:?}");
    webhook.sigterm();
    // During the delay: not ready (endpoints drop it), but still answering.
    let deadline = Instant::now() + Duration::from_secs(2);
    let (code, body) = loop {
        let (code, body) = webhook.http_get("/readyz")?;
        if code == 503 || Instant::now() > deadline {
            break (code, body);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("shutting down"), "{body}");
    let api: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);
    let out = pods::create(&api, &pods::task_pod(POD, 60)).await?;
    assert_eq!(out.code(), 409, "still denying during the delay: {out:?}");
    let status = webhook.terminate();
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(0),
        "exit status {status:?}"
    );
    let log = std::fs::read_to_string(&webhook.log)?;
    assert!(
        log.contains("shutdown requested") && log.contains("graceguard-webhook stopped"),
        "{log}"
    );
    // Every decision made before the process ended was written out.
    assert_eq!(webhook.records_for("collision_guard", &ns, POD)?.len(), 4);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_serving_certificate_s_expiry_is_exported() -> R {
    let bed = TestBed::start().await?;
    let webhook = WebhookProcess::start(&bed, &[]).await?;
    let expiry = webhook
        .metric("graceguard_certificate_expiry_timestamp_seconds")?
        .unwrap_or(0.0);
    let now = k8s_openapi::jiff::Timestamp::now().as_second() as f64;
    // The test CA signs serving certificates for 365 days.
    let days = (expiry - now) / 86_400.0;
    assert!((364.0..=366.0).contains(&days), "expires in {days} days");
    Ok(())
}

/// Mutual TLS (`--client-ca-file`, `--client-names`): the bed's API server
/// presents its admission client certificate (AdmissionConfiguration
/// `kubeConfigFile`), graceguard answers it, and nothing else gets an answer:
/// no certificate, another CA's, or a certificate the same CA signed for
/// another name (as a cluster CA signs every kubelet's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_client_ca_only_the_api_server_s_certificate_is_answered() -> R {
    use testbed::control_plane::ADMISSION_CLIENT_NAME;
    let bed = TestBed::start().await?;
    let ns = bed.namespace("mtls").await?;
    let ca = bed.ca_file().display().to_string();
    let names = format!("--client-names={ADMISSION_CLIENT_NAME}");
    let webhook = WebhookProcess::start(&bed, &["--client-ca-file", &ca, &names]).await?;
    webhook.register(&bed, &[Hook::CollisionGuard]).await?;

    // Through the API server: graceguard's answers, so its certificate passed.
    let r = graceful_delete_collision(&bed, &ns, "graceguard", 3, 100).await?;
    assert_eq!(r.already_exists, 3, "{r:?}");
    assert!(r.first_answer.contains("no quota was charged"), "{r:?}");
    assert_eq!(r.leaked_quota_charges, 0, "{r:?}");
    // Each record names the sender the handshake proved, not only the user
    // the review claims.
    let recs = webhook.wait_records("collision_guard", &ns, POD, 4).await?;
    assert!(
        recs.len() == 4
            && recs
                .iter()
                .all(|r| r["peer_authenticated"] == "client_certificate"
                    && r["peer_name"] == ADMISSION_CLIENT_NAME
                    && r["peer"] == "127.0.0.1"),
        "{recs:?}"
    );

    // Directly: only the admission client certificate gets an HTTP answer.
    let admission = bed.issue_client(ADMISSION_CLIENT_NAME, "graceguard-test-bed")?;
    assert_eq!(webhook.answer_over_tls(Some(&admission)).await?, Some(400));
    assert_eq!(webhook.answer_over_tls(None).await?, None);
    let kubelet = bed.issue_client("system:node:node-1", "system:nodes")?;
    assert_eq!(webhook.answer_over_tls(Some(&kubelet)).await?, None);
    let other_ca = graceguard_certs::Ca::new("another-ca")?;
    let stranger = other_ca.issue_client(ADMISSION_CLIENT_NAME, "graceguard-test-bed")?;
    assert_eq!(webhook.answer_over_tls(Some(&stranger)).await?, None);
    assert!(
        webhook
            .wait_log_line("refused a client certificate")
            .await?
            >= 1
    );

    // A webhook that wants another name refuses the API server too: its
    // calls fail and Creates fail open (failurePolicy Ignore) to storage,
    // which answers AlreadyExists after quota admission.
    let picky = WebhookProcess::start(
        &bed,
        &["--client-ca-file", &ca, "--client-names=someone-else"],
    )
    .await?;
    Api::<k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration>::all(
        bed.client.clone(),
    )
    .delete("graceguard", &Default::default())
    .await?;
    let how = testbed::webhook::Registration {
        no_wait: true,
        ..Default::default()
    };
    picky
        .register_with(&bed, &[Hook::CollisionGuard], how)
        .await?;
    let api: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);
    let deadline = Instant::now() + Duration::from_secs(30);
    while picky.log_lines_with("refused a client certificate")? == 0 {
        assert!(
            Instant::now() < deadline,
            "the API server never called the new webhook"
        );
        let out = pods::create(&api, &pods::task_pod(POD, 60)).await?;
        match &out {
            CreateOutcome::Refused { code, message, .. } => {
                assert_eq!(*code, 409, "{out:?}");
                assert!(!message.contains("no quota was charged"), "{out:?}");
            }
            other => panic!("expected storage's AlreadyExists, got {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(picky.records_for("collision_guard", &ns, POD)?.is_empty());
    Ok(())
}

/// The pod index fills from a streaming list where the API server serves one
/// (WatchList, on by default from 1.34) and from a paged list where the
/// server refuses it (older versions): either way it is ready only once
/// every pod of the cluster is in it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pod_index_streams_its_initial_list_where_served_and_pages_it_elsewhere() -> R {
    let bed = TestBed::start().await?;
    let ns = bed.namespace("list").await?;
    let api: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);
    for i in 0..30 {
        assert_eq!(
            pods::create(&api, &pods::task_pod(&format!("pre-{i}"), 30)).await?,
            CreateOutcome::Created
        );
    }
    let in_cluster = Api::<Pod>::all(bed.client.clone())
        .list(&Default::default())
        .await?
        .items
        .len();
    for (args, streams) in [
        (
            &["--pod-list-streaming=true"][..],
            bed.version.has(testbed::Feature::StreamingLists),
        ),
        (
            &["--pod-list-streaming=false", "--pod-list-page-size=7"][..],
            false,
        ),
    ] {
        let webhook = WebhookProcess::start(&bed, args).await?;
        // Ready means listed: every pod of the cluster is indexed at once.
        let indexed = webhook.metric("graceguard_index_pods")?.unwrap_or(0.0);
        assert!(
            indexed >= in_cluster as f64,
            "{args:?}: {indexed} of {in_cluster} pods indexed when ready"
        );
        let fell_back = webhook.log_lines_with("does not serve streaming lists")? > 0;
        assert_eq!(
            fell_back,
            args[0].ends_with("true") && !streams,
            "{args:?} on {}",
            bed.version.as_str()
        );
    }
    Ok(())
}
