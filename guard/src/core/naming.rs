//! Rule 1: every attempt has its own pod name, `<task>-<attempt>`.
//!
//! Re-creating the same name while the previous pod is terminating is what
//! collides (and leaks quota); a fresh name per attempt never does. Names are
//! DNS-1123 labels of at most 63 characters; a task name too long (or odd) for
//! that is shortened and given a stable hash suffix, so two long task names
//! that share a prefix still get different pod names.

use sha2::{Digest, Sha256};

/// Label: the task a pod belongs to (the task name as given, if it is a valid
/// label value, else its normalized form).
pub const TASK_LABEL: &str = "graceguard.io/task";
/// Label: the attempt number.
pub const ATTEMPT_LABEL: &str = "graceguard.io/attempt";
/// Label: the executor instance that launched the pod.
pub const INSTANCE_LABEL: &str = "graceguard.io/instance";
/// Label: set to `true` on completed pods once adoption has reported them.
pub const DONE_LABEL: &str = "graceguard.io/done";
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
pub const MANAGED_BY: &str = "graceguard";
/// Annotation: the instance that claimed a completed pod for delivery.
pub const CLAIMED_BY_ANNOTATION: &str = "graceguard.io/claimed-by";
/// The finalizer every task pod carries until its result is acknowledged
/// ([`crate::core::result_finalizer`]).
pub const RESULT_FINALIZER: &str = "graceguard.io/result";

const MAX: usize = 63;

/// `s` lowercased with every character outside `[a-z0-9-]` turned into `-`,
/// runs of `-` collapsed and trimmed at both ends.
fn normalize(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        let c = c.to_ascii_lowercase();
        let c = if c.is_ascii_lowercase() || c.is_ascii_digit() {
            c
        } else {
            '-'
        };
        if c == '-' && out.ends_with('-') {
            continue;
        }
        out.push(c);
    }
    out.trim_matches('-').to_string()
}

/// 64 bits of the name's SHA-256, in hex. 64 and not 32: among 10^5 long
/// task ids in one namespace, two share a 32-bit hash (and would share
/// pods) with odds of about 2 in 3 (the birthday bound); at 64 bits the odds
/// stay below 1 in 10^7 for 10^6 ids, and a recorded task name that differs
/// is refused anyway (`PodIndex::other_task`). Pods made before 0.2.0 carry 8-digit
/// stems; a task resumed from them keeps theirs ([`crate::TaskSpec::stem`]).
fn short_hash(s: &str) -> String {
    let d = Sha256::digest(s.as_bytes());
    d.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// The task part of pod names: `task` itself when it is already a clean
/// DNS-1123 label that leaves room for the attempt suffix, else a normalized
/// prefix plus a 16-hex-digit hash of the original name.
pub fn task_stem(task: &str) -> String {
    // Room for "-" and up to 10 attempt digits.
    const ROOM: usize = MAX - 11;
    let n = normalize(task);
    if n == task && !n.is_empty() && n.len() <= ROOM {
        return n;
    }
    let hash = short_hash(task);
    let keep = ROOM - hash.len() - 1;
    let prefix: String = n.chars().take(keep).collect();
    let prefix = prefix.trim_end_matches('-');
    if prefix.is_empty() {
        format!("t-{hash}")
    } else {
        format!("{prefix}-{hash}")
    }
}

/// The pod name of `attempt` of `task`.
pub fn pod_name(task: &str, attempt: u32) -> String {
    pod_name_from_stem(&task_stem(task), attempt)
}

/// The pod name of `attempt` of the task whose names use `stem` (today's
/// [`task_stem`], or the one its pods already carry).
pub fn pod_name_from_stem(stem: &str, attempt: u32) -> String {
    format!("{stem}-{attempt}")
}

/// `task` as a label value (the stem: always valid, and stable).
pub fn task_label_value(task: &str) -> String {
    task_stem(task)
}

/// This host's name (`$HOSTNAME`, else `/etc/hostname`): a pod's name in a
/// container.
pub fn hostname() -> Option<String> {
    std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
}

/// Checks that `instance` can be an instance name: it is a label value on
/// every pod and in the watch's label selector, so it must be a valid one
/// (at most 63 characters of `[A-Za-z0-9-_.]`, alphanumeric at both ends).
pub fn check_instance(instance: &str) -> Result<(), InstanceNameError> {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    let ends_ok = instance
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphanumeric())
        && instance
            .chars()
            .last()
            .is_some_and(|c| c.is_ascii_alphanumeric());
    if instance.len() <= MAX && ends_ok && instance.chars().all(ok_char) {
        return Ok(());
    }
    Err(InstanceNameError(instance.to_string()))
}

/// An instance name that cannot be a label value.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("instance name {0:?} is not a valid label value: use at most 63 characters of letters, digits, '-', '_' and '.', starting and ending with a letter or digit")]
pub struct InstanceNameError(pub String);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_instance_name_must_be_a_label_value() {
        for ok in ["exec-1", "a", "Flyte.prop_eller-0"] {
            assert_eq!(check_instance(ok), Ok(()), "{ok}");
        }
        let long = "a".repeat(64);
        for bad in [
            "",
            "-a",
            "a-",
            "a,b",
            "a=b",
            "x,graceguard.io/done!=true",
            &long,
        ] {
            assert!(check_instance(bad).is_err(), "{bad:?}");
        }
    }

    fn is_dns1123_label(s: &str) -> bool {
        !s.is_empty()
            && s.len() <= 63
            && s.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            && !s.starts_with('-')
            && !s.ends_with('-')
    }

    #[test]
    fn plain_names_are_kept() {
        assert_eq!(pod_name("train-a0", 0), "train-a0-0");
        assert_eq!(pod_name("train-a0", 12), "train-a0-12");
    }

    #[test]
    fn long_and_odd_names_are_valid_distinct_and_stable() {
        let long_a = "a".repeat(80) + "-alpha";
        let long_b = "a".repeat(80) + "-beta";
        let odd = [
            "Train_Job.v2",
            "--x--",
            "日本語",
            "",
            "UPPER",
            &long_a,
            &long_b,
        ];
        for t in odd {
            for attempt in [0, 7, u32::MAX] {
                let n = pod_name(t, attempt);
                assert!(is_dns1123_label(&n), "{t:?} -> {n:?}");
            }
        }
        assert_ne!(pod_name(&long_a, 0), pod_name(&long_b, 0));
        assert_eq!(pod_name(&long_a, 3), pod_name(&long_a, 3));
        // Odd names do not collide with their normalized form.
        assert_ne!(pod_name("Train_Job", 0), pod_name("train-job", 0));
        assert_eq!(pod_name("train-job", 0), "train-job-0");
    }

    #[test]
    fn hashed_stems_carry_64_bits_and_keep_a_readable_prefix() {
        let stem = task_stem(&("Train_".to_string() + &"x".repeat(80)));
        let (prefix, hash) = stem.rsplit_once('-').unwrap_or_default();
        assert_eq!(hash.len(), 16, "{stem}");
        assert!(hash.chars().all(|c| c.is_ascii_hexdigit()), "{stem}");
        assert!(prefix.starts_with("train-xxx"), "{stem}");
        assert!(stem.len() <= 52, "{stem}: room for -<attempt>");
        assert_eq!(task_stem("日本語").len(), "t-".len() + 16);
    }
}
