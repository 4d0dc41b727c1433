//! graceguard's end-to-end test bed.
//!
//! Every claim graceguard makes is about what a real kube-apiserver does, so the
//! end-to-end tests start one: etcd and kube-apiserver v1.20.2 on free loopback
//! ports in a temporary directory ([`TestBed`]), with ResourceQuota admission on
//! and, optionally, the apiserver's audit log so a test can count requests. No
//! kubelet or controller-manager runs; [`kubelet::Kubelet`] plays the kubelet's
//! part for pods bound to a fake node, and [`quota`] sets what the quota
//! controller would. [`webhook::WebhookProcess`] runs the real
//! `graceguard-webhook` binary against the bed.

pub mod audit_log;
pub mod bench;
pub mod binaries;
pub mod control_plane;
pub mod disruptions;
pub mod guard_task;
pub mod kubelet;
pub mod pods;
pub mod process;
pub mod quota;
pub mod scenario;
pub mod webhook;

pub use binaries::KubeVersion;
pub use control_plane::{TestBed, TestBedOptions};

/// Any failure of the test bed, with what to do about it in the message.
pub type Result<T, E = anyhow::Error> = std::result::Result<T, E>;
