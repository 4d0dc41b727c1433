//! The executor's pod calls to the Kubernetes API (Create, read, Delete,
//! the result finalizer's release), each turned into what the reconciler is
//! told ([`AnswerKind`]). The pod an attempt creates is
//! [`crate::template::Template::pod_for`]'s.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::{Api, ResourceExt};

use crate::classify::{classify, ApiError, CreateRefusal};
use crate::pod_index::Version;
use crate::reconcile::Existing;
use crate::result_finalizer;

/// What an API call answered, for the task that asked.
#[derive(Debug)]
pub enum AnswerKind {
    Created(String),
    Refused {
        refusal: CreateRefusal,
        retry_after: Option<Duration>,
    },
    Unknown,
    Read(Option<Existing>),
    ReadFailed,
    DeleteFailed,
    /// Not sent: the namespace waits for quota and another task's Create is
    /// the window's probe ([`crate::backoff::NamespaceBackoffs::probe`]);
    /// ask again at this instant.
    Held(std::time::Instant),
    /// The result finalizer of pod `uid` was let go of (or not).
    Released {
        uid: String,
        outcome: Released,
    },
    /// Whether the task's namespace is being deleted (`None`: not known).
    Namespace(Option<bool>),
    /// Look at the task's result finalizers again (after a failed release).
    Recheck,
}

/// What graceguard reads of a created pod.
#[derive(serde::Deserialize)]
struct Created {
    metadata: kube::api::ObjectMeta,
}

/// Creates `pod` (a template's JSON, [`crate::template::Template::pod_for`])
/// in `namespace` as it is, with `fieldValidation=Strict`: a field the
/// server does not know is refused by the server (400, naming it), never
/// dropped. A refusal is classified ([`classify`]).
pub async fn create(
    client: &kube::Client,
    namespace: &str,
    pod: &serde_json::Map<String, serde_json::Value>,
) -> AnswerKind {
    let name = pod
        .get("metadata")
        .and_then(|m| m.get("name"))
        .and_then(serde_json::Value::as_str)
        .unwrap_or_default()
        .to_string();
    let request = serde_json::to_vec(pod)
        .map_err(|e| e.to_string())
        .and_then(|body| {
            http::Request::post(format!(
                "/api/v1/namespaces/{namespace}/pods?fieldValidation=Strict"
            ))
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(body)
            .map_err(|e| e.to_string())
        });
    let request = match request {
        Ok(r) => r,
        Err(e) => {
            // Only a namespace that is no URI path could get here.
            return AnswerKind::Refused {
                refusal: CreateRefusal::Configuration {
                    message: format!(
                        "the Create of pod {name} in namespace {namespace:?} cannot be sent: {e}"
                    ),
                },
                retry_after: None,
            };
        }
    };
    match client.request::<Created>(request).await {
        Ok(p) => AnswerKind::Created(p.metadata.uid.unwrap_or_default()),
        Err(kube::Error::Api(s)) if fenced_out(&s) => {
            // Sent under a Lease term that ended before the Create reached
            // the API server: not created. Whoever holds the Lease now
            // decides; this process reads the name first if it acts again.
            tracing::warn!(pod = %name, message = %s.message, "the Create arrived after another process took the instance Lease over; graceguard's webhook refused it");
            AnswerKind::Unknown
        }
        Err(kube::Error::Api(s)) => {
            let e = ApiError {
                code: s.code,
                reason: s.reason.clone(),
                message: s.message.clone(),
                causes: s
                    .details
                    .iter()
                    .flat_map(|d| d.causes.iter().map(|c| c.reason.clone()))
                    .collect(),
            };
            let refusal = classify(&e);
            tracing::debug!(pod = %name, ?refusal, message = %e.message, "create refused");
            AnswerKind::Refused {
                refusal,
                // 429 (graceguard's retry mode, API priority and fairness)
                // says how long to wait.
                retry_after: s
                    .details
                    .as_ref()
                    .map(|d| Duration::from_secs(d.retry_after_seconds.into()))
                    .filter(|d| !d.is_zero()),
            }
        }
        Err(e) => {
            tracing::warn!(pod = %name, error = %e, "create outcome unknown; reading the name before creating again");
            AnswerKind::Unknown
        }
    }
}

/// Reads the pod holding `name`.
pub async fn read(api: &Api<Pod>, name: &str) -> AnswerKind {
    match api.get_opt(name).await {
        Ok(found) => AnswerKind::Read(found.map(|p| Existing {
            uid: p.uid().unwrap_or_default(),
            labels: p.labels().clone(),
            deleting: p.metadata.deletion_timestamp.is_some(),
        })),
        Err(e) => {
            tracing::warn!(pod = %name, error = %e, "reading the pod holding the name failed; retrying");
            AnswerKind::ReadFailed
        }
    }
}

/// Deletes pod `name` gracefully only if it is still `uid` (a pod of the same
/// name created since is left alone). False if the API server could not be
/// asked (the caller tries again later).
pub async fn delete_exact(api: &Api<Pod>, name: &str, uid: &str) -> bool {
    let dp = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some(uid.to_string()),
            resource_version: None,
        }),
        ..Default::default()
    };
    if let Err(e) = api.delete(name, &dp).await {
        // 404: already gone; 409: the name holds another pod now.
        if !matches!(&e, kube::Error::Api(s) if s.code == 404 || s.code == 409) {
            tracing::warn!(pod = %name, error = %e, "deleting the pod failed; trying again after a backoff");
            return false;
        }
    }
    true
}

/// What letting go of a pod's result finalizer came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Released {
    /// Written, or nothing to write (gone, or no longer holding it).
    Done,
    /// The pod changed since it was seen: its next version is decided again.
    Changed,
    /// The API server could not be asked.
    Failed,
}

/// Whether graceguard's webhook refused a write as sent under a Lease term
/// that is over ([`graceguard_contract::fencing`]).
fn fenced_out(s: &kube::core::Status) -> bool {
    s.details.as_ref().is_some_and(|d| {
        d.causes
            .iter()
            .any(|c| c.reason == graceguard_contract::fencing::STALE_CAUSE)
    })
}

/// Removes graceguard's result finalizer from pod `v`, conditionally on the
/// resourceVersion it was seen at (the other finalizers are written back as
/// they were then), under the Lease term `token` when this process holds
/// one (graceguard's webhook refuses a release sent under a term that is over).
pub async fn release(api: &Api<Pod>, v: &Version, token: Option<String>) -> Released {
    let mut meta = serde_json::json!({
        "resourceVersion": v.resource_version,
        "finalizers": result_finalizer::without(&v.finalizers),
    });
    if let Some(token) = token {
        meta["annotations"] =
            serde_json::json!({ graceguard_contract::fencing::RELEASED_UNDER: token });
    }
    let patch = serde_json::json!({ "metadata": meta });
    match api
        .patch(&v.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Released::Done,
        Err(kube::Error::Api(s)) if s.code == 404 => Released::Done,
        Err(kube::Error::Api(s)) if fenced_out(&s) => {
            tracing::warn!(pod = %v.name, "the finalizer release arrived after another process took the instance Lease over; graceguard's webhook refused it");
            Released::Failed
        }
        Err(kube::Error::Api(s)) if s.code == 409 => Released::Changed,
        Err(e) => {
            tracing::warn!(pod = %v.name, error = %e, "removing the result finalizer failed; trying again at the pod's next change or sync");
            Released::Failed
        }
    }
}
