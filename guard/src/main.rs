//! `graceguard run`: run one pod task to completion by graceguard's rules.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use graceguard::driver::{CurrentPod, PodRef};
use graceguard::lease::InstanceLease;
use graceguard::{Guard, GuardConfig, Outcome, TaskSpec, Transition};
use indicatif::{ProgressBar, ProgressStyle};
use k8s_openapi::api::core::v1::Pod;
use kube::api::DeleteParams;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::wait::{await_condition, conditions};
use kube::Api;

#[derive(Parser)]
#[command(
    name = "graceguard",
    version,
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
    /// This executor instance's name (labels and Lease).
    #[arg(long, default_value_t = default_instance())]
    instance: String,
}

/// `run-<host>-<random>`: unique even where every run is PID 1 in a container.
fn default_instance() -> String {
    use std::hash::{BuildHasher, Hasher};
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "local".into());
    // RandomState is seeded from the OS's randomness.
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    graceguard::naming::task_stem(&format!("run-{host}-{:08x}", h.finish() as u32))
}

/// Usage and configuration errors: exit 2.
struct Usage(String);

/// How `run` ended.
enum Ended {
    Task(Outcome),
    /// Stopped by a signal: the shell's exit code for it (128 + number).
    Signal(i32),
}

#[tokio::main]
async fn main() {
    let cli = Cli::parse();
    let Command::Run(args) = cli.command;
    graceguard_certs::install_crypto_provider();
    let code = match run(args).await {
        Ok(Ended::Task(o)) if o.succeeded => 0,
        Ok(Ended::Task(_)) => 1,
        Ok(Ended::Signal(code)) => code,
        Err(Usage(msg)) => {
            eprintln!("graceguard: {msg}");
            2
        }
    };
    std::process::exit(code);
}

/// Resolves on SIGINT (Ctrl-C) or SIGTERM (how Kubernetes, Argo and Airflow
/// stop a process) with the exit code for it: 130 or 143.
/// The handlers are installed when this is called, not when the future is
/// first polled.
fn stop_signal() -> Result<impl std::future::Future<Output = i32>, Usage> {
    use tokio::signal::unix::{signal, SignalKind};
    let listen = |kind| signal(kind).map_err(|e| Usage(format!("cannot listen for signals: {e}")));
    let (mut int, mut term) = (
        listen(SignalKind::interrupt())?,
        listen(SignalKind::terminate())?,
    );
    Ok(async move {
        tokio::select! {
            _ = int.recv() => 130,
            _ = term.recv() => 143,
        }
    })
}

async fn client(kubeconfig: Option<&PathBuf>) -> Result<(kube::Client, String), Usage> {
    let config = match kubeconfig {
        Some(p) => {
            let kc = Kubeconfig::read_from(p)
                .map_err(|e| Usage(format!("cannot read kubeconfig {}: {e}", p.display())))?;
            kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .map_err(|e| Usage(format!("kubeconfig {} is not usable: {e}", p.display())))?
        }
        None => kube::Config::infer().await.map_err(|e| {
            Usage(format!(
                "no cluster configuration ({e}); pass --kubeconfig FILE or set KUBECONFIG"
            ))
        })?,
    };
    let ns = config.default_namespace.clone();
    let c = kube::Client::try_from(config)
        .map_err(|e| Usage(format!("cannot build a Kubernetes client: {e}")))?;
    c.apiserver_version().await.map_err(|e| {
        Usage(format!(
            "cannot reach the API server: {e}; check the kubeconfig and that the cluster is up"
        ))
    })?;
    Ok((c, ns))
}

fn read_manifest(path: &PathBuf) -> Result<Pod, Usage> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| Usage(format!("cannot read {}: {e}", path.display())))?;
    let value: serde_json::Value = serde_yaml_ng::from_str(&text)
        .map_err(|e| Usage(format!("{} is not YAML or JSON: {e}", path.display())))?;
    let kind = value.get("kind").and_then(|k| k.as_str()).unwrap_or("");
    if kind != "Pod" {
        return Err(Usage(format!(
            "{}: kind is {kind:?}; graceguard run takes a Pod manifest",
            path.display()
        )));
    }
    let pod: Pod = serde_json::from_value(value)
        .map_err(|e| Usage(format!("{} is not a valid Pod: {e}", path.display())))?;
    if pod.spec.as_ref().is_none_or(|s| s.containers.is_empty()) {
        return Err(Usage(format!(
            "{}: the Pod has no containers",
            path.display()
        )));
    }
    Ok(pod)
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

async fn run(args: RunArgs) -> Result<Ended, Usage> {
    // Listen before anything is created, so no signal can leave a pod behind.
    let stop = stop_signal()?;
    tokio::pin!(stop);
    let template = read_manifest(&args.file)?;
    let (client, default_ns) = client(args.kubeconfig.as_ref()).await?;
    let namespace = args
        .namespace
        .clone()
        .or_else(|| template.metadata.namespace.clone())
        .unwrap_or(default_ns);
    let task = args
        .name
        .clone()
        .or_else(|| template.metadata.name.clone())
        .ok_or_else(|| {
            Usage("no task name: pass --name TASK or set metadata.name in the manifest".into())
        })?;
    let lease = InstanceLease::acquire(
        client.clone(),
        &namespace,
        &args.instance,
        Duration::from_secs(30),
    )
    .await
    .map_err(|e| Usage(e.to_string()))?;
    let renewal = lease.spawn_renewal();
    let guard = Guard::new(client.clone(), GuardConfig::new(&args.instance));
    let spec = TaskSpec {
        task,
        namespace,
        instance: args.instance.clone(),
        retries: args.retries,
        max_system_failures: args.max_system_failures,
    };
    let progress = Progress::new(args.events == Some(EventsFormat::Json));
    let current = CurrentPod::default();
    let result = tokio::select! {
        r = guard.run_tracked(spec, template, |t| progress.show(t), current.clone()) => r,
        code = &mut stop => {
            progress.finish();
            let pod = current.lock().map(|c| c.clone()).unwrap_or_default();
            cancel(&client, pod, code).await;
            renewal.abort();
            return Ok(Ended::Signal(code));
        }
    };
    progress.finish();
    renewal.abort();
    match result {
        Ok(o) => {
            match (&o.succeeded, &o.reason) {
                (true, _) => eprintln!("task succeeded after {} attempt(s)", o.attempts),
                (false, Some(r)) => eprintln!("task failed: {r}"),
                (false, None) => eprintln!("task failed"),
            }
            Ok(Ended::Task(o))
        }
        Err(e) => Err(Usage(e.to_string())),
    }
}

/// SIGINT or SIGTERM: delete the current attempt's pod gracefully, only if it
/// is still the pod this run created (a uid precondition: a pod of the same
/// name created since is left alone), and wait until it is gone.
async fn cancel(client: &kube::Client, pod: Option<PodRef>, code: i32) {
    let signal = if code == 143 { "SIGTERM" } else { "SIGINT" };
    let Some(p) = pod else {
        eprintln!("stopped by {signal}; no pod was running");
        return;
    };
    eprintln!(
        "stopped by {signal}: deleting pod {}/{} (uid {}) gracefully and waiting for it",
        p.namespace, p.name, p.uid
    );
    let api: Api<Pod> = Api::namespaced(client.clone(), &p.namespace);
    let dp = DeleteParams {
        preconditions: Some(kube::api::Preconditions {
            uid: Some(p.uid.clone()),
            resource_version: None,
        }),
        ..Default::default()
    };
    if let Err(e) = api.delete(&p.name, &dp).await {
        // 404: already gone; 409: the name now holds another pod (not ours).
        if !matches!(&e, kube::Error::Api(s) if s.code == 404 || s.code == 409) {
            eprintln!("could not delete pod {}: {e}", p.name);
            return;
        }
    }
    let gone = await_condition(api, &p.name, conditions::is_deleted(&p.uid));
    if tokio::time::timeout(Duration::from_secs(300), gone)
        .await
        .is_err()
    {
        eprintln!(
            "pod {} is still terminating after 300 s; leaving it to the cluster",
            p.name
        );
    }
}
