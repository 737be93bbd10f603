//! Remote storage counters for `stats.json`: lock-free atomics and a log-linear latency
//! histogram (8 sub-buckets per power of two: quantiles within 12.5%).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

const SUB: usize = 8;
const BUCKETS: usize = 16 + 40 * SUB;

pub(crate) struct Histogram {
    counts: Vec<AtomicU64>,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            counts: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
        }
    }
}

fn index(us: u64) -> usize {
    if us < 16 {
        return us as usize;
    }
    let e = 63 - us.leading_zeros() as usize; // >= 4
    let sub = ((us >> (e - 3)) & 7) as usize;
    (16 + (e - 4) * SUB + sub).min(BUCKETS - 1)
}

/// The upper bound of a bucket, in microseconds.
fn upper(i: usize) -> u64 {
    if i < 16 {
        return i as u64;
    }
    let e = (i - 16) / SUB + 4;
    let sub = ((i - 16) % SUB) as u64;
    ((8 + sub + 1) << (e - 3)) - 1
}

impl Histogram {
    pub(crate) fn record(&self, d: Duration) {
        self.counts[index(d.as_micros() as u64)].fetch_add(1, Relaxed);
    }
    /// The q-quantile (0..=1), as the upper bound of its bucket.
    pub(crate) fn quantile(&self, q: f64) -> Option<Duration> {
        let snap: Vec<u64> = self.counts.iter().map(|c| c.load(Relaxed)).collect();
        let total: u64 = snap.iter().sum();
        if total == 0 {
            return None;
        }
        let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
        let mut acc = 0;
        for (i, c) in snap.iter().enumerate() {
            acc += c;
            if acc >= rank {
                return Some(Duration::from_micros(upper(i)));
            }
        }
        None
    }
}

/// What the storage layer counts. `requests` are logical range requests (after coalescing);
/// `attempts` are HTTP requests sent (so retries = attempts - requests, counted exactly by the
/// connector wrapper); `bytes` are payload bytes delivered to callers.
#[derive(Default)]
pub(crate) struct Stats {
    pub requests: AtomicU64,
    pub attempts: AtomicU64,
    pub bytes: AtomicU64,
    pub errors: AtomicU64,
    pub deadline_exceeded: AtomicU64,
    pub replaced: AtomicU64,
    pub status_5xx: AtomicU64,
    pub status_503: AtomicU64,
    pub transport_errors: AtomicU64,
    pub inflight: AtomicU64,
    pub max_inflight: AtomicU64,
    /// Logical request latency (first byte sent to last byte copied, retries included).
    pub latency: Histogram,
    /// Per-attempt latency to response headers.
    pub attempt_latency: Histogram,
}

impl std::fmt::Debug for Stats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Stats({:?})", self.json())
    }
}

impl Stats {
    pub(crate) fn retries(&self) -> u64 {
        self.attempts
            .load(Relaxed)
            .saturating_sub(self.requests.load(Relaxed))
    }
    /// The counters as `stats.json`'s `remote` (`None` before the first request).
    pub(crate) fn json(&self) -> Option<serde_json::Value> {
        if self.requests.load(Relaxed) == 0 {
            return None;
        }
        // Milliseconds to the microsecond (no float noise such as 5.119000000000001).
        let ms = |d: Option<Duration>| d.map(|d| d.as_micros() as f64 / 1e3);
        Some(serde_json::json!({
            "requests": self.requests.load(Relaxed),
            "attempts": self.attempts.load(Relaxed),
            "retries": self.retries(),
            "bytes": self.bytes.load(Relaxed),
            "errors": self.errors.load(Relaxed),
            "deadline_exceeded": self.deadline_exceeded.load(Relaxed),
            "replaced": self.replaced.load(Relaxed),
            "status_5xx": self.status_5xx.load(Relaxed),
            "status_503": self.status_503.load(Relaxed),
            "transport_errors": self.transport_errors.load(Relaxed),
            "max_inflight": self.max_inflight.load(Relaxed),
            "latency_ms_p50": ms(self.latency.quantile(0.5)),
            "latency_ms_p99": ms(self.latency.quantile(0.99)),
            "attempt_latency_ms_p50": ms(self.attempt_latency.quantile(0.5)),
            "attempt_latency_ms_p99": ms(self.attempt_latency.quantile(0.99)),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_monotonic_and_bound_their_values() {
        let mut prev = 0;
        for i in 0..BUCKETS - 1 {
            assert!(upper(i) >= prev);
            prev = upper(i);
        }
        for v in [0u64, 1, 15, 16, 17, 100, 1000, 20_000, 50_000, 1 << 30] {
            let i = index(v);
            assert!(upper(i) >= v, "{v} {i} {}", upper(i));
            assert!(
                upper(i) as f64 <= v as f64 * 1.125 + 1.0,
                "{v} {}",
                upper(i)
            );
        }
    }

    #[test]
    fn quantiles() {
        let h = Histogram::default();
        for ms in 1..=100 {
            h.record(Duration::from_millis(ms));
        }
        let p50 = h.quantile(0.5).unwrap().as_millis();
        let p99 = h.quantile(0.99).unwrap().as_millis();
        assert!((50..=57).contains(&p50), "{p50}");
        assert!((99..=112).contains(&p99), "{p99}");
    }
}
