//! Why a request about a task was refused ([`TaskError`]). A task that fails
//! is not an error: that is an [`crate::Outcome`]; a failure of the guard
//! itself is a [`crate::GuardError`].

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
