//! The mount namespace a bed's node processes run in, so that what they write
//! outside their own directories never reaches the shared machine.
//!
//! A kubelet writes `/var/lib/kubelet/device-plugins`, `/var/log/containers`
//! and `/var/log/pods`, sets `vm.overcommit_memory`, `vm.panic_on_oom`,
//! `kernel.panic`, `kernel.panic_on_oops` and `kernel.keys.*`; containerd and
//! its shims write `/run/containerd` and `/run/netns`; the CNI bridge plugin
//! turns on `net.ipv4.ip_forward` (`net.ipv6.conf.all.forwarding` on an
//! IPv6 network); kube-proxy sets conntrack and
//! `route_localnet` sysctls. `kernel.panic_on_oops=1` alone would make any
//! kernel oops panic the machine CI shares. So every node process (containerd,
//! shims, runc, CNI plugins, kubelet, kube-proxy) runs in one private mount
//! namespace where `/run`, `/var/lib` and `/var/log` are the bed's own
//! directories and each of those sysctl files is a plain file holding the
//! machine's value: the components read and write them as usual, and the
//! machine's settings never change. Everything mounted in the namespace
//! (container root filesystems, volumes, network-namespace pins) disappears
//! with it.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context, Result};

use super::cgroups;
use crate::process::Managed;

/// Directories replaced by the bed's own inside the namespace.
const SHADOWED: &[&str] = &["/run", "/var/lib", "/var/log"];

/// Sysctls node components set, answered from plain files inside the namespace.
pub const STAND_IN_SYSCTLS: &[&str] = &[
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
    "net/ipv4/ip_forward",
    "net/ipv4/conf/all/forwarding",
    "net/ipv4/conf/all/route_localnet",
    "net/ipv6/conf/all/forwarding",
    "net/ipv6/conf/default/forwarding",
    "net/netfilter/nf_conntrack_max",
    "net/netfilter/nf_conntrack_tcp_timeout_established",
    "net/netfilter/nf_conntrack_tcp_timeout_close_wait",
    "net/bridge/bridge-nf-call-iptables",
];

/// The machine's current value of each stand-in sysctl that exists.
pub fn machine_sysctls() -> Vec<(String, String)> {
    STAND_IN_SYSCTLS
        .iter()
        .filter_map(|s| {
            let v = std::fs::read_to_string(Path::new("/proc/sys").join(s)).ok()?;
            Some((s.to_string(), v.trim().to_string()))
        })
        .collect()
}

/// The mount namespace of a process, as `/proc/PID/ns/mnt` names it.
pub fn mount_ns_of(pid: &str) -> Option<String> {
    std::fs::read_link(format!("/proc/{pid}/ns/mnt"))
        .ok()
        .map(|l| l.to_string_lossy().into_owned())
}

/// A process holding the namespace open, and how to start others inside it.
pub struct MountNs {
    holder: Managed,
    cgroup: String,
    /// `mnt:[inode]`, as `/proc/PID/ns/mnt` reads.
    pub id: String,
}

impl MountNs {
    /// Makes the namespace, with its shadow directories under `dir`; its
    /// holder and every process started with [`MountNs::command`] run in
    /// cgroup `cgroup` (made already), by which a sweep finds them.
    pub fn start(dir: &Path, cgroup: &str) -> Result<Self> {
        let mut script = String::from("set -e\n");
        for d in SHADOWED {
            let own = dir.join(format!("shadow{d}"));
            std::fs::create_dir_all(&own).with_context(|| format!("creating {}", own.display()))?;
            script.push_str(&format!("mount --bind '{}' '{d}'\n", own.display()));
        }
        let sysctl_dir = dir.join("sysctl");
        std::fs::create_dir_all(&sysctl_dir)?;
        for (name, value) in machine_sysctls() {
            let file = sysctl_dir.join(name.replace('/', "."));
            std::fs::write(&file, format!("{value}\n"))
                .with_context(|| format!("writing {}", file.display()))?;
            script.push_str(&format!(
                "mount --bind '{}' '/proc/sys/{name}'\n",
                file.display()
            ));
        }
        let ready = dir.join("mount-ns.ready");
        script.push_str(&format!(
            "touch '{}'\nexec sleep 2147483647\n",
            ready.display()
        ));
        let mut cmd = cgroups::command_in(cgroup, Path::new("unshare"));
        cmd.args(["--mount", "--propagation", "private", "--", "sh", "-c"])
            .arg(&script);
        let log = dir.join("mount-ns.log");
        let mut holder = Managed::spawn("mount namespace holder (unshare)", cmd, &log)?;
        holder.wait_for_path(&ready, Duration::from_secs(10))?;
        let pid = holder.pid().to_string();
        let id = mount_ns_of(&pid).context("reading the holder's mount namespace")?;
        if Some(&id) == mount_ns_of("self").as_ref() {
            bail!("unshare --mount did not make a new mount namespace (the holder shares ours)");
        }
        Ok(Self {
            holder,
            cgroup: cgroup.to_string(),
            id,
        })
    }

    /// `program` to be started inside the namespace.
    pub fn command(&self, program: &Path) -> Command {
        let mut cmd = cgroups::command_in(&self.cgroup, Path::new("nsenter"));
        cmd.arg(format!("--mount=/proc/{}/ns/mnt", self.holder.pid()))
            .arg("--")
            .arg(program);
        cmd
    }

    /// Fails if the holder exited.
    pub fn check_running(&mut self) -> Result<()> {
        self.holder.check_running()
    }
}
