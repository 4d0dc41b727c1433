//! An OCI registry on the bed, as users' clusters pull from theirs: the CNCF
//! distribution registry (`scripts/install-registry`) serving HTTPS on
//! loopback with a certificate from the bed's CA, graceguard's images pushed
//! into it with `crane`, and the real nodes' containerd trusting it through
//! `certs.d` hosts files. Clients (crane, helm) trust it through
//! `SSL_CERT_FILE`, so their command lines stay what a user types.

use std::net::{IpAddr, Ipv4Addr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde::Deserialize;

use crate::process::{free_port, tail, Managed};
use crate::TestBed;

/// Where `scripts/install-registry --json` put the binaries (`GRACEGUARD_REGISTRY_TOOLS`).
#[derive(Deserialize)]
struct Tools {
    registry: PathBuf,
    crane: PathBuf,
}

fn tools() -> Result<Tools> {
    let path = crate::helm::env_path(
        "GRACEGUARD_REGISTRY_TOOLS",
        "`scripts/install-registry --json`",
    )?;
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text)
        .with_context(|| format!("{} is not scripts/install-registry's JSON", path.display()))
}

/// A running registry. Stopped when dropped.
pub struct Registry {
    _proc: Managed,
    /// `127.0.0.1:PORT`: the registry part of an image reference.
    pub host: String,
    /// The CA its certificate chains to (the bed's).
    pub ca_file: PathBuf,
    crane: PathBuf,
    dir: PathBuf,
}

impl Registry {
    /// Starts a registry with its storage under the bed's directory, and has
    /// every real node of the bed trust it.
    pub fn start(bed: &TestBed) -> Result<Self> {
        let tools = tools()?;
        let dir = bed.dir().join("registry");
        std::fs::create_dir_all(dir.join("storage"))
            .with_context(|| format!("creating {}", dir.display()))?;
        let loopback = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let pair = bed.issue_server(&[], &[loopback])?;
        std::fs::write(dir.join("tls.crt"), &pair.cert_pem)?;
        std::fs::write(dir.join("tls.key"), &pair.key_pem)?;
        let port = free_port()?;
        let host = format!("127.0.0.1:{port}");
        let config = format!(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {root}\nhttp:\n  addr: {host}\n  tls:\n    certificate: {dir}/tls.crt\n    key: {dir}/tls.key\n",
            root = dir.join("storage").display(),
            dir = dir.display(),
        );
        let config_file = dir.join("config.yml");
        std::fs::write(&config_file, config)?;
        let mut cmd = Command::new(&tools.registry);
        cmd.arg("serve").arg(&config_file);
        // The registry's own metadata lookups (cloud instance detection) stay off.
        cmd.env("OTEL_TRACES_EXPORTER", "none");
        let mut proc = Managed::spawn("registry", cmd, &dir.join("registry.log"))?;
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            proc.check_running()?;
            if Instant::now() > deadline {
                bail!(
                    "the registry did not listen on {host} within 30 s; {} ends:\n{}",
                    proc.log.display(),
                    tail(&proc.log, 20)
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let ca_file = bed.ca_file();
        if let Some(nodes) = bed.nodes.as_ref() {
            nodes.trust_registry(&host, &ca_file)?;
        }
        Ok(Self {
            _proc: proc,
            host,
            ca_file,
            crane: tools.crane,
            dir,
        })
    }

    /// Pushes the OCI archive `archive` (one image, as `scripts/image` packs
    /// it) to `<host>/<repository>:<tag>` and returns the manifest digest the
    /// registry stored (`sha256:…`).
    pub fn push_archive(&self, archive: &Path, repository: &str, tag: &str) -> Result<String> {
        let layout = self
            .dir
            .join(format!("layout-{}", repository.replace('/', "-")));
        std::fs::create_dir_all(&layout)?;
        let out = Command::new("tar")
            .arg("-xf")
            .arg(archive)
            .arg("-C")
            .arg(&layout)
            .output()
            .context("running tar")?;
        if !out.status.success() {
            bail!(
                "unpacking {}: {}",
                archive.display(),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let reference = format!("{}/{repository}:{tag}", self.host);
        let out = self.crane(&["push", &layout.display().to_string(), &reference])?;
        // crane prints the pushed image as REPOSITORY@DIGEST.
        out.trim()
            .rsplit_once('@')
            .map(|(_, d)| d.to_string())
            .with_context(|| format!("crane push printed {out:?}, not REPOSITORY@DIGEST"))
    }

    /// Each platform of `repository@digest` with its manifest's digest: the
    /// index's entries, or the image itself (`linux/amd64`, what
    /// `scripts/image` packs alone) when `digest` names one manifest.
    pub fn platform_manifests(
        &self,
        repository: &str,
        digest: &str,
    ) -> Result<Vec<(String, String)>> {
        let reference = format!("{repository}@{digest}");
        let text = self.crane(&["manifest", &reference])?;
        let manifest: serde_json::Value = serde_json::from_str(&text)
            .with_context(|| format!("crane manifest {reference} printed no JSON"))?;
        let Some(entries) = manifest["manifests"].as_array() else {
            return Ok(vec![("linux/amd64".to_string(), digest.to_string())]);
        };
        entries
            .iter()
            .map(|e| {
                let platform = format!(
                    "{}/{}",
                    e["platform"]["os"].as_str().unwrap_or_default(),
                    e["platform"]["architecture"].as_str().unwrap_or_default()
                );
                let d = e["digest"]
                    .as_str()
                    .with_context(|| format!("an entry of {reference}'s index has no digest"))?;
                Ok((platform, d.to_string()))
            })
            .collect()
    }

    /// Pushes `base` with one more layer holding `/name` (`content`) as
    /// `tag` (`HOST/REPOSITORY:TAG`), as someone replacing a released image
    /// would, and returns the new digest.
    pub fn append_file(&self, base: &str, name: &str, content: &[u8], tag: &str) -> Result<String> {
        let dir = self.dir.join("append");
        std::fs::create_dir_all(dir.join("root"))?;
        std::fs::write(dir.join("root").join(name), content)?;
        let layer = dir.join("layer.tar");
        let out = Command::new("tar")
            .arg("-cf")
            .arg(&layer)
            .arg("-C")
            .arg(dir.join("root"))
            .arg(name)
            .output()
            .context("running tar")?;
        if !out.status.success() {
            bail!("packing {name}: {}", String::from_utf8_lossy(&out.stderr));
        }
        let layer = layer.display().to_string();
        let out = self.crane(&[
            "append",
            "--base",
            base,
            "--new_layer",
            &layer,
            "--new_tag",
            tag,
        ])?;
        out.trim()
            .rsplit_once('@')
            .map(|(_, d)| d.to_string())
            .with_context(|| format!("crane append printed {out:?}, not REPOSITORY@DIGEST"))
    }

    /// Runs `crane ARGS` trusting the bed's CA; fails with what it printed.
    pub fn crane(&self, args: &[&str]) -> Result<String> {
        let out = Command::new(&self.crane)
            .args(args)
            .env("SSL_CERT_FILE", &self.ca_file)
            .output()
            .with_context(|| format!("running {}", self.crane.display()))?;
        if !out.status.success() {
            bail!(
                "crane {} failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}
