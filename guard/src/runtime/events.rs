//! The executor's event log: numbered, long-polled, acknowledged.
//!
//! A result is delivered at least once and marked done only after the caller
//! acknowledged it: events stay in the log (and are served again after a
//! reconnect) until acknowledged. Transitions are informational: the oldest
//! of them give way when the log is full, and any older than
//! [`TRANSITION_MAX_AGE`] go. Results stay until acknowledged, or until their
//! task is forgotten ([`EventLog::forget`]); their pods keep them too (the
//! result finalizer), so a restarted process delivers them again.

use std::collections::{HashSet, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use serde::Serialize;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::core::phase::Transition;
use crate::core::reconcile::Outcome;
use crate::runtime::adoption::AdoptedPod;

/// Unacknowledged events kept at most (results are kept beyond it).
pub const CAPACITY: usize = 100_000;

/// Unacknowledged transitions older than this are dropped.
pub const TRANSITION_MAX_AGE: Duration = Duration::from_secs(3600);

/// Every how many pushes old transitions are looked for.
const AGE_SWEEP_EVERY: u64 = 1024;

/// What happened.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum EventBody {
    /// A task's phase changed.
    Transition {
        namespace: String,
        #[serde(flatten)]
        transition: Transition,
    },
    /// A task ended; acknowledging it marks its pod done.
    Result {
        namespace: String,
        task: String,
        outcome: Outcome,
    },
    /// A completed pod of a dead instance, claimed for this one;
    /// acknowledging it marks the pod done (conditionally on its
    /// `resource_version`).
    Adopted {
        #[serde(flatten)]
        pod: AdoptedPod,
    },
    /// A pod of a dead instance was deleted before it was delivered; if its
    /// last `phase` is not `Succeeded` or `Failed`, its task has no result
    /// and must be run again by the caller.
    Gone {
        #[serde(flatten)]
        pod: AdoptedPod,
    },
}

impl EventBody {
    /// Whether acknowledging it writes a done-mark (and so it is never dropped).
    pub fn needs_ack(&self) -> bool {
        !matches!(self, EventBody::Transition { .. })
    }
}

/// One numbered event.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Logged {
    pub seq: u64,
    #[serde(flatten)]
    pub body: EventBody,
}

#[derive(Default)]
struct Inner {
    next: u64,
    /// Each with when it was logged.
    events: VecDeque<(Logged, Instant)>,
    dropped: u64,
}

/// See the module docs.
pub struct EventLog {
    inner: Mutex<Inner>,
    notify: Notify,
    epoch: String,
}

impl Default for EventLog {
    fn default() -> Self {
        Self {
            inner: Mutex::default(),
            notify: Notify::new(),
            epoch: format!("{:016x}", fastrand::u64(..)),
        }
    }
}

impl EventLog {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Appends `body`; returns its sequence number (from 1).
    pub fn push(&self, body: EventBody) -> u64 {
        let seq = {
            let mut i = self.lock();
            i.next += 1;
            let seq = i.next;
            let now = Instant::now();
            i.events.push_back((Logged { seq, body }, now));
            if i.events.len() > CAPACITY {
                if let Some(pos) = i.events.iter().position(|(e, _)| !e.body.needs_ack()) {
                    i.events.remove(pos);
                    i.dropped += 1;
                }
            }
            if seq.is_multiple_of(AGE_SWEEP_EVERY) {
                let before = i.events.len();
                i.events
                    .retain(|(e, at)| e.body.needs_ack() || now - *at < TRANSITION_MAX_AGE);
                i.dropped += (before - i.events.len()) as u64;
            }
            seq
        };
        self.notify.notify_waiters();
        seq
    }

    /// Events after `after`, at most `limit`, waiting up to `wait` for one.
    pub async fn after(&self, after: u64, limit: usize, wait: Duration) -> Vec<Logged> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            // Registered before reading, so a push in between is not missed.
            notified.as_mut().enable();
            let found: Vec<Logged> = self
                .lock()
                .events
                .iter()
                .map(|(e, _)| e)
                .filter(|e| e.seq > after)
                .take(limit)
                .cloned()
                .collect();
            if !found.is_empty() {
                return found;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                return Vec::new();
            }
        }
    }

    /// Removes every event up to `seq`; returns those needing a done-mark.
    pub fn ack(&self, seq: u64) -> Vec<Logged> {
        let mut i = self.lock();
        let mut acked = Vec::new();
        while i.events.front().is_some_and(|(e, _)| e.seq <= seq) {
            if let Some((e, _)) = i.events.pop_front() {
                if e.body.needs_ack() {
                    acked.push(e);
                }
            }
        }
        acked
    }

    /// Removes exactly the events `seqs` (for a caller sharing the log with
    /// others); returns those needing a done-mark.
    pub fn ack_only(&self, seqs: &HashSet<u64>) -> Vec<Logged> {
        let mut i = self.lock();
        let mut acked = Vec::new();
        i.events.retain(|(e, _)| {
            if !seqs.contains(&e.seq) {
                return true;
            }
            if e.body.needs_ack() {
                acked.push(e.clone());
            }
            false
        });
        acked
    }

    /// Drops every event about task `task` in `namespace` (a task
    /// forgotten: nobody acknowledges its result now).
    pub fn forget(&self, namespace: &str, task: &str) {
        self.lock().events.retain(|(e, _)| match &e.body {
            EventBody::Result {
                namespace: n,
                task: t,
                ..
            } => !(n == namespace && t == task),
            EventBody::Transition {
                namespace: n,
                transition,
            } => !(n == namespace && transition.task == task),
            _ => true,
        });
    }

    /// Changes whenever the log starts anew (a restarted sidecar): sequence
    /// numbers are only comparable within one epoch.
    pub fn epoch(&self) -> &str {
        &self.epoch
    }

    /// The last sequence number handed out.
    pub fn last_seq(&self) -> u64 {
        self.lock().next
    }

    /// Unacknowledged events held, and transitions dropped for room.
    pub fn counts(&self) -> (usize, u64) {
        let i = self.lock();
        (i.events.len(), i.dropped)
    }

    /// Events that wait for an acknowledgement (results, adoptions, gone
    /// pods), and how long the oldest of them has waited: a result nobody
    /// acknowledges keeps its pod (the result finalizer) and its done-mark
    /// unwritten.
    pub fn awaiting_ack(&self) -> (usize, Duration) {
        let i = self.lock();
        let mut waiting = i.events.iter().filter(|(e, _)| e.body.needs_ack());
        // The log is in push order: the first one waiting is the oldest.
        let oldest = waiting.next().map(|(_, at)| at.elapsed());
        match oldest {
            Some(age) => (1 + waiting.count(), age),
            None => (0, Duration::ZERO),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn transition(task: &str) -> EventBody {
        EventBody::Transition {
            namespace: "ns".into(),
            transition: Transition {
                task: task.into(),
                attempt: 0,
                pod: format!("{task}-0"),
                phase: "Queued",
                reason: None,
                failure_kind: None,
            },
        }
    }

    #[tokio::test]
    async fn events_are_served_after_a_sequence_until_acknowledged() {
        let log = EventLog::default();
        assert_eq!(log.push(transition("a")), 1);
        assert_eq!(log.push(transition("b")), 2);
        let got = log.after(0, 10, Duration::ZERO).await;
        assert_eq!(got.iter().map(|e| e.seq).collect::<Vec<_>>(), [1, 2]);
        // Not acknowledged: served again.
        assert_eq!(log.after(0, 10, Duration::ZERO).await.len(), 2);
        assert_eq!(log.after(1, 10, Duration::ZERO).await.len(), 1);
        assert!(log.ack(1).is_empty(), "a transition needs no done-mark");
        log.push(transition("c"));
        assert!(log.ack_only(&HashSet::from([3])).is_empty());
        assert_eq!(
            log.after(0, 10, Duration::ZERO)
                .await
                .iter()
                .map(|e| e.seq)
                .collect::<Vec<_>>(),
            [2],
            "only event 3 was acknowledged"
        );
        assert_eq!(log.epoch().len(), 16);
        assert_ne!(log.epoch(), EventLog::default().epoch());
        assert_eq!(log.after(0, 10, Duration::ZERO).await.len(), 1);
        let json =
            serde_json::to_value(&log.after(0, 1, Duration::ZERO).await[0]).expect("serializes");
        assert_eq!(json["type"], "transition");
        assert_eq!(json["seq"], 2);
        assert_eq!(json["task"], "b");
    }

    #[tokio::test]
    async fn a_forgotten_tasks_events_go_and_others_stay() {
        let log = EventLog::default();
        log.push(transition("a"));
        log.push(transition("b"));
        log.push(EventBody::Result {
            namespace: "ns".into(),
            task: "a".into(),
            outcome: Outcome {
                succeeded: true,
                failure_kind: None,
                reason: None,
                attempts: 1,
                user_failures: 0,
                system_failures: 0,
                pod: "a-0".into(),
                uid: None,
            },
        });
        log.forget("ns", "a");
        let left = log.after(0, 10, Duration::ZERO).await;
        assert_eq!(left.iter().map(|e| e.seq).collect::<Vec<_>>(), [2]);
        assert_eq!(log.counts(), (1, 0));
    }

    #[tokio::test]
    async fn a_long_poll_wakes_on_a_push() {
        let log = std::sync::Arc::new(EventLog::default());
        let l = log.clone();
        let waiter = tokio::spawn(async move { l.after(0, 10, Duration::from_secs(30)).await });
        tokio::task::yield_now().await;
        log.push(transition("a"));
        let got = waiter.await.expect("joins");
        assert_eq!(got.len(), 1);
        assert!(log.after(1, 10, Duration::from_millis(10)).await.is_empty());
    }
}
