//! How long one admission connection may live, and how it ends without
//! losing a request.
//!
//! The API server keeps connections to a webhook open and reuses them;
//! hyper never closes an idle one, so 16 clients that each opened 64 and
//! went quiet would hold every one of the 1,024 connection slots for as long
//! as they liked. A connection therefore ends when
//! * it has answered nothing for [`Lifetime::idle`], or
//! * it is [`Lifetime::max_age`] old (spread ±10 % per connection, so the
//!   API server's connections to one replica do not all reopen at once): a
//!   long-lived connection pins one client to one replica, and reopening
//!   lets the Service spread them again after a rollout;
//! * graceguard is stopping.
//!
//! How it ends depends on the protocol ([`ending`]). The kube-apiserver
//! calls admission webhooks over HTTP/1.1 (kubernetes/kubernetes#82090), and
//! closing an idle HTTP/1.1 connection races the client's next request on
//! it: the request fails with EOF, which the API server does not retry, so
//! the webhook fails open (or, under `failurePolicy: Fail`, refuses the
//! Create). An HTTP/1 connection is therefore told to close in the
//! `Connection: close` header of its next response, and the client closes
//! it; it is closed by graceguard only once it has been quiet for the idle
//! period (longer than the API server's own 90 s idle limit), or at the last
//! call of a shutdown. HTTP/2 ends with `GOAWAY`, which names the last stream
//! served; the client retries a later one on a new connection.
//!
//! [`decide`] and [`ending`] are the rules (no I/O); [`Activity`] is what a
//! connection's requests update; [`run`] drives one connection by them.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, Version};
use axum::middleware::Next;
use axum::response::Response;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

/// Connections graceguard ended gracefully, by why.
#[derive(Clone, Default)]
pub struct ConnectionMetrics {
    pub ended: Family<ConnectionEndLabels, Counter>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConnectionEndLabels {
    /// Why graceguard ended a connection: `idle`, `max_age`, `shutdown`.
    pub reason: &'static str,
}

impl ConnectionMetrics {
    /// The series, registered, every reason at 0 from the start.
    pub fn register(r: &mut Registry) -> Self {
        let m = Self::default();
        for end in End::ALL {
            let _ = m.ended.get_or_create(&ConnectionEndLabels {
                reason: end.as_str(),
            });
        }
        r.register(
            "connections_ended",
            "Connections graceguard ended gracefully (HTTP/2 GOAWAY, HTTP/1 Connection: close; nothing in flight is cut), by reason: idle, max_age, shutdown",
            m.ended.clone(),
        );
        m
    }

    /// One connection ended for `end`.
    pub fn ended(&self, end: End) {
        self.ended
            .get_or_create(&ConnectionEndLabels {
                reason: end.as_str(),
            })
            .inc();
    }
}

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

/// A connection's protocol, as ALPN chose it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    Http1,
    Http2,
}

/// How a connection is ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ending {
    /// At once (what is in flight still finishes).
    Now,
    /// By the client, told in the `Connection: close` header of the next
    /// response; at once only when that never comes ([`run`]).
    AfterNextResponse,
}

/// How to end a connection of `protocol` for `end`: HTTP/2 at once (its
/// `GOAWAY` loses nothing); HTTP/1 at once only when idle past the idle
/// period (the client has let go of it by then), otherwise after its next
/// response, since closing it under the client's next request loses that
/// request.
pub fn ending(end: End, protocol: Protocol) -> Ending {
    match (protocol, end) {
        (Protocol::Http2, _) | (Protocol::Http1, End::Idle) => Ending::Now,
        (Protocol::Http1, End::MaxAge | End::Shutdown) => Ending::AfterNextResponse,
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

/// A connection's requests: how many are in flight, and when the last ended;
/// and whether its next HTTP/1 response asks the client to close it.
#[derive(Debug)]
pub struct Activity {
    opened: Instant,
    in_flight: AtomicUsize,
    /// Milliseconds after `opened` when the last request ended.
    last_ended_ms: AtomicU64,
    /// This connection is to end after its next response.
    closing: AtomicBool,
    /// Every connection of the listener is (graceguard is stopping).
    draining: CancellationToken,
}

impl Activity {
    /// A new connection's; `draining` is its listener's
    /// ([`Activity::wants_close`]).
    pub fn new(draining: &CancellationToken) -> Arc<Self> {
        Arc::new(Self {
            opened: Instant::now(),
            in_flight: AtomicUsize::new(0),
            last_ended_ms: AtomicU64::new(0),
            closing: AtomicBool::new(false),
            draining: draining.clone(),
        })
    }

    /// Whether a response now should carry `Connection: close`.
    pub fn wants_close(&self) -> bool {
        self.closing.load(Ordering::Acquire) || self.draining.is_cancelled()
    }

    fn close_after_response(&self) {
        self.closing.store(true, Ordering::Release);
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
/// with `axum::middleware::from_fn_with_state`) and, on HTTP/1, asks the
/// client to close the connection when it is ending (hyper closes it once
/// that response is written).
pub async fn track(State(activity): State<Arc<Activity>>, req: Request, next: Next) -> Response {
    activity.started();
    // Ended even if the request's future is dropped (a timeout, a reset).
    struct Ended(Arc<Activity>);
    impl Drop for Ended {
        fn drop(&mut self) {
            self.0.ended();
        }
    }
    let http1 = req.version() < Version::HTTP_2;
    let ended = Ended(activity);
    let mut res = next.run(req).await;
    if http1 && ended.0.wants_close() {
        res.headers_mut()
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
    }
    res
}

/// Drives connection `conn` until it ends by itself, or until the
/// [`Lifetime`] or `stop` ends it the way [`ending`] says for `protocol`
/// (`graceful` ends it at once: HTTP/2 `GOAWAY`, or an HTTP/1 connection
/// closed when idle), then waits for what it has in flight. One told to
/// close after its next response is ended at once when no response comes
/// before the idle period or `last_call`. Returns the connection's result
/// and why graceguard ended it, if it did.
#[allow(clippy::too_many_arguments)]
pub async fn run<C, E>(
    conn: C,
    graceful: impl FnOnce(Pin<&mut C>),
    activity: &Activity,
    protocol: Protocol,
    lifetime: Lifetime,
    spread: f64,
    stop: &CancellationToken,
    last_call: &CancellationToken,
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
    if ending(end, protocol) == Ending::AfterNextResponse {
        activity.close_after_response();
        loop {
            let now = Instant::now();
            let wait = match decide(
                now.saturating_duration_since(activity.opened),
                activity.idle_for(now),
                Duration::ZERO,
                lifetime.idle,
            ) {
                Verdict::End(_) => break,
                Verdict::CheckIn(d) => d.min(Duration::from_secs(86_400)),
            };
            tokio::select! {
                // The client closed it after the response that said so.
                res = conn.as_mut() => return (res, Some(end)),
                _ = last_call.cancelled() => break,
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }
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
        let a = Activity::new(&CancellationToken::new());
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
        let a = Activity::new(&CancellationToken::new());
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
            Protocol::Http2,
            life,
            0.0,
            &stop,
            &CancellationToken::new(),
        )
        .await;
        assert_eq!(res, Ok(()));
        assert_eq!(end, Some(End::Idle));
    }

    /// [`run`] of a connection that ends only when asked, after a stop
    /// (and the last call, when `last_call` is true).
    async fn run_stopped(
        a: &Activity,
        protocol: Protocol,
        last_call: bool,
    ) -> (Result<(), &'static str>, Option<End>) {
        let stop = CancellationToken::new();
        stop.cancel();
        let last = CancellationToken::new();
        if last_call {
            last.cancel();
        }
        let (conn, ask) = ends_when_asked();
        run(
            conn,
            move |_| {
                let _ = ask.send(());
            },
            a,
            protocol,
            Lifetime::UNBOUNDED,
            0.0,
            &stop,
            &last,
        )
        .await
    }

    #[tokio::test]
    async fn run_ends_on_stop_even_a_busy_connection() {
        let a = Activity::new(&CancellationToken::new());
        a.started();
        let (res, end) = run_stopped(&a, Protocol::Http2, false).await;
        assert_eq!(res, Ok(()));
        assert_eq!(end, Some(End::Shutdown));
    }

    #[test]
    fn http1_is_ended_by_its_client_after_a_response_unless_idle_and_http2_at_once() {
        for end in End::ALL {
            assert_eq!(ending(end, Protocol::Http2), Ending::Now, "{end:?}");
        }
        assert_eq!(ending(End::Idle, Protocol::Http1), Ending::Now);
        assert_eq!(
            ending(End::MaxAge, Protocol::Http1),
            Ending::AfterNextResponse
        );
        assert_eq!(
            ending(End::Shutdown, Protocol::Http1),
            Ending::AfterNextResponse
        );
    }

    #[tokio::test]
    async fn an_http1_connection_is_not_closed_under_its_client_at_shutdown_before_the_last_call() {
        let a = Activity::new(&CancellationToken::new());
        let stop = CancellationToken::new();
        stop.cancel();
        let last_call = CancellationToken::new();
        // The client closes the connection once told (here: after 100 ms).
        let told = std::sync::Arc::new(AtomicBool::new(false));
        let conn = async {
            tokio::time::sleep(Duration::from_millis(100)).await;
            Ok::<(), &str>(())
        };
        let t = std::sync::Arc::clone(&told);
        let (res, end) = run(
            conn,
            move |_| t.store(true, Ordering::Release),
            &a,
            Protocol::Http1,
            Lifetime::UNBOUNDED,
            0.0,
            &stop,
            &last_call,
        )
        .await;
        assert_eq!((res, end), (Ok(()), Some(End::Shutdown)));
        assert!(!told.load(Ordering::Acquire), "closed under its client");
        assert!(
            a.wants_close(),
            "its next response must say Connection: close"
        );
    }

    #[tokio::test]
    async fn an_http1_connection_no_request_came_on_is_closed_at_the_last_call() {
        let a = Activity::new(&CancellationToken::new());
        let (res, end) = run_stopped(&a, Protocol::Http1, true).await;
        assert_eq!((res, end), (Ok(()), Some(End::Shutdown)));
    }

    async fn connection_header(version: Version, draining: bool) -> Option<String> {
        use tower::ServiceExt as _;
        let token = CancellationToken::new();
        if draining {
            token.cancel();
        }
        let app = axum::Router::new()
            .route("/", axum::routing::post(|| async { "ok" }))
            .layer(axum::middleware::from_fn_with_state(
                Activity::new(&token),
                track,
            ));
        let req = Request::builder()
            .method("POST")
            .uri("/")
            .version(version)
            .body(axum::body::Body::empty())
            .expect("a request");
        let res = app.oneshot(req).await.expect("infallible");
        res.headers()
            .get(header::CONNECTION)
            .map(|v| v.to_str().unwrap_or_default().to_string())
    }

    #[tokio::test]
    async fn a_draining_http1_response_says_connection_close_and_nothing_else_does() {
        assert_eq!(
            connection_header(Version::HTTP_11, true).await.as_deref(),
            Some("close")
        );
        assert_eq!(connection_header(Version::HTTP_11, false).await, None);
        // A connection header is not allowed in HTTP/2 (GOAWAY ends those).
        assert_eq!(connection_header(Version::HTTP_2, true).await, None);
    }
}
