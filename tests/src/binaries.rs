//! Finding the programs the test bed runs, for the Kubernetes version under test.

use std::path::{Path, PathBuf};

use anyhow::{bail, Result};

/// A Kubernetes version the test bed runs: the oldest and the newest graceguard supports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum KubeVersion {
    /// kube-apiserver v1.20.2 alone (Debian's source package): no scheduler or
    /// controller-manager, no `DisruptionTarget`, no `matchConditions`.
    V1_20,
    /// v1.37.2 with kube-scheduler and kube-controller-manager (the Go module in `tests/kube`).
    V1_37,
}

/// The environment variable that picks the version: `1.20` or `1.37` (the default).
pub const KUBE_ENV: &str = "GRACEGUARD_KUBE";

impl KubeVersion {
    /// The version `GRACEGUARD_KUBE` names; 1.37 when unset.
    pub fn from_env() -> Result<Self> {
        match std::env::var(KUBE_ENV).as_deref() {
            Err(_) | Ok("") | Ok("1.37") | Ok("v1.37.2") => Ok(Self::V1_37),
            Ok("1.20") | Ok("v1.20.2") => Ok(Self::V1_20),
            Ok(other) => bail!(
                "{KUBE_ENV}={other:?} is not a version the test bed has; set it to 1.20 or 1.37"
            ),
        }
    }

    /// The full version, as `kube-apiserver --version` prints it after "Kubernetes ".
    pub fn as_str(self) -> &'static str {
        match self {
            Self::V1_20 => "v1.20.2",
            Self::V1_37 => "v1.37.2",
        }
    }

    /// The minor version (20, 37).
    pub fn minor(self) -> u32 {
        match self {
            Self::V1_20 => 20,
            Self::V1_37 => 37,
        }
    }

    /// Whether kube-scheduler and kube-controller-manager run with it.
    pub fn has_controllers(self) -> bool {
        self == Self::V1_37
    }

    /// Whether its API server serves streaming lists (a watch with
    /// `sendInitialEvents`): the WatchList feature, on by default in 1.32 and
    /// from 1.34 on.
    pub fn serves_streaming_lists(self) -> bool {
        self.minor() == 32 || self.minor() >= 34
    }

    /// Fails, naming the test's requirement, when the bed runs an older version
    /// than `min` (such a test runs only in the 1.37 pass of `scripts/test`).
    pub fn require(self, min: KubeVersion, what: &str) -> Result<()> {
        if self < min {
            bail!(
                "this test needs Kubernetes {} or newer ({what}), but the bed runs {}; run it with {KUBE_ENV}=1.37",
                min.as_str(),
                self.as_str()
            );
        }
        Ok(())
    }
}

/// The programs of one control plane.
#[derive(Clone, Debug)]
pub struct ControlPlaneBins {
    pub version: KubeVersion,
    pub kube_apiserver: PathBuf,
    pub etcd: PathBuf,
    /// `None` on 1.20.
    pub kube_scheduler: Option<PathBuf>,
    /// `None` on 1.20.
    pub kube_controller_manager: Option<PathBuf>,
    /// The 1.37 kubectl, for both versions.
    pub kubectl: PathBuf,
}

impl ControlPlaneBins {
    /// The cached binaries `scripts/install-control-plane` built for `version`.
    pub fn find(version: KubeVersion) -> Result<Self> {
        let new = cache_dir().join(format!("kube-{}/bin", KubeVersion::V1_37.as_str()));
        let dir = cache_dir().join(format!("kube-{}/bin", version.as_str()));
        let bin = |d: &Path, name: &str| executable(d.join(name));
        Ok(match version {
            KubeVersion::V1_20 => Self {
                version,
                kube_apiserver: bin(&dir, "kube-apiserver")?,
                etcd: match find_on_path("etcd") {
                    Some(p) => p,
                    None => bail!("etcd is not on PATH; run scripts/install-control-plane (it installs Debian's etcd-server for 1.20)"),
                },
                kube_scheduler: None,
                kube_controller_manager: None,
                kubectl: bin(&new, "kubectl")?,
            },
            KubeVersion::V1_37 => Self {
                version,
                kube_apiserver: bin(&dir, "kube-apiserver")?,
                etcd: bin(&dir, "etcd")?,
                kube_scheduler: Some(bin(&dir, "kube-scheduler")?),
                kube_controller_manager: Some(bin(&dir, "kube-controller-manager")?),
                kubectl: bin(&dir, "kubectl")?,
            },
        })
    }
}

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

/// A binary of this workspace (such as `graceguard-webhook`): `$VAR` if set,
/// else next to the running test executable's `deps/` directory, where cargo
/// puts the workspace's binaries.
pub fn workspace_bin(name: &str, var: &str) -> Result<PathBuf> {
    if let Some(p) = std::env::var_os(var) {
        return executable(PathBuf::from(p));
    }
    let exe = std::env::current_exe()?;
    let mut dir = exe.parent().map(Path::to_path_buf).unwrap_or_default();
    if dir.ends_with("deps") {
        dir.pop();
    }
    let p = dir.join(name);
    if p.is_file() {
        return Ok(p);
    }
    bail!(
        "{} does not exist; build it with `cargo build --bin {name}` (scripts/test does), or set {var}",
        p.display()
    )
}

fn executable(p: PathBuf) -> Result<PathBuf> {
    if p.is_file() {
        Ok(p)
    } else {
        bail!(
            "{} does not exist; run scripts/install-control-plane (scripts/test and scripts/demo run it), which builds the test bed's control planes",
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
