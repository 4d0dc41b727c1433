//! `scripts/demo`: replays the graceful-delete collision against a real
//! kube-apiserver and shows what it costs.

use anyhow::Result;
use clap::Parser;
use testbed::kubelet::{Kubelet, KubeletOptions};
use testbed::scenario::{
    graceful_delete_collision, guard_graceful_delete, preemption, CollisionReport, PreemptionReport,
};
use testbed::webhook::{Hook, WebhookProcess};
use testbed::{TestBed, TestBedOptions};

#[derive(Parser)]
#[command(about = "Replay the graceful-delete collision against a real kube-apiserver")]
struct Args {
    /// One JSON object per scenario run on stdout instead of a table.
    #[arg(long)]
    json: bool,
    /// Colliding Creates to issue while the pod is Terminating.
    #[arg(long, default_value_t = 10)]
    creates: u32,
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    if let Err(e) = run(&args).await {
        eprintln!("demo failed: {e:#}");
        std::process::exit(1);
    }
}

async fn run(args: &Args) -> Result<()> {
    eprintln!("starting etcd + kube-apiserver v1.20.2 on loopback...");
    let bed = TestBed::start_with(TestBedOptions { audit: true }).await?;
    let mut reports: Vec<CollisionReport> = Vec::new();

    let ns = bed.namespace("demo-bare").await?;
    eprintln!(
        "mode bare: {} colliding Creates on a Terminating pod, no graceguard",
        args.creates
    );
    reports.push(graceful_delete_collision(&bed, &ns, "bare", args.creates, 100).await?);

    let ns = bed.namespace("demo-graceguard").await?;
    eprintln!(
        "mode graceguard: the same, with graceguard-webhook registered in front of the API server"
    );
    let webhook = WebhookProcess::start(&bed, &[]).await?;
    webhook
        .register(
            &bed,
            &[
                Hook::CollisionGuard,
                Hook::DisruptionTagger,
                Hook::DeletionAudit,
            ],
        )
        .await?;
    let mut guarded = graceful_delete_collision(&bed, &ns, "graceguard", args.creates, 100).await?;
    let n = args.creates as usize + 1;
    guarded.audit_record = webhook
        .wait_records("collision_guard", &ns, testbed::scenario::POD, n)
        .await?
        .into_iter()
        .find(|r| r["decision"] == "deny");
    reports.push(guarded);

    let kubelet = Kubelet::start(&bed, KubeletOptions::default()).await?;
    let ns = bed.namespace("demo-guard").await?;
    eprintln!("mode guard: the task launched by graceguard's guard; its pod is deleted gracefully and stays Terminating for 3 s");
    reports
        .push(guard_graceful_delete(&bed, &kubelet, &ns, std::time::Duration::from_secs(3)).await?);

    eprintln!("preemption: a running pod is marked DisruptionTarget (as kube-scheduler does), then deleted by alice");
    let ns = bed.namespace("demo-preemption").await?;
    let preempted = preemption(&bed, &kubelet, &webhook, &ns).await?;

    if args.json {
        for r in &reports {
            println!("{}", serde_json::to_string(r)?);
        }
        println!("{}", serde_json::to_string(&preempted)?);
    } else {
        print_table(&reports);
        print_preemption(&preempted)?;
    }
    Ok(())
}

fn print_table(reports: &[CollisionReport]) {
    println!(
        "{:<26} {:<11} {:>7} {:>14} {:>9} {:>20} {:>25} {:>15}",
        "scenario",
        "mode",
        "creates",
        "already_exists",
        "forbidden",
        "leaked_quota_charges",
        "creates_while_terminating",
        "attempts_burned"
    );
    for r in reports {
        let burned = r.attempts_burned.map_or("-".to_string(), |b| b.to_string());
        println!(
            "{:<26} {:<11} {:>7} {:>14} {:>9} {:>20} {:>25} {:>15}",
            r.scenario,
            r.mode,
            r.creates,
            r.already_exists,
            r.forbidden,
            r.leaked_quota_charges,
            r.creates_while_terminating,
            burned
        );
    }
    for r in reports {
        if let Some(a) = &r.audit_record {
            println!(
                "\n{} audit record of the first denial (graceguard-webhook stdout):\n{a}",
                r.mode
            );
        }
        println!(
            "\n{} answered: {} {}",
            r.mode, r.first_answer_code, r.first_answer
        );
    }
}

fn print_preemption(p: &PreemptionReport) -> Result<()> {
    println!("\npreemption: $ kubectl get pods -L graceguard.io/disruption");
    print!("{}", p.kubectl_get);
    println!("\ndeletion audit record (graceguard-webhook stdout):");
    println!("{}", serde_json::to_string(&p.deletion_audit)?);
    Ok(())
}
