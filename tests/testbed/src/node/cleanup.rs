//! Removing everything a bed's [`Ledger`] lists: its processes (by cgroup:
//! the node daemons' own and the pods', which catches containers and shims
//! that outlived containerd; see [`cgroups`] for why never by namespace),
//! its cgroups, kube-proxy's and the kubelet's iptables rules,
//! its bridges and its addresses. Idempotent: what is already gone is skipped,
//! so it serves both a bed's own teardown and a sweep after a crash.

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::cgroups;
use super::slot::{others_running, Ledger};

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
        let mut pids = Vec::new();
        for root in &ledger.cgroup_roots {
            pids.extend(cgroups::pids(root));
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

/// The chains `kube-proxy --cleanup` leaves behind (its canaries, and the
/// masquerade mark it shares with the kubelet), in both families.
pub const KUBE_PROXY_LEFTOVER_CHAINS: &[(&str, &str)] = &[
    ("mangle", "KUBE-PROXY-CANARY"),
    ("nat", "KUBE-PROXY-CANARY"),
    ("filter", "KUBE-PROXY-CANARY"),
    ("nat", "KUBE-MARK-MASQ"),
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
        cgroups::remove(root)?;
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
    // The kubelet's chains (and kube-proxy's leftovers) are shared by every
    // bed on the machine: the last bed to leave removes them.
    if (ledger.kubelet_ran || !ledger.kube_proxies.is_empty()) && !others_running(ledger.slot) {
        for (table, chain) in KUBELET_CHAINS.iter().chain(KUBE_PROXY_LEFTOVER_CHAINS) {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A sweep kills what runs in the bed's cgroups and nothing else, even a
    /// process in a mount namespace made just after the bed's died (the
    /// kernel reuses namespace numbers, which once made a sweep kill another
    /// bed's pod sandbox).
    #[test]
    fn a_sweep_kills_the_beds_cgroup_and_spares_a_new_namespace() -> Result<()> {
        let root = format!("/graceguard-unit-sweep-{}", std::process::id());
        cgroups::create(&root)?;
        let mut inside = cgroups::command_in(&root, std::path::Path::new("sleep"))
            .arg("600")
            .spawn()?;
        let mut outside = Command::new("unshare")
            .args(["--mount", "--", "sleep", "600"])
            .spawn()?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while !cgroups::pids(&root).contains(&(inside.id() as i32)) {
            anyhow::ensure!(Instant::now() < deadline, "sleep never joined {root}");
            std::thread::sleep(Duration::from_millis(20));
        }
        let ledger = Ledger {
            cgroup_roots: vec![root.clone()],
            ..Ledger::default()
        };
        let swept = sweep(&ledger);
        let inside_status = inside.try_wait()?;
        let outside_status = outside.try_wait()?;
        let _ = outside.kill();
        let _ = outside.wait();
        let _ = inside.kill();
        let _ = inside.wait();
        swept?;
        assert!(
            inside_status.is_some(),
            "the bed's process survived the sweep"
        );
        assert!(
            outside_status.is_none(),
            "the sweep killed a process outside the bed's cgroups"
        );
        assert!(cgroups::pids(&root).is_empty());
        assert!(
            !cgroups::hierarchies()
                .iter()
                .any(|h| h.join(root.trim_start_matches('/')).exists()),
            "the sweep left cgroup {root}"
        );
        Ok(())
    }
}
