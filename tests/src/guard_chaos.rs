//! `guard_chaos`: many tasks through one `graceguard sidecar` while the
//! sidecar is SIGKILLed and restarted, the API server is restarted, and
//! running pods are deleted (as preemptions are) or evicted. A client in the
//! test follows the API as documented: it PUTs its tasks, long-polls the
//! events with their epoch, acknowledges each result, and after a restart
//! (409 `EpochChanged`, or a new epoch) reads from 0 and PUTs its unfinished
//! tasks again. What must hold, counted from the API server's audit log:
//!
//! * every task's result is delivered and acknowledged;
//! * a pod is marked done only after its task's result was acknowledged;
//! * no Create meets a pod holding its name (no 409), and no attempt's name
//!   is created twice (the result finalizer keeps a task's newest pod, and
//!   with it the attempt reached, through any deletion until the result is
//!   acknowledged);
//! * once every task has ended, no pod of it is left Pending or Running.
//!
//! The quick form runs in `scripts/test` (tests/tests/e2e/guard_chaos.rs), the
//! full one in `scripts/reliability` (group `guard_chaos`).

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::{Api, ResourceExt};
use serde::Serialize;

use testbed::control_plane::TestBed;
use testbed::kubelet::{FinishDeletions, Kubelet, KubeletOptions, Terminal};
use testbed::pods;
use testbed::sidecar::SidecarProcess;

/// How much chaos.
#[derive(Clone, Debug)]
pub struct ChaosOptions {
    pub tasks: usize,
    /// SIGKILLs of the sidecar (each followed by a restart).
    pub sidecar_kills: usize,
    /// API server restarts.
    pub apiserver_restarts: usize,
    /// Every how many turns of the client loop one running pod is deleted
    /// or evicted instead of being let finish.
    pub disrupt_every: usize,
    /// The whole run may take this long.
    pub deadline: Duration,
    /// Run the pods on the bed's real nodes (a kubelet, containerd and
    /// runc per node): each container runs a few seconds and exits by
    /// itself, and the real kubelet carries out the deletions and
    /// evictions. Otherwise the simulated kubelet ends them.
    pub real_nodes: bool,
}

/// What happened, and what the checks found.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ChaosReport {
    pub tasks: usize,
    pub results_acknowledged: usize,
    pub results_delivered: usize,
    pub sidecar_kills: usize,
    pub apiserver_restarts: usize,
    pub pods_deleted: usize,
    pub pods_evicted: usize,
    pub pods_created: usize,
    pub names_created_twice: Vec<String>,
    /// Of those, names whose task's pods were never deleted nor evicted.
    pub names_created_twice_undisrupted: Vec<String>,
    /// Creates answered 409 (a name held by a pod).
    pub create_conflicts: usize,
    pub done_before_ack: Vec<String>,
    pub left_running: Vec<String>,
    pub seconds: f64,
}

impl ChaosReport {
    /// Whether every check held.
    pub fn pass(&self) -> bool {
        self.results_acknowledged == self.tasks
            && self.names_created_twice.is_empty()
            && self.create_conflicts == 0
            && self.done_before_ack.is_empty()
            && self.left_running.is_empty()
    }
}

impl ChaosReport {
    /// Fails, naming the report, unless every check held and the chaos
    /// `opts` asked for happened (kills, restarts, some disruption).
    pub fn assert_held(&self, opts: &ChaosOptions) {
        assert_eq!(self.results_acknowledged, opts.tasks, "{self:?}");
        assert_eq!(
            (self.sidecar_kills, self.apiserver_restarts),
            (opts.sidecar_kills, opts.apiserver_restarts),
            "{self:?}"
        );
        assert!(self.pods_deleted + self.pods_evicted > 0, "{self:?}");
        assert_eq!(self.create_conflicts, 0, "{self:?}");
        // The result finalizer keeps each task's newest pod through any
        // deletion: a restarted sidecar never starts a task over.
        assert!(self.names_created_twice.is_empty(), "{self:?}");
        assert!(self.done_before_ack.is_empty(), "{self:?}");
        assert!(self.left_running.is_empty(), "{self:?}");
    }
}

/// The client's view of one task.
#[derive(Default)]
struct Mine {
    /// The acknowledgement was answered 200.
    acked_at_us: Option<i64>,
    /// The first acknowledgement was sent (its answer may have been lost to
    /// a kill, after the done-mark).
    first_ack_sent_us: Option<i64>,
    results: usize,
    /// The pods its results name (their done-marks are the patches that
    /// count; other patches let go of earlier attempts' finalizers).
    result_pods: std::collections::HashSet<String>,
}

fn now_us() -> i64 {
    k8s_openapi::jiff::Timestamp::now().as_microsecond()
}

/// The task a pod name (`<task>-<attempt>`) belongs to.
fn task_of(pod: &str) -> &str {
    pod.rsplit_once('-').map_or(pod, |(t, _)| t)
}

/// Runs the chaos on `bed` (audit log on) in namespace `ns`.
pub async fn run(bed: &mut TestBed, ns: &str, opts: &ChaosOptions) -> Result<ChaosReport> {
    let started = Instant::now();
    let (kubelet, template) = match opts.real_nodes {
        false => {
            let kubelet = Kubelet::start(
                bed,
                KubeletOptions {
                    finish_deletions: FinishDeletions::AfterShareOfGrace(0.1),
                    ..Default::default()
                },
            )
            .await?;
            (Some(kubelet), pods::task_pod("template", 10))
        }
        true => {
            // Runs 3 s, or stops 1 s after a SIGTERM.
            let mut pod = pods::task_pod("template", 10);
            pods::run_in(
                &mut pod,
                &bed.task_image()?,
                &pods::finite_task_script(3, 1),
            );
            (None, pod)
        }
    };
    let template = serde_json::to_value(template)?;
    let body = serde_json::json!({"template": template, "retries": 0, "max_system_failures": 20,
        "bounds": {"max_total_system_failures": 50}});
    let mut sidecar = SidecarProcess::start(bed, "chaos", ns).await?;
    let names: Vec<String> = (0..opts.tasks).map(|i| format!("c{i}")).collect();
    let mut mine: HashMap<String, Mine> =
        names.iter().map(|n| (n.clone(), Mine::default())).collect();
    let put_all = |sidecar: &SidecarProcess, mine: &HashMap<String, Mine>| {
        let todo: Vec<String> = mine
            .iter()
            .filter(|(_, m)| m.acked_at_us.is_none())
            .map(|(n, _)| n.clone())
            .collect();
        let (socket, body) = (sidecar.socket.clone(), body.clone());
        let ns = ns.to_string();
        async move {
            for n in todo {
                let path = format!("/v1/tasks/{ns}/{n}");
                let (code, st) = testbed::sidecar::http(&socket, "PUT", &path, Some(&body)).await?;
                if code != 201 && code != 200 {
                    bail!("PUT {path}: {code} {st}");
                }
            }
            anyhow::Ok(())
        }
    };
    put_all(&sidecar, &mine).await?;

    let api: Api<Pod> = Api::namespaced(bed.client.clone(), ns);
    let mut report = ChaosReport {
        tasks: opts.tasks,
        ..Default::default()
    };
    // `epoch` is the cursor's; `put_epoch` the process the tasks were last
    // submitted to (a new one gets them again).
    let (mut after, mut epoch) = (0u64, String::new());
    let mut put_epoch: Option<String> = None;
    let mut disrupted = std::collections::BTreeSet::new();
    let mut turn = 0usize;
    // Chaos is spread over the run by progress: kill k comes once k/(n+1)
    // of the results are in, restarts half a step later, so each meets tasks
    // in every state.
    // (before the last result at the latest: a run of few tasks still
    // meets every kill and restart)
    let at = |k: usize, n: usize, offset: f64| {
        let share = (k as f64 + 1.0 - offset) / (n as f64 + 1.0);
        ((share * opts.tasks as f64).ceil() as usize).min(opts.tasks.saturating_sub(1))
    };
    let due = |done: usize, k: usize, n: usize, offset: f64| done >= at(k, n, offset);
    while report.results_acknowledged < opts.tasks {
        if started.elapsed() > opts.deadline {
            let mut stuck = Vec::new();
            for (n, _) in mine.iter().filter(|(_, m)| m.acked_at_us.is_none()) {
                let st = sidecar
                    .request("GET", &format!("/v1/tasks/{ns}/{n}"), None)
                    .await
                    .map(|(c, b)| format!("{c} {b}"))
                    .unwrap_or_else(|e| e.to_string());
                stuck.push(format!("{n}: {st}"));
            }
            let pods: Vec<String> = api
                .list(&ListParams::default())
                .await
                .map(|l| {
                    l.items
                        .iter()
                        .map(|p| {
                            format!(
                                "{} {:?} deleting={}",
                                p.name_any(),
                                p.status.as_ref().and_then(|s| s.phase.clone()),
                                p.metadata.deletion_timestamp.is_some()
                            )
                        })
                        .collect()
                })
                .unwrap_or_default();
            bail!(
                "only {} of {} results acknowledged within {:?}: {report:?}\nnot acknowledged:\n{}\npods: {pods:?}\nsidecar log: {}",
                report.results_acknowledged,
                opts.tasks,
                opts.deadline,
                stuck.join("\n"),
                sidecar.log().lines().rev().take(30).collect::<Vec<_>>().join("\n")
            );
        }
        turn += 1;
        if opts.real_nodes {
            // Real containers take seconds: no need to list pods in a spin.
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        // Finish (or disrupt) what runs.
        let running: Vec<String> = api
            .list(&ListParams::default())
            .await
            .map(|l| {
                l.items
                    .into_iter()
                    .filter(|p| {
                        p.metadata.deletion_timestamp.is_none()
                            && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                    })
                    .map(|p| p.name_any())
                    .collect()
            })
            .unwrap_or_default();
        for (i, pod) in running.iter().enumerate() {
            let r = if opts.disrupt_every > 0 && (turn + i).is_multiple_of(opts.disrupt_every) {
                disrupted.insert(task_of(pod).to_string());
                if (turn / opts.disrupt_every).is_multiple_of(2) {
                    report.pods_deleted += 1;
                    pods::delete_gracefully(&api, pod, None).await
                } else {
                    report.pods_evicted += 1;
                    pods::evict(&bed.client, ns, pod, None, false)
                        .await
                        .map(|_| ())
                }
            } else if let Some(kubelet) = &kubelet {
                kubelet.end_pod(ns, pod, Terminal::Succeeded).await
            } else {
                // A real container ends by itself.
                Ok(())
            };
            // A pod gone meanwhile, an API server down: the next turn sees.
            let _ = r;
        }
        let done = report.results_acknowledged;
        if report.sidecar_kills < opts.sidecar_kills
            && due(done, report.sidecar_kills, opts.sidecar_kills, 0.0)
        {
            report.sidecar_kills += 1;
            sidecar.kill();
            sidecar.restart().await?;
        }
        if report.apiserver_restarts < opts.apiserver_restarts
            && due(
                done,
                report.apiserver_restarts,
                opts.apiserver_restarts,
                0.5,
            )
        {
            report.apiserver_restarts += 1;
            bed.restart_apiserver(|| async {
                tokio::time::sleep(Duration::from_secs(3)).await;
                Ok(())
            })
            .await?;
        }
        // Read and acknowledge, as a client does.
        let path = match epoch.is_empty() {
            true => "/v1/events?after=0&wait=1&limit=1000".to_string(),
            false => format!("/v1/events?after={after}&epoch={epoch}&wait=1&limit=1000"),
        };
        let batch = match sidecar.request("GET", &path, None).await {
            Ok((200, b)) => b,
            Ok((409, _)) | Ok((503, _)) | Err(_) => {
                // Restarted (epoch changed), fenced or down: read from the
                // start once it answers.
                tokio::time::sleep(Duration::from_millis(300)).await;
                after = 0;
                epoch.clear();
                continue;
            }
            Ok((code, b)) => bail!("GET {path}: {code} {b}"),
        };
        let e = batch["epoch"].as_str().unwrap_or_default().to_string();
        if put_epoch.as_deref() != Some(e.as_str()) {
            if put_epoch.is_some() {
                // Another process: it learns of the tasks again (a PUT is
                // idempotent; one it took up from its pods gets its template).
                put_all(&sidecar, &mine).await?;
            }
            put_epoch = Some(e.clone());
        }
        if !epoch.is_empty() && e != epoch {
            after = 0;
            epoch.clear();
            continue;
        }
        epoch = e;
        // Take no more results this turn than bring the next pending chaos
        // due: a batch holding every remaining result would otherwise end
        // the run before that chaos happened. The rest is read again.
        let mut room = usize::MAX;
        if report.sidecar_kills < opts.sidecar_kills {
            room = room.min(at(report.sidecar_kills, opts.sidecar_kills, 0.0));
        }
        if report.apiserver_restarts < opts.apiserver_restarts {
            room = room.min(at(report.apiserver_restarts, opts.apiserver_restarts, 0.5));
        }
        let room = room.saturating_sub(report.results_acknowledged);
        let mut results = Vec::new();
        for ev in batch["events"].as_array().cloned().unwrap_or_default() {
            if ev["type"] == "result" && results.len() >= room {
                break;
            }
            after = ev["seq"].as_u64().unwrap_or(after);
            if ev["type"] == "result" {
                let task = ev["task"].as_str().unwrap_or_default().to_string();
                if let Some(m) = mine.get_mut(&task) {
                    m.results += 1;
                    if let Some(pod) = ev["outcome"]["pod"].as_str() {
                        m.result_pods.insert(pod.to_string());
                    }
                    report.results_delivered += 1;
                    results.push((task, ev["seq"].clone()));
                }
            }
        }
        if results.is_empty() {
            continue;
        }
        let seqs: Vec<serde_json::Value> = results.iter().map(|(_, s)| s.clone()).collect();
        let sent_us = now_us();
        let ack = serde_json::json!({"epoch": epoch, "seqs": seqs});
        for (task, _) in &results {
            if let Some(m) = mine.get_mut(task) {
                m.first_ack_sent_us.get_or_insert(sent_us);
            }
        }
        if let Ok((200, _)) = sidecar.request("POST", "/v1/events/ack", Some(&ack)).await {
            for (task, _) in results {
                if let Some(m) = mine.get_mut(&task) {
                    if m.acked_at_us.is_none() {
                        m.acked_at_us = Some(sent_us);
                        report.results_acknowledged += 1;
                    }
                }
            }
        }
    }
    // Settle, then count from the audit log.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let events = bed.audit_log()?.events()?;
    let mut created: BTreeMap<String, usize> = BTreeMap::new();
    for e in events.iter().filter(|e| {
        e.is("create", "pods", ns)
            && e.user.username == "alice"
            && e.response_status.as_ref().is_some_and(|s| s.code == 201)
    }) {
        *created.entry(e.name().to_string()).or_default() += 1;
    }
    report.pods_created = created.values().sum();
    report.create_conflicts = events
        .iter()
        .filter(|e| {
            e.is("create", "pods", ns)
                && e.user.username == "alice"
                && e.response_status.as_ref().is_some_and(|s| s.code == 409)
        })
        .count();
    report.names_created_twice = created
        .iter()
        .filter(|(_, n)| **n > 1)
        .map(|(p, _)| p.clone())
        .collect();
    report.names_created_twice_undisrupted = report
        .names_created_twice
        .iter()
        .filter(|n| !disrupted.contains(task_of(n)))
        .cloned()
        .collect();
    // Done-marks are alice's patches of the pods results named (no
    // adoption runs here).
    for e in events.iter().filter(|e| {
        e.verb == "patch"
            && e.user.username == "alice"
            && e.object_ref.as_ref().is_some_and(|o| {
                o.resource == "pods" && o.namespace == ns && o.subresource.is_empty()
            })
            && e.response_status.as_ref().is_some_and(|s| s.code == 200)
            && mine
                .get(task_of(e.name()))
                .is_some_and(|m| m.result_pods.contains(e.name()))
    }) {
        let acked = mine
            .get(task_of(e.name()))
            .and_then(|m| m.first_ack_sent_us);
        let at = e.received_us().context("an audit event without a time")?;
        if acked.is_none_or(|a| at < a) {
            report.done_before_ack.push(e.name().to_string());
        }
    }
    report.left_running = api
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|p| {
            p.metadata.deletion_timestamp.is_none()
                && matches!(
                    p.status.as_ref().and_then(|s| s.phase.as_deref()),
                    Some("Pending" | "Running") | None
                )
        })
        .map(|p| p.name_any())
        .collect();
    report.seconds = started.elapsed().as_secs_f64();
    drop(sidecar);
    Ok(report)
}
