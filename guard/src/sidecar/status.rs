//! The one shape of every error answer: a Kubernetes-`Status`-like object
//! (`kind`, `status`, `code`, `reason`, `message`), so a client switches on
//! `reason` for every failure, from a bad body to a 413 or a 405.

use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Serialize;
use utoipa::ToSchema;

use crate::core::error::TaskError;

/// Why a request was refused: a word a client can switch on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, ToSchema)]
pub enum Reason {
    /// The task exists with another pod template (PUT `replace=true` once it has ended).
    TemplateConflict,
    /// The task exists with other `retries`, `max_system_failures`, `bounds` or `rerun_done`.
    SpecConflict,
    /// The task has not ended (retry, forget and replace are for ended tasks).
    NotEnded,
    /// The task has ended but a pod of it still runs.
    CleanupPending,
    /// No such task (or endpoint).
    NotFound,
    /// The pod template is not usable.
    BadTemplate,
    /// This sidecar watches another namespace.
    WrongNamespace,
    /// The body or the query is malformed.
    BadRequest,
    /// Missing or wrong bearer token (TCP listener).
    Unauthorized,
    /// The sidecar restarted since the events were read: poll from `after=0`.
    EpochChanged,
    /// This process does not hold its instance's Lease now: retry shortly.
    Fenced,
    /// The sidecar has not listed its pods yet (it just started), so it
    /// cannot tell which tasks exist: retry shortly. Never a 404 or an empty
    /// list that would say "no such task".
    NotSynced,
    /// The executor has stopped.
    Stopped,
    /// The endpoint does not take that method.
    MethodNotAllowed,
    /// The body is larger than the sidecar accepts.
    TooLarge,
    /// The executor holds as many tasks, or as many bytes of templates, as
    /// it may (`--max-tasks`, `--max-template-bytes`): forget ended tasks,
    /// then submit again.
    TooManyTasks,
}

/// An error answer.
#[derive(Debug, Serialize, ToSchema)]
pub struct ApiStatus {
    /// Always `Status`.
    #[schema(value_type = String, example = "Status")]
    kind: &'static str,
    /// Always `Failure`.
    #[schema(value_type = String, example = "Failure")]
    status: &'static str,
    /// The HTTP status code, repeated.
    code: u16,
    reason: Reason,
    /// What was wrong and what to do.
    message: String,
}

impl ApiStatus {
    pub fn new(code: StatusCode, reason: Reason, message: impl Into<String>) -> Self {
        Self {
            kind: "Status",
            status: "Failure",
            code: code.as_u16(),
            reason,
            message: message.into(),
        }
    }

    pub fn bad_request(message: impl std::fmt::Display) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            Reason::BadRequest,
            message.to_string(),
        )
    }

    pub fn reason(&self) -> Reason {
        self.reason
    }

    /// A body the sidecar could not read: too large (413) or broken.
    pub fn unreadable_body(e: BytesRejection) -> Self {
        let status = e.status();
        if status == StatusCode::PAYLOAD_TOO_LARGE {
            return Self::new(
                status,
                Reason::TooLarge,
                format!(
                    "the body is larger than the sidecar accepts ({}); a task's pod template must fit in it (Kubernetes itself refuses objects over 1.5 MB)",
                    e.body_text()
                ),
            );
        }
        Self::new(status, Reason::BadRequest, e.body_text())
    }

    /// A query string that does not parse; `expected` says what it takes.
    pub fn bad_query(e: QueryRejection, expected: &str) -> Self {
        Self::bad_request(format!("{}; {expected}", e.body_text()))
    }
}

impl IntoResponse for ApiStatus {
    fn into_response(self) -> Response {
        let code = StatusCode::from_u16(self.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (code, Json(self)).into_response()
    }
}

impl From<TaskError> for ApiStatus {
    fn from(e: TaskError) -> Self {
        let (status, reason) = match &e {
            TaskError::TemplateConflict(_) | TaskError::StemTaken { .. } => {
                (StatusCode::CONFLICT, Reason::TemplateConflict)
            }
            TaskError::SpecConflict(_) => (StatusCode::CONFLICT, Reason::SpecConflict),
            TaskError::NotEnded(_) => (StatusCode::CONFLICT, Reason::NotEnded),
            TaskError::CleanupPending(_) => (StatusCode::CONFLICT, Reason::CleanupPending),
            TaskError::NotFound(_) => (StatusCode::NOT_FOUND, Reason::NotFound),
            TaskError::Template(_) => (StatusCode::BAD_REQUEST, Reason::BadTemplate),
            TaskError::WrongNamespace { .. } => (StatusCode::BAD_REQUEST, Reason::WrongNamespace),
            TaskError::TooManyTasks { .. } | TaskError::TemplatesFull { .. } => {
                (StatusCode::TOO_MANY_REQUESTS, Reason::TooManyTasks)
            }
            TaskError::Stopped => (StatusCode::SERVICE_UNAVAILABLE, Reason::Stopped),
        };
        Self::new(status, reason, e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_reads_like_a_kubernetes_status() {
        let s = ApiStatus::from(TaskError::NotFound("t".into()));
        let v = serde_json::to_value(&s).expect("serializes");
        assert_eq!(v["kind"], "Status");
        assert_eq!(v["status"], "Failure");
        assert_eq!(v["code"], 404);
        assert_eq!(v["reason"], "NotFound");
        assert!(v["message"]
            .as_str()
            .is_some_and(|m| m.contains("PUT it first")));
    }
}
