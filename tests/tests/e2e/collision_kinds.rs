//! The collision guard for every kind a quota counts, on the real API server
//! with the real admission chain: a Create whose name a terminating object
//! holds (a finalizer) is denied before ResourceQuota charges it. PVCs,
//! ConfigMaps and a custom resource (a Job held by foreground deletion:
//! real_components.rs).

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::{Api, ResourceExt};
use scenarios::objects;
use serde_json::json;
use testbed::kubelet::{Kubelet, KubeletOptions};
use testbed::pods::{self, CreateOutcome};
use testbed::quota;
use testbed::TestBed;

type R = anyhow::Result<()>;

/// A ConfigMap `name`, held by finalizer `graceguard.test/hold` if `finalizer`.
fn configmap(name: &str, finalizer: bool) -> anyhow::Result<ConfigMap> {
    let mut v = json!({"metadata": {"name": name}, "data": {"k": "v"}});
    if finalizer {
        v["metadata"]["finalizers"] = json!(["graceguard.test/hold"]);
    }
    Ok(serde_json::from_value(v)?)
}

fn pvc(name: &str) -> anyhow::Result<PersistentVolumeClaim> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }))?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pvc_held_by_pvc_protection_is_denied_five_times_and_its_storage_quota_never_charged() -> R
{
    let bed = TestBed::start().await?;
    let ns = bed.namespace("pvc").await?;
    let webhook = scenarios::objects::guarding_kinds(&bed).await?;
    quota::set_named_quota(
        &bed,
        &ns,
        "storage",
        &[
            ("persistentvolumeclaims", "10"),
            ("requests.storage", "10Gi"),
        ],
    )
    .await?;
    webhook.wait_kind_indexed("persistentvolumeclaims").await?;
    let _kubelet = Kubelet::start(&bed, KubeletOptions::default()).await?;
    let api: Api<PersistentVolumeClaim> = Api::namespaced(bed.client.clone(), &ns);
    assert_eq!(
        objects::create(&api, &pvc("data")?).await?,
        CreateOutcome::Created
    );
    // A pod uses it, so pvc-protection keeps it Terminating once deleted
    // (the real pvc-protection controller).
    let mut user = pods::task_pod("user", 30);
    if let Some(spec) = user.spec.as_mut() {
        spec.volumes = Some(vec![serde_json::from_value(
            json!({"name": "data", "persistentVolumeClaim": {"claimName": "data"}}),
        )?]);
    }
    let pod_api: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);
    assert_eq!(pods::create(&pod_api, &user).await?, CreateOutcome::Created);
    api.delete("data", &DeleteParams::default()).await?;
    let held = objects::wait_terminating(&api, "data").await?;
    let pvc_protection = "held by finalizer kubernetes.io/pvc-protection";
    objects::wait_indexed(&api, &pvc("data")?, pvc_protection).await?;
    assert!(held
        .finalizers()
        .iter()
        .any(|f| f == "kubernetes.io/pvc-protection"));

    let used = |r: &'static str| quota::used(&bed.client, &ns, "storage", r);
    let (count, storage) = (
        used("persistentvolumeclaims").await?,
        used("requests.storage").await?,
    );
    assert_eq!((count.as_str(), storage.as_str()), ("1", "1Gi"));
    objects::denied_n_times(
        &api,
        &pvc("data")?,
        5,
        "held by finalizer kubernetes.io/pvc-protection",
    )
    .await?;
    assert_eq!(
        used("persistentvolumeclaims").await?,
        count,
        "no PVC charged"
    );
    assert_eq!(
        used("requests.storage").await?,
        storage,
        "no storage charged"
    );
    // The first Create, the dry runs of the wait, five denials and the
    // livelock record naming the loop; the audit log is written a moment after
    // each answer, so wait for the fifth denial.
    let real_denial = |r: &serde_json::Value| {
        r["decision"] == "deny" && r["event"] == "admission" && r["dry_run"] == false
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let recs = loop {
        let recs = webhook.records_for("collision_guard", &ns, "data")?;
        if recs.iter().filter(|r| real_denial(r)).count() >= 5 || Instant::now() > deadline {
            break recs;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(recs[0]["reason"], "name_free", "the first Create: {recs:?}");
    let denials: Vec<_> = recs.iter().filter(|r| real_denial(r)).collect();
    assert_eq!(denials.len(), 5, "{recs:?}");
    assert!(denials
        .iter()
        .all(|r| r["resource"] == "persistentvolumeclaims" && r["reason"] == "terminating"));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configmap_held_by_a_finalizer_is_denied_until_it_is_gone_and_free_names_cost_no_read(
) -> R {
    let bed = TestBed::start().await?;
    let ns = bed.namespace("cm").await?;
    let webhook = scenarios::objects::guarding_kinds(&bed).await?;
    quota::set_named_quota(&bed, &ns, "objects", &[("count/configmaps", "10")]).await?;
    webhook.wait_kind_indexed("configmaps").await?;
    let api: Api<ConfigMap> = Api::namespaced(bed.client.clone(), &ns);
    let cm = configmap;
    // Free names of an indexed kind: allowed from the index, no live read.
    let gets = || webhook.metric("graceguard_confirmation_gets_total");
    let before = gets()?;
    for name in ["free-a", "free-b", "free-c"] {
        assert_eq!(
            objects::create(&api, &cm(name, false)?).await?,
            CreateOutcome::Created
        );
    }
    assert_eq!(
        gets()?,
        before,
        "free names are answered without an API call"
    );
    for name in ["free-a", "free-b", "free-c"] {
        let r = webhook
            .wait_records("collision_guard", &ns, name, 1)
            .await?;
        assert_eq!(r[0]["reason"], "name_free", "{r:?}");
    }

    assert_eq!(
        objects::create(&api, &cm("settings", true)?).await?,
        CreateOutcome::Created
    );
    api.delete("settings", &DeleteParams::default()).await?;
    objects::wait_terminating(&api, "settings").await?;
    objects::wait_indexed(&api, &cm("settings", false)?, "graceguard.test/hold").await?;
    let count = quota::used(&bed.client, &ns, "objects", "count/configmaps").await?;
    objects::denied_n_times(
        &api,
        &cm("settings", false)?,
        5,
        "held by finalizer graceguard.test/hold",
    )
    .await?;
    assert_eq!(
        quota::used(&bed.client, &ns, "objects", "count/configmaps").await?,
        count
    );

    // The finalizer goes, so does the ConfigMap: the name is free again.
    let release = json!({"metadata": {"finalizers": null}});
    api.patch("settings", &PatchParams::default(), &Patch::Merge(&release))
        .await?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while api.get_opt("settings").await?.is_some() {
        anyhow::ensure!(Instant::now() < deadline, "settings still there");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    objects::create_once_free(&api, &cm("settings", false)?).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_custom_resource_is_indexed_once_a_quota_counts_it_and_unindexed_when_it_goes() -> R {
    let bed = TestBed::start().await?;
    let ns = bed.namespace("crd").await?;
    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "metadata": {"name": "widgets.graceguard.test"},
        "spec": {
            "group": "graceguard.test", "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                          "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}],
        },
    }))?;
    let crds: Api<CustomResourceDefinition> = Api::all(bed.client.clone());
    crds.create(&PostParams::default(), &crd).await?;
    bed.crds_established(&["widgets.graceguard.test"]).await?;
    let webhook = scenarios::objects::guarding_kinds(&bed).await?;
    let gvk = GroupVersionKind::gvk("graceguard.test", "v1", "Widget");
    let ar = ApiResource::from_gvk_with_plural(&gvk, "widgets");
    let api: Api<DynamicObject> = Api::namespaced_with(bed.client.clone(), &ns, &ar);
    let widget = |finalizer: bool| -> anyhow::Result<DynamicObject> {
        let mut v = json!({"apiVersion": "graceguard.test/v1", "kind": "Widget", "metadata": {"name": "w"}});
        if finalizer {
            v["metadata"]["finalizers"] = json!(["graceguard.test/hold"]);
        }
        Ok(serde_json::from_value(v)?)
    };
    // No quota counts widgets yet: not indexed, nothing to pay.
    assert_eq!(
        objects::create(&api, &widget(true)?).await?,
        CreateOutcome::Created
    );
    let r = webhook.wait_records("collision_guard", &ns, "w", 1).await?;
    assert_eq!(r[0]["reason"], "kind_not_indexed", "{r:?}");
    assert_eq!(r[0]["resource"], "widgets.graceguard.test");

    quota::create_named(
        &bed,
        &ns,
        "widgets",
        &[("count/widgets.graceguard.test", "5")],
    )
    .await?;
    // The quota controller counts widgets only once its discovery (every 30 s)
    // has found them, and recomputes a quota when its limits change: nudge the
    // limit until the status covers it (Creates of widgets are refused until then).
    let deadline = Instant::now() + Duration::from_secs(120);
    let quotas: Api<k8s_openapi::api::core::v1::ResourceQuota> =
        Api::namespaced(bed.client.clone(), &ns);
    let mut limit = 5;
    while !quota::in_force(&bed, &ns, "widgets").await? {
        anyhow::ensure!(
            Instant::now() < deadline,
            "the quota controller never counted widgets"
        );
        tokio::time::sleep(Duration::from_secs(2)).await;
        limit = if limit == 5 { 6 } else { 5 };
        let hard = json!({"spec": {"hard": {"count/widgets.graceguard.test": limit.to_string()}}});
        quotas
            .patch("widgets", &PatchParams::default(), &Patch::Merge(&hard))
            .await?;
    }
    webhook.wait_kind_indexed("widgets.graceguard.test").await?;
    api.delete("w", &DeleteParams::default()).await?;
    objects::wait_terminating(&api, "w").await?;
    objects::wait_indexed(&api, &widget(false)?, "graceguard.test/hold").await?;
    let used = || quota::used(&bed.client, &ns, "widgets", "count/widgets.graceguard.test");
    let before = used().await?;
    objects::denied_n_times(
        &api,
        &widget(false)?,
        3,
        "held by finalizer graceguard.test/hold",
    )
    .await?;
    assert_eq!(used().await?, before, "no widget charged");

    // The quota goes: so does the index.
    Api::<k8s_openapi::api::core::v1::ResourceQuota>::namespaced(bed.client.clone(), &ns)
        .delete("widgets", &DeleteParams::default())
        .await?;
    let sample = "graceguard_kind_index_ready{kind=\"widgets.graceguard.test\"}";
    let deadline = Instant::now() + Duration::from_secs(30);
    while webhook.metric(sample)?.is_some() {
        anyhow::ensure!(
            Instant::now() < deadline,
            "the widgets index still runs 30 s after its quota went"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// A kind's index that went past `--kind-index-max-objects` holds nothing
/// and lets that kind's Creates through unchecked; a healthy watch never
/// lists again, so it stayed so after the objects went. Now it lists again
/// after `--kind-index-relist-over-cap` and, the kind back within its cap,
/// guards it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kind_index_over_its_cap_guards_again_once_the_kind_fits() -> R {
    use testbed::webhook::{Hook, WebhookProcess};
    let bed = TestBed::start().await?;
    let ns = bed.namespace("cm-cap").await?;
    // The cap: every ConfigMap of the cluster, and 3 more. Counted once
    // every namespace has its kube-root-ca.crt (the controller-manager
    // writes them a moment after the namespaces appear).
    let all: Api<ConfigMap> = Api::all(bed.client.clone());
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(bed.client.clone());
    let deadline = Instant::now() + Duration::from_secs(60);
    let existing = loop {
        let cms = all.list(&Default::default()).await?.items;
        let want = namespaces.list(&Default::default()).await?.items.len();
        let roots = cms
            .iter()
            .filter(|c| c.metadata.name.as_deref() == Some("kube-root-ca.crt"))
            .count();
        if roots >= want {
            break cms.len();
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{roots} of {want} namespaces have their kube-root-ca.crt after 60 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let cap = existing + 3;
    let webhook = WebhookProcess::start(
        &bed,
        &[
            "--collision-kinds=configmaps",
            &format!("--kind-index-max-objects={cap}"),
            "--kind-index-relist-over-cap=2s",
        ],
    )
    .await?;
    webhook.register(&bed, &[Hook::CollisionKinds]).await?;
    quota::set_named_quota(&bed, &ns, "objects", &[("count/configmaps", "100")]).await?;
    webhook.wait_kind_indexed("configmaps").await?;
    let over_cap = || webhook.metric("graceguard_kind_index_over_cap{kind=\"configmaps\"}");
    assert_eq!(over_cap()?, Some(0.0));
    let api: Api<ConfigMap> = Api::namespaced(bed.client.clone(), &ns);
    let cm = configmap;
    // Past the cap: the index gives up.
    for i in 0..5 {
        assert_eq!(
            objects::create(&api, &cm(&format!("extra-{i}"), false)?).await?,
            CreateOutcome::Created
        );
    }
    webhook
        .wait_metric(
            "graceguard_kind_index_over_cap{kind=\"configmaps\"}",
            1.0,
            Duration::from_secs(30),
        )
        .await?;
    // Back within it: 4 go (the 5th stays), and one is held by a finalizer.
    for i in 0..4 {
        api.delete(&format!("extra-{i}"), &DeleteParams::default())
            .await?;
    }
    assert_eq!(
        objects::create(&api, &cm("held", true)?).await?,
        CreateOutcome::Created
    );
    api.delete("held", &DeleteParams::default()).await?;
    objects::wait_terminating(&api, "held").await?;
    // The index lists again by itself and guards the kind again.
    let deadline = Instant::now() + Duration::from_secs(60);
    while over_cap()? != Some(0.0) {
        anyhow::ensure!(
            Instant::now() < deadline,
            "the kind index stayed over its cap after the kind fit again (cap {cap})"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    objects::wait_indexed(&api, &cm("held", false)?, "graceguard.test/hold").await?;
    objects::denied_n_times(
        &api,
        &cm("held", false)?,
        1,
        "held by finalizer graceguard.test/hold",
    )
    .await?;
    let release = json!({"metadata": {"finalizers": null}});
    api.patch("held", &PatchParams::default(), &Patch::Merge(&release))
        .await?;
    Ok(())
}

/// A quota may count a kind no API serves (a CRD not installed yet):
/// discovery fails, its Creates are allowed unchecked, and it is tried again
/// once a minute. It used to be tried again at every event of the quota
/// watch, inside it: every charged Create writes the quota's status, so each
/// Create re-ran discovery (up to 10 s each when the API server is slow)
/// while the watch waited.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unserved_kind_a_quota_counts_is_not_rediscovered_at_every_quota_write() -> R {
    use testbed::webhook::{Hook, WebhookProcess};
    let bed = TestBed::start().await?;
    let ns = bed.namespace("unserved").await?;
    let webhook = WebhookProcess::start(&bed, &["--collision-kinds=*"]).await?;
    webhook.register(&bed, &[Hook::CollisionGuard]).await?;
    quota::set_named_quota(&bed, &ns, "objects", &[("pods", "50")]).await?;
    // Another quota counts a kind no API serves (the quota controller never
    // fills its status; it charges no pod).
    let unserved: k8s_openapi::api::core::v1::ResourceQuota = serde_json::from_value(json!({
        "metadata": {"name": "widgets"},
        "spec": {"hard": {"count/widgets.nowhere.graceguard.test": "5"}}
    }))?;
    Api::<k8s_openapi::api::core::v1::ResourceQuota>::namespaced(bed.client.clone(), &ns)
        .create(&PostParams::default(), &unserved)
        .await?;
    let needle = "cannot index this kind";
    let deadline = Instant::now() + Duration::from_secs(30);
    while webhook.log_lines_with(needle)? == 0 {
        anyhow::ensure!(
            Instant::now() < deadline,
            "the unserved kind was never tried"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Ten charged Creates: ten writes of the quota's status, ten watch events.
    let api: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);
    let before = quota::used(&bed.client, &ns, "objects", "pods").await?;
    for i in 0..10 {
        let pod = pods::task_pod_on(&format!("p{i}"), 1, None);
        assert_eq!(pods::create(&api, &pod).await?, CreateOutcome::Created);
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while quota::used(&bed.client, &ns, "objects", "pods").await? == before {
        anyhow::ensure!(
            Instant::now() < deadline,
            "the quota's status never changed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let tries = webhook.log_lines_with(needle)?;
    assert!(
        tries <= 2,
        "discovery of the unserved kind ran {tries} times in a few seconds of quota writes"
    );
    Ok(())
}
