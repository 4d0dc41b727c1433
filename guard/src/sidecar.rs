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
use crate::executor::{Executor, Marked, TaskError, TaskKey};
use crate::reconcile::TaskSpec;

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
}

fn default_limit() -> usize {
    500
}

/// `POST /v1/events/ack`'s body: `{"seq": N}` acknowledges every event up
/// to N (one consumer per sidecar), `{"seqs": [..]}` exactly those.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Ack {
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
            TaskError::NotEnded(_) => (StatusCode::CONFLICT, "not_ended"),
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

async fn auth(State(s): State<Sidecar>, req: Request, next: Next) -> Response {
    if let Some(token) = &s.token {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if given != Some(token.as_str()) {
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

async fn delete_task(
    State(s): State<Sidecar>,
    Path((namespace, task)): Path<(String, String)>,
) -> Result<Response, ApiFailure> {
    let st = s.executor.abort(&TaskKey::new(&namespace, &task)).await?;
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
            "the body is not {{\"seq\": N}} or {{\"seqs\": [N, ...]}}: {e}"
        ))
    })?;
    let marks = match (a.seq, a.seqs) {
        (Some(seq), None) => s.executor.ack(seq).await,
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

/// Binds a Unix socket at `path`. A file left there by a killed sidecar
/// (nothing accepts on it) is replaced; a live one is an error.
pub async fn bind_socket(path: &std::path::Path) -> Result<tokio::net::UnixListener, String> {
    use std::os::unix::fs::PermissionsExt;
    if path.exists() {
        match tokio::net::UnixStream::connect(path).await {
            Ok(_) => {
                return Err(format!(
                    "{} is in use by a running process (another sidecar?); stop it or choose another --socket",
                    path.display()
                ))
            }
            Err(_) => std::fs::remove_file(path).map_err(|e| {
                format!(
                    "{} is a stale socket and cannot be removed ({e}); remove it by hand",
                    path.display()
                )
            })?,
        }
    }
    let listener = tokio::net::UnixListener::bind(path)
        .map_err(|e| format!("cannot listen on {}: {e}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| format!("cannot restrict {} to its owner: {e}", path.display()))?;
    Ok(listener)
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
