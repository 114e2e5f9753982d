//! Renesas IPMMU-VMSA (R-Car Gen2/Gen3), as Linux's `ipmmu-vmsa.c` drives it.
//!
//! The IPMMU walks ARM LPAE stage-1 tables with a 32-bit input (IOVA) and a 40-bit output
//! address, 4 KiB pages with 2 MiB and 1 GiB blocks. Two things make it cost differently from
//! an SMMUv3:
//!
//! - **Its walker is not cache coherent** (Linux sets `coherent_walk = false`), so every
//!   batch of page-table writes is followed by a clean of the cache lines holding them, and
//!   every new table page is cleaned whole. [`IpmmuPageTable`] wraps an [`LpaeTable`] and
//!   counts those cleans in cache lines (`cache_cleans`).
//! - **It has no invalidation by address.** Every invalidation is a whole-context TLB flush:
//!   set `IMCTR.FLUSH` (a read-modify-write of the register) and poll it until the hardware
//!   clears it, in 1 µs steps, giving up after 100 reads. [`IpmmuInvalidator`] models that.
//!
//! # When the flush happens
//!
//! Linux's io-pgtable unmap reports leaf removals through `tlb_add_page`, which the IPMMU
//! leaves empty, so clearing PTEs issues nothing; the flush comes from `iotlb_sync`
//! (`ipmmu_iotlb_sync` -> `ipmmu_tlb_flush_all`), once per unmap call. The DMA layer here
//! calls the invalidator once per gathered range and per freed table page and then `sync`s,
//! so [`IpmmuInvalidator`] records those requests as *pending* for their context and does
//! one flush per pending context in [`Invalidator::sync`]: exactly one flush per unmap. The
//! flush is synchronous (it waits for the FLUSH bit), so nothing else is waited for.
//!
//! Linux additionally flushes from `tlb_flush_walk` when an unmap removes a whole table.
//! This model's LPAE table frees every table page an unmap leaves empty (Linux keeps them),
//! so following that rule would flush more often here than Linux does; the freed-table
//! invalidation is coalesced into the same single flush instead, which is what Linux does in
//! the common DMA case (unmaps far smaller than a table's span).
//!
//! There is no lazy mode: Linux's IPMMU driver has no flush queue support, and
//! [`ipmmu_domain`] rejects [`DomainMode::Lazy`] with [`IpmmuError::LazyMode`].

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::addr::{Iova, PhysAddr, Prot, SZ_4K};
use crate::dma::{DmaError, Domain, DomainConfig, DomainId, DomainMode, Invalidator};
use crate::iova::IovaAllocator;
use crate::pgtable::lpae::{spec, LpaeConfig, LpaeConfigError, LpaeTable};
use crate::pgtable::{
    FreedTable, GatherRange, IoPageTable, PgTableError, Translation, UnmapGather,
};
use crate::work::WorkRecord;

/// Input (IOVA) address size of an IPMMU context: 32 bits.
pub const IPMMU_IAS: u32 = 32;
/// Output (physical) address size: 40 bits.
pub const IPMMU_OAS: u32 = 40;
/// Reads of `IMCTR` after which Linux gives up waiting for the flush (`TLB_LOOP_TIMEOUT`,
/// 100 reads 1 µs apart).
pub const TLB_LOOP_TIMEOUT: u32 = 100;
/// Most contexts an IPMMU instance has (`IPMMU_CTX_MAX`).
pub const IPMMU_CTX_MAX: usize = 16;
/// Cache-line size used to count cleans (Cortex-A57/A53: 64 bytes).
pub const CACHE_LINE: u64 = 64;

/// Why an IPMMU domain could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IpmmuError {
    /// Lazy (deferred) invalidation was asked for.
    #[error("IPMMU-VMSA has no lazy mode")]
    LazyMode,
    /// A mode without translation was asked for (the driver only allocates translated
    /// domains).
    #[error("IPMMU-VMSA domains are translated: {mode:?} is not supported")]
    NotTranslated {
        /// The mode asked for.
        mode: DomainMode,
    },
    /// Polls per flush must be at least one (the read that sees the bit clear).
    #[error("Polls per flush must be at least 1")]
    ZeroPolls,
    /// The page table could not be built.
    #[error("Cannot build the IPMMU page table")]
    Table(#[from] LpaeConfigError),
    /// The DMA layer refused the assembled domain.
    #[error("Cannot assemble the IPMMU domain")]
    Domain(#[from] DmaError),
}

// ---------------------------------------------------------------------------------------
// Page table: LPAE with a non-coherent walker.
// ---------------------------------------------------------------------------------------

/// Where an IPMMU page table lives and how large it may grow.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IpmmuTableConfig {
    /// Simulated physical address of the root table; `None`: the top of the 40-bit space.
    pub table_base_pa: Option<PhysAddr>,
    /// Cap on table pages; `None`: the LPAE default.
    pub max_table_pages: Option<usize>,
}

/// An IPMMU context's page table: an [`LpaeTable`] with a 32-bit input, 40-bit output and
/// 4 KiB granule, walked by a non-coherent walker.
///
/// Every PTE write batch counts `cache_cleans` in **cache lines** (64 bytes), as Linux's
/// io-pgtable cleans them with `dma_sync_single_for_device` on a non-coherent walker:
///
/// - each batch of leaf descriptors written or cleared in one table: the lines the batch
///   spans, from the line of its first descriptor to the line of its last (16 aligned
///   4 KiB PTEs are 2 lines, `ceil(128 / 64)`; 8 PTEs starting at index 4 span 2 lines
///   although `ceil(64 / 64)` is 1: the clean works on whole lines);
/// - each table descriptor written to link in a new table: one line;
/// - each table descriptor cleared when an unmap frees a table: one line.
///
/// A new table page is also cleaned whole when Linux allocates it (`dma_map_single` of the
/// page, 64 lines); that clean belongs to the table allocation and is charged through
/// `tables_allocated` (the R-Car H3 profile's `table_alloc` includes it), not counted here.
///
/// The leaf batches are read off the table itself (a walk to each leaf table touched and
/// the descriptors read back), since [`LpaeTable`] does not report its batches; the table
/// counts no cleans of its own (it is built coherent, which changes nothing else). Linux
/// keeps emptied tables where this table frees them, so an unmap that empties a table costs
/// one extra line here.
#[derive(Clone, Debug)]
pub struct IpmmuPageTable {
    inner: LpaeTable,
}

impl IpmmuPageTable {
    /// An empty table.
    pub fn new(config: IpmmuTableConfig) -> Result<Self, LpaeConfigError> {
        let mut lpae = LpaeConfig::new(SZ_4K, IPMMU_IAS, IPMMU_OAS).with_coherent_walk(true);
        if let Some(pa) = config.table_base_pa {
            lpae = lpae.with_table_base(pa);
        }
        if let Some(n) = config.max_table_pages {
            lpae = lpae.with_max_table_pages(n);
        }
        Ok(Self {
            inner: LpaeTable::new(lpae)?,
        })
    }

    /// The LPAE table inside (for walks by a hardware model).
    pub fn lpae(&self) -> &LpaeTable {
        &self.inner
    }

    /// Cache lines spanned by `bytes` bytes at `pa`.
    fn lines(pa: u64, bytes: u64) -> u64 {
        debug_assert!(bytes > 0);
        (pa + bytes - 1) / CACHE_LINE - pa / CACHE_LINE + 1
    }

    /// Cache lines spanned by the leaf descriptors that map `[iova, iova + size)`, batch by
    /// batch (one batch per run of leaves in one table). Reads the table, counts nothing.
    fn leaf_lines(&self, iova: u64, size: u64) -> u64 {
        let t = &self.inner;
        let gshift = t.granule_shift();
        let per_table = (t.config().granule / 8) as usize;
        let end = iova + size;
        let mut lines = 0;
        let mut x = iova;
        while x < end {
            let walk = t.walk(Iova::new(x));
            let (Some(tr), Some(step)) = (walk.translation, walk.steps().last()) else {
                break;
            };
            let table_len = if step.table_pa == t.root_pa() {
                t.root_entries()
            } else {
                per_table
            };
            let first = step.index;
            let mut n = 1usize;
            x += tr.page_size;
            while x < end && first + n < table_len {
                let Some(desc) = t.read_descriptor(step.table_pa, first + n) else {
                    break;
                };
                if !matches!(
                    spec::decode(desc, step.level, gshift),
                    spec::Descriptor::Leaf { .. }
                ) {
                    break;
                }
                n += 1;
                x += tr.page_size;
            }
            lines += Self::lines(step.desc_pa().get(), n as u64 * 8);
        }
        lines
    }
}

impl IoPageTable for IpmmuPageTable {
    fn format_name(&self) -> &'static str {
        "ipmmu-lpae-32"
    }

    fn page_size_bitmap(&self) -> u64 {
        self.inner.page_size_bitmap()
    }

    fn iova_range(&self) -> (Iova, Iova) {
        self.inner.iova_range()
    }

    fn map(
        &mut self,
        iova: Iova,
        pa: PhysAddr,
        size: u64,
        prot: Prot,
        work: &mut WorkRecord,
    ) -> Result<(), PgTableError> {
        let before = work.tables_allocated;
        self.inner.map(iova, pa, size, prot, work)?;
        // One line per table descriptor installed, plus the leaf batches.
        let new_tables = work.tables_allocated - before;
        work.cache_cleans += new_tables + self.leaf_lines(iova.get(), size);
        Ok(())
    }

    fn unmap(
        &mut self,
        iova: Iova,
        size: u64,
        gather: &mut UnmapGather,
        work: &mut WorkRecord,
    ) -> Result<(), PgTableError> {
        // The leaves must be read before they are cleared.
        let leaf = if size == 0 {
            0
        } else {
            self.leaf_lines(iova.get(), size)
        };
        let before = work.tables_freed;
        self.inner.unmap(iova, size, gather, work)?;
        work.cache_cleans += leaf + (work.tables_freed - before);
        Ok(())
    }

    fn translate(&self, iova: Iova, work: &mut WorkRecord) -> Option<Translation> {
        self.inner.translate(iova, work)
    }

    fn table_pages(&self) -> usize {
        self.inner.table_pages()
    }

    fn mapped_bytes(&self) -> u64 {
        self.inner.mapped_bytes()
    }
}

// ---------------------------------------------------------------------------------------
// Invalidation: whole-context flush by register write and poll.
// ---------------------------------------------------------------------------------------

/// How an IPMMU flush behaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IpmmuFlushConfig {
    /// Reads of `IMCTR` until one sees the FLUSH bit clear (at least 1: the bit is already
    /// clear at the first read). The functional model has no time, so this is a parameter;
    /// the lab sets it from its timing (Linux waits 1 µs between reads). Above
    /// [`TLB_LOOP_TIMEOUT`] the wait gives up after that many reads, as Linux does.
    pub polls_per_flush: u32,
    /// Whether the master sits behind a cache IPMMU (R-Car Gen3 `has_cache_leaf_nodes`):
    /// Linux then writes `IMCTR` in both the cache IPMMU and the root IPMMU-MM (2 writes).
    pub cache_ipmmu: bool,
}

impl Default for IpmmuFlushConfig {
    /// One poll, one register write.
    fn default() -> Self {
        Self {
            polls_per_flush: 1,
            cache_ipmmu: false,
        }
    }
}

/// Running totals of an [`IpmmuInvalidator`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IpmmuStats {
    /// Whole-context flushes.
    pub flushes: u64,
    /// `IMCTR` reads while waiting for the FLUSH bit.
    pub polls: u64,
    /// Register writes.
    pub mmio_writes: u64,
    /// Register reads (the read-modify-write plus the polls).
    pub mmio_reads: u64,
    /// Invalidation requests absorbed into a pending flush.
    pub requests: u64,
    /// Flushes whose wait gave up after [`TLB_LOOP_TIMEOUT`] reads.
    pub timeouts: u64,
}

#[derive(Debug, Default)]
struct Totals {
    flushes: AtomicU64,
    polls: AtomicU64,
    mmio_writes: AtomicU64,
    mmio_reads: AtomicU64,
    requests: AtomicU64,
    timeouts: AtomicU64,
}

/// The IPMMU's invalidation: every request (range, walk or domain) becomes one pending
/// whole-context flush of its context, done at the next [`Invalidator::sync`]. See the
/// module docs.
///
/// One flush costs, in the caller's [`WorkRecord`]: `inval_domains` 1; `mmio_reads`
/// 1 + polls (Linux reads `IMCTR` to set the bit, then polls it); `mmio_writes` 1, or 2
/// behind a cache IPMMU; `polls` the configured polls (capped at [`TLB_LOOP_TIMEOUT`]).
/// Requests themselves count nothing.
#[derive(Debug)]
pub struct IpmmuInvalidator {
    polls_per_flush: AtomicU32,
    cache_ipmmu: bool,
    /// Contexts with a flush pending. Holding this lock across the flushes makes a sync
    /// that finds nothing pending wait for a flush that another CPU is doing.
    pending: Mutex<Vec<DomainId>>,
    totals: Totals,
}

impl IpmmuInvalidator {
    /// An invalidator with the given flush behaviour.
    pub fn new(config: IpmmuFlushConfig) -> Result<Self, IpmmuError> {
        if config.polls_per_flush == 0 {
            return Err(IpmmuError::ZeroPolls);
        }
        Ok(Self {
            polls_per_flush: AtomicU32::new(config.polls_per_flush),
            cache_ipmmu: config.cache_ipmmu,
            pending: Mutex::new(Vec::with_capacity(IPMMU_CTX_MAX)),
            totals: Totals::default(),
        })
    }

    /// Changes the polls per flush (the lab sets it from its timing).
    pub fn set_polls_per_flush(&self, polls: u32) -> Result<(), IpmmuError> {
        if polls == 0 {
            return Err(IpmmuError::ZeroPolls);
        }
        self.polls_per_flush.store(polls, Ordering::Relaxed);
        Ok(())
    }

    /// The current polls per flush.
    pub fn polls_per_flush(&self) -> u32 {
        self.polls_per_flush.load(Ordering::Relaxed)
    }

    /// Totals since creation.
    pub fn stats(&self) -> IpmmuStats {
        let t = &self.totals;
        IpmmuStats {
            flushes: t.flushes.load(Ordering::Relaxed),
            polls: t.polls.load(Ordering::Relaxed),
            mmio_writes: t.mmio_writes.load(Ordering::Relaxed),
            mmio_reads: t.mmio_reads.load(Ordering::Relaxed),
            requests: t.requests.load(Ordering::Relaxed),
            timeouts: t.timeouts.load(Ordering::Relaxed),
        }
    }

    /// Flushes one context now: `ipmmu_tlb_invalidate` (read IMCTR, write it with FLUSH set)
    /// and `ipmmu_tlb_sync` (read IMCTR until FLUSH is clear or the loop times out).
    pub fn flush_context(&self, domain: DomainId, work: &mut WorkRecord) {
        let _ = domain;
        let wanted = self.polls_per_flush();
        let polls = u64::from(wanted.min(TLB_LOOP_TIMEOUT));
        let writes = if self.cache_ipmmu { 2 } else { 1 };
        work.inval_domains += 1;
        work.mmio_reads += 1 + polls;
        work.mmio_writes += writes;
        work.polls += polls;
        let t = &self.totals;
        t.flushes.fetch_add(1, Ordering::Relaxed);
        t.polls.fetch_add(polls, Ordering::Relaxed);
        t.mmio_reads.fetch_add(1 + polls, Ordering::Relaxed);
        t.mmio_writes.fetch_add(writes, Ordering::Relaxed);
        if wanted > TLB_LOOP_TIMEOUT {
            t.timeouts.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Records a pending flush of `domain`'s context. More distinct contexts than the
    /// hardware has ([`IPMMU_CTX_MAX`]) are flushed at once instead of queued (early is
    /// always safe: the page table was changed before the request).
    fn request(&self, domain: DomainId, work: &mut WorkRecord) {
        self.totals.requests.fetch_add(1, Ordering::Relaxed);
        let mut pending = self.pending.lock();
        if pending.contains(&domain) {
            return;
        }
        if pending.len() < IPMMU_CTX_MAX {
            pending.push(domain);
        } else {
            self.flush_context(domain, work);
        }
    }

    /// Whether a flush of `domain` is pending.
    pub fn is_pending(&self, domain: DomainId) -> bool {
        self.pending.lock().contains(&domain)
    }
}

impl Invalidator for IpmmuInvalidator {
    fn invalidate_range(&self, domain: DomainId, range: &GatherRange, work: &mut WorkRecord) {
        let _ = range;
        self.request(domain, work);
    }

    fn invalidate_walk(&self, domain: DomainId, table: &FreedTable, work: &mut WorkRecord) {
        let _ = table;
        self.request(domain, work);
    }

    fn invalidate_domain(&self, domain: DomainId, work: &mut WorkRecord) {
        self.request(domain, work);
    }

    /// Does the pending flushes (one per context). With nothing pending it costs nothing:
    /// the IPMMU has no separate completion wait, the flush itself waits.
    fn sync(&self, work: &mut WorkRecord) {
        let mut pending = self.pending.lock();
        for domain in pending.drain(..) {
            self.flush_context(domain, work);
        }
    }
}

// ---------------------------------------------------------------------------------------
// Domain constructor.
// ---------------------------------------------------------------------------------------

/// Builds a strict IPMMU domain: an [`IpmmuPageTable`] (default placement and cap), the
/// caller's IOVA allocator and the caller's [`IpmmuInvalidator`] (kept by the caller for its
/// statistics and poll setting). The aperture defaults to the table's 32-bit range, as
/// Linux's `aperture_end = DMA_BIT_MASK(32)`.
///
/// Errors: [`IpmmuError::LazyMode`] for [`DomainMode::Lazy`],
/// [`IpmmuError::NotTranslated`] for the direct modes, and whatever the DMA layer says
/// about the assembly (an allocator reaching above 4 GiB, a granule mismatch, ...).
pub fn ipmmu_domain(
    config: DomainConfig,
    allocator: Arc<dyn IovaAllocator>,
    invalidator: Arc<IpmmuInvalidator>,
) -> Result<Domain, IpmmuError> {
    ipmmu_domain_with_table(config, IpmmuTableConfig::default(), allocator, invalidator)
}

/// [`ipmmu_domain`] with the table's placement and cap chosen by the caller.
pub fn ipmmu_domain_with_table(
    config: DomainConfig,
    table: IpmmuTableConfig,
    allocator: Arc<dyn IovaAllocator>,
    invalidator: Arc<IpmmuInvalidator>,
) -> Result<Domain, IpmmuError> {
    match config.mode {
        DomainMode::Strict => {}
        DomainMode::Lazy => return Err(IpmmuError::LazyMode),
        mode => return Err(IpmmuError::NotTranslated { mode }),
    }
    let table = IpmmuPageTable::new(table)?;
    Ok(Domain::translated(
        config,
        Box::new(table),
        allocator,
        invalidator,
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::addr::{SZ_2M, SZ_4G, SZ_64K};
    use crate::dma::{Device, Direction};
    use crate::iova::linux::{IovaSpaceConfig, LinuxIovaAllocator};

    fn table() -> IpmmuPageTable {
        IpmmuPageTable::new(IpmmuTableConfig::default()).unwrap()
    }

    fn alloc_below(end: u64) -> Arc<dyn IovaAllocator> {
        Arc::new(LinuxIovaAllocator::new(IovaSpaceConfig::new(SZ_4K, Iova::new(end))).unwrap())
    }

    fn inv(polls: u32) -> Arc<IpmmuInvalidator> {
        Arc::new(
            IpmmuInvalidator::new(IpmmuFlushConfig {
                polls_per_flush: polls,
                cache_ipmmu: false,
            })
            .unwrap(),
        )
    }

    #[test]
    fn first_map_cleans_two_table_descriptors_and_one_leaf_line() {
        let mut t = table();
        let mut w = WorkRecord::new();
        t.map(
            Iova::new(0x1000),
            PhysAddr::new(0x8000),
            SZ_4K,
            Prot::READ,
            &mut w,
        )
        .unwrap();
        // Level-2 and level-3 tables linked in (a line each), one leaf line.
        assert_eq!(w.tables_allocated, 2);
        assert_eq!(w.cache_cleans, 2 + 1);
    }

    #[test]
    fn leaf_batches_count_the_lines_they_span() {
        let mut t = table();
        let mut w = WorkRecord::new();
        t.map(Iova::new(0), PhysAddr::new(0), SZ_4K, Prot::READ, &mut w)
            .unwrap();
        // 16 PTEs from index 16: 128 bytes on a line boundary = 2 lines.
        let mut w = WorkRecord::new();
        t.map(
            Iova::new(16 * SZ_4K),
            PhysAddr::new(0x10_0000),
            16 * SZ_4K,
            Prot::READ,
            &mut w,
        )
        .unwrap();
        assert_eq!((w.ptes_written, w.cache_cleans), (16, 2));
        // 8 PTEs from index 36: bytes 288..352 span lines 4 and 5.
        let mut w = WorkRecord::new();
        t.map(
            Iova::new(36 * SZ_4K),
            PhysAddr::new(0x20_0000),
            8 * SZ_4K,
            Prot::READ,
            &mut w,
        )
        .unwrap();
        assert_eq!((w.ptes_written, w.cache_cleans), (8, 2));
        // Unmapping the 16 cleans the same 2 lines.
        let mut w = WorkRecord::new();
        let mut g = UnmapGather::new();
        t.unmap(Iova::new(16 * SZ_4K), 16 * SZ_4K, &mut g, &mut w)
            .unwrap();
        assert_eq!((w.ptes_cleared, w.cache_cleans), (16, 2));
    }

    #[test]
    fn a_block_and_pages_in_one_map_are_separate_batches() {
        let mut t = table();
        let mut w = WorkRecord::new();
        // 2 MiB block at level 2, then 1 page in a new level-3 table.
        t.map(
            Iova::new(SZ_2M),
            PhysAddr::new(SZ_2M),
            SZ_2M + SZ_4K,
            Prot::READ,
            &mut w,
        )
        .unwrap();
        assert_eq!(w.tables_allocated, 2);
        assert_eq!(w.cache_cleans, 2 + 1 + 1);
    }

    #[test]
    fn an_unmap_that_empties_a_table_cleans_its_descriptor_too() {
        let mut t = table();
        let mut w = WorkRecord::new();
        t.map(
            Iova::new(0x1000),
            PhysAddr::new(0x8000),
            SZ_4K,
            Prot::READ,
            &mut w,
        )
        .unwrap();
        let mut w = WorkRecord::new();
        let mut g = UnmapGather::new();
        t.unmap(Iova::new(0x1000), SZ_4K, &mut g, &mut w).unwrap();
        assert_eq!(w.tables_freed, 2);
        assert_eq!(w.cache_cleans, 1 + 2);
    }

    #[test]
    fn iovas_above_4g_cannot_be_mapped() {
        let mut t = table();
        let mut w = WorkRecord::new();
        let e = t
            .map(
                Iova::new(SZ_4G),
                PhysAddr::new(0),
                SZ_4K,
                Prot::READ,
                &mut w,
            )
            .unwrap_err();
        assert!(matches!(e, PgTableError::OutOfRange { end, .. } if end == SZ_4G));
        assert_eq!(t.iova_range(), (Iova::new(0), Iova::new(SZ_4G)));
        let e = t
            .map(
                Iova::new(0),
                PhysAddr::new(1 << 40),
                SZ_4K,
                Prot::READ,
                &mut w,
            )
            .unwrap_err();
        assert!(matches!(e, PgTableError::PhysOutOfRange { bits: 40, .. }));
    }

    #[test]
    fn lazy_and_direct_modes_are_rejected() {
        let cfg = DomainConfig::new(DomainId(1), DomainMode::Lazy);
        let e = ipmmu_domain(cfg, alloc_below(SZ_4G), inv(1)).unwrap_err();
        assert_eq!(e, IpmmuError::LazyMode);
        assert_eq!(e.to_string(), "IPMMU-VMSA has no lazy mode");
        let cfg = DomainConfig::new(DomainId(1), DomainMode::Identity);
        assert!(matches!(
            ipmmu_domain(cfg, alloc_below(SZ_4G), inv(1)),
            Err(IpmmuError::NotTranslated { .. })
        ));
    }

    #[test]
    fn a_64_bit_device_still_gets_iovas_below_4g() {
        // The domain narrows even a 40-bit allocator to the 32-bit aperture.
        let cfg = DomainConfig::new(DomainId(1), DomainMode::Strict);
        let d = ipmmu_domain(cfg, alloc_below(1 << 40), inv(1)).unwrap();
        assert_eq!(d.aperture().unwrap().1, Iova::new(SZ_4G));
        let dev = Device::new(1, 64).unwrap();
        let mut w = WorkRecord::new();
        let m = d
            .map_page(
                &dev,
                PhysAddr::new(0x80_0000_0000),
                SZ_2M,
                Direction::ToDevice,
                0,
                &mut w,
            )
            .unwrap();
        assert!(m.dma_addr().0 + SZ_2M <= SZ_4G);
        d.unmap_page(m, 0, 0, &mut w).unwrap();
    }

    #[test]
    fn zero_polls_are_rejected() {
        assert_eq!(
            IpmmuInvalidator::new(IpmmuFlushConfig {
                polls_per_flush: 0,
                cache_ipmmu: false
            })
            .unwrap_err(),
            IpmmuError::ZeroPolls
        );
        assert!(inv(1).set_polls_per_flush(0).is_err());
    }

    #[test]
    fn every_unmap_is_one_flush_with_the_configured_polls() {
        let i = inv(3);
        let cfg = DomainConfig::new(DomainId(7), DomainMode::Strict);
        let d = ipmmu_domain(cfg, alloc_below(SZ_4G), i.clone()).unwrap();
        let dev = Device::new(1, 32).unwrap();
        let mut w = WorkRecord::new();
        let m = d
            .map_page(
                &dev,
                PhysAddr::new(0x10_0000),
                SZ_64K,
                Direction::ToDevice,
                0,
                &mut w,
            )
            .unwrap();
        assert_eq!(w.mmio_writes, 0, "mapping flushes nothing");
        let mut w = WorkRecord::new();
        d.unmap_page(m, 0, 0, &mut w).unwrap();
        // The unmap empties two tables: 1 range + 2 walk requests, one flush.
        assert_eq!(w.inval_domains, 1);
        assert_eq!((w.mmio_writes, w.mmio_reads, w.polls), (1, 4, 3));
        assert_eq!((w.inval_ranges, w.inval_walks, w.inval_syncs), (0, 0, 0));
        let s = i.stats();
        assert_eq!((s.flushes, s.requests, s.timeouts), (1, 3, 0));
        assert!(!i.is_pending(DomainId(7)));
    }

    #[test]
    fn polls_beyond_the_timeout_give_up_after_100_reads() {
        let i = IpmmuInvalidator::new(IpmmuFlushConfig {
            polls_per_flush: 250,
            cache_ipmmu: true,
        })
        .unwrap();
        let mut w = WorkRecord::new();
        i.invalidate_domain(DomainId(1), &mut w);
        assert!(w.is_empty());
        i.sync(&mut w);
        assert_eq!((w.polls, w.mmio_reads, w.mmio_writes), (100, 101, 2));
        assert_eq!(i.stats().timeouts, 1);
        // A sync with nothing pending costs nothing.
        let mut w = WorkRecord::new();
        i.sync(&mut w);
        assert!(w.is_empty());
    }

    #[test]
    fn more_contexts_than_the_hardware_has_are_flushed_at_once() {
        let i = inv(1);
        let mut w = WorkRecord::new();
        for id in 0..IPMMU_CTX_MAX as u32 + 1 {
            i.invalidate_domain(DomainId(id), &mut w);
        }
        assert_eq!(w.inval_domains, 1);
        i.sync(&mut w);
        assert_eq!(w.inval_domains, IPMMU_CTX_MAX as u64 + 1);
    }
}
