//! The fencing check: a write the guard sent under an instance Lease term
//! that is over — a pod Create, a result-finalizer release — is refused, so
//! a process that lost its Lease while a request was on its way cannot undo
//! what its successor decided (the rule: `graceguard_contract::fencing::decide`).
//!
//! The Leases' current terms come from a watch of the instance Leases alone
//! (label `graceguard.io/instance-lease`), never a read on the admission
//! path. A term the watch has not delivered yet is allowed: the window is the
//! watch's delivery delay (milliseconds) after a takeover, while a write that
//! needs fencing is one delayed for seconds or more (a stalled connection, a
//! paused VM), and the guard's own deadline has stopped it sending long
//! before the takeover. Whatever graceguard cannot tell — no watch yet, the
//! Lease unknown, a token it cannot read — is allowed.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use futures::StreamExt;
use graceguard_contract::fencing::{LeaseNow, Token, Verdict};
use k8s_openapi::api::coordination::v1::Lease;
use kube::core::response::{StatusCause, StatusDetails};
use kube::core::Status;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Client};

/// The instance Leases' current terms, kept by a watch.
pub struct LeaseTerms {
    store: Store<Lease>,
    synced: AtomicBool,
}

/// Why the fencing check allowed or refused a write (the audit record's
/// `fencing` field, and its `reason` when refused).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// The token could not be parsed: allowed, with a warning.
    TokenUnreadable,
    /// The Lease watch has not listed yet: allowed.
    LeasesNotSynced,
    /// The rule's verdict ([`graceguard_contract::fencing::decide`]).
    Decided(Verdict),
}

impl Reason {
    /// Every reason, for the docs' table check (a verdict's terms do not
    /// change what it is called).
    pub const ALL: [Reason; 6] = [
        Reason::TokenUnreadable,
        Reason::LeasesNotSynced,
        Reason::Decided(Verdict::Current),
        Reason::Decided(Verdict::Superseded {
            sent_under: 0,
            current: 0,
        }),
        Reason::Decided(Verdict::Replaced),
        Reason::Decided(Verdict::LeaseUnknown),
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Reason::TokenUnreadable => "fencing_token_unreadable",
            Reason::LeasesNotSynced => "fencing_leases_not_synced",
            Reason::Decided(v) => v.as_str(),
        }
    }

    /// Whether the write is refused.
    pub fn refuses(self) -> bool {
        matches!(self, Reason::Decided(v) if v.refuses())
    }
}

/// What the fencing check says of one write.
#[derive(Clone, Debug, PartialEq)]
pub enum Check {
    /// Allowed; `reason` for the audit record, and a warning for the client
    /// when its token could not be read.
    Allow {
        reason: Reason,
        warning: Option<String>,
    },
    /// Refused: the term it was sent under is over.
    Refuse { reason: Reason, status: Box<Status> },
}

impl LeaseTerms {
    /// An empty set of terms and the writer that fills it (a watch, or a test).
    pub fn new() -> (Arc<Self>, reflector::store::Writer<Lease>) {
        let (store, writer) = reflector::store();
        let terms = Arc::new(Self {
            store,
            synced: AtomicBool::new(false),
        });
        (terms, writer)
    }

    /// Watches the instance Leases of every namespace into a new set of
    /// terms. A watch that fails (no RBAC for Leases, an older chart) is
    /// retried with backoff and logged; meanwhile every write is allowed.
    pub fn spawn(client: Client) -> Arc<Self> {
        let (terms, writer) = Self::new();
        let api: Api<Lease> = Api::all(client);
        let config = watcher::Config::default().labels(graceguard_contract::fencing::LEASE_LABEL);
        let t = Arc::clone(&terms);
        tokio::spawn(async move {
            let mut stream = std::pin::pin!(watcher::watcher(api, config)
                .default_backoff()
                .reflect(writer));
            let mut failing = false;
            while let Some(event) = stream.next().await {
                match event {
                    Ok(watcher::Event::InitDone) => {
                        if !t.synced.swap(true, Ordering::AcqRel) || failing {
                            tracing::info!(
                                leases = t.store.len(),
                                "watching the instance Leases: writes sent under a Lease term that is over are refused"
                            );
                        }
                        failing = false;
                    }
                    Ok(_) => {}
                    Err(e) => {
                        if !failing {
                            tracing::warn!(error = %e, "watching the instance Leases (coordination.k8s.io leases, label graceguard.io/instance-lease) failed; retrying. Until it works writes are not checked for a stale fencing token; check that graceguard's ClusterRole may list and watch leases");
                        }
                        failing = true;
                    }
                }
            }
        });
        terms
    }

    /// Whether the watch has delivered its first list.
    pub fn is_synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }

    /// Marks the terms as listed (a test's writer has applied its list).
    pub fn mark_synced(&self) {
        self.synced.store(true, Ordering::Release);
    }

    /// The check of a write carrying the token annotation `value`.
    pub fn check(&self, value: &str) -> Check {
        let token = match value.parse::<Token>() {
            Ok(t) => t,
            Err(e) => {
                return Check::Allow {
                    reason: Reason::TokenUnreadable,
                    warning: Some(e.to_string()),
                }
            }
        };
        if !self.is_synced() {
            return Check::Allow {
                reason: Reason::LeasesNotSynced,
                warning: None,
            };
        }
        let lease = self
            .store
            .get(&ObjectRef::new(&token.lease_name).within(&token.lease_namespace));
        let now = lease.as_deref().map(|l| LeaseNow {
            uid: l.metadata.uid.as_deref().unwrap_or_default(),
            transitions: l
                .spec
                .as_ref()
                .and_then(|s| s.lease_transitions)
                .map_or(0, i64::from),
        });
        let verdict = graceguard_contract::fencing::decide(&token, now);
        let reason = Reason::Decided(verdict);
        if !verdict.refuses() {
            return Check::Allow {
                reason,
                warning: None,
            };
        }
        Check::Refuse {
            reason,
            status: Box::new(refusal(&token, verdict)),
        }
    }
}

/// 409 Conflict, with the cause the guard reads ([`graceguard_contract::fencing::STALE_CAUSE`]).
fn refusal(token: &Token, verdict: Verdict) -> Status {
    let lease = format!("{}/{}", token.lease_namespace, token.lease_name);
    let why = match verdict {
        Verdict::Superseded {
            sent_under,
            current,
        } => format!(
            "it was sent under term {sent_under} of the instance Lease {lease}, and another process has held it since (term {current})"
        ),
        _ => format!(
            "it was sent under the instance Lease {lease} with uid {}, which has been deleted and created again since",
            token.lease_uid
        ),
    };
    let message = format!(
        "{why}: the sender no longer acts for its instance, so its late write is refused. Nothing to do: the current holder decides; a pod you created yourself must not copy the {} annotation",
        graceguard_contract::fencing::ANNOTATION
    );
    Status::failure(&message, "Conflict")
        .with_code(409)
        .with_details(StatusDetails {
            name: String::new(),
            group: String::new(),
            kind: "pods".into(),
            uid: String::new(),
            causes: vec![StatusCause {
                reason: graceguard_contract::fencing::STALE_CAUSE.into(),
                message: why,
                field: format!(
                    "metadata.annotations[{}]",
                    graceguard_contract::fencing::ANNOTATION
                ),
            }],
            retry_after_seconds: 0,
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::api::ObjectMeta;

    fn lease(ns: &str, name: &str, uid: &str, transitions: i32) -> Lease {
        Lease {
            metadata: ObjectMeta {
                namespace: Some(ns.into()),
                name: Some(name.into()),
                uid: Some(uid.into()),
                ..Default::default()
            },
            spec: Some(k8s_openapi::api::coordination::v1::LeaseSpec {
                lease_transitions: Some(transitions),
                ..Default::default()
            }),
        }
    }

    fn terms(leases: Vec<Lease>) -> Arc<LeaseTerms> {
        let (terms, mut writer) = LeaseTerms::new();
        writer.apply_watcher_event(&watcher::Event::Init);
        for l in &leases {
            writer.apply_watcher_event(&watcher::Event::InitApply(l.clone()));
        }
        writer.apply_watcher_event(&watcher::Event::InitDone);
        terms.mark_synced();
        terms
    }

    #[test]
    fn the_review_reads_the_annotation_this_crate_writes() {
        // review.rs names it as a literal for serde.
        assert_eq!(
            graceguard_contract::fencing::ANNOTATION,
            "graceguard.io/fencing-token"
        );
    }

    #[test]
    fn a_write_under_a_term_that_is_over_is_refused_with_the_cause_the_guard_reads() {
        let t = terms(vec![lease("team-a", "graceguard-x", "u1", 5)]);
        match t.check("team-a/graceguard-x/u1/4") {
            Check::Refuse { reason, status } => {
                assert_eq!(reason.as_str(), "fencing_token_superseded");
                assert_eq!(status.code, 409);
                let causes = status.details.map(|d| d.causes).unwrap_or_default();
                assert_eq!(causes[0].reason, graceguard_contract::fencing::STALE_CAUSE);
                assert!(status.message.contains("term 4"), "{}", status.message);
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            t.check("team-a/graceguard-x/u0/9"),
            Check::Refuse {
                reason: Reason::Decided(Verdict::Replaced),
                ..
            }
        ));
        for (value, want) in [
            ("team-a/graceguard-x/u1/5", "fencing_token_current"),
            ("team-a/graceguard-x/u1/6", "fencing_token_current"),
            ("team-b/graceguard-x/u1/1", "fencing_token_lease_unknown"),
        ] {
            match t.check(value) {
                Check::Allow {
                    reason,
                    warning: None,
                } => assert_eq!(reason.as_str(), want, "{value}"),
                other => panic!("{value}: {other:?}"),
            }
        }
    }

    #[test]
    fn what_graceguard_cannot_tell_is_allowed() {
        let (unsynced, _writer) = LeaseTerms::new();
        assert_eq!(
            unsynced.check("team-a/graceguard-x/u1/4"),
            Check::Allow {
                reason: Reason::LeasesNotSynced,
                warning: None
            }
        );
        match terms(vec![]).check("garbage") {
            Check::Allow { reason, warning } => {
                assert_eq!(reason, Reason::TokenUnreadable);
                assert!(warning.is_some_and(|w| w.contains("four parts")));
            }
            other => panic!("{other:?}"),
        }
    }
}
