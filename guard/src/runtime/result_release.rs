//! `graceguard release-results`: lets go of the result finalizers no
//! executor will: those on pods of an instance gone for good (its Lease
//! released, missing, or not renewed for its duration as seen here), and
//! every one in a namespace being deleted. A running executor lets go of its
//! own; adoption (`graceguard sidecar --adopt`) delivers a dead instance's
//! results and lets go after their acknowledgement. This is the cleanup for
//! what neither will reach; results still held are not delivered by it.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};
use serde::Serialize;
use tokio::time::Instant;

use crate::core::naming::{INSTANCE_LABEL, MANAGED_BY, MANAGED_BY_LABEL};
use crate::core::result_finalizer;
use crate::runtime::error::GuardError;
use crate::runtime::lease::{lease_name, Liveness, Observer};
use crate::runtime::pod_api::{self, Released};
use crate::runtime::pod_index::Version;

/// What to release.
#[derive(Clone, Debug)]
pub struct ReleaseRequest {
    pub namespace: String,
    /// Only this instance's pods (default: every instance's).
    pub instance: Option<String>,
    /// Where the instances' Leases live.
    pub lease_namespace: String,
    /// Release without looking at the owners' Leases (an instance known to
    /// be gone for good whose Lease is still renewed by mistake: careful).
    pub force: bool,
    /// How long to watch a Lease that looks held for a renewal.
    pub lease_wait: Duration,
}

/// What became of one pod.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PodReleased {
    pub namespace: String,
    pub pod: String,
    pub instance: String,
    /// `released`, `kept` (its owner lives and releases it itself),
    /// `changed` (it changed meanwhile: run again) or `failed`.
    pub outcome: &'static str,
    pub detail: String,
}

/// Releases what `req` asks for; one entry per pod that held the finalizer.
pub async fn release_results(
    client: &Client,
    req: &ReleaseRequest,
) -> Result<Vec<PodReleased>, GuardError> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), &req.namespace);
    let mut selector = format!("{MANAGED_BY_LABEL}={MANAGED_BY}");
    if let Some(i) = &req.instance {
        selector.push_str(&format!(",{INSTANCE_LABEL}={i}"));
    }
    let listed = pods
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(|e| {
            GuardError::api(format!("listing graceguard's pods in {}", req.namespace), e)
        })?;
    let mut by_owner: BTreeMap<String, Vec<Pod>> = BTreeMap::new();
    for p in listed.items {
        if result_finalizer::holds(p.finalizers()) {
            let owner = p.labels().get(INSTANCE_LABEL).cloned().unwrap_or_default();
            by_owner.entry(owner).or_default().push(p);
        }
    }
    let terminating =
        crate::runtime::namespace_state::is_terminating(client, &req.namespace).await == Some(true);
    let leases: Api<Lease> = Api::namespaced(client.clone(), &req.lease_namespace);
    let mut out = Vec::new();
    for (owner, held) in by_owner {
        let why = match (req.force, terminating) {
            (true, _) => "forced".to_string(),
            (_, true) => format!("namespace {} is being deleted", req.namespace),
            _ => match owner_alive(&leases, &owner, req.lease_wait).await? {
                Owner::Alive(holder) => {
                    for p in held {
                        out.push(report(&req.namespace, &p, &owner, "kept", format!(
                            "instance {owner}'s Lease is held by {holder} and renewed: its executor lets go itself; pass --force only if it is gone for good"
                        )));
                    }
                    continue;
                }
                Owner::Unknown => {
                    for p in held {
                        out.push(report(&req.namespace, &p, &owner, "kept", format!(
                            "instance {owner} has no Lease in namespace {}: it may be alive with its Lease in another namespace (pass --lease-namespace with the one it uses), or run without one; pass --force only if it is gone for good",
                            req.lease_namespace
                        )));
                    }
                    continue;
                }
                Owner::Dead => format!("instance {owner}'s Lease is released or lapsed"),
            },
        };
        for p in held {
            let (outcome, detail) = match release_current(&pods, &p).await {
                Released::Done => ("released", why.clone()),
                Released::Changed => (
                    "changed",
                    format!("the pod kept changing under {CHANGED_RETRIES} tries; run the command again"),
                ),
                Released::Failed => (
                    "failed",
                    "the API server refused or could not be asked (see the log); run the command again".into(),
                ),
            };
            out.push(report(&req.namespace, &p, &owner, outcome, detail));
        }
    }
    Ok(out)
}

/// The namespaces where graceguard's pods (of `instance`, if given) hold
/// the result finalizer, sorted: what `release-results --all-namespaces`
/// goes through, one namespace at a time.
pub async fn namespaces_holding(
    client: &Client,
    instance: Option<&str>,
) -> Result<Vec<String>, GuardError> {
    let pods: Api<Pod> = Api::all(client.clone());
    let mut selector = format!("{MANAGED_BY_LABEL}={MANAGED_BY}");
    if let Some(i) = instance {
        selector.push_str(&format!(",{INSTANCE_LABEL}={i}"));
    }
    let listed = pods
        .list_metadata(&ListParams::default().labels(&selector))
        .await
        .map_err(|e| GuardError::api("listing graceguard's pods in every namespace", e))?;
    let mut namespaces: Vec<String> = listed
        .items
        .iter()
        .filter(|p| result_finalizer::holds(p.finalizers()))
        .filter_map(|p| p.namespace())
        .collect();
    namespaces.sort();
    namespaces.dedup();
    Ok(namespaces)
}

/// How often a pod that changed under the write is read again and the
/// write retried: a pod in a namespace being deleted, or on a live node, is
/// written to by the kubelet and the namespace controller meanwhile.
const CHANGED_RETRIES: usize = 5;

/// Lets go of `listed`'s result finalizer with a write conditional on its
/// version; when the pod changed meanwhile, reads it again and retries on
/// that version (the reason to release is the owner's or the namespace's
/// state, not the pod's). A pod gone, replaced, or no longer holding the
/// finalizer has nothing left to release.
async fn release_current(pods: &Api<Pod>, listed: &Pod) -> Released {
    let uid = listed.uid().unwrap_or_default();
    let mut pod = listed.clone();
    for _ in 0..CHANGED_RETRIES {
        let v = Version {
            name: pod.name_any(),
            uid: uid.clone(),
            resource_version: pod.resource_version().unwrap_or_default(),
            finalizers: pod.finalizers().to_vec(),
        };
        match pod_api::release(pods, &v, None).await {
            Released::Changed => {}
            other => return other,
        }
        pod = match pods.get_opt(&v.name).await {
            Ok(Some(p)) if p.uid().as_deref() == Some(uid.as_str()) => p,
            Ok(_) => return Released::Done,
            Err(e) => {
                tracing::warn!(pod = %v.name, error = %e, "reading the pod again after a conflict failed");
                return Released::Failed;
            }
        };
        if !result_finalizer::holds(pod.finalizers()) {
            return Released::Done;
        }
    }
    Released::Changed
}

fn report(ns: &str, p: &Pod, owner: &str, outcome: &'static str, detail: String) -> PodReleased {
    PodReleased {
        namespace: ns.to_string(),
        pod: p.name_any(),
        instance: owner.to_string(),
        outcome,
        detail,
    }
}

/// What `release-results` knows of a pod's owner.
enum Owner {
    /// Its Lease is renewed within the wait (or held past it), by this holder.
    Alive(String),
    /// Its Lease is released, or lapsed unrenewed.
    Dead,
    /// It has no Lease where we look: never read as dead.
    Unknown,
}

/// Whether `owner` lives, judged by its Lease over up to `wait`.
async fn owner_alive(
    leases: &Api<Lease>,
    owner: &str,
    wait: Duration,
) -> Result<Owner, GuardError> {
    let name = lease_name(owner);
    let mut seen = Observer::default();
    let started = Instant::now();
    loop {
        let l = leases
            .get_opt(&name)
            .await
            .map_err(|e| GuardError::api(format!("reading the Lease of instance {owner}"), e))?;
        if l.is_none() {
            return Ok(Owner::Unknown);
        }
        match seen.observe(&name, l.as_ref()) {
            Liveness::Free => return Ok(Owner::Dead),
            Liveness::Held { holder, remaining } => {
                // A renewal seen restarts `remaining`: a live owner is held
                // past `wait`.
                if started.elapsed() + remaining > wait {
                    return Ok(Owner::Alive(holder));
                }
                tokio::time::sleep(remaining.min(Duration::from_secs(2))).await;
            }
        }
    }
}
