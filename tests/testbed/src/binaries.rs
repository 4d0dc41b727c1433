//! Finding the programs the test bed runs, for the Kubernetes version under
//! test, and what that version's API server and kubelet do.

use std::path::{Path, PathBuf};
use std::sync::LazyLock;

use anyhow::{bail, Result};

/// The supported minors and the release built for each: `tests/kube/versions`,
/// the one list the scripts read too.
const VERSIONS_FILE: &str = include_str!("../../kube/versions");

static VERSIONS: LazyLock<Vec<KubeVersion>> = LazyLock::new(|| {
    VERSIONS_FILE
        .lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            let minor = words.next()?.strip_prefix("1.")?.parse().ok()?;
            let release = words.next()?;
            Some(KubeVersion { minor, release })
        })
        .collect()
});

/// A Kubernetes minor the test bed runs, one of `tests/kube/versions`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct KubeVersion {
    minor: u32,
    release: &'static str,
}

/// What a test may need from the server or the kubelet beyond what every
/// supported minor has. A test asks `KubeVersion::has`, never a version number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Feature {
    /// A watch with `sendInitialEvents` (the WatchList feature): on by default
    /// in 1.32 and again from 1.34.
    StreamingLists,
    /// `spec.hostnameOverride` on pods, served by default from 1.35 (beta;
    /// GA in 1.37): a field newer than graceguard's k8s-openapi Pod type.
    HostnameOverride,
}

/// The environment variable that picks the version: a minor (`1.30`) or a
/// release (`v1.30.14`) of `tests/kube/versions`; the newest when unset.
pub const KUBE_ENV: &str = "GRACEGUARD_KUBE";

impl KubeVersion {
    /// Every supported minor, oldest first.
    pub fn all() -> &'static [KubeVersion] {
        &VERSIONS
    }

    /// The oldest supported minor.
    pub fn oldest() -> KubeVersion {
        Self::all()[0]
    }

    /// The newest supported minor.
    pub fn newest() -> KubeVersion {
        Self::all()[Self::all().len() - 1]
    }

    /// The supported minor just before this one (what a cluster upgrades
    /// from), if any.
    pub fn previous(self) -> Option<KubeVersion> {
        let all = Self::all();
        let i = all.iter().position(|v| *v == self)?;
        i.checked_sub(1).map(|j| all[j])
    }

    /// The version a minor (`1.30`, `30`) or its release (`v1.30.14`) names.
    pub fn parse(s: &str) -> Result<Self> {
        let t = s.trim().trim_start_matches('v');
        let by_minor = |m: &str| Self::all().iter().find(|v| v.minor.to_string() == m);
        let found = match t.split('.').collect::<Vec<_>>().as_slice() {
            [m] | ["1", m] => by_minor(m),
            ["1", _, _] => Self::all()
                .iter()
                .find(|v| v.release.trim_start_matches('v') == t),
            _ => None,
        };
        match found {
            Some(v) => Ok(*v),
            None => bail!(
                "{s:?} is not a Kubernetes version the test bed has; use one of {} (the minors of tests/kube/versions, or their releases)",
                Self::all().iter().map(|v| v.to_string()).collect::<Vec<_>>().join(", ")
            ),
        }
    }

    /// The version `GRACEGUARD_KUBE` names; the newest when unset.
    pub fn from_env() -> Result<Self> {
        match std::env::var(KUBE_ENV).as_deref() {
            Err(_) | Ok("") => Ok(Self::newest()),
            Ok(v) => Self::parse(v).map_err(|e| e.context(format!("reading {KUBE_ENV}"))),
        }
    }

    /// The full release, as `kube-apiserver --version` prints it after "Kubernetes ".
    pub fn as_str(self) -> &'static str {
        self.release
    }

    /// The minor version (30, 37).
    pub fn minor(self) -> u32 {
        self.minor
    }

    /// Whether the server (and its kubelet) has `feature`: the one place a
    /// version number turns into behaviour.
    pub fn has(self, feature: Feature) -> bool {
        match feature {
            Feature::StreamingLists => self.minor == 32 || self.minor >= 34,
            Feature::HostnameOverride => self.minor >= 35,
        }
    }
}

impl std::fmt::Display for KubeVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "1.{}", self.minor)
    }
}

/// The programs of one control plane.
#[derive(Clone, Debug)]
pub struct ControlPlaneBins {
    pub version: KubeVersion,
    pub kube_apiserver: PathBuf,
    pub etcd: PathBuf,
    pub kube_scheduler: PathBuf,
    pub kube_controller_manager: PathBuf,
    pub kubectl: PathBuf,
}

impl ControlPlaneBins {
    /// The cached binaries `scripts/install-control-plane` built for `version`.
    pub fn find(version: KubeVersion) -> Result<Self> {
        let dir = cache_dir().join(format!("kube-{}/bin", version.as_str()));
        let bin = |name: &str| executable(dir.join(name), version);
        Ok(Self {
            version,
            kube_apiserver: bin("kube-apiserver")?,
            etcd: bin("etcd")?,
            kube_scheduler: bin("kube-scheduler")?,
            kube_controller_manager: bin("kube-controller-manager")?,
            kubectl: bin("kubectl")?,
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
        let p = PathBuf::from(p);
        if p.is_file() {
            return Ok(p);
        }
        bail!(
            "{var}={} names no file; unset it or point it at the built {name}",
            p.display()
        );
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

fn executable(p: PathBuf, version: KubeVersion) -> Result<PathBuf> {
    if p.is_file() {
        Ok(p)
    } else {
        bail!(
            "{} does not exist; run scripts/install-control-plane --only {version} (scripts/test and scripts/demo run it), which builds the test bed's control planes",
            p.display()
        )
    }
}
