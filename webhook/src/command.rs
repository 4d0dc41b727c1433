//! What every subcommand shares: the error that ends the process with its
//! exit code, and the API client built from a kubeconfig or the pod's
//! service account. Apart from `cli` so that the subcommands' modules
//! (`probe`, `self_test`) need nothing of the command line itself.

use std::path::Path;

use kube::config::{KubeConfigOptions, Kubeconfig};

/// A failure that ends the process, with its exit code.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// Bad configuration: exit 2.
    #[error("{0}")]
    Config(String),
    /// Failure while running: exit 1.
    #[error("{0}")]
    Runtime(String),
}

/// A client from `kubeconfig`, or the in-cluster configuration without one.
pub async fn client(kubeconfig: Option<&Path>) -> Result<kube::Client, CliError> {
    let config = match kubeconfig {
        Some(path) => {
            let kc = Kubeconfig::read_from(path)
                .map_err(|e| CliError::Config(format!("cannot read kubeconfig {}: {e}", path.display())))?;
            kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .map_err(|e| CliError::Config(format!("kubeconfig {} is not usable: {e}", path.display())))?
        }
        None => kube::Config::infer().await.map_err(|e| {
            CliError::Config(format!(
                "no cluster configuration found ({e}); pass --kubeconfig FILE, or run in a pod with a service account"
            ))
        })?,
    };
    kube::Client::try_from(config)
        .map_err(|e| CliError::Config(format!("cannot build a Kubernetes client: {e}")))
}
