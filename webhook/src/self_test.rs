//! The round trip `helm test` proves: API server → Service → webhook.
//!
//! A readiness GET only shows that a replica is up; it passes with a wrong
//! `caBundle`, a Service that routes nowhere, or webhook configurations that
//! point elsewhere. `graceguard-webhook self-test` instead sends a dry-run pod
//! Create (nothing is stored, nothing charged to quota) named with
//! [`NAME_PREFIX`] to the API server, and the collision guard answers such a
//! dry run with a [`WARNING_PREFIX`] warning, which the API server hands back
//! to the client. The warning arrives only if the API server really called
//! graceguard: under `failurePolicy: Ignore` a failed call is silently allowed,
//! so "admitted" alone proves nothing.

use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::PostParams;
use kube::core::Request;

use crate::command::CliError;

/// Why the self-test failed: graceguard did not answer its dry run, or the
/// dry run could not be sent.
#[derive(Debug, thiserror::Error)]
pub enum SelfTestError {
    #[error("building the dry-run Create of pod {namespace}/{name}: {reason}")]
    Request {
        namespace: String,
        name: String,
        reason: String,
    },
    #[error("the API server did not answer the dry-run Create of pod {namespace}/{name} within {timeout:?}")]
    Timeout {
        namespace: String,
        name: String,
        timeout: Duration,
    },
    #[error("the dry-run Create of pod {namespace}/{name} failed: {source}")]
    Send {
        namespace: String,
        name: String,
        #[source]
        source: kube::Error,
    },
    #[error("the API server refused the dry-run Create of pod {namespace}/{name} ({status}): {body}\n\
             fix: if it names graceguard's webhook, the API server cannot reach it (check the Service's endpoints \
             and the webhook configurations' caBundle); otherwise give the test's service account `create` on pods \
             in {namespace} and check that the namespace exists")]
    Refused {
        namespace: String,
        name: String,
        status: http::StatusCode,
        body: String,
    },
    #[error("the API server admitted the dry-run Create of pod {namespace}/{name} without graceguard's answer \
             (warnings: {warnings:?}): it did not call graceguard, or the call failed and failurePolicy Ignore let \
             the Create through.\n\
             fix: check the caBundle of the collision guard's webhook configuration against the serving \
             certificate, that the Service has ready endpoints, that {namespace} is not excluded from the webhooks, \
             and the API server's log for \"failed calling webhook\"")]
    NotCalled {
        namespace: String,
        name: String,
        warnings: Vec<String>,
    },
}

/// Names of the self-test's dry-run pods. Only a dry-run Create with this
/// prefix gets the warning; a real Create is judged like any other.
pub const NAME_PREFIX: &str = "graceguard-self-test-";

/// The start of the warning graceguard adds to a self-test's answer.
pub const WARNING_PREFIX: &str = "graceguard self-test:";

/// The warning for a dry-run Create of `name`, if it is a self-test.
pub fn warning(name: &str, dry_run: bool) -> Option<String> {
    if !dry_run || !name.starts_with(NAME_PREFIX) {
        return None;
    }
    let replica = std::env::var("GRACEGUARD_POD_NAME").unwrap_or_else(|_| "unknown".into());
    Some(format!(
        "{WARNING_PREFIX} the collision guard answered this dry run (replica {replica})"
    ))
}

/// Sends the dry-run Create into `namespace` and checks that graceguard answered.
pub async fn run(
    kubeconfig: Option<&std::path::Path>,
    namespace: &str,
    timeout: Duration,
) -> Result<String, CliError> {
    let client = crate::command::client(kubeconfig).await?;
    let suffix: String = format!("{:08x}", rand_suffix());
    let name = format!("{NAME_PREFIX}{suffix}");
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app.kubernetes.io/component": "self-test"}},
        "spec": {"containers": [{"name": "never-runs", "image": "graceguard.invalid/self-test:dry-run"}]},
    }))
    .map_err(|e| request_error(namespace, &name, e))?;
    let body = serde_json::to_vec(&pod).map_err(|e| request_error(namespace, &name, e))?;
    let pp = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let req = Request::new(format!("/api/v1/namespaces/{namespace}/pods"))
        .create(&pp, body)
        .map_err(|e| request_error(namespace, &name, e))?;
    let send = client.send(req.map(kube::client::Body::from));
    let resp = tokio::time::timeout(timeout, send)
        .await
        .map_err(|_| SelfTestError::Timeout {
            namespace: namespace.into(),
            name: name.clone(),
            timeout,
        })?
        .map_err(|source| SelfTestError::Send {
            namespace: namespace.into(),
            name: name.clone(),
            source,
        })?;
    let status = resp.status();
    let warnings: Vec<String> = resp
        .headers()
        .get_all(http::header::WARNING)
        .iter()
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
        .collect();
    let body = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .map(|b| String::from_utf8_lossy(&b.to_bytes()).into_owned())
        .unwrap_or_default();
    Ok(check(namespace, &name, status, &warnings, &body)?)
}

/// The dry run could not be built (a namespace that is no URI path).
fn request_error(namespace: &str, name: &str, e: impl std::fmt::Display) -> SelfTestError {
    SelfTestError::Request {
        namespace: namespace.into(),
        name: name.into(),
        reason: e.to_string(),
    }
}

/// The verdict on the API server's answer (pure, for the unit tests).
fn check(
    namespace: &str,
    name: &str,
    status: http::StatusCode,
    warnings: &[String],
    body: &str,
) -> Result<String, SelfTestError> {
    if !status.is_success() {
        return Err(SelfTestError::Refused {
            namespace: namespace.into(),
            name: name.into(),
            status,
            body: body.trim().into(),
        });
    }
    match warnings.iter().find(|w| w.contains(WARNING_PREFIX)) {
        Some(w) => Ok(w.clone()),
        None => Err(SelfTestError::NotCalled {
            namespace: namespace.into(),
            name: name.into(),
            warnings: warnings.to_vec(),
        }),
    }
}

/// Eight hex digits that differ between runs (a pod name suffix, not a secret).
fn rand_suffix() -> u32 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    nanos ^ std::process::id().rotate_left(16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_dry_run_with_the_prefix_gets_the_warning() {
        assert!(warning("graceguard-self-test-0a", true).is_some());
        assert!(warning("graceguard-self-test-0a", false).is_none());
        assert!(warning("train-0", true).is_none());
    }

    #[test]
    fn admitted_without_the_warning_fails_and_says_why() {
        let w = vec![r#"299 - "graceguard self-test: the collision guard answered this dry run (replica a)""#.to_string()];
        assert!(check("default", "n", http::StatusCode::CREATED, &w, "").is_ok());
        let Err(e @ SelfTestError::NotCalled { .. }) =
            check("default", "n", http::StatusCode::CREATED, &[], "")
        else {
            panic!("no warning must fail")
        };
        assert!(e.to_string().contains("caBundle"), "{e}");
        let Err(e @ SelfTestError::Refused { .. }) = check(
            "default",
            "n",
            http::StatusCode::INTERNAL_SERVER_ERROR,
            &w,
            "failed calling webhook",
        ) else {
            panic!("a refusal must fail")
        };
        assert!(e.to_string().contains("failed calling webhook"), "{e}");
    }
}
