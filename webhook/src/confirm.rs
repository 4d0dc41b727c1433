//! The live read that confirms an index hit, cached briefly.
//!
//! The index can lag the API server, so a held name is confirmed with one
//! metadata GET before a Create is denied. A client looping on a held name
//! would otherwise cost one GET per request (a 12 Hz loop: 12 quorum reads a
//! second): a read is cached for `ttl` (about a second), and concurrent
//! requests for the same name share one GET.
//!
//! A cached read answers only while the index agrees with it (the same uid,
//! and a deletion the index has seen begin is never answered by a read that
//! saw none), and is dropped the moment the watch feeding the index sees the
//! object go (`forget`, from the pod index and from each kind index). A
//! terminating holder may vanish at any moment (its containers exit, its
//! finalizers go), so its read is reused only while that watch is current
//! ([`Confirmer::confirm_with`]: synced and not broken); otherwise every
//! denial of a terminating holder rests on a read made for it.
//!
//! So a Create the API server would accept is denied only between its
//! holder's removal and the watch delivering that removal (milliseconds on
//! a current watch), and never later than `ttl` after the read that denied
//! it, however the watch fares: the bound the docs state
//! (docs/webhook.md, "Confirmation reads"). "Free" and failed reads are not
//! cached.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::api::PartialObjectMeta;
use kube::core::{ApiResource, DynamicObject};
use kube::runtime::watcher::Event;
use kube::{Api, Client};
use moka::future::Cache;

use crate::collision::Confirmation;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::registry::Registry;

/// The confirmation reads' series: the live GETs sent (one per cache miss,
/// shared by concurrent requests) and those that failed (the Create was
/// allowed). The pods' and the other kinds' confirmers count in the same.
#[derive(Clone, Default)]
pub struct ConfirmMetrics {
    pub gets: Counter,
    pub errors: Counter,
}

impl ConfirmMetrics {
    /// The series, registered.
    pub fn register(r: &mut Registry) -> Self {
        let m = Self::default();
        r.register(
            "confirmation_gets",
            "Live GETs issued to confirm an index hit",
            m.gets.clone(),
        );
        r.register(
            "confirmation_errors",
            "Confirmations that failed (the Create was allowed)",
            m.errors.clone(),
        );
        m
    }
}
use crate::pod_index::{HeldPod, Holder};
use crate::read_error::{Cause, ReadError};

/// Confirmation reads in flight at once, per kind; past it the Create is
/// allowed (fail open), counted as a failed confirmation.
pub const MAX_READS_IN_FLIGHT: usize = 64;

/// Reads who holds `namespace/name` now: `Ok(None)` when nobody does.
pub type Fetch = Arc<
    dyn Fn(String, String) -> BoxFuture<'static, Result<Option<Holder>, ReadError>> + Send + Sync,
>;

/// See the module docs.
#[derive(Clone)]
pub struct Confirmer {
    cache: Cache<(String, String), Holder>,
    fetch: Fetch,
    metrics: ConfirmMetrics,
}

impl Confirmer {
    /// Confirms with `fetch`, caching answers for `ttl` (at most `capacity` names).
    pub fn new(fetch: Fetch, ttl: Duration, capacity: u64, metrics: ConfirmMetrics) -> Self {
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
    pub fn live(client: Client, timeout: Duration, ttl: Duration, metrics: ConfirmMetrics) -> Self {
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
        metrics: ConfirmMetrics,
    ) -> Self {
        // At most this many reads at once: past it a Create is allowed at
        // once (as for a failed read) rather than queued behind a stalled
        // API server connection.
        let reads = Arc::new(tokio::sync::Semaphore::new(MAX_READS_IN_FLIGHT));
        let fetch: Fetch = Arc::new(move |ns: String, name: String| {
            let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &ar);
            let what = ar.plural.clone();
            let slot = Arc::clone(&reads).try_acquire_owned();
            Box::pin(async move {
                let failed = |cause| ReadError {
                    resource: what.clone(),
                    namespace: ns.clone(),
                    name: name.clone(),
                    cause,
                };
                let Ok(_slot) = slot else {
                    return Err(failed(Cause::Saturated(MAX_READS_IN_FLIGHT)));
                };
                match tokio::time::timeout(timeout, api.get_metadata_opt(&name)).await {
                    Ok(Ok(found)) => Ok(found.map(|p| Holder::from_meta(&p.metadata))),
                    Ok(Err(e)) => Err(failed(Cause::Api(Arc::new(e)))),
                    Err(_) => Err(failed(Cause::TimedOut(timeout))),
                }
            })
        });
        Self::new(fetch, ttl, 100_000, metrics)
    }

    /// [`Confirmer::confirm_with`] for an index whose watch is not known
    /// to be current: a terminating holder is always read again.
    pub async fn confirm(&self, namespace: &str, name: &str, indexed: &HeldPod) -> Confirmation {
        self.confirm_with(namespace, name, indexed, false).await
    }

    /// Who holds `namespace/name`, which the index says `indexed` holds: from
    /// the cache (a read the index agrees with, a terminating holder's only
    /// while `watch_current`: the index's watch is synced and not broken, so
    /// its deletion event would have dropped the entry) or one live read.
    pub async fn confirm_with(
        &self,
        namespace: &str,
        name: &str,
        indexed: &HeldPod,
        watch_current: bool,
    ) -> Confirmation {
        let key = (namespace.to_string(), name.to_string());
        if self
            .cache
            .get(&key)
            .await
            .is_some_and(|h| !answers_from_cache(&h, indexed, watch_current))
        {
            self.cache.invalidate(&key).await;
        }
        self.read(key).await
    }

    /// Who holds `namespace/name`, which the index does not hold, from one
    /// live read. Asked only while the index's watch is not current (broken,
    /// or resuming after an API server restart): a miss may then be stale,
    /// and a Create allowed on it would be charged to quota for a name a
    /// terminating pod still holds. Nothing cached answers it.
    pub async fn confirm_unindexed(&self, namespace: &str, name: &str) -> Confirmation {
        let key = (namespace.to_string(), name.to_string());
        self.cache.invalidate(&key).await;
        self.read(key).await
    }

    /// One live read of `key`, shared by concurrent callers and cached when
    /// it finds a holder.
    async fn read(&self, key: (String, String)) -> Confirmation {
        let fetch = Arc::clone(&self.fetch);
        let metrics = self.metrics.clone();
        let (ns, n) = key.clone();
        let res = self
            .cache
            .try_get_with(key, async move {
                metrics.gets.inc();
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
                    self.metrics.errors.inc();
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

    /// `events` (the metadata watch feeding an index), forgetting each
    /// object the watch sees deleted before the index hears of it: a denial
    /// never outlives its holder by the cache's TTL.
    pub fn forgetting<K, E>(
        &self,
        events: impl Stream<Item = Result<Event<PartialObjectMeta<K>>, E>>,
    ) -> impl Stream<Item = Result<Event<PartialObjectMeta<K>>, E>> {
        let confirmer = self.clone();
        events.then(move |ev| {
            let confirmer = confirmer.clone();
            async move {
                if let Ok(Event::Delete(o)) = &ev {
                    let m = &o.metadata;
                    confirmer
                        .forget(
                            m.namespace.as_deref().unwrap_or(""),
                            m.name.as_deref().unwrap_or(""),
                        )
                        .await;
                }
                ev
            }
        })
    }
}

/// Whether a cached read `cached` may answer for the holder the index has
/// (`indexed`): the same uid; a live holder only while the index has not
/// seen its deletion begin; a terminating one only while the watch is
/// current (its removal would have dropped the entry).
fn answers_from_cache(cached: &Holder, indexed: &HeldPod, watch_current: bool) -> bool {
    cached.held.uid == indexed.uid
        && match (&cached.held.deletion, &indexed.deletion) {
            (None, None) => true,
            (Some(_), Some(_)) => watch_current,
            (None, Some(_)) | (Some(_), None) => false,
        }
}

/// A read that found no holder: not cached.
#[derive(Debug)]
enum Miss {
    Free,
    Failed(ReadError),
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

    fn counting(answer: Result<Option<Holder>, ReadError>) -> (Fetch, Arc<AtomicUsize>) {
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
    async fn a_name_the_index_misses_is_read_every_time_and_answers_what_the_server_has() {
        let held = Holder::from(indexed("u"));
        let (f, calls) = counting(Ok(Some(held.clone())));
        let c = Confirmer::new(f, Duration::from_secs(60), 100, ConfirmMetrics::default());
        for _ in 0..3 {
            assert!(matches!(
                c.confirm_unindexed("ns", "p").await,
                Confirmation::Held(h) if h == held
            ));
        }
        // Never from the cache: the index has nothing to agree with.
        assert_eq!(calls.load(Ordering::SeqCst), 3);
        let (f, _) = counting(Ok(None));
        let free = Confirmer::new(f, Duration::from_secs(60), 100, ConfirmMetrics::default());
        assert!(matches!(
            free.confirm_unindexed("ns", "p").await,
            Confirmation::Free
        ));
    }

    #[tokio::test]
    async fn a_looping_client_costs_one_read_per_ttl() {
        let held = Holder::from(HeldPod {
            uid: "u".into(),
            deletion: None,
        });
        let (f, calls) = counting(Ok(Some(held.clone())));
        let c = Confirmer::new(f, Duration::from_secs(60), 100, ConfirmMetrics::default());
        for _ in 0..50 {
            assert!(matches!(
                c.confirm("ns", "p", &indexed("u")).await,
                Confirmation::Held(h) if h == held
            ));
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
    async fn a_terminating_holder_is_read_once_per_ttl_while_the_watch_is_current() {
        use crate::pod_index::Deletion;
        let held = HeldPod {
            uid: "u".into(),
            deletion: Some(Deletion {
                at_unix: k8s_openapi::jiff::Timestamp::now().as_second() + 60,
                grace_seconds: 90,
            }),
        };
        let (f, calls) = counting(Ok(Some(Holder::from(held.clone()))));
        let c = Confirmer::new(f, Duration::from_secs(60), 100, ConfirmMetrics::default());
        // A looping client: one read for every denial within the TTL.
        for _ in 0..12 {
            assert!(matches!(
                c.confirm_with("ns", "p", &held, true).await,
                Confirmation::Held(_)
            ));
        }
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        // Past the TTL the read is made again.
        let (f, short) = counting(Ok(Some(Holder::from(held.clone()))));
        let brief = Confirmer::new(f, Duration::from_millis(50), 100, ConfirmMetrics::default());
        brief.confirm_with("ns", "p", &held, true).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        brief.confirm_with("ns", "p", &held, true).await;
        assert_eq!(short.load(Ordering::SeqCst), 2);
        // The watch sees it go: the next request reads again at once.
        let before = calls.load(Ordering::SeqCst);
        c.forget("ns", "p").await;
        c.confirm_with("ns", "p", &held, true).await;
        assert_eq!(calls.load(Ordering::SeqCst), before + 1);
        // The watch broken: every denial of a terminating holder reads.
        for _ in 0..3 {
            c.confirm_with("ns", "p", &held, false).await;
        }
        assert_eq!(calls.load(Ordering::SeqCst), before + 4);
    }

    #[tokio::test]
    async fn a_read_that_saw_a_deletion_never_answers_for_a_holder_the_index_has_live() {
        use crate::pod_index::Deletion;
        let terminating = HeldPod {
            uid: "u".into(),
            deletion: Some(Deletion {
                at_unix: k8s_openapi::jiff::Timestamp::now().as_second() + 60,
                grace_seconds: 90,
            }),
        };
        let (f, calls) = counting(Ok(Some(Holder::from(terminating))));
        let c = Confirmer::new(f, Duration::from_secs(60), 100, ConfirmMetrics::default());
        c.confirm_with("ns", "p", &indexed("u"), true).await;
        c.confirm_with("ns", "p", &indexed("u"), true).await;
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_terminating_holder_is_read_again_for_every_denial_unless_the_watch_is_current() {
        use crate::pod_index::Deletion;
        let now = k8s_openapi::jiff::Timestamp::now().as_second();
        // The index and the read agree on the holder, terminating: within its
        // grace, past it, and held by finalizers with no grace at all.
        for (at_unix, grace_seconds, finalizers) in [
            (now + 60, 90, vec![]),
            (now - 5, 30, vec![]),
            (now - 5, 0, vec!["f".to_string()]),
        ] {
            let held = HeldPod {
                uid: "u".into(),
                deletion: Some(Deletion {
                    at_unix,
                    grace_seconds,
                }),
            };
            let holder = Holder {
                finalizers,
                ..Holder::from(held.clone())
            };
            let (f, calls) = counting(Ok(Some(holder)));
            let c = Confirmer::new(f, Duration::from_secs(60), 100, ConfirmMetrics::default());
            for _ in 0..3 {
                c.confirm("ns", "p", &held).await;
            }
            assert_eq!(
                calls.load(Ordering::SeqCst),
                3,
                "grace {grace_seconds}: a terminating holder answered from the cache"
            );
        }
    }

    #[tokio::test]
    async fn concurrent_denials_of_a_terminating_holder_share_one_read() {
        use crate::pod_index::Deletion;
        let held = HeldPod {
            uid: "u".into(),
            deletion: Some(Deletion {
                at_unix: k8s_openapi::jiff::Timestamp::now().as_second() + 30,
                grace_seconds: 30,
            }),
        };
        let calls = Arc::new(AtomicUsize::new(0));
        let (c2, answer) = (Arc::clone(&calls), Holder::from(held.clone()));
        let f: Fetch = Arc::new(move |_, _| {
            c2.fetch_add(1, Ordering::SeqCst);
            let a = answer.clone();
            Box::pin(async move {
                tokio::time::sleep(Duration::from_millis(100)).await;
                Ok(Some(a))
            })
        });
        let c = Confirmer::new(f, Duration::from_secs(60), 100, ConfirmMetrics::default());
        let all = futures::future::join_all((0..8).map(|_| c.confirm("ns", "p", &held))).await;
        assert!(all.iter().all(|a| matches!(a, Confirmation::Held(_))));
        assert_eq!(calls.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_holder_the_index_saw_deleted_is_read_again() {
        let held = Holder::from(HeldPod {
            uid: "u".into(),
            deletion: None,
        });
        let (f, calls) = counting(Ok(Some(held)));
        let c = Confirmer::new(f, Duration::from_secs(60), 100, ConfirmMetrics::default());
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
        let c = Confirmer::new(f, Duration::from_secs(60), 100, ConfirmMetrics::default());
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
    async fn reads_of_a_stalled_api_server_are_bounded_in_time_and_in_number() {
        let (client, stalled) = crate::follow_up::tests::stalled_client().await;
        let metrics = ConfirmMetrics::default();
        let c = Confirmer::live(
            client,
            Duration::from_millis(300),
            Duration::from_secs(1),
            metrics.clone(),
        );
        // More names at once than reads may be in flight: the ones past the
        // bound fail at once, every other one when its read times out; all
        // allow (Failed), none waits for the stalled connection.
        let started = std::time::Instant::now();
        let names: Vec<String> = (0..MAX_READS_IN_FLIGHT + 8)
            .map(|i| format!("p-{i}"))
            .collect();
        let held_by = indexed("u");
        let all =
            futures::future::join_all(names.iter().map(|n| c.confirm("ns", n, &held_by))).await;
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "{:?}",
            started.elapsed()
        );
        let bounded = all
            .iter()
            .filter(
                |a| matches!(a, Confirmation::Failed(e) if matches!(e.cause, Cause::Saturated(_))),
            )
            .count();
        let timed_out = all
            .iter()
            .filter(
                |a| matches!(a, Confirmation::Failed(e) if matches!(e.cause, Cause::TimedOut(_))),
            )
            .count();
        assert_eq!((bounded, timed_out), (8, MAX_READS_IN_FLIGHT), "{all:?}");
        assert_eq!(metrics.errors.get(), (MAX_READS_IN_FLIGHT + 8) as u64);
        stalled.abort();
    }

    #[tokio::test]
    async fn a_free_name_is_not_cached() {
        let (f, calls) = counting(Ok(None));
        let c = Confirmer::new(f, Duration::from_secs(60), 100, ConfirmMetrics::default());
        for _ in 0..2 {
            assert!(matches!(
                c.confirm("ns", "p", &indexed("u")).await,
                Confirmation::Free
            ));
        }
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn failures_are_not_cached() {
        let (f, calls) = counting(Err(ReadError {
            resource: "pods".into(),
            namespace: "ns".into(),
            name: "p".into(),
            cause: Cause::TimedOut(Duration::from_secs(1)),
        }));
        let c = Confirmer::new(f, Duration::from_secs(60), 100, ConfirmMetrics::default());
        assert!(
            matches!(c.confirm("ns", "p", &indexed("u")).await, Confirmation::Failed(e) if e.name == "p")
        );
        c.confirm("ns", "p", &indexed("u")).await;
        assert_eq!(calls.load(Ordering::SeqCst), 2);
    }
}
