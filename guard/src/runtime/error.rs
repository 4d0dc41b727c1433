//! A failure of the guard itself ([`GuardError`]): the Kubernetes API, its
//! Lease. A request about a task that was refused is a
//! [`crate::TaskError`]; a task that fails is an [`crate::Outcome`].

use std::time::Duration;

use crate::core::error::TaskError;

/// A failure of the guard itself (not of a task).
#[derive(Debug, thiserror::Error)]
pub enum GuardError {
    /// A Kubernetes API call failed; `what` says which one.
    #[error("{what}: {source}")]
    Api {
        what: String,
        #[source]
        source: kube::Error,
    },
    /// Another live process holds this instance's Lease.
    #[error("the Lease {lease} of instance {instance} is held by {holder} and was still renewed after {waited:?}; stop that process (or give this one another --instance), or wait longer")]
    LeaseHeld {
        lease: String,
        instance: String,
        holder: String,
        waited: Duration,
    },
    /// A Lease renewal got no answer in time (a hung connection, a stalled
    /// API server): treated as a failed renewal, so the fence's deadline,
    /// not the connection, decides when this process stops acting.
    #[error("renewing the instance Lease {lease} got no answer within {after:?}; the API server or the connection to it is stalled. Retrying; this process stops acting once its fence's deadline passes")]
    LeaseRenewalTimedOut { lease: String, after: Duration },
    /// A dead owner's superseded attempt could not be marked done.
    #[error("marking {pod}, an attempt its owner superseded, done failed: {source}; tried again at the next sync")]
    SupersededNotMarked {
        pod: String,
        #[source]
        source: crate::runtime::done_marks::MarkFailed,
    },
    #[error(transparent)]
    Task(#[from] TaskError),
}

impl GuardError {
    /// Wraps a failed API call, naming it.
    pub fn api(what: impl Into<String>, source: kube::Error) -> Self {
        Self::Api {
            what: what.into(),
            source,
        }
    }
}
