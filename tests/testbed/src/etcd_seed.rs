//! A bootstrapped etcd data directory per Kubernetes release, copied into
//! each bed that has no real nodes.
//!
//! An API server started on an empty etcd writes its bootstrap objects
//! first (the RBAC roles and bindings, the priority-and-fairness
//! configuration, the system namespaces, the `kubernetes` Service); one
//! started on an etcd that already holds them only reads them. Measured on
//! v1.37.2 (docs/testbed.md): 1.5 CPU-seconds to ready against 2.35, for
//! every one of the few hundred beds a CI run starts. The first bed of a
//! release on a machine bootstraps as before and saves its etcd (after the
//! bed's own ClusterRoles, before anything a test does), the others start
//! from a copy.
//!
//! Only beds without real nodes use it: their API server listens on
//! loopback with the one Service range every such bed has, so the stored
//! `kubernetes` Service and its range are theirs too. Nothing per bed is in
//! etcd: certificates, tokens and the service-account key are files the API
//! server reads at start. The key below names everything the saved state
//! depends on, so a new binary or new bed roles make a new seed.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

use crate::binaries::{cache_dir, ControlPlaneBins};

/// Bump when what a seed holds changes in a way the key does not see.
const RECIPE: u32 = 1;

/// The seed of one release and control-plane build.
pub struct Seed {
    dir: PathBuf,
}

impl Seed {
    /// The seed for `bins` (whether or not it exists yet). `roles` is every
    /// object the bed writes before the seed is saved, as text.
    pub fn of(bins: &ControlPlaneBins, service_cidr: &str, roles: &[&str]) -> Self {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        RECIPE.hash(&mut h);
        service_cidr.hash(&mut h);
        roles.hash(&mut h);
        // scripts/install-control-plane's stamp names the build and each
        // binary's sha256; without it, the binary's size and time.
        let stamp = bins
            .kube_apiserver
            .parent()
            .and_then(Path::parent)
            .map(|d| d.join("stamp"));
        match stamp.and_then(|s| std::fs::read(s).ok()) {
            Some(stamp) => stamp.hash(&mut h),
            None => {
                if let Ok(meta) = std::fs::metadata(&bins.kube_apiserver) {
                    meta.len().hash(&mut h);
                    meta.modified().ok().hash(&mut h);
                }
            }
        }
        let dir = cache_dir().join("etcd-seed").join(format!(
            "{}-{:016x}",
            bins.version.as_str(),
            h.finish()
        ));
        Self { dir }
    }

    /// Whether the seed has been saved.
    pub fn exists(&self) -> bool {
        self.dir.join("member").is_dir()
    }

    /// Copies the seed into `etcd_dir` (which must not exist yet).
    pub fn copy_to(&self, etcd_dir: &Path) -> Result<()> {
        copy_tree(&self.dir, etcd_dir).with_context(|| {
            format!(
                "copying the etcd seed {} into the bed (delete that directory if it is damaged; the next bed saves it again)",
                self.dir.display()
            )
        })
    }

    /// Saves `etcd_dir`, the data of an etcd that has stopped, as the seed.
    /// Another test process may save the same seed at the same time: the
    /// first to finish wins, the other's copy is dropped.
    pub fn save_from(&self, etcd_dir: &Path) -> Result<()> {
        let parent = self
            .dir
            .parent()
            .context("the etcd seed's path has no parent")?;
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
        let tmp = tempfile::Builder::new()
            .prefix(".saving-")
            .tempdir_in(parent)
            .with_context(|| format!("creating a directory in {}", parent.display()))?;
        let staged = tmp.path().join("etcd");
        copy_tree(etcd_dir, &staged)
            .with_context(|| format!("copying {} to save it", etcd_dir.display()))?;
        if std::fs::rename(&staged, &self.dir).is_err() && !self.exists() {
            anyhow::bail!(
                "could not move the etcd seed into {}; check that the cache directory is writable",
                self.dir.display()
            );
        }
        Ok(())
    }
}

/// Copies a directory tree of plain files; directories are made 0700, as
/// etcd wants its data directory.
fn copy_tree(from: &Path, to: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(to)?;
    std::fs::set_permissions(to, std::fs::Permissions::from_mode(0o700))?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_tree(&entry.path(), &target)?;
        } else if entry.path().extension().is_some_and(|e| e == "tmp") {
            // etcd's next WAL file, preallocated (64 MB of nothing): etcd
            // makes a new one when it needs it.
            continue;
        } else {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}
