//! Prometheus histograms read from a component's `/metrics` text: two
//! scrapes, the buckets' difference, and its quantiles, computed the way
//! PromQL's `histogram_quantile` does (linear within the bucket). This is how
//! the API server's own latency SLIs are measured over one stretch of time.

use std::collections::BTreeMap;

/// One histogram's cumulative buckets (upper bound → count), summed over
/// every series that matched.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Buckets(pub BTreeMap<OrderedBound, f64>);

/// A bucket's upper bound, ordered (`+Inf` last).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OrderedBound(pub f64);

impl Eq for OrderedBound {}

impl PartialOrd for OrderedBound {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for OrderedBound {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// The labels of one sample line, unescaped enough for the values the API
/// server writes (no `,` or `"` inside values it is matched on here).
fn labels(line: &str) -> Option<(&str, BTreeMap<&str, &str>)> {
    let (name, rest) = line.split_once('{')?;
    let (inside, _) = rest.rsplit_once('}')?;
    let mut out = BTreeMap::new();
    for pair in inside.split("\",") {
        let (k, v) = pair.split_once("=\"")?;
        out.insert(k.trim_start_matches(','), v.trim_end_matches('"'));
    }
    Some((name, out))
}

fn value(line: &str) -> Option<f64> {
    line.rsplit_once(' ')?.1.parse().ok()
}

/// The buckets of histogram `name` (without `_bucket`) summed over every
/// series whose labels include all of `want`.
pub fn buckets(text: &str, name: &str, want: &[(&str, &str)]) -> Buckets {
    let bucket = format!("{name}_bucket");
    let mut out = BTreeMap::new();
    for line in text.lines().filter(|l| l.starts_with(&bucket)) {
        let Some((n, l)) = labels(line) else { continue };
        if n != bucket || !want.iter().all(|(k, v)| l.get(k) == Some(v)) {
            continue;
        }
        let Some(le) = l.get("le").and_then(|le| match *le {
            "+Inf" => Some(f64::INFINITY),
            s => s.parse().ok(),
        }) else {
            continue;
        };
        let Some(v) = value(line) else { continue };
        *out.entry(OrderedBound(le)).or_insert(0.0) += v;
    }
    Buckets(out)
}

/// Observations per value of label `by` of histogram `name` (its `_count`),
/// over series whose labels include all of `want`.
pub fn counts_by(text: &str, name: &str, by: &str, want: &[(&str, &str)]) -> BTreeMap<String, f64> {
    sum_by(text, &format!("{name}_count"), by, want)
}

/// The values of series `sample` (a counter, or a histogram's `_count`)
/// summed per value of label `by`, over series whose labels include all of
/// `want`.
pub fn sum_by(text: &str, sample: &str, by: &str, want: &[(&str, &str)]) -> BTreeMap<String, f64> {
    let mut out = BTreeMap::new();
    for line in text.lines().filter(|l| l.starts_with(sample)) {
        let Some((n, l)) = labels(line) else { continue };
        if n != sample || !want.iter().all(|(k, v)| l.get(k) == Some(v)) {
            continue;
        }
        if let (Some(key), Some(v)) = (l.get(by), value(line)) {
            *out.entry((*key).to_string()).or_insert(0.0) += v;
        }
    }
    out
}

/// The values of series `name` (a counter, a gauge, a histogram's `_count`)
/// whose labels include all of `want`, summed: several processes' scrapes
/// concatenated add up.
pub fn sum(text: &str, name: &str, want: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name))
        .filter_map(|line| {
            let (n, l) = match line.contains('{') {
                true => labels(line)?,
                false => (line.split_once(' ')?.0, BTreeMap::new()),
            };
            (n == name && want.iter().all(|(k, v)| l.get(k) == Some(v)))
                .then(|| value(line))
                .flatten()
        })
        .sum()
}

impl Buckets {
    /// What was observed between `earlier` and `self` (a later scrape of
    /// the same process). Any bucket that went down means the process
    /// restarted: the whole histogram then counts from zero, as Prometheus'
    /// `increase` treats a reset (bucket by bucket, a restart that outgrew
    /// some old buckets but not others would give a histogram of neither).
    pub fn since(&self, earlier: &Buckets) -> Buckets {
        let reset = earlier
            .0
            .iter()
            .any(|(le, before)| self.0.get(le).copied().unwrap_or(0.0) < *before);
        if reset {
            return self.clone();
        }
        Buckets(
            self.0
                .iter()
                .map(|(le, v)| (*le, v - earlier.0.get(le).copied().unwrap_or(0.0)))
                .collect(),
        )
    }

    /// Adds `other`'s buckets to these (the same histogram of another process).
    pub fn add(&mut self, other: &Buckets) {
        for (le, v) in &other.0 {
            *self.0.entry(*le).or_insert(0.0) += v;
        }
    }

    /// Observations in total (the `+Inf` bucket).
    pub fn count(&self) -> f64 {
        self.0.values().next_back().copied().unwrap_or(0.0)
    }

    /// The `q`-quantile (0..=1) as `histogram_quantile` computes it; `None`
    /// without observations. Falling in the `+Inf` bucket gives the highest
    /// finite bound (the API server's histograms end at 60 s).
    pub fn quantile(&self, q: f64) -> Option<f64> {
        let total = self.count();
        if total <= 0.0 {
            return None;
        }
        let rank = q.clamp(0.0, 1.0) * total;
        let (mut lower, mut below) = (0.0, 0.0);
        for (le, &cum) in &self.0 {
            if cum >= rank {
                if le.0.is_infinite() {
                    return Some(lower);
                }
                let in_bucket = cum - below;
                if in_bucket <= 0.0 {
                    return Some(le.0);
                }
                return Some(lower + (le.0 - lower) * (rank - below) / in_bucket);
            }
            lower = le.0;
            below = cum;
        }
        Some(lower)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"# HELP apiserver_request_duration_seconds x
apiserver_request_duration_seconds_bucket{component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="",verb="POST",version="v1",le="0.005"} 10
apiserver_request_duration_seconds_bucket{component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="",verb="POST",version="v1",le="0.01"} 90
apiserver_request_duration_seconds_bucket{component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="",verb="POST",version="v1",le="+Inf"} 100
apiserver_request_duration_seconds_count{component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="",verb="POST",version="v1"} 100
apiserver_request_duration_seconds_bucket{component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="status",verb="POST",version="v1",le="0.005"} 7
apiserver_request_duration_seconds_bucket{component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="status",verb="POST",version="v1",le="+Inf"} 7
apiserver_request_duration_seconds_bucket{component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="",verb="POST",version="v2",le="0.005"} 0
apiserver_request_duration_seconds_bucket{component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="",verb="POST",version="v2",le="0.01"} 0
apiserver_request_duration_seconds_bucket{component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="",verb="POST",version="v2",le="+Inf"} 100
"#;

    fn create() -> Buckets {
        buckets(
            TEXT,
            "apiserver_request_duration_seconds",
            &[("resource", "pods"), ("verb", "POST"), ("subresource", "")],
        )
    }

    #[test]
    fn series_are_summed_and_others_left_out() {
        let b = create();
        assert_eq!(b.count(), 200.0);
        assert_eq!(b.0.get(&OrderedBound(0.005)), Some(&10.0));
    }

    #[test]
    fn quantiles_interpolate_within_the_bucket_like_promql() {
        let b = create();
        // rank 20 of 200: 10 below 5 ms, 80 in (5, 10] ms: 5 + 5 * 10/80.
        let q = b.quantile(0.1).unwrap_or_default();
        assert!((q - 0.005625).abs() < 1e-9, "{q}");
        // rank 198 is in +Inf: the highest finite bound.
        assert_eq!(b.quantile(0.99), Some(0.01));
        assert_eq!(Buckets::default().quantile(0.5), None);
    }

    #[test]
    fn a_difference_is_what_was_observed_in_between() {
        let later = create();
        let mut earlier = later.clone();
        for v in earlier.0.values_mut() {
            *v /= 2.0;
        }
        let d = later.since(&earlier);
        assert_eq!(d.count(), 100.0);
        // A restart (counts went down) counts from zero.
        assert_eq!(earlier.since(&later).count(), 100.0);
    }

    #[test]
    fn a_restart_that_outgrew_some_buckets_counts_whole_from_zero() {
        let b = |fast: f64, all: f64| {
            Buckets(BTreeMap::from([
                (OrderedBound(0.01), fast),
                (OrderedBound(f64::INFINITY), all),
            ]))
        };
        let (earlier, later) = (b(5.0, 50.0), b(8.0, 10.0));
        assert_eq!(later.since(&earlier), later);
    }

    #[test]
    fn a_sum_adds_every_process_and_matching_series_only() {
        let two = "graceguard_confirmation_gets_total 3\n# EOF\ngraceguard_confirmation_gets_total 4\ngraceguard_confirmation_gets_total_x 9\n";
        assert_eq!(sum(two, "graceguard_confirmation_gets_total", &[]), 7.0);
        assert_eq!(sum(two, "absent", &[]), 0.0);
        let named = "apiserver_admission_webhook_fail_open_count{name=\"a.io\",type=\"validating\"} 2\napiserver_admission_webhook_fail_open_count{name=\"b.io\",type=\"validating\"} 5\n";
        assert_eq!(
            sum(
                named,
                "apiserver_admission_webhook_fail_open_count",
                &[("name", "b.io")]
            ),
            5.0
        );
        assert_eq!(
            sum(named, "apiserver_admission_webhook_fail_open_count", &[]),
            7.0
        );
    }

    #[test]
    fn counts_by_a_label() {
        let c = counts_by(
            TEXT,
            "apiserver_request_duration_seconds",
            "subresource",
            &[("verb", "POST")],
        );
        assert_eq!(c.get(""), Some(&100.0));
    }
}
