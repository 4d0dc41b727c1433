//! The guard's errors: [`TaskError`] for a request about one task that was
//! refused, [`GuardError`] for a failure of the guard itself (the Kubernetes
//! API, its Lease). A task that fails is neither: that is an
//! [`crate::Outcome`].

use std::time::Duration;

/// Why a request about a task was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TaskError {
    #[error("task {0} is already submitted with a different pod template; use another task name or DELETE it first")]
    TemplateConflict(String),
    /// Two task names that give the same pod-name stem (a hash collision,
    /// or names equal once normalized): the second would take the first's
    /// pods for its own.
    #[error("task {task:?} would name its pods {stem}-N, and so does task {other:?}, known here or recorded on pods in the namespace; use another task name (or forget the other task and wait for its pods to go)")]
    StemTaken {
        task: String,
        stem: String,
        other: String,
    },
    #[error("task {0} is already known with other settings (retries, max_system_failures, bounds, rerun_done); submit the same ones, or use another task name")]
    SpecConflict(String),
    #[error("task {0} is not known to this executor; PUT it first")]
    NotFound(String),
    #[error("task {0} has not ended; a retry is for a task that has ended (DELETE aborts it)")]
    NotEnded(String),
    #[error("task {0} has ended but a pod of it still runs (its deletion was asked for); forget it once that pod is terminating or gone")]
    CleanupPending(String),
    #[error("the pod template is not usable: {0}")]
    Template(String),
    #[error("this executor watches namespace {watched} only, not {asked}; run a sidecar for {asked} or one without --namespace")]
    WrongNamespace { watched: String, asked: String },
    #[error("the executor already knows {max} tasks, its limit; forget ended tasks (DELETE with forget, or acknowledge their results) or raise --max-tasks")]
    TooManyTasks { max: usize },
    #[error("the executor already holds {held} bytes of pod templates and this one ({bytes} bytes) would pass its limit of {max}; forget ended tasks or raise --max-template-bytes")]
    TemplatesFull {
        held: usize,
        bytes: usize,
        max: usize,
    },
    #[error("the executor has stopped")]
    Stopped,
}

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
    #[error("marking {pod}, an attempt its owner superseded, done failed: {why}; tried again at the next sync")]
    SupersededNotMarked { pod: String, why: String },
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
