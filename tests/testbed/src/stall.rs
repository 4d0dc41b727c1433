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

/// A TCP proxy in front of the API server that can hold every byte: after
/// [`HoldingProxy::hold`] nothing it reads is passed on, on open connections
/// and on new ones alike, until [`HoldingProxy::release`] delivers it all,
/// late and in order. A request sent during the hold reaches the API server
/// only then: the late write of a paused VM or a stalled network path.
pub struct HoldingProxy {
    pub addr: SocketAddr,
    open: watch::Sender<bool>,
    tasks: Arc<std::sync::Mutex<tokio::task::JoinSet<()>>>,
    accept: tokio::task::JoinHandle<()>,
}

/// Copies `from` to `to` chunk by chunk; a chunk read while the gate is
/// closed waits for it to open before it is written.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut gate: watch::Receiver<bool>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if gate.wait_for(|open| *open).await.is_err() {
            break;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
    let _ = to.shutdown().await;
}

impl HoldingProxy {
    /// Listens on a free loopback port and forwards each connection to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .context("binding the holding proxy")?;
        let addr = listener.local_addr()?;
        let (open, _) = watch::channel(true);
        let tasks = Arc::new(std::sync::Mutex::new(tokio::task::JoinSet::new()));
        let accept = {
            let (open, tasks) = (open.clone(), tasks.clone());
            tokio::spawn(async move {
                while let Ok((client, _)) = listener.accept().await {
                    let (up_gate, down_gate) = (open.subscribe(), open.subscribe());
                    let conn = async move {
                        let Ok(server) = TcpStream::connect(upstream).await else {
                            return;
                        };
                        let _ = client.set_nodelay(true);
                        let _ = server.set_nodelay(true);
                        let (cr, cw) = client.into_split();
                        let (sr, sw) = server.into_split();
                        tokio::join!(pump(cr, sw, up_gate), pump(sr, cw, down_gate));
                    };
                    if let Ok(mut set) = tasks.lock() {
                        set.spawn(conn);
                        while set.try_join_next().is_some() {}
                    }
                }
            })
        };
        Ok(Self {
            addr,
            open,
            tasks,
            accept,
        })
    }

    /// Holds every byte from now on, both ways.
    pub fn hold(&self) {
        self.open.send_replace(false);
    }

    /// Delivers what was held, and passes bytes again.
    pub fn release(&self) {
        self.open.send_replace(true);
    }

    /// `https://ADDR`, the URL a client uses instead of the API server's.
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }
}

impl Drop for HoldingProxy {
    fn drop(&mut self) {
        self.accept.abort();
        if let Ok(mut set) = self.tasks.lock() {
            set.abort_all();
        }
    }
}
