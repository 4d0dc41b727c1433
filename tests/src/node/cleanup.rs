//! Removing everything a bed's [`Ledger`] lists: its processes (by mount
//! namespace and by cgroup, which catches containers and shims that outlived
//! containerd), its cgroups, kube-proxy's and the kubelet's iptables rules,
//! its bridges and its addresses. Idempotent: what is already gone is skipped,
//! so it serves both a bed's own teardown and a sweep after a crash.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::slot::{others_running, Ledger};

/// The cgroup hierarchies mounted on this machine (each v1 controller's
/// directory, and the unified v2 one).
pub fn cgroup_hierarchies() -> Vec<PathBuf> {
    let Ok(mounts) = std::fs::read_to_string("/proc/self/mounts") else {
        return Vec::new();
    };
    mounts
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (_, target, fstype) = (f.next()?, f.next()?, f.next()?);
            matches!(fstype, "cgroup" | "cgroup2").then(|| PathBuf::from(target))
        })
        .collect()
}

/// Every cgroup directory below `dir`, deepest first.
fn cgroup_tree(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                out.extend(cgroup_tree(&e.path()));
            }
        }
    }
    if dir.is_dir() {
        out.push(dir.to_path_buf());
    }
    out
}

/// The processes in the cgroups below `root` (a name such as `/graceguard-bed-3-node-1`).
fn cgroup_pids(root: &str) -> Vec<i32> {
    let mut pids = Vec::new();
    for h in cgroup_hierarchies() {
        for cg in cgroup_tree(&h.join(root.trim_start_matches('/'))) {
            if let Ok(procs) = std::fs::read_to_string(cg.join("cgroup.procs")) {
                pids.extend(procs.lines().filter_map(|p| p.trim().parse::<i32>().ok()));
            }
        }
    }
    pids.sort_unstable();
    pids.dedup();
    pids
}

/// The mount namespace of a process, as `/proc/PID/ns/mnt` names it.
pub fn mount_ns_of(pid: &str) -> Option<String> {
    std::fs::read_link(format!("/proc/{pid}/ns/mnt"))
        .ok()
        .map(|l| l.to_string_lossy().into_owned())
}

/// The processes whose mount namespace is one of `namespaces`.
fn namespace_pids(namespaces: &[String]) -> Vec<i32> {
    if namespaces.is_empty() {
        return Vec::new();
    }
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let pid = name.parse::<i32>().ok()?;
            let ns = mount_ns_of(&name)?;
            namespaces.contains(&ns).then_some(pid)
        })
        .collect()
}

fn alive(pid: i32) -> bool {
    // A zombie still has a /proc entry; its state is 'Z'.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z')),
        Err(_) => false,
    }
}

/// SIGKILLs every process of the bed, containers included, and waits until
/// they are gone.
pub fn kill_processes(ledger: &Ledger) -> Result<()> {
    let me = std::process::id() as i32;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let mut pids = namespace_pids(&ledger.mount_namespaces);
        for root in &ledger.cgroup_roots {
            pids.extend(cgroup_pids(root));
        }
        pids.retain(|p| *p != me && alive(*p));
        if pids.is_empty() {
            return Ok(());
        }
        for p in &pids {
            // SAFETY: signalling a process of the bed's own.
            unsafe {
                libc::kill(*p, libc::SIGKILL);
            }
        }
        if Instant::now() > deadline {
            bail!("processes {pids:?} of the test bed survived SIGKILL for 20 s; check `ps -o pid,stat,cmd -p {}`", pids.iter().map(i32::to_string).collect::<Vec<_>>().join(","));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn remove_cgroups(root: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    for h in cgroup_hierarchies() {
        for cg in cgroup_tree(&h.join(root.trim_start_matches('/'))) {
            loop {
                match std::fs::remove_dir(&cg) {
                    Ok(()) => break,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                    // EBUSY while the kernel finishes the last exits.
                    Err(e) if Instant::now() < deadline => {
                        let _ = e;
                        std::thread::sleep(Duration::from_millis(100));
                    }
                    Err(e) => {
                        return Err(e).with_context(|| {
                            format!(
                                "removing cgroup {}: is a process still in it?",
                                cg.display()
                            )
                        })
                    }
                }
            }
        }
    }
    Ok(())
}

/// Runs `ip ARGS`; "not there" answers count as done.
pub fn ip(args: &[&str]) -> Result<()> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .context("running `ip` (iproute2)")?;
    let err = String::from_utf8_lossy(&out.stderr);
    if out.status.success()
        || err.contains("Cannot find device")
        || err.contains("Cannot assign requested address")
        || err.contains("File exists")
    {
        return Ok(());
    }
    bail!("`ip {}` failed: {}", args.join(" "), err.trim())
}

/// The iptables chains a kubelet makes in the host's network namespace.
pub const KUBELET_CHAINS: &[(&str, &str)] = &[
    ("mangle", "KUBE-KUBELET-CANARY"),
    ("nat", "KUBE-KUBELET-CANARY"),
    ("filter", "KUBE-KUBELET-CANARY"),
    ("filter", "KUBE-FIREWALL"),
    ("mangle", "KUBE-IPTABLES-HINT"),
];

/// Deletes a chain and every rule that jumps to it, in `iptables` and `ip6tables`.
fn delete_chain(table: &str, chain: &str) {
    for tool in ["iptables", "ip6tables"] {
        let Ok(out) = Command::new(tool).args(["-t", table, "-S"]).output() else {
            continue;
        };
        for rule in String::from_utf8_lossy(&out.stdout).lines() {
            if rule.starts_with("-A ") && rule.contains(&format!("-j {chain}")) {
                let del: Vec<&str> = rule.trim_start_matches("-A ").split_whitespace().collect();
                let _ = Command::new(tool)
                    .args(["-t", table, "-D"])
                    .args(&del)
                    .output();
            }
        }
        let _ = Command::new(tool).args(["-t", table, "-F", chain]).output();
        let _ = Command::new(tool).args(["-t", table, "-X", chain]).output();
    }
}

/// Removes everything `ledger` lists.
pub fn sweep(ledger: &Ledger) -> Result<()> {
    kill_processes(ledger)?;
    for root in &ledger.cgroup_roots {
        remove_cgroups(root)?;
    }
    for kp in &ledger.kube_proxies {
        if kp.is_file() {
            // kube-proxy removes its own rules (every mode's).
            let out = Command::new(kp)
                .arg("--cleanup")
                .output()
                .with_context(|| format!("running {} --cleanup", kp.display()))?;
            if !out.status.success() {
                eprintln!(
                    "warning: `{} --cleanup` failed: {}; check `iptables-save | grep KUBE-`",
                    kp.display(),
                    String::from_utf8_lossy(&out.stderr).trim()
                );
            }
        }
    }
    // The kubelet's chains are shared by every kubelet on the machine: the
    // last bed to leave removes them.
    if ledger.kubelet_ran && !others_running(ledger.slot) {
        for (table, chain) in KUBELET_CHAINS {
            delete_chain(table, chain);
        }
    }
    for b in &ledger.bridges {
        ip(&["link", "del", b])?;
    }
    for a in &ledger.addresses {
        ip(&["addr", "del", a, "dev", "lo"])?;
    }
    Ok(())
}
