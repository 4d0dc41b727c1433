//! ResourceQuota helpers.
//!
//! The ResourceQuota admission plugin charges every admitted Create to
//! `status.used`; the quota controller (kube-controller-manager) fills
//! `status.hard` when a quota appears and recomputes `status.used` when pods
//! end or go. These helpers only wait for it.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use k8s_openapi::api::core::v1::{Pod, ResourceQuota, ResourceQuotaSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{ListParams, ObjectMeta, PostParams};
use kube::{Api, Client};

use crate::control_plane::TestBed;

/// The name of the quota these helpers manage.
pub const QUOTA: &str = "pods";

/// How long the quota controller may take to catch up.
const CONTROLLER_WAIT: Duration = Duration::from_secs(60);

/// How long the quota controller may take to correct `status.used`: a charge
/// a Create leaked after the namespace's last pod event (a replenishment
/// recomputes at once) is corrected only by its full resync,
/// `--resource-quota-sync-period` (5 min, the default the bed runs with), so
/// the wait covers that period and a little more. On a busy machine that
/// ordering happens; the wait is that long only then.
const RECOMPUTE_WAIT: Duration = Duration::from_secs(330);

/// Creates quota `pods` in `ns` limiting pods to `hard`, and waits until it is
/// in force (its status covers the limit).
pub async fn set_pods_quota(bed: &TestBed, ns: &str, hard: u32) -> Result<()> {
    set_quota(bed, ns, &[("pods", &hard.to_string())]).await
}

/// Creates quota `pods` in `ns` with `hard` limits (resource, quantity) and
/// waits until it is in force. Only `pods` may be in use when it is created.
pub async fn set_quota(bed: &TestBed, ns: &str, hard: &[(&str, &str)]) -> Result<()> {
    set_named_quota(bed, ns, QUOTA, hard).await
}

/// [`set_quota`] for a quota named `name`.
pub async fn set_named_quota(
    bed: &TestBed,
    ns: &str,
    name: &str,
    hard: &[(&str, &str)],
) -> Result<()> {
    create_named(bed, ns, name, hard).await?;
    let deadline = Instant::now() + CONTROLLER_WAIT;
    while !in_force(bed, ns, name).await? {
        if Instant::now() > deadline {
            bail!("the quota controller did not fill the status of {ns}/{name} within {CONTROLLER_WAIT:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// Creates quota `name` in `ns` with `hard` limits; the quota controller
/// fills its status: see [`in_force`].
pub async fn create_named(
    bed: &TestBed,
    ns: &str,
    name: &str,
    hard: &[(&str, &str)],
) -> Result<()> {
    let api: Api<ResourceQuota> = Api::namespaced(bed.client.clone(), ns);
    let map: BTreeMap<String, Quantity> = hard
        .iter()
        .map(|(k, v)| (k.to_string(), Quantity(v.to_string())))
        .collect();
    let rq = ResourceQuota {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec: Some(ResourceQuotaSpec {
            hard: Some(map.clone()),
            ..Default::default()
        }),
        ..Default::default()
    };
    api.create(&PostParams::default(), &rq)
        .await
        .with_context(|| format!("creating quota {ns}/{name}"))?;
    Ok(())
}

/// Whether quota `name` is in force: its status covers every limit it sets.
/// (The quota controller fills a count of a custom resource only once it
/// watches that resource, after its next discovery; a change to such an
/// object then makes it recompute.)
pub async fn in_force(bed: &TestBed, ns: &str, name: &str) -> Result<bool> {
    let rq = Api::<ResourceQuota>::namespaced(bed.client.clone(), ns)
        .get(name)
        .await
        .with_context(|| format!("reading quota {ns}/{name}"))?;
    let hard = rq.spec.and_then(|s| s.hard).unwrap_or_default();
    let status = rq.status.unwrap_or_default();
    Ok(status.hard.as_ref() == Some(&hard)
        && status
            .used
            .as_ref()
            .is_some_and(|u| hard.keys().all(|k| u.contains_key(k))))
}

/// The pods of `ns` a quota counts: not ended, and not past the end of a
/// graceful deletion (the quota controller's rule).
pub async fn counted_pods(client: &Client, ns: &str) -> Result<i64> {
    let pods = Api::<Pod>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await?;
    let now = k8s_openapi::jiff::Timestamp::now();
    let n = pods
        .items
        .iter()
        .filter(|p| {
            let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
            if matches!(phase, Some("Succeeded" | "Failed")) {
                return false;
            }
            match (
                &p.metadata.deletion_timestamp,
                p.metadata.deletion_grace_period_seconds,
            ) {
                (Some(t), Some(g)) => t.0.as_second() + g >= now.as_second(),
                _ => true,
            }
        })
        .count();
    Ok(i64::try_from(n)?)
}

/// After pods ended or went: waits until the quota controller has
/// recomputed `status.used.pods`.
///
/// Where an executor's Create may race the recount, wait with
/// [`released`] instead.
pub async fn recalculate(bed: &TestBed, ns: &str) -> Result<()> {
    let (used, have) = wait_counts(bed, ns, RECOMPUTE_WAIT, |used, have| used == have).await?;
    if used != have {
        bail!("the quota controller did not recompute {ns}/{QUOTA} to {have} pods within {RECOMPUTE_WAIT:?} (its full resync is 5 min); it counts {used}");
    }
    Ok(())
}

/// After a pod went while an executor keeps retrying its Create: waits
/// until the quota controller has released the gone pod's charge, i.e.
/// `status.used.pods` counts no more pods than exist. Not equality
/// ([`recalculate`]): the controller recounts from its informer's cache, so
/// a Create admitted (and charged) while it recounts can be counted out
/// again, and such an undercount lasts until its full resync (5 min),
/// longer than a test may wait. The release itself follows the pod's
/// deletion event at once.
pub async fn released(bed: &TestBed, ns: &str) -> Result<()> {
    let (used, have) = wait_counts(bed, ns, CONTROLLER_WAIT, |used, have| used <= have).await?;
    if used > have {
        bail!("the quota controller did not release the charge of a gone pod in {ns}/{QUOTA} within {CONTROLLER_WAIT:?}: it counts {used} pods, {have} exist");
    }
    Ok(())
}

/// Polls (`status.used.pods`, pods that count) until `done` holds or
/// `limit` has passed; returns the last pair either way.
async fn wait_counts(
    bed: &TestBed,
    ns: &str,
    limit: Duration,
    done: impl Fn(i64, i64) -> bool,
) -> Result<(i64, i64)> {
    let deadline = Instant::now() + limit;
    loop {
        let have = counted_pods(&bed.client, ns).await?;
        let used = used_pods(&bed.client, ns).await?;
        if done(used, have) || Instant::now() > deadline {
            return Ok((used, have));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
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

/// `status.used[resource]` of quota `name` in `ns`, as the apiserver has it now.
pub async fn used(client: &Client, ns: &str, name: &str, resource: &str) -> Result<String> {
    let rq = Api::<ResourceQuota>::namespaced(client.clone(), ns)
        .get(name)
        .await
        .with_context(|| format!("reading quota {ns}/{name}"))?;
    rq.status
        .and_then(|s| s.used)
        .and_then(|u| u.get(resource).cloned())
        .map(|q| q.0)
        .with_context(|| format!("quota {ns}/{name} has no status.used[{resource:?}]"))
}
