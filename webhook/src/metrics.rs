//! The Prometheus series on the health port's `/metrics`, and the registry
//! that holds them.
//!
//! Each owner defines its own series and registers them (`register`), and is
//! handed only those: the confirmation reads ([`crate::confirm`]), the
//! follow-up queue ([`crate::follow_up`]), the tags ([`crate::tagger`]), the
//! eviction outcomes ([`crate::eviction_outcome`]), the indexes
//! ([`crate::watchers`], [`crate::kind_index`]), the port's limits
//! ([`crate::limits`]) and its connections ([`crate::connection_life`]).
//! This module holds the rest: the admission shell's review series
//! ([`ReviewMetrics`]), the endpoints' own counters and the process's, and
//! [`Metrics::new`], which registers every group. The endpoints' counters
//! are here, not in [`crate::endpoints`], because [`crate::app::App`] holds
//! them and every endpoint reads `App`: a type of an endpoint's in `App`
//! would make the two modules import each other.

use std::sync::Arc;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

use crate::confirm::ConfirmMetrics;
use crate::connection_life::ConnectionMetrics;
use crate::eviction_outcome::OutcomeMetrics;
use crate::follow_up::FollowUpMetrics;
use crate::kind_index::KindIndexMetrics;
use crate::limits::LimitMetrics;
use crate::tagger::TagMetrics;
use crate::watchers::PodIndexMetrics;

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
pub struct ModeLabels {
    pub mode: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ExplainedLabels {
    pub explained: &'static str,
}

/// Every series the webhook exports, by owner. Cheap to clone (each series
/// is an `Arc`).
#[derive(Clone)]
pub struct Metrics {
    pub reviews: ReviewMetrics,
    pub collision_guard: CollisionGuardMetrics,
    pub disruption_tagger: DisruptionTaggerMetrics,
    pub audits: AuditMetrics,
    pub tags: TagMetrics,
    pub follow_up: FollowUpMetrics,
    pub evictions: OutcomeMetrics,
    pub confirm: ConfirmMetrics,
    pub pod_index: PodIndexMetrics,
    pub kinds: KindIndexMetrics,
    pub limits: LimitMetrics,
    pub connections: ConnectionMetrics,
    pub process: ProcessMetrics,
}

/// The admission shell's series ([`crate::handlers`]): every review by
/// endpoint and decision, its time, and bodies that were not a review.
#[derive(Clone)]
pub struct ReviewMetrics {
    pub reviews: Family<ReviewLabels, Counter>,
    pub review_seconds: Family<EndpointLabels, Histogram>,
    pub bad_requests: Counter,
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

impl ReviewMetrics {
    /// The series of `endpoint`'s reviews.
    pub fn review(&self, endpoint: Endpoint) -> &ReviewHandles {
        &self.handles[endpoint as usize]
    }

    fn register(r: &mut Registry) -> Self {
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
        };
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
            "bad_requests",
            "Requests that were not a readable AdmissionReview",
            m.bad_requests.clone(),
        );
        m
    }
}

/// The collision guard's counters ([`crate::endpoints::collision_guard`];
/// `fenced_writes_refused` also the release check's,
/// [`crate::endpoints::release_fencing`]).
#[derive(Clone, Default)]
pub struct CollisionGuardMetrics {
    pub quota_charges_prevented: Counter,
    pub fenced_writes_refused: Counter,
    pub livelock_suspected: Counter,
    pub retry_answers: Family<ModeLabels, Counter>,
}

impl CollisionGuardMetrics {
    fn register(r: &mut Registry) -> Self {
        let m = Self::default();
        // Series whose label values are known up front exist from the start
        // at 0, so `rate()` and `increase()` see their first event.
        for mode in crate::mode::Mode::ANSWERING_429 {
            let _ = m.retry_answers.get_or_create(&ModeLabels {
                mode: mode.as_str(),
            });
        }
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
        m
    }
}

/// The disruption tagger's requests left unchanged
/// ([`crate::endpoints::disruption_tagger`]); the tags themselves are
/// [`TagMetrics`].
#[derive(Clone, Default)]
pub struct DisruptionTaggerMetrics {
    pub node_requests_left_unchanged: Counter,
    pub running_pods_left_unchanged: Counter,
}

impl DisruptionTaggerMetrics {
    fn register(r: &mut Registry) -> Self {
        let m = Self::default();
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
        m
    }
}

/// The deletion and eviction audits' counts
/// ([`crate::endpoints::deletion_audit`], [`crate::endpoints::eviction_audit`]).
#[derive(Clone, Default)]
pub struct AuditMetrics {
    pub deletions_audited: Family<ExplainedLabels, Counter>,
    pub evictions_audited: Counter,
}

impl AuditMetrics {
    fn register(r: &mut Registry) -> Self {
        let m = Self::default();
        for explained in ["yes", "no"] {
            let _ = m
                .deletions_audited
                .get_or_create(&ExplainedLabels { explained });
        }
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
        m
    }
}

/// The process's own: its serving certificate and its log writer
/// ([`crate::server`] reads both at each scrape).
#[derive(Clone, Default)]
pub struct ProcessMetrics {
    pub audit_records_dropped: Counter,
    pub certificate_expiry: Gauge,
}

impl ProcessMetrics {
    fn register(r: &mut Registry) -> Self {
        let m = Self::default();
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
        m
    }
}

impl Metrics {
    /// The metrics and the registry that exports them: every group
    /// registered by its owner.
    pub fn new() -> (Self, Arc<Registry>) {
        let mut r = Registry::with_prefix("graceguard");
        r.register(
            "build",
            "The version and source revision running",
            build_info(),
        );
        let reviews = ReviewMetrics::register(&mut r);
        let limits = LimitMetrics::register(&mut r);
        let connections = ConnectionMetrics::register(&mut r);
        let pod_index = PodIndexMetrics::register(&mut r);
        let confirm = ConfirmMetrics::register(&mut r);
        let collision_guard = CollisionGuardMetrics::register(&mut r);
        let tags = TagMetrics::register(&mut r);
        let audits = AuditMetrics::register(&mut r);
        let evictions = OutcomeMetrics::register(&mut r);
        let disruption_tagger = DisruptionTaggerMetrics::register(&mut r);
        let follow_up = FollowUpMetrics::register(&mut r, tags.clone());
        let process = ProcessMetrics::register(&mut r);
        let kinds = KindIndexMetrics::register(&mut r, confirm.clone());
        let m = Self {
            reviews,
            collision_guard,
            disruption_tagger,
            audits,
            tags,
            follow_up,
            evictions,
            confirm,
            pod_index,
            kinds,
            limits,
            connections,
            process,
        };
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
        m.reviews
            .review(Endpoint::collision_guard)
            .seconds
            .observe(1.7);
        let text = render(&registry);
        assert!(
            text.contains("graceguard_admission_review_seconds_bucket{le=\"2.0\",endpoint=\"collision_guard\"} 1")
                && text.contains("graceguard_admission_review_seconds_bucket{le=\"1.5\",endpoint=\"collision_guard\"} 0"),
            "{text}"
        );
    }

    /// Every series the registry exports is in docs/operate.md's table of
    /// the webhook's metrics, and every row of that table is exported: the
    /// groups register their own series, and none is lost or undocumented.
    #[test]
    fn every_series_is_documented_and_every_documented_one_exported() {
        let (m, registry) = Metrics::new();
        // A family shows only once it has a series: give the ones that start
        // empty one each.
        let _ = m.limits.counter("in_flight");
        let kind = crate::kind_index::KindLabels {
            kind: "secrets".into(),
        };
        for family in [&m.kinds.objects, &m.kinds.ready, &m.kinds.over_cap] {
            let _ = family.get_or_create(&kind);
        }
        let text = render(&registry);
        let exported: std::collections::BTreeSet<String> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .map(|l| match l.split_once(' ') {
                Some((name, "counter")) => format!("{name}_total"),
                Some((name, "info")) => format!("{name}_info"),
                Some((name, _)) => name.to_string(),
                None => l.to_string(),
            })
            .collect();
        let docs = include_str!("../../docs/operate.md");
        let table = docs
            .split("| **webhook and sidecar** |")
            .nth(1)
            .and_then(|t| t.split("| **sidecar** |").next())
            .unwrap_or_else(|| panic!("docs/operate.md has no webhook metrics table"));
        let documented: std::collections::BTreeSet<String> = table
            .lines()
            .filter_map(|l| l.strip_prefix("| `"))
            .filter_map(|l| l.split('`').next())
            .map(str::to_string)
            .collect();
        assert_eq!(exported, documented);
    }

    /// `review()` indexes by the enum's discriminant: each slot must hold
    /// its own endpoint's series.
    #[test]
    fn each_endpoint_counts_into_its_own_series() {
        let (m, registry) = Metrics::new();
        for (i, e) in ENDPOINTS.iter().enumerate() {
            assert_eq!(*e as usize, i);
        }
        m.reviews.review(Endpoint::eviction_audit).denied.inc();
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
