//! Child processes that cannot outlive the test that started them.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

/// A child process with its output in a log file. It is stopped when dropped,
/// and the kernel kills it if the test process dies first (`PR_SET_PDEATHSIG`),
/// so no etcd or kube-apiserver is ever left behind.
pub struct Managed {
    pub name: String,
    child: Child,
    pub log: PathBuf,
    /// The read end of a stdout pipe never read (see `spawn_with_stalled_stdout`).
    stalled: Option<std::process::ChildStdout>,
}

impl Managed {
    /// Starts `cmd` with stdout and stderr appended to `log`.
    pub fn spawn(name: &str, cmd: Command, log: &Path) -> Result<Self> {
        let out = File::create(log).with_context(|| format!("creating {}", log.display()))?;
        let err = out.try_clone()?;
        Self::spawn_to(name, cmd, log, Stdio::from(out), err)
    }

    /// Starts `cmd` with stderr in `log` and stdout into a pipe that nobody
    /// reads: once the pipe's buffer is full, every write to stdout blocks,
    /// as with a stalled log pipeline. The pipe is held open until the process
    /// is dropped.
    pub fn spawn_with_stalled_stdout(name: &str, cmd: Command, log: &Path) -> Result<Self> {
        let err = File::create(log).with_context(|| format!("creating {}", log.display()))?;
        let mut m = Self::spawn_to(name, cmd, log, Stdio::piped(), err)?;
        m.stalled = m.child.stdout.take();
        Ok(m)
    }

    fn spawn_to(name: &str, mut cmd: Command, log: &Path, out: Stdio, err: File) -> Result<Self> {
        cmd.stdin(Stdio::null()).stdout(out).stderr(err);
        // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
        unsafe {
            use std::os::unix::process::CommandExt;
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {name} ({:?})", cmd.get_program()))?;
        Ok(Self {
            name: name.to_string(),
            child,
            log: log.to_path_buf(),
            stalled: None,
        })
    }

    /// Fails with the log's tail if the process has exited.
    pub fn check_running(&mut self) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            anyhow::bail!(
                "{} exited ({status}); last lines of {}:\n{}",
                self.name,
                self.log.display(),
                tail(&self.log, 25)
            );
        }
        Ok(())
    }

    /// Waits until `path` exists (a socket, a ready file), failing with the
    /// log's tail if the process exits first or `within` passes.
    pub fn wait_for_path(&mut self, path: &Path, within: Duration) -> Result<()> {
        let deadline = Instant::now() + within;
        while !path.exists() {
            self.check_running()?;
            if Instant::now() > deadline {
                anyhow::bail!(
                    "{} made no {} in {within:?}; {} ends:\n{}",
                    self.name,
                    path.display(),
                    self.log.display(),
                    tail(&self.log, 20)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGKILL, as a crash or an OOM kill would end it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Sends SIGTERM and returns at once.
    pub fn sigterm(&self) {
        if let Ok(pid) = i32::try_from(self.child.id()) {
            // SAFETY: sending a signal to our own child.
            unsafe {
                libc::kill(pid, libc::SIGTERM);
            }
        }
    }

    /// SIGTERM, then SIGKILL after `grace`. Returns how the process ended
    /// (`None` if it had to be killed).
    pub fn stop(&mut self, grace: Duration) -> Option<std::process::ExitStatus> {
        if let Ok(Some(status)) = self.child.try_wait() {
            return Some(status);
        }
        if let Ok(pid) = i32::try_from(self.child.id()) {
            // SAFETY: sending a signal to our own child.
            unsafe {
                libc::kill(pid, libc::SIGTERM);
            }
        }
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill();
        None
    }
}

impl Drop for Managed {
    fn drop(&mut self) {
        let _ = self.stop(Duration::from_secs(3));
    }
}

/// The last `n` lines of a file, for error messages.
pub fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// A free TCP port on 127.0.0.1 for a child process to listen on.
pub fn free_port() -> Result<u16> {
    // Not a port the kernel hands out (`bind(:0)` or an outgoing connection's
    // local port can take an ephemeral port between our check and the
    // child's bind): a random one below the ephemeral range, checked free.
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let (from, to) = (10_000u16, low.saturating_sub(1).max(10_001));
    for _ in 0..200 {
        let port = fastrand::u16(from..=to);
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    let l = std::net::TcpListener::bind("127.0.0.1:0").context("binding a loopback port")?;
    Ok(l.local_addr()?.port())
}
