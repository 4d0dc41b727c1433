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

/// The uids of `pods` kept past the bound: deleted, their grace over more
/// than `limit_ms` ago (by this process's clock, [`PodView::deletion_ms`]),
/// and still held for a result nobody acknowledged. An executor that never
/// acknowledges would otherwise keep them in the API for ever; letting go
/// loses only what a restart could have delivered again (this process
/// still serves the result from its log).
pub fn held_too_long(pods: &[PodView], now_ms: i64, limit_ms: i64) -> Vec<String> {
    pods.iter()
        .filter(|p| !p.done)
        .filter(|p| {
            p.deletion_ms
                .is_some_and(|end| now_ms.saturating_sub(end) >= limit_ms)
        })
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
            task_started_ms: None,
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
    fn a_deleted_pod_is_held_no_longer_than_the_bound() {
        let mut deleted = pod("a", 0, false);
        deleted.deletion_ms = Some(10_000);
        let running = pod("b", 1, false);
        let mut done = pod("c", 2, true);
        done.deletion_ms = Some(0);
        let pods = [deleted, running, done];
        assert!(held_too_long(&pods, 10_000 + 59_999, 60_000).is_empty());
        assert_eq!(held_too_long(&pods, 10_000 + 60_000, 60_000), ["a"]);
    }

    #[test]
    fn a_release_writes_the_other_finalizers_back() {
        let f = vec!["x.io/keep".to_string(), RESULT_FINALIZER.to_string()];
        assert!(holds(&f));
        assert_eq!(without(&f), ["x.io/keep"]);
        assert!(!holds(&without(&f)));
    }
}
