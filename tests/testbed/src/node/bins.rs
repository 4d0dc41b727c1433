//! The node components and images `scripts/install-node` built into the cache.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::Deserialize;

use crate::binaries::{cache_dir, KubeVersion};

/// What `scripts/install-node --json` prints (and writes to `node.json`).
#[derive(Clone, Debug, Deserialize)]
pub struct NodeBins {
    /// kubelet, kube-proxy, containerd, containerd-shim-runc-v2, ctr, runc, crictl.
    pub bin_dir: PathBuf,
    /// bridge, host-local, loopback, portmap.
    pub cni_bin_dir: PathBuf,
    /// The sandbox image, `REPOSITORY:TAG`, pinned in containerd.
    pub pause_image: String,
    pub pause_archive: PathBuf,
    /// The image task pods run (Debian's busybox-static).
    pub task_image: String,
    pub task_archive: PathBuf,
}

impl NodeBins {
    /// The cached build for `version`; fails, saying what to run, when it is missing.
    pub fn find(version: KubeVersion) -> Result<Self> {
        let path = cache_dir().join(format!("node-{}/node.json", version.as_str()));
        let text = std::fs::read_to_string(&path).with_context(|| {
            format!(
                "{} is missing: run scripts/install-node --only {version} (scripts/test and scripts/cluster run it), which builds the real nodes' components",
                path.display()
            )
        })?;
        let bins: Self = serde_json::from_str(&text).with_context(|| {
            format!("reading {}; run scripts/install-node again", path.display())
        })?;
        for b in [
            "kubelet",
            "kube-proxy",
            "containerd",
            "containerd-shim-runc-v2",
            "ctr",
            "runc",
        ] {
            bins.bin(b)?;
        }
        Ok(bins)
    }

    /// The path of node binary `name`, checked.
    pub fn bin(&self, name: &str) -> Result<PathBuf> {
        let p = self.bin_dir.join(name);
        anyhow::ensure!(
            p.is_file(),
            "{} is missing: run scripts/install-node",
            p.display()
        );
        Ok(p)
    }

    /// `PATH` with the node binaries first (containerd finds its shim there).
    pub fn path_env(&self) -> String {
        format!(
            "{}:{}",
            self.bin_dir.display(),
            std::env::var("PATH").unwrap_or_else(|_| "/usr/sbin:/usr/bin:/sbin:/bin".into())
        )
    }

    pub fn archives(&self) -> [&Path; 2] {
        [&self.pause_archive, &self.task_archive]
    }
}
