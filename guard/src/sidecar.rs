//! `graceguard sidecar`: the executor core as a local HTTP+JSON API, so an
//! executor in any language (Flyte's Go, Airflow's Python) gets the same
//! rules from one process that holds the Lease and the pod watch.
//!
//! The API is described by `guard/openapi.json` (served at `/openapi.json`);
//! [`ROUTES`] is the server's side of it, and a test keeps the two equal.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, Query, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use k8s_openapi::api::core::v1::Pod;
use serde::{Deserialize, Serialize};

use crate::bounds::Bounds;
use crate::done_marks::Marked;
use crate::error::TaskError;
use crate::executor::Executor;
use crate::reconcile::TaskSpec;
use crate::task::TaskKey;

/// The OpenAPI document, as committed.
pub const OPENAPI: &str = include_str!("../openapi.json");

/// Every (method, path) the server answers, in OpenAPI's path syntax.
pub const ROUTES: &[(&str, &str)] = &[
    ("put", "/v1/tasks/{namespace}/{task}"),
    ("get", "/v1/tasks/{namespace}/{task}"),
    ("delete", "/v1/tasks/{namespace}/{task}"),
    ("post", "/v1/tasks/{namespace}/{task}/retry"),
    ("get", "/v1/events"),
    ("post", "/v1/events/ack"),
    ("get", "/healthz"),
    ("get", "/openapi.json"),
];

/// Longest long poll a client may ask for.
pub const MAX_WAIT_SECONDS: u64 = 60;

/// Most sequence numbers one `{"seqs": [...]}` acknowledgement may list.
pub const MAX_ACK_SEQS: usize = 10_000;

/// `PUT /v1/tasks/{namespace}/{task}`'s body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PutTask {
    pub template: Pod,
    #[serde(default)]
    pub retries: u32,
    #[serde(default = "default_max_system_failures")]
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

#[derive(Debug, Deserialize)]
pub struct EventsQuery {
    #[serde(default)]
    pub after: u64,
    #[serde(default = "default_limit")]
    pub limit: usize,
    /// Seconds to wait for an event when none is there.
    #[serde(default)]
    pub wait: u64,
    /// The epoch `after` belongs to (required when `after` > 0).
    pub epoch: Option<String>,
}

fn default_limit() -> usize {
    500
}

/// `POST /v1/events/ack`'s body: `{"epoch": E, "seq": N}` acknowledges
/// every event up to N (one consumer per sidecar), `{"epoch": E, "seqs":
/// [..]}` exactly those. The epoch is the one the events were read in: an
/// acknowledgement meant for a sidecar that has restarted since is refused
/// (409) instead of acknowledging, and done-marking, events its sender never
/// saw.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Ack {
    pub epoch: String,
    pub seq: Option<u64>,
    pub seqs: Option<Vec<u64>>,
}

#[derive(Serialize)]
struct Acked {
    seq: u64,
    marked: Marked,
}

/// An error answer: `{"error": "...", "code": "..."}`.
#[derive(Debug, Serialize)]
pub struct ApiFailure {
    pub error: String,
    pub code: &'static str,
    #[serde(skip)]
    status: StatusCode,
}

impl ApiFailure {
    fn new(status: StatusCode, code: &'static str, error: String) -> Self {
        Self {
            error,
            code,
            status,
        }
    }
}

impl IntoResponse for ApiFailure {
    fn into_response(self) -> Response {
        (self.status, Json(self)).into_response()
    }
}

impl From<TaskError> for ApiFailure {
    fn from(e: TaskError) -> Self {
        let (status, code) = match &e {
            TaskError::TemplateConflict(_) => (StatusCode::CONFLICT, "template_conflict"),
            TaskError::SpecConflict(_) => (StatusCode::CONFLICT, "spec_conflict"),
            TaskError::NotEnded(_) => (StatusCode::CONFLICT, "not_ended"),
            TaskError::CleanupPending(_) => (StatusCode::CONFLICT, "cleanup_pending"),
            TaskError::NotFound(_) => (StatusCode::NOT_FOUND, "not_found"),
            TaskError::Template(_) => (StatusCode::BAD_REQUEST, "bad_template"),
            TaskError::WrongNamespace { .. } => (StatusCode::BAD_REQUEST, "wrong_namespace"),
            TaskError::Stopped => (StatusCode::SERVICE_UNAVAILABLE, "stopped"),
        };
        Self::new(status, code, e.to_string())
    }
}

/// The sidecar's state.
#[derive(Clone)]
pub struct Sidecar {
    pub executor: Executor,
    /// The bearer token a TCP listener requires (`None`: a Unix socket,
    /// guarded by its file permissions).
    pub token: Option<Arc<String>>,
}

/// The API's router.
pub fn router(sidecar: Sidecar) -> Router {
    let api = Router::new()
        .route(
            "/v1/tasks/{namespace}/{task}",
            put(put_task).get(get_task).delete(delete_task),
        )
        .route("/v1/tasks/{namespace}/{task}/retry", post(retry_task))
        .route("/v1/events", get(events))
        .route("/v1/events/ack", post(ack))
        .route_layer(middleware::from_fn_with_state(sidecar.clone(), auth));
    Router::new()
        .merge(api)
        .route("/healthz", get(healthz))
        .route("/openapi.json", get(openapi))
        .fallback(|| async {
            ApiFailure::new(
                StatusCode::NOT_FOUND,
                "no_route",
                "no such endpoint; see /openapi.json".into(),
            )
        })
        .method_not_allowed_fallback(|| async {
            ApiFailure::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "this endpoint does not take that method; see /openapi.json".into(),
            )
        })
        .with_state(sidecar)
}

/// Whether `given` is `token`, in time independent of where they differ.
fn token_matches(given: Option<&str>, token: &str) -> bool {
    use subtle::ConstantTimeEq;
    given.is_some_and(|g| bool::from(g.as_bytes().ct_eq(token.as_bytes())))
}

async fn auth(State(s): State<Sidecar>, req: Request, next: Next) -> Response {
    if let Some(token) = &s.token {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if !token_matches(given, token) {
            return ApiFailure::new(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "missing or wrong bearer token; send Authorization: Bearer <the --token-file's content>".into(),
            )
            .into_response();
        }
    }
    next.run(req).await
}

fn bad_request(e: impl std::fmt::Display) -> ApiFailure {
    ApiFailure::new(StatusCode::BAD_REQUEST, "bad_request", e.to_string())
}

async fn put_task(
    State(s): State<Sidecar>,
    Path((namespace, task)): Path<(String, String)>,
    body: axum::body::Bytes,
) -> Result<Response, ApiFailure> {
    let put: PutTask = serde_json::from_slice(&body).map_err(|e| {
        bad_request(format!(
            "the body is not a task ({e}); send {{\"template\": <Pod>, \"retries\": N, \"max_system_failures\": N, \"bounds\": {{...}}}}"
        ))
    })?;
    if task.is_empty() || namespace.is_empty() {
        return Err(bad_request("namespace and task must not be empty"));
    }
    let spec = TaskSpec {
        task,
        namespace,
        instance: s.executor.instance().to_string(),
        retries: put.retries,
        max_system_failures: put.max_system_failures.max(1),
        bounds: put.bounds,
        rerun_done: put.rerun_done,
    };
    let status = s.executor.submit(spec, put.template).await?;
    Ok(Json(status).into_response())
}

async fn get_task(
    State(s): State<Sidecar>,
    Path((namespace, task)): Path<(String, String)>,
) -> Result<Response, ApiFailure> {
    match s.executor.status(&TaskKey::new(&namespace, &task)).await {
        Some(st) => Ok(Json(st).into_response()),
        None => Err(TaskError::NotFound(task).into()),
    }
}

#[derive(Debug, Deserialize)]
pub struct DeleteQuery {
    /// Also forget the task once it has ended (its status is no longer
    /// served; memory is freed).
    #[serde(default)]
    pub forget: bool,
}

async fn delete_task(
    State(s): State<Sidecar>,
    Path((namespace, task)): Path<(String, String)>,
    q: Result<Query<DeleteQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiFailure> {
    let Query(q) = q.map_err(|e| bad_request(format!("{e}; forget is true or false")))?;
    let key = TaskKey::new(&namespace, &task);
    let st = s.executor.abort(&key).await?;
    if q.forget {
        s.executor.forget(&key).await?;
    }
    Ok(Json(st).into_response())
}

async fn retry_task(
    State(s): State<Sidecar>,
    Path((namespace, task)): Path<(String, String)>,
) -> Result<Response, ApiFailure> {
    let st = s.executor.retry(&TaskKey::new(&namespace, &task)).await?;
    Ok(Json(st).into_response())
}

async fn events(
    State(s): State<Sidecar>,
    q: Result<Query<EventsQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Response, ApiFailure> {
    let Query(q) = q.map_err(|e| {
        bad_request(format!(
            "{e}; after, limit and wait are non-negative integers"
        ))
    })?;
    fenced(&s)?;
    if q.after > 0 {
        match q.epoch.as_deref() {
            None => {
                return Err(bad_request(
                    "after > 0 needs the epoch it belongs to: send epoch=<the epoch of the events you read>",
                ))
            }
            Some(e) => same_epoch(&s, e)?,
        }
    }
    let wait = Duration::from_secs(q.wait.min(MAX_WAIT_SECONDS));
    let events = s
        .executor
        .log()
        .after(q.after, q.limit.clamp(1, 10_000), wait)
        .await;
    Ok(Json(serde_json::json!({
        "events": events,
        "last_seq": s.executor.log().last_seq(),
        "epoch": s.executor.log().epoch(),
    }))
    .into_response())
}

async fn ack(State(s): State<Sidecar>, body: axum::body::Bytes) -> Result<Response, ApiFailure> {
    let a: Ack = serde_json::from_slice(&body).map_err(|e| {
        bad_request(format!(
            "the body is not {{\"epoch\": E, \"seq\": N}} or {{\"epoch\": E, \"seqs\": [N, ...]}}: {e}"
        ))
    })?;
    fenced(&s)?;
    same_epoch(&s, &a.epoch)?;
    let marks = match (a.seq, a.seqs) {
        (Some(seq), None) => s.executor.ack(seq).await,
        (None, Some(seqs)) if seqs.len() > MAX_ACK_SEQS => {
            return Err(bad_request(format!(
                "{} seqs in one acknowledgement; send at most {MAX_ACK_SEQS} at a time",
                seqs.len()
            )))
        }
        (None, Some(seqs)) => s.executor.ack_only(&seqs).await,
        _ => {
            return Err(bad_request(
                "give exactly one of \"seq\" (everything up to it) or \"seqs\" (exactly those)",
            ))
        }
    };
    let marked: Vec<Acked> = marks
        .into_iter()
        .map(|(seq, marked)| Acked { seq, marked })
        .collect();
    Ok(Json(serde_json::json!({ "acked": marked })).into_response())
}

/// 503 while this process does not hold its instance's Lease: it neither
/// serves events nor marks results done then.
fn fenced(s: &Sidecar) -> Result<(), ApiFailure> {
    if s.executor.fence().holds() {
        return Ok(());
    }
    Err(ApiFailure::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "fenced",
        format!(
            "this sidecar does not hold instance {}'s Lease now (its renewals failed, or another process took it); retry shortly",
            s.executor.instance()
        ),
    ))
}

/// 409 unless `epoch` is the log's: the sidecar restarted since the
/// client's events were read.
fn same_epoch(s: &Sidecar, epoch: &str) -> Result<(), ApiFailure> {
    let now = s.executor.log().epoch();
    if epoch == now {
        return Ok(());
    }
    Err(ApiFailure::new(
        StatusCode::CONFLICT,
        "epoch_changed",
        format!(
            "epoch {epoch:?} is not this sidecar's ({now}): it restarted and numbers its events anew; poll from after=0 and acknowledge what that returns"
        ),
    ))
}

async fn healthz(State(s): State<Sidecar>) -> Response {
    let synced = s
        .executor
        .stats()
        .synced
        .load(std::sync::atomic::Ordering::Relaxed);
    let (held, dropped) = s.executor.log().counts();
    let body = Json(serde_json::json!({
        "ok": synced,
        "synced": synced,
        "instance": s.executor.instance(),
        "holds_lease": s.executor.fence().holds(),
        "epoch": s.executor.log().epoch(),
        "events_held": held,
        "transitions_dropped": dropped,
        "watch_error": s.executor.stats().watch_error(),
    }));
    let code = if synced {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, body).into_response()
}

async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI).into_response()
}

/// Where the sidecar listens.
#[derive(Clone, Debug)]
pub enum Listen {
    /// A Unix socket (mode 0600): only the executor's user can reach it.
    Socket(std::path::PathBuf),
    /// Loopback TCP; every /v1 request needs the bearer token.
    Tcp(std::net::SocketAddr),
}

/// Binds a Unix socket at `path`, reachable by its owner only from the
/// start: it is bound inside a fresh directory of mode 0700, given mode
/// 0600, and only then renamed to `path`. A socket left there by a killed
/// sidecar (nothing accepts on it) is replaced; a live one is an error, and
/// so is anything at `path` that is not a socket (it is never removed).
pub async fn bind_socket(path: &std::path::Path) -> Result<tokio::net::UnixListener, String> {
    use std::os::unix::fs::{DirBuilderExt, FileTypeExt, PermissionsExt};
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if !meta.file_type().is_socket() {
            return Err(format!(
                "{} exists and is not a socket; graceguard does not remove it: choose another --socket or remove it yourself",
                path.display()
            ));
        }
        if tokio::net::UnixStream::connect(path).await.is_ok() {
            return Err(format!(
                "{} is in use by a running process (another sidecar?); stop it or choose another --socket",
                path.display()
            ));
        }
    }
    let dir = path.parent().unwrap_or(std::path::Path::new("."));
    let private = dir.join(format!(".graceguard-{:016x}", fastrand::u64(..)));
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&private)
        .map_err(|e| {
            format!(
                "cannot create {} to bind the socket in: {e}",
                private.display()
            )
        })?;
    let inner = private.join("socket");
    let bound = (|| {
        let l = std::os::unix::net::UnixListener::bind(&inner)
            .map_err(|e| format!("cannot listen on {}: {e}", path.display()))?;
        std::fs::set_permissions(&inner, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| format!("cannot restrict {} to its owner: {e}", path.display()))?;
        // Replaces a stale socket in one step.
        std::fs::rename(&inner, path)
            .map_err(|e| format!("cannot move the socket to {}: {e}", path.display()))?;
        l.set_nonblocking(true)
            .map_err(|e| format!("cannot use {}: {e}", path.display()))?;
        tokio::net::UnixListener::from_std(l)
            .map_err(|e| format!("cannot use {}: {e}", path.display()))
    })();
    let _ = std::fs::remove_file(&inner);
    let _ = std::fs::remove_dir(&private);
    bound
}

/// Serves the API on `listen` until `shutdown` resolves (in-flight requests
/// finish; long polls end at their wait).
pub async fn serve(
    listen: Listen,
    sidecar: Sidecar,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), String> {
    let app = router(sidecar);
    match listen {
        Listen::Socket(path) => {
            let l = bind_socket(&path).await?;
            tracing::info!(socket = %path.display(), "sidecar listening");
            let r = axum::serve(l, app).with_graceful_shutdown(shutdown).await;
            let _ = std::fs::remove_file(&path);
            r.map_err(|e| format!("serving on {}: {e}", path.display()))
        }
        Listen::Tcp(addr) => {
            if !addr.ip().is_loopback() {
                return Err(format!(
                    "--listen {addr} is not a loopback address: the API is for the executor in the same pod or host; listen on 127.0.0.1 or [::1] (or use --socket)"
                ));
            }
            let l = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
            tracing::info!(%addr, "sidecar listening");
            axum::serve(l, app)
                .with_graceful_shutdown(shutdown)
                .await
                .map_err(|e| format!("serving on {addr}: {e}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_openapi_document_lists_exactly_the_served_routes() {
        let doc: serde_json::Value = serde_json::from_str(OPENAPI).expect("openapi.json is JSON");
        assert!(doc["openapi"].as_str().is_some_and(|v| v.starts_with("3.")));
        let mut documented: Vec<(String, String)> = Vec::new();
        for (path, item) in doc["paths"].as_object().expect("paths") {
            for method in item.as_object().expect("path item").keys() {
                if ["get", "put", "post", "delete", "patch"].contains(&method.as_str()) {
                    documented.push((method.clone(), path.clone()));
                }
            }
        }
        let mut served: Vec<(String, String)> = ROUTES
            .iter()
            .map(|(m, p)| (m.to_string(), p.to_string()))
            .collect();
        documented.sort();
        served.sort();
        assert_eq!(documented, served);
    }

    /// A router whose executor points at a closed port: enough for the
    /// checks made before any task reaches the API server.
    fn offline(token: Option<&str>) -> Result<Router, Box<dyn std::error::Error>> {
        let config = kube::Config::new("http://127.0.0.1:9".parse()?);
        let client = kube::Client::try_from(config)?;
        let executor = Executor::start(client, crate::executor::ExecutorConfig::new("unit"));
        Ok(router(Sidecar {
            executor,
            token: token.map(|t| Arc::new(t.to_string())),
        }))
    }

    async fn status_of(app: Router, path: &str, auth: Option<&str>) -> u16 {
        use tower::ServiceExt;
        let mut req = axum::http::Request::builder().uri(path);
        if let Some(a) = auth {
            req = req.header(header::AUTHORIZATION, a);
        }
        match req.body(axum::body::Body::empty()) {
            Ok(r) => match app.oneshot(r).await {
                Ok(resp) => resp.status().as_u16(),
                Err(never) => match never {},
            },
            Err(_) => 0,
        }
    }

    #[tokio::test]
    async fn a_tcp_listener_wants_the_bearer_token_on_v1_but_not_on_healthz() {
        let app = offline(Some("0123456789abcdef-secret")).expect("router");
        let v1 = "/v1/tasks/ns/t";
        assert_eq!(status_of(app.clone(), v1, None).await, 401);
        assert_eq!(status_of(app.clone(), v1, Some("Bearer wrong")).await, 401);
        assert_eq!(
            status_of(app.clone(), v1, Some("Bearer 0123456789abcdef-secret")).await,
            404,
            "authorized: the task is simply unknown"
        );
        // Not synced (no API server): 503, but no token needed.
        assert_eq!(status_of(app.clone(), "/healthz", None).await, 503);
        assert_eq!(status_of(app, "/openapi.json", None).await, 200);
        // A Unix socket needs no token.
        let app = offline(None).expect("router");
        assert_eq!(status_of(app, v1, None).await, 404);
    }

    #[tokio::test]
    async fn healthz_says_why_the_watch_has_not_synced() {
        use http_body_util::BodyExt;
        use tower::ServiceExt;
        let app = offline(None).expect("router");
        // The watcher's first attempt fails at once (nothing listens there).
        let mut body = serde_json::Value::Null;
        for _ in 0..50 {
            let req = axum::http::Request::builder()
                .uri("/healthz")
                .body(axum::body::Body::empty())
                .expect("request");
            let Ok(resp) = app.clone().oneshot(req).await;
            assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
            let bytes = resp.into_body().collect().await.expect("body").to_bytes();
            body = serde_json::from_slice(&bytes).expect("JSON");
            if body["watch_error"].is_string() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(body["synced"], false);
        assert!(body["watch_error"].is_string(), "{body}");
    }

    async fn call(app: Router, method: &str, path: &str, body: &str) -> (u16, serde_json::Value) {
        use http_body_util::BodyExt;
        use tower::ServiceExt;
        let req = axum::http::Request::builder()
            .method(method)
            .uri(path)
            .header(header::CONTENT_TYPE, "application/json")
            .body(axum::body::Body::from(body.to_string()))
            .expect("request");
        let Ok(resp) = app.oneshot(req).await;
        let status = resp.status().as_u16();
        let bytes = resp.into_body().collect().await.expect("body").to_bytes();
        (status, serde_json::from_slice(&bytes).unwrap_or_default())
    }

    #[tokio::test]
    async fn acknowledgements_and_reads_after_a_restart_are_refused_not_applied() {
        let app = offline(None).expect("router");
        let (_, health) = call(app.clone(), "GET", "/healthz", "").await;
        let epoch = health["epoch"]
            .as_str()
            .expect("healthz names the epoch")
            .to_string();
        // No epoch: 400, saying what to send.
        let (code, body) = call(app.clone(), "POST", "/v1/events/ack", r#"{"seq": 3}"#).await;
        assert_eq!(code, 400, "{body}");
        assert!(
            body["error"].as_str().unwrap_or("").contains("epoch"),
            "{body}"
        );
        // Another sidecar's epoch (this one restarted since): 409.
        let (code, body) = call(
            app.clone(),
            "POST",
            "/v1/events/ack",
            r#"{"epoch": "0000000000000000", "seq": 3}"#,
        )
        .await;
        assert_eq!(
            (code, body["code"].as_str()),
            (409, Some("epoch_changed")),
            "{body}"
        );
        let (code, _) = call(app.clone(), "GET", "/v1/events?after=3", "").await;
        assert_eq!(code, 400, "after > 0 without an epoch");
        let (code, body) = call(app.clone(), "GET", "/v1/events?after=3&epoch=x", "").await;
        assert_eq!(code, 409, "{body}");
        // This epoch: accepted (nothing to acknowledge yet).
        let ack = format!(r#"{{"epoch": "{epoch}", "seq": 3}}"#);
        let (code, body) = call(app.clone(), "POST", "/v1/events/ack", &ack).await;
        assert_eq!(
            (code, body["acked"].as_array().map(Vec::len)),
            (200, Some(0))
        );
        let q = format!("/v1/events?after=3&epoch={epoch}");
        assert_eq!(call(app.clone(), "GET", &q, "").await.0, 200);
        // Too many seqs at once: 400.
        let seqs: Vec<u64> = (1..=(MAX_ACK_SEQS as u64 + 1)).collect();
        let ack = serde_json::json!({"epoch": epoch, "seqs": seqs}).to_string();
        let (code, body) = call(app, "POST", "/v1/events/ack", &ack).await;
        assert_eq!(code, 400, "{body}");
    }

    #[test]
    fn the_token_is_compared_whole() {
        assert!(token_matches(Some("0123456789abcdef"), "0123456789abcdef"));
        for wrong in [
            None,
            Some(""),
            Some("0123456789abcde"),
            Some("0123456789abcdef0"),
        ] {
            assert!(!token_matches(wrong, "0123456789abcdef"), "{wrong:?}");
        }
    }

    #[tokio::test]
    async fn the_socket_is_owner_only_and_only_a_stale_socket_is_replaced() {
        use std::os::unix::fs::{FileTypeExt, PermissionsExt};
        let dir = std::env::temp_dir().join(format!("gg-sock-{:08x}", fastrand::u32(..)));
        std::fs::create_dir_all(&dir).expect("dir");
        // Not a socket: refused, and left as it was.
        let file = dir.join("not-a-socket");
        std::fs::write(&file, "keep me").expect("file");
        let e = bind_socket(&file)
            .await
            .expect_err("a regular file is not replaced");
        assert!(e.contains("not a socket"), "{e}");
        assert_eq!(
            std::fs::read_to_string(&file).expect("still there"),
            "keep me"
        );
        // A stale socket (its listener gone) is replaced; the new one is 0600.
        let path = dir.join("s.sock");
        drop(std::os::unix::net::UnixListener::bind(&path).expect("stale"));
        let live = bind_socket(&path).await.expect("replaces the stale socket");
        let meta = std::fs::symlink_metadata(&path).expect("socket");
        assert!(meta.file_type().is_socket());
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        // A live one is not.
        let e = bind_socket(&path).await.expect_err("in use");
        assert!(e.contains("in use"), "{e}");
        drop(live);
        // Nothing of the private directory is left behind.
        let left: Vec<_> = std::fs::read_dir(&dir)
            .expect("dir")
            .filter_map(Result::ok)
            .map(|e| e.file_name())
            .collect();
        assert_eq!(left.len(), 2, "{left:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[tokio::test]
    async fn a_non_loopback_listen_address_is_refused() {
        let config = kube::Config::new("http://127.0.0.1:9".parse().expect("url"));
        let client = kube::Client::try_from(config).expect("client");
        let executor = Executor::start(client, crate::executor::ExecutorConfig::new("unit"));
        let sidecar = Sidecar {
            executor,
            token: Some(Arc::new("0123456789abcdef".into())),
        };
        let addr: std::net::SocketAddr = "0.0.0.0:0".parse().expect("addr");
        let e = serve(Listen::Tcp(addr), sidecar, async {})
            .await
            .expect_err("0.0.0.0 is refused");
        assert!(e.contains("loopback"), "{e}");
    }

    #[test]
    fn a_put_body_has_defaults_and_rejects_unknown_fields() {
        let p: PutTask = serde_json::from_str(
            r#"{"template": {"spec": {"containers": [{"name": "m", "image": "x"}]}}}"#,
        )
        .expect("minimal body parses");
        assert_eq!((p.retries, p.max_system_failures), (0, 3));
        assert_eq!(p.bounds, Bounds::default());
        let e = serde_json::from_str::<PutTask>(r#"{"template": {}, "retry": 1}"#)
            .expect_err("a misspelt field is an error");
        assert!(e.to_string().contains("retry"), "{e}");
    }
}
