//! What real containers did, as their kubelet reported it: the last
//! terminated state of each pod's container, kept after the pod is gone
//! (the kubelet's final status update comes just before its delete).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client, ResourceExt};

/// How a container ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ended {
    pub exit_code: i32,
    /// `Completed`, `Error`, `OOMKilled`, ...
    pub reason: String,
    pub phase: String,
}

/// The first container's terminated state of a pod, if it has one.
pub fn ended(pod: &Pod) -> Option<Ended> {
    let status = pod.status.as_ref()?;
    let t = status
        .container_statuses
        .as_ref()?
        .first()?
        .state
        .as_ref()?
        .terminated
        .as_ref()?;
    Some(Ended {
        exit_code: t.exit_code,
        reason: t.reason.clone().unwrap_or_default(),
        phase: status.phase.clone().unwrap_or_default(),
    })
}

/// Watches a namespace's pods and keeps each one's [`Ended`].
pub struct EndWatch {
    seen: Arc<Mutex<HashMap<String, Ended>>>,
    task: tokio::task::JoinHandle<()>,
}

impl EndWatch {
    pub fn start(client: Client, ns: &str) -> Self {
        let seen: Arc<Mutex<HashMap<String, Ended>>> = Arc::default();
        let s = Arc::clone(&seen);
        let api: Api<Pod> = Api::namespaced(client, ns);
        let task = tokio::spawn(async move {
            let mut events = watcher(api, watcher::Config::default())
                .default_backoff()
                .applied_objects()
                .boxed();
            while let Some(ev) = events.next().await {
                let Ok(pod) = ev else { continue };
                if let Some(e) = ended(&pod) {
                    if let Ok(mut m) = s.lock() {
                        m.insert(pod.name_any(), e);
                    }
                }
            }
        });
        Self { seen, task }
    }

    /// How pod `name`'s container ended, if the watch saw it.
    pub fn get(&self, name: &str) -> Option<Ended> {
        self.seen.lock().ok()?.get(name).cloned()
    }
}

impl Drop for EndWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}
