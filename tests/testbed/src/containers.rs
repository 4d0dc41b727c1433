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

/// A watch of a namespace's pods folding every version it sees into a `T`
/// (kept after the pods are gone); stopped when dropped.
pub struct PodRecorder<T> {
    seen: Arc<Mutex<T>>,
    task: tokio::task::JoinHandle<()>,
}

impl<T: Default + Send + 'static> PodRecorder<T> {
    pub fn start(
        client: Client,
        ns: &str,
        mut record: impl FnMut(&mut T, &Pod) + Send + 'static,
    ) -> Self {
        let seen: Arc<Mutex<T>> = Arc::default();
        let s = Arc::clone(&seen);
        let api: Api<Pod> = Api::namespaced(client, ns);
        let task = tokio::spawn(async move {
            let mut events = watcher(api, watcher::Config::default())
                .default_backoff()
                .applied_objects()
                .boxed();
            while let Some(ev) = events.next().await {
                let Ok(pod) = ev else { continue };
                if let Ok(mut t) = s.lock() {
                    record(&mut t, &pod);
                }
            }
        });
        Self { seen, task }
    }

    /// `f` of what was recorded so far.
    pub fn read<R>(&self, f: impl FnOnce(&T) -> R) -> Option<R> {
        Some(f(&*self.seen.lock().ok()?))
    }
}

impl<T> Drop for PodRecorder<T> {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// How each pod of a namespace's container ended.
pub struct EndWatch(PodRecorder<HashMap<String, Ended>>);

impl EndWatch {
    pub fn start(client: Client, ns: &str) -> Self {
        Self(PodRecorder::start(
            client,
            ns,
            |m: &mut HashMap<String, Ended>, pod| {
                if let Some(e) = ended(pod) {
                    m.insert(pod.name_any(), e);
                }
            },
        ))
    }

    /// How pod `name`'s container ended, if the watch saw it.
    pub fn get(&self, name: &str) -> Option<Ended> {
        self.0.read(|m| m.get(name).cloned()).flatten()
    }
}

/// Every version of a namespace's pods a watch saw: name, phase and
/// resourceVersion (etcd's revision, so versions of different pods are
/// ordered too).
pub struct PhaseLog(PodRecorder<Vec<(String, String, u64)>>);

impl PhaseLog {
    pub fn start(client: Client, ns: &str) -> Self {
        Self(PodRecorder::start(
            client,
            ns,
            |v: &mut Vec<(String, String, u64)>, pod| {
                let rv = pod
                    .resource_version()
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0);
                let phase = pod
                    .status
                    .as_ref()
                    .and_then(|s| s.phase.clone())
                    .unwrap_or_default();
                v.push((pod.name_any(), phase, rv));
            },
        ))
    }

    /// The first resourceVersion at which `name` was seen in a phase `pred` accepts.
    pub fn first(&self, name: &str, pred: impl Fn(&str) -> bool) -> Option<u64> {
        self.0
            .read(|seen| {
                seen.iter()
                    .filter(|(n, p, _)| n == name && pred(p))
                    .map(|(_, _, rv)| *rv)
                    .min()
            })
            .flatten()
    }
}
