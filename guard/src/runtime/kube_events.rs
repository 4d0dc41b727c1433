//! Kubernetes Events on task pods: each transition, and the warnings the
//! reconciler asks for. Best effort, in the background: an Event that cannot
//! be written never holds up a task.

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use kube::Client;

use crate::core::phase::Transition;

/// Publishes Events as `graceguard`, reporting instance `instance`.
///
/// Each Event goes through a recorder of its own: kube's `Recorder` keeps
/// every Event it published for six minutes to aggregate repeats into a
/// series, which for a sidecar running thousands of tasks is tens of
/// megabytes of Events of pods long gone (`scripts/bench`, `sidecar_rss`),
/// while graceguard's transitions never repeat on one pod.
#[derive(Clone)]
pub struct Publisher {
    /// `None`: publishing is off.
    client: Option<Client>,
    reporter: Reporter,
}

impl Publisher {
    pub fn new(client: Client, instance: &str, enabled: bool) -> Self {
        let reporter = Reporter {
            controller: "graceguard".into(),
            instance: Some(instance.to_string()),
        };
        Self {
            client: enabled.then_some(client),
            reporter,
        }
    }

    /// A publisher that publishes nothing, with no API server (the loop's
    /// tests).
    #[cfg(test)]
    pub(crate) fn off() -> Self {
        Self {
            client: None,
            reporter: Reporter {
                controller: "graceguard".into(),
                instance: None,
            },
        }
    }

    /// Publishes `t` as an Event on its pod.
    pub fn transition(&self, t: &Transition, namespace: &str, uid: Option<&str>) {
        let note = match &t.reason {
            Some(r) => format!("task {} attempt {}: {} ({r})", t.task, t.attempt, t.phase),
            None => format!("task {} attempt {}: {}", t.task, t.attempt, t.phase),
        };
        let kind = match t.failure_kind {
            Some(_) => EventType::Warning,
            None => EventType::Normal,
        };
        self.publish(namespace, &t.pod, uid, kind, t.phase.to_string(), note);
    }

    /// Publishes a Warning on pod `pod`.
    pub fn warning(&self, namespace: &str, pod: &str, reason: String, note: String) {
        self.publish(namespace, pod, None, EventType::Warning, reason, note);
    }

    fn publish(
        &self,
        namespace: &str,
        pod: &str,
        uid: Option<&str>,
        type_: EventType,
        reason: String,
        note: String,
    ) {
        let Some(client) = &self.client else {
            return;
        };
        let reference = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Pod".into()),
            name: Some(pod.to_string()),
            namespace: Some(namespace.to_string()),
            uid: uid.map(str::to_string),
            ..Default::default()
        };
        let ev = KubeEvent {
            type_,
            reason,
            note: Some(note),
            action: "Launch".into(),
            secondary: None,
        };
        let recorder = Recorder::new(client.clone(), self.reporter.clone());
        tokio::spawn(async move {
            if let Err(e) = recorder.publish(&ev, &reference).await {
                tracing::debug!(error = %e, "publishing an event failed");
            }
        });
    }
}
