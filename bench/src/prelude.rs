//! What every group module uses: the imports the bench shares and its
//! helpers ([`crate::report`]), glob-imported so a group names only what
//! it needs.

pub(crate) use anyhow::{bail, Context, Result};
pub(crate) use futures::{stream, StreamExt};
pub(crate) use hyper::body::Bytes;
pub(crate) use k8s_openapi::api::core::v1::{Namespace, Pod};
pub(crate) use kube::api::{DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
pub(crate) use kube::Api;
pub(crate) use scenarios::guard_task::{spec, RunningTask};
pub(crate) use serde_json::{json, Value};
pub(crate) use std::collections::BTreeMap;
pub(crate) use std::net::SocketAddr;
pub(crate) use std::path::PathBuf;
pub(crate) use std::process::{Command, Stdio};
pub(crate) use std::sync::Arc;
pub(crate) use std::time::{Duration, Instant};
pub(crate) use testbed::kubelet::{now_rfc3339, Kubelet, KubeletOptions, Terminal};
pub(crate) use testbed::load::histogram;
pub(crate) use testbed::load::loadgen::{self, Protocol, Target};
pub(crate) use testbed::load::pin;
pub(crate) use testbed::load::procfs;
pub(crate) use testbed::load::stats::{percentile_f64, round3};
pub(crate) use testbed::pods::{self, CreateOutcome};
pub(crate) use testbed::process::free_port;
pub(crate) use testbed::sidecar::SidecarProcess;
pub(crate) use testbed::webhook::{register_noop, Hook, Registration, WebhookProcess};
pub(crate) use testbed::{TestBed, TestBedOptions};

pub(crate) use crate::groups::webhook::BaselineServer;
pub(crate) use crate::report::*;
pub(crate) use crate::{Args, Sizes};
