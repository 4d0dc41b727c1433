//! The `graceguard` command (feature `cli`): `run` one pod task to
//! completion by graceguard's rules, serve the `sidecar` API, `release-results`
//! a namespace's held pods, print the `openapi` document. In the library so
//! tests reach its parsing; `src/main.rs` only calls [`main`].

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;

use crate::core::naming::InstanceNameError;
use crate::core::task::TaskKey;
use crate::core::template::Template;
use crate::runtime::adoption::Adopter;
use crate::runtime::lease::{Holding, InstanceLease};
use crate::runtime::pod_api::delete_exact;
use crate::sidecar::{serve, Listen, ListenError, Sidecar};
use crate::{
    Bounds, Executor, Guard, GuardConfig, GuardError, Outcome, TaskError, TaskSpec, Transition,
};
use clap::{Parser, Subcommand, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use k8s_openapi::api::core::v1::Pod;
use kube::runtime::wait::{await_condition, conditions};
use kube::Api;

#[derive(Parser)]
#[command(
    name = "graceguard",
    // The version and the source revision: what a bug report must name.
    version = graceguard_contract::build::VERSION_LINE,
    about = "Run Kubernetes pod tasks so graceful deletions stay harmless"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run one pod task to completion; exit 0 if it succeeded, 1 if it failed, 2 on a usage
    /// error; 130 after SIGINT and 143 after SIGTERM (the current pod deleted first).
    Run(RunArgs),
    /// Serve the executor core as a local HTTP+JSON API (see /openapi.json)
    /// for executors in any language; runs until SIGTERM or SIGINT (exit 0).
    Sidecar(SidecarArgs),
    /// Remove graceguard's result finalizer (graceguard.io/result) from the task pods no
    /// executor will let go of: those of instances gone for good, and all of them in a
    /// namespace being deleted. Prints one JSON line per pod; exit 1 if any was not released.
    /// Results still held are not delivered: run adoption (sidecar --adopt) first to deliver
    /// a dead instance's results.
    ReleaseResults(ReleaseArgs),
    /// Print the sidecar API's OpenAPI document (what it serves at /openapi.json;
    /// guard/openapi.json is this output).
    Openapi,
}

#[derive(clap::Args)]
struct ReleaseArgs {
    /// The namespace whose task pods to look at.
    #[arg(
        long,
        short = 'n',
        required_unless_present = "all_namespaces",
        conflicts_with = "all_namespaces"
    )]
    namespace: Option<String>,
    /// Every namespace where graceguard's pods hold the result finalizer
    /// (needs list on pods cluster-wide); each instance's Lease is looked
    /// for in its pods' namespace unless --lease-namespace says otherwise.
    #[arg(long, short = 'A')]
    all_namespaces: bool,
    /// Only this instance's pods (default: every instance's).
    #[arg(long)]
    instance: Option<String>,
    /// Where the instances' Leases live (default: --namespace).
    #[arg(long)]
    lease_namespace: Option<String>,
    /// Release without looking at the owners' Leases.
    #[arg(long)]
    force: bool,
    /// How long to watch a Lease that looks held for renewals (longer than
    /// its duration, else a live owner's pods are released).
    #[arg(long, default_value_t = 60)]
    lease_wait_seconds: u64,
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
}

#[derive(clap::Args)]
struct SidecarArgs {
    /// Listen on this Unix socket (mode 0600; a stale file is replaced).
    #[arg(long, conflicts_with = "listen", required_unless_present = "listen")]
    socket: Option<PathBuf>,
    /// Listen on this loopback address instead (needs --token-file).
    #[arg(long, requires = "token_file")]
    listen: Option<std::net::SocketAddr>,
    /// A file holding the bearer token TCP clients must send.
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// Also serve /metrics and /healthz (only those, no token) on this
    /// address, e.g. 0.0.0.0:9464, for Prometheus and a kubelet probe.
    #[arg(long)]
    metrics_listen: Option<std::net::SocketAddr>,
    /// This executor instance's name (pod labels, its Lease). Restarted with
    /// the same name, the sidecar resumes the instance's tasks.
    #[arg(long)]
    instance: String,
    /// Watch and run tasks in this namespace only (default: all namespaces,
    /// which needs cluster-wide list/watch on pods).
    #[arg(long, short = 'n')]
    namespace: Option<String>,
    /// Where the instance's Lease lives (default: --namespace, else the
    /// kubeconfig's namespace).
    #[arg(long)]
    lease_namespace: Option<String>,
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// Also deliver the completed pods of dead instances in --namespace
    /// (events of type `adopted` and `gone`).
    #[arg(long, requires = "namespace")]
    adopt: bool,
    /// Forget a task this long after its result was acknowledged (its
    /// status is no longer served; 0: never), so memory stays bounded.
    #[arg(long, default_value_t = 600)]
    forget_after_seconds: u64,
    /// Most tasks known at once; a PUT of one more answers 429
    /// `TooManyTasks` until ended tasks are forgotten.
    #[arg(long, default_value_t = 100_000)]
    max_tasks: usize,
    /// Most bytes of pod templates held at once (each as submitted); a PUT
    /// past it answers 429 `TooManyTasks`.
    #[arg(long, default_value_t = 512 * 1024 * 1024)]
    max_template_bytes: usize,
    /// Keep a deleted task pod this long at most for a result nobody
    /// acknowledges, then let it go with a Warning event
    /// `ResultHeldTooLong` (0: until acknowledged). Default 7 days.
    #[arg(long, default_value_t = 7 * 24 * 3600)]
    max_result_hold_seconds: u64,
    /// Publish no Kubernetes Event per transition (they cost about four API
    /// writes per task, and kube's event recorder keeps each for six minutes
    /// to aggregate repeats).
    #[arg(long)]
    no_kube_events: bool,
    #[command(flatten)]
    lease: LeaseArgs,
}

/// The instance's Lease: one process at a time acts for an instance.
#[derive(clap::Args, Clone)]
struct LeaseArgs {
    /// The Lease's duration: a process that stops renewing it (killed, cut
    /// off) is taken over this long after its last renewal was seen.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(3..=3600))]
    lease_duration_seconds: u64,
    /// How long to wait at start while another process holds the Lease,
    /// before giving up (exit 2).
    #[arg(long, default_value_t = 300)]
    lease_wait_seconds: u64,
}

impl LeaseArgs {
    /// Takes the instance's Lease (waiting while another process holds it)
    /// and keeps it in the background.
    async fn hold(
        &self,
        client: &kube::Client,
        ns: &str,
        instance: &str,
    ) -> Result<Holding, CliError> {
        let lease = InstanceLease::acquire(
            client.clone(),
            ns,
            instance,
            Duration::from_secs(self.lease_duration_seconds),
            Duration::from_secs(self.lease_wait_seconds),
            crate::runtime::lease::ContainerId::from_env(),
        )
        .await?;
        Ok(lease.hold())
    }
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum EventsFormat {
    Json,
}

#[derive(clap::Args)]
struct RunArgs {
    /// The pod manifest (YAML or JSON); its name is replaced per attempt.
    #[arg(short = 'f', long = "file")]
    file: PathBuf,
    /// Namespace (default: the manifest's, else the kubeconfig's, else "default").
    #[arg(long, short = 'n')]
    namespace: Option<String>,
    /// Task name (default: the manifest's metadata.name).
    #[arg(long)]
    name: Option<String>,
    /// Container failures retried before the task fails.
    #[arg(long, default_value_t = 0)]
    retries: u32,
    /// Consecutive system failures (preemptions, deletions) before the task fails.
    #[arg(long, default_value_t = 3)]
    max_system_failures: u32,
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// Print one JSON object per transition on stdout.
    #[arg(long, value_enum)]
    events: Option<EventsFormat>,
    /// This executor instance's name (labels and Lease). Run again with the
    /// same instance, a task resumes from its pods instead of starting over.
    /// The default is shared by the retries of the step this runs in, read
    /// from its own pod: `run-job-<job>[-<index>]` in a Job's pod, from the
    /// workflow and step in an Argo step's, else `run-<hostname>`.
    #[arg(long, env = "GRACEGUARD_INSTANCE")]
    instance: Option<String>,
    /// If this task's last run (same instance and task name) ended and its
    /// result was delivered, report that result instead of running it again
    /// (by default a new run starts under the next pod name, as a CronJob
    /// expects).
    #[arg(long)]
    no_rerun: bool,
    #[command(flatten)]
    bounds: BoundsArgs,
    #[command(flatten)]
    lease: LeaseArgs,
}

/// The task's bounds (docs/guard.md, "Bounds"); 0 disables a time bound.
#[derive(clap::Args, Clone)]
struct BoundsArgs {
    /// The whole task may take this many seconds (0: no deadline).
    #[arg(long, default_value_t = 0)]
    deadline_seconds: u64,
    /// A pod Pending this long after creation is deleted and retried (0: never).
    #[arg(long, default_value_t = 900)]
    pending_timeout_seconds: u64,
    /// A pod terminating this long past its grace period is left behind (0: wait forever).
    #[arg(long, default_value_t = 300)]
    terminating_ceiling_seconds: u64,
    /// System failures in all before the task fails.
    #[arg(long, default_value_t = 10)]
    max_total_system_failures: u32,
    /// Transient Create errors in a row before an attempt is a system failure.
    #[arg(long, default_value_t = 30)]
    max_transient_retries: u32,
}

impl BoundsArgs {
    fn to_bounds(&self) -> Bounds {
        let opt = |s: u64| (s > 0).then_some(s);
        Bounds {
            deadline_seconds: opt(self.deadline_seconds),
            pending_timeout_seconds: opt(self.pending_timeout_seconds),
            terminating_ceiling_seconds: opt(self.terminating_ceiling_seconds),
            max_total_system_failures: self.max_total_system_failures.max(1),
            max_transient_retries: self.max_transient_retries,
        }
    }
}

/// The instance of a run given none ([`crate::core::run_identity`]): read
/// from this process's own pod (named as the host, in the client's default
/// namespace) when it can be; a failed read falls back to the host name.
async fn default_instance(client: &kube::Client, namespace: &str) -> String {
    let host = crate::core::naming::hostname().unwrap_or_else(|| "local".into());
    let own = match Api::<Pod>::namespaced(client.clone(), namespace)
        .get_opt(&host)
        .await
    {
        Ok(p) => p,
        Err(e) => {
            tracing::info!(pod = %host, %namespace, error = %e, "could not read this process's own pod; the instance comes from the host name (pass --instance to choose it)");
            None
        }
    };
    let (instance, from) = crate::core::run_identity::run_instance(own.as_ref(), &host);
    eprintln!("graceguard: instance {instance} (from {from}; --instance chooses another)");
    instance
}

/// Why a command could not run: exit 2, each naming what to do.
#[derive(Debug, thiserror::Error)]
enum CliError {
    #[error("generating the OpenAPI document: {0}")]
    OpenApi(#[from] crate::sidecar::openapi::DocumentError),
    #[error("cannot listen for signals: {0}")]
    Signal(#[source] std::io::Error),
    #[error(transparent)]
    ClientConfig(#[from] graceguard_contract::client::ConfigError),
    #[error("cannot build a Kubernetes client: {0}")]
    Client(#[source] kube::Error),
    #[error("cannot reach the API server: {0}; check the kubeconfig and that the cluster is up")]
    Unreachable(#[source] kube::Error),
    #[error("cannot read {}: {source}", path.display())]
    ReadManifest {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{} is not YAML or JSON: {source}", path.display())]
    ManifestSyntax {
        path: PathBuf,
        #[source]
        source: serde_yaml_ng::Error,
    },
    #[error("{}: kind is {kind:?}; graceguard run takes a Pod manifest", path.display())]
    NotAPod { path: PathBuf, kind: String },
    #[error("{} is not a valid Pod: {source}", path.display())]
    InvalidPod {
        path: PathBuf,
        #[source]
        source: TaskError,
    },
    #[error("no task name: pass --name TASK or set metadata.name in the manifest")]
    NoTaskName,
    #[error(transparent)]
    Instance(#[from] InstanceNameError),
    #[error(transparent)]
    Guard(#[from] GuardError),
    #[error(transparent)]
    Task(#[from] TaskError),
    #[error("--listen {0} is not a loopback address: the API is for the executor in the same pod or host; use 127.0.0.1:PORT or [::1]:PORT, or --socket")]
    NotLoopback(std::net::SocketAddr),
    #[error("pass --socket PATH or --listen ADDR")]
    NoListener,
    #[error("cannot read --token-file {}: {source}", path.display())]
    TokenFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the token in {} is shorter than 16 characters; use a long random one", .0.display())]
    ShortToken(PathBuf),
    #[error("--token-file {} has mode {mode:o}: others can read or change it; make it readable by its owner (and group) only: chmod 600, or defaultMode: 0400 on its Secret volume", path.display())]
    TokenFileMode { path: PathBuf, mode: u32 },
    #[error(transparent)]
    Listen(#[from] ListenError),
}

/// How `run` ended.
enum Ended {
    Task(Outcome),
    /// Stopped by a signal: the shell's exit code for it (128 + number).
    Signal(i32),
    /// A command that runs no task ended with this exit code.
    Exit(i32),
}

fn print_openapi() -> Result<Ended, CliError> {
    let doc = crate::sidecar::openapi::generate()?;
    print!("{doc}");
    Ok(Ended::Exit(0))
}

/// The `graceguard` command: parses the arguments, runs the command and
/// returns the process's exit code: 0 the task succeeded, 1 it failed, 2 a
/// usage or runtime error (printed), 130 or 143 stopped by SIGINT or SIGTERM.
pub fn main() -> i32 {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("graceguard: starting the async runtime failed: {e}; check the process's thread and file limits");
            return 2;
        }
    };
    runtime.block_on(run_command(cli))
}

async fn run_command(cli: Cli) -> i32 {
    graceguard_certs::install_crypto_provider();
    let ended = match cli.command {
        Command::Run(args) => run(args).await,
        Command::Sidecar(args) => sidecar(args).await,
        Command::ReleaseResults(args) => release_results(args).await,
        Command::Openapi => print_openapi(),
    };
    match ended {
        Ok(Ended::Task(o)) if o.succeeded => 0,
        Ok(Ended::Task(_)) => 1,
        Ok(Ended::Signal(code)) | Ok(Ended::Exit(code)) => code,
        Err(e) => {
            eprintln!("graceguard: {e}");
            2
        }
    }
}

/// Resolves on SIGINT (Ctrl-C) or SIGTERM with the exit code for it: 130
/// or 143 ([`graceguard_contract::stop`]; the handlers are installed now).
fn stop_signal() -> Result<impl std::future::Future<Output = i32>, CliError> {
    let stop = graceguard_contract::stop::signal_to_stop().map_err(CliError::Signal)?;
    Ok(async move { stop.await.exit_code() })
}

async fn client(kubeconfig: Option<&PathBuf>) -> Result<(kube::Client, String), CliError> {
    let config = graceguard_contract::client::config(kubeconfig.map(PathBuf::as_path)).await?;
    let ns = config.default_namespace.clone();
    let c = kube::Client::try_from(crate::runtime::bounded(config)).map_err(CliError::Client)?;
    c.apiserver_version().await.map_err(CliError::Unreachable)?;
    Ok((c, ns))
}

/// A manifest's template, kept whole ([`Template`]), with its namespace and name.
struct Manifest {
    template: Template,
    namespace: Option<String>,
    name: Option<String>,
}

fn read_manifest(path: &PathBuf) -> Result<Manifest, CliError> {
    let text = std::fs::read_to_string(path).map_err(|source| CliError::ReadManifest {
        path: path.clone(),
        source,
    })?;
    let value: serde_json::Value =
        serde_yaml_ng::from_str(&text).map_err(|source| CliError::ManifestSyntax {
            path: path.clone(),
            source,
        })?;
    let kind = value.get("kind").and_then(|k| k.as_str()).unwrap_or("");
    if kind != "Pod" {
        return Err(CliError::NotAPod {
            path: path.clone(),
            kind: kind.into(),
        });
    }
    let meta = |key: &str| {
        value
            .get("metadata")
            .and_then(|m| m.get(key))
            .and_then(serde_json::Value::as_str)
            .map(str::to_string)
    };
    let (namespace, name) = (meta("namespace"), meta("name"));
    let template = Template::from_json(value).map_err(|source| CliError::InvalidPod {
        path: path.clone(),
        source,
    })?;
    Ok(Manifest {
        template,
        namespace,
        name,
    })
}

struct Progress {
    bar: Option<ProgressBar>,
    json: bool,
}

impl Progress {
    fn new(json: bool) -> Self {
        let bar = std::io::stderr().is_terminal().then(|| {
            let b = ProgressBar::new_spinner();
            b.set_style(
                ProgressStyle::with_template("{spinner} {msg} [{elapsed}]")
                    .unwrap_or_else(|_| ProgressStyle::default_spinner()),
            );
            b.enable_steady_tick(Duration::from_millis(120));
            b
        });
        Self { bar, json }
    }

    fn show(&self, t: &Transition) {
        if self.json {
            if let Ok(line) = serde_json::to_string(t) {
                println!("{line}");
            }
        }
        let text = match &t.reason {
            Some(r) => format!(
                "{} attempt {} ({}): {} — {r}",
                t.task, t.attempt, t.pod, t.phase
            ),
            None => format!("{} attempt {} ({}): {}", t.task, t.attempt, t.pod, t.phase),
        };
        match &self.bar {
            Some(b) => {
                b.println(&text);
                b.set_message(format!("{} attempt {}: {}", t.task, t.attempt, t.phase));
            }
            None => eprintln!("{text}"),
        }
    }

    fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish_and_clear();
        }
    }
}

async fn run(args: RunArgs) -> Result<Ended, CliError> {
    // Listen before anything is created, so no signal can leave a pod behind.
    let stop = stop_signal()?;
    tokio::pin!(stop);
    let Manifest {
        template,
        namespace: manifest_namespace,
        name: manifest_name,
    } = read_manifest(&args.file)?;
    let (client, default_ns) = client(args.kubeconfig.as_ref()).await?;
    let namespace = args
        .namespace
        .clone()
        .or(manifest_namespace)
        .unwrap_or_else(|| default_ns.clone());
    let task = args
        .name
        .clone()
        .or(manifest_name)
        .ok_or(CliError::NoTaskName)?;
    let instance = match args.instance.clone() {
        Some(i) => i,
        None => default_instance(&client, &default_ns).await,
    };
    crate::core::naming::check_instance(&instance)?;
    let holding = args.lease.hold(&client, &namespace, &instance).await?;
    // The same reconciler as the sidecar's, for one task: a task whose pods
    // this instance made before (a restarted run) is resumed.
    let mut config = GuardConfig::new(&instance);
    config.fence = holding.fence();
    let executor = Guard::new(client.clone(), config).executor(&namespace);
    let key = TaskKey::new(&namespace, &task);
    let spec = TaskSpec {
        retries: args.retries,
        max_system_failures: args.max_system_failures.max(1),
        bounds: args.bounds.to_bounds(),
        rerun_done: !args.no_rerun,
        ..TaskSpec::new(&task, &namespace, &instance)
    };
    executor.submit(spec, template).await?;
    let progress = Progress::new(args.events == Some(EventsFormat::Json));
    let result = tokio::select! {
        r = executor.wait_result(&key, |t| progress.show(t)) => r,
        code = &mut stop => {
            progress.finish();
            cancel(&client, &executor, &key, code).await;
            holding.stop(true).await;
            return Ok(Ended::Signal(code));
        }
    };
    progress.finish();
    // The result's done-mark let go of its pod; earlier attempts' pods too.
    executor.settle(Duration::from_secs(10)).await;
    holding.stop(true).await;
    match result {
        Ok(o) => {
            match (&o.succeeded, &o.reason) {
                (true, Some(r)) => eprintln!("task succeeded: {r}"),
                (true, None) => eprintln!("task succeeded after {} attempt(s)", o.attempts),
                (false, Some(r)) => eprintln!("task failed: {r}"),
                (false, None) => eprintln!("task failed"),
            }
            Ok(Ended::Task(o))
        }
        Err(e) => Err(e.into()),
    }
}

async fn sidecar(args: SidecarArgs) -> Result<Ended, CliError> {
    tracing_subscriber::fmt()
        .json()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let stop = stop_signal()?;
    crate::core::naming::check_instance(&args.instance)?;
    let listen = match (&args.socket, args.listen) {
        (Some(p), _) => Listen::Socket(p.clone()),
        (None, Some(addr)) if !addr.ip().is_loopback() => return Err(CliError::NotLoopback(addr)),
        (None, Some(addr)) => Listen::Tcp(addr),
        (None, None) => return Err(CliError::NoListener),
    };
    let token = match &args.token_file {
        Some(f) => {
            check_private(f)?;
            let t = std::fs::read_to_string(f).map_err(|source| CliError::TokenFile {
                path: f.clone(),
                source,
            })?;
            let t = t.trim().to_string();
            if t.len() < 16 {
                return Err(CliError::ShortToken(f.clone()));
            }
            Some(std::sync::Arc::new(t))
        }
        None => None,
    };
    let (client, default_ns) = client(args.kubeconfig.as_ref()).await?;
    let lease_ns = args
        .lease_namespace
        .clone()
        .or_else(|| args.namespace.clone())
        .unwrap_or(default_ns);
    let holding = args.lease.hold(&client, &lease_ns, &args.instance).await?;
    let mut config = GuardConfig::new(&args.instance);
    config.namespace = args.namespace.clone();
    config.fence = holding.fence();
    config.forget_after =
        (args.forget_after_seconds > 0).then(|| Duration::from_secs(args.forget_after_seconds));
    config.publish_events = !args.no_kube_events;
    config.max_tasks = args.max_tasks.max(1);
    config.max_template_bytes = args.max_template_bytes;
    config.max_result_hold = (args.max_result_hold_seconds > 0)
        .then(|| Duration::from_secs(args.max_result_hold_seconds));
    let executor = Executor::start(client.clone(), config);
    let adoption = match (&args.namespace, args.adopt) {
        (Some(ns), true) => {
            Some(executor.adopt_with(Adopter::new(client, ns, &lease_ns, &args.instance)))
        }
        _ => None,
    };
    let state = Sidecar { executor, token };
    // One stop signal for both listeners.
    let (stopped_tx, stopped_rx) = tokio::sync::watch::channel(false);
    let stopped_tx = std::sync::Arc::new(stopped_tx);
    let stopped = move || {
        let mut rx = stopped_rx.clone();
        async move {
            let _ = rx.wait_for(|s| *s).await;
        }
    };
    let metrics = match args.metrics_listen {
        Some(addr) => Some(tokio::spawn(
            crate::sidecar::serve_metrics(addr, state.clone(), stopped()).await?,
        )),
        None => None,
    };
    let on_signal = stopped_tx.clone();
    tokio::spawn(async move {
        stop.await;
        on_signal.send_replace(true);
    });
    let served = serve(listen, state, stopped()).await;
    // The API listener ended (a signal, or it failed): so does the other.
    stopped_tx.send_replace(true);
    if let Some(m) = metrics {
        match m.await {
            Ok(Err(e)) => tracing::warn!(error = %e, "the metrics listener failed"),
            Err(e) => tracing::warn!(error = %e, "the metrics listener stopped"),
            Ok(Ok(())) => {}
        }
    }
    if let Some(a) = adoption {
        a.abort();
    }
    // A clean stop gives the Lease up: a successor starts at once.
    holding.stop(true).await;
    served?;
    Ok(Ended::Signal(0))
}

async fn release_results(args: ReleaseArgs) -> Result<Ended, CliError> {
    if let Some(i) = &args.instance {
        crate::core::naming::check_instance(i)?;
    }
    let (client, _) = client(args.kubeconfig.as_ref()).await?;
    let namespaces = match &args.namespace {
        Some(ns) => vec![ns.clone()],
        None => {
            crate::runtime::result_release::namespaces_holding(&client, args.instance.as_deref())
                .await?
        }
    };
    let (mut released, mut total) = (0, 0);
    for namespace in &namespaces {
        let req = crate::runtime::result_release::ReleaseRequest {
            lease_namespace: args
                .lease_namespace
                .clone()
                .unwrap_or_else(|| namespace.clone()),
            namespace: namespace.clone(),
            instance: args.instance.clone(),
            force: args.force,
            lease_wait: Duration::from_secs(args.lease_wait_seconds),
        };
        let done = crate::runtime::result_release::release_results(&client, &req).await?;
        for r in &done {
            println!("{}", serde_json::to_string(r).unwrap_or_default());
        }
        released += done.iter().filter(|r| r.outcome == "released").count();
        total += done.len();
    }
    let scope = match &args.namespace {
        Some(ns) => ns.clone(),
        None => format!("{} namespaces", namespaces.len()),
    };
    eprintln!("{released} of {total} pods holding the result finalizer in {scope} released");
    Ok(Ended::Exit(if released == total { 0 } else { 1 }))
}

/// Refuses a token file others can read (or write): the token is the
/// API's only guard on a TCP listener.
fn check_private(f: &std::path::Path) -> Result<(), CliError> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(f).map_err(|source| CliError::TokenFile {
        path: f.to_path_buf(),
        source,
    })?;
    let mode = meta.permissions().mode() & 0o777;
    // Group read is allowed (a Secret volume with defaultMode 0440 and an
    // fsGroup); anything for others, or group write, is not.
    if mode & 0o027 != 0 {
        return Err(CliError::TokenFileMode {
            path: f.to_path_buf(),
            mode,
        });
    }
    Ok(())
}

/// SIGINT or SIGTERM: abort the task (its current pod is deleted gracefully,
/// only if it is still the pod this run created: a uid precondition), and
/// wait until the pod is gone.
async fn cancel(client: &kube::Client, executor: &Executor, key: &TaskKey, code: i32) {
    let signal = if code == 143 { "SIGTERM" } else { "SIGINT" };
    let mut status = match executor.abort(key).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("stopped by {signal}; could not abort the task: {e}");
            return;
        }
    };
    // A Create was in flight: its pod is deleted as soon as it is known.
    let settle = tokio::time::Instant::now() + Duration::from_secs(30);
    while status.uid.is_none() && status.cleanup_pending && tokio::time::Instant::now() < settle {
        tokio::time::sleep(Duration::from_millis(100)).await;
        match executor.status(key).await {
            Some(s) => status = s,
            None => break,
        }
    }
    let Some(uid) = status.uid.clone() else {
        eprintln!("stopped by {signal}; no pod was running");
        return;
    };
    eprintln!(
        "stopped by {signal}: deleting pod {}/{} (uid {uid}) gracefully and waiting for it",
        key.namespace, status.pod
    );
    let api: Api<Pod> = Api::namespaced(client.clone(), &key.namespace);
    // The executor deletes it in the background; this makes sure it was
    // asked before waiting (a second delete of the same uid is harmless).
    delete_exact(&api, &status.pod, &uid).await;
    // kube's await_condition watches with the default 290 s timeout, which
    // the client's read timeout (api_timeouts) cuts while the pod stays
    // quiet: each cut starts it again.
    let gone = async {
        while let Err(e) =
            await_condition(api.clone(), &status.pod, conditions::is_deleted(&uid)).await
        {
            tracing::debug!(error = %e, "watching the pod's deletion again");
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    };
    if tokio::time::timeout(Duration::from_secs(300), gone)
        .await
        .is_err()
    {
        eprintln!(
            "pod {} is still terminating after 300 s; leaving it to the cluster",
            status.pod
        );
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn version_names_the_release_and_the_source_revision() {
        use clap::CommandFactory;
        let v = super::Cli::command().render_version();
        let want = format!(
            "graceguard {} (revision {})",
            env!("CARGO_PKG_VERSION"),
            graceguard_contract::build::REVISION
        );
        assert_eq!(v.trim(), want);
    }
}
