//! Rule 4's waiting: one quota backoff per namespace, shared by every task of
//! the instance.
//!
//! When a namespace's quota is full, every task launching there is refused
//! alike, so they share one backoff: the first refusal in a window advances it
//! (1 s doubling to 60 s; each delay is jittered up to twice its base, capped
//! at the maximum, so instances do not retry in lockstep),
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

struct State {
    backoff: ExponentialBackoff,
    not_before: Instant,
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
            });
        if now < st.not_before {
            // Another task already advanced the backoff for this window.
            return st.not_before;
        }
        // backon's jitter adds up to the delay again; the cap stays the cap.
        let delay = st
            .backoff
            .next()
            .unwrap_or(self.policy.max)
            .min(self.policy.max);
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
            // Jitter: within [base, 2 * base), never above the cap.
            assert!(
                *d >= base && *d < base * 2 && *d <= max,
                "step {i}: {d:?} vs base {base:?}"
            );
        }
        assert_eq!(delays[9], max, "capped");
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
