//! Name indexes of the kinds some ResourceQuota counts, started and stopped as
//! quotas appear and go.
//!
//! A ResourceQuota watch (quotas are few) keeps, per quota, the kinds its
//! `spec.hard` charges ([`crate::quota_kinds`]). The union, limited to the
//! kinds this install serves (`--collision-kinds`) and minus pods (always
//! indexed by [`crate::pod_index`]), is what gets indexed: one metadata-only
//! watch per kind, resolved through discovery, with its own confirmation
//! cache. A kind no quota counts costs nothing; when the last quota counting
//! it goes, its watch stops and its index is freed.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ResourceQuota;
use kube::api::PartialObjectMeta;
use kube::core::{ApiResource, DynamicObject};
use kube::discovery::Scope;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client};

use crate::confirm::ConfirmMetrics;
use crate::confirm::Confirmer;
use crate::meta_index::MetaIndex;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// The kind indexes' series, one of each per kind some quota counts (a
/// kind's series go when its index stops). Their confirmation reads count
/// in [`ConfirmMetrics`].
#[derive(Clone, Default)]
pub struct KindIndexMetrics {
    pub objects: Family<KindLabels, Gauge>,
    pub ready: Family<KindLabels, Gauge>,
    pub over_cap: Family<KindLabels, Gauge>,
    pub confirm: ConfirmMetrics,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    /// `resource[.group]`.
    pub kind: String,
}

impl KindLabels {
    pub fn of(kind: &GroupResource) -> Self {
        Self {
            kind: kind.to_string(),
        }
    }
}

impl KindIndexMetrics {
    /// The series, registered; `confirm` are registered by their owner,
    /// [`crate::confirm`].
    pub fn register(r: &mut Registry, confirm: ConfirmMetrics) -> Self {
        let m = Self {
            confirm,
            ..Self::default()
        };
        r.register(
            "kind_index_objects",
            "Objects in the name index of a kind some quota counts (pods: index_pods)",
            m.objects.clone(),
        );
        r.register(
            "kind_index_ready",
            "1 when that kind's index is synced and its watch healthy",
            m.ready.clone(),
        );
        r.register(
            "kind_index_over_cap",
            "1 while that kind has more objects than --kind-index-max-objects: its index holds none and its Creates are allowed unchecked",
            m.over_cap.clone(),
        );
        m
    }
}
use crate::pod_index::HeldPod;
use crate::quota_kinds::{charged_kinds, GroupResource};

/// A `--collision-kinds` value that is not `*` or a list of kinds.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0:?}: write kinds as resource[.group], e.g. persistentvolumeclaims,jobs.batch")]
pub struct KindsError(pub String);

/// Which kinds this install may index.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Allowed {
    /// Any namespaced kind a quota counts (`--collision-kinds '*'`).
    Any,
    Only(BTreeSet<GroupResource>),
}

impl Allowed {
    /// Parses `--collision-kinds`: `*`, or a comma-separated list of
    /// `resource[.group]` (`persistentvolumeclaims,jobs.batch`).
    pub fn parse(s: &str) -> Result<Self, KindsError> {
        if s.trim() == "*" {
            return Ok(Self::Any);
        }
        let kinds: BTreeSet<GroupResource> =
            s.split(',').filter_map(GroupResource::parse).collect();
        if kinds.iter().any(|k| k.resource.contains('/')) {
            return Err(KindsError(s.to_string()));
        }
        Ok(Self::Only(kinds))
    }

    pub fn contains(&self, kind: &GroupResource) -> bool {
        match self {
            Self::Any => true,
            Self::Only(kinds) => kinds.contains(kind),
        }
    }
}

/// One kind's index and confirmer; its watch stops when dropped.
pub struct KindIndex {
    pub kind: GroupResource,
    pub index: Arc<MetaIndex<HeldPod>>,
    pub confirmer: Confirmer,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for KindIndex {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// How confirmations of every kind behave (the pod guard's settings).
#[derive(Clone, Copy, Debug)]
pub struct ConfirmSettings {
    pub timeout: Duration,
    pub ttl: Duration,
}

/// How much one kind's index may take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IndexBounds {
    /// Objects per page of the initial (and any re-)list. A metadata list
    /// still carries every annotation (`last-applied-configuration` holds a
    /// ConfigMap's whole data) and `managedFields`, and every replica lists
    /// at once: small pages keep the peak small.
    pub page_size: u32,
    /// Objects one kind's index may hold; past it the index is dropped and
    /// that kind's Creates are allowed unchecked (fail open), with a metric
    /// and a log line.
    pub max_objects: usize,
    /// How long an index stays over its cap before it lists again (a
    /// healthy watch never re-lists): once enough objects went, the new
    /// list fits and the index answers again.
    pub relist_over_cap: Duration,
}

impl Default for IndexBounds {
    fn default() -> Self {
        Self {
            page_size: 100,
            max_objects: 100_000,
            relist_over_cap: Duration::from_secs(300),
        }
    }
}

/// How long one discovery of a kind may take.
const DISCOVERY_TIMEOUT: Duration = Duration::from_secs(10);

/// How long after a failed discovery a kind is tried again.
const RESOLVE_RETRY: Duration = Duration::from_secs(60);

/// The running kind indexes. Cheap to share.
pub struct KindIndexes {
    client: Client,
    allowed: Allowed,
    confirm: ConfirmSettings,
    bounds: IndexBounds,
    metrics: KindIndexMetrics,
    running: RwLock<HashMap<GroupResource, Arc<KindIndex>>>,
}

impl KindIndexes {
    pub fn new(
        client: Client,
        allowed: Allowed,
        confirm: ConfirmSettings,
        bounds: IndexBounds,
        metrics: KindIndexMetrics,
    ) -> Self {
        Self {
            client,
            allowed,
            confirm,
            bounds,
            metrics,
            running: RwLock::new(HashMap::new()),
        }
    }

    /// The index of `kind`, when some quota counts it and this install serves it.
    pub fn get(&self, kind: &GroupResource) -> Option<Arc<KindIndex>> {
        self.running
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(kind)
            .cloned()
    }

    /// The kinds indexed now.
    pub fn kinds(&self) -> BTreeSet<GroupResource> {
        self.running
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .keys()
            .cloned()
            .collect()
    }

    /// Starts the ResourceQuota watch that says which kinds to index, and,
    /// apart from it, the task that starts and stops the indexes: discovery
    /// (up to [`DISCOVERY_TIMEOUT`] per kind) never holds up the watch, and
    /// a quota's status writes (every charged Create) start nothing.
    pub fn spawn(self: Arc<Self>) -> tokio::task::JoinHandle<()> {
        let (wanted_tx, wanted_rx) = tokio::sync::watch::channel(BTreeSet::new());
        let keeper = Arc::clone(&self);
        tokio::spawn(async move { keeper.keep_indexes(wanted_rx).await });
        tokio::spawn(async move { self.follow_quotas(wanted_tx).await })
    }

    /// Runs the indexes `wanted` names, each time it changes, and every
    /// [`RESOLVE_RETRY`] while a kind could not be resolved.
    async fn keep_indexes(
        &self,
        mut wanted: tokio::sync::watch::Receiver<BTreeSet<GroupResource>>,
    ) {
        loop {
            let want = wanted.borrow_and_update().clone();
            let unresolved = self.reconcile(&want).await;
            let changed = if unresolved == 0 {
                wanted.changed().await
            } else {
                tokio::select! {
                    changed = wanted.changed() => changed,
                    _ = tokio::time::sleep(RESOLVE_RETRY) => Ok(()),
                }
            };
            if changed.is_err() {
                // The quota watch ended: nothing more to follow.
                return;
            }
        }
    }

    async fn follow_quotas(&self, wanted_tx: tokio::sync::watch::Sender<BTreeSet<GroupResource>>) {
        let api: Api<ResourceQuota> = Api::all(self.client.clone());
        let mut stream = watcher::watcher(api, crate::meta_index::watch_config())
            .default_backoff()
            .boxed();
        // Per quota (namespace/name), the kinds it charges.
        let mut quotas: HashMap<(String, String), BTreeSet<GroupResource>> = HashMap::new();
        let mut building: Option<HashMap<(String, String), BTreeSet<GroupResource>>> = None;
        let key = |q: &ResourceQuota| {
            (
                q.metadata.namespace.clone().unwrap_or_default(),
                q.metadata.name.clone().unwrap_or_default(),
            )
        };
        let charged = |q: &ResourceQuota| {
            let hard = q.spec.as_ref().and_then(|s| s.hard.as_ref());
            charged_kinds(hard.into_iter().flat_map(|h| h.keys().map(String::as_str)))
        };
        while let Some(ev) = stream.next().await {
            match ev {
                Ok(Event::Init) => building = Some(HashMap::new()),
                Ok(Event::InitApply(q)) => {
                    if let Some(b) = building.as_mut() {
                        b.insert(key(&q), charged(&q));
                    }
                }
                Ok(Event::InitDone) => {
                    if let Some(b) = building.take() {
                        quotas = b;
                    }
                }
                Ok(Event::Apply(q)) => {
                    quotas.insert(key(&q), charged(&q));
                }
                Ok(Event::Delete(q)) => {
                    quotas.remove(&key(&q));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "ResourceQuota watch broken; the kind indexes stay as they are (retrying with backoff)");
                    continue;
                }
            }
            if building.is_none() {
                let wanted: BTreeSet<GroupResource> = quotas
                    .values()
                    .flatten()
                    .filter(|k| !k.is_pods() && self.allowed.contains(k))
                    .cloned()
                    .collect();
                // Only a change of the set wakes the keeper: status writes
                // leave it as it was.
                wanted_tx.send_if_modified(|current| {
                    let changed = *current != wanted;
                    if changed {
                        *current = wanted;
                    }
                    changed
                });
            }
        }
    }

    /// Starts the indexes `wanted` has and the running set lacks; stops the
    /// others. Returns how many kinds could not be resolved.
    async fn reconcile(&self, wanted: &BTreeSet<GroupResource>) -> usize {
        let mut unresolved = 0;
        let running = self.kinds();
        for gone in running.difference(wanted) {
            let removed = self
                .running
                .write()
                .unwrap_or_else(|p| p.into_inner())
                .remove(gone);
            if removed.is_some() {
                let labels = KindLabels::of(gone);
                self.metrics.objects.remove(&labels);
                self.metrics.ready.remove(&labels);
                // Else a kind stopped while over its cap would alert forever.
                self.metrics.over_cap.remove(&labels);
                tracing::info!(kind = %gone, "no quota counts this kind any more; its index is stopped");
            }
        }
        for new in wanted.difference(&running) {
            match self.resolve(new).await {
                Ok(ar) => {
                    let idx = self.start(new.clone(), ar);
                    self.running
                        .write()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(new.clone(), Arc::new(idx));
                    tracing::info!(kind = %new, "a quota counts this kind; indexing its names");
                }
                // Retried every RESOLVE_RETRY: Creates of it are allowed
                // (fail open) meanwhile, as for any kind not indexed.
                Err(e) => {
                    unresolved += 1;
                    tracing::warn!(kind = %new, error = %e, retry_after = ?RESOLVE_RETRY, "cannot index this kind; its Creates are allowed unchecked")
                }
            }
        }
        unresolved
    }

    /// The served, namespaced resource `kind` is, by discovery.
    async fn resolve(&self, kind: &GroupResource) -> Result<ApiResource, ResolveError> {
        // Bounded: a stalled connection must not keep a kind unindexed for
        // minutes (tried again after RESOLVE_RETRY).
        let group = tokio::time::timeout(
            DISCOVERY_TIMEOUT,
            kube::discovery::group(&self.client, &kind.group),
        )
        .await
        .map_err(|_| ResolveError::TimedOut {
            group: kind.group.clone(),
            timeout: DISCOVERY_TIMEOUT,
        })?
        .map_err(|source| ResolveError::Discovery {
            group: kind.group.clone(),
            source,
        })?;
        let (ar, caps) = group
            .recommended_resources()
            .into_iter()
            .find(|(ar, _)| ar.plural == kind.resource)
            .ok_or_else(|| ResolveError::NotServed(kind.clone()))?;
        if caps.scope != Scope::Namespaced {
            return Err(ResolveError::ClusterScoped(kind.clone()));
        }
        Ok(ar)
    }

    fn start(&self, kind: GroupResource, ar: ApiResource) -> KindIndex {
        let index = Arc::new(MetaIndex::with_cap("kind", self.bounds.max_objects));
        let confirmer = Confirmer::live_for(
            self.client.clone(),
            ar.clone(),
            self.confirm.timeout,
            self.confirm.ttl,
            self.metrics.confirm.clone(),
        );
        // Metadata only: names, uids and deletion state, never the objects.
        let api: Api<PartialObjectMeta<DynamicObject>> = Api::all_with(self.client.clone(), &ar);
        let idx = Arc::clone(&index);
        let metrics = self.metrics.clone();
        let labels = KindLabels::of(&kind);
        let forgets = confirmer.clone();
        let page_size = self.bounds.page_size.max(1);
        let relist_over_cap = self.bounds.relist_over_cap;
        let task = tokio::spawn(async move {
            let config = crate::meta_index::watch_config().page_size(page_size);
            let on_change = |i: &MetaIndex<HeldPod>| {
                metrics.objects.get_or_create(&labels).set(i.len() as i64);
                metrics
                    .ready
                    .get_or_create(&labels)
                    .set(i64::from(i.is_ready()));
                metrics
                    .over_cap
                    .get_or_create(&labels)
                    .set(i64::from(i.is_over_cap()));
            };
            loop {
                let stream = forgets
                    .forgetting(watcher::watcher(api.clone(), config.clone()).default_backoff());
                tokio::select! {
                    _ = idx.run_stream(stream, |meta| Some(HeldPod::from_meta(meta)), &on_change) => return,
                    _ = idx.over_cap_for(relist_over_cap) => {
                        tracing::info!(
                            kind = %labels.kind,
                            after = ?relist_over_cap,
                            "kind index over its cap: listing again, to index the kind again if it fits now"
                        );
                    }
                }
            }
        });
        KindIndex {
            kind,
            index,
            confirmer,
            task,
        }
    }
}

/// Why a kind a quota counts cannot be indexed (its Creates are then
/// allowed unchecked, and it is tried again every minute).
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    #[error("discovering API group {group:?}: no answer within {timeout:?} (the API server is slow or unreachable)")]
    TimedOut { group: String, timeout: Duration },
    #[error("discovering API group {group:?}: {source}")]
    Discovery {
        group: String,
        #[source]
        source: kube::Error,
    },
    #[error("the API server serves no {0}; check the quota's resource name")]
    NotServed(GroupResource),
    #[error("{0} is cluster-scoped; quotas and the collision guard are per namespace")]
    ClusterScoped(GroupResource),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collision_kinds_parse() {
        assert_eq!(Allowed::parse("*"), Ok(Allowed::Any));
        let only = Allowed::parse("persistentvolumeclaims, jobs.batch,").expect("list");
        assert!(only.contains(&GroupResource::new("", "persistentvolumeclaims")));
        assert!(only.contains(&GroupResource::new("batch", "jobs")));
        assert!(!only.contains(&GroupResource::new("", "secrets")));
        assert!(Allowed::parse("count/jobs.batch").is_err());
    }
}
