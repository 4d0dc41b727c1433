//! The sidecar's `/metrics`: what an operator alerts on when an executor's
//! guard stops working — its Lease lost, its pod watch failing, results
//! nobody acknowledges. Read from the executor at each scrape, so a value is
//! never stale and the admission-free path pays nothing between scrapes.

use std::sync::atomic::Ordering;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

use super::Sidecar;

/// `graceguard_build_info`'s labels: the same on the webhook and the sidecar.
pub fn build_info() -> Info<Vec<(&'static str, &'static str)>> {
    Info::new(graceguard_contract::build::labels())
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PhaseLabels {
    phase: &'static str,
}

/// The exposition text of `s`'s state now.
pub async fn render(s: &Sidecar) -> String {
    let executor = &s.executor;
    let stats = executor.stats();
    let (events_held, transitions_dropped) = executor.log().counts();
    let (awaiting, oldest) = executor.log().awaiting_ack();
    let flag = |b: bool| ConstGauge::new(i64::from(b));
    let count = |n: usize| ConstGauge::new(i64::try_from(n).unwrap_or(i64::MAX));

    let mut r = Registry::with_prefix("graceguard");
    r.register(
        "build",
        "The version and source revision running",
        build_info(),
    );
    r.register(
        "sidecar_lease_held",
        "1 while this process holds its instance's Lease (without it, it launches nothing)",
        flag(executor.fence().holds()),
    );
    r.register(
        "sidecar_watch_synced",
        "1 once the pod watch's first list is in (tasks wait until then)",
        flag(stats.synced.load(Ordering::Relaxed)),
    );
    r.register(
        "sidecar_watch_failing",
        "1 while the pod watch's last attempt failed (the watcher retries with backoff; /healthz names the error)",
        flag(stats.watch_error().is_some()),
    );
    r.register(
        "sidecar_watch_errors",
        "Errors the pod watch returned since the start",
        ConstCounter::new(stats.watch_errors.load(Ordering::Relaxed)),
    );
    let tasks = Family::<PhaseLabels, Gauge>::default();
    // A stopped executor serves no phases; the flags above still say why.
    if let Ok(counts) = executor.phase_counts().await {
        for (phase, n) in counts {
            tasks
                .get_or_create(&PhaseLabels { phase })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        }
    }
    r.register("sidecar_tasks", "Tasks known, by phase", tasks);
    r.register(
        "sidecar_results_unacknowledged",
        "Results (and adopted or gone pods) delivered but not yet acknowledged: their pods keep the result finalizer",
        count(awaiting),
    );
    r.register(
        "sidecar_oldest_unacknowledged_result_seconds",
        "How long the oldest unacknowledged result has waited (0: none waits): an executor that stopped reading events",
        ConstGauge::new(oldest.as_secs_f64()),
    );
    r.register(
        "sidecar_events_held",
        "Events not yet acknowledged (transitions included)",
        count(events_held),
    );
    r.register(
        "sidecar_transitions_dropped",
        "Unacknowledged transitions dropped because the log was full or they were old (results are never dropped)",
        ConstCounter::new(transitions_dropped),
    );
    let mut out = String::new();
    if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &r) {
        tracing::warn!(error = %e, "encoding metrics failed");
    }
    out
}

/// `GET /metrics`: behind the token on the API's TCP listener, without one
/// on `--metrics-listen` (which serves nothing else). Prometheus's
/// endpoint, not a call of the API: it is left out of the OpenAPI document
/// (and so of the generated clients, which cannot read OpenMetrics text).
pub async fn metrics(State(s): State<Sidecar>) -> Response {
    (
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        render(&s).await,
    )
        .into_response()
}
