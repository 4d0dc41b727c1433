//! Running a task through the guard library in the background, with its
//! transitions collected, for the end-to-end tests and the demo.

use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use graceguard::{Guard, GuardConfig, Outcome, TaskSpec, Transition};
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// A task running in the background.
pub struct RunningTask {
    pub handle: JoinHandle<Result<Outcome, graceguard::GuardError>>,
    rx: mpsc::UnboundedReceiver<Transition>,
    /// Every transition received so far, in order.
    pub seen: Vec<Transition>,
}

/// The spec the tests use: instance `exec-1`, 2 retries, 3 system failures.
pub fn spec(task: &str, ns: &str) -> TaskSpec {
    TaskSpec {
        retries: 2,
        max_system_failures: 3,
        ..TaskSpec::new(task, ns, "exec-1")
    }
}

impl RunningTask {
    /// Starts `spec` from `template` with a guard using `client`.
    pub fn start(client: Client, spec: TaskSpec, template: Pod) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let handle = tokio::spawn(async move {
            let guard = Guard::new(client, GuardConfig::new(&spec.instance));
            guard
                .run(spec, template, |t| {
                    let _ = tx.send(t.clone());
                })
                .await
        });
        Self {
            handle,
            rx,
            seen: Vec::new(),
        }
    }

    /// Waits (up to `within`) for a transition matching `pred`; returns it.
    pub async fn wait_for(
        &mut self,
        within: Duration,
        pred: impl Fn(&Transition) -> bool,
    ) -> Result<Transition> {
        if let Some(t) = self.seen.iter().find(|t| pred(t)) {
            return Ok(t.clone());
        }
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, self.rx.recv()).await {
                Ok(Some(t)) => {
                    self.seen.push(t.clone());
                    if pred(&t) {
                        return Ok(t);
                    }
                }
                Ok(None) => bail!(
                    "the task ended without the expected transition; saw {:?}",
                    self.seen
                ),
                Err(_) => bail!(
                    "no expected transition within {within:?}; saw {:?}",
                    self.seen
                ),
            }
        }
    }

    /// Waits for the task to end; returns its outcome (and drains transitions).
    pub async fn finish(mut self, within: Duration) -> Result<(Outcome, Vec<Transition>)> {
        let outcome = tokio::time::timeout(within, &mut self.handle).await??;
        while let Ok(t) = self.rx.try_recv() {
            self.seen.push(t);
        }
        Ok((outcome?, self.seen))
    }
}

/// `phase[/reason]@attempt` for each transition, for compact assertions.
pub fn summary(ts: &[Transition]) -> Vec<String> {
    ts.iter()
        .map(|t| match &t.reason {
            Some(r) => format!(
                "{}/{}@{}",
                t.phase,
                r.split(':').next().unwrap_or(""),
                t.attempt
            ),
            None => format!("{}@{}", t.phase, t.attempt),
        })
        .collect()
}
