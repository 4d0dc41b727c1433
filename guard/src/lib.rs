//! graceguard's executor core.
//!
//! An executor built on this crate launches task pods by rules that keep a
//! graceful deletion from turning into a livelock, a quota leak or a burned
//! retry budget (see docs/architecture.md, "The guard's rules"):
//!
//! 1. every attempt has its own pod name ([`core::naming`]);
//! 2. a graceful deletion is a state, `ShuttingDown`, waited out until the pod
//!    is gone ([`core::reconcile`]);
//! 3. AlreadyExists is never success: the holder is read, adopted if it is
//!    this attempt's own pod, a `NameConflict` otherwise ([`core::reconcile`]);
//! 4. a quota rejection is waiting with a shared per-namespace backoff
//!    ([`core::classify`], [`core::backoff`]);
//! 5. system failures are bounded, and only a Running attempt resets the
//!    consecutive count; every wait has a bound ([`core::bounds`]);
//! 6. completed pods left by a dead instance are reported once and drained
//!    ([`runtime::adoption`], [`runtime::lease`]); one process at a time acts for an instance
//!    (its Lease fences the others, [`runtime::lease::Fence`]).
//!
//! Three layers, each depending only on the ones before it:
//!
//! * [`core`]: the decisions, pure (no Kubernetes client, no tokio), their
//!   state rebuilt from the pods ([`core::pod_record`]), so a restarted
//!   executor resumes its tasks;
//! * [`runtime`]: the I/O that carries them out. [`Executor`] runs all tasks
//!   of an instance from one shared pod watch; [`Guard`] runs one at a time;
//! * `sidecar` (feature `sidecar`) serves an [`Executor`] over HTTP for
//!   executors in any language, and `cli` (feature `cli`) is the
//!   `graceguard` command. Both are on by default; a library user who needs
//!   neither turns them off (`default-features = false`) and compiles no
//!   HTTP server, OpenAPI or argument parser.
//!
//! A minimal executor:
//!
//! ```no_run
//! use graceguard::{Guard, GuardConfig, TaskSpec};
//! use k8s_openapi::api::core::v1::Pod;
//!
//! # async fn run(client: kube::Client, template: Pod) -> anyhow::Result<()> {
//! let guard = Guard::new(client, GuardConfig::new("executor-1"));
//! let spec = TaskSpec {
//!     retries: 2,
//!     ..TaskSpec::new("train-a0", "team-a", "executor-1")
//! };
//! let outcome = guard
//!     .run(spec, template, |t| println!("{} attempt {}: {}", t.task, t.attempt, t.phase))
//!     .await?;
//! println!("succeeded: {}", outcome.succeeded);
//! # Ok(())
//! # }
//! ```

#[cfg(feature = "cli")]
pub mod cli;
pub mod core;
pub mod runtime;
#[cfg(feature = "sidecar")]
pub mod sidecar;

pub use crate::core::{Bounds, FailureKind, Outcome, Phase, TaskError, TaskSpec, Transition};
pub use crate::runtime::{Executor, Guard, GuardConfig, GuardError};
