//! Serving the certificate that is on disk now.
//!
//! cert-manager and Secret updates replace `tls.crt`/`tls.key` under a running
//! pod (kubelet swaps a symlink, so inotify on the files is unreliable). The
//! resolver below is asked for a certificate on every handshake and answers from
//! an `ArcSwap`; a poller re-reads the files and swaps in a new pair only when it
//! loads and matches. Live connections keep the pair they started with; a bad new
//! pair keeps the old one and says why in the log.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

use crate::load::{certified_key, CertError};

/// A `ResolvesServerCert` whose pair can be replaced while the server runs.
#[derive(Debug)]
pub struct ReloadingResolver {
    current: ArcSwap<CertifiedKey>,
    cert_path: PathBuf,
    key_path: PathBuf,
    last_seen: std::sync::Mutex<(Vec<u8>, Vec<u8>)>,
}

fn read(path: &Path) -> Result<Vec<u8>, CertError> {
    std::fs::read(path).map_err(|e| CertError::Io {
        path: path.display().to_string(),
        source: e,
    })
}

/// What a reload attempt did, for logs and tests.
#[derive(Debug, PartialEq, Eq)]
pub enum Reload {
    Unchanged,
    Reloaded,
}

impl ReloadingResolver {
    /// Loads the pair from `cert_path` and `key_path`; fails if it does not load,
    /// so a server never starts without a usable certificate.
    pub fn from_files(cert_path: &Path, key_path: &Path) -> Result<Arc<Self>, CertError> {
        let (cert, key) = (read(cert_path)?, read(key_path)?);
        let ck = certified_key(&cert, &key, &describe(cert_path, key_path))?;
        Ok(Arc::new(Self {
            current: ArcSwap::from_pointee(ck),
            cert_path: cert_path.to_path_buf(),
            key_path: key_path.to_path_buf(),
            last_seen: std::sync::Mutex::new((cert, key)),
        }))
    }

    /// Re-reads the files; swaps in the new pair if they changed and load.
    /// On error the pair in use stays in use.
    pub fn reload(&self) -> Result<Reload, CertError> {
        let (cert, key) = (read(&self.cert_path)?, read(&self.key_path)?);
        let mut last = self.last_seen.lock().unwrap_or_else(|p| p.into_inner());
        if last.0 == cert && last.1 == key {
            return Ok(Reload::Unchanged);
        }
        let ck = certified_key(&cert, &key, &describe(&self.cert_path, &self.key_path))?;
        self.current.store(Arc::new(ck));
        *last = (cert, key);
        Ok(Reload::Reloaded)
    }

    /// Polls the files every `every` until the task is dropped, logging each
    /// reload and each rejected pair.
    pub fn spawn_poller(self: &Arc<Self>, every: Duration) -> tokio::task::JoinHandle<()> {
        let this = Arc::clone(self);
        poll(
            every,
            "serving certificate",
            self.cert_path.clone(),
            move || this.reload(),
        )
    }

    /// The pair served to new handshakes now.
    pub fn current(&self) -> Arc<CertifiedKey> {
        self.current.load_full()
    }

    /// When the leaf certificate served now expires (unix seconds), so an
    /// operator can alert before a rotation that never happened bites;
    /// `None` if it cannot be read (it loaded, so this is not expected).
    pub fn not_after_unix(&self) -> Option<i64> {
        let ck = self.current.load();
        let leaf = ck.cert.first()?;
        x509_parser::parse_x509_certificate(leaf.as_ref())
            .ok()
            .map(|(_, cert)| cert.validity().not_after.timestamp())
    }
}

/// Calls `reload` every `every` until the task is dropped, logging each
/// reload of `what` (read from `path`) and each rejection, a rejection once
/// until it changes (not every tick).
pub(crate) fn poll<F>(
    every: Duration,
    what: &'static str,
    path: PathBuf,
    reload: F,
) -> tokio::task::JoinHandle<()>
where
    F: Fn() -> Result<Reload, CertError> + Send + 'static,
{
    tokio::spawn(async move {
        // A zero period would make tokio's interval panic.
        let mut tick = tokio::time::interval(every.max(Duration::from_millis(100)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        tick.tick().await;
        let mut last_err = String::new();
        loop {
            tick.tick().await;
            match reload() {
                Ok(Reload::Unchanged) => {}
                Ok(Reload::Reloaded) => {
                    last_err.clear();
                    tracing::info!(file = %path.display(), "{what} reloaded");
                }
                Err(e) => {
                    let msg = e.to_string();
                    if msg != last_err {
                        tracing::warn!(error = %msg, "new {what} rejected; still using the previous one");
                        last_err = msg;
                    }
                }
            }
        }
    })
}

fn describe(cert: &Path, key: &Path) -> String {
    format!("{} + {}", cert.display(), key.display())
}

impl ResolvesServerCert for ReloadingResolver {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current.load_full())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Ca;

    fn pair(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
        let ca = Ca::new("test-ca").expect("ca");
        let p = ca.issue_server(&[name.to_string()], &[]).expect("pair");
        let (c, k) = (dir.join("tls.crt"), dir.join("tls.key"));
        std::fs::write(&c, p.cert_pem).expect("write");
        std::fs::write(&k, p.key_pem).expect("write");
        (c, k)
    }

    #[test]
    fn reload_swaps_a_good_pair_and_keeps_the_old_one_on_a_bad_pair() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (c, k) = pair(dir.path(), "one.example");
        let r = ReloadingResolver::from_files(&c, &k).expect("load");
        let first = r.current();
        assert_eq!(r.reload().expect("reload"), Reload::Unchanged);

        // A new, valid pair is picked up.
        pair(dir.path(), "two.example");
        assert_eq!(r.reload().expect("reload"), Reload::Reloaded);
        let second = r.current();
        assert_ne!(first.cert[0], second.cert[0]);

        // A certificate whose key does not match is refused; the old pair stays.
        let other = tempfile::tempdir().expect("tempdir");
        let (_, k3) = pair(other.path(), "three.example");
        std::fs::copy(&k3, &k).expect("copy");
        let err = r.reload().expect_err("mismatched pair must be refused");
        assert!(err.to_string().contains("matching pair"), "{err}");
        assert_eq!(r.current().cert[0], second.cert[0]);

        // Garbage is refused too.
        std::fs::write(&c, "not a pem").expect("write");
        assert!(r.reload().is_err());
        assert_eq!(r.current().cert[0], second.cert[0]);
    }

    #[test]
    fn the_expiry_of_the_pair_in_use_is_readable() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (c, k) = pair(dir.path(), "one.example");
        let r = ReloadingResolver::from_files(&c, &k).expect("load");
        let now = time::OffsetDateTime::now_utc().unix_timestamp();
        let left = r.not_after_unix().expect("not after") - now;
        // Ca::issue_server signs for 365 days.
        assert!(
            (364 * 86_400..=366 * 86_400).contains(&left),
            "{left} s left"
        );
    }

    #[test]
    fn missing_files_name_the_path() {
        let err = ReloadingResolver::from_files(
            Path::new("/nonexistent/tls.crt"),
            Path::new("/nonexistent/tls.key"),
        )
        .expect_err("missing");
        assert!(err.to_string().contains("/nonexistent/tls.crt"), "{err}");
    }
}
