//! One scheduler preemption at a time on a real node, traced from a watch of
//! its namespace: when the preemptor was created, when the victim got its
//! `DisruptionTarget`, when its deletion began, when it was gone (the
//! kubelet's final delete), when the preemptor was bound and when it ran.
//! Every version of the victim the watch delivered is kept, so a test can
//! tell whether anything changed the victim's metadata while it still ran.
//!
//! The end-to-end test pins graceguard's part (no write of graceguard's
//! reaches a running victim); `scripts/bench` group `preemption_trace` times
//! the intervals with no webhook, the no-op floor, a floor that tags inline as
//! graceguard once did, and graceguard.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context, Result};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher::{self, watcher};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client, ResourceExt};
use serde::Serialize;

use crate::disruptions::{Kubelets, HIGH, LOW};
use testbed::node::kubelet_log::{KubeletLog, Termination};
use testbed::pods::{self, CreateOutcome};

/// One version of the victim, as the watch delivered it.
#[derive(Clone, Debug, Serialize)]
pub struct VictimVersion {
    /// When the watch delivered it, in ms from the preemptor's Create.
    pub at_ms: f64,
    pub resource_version: String,
    /// It carried `graceguard.io/disruption`.
    pub tagged: bool,
    /// Its deletion had begun.
    pub deleting: bool,
    /// Its phase.
    pub phase: Option<String>,
}

/// One preemption's timeline, in milliseconds from the preemptor's Create
/// (as this process saw each event; `None` where the watch never saw it).
#[derive(Clone, Debug, Serialize)]
pub struct Trace {
    pub victim: String,
    /// Its uid: the key of the kubelet's log lines about it.
    pub victim_uid: String,
    pub preemptor: String,
    pub victim_disruption_target_ms: Option<f64>,
    pub victim_deletion_ms: Option<f64>,
    pub victim_gone_ms: Option<f64>,
    pub preemptor_bound_ms: Option<f64>,
    pub preemptor_running_ms: f64,
    /// The victim's Create sent → it ran: a pod's startup on this node.
    pub victim_startup_ms: f64,
    /// Every version of the victim from the preemptor's Create to its end.
    pub victim_versions: Vec<VictimVersion>,
    /// What the node's kubelet did to end the victim, from its log at
    /// `--v=4` ([`Trace::read_kubelet`]); `None` until read, or if the log
    /// does not show it.
    pub victim_kubelet: Option<Termination>,
}

impl Trace {
    /// Fills [`Trace::victim_kubelet`] from the victim's kubelet's log;
    /// `namespace` is the victim's.
    pub fn read_kubelet(&mut self, log: &KubeletLog<'_>, namespace: &str) {
        self.victim_kubelet = log.termination(namespace, &self.victim, &self.victim_uid);
    }

    /// From the victim's deletion to its removal: the kubelet's part.
    pub fn deletion_to_gone_ms(&self) -> Option<f64> {
        Some(self.victim_gone_ms? - self.victim_deletion_ms?)
    }

    /// Versions of the victim that carried graceguard's tag before its
    /// deletion began: a write to a running pod.
    pub fn tagged_while_running(&self) -> Vec<&VictimVersion> {
        self.victim_versions
            .iter()
            .filter(|v| v.tagged && !v.deleting)
            .collect()
    }

    /// The victim carried the tag in some version before it was gone.
    pub fn tagged_before_gone(&self) -> bool {
        self.victim_versions.iter().any(|v| v.tagged)
    }
}

enum Seen {
    Applied(Pod),
    Deleted(Pod),
}

impl Seen {
    fn pod(&self) -> &Pod {
        match self {
            Seen::Applied(p) | Seen::Deleted(p) => p,
        }
    }
}

/// Every pod event of a namespace with the moment it arrived.
pub struct Timeline {
    events: Arc<Mutex<Vec<(Instant, Seen)>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Timeline {
    pub fn start(client: Client, ns: &str) -> Self {
        let events: Arc<Mutex<Vec<(Instant, Seen)>>> = Arc::default();
        let sink = Arc::clone(&events);
        let api: Api<Pod> = Api::namespaced(client, ns);
        let task = tokio::spawn(async move {
            let mut stream = watcher(api, watcher::Config::default())
                .default_backoff()
                .boxed();
            while let Some(ev) = stream.next().await {
                let seen = match ev {
                    Ok(watcher::Event::Apply(p) | watcher::Event::InitApply(p)) => Seen::Applied(p),
                    Ok(watcher::Event::Delete(p)) => Seen::Deleted(p),
                    _ => continue,
                };
                if let Ok(mut e) = sink.lock() {
                    e.push((Instant::now(), seen));
                }
            }
        });
        Self { events, task }
    }

    /// The first moment `pred` held for pod `name` (its deletion included).
    fn first(&self, name: &str, pred: impl Fn(&Seen, &Pod) -> bool) -> Option<Instant> {
        let events = self.events.lock().ok()?;
        events.iter().find_map(|(at, seen)| {
            let pod = seen.pod();
            (pod.name_any() == name && pred(seen, pod)).then_some(*at)
        })
    }

    /// Waits until [`Self::first`] finds `pred` held for `name`, at most
    /// `limit`; whether it did.
    async fn wait_for(
        &self,
        name: &str,
        limit: Duration,
        pred: impl Fn(&Seen, &Pod) -> bool,
    ) -> bool {
        let deadline = Instant::now() + limit;
        loop {
            if self.first(name, &pred).is_some() {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    fn versions(&self, name: &str, uid: &str, t0: Instant) -> Vec<VictimVersion> {
        let Ok(events) = self.events.lock() else {
            return Vec::new();
        };
        events
            .iter()
            .map(|(at, seen)| (at, seen.pod()))
            .filter(|(_, p)| p.name_any() == name && p.uid().as_deref() == Some(uid))
            .map(|(at, p)| VictimVersion {
                at_ms: at.saturating_duration_since(t0).as_secs_f64() * 1000.0,
                resource_version: p.resource_version().unwrap_or_default(),
                tagged: pods::disruption_label(p).is_some(),
                deleting: p.metadata.deletion_timestamp.is_some(),
                phase: p.status.as_ref().and_then(|s| s.phase.clone()),
            })
            .collect()
    }
}

impl Drop for Timeline {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn has_disruption_target(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c.type_ == "DisruptionTarget" && c.status == "True")
        })
}

/// Preempts once on the bed's real node: creates `victim-<i>` (low
/// priority, `cpu`), waits until it runs and then `settle` more (the
/// kubelet's syncs after a start run on for up to a second, and a deletion
/// that finds one running waits for it and for a relist after it: see
/// [`testbed::node::kubelet_log`]), creates `preemptor-<i>` (high
/// priority, `cpu`: the two never fit together), waits until the preemptor
/// runs and the victim is gone, then deletes the preemptor at once to free
/// the node for the next preemption. `timeline` must watch `api`'s namespace.
pub async fn preempt_once(
    api: &Api<Pod>,
    timeline: &Timeline,
    kubelets: &Kubelets<'_>,
    i: usize,
    cpu: &str,
    settle: Duration,
) -> Result<Trace> {
    let victim = format!("victim-{i}");
    let preemptor = format!("preemptor-{i}");
    let created = Instant::now();
    let out = pods::create(api, &kubelets.schedulable_pod(&victim, 30, LOW, cpu)).await?;
    ensure!(out == CreateOutcome::Created, "creating {victim}: {out:?}");
    pods::wait_running(api, &victim).await?;
    let victim_startup_ms = created.elapsed().as_secs_f64() * 1000.0;
    let victim_uid = api
        .get(&victim)
        .await?
        .uid()
        .context("the victim has no uid")?;
    tokio::time::sleep(settle).await;
    let t0 = Instant::now();
    let out = pods::create(api, &kubelets.schedulable_pod(&preemptor, 30, HIGH, cpu)).await?;
    ensure!(
        out == CreateOutcome::Created,
        "creating {preemptor}: {out:?}"
    );
    pods::wait_running(api, &preemptor).await?;
    let running = t0.elapsed();
    pods::wait_gone(api, &victim, &victim_uid).await?;
    // That wait has a watch of its own: give the timeline's the moment it
    // may lag behind, so the victim's removal is in the trace.
    timeline
        .wait_for(&victim, Duration::from_secs(5), |seen, pod| {
            pod.uid().as_deref() == Some(victim_uid.as_str()) && matches!(seen, Seen::Deleted(_))
        })
        .await;
    let ms =
        |at: Option<Instant>| at.map(|at| at.saturating_duration_since(t0).as_secs_f64() * 1000.0);
    let uid = victim_uid.as_str();
    let of_victim = |pred: fn(&Seen, &Pod) -> bool| {
        ms(timeline.first(&victim, move |seen, pod| {
            pod.uid().as_deref() == Some(uid) && pred(seen, pod)
        }))
    };
    let trace = Trace {
        victim_disruption_target_ms: of_victim(|_, p| has_disruption_target(p)),
        victim_deletion_ms: of_victim(|_, p| p.metadata.deletion_timestamp.is_some()),
        victim_gone_ms: of_victim(|s, _| matches!(s, Seen::Deleted(_))),
        preemptor_bound_ms: ms(timeline.first(&preemptor, |_, p| {
            p.spec.as_ref().and_then(|s| s.node_name.as_ref()).is_some()
        })),
        preemptor_running_ms: running.as_secs_f64() * 1000.0,
        victim_startup_ms,
        victim_versions: timeline.versions(&victim, &victim_uid, t0),
        victim_kubelet: None,
        victim_uid,
        victim,
        preemptor: preemptor.clone(),
    };
    let preemptor_uid = api.get(&preemptor).await?.uid().unwrap_or_default();
    pods::delete_gracefully(api, &preemptor, Some(0)).await?;
    pods::wait_gone(api, &preemptor, &preemptor_uid).await?;
    // The API server has let go of it; its container may still be stopping,
    // which the next victim's scheduling does not wait for.
    tokio::time::sleep(Duration::from_millis(200)).await;
    Ok(trace)
}

/// Drains `node` as `kubectl drain` does, after putting `count` pods of
/// `cpu` each on it (low priority, named `drained-<i>-<k>`) and letting them
/// run [`crate::disruptions::victim_settle`]`(i)`: cordons the
/// node, evicts each pod through the Eviction API and waits until every one
/// is gone, then uncordons it. Returns the cordon → all gone time (ms).
/// `admin` cordons and evicts; `api` (the phase's namespace) creates.
pub async fn drain_once(
    admin: &Client,
    api: &Api<Pod>,
    kubelets: &Kubelets<'_>,
    node: &str,
    (i, count): (usize, usize),
    cpu: &str,
) -> Result<f64> {
    use kube::api::EvictParams;
    let names: Vec<String> = (0..count).map(|k| format!("drained-{i}-{k}")).collect();
    for name in &names {
        let out = pods::create(api, &kubelets.schedulable_pod(name, 30, LOW, cpu)).await?;
        ensure!(out == CreateOutcome::Created, "creating {name}: {out:?}");
    }
    let mut uids = Vec::new();
    for name in &names {
        pods::wait_running(api, name).await?;
        uids.push(
            api.get(name)
                .await?
                .uid()
                .context("a drained pod has no uid")?,
        );
    }
    tokio::time::sleep(crate::disruptions::victim_settle(i)).await;
    let ns = api
        .namespace()
        .context("drain_once needs the phase's namespaced Api")?;
    let as_admin: Api<Pod> = Api::namespaced(admin.clone(), ns);
    let started = Instant::now();
    testbed::node::cordon(admin, node, true).await?;
    let drained = async {
        for name in &names {
            as_admin
                .evict(name, &EvictParams::default())
                .await
                .with_context(|| format!("evicting {name}"))?;
        }
        for (name, uid) in names.iter().zip(&uids) {
            pods::wait_gone(api, name, uid).await?;
        }
        Ok::<_, anyhow::Error>(started.elapsed().as_secs_f64() * 1000.0)
    }
    .await;
    testbed::node::cordon(admin, node, false).await?;
    drained
}
