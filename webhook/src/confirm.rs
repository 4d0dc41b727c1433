//! The live read that confirms an index hit, cached briefly.
//!
//! The index can lag the API server, so a held name is confirmed with one
//! metadata GET before a Create is denied. A client looping on one name would
//! otherwise cost one GET per request: a confirmed holder is cached for about
//! a second, and concurrent requests for the same name share one GET. Only
//! holders are cached: "free" and failed reads are asked again, and a cached
//! holder whose uid is no longer the one the index has is dropped, so the
//! cache never outlives a pod the index has seen replaced.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use k8s_openapi::api::core::v1::Pod;
use kube::core::{ApiResource, DynamicObject};
use kube::{Api, Client};
use moka::future::Cache;

use crate::collision::Confirmation;
use crate::metrics::Metrics;
use crate::pod_index::{HeldPod, Holder};

/// Reads who holds `namespace/name` now: `Ok(None)` when nobody does.
pub type Fetch =
    Arc<dyn Fn(String, String) -> BoxFuture<'static, Result<Option<Holder>, String>> + Send + Sync>;

/// See the module docs.
#[derive(Clone)]
pub struct Confirmer {
    cache: Cache<(String, String), Holder>,
    fetch: Fetch,
    metrics: Metrics,
}

impl Confirmer {
    /// Confirms with `fetch`, caching answers for `ttl` (at most `capacity` names).
    pub fn new(fetch: Fetch, ttl: Duration, capacity: u64, metrics: Metrics) -> Self {
        Self {
            cache: Cache::builder()
                .time_to_live(ttl)
                .max_capacity(capacity)
                .build(),
            fetch,
            metrics,
        }
    }

    /// Confirms pods with a metadata-only GET through `client`, bounded by `timeout`.
    pub fn live(client: Client, timeout: Duration, ttl: Duration, metrics: Metrics) -> Self {
        Self::live_for(
            client,
            ApiResource::erase::<Pod>(&()),
            timeout,
            ttl,
            metrics,
        )
    }

    /// [`Confirmer::live`] for objects of kind `ar` (any namespaced kind).
    pub fn live_for(
        client: Client,
        ar: ApiResource,
        timeout: Duration,
        ttl: Duration,
        metrics: Metrics,
    ) -> Self {
        let fetch: Fetch = Arc::new(move |ns: String, name: String| {
            let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &ar);
            let what = ar.plural.clone();
            Box::pin(async move {
                match tokio::time::timeout(timeout, api.get_metadata_opt(&name)).await {
                    Ok(Ok(found)) => Ok(found.map(|p| Holder::from_meta(&p.metadata))),
                    Ok(Err(e)) => Err(format!("GET {what} {ns}/{name}: {e}")),
                    Err(_) => Err(format!(
                        "GET {what} {ns}/{name}: no answer within {timeout:?}"
                    )),
                }
            })
        });
        Self::new(fetch, ttl, 100_000, metrics)
    }

    /// Who holds `namespace/name`, which the index says `indexed` holds: from
    /// the cache or one live read. A cached read is dropped when the index has
    /// since seen the name change hands (another uid) or its holder's deletion
    /// begin, and when the holder's grace period has run out.
    pub async fn confirm(&self, namespace: &str, name: &str, indexed: &HeldPod) -> Confirmation {
        let key = (namespace.to_string(), name.to_string());
        let now = k8s_openapi::jiff::Timestamp::now().as_second();
        if self.cache.get(&key).await.is_some_and(|h| {
            h.held.uid != indexed.uid
                || h.held.deletion.is_some() != indexed.deletion.is_some()
                || past_grace(&h, now)
        }) {
            self.cache.invalidate(&key).await;
        }
        let fetch = Arc::clone(&self.fetch);
        let metrics = self.metrics.clone();
        let (ns, n) = key.clone();
        let res = self
            .cache
            .try_get_with(key, async move {
                metrics.confirmation_gets.inc();
                match fetch(ns, n).await {
                    Ok(Some(pod)) => Ok(pod),
                    Ok(None) => Err(Miss::Free),
                    Err(e) => Err(Miss::Failed(e)),
                }
            })
            .await;
        match res {
            Ok(pod) => Confirmation::Held(pod),
            Err(miss) => match miss.as_ref() {
                Miss::Free => Confirmation::Free,
                Miss::Failed(e) => {
                    self.metrics.confirmation_errors.inc();
                    Confirmation::Failed(e.clone())
                }
            },
        }
    }
}

impl Confirmer {
    /// Drops what is cached for `namespace/name`: the index saw that object
    /// go, so no denial may rest on an earlier read of it.
    pub async fn forget(&self, namespace: &str, name: &str) {
        self.cache
            .invalidate(&(namespace.to_string(), name.to_string()))
            .await;
    }
}

/// A cached holder whose graceful deletion should be over by now: the pod is
/// probably gone or going, so a denial must not rest on the old read. (An
/// object with no grace period, held by finalizers, stays cached: only its
/// uid changing, or the TTL, drops it.)
fn past_grace(h: &Holder, now_unix: i64) -> bool {
    h.held
        .deletion
        .is_some_and(|d| d.grace_seconds > 0 && d.seconds_left(now_unix) == 0)
}

/// A read that found no holder: not cached.
#[derive(Debug)]
enum Miss {
    Free,
    Failed(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn indexed(uid: &str) -> HeldPod {
        HeldPod {
            uid: uid.into(),
            deletion: None,
        }
    }
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn counting(answer: Result<Option<Holder>, String>) -> (Fetch, Arc<AtomicUsize>) {
        let calls = Arc::new(AtomicUsize::new(0));
        let c = Arc::clone(&calls);
        let f: Fetch = Arc::new(move |_, _| {
            c.fetch_add(1, Ordering::SeqCst);
            let a = answer.clone();
            Box::pin(async move { a })
        });
        (f, calls)
    }

    #[tokio::test]
    async fn a_looping_client_costs_one_read_per_ttl() {
        let held = Holder::from(HeldPod {
            uid: "u".into(),
            deletion: None,
        });
        let (f, calls) = counting(Ok(Some(held.clone())));
        let c = Confirmer::new(f, Duration::from_secs(60), 100, Metrics::new().0);
        for _ in 0..50 {
            assert_eq!(
                c.confirm("ns", "p", &indexed("u")).await,
                Confirmation::Held(held.clone())
            );
        }
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        // Another name is another read.
        c.confirm("ns", "q", &indexed("u")).await;
        assert_eq!(calls.load(Ordering::SeqCst), 2);
        // The index now has another pod under the name: the cached holder is stale.
        c.confirm("ns", "p", &indexed("u2")).await;
        assert_eq!(calls.load(Ordering::SeqCst), 3);
    }

    #[tokio::test]
    async fn a_terminating_holder_past_its_grace_is_read_again() {
        use crate::pod_index::Deletion;
        let now = k8s_openapi::jiff::Timestamp::now().as_second();
        // The index and the read agree on the holder, terminating.
        let terminating = |at_unix, grace_seconds| HeldPod {
            uid: "u".into(),
            deletion: Some(Deletion {
                at_unix,
                grace_seconds,
            }),
        };
        let over = terminating(now - 5, 30);
        let (f, calls) = counting(Ok(Some(Holder::from(over.clone()))));
        let c = Confirmer::new(f, Duration::from_secs(60), 100, Metrics::new().0);
        c.confirm("ns", "p", &over).await;
        c.confirm("ns", "p", &over).await;
        assert_eq!(
            calls.load(Ordering::SeqCst),
            2,
            "not answered from the cache"
        );

        // Still within its grace: cached.
        let within = terminating(now + 60, 90);
        let (f, calls) = counting(Ok(Some(Holder::from(within.clone()))));
        let c = Confirmer::new(f, Duration::from_secs(60), 100, Metrics::new().0);
        c.confirm("ns", "p", &within).await;
        c.confirm("ns", "p", &within).await;
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_holder_the_index_saw_deleted_is_read_again() {
        let held = Holder::from(HeldPod {
            uid: "u".into(),
            deletion: None,
        });
        let (f, calls) = counting(Ok(Some(held)));
        let c = Confirmer::new(f, Duration::from_secs(60), 100, Metrics::new().0);
        c.confirm("ns", "p", &indexed("u")).await;
        c.confirm("ns", "p", &indexed("u")).await;
        assert_eq!(calls.load(Ordering::SeqCst), 1, "cached");
        c.forget("ns", "p").await;
        c.confirm("ns", "p", &indexed("u")).await;
        assert_eq!(calls.load(Ordering::SeqCst), 2, "forgotten, read again");
    }

    #[tokio::test]
    async fn a_cached_live_holder_is_read_again_once_the_index_sees_its_deletion_begin() {
        let (f, calls) = counting(Ok(Some(Holder::from(indexed("u")))));
        let c = Confirmer::new(f, Duration::from_secs(60), 100, Metrics::new().0);
        c.confirm("ns", "p", &indexed("u")).await;
        c.confirm("ns", "p", &indexed("u")).await;
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        let terminating = HeldPod {
            uid: "u".into(),
            deletion: Some(crate::pod_index::Deletion {
                at_unix: k8s_openapi::jiff::Timestamp::now().as_second() + 30,
                grace_seconds: 30,
            }),
        };
        c.confirm("ns", "p", &terminating).await;
        assert_eq!(
            calls.load(Ordering::SeqCst),
            2,
            "the deletion began: read again"
        );
    }

    #[tokio::test]
    async fn a_free_name_is_not_cached() {
        let (f, calls) = counting(Ok(None));
        let c = Confirmer::new(f, Duration::from_secs(60), 100, Metrics::new().0);
        assert_eq!(
            c.confirm("ns", "p", &indexed("u")).await,
            Confirmation::Free
        );
        assert_eq!(
            c.confirm("ns", "p", &indexed("u")).await,
            Confirmation::Free
        );
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn failures_are_not_cached() {
        let (f, calls) = counting(Err("boom".into()));
        let c = Confirmer::new(f, Duration::from_secs(60), 100, Metrics::new().0);
        assert!(
            matches!(c.confirm("ns", "p", &indexed("u")).await, Confirmation::Failed(m) if m.contains("boom"))
        );
        c.confirm("ns", "p", &indexed("u")).await;
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }
}
