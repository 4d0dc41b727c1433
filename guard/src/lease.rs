//! An executor instance's liveness: a `coordination.k8s.io/v1` Lease it renews.
//!
//! Adoption (rule 6) must tell pods of a dead instance from pods of a live
//! one; a Lease that is not renewed within its duration says the instance is gone.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Client};

use crate::driver::GuardError;

/// The Lease name of `instance`.
pub fn lease_name(instance: &str) -> String {
    format!("graceguard-{}", crate::naming::task_stem(instance))
}

fn api_err(what: &str, e: kube::Error) -> GuardError {
    GuardError::Api(format!("{what}: {e}"))
}

/// A Lease held by this instance.
#[derive(Clone)]
pub struct InstanceLease {
    api: Api<Lease>,
    name: String,
    instance: String,
    duration: Duration,
}

impl InstanceLease {
    /// Creates (or takes over) the Lease of `instance` in `namespace`.
    pub async fn acquire(
        client: Client,
        namespace: &str,
        instance: &str,
        duration: Duration,
    ) -> Result<Self, GuardError> {
        let l = Self {
            api: Api::namespaced(client, namespace),
            name: lease_name(instance),
            instance: instance.to_string(),
            duration,
        };
        if l.api
            .get_opt(&l.name)
            .await
            .map_err(|e| api_err("reading the instance Lease", e))?
            .is_none()
        {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(l.name.clone()),
                    ..Default::default()
                },
                spec: Some(l.spec(Timestamp::now())),
            };
            match l.api.create(&PostParams::default(), &lease).await {
                Ok(_) => return Ok(l),
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(e) => return Err(api_err("creating the instance Lease", e)),
            }
        }
        l.renew().await?;
        Ok(l)
    }

    fn spec(&self, now: Timestamp) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(self.instance.clone()),
            lease_duration_seconds: Some(
                i32::try_from(self.duration.as_secs()).unwrap_or(i32::MAX),
            ),
            renew_time: Some(MicroTime(now)),
            ..Default::default()
        }
    }

    /// Renews the Lease now.
    pub async fn renew(&self) -> Result<(), GuardError> {
        let patch = serde_json::json!({ "spec": self.spec(Timestamp::now()) });
        self.api
            .patch(&self.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| api_err("renewing the instance Lease", e))?;
        Ok(())
    }

    /// Renews every third of the duration until the task is aborted.
    pub fn spawn_renewal(self) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            // At least once a second, and never a zero period (tokio panics on it).
            let mut tick = tokio::time::interval((self.duration / 3).max(Duration::from_secs(1)));
            loop {
                tick.tick().await;
                if let Err(e) = self.renew().await {
                    tracing::warn!(error = %e, "instance Lease renewal failed; retrying at the next tick");
                }
            }
        })
    }
}

/// Whether a Lease says its instance is gone: missing, never renewed, or
/// renewed longer than its duration before `now`.
pub fn expired(lease: Option<&Lease>, now: Timestamp) -> bool {
    let Some(spec) = lease.and_then(|l| l.spec.as_ref()) else {
        return true;
    };
    let (Some(renewed), Some(secs)) = (spec.renew_time.as_ref(), spec.lease_duration_seconds)
    else {
        return true;
    };
    now.as_second() > renewed.0.as_second() + i64::from(secs)
}

/// When a Lease says its instance is gone (s since the epoch); `None` when
/// it already says so (missing or never renewed).
pub fn expires_at(lease: Option<&Lease>) -> Option<i64> {
    let spec = lease.and_then(|l| l.spec.as_ref())?;
    let renewed = spec.renew_time.as_ref()?;
    Some(renewed.0.as_second() + i64::from(spec.lease_duration_seconds?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(renewed: i64, secs: i32) -> Lease {
        Lease {
            metadata: ObjectMeta::default(),
            spec: Some(LeaseSpec {
                renew_time: Some(MicroTime(Timestamp::from_second(renewed).expect("ts"))),
                lease_duration_seconds: Some(secs),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn expiry() {
        let now = Timestamp::from_second(1_000).expect("ts");
        assert!(expired(None, now));
        assert!(!expired(Some(&lease(990, 30)), now));
        assert!(expired(Some(&lease(900, 30)), now));
        assert_eq!(expires_at(Some(&lease(990, 30))), Some(1_020));
        assert_eq!(expires_at(None), None);
        assert!(expired(
            Some(&Lease {
                metadata: ObjectMeta::default(),
                spec: None
            }),
            now
        ));
    }
}
