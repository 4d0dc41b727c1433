//! graceguard's executor core.
//!
//! An executor built on this crate launches task pods by rules that keep a
//! graceful deletion from turning into a livelock, a quota leak or a burned
//! retry budget (see DESIGN.md, "guard"):
//!
//! 1. every attempt has its own pod name ([`naming`]);
//! 2. a graceful deletion is a state, `ShuttingDown`, waited out until the pod
//!    is gone ([`attempt`]);
//! 3. AlreadyExists is never success: the holder is read, adopted if it is
//!    this attempt's own pod, a `NameConflict` otherwise ([`attempt`]);
//! 4. a quota rejection is waiting with a shared per-namespace backoff
//!    ([`classify`], [`backoff`]);
//! 5. system failures are bounded, and only a Running attempt resets the count
//!    ([`attempt`]);
//! 6. completed pods left by a dead instance are reported once and drained
//!    ([`adoption`], [`lease`]).
//!
//! The decisions are pure ([`attempt::TaskMachine`], [`classify`],
//! [`backoff`]); [`driver::Guard`] performs them against the API server with
//! kube-rs.
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
//!     task: "train-a0".into(),
//!     namespace: "team-a".into(),
//!     instance: "executor-1".into(),
//!     retries: 2,
//!     max_system_failures: 3,
//! };
//! let outcome = guard
//!     .run(spec, template, |t| println!("{} attempt {}: {}", t.task, t.attempt, t.phase))
//!     .await?;
//! println!("succeeded: {}", outcome.succeeded);
//! # Ok(())
//! # }
//! ```

pub mod adoption;
pub mod attempt;
pub mod backoff;
pub mod classify;
pub mod driver;
pub mod lease;
pub mod naming;
pub mod phase;

pub use attempt::{Outcome, TaskSpec};
pub use driver::{Guard, GuardConfig, GuardError};
pub use phase::{FailureKind, Phase, Transition};
