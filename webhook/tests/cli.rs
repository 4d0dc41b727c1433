//! The `certs` and `probe` subcommands, run as the binary.

use std::process::Command;

use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;

const BIN: &str = env!("CARGO_BIN_EXE_graceguard-webhook");

#[test]
fn certs_writes_a_loadable_ca_and_serving_pair() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = Command::new(BIN)
        .args(["certs", "--out"])
        .arg(dir.path())
        .args(["--dns", "graceguard.graceguard.svc", "--ip", "127.0.0.1"])
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for f in ["ca.crt", "tls.crt", "tls.key"] {
        assert!(dir.path().join(f).is_file(), "{f} written");
    }
    graceguard_certs::install_crypto_provider();
    graceguard_certs::ReloadingResolver::from_files(
        &dir.path().join("tls.crt"),
        &dir.path().join("tls.key"),
    )
    .expect("the pair loads and matches");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(dir.path().join("tls.key"))
            .expect("meta")
            .permissions()
            .mode();
        assert_eq!(mode & 0o077, 0, "the key is private");
    }
    // Without a name it refuses, with exit code 2 and a hint.
    let out = Command::new(BIN)
        .args(["certs", "--out"])
        .arg(dir.path())
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--dns"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_exits_0_on_200_and_non_zero_otherwise() {
    let app = Router::new()
        .route("/readyz", get(|| async { "ok" }))
        .route(
            "/notready",
            get(|| async {
                (
                    StatusCode::SERVICE_UNAVAILABLE,
                    "not ready: pod index not synced",
                )
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    let run = |url: String| {
        tokio::task::spawn_blocking(move || {
            Command::new(BIN)
                .args(["probe", "--url", &url])
                .output()
                .expect("run")
        })
    };
    let ok = run(format!("http://{addr}/readyz")).await.expect("join");
    assert_eq!(
        ok.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let bad = run(format!("http://{addr}/notready")).await.expect("join");
    assert_eq!(bad.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("503"));
    let https = run(format!("https://{addr}/readyz")).await.expect("join");
    assert_eq!(https.status.code(), Some(2), "a usage error");
}
