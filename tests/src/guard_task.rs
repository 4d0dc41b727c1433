//! Running a task through the guard library in the background, with its
//! transitions collected, for the end-to-end tests and the demo.

use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use graceguard::{Guard, GuardConfig, Outcome, TaskSpec, Transition};
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// A task running in the background.
pub struct RunningTask {
    pub handle: JoinHandle<Result<Outcome, graceguard::GuardError>>,
    rx: mpsc::UnboundedReceiver<Transition>,
    /// Every transition received so far, in order.
    pub seen: Vec<Transition>,
}

/// The spec the tests use: instance `exec-1`, 2 retries, 3 system failures.
pub fn spec(task: &str, ns: &str) -> TaskSpec {
    TaskSpec {
        retries: 2,
        max_system_failures: 3,
        ..TaskSpec::new(task, ns, "exec-1")
    }
}

impl RunningTask {
    /// Starts `spec` from `template` with a guard using `client`.
    pub fn start(client: Client, spec: TaskSpec, template: Pod) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let handle = tokio::spawn(async move {
            let guard = Guard::new(client, GuardConfig::new(&spec.instance));
            guard
                .run(spec, template, |t| {
                    let _ = tx.send(t.clone());
                })
                .await
        });
        Self {
            handle,
            rx,
            seen: Vec::new(),
        }
    }

    /// Waits (up to `within`) for a transition matching `pred`; returns it.
    pub async fn wait_for(
        &mut self,
        within: Duration,
        pred: impl Fn(&Transition) -> bool,
    ) -> Result<Transition> {
        if let Some(t) = self.seen.iter().find(|t| pred(t)) {
            return Ok(t.clone());
        }
        let deadline = Instant::now() + within;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, self.rx.recv()).await {
                Ok(Some(t)) => {
                    self.seen.push(t.clone());
                    if pred(&t) {
                        return Ok(t);
                    }
                }
                Ok(None) => bail!(
                    "the task ended without the expected transition; saw {:?}",
                    self.seen
                ),
                Err(_) => bail!(
                    "no expected transition within {within:?}; saw {:?}",
                    self.seen
                ),
            }
        }
    }

    /// Waits for the task to end; returns its outcome (and drains transitions).
    pub async fn finish(mut self, within: Duration) -> Result<(Outcome, Vec<Transition>)> {
        let outcome = tokio::time::timeout(within, &mut self.handle).await??;
        while let Ok(t) = self.rx.try_recv() {
            self.seen.push(t);
        }
        Ok((outcome?, self.seen))
    }
}

/// `phase[/reason]@attempt` for each transition, for compact assertions.
pub fn summary(ts: &[Transition]) -> Vec<String> {
    ts.iter()
        .map(|t| match &t.reason {
            Some(r) => format!(
                "{}/{}@{}",
                t.phase,
                r.split(':').next().unwrap_or(""),
                t.attempt
            ),
            None => format!("{}@{}", t.phase, t.attempt),
        })
        .collect()
}

/// A bed with the API server's audit log on, and a fresh namespace named
/// after `prefix`: what the guard's end-to-end tests count requests with.
pub async fn audited_bed(prefix: &str) -> Result<(testbed::TestBed, String)> {
    let bed = testbed::TestBed::start_with(testbed::TestBedOptions {
        audit: true,
        ..Default::default()
    })
    .await?;
    let ns = bed.namespace(prefix).await?;
    Ok((bed, ns))
}

/// Attempt 0 of task `<name without -0>` as executor `instance` launched it:
/// the labels adoption goes by.
pub fn managed_pod(name: &str, instance: &str) -> Pod {
    use graceguard::core::naming::{
        ATTEMPT_LABEL, INSTANCE_LABEL, MANAGED_BY, MANAGED_BY_LABEL, TASK_LABEL,
    };
    let mut p = testbed::pods::task_pod(name, 30);
    let labels = p.metadata.labels.get_or_insert_with(Default::default);
    labels.insert(MANAGED_BY_LABEL.into(), MANAGED_BY.into());
    labels.insert(INSTANCE_LABEL.into(), instance.into());
    labels.insert(TASK_LABEL.into(), name.trim_end_matches("-0").into());
    labels.insert(ATTEMPT_LABEL.into(), "0".into());
    p
}

/// The duration of a dead instance's Lease for [`instance_lease`]: nothing
/// renews it, so an adopter sees it lapse a second after it first sees it.
pub const DEAD: i32 = 1;
/// The duration of a live instance's Lease: longer than any test.
pub const LIVE: i32 = 3600;

/// Executor `instance`'s Lease in `ns`, held for `duration_secs` and never
/// renewed: adopters judge expiry by the renewals they see themselves, so
/// it lapses `duration_secs` after an adopter first reads it ([`DEAD`],
/// [`LIVE`]).
pub async fn instance_lease(
    bed: &testbed::TestBed,
    ns: &str,
    instance: &str,
    duration_secs: i32,
) -> Result<()> {
    use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    let renewed = k8s_openapi::jiff::Timestamp::now();
    let l = Lease {
        metadata: kube::api::ObjectMeta {
            name: Some(graceguard::runtime::lease::lease_name(instance)),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(instance.into()),
            lease_duration_seconds: Some(duration_secs),
            renew_time: Some(MicroTime(renewed)),
            ..Default::default()
        }),
    };
    kube::Api::<Lease>::namespaced(bed.client.clone(), ns)
        .create(&kube::api::PostParams::default(), &l)
        .await?;
    Ok(())
}
