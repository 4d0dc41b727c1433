//! The bed's pod network: one bridge per bed in the machine's network
//! namespace, each node's pods on it with addresses from the node's range,
//! and routes only to the bed's own range — no default route, no masquerade,
//! so nothing a pod sends can leave the machine.

use std::net::IpAddr;
use std::path::Path;

use anyhow::{Context, Result};
use serde_json::json;

use super::cleanup::ip;
use super::slot::Slot;

/// `ip addr add` of `addr/prefix` on `dev`; an IPv6 address without
/// duplicate address detection, so it is usable at once (nothing else on the
/// bed's network can hold it).
fn add_address(addr: IpAddr, prefix: u8, dev: &str) -> Result<()> {
    let a = format!("{addr}/{prefix}");
    match addr {
        IpAddr::V4(_) => ip(&["addr", "add", &a, "dev", dev]),
        IpAddr::V6(_) => ip(&["-6", "addr", "add", &a, "dev", dev, "nodad"]),
    }
}

/// Makes the bed's bridge with the pods' gateway address (recorded first).
pub fn create_bridge(slot: &mut Slot) -> Result<()> {
    let bridge = slot.bridge();
    slot.record(|l| l.bridges.push(bridge.clone()))?;
    let (gw, prefix) = slot.gateway();
    ip(&["link", "add", &bridge, "type", "bridge"])?;
    add_address(gw, prefix, &bridge)?;
    ip(&["link", "set", &bridge, "up"]).with_context(|| format!("bringing up bridge {bridge}"))?;
    Ok(())
}

/// Adds `addr` as a host address (/32 or /128) to `lo` (recorded first): a
/// node's address. The kubelet refuses a loopback node IP, and this machine
/// has no dummy interfaces.
pub fn add_local_address(slot: &mut Slot, addr: IpAddr) -> Result<()> {
    let prefix = if addr.is_ipv4() { 32 } else { 128 };
    let a = format!("{addr}/{prefix}");
    slot.record(|l| l.addresses.push(a.clone()))?;
    add_address(addr, prefix, "lo")
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
                    "routes": [{"dst": slot.supernet()}],
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": true}},
        ],
    });
    let path = conf_dir.join("10-graceguard-bed.conflist");
    std::fs::write(&path, serde_json::to_vec_pretty(&conf)?)
        .with_context(|| format!("writing {}", path.display()))
}
