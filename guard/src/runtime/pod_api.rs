//! The executor's calls to the Kubernetes API (the pod watch, Create, read,
//! Delete, the result finalizer's release, the namespace and clock probes),
//! each turned into what the reconciler is told ([`AnswerKind`]). The loop
//! makes them through [`PodApi`], so its tests drive it with a fake under
//! paused time; [`KubePods`] is the API server's. The pod an attempt
//! creates is [`crate::core::template::Template::pod_for`]'s.

use std::future::Future;
use std::time::Duration;

use futures::stream::BoxStream;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client, ResourceExt};

pub use crate::core::answer::{AnswerKind, Released};
use crate::core::classify::{classify, ApiError, CreateRefusal};
use crate::core::reconcile::Existing;
use crate::core::result_finalizer;
use crate::runtime::api_timeouts;
use crate::runtime::pod_index::Version;

/// One item of the executor's pod watch.
pub type WatchEvent = Result<Event<Pod>, watcher::Error>;

/// Every call the executor's loop makes to the API server. Each answer is
/// already what the loop needs; none fails the loop.
pub trait PodApi: Clone + Send + Sync + 'static {
    /// The pods matching `selector` (in the scope the API was made for):
    /// a list, then changes; after an error the stream retries with a
    /// backoff of its own. A new call lists again.
    fn watch(&self, selector: &str) -> BoxStream<'static, WatchEvent>;

    /// [`create`].
    fn create(
        &self,
        namespace: &str,
        pod: &serde_json::Map<String, serde_json::Value>,
    ) -> impl Future<Output = AnswerKind> + Send;

    /// [`read`].
    fn read(&self, namespace: &str, name: &str) -> impl Future<Output = AnswerKind> + Send;

    /// [`delete_exact`].
    fn delete_exact(
        &self,
        namespace: &str,
        name: &str,
        uid: &str,
    ) -> impl Future<Output = bool> + Send;

    /// [`release`].
    fn release(
        &self,
        namespace: &str,
        v: &Version,
        token: Option<String>,
    ) -> impl Future<Output = Released> + Send;

    /// [`crate::runtime::namespace_state::is_terminating`].
    fn namespace_terminating(&self, namespace: &str) -> impl Future<Output = Option<bool>> + Send;

    /// [`crate::runtime::server_clock::offset_ms`], against the clock `local_ms`.
    fn server_offset_ms(
        &self,
        local_ms: impl Fn() -> i64 + Send,
    ) -> impl Future<Output = Option<i64>> + Send;
}

/// The API server's pods, through `client`: in one namespace, or in all
/// (which needs cluster-wide list and watch on pods).
#[derive(Clone)]
pub struct KubePods {
    client: Client,
    scope: Option<String>,
}

impl KubePods {
    pub fn new(client: Client, scope: Option<String>) -> Self {
        Self { client, scope }
    }

    fn api(&self, namespace: &str) -> Api<Pod> {
        Api::namespaced(self.client.clone(), namespace)
    }
}

impl PodApi for KubePods {
    fn watch(&self, selector: &str) -> BoxStream<'static, WatchEvent> {
        let api: Api<Pod> = match &self.scope {
            Some(ns) => Api::namespaced(self.client.clone(), ns),
            None => Api::all(self.client.clone()),
        };
        watcher::watcher(api, api_timeouts::watch_config(selector))
            .default_backoff()
            .boxed()
    }

    async fn create(
        &self,
        namespace: &str,
        pod: &serde_json::Map<String, serde_json::Value>,
    ) -> AnswerKind {
        create(&self.client, namespace, pod).await
    }

    async fn read(&self, namespace: &str, name: &str) -> AnswerKind {
        read(&self.api(namespace), name).await
    }

    async fn delete_exact(&self, namespace: &str, name: &str, uid: &str) -> bool {
        delete_exact(&self.api(namespace), name, uid).await
    }

    async fn release(&self, namespace: &str, v: &Version, token: Option<String>) -> Released {
        release(&self.api(namespace), v, token).await
    }

    async fn namespace_terminating(&self, namespace: &str) -> Option<bool> {
        crate::runtime::namespace_state::is_terminating(&self.client, namespace).await
    }

    async fn server_offset_ms(&self, local_ms: impl Fn() -> i64 + Send) -> Option<i64> {
        crate::runtime::server_clock::offset_ms(&self.client, local_ms).await
    }
}

/// What graceguard reads of a created pod.
#[derive(serde::Deserialize)]
struct Created {
    metadata: kube::api::ObjectMeta,
}

/// Creates `pod` (a template's JSON, [`crate::core::template::Template::pod_for`])
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
