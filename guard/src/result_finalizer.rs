//! The `graceguard.io/result` finalizer: every task pod carries it until
//! its result is acknowledged, so a deletion (a TTL, PodGC, a user, the
//! namespace's own, while the executor is down or its watch lags) cannot
//! take away the attempt a task had reached or a result not yet delivered.
//! The Job controller keeps its pods the same way.
//!
//! Which pods may let go is decided here, from the pods alone; the patch
//! that lets go is [`crate::pod_api::release`] (and the done-mark,
//! [`crate::done_marks`], which lets go in the same write).

use crate::naming::RESULT_FINALIZER;
use crate::reconcile::PodView;

/// What of a task is still worth keeping.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Keep {
    /// Its newest pod, until its result is acknowledged (marked done): it
    /// says which attempt the task reached and holds the result.
    NewestUntilDone,
    /// Nothing: the task was aborted or forgotten, or its namespace is
    /// being deleted (waiting would hold the deletion up for ever).
    Nothing,
}

/// The uids of one task's `pods` whose finalizer may go: each pod but the
/// newest (a newer attempt's pod carries the record of what the task had
/// spent), the newest too once it is marked done or when `keep` is
/// [`Keep::Nothing`].
pub fn releasable(pods: &[PodView], keep: Keep) -> Vec<String> {
    let newest = pods
        .iter()
        .max_by_key(|p| (p.attempt, p.created_ms))
        .map(|p| p.uid.as_str());
    pods.iter()
        .filter(|p| keep == Keep::Nothing || p.done || Some(p.uid.as_str()) != newest)
        .map(|p| p.uid.clone())
        .collect()
}

/// Whether `finalizers` holds graceguard's.
pub fn holds(finalizers: &[String]) -> bool {
    finalizers.iter().any(|f| f == RESULT_FINALIZER)
}

/// `finalizers` without graceguard's (the list a release writes).
pub fn without(finalizers: &[String]) -> Vec<String> {
    finalizers
        .iter()
        .filter(|f| *f != RESULT_FINALIZER)
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(uid: &str, attempt: u32, done: bool) -> PodView {
        PodView {
            uid: uid.into(),
            attempt,
            phase: "Failed".into(),
            disruption: None,
            created_ms: 1_000 + i64::from(attempt),
            deletion_ms: None,
            done,
            finished: false,
            record: None,
        }
    }

    #[test]
    fn the_newest_pod_is_kept_until_done_and_earlier_ones_are_let_go() {
        let pods = [pod("a", 0, false), pod("b", 2, false), pod("c", 1, false)];
        let mut r = releasable(&pods, Keep::NewestUntilDone);
        r.sort();
        assert_eq!(r, ["a", "c"]);
        let done = [pod("a", 0, false), pod("b", 2, true)];
        let mut r = releasable(&done, Keep::NewestUntilDone);
        r.sort();
        assert_eq!(r, ["a", "b"]);
    }

    #[test]
    fn nothing_is_kept_for_an_aborted_task_or_a_namespace_being_deleted() {
        let pods = [pod("a", 0, false), pod("b", 1, false)];
        let mut r = releasable(&pods, Keep::Nothing);
        r.sort();
        assert_eq!(r, ["a", "b"]);
        assert!(releasable(&[], Keep::Nothing).is_empty());
    }

    #[test]
    fn a_release_writes_the_other_finalizers_back() {
        let f = vec!["x.io/keep".to_string(), RESULT_FINALIZER.to_string()];
        assert!(holds(&f));
        assert_eq!(without(&f), ["x.io/keep"]);
        assert!(!holds(&without(&f)));
    }
}
