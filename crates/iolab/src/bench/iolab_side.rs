//! The iolab side of each benchmark, on the stack's concrete types.
//!
//! Timing and work counting are separate passes: the timed pass reports the median ns per
//! operation, and a fixed-length untimed pass on a fresh instance counts the exact work per
//! operation (deterministic, so the figures are the same on every machine).

use std::sync::Arc;

use iolab_iommu::addr::{Access, DmaAddr, Iova, PhysAddr, Prot, SZ_4K};
use iolab_iommu::dma::invalidate::ImmediateInvalidator;
use iolab_iommu::dma::{Device, Direction, Domain, DomainConfig, DomainId, DomainMode};
use iolab_iommu::iotlb::{Asid, Iotlb, IotlbConfig};
use iolab_iommu::iova::gaptree::GapTreeAllocator;
use iolab_iommu::iova::linux::{IovaSpaceConfig, LinuxIovaAllocator};
use iolab_iommu::iova::magazine::{MagazineCache, MagazineConfig};
use iolab_iommu::iova::{AllocRequest, IovaAllocator, IovaBlock};
use iolab_iommu::pgtable::lpae::{LpaeConfig, LpaeTable};
use iolab_iommu::pgtable::sba_pdir::{SbaConfig, SbaPdir};
use iolab_iommu::pgtable::tce::{TceConfig, TceTable};
use iolab_iommu::pgtable::{IoPageTable, UnmapGather};
use iolab_iommu::smmuv3::cmdq::ProducerKind;
use iolab_iommu::smmuv3::{CmdqConfig, Command, NullSink};
use iolab_iommu::work::{LockId, WorkRecord};

use super::harness::{churn_op, median_ns_per_op, median_ns_per_op_interleaved, Op, Sampling};
use super::peers::{PAGE, SPACE_END};

/// `(implementation, ns/op, exact work per op)`.
pub type Figure = (&'static str, f64, Vec<(String, f64)>);

/// `(implementation, threads, ns/op per thread, work per op)`.
pub type ThreadedFigure = (&'static str, usize, f64, Vec<(String, f64)>);

/// Operations in the untimed pass that counts work per operation.
const WORK_PASS_OPS: u64 = 10_000;

/// `(allocator, churn operation, exact work per op)`: see [`iova_churn_ops`].
type ChurnRow = (&'static str, Op<'static>, Vec<(String, f64)>);

/// A named constructor of a fresh instance.
type Maker<T> = (&'static str, Box<dyn Fn() -> T>);

fn allocators() -> Vec<Maker<Arc<dyn IovaAllocator>>> {
    let space = || IovaSpaceConfig::new(PAGE, Iova::new(SPACE_END));
    vec![
        (
            "linux",
            Box::new(move || Arc::new(LinuxIovaAllocator::new(space()).expect("valid"))),
        ),
        (
            "magazine",
            Box::new(move || {
                let inner = LinuxIovaAllocator::new(space()).expect("valid");
                let config = MagazineConfig {
                    max_live: 1 << 20,
                    ..MagazineConfig::new(1)
                };
                Arc::new(MagazineCache::new(inner, config).expect("valid"))
            }),
        ),
        (
            "gaptree",
            Box::new(move || Arc::new(GapTreeAllocator::new(space()).expect("valid"))),
        ),
    ]
}

fn alloc_one(a: &dyn IovaAllocator, pages: u64, work: &mut WorkRecord) -> IovaBlock {
    a.alloc(AllocRequest::new(pages, Iova::new(SPACE_END), 0), work)
        .expect("benchmark space is large enough")
}

/// Allocator churn (see `harness::churn_op`) for each iolab allocator whose name `keep`
/// accepts, their samples taken in turn with those of the churn operations `peers` makes
/// (`bench` passes the peer crates'; made only when an iolab allocator runs). Returns the
/// iolab figures and the peers' ns per op, in order.
pub fn iova_alloc_free(
    live: usize,
    sampling: &Sampling,
    keep: &dyn Fn(&str) -> bool,
    peers: impl FnOnce() -> Vec<Op<'static>>,
) -> (Vec<Figure>, Vec<f64>) {
    let (meta, mut ops): (Vec<_>, Vec<_>) = iova_churn_ops(live, keep)
        .into_iter()
        .map(|(name, op, work)| ((name, work), op))
        .unzip();
    if meta.is_empty() {
        return (Vec::new(), Vec::new());
    }
    ops.extend(peers());
    let mut ns = median_ns_per_op_interleaved(sampling, ops);
    let peer_ns = ns.split_off(meta.len());
    let figures = meta
        .into_iter()
        .zip(ns)
        .map(|((name, work), ns)| (name, ns, work))
        .collect();
    (figures, peer_ns)
}

/// The churn operation (`harness::churn_op`) of each iolab allocator whose name `keep`
/// accepts, with the exact work per operation counted on a fresh instance: `(allocator,
/// operation, work per op)`.
fn iova_churn_ops(live: usize, keep: &dyn Fn(&str) -> bool) -> Vec<ChurnRow> {
    let mut out = Vec::new();
    for (name, make) in allocators() {
        if !keep(name) {
            continue;
        }
        let alloc = |(a, work): &mut (Arc<dyn IovaAllocator>, WorkRecord), pages| {
            alloc_one(a.as_ref(), pages, work)
        };
        let op = churn_op(
            live,
            (make(), WorkRecord::default()),
            alloc,
            alloc,
            |(a, work), b| a.free(b, 0, work).expect("allocated"),
        );
        let counted = make();
        let per_op = count_churn_work(counted.as_ref(), live);
        out.push((name, op, per_op));
    }
    out
}

/// Runs the churn workload untimed for [`WORK_PASS_OPS`] operations and returns the work of
/// the steady-state operations only (the setup of the live set is excluded).
fn count_churn_work(a: &dyn IovaAllocator, live: usize) -> Vec<(String, f64)> {
    let mut rng = super::harness::SplitMix64::new(0x10_1AB);
    let mut setup = WorkRecord::default();
    let mut held: Vec<IovaBlock> = (0..live)
        .map(|_| alloc_one(a, rng.pages(), &mut setup))
        .collect();
    let mut work = WorkRecord::default();
    for _ in 0..WORK_PASS_OPS {
        let pages = rng.pages();
        if live == 0 {
            let b = alloc_one(a, pages, &mut work);
            a.free(b, 0, &mut work).expect("allocated");
        } else {
            let victim = (rng.next_u64() % live as u64) as usize;
            a.free(held[victim], 0, &mut work).expect("allocated");
            held[victim] = alloc_one(a, pages, &mut work);
        }
    }
    per_op(&work, WORK_PASS_OPS)
}

pub(super) fn per_op(work: &WorkRecord, ops: u64) -> Vec<(String, f64)> {
    let mut v: Vec<(String, f64)> = work
        .counters()
        .iter()
        .filter(|(_, n)| *n != 0)
        .map(|(name, n)| (name.to_string(), *n as f64 / ops as f64))
        .collect();
    for id in LockId::ALL {
        let n = work.lock_count(id);
        if n != 0 {
            v.push((format!("lock.{}", id.name()), n as f64 / ops as f64));
        }
    }
    v
}

/// Map+unmap of `size` bytes for each page-table format that supports that page size and
/// whose name `keep` accepts.
///
/// Sixty-four slots are used in rotation and one extra page stays mapped in the same region,
/// so table pages stay allocated, as they do in the peer (aarch64-paging never frees tables).
pub fn pgtable_map_unmap(
    size: u64,
    sampling: &Sampling,
    keep: &dyn Fn(&str) -> bool,
) -> Vec<Figure> {
    let mut out = Vec::new();
    let mut formats: Vec<Maker<Box<dyn IoPageTable>>> = vec![(
        "lpae-4k",
        Box::new(|| Box::new(LpaeTable::new(LpaeConfig::new(SZ_4K, 48, 48)).expect("valid"))),
    )];
    if size == SZ_4K {
        formats.push((
            "tce-4k",
            Box::new(|| Box::new(TceTable::new(TceConfig::new(0, 1 << 30, 12)).expect("valid"))),
        ));
        formats.push((
            "sba-pdir-4k",
            Box::new(|| Box::new(SbaPdir::new(SbaConfig::new(0, 1 << 30, 12)).expect("valid"))),
        ));
    }
    for (name, make) in formats {
        if !keep(name) {
            continue;
        }
        let (base, _) = make().iova_range();
        let base = base.get().max(size) + 64 * size;
        let run = |table: &mut Box<dyn IoPageTable>,
                   i: u64,
                   gather: &mut UnmapGather,
                   work: &mut WorkRecord| {
            let iova = Iova::new(base + (i % 64) * size);
            let pa = PhysAddr::new(0x8000_0000 + (i % 64) * size);
            table
                .map(iova, pa, size, Prot::READ_WRITE, work)
                .expect("map");
            gather.clear();
            table.unmap(iova, size, gather, work).expect("unmap");
        };
        let keep_alive = |table: &mut Box<dyn IoPageTable>, work: &mut WorkRecord| {
            table
                .map(
                    Iova::new(base + 64 * size),
                    PhysAddr::new(0x4000_0000),
                    size,
                    Prot::READ,
                    work,
                )
                .expect("map");
        };
        let mut table = make();
        let mut gather = UnmapGather::new();
        let mut work = WorkRecord::default();
        keep_alive(&mut table, &mut work);
        let ns = median_ns_per_op(sampling, |i| run(&mut table, i, &mut gather, &mut work));

        let mut table = make();
        let mut setup = WorkRecord::default();
        keep_alive(&mut table, &mut setup);
        for i in 0..64 {
            run(&mut table, i, &mut gather, &mut setup);
        }
        let mut counted = WorkRecord::default();
        for i in 0..WORK_PASS_OPS {
            run(&mut table, i, &mut gather, &mut counted);
        }
        out.push((name, ns, per_op(&counted, WORK_PASS_OPS)));
    }
    out
}

/// Translation of one mapped address: a software walk of the LPAE table and the DMA domain's
/// device-side translate (strict mode, LPAE + Linux allocator).
pub fn translate(sampling: &Sampling) -> Vec<Figure> {
    let mut out = Vec::new();

    let mut table = LpaeTable::new(LpaeConfig::new(SZ_4K, 48, 48)).expect("valid");
    let mut work = WorkRecord::default();
    for i in 0..512u64 {
        table
            .map(
                Iova::new(0x10_0000 + i * SZ_4K),
                PhysAddr::new(0x8000_0000 + i * SZ_4K),
                SZ_4K,
                Prot::READ_WRITE,
                &mut work,
            )
            .expect("map");
    }
    let walk = |i: u64, work: &mut WorkRecord| {
        let t = table.translate(Iova::new(0x10_0000 + (i % 512) * SZ_4K + 8), work);
        std::hint::black_box(t);
    };
    let ns = median_ns_per_op(sampling, |i| walk(i, &mut work));
    let mut counted = WorkRecord::default();
    (0..WORK_PASS_OPS).for_each(|i| walk(i, &mut counted));
    out.push(("lpae-4k-walk", ns, per_op(&counted, WORK_PASS_OPS)));

    let domain = strict_domain();
    let dev = Device::new(1, 64).expect("valid device");
    let mut setup = WorkRecord::default();
    let mappings: Vec<_> = (0..64u64)
        .map(|i| {
            domain
                .map_page(
                    &dev,
                    PhysAddr::new(0x8000_0000 + i * SZ_4K),
                    SZ_4K,
                    Direction::Bidirectional,
                    0,
                    &mut setup,
                )
                .expect("map")
        })
        .collect();
    let addrs: Vec<DmaAddr> = mappings.iter().map(|m| m.dma_addr()).collect();
    let xlate = |i: u64, work: &mut WorkRecord| {
        let r = domain.translate(&dev, addrs[(i % 64) as usize], 512, Access::Read, work);
        std::hint::black_box(r.expect("mapped"));
    };
    let mut work = WorkRecord::default();
    let ns = median_ns_per_op(sampling, |i| xlate(i, &mut work));
    let mut counted = WorkRecord::default();
    (0..WORK_PASS_OPS).for_each(|i| xlate(i, &mut counted));
    out.push(("dma-domain-strict", ns, per_op(&counted, WORK_PASS_OPS)));

    out
}

fn strict_domain() -> Domain {
    let table = LpaeTable::new(LpaeConfig::new(SZ_4K, 48, 48)).expect("valid");
    let alloc =
        LinuxIovaAllocator::new(IovaSpaceConfig::new(SZ_4K, Iova::new(1 << 48))).expect("valid");
    Domain::translated(
        DomainConfig::new(DomainId(1), DomainMode::Strict),
        Box::new(table),
        Arc::new(alloc),
        Arc::new(ImmediateInvalidator::new()),
    )
    .expect("valid domain")
}

/// IOTLB lookups: hits in gem5's micro TLB (32 entries, fully associative) and main TLB
/// (2048 entries, 4-way), and misses in the main TLB; those whose name `keep` accepts.
pub fn iotlb_lookup(sampling: &Sampling, keep: &dyn Fn(&str) -> bool) -> Vec<Figure> {
    let mut out = Vec::new();
    let configs: [(&'static str, IotlbConfig, bool); 3] = [
        ("micro-tlb-hit", IotlbConfig::gem5_micro_tlb(), true),
        ("main-tlb-hit", IotlbConfig::gem5_main_tlb(), true),
        ("main-tlb-miss", IotlbConfig::gem5_main_tlb(), false),
    ];
    for (name, config, hit) in configs {
        if !keep(name) {
            continue;
        }
        let mut tlb = Iotlb::new(config).expect("valid");
        for i in 0..32u64 {
            tlb.insert(
                Asid(1),
                Iova::new(0x10_0000 + i * SZ_4K),
                PhysAddr::new(0x8000_0000 + i * SZ_4K),
                SZ_4K,
                Prot::READ_WRITE,
            )
            .expect("insert");
        }
        let base = if hit { 0x10_0000 } else { 0x1000_0000 };
        let mut lookup = |i: u64, work: &mut WorkRecord| {
            let r = tlb.lookup(Asid(1), Iova::new(base + (i % 32) * SZ_4K + 8), work);
            std::hint::black_box(r);
        };
        let mut work = WorkRecord::default();
        let ns = median_ns_per_op(sampling, |i| lookup(i, &mut work));
        let mut counted = WorkRecord::default();
        (0..WORK_PASS_OPS).for_each(|i| lookup(i, &mut counted));
        out.push((name, ns, per_op(&counted, WORK_PASS_OPS)));
    }
    out
}

/// Command-queue issue on host threads: every thread repeatedly issues what a strict 2-page
/// unmap issues (two TLBI_NH_VA and a CMD_SYNC) through one shared queue of 256 slots,
/// whose consumer the waiting threads run themselves. Returns
/// `(producer, threads, ns per issue call per thread, work per call)` for the pairs `keep`
/// accepts.
pub fn cmdq_issue(sampling: &Sampling, keep: &dyn Fn(&str, usize) -> bool) -> Vec<ThreadedFigure> {
    let calls_per_thread: u64 = if sampling.quick { 20_000 } else { 200_000 };
    let mut out = Vec::new();
    for (name, kind) in [
        ("spinlock", ProducerKind::Spinlock),
        ("lockfree", ProducerKind::LockFree),
    ] {
        for threads in [1usize, 2] {
            if !keep(name, threads) {
                continue;
            }
            let mut samples = Vec::new();
            let mut total = WorkRecord::default();
            for _ in 0..sampling.samples {
                let q = kind
                    .build(CmdqConfig::default(), NullSink)
                    .expect("valid queue");
                let q = q.as_ref();
                let start = std::time::Instant::now();
                let works: Vec<WorkRecord> = std::thread::scope(|scope| {
                    let handles: Vec<_> = (0..threads)
                        .map(|t| {
                            scope.spawn(move || {
                                let mut work = WorkRecord::default();
                                for i in 0..calls_per_thread {
                                    let addr = ((t as u64) << 32) | (i << 12);
                                    let cmds = [tlbi(addr), tlbi(addr + SZ_4K)];
                                    q.issue(&cmds, true, &mut work).expect("issue");
                                }
                                work
                            })
                        })
                        .collect();
                    handles
                        .into_iter()
                        .map(|h| h.join().expect("bench thread"))
                        .collect()
                });
                samples.push(start.elapsed().as_nanos() as f64 / calls_per_thread as f64);
                for w in &works {
                    total += w;
                }
            }
            samples.sort_by(f64::total_cmp);
            let calls = calls_per_thread * threads as u64 * sampling.samples as u64;
            let mut per_call = per_op(&total, calls);
            let commands = total.commands_written as f64;
            per_call.push((
                "cas_failures_per_command".into(),
                total.cas_failures as f64 / commands,
            ));
            out.push((name, threads, samples[samples.len() / 2], per_call));
        }
    }
    out
}

fn tlbi(addr: u64) -> Command {
    Command::TlbiNhVa {
        vmid: 0,
        asid: 1,
        addr,
        leaf: true,
        ttl: 3,
        tg: 1,
        num: 0,
        scale: 0,
    }
}
