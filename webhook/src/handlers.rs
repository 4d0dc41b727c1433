//! The admission endpoints' HTTP shell: each handler parses a review, hands
//! it to its endpoint's policy ([`crate::endpoints`]), times it, writes the
//! audit record and its metrics, and answers. It decides nothing itself.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::State;
use axum::response::Response;
use axum::Extension;

use crate::app::App;
use crate::endpoints::{
    collision_guard, deletion_audit, disruption_tagger, eviction_audit, release_fencing, Acts,
    Reviewed,
};
use crate::limits::Peer;
use crate::metrics::Endpoint;
use crate::review;

/// `POST /validate/pods` and `POST /validate/collision`: the collision guard,
/// for pods and for any namespaced kind a quota counts.
pub async fn validate_pods(
    State(app): State<Arc<App>>,
    peer: Option<Extension<Peer>>,
    body: Bytes,
) -> Response {
    handle(&app, Endpoint::collision_guard, peer.map(|p| p.0), &body).await
}

/// `POST /mutate/pods-status`: the disruption tagger.
pub async fn mutate_pods_status(
    State(app): State<Arc<App>>,
    peer: Option<Extension<Peer>>,
    body: Bytes,
) -> Response {
    handle(&app, Endpoint::disruption_tagger, peer.map(|p| p.0), &body).await
}

/// `POST /validate/pods-delete`: the deletion audit.
pub async fn validate_pods_delete(
    State(app): State<Arc<App>>,
    peer: Option<Extension<Peer>>,
    body: Bytes,
) -> Response {
    handle(&app, Endpoint::deletion_audit, peer.map(|p| p.0), &body).await
}

/// `POST /validate/pods-eviction`: the eviction audit.
pub async fn validate_pods_eviction(
    State(app): State<Arc<App>>,
    peer: Option<Extension<Peer>>,
    body: Bytes,
) -> Response {
    handle(&app, Endpoint::eviction_audit, peer.map(|p| p.0), &body).await
}

/// `POST /validate/pods-release`: the fencing check of the guard's
/// result-finalizer releases.
pub async fn validate_pods_release(
    State(app): State<Arc<App>>,
    peer: Option<Extension<Peer>>,
    body: Bytes,
) -> Response {
    handle(&app, Endpoint::release_fencing, peer.map(|p| p.0), &body).await
}

async fn handle(app: &App, endpoint: Endpoint, peer: Option<Peer>, body: &[u8]) -> Response {
    let start = Instant::now();
    let read = match endpoint {
        Endpoint::collision_guard => review::Read::NameOnly,
        _ => review::Read::Pods,
    };
    let req = match review::parse_as(body, read) {
        Ok(r) => r,
        Err(e) => {
            app.metrics.reviews.bad_requests.inc();
            tracing::warn!(endpoint = endpoint.as_str(), error = %e, "unreadable admission request");
            return review::unreadable(body, &e);
        }
    };
    // What may change graceguard's state: neither a dry run nor, when
    // graceguard can tell, a review the API server did not send.
    let from_api_server =
        !app.knows_api_server || peer.as_ref().is_some_and(|p| p.trust.is_trusted());
    let acts = if !from_api_server {
        Acts::Unauthenticated
    } else if req.dry_run {
        Acts::DryRun
    } else {
        Acts::Yes
    };
    let Reviewed {
        mut answer,
        record: mut rec,
    } = match endpoint {
        Endpoint::collision_guard => collision_guard::review(app, &req, acts).await,
        Endpoint::disruption_tagger => disruption_tagger::review(app, &req, acts),
        Endpoint::deletion_audit => deletion_audit::review(app, &req, acts),
        Endpoint::eviction_audit => eviction_audit::review(app, &req, acts),
        Endpoint::release_fencing => release_fencing::review(app, &req, acts),
    };
    let elapsed = start.elapsed();
    let (user, groups) = req.user();
    rec.event = "admission";
    rec.endpoint = endpoint.as_str();
    rec.decision = if answer.allowed { "allow" } else { "deny" };
    rec.request_uid.clone_from(&req.uid);
    if let Some(peer) = peer {
        rec.peer = Some(peer.ip.to_canonical().to_string());
        rec.peer_authenticated = Some(peer.trust.as_str());
        rec.peer_name = peer.certificate_name.map(|n| n.to_string());
    }
    rec.user = user;
    rec.groups = groups;
    rec.dry_run = req.dry_run;
    if rec.namespace.is_empty() {
        rec.namespace.clone_from(&req.namespace);
    }
    if rec.name.is_empty() {
        rec.name.clone_from(&req.name);
    }
    rec.latency_us = u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX);
    let series = app.metrics.reviews.review(endpoint);
    match answer.allowed {
        true => series.allowed.inc(),
        false => series.denied.inc(),
    };
    series.seconds.observe(elapsed.as_secs_f64());
    rec.emit();
    // The record is written: its reason moves into the answer, uncopied.
    answer.audit_annotations = vec![
        ("decision", rec.decision.into()),
        ("reason", std::mem::take(&mut rec.reason).into()),
    ];
    review::answer(&req, answer)
}
