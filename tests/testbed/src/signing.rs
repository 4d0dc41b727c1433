//! Signing as a release signs and verifying as a user verifies: the SBOMs
//! come from `scripts/sbom`, the signatures and attestations from
//! `scripts/sign` (what `scripts/release` runs), and the checks are plain
//! `cosign verify` command lines against the bed's registry with the
//! release's public key, which is what a user types before installing.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use anyhow::{bail, Context, Result};
use base64::Engine as _;
use serde::Deserialize;

/// Where `scripts/install-signing --json` put the tools (`GRACEGUARD_SIGNING_TOOLS`).
#[derive(Deserialize)]
struct Tools {
    cosign: PathBuf,
}

/// The password of the bed's throwaway key (cosign encrypts every private key).
const PASSWORD: &str = "graceguard-test-bed";

fn scripts() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts")
}

/// Runs `cmd`; fails with what it printed unless it succeeded.
fn run(mut cmd: Command, what: &str) -> Result<Output> {
    let out = cmd.output().with_context(|| format!("running {what}"))?;
    if !out.status.success() {
        bail!(
            "{what} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(out)
}

/// One SBOM `scripts/sbom --json` wrote.
#[derive(Clone, Debug, Deserialize)]
pub struct Sbom {
    /// The binary it describes (`graceguard-webhook`).
    pub name: String,
    /// `linux/amd64`.
    pub platform: String,
    pub file: PathBuf,
}

/// Writes the SBOMs of both binaries for `platforms` into `out`.
pub fn sboms(out: &Path, platforms: &[String]) -> Result<Vec<Sbom>> {
    let mut cmd = Command::new(scripts().join("sbom"));
    cmd.arg("--out")
        .arg(out)
        .args(["--platforms", &platforms.join(","), "--json"]);
    let out = run(cmd, "scripts/sbom")?;
    #[derive(Deserialize)]
    struct Listing {
        sboms: Vec<Sbom>,
    }
    let listing: Listing =
        serde_json::from_slice(&out.stdout).context("scripts/sbom --json printed no listing")?;
    Ok(listing.sboms)
}

/// A cosign key pair made for one bed, and the CA its registry chains to.
pub struct Signer {
    cosign: PathBuf,
    key: PathBuf,
    /// The public half: what a release publishes and users verify with.
    pub public_key: PathBuf,
    ca_file: PathBuf,
}

impl Signer {
    /// Makes a key pair in `dir` (`cosign generate-key-pair`).
    pub fn new(dir: &Path, ca_file: &Path) -> Result<Self> {
        let path = crate::helm::env_path(
            "GRACEGUARD_SIGNING_TOOLS",
            "`scripts/install-signing --json`",
        )?;
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        let tools: Tools = serde_json::from_str(&text)
            .with_context(|| format!("{} is not scripts/install-signing's JSON", path.display()))?;
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let mut cmd = Command::new(&tools.cosign);
        cmd.current_dir(dir)
            .args(["generate-key-pair"])
            .env("COSIGN_PASSWORD", PASSWORD);
        run(cmd, "cosign generate-key-pair")?;
        Ok(Self {
            cosign: tools.cosign,
            key: dir.join("cosign.key"),
            public_key: dir.join("cosign.pub"),
            ca_file: ca_file.to_path_buf(),
        })
    }

    /// Signs each `REPOSITORY@DIGEST` with `scripts/sign --key`, attaching
    /// its SBOM when one is given; the script verifies what it made.
    pub fn sign(&self, artifacts: &[(String, Option<PathBuf>)]) -> Result<()> {
        let mut cmd = Command::new(scripts().join("sign"));
        cmd.arg("--key").arg(&self.key);
        for (reference, sbom) in artifacts {
            match sbom {
                Some(s) => cmd.arg(format!("{reference}={}", s.display())),
                None => cmd.arg(reference),
            };
        }
        cmd.env("COSIGN_PASSWORD", PASSWORD)
            .env("SSL_CERT_FILE", &self.ca_file);
        run(cmd, "scripts/sign")?;
        Ok(())
    }

    /// `cosign verify --key cosign.pub REFERENCE` as a user runs it with a
    /// key-pair release (no transparency log). `Ok(Err(message))` is a
    /// verification that failed, with cosign's reason.
    pub fn verify(&self, reference: &str) -> Result<std::result::Result<(), String>> {
        self.cosign_verify(&["verify"], reference)
            .map(|r| r.map(|_| ()))
    }

    /// `cosign verify-attestation --type cyclonedx`: the in-toto statements
    /// of the SBOMs attached to `reference`, decoded.
    pub fn sbom_attestations(&self, reference: &str) -> Result<Vec<serde_json::Value>> {
        let stdout =
            match self.cosign_verify(&["verify-attestation", "--type", "cyclonedx"], reference)? {
                Ok(s) => s,
                Err(e) => bail!("no verified SBOM attestation on {reference}: {e}"),
            };
        let mut statements = Vec::new();
        // One JSON envelope per line; its payload is the base64 statement.
        for line in stdout.lines().filter(|l| !l.trim().is_empty()) {
            let envelope: serde_json::Value = serde_json::from_str(line)
                .with_context(|| format!("cosign printed {line:.200}, not a DSSE envelope"))?;
            let payload = envelope["payload"].as_str().unwrap_or_default();
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(payload)
                .context("the attestation's payload is not base64")?;
            statements.push(
                serde_json::from_slice(&bytes)
                    .context("the attestation is not an in-toto statement")?,
            );
        }
        Ok(statements)
    }

    fn cosign_verify(
        &self,
        verb: &[&str],
        reference: &str,
    ) -> Result<std::result::Result<String, String>> {
        let dir = self
            .public_key
            .parent()
            .context("the public key has no directory")?;
        let trusted_root = dir.join("trusted-root.json");
        if !trusted_root.exists() {
            // An empty trusted root: the key is the whole trust, and cosign
            // fetches nothing from Sigstore's TUF repository.
            let mut cmd = Command::new(&self.cosign);
            cmd.args(["trusted-root", "create", "--out"])
                .arg(&trusted_root);
            run(cmd, "cosign trusted-root create")?;
        }
        let out = Command::new(&self.cosign)
            .args(verb)
            .arg("--key")
            .arg(&self.public_key)
            .args(["--insecure-ignore-tlog=true", "--trusted-root"])
            .arg(&trusted_root)
            .arg(reference)
            .env("SSL_CERT_FILE", &self.ca_file)
            .output()
            .with_context(|| format!("running {}", self.cosign.display()))?;
        Ok(if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
        })
    }
}
