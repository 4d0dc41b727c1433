//! Transport faults for a client under test: the API server did the work,
//! the caller never hears the answer (a timeout, a reset connection).

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use anyhow::{Context as _, Result};
use futures::future::BoxFuture;
use http::{Method, Request, Response};
use kube::client::{Body, ClientBuilder, DynBody};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::Client;
use tower::{BoxError, Service, ServiceExt};

type Inner = tower::util::BoxService<Request<Body>, Response<Box<DynBody>>, BoxError>;

/// How late watch events arrive through [`LoseFirstPodCreate`].
pub const WATCH_DELAY: std::time::Duration = std::time::Duration::from_millis(500);

/// Passes every request on; the first pod Create's answer is dropped after
/// the API server sent it, and the caller gets a transport error instead.
/// Watch events arrive [`WATCH_DELAY`] late, so the caller learns of the
/// lost answer before its watch shows the pod (the order that tempts a
/// blind re-Create).
pub struct LoseFirstPodCreate {
    inner: Arc<tokio::sync::Mutex<Inner>>,
    armed: Arc<AtomicBool>,
}

impl Service<Request<Body>> for LoseFirstPodCreate {
    type Response = Response<Box<DynBody>>;
    type Error = BoxError;
    type Future = BoxFuture<'static, Result<Self::Response, BoxError>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        let lose = req.method() == Method::POST
            && req.uri().path().ends_with("/pods")
            && self.armed.swap(false, Ordering::SeqCst);
        let watch = req.method() == Method::GET
            && req
                .uri()
                .query()
                .is_some_and(|q| q.split('&').any(|kv| kv == "watch=true" || kv == "watch=1"));
        let inner = self.inner.clone();
        Box::pin(async move {
            let answer = {
                let mut svc = inner.lock().await;
                svc.ready().await?;
                svc.call(req)
            };
            let resp = answer.await?;
            if lose {
                drop(resp);
                return Err("connection reset after the request was sent (simulated)".into());
            }
            if watch {
                return Ok(delayed(resp));
            }
            Ok(resp)
        })
    }
}

/// `resp` with each chunk of its body [`WATCH_DELAY`] late.
fn delayed(resp: Response<Box<DynBody>>) -> Response<Box<DynBody>> {
    use futures::StreamExt;
    use http_body_util::BodyExt;
    let (parts, body) = resp.into_parts();
    let chunks = body
        .into_data_stream()
        .then(|chunk| async move {
            tokio::time::sleep(WATCH_DELAY).await;
            chunk.map(hyper::body::Frame::data)
        })
        .boxed();
    let body: Box<DynBody> = Box::new(http_body_util::StreamBody::new(chunks));
    Response::from_parts(parts, body)
}

/// A client for `kubeconfig` whose first pod Create loses its answer; the
/// flag says whether that has happened yet (false once it has).
pub async fn client_losing_first_pod_create(
    kubeconfig: &Path,
) -> Result<(Client, Arc<AtomicBool>)> {
    let kc = Kubeconfig::read_from(kubeconfig)
        .with_context(|| format!("reading {}", kubeconfig.display()))?;
    let config = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await?;
    let armed = Arc::new(AtomicBool::new(true));
    let flag = armed.clone();
    let layer = tower::layer::layer_fn(move |inner: Inner| LoseFirstPodCreate {
        inner: Arc::new(tokio::sync::Mutex::new(inner)),
        armed: flag.clone(),
    });
    Ok((
        ClientBuilder::try_from(config)?.with_layer(&layer).build(),
        armed,
    ))
}
