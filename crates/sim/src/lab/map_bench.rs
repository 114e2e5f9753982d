//! The kernel's DMA-mapping benchmark (`kernel/dma/map_benchmark.c` and its tool,
//! `tools/testing/selftests/dma/dma_map_benchmark`) as a lab workload: how kernel engineers
//! measure the command queue's and the IOVA allocator's contention.
//!
//! The module binds to one device; each of `threads` kernel threads (thread `i` on CPU `i`)
//! loops until it is stopped: write the buffer unless the direction is `FROM_DEVICE` (a
//! `memset` of `granule` pages), `dma_map_single` timed, a busy delay of `dma_trans_ns`
//! ("pretend DMA is transmitting"), `dma_unmap_single` timed, then five atomic additions
//! to the shared sums. Each latency is counted in whole 100 ns units (truncated), and the
//! result is the integer mean and the integer square root of the variance of those units,
//! which the tool prints in microseconds with one decimal. The lab does the same, on the
//! same stack the fio path uses (its map and unmap costs, the IOVA tree's and the flush
//! queues' engine locks, the SMMUv3 command queue), and also keeps the exact means.

use std::cell::RefCell;
use std::fmt::Write as _;
use std::rc::Rc;

use crate::accounting::Account;
use crate::engine::{Ctx, Sim, SimConfig, SimDuration, SimTime};
use crate::metrics::{CpuBreakdown, Measurement, Metric};
use crate::resources::CacheLine;

use super::block::{lock_window, start_stack, sum_cpus, DmaCounters, Stack};
use super::iommu::LabProtection;
use super::spec::{DmaMapBenchmarkSetup, LabScenario, MapDirection, BUFFER_BASE};
use super::LabError;

/// The sums the module's threads add to, as the module keeps them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct MapBenchSums {
    /// Completed map/unmap iterations (`loops`).
    pub loops: u64,
    /// Map latencies in whole 100 ns units, and their squares.
    pub map_100ns: u64,
    pub map_sq: u64,
    /// Unmap latencies likewise.
    pub unmap_100ns: u64,
    pub unmap_sq: u64,
    /// Exact sums, ns (the lab's own figures).
    pub map_ns: u64,
    pub unmap_ns: u64,
}

impl MapBenchSums {
    /// Adds one iteration's latencies, ns.
    fn add(&mut self, map_ns: u64, unmap_ns: u64) {
        let (m, u) = (map_ns / 100, unmap_ns / 100);
        self.loops += 1;
        self.map_100ns += m;
        self.map_sq += m * m;
        self.unmap_100ns += u;
        self.unmap_sq += u * u;
        self.map_ns += map_ns;
        self.unmap_ns += unmap_ns;
    }

    /// The module's figures in 100 ns units: (mean, standard deviation) of map and unmap,
    /// by its integer arithmetic (`div64_u64`, `int_sqrt64`).
    pub(crate) fn module_figures(&self) -> [(u64, u64); 2] {
        if self.loops == 0 {
            return [(0, 0); 2];
        }
        let stat = |sum: u64, sq: u64| {
            let avg = sum / self.loops;
            let variance = (sq / self.loops).saturating_sub(avg * avg);
            (avg, int_sqrt(variance))
        };
        [
            stat(self.map_100ns, self.map_sq),
            stat(self.unmap_100ns, self.unmap_sq),
        ]
    }
}

/// The integer square root (the largest `r` with `r * r <= n`), as the kernel's
/// `int_sqrt64`.
fn int_sqrt(n: u64) -> u64 {
    let mut r = (n as f64).sqrt() as u64;
    while r.checked_mul(r).map_or(true, |sq| sq > n) {
        r -= 1;
    }
    while (r + 1).checked_mul(r + 1).is_some_and(|sq| sq <= n) {
        r += 1;
    }
    r
}

/// What every benchmark thread shares.
struct Shared {
    stack: Rc<Stack>,
    setup: DmaMapBenchmarkSetup,
    /// The cache line of the module's atomic sums.
    sums_line: CacheLine,
    sums: RefCell<MapBenchSums>,
    /// When `kthread_stop` comes (the threads finish the iteration they are in).
    end: SimTime,
    /// The `memset` of one buffer, ns.
    memset_ns: u64,
    /// An atomic on a line this CPU holds, ns.
    atomic_ns: u64,
}

/// One benchmark run.
pub(crate) struct MapBenchRun {
    /// The module's sums.
    pub sums: MapBenchSums,
    /// The DMA path's counters.
    pub dma: DmaCounters,
    /// CPU time of all CPUs over the run.
    pub cpu: CpuBreakdown,
    /// The IOVA tree's lock: (acquisitions, contended).
    pub tree_lock: (u64, u64),
    /// The command queue's statistics, if the path has one.
    pub cmdq: Option<crate::iommu::cmdq::CmdqStats>,
    /// The protection report over the run.
    pub protection: LabProtection,
}

/// One benchmark thread: the module's loop, until `end`.
async fn thread_loop(ctx: Ctx, sh: Rc<Shared>, index: u64) {
    let (stack, b) = (&sh.stack, &sh.setup);
    let len = u64::from(b.granule) * 4096;
    let pa = BUFFER_BASE + index * len;
    let dir = match b.dir {
        MapDirection::Bidirectional => iolab_iommu::dma::Direction::Bidirectional,
        MapDirection::ToDevice => iolab_iommu::dma::Direction::ToDevice,
        MapDirection::FromDevice => iolab_iommu::dma::Direction::FromDevice,
    };
    while ctx.now() < sh.end {
        if b.dir != MapDirection::FromDevice {
            ctx.cpu()
                .spend(SimDuration::ns(sh.memset_ns), Account::System)
                .await;
        }
        let t0 = ctx.now();
        let Ok(buf) = stack.map_single_timed(&ctx, pa, len, dir).await else {
            return; // The stack recorded the error; the run reports it.
        };
        let map_ns = (ctx.now() - t0).as_ns();
        if b.dma_trans_ns > 0 {
            ctx.cpu()
                .spend(SimDuration::ns(b.dma_trans_ns), Account::System)
                .await;
        }
        let t2 = ctx.now();
        if stack.unmap_single_timed(&ctx, buf).await.is_err() {
            return;
        }
        let unmap_ns = (ctx.now() - t2).as_ns();
        // atomic64_add x 4 and atomic64_inc on the shared sums, five adjacent 8-byte
        // counters of one line: the first atomic takes the line, the other four are issued
        // back to back and find it in this CPU's cache.
        sh.sums_line.rmw(&ctx, Account::System).await;
        ctx.cpu()
            .spend(SimDuration::ns(4 * sh.atomic_ns), Account::System)
            .await;
        sh.sums.borrow_mut().add(map_ns, unmap_ns);
    }
}

/// Runs the benchmark of `s` once with `seed`.
pub(crate) fn run(
    s: &LabScenario,
    b: &DmaMapBenchmarkSetup,
    seed: u64,
) -> Result<MapBenchRun, LabError> {
    let mut sim = Sim::for_machine(SimConfig { cpus: s.cpus, seed }, &s.profile)?;
    let len = u64::from(b.granule) * 4096;
    let (stack, _irq_cpus) = start_stack(s, &mut sim, seed, b.threads as usize + 1, 1, len)?;
    let h = sim.handle().clone();
    let line = s.profile.line_params();
    // memset of the buffer at the platform's copy bandwidth (GB/s = bytes per ns).
    let bytes_per_ns = s.profile.memory.memcpy_bandwidth.gb_per_s.max(1e-9);
    let end = SimTime::ZERO + SimDuration::ns(b.runtime_ns);
    let shared = Rc::new(Shared {
        stack: stack.clone(),
        setup: b.clone(),
        sums_line: CacheLine::new(&h, "map_benchmark_sums", line)?,
        sums: RefCell::new(MapBenchSums::default()),
        end,
        memset_ns: (len as f64 / bytes_per_ns).round() as u64,
        atomic_ns: line.base_ns,
    });
    for i in 0..b.threads as usize {
        let sh = shared.clone();
        sim.spawn_on(i % s.cpus, move |ctx| thread_loop(ctx, sh, i as u64))?;
    }
    let before = sim.report();
    let after = sim.run_until_observed(end, end)?;
    let end_ns = sim.run()?.end.as_ns();
    if let Some(e) = stack.error.borrow().clone() {
        return Err(LabError::Model(e));
    }
    let sums = *shared.sums.borrow();
    let dma = *stack.counters.borrow();
    Ok(MapBenchRun {
        sums,
        dma,
        cpu: CpuBreakdown::between(&sum_cpus(&before), &sum_cpus(&after)),
        tree_lock: lock_window(&before, &after, "iova_tree_lock"),
        cmdq: stack.cmdq_stats(),
        protection: stack.protection(end_ns),
    })
}

/// The tool's three lines (`dma mapping benchmark: ...`, the map and unmap averages).
pub(crate) fn tool_text(b: &DmaMapBenchmarkSetup, sums: &MapBenchSums) -> String {
    let [(map_avg, map_sd), (unmap_avg, unmap_sd)] = sums.module_figures();
    let secs = b.runtime_ns as f64 / 1e9;
    let seconds = if b.runtime_ns % 1_000_000_000 == 0 {
        format!("{}", b.runtime_ns / 1_000_000_000)
    } else {
        format!("{secs}")
    };
    let mut out = String::new();
    let _ = writeln!(
        out,
        "dma mapping benchmark: threads:{} seconds:{seconds} node:-1 dir:{} granule: {}",
        b.threads,
        b.dir.tool_name(),
        b.granule
    );
    let _ = writeln!(
        out,
        "average map latency(us):{:.1} standard deviation:{:.1}",
        map_avg as f64 / 10.0,
        map_sd as f64 / 10.0
    );
    let _ = writeln!(
        out,
        "average unmap latency(us):{:.1} standard deviation:{:.1}",
        unmap_avg as f64 / 10.0,
        unmap_sd as f64 / 10.0
    );
    out
}

/// The benchmark's metrics: the tool's four figures (us), the exact means (ns), the loops
/// and the map+unmap pairs per thread per second.
pub(crate) fn metrics(
    m: Measurement,
    b: &DmaMapBenchmarkSetup,
    sums: &MapBenchSums,
) -> Measurement {
    let [(map_avg, map_sd), (unmap_avg, unmap_sd)] = sums.module_figures();
    let exact = |total: u64| {
        if sums.loops == 0 {
            0.0
        } else {
            total as f64 / sums.loops as f64
        }
    };
    m.metric(Metric::new(
        "map_benchmark.map_us",
        "us",
        map_avg as f64 / 10.0,
    ))
    .metric(Metric::new(
        "map_benchmark.map_stddev_us",
        "us",
        map_sd as f64 / 10.0,
    ))
    .metric(Metric::new(
        "map_benchmark.unmap_us",
        "us",
        unmap_avg as f64 / 10.0,
    ))
    .metric(Metric::new(
        "map_benchmark.unmap_stddev_us",
        "us",
        unmap_sd as f64 / 10.0,
    ))
    .metric(Metric::new(
        "map_benchmark.map_mean_ns",
        "ns",
        exact(sums.map_ns),
    ))
    .metric(Metric::new(
        "map_benchmark.unmap_mean_ns",
        "ns",
        exact(sums.unmap_ns),
    ))
    .metric(Metric::new(
        "map_benchmark.loops",
        "count",
        sums.loops as f64,
    ))
    .metric(Metric::new(
        "map_benchmark.pairs_per_thread_per_s",
        "1/s",
        sums.loops as f64 / (b.runtime_ns as f64 / 1e9) / f64::from(b.threads.max(1)),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_module_counts_whole_100ns_units_and_takes_integer_statistics() {
        let mut s = MapBenchSums::default();
        // 1,050 ns and 1,999 ns count as 10 and 19 units; 99 ns as none.
        s.add(1_050, 99);
        s.add(1_999, 99);
        s.add(1_000, 300);
        // Map units 10, 19, 10: mean 39 / 3 = 13; squares 100 + 361 + 100 = 561,
        // 561 / 3 = 187, variance 187 - 169 = 18, isqrt 4.
        // Unmap units 0, 0, 3: mean 1; squares 9 / 3 = 3, variance 2, isqrt 1.
        assert_eq!(s.module_figures(), [(13, 4), (1, 1)]);
        assert_eq!(s.loops, 3);
        assert_eq!(s.map_ns, 4_049);
    }

    #[test]
    fn the_integer_square_root_rounds_down() {
        for (n, r) in [
            (0, 0),
            (1, 1),
            (3, 1),
            (4, 2),
            (18, 4),
            (u64::MAX, 4_294_967_295),
        ] {
            assert_eq!(int_sqrt(n), r, "{n}");
        }
    }

    #[test]
    fn no_loops_gives_zeros() {
        assert_eq!(MapBenchSums::default().module_figures(), [(0, 0); 2]);
    }
}
