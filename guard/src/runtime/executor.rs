//! The executor: every task of one instance, reconciled from one shared pod
//! watch.
//!
//! One label-selected watch (`managed-by=graceguard`, this instance) feeds a
//! per-task index of pods ([`crate::runtime::pod_index`]); each change, each answer to
//! an API call and each timer runs [`crate::core::reconcile`] for the task
//! concerned, and the loop ([`crate::runtime::executor_loop`]) carries out what it
//! decided. No Create is sent before the watch's first list is in, so a
//! restarted instance first sees the pods it made and resumes their tasks
//! instead of creating them again. The loop owns all state; callers talk to
//! it through [`Executor`]'s methods, which send it a [`Command`].

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use kube::Client;
use tokio::sync::{mpsc, oneshot};

use crate::core::error::TaskError;
use crate::core::phase::Transition;
use crate::core::reconcile::{Outcome, TaskSpec};
use crate::core::task::{Submitted, TaskKey, TaskStatus};
use crate::core::template::Template;
use crate::runtime::done_marks::{mark_done, MarkFailed, Marked};
use crate::runtime::events::{EventBody, EventLog, Logged};
pub use crate::runtime::executor_config::ExecutorConfig;
use crate::runtime::executor_loop::Command;
pub use crate::runtime::executor_loop::Stats;
use crate::runtime::kube_events::Publisher;
use crate::runtime::lease::Fence;
use crate::runtime::pod_api::KubePods;

/// A running executor; cheap to clone. Dropping every clone stops it.
#[derive(Clone)]
pub struct Executor {
    tx: mpsc::UnboundedSender<Command>,
    log: Arc<EventLog>,
    stats: Arc<Stats>,
    client: Client,
    instance: String,
    fence: Fence,
}

impl Executor {
    /// Starts the watch and the loop (on the current tokio runtime).
    pub fn start(client: Client, config: ExecutorConfig) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let log = Arc::new(EventLog::default());
        let stats = Arc::new(Stats::default());
        let instance = config.instance.clone();
        let fence = config.fence.clone();
        let pods = KubePods::new(client.clone(), config.namespace.clone());
        let events = Publisher::new(client.clone(), &instance, config.publish_events);
        crate::runtime::executor_loop::spawn(pods, events, config, log.clone(), stats.clone(), rx);
        Self {
            tx,
            log,
            stats,
            client,
            instance,
            fence,
        }
    }

    async fn ask<T>(&self, make: impl FnOnce(oneshot::Sender<T>) -> Command) -> Option<T> {
        let (reply, rx) = oneshot::channel();
        self.tx.send(make(reply)).ok()?;
        rx.await.ok()
    }

    /// Submits a task (idempotent: the same task with the same template
    /// returns its status; another template is a [`TaskError::TemplateConflict`]).
    pub async fn submit(
        &self,
        spec: TaskSpec,
        template: Template,
    ) -> Result<TaskStatus, TaskError> {
        self.put(spec, template, false).await.map(|s| s.status)
    }

    /// [`Executor::submit`], saying whether it created the task; with
    /// `replace`, an ended task submitted with another template or settings
    /// is forgotten and run anew under the name after its last pod's.
    pub async fn put(
        &self,
        spec: TaskSpec,
        template: Template,
        replace: bool,
    ) -> Result<Submitted, TaskError> {
        let template = Box::new(template);
        self.ask(|reply| Command::Submit {
            spec,
            template,
            replace,
            reply,
        })
        .await
        .unwrap_or(Err(TaskError::Stopped))
    }

    /// Up to `limit` tasks (of `namespace`, if given) after `after`, in
    /// (namespace, task) order, and whether more follow.
    pub async fn list(
        &self,
        namespace: Option<String>,
        after: Option<(String, String)>,
        limit: usize,
    ) -> Result<(Vec<TaskStatus>, bool), TaskError> {
        let after = after.map(|(ns, task)| TaskKey::new(&ns, &task));
        self.ask(|reply| Command::List {
            namespace,
            after,
            limit,
            reply,
        })
        .await
        .ok_or(TaskError::Stopped)
    }

    pub async fn status(&self, key: &TaskKey) -> Option<TaskStatus> {
        let key = key.clone();
        self.ask(|reply| Command::Status { key, reply })
            .await
            .flatten()
    }

    /// Starts the next attempt of a task that has ended (the executor's own
    /// retry decision).
    pub async fn retry(&self, key: &TaskKey) -> Result<TaskStatus, TaskError> {
        let key = key.clone();
        self.ask(|reply| Command::Retry { key, reply })
            .await
            .unwrap_or(Err(TaskError::Stopped))
    }

    /// Aborts a task: its current pod is deleted (uid precondition); aborted
    /// before the first pod list is in, it is never launched.
    pub async fn abort(&self, key: &TaskKey) -> Result<TaskStatus, TaskError> {
        let key = key.clone();
        self.ask(|reply| Command::Abort { key, reply })
            .await
            .unwrap_or(Err(TaskError::Stopped))
    }

    /// Forgets a task that has ended and has no pod left running: its status
    /// is no longer served and its memory is freed ([`TaskError::NotEnded`],
    /// [`TaskError::CleanupPending`] otherwise).
    pub async fn forget(&self, key: &TaskKey) -> Result<(), TaskError> {
        let key = key.clone();
        self.ask(|reply| Command::Forget { key, reply })
            .await
            .unwrap_or(Err(TaskError::Stopped))
    }

    /// How many tasks are in each phase (every phase, zeros included).
    pub async fn phase_counts(&self) -> Result<Vec<(&'static str, usize)>, TaskError> {
        self.ask(|reply| Command::PhaseCounts { reply })
            .await
            .ok_or(TaskError::Stopped)
    }

    /// Waits (up to `within`) until no result finalizer is being let go
    /// of: a process that stops right after a result waits for its last
    /// releases.
    pub async fn settle(&self, within: Duration) {
        let asked = self.ask(|reply| Command::Settle { reply });
        let _ = tokio::time::timeout(within, asked).await;
    }

    /// The event log (transitions, results, adoptions).
    pub fn log(&self) -> &Arc<EventLog> {
        &self.log
    }

    pub fn stats(&self) -> &Arc<Stats> {
        &self.stats
    }

    pub fn instance(&self) -> &str {
        &self.instance
    }

    /// Whether this process may act for its instance now (see
    /// [`ExecutorConfig::fence`]).
    pub fn fence(&self) -> &Fence {
        &self.fence
    }

    /// Acknowledges every event up to `seq`; the pods of the results among
    /// them are marked done (conditionally on the resourceVersion seen).
    pub async fn ack(&self, seq: u64) -> Vec<(u64, Marked)> {
        self.mark(self.log.ack(seq)).await
    }

    /// Acknowledges exactly the events `seqs` (callers sharing the log).
    pub async fn ack_only(&self, seqs: &[u64]) -> Vec<(u64, Marked)> {
        let seqs: HashSet<u64> = seqs.iter().copied().collect();
        self.mark(self.log.ack_only(&seqs)).await
    }

    /// Marks the acknowledged events' pods done, in a task of their own: a
    /// caller that stops waiting (a client's timeout cancels its request)
    /// does not cancel the marks of events already removed from the log.
    async fn mark(&self, acked: Vec<Logged>) -> Vec<(u64, Marked)> {
        let this = self.clone();
        let job = tokio::spawn(async move {
            let mut marks = Vec::new();
            for e in acked {
                if let Some(m) = this.mark_one(&e.body).await {
                    marks.push((e.seq, m));
                }
            }
            marks
        });
        job.await.unwrap_or_default()
    }

    async fn mark_one(&self, body: &EventBody) -> Option<Marked> {
        let (namespace, name, rv, finalizers) = match body {
            EventBody::Result {
                namespace,
                task,
                outcome,
            } => {
                let key = TaskKey::new(namespace, task);
                // Acknowledged: forgotten after the retention period.
                let _ = self.tx.send(Command::Acknowledged { key: key.clone() });
                let uid = outcome.uid.clone()?;
                let found = self
                    .ask(|reply| Command::PodVersion { key, uid, reply })
                    .await
                    .flatten();
                match found {
                    Some(v) => (namespace.clone(), v.name, v.resource_version, v.finalizers),
                    None => return Some(Marked::Gone),
                }
            }
            EventBody::Adopted { pod } => (
                pod.namespace.clone(),
                pod.name.clone(),
                pod.resource_version.clone(),
                pod.finalizers.clone(),
            ),
            _ => return None,
        };
        if !self.fence.holds() {
            return Some(Marked::Failed(MarkFailed::NotFenced {
                pod: name,
                instance: self.instance.clone(),
            }));
        }
        Some(
            mark_done(
                &self.client,
                &namespace,
                &name,
                &rv,
                &finalizers,
                &self.instance,
            )
            .await,
        )
    }

    /// Runs `adopter` in the background: what it finds goes into the event
    /// log as `adopted` and `gone` events; acknowledging an `adopted` event
    /// marks its pod done.
    pub fn adopt_with(
        &self,
        mut adopter: crate::runtime::adoption::Adopter,
    ) -> tokio::task::JoinHandle<()> {
        use crate::runtime::adoption::Found;
        let log = self.log.clone();
        let tx = self.tx.clone();
        tokio::spawn(async move {
            while !tx.is_closed() {
                let found = match adopter.sync(Duration::from_secs(5)).await {
                    Ok(f) => f,
                    Err(e) => {
                        tracing::warn!(error = %e, "adoption sync failed; retrying");
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        continue;
                    }
                };
                for f in found {
                    log.push(match f {
                        Found::Completed(pod) => EventBody::Adopted { pod },
                        Found::Gone(pod) => EventBody::Gone { pod },
                    });
                }
            }
        })
    }

    /// Waits until the task's Result event is logged; returns it (for
    /// callers that run one task and then stop, like `graceguard run`).
    pub async fn wait_result(
        &self,
        key: &TaskKey,
        mut on_transition: impl FnMut(&Transition),
    ) -> Result<Outcome, TaskError> {
        let mut after = 0;
        loop {
            if self.tx.is_closed() {
                return Err(TaskError::Stopped);
            }
            let events = self.log.after(after, 1000, Duration::from_secs(5)).await;
            for Logged { seq, body } in events {
                after = seq;
                match body {
                    EventBody::Transition {
                        namespace,
                        transition,
                    } if key.is(&namespace, &transition.task) => on_transition(&transition),
                    EventBody::Result {
                        namespace,
                        task,
                        outcome,
                    } if key.is(&namespace, &task) => {
                        self.ack_only(&[seq]).await;
                        return Ok(outcome);
                    }
                    _ => {}
                }
            }
        }
    }
}
