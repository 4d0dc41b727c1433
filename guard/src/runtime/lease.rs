//! An executor instance's liveness and fencing: a `coordination.k8s.io/v1`
//! Lease its process holds.
//!
//! Two processes must never act for one instance at once (both would launch
//! the same attempt names and deliver the same results), and adoption (rule
//! 6) must tell pods of a dead instance from pods of a live one. The Lease
//! does both, the way client-go's leader election does:
//!
//! * every process has its own holder identity; acquiring, renewing and
//!   releasing are writes conditional on the Lease's `resourceVersion`, so
//!   of two processes racing for it exactly one wins;
//! * expiry is judged from renewals *observed locally* ([`Observer`]): a
//!   Lease whose `resourceVersion` has not changed for its duration, by this
//!   process's monotonic clock, is expired. The holder's `renewTime` is never
//!   compared with the local clock, so clock skew between nodes cannot make
//!   a live holder look dead;
//! * the fence is a deadline ([`Fence`]): a process may act until two thirds
//!   of the duration after it *sent* its last successful renewal, by its own
//!   monotonic clock, whether or not a failure ever comes back. A renewal
//!   that hangs (a half-open connection, a stalled API server replica, a
//!   paused VM) closes it as surely as one that fails, because every renewal
//!   is bounded by a timeout and [`Fence::holds`] compares the deadline with
//!   the clock at each call. Another process can take the Lease only a full
//!   duration after it observed that renewal, which it cannot have observed
//!   before it was sent: the third in between is the margin. It acts again
//!   once it holds the Lease again.

use std::sync::Arc;
use std::time::Duration;

use graceguard_contract::fencing::Token;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client, ResourceExt};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::runtime::error::GuardError;

/// The default Lease duration.
pub const DEFAULT_DURATION: Duration = Duration::from_secs(30);

/// How long [`InstanceLease::acquire`] waits for a Lease held by another
/// process by default: long enough for a SIGKILLed holder's Lease to lapse.
pub const DEFAULT_ACQUIRE_WAIT: Duration = Duration::from_secs(300);

/// The annotation on the Lease naming the container its holder runs in
/// (`<pod uid>/<container name>`), when the process knows it.
pub const HOLDER_CONTAINER_ANNOTATION: &str = "graceguard.io/holder-container";

/// The annotation on the Lease with its holder's process id.
pub const HOLDER_PID_ANNOTATION: &str = "graceguard.io/holder-pid";

/// The container a process runs in, as the kubelet knows it: its pod's uid
/// and the container's name (from the downward API: `GRACEGUARD_POD_UID`,
/// `GRACEGUARD_CONTAINER_NAME`). The kubelet never runs two instances of one
/// container of one pod at once, so a process restarted in the same
/// container knows its predecessor there is gone and need not wait out its
/// Lease ([`predecessor_gone`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerId {
    pub pod_uid: String,
    pub container: String,
}

impl ContainerId {
    /// From `GRACEGUARD_POD_UID` and `GRACEGUARD_CONTAINER_NAME`, when both are set.
    pub fn from_env() -> Option<Self> {
        let get = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        Some(Self {
            pod_uid: get("GRACEGUARD_POD_UID")?,
            container: get("GRACEGUARD_CONTAINER_NAME")?,
        })
    }

    fn annotation(&self) -> String {
        format!("{}/{}", self.pod_uid, self.container)
    }
}

/// Whether `lease`'s holder ran in this very container (`me`) and is gone:
/// the container is the same, so the kubelet has ended the instance the
/// holder ran in, unless the holder is a process still running beside this
/// one in it (its pid alive here and not this process's own).
pub fn predecessor_gone(
    lease: &Lease,
    me: &ContainerId,
    my_pid: u32,
    pid_alive: impl Fn(u32) -> bool,
) -> bool {
    let Some(a) = lease.metadata.annotations.as_ref() else {
        return false;
    };
    if a.get(HOLDER_CONTAINER_ANNOTATION) != Some(&me.annotation()) {
        return false;
    }
    match a.get(HOLDER_PID_ANNOTATION).map(|p| p.parse::<u32>()) {
        Some(Ok(pid)) => pid == my_pid || !pid_alive(pid),
        _ => false,
    }
}

fn pid_alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// Records (or, without `me`, removes) the holder's container and pid on
/// `meta`, and labels the Lease as an instance Lease (graceguard's webhook
/// watches those alone to compare fencing tokens).
fn stamp_holder(meta: &mut ObjectMeta, me: Option<&ContainerId>) {
    meta.labels.get_or_insert_with(Default::default).insert(
        graceguard_contract::fencing::LEASE_LABEL.into(),
        "true".into(),
    );
    let a = meta.annotations.get_or_insert_with(Default::default);
    match me {
        Some(me) => {
            a.insert(HOLDER_CONTAINER_ANNOTATION.into(), me.annotation());
            a.insert(HOLDER_PID_ANNOTATION.into(), std::process::id().to_string());
        }
        None => {
            a.remove(HOLDER_CONTAINER_ANNOTATION);
            a.remove(HOLDER_PID_ANNOTATION);
        }
    }
}

/// The Lease name of `instance`.
pub fn lease_name(instance: &str) -> String {
    format!("graceguard-{}", crate::core::naming::task_stem(instance))
}

/// What an [`Observer`] makes of a Lease.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Liveness {
    /// Missing, released, or not renewed for its duration: its instance is
    /// gone and the Lease may be taken.
    Free,
    /// Renewed within its duration: `holder` lives for at least `remaining`.
    Held { holder: String, remaining: Duration },
}

/// Judges Leases by their renewals as seen here (client-go's
/// `observedTime`): a new `resourceVersion` is a renewal, seen now.
#[derive(Debug, Default)]
pub struct Observer {
    seen: std::collections::HashMap<String, (String, Instant)>,
}

impl Observer {
    /// Looks at `lease` (named `name`; `None`: it does not exist) now.
    pub fn observe(&mut self, name: &str, lease: Option<&Lease>) -> Liveness {
        self.observe_at(name, lease, Instant::now())
    }

    fn observe_at(&mut self, name: &str, lease: Option<&Lease>, now: Instant) -> Liveness {
        let Some(lease) = lease else {
            self.seen.remove(name);
            return Liveness::Free;
        };
        let rv = lease.resource_version().unwrap_or_default();
        let seen_at = match self.seen.get(name) {
            Some((v, at)) if *v == rv => *at,
            _ => {
                self.seen.insert(name.to_string(), (rv, now));
                now
            }
        };
        let spec = lease.spec.as_ref();
        let holder = spec
            .and_then(|s| s.holder_identity.clone())
            .unwrap_or_default();
        if holder.is_empty() {
            return Liveness::Free;
        }
        let secs = spec
            .and_then(|s| s.lease_duration_seconds)
            .and_then(|s| u64::try_from(s).ok())
            .unwrap_or(DEFAULT_DURATION.as_secs());
        let lapses = seen_at + Duration::from_secs(secs);
        match lapses.checked_duration_since(now) {
            Some(remaining) if !remaining.is_zero() => Liveness::Held { holder, remaining },
            _ => Liveness::Free,
        }
    }
}

/// What the fence is now; [`Fence::holds`] reads it against the clock.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FenceState {
    /// No Lease: the executor runs alone by construction.
    Always,
    /// Held until this instant (the last successful renewal's send time plus
    /// two thirds of the duration), under this Lease term.
    Until(Instant, Arc<Token>),
    /// Not held: another process took the Lease, or the deadline passed.
    Closed,
}

/// Whether this process may act for its instance (launch pods, deliver and
/// done-mark results): a deadline, read against the clock at every call, so
/// it closes on time even when no renewal answer ever comes. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Fence(watch::Receiver<FenceState>);

impl Fence {
    /// A fence that always holds, for an executor run without a Lease.
    pub fn open() -> Self {
        let (tx, rx) = watch::channel(FenceState::Always);
        // Never changes; a dropped sender is read as "no more changes".
        drop(tx);
        Self(rx)
    }

    /// A fence moved by hand through the sender (the executor loop's tests).
    #[cfg(test)]
    pub(crate) fn driven(state: FenceState) -> (watch::Sender<FenceState>, Self) {
        let (tx, rx) = watch::channel(state);
        (tx, Self(rx))
    }

    /// Whether this process may act now. Asked immediately before every
    /// write, not once per decision.
    pub fn holds(&self) -> bool {
        self.permit().is_some()
    }

    /// Whether this process may write now and, under a Lease, the term the
    /// write is sent under ([`Permit::token`]): asked immediately before
    /// each write that carries its token (a Create, a finalizer release).
    pub fn permit(&self) -> Option<Permit> {
        match &*self.0.borrow() {
            FenceState::Always => Some(Permit(None)),
            FenceState::Until(deadline, token) => {
                (Instant::now() < *deadline).then(|| Permit(Some(Arc::clone(token))))
            }
            FenceState::Closed => None,
        }
    }

    /// Resolves when the fence opens or closes; never, once it cannot change.
    pub async fn changed(&mut self) {
        if self.0.changed().await.is_err() {
            std::future::pending::<()>().await;
        }
    }
}

/// Leave to write now, with the Lease term to write under (none for an
/// executor run without a Lease).
#[derive(Clone, Debug)]
pub struct Permit(Option<Arc<Token>>);

impl Permit {
    /// The term, as the annotation's value, for the write to carry, so
    /// graceguard's webhook can refuse it if it arrives after another
    /// process took the Lease (`graceguard_contract::fencing`).
    pub fn token(&self) -> Option<String> {
        self.0.as_ref().map(|t| t.to_string())
    }
}

/// This process's hold on its instance's Lease.
pub struct InstanceLease {
    client: Client,
    namespace: String,
    api: Api<Lease>,
    name: String,
    instance: String,
    holder: String,
    duration: Duration,
    /// The Lease as last written by this process.
    current: Lease,
    /// When the request of this process's last successful write of the
    /// Lease was sent: the fence's deadline counts from it.
    written_at: Instant,
    /// The container this process runs in, recorded on the Lease.
    container: Option<ContainerId>,
}

/// The renewal period and the fence's deadline after a renewal's send time,
/// for a Lease of `duration`: a third, and two thirds.
fn timing(duration: Duration) -> (Duration, Duration) {
    ((duration / 3).max(Duration::from_secs(1)), duration * 2 / 3)
}

/// A unique holder identity for this process: the instance, the host, the
/// process id and a random part (a restarted container may reuse a pid).
fn holder_identity(instance: &str) -> String {
    let host = crate::core::naming::hostname().unwrap_or_else(|| "localhost".into());
    format!(
        "{instance}/{host}/{}-{:08x}",
        std::process::id(),
        fastrand::u32(..)
    )
}

fn micro_now() -> MicroTime {
    MicroTime(Timestamp::now())
}

impl InstanceLease {
    /// Takes the Lease of `instance` in `namespace`: creates it, or takes it
    /// over once it is free ([`Liveness::Free`]) or its holder ran in this
    /// same container and is gone ([`predecessor_gone`], with `container`).
    /// While another process holds it, waits (saying so once per holder), up
    /// to `max_wait`.
    pub async fn acquire(
        client: Client,
        namespace: &str,
        instance: &str,
        duration: Duration,
        max_wait: Duration,
        container: Option<ContainerId>,
    ) -> Result<Self, GuardError> {
        let api: Api<Lease> = Api::namespaced(client.clone(), namespace);
        let name = lease_name(instance);
        let holder = holder_identity(instance);
        let duration = duration.max(Duration::from_secs(3));
        let mut observer = Observer::default();
        let started = Instant::now();
        let mut told: Option<String> = None;
        loop {
            let found = api
                .get_opt(&name)
                .await
                .map_err(|e| GuardError::api(format!("reading the instance Lease {name}"), e))?;
            let sent = Instant::now();
            let mut liveness = observer.observe(&name, found.as_ref());
            if let (Some(old), Some(me), Liveness::Held { holder: h, .. }) =
                (&found, &container, &liveness)
            {
                if predecessor_gone(old, me, std::process::id(), pid_alive) {
                    tracing::info!(lease = %name, %namespace, previous = %h, "the instance Lease's holder ran in this same container of this same pod, which the kubelet never runs twice at once: it is gone; taking the Lease over now instead of waiting for it to lapse");
                    liveness = Liveness::Free;
                }
            }
            let taken = match (&found, liveness) {
                (None, _) => {
                    let mut lease = Lease {
                        metadata: ObjectMeta {
                            name: Some(name.clone()),
                            ..Default::default()
                        },
                        spec: Some(spec_for(&holder, duration, 0, None)),
                    };
                    stamp_holder(&mut lease.metadata, container.as_ref());
                    api.create(&PostParams::default(), &lease).await
                }
                (Some(old), Liveness::Free) => {
                    let spec = old.spec.clone().unwrap_or_default();
                    let transitions = spec.lease_transitions.unwrap_or(0).saturating_add(1);
                    let mut lease = old.clone();
                    lease.spec = Some(spec_for(&holder, duration, transitions, None));
                    stamp_holder(&mut lease.metadata, container.as_ref());
                    // Conditional on the version observed: if the holder
                    // renewed (or another process took it) since, 409.
                    api.replace(&name, &PostParams::default(), &lease).await
                }
                (
                    Some(_),
                    Liveness::Held {
                        holder: h,
                        remaining,
                    },
                ) => {
                    let waited = started.elapsed();
                    if waited >= max_wait {
                        return Err(GuardError::LeaseHeld {
                            lease: name,
                            instance: instance.to_string(),
                            holder: h,
                            waited,
                        });
                    }
                    if told.as_deref() != Some(h.as_str()) {
                        tracing::warn!(lease = %name, %namespace, holder = %h, remaining_seconds = remaining.as_secs(), "the instance Lease is held by another process; waiting until it is released or no renewal has been seen for its duration (only one process may act for an instance)");
                        eprintln!("graceguard: the Lease {name} of instance {instance} is held by {h}; waiting up to {} s for it to lapse or be released", remaining.as_secs().max(1));
                        told = Some(h);
                    }
                    tokio::time::sleep(remaining.min(Duration::from_secs(2))).await;
                    continue;
                }
            };
            match taken {
                Ok(current) => {
                    tracing::info!(lease = %name, %namespace, %holder, "holding the instance Lease");
                    return Ok(Self {
                        client,
                        namespace: namespace.to_string(),
                        api,
                        name,
                        instance: instance.to_string(),
                        holder,
                        duration,
                        current,
                        written_at: sent,
                        container,
                    });
                }
                // Another process wrote it first: look again.
                Err(kube::Error::Api(s)) if s.code == 409 => continue,
                Err(e) => {
                    return Err(GuardError::api(
                        format!("taking the instance Lease {name}"),
                        e,
                    ))
                }
            }
        }
    }

    /// This process's holder identity.
    pub fn holder(&self) -> &str {
        &self.holder
    }

    /// The term this process holds the Lease under: the Lease's uid and
    /// its transitions as this process last wrote them.
    pub fn token(&self) -> Token {
        Token {
            lease_namespace: self.namespace.clone(),
            lease_name: self.name.clone(),
            lease_uid: self.current.metadata.uid.clone().unwrap_or_default(),
            transitions: self
                .current
                .spec
                .as_ref()
                .and_then(|s| s.lease_transitions)
                .map_or(0, i64::from),
        }
    }

    /// The fence's state after a successful write sent at `written_at`.
    fn held_until(&self, deadline: Duration) -> FenceState {
        FenceState::Until(self.written_at + deadline, Arc::new(self.token()))
    }

    /// Renews the Lease now, conditionally on the version this process
    /// wrote last. `Ok(false)`: another process holds it now.
    pub async fn renew(&mut self) -> Result<bool, GuardError> {
        // A change by someone else that leaves this process the holder (an
        // edited label) is retried on the new version, a few times.
        for _ in 0..3 {
            let mut lease = self.current.clone();
            let old = lease.spec.clone().unwrap_or_default();
            lease.spec = Some(spec_for(
                &self.holder,
                self.duration,
                old.lease_transitions.unwrap_or(0),
                old.acquire_time,
            ));
            match self.write(&lease).await {
                Ok(()) => return Ok(true),
                Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => {
                    let found = self.api.get_opt(&self.name).await.map_err(|e| {
                        GuardError::api(format!("re-reading the instance Lease {}", self.name), e)
                    })?;
                    match found {
                        Some(l)
                            if l.spec.as_ref().and_then(|s| s.holder_identity.as_deref())
                                == Some(self.holder.as_str()) =>
                        {
                            self.current = l
                        }
                        _ => return Ok(false),
                    }
                }
                Err(e) => {
                    return Err(GuardError::api(
                        format!("renewing the instance Lease {}", self.name),
                        e,
                    ))
                }
            }
        }
        Ok(false)
    }

    /// Replaces the Lease with `lease` (conditional on the resourceVersion it
    /// carries) and keeps what was written.
    async fn write(&mut self, lease: &Lease) -> Result<(), kube::Error> {
        let sent = Instant::now();
        self.current = self
            .api
            .replace(&self.name, &PostParams::default(), lease)
            .await?;
        self.written_at = sent;
        Ok(())
    }

    /// Gives the Lease up (on a clean stop), so a successor need not wait
    /// for it to lapse. Best effort: a failure leaves it to lapse.
    pub async fn release(mut self) {
        let mut lease = self.current.clone();
        if let Some(s) = lease.spec.as_mut() {
            s.holder_identity = None;
            s.lease_duration_seconds = Some(1);
            s.renew_time = Some(micro_now());
        }
        match self.write(&lease).await {
            Ok(()) => tracing::info!(lease = %self.name, "released the instance Lease"),
            Err(e) => {
                tracing::warn!(lease = %self.name, error = %e, "releasing the instance Lease failed; it lapses after its duration")
            }
        }
    }

    /// Keeps the Lease in the background: renews every third of its
    /// duration, each renewal bounded by that third; the [`Fence`] holds until
    /// two thirds of the duration after the last successful renewal was sent
    /// (see the module docs), is closed at once when another process took it
    /// (this one then waits to take it back), and opens again once it holds
    /// the Lease. Stop it with [`Holding::stop`].
    pub fn hold(self) -> Holding {
        let (period, deadline) = timing(self.duration);
        let (tx, rx) = watch::channel(self.held_until(deadline));
        let (stop_tx, mut stop_rx) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let mut lease = self;
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(period) => {}
                    _ = &mut stop_rx => return Some(lease),
                }
                let renewed = tokio::select! {
                    r = tokio::time::timeout(period, lease.renew()) => r,
                    _ = &mut stop_rx => return Some(lease),
                };
                let renewed = match renewed {
                    Ok(r) => r,
                    Err(_) => Err(GuardError::LeaseRenewalTimedOut {
                        lease: lease.name.clone(),
                        after: period,
                    }),
                };
                match renewed {
                    Ok(true) => {
                        if tx.borrow().eq(&FenceState::Closed) {
                            tracing::info!(lease = %lease.name, "holding the instance Lease again; acting again");
                        }
                        tx.send_replace(lease.held_until(deadline));
                    }
                    Ok(false) => {
                        tx.send_replace(FenceState::Closed);
                        tracing::error!(lease = %lease.name, "another process took the instance Lease; stopped launching and delivering until this one holds it again");
                        let (client, ns) = (lease.client.clone(), lease.namespace.clone());
                        let again = tokio::select! {
                            a = InstanceLease::acquire(client, &ns, &lease.instance, lease.duration, Duration::MAX, lease.container.clone()) => a,
                            _ = &mut stop_rx => return None,
                        };
                        match again {
                            Ok(l) => {
                                lease = l;
                                tx.send_replace(lease.held_until(deadline));
                            }
                            Err(e) => {
                                tracing::error!(error = %e, "taking the instance Lease back failed; trying again");
                            }
                        }
                    }
                    Err(e) => {
                        let until = match &*tx.borrow() {
                            FenceState::Until(until, _) => Some(*until),
                            _ => None,
                        };
                        match until {
                            Some(until) if Instant::now() >= until => {
                                tracing::error!(lease = %lease.name, error = %e, "the instance Lease was not renewed within two thirds of its duration; stopped launching and delivering until it is");
                                tx.send_replace(FenceState::Closed);
                            }
                            _ => {
                                tracing::warn!(lease = %lease.name, error = %e, "renewing the instance Lease failed; trying again");
                            }
                        }
                    }
                }
            }
        });
        Holding {
            fence: Fence(rx),
            stop: Some(stop_tx),
            task,
        }
    }
}

/// A Lease kept in the background by [`InstanceLease::hold`].
pub struct Holding {
    fence: Fence,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Option<InstanceLease>>,
}

impl Holding {
    /// Whether this process may act; shared with the executor.
    pub fn fence(&self) -> Fence {
        self.fence.clone()
    }

    /// Stops renewing; with `release`, gives the Lease up for a successor.
    pub async fn stop(mut self, release: bool) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        match (&mut self.task).await {
            Ok(Some(lease)) if release && self.fence.holds() => lease.release().await,
            _ => {}
        }
    }
}

fn spec_for(
    holder: &str,
    duration: Duration,
    transitions: i32,
    acquired: Option<MicroTime>,
) -> LeaseSpec {
    let now = micro_now();
    LeaseSpec {
        holder_identity: Some(holder.to_string()),
        lease_duration_seconds: Some(i32::try_from(duration.as_secs()).unwrap_or(i32::MAX)),
        acquire_time: Some(acquired.unwrap_or_else(|| now.clone())),
        renew_time: Some(now),
        lease_transitions: Some(transitions),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(rv: &str, holder: Option<&str>, secs: i32) -> Lease {
        Lease {
            metadata: ObjectMeta {
                resource_version: Some(rv.into()),
                ..Default::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: holder.map(str::to_string),
                lease_duration_seconds: Some(secs),
                // A renewTime far in the past or future (clock skew) must
                // not matter.
                renew_time: Some(MicroTime(Timestamp::from_second(1).expect("ts"))),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn expiry_counts_from_renewals_seen_here_not_from_the_holders_clock() {
        let mut o = Observer::default();
        let t0 = Instant::now();
        let s = Duration::from_secs;
        assert_eq!(o.observe_at("l", None, t0), Liveness::Free);
        // First seen now: alive for its whole duration, although its
        // renewTime says 1970.
        let held = |r: u64| Liveness::Held {
            holder: "a".into(),
            remaining: s(r),
        };
        assert_eq!(
            o.observe_at("l", Some(&lease("1", Some("a"), 30)), t0),
            held(30)
        );
        assert_eq!(
            o.observe_at("l", Some(&lease("1", Some("a"), 30)), t0 + s(20)),
            held(10)
        );
        // Renewed (a new version): the count starts again.
        assert_eq!(
            o.observe_at("l", Some(&lease("2", Some("a"), 30)), t0 + s(25)),
            held(30)
        );
        assert_eq!(
            o.observe_at("l", Some(&lease("2", Some("a"), 30)), t0 + s(55)),
            Liveness::Free,
            "not renewed for its duration"
        );
        // Released: free at once.
        assert_eq!(
            o.observe_at("m", Some(&lease("7", None, 30)), t0),
            Liveness::Free
        );
    }

    #[test]
    fn only_a_holder_from_this_very_container_that_is_gone_is_taken_over_at_once() {
        let me = ContainerId {
            pod_uid: "uid-1".into(),
            container: "sidecar".into(),
        };
        let stamped = |container: Option<&str>, pid: Option<&str>| {
            let mut l = lease("1", Some("old"), 30);
            let a = l.metadata.annotations.get_or_insert_with(Default::default);
            if let Some(c) = container {
                a.insert(HOLDER_CONTAINER_ANNOTATION.into(), c.into());
            }
            if let Some(p) = pid {
                a.insert(HOLDER_PID_ANNOTATION.into(), p.into());
            }
            l
        };
        let nobody_alive = |_| false;
        let all_alive = |_| true;
        // Same container, its pid not alive here (a restarted container's
        // new pid namespace), or this process's own pid: gone.
        assert!(predecessor_gone(
            &stamped(Some("uid-1/sidecar"), Some("7")),
            &me,
            1,
            nobody_alive
        ));
        assert!(predecessor_gone(
            &stamped(Some("uid-1/sidecar"), Some("1")),
            &me,
            1,
            all_alive
        ));
        // Same container, another process still running in it: not gone.
        assert!(!predecessor_gone(
            &stamped(Some("uid-1/sidecar"), Some("7")),
            &me,
            1,
            all_alive
        ));
        // Another container, another pod, or nothing recorded: may be alive.
        for other in [
            stamped(Some("uid-1/other"), Some("7")),
            stamped(Some("uid-2/sidecar"), Some("7")),
            stamped(None, Some("7")),
            stamped(Some("uid-1/sidecar"), None),
            stamped(Some("uid-1/sidecar"), Some("x")),
            lease("1", Some("old"), 30),
        ] {
            assert!(!predecessor_gone(&other, &me, 1, nobody_alive), "{other:?}");
        }
    }

    #[test]
    fn an_open_fence_always_holds() {
        let f = Fence::open();
        assert!(f.holds());
    }

    /// The fence closes at its deadline by the clock alone: no renewal
    /// answer, no error, no message has to arrive (a hung connection).
    #[tokio::test(start_paused = true)]
    async fn a_fence_closes_at_its_deadline_with_no_answer_at_all() {
        let (_, deadline) = timing(Duration::from_secs(30));
        let sent = Instant::now();
        let token = Arc::new(Token {
            lease_namespace: "team-a".into(),
            lease_name: "graceguard-x".into(),
            lease_uid: "u".into(),
            transitions: 3,
        });
        let (tx, rx) = watch::channel(FenceState::Until(sent + deadline, Arc::clone(&token)));
        let fence = Fence(rx);
        tokio::time::advance(deadline - Duration::from_millis(1)).await;
        assert!(fence.holds(), "held until the deadline");
        assert_eq!(
            fence.permit().and_then(|p| p.token()).as_deref(),
            Some("team-a/graceguard-x/u/3"),
            "a write sent now carries the term"
        );
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(!fence.holds(), "closed at the deadline");
        assert!(fence.permit().is_none(), "no leave to write, no token");
        // A later renewal (sent now) opens it again for its own two thirds.
        tx.send_replace(FenceState::Until(Instant::now() + deadline, token));
        assert!(fence.holds());
        tx.send_replace(FenceState::Closed);
        assert!(!fence.holds());
    }

    /// A renewal sent one period after the last success and hanging for its
    /// whole timeout ends exactly at the deadline; another process can take
    /// the Lease no sooner than a full duration after that success was sent.
    #[test]
    fn a_hung_renewal_ends_by_the_deadline_and_a_third_is_left_as_margin() {
        for secs in [3, 10, 15, 30, 60] {
            let duration = Duration::from_secs(secs);
            let (period, deadline) = timing(duration);
            assert!(
                period + period <= deadline,
                "{secs}: {period:?} {deadline:?}"
            );
            assert!(
                duration - deadline >= duration / 3 - Duration::from_millis(1),
                "{secs}"
            );
        }
    }
}
