//! What every subcommand shares: the error that ends the process with its
//! exit code, and the API client built from a kubeconfig or the pod's
//! service account. Apart from `cli` so that the subcommands' modules
//! (`probe`, `self_test`) need nothing of the command line itself.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use crate::probe::ProbeError;
use crate::self_test::SelfTestError;

/// A failure that ends the process, with its exit code.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("give at least one --dns NAME or --ip ADDRESS for the serving certificate")]
    NoCertificateNames,
    /// A certificate or key that cannot be made, read or used.
    #[error("{what}: {source}")]
    Certificate {
        what: &'static str,
        #[source]
        source: graceguard_certs::CertError,
    },
    #[error(
        "{flag} {given:?} is under one second; retryAfterSeconds is whole seconds, give 1s or more"
    )]
    UnderOneSecond { flag: &'static str, given: Duration },
    #[error("--max-retry-after ({max:?}) must be shorter than --livelock-window ({window:?}): a client waiting longer than the window is no longer known to loop, and would get 409 again")]
    RetryAfterNotUnderWindow { max: Duration, window: Duration },
    #[error(transparent)]
    Limits(#[from] crate::limits::LimitError),
    #[error("cannot listen on {addr} ({what}): {source}; choose a free address")]
    Bind {
        addr: SocketAddr,
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// No Kubernetes client configuration.
    #[error(transparent)]
    ClientConfig(#[from] graceguard_contract::client::ConfigError),
    /// A configuration kube could not build a client from.
    #[error(
        "cannot build a Kubernetes client: {0}; check the kubeconfig's server URL and certificates"
    )]
    Client(#[source] kube::Error),
    #[error(transparent)]
    Probe(#[from] ProbeError),
    #[error(transparent)]
    SelfTest(#[from] SelfTestError),
    #[error("cannot watch for SIGTERM and SIGINT: {0}")]
    Signal(#[source] std::io::Error),
}

impl CliError {
    /// The process's exit code: 2 for what the command line or its
    /// configuration got wrong, 1 for a failure while running.
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::NoCertificateNames
            | CliError::Certificate { .. }
            | CliError::UnderOneSecond { .. }
            | CliError::RetryAfterNotUnderWindow { .. }
            | CliError::Limits(_)
            | CliError::Bind { .. }
            | CliError::ClientConfig(_)
            | CliError::Client(_) => 2,
            CliError::Probe(e) => e.exit_code(),
            CliError::SelfTest(_) | CliError::Signal(_) => 1,
        }
    }
}

/// A client from `kubeconfig`, or the in-cluster configuration without one.
pub async fn client(kubeconfig: Option<&Path>) -> Result<kube::Client, CliError> {
    let config = graceguard_contract::client::config(kubeconfig).await?;
    kube::Client::try_from(config).map_err(CliError::Client)
}
