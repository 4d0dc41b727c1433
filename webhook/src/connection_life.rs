//! How long one admission connection may live.
//!
//! The API server keeps HTTP/2 connections to a webhook open and reuses
//! them; hyper never closes an idle one, so 16 clients that each opened 64
//! and went quiet would hold every one of the 1,024 connection slots for as
//! long as they liked. A connection therefore ends, gracefully (HTTP/2
//! `GOAWAY`, HTTP/1 `Connection: close` after the current response: nothing
//! in flight is cut), when
//! * it has answered nothing for [`Lifetime::idle`], or
//! * it is [`Lifetime::max_age`] old (spread ±10 % per connection, so the
//!   API server's connections to one replica do not all reopen at once): a
//!   long-lived connection pins one client to one replica, and reopening
//!   lets the Service spread them again after a rollout;
//! * graceguard is stopping.
//!
//! The API server opens a new connection for its next review; a request it
//! sent before the `GOAWAY` is still answered on the old one.
//!
//! [`decide`] is the rule (no I/O); [`Activity`] is what a connection's
//! requests update; [`run`] drives one connection by them.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use tokio_util::sync::CancellationToken;

/// The two limits; `Duration::ZERO` turns one off.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lifetime {
    pub idle: Duration,
    pub max_age: Duration,
}

impl Lifetime {
    /// Neither limit: a connection lives until its client or a shutdown ends it.
    pub const UNBOUNDED: Lifetime = Lifetime {
        idle: Duration::ZERO,
        max_age: Duration::ZERO,
    };

    /// This connection's age limit: `max_age` spread by `spread` in [-1, 1]
    /// times 10 %.
    pub fn age_limit(&self, spread: f64) -> Duration {
        let factor = 1.0 + 0.1 * spread.clamp(-1.0, 1.0);
        self.max_age.mul_f64(factor)
    }
}

/// Why a connection was ended by graceguard.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    Idle,
    MaxAge,
    Shutdown,
}

impl End {
    pub const ALL: [End; 3] = [End::Idle, End::MaxAge, End::Shutdown];

    pub fn as_str(self) -> &'static str {
        match self {
            End::Idle => "idle",
            End::MaxAge => "max_age",
            End::Shutdown => "shutdown",
        }
    }
}

/// What the rule says at one moment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// End it now.
    End(End),
    /// Ask again at the latest after this long (or when a request ends).
    CheckIn(Duration),
}

/// The rule: `age` since the connection opened, `idle_for` since its last
/// request ended (zero while one is in flight), `age_limit` and `idle` as in
/// [`Lifetime`] (zero: off).
pub fn decide(
    age: Duration,
    idle_for: Option<Duration>,
    age_limit: Duration,
    idle: Duration,
) -> Verdict {
    if !age_limit.is_zero() && age >= age_limit {
        return Verdict::End(End::MaxAge);
    }
    let mut next = Duration::MAX;
    if !age_limit.is_zero() {
        next = next.min(age_limit - age);
    }
    if !idle.is_zero() {
        match idle_for {
            Some(quiet) if quiet >= idle => return Verdict::End(End::Idle),
            Some(quiet) => next = next.min(idle - quiet),
            // Busy: look again after a whole idle period.
            None => next = next.min(idle),
        }
    }
    Verdict::CheckIn(next)
}

/// A connection's requests: how many are in flight, and when the last ended.
#[derive(Debug)]
pub struct Activity {
    opened: Instant,
    in_flight: AtomicUsize,
    /// Milliseconds after `opened` when the last request ended.
    last_ended_ms: AtomicU64,
}

impl Activity {
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            opened: Instant::now(),
            in_flight: AtomicUsize::new(0),
            last_ended_ms: AtomicU64::new(0),
        })
    }

    /// How long it has been quiet at `now`; `None` while a request is in flight.
    pub fn idle_for(&self, now: Instant) -> Option<Duration> {
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return None;
        }
        let last = self.opened + Duration::from_millis(self.last_ended_ms.load(Ordering::Acquire));
        Some(now.saturating_duration_since(last))
    }

    fn started(&self) {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
    }

    fn ended(&self) {
        let ms = u64::try_from(self.opened.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_ended_ms.store(ms, Ordering::Release);
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Middleware that keeps a connection's [`Activity`] (added per connection
/// with `axum::middleware::from_fn_with_state`).
pub async fn track(State(activity): State<Arc<Activity>>, req: Request, next: Next) -> Response {
    activity.started();
    // Ended even if the request's future is dropped (a timeout, a reset).
    struct Ended(Arc<Activity>);
    impl Drop for Ended {
        fn drop(&mut self) {
            self.0.ended();
        }
    }
    let _ended = Ended(activity);
    next.run(req).await
}

/// Drives connection `conn` until it ends by itself, or until the
/// [`Lifetime`] or `stop` ends it gracefully (`graceful` starts that on the
/// connection); then waits for what it has in flight. Returns the
/// connection's result and why graceguard ended it, if it did.
pub async fn run<C, E>(
    conn: C,
    graceful: impl FnOnce(Pin<&mut C>),
    activity: &Activity,
    lifetime: Lifetime,
    spread: f64,
    stop: &CancellationToken,
) -> (Result<(), E>, Option<End>)
where
    C: Future<Output = Result<(), E>>,
{
    let mut conn = std::pin::pin!(conn);
    let age_limit = lifetime.age_limit(spread);
    let end = loop {
        let now = Instant::now();
        let wait = match decide(
            now.saturating_duration_since(activity.opened),
            activity.idle_for(now),
            age_limit,
            lifetime.idle,
        ) {
            Verdict::End(why) => break why,
            Verdict::CheckIn(d) => d,
        };
        // `Duration::MAX` overflows an Instant: a day is as good as never here.
        let wait = wait.min(Duration::from_secs(86_400));
        tokio::select! {
            res = conn.as_mut() => return (res, None),
            _ = stop.cancelled() => break End::Shutdown,
            _ = tokio::time::sleep(wait) => {}
        }
    };
    graceful(conn.as_mut());
    (conn.await, Some(end))
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    #[test]
    fn an_old_connection_ends_even_while_busy() {
        assert_eq!(
            decide(S(600), None, S(600), S(120)),
            Verdict::End(End::MaxAge)
        );
    }

    #[test]
    fn a_quiet_connection_ends_after_the_idle_period_and_a_busy_one_never_does() {
        assert_eq!(
            decide(S(10), Some(S(120)), S(600), S(120)),
            Verdict::End(End::Idle)
        );
        assert_eq!(
            decide(S(10), Some(S(100)), S(600), S(120)),
            Verdict::CheckIn(S(20))
        );
        assert_eq!(
            decide(S(10), None, S(600), S(120)),
            Verdict::CheckIn(S(120))
        );
        // The age limit comes first when it is nearer.
        assert_eq!(
            decide(S(590), Some(S(0)), S(600), S(120)),
            Verdict::CheckIn(S(10))
        );
    }

    #[test]
    fn zero_turns_a_limit_off() {
        assert_eq!(
            decide(S(100_000), Some(S(100_000)), Duration::ZERO, Duration::ZERO),
            Verdict::CheckIn(Duration::MAX)
        );
        assert_eq!(
            decide(S(100_000), Some(S(5)), Duration::ZERO, S(120)),
            Verdict::CheckIn(S(115))
        );
    }

    #[test]
    fn the_age_limit_is_spread_by_at_most_ten_percent() {
        let l = Lifetime {
            idle: S(120),
            max_age: S(600),
        };
        assert_eq!(l.age_limit(0.0), S(600));
        assert_eq!(l.age_limit(1.0), S(660));
        assert_eq!(l.age_limit(-5.0), S(540));
    }

    #[test]
    fn activity_is_idle_only_with_nothing_in_flight() {
        let a = Activity::new();
        a.started();
        assert_eq!(a.idle_for(Instant::now()), None);
        a.ended();
        let quiet = a.idle_for(Instant::now() + S(3)).expect("idle");
        assert!(quiet >= S(2) && quiet <= S(4), "{quiet:?}");
    }

    /// A connection that ends only once its graceful shutdown is asked for
    /// (a send on the returned sender).
    fn ends_when_asked() -> (
        impl std::future::Future<Output = Result<(), &'static str>>,
        tokio::sync::oneshot::Sender<()>,
    ) {
        let (ask, asked) = tokio::sync::oneshot::channel::<()>();
        (async move { asked.await.map_err(|_| "dropped") }, ask)
    }

    #[tokio::test]
    async fn run_ends_a_quiet_connection_gracefully_and_waits_for_it() {
        let a = Activity::new();
        let stop = CancellationToken::new();
        let life = Lifetime {
            idle: Duration::from_millis(50),
            max_age: Duration::ZERO,
        };
        let (conn, ask) = ends_when_asked();
        let (res, end) = run(
            conn,
            move |_| {
                let _ = ask.send(());
            },
            &a,
            life,
            0.0,
            &stop,
        )
        .await;
        assert_eq!(res, Ok(()));
        assert_eq!(end, Some(End::Idle));
    }

    #[tokio::test]
    async fn run_ends_on_stop_even_a_busy_connection() {
        let a = Activity::new();
        a.started();
        let stop = CancellationToken::new();
        stop.cancel();
        let (conn, ask) = ends_when_asked();
        let (res, end) = run(
            conn,
            move |_| {
                let _ = ask.send(());
            },
            &a,
            Lifetime::UNBOUNDED,
            0.0,
            &stop,
        )
        .await;
        assert_eq!(res, Ok(()));
        assert_eq!(end, Some(End::Shutdown));
    }
}
