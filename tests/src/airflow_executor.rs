//! Airflow's own KubernetesExecutor against the test bed: the provider's
//! real code (a venv per provider version, built by
//! `scripts/airflow-venv.sh`), Airflow's own configuration, a real
//! PostgreSQL metadata database. Completed pods of a dead scheduler are
//! adopted while the executors' `sync()` loops run and results keep
//! arriving; their PATCHes per pod are counted from the API server's audit
//! log (apache/airflow#68683: the adopted set was never drained, so every
//! sync re-patched every pod ever adopted; #66396: schedulers relabelling
//! each other's pods).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use std::sync::{Arc, Mutex};

use anyhow::{bail, Context, Result};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::PostParams;
use kube::runtime::{watcher, WatchStreamExt};
use kube::Api;
use kube::ResourceExt;
use serde::Serialize;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use testbed::control_plane::TestBed;
use testbed::kubelet::{Kubelet, Terminal};
use testbed::postgres::Postgres;

/// The provider versions measured: the one apache/airflow#68683 was filed
/// against, and the newest on PyPI when this was written.
pub const PROVIDERS: &[&str] = &["10.18.0", "10.25.0"];

/// The Python of the venv with provider `version`:
/// `$GRACEGUARD_AIRFLOW_PY_<version with _>` (set by `scripts/airflow-venv.sh`).
pub fn airflow_python(version: &str) -> Result<PathBuf> {
    let var = format!("GRACEGUARD_AIRFLOW_PY_{}", version.replace('.', "_"));
    std::env::var_os(&var).map(PathBuf::from).with_context(|| {
        format!("{var} is not set: run through scripts/test or scripts/demo, or `source scripts/airflow-venv.sh` (it builds the Airflow venvs)")
    })
}

/// One run's figures.
#[derive(Debug, Clone, Serialize)]
pub struct AirflowRun {
    /// `airflow-<provider version>`.
    pub row: String,
    pub provider: String,
    /// Live executors (schedulers) adopting at once.
    pub executors: usize,
    pub completed_pods: usize,
    pub syncs: usize,
    /// The executors' pod PATCHes (audit log, identity `alice`).
    pub patches: usize,
    pub patches_per_pod: f64,
    pub max_patches_of_a_pod: usize,
    /// Pods whose `airflow-worker` label was set by more than one executor
    /// (adopted twice: both executors take its result up).
    pub adopted_twice: usize,
}

/// A completed-to-be pod of scheduler job `dead`, as the executor labels its
/// task pods (`kubernetes_executor=True`, `airflow-worker=<job id>`, the
/// task instance's key in annotations).
fn worker_pod(name: &str, task: &str, dead: i64) -> Pod {
    let mut pod = testbed::pods::task_pod(name, 30);
    let meta = &mut pod.metadata;
    meta.labels = Some(
        [
            ("kubernetes_executor", "True".to_string()),
            ("airflow-worker", dead.to_string()),
            ("dag_id", "seed".to_string()),
            ("task_id", task.to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect(),
    );
    meta.annotations = Some(
        [
            ("dag_id", "seed"),
            ("task_id", task),
            ("run_id", "manual__seed"),
            ("try_number", "1"),
            ("map_index", "-1"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect(),
    );
    pod
}

/// Airflow's configuration for a run, as environment variables.
fn airflow_env(
    cmd: &mut tokio::process::Command,
    home: &Path,
    db: &str,
    ns: &str,
    kubeconfig: &Path,
    executor: &str,
) {
    cmd.env("AIRFLOW_HOME", home)
        .env("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", db)
        .env("AIRFLOW__CORE__EXECUTOR", executor)
        .env("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
        .env("AIRFLOW__KUBERNETES_EXECUTOR__NAMESPACE", ns)
        .env("AIRFLOW__KUBERNETES_EXECUTOR__IN_CLUSTER", "False")
        .env("AIRFLOW__KUBERNETES_EXECUTOR__CONFIG_FILE", kubeconfig)
        .env("AIRFLOW__KUBERNETES_EXECUTOR__DELETE_WORKER_PODS", "False")
        // Adopt at every sync (the default is every 300 s): the seed's
        // repetition in a short run.
        .env("AIRFLOW__SCHEDULER__ORPHANED_TASKS_CHECK_INTERVAL", "0")
        .env("KUBECONFIG", kubeconfig)
        .env_remove("AIRFLOW_CONFIG");
}

/// The driver's next JSON line.
async fn next_line(
    lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    log: &Path,
) -> Result<serde_json::Value> {
    let line = tokio::time::timeout(Duration::from_secs(120), lines.next_line())
        .await
        .context("the driver said nothing for 120 s")??;
    match line {
        Some(l) => serde_json::from_str(&l).with_context(|| format!("the driver printed {l:?}")),
        None => bail!(
            "the driver ended; its log:\n{}",
            testbed::process::tail(log, 40)
        ),
    }
}

/// The executor `[core] executor` names in airflow.cfg for a row.
pub const GRACEGUARD_EXECUTOR: &str = "graceguard_airflow.executor.GraceguardKubernetesExecutor";

/// What one run measures.
#[derive(Clone, Copy, Debug)]
pub struct Case<'a> {
    /// The provider version (its venv).
    pub provider: &'a str,
    /// `[core] executor`: `KubernetesExecutor` or [`GRACEGUARD_EXECUTOR`].
    pub executor: &'a str,
    /// Live executors (schedulers) adopting at once.
    pub executors: usize,
    pub pods: usize,
    pub syncs: usize,
}

/// `case.pods` completed pods of a dead scheduler; `case.executors` live
/// executors (as `alice`) sync `case.syncs` times at once, a batch of pods
/// completing before each sync.
pub async fn run(
    bed: &TestBed,
    kubelet: &Kubelet,
    pg: &Postgres,
    ns: &str,
    case: Case<'_>,
) -> Result<AirflowRun> {
    let Case {
        provider,
        executor,
        executors,
        pods,
        syncs,
    } = case;
    let ours = executor == GRACEGUARD_EXECUTOR;
    let py = airflow_python(provider)?;
    let db = format!(
        "af_{}_{executors}{}",
        provider.replace('.', "_"),
        if ours { "_gg" } else { "" }
    );
    pg.create_database(&db)?;
    let home = bed.dir().join(format!("airflow-{db}"));
    std::fs::create_dir_all(&home)?;
    let kubeconfig = bed.kubeconfig_for("alice")?;
    let mut migrate = tokio::process::Command::new(&py);
    migrate.args(["-m", "airflow", "db", "migrate"]);
    airflow_env(&mut migrate, &home, &pg.url(&db), ns, &kubeconfig, executor);
    let out = migrate
        .output()
        .await
        .context("running airflow db migrate")?;
    if !out.status.success() {
        bail!(
            "airflow db migrate failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("airflow/drive_kubernetes_executor.py");
    let mut cmd = tokio::process::Command::new(&py);
    cmd.arg(&script)
        .args(["--executors", &executors.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(home.join("driver.log"))?)
        .kill_on_drop(true);
    airflow_env(&mut cmd, &home, &pg.url(&db), ns, &kubeconfig, executor);
    let mut child = cmd.spawn().context("starting the executor driver")?;
    let mut stdin = child.stdin.take().context("driver stdin")?;
    let mut lines = BufReader::new(child.stdout.take().context("driver stdout")?).lines();
    let log = home.join("driver.log");
    let ids = next_line(&mut lines, &log).await?;
    let dead = ids["dead"].as_i64().context("no dead job id")?;
    // Every airflow-worker value each pod is given other than the dead
    // scheduler's: more than one is a pod two executors adopted.
    let relabelled: Arc<Mutex<BTreeMap<String, BTreeSet<String>>>> = Arc::default();
    let watch = {
        let api: Api<Pod> = Api::namespaced(bed.client.clone(), ns);
        let seen = relabelled.clone();
        let dead = dead.to_string();
        tokio::spawn(async move {
            let cfg = watcher::Config::default().labels("kubernetes_executor=True");
            let mut s = watcher(api, cfg)
                .default_backoff()
                .applied_objects()
                .boxed();
            while let Some(Ok(p)) = s.next().await {
                let worker = p
                    .labels()
                    .get("airflow-worker")
                    .cloned()
                    .unwrap_or_default();
                if worker != dead {
                    if let Ok(mut m) = seen.lock() {
                        m.entry(p.name_any()).or_default().insert(worker);
                    }
                }
            }
        })
    };
    let api: Api<Pod> = Api::namespaced(bed.client.clone(), ns);
    let prefix = format!(
        "p{}-{executors}{}",
        provider.replace('.', ""),
        if ours { "g" } else { "" }
    );
    let names: Vec<String> = (0..pods).map(|i| format!("{prefix}-{i}")).collect();
    for (i, n) in names.iter().enumerate() {
        api.create(
            &PostParams::default(),
            &worker_pod(n, &format!("t{i}"), dead),
        )
        .await
        .with_context(|| format!("creating {n}"))?;
    }
    testbed::pods::wait_running(&api, &names[pods - 1]).await?;
    next_line(&mut lines, &log).await?; // ready
    let per_sync = pods.div_ceil(syncs.max(1));
    for s in 0..syncs {
        for n in names.iter().skip(s * per_sync).take(per_sync) {
            kubelet.end_pod(ns, n, Terminal::Succeeded).await?;
        }
        // The watcher sees the change before the sync, as a scheduler's
        // loop (a second or more apart) does.
        tokio::time::sleep(Duration::from_millis(500)).await;
        stdin.write_all(b"sync\n").await?;
        let v = next_line(&mut lines, &log).await?;
        if v["errors"].as_array().is_some_and(|e| !e.is_empty()) {
            bail!("an executor's sync() raised: {}", v["errors"]);
        }
    }
    stdin.write_all(b"end\n").await?;
    let _ = tokio::time::timeout(Duration::from_secs(30), child.wait()).await;
    // The audit log's last records land a moment after the answers.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut per_pod: BTreeMap<String, usize> = BTreeMap::new();
    for e in bed.audit_log()?.events()? {
        let ours = e.verb == "patch"
            && e.user.username == "alice"
            && e.object_ref.as_ref().is_some_and(|o| {
                o.resource == "pods"
                    && o.namespace == ns
                    && o.name.starts_with(&format!("{prefix}-"))
            });
        if ours {
            *per_pod.entry(e.name().to_string()).or_default() += 1;
        }
    }
    watch.abort();
    let relabelled = relabelled.lock().map(|m| m.clone()).unwrap_or_default();
    let patches: usize = per_pod.values().sum();
    Ok(AirflowRun {
        row: if ours {
            "airflow-graceguard".to_string()
        } else {
            format!("airflow-{provider}")
        },
        provider: provider.to_string(),
        executors,
        completed_pods: pods,
        syncs,
        patches,
        patches_per_pod: patches as f64 / pods as f64,
        max_patches_of_a_pod: per_pod.values().copied().max().unwrap_or(0),
        adopted_twice: relabelled.values().filter(|w| w.len() > 1).count(),
    })
}
