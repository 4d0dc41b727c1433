//! The HTTPS listener: TLS versions, certificate rotation without dropping
//! live connections, and graceful shutdown that finishes in-flight requests.

use std::sync::Arc;
use std::time::Duration;

use axum::routing::get;
use axum::Router;
use graceguard_certs::{Ca, ReloadingResolver};
use graceguard_webhook::server::serve_tls;
use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::RootCertStore;
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio_rustls::TlsConnector;

struct Server {
    addr: std::net::SocketAddr,
    resolver: Arc<ReloadingResolver>,
    dir: tempfile::TempDir,
    ca: Ca,
    stop: watch::Sender<bool>,
    done: tokio::task::JoinHandle<()>,
    connections: graceguard_webhook::server::Connections,
}

fn write_pair(ca: &Ca, dir: &std::path::Path) {
    let pair = ca
        .issue_server(
            &["localhost".into()],
            &["127.0.0.1".parse().expect("ip"), "::1".parse().expect("ip")],
        )
        .expect("pair");
    ca.write_files(&pair, dir).expect("write");
}

async fn start() -> Server {
    start_capped(1024, 1024).await
}

async fn start_capped(max_connections: usize, per_client: usize) -> Server {
    start_trusting(max_connections, per_client, &[]).await
}

async fn start_trusting(max_connections: usize, per_client: usize, trusted: &[&str]) -> Server {
    start_on("127.0.0.1:0", max_connections, per_client, trusted).await
}

async fn start_on(
    listen: &str,
    max_connections: usize,
    per_client: usize,
    trusted: &[&str],
) -> Server {
    graceguard_certs::install_crypto_provider();
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = Ca::new("tls-test-ca").expect("ca");
    write_pair(&ca, dir.path());
    let resolver =
        ReloadingResolver::from_files(&dir.path().join("tls.crt"), &dir.path().join("tls.key"))
            .expect("load");
    let cfg = graceguard_certs::server_config(resolver.clone(), None).expect("config");
    let router = Router::new()
        .route("/fast", get(|| async { "fast" }))
        .route(
            "/slow",
            get(|| async {
                tokio::time::sleep(Duration::from_millis(700)).await;
                "slow"
            }),
        );
    let listener = graceguard_webhook::server::bind(listen.parse().expect("listen address"))
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (stop, rx) = watch::channel(false);
    let connections = graceguard_webhook::server::Connections::new(
        graceguard_webhook::connection_life::Lifetime::UNBOUNDED,
        &graceguard_webhook::connection_life::ConnectionMetrics::default(),
    );
    let done = tokio::spawn(serve_tls(
        listener,
        Arc::new(cfg),
        router,
        rx,
        Duration::from_secs(5),
        max_connections,
        graceguard_webhook::limits::PerClient::new(
            per_client,
            graceguard_webhook::limits::TrustedPeers::new(
                trusted
                    .iter()
                    .map(|t| graceguard_webhook::limits::parse_trusted_peer(t).expect("cidr"))
                    .collect(),
            ),
            &graceguard_webhook::limits::LimitMetrics::default(),
        ),
        connections.clone(),
    ));
    Server {
        addr,
        resolver,
        dir,
        ca,
        stop,
        done,
        connections,
    }
}

type Sender = hyper::client::conn::http1::SendRequest<Empty<Bytes>>;

/// Connects with only `version` enabled, trusting `ca_pem`; returns the
/// sender, the negotiated version and the server's leaf certificate.
async fn connect(
    addr: std::net::SocketAddr,
    ca_pem: &str,
    version: &'static rustls::SupportedProtocolVersion,
) -> (Sender, rustls::ProtocolVersion, CertificateDer<'static>) {
    use rustls::pki_types::pem::PemObject;
    let mut roots = RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca_pem.as_bytes()).expect("ca pem"))
        .expect("root");
    let cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&[version])
    .expect("versions")
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = TcpStream::connect(addr).await.expect("connect");
    let tls = TlsConnector::from(Arc::new(cfg))
        .connect(ServerName::try_from("localhost").expect("name"), tcp)
        .await
        .expect("handshake");
    let (_, conn) = tls.get_ref();
    let negotiated = conn.protocol_version().expect("version");
    let leaf = conn.peer_certificates().expect("certs")[0]
        .clone()
        .into_owned();
    let (sender, c) = hyper::client::conn::http1::handshake(TokioIo::new(tls))
        .await
        .expect("http");
    tokio::spawn(c);
    (sender, negotiated, leaf)
}

async fn get_path(sender: &mut Sender, path: &str) -> Result<String, hyper::Error> {
    let req = http::Request::get(path)
        .header("host", "localhost")
        .body(Empty::new())
        .expect("request");
    // An HTTP/1 connection takes the next request only once the previous
    // response is fully processed; sending before that fails with "connection
    // was not ready" on a busy machine. Waiting for readiness makes it exact.
    sender.ready().await?;
    let resp = sender.send_request(req).await?;
    assert_eq!(resp.status(), 200);
    let body = resp.into_body().collect().await?.to_bytes();
    Ok(String::from_utf8_lossy(&body).into_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn speaks_tls_1_2_and_1_3() {
    let s = start().await;
    for (v, want) in [
        (&rustls::version::TLS13, rustls::ProtocolVersion::TLSv1_3),
        (&rustls::version::TLS12, rustls::ProtocolVersion::TLSv1_2),
    ] {
        let (mut sender, got, _) = connect(s.addr, &s.ca.cert_pem(), v).await;
        assert_eq!(got, want);
        assert_eq!(get_path(&mut sender, "/fast").await.expect("get"), "fast");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotation_keeps_live_connections_and_serves_the_new_pair_to_new_ones() {
    let s = start().await;
    let (mut old_conn, _, old_leaf) =
        connect(s.addr, &s.ca.cert_pem(), &rustls::version::TLS13).await;
    assert_eq!(get_path(&mut old_conn, "/fast").await.expect("get"), "fast");

    write_pair(&s.ca, s.dir.path());
    s.resolver.reload().expect("reload");

    // The live connection keeps working...
    assert_eq!(get_path(&mut old_conn, "/fast").await.expect("get"), "fast");
    // ...and a new one is served the new certificate.
    let (mut new_conn, _, new_leaf) =
        connect(s.addr, &s.ca.cert_pem(), &rustls::version::TLS13).await;
    assert_ne!(old_leaf, new_leaf);
    assert_eq!(get_path(&mut new_conn, "/fast").await.expect("get"), "fast");

    // A broken pair is refused and the current one keeps serving.
    std::fs::write(s.dir.path().join("tls.key"), "garbage").expect("write");
    assert!(s.resolver.reload().is_err());
    let (_, _, still) = connect(s.addr, &s.ca.cert_pem(), &rustls::version::TLS13).await;
    assert_eq!(still, new_leaf);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_connection_cap_a_new_connection_waits_until_one_closes() {
    let s = start_capped(2, 2).await;
    let ca = s.ca.cert_pem();
    let (mut a, _, _) = connect(s.addr, &ca, &rustls::version::TLS13).await;
    let (b, _, _) = connect(s.addr, &ca, &rustls::version::TLS13).await;
    assert_eq!(get_path(&mut a, "/fast").await.expect("get"), "fast");
    // A third: the TCP connect succeeds (the kernel's backlog), the TLS
    // handshake does not start while both slots are taken.
    let third = tokio::spawn({
        let ca = ca.clone();
        async move { connect(s.addr, &ca, &rustls::version::TLS13).await }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !third.is_finished(),
        "a third connection was served past the cap of 2"
    );
    // One closes: the third is served.
    drop(b);
    let (mut c, _, _) = tokio::time::timeout(Duration::from_secs(20), third)
        .await
        .expect("served once a slot is free")
        .expect("join");
    assert_eq!(get_path(&mut c, "/fast").await.expect("get"), "fast");
    assert_eq!(get_path(&mut a, "/fast").await.expect("get"), "fast");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_past_its_cap_is_closed_at_once_and_others_are_served() {
    let s = start_capped(16, 2).await;
    let ca = s.ca.cert_pem();
    let (mut a, _, _) = connect(s.addr, &ca, &rustls::version::TLS13).await;
    let (_b, _, _) = connect(s.addr, &ca, &rustls::version::TLS13).await;
    // A third from 127.0.0.1: closed before its handshake, at once.
    let started = std::time::Instant::now();
    let third = async {
        let tcp = TcpStream::connect(s.addr).await.ok()?;
        connect_over(tcp, &ca).await
    };
    let third = tokio::time::timeout(Duration::from_secs(5), third)
        .await
        .expect("answered at once, not left waiting");
    assert!(
        third.is_none(),
        "a third connection from one address was served past its cap of 2"
    );
    assert!(started.elapsed() < Duration::from_secs(2));
    // Another address (all of 127/8 is loopback) is served.
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .bind("127.0.0.2:0".parse().expect("addr"))
        .expect("bind 127.0.0.2");
    let tcp = socket
        .connect(s.addr)
        .await
        .expect("connect from 127.0.0.2");
    assert!(connect_over(tcp, &ca).await.is_some(), "127.0.0.2 refused");
    assert_eq!(get_path(&mut a, "/fast").await.expect("get"), "fast");
}

/// A connection from `from` (a loopback address) to `to`.
async fn tcp_from(from: &str, to: std::net::SocketAddr) -> TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .bind(format!("{from}:0").parse().expect("addr"))
        .expect("bind");
    socket.connect(to).await.expect("connect")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_api_server_address_is_never_held_to_the_per_address_cap() {
    // 127.0.0.3 plays the API server (--trusted-peers); the cap is 2.
    let s = start_trusting(16, 2, &["127.0.0.3/32"]).await;
    let ca = s.ca.cert_pem();
    let mut held = Vec::new();
    for i in 0..6 {
        let tcp = tcp_from("127.0.0.3", s.addr).await;
        let c = tokio::time::timeout(Duration::from_secs(5), connect_over(tcp, &ca))
            .await
            .expect("answered at once");
        assert!(c.is_some(), "the API server's connection {i} was refused");
        held.push(c);
    }
    // Everyone else is still held to 2.
    let mut others = Vec::new();
    for _ in 0..3 {
        let tcp = tcp_from("127.0.0.4", s.addr).await;
        let c = tokio::time::timeout(Duration::from_secs(5), connect_over(tcp, &ca))
            .await
            .expect("answered at once");
        others.push(c);
    }
    let served: Vec<bool> = others.iter().map(Option::is_some).collect();
    assert_eq!(served, [true, true, false]);
    drop(held);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dual_stack_listener_serves_both_families_and_knows_an_ipv4_peer_by_its_ipv4_address() {
    // The chart's listener, [::]; 127.0.0.3 trusted, every other address capped at 2.
    let s = start_on("[::]:0", 16, 2, &["127.0.0.3/32"]).await;
    let port = s.addr.port();
    let ca = s.ca.cert_pem();
    let v4: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().expect("addr");
    let v6: std::net::SocketAddr = format!("[::1]:{port}").parse().expect("addr");
    // Over IPv6 it serves.
    let tcp = TcpStream::connect(v6).await.expect("connect over IPv6");
    assert!(
        connect_over(tcp, &ca).await.is_some(),
        "an IPv6 client served"
    );
    // The trusted IPv4 address arrives as ::ffff:127.0.0.3 on this socket:
    // seen as 127.0.0.3, it is trusted, past the cap of 2.
    let mut held = Vec::new();
    for i in 0..4 {
        let tcp = tcp_from("127.0.0.3", v4).await;
        let c = tokio::time::timeout(Duration::from_secs(5), connect_over(tcp, &ca))
            .await
            .expect("answered at once");
        assert!(
            c.is_some(),
            "the trusted IPv4 peer's connection {i} was refused"
        );
        held.push(c);
    }
    drop(held);
}

/// A TLS handshake over `tcp` trusting `ca_pem`: `None` when the server
/// closes the connection instead.
async fn connect_over(
    tcp: TcpStream,
    ca_pem: &str,
) -> Option<tokio_rustls::client::TlsStream<TcpStream>> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(ca_pem.as_bytes()).ok()?)
        .ok()?;
    let cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .ok()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    TlsConnector::from(Arc::new(cfg))
        .connect(ServerName::try_from("localhost").ok()?, tcp)
        .await
        .ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_finishes_in_flight_requests_and_stops_accepting() {
    let s = start().await;
    let (mut sender, _, _) = connect(s.addr, &s.ca.cert_pem(), &rustls::version::TLS13).await;
    let in_flight = tokio::spawn(async move { get_path(&mut sender, "/slow").await });
    tokio::time::sleep(Duration::from_millis(150)).await;
    s.stop.send(true).expect("stop");
    let body = in_flight
        .await
        .expect("join")
        .expect("the in-flight request completes");
    assert_eq!(body, "slow");
    tokio::time::timeout(Duration::from_secs(5), s.done)
        .await
        .expect("server stops after draining")
        .expect("join");
    assert!(
        TcpStream::connect(s.addr).await.is_err(),
        "no longer accepting"
    );
}

/// GET `path` on `sender`; the status and the `Connection` header.
async fn get_connection_header(sender: &mut Sender, path: &str) -> (u16, Option<String>) {
    let req = http::Request::get(path)
        .header("host", "localhost")
        .body(Empty::new())
        .expect("request");
    sender
        .ready()
        .await
        .expect("the connection takes a request");
    let resp = sender
        .send_request(req)
        .await
        .expect("the request is answered, not cut");
    let header = resp
        .headers()
        .get(http::header::CONNECTION)
        .map(|v| v.to_str().unwrap_or_default().to_string());
    (resp.status().as_u16(), header)
}

/// The kube-apiserver calls webhooks over HTTP/1.1 and keeps using a
/// connection it has: a stopping replica that closed an idle keep-alive
/// connection would race its next review on it (an EOF, which the API server
/// does not retry: it fails open, or refuses the Create under
/// failurePolicy Fail). Once draining begins, each answer asks the client to
/// close instead; after accepting stops, an idle connection still answers
/// until the last call, with `Connection: close`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_server_never_closes_an_http1_connection_under_its_clients_next_request() {
    let s = start().await;
    let (mut draining, _, _) = connect(s.addr, &s.ca.cert_pem(), &rustls::version::TLS13).await;
    let (mut idle, _, _) = connect(s.addr, &s.ca.cert_pem(), &rustls::version::TLS13).await;
    assert_eq!(get_connection_header(&mut idle, "/fast").await, (200, None));

    // The shutdown delay: still accepting, every answer says close.
    s.connections.begin_draining();
    assert_eq!(
        get_connection_header(&mut draining, "/fast").await,
        (200, Some("close".to_string()))
    );
    // The client closes it, as told: no further request on it.
    tokio::time::timeout(
        Duration::from_secs(2),
        std::future::poll_fn(|cx| draining.poll_ready(cx)),
    )
    .await
    .expect("the connection ends after its Connection: close answer")
    .expect_err("closed");

    // Accepting stops; the idle connection, kept by its client, still
    // answers (the API server's next review), and asks to be closed.
    s.stop.send(true).expect("stop");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        get_connection_header(&mut idle, "/fast").await,
        (200, Some("close".to_string()))
    );
    tokio::time::timeout(Duration::from_secs(5), s.done)
        .await
        .expect("the server stops within its drain period")
        .expect("join");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_never_sends_a_request_is_disconnected() {
    use tokio::io::AsyncReadExt;
    let s = start().await;
    use rustls::pki_types::pem::PemObject;
    let mut roots = RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(s.ca.cert_pem().as_bytes()).expect("ca pem"))
        .expect("root");
    let cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_root_certificates(roots)
    .with_no_client_auth();
    // No ALPN: HTTP/1.1, whose header-read timeout applies.
    let tcp = TcpStream::connect(s.addr).await.expect("connect");
    let mut tls = TlsConnector::from(Arc::new(cfg))
        .connect(ServerName::try_from("localhost").expect("name"), tcp)
        .await
        .expect("handshake");
    // Send nothing. The server must close the connection (header-read timeout,
    // 10 s) instead of holding it forever; 25 s is the bound, not a speed target.
    let mut buf = [0u8; 64];
    let closed = tokio::time::timeout(Duration::from_secs(25), tls.read(&mut buf)).await;
    match closed {
        Ok(Ok(_)) | Ok(Err(_)) => {}
        Err(_) => panic!("the idle connection was still open after 25 s"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_health_listener_closes_a_client_that_never_sends_a_request() {
    use graceguard_webhook::server::serve_plain;
    use tokio::io::AsyncReadExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (_stop, rx) = watch::channel(false);
    let router = Router::new().route("/healthz", get(|| async { "ok" }));
    tokio::spawn(serve_plain(
        listener,
        router,
        rx,
        graceguard_webhook::server::Connections::new(
            graceguard_webhook::connection_life::Lifetime::UNBOUNDED,
            &graceguard_webhook::connection_life::ConnectionMetrics::default(),
        ),
    ));
    let mut tcp = TcpStream::connect(addr).await.expect("connect");
    // Send nothing: the header-read timeout (10 s) must close it; 25 s is the
    // bound of this test, not a speed target.
    let mut buf = [0u8; 64];
    let closed = tokio::time::timeout(Duration::from_secs(25), tcp.read(&mut buf)).await;
    assert!(
        closed.is_ok(),
        "the idle health connection was still open after 25 s"
    );
    // And it still serves a real client.
    let mut ok = TcpStream::connect(addr).await.expect("connect");
    use tokio::io::AsyncWriteExt;
    ok.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .expect("write");
    let mut resp = String::new();
    ok.read_to_string(&mut resp).await.expect("read");
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
}
