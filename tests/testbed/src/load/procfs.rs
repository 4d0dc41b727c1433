//! Resident memory and CPU time of a process, from /proc.

use anyhow::{Context, Result};

/// Resident set size in bytes (`VmRSS`).
pub fn rss_bytes(pid: u32) -> Result<u64> {
    status_kb(pid, "VmRSS:").map(|kb| kb * 1024)
}

/// The most resident memory the process ever had, in bytes (`VmHWM`).
pub fn peak_rss_bytes(pid: u32) -> Result<u64> {
    status_kb(pid, "VmHWM:").map(|kb| kb * 1024)
}

fn status_kb(pid: u32, field: &str) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .with_context(|| format!("no {field} in /proc/{pid}/status"))
}

/// User + system CPU seconds consumed so far.
pub fn cpu_seconds(pid: u32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("reading /proc/{pid}/stat"))?;
    // Fields after the command name (which is in parentheses and may hold spaces).
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line; 12 and 13 after ')'.
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Ok((ticks(11) + ticks(12)) / hz.max(1.0))
}

/// Lets the next [`peak_rss_bytes`] read the peak from now on (writing 5 to
/// `/proc/PID/clear_refs` resets `VmHWM` to the current RSS).
pub fn reset_peak_rss(pid: u32) -> Result<()> {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").with_context(|| {
        format!("resetting the peak RSS of process {pid} (/proc/{pid}/clear_refs)")
    })
}

/// The processes whose command name is `comm` (as `/proc/PID/comm` holds
/// it: at most 15 bytes) and whose cgroup path contains `cgroup`: one
/// bed's containers, never another bed's or the machine's.
pub fn pids_named_in_cgroup(comm: &str, cgroup: &str) -> Result<Vec<u32>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").context("reading /proc")? {
        let Ok(entry) = entry else { continue };
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let named = std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .is_ok_and(|c| c.trim_end() == comm);
        let inside = named
            && std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
                .is_ok_and(|c| c.contains(cgroup));
        if inside {
            out.push(pid);
        }
    }
    out.sort_unstable();
    Ok(out)
}
