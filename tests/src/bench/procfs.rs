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
