//! The HTTPS admission listener and the plain-HTTP health listener.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use axum::error_handling::HandleErrorLayer;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::BoxError;
use axum::Router;
use hyper::server::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceBuilder;

use crate::app::App;
use crate::connection_life::ConnectionMetrics;
use crate::connection_life::{self, Activity, Lifetime, Protocol};
use crate::handlers;
use crate::limits::{self, ClientSlot, Intake, Limits, Peer, PerClient, Trust};

/// How long a client may take to finish the TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a client may take to send a request's headers.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long one request may take, body included (the API server itself gives
/// up after the webhook's timeoutSeconds, at most 30 s).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// The admission routes behind the port's limits ([`crate::limits`]): at
/// most `max_in_flight` requests answered at once (past it, 503 at once: load
/// shedding, never a queue), each within the body budget and deadline, and a
/// time limit, so a slow or silent client cannot hold a connection forever.
pub fn admission_router(app: Arc<App>, limits: &Limits) -> Router {
    let shed = app.metrics.limits.counter("in_flight");
    let max_in_flight = limits.max_in_flight;
    let intake_state = Intake::new(limits, &app.metrics.limits);
    let router = Router::new()
        .route("/validate/pods", post(handlers::validate_pods))
        .route("/validate/collision", post(handlers::validate_pods))
        .route("/mutate/pods-status", post(handlers::mutate_pods_status))
        .route(
            "/validate/pods-delete",
            post(handlers::validate_pods_delete),
        )
        .route(
            "/validate/pods-eviction",
            post(handlers::validate_pods_eviction),
        )
        .route(
            "/validate/pods-release",
            post(handlers::validate_pods_release),
        )
        .layer(DefaultBodyLimit::max(limits.max_body_bytes))
        .layer(axum::middleware::from_fn_with_state(
            intake_state,
            limits::intake,
        ))
        .layer(
            ServiceBuilder::new()
                .layer(HandleErrorLayer::new(move |_: BoxError| {
                    let shed = shed.clone();
                    async move {
                        shed.inc();
                        (
                            StatusCode::SERVICE_UNAVAILABLE,
                            format!("graceguard is answering its limit of {max_in_flight} admission requests at once (--max-in-flight); answered at once so the API server applies the webhook's failurePolicy"),
                        )
                    }
                }))
                .load_shed()
                // Global: `Router::layer` gives every route its own copy of a
                // layer, and the cap is for all of them together.
                .layer(tower::limit::GlobalConcurrencyLimitLayer::new(
                    max_in_flight,
                )),
        );
    with_time_limit(router).with_state(app)
}

/// `router`, answering 408 to a request that takes longer than [`REQUEST_TIMEOUT`].
fn with_time_limit<S: Clone + Send + Sync + 'static>(router: Router<S>) -> Router<S> {
    router.layer(
        ServiceBuilder::new()
            .layer(HandleErrorLayer::new(|_: BoxError| async {
                (
                    StatusCode::REQUEST_TIMEOUT,
                    "the request took longer than 30 s",
                )
            }))
            .timeout(REQUEST_TIMEOUT),
    )
}

#[derive(Clone)]
struct Health {
    app: Arc<App>,
    registry: Arc<Registry>,
}

/// `/healthz`, `/readyz` and `/metrics`.
pub fn health_router(app: Arc<App>, registry: Arc<Registry>) -> Router {
    let router = Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics));
    with_time_limit(router).with_state(Health { app, registry })
}

async fn readyz(State(h): State<Health>) -> impl IntoResponse {
    let app = &h.app;
    if app.is_ready() {
        return (StatusCode::OK, "ok".to_string());
    }
    let mut why = Vec::new();
    if !app.pods.is_ready() {
        why.push("pod index not synced or its watch is broken");
    }
    if !app.namespaces.is_ready() {
        why.push("namespace index not synced or its watch is broken");
    }
    if app.shutting_down.load(Ordering::Acquire) {
        why.push("shutting down");
    }
    (
        StatusCode::SERVICE_UNAVAILABLE,
        format!("not ready: {}", why.join("; ")),
    )
}

async fn metrics(State(h): State<Health>) -> impl IntoResponse {
    // The log writer keeps its own count; the counter catches up at each scrape.
    if let Some(dropped) = &h.app.log_dropped {
        let counter = &h.app.metrics.process.audit_records_dropped;
        let now = u64::try_from(dropped.dropped_lines()).unwrap_or(u64::MAX);
        counter.inc_by(now.saturating_sub(counter.get()));
    }
    if let Some(expiry) = h.app.certificate.as_ref().and_then(|c| c.not_after_unix()) {
        h.app.metrics.process.certificate_expiry.set(expiry);
    }
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        crate::metrics::render(&h.registry),
    )
}

/// Binds `addr`. `[::]` is bound for IPv4 and IPv6 together (not left to
/// the host's `net.ipv6.bindv6only`), and falls back to `0.0.0.0` on a host
/// without IPv6, so one default serves IPv4, IPv6 and dual-stack pod
/// networks. An IPv4 client then arrives as `::ffff:a.b.c.d`; the accept
/// loop sees it as `a.b.c.d`.
pub async fn bind(addr: std::net::SocketAddr) -> std::io::Result<TcpListener> {
    if addr.ip() != std::net::IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED) {
        return TcpListener::bind(addr).await;
    }
    match dual_stack(addr) {
        Ok(listener) => Ok(listener),
        Err(e) if no_ipv6(&e) => {
            let v4 = std::net::SocketAddr::new(std::net::Ipv4Addr::UNSPECIFIED.into(), addr.port());
            tracing::info!(%addr, error = %e, listen = %v4, "no IPv6 on this host: listening on IPv4 alone");
            TcpListener::bind(v4).await
        }
        Err(e) => Err(e),
    }
}

/// A listener on `[::]:port` that takes IPv4 (as mapped addresses) too.
fn dual_stack(addr: std::net::SocketAddr) -> std::io::Result<TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::IPV6, Type::STREAM, Some(Protocol::TCP))?;
    socket.set_only_v6(false)?;
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    TcpListener::from_std(socket.into())
}

/// Whether binding failed because the host has no IPv6 (a kernel without
/// it: EAFNOSUPPORT; no IPv6 address at all: EADDRNOTAVAIL).
fn no_ipv6(e: &std::io::Error) -> bool {
    const EAFNOSUPPORT: i32 = 97;
    e.raw_os_error() == Some(EAFNOSUPPORT) || e.kind() == std::io::ErrorKind::AddrNotAvailable
}

/// How each connection of a listener ends: its [`Lifetime`], the signals
/// of a shutdown (draining: HTTP/1 responses ask the client to close; stop:
/// every connection ends; last call: HTTP/1 connections no request came on
/// are closed), and the count of why each was ended.
#[derive(Clone)]
pub struct Connections {
    pub lifetime: Lifetime,
    draining: CancellationToken,
    stop: CancellationToken,
    last_call: CancellationToken,
    metrics: ConnectionMetrics,
}

/// At most how long after a shutdown stops accepting an HTTP/1 connection
/// waits for one more request to say `Connection: close` on, before it is
/// closed (half the drain period when that is shorter).
const LAST_CALL: Duration = Duration::from_secs(5);

impl Connections {
    pub fn new(lifetime: Lifetime, metrics: &ConnectionMetrics) -> Self {
        Self {
            lifetime,
            draining: CancellationToken::new(),
            stop: CancellationToken::new(),
            last_call: CancellationToken::new(),
            metrics: metrics.clone(),
        }
    }

    /// graceguard is stopping: from now on every HTTP/1 response asks its
    /// client to close the connection, so the API server moves to the
    /// replicas that stay before this one stops accepting (it keeps using a
    /// connection it has, whatever the Service's endpoints say).
    pub fn begin_draining(&self) {
        self.draining.cancel();
    }

    /// A new connection's [`Activity`].
    fn activity(&self) -> Arc<Activity> {
        Activity::new(&self.draining)
    }

    /// Drives `conn` by [`connection_life::run`] (`graceful` starts its
    /// graceful shutdown) and counts why graceguard ended it.
    async fn serve<C, E>(
        &self,
        conn: C,
        graceful: impl FnOnce(std::pin::Pin<&mut C>),
        activity: &Activity,
        protocol: Protocol,
    ) -> Result<(), E>
    where
        C: std::future::Future<Output = Result<(), E>>,
    {
        let spread = spread_for(activity);
        let (res, end) = connection_life::run(
            conn,
            graceful,
            activity,
            protocol,
            self.lifetime,
            spread,
            &self.stop,
            &self.last_call,
        )
        .await;
        if let Some(end) = end {
            self.metrics.ended(end);
        }
        res
    }
}

/// A number in [-1, 1] that differs between connections (from the address
/// of their [`Activity`] and the clock): spreads their age limits.
fn spread_for(activity: &Activity) -> f64 {
    let seed = (activity as *const Activity as usize as u64)
        ^ u64::from(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.subsec_nanos())
                .unwrap_or(0),
        );
    // SplitMix64's finaliser: enough mixing for a spread.
    let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
}

/// Accepts connections on `listener` until `shutdown` turns true, at most
/// `max_connections` open at once (at the cap it stops accepting until one
/// closes, so a flood waits in the kernel's backlog instead of exhausting
/// memory or file descriptors) and, with `per_client`, at most its cap from
/// one address (one past it is closed at once), and hands each to `serve`
/// with its slots, to hold for the connection's life. Then ends every
/// connection gracefully and waits up to `drain` for them to finish.
async fn accept_loop<F, Fut>(
    listener: TcpListener,
    mut shutdown: watch::Receiver<bool>,
    max_connections: usize,
    per_client: Option<Arc<PerClient>>,
    connections: &Connections,
    drain: Duration,
    serve: F,
) where
    F: Fn(tokio::net::TcpStream, std::net::SocketAddr, Slots) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let slots = Arc::new(Semaphore::new(max_connections.max(1)));
    let tracker = TaskTracker::new();
    loop {
        let slot = tokio::select! {
            slot = Arc::clone(&slots).acquire_owned() => match slot {
                Ok(slot) => slot,
                // Never closed; stop serving if it were.
                Err(_) => break,
            },
            _ = shutdown.changed() => break,
        };
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((tcp, peer)) => {
                    // An IPv4 client of a dual-stack listener arrives as
                    // ::ffff:a.b.c.d: count, trust and audit it as a.b.c.d.
                    let peer = std::net::SocketAddr::new(peer.ip().to_canonical(), peer.port());
                    let client = match &per_client {
                        None => None,
                        Some(per) if per.trusts(peer.ip()) => None,
                        Some(per) => match per.admit(peer.ip()) {
                            Some(c) => Some(c),
                            // Past its address's cap: closed at once.
                            None => continue,
                        },
                    };
                    let _ = tcp.set_nodelay(true);
                    tracker.spawn(serve(tcp, peer, Slots { _total: slot, client }));
                }
                Err(e) => {
                    // Typically out of file descriptors: back off a little.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            _ = shutdown.changed() => break,
        }
    }
    drop(listener);
    tracing::info!(
        connections = tracker.len(),
        "stopped accepting; finishing in-flight requests"
    );
    connections.stop.cancel();
    tracker.close();
    let last_call = LAST_CALL.min(drain / 2);
    let finished = tokio::time::timeout(last_call, tracker.wait())
        .await
        .is_ok();
    connections.last_call.cancel();
    if !finished
        && tokio::time::timeout(drain - last_call, tracker.wait())
            .await
            .is_err()
    {
        tracing::warn!(after = ?drain, "connections still open at the end of the drain period; closing them");
    }
}

/// A connection's places in the overall and the per-address counts, given
/// back when the connection ends.
pub struct Slots {
    _total: OwnedSemaphorePermit,
    client: Option<ClientSlot>,
}

impl Slots {
    /// Gives back the per-address place of a connection that proved it is
    /// the API server (its client certificate): the cap never holds it.
    fn release_client(&mut self) {
        self.client = None;
    }
}

/// Serves `router` over TLS on `listener` until `shutdown` turns true, then
/// stops accepting and lets in-flight requests finish (at most `drain`), with
/// at most `max_connections` connections open at once, and `per_client`'s
/// cap from one address (the API server keeps few per webhook; many more
/// means something is wrong).
#[allow(clippy::too_many_arguments)]
pub async fn serve_tls(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    router: Router,
    shutdown: watch::Receiver<bool>,
    drain: Duration,
    max_connections: usize,
    per_client: Arc<PerClient>,
    connections: Connections,
) {
    let acceptor = TlsAcceptor::from(tls);
    accept_loop(
        listener,
        shutdown,
        max_connections,
        Some(Arc::clone(&per_client)),
        &connections.clone(),
        drain,
        move |tcp, peer, mut slot| {
            let acceptor = acceptor.clone();
            let router = router.clone();
            let trusted_address = per_client.trusts(peer.ip());
            let connections = connections.clone();
            async move {
                let stream =
                    match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                        Ok(Ok(s)) => s,
                        Ok(Err(e)) => {
                            tracing::debug!(%peer, error = %e, "TLS handshake failed");
                            return;
                        }
                        Err(_) => {
                            tracing::debug!(%peer, "TLS handshake timed out");
                            return;
                        }
                    };
                // Under mutual TLS a connection that got this far presented a
                // certificate the client CA verified: the API server's.
                let certificate = stream
                    .get_ref()
                    .1
                    .peer_certificates()
                    .and_then(|chain| chain.first());
                let trust = match (trusted_address, certificate) {
                    (_, Some(_)) => Trust::Certificate,
                    (true, None) => Trust::Address,
                    (false, None) => Trust::None,
                };
                if trust == Trust::Certificate {
                    slot.release_client();
                }
                // Each request carries who sent it: the per-address shares,
                // and the audit record's sender (once per connection;
                // connections are long-lived).
                let activity = connections.activity();
                let service = TowerToHyperService::new(
                    router
                        .layer(axum::Extension(Peer {
                            ip: peer.ip(),
                            trust,
                            certificate_name: certificate.and_then(|c| {
                                graceguard_certs::client_auth::names_of(c)
                                    .into_iter()
                                    .next()
                                    .map(Arc::from)
                            }),
                        }))
                        .layer(axum::middleware::from_fn_with_state(
                            Arc::clone(&activity),
                            connection_life::track,
                        )),
                );
                let _slot = slot;
                // ALPN already chose the protocol; serving it directly (rather
                // than sniffing the first bytes) lets HTTP/1's header-read
                // timeout cover a client that never sends anything.
                let h2 = stream.get_ref().1.alpn_protocol() == Some(b"h2".as_slice());
                let io = TokioIo::new(stream);
                let res = if h2 {
                    let conn = http2::Builder::new(TokioExecutor::new())
                        .timer(TokioTimer::new())
                        .keep_alive_interval(Duration::from_secs(30))
                        .keep_alive_timeout(Duration::from_secs(10))
                        .serve_connection(io, service);
                    connections
                        .serve(conn, |c| c.graceful_shutdown(), &activity, Protocol::Http2)
                        .await
                } else {
                    connections
                        .serve(
                            http1_connection(io, service),
                            |c| c.graceful_shutdown(),
                            &activity,
                            Protocol::Http1,
                        )
                        .await
                };
                if let Err(e) = res {
                    tracing::debug!(%peer, error = %e, "connection ended with an error");
                }
            }
        },
    )
    .await
}

/// An HTTP/1.1 connection whose client must send a request's headers within
/// [`HEADER_TIMEOUT`].
fn http1_connection<T>(
    io: TokioIo<T>,
    service: TowerToHyperService<Router>,
) -> http1::Connection<TokioIo<T>, TowerToHyperService<Router>>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .serve_connection(io, service)
}

/// Connections the health listener keeps open at once (probes and scrapes).
const HEALTH_MAX_CONNECTIONS: usize = 64;

/// Serves `router` over plain HTTP/1.1 until `shutdown` turns true: the same
/// header-read and request time limits and a connection cap, so a stuck or
/// hostile client on the health port cannot tie it up (the kubelet's probes
/// use it).
pub async fn serve_plain(
    listener: TcpListener,
    router: Router,
    shutdown: watch::Receiver<bool>,
    connections: Connections,
) {
    let drain = Duration::from_secs(5);
    accept_loop(
        listener,
        shutdown,
        HEALTH_MAX_CONNECTIONS,
        None,
        &connections.clone(),
        drain,
        move |tcp, peer, slot| {
            let activity = connections.activity();
            let service = TowerToHyperService::new(router.clone().layer(
                axum::middleware::from_fn_with_state(Arc::clone(&activity), connection_life::track),
            ));
            let connections = connections.clone();
            async move {
                let _slot = slot;
                if let Err(e) = connections
                    .serve(
                        http1_connection(TokioIo::new(tcp), service),
                        |c| c.graceful_shutdown(),
                        &activity,
                        Protocol::Http1,
                    )
                    .await
                {
                    tracing::debug!(%peer, error = %e, "health connection ended with an error");
                }
            }
        },
    )
    .await
}
