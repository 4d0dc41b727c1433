//! A Kubernetes control plane on loopback, started as a production cluster runs
//! one: etcd and kube-apiserver with `--authorization-mode=Node,RBAC` and the
//! `NodeRestriction` and `ResourceQuota` admission plugins on top of the
//! version's defaults, kube-controller-manager (its controllers with their own
//! service-account identities) and kube-scheduler.
//!
//! Every request names who sends it: [`Identity`] lists the bed's users, from
//! the cluster admin down to the nodes (`system:node:<name>`, group
//! `system:nodes`), each with a static bearer token.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use k8s_openapi::api::core::v1::{Namespace, Node, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};
use serde_json::json;
use tempfile::TempDir;

use crate::audit_log::AuditLog;
use crate::binaries::{ControlPlaneBins, KubeVersion};
use crate::etcd_seed::Seed;
use crate::node::slot::Family;
use crate::process::{free_port, tail, Managed};

/// Someone the bed's API server knows, by bearer token.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Identity {
    /// The short name tests use (`admin`, `alice`, `node-1`, ...); also the
    /// kubeconfig's file suffix.
    pub key: &'static str,
    pub user: &'static str,
    /// Comma-separated groups (`system:authenticated` is added by the server).
    pub groups: &'static str,
}

/// The cluster admin (`system:masters`): sets up what a cluster operator would.
pub const ADMIN: Identity = Identity {
    key: "admin",
    user: "admin",
    groups: "system:masters",
};

/// Every identity the bed hands out.
pub const IDENTITIES: &[Identity] = &[
    ADMIN,
    // Plain users, as an executor's or an operator's account: bound to the
    // `graceguard-testbed:executor` ClusterRole below, never system:masters.
    Identity {
        key: "alice",
        user: "alice",
        groups: "testbed:users",
    },
    Identity {
        key: "bob",
        user: "bob",
        groups: "testbed:users",
    },
    // The webhook, with the RBAC the chart gives it.
    Identity {
        key: "graceguard",
        user: "graceguard",
        groups: "testbed:graceguard",
    },
    // Nodes: what the Node authorizer and NodeRestriction recognise.
    Identity {
        key: "node-1",
        user: "system:node:node-1",
        groups: "system:nodes",
    },
    Identity {
        key: "node-2",
        user: "system:node:node-2",
        groups: "system:nodes",
    },
    Identity {
        key: "node-3",
        user: "system:node:node-3",
        groups: "system:nodes",
    },
    Identity {
        key: "node-4",
        user: "system:node:node-4",
        groups: "system:nodes",
    },
    // kube-proxy (bootstrap RBAC's system:node-proxier binds this user).
    Identity {
        key: "kube-proxy",
        user: "system:kube-proxy",
        groups: "",
    },
    // The control plane's own components (bootstrap RBAC binds these users).
    Identity {
        key: "scheduler",
        user: "system:kube-scheduler",
        groups: "",
    },
    Identity {
        key: "controller-manager",
        user: "system:kube-controller-manager",
        groups: "",
    },
];

fn identity(key: &str) -> Result<Identity> {
    IDENTITIES
        .iter()
        .copied()
        .find(|i| i.key == key)
        .with_context(|| {
            let keys: Vec<&str> = IDENTITIES.iter().map(|i| i.key).collect();
            format!("the test bed has no identity {key:?}; use one of {keys:?}")
        })
}

/// True when `proc` exited at start because `port` was already in use (it
/// binds within moments of starting); false once it listens or keeps running.
async fn lost_its_port(proc: &mut Managed, addr: std::net::IpAddr, port: u16) -> bool {
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline {
        if proc.check_running().is_err() {
            return std::fs::read_to_string(&proc.log)
                .map(|l| l.contains("address already in use"))
                .unwrap_or(false);
        }
        if tokio::net::TcpStream::connect((addr, port)).await.is_ok() {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    false
}

/// The Go garbage collector's target for the bed's etcd, kube-apiserver,
/// controller manager and scheduler: collect when the heap has grown 400 %
/// since the last collection, not 100 %. Their startup is most of a CI
/// run's CPU (55–64 % of each pass's, measured with process accounting,
/// docs/testbed.md), and about a fifth of the API server's is
/// collecting garbage it would never run short of memory for: measured,
/// 1.24 CPU-seconds to ready against 1.59 (v1.37.2, seeded etcd). A
/// runtime setting, as operators set it; the API's behaviour is the same.
const CONTROL_PLANE_GOGC: &str = "400";

/// How many threads run their Go code at once: one. A CI pass runs about
/// six beds on two cores, so no bed's process gets two anyway, and with two
/// the Go scheduler's idle threads spin looking for work that another
/// process's turn would do. Measured: 31 end-to-end tests (`guard`,
/// `collision_guard`, `fencing`, `disruption_and_audit`, v1.37.2) took 86.1
/// and 86.6 CPU-seconds in all with it against 89.6 and 91.6 without, in
/// the same wall time (set for the whole run; the control plane's four
/// were its only Go processes). A runtime setting like the GC's;
/// the API's behaviour is the same.
const CONTROL_PLANE_GOMAXPROCS: &str = "1";

/// A command for one of the bed's control-plane binaries, with the runtime
/// settings they all run with.
fn control_plane_command(bin: &Path) -> Command {
    let mut cmd = Command::new(bin);
    cmd.env("GOGC", CONTROL_PLANE_GOGC)
        .env("GOMAXPROCS", CONTROL_PLANE_GOMAXPROCS);
    cmd
}

/// A control-plane process's command line, kept to start it again with the
/// same flags (a restart, an upgrade, the seed's save).
#[derive(Clone, Debug)]
struct CommandLine {
    program: PathBuf,
    args: Vec<std::ffi::OsString>,
}

impl CommandLine {
    fn of(cmd: &Command) -> Self {
        Self {
            program: PathBuf::from(cmd.get_program()),
            args: cmd.get_args().map(|a| a.to_os_string()).collect(),
        }
    }

    fn command(&self) -> Command {
        let mut cmd = control_plane_command(&self.program);
        cmd.args(&self.args);
        cmd
    }
}

/// The Service range of every bed without real nodes (a bed with them takes
/// its slot's).
const DEFAULT_SERVICE_CIDR: &str = "10.0.0.0/24";

/// How to start a [`TestBed`].
#[derive(Clone, Debug, Default)]
pub struct TestBedOptions {
    /// Write the apiserver's audit log (metadata level, every request), so a
    /// test can count requests by verb, resource and user.
    pub audit: bool,
    /// With `audit`: only this namespace's pod requests are written, nothing
    /// else, so a bench can time them without paying (in every request's
    /// latency) for the whole cluster's traffic.
    pub audit_namespace: Option<String>,
    /// The Kubernetes version to run; `GRACEGUARD_KUBE` (default: the newest) when `None`.
    pub version: Option<KubeVersion>,
    /// Real nodes (`node-1…`: kubelet, containerd, runc, CNI)
    /// instead of the registered fake node the simulated kubelet serves.
    pub real_nodes: u8,
    /// With real nodes: the API server listens on the bed's network (pods
    /// reach it through the `kubernetes` Service) and kube-proxy runs, so
    /// Services work from pods and from the API server (`scripts/cluster`).
    pub pod_network: bool,
    /// With `pod_network`: the family of every address on the bed's network
    /// (pods, nodes, the API server, Services). [`Family::V6`] makes an IPv6
    /// single-stack cluster, as a user running one has.
    pub ip_family: Family,
    /// Hollow nodes (`hollow-1…`, kubemark's hollow kubelet: see
    /// [`crate::node::hollow`]) beside the real ones; needs `real_nodes` ≥ 1.
    pub hollow_nodes: usize,
    /// The real nodes' kubelet log level (klog `--v`), 1 when `None`; 4
    /// logs each step of its pod workers, which
    /// [`crate::node::kubelet_log`] reads.
    pub kubelet_verbosity: Option<u8>,
}

pub use crate::pods::NODE;

/// The label that opts a namespace out of graceguard's webhooks, as the
/// chart's selectors do; the bed puts it on the system namespaces.
pub const OPT_OUT_LABEL: &str = "graceguard.io/ignore";

/// The common name of the client certificate the bed's API server presents
/// to a webhook that asks for one.
pub const ADMISSION_CLIENT_NAME: &str = "kube-apiserver-admission";

/// The priority classes the bed's API server limits by quota, as GKE does:
/// a pod of one is refused in a namespace without a ResourceQuota whose
/// scope covers it (the chart brings one for its own namespace).
pub const QUOTA_LIMITED_PRIORITY_CLASSES: [&str; 2] =
    ["system-node-critical", "system-cluster-critical"];

/// Writes `admission-config.yaml` into `dir`: both webhook admission plugins
/// read `admission-kubeconfig.yaml`, which gives every webhook (`*`) the
/// client certificate in `pki`; the ResourceQuota plugin limits
/// [`QUOTA_LIMITED_PRIORITY_CLASSES`].
fn write_admission_config(dir: &Path, pki: &Path) -> Result<()> {
    let kubeconfig = dir.join("admission-kubeconfig.yaml");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nusers:\n- name: \"*\"\n  user:\n    client-certificate: {}\n    client-key: {}\n",
            pki.join("admission-client.crt").display(),
            pki.join("admission-client.key").display()
        ),
    )?;
    let plugin = |name: &str| {
        format!(
            "- name: {name}\n  configuration:\n    apiVersion: apiserver.config.k8s.io/v1\n    kind: WebhookAdmissionConfiguration\n    kubeConfigFile: {}\n",
            kubeconfig.display()
        )
    };
    let quota = format!(
        "- name: ResourceQuota\n  configuration:\n    apiVersion: apiserver.config.k8s.io/v1\n    kind: ResourceQuotaConfiguration\n    limitedResources:\n    - resource: pods\n      matchScopes:\n      - scopeName: PriorityClass\n        operator: In\n        values: {:?}\n",
        QUOTA_LIMITED_PRIORITY_CLASSES
    );
    std::fs::write(
        dir.join("admission-config.yaml"),
        format!(
            "apiVersion: apiserver.config.k8s.io/v1\nkind: AdmissionConfiguration\nplugins:\n{}{}{quota}",
            plugin("ValidatingAdmissionWebhook"),
            plugin("MutatingAdmissionWebhook")
        ),
    )?;
    Ok(())
}

/// The RBAC the chart gives graceguard-webhook's service account, applied to
/// user `graceguard` so the bed's webhook runs with exactly that.
pub const WEBHOOK_RULES: &str = r#"[
  {"apiGroups": [""], "resources": ["pods", "namespaces"], "verbs": ["get", "list", "watch"]},
  {"apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch"]},
  {"apiGroups": [""], "resources": ["resourcequotas", "persistentvolumeclaims", "services", "configmaps"], "verbs": ["get", "list", "watch"]},
  {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["get", "list", "watch"]},
  {"apiGroups": ["graceguard.test"], "resources": ["widgets"], "verbs": ["get", "list", "watch"]},
  {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["list", "watch"]}
]"#;

/// What a namespace-level executor account may do (alice, bob): workloads,
/// their pods and evictions, Events, Leases, reading quotas.
const EXECUTOR_RULES: &str = r#"[
  {"apiGroups": ["", "apps", "batch"], "resources": ["pods", "pods/eviction", "pods/log", "configmaps", "persistentvolumeclaims", "services", "deployments", "replicasets", "statefulsets", "jobs"], "verbs": ["*"]},
  {"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["*"]},
  {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["*"]},
  {"apiGroups": [""], "resources": ["resourcequotas", "namespaces"], "verbs": ["get", "list", "watch"]}
]"#;

/// A running control plane. Dropping it stops every process. If the test
/// panicked, the directory with their logs is kept and its path printed.
pub struct TestBed {
    /// Real nodes, when asked for; stopped first.
    pub nodes: Option<crate::node::RealNodes>,
    // Field order is drop order: controllers, then the apiserver, then etcd.
    controllers: Vec<Managed>,
    apiserver: Managed,
    /// How the apiserver was started, for [`TestBed::restart_apiserver`].
    apiserver_cmd: CommandLine,
    apiserver_restarts: u32,
    etcd: Managed,
    dir: Option<TempDir>,
    bins: ControlPlaneBins,
    /// The Kubernetes version running.
    pub version: KubeVersion,
    /// An admin client.
    pub client: Client,
    /// https://ADDRESS:PORT (`[ADDRESS]` for IPv6)
    pub url: String,
    /// A kubeconfig for the admin user (also usable by kubectl).
    pub kubeconfig: PathBuf,
    ns_counter: AtomicU32,
    /// The bed's CA (it signs the API server's, the kubelets' and the
    /// clients' certificates).
    ca: graceguard_certs::Ca,
}

impl TestBed {
    /// Starts a bed with default options.
    pub async fn start() -> Result<Self> {
        Self::start_with(TestBedOptions::default()).await
    }

    /// Starts the control plane of the version `GRACEGUARD_KUBE` names and
    /// waits until it serves. Fails (never skips) with a message naming what
    /// is missing or what the processes logged.
    pub async fn start_with(opts: TestBedOptions) -> Result<Self> {
        graceguard_certs::install_crypto_provider();
        let version = match opts.version {
            Some(v) => v,
            None => KubeVersion::from_env()?,
        };
        let bins = ControlPlaneBins::find(version)?;
        // A slot (bridge, addresses, cgroup names) for real nodes, taken
        // before the API server starts: its Service range and, with a pod
        // network, its address come from it.
        let mut slot = match opts.real_nodes {
            0 => None,
            _ => Some(crate::node::slot::Slot::acquire()?),
        };
        if opts.ip_family == Family::V6 {
            match slot.as_mut() {
                Some(slot) if opts.pod_network => slot.family = Family::V6,
                _ => bail!(
                    "an IPv6 bed is a pod network: ask for real_nodes ≥ 1 and pod_network too"
                ),
            }
        }
        // etcd fsyncs every write; tmpfs keeps that cheap when it exists.
        let dir = match Path::new("/dev/shm").is_dir() {
            true => tempfile::Builder::new()
                .prefix("graceguard-bed-")
                .tempdir_in("/dev/shm"),
            false => tempfile::Builder::new().prefix("graceguard-bed-").tempdir(),
        }
        .context("creating the test bed's directory")?;
        let d = dir.path().to_path_buf();

        let (client_port, peer_port) = (free_port()?, free_port()?);
        let etcd_url = format!("http://127.0.0.1:{client_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let mut cmd = control_plane_command(&bins.etcd);
        cmd.arg("--name=bed")
            .arg(format!("--data-dir={}", d.join("etcd").display()))
            .arg(format!("--listen-client-urls={etcd_url}"))
            .arg(format!("--advertise-client-urls={etcd_url}"))
            .arg(format!("--listen-peer-urls={peer_url}"))
            .arg(format!("--initial-advertise-peer-urls={peer_url}"))
            .arg(format!("--initial-cluster=bed={peer_url}"))
            .arg("--log-level=warn");
        let etcd_cmd = CommandLine::of(&cmd);
        // A bed without real nodes starts from its release's bootstrapped
        // etcd when one has been saved (see `etcd_seed`).
        let seed = slot.is_none().then(|| {
            Seed::of(
                &bins,
                DEFAULT_SERVICE_CIDR,
                &[EXECUTOR_RULES, WEBHOOK_RULES],
            )
        });
        let seeded = match &seed {
            Some(seed) if seed.exists() => {
                seed.copy_to(&d.join("etcd"))?;
                true
            }
            _ => false,
        };
        let etcd = Managed::spawn("etcd", cmd, &d.join("etcd.log"))?;

        // Certificates, service-account key, tokens, audit policy.
        let pki = d.join("pki");
        let ca = graceguard_certs::Ca::new("graceguard-test-bed-ca")?;
        let mut listen: std::net::IpAddr = "127.0.0.1".parse()?;
        let mut service_cidr = DEFAULT_SERVICE_CIDR.to_string();
        let mut serving_ips: Vec<std::net::IpAddr> = vec![listen];
        let mut serving_dns = vec!["localhost".to_string()];
        if let Some(slot) = slot.as_mut() {
            service_cidr = slot.service_cidr();
            if opts.pod_network {
                listen = slot.apiserver_ip();
                crate::node::network::add_local_address(slot, listen)?;
                serving_ips.push(listen);
                serving_ips.push(slot.kubernetes_service_ip());
                for d in [
                    "kubernetes",
                    "kubernetes.default",
                    "kubernetes.default.svc",
                    "kubernetes.default.svc.cluster.local",
                ] {
                    serving_dns.push(d.to_string());
                }
            }
        }
        let serving = ca.issue_server(&serving_dns, &serving_ips)?;
        ca.write_files(&serving, &pki)?;
        // How the API server authenticates to kubelets (logs, exec), and the
        // kubelets' serving certificates it verifies.
        let kubelet_client = ca.issue_client("kube-apiserver-kubelet-client", "system:masters")?;
        std::fs::write(pki.join("kubelet-client.crt"), &kubelet_client.cert_pem)?;
        std::fs::write(pki.join("kubelet-client.key"), &kubelet_client.key_pem)?;
        // How the API server authenticates to webhooks that ask for a client
        // certificate (mutual TLS): its AdmissionConfiguration names a
        // kubeconfig with this certificate for every webhook (`*`).
        let admission_client = ca.issue_client(ADMISSION_CLIENT_NAME, "graceguard-test-bed")?;
        std::fs::write(pki.join("admission-client.crt"), &admission_client.cert_pem)?;
        std::fs::write(pki.join("admission-client.key"), &admission_client.key_pem)?;
        write_admission_config(&d, &pki)?;
        let mut node_creds = Vec::new();
        if let Some(slot) = slot.as_ref() {
            for k in 1..=opts.real_nodes {
                let pair = ca.issue_server(&[format!("node-{k}")], &[slot.node_ip(k)])?;
                let (crt, key) = (
                    pki.join(format!("node-{k}.crt")),
                    pki.join(format!("node-{k}.key")),
                );
                std::fs::write(&crt, &pair.cert_pem)?;
                std::fs::write(&key, &pair.key_pem)?;
                node_creds.push((crt, key));
            }
        }
        let (sa_key, sa_pub) = (pki.join("sa.key"), pki.join("sa.pub"));
        let (private_pem, public_pem) = graceguard_certs::generate::key_pair_pem()?;
        std::fs::write(&sa_key, private_pem)?;
        std::fs::write(&sa_pub, public_pem)?;
        let tokens: String = IDENTITIES
            .iter()
            .map(|i| {
                format!(
                    "{},{},{},\"{}\"\n",
                    token_for(i.key),
                    i.user,
                    i.user,
                    i.groups
                )
            })
            .collect();
        std::fs::write(d.join("tokens.csv"), tokens)?;

        // A port picked free can be taken by another process before
        // kube-apiserver binds it; it then exits at once. Pick another.
        let mut tries = 0;
        let (apiserver, apiserver_cmd, url) = loop {
            tries += 1;
            let port = free_port()?;
            let url = format!("https://{}", std::net::SocketAddr::new(listen, port));
            let path = |p: &Path| p.display().to_string();
            let mut cmd = control_plane_command(&bins.kube_apiserver);
            cmd.arg(format!("--etcd-servers={etcd_url}"))
                .arg(format!("--bind-address={listen}"))
                .arg(format!("--advertise-address={listen}"));
            if listen.is_loopback() {
                // 1.37 refuses a loopback address for the `kubernetes` Service's
                // endpoints; nothing in the bed reaches the API server through it.
                cmd.arg("--endpoint-reconciler-type=none");
            }
            cmd.arg(format!("--secure-port={port}"))
                .arg(format!("--tls-cert-file={}", path(&pki.join("tls.crt"))))
                .arg(format!(
                    "--tls-private-key-file={}",
                    path(&pki.join("tls.key"))
                ))
                .arg(format!("--client-ca-file={}", path(&pki.join("ca.crt"))))
                .arg(format!("--token-auth-file={}", path(&d.join("tokens.csv"))))
                .arg("--authorization-mode=Node,RBAC")
                .arg("--service-account-issuer=https://kubernetes.default.svc")
                .arg(format!("--service-account-key-file={}", path(&sa_pub)))
                .arg(format!(
                    "--service-account-signing-key-file={}",
                    path(&sa_key)
                ))
                .arg(format!("--service-cluster-ip-range={service_cidr}"))
                .arg(format!(
                    "--kubelet-client-certificate={}",
                    path(&pki.join("kubelet-client.crt"))
                ))
                .arg(format!(
                    "--kubelet-client-key={}",
                    path(&pki.join("kubelet-client.key"))
                ))
                .arg(format!(
                    "--kubelet-certificate-authority={}",
                    path(&pki.join("ca.crt"))
                ))
                .arg("--kubelet-preferred-address-types=InternalIP")
                .arg("--enable-admission-plugins=NodeRestriction,ResourceQuota")
                .arg(format!(
                    "--admission-control-config-file={}",
                    path(&d.join("admission-config.yaml"))
                ))
                .arg(format!("--cert-dir={}", path(&pki)))
                .arg("--v=1");
            if opts.audit {
                let rules = match &opts.audit_namespace {
                    Some(ns) => format!(
                        "- level: Metadata\n  namespaces: [\"{ns}\"]\n  resources: [{{group: \"\", resources: [\"pods\", \"pods/status\"]}}]\n- level: None\n"
                    ),
                    None => "- level: Metadata\n".to_string(),
                };
                std::fs::write(
                    d.join("audit-policy.yaml"),
                    format!("apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [\"RequestReceived\"]\nrules:\n{rules}"),
                )?;
                cmd.arg(format!(
                    "--audit-policy-file={}",
                    path(&d.join("audit-policy.yaml"))
                ))
                .arg(format!("--audit-log-path={}", path(&d.join("audit.log"))))
                .arg("--audit-log-mode=blocking");
            }
            let apiserver_cmd = CommandLine::of(&cmd);
            let log = d.join("kube-apiserver.log");
            let mut apiserver = Managed::spawn("kube-apiserver", cmd, &log)?;
            if tries < 5 && lost_its_port(&mut apiserver, listen, port).await {
                continue;
            }
            break (apiserver, apiserver_cmd, url);
        };

        let kubeconfig = d.join("kubeconfig");
        write_kubeconfig(&kubeconfig, &url, &pki.join("ca.crt"), ADMIN.key)?;
        let client = client_from(&kubeconfig).await?;

        let mut bed = Self {
            nodes: None,
            controllers: Vec::new(),
            apiserver,
            apiserver_cmd,
            apiserver_restarts: 0,
            etcd,
            dir: Some(dir),
            bins,
            version,
            client,
            url,
            kubeconfig,
            ns_counter: AtomicU32::new(0),
            ca,
        };
        bed.wait_ready().await?;
        if !seeded {
            bed.apply_rbac().await?;
            if let Some(seed) = &seed {
                bed.save_seed(seed, etcd_cmd).await?;
            }
        }
        if slot.is_none() {
            // The node every bed registers at start, the one task pods are bound to.
            bed.register_node(NODE).await?;
        }
        bed.start_controllers(&sa_key, slot.is_some())?;
        bed.wait_controllers().await?;
        if let Some(slot) = slot {
            let mut creds = Vec::new();
            for (i, (tls_cert, tls_key)) in node_creds.into_iter().enumerate() {
                creds.push(crate::node::NodeCredentials {
                    kubeconfig: bed.kubeconfig_for(&format!("node-{}", i + 1))?,
                    tls_cert,
                    tls_key,
                });
            }
            let dir = bed.dir().join("nodes");
            let mut nodes = crate::node::RealNodes::start(
                slot,
                version,
                &dir,
                &bed.client,
                &bed.ca_file(),
                &creds,
                opts.kubelet_verbosity.unwrap_or(1),
            )
            .await?;
            if opts.pod_network {
                nodes.start_kube_proxy(&bed.kubeconfig_for("kube-proxy")?)?;
            }
            if opts.hollow_nodes > 0 {
                let mut hollow = Vec::new();
                for k in 1..=opts.hollow_nodes {
                    let name = crate::node::hollow::name(k);
                    hollow.push((name.clone(), bed.node_kubeconfig(&name)?));
                }
                nodes.start_hollow(&bed.client, &hollow).await?;
            }
            bed.nodes = Some(nodes);
        } else if opts.hollow_nodes > 0 {
            bail!("hollow nodes run beside real ones: ask for real_nodes ≥ 1 too");
        }
        Ok(bed)
    }

    /// Saves this bed's etcd as `seed`: the API server and etcd stopped
    /// (SIGTERM, so etcd syncs), the data copied, both started again.
    async fn save_seed(&mut self, seed: &Seed, etcd_cmd: CommandLine) -> Result<()> {
        self.apiserver.stop(Duration::from_secs(30));
        if self.etcd.stop(Duration::from_secs(30)).is_none() {
            bail!(
                "etcd did not stop within 30 s of SIGTERM; its log ends:\n{}",
                tail(&self.etcd.log, 10)
            );
        }
        seed.save_from(&self.dir().join("etcd"))?;
        let log = self.dir().join("etcd-1.log");
        self.etcd = Managed::spawn("etcd", etcd_cmd.command(), &log)?;
        self.start_apiserver_again().await
    }

    async fn wait_ready(&mut self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            self.etcd.check_running()?;
            self.apiserver.check_running()?;
            let req = http::Request::get("/readyz").body(Vec::new())?;
            let last = match self.client.request_text(req).await {
                Ok(body) if body.trim() == "ok" => return Ok(()),
                Ok(body) => body,
                Err(e) => e.to_string(),
            };
            if Instant::now() > deadline {
                bail!(
                    "kube-apiserver {} did not become ready in 120 s (last answer: {last}); its log ends:\n{}\netcd's log ends:\n{}",
                    self.version.as_str(),
                    tail(&self.apiserver.log, 25),
                    tail(&self.etcd.log, 10)
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// The bed's own ClusterRoles and bindings: users get the executor role,
    /// `graceguard` the webhook's.
    async fn apply_rbac(&self) -> Result<()> {
        let roles: Api<ClusterRole> = Api::all(self.client.clone());
        let bindings: Api<ClusterRoleBinding> = Api::all(self.client.clone());
        for (name, rules, subject_kind, subject) in [
            (
                "graceguard-testbed:executor",
                EXECUTOR_RULES,
                "Group",
                "testbed:users",
            ),
            (
                "graceguard-testbed:webhook",
                WEBHOOK_RULES,
                "User",
                "graceguard",
            ),
        ] {
            let rules: serde_json::Value = serde_json::from_str(rules)?;
            let role: ClusterRole =
                serde_json::from_value(json!({"metadata": {"name": name}, "rules": rules}))?;
            roles
                .create(&PostParams::default(), &role)
                .await
                .with_context(|| format!("creating ClusterRole {name}"))?;
            let binding: ClusterRoleBinding = serde_json::from_value(json!({
                "metadata": {"name": name},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": subject_kind, "name": subject}],
            }))?;
            bindings
                .create(&PostParams::default(), &binding)
                .await
                .with_context(|| format!("creating ClusterRoleBinding {name}"))?;
        }
        Ok(())
    }

    /// Registers Node `name` the way its kubelet does at boot, as
    /// `system:node:<name>`: 4 CPUs, 8 GiB, 110 pods, Ready. The not-ready
    /// taint that TaintNodesByCondition puts on every new node is then taken
    /// off, as the node lifecycle controller does once the node reports Ready
    /// (that controller does not run in the bed: nothing would heartbeat).
    pub async fn register_node(&self, name: &str) -> Result<()> {
        let nodes: Api<Node> = Api::all(self.client_as(name).await?);
        if nodes.get_opt(name).await?.is_some() {
            return Ok(());
        }
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"}},
            "status": {
                "capacity": {"cpu": "4", "memory": "8Gi", "pods": "110"},
                "allocatable": {"cpu": "4", "memory": "8Gi", "pods": "110"},
                "conditions": [{
                    "type": "Ready", "status": "True", "reason": "KubeletReady",
                    "message": "kubelet is posting ready status",
                    "lastHeartbeatTime": crate::clock::now_rfc3339(),
                    "lastTransitionTime": crate::clock::now_rfc3339(),
                }],
                "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
            },
        }))?;
        nodes
            .create(&PostParams::default(), &node)
            .await
            .with_context(|| format!("registering Node {name} as system:node:{name}"))?;
        // Create does not keep the status a kubelet sends on every version;
        // post it through nodes/status as the kubelet's next update does.
        let status = json!({"status": node.status});
        nodes
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .with_context(|| format!("posting Node {name}'s status as the node"))?;
        Api::<Node>::all(self.client.clone())
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"taints": null}})),
            )
            .await
            .with_context(|| format!("removing the not-ready taint of Node {name}"))?;
        Ok(())
    }

    /// With real nodes the node lifecycle controller runs too: it takes the
    /// not-ready taint off a node whose kubelet reports Ready (and would
    /// taint a registered node nobody heartbeats, so beds with the fake node
    /// leave it out).
    fn start_controllers(&mut self, sa_key: &Path, real_nodes: bool) -> Result<()> {
        let d = self.dir().to_path_buf();
        let (kcm, sched) = (
            self.bins.kube_controller_manager.clone(),
            self.bins.kube_scheduler.clone(),
        );
        let mut kcm_cmd = self.component("controller-manager", &kcm)?;
        // Each controller acts as its own service account, as kubeadm runs it.
        kcm_cmd
            .arg("--use-service-account-credentials=true")
            .arg(format!(
                "--service-account-private-key-file={}",
                sa_key.display()
            ))
            .arg(format!("--root-ca-file={}", self.ca_file().display()))
            .arg(format!(
                "--controllers={}{}",
                CONTROLLERS.join(","),
                // Real pods make Services worth routing: kube-proxy reads
                // EndpointSlices (and users' tools still read Endpoints).
                if real_nodes {
                    ",node-lifecycle-controller,endpointslice-controller,endpoints-controller,daemonset-controller"
                } else {
                    ""
                }
            ));
        let sched_cmd = self.component("scheduler", &sched)?;
        for (name, cmd) in [
            ("kube-controller-manager", kcm_cmd),
            ("kube-scheduler", sched_cmd),
        ] {
            let log = d.join(format!("{name}.log"));
            self.controllers.push(Managed::spawn(name, cmd, &log)?);
        }
        Ok(())
    }

    /// A control-plane component's command with the flags both share: its own
    /// identity's kubeconfig (for its API calls and its delegated
    /// authentication), a loopback port, no leader election.
    fn component(&self, key: &str, bin: &Path) -> Result<Command> {
        let kc = self.kubeconfig_for(key)?;
        let mut cmd = control_plane_command(bin);
        for flag in [
            "kubeconfig",
            "authentication-kubeconfig",
            "authorization-kubeconfig",
        ] {
            cmd.arg(format!("--{flag}={}", kc.display()));
        }
        cmd.arg("--bind-address=127.0.0.1")
            .arg(format!("--secure-port={}", free_port()?))
            .arg(format!(
                "--cert-dir={}",
                self.dir().join(format!("{key}-pki")).display()
            ))
            .arg("--leader-elect=false")
            .arg("--v=1");
        Ok(cmd)
    }

    /// The controller-manager is working once its service-account controller
    /// has created `default/default`.
    async fn wait_controllers(&mut self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            for c in &mut self.controllers {
                c.check_running()?;
            }
            if self.default_service_account("default").await? {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "kube-controller-manager created no default ServiceAccount in 120 s; its log ends:\n{}",
                    tail(&self.controllers[0].log, 25)
                );
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    async fn default_service_account(&self, ns: &str) -> Result<bool> {
        Ok(Api::<ServiceAccount>::namespaced(self.client.clone(), ns)
            .get_opt("default")
            .await?
            .is_some())
    }

    /// Kills kube-apiserver (SIGKILL, as a crashed or rescheduled control
    /// plane node) and calls `while_down` before starting it again with the
    /// same flags, port and etcd; returns once it serves again. Watches and
    /// connections of every client are cut, as in a real restart.
    pub async fn restart_apiserver<F, Fut>(&mut self, while_down: F) -> Result<()>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<()>>,
    {
        self.apiserver.kill();
        while_down().await?;
        self.start_apiserver_again().await
    }

    /// Starts kube-apiserver again from `apiserver_cmd` (same flags, port
    /// and etcd), logging to a new file, and waits until it serves.
    async fn start_apiserver_again(&mut self) -> Result<()> {
        self.apiserver_restarts += 1;
        let cmd = self.apiserver_cmd.command();
        let log = self
            .dir()
            .join(format!("kube-apiserver-{}.log", self.apiserver_restarts));
        self.apiserver = Managed::spawn("kube-apiserver", cmd, &log)?;
        self.wait_ready().await
    }

    /// Upgrades the control plane to `to` as an operator does, one component
    /// at a time: kube-apiserver stopped (SIGTERM, so it drains) and started
    /// from `to`'s binary with the same flags, port and etcd; then
    /// kube-controller-manager and kube-scheduler the same way. Nodes are left
    /// as they are (the kubelet may lag the API server; see
    /// [`crate::node::RealNodes::upgrade_kubelet`]). Returns once the new API
    /// server serves and the new controller-manager works.
    pub async fn upgrade_control_plane(&mut self, to: KubeVersion) -> Result<()> {
        let bins = ControlPlaneBins::find(to)?;
        self.apiserver.stop(Duration::from_secs(30));
        self.apiserver_cmd.program = bins.kube_apiserver.clone();
        self.start_apiserver_again().await?;
        for c in &mut self.controllers {
            c.stop(Duration::from_secs(30));
        }
        self.controllers.clear();
        self.bins = bins;
        self.version = to;
        let sa_key = self.dir().join("pki/sa.key");
        self.start_controllers(&sa_key, self.nodes.is_some())?;
        self.wait_controllers().await
    }

    /// Fails if a control-plane process has exited (with its log's tail).
    pub fn check_running(&mut self) -> Result<()> {
        self.etcd.check_running()?;
        self.apiserver.check_running()?;
        for c in &mut self.controllers {
            c.check_running()?;
        }
        if let Some(n) = self.nodes.as_mut() {
            n.check_running()?;
        }
        Ok(())
    }

    /// The image real nodes run task pods with (Debian's busybox-static, imported
    /// into every node); fails on a bed without real nodes.
    pub fn task_image(&self) -> Result<String> {
        match &self.nodes {
            Some(n) => Ok(n.bins.task_image.clone()),
            None => bail!(
                "this bed has no real nodes: start it with TestBedOptions {{ real_nodes: 1, .. }}"
            ),
        }
    }

    /// The log of real node `node`'s kubelet, as it is now (read with
    /// [`crate::node::kubelet_log`]); fails on a bed without real nodes.
    pub fn kubelet_log(&self, node: &str) -> Result<String> {
        match &self.nodes {
            Some(n) => n.kubelet_log(node),
            None => bail!(
                "this bed has no real nodes: start it with TestBedOptions {{ real_nodes: 1, .. }}"
            ),
        }
    }

    /// Waits (up to 60 s) until every CustomResourceDefinition in `names` is
    /// Established. Watched, not `kubectl wait`: that refuses a CRD whose
    /// status has no conditions yet, the state right after its Create.
    pub async fn crds_established(&self, names: &[&str]) -> Result<()> {
        use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
        use kube::runtime::wait::{await_condition, conditions::is_crd_established};
        let crds: Api<CustomResourceDefinition> = Api::all(self.client.clone());
        for name in names {
            tokio::time::timeout(
                Duration::from_secs(60),
                await_condition(crds.clone(), name, is_crd_established()),
            )
            .await
            .with_context(|| format!("CustomResourceDefinition {name} was not Established within 60 s; see the API server's log"))?
            .with_context(|| format!("watching CustomResourceDefinition {name}"))?;
        }
        Ok(())
    }

    /// A real node joins the running bed (`node-2`, `node-3`, … after those
    /// it started with): a certificate for its address from the bed's CA,
    /// its kubelet acting as `system:node:<name>`, its static pods
    /// `static_pods`. Returns its name once it is Ready.
    pub async fn join_node(
        &mut self,
        static_pods: &[k8s_openapi::api::core::v1::Pod],
    ) -> Result<String> {
        let (k, ip) = match &self.nodes {
            Some(n) => {
                let k = u8::try_from(n.nodes.len() + 1)?;
                (k, n.slot.node_ip(k))
            }
            None => bail!(
                "this bed has no real nodes to join: start it with TestBedOptions {{ real_nodes: 1, .. }}"
            ),
        };
        let name = format!("node-{k}");
        let pair = self.ca.issue_server(std::slice::from_ref(&name), &[ip])?;
        let pki = self.dir().join("pki");
        let (tls_cert, tls_key) = (
            pki.join(format!("{name}.crt")),
            pki.join(format!("{name}.key")),
        );
        std::fs::write(&tls_cert, &pair.cert_pem)?;
        std::fs::write(&tls_key, &pair.key_pem)?;
        let creds = crate::node::NodeCredentials {
            kubeconfig: self.kubeconfig_for(&name)?,
            tls_cert,
            tls_key,
        };
        let (client, client_ca) = (self.client.clone(), self.ca_file());
        let Some(nodes) = self.nodes.as_mut() else {
            bail!("the bed's real nodes are gone");
        };
        nodes
            .join(k, &client, &client_ca, &creds, static_pods)
            .await?;
        Ok(name)
    }

    /// The bed's directory (logs, certificates, kubeconfigs).
    pub fn dir(&self) -> &Path {
        self.dir
            .as_ref()
            .map(TempDir::path)
            .unwrap_or(Path::new("/"))
    }

    /// A client certificate the bed's CA signs, as a cluster CA signs a
    /// kubelet's or the API server's own (their CA is the same here).
    pub fn issue_client(
        &self,
        common_name: &str,
        organization: &str,
    ) -> Result<graceguard_certs::ServingPair> {
        Ok(self.ca.issue_client(common_name, organization)?)
    }

    /// A serving certificate the bed's CA signs, for a server on the bed
    /// (a registry) that its clients trust through [`Self::ca_file`].
    pub fn issue_server(
        &self,
        dns: &[String],
        ips: &[std::net::IpAddr],
    ) -> Result<graceguard_certs::ServingPair> {
        Ok(self.ca.issue_server(dns, ips)?)
    }

    /// The API server's address (`bed.url` without its scheme), for a proxy
    /// in front of it.
    pub fn apiserver_addr(&self) -> Result<std::net::SocketAddr> {
        self.url
            .strip_prefix("https://")
            .unwrap_or(&self.url)
            .parse()
            .with_context(|| {
                format!(
                    "the bed's API server URL {} is not https://ADDRESS:PORT",
                    self.url
                )
            })
    }

    /// The CA that signed the apiserver's certificate.
    pub fn ca_file(&self) -> PathBuf {
        self.dir().join("pki/ca.crt")
    }

    /// A kubeconfig that authenticates as the identity `key` (see [`IDENTITIES`]).
    pub fn kubeconfig_for(&self, key: &str) -> Result<PathBuf> {
        let id = identity(key)?;
        let path = self.dir().join(format!("kubeconfig-{}", id.key));
        write_kubeconfig(&path, &self.url, &self.ca_file(), id.key)?;
        Ok(path)
    }

    /// The API server's own `/metrics` text (its latency SLIs, the webhook
    /// calls it made), read as the admin.
    pub async fn apiserver_metrics(&self) -> Result<String> {
        let req = http::Request::get("/metrics").body(Vec::new())?;
        self.client
            .request_text(req)
            .await
            .context("scraping the API server's /metrics")
    }

    /// A kubeconfig with node `name`'s identity (`system:node:<name>` in
    /// `system:nodes`): a client certificate the bed's CA signs, as a
    /// kubelet's is after its TLS bootstrap.
    pub fn node_kubeconfig(&self, name: &str) -> Result<PathBuf> {
        let pair = self
            .ca
            .issue_client(&format!("system:node:{name}"), "system:nodes")?;
        let pki = self.dir().join("pki");
        let (crt, key) = (
            pki.join(format!("{name}-client.crt")),
            pki.join(format!("{name}-client.key")),
        );
        std::fs::write(&crt, &pair.cert_pem)?;
        std::fs::write(&key, &pair.key_pem)?;
        let path = self.dir().join(format!("kubeconfig-{name}"));
        let cfg = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "bed", "cluster": {"server": self.url, "certificate-authority": self.ca_file()}}],
            "users": [{"name": name, "user": {"client-certificate": crt, "client-key": key}}],
            "contexts": [{"name": "bed", "context": {"cluster": "bed", "user": name}}],
            "current-context": "bed",
        });
        std::fs::write(&path, serde_json::to_vec_pretty(&cfg)?)
            .with_context(|| format!("writing {}", path.display()))?;
        Ok(path)
    }

    /// [`TestBed::kubeconfig_for`] reaching the API server at `url` instead
    /// (a proxy in front of it).
    pub fn kubeconfig_via(&self, key: &str, url: &str) -> Result<PathBuf> {
        let id = identity(key)?;
        let path = self.dir().join(format!(
            "kubeconfig-{}-via-{}",
            id.key,
            url.replace([':', '/'], "_")
        ));
        write_kubeconfig(&path, url, &self.ca_file(), id.key)?;
        Ok(path)
    }

    /// A client that authenticates as the identity `key` (see [`IDENTITIES`]).
    pub async fn client_as(&self, key: &str) -> Result<Client> {
        client_from(&self.kubeconfig_for(key)?).await
    }

    /// A client of the admin impersonating `user` in `groups`, as the API
    /// server sees a ServiceAccount's token (a service account's identity
    /// without minting its token).
    pub async fn client_impersonating(&self, user: &str, groups: &[&str]) -> Result<Client> {
        let mut kc = Kubeconfig::read_from(&self.kubeconfig)
            .with_context(|| format!("reading kubeconfig {}", self.kubeconfig.display()))?;
        for named in &mut kc.auth_infos {
            if let Some(auth) = named.auth_info.as_mut() {
                auth.impersonate = Some(user.to_string());
                auth.impersonate_groups = Some(groups.iter().map(ToString::to_string).collect());
            }
        }
        let mut cfg = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
        cfg.default_retry = false;
        Ok(Client::try_from(cfg)?)
    }

    /// A fresh namespace for one test, `prefix-N`. On 1.37 it returns once the
    /// controller-manager has created its `default` ServiceAccount, which the
    /// ServiceAccount admission plugin needs before any pod can be created.
    pub async fn namespace(&self, prefix: &str) -> Result<String> {
        let n = self.ns_counter.fetch_add(1, Ordering::Relaxed);
        let name = format!("{prefix}-{n}");
        self.namespace_named(&name, false).await?;
        Ok(name)
    }

    /// Creates namespace `name`, opted out of graceguard (the chart's label)
    /// when `opt_out`, and waits for its default ServiceAccount where a
    /// controller makes one.
    pub async fn namespace_named(&self, name: &str, opt_out: bool) -> Result<()> {
        let labels = opt_out.then(|| [(OPT_OUT_LABEL.to_string(), "true".to_string())].into());
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                labels,
                ..Default::default()
            },
            ..Default::default()
        };
        Api::<Namespace>::all(self.client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .with_context(|| format!("creating namespace {name}"))?;
        let deadline = Instant::now() + Duration::from_secs(60);
        while !self.default_service_account(name).await? {
            if Instant::now() > deadline {
                bail!("no default ServiceAccount in namespace {name} after 60 s; is kube-controller-manager's serviceaccount-controller running?");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }

    /// The apiserver's audit log; fails if the bed was started without `audit`.
    pub fn audit_log(&self) -> Result<AuditLog> {
        let path = self.dir().join("audit.log");
        if !path.exists() {
            bail!(
                "no audit log at {}: start the bed with TestBedOptions {{ audit: true }}",
                path.display()
            );
        }
        Ok(AuditLog::new(path))
    }

    /// The kubectl the bed uses (its own minor's).
    pub fn kubectl_path(&self) -> &Path {
        &self.bins.kubectl
    }

    /// Runs kubectl against the bed as the identity `key`; returns (success, stdout, stderr).
    pub fn kubectl(&self, key: &str, args: &[&str]) -> Result<(bool, String, String)> {
        let out = Command::new(&self.bins.kubectl)
            .arg(format!(
                "--kubeconfig={}",
                self.kubeconfig_for(key)?.display()
            ))
            .args(args)
            .output()
            .with_context(|| format!("running {}", self.bins.kubectl.display()))?;
        Ok((
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        ))
    }
}

/// The kube-controller-manager controllers the bed runs.
pub const CONTROLLERS: &[&str] = &[
    "serviceaccount-token-controller",
    "serviceaccount-controller",
    "root-ca-certificate-publisher-controller",
    "namespace-controller",
    "resourcequota-controller",
    "garbage-collector-controller",
    "pod-garbage-collector-controller",
    "taint-eviction-controller",
    "job-controller",
    "replicaset-controller",
    "deployment-controller",
    "statefulset-controller",
    "disruption-controller",
    "persistentvolumeclaim-protection-controller",
];

impl Drop for TestBed {
    fn drop(&mut self) {
        drop(self.nodes.take());
        for c in &mut self.controllers {
            let _ = c.stop(Duration::from_secs(5));
        }
        let _ = self.apiserver.stop(Duration::from_secs(5));
        let _ = self.etcd.stop(Duration::from_secs(5));
        if std::thread::panicking() {
            if let Some(dir) = self.dir.take() {
                let kept = dir.keep();
                eprintln!("test bed logs kept in {}", kept.display());
            }
        }
    }
}

/// The static bearer token of a bed identity.
pub fn token_for(key: &str) -> String {
    format!("graceguard-test-token-{key}")
}

fn write_kubeconfig(path: &Path, url: &str, ca: &Path, key: &str) -> Result<()> {
    let cfg = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "bed", "cluster": {"server": url, "certificate-authority": ca}}],
        "users": [{"name": key, "user": {"token": token_for(key)}}],
        "contexts": [{"name": "bed", "context": {"cluster": "bed", "user": key}}],
        "current-context": "bed",
    });
    std::fs::write(path, serde_json::to_vec_pretty(&cfg)?)
        .with_context(|| format!("writing {}", path.display()))
}

/// A kube client from a kubeconfig file.
pub async fn client_from(kubeconfig: &Path) -> Result<Client> {
    let kc = Kubeconfig::read_from(kubeconfig)
        .with_context(|| format!("reading kubeconfig {}", kubeconfig.display()))?;
    let mut cfg = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
    // Tests assert on the API server's raw answers: kube-rs would otherwise
    // re-send a 429 after its Retry-After by itself (as retry mode intends).
    cfg.default_retry = false;
    Ok(Client::try_from(cfg)?)
}
