//! Hollow nodes: kubemark's hollow kubelet (`k8s.io/kubernetes/cmd/kubemark
//! --morph=kubelet`: the real kubelet code with a fake container runtime and
//! a fake cAdvisor), one process per node, each acting as
//! `system:node:<name>` with its own client certificate, so the Node
//! authorizer and NodeRestriction judge it as they judge a real kubelet. It
//! registers its Node, renews its Lease, reports pod status and stops pods on
//! a graceful delete, with no containers behind them: the load many nodes put
//! on the control plane, without their cost.
//!
//! Every hollow node is tainted ([`TAINT`]): only pods that tolerate it land
//! there. graceguard's own pods must run on a real node: on a hollow one they
//! would "run" on the fake runtime, every call to them would fail open, and
//! the measurement would be of nothing.
//!
//! kubemark writes its root directory and its fake runtime's socket under
//! `/tmp` and its serving certificate under `/var/lib/kubelet/pki`, none of
//! them configurable; each hollow node therefore runs in a mount namespace of
//! its own, inside the bed's, where those two are its own directories.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use k8s_openapi::api::core::v1::Node;
use kube::api::ListParams;
use kube::{Api, Client};

use super::bins::NodeBins;
use super::mountns::MountNs;
use crate::process::{free_port, tail, Managed};

/// The taint every hollow node registers with (`key=value:Effect`).
pub const TAINT: &str = "graceguard.dev/hollow=true:NoSchedule";
/// The taint's key, for a workload's toleration.
pub const TAINT_KEY: &str = "graceguard.dev/hollow";
/// The label every hollow node carries, for a workload's node selector.
pub const LABEL: (&str, &str) = ("graceguard.dev/hollow", "true");
/// The Go runtime's soft memory limit of each hollow kubelet. Idle, one uses
/// about 95 MB; the limit makes the garbage collector work harder before it
/// grows past it, so N nodes need about N times this.
pub const MEMORY_LIMIT: &str = "96MiB";
/// Pods each hollow node admits (the kubelet's default).
pub const MAX_PODS: u32 = 110;

/// The name of hollow node `k` (1-based).
pub fn name(k: usize) -> String {
    format!("hollow-{k}")
}

/// One hollow kubelet.
pub struct HollowNode {
    pub name: String,
    pub proc: Managed,
    pub dir: PathBuf,
}

impl HollowNode {
    /// Starts hollow node `name` inside the bed's mount namespace `ns`, with
    /// its files under `dir` and the node's identity in `kubeconfig`.
    pub fn start(
        ns: &MountNs,
        bins: &NodeBins,
        name: &str,
        kubeconfig: &Path,
        dir: &Path,
    ) -> Result<Self> {
        let (tmp, pki) = (dir.join("tmp"), dir.join("pki"));
        for d in [&tmp, &pki] {
            std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
        }
        let kubemark = bins.bin("kubemark")?;
        let port = free_port()?;
        // (every path here is the bed's own, without quotes in it)
        let script = format!(
            "set -e\nmkdir -p /var/lib/kubelet/pki\nmount --bind '{}' /tmp\nmount --bind '{}' /var/lib/kubelet/pki\nexec '{}' \"$@\"\n",
            tmp.display(),
            pki.display(),
            kubemark.display()
        );
        let mut cmd = ns.command(Path::new("unshare"));
        cmd.args(["--mount", "--propagation", "private", "--", "sh", "-c"])
            .arg(script)
            .arg("kubemark")
            .arg("--morph=kubelet")
            .arg(format!("--name={name}"))
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg(format!("--kubelet-port={port}"))
            .arg("--kubelet-read-only-port=0")
            // No image service of the machine's: the fake one.
            .arg("--use-host-image-service=false")
            .arg(format!("--register-with-taints={TAINT}"))
            .arg(format!("--node-labels={}={}", LABEL.0, LABEL.1))
            .arg(format!("--max-pods={MAX_PODS}"))
            .env("GOMEMLIMIT", MEMORY_LIMIT)
            .env("PATH", bins.path_env());
        let proc = Managed::spawn(
            &format!("hollow kubelet {name}"),
            cmd,
            &dir.join("kubemark.log"),
        )?;
        Ok(Self {
            name: name.to_string(),
            proc,
            dir: dir.to_path_buf(),
        })
    }
}

/// Waits until all of `hollow` report Ready, allowing two seconds per node
/// on top of two minutes (they register at once and share two cores: 50
/// took 92 s on an otherwise idle machine).
pub async fn wait_ready(admin: &Client, hollow: &mut [HollowNode]) -> Result<()> {
    let nodes: Api<Node> = Api::all(admin.clone());
    let lp = ListParams::default().labels(&format!("{}={}", LABEL.0, LABEL.1));
    let limit = Duration::from_secs(120 + 2 * hollow.len() as u64);
    let deadline = Instant::now() + limit;
    let mut last_error = String::new();
    loop {
        for n in hollow.iter_mut() {
            n.proc.check_running()?;
        }
        // A failed list (an API server busy with many registrations at once)
        // is tried again until the deadline.
        let listed = match nodes.list(&lp).await {
            Ok(l) => l.items,
            Err(e) => {
                last_error = format!(" (the last Node list failed: {e})");
                Vec::new()
            }
        };
        let ready: std::collections::HashSet<String> = listed
            .into_iter()
            .filter(|node| {
                node.status
                    .as_ref()
                    .and_then(|s| s.conditions.as_ref())
                    .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
            })
            .filter_map(|node| node.metadata.name)
            .collect();
        let missing: Vec<&HollowNode> =
            hollow.iter().filter(|n| !ready.contains(&n.name)).collect();
        let Some(first) = missing.first() else {
            return Ok(());
        };
        if Instant::now() > deadline {
            bail!(
                "{} of {} hollow nodes were not Ready in {} s ({} among them){last_error}; {} ends:\n{}",
                missing.len(),
                hollow.len(),
                limit.as_secs(),
                first.name,
                first.proc.log.display(),
                tail(&first.proc.log, 30)
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
