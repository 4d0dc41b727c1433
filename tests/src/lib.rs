//! graceguard's end-to-end test bed.
//!
//! Every claim graceguard makes is about what a real control plane does, so
//! the end-to-end tests start one per test ([`TestBed`]): etcd and
//! kube-apiserver on free loopback ports, started as a production cluster runs
//! them (Node and RBAC authorization, NodeRestriction, ResourceQuota), on the
//! Kubernetes minor `GRACEGUARD_KUBE` names (one of `tests/kube/versions`,
//! 1.30 through 1.37; [`KubeVersion`]), with kube-scheduler and
//! kube-controller-manager. Requests carry real identities (admin, plain
//! users, nodes, the controllers' own). [`kubelet::Kubelet`] plays a node's
//! kubelet with that node's identity; [`quota`] waits for the real quota
//! controller. [`webhook::WebhookProcess`] runs the real `graceguard-webhook`
//! binary against the bed.

pub mod airflow_executor;
pub mod airflow_seed;
pub mod audit_log;
pub mod balancer;
pub mod binaries;
pub mod churn;
pub mod clock;
pub mod containers;
pub mod control_plane;
pub mod disruptions;
pub mod etcd_seed;
pub mod executor;
pub mod faults;
pub mod fencing;
pub mod go_build;
pub mod guard_chaos;
pub mod guard_task;
pub mod helm;
pub mod kube_schemas;
pub mod kubelet;
pub mod load;
pub mod node;
pub mod objects;
pub mod pods;
pub mod postgres;
pub mod preemption_trace;
pub mod process;
pub mod promql;
pub mod quota;
pub mod registry;
pub mod scenario;
pub mod sidecar;
pub mod signing;
pub mod stall;
pub mod storm;
pub mod webhook;

pub use binaries::{Feature, KubeVersion};
pub use control_plane::{TestBed, TestBedOptions};

/// Any failure of the test bed, with what to do about it in the message.
pub type Result<T, E = anyhow::Error> = std::result::Result<T, E>;
