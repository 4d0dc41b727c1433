//! Loading PEM certificates and keys into rustls.

use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;

/// What went wrong with a certificate or key, and where.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("cannot read {path}: {source}; check that the file exists and is readable")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}: expected a PEM file with at least one CERTIFICATE block")]
    NoCertificate(String),
    #[error("{0}: expected a PEM private key (PKCS#8, PKCS#1 or SEC1)")]
    NoKey(String),
    #[error("{what}: {reason}; the certificate and key must be a matching pair")]
    Invalid { what: String, reason: String },
    #[error("certificate generation failed: {0}")]
    Generate(String),
}

/// Parses a PEM certificate chain and private key into a rustls `CertifiedKey`,
/// checking that the key matches the certificate. `what` names the source in errors.
pub fn certified_key(
    cert_pem: &[u8],
    key_pem: &[u8],
    what: &str,
) -> Result<CertifiedKey, CertError> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|e| CertError::Invalid {
            what: what.into(),
            reason: format!("bad certificate PEM: {e}"),
        })?;
    if chain.is_empty() {
        return Err(CertError::NoCertificate(what.into()));
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|_| CertError::NoKey(what.into()))?;
    let provider = rustls::crypto::ring::default_provider();
    let ck = CertifiedKey::from_der(chain, key, &provider).map_err(|e| CertError::Invalid {
        what: what.into(),
        reason: e.to_string(),
    })?;
    Ok(ck)
}

/// A rustls server configuration that speaks TLS 1.2 and 1.3 only, offers
/// HTTP/2 and HTTP/1.1, and takes its certificate from `resolver`; with
/// `clients`, only a client that passes it completes the handshake.
pub fn server_config(
    resolver: Arc<dyn rustls::server::ResolvesServerCert>,
    clients: Option<Arc<dyn rustls::server::danger::ClientCertVerifier>>,
) -> Result<rustls::ServerConfig, CertError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| CertError::Invalid {
            what: "TLS configuration".into(),
            reason: e.to_string(),
        })?;
    let builder = match clients {
        Some(v) => builder.with_client_cert_verifier(v),
        None => builder.with_no_client_auth(),
    };
    let mut cfg = builder.with_cert_resolver(resolver);
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(cfg)
}
