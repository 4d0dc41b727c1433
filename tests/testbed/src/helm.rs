//! graceguard installed as users install it: the real `helm` CLI
//! (`scripts/install-helm`) and the images `scripts/image` packs, imported
//! into the bed's real nodes. And a client that keeps sending pod Creates
//! while the release changes, recording every answer that was not the one
//! graceguard gives.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, PostParams};
use kube::{Api, ResourceExt};
use serde::Deserialize;

use crate::pods::{self, CreateOutcome};
use crate::TestBed;

/// The chart in this checkout.
pub fn chart_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../charts/graceguard")
}

/// The path `var` names, or an error saying which script sets it.
pub(crate) fn env_path(var: &str, set_by: &str) -> Result<PathBuf> {
    match std::env::var_os(var) {
        Some(p) if !p.is_empty() => Ok(PathBuf::from(p)),
        _ => bail!(
            "{var} is not set: run this test through scripts/test, which sets it from {set_by}"
        ),
    }
}

/// One image `scripts/image --json` packed.
#[derive(Clone, Debug, Deserialize)]
pub struct Image {
    pub name: String,
    /// REPOSITORY:TAG.
    #[serde(rename = "ref")]
    pub reference: String,
    pub archive: PathBuf,
    pub digest: String,
    /// The platforms the archive holds (`linux/amd64`; an index may hold more).
    #[serde(default = "amd64_only")]
    pub platforms: Vec<String>,
}

fn amd64_only() -> Vec<String> {
    vec!["linux/amd64".to_string()]
}

impl Image {
    pub fn repository(&self) -> &str {
        self.reference.rsplit_once(':').map_or("", |(r, _)| r)
    }

    pub fn tag(&self) -> &str {
        self.reference.rsplit_once(':').map_or("", |(_, t)| t)
    }
}

#[derive(Deserialize)]
struct Images {
    images: Vec<Image>,
}

/// The image `name` (`graceguard-webhook`, `graceguard`) of the
/// `scripts/image --json` output that `var` names: `GRACEGUARD_IMAGES` (the
/// version's tag) or `GRACEGUARD_IMAGES_NEXT` (the same binaries packed with
/// another tag, for an upgrade that changes the image), both written by
/// scripts/test.
pub fn image(var: &str, name: &str) -> Result<Image> {
    image_in(&env_path(var, "`scripts/image --json`")?, name)
}

/// The release an upgrade starts from (tests/previous-release), as
/// `scripts/previous-release --json` built it from its own commit
/// (`GRACEGUARD_PREVIOUS_RELEASE`, set by scripts/test).
#[derive(Debug, Deserialize)]
pub struct PreviousRelease {
    pub version: String,
    /// Its checkout: its own scripts/package-chart packages its chart.
    pub source: PathBuf,
    /// Its `scripts/image --json` output ([`image_in`]).
    pub images: PathBuf,
}

/// The previous release, from `GRACEGUARD_PREVIOUS_RELEASE`.
pub fn previous_release() -> Result<PreviousRelease> {
    let path = env_path(
        "GRACEGUARD_PREVIOUS_RELEASE",
        "`scripts/previous-release --json`",
    )?;
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(&text)
        .with_context(|| format!("{} is not scripts/previous-release's JSON", path.display()))
}

/// The image `name` of the `scripts/image --json` output in the file `path`.
pub fn image_in(path: &Path, name: &str) -> Result<Image> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading {} (scripts/image --json)", path.display()))?;
    let i: Images = serde_json::from_str(&text)
        .with_context(|| format!("{} is not scripts/image's JSON", path.display()))?;
    i.images
        .into_iter()
        .find(|i| i.name == name)
        .with_context(|| format!("{} lists no image {name}", path.display()))
}

/// The helm CLI, with its own config, cache and data directories (nothing
/// of the user's `~/.config/helm` is read or written) and the bed's kubeconfig.
pub struct Helm {
    bin: PathBuf,
    home: PathBuf,
    kubeconfig: PathBuf,
    /// A CA to trust for registries (`SSL_CERT_FILE`), as a machine whose
    /// trust store holds the registry's CA.
    ca_file: Option<PathBuf>,
}

/// What one helm command printed.
#[derive(Debug)]
pub struct HelmOutput {
    pub success: bool,
    pub stdout: String,
    pub stderr: String,
}

impl Helm {
    /// Helm 4, as `GRACEGUARD_HELM` names it (scripts/install-helm).
    pub fn for_bed(bed: &TestBed) -> Result<Self> {
        Self::with(
            env_path("GRACEGUARD_HELM", "`scripts/install-helm --json`")?,
            bed,
        )
    }

    /// Helm 3, as `GRACEGUARD_HELM3` names it (scripts/install-helm).
    pub fn helm3_for_bed(bed: &TestBed) -> Result<Self> {
        Self::with(
            env_path("GRACEGUARD_HELM3", "`scripts/install-helm --json`")?,
            bed,
        )
    }

    pub fn with(bin: PathBuf, bed: &TestBed) -> Result<Self> {
        let home = bed.dir().join("helm-home");
        std::fs::create_dir_all(&home).with_context(|| format!("creating {}", home.display()))?;
        Ok(Self {
            bin,
            home,
            kubeconfig: bed.kubeconfig.clone(),
            ca_file: None,
        })
    }

    /// This helm, trusting the CA in `ca_file` for OCI registries.
    pub fn trusting(mut self, ca_file: &Path) -> Self {
        self.ca_file = Some(ca_file.to_path_buf());
        self
    }

    /// Runs `helm ARGS` against the bed; a failure is an output, not an error.
    pub fn run<S: AsRef<str>>(&self, args: &[S]) -> Result<HelmOutput> {
        let args: Vec<&str> = args.iter().map(AsRef::as_ref).collect();
        let mut cmd = Command::new(&self.bin);
        if let Some(ca) = &self.ca_file {
            cmd.env("SSL_CERT_FILE", ca);
        }
        let out = cmd
            .args(&args)
            .env("KUBECONFIG", &self.kubeconfig)
            .env("HELM_CONFIG_HOME", self.home.join("config"))
            .env("HELM_CACHE_HOME", self.home.join("cache"))
            .env("HELM_DATA_HOME", self.home.join("data"))
            .output()
            .with_context(|| format!("running {} {}", self.bin.display(), args.join(" ")))?;
        Ok(HelmOutput {
            success: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        })
    }

    /// Installs this repository's chart as `release` in `ns` (created if
    /// missing), each of `sets` a `--set`, and waits up to 5 minutes for
    /// it to be Ready, as a user's `helm install --wait` does.
    pub fn install(&self, release: &str, ns: &str, sets: &[&str]) -> Result<String> {
        let chart = chart_dir().display().to_string();
        let mut args = vec!["install", release, &chart, "-n", ns, "--create-namespace"];
        for s in sets {
            args.extend(["--set", s]);
        }
        args.extend(["--wait", "--timeout", "5m"]);
        self.ok(&args)
    }

    /// Helm's major version (3 or 4), from `helm version --short`.
    pub fn major(&self) -> Result<u32> {
        let v = self.ok(&["version", "--short"])?;
        v.trim()
            .strip_prefix('v')
            .and_then(|v| v.split('.').next())
            .and_then(|m| m.parse().ok())
            .with_context(|| {
                format!("`helm version --short` printed {v:?}, not vMAJOR.MINOR.PATCH")
            })
    }

    /// Runs `helm ARGS` and fails with what it printed unless it succeeded.
    pub fn ok<S: AsRef<str>>(&self, args: &[S]) -> Result<String> {
        let out = self.run(args)?;
        if !out.success {
            bail!(
                "helm {} failed:\n{}\n{}",
                args.iter().map(AsRef::as_ref).collect::<Vec<_>>().join(" "),
                out.stdout,
                out.stderr
            );
        }
        Ok(out.stdout)
    }
}

/// Every webhook (named `configuration/webhook`) of the Validating- and
/// MutatingWebhookConfigurations `selector` selects, with its client config.
pub async fn webhook_clients(
    bed: &TestBed,
    selector: &str,
) -> Result<Vec<(String, WebhookClientConfig)>> {
    let lp = ListParams::default().labels(selector);
    let validating = Api::<ValidatingWebhookConfiguration>::all(bed.client.clone())
        .list(&lp)
        .await?
        .items
        .into_iter()
        .map(|c| {
            (
                c.name_any(),
                c.webhooks
                    .unwrap_or_default()
                    .into_iter()
                    .map(|w| (w.name, w.client_config))
                    .collect::<Vec<_>>(),
            )
        });
    let mutating = Api::<MutatingWebhookConfiguration>::all(bed.client.clone())
        .list(&lp)
        .await?
        .items
        .into_iter()
        .map(|c| {
            (
                c.name_any(),
                c.webhooks
                    .unwrap_or_default()
                    .into_iter()
                    .map(|w| (w.name, w.client_config))
                    .collect(),
            )
        });
    Ok(validating
        .chain(mutating)
        .flat_map(|(cfg, hooks)| {
            hooks
                .into_iter()
                .map(move |(name, cc)| (format!("{cfg}/{name}"), cc))
        })
        .collect())
}

/// Imports `archive` into every real node's containerd.
pub fn load(bed: &TestBed, archive: &Path) -> Result<()> {
    let nodes = bed
        .nodes
        .as_ref()
        .context("the bed has no real nodes to import images into")?;
    nodes.load(archive)?;
    Ok(())
}

/// What a Create is expected to get while the loop runs.
#[derive(Clone, Copy, Debug)]
pub enum Expect {
    /// A Create of a name a live pod holds: graceguard's 409, whose message
    /// says it denied the Create before quota. The API server's own 409 means
    /// graceguard was not asked (or failed open) and quota was charged.
    GraceguardDenial,
    /// A dry-run Create of a fresh name: admitted (201).
    Admitted,
}

impl Expect {
    fn what(self) -> &'static str {
        match self {
            Expect::GraceguardDenial => "graceguard's denial",
            Expect::Admitted => "admitted",
        }
    }
}

/// Every answer of a [`CreateLoop`] that differed from what was expected.
#[derive(Debug)]
pub struct LoopReport {
    pub sent: usize,
    pub wrong: Vec<String>,
    expect: Expect,
}

impl LoopReport {
    /// Panics, listing them, if any Create sent `during` something got
    /// another answer than expected.
    pub fn assert_all_right(&self, during: &str) {
        assert!(
            self.wrong.is_empty(),
            "{} of {} Creates during {during} were not {}: {:#?}",
            self.wrong.len(),
            self.sent,
            self.expect.what(),
            self.wrong
        );
    }
}

/// Sends one pod Create every `period` until stopped.
pub struct CreateLoop {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Result<LoopReport>>,
}

impl CreateLoop {
    /// Starts the loop in `ns`: `name` is the held name for
    /// [`Expect::GraceguardDenial`], the prefix of fresh names for
    /// [`Expect::Admitted`].
    pub fn start(api: Api<Pod>, name: &str, expect: Expect, period: Duration) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let name = name.to_string();
        let task = tokio::spawn(async move {
            let mut report = LoopReport {
                sent: 0,
                wrong: Vec::new(),
                expect,
            };
            let mut tick = tokio::time::interval(period);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            while !flag.load(Ordering::Relaxed) {
                tick.tick().await;
                let i = report.sent;
                report.sent += 1;
                let (pod_name, pp) = match expect {
                    Expect::GraceguardDenial => (name.clone(), PostParams::default()),
                    Expect::Admitted => (
                        format!("{name}-{i}"),
                        PostParams {
                            dry_run: true,
                            ..Default::default()
                        },
                    ),
                };
                let pod = pods::task_pod(&pod_name, 0);
                let got = pods::outcome(api.create(&pp, &pod).await);
                let right = match (&got, expect) {
                    (
                        Ok(CreateOutcome::Refused {
                            code: 409, message, ..
                        }),
                        Expect::GraceguardDenial,
                    ) => message.contains("graceguard denied this Create"),
                    (Ok(CreateOutcome::Created), Expect::Admitted) => true,
                    _ => false,
                };
                if !right {
                    report
                        .wrong
                        .push(format!("Create #{i} of {pod_name}: {got:?}"));
                }
            }
            Ok(report)
        });
        Self { stop, task }
    }

    /// Stops the loop and returns what it saw.
    pub async fn finish(self) -> Result<LoopReport> {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.context("the Create loop panicked")?
    }
}
