//! The instance `graceguard run` takes when none is given.
//!
//! A run's instance names its pods and its Lease: run again under the same
//! instance, a task resumes from its pods. `run-<hostname>` is stable across
//! restarts of one container, but a Job or an Argo step that is retried
//! runs in a new pod with a new name: the retry took another instance, met
//! the earlier run's pod holding the task's pod name as a foreign pod, and
//! never got it back. So the default comes from what the retries share, read
//! from the process's own pod ([`run_instance`]).

use k8s_openapi::api::core::v1::Pod;

use crate::core::naming::task_stem;

/// The annotation the Job controller puts on an Indexed Job's pods.
pub const JOB_INDEX: &str = "batch.kubernetes.io/job-completion-index";
/// Argo Workflows' label naming a pod's workflow.
pub const ARGO_WORKFLOW: &str = "workflows.argoproj.io/workflow";
/// Argo Workflows' annotation naming a pod's node; a retry's node is its
/// step's name with `(N)` appended.
pub const ARGO_NODE: &str = "workflows.argoproj.io/node-name";

/// The default instance of a run in `own` (its own pod, when it could be
/// read) on host `hostname`, and where it came from:
///
/// * a pod of a Job: `run-job-<job>` (with `-<index>` for an Indexed Job),
///   shared by the Job's retries; a Job that runs pods in parallel without
///   an index must give each its own `--instance`;
/// * a pod of an Argo step: from the workflow and the step's node, the
///   retry suffix `(N)` dropped;
/// * anything else: `run-<hostname>`, stable across container restarts.
pub fn run_instance(own: Option<&Pod>, hostname: &str) -> (String, &'static str) {
    let meta = own.map(|p| &p.metadata);
    let job = meta
        .and_then(|m| m.owner_references.as_ref())
        .and_then(|o| {
            o.iter().find(|r| {
                r.kind == "Job" && r.api_version.starts_with("batch/") && r.controller == Some(true)
            })
        })
        .map(|r| r.name.clone());
    let annotation = |key: &str| {
        meta.and_then(|m| m.annotations.as_ref())
            .and_then(|a| a.get(key))
            .cloned()
    };
    if let Some(job) = job {
        return match annotation(JOB_INDEX).or_else(|| {
            meta.and_then(|m| m.labels.as_ref())
                .and_then(|l| l.get(JOB_INDEX))
                .cloned()
        }) {
            Some(i) => (task_stem(&format!("run-job-{job}-{i}")), "its Indexed Job"),
            None => (task_stem(&format!("run-job-{job}")), "its Job"),
        };
    }
    let workflow = meta
        .and_then(|m| m.labels.as_ref())
        .and_then(|l| l.get(ARGO_WORKFLOW))
        .cloned();
    if let (Some(wf), Some(node)) = (workflow, annotation(ARGO_NODE)) {
        let step = without_retry_suffix(&node);
        return (
            task_stem(&format!("run-argo-{wf}-{step}")),
            "its Argo workflow step",
        );
    }
    (task_stem(&format!("run-{hostname}")), "its host name")
}

/// `step(3)` → `step`: the node of an Argo retry, its step's.
fn without_retry_suffix(node: &str) -> &str {
    match node.strip_suffix(')').and_then(|n| n.rsplit_once('(')) {
        Some((step, n)) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => step,
        _ => node,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    use kube::api::ObjectMeta;

    fn pod(
        owner: Option<(&str, &str)>,
        labels: &[(&str, &str)],
        annotations: &[(&str, &str)],
    ) -> Pod {
        let map = |kv: &[(&str, &str)]| {
            Some(
                kv.iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            )
        };
        Pod {
            metadata: ObjectMeta {
                owner_references: owner.map(|(kind, name)| {
                    vec![OwnerReference {
                        api_version: if kind == "Job" { "batch/v1" } else { "apps/v1" }.into(),
                        kind: kind.into(),
                        name: name.into(),
                        uid: "u".into(),
                        controller: Some(true),
                        ..Default::default()
                    }]
                }),
                labels: map(labels),
                annotations: map(annotations),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn a_retried_job_or_argo_step_keeps_its_instance_and_anything_else_its_host() {
        let job = pod(Some(("Job", "train")), &[], &[]);
        assert_eq!(run_instance(Some(&job), "train-x7k2p").0, "run-job-train");
        assert_eq!(run_instance(Some(&job), "train-9qzvb").0, "run-job-train");
        let indexed = pod(Some(("Job", "train")), &[], &[(JOB_INDEX, "3")]);
        assert_eq!(
            run_instance(Some(&indexed), "train-3-x").0,
            "run-job-train-3"
        );
        for (node, want) in [
            ("wf[0].fit(2)", "run-argo-wf-wf-0-fit-"),
            ("wf[0].fit", "run-argo-wf-wf-0-fit-"),
        ] {
            let argo = pod(None, &[(ARGO_WORKFLOW, "wf")], &[(ARGO_NODE, node)]);
            let (got, from) = run_instance(Some(&argo), "wf-123");
            assert!(got.starts_with(want), "{node}: {got}");
            assert_eq!(from, "its Argo workflow step");
        }
        let a = pod(
            None,
            &[(ARGO_WORKFLOW, "wf")],
            &[(ARGO_NODE, "wf[0].fit(1)")],
        );
        let b = pod(
            None,
            &[(ARGO_WORKFLOW, "wf")],
            &[(ARGO_NODE, "wf[0].fit(2)")],
        );
        let other = pod(
            None,
            &[(ARGO_WORKFLOW, "wf")],
            &[(ARGO_NODE, "wf[1].eval(1)")],
        );
        assert_eq!(
            run_instance(Some(&a), "h1").0,
            run_instance(Some(&b), "h2").0
        );
        assert_ne!(
            run_instance(Some(&a), "h1").0,
            run_instance(Some(&other), "h1").0
        );
        // A ReplicaSet's pod, no pod at all: the host.
        let rs = pod(Some(("ReplicaSet", "web")), &[], &[]);
        assert_eq!(run_instance(Some(&rs), "web-1").0, "run-web-1");
        assert_eq!(
            run_instance(None, "laptop"),
            ("run-laptop".into(), "its host name")
        );
        for p in [job, indexed, rs] {
            assert!(crate::core::naming::check_instance(&run_instance(Some(&p), "h").0).is_ok());
        }
    }

    #[test]
    fn only_a_trailing_number_in_parentheses_is_a_retry() {
        assert_eq!(without_retry_suffix("a.b(12)"), "a.b");
        assert_eq!(without_retry_suffix("a.b(x)"), "a.b(x)");
        assert_eq!(without_retry_suffix("a.b()"), "a.b()");
        assert_eq!(without_retry_suffix("a.b"), "a.b");
    }
}
