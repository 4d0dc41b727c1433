//! The sidecar API as a product: its OpenAPI document (generated, valid,
//! true to the Kubernetes schemas it includes, and compiling into a
//! generated client), and the Go and Python client packages in `clients/`
//! driving every call against real sidecars on both transports.

use testbed::kube_schemas;
use testbed::{KubeVersion, TestBed};

type R = anyhow::Result<()>;

/// Pod template fields v1.20 served that v1.37 does not:
/// `EphemeralVolumeSource.readOnly` (dropped in v1.22), `Handler` (a
/// lifecycle hook's schema, renamed `LifecycleHandler` in v1.23: the same
/// fields under the new name) and `ObjectMeta.clusterName` (removed in
/// v1.25).
const REMOVED_SINCE_1_20: &[&str] = &[
    "io.k8s.api.core.v1.EphemeralVolumeSource.readOnly",
    "io.k8s.api.core.v1.Handler.exec",
    "io.k8s.api.core.v1.Handler.httpGet",
    "io.k8s.api.core.v1.Handler.tcpSocket",
    "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta.clusterName",
];

/// Where the committed documents live.
fn guard_file(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../guard")
        .join(name)
}

/// The pod template schemas the document includes are the ones the API
/// server checks a pod against: on v1.37 exactly what it serves at
/// `/openapi/v3/api/v1` (set `GRACEGUARD_UPDATE_OPENAPI=1` to rewrite
/// `guard/openapi-kubernetes.json` from it); on v1.20, which serves only
/// v2, every property it knows is in the document.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documents_kubernetes_schemas_are_the_api_servers() -> R {
    let bed = TestBed::start().await?;
    let path = guard_file("openapi-kubernetes.json");
    let committed: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
    let committed = committed["schemas"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    match bed.version {
        KubeVersion::V1_37 => {
            let served = kube_schemas::served_v3(&bed).await?;
            let served: serde_json::Map<String, serde_json::Value> = served.into_iter().collect();
            if std::env::var("GRACEGUARD_UPDATE_OPENAPI").as_deref() == Ok("1") {
                let doc = serde_json::json!({
                    "source": "kube-apiserver v1.37.2, GET /openapi/v3/api/v1: io.k8s.api.core.v1.PodTemplateSpec and every schema it refers to",
                    "schemas": served,
                });
                std::fs::write(&path, serde_json::to_string_pretty(&doc)? + "\n")?;
            }
            assert!(served.len() > 50, "{} schemas", served.len());
            assert!(
                committed == served,
                "guard/openapi-kubernetes.json differs from the API server's schemas: rerun this test with GRACEGUARD_UPDATE_OPENAPI=1, then `graceguard openapi > guard/openapi.json`"
            );
        }
        KubeVersion::V1_20 => {
            let served = kube_schemas::served_v2_properties(&bed).await?;
            assert!(served.len() > 50, "{} schemas", served.len());
            let mut missing = Vec::new();
            for (name, props) in served {
                let ours = committed
                    .get(&name)
                    .map(kube_schemas::properties)
                    .unwrap_or_default();
                missing.extend(props.difference(&ours).map(|p| format!("{name}.{p}")));
            }
            assert_eq!(
                missing,
                REMOVED_SINCE_1_20,
                "the fields v1.20 knows that the document (v1.37) does not"
            );
        }
    }
    Ok(())
}
