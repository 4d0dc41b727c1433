//! Objects of any kind, as the collision guard's end-to-end tests create them.

use std::fmt::Debug;
use std::time::{Duration, Instant};

use anyhow::{ensure, Result};
use kube::api::PostParams;
use kube::{Api, Resource};
use serde::de::DeserializeOwned;
use serde::Serialize;

use testbed::pods::CreateOutcome;
use testbed::webhook::{Hook, WebhookProcess, COLLISION_KINDS};
use testbed::TestBed;

/// The webhook guarding [`COLLISION_KINDS`], registered for them.
pub async fn guarding_kinds(bed: &TestBed) -> Result<WebhookProcess> {
    let webhook = WebhookProcess::start(bed, &["--collision-kinds", COLLISION_KINDS]).await?;
    webhook.register(bed, &[Hook::CollisionKinds]).await?;
    Ok(webhook)
}

/// The webhook as the chart runs it with other kinds guarded: every pod
/// endpoint and the other kinds' guard registered.
pub async fn guarding_everything(bed: &TestBed) -> Result<WebhookProcess> {
    let webhook = WebhookProcess::start(bed, &["--collision-kinds", COLLISION_KINDS]).await?;
    let hooks: Vec<Hook> = testbed::webhook::ALL_HOOKS
        .iter()
        .copied()
        .chain([Hook::CollisionKinds])
        .collect();
    webhook.register(bed, &hooks).await?;
    Ok(webhook)
}

/// Creates `obj`; the API server's refusal is an outcome, not an error.
pub async fn create<K>(api: &Api<K>, obj: &K) -> Result<CreateOutcome>
where
    K: Resource + Clone + DeserializeOwned + Serialize + Debug,
{
    testbed::pods::outcome(api.create(&PostParams::default(), obj).await)
}

/// Waits (up to 60 s) until the object `name` is terminating (a deletionTimestamp).
pub async fn wait_terminating<K>(api: &Api<K>, name: &str) -> Result<K>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let o = api.get(name).await?;
        if o.meta().deletion_timestamp.is_some() {
            return Ok(o);
        }
        ensure!(
            Instant::now() < deadline,
            "{name} is not terminating after 60 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits (up to 30 s) until graceguard's index has caught up with the object
/// named like `obj`: a dry-run Create of it (which charges no quota) is
/// answered by graceguard's denial, and that denial names `expect` (say, what
/// holds a terminating object). A name graceguard has not seen yet cannot be
/// guarded; real re-creates come long after the first Create and its
/// deletion, a test's within milliseconds, faster than a watch under load.
pub async fn wait_indexed<K>(api: &Api<K>, obj: &K, expect: &str) -> Result<()>
where
    K: Resource + Clone + DeserializeOwned + Serialize + Debug,
{
    let dry = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let out = testbed::pods::outcome(api.create(&dry, obj).await)?;
        if matches!(&out, CreateOutcome::Refused { message, .. }
            if message.contains("graceguard denied") && message.contains(expect))
        {
            return Ok(());
        }
        ensure!(
            Instant::now() < deadline,
            "graceguard did not index {:?} within 30 s (last answer {out:?})",
            obj.meta().name
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `n` colliding Creates of `obj`: each must be graceguard's 409 AlreadyExists
/// whose message names `holds`.
pub async fn denied_n_times<K>(api: &Api<K>, obj: &K, n: usize, holds: &str) -> Result<()>
where
    K: Resource + Clone + DeserializeOwned + Serialize + Debug,
{
    for i in 0..n {
        match create(api, obj).await? {
            CreateOutcome::Refused {
                code: 409,
                reason,
                message,
                ..
            } => {
                ensure!(reason == "AlreadyExists", "create {i}: {reason}: {message}");
                ensure!(
                    message.contains("graceguard denied this Create") && message.contains(holds),
                    "create {i}: not graceguard's denial naming {holds:?}: {message}"
                );
            }
            other => anyhow::bail!("create {i}: want graceguard's 409, got {other:?}"),
        }
    }
    Ok(())
}

/// Creates `obj` once its name is free again and returns how many times
/// graceguard denied it first. A terminating holder's read is reused for
/// --confirm-cache-ttl (1 s in the test bed) while the watch has not yet
/// delivered its removal (docs/denials.md), so under load a Create right
/// after the holder went may still be denied; past that window (with 2 s
/// for the API server's own latency) a denial is a defect.
pub async fn create_once_free<K>(api: &Api<K>, obj: &K) -> Result<u32>
where
    K: Resource + Clone + DeserializeOwned + Serialize + Debug,
{
    let gone_at = Instant::now();
    let mut late_denials = 0;
    loop {
        let out = create(api, obj).await?;
        if out == CreateOutcome::Created {
            return Ok(late_denials);
        }
        ensure!(
            gone_at.elapsed() < Duration::from_secs(3),
            "{:?} still denied {:?} after its holder was gone: {out:?}",
            obj.meta().name,
            gone_at.elapsed()
        );
        late_denials += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
