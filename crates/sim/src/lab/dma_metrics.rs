//! The DMA-path metrics that several lab workloads report under the same names (fio,
//! dma_map_benchmark): invalidation counts, the IOVA tree lock, the command queue, the
//! IOMMU's IOTLB and CPU shares. One list per concept, so a name means one thing in every
//! workload that reports it (docs/SCENARIOS.md lists them).

use crate::iommu::cmdq::CmdqStats;
use crate::metrics::CpuBreakdown;
use crate::metrics::{Measurement, Metric};

use super::block::DmaCounters;
use super::per;

/// `dma.inval_syncs` and `dma.flush_queue_flushes`.
pub(super) fn invalidations(m: Measurement, d: &DmaCounters) -> Measurement {
    m.metrics(&[
        ("dma.inval_syncs", "count", d.inval_syncs as f64),
        (
            "dma.flush_queue_flushes",
            "count",
            d.flush_queue_flushes as f64,
        ),
    ])
}

/// `lock.iova_tree.acquisitions` and `.contended`, from `(acquisitions, contended)`.
pub(super) fn iova_tree_lock(m: Measurement, (acquisitions, contended): (u64, u64)) -> Measurement {
    m.metrics(&[
        ("lock.iova_tree.acquisitions", "count", acquisitions as f64),
        ("lock.iova_tree.contended", "count", contended as f64),
    ])
}

/// `lock.iova_depot.acquisitions` and `.contended`, from `(acquisitions, contended)`.
pub(super) fn iova_depot_lock(
    m: Measurement,
    (acquisitions, contended): (u64, u64),
) -> Measurement {
    m.metrics(&[
        ("lock.iova_depot.acquisitions", "count", acquisitions as f64),
        ("lock.iova_depot.contended", "count", contended as f64),
    ])
}

/// `{prefix}.commands` and `{prefix}.sync_wait_ns` (mean wait per issue) of one command
/// queue (`prefix` is `cmdq`, or `cmdq.instance{k}` for one of several instances).
pub(super) fn cmdq_core(m: Measurement, prefix: &str, q: &CmdqStats) -> Measurement {
    m.metric(Metric::new(
        format!("{prefix}.commands"),
        "count",
        q.commands as f64,
    ))
    .metric(Metric::new(
        format!("{prefix}.sync_wait_ns"),
        "ns",
        per(q.sync_wait_ns as f64, q.issues),
    ))
}

/// The lock-free queue's slot reservations: `cmdq.cas_attempts`, `cmdq.cas_failures` and
/// `cmdq.cas_success_rate` (successful attempts per attempt; 1 with none made).
pub(super) fn cmdq_reservations(m: Measurement, q: &CmdqStats) -> Measurement {
    m.metrics(&[
        ("cmdq.cas_attempts", "count", q.cas_attempts as f64),
        ("cmdq.cas_failures", "count", q.cas_failures as f64),
        (
            "cmdq.cas_success_rate",
            "ratio",
            if q.cas_attempts == 0 {
                1.0
            } else {
                (q.cas_attempts - q.cas_failures) as f64 / q.cas_attempts as f64
            },
        ),
    ])
}

/// The command queue's counters beyond [`cmdq_core`].
pub(super) fn cmdq_detail(m: Measurement, q: &CmdqStats) -> Measurement {
    m.metrics(&[
        ("cmdq.issues", "count", q.issues as f64),
        ("cmdq.consumed", "count", q.consumed as f64),
        ("cmdq.syncs", "count", q.syncs as f64),
        ("cmdq.piggybacked", "count", q.piggybacked as f64),
        ("cmdq.batches", "count", q.batches as f64),
        ("cmdq.gathered", "count", q.gathered as f64),
        ("cmdq.cas_attempts", "count", q.cas_attempts as f64),
        ("cmdq.cons_reads", "count", q.cons_reads as f64),
        ("cmdq.sync_wait_total_ns", "ns", q.sync_wait_ns as f64),
    ])
}

/// The map and unmap path, device translation and interrupts of a block workload.
pub(super) fn map_path_and_irqs(m: Measurement, d: &DmaCounters) -> Measurement {
    let m = m.metrics(&[
        ("dma.map_ns", "ns", per(d.map_ns, d.maps)),
        ("dma.unmap_ns", "ns", per(d.unmap_ns, d.unmaps)),
    ]);
    let m = invalidations(m, d);
    m.metrics(&[
        ("dma.maps", "count", d.maps as f64),
        ("dma.translation_ns", "ns", d.translation_ns),
        ("irq.interrupts", "count", d.interrupts as f64),
        ("irq.handler_runs", "count", d.irq_handler_runs as f64),
        ("irq.completions", "count", d.completions as f64),
        (
            "irq.per_io",
            "count",
            per(d.interrupts as f64, d.completions),
        ),
    ])
}

/// `dma.iova_32bit_failures`, `dma.iova_full_range_allocs` and `dma.iova_tree_retries`: how
/// the release's IOVA allocation variants (`kernel.version`) behaved. Reported only when one
/// of them happened, so runs whose 32-bit space never fills read as before.
pub(super) fn iova_variants(m: Measurement, d: &DmaCounters) -> Measurement {
    if d.iova_32bit_failures | d.iova_full_range_allocs | d.iova_tree_retries == 0 {
        return m;
    }
    m.metrics(&[
        (
            "dma.iova_32bit_failures",
            "count",
            d.iova_32bit_failures as f64,
        ),
        (
            "dma.iova_full_range_allocs",
            "count",
            d.iova_full_range_allocs as f64,
        ),
        ("dma.iova_tree_retries", "count", d.iova_tree_retries as f64),
    ])
}

/// The IOMMU's IOTLB as the device's DMA met it.
pub(super) fn iotlb(m: Measurement, d: &DmaCounters) -> Measurement {
    let pages = d.iotlb_hits + d.iotlb_misses;
    let hit_pct = if pages > 0 {
        d.iotlb_hits as f64 / pages as f64 * 100.0
    } else {
        0.0
    };
    m.metrics(&[
        ("iotlb.hit_pct", "%", hit_pct),
        (
            "iotlb.walk_reads_per_io",
            "count",
            per(d.walk_reads as f64, d.translated_ios),
        ),
        ("iotlb.stale_hits", "count", d.iotlb_stale_hits as f64),
        ("iotlb.hits", "count", d.iotlb_hits as f64),
        ("iotlb.misses", "count", d.iotlb_misses as f64),
        ("iotlb.walk_reads", "count", d.walk_reads as f64),
    ])
}

/// `cpu.all.{usr,sys,spin}_pct`: shares of all CPUs' time.
pub(super) fn cpu_shares(m: Measurement, c: &CpuBreakdown) -> Measurement {
    let total = c.total_ns().max(1) as f64;
    m.metrics(&[
        ("cpu.all.usr_pct", "%", c.user_ns as f64 / total * 100.0),
        ("cpu.all.sys_pct", "%", c.system_ns as f64 / total * 100.0),
        ("cpu.all.spin_pct", "%", c.spin_ns as f64 / total * 100.0),
    ])
}
