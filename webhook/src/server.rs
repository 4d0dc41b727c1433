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
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;
use tower::ServiceBuilder;

use crate::handlers::{self, App};

/// How long a client may take to finish the TLS handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a client may take to send a request's headers.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long one request may take, body included (the API server itself gives
/// up after the webhook's timeoutSeconds, at most 30 s).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// The admission routes, with a request body limit (pods can be large) and a
/// time limit, so a slow or silent client cannot hold a connection forever.
pub fn admission_router(app: Arc<App>, max_body_bytes: usize) -> Router {
    Router::new()
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
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .layer(
            ServiceBuilder::new()
                .layer(HandleErrorLayer::new(|_: BoxError| async {
                    (
                        StatusCode::REQUEST_TIMEOUT,
                        "the request took longer than 30 s",
                    )
                }))
                .timeout(REQUEST_TIMEOUT),
        )
        .with_state(app)
}

#[derive(Clone)]
struct Health {
    app: Arc<App>,
    registry: Arc<Registry>,
}

/// `/healthz`, `/readyz` and `/metrics`.
pub fn health_router(app: Arc<App>, registry: Arc<Registry>) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(Health { app, registry })
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
        let counter = &h.app.metrics.audit_records_dropped;
        let now = u64::try_from(dropped.dropped_lines()).unwrap_or(u64::MAX);
        counter.inc_by(now.saturating_sub(counter.get()));
    }
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        crate::metrics::render(&h.registry),
    )
}

/// Serves `router` over TLS on `listener` until `shutdown` turns true, then
/// stops accepting and lets in-flight requests finish (at most `drain`).
pub async fn serve_tls(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    router: Router,
    mut shutdown: watch::Receiver<bool>,
    drain: Duration,
) {
    let acceptor = TlsAcceptor::from(tls);
    let graceful = GracefulShutdown::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let (tcp, peer) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        // Typically out of file descriptors: back off a little.
                        tracing::warn!(error = %e, "accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let _ = tcp.set_nodelay(true);
                let acceptor = acceptor.clone();
                let service = TowerToHyperService::new(router.clone());
                let watcher = graceful.watcher();
                tokio::spawn(async move {
                    let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
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
                        watcher.watch(conn).await
                    } else {
                        let conn = http1::Builder::new()
                            .timer(TokioTimer::new())
                            .header_read_timeout(HEADER_TIMEOUT)
                            .serve_connection(io, service);
                        watcher.watch(conn).await
                    };
                    if let Err(e) = res {
                        tracing::debug!(%peer, error = %e, "connection ended with an error");
                    }
                });
            }
            _ = shutdown.changed() => break,
        }
    }
    drop(listener);
    tracing::info!(
        connections = graceful.count(),
        "stopped accepting; finishing in-flight reviews"
    );
    if tokio::time::timeout(drain, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(after = ?drain, "connections still open at the end of the drain period; closing them");
    }
}

/// Serves `router` over plain HTTP until `shutdown` turns true.
pub async fn serve_plain(
    listener: TcpListener,
    router: Router,
    mut shutdown: watch::Receiver<bool>,
) {
    let res = axum::serve(listener, router)
        .with_graceful_shutdown(async move {
            let _ = shutdown.changed().await;
        })
        .await;
    if let Err(e) = res {
        tracing::error!(error = %e, "health listener failed");
    }
}
