//! What one measured configuration of a lab run produced, in a shape every consumer shares:
//! the results database, `iolab compare`, `iolab report` and sweeps.
//!
//! An experiment or a workload scenario runs one or more *configurations* (an IOMMU mode, a
//! thread count, an iodepth ...). Each becomes one [`Measurement`]: its attributes (what was
//! varied), named [`Metric`]s (what was measured), and, where the workload has them, a
//! completion-latency [`LatencyHistogram`] and the CPU time of the run broken into user,
//! system, spin and idle ([`CpuBreakdown`]).
//!
//! ```
//! use iolab_sim::metrics::{LatencyHistogram, Measurement, Metric};
//!
//! let mut lat = LatencyHistogram::new();
//! for ns in [9_000, 10_000, 11_000, 250_000] {
//!     lat.record(ns);
//! }
//! let m = Measurement::new("nvme.strict")
//!     .attr("iommu_mode", "strict")
//!     .attr("iodepth", 32)
//!     .metric(Metric::new("read.iops", "IOPS", 123_456.0))
//!     .latency(lat);
//! assert_eq!(m.attrs["iodepth"], "32");
//! assert_eq!(m.latency.as_ref().unwrap().count(), 4);
//! // Percentiles are bucket upper bounds: never below the true value, at most 1/16 above.
//! let p50 = m.latency.as_ref().unwrap().percentile(50.0);
//! assert!((10_000..=10_000 + 10_000 / 16).contains(&p50));
//! ```

pub mod protection;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::accounting::CpuTimes;
pub use protection::{exposure_metrics, protection_metrics};

/// One named, measured quantity.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Metric {
    /// Dotted name, stable across runs so runs can be compared: `read.iops`,
    /// `read.bw_bytes_per_s`, `read.clat_mean_ns`, `cpu.sys_pct`, `bonnie.out_block_kps` ...
    pub name: String,
    /// Unit as printed: `IOPS`, `B/s`, `ns`, `%`, `K/sec`, `jobs/min`, `Mb/s` ...
    pub unit: String,
    /// The value.
    pub value: f64,
}

impl Metric {
    /// A metric.
    pub fn new(name: impl Into<String>, unit: impl Into<String>, value: f64) -> Self {
        Self {
            name: name.into(),
            unit: unit.into(),
            value,
        }
    }
}

/// CPU time of a configuration, summed over the CPUs it used, in virtual nanoseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpuBreakdown {
    /// User time.
    pub user_ns: u64,
    /// System (kernel) time, spinning excluded.
    pub system_ns: u64,
    /// Time spent spinning on locks.
    pub spin_ns: u64,
    /// Idle time.
    pub idle_ns: u64,
}

impl CpuBreakdown {
    /// The difference `after - before` of two accounting snapshots (per-account, saturating).
    pub fn between(before: &CpuTimes, after: &CpuTimes) -> Self {
        Self {
            user_ns: after.user.saturating_sub(before.user),
            system_ns: after.system.saturating_sub(before.system),
            spin_ns: after.spin.saturating_sub(before.spin),
            idle_ns: after.idle.saturating_sub(before.idle),
        }
    }

    /// All time: user + system + spin + idle.
    pub fn total_ns(&self) -> u64 {
        self.user_ns + self.system_ns + self.spin_ns + self.idle_ns
    }
}

impl From<CpuTimes> for CpuBreakdown {
    fn from(t: CpuTimes) -> Self {
        Self {
            user_ns: t.user,
            system_ns: t.system,
            spin_ns: t.spin,
            idle_ns: t.idle,
        }
    }
}

/// Sub-buckets per power of two: relative bucket width 1/16 (6.25%).
const SUB_BUCKET_BITS: u32 = 4;
const SUB_BUCKETS: u64 = 1 << SUB_BUCKET_BITS;

/// A log-linear histogram of latencies in nanoseconds (the HdrHistogram idea at fixed
/// precision): values below 16 ns have a bucket each; above, every power of two is split into
/// 16 equal buckets, so a bucket's width is at most 1/16 of its lower bound. Only non-empty
/// buckets are stored, which keeps it small in the results database.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LatencyHistogram {
    /// `(bucket upper bound in ns (inclusive), count)`, in increasing order of bound.
    pub buckets: Vec<(u64, u64)>,
}

/// Index and inclusive upper bound of the bucket holding `v`.
fn bucket_of(v: u64) -> (u64, u64) {
    if v < SUB_BUCKETS {
        return (v, v);
    }
    let exp = 63 - v.leading_zeros(); // v in [2^exp, 2^(exp+1))
    let shift = exp - SUB_BUCKET_BITS;
    let sub = (v >> shift) - SUB_BUCKETS; // 0..16
    let index = SUB_BUCKETS + u64::from(exp - SUB_BUCKET_BITS) * SUB_BUCKETS + sub;
    let lower = (SUB_BUCKETS + sub) << shift;
    let upper = lower + ((1u64 << shift) - 1);
    (index, upper)
}

impl LatencyHistogram {
    /// An empty histogram.
    pub fn new() -> Self {
        Self::default()
    }

    /// A histogram of `samples`.
    pub fn from_samples(samples: &[u64]) -> Self {
        let mut counts: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
        for &v in samples {
            let (i, upper) = bucket_of(v);
            counts.entry(i).or_insert((upper, 0)).1 += 1;
        }
        Self {
            buckets: counts.into_values().collect(),
        }
    }

    /// Records one latency.
    pub fn record(&mut self, ns: u64) {
        let (_, upper) = bucket_of(ns);
        match self.buckets.binary_search_by_key(&upper, |&(u, _)| u) {
            Ok(i) => self.buckets[i].1 += 1,
            Err(i) => self.buckets.insert(i, (upper, 1)),
        }
    }

    /// Adds every sample of `other`.
    pub fn merge(&mut self, other: &LatencyHistogram) {
        for &(upper, n) in &other.buckets {
            match self.buckets.binary_search_by_key(&upper, |&(u, _)| u) {
                Ok(i) => self.buckets[i].1 += n,
                Err(i) => self.buckets.insert(i, (upper, n)),
            }
        }
    }

    /// Number of samples.
    pub fn count(&self) -> u64 {
        self.buckets.iter().map(|&(_, n)| n).sum()
    }

    /// The `p`th percentile (0..=100), as the upper bound of the bucket that holds it
    /// (fio's rank rule: the smallest value with at least `p`% of samples at or below it);
    /// 0 for an empty histogram.
    pub fn percentile(&self, p: f64) -> u64 {
        let total = self.count();
        if total == 0 {
            return 0;
        }
        let rank = ((p.clamp(0.0, 100.0) / 100.0) * total as f64)
            .ceil()
            .max(1.0) as u64;
        let mut seen = 0;
        for &(upper, n) in &self.buckets {
            seen += n;
            if seen >= rank {
                return upper;
            }
        }
        self.buckets.last().map_or(0, |&(u, _)| u)
    }

    /// The cumulative distribution: `(latency upper bound ns, fraction of samples <= it)`,
    /// one point per non-empty bucket, ending at 1.0.
    pub fn cdf(&self) -> Vec<(u64, f64)> {
        let total = self.count();
        if total == 0 {
            return Vec::new();
        }
        let mut seen = 0;
        self.buckets
            .iter()
            .map(|&(upper, n)| {
                seen += n;
                (upper, seen as f64 / total as f64)
            })
            .collect()
    }
}

/// One measured configuration of a run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Measurement {
    /// Identifier unique within the run, stable across runs of the same scenario, e.g.
    /// `d05_nvme.lockfree` or `superspeed.iommu_on`.
    pub config: String,
    /// What distinguishes this configuration: `iommu_mode` (`off`, `passthrough`, `strict`,
    /// `lazy`, `ddw-dynamic` ...), `workload` (`fio`, `bonnie`, `reaim`, `netperf`),
    /// `threads`, `iodepth`, `bs`, `device` ... Values as text; numbers in decimal.
    pub attrs: BTreeMap<String, String>,
    /// What was measured.
    pub metrics: Vec<Metric>,
    /// Completion latencies, where the workload measures them.
    pub latency: Option<LatencyHistogram>,
    /// CPU time of the configuration's CPUs over its measured window.
    pub cpu: Option<CpuBreakdown>,
}

impl Measurement {
    /// A measurement of configuration `config` with nothing in it yet.
    pub fn new(config: impl Into<String>) -> Self {
        Self {
            config: config.into(),
            ..Self::default()
        }
    }

    /// Adds (or replaces) an attribute.
    pub fn attr(mut self, key: impl Into<String>, value: impl ToString) -> Self {
        self.attrs.insert(key.into(), value.to_string());
        self
    }

    /// Adds a metric.
    pub fn metric(mut self, m: Metric) -> Self {
        self.metrics.push(m);
        self
    }

    /// Adds a metric per `(name, unit, value)`, in order.
    pub fn metrics(self, list: &[(&str, &str, f64)]) -> Self {
        list.iter().fold(self, |m, &(name, unit, v)| {
            m.metric(Metric::new(name, unit, v))
        })
    }

    /// Sets the latency histogram.
    pub fn latency(mut self, h: LatencyHistogram) -> Self {
        self.latency = Some(h);
        self
    }

    /// Sets the CPU breakdown.
    pub fn cpu(mut self, c: CpuBreakdown) -> Self {
        self.cpu = Some(c);
        self
    }

    /// The metric called `name`, if present.
    pub fn get(&self, name: &str) -> Option<&Metric> {
        self.metrics.iter().find(|m| m.name == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_values_have_exact_buckets() {
        for v in 0..16 {
            assert_eq!(bucket_of(v), (v, v));
        }
    }

    #[test]
    fn buckets_are_contiguous_and_within_one_sixteenth() {
        let mut prev_upper = 15;
        let mut prev_index = 15;
        let mut v = 16u64;
        while v < 1 << 40 {
            let (i, upper) = bucket_of(v);
            assert_eq!(i, prev_index + 1, "index after {prev_upper}");
            assert_eq!(v, prev_upper + 1, "bucket starts right after the previous");
            assert!(upper >= v);
            assert!(
                (upper - v) * 16 < v,
                "width of bucket at {v} is {}",
                upper - v + 1
            );
            assert_eq!(bucket_of(upper).0, i);
            prev_upper = upper;
            prev_index = i;
            v = upper + 1;
        }
    }

    #[test]
    fn percentiles_bound_the_exact_ones() {
        let samples: Vec<u64> = (1..=10_000u64).map(|i| i * 37 % 100_003 + 500).collect();
        let h = LatencyHistogram::from_samples(&samples);
        let mut sorted = samples.clone();
        sorted.sort_unstable();
        for p in [1.0, 50.0, 90.0, 99.0, 99.99, 100.0] {
            let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
            let exact = sorted[rank.clamp(1, sorted.len()) - 1];
            let got = h.percentile(p);
            assert!(
                got >= exact && got - exact <= exact / 16,
                "p{p}: {got} vs {exact}"
            );
        }
        assert_eq!(h.count(), 10_000);
    }

    #[test]
    fn record_and_merge_agree_with_from_samples() {
        let a = [5u64, 17, 17, 1000, 1 << 30];
        let b = [17u64, 999, 3];
        let mut h = LatencyHistogram::from_samples(&a);
        h.merge(&LatencyHistogram::from_samples(&b));
        let mut r = LatencyHistogram::new();
        for v in a.iter().chain(&b) {
            r.record(*v);
        }
        let all: Vec<u64> = a.iter().chain(&b).copied().collect();
        assert_eq!(h, LatencyHistogram::from_samples(&all));
        assert_eq!(r, h);
        let cdf = h.cdf();
        assert_eq!(cdf.last().unwrap().1, 1.0);
        assert!(cdf.windows(2).all(|w| w[0].0 < w[1].0 && w[0].1 < w[1].1));
    }

    #[test]
    fn empty_histogram() {
        let h = LatencyHistogram::new();
        assert_eq!(h.percentile(99.0), 0);
        assert!(h.cdf().is_empty());
    }

    #[test]
    fn cpu_breakdown_between_snapshots() {
        let a = CpuTimes {
            user: 10,
            system: 20,
            spin: 5,
            idle: 65,
        };
        let b = CpuTimes {
            user: 30,
            system: 50,
            spin: 5,
            idle: 115,
        };
        let d = CpuBreakdown::between(&a, &b);
        assert_eq!(
            (d.user_ns, d.system_ns, d.spin_ns, d.idle_ns),
            (20, 30, 0, 50)
        );
        assert_eq!(d.total_ns(), 100);
    }
}
