//! The Helm chart installed into the real test-bed apiserver with the real
//! helm CLI (Helm 4, `scripts/install-helm`; scripts/test exports
//! GRACEGUARD_HELM): a server-side dry run first (every object through the
//! API server's validation and admission, nothing stored), then the install,
//! then an upgrade with the same values that must keep the self-signed pair
//! and every caBundle. Pods are not waited for (no kubelet runs here; real
//! installs on real nodes are tests/tests/e2e/helm_install.rs).

use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::{Pod, ResourceQuota, Secret};
use kube::api::{ListParams, PostParams};
use kube::Api;
use testbed::helm::{chart_dir, Helm};
use testbed::pods::{self, CreateOutcome};
use testbed::TestBed;

type R = anyhow::Result<()>;

/// The chart's default priority class under an API server that limits it
/// by quota (the bed's admission configuration, as on GKE): a pod of that
/// class is refused in a namespace without a quota covering it, and admitted
/// in the release namespace, whose quota the chart brought.
async fn priority_class_admitted_only_under_the_charts_quota(bed: &TestBed) -> R {
    const CLASS: &str = "system-cluster-critical";
    assert!(
        testbed::control_plane::QUOTA_LIMITED_PRIORITY_CLASSES.contains(&CLASS),
        "the bed no longer limits {CLASS}: this check would prove nothing"
    );
    let quotas: Api<ResourceQuota> = Api::namespaced(bed.client.clone(), "graceguard");
    let rq = quotas.get("graceguard-priority-class").await?;
    let spec = serde_json::to_value(&rq.spec)?;
    assert_eq!(spec["hard"]["pods"], "10", "{spec}");
    assert_eq!(
        spec["scopeSelector"]["matchExpressions"],
        serde_json::json!([{"scopeName": "PriorityClass", "operator": "In", "values": [CLASS]}]),
        "{spec}"
    );
    // As a cluster has it: the quota controller has filled its status.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !testbed::quota::in_force(bed, "graceguard", "graceguard-priority-class").await? {
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "kube-controller-manager did not fill the chart's quota's status within 60 s"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let critical = |name: &str| {
        let mut p = pods::task_pod(name, 0);
        if let Some(spec) = p.spec.as_mut() {
            spec.priority_class_name = Some(CLASS.into());
        }
        p
    };
    let elsewhere = bed.namespace("no-critical-quota").await?;
    let refused = pods::outcome(
        Api::<Pod>::namespaced(bed.client.clone(), &elsewhere)
            .create(&dry, &critical("critical"))
            .await,
    )?;
    match &refused {
        // The quota plugin's plain error: the API server answers it 500, not 403.
        CreateOutcome::Refused { message, .. } if message.contains("insufficient quota to match these scopes") => {}
        other => panic!("a {CLASS} pod in {elsewhere} (no quota covering the class) got {other:?}, not the quota plugin's refusal: the bed does not limit the class, so the chart's quota is not tested"),
    }
    let admitted = pods::outcome(
        Api::<Pod>::namespaced(bed.client.clone(), "graceguard")
            .create(&dry, &critical("critical"))
            .await,
    )?;
    assert_eq!(
        admitted,
        CreateOutcome::Created,
        "a {CLASS} pod in the release namespace was not admitted under the chart's quota"
    );
    Ok(())
}

/// The TLS Secret's data and every webhook's caBundle, to compare across an upgrade.
async fn certificate_material(bed: &TestBed) -> anyhow::Result<Vec<(String, Vec<u8>)>> {
    let mut out = Vec::new();
    let secret = Api::<Secret>::namespaced(bed.client.clone(), "graceguard")
        .get("graceguard-tls")
        .await?;
    for (k, v) in secret.data.unwrap_or_default() {
        out.push((format!("Secret graceguard-tls {k}"), v.0));
    }
    for (name, cc) in
        testbed::helm::webhook_clients(bed, "app.kubernetes.io/instance=graceguard").await?
    {
        out.push((name, cc.ca_bundle.map(|b| b.0).unwrap_or_default()));
    }
    anyhow::ensure!(
        out.iter().all(|(_, v)| !v.is_empty()),
        "empty certificate material: {:?}",
        out.iter()
            .filter(|(_, v)| v.is_empty())
            .map(|(k, _)| k)
            .collect::<Vec<_>>()
    );
    Ok(out)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chart_installs_and_its_service_account_reads_what_it_indexes_and_only_patches_pod_status(
) -> R {
    let bed = TestBed::start().await?;
    let helm = Helm::for_bed(&bed)?;
    let chart = chart_dir().display().to_string();
    let base = [
        "graceguard",
        chart.as_str(),
        "-n",
        "graceguard",
        "--create-namespace",
    ];
    let dry = helm.ok(&[&["install"][..], &base, &["--dry-run=server"]].concat())?;
    assert!(
        dry.contains("STATUS: pending-install"),
        "the server-side dry run did not run: {dry}"
    );
    let out = helm.ok(&[&["install"][..], &base, &["-o", "json"]].concat())?;
    let release: serde_json::Value = serde_json::from_str(&out)?;
    assert_eq!(release["info"]["status"], "deployed", "{out}");
    let before = certificate_material(&bed).await?;
    helm.ok(&[
        "upgrade",
        "graceguard",
        &chart,
        "-n",
        "graceguard",
        "--reuse-values",
    ])?;
    assert_eq!(
        certificate_material(&bed).await?,
        before,
        "the upgrade changed certificate material"
    );
    priority_class_admitted_only_under_the_charts_quota(&bed).await?;
    let (sa_ns, sa_name) = ("graceguard", "graceguard");
    let who = format!("--as=system:serviceaccount:{sa_ns}:{sa_name}");

    // Exactly get/list/watch on pods and namespaces and on the collision
    // guard's default kinds and resourcequotas, list/watch on leases for the
    // fencing check, and patch on pods/status for the tagger's follow-up;
    // nothing else.
    let follow_up = [("patch", "pods --subresource=status")];
    let reads = [
        ("list", "leases.coordination.k8s.io"),
        ("watch", "leases.coordination.k8s.io"),
        ("watch", "persistentvolumeclaims"),
        ("get", "services"),
        ("list", "jobs.batch"),
        ("watch", "resourcequotas"),
        ("get", "pods"),
        ("list", "pods"),
        ("watch", "pods"),
        ("get", "namespaces"),
        ("list", "namespaces"),
        ("watch", "namespaces"),
    ];
    let allowed: Vec<_> = reads.iter().chain(follow_up.iter()).copied().collect();
    let denied: Vec<_> = [
        ("create", "pods"),
        ("update", "pods"),
        ("patch", "pods"),
        ("list", "configmaps"),
        ("delete", "pods"),
        ("deletecollection", "pods"),
        ("create", "namespaces"),
        ("update", "namespaces"),
        ("delete", "namespaces"),
        ("get", "secrets"),
        ("update", "configmaps"),
        ("create", "jobs.batch"),
        ("create", "events"),
        ("list", "nodes"),
        ("create", "pods --subresource=eviction"),
        ("update", "validatingwebhookconfigurations"),
        ("get", "leases.coordination.k8s.io"),
        ("update", "leases.coordination.k8s.io"),
    ]
    .into_iter()
    .collect();
    for (verb, resource) in allowed.iter().chain(denied.iter()) {
        let want = allowed.contains(&(*verb, *resource));
        let mut args = vec!["auth", "can-i", verb];
        args.extend(resource.split(' '));
        args.extend(["--all-namespaces", &who]);
        let (ok, answer, err) = bed.kubectl("admin", &args)?;
        assert_eq!(ok, want, "can-i {verb} {resource}: {answer} {err}");
        assert_eq!(
            answer.trim(),
            if want { "yes" } else { "no" },
            "can-i {verb} {resource}"
        );
    }

    // The webhooks are registered, fail open, and skip their own namespace;
    // the API server accepted the chart's matchConditions (it compiles the
    // CEL when the configuration is created).
    let sel = ListParams::default().labels("app.kubernetes.io/instance=graceguard");
    let v = Api::<ValidatingWebhookConfiguration>::all(bed.client.clone())
        .list(&sel)
        .await?;
    let m = Api::<MutatingWebhookConfiguration>::all(bed.client.clone())
        .list(&sel)
        .await?;
    // Both kinds of configuration, read through one JSON shape.
    let mut hooks = Vec::new();
    let configs = v
        .items
        .iter()
        .map(serde_json::to_value)
        .chain(m.items.iter().map(serde_json::to_value));
    for c in configs {
        for w in c?["webhooks"].as_array().cloned().unwrap_or_default() {
            hooks.push((
                w["name"].as_str().unwrap_or("").to_string(),
                w["failurePolicy"].as_str().map(str::to_string),
                w["namespaceSelector"].clone(),
                w["clientConfig"]["caBundle"]
                    .as_str()
                    .is_some_and(|b| !b.is_empty()),
                w["matchConditions"].as_array().map_or(0, Vec::len),
            ));
        }
    }
    // The collision guard's configuration holds pods, the other kinds and
    // the release-fencing check.
    assert_eq!(hooks.len(), 6, "{hooks:?}");
    assert!(
        hooks
            .iter()
            .any(|(name, ..)| name == "disruption-tagger.graceguard.io"),
        "the tagger is registered: {hooks:?}"
    );
    for (name, policy, selector, ca, conditions) in &hooks {
        // As many as files/match-conditions.yaml gives each (the eviction
        // audit none): the collision guard's three (client-named, not a
        // mirror pod, not system-critical), one each for the others.
        let want = match name.as_str() {
            "collision-guard.graceguard.io" | "collision-guard-kinds.graceguard.io" => 3,
            "disruption-tagger.graceguard.io"
            | "deletion-audit.graceguard.io"
            | "release-fencing.graceguard.io" => 1,
            _ => 0,
        };
        assert_eq!(
            *conditions,
            want,
            "{name}: matchConditions on {}",
            bed.version.as_str()
        );
        assert_eq!(policy.as_deref(), Some("Ignore"), "{name}");
        assert!(*ca, "{name} has a caBundle");
        // The opt-out label for the guard and the tagger; never for the
        // audits, which still skip graceguard's own namespace by name.
        let sel = serde_json::to_string(selector)?;
        let audit = name.ends_with("-audit.graceguard.io");
        assert_eq!(
            sel.contains("graceguard.io/ignore"),
            !audit,
            "{name}: {sel}"
        );
        assert!(sel.contains("\"graceguard\""), "{name}: {sel}");
    }
    Ok(())
}

/// `failurePolicy: Fail` with every replica gone (here none ever runs: no
/// kubelet) cannot lock the cluster. With `excludeNamespaces` overridden to a
/// list without kube-system (which used to drop it), an ordinary named pod in
/// a covered namespace is refused (the webhook is in force), while what a
/// joining node and the cluster's own add-ons need is admitted: pods in
/// kube-system, a node's mirror pod created as the node, and
/// system-node-critical and system-cluster-critical pods in any namespace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_fail_with_no_replica_up_a_joining_nodes_system_pods_are_admitted() -> R {
    let bed = TestBed::start().await?;
    let helm = Helm::for_bed(&bed)?;
    let chart = chart_dir().display().to_string();
    helm.ok(&[
        "install",
        "graceguard",
        &chart,
        "-n",
        "graceguard",
        "--create-namespace",
        "--set",
        "webhooks.collisionGuard.failurePolicy=Fail",
        "--set",
        "replicaCount=2",
        "--set",
        "webhooks.excludeNamespaces={monitoring}",
    ])?;
    let ns = bed.namespace("team").await?;
    let team: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);
    // The API server picks the configuration up within a moment; then an
    // ordinary pod is refused: no replica answers and the policy is Fail.
    let plain = pods::task_pod_on("plain", 1, None);
    let refusal = pods::wait_refused(&team, &plain, std::time::Duration::from_secs(30)).await?;
    assert!(
        refusal.contains("collision-guard.graceguard.io"),
        "{refusal}"
    );

    // kube-system, though excludeNamespaces no longer lists it.
    let system: Api<Pod> = Api::namespaced(bed.client.clone(), "kube-system");
    assert_eq!(
        pods::admitted(&system, &pods::task_pod_on("kube-proxy-x", 1, None)).await?,
        Ok(())
    );
    // The cluster-critical classes, in a covered namespace (under a quota
    // that admits them, as the bed's API server limits them like GKE's).
    let quota: k8s_openapi::api::core::v1::ResourceQuota =
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "critical"},
            "spec": {"hard": {"pods": "10"}, "scopeSelector": {"matchExpressions": [{
                "scopeName": "PriorityClass", "operator": "In",
                "values": testbed::control_plane::QUOTA_LIMITED_PRIORITY_CLASSES}]}},
        }))?;
    Api::<k8s_openapi::api::core::v1::ResourceQuota>::namespaced(bed.client.clone(), &ns)
        .create(&PostParams::default(), &quota)
        .await?;
    for class in testbed::control_plane::QUOTA_LIMITED_PRIORITY_CLASSES {
        let mut pod = pods::task_pod_on(&format!("agent-{class}"), 1, None);
        if let Some(spec) = pod.spec.as_mut() {
            spec.priority_class_name = Some(class.to_string());
        }
        // The quota's status is filled by its controller a moment later.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            match pods::admitted(&team, &pod).await? {
                Ok(()) => break,
                Err(why) if why.contains("graceguard") => {
                    panic!("{class} refused by graceguard: {why}")
                }
                Err(why) => {
                    anyhow::ensure!(std::time::Instant::now() < deadline, "{class}: {why}");
                    tokio::time::sleep(std::time::Duration::from_millis(250)).await;
                }
            }
        }
    }
    // A joining node's mirror pod (its static pod's record), created as the
    // node, owned by its Node as NodeRestriction requires.
    bed.register_node("node-1").await?;
    let node = Api::<k8s_openapi::api::core::v1::Node>::all(bed.client.clone())
        .get("node-1")
        .await?;
    let mut mirror = pods::task_pod_on("static-web-node-1", 1, Some("node-1"));
    mirror.metadata.annotations = Some(
        [(
            "kubernetes.io/config.mirror".to_string(),
            "0123456789abcdef".to_string(),
        )]
        .into(),
    );
    mirror.metadata.owner_references = Some(vec![
        k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference {
            api_version: "v1".into(),
            kind: "Node".into(),
            name: "node-1".into(),
            uid: node.metadata.uid.clone().unwrap_or_default(),
            controller: Some(true),
            ..Default::default()
        },
    ]);
    let as_node: Api<Pod> = Api::namespaced(bed.client_as("node-1").await?, &ns);
    as_node
        .create(&PostParams::default(), &mirror)
        .await
        .map_err(|e| anyhow::anyhow!("the node's mirror pod was refused: {e}"))?;
    // The same pod without the mirror annotation, from a user: refused.
    assert!(
        pods::admitted(&team, &pods::task_pod_on("static-web-copy", 1, None))
            .await?
            .is_err()
    );
    Ok(())
}
