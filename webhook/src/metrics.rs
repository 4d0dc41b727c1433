//! Prometheus metrics, served as text on the health port's `/metrics`.

use std::sync::Arc;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

/// The admission endpoints.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Endpoint {
    collision_guard,
    disruption_tagger,
    deletion_audit,
    eviction_audit,
    /// The fencing check of the guard's result-finalizer releases.
    release_fencing,
}

impl Endpoint {
    pub fn as_str(self) -> &'static str {
        match self {
            Endpoint::collision_guard => "collision_guard",
            Endpoint::disruption_tagger => "disruption_tagger",
            Endpoint::deletion_audit => "deletion_audit",
            Endpoint::eviction_audit => "eviction_audit",
            Endpoint::release_fencing => "release_fencing",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReviewLabels {
    pub endpoint: Endpoint,
    pub decision: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EndpointLabels {
    pub endpoint: Endpoint,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: String,
}

/// The `DisruptionTarget` reasons Kubernetes writes; any other is counted as
/// `Other`, so a status writer cannot grow the metric without bound.
pub const KNOWN_REASONS: &[&str] = &[
    "PreemptionByScheduler",
    "DeletionByTaintManager",
    "EvictionByEvictionAPI",
    "DeletionByPodGC",
    "TerminationByKubelet",
];

/// The `disruption_tags` labels for `reason`.
pub fn reason_labels(reason: &str) -> ReasonLabels {
    let known = KNOWN_REASONS.iter().find(|r| **r == reason);
    ReasonLabels {
        reason: known.map_or("Other", |r| r).to_string(),
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    /// `resource[.group]`.
    pub kind: String,
}

impl KindLabels {
    pub fn of(kind: &crate::quota_kinds::GroupResource) -> Self {
        Self {
            kind: kind.to_string(),
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FollowUpLabels {
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConnectionEndLabels {
    /// Why graceguard ended a connection: `idle`, `max_age`, `shutdown`.
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LimitLabels {
    /// Which limit: `in_flight`, `body_bytes`, `body_timeout`,
    /// `connections_per_client`.
    pub limit: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModeLabels {
    pub mode: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ExplainedLabels {
    pub explained: &'static str,
}

/// Every metric the webhook exports. Cheap to clone (each is an `Arc`).
#[derive(Clone)]
pub struct Metrics {
    pub reviews: Family<ReviewLabels, Counter>,
    pub review_seconds: Family<EndpointLabels, Histogram>,
    pub bad_requests: Counter,
    pub index_pods: Gauge,
    pub index_ready: Gauge,
    pub confirmation_gets: Counter,
    pub confirmation_errors: Counter,
    pub quota_charges_prevented: Counter,
    pub fenced_writes_refused: Counter,
    pub livelock_suspected: Counter,
    pub retry_answers: Family<ModeLabels, Counter>,
    pub disruption_tags: Family<ReasonLabels, Counter>,
    pub deletions_audited: Family<ExplainedLabels, Counter>,
    pub evictions_audited: Counter,
    pub eviction_outcomes: Family<OutcomeLabels, Counter>,
    pub node_requests_left_unchanged: Counter,
    pub running_pods_left_unchanged: Counter,
    pub follow_ups: Family<FollowUpLabels, Counter>,
    pub follow_ups_dropped: Counter,
    pub kind_index_objects: Family<KindLabels, Gauge>,
    pub kind_index_ready: Family<KindLabels, Gauge>,
    pub kind_index_over_cap: Family<KindLabels, Gauge>,
    pub audit_records_dropped: Counter,
    pub certificate_expiry: Gauge,
    pub limited: Family<LimitLabels, Counter>,
    /// Connections graceguard ended gracefully, by why.
    pub connections_ended: Family<ConnectionEndLabels, Counter>,
    /// Each endpoint's review series, resolved once: the admission path
    /// increments them without a label hash or the family's lock.
    handles: Arc<[ReviewHandles; ENDPOINTS.len()]>,
}

/// One endpoint's `admission_reviews` and `admission_review_seconds` series.
#[derive(Clone)]
pub struct ReviewHandles {
    pub allowed: Counter,
    pub denied: Counter,
    pub seconds: Histogram,
}

/// `admission_review_seconds`' bucket bounds: 10 µs (an index lookup) to
/// 30 s (the longest webhook timeout Kubernetes allows), dense around the
/// 1 s confirmation timeout and the chart's 2 s webhook timeout, so a
/// quantile near the timeout is measured instead of landing in `+Inf`.
pub const REVIEW_SECONDS_BUCKETS: [f64; 21] = [
    0.000_01, 0.000_025, 0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025,
    0.05, 0.1, 0.25, 0.5, 1.0, 1.5, 2.0, 3.0, 10.0, 30.0,
];

/// `graceguard_build_info`: which code a replica runs.
pub fn build_info() -> Info<Vec<(&'static str, &'static str)>> {
    Info::new(graceguard_contract::build::labels())
}

const ENDPOINTS: [Endpoint; 5] = [
    Endpoint::collision_guard,
    Endpoint::disruption_tagger,
    Endpoint::deletion_audit,
    Endpoint::eviction_audit,
    Endpoint::release_fencing,
];

impl Metrics {
    /// The series of `endpoint`'s reviews.
    pub fn review(&self, endpoint: Endpoint) -> &ReviewHandles {
        &self.handles[endpoint as usize]
    }

    /// The metrics and the registry that exports them.
    pub fn new() -> (Self, Arc<Registry>) {
        let reviews: Family<ReviewLabels, Counter> = Family::default();
        let review_seconds: Family<EndpointLabels, Histogram> =
            Family::new_with_constructor(|| Histogram::new(REVIEW_SECONDS_BUCKETS));
        let handles = Arc::new(ENDPOINTS.map(|endpoint| {
            let counter = |decision| {
                reviews
                    .get_or_create(&ReviewLabels { endpoint, decision })
                    .clone()
            };
            ReviewHandles {
                allowed: counter("allow"),
                denied: counter("deny"),
                seconds: review_seconds
                    .get_or_create(&EndpointLabels { endpoint })
                    .clone(),
            }
        }));
        let m = Self {
            reviews,
            review_seconds,
            handles,
            bad_requests: Counter::default(),
            index_pods: Gauge::default(),
            index_ready: Gauge::default(),
            confirmation_gets: Counter::default(),
            confirmation_errors: Counter::default(),
            quota_charges_prevented: Counter::default(),
            fenced_writes_refused: Counter::default(),
            livelock_suspected: Counter::default(),
            retry_answers: Family::default(),
            disruption_tags: Family::default(),
            deletions_audited: Family::default(),
            evictions_audited: Counter::default(),
            eviction_outcomes: Family::default(),
            node_requests_left_unchanged: Counter::default(),
            running_pods_left_unchanged: Counter::default(),
            follow_ups: Family::default(),
            follow_ups_dropped: Counter::default(),
            kind_index_objects: Family::default(),
            kind_index_ready: Family::default(),
            kind_index_over_cap: Family::default(),
            audit_records_dropped: Counter::default(),
            certificate_expiry: Gauge::default(),
            limited: Family::default(),
            connections_ended: Family::default(),
        };
        // Series whose label values are known up front exist from the start
        // at 0, so `rate()` and `increase()` see their first event.
        for explained in ["yes", "no"] {
            let _ = m
                .deletions_audited
                .get_or_create(&ExplainedLabels { explained });
        }
        for reason in KNOWN_REASONS.iter().chain(&["Other"]) {
            let _ = m.disruption_tags.get_or_create(&reason_labels(reason));
        }
        for mode in crate::mode::Mode::ANSWERING_429 {
            let _ = m.retry_answers.get_or_create(&ModeLabels {
                mode: mode.as_str(),
            });
        }
        let mut r = Registry::with_prefix("graceguard");
        r.register(
            "build",
            "The version and source revision running",
            build_info(),
        );
        r.register(
            "admission_reviews",
            "Admission reviews answered, by endpoint and decision",
            m.reviews.clone(),
        );
        r.register(
            "admission_review_seconds",
            "Time to answer an admission review, by endpoint",
            m.review_seconds.clone(),
        );
        r.register(
            "admission_limited",
            "Admission requests and connections refused at once by a limit of the port (load shed, so the API server applies failurePolicy instead of waiting), by limit",
            m.limited.clone(),
        );
        r.register(
            "connections_ended",
            "Connections graceguard ended gracefully (HTTP/2 GOAWAY, HTTP/1 Connection: close; nothing in flight is cut), by reason: idle, max_age, shutdown",
            m.connections_ended.clone(),
        );
        r.register(
            "bad_requests",
            "Requests that were not a readable AdmissionReview",
            m.bad_requests.clone(),
        );
        r.register("index_pods", "Pods in the name index", m.index_pods.clone());
        r.register(
            "index_ready",
            "1 when the pod index is synced and its watch healthy",
            m.index_ready.clone(),
        );
        r.register(
            "confirmation_gets",
            "Live GETs issued to confirm an index hit",
            m.confirmation_gets.clone(),
        );
        r.register(
            "confirmation_errors",
            "Confirmations that failed (the Create was allowed)",
            m.confirmation_errors.clone(),
        );
        r.register(
            "quota_charges_prevented",
            "Colliding pod Creates denied before ResourceQuota admission (dry runs excluded)",
            m.quota_charges_prevented.clone(),
        );
        r.register(
            "fenced_writes_refused",
            "Writes refused because the guard process that sent them no longer held its instance Lease (dry runs included)",
            m.fenced_writes_refused.clone(),
        );
        r.register(
            "livelock_suspected",
            "Clients named for looping on a taken pod name",
            m.livelock_suspected.clone(),
        );
        r.register(
            "collision_retry_answers",
            "Colliding Creates graceguard answered 429 TooManyRequests with retryAfterSeconds, by mode (dry runs excluded): graceguard's own 429s, apart from the API server's priority-and-fairness throttling",
            m.retry_answers.clone(),
        );
        r.register(
            "disruption_tags",
            "Pods tagged with their DisruptionTarget reason, by reason",
            m.disruption_tags.clone(),
        );
        r.register(
            "deletions_audited",
            "Pod deletions audited, by whether a DisruptionTarget condition explains them",
            m.deletions_audited.clone(),
        );
        r.register(
            "evictions_audited",
            "Eviction attempts audited at admission (evictions never reach the DELETE webhook)",
            m.evictions_audited.clone(),
        );
        r.register(
            "eviction_outcomes",
            "Eviction attempts by what became of them: evicted (the pod's deletion began), not_evicted (refused or failed), untracked (too many pending)",
            m.eviction_outcomes.clone(),
        );
        r.register(
            "node_requests_left_unchanged",
            "Node status updates carrying an untagged DisruptionTarget, allowed unchanged (NodeRestriction would refuse a tag)",
            m.node_requests_left_unchanged.clone(),
        );
        r.register(
            "running_pods_left_unchanged",
            "Status updates carrying an untagged DisruptionTarget for a pod still running, allowed unchanged (a metadata change would delay its termination); tagged once its deletion begins",
            m.running_pods_left_unchanged.clone(),
        );
        r.register(
            "follow_up_tags",
            "Follow-up tagging under graceguard's own identity, by outcome",
            m.follow_ups.clone(),
        );
        r.register(
            "follow_up_tags_dropped",
            "Follow-up tagging requests dropped because the queue was full",
            m.follow_ups_dropped.clone(),
        );
        r.register(
            "audit_records_dropped",
            "Log records (audit records among them) dropped because stdout stalled; admission never waits on the log",
            m.audit_records_dropped.clone(),
        );
        r.register(
            "certificate_expiry_timestamp_seconds",
            "When the serving certificate in use expires (unix seconds); alert well before it",
            m.certificate_expiry.clone(),
        );
        r.register(
            "kind_index_objects",
            "Objects in the name index of a kind some quota counts (pods: index_pods)",
            m.kind_index_objects.clone(),
        );
        r.register(
            "kind_index_ready",
            "1 when that kind's index is synced and its watch healthy",
            m.kind_index_ready.clone(),
        );
        r.register(
            "kind_index_over_cap",
            "1 while that kind has more objects than --kind-index-max-objects: its index holds none and its Creates are allowed unchecked",
            m.kind_index_over_cap.clone(),
        );
        (m, Arc::new(r))
    }
}

/// The registry in Prometheus text format.
pub fn render(registry: &Registry) -> String {
    let mut out = String::new();
    if let Err(e) = prometheus_client::encoding::text::encode(&mut out, registry) {
        tracing::warn!(error = %e, "encoding metrics failed");
    }
    out
}

#[cfg(test)]
mod handle_tests {
    use super::*;

    #[test]
    fn build_info_names_the_version_and_a_revision() {
        let (_, registry) = Metrics::new();
        let text = render(&registry);
        let line = text
            .lines()
            .find(|l| l.starts_with("graceguard_build_info{"))
            .unwrap_or_else(|| panic!("no graceguard_build_info in {text}"));
        assert!(
            line.contains(&format!("version=\"{}\"", env!("CARGO_PKG_VERSION"))),
            "{line}"
        );
        assert!(
            line.contains("revision=\"") && line.ends_with("} 1"),
            "{line}"
        );
    }

    /// The chart's webhook timeout (2 s) and the confirmation timeout (1 s)
    /// are bucket bounds, and the histogram reaches Kubernetes' 30 s maximum.
    #[test]
    fn review_buckets_reach_every_timeout() {
        for bound in [1.0, 2.0, 30.0] {
            assert!(REVIEW_SECONDS_BUCKETS.contains(&bound), "{bound}");
        }
        assert!(REVIEW_SECONDS_BUCKETS.windows(2).all(|w| w[0] < w[1]));
        let (m, registry) = Metrics::new();
        m.review(Endpoint::collision_guard).seconds.observe(1.7);
        let text = render(&registry);
        assert!(
            text.contains("graceguard_admission_review_seconds_bucket{le=\"2.0\",endpoint=\"collision_guard\"} 1")
                && text.contains("graceguard_admission_review_seconds_bucket{le=\"1.5\",endpoint=\"collision_guard\"} 0"),
            "{text}"
        );
    }

    /// `review()` indexes by the enum's discriminant: each slot must hold
    /// its own endpoint's series.
    #[test]
    fn each_endpoint_counts_into_its_own_series() {
        let (m, registry) = Metrics::new();
        for (i, e) in ENDPOINTS.iter().enumerate() {
            assert_eq!(*e as usize, i);
        }
        m.review(Endpoint::eviction_audit).denied.inc();
        let text = render(&registry);
        assert!(
            text.contains(
                "graceguard_admission_reviews_total{endpoint=\"eviction_audit\",decision=\"deny\"} 1"
            ),
            "{text}"
        );
        assert!(text.contains(
            "graceguard_admission_reviews_total{endpoint=\"collision_guard\",decision=\"deny\"} 0"
        ));
    }
}
