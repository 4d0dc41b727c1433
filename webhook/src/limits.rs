//! The admission port's limits: what one client, and all of them together,
//! may hold of graceguard.
//!
//! The API server sends its reviews over a few long-lived HTTP/2 connections,
//! each review a small body sent at once and answered within the webhook's
//! `timeoutSeconds`. Anything else that reaches the port (any pod, unless a
//! NetworkPolicy says otherwise) must not be able to make those reviews wait:
//! at every limit graceguard refuses at once instead of queueing, so a review
//! caught by one fails fast and the API server applies the webhook's
//! `failurePolicy` (the chart's `Ignore`: allowed) instead of waiting out its
//! timeout. The limits, each counted in `graceguard_admission_limited_total`:
//! * connections per client address ([`PerClient`]): one address cannot take
//!   the connection slots (the overall cap is in `server`);
//! * requests in flight: past the cap, 503 at once (tower's load shedding in
//!   front of its global concurrency limit, see `server::admission_router`),
//!   and from one address at most its own cap ([`Intake`]);
//! * body bytes in flight ([`Intake`]): each chunk of a body is charged as
//!   it arrives, overall and to its address's share; one that does not fit
//!   ends the request with 503 at once, so one flooding address cannot take
//!   what the API server's reviews need, and a client that announces a large
//!   body and sends it slowly holds only what it has sent;
//! * the body read: the whole body within a few seconds, else 408, so a
//!   client that sends its body a byte at a time holds nothing for long.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt;
use prometheus_client::metrics::counter::Counter;
use tokio::sync::Semaphore;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

/// Requests and connections the port's limits refused at once, by limit.
#[derive(Clone, Default)]
pub struct LimitMetrics {
    pub limited: Family<LimitLabels, Counter>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LimitLabels {
    /// Which limit: `in_flight`, `body_bytes`, `body_timeout`,
    /// `connections_per_client`.
    pub limit: &'static str,
}

impl LimitMetrics {
    /// The series, registered.
    pub fn register(r: &mut Registry) -> Self {
        let m = Self::default();
        r.register(
            "admission_limited",
            "Admission requests and connections refused at once by a limit of the port (load shed, so the API server applies failurePolicy instead of waiting), by limit",
            m.limited.clone(),
        );
        m
    }

    /// The counter of refusals by `limit`, resolved once by its holder.
    pub fn counter(&self, limit: &'static str) -> Counter {
        self.limited.get_or_create(&LimitLabels { limit }).clone()
    }
}

/// The port's numbers (flags `--max-*`, `--body-timeout`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Connections open at once, all clients together.
    pub max_connections: usize,
    /// Connections open at once from one client address.
    pub max_connections_per_client: usize,
    /// Admission requests being answered at once.
    pub max_in_flight: usize,
    /// Admission requests being answered at once from one client address.
    pub max_in_flight_per_client: usize,
    /// The largest request body.
    pub max_body_bytes: usize,
    /// Body bytes of all requests in flight together.
    pub max_body_bytes_in_flight: usize,
    /// Body bytes of the requests in flight from one client address.
    pub max_body_bytes_in_flight_per_client: usize,
    /// How long a client may take to send a request's whole body.
    pub body_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: 1024,
            max_connections_per_client: 64,
            // An attacker needs 16 addresses holding their whole share to
            // take every place; the API server's reviews need a few at once.
            max_in_flight: 512,
            max_in_flight_per_client: 32,
            max_body_bytes: 4 * 1024 * 1024,
            max_body_bytes_in_flight: 32 * 1024 * 1024,
            max_body_bytes_in_flight_per_client: 8 * 1024 * 1024,
            body_timeout: Duration::from_secs(5),
        }
    }
}

/// A limit that does not fit with the others.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LimitError {
    #[error("{0} must be at least 1")]
    Zero(&'static str),
    #[error("--max-body-bytes-in-flight ({in_flight}) must be at least --max-body-bytes ({body}): otherwise no request of the largest size could ever be admitted")]
    BudgetBelowBody { in_flight: usize, body: usize },
    #[error("{what}-per-client ({per_client}) must not exceed {what} ({total})")]
    PerClientAboveTotal {
        what: &'static str,
        per_client: usize,
        total: usize,
    },
    #[error("--max-body-bytes-in-flight-per-client ({per_client}) must be at least --max-body-bytes ({body}): otherwise no request of the largest size could ever be admitted")]
    ShareBelowBody { per_client: usize, body: usize },
    #[error("--max-body-bytes-in-flight ({0}) is too large; use at most 4294967295")]
    BudgetTooLarge(usize),
}

impl Limits {
    /// Checks that the numbers can work together.
    pub fn check(&self) -> Result<(), LimitError> {
        for (what, n) in [
            ("--max-connections", self.max_connections),
            (
                "--max-connections-per-client",
                self.max_connections_per_client,
            ),
            ("--max-in-flight", self.max_in_flight),
            ("--max-in-flight-per-client", self.max_in_flight_per_client),
            ("--max-body-bytes", self.max_body_bytes),
        ] {
            if n == 0 {
                return Err(LimitError::Zero(what));
            }
        }
        if self.body_timeout.is_zero() {
            return Err(LimitError::Zero("--body-timeout"));
        }
        if self.max_body_bytes_in_flight < self.max_body_bytes {
            return Err(LimitError::BudgetBelowBody {
                in_flight: self.max_body_bytes_in_flight,
                body: self.max_body_bytes,
            });
        }
        if u32::try_from(self.max_body_bytes_in_flight).is_err() {
            return Err(LimitError::BudgetTooLarge(self.max_body_bytes_in_flight));
        }
        if self.max_body_bytes_in_flight_per_client < self.max_body_bytes {
            return Err(LimitError::ShareBelowBody {
                per_client: self.max_body_bytes_in_flight_per_client,
                body: self.max_body_bytes,
            });
        }
        for (what, per_client, total) in [
            (
                "--max-connections",
                self.max_connections_per_client,
                self.max_connections,
            ),
            (
                "--max-in-flight",
                self.max_in_flight_per_client,
                self.max_in_flight,
            ),
            (
                "--max-body-bytes-in-flight",
                self.max_body_bytes_in_flight_per_client,
                self.max_body_bytes_in_flight,
            ),
        ] {
            if per_client > total {
                return Err(LimitError::PerClientAboveTotal {
                    what,
                    per_client,
                    total,
                });
            }
        }
        Ok(())
    }
}

/// Open connections per client address, at most `cap` each, except from
/// the addresses in `trusted` (the API servers), which the cap never holds.
pub struct PerClient {
    open: Mutex<HashMap<IpAddr, usize>>,
    cap: usize,
    trusted: TrustedPeers,
    refused: Counter,
}

impl PerClient {
    pub fn new(cap: usize, trusted: TrustedPeers, metrics: &LimitMetrics) -> Arc<Self> {
        Arc::new(Self {
            open: Mutex::new(HashMap::new()),
            cap: cap.max(1),
            trusted,
            refused: metrics.counter("connections_per_client"),
        })
    }

    /// A slot for one more connection from `ip`, held for the connection's
    /// life; `None` (counted) when `ip` already holds its cap.
    pub fn admit(self: &Arc<Self>, ip: IpAddr) -> Option<ClientSlot> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        let n = open.entry(ip).or_insert(0);
        if *n >= self.cap {
            drop(open);
            self.refused.inc();
            return None;
        }
        *n += 1;
        Some(ClientSlot {
            owner: Arc::clone(self),
            ip,
        })
    }

    /// Whether `ip` is an API server's address (`--trusted-peers`): its
    /// connections and requests are never held to a per-address cap.
    pub fn trusts(&self, ip: IpAddr) -> bool {
        self.trusted.contains(ip)
    }

    /// Connections open from `ip` now.
    pub fn open_from(&self, ip: IpAddr) -> usize {
        let open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        open.get(&ip).copied().unwrap_or(0)
    }
}

/// One connection's place in its client's count; given back when dropped.
pub struct ClientSlot {
    owner: Arc<PerClient>,
    ip: IpAddr,
}

impl Drop for ClientSlot {
    fn drop(&mut self) {
        let mut open = self.owner.open.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = open.get_mut(&self.ip) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

/// How graceguard knows a client is the API server, if it does. The
/// per-address caps exist to keep everyone else from taking what the API
/// server's reviews need; applied to the API server itself (one address for
/// every review it sends, or for all API servers behind one SNAT) they would
/// refuse its reviews under load, so a trusted client is never held to them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trust {
    /// Nothing says who it is: held to the per-address caps.
    None,
    /// Its address is in `--trusted-peers`.
    Address,
    /// It presented a client certificate `--client-ca-file` verified.
    Certificate,
}

impl Trust {
    /// Whether the per-address caps pass it by.
    pub fn is_trusted(self) -> bool {
        !matches!(self, Trust::None)
    }

    /// The audit record's `peer_authenticated`: how the sender is known.
    pub fn as_str(self) -> &'static str {
        match self {
            Trust::None => "no",
            Trust::Address => "trusted_address",
            Trust::Certificate => "client_certificate",
        }
    }
}

/// Who sent a request, put on each request of a connection (by `server`):
/// the address (the per-address shares), how it is trusted, and the client
/// certificate's name under mutual TLS (the audit record says who really
/// sent a review, not only who the review claims).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Peer {
    pub ip: IpAddr,
    pub trust: Trust,
    /// Shared: every request of the connection carries a copy of the peer.
    pub certificate_name: Option<Arc<str>>,
}

impl Peer {
    /// A client known by its address alone.
    pub fn untrusted(ip: IpAddr) -> Self {
        Self {
            ip,
            trust: Trust::None,
            certificate_name: None,
        }
    }
}

/// The addresses (`--trusted-peers`) of the API servers: in the admission
/// port's view, where the API server's reviews come from (its host address,
/// or the proxy in front of it), never a pod network's range.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TrustedPeers(Vec<ipnet::IpNet>);

impl TrustedPeers {
    pub fn new(nets: Vec<ipnet::IpNet>) -> Self {
        Self(nets)
    }

    /// Whether `ip` is in one of the ranges (an IPv4 client seen on an IPv6
    /// socket as `::ffff:a.b.c.d` counts as `a.b.c.d`).
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.0.iter().any(|n| n.contains(&ip))
    }
}

/// Reads one `--trusted-peers` entry: a CIDR (`10.0.0.0/24`, `fd00::/64`) or
/// one address (taken as `/32` or `/128`).
pub fn parse_trusted_peer(s: &str) -> Result<ipnet::IpNet, TrustedPeerError> {
    let s = s.trim();
    if let Ok(net) = s.parse::<ipnet::IpNet>() {
        return Ok(net.trunc());
    }
    s.parse::<IpAddr>()
        .map(ipnet::IpNet::from)
        .map_err(|_| TrustedPeerError(s.to_string()))
}

/// A `--trusted-peers` entry that is neither an address nor a CIDR range.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0:?} is neither an address nor a CIDR range; give the API servers' addresses as 10.0.0.10, 10.0.0.0/24 or fd00::/64")]
pub struct TrustedPeerError(pub String);

/// What one address has in flight.
#[derive(Default)]
struct Usage {
    requests: usize,
    bytes: usize,
}

/// The body budget, the per-address shares and the body-read deadline,
/// applied before a handler sees the request (see the module docs).
pub struct Intake {
    bytes: Arc<Semaphore>,
    clients: Mutex<HashMap<IpAddr, Usage>>,
    limits: Limits,
    over_budget: Counter,
    over_share: Counter,
    timed_out: Counter,
}

/// A request's place in its address's share and the bytes of its body
/// received so far, given back when the answer is ready. A trusted client's
/// request has no share (`ip` is `None`): only the overall budget holds it.
struct Ticket<'a> {
    intake: &'a Intake,
    ip: Option<IpAddr>,
    bytes: usize,
    budget: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl Ticket<'_> {
    /// Charges `n` more received body bytes, or says why they do not fit.
    fn reserve(&mut self, n: usize) -> Result<(), Refusal> {
        if n == 0 {
            return Ok(());
        }
        // A trusted client has no share: only the budget, and no lock.
        let Some(ip) = self.ip else {
            return self.charge_budget(n);
        };
        let intake = self.intake;
        let mut clients = intake.clients.lock().unwrap_or_else(|p| p.into_inner());
        let u = clients.entry(ip).or_default();
        if u.bytes.saturating_add(n) > intake.limits.max_body_bytes_in_flight_per_client {
            return Err(Refusal::Share);
        }
        self.charge_budget(n)?;
        u.bytes += n;
        Ok(())
    }

    /// Takes `n` more bytes of the overall budget.
    fn charge_budget(&mut self, n: usize) -> Result<(), Refusal> {
        let permits = u32::try_from(n).map_err(|_| Refusal::Budget)?;
        let more = Arc::clone(&self.intake.bytes)
            .try_acquire_many_owned(permits)
            .map_err(|_| Refusal::Budget)?;
        match &mut self.budget {
            Some(held) => held.merge(more),
            None => self.budget = Some(more),
        }
        self.bytes += n;
        Ok(())
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        let Some(ip) = self.ip else {
            return;
        };
        let mut clients = self
            .intake
            .clients
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(u) = clients.get_mut(&ip) {
            u.requests = u.requests.saturating_sub(1);
            u.bytes = u.bytes.saturating_sub(self.bytes);
            if u.requests == 0 {
                clients.remove(&ip);
            }
        }
    }
}

/// Why a request was not admitted, or its body not taken.
#[derive(Debug, PartialEq, Eq)]
enum Refusal {
    Share,
    Budget,
}

impl Intake {
    pub fn new(limits: &Limits, metrics: &LimitMetrics) -> Arc<Self> {
        let counter = |limit| metrics.counter(limit);
        Arc::new(Self {
            bytes: Arc::new(Semaphore::new(limits.max_body_bytes_in_flight)),
            clients: Mutex::new(HashMap::new()),
            limits: *limits,
            over_budget: counter("body_bytes"),
            over_share: counter("per_client_share"),
            timed_out: counter("body_timeout"),
        })
    }

    /// Admits one more request from `ip` (its body is charged as it
    /// arrives), or says why not. A trusted client is held to the overall
    /// budgets alone.
    fn admit(&self, ip: IpAddr, trust: Trust) -> Result<Ticket<'_>, Refusal> {
        if trust.is_trusted() {
            return Ok(Ticket {
                intake: self,
                ip: None,
                bytes: 0,
                budget: None,
            });
        }
        let mut clients = self.clients.lock().unwrap_or_else(|p| p.into_inner());
        let u = clients.entry(ip).or_default();
        if u.requests >= self.limits.max_in_flight_per_client {
            return Err(Refusal::Share);
        }
        u.requests += 1;
        Ok(Ticket {
            intake: self,
            ip: Some(ip),
            bytes: 0,
            budget: None,
        })
    }

    fn refused(&self, ip: IpAddr, why: &Refusal) -> Response {
        let message = match why {
            Refusal::Share => {
                self.over_share.inc();
                format!("{ip} is at its share of admission requests or body bytes in flight (--max-in-flight-per-client, --max-body-bytes-in-flight-per-client); answered at once so the API server applies the webhook's failurePolicy. If {ip} is an API server, name it in --trusted-peers or give it a client certificate (--client-ca-file): the per-address caps never hold a trusted client")
            }
            Refusal::Budget => {
                self.over_budget.inc();
                "graceguard is at its budget of admission body bytes in flight (--max-body-bytes-in-flight); answered at once so the API server applies the webhook's failurePolicy".to_string()
            }
        };
        (StatusCode::SERVICE_UNAVAILABLE, message).into_response()
    }
}

/// Whether a request declares a body larger than the largest allowed.
fn declares_too_much(req: &Request, max_body: usize) -> bool {
    req.headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok())
        .is_some_and(|n| n > max_body)
}

/// Why a body could not be read whole.
enum ReadError {
    TooLarge,
    Refused(Refusal),
    Body(String),
}

/// Reads `body` whole, charging each chunk to `ticket` as it arrives: a
/// client that announces a large body and sends it slowly holds only what
/// it has sent.
async fn read_charged(
    body: Body,
    max_body: usize,
    ticket: &mut Ticket<'_>,
) -> Result<Bytes, ReadError> {
    let mut body = http_body_util::Limited::new(body, max_body);
    let mut buf = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| {
            if e.is::<http_body_util::LengthLimitError>() {
                ReadError::TooLarge
            } else {
                ReadError::Body(e.to_string())
            }
        })?;
        if let Some(data) = frame.data_ref() {
            ticket.reserve(data.len()).map_err(ReadError::Refused)?;
            buf.extend_from_slice(data);
        }
    }
    Ok(Bytes::from(buf))
}

/// The middleware: admits the request within its address's share, reads
/// its body within the deadline and the byte budgets, then hands it on, the
/// budget held until the answer is ready.
pub async fn intake(State(intake): State<Arc<Intake>>, req: Request, next: Next) -> Response {
    let max_body = intake.limits.max_body_bytes;
    if declares_too_much(&req, max_body) {
        return too_large(max_body);
    }
    let (ip, trust) = req
        .extensions()
        .get::<Peer>()
        .map_or((IpAddr::from([0, 0, 0, 0]), Trust::None), |p| {
            (p.ip, p.trust)
        });
    let mut ticket = match intake.admit(ip, trust) {
        Ok(t) => t,
        Err(why) => return intake.refused(ip, &why),
    };
    let (parts, body) = req.into_parts();
    let read = read_charged(body, max_body, &mut ticket);
    let bytes = match tokio::time::timeout(intake.limits.body_timeout, read).await {
        Ok(Ok(bytes)) => bytes,
        Ok(Err(ReadError::TooLarge)) => return too_large(max_body),
        Ok(Err(ReadError::Refused(why))) => return intake.refused(ip, &why),
        Ok(Err(ReadError::Body(e))) => {
            return (
                StatusCode::BAD_REQUEST,
                format!("reading the request body: {e}; send the whole AdmissionReview"),
            )
                .into_response()
        }
        Err(_) => {
            intake.timed_out.inc();
            return (
                StatusCode::REQUEST_TIMEOUT,
                format!(
                    "the request body did not arrive within {:?} (--body-timeout)",
                    intake.limits.body_timeout
                ),
            )
                .into_response();
        }
    };
    let answer = next
        .run(Request::from_parts(parts, Body::from(bytes)))
        .await;
    drop(ticket);
    answer
}

fn too_large(max_body: usize) -> Response {
    (
        StatusCode::PAYLOAD_TOO_LARGE,
        format!("the request body is larger than {max_body} bytes (--max-body-bytes)"),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::routing::post;
    use axum::Router;
    use tower::ServiceExt;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([127, 0, 0, last])
    }

    /// `graceguard_admission_limited_total{limit}` now.
    fn limited(metrics: &LimitMetrics, limit: &'static str) -> u64 {
        metrics.limited.get_or_create(&LimitLabels { limit }).get()
    }

    #[test]
    fn one_address_holds_at_most_its_cap_and_gets_slots_back() {
        let metrics = LimitMetrics::default();
        let per = PerClient::new(2, TrustedPeers::default(), &metrics);
        let a1 = per.admit(ip(1));
        let a2 = per.admit(ip(1));
        assert!(a1.is_some() && a2.is_some());
        assert!(per.admit(ip(1)).is_none(), "third from one address");
        assert!(
            per.admit(ip(2)).is_some(),
            "another address is counted apart"
        );
        drop(a1);
        assert_eq!(per.open_from(ip(1)), 1);
        assert!(
            per.admit(ip(1)).is_some(),
            "a closed connection frees its slot"
        );
        let refused = limited(&metrics, "connections_per_client");
        assert_eq!(refused, 1);
    }

    #[test]
    fn limits_that_cannot_work_together_are_refused() {
        assert_eq!(Limits::default().check(), Ok(()));
        let small_budget = Limits {
            max_body_bytes_in_flight: 1024,
            ..Limits::default()
        };
        assert!(matches!(
            small_budget.check(),
            Err(LimitError::BudgetBelowBody { .. })
        ));
        let per_client = Limits {
            max_connections: 10,
            max_connections_per_client: 11,
            ..Limits::default()
        };
        assert!(matches!(
            per_client.check(),
            Err(LimitError::PerClientAboveTotal { .. })
        ));
        let share = Limits {
            max_in_flight_per_client: Limits::default().max_in_flight + 1,
            ..Limits::default()
        };
        assert!(matches!(
            share.check(),
            Err(LimitError::PerClientAboveTotal {
                what: "--max-in-flight",
                ..
            })
        ));
        let zero = Limits {
            max_in_flight: 0,
            ..Limits::default()
        };
        assert_eq!(zero.check(), Err(LimitError::Zero("--max-in-flight")));
    }

    fn router(limits: Limits) -> (Router, LimitMetrics) {
        let metrics = LimitMetrics::default();
        let intake_state = Intake::new(&limits, &metrics);
        let router = Router::new()
            .route(
                "/",
                post(|body: axum::body::Bytes| async move { body.len().to_string() }),
            )
            .layer(axum::middleware::from_fn_with_state(intake_state, intake));
        (router, metrics)
    }

    /// A POST of `body` from 127.0.0.`from`.
    fn post_from(from: u8, body: Body, len: Option<usize>) -> Request {
        let mut b = axum::http::Request::post("/").extension(Peer::untrusted(ip(from)));
        if let Some(n) = len {
            b = b.header(header::CONTENT_LENGTH, n);
        }
        b.body(body).unwrap_or_default()
    }

    fn post_body(body: Body, len: Option<usize>) -> Request {
        post_from(1, body, len)
    }

    #[tokio::test]
    async fn a_body_is_read_whole_and_a_slow_one_is_cut_off() {
        let limits = Limits {
            body_timeout: Duration::from_millis(200),
            ..Limits::default()
        };
        let (r, metrics) = router(limits);
        let ok = r
            .clone()
            .oneshot(post_body(Body::from("hello"), Some(5)))
            .await
            .map_err(|e| e.to_string());
        assert_eq!(ok.map(|a| a.status()), Ok(StatusCode::OK));
        // A body that never finishes: 408 after the deadline, counted.
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Vec<u8>, std::io::Error>>(1);
        let stream = tokio_stream_of(rx);
        let slow = r
            .oneshot(post_body(Body::from_stream(stream), Some(100)))
            .await;
        drop(tx);
        assert_eq!(
            slow.map(|a| a.status()).map_err(|e| e.to_string()),
            Ok(StatusCode::REQUEST_TIMEOUT)
        );
        let timed_out = limited(&metrics, "body_timeout");
        assert_eq!(timed_out, 1);
    }

    /// A body stream fed by a channel (never fed here: it stays pending).
    fn tokio_stream_of(
        mut rx: tokio::sync::mpsc::Receiver<Result<Vec<u8>, std::io::Error>>,
    ) -> impl futures::Stream<Item = Result<Vec<u8>, std::io::Error>> {
        futures::stream::poll_fn(move |cx| rx.poll_recv(cx))
    }

    #[tokio::test]
    async fn one_address_holds_at_most_its_share_and_leaves_the_rest_to_others() {
        let limits = Limits {
            max_body_bytes: 100,
            max_body_bytes_in_flight: 300,
            max_body_bytes_in_flight_per_client: 150,
            max_in_flight_per_client: 2,
            ..Limits::default()
        };
        let metrics = LimitMetrics::default();
        let intake = Intake::new(&limits, &metrics);
        let (a, b) = (ip(2), ip(3));
        let mut t1 = intake.admit(a, Trust::None).map_err(|e| format!("{e:?}"));
        assert_eq!(t1.as_mut().map(|t| t.reserve(100)), Ok(Ok(())));
        // 60 more bytes from a (a second request): past its 150-byte share,
        // though the budget has 200 left.
        let mut t2 = intake.admit(a, Trust::None).map_err(|e| format!("{e:?}"));
        assert_eq!(t2.as_mut().map(|t| t.reserve(60)), Ok(Err(Refusal::Share)));
        // A third request from a: past its 2 in flight.
        assert!(matches!(intake.admit(a, Trust::None), Err(Refusal::Share)));
        // The other address has its own share.
        let mut t3 = intake.admit(b, Trust::None).map_err(|e| format!("{e:?}"));
        assert_eq!(t3.as_mut().map(|t| t.reserve(100)), Ok(Ok(())));
        // Given back when done: a may send again.
        drop((t1, t2));
        let mut t4 = intake.admit(a, Trust::None).map_err(|e| format!("{e:?}"));
        assert_eq!(t4.as_mut().map(|t| t.reserve(100)), Ok(Ok(())));
        drop((t3, t4));
        assert_eq!(intake.bytes.available_permits(), 300);
    }

    #[test]
    fn a_trusted_client_is_never_held_to_a_share_only_to_the_budget() {
        let limits = Limits {
            max_body_bytes: 100,
            max_body_bytes_in_flight: 300,
            max_body_bytes_in_flight_per_client: 100,
            max_in_flight_per_client: 2,
            ..Limits::default()
        };
        let metrics = LimitMetrics::default();
        let intake = Intake::new(&limits, &metrics);
        let trusted = TrustedPeers::new(vec![
            parse_trusted_peer("10.0.0.0/24").unwrap_or_else(|e| panic!("{e}")),
            parse_trusted_peer("fd00::1").unwrap_or_else(|e| panic!("{e}")),
        ]);
        let api_server = IpAddr::from([10, 0, 0, 7]);
        assert!(trusted.contains(api_server));
        assert!(trusted.contains("::ffff:10.0.0.7".parse().unwrap_or(api_server)));
        assert!(trusted.contains("fd00::1".parse().unwrap_or(api_server)));
        assert!(!trusted.contains("fd00::2".parse().unwrap_or(api_server)));
        assert!(!trusted.contains(IpAddr::from([10, 0, 1, 7])));
        let by_address = Peer {
            ip: api_server,
            trust: Trust::Address,
            certificate_name: None,
        };
        // Ten requests at once from the API server's one address, though
        // the share is two: none refused.
        let held: Vec<_> = (0..10)
            .map(|_| intake.admit(by_address.ip, by_address.trust))
            .collect();
        assert!(held.iter().all(Result::is_ok));
        // Its bytes still count against the overall budget (300), past its
        // would-be share (100).
        let mut held: Vec<_> = held.into_iter().filter_map(Result::ok).collect();
        for t in held.iter_mut().take(3) {
            assert_eq!(t.reserve(100), Ok(()));
        }
        assert_eq!(held[3].reserve(1), Err(Refusal::Budget));
        // An untrusted address beside it keeps its own share of two.
        let other = Peer::untrusted(IpAddr::from([10, 0, 1, 7]));
        let o1 = intake.admit(other.ip, other.trust);
        let o2 = intake.admit(other.ip, other.trust);
        assert!(o1.is_ok() && o2.is_ok());
        assert!(matches!(
            intake.admit(other.ip, other.trust),
            Err(Refusal::Share)
        ));
        drop(held);
        assert_eq!(intake.bytes.available_permits(), 300);
        assert_eq!(
            parse_trusted_peer("10.0.0.9/24").map(|n| n.to_string()),
            Ok("10.0.0.0/24".to_string())
        );
        assert!(parse_trusted_peer("apiserver").is_err());
    }

    #[tokio::test]
    async fn bodies_past_the_budget_are_refused_at_once_and_too_large_ones_always() {
        let limits = Limits {
            max_body_bytes: 100,
            max_body_bytes_in_flight: 150,
            max_body_bytes_in_flight_per_client: 100,
            body_timeout: Duration::from_secs(5),
            ..Limits::default()
        };
        let (r, metrics) = router(limits);
        // A request that announces 100 bytes and has sent 10 holds 10, not
        // 100: another address's 60 fit.
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Vec<u8>, std::io::Error>>(4);
        let holder = tokio::spawn(r.clone().oneshot(post_from(
            1,
            Body::from_stream(tokio_stream_of(rx)),
            Some(100),
        )));
        let send = |n: usize| {
            let tx = tx.clone();
            async move { tx.send(Ok(vec![b'x'; n])).await.map_err(|e| e.to_string()) }
        };
        assert_eq!(send(10).await, Ok(()));
        tokio::time::sleep(Duration::from_millis(50)).await;
        let fits_beside = r
            .clone()
            .oneshot(post_from(2, Body::from(vec![b'x'; 60]), Some(60)))
            .await
            .map(|a| a.status())
            .map_err(|e| e.to_string());
        assert_eq!(fits_beside, Ok(StatusCode::OK));
        // Now it has sent 90 more (100 held, of its 100-byte share).
        assert_eq!(send(90).await, Ok(()));
        tokio::time::sleep(Duration::from_millis(50)).await;
        // 60 more, from another address, do not fit in the 50 left: 503 at once.
        let started = std::time::Instant::now();
        let shed = r
            .clone()
            .oneshot(post_from(2, Body::from(vec![b'x'; 60]), Some(60)))
            .await
            .map(|a| a.status())
            .map_err(|e| e.to_string());
        assert_eq!(shed, Ok(StatusCode::SERVICE_UNAVAILABLE));
        assert!(started.elapsed() < Duration::from_secs(1));
        // 40 fit.
        let fits = r
            .clone()
            .oneshot(post_from(3, Body::from(vec![b'x'; 40]), Some(40)))
            .await
            .map(|a| a.status())
            .map_err(|e| e.to_string());
        assert_eq!(fits, Ok(StatusCode::OK));
        // Declared larger than the largest body: 413, whatever is left.
        let big = r
            .oneshot(post_body(Body::from(vec![b'x'; 101]), Some(101)))
            .await
            .map(|a| a.status())
            .map_err(|e| e.to_string());
        assert_eq!(big, Ok(StatusCode::PAYLOAD_TOO_LARGE));
        let over = limited(&metrics, "body_bytes");
        assert_eq!(over, 1);
        holder.abort();
    }
}
