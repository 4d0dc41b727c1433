//! `graceguard sidecar` as the end-to-end tests run it, and its clients in
//! other languages (`clients/python`, `clients/go`) driven as child
//! processes.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

use crate::binaries::workspace_bin;
use crate::control_plane::TestBed;
use crate::process::{tail, Managed};

/// The sidecars' Lease duration in the tests.
pub const LEASE_SECONDS: u64 = 4;

/// A running sidecar for one instance, acting as user `alice`.
pub struct SidecarProcess {
    pub socket: PathBuf,
    pub instance: String,
    namespace: String,
    kubeconfig: PathBuf,
    dir: PathBuf,
    starts: u32,
    adopt: bool,
    /// More arguments for `graceguard sidecar`.
    extra: Vec<String>,
    /// Listening on loopback TCP (with this bearer token) instead of `socket`.
    tcp: Option<(std::net::SocketAddr, String)>,
    process: Option<Managed>,
    /// `--lease-duration-seconds`.
    lease_seconds: u64,
    /// The container it runs in (`GRACEGUARD_POD_UID`, `GRACEGUARD_CONTAINER_NAME`).
    container: Option<(String, String)>,
}

impl SidecarProcess {
    /// Starts the sidecar of `instance` for `namespace` and waits until it
    /// answers /healthz with 200 (its pod watch synced).
    pub async fn start(bed: &TestBed, instance: &str, namespace: &str) -> Result<Self> {
        Self::start_with(bed, instance, namespace, false).await
    }

    /// [`SidecarProcess::start`], delivering dead instances' pods (`--adopt`).
    pub async fn start_adopting(bed: &TestBed, instance: &str, namespace: &str) -> Result<Self> {
        Self::start_with(bed, instance, namespace, true).await
    }

    async fn start_with(
        bed: &TestBed,
        instance: &str,
        namespace: &str,
        adopt: bool,
    ) -> Result<Self> {
        let mut s = Self::unstarted(bed, instance, namespace, adopt, instance)?;
        s.spawn().await?;
        Ok(s)
    }

    fn unstarted(
        bed: &TestBed,
        instance: &str,
        namespace: &str,
        adopt: bool,
        socket: &str,
    ) -> Result<Self> {
        Ok(Self {
            adopt,
            socket: bed.dir().join(format!("{socket}.sock")),
            instance: instance.to_string(),
            namespace: namespace.to_string(),
            kubeconfig: bed.kubeconfig_for("alice")?,
            dir: bed.dir().to_path_buf(),
            starts: 0,
            extra: Vec::new(),
            tcp: None,
            process: None,
            lease_seconds: LEASE_SECONDS,
            container: None,
        })
    }

    /// A process for `instance` as it runs in container `container` of the
    /// pod with uid `pod_uid` (the downward API's values), with a Lease of
    /// `lease_seconds`; started without waiting unless `wait` (a process
    /// whose Lease another holds serves nothing until it takes it).
    pub async fn start_in_container(
        bed: &TestBed,
        instance: &str,
        namespace: &str,
        socket: &str,
        (pod_uid, container): (&str, &str),
        lease_seconds: u64,
        wait: bool,
    ) -> Result<Self> {
        let mut s = Self::unstarted(bed, instance, namespace, false, socket)?;
        s.lease_seconds = lease_seconds;
        s.container = Some((pod_uid.to_string(), container.to_string()));
        match wait {
            true => s.spawn().await?,
            false => s.spawn_process()?,
        }
        Ok(s)
    }

    /// [`SidecarProcess::start`] with more arguments.
    pub async fn start_with_args(
        bed: &TestBed,
        instance: &str,
        namespace: &str,
        extra: &[&str],
    ) -> Result<Self> {
        let mut s = Self::unstarted(bed, instance, namespace, false, instance)?;
        s.extra = extra.iter().map(ToString::to_string).collect();
        s.spawn().await?;
        Ok(s)
    }

    /// [`SidecarProcess::start`] on loopback TCP with a bearer token
    /// (`--listen`, `--token-file`): see [`SidecarProcess::url`] and
    /// [`SidecarProcess::token_file`].
    pub async fn start_tcp(bed: &TestBed, instance: &str, namespace: &str) -> Result<Self> {
        let mut s = Self::unstarted(bed, instance, namespace, false, instance)?;
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0")?;
            l.local_addr()?.port()
        };
        let token = format!("{:032x}", fastrand::u128(..));
        std::fs::write(s.token_file(), &token)?;
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(s.token_file(), std::fs::Permissions::from_mode(0o600))?;
        }
        s.tcp = Some((std::net::SocketAddr::from(([127, 0, 0, 1], port)), token));
        s.spawn().await?;
        Ok(s)
    }

    /// The TCP listener's URL (`None` on a socket).
    pub fn url(&self) -> Option<String> {
        self.tcp.as_ref().map(|(a, _)| format!("http://{a}"))
    }

    /// The file holding the TCP listener's token.
    pub fn token_file(&self) -> PathBuf {
        self.dir.join(format!("{}.token", self.instance))
    }

    /// A second process for `instance` (on its own socket `socket`), started
    /// without waiting: while another process holds the instance's Lease it
    /// waits for it, and serves nothing.
    pub fn start_second(
        bed: &TestBed,
        instance: &str,
        namespace: &str,
        socket: &str,
    ) -> Result<Self> {
        let mut s = Self::unstarted(bed, instance, namespace, false, socket)?;
        s.spawn_process()?;
        Ok(s)
    }

    /// A process for `instance` on socket `socket` that reaches the API
    /// server through `kubeconfig` (a proxy's, say), with a Lease of
    /// `lease_seconds`; waits until it answers /healthz.
    pub async fn start_via(
        bed: &TestBed,
        (instance, namespace, socket): (&str, &str, &str),
        kubeconfig: PathBuf,
        lease_seconds: u64,
    ) -> Result<Self> {
        let mut s = Self::unstarted(bed, instance, namespace, false, socket)?;
        s.kubeconfig = kubeconfig;
        s.lease_seconds = lease_seconds;
        s.spawn().await?;
        Ok(s)
    }

    fn log_path(&self) -> PathBuf {
        self.dir.join(format!(
            "sidecar-{}-{}-{}.log",
            self.instance,
            self.socket
                .file_stem()
                .and_then(|f| f.to_str())
                .unwrap_or(""),
            self.starts
        ))
    }

    /// The first `result` event for `task`, read from sequence 0, with its
    /// epoch; waits up to `within`.
    pub async fn result_of(
        &self,
        task: &str,
        within: std::time::Duration,
    ) -> Result<serde_json::Value> {
        let deadline = std::time::Instant::now() + within;
        // Read forward, as a client does: from the start, then after the
        // newest event seen, so that a wait of 1 s waits for a new event
        // instead of answering at once with the old ones (reading from 0
        // each time kept the sidecar busy answering until the result came).
        let (mut after, mut epoch) = (0u64, String::new());
        loop {
            let path = match after {
                0 => "/v1/events?after=0&wait=1".to_string(),
                _ => format!("/v1/events?after={after}&epoch={epoch}&wait=1"),
            };
            let (code, batch) = self.request("GET", &path, None).await?;
            if code != 200 {
                // 409: another process (a restart) numbers its own events;
                // 503: not serving yet. Read from the start once it answers.
                (after, epoch) = (0, String::new());
                anyhow::ensure!(
                    std::time::Instant::now() < deadline,
                    "no result for {task} within {within:?}: GET {path} answered {code} {batch}; the sidecar's log: {}",
                    self.log()
                );
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                continue;
            }
            let events = batch["events"].as_array().cloned().unwrap_or_default();
            let found = events
                .iter()
                .find(|e| e["type"] == "result" && e["task"] == task)
                .cloned();
            if let Some(mut r) = found {
                r["epoch"] = batch["epoch"].clone();
                return Ok(r);
            }
            if let Some(newest) = events.iter().filter_map(|e| e["seq"].as_u64()).max() {
                after = newest;
                epoch = batch["epoch"].as_str().unwrap_or_default().to_string();
            }
            anyhow::ensure!(
                std::time::Instant::now() < deadline,
                "no result for {task} within {within:?}: {batch}; the sidecar's log: {}",
                self.log()
            );
        }
    }

    /// What the running process has logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    fn spawn_process(&mut self) -> Result<()> {
        let bin = workspace_bin("graceguard", "GRACEGUARD_BIN")?;
        let mut cmd = std::process::Command::new(bin);
        cmd.arg("sidecar");
        match &self.tcp {
            Some((addr, _)) => cmd
                .args(["--listen", &addr.to_string(), "--token-file"])
                .arg(self.token_file()),
            None => cmd.arg("--socket").arg(&self.socket),
        };
        cmd.args(["--instance", &self.instance, "--namespace", &self.namespace])
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            // A restart after a SIGKILL waits for the killed process's
            // Lease to lapse: short here, so the tests do not wait 30 s.
            .args(["--lease-duration-seconds", &self.lease_seconds.to_string()]);
        if let Some((uid, name)) = &self.container {
            cmd.env("GRACEGUARD_POD_UID", uid)
                .env("GRACEGUARD_CONTAINER_NAME", name);
        }
        if self.adopt {
            cmd.arg("--adopt");
        }
        cmd.args(&self.extra);
        self.starts += 1;
        let log = self.log_path();
        self.process = Some(Managed::spawn("graceguard sidecar", cmd, &log)?);
        Ok(())
    }

    async fn spawn(&mut self) -> Result<()> {
        self.spawn_process()?;
        self.wait_healthy(Duration::from_secs(60)).await
    }

    /// Waits (up to `within`) until it answers /healthz with 200.
    pub async fn wait_healthy(&mut self, within: Duration) -> Result<()> {
        let log = self.log_path();
        let deadline = Instant::now() + within;
        loop {
            if let Ok((200, _)) = self.request("GET", "/healthz", None).await {
                return Ok(());
            }
            if let Some(p) = self.process.as_mut() {
                if let Err(e) = p.check_running() {
                    bail!("the sidecar exited: {e}; its log:\n{}", tail(&log, 40));
                }
            }
            if Instant::now() > deadline {
                bail!(
                    "the sidecar did not become healthy within {within:?}; its log:\n{}",
                    tail(&log, 40)
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The process id (for its memory).
    pub fn pid(&self) -> Result<u32> {
        self.process
            .as_ref()
            .map(Managed::pid)
            .context("the sidecar is not running")
    }

    /// SIGKILL: nothing is cleaned up, the socket file stays behind.
    pub fn kill(&mut self) {
        if let Some(mut p) = self.process.take() {
            p.kill();
        }
    }

    /// Starts it again with the same instance name and socket path.
    pub async fn restart(&mut self) -> Result<()> {
        self.kill();
        self.spawn().await
    }

    /// One request over the socket: (status, JSON body).
    pub async fn request(
        &self,
        method: &str,
        path: &str,
        body: Option<&serde_json::Value>,
    ) -> Result<(u16, serde_json::Value)> {
        match &self.tcp {
            None => http(&self.socket, method, path, body).await,
            Some((addr, token)) => {
                let s = tokio::net::TcpStream::connect(addr)
                    .await
                    .with_context(|| format!("connecting to {addr}"))?;
                exchange(s, method, path, body, Some(token)).await
            }
        }
    }
}

/// A minimal HTTP/1.1 request over a Unix socket (`Connection: close`).
pub async fn http(
    socket: &Path,
    method: &str,
    path: &str,
    body: Option<&serde_json::Value>,
) -> Result<(u16, serde_json::Value)> {
    let s = tokio::net::UnixStream::connect(socket)
        .await
        .with_context(|| format!("connecting to {}", socket.display()))?;
    exchange(s, method, path, body, None).await
}

/// One request on `s` (`Connection: close`), with a bearer token if given.
async fn exchange(
    mut s: impl tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    method: &str,
    path: &str,
    body: Option<&serde_json::Value>,
    token: Option<&str>,
) -> Result<(u16, serde_json::Value)> {
    let body = body.map(|b| b.to_string()).unwrap_or_default();
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: sidecar\r\nConnection: close\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await?;
    let text = String::from_utf8_lossy(&raw);
    let (head, rest) = text
        .split_once("\r\n\r\n")
        .context("the sidecar's answer has no header end")?;
    let status: u16 = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .context("the sidecar's answer has no status code")?;
    let lower = head.to_ascii_lowercase();
    let text_body = lower.contains("content-type: application/openmetrics-text")
        || lower.contains("content-type: text/plain");
    let json = if rest.trim().is_empty() {
        serde_json::Value::Null
    } else if text_body {
        // /metrics: the text itself, as a JSON string.
        serde_json::Value::String(rest.to_string())
    } else {
        serde_json::from_str(rest).with_context(|| format!("not JSON: {rest}"))?
    };
    Ok((status, json))
}

/// A client of the sidecar in another language.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lang {
    Python,
    Go,
}

impl Lang {
    /// The command running this client against `socket`.
    pub fn command(self, socket: &Path) -> Result<Command> {
        let mut cmd = match self {
            Lang::Python => {
                let mut c = Command::new(clients_python()?);
                c.args(["-m", "graceguard_client"]);
                c
            }
            Lang::Go => Command::new(go_client()?),
        };
        match self {
            Lang::Python => cmd.arg("--socket"),
            Lang::Go => cmd.arg("-socket"),
        };
        cmd.arg(socket);
        Ok(cmd)
    }
}

/// The repository's `clients/` directory.
pub fn clients_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../clients")
}

/// The Python that has `clients/python` installed (with pytest and the
/// OpenAPI tools): `$GRACEGUARD_CLIENTS_PY`, set by `scripts/clients-venv.sh`.
pub fn clients_python() -> Result<PathBuf> {
    match std::env::var_os("GRACEGUARD_CLIENTS_PY") {
        Some(p) => Ok(PathBuf::from(p)),
        None => bail!(
            "GRACEGUARD_CLIENTS_PY is not set: run the tests through scripts/test, or `source scripts/clients-venv.sh` first (it installs clients/python into a venv)"
        ),
    }
}

/// Builds the Go client's command (`clients/go/cmd/graceguard-client`) once
/// per source version into the cache.
pub fn go_client() -> Result<PathBuf> {
    crate::go_build::cached_package(
        &clients_dir().join("go"),
        "./cmd/graceguard-client",
        "go-client",
        "graceguard-go-client",
    )
}

/// `adopt --count N --batch B` with the Python client: syncs (one long poll
/// each, acknowledging each batch) until N results were delivered; returns
/// (syncs, pods delivered).
pub async fn python_adopt(socket: &Path, count: usize, batch: usize) -> Result<(u64, Vec<String>)> {
    let mut cmd = Lang::Python.command(socket)?;
    cmd.args([
        "adopt",
        "--count",
        &count.to_string(),
        "--batch",
        &batch.to_string(),
    ])
    .kill_on_drop(true);
    let out = tokio::time::timeout(Duration::from_secs(600), cmd.output())
        .await
        .context("the adopting client did not finish within 600 s")??;
    if !out.status.success() {
        bail!(
            "the adopting client failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)
        .with_context(|| format!("client output: {}", String::from_utf8_lossy(&out.stdout)))?;
    let pods = v["delivered"]
        .as_array()
        .context("no delivered list")?
        .iter()
        .filter_map(|p| p.as_str().map(str::to_string))
        .collect();
    Ok((v["syncs"].as_u64().unwrap_or(0), pods))
}

/// A client's `run` command in the background, its JSON lines read as they come.
pub struct ClientRun {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
    /// Every line so far.
    pub seen: Vec<serde_json::Value>,
}

impl ClientRun {
    /// `run NS TASK TEMPLATE` with `lang`'s client.
    pub fn start(lang: Lang, socket: &Path, ns: &str, task: &str, template: &Path) -> Result<Self> {
        let mut cmd = lang.command(socket)?;
        cmd.args(["run", ns, task])
            .arg(template)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = cmd.spawn().context("starting the client")?;
        let stdout = child.stdout.take().context("the client's stdout")?;
        Ok(Self {
            child,
            lines: BufReader::new(stdout).lines(),
            seen: Vec::new(),
        })
    }

    /// Waits (up to `within`) for a line matching `pred`.
    pub async fn wait_for(
        &mut self,
        within: Duration,
        pred: impl Fn(&serde_json::Value) -> bool,
    ) -> Result<serde_json::Value> {
        if let Some(v) = self.seen.iter().find(|v| pred(v)) {
            return Ok(v.clone());
        }
        let deadline = tokio::time::Instant::now() + within;
        loop {
            match tokio::time::timeout_at(deadline, self.lines.next_line()).await {
                Ok(Ok(Some(line))) => {
                    let v: serde_json::Value = serde_json::from_str(&line)
                        .with_context(|| format!("the client printed a non-JSON line: {line}"))?;
                    self.seen.push(v.clone());
                    if pred(&v) {
                        return Ok(v);
                    }
                }
                Ok(Ok(None)) => {
                    let mut err = String::new();
                    if let Some(mut e) = self.child.stderr.take() {
                        e.read_to_string(&mut err).await.ok();
                    }
                    bail!(
                        "the client ended without the expected line; saw {:?}; stderr: {err}",
                        self.seen
                    )
                }
                Ok(Err(e)) => bail!("reading the client's output: {e}"),
                Err(_) => bail!("no expected line within {within:?}; saw {:?}", self.seen),
            }
        }
    }

    /// Waits for a transition event with `phase` at `attempt`.
    pub async fn wait_phase(&mut self, phase: &str, attempt: u64) -> Result<serde_json::Value> {
        self.wait_for(Duration::from_secs(90), |v| {
            v["type"] == "transition" && v["phase"] == phase && v["attempt"] == attempt
        })
        .await
    }

    /// Waits for `{"final": status}` and the client's exit; returns the status.
    pub async fn finish(mut self) -> Result<serde_json::Value> {
        let v = self
            .wait_for(Duration::from_secs(90), |v| v.get("final").is_some())
            .await?;
        let status = tokio::time::timeout(Duration::from_secs(30), self.child.wait()).await??;
        if !status.success() {
            bail!("the client exited with {status}");
        }
        Ok(v["final"].clone())
    }

    /// The transitions seen, as `phase@attempt`.
    pub fn phases(&self) -> Vec<String> {
        self.seen
            .iter()
            .filter(|v| v["type"] == "transition")
            .map(|v| format!("{}@{}", v["phase"].as_str().unwrap_or(""), v["attempt"]))
            .collect()
    }
}
