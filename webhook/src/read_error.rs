//! Why a live read that a denial would rest on failed.
//!
//! A failed read never denies: the Create is allowed (fail open) and the
//! error is logged and counted. Its own module so that the pure decision
//! ([`crate::collision`]) and the I/O that reads ([`crate::confirm`]) can both
//! name it without importing each other.

use std::sync::Arc;
use std::time::Duration;

/// A confirmation GET of `resource` `namespace/name` that gave no answer.
#[derive(Clone, Debug, thiserror::Error)]
#[error("GET {resource} {namespace}/{name}: {cause}; the Create was allowed (fail open)")]
pub struct ReadError {
    pub resource: String,
    pub namespace: String,
    pub name: String,
    #[source]
    pub cause: Cause,
}

/// What went wrong with the read.
#[derive(Clone, Debug, thiserror::Error)]
pub enum Cause {
    /// Too many reads were waiting on the API server already.
    #[error("{0} confirmation reads already in flight (the API server answers slowly; check its latency)")]
    Saturated(usize),
    /// The API server did not answer in time.
    #[error(
        "no answer within {0:?} (the API server is slow or unreachable; see --confirm-timeout)"
    )]
    TimedOut(Duration),
    /// The API server answered with an error (shared: one read answers every
    /// concurrent request for the name).
    #[error("the API server answered: {0}")]
    Api(#[source] Arc<kube::Error>),
}
