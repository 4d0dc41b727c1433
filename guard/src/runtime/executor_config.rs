//! How an executor behaves.

use std::time::Duration;

use crate::core::backoff::BackoffPolicy;
use crate::runtime::lease::Fence;

/// How an [`crate::runtime::executor::Executor`] behaves.
#[derive(Clone, Debug)]
pub struct ExecutorConfig {
    /// This executor instance's name (pod labels, adoption, its Lease).
    pub instance: String,
    /// Watch this namespace only (`None`: all namespaces, which needs
    /// cluster-wide list and watch on pods).
    pub namespace: Option<String>,
    /// Quota backoff, shared per namespace (default 1 s doubling to 60 s).
    pub quota_backoff: BackoffPolicy,
    /// Backoff for 429s, 5xx and timeouts (default 200 ms doubling to 10 s).
    pub transient_backoff: BackoffPolicy,
    /// Publish each transition as a Kubernetes Event on the pod.
    pub publish_events: bool,
    /// Pod Creates, reads and deletes in flight at once (default 16): a
    /// thousand tasks submitted together queue here instead of meeting the
    /// API server's priority and fairness limits (429) all at once.
    pub max_in_flight: usize,
    /// Whether this process may act for the instance (its Lease,
    /// [`crate::runtime::lease::InstanceLease::hold`]): while it does not, nothing is
    /// launched and nothing is marked done. Open by default.
    pub fence: Fence,
    /// A task whose result was acknowledged is forgotten this long after
    /// (its status is no longer served; `None`: kept until the process
    /// ends). Default 10 minutes: memory stays bounded in a long-lived
    /// sidecar.
    pub forget_after: Option<Duration>,
    /// Most tasks known at once (submitted, or taken up from their pods);
    /// one more is refused (`TaskError::TooManyTasks`) until some are
    /// forgotten. Default 100,000.
    pub max_tasks: usize,
    /// Most bytes of templates held at once (each counted as submitted); a
    /// task whose template would pass it is refused. Default 512 MiB: with
    /// templates of up to 2 MiB each, the sidecar's memory stays bounded.
    pub max_template_bytes: usize,
    /// How long a deleted pod is kept for a result nobody acknowledges
    /// (`None`: until it is). Past it the result finalizer lets go, with a
    /// Warning event `ResultHeldTooLong` on the pod: an executor that stops
    /// reading its events must not keep pods in the API for ever. Default
    /// 7 days; the alert `GraceguardSidecarResultsUnacknowledged` fires
    /// long before.
    pub max_result_hold: Option<Duration>,
}

impl ExecutorConfig {
    pub fn new(instance: &str) -> Self {
        Self {
            instance: instance.to_string(),
            namespace: None,
            quota_backoff: BackoffPolicy::default(),
            transient_backoff: BackoffPolicy {
                min: Duration::from_millis(200),
                max: Duration::from_secs(10),
                seed: None,
            },
            publish_events: true,
            max_in_flight: 16,
            fence: Fence::open(),
            forget_after: Some(Duration::from_secs(600)),
            max_tasks: 100_000,
            max_template_bytes: 512 * 1024 * 1024,
            max_result_hold: Some(Duration::from_secs(7 * 24 * 3600)),
        }
    }
}
