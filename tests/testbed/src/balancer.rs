//! A TCP balancer in front of webhook replicas, standing in for a Service and
//! kube-proxy: each new connection goes to the next backend in turn; a backend
//! that refuses the connection is skipped (its endpoint already removed), while
//! connections already open to a replica that dies are cut, as they are in a
//! cluster. TLS passes through untouched. [`Balancer::ready_only`] stands in
//! for a control plane's load balancer in front of an API server instead.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use futures::future::BoxFuture;
use tokio::net::{TcpListener, TcpStream};

/// Whether a backend is ready for new connections (an API server's `/readyz`).
pub type ReadyCheck = Arc<dyn Fn() -> BoxFuture<'static, bool> + Send + Sync>;

/// A running balancer; stops accepting when dropped.
pub struct Balancer {
    pub addr: SocketAddr,
    accept: tokio::task::JoinHandle<()>,
}

impl Balancer {
    /// Listens on a free loopback port and spreads connections over `backends`.
    pub async fn start(backends: Vec<SocketAddr>) -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .context("binding the balancer")?;
        let addr = listener.local_addr()?;
        let backends = Arc::new(backends);
        let next = Arc::new(AtomicUsize::new(0));
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let (backends, next) = (Arc::clone(&backends), Arc::clone(&next));
                tokio::spawn(async move {
                    let first = next.fetch_add(1, Ordering::Relaxed);
                    for k in 0..backends.len() {
                        let b = backends[(first + k) % backends.len()];
                        if let Ok(mut upstream) = TcpStream::connect(b).await {
                            let mut client = client;
                            let _ = client.set_nodelay(true);
                            let _ = upstream.set_nodelay(true);
                            let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
                            return;
                        }
                    }
                });
            }
        });
        Ok(Self { addr, accept })
    }
}

impl Balancer {
    /// A control plane's load balancer in front of one API server: a new
    /// connection goes to `backend` only once `ready` says so (checked when
    /// the connection arrives, then every 100 ms for up to 120 s; the
    /// connection waits meanwhile), as a health-checked load balancer sends
    /// nothing to an API server still starting, whose authorizer, for one,
    /// has not synced. Connections already open are cut when it stops.
    pub async fn ready_only(backend: SocketAddr, ready: ReadyCheck) -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .context("binding the load balancer")?;
        let addr = listener.local_addr()?;
        let accept = tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let ready = Arc::clone(&ready);
                tokio::spawn(async move {
                    let deadline = Instant::now() + Duration::from_secs(120);
                    while !ready().await {
                        if Instant::now() > deadline {
                            return;
                        }
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    if let Ok(mut upstream) = TcpStream::connect(backend).await {
                        let _ = client.set_nodelay(true);
                        let _ = upstream.set_nodelay(true);
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
                    }
                });
            }
        });
        Ok(Self { addr, accept })
    }
}

impl Drop for Balancer {
    fn drop(&mut self) {
        self.accept.abort();
    }
}
