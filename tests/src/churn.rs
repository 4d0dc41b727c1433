//! The `cluster_churn` workload of `scripts/bench`: what a busy cluster does
//! to its pods, on hollow nodes ([`testbed::node::hollow`]), on a fixed
//! schedule, so that every phase does the same work and a slower path shows
//! as latency, never as fewer samples:
//!
//! * a Deployment whose pods are deleted gracefully at a steady rate (its
//!   ReplicaSet controller re-creates them);
//! * Jobs created every 2 s and deleted 10 s later (the garbage collector
//!   deletes their pods);
//! * scheduler preemptions, one started every [`Shape::preempt_every`], each
//!   on its own hollow node: a low-priority pod (the victim) fills the node's
//!   CPU and a high-priority one (the preemptor) that fits only there
//!   preempts it;
//! * [`Shape::drains`] drains a phase, each of a node of its own: pods put
//!   on it, the node cordoned and every pod on it evicted through the
//!   Eviction API, timed until the pods put there are gone, then
//!   uncordoned;
//! * executors re-creating names: each deletes its pod gracefully every
//!   [`Shape::executor_every`] (staggered) and re-creates the same name at
//!   once, retrying a 409 every 50 ms and a 429 after its `retryAfterSeconds`
//!   as client-go does (Flyte's pattern, under whatever mode the chart's
//!   defaults give graceguard).
//!
//! The preemptions and drains run in the [`ARMS`]' namespaces, in turn;
//! the rest in [`NS`].
//!
//! Besides, it watches the namespace, per kind of pod (its `app` label: see
//! [`KINDS`]), for the pod startup latency (from the watch event that first
//! shows a pod to the one that shows every container running, both seen by
//! the same watch: Kubernetes' pod startup SLI, on nodes with no image
//! pulls) and the deletion-to-gone time (from the first event that shows
//! its deletion begun to its removal).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt::Display;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, EvictParams, PostParams, PropagationPolicy};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, ResourceExt};
use serde::Serialize;
use serde_json::{json, Value};

use crate::disruptions::victim_settle;
use testbed::node::hollow;

/// The namespace the workload runs in.
pub const NS: &str = "churn";
/// The Deployment's name and its pods' `app` label.
pub const WEB: &str = "churn-web";
const LOW: &str = "churn-low";
const HIGH: &str = "churn-high";
/// The kinds of pod, by their `app` label.
pub const APP_JOB: &str = "churn-job";
pub const APP_PREEMPTOR: &str = "churn-preemptor";
pub const APP_VICTIM: &str = "churn-victim";
pub const APP_EXECUTOR: &str = "churn-executor";
/// Pods put on a node for its drain.
pub const APP_DRAINED: &str = "churn-drained";
/// Pods of each arm a drain evicts.
const DRAINED_PODS: usize = 3;

/// The arms of the interleaved comparison, each a namespace of its own
/// ([`arm_namespace`]) that admission treats as one phase does: no webhook,
/// the no-op floor, graceguard. Preemptions and drains take the arms in
/// turn, so that all three meet the same moments of a busy machine and a
/// repetition's ratios compare like with like, whatever the phase.
pub const ARMS: [&str; 3] = ["none", "noop", "graceguard"];

/// Arm `arm`'s namespace.
pub fn arm_namespace(arm: &str) -> String {
    format!("{NS}-{arm}")
}

/// Which of `arms` takes the `i`-th preemption or drain of phase `phase`:
/// in turn, the order rotated every round and every phase, so each arm
/// takes each place in a round as often.
pub fn arm_of(i: usize, phase: usize, arms: usize) -> usize {
    let arms = arms.max(1);
    (i % arms + i / arms + phase) % arms
}

/// One arm: its namespace's pods and the watch that times them.
#[derive(Clone)]
pub struct Arm {
    pub name: &'static str,
    pods: Api<Pod>,
    pub watch: PodWatch,
}

impl Arm {
    /// Watches arm `name`'s namespace (which must exist).
    pub fn start(client: &Client, name: &'static str) -> Self {
        let ns = arm_namespace(name);
        Self {
            name,
            pods: Api::namespaced(client.clone(), &ns),
            watch: PodWatch::start(client, &ns),
        }
    }
}

/// Every kind of pod in [`NS`], as the report names them: (report key,
/// `app` label). The preemptions' and drains' pods are the arms'.
pub const KINDS: [(&str, &str); 3] = [
    ("deployment", WEB),
    ("job", APP_JOB),
    ("executor", APP_EXECUTOR),
];
/// A hollow node has 1 CPU: two of these never fit together.
const PREEMPTION_CPU: &str = "700m";

/// How much of each part runs.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Shape {
    /// Replicas of the Deployment.
    pub web_replicas: u32,
    /// Graceful deletes of its pods per second.
    pub deletes_per_s: f64,
    /// Pods per Job.
    pub job_pods: u32,
    /// Executors re-creating their pod's name.
    pub executors: u32,
    /// A preemption starts this often (each on its own node).
    pub preempt_every: Duration,
    /// Nodes drained a phase, one after another, each on a node of its own
    /// (several, so that a phase run's drain figure is a median, not one
    /// sample).
    pub drains: u32,
    /// A drain starts this often.
    pub drain_every: Duration,
    /// Each executor deletes and re-creates its pod this often.
    pub executor_every: Duration,
}

impl Shape {
    /// The mix for `hollow_nodes` nodes.
    pub fn for_nodes(hollow_nodes: usize, quick: bool) -> Self {
        let n = u32::try_from(hollow_nodes).unwrap_or(u32::MAX);
        Self {
            web_replicas: (2 * n).max(4),
            deletes_per_s: if quick { 2.0 } else { 5.0 },
            job_pods: 3,
            executors: if quick { 2 } else { 5 },
            // Every second: about 45 preemptions a 60 s phase, so that a
            // phase run's p50 and p99 rest on more than a couple of dozen.
            preempt_every: Duration::from_secs(if quick { 2 } else { 1 }),
            // Six nodes of the 50 a phase (one with --quick's 3).
            drains: if quick { 1 } else { 6 },
            drain_every: Duration::from_secs(7),
            executor_every: Duration::from_secs(10),
        }
    }
}

/// What one phase's workload did.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Tally {
    pub deployment_pod_deletes: u64,
    pub jobs_created: u64,
    pub jobs_deleted: u64,
    /// Preemptions started (the schedule's count).
    pub preemptions_tried: u64,
    /// A high-priority pod ran where the low one was, which was deleted.
    pub preemptions: u64,
    /// Each completed preemption by arm: the preemptor's Create sent → it
    /// ran (ms).
    #[serde(skip)]
    pub preemption_ms: BTreeMap<&'static str, Vec<f64>>,
    pub drains: u64,
    /// Each drain that finished within the phase, by arm: cordon → none of
    /// the arm's pods left on the node (ms).
    #[serde(skip)]
    pub drain_ms: BTreeMap<&'static str, Vec<f64>>,
    pub evictions: u64,
    /// Graceful deletes of their pods by the executors (the schedule's count).
    pub executor_deletes: u64,
    /// Creates by the executors that made a pod.
    pub executor_creates: u64,
    /// Creates by the executors refused because the name was still held:
    /// 409 (retried after 50 ms) and 429 (retried after its Retry-After).
    pub executor_conflicts: u64,
    pub executor_retry_afters: u64,
    /// Each executor's delete sent → its new pod ran (ms).
    #[serde(skip)]
    pub executor_relaunch_ms: Vec<f64>,
    pub errors: u64,
    /// The first few errors, for the report.
    pub first_errors: Vec<String>,
}

type Shared = Arc<Mutex<Tally>>;

fn tally(t: &Shared, f: impl FnOnce(&mut Tally)) {
    if let Ok(mut t) = t.lock() {
        f(&mut t);
    }
}

fn failed(t: &Shared, what: &str, e: impl Display) {
    tally(t, |t| {
        t.errors += 1;
        if t.first_errors.len() < 5 {
            t.first_errors.push(format!("{what}: {e}"));
        }
    });
}

/// A pod's place in the watch's view.
#[derive(Clone, Debug)]
struct Seen {
    app: String,
    node: Option<String>,
    terminating: bool,
    running: bool,
    /// When the watch first showed it running.
    ran_at: Option<Instant>,
    uid: Option<String>,
}

#[derive(Default)]
struct WatchState {
    pods: HashMap<String, Seen>,
    /// A (re-)list in progress: its pods replace `pods` once it completes,
    /// so a pod deleted while the watch was broken is not kept for ever.
    listing: Option<HashMap<String, Seen>>,
    first_seen: HashMap<String, Instant>,
    /// Startup latencies (ms), with the pod's `app`.
    startup_ms: Vec<(String, f64)>,
    /// Pods whose deletion has begun, by uid: their `app` and since when.
    leaving: HashMap<String, (String, Instant)>,
    /// Deletion-to-gone times (ms), with the pod's `app`.
    gone_ms: Vec<(String, f64)>,
}

/// The namespace's pods as one watch sees them, and their startup latencies.
#[derive(Clone, Default)]
pub struct PodWatch(Arc<Mutex<WatchState>>);

fn all_running(p: &Pod) -> bool {
    let Some(s) = p.status.as_ref() else {
        return false;
    };
    s.phase.as_deref() == Some("Running")
        && s.container_statuses.as_ref().is_some_and(|cs| {
            !cs.is_empty()
                && cs
                    .iter()
                    .all(|c| c.state.as_ref().is_some_and(|st| st.running.is_some()))
        })
}

impl PodWatch {
    /// Starts watching `ns`; the task ends with the runtime.
    pub fn start(client: &Client, ns: &str) -> Self {
        let me = Self::default();
        let state = me.0.clone();
        let api: Api<Pod> = Api::namespaced(client.clone(), ns);
        tokio::spawn(async move {
            let mut events = watcher(api, watcher::Config::default())
                .default_backoff()
                .boxed();
            while let Some(ev) = events.next().await {
                let Ok(ev) = ev else { continue };
                let Ok(mut st) = state.lock() else { return };
                match ev {
                    watcher::Event::Apply(p) => st.apply(&p, true),
                    watcher::Event::InitApply(p) => st.apply(&p, false),
                    watcher::Event::Delete(p) => st.delete(&p),
                    watcher::Event::Init => st.listing = Some(HashMap::new()),
                    watcher::Event::InitDone => {
                        if let Some(listed) = st.listing.take() {
                            st.pods = listed;
                        }
                    }
                }
            }
        });
        me
    }

    /// Forgets the startup latencies measured so far, and the pods waiting
    /// to start: only pods first seen after this count in the next figures.
    pub fn reset(&self) {
        if let Ok(mut st) = self.0.lock() {
            st.startup_ms.clear();
            st.first_seen.clear();
            st.gone_ms.clear();
            st.leaving.clear();
        }
    }

    /// Waits until no pod of the namespace is terminating or not yet running
    /// (the previous phase's deletions and re-creations are done), at most
    /// `limit`; returns the seconds waited and whether it got there.
    pub async fn settle(&self, limit: Duration) -> (f64, bool) {
        let t0 = Instant::now();
        loop {
            let busy = self
                .snapshot()
                .iter()
                .any(|(_, s)| s.terminating || !s.running);
            if !busy || t0.elapsed() >= limit {
                return (t0.elapsed().as_secs_f64(), !busy);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The startup latencies (ms) measured since the last [`PodWatch::reset`].
    pub fn startup_ms(&self) -> Vec<f64> {
        self.samples(|st| &st.startup_ms, None)
    }

    /// The startup latencies (ms) since the last reset of pods of `app`.
    pub fn startup_ms_of(&self, app: &str) -> Vec<f64> {
        self.samples(|st| &st.startup_ms, Some(app))
    }

    /// The deletion-to-gone times (ms) since the last reset of pods of `app`.
    pub fn gone_ms_of(&self, app: &str) -> Vec<f64> {
        self.samples(|st| &st.gone_ms, Some(app))
    }

    /// The samples `of` picks, of pods of `app` (or of every pod).
    fn samples(
        &self,
        of: impl Fn(&WatchState) -> &Vec<(String, f64)>,
        app: Option<&str>,
    ) -> Vec<f64> {
        self.0
            .lock()
            .map(|st| {
                of(&st)
                    .iter()
                    .filter(|(a, _)| app.is_none_or(|want| a == want))
                    .map(|(_, ms)| *ms)
                    .collect()
            })
            .unwrap_or_default()
    }

    /// When the watch first showed `name` running, if it has.
    fn ran_at(&self, name: &str) -> Option<Instant> {
        self.get(name).and_then(|s| s.ran_at)
    }

    fn snapshot(&self) -> Vec<(String, Seen)> {
        self.0
            .lock()
            .map(|st| {
                st.pods
                    .iter()
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect()
            })
            .unwrap_or_default()
    }

    fn get(&self, name: &str) -> Option<Seen> {
        self.0.lock().ok()?.pods.get(name).cloned()
    }

    /// Waits until `name` is running (true) or `limit` passes (false).
    async fn wait_running(&self, name: &str, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if self.get(name).is_some_and(|s| s.running && !s.terminating) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    }

    /// Waits until `name` is gone (true) or `limit` passes (false).
    async fn wait_gone(&self, name: &str, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if self.get(name).is_none() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    }

    /// Waits until `name` is gone or terminating (true) or `limit` passes.
    async fn wait_leaving(&self, name: &str, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if self.get(name).is_none_or(|s| s.terminating) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    }
}

impl WatchState {
    /// `p` is gone: its deletion-to-gone time counts if its deletion was seen.
    fn delete(&mut self, p: &Pod) {
        self.pods.remove(&p.name_any());
        let uid = p.uid().unwrap_or_default();
        self.first_seen.remove(&uid);
        if let Some((app, since)) = self.leaving.remove(&uid) {
            self.gone_ms
                .push((app, since.elapsed().as_secs_f64() * 1000.0));
        }
    }

    fn apply(&mut self, p: &Pod, live: bool) {
        let uid = p.uid().unwrap_or_default();
        let running = all_running(p);
        if live
            && !running
            && !self.first_seen.contains_key(&uid)
            && p.status.as_ref().is_none_or(|s| s.start_time.is_none())
        {
            self.first_seen.insert(uid.clone(), Instant::now());
        }
        let app = p.labels().get("app").cloned().unwrap_or_default();
        if running {
            if let Some(t) = self.first_seen.remove(&uid) {
                self.startup_ms
                    .push((app.clone(), t.elapsed().as_secs_f64() * 1000.0));
            }
        }
        let terminating = p.metadata.deletion_timestamp.is_some();
        if live && terminating && !self.leaving.contains_key(&uid) {
            self.leaving.insert(uid, (app.clone(), Instant::now()));
        }
        let name = p.name_any();
        // The first time it ran, kept across a re-list (`pods` holds the
        // latest state until the list completes); a pod of the same name
        // made again runs anew.
        let ran_at = self
            .pods
            .get(&name)
            .filter(|before| before.uid == p.uid())
            .and_then(|before| before.ran_at)
            .or(running.then(Instant::now));
        let pods = match self.listing.as_mut() {
            Some(listing) if !live => listing,
            _ => &mut self.pods,
        };
        pods.insert(
            name,
            Seen {
                app,
                node: p.spec.as_ref().and_then(|s| s.node_name.clone()),
                terminating,
                running,
                ran_at,
                uid: p.uid(),
            },
        );
    }
}

/// A pod spec that lands only on hollow nodes (their toleration and label),
/// or on hollow node `node` alone.
fn hollow_spec(node: Option<&str>, extra: Value) -> Value {
    let mut selector = json!({hollow::LABEL.0: hollow::LABEL.1});
    if let Some(n) = node {
        selector["kubernetes.io/hostname"] = json!(n);
    }
    let mut spec = json!({
        "nodeSelector": selector,
        "tolerations": [{"key": hollow::TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}],
        "terminationGracePeriodSeconds": 5,
        "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10", "imagePullPolicy": "IfNotPresent"}],
    });
    if let (Some(s), Some(e)) = (spec.as_object_mut(), extra.as_object()) {
        for (k, v) in e {
            s.insert(k.clone(), v.clone());
        }
    }
    spec
}

/// Creates the namespace's fixed parts: the PriorityClasses and the
/// Deployment, and waits until its pods run.
pub async fn set_up(client: &Client, shape: Shape, watch: &PodWatch) -> Result<()> {
    use k8s_openapi::api::scheduling::v1::PriorityClass;
    let pcs: Api<PriorityClass> = Api::all(client.clone());
    for (name, value) in [(LOW, 0), (HIGH, 1_000_000)] {
        let pc: PriorityClass =
            serde_json::from_value(json!({"metadata": {"name": name}, "value": value}))?;
        pcs.create(&PostParams::default(), &pc)
            .await
            .with_context(|| format!("creating PriorityClass {name}"))?;
    }
    let dep: k8s_openapi::api::apps::v1::Deployment = serde_json::from_value(json!({
        "metadata": {"name": WEB},
        "spec": {
            "replicas": shape.web_replicas,
            "selector": {"matchLabels": {"app": WEB}},
            "template": {"metadata": {"labels": {"app": WEB}}, "spec": hollow_spec(None, json!({}))},
        },
    }))?;
    Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &dep)
        .await
        .context("creating the churn Deployment")?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    for name in executor_names(shape) {
        pods.create(&PostParams::default(), &executor_pod(&name)?)
            .await
            .with_context(|| format!("creating executor pod {name}"))?;
    }
    let want = usize::try_from(shape.web_replicas + shape.executors)?;
    // Generous: on two shared cores the scheduler and 50 kubelets start
    // them all at once; only a failure waits this long.
    let limit = 120 + 2 * u64::from(shape.web_replicas);
    let deadline = Instant::now() + Duration::from_secs(limit);
    loop {
        let running = watch
            .snapshot()
            .iter()
            .filter(|(_, s)| (s.app == WEB || s.app == APP_EXECUTOR) && s.running && !s.terminating)
            .count();
        if running >= want {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "only {running} of the Deployment's and executors' {want} pods ran on the hollow nodes within {limit} s"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Runs the workload for `seconds`; phase `phase` picks which hollow nodes
/// are drained and preempted on, so each phase touches others.
pub async fn run(
    client: &Client,
    watch: &PodWatch,
    arms: &[Arm],
    hollow_nodes: &[String],
    shape: Shape,
    seconds: f64,
    phase: usize,
) -> Result<Tally> {
    let (drained, preempt_on) = split_nodes(hollow_nodes, shape.drains, phase)?;
    let t: Shared = Arc::default();
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let mut tasks = vec![
        tokio::spawn(delete_deployment_pods(
            pods.clone(),
            watch.clone(),
            t.clone(),
            shape.deletes_per_s,
            deadline,
        )),
        tokio::spawn(jobs(
            client.clone(),
            t.clone(),
            shape.job_pods,
            deadline,
            phase,
        )),
        tokio::spawn(preemptions(
            arms.to_vec(),
            t.clone(),
            preempt_on,
            schedule(seconds, shape.preempt_every, Duration::from_secs(15)),
            deadline,
            phase,
        )),
        tokio::spawn(drains(
            client.clone(),
            (watch.clone(), arms.to_vec()),
            t.clone(),
            drained,
            drain_starts(seconds, shape.drain_every),
            (deadline, phase),
        )),
    ];
    // Staggered: one executor's turn every executor_every / executors.
    let names = executor_names(shape);
    let stagger = shape.executor_every / shape.executors.max(1);
    for (k, name) in (0u32..).zip(names) {
        let offset = stagger * k;
        let starts: Vec<Duration> = schedule(
            seconds - offset.as_secs_f64(),
            shape.executor_every,
            Duration::from_secs(8),
        )
        .into_iter()
        .map(|at| at + offset)
        .collect();
        tasks.push(tokio::spawn(executor(
            pods.clone(),
            watch.clone(),
            t.clone(),
            name,
            starts,
            deadline,
        )));
    }
    for task in tasks {
        task.await.context("a churn worker panicked")?;
    }
    let out = t.lock().map(|t| t.clone()).unwrap_or_default();
    Ok(out)
}

/// At most `secs` seconds, and never past `deadline`: every worker stops
/// with the phase, so the phases' windows are equally long.
fn within(deadline: Instant, secs: u64) -> Duration {
    Duration::from_secs(secs).min(deadline.saturating_duration_since(Instant::now()))
}

async fn delete_deployment_pods(
    pods: Api<Pod>,
    watch: PodWatch,
    t: Shared,
    per_s: f64,
    deadline: Instant,
) {
    let period = Duration::from_secs_f64(1.0 / per_s.max(0.1));
    let mut tick = tokio::time::interval(period);
    while Instant::now() < deadline {
        tick.tick().await;
        let live: Vec<String> = watch
            .snapshot()
            .into_iter()
            .filter(|(_, s)| s.app == WEB && s.running && !s.terminating)
            .map(|(n, _)| n)
            .collect();
        if live.is_empty() {
            continue;
        }
        let name = &live[fastrand::usize(..live.len())];
        match pods.delete(name, &DeleteParams::default()).await {
            Ok(_) => tally(&t, |t| t.deployment_pod_deletes += 1),
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => failed(&t, "deleting a Deployment pod", e),
        }
    }
}

async fn jobs(client: Client, t: Shared, pods_per_job: u32, deadline: Instant, phase: usize) {
    let api: Api<Job> = Api::namespaced(client, NS);
    let mut live: VecDeque<(String, Instant)> = VecDeque::new();
    let mut tick = tokio::time::interval(Duration::from_secs(2));
    let mut i = 0;
    let background = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Background),
        ..Default::default()
    };
    while Instant::now() < deadline {
        tick.tick().await;
        let name = format!("job-{phase}-{i}");
        i += 1;
        let job: Result<Job, _> = serde_json::from_value(json!({
            "metadata": {"name": name},
            "spec": {
                "parallelism": pods_per_job, "completions": pods_per_job, "backoffLimit": 0,
                "template": {"metadata": {"labels": {"app": APP_JOB}}, "spec": hollow_spec(None, json!({"restartPolicy": "Never"}))},
            },
        }));
        match job {
            Ok(job) => match api.create(&PostParams::default(), &job).await {
                Ok(_) => {
                    tally(&t, |t| t.jobs_created += 1);
                    live.push_back((name, Instant::now()));
                }
                Err(e) => failed(&t, "creating a Job", e),
            },
            Err(e) => failed(&t, "building a Job", e),
        }
        while live
            .front()
            .is_some_and(|(_, at)| at.elapsed() > Duration::from_secs(10))
        {
            if let Some((name, _)) = live.pop_front() {
                match api.delete(&name, &background).await {
                    Ok(_) => tally(&t, |t| t.jobs_deleted += 1),
                    Err(e) => failed(&t, "deleting a Job", e),
                }
            }
        }
    }
    for (name, _) in live {
        if let Err(e) = api.delete(&name, &background).await {
            failed(&t, "deleting a Job", e);
        }
    }
}

fn priority_pod(name: &str, node: &str, class: &str) -> Result<Pod, serde_json::Error> {
    let app = if class == HIGH {
        APP_PREEMPTOR
    } else {
        APP_VICTIM
    };
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": app}},
        "spec": hollow_spec(Some(node), json!({
            "priorityClassName": class,
            "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                "resources": {"requests": {"cpu": PREEMPTION_CPU}}}],
        })),
    }))
}

/// The times in a phase of `seconds` at which scheduled work starts, every
/// `every` from 0, keeping `room` (at most 15 s, at most half the phase)
/// before its end for the last one to finish.
pub fn schedule(seconds: f64, every: Duration, room_max: Duration) -> Vec<Duration> {
    let phase = Duration::from_secs_f64(seconds.max(0.0));
    if phase.is_zero() {
        return Vec::new();
    }
    let room = room_max.min(phase / 2);
    let step = every.max(Duration::from_millis(100));
    let mut out = Vec::new();
    let mut at = Duration::ZERO;
    while at + room <= phase {
        out.push(at);
        at += step;
    }
    out
}

/// One preemption started at each of `starts`, on the nodes in turn and in
/// the arms in turn ([`arm_of`]); a node takes its next preemption only once
/// its last one is cleaned up.
async fn preemptions(
    arms: Vec<Arm>,
    t: Shared,
    nodes: Vec<String>,
    starts: Vec<Duration>,
    deadline: Instant,
    phase: usize,
) {
    let t0 = Instant::now();
    let locks: Vec<Arc<tokio::sync::Mutex<()>>> = nodes.iter().map(|_| Arc::default()).collect();
    let mut running = Vec::new();
    for (i, at) in starts.into_iter().enumerate() {
        tokio::time::sleep_until((t0 + at).into()).await;
        let (node, lock) = (
            nodes[i % nodes.len()].clone(),
            locks[i % nodes.len()].clone(),
        );
        let Some(arm) = arms.get(arm_of(i, phase, arms.len())).cloned() else {
            return;
        };
        let t = t.clone();
        running.push(tokio::spawn(async move {
            let _node = lock.lock().await;
            let settle = victim_settle(i);
            preempt(&arm, &t, (&node, settle), &format!("{phase}-{i}"), deadline).await;
        }));
    }
    for r in running {
        if let Err(e) = r.await {
            failed(&t, "a preemption task", e);
        }
    }
}

/// A victim on `node`, [`victim_settle`] later a preemptor that fits only
/// in its place: times the preemptor's Create → Running, then deletes both
/// at once.
async fn preempt(
    arm: &Arm,
    t: &Shared,
    (node, settle): (&str, Duration),
    id: &str,
    deadline: Instant,
) {
    let (pods, watch) = (&arm.pods, &arm.watch);
    let now = DeleteParams::default().grace_period(0);
    let (low, high) = (format!("low-{id}"), format!("high-{id}"));
    tally(t, |t| t.preemptions_tried += 1);
    let made = async {
        pods.create(&PostParams::default(), &priority_pod(&low, node, LOW)?)
            .await?;
        if !watch.wait_running(&low, within(deadline, 15)).await {
            anyhow::bail!(
                "the low-priority pod {low} did not run on {node} within 15 s or the phase"
            );
        }
        tokio::time::sleep(settle).await;
        let sent = Instant::now();
        pods.create(&PostParams::default(), &priority_pod(&high, node, HIGH)?)
            .await?;
        if watch.wait_leaving(&low, within(deadline, 15)).await
            && watch.wait_running(&high, within(deadline, 15)).await
        {
            let ran = watch.ran_at(&high).unwrap_or_else(Instant::now);
            let ms = ran.saturating_duration_since(sent).as_secs_f64() * 1000.0;
            tally(t, |t| {
                t.preemptions += 1;
                t.preemption_ms.entry(arm.name).or_default().push(ms);
            });
        }
        Ok(())
    };
    if let Err(e) = made.await {
        failed(t, "a preemption", e);
    }
    for name in [&high, &low] {
        match pods.delete(name, &now).await {
            Ok(_) | Err(kube::Error::Api(_)) => {}
            Err(e) => failed(t, "deleting a preemption pod", e),
        }
    }
    // The node is free for its next preemption once both are gone.
    for name in [&high, &low] {
        watch.wait_gone(name, within(deadline, 15)).await;
    }
}

/// The nodes a phase drains (`drains` of them, others in each phase, at
/// least one node left) and the ones its preemptions use (the rest, so a
/// preemption never waits on a cordoned node).
pub fn split_nodes(
    hollow_nodes: &[String],
    drains: u32,
    phase: usize,
) -> Result<(Vec<String>, Vec<String>)> {
    let n = hollow_nodes.len();
    anyhow::ensure!(
        n >= 2,
        "the churn workload needs at least 2 hollow nodes (one drained, one for the preemptions), got {n}"
    );
    let k = usize::try_from(drains)
        .unwrap_or(usize::MAX)
        .clamp(1, n - 1);
    let drained: Vec<String> = (0..k)
        .map(|j| hollow_nodes[(phase * k + j) % n].clone())
        .collect();
    let rest = hollow_nodes
        .iter()
        .filter(|h| !drained.contains(h))
        .cloned()
        .collect();
    Ok((drained, rest))
}

/// When a phase's drains start: the first a sixth into the phase (its
/// re-creations then fall inside it), then every `every`, keeping 15 s (at
/// most half the phase) for the last to finish.
pub fn drain_starts(seconds: f64, every: Duration) -> Vec<Duration> {
    let first = Duration::from_secs_f64(seconds.max(0.0) / 6.0);
    schedule(
        seconds - first.as_secs_f64(),
        every,
        Duration::from_secs(15),
    )
    .into_iter()
    .map(|at| at + first)
    .collect()
}

/// The phase's drains, one after another: each of `nodes` in turn at its
/// start in `starts` (a drain still running delays the next), for the arms
/// in turn ([`arm_of`]).
async fn drains(
    client: Client,
    (watch, arms): (PodWatch, Vec<Arm>),
    t: Shared,
    nodes: Vec<String>,
    starts: Vec<Duration>,
    (deadline, phase): (Instant, usize),
) {
    let t0 = Instant::now();
    for (j, (node, at)) in nodes.into_iter().zip(starts).enumerate() {
        let Some(arm) = arms.get(arm_of(j, phase, arms.len())) else {
            return;
        };
        tokio::time::sleep_until((t0 + at).into()).await;
        if Instant::now() >= deadline {
            break;
        }
        let id = format!("{phase}-{j}");
        let settle = victim_settle(j);
        drain(&client, (&watch, arm), &t, (&node, &id, settle), deadline).await;
    }
}

/// A drain of `node` for `arm`, as `kubectl drain` does it: puts
/// [`DRAINED_PODS`] pods of the arm on the node and waits until they run
/// and `settle` more ([`victim_settle`]), then cordons the node and evicts
/// every pod on it through the Eviction API (the arm's, and the churn
/// namespace's), and times the cordon until none of the arm's is left. The
/// node is uncordoned after.
async fn drain(
    client: &Client,
    (watch, arm): (&PodWatch, &Arm),
    t: &Shared,
    (node, id, settle): (&str, &str, Duration),
    deadline: Instant,
) {
    let names: Vec<String> = (0..DRAINED_PODS)
        .map(|k| format!("drained-{id}-{k}"))
        .collect();
    for name in &names {
        let made = async {
            let pod = drained_pod(name, node)?;
            arm.pods.create(&PostParams::default(), &pod).await?;
            anyhow::Ok(())
        };
        if let Err(e) = made.await {
            failed(t, "creating a pod to drain", e);
            return;
        }
    }
    for name in &names {
        if !arm.watch.wait_running(name, within(deadline, 15)).await {
            failed(
                t,
                "a pod to drain",
                format!("{name} did not run on {node} within 15 s or the phase"),
            );
            return;
        }
    }
    tokio::time::sleep(settle).await;
    let started = Instant::now();
    if let Err(e) = testbed::node::cordon(client, node, true).await {
        failed(t, "cordoning a node", e);
        return;
    }
    let churn: Api<Pod> = Api::namespaced(client.clone(), NS);
    let on_node = |w: &PodWatch| -> Vec<String> {
        w.snapshot()
            .into_iter()
            .filter(|(_, s)| s.node.as_deref() == Some(node) && !s.terminating)
            .filter(|(_, s)| s.app != APP_PREEMPTOR && s.app != APP_VICTIM)
            .map(|(n, _)| n)
            .collect()
    };
    for (pods, name) in on_node(&arm.watch)
        .into_iter()
        .map(|n| (&arm.pods, n))
        .chain(on_node(watch).into_iter().map(|n| (&churn, n)))
    {
        match pods.evict(&name, &EvictParams::default()).await {
            Ok(_) => tally(t, |t| t.evictions += 1),
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => failed(t, "evicting a pod", e),
        }
    }
    // Drained: none of the arm's pods left on the node, leaving or not (or
    // the phase ends).
    let left = || {
        !arm.watch
            .snapshot()
            .iter()
            .any(|(_, s)| s.node.as_deref() == Some(node) && s.app == APP_DRAINED)
    };
    while Instant::now() < deadline && !left() {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let ms = left().then(|| started.elapsed().as_secs_f64() * 1000.0);
    tally(t, |t| {
        t.drains += 1;
        t.drain_ms.entry(arm.name).or_default().extend(ms);
    });
    if let Err(e) = testbed::node::cordon(client, node, false).await {
        failed(t, "uncordoning a node", e);
    }
}

/// A pod put on `node` for its drain.
fn drained_pod(name: &str, node: &str) -> Result<Pod, serde_json::Error> {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": APP_DRAINED}},
        "spec": hollow_spec(Some(node), json!({})),
    }))
}

fn executor_pod(name: &str) -> Result<Pod, serde_json::Error> {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": APP_EXECUTOR}},
        "spec": hollow_spec(None, json!({"restartPolicy": "Never"})),
    }))
}

/// The executors' pod names.
pub fn executor_names(shape: Shape) -> Vec<String> {
    (0..shape.executors).map(|k| format!("exec-{k}")).collect()
}

/// Creates `name` as an executor does, until it is made or `deadline`:
/// a 409 (the name still held) again after 50 ms, a 429 after its
/// `retryAfterSeconds`, as client-go waits. Whether it was made.
async fn create_until_made(pods: &Api<Pod>, t: &Shared, name: &str, deadline: Instant) -> bool {
    let pod = match executor_pod(name) {
        Ok(p) => p,
        Err(e) => {
            failed(t, "building an executor pod", e);
            return false;
        }
    };
    while Instant::now() < deadline {
        let wait = match testbed::pods::create(pods, &pod).await {
            Ok(testbed::pods::CreateOutcome::Created) => {
                tally(t, |t| t.executor_creates += 1);
                return true;
            }
            Ok(testbed::pods::CreateOutcome::Refused { code: 409, .. }) => {
                tally(t, |t| t.executor_conflicts += 1);
                Duration::from_millis(50)
            }
            Ok(testbed::pods::CreateOutcome::Refused {
                code: 429,
                retry_after_seconds,
                ..
            }) => {
                tally(t, |t| t.executor_retry_afters += 1);
                Duration::from_secs(u64::from(retry_after_seconds.max(1)))
            }
            Ok(refused) => {
                failed(t, "an executor's Create", format!("{refused:?}"));
                Duration::from_millis(200)
            }
            Err(e) => {
                failed(t, "an executor's Create", e);
                Duration::from_millis(200)
            }
        };
        tokio::time::sleep(wait.min(deadline.saturating_duration_since(Instant::now()))).await;
    }
    false
}

/// Executor `name`: at each of `starts`, deletes its pod gracefully and
/// re-creates the name at once; times the delete → the new pod running.
async fn executor(
    pods: Api<Pod>,
    watch: PodWatch,
    t: Shared,
    name: String,
    starts: Vec<Duration>,
    deadline: Instant,
) {
    let t0 = Instant::now();
    for at in starts {
        tokio::time::sleep_until((t0 + at).into()).await;
        let sent = Instant::now();
        match pods.delete(&name, &DeleteParams::default()).await {
            Ok(_) => tally(&t, |t| t.executor_deletes += 1),
            Err(kube::Error::Api(s)) if s.code == 404 => {} // evicted by the drain
            Err(e) => failed(&t, "an executor's delete", e),
        }
        if !create_until_made(&pods, &t, &name, deadline).await {
            return;
        }
        // Its new pod running (the old one ran before `sent`).
        while Instant::now() < deadline && watch.ran_at(&name).is_none_or(|r| r < sent) {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if let Some(ran) = watch.ran_at(&name).filter(|r| *r >= sent) {
            let ms = ran.saturating_duration_since(sent).as_secs_f64() * 1000.0;
            tally(&t, |t| t.executor_relaunch_ms.push(ms));
        }
    }
}

/// Uncordons every hollow node (a drain cut short by the phase's end).
pub async fn uncordon_all(client: &Client, hollow_nodes: &[String]) -> Result<()> {
    for n in hollow_nodes {
        testbed::node::cordon(client, n, false).await?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, uid: &str, running: bool, deleting: bool) -> Pod {
        let mut v = json!({
            "metadata": {"name": name, "uid": uid, "labels": {"app": APP_VICTIM}},
            "status": {"phase": "Pending"},
        });
        if running {
            v["status"] = json!({"phase": "Running", "startTime": "2026-12-06T00:00:00Z",
                "containerStatuses": [{"name": "main", "image": "i", "imageID": "", "ready": true,
                    "restartCount": 0, "state": {"running": {}}}]});
        }
        if deleting {
            v["metadata"]["deletionTimestamp"] = json!("2026-12-06T00:00:05Z");
        }
        serde_json::from_value(v).unwrap_or_else(|e| panic!("a pod: {e}"))
    }

    #[test]
    fn a_pod_runs_once_per_uid_and_its_leaving_is_timed_per_kind() {
        let mut st = WatchState::default();
        st.apply(&pod("p", "u1", false, false), true);
        st.apply(&pod("p", "u1", true, false), true);
        let first = st.pods.get("p").and_then(|s| s.ran_at);
        assert!(first.is_some());
        assert_eq!(st.startup_ms.len(), 1);
        // A re-list keeps when it first ran.
        st.listing = Some(HashMap::new());
        st.apply(&pod("p", "u1", true, false), false);
        assert_eq!(
            st.listing
                .as_ref()
                .and_then(|l| l.get("p"))
                .and_then(|s| s.ran_at),
            first
        );
        st.listing = None;
        // Its deletion begins, then it is gone: one deletion-to-gone sample.
        st.apply(&pod("p", "u1", true, true), true);
        st.delete(&pod("p", "u1", true, true));
        assert_eq!(st.gone_ms.len(), 1);
        assert_eq!(st.gone_ms[0].0, APP_VICTIM);
        // The same name made again is a new pod: not running yet.
        st.apply(&pod("p", "u2", false, false), true);
        assert_eq!(st.pods.get("p").and_then(|s| s.ran_at), None);
        // A pod deleted at once (no deletion seen first) gives no sample.
        st.delete(&pod("p", "u2", false, false));
        assert_eq!(st.gone_ms.len(), 1);
    }
}
