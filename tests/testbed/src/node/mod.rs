//! Real nodes for the test bed: containerd, runc and the CNI plugins running
//! real containers, a real kubelet per node acting as `system:node:<name>`,
//! and (for `scripts/cluster`) kube-proxy. Built by `scripts/install-node`.
//!
//! Several nodes share the machine's network namespace (one kube-proxy can
//! then serve the API server's own calls to ClusterIPs); each has its own
//! kubelet port, root directory, cgroup root and containerd. All node
//! processes run in one private mount namespace per bed ([`mountns`]), so
//! the machine's `/run`, `/var/lib`, `/var/log` and sysctls are never
//! changed; what they change in the machine's network namespace (the bed's
//! bridge, node addresses on `lo`, iptables rules) and in `/sys/fs/cgroup`
//! is written to the slot's [`slot::Ledger`] before it is made, and removed
//! by [`cleanup::sweep`] at teardown or by the next holder of the slot. The
//! bed finds its processes by cgroup ([`cgroups`]), never by namespace.

pub mod bins;
pub mod cgroups;
pub mod cleanup;
pub mod containerd;
pub mod hollow;
pub mod kube_proxy;
pub mod kubelet;
pub mod kubelet_log;
pub mod mountns;
pub mod network;
pub mod slot;

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use k8s_openapi::api::core::v1::Node;
use kube::{Api, Client};

pub use bins::NodeBins;
use containerd::Containerd;
use kube_proxy::KubeProxy;
use kubelet::{KubeletProc, KubeletSpec};
use mountns::MountNs;
use slot::Slot;

use crate::process::tail;

/// One real node.
pub struct RealNode {
    pub name: String,
    pub ip: IpAddr,
    pub kubelet: KubeletProc,
    pub containerd: Containerd,
    pub dir: PathBuf,
}

/// What a node needs from the control plane.
pub struct NodeCredentials {
    /// Kubeconfig with the node's identity (`system:node:<name>`).
    pub kubeconfig: PathBuf,
    /// The kubelet's serving certificate and key, for its address.
    pub tls_cert: PathBuf,
    pub tls_key: PathBuf,
}

/// The real nodes of one bed. Dropping it stops them and removes everything
/// they made.
pub struct RealNodes {
    pub kube_proxy: Option<KubeProxy>,
    /// Held while `kube_proxy` runs: one kube-proxy per machine.
    proxy_lock: Option<slot::ProxyLock>,
    pub nodes: Vec<RealNode>,
    /// Hollow nodes ([`hollow`]), stopped first.
    pub hollow: Vec<hollow::HollowNode>,
    ns: Option<MountNs>,
    pub bins: NodeBins,
    pub slot: Slot,
    pub dir: PathBuf,
    /// Every kubelet's `--v`, a node that joins later's too.
    kubelet_verbosity: u8,
}

impl RealNodes {
    /// Starts `creds.len()` nodes named `node-1…` in `slot`, with their files
    /// under `dir`, and waits until every one is Ready.
    pub async fn start(
        mut slot: Slot,
        version: crate::KubeVersion,
        dir: &Path,
        admin: &Client,
        client_ca: &Path,
        creds: &[NodeCredentials],
        kubelet_verbosity: u8,
    ) -> Result<Self> {
        let bins = NodeBins::find(version)?;
        if creds.len() > usize::from(slot::MAX_NODES) {
            bail!(
                "a bed has at most {} real nodes; {} were asked for",
                slot::MAX_NODES,
                creds.len()
            );
        }
        std::fs::create_dir_all(dir)?;
        network::create_bridge(&mut slot)?;
        let system = slot.system_cgroup();
        slot.record(|l| l.cgroup_roots.push(system.clone()))?;
        cgroups::create(&system)?;
        let ns = MountNs::start(dir, &system)?;
        let mut me = Self {
            kube_proxy: None,
            proxy_lock: None,
            nodes: Vec::new(),
            hollow: Vec::new(),
            ns: Some(ns),
            bins,
            slot,
            dir: dir.to_path_buf(),
            kubelet_verbosity,
        };
        for (i, c) in creds.iter().enumerate() {
            let k = u8::try_from(i + 1)?;
            me.start_node(k, client_ca, c)?;
        }
        me.wait_ready(admin).await?;
        Ok(me)
    }

    fn ns(&self) -> Result<&MountNs> {
        self.ns
            .as_ref()
            .context("the bed's node mount namespace is gone")
    }

    fn start_node(&mut self, k: u8, client_ca: &Path, creds: &NodeCredentials) -> Result<()> {
        let name = format!("node-{k}");
        let ip = self.slot.node_ip(k);
        let node_dir = self.dir.join(&name);
        network::add_local_address(&mut self.slot, ip)?;
        let cni_conf = node_dir.join("cni/net.d");
        network::write_cni_config(&self.slot, k, &cni_conf, &node_dir.join("cni/ipam"))?;
        let containerd = Containerd::start(
            self.ns()?,
            &node_dir.join("containerd"),
            &self.bins,
            &cni_conf,
        )?;
        let root = self.slot.cgroup_root(k);
        self.slot.record(|l| {
            l.cgroup_roots.push(root.clone());
            l.kubelet_ran = true;
        })?;
        cgroups::create(&root)?;
        let spec = KubeletSpec {
            name: &name,
            node_ip: ip,
            kubeconfig: &creds.kubeconfig,
            client_ca,
            tls_cert: &creds.tls_cert,
            tls_key: &creds.tls_key,
            runtime_socket: &containerd.socket,
            cgroup_root: &root,
            taints: &[],
            labels: &[],
            verbosity: self.kubelet_verbosity,
        };
        let kubelet = KubeletProc::start(self.ns()?, &self.bins, &spec, &node_dir.join("kubelet"))?;
        self.nodes.push(RealNode {
            name,
            ip,
            kubelet,
            containerd,
            dir: node_dir,
        });
        Ok(())
    }

    /// Node `node-<k>` joins the running bed with `creds`, its kubelet
    /// starting `static_pods` (each as `<name>.json` in its manifest
    /// directory); returns once every node is Ready.
    pub async fn join(
        &mut self,
        k: u8,
        admin: &Client,
        client_ca: &Path,
        creds: &NodeCredentials,
        static_pods: &[k8s_openapi::api::core::v1::Pod],
    ) -> Result<()> {
        if k == 0 || k > slot::MAX_NODES {
            bail!(
                "a bed has at most {} real nodes; node-{k} cannot join",
                slot::MAX_NODES
            );
        }
        let manifests = self.dir.join(format!("node-{k}/kubelet/manifests"));
        std::fs::create_dir_all(&manifests)
            .with_context(|| format!("creating {}", manifests.display()))?;
        for pod in static_pods {
            let name = pod.metadata.name.clone().unwrap_or_default();
            std::fs::write(
                manifests.join(format!("{name}.json")),
                serde_json::to_vec(pod)?,
            )?;
        }
        self.start_node(k, client_ca, creds)?;
        self.wait_ready(admin).await
    }

    /// Waits until every node reports Ready (their kubelets registered them
    /// and the runtime and network are up).
    async fn wait_ready(&mut self, admin: &Client) -> Result<()> {
        let nodes: Api<Node> = Api::all(admin.clone());
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let mut not_ready = Vec::new();
            for n in &mut self.nodes {
                n.kubelet.proc.check_running()?;
                n.containerd.proc.check_running()?;
                let ready = nodes.get_opt(&n.name).await?.is_some_and(|node| {
                    node.status
                        .and_then(|s| s.conditions)
                        .unwrap_or_default()
                        .iter()
                        .any(|c| c.type_ == "Ready" && c.status == "True")
                });
                if !ready {
                    not_ready.push(n);
                }
            }
            if not_ready.is_empty() {
                return Ok(());
            }
            if Instant::now() > deadline {
                let n = &not_ready[0];
                bail!(
                    "node {} was not Ready in 120 s; {} ends:\n{}\n{} ends:\n{}",
                    n.name,
                    n.kubelet.proc.log.display(),
                    tail(&n.kubelet.proc.log, 30),
                    n.containerd.proc.log.display(),
                    tail(&n.containerd.proc.log, 10)
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Starts one hollow node per `(name, kubeconfig)` (each kubeconfig with
    /// that node's identity) and waits until every one is Ready.
    pub async fn start_hollow(
        &mut self,
        admin: &Client,
        nodes: &[(String, PathBuf)],
    ) -> Result<()> {
        for (name, kubeconfig) in nodes {
            let dir = self.dir.join(name);
            let node = hollow::HollowNode::start(self.ns()?, &self.bins, name, kubeconfig, &dir)?;
            self.hollow.push(node);
        }
        hollow::wait_ready(admin, &mut self.hollow).await
    }

    /// Upgrades node `name`'s kubelet to `to` in place, as a node upgrade
    /// does (drain skipped: its pods keep running and the new kubelet adopts
    /// them), and waits until every node is Ready again. The node's
    /// containerd, runc and CNI plugins stay as they are.
    pub async fn upgrade_kubelet(
        &mut self,
        admin: &Client,
        name: &str,
        to: crate::KubeVersion,
    ) -> Result<()> {
        let bins = NodeBins::find(to)?;
        let ns = self
            .ns
            .as_ref()
            .context("the bed's node mount namespace is gone")?;
        let node = self
            .nodes
            .iter_mut()
            .find(|n| n.name == name)
            .with_context(|| format!("no real node {name} in this bed"))?;
        let log = node
            .kubelet
            .dir
            .join(format!("kubelet-{}.log", to.as_str()));
        node.kubelet.restart_from(ns, &bins, &log)?;
        self.wait_ready(admin).await
    }

    /// The kubelet's log of node `name`, as it is now (the log of the
    /// kubelet running, after an upgrade the new one's).
    pub fn kubelet_log(&self, name: &str) -> Result<String> {
        let node = self
            .nodes
            .iter()
            .find(|n| n.name == name)
            .with_context(|| format!("the bed has no real node {name}"))?;
        let path = &node.kubelet.proc.log;
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))
    }

    /// Every node pulls from the registry at `host` with the CA in
    /// `ca_file` (see [`Containerd::trust_registry`]).
    pub fn trust_registry(&self, host: &str, ca_file: &Path) -> Result<()> {
        for n in &self.nodes {
            n.containerd.trust_registry(host, ca_file)?;
        }
        Ok(())
    }

    /// Starts kube-proxy for the machine's network namespace (once per bed),
    /// after waiting for any other bed's to stop ([`slot::ProxyLock`]).
    pub fn start_kube_proxy(&mut self, kubeconfig: &Path) -> Result<()> {
        self.proxy_lock = Some(slot::ProxyLock::acquire(Duration::from_secs(1200))?);
        let bin = self.bins.bin("kube-proxy")?;
        self.slot.record(|l| l.kube_proxies.push(bin.clone()))?;
        let node = self
            .nodes
            .first()
            .map(|n| n.name.clone())
            .unwrap_or_default();
        let kp = KubeProxy::start(
            self.ns()?,
            &bin,
            kubeconfig,
            &node,
            &self.slot,
            &self.dir.join("kube-proxy"),
        )?;
        self.kube_proxy = Some(kp);
        Ok(())
    }

    /// Imports an OCI archive into every node's containerd.
    pub fn load(&self, archive: &Path) -> Result<Vec<String>> {
        let mut names = Vec::new();
        for n in &self.nodes {
            names = n.containerd.import(archive)?;
        }
        Ok(names)
    }

    /// Fails if a node process exited.
    pub fn check_running(&mut self) -> Result<()> {
        if let Some(ns) = self.ns.as_mut() {
            ns.check_running()?;
        }
        for n in &mut self.nodes {
            n.kubelet.proc.check_running()?;
            n.containerd.proc.check_running()?;
        }
        for h in &mut self.hollow {
            h.proc.check_running()?;
        }
        if let Some(kp) = self.kube_proxy.as_mut() {
            kp.proc.check_running()?;
        }
        Ok(())
    }

    /// Stops every node process and removes what the bed made.
    pub fn shutdown(&mut self) -> Result<()> {
        if let Some(mut kp) = self.kube_proxy.take() {
            kp.proc.stop(Duration::from_secs(5));
        }
        for h in &mut self.hollow {
            h.proc.stop(Duration::from_secs(5));
        }
        for n in &mut self.nodes {
            n.kubelet.proc.stop(Duration::from_secs(5));
        }
        for n in &mut self.nodes {
            n.containerd.proc.stop(Duration::from_secs(5));
        }
        let result = self.slot.clean();
        self.ns = None;
        self.proxy_lock = None;
        result
    }
}

impl Drop for RealNodes {
    fn drop(&mut self) {
        if let Err(e) = self.shutdown() {
            eprintln!("error: tearing down the bed's real nodes: {e:#}");
        }
    }
}

/// Cordons `node` (`on`) or uncordons it, as `kubectl cordon`/`uncordon`
/// do: a merge patch of `spec.unschedulable`.
pub async fn cordon(client: &Client, node: &str, on: bool) -> Result<()> {
    let unschedulable = if on {
        serde_json::json!(true)
    } else {
        serde_json::Value::Null
    };
    Api::<Node>::all(client.clone())
        .patch(
            node,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"spec": {"unschedulable": unschedulable}})),
        )
        .await
        .with_context(|| {
            format!(
                "{} node {node}",
                if on { "cordoning" } else { "uncordoning" }
            )
        })?;
    Ok(())
}
