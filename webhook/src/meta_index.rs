//! A watch-fed, in-memory index of object metadata.
//!
//! kube-rs's reflector keeps whole objects (for metadata, `managedFields`
//! included); the webhook needs a few fields per object on the admission hot
//! path, so this keeps only a projection `V` per namespace/name, looked up
//! without allocating. It is ready once the initial list has been applied and
//! not ready while the watch is broken; during a re-list the previous contents
//! keep answering (a stale hit is confirmed by a live GET before anyone is
//! denied, and a stale miss allows, as no webhook would).
//!
//! A watch error makes the index not ready. kube-rs resumes a broken watch
//! from where it was without emitting anything, so "healthy again" cannot wait
//! for the next event (a quiet namespace list may not change for hours): the
//! index is ready again once no error has arrived for [`RECOVERY`], or at
//! once when an event arrives.

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::api::PartialObjectMeta;
use kube::core::ObjectMeta;
use kube::runtime::watcher::{self, Event};
use kube::runtime::{watcher as watch, WatchStreamExt};
use kube::{Api, Resource};
use serde::de::DeserializeOwned;

/// How long the API server keeps one watch call open (`timeoutSeconds`)
/// before the watcher opens the next from where it was. kube's watcher gives
/// up on a watch that sent nothing for that long plus 5 s, and nothing else
/// would: its client has no read timeout on watches, and HTTP/1.1 has no
/// pings. So this bounds how long an index stays stale behind a connection
/// that went silent (a dropped NAT entry, a stalled proxy) — 35 s instead of
/// kube's default 295 s — for one more watch call per index every 30 s.
pub const WATCH_TIMEOUT_SECS: u32 = 30;

/// The watch configuration of every index.
pub fn watch_config() -> watcher::Config {
    watcher::Config::default().timeout(WATCH_TIMEOUT_SECS)
}

type Map<V> = HashMap<String, HashMap<String, V>>;

struct State<V> {
    live: Map<V>,
    len: usize,
    /// Filled during a (re-)list, swapped in when it completes.
    building: Option<(Map<V>, usize)>,
}

/// How long after the last watch error the index counts as healthy again.
/// Longer than the watch's retry backoff cap (kube-rs's default backoff: 30 s),
/// so a watch that fails at every retry never looks healthy in between.
pub const RECOVERY: Duration = Duration::from_secs(40);

/// See the module docs. `V` is what is kept per object.
pub struct MetaIndex<V> {
    what: &'static str,
    state: RwLock<State<V>>,
    synced: AtomicBool,
    /// At most this many objects are kept; one more and the index empties
    /// itself and answers nothing (`over_cap`) until the next (re-)list.
    cap: usize,
    over_cap: AtomicBool,
    /// Milliseconds since `epoch` until which the index is not ready (0: none).
    broken_until_ms: AtomicU64,
    epoch: Instant,
    recovery: Duration,
}

fn insert<V>(map: &mut Map<V>, ns: &str, name: &str, v: V) -> bool {
    map.entry(ns.to_string())
        .or_default()
        .insert(name.to_string(), v)
        .is_none()
}

fn remove<V>(map: &mut Map<V>, ns: &str, name: &str) -> bool {
    let Some(inner) = map.get_mut(ns) else {
        return false;
    };
    let removed = inner.remove(name).is_some();
    if inner.is_empty() {
        map.remove(ns);
    }
    removed
}

impl<V: Clone> MetaIndex<V> {
    /// An empty, not-ready index; `what` names it in logs.
    pub fn new(what: &'static str) -> Self {
        Self::with_recovery(what, RECOVERY)
    }

    /// [`MetaIndex::new`] holding at most `cap` objects: past it the index
    /// drops everything and answers nothing (callers fail open) until a
    /// re-list finds the objects within the cap again, so a kind with more
    /// objects than expected cannot take the replica's memory.
    pub fn with_cap(what: &'static str, cap: usize) -> Self {
        Self {
            cap: cap.max(1),
            ..Self::with_recovery(what, RECOVERY)
        }
    }

    /// [`MetaIndex::new`] with another recovery period (for tests).
    pub fn with_recovery(what: &'static str, recovery: Duration) -> Self {
        Self {
            cap: usize::MAX,
            over_cap: AtomicBool::new(false),
            what,
            state: RwLock::new(State {
                live: HashMap::new(),
                len: 0,
                building: None,
            }),
            synced: AtomicBool::new(false),
            broken_until_ms: AtomicU64::new(0),
            epoch: Instant::now(),
            recovery,
        }
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn read(&self) -> RwLockReadGuard<'_, State<V>> {
        // A panic while holding the lock cannot leave the maps half-updated in a
        // way lookups care about, so a poisoned lock is still used.
        self.state.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> RwLockWriteGuard<'_, State<V>> {
        self.state.write().unwrap_or_else(|p| p.into_inner())
    }

    /// The entry for `namespace/name` (cluster-scoped objects: namespace "").
    pub fn get(&self, namespace: &str, name: &str) -> Option<V> {
        self.read().live.get(namespace)?.get(name).cloned()
    }

    /// Whether the index went past its cap and holds nothing until the next list.
    pub fn is_over_cap(&self) -> bool {
        self.over_cap.load(Ordering::Acquire)
    }

    /// Past the cap: empties the index (the memory is what the cap is for)
    /// and says so once per (re-)list.
    fn overflow(&self, st: &mut State<V>) {
        if !self.over_cap.swap(true, Ordering::AcqRel) {
            tracing::error!(
                index = self.what,
                cap = self.cap,
                "more objects than the index may hold; it now holds none and every lookup misses (Creates of this kind are allowed) until a re-list finds fewer; raise --kind-index-max-objects, or stop counting this kind in a ResourceQuota"
            );
        }
        st.live = HashMap::new();
        st.len = 0;
        st.building = None;
    }

    /// Resolves once the index has been over its cap for `period` without
    /// a break: a healthy watch never re-lists by itself, so its owner then
    /// starts a fresh list, which fits again once enough objects went.
    pub async fn over_cap_for(&self, period: Duration) {
        let step = (period / 10).clamp(Duration::from_millis(10), Duration::from_secs(10));
        let mut since: Option<Instant> = None;
        loop {
            tokio::time::sleep(step).await;
            if !self.is_over_cap() {
                since = None;
                continue;
            }
            let at = *since.get_or_insert_with(Instant::now);
            if at.elapsed() >= period {
                return;
            }
        }
    }

    /// Objects indexed now.
    pub fn len(&self) -> usize {
        self.read().len
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// True once the initial list is applied, while the watch is healthy.
    /// Whether the initial list has been applied (whatever the watch's health).
    pub fn is_synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }

    pub fn is_ready(&self) -> bool {
        self.synced.load(Ordering::Acquire)
            && self.now_ms() >= self.broken_until_ms.load(Ordering::Acquire)
    }

    /// Applies one watcher event; `project` gives the value to keep, or `None`
    /// to keep nothing for that object.
    pub fn apply(&self, event: Event<&ObjectMeta>, project: impl Fn(&ObjectMeta) -> Option<V>) {
        let key = |m: &ObjectMeta| {
            (
                m.namespace.clone().unwrap_or_default(),
                m.name.clone().unwrap_or_default(),
            )
        };
        let mut st = self.write();
        match event {
            Event::Init => {
                // A new list: try again within the cap.
                self.over_cap.store(false, Ordering::Release);
                st.building = Some((HashMap::new(), 0));
            }
            Event::InitApply(m) => {
                let (ns, name) = key(m);
                if let (Some(v), Some((map, len))) = (project(m), st.building.as_mut()) {
                    if insert(map, &ns, &name, v) {
                        *len += 1;
                    }
                    if *len > self.cap {
                        self.overflow(&mut st);
                    }
                }
            }
            Event::InitDone => {
                let replaced = st.building.take().map(|(map, len)| {
                    st.len = len;
                    std::mem::replace(&mut st.live, map)
                });
                self.synced.store(true, Ordering::Release);
                self.mark_healthy();
                // Freeing the previous contents (up to every object of the
                // cluster) must not hold the lock every admission read takes.
                drop(st);
                drop(replaced);
            }
            Event::Apply(_) if self.is_over_cap() => {}
            Event::Apply(m) => {
                let (ns, name) = key(m);
                match project(m) {
                    Some(v) => {
                        if insert(&mut st.live, &ns, &name, v) {
                            st.len += 1;
                        }
                        if st.len > self.cap {
                            self.overflow(&mut st);
                        }
                    }
                    None => {
                        if remove(&mut st.live, &ns, &name) {
                            st.len -= 1;
                        }
                    }
                }
                self.mark_healthy();
            }
            Event::Delete(m) => {
                let (ns, name) = key(m);
                if remove(&mut st.live, &ns, &name) {
                    st.len -= 1;
                }
                self.mark_healthy();
            }
        }
    }

    /// An event arrived: the watch works.
    fn mark_healthy(&self) {
        self.broken_until_ms.store(0, Ordering::Release);
    }

    /// Marks the watch broken: not ready until it delivers an event, or
    /// until no error has come for the recovery period.
    pub fn mark_broken(&self) {
        let until = self
            .now_ms()
            .saturating_add(u64::try_from(self.recovery.as_millis()).unwrap_or(u64::MAX));
        self.broken_until_ms.store(until, Ordering::Release);
    }

    /// Feeds the index from a metadata-only watch of `api` until the stream
    /// ends (it does not: the watcher restarts itself with kube-rs's default
    /// backoff). `on_change` runs after each event (for metrics).
    pub async fn run<K>(
        &self,
        api: Api<PartialObjectMeta<K>>,
        project: impl Fn(&ObjectMeta) -> Option<V>,
        on_change: impl Fn(&Self),
    ) where
        K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
        K::DynamicType: Default,
    {
        let stream = watch(api, watch_config()).default_backoff();
        self.run_stream(stream, project, on_change).await
    }

    /// [`MetaIndex::run`] over a metadata watch already built (for kinds known
    /// only at run time: `kube::runtime::metadata_watcher` on a dynamic `Api`).
    pub async fn run_stream<K>(
        &self,
        stream: impl futures::Stream<Item = Result<Event<PartialObjectMeta<K>>, watcher::Error>>,
        project: impl Fn(&ObjectMeta) -> Option<V>,
        on_change: impl Fn(&Self),
    ) where
        K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    {
        let mut stream = std::pin::pin!(stream);
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(ev) => {
                    let ev: Event<PartialObjectMeta<K>> = ev;
                    match &ev {
                        Event::Init => self.apply(Event::Init, &project),
                        Event::InitDone => {
                            self.apply(Event::InitDone, &project);
                            tracing::info!(index = self.what, objects = self.len(), "index synced");
                        }
                        Event::InitApply(o) => self.apply(Event::InitApply(&o.metadata), &project),
                        Event::Apply(o) => self.apply(Event::Apply(&o.metadata), &project),
                        Event::Delete(o) => self.apply(Event::Delete(&o.metadata), &project),
                    }
                    on_change(self);
                }
                Err(e) => {
                    if self.is_ready() {
                        tracing::warn!(index = self.what, error = %e, "watch broken; not ready until it recovers (retrying with backoff)");
                    }
                    self.mark_broken();
                    on_change(self);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(ns: &str, name: &str) -> ObjectMeta {
        ObjectMeta {
            namespace: Some(ns.into()),
            name: Some(name.into()),
            uid: Some(format!("uid-{name}")),
            ..Default::default()
        }
    }

    fn uid(m: &ObjectMeta) -> Option<String> {
        m.uid.clone()
    }

    #[tokio::test]
    async fn over_cap_for_resolves_only_once_the_index_stayed_over_its_cap() {
        let idx: MetaIndex<String> = MetaIndex::with_cap("kind", 1);
        let period = Duration::from_millis(50);
        assert!(
            tokio::time::timeout(Duration::from_millis(200), idx.over_cap_for(period))
                .await
                .is_err(),
            "within its cap: never"
        );
        idx.apply(Event::Init, uid);
        for i in 0..2 {
            idx.apply(Event::InitApply(&meta("ns", &format!("o-{i}"))), uid);
        }
        assert!(idx.is_over_cap());
        assert!(
            tokio::time::timeout(Duration::from_secs(5), idx.over_cap_for(period))
                .await
                .is_ok(),
            "over its cap for the period"
        );
    }

    #[test]
    fn past_its_cap_an_index_holds_nothing_until_a_list_fits_again() {
        let idx: MetaIndex<String> = MetaIndex::with_cap("kind", 3);
        idx.apply(Event::Init, uid);
        for i in 0..4 {
            idx.apply(Event::InitApply(&meta("ns", &format!("o-{i}"))), uid);
        }
        idx.apply(Event::InitDone, uid);
        assert!(idx.is_over_cap());
        assert_eq!((idx.len(), idx.get("ns", "o-0")), (0, None));
        // Later events are ignored while over the cap.
        idx.apply(Event::Apply(&meta("ns", "late")), uid);
        assert_eq!(idx.get("ns", "late"), None);
        // A re-list within the cap: indexed again.
        idx.apply(Event::Init, uid);
        for i in 0..2 {
            idx.apply(Event::InitApply(&meta("ns", &format!("o-{i}"))), uid);
        }
        idx.apply(Event::InitDone, uid);
        assert!(!idx.is_over_cap());
        assert_eq!(idx.get("ns", "o-1").as_deref(), Some("uid-o-1"));
        // Growing past it through watch events empties it again.
        for i in 2..4 {
            idx.apply(Event::Apply(&meta("ns", &format!("o-{i}"))), uid);
        }
        assert!(idx.is_over_cap());
        assert_eq!(idx.len(), 0);
    }

    /// A value that counts the times it was dropped while the index's lock was held.
    #[derive(Clone)]
    struct Probe {
        idx: std::sync::Weak<MetaIndex<Probe>>,
        locked_drops: std::sync::Arc<AtomicU64>,
    }

    impl Drop for Probe {
        fn drop(&mut self) {
            if let Some(idx) = self.idx.upgrade() {
                if idx.state.try_read().is_err() {
                    self.locked_drops.fetch_add(1, Ordering::SeqCst);
                }
            }
        }
    }

    #[test]
    fn a_relist_frees_the_old_contents_outside_the_lock() {
        let idx = std::sync::Arc::new(MetaIndex::<Probe>::new("test"));
        let locked_drops = std::sync::Arc::new(AtomicU64::new(0));
        let project = |_: &ObjectMeta| {
            Some(Probe {
                idx: std::sync::Arc::downgrade(&idx),
                locked_drops: std::sync::Arc::clone(&locked_drops),
            })
        };
        for round in 0..2 {
            idx.apply(Event::Init, project);
            for i in 0..100 {
                idx.apply(
                    Event::InitApply(&meta("a", &format!("p{round}-{i}"))),
                    project,
                );
            }
            idx.apply(Event::InitDone, project);
        }
        assert_eq!(idx.len(), 100);
        assert!(
            idx.get("a", "p0-0").is_none(),
            "the first list's contents are gone"
        );
        assert_eq!(
            locked_drops.load(Ordering::SeqCst),
            0,
            "dropped while holding the lock"
        );
    }

    #[test]
    fn ready_only_after_the_initial_list_and_not_while_broken() {
        let idx = MetaIndex::new("test");
        assert!(!idx.is_ready());
        idx.apply(Event::Init, uid);
        idx.apply(Event::InitApply(&meta("a", "p")), uid);
        assert!(!idx.is_ready());
        assert_eq!(
            idx.get("a", "p"),
            None,
            "a list in progress is not served yet"
        );
        idx.apply(Event::InitDone, uid);
        assert!(idx.is_ready());
        assert_eq!(idx.get("a", "p").as_deref(), Some("uid-p"));
        idx.mark_broken();
        assert!(!idx.is_ready());
        idx.apply(Event::Apply(&meta("a", "q")), uid);
        assert!(idx.is_ready());
        assert_eq!(idx.len(), 2);
    }

    #[test]
    fn a_quiet_watch_recovers_from_an_error_without_waiting_for_an_event() {
        let idx = MetaIndex::with_recovery("test", Duration::from_millis(50));
        idx.apply(Event::Init, uid);
        idx.apply(Event::InitDone, uid);
        idx.mark_broken();
        assert!(!idx.is_ready());
        std::thread::sleep(Duration::from_millis(80));
        assert!(idx.is_ready(), "no error for the recovery period");
        // Errors that keep coming keep it not ready.
        idx.mark_broken();
        std::thread::sleep(Duration::from_millis(30));
        idx.mark_broken();
        std::thread::sleep(Duration::from_millis(30));
        assert!(!idx.is_ready());
    }

    #[test]
    fn relist_replaces_contents_and_counts_stay_right() {
        let idx = MetaIndex::new("test");
        idx.apply(Event::Init, uid);
        idx.apply(Event::InitApply(&meta("a", "p")), uid);
        idx.apply(Event::InitApply(&meta("b", "p")), uid);
        idx.apply(Event::InitDone, uid);
        idx.apply(Event::Apply(&meta("a", "p")), uid);
        assert_eq!(
            idx.len(),
            2,
            "re-applying an indexed object does not count it twice"
        );
        idx.apply(Event::Delete(&meta("a", "p")), uid);
        idx.apply(Event::Delete(&meta("a", "p")), uid);
        assert_eq!(idx.len(), 1);
        // A re-list after a watch error: old contents answer until it completes.
        idx.apply(Event::Init, uid);
        idx.apply(Event::InitApply(&meta("c", "r")), uid);
        assert!(idx.get("b", "p").is_some());
        idx.apply(Event::InitDone, uid);
        assert!(idx.get("b", "p").is_none());
        assert!(idx.get("c", "r").is_some());
        assert_eq!(idx.len(), 1);
    }

    #[test]
    fn a_projection_of_none_keeps_nothing() {
        let idx: MetaIndex<String> = MetaIndex::new("test");
        idx.apply(Event::Init, uid);
        idx.apply(Event::InitDone, uid);
        idx.apply(Event::Apply(&meta("", "ns1")), |m| {
            m.labels.as_ref().map(|_| "x".into())
        });
        assert!(idx.is_empty());
    }
}
