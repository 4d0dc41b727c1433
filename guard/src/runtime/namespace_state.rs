//! Whether a namespace is being deleted, asked with the executor's own
//! namespace-level rights (no `get` on namespaces, a cluster-scoped
//! resource): a dry-run Create of an Event, which the API server's
//! NamespaceLifecycle admission refuses in a terminating namespace with the
//! cause `NamespaceTerminating`. Nothing is stored.

use k8s_openapi::api::core::v1::{Event, ObjectReference};
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};

/// The cause NamespaceLifecycle gives (`v1.NamespaceTerminatingCause`).
const TERMINATING_CAUSE: &str = "NamespaceTerminating";

/// `Some(true)`: `namespace` is being deleted; `Some(false)`: it is not (or
/// this identity may not ask, which reads the same); `None`: the API server
/// could not be asked.
pub async fn is_terminating(client: &Client, namespace: &str) -> Option<bool> {
    let api: Api<Event> = Api::namespaced(client.clone(), namespace);
    let probe = Event {
        metadata: ObjectMeta {
            generate_name: Some("graceguard-namespace-probe-".into()),
            namespace: Some(namespace.into()),
            ..Default::default()
        },
        involved_object: ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Namespace".into()),
            name: Some(namespace.into()),
            namespace: Some(namespace.into()),
            ..Default::default()
        },
        reason: Some("Probe".into()),
        message: Some("graceguard asks whether this namespace is being deleted (dry run)".into()),
        type_: Some("Normal".into()),
        ..Default::default()
    };
    let pp = PostParams {
        dry_run: true,
        ..Default::default()
    };
    match api.create(&pp, &probe).await {
        Ok(_) => Some(false),
        Err(kube::Error::Api(s)) => Some(
            s.code == 403
                && (s
                    .details
                    .iter()
                    .flat_map(|d| d.causes.iter())
                    .any(|c| c.reason == TERMINATING_CAUSE)
                    || s.message.contains("because it is being terminated")),
        ),
        Err(e) => {
            tracing::debug!(%namespace, error = %e, "asking whether the namespace is being deleted failed");
            None
        }
    }
}
