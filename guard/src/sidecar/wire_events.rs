//! The events as `GET /v1/events` serves them: one flat object per kind,
//! told apart by `type` (an OpenAPI `oneOf` with a discriminator), so a
//! generated client gets one model per kind. The log keeps [`Logged`]; this
//! is its one translation to the wire.

use serde::Serialize;
use utoipa::ToSchema;

use crate::core::phase::Transition;
use crate::core::reconcile::Outcome;
use crate::runtime::adoption::AdoptedPod;
use crate::runtime::events::{EventBody, Logged};

/// One event.
#[derive(Debug, Serialize, ToSchema)]
#[serde(untagged)]
#[schema(discriminator(property_name = "type", mapping(
    ("transition" = "#/components/schemas/TransitionEvent"),
    ("result" = "#/components/schemas/ResultEvent"),
    ("adopted" = "#/components/schemas/PodEvent"),
    ("gone" = "#/components/schemas/PodEvent"),
)))]
pub enum Event {
    Transition(TransitionEvent),
    Result(ResultEvent),
    Pod(PodEvent),
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum TransitionType {
    Transition,
}

/// A task's phase changed.
#[derive(Debug, Serialize, ToSchema)]
pub struct TransitionEvent {
    pub seq: u64,
    #[serde(rename = "type")]
    pub kind: TransitionType,
    pub namespace: String,
    #[serde(flatten)]
    pub transition: Transition,
}

#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ResultType {
    Result,
}

/// A task ended; acknowledging it marks its pod done.
#[derive(Debug, Serialize, ToSchema)]
pub struct ResultEvent {
    pub seq: u64,
    #[serde(rename = "type")]
    pub kind: ResultType,
    pub namespace: String,
    pub task: String,
    pub outcome: Outcome,
}

/// `adopted`: a completed pod of a dead instance, claimed for this one;
/// acknowledging it marks the pod done (conditionally on its
/// `resource_version`). `gone`: such a pod was deleted before it was
/// delivered; if its last `phase` is not `Succeeded` or `Failed`, its task
/// has no result and must be run again by the caller.
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum PodEventType {
    Adopted,
    Gone,
}

/// A pod of a dead instance (`adopted` or `gone`).
#[derive(Debug, Serialize, ToSchema)]
pub struct PodEvent {
    pub seq: u64,
    #[serde(rename = "type")]
    pub kind: PodEventType,
    #[serde(flatten)]
    pub pod: AdoptedPod,
}

impl From<Logged> for Event {
    fn from(l: Logged) -> Self {
        let seq = l.seq;
        match l.body {
            EventBody::Transition {
                namespace,
                transition,
            } => Event::Transition(TransitionEvent {
                seq,
                kind: TransitionType::Transition,
                namespace,
                transition,
            }),
            EventBody::Result {
                namespace,
                task,
                outcome,
            } => Event::Result(ResultEvent {
                seq,
                kind: ResultType::Result,
                namespace,
                task,
                outcome,
            }),
            EventBody::Adopted { pod } => Event::Pod(PodEvent {
                seq,
                kind: PodEventType::Adopted,
                pod,
            }),
            EventBody::Gone { pod } => Event::Pod(PodEvent {
                seq,
                kind: PodEventType::Gone,
                pod,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::events::EventBody;

    #[test]
    fn the_wire_form_is_the_logs_serialization() {
        // The log's own serialization (tag + flatten) is what clients have
        // read so far: the wire types must produce the same JSON.
        let logged = Logged {
            seq: 7,
            body: EventBody::Result {
                namespace: "ns".into(),
                task: "t".into(),
                outcome: Outcome {
                    succeeded: true,
                    failure_kind: None,
                    reason: None,
                    attempts: 1,
                    user_failures: 0,
                    system_failures: 0,
                    pod: "t-0".into(),
                    uid: Some("u".into()),
                },
            },
        };
        let before = serde_json::to_value(&logged).expect("serializes");
        let after = serde_json::to_value(Event::from(logged)).expect("serializes");
        assert_eq!(before, after);
        assert_eq!(after["type"], "result");
    }
}
