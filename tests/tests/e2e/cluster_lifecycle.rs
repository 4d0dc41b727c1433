//! `scripts/cluster up`, a user's `kubectl run` on it, `scripts/cluster down`:
//! the machine is left as it was. Lists, before and after, every kind of thing
//! the cluster makes: processes, mounts, cgroups, network namespaces,
//! bridges, addresses, routes, iptables rules and the sysctls node components
//! set. `scripts/test` runs this binary alone, after the other tests (it
//! compares the whole machine's state, which a bed running beside it changes).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::Value;
use testbed::binaries::workspace_bin;
use testbed::node::cgroups::hierarchies as cgroup_hierarchies;
use testbed::node::mountns::machine_sysctls;

fn run(cmd: &mut Command) -> Result<String> {
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn lines(s: &str) -> BTreeSet<String> {
    s.lines()
        .map(|l| l.trim().to_string())
        .filter(|l| !l.is_empty())
        .collect()
}

/// The machine's state, by kind.
fn snapshot() -> Result<Vec<(&'static str, BTreeSet<String>)>> {
    let procs: BTreeSet<String> = std::fs::read_dir("/proc")?
        .flatten()
        .filter_map(|e| {
            e.file_name().to_str()?.parse::<u32>().ok()?;
            let comm = std::fs::read_to_string(e.path().join("comm")).ok()?;
            let comm = comm.trim();
            [
                "kubelet",
                "kube-proxy",
                "containerd",
                "containerd-shim",
                "containerd-shim-runc-v2",
                "runc",
                "pause",
                "kube-apiserver",
                "etcd",
                "kube-scheduler",
                "kube-controller",
            ]
            .iter()
            .any(|c| comm.starts_with(c))
            .then(|| comm.to_string())
        })
        .collect();
    let mounts = lines(&std::fs::read_to_string("/proc/self/mounts")?);
    let mut cgroups = BTreeSet::new();
    for h in cgroup_hierarchies() {
        for e in std::fs::read_dir(&h)?.flatten() {
            let n = e.file_name().to_string_lossy().into_owned();
            if n.starts_with("graceguard") || n.starts_with("kubepods") {
                cgroups.insert(format!("{}/{n}", h.display()));
            }
        }
    }
    let netns: BTreeSet<String> = std::fs::read_dir("/proc")?
        .flatten()
        .filter_map(|e| {
            e.file_name().to_str()?.parse::<u32>().ok()?;
            Some(
                std::fs::read_link(e.path().join("ns/net"))
                    .ok()?
                    .to_string_lossy()
                    .into_owned(),
            )
        })
        .collect();
    let links = lines(&run(Command::new("ip").args(["-br", "link"]))?);
    let addrs = lines(&run(Command::new("ip").args(["-br", "addr"]))?);
    let routes = lines(&run(
        Command::new("ip").args(["route", "show", "table", "all"])
    )?);
    let mut rules = BTreeSet::new();
    for tool in ["iptables-save", "ip6tables-save"] {
        // Counters and comments aside, the rules themselves.
        for l in run(&mut Command::new(tool))?.lines() {
            if !l.starts_with('#') {
                rules.insert(format!("{tool}: {}", l.split(" [").next().unwrap_or(l)));
            }
        }
    }
    let sysctls = machine_sysctls()
        .into_iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    Ok(vec![
        ("processes", procs),
        ("mounts", mounts),
        ("cgroups", cgroups),
        ("network namespaces", netns),
        ("links (bridges, veths)", links),
        ("addresses", addrs),
        ("routes", routes),
        ("iptables rules", rules),
        ("sysctls", sysctls),
    ])
}

fn cluster(dir: &Path, args: &[&str]) -> Result<String> {
    let bin = workspace_bin("graceguard-cluster", "GRACEGUARD_CLUSTER_BIN")?;
    run(Command::new(bin)
        .arg(format!("--state-dir={}", dir.display()))
        .args(args))
}

#[test]
fn cluster_up_runs_a_users_pod_on_real_nodes_and_down_leaves_the_machine_as_it_was() -> Result<()> {
    let before = snapshot()?;
    let dir = tempfile::tempdir()?;
    let state: PathBuf = dir.path().join("cluster");
    let up = cluster(&state, &["up", "--nodes", "2", "--json"]);
    let result = (|| -> Result<()> {
        let d: Value = serde_json::from_str(up?.trim())?;
        assert_eq!(d["kube_version"], "v1.37.2");
        assert_eq!(d["nodes"].as_array().map(Vec::len), Some(2), "{d}");
        assert_eq!(d["kubelet"], "real");
        let during = snapshot()?;
        let links = &during
            .iter()
            .find(|(k, _)| k.starts_with("links"))
            .context("links")?
            .1;
        assert!(
            links
                .iter()
                .any(|l| l.starts_with(&format!("ggbr{}", d["slot"]))),
            "the cluster's bridge: {links:?}"
        );
        // As docs/testbed.md shows: kubectl run of the task image, by hand.
        let kubectl = d["kubectl"].as_str().context("kubectl")?;
        let kc = format!(
            "--kubeconfig={}",
            d["kubeconfig"].as_str().context("kubeconfig")?
        );
        let image = format!(
            "--image={}",
            d["task_image"].as_str().context("task_image")?
        );
        run(Command::new(kubectl).args([
            &kc,
            "run",
            "hello",
            &image,
            "--restart=Never",
            "--image-pull-policy=IfNotPresent",
            "--",
            "sh",
            "-c",
            "echo hello from a real container",
        ]))?;
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let phase = run(Command::new(kubectl).args([
                &kc,
                "get",
                "pod",
                "hello",
                "-o",
                "jsonpath={.status.phase}",
            ]))?;
            if phase == "Succeeded" {
                break;
            }
            anyhow::ensure!(phase != "Failed", "pod hello failed");
            anyhow::ensure!(
                Instant::now() < deadline,
                "pod hello was {phase:?} after 120 s"
            );
            std::thread::sleep(Duration::from_millis(250));
        }
        let logs = run(Command::new(kubectl).args([&kc, "logs", "hello"]))?;
        assert_eq!(logs.trim(), "hello from a real container");
        Ok(())
    })();
    let down = cluster(&state, &["down"]);
    result?;
    down?;
    // The kernel frees a dead pod's network namespace and veth a moment later.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let after = snapshot()?;
        let mut diffs = Vec::new();
        for ((kind, b), (_, a)) in before.iter().zip(after.iter()) {
            let added: Vec<_> = a.difference(b).collect();
            let removed: Vec<_> = b.difference(a).collect();
            if !added.is_empty() || !removed.is_empty() {
                diffs.push(format!("{kind}: left {added:?}, removed {removed:?}"));
            }
        }
        if diffs.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!(
                "scripts/cluster down left the machine changed:\n{}",
                diffs.join("\n")
            );
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}
