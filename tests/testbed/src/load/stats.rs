//! Latency percentiles.

/// Latencies in microseconds, with a count of failed requests.
#[derive(Clone, Debug, Default)]
pub struct Stats {
    pub micros: Vec<u64>,
    pub errors: u64,
    pub seconds: f64,
    /// Fixed-rate runs: requests sent more than 1 ms after their slot.
    pub late_sends: u64,
}

impl Stats {
    pub fn merge(&mut self, other: Stats) {
        self.micros.extend(other.micros);
        self.errors += other.errors;
        self.late_sends += other.late_sends;
    }

    /// Successful requests per second.
    pub fn rps(&self) -> f64 {
        if self.seconds <= 0.0 {
            return 0.0;
        }
        self.micros.len() as f64 / self.seconds
    }

    /// The `p`-th percentile (0..=100) in microseconds (nearest rank).
    pub fn percentile(&mut self, p: f64) -> u64 {
        if self.micros.is_empty() {
            return 0;
        }
        self.micros.sort_unstable();
        let rank = ((p / 100.0) * self.micros.len() as f64).ceil() as usize;
        self.micros[rank.clamp(1, self.micros.len()) - 1]
    }
}

/// The `p`-th percentile of `v` (sorted here), nearest rank.
pub fn percentile_f64(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

/// `x` to three decimals, as the JSON rows carry figures.
pub fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let mut s = Stats {
            micros: (1..=100).rev().collect(),
            ..Default::default()
        };
        assert_eq!(s.percentile(50.0), 50);
        assert_eq!(s.percentile(99.0), 99);
        assert_eq!(s.percentile(99.9), 100);
        assert_eq!(s.percentile(0.0), 1);
        let mut v = vec![3.0, 1.0, 2.0];
        assert_eq!(percentile_f64(&mut v, 50.0), 2.0);
    }
}
