//! ResourceQuota helpers. No quota controller runs in the bed, so a test sets
//! `status.hard`/`status.used` by hand; the ResourceQuota admission plugin then
//! charges every admitted Create to `status.used`, exactly as in a cluster.

use std::collections::BTreeMap;

use anyhow::{Context, Result};
use k8s_openapi::api::core::v1::{ResourceQuota, ResourceQuotaSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Client};

/// The name of the quota these helpers manage.
pub const QUOTA: &str = "pods";

/// Creates (or updates) quota `pods` in `ns` with `hard` pods and sets its
/// status to `used` of `hard`.
pub async fn set_pods_quota(client: &Client, ns: &str, hard: u32, used: u32) -> Result<()> {
    let (h, u) = (hard.to_string(), used.to_string());
    set_quota(client, ns, &[("pods", &h)], &[("pods", &u)]).await
}

/// Creates (or updates) quota `pods` in `ns` with `hard` limits, and sets its
/// status to `hard` and `used` (resource, quantity) as the quota controller would.
pub async fn set_quota(
    client: &Client,
    ns: &str,
    hard: &[(&str, &str)],
    used: &[(&str, &str)],
) -> Result<()> {
    let api: Api<ResourceQuota> = Api::namespaced(client.clone(), ns);
    let map = |kv: &[(&str, &str)]| -> BTreeMap<String, Quantity> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
            .collect()
    };
    if api.get_opt(QUOTA).await?.is_none() {
        let rq = ResourceQuota {
            metadata: ObjectMeta {
                name: Some(QUOTA.into()),
                ..Default::default()
            },
            spec: Some(ResourceQuotaSpec {
                hard: Some(map(hard)),
                ..Default::default()
            }),
            ..Default::default()
        };
        api.create(&PostParams::default(), &rq)
            .await
            .with_context(|| format!("creating quota {ns}/{QUOTA}"))?;
    } else {
        let spec = serde_json::json!({"spec": {"hard": map(hard)}});
        api.patch(QUOTA, &PatchParams::default(), &Patch::Merge(&spec))
            .await?;
    }
    let status = serde_json::json!({"status": {"hard": map(hard), "used": map(used)}});
    api.patch_status(QUOTA, &PatchParams::default(), &Patch::Merge(&status))
        .await
        .with_context(|| format!("setting the status of quota {ns}/{QUOTA}"))?;
    Ok(())
}

/// `status.used.pods` of quota `pods` in `ns`, as the apiserver has it now.
pub async fn used_pods(client: &Client, ns: &str) -> Result<i64> {
    let api: Api<ResourceQuota> = Api::namespaced(client.clone(), ns);
    let rq = api
        .get(QUOTA)
        .await
        .with_context(|| format!("reading quota {ns}/{QUOTA}"))?;
    let used = rq
        .status
        .and_then(|s| s.used)
        .and_then(|u| u.get("pods").cloned())
        .with_context(|| format!("quota {ns}/{QUOTA} has no status.used.pods"))?;
    used.0.parse().with_context(|| {
        format!(
            "quota {ns}/{QUOTA}: status.used.pods is {:?}, not a whole number",
            used.0
        )
    })
}
