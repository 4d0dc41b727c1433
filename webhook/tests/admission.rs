//! The admission endpoints in-process, fed AdmissionReview bodies exactly as a
//! real kube-apiserver v1.20.2 sent them (tests/fixtures), plus malformed ones.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::Router;
use graceguard_webhook::app::App;
use graceguard_webhook::confirm::{Confirmer, Fetch};
use graceguard_webhook::follow_up::FollowUp;
use graceguard_webhook::livelock::LivelockDetector;
use graceguard_webhook::meta_index::MetaIndex;
use graceguard_webhook::metrics::Metrics;
use graceguard_webhook::mode::Mode;
use graceguard_webhook::pod_index::{Deletion, HeldPod, Holder};
use graceguard_webhook::read_error::{Cause, ReadError};
use graceguard_webhook::server::admission_router;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use kube::core::ObjectMeta;
use kube::runtime::watcher::Event;
use serde_json::Value;
use tower::ServiceExt;

const MAX_BODY: usize = 64 * 1024;

fn fixture(name: &str) -> Vec<u8> {
    let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

struct Harness {
    router: Router,
    gets: Arc<AtomicUsize>,
    app: Arc<App>,
}

/// An app whose index holds `held` (namespace, name) and whose live read
/// answers `live` for every name.
fn harness(held: &[(&str, &str)], live: Result<Option<HeldPod>, ReadError>, mode: Mode) -> Harness {
    let pods = Arc::new(MetaIndex::new("pods"));
    pods.apply(Event::Init, |_| None);
    for (ns, name) in held {
        let m = ObjectMeta {
            namespace: Some((*ns).into()),
            name: Some((*name).into()),
            uid: Some("uid-1".into()),
            ..Default::default()
        };
        pods.apply(Event::InitApply(&m), |m| Some(HeldPod::from_meta(m)));
    }
    pods.apply(Event::InitDone, |_| None);
    let namespaces = Arc::new(MetaIndex::new("namespaces"));
    namespaces.apply(Event::Init, |_| None);
    namespaces.apply(Event::InitDone, |_| None);
    let gets = Arc::new(AtomicUsize::new(0));
    let g = Arc::clone(&gets);
    let fetch: Fetch = Arc::new(move |_, _| {
        g.fetch_add(1, Ordering::SeqCst);
        let answer = live.clone().map(|h| h.map(Holder::from));
        Box::pin(async move { answer })
    });
    let (metrics, _) = Metrics::new();
    let app = Arc::new(App {
        pods,
        namespaces,
        confirmer: Confirmer::new(fetch, Duration::from_secs(1), 100, metrics.confirm.clone()),
        livelock: LivelockDetector::new(Duration::from_secs(10), 5),
        evictions: graceguard_webhook::eviction_outcome::EvictionOutcomes::new(
            None,
            FollowUp::disabled(),
            metrics.evictions.clone(),
        ),
        metrics,
        follow_up: FollowUp::disabled(),
        kinds: None,
        log_dropped: None,
        certificate: None,
        mode,
        adaptive: graceguard_webhook::collision::Adaptive::default(),
        readiness_tracks_watch: true,
        shutting_down: AtomicBool::new(false),
        knows_api_server: false,
        leases: None,
    });
    Harness {
        router: admission_router(
            Arc::clone(&app),
            &graceguard_webhook::limits::Limits {
                max_body_bytes: MAX_BODY,
                ..Default::default()
            },
        ),
        gets,
        app,
    }
}

fn terminating() -> HeldPod {
    let now = k8s_openapi::jiff::Timestamp::now().as_second();
    HeldPod {
        uid: "uid-1".into(),
        deletion: Some(Deletion {
            at_unix: now + 30,
            grace_seconds: 45,
        }),
    }
}

async fn post(router: &Router, path: &str, body: Vec<u8>) -> (StatusCode, Value) {
    let req = Request::post(path)
        .header("content-type", "application/json")
        .body(Body::from(body))
        .expect("request");
    let resp = router.clone().oneshot(req).await.expect("infallible");
    let status = resp.status();
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    let v = serde_json::from_slice(&bytes)
        .unwrap_or(Value::String(String::from_utf8_lossy(&bytes).into()));
    (status, v)
}

fn request_uid(fixture_name: &str) -> String {
    let v: Value = serde_json::from_slice(&fixture(fixture_name)).expect("fixture json");
    v["request"]["uid"].as_str().unwrap_or_default().to_string()
}

#[tokio::test]
async fn a_free_name_is_allowed_without_an_api_call() {
    let h = harness(&[], Ok(None), Mode::Conflict);
    let (status, v) = post(&h.router, "/validate/pods", fixture("01-create-pods.json")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(v["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(v["kind"], "AdmissionReview");
    assert_eq!(
        v["response"]["uid"],
        request_uid("01-create-pods.json").as_str()
    );
    assert_eq!(v["response"]["allowed"], true);
    assert_eq!(
        v["response"]["auditAnnotations"],
        serde_json::json!({"decision": "allow", "reason": "name_free"})
    );
    assert_eq!(h.gets.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn a_create_on_a_terminating_name_is_denied_409() {
    let h = harness(
        &[("team-a", "train-a0-0")],
        Ok(Some(terminating())),
        Mode::Conflict,
    );
    let (status, v) = post(&h.router, "/validate/pods", fixture("04-create-pods.json")).await;
    assert_eq!(status, StatusCode::OK);
    let r = &v["response"];
    assert_eq!(r["uid"], request_uid("04-create-pods.json").as_str());
    assert_eq!(r["allowed"], false);
    assert_eq!(r["status"]["code"], 409);
    assert_eq!(r["status"]["reason"], "AlreadyExists");
    assert_eq!(r["status"]["details"]["name"], "train-a0-0");
    assert_eq!(r["status"]["details"]["kind"], "pods");
    let msg = r["status"]["message"].as_str().unwrap_or_default();
    assert!(
        msg.contains("terminating") && msg.contains("no quota was charged"),
        "{msg}"
    );
    // The API server's own audit log gets the decision too.
    assert_eq!(
        r["auditAnnotations"],
        serde_json::json!({"decision": "deny", "reason": "terminating"})
    );
    assert_eq!(h.gets.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn retry_mode_answers_429_with_retry_after() {
    let h = harness(
        &[("team-a", "train-a0-0")],
        Ok(Some(terminating())),
        Mode::Retry,
    );
    let (_, v) = post(&h.router, "/validate/pods", fixture("04-create-pods.json")).await;
    let s = &v["response"]["status"];
    assert_eq!(s["code"], 429);
    assert_eq!(s["reason"], "TooManyRequests");
    let after = s["details"]["retryAfterSeconds"].as_u64().unwrap_or(0);
    assert!((29..=30).contains(&after), "{s}");
}

#[tokio::test]
async fn a_stale_index_never_denies() {
    let h = harness(&[("team-a", "train-a0-0")], Ok(None), Mode::Conflict);
    let (_, v) = post(&h.router, "/validate/pods", fixture("04-create-pods.json")).await;
    assert_eq!(v["response"]["allowed"], true);
    assert_eq!(h.gets.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_failed_confirmation_allows() {
    let h = harness(
        &[("team-a", "train-a0-0")],
        Err(ReadError {
            resource: "pods".into(),
            namespace: "team-a".into(),
            name: "train-a0-0".into(),
            cause: Cause::TimedOut(Duration::from_secs(1)),
        }),
        Mode::Conflict,
    );
    let (_, v) = post(&h.router, "/validate/pods", fixture("04-create-pods.json")).await;
    assert_eq!(v["response"]["allowed"], true);
}

#[tokio::test]
async fn a_dry_run_generate_name_create_is_checked_by_its_generated_name() {
    // Free: allowed.
    let h = harness(&[], Ok(None), Mode::Conflict);
    let (_, v) = post(&h.router, "/validate/pods", fixture("05-create-pods.json")).await;
    assert_eq!(v["response"]["allowed"], true);
    assert_eq!(
        v["response"]["uid"],
        request_uid("05-create-pods.json").as_str()
    );
    // Held (the generated name collides): denied like the API server would, dry run or not.
    let held = HeldPod {
        uid: "u".into(),
        deletion: None,
    };
    let h = harness(
        &[("team-a", "worker-l5gl6")],
        Ok(Some(held)),
        Mode::Conflict,
    );
    let (_, v) = post(&h.router, "/validate/pods", fixture("05-create-pods.json")).await;
    assert_eq!(v["response"]["allowed"], false);
    assert_eq!(v["response"]["status"]["code"], 409);
}

#[tokio::test]
async fn other_operations_and_subresources_are_allowed_with_their_uid() {
    let h = harness(
        &[("team-a", "train-a0-0")],
        Ok(Some(terminating())),
        Mode::Conflict,
    );
    for f in ["02-update-pods-status.json", "03-delete-pods.json"] {
        let (status, v) = post(&h.router, "/validate/pods", fixture(f)).await;
        assert_eq!(status, StatusCode::OK, "{f}");
        assert_eq!(v["response"]["allowed"], true, "{f}");
        assert_eq!(v["response"]["uid"], request_uid(f).as_str(), "{f}");
    }
    // Another kind with a held name: not a pod, not our business.
    let mut cm: Value = serde_json::from_slice(&fixture("04-create-pods.json")).expect("json");
    cm["request"]["kind"] = serde_json::json!({"group": "", "version": "v1", "kind": "ConfigMap"});
    cm["request"]["resource"] =
        serde_json::json!({"group": "", "version": "v1", "resource": "configmaps"});
    let (_, v) = post(
        &h.router,
        "/validate/pods",
        serde_json::to_vec(&cm).expect("json"),
    )
    .await;
    assert_eq!(v["response"]["allowed"], true);
    assert_eq!(h.gets.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn malformed_requests_get_a_clear_400() {
    let h = harness(&[], Ok(None), Mode::Conflict);
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("not json", b"{not json".to_vec()),
        ("empty", Vec::new()),
        (
            "no request",
            br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#.to_vec(),
        ),
        (
            "wrong shape",
            br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":5}}"#
                .to_vec(),
        ),
    ];
    for (what, body) in cases {
        let (status, v) = post(&h.router, "/validate/pods", body).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{what}: {v}");
        let err = v["error"].as_str().unwrap_or_default();
        assert!(err.contains("AdmissionReview"), "{what}: {err}");
    }
}

#[tokio::test]
async fn a_review_whose_uid_reads_but_whose_object_does_not_is_allowed_with_a_warning() {
    let h = harness(&[], Ok(None), Mode::Conflict);
    // A pods review whose object is not a pod: under failurePolicy Fail an
    // error answer would deny the update; graceguard allows it and says why.
    let mut v: Value =
        serde_json::from_slice(&fixture("02-update-pods-status.json")).expect("json");
    v["request"]["object"]["spec"] = "not a pod spec".into();
    let (status, out) = post(
        &h.router,
        "/mutate/pods-status",
        serde_json::to_vec(&v).expect("json"),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{out}");
    assert_eq!(out["response"]["allowed"], true, "{out}");
    assert_eq!(
        out["response"]["uid"],
        request_uid("02-update-pods-status.json").as_str()
    );
    let warning = out["response"]["warnings"][0].as_str().unwrap_or_default();
    assert!(
        warning.contains("allowed this request unchecked"),
        "{warning}"
    );
    assert!(warning.contains("not a Pod"), "{warning}");
    assert_eq!(out["apiVersion"], "admission.k8s.io/v1");

    // The collision guard reads a Create's name only: the same broken spec
    // does not keep it from checking the name (free here: allowed, no warning).
    let mut v: Value = serde_json::from_slice(&fixture("04-create-pods.json")).expect("json");
    v["request"]["object"]["spec"] = "not a pod spec".into();
    let (status, out) = post(
        &h.router,
        "/validate/pods",
        serde_json::to_vec(&v).expect("json"),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{out}");
    assert_eq!(out["response"]["allowed"], true, "{out}");
    assert!(out["response"].get("warnings").is_none(), "{out}");
}

#[tokio::test]
async fn past_the_in_flight_cap_a_request_is_answered_503_at_once() {
    let h = harness(&[], Ok(None), Mode::Conflict);
    let router = admission_router(
        Arc::clone(&h.app),
        &graceguard_webhook::limits::Limits {
            max_in_flight: 1,
            ..Default::default()
        },
    );
    // One request whose body never ends holds the only place (on any route).
    let (_tx, rx) = tokio::sync::mpsc::channel::<Result<Vec<u8>, std::io::Error>>(1);
    let mut rx = rx;
    let endless = Body::from_stream(futures::stream::poll_fn(move |cx| rx.poll_recv(cx)));
    let held = tokio::spawn(
        router.clone().oneshot(
            Request::post("/mutate/pods-status")
                .header("content-length", "1000")
                .body(endless)
                .expect("request"),
        ),
    );
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = std::time::Instant::now();
    let (status, body) = post(&router, "/validate/pods", fixture("01-create-pods.json")).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(body.to_string().contains("--max-in-flight"), "{body}");
    assert!(started.elapsed() < Duration::from_secs(1));
    held.abort();
    let _ = held.await;
    // Once it is gone, requests are answered again.
    let (status, _) = post(&router, "/validate/pods", fixture("01-create-pods.json")).await;
    assert_eq!(status, StatusCode::OK);
}

#[tokio::test]
async fn an_oversized_body_is_refused_not_buffered() {
    let h = harness(&[], Ok(None), Mode::Conflict);
    let (status, _) = post(&h.router, "/validate/pods", vec![b' '; MAX_BODY + 1]).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
}

/// The response's JSONPatch: base64 in the review, as the API server expects.
fn patch_ops(v: &Value) -> Value {
    let bytes: k8s_openapi::ByteString = serde_json::from_value(v["response"]["patch"].clone())
        .unwrap_or(k8s_openapi::ByteString(Vec::new()));
    serde_json::from_slice(&bytes.0).unwrap_or(Value::Null)
}

/// The 02 fixture (a status update adding DisruptionTarget to a pod that is
/// neither being deleted nor ended) with `edit` applied.
fn status_update_with(edit: impl FnOnce(&mut Value)) -> Vec<u8> {
    let mut v: Value =
        serde_json::from_slice(&fixture("02-update-pods-status.json")).expect("json");
    edit(&mut v);
    serde_json::to_vec(&v).expect("json")
}

/// The 02 fixture once the pod's deletion has begun.
fn status_update_of_deleted_pod() -> Vec<u8> {
    status_update_with(|v| {
        v["request"]["object"]["metadata"]["deletionTimestamp"] = "2026-11-30T11:30:01Z".into();
        v["request"]["object"]["metadata"]["deletionGracePeriodSeconds"] = 30.into();
    })
}

#[tokio::test]
async fn the_tagger_never_changes_a_running_pod() {
    let h = harness(&[], Ok(None), Mode::Conflict);
    // The condition on a pod whose deletion has not begun (the scheduler's,
    // the taint manager's patch, a few ms before their delete): no patch.
    let (status, v) = post(
        &h.router,
        "/mutate/pods-status",
        fixture("02-update-pods-status.json"),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(v["response"]["allowed"], true);
    assert!(v["response"].get("patch").is_none(), "{v}");
    assert!(v["response"].get("patchType").is_none(), "{v}");
    assert_eq!(
        h.app
            .metrics
            .disruption_tagger
            .running_pods_left_unchanged
            .get(),
        1
    );
}

#[tokio::test]
async fn the_tagger_patches_a_status_update_of_a_pod_being_deleted_or_ended() {
    let h = harness(&[], Ok(None), Mode::Conflict);
    let ended = status_update_with(|v| v["request"]["object"]["status"]["phase"] = "Failed".into());
    for body in [status_update_of_deleted_pod(), ended] {
        let (status, v) = post(&h.router, "/mutate/pods-status", body).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(v["response"]["allowed"], true);
        assert_eq!(
            v["response"]["uid"],
            request_uid("02-update-pods-status.json").as_str()
        );
        assert_eq!(v["response"]["patchType"], "JSONPatch", "{v}");
        let ops = patch_ops(&v);
        assert_eq!(
            ops[0],
            serde_json::json!({"op": "add", "path": "/metadata/labels/graceguard.io~1disruption", "value": "PreemptionByScheduler"})
        );
        assert_eq!(
            ops[1]["value"]["graceguard.io/disruption-message"],
            "Preempted by a pod on node node-1"
        );
        assert_eq!(
            ops[1]["value"]["graceguard.io/disruption-time"],
            "2026-11-30T11:30:00Z"
        );
    }
    assert_eq!(
        h.app
            .metrics
            .disruption_tagger
            .running_pods_left_unchanged
            .get(),
        0
    );

    // The same update of a pod that already carries the tags: no patch.
    let tagged = status_update_with(|v| {
        v["request"]["object"]["metadata"]["deletionTimestamp"] = "2026-11-30T11:30:01Z".into();
        v["request"]["object"]["metadata"]["labels"]["graceguard.io/disruption"] =
            "PreemptionByScheduler".into();
        v["request"]["object"]["metadata"]["annotations"] = serde_json::json!({
            "graceguard.io/disruption-message": "Preempted by a pod on node node-1",
            "graceguard.io/disruption-time": "2026-11-30T11:30:00Z",
        });
    });
    let (_, v) = post(&h.router, "/mutate/pods-status", tagged).await;
    assert_eq!(v["response"]["allowed"], true);
    assert!(v["response"].get("patch").is_none(), "{v}");
}

#[tokio::test]
async fn the_tagger_leaves_everything_else_alone() {
    let h = harness(&[], Ok(None), Mode::Conflict);
    // A pod create, a delete, and a status update whose condition is False.
    let mut not_true: Value =
        serde_json::from_slice(&fixture("02-update-pods-status.json")).expect("json");
    not_true["request"]["object"]["status"]["conditions"][0]["status"] = "False".into();
    let bodies = vec![
        fixture("01-create-pods.json"),
        fixture("03-delete-pods.json"),
        serde_json::to_vec(&not_true).expect("json"),
    ];
    for body in bodies {
        let (status, v) = post(&h.router, "/mutate/pods-status", body).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(v["response"]["allowed"], true);
        assert!(v["response"].get("patch").is_none(), "{v}");
    }
}

#[tokio::test]
async fn the_deletion_audit_allows_and_reads_who_grace_and_disruption() {
    let h = harness(&[], Ok(None), Mode::Conflict);
    let (status, v) = post(
        &h.router,
        "/validate/pods-delete",
        fixture("03-delete-pods.json"),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(v["response"]["allowed"], true);
    assert_eq!(
        v["response"]["uid"],
        request_uid("03-delete-pods.json").as_str()
    );

    let req = graceguard_webhook::review::parse(&fixture("03-delete-pods.json")).expect("parse");
    let rec = graceguard_webhook::endpoints::deletion_audit::record(&req);
    assert_eq!(
        rec.grace_period_seconds,
        Some(45),
        "from options.gracePeriodSeconds"
    );
    assert_eq!(
        rec.disruption_reason.as_deref(),
        Some("PreemptionByScheduler")
    );
    assert_eq!(rec.already_terminating, Some(false));
    assert_eq!(rec.phase.as_deref(), Some("Pending"));
    assert_eq!(rec.reason, "disruption");
    // The version the review showed, so the review that began a deletion
    // can be told from one the API server repeated after a write conflict.
    assert_eq!(rec.resource_version.as_deref(), Some("205"));

    // Without options, the pod's own grace period is what applies.
    let mut no_opts: Value = serde_json::from_slice(&fixture("03-delete-pods.json")).expect("json");
    no_opts["request"]["options"] = Value::Null;
    no_opts["request"]["oldObject"]["status"]["conditions"] = serde_json::json!([]);
    let req = graceguard_webhook::review::parse(&serde_json::to_vec(&no_opts).expect("json"))
        .expect("parse");
    let rec = graceguard_webhook::endpoints::deletion_audit::record(&req);
    assert_eq!(rec.grace_period_seconds, Some(60));
    assert_eq!(rec.disruption_reason, None);
    assert_eq!(rec.reason, "unexplained");
}

/// The 02 fixture (a status update adding DisruptionTarget), sent by `user` in `groups`.
/// (of a pod being deleted: anyone but a node gets it tagged in admission).
fn status_update_from(user: &str, groups: &[&str]) -> Vec<u8> {
    let mut v: Value = serde_json::from_slice(&status_update_of_deleted_pod()).expect("json");
    v["request"]["userInfo"] = serde_json::json!({"username": user, "groups": groups});
    serde_json::to_vec(&v).expect("json")
}

#[tokio::test]
async fn a_node_s_status_update_is_never_changed() {
    let h = harness(&[], Ok(None), Mode::Conflict);
    // By user name, and by group alone (a node credential with another name).
    for body in [
        status_update_from("system:node:n1", &["system:nodes", "system:authenticated"]),
        status_update_from("kubelet-n1", &["system:nodes"]),
    ] {
        let (status, v) = post(&h.router, "/mutate/pods-status", body).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(v["response"]["allowed"], true);
        assert!(v["response"].get("patch").is_none(), "{v}");
        assert!(v["response"].get("patchType").is_none(), "{v}");
    }
    // Anyone else's identical update is tagged in admission.
    let (_, v) = post(
        &h.router,
        "/mutate/pods-status",
        status_update_from(
            "system:serviceaccount:kube-system:pod-garbage-collector",
            &[],
        ),
    )
    .await;
    assert_eq!(v["response"]["patchType"], "JSONPatch", "{v}");
}

fn eviction(grace: Option<i64>, dry_run: bool) -> Vec<u8> {
    let mut opts = serde_json::json!({});
    if let Some(g) = grace {
        opts["gracePeriodSeconds"] = g.into();
    }
    if dry_run {
        opts["dryRun"] = serde_json::json!(["All"]);
    }
    serde_json::to_vec(&serde_json::json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "e-1",
            "kind": {"group": "policy", "version": "v1", "kind": "Eviction"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "subResource": "eviction",
            "name": "train-0",
            "namespace": "ns",
            "operation": "CREATE",
            "userInfo": {"username": "alice", "groups": ["testbed:users"]},
            "object": {"apiVersion": "policy/v1", "kind": "Eviction",
                       "metadata": {"name": "train-0", "namespace": "ns"}, "deleteOptions": opts},
            "dryRun": false,
        }
    }))
    .expect("json")
}

#[tokio::test]
async fn the_eviction_audit_always_allows_and_reads_grace_and_dry_run() {
    let h = harness(&[], Ok(None), Mode::Conflict);
    let (status, v) = post(
        &h.router,
        "/validate/pods-eviction",
        eviction(Some(30), false),
    )
    .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(v["response"]["allowed"], true);
    assert_eq!(v["response"]["uid"], "e-1");

    let req = graceguard_webhook::review::parse(&eviction(Some(30), false)).expect("parse");
    assert!(req.is_pods("CREATE", "eviction"));
    assert_eq!(req.grace_period_seconds, Some(30));
    assert!(!req.dry_run);
    let req = graceguard_webhook::review::parse(&eviction(None, true)).expect("parse");
    assert_eq!(req.grace_period_seconds, None);
    assert!(req.dry_run, "deleteOptions.dryRun makes it a dry run");
}

/// `post` as a connection from `peer` (what `server` puts on each request).
async fn post_as(
    router: &Router,
    path: &str,
    body: Vec<u8>,
    peer: graceguard_webhook::limits::Peer,
) -> Value {
    let req = Request::post(path)
        .header("content-type", "application/json")
        .extension(peer)
        .body(Body::from(body))
        .expect("request");
    let resp = router.clone().oneshot(req).await.expect("infallible");
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    serde_json::from_slice(&bytes).unwrap_or(Value::Null)
}

#[tokio::test]
async fn when_graceguard_knows_the_api_server_anyone_elses_review_changes_nothing() {
    use graceguard_webhook::limits::{Peer, Trust};
    let h = harness(
        &[("team-a", "train-a0-0")],
        Ok(Some(terminating())),
        Mode::Conflict,
    );
    // --trusted-peers (or mutual TLS) given: graceguard can tell.
    let app = Arc::new(App {
        knows_api_server: true,
        leases: None,
        ..clone_app(&h.app)
    });
    let router = admission_router(
        Arc::clone(&app),
        &graceguard_webhook::limits::Limits {
            max_body_bytes: MAX_BODY,
            ..Default::default()
        },
    );
    let pod_in_a = "10.244.1.7".parse().expect("ip");
    let forger = Peer::untrusted(pod_in_a);
    let api_server = Peer {
        ip: "10.0.0.10".parse().expect("ip"),
        trust: Trust::Address,
        certificate_name: None,
    };
    // A forged review is still answered as the real one would be...
    let v = post_as(
        &router,
        "/validate/pods",
        fixture("04-create-pods.json"),
        forger.clone(),
    )
    .await;
    assert_eq!(v["response"]["status"]["code"], 409, "{v}");
    let v = post_as(
        &router,
        "/validate/pods-eviction",
        eviction(Some(30), false),
        forger,
    )
    .await;
    assert_eq!(v["response"]["allowed"], true, "{v}");
    // ...but changes nothing: no denial counted, no eviction attempt.
    assert_eq!(app.metrics.collision_guard.quota_charges_prevented.get(), 0);
    assert_eq!(app.metrics.audits.evictions_audited.get(), 0);
    // The API server's own reviews do.
    post_as(
        &router,
        "/validate/pods",
        fixture("04-create-pods.json"),
        api_server.clone(),
    )
    .await;
    post_as(
        &router,
        "/validate/pods-eviction",
        eviction(Some(30), false),
        api_server,
    )
    .await;
    assert_eq!(app.metrics.collision_guard.quota_charges_prevented.get(), 1);
    assert_eq!(app.metrics.audits.evictions_audited.get(), 1);
}

#[test]
fn under_fail_a_broken_watch_does_not_make_the_webhook_unready() {
    let h = harness(&[], Ok(None), Mode::Conflict);
    assert!(h.app.is_ready(), "synced");
    // A watch error: with readiness tracking the watch (failurePolicy Ignore),
    // the replica is unready until the watch recovers.
    h.app.pods.mark_broken();
    assert!(!h.app.is_ready());
    // The same app as the chart runs it under failurePolicy Fail: still ready,
    // since an unready webhook would refuse every pod Create.
    let fail = App {
        readiness_tracks_watch: false,
        ..clone_app(&h.app)
    };
    assert!(fail.is_ready());
    fail.shutting_down.store(true, Ordering::Release);
    assert!(!fail.is_ready(), "shutting down is always unready");
}

/// A second app sharing the first's indexes.
fn clone_app(app: &App) -> App {
    let (metrics, _) = Metrics::new();
    App {
        pods: Arc::clone(&app.pods),
        namespaces: Arc::clone(&app.namespaces),
        confirmer: app.confirmer.clone(),
        livelock: LivelockDetector::new(Duration::from_secs(10), 5),
        evictions: graceguard_webhook::eviction_outcome::EvictionOutcomes::new(
            None,
            FollowUp::disabled(),
            metrics.evictions.clone(),
        ),
        metrics,
        follow_up: FollowUp::disabled(),
        kinds: None,
        log_dropped: None,
        certificate: None,
        mode: Mode::Conflict,
        adaptive: graceguard_webhook::collision::Adaptive::default(),
        readiness_tracks_watch: true,
        shutting_down: AtomicBool::new(false),
        knows_api_server: false,
        leases: None,
    }
}
