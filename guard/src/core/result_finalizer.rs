//! The `graceguard.io/result` finalizer: every task pod carries it until
//! its result is acknowledged, so a deletion (a TTL, PodGC, a user, the
//! namespace's own, while the executor is down or its watch lags) cannot
//! take away the attempt a task had reached or a result not yet delivered.
//! The Job controller keeps its pods the same way.
//!
//! Which pods may let go is decided here, from the pods alone; the patch
//! that lets go is [`crate::runtime::pod_api::release`] (and the done-mark,
//! [`crate::runtime::done_marks`], which lets go in the same write).

use crate::core::naming::RESULT_FINALIZER;
use crate::core::reconcile::PodView;

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

/// What the loop knows of a task when it decides which of its pods let go.
#[derive(Clone, Copy, Debug, Default)]
pub struct ReleaseContext {
    /// The task ended by an abort: no result to keep.
    pub aborted: bool,
    /// The task was forgotten: nobody will acknowledge its result.
    pub forgotten: bool,
    /// Its namespace is being deleted: keeping would hold the deletion up
    /// for ever.
    pub namespace_terminating: bool,
    /// This process may not write now (another holds the instance's Lease).
    pub fenced: bool,
    /// How long a deleted pod is held for a result nobody acknowledges
    /// (`None`: until it is).
    pub max_hold_ms: Option<i64>,
    pub now_ms: i64,
}

/// Which of a task's held pods let go now.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ReleasePlan {
    /// The uids to let go of now (`too_long` among them).
    pub go: Vec<String>,
    /// Of `go`, those let go only because they were held past the bound
    /// (a Warning says so).
    pub too_long: Vec<String>,
    /// A held pod that stays is being deleted: whether its namespace is
    /// being deleted is worth asking (then nothing is kept).
    pub ask_namespace: bool,
}

/// The releases of a task whose pods `held` (uids) hold the finalizer:
/// what [`releasable`] lets go by the task's [`Keep`], plus what was
/// [`held_too_long`]. Only a process that may write lets go, except in a
/// namespace being deleted (the instance's Lease may go with it):
/// releasing there decides nothing for anyone.
pub fn plan(pods: &[PodView], held: &[&str], ctx: &ReleaseContext) -> ReleasePlan {
    let keep = match ctx.aborted || ctx.forgotten || ctx.namespace_terminating {
        true => Keep::Nothing,
        false => Keep::NewestUntilDone,
    };
    let is_held = |uid: &String| held.contains(&uid.as_str());
    let (mut go, mut too_long) = (Vec::new(), Vec::new());
    if !ctx.fenced || ctx.namespace_terminating {
        go = releasable(pods, keep);
        if let (Keep::NewestUntilDone, Some(limit)) = (keep, ctx.max_hold_ms) {
            too_long = held_too_long(pods, ctx.now_ms, limit);
        }
        too_long.retain(|uid| !go.contains(uid) && is_held(uid));
        go.retain(is_held);
        go.extend(too_long.iter().cloned());
    }
    let ask_namespace = held.iter().any(|uid| {
        !go.iter().any(|g| g == uid) && pods.iter().any(|p| p.uid == *uid && p.deleting())
    });
    ReleasePlan {
        go,
        too_long,
        ask_namespace,
    }
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
            done,
            ..PodView::sample(uid, attempt, "Failed")
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

    fn context() -> ReleaseContext {
        ReleaseContext {
            max_hold_ms: Some(60_000),
            now_ms: 100_000,
            ..Default::default()
        }
    }

    #[test]
    fn a_plan_keeps_the_newest_until_done_and_lets_go_of_the_rest_it_holds() {
        let pods = [pod("a", 0, false), pod("b", 1, false), pod("c", 2, false)];
        let p = plan(&pods, &["a", "c"], &context());
        assert_eq!(p.go, ["a"], "b holds nothing, c is the newest");
        assert!(p.too_long.is_empty());
        assert!(!p.ask_namespace);
    }

    #[test]
    fn nothing_is_kept_for_an_aborted_or_forgotten_task_or_a_namespace_being_deleted() {
        let pods = [pod("a", 0, false), pod("b", 1, false)];
        for ctx in [
            ReleaseContext {
                aborted: true,
                ..context()
            },
            ReleaseContext {
                forgotten: true,
                ..context()
            },
            ReleaseContext {
                namespace_terminating: true,
                ..context()
            },
        ] {
            let mut p = plan(&pods, &["a", "b"], &ctx);
            p.go.sort();
            assert_eq!(p.go, ["a", "b"], "{ctx:?}");
        }
    }

    #[test]
    fn a_fenced_process_lets_go_only_in_a_namespace_being_deleted() {
        let mut deleting = pod("b", 1, false);
        deleting.deletion_ms = Some(90_000);
        let pods = [pod("a", 0, false), deleting];
        let fenced = ReleaseContext {
            fenced: true,
            ..context()
        };
        let p = plan(&pods, &["a", "b"], &fenced);
        assert!(p.go.is_empty(), "{p:?}");
        // The newest is being deleted and kept: is its namespace going?
        assert!(p.ask_namespace);
        let terminating = ReleaseContext {
            namespace_terminating: true,
            ..fenced
        };
        let mut p = plan(&pods, &["a", "b"], &terminating);
        p.go.sort();
        assert_eq!(p.go, ["a", "b"]);
        assert!(!p.ask_namespace);
    }

    #[test]
    fn a_newest_pod_deleted_past_the_bound_lets_go_with_a_warning() {
        let mut newest = pod("b", 1, false);
        newest.deletion_ms = Some(100_000 - 60_000);
        let pods = [pod("a", 0, false), newest];
        let p = plan(&pods, &["a", "b"], &context());
        assert_eq!(p.go, ["a", "b"]);
        assert_eq!(p.too_long, ["b"]);
        let unbounded = ReleaseContext {
            max_hold_ms: None,
            ..context()
        };
        let p = plan(&pods, &["a", "b"], &unbounded);
        assert_eq!(p.go, ["a"]);
        assert!(p.ask_namespace, "b is deleted and kept");
    }

    #[test]
    fn a_release_writes_the_other_finalizers_back() {
        let f = vec!["x.io/keep".to_string(), RESULT_FINALIZER.to_string()];
        assert!(holds(&f));
        assert_eq!(without(&f), ["x.io/keep"]);
        assert!(!holds(&without(&f)));
    }
}
