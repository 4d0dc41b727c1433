//! Where the API is served: a Unix socket only its owner can reach, or
//! loopback TCP with a bearer token.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use super::{metrics_router, router, Sidecar};

/// Why the sidecar could not listen or serve: each names the socket or
/// address and what to do about it.
#[derive(Debug, thiserror::Error)]
pub enum ListenError {
    #[error("{} exists and is not a socket; graceguard does not remove it: choose another --socket or remove it yourself", .0.display())]
    NotASocket(PathBuf),
    #[error("{} is in use by a running process (another sidecar?); stop it or choose another --socket", .0.display())]
    SocketInUse(PathBuf),
    /// A step of binding the socket failed (`step` says which).
    #[error("cannot {step} {}: {source}", path.display())]
    Socket {
        step: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("--listen {0} is not a loopback address: the API is for the executor in the same pod or host; listen on 127.0.0.1 or [::1] (or use --socket)")]
    NotLoopback(SocketAddr),
    #[error("cannot listen on {flag} {addr}: {source}; choose a free port")]
    Bind {
        flag: &'static str,
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    /// The server stopped with an error after it had started.
    #[error("serving on {at}: {source}")]
    Serve {
        at: String,
        #[source]
        source: std::io::Error,
    },
}

fn socket_step(step: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> ListenError {
    let path = path.to_path_buf();
    move |source| ListenError::Socket { step, path, source }
}

/// Where the sidecar listens.
#[derive(Clone, Debug)]
pub enum Listen {
    /// A Unix socket (mode 0600): only the executor's user can reach it.
    Socket(PathBuf),
    /// Loopback TCP; every /v1 request needs the bearer token.
    Tcp(SocketAddr),
}

/// Binds a Unix socket at `path`, reachable by its owner only from the
/// start: it is bound inside a fresh directory of mode 0700, given mode
/// 0600, and only then renamed to `path`. A socket left there by a killed
/// sidecar (nothing accepts on it) is replaced; a live one is an error, and
/// so is anything at `path` that is not a socket (it is never removed).
pub async fn bind_socket(path: &Path) -> Result<tokio::net::UnixListener, ListenError> {
    use std::os::unix::fs::{DirBuilderExt, FileTypeExt, PermissionsExt};
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(ListenError::NotASocket(path.to_path_buf()));
        }
        if tokio::net::UnixStream::connect(path).await.is_ok() {
            return Err(ListenError::SocketInUse(path.to_path_buf()));
        }
    }
    let dir = path.parent().unwrap_or(Path::new("."));
    let private = dir.join(format!(".graceguard-{:016x}", fastrand::u64(..)));
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&private)
        .map_err(socket_step(
            "create a private directory to bind in:",
            &private,
        ))?;
    let inner = private.join("socket");
    let bound = (|| {
        let l = std::os::unix::net::UnixListener::bind(&inner)
            .map_err(socket_step("listen on", path))?;
        std::fs::set_permissions(&inner, std::fs::Permissions::from_mode(0o600))
            .map_err(socket_step("restrict to its owner", path))?;
        // Replaces a stale socket in one step.
        std::fs::rename(&inner, path).map_err(socket_step("move the socket to", path))?;
        l.set_nonblocking(true).map_err(socket_step("use", path))?;
        tokio::net::UnixListener::from_std(l).map_err(socket_step("use", path))
    })();
    let _ = std::fs::remove_file(&inner);
    let _ = std::fs::remove_dir(&private);
    bound
}

/// Serves the API on `listen` until `shutdown` resolves (in-flight requests
/// finish; long polls end at their wait).
pub async fn serve(
    listen: Listen,
    sidecar: Sidecar,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), ListenError> {
    let app = router(sidecar);
    match listen {
        Listen::Socket(path) => {
            let l = bind_socket(&path).await?;
            tracing::info!(socket = %path.display(), "sidecar listening");
            let r = axum::serve(l, app).with_graceful_shutdown(shutdown).await;
            let _ = std::fs::remove_file(&path);
            r.map_err(|source| ListenError::Serve {
                at: path.display().to_string(),
                source,
            })
        }
        Listen::Tcp(addr) => {
            if !addr.ip().is_loopback() {
                return Err(ListenError::NotLoopback(addr));
            }
            let l = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|source| ListenError::Bind {
                    flag: "--listen",
                    addr,
                    source,
                })?;
            tracing::info!(%addr, "sidecar listening");
            axum::serve(l, app)
                .with_graceful_shutdown(shutdown)
                .await
                .map_err(|source| ListenError::Serve {
                    at: addr.to_string(),
                    source,
                })
        }
    }
}

/// Serves `/metrics` and `/healthz` on `addr` (any address: they name no
/// task and change nothing) until `shutdown` resolves. Bound before it
/// returns the future, so a port in use is an error at start.
pub async fn serve_metrics(
    addr: SocketAddr,
    sidecar: Sidecar,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<impl std::future::Future<Output = Result<(), ListenError>>, ListenError> {
    let l = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|source| ListenError::Bind {
            flag: "--metrics-listen",
            addr,
            source,
        })?;
    tracing::info!(%addr, "sidecar metrics listening");
    let app = metrics_router(sidecar);
    Ok(async move {
        axum::serve(l, app)
            .with_graceful_shutdown(shutdown)
            .await
            .map_err(|source| ListenError::Serve {
                at: format!("{addr} (metrics)"),
                source,
            })
    })
}
