//! What every review needs, shared by all requests: the indexes, the
//! confirmation reads, the detectors and queues, the metrics, the settings.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::collision;
use crate::confirm::Confirmer;
use crate::eviction_outcome::EvictionOutcomes;
use crate::fencing::LeaseTerms;
use crate::follow_up::FollowUp;
use crate::kind_index::KindIndexes;
use crate::livelock::LivelockDetector;
use crate::metrics::Metrics;
use crate::mode::Mode;
use crate::pod_index::{NamespaceModes, PodIndex};

/// Everything a review needs, shared by all requests.
pub struct App {
    pub pods: Arc<PodIndex>,
    pub namespaces: Arc<NamespaceModes>,
    pub confirmer: Confirmer,
    pub livelock: LivelockDetector,
    pub metrics: Metrics,
    /// Tags what cannot be tagged inside its request (node updates, evictions).
    pub follow_up: FollowUp,
    /// What became of each eviction attempt (tagged once it evicted).
    pub evictions: EvictionOutcomes,
    /// Name indexes of the other kinds quotas count (`None`: pods only).
    pub kinds: Option<Arc<KindIndexes>>,
    /// Records the log writer dropped because stdout stalled.
    pub log_dropped: Option<tracing_appender::non_blocking::ErrorCounter>,
    /// The serving certificate in use (for its expiry metric).
    pub certificate: Option<Arc<graceguard_certs::ReloadingResolver>>,
    /// The install-wide mode; a namespace label overrides it.
    pub mode: Mode,
    /// The numbers of mode `adaptive`.
    pub adaptive: collision::Adaptive,
    /// Whether readiness also requires healthy watches (see [`App::is_ready`]).
    pub readiness_tracks_watch: bool,
    /// Set on SIGTERM: readiness goes false while in-flight reviews finish.
    pub shutting_down: AtomicBool,
    /// Whether graceguard can tell the API server's reviews from anyone
    /// else's (`--trusted-peers` or mutual TLS). Then a review from any other
    /// client is answered and audited as such but changes nothing (no
    /// eviction attempt, denial streak, follow-up or counter): forged
    /// reviews cannot displace what the API server's need.
    pub knows_api_server: bool,
    /// The instance Leases' terms, for the fencing check (`None`: off).
    pub leases: Option<Arc<LeaseTerms>>,
}

impl App {
    /// True when the indexes are synced and the server is not shutting down.
    ///
    /// With `readiness_tracks_watch` (the default, for `failurePolicy: Ignore`)
    /// a broken watch also makes the replica unready, so traffic moves to a
    /// healthy one. Without it (the chart's choice under `Fail`) readiness
    /// only waits for the first sync: an unready webhook under `Fail` refuses
    /// every pod Create in the cluster, while a stale index only ever allows
    /// (a hit is confirmed by a live read), so a watch hiccup must not turn
    /// into an outage.
    pub fn is_ready(&self) -> bool {
        let indexes = if self.readiness_tracks_watch {
            self.pods.is_ready() && self.namespaces.is_ready()
        } else {
            self.pods.is_synced() && self.namespaces.is_synced()
        };
        indexes && !self.shutting_down.load(Ordering::Acquire)
    }

    /// The mode for `namespace`: its label, else the install's.
    pub(crate) fn mode_for(&self, namespace: &str) -> Mode {
        self.namespaces
            .get("", namespace)
            .and_then(|s| s.mode)
            .unwrap_or(self.mode)
    }
}
