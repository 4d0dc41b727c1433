//! `graceguard run` as a user runs it, against the real test-bed apiserver.

use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use testbed::binaries::workspace_bin;
use testbed::kubelet::{FinishDeletions, Kubelet, KubeletOptions, Terminal};
use testbed::{pods, TestBed};
use tokio::process::Command;

type R = anyhow::Result<()>;

const POD_YAML: &str = "apiVersion: v1
kind: Pod
metadata:
  name: nightly
spec:
  nodeName: node-1
  restartPolicy: Never
  terminationGracePeriodSeconds: 30
  containers:
  - name: main
    image: busybox:1.36
    command: [sleep, '3600']
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_prints_json_transitions_and_exits_with_the_tasks_result() -> R {
    let bed = TestBed::start().await?;
    let ns = bed.namespace("cli").await?;
    let kubelet = Kubelet::start(&bed, KubeletOptions::default()).await?;
    let manifest = bed.dir().join("nightly.yaml");
    std::fs::write(&manifest, POD_YAML)?;
    let bin = workspace_bin("graceguard", "GRACEGUARD_BIN")?;
    // `graceguard run -f nightly.yaml --events json` as alice.
    let run_json = || -> anyhow::Result<Command> {
        let mut c = Command::new(&bin);
        c.args(["run", "-f"])
            .arg(&manifest)
            .args(["--namespace", &ns, "--events", "json", "--kubeconfig"])
            .arg(bed.kubeconfig_for("alice")?)
            .kill_on_drop(true);
        Ok(c)
    };
    let child = run_json()?
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let api: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);
    pods::wait_running(&api, "nightly-0").await?;
    // Give the CLI a moment to see Running itself, then end the task.
    tokio::time::sleep(Duration::from_millis(500)).await;
    kubelet
        .end_pod(&ns, "nightly-0", Terminal::Succeeded)
        .await?;
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output()).await??;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "stdout:\n{stdout}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let events: Vec<serde_json::Value> = stdout
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?;
    let phases: Vec<&str> = events.iter().filter_map(|e| e["phase"].as_str()).collect();
    assert_eq!(
        phases,
        ["Launching", "Queued", "Running", "Succeeded"],
        "{stdout}"
    );
    for e in &events {
        assert_eq!(e["task"], "nightly");
        assert_eq!(e["pod"], "nightly-0");
        assert_eq!(e["attempt"], 0);
        for key in ["reason", "failure_kind"] {
            assert!(e.get(key).is_some(), "{key} missing in {e}");
        }
    }
    // The pod carries the guard's labels.
    let pod = api.get("nightly-0").await?;
    let labels = pod.metadata.labels.unwrap_or_default();
    assert_eq!(
        labels.get("graceguard.io/task").map(String::as_str),
        Some("nightly")
    );
    assert_eq!(
        labels
            .get("app.kubernetes.io/managed-by")
            .map(String::as_str),
        Some("graceguard")
    );
    // Its result was reported by this run, so no adopter may report it again.
    assert_eq!(
        labels.get("graceguard.io/done").map(String::as_str),
        Some("true")
    );

    // The same command again (same default instance: a CronJob's next
    // run): its last result was delivered, so this is a new run, under the
    // next pod name (the first run released its Lease: no wait).
    let child = run_json()?
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    pods::wait_running(&api, "nightly-1").await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    kubelet
        .end_pod(&ns, "nightly-1", Terminal::Succeeded)
        .await?;
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output()).await??;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "stdout:\n{stdout}");
    assert!(stdout.contains("\"pod\":\"nightly-1\""), "{stdout}");
    // With --no-rerun: the delivered result is reported again, saying so,
    // and nothing is created.
    let again = run_json()?.arg("--no-rerun").output();
    let out = tokio::time::timeout(Duration::from_secs(60), again).await??;
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "stdout:\n{stdout}\nstderr:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("\"phase\":\"Succeeded\""), "{stdout}");
    let mut names: Vec<String> = api
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .map(|p| p.metadata.name.unwrap_or_default())
        .collect();
    names.sort();
    assert_eq!(names, ["nightly-0", "nightly-1"], "no third attempt");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_errors_exit_2_with_a_message_saying_what_to_fix() -> R {
    let bed = TestBed::start().await?;
    let bin = workspace_bin("graceguard", "GRACEGUARD_BIN")?;
    let not_a_pod = bed.dir().join("deploy.yaml");
    std::fs::write(
        &not_a_pod,
        "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\n",
    )?;
    let garbage = bed.dir().join("garbage.yaml");
    std::fs::write(&garbage, "kind: Pod\nspec: [unclosed\n")?;
    let good = bed.dir().join("pod.yaml");
    std::fs::write(&good, POD_YAML)?;
    let cases = [
        (
            not_a_pod.clone(),
            bed.kubeconfig.clone(),
            "takes a Pod manifest",
        ),
        (garbage, bed.kubeconfig.clone(), "is not YAML or JSON"),
        (
            bed.dir().join("missing.yaml"),
            bed.kubeconfig.clone(),
            "cannot read",
        ),
        (good, bed.dir().join("no-such-kubeconfig"), "kubeconfig"),
    ];
    for (manifest, kubeconfig, want) in cases {
        let out = Command::new(&bin)
            .args(["run", "-f"])
            .arg(&manifest)
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .output()
            .await?;
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{manifest:?}: {err}");
        assert!(err.contains(want), "{manifest:?}: {err}");
    }
    Ok(())
}

/// Kubernetes, Argo and Airflow stop a process with SIGTERM; a terminal user
/// with Ctrl-C (SIGINT). Either way the running pod is deleted (with a uid
/// precondition) and waited out, and the exit code is the shell's: 143 / 130.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_and_sigint_delete_the_running_pod_and_exit_143_and_130() -> R {
    let bed = TestBed::start().await?;
    let ns = bed.namespace("cli-stop").await?;
    // The node finishes a graceful deletion after a tenth of its grace (3 s).
    let _kubelet = Kubelet::start(
        &bed,
        KubeletOptions {
            finish_deletions: FinishDeletions::AfterShareOfGrace(0.1),
            ..Default::default()
        },
    )
    .await?;
    let manifest = bed.dir().join("nightly.yaml");
    std::fs::write(&manifest, POD_YAML)?;
    let bin = workspace_bin("graceguard", "GRACEGUARD_BIN")?;
    let api: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);
    for (task, signal, code, name) in [
        ("term", libc::SIGTERM, 143, "SIGTERM"),
        ("int", libc::SIGINT, 130, "SIGINT"),
    ] {
        let child = Command::new(&bin)
            .args(["run", "-f"])
            .arg(&manifest)
            .args(["--namespace", &ns, "--name", task, "--kubeconfig"])
            .arg(bed.kubeconfig_for("alice")?)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
        let pod = format!("{task}-0");
        pods::wait_running(&api, &pod).await?;
        let uid = api.get(&pod).await?.metadata.uid.unwrap_or_default();
        let pid = child.id().ok_or_else(|| anyhow::anyhow!("no pid"))?;
        // SAFETY: signalling our own child process.
        assert_eq!(unsafe { libc::kill(pid as i32, signal) }, 0);
        let out = tokio::time::timeout(Duration::from_secs(90), child.wait_with_output()).await??;
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{name}: {stderr}");
        assert!(stderr.contains(&format!("stopped by {name}")), "{stderr}");
        // It waited until its pod was gone.
        let now = api.get_opt(&pod).await?;
        assert!(
            now.as_ref().and_then(|p| p.metadata.uid.as_deref()) != Some(uid.as_str()),
            "{pod} still exists after the CLI exited: {:?}",
            now.map(|p| p.metadata.deletion_timestamp)
        );
    }
    Ok(())
}

/// A Job retried after its pod died runs `graceguard run` in a new pod under
/// a new host name. With no `--instance`, the run reads its own pod and takes
/// the instance its Job's retries share (`run-job-<job>`), so the retry
/// resumes the task from the pod the first try launched, with no second
/// Create. Before, each try was `run-<hostname>`: the retry met the first
/// try's pod holding the task's name as a foreign pod and never finished.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retried_jobs_run_resumes_its_task_under_the_jobs_instance() -> R {
    use k8s_openapi::api::batch::v1::Job;
    use kube::api::PostParams;
    let bed = TestBed::start().await?;
    let ns = bed.namespace("cli-job").await?;
    let kubelet = Kubelet::start(&bed, KubeletOptions::default()).await?;
    let manifest = bed.dir().join("nightly.yaml");
    std::fs::write(&manifest, POD_YAML)?;
    // The Job the run's own pods belong to (suspended: its controller makes
    // none), in the namespace the run's kubeconfig defaults to.
    let jobs: Api<Job> = Api::namespaced(bed.client.clone(), "default");
    let job: Job = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "nightly-job"},
        "spec": {"suspend": true, "template": {"spec": {"restartPolicy": "Never",
            "containers": [{"name": "run", "image": "graceguard:dev"}]}}},
    }))?;
    let job = jobs.create(&PostParams::default(), &job).await?;
    let own: Api<Pod> = Api::namespaced(bed.client.clone(), "default");
    let own_pod = |name: &str| -> anyhow::Result<Pod> {
        Ok(serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "ownerReferences": [{
                "apiVersion": "batch/v1", "kind": "Job", "name": "nightly-job",
                "uid": job.metadata.uid.clone().unwrap_or_default(), "controller": true,
            }]},
            "spec": {"containers": [{"name": "run", "image": "graceguard:dev"}]},
        }))?)
    };
    let bin = workspace_bin("graceguard", "GRACEGUARD_BIN")?;
    let run_in = |host: &str| -> anyhow::Result<Command> {
        let mut c = Command::new(&bin);
        c.env("HOSTNAME", host)
            .args(["run", "-f"])
            .arg(&manifest)
            .args([
                "--namespace",
                &ns,
                "--lease-duration-seconds",
                "3",
                "--kubeconfig",
            ])
            .arg(bed.kubeconfig_for("alice")?)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        Ok(c)
    };
    let api: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);

    // The first try launches the task, then its pod dies (SIGKILL).
    own.create(&PostParams::default(), &own_pod("nightly-job-x7k2p")?)
        .await?;
    let mut first = run_in("nightly-job-x7k2p")?.spawn()?;
    pods::wait_running(&api, "nightly-0").await?;
    let launched = api.get("nightly-0").await?;
    let instance = launched
        .metadata
        .labels
        .unwrap_or_default()
        .get(graceguard::core::naming::INSTANCE_LABEL)
        .cloned();
    assert_eq!(instance.as_deref(), Some("run-job-nightly-job"));
    first.kill().await?;

    // The retry, in a new pod of the same Job: it resumes the task.
    own.create(&PostParams::default(), &own_pod("nightly-job-9qzvb")?)
        .await?;
    let second = run_in("nightly-job-9qzvb")?.spawn()?;
    // Once it holds the Lease and follows the task, the pod ends.
    tokio::time::sleep(Duration::from_secs(8)).await;
    kubelet
        .end_pod(&ns, "nightly-0", Terminal::Succeeded)
        .await?;
    let out = tokio::time::timeout(Duration::from_secs(90), second.wait_with_output()).await??;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(0),
        "the retry finished the task: {stderr}"
    );
    assert!(
        stderr.contains("instance run-job-nightly-job (from its Job"),
        "{stderr}"
    );
    assert!(
        api.get_opt("nightly-1").await?.is_none(),
        "resumed, not launched again"
    );
    Ok(())
}
