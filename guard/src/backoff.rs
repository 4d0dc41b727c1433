//! Rule 4's waiting: one quota backoff per namespace, shared by every task of
//! the instance.
//!
//! When a namespace's quota is full, every task launching there is refused
//! alike, so they share one backoff: the first refusal in a window advances it
//! (1 s doubling to 60 s; each delay is jittered up to twice its base; at the
//! cap, where that jitter would be cut off, a delay falls anywhere in the
//! upper half of the cap instead, so waiters never wake in lockstep),
//! later ones in the same window wait for the same instant instead of adding
//! requests. A successful Create in the namespace resets it. Time is passed in,
//! so the policy is tested with a deterministic clock.

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

struct State {
    backoff: ExponentialBackoff,
    not_before: Instant,
    /// Spreads delays at the cap.
    rng: fastrand::Rng,
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

    /// A quota refusal in `namespace` at `now`: when to try again.
    pub fn refused(&self, namespace: &str, now: Instant) -> Instant {
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
            });
        if now < st.not_before {
            // Another task already advanced the backoff for this window.
            return st.not_before;
        }
        // backon's jitter adds up to the delay again; at the cap it is spread.
        let jittered = st.backoff.next().unwrap_or(self.policy.max);
        let fraction = st.rng.f64();
        let delay = spread_at_cap(jittered, self.policy.max, fraction);
        st.not_before = now + delay;
        st.not_before
    }

    /// A successful Create in `namespace`: the quota has room again.
    pub fn reset(&self, namespace: &str) {
        let mut states = self.states.lock().unwrap_or_else(|p| p.into_inner());
        states.remove(namespace);
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
        let t0 = Instant::now();
        let mut now = t0;
        let mut delays = Vec::new();
        for _ in 0..10 {
            let next = b.refused("ns", now);
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
                let mut now = Instant::now();
                for _ in 0..12 {
                    now = b.refused("ns", now);
                }
                b.refused("ns", now) - now
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
    fn tasks_in_one_window_share_it_and_success_resets() {
        let b = NamespaceBackoffs::new(policy());
        let t0 = Instant::now();
        let first = b.refused("ns", t0);
        // A second task refused in the same window waits for the same instant.
        assert_eq!(b.refused("ns", t0 + Duration::from_millis(100)), first);
        // Another namespace has its own backoff.
        assert!(b.refused("other", t0) - t0 < Duration::from_secs(2));
        let second = b.refused("ns", first);
        assert!(second - first >= Duration::from_secs(2));
        b.reset("ns");
        assert!(b.refused("ns", second) - second < Duration::from_secs(2));
    }
}
