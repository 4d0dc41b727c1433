//! An attacker on the admission port, for `scripts/reliability`'s
//! `port_attack` group: what any pod that reaches port 8443 could do.
//! * slow clients, from several addresses: each opens TLS connections,
//!   sends a request's headers announcing a 4 MiB body, then one byte a
//!   second, and opens a new connection whenever the server closes one;
//! * a flood from one address: many connections sending large bodies as
//!   fast as they are answered.
//!
//! It runs in a process of its own (the reliability binary's `--attack`
//! mode) and prints one JSON report.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use http_body_util::Full;
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

/// What to attack, and how hard.
#[derive(Clone, Debug)]
pub struct Attack {
    pub target: SocketAddr,
    pub ca_pem: String,
    pub duration: Duration,
    /// Source addresses of the slow clients, and connections kept per address.
    pub slow_from: Vec<IpAddr>,
    pub slow_per_address: usize,
    /// Source address of the flood, its connections, and each body's size.
    pub flood_from: IpAddr,
    pub flood_connections: usize,
    pub flood_body_bytes: usize,
}

/// What the attacker saw.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct AttackReport {
    pub slow_connections_opened: u64,
    /// Slow connections the server closed (at its per-address cap, or when
    /// the body did not arrive in time).
    pub slow_connections_closed_by_server: u64,
    /// The flood's requests by answer ("503", "400", ..., "closed").
    pub flood_answers: BTreeMap<String, u64>,
    pub connect_errors: u64,
}

fn tls_config(ca_pem: &str) -> Result<Arc<rustls::ClientConfig>> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from_pem_slice(ca_pem.as_bytes()).context("CA PEM")?)?;
    let mut cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

/// A TLS connection to `to` from source address `from`.
async fn connect(
    from: IpAddr,
    to: SocketAddr,
    tls: &Arc<rustls::ClientConfig>,
) -> Result<TlsStream<TcpStream>> {
    let socket = match from {
        IpAddr::V4(_) => TcpSocket::new_v4()?,
        IpAddr::V6(_) => TcpSocket::new_v6()?,
    };
    socket.bind(SocketAddr::new(from, 0))?;
    let tcp = socket.connect(to).await?;
    Ok(TlsConnector::from(Arc::clone(tls))
        .connect(ServerName::try_from("localhost")?.to_owned(), tcp)
        .await?)
}

/// One slow client's connection: headers, then a byte a second until the
/// server closes it or the attack ends. True when the server closed it.
async fn trickle(mut s: TlsStream<TcpStream>, until: Instant, body_bytes: usize) -> bool {
    let head = format!(
        "POST /validate/pods HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: {body_bytes}\r\n\r\n"
    );
    if s.write_all(head.as_bytes()).await.is_err() {
        return true;
    }
    let mut buf = [0u8; 512];
    while Instant::now() < until {
        if s.write_all(b" ").await.is_err() || s.flush().await.is_err() {
            return true;
        }
        // Any answer (a 408) or EOF means the server is done with us.
        match tokio::time::timeout(Duration::from_secs(1), s.read(&mut buf)).await {
            Ok(Ok(_)) | Ok(Err(_)) => return true,
            Err(_) => {}
        }
    }
    false
}

/// Runs the attack for its duration.
pub async fn run(a: Attack) -> Result<AttackReport> {
    let tls = tls_config(&a.ca_pem)?;
    let until = Instant::now() + a.duration;
    let opened = Arc::new(AtomicU64::new(0));
    let closed = Arc::new(AtomicU64::new(0));
    let connect_errors = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for &from in &a.slow_from {
        for _ in 0..a.slow_per_address {
            let (tls, opened, closed, errors) = (
                Arc::clone(&tls),
                Arc::clone(&opened),
                Arc::clone(&closed),
                Arc::clone(&connect_errors),
            );
            let (target, body) = (a.target, a.flood_body_bytes.max(4 * 1024 * 1024));
            tasks.push(tokio::spawn(async move {
                while Instant::now() < until {
                    match connect(from, target, &tls).await {
                        Ok(s) => {
                            opened.fetch_add(1, Ordering::Relaxed);
                            if trickle(s, until, body).await {
                                closed.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        Err(_) => {
                            // Closed before or during the handshake (the cap).
                            errors.fetch_add(1, Ordering::Relaxed);
                            closed.fetch_add(1, Ordering::Relaxed);
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                    }
                }
            }));
        }
    }
    let answers = Arc::new(std::sync::Mutex::new(BTreeMap::<String, u64>::new()));
    let body = Bytes::from(
        format!(
            "{{\"apiVersion\":\"admission.k8s.io/v1\",\"kind\":\"AdmissionReview\",\"filler\":\"{}\"}}",
            "x".repeat(a.flood_body_bytes)
        )
        .into_bytes(),
    );
    for _ in 0..a.flood_connections {
        let (tls, answers, errors, body) = (
            Arc::clone(&tls),
            Arc::clone(&answers),
            Arc::clone(&connect_errors),
            body.clone(),
        );
        let (from, target) = (a.flood_from, a.target);
        tasks.push(tokio::spawn(async move {
            while Instant::now() < until {
                let Ok(s) = connect(from, target, &tls).await else {
                    errors.fetch_add(1, Ordering::Relaxed);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                };
                let Ok((mut sender, conn)) =
                    hyper::client::conn::http1::handshake(TokioIo::new(s)).await
                else {
                    continue;
                };
                tokio::spawn(conn);
                while Instant::now() < until {
                    let req = http::Request::post("/validate/pods")
                        .header("host", "localhost")
                        .header("content-type", "application/json")
                        .body(Full::new(body.clone()));
                    let Ok(req) = req else { break };
                    let answer = match sender.send_request(req).await {
                        Ok(resp) => resp.status().as_u16().to_string(),
                        Err(_) => "closed".to_string(),
                    };
                    let done = answer == "closed";
                    *answers
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .entry(answer)
                        .or_default() += 1;
                    if done {
                        break;
                    }
                }
            }
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    let flood_answers = answers.lock().unwrap_or_else(|p| p.into_inner()).clone();
    Ok(AttackReport {
        slow_connections_opened: opened.load(Ordering::Relaxed),
        slow_connections_closed_by_server: closed.load(Ordering::Relaxed),
        flood_answers,
        connect_errors: connect_errors.load(Ordering::Relaxed),
    })
}
