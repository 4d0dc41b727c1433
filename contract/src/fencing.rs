//! The fencing token: what lets the cluster, not only the writer, refuse a
//! write from a process that no longer holds its instance's Lease.
//!
//! The guard's fence is a deadline (`graceguard::lease::Fence`): a process
//! stops sending before another can take its Lease over. A write it sent in
//! time can still reach the API server late (a stalled connection, a paused
//! VM), after a successor took over. client-go's leader election says of
//! itself that it gives no fencing; graceguard adds it the way a storage
//! system does: every write carries the Lease term it was sent under, and the
//! store's gate — graceguard's webhook — refuses a write whose term is over.
//!
//! The term is the Lease's `uid` and its `spec.leaseTransitions`, which every
//! takeover increments (a conditional write, so two processes never share
//! one). A Lease deleted and created again has a new uid: a term of the old
//! one is over too.
//!
//! The guard writes the token and the webhook compares it: here are the
//! annotation, its format and the rule, for both.

use std::fmt;
use std::str::FromStr;

/// The pod annotation carrying the token a write was sent under.
pub const ANNOTATION: &str = "graceguard.io/fencing-token";

/// The pod annotation a result-finalizer release sets to the token it was
/// sent under. The webhook checks a pod update only when this annotation is
/// set or changed by it: the guard's own releases, never an operator's (a
/// `kubectl edit` that removes a stuck finalizer, `graceguard
/// release-results`), and never a later unrelated write.
pub const RELEASED_UNDER: &str = "graceguard.io/released-under";

/// The label on every instance Lease, so the webhook watches those alone
/// (not the node heartbeats and leader elections of the whole cluster).
pub const LEASE_LABEL: &str = "graceguard.io/instance-lease";

/// The cause type of the webhook's refusal, by which the guard tells a
/// fenced-out write from any other refusal.
pub const STALE_CAUSE: &str = "graceguard.io/FencingTokenStale";

/// A Lease term: which Lease, and which of its holders.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Token {
    pub lease_namespace: String,
    pub lease_name: String,
    /// The Lease object's uid (a re-created Lease is another Lease).
    pub lease_uid: String,
    /// The Lease's `spec.leaseTransitions` when this holder took it.
    pub transitions: i64,
}

impl fmt::Display for Token {
    /// `<lease namespace>/<lease name>/<lease uid>/<transitions>`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{}/{}/{}",
            self.lease_namespace, self.lease_name, self.lease_uid, self.transitions
        )
    }
}

/// A token annotation that cannot be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("the annotation {ANNOTATION}={value:?} is not <lease namespace>/<lease name>/<lease uid>/<transitions>: {why}. Only graceguard writes it; remove it from a pod you create yourself")]
pub struct TokenError {
    pub value: String,
    pub why: &'static str,
}

impl FromStr for Token {
    type Err = TokenError;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        let err = |why| TokenError {
            value: value.to_string(),
            why,
        };
        let parts: Vec<&str> = value.split('/').collect();
        let [ns, name, uid, transitions] = parts[..] else {
            return Err(err("it has not four parts"));
        };
        if ns.is_empty() || name.is_empty() || uid.is_empty() {
            return Err(err("a part is empty"));
        }
        let transitions = transitions
            .parse::<i64>()
            .ok()
            .filter(|t| *t >= 0)
            .ok_or_else(|| err("the transitions are not a number ≥ 0"))?;
        Ok(Self {
            lease_namespace: ns.to_string(),
            lease_name: name.to_string(),
            lease_uid: uid.to_string(),
            transitions,
        })
    }
}

/// The Lease as the webhook sees it now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseNow<'a> {
    pub uid: &'a str,
    pub transitions: i64,
}

/// What a write's token says about its writer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The writer's term is the Lease's current one (or newer than the
    /// webhook has seen yet): allowed.
    Current,
    /// Another process took the Lease over since: refused.
    Superseded { sent_under: i64, current: i64 },
    /// The Lease the writer held was deleted and created again: refused.
    Replaced,
    /// The webhook does not know the Lease (not created, not yet seen, or
    /// deleted): allowed — a missing Lease is an unknown owner, never a dead
    /// one, and graceguard never refuses on what it does not know.
    LeaseUnknown,
}

impl Verdict {
    /// Whether the write is refused.
    pub fn refuses(self) -> bool {
        matches!(self, Self::Superseded { .. } | Self::Replaced)
    }

    /// The audit reason.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Current => "fencing_token_current",
            Self::Superseded { .. } => "fencing_token_superseded",
            Self::Replaced => "fencing_token_lease_replaced",
            Self::LeaseUnknown => "fencing_token_lease_unknown",
        }
    }
}

/// The rule: a write sent under a term that is over is refused; anything
/// graceguard cannot tell is allowed.
pub fn decide(token: &Token, lease: Option<LeaseNow<'_>>) -> Verdict {
    match lease {
        None => Verdict::LeaseUnknown,
        Some(l) if l.uid != token.lease_uid => Verdict::Replaced,
        Some(l) if l.transitions > token.transitions => Verdict::Superseded {
            sent_under: token.transitions,
            current: l.transitions,
        },
        Some(_) => Verdict::Current,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(transitions: i64) -> Token {
        Token {
            lease_namespace: "team-a".into(),
            lease_name: "graceguard-flyte".into(),
            lease_uid: "7c0d".into(),
            transitions,
        }
    }

    #[test]
    fn a_token_reads_back_what_it_wrote() {
        let t = token(4);
        assert_eq!(t.to_string(), "team-a/graceguard-flyte/7c0d/4");
        assert_eq!(t.to_string().parse::<Token>(), Ok(t));
    }

    #[test]
    fn an_unreadable_token_says_what_is_wrong() {
        for (value, why) in [
            ("a/b/c", "it has not four parts"),
            ("a/b/c/d/1", "it has not four parts"),
            ("a//c/1", "a part is empty"),
            ("a/b/c/-1", "the transitions are not a number ≥ 0"),
            ("a/b/c/x", "the transitions are not a number ≥ 0"),
        ] {
            let e = value.parse::<Token>().unwrap_err();
            assert_eq!(e.why, why, "{value}");
            assert!(e.to_string().contains(ANNOTATION), "{e}");
        }
    }

    #[test]
    fn only_a_term_known_to_be_over_is_refused() {
        let now = |transitions| {
            Some(LeaseNow {
                uid: "7c0d",
                transitions,
            })
        };
        assert_eq!(decide(&token(4), now(4)), Verdict::Current);
        // The webhook's view lags the takeover: never refused on that.
        assert_eq!(decide(&token(5), now(4)), Verdict::Current);
        let v = decide(&token(4), now(5));
        assert_eq!(
            v,
            Verdict::Superseded {
                sent_under: 4,
                current: 5
            }
        );
        assert!(v.refuses());
        let replaced = decide(
            &token(4),
            Some(LeaseNow {
                uid: "other",
                transitions: 9,
            }),
        );
        assert_eq!(replaced, Verdict::Replaced);
        assert!(replaced.refuses());
        assert_eq!(decide(&token(4), None), Verdict::LeaseUnknown);
        assert!(!Verdict::LeaseUnknown.refuses() && !Verdict::Current.refuses());
    }
}
