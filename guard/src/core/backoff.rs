//! Rule 4's waiting: one quota backoff per namespace, shared by every task of
//! the instance.
//!
//! When a namespace's quota is full, every task launching there is refused
//! alike, so they share one backoff: the first refusal in a window advances it
//! (1 s doubling to 60 s; each delay is jittered up to twice its base; at the
//! cap, where that jitter would be cut off, a delay falls anywhere in the
//! upper half of the cap instead, so waiters never wake in lockstep),
//! later ones in the same window wait for its end plus a jitter of their own
//! (up to a second, from the task's name), so waiters never wake in lockstep.
//!
//! While a window is open, a task that wants to Create asks
//! [`NamespaceBackoffs::probe`] first: after the window, exactly one task
//! (the probe) sends its Create; the others wait. If the probe is refused,
//! the next window begins; if it is created, the next waiter may probe at
//! once, and only after [`RESET_AFTER`] Creates in a row succeed is the
//! namespace's backoff dropped: N tasks waiting on a full quota send one
//! Create per window, not N, and one pod finishing does not release all N
//! at 1 s. Time is passed in, so the policy is tested with a deterministic
//! clock.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};

/// Backoff bounds.
#[derive(Clone, Copy, Debug)]
pub struct BackoffPolicy {
    pub min: Duration,
    pub max: Duration,
    /// Seed for the jitter; `None` for a random one.
    pub seed: Option<u64>,
}

impl Default for BackoffPolicy {
    fn default() -> Self {
        Self {
            min: Duration::from_secs(1),
            max: Duration::from_secs(60),
            seed: None,
        }
    }
}

impl BackoffPolicy {
    /// The delays of this policy, doubling from `min` to `max`, jittered.
    pub(crate) fn build(&self) -> ExponentialBackoff {
        let mut b = ExponentialBuilder::default()
            .with_min_delay(self.min)
            .with_max_delay(self.max)
            .with_factor(2.0)
            .with_jitter()
            .without_max_times();
        if let Some(seed) = self.seed {
            b = b.with_jitter_seed(seed);
        }
        b.build()
    }
}

/// The transient backoff's `delay`, but never less than a server's
/// `retryAfterSeconds`.
pub fn at_least(delay: Duration, retry_after: Option<Duration>) -> Duration {
    retry_after.map_or(delay, |r| r.max(delay))
}

/// Creates in a row that succeed in a waiting namespace before its backoff
/// is dropped.
pub const RESET_AFTER: u32 = 4;

/// How long a probe may go unanswered before another task may probe (its
/// answer was lost; the Create itself times out long before).
const PROBE_TIMEOUT: Duration = Duration::from_secs(30);

/// How soon a task that found a probe in flight asks again.
const PROBE_RECHECK: Duration = Duration::from_secs(1);

struct State {
    backoff: ExponentialBackoff,
    not_before: Instant,
    /// Spreads delays at the cap.
    rng: fastrand::Rng,
    /// The task whose Create is the window's probe, since when.
    probe: Option<(String, Instant)>,
    /// Creates in a row that succeeded since the last refusal.
    successes: u32,
}

/// A task's own offset after a window ends (up to a second, stable per
/// task), so the waiters of one namespace never wake at one instant.
pub(crate) fn task_jitter(task: &str) -> Duration {
    // FNV-1a: stable across runs and processes.
    let h = task.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    Duration::from_millis(h % 1000)
}

/// What [`NamespaceBackoffs::probe`] allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Probe {
    /// Send the Create now.
    Go,
    /// Do not send it; ask again at this instant.
    WaitUntil(Instant),
}

/// `jittered` (base plus up to one base of jitter) bounded by `max`: past
/// the cap, anywhere in `(max / 2, max]`, `fraction` (in `[0, 1)`) choosing
/// where. Never exactly the cap for everyone.
pub(crate) fn spread_at_cap(jittered: Duration, max: Duration, fraction: f64) -> Duration {
    if jittered < max {
        return jittered;
    }
    max.mul_f64(1.0 - fraction.clamp(0.0, 1.0) / 2.0)
}

/// See the module docs.
pub struct NamespaceBackoffs {
    policy: BackoffPolicy,
    states: Mutex<HashMap<String, State>>,
}

impl NamespaceBackoffs {
    pub fn new(policy: BackoffPolicy) -> Self {
        Self {
            policy,
            states: Mutex::new(HashMap::new()),
        }
    }

    /// A quota refusal of `task` in `namespace` at `now`: when to try again.
    pub fn refused(&self, namespace: &str, task: &str, now: Instant) -> Instant {
        let mut states = self.states.lock().unwrap_or_else(|p| p.into_inner());
        let st = states
            .entry(namespace.to_string())
            .or_insert_with(|| State {
                backoff: self.policy.build(),
                not_before: now,
                rng: match self.policy.seed {
                    Some(seed) => fastrand::Rng::with_seed(seed),
                    None => fastrand::Rng::new(),
                },
                probe: None,
                successes: 0,
            });
        st.successes = 0;
        if st.probe.as_ref().is_some_and(|(p, _)| p == task) {
            st.probe = None;
        }
        if now < st.not_before {
            // Another task already advanced the backoff for this window.
            return st.not_before + task_jitter(task);
        }
        // backon's jitter adds up to the delay again; at the cap it is spread.
        let jittered = st.backoff.next().unwrap_or(self.policy.max);
        let fraction = st.rng.f64();
        let delay = spread_at_cap(jittered, self.policy.max, fraction);
        st.not_before = now + delay;
        st.not_before + task_jitter(task)
    }

    /// Before `task` sends a Create in `namespace`: [`Probe::Go`] unless the
    /// namespace is waiting for quota and this task is not the window's one
    /// probe.
    pub fn probe(&self, namespace: &str, task: &str, now: Instant) -> Probe {
        let mut states = self.states.lock().unwrap_or_else(|p| p.into_inner());
        let Some(st) = states.get_mut(namespace) else {
            return Probe::Go;
        };
        if now < st.not_before {
            return Probe::WaitUntil(st.not_before + task_jitter(task));
        }
        match &st.probe {
            Some((p, _)) if p == task => Probe::Go,
            Some((_, since)) if now < *since + PROBE_TIMEOUT => {
                Probe::WaitUntil(now + PROBE_RECHECK + task_jitter(task))
            }
            _ => {
                st.probe = Some((task.to_string(), now));
                Probe::Go
            }
        }
    }

    /// `task`'s Create was answered neither "created" nor "quota full" (or
    /// not at all): if it was the probe, another task may probe now.
    pub fn settled(&self, namespace: &str, task: &str) {
        let mut states = self.states.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(st) = states.get_mut(namespace) {
            if st.probe.as_ref().is_some_and(|(p, _)| p == task) {
                st.probe = None;
            }
        }
    }

    /// A successful Create of `task` in `namespace`: there was room. The
    /// next waiter may probe at once; [`RESET_AFTER`] in a row drop the
    /// namespace's backoff.
    pub fn created(&self, namespace: &str, task: &str, now: Instant) {
        let mut states = self.states.lock().unwrap_or_else(|p| p.into_inner());
        let Some(st) = states.get_mut(namespace) else {
            return;
        };
        if st.probe.as_ref().is_some_and(|(p, _)| p == task) {
            st.probe = None;
        }
        st.successes += 1;
        if st.successes >= RESET_AFTER {
            states.remove(namespace);
        } else {
            st.not_before = st.not_before.min(now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> BackoffPolicy {
        BackoffPolicy {
            seed: Some(7),
            ..Default::default()
        }
    }

    #[test]
    fn grows_doubling_with_bounded_jitter_and_caps() {
        let b = NamespaceBackoffs::new(policy());
        let t0 = tokio::time::Instant::now().into_std();
        let mut now = t0;
        let mut delays = Vec::new();
        for _ in 0..10 {
            let next = b.refused("ns", "t", now) - task_jitter("t");
            delays.push(next - now);
            now = next;
        }
        let max = Duration::from_secs(60);
        for (i, d) in delays.iter().enumerate() {
            let base = Duration::from_secs(1 << i.min(6)).min(max);
            // Below the cap: within [base, 2 * base); at it: in (max/2, max].
            let ok = match *d < max / 2 || base < max / 2 {
                true => *d >= base && *d < base * 2 && *d <= max,
                false => *d > max / 2 && *d <= max,
            };
            assert!(ok, "step {i}: {d:?} vs base {base:?}");
        }
        // At the cap the delays still differ (no lockstep).
        let capped: std::collections::BTreeSet<Duration> = delays[7..].iter().copied().collect();
        assert!(capped.len() > 1, "every capped delay equal: {delays:?}");
    }

    #[test]
    fn retry_after_is_a_floor_not_a_replacement() {
        let ms = Duration::from_millis;
        assert_eq!(at_least(ms(200), None), ms(200));
        assert_eq!(at_least(ms(200), Some(ms(3000))), ms(3000));
        assert_eq!(at_least(ms(8000), Some(ms(3000))), ms(8000));
    }

    #[test]
    fn waiters_at_the_cap_wake_spread_over_its_upper_half() {
        let max = Duration::from_secs(60);
        // Eight instances (seeds) that have all reached the cap.
        let wakeups: Vec<Duration> = (0..8u64)
            .map(|seed| {
                let b = NamespaceBackoffs::new(BackoffPolicy {
                    seed: Some(seed),
                    ..Default::default()
                });
                let mut now = tokio::time::Instant::now().into_std();
                for _ in 0..12 {
                    now = b.refused("ns", "t", now) - task_jitter("t");
                }
                b.refused("ns", "t", now) - task_jitter("t") - now
            })
            .collect();
        let distinct: std::collections::BTreeSet<_> = wakeups.iter().collect();
        assert!(distinct.len() >= 6, "{wakeups:?}");
        assert!(
            wakeups.iter().all(|d| *d > max / 2 && *d <= max),
            "{wakeups:?}"
        );
        assert_eq!(
            spread_at_cap(Duration::from_secs(5), max, 0.9),
            Duration::from_secs(5)
        );
        assert_eq!(spread_at_cap(Duration::from_secs(70), max, 0.0), max);
        assert_eq!(spread_at_cap(Duration::from_secs(70), max, 1.0), max / 2);
    }

    #[test]
    fn tasks_in_one_window_share_it_each_with_its_own_offset() {
        let b = NamespaceBackoffs::new(policy());
        let t0 = tokio::time::Instant::now().into_std();
        let first = b.refused("ns", "a", t0) - task_jitter("a");
        // A second task refused in the same window waits for its end, plus
        // its own offset.
        let b_wakes = b.refused("ns", "b", t0 + Duration::from_millis(100));
        assert_eq!(b_wakes, first + task_jitter("b"));
        assert_ne!(task_jitter("a"), task_jitter("b"));
        // Another namespace has its own backoff.
        assert!(b.refused("other", "a", t0) - t0 < Duration::from_secs(3));
        let second = b.refused("ns", "a", first) - task_jitter("a");
        assert!(second - first >= Duration::from_secs(2));
    }

    /// 200 tasks waiting on a full quota: one Create per window, not 200;
    /// once room appears they go one at a time, and the backoff is dropped
    /// only after RESET_AFTER Creates in a row succeeded.
    #[test]
    fn two_hundred_waiters_send_one_create_per_window() {
        let b = NamespaceBackoffs::new(policy());
        let tasks: Vec<String> = (0..200).map(|i| format!("task-{i}")).collect();
        let t0 = tokio::time::Instant::now().into_std();
        // Each task's first Create was refused (before any window existed).
        let mut wake: Vec<Instant> = tasks.iter().map(|t| b.refused("ns", t, t0)).collect();
        // Each one asks again when told, in time order; every probe is
        // refused (the quota stays full for 8 windows).
        let mut queue: std::collections::BinaryHeap<std::cmp::Reverse<(Instant, usize)>> = wake
            .drain(..)
            .enumerate()
            .map(|(i, w)| std::cmp::Reverse((w, i)))
            .collect();
        let (mut creates, mut asks, mut window_end) = (0, 0, t0);
        let mut now = t0;
        while creates < 8 {
            let Some(std::cmp::Reverse((at, i))) = queue.pop() else {
                break;
            };
            now = at;
            asks += 1;
            match b.probe("ns", &tasks[i], now) {
                Probe::Go => {
                    // Never two Creates in one window.
                    assert!(now >= window_end, "a second Create in the window");
                    creates += 1;
                    let next = b.refused("ns", &tasks[i], now);
                    window_end = next - task_jitter(&tasks[i]);
                    queue.push(std::cmp::Reverse((next, i)));
                }
                Probe::WaitUntil(at) => {
                    assert!(at > now);
                    queue.push(std::cmp::Reverse((at, i)));
                }
            }
        }
        assert_eq!(creates, 8, "one Create per window");
        // Each waiter asks about once per window (no spinning).
        assert!(asks <= 200 * 8 * 2, "{asks} asks");
        // Room: the probe is created; the next asker probes at once, the
        // one after it waits for that probe's answer.
        now += Duration::from_secs(120);
        assert_eq!(b.probe("ns", "task-0", now), Probe::Go);
        b.created("ns", "task-0", now);
        assert_eq!(b.probe("ns", "task-1", now), Probe::Go);
        assert!(matches!(b.probe("ns", "task-2", now), Probe::WaitUntil(_)));
        for t in ["task-1", "task-2", "task-3"] {
            assert_eq!(b.probe("ns", t, now), Probe::Go, "{t}");
            b.created("ns", t, now);
        }
        // Dropped after RESET_AFTER successes: everyone goes.
        assert!((4..200).all(|i| b.probe("ns", &format!("task-{i}"), now) == Probe::Go));
    }
}
