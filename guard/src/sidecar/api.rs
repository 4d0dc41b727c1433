//! The sidecar API's bodies and queries: the Rust types the handlers use and
//! the OpenAPI document is generated from, so the two cannot drift apart.

use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::wire_events::Event;
use crate::core::bounds::Bounds;
use crate::core::task::TaskStatus;
use crate::runtime::done_marks::Marked;

/// Longest long poll a client may ask for.
pub const MAX_WAIT_SECONDS: u64 = 60;

/// Most sequence numbers one `{"seqs": [...]}` acknowledgement may list.
pub const MAX_ACK_SEQS: usize = 10_000;

/// Most tasks one `GET /v1/tasks` page holds.
pub const MAX_LIST_LIMIT: usize = 1_000;

/// The largest body the sidecar reads (Kubernetes refuses objects over
/// 1.5 MiB, so a usable pod template always fits).
pub const MAX_BODY_BYTES: usize = 2 * 1024 * 1024;

/// `PUT /v1/tasks/{namespace}/{task}`'s body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PutTask {
    /// The pod every attempt is made from (its name is the sidecar's: `<task>-<attempt>`).
    /// Kept as sent: fields newer than graceguard's Pod type go to the API
    /// server, which refuses the ones it does not know.
    #[schema(schema_with = crate::sidecar::openapi::pod_template)]
    pub template: serde_json::Value,
    /// User failures (the pod's own non-zero exit) retried before the task fails.
    #[serde(default)]
    pub retries: u32,
    /// System failures (preemptions, evictions, deletions) in a row before the task fails; at least 1.
    #[serde(default = "default_max_system_failures")]
    #[schema(default = 3)]
    pub max_system_failures: u32,
    #[serde(default)]
    pub bounds: Bounds,
    /// Submitted again after its last run's result was acknowledged, run
    /// it again (else that result is reported again, saying so).
    #[serde(default)]
    pub rerun_done: bool,
}

fn default_max_system_failures() -> u32 {
    3
}

/// `PUT`'s query.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PutQuery {
    /// Replace an ended task submitted with another template or settings:
    /// it is forgotten and run anew from this body, under the pod name after
    /// its last one (no name is reused). 409 `NotEnded` while it runs:
    /// DELETE it first.
    #[serde(default)]
    pub replace: bool,
}

/// `DELETE`'s query.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DeleteQuery {
    /// Also forget the task once it has ended (its status is no longer
    /// served; memory is freed).
    #[serde(default)]
    pub forget: bool,
}

/// `GET /v1/tasks`'s query.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ListQuery {
    /// Only this namespace's tasks.
    pub namespace: Option<String>,
    /// Tasks per page (1 to 1000).
    #[serde(default = "default_list_limit")]
    #[param(default = 500, minimum = 1, maximum = 1000)]
    pub limit: usize,
    /// The `continue` of the previous page.
    #[serde(rename = "continue")]
    #[param(rename = "continue")]
    pub continue_token: Option<String>,
}

fn default_list_limit() -> usize {
    500
}

/// One page of tasks, in (namespace, task) order.
#[derive(Debug, Serialize, ToSchema)]
pub struct TaskList {
    pub items: Vec<TaskStatus>,
    /// Pass as `continue` for the next page; absent on the last page.
    #[serde(rename = "continue", skip_serializing_if = "Option::is_none")]
    pub continue_token: Option<String>,
}

/// `GET /v1/events`'s query.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct EventsQuery {
    /// Events after this sequence number (0: from the oldest held).
    #[serde(default)]
    pub after: u64,
    /// Events per answer (1 to 10000).
    #[serde(default = "default_limit")]
    #[param(default = 500, minimum = 1, maximum = 10000)]
    pub limit: usize,
    /// Seconds to wait for an event when none is there (at most 60).
    #[serde(default)]
    #[param(maximum = 60)]
    pub wait: u64,
    /// The epoch `after` belongs to (required when `after` > 0).
    pub epoch: Option<String>,
}

fn default_limit() -> usize {
    500
}

/// `GET /v1/events`'s answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct EventsPage {
    pub events: Vec<Event>,
    /// The newest sequence number so far.
    pub last_seq: u64,
    /// This process's numbering: reads after a sequence number and
    /// acknowledgements name it.
    pub epoch: String,
}

/// `POST /v1/events/ack`'s body: `{"epoch": E, "seq": N}` acknowledges
/// every event up to N (one consumer per sidecar), `{"epoch": E, "seqs":
/// [..]}` exactly those. The epoch is the one the events were read in: an
/// acknowledgement meant for a sidecar that has restarted since is refused
/// (409) instead of acknowledging, and done-marking, events its sender never
/// saw.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Ack {
    pub epoch: String,
    /// Everything up to this sequence number.
    pub seq: Option<u64>,
    /// Exactly these sequence numbers (at most 10000).
    pub seqs: Option<Vec<u64>>,
}

/// One acknowledged event that wrote a done-mark.
#[derive(Debug, Serialize, ToSchema)]
pub struct Acked {
    pub seq: u64,
    pub marked: MarkedAnswer,
}

/// What a done-mark came to.
#[derive(Debug, Serialize, ToSchema)]
#[schema(as = Marked)]
#[serde(rename_all = "snake_case")]
pub enum MarkedAnswer {
    /// This instance labelled the pod done.
    Done,
    /// Already done, or changed under another claim: another adopter won.
    Lost,
    /// The pod no longer exists.
    Gone,
    /// The API server could not be asked (or this process does not hold
    /// its instance's Lease); the event stays acknowledged, the pod
    /// unmarked (it is delivered again after a restart).
    Failed(String),
}

impl From<Marked> for MarkedAnswer {
    /// The API serves a failure as its message: the executor logs it, and
    /// the event is delivered again either way.
    fn from(m: Marked) -> Self {
        match m {
            Marked::Done => Self::Done,
            Marked::Lost => Self::Lost,
            Marked::Gone => Self::Gone,
            Marked::Failed(e) => Self::Failed(e.to_string()),
        }
    }
}

/// `POST /v1/events/ack`'s answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct AckAnswer {
    pub acked: Vec<Acked>,
}

/// `GET /healthz`'s answer (200 once the pod watch synced, else 503).
#[derive(Debug, Serialize, ToSchema)]
pub struct Health {
    pub ok: bool,
    pub synced: bool,
    pub instance: String,
    pub holds_lease: bool,
    pub epoch: String,
    /// Events not yet acknowledged.
    pub events_held: usize,
    /// Unacknowledged transitions dropped (the log was full, or they were old).
    pub transitions_dropped: u64,
    /// The pod watch's last error, until it works again.
    pub watch_error: Option<String>,
}
