//! How the bench reports (one JSON object per row on stdout, a table on
//! stderr) and the helpers its groups share.

use crate::prelude::*;

pub(crate) fn emit(v: Value) {
    println!("{v}");
}

pub(crate) fn table(line: String) {
    eprintln!("{line}");
}

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

/// Runs `create(i)` for every i below `n`, 16 at a time; any error fails it.
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

/// graceguard ÷ no-op may be at most this: the API server latencies at p99
/// (medians over the repetitions), and the figures users see in every run.
pub(crate) const LATENCY_RATIO_TARGET: f64 = 1.1;

/// The median; none of nothing (never a 0 that would enter a ratio).
pub(crate) fn median(v: &mut [f64]) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    Some(if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    })
}

/// For each of `keys`: row `a` ÷ row `b` per repetition (rows told apart
/// by their `field`, paired by repetition), and whether every repetition
/// is within the target (none when a run lacks the figure).
pub(crate) fn per_run(
    rows: &[Value],
    field: &str,
    keys: &[&str],
    a: &str,
    b: &str,
) -> (Value, Value) {
    let of = |which: &str, rep: &Value, key: &str| {
        rows.iter()
            .find(|r| r[field] == which && &r["repetition"] == rep)
            .and_then(|r| r[key].as_f64())
    };
    let reps: Vec<&Value> = rows
        .iter()
        .filter(|r| r[field] == a)
        .map(|r| &r["repetition"])
        .collect();
    let (mut ratios, mut met) = (serde_json::Map::new(), serde_json::Map::new());
    for &key in keys {
        let each: Vec<Option<f64>> = reps
            .iter()
            .map(|rep| match (of(a, rep, key), of(b, rep, key)) {
                (Some(x), Some(y)) if y > 0.0 => Some(round3(x / y)),
                _ => None,
            })
            .collect();
        let all = (!each.is_empty() && each.iter().all(Option::is_some))
            .then(|| each.iter().flatten().all(|r| *r <= LATENCY_RATIO_TARGET));
        ratios.insert(key.into(), json!(each));
        met.insert(key.into(), json!(all));
    }
    (Value::Object(ratios), Value::Object(met))
}
