//! Done-marks: a result (or an adopted pod) acknowledged by its caller is
//! labelled `graceguard.io/done=true` on its pod, conditionally on the
//! resourceVersion it was delivered with, so of two instances that both
//! believe they own it, one marks it and the other learns it lost. The same
//! write lets go of the result finalizer ([`crate::core::result_finalizer`]): an
//! acknowledged result needs no keeping.

use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client, ResourceExt};

use crate::core::naming::{CLAIMED_BY_ANNOTATION, DONE_LABEL};
use crate::core::result_finalizer;

/// What a done-mark came to.
#[derive(Clone, Debug)]
pub enum Marked {
    /// This instance labelled the pod done.
    Done,
    /// Already done, or changed under another claim: another adopter won.
    Lost,
    /// The pod no longer exists.
    Gone,
    /// The API server could not be asked (or this process does not hold
    /// its instance's Lease); the event stays acknowledged, the pod
    /// unmarked (it is delivered again after a restart).
    Failed(MarkFailed),
}

impl Marked {
    /// Whether this instance wrote the mark.
    pub fn is_done(&self) -> bool {
        matches!(self, Self::Done)
    }
}

/// Why a done-mark could not be written; the event stays acknowledged and
/// the pod unmarked, so it is delivered again after a restart.
#[derive(Clone, Debug, thiserror::Error)]
pub enum MarkFailed {
    #[error("marking pod {pod} done: {source}")]
    Patch {
        pod: String,
        #[source]
        source: Arc<kube::Error>,
    },
    #[error("re-reading pod {pod} after a conflict while marking it done: {source}")]
    Reread {
        pod: String,
        #[source]
        source: Arc<kube::Error>,
    },
    #[error("pod {pod} kept changing while being marked done (three conflicts); it is marked when delivered again")]
    KeptChanging { pod: String },
    #[error("pod {pod} not marked done: this process does not hold instance {instance}'s Lease now; it is delivered again once a process does")]
    NotFenced { pod: String, instance: String },
}

/// Labels pod `name` done for `instance` and removes graceguard's result
/// finalizer from `finalizers` (the pod's, as seen at resourceVersion
/// `rv`), conditionally on `rv`: a pod changed since is re-read, and if
/// another instance has marked or claimed it meanwhile, this one has lost
/// it.
pub async fn mark_done(
    client: &Client,
    namespace: &str,
    name: &str,
    rv: &str,
    finalizers: &[String],
    instance: &str,
) -> Marked {
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let mut rv = rv.to_string();
    let mut finalizers = finalizers.to_vec();
    // A conflict from an unrelated change (a status update) is retried on
    // the new version, unless the pod is done by then.
    for _ in 0..3 {
        let mut meta = serde_json::json!({"resourceVersion": rv, "labels": {DONE_LABEL: "true"}});
        if result_finalizer::holds(&finalizers) {
            meta["finalizers"] = serde_json::json!(result_finalizer::without(&finalizers));
        }
        let patch = serde_json::json!({ "metadata": meta });
        match api
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => return Marked::Done,
            Err(kube::Error::Api(s)) if s.code == 404 => return Marked::Gone,
            Err(kube::Error::Api(s)) if s.code == 409 => match api.get_opt(name).await {
                Ok(Some(p)) if p.labels().get(DONE_LABEL).is_some_and(|v| v == "true") => {
                    return Marked::Lost
                }
                // Claimed by another instance since (this one's Lease
                // lapsed): it delivers the result, not this one.
                Ok(Some(p))
                    if p.annotations()
                        .get(CLAIMED_BY_ANNOTATION)
                        .is_some_and(|c| c != instance) =>
                {
                    return Marked::Lost
                }
                Ok(Some(p)) => {
                    rv = p.resource_version().unwrap_or_default();
                    finalizers = p.finalizers().to_vec();
                }
                Ok(None) => return Marked::Gone,
                Err(e) => {
                    return Marked::Failed(MarkFailed::Reread {
                        pod: name.to_string(),
                        source: Arc::new(e),
                    })
                }
            },
            Err(e) => {
                return Marked::Failed(MarkFailed::Patch {
                    pod: name.to_string(),
                    source: Arc::new(e),
                })
            }
        }
    }
    Marked::Failed(MarkFailed::KeptChanging {
        pod: name.to_string(),
    })
}
