//! How the bench reports (one JSON object per row on stdout, a table on
//! stderr) and the helpers its groups share.

use crate::prelude::*;

pub(crate) fn emit(v: Value) {
    println!("{v}");
}

pub(crate) fn table(line: String) {
    eprintln!("{line}");
}

/// Runs `create(i)` for every i below `n`, 16 at a time; any error fails it.
/// PUTs task `task` in `ns` with `body`; any answer but 201 (created) or
/// 200 (already there) is an error.
pub(crate) async fn put_task(
    sidecar: &SidecarProcess,
    ns: &str,
    task: &str,
    body: &Value,
) -> Result<()> {
    let (code, v) = sidecar
        .request("PUT", &format!("/v1/tasks/{ns}/{task}"), Some(body))
        .await?;
    if code != 201 && code != 200 {
        bail!("PUT {task}: {code} {v}");
    }
    Ok(())
}

pub(crate) async fn create_all<F, Fut>(n: usize, create: F) -> Result<()>
where
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = Result<()>>,
{
    let results: Vec<Result<()>> = stream::iter(0..n)
        .map(create)
        .buffer_unordered(16)
        .collect()
        .await;
    results.into_iter().collect()
}

pub(crate) fn mb(b: u64) -> f64 {
    b as f64 / 1e6
}
