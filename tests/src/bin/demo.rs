//! `scripts/demo`: replays the graceful-delete collision against a real
//! control plane and shows what it costs; also a real scheduler
//! preemption (the Flyte seed among them) and a real `kubectl drain`.

use anyhow::Result;
use clap::Parser;
use scenarios::disruptions::{drain, drain_node, scheduler_preemption, DrainReport, Kubelets};
use scenarios::scenario::{
    flyte_seed_naive, graceful_delete_collision, guard_graceful_delete, preemption, pvc_collision,
    CollisionReport, Disruption, PreemptionReport, PvcReport,
};
use testbed::kubelet::{Kubelet, KubeletOptions};
use testbed::webhook::{Hook, WebhookProcess, ALL_HOOKS};
use testbed::{KubeVersion, TestBed, TestBedOptions};

#[derive(Parser)]
#[command(about = "Replay the graceful-delete collision against a real kube-apiserver")]
struct Args {
    /// One JSON object per scenario run on stdout instead of a table.
    #[arg(long)]
    json: bool,
    /// Colliding Creates to issue while the pod is Terminating.
    #[arg(long, default_value_t = 10)]
    creates: u32,
    /// The Kubernetes minor to run on, one of tests/kube/versions (1.30
    /// through 1.37); the newest by default.
    #[arg(long, env = "GRACEGUARD_KUBE", default_value_t = KubeVersion::newest(), value_parser = kube_version)]
    kube: KubeVersion,
    /// Who runs the disruption scenarios' pods (the Flyte seed in all three
    /// modes, and the drain): `real` nodes (kubelet, containerd, runc; the
    /// default) or the `simulated` kubelet. The other scenarios use the
    /// simulated one. Every JSON object says which ran it (`kubelet`).
    #[arg(long, value_parser = ["real", "simulated"])]
    kubelet: Option<String>,
}

fn kube_version(s: &str) -> Result<KubeVersion, String> {
    KubeVersion::parse(s).map_err(|e| e.to_string())
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
    let version = args.kube.as_str();
    eprintln!("starting a control plane on loopback: Kubernetes {version}...");
    let bed = TestBed::start_with(TestBedOptions {
        audit: true,
        version: Some(args.kube),
        ..Default::default()
    })
    .await?;
    let mut reports: Vec<CollisionReport> = Vec::new();
    let kubelet = Kubelet::start(&bed, KubeletOptions::default()).await?;
    let simulated = Kubelets::Simulated(&kubelet);
    let real = args.kubelet.as_deref() != Some("simulated");

    let ns = bed.namespace("demo-bare").await?;
    eprintln!(
        "mode bare: {} colliding Creates on a Terminating pod, no graceguard",
        args.creates
    );
    reports.push(graceful_delete_collision(&bed, &ns, "bare", args.creates, 100).await?);
    let flyte_bare = match real {
        false => {
            eprintln!("flyte seed, bare: kube-scheduler preempts a task pod; a naive executor re-creates its name every 80 ms");
            let ns = bed.namespace("demo-flyte-bare").await?;
            Some(flyte_seed_naive(&bed, &simulated, &ns, "bare", args.creates).await?)
        }
        _ => None,
    };
    eprintln!("pvc, bare: a claim kept Terminating by pvc-protection (a pod uses it), created again 5 times");
    let ns = bed.namespace("demo-pvc-bare").await?;
    let mut pvcs: Vec<PvcReport> = vec![pvc_collision(&bed, &ns, "bare", 5).await?];

    let ns = bed.namespace("demo-graceguard").await?;
    eprintln!(
        "mode graceguard: the same, with graceguard-webhook registered in front of the API server"
    );
    let webhook = scenarios::objects::guarding_everything(&bed).await?;
    let mut guarded = graceful_delete_collision(&bed, &ns, "graceguard", args.creates, 100).await?;
    let n = args.creates as usize + 1;
    guarded.audit_record = webhook
        .wait_records(
            Hook::CollisionGuard.endpoint(),
            &ns,
            scenarios::scenario::POD,
            n,
        )
        .await?
        .into_iter()
        .find(|r| r["decision"] == "deny");
    reports.push(guarded);
    eprintln!("pvc, graceguard: the same claim collision with the webhook guarding PVCs");
    let ns = bed.namespace("demo-pvc-graceguard").await?;
    pvcs.push(pvc_with_webhook(&bed, &webhook, &ns).await?);

    let ns = bed.namespace("demo-guard").await?;
    eprintln!("mode guard: the task launched by graceguard's guard; its pod is deleted gracefully and stays Terminating for 3 s");
    let three = std::time::Duration::from_secs(3);
    reports.push(
        guard_graceful_delete(&bed, &simulated, &ns, three, Disruption::GracefulDelete).await?,
    );

    let mut drained: Option<DrainReport> = None;
    let mut storm: Vec<scenarios::storm::StormRow> = Vec::new();
    if real {
        eprintln!("starting a second control plane with a real node (kubelet, containerd, runc, CNI) for the disruptions...");
        let real_bed = TestBed::start_with(TestBedOptions {
            audit: true,
            version: Some(args.kube),
            real_nodes: 1,
            ..Default::default()
        })
        .await?;
        let image = real_bed.task_image()?;
        // Preempted pods trap SIGTERM and take 15 s to exit: the real kubelet
        // keeps them Terminating that long while the executor loops.
        let kubelets = Kubelets::Real {
            image: &image,
            terminate_seconds: 15,
        };
        eprintln!("flyte seed on a real node, bare: kube-scheduler preempts a task pod; a naive executor re-creates its name every 80 ms while the kubelet terminates it");
        let ns = real_bed.namespace("demo-flyte-bare").await?;
        reports.push(flyte_seed_naive(&real_bed, &kubelets, &ns, "bare", args.creates).await?);
        let real_webhook = WebhookProcess::start(&real_bed, &[]).await?;
        real_webhook.register(&real_bed, ALL_HOOKS).await?;
        eprintln!("flyte seed on a real node, graceguard: the same naive executor with the webhook registered");
        let ns = real_bed.namespace("demo-flyte-graceguard").await?;
        reports
            .push(flyte_seed_naive(&real_bed, &kubelets, &ns, "graceguard", args.creates).await?);
        eprintln!("flyte seed on a real node, guard: the task launched by the guard, preempted by kube-scheduler");
        let ns = real_bed.namespace("demo-flyte-guard").await?;
        reports.push(
            guard_graceful_delete(&real_bed, &kubelets, &ns, three, Disruption::Preemption).await?,
        );
        // Before the drain, which leaves the node cordoned.
        eprintln!("flyte seed, client-go executor (a model of Flyte's v2 pod plugin): its task pod, grace 30 s taken in full, deleted gracefully; modes conflict, retry and adaptive side by side");
        storm = scenarios::storm::run(&real_bed, "demo-storm", 30).await?;
        eprintln!("drain: kubectl drain of a real node running 3 pods (Eviction API; the kubelet terminates them)");
        let ns = real_bed.namespace("demo-drain").await?;
        let image = real_bed.task_image()?;
        let pods: Vec<_> = (0..3)
            .map(|i| {
                let mut p = testbed::pods::task_pod(&format!("drained-{i}"), 30);
                testbed::pods::run_in(&mut p, &image, &testbed::pods::graceful_script(2, 0));
                p
            })
            .collect();
        drained =
            Some(drain_node(&real_bed, &real_webhook, &ns, testbed::pods::NODE, &pods).await?);
    }
    if !real {
        reports.extend(flyte_bare);
        eprintln!("flyte seed, graceguard: the same naive executor with the webhook registered");
        let ns = bed.namespace("demo-flyte-graceguard").await?;
        reports.push(flyte_seed_naive(&bed, &simulated, &ns, "graceguard", args.creates).await?);
        eprintln!("flyte seed, guard: the task launched by the guard, preempted by kube-scheduler");
        let ns = bed.namespace("demo-flyte-guard").await?;
        reports.push(
            guard_graceful_delete(&bed, &simulated, &ns, three, Disruption::Preemption).await?,
        );
    }
    eprintln!("scheduler preemption: kube-scheduler preempts a low-priority pod on a full node");
    let ns = bed.namespace("demo-scheduler").await?;
    let scheduler = Some(scheduler_preemption(&bed, &webhook, &kubelet, &ns).await?);
    if !real {
        eprintln!("drain: kubectl drain of a node running 3 pods (Eviction API)");
        let ns = bed.namespace("demo-drain").await?;
        drained = Some(drain(&bed, &webhook, &ns, 3).await?);
    }

    eprintln!("airflow seed: 100 completed pods of a dead scheduler, 50 syncs; a naive adopter that never drains its adopted set (apache/airflow#68683), then graceguard's adopter");
    let mut airflow = Vec::new();
    for mode in ["naive", "guard"] {
        let ns = bed.namespace(&format!("demo-airflow-{mode}")).await?;
        airflow
            .push(scenarios::airflow_seed::airflow_seed(&bed, &kubelet, &ns, mode, 100, 50).await?);
    }
    eprintln!("airflow seed with Airflow's own KubernetesExecutor (Airflow 3.3.2, PostgreSQL): provider 10.18.0 with one scheduler, 10.25.0 and graceguard's executor with two schedulers syncing at once; 20 completed pods, 10 syncs");
    let real_airflow = {
        use scenarios::airflow_executor::{run, Case, GRACEGUARD_EXECUTOR};
        let pg = testbed::postgres::Postgres::start(&bed.dir().join("postgres")).await?;
        let ns = bed.namespace("demo-airflow-real").await?;
        let mut rows = Vec::new();
        for (provider, executor, executors) in [
            ("10.18.0", "KubernetesExecutor", 1),
            ("10.25.0", "KubernetesExecutor", 2),
            ("10.25.0", GRACEGUARD_EXECUTOR, 2),
        ] {
            let case = Case {
                provider,
                executor,
                executors,
                pods: 20,
                syncs: 10,
            };
            rows.push(run(&bed, &kubelet, &pg, &ns, case).await?);
        }
        rows
    };

    eprintln!("preemption: a running pod is marked DisruptionTarget (as kube-scheduler does), then deleted by alice");
    let ns = bed.namespace("demo-preemption").await?;
    let preempted = preemption(&bed, &kubelet, &webhook, &ns).await?;

    if args.json {
        let drain_kubelet = if real { "real" } else { "simulated" };
        for r in &reports {
            emit(r, r.ran_on())?;
        }
        emit(&preempted, "simulated")?;
        for p in &pvcs {
            emit(p, "simulated")?;
        }
        if let Some(s) = &scheduler {
            emit(s, "simulated")?;
        }
        if let Some(d) = &drained {
            emit(d, drain_kubelet)?;
        }
        for r in &storm {
            emit(r, "real")?;
        }
        for a in &airflow {
            emit(a, "simulated")?;
        }
        for a in &real_airflow {
            let mut v = serde_json::to_value(a)?;
            v["scenario"] = "airflow-seed".into();
            v["kube_version"] = bed.version.as_str().into();
            emit(&v, "simulated")?;
        }
    } else {
        println!("graceguard demo on Kubernetes {version}\n");
        print_table(&reports);
        println!();
        for p in &pvcs {
            println!(
                "{:<26} {:<11} {:>7} {:>14}   leaked: {} claims, {} Gi of requests.storage",
                p.scenario, p.mode, p.creates, p.already_exists, p.leaked_pvcs, p.leaked_storage_gi
            );
        }
        print_preemption(&preempted)?;
        println!();
        for a in &airflow {
            println!(
                "airflow seed, {:<6} {} completed pods, {} syncs: {} pod PATCHes ({} per pod), {} results delivered ({} distinct)",
                a.mode, a.completed_pods, a.syncs, a.patches, a.patches_per_pod, a.delivered, a.delivered_distinct
            );
        }
        for a in &real_airflow {
            println!(
                "airflow seed, {:<19} {} scheduler(s), {} completed pods, {} syncs: {} pod PATCHes ({} per pod, at most {}), {} pods adopted by two schedulers",
                a.row, a.executors, a.completed_pods, a.syncs, a.patches, a.patches_per_pod, a.max_patches_of_a_pod, a.adopted_twice
            );
        }
        if let Some(s) = &scheduler {
            println!(
                "\nscheduler preemption: {} preempted by kube-scheduler for {} (on {}); tagged {} ({}); {} deletion audit record(s), deleted by {}",
                s.victim,
                s.preemptor,
                s.preemptor_node.as_deref().unwrap_or("?"),
                s.tagged,
                s.disruption_label.as_deref().unwrap_or("-"),
                s.delete_audit_records,
                s.deleted_by
            );
        }
        if let Some(d) = &drained {
            println!(
                "drain: kubectl drain {} completed {} in {:.1} s; {} pods, {} tagged EvictionByEvictionAPI, {} eviction audit records ({} pods audited exactly once)",
                d.node, d.drain_completed, d.drain_seconds, d.pods, d.tagged, d.eviction_audit_records, d.audited_once
            );
        }
        if !storm.is_empty() {
            println!("\nflyte seed, client-go executor on a real node (grace {} s taken in full, deleted gracefully):", storm[0].grace_seconds);
            println!(
                "{:<9} {:>12} {:>5} {:>5} {:>12} {:>10} {:>10} {:>16} {:>20} {:>16}",
                "mode",
                "pod creates",
                "409",
                "429",
                "quota used",
                "sys fails",
                "in a row",
                "running again s",
                "longest Create s",
                "after name free s"
            );
            for r in &storm {
                println!(
                    "{:<9} {:>12} {:>5} {:>5} {:>12} {:>10} {:>10} {:>16} {:>20.1} {:>16}",
                    r.mode,
                    r.pod_creates_sent,
                    r.report.sent("POST pods 409"),
                    r.report.sent("POST pods 429"),
                    r.quota_used,
                    r.system_failures_recorded,
                    r.system_failures_charged,
                    r.running_again_after_ms
                        .map_or("-".to_string(), |ms| format!("{:.1}", ms as f64 / 1000.0)),
                    r.longest_create_call_ms as f64 / 1000.0,
                    r.relaunched_after_gone_ms_median
                        .map_or("-".to_string(), |ms| format!("{:.1}", ms as f64 / 1000.0))
                );
            }
        }
    }
    Ok(())
}

/// Prints `report` as one JSON line carrying `"kubelet"`: who ran its pods.
fn emit(report: &impl serde::Serialize, kubelet: &str) -> Result<()> {
    let mut v = serde_json::to_value(report)?;
    if let Some(o) = v.as_object_mut() {
        o.insert("kubelet".into(), kubelet.into());
    }
    println!("{}", serde_json::to_string(&v)?);
    Ok(())
}

/// The PVC scenario once the webhook indexes claims: it starts indexing them
/// when the scenario's quota appears, so the quota comes first.
async fn pvc_with_webhook(bed: &TestBed, webhook: &WebhookProcess, ns: &str) -> Result<PvcReport> {
    let warm = bed.namespace("demo-pvc-index").await?;
    testbed::quota::set_named_quota(bed, &warm, "storage", &[("persistentvolumeclaims", "1")])
        .await?;
    webhook.wait_kind_indexed("persistentvolumeclaims").await?;
    pvc_collision(bed, ns, "graceguard", 5).await
}

fn print_table(reports: &[CollisionReport]) {
    println!(
        "{:<26} {:<11} {:<10} {:>7} {:>14} {:>9} {:>20} {:>25} {:>15}",
        "scenario",
        "mode",
        "kubelet",
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
            "{:<26} {:<11} {:<10} {:>7} {:>14} {:>9} {:>20} {:>25} {:>15}",
            r.scenario,
            r.mode,
            if r.kubelet.is_empty() {
                "simulated"
            } else {
                r.kubelet
            },
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
