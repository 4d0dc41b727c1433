//! What graceguard's two halves must agree on, kept in one place instead of
//! equal by hand: the guard reads what the webhook answers, and the webhook
//! compares what the guard writes. No dependencies on either half, nor on
//! kube: constants, a token format and one pure rule. With the `client`
//! feature, also what both command lines share: the Kubernetes client
//! configuration from `--kubeconfig` or the environment ([`client`]); with
//! `signal`, the stop signal they wait for ([`stop`]). Always: which build
//! a process runs ([`build`]).

pub mod build;
#[cfg(feature = "client")]
pub mod client;
pub mod fencing;
#[cfg(feature = "signal")]
pub mod stop;

/// The cause (`details.causes[].reason`) of the collision guard's 409 when
/// the name's holder is terminating: the guard then waits for the name
/// instead of counting a failure, and need not parse messages.
pub const HOLDER_TERMINATING_CAUSE: &str = "graceguard.io/HolderTerminating";
