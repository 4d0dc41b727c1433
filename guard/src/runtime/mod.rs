//! The guard's I/O: the pod watch and the API calls, the instance Lease, the
//! executor's loop, adoption of a dead owner's pods, events. It carries out
//! what [`crate::core`] decides and decides nothing itself: every call goes
//! through the [`pod_api::PodApi`] trait and every wait through tokio's
//! clock, so the loop is unit-tested against a fake server under paused time
//! (`executor_loop`'s tests).

pub mod adoption;
mod api_timeouts;
pub(crate) mod done_marks;
mod driver;
pub(crate) mod error;
pub mod events;
pub mod executor;
mod executor_config;
mod executor_loop;
mod kube_events;
pub mod lease;
mod namespace_state;
pub mod pod_api;
pub(crate) mod pod_index;
pub mod result_release;
mod server_clock;

pub use api_timeouts::{bounded, READ_TIMEOUT, WATCH_TIMEOUT_SECS};
pub use done_marks::{MarkFailed, Marked};
pub use driver::{Guard, GuardConfig};
pub use error::GuardError;
pub use executor::Executor;
pub use executor_config::ExecutorConfig;
pub use pod_index::Version;
