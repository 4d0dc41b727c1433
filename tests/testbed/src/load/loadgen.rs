//! A TLS load generator for admission endpoints (hyper + rustls): HTTP/2,
//! what kube-apiserver's webhook client negotiates (one connection, many
//! concurrent streams), or HTTP/1.1 keep-alive (one request in flight per
//! connection); and the minimal baseline server it is compared with.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use serde_json::{json, Value};

use super::stats::Stats;

/// The HTTP version the load generator speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    /// HTTP/2 over one connection; each "connection" of a run is a stream slot.
    H2,
    /// HTTP/1.1 keep-alive, one connection per slot.
    Http1,
}

impl Protocol {
    /// The `protocol` field of the benchmark rows.
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::H2 => "h2",
            Protocol::Http1 => "http1",
        }
    }
}

/// Where to send reviews.
#[derive(Clone)]
pub struct Target {
    pub addr: SocketAddr,
    pub path: String,
    pub ca_pem: String,
    pub protocol: Protocol,
}

enum Sender {
    H1(hyper::client::conn::http1::SendRequest<Full<Bytes>>),
    H2(hyper::client::conn::http2::SendRequest<Full<Bytes>>),
}

/// A TLS client trusting `ca_pem` only, presenting `client` (certificate
/// and key, PEM) when given.
pub fn client_config(
    ca_pem: &str,
    client: Option<&graceguard_certs::ServingPair>,
) -> Result<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from_pem_slice(ca_pem.as_bytes()).context("CA PEM")?)?;
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots);
    Ok(match client {
        None => builder.with_no_client_auth(),
        Some(pair) => builder.with_client_auth_cert(
            CertificateDer::pem_slice_iter(pair.cert_pem.as_bytes()).collect::<Result<_, _>>()?,
            rustls::pki_types::PrivateKeyDer::from_pem_slice(pair.key_pem.as_bytes())?,
        )?,
    })
}

/// One new connection (TLS handshake, ALPN for the target's protocol).
async fn connect(t: &Target) -> Result<Sender> {
    let mut cfg = client_config(&t.ca_pem, None)?;
    cfg.alpn_protocols = vec![match t.protocol {
        Protocol::H2 => b"h2".to_vec(),
        Protocol::Http1 => b"http/1.1".to_vec(),
    }];
    let tcp = TcpStream::connect(t.addr)
        .await
        .with_context(|| format!("connecting to {}", t.addr))?;
    tcp.set_nodelay(true)?;
    let tls = TlsConnector::from(Arc::new(cfg))
        .connect(ServerName::try_from("localhost")?.to_owned(), tcp)
        .await?;
    let io = TokioIo::new(tls);
    Ok(match t.protocol {
        Protocol::Http1 => {
            let (sender, conn) = hyper::client::conn::http1::handshake(io).await?;
            tokio::spawn(conn);
            Sender::H1(sender)
        }
        Protocol::H2 => {
            let (sender, conn) =
                hyper::client::conn::http2::handshake(TokioExecutor::new(), io).await?;
            tokio::spawn(conn);
            Sender::H2(sender)
        }
    })
}

/// `n` request slots: `n` HTTP/1.1 connections, or `n` clones of one HTTP/2
/// connection (as the API server multiplexes its calls to one webhook).
async fn connect_slots(t: &Target, n: usize) -> Result<Vec<Sender>> {
    let mut out = Vec::with_capacity(n);
    match t.protocol {
        Protocol::Http1 => {
            for _ in 0..n {
                out.push(connect(t).await?);
            }
        }
        Protocol::H2 => {
            let Sender::H2(one) = connect(t).await? else {
                bail!("an HTTP/2 connect returned an HTTP/1.1 sender");
            };
            out.extend((0..n).map(|_| Sender::H2(one.clone())));
        }
    }
    Ok(out)
}

/// One review round trip; Ok(true) when it was answered 200 with a review.
async fn send(sender: &mut Sender, path: &str, body: Bytes) -> Result<bool> {
    let req = http::Request::post(path).header("content-type", "application/json");
    let resp = match sender {
        Sender::H1(s) => {
            s.ready().await?;
            s.send_request(req.header("host", "localhost").body(Full::new(body))?)
                .await?
        }
        Sender::H2(s) => {
            s.ready().await?;
            let uri = format!("https://localhost{path}");
            s.send_request(req.uri(uri).body(Full::new(body))?).await?
        }
    };
    let ok = resp.status() == 200;
    let body = resp.into_body().collect().await?.to_bytes();
    Ok(ok && body.windows(7).any(|w| w == b"allowed"))
}

/// Closed loop: `connections` connections each send back-to-back for
/// `duration`; `bodies` are used round robin.
pub async fn saturate(
    t: &Target,
    bodies: Arc<Vec<Bytes>>,
    connections: usize,
    duration: Duration,
) -> Result<Stats> {
    let start = Instant::now();
    drive(t, bodies, connections, move |c, k| {
        (start.elapsed() < duration).then_some(c + k * connections)
    })
    .await
}

/// Exactly `n` requests over `connections` connections, each answered before
/// the next is sent on its connection (`bodies` round robin). For tests: it
/// ends when every request is answered, however slow the server.
pub async fn send_n(
    t: &Target,
    bodies: Arc<Vec<Bytes>>,
    n: usize,
    connections: usize,
) -> Result<Stats> {
    drive(t, bodies, connections, move |c, k| {
        let i = c + k * connections;
        (i < n).then_some(i)
    })
    .await
}

/// Runs `connections` connections, each sending back-to-back while
/// `next(connection, k)` names the body of its k-th request; a failed round
/// trip is counted and the connection re-opened.
async fn drive<F>(t: &Target, bodies: Arc<Vec<Bytes>>, connections: usize, next: F) -> Result<Stats>
where
    F: Fn(usize, usize) -> Option<usize> + Clone + Send + 'static,
{
    let senders = connect_slots(t, connections.max(1)).await?;
    let start = Instant::now();
    let mut tasks = Vec::new();
    for (c, mut sender) in senders.into_iter().enumerate() {
        let (t, bodies, next) = (t.clone(), Arc::clone(&bodies), next.clone());
        tasks.push(tokio::spawn(async move {
            let mut stats = Stats::default();
            let mut k = 0;
            while let Some(i) = next(c, k) {
                k += 1;
                let sent = Instant::now();
                match send(&mut sender, &t.path, bodies[i % bodies.len()].clone()).await {
                    Ok(true) => stats.micros.push(sent.elapsed().as_micros() as u64),
                    Ok(false) => stats.errors += 1,
                    Err(_) => {
                        stats.errors += 1;
                        sender = connect(&t).await?;
                    }
                }
            }
            anyhow::Ok(stats)
        }));
    }
    collect(tasks, start).await
}

/// `workers` loops, each sending one review per new connection (a full TLS
/// handshake every time) until `duration` has passed: what a certificate
/// rotation must not break. A failed connect counts as an error.
pub async fn handshake_each(
    t: &Target,
    bodies: Arc<Vec<Bytes>>,
    workers: usize,
    duration: Duration,
) -> Result<Stats> {
    let start = Instant::now();
    let mut tasks = Vec::new();
    for w in 0..workers.max(1) {
        let (t, bodies) = (t.clone(), Arc::clone(&bodies));
        tasks.push(tokio::spawn(async move {
            let mut stats = Stats::default();
            let mut i = w;
            while start.elapsed() < duration {
                let sent = Instant::now();
                let ok = match connect(&t).await {
                    Ok(mut sender) => send(&mut sender, &t.path, bodies[i % bodies.len()].clone())
                        .await
                        .unwrap_or(false),
                    Err(_) => false,
                };
                match ok {
                    true => stats.micros.push(sent.elapsed().as_micros() as u64),
                    false => stats.errors += 1,
                }
                i += workers;
            }
            anyhow::Ok(stats)
        }));
    }
    collect(tasks, start).await
}

/// Open loop: `rate` requests per second spread over `connections`, for
/// `duration`. Latency is measured from the actual send; sends more than 1 ms
/// behind their slot are counted as `late_sends`.
pub async fn fixed_rate(
    t: &Target,
    bodies: Arc<Vec<Bytes>>,
    rate: u32,
    connections: usize,
    duration: Duration,
) -> Result<Stats> {
    let total = (f64::from(rate) * duration.as_secs_f64()) as usize;
    let interval = Duration::from_secs_f64(1.0 / f64::from(rate.max(1)));
    // Connect first, so handshakes are not measured.
    let senders = connect_slots(t, connections.max(1)).await?;
    let connections = senders.len();
    let start = Instant::now() + Duration::from_millis(50);
    let mut tasks = Vec::new();
    for (c, mut sender) in senders.into_iter().enumerate() {
        let (t, bodies) = (t.clone(), Arc::clone(&bodies));
        tasks.push(tokio::spawn(async move {
            let mut stats = Stats::default();
            let mut i = c;
            while i < total {
                let slot = start + interval * i as u32;
                tokio::time::sleep_until(slot.into()).await;
                let sent = Instant::now();
                if sent.duration_since(slot) > Duration::from_millis(1) {
                    stats.late_sends += 1;
                }
                match send(&mut sender, &t.path, bodies[i % bodies.len()].clone()).await {
                    Ok(true) => stats.micros.push(sent.elapsed().as_micros() as u64),
                    _ => stats.errors += 1,
                }
                i += connections;
            }
            anyhow::Ok(stats)
        }));
    }
    collect(tasks, start).await
}

async fn collect(
    tasks: Vec<tokio::task::JoinHandle<Result<Stats>>>,
    start: Instant,
) -> Result<Stats> {
    let mut all = Stats::default();
    for task in tasks {
        all.merge(task.await??);
    }
    all.seconds = start.elapsed().as_secs_f64();
    if all.micros.is_empty() {
        bail!("no request succeeded ({} errors)", all.errors);
    }
    Ok(all)
}

/// The baseline: a minimal hyper + rustls server (graceguard's own TLS
/// configuration) that reads each request body and answers "allowed", with
/// the request's `uid` (the API server refuses a v1 response whose uid is not
/// the request's, and would fail open on every call: an error path, not the
/// floor). Whatever graceguard costs beyond this is its own work.
///
/// With `tag_inline`, the floor also answers `/mutate/pods-status` with the
/// tags graceguard's tagger wrote in admission until it stopped changing
/// running pods ([`tag_inline`]): the experiment that shows what such a
/// patch costs a preemption, apart from anything else graceguard does.
pub async fn serve_baseline(
    listen: SocketAddr,
    cert: &std::path::Path,
    key: &std::path::Path,
    tag_inline: bool,
) -> Result<()> {
    graceguard_certs::install_crypto_provider();
    let resolver = graceguard_certs::ReloadingResolver::from_files(cert, key)?;
    let tls = Arc::new(graceguard_certs::server_config(resolver, None)?);
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let listener = tokio::net::TcpListener::bind(listen).await?;
    loop {
        let (tcp, _) = listener.accept().await?;
        let _ = tcp.set_nodelay(true);
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            let Ok(stream) = acceptor.accept(tcp).await else {
                return;
            };
            let svc = hyper::service::service_fn(
                move |req: http::Request<hyper::body::Incoming>| async move {
                    let tag = tag_inline && req.uri().path() == "/mutate/pods-status";
                    let body = req
                        .into_body()
                        .collect()
                        .await
                        .map(|b| b.to_bytes())
                        .unwrap_or_default();
                    Ok::<_, std::convert::Infallible>(
                        http::Response::builder()
                            .header("content-type", "application/json")
                            .body(Full::new(Bytes::from(if tag {
                                self::tag_inline(&body)
                            } else {
                                allow(&body)
                            })))
                            .unwrap_or_default(),
                    )
                },
            );
            let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

/// Just what the baseline reads of a review: the request's uid.
#[derive(serde::Deserialize)]
struct UidOnly<'a> {
    #[serde(borrow)]
    request: Option<RequestUid<'a>>,
}

#[derive(serde::Deserialize)]
struct RequestUid<'a> {
    #[serde(borrow)]
    uid: std::borrow::Cow<'a, str>,
}

/// The baseline's answer to review `body`: allowed, with its uid (empty when
/// the body is no review, which the API server never sends).
pub fn allow(body: &[u8]) -> Vec<u8> {
    let uid = serde_json::from_slice::<UidOnly>(body)
        .ok()
        .and_then(|r| r.request)
        .map(|r| r.uid.into_owned())
        .unwrap_or_default();
    serde_json::to_vec(
        &json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "response": {"uid": uid, "allowed": true}}),
    )
    .unwrap_or_default()
}

/// The answer graceguard's tagger gave before it stopped changing running
/// pods: for a status update carrying an untagged `DisruptionTarget`, the
/// JSONPatch of its tags, whatever the pod's state; otherwise [`allow`].
pub fn tag_inline(body: &[u8]) -> Vec<u8> {
    use graceguard_webhook::{disruption, review, tagger};
    let patch = review::parse(body).ok().and_then(|req| {
        let pod = req.object.as_ref()?;
        let d = disruption::of_pod(pod)?;
        let patch = tagger::patch_for(&pod.metadata, &d)?;
        Some((req.uid.clone(), serde_json::to_vec(&patch).ok()?))
    });
    let Some((uid, patch)) = patch else {
        return allow(body);
    };
    serde_json::to_vec(
        &json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "response": {"uid": uid, "allowed": true, "patchType": "JSONPatch",
            "patch": k8s_openapi::ByteString(patch)}}),
    )
    .unwrap_or_default()
}

/// 1,000 pod-Create reviews shaped like the API server's (the captured v1.20
/// fixture, ~4 KB) in namespace `bench-index`: 99% free names, 1% the names
/// of indexed pods `idx-N` (N below `indexed`).
pub fn review_bodies(indexed: usize) -> Result<Vec<Bytes>> {
    let template: Value = serde_json::from_str(include_str!(
        "../../../../webhook/tests/fixtures/01-create-pods.json"
    ))?;
    let mut out = Vec::with_capacity(1000);
    for i in 0..1000usize {
        let name = if i % 100 == 0 {
            format!("idx-{}", (i / 100 * 7) % indexed.max(1))
        } else {
            format!("bench-free-{i}")
        };
        let mut v = template.clone();
        v["request"]["uid"] = json!(format!("00000000-0000-0000-0000-{i:012}"));
        v["request"]["name"] = json!(name);
        v["request"]["namespace"] = json!("bench-index");
        v["request"]["object"]["metadata"]["name"] = json!(name);
        v["request"]["object"]["metadata"]["namespace"] = json!("bench-index");
        out.push(Bytes::from(serde_json::to_vec(&v)?));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_baseline_answers_with_the_request_uid() {
        let review = br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"705ab4f5-6393-11e8-b7cc-42010a800002","kind":{"group":"","version":"v1","kind":"Pod"},"object":{"metadata":{"name":"p"}}}}"#;
        let answer: Value = serde_json::from_slice(&allow(review)).unwrap_or_default();
        assert_eq!(
            answer["response"]["uid"],
            "705ab4f5-6393-11e8-b7cc-42010a800002"
        );
        assert_eq!(answer["response"]["allowed"], true);
        let junk: Value = serde_json::from_slice(&allow(b"not json")).unwrap_or_default();
        assert_eq!(junk["response"]["uid"], "");
    }
}
