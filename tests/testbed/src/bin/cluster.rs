//! `scripts/cluster`: a single-machine Kubernetes 1.37 cluster with real
//! nodes, to try graceguard on by hand and to install it as users do.
//!
//! `up` starts a detached supervisor (`serve`) that owns every process of the
//! cluster (control plane, nodes, kube-proxy) and tears it all down on
//! SIGTERM; `down` sends that and waits. What the cluster made on the machine
//! is in its slot's ledger, so `down --all` can sweep what a killed
//! supervisor left.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Parser, Subcommand};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, PostParams};
use kube::Api;
use serde_json::{json, Value};
use testbed::node::slot::{self, Family};
use testbed::{process::tail, KubeVersion, TestBed, TestBedOptions};

#[derive(Parser)]
#[command(
    about = "A single-machine Kubernetes cluster with real nodes (kubelet, containerd, runc, CNI)"
)]
struct Args {
    /// Where the cluster's description (cluster.json), supervisor log and pid live.
    #[arg(
        long,
        env = "GRACEGUARD_CLUSTER_DIR",
        default_value = "/run/graceguard-cluster"
    )]
    state_dir: PathBuf,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Start the cluster; returns once every node is Ready and a probe pod
    /// ran to Succeeded (it reaches the API server through the `kubernetes` Service).
    Up {
        /// Real nodes (node-1…), at most 4.
        #[arg(long, default_value_t = 1)]
        nodes: u8,
        /// Hollow nodes (hollow-1…): kubemark's hollow kubelet, each a process
        /// with its own node identity, tainted `graceguard.dev/hollow=true:NoSchedule`
        /// so only pods that tolerate it land there (about 95 MB and 0.6% of
        /// a core each, idle).
        #[arg(long, default_value_t = 0)]
        hollow_nodes: usize,
        /// An IPv6 single-stack cluster: pods, nodes, the API server and
        /// Services on IPv6 addresses only (from 2001:2::/48).
        #[arg(long)]
        ipv6: bool,
        /// Print the cluster's description as one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Import OCI image archives into every node's containerd (as `kind load` does).
    Load {
        #[arg(required = true)]
        archives: Vec<PathBuf>,
    },
    /// Stop the cluster and remove everything it made.
    Down {
        /// Also sweep every test-bed slot no running bed holds (what killed
        /// tests or supervisors left).
        #[arg(long)]
        all: bool,
    },
    /// Print the running cluster's description, or fail if none runs.
    Status,
    /// The supervisor (started by `up`).
    #[command(hide = true)]
    Serve {
        #[arg(long)]
        nodes: u8,
        #[arg(long, default_value_t = 0)]
        hollow_nodes: usize,
        #[arg(long)]
        ipv6: bool,
    },
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let result = match args.command {
        Cmd::Up {
            nodes,
            hollow_nodes,
            ipv6,
            json,
        } => up(&args.state_dir, nodes, hollow_nodes, ipv6, json).await,
        Cmd::Load { ref archives } => load(&args.state_dir, archives),
        Cmd::Down { all } => down(&args.state_dir, all),
        Cmd::Status => status(&args.state_dir),
        Cmd::Serve {
            nodes,
            hollow_nodes,
            ipv6,
        } => serve(&args.state_dir, nodes, hollow_nodes, ipv6).await,
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

fn description_path(dir: &Path) -> PathBuf {
    dir.join("cluster.json")
}

fn pid_path(dir: &Path) -> PathBuf {
    dir.join("supervisor.pid")
}

/// The supervisor's pid, if one is alive.
fn supervisor(dir: &Path) -> Option<i32> {
    let pid: i32 = std::fs::read_to_string(pid_path(dir))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    // SAFETY: signal 0 only checks that the process exists.
    (unsafe { libc::kill(pid, 0) } == 0).then_some(pid)
}

fn read_description(dir: &Path) -> Result<Value> {
    let path = description_path(dir);
    let text = std::fs::read_to_string(&path).with_context(|| {
        format!(
            "no cluster runs with state dir {} ({} is missing); start one with `scripts/cluster up`",
            dir.display(),
            path.display()
        )
    })?;
    serde_json::from_str(&text).with_context(|| format!("reading {}", path.display()))
}

async fn up(dir: &Path, nodes: u8, hollow_nodes: usize, ipv6: bool, json_out: bool) -> Result<()> {
    if let Some(pid) = supervisor(dir) {
        bail!("a cluster already runs with state dir {} (supervisor pid {pid}); `scripts/cluster down` first, or pass another --state-dir", dir.display());
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let _ = std::fs::remove_file(description_path(dir));
    let log = dir.join("supervisor.log");
    let out = std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.arg(format!("--state-dir={}", dir.display()))
        .arg("serve")
        .arg(format!("--nodes={nodes}"))
        .arg(format!("--hollow-nodes={hollow_nodes}"))
        .args(ipv6.then_some("--ipv6"))
        .stdin(Stdio::null())
        .stdout(out.try_clone()?)
        .stderr(out);
    // SAFETY: setsid is async-signal-safe: the supervisor outlives this command.
    unsafe {
        cmd.pre_exec(|| {
            if libc::setsid() < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().context("starting the cluster's supervisor")?;
    std::fs::write(pid_path(dir), child.id().to_string())?;
    eprintln!(
        "starting a Kubernetes {} cluster with {nodes} real node(s) and {hollow_nodes} hollow node(s); log: {}",
        KubeVersion::from_env()?.as_str(),
        log.display()
    );
    // Hollow nodes register at once and share the machine's cores.
    let limit = 300 + 2 * hollow_nodes as u64;
    let deadline = Instant::now() + Duration::from_secs(limit);
    loop {
        if description_path(dir).exists() {
            break;
        }
        if let Some(status) = child.try_wait()? {
            bail!(
                "the cluster did not start (supervisor {status}); {} ends:\n{}",
                log.display(),
                tail(&log, 30)
            );
        }
        if Instant::now() > deadline {
            bail!(
                "the cluster was not up within {limit} s; {} ends:\n{}\nstop it with `scripts/cluster down`",
                log.display(),
                tail(&log, 30)
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let d = read_description(dir)?;
    if json_out {
        println!("{}", serde_json::to_string(&d)?);
    } else {
        eprintln!(
            "cluster up: {} node(s) and {} hollow node(s) Ready.\n  export KUBECONFIG={}\n  {} run hello --image={} --restart=Never -- sh -c 'echo hello from a real container'",
            d["nodes"].as_array().map(Vec::len).unwrap_or(0),
            d["hollow_nodes"].as_array().map(Vec::len).unwrap_or(0),
            d["kubeconfig"].as_str().unwrap_or(""),
            d["kubectl"].as_str().unwrap_or("kubectl"),
            d["task_image"].as_str().unwrap_or("")
        );
    }
    Ok(())
}

/// A pod that runs to Succeeded only if its container started and reached
/// the API server through the `kubernetes` Service (pod network, kube-proxy).
async fn probe(bed: &TestBed, image: &str) -> Result<()> {
    let api: Api<Pod> = Api::namespaced(bed.client.clone(), "default");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "graceguard-cluster-probe"},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "containers": [{
                "name": "probe", "image": image, "imagePullPolicy": "IfNotPresent",
                "command": ["sh", "-c", "nc -w 5 \"$KUBERNETES_SERVICE_HOST\" \"$KUBERNETES_SERVICE_PORT\" </dev/null && echo reached the API server"],
            }],
        },
    }))?;
    api.create(&PostParams::default(), &pod)
        .await
        .context("creating the probe pod")?;
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let p = api.get("graceguard-cluster-probe").await?;
        match p.status.and_then(|s| s.phase).as_deref() {
            Some("Succeeded") => break,
            Some("Failed") => {
                let logs = api
                    .logs("graceguard-cluster-probe", &Default::default())
                    .await
                    .unwrap_or_default();
                bail!("the probe pod failed: it could not reach the API server through the kubernetes Service (logs: {logs:?})");
            }
            _ if Instant::now() > deadline => {
                bail!("the probe pod did not succeed within 120 s")
            }
            _ => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
    api.delete("graceguard-cluster-probe", &DeleteParams::default())
        .await?;
    Ok(())
}

async fn serve(dir: &Path, nodes: u8, hollow_nodes: usize, ipv6: bool) -> Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let mut int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?;
    let bed = TestBed::start_with(TestBedOptions {
        audit: true,
        version: None,
        real_nodes: nodes,
        pod_network: true,
        ip_family: if ipv6 { Family::V6 } else { Family::V4 },
        hollow_nodes,
        audit_namespace: None,
        kubelet_verbosity: None,
    })
    .await?;
    let n = bed
        .nodes
        .as_ref()
        .context("the bed started without its nodes")?;
    probe(&bed, &n.bins.task_image).await?;
    let d = json!({
        "kube_version": bed.version.as_str(),
        "kubeconfig": bed.kubeconfig,
        "server": bed.url,
        "nodes": n.nodes.iter().map(|x| json!({
            "name": x.name, "address": x.ip.to_string(), "kubelet_port": x.kubelet.port,
            "containerd_socket": x.containerd.socket,
        })).collect::<Vec<_>>(),
        "hollow_nodes": n.hollow.iter().map(|h| json!({"name": h.name, "pid": h.proc.pid()})).collect::<Vec<_>>(),
        "hollow_taint": testbed::node::hollow::TAINT,
        "task_image": n.bins.task_image,
        "pause_image": n.bins.pause_image,
        "kubectl": bed.kubectl_path(),
        "ctr": n.bins.bin("ctr")?,
        // scripts/cluster up exports the helm it built (scripts/install-helm).
        "helm": std::env::var("GRACEGUARD_HELM").ok().filter(|h| !h.is_empty()),
        "containerd_sockets": n.nodes.iter().map(|x| x.containerd.socket.clone()).collect::<Vec<_>>(),
        "pod_cidr": n.slot.pod_subnet(),
        "service_cidr": n.slot.service_cidr(),
        "slot": n.slot.n,
        "bed_dir": bed.dir(),
        "audit_log": bed.dir().join("audit.log"),
        "state_dir": dir,
        "kubelet": "real",
    });
    let tmp = dir.join("cluster.json.tmp");
    std::fs::write(&tmp, serde_json::to_vec_pretty(&d)?)?;
    std::fs::rename(&tmp, description_path(dir))?;
    eprintln!("cluster up");
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    eprintln!("stopping the cluster");
    let _ = std::fs::remove_file(description_path(dir));
    drop(bed);
    eprintln!("cluster stopped");
    Ok(())
}

fn load(dir: &Path, archives: &[PathBuf]) -> Result<()> {
    let d = read_description(dir)?;
    let ctr = d["ctr"].as_str().context("cluster.json names no ctr")?;
    let sockets = d["containerd_sockets"]
        .as_array()
        .context("cluster.json lists no containerd sockets")?;
    for a in archives {
        anyhow::ensure!(
            a.is_file(),
            "{} is not a file: pass OCI image archives (scripts/image writes them)",
            a.display()
        );
        for s in sockets {
            let s = s.as_str().unwrap_or_default();
            let names = testbed::node::containerd::import_with(Path::new(ctr), Path::new(s), a)?;
            eprintln!("{}: {} into {s}", a.display(), names.join(", "));
        }
    }
    Ok(())
}

fn status(dir: &Path) -> Result<()> {
    match supervisor(dir) {
        Some(_) => {
            let d = read_description(dir)?;
            println!("{}", serde_json::to_string_pretty(&d)?);
            Ok(())
        }
        None => bail!(
            "no cluster runs with state dir {}; start one with `scripts/cluster up`",
            dir.display()
        ),
    }
}

fn down(dir: &Path, all: bool) -> Result<()> {
    let slot_of = read_description(dir)
        .ok()
        .and_then(|d| d["slot"].as_u64())
        .and_then(|n| u8::try_from(n).ok());
    if let Some(pid) = supervisor(dir) {
        // SAFETY: signalling the cluster's own supervisor.
        unsafe {
            libc::kill(pid, libc::SIGTERM);
        }
        let deadline = Instant::now() + Duration::from_secs(90);
        while supervisor(dir).is_some() {
            if Instant::now() > deadline {
                // SAFETY: as above.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                }
                eprintln!("the supervisor did not stop within 90 s: killed; sweeping what it left");
                break;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        eprintln!("cluster stopped");
    } else if slot_of.is_none() && !all {
        eprintln!("no cluster runs with state dir {}", dir.display());
    }
    let _ = std::fs::remove_file(pid_path(dir));
    let _ = std::fs::remove_file(description_path(dir));
    // What a killed supervisor left in its slot (or, with --all, in any slot
    // nobody holds) is swept: taking a slot sweeps its ledger.
    let slots: Vec<u8> = match (all, slot_of) {
        (true, _) => (1..=slot::MAX_SLOTS).collect(),
        (false, Some(n)) => vec![n],
        (false, None) => Vec::new(),
    };
    for n in slots {
        if Path::new(slot::RUN_DIR)
            .join(format!("slot-{n}.json"))
            .exists()
        {
            if let Some(mut s) = slot::Slot::try_take(n)? {
                s.clean()?;
                eprintln!("swept slot {n}");
            }
        }
    }
    Ok(())
}
