//! The protection report's metrics (`protection.*`, `faults.*`), shared by the lab and the
//! published experiments: what a DMA path left a device able to reach, as named metrics of
//! a [`Measurement`].

use iolab_iommu::dma::ProtectionStats;

use super::Measurement;

/// Adds the protection report's metrics (`protection.*`, `faults.*`) to `m`.
/// `max_reachable_ns` is the stack's figure, or the run length where nothing translates.
pub fn protection_metrics(
    m: Measurement,
    p: &ProtectionStats,
    max_reachable_ns: u64,
) -> Measurement {
    let m = counts(m, &[("protection.stale_hits", "count", p.stale_hits)]);
    exposure_metrics(m, p, max_reachable_ns)
}

/// `m` with a metric per `(name, unit, count)`, in order.
pub(crate) fn counts(m: Measurement, list: &[(&str, &str, u64)]) -> Measurement {
    let values: Vec<(&str, &str, f64)> = list.iter().map(|&(n, u, v)| (n, u, v as f64)).collect();
    m.metrics(&values)
}

/// The protection report's metrics but the stale-hit count, for a model with no device-side
/// cache to observe stale hits in: the reachable window (`max_reachable_ns`), sub-page
/// exposure, bypassed accesses and faults.
pub fn exposure_metrics(m: Measurement, p: &ProtectionStats, max_reachable_ns: u64) -> Measurement {
    counts(
        m,
        &[
            (
                "protection.max_reachable_after_unmap_ns",
                "ns",
                max_reachable_ns,
            ),
            (
                "protection.subpage_exposed_bytes",
                "B",
                p.subpage_exposed_bytes,
            ),
            (
                "protection.max_subpage_exposed_bytes",
                "B",
                p.max_subpage_exposed_bytes,
            ),
            ("protection.bypass_accesses", "count", p.bypass_accesses),
            ("faults.translation", "count", p.translation_faults),
            ("faults.permission", "count", p.permission_faults),
        ],
    )
}
