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
    pub max_system_failures_seen: u64,
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
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("executor");
    crate::go_build::cached(&src, "executor", "graceguard-test-executor")
}

/// A running executor for task pod `name` in `ns`.
pub struct Executor {
    child: tokio::process::Child,
    running: tokio::sync::oneshot::Receiver<()>,
    stderr_tail: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Executor {
    /// Starts it; it creates the task's pod (in `image`, `grace` seconds of
    /// termination grace, which the task also takes to stop) and runs until
    /// the pod has run again after a disruption, or `run_for`.
    pub fn start(
        bed: &TestBed,
        ns: &str,
        name: &str,
        image: &str,
        grace: u32,
        run_for: Duration,
    ) -> Result<Self> {
        let mut child = tokio::process::Command::new(binary()?)
            .arg(format!("--kubeconfig={}", bed.kubeconfig.display()))
            .arg(format!("--namespace={ns}"))
            .arg(format!("--name={name}"))
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
