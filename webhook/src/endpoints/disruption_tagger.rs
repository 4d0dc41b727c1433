//! `POST /mutate/pods-status`: the disruption tagger. A pod status update
//! that carries a `DisruptionTarget` condition gets graceguard's tag (the
//! patch itself: [`crate::tagger::patch_for`]) when that changes nothing the
//! pod's kubelet or anyone's scheduling waits on; otherwise the pod is left
//! as it is and tagged afterwards by [`crate::follow_up`].

use std::collections::BTreeSet;

use super::{Acts, Reviewed};
use crate::app::App;
use crate::audit::AuditRecord;
use crate::disruption;
use crate::follow_up::Source;
use crate::review::{Answer, Request};
use crate::tagger;

/// Why the tagger answered as it did (the audit record's `reason`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    NotAStatusUpdate,
    NoDisruptionTarget,
    AlreadyTagged,
    Tagged,
    /// The patch could not be serialized: allowed untagged.
    PatchError,
    /// Not changed in its request, `why`, and what became of its tag.
    Left(Left, Then),
}

/// Why a disrupted pod is not changed in its own request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Left {
    /// A node's request: NodeRestriction would refuse a webhook's patch.
    NodeRequest,
    /// The pod still runs: its deletion would wait a PLEG relist.
    RunningPod,
}

/// What became of the tag of a pod left unchanged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Then {
    /// A follow-up was queued.
    FollowUp,
    /// One was already queued.
    FollowUpPending,
    /// Follow-ups are off.
    Unchanged,
    /// A dry run: nothing queued.
    DryRun,
    /// Not the API server's review: nothing queued.
    UnauthenticatedSender,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::NotAStatusUpdate => "not_a_status_update",
            Reason::NoDisruptionTarget => "no_disruption_target",
            Reason::AlreadyTagged => "already_tagged",
            Reason::Tagged => "tagged",
            Reason::PatchError => "patch_error",
            Reason::Left(Left::NodeRequest, then) => match then {
                Then::FollowUp => "node_request_follow_up",
                Then::FollowUpPending => "node_request_follow_up_pending",
                Then::Unchanged => "node_request_unchanged",
                Then::DryRun => "node_request_dry_run",
                Then::UnauthenticatedSender => "node_request_unauthenticated_sender",
            },
            Reason::Left(Left::RunningPod, then) => match then {
                Then::FollowUp => "running_pod_follow_up",
                Then::FollowUpPending => "running_pod_follow_up_pending",
                Then::Unchanged => "running_pod_unchanged",
                Then::DryRun => "running_pod_dry_run",
                Then::UnauthenticatedSender => "running_pod_unauthenticated_sender",
            },
        }
    }

    /// Every reason this endpoint can give.
    pub fn all() -> BTreeSet<String> {
        let whole = [
            Reason::NotAStatusUpdate,
            Reason::NoDisruptionTarget,
            Reason::AlreadyTagged,
            Reason::Tagged,
            Reason::PatchError,
        ];
        let thens = [
            Then::FollowUp,
            Then::FollowUpPending,
            Then::Unchanged,
            Then::DryRun,
            Then::UnauthenticatedSender,
        ];
        let left = [Left::NodeRequest, Left::RunningPod]
            .into_iter()
            .flat_map(|l| thens.map(|t| Reason::Left(l, t)));
        whole
            .into_iter()
            .chain(left)
            .map(|r| r.as_str().to_string())
            .collect()
    }
}

pub fn review(app: &App, req: &Request, acts: Acts) -> Reviewed {
    let Some(pod) = req
        .object
        .as_ref()
        .filter(|_| req.is_pods("UPDATE", "status"))
    else {
        return Reviewed::allow(Reason::NotAStatusUpdate.as_str(), AuditRecord::default());
    };
    let mut rec = AuditRecord {
        uid: pod.metadata.uid.clone(),
        ..Default::default()
    };
    let Some(d) = disruption::of_pod(pod) else {
        return Reviewed::allow(Reason::NoDisruptionTarget.as_str(), rec);
    };
    rec.disruption_reason = Some(d.reason.clone());
    let Some(patch) = tagger::patch_for(&pod.metadata, &d) else {
        rec.patched = Some(false);
        return Reviewed::allow(Reason::AlreadyTagged.as_str(), rec);
    };
    // Never change a node's request: NodeRestriction would refuse it (the API
    // server re-runs the plugin after a webhook's patch) and the kubelet would
    // retry forever. Never change a running pod: its deletion, a few ms
    // behind this update, would wait a PLEG relist (see
    // `tagger::may_tag_now`). Both are tagged afterwards, under graceguard's
    // own identity, the running pod once its deletion has begun.
    let left = if req.is_from_node() {
        Some((Left::NodeRequest, Source::NodeStatusUpdate))
    } else if !tagger::may_tag_now(pod) {
        Some((Left::RunningPod, Source::RunningPod))
    } else {
        None
    };
    if let Some((why, source)) = left {
        let left_unchanged = match why {
            Left::NodeRequest => &app.metrics.disruption_tagger.node_requests_left_unchanged,
            Left::RunningPod => &app.metrics.disruption_tagger.running_pods_left_unchanged,
        };
        left_unchanged.inc();
        rec.patched = Some(false);
        let then = match acts {
            Acts::DryRun => Then::DryRun,
            Acts::Unauthenticated => Then::UnauthenticatedSender,
            Acts::Yes => {
                let uid = pod.metadata.uid.as_deref();
                if app
                    .follow_up
                    .request(&req.namespace, &req.name, uid, source)
                {
                    Then::FollowUp
                } else if app.follow_up.is_enabled() {
                    Then::FollowUpPending
                } else {
                    Then::Unchanged
                }
            }
        };
        return Reviewed::allow(Reason::Left(why, then).as_str(), rec);
    }
    match serde_json::to_vec(&patch) {
        Ok(bytes) => {
            if acts.counted() {
                app.metrics.tags.tagged(&d.reason);
            }
            rec.patched = Some(true);
            let mut reviewed = Reviewed::allow(Reason::Tagged.as_str(), rec);
            reviewed.answer = Answer {
                patch: Some(bytes),
                ..Answer::allow()
            };
            reviewed
        }
        Err(e) => {
            // Cannot happen for a patch of strings, but never deny over it.
            tracing::warn!(error = %e, "could not serialize the tag patch; allowing the update untagged");
            rec.patched = Some(false);
            Reviewed::allow(Reason::PatchError.as_str(), rec)
        }
    }
}
