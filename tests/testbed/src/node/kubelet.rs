//! One node's real kubelet: the node's identity (`system:node:<name>`, so the
//! Node authorizer and NodeRestriction judge it), its own ports, root
//! directory, certificates and cgroup root, the node's containerd.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde_json::json;

use super::bins::NodeBins;
use super::mountns::MountNs;
use crate::process::{free_port, Managed};

/// How to run one kubelet.
pub struct KubeletSpec<'a> {
    pub name: &'a str,
    pub node_ip: IpAddr,
    /// A kubeconfig with the node's identity.
    pub kubeconfig: &'a Path,
    /// The CA that signs the API server's kubelet client certificate.
    pub client_ca: &'a Path,
    /// The kubelet's serving certificate and key (for the node's address).
    pub tls_cert: &'a Path,
    pub tls_key: &'a Path,
    pub runtime_socket: &'a Path,
    pub cgroup_root: &'a str,
    /// Taints it registers with (`key=value:Effect`).
    pub taints: &'a [String],
    pub labels: &'a [String],
    /// Its `--v`.
    pub verbosity: u8,
}

pub struct KubeletProc {
    pub proc: Managed,
    pub port: u16,
    pub dir: PathBuf,
    /// Its name and arguments, to start it again from another binary.
    name: String,
    args: Vec<String>,
}

/// The KubeletConfiguration for `spec`, with its files under `dir`.
fn config(spec: &KubeletSpec, dir: &Path, port: u16) -> serde_json::Value {
    json!({
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": spec.node_ip.to_string(),
        "port": port,
        "readOnlyPort": 0,
        "healthzPort": 0,
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": spec.cgroup_root,
        // This machine mounts cgroup v1 (hybrid); the kubelet refuses it otherwise.
        "failCgroupV1": false,
        "failSwapOn": false,
        "containerRuntimeEndpoint": format!("unix://{}", spec.runtime_socket.display()),
        "authentication": {
            "anonymous": {"enabled": false},
            "webhook": {"enabled": true},
            "x509": {"clientCAFile": spec.client_ca.display().to_string()},
        },
        "authorization": {"mode": "Webhook"},
        "tlsCertFile": spec.tls_cert.display().to_string(),
        "tlsPrivateKeyFile": spec.tls_key.display().to_string(),
        // No resolver from the machine: nothing in a pod may look outside.
        "resolvConf": dir.join("resolv.conf").display().to_string(),
        "podLogsDir": dir.join("pod-logs").display().to_string(),
        // The machine's disk is shared and sometimes nearly full: evict only
        // when it really is, and never garbage-collect the imported images
        // (they are pinned too).
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%", "nodefs.inodesFree": "1%"},
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "serializeImagePulls": false,
        "maxPods": 110,
        "registerWithTaints": spec.taints.iter().filter_map(|t| {
            let (kv, effect) = t.rsplit_once(':')?;
            let (key, value) = kv.split_once('=').unwrap_or((kv, ""));
            Some(json!({"key": key, "value": value, "effect": effect}))
        }).collect::<Vec<_>>(),
        // Status and heartbeats at the defaults a cluster runs with.
        "nodeStatusUpdateFrequency": "10s",
        "syncFrequency": "10s",
        "fileCheckFrequency": "20s",
        "containerLogMaxSize": "1Mi",
        "containerLogMaxFiles": 2,
        "volumePluginDir": dir.join("volume-plugins").display().to_string(),
        // A node's static pods (their mirror pods are the node's own
        // Creates); empty but for a node that joins with some.
        "staticPodPath": dir.join("manifests").display().to_string(),
    })
}

impl KubeletProc {
    /// Starts the kubelet inside `ns`, with its files under `dir`.
    pub fn start(ns: &MountNs, bins: &NodeBins, spec: &KubeletSpec, dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir.join("manifests"))
            .with_context(|| format!("creating {}", dir.display()))?;
        std::fs::write(dir.join("resolv.conf"), "")?;
        let port = free_port()?;
        let cfg = dir.join("kubelet-config.json");
        std::fs::write(&cfg, serde_json::to_vec_pretty(&config(spec, dir, port))?)?;
        let mut args = vec![
            format!("--config={}", cfg.display()),
            format!("--kubeconfig={}", spec.kubeconfig.display()),
            format!("--hostname-override={}", spec.name),
            format!("--node-ip={}", spec.node_ip),
            format!("--root-dir={}", dir.join("root").display()),
            format!("--cert-dir={}", dir.join("pki").display()),
            format!("--v={}", spec.verbosity),
        ];
        if !spec.labels.is_empty() {
            args.push(format!("--node-labels={}", spec.labels.join(",")));
        }
        let name = format!("kubelet {}", spec.name);
        let proc = Self::spawn(ns, bins, &name, &args, &dir.join("kubelet.log"))?;
        Ok(Self {
            proc,
            port,
            dir: dir.to_path_buf(),
            name,
            args,
        })
    }

    fn spawn(
        ns: &MountNs,
        bins: &NodeBins,
        name: &str,
        args: &[String],
        log: &Path,
    ) -> Result<Managed> {
        let mut cmd = ns.command(&bins.bin("kubelet")?);
        cmd.args(args).env("PATH", bins.path_env());
        Managed::spawn(name, cmd, log)
    }

    /// Stops the kubelet (SIGTERM, as a node's upgrade does: its pods keep
    /// running in containerd) and starts `bins`' kubelet with the same
    /// configuration, identity and state directory, logging to `log`.
    pub fn restart_from(&mut self, ns: &MountNs, bins: &NodeBins, log: &Path) -> Result<()> {
        self.proc.stop(std::time::Duration::from_secs(30));
        self.proc = Self::spawn(ns, bins, &self.name, &self.args, log)?;
        Ok(())
    }
}
