//! Running the real `graceguard-webhook` binary against the bed, registered
//! with the API server by URL, as an operator would without the chart.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations, ValidatingWebhook,
    ValidatingWebhookConfiguration,
};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, LabelSelectorRequirement};
use k8s_openapi::ByteString;
use kube::api::{DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::Api;
use serde_json::Value;

use crate::binaries;
use crate::control_plane::TestBed;
use crate::process::{free_port, tail, Managed};

/// The admission endpoints graceguard serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hook {
    /// Validating, pods CREATE.
    CollisionGuard,
    /// Mutating, pods/status UPDATE.
    DisruptionTagger,
    /// Validating, pods DELETE.
    DeletionAudit,
    /// Validating, pods/eviction CREATE.
    EvictionAudit,
    /// Validating, CREATE of the other kinds in [`COLLISION_KINDS`].
    CollisionKinds,
    /// Validating, pods UPDATE: the fencing check of the guard's
    /// result-finalizer releases (not in [`ALL_HOOKS`]: registered where a
    /// test uses it, with the chart's matchConditions).
    ReleaseFencing,
}

/// The other kinds the tests guard: `--collision-kinds` for the webhook, and
/// the rules [`Hook::CollisionKinds`] registers.
pub const COLLISION_KINDS: &str =
    "persistentvolumeclaims,services,configmaps,jobs.batch,widgets.graceguard.test";

/// The pod endpoints, registered as the chart registers them (the other
/// kinds' guard, [`Hook::CollisionKinds`], is registered where a test uses it).
pub const ALL_HOOKS: &[Hook] = &[
    Hook::CollisionGuard,
    Hook::DisruptionTagger,
    Hook::DeletionAudit,
    Hook::EvictionAudit,
];

impl Hook {
    fn path(self) -> &'static str {
        match self {
            Hook::CollisionGuard => "/validate/pods",
            Hook::DisruptionTagger => "/mutate/pods-status",
            Hook::DeletionAudit => "/validate/pods-delete",
            Hook::EvictionAudit => "/validate/pods-eviction",
            Hook::CollisionKinds => "/validate/collision",
            Hook::ReleaseFencing => "/validate/pods-release",
        }
    }

    fn name(self) -> &'static str {
        match self {
            Hook::CollisionGuard => "collision-guard.graceguard.io",
            Hook::DisruptionTagger => "disruption-tagger.graceguard.io",
            Hook::DeletionAudit => "deletion-audit.graceguard.io",
            Hook::EvictionAudit => "eviction-audit.graceguard.io",
            Hook::CollisionKinds => "collision-guard-kinds.graceguard.io",
            Hook::ReleaseFencing => "release-fencing.graceguard.io",
        }
    }

    /// As the chart declares it (follow-up on): the endpoints whose follow-up
    /// patches afterwards do so never for a dry run.
    fn side_effects(self) -> &'static str {
        match self {
            Hook::DisruptionTagger | Hook::EvictionAudit => "NoneOnDryRun",
            Hook::CollisionGuard
            | Hook::DeletionAudit
            | Hook::CollisionKinds
            | Hook::ReleaseFencing => "None",
        }
    }

    /// The deletion and eviction audits, which no opt-out label skips.
    pub fn is_audit(self) -> bool {
        matches!(self, Hook::DeletionAudit | Hook::EvictionAudit)
    }

    /// The `endpoint` field of its audit records.
    pub fn endpoint(self) -> &'static str {
        match self {
            Hook::CollisionGuard => "collision_guard",
            Hook::DisruptionTagger => "disruption_tagger",
            Hook::DeletionAudit => "deletion_audit",
            Hook::EvictionAudit => "eviction_audit",
            Hook::CollisionKinds => "collision_guard",
            Hook::ReleaseFencing => "release_fencing",
        }
    }

    fn rule(self) -> RuleWithOperations {
        if self == Hook::CollisionKinds {
            let kinds: Vec<(String, String)> = COLLISION_KINDS
                .split(',')
                .map(|k| match k.split_once('.') {
                    Some((r, g)) => (g.to_string(), r.to_string()),
                    None => (String::new(), k.to_string()),
                })
                .collect();
            let mut groups: Vec<String> = kinds.iter().map(|(g, _)| g.clone()).collect();
            groups.dedup();
            return RuleWithOperations {
                api_groups: Some(groups),
                api_versions: Some(vec!["*".into()]),
                operations: Some(vec!["CREATE".into()]),
                resources: Some(kinds.into_iter().map(|(_, r)| r).collect()),
                scope: Some("Namespaced".into()),
            };
        }
        let (op, resource) = match self {
            Hook::CollisionGuard => ("CREATE", "pods"),
            Hook::DisruptionTagger => ("UPDATE", "pods/status"),
            Hook::DeletionAudit => ("DELETE", "pods"),
            Hook::EvictionAudit => ("CREATE", "pods/eviction"),
            Hook::ReleaseFencing => ("UPDATE", "pods"),
            Hook::CollisionKinds => unreachable!("returned above"),
        };
        RuleWithOperations {
            api_groups: Some(vec![String::new()]),
            api_versions: Some(vec!["v1".into()]),
            operations: Some(vec![op.into()]),
            resources: Some(vec![resource.into()]),
            scope: Some("Namespaced".into()),
        }
    }
}

/// The chart's `matchConditions` (charts/graceguard/files/match-conditions.yaml).
const MATCH_CONDITIONS: &str =
    include_str!("../../../charts/graceguard/files/match-conditions.yaml");

fn match_conditions(hook: Hook) -> Result<Value> {
    let all: Value = serde_yaml_ng::from_str(MATCH_CONDITIONS)
        .context("reading charts/graceguard/files/match-conditions.yaml")?;
    let key = match hook {
        Hook::CollisionGuard => "collisionGuard",
        Hook::DisruptionTagger => "disruptionTagger",
        Hook::CollisionKinds => "collisionGuard",
        Hook::DeletionAudit => "deletionAudit",
        Hook::ReleaseFencing => "releaseFencing",
        Hook::EvictionAudit => return Ok(Value::Array(Vec::new())),
    };
    Ok(all[key].clone())
}

/// How [`WebhookProcess::register_with`] registers the endpoints.
#[derive(Clone, Debug, Default)]
pub struct Registration {
    /// Add the chart's `matchConditions` (Kubernetes >= 1.28), so the API server
    /// calls graceguard only for the requests that matter.
    pub match_conditions: bool,
    /// The `https://HOST:PORT` the API server calls instead of this process's
    /// own address (a balancer in front of several replicas).
    pub url: Option<String>,
    /// Return once the configurations exist, without waiting for the API
    /// server to call the webhook (for a webhook that refuses the API server).
    pub no_wait: bool,
}

/// The label [`WebhookProcess::register_with`] puts on its configurations,
/// so a floor can copy them ([`register_noop_like`]).
pub const REGISTERED_LABEL: (&str, &str) =
    ("testbed.graceguard.io/registered-by", "webhook-process");

pub use crate::control_plane::OPT_OUT_LABEL;

fn opt_out() -> LabelSelector {
    LabelSelector {
        match_expressions: Some(vec![LabelSelectorRequirement {
            key: OPT_OUT_LABEL.into(),
            operator: "NotIn".into(),
            values: Some(vec!["true".into()]),
        }]),
        match_labels: None,
    }
}

/// One webhook of a configuration as the bed registers it (failurePolicy
/// Ignore, the opt-out namespace selector but on the audits); one shape for
/// both kinds of webhook, each type reads the fields it has.
fn webhook_spec(h: Hook, base_url: &str, ca_pem: &str, with_conditions: bool) -> Result<Value> {
    let mut spec = serde_json::json!({
        "name": h.name(),
        "clientConfig": {
            "url": format!("{base_url}{}", h.path()),
            "caBundle": ByteString(ca_pem.as_bytes().to_vec()),
        },
        "rules": [h.rule()],
        "failurePolicy": "Ignore",
        "sideEffects": h.side_effects(),
        "admissionReviewVersions": ["v1"],
        "timeoutSeconds": 2,
        "matchPolicy": "Equivalent",
        "reinvocationPolicy": "Never",
    });
    // As the chart: the guard and the tagger honour the opt-out label, the
    // audits never (a label must not hide a deletion).
    if !h.is_audit() {
        spec["namespaceSelector"] = serde_json::to_value(opt_out())?;
    }
    if with_conditions {
        spec["matchConditions"] = match_conditions(h)?;
    }
    Ok(spec)
}

/// The name of the no-op floor [`register_noop`] registers.
pub const NOOP_NAME: &str = "noop.bench.graceguard.io";

/// Registers a server at `base_url` (serving a certificate `ca_pem` signs)
/// exactly as [`WebhookProcess::register_with`] registers the collision guard,
/// except that it is called only in namespaces labelled `label=true` (and
/// named [`NOOP_NAME`]): the floor any webhook costs the API server. Waits
/// until the API server calls it (its admission metric counts a dry-run
/// Create in namespace `probe_ns`) and accepts its answers.
pub async fn register_noop(
    bed: &TestBed,
    base_url: &str,
    ca_pem: &str,
    label: &str,
    probe_ns: &str,
    match_conditions: bool,
) -> Result<()> {
    let mut spec = webhook_spec(Hook::CollisionGuard, base_url, ca_pem, match_conditions)?;
    spec["name"] = Value::from(NOOP_NAME);
    spec["namespaceSelector"] = serde_json::json!({"matchLabels": {label: "true"}});
    let cfg = ValidatingWebhookConfiguration {
        metadata: ObjectMeta {
            name: Some("noop-bench".into()),
            ..Default::default()
        },
        webhooks: Some(vec![serde_json::from_value(spec)?]),
    };
    Api::<ValidatingWebhookConfiguration>::all(bed.client.clone())
        .create(&PostParams::default(), &cfg)
        .await
        .context("registering the no-op webhook")?;
    wait_noop_called(bed, probe_ns, NOOP_NAME).await
}

/// The no-op floor registered as an installed graceguard registered itself:
/// a copy of every webhook of the validating and mutating configurations
/// labelled `selector` (their rules, `matchConditions`, object selector,
/// failure policy and timeout), named `<prefix>-<name>`, called at `base_url`
/// on the same paths, only in namespaces labelled `label=true`. The floor
/// then receives exactly the calls graceguard receives (pod Creates, Deletes,
/// status updates, evictions), answered at once. Waits until the API server
/// calls the collision guard's copy (a dry-run Create in `probe_ns`) and
/// accepts its answers.
pub async fn register_noop_like(
    bed: &TestBed,
    selector: &str,
    prefix: &str,
    base_url: &str,
    ca_pem: &str,
    label: &str,
    probe_ns: &str,
) -> Result<()> {
    let redirect = |name: &mut String,
                    cc: &mut k8s_openapi::api::admissionregistration::v1::WebhookClientConfig,
                    ns: &mut Option<LabelSelector>| {
        // The path the original is called at: its Service's, or its URL's.
        let path = cc
            .service
            .as_ref()
            .and_then(|s| s.path.clone())
            .or_else(|| {
                let url = cc.url.as_deref()?;
                let rest = url.split_once("://").map_or(url, |(_, r)| r);
                rest.find('/').map(|i| rest[i..].to_string())
            })
            .unwrap_or_default();
        *name = format!("{prefix}-{name}");
        cc.service = None;
        cc.url = Some(format!("{base_url}{path}"));
        cc.ca_bundle = Some(ByteString(ca_pem.as_bytes().to_vec()));
        *ns = Some(LabelSelector {
            match_labels: Some([(label.to_string(), "true".to_string())].into()),
            match_expressions: None,
        });
    };
    let copy_meta = |name: String| ObjectMeta {
        name: Some(format!("{prefix}-{name}")),
        ..Default::default()
    };
    let lp = kube::api::ListParams::default().labels(selector);
    let validating: Api<ValidatingWebhookConfiguration> = Api::all(bed.client.clone());
    let mutating: Api<MutatingWebhookConfiguration> = Api::all(bed.client.clone());
    let mut copied = 0;
    for cfg in validating.list(&lp).await? {
        let mut copy = ValidatingWebhookConfiguration {
            metadata: copy_meta(kube::ResourceExt::name_any(&cfg)),
            webhooks: cfg.webhooks,
        };
        for w in copy.webhooks.iter_mut().flatten() {
            redirect(&mut w.name, &mut w.client_config, &mut w.namespace_selector);
            copied += 1;
        }
        validating
            .create(&PostParams::default(), &copy)
            .await
            .context("registering a no-op copy of a validating webhook")?;
    }
    for cfg in mutating.list(&lp).await? {
        let mut copy = MutatingWebhookConfiguration {
            metadata: copy_meta(kube::ResourceExt::name_any(&cfg)),
            webhooks: cfg.webhooks,
        };
        for w in copy.webhooks.iter_mut().flatten() {
            redirect(&mut w.name, &mut w.client_config, &mut w.namespace_selector);
            copied += 1;
        }
        mutating
            .create(&PostParams::default(), &copy)
            .await
            .context("registering a no-op copy of a mutating webhook")?;
    }
    anyhow::ensure!(
        copied > 0,
        "no webhook configuration is labelled {selector}: nothing to copy for the no-op floor"
    );
    wait_noop_called(
        bed,
        probe_ns,
        &format!("{prefix}-{}", Hook::CollisionGuard.name()),
    )
    .await
}

/// Waits until the API server has called webhook `name` for a dry-run pod
/// Create in `probe_ns`, and checks that it accepted the answer: a floor
/// whose answers the API server refuses (and fails open on) measures an
/// error path, not a webhook.
async fn wait_noop_called(bed: &TestBed, probe_ns: &str, name: &str) -> Result<()> {
    let api: Api<Pod> = Api::namespaced(bed.client.clone(), probe_ns);
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let named = |metrics: &str, series: &str| {
        crate::load::histogram::sum(metrics, series, &[("name", name)])
    };
    for n in 0.. {
        api.create(&dry, &crate::pods::task_pod(&format!("noop-probe-{n}"), 1))
            .await?;
        let metrics = bed.apiserver_metrics().await?;
        if named(
            &metrics,
            "apiserver_admission_webhook_admission_duration_seconds_count",
        ) > 0.0
        {
            let failed_open = named(&metrics, "apiserver_admission_webhook_fail_open_count");
            anyhow::ensure!(
                failed_open == 0.0,
                "the API server failed open on {failed_open} call(s) of the no-op webhook {name}: it refused its answers (a review response must carry the request's uid), so the floor would measure an error path"
            );
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("the API server did not call the no-op webhook {name} within 30 s of registering it");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// A running `graceguard-webhook serve`; killed when dropped.
pub struct WebhookProcess {
    proc: Managed,
    /// https://127.0.0.1:PORT
    pub url: String,
    /// http://127.0.0.1:PORT (health, readiness, metrics)
    pub health: String,
    pub ca_pem: String,
    pub log: PathBuf,
    /// Holds its ca.crt, tls.crt and tls.key.
    pub dir: PathBuf,
    /// The CA that signed its serving pair (not kept by a replica).
    ca: Option<Arc<graceguard_certs::Ca>>,
}

/// Audit record `r` is `endpoint`'s, about `namespace/name`.
fn is_about(r: &Value, endpoint: &str, namespace: &str, name: &str) -> bool {
    r["endpoint"] == endpoint && r["namespace"] == namespace && r["name"] == name
}

impl WebhookProcess {
    /// Starts the webhook as user `graceguard` with extra `args` (e.g.
    /// `["--mode", "retry"]`) and waits until `/readyz` answers 200.
    pub async fn start(bed: &TestBed, args: &[&str]) -> Result<Self> {
        Self::start_inner(bed, args, &[], false, None).await
    }

    /// [`WebhookProcess::start`] listening as the chart runs it on a pod
    /// network, on `[::]` (IPv4 and IPv6 alike), with a certificate for
    /// 127.0.0.1 and ::1; [`WebhookProcess::url`] is the IPv6 one,
    /// `https://[::1]:PORT`, so the API server calls it over IPv6.
    pub async fn start_dual_stack(bed: &TestBed, args: &[&str]) -> Result<Self> {
        let mut all = vec!["--listen-dual-stack"];
        all.extend_from_slice(args);
        Self::start_inner(bed, &all, &[], false, None).await
    }

    /// A second replica of `of`: same arguments style, same serving
    /// certificate (so one `caBundle` covers both behind one registration).
    pub async fn start_replica(bed: &TestBed, args: &[&str], of: &WebhookProcess) -> Result<Self> {
        Self::start_inner(bed, args, &[], false, Some(of)).await
    }

    /// [`WebhookProcess::start`] with `env` set and stdout going into a pipe
    /// that is never read (a stalled log pipeline); its audit records are lost.
    pub async fn start_with_stalled_stdout(
        bed: &TestBed,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Result<Self> {
        Self::start_inner(bed, args, env, true, None).await
    }

    async fn start_inner(
        bed: &TestBed,
        args: &[&str],
        env: &[(&str, &str)],
        stalled: bool,
        replica_of: Option<&WebhookProcess>,
    ) -> Result<Self> {
        let bin = binaries::workspace_bin("graceguard-webhook", "GRACEGUARD_WEBHOOK_BIN")?;
        // Not a flag of graceguard's: this bed's own marker for start_dual_stack.
        let dual_stack = args.first() == Some(&"--listen-dual-stack");
        let args = if dual_stack { &args[1..] } else { args };
        let (port, health_port) = (free_port()?, free_port()?);
        let dir = bed.dir().join(format!("webhook-{port}"));
        let (ca_pem, certs, ca) = match replica_of {
            Some(of) => {
                std::fs::create_dir_all(&dir)?;
                (of.ca_pem.clone(), of.dir.clone(), None)
            }
            None => {
                let ca = graceguard_certs::Ca::new("graceguard-webhook-test-ca")?;
                let pair = ca.issue_server(
                    &["localhost".into()],
                    &["127.0.0.1".parse()?, "::1".parse()?],
                )?;
                ca.write_files(&pair, &dir)?;
                (ca.cert_pem(), dir.clone(), Some(Arc::new(ca)))
            }
        };
        let mut cmd = Command::new(bin);
        let host = if dual_stack { "[::]" } else { "127.0.0.1" };
        cmd.arg("serve")
            .arg(format!("--listen={host}:{port}"))
            .arg(format!("--health-listen={host}:{health_port}"))
            .arg(format!("--tls-cert={}", certs.join("tls.crt").display()))
            .arg(format!("--tls-key={}", certs.join("tls.key").display()))
            .args(args)
            // The tests written for one mode name it; the others were written
            // for 409 answers (mode conflict), which `adaptive`, the default,
            // turns into 429s for a client that keeps re-creating a name.
            .env("GRACEGUARD_MODE", "conflict")
            .envs(env.iter().copied());
        // As user `graceguard`, unless the caller gives its own (say, through a proxy).
        if !args.iter().any(|a| a.starts_with("--kubeconfig")) {
            cmd.arg(format!(
                "--kubeconfig={}",
                bed.kubeconfig_for("graceguard")?.display()
            ));
        }
        let log = dir.join("webhook.log");
        let proc = if stalled {
            Managed::spawn_with_stalled_stdout("graceguard-webhook", cmd, &log)?
        } else {
            Managed::spawn("graceguard-webhook", cmd, &log)?
        };
        let mut w = Self {
            proc,
            url: if dual_stack {
                format!("https://[::1]:{port}")
            } else {
                format!("https://127.0.0.1:{port}")
            },
            health: format!("127.0.0.1:{health_port}"),
            ca_pem,
            log,
            dir,
            ca,
        };
        w.wait_ready().await?;
        Ok(w)
    }

    async fn wait_ready(&mut self) -> Result<()> {
        // Generous: at 100,000 pods the initial list alone takes a while on 2 cores.
        let deadline = Instant::now() + Duration::from_secs(180);
        loop {
            self.proc.check_running()?;
            if matches!(self.http_get("/readyz"), Ok((200, _))) {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "graceguard-webhook was not ready in 180 s; its log ends:\n{}",
                    tail(&self.log, 20)
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// GET `path` on the health port: (status code, body).
    pub fn http_get(&self, path: &str) -> Result<(u16, String)> {
        let mut s = TcpStream::connect(&self.health)?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        write!(s, "GET {path} HTTP/1.0\r\nHost: {}\r\n\r\n", self.health)?;
        let mut resp = String::new();
        s.read_to_string(&mut resp)?;
        let code = resp
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .with_context(|| format!("not an HTTP answer: {resp:?}"))?;
        let body = resp
            .split_once("\r\n\r\n")
            .map(|(_, b)| b.to_string())
            .unwrap_or_default();
        Ok((code, body))
    }

    /// The value of a metric sample (`name value`, or `name{labels} value`
    /// with `name` given with its labels), if exported.
    pub fn metric(&self, name: &str) -> Result<Option<f64>> {
        let (_, body) = self.http_get("/metrics")?;
        Ok(body.lines().find_map(|l| {
            let (n, v) = l.rsplit_once(' ')?;
            (n == name).then(|| v.trim().parse().ok()).flatten()
        }))
    }

    /// Waits (up to 60 s) until the webhook's index of `kind` (`resource[.group]`)
    /// is synced: a quota must count the kind first.
    pub async fn wait_kind_indexed(&self, kind: &str) -> Result<()> {
        let sample = format!("graceguard_kind_index_ready{{kind=\"{kind}\"}}");
        self.wait_metric(&sample, 1.0, Duration::from_secs(60))
            .await
    }

    /// Waits until the metric `sample` (see [`WebhookProcess::metric`]) is at
    /// least `value`, failing after `timeout` with the webhook's log.
    pub async fn wait_metric(&self, sample: &str, value: f64, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        while self.metric(sample)?.unwrap_or(f64::MIN) < value {
            if Instant::now() > deadline {
                bail!(
                    "{sample} did not reach {value} within {timeout:?}; graceguard-webhook's log ends:\n{}",
                    tail(&self.log, 20)
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }

    /// Every endpoint registered as the chart registers them, with its
    /// `matchConditions` (Kubernetes >= 1.28).
    pub async fn register_as_the_chart_does(&self, bed: &TestBed) -> Result<()> {
        let how = Registration {
            match_conditions: true,
            ..Default::default()
        };
        self.register_with(bed, ALL_HOOKS, how).await
    }

    /// Registers `hooks` with the bed's API server (failurePolicy Ignore) and
    /// waits until the API server demonstrably calls each of them.
    pub async fn register(&self, bed: &TestBed, hooks: &[Hook]) -> Result<()> {
        self.register_with(bed, hooks, Registration::default())
            .await
    }

    /// [`WebhookProcess::register`] with options.
    pub async fn register_with(
        &self,
        bed: &TestBed,
        hooks: &[Hook],
        how: Registration,
    ) -> Result<()> {
        let base = how.url.as_deref().unwrap_or(&self.url);
        let spec = |h: &Hook| webhook_spec(*h, base, &self.ca_pem, how.match_conditions);
        let validating: Vec<ValidatingWebhook> = hooks
            .iter()
            .filter(|h| **h != Hook::DisruptionTagger)
            .map(|h| Ok(serde_json::from_value(spec(h)?)?))
            .collect::<Result<_>>()?;
        let mutating: Vec<MutatingWebhook> = hooks
            .iter()
            .filter(|h| **h == Hook::DisruptionTagger)
            .map(|h| Ok(serde_json::from_value(spec(h)?)?))
            .collect::<Result<_>>()?;
        let meta = ObjectMeta {
            name: Some("graceguard".into()),
            labels: Some(
                [(
                    REGISTERED_LABEL.0.to_string(),
                    REGISTERED_LABEL.1.to_string(),
                )]
                .into(),
            ),
            ..Default::default()
        };
        if !validating.is_empty() {
            let cfg = ValidatingWebhookConfiguration {
                metadata: meta.clone(),
                webhooks: Some(validating),
            };
            Api::<ValidatingWebhookConfiguration>::all(bed.client.clone())
                .create(&PostParams::default(), &cfg)
                .await
                .context("registering the validating webhooks")?;
        }
        if !mutating.is_empty() {
            let cfg = MutatingWebhookConfiguration {
                metadata: meta,
                webhooks: Some(mutating),
            };
            Api::<MutatingWebhookConfiguration>::all(bed.client.clone())
                .create(&PostParams::default(), &cfg)
                .await
                .context("registering the mutating webhook")?;
        }
        if how.no_wait {
            return Ok(());
        }
        self.wait_effective(bed, hooks, how).await
    }

    /// The API server picks up webhook configurations asynchronously. Probe
    /// requests (in namespace `graceguard-probe`, dry-run where possible) are
    /// sent until the webhook has logged one for each hook.
    async fn wait_effective(&self, bed: &TestBed, hooks: &[Hook], how: Registration) -> Result<()> {
        const NS: &str = "graceguard-probe";
        const POD: &str = "registration-probe";
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(NS.into()),
                ..Default::default()
            },
            ..Default::default()
        };
        let _ = Api::<Namespace>::all(bed.client.clone())
            .create(&PostParams::default(), &ns)
            .await;
        let api: Api<Pod> = Api::namespaced(bed.client.clone(), NS);
        if api.get_opt(POD).await?.is_none() {
            api.create(&PostParams::default(), &crate::pods::task_pod(POD, 1))
                .await?;
        }
        let dry = PostParams {
            dry_run: true,
            ..Default::default()
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut pending: Vec<Hook> = hooks.to_vec();
        let mut n = 0;
        while !pending.is_empty() {
            n += 1;
            for hook in &pending {
                match hook {
                    Hook::CollisionGuard => {
                        api.create(&dry, &crate::pods::task_pod(&format!("probe-{n}"), 1))
                            .await?;
                    }
                    Hook::DisruptionTagger => {
                        // With matchConditions only a DisruptionTarget reaches the
                        // tagger: the probe pod carries one with a reason that never
                        // matches its label.
                        let mut status =
                            serde_json::json!({"status": {"message": format!("probe {n}")}});
                        if how.match_conditions {
                            status["status"]["conditions"] = serde_json::json!([{
                                "type": "DisruptionTarget", "status": "True",
                                "reason": format!("RegistrationProbe{n}"),
                                "message": "probe", "lastTransitionTime": crate::clock::now_rfc3339(),
                            }]);
                        }
                        api.patch_status(POD, &PatchParams::default(), &Patch::Strategic(&status))
                            .await?;
                    }
                    Hook::DeletionAudit => {
                        let dp = DeleteParams {
                            dry_run: true,
                            ..Default::default()
                        };
                        api.delete(POD, &dp).await?;
                    }
                    Hook::EvictionAudit => {
                        crate::pods::evict(&bed.client, NS, POD, None, true).await?;
                    }
                    Hook::ReleaseFencing => {
                        // A new released-under value each round: an update
                        // the matchConditions pass (its Lease unknown: allowed).
                        let patch = serde_json::json!({"metadata": {"annotations": {
                            graceguard_contract::fencing::RELEASED_UNDER: format!("{NS}/probe/probe/{n}"),
                        }}});
                        api.patch(POD, &PatchParams::default(), &Patch::Merge(&patch))
                            .await?;
                    }
                    Hook::CollisionKinds => {
                        let cm: k8s_openapi::api::core::v1::ConfigMap = serde_json::from_value(
                            serde_json::json!({"metadata": {"name": format!("probe-{n}")}}),
                        )?;
                        Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(
                            bed.client.clone(),
                            NS,
                        )
                        .create(&dry, &cm)
                        .await?;
                    }
                }
            }
            let records = self.audit_records()?;
            pending.retain(|h| {
                // Pods and the other kinds share an endpoint; `resource` tells them apart.
                let kinds = *h == Hook::CollisionKinds;
                !records.iter().any(|r| {
                    r["endpoint"] == h.endpoint()
                        && r["namespace"] == NS
                        && r["resource"].is_string() == kinds
                })
            });
            if Instant::now() > deadline {
                bail!("the API server did not call {pending:?} within 30 s of registering them");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }

    /// Every audit record the webhook has written so far (its stdout, parsed).
    pub fn audit_records(&self) -> Result<Vec<Value>> {
        let text = std::fs::read_to_string(&self.log)
            .with_context(|| format!("reading {}", self.log.display()))?;
        Ok(text
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|v| v["target"] == "graceguard::audit")
            .collect())
    }

    /// The webhook's audit records about `namespace/name` for `endpoint`.
    pub fn records_for(&self, endpoint: &str, namespace: &str, name: &str) -> Result<Vec<Value>> {
        Ok(self
            .audit_records()?
            .into_iter()
            .filter(|r| is_about(r, endpoint, namespace, name))
            .collect())
    }

    /// Writes a new serving pair from the same CA over the files it serves
    /// (as cert-manager renewing its Secret does); it is picked up at the next
    /// `--cert-reload-interval` tick.
    pub fn rotate_certificate(&self) -> Result<()> {
        let ca = self
            .ca
            .as_ref()
            .context("a replica shares its pair with the first process: rotate that one")?;
        let pair = ca.issue_server(&["localhost".into()], &["127.0.0.1".parse()?])?;
        ca.write_files(&pair, &self.dir)?;
        Ok(())
    }

    /// Waits (up to 30 s, as [`WebhookProcess::wait_record`]) until a line
    /// of its log contains `needle`; how many do then. The log is written
    /// from a writer thread, a moment (seconds, on a loaded machine) after
    /// the event.
    pub async fn wait_log_line(&self, needle: &str) -> Result<usize> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let n = self.log_lines_with(needle)?;
            if n > 0 {
                return Ok(n);
            }
            if Instant::now() > deadline {
                bail!(
                    "no line with {needle:?} in graceguard-webhook's log within 30 s; it ends:\n{}",
                    tail(&self.log, 10)
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// How many lines of its log contain `needle`.
    pub fn log_lines_with(&self, needle: &str) -> Result<usize> {
        let text = std::fs::read_to_string(&self.log)
            .with_context(|| format!("reading {}", self.log.display()))?;
        Ok(text.lines().filter(|l| l.contains(needle)).count())
    }

    /// Where to send reviews, for the load generator (HTTP/2, as the API
    /// server calls webhooks).
    pub fn target(&self, path: &str) -> Result<crate::load::loadgen::Target> {
        let addr = self
            .url
            .strip_prefix("https://")
            .unwrap_or(&self.url)
            .parse()
            .with_context(|| format!("{} is not an https://ADDRESS", self.url))?;
        Ok(crate::load::loadgen::Target {
            addr,
            path: path.into(),
            ca_pem: self.ca_pem.clone(),
            protocol: crate::load::loadgen::Protocol::H2,
        })
    }

    /// Sends one HTTP/1.1 POST of an empty body to the admission port over
    /// TLS, presenting `client` (a certificate and key, PEM) if given: the
    /// status code when the webhook answered, `None` when it ended the
    /// connection without an answer (a refused client certificate surfaces
    /// after a TLS 1.3 handshake, at the first read).
    pub async fn answer_over_tls(
        &self,
        client: Option<&graceguard_certs::ServingPair>,
    ) -> Result<Option<u16>> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let target = self.target("/validate/pods")?;
        let cfg = crate::load::loadgen::client_config(&self.ca_pem, client)?;
        let tcp = tokio::net::TcpStream::connect(target.addr).await?;
        let mut tls = match tokio_rustls::TlsConnector::from(std::sync::Arc::new(cfg))
            .connect(
                rustls::pki_types::ServerName::try_from("localhost")?.to_owned(),
                tcp,
            )
            .await
        {
            Ok(t) => t,
            Err(_) => return Ok(None),
        };
        let req = "POST /validate/pods HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}";
        if tls.write_all(req.as_bytes()).await.is_err() {
            return Ok(None);
        }
        let mut resp = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(10), tls.read_to_end(&mut resp)).await;
        if !matches!(read, Ok(Ok(_))) && resp.is_empty() {
            return Ok(None);
        }
        let text = String::from_utf8_lossy(&resp);
        Ok(text
            .strip_prefix("HTTP/1.1 ")
            .and_then(|rest| rest.get(..3))
            .and_then(|code| code.parse().ok()))
    }

    /// The process id (for memory and CPU readings).
    pub fn pid(&self) -> u32 {
        self.proc.pid()
    }

    /// Waits (up to 30 s, as [`WebhookProcess::wait_record`]) until at least
    /// `n` records match [`WebhookProcess::records_for`]; returns them (fewer
    /// if time ran out). The webhook writes its log from a writer thread, a
    /// moment after answering; on a loaded machine that moment can be seconds.
    pub async fn wait_records(
        &self,
        endpoint: &str,
        namespace: &str,
        name: &str,
        n: usize,
    ) -> Result<Vec<Value>> {
        self.wait_matching(n, |r| is_about(r, endpoint, namespace, name))
            .await
    }

    /// Waits (up to 30 s) until at least `n` audit records match `pred`;
    /// returns them (fewer if time ran out), for counts over many names.
    pub async fn wait_matching(
        &self,
        n: usize,
        pred: impl Fn(&Value) -> bool,
    ) -> Result<Vec<Value>> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let recs: Vec<Value> = self
                .audit_records()?
                .into_iter()
                .filter(|r| pred(r))
                .collect();
            if recs.len() >= n || Instant::now() > deadline {
                return Ok(recs);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits (up to 30 s) until an audit record matches `pred`; returns it.
    pub async fn wait_record(&self, pred: impl Fn(&Value) -> bool) -> Result<Value> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(r) = self.audit_records()?.into_iter().find(|r| pred(r)) {
                return Ok(r);
            }
            if Instant::now() > deadline {
                bail!(
                    "no matching audit record within 30 s; graceguard-webhook's log ends:\n{}",
                    tail(&self.log, 10)
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Kills the process (SIGKILL), as a crash would.
    pub fn kill(&mut self) {
        self.proc.kill();
    }

    /// Sends SIGTERM without waiting (the webhook keeps serving for its
    /// `--shutdown-delay`, with /readyz failing).
    pub fn sigterm(&self) {
        self.proc.sigterm();
    }

    /// Stops it with SIGTERM, as Kubernetes does; how it exited (`None`: it
    /// had to be killed after 25 s).
    pub fn terminate(&mut self) -> Option<std::process::ExitStatus> {
        self.proc.stop(Duration::from_secs(25))
    }
}

/// Of one pod's deletion audit records, those whose review can have begun
/// its deletion: not yet terminating, at the newest version of the pod any
/// such review showed. The API server reviews a DELETE again, with the pod as
/// it then is, when its write meets a newer version (the generic store's
/// `GuaranteedUpdate` runs the delete validation in every try), so one
/// deletion can have earlier records, at older versions, that began nothing.
pub fn deletion_beginnings(records: &[Value]) -> Vec<&Value> {
    let version = |r: &Value| {
        r["resource_version"]
            .as_str()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let not_terminating: Vec<&Value> = records
        .iter()
        .filter(|r| r["already_terminating"] == false)
        .collect();
    let newest = not_terminating.iter().map(|r| version(r)).max();
    not_terminating
        .into_iter()
        .filter(|r| Some(version(r)) == newest)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::deletion_beginnings;
    use serde_json::json;

    #[test]
    fn a_review_repeated_at_a_newer_version_is_the_one_that_can_have_begun_the_deletion() {
        let records = [
            // The scheduler's DELETE, first reviewed before its condition was read.
            json!({"already_terminating": false, "resource_version": "980", "reason": "unexplained"}),
            json!({"already_terminating": false, "resource_version": "981", "reason": "disruption"}),
            // The kubelet's final delete (already terminating) never counts.
            json!({"already_terminating": true, "resource_version": "990"}),
        ];
        let began = deletion_beginnings(&records);
        assert_eq!(began.len(), 1, "{began:?}");
        assert_eq!(began[0]["reason"], "disruption");
        // Two reviews at the same version (two clients racing) stay two:
        // nothing here says which one won.
        let racing = [
            json!({"already_terminating": false, "resource_version": "5"}),
            json!({"already_terminating": false, "resource_version": "5"}),
        ];
        assert_eq!(deletion_beginnings(&racing).len(), 2);
        assert!(deletion_beginnings(&records[2..]).is_empty());
    }
}
