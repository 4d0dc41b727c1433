//! Verifying the API server's client certificate (optional mutual TLS).
//!
//! Without it, anything that reaches the admission port can send reviews. With
//! a client CA, the handshake fails unless the peer presents a certificate
//! that CA signed; with names too, the certificate must also carry one of them
//! (as its subject's common name or a DNS name). The names matter in practice:
//! a cluster CA also signs every kubelet's client certificate.
//!
//! The CA file is re-read like the serving pair ([`crate::reload`]), so a
//! rotated client CA needs no restart; a file that no longer loads keeps the
//! CA in use and says why in the log.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::WebPkiClientVerifier;
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};

use crate::load::CertError;
use crate::reload::Reload;

/// How often a refused client certificate is logged at most (a scanner or a
/// misconfigured API server would otherwise fill the log).
const LOG_EVERY: Duration = Duration::from_secs(10);

/// A client-certificate verifier whose CA can be replaced while the server runs.
#[derive(Debug)]
pub struct ClientAuth {
    current: ArcSwap<Verifier>,
    ca_path: PathBuf,
    names: Vec<String>,
    last_seen: std::sync::Mutex<Vec<u8>>,
    /// Unix seconds of the last refusal logged.
    last_logged: AtomicU64,
}

#[derive(Debug)]
struct Verifier(Arc<dyn ClientCertVerifier>);

fn verifier(pem: &[u8], what: &str) -> Result<Verifier, CertError> {
    let invalid = |reason: String| CertError::Invalid {
        what: what.into(),
        reason,
    };
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(pem) {
        let cert = cert.map_err(|e| invalid(format!("bad certificate PEM: {e}")))?;
        roots
            .add(cert)
            .map_err(|e| invalid(format!("not a usable CA certificate: {e}")))?;
    }
    if roots.is_empty() {
        return Err(CertError::NoCertificate(what.into()));
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let v = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
        .build()
        .map_err(|e| invalid(format!("cannot verify clients with it: {e}")))?;
    Ok(Verifier(v))
}

fn read(path: &Path) -> Result<Vec<u8>, CertError> {
    std::fs::read(path).map_err(|e| CertError::Io {
        path: path.display().to_string(),
        source: e,
    })
}

/// The names a client certificate carries: its subject's common names and
/// its DNS subject-alternative names (the first is the name the webhook's
/// audit records give a mutual-TLS sender).
pub fn names_of(cert: &CertificateDer<'_>) -> Vec<String> {
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(cert.as_ref()) else {
        return Vec::new();
    };
    let mut names: Vec<String> = cert
        .subject()
        .iter_common_name()
        .filter_map(|cn| cn.as_str().ok().map(str::to_string))
        .collect();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for n in &san.value.general_names {
            if let x509_parser::extensions::GeneralName::DNSName(d) = n {
                names.push((*d).to_string());
            }
        }
    }
    names
}

impl ClientAuth {
    /// Loads the CA bundle at `ca_path`; fails if it holds no usable CA, so a
    /// server asked to verify clients never starts without doing so. An empty
    /// `names` accepts any certificate the CA signed.
    pub fn from_file(ca_path: &Path, names: Vec<String>) -> Result<Arc<Self>, CertError> {
        let pem = read(ca_path)?;
        let v = verifier(&pem, &ca_path.display().to_string())?;
        Ok(Arc::new(Self {
            current: ArcSwap::from_pointee(v),
            ca_path: ca_path.to_path_buf(),
            names,
            last_seen: std::sync::Mutex::new(pem),
            last_logged: AtomicU64::new(0),
        }))
    }

    /// Re-reads the CA file; swaps in the new CA if it changed and loads. On
    /// error the CA in use stays in use.
    pub fn reload(&self) -> Result<Reload, CertError> {
        let pem = read(&self.ca_path)?;
        let mut last = self.last_seen.lock().unwrap_or_else(|p| p.into_inner());
        if *last == pem {
            return Ok(Reload::Unchanged);
        }
        let v = verifier(&pem, &self.ca_path.display().to_string())?;
        self.current.store(Arc::new(v));
        *last = pem;
        Ok(Reload::Reloaded)
    }

    /// Polls the CA file every `every` until the task is dropped.
    pub fn spawn_poller(self: &Arc<Self>, every: Duration) -> tokio::task::JoinHandle<()> {
        let this = Arc::clone(self);
        crate::reload::poll(every, "client CA", this.ca_path.clone(), move || {
            this.reload()
        })
    }

    fn refuse(&self, found: &[String]) -> rustls::Error {
        let now = UnixTime::now().as_secs();
        let last = self.last_logged.load(Ordering::Relaxed);
        if now.saturating_sub(last) >= LOG_EVERY.as_secs()
            && self
                .last_logged
                .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            tracing::warn!(
                names = ?found,
                allowed = ?self.names,
                "refused a client certificate the client CA signed: none of its names is allowed (--client-names); at most one such line per 10 s"
            );
        }
        rustls::Error::InvalidCertificate(rustls::CertificateError::ApplicationVerificationFailure)
    }
}

impl ClientCertVerifier for ClientAuth {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        // Hints are optional, and a CA that can be swapped cannot lend its
        // subjects here; Go clients (the API server) send their certificate
        // without them.
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self
            .current
            .load()
            .0
            .verify_client_cert(end_entity, intermediates, now)?;
        if self.names.is_empty() {
            return Ok(verified);
        }
        let found = names_of(end_entity);
        if found.iter().any(|n| self.names.contains(n)) {
            Ok(verified)
        } else {
            Err(self.refuse(&found))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.current
            .load()
            .0
            .verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.current
            .load()
            .0
            .verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.current.load().0.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Ca;

    fn der(pem: &str) -> CertificateDer<'static> {
        CertificateDer::from_pem_slice(pem.as_bytes()).expect("pem")
    }

    fn setup(names: &[&str]) -> (tempfile::TempDir, Ca, Arc<ClientAuth>) {
        let dir = tempfile::tempdir().expect("dir");
        let ca = Ca::new("client-ca").expect("ca");
        std::fs::write(dir.path().join("ca.crt"), ca.cert_pem()).expect("write");
        let auth = ClientAuth::from_file(
            &dir.path().join("ca.crt"),
            names.iter().map(|s| s.to_string()).collect(),
        )
        .expect("load");
        (dir, ca, auth)
    }

    #[test]
    fn a_certificate_the_ca_signed_passes_and_another_cas_does_not() {
        crate::install_crypto_provider();
        let (_dir, ca, auth) = setup(&[]);
        let ours = ca.issue_client("kube-apiserver", "").expect("client");
        let other = Ca::new("other").expect("ca");
        let theirs = other.issue_client("kube-apiserver", "").expect("client");
        let now = UnixTime::now();
        assert!(auth
            .verify_client_cert(&der(&ours.cert_pem), &[], now)
            .is_ok());
        assert!(auth
            .verify_client_cert(&der(&theirs.cert_pem), &[], now)
            .is_err());
        assert!(auth.client_auth_mandatory());
    }

    #[test]
    fn with_names_only_a_certificate_carrying_one_passes() {
        crate::install_crypto_provider();
        let (_dir, ca, auth) = setup(&["kube-apiserver-admission"]);
        let now = UnixTime::now();
        let api = ca
            .issue_client("kube-apiserver-admission", "")
            .expect("client");
        let kubelet = ca
            .issue_client("system:node:node-1", "system:nodes")
            .expect("client");
        assert!(auth
            .verify_client_cert(&der(&api.cert_pem), &[], now)
            .is_ok());
        assert!(auth
            .verify_client_cert(&der(&kubelet.cert_pem), &[], now)
            .is_err());
    }

    #[test]
    fn a_replaced_ca_is_used_and_a_broken_file_keeps_the_old_one() {
        crate::install_crypto_provider();
        let (dir, ca, auth) = setup(&[]);
        let path = dir.path().join("ca.crt");
        let now = UnixTime::now();
        let old_client = ca.issue_client("a", "").expect("client");
        assert_eq!(auth.reload().expect("reload"), Reload::Unchanged);
        std::fs::write(&path, "not a certificate").expect("write");
        assert!(auth.reload().is_err());
        assert!(auth
            .verify_client_cert(&der(&old_client.cert_pem), &[], now)
            .is_ok());
        let next = Ca::new("next").expect("ca");
        std::fs::write(&path, next.cert_pem()).expect("write");
        assert_eq!(auth.reload().expect("reload"), Reload::Reloaded);
        let new_client = next.issue_client("a", "").expect("client");
        assert!(auth
            .verify_client_cert(&der(&new_client.cert_pem), &[], now)
            .is_ok());
        assert!(auth
            .verify_client_cert(&der(&old_client.cert_pem), &[], now)
            .is_err());
    }

    #[test]
    fn a_file_without_a_ca_is_refused_at_start() {
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("ca.crt");
        std::fs::write(&path, "").expect("write");
        let err = ClientAuth::from_file(&path, Vec::new()).expect_err("empty");
        assert!(err.to_string().contains("CERTIFICATE"), "{err}");
    }
}
