//! The `cluster_churn` workload of `scripts/bench`: what a busy cluster does
//! to its pods, on hollow nodes ([`crate::node::hollow`]), for a fixed time:
//!
//! * a Deployment whose pods are deleted gracefully at a steady rate (its
//!   ReplicaSet controller re-creates them);
//! * Jobs created every 2 s and deleted 10 s later (the garbage collector
//!   deletes their pods);
//! * scheduler preemptions: a low-priority pod fills a hollow node's CPU and
//!   a high-priority one that fits only there preempts it;
//! * a drain: one hollow node cordoned and every workload pod on it evicted
//!   through the Eviction API, then uncordoned;
//! * executors re-creating names: each creates its pod, deletes it
//!   gracefully once Running and re-creates the same name at once, retrying
//!   a refused Create every 50 ms (Flyte's pattern; the namespace's
//!   `graceguard.io/mode=conflict` makes graceguard answer at once rather than
//!   hold the Create, so every phase answers the collision with an immediate
//!   409 and the latency compared is the webhook's own, not a deliberate wait).
//!
//! Besides, it watches the namespace for the pod startup latency: from the
//! watch event that first shows a pod to the one that shows every container
//! running, both seen by the same watch (Kubernetes' pod startup SLI, on
//! nodes with no image pulls).

use std::collections::{HashMap, VecDeque};
use std::fmt::Display;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{DeleteParams, EvictParams, Patch, PatchParams, PostParams, PropagationPolicy};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, ResourceExt};
use serde::Serialize;
use serde_json::{json, Value};

use crate::node::hollow;

/// The namespace the workload runs in.
pub const NS: &str = "churn";
/// The Deployment's name and its pods' `app` label.
pub const WEB: &str = "churn-web";
const LOW: &str = "churn-low";
const HIGH: &str = "churn-high";
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
        }
    }
}

/// What one phase's workload did.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Tally {
    pub deployment_pod_deletes: u64,
    pub jobs_created: u64,
    pub jobs_deleted: u64,
    pub preemptions_tried: u64,
    /// A high-priority pod ran where the low one was, which was deleted.
    pub preemptions: u64,
    pub drains: u64,
    pub evictions: u64,
    /// Creates by the executors that made a pod.
    pub executor_creates: u64,
    /// Creates by the executors refused because the name was still held.
    pub executor_conflicts: u64,
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
}

#[derive(Default)]
struct WatchState {
    pods: HashMap<String, Seen>,
    /// A (re-)list in progress: its pods replace `pods` once it completes,
    /// so a pod deleted while the watch was broken is not kept for ever.
    listing: Option<HashMap<String, Seen>>,
    first_seen: HashMap<String, Instant>,
    startup_ms: Vec<f64>,
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
                    watcher::Event::Delete(p) => {
                        st.pods.remove(&p.name_any());
                        st.first_seen.remove(&p.uid().unwrap_or_default());
                    }
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
        self.0
            .lock()
            .map(|st| st.startup_ms.clone())
            .unwrap_or_default()
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
        if running {
            if let Some(t) = self.first_seen.remove(&uid) {
                self.startup_ms.push(t.elapsed().as_secs_f64() * 1000.0);
            }
        }
        let pods = match self.listing.as_mut() {
            Some(listing) if !live => listing,
            _ => &mut self.pods,
        };
        pods.insert(
            p.name_any(),
            Seen {
                app: p.labels().get("app").cloned().unwrap_or_default(),
                node: p.spec.as_ref().and_then(|s| s.node_name.clone()),
                terminating: p.metadata.deletion_timestamp.is_some(),
                running,
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
    let want = usize::try_from(shape.web_replicas)?;
    // Generous: on two shared cores the scheduler and 50 kubelets start
    // them all at once; only a failure waits this long.
    let limit = 120 + 2 * u64::from(shape.web_replicas);
    let deadline = Instant::now() + Duration::from_secs(limit);
    loop {
        let running = watch
            .snapshot()
            .iter()
            .filter(|(_, s)| s.app == WEB && s.running && !s.terminating)
            .count();
        if running >= want {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "only {running} of the Deployment's {want} pods ran on the hollow nodes within {limit} s"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Runs the workload for `seconds`; phase `phase` picks which hollow nodes
/// are drained and preempted on, so each phase touches others.
pub async fn run(
    client: &Client,
    watch: &PodWatch,
    hollow_nodes: &[String],
    shape: Shape,
    seconds: f64,
    phase: usize,
) -> Result<Tally> {
    anyhow::ensure!(
        hollow_nodes.len() >= 2,
        "the churn workload needs at least 2 hollow nodes"
    );
    let t: Shared = Arc::default();
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let drained = hollow_nodes[phase % hollow_nodes.len()].clone();
    let preempt_on: Vec<String> = hollow_nodes
        .iter()
        .filter(|n| **n != drained)
        .cloned()
        .collect();
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
        tokio::spawn(preempt(
            pods.clone(),
            watch.clone(),
            t.clone(),
            preempt_on,
            deadline,
            phase,
        )),
        tokio::spawn(drain(
            client.clone(),
            watch.clone(),
            t.clone(),
            drained,
            deadline,
            seconds,
        )),
    ];
    for k in 0..shape.executors {
        tasks.push(tokio::spawn(executor(
            pods.clone(),
            watch.clone(),
            t.clone(),
            format!("exec-{k}"),
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
                "template": {"metadata": {"labels": {"app": "churn-job"}}, "spec": hollow_spec(None, json!({"restartPolicy": "Never"}))},
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
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": "churn-preempt"}},
        "spec": hollow_spec(Some(node), json!({
            "priorityClassName": class,
            "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                "resources": {"requests": {"cpu": PREEMPTION_CPU}}}],
        })),
    }))
}

async fn preempt(
    pods: Api<Pod>,
    watch: PodWatch,
    t: Shared,
    nodes: Vec<String>,
    deadline: Instant,
    phase: usize,
) {
    let now = DeleteParams::default().grace_period(0);
    let mut i = 0;
    while Instant::now() + Duration::from_secs(5) < deadline {
        let node = &nodes[i % nodes.len()];
        let (low, high) = (format!("low-{phase}-{i}"), format!("high-{phase}-{i}"));
        i += 1;
        tally(&t, |t| t.preemptions_tried += 1);
        let made = async {
            pods.create(&PostParams::default(), &priority_pod(&low, node, LOW)?)
                .await?;
            if !watch.wait_running(&low, within(deadline, 15)).await {
                if Instant::now() >= deadline {
                    return Ok(()); // the phase ended first
                }
                anyhow::bail!("the low-priority pod {low} did not run on {node} within 15 s");
            }
            pods.create(&PostParams::default(), &priority_pod(&high, node, HIGH)?)
                .await?;
            if watch.wait_leaving(&low, within(deadline, 15)).await
                && watch.wait_running(&high, within(deadline, 15)).await
            {
                tally(&t, |t| t.preemptions += 1);
            }
            Ok(())
        };
        if let Err(e) = made.await {
            failed(&t, "a preemption", e);
        }
        for name in [&high, &low] {
            match pods.delete(name, &now).await {
                Ok(_) | Err(kube::Error::Api(_)) => {}
                Err(e) => failed(&t, "deleting a preemption pod", e),
            }
        }
    }
}

async fn drain(
    client: Client,
    watch: PodWatch,
    t: Shared,
    node: String,
    deadline: Instant,
    seconds: f64,
) {
    // A third into the phase, so that the drain's re-creations fall inside it.
    tokio::time::sleep(Duration::from_secs_f64(seconds / 3.0)).await;
    let nodes: Api<Node> = Api::all(client.clone());
    let pods: Api<Pod> = Api::namespaced(client, NS);
    let cordon = |on: bool| json!({"spec": {"unschedulable": on}});
    if let Err(e) = nodes
        .patch(&node, &PatchParams::default(), &Patch::Merge(cordon(true)))
        .await
    {
        failed(&t, "cordoning a node", e);
        return;
    }
    let on_node: Vec<String> = watch
        .snapshot()
        .into_iter()
        .filter(|(_, s)| s.node.as_deref() == Some(node.as_str()) && !s.terminating)
        .map(|(n, _)| n)
        .collect();
    for name in &on_node {
        match pods.evict(name, &EvictParams::default()).await {
            Ok(_) => tally(&t, |t| t.evictions += 1),
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => failed(&t, "evicting a pod", e),
        }
    }
    // Drained: nothing of the workload left on the node (or the phase ends).
    while Instant::now() < deadline
        && watch
            .snapshot()
            .iter()
            .any(|(_, s)| s.node.as_deref() == Some(node.as_str()) && s.app != "churn-preempt")
    {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tally(&t, |t| t.drains += 1);
    if let Err(e) = nodes
        .patch(&node, &PatchParams::default(), &Patch::Merge(cordon(false)))
        .await
    {
        failed(&t, "uncordoning a node", e);
    }
}

async fn executor(pods: Api<Pod>, watch: PodWatch, t: Shared, name: String, deadline: Instant) {
    let pod: Pod = match serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": "churn-executor"}},
        "spec": hollow_spec(None, json!({"restartPolicy": "Never"})),
    })) {
        Ok(p) => p,
        Err(e) => return failed(&t, "building an executor pod", e),
    };
    while Instant::now() < deadline {
        match pods.create(&PostParams::default(), &pod).await {
            Ok(_) => tally(&t, |t| t.executor_creates += 1),
            Err(kube::Error::Api(s)) if s.code == 409 => {
                tally(&t, |t| t.executor_conflicts += 1);
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
            Err(e) => {
                failed(&t, "an executor's Create", e);
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        }
        watch.wait_running(&name, within(deadline, 15)).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        match pods.delete(&name, &DeleteParams::default()).await {
            Ok(_) | Err(kube::Error::Api(_)) => {}
            Err(e) => failed(&t, "an executor's delete", e),
        }
    }
}

/// Uncordons every hollow node (a drain cut short by the phase's end).
pub async fn uncordon_all(client: &Client, hollow_nodes: &[String]) -> Result<()> {
    let nodes: Api<Node> = Api::all(client.clone());
    for n in hollow_nodes {
        nodes
            .patch(
                n,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"unschedulable": null}})),
            )
            .await
            .with_context(|| format!("uncordoning {n}"))?;
    }
    Ok(())
}
