//! The metadata watches that feed the pod and namespace indexes, wired to
//! the confirmation cache (which forgets each pod the watch sees deleted)
//! and to the eviction outcomes (which learn from it which attempts evicted).
//! Apart from `pod_index` (the index and its types, no I/O) so the index
//! needs nothing of the cache that reads it.

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::PartialObjectMeta;
use kube::runtime::watcher;
use kube::runtime::WatchStreamExt;
use kube::{Api, Client};

use crate::confirm::Confirmer;
use crate::eviction_outcome::EvictionOutcomes;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// The pod index's series: its size, and whether it is synced with a
/// healthy watch.
#[derive(Clone, Default)]
pub struct PodIndexMetrics {
    pub pods: Gauge,
    pub ready: Gauge,
}

impl PodIndexMetrics {
    /// The series, registered.
    pub fn register(r: &mut Registry) -> Self {
        let m = Self::default();
        r.register("index_pods", "Pods in the name index", m.pods.clone());
        r.register(
            "index_ready",
            "1 when the pod index is synced and its watch healthy",
            m.ready.clone(),
        );
        m
    }
}
use crate::pod_index::{namespace_settings, HeldPod, NamespaceModes, PodIndex};

/// How the pod index makes its initial list (and every re-list).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PodList {
    /// Pods per page of a paged list.
    pub page_size: u32,
    /// A streaming list where the API server serves one.
    pub streaming: bool,
}

impl Default for PodList {
    /// Streaming where served, pages of 500 elsewhere: at 150,000 pods a
    /// streaming list was ready in 5.6 s at 46.7 MB, pages of 500 in 7.8 s at
    /// 61.5 MB, of 2,000 in 5.4 s at 80.7 MB (docs/benchmarks.md).
    fn default() -> Self {
        Self {
            page_size: 500,
            streaming: true,
        }
    }
}

impl PodList {
    /// The watch configuration: streaming, or paged with `page_size`.
    pub fn config(self, streaming: bool) -> watcher::Config {
        let c = crate::meta_index::watch_config();
        if streaming {
            c.streaming_lists()
        } else {
            c.page_size(self.page_size)
        }
    }
}

/// Whether `e`, the answer to a streaming list's first watch, says the API
/// server does not serve streaming lists: it refuses the request as invalid
/// (a server without WatchList, 1.27-1.31 and 1.33 by default: "sendInitialEvents
/// is forbidden for watch unless the WatchList feature gate is enabled"; one
/// older than 1.27: "resourceVersionMatch is forbidden for watch"). Any other
/// client error but 410 (expired) and 429 (throttled) is taken as a refusal
/// too: a paged list then says for itself what is wrong (RBAC, for one).
pub fn refuses_streaming(e: &watcher::Error) -> bool {
    let code = match e {
        watcher::Error::WatchStartFailed(kube::Error::Api(s))
        | watcher::Error::InitialListFailed(kube::Error::Api(s)) => s.code,
        watcher::Error::WatchError(s) => s.code,
        _ => return false,
    };
    (400..500).contains(&code) && code != 410 && code != 429
}

/// Starts the metadata watches that feed both indexes.
pub fn spawn_watchers(
    client: Client,
    confirmer: Confirmer,
    evictions: EvictionOutcomes,
    pods: Arc<PodIndex>,
    namespaces: Arc<NamespaceModes>,
    metrics: PodIndexMetrics,
    list: PodList,
) {
    let pod_api: Api<PartialObjectMeta<Pod>> = Api::all(client.clone());
    let m = metrics.clone();
    tokio::spawn(async move {
        let mut streaming = list.streaming;
        loop {
            // A server that refuses a streaming list says so on the first
            // call: the stream ends there and the index lists in pages.
            let refused = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let seen = Arc::clone(&refused);
            let watch = watcher::watcher(pod_api.clone(), list.config(streaming))
                .default_backoff()
                .take_while(move |ev| {
                    let stop = streaming && matches!(ev, Err(e) if refuses_streaming(e));
                    if stop {
                        seen.store(true, std::sync::atomic::Ordering::Release);
                    }
                    std::future::ready(!stop)
                });
            let stream = evictions.observing(confirmer.forgetting(watch));
            pods.run_stream(
                stream,
                |meta| Some(HeldPod::from_meta(meta)),
                |idx| {
                    m.pods.set(idx.len() as i64);
                    m.ready.set(i64::from(idx.is_ready()));
                },
            )
            .await;
            if !refused.load(std::sync::atomic::Ordering::Acquire) {
                return;
            }
            tracing::info!(
                "the API server does not serve streaming lists (WatchList); the pod index lists in pages of {}",
                list.page_size
            );
            streaming = false;
        }
    });
    let ns_api: Api<PartialObjectMeta<Namespace>> = Api::all(client);
    tokio::spawn(async move { namespaces.run(ns_api, namespace_settings, |_| {}).await });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: u16, message: &str) -> kube::core::Status {
        kube::core::Status::failure(message, "Invalid").with_code(code)
    }

    #[test]
    fn a_server_that_refuses_the_streaming_list_is_listed_in_pages() {
        let refused = [
            status(422, "ListOptions.meta.k8s.io \"\" is invalid: sendInitialEvents: Forbidden: sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled"),
            status(422, "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden for watch"),
            status(400, "bad request"),
        ];
        for s in refused {
            let e = watcher::Error::WatchStartFailed(kube::Error::Api(Box::new(s.clone())));
            assert!(refuses_streaming(&e), "{s:?}");
        }
        // Expired, throttled or a server error: the streaming list is retried.
        for code in [410, 429, 500, 503] {
            let e = watcher::Error::WatchStartFailed(kube::Error::Api(Box::new(status(code, "x"))));
            assert!(!refuses_streaming(&e), "{code}");
        }
    }

    #[test]
    fn paged_lists_use_the_page_size_and_streaming_lists_none() {
        let list = PodList {
            page_size: 2000,
            streaming: true,
        };
        assert_eq!(list.config(false).page_size, Some(2000));
        assert_eq!(
            list.config(true).initial_list_strategy,
            watcher::InitialListStrategy::StreamingList
        );
    }
}
