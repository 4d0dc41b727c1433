//! What every subcommand shares: the error that ends the process with its
//! exit code, and the API client built from a kubeconfig or the pod's
//! service account. Apart from `cli` so that the subcommands' modules
//! (`probe`, `self_test`) need nothing of the command line itself.

use std::path::Path;

/// A failure that ends the process, with its exit code.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// Bad configuration: exit 2.
    #[error("{0}")]
    Config(String),
    /// No Kubernetes client configuration: exit 2.
    #[error(transparent)]
    ClientConfig(#[from] graceguard_contract::client::ConfigError),
    /// A configuration kube could not build a client from: exit 2.
    #[error(
        "cannot build a Kubernetes client: {0}; check the kubeconfig's server URL and certificates"
    )]
    Client(#[source] kube::Error),
    /// Failure while running: exit 1.
    #[error("{0}")]
    Runtime(String),
}

impl CliError {
    /// The process's exit code: 2 for what the command line or its
    /// configuration got wrong, 1 for a failure while running.
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Config(_) | CliError::ClientConfig(_) | CliError::Client(_) => 2,
            CliError::Runtime(_) => 1,
        }
    }
}

/// A client from `kubeconfig`, or the in-cluster configuration without one.
pub async fn client(kubeconfig: Option<&Path>) -> Result<kube::Client, CliError> {
    let config = graceguard_contract::client::config(kubeconfig).await?;
    kube::Client::try_from(config).map_err(CliError::Client)
}
