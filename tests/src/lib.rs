//! The scenarios graceguard's end-to-end tests, the demo and the
//! reliability runs replay on the test bed ([`testbed`], its own crate): the
//! graceful-delete collision ([`scenario`]), disruptions only real
//! components produce ([`disruptions`]), executors' storms ([`storm`]), a
//! churning cluster ([`churn`]), preemptions timed one by one
//! ([`preemption_trace`]), the guard under fencing and chaos, Airflow's seed
//! and executor.

pub mod airflow_executor;
pub mod airflow_seed;
pub mod churn;
pub mod disruptions;
pub mod fencing;
pub mod guard_chaos;
pub mod guard_task;
pub mod objects;
pub mod preemption_trace;
pub mod scenario;
pub mod storm;
