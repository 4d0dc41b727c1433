//! Certificates for graceguard.
//!
//! An admission webhook is only reachable over TLS, and the API server must trust
//! its certificate. This crate keeps every piece of that in one place, for the
//! webhook, its tests and local use alike: generating a CA and a serving
//! certificate ([`generate`]), loading a PEM pair into rustls ([`load`]), and
//! serving whatever pair is on disk now, so rotation by cert-manager or a Secret
//! update needs no restart ([`reload`]), and verifying the API server's client
//! certificate when asked to ([`client_auth`]).

pub mod client_auth;
pub mod generate;
pub mod load;
pub mod reload;

pub use client_auth::ClientAuth;
pub use generate::{Ca, ServingPair};
pub use load::{certified_key, server_config, CertError};
pub use reload::ReloadingResolver;

/// Installs ring as rustls's process-wide crypto provider. kube's and our own
/// rustls configurations both need one; without it the first TLS handshake
/// panics. Safe to call more than once.
pub fn install_crypto_provider() {
    // An error only means another provider is installed already, which is fine.
    let _ = rustls::crypto::ring::default_provider().install_default();
}
