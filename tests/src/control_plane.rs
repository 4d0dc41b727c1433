//! etcd + kube-apiserver on loopback.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{ObjectMeta, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};
use tempfile::TempDir;

use crate::audit_log::AuditLog;
use crate::binaries;
use crate::process::{free_port, tail, Managed};

/// Users the bed's API server knows, by bearer token. All are cluster admins
/// (`system:masters`), so tests can tell requests apart by user in audit records
/// without setting up RBAC.
/// `graceguard` is the identity the webhook runs as.
pub const USERS: &[&str] = &["admin", "alice", "bob", "graceguard"];

/// How to start a [`TestBed`].
#[derive(Clone, Debug, Default)]
pub struct TestBedOptions {
    /// Write the apiserver's audit log (metadata level, every request), so a
    /// test can count requests by verb, resource and user.
    pub audit: bool,
}

/// A running etcd + kube-apiserver. Dropping it stops both. If the test
/// panicked, the directory with their logs is kept and its path printed.
pub struct TestBed {
    // Field order is drop order: the apiserver stops before etcd.
    apiserver: Managed,
    etcd: Managed,
    dir: Option<TempDir>,
    /// An admin client.
    pub client: Client,
    /// https://127.0.0.1:PORT
    pub url: String,
    /// A kubeconfig for the admin user (also usable by kubectl).
    pub kubeconfig: PathBuf,
    ns_counter: AtomicU32,
}

impl TestBed {
    /// Starts a bed with default options.
    pub async fn start() -> Result<Self> {
        Self::start_with(TestBedOptions::default()).await
    }

    /// Starts etcd and kube-apiserver and waits until the apiserver is ready.
    /// Fails (never skips) with a message naming what is missing or what the
    /// processes logged.
    pub async fn start_with(opts: TestBedOptions) -> Result<Self> {
        graceguard_certs::install_crypto_provider();
        let apiserver_bin = binaries::kube_apiserver()?;
        let etcd_bin = binaries::etcd()?;
        // etcd fsyncs every write; tmpfs keeps that cheap when it exists.
        let dir = match Path::new("/dev/shm").is_dir() {
            true => tempfile::Builder::new()
                .prefix("graceguard-bed-")
                .tempdir_in("/dev/shm"),
            false => tempfile::Builder::new().prefix("graceguard-bed-").tempdir(),
        }
        .context("creating the test bed's directory")?;
        let d = dir.path().to_path_buf();

        // etcd.
        let (client_port, peer_port) = (free_port()?, free_port()?);
        let etcd_url = format!("http://127.0.0.1:{client_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let mut cmd = Command::new(&etcd_bin);
        cmd.arg("--name=bed")
            .arg(format!("--data-dir={}", d.join("etcd").display()))
            .arg(format!("--listen-client-urls={etcd_url}"))
            .arg(format!("--advertise-client-urls={etcd_url}"))
            .arg(format!("--listen-peer-urls={peer_url}"))
            .arg(format!("--initial-advertise-peer-urls={peer_url}"))
            .arg(format!("--initial-cluster=bed={peer_url}"))
            .arg("--log-level=warn")
            .arg("--logger=zap");
        let etcd = Managed::spawn("etcd", cmd, &d.join("etcd.log"))?;

        // Certificates, service-account key, tokens, audit policy.
        let ca = graceguard_certs::Ca::new("graceguard-test-bed-ca")?;
        let serving = ca.issue_server(&["localhost".into()], &["127.0.0.1".parse()?])?;
        ca.write_files(&serving, &d.join("pki"))?;
        let (sa_key, sa_pub) = (d.join("pki/sa.key"), d.join("pki/sa.pub"));
        let (private_pem, public_pem) = graceguard_certs::generate::key_pair_pem()?;
        std::fs::write(&sa_key, private_pem)?;
        std::fs::write(&sa_pub, public_pem)?;
        let tokens: String = USERS
            .iter()
            .map(|u| format!("{},{u},{u},\"system:masters\"\n", token_for(u)))
            .collect();
        std::fs::write(d.join("tokens.csv"), tokens)?;

        let port = free_port()?;
        let url = format!("https://127.0.0.1:{port}");
        let mut cmd = Command::new(&apiserver_bin);
        cmd.arg(format!("--etcd-servers={etcd_url}"))
            .arg("--bind-address=127.0.0.1")
            .arg("--advertise-address=127.0.0.1")
            .arg(format!("--secure-port={port}"))
            .arg("--insecure-port=0")
            .arg(format!(
                "--tls-cert-file={}",
                d.join("pki/tls.crt").display()
            ))
            .arg(format!(
                "--tls-private-key-file={}",
                d.join("pki/tls.key").display()
            ))
            .arg(format!(
                "--token-auth-file={}",
                d.join("tokens.csv").display()
            ))
            .arg("--authorization-mode=RBAC")
            .arg("--service-account-issuer=https://kubernetes.default.svc")
            .arg(format!("--service-account-key-file={}", sa_pub.display()))
            .arg(format!(
                "--service-account-signing-key-file={}",
                sa_key.display()
            ))
            .arg("--service-cluster-ip-range=10.0.0.0/24")
            // No controller-manager runs, so no default ServiceAccount would ever exist.
            .arg("--disable-admission-plugins=ServiceAccount")
            .arg("--enable-admission-plugins=ResourceQuota")
            .arg(format!("--cert-dir={}", d.join("pki").display()))
            .arg("--v=1");
        if opts.audit {
            std::fs::write(
                d.join("audit-policy.yaml"),
                "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [\"RequestReceived\"]\nrules:\n- level: Metadata\n",
            )?;
            cmd.arg(format!(
                "--audit-policy-file={}",
                d.join("audit-policy.yaml").display()
            ))
            .arg(format!(
                "--audit-log-path={}",
                d.join("audit.log").display()
            ))
            .arg("--audit-log-mode=blocking");
        }
        let apiserver = Managed::spawn("kube-apiserver", cmd, &d.join("kube-apiserver.log"))?;

        let kubeconfig = d.join("kubeconfig");
        write_kubeconfig(&kubeconfig, &url, &d.join("pki/ca.crt"), "admin")?;
        let client = client_from(&kubeconfig).await?;

        let mut bed = Self {
            apiserver,
            etcd,
            dir: Some(dir),
            client,
            url,
            kubeconfig,
            ns_counter: AtomicU32::new(0),
        };
        bed.wait_ready().await?;
        Ok(bed)
    }

    async fn wait_ready(&mut self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            self.etcd.check_running()?;
            self.apiserver.check_running()?;
            let req = http::Request::get("/readyz").body(Vec::new())?;
            let last = match self.client.request_text(req).await {
                Ok(body) if body.trim() == "ok" => return Ok(()),
                Ok(body) => body,
                Err(e) => e.to_string(),
            };
            if Instant::now() > deadline {
                bail!(
                    "kube-apiserver did not become ready in 90 s (last answer: {last}); its log ends:\n{}",
                    tail(&self.apiserver.log, 25)
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// The bed's directory (logs, certificates, kubeconfigs).
    pub fn dir(&self) -> &Path {
        self.dir
            .as_ref()
            .map(TempDir::path)
            .unwrap_or(Path::new("/"))
    }

    /// The CA that signed the apiserver's certificate.
    pub fn ca_file(&self) -> PathBuf {
        self.dir().join("pki/ca.crt")
    }

    /// A kubeconfig that authenticates as `user` (one of [`USERS`]).
    pub fn kubeconfig_for(&self, user: &str) -> Result<PathBuf> {
        let path = self.dir().join(format!("kubeconfig-{user}"));
        write_kubeconfig(&path, &self.url, &self.ca_file(), user)?;
        Ok(path)
    }

    /// A client that authenticates as `user` (one of [`USERS`]).
    pub async fn client_as(&self, user: &str) -> Result<Client> {
        client_from(&self.kubeconfig_for(user)?).await
    }

    /// A fresh namespace for one test, `prefix-N`.
    pub async fn namespace(&self, prefix: &str) -> Result<String> {
        let n = self.ns_counter.fetch_add(1, Ordering::Relaxed);
        let name = format!("{prefix}-{n}");
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                ..Default::default()
            },
            ..Default::default()
        };
        Api::<Namespace>::all(self.client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .with_context(|| format!("creating namespace {name}"))?;
        Ok(name)
    }

    /// The apiserver's audit log; fails if the bed was started without `audit`.
    pub fn audit_log(&self) -> Result<AuditLog> {
        let path = self.dir().join("audit.log");
        if !path.exists() {
            bail!(
                "no audit log at {}: start the bed with TestBedOptions {{ audit: true }}",
                path.display()
            );
        }
        Ok(AuditLog::new(path))
    }

    /// Runs kubectl against the bed as `user`; returns (success, stdout, stderr).
    pub fn kubectl(&self, user: &str, args: &[&str]) -> Result<(bool, String, String)> {
        let out = Command::new("kubectl")
            .arg(format!(
                "--kubeconfig={}",
                self.kubeconfig_for(user)?.display()
            ))
            .args(args)
            .output()
            .context("running kubectl (it is expected on PATH)")?;
        Ok((
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        ))
    }
}

impl Drop for TestBed {
    fn drop(&mut self) {
        let _ = self.apiserver.stop(Duration::from_secs(5));
        let _ = self.etcd.stop(Duration::from_secs(5));
        if std::thread::panicking() {
            if let Some(dir) = self.dir.take() {
                let kept = dir.keep();
                eprintln!("test bed logs kept in {}", kept.display());
            }
        }
    }
}

/// The static bearer token of a bed user.
pub fn token_for(user: &str) -> String {
    format!("graceguard-test-token-{user}")
}

fn write_kubeconfig(path: &Path, url: &str, ca: &Path, user: &str) -> Result<()> {
    let cfg = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "bed", "cluster": {"server": url, "certificate-authority": ca}}],
        "users": [{"name": user, "user": {"token": token_for(user)}}],
        "contexts": [{"name": "bed", "context": {"cluster": "bed", "user": user}}],
        "current-context": "bed",
    });
    std::fs::write(path, serde_json::to_vec_pretty(&cfg)?)
        .with_context(|| format!("writing {}", path.display()))
}

/// A kube client from a kubeconfig file.
pub async fn client_from(kubeconfig: &Path) -> Result<Client> {
    let kc = Kubeconfig::read_from(kubeconfig)
        .with_context(|| format!("reading kubeconfig {}", kubeconfig.display()))?;
    let mut cfg = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
    // Tests assert on the API server's raw answers: kube-rs would otherwise
    // re-send a 429 after its Retry-After by itself (as retry mode intends).
    cfg.default_retry = false;
    Ok(Client::try_from(cfg)?)
}
