//! The sidecar API as a product: its OpenAPI document (generated, valid,
//! true to the Kubernetes schemas it includes, and compiling into a
//! generated client), and the Go and Python client packages in `clients/`
//! driving every call against real sidecars on both transports.

use testbed::kube_schemas;
use testbed::kubelet::{FinishDeletions, Kubelet, KubeletOptions};
use testbed::sidecar::SidecarProcess;
use testbed::{KubeVersion, TestBed};

type R = anyhow::Result<()>;

/// Fields a supported minor serves that the document (the newest minor's
/// schemas) lacks, each with its reason: 1.30's `PodResourceClaim.source`
/// (`ClaimSource`) belongs to dynamic resource allocation's v1alpha2 API,
/// behind an alpha feature gate, and was replaced in 1.31 by
/// `resourceClaimName`/`resourceClaimTemplateName` on the claim itself.
/// 1.35's `PodSpec.workloadRef` (`WorkloadReference`, the alpha Workload API
/// for gang scheduling) was replaced by `schedulingGroup` in 1.36.
const OLDER_ONLY: &[(u32, &str)] = &[
    (35, "io.k8s.api.core.v1.PodSpec.workloadRef"),
    (35, "io.k8s.api.core.v1.WorkloadReference.name"),
    (35, "io.k8s.api.core.v1.WorkloadReference.podGroup"),
    (
        35,
        "io.k8s.api.core.v1.WorkloadReference.podGroupReplicaKey",
    ),
    (30, "io.k8s.api.core.v1.ClaimSource.resourceClaimName"),
    (
        30,
        "io.k8s.api.core.v1.ClaimSource.resourceClaimTemplateName",
    ),
    (30, "io.k8s.api.core.v1.PodResourceClaim.source"),
];

/// Where the committed documents live.
fn guard_file(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../guard")
        .join(name)
}

/// The pod template schemas the document includes are the ones the API
/// server checks a pod against: on the newest supported minor exactly what it
/// serves at `/openapi/v3/api/v1` (set `GRACEGUARD_UPDATE_OPENAPI=1` to
/// rewrite `guard/openapi-kubernetes.json` from it); on an older one, every
/// property it serves is in the document.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documents_kubernetes_schemas_are_the_api_servers() -> R {
    let bed = TestBed::start().await?;
    let path = guard_file("openapi-kubernetes.json");
    let committed: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
    let committed = committed["schemas"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    let served = kube_schemas::served_v3(&bed).await?;
    assert!(served.len() > 50, "{} schemas", served.len());
    if bed.version == KubeVersion::newest() {
        let served: serde_json::Map<String, serde_json::Value> = served.into_iter().collect();
        if std::env::var("GRACEGUARD_UPDATE_OPENAPI").as_deref() == Ok("1") {
            let doc = serde_json::json!({
                "source": format!("kube-apiserver {}, GET /openapi/v3/api/v1: io.k8s.api.core.v1.PodTemplateSpec and every schema it refers to, without the defaults of Go zero values that are not values of their schema (\"\" on an enum without it, {{}} beside allOf)", bed.version.as_str()),
                "schemas": served,
            });
            std::fs::write(&path, serde_json::to_string_pretty(&doc)? + "\n")?;
        }
        assert!(
            committed == served,
            "guard/openapi-kubernetes.json differs from the API server's schemas: rerun this test with GRACEGUARD_UPDATE_OPENAPI=1, then `graceguard openapi > guard/openapi.json`"
        );
    } else {
        let mut missing = Vec::new();
        for (name, schema) in &served {
            let ours = committed
                .get(name)
                .map(kube_schemas::properties)
                .unwrap_or_default();
            let theirs = kube_schemas::properties(schema);
            missing.extend(
                theirs
                    .difference(&ours)
                    .map(|p| format!("{name}.{p}"))
                    .filter(|f| !OLDER_ONLY.contains(&(bed.version.minor(), f.as_str()))),
            );
        }
        assert!(
            missing.is_empty(),
            "fields {} serves that the document (from {}) lacks: {missing:?}",
            bed.version.as_str(),
            KubeVersion::newest().as_str()
        );
    }
    Ok(())
}

/// The committed document passes `openapi-spec-validator`, and a client
/// generated from it by `openapi-python-client` (which reads OpenAPI 3.1,
/// what `utoipa` writes) passes `mypy --strict`, with one model per event
/// kind and one module per operation.
#[test]
fn the_document_validates_and_compiles_into_a_generated_client() -> R {
    let py = testbed::sidecar::clients_python()?;
    let bin = py
        .parent()
        .map(std::path::Path::to_path_buf)
        .unwrap_or_default();
    let doc = guard_file("openapi.json");
    let run = |cmd: &mut std::process::Command, what: &str| -> R {
        let out = cmd.output()?;
        anyhow::ensure!(
            out.status.success(),
            "{what} failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(())
    };
    run(
        std::process::Command::new(bin.join("openapi-spec-validator")).arg(&doc),
        "openapi-spec-validator guard/openapi.json",
    )?;
    let dir = tempfile::tempdir()?;
    let config = dir.path().join("config.yaml");
    std::fs::write(&config, "post_hooks: []\n")?;
    let out = dir.path().join("client");
    let gen = std::process::Command::new(bin.join("openapi-python-client"))
        .args(["generate", "--meta", "none", "--path"])
        .arg(&doc)
        .arg("--output-path")
        .arg(&out)
        .arg("--config")
        .arg(&config)
        .output()?;
    let said =
        String::from_utf8_lossy(&gen.stdout).to_string() + &String::from_utf8_lossy(&gen.stderr);
    anyhow::ensure!(
        gen.status.success(),
        "openapi-python-client failed:\n{said}"
    );
    anyhow::ensure!(
        !said.contains("Unable to parse") && !said.contains("Cannot parse"),
        "openapi-python-client left parts of the document out:\n{said}"
    );
    for module in [
        "api/tasks/put_task.py",
        "api/tasks/get_task.py",
        "api/tasks/list_tasks.py",
        "api/tasks/delete_task.py",
        "api/tasks/retry_task.py",
        "api/events/get_events.py",
        "api/events/ack_events.py",
        "models/transition_event.py",
        "models/result_event.py",
        "models/pod_event.py",
        "models/api_status.py",
        "models/io_k8s_api_core_v1_pod_template_spec.py",
    ] {
        anyhow::ensure!(
            out.join(module).is_file(),
            "the generated client has no {module}"
        );
    }
    run(
        std::process::Command::new(bin.join("mypy"))
            .args(["--strict", "--no-incremental", "--cache-dir", "/dev/null"])
            .arg(&out),
        "mypy --strict on the generated client",
    )?;
    Ok(())
}

/// The template the clients' tests submit, in a file.
fn template_file(bed: &TestBed) -> anyhow::Result<std::path::PathBuf> {
    let path = bed.dir().join("template.json");
    std::fs::write(
        &path,
        serde_json::to_string(&testbed::pods::task_pod("template", 30))?,
    )?;
    Ok(path)
}

/// A bed with a kubelet that ends pods a moment after they run and
/// finishes deletions at once, and two sidecars: one on a Unix socket, one
/// on TCP with a token.
async fn two_transports(
) -> anyhow::Result<(TestBed, String, Kubelet, SidecarProcess, SidecarProcess)> {
    let (bed, ns) = scenarios::guard_task::audited_bed("clients").await?;
    let kubelet = Kubelet::start(
        &bed,
        KubeletOptions {
            end_after: Some(std::time::Duration::from_secs(1)),
            finish_deletions: FinishDeletions::AfterShareOfGrace(0.0),
            ..Default::default()
        },
    )
    .await?;
    let socket = SidecarProcess::start(&bed, "clients-socket", &ns).await?;
    let tcp = SidecarProcess::start_tcp(&bed, "clients-tcp", &ns).await?;
    Ok((bed, ns, kubelet, socket, tcp))
}

fn e2e_env(
    cmd: &mut std::process::Command,
    bed: &TestBed,
    ns: &str,
    socket: &SidecarProcess,
    tcp: &SidecarProcess,
) -> R {
    cmd.env("GRACEGUARD_E2E_NAMESPACE", ns)
        .env("GRACEGUARD_E2E_TEMPLATE", template_file(bed)?)
        .env("GRACEGUARD_E2E_SOCKET", &socket.socket)
        .env("GRACEGUARD_E2E_URL", tcp.url().unwrap_or_default())
        .env("GRACEGUARD_E2E_TOKEN_FILE", tcp.token_file());
    Ok(())
}

/// `go test -tags e2e` of `clients/go` against both sidecars: every call
/// (PUT 201/200/409, replace, GET, list with pages, retry, DELETE with
/// forget, events, ack, a stale epoch) on both transports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_go_client_drives_every_call_on_both_transports() -> R {
    let (bed, ns, _kubelet, socket, tcp) = two_transports().await?;
    let mut cmd = std::process::Command::new(testbed::go_build::go_tool());
    cmd.args([
        "test",
        "-tags",
        "e2e",
        "-count=1",
        "-json",
        "-run",
        "TestEveryCallOnBothTransports",
        ".",
    ])
    .current_dir(testbed::sidecar::clients_dir().join("go"))
    .env("GOTOOLCHAIN", "local")
    .env("GOFLAGS", "-mod=mod");
    e2e_env(&mut cmd, &bed, &ns, &socket, &tcp)?;
    let out = tokio::task::spawn_blocking(move || cmd.output()).await??;
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let passed: Vec<String> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["Action"] == "pass" && v["Test"].is_string())
        .filter_map(|v| v["Test"].as_str().map(str::to_string))
        .collect();
    let output: String = text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v["Output"].as_str().map(str::to_string))
        .collect();
    assert!(
        out.status.success(),
        "go test failed:\n{output}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for t in [
        "TestEveryCallOnBothTransports/socket",
        "TestEveryCallOnBothTransports/tcp",
    ] {
        assert!(
            passed.iter().any(|p| p == t),
            "{t} did not pass: {passed:?}\n{output}"
        );
    }
    Ok(())
}

/// `pytest` of `clients/python`'s end-to-end tests (the package installed
/// by pip, imported from outside the repository) against both sidecars.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_client_drives_every_call_on_both_transports() -> R {
    let (bed, ns, _kubelet, socket, tcp) = two_transports().await?;
    let junit = bed.dir().join("pytest.xml");
    let mut cmd = std::process::Command::new(testbed::sidecar::clients_python()?);
    cmd.args(["-m", "pytest", "-p", "no:cacheprovider", "-q"])
        .arg(format!("--junitxml={}", junit.display()))
        .arg(testbed::sidecar::clients_dir().join("python/tests/e2e"))
        // Not the source tree: the installed package.
        .current_dir(bed.dir());
    e2e_env(&mut cmd, &bed, &ns, &socket, &tcp)?;
    let out = tokio::task::spawn_blocking(move || cmd.output()).await??;
    assert!(
        out.status.success(),
        "pytest failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let xml = std::fs::read_to_string(&junit)?;
    for t in ["test_every_call[socket]", "test_every_call[tcp]"] {
        assert!(
            xml.contains(&format!("name=\"{t}\"")),
            "{t} did not run: {xml}"
        );
    }
    assert!(
        xml.contains("failures=\"0\"")
            && xml.contains("skipped=\"0\"")
            && xml.contains("errors=\"0\""),
        "{xml}"
    );
    Ok(())
}

/// The documented example executor in `lang` (the file as
/// docs/sidecar-api.md quotes it), run as a user would, through a preemption: its first pod is
/// preempted while Running, it waits that pod out, the task runs again
/// under the next name and succeeds; the example prints each phase and the
/// result and exits 0.
async fn the_readme_example_survives_a_preemption(lang: testbed::sidecar::Lang) -> R {
    use testbed::sidecar::{clients_dir, clients_python, Lang};
    let (file, mut cmd) = match lang {
        Lang::Go => {
            let bin = testbed::go_build::cached_package(
                &clients_dir().join("go"),
                "./examples/executor",
                "go-example",
                "graceguard-go-example",
            )?;
            (
                clients_dir().join("go/examples/executor/main.go"),
                tokio::process::Command::new(bin),
            )
        }
        Lang::Python => {
            let file = clients_dir().join("python/examples/executor.py");
            let mut c = tokio::process::Command::new(clients_python()?);
            c.arg(&file);
            (file, c)
        }
    };
    let readme = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/sidecar-api.md"),
    )?;
    assert!(
        readme.contains(&std::fs::read_to_string(&file)?),
        "docs/sidecar-api.md does not quote {} as it is",
        file.display()
    );
    let (bed, ns) = scenarios::guard_task::audited_bed("example").await?;
    let kubelet = Kubelet::start(&bed, KubeletOptions::default()).await?;
    let sidecar = SidecarProcess::start(&bed, "example", &ns).await?;
    let child = cmd
        .args([&ns, "train"])
        .arg(template_file(&bed)?)
        .env("GRACEGUARD_SOCKET", &sidecar.socket)
        .current_dir(bed.dir())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let api: kube::Api<k8s_openapi::api::core::v1::Pod> =
        kube::Api::namespaced(bed.client.clone(), &ns);
    testbed::pods::wait_running(&api, "train-0").await?;
    kubelet.mark_preempted(&ns, "train-0").await?;
    testbed::pods::delete_gracefully(&api, "train-0", None).await?;
    kubelet.finish_deletion(&ns, "train-0").await?;
    testbed::pods::wait_running(&api, "train-1").await?;
    kubelet
        .end_pod(&ns, "train-1", testbed::kubelet::Terminal::Succeeded)
        .await?;
    let out = tokio::time::timeout(std::time::Duration::from_secs(90), child.wait_with_output())
        .await??;
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the example exited {}: {printed}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = printed.lines().collect();
    for want in [
        "train-0 Running",
        "train-0 ShuttingDown",
        "train-1 Running",
        "result: train-1 true",
    ] {
        assert!(lines.contains(&want), "no line {want:?} in:\n{printed}");
    }
    // It acknowledged the result: the pod is marked done.
    testbed::pods::wait_label(&api, "train-1", "graceguard.io/done", "true").await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_go_example_survives_a_preemption() -> R {
    the_readme_example_survives_a_preemption(testbed::sidecar::Lang::Go).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_python_example_survives_a_preemption() -> R {
    the_readme_example_survives_a_preemption(testbed::sidecar::Lang::Python).await
}
