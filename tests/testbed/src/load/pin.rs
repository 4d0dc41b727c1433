//! CPU pinning for the webhook benchmarks: the load generator on one core,
//! the server under test on another, so neither steals the other's cycles
//! and the baseline stops moving between runs. Linux only (sched_setaffinity
//! on every thread of a process, as `taskset -a -p` does).

use anyhow::{bail, Context, Result};

/// Online CPUs (not the affinity mask, which pinning itself changes).
pub fn online_cpus() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    usize::try_from(n).unwrap_or(1).max(1)
}

/// Restricts every thread of process `pid` to `cpus` (threads it starts later
/// inherit the mask).
pub fn pin(pid: u32, cpus: &[usize]) -> Result<()> {
    // SAFETY: cpu_set_t is plain data; zeroed is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in cpus {
        // SAFETY: CPU_SET writes within the set for c < CPU_SETSIZE.
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    let dir = format!("/proc/{pid}/task");
    let tasks = std::fs::read_dir(&dir).with_context(|| format!("listing {dir}"))?;
    let mut pinned = 0;
    for t in tasks.flatten() {
        let Some(tid) = t.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        // SAFETY: a valid set of the size passed; tid is a thread id.
        let rc =
            unsafe { libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set) };
        // A thread may have exited since the listing: ignore ESRCH.
        if rc == 0 {
            pinned += 1;
        }
    }
    if pinned == 0 {
        bail!("could not pin any thread of process {pid} to CPUs {cpus:?}");
    }
    Ok(())
}

/// Every online CPU: undoes [`pin`].
pub fn all_cpus() -> Vec<usize> {
    (0..online_cpus()).collect()
}
