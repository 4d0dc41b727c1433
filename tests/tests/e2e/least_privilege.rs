//! What graceguard's own identity may do, as the chart grants it: the
//! ServiceAccount, ClusterRole, ClusterRoleBinding and (where the server
//! serves it) ValidatingAdmissionPolicy that the real `helm` renders against
//! the real API server (`helm install --dry-run=server`: Helm's own view of
//! the server's versions and APIs), applied there, then every write tried
//! under that ServiceAccount's name.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{DeleteParams, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::{json, Value};
use testbed::helm::{chart_dir, Helm};
use testbed::pods;
use testbed::TestBed;

type R = anyhow::Result<()>;

const RELEASE_NS: &str = "graceguard-system";
const POLICY_MESSAGE: &str = "graceguard may change only graceguard.io/";

/// The chart's identity objects, rendered by `helm` for the bed's server.
fn rendered_identity(bed: &TestBed) -> anyhow::Result<Vec<Value>> {
    let helm = Helm::for_bed(bed)?;
    let chart = chart_dir().display().to_string();
    let args = vec![
        "install",
        "graceguard",
        &chart,
        "--namespace",
        RELEASE_NS,
        "--dry-run=server",
        "--output",
        "json",
    ];
    let out = helm.ok(&args)?;
    let release: Value = serde_json::from_str(&out)?;
    let manifest = release["manifest"].as_str().unwrap_or_default();
    let mut objects = Vec::new();
    for doc in serde_yaml_ng::Deserializer::from_str(manifest) {
        let v: Value = serde::Deserialize::deserialize(doc)?;
        let kind = v["kind"].as_str().unwrap_or_default();
        if [
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
        ]
        .contains(&kind)
        {
            objects.push(v);
        }
    }
    Ok(objects)
}

/// Creates `objects` as the admin, each through the API discovery names.
async fn apply(bed: &TestBed, objects: &[Value]) -> R {
    for o in objects {
        let (api_version, kind) = (
            o["apiVersion"].as_str().unwrap_or_default(),
            o["kind"].as_str().unwrap_or_default(),
        );
        let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
        let gvk = GroupVersionKind::gvk(group, version, kind);
        let (ar, caps) = kube::discovery::pinned_kind(&bed.client, &gvk).await?;
        let obj: DynamicObject = serde_json::from_value(o.clone())?;
        let api: Api<DynamicObject> = match caps.scope {
            kube::discovery::Scope::Namespaced => {
                Api::namespaced_with(bed.client.clone(), RELEASE_NS, &ar)
            }
            kube::discovery::Scope::Cluster => Api::all_with(bed.client.clone(), &ar),
        };
        api.create(&PostParams::default(), &obj).await?;
    }
    Ok(())
}

fn code(r: &Result<Pod, kube::Error>) -> u16 {
    match r {
        Ok(_) => 200,
        Err(kube::Error::Api(s)) => s.code,
        Err(_) => 0,
    }
}

fn message(r: &Result<Pod, kube::Error>) -> String {
    match r {
        Err(kube::Error::Api(s)) => s.message.clone(),
        Err(e) => e.to_string(),
        Ok(_) => String::new(),
    }
}

async fn status_patch(api: &Api<Pod>, name: &str, patch: Value) -> Result<Pod, kube::Error> {
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceguards_identity_may_tag_a_pod_and_change_nothing_else() -> R {
    let bed = TestBed::start().await?;
    Api::<Namespace>::all(bed.client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": RELEASE_NS}}))?,
        )
        .await?;
    let objects = rendered_identity(&bed)?;
    let kinds: Vec<&str> = objects.iter().filter_map(|o| o["kind"].as_str()).collect();
    // The policy always comes with the grant it confines.
    assert!(kinds.contains(&"ValidatingAdmissionPolicy"), "{kinds:?}");
    let sa = objects
        .iter()
        .find(|o| o["kind"] == "ServiceAccount")
        .and_then(|o| o["metadata"]["name"].as_str())
        .ok_or_else(|| anyhow::anyhow!("no ServiceAccount rendered: {kinds:?}"))?
        .to_string();
    apply(&bed, &objects).await?;

    let ns = bed.namespace("privilege").await?;
    let admin: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);
    let mut pod = pods::task_pod("tagged", 30);
    pod.metadata.labels = Some([("app".to_string(), "train".to_string())].into());
    pod.metadata.annotations = Some([("team".to_string(), "ml".to_string())].into());
    admin.create(&PostParams::default(), &pod).await?;
    let uid = admin.get("tagged").await?.uid().unwrap_or_default();

    let who = format!("system:serviceaccount:{RELEASE_NS}:{sa}");
    let as_sa: Client = bed
        .client_impersonating(
            &who,
            &[
                "system:serviceaccounts",
                &format!("system:serviceaccounts:{RELEASE_NS}"),
                "system:authenticated",
            ],
        )
        .await?;
    let api: Api<Pod> = Api::namespaced(as_sa, &ns);

    // No `patch pods`: a write of the pod itself is refused by RBAC, whatever it is.
    let tag =
        json!({"metadata": {"uid": uid, "labels": {"graceguard.io/disruption": "preempted"}}});
    let r = api
        .patch("tagged", &PatchParams::default(), &Patch::Merge(&tag))
        .await;
    assert_eq!(code(&r), 403, "patch pods: {}", message(&r));
    let r = api.delete("tagged", &DeleteParams::default()).await;
    assert!(
        matches!(&r, Err(kube::Error::Api(s)) if s.code == 403),
        "delete pods: {r:?}"
    );

    // A forbidden change, tried while the policy may still be syncing into
    // the API server: it is refused within a few seconds and stays refused.
    let relabel = json!({"metadata": {"labels": {"app": "evil"}}});
    let r = {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let r = status_patch(&api, "tagged", relabel.clone()).await;
            if code(&r) != 200 || Instant::now() > deadline {
                break r;
            }
            // Allowed before the policy took effect: put the label back.
            status_patch(
                &admin,
                "tagged",
                json!({"metadata": {"labels": {"app": "train"}}}),
            )
            .await?;
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    assert_eq!(code(&r), 403, "relabel: {}", message(&r));
    assert!(message(&r).contains(POLICY_MESSAGE), "{}", message(&r));

    // graceguard's own tags, through pods/status, with the uid precondition: allowed.
    let tags = json!({"metadata": {
        "uid": uid,
        "labels": {"graceguard.io/disruption": "preempted"},
        "annotations": {"graceguard.io/disruption-reason": "PreemptionByScheduler"},
    }});
    let r = status_patch(&api, "tagged", tags).await;
    assert_eq!(code(&r), 200, "graceguard's tags: {}", message(&r));
    let now = admin.get("tagged").await?;
    let labels = now.metadata.labels.clone().unwrap_or_default();
    assert_eq!(
        labels.get("graceguard.io/disruption").map(String::as_str),
        Some("preempted")
    );
    assert_eq!(labels.get("app").map(String::as_str), Some("train"));

    // Everything else: refused by the policy.
    let forbidden = [
        (
            "an annotation",
            json!({"metadata": {"annotations": {"team": "other"}}}),
        ),
        (
            "a removed label",
            json!({"metadata": {"labels": {"app": null}}}),
        ),
        (
            "a new label",
            json!({"metadata": {"labels": {"tier": "gold"}}}),
        ),
        (
            "the status",
            json!({"status": {"conditions": [{"type": "DisruptionTarget", "status": "True", "reason": "Forged"}]}}),
        ),
        (
            "a finalizer",
            json!({"metadata": {"finalizers": ["example.com/hold"]}}),
        ),
    ];
    for (what, patch) in forbidden {
        let r = status_patch(&api, "tagged", patch).await;
        assert_eq!(code(&r), 403, "{what}: {}", message(&r));
        assert!(
            message(&r).contains("graceguard may"),
            "{what}: {}",
            message(&r)
        );
    }
    // The spec cannot change through pods/status on any version: the
    // subresource's strategy puts the stored spec back.
    let _ = status_patch(
        &api,
        "tagged",
        json!({"spec": {"activeDeadlineSeconds": 1}}),
    )
    .await;
    let deadline = |p: Pod| p.spec.and_then(|s| s.active_deadline_seconds);
    assert_eq!(deadline(admin.get("tagged").await?), None);
    let after = admin.get("tagged").await?;
    assert_eq!(
        after
            .metadata
            .labels
            .unwrap_or_default()
            .get("app")
            .map(String::as_str),
        Some("train")
    );
    assert_eq!(
        after.metadata.finalizers.unwrap_or_default(),
        Vec::<String>::new()
    );
    Ok(())
}
