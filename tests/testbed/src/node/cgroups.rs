//! The bed's cgroups: the machine's hierarchies, a named cgroup made in each,
//! the processes inside one, and commands started inside one.
//!
//! A bed finds its processes by cgroup name, never by namespace: the kernel
//! hands a freed namespace's inode number (`mnt:[N]`) to the next namespace
//! made, often a container of another bed, so a sweep matching on a
//! namespace that had just died would kill a stranger. Cgroup names carry
//! the slot number, which only the slot's lock holder uses.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

/// The cgroup hierarchies mounted on this machine (each v1 controller's
/// directory, and the unified v2 one).
pub fn hierarchies() -> Vec<PathBuf> {
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

/// Makes cgroup `root` (a name such as `/graceguard-bed-3-node-1`) in every
/// hierarchy. cpuset needs its CPUs and memory nodes copied from the parent
/// before anything can join it.
pub fn create(root: &str) -> Result<()> {
    for h in hierarchies() {
        let dir = h.join(root.trim_start_matches('/'));
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("creating cgroup {}", dir.display()))?;
        for f in ["cpuset.cpus", "cpuset.mems"] {
            if let Ok(v) = std::fs::read_to_string(h.join(f)) {
                if dir.join(f).exists() {
                    std::fs::write(dir.join(f), v.trim())
                        .with_context(|| format!("writing {}", dir.join(f).display()))?;
                }
            }
        }
    }
    Ok(())
}

/// `program` started inside cgroup `root` in every hierarchy: a shell joins
/// it and then execs the program (same pid), so the program and everything
/// it forks are in it from their first instruction. Arguments the caller
/// adds go to the program.
pub fn command_in(root: &str, program: &Path) -> Command {
    let procs: Vec<String> = hierarchies()
        .iter()
        .map(|h| {
            h.join(root.trim_start_matches('/'))
                .join("cgroup.procs")
                .display()
                .to_string()
        })
        .collect();
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(r#"for f in $GRACEGUARD_CGROUP_PROCS; do echo $$ > "$f" || exit 125; done; exec "$@""#)
        .arg("sh")
        .arg(program)
        .env("GRACEGUARD_CGROUP_PROCS", procs.join(" "));
    cmd
}

/// Every cgroup directory below `dir`, deepest first.
pub fn tree(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                out.extend(tree(&e.path()));
            }
        }
    }
    if dir.is_dir() {
        out.push(dir.to_path_buf());
    }
    out
}

/// The processes in cgroup `root` and below, in any hierarchy.
pub fn pids(root: &str) -> Vec<i32> {
    let mut pids = Vec::new();
    for h in hierarchies() {
        for cg in tree(&h.join(root.trim_start_matches('/'))) {
            if let Ok(procs) = std::fs::read_to_string(cg.join("cgroup.procs")) {
                pids.extend(procs.lines().filter_map(|p| p.trim().parse::<i32>().ok()));
            }
        }
    }
    pids.sort_unstable();
    pids.dedup();
    pids
}

/// Removes cgroup `root` and below from every hierarchy (waiting out the
/// EBUSY of processes the kernel is still reaping).
pub fn remove(root: &str) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    for h in hierarchies() {
        for cg in tree(&h.join(root.trim_start_matches('/'))) {
            loop {
                match std::fs::remove_dir(&cg) {
                    Ok(()) => break,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                    Err(_) if Instant::now() < deadline => {
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
