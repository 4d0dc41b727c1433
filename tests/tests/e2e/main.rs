//! graceguard's end-to-end tests: one binary, one module per area, each
//! test against a real etcd and kube-apiserver (real nodes where it says
//! so) that it starts for itself. nextest runs every test in a process of
//! its own; `.config/nextest.toml` and `scripts/test` select them by module
//! (`test(/^helm_install::/)`), and one runs an area with
//! `cargo nextest run -p graceguard-tests --test e2e helm_install::`.

mod admission_limits;
mod airflow_executor;
mod audit_log;
mod characterization;
mod chart_install;
mod cluster_lifecycle;
mod cluster_upgrade;
mod collision_guard;
mod collision_kinds;
mod demo;
mod disruption_and_audit;
mod dual_stack;
mod fencing;
mod guard;
mod guard_bounds;
mod guard_chaos;
mod guard_cli;
mod helm_install;
mod hollow_nodes;
mod least_privilege;
mod monitoring;
mod node_restriction;
mod real_components;
mod real_nodes;
mod sidecar;
mod sidecar_api;
mod stalled_connection;
mod storm;
