//! Every series graceguard's alerts and dashboard name is really exported:
//! the chart's PrometheusRule and Grafana dashboard rendered with the real
//! helm, each expression's metric names checked against what a running
//! webhook, an executor sidecar and the API server serve on `/metrics`,
//! after the traffic that makes the API server's admission-webhook series
//! exist (a webhook call, a denial, a call that fails open). A rule on a
//! series nobody exports never fires; this is the test that it does not
//! happen. (`promtool test rules` in the chart tests checks what each rule
//! does with those series.)
//!
//! `apiserver_admission_webhook_fail_open_count`, which an alert reads, is
//! served by every supported minor (it came with 1.24).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{DeleteParams, PostParams};
use kube::Api;
use scenarios::objects;
use serde::Deserialize;
use serde_json::{json, Value};
use testbed::helm::{chart_dir, Helm};
use testbed::pods::{self, CreateOutcome};
use testbed::promql::{exposed_samples, metric_names};
use testbed::sidecar::SidecarProcess;
use testbed::{quota, TestBed};

type R = anyhow::Result<()>;

/// Series no graceguard component or API server exports: Prometheus writes
/// `up` itself for every scrape target.
const WRITTEN_BY_PROMETHEUS: &[&str] = &["up"];

/// The chart rendered with the alerts and the dashboard on: (alert name →
/// expression, panel or variable title → expression).
/// (what, PromQL): an alert's name or a panel's title, and its expression.
type Queries = Vec<(String, String)>;

fn rendered(bed: &TestBed) -> anyhow::Result<(Queries, Queries)> {
    let helm = Helm::for_bed(bed)?;
    let out = helm.ok(&[
        "template",
        "graceguard",
        &chart_dir().display().to_string(),
        "-n",
        "graceguard",
        "--api-versions",
        "monitoring.coreos.com/v1/PrometheusRule",
        "--set",
        "metrics.prometheusRule.enabled=true",
        "--set",
        "metrics.grafanaDashboard.enabled=true",
    ])?;
    let mut rules = Vec::new();
    let mut queries = Vec::new();
    for doc in serde_yaml_ng::Deserializer::from_str(&out) {
        let v = Value::deserialize(doc)?;
        match v["kind"].as_str() {
            Some("PrometheusRule") => {
                for g in v["spec"]["groups"].as_array().into_iter().flatten() {
                    for r in g["rules"].as_array().into_iter().flatten() {
                        let name = r["alert"].as_str().or(r["record"].as_str());
                        rules.push((
                            name.unwrap_or("?").to_string(),
                            r["expr"].as_str().unwrap_or("").to_string(),
                        ));
                    }
                }
            }
            Some("ConfigMap") if v["metadata"]["name"].as_str() == Some("graceguard-dashboard") => {
                let text = v["data"]["graceguard.json"].as_str().unwrap_or("");
                let dash: Value = serde_json::from_str(text)?;
                panel_queries(&dash["panels"], &mut queries);
                for var in dash["templating"]["list"].as_array().into_iter().flatten() {
                    let q = match &var["query"] {
                        Value::String(s) => s.clone(),
                        o => o["query"].as_str().unwrap_or("").to_string(),
                    };
                    if !q.is_empty() && var["type"].as_str() == Some("query") {
                        let title = format!("variable {}", var["name"].as_str().unwrap_or("?"));
                        queries.push((title, label_values_series(&q)));
                    }
                }
            }
            _ => {}
        }
    }
    anyhow::ensure!(
        !rules.is_empty() && !queries.is_empty(),
        "the render has no PrometheusRule rules ({}) or no dashboard queries ({})",
        rules.len(),
        queries.len()
    );
    Ok((rules, queries))
}

/// Every target expression of `panels`, rows' nested panels included.
fn panel_queries(panels: &Value, out: &mut Vec<(String, String)>) {
    for p in panels.as_array().into_iter().flatten() {
        let title = p["title"].as_str().unwrap_or("?");
        for t in p["targets"].as_array().into_iter().flatten() {
            if let Some(e) = t["expr"].as_str() {
                out.push((format!("panel {title:?}"), e.to_string()));
            }
        }
        panel_queries(&p["panels"], out);
    }
}

/// A Grafana variable's query as PromQL: `label_values(SERIES, label)` and
/// `query_result(EXPR)` read SERIES and EXPR; anything else is PromQL.
fn label_values_series(q: &str) -> String {
    let inner = |prefix: &str| {
        q.trim()
            .strip_prefix(prefix)
            .and_then(|r| r.strip_suffix(')'))
            .map(str::to_string)
    };
    if let Some(args) = inner("label_values(") {
        // The last comma separates the label; a one-argument form names a label only.
        return match args.rsplit_once(',') {
            Some((series, _)) => series.to_string(),
            None => String::new(),
        };
    }
    inner("query_result(").unwrap_or_else(|| q.to_string())
}

/// `GET /metrics` of the API server, as the bed's admin.
async fn apiserver_metrics(bed: &TestBed) -> anyhow::Result<String> {
    let req = http::Request::get("/metrics").body(Vec::new())?;
    Ok(bed.client.request_text(req).await?)
}

/// A validating webhook the API server cannot reach, failurePolicy Ignore:
/// its calls fail open (`apiserver_admission_webhook_fail_open_count`).
fn unreachable_hook(ca_pem: &str) -> anyhow::Result<ValidatingWebhookConfiguration> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": "monitoring-unreachable"},
        "webhooks": [{
            "name": "unreachable.graceguard.io",
            "admissionReviewVersions": ["v1"],
            "clientConfig": {"url": "https://127.0.0.1:1/validate/pods", "caBundle": k8s_openapi::ByteString(ca_pem.as_bytes().to_vec())},
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}],
            "failurePolicy": "Ignore",
            "sideEffects": "None",
            "timeoutSeconds": 1,
        }],
    }))?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_series_the_alerts_and_the_dashboard_name_is_exported() -> R {
    let bed = TestBed::start().await?;
    let (rules, queries) = rendered(&bed)?;

    // The webhook with other kinds guarded (their index series exist once a
    // quota counts the kind), every endpoint registered.
    let ns = bed.namespace("monitoring").await?;
    let webhook = scenarios::objects::guarding_everything(&bed).await?;
    quota::set_named_quota(&bed, &ns, "claims", &[("persistentvolumeclaims", "10")]).await?;
    webhook.wait_kind_indexed("persistentvolumeclaims").await?;

    // A denial (apiserver_admission_webhook_rejection_count): a Create of a
    // name a terminating pod holds (no kubelet runs, so it stays Terminating).
    let api: Api<Pod> = Api::namespaced(bed.client.clone(), &ns);
    assert_eq!(
        pods::create(&api, &pods::task_pod("held", 30)).await?,
        CreateOutcome::Created
    );
    api.delete("held", &DeleteParams::default()).await?;
    // Once graceguard's index has the terminating pod, a dry-run Create of
    // its name (which charges nothing) gets graceguard's denial, and the API
    // server counts that rejection.
    objects::wait_indexed(&api, &pods::task_pod("held", 30), "").await?;

    // A call that fails open (apiserver_admission_webhook_fail_open_count).
    let vwc: Api<ValidatingWebhookConfiguration> = Api::all(bed.client.clone());
    vwc.create(&PostParams::default(), &unreachable_hook(&webhook.ca_pem)?)
        .await?;
    let mut failed_open = false;
    for i in 0..30 {
        // The API server sees a new configuration within about a second.
        let name = format!("open-{i}");
        assert_eq!(
            pods::create(&api, &pods::task_pod(&name, 0)).await?,
            CreateOutcome::Created
        );
        let text = apiserver_metrics(&bed).await?;
        if text.lines().any(|l| {
            l.starts_with("apiserver_admission_webhook_fail_open_count{")
                && l.contains("name=\"unreachable.graceguard.io\"")
        }) {
            failed_open = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    vwc.delete("monitoring-unreachable", &DeleteParams::default())
        .await?;
    assert!(
        failed_open,
        "the API server counted no fail-open call of the unreachable webhook"
    );

    // An executor sidecar, its metrics on their own port.
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let metrics_addr = format!("127.0.0.1:{port}");
    let sidecar =
        SidecarProcess::start_with_args(&bed, "mon", &ns, &["--metrics-listen", &metrics_addr])
            .await?;
    let (code, on_socket) = sidecar.request("GET", "/metrics", None).await?;
    assert_eq!(code, 200, "/metrics on the API socket: {on_socket}");
    let sidecar_text = http_get(&metrics_addr, "/metrics").await?;
    assert_eq!(sidecar_text.0, 200, "{}", sidecar_text.1);
    // That port serves the metrics and health only, never the API.
    let (api_code, api_body) = http_get(&metrics_addr, "/v1/tasks").await?;
    assert_eq!(api_code, 404, "/v1/tasks on --metrics-listen: {api_body}");
    assert_eq!(http_get(&metrics_addr, "/healthz").await?.0, 200);

    let (wcode, webhook_text) = webhook.http_get("/metrics")?;
    assert_eq!(wcode, 200, "{webhook_text}");
    let apiserver_text = apiserver_metrics(&bed).await?;
    let sources: [(&str, BTreeSet<String>); 3] = [
        ("graceguard-webhook", exposed_samples(&webhook_text)),
        ("graceguard sidecar", exposed_samples(&sidecar_text.1)),
        ("kube-apiserver", exposed_samples(&apiserver_text)),
    ];
    for (who, names) in &sources {
        assert!(names.len() > 5, "{who} exports only {names:?}");
    }
    // The build info on both of graceguard's components.
    for (who, names) in &sources[..2] {
        assert!(
            names.contains("graceguard_build_info"),
            "{who} has no graceguard_build_info"
        );
    }

    let mut missing: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut checked = BTreeSet::new();
    for (what, expr) in rules
        .iter()
        .map(|(a, e)| (format!("alert {a}"), e))
        .chain(queries.iter().map(|(t, e)| (t.clone(), e)))
    {
        let names = metric_names(expr);
        assert!(!names.is_empty(), "{what} reads no series: {expr}");
        for n in names {
            if WRITTEN_BY_PROMETHEUS.contains(&n.as_str()) {
                continue;
            }
            checked.insert(n.clone());
            if !sources.iter().any(|(_, s)| s.contains(&n)) {
                missing.entry(n).or_default().push(what.clone());
            }
        }
    }
    assert!(
        missing.is_empty(),
        "series named by the alerts or the dashboard that nothing exports (name: where): {missing:#?}"
    );
    // Every alert was read, and the check covered all three sources.
    assert!(rules.len() >= 20, "only {} rules rendered", rules.len());
    for prefix in [
        "graceguard_sidecar_",
        "apiserver_admission_webhook_",
        "graceguard_admission_",
    ] {
        assert!(
            checked.iter().any(|n| n.starts_with(prefix)),
            "no rule or panel reads a {prefix}* series: {checked:?}"
        );
    }
    drop(sidecar);
    Ok(())
}

/// GET `path` on loopback `addr`: (status, body).
async fn http_get(addr: &str, path: &str) -> anyhow::Result<(u16, String)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).await?;
    let text = String::from_utf8_lossy(&raw).to_string();
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| anyhow::anyhow!("no HTTP answer from {addr}{path}: {text:?}"))?;
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no status in {head:?}"))?;
    Ok((code, body.to_string()))
}
