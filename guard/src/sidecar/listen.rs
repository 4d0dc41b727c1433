//! Where the API is served: a Unix socket only its owner can reach, or
//! loopback TCP with a bearer token.

use super::{metrics_router, router, Sidecar};

/// Where the sidecar listens.
#[derive(Clone, Debug)]
pub enum Listen {
    /// A Unix socket (mode 0600): only the executor's user can reach it.
    Socket(std::path::PathBuf),
    /// Loopback TCP; every /v1 request needs the bearer token.
    Tcp(std::net::SocketAddr),
}

/// Binds a Unix socket at `path`, reachable by its owner only from the
/// start: it is bound inside a fresh directory of mode 0700, given mode
/// 0600, and only then renamed to `path`. A socket left there by a killed
/// sidecar (nothing accepts on it) is replaced; a live one is an error, and
/// so is anything at `path` that is not a socket (it is never removed).
pub async fn bind_socket(path: &std::path::Path) -> Result<tokio::net::UnixListener, String> {
    use std::os::unix::fs::{DirBuilderExt, FileTypeExt, PermissionsExt};
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(format!(
                "{} exists and is not a socket; graceguard does not remove it: choose another --socket or remove it yourself",
                path.display()
            ));
        }
        if tokio::net::UnixStream::connect(path).await.is_ok() {
            return Err(format!(
                "{} is in use by a running process (another sidecar?); stop it or choose another --socket",
                path.display()
            ));
        }
    }
    let dir = path.parent().unwrap_or(std::path::Path::new("."));
    let private = dir.join(format!(".graceguard-{:016x}", fastrand::u64(..)));
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&private)
        .map_err(|e| {
            format!(
                "cannot create {} to bind the socket in: {e}",
                private.display()
            )
        })?;
    let inner = private.join("socket");
    let bound = (|| {
        let l = std::os::unix::net::UnixListener::bind(&inner)
            .map_err(|e| format!("cannot listen on {}: {e}", path.display()))?;
        std::fs::set_permissions(&inner, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| format!("cannot restrict {} to its owner: {e}", path.display()))?;
        // Replaces a stale socket in one step.
        std::fs::rename(&inner, path)
            .map_err(|e| format!("cannot move the socket to {}: {e}", path.display()))?;
        l.set_nonblocking(true)
            .map_err(|e| format!("cannot use {}: {e}", path.display()))?;
        tokio::net::UnixListener::from_std(l)
            .map_err(|e| format!("cannot use {}: {e}", path.display()))
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
) -> Result<(), String> {
    let app = router(sidecar);
    match listen {
        Listen::Socket(path) => {
            let l = bind_socket(&path).await?;
            tracing::info!(socket = %path.display(), "sidecar listening");
            let r = axum::serve(l, app).with_graceful_shutdown(shutdown).await;
            let _ = std::fs::remove_file(&path);
            r.map_err(|e| format!("serving on {}: {e}", path.display()))
        }
        Listen::Tcp(addr) => {
            if !addr.ip().is_loopback() {
                return Err(format!(
                    "--listen {addr} is not a loopback address: the API is for the executor in the same pod or host; listen on 127.0.0.1 or [::1] (or use --socket)"
                ));
            }
            let l = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
            tracing::info!(%addr, "sidecar listening");
            axum::serve(l, app)
                .with_graceful_shutdown(shutdown)
                .await
                .map_err(|e| format!("serving on {addr}: {e}"))
        }
    }
}

/// Serves `/metrics` and `/healthz` on `addr` (any address: they name no
/// task and change nothing) until `shutdown` resolves. Bound before it
/// returns the future, so a port in use is an error at start.
pub async fn serve_metrics(
    addr: std::net::SocketAddr,
    sidecar: Sidecar,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<impl std::future::Future<Output = Result<(), String>>, String> {
    let l = tokio::net::TcpListener::bind(addr).await.map_err(|e| {
        format!("cannot listen on --metrics-listen {addr}: {e}; choose a free port")
    })?;
    tracing::info!(%addr, "sidecar metrics listening");
    let app = metrics_router(sidecar);
    Ok(async move {
        axum::serve(l, app)
            .with_graceful_shutdown(shutdown)
            .await
            .map_err(|e| format!("serving metrics on {addr}: {e}"))
    })
}
