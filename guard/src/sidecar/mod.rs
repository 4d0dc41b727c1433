//! `graceguard sidecar`: the executor core as a local HTTP+JSON API, so an
//! executor in any language (Flyte's Go, Airflow's Python) gets the same
//! rules from one process that holds the Lease and the pod watch.
//!
//! The API is described by `guard/openapi.json`, generated from
//! [`handlers`] and [`api`] ([`openapi`]) and served at `/openapi.json`;
//! every error is an [`status::ApiStatus`]. `/v1` stays compatible: a change
//! that breaks a client is written in the CHANGELOG, with both clients
//! (`clients/go`, `clients/python`) updated in the same change.

pub mod api;
pub mod handlers;
mod listen;
pub mod metrics;
pub mod openapi;
mod paging;
pub mod status;
pub mod wire_events;

use std::sync::Arc;

use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::Router;

pub use api::{MAX_ACK_SEQS, MAX_WAIT_SECONDS};
pub use listen::{bind_socket, serve, serve_metrics, Listen, ListenError};
use status::{ApiStatus, Reason};

use crate::runtime::executor::Executor;

/// Every (method, path) of the API the router answers (`/metrics`, for
/// Prometheus, is served beside them), in OpenAPI's path syntax; a
/// test keeps it equal to the generated document's.
pub const ROUTES: &[(&str, &str)] = &[
    ("put", "/v1/tasks/{namespace}/{task}"),
    ("get", "/v1/tasks/{namespace}/{task}"),
    ("delete", "/v1/tasks/{namespace}/{task}"),
    ("post", "/v1/tasks/{namespace}/{task}/retry"),
    ("get", "/v1/tasks"),
    ("get", "/v1/events"),
    ("post", "/v1/events/ack"),
    ("get", "/healthz"),
    ("get", "/openapi.json"),
];

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
    use handlers::*;
    let api = Router::new()
        .route(
            "/v1/tasks/{namespace}/{task}",
            put(put_task).get(get_task).delete(delete_task),
        )
        .route("/v1/tasks/{namespace}/{task}/retry", post(retry_task))
        .route("/v1/tasks", get(list_tasks))
        .route("/v1/events", get(events))
        .route("/v1/events/ack", post(ack))
        // Behind the token on a TCP listener too, like every route that
        // says anything about this executor's work (tasks by phase, the
        // Lease held). Prometheus scrapes `--metrics-listen`, which serves
        // them alone, without the API.
        .route("/metrics", get(metrics::metrics))
        .route_layer(middleware::from_fn_with_state(sidecar.clone(), auth));
    Router::new()
        .merge(api)
        .route("/healthz", get(healthz))
        .route("/openapi.json", get(openapi))
        .fallback(|| async {
            ApiStatus::new(
                StatusCode::NOT_FOUND,
                Reason::NotFound,
                "no such endpoint; see /openapi.json",
            )
        })
        .method_not_allowed_fallback(|| async {
            ApiStatus::new(
                StatusCode::METHOD_NOT_ALLOWED,
                Reason::MethodNotAllowed,
                "this endpoint does not take that method; see /openapi.json",
            )
        })
        .layer(DefaultBodyLimit::max(api::MAX_BODY_BYTES))
        .with_state(sidecar)
}

/// The router of `--metrics-listen`: `/metrics` and `/healthz` only, so
/// Prometheus and a kubelet probe reach them on the pod's address while the
/// API itself stays on loopback or a socket.
pub fn metrics_router(sidecar: Sidecar) -> Router {
    Router::new()
        .route("/metrics", get(metrics::metrics))
        .route("/healthz", get(handlers::healthz))
        .fallback(|| async {
            ApiStatus::new(
                StatusCode::NOT_FOUND,
                Reason::NotFound,
                "this port serves /metrics and /healthz only; the API is on --socket or --listen",
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
            return ApiStatus::new(
                StatusCode::UNAUTHORIZED,
                Reason::Unauthorized,
                "missing or wrong bearer token; send Authorization: Bearer <the --token-file's content>",
            )
            .into_response();
        }
    }
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::api::PutTask;
    use super::*;
    use crate::core::bounds::Bounds;
    use std::time::Duration;

    #[test]
    fn the_openapi_document_lists_exactly_the_served_routes() {
        let doc: serde_json::Value =
            serde_json::from_str(openapi::COMMITTED).expect("openapi.json is JSON");
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
        offline_with(crate::runtime::executor::ExecutorConfig::new("unit"), token)
    }

    /// [`offline`] with an executor configured as `config`.
    fn offline_with(
        config: crate::runtime::executor::ExecutorConfig,
        token: Option<&str>,
    ) -> Result<Router, Box<dyn std::error::Error>> {
        let kube = kube::Config::new("http://127.0.0.1:9".parse()?);
        let client = kube::Client::try_from(kube)?;
        Ok(router(Sidecar {
            executor: Executor::start(client, config),
            token: token.map(|t| Arc::new(t.to_string())),
        }))
    }

    /// PUTs a task with a template of about `pad` bytes; the answer's code
    /// and reason.
    async fn put(app: &Router, task: &str, pad: usize) -> (u16, String) {
        use http_body_util::BodyExt;
        use tower::ServiceExt;
        let body = serde_json::json!({"template": {
            "metadata": {"annotations": {"pad": "x".repeat(pad)}},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]},
        }});
        let req = axum::http::Request::put(format!("/v1/tasks/ns/{task}"))
            .header(header::CONTENT_TYPE, "application/json")
            .body(axum::body::Body::from(body.to_string()));
        let Ok(req) = req else {
            return (0, String::new());
        };
        let resp = match app.clone().oneshot(req).await {
            Ok(r) => r,
            Err(never) => match never {},
        };
        let code = resp.status().as_u16();
        let bytes = resp
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
        (code, v["reason"].as_str().unwrap_or_default().to_string())
    }

    /// Many submissions cannot exhaust the sidecar's memory: past its task
    /// count or its template bytes a PUT answers 429 `TooManyTasks`; a task
    /// it knows is still answered.
    #[tokio::test]
    async fn past_its_limits_a_put_is_429_too_many_tasks() {
        let mut ec = crate::runtime::executor::ExecutorConfig::new("unit");
        ec.max_tasks = 2;
        ec.max_template_bytes = 10_000;
        let app = offline_with(ec, None).expect("router");
        assert_eq!(put(&app, "a", 10).await.0, 201);
        assert_eq!(put(&app, "b", 10).await.0, 201);
        assert_eq!(put(&app, "c", 10).await, (429, "TooManyTasks".into()));
        assert_eq!(
            put(&app, "a", 10).await.0,
            200,
            "a known task is still answered"
        );
        let mut ec = crate::runtime::executor::ExecutorConfig::new("unit");
        ec.max_template_bytes = 10_000;
        let app = offline_with(ec, None).expect("router");
        assert_eq!(put(&app, "a", 6_000).await.0, 201);
        assert_eq!(put(&app, "b", 6_000).await, (429, "TooManyTasks".into()));
        assert_eq!(
            put(&app, "c", 1_000).await.0,
            201,
            "a smaller one still fits"
        );
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
    async fn a_tcp_listener_wants_the_bearer_token_on_v1_and_metrics_but_not_on_healthz() {
        let app = offline(Some("0123456789abcdef-secret")).expect("router");
        let v1 = "/v1/tasks/ns/t";
        assert_eq!(status_of(app.clone(), v1, None).await, 401);
        assert_eq!(status_of(app.clone(), v1, Some("Bearer wrong")).await, 401);
        assert_eq!(
            status_of(app.clone(), v1, Some("Bearer 0123456789abcdef-secret")).await,
            503,
            "authorized: not synced yet (never a 404 before the first list)"
        );
        // Not synced (no API server): 503, but no token needed.
        assert_eq!(status_of(app.clone(), "/healthz", None).await, 503);
        assert_eq!(status_of(app.clone(), "/openapi.json", None).await, 200);
        // The metrics want the token on the API's TCP listener...
        assert_eq!(status_of(app.clone(), "/metrics", None).await, 401);
        assert_eq!(
            status_of(app, "/metrics", Some("Bearer 0123456789abcdef-secret")).await,
            200
        );
        // ...and are served without it on --metrics-listen, which has no API.
        let config = kube::Config::new("http://127.0.0.1:9".parse().expect("url"));
        let client = kube::Client::try_from(config).expect("client");
        let scrape = metrics_router(Sidecar {
            executor: Executor::start(
                client,
                crate::runtime::executor::ExecutorConfig::new("unit"),
            ),
            token: Some(Arc::new("0123456789abcdef-secret".into())),
        });
        assert_eq!(status_of(scrape.clone(), "/metrics", None).await, 200);
        assert_eq!(status_of(scrape, "/v1/tasks", None).await, 404);
        // A Unix socket needs no token.
        let app = offline(None).expect("router");
        assert_eq!(status_of(app, v1, None).await, 503);
    }

    /// Before the pod watch's first list the sidecar cannot tell which tasks
    /// exist: GET, DELETE (an abort), retry and list answer 503 `NotSynced`,
    /// never a 404 (an abort lost) or an empty page (a resync relaunching
    /// everything).
    #[tokio::test]
    async fn before_its_first_list_the_sidecar_answers_503_not_404_or_an_empty_list() {
        let app = offline(None).expect("router");
        for (method, path) in [
            ("GET", "/v1/tasks/ns/t"),
            ("DELETE", "/v1/tasks/ns/t"),
            ("DELETE", "/v1/tasks/ns/t?forget=true"),
            ("POST", "/v1/tasks/ns/t/retry"),
            ("GET", "/v1/tasks"),
            ("GET", "/v1/tasks?namespace=ns&limit=10"),
        ] {
            let (code, body) = call(app.clone(), method, path, "").await;
            assert_eq!(code, 503, "{method} {path}: {body}");
            assert_eq!(body["reason"], "NotSynced", "{method} {path}: {body}");
            assert!(
                body["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("retry shortly")),
                "{body}"
            );
        }
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
            body["message"].as_str().unwrap_or("").contains("epoch"),
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
            (code, body["reason"].as_str()),
            (409, Some("EpochChanged")),
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

    #[tokio::test]
    async fn every_failure_is_a_status_even_a_413_and_a_405() {
        let app = offline(None).expect("router");
        let big = format!(
            r#"{{"template": "{}"}}"#,
            "x".repeat(api::MAX_BODY_BYTES + 1)
        );
        let (code, body) = call(app.clone(), "PUT", "/v1/tasks/ns/t", &big).await;
        assert_eq!(
            (code, body["reason"].as_str()),
            (413, Some("TooLarge")),
            "{body}"
        );
        assert_eq!(body["kind"], "Status");
        let (code, body) = call(app.clone(), "PATCH", "/v1/tasks/ns/t", "{}").await;
        assert_eq!(
            (code, body["reason"].as_str()),
            (405, Some("MethodNotAllowed")),
            "{body}"
        );
        let (code, body) = call(app.clone(), "GET", "/v2/nothing", "").await;
        assert_eq!(
            (code, body["reason"].as_str()),
            (404, Some("NotFound")),
            "{body}"
        );
        let (code, body) = call(app.clone(), "GET", "/v1/tasks?limit=0", "").await;
        assert_eq!(
            (code, body["reason"].as_str()),
            (400, Some("BadRequest")),
            "{body}"
        );
        let (code, body) = call(app.clone(), "GET", "/v1/tasks?continue=nope", "").await;
        assert_eq!(
            (code, body["reason"].as_str()),
            (400, Some("BadRequest")),
            "{body}"
        );
        let (code, body) = call(app.clone(), "DELETE", "/v1/tasks/ns/t?forget=maybe", "").await;
        assert_eq!(
            (code, body["reason"].as_str()),
            (400, Some("BadRequest")),
            "{body}"
        );
        // Well-formed, before the first list: not an empty page.
        let (code, body) = call(app, "GET", "/v1/tasks", "").await;
        assert_eq!(
            (code, body["reason"].as_str()),
            (503, Some("NotSynced")),
            "{body}"
        );
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
        assert!(
            matches!(e, super::ListenError::NotASocket(_))
                && e.to_string().contains("not a socket"),
            "{e}"
        );
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
        assert!(
            matches!(e, super::ListenError::SocketInUse(_)) && e.to_string().contains("in use"),
            "{e}"
        );
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
        let executor = Executor::start(
            client,
            crate::runtime::executor::ExecutorConfig::new("unit"),
        );
        let sidecar = Sidecar {
            executor,
            token: Some(Arc::new("0123456789abcdef".into())),
        };
        let addr: std::net::SocketAddr = "0.0.0.0:0".parse().expect("addr");
        let e = serve(Listen::Tcp(addr), sidecar, async {})
            .await
            .expect_err("0.0.0.0 is refused");
        assert!(
            matches!(e, super::ListenError::NotLoopback(a) if a == addr)
                && e.to_string().contains("loopback"),
            "{e}"
        );
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
