//! `graceguard-webhook probe --url URL`: an HTTP GET that exits 0 on 200.
//!
//! The chart's `helm test` pod checks readiness through the Service with the
//! webhook image itself, which has no shell or curl.

use std::time::Duration;

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;

/// Why a probe failed: a `--url` it cannot use (exit 2), or no 200 from it
/// (exit 1).
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("--url {url:?} is not a plain http:// URL with a host ({reason}); probe speaks plain http:// to the health port, e.g. http://graceguard:8080/readyz")]
    Url { url: String, reason: String },
    #[error("cannot connect to {host}:{port}: {source}")]
    Connect {
        host: String,
        port: u16,
        #[source]
        source: std::io::Error,
    },
    #[error("GET {url} failed: {source}")]
    Http {
        url: String,
        #[source]
        source: hyper::Error,
    },
    #[error("GET {url} answered {status}: {body}")]
    Status {
        url: String,
        status: http::StatusCode,
        body: String,
    },
    #[error("GET {url}: no answer within {timeout:?}")]
    Timeout { url: String, timeout: Duration },
}

impl ProbeError {
    /// 2 for a `--url` that cannot be used, 1 for a target that did not
    /// answer 200.
    pub fn exit_code(&self) -> u8 {
        match self {
            ProbeError::Url { .. } => 2,
            _ => 1,
        }
    }
}

/// GETs `url` (plain http://, the health port) within `timeout`; Ok when 200.
pub async fn probe(url: &str, timeout: Duration) -> Result<String, ProbeError> {
    let bad_url = |reason: String| ProbeError::Url {
        url: url.into(),
        reason,
    };
    let uri: http::Uri = url
        .parse()
        .map_err(|e: http::uri::InvalidUri| bad_url(e.to_string()))?;
    if uri.scheme_str() != Some("http") {
        return Err(bad_url("not http://".into()));
    }
    let host = uri
        .host()
        .ok_or_else(|| bad_url("no host".into()))?
        .to_string();
    let port = uri.port_u16().unwrap_or(80);
    let http_error = |source| ProbeError::Http {
        url: url.into(),
        source,
    };
    let fut = async {
        let tcp = tokio::net::TcpStream::connect((host.as_str(), port))
            .await
            .map_err(|source| ProbeError::Connect {
                host: host.clone(),
                port,
                source,
            })?;
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
            .await
            .map_err(http_error)?;
        tokio::spawn(conn);
        let req = http::Request::get(uri.path_and_query().map_or("/", |p| p.as_str()))
            .header(http::header::HOST, format!("{host}:{port}"))
            .body(Empty::<Bytes>::new())
            .map_err(|e| bad_url(e.to_string()))?;
        let resp = sender.send_request(req).await.map_err(http_error)?;
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
            Err(ProbeError::Status {
                url: url.into(),
                status,
                body: body.trim().into(),
            })
        }
    };
    tokio::time::timeout(timeout, fut)
        .await
        .map_err(|_| ProbeError::Timeout {
            url: url.into(),
            timeout,
        })?
}
