//! The API's handlers: each turns one request into one executor call and
//! its answer (or an [`ApiStatus`]).

use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::api::{
    Ack, AckAnswer, Acked, DeleteQuery, EventsPage, EventsQuery, Health, ListQuery, PutQuery,
    PutTask, TaskList, MAX_ACK_SEQS, MAX_LIST_LIMIT, MAX_WAIT_SECONDS,
};
use super::status::{ApiStatus, Reason};
use super::Sidecar;
use crate::core::error::TaskError;
use crate::core::reconcile::TaskSpec;
use crate::core::task::{Submitted, TaskKey, TaskStatus};
use crate::core::template::Template;

type Answer<T> = Result<T, ApiStatus>;

fn body(b: Result<Bytes, BytesRejection>) -> Answer<Bytes> {
    b.map_err(ApiStatus::unreadable_body)
}

fn query<T>(q: Result<Query<T>, QueryRejection>, expected: &str) -> Answer<T> {
    q.map(|Query(q)| q)
        .map_err(|e| ApiStatus::bad_query(e, expected))
}

/// Submits a task, or finds it submitted.
#[utoipa::path(
    put, path = "/v1/tasks/{namespace}/{task}", tag = "tasks", operation_id = "putTask",
    params(("namespace" = String, Path), ("task" = String, Path), PutQuery),
    request_body = PutTask,
    responses(
        (status = 201, description = "Submitted now", body = TaskStatus),
        (status = 200, description = "Already submitted with this body (or replaced with it: see `replace`)", body = TaskStatus),
        (status = 400, description = "Malformed body, unusable template or another namespace", body = ApiStatus),
        (status = 409, description = "Submitted with another template (`TemplateConflict`) or settings (`SpecConflict`); with `replace`, not ended yet (`NotEnded`, `CleanupPending`)", body = ApiStatus),
        (status = 413, description = "Body too large", body = ApiStatus),
        (status = 429, description = "`TooManyTasks`: the executor holds as many tasks, or bytes of templates, as it may; forget ended tasks first", body = ApiStatus),
    ),
    security((), ("bearer" = [])),
)]
pub async fn put_task(
    State(s): State<Sidecar>,
    Path((namespace, task)): Path<(String, String)>,
    q: Result<Query<PutQuery>, QueryRejection>,
    raw: Result<Bytes, BytesRejection>,
) -> Answer<Response> {
    let q = query(q, "replace is true or false")?;
    let put: PutTask = serde_json::from_slice(&body(raw)?).map_err(|e| {
        ApiStatus::bad_request(format!(
            "the body is not a task ({e}); send {{\"template\": <Pod>, \"retries\": N, \"max_system_failures\": N, \"bounds\": {{...}}}}"
        ))
    })?;
    if task.is_empty() || namespace.is_empty() {
        return Err(ApiStatus::bad_request(
            "namespace and task must not be empty",
        ));
    }
    let spec = TaskSpec {
        task,
        namespace,
        instance: s.executor.instance().to_string(),
        retries: put.retries,
        max_system_failures: put.max_system_failures.max(1),
        bounds: put.bounds,
        rerun_done: put.rerun_done,
        stem: None,
    };
    let template = Template::from_json(put.template)?;
    let Submitted { status, created } = s.executor.put(spec, template, q.replace).await?;
    let code = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((code, Json(status)).into_response())
}

/// A task's status.
#[utoipa::path(
    get, path = "/v1/tasks/{namespace}/{task}", tag = "tasks", operation_id = "getTask",
    params(("namespace" = String, Path), ("task" = String, Path)),
    responses(
        (status = 200, body = TaskStatus),
        (status = 404, description = "Not known to this executor", body = ApiStatus),
        (status = 503, description = "`NotSynced`: the sidecar has not listed its pods yet; retry shortly", body = ApiStatus),
    ),
    security((), ("bearer" = [])),
)]
pub async fn get_task(
    State(s): State<Sidecar>,
    Path((namespace, task)): Path<(String, String)>,
) -> Answer<Json<TaskStatus>> {
    synced(&s)?;
    match s.executor.status(&TaskKey::new(&namespace, &task)).await {
        Some(st) => Ok(Json(st)),
        None => Err(TaskError::NotFound(task).into()),
    }
}

/// Aborts a task (its pod is deleted, uid precondition), and with `forget`
/// forgets it once it has ended.
#[utoipa::path(
    delete, path = "/v1/tasks/{namespace}/{task}", tag = "tasks", operation_id = "deleteTask",
    params(("namespace" = String, Path), ("task" = String, Path), DeleteQuery),
    responses(
        (status = 200, description = "Aborted (or had ended); its status", body = TaskStatus),
        (status = 404, body = ApiStatus),
        (status = 409, description = "`forget`: a pod of it still runs (`CleanupPending`) or it has not ended yet (`NotEnded`); ask again", body = ApiStatus),
        (status = 503, description = "`NotSynced`: the sidecar has not listed its pods yet (the abort is not taken); retry shortly", body = ApiStatus),
    ),
    security((), ("bearer" = [])),
)]
pub async fn delete_task(
    State(s): State<Sidecar>,
    Path((namespace, task)): Path<(String, String)>,
    q: Result<Query<DeleteQuery>, QueryRejection>,
) -> Answer<Json<TaskStatus>> {
    let q = query(q, "forget is true or false")?;
    synced(&s)?;
    let key = TaskKey::new(&namespace, &task);
    let st = s.executor.abort(&key).await?;
    if q.forget {
        s.executor.forget(&key).await?;
    }
    Ok(Json(st))
}

/// Runs an ended task again under its next pod name (the executor's own
/// retry decision).
#[utoipa::path(
    post, path = "/v1/tasks/{namespace}/{task}/retry", tag = "tasks", operation_id = "retryTask",
    params(("namespace" = String, Path), ("task" = String, Path)),
    responses(
        (status = 200, body = TaskStatus),
        (status = 404, body = ApiStatus),
        (status = 409, description = "It has not ended (`NotEnded`)", body = ApiStatus),
        (status = 503, description = "`NotSynced`: the sidecar has not listed its pods yet; retry shortly", body = ApiStatus),
    ),
    security((), ("bearer" = [])),
)]
pub async fn retry_task(
    State(s): State<Sidecar>,
    Path((namespace, task)): Path<(String, String)>,
) -> Answer<Json<TaskStatus>> {
    synced(&s)?;
    Ok(Json(
        s.executor.retry(&TaskKey::new(&namespace, &task)).await?,
    ))
}

/// Every task this executor knows (submitted, or taken up from its pods
/// after a restart), a page at a time: what an executor resyncs from after
/// its own restart.
#[utoipa::path(
    get, path = "/v1/tasks", tag = "tasks", operation_id = "listTasks",
    params(ListQuery),
    responses(
        (status = 200, body = TaskList),
        (status = 400, description = "A malformed `limit` or `continue`", body = ApiStatus),
        (status = 503, description = "`NotSynced`: the sidecar has not listed its pods yet (an empty page would say no task exists); retry shortly", body = ApiStatus),
    ),
    security((), ("bearer" = [])),
)]
pub async fn list_tasks(
    State(s): State<Sidecar>,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> Answer<Json<TaskList>> {
    let q = query(
        q,
        "namespace is a name, limit 1 to 1000, continue the previous page's",
    )?;
    if !(1..=MAX_LIST_LIMIT).contains(&q.limit) {
        return Err(ApiStatus::bad_request(format!(
            "limit {} is out of range; ask for 1 to {MAX_LIST_LIMIT} tasks per page",
            q.limit
        )));
    }
    let after = match q.continue_token.as_deref() {
        None => None,
        Some(c) => Some(super::paging::decode(c).ok_or_else(|| {
            ApiStatus::bad_request(format!(
                "continue {c:?} is not a token this sidecar gave; pass the previous page's continue unchanged, or leave it out to start over"
            ))
        })?),
    };
    synced(&s)?;
    let (items, more) = s.executor.list(q.namespace, after, q.limit).await?;
    let continue_token = more
        .then(|| {
            items
                .last()
                .map(|t| super::paging::encode(&t.namespace, &t.task))
        })
        .flatten();
    Ok(Json(TaskList {
        items,
        continue_token,
    }))
}

/// Events after `after`, waiting up to `wait` seconds for one.
#[utoipa::path(
    get, path = "/v1/events", tag = "events", operation_id = "getEvents",
    params(EventsQuery),
    responses(
        (status = 200, body = EventsPage),
        (status = 400, description = "`after` > 0 without `epoch`, or a malformed query", body = ApiStatus),
        (status = 409, description = "`EpochChanged`: the sidecar restarted since; poll from `after=0`", body = ApiStatus),
        (status = 503, description = "`Fenced`: this process does not hold its instance's Lease now", body = ApiStatus),
    ),
    security((), ("bearer" = [])),
)]
pub async fn events(
    State(s): State<Sidecar>,
    q: Result<Query<EventsQuery>, QueryRejection>,
) -> Answer<Json<EventsPage>> {
    let q = query(q, "after, limit and wait are non-negative integers")?;
    fenced(&s)?;
    if q.after > 0 {
        match q.epoch.as_deref() {
            None => {
                return Err(ApiStatus::bad_request(
                    "after > 0 needs the epoch it belongs to: send epoch=<the epoch of the events you read>",
                ))
            }
            Some(e) => same_epoch(&s, e)?,
        }
    }
    let wait = Duration::from_secs(q.wait.min(MAX_WAIT_SECONDS));
    let log = s.executor.log();
    let events = log.after(q.after, q.limit.clamp(1, 10_000), wait).await;
    Ok(Json(EventsPage {
        events: events.into_iter().map(Into::into).collect(),
        last_seq: log.last_seq(),
        epoch: log.epoch().to_string(),
    }))
}

/// Acknowledges events: a result's pod is then marked done (and let go).
#[utoipa::path(
    post, path = "/v1/events/ack", tag = "events", operation_id = "ackEvents",
    request_body = Ack,
    responses(
        (status = 200, description = "Acknowledged; the done-marks written", body = AckAnswer),
        (status = 400, body = ApiStatus),
        (status = 409, description = "`EpochChanged`: not applied", body = ApiStatus),
        (status = 503, description = "`Fenced`: not applied", body = ApiStatus),
    ),
    security((), ("bearer" = [])),
)]
pub async fn ack(
    State(s): State<Sidecar>,
    raw: Result<Bytes, BytesRejection>,
) -> Answer<Json<AckAnswer>> {
    let a: Ack = serde_json::from_slice(&body(raw)?).map_err(|e| {
        ApiStatus::bad_request(format!(
            "the body is not {{\"epoch\": E, \"seq\": N}} or {{\"epoch\": E, \"seqs\": [N, ...]}}: {e}"
        ))
    })?;
    fenced(&s)?;
    same_epoch(&s, &a.epoch)?;
    let marks = match (a.seq, a.seqs) {
        (Some(seq), None) => s.executor.ack(seq).await,
        (None, Some(seqs)) if seqs.len() > MAX_ACK_SEQS => {
            return Err(ApiStatus::bad_request(format!(
                "{} seqs in one acknowledgement; send at most {MAX_ACK_SEQS} at a time",
                seqs.len()
            )))
        }
        (None, Some(seqs)) => s.executor.ack_only(&seqs).await,
        _ => {
            return Err(ApiStatus::bad_request(
                "give exactly one of \"seq\" (everything up to it) or \"seqs\" (exactly those)",
            ))
        }
    };
    let acked = marks
        .into_iter()
        .map(|(seq, marked)| Acked {
            seq,
            marked: marked.into(),
        })
        .collect();
    Ok(Json(AckAnswer { acked }))
}

/// 503 while this process does not hold its instance's Lease: it neither
/// serves events nor marks results done then.
fn fenced(s: &Sidecar) -> Answer<()> {
    if s.executor.fence().holds() {
        return Ok(());
    }
    Err(ApiStatus::new(
        StatusCode::SERVICE_UNAVAILABLE,
        Reason::Fenced,
        format!(
            "this sidecar does not hold instance {}'s Lease now (its renewals failed, or another process took it); retry shortly",
            s.executor.instance()
        ),
    ))
}

/// 503 until the pod watch's first list: before it, the tasks this instance
/// has in the cluster are not known, and a 404 or an empty page would say
/// they do not exist (an abort lost, a resync that relaunches everything).
fn synced(s: &Sidecar) -> Answer<()> {
    if s.executor
        .stats()
        .synced
        .load(std::sync::atomic::Ordering::Acquire)
    {
        return Ok(());
    }
    Err(ApiStatus::new(
        StatusCode::SERVICE_UNAVAILABLE,
        Reason::NotSynced,
        format!(
            "this sidecar has not listed instance {}'s pods yet, so it cannot tell which tasks exist; retry shortly (GET /healthz says when it has)",
            s.executor.instance()
        ),
    ))
}

/// 409 unless `epoch` is the log's: the sidecar restarted since the
/// client's events were read.
fn same_epoch(s: &Sidecar, epoch: &str) -> Answer<()> {
    let now = s.executor.log().epoch();
    if epoch == now {
        return Ok(());
    }
    Err(ApiStatus::new(
        StatusCode::CONFLICT,
        Reason::EpochChanged,
        format!(
            "epoch {epoch:?} is not this sidecar's ({now}): it restarted and numbers its events anew; poll from after=0 and acknowledge what that returns"
        ),
    ))
}

/// Whether the pod watch has synced (200) or not (503, saying why); no token needed.
#[utoipa::path(
    get, path = "/healthz", tag = "meta", operation_id = "getHealth",
    responses((status = 200, body = Health), (status = 503, description = "Not synced yet", body = Health)),
)]
pub async fn healthz(State(s): State<Sidecar>) -> Response {
    let synced = s
        .executor
        .stats()
        .synced
        .load(std::sync::atomic::Ordering::Relaxed);
    let (events_held, transitions_dropped) = s.executor.log().counts();
    let body = Health {
        ok: synced,
        synced,
        instance: s.executor.instance().to_string(),
        holds_lease: s.executor.fence().holds(),
        epoch: s.executor.log().epoch().to_string(),
        events_held,
        transitions_dropped,
        watch_error: s.executor.stats().watch_error(),
    };
    let code = if synced {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, Json(body)).into_response()
}

/// This document; no token needed.
#[utoipa::path(
    get, path = "/openapi.json", tag = "meta", operation_id = "getOpenApi",
    responses((status = 200, description = "The OpenAPI document", content_type = "application/json", body = Object)),
)]
pub async fn openapi() -> Response {
    (
        [(header::CONTENT_TYPE, "application/json")],
        super::openapi::served(),
    )
        .into_response()
}
