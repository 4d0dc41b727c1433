//! One node's containerd: its own root, state and socket, runc with
//! seccomp, the bed's CNI network, the pause image pinned; images imported
//! from archives, or pulled from a registry on the bed (`certs.d` hosts
//! files, as users' nodes are configured for theirs).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context, Result};

use super::bins::NodeBins;
use super::mountns::MountNs;
use crate::process::Managed;

/// containerd's namespace for what the CRI plugin runs.
pub const K8S_NAMESPACE: &str = "k8s.io";

pub struct Containerd {
    pub proc: Managed,
    /// The gRPC socket (the kubelet's runtime endpoint, and `ctr`'s).
    pub socket: PathBuf,
    ctr: PathBuf,
    /// containerd's registry host directory (`config_path`): one
    /// `<host>/hosts.toml` per registry, read at every pull.
    hosts_dir: PathBuf,
}

/// containerd's configuration (version 3, containerd 2.x).
fn config(dir: &Path, bins: &NodeBins, cni_conf_dir: &Path) -> Result<String> {
    let p = |p: &Path| p.display().to_string();
    Ok(format!(
        r#"version = 3
root = "{root}"
state = "{state}"
# Plugins that would write outside the bed or are not used.
disabled_plugins = [
  "io.containerd.internal.v1.opt",
  "io.containerd.nri.v1.nri",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.erofs",
  "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing",
]

[grpc]
  address = "{socket}"

[ttrpc]
  address = "{socket}.ttrpc"

[debug]
  address = ""
  level = "warn"

[metrics]
  address = ""

[plugins.'io.containerd.grpc.v1.cri']
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.registry]
    config_path = "{hosts}"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "{pause}"

[plugins.'io.containerd.cri.v1.runtime']
  enable_selinux = false
  disable_apparmor = true
  # The bed runs without CAP_SYS_RESOURCE: runc cannot lower oom_score_adj.
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "{runc}"
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["{cni_bin}"]
    conf_dir = "{cni_conf}"
    max_conf_num = 1
"#,
        root = p(&dir.join("root")),
        hosts = p(&dir.join("certs.d")),
        state = p(&dir.join("state")),
        socket = p(&dir.join("containerd.sock")),
        pause = bins.pause_image,
        runc = p(&bins.bin("runc")?),
        cni_bin = p(&bins.cni_bin_dir),
        cni_conf = p(cni_conf_dir),
    ))
}

impl Containerd {
    /// Starts containerd in `ns` with its files under `dir`, and imports the
    /// bed's images.
    pub fn start(ns: &MountNs, dir: &Path, bins: &NodeBins, cni_conf_dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let cfg = dir.join("config.toml");
        std::fs::write(&cfg, config(dir, bins, cni_conf_dir)?)?;
        let socket = dir.join("containerd.sock");
        let mut cmd = ns.command(&bins.bin("containerd")?);
        cmd.arg(format!("--config={}", cfg.display()));
        // The shim is found on PATH.
        cmd.env("PATH", bins.path_env());
        let log = dir.join("containerd.log");
        let mut proc = Managed::spawn("containerd", cmd, &log)?;
        proc.wait_for_path(&socket, Duration::from_secs(30))?;
        let c = Self {
            proc,
            socket,
            ctr: bins.bin("ctr")?,
            hosts_dir: dir.join("certs.d"),
        };
        // The socket file appears at bind, a moment before containerd
        // accepts on it: under load an import in that moment was refused
        // (CI on d3fef81). Asked until it answers.
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while let Err(e) = ctr(&c.ctr, &c.socket, &["version"]) {
            if std::time::Instant::now() > deadline {
                bail!(
                    "containerd did not answer on {} within 30 s (its log: {}): {e:#}",
                    c.socket.display(),
                    log.display()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        for archive in bins.archives() {
            c.import(archive)?;
        }
        Ok(c)
    }

    /// Trusts the registry at `host` (`HOST:PORT`) over HTTPS with the CA in
    /// `ca_file`, as a node is set up for a private registry: a
    /// `certs.d/<host>/hosts.toml`, which containerd reads at every pull.
    pub fn trust_registry(&self, host: &str, ca_file: &Path) -> Result<()> {
        let dir = self.hosts_dir.join(host);
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let hosts = format!(
            "server = \"https://{host}\"\n\n[host.\"https://{host}\"]\n  capabilities = [\"pull\", \"resolve\"]\n  ca = \"{}\"\n",
            ca_file.display()
        );
        let path = dir.join("hosts.toml");
        std::fs::write(&path, hosts).with_context(|| format!("writing {}", path.display()))
    }

    /// Imports an OCI image archive (what `kind load` does) and pins it.
    pub fn import(&self, archive: &Path) -> Result<Vec<String>> {
        import_with(&self.ctr, &self.socket, archive)
    }
}

/// `ctr` against the containerd at `socket`, in the k8s.io namespace.
pub fn ctr(ctr: &Path, socket: &Path, args: &[&str]) -> Result<String> {
    let out = Command::new(ctr)
        .arg(format!("--address={}", socket.display()))
        .arg(format!("--namespace={K8S_NAMESPACE}"))
        .args(args)
        .output()
        .with_context(|| format!("running {}", ctr.display()))?;
    if !out.status.success() {
        bail!(
            "`ctr {}` failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Imports an OCI image archive into the containerd at `socket` and pins
/// every image it names, so the kubelet's image garbage collection never
/// removes them. Returns the names.
pub fn import_with(ctr_bin: &Path, socket: &Path, archive: &Path) -> Result<Vec<String>> {
    let a = archive.display().to_string();
    let out = ctr(ctr_bin, socket, &["images", "import", "--local", &a]).with_context(|| {
        format!("importing {a}: is it an OCI archive whose index names the image (io.containerd.image.name)?")
    })?;
    let names = imported_names(&out);
    if names.is_empty() {
        bail!("importing {a} named no image (ctr printed {out:?}); build the archive with scripts/image or scripts/install-node");
    }
    for n in &names {
        ctr(
            ctr_bin,
            socket,
            &["images", "label", n, "io.cri-containerd.pinned=pinned"],
        )?;
    }
    Ok(names)
}

/// The image names in `ctr images import`'s output (`unpacking NAME (sha256:…)...done`).
fn imported_names(out: &str) -> Vec<String> {
    out.lines()
        .filter_map(|l| {
            let rest = l.trim().strip_prefix("unpacking ")?;
            Some(rest.split_whitespace().next()?.to_string())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn import_output_names_the_images() {
        let out = "unpacking localhost/graceguard-testbed/pause:3.10.2 (sha256:7ef2)...done\n";
        assert_eq!(
            super::imported_names(out),
            vec!["localhost/graceguard-testbed/pause:3.10.2".to_string()]
        );
    }
}
