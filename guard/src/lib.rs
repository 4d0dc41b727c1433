//! graceguard's executor core.
//!
//! An executor built on this crate launches task pods by rules that keep a
//! graceful deletion from turning into a livelock, a quota leak or a burned
//! retry budget (see docs/architecture.md, "The guard's rules"):
//!
//! 1. every attempt has its own pod name ([`naming`]);
//! 2. a graceful deletion is a state, `ShuttingDown`, waited out until the pod
//!    is gone ([`reconcile`]);
//! 3. AlreadyExists is never success: the holder is read, adopted if it is
//!    this attempt's own pod, a `NameConflict` otherwise ([`reconcile`]);
//! 4. a quota rejection is waiting with a shared per-namespace backoff
//!    ([`classify`], [`backoff`]);
//! 5. system failures are bounded, and only a Running attempt resets the
//!    consecutive count; every wait has a bound ([`bounds`]);
//! 6. completed pods left by a dead instance are reported once and drained
//!    ([`adoption`], [`lease`]); one process at a time acts for an instance
//!    (its Lease fences the others, [`lease::Fence`]).
//!
//! The decisions are pure ([`reconcile::reconcile`], [`classify`],
//! [`backoff`]) and their state is rebuilt from the pods ([`pod_record`]), so
//! a restarted executor resumes its tasks. [`executor::Executor`] runs all
//! tasks of an instance from one shared pod watch; `graceguard sidecar`
//! serves it over HTTP ([`sidecar`]) for executors in any language.
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

pub mod adoption;
mod answer;
pub mod api_timeouts;
pub mod backoff;
pub mod bounds;
pub mod classify;
pub mod done_marks;
mod driver;
pub mod error;
pub mod events;
pub mod executor;
mod executor_config;
mod executor_loop;
mod kube_events;
pub mod lease;
mod lifecycle;
mod namespace_state;
pub mod naming;
mod phase;
pub mod pod_api;
pub mod pod_index;
pub mod pod_record;
pub mod reconcile;
pub mod result_finalizer;
pub mod result_release;
pub mod run_identity;
mod server_clock;
pub mod sidecar;
pub mod task;
pub mod template;

pub use bounds::Bounds;
pub use driver::{Guard, GuardConfig};
pub use error::{GuardError, TaskError};
pub use phase::{FailureKind, Phase, Transition};
pub use reconcile::{Outcome, TaskSpec};
