//! `graceguard-webhook`: the command line.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use graceguard_certs::{Ca, ReloadingResolver};
use tokio::net::TcpListener;

use crate::app::App;
use crate::command::client;
pub use crate::command::CliError;
use crate::confirm::Confirmer;
use crate::connection_life;
use crate::eviction_outcome::EvictionOutcomes;
use crate::fencing::LeaseTerms;
use crate::follow_up::{self, FollowUp};
use crate::kind_index::KindIndexMetrics;
use crate::kind_index::{Allowed, ConfirmSettings, IndexBounds, KindIndexes};
use crate::livelock::LivelockDetector;
use crate::meta_index::MetaIndex;
use crate::metrics::Metrics;
use crate::mode::Mode;
use crate::{limits, logging, server, watchers};

#[derive(Parser)]
#[command(
    name = "graceguard-webhook",
    // The version and the source revision: what a bug report must name.
    version = graceguard_contract::build::VERSION_LINE,
    about = "graceguard's admission webhook"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the admission endpoints (HTTPS) and health/metrics (HTTP).
    Serve(Box<ServeArgs>),
    /// Write a CA and a serving certificate (ca.crt, tls.crt, tls.key) for local use.
    Certs(CertsArgs),
    /// GET a plain-HTTP URL (e.g. http://graceguard:8080/readyz); exit 0 on 200.
    Probe(ProbeArgs),
    /// Dry-run a pod Create through the API server; exit 0 only if graceguard answered it.
    SelfTest(SelfTestArgs),
}

#[derive(Args, Debug)]
struct SelfTestArgs {
    /// A namespace the collision guard covers (not excluded from the webhooks).
    #[arg(long)]
    namespace: String,
    /// kubeconfig to reach the API server; in-cluster config when absent.
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// How long to wait for the API server's answer.
    #[arg(long, default_value = "20s", value_parser = duration)]
    timeout: Duration,
}

#[derive(Args, Debug)]
struct ProbeArgs {
    /// The URL to GET.
    #[arg(long)]
    url: String,
    /// How long to wait for the answer.
    #[arg(long, default_value = "5s", value_parser = duration)]
    timeout: Duration,
}

fn collision_kinds(s: &str) -> Result<Allowed, crate::kind_index::KindsError> {
    Allowed::parse(s)
}

/// A flag's value that cannot be read; each says how to write it.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum ArgError {
    #[error("{0} (write e.g. 500ms, 1s, 2m)")]
    Duration(#[from] humantime::DurationError),
    #[error("{input:?} has no port; {LISTEN_USAGE}")]
    NoPort { input: String },
    #[error("{host:?} in {input:?} is not an IP address; {LISTEN_USAGE}")]
    NotAnIp { host: String, input: String },
    #[error("{port:?} in {input:?} is not a port number; {LISTEN_USAGE}")]
    NotAPort { port: String, input: String },
}

const LISTEN_USAGE: &str = "use IP:PORT, e.g. [::]:8443, 0.0.0.0:8443 or fd00::7:8443";

fn duration(s: &str) -> Result<Duration, ArgError> {
    Ok(humantime::parse_duration(s)?)
}

/// Every flag can also be set by the environment variable named after it.
#[derive(Args, Debug)]
pub struct ServeArgs {
    /// HTTPS address for admission reviews: `IP:PORT`, an IPv6 address with
    /// or without brackets. `[::]` (the default) takes IPv4 and IPv6 alike,
    /// and IPv4 alone where the host has no IPv6.
    #[arg(long, env = "GRACEGUARD_LISTEN", default_value = "[::]:8443", value_parser = listen_addr)]
    pub listen: SocketAddr,
    /// PEM serving certificate (reloaded when the file changes).
    #[arg(long, env = "GRACEGUARD_TLS_CERT")]
    pub tls_cert: PathBuf,
    /// PEM private key of the serving certificate.
    #[arg(long, env = "GRACEGUARD_TLS_KEY")]
    pub tls_key: PathBuf,
    /// PEM CA bundle: when set, only a client presenting a certificate one of
    /// these CAs signed completes the TLS handshake (mutual TLS; the API
    /// server sends one when its AdmissionConfiguration names a kubeconfig
    /// with a client certificate for this webhook). Reloaded when it changes.
    #[arg(long, env = "GRACEGUARD_CLIENT_CA_FILE")]
    pub client_ca_file: Option<PathBuf>,
    /// With --client-ca-file: the client certificate must also carry one of
    /// these names (subject CN or DNS name), comma-separated. Set it when the
    /// CA also signs other clients (a cluster CA signs every kubelet's).
    #[arg(
        long,
        env = "GRACEGUARD_CLIENT_NAMES",
        value_delimiter = ',',
        requires = "client_ca_file"
    )]
    pub client_names: Vec<String>,
    /// Plain-HTTP address for /healthz, /readyz and /metrics (as --listen).
    #[arg(long, env = "GRACEGUARD_HEALTH_LISTEN", default_value = "[::]:8080", value_parser = listen_addr)]
    pub health_listen: SocketAddr,
    /// kubeconfig to reach the API server; in-cluster config when absent.
    #[arg(long, env = "GRACEGUARD_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
    /// How denials are answered: 409 AlreadyExists (conflict), 429 with the
    /// grace left (retry), or 409 first and 429 with growing waits once a
    /// client keeps re-creating the name (adaptive).
    #[arg(long, env = "GRACEGUARD_MODE", value_enum, default_value_t = Mode::Adaptive)]
    pub mode: Mode,
    /// adaptive: denials of a name to one client answered 409 before 429s begin.
    #[arg(long, env = "GRACEGUARD_ADAPTIVE_CONFLICTS", default_value_t = 2)]
    pub adaptive_conflicts: usize,
    /// adaptive: the longest retryAfterSeconds; a client-go call (10 retries)
    /// waits at most 10 times this. Must be shorter than --livelock-window,
    /// which is how long a client waiting out a 429 stays known as looping.
    #[arg(long, env = "GRACEGUARD_MAX_RETRY_AFTER", default_value = "8s", value_parser = duration)]
    pub max_retry_after: Duration,
    /// adaptive: the wait for a holder kept only by finalizers.
    #[arg(long, env = "GRACEGUARD_FINALIZER_RETRY_AFTER", default_value = "5s", value_parser = duration)]
    pub finalizer_retry_after: Duration,
    /// How long a confirmation GET's answer is reused for the same name.
    #[arg(long, env = "GRACEGUARD_CONFIRM_CACHE_TTL", default_value = "1s", value_parser = duration)]
    pub confirm_cache_ttl: Duration,
    /// How long a confirmation GET may take before the Create is allowed.
    #[arg(long, env = "GRACEGUARD_CONFIRM_TIMEOUT", default_value = "1s", value_parser = duration)]
    pub confirm_timeout: Duration,
    /// Denials of one name by one user within the window that name it a livelock.
    #[arg(long, env = "GRACEGUARD_LIVELOCK_THRESHOLD", default_value_t = 5)]
    pub livelock_threshold: usize,
    /// The livelock detector's sliding window.
    #[arg(long, env = "GRACEGUARD_LIVELOCK_WINDOW", default_value = "10s", value_parser = duration)]
    pub livelock_window: Duration,
    /// The API servers' addresses as the admission port sees them (their
    /// hosts', or the proxy's in front of them), comma-separated addresses
    /// or CIDR ranges. The per-client caps below never hold a client from
    /// these (nor one that presents a certificate --client-ca-file
    /// verifies): the API server sends every review from one address, and
    /// under load more at once than any one other client should. Never a
    /// pod network's range: that would exempt every pod.
    #[arg(long, env = "GRACEGUARD_TRUSTED_PEERS", value_delimiter = ',', value_parser = limits::parse_trusted_peer)]
    pub trusted_peers: Vec<ipnet::IpNet>,
    /// Admission connections open at once; at the cap new ones wait in the
    /// kernel's backlog until one closes.
    #[arg(long, env = "GRACEGUARD_MAX_CONNECTIONS", default_value_t = limits::Limits::default().max_connections)]
    pub max_connections: usize,
    /// Admission connections open at once from one client address; one past
    /// it is closed at once (the API server keeps a few).
    #[arg(long, env = "GRACEGUARD_MAX_CONNECTIONS_PER_CLIENT", default_value_t = limits::Limits::default().max_connections_per_client)]
    pub max_connections_per_client: usize,
    /// An admission connection that answered nothing for this long is
    /// closed gracefully (the API server opens another for its next
    /// review); 0 keeps idle connections open.
    #[arg(long, env = "GRACEGUARD_CONNECTION_IDLE_TIMEOUT", default_value = "120s", value_parser = duration)]
    pub connection_idle_timeout: Duration,
    /// An admission connection this old (±10 %) is closed gracefully, so a
    /// client's connections spread again over the replicas; 0: no limit.
    #[arg(long, env = "GRACEGUARD_MAX_CONNECTION_AGE", default_value = "10m", value_parser = duration)]
    pub max_connection_age: Duration,
    /// Admission requests answered at once; past it, 503 at once (the API
    /// server then applies the webhook's failurePolicy).
    #[arg(long, env = "GRACEGUARD_MAX_IN_FLIGHT", default_value_t = limits::Limits::default().max_in_flight)]
    pub max_in_flight: usize,
    /// Admission requests answered at once from one client address; past it,
    /// 503 at once (one flooding address leaves the rest to the API server).
    #[arg(long, env = "GRACEGUARD_MAX_IN_FLIGHT_PER_CLIENT", default_value_t = limits::Limits::default().max_in_flight_per_client)]
    pub max_in_flight_per_client: usize,
    /// Largest admission request body accepted.
    #[arg(long, env = "GRACEGUARD_MAX_BODY_BYTES", default_value_t = limits::Limits::default().max_body_bytes)]
    pub max_body_bytes: usize,
    /// Body bytes of all admission requests in flight together; a request
    /// whose body does not fit in what is left is answered 503 at once.
    #[arg(long, env = "GRACEGUARD_MAX_BODY_BYTES_IN_FLIGHT", default_value_t = limits::Limits::default().max_body_bytes_in_flight)]
    pub max_body_bytes_in_flight: usize,
    /// Body bytes of the admission requests in flight from one client address.
    #[arg(long, env = "GRACEGUARD_MAX_BODY_BYTES_IN_FLIGHT_PER_CLIENT", default_value_t = limits::Limits::default().max_body_bytes_in_flight_per_client)]
    pub max_body_bytes_in_flight_per_client: usize,
    /// How long a client may take to send a request's whole body (408 after).
    #[arg(long, env = "GRACEGUARD_BODY_TIMEOUT", default_value = "5s", value_parser = duration)]
    pub body_timeout: Duration,
    /// How often the certificate files are checked for changes.
    #[arg(long, env = "GRACEGUARD_CERT_RELOAD_INTERVAL", default_value = "5s", value_parser = duration)]
    pub cert_reload_interval: Duration,
    /// After SIGTERM, how long to keep serving with /readyz failing, so the
    /// Service's endpoints drop this pod before it stops accepting.
    #[arg(long, env = "GRACEGUARD_SHUTDOWN_DELAY", default_value = "5s", value_parser = duration)]
    pub shutdown_delay: Duration,
    /// Which other kinds the collision guard indexes when a ResourceQuota
    /// counts them: `resource[.group]` separated by commas
    /// (`persistentvolumeclaims,jobs.batch`), `*` for any namespaced kind, or
    /// empty for pods only. Needs RBAC get/list/watch on those kinds and on
    /// resourcequotas.
    #[arg(long, env = "GRACEGUARD_COLLISION_KINDS", default_value = "", value_parser = collision_kinds)]
    pub collision_kinds: Allowed,
    /// Objects per page when a kind's index lists (metadata lists still
    /// carry annotations and managedFields: small pages keep the peak small).
    #[arg(long, env = "GRACEGUARD_KIND_PAGE_SIZE", default_value_t = IndexBounds::default().page_size)]
    pub kind_page_size: u32,
    /// Objects one kind's index may hold; past it the index is dropped and
    /// that kind's Creates are allowed unchecked (metric
    /// graceguard_kind_index_over_cap, a log line) until a re-list fits.
    #[arg(long, env = "GRACEGUARD_KIND_INDEX_MAX_OBJECTS", default_value_t = IndexBounds::default().max_objects)]
    pub kind_index_max_objects: usize,
    /// How long a kind's index stays over --kind-index-max-objects before
    /// it lists again, to answer again once the kind fits.
    #[arg(long, env = "GRACEGUARD_KIND_INDEX_RELIST_OVER_CAP", default_value = "5m", value_parser = duration)]
    pub kind_index_relist_over_cap: Duration,
    /// Pods per page of the pod index's initial list when it lists in pages.
    /// Larger pages mean fewer round trips at start (150,000 pods: 300 pages
    /// of 500); the pod index keeps metadata only, so the peak grows little.
    #[arg(long, env = "GRACEGUARD_POD_LIST_PAGE_SIZE", default_value_t = crate::watchers::PodList::default().page_size)]
    pub pod_list_page_size: u32,
    /// Fill the pod index with a streaming list (a watch with
    /// sendInitialEvents, Kubernetes' WatchList) where the API server serves
    /// one; a server that refuses it is listed in pages. Ready still means
    /// the whole list arrived.
    #[arg(long, env = "GRACEGUARD_POD_LIST_STREAMING", default_value_t = crate::watchers::PodList::default().streaming, action = clap::ArgAction::Set)]
    pub pod_list_streaming: bool,
    /// Tag pods afterwards, under graceguard's own identity, where a tag cannot
    /// go into the request itself: a node's status update (NodeRestriction
    /// refuses changed labels) and an eviction's condition (written outside
    /// admission). Needs RBAC `patch` on pods/status; off keeps graceguard read-only.
    #[arg(long, env = "GRACEGUARD_FOLLOW_UP_TAGGING", default_value_t = true, action = clap::ArgAction::Set)]
    pub follow_up_tagging: bool,
    /// Refuse a pod Create sent by a guard process under an instance Lease
    /// term that is over (its `graceguard.io/fencing-token`): the late write
    /// of a process that lost its Lease. Needs RBAC `list`/`watch` on
    /// `coordination.k8s.io` leases; what cannot be told is allowed.
    #[arg(long, env = "GRACEGUARD_FENCING", default_value_t = true, action = clap::ArgAction::Set)]
    pub fencing: bool,
    /// Whether /readyz also fails while a watch is broken (true), or only until
    /// the indexes have first synced (false: use it with failurePolicy Fail,
    /// where an unready webhook refuses every pod Create; a stale index only
    /// ever allows).
    #[arg(long, env = "GRACEGUARD_READINESS_TRACKS_WATCH", default_value_t = true, action = clap::ArgAction::Set)]
    pub readiness_tracks_watch: bool,
    /// How long in-flight reviews may take to finish after SIGTERM.
    #[arg(long, env = "GRACEGUARD_SHUTDOWN_GRACE", default_value = "20s", value_parser = duration)]
    pub shutdown_grace: Duration,
}

#[derive(Args, Debug)]
struct CertsArgs {
    /// Directory to write ca.crt, tls.crt and tls.key into.
    #[arg(long)]
    out: PathBuf,
    /// DNS names for the serving certificate (repeatable).
    #[arg(long = "dns")]
    dns: Vec<String>,
    /// IP addresses for the serving certificate (repeatable).
    #[arg(long = "ip")]
    ip: Vec<IpAddr>,
}

/// Runs the command line; returns the process exit code.
pub fn main() -> i32 {
    let cli = Cli::parse();
    // Flushes the log writer when main returns.
    let log = logging::init();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("graceguard-webhook: cannot start the async runtime: {e}");
            return 1;
        }
    };
    let res = rt.block_on(async {
        match cli.command {
            Command::Serve(args) => serve(*args, Some(log.dropped.clone())).await,
            Command::Certs(args) => certs(args),
            Command::SelfTest(args) => {
                crate::self_test::run(args.kubeconfig.as_deref(), &args.namespace, args.timeout)
                    .await
                    .map(|warning| println!("ok: {warning}"))
            }
            Command::Probe(args) => crate::probe::probe(&args.url, args.timeout)
                .await
                .map(|body| {
                    println!("{}: {}", args.url, body.trim());
                })
                .map_err(CliError::from),
        }
    });
    match res {
        Ok(()) => 0,
        Err(e) => {
            tracing::error!(error = %e, "graceguard-webhook failed");
            eprintln!("graceguard-webhook: {e}");
            i32::from(e.exit_code())
        }
    }
}

fn certs(args: CertsArgs) -> Result<(), CliError> {
    if args.dns.is_empty() && args.ip.is_empty() {
        return Err(CliError::NoCertificateNames);
    }
    let cfg = |source| CliError::Certificate {
        what: "writing the certificates",
        source,
    };
    let ca = Ca::new("graceguard-ca").map_err(cfg)?;
    let pair = ca.issue_server(&args.dns, &args.ip).map_err(cfg)?;
    ca.write_files(&pair, &args.out).map_err(cfg)?;
    println!(
        "wrote {0}/ca.crt, {0}/tls.crt and {0}/tls.key",
        args.out.display()
    );
    Ok(())
}

/// The numbers of mode `adaptive`, checked: waits in whole seconds, at least
/// one, and shorter than the livelock window (a longer wait would end the
/// client's streak, and its next retry would get a 409 again).
fn adaptive_settings(args: &ServeArgs) -> Result<crate::collision::Adaptive, CliError> {
    let secs = |given: Duration, flag: &'static str| -> Result<u32, CliError> {
        let s = u32::try_from(given.as_secs()).unwrap_or(u32::MAX);
        if s == 0 {
            return Err(CliError::UnderOneSecond { flag, given });
        }
        Ok(s)
    };
    let max = secs(args.max_retry_after, "--max-retry-after")?;
    if args.max_retry_after >= args.livelock_window {
        return Err(CliError::RetryAfterNotUnderWindow {
            max: args.max_retry_after,
            window: args.livelock_window,
        });
    }
    Ok(crate::collision::Adaptive {
        conflicts_first: args.adaptive_conflicts,
        max_retry_after: max,
        finalizer_retry_after: secs(args.finalizer_retry_after, "--finalizer-retry-after")?,
    })
}

/// A listen address: `IP:PORT`, an IPv6 address in brackets or not
/// (`[::]:8443`, or `fd00::7:8443` as `$(POD_IP):8443` gives on an IPv6 pod
/// network).
pub fn listen_addr(s: &str) -> Result<SocketAddr, ArgError> {
    if let Ok(addr) = s.parse::<SocketAddr>() {
        return Ok(addr);
    }
    let (host, port) = s.rsplit_once(':').ok_or_else(|| ArgError::NoPort {
        input: s.to_string(),
    })?;
    let ip: std::net::IpAddr = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse()
        .map_err(|_| ArgError::NotAnIp {
            host: host.to_string(),
            input: s.to_string(),
        })?;
    let port: u16 = port.parse().map_err(|_| ArgError::NotAPort {
        port: port.to_string(),
        input: s.to_string(),
    })?;
    Ok(SocketAddr::new(ip, port))
}

/// Binds `addr` ([`server::bind`]), naming the flag when it cannot.
async fn bind(addr: SocketAddr, what: &'static str) -> Result<TcpListener, CliError> {
    server::bind(addr)
        .await
        .map_err(|source| CliError::Bind { addr, what, source })
}

/// The other kinds' indexes, driven by a ResourceQuota watch; `None` when
/// `--collision-kinds` is empty.
fn kind_indexes(
    client: &kube::Client,
    args: &ServeArgs,
    metrics: &KindIndexMetrics,
) -> Option<Arc<KindIndexes>> {
    if args.collision_kinds == Allowed::Only(Default::default()) {
        return None;
    }
    let kinds = Arc::new(KindIndexes::new(
        client.clone(),
        args.collision_kinds.clone(),
        ConfirmSettings {
            timeout: args.confirm_timeout,
            ttl: args.confirm_cache_ttl,
        },
        IndexBounds {
            page_size: args.kind_page_size,
            max_objects: args.kind_index_max_objects,
            relist_over_cap: args.kind_index_relist_over_cap,
        },
        metrics.clone(),
    ));
    // Runs for the life of the process.
    drop(Arc::clone(&kinds).spawn());
    Some(kinds)
}

/// Runs the webhook until SIGTERM or SIGINT. `log_dropped` counts the audit
/// records the log writer dropped (exported as a metric).
pub async fn serve(
    args: ServeArgs,
    log_dropped: Option<tracing_appender::non_blocking::ErrorCounter>,
) -> Result<(), CliError> {
    graceguard_certs::install_crypto_provider();
    let resolver =
        ReloadingResolver::from_files(&args.tls_cert, &args.tls_key).map_err(|source| {
            CliError::Certificate {
                what: "serving certificate",
                source,
            }
        })?;
    let client_auth = match &args.client_ca_file {
        None => None,
        Some(path) => Some(
            graceguard_certs::ClientAuth::from_file(path, args.client_names.clone()).map_err(
                |source| CliError::Certificate {
                    what: "--client-ca-file",
                    source,
                },
            )?,
        ),
    };
    let tls = graceguard_certs::server_config(
        resolver.clone(),
        client_auth
            .clone()
            .map(|a| a as Arc<dyn rustls::server::danger::ClientCertVerifier>),
    )
    .map_err(|source| CliError::Certificate {
        what: "the TLS configuration",
        source,
    })?;
    let client = client(args.kubeconfig.as_deref()).await?;

    let adaptive = adaptive_settings(&args)?;
    let limits = limits::Limits {
        max_connections: args.max_connections,
        max_connections_per_client: args.max_connections_per_client,
        max_in_flight: args.max_in_flight,
        max_in_flight_per_client: args.max_in_flight_per_client,
        max_body_bytes: args.max_body_bytes,
        max_body_bytes_in_flight: args.max_body_bytes_in_flight,
        max_body_bytes_in_flight_per_client: args.max_body_bytes_in_flight_per_client,
        body_timeout: args.body_timeout,
    };
    limits.check()?;
    let (metrics, registry) = Metrics::new();
    let namespaces = Arc::new(MetaIndex::new("namespaces"));
    let follow_up = if args.follow_up_tagging {
        FollowUp::spawn(
            client.clone(),
            metrics.follow_up.clone(),
            follow_up::Settings::default(),
            Arc::clone(&namespaces),
        )
    } else {
        FollowUp::disabled()
    };
    let evictions = EvictionOutcomes::new(
        Some(client.clone()),
        follow_up.clone(),
        metrics.evictions.clone(),
    );
    let _sweeper = evictions.spawn_sweeper();
    let app = Arc::new(App {
        pods: Arc::new(MetaIndex::new("pods")),
        namespaces,
        confirmer: Confirmer::live(
            client.clone(),
            args.confirm_timeout,
            args.confirm_cache_ttl,
            metrics.confirm.clone(),
        ),
        livelock: LivelockDetector::new(args.livelock_window, args.livelock_threshold),
        metrics: metrics.clone(),
        follow_up: follow_up.clone(),
        evictions: evictions.clone(),
        kinds: kind_indexes(&client, &args, &metrics.kinds),
        log_dropped,
        certificate: Some(resolver.clone()),
        mode: args.mode,
        adaptive,
        readiness_tracks_watch: args.readiness_tracks_watch,
        shutting_down: AtomicBool::new(false),
        knows_api_server: client_auth.is_some() || !args.trusted_peers.is_empty(),
        leases: args.fencing.then(|| LeaseTerms::spawn(client.clone())),
    });
    watchers::spawn_watchers(
        client,
        app.confirmer.clone(),
        evictions,
        Arc::clone(&app.pods),
        Arc::clone(&app.namespaces),
        metrics.pod_index,
        watchers::PodList {
            page_size: args.pod_list_page_size.max(1),
            streaming: args.pod_list_streaming,
        },
    );

    let tls_listener = bind(args.listen, "--listen").await?;
    let health_listener = bind(args.health_listen, "--health-listen").await?;
    let _poller = resolver.spawn_poller(args.cert_reload_interval);
    let _client_ca_poller = client_auth
        .as_ref()
        .map(|a| a.spawn_poller(args.cert_reload_interval));
    tracing::info!(
        listen = %args.listen,
        health_listen = %args.health_listen,
        mode = args.mode.as_str(),
        client_certificates = if client_auth.is_some() { "required" } else { "not asked for" },
        trusted_peers = %args.trusted_peers.iter().map(ToString::to_string).collect::<Vec<_>>().join(","),
        "graceguard-webhook serving"
    );

    let (stop_tls, stop_tls_rx) = tokio::sync::watch::channel(false);
    let (stop_health, stop_health_rx) = tokio::sync::watch::channel(false);
    let health = tokio::spawn(server::serve_plain(
        health_listener,
        server::health_router(Arc::clone(&app), registry),
        stop_health_rx,
        server::Connections::new(
            connection_life::Lifetime {
                idle: args.connection_idle_timeout,
                max_age: Duration::ZERO,
            },
            &app.metrics.connections,
        ),
    ));
    let per_client = limits::PerClient::new(
        limits.max_connections_per_client,
        limits::TrustedPeers::new(args.trusted_peers.clone()),
        &app.metrics.limits,
    );
    let admission_connections = server::Connections::new(
        connection_life::Lifetime {
            idle: args.connection_idle_timeout,
            max_age: args.max_connection_age,
        },
        &app.metrics.connections,
    );
    let admission = tokio::spawn(server::serve_tls(
        tls_listener,
        Arc::new(tls),
        server::admission_router(Arc::clone(&app), &limits),
        stop_tls_rx,
        args.shutdown_grace,
        limits.max_connections,
        per_client,
        admission_connections.clone(),
    ));

    wait_for_signal().await?;
    tracing::info!(delay = ?args.shutdown_delay, "shutdown requested; readiness off, still serving during the delay, each HTTP/1 answer asking its client to close the connection");
    app.shutting_down.store(true, Ordering::Release);
    admission_connections.begin_draining();
    tokio::time::sleep(args.shutdown_delay).await;
    let _ = stop_tls.send(true);
    let _ = admission.await;
    // No review comes in now: what is still pending is recorded, not lost silently.
    let attempts_dropped = app.evictions.stop();
    let follow_ups_dropped = app.follow_up.stop();
    let _ = stop_health.send(true);
    let _ = health.await;
    tracing::info!(
        eviction_attempts_dropped = attempts_dropped,
        follow_ups_dropped,
        "graceguard-webhook stopped"
    );
    Ok(())
}

async fn wait_for_signal() -> Result<(), CliError> {
    let stop = graceguard_contract::stop::signal_to_stop().map_err(CliError::Signal)?;
    let signal = stop.await;
    tracing::info!(signal = signal.name(), "stopping");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::listen_addr;

    #[test]
    fn version_names_the_release_and_the_source_revision() {
        use clap::CommandFactory;
        let v = super::Cli::command().render_version();
        let want = format!(
            "graceguard-webhook {} (revision {})",
            env!("CARGO_PKG_VERSION"),
            graceguard_contract::build::REVISION
        );
        assert_eq!(v.trim(), want);
    }

    #[test]
    fn a_listen_address_may_be_an_ipv6_pod_ip_without_brackets() {
        let ok = |s: &str| listen_addr(s).map(|a| a.to_string());
        assert_eq!(ok("[::]:8443").as_deref(), Ok("[::]:8443"));
        assert_eq!(ok("0.0.0.0:8443").as_deref(), Ok("0.0.0.0:8443"));
        // $(POD_IP):8443 on an IPv6 pod network.
        assert_eq!(ok("fd00::7:8443").as_deref(), Ok("[fd00::7]:8443"));
        assert_eq!(ok("10.1.2.3:8080").as_deref(), Ok("10.1.2.3:8080"));
        for bad in ["8443", "pod:8443", "[::]:http", "10.1.2.3"] {
            let e = listen_addr(bad).expect_err(bad);
            assert!(e.to_string().contains("IP:PORT"), "{bad}: {e}");
        }
    }
}
