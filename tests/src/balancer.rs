//! A TCP balancer in front of webhook replicas, standing in for a Service and
//! kube-proxy: each new connection goes to the next backend in turn; a backend
//! that refuses the connection is skipped (its endpoint already removed), while
//! connections already open to a replica that dies are cut, as they are in a
//! cluster. TLS passes through untouched.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use anyhow::{Context, Result};
use tokio::net::{TcpListener, TcpStream};

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

impl Drop for Balancer {
    fn drop(&mut self) {
        self.accept.abort();
    }
}
