//! The Helm chart installed into the real test-bed apiserver with Helm's own
//! install action (Helm v4's library through helm-python-sdk, set up by
//! `scripts/helm-venv.sh`; `scripts/test` exports GRACEGUARD_PY).

use std::path::PathBuf;
use std::process::Command;

use anyhow::{bail, Context};
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhookConfiguration, ValidatingWebhookConfiguration,
};
use kube::api::ListParams;
use kube::Api;
use testbed::TestBed;

type R = anyhow::Result<()>;

fn python() -> anyhow::Result<String> {
    match std::env::var("GRACEGUARD_PY") {
        Ok(p) if !p.is_empty() => Ok(p),
        _ => bail!(
            "GRACEGUARD_PY is not set: run this test through scripts/test, or `source scripts/helm-venv.sh` first (it builds the Helm venv and exports it)"
        ),
    }
}

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chart_installs_and_its_service_account_reads_what_it_indexes_and_only_patches_pods(
) -> R {
    let py = python()?;
    let bed = TestBed::start().await?;
    let out = Command::new(&py)
        .arg(repo_root().join("scripts/chart-tests/install.py"))
        .arg("--kubeconfig")
        .arg(&bed.kubeconfig)
        .args(["--namespace", "graceguard"])
        .output()
        .context("running scripts/chart-tests/install.py")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "install failed:\n{stdout}\n{stderr}");
    assert!(stdout.contains("status=deployed"), "{stdout}");
    let sa = stdout
        .lines()
        .find_map(|l| l.strip_prefix("serviceaccount="))
        .context("install.py printed no serviceaccount= line")?
        .trim()
        .to_string();
    let (sa_ns, sa_name) = sa.split_once('/').context("serviceaccount=NS/NAME")?;
    let who = format!("--as=system:serviceaccount:{sa_ns}:{sa_name}");

    // Exactly get/list/watch on pods and namespaces and on the collision
    // guard's default kinds and resourcequotas, and patch on pods for the
    // tagger's follow-up (on by default); nothing else.
    let allowed = [
        ("patch", "pods"),
        ("list", "configmaps"),
        ("watch", "persistentvolumeclaims"),
        ("get", "services"),
        ("list", "jobs.batch"),
        ("watch", "resourcequotas"),
        ("get", "pods"),
        ("list", "pods"),
        ("watch", "pods"),
        ("get", "namespaces"),
        ("list", "namespaces"),
        ("watch", "namespaces"),
    ];
    let denied = [
        ("create", "pods"),
        ("update", "pods"),
        ("patch", "pods --subresource=status"),
        ("delete", "pods"),
        ("deletecollection", "pods"),
        ("create", "namespaces"),
        ("update", "namespaces"),
        ("delete", "namespaces"),
        ("get", "secrets"),
        ("update", "configmaps"),
        ("create", "jobs.batch"),
        ("create", "events"),
        ("list", "nodes"),
        ("create", "pods --subresource=eviction"),
        ("update", "validatingwebhookconfigurations"),
    ];
    for (verb, resource) in allowed.iter().chain(denied.iter()) {
        let want = allowed.contains(&(*verb, *resource));
        let mut args = vec!["auth", "can-i", verb];
        args.extend(resource.split(' '));
        args.extend(["--all-namespaces", &who]);
        let (ok, answer, err) = bed.kubectl("admin", &args)?;
        assert_eq!(ok, want, "can-i {verb} {resource}: {answer} {err}");
        assert_eq!(
            answer.trim(),
            if want { "yes" } else { "no" },
            "can-i {verb} {resource}"
        );
    }

    // The four webhooks are registered, fail open, and skip their own namespace;
    // on 1.37 the API server accepted the chart's matchConditions (it compiles
    // the CEL when the configuration is created).
    let sel = ListParams::default().labels("app.kubernetes.io/instance=graceguard");
    let v = Api::<ValidatingWebhookConfiguration>::all(bed.client.clone())
        .list(&sel)
        .await?;
    let m = Api::<MutatingWebhookConfiguration>::all(bed.client.clone())
        .list(&sel)
        .await?;
    // Both kinds of configuration, read through one JSON shape.
    let mut hooks = Vec::new();
    let configs = v
        .items
        .iter()
        .map(serde_json::to_value)
        .chain(m.items.iter().map(serde_json::to_value));
    for c in configs {
        for w in c?["webhooks"].as_array().cloned().unwrap_or_default() {
            hooks.push((
                w["name"].as_str().unwrap_or("").to_string(),
                w["failurePolicy"].as_str().map(str::to_string),
                w["namespaceSelector"].clone(),
                w["clientConfig"]["caBundle"]
                    .as_str()
                    .is_some_and(|b| !b.is_empty()),
                w["matchConditions"].as_array().map_or(0, Vec::len),
            ));
        }
    }
    // Four configurations; the collision guard's holds pods and the other kinds.
    assert_eq!(hooks.len(), 5, "{hooks:?}");
    for (name, policy, selector, ca, conditions) in &hooks {
        let filtered = matches!(
            name.as_str(),
            "collision-guard.graceguard.io"
                | "collision-guard-kinds.graceguard.io"
                | "disruption-tagger.graceguard.io"
        );
        let want = usize::from(filtered && bed.version >= testbed::KubeVersion::V1_37);
        assert_eq!(
            *conditions,
            want,
            "{name}: matchConditions on {}",
            bed.version.as_str()
        );
        assert_eq!(policy.as_deref(), Some("Ignore"), "{name}");
        assert!(*ca, "{name} has a caBundle");
        let sel = serde_json::to_string(selector)?;
        assert!(sel.contains("graceguard.io/ignore"), "{name}: {sel}");
    }
    Ok(())
}
