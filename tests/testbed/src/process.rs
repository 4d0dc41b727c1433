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

/// Where port reservations are kept: one lock file per port, shared by every
/// test process on the machine (nextest runs each test in its own process).
const PORT_LOCKS: &str = "/dev/shm/graceguard-ports";

/// Lock files of the ports this process reserved. They stay open, so their
/// `flock`s are held, until the process exits; the kernel then drops them.
static RESERVED: std::sync::Mutex<Vec<File>> = std::sync::Mutex::new(Vec::new());

/// A free TCP port on 127.0.0.1 for a child process to listen on, reserved
/// against every other test process for as long as this one lives.
///
/// A port checked free can be taken before the child binds it, and a child
/// may bind seconds later (the controller manager starts after the API
/// server is ready). Two defences: the port is not one the kernel hands out
/// (`bind(:0)` or an outgoing connection's local port takes from the
/// ephemeral range) nor a NodePort (30000–32767, which a Service on the
/// host network may open); and it is locked (`flock` on a file per port), so
/// a concurrent test cannot pick it until this process is gone. A CI run
/// once lost a controller manager to `bind: address already in use` on a
/// port another test had picked in the same window.
pub fn free_port() -> Result<u16> {
    std::fs::create_dir_all(PORT_LOCKS)
        .with_context(|| format!("creating {PORT_LOCKS} for port reservations"))?;
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32768);
    let (from, to) = (10_000u16, low.min(30_000).saturating_sub(1).max(10_001));
    for _ in 0..500 {
        let port = fastrand::u16(from..=to);
        let Some(lock) = lock_port(port)? else {
            continue;
        };
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            RESERVED
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .push(lock);
            return Ok(port);
        }
    }
    anyhow::bail!(
        "no free loopback port in {from}–{to} after 500 tries; \
         look for leftover listeners (`ss -ltnp`) or reservations in {PORT_LOCKS}"
    )
}

/// The port's lock file, locked for this process, or `None` if another
/// process holds it.
fn lock_port(port: u16) -> Result<Option<File>> {
    use std::os::fd::AsRawFd;
    let path = Path::new(PORT_LOCKS).join(port.to_string());
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .with_context(|| format!("opening the port reservation {}", path.display()))?;
    // SAFETY: flock on a descriptor this function owns.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc == 0 {
        return Ok(Some(file));
    }
    let err = std::io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
        return Ok(None);
    }
    Err(err).with_context(|| format!("locking the port reservation {}", path.display()))
}
