//! Hollow nodes (kubemark's hollow kubelet, `scripts/cluster up
//! --hollow-nodes N`, the nodes of `scripts/bench`'s cluster_churn): each
//! registers its own Node as `system:node:<name>` under the Node authorizer
//! and NodeRestriction, tainted so that only pods that tolerate it land
//! there, and runs the pods bound to it on its fake runtime: they run beside
//! a real node.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Patch, PatchParams, PostParams};
use kube::Api;
use serde_json::json;
use testbed::node::hollow;
use testbed::{TestBed, TestBedOptions};

type R = anyhow::Result<()>;

async fn node_of_when_running(api: &Api<Pod>, name: &str) -> anyhow::Result<String> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let p = api.get(name).await?;
        let node = p.spec.as_ref().and_then(|s| s.node_name.clone());
        let phase = p.status.as_ref().and_then(|s| s.phase.clone());
        if let (Some(node), Some("Running")) = (node, phase.as_deref()) {
            return Ok(node);
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "pod {name} was not Running within 120 s (phase {phase:?})"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hollow_nodes_register_as_themselves_tainted_and_run_only_tolerating_pods() -> R {
    let bed = TestBed::start_with(TestBedOptions {
        real_nodes: 1,
        hollow_nodes: 2,
        ..Default::default()
    })
    .await?;
    let nodes: Api<Node> = Api::all(bed.client.clone());
    for k in 1..=2 {
        let n = nodes.get(&hollow::name(k)).await?;
        let taints = n
            .spec
            .as_ref()
            .and_then(|s| s.taints.clone())
            .unwrap_or_default();
        assert!(
            taints
                .iter()
                .any(|t| t.key == hollow::TAINT_KEY && t.effect == "NoSchedule"),
            "{} registered without the hollow taint: {taints:?}",
            hollow::name(k)
        );
        assert_eq!(
            n.metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(hollow::LABEL.0))
                .map(String::as_str),
            Some(hollow::LABEL.1)
        );
    }

    // One hollow node's identity may not write another's Node (the Node
    // authorizer and NodeRestriction judge it as a kubelet).
    let as_hollow_1 =
        testbed::control_plane::client_from(&bed.node_kubeconfig("hollow-1")?).await?;
    let other: Api<Node> = Api::all(as_hollow_1);
    let label = json!({"metadata": {"labels": {"graceguard.test/by": "hollow-1"}}});
    match other
        .patch("hollow-2", &PatchParams::default(), &Patch::Merge(&label))
        .await
    {
        Err(kube::Error::Api(s)) => {
            assert_eq!(s.code, 403, "hollow-1 writing hollow-2's Node: {s:?}")
        }
        other => panic!("hollow-1 wrote hollow-2's Node: {other:?}"),
    }

    let ns = bed.namespace("hollow").await?;
    let api: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);
    let pod = |name: &str, tolerate: bool| -> anyhow::Result<Pod> {
        let mut spec = json!({"terminationGracePeriodSeconds": 0,
            "containers": [{"name": "main", "image": bed.task_image()?, "imagePullPolicy": "IfNotPresent",
                "command": ["sleep", "3600"]}]});
        if tolerate {
            spec["tolerations"] =
                json!([{"key": hollow::TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}]);
            spec["nodeSelector"] = json!({hollow::LABEL.0: hollow::LABEL.1});
        }
        Ok(serde_json::from_value(
            json!({"metadata": {"name": name}, "spec": spec}),
        )?)
    };
    api.create(&PostParams::default(), &pod("plain", false)?)
        .await?;
    api.create(&PostParams::default(), &pod("tolerating", true)?)
        .await?;
    assert_eq!(
        node_of_when_running(&api, "plain").await?,
        "node-1",
        "a pod that does not tolerate the taint"
    );
    let on = node_of_when_running(&api, "tolerating").await?;
    assert!(
        on.starts_with("hollow-"),
        "the tolerating pod runs on {on}, not a hollow node"
    );
    Ok(())
}
