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

pub mod audit_log;
pub mod balancer;
pub mod binaries;
pub mod clock;
pub mod containers;
pub mod control_plane;
pub mod etcd_seed;
pub mod executor;
pub mod faults;
pub mod go_build;
pub mod helm;
pub mod kube_schemas;
pub mod kubelet;
pub mod load;
pub mod node;
pub mod pods;
pub mod postgres;
pub mod process;
pub mod promql;
pub mod quota;
pub mod registry;
pub mod sidecar;
pub mod signing;
pub mod stall;
pub mod webhook;

pub use binaries::{Feature, KubeVersion};
pub use control_plane::{TestBed, TestBedOptions};

/// Any failure of the test bed, with what to do about it in the message.
pub type Result<T, E = anyhow::Error> = std::result::Result<T, E>;
