//! A TCP proxy in front of the API server whose open connections can be
//! frozen: after [`StallingProxy::stall`], every connection open at that
//! moment stays open but passes no byte either way, as when a load balancer
//! or a NAT entry silently drops a long-lived connection. Connections opened
//! after it pass normally. TLS passes through untouched.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use anyhow::{Context, Result};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// A running proxy; its connections end when it is dropped.
pub struct StallingProxy {
    pub addr: SocketAddr,
    generation: watch::Sender<u64>,
    frozen: Arc<AtomicUsize>,
    tasks: Arc<std::sync::Mutex<tokio::task::JoinSet<()>>>,
    accept: tokio::task::JoinHandle<()>,
}

impl StallingProxy {
    /// Listens on a free loopback port and forwards each connection to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .context("binding the stalling proxy")?;
        let addr = listener.local_addr()?;
        let (generation, _) = watch::channel(0u64);
        let frozen = Arc::new(AtomicUsize::new(0));
        let tasks = Arc::new(std::sync::Mutex::new(tokio::task::JoinSet::new()));
        let accept = {
            let (generation, frozen, tasks) = (generation.clone(), frozen.clone(), tasks.clone());
            tokio::spawn(async move {
                while let Ok((mut client, _)) = listener.accept().await {
                    let mut stalls = generation.subscribe();
                    let born = *stalls.borrow_and_update();
                    let frozen = frozen.clone();
                    let conn = async move {
                        let Ok(mut server) = TcpStream::connect(upstream).await else {
                            return;
                        };
                        let _ = client.set_nodelay(true);
                        let _ = server.set_nodelay(true);
                        tokio::select! {
                            _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
                            _ = async { stalls.wait_for(|g| *g > born).await.map(|_| ()) } => {
                                // Frozen: both ends stay open, nothing moves,
                                // until the proxy is dropped.
                                frozen.fetch_add(1, Ordering::SeqCst);
                                std::future::pending::<()>().await;
                            }
                        }
                    };
                    if let Ok(mut set) = tasks.lock() {
                        set.spawn(conn);
                        // Reap the finished ones as we go.
                        while set.try_join_next().is_some() {}
                    }
                }
            })
        };
        Ok(Self {
            addr,
            generation,
            frozen,
            tasks,
            accept,
        })
    }

    /// Freezes every connection open now; returns how many were frozen.
    pub async fn stall(&self) -> usize {
        let before = self.frozen.load(Ordering::SeqCst);
        self.generation.send_modify(|g| *g += 1);
        // The connections' tasks notice at their next poll.
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        self.frozen.load(Ordering::SeqCst) - before
    }

    /// `https://ADDR`, the URL a client uses instead of the API server's.
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }
}

impl Drop for StallingProxy {
    fn drop(&mut self) {
        self.accept.abort();
        if let Ok(mut set) = self.tasks.lock() {
            set.abort_all();
        }
    }
}
