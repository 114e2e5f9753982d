//! The x86 IOMMU rows: VT-d second-stage and AMD-Vi v1 page tables against the `x86_64`
//! crate ([`super::x86_paging`]), and strict unmaps through each unit's invalidator.
//!
//! Page-table rows map [`PAGES`] 4 KiB pages and then unmap them, at sequential addresses (one
//! leaf table's worth) or at random page addresses spread over 4 GiB (mostly one leaf table
//! each), and report ns per page (one map plus one unmap). Tables created by the first round
//! stay (neither x86 format frees a table when a single page is unmapped, nor does the peer),
//! so the timed rounds measure the walks and entry writes. Translate rows walk the random
//! set, 8 bytes into each page in turn.
//!
//! The `inval/*-strict-unmap` rows time `Domain::unmap_page` of one 4 KiB mapping in a
//! strict domain, its invalidation and wait included, with mappings made untimed beforehand;
//! each unit's domain is attached to one device as a driver would have it.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Instant;

use iolab_iommu::addr::{Iova, PhysAddr, Prot, SZ_4G, SZ_4K};
use iolab_iommu::amdvi::{AmdV1Config, AmdV1Table, AmdVi, AmdViConfig};
use iolab_iommu::dma::invalidate::ImmediateInvalidator;
use iolab_iommu::dma::{Device, Direction, DmaMapping, Domain, DomainConfig, DomainId, DomainMode};
use iolab_iommu::iova::linux::{IovaSpaceConfig, LinuxIovaAllocator};
use iolab_iommu::mem::{PhysAllocator, PhysMemory};
use iolab_iommu::pgtable::lpae::{LpaeConfig, LpaeTable};
use iolab_iommu::pgtable::{IoPageTable, UnmapGather};
use iolab_iommu::smmuv3::{Smmuv3, Smmuv3Config};
use iolab_iommu::vtd::{Dmar, DmarConfig, VtdPageTable, VtdTableConfig};
use iolab_iommu::work::WorkRecord;

use super::harness::{median_ns_per_timed_batch, Op, Sampling, SplitMix64, TimedBatch};
use super::iolab_side::{per_op, Figure};

/// Pages mapped and unmapped per round of a page-table row.
pub const PAGES: usize = 512;
/// Physical address the benchmark pages map to (`PA_BASE + i * 4 KiB`).
pub const PA_BASE: u64 = 0x8000_0000;
/// Mappings made ahead of each timed batch of strict unmaps.
const UNMAP_BATCH: usize = 256;
/// Rounds of the untimed pass that counts work per operation.
const WORK_PASS_ROUNDS: usize = 20;

/// The page-table rows' address patterns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pattern {
    /// [`PAGES`] consecutive pages from 1 GiB: one leaf table.
    Sequential,
    /// [`PAGES`] distinct random pages in 1 GiB..5 GiB (fixed seed).
    Random,
}

impl Pattern {
    /// The row-name suffix: `map-unmap-seq` or `map-unmap-rand`.
    pub fn row(self) -> &'static str {
        match self {
            Pattern::Sequential => "map-unmap-seq",
            Pattern::Random => "map-unmap-rand",
        }
    }

    /// The IOVAs of the pattern, in the order they are mapped and unmapped.
    pub fn iovas(self) -> Vec<u64> {
        let base = 1u64 << 30;
        match self {
            Pattern::Sequential => (0..PAGES as u64).map(|i| base + i * SZ_4K).collect(),
            Pattern::Random => {
                let mut rng = SplitMix64::new(0x86_1AB);
                let mut seen = BTreeSet::new();
                let mut out = Vec::with_capacity(PAGES);
                while out.len() < PAGES {
                    let page = rng.next_u64() % (SZ_4G / SZ_4K);
                    if seen.insert(page) {
                        out.push(base + page * SZ_4K);
                    }
                }
                out
            }
        }
    }
}

/// A named constructor of a fresh page table.
type TableMaker = (&'static str, Box<dyn Fn() -> Box<dyn IoPageTable>>);

/// The x86 formats measured, by row name: `vtd-second-stage` (4 levels, as a
/// Cascade-Lake-class unit builds it) and `amdv1` (48-bit input, 4 levels).
pub fn x86_tables() -> Vec<TableMaker> {
    vec![
        (
            "vtd-second-stage",
            Box::new(|| {
                let mem = Arc::new(PhysMemory::new(1 << 30).expect("valid"));
                let alloc = PhysAllocator::new(mem, PhysAddr::new(1 << 20), PhysAddr::new(1 << 30))
                    .expect("valid");
                Box::new(
                    VtdPageTable::new(VtdTableConfig::second_stage(4), Arc::new(alloc))
                        .expect("valid"),
                )
            }),
        ),
        (
            "amdv1",
            Box::new(|| Box::new(AmdV1Table::new(AmdV1Config::new(48)).expect("valid"))),
        ),
    ]
}

/// iolab's LPAE table (4 KiB granule, 48 bits), the in-house reference on the same work.
pub fn lpae_table() -> Box<dyn IoPageTable> {
    Box::new(LpaeTable::new(LpaeConfig::new(SZ_4K, 48, 48)).expect("valid"))
}

fn map_unmap_round(
    table: &mut dyn IoPageTable,
    iovas: &[u64],
    gather: &mut UnmapGather,
    work: &mut WorkRecord,
) {
    for (i, &va) in iovas.iter().enumerate() {
        let pa = PhysAddr::new(PA_BASE + i as u64 * SZ_4K);
        table
            .map(Iova::new(va), pa, SZ_4K, Prot::READ_WRITE, work)
            .expect("map");
    }
    for &va in iovas {
        gather.clear();
        table
            .unmap(Iova::new(va), SZ_4K, gather, work)
            .expect("unmap");
    }
}

/// One round of the map+unmap rows on a fresh table from `make`: map every page of
/// `iovas`, then unmap each (ns per page is the round's time over `iovas.len()`).
pub fn map_unmap_op<'a>(make: &dyn Fn() -> Box<dyn IoPageTable>, iovas: &'a [u64]) -> Op<'a> {
    let mut table = make();
    let mut gather = UnmapGather::new();
    let mut work = WorkRecord::default();
    Box::new(move |_| map_unmap_round(table.as_mut(), iovas, &mut gather, &mut work))
}

/// The exact work per page of [`map_unmap_op`], counted on a fresh table after one set-up
/// round.
pub fn map_unmap_work(
    make: &dyn Fn() -> Box<dyn IoPageTable>,
    iovas: &[u64],
) -> Vec<(String, f64)> {
    let mut gather = UnmapGather::new();
    let mut table = make();
    map_unmap_round(
        table.as_mut(),
        iovas,
        &mut gather,
        &mut WorkRecord::default(),
    );
    let mut counted = WorkRecord::default();
    for _ in 0..WORK_PASS_ROUNDS {
        map_unmap_round(table.as_mut(), iovas, &mut gather, &mut counted);
    }
    per_op(&counted, (WORK_PASS_ROUNDS * iovas.len()) as u64)
}

fn mapped_table(make: &dyn Fn() -> Box<dyn IoPageTable>, iovas: &[u64]) -> Box<dyn IoPageTable> {
    let mut table = make();
    let mut setup = WorkRecord::default();
    for (i, &va) in iovas.iter().enumerate() {
        let pa = PhysAddr::new(PA_BASE + i as u64 * SZ_4K);
        table
            .map(Iova::new(va), pa, SZ_4K, Prot::READ_WRITE, &mut setup)
            .expect("map");
    }
    table
}

fn walk(table: &dyn IoPageTable, iovas: &[u64], i: u64, work: &mut WorkRecord) {
    let va = iovas[(i % iovas.len() as u64) as usize];
    let t = table.translate(Iova::new(va + 8), work);
    std::hint::black_box(t.expect("mapped"));
}

/// One translation of the translate rows with every page of `iovas` mapped in a table from
/// `make`: the pages in turn, 8 bytes into each.
pub fn translate_op<'a>(make: &dyn Fn() -> Box<dyn IoPageTable>, iovas: &'a [u64]) -> Op<'a> {
    let table = mapped_table(make, iovas);
    let mut work = WorkRecord::default();
    Box::new(move |i| walk(table.as_ref(), iovas, i, &mut work))
}

/// The exact work per translation of [`translate_op`].
pub fn translate_work(
    make: &dyn Fn() -> Box<dyn IoPageTable>,
    iovas: &[u64],
) -> Vec<(String, f64)> {
    let table = mapped_table(make, iovas);
    let mut counted = WorkRecord::default();
    let ops = (WORK_PASS_ROUNDS * iovas.len()) as u64;
    (0..ops).for_each(|i| walk(table.as_ref(), iovas, i, &mut counted));
    per_op(&counted, ops)
}

/// Builds a fresh [`StrictDomain`].
type DomainMaker = fn() -> StrictDomain;

/// A strict domain of one unit, with whatever must outlive it.
struct StrictDomain {
    domain: Arc<Domain>,
    _unit: Box<dyn std::any::Any>,
}

fn iovas() -> Arc<LinuxIovaAllocator> {
    Arc::new(LinuxIovaAllocator::new(IovaSpaceConfig::new(SZ_4K, Iova::new(SZ_4G))).expect("valid"))
}

fn strict() -> DomainConfig {
    DomainConfig::new(DomainId(1), DomainMode::Strict)
}

/// The strict-unmap variants by row name: `immediate` (the DMA layer alone, LPAE table,
/// invalidation a no-op), `smmuv3` (LPAE table, `Smmuv3Invalidator` through the command
/// queue), `vtd` (second-stage table, `VtdInvalidator` through the invalidation queue) and
/// `amdvi` (v1 table, `AmdViInvalidator` through the command buffer).
fn strict_domains() -> Vec<(&'static str, DomainMaker)> {
    vec![
        ("immediate", || {
            let table = LpaeTable::new(LpaeConfig::new(SZ_4K, 48, 48)).expect("valid");
            let d = Domain::translated(
                strict(),
                Box::new(table),
                iovas(),
                Arc::new(ImmediateInvalidator::new()),
            )
            .expect("valid domain");
            StrictDomain {
                domain: Arc::new(d),
                _unit: Box::new(()),
            }
        }),
        ("smmuv3", || {
            let smmu = Smmuv3::new(Smmuv3Config::default()).expect("valid");
            let d = smmu
                .new_domain(1, strict(), LpaeConfig::new(SZ_4K, 48, 48), iovas())
                .expect("valid domain");
            smmu.attach(0, &d, &mut WorkRecord::new()).expect("attach");
            StrictDomain {
                domain: d.domain().clone(),
                _unit: Box::new((smmu, d)),
            }
        }),
        ("vtd", || {
            let mem = Arc::new(PhysMemory::new(1 << 30).expect("valid"));
            let pages = PhysAllocator::new(mem, PhysAddr::new(1 << 20), PhysAddr::new(1 << 30))
                .expect("valid");
            let dmar = Dmar::new(DmarConfig::cascade_lake(), Arc::new(pages)).expect("valid");
            let d = dmar.new_domain(2, strict(), iovas()).expect("valid domain");
            dmar.attach(0x0300, &d, &mut WorkRecord::new())
                .expect("attach");
            StrictDomain {
                domain: d.domain().clone(),
                _unit: Box::new((dmar, d)),
            }
        }),
        ("amdvi", || {
            let mem = Arc::new(PhysMemory::new(1 << 30).expect("valid"));
            let iommu = AmdVi::new(AmdViConfig::default(), mem).expect("valid");
            let d = iommu
                .new_domain(1, strict(), AmdV1Config::new(48), iovas())
                .expect("valid domain");
            iommu
                .attach(0x18, &d, &mut WorkRecord::new())
                .expect("attach");
            StrictDomain {
                domain: d.domain().clone(),
                _unit: Box::new((iommu, d)),
            }
        }),
    ]
}

fn map_batch(domain: &Domain, dev: &Device, n: usize) -> Vec<DmaMapping> {
    let mut work = WorkRecord::default();
    (0..n as u64)
        .map(|i| {
            let pa = PhysAddr::new(PA_BASE + i * SZ_4K);
            domain
                .map_page(dev, pa, SZ_4K, Direction::Bidirectional, 0, &mut work)
                .expect("map")
        })
        .collect()
}

/// ns per strict 4 KiB unmap through each unit's domain whose name `keep` accepts (their
/// samples interleaved), with the work per unmap; rows are named
/// `inval/<name>-strict-unmap` by the caller.
pub fn strict_unmap(sampling: &Sampling, keep: &dyn Fn(&str) -> bool) -> Vec<Figure> {
    let dev = Device::new(1, 64).expect("valid device");
    let kept: Vec<_> = strict_domains()
        .into_iter()
        .filter(|(name, _)| keep(name))
        .collect();
    let domains: Vec<StrictDomain> = kept.iter().map(|(_, make)| make()).collect();
    let batches: Vec<TimedBatch<'_>> = domains
        .iter()
        .map(|d| {
            let mut work = WorkRecord::default();
            let dev = &dev;
            Box::new(move || {
                let maps = map_batch(&d.domain, dev, UNMAP_BATCH);
                let n = maps.len() as u64;
                let start = Instant::now();
                for m in maps {
                    d.domain.unmap_page(m, 0, 0, &mut work).expect("unmap");
                }
                (start.elapsed(), n)
            }) as TimedBatch<'_>
        })
        .collect();
    let ns = median_ns_per_timed_batch(sampling, batches);
    kept.into_iter()
        .zip(ns)
        .map(|((name, make), ns)| {
            let d = make();
            let mut counted = WorkRecord::default();
            let mut ops = 0u64;
            for _ in 0..WORK_PASS_ROUNDS {
                for m in map_batch(&d.domain, &dev, UNMAP_BATCH) {
                    d.domain.unmap_page(m, 0, 0, &mut counted).expect("unmap");
                    ops += 1;
                }
            }
            (name, ns, per_op(&counted, ops))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_are_distinct_pages_in_their_window() {
        for p in [Pattern::Sequential, Pattern::Random] {
            let v = p.iovas();
            assert_eq!(v.len(), PAGES);
            assert_eq!(v.iter().collect::<BTreeSet<_>>().len(), PAGES);
            assert!(v
                .iter()
                .all(|&a| a % SZ_4K == 0 && (1 << 30..5 << 30).contains(&a)));
        }
    }

    #[test]
    fn every_x86_table_and_the_peer_agree_on_the_workload() {
        let iovas = Pattern::Random.iovas();
        let mut peer = super::super::x86_paging::HostPageTable::new();
        for (i, &va) in iovas.iter().enumerate() {
            peer.map(va, PA_BASE + i as u64 * SZ_4K);
        }
        for (name, make) in x86_tables() {
            let mut t = make();
            let mut work = WorkRecord::default();
            for (i, &va) in iovas.iter().enumerate() {
                let pa = PhysAddr::new(PA_BASE + i as u64 * SZ_4K);
                t.map(Iova::new(va), pa, SZ_4K, Prot::READ_WRITE, &mut work)
                    .expect("map");
            }
            for &va in &iovas {
                let ours = t
                    .translate(Iova::new(va + 8), &mut work)
                    .map(|x| x.pa.get());
                assert_eq!(ours, peer.translate(va + 8), "{name} at {va:#x}");
            }
        }
    }
}
