//! Naming the client that loops on a taken name.
//!
//! A client re-creating a taken name is the livelock of flyteorg/flyte#8066.
//! graceguard's denials stop the quota leak, but the loop itself is a bug in
//! that client, so denials are counted per namespace/name/user in a sliding
//! window; the first time a key reaches the threshold the audit log gets one
//! `livelock_suspected` record. It reports again only after the key has been
//! quiet (below the threshold) in between.
//!
//! The same windows tell mode `adaptive` how long a client has kept at it:
//! its streak, the denials of the key with no pause between two of them
//! longer than the window plus the wait the previous one told the client (a
//! client waiting out a 429 retries within it, however slow its way back).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use moka::sync::Cache;

/// Denials of one key within the window.
#[derive(Debug, Default)]
pub struct Window {
    hits: VecDeque<Instant>,
    reported: bool,
    /// Denials since the last pause longer than the window (plus `told`).
    streak: usize,
    /// The wait the newest denial told the client (its 429's Retry-After).
    told: Duration,
}

impl Window {
    /// Records a denial at `now`; true exactly when this one should be reported.
    pub fn record(&mut self, now: Instant, window: Duration, threshold: usize) -> bool {
        // The newest hit is the previous denial (hits only ever drop older ones).
        match self.hits.back() {
            Some(last) if now.saturating_duration_since(*last) <= window + self.told => {
                self.streak = self.streak.saturating_add(1);
            }
            _ => self.streak = 1,
        }
        while self
            .hits
            .front()
            .is_some_and(|t| now.duration_since(*t) > window)
        {
            self.hits.pop_front();
        }
        if self.hits.len() < threshold.saturating_sub(1) {
            self.reported = false;
        }
        // Never keep more than the threshold: that is all the decision needs.
        if self.hits.len() >= threshold {
            self.hits.pop_front();
        }
        self.hits.push_back(now);
        self.told = Duration::ZERO;
        if self.hits.len() >= threshold && !self.reported {
            self.reported = true;
            return true;
        }
        false
    }

    /// Notes that the newest denial told its client to wait `wait`.
    pub fn told(&mut self, wait: Duration) {
        self.told = wait;
    }

    /// Denials in the current streak, this one included.
    pub fn streak(&self) -> usize {
        self.streak
    }

    /// Denials counted in the window.
    pub fn len(&self) -> usize {
        self.hits.len()
    }

    pub fn is_empty(&self) -> bool {
        self.hits.is_empty()
    }
}

type Key = (String, String, String);

/// What one recorded denial says about its client.
#[derive(Clone, Debug)]
pub struct Recorded {
    /// `Some(denials in the window)` when the client should be named now.
    pub report: Option<usize>,
    /// Denials of this key in its current streak, this one included.
    pub streak: usize,
    window: Arc<Mutex<Window>>,
}

impl Recorded {
    /// Notes that this denial told its client to wait `wait` (a 429's
    /// Retry-After): its next try within the window after that wait goes on
    /// with the streak.
    pub fn told(&self, wait: Duration) {
        self.window
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .told(wait);
    }
}

/// Per-key windows that expire when a key goes quiet.
#[derive(Clone)]
pub struct LivelockDetector {
    windows: Cache<Key, Arc<Mutex<Window>>>,
    window: Duration,
    threshold: usize,
}

impl LivelockDetector {
    pub fn new(window: Duration, threshold: usize) -> Self {
        Self {
            // A key is kept for two windows: one for its hits, one for the
            // longest wait a 429 may tell (shorter than the window, checked
            // by the CLI).
            windows: Cache::builder()
                .time_to_idle(window.saturating_mul(2))
                .max_capacity(100_000)
                .build(),
            window,
            threshold: threshold.max(1),
        }
    }

    /// Records a denial.
    pub fn record(&self, namespace: &str, name: &str, user: &str) -> Recorded {
        let key = (namespace.to_string(), name.to_string(), user.to_string());
        let w = self
            .windows
            .get_with(key, || Arc::new(Mutex::new(Window::default())));
        let mut guard = w.lock().unwrap_or_else(|p| p.into_inner());
        let report = guard.record(Instant::now(), self.window, self.threshold);
        let (report, streak) = (report.then(|| guard.len()), guard.streak());
        drop(guard);
        Recorded {
            report,
            streak,
            window: w,
        }
    }

    pub fn window(&self) -> Duration {
        self.window
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_once_per_episode() {
        let t0 = Instant::now();
        let win = Duration::from_secs(10);
        let mut w = Window::default();
        let ms = |n: u64| t0 + Duration::from_millis(n);
        // 12/s for 5 s: 60 denials, one report at the 5th.
        let reports: Vec<usize> = (0..60u64)
            .filter(|i| w.record(ms(i * 83), win, 5))
            .map(|i| i as usize)
            .collect();
        assert_eq!(reports, vec![4]);
        // Quiet for longer than the window, then a new loop: reported again.
        let later = 60 * 83 + 11_000;
        let again: Vec<u64> = (0..10u64)
            .filter(|i| w.record(ms(later + i * 83), win, 5))
            .collect();
        assert_eq!(again, vec![4]);
    }

    #[test]
    fn slow_retries_are_not_a_livelock() {
        let t0 = Instant::now();
        let mut w = Window::default();
        // One denial every 3 s stays under 5 in 10 s forever.
        for i in 0..100u64 {
            assert!(!w.record(t0 + Duration::from_secs(i * 3), Duration::from_secs(10), 5));
        }
    }

    #[test]
    fn keys_are_counted_apart() {
        let d = LivelockDetector::new(Duration::from_secs(10), 3);
        let r = |user| d.record("ns", "p", user).report;
        assert_eq!(r("alice"), None);
        assert_eq!(r("bob"), None);
        assert_eq!(r("alice"), None);
        assert_eq!(r("alice"), Some(3));
        assert_eq!(r("alice"), None);
        assert_eq!(d.record("ns", "p", "bob").streak, 2);
    }

    #[test]
    fn a_streak_lasts_while_pauses_stay_within_the_window() {
        let t0 = Instant::now();
        let win = Duration::from_secs(10);
        let mut w = Window::default();
        // A loop, then retries 8 s apart (a client waiting out 429s): one streak.
        for (i, at) in [0u64, 50, 100, 8_100, 16_100, 24_100]
            .into_iter()
            .enumerate()
        {
            w.record(t0 + Duration::from_millis(at), win, 5);
            assert_eq!(w.streak(), i + 1);
        }
        // A pause longer than the window starts a new one.
        w.record(t0 + Duration::from_millis(35_000), win, 5);
        assert_eq!(w.streak(), 1);
    }

    #[test]
    fn a_client_back_late_from_the_wait_it_was_told_keeps_its_streak() {
        let t0 = Instant::now();
        let win = Duration::from_secs(10);
        let mut w = Window::default();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        w.record(at(0), win, 5);
        // Told to wait 8 s, back 3 s late (a loaded client or API server):
        // 11 s after, more than the window, still the same streak.
        w.told(Duration::from_secs(8));
        w.record(at(11_000), win, 5);
        assert_eq!(w.streak(), 2);
        // That denial told no wait (a 409): 11 s later is a new streak.
        w.record(at(22_000), win, 5);
        assert_eq!(w.streak(), 1);
        // Past the wait plus the window, new too.
        w.told(Duration::from_secs(8));
        w.record(at(22_000 + 18_001), win, 5);
        assert_eq!(w.streak(), 1);
    }
}
