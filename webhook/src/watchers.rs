//! The metadata watches that feed the pod and namespace indexes, wired to
//! the confirmation cache (which forgets each pod the watch sees deleted)
//! and to the eviction outcomes (which learn from it which attempts evicted).
//! Apart from `pod_index` (the index and its types, no I/O) so the index
//! needs nothing of the cache that reads it.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::PartialObjectMeta;
use kube::runtime::watcher;
use kube::runtime::WatchStreamExt;
use kube::{Api, Client};

use crate::confirm::Confirmer;
use crate::eviction_outcome::EvictionOutcomes;
use crate::metrics::Metrics;
use crate::pod_index::{namespace_mode, HeldPod, NamespaceModes, PodIndex};

/// Starts the metadata watches that feed both indexes.
pub fn spawn_watchers(
    client: Client,
    confirmer: Confirmer,
    evictions: EvictionOutcomes,
    pods: Arc<PodIndex>,
    namespaces: Arc<NamespaceModes>,
    metrics: Metrics,
) {
    let pod_api: Api<PartialObjectMeta<Pod>> = Api::all(client.clone());
    let m = metrics.clone();
    tokio::spawn(async move {
        let stream = evictions.observing(confirmer.forgetting(
            watcher::watcher(pod_api, crate::meta_index::watch_config()).default_backoff(),
        ));
        pods.run_stream(
            stream,
            |meta| Some(HeldPod::from_meta(meta)),
            |idx| {
                m.index_pods.set(idx.len() as i64);
                m.index_ready.set(i64::from(idx.is_ready()));
            },
        )
        .await
    });
    let ns_api: Api<PartialObjectMeta<Namespace>> = Api::all(client);
    tokio::spawn(async move { namespaces.run(ns_api, namespace_mode, |_| {}).await });
}
