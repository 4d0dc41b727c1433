//! The client-go executor (`tests/executor`, a model of Flyte's v2 pod
//! plugin on the client library executors use): built into the cache, run
//! against a bed, its report read back.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::TestBed;

/// What the executor printed when it stopped.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct ExecutorReport {
    /// Requests sent, by "VERB resource code" (each retry of a 429 is one).
    pub requests: BTreeMap<String, u64>,
    /// Create calls (client-go's own retries of a 429 inside a call are in `requests`).
    pub pod_creates: u64,
    pub pod_deletes: u64,
    pub system_failures: u64,
    /// The most system failures in a row (what Flyte bounds: more than 3
    /// fail the task); an AlreadyExists or a made pod resets the count.
    pub max_system_failures_seen: u64,
    /// Every system failure counted (each a status write and an event).
    pub system_failures_recorded: u64,
    /// Create requests of the disrupted tasks from the disruption to the
    /// Create that made each successor (that one included); a Create sent
    /// after it, the informer not yet showing the new pod, is not counted.
    pub relaunch_pod_creates: u64,
    /// Creates that made a pod.
    pub attempts: u64,
    /// The longest single Create call, client-go's waits included.
    pub longest_create_call_ms: u64,
    /// From the first sight of the disrupted pod to its successor Running.
    pub running_again_after_ms: Option<u64>,
    pub create_errors: BTreeMap<String, u64>,
    pub failed_permanently: bool,
    #[serde(default)]
    pub failed_permanently_why: String,
    /// Reconciles it ran at once.
    pub workers: u64,
    /// Each disrupted task (`task-N`).
    pub tasks: Vec<TaskFigures>,
    /// Each task launched 3 s after the first disruption was seen (`new-N`).
    pub unrelated: Vec<TaskFigures>,
}

/// One task's figures.
#[derive(Clone, Debug, Deserialize, Serialize)]
pub struct TaskFigures {
    pub name: String,
    pub pod_creates: u64,
    pub attempts: u64,
    pub max_system_failures_seen: u64,
    pub longest_create_call_ms: u64,
    pub create_errors: BTreeMap<String, u64>,
    pub failed_permanently: bool,
    /// Disrupted tasks: from the first sight of the deletion to the new pod Running.
    #[serde(default)]
    pub running_again_after_ms: Option<u64>,
    /// Disrupted tasks: see [`ExecutorReport::relaunch_pod_creates`].
    #[serde(default)]
    pub relaunch_pod_creates: u64,
    /// Disrupted tasks: from the old pod gone (the executor's informer saw
    /// it deleted: its name free) to the Create that made its successor
    /// returning. Negative when the Create (sent as soon as the name was
    /// free at the API server) returned before the informer delivered the
    /// deletion: a race the bare loop wins by polling.
    #[serde(default)]
    pub relaunched_after_gone_ms: Option<i64>,
    /// Unrelated tasks: from launch to their Create returning 201.
    #[serde(default)]
    pub created_after_ms: Option<u64>,
    /// Unrelated tasks: from launch to their pod Running.
    #[serde(default)]
    pub running_after_ms: Option<u64>,
}

/// How many tasks the executor runs, and with what.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Load {
    /// Tasks `task-0…` whose pods the test disrupts.
    pub tasks: u32,
    /// Tasks `new-0…` launched 3 s after the first disruption is seen, when
    /// the colliding Creates are waiting.
    pub unrelated: u32,
    /// Reconciles at once (Flyte's executor: 512).
    pub workers: u32,
    /// Disrupt by a real kube-scheduler preemption (low-priority task pods
    /// filling the node, one high-priority pod that needs all of it) instead
    /// of graceful deletes.
    pub preempt: bool,
    /// Seconds a task takes to stop after SIGTERM (`None`: its whole grace).
    pub stop_after: Option<u32>,
}

impl Default for Load {
    fn default() -> Self {
        Self {
            tasks: 1,
            unrelated: 0,
            workers: 512,
            preempt: false,
            stop_after: None,
        }
    }
}

impl ExecutorReport {
    /// Requests whose key starts with `prefix` (e.g. "POST pods", "POST pods 409").
    pub fn sent(&self, prefix: &str) -> u64 {
        self.requests
            .iter()
            .filter(|(k, _)| k.starts_with(prefix))
            .map(|(_, v)| v)
            .sum()
    }
}

/// The executor binary (built from `tests/executor` on first use).
pub fn binary() -> Result<PathBuf> {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../executor");
    crate::go_build::cached(&src, "executor", "graceguard-test-executor")
}

/// A running executor for its tasks in `ns`.
pub struct Executor {
    child: tokio::process::Child,
    running: tokio::sync::oneshot::Receiver<()>,
    stderr_tail: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Executor {
    /// Starts it; it creates its tasks' pods (in `image`, `grace` seconds of
    /// termination grace, which a task also takes to stop) and runs until
    /// every task has run again after a disruption, or `run_for`;
    /// `extra_args` are more of its flags (`--cpu-request`, `--priority-class`).
    pub fn start(
        bed: &TestBed,
        ns: &str,
        load: Load,
        image: &str,
        grace: u32,
        run_for: Duration,
        extra_args: &[String],
    ) -> Result<Self> {
        let mut child = tokio::process::Command::new(binary()?)
            .args(extra_args)
            .arg(format!("--kubeconfig={}", bed.kubeconfig.display()))
            .arg(format!("--namespace={ns}"))
            .arg(format!("--tasks={}", load.tasks))
            .arg(format!("--unrelated={}", load.unrelated))
            .arg(format!("--workers={}", load.workers))
            .arg(format!("--image={image}"))
            .arg(format!("--grace={grace}"))
            .arg(format!("--run-for={}s", run_for.as_secs()))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .context("starting the client-go executor")?;
        let stderr = child.stderr.take().context("the executor's stderr")?;
        let (tx, running) = tokio::sync::oneshot::channel();
        let stderr_tail = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let tail = stderr_tail.clone();
        tokio::spawn(async move {
            let mut tx = Some(tx);
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(l)) = lines.next_line().await {
                if l.contains("task pod Running") {
                    if let Some(tx) = tx.take() {
                        let _ = tx.send(());
                    }
                }
                if let Ok(mut t) = tail.lock() {
                    t.push(l);
                }
            }
        });
        Ok(Self {
            child,
            running,
            stderr_tail,
        })
    }

    /// Waits until its first pod is Running.
    pub async fn wait_running(&mut self, limit: Duration) -> Result<()> {
        match tokio::time::timeout(limit, &mut self.running).await {
            Ok(Ok(())) => Ok(()),
            _ => bail!(
                "the executor's task pod was not Running within {} s; its stderr: {:?}",
                limit.as_secs(),
                self.stderr_tail
                    .lock()
                    .map(|t| t.clone())
                    .unwrap_or_default()
            ),
        }
    }

    /// Waits for it to stop and reads its report.
    pub async fn finish(mut self) -> Result<ExecutorReport> {
        let mut stdout = self.child.stdout.take().context("the executor's stdout")?;
        let mut out = String::new();
        tokio::io::AsyncReadExt::read_to_string(&mut stdout, &mut out).await?;
        let status = self.child.wait().await?;
        let report = out.lines().last().unwrap_or_default();
        serde_json::from_str(report).with_context(|| {
            format!(
                "the executor ({status}) printed no report ({out:?}); its stderr: {:?}",
                self.stderr_tail
                    .lock()
                    .map(|t| t.clone())
                    .unwrap_or_default()
            )
        })
    }
}
