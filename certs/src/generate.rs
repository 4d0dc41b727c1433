//! Generating a private CA and serving certificates signed by it.

use std::net::IpAddr;
use std::path::Path;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose,
};
use time::{Duration, OffsetDateTime};

use crate::load::CertError;

/// A certificate authority that lives in memory, to sign serving certificates
/// for a webhook (or a test API server) and to hand its certificate to clients
/// as their trust anchor (`caBundle`).
pub struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

/// A serving certificate and its private key, both PEM.
#[derive(Clone, Debug)]
pub struct ServingPair {
    pub cert_pem: String,
    pub key_pem: String,
}

fn validity(params: &mut CertificateParams, days: i64) {
    // Backdated an hour so a little clock skew between hosts does not reject it.
    let now = OffsetDateTime::now_utc();
    params.not_before = now - Duration::hours(1);
    params.not_after = now + Duration::days(days);
}

fn gen_err(what: &str, e: rcgen::Error) -> CertError {
    CertError::Generate(format!("{what}: {e}"))
}

impl Ca {
    /// A new CA named `common_name`, valid for ten years.
    pub fn new(common_name: &str) -> Result<Self, CertError> {
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, common_name);
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        validity(&mut params, 3650);
        let key = KeyPair::generate().map_err(|e| gen_err("generating the CA key", e))?;
        let issuer = CertifiedIssuer::self_signed(params, key)
            .map_err(|e| gen_err("self-signing the CA", e))?;
        Ok(Self { issuer })
    }

    /// The CA certificate, PEM: what clients put in `caBundle`.
    pub fn cert_pem(&self) -> String {
        self.issuer.pem()
    }

    /// A serving certificate for the given DNS names and IP addresses, valid
    /// for one year. The first DNS name (or IP) is also the common name.
    pub fn issue_server(&self, dns: &[String], ips: &[IpAddr]) -> Result<ServingPair, CertError> {
        let sans: Vec<String> = dns
            .iter()
            .cloned()
            .chain(ips.iter().map(|ip| ip.to_string()))
            .collect();
        let Some(cn) = sans.first().cloned() else {
            return Err(CertError::Generate(
                "a serving certificate needs at least one DNS name or IP address".into(),
            ));
        };
        let mut params =
            CertificateParams::new(sans).map_err(|e| gen_err("reading the names", e))?;
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, cn);
        params.distinguished_name = dn;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        validity(&mut params, 365);
        let key = KeyPair::generate().map_err(|e| gen_err("generating the serving key", e))?;
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(|e| gen_err("signing the serving certificate", e))?;
        Ok(ServingPair {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    /// A client certificate for `common_name` in `organization` (what
    /// Kubernetes reads as user and group), valid for one year: how an API
    /// server authenticates to kubelets.
    pub fn issue_client(
        &self,
        common_name: &str,
        organization: &str,
    ) -> Result<ServingPair, CertError> {
        let mut params = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, common_name);
        dn.push(DnType::OrganizationName, organization);
        params.distinguished_name = dn;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        validity(&mut params, 365);
        let key = KeyPair::generate().map_err(|e| gen_err("generating the client key", e))?;
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(|e| gen_err("signing the client certificate", e))?;
        Ok(ServingPair {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    /// Writes `ca.crt`, `tls.crt` and `tls.key` (the names a Kubernetes TLS
    /// Secret mounts) into `dir`, creating it. The key is readable by its owner only.
    pub fn write_files(&self, pair: &ServingPair, dir: &Path) -> Result<(), CertError> {
        let io = |path: &Path, e: std::io::Error| CertError::Io {
            path: path.display().to_string(),
            source: e,
        };
        std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
        let write = |name: &str, body: &str| {
            let path = dir.join(name);
            std::fs::write(&path, body).map_err(|e| io(&path, e))
        };
        write("ca.crt", &self.cert_pem())?;
        write("tls.crt", &pair.cert_pem)?;
        write("tls.key", &pair.key_pem)?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let key = dir.join("tls.key");
            std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600))
                .map_err(|e| io(&key, e))?;
        }
        Ok(())
    }
}

/// A fresh EC key pair as (PKCS#8 private key PEM, SPKI public key PEM), for
/// uses that need a bare key (such as a test API server's service-account keys).
pub fn key_pair_pem() -> Result<(String, String), CertError> {
    KeyPair::generate()
        .map(|k| (k.serialize_pem(), k.public_key_pem()))
        .map_err(|e| gen_err("generating a key", e))
}
