//! Finding the programs the test bed runs.

use std::path::{Path, PathBuf};

use anyhow::{bail, Result};

/// The kube-apiserver version the test bed is built for.
pub const KUBE_VERSION: &str = "v1.20.2";

/// The cache `scripts/install-control-plane` builds into.
pub fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("GRACEGUARD_CACHE") {
        return PathBuf::from(dir);
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from("/tmp"));
    base.join("graceguard")
}

/// kube-apiserver: `$GRACEGUARD_KUBE_APISERVER`, else the cached build.
pub fn kube_apiserver() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("GRACEGUARD_KUBE_APISERVER") {
        return executable(PathBuf::from(p), "GRACEGUARD_KUBE_APISERVER");
    }
    let p = cache_dir()
        .join(format!("kube-apiserver-{KUBE_VERSION}"))
        .join("bin/kube-apiserver");
    executable(p, "the kube-apiserver cache")
}

/// etcd, from PATH (Debian's etcd-server package) or `$GRACEGUARD_ETCD`.
pub fn etcd() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("GRACEGUARD_ETCD") {
        return executable(PathBuf::from(p), "GRACEGUARD_ETCD");
    }
    match find_on_path("etcd") {
        Some(p) => Ok(p),
        None => bail!("etcd is not on PATH; run scripts/install-control-plane (it installs Debian's etcd-server)"),
    }
}

/// A binary of this workspace (such as `graceguard-webhook`): `$VAR` if set,
/// else next to the running test executable's `deps/` directory, where cargo
/// puts the workspace's binaries.
pub fn workspace_bin(name: &str, var: &str) -> Result<PathBuf> {
    if let Some(p) = std::env::var_os(var) {
        return executable(PathBuf::from(p), var);
    }
    let exe = std::env::current_exe()?;
    let mut dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    if dir.ends_with("deps") {
        dir.pop();
    }
    executable(
        dir.join(name),
        &format!("the target directory (build it with `cargo build --bin {name}`, or set {var})"),
    )
}

fn executable(p: PathBuf, from: &str) -> Result<PathBuf> {
    if p.is_file() {
        Ok(p)
    } else {
        bail!(
            "{} (from {from}) does not exist; run scripts/install-control-plane or scripts/test, which install and build what the test bed needs",
            p.display()
        )
    }
}

fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}
