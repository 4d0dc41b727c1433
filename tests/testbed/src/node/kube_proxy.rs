//! kube-proxy for the machine's network namespace, in iptables mode: it makes
//! ClusterIPs reachable from the host (the API server calling a webhook
//! Service) and from pods. NodePorts only on the bed's own addresses, no
//! conntrack tuning (its sysctls are the machine's), no masquerade. Its own
//! addresses are loopback of the bed's family: kube-proxy takes the family of
//! its bind address as the cluster's primary one.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde_json::json;

use super::mountns::MountNs;
use super::slot::{Family, Slot};
use crate::process::{free_port, Managed};

pub struct KubeProxy {
    pub proc: Managed,
    pub dir: PathBuf,
}

impl KubeProxy {
    pub fn start(
        ns: &MountNs,
        bin: &Path,
        kubeconfig: &Path,
        node: &str,
        slot: &Slot,
        dir: &Path,
    ) -> Result<Self> {
        let loopback: IpAddr = match slot.family {
            Family::V4 => Ipv4Addr::LOCALHOST.into(),
            Family::V6 => Ipv6Addr::LOCALHOST.into(),
        };
        let on_loopback = |port| SocketAddr::new(loopback, port).to_string();
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let cfg = json!({
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
            "kind": "KubeProxyConfiguration",
            "mode": "iptables",
            "clientConnection": {"kubeconfig": kubeconfig.display().to_string()},
            "hostnameOverride": node,
            "clusterCIDR": slot.pod_subnet(),
            "bindAddress": loopback.to_string(),
            "healthzBindAddress": on_loopback(free_port()?),
            "metricsBindAddress": on_loopback(free_port()?),
            "nodePortAddresses": [slot.supernet()],
            "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s", "tcpCloseWaitTimeout": "0s"},
            "iptables": {"masqueradeAll": false, "localhostNodePorts": false},
        });
        let path = dir.join("kube-proxy-config.json");
        std::fs::write(&path, serde_json::to_vec_pretty(&cfg)?)?;
        let mut cmd = ns.command(bin);
        cmd.arg(format!("--config={}", path.display())).arg("--v=1");
        let proc = Managed::spawn("kube-proxy", cmd, &dir.join("kube-proxy.log"))?;
        Ok(Self {
            proc,
            dir: dir.to_path_buf(),
        })
    }
}
