//! The bed's pod network: one bridge per bed in the machine's network
//! namespace, each node's pods on it with addresses from the node's range,
//! and routes only to the bed's own range — no default route, no masquerade,
//! so nothing a pod sends can leave the machine.

use std::path::Path;

use anyhow::{Context, Result};
use serde_json::json;

use super::cleanup::ip;
use super::slot::{Slot, POD_SUPERNET};

/// Makes the bed's bridge with the pods' gateway address (recorded first).
pub fn create_bridge(slot: &mut Slot) -> Result<()> {
    let bridge = slot.bridge();
    slot.record(|l| l.bridges.push(bridge.clone()))?;
    let (gw, prefix) = slot.gateway();
    ip(&["link", "add", &bridge, "type", "bridge"])?;
    ip(&["addr", "add", &format!("{gw}/{prefix}"), "dev", &bridge])?;
    ip(&["link", "set", &bridge, "up"]).with_context(|| format!("bringing up bridge {bridge}"))?;
    Ok(())
}

/// Adds `addr`/32 to `lo` (recorded first): a node's address. The kubelet
/// refuses a loopback node IP, and this machine has no dummy interfaces.
pub fn add_local_address(slot: &mut Slot, addr: std::net::Ipv4Addr) -> Result<()> {
    let a = format!("{addr}/32");
    slot.record(|l| l.addresses.push(a.clone()))?;
    ip(&["addr", "add", &a, "dev", "lo"])
}

/// Writes node `k`'s CNI configuration into `conf_dir`; its IPAM state goes
/// to `ipam_dir`.
pub fn write_cni_config(slot: &Slot, k: u8, conf_dir: &Path, ipam_dir: &Path) -> Result<()> {
    std::fs::create_dir_all(conf_dir)?;
    let (start, end) = slot.pod_range(k);
    let (gw, _) = slot.gateway();
    let conf = json!({
        "cniVersion": "1.0.0",
        "name": "graceguard-bed",
        "plugins": [
            {
                "type": "bridge",
                "bridge": slot.bridge(),
                "isGateway": true,
                "ipMasq": false,
                "hairpinMode": true,
                "ipam": {
                    "type": "host-local",
                    "dataDir": ipam_dir.display().to_string(),
                    "ranges": [[{
                        "subnet": slot.pod_subnet(),
                        "rangeStart": start.to_string(),
                        "rangeEnd": end.to_string(),
                        "gateway": gw.to_string(),
                    }]],
                    // The bed's range only: pods, nodes, the API server, Services.
                    "routes": [{"dst": POD_SUPERNET}],
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": true}},
        ],
    });
    let path = conf_dir.join("10-graceguard-bed.conflist");
    std::fs::write(&path, serde_json::to_vec_pretty(&conf)?)
        .with_context(|| format!("writing {}", path.display()))
}
