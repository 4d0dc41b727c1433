//! graceguard while its own cluster is upgraded one minor, on a real node:
//! the control plane first (kube-apiserver, then kube-controller-manager and
//! kube-scheduler, from the previous supported minor to the one
//! `GRACEGUARD_KUBE` names), then the node's kubelet, the order the version
//! skew policy allows (a kubelet may lag the API server, never lead it).
//! Throughout, a client keeps creating and deleting pods and the real kubelet
//! keeps running them, with graceguard registered as the chart registers it.
//!
//! It needs the previous minor built too, so `scripts/matrix` runs this
//! binary once, on the newest minor, after every minor's pass (`scripts/test`
//! builds only the oldest and the newest: docs/testbed.md).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::PostParams;
use kube::{Api, ResourceExt};
use testbed::balancer::{Balancer, ReadyCheck};
use testbed::control_plane::client_from;
use testbed::pods::{self, CreateOutcome};
use testbed::webhook::WebhookProcess;
use testbed::{KubeVersion, TestBed, TestBedOptions};

type R = anyhow::Result<()>;

/// What the looping client saw.
#[derive(Debug, Default)]
struct Tally {
    /// Pods it asked for, and how many the API server created.
    asked: u32,
    created: u32,
    /// Attempts that never reached an API server (it was restarting) and
    /// were sent again, as client-go retries them.
    resent: u32,
    /// Every answer from an API server that was not a Create: none may come.
    refused: Vec<String>,
}

fn task(image: &str, name: &str, grace: i64, script: &str) -> Pod {
    let mut pod = pods::task_pod(name, grace);
    pods::run_in(&mut pod, image, script);
    pod
}

/// Creates `w-0`, `w-1`, ... every 300 ms until `stop`, keeping the newest
/// four and deleting older ones gracefully; sends a Create again when it
/// never reached a server (a restart), and takes `AlreadyExists` on such a
/// second try as the first one having landed.
async fn looping_client(api: Api<Pod>, image: String, stop: Arc<AtomicBool>) -> Tally {
    let mut t = Tally::default();
    let mut live: VecDeque<String> = VecDeque::new();
    let mut i = 0u32;
    while !stop.load(Ordering::SeqCst) {
        let name = format!("w-{i}");
        i += 1;
        t.asked += 1;
        let pod = task(&image, &name, 1, "sleep 3600");
        let started = Instant::now();
        let mut resent = false;
        loop {
            match api.create(&PostParams::default(), &pod).await {
                Ok(_) => {
                    t.created += 1;
                    break;
                }
                Err(kube::Error::Api(s)) if resent && s.reason == "AlreadyExists" => {
                    t.created += 1;
                    break;
                }
                Err(kube::Error::Api(s)) => {
                    t.refused
                        .push(format!("{name}: {} {} {}", s.code, s.reason, s.message));
                    break;
                }
                Err(e) if started.elapsed() < Duration::from_secs(120) => {
                    let _ = e;
                    t.resent += 1;
                    resent = true;
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                Err(e) => {
                    t.refused
                        .push(format!("{name}: no API server answered for 120 s: {e}"));
                    break;
                }
            }
        }
        live.push_back(name);
        while live.len() > 4 {
            if let Some(old) = live.pop_front() {
                // A deletion that did not reach a server is sent again on the next round.
                if pods::delete_gracefully(&api, &old, Some(1)).await.is_err() {
                    live.push_front(old);
                    break;
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    t
}

/// graceguard still guards: a graceful deletion's name is refused by the
/// webhook while the pod terminates (its container traps SIGTERM for 4 s),
/// and a Create of it succeeds once the kubelet has deleted it.
async fn collision_guarded(
    api: &Api<Pod>,
    webhook: &WebhookProcess,
    ns: &str,
    image: &str,
    name: &str,
) -> R {
    let pod = task(image, name, 30, &pods::graceful_script(4, 0));
    assert_eq!(
        pods::create(api, &pod).await?,
        CreateOutcome::Created,
        "{name}"
    );
    pods::wait_running(api, name).await?;
    let uid = api.get(name).await?.uid().unwrap_or_default();
    pods::delete_gracefully(api, name, None).await?;
    let again = pods::create(api, &pod).await?;
    assert!(
        again.is_already_exists(),
        "{name} while terminating: {again:?}"
    );
    // The allowed Create and the denied one; the audit log is written a
    // moment after each answer.
    let records = webhook.wait_records("collision_guard", ns, name, 2).await?;
    let denials = records.iter().filter(|r| r["decision"] == "deny").count();
    assert_eq!(
        denials, 1,
        "graceguard denied {name}'s Create once: {records:?}"
    );
    pods::wait_gone(api, name, &uid).await?;
    assert_eq!(
        pods::create(api, &pod).await?,
        CreateOutcome::Created,
        "{name} once the kubelet deleted it"
    );
    pods::delete_gracefully(api, name, Some(0)).await?;
    Ok(())
}

/// The kubelet's reported version, once it is `want`.
async fn wait_kubelet_version(bed: &TestBed, node: &str, want: &str) -> R {
    let nodes: Api<Node> = Api::all(bed.client.clone());
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let has = nodes
            .get(node)
            .await?
            .status
            .and_then(|s| s.node_info)
            .map(|i| i.kubelet_version)
            .unwrap_or_default();
        if has == want {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "node {node} still reports kubelet {has:?} 120 s after its upgrade to {want}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceguard_keeps_working_while_its_cluster_is_upgraded_one_minor() -> R {
    let to = KubeVersion::from_env()?;
    let from = to.previous().with_context(|| {
        format!(
            "an upgrade to {to} needs the minor before it, and {to} is the oldest supported; run this test with GRACEGUARD_KUBE set to a newer minor"
        )
    })?;
    let mut bed = TestBed::start_with(TestBedOptions {
        audit: true,
        real_nodes: 1,
        version: Some(from),
        ..Default::default()
    })
    .await?;
    let ns = bed.namespace("upgrade").await?;
    let webhook = WebhookProcess::start(&bed, &[]).await?;
    webhook.register_as_the_chart_does(&bed).await?;
    // The user reaches the API server as users of a production control
    // plane do: through a load balancer that health-checks it (`/readyz`).
    let admin = bed.client.clone();
    let ready: ReadyCheck = std::sync::Arc::new(move || {
        let admin = admin.clone();
        Box::pin(async move {
            match http::Request::get("/readyz").body(Vec::new()) {
                Ok(req) => admin.request_text(req).await.is_ok_and(|t| t == "ok"),
                Err(_) => false,
            }
        })
    });
    let backend = bed.url.trim_start_matches("https://").parse()?;
    let lb = Balancer::ready_only(backend, ready).await?;
    let alice = client_from(&bed.kubeconfig_via("alice", &format!("https://{}", lb.addr))?).await?;
    let api: Api<Pod> = Api::namespaced(alice, &ns);
    let image = bed.task_image()?;
    let node = pods::NODE;
    wait_kubelet_version(&bed, node, from.as_str()).await?;

    let stop = Arc::new(AtomicBool::new(false));
    let client = tokio::spawn(looping_client(api.clone(), image.clone(), stop.clone()));

    // All on the old minor.
    collision_guarded(&api, &webhook, &ns, &image, "before").await?;
    // The control plane, one component at a time; the kubelet lags it.
    bed.upgrade_control_plane(to).await?;
    collision_guarded(&api, &webhook, &ns, &image, "skewed").await?;
    // Then the node.
    let admin = bed.client.clone();
    bed.nodes
        .as_mut()
        .context("the bed has no real nodes")?
        .upgrade_kubelet(&admin, node, to)
        .await?;
    wait_kubelet_version(&bed, node, to.as_str()).await?;
    collision_guarded(&api, &webhook, &ns, &image, "after").await?;

    stop.store(true, Ordering::SeqCst);
    let tally = client.await?;
    // No failed Create: every pod the client asked for was created.
    assert!(tally.refused.is_empty(), "{tally:?}");
    assert_eq!(tally.created, tally.asked, "{tally:?}");
    assert!(tally.asked >= 20, "the client kept going: {tally:?}");
    // No wrong denial: graceguard denied only the three terminating names.
    let wrong: Vec<_> = webhook
        .audit_records()?
        .into_iter()
        .filter(|r| r["endpoint"] == "collision_guard" && r["decision"] == "deny")
        .filter(|r| !["before", "skewed", "after"].contains(&r["name"].as_str().unwrap_or("")))
        .collect();
    assert!(wrong.is_empty(), "denials of free names: {wrong:?}");
    // The kubelet ran the client's pods throughout: the newest are Running.
    for i in tally.asked.saturating_sub(3)..tally.asked {
        pods::wait_running(&api, &format!("w-{i}")).await?;
    }
    // No kubelet request refused during the skew (or before or after): every
    // one of the node's requests the API servers answered, answered without
    // an error. Answers a kubelet expects are not refusals: 404 for an
    // object already gone, 409 for an optimistic-concurrency conflict, and
    // the Node authorizer's 403 for a read (get, list, watch) of an object
    // its graph does not (or no longer) bind to the node (a pod just created
    // or just deleted: the graph follows the watch), which happens with or
    // without graceguard. Nor is a request the kubelet itself abandoned: the
    // old kubelet, stopped for its upgrade, cancels what it had in flight,
    // which the API server audits as a 504 or a 500 "context canceled" (a
    // pod GET of its status manager at the very moment it stopped, seen in
    // CI on a17c827), or as a 500 "client disconnected" (an event it was
    // posting, seen in a loaded run). A slow webhook would show as the
    // kubelet's own deadline ("context deadline exceeded"), which counts.
    let events = bed.audit_log()?.events()?;
    let mine: Vec<_> = events
        .iter()
        .filter(|e| e.user.username == format!("system:node:{node}"))
        .collect();
    assert!(
        mine.len() > 50,
        "the kubelet's requests are in the audit log: {}",
        mine.len()
    );
    let graph_lag = |e: &testbed::audit_log::AuditEvent| {
        ["get", "list", "watch"].contains(&e.verb.as_str())
            && e.annotations
                .get("authorization.k8s.io/reason")
                .is_some_and(|r| r.contains("no relationship found between node"))
    };
    let refused: Vec<_> = mine
        .iter()
        .filter(|e| {
            e.response_status
                .as_ref()
                .is_some_and(|s| s.code >= 400 && s.code != 404 && s.code != 409)
        })
        .filter(|e| !graph_lag(e))
        .filter(|e| {
            !e.response_status.as_ref().is_some_and(|s| {
                ((s.code == 504 || s.code == 500) && s.message.ends_with("context canceled"))
                    || (s.code == 500 && s.message == "client disconnected")
            })
        })
        .map(|e| {
            format!(
                "{} {:?} {} {:?}",
                e.verb,
                e.object_ref,
                e.response_status.as_ref().map_or(0, |s| s.code),
                e.annotations
            )
        })
        .collect();
    assert!(refused.is_empty(), "the kubelet was refused: {refused:?}");
    Ok(())
}
