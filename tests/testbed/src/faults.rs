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

/// How long watch events are held at most while the lost Create's pod has
/// not been read (then they flow again, whatever the caller did).
pub const WATCH_HOLD: std::time::Duration = std::time::Duration::from_secs(10);

/// Passes every request on; the first pod Create's answer is dropped after
/// the API server sent it, and the caller gets a transport error instead.
/// From then until the caller reads a pod by name (or [`WATCH_HOLD`]
/// passes), watch events are held back: the caller learns of the lost answer
/// before its watch shows the pod, however busy the machine (the order that
/// tempts a blind re-Create).
pub struct LoseFirstPodCreate {
    inner: Arc<tokio::sync::Mutex<Inner>>,
    armed: Arc<AtomicBool>,
    /// Set once a pod has been read by name after the loss.
    read: tokio::sync::watch::Sender<bool>,
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
        let single_pod = req.uri().path().contains("/pods/");
        if req.method() == Method::GET && !watch && single_pod && !self.armed.load(Ordering::SeqCst)
        {
            self.read.send_replace(true);
        }
        let armed = self.armed.clone();
        let read = self.read.subscribe();
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
                return Ok(held_back(resp, armed, read));
            }
            Ok(resp)
        })
    }
}

/// `resp` with each chunk of its body held while the loss has happened
/// and no pod has been read since (at most [`WATCH_HOLD`] per chunk).
fn held_back(
    resp: Response<Box<DynBody>>,
    armed: Arc<AtomicBool>,
    read: tokio::sync::watch::Receiver<bool>,
) -> Response<Box<DynBody>> {
    use futures::StreamExt;
    use http_body_util::BodyExt;
    let (parts, body) = resp.into_parts();
    let chunks = body
        .into_data_stream()
        .then(move |chunk| {
            let (armed, mut read) = (armed.clone(), read.clone());
            async move {
                if !armed.load(Ordering::SeqCst) {
                    let _ = tokio::time::timeout(WATCH_HOLD, read.wait_for(|r| *r)).await;
                }
                chunk.map(hyper::body::Frame::data)
            }
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
    let (read, _) = tokio::sync::watch::channel(false);
    let layer = tower::layer::layer_fn(move |inner: Inner| LoseFirstPodCreate {
        inner: Arc::new(tokio::sync::Mutex::new(inner)),
        armed: flag.clone(),
        read: read.clone(),
    });
    Ok((
        ClientBuilder::try_from(config)?.with_layer(&layer).build(),
        armed,
    ))
}
