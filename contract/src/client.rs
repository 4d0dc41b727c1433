//! The Kubernetes client configuration both command lines build the same
//! way: from `--kubeconfig FILE` when given, else from the environment
//! (`KUBECONFIG`, `~/.kube/config`, or the pod's service account).

use std::path::{Path, PathBuf};

use kube::config::{InferConfigError, KubeConfigOptions, Kubeconfig, KubeconfigError};

/// Why no client configuration could be had; each says what to do.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read kubeconfig {path}: {source}; check the path and its permissions")]
    Read {
        path: PathBuf,
        #[source]
        source: KubeconfigError,
    },
    #[error(
        "kubeconfig {path} is not usable: {source}; check its current context, cluster and user"
    )]
    Unusable {
        path: PathBuf,
        #[source]
        source: KubeconfigError,
    },
    #[error("no cluster configuration found ({source}); pass --kubeconfig FILE, set KUBECONFIG, or run in a pod with a service account")]
    NotFound {
        #[source]
        source: InferConfigError,
    },
}

/// The client configuration from `kubeconfig`, or inferred without one.
pub async fn config(kubeconfig: Option<&Path>) -> Result<kube::Config, ConfigError> {
    match kubeconfig {
        Some(path) => {
            let kc = Kubeconfig::read_from(path).map_err(|source| ConfigError::Read {
                path: path.to_path_buf(),
                source,
            })?;
            kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .map_err(|source| ConfigError::Unusable {
                    path: path.to_path_buf(),
                    source,
                })
        }
        None => kube::Config::infer()
            .await
            .map_err(|source| ConfigError::NotFound { source }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_missing_kubeconfig_names_the_file_and_what_to_check() {
        let err = config(Some(Path::new("/nonexistent/kubeconfig")))
            .await
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            err.contains("/nonexistent/kubeconfig") && err.contains("check the path"),
            "{err}"
        );
    }
}
