//! Property tests of the IO page-table formats against a reference model.
//!
//! The model is a `BTreeMap` from every mapped granule-sized page to its physical page and
//! permissions. Random sequences of maps and unmaps (exact re-unmaps of earlier maps, trimmed
//! ones that may cut a block, and random ranges that often hit holes) run against both; after
//! every operation each mapped page must translate as the model says, pages around the range
//! must not translate when the model has them unmapped, `mapped_bytes` must match, and a
//! failed call must leave everything unchanged. LPAE sequences run under both table-reclaim
//! policies, with occasional reclaim passes in between that must free only empty tables. At
//! the end everything is unmapped and, with `WholeSpan`, the empty tables left are reclaimed:
//! the table is back to its root (no leaked table pages) and the gathers account for every
//! byte mapped and every table page freed.

use std::collections::BTreeMap;

use iolab_iommu::addr::{Iova, PhysAddr, Prot, SZ_16K, SZ_2M, SZ_32M, SZ_4K, SZ_512M, SZ_64K};
use iolab_iommu::pgtable::lpae::{LpaeConfig, LpaeTable, TableReclaim};
use iolab_iommu::pgtable::sba_pdir::{SbaConfig, SbaPdir};
use iolab_iommu::pgtable::tce::{TceConfig, TceTable};
use iolab_iommu::pgtable::{IoPageTable, PgTableError, UnmapGather};
use iolab_iommu::vtd::{VtdPageTable, VtdTableConfig};
use iolab_iommu::work::WorkRecord;
use proptest::prelude::*;

/// Physical addresses are `PA_BASE + (iova mod 2^36)` (plus a skew), so an IOVA and its
/// physical address agree modulo every block size and blocks can form. Below 2^40 for SBA.
const PA_BASE: u64 = 1 << 38;

/// One step, before it is scaled to a format's geometry.
#[derive(Clone, Debug)]
enum RawOp {
    Map {
        region: usize,
        page: u64,
        shape: u8,
        count: u64,
        skew: u64,
        prot: u8,
    },
    UnmapEarlier {
        pick: usize,
        trim_front: u64,
        trim_back: u64,
    },
    UnmapRandom {
        region: usize,
        page: u64,
        count: u64,
    },
    /// A reclaim pass over empty tables (a no-op for formats without table pages).
    Reclaim,
}

fn raw_op() -> impl Strategy<Value = RawOp> {
    let skew = prop_oneof![4 => Just(0u64), 1 => 1..4u64];
    prop_oneof![
        5 => (0..3usize, any::<u64>(), 0..3u8, any::<u64>(), skew, 0..3u8).prop_map(
            |(region, page, shape, count, skew, prot)| RawOp::Map {
                region,
                page,
                shape,
                count,
                skew,
                prot
            }
        ),
        4 => (any::<usize>(), prop_oneof![3 => Just(0u64), 1 => 1..3u64], prop_oneof![3 => Just(0u64), 1 => 1..3u64])
            .prop_map(|(pick, trim_front, trim_back)| RawOp::UnmapEarlier { pick, trim_front, trim_back }),
        1 => (0..3usize, any::<u64>(), 1..64u64)
            .prop_map(|(region, page, count)| RawOp::UnmapRandom { region, page, count }),
        1 => Just(RawOp::Reclaim),
    ]
}

/// A table under test: the common trait plus the reclaim pass of formats that have one.
trait Table: IoPageTable {
    /// Frees empty table pages into `gather`, returning how many.
    fn reclaim(&mut self, _gather: &mut UnmapGather, _work: &mut WorkRecord) -> usize {
        0
    }
}

impl Table for LpaeTable {
    fn reclaim(&mut self, gather: &mut UnmapGather, work: &mut WorkRecord) -> usize {
        self.reclaim_empty_tables(gather, work)
    }
}

impl Table for TceTable {}

impl Table for VtdPageTable {
    fn reclaim(&mut self, gather: &mut UnmapGather, work: &mut WorkRecord) -> usize {
        self.reclaim_empty_tables(gather, work)
    }
}

impl Table for SbaPdir {}

/// A format under test and how to scale raw operations to it.
struct Setup {
    table: Box<dyn Table>,
    /// The LPAE reclaim policy (`None` for the one-level formats, which free no tables).
    reclaim: Option<TableReclaim>,
    /// Pages of the largest block the tests aim for (1 for single-level formats).
    block_pages: u64,
    /// Pages in each region operations fall into.
    span_pages: u64,
    /// Base IOVA of each of three regions (they may overlap).
    regions: [u64; 3],
    /// The permission a mapping made with a given `Prot` reports.
    effective: fn(Prot) -> Prot,
    /// Whether `TooManyTables` is an acceptable outcome of a map (capped tables).
    capped: bool,
}

fn lpae(granule: u64, ias: u32, cap: Option<usize>, reclaim: TableReclaim) -> Setup {
    let mut config = LpaeConfig::new(granule, ias, 48).with_table_reclaim(reclaim);
    if let Some(cap) = cap {
        config = config.with_max_table_pages(cap);
    }
    let table = LpaeTable::new(config).expect("valid config");
    let block = match granule {
        SZ_4K => SZ_2M,
        SZ_16K => SZ_32M,
        _ => SZ_512M,
    };
    let block_pages = block / granule;
    let top = 1u64 << ias;
    let span_pages = (6 * block_pages).min(top / 2 / granule);
    let span = span_pages * granule;
    Setup {
        table: Box::new(table),
        reclaim: Some(reclaim),
        block_pages,
        span_pages,
        regions: [0, top / 2 - span / 2, top - span],
        // Stage-1 LPAE cannot express write-only: write implies read.
        effective: |p| if p.write { Prot::READ_WRITE } else { p },
        capped: cap.is_some(),
    }
}

/// A VT-d table in its own simulated memory (tables only; mapped addresses need no memory).
/// Unmaps free covered tables as LPAE's `WholeSpan` does.
fn vtd(config: VtdTableConfig) -> Setup {
    use iolab_iommu::mem::{PhysAllocator, PhysMemory};
    use std::sync::Arc;
    let mem = Arc::new(PhysMemory::new(256 << 20).expect("memory"));
    let alloc = PhysAllocator::new(mem, PhysAddr::new(0), PhysAddr::new(256 << 20));
    let table = VtdPageTable::new(config, Arc::new(alloc.expect("allocator"))).expect("table");
    let block_pages = if config.large_pages & 1 != 0 { 512 } else { 64 };
    let top = table.iova_range().1.get();
    let span_pages = 6 * block_pages;
    let span = span_pages * SZ_4K;
    let first_stage = config.stage == iolab_iommu::vtd::VtdStage::First;
    Setup {
        table: Box::new(table),
        reclaim: Some(TableReclaim::WholeSpan),
        block_pages,
        span_pages,
        regions: [0, top / 2 - span / 2, top - span],
        // First-stage leaves are always readable.
        effective: if first_stage {
            |p| if p.write { Prot::READ_WRITE } else { p }
        } else {
            |p| p
        },
        capped: config.max_table_pages < 1 << 20,
    }
}

fn tce(offset: u64, size: u64, page_shift: u32) -> Setup {
    let table = TceTable::new(TceConfig::new(offset, size, page_shift)).expect("valid config");
    let span_pages = 4096.min((size >> page_shift) / 2);
    let end = offset + size;
    Setup {
        table: Box::new(table),
        reclaim: None,
        block_pages: 1,
        span_pages,
        regions: [offset, offset + size / 2, end - (span_pages << page_shift)],
        effective: |p| p,
        capped: false,
    }
}

fn sba(base: u64, size: u64, page_shift: u32) -> Setup {
    let table = SbaPdir::new(SbaConfig::new(base, size, page_shift)).expect("valid config");
    let span_pages = 4096.min((size >> page_shift) / 2);
    let end = base + size;
    Setup {
        table: Box::new(table),
        reclaim: None,
        block_pages: 1,
        span_pages,
        regions: [base, base + size / 2, end - (span_pages << page_shift)],
        // SBA entries carry no permissions.
        effective: |_| Prot::READ_WRITE,
        capped: false,
    }
}

/// The table, the reference model and the running totals.
struct Harness {
    s: Setup,
    granule: u64,
    /// Mapped page IOVA -> (physical page, effective permission).
    model: BTreeMap<u64, (u64, Prot)>,
    /// `(iova, size)` of every successful map, for later unmaps.
    maps: Vec<(u64, u64)>,
    mapped_total: u64,
    gathered_total: u64,
    freed_tables: u64,
    work: WorkRecord,
    initial_pages: usize,
}

impl Harness {
    fn new(s: Setup) -> Self {
        let granule = s.table.granule();
        let initial_pages = s.table.table_pages();
        Self {
            s,
            granule,
            model: BTreeMap::new(),
            maps: Vec::new(),
            mapped_total: 0,
            gathered_total: 0,
            freed_tables: 0,
            work: WorkRecord::new(),
            initial_pages,
        }
    }

    fn pages(&self, iova: u64, size: u64) -> impl Iterator<Item = u64> {
        let g = self.granule;
        (0..size / g).map(move |i| iova + i * g)
    }

    /// Scales a raw op and runs it against table and model.
    fn step(&mut self, op: &RawOp) {
        let g = self.granule;
        let span = self.s.span_pages;
        match *op {
            RawOp::Map {
                region,
                page,
                shape,
                count,
                skew,
                prot,
            } => {
                let bp = self.s.block_pages;
                let (mut page, count) = match shape {
                    0 => (page % span, 1 + count % 8),
                    1 => (page % span, 1 + count % (2 * bp)),
                    _ => (page % span, bp * (1 + count % 3) + (count >> 8) % 3),
                };
                if shape == 2 {
                    page -= page % bp;
                }
                let count = count.min(span - page);
                let iova = self.s.regions[region] + page * g;
                let pa = PA_BASE + (iova % (1 << 36)) + skew * g;
                let prot = [Prot::READ, Prot::WRITE, Prot::READ_WRITE][prot as usize];
                self.map(iova, pa, count * g, prot);
            }
            RawOp::UnmapEarlier {
                pick,
                trim_front,
                trim_back,
            } => {
                if self.maps.is_empty() {
                    return;
                }
                let (iova, size) = self.maps[pick % self.maps.len()];
                let trim = (trim_front + trim_back) * g;
                if trim < size {
                    self.unmap(iova + trim_front * g, size - trim);
                }
            }
            RawOp::UnmapRandom {
                region,
                page,
                count,
            } => {
                let page = page % span;
                let count = count.min(span - page);
                self.unmap(self.s.regions[region] + page * g, count * g);
            }
            RawOp::Reclaim => {
                self.reclaim();
                let lo = self.s.table.iova_range().0.get();
                self.check_around(lo, 0);
            }
        }
    }

    /// A reclaim pass: frees only table pages, changes no mapping, and with `WhenEmpty` finds
    /// nothing (an unmap already freed every table it emptied).
    fn reclaim(&mut self) -> usize {
        let before = (self.s.table.mapped_bytes(), self.s.table.table_pages());
        let mut gather = UnmapGather::new();
        let mut work = WorkRecord::new();

        let freed = self.s.table.reclaim(&mut gather, &mut work);

        assert!(gather.ranges.is_empty(), "a reclaim removed mappings");
        assert_eq!(gather.freed_tables.len(), freed);
        assert_eq!(work.tables_freed, freed as u64);
        assert_eq!((work.ptes_written, work.tables_allocated), (0, 0));
        assert_eq!(
            (self.s.table.mapped_bytes(), self.s.table.table_pages()),
            (before.0, before.1 - freed)
        );
        if self.s.reclaim == Some(TableReclaim::WhenEmpty) {
            assert_eq!(freed, 0, "WhenEmpty left empty tables: {gather:?}");
        }
        self.freed_tables += freed as u64;
        self.work += work;
        freed
    }

    fn map(&mut self, iova: u64, pa: u64, size: u64, prot: Prot) {
        let first_mapped = self.pages(iova, size).find(|p| self.model.contains_key(p));
        let before = (self.s.table.mapped_bytes(), self.s.table.table_pages());
        let mut work = WorkRecord::new();

        let table = &mut self.s.table;
        let result = table.map(Iova::new(iova), PhysAddr::new(pa), size, prot, &mut work);

        match (result, first_mapped) {
            (Ok(()), None) => {
                let effective = (self.s.effective)(prot);
                for (i, p) in self.pages(iova, size).enumerate() {
                    self.model
                        .insert(p, (pa + i as u64 * self.granule, effective));
                }
                self.maps.push((iova, size));
                self.mapped_total += size;
            }
            (Err(PgTableError::AlreadyMapped { iova: at }), Some(first)) => {
                assert_eq!(at, first, "AlreadyMapped must name the first mapped IOVA");
                self.assert_unchanged(before, &work);
            }
            (Err(PgTableError::TooManyTables { .. }), None) if self.s.capped => {
                self.assert_unchanged(before, &work);
            }
            (result, first) => {
                panic!("map {iova:#x}+{size:#x}: got {result:?}, model's first mapped {first:x?}")
            }
        }
        self.work += work;
        self.check_around(iova, size);
    }

    fn unmap(&mut self, iova: u64, size: u64) {
        let first_missing = self.pages(iova, size).find(|p| !self.model.contains_key(p));
        let before = (self.s.table.mapped_bytes(), self.s.table.table_pages());
        let mut gather = UnmapGather::new();
        let mut work = WorkRecord::new();

        let table = &mut self.s.table;
        let result = table.unmap(Iova::new(iova), size, &mut gather, &mut work);

        match result {
            Ok(()) => {
                assert_eq!(
                    first_missing, None,
                    "unmap of {iova:#x}+{size:#x} hit a hole"
                );
                assert_eq!(gather.bytes(), size);
                let bitmap = self.s.table.page_size_bitmap();
                let mut next = iova;
                for r in &gather.ranges {
                    assert!(
                        r.start.get() >= next,
                        "gather ranges out of order: {gather:?}"
                    );
                    assert!(bitmap & r.page_size != 0 && r.size % r.page_size == 0);
                    assert!(r.start.is_aligned(r.page_size));
                    next = r.end().get();
                }
                assert!(next <= iova + size);
                for p in self.pages(iova, size) {
                    self.model.remove(&p);
                }
                self.gathered_total += size;
                self.freed_tables += gather.freed_tables.len() as u64;
                assert_eq!(gather.freed_tables.len() as u64, work.tables_freed);
                if self.s.reclaim == Some(TableReclaim::WholeSpan) {
                    // Only tables whose whole span the unmap covered are freed.
                    for t in &gather.freed_tables {
                        assert!(
                            t.iova.get() >= iova && t.iova.get() + t.size <= iova + size,
                            "unmap of {iova:#x}+{size:#x} freed {t:?}"
                        );
                    }
                }
            }
            Err(PgTableError::NotMapped { iova: at }) => {
                assert_eq!(
                    Some(at),
                    first_missing,
                    "NotMapped must name the first hole"
                );
                assert!(gather.is_empty());
                self.assert_unchanged(before, &work);
            }
            Err(PgTableError::SplitsBlock {
                iova: ri,
                size: rs,
                block_iova,
                block_size,
            }) => {
                assert_eq!((ri, rs), (iova, size));
                let block_end = block_iova + block_size;
                assert!(
                    block_iova < iova + size && block_end > iova,
                    "block must overlap"
                );
                assert!(
                    block_iova < iova || block_end > iova + size,
                    "block must be cut"
                );
                assert!(block_iova < first_missing.unwrap_or(u64::MAX));
                let t = self
                    .s
                    .table
                    .translate(Iova::new(block_iova), &mut WorkRecord::new());
                assert_eq!(t.map(|t| t.page_size), Some(block_size));
                assert!(gather.is_empty());
                self.assert_unchanged(before, &work);
            }
            Err(e) => panic!("unmap {iova:#x}+{size:#x}: unexpected {e:?}"),
        }
        self.work += work;
        self.check_around(iova, size);
    }

    fn assert_unchanged(&self, before: (u64, usize), work: &WorkRecord) {
        assert_eq!(
            (self.s.table.mapped_bytes(), self.s.table.table_pages()),
            before
        );
        assert_eq!(
            (
                work.ptes_written,
                work.ptes_cleared,
                work.tables_allocated,
                work.tables_freed
            ),
            (0, 0, 0, 0),
            "a failed call wrote something"
        );
    }

    /// Every mapped page translates as the model says; pages in and around the last range
    /// that the model has unmapped do not translate.
    fn check_around(&self, iova: u64, size: u64) {
        let g = self.granule;
        assert_eq!(self.s.table.mapped_bytes(), self.model.len() as u64 * g);
        let mut work = WorkRecord::new();
        for (&page, &(pa, prot)) in &self.model {
            let off = (page / g * 7 % 8) * (g / 8);
            let t = self.s.table.translate(Iova::new(page + off), &mut work);
            let t = t.unwrap_or_else(|| panic!("page {page:#x} should be mapped"));
            assert_eq!((t.pa.get(), t.prot), (pa + off, prot), "page {page:#x}");
        }
        let (lo, hi) = self.s.table.iova_range();
        let from = iova.saturating_sub(g).max(lo.get());
        let to = (iova + size + g).min(hi.get());
        for p in self
            .pages(from, to - from)
            .filter(|p| !self.model.contains_key(p))
        {
            assert_eq!(
                self.s.table.translate(Iova::new(p), &mut work),
                None,
                "{p:#x}"
            );
        }
    }

    /// Unmaps every maximal run of mapped pages, then checks nothing leaked.
    fn finish(mut self) {
        let mut runs: Vec<(u64, u64)> = Vec::new();
        for &page in self.model.keys() {
            match runs.last_mut() {
                Some((start, size)) if *start + *size == page => *size += self.granule,
                _ => runs.push((page, self.granule)),
            }
        }
        for (iova, size) in runs {
            let mut gather = UnmapGather::new();
            let mut work = WorkRecord::new();
            self.s
                .table
                .unmap(Iova::new(iova), size, &mut gather, &mut work)
                .unwrap_or_else(|e| panic!("final unmap of {iova:#x}+{size:#x} failed: {e:?}"));
            assert_eq!(gather.bytes(), size);
            self.gathered_total += size;
            self.freed_tables += gather.freed_tables.len() as u64;
            self.work += work;
        }
        // `WholeSpan` leaves the tables of partial unmaps in place; a reclaim pass frees them.
        self.reclaim();
        assert_eq!(self.s.table.mapped_bytes(), 0);
        assert_eq!(
            self.s.table.table_pages(),
            self.initial_pages,
            "table pages leaked"
        );
        assert_eq!(self.gathered_total, self.mapped_total);
        assert_eq!(self.work.tables_allocated, self.work.tables_freed);
        assert_eq!(self.freed_tables, self.work.tables_freed);
    }
}

fn run(setup: Setup, ops: &[RawOp]) {
    let mut h = Harness::new(setup);
    for op in ops {
        h.step(op);
    }
    h.finish();
}

/// Runs `ops` on an LPAE table under each reclaim policy.
fn run_lpae(granule: u64, ias: u32, cap: Option<usize>, ops: &[RawOp]) {
    for reclaim in [TableReclaim::WholeSpan, TableReclaim::WhenEmpty] {
        run(lpae(granule, ias, cap, reclaim), ops);
    }
}

fn ops() -> impl Strategy<Value = Vec<RawOp>> {
    prop::collection::vec(raw_op(), 1..40)
}

/// Named so that `cargo test -p iolab-iommu pgtable` selects these tests too.
mod pgtable {
    use super::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

        #[test]
        fn lpae_4k_48_matches_model(ops in ops()) {
            run_lpae(SZ_4K, 48, None, &ops);
        }

        #[test]
        fn lpae_4k_39_matches_model(ops in ops()) {
            run_lpae(SZ_4K, 39, None, &ops);
        }

        #[test]
        fn lpae_4k_32_matches_model(ops in ops()) {
            run_lpae(SZ_4K, 32, None, &ops);
        }

        #[test]
        fn lpae_4k_capped_tables_fail_cleanly(ops in ops()) {
            run_lpae(SZ_4K, 48, Some(8), &ops);
        }

        #[test]
        fn lpae_16k_48_matches_model(ops in ops()) {
            run_lpae(SZ_16K, 48, None, &ops);
        }

        #[test]
        fn lpae_16k_36_matches_model(ops in ops()) {
            run_lpae(SZ_16K, 36, None, &ops);
        }

        #[test]
        fn vtd_sl_4level_matches_model(ops in ops()) {
            run(vtd(VtdTableConfig::second_stage(4)), &ops);
        }

        #[test]
        fn vtd_sl_5level_matches_model(ops in ops()) {
            run(vtd(VtdTableConfig::second_stage(5)), &ops);
        }

        #[test]
        fn vtd_sl_3level_4k_only_matches_model(ops in ops()) {
            run(vtd(VtdTableConfig::second_stage(3).with_large_pages(0)), &ops);
        }

        #[test]
        fn vtd_sl_capped_tables_fail_cleanly(ops in ops()) {
            run(vtd(VtdTableConfig::second_stage(4).with_max_table_pages(6)), &ops);
        }

        #[test]
        fn vtd_fl_4level_matches_model(ops in ops()) {
            run(vtd(VtdTableConfig::first_stage(4, true)), &ops);
        }

        #[test]
        fn tce_4k_matches_model(ops in ops()) {
            run(tce(0x8000_0000, 1 << 30, 12), &ops);
        }

        #[test]
        fn tce_64k_matches_model(ops in ops()) {
            run(tce(1 << 59, 256 << 30, 16), &ops);
        }

        #[test]
        fn tce_2m_and_16m_match_model(ops in ops(), big in any::<bool>()) {
            run(if big { tce(0, 64 << 30, 24) } else { tce(1 << 40, 8 << 30, 21) }, &ops);
        }

        #[test]
        fn sba_4k_matches_model(ops in ops()) {
            run(sba(1 << 30, 1 << 30, 12), &ops);
        }

        #[test]
        fn sba_64k_matches_model(ops in ops()) {
            run(sba(0, 1 << 32, 16), &ops);
        }
    }

    proptest! {
        // 64K granule blocks are 8192 pages: fewer, cheaper cases.
        #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

        #[test]
        fn lpae_64k_matches_model(
            ops in prop::collection::vec(raw_op(), 1..24),
            ias in prop_oneof![Just(48u32), Just(42), Just(32)],
        ) {
            run_lpae(SZ_64K, ias, None, &ops);
        }
    }
}
