//! `graceguard-webhook probe --url URL`: an HTTP GET that exits 0 on 200.
//!
//! The chart's `helm test` pod checks readiness through the Service with the
//! webhook image itself, which has no shell or curl.

use std::time::Duration;

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;

use crate::command::CliError;

/// GETs `url` (plain http://, the health port) within `timeout`; Ok when 200.
pub async fn probe(url: &str, timeout: Duration) -> Result<String, CliError> {
    let uri: http::Uri = url
        .parse()
        .map_err(|e| CliError::Config(format!("--url {url:?} is not a URL: {e}")))?;
    if uri.scheme_str() != Some("http") {
        return Err(CliError::Config(format!(
            "--url {url:?}: probe speaks plain http:// (the health port, e.g. http://graceguard:8080/readyz)"
        )));
    }
    let host = uri
        .host()
        .ok_or_else(|| CliError::Config(format!("--url {url:?} has no host")))?
        .to_string();
    let port = uri.port_u16().unwrap_or(80);
    let fut = async {
        let tcp = tokio::net::TcpStream::connect((host.as_str(), port))
            .await
            .map_err(|e| CliError::Runtime(format!("cannot connect to {host}:{port}: {e}")))?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
            .await
            .map_err(|e| {
                CliError::Runtime(format!("HTTP handshake with {host}:{port} failed: {e}"))
            })?;
        tokio::spawn(conn);
        let req = http::Request::get(uri.path_and_query().map_or("/", |p| p.as_str()))
            .header(http::header::HOST, format!("{host}:{port}"))
            .body(Empty::<Bytes>::new())
            .map_err(|e| CliError::Config(format!("bad request for {url}: {e}")))?;
        let resp = sender
            .send_request(req)
            .await
            .map_err(|e| CliError::Runtime(format!("GET {url} failed: {e}")))?;
        let status = resp.status();
        let body = resp
            .into_body()
            .collect()
            .await
            .map(|b| String::from_utf8_lossy(&b.to_bytes()).into_owned())
            .unwrap_or_default();
        if status == http::StatusCode::OK {
            Ok(body)
        } else {
            Err(CliError::Runtime(format!(
                "GET {url} answered {status}: {}",
                body.trim()
            )))
        }
    };
    tokio::time::timeout(timeout, fut)
        .await
        .map_err(|_| CliError::Runtime(format!("GET {url}: no answer within {timeout:?}")))?
}
