//! `scripts/bench`: what graceguard costs, measured against baselines run in
//! the same process, on the same machine, at the same time.
//!
//! stdout: one JSON object per measurement (field `group`); stderr: a table.

mod contract;
mod groups;
mod prelude;
mod report;

use clap::{Parser, Subcommand};
use prelude::*;

#[derive(Parser)]
#[command(
    name = "graceguard-bench",
    about = "Measure graceguard against same-run baselines"
)]
pub(crate) struct Args {
    #[command(subcommand)]
    pub(crate) helper: Option<Helper>,
    /// Small sizes, for scripts/test (well under 2 minutes).
    #[arg(long)]
    pub(crate) quick: bool,
    /// Accepted for symmetry with scripts/demo; stdout is always JSON lines.
    #[arg(long)]
    pub(crate) json: bool,
    /// Pods in the webhook's index (created in the real API server).
    #[arg(long)]
    pub(crate) pods: Option<usize>,
    /// Pods created per side for the API-server overhead.
    #[arg(long)]
    pub(crate) api_pods: Option<usize>,
    /// Pods fed synthetically into an index for the memory figure.
    #[arg(long)]
    pub(crate) synthetic_pods: Option<usize>,
    /// Only these groups (comma-separated): webhook (index memory,
    /// saturation, fixed rate), apiserver_overhead, livelock_storm,
    /// guard_recovery, tag_delay, kind_index_memory, kind_index_peak, match_conditions_share,
    /// index_memory_scale, sidecar_scale, sidecar_rss, executor_storm,
    /// cluster_churn, preemption_trace, relaunch_delay.
    #[arg(long, value_delimiter = ',')]
    pub(crate) only: Vec<String>,
    /// Hollow nodes of cluster_churn (50; 3 with --quick).
    #[arg(long)]
    pub(crate) hollow_nodes: Option<usize>,
    /// Seconds of each cluster_churn phase (60; 14 with --quick, so that each
    /// arm's one drain, its pods settled first, ends within its phase on a
    /// loaded CI machine).
    #[arg(long)]
    pub(crate) churn_seconds: Option<f64>,
    /// Times each cluster_churn phase runs (3; 1 with --quick).
    #[arg(long)]
    pub(crate) churn_repetitions: Option<usize>,
    /// Preemptions per phase and repetition of preemption_trace, one per
    /// phase a round, the phases interleaved (12; 1 with --quick).
    #[arg(long)]
    pub(crate) preemptions: Option<usize>,
    /// Repetitions of preemption_trace, each judged on its own (3; 1 with --quick).
    #[arg(long)]
    pub(crate) preemption_repetitions: Option<usize>,
    /// Drains of the real node per preemption_trace phase and repetition,
    /// after its preemptions (3; 1 with --quick).
    #[arg(long)]
    pub(crate) preemption_drains: Option<usize>,
    /// Real pods in the API server when a webhook starts, for its start-to-ready
    /// time and memory (150,000, Kubernetes' documented per-cluster limit;
    /// 1,000 with --quick).
    #[arg(long)]
    pub(crate) scale_pods: Option<usize>,
    /// Concurrent tasks in one sidecar for sidecar_scale (1,000; 50 with --quick).
    #[arg(long)]
    pub(crate) scale_tasks: Option<usize>,
    /// Seconds per load-generator run.
    #[arg(long)]
    pub(crate) seconds: Option<f64>,
    /// Seconds of the livelock storm.
    #[arg(long)]
    pub(crate) storm_seconds: Option<f64>,
    /// Connections of the load generator.
    #[arg(long, default_value_t = 4)]
    pub(crate) connections: usize,
    /// Reviews per second of the fixed-rate run.
    #[arg(long, default_value_t = 2000)]
    pub(crate) rate: u32,
}

#[derive(Subcommand)]
enum Helper {
    /// (internal) the baseline HTTPS server.
    BaselineServer {
        #[arg(long)]
        listen: SocketAddr,
        #[arg(long)]
        cert: PathBuf,
        #[arg(long)]
        key: PathBuf,
        /// Answer the tagger's path with the tags in admission.
        #[arg(long)]
        tag_inline: bool,
    },
    /// (internal) build a pod index of N synthetic pods and print this process's RSS.
    SyntheticIndex {
        #[arg(long)]
        pods: usize,
    },
    /// Check a run's stdout (FILE) against what the bench promises to print
    /// ([`contract`]): every group measured, each row of its typed shape.
    /// Exits 1 naming every broken promise.
    Check { file: PathBuf },
}

pub(crate) struct Sizes {
    pub(crate) pods: usize,
    pub(crate) api_pods: usize,
    pub(crate) synthetic: usize,
    pub(crate) seconds: f64,
    pub(crate) storm: f64,
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let res = match &args.helper {
        Some(Helper::BaselineServer {
            listen,
            cert,
            key,
            tag_inline,
        }) => loadgen::serve_baseline(*listen, cert, key, *tag_inline).await,
        Some(Helper::SyntheticIndex { pods }) => groups::webhook::synthetic_index(*pods),
        Some(Helper::Check { file }) => check(file),
        None => run(&args).await,
    };
    if let Err(e) = res {
        eprintln!("bench failed: {e:#}");
        std::process::exit(1);
    }
}

/// `graceguard-bench check FILE`.
fn check(file: &std::path::Path) -> Result<()> {
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("reading the bench's output {}", file.display()))?;
    let problems = match contract::read(&text) {
        Ok(rows) => contract::check(&rows),
        Err(unreadable) => unreadable,
    };
    if problems.is_empty() {
        eprintln!(
            "the bench's output keeps every promise ({})",
            file.display()
        );
        return Ok(());
    }
    for p in &problems {
        eprintln!("error: scripts/bench printed {p}");
    }
    bail!(
        "{} broken promise(s) in {}; see bench/src/contract.rs for what each group must print",
        problems.len(),
        file.display()
    )
}

async fn run(args: &Args) -> Result<()> {
    graceguard_certs::install_crypto_provider();
    let q = args.quick;
    let s = Sizes {
        pods: args.pods.unwrap_or(if q { 500 } else { 10_000 }),
        api_pods: args.api_pods.unwrap_or(if q { 50 } else { 500 }),
        synthetic: args
            .synthetic_pods
            .unwrap_or(if q { 10_000 } else { 100_000 }),
        seconds: args.seconds.unwrap_or(if q { 2.0 } else { 10.0 }),
        storm: args.storm_seconds.unwrap_or(if q { 2.0 } else { 10.0 }),
    };
    let started = Instant::now();
    table(format!(
        "graceguard bench ({}): {} indexed pods, {} API pods per side, {} s per load run; {} cores",
        if q { "quick" } else { "full" },
        s.pods,
        s.api_pods,
        s.seconds,
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(0)
    ));

    let wanted = |g: &str| args.only.is_empty() || args.only.iter().any(|o| o == g);
    if ["webhook", "apiserver_overhead", "livelock_storm"]
        .iter()
        .any(|g| wanted(g))
    {
        let bed = TestBed::start().await?;
        let webhook = WebhookProcess::start(&bed, &[]).await?;
        if wanted("webhook") {
            groups::webhook::memory_and_throughput(args, &s, &bed, &webhook).await?;
        }
        webhook.register(&bed, &[Hook::CollisionGuard]).await?;
        if wanted("apiserver_overhead") {
            groups::apiserver_overhead::apiserver_overhead(&s, &bed, &webhook).await?;
        }
        if wanted("livelock_storm") {
            groups::livelock_storm::livelock_storm(&s, &bed, &webhook).await?;
        }
    }
    if wanted("guard_recovery") {
        groups::guard_recovery::guard_recovery().await?;
    }
    if wanted("tag_delay") {
        groups::tag_delay::tag_delay(if q { 5 } else { 20 }).await?;
    }
    if wanted("kind_index_memory") {
        groups::kind_index_memory::kind_index_memory(if q { 100 } else { 2000 }).await?;
    }
    if wanted("kind_index_peak") {
        groups::kind_index_peak::kind_index_peak(if q { 1000 } else { 20_000 }).await?;
    }
    if wanted("match_conditions_share") {
        groups::match_conditions_share::match_conditions_share(if q { 10 } else { 100 }).await?;
    }
    if wanted("index_memory_scale") {
        groups::index_memory_scale::index_memory_at_scale(args.scale_pods.unwrap_or(if q {
            1000
        } else {
            150_000
        }))
        .await?;
    }
    if wanted("sidecar_scale") {
        groups::sidecar_scale::sidecar_scale(args.scale_tasks.unwrap_or(if q { 50 } else { 1000 }))
            .await?;
    }
    if wanted("sidecar_rss") {
        for events in [false, true] {
            groups::sidecar_rss::sidecar_rss(if q { 300 } else { 10_000 }, events).await?;
        }
    }
    if wanted("executor_storm") {
        groups::executor_storm::executor_storm(q).await?;
    }
    if wanted("relaunch_delay") {
        groups::relaunch_delay::relaunch_delay(q).await?;
    }
    if wanted("cluster_churn") {
        groups::cluster_churn::cluster_churn(args).await?;
    }
    if wanted("preemption_trace") {
        groups::preemption_trace::preemption_trace(args).await?;
    }
    table(format!("done in {:.0} s", started.elapsed().as_secs_f64()));
    Ok(())
}
