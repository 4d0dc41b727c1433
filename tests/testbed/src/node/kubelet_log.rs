//! What a real kubelet did to end one pod, read from its log at `--v=4`
//! ([`crate::TestBedOptions::kubelet_verbosity`]).
//!
//! A pod's graceful deletion costs the kubelet two passes of the pod's
//! worker (`pkg/kubelet/pod_workers.go`): *terminating* (stop the
//! containers) and *terminated* (unmount, remove cgroups, final status),
//! each of which first waits for a status cache entry newer than the end
//! of the previous pass, i.e. for the next PLEG relist (1 s apart). A write
//! to the running pod that the kubelet acts on (a label or annotation
//! change) runs a pass of its own just before the deletion, and the
//! terminating pass then waits a whole relist; a write during the
//! termination joins the update the worker has pending. Both show here,
//! counted and timed, so a bench or a test can say which interval grew and
//! why instead of inferring it from the API's timestamps.

use std::collections::HashMap;

use serde::Serialize;

/// One pod's termination, in seconds from the kubelet's "marked for
/// graceful deletion" line.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Termination {
    /// Passes of the pod's worker that began after the deletion: 2 when
    /// nothing but the deletion made the kubelet act.
    pub passes: usize,
    /// Updates of the pod from the API server the kubelet received before
    /// its deletion (spec, labels or annotations changed: a status change
    /// is a reconcile and not counted). Each made it sync the running pod,
    /// and the termination that follows within a second waits a relist
    /// for it: 0 unless something wrote to the running pod.
    pub updates_before_deletion: usize,
    /// Updates of the pod from the API server the kubelet received while it
    /// terminated it (after the deletion, before its worker finished): a
    /// write made to the pod during its termination.
    pub updates: usize,
    /// Deletion → the terminating pass began: a pass the deletion found
    /// under way (a sync queued for its relist, or running) had to end
    /// first.
    pub pass_busy_s: f64,
    /// Terminating pass began → the kill: its wait for a relist newer than
    /// the previous pass's end (about 1 s when a sync ran just before).
    pub wait_before_kill_s: f64,
    /// Kill → every container stopped.
    pub kill_s: f64,
    /// Containers stopped → the terminated pass's first step: its wait for
    /// the next relist.
    pub wait_after_kill_s: f64,
    /// Deletion → the kubelet removed the pod from the API server.
    pub removed_s: Option<f64>,
}

const MARKED: &str = "Pod is marked for graceful deletion";
const PASS: &str = "\"Processing pod event\"";
const KILL: &str = "Pod terminating with grace period";
const STOPPED: &str = "Pod termination stopped all running containers";
const UNMOUNTED: &str = "Pod termination unmounted volumes";
const WORKER_DONE: &str = "Pod is complete and the worker can now stop";
const REMOVED: &str = "Pod fully terminated and removed from etcd";
/// The kubelet's dispatch of a changed pod: an update, or (once its
/// deletion has begun) a graceful delete.
const SYNC_UPDATE: &str = "\"SyncLoop UPDATE\"";
const SYNC_DELETE: &str = "\"SyncLoop DELETE\"";

/// Seconds of the day of a klog line (`I1207 13:49:43.461920 …`).
fn seconds(line: &str) -> Option<f64> {
    let time = line.split_whitespace().nth(1)?;
    let mut parts = time.split(':');
    let h: f64 = parts.next()?.parse().ok()?;
    let m: f64 = parts.next()?.parse().ok()?;
    let s: f64 = parts.next()?.parse().ok()?;
    Some(h * 3600.0 + m * 60.0 + s)
}

/// A kubelet's log, its lines grouped by the pod they name (by
/// `namespace/name` and by uid), read once for many pods.
pub struct KubeletLog<'a> {
    by_pod: HashMap<&'a str, Vec<(f64, &'a str)>>,
}

/// The value of `key="…"` (or `key=["…"]` naming one pod) in a klog line.
fn value<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let at = line.find(key)? + key.len();
    let rest = line[at..].strip_prefix('[').unwrap_or(&line[at..]);
    let rest = rest.strip_prefix('"')?;
    Some(&rest[..rest.find('"')?])
}

impl<'a> KubeletLog<'a> {
    pub fn parse(log: &'a str) -> Self {
        let mut by_pod: HashMap<&'a str, Vec<(f64, &'a str)>> = HashMap::new();
        for line in log.lines() {
            let Some(t) = seconds(line) else { continue };
            let keys = [
                value(line, " pod="),
                value(line, " pods="),
                value(line, " podUID="),
            ];
            for key in keys.into_iter().flatten() {
                by_pod.entry(key).or_default().push((t, line));
            }
        }
        Self { by_pod }
    }

    /// The termination of pod `namespace/name` (uid `uid`), or `None` if the
    /// log does not show its deletion and both passes (a level below 4, or
    /// a pod this kubelet never ended).
    pub fn termination(&self, namespace: &str, name: &str, uid: &str) -> Option<Termination> {
        let by_uid = format!("podUID=\"{uid}\"");
        let mut lines: Vec<(f64, &str)> = self
            .by_pod
            .get(format!("{namespace}/{name}").as_str())
            .into_iter()
            .chain(self.by_pod.get(uid))
            .flatten()
            .copied()
            .collect();
        // In the log's order (every line borrows from the one text); a line
        // naming both the pod and its uid is in both groups: once is enough.
        lines.sort_by_key(|(_, l)| l.as_ptr());
        lines.dedup_by(|a, b| std::ptr::eq(a.1, b.1));
        termination(&lines, &by_uid)
    }
}

fn termination(lines: &[(f64, &str)], by_uid: &str) -> Option<Termination> {
    // The uid keeps a same-named pod of another life out; a line that names
    // only the pod counts from this pod's deletion on.
    let start = lines
        .iter()
        .position(|(_, l)| l.contains(MARKED) && l.contains(by_uid))?;
    let t0 = lines[start].0;
    // A day's boundary inside one termination: seconds wrap at midnight.
    let after: Vec<(f64, &str)> = lines[start..]
        .iter()
        .map(|&(t, l)| {
            let t = if t < t0 - 43_200.0 { t + 86_400.0 } else { t };
            (t - t0, l)
        })
        .collect();
    let first = |what: &str| {
        after
            .iter()
            .find(|(_, l)| l.contains(what))
            .map(|(t, _)| *t)
    };
    let pass_of = |kind: &str| {
        let kind = format!("updateType=\"{kind}\"");
        after
            .iter()
            .find(|(_, l)| l.contains(PASS) && l.contains(&kind))
            .map(|(t, _)| *t)
    };
    let terminating = pass_of("terminating")?;
    let kill = first(KILL)?;
    let stopped = first(STOPPED)?;
    let unmounted = first(UNMOUNTED)?;
    let done = first(WORKER_DONE)?;
    let passes = after.iter().filter(|(_, l)| l.contains(PASS)).count();
    // The deletion's own update comes just before the marked line.
    let updates = after
        .iter()
        .filter(|(t, l)| *t < done && (l.contains(SYNC_UPDATE) || l.contains(SYNC_DELETE)))
        .count();
    let updates_before_deletion = lines[..start]
        .iter()
        .filter(|(_, l)| l.contains(SYNC_UPDATE))
        .count();
    Some(Termination {
        passes,
        updates_before_deletion,
        updates,
        pass_busy_s: terminating,
        wait_before_kill_s: kill - terminating,
        kill_s: stopped - kill,
        wait_after_kill_s: unmounted - stopped,
        removed_s: first(REMOVED),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kubelet's (v1.37.2, `--v=4`) lines about one preemption victim
    /// that graceguard tagged 42 ms after its deletion, trimmed to the ones
    /// read here and a few around them.
    const TAGGED: &str = r#"I1207 13:49:10.100000   21000 kubelet.go:2773] "SyncLoop RECONCILE" source="api" pods=["ns/victim-3"]
I1207 13:49:10.110000   21000 kubelet.go:2776] "SyncLoop DELETE" source="api" pods=["ns/victim-3"]
I1207 13:49:10.110100   21000 pod_workers.go:882] "Pod is marked for graceful deletion, begin teardown" pod="ns/victim-3" podUID="u-3" updateType="update"
I1207 13:49:10.110200   21000 pod_workers.go:1265] "Processing pod event" pod="ns/victim-3" podUID="u-3" updateType="terminating"
I1207 13:49:10.152000   21000 kubelet.go:2776] "SyncLoop DELETE" source="api" pods=["ns/victim-3"]
I1207 13:49:10.152100   21000 pod_workers.go:994] "Notifying pod of pending update" pod="ns/victim-3" podUID="u-3" updateType="update" workType="terminating"
I1207 13:49:10.697000   21000 kubelet.go:2369] "Pod terminating with grace period" pod="ns/victim-3" podUID="u-3" gracePeriod=30
I1207 13:49:11.134000   21000 kubelet.go:2456] "Pod termination stopped all running containers" pod="ns/victim-3" podUID="u-3"
I1207 13:49:11.135000   21000 pod_workers.go:1265] "Processing pod event" pod="ns/victim-3" podUID="u-3" updateType="terminated"
I1207 13:49:11.702000   21000 kubelet.go:2532] "Pod termination unmounted volumes" pod="ns/victim-3" podUID="u-3"
I1207 13:49:11.702500   21000 pod_workers.go:1500] "Pod is complete and the worker can now stop" podUID="u-3"
I1207 13:49:11.726000   21000 kubelet.go:2776] "SyncLoop DELETE" source="api" pods=["ns/victim-3"]
I1207 13:49:11.729000   21000 status_manager.go:1315] "Pod fully terminated and removed from etcd" pod="ns/victim-3"
"#;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-6
    }

    #[test]
    fn a_tag_during_termination_is_one_update_and_no_pass() {
        let t = KubeletLog::parse(TAGGED)
            .termination("ns", "victim-3", "u-3")
            .expect("its termination");
        assert_eq!(t.passes, 2, "{t:?}");
        assert_eq!(t.updates, 1, "{t:?}");
        assert_eq!(t.updates_before_deletion, 0, "{t:?}");
        assert!(close(t.pass_busy_s, 0.0001), "{t:?}");
        assert!(close(t.wait_before_kill_s, 0.5868), "{t:?}");
        assert!(close(t.kill_s, 0.437), "{t:?}");
        assert!(close(t.wait_after_kill_s, 0.568), "{t:?}");
        assert!(t.removed_s.is_some_and(|s| close(s, 1.6189)), "{t:?}");
    }

    #[test]
    fn an_untouched_pod_has_no_update_and_another_pod_is_not_read() {
        let untouched: String = TAGGED
            .lines()
            .filter(|l| !l.starts_with("I1207 13:49:10.152"))
            .map(|l| format!("{l}\n"))
            .collect();
        let t = KubeletLog::parse(&untouched)
            .termination("ns", "victim-3", "u-3")
            .expect("its termination");
        assert_eq!((t.passes, t.updates), (2, 0), "{t:?}");
        assert_eq!(
            KubeletLog::parse(TAGGED).termination("ns", "victim-30", "u-30"),
            None
        );
        assert_eq!(
            KubeletLog::parse(TAGGED).termination("other", "victim-3", "u-4"),
            None
        );
    }

    #[test]
    fn a_write_to_the_running_pod_is_an_update_before_its_deletion() {
        let tagged_running = TAGGED.replace(
            "I1207 13:49:10.100000   21000 kubelet.go:2773] \"SyncLoop RECONCILE\"",
            "I1207 13:49:10.100000   21000 kubelet.go:2773] \"SyncLoop UPDATE\"",
        );
        let t = KubeletLog::parse(&tagged_running)
            .termination("ns", "victim-3", "u-3")
            .expect("its termination");
        assert_eq!((t.updates_before_deletion, t.updates), (1, 1), "{t:?}");
    }

    #[test]
    fn a_log_below_level_four_says_nothing() {
        let v1: String = TAGGED
            .lines()
            .filter(|l| !l.contains("pod_workers.go"))
            .map(|l| format!("{l}\n"))
            .collect();
        assert_eq!(
            KubeletLog::parse(&v1).termination("ns", "victim-3", "u-3"),
            None
        );
    }
}
