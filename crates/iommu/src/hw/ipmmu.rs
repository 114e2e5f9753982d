//! Renesas IPMMU-VMSA (R-Car Gen2/Gen3), as Linux's `ipmmu-vmsa.c` drives it.
//!
//! The IPMMU walks ARM LPAE stage-1 tables with a 32-bit input (IOVA) and a 40-bit output
//! address, 4 KiB pages with 2 MiB and 1 GiB blocks. Two things make it cost differently from
//! an SMMUv3:
//!
//! - **Its walker is not cache coherent** (Linux sets `coherent_walk = false`), so every
//!   batch of page-table writes is followed by a clean of the cache lines holding them.
//!   [`IpmmuPageTable`] wraps an [`LpaeTable`] and counts those cleans in cache lines
//!   (`cache_cleans`); the whole-page clean of a new table goes with `tables_allocated`.
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
//! Linux also flushes from `tlb_flush_walk` when an unmap removes a table whole (it covers
//! an aligned 2 MiB or 1 GiB span that was mapped with smaller pages): once per table entry
//! cleared, not for the tables freed below it. The LPAE table's default reclaim policy
//! ([`crate::pgtable::lpae::TableReclaim::WholeSpan`]) frees tables exactly then, so by
//! default each outermost removed table costs one more flush, done at the same sync
//! ([`IpmmuFlushConfig::flush_per_freed_table`]). Ordinary DMA unmaps, far smaller than a
//! table's span, remove no table and cost exactly one flush.
//!
//! There is no lazy mode: Linux's IPMMU driver has no flush queue support, and
//! [`ipmmu_domain`] rejects [`DomainMode::Lazy`] with [`IpmmuError::LazyMode`].

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::addr::{Iova, PhysAddr, Prot, SZ_4K};
use crate::dma::{DmaError, Domain, DomainConfig, DomainId, DomainMode, Invalidator};
use crate::iova::IovaAllocator;
use crate::pgtable::lpae::{spec, LpaeConfig, LpaeConfigError, LpaeTable, TableReclaim};
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
/// - each table descriptor cleared when an unmap removes a table whole: one line for the
///   outermost table of each removed subtree (the leaves and tables below it are not
///   touched, as in Linux's `__arm_lpae_unmap`).
///
/// A new table page is also cleaned whole when Linux allocates it (`dma_map_single` of the
/// page, 64 lines); that clean belongs to the table allocation and is charged through
/// `tables_allocated` (the R-Car H3 profile's `table_alloc` includes it), not counted here.
///
/// The leaf batches are read off the table itself (a walk to each leaf table touched and
/// the descriptors read back), since [`LpaeTable`] does not report its batches; the table
/// counts no cleans of its own (it is built coherent, which changes nothing else). Tables
/// are reclaimed as Linux does ([`TableReclaim::WholeSpan`]): only when an unmap covers
/// their whole span.
#[derive(Clone, Debug)]
pub struct IpmmuPageTable {
    inner: LpaeTable,
}

impl IpmmuPageTable {
    /// An empty table.
    pub fn new(config: IpmmuTableConfig) -> Result<Self, LpaeConfigError> {
        let mut lpae = LpaeConfig::new(SZ_4K, IPMMU_IAS, IPMMU_OAS)
            .with_coherent_walk(true)
            .with_table_reclaim(TableReclaim::WholeSpan);
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
    /// batch (one batch per run of leaves in one table). With `skip_covered`, batches in a
    /// table whose whole span the range covers are left out: an unmap removes such a table
    /// by clearing the descriptor above it and never touches its leaves (Linux's
    /// `__arm_lpae_unmap` at the block level, which [`TableReclaim::WholeSpan`] mirrors).
    /// Reads the table, counts nothing.
    fn leaf_lines(&self, iova: u64, size: u64, skip_covered: bool) -> u64 {
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
            let span = table_len as u64 * tr.page_size;
            let span_start = x & !(span - 1);
            let covered = skip_covered
                && step.table_pa != t.root_pa()
                && span_start >= iova
                && span_start + span <= end;
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
            if !covered {
                lines += Self::lines(step.desc_pa().get(), n as u64 * 8);
            }
        }
        lines
    }
}

/// How many of `ranges` (IOVA spans of removed tables, each either nested in or disjoint
/// from every other, as table spans are) are not inside another one.
fn outermost(ranges: &mut [(u64, u64)]) -> usize {
    ranges.sort_unstable_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(&a.1)));
    let mut count = 0;
    let mut cover_end = None;
    for &(_, end) in ranges.iter() {
        if cover_end.is_some_and(|c| end <= c) {
            continue;
        }
        count += 1;
        cover_end = Some(end);
    }
    count
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
        work.cache_cleans += new_tables + self.leaf_lines(iova.get(), size, false);
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
            self.leaf_lines(iova.get(), size, true)
        };
        let before = gather.freed_tables.len();
        self.inner.unmap(iova, size, gather, work)?;
        // One line per removed subtree: the descriptor cleared above its outermost table.
        let removed = &gather.freed_tables[before..];
        let descriptors = if removed.is_empty() {
            0
        } else {
            let mut spans: Vec<(u64, u64)> = removed
                .iter()
                .map(|f| (f.iova.get(), f.iova.get() + f.size))
                .collect();
            outermost(&mut spans) as u64
        };
        work.cache_cleans += leaf + descriptors;
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
    /// Flush once more for every table an unmap removes whole, as Linux's
    /// `tlb_flush_walk` (-> `ipmmu_tlb_flush_all`) does from inside the unmap. Off: the
    /// removal is covered by the unmap's single flush.
    pub flush_per_freed_table: bool,
}

impl Default for IpmmuFlushConfig {
    /// One poll, one register write, Linux's walk flushes.
    fn default() -> Self {
        Self {
            polls_per_flush: 1,
            cache_ipmmu: false,
            flush_per_freed_table: true,
        }
    }
}

/// Running totals of an [`IpmmuInvalidator`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IpmmuStats {
    /// Whole-context flushes (both kinds).
    pub flushes: u64,
    /// Of those, flushes for removed tables (`tlb_flush_walk`).
    pub walk_flushes: u64,
    /// `IMCTR` reads while waiting for the FLUSH bit.
    pub polls: u64,
    /// Register writes.
    pub mmio_writes: u64,
    /// Register reads (the read-modify-write plus the polls).
    pub mmio_reads: u64,
    /// Invalidation requests received.
    pub requests: u64,
    /// Flushes whose wait gave up after [`TLB_LOOP_TIMEOUT`] reads.
    pub timeouts: u64,
}

#[derive(Debug, Default)]
struct Totals {
    flushes: AtomicU64,
    walk_flushes: AtomicU64,
    polls: AtomicU64,
    mmio_writes: AtomicU64,
    mmio_reads: AtomicU64,
    requests: AtomicU64,
    timeouts: AtomicU64,
}

/// Most removed-table ranges held for one sync: a 32-bit space has 2048 leaf tables of
/// 2 MiB, so no unmap of a 32-bit context can overflow it. Beyond it a walk flush is done
/// at once.
pub const MAX_PENDING_WALKS: usize = 2048;

/// What the next sync must flush.
#[derive(Debug, Default)]
struct Pending {
    /// Contexts with an unmap flush pending.
    contexts: Vec<DomainId>,
    /// Removed tables, as the IOVA ranges they translated, keeping only the outermost: the
    /// gather lists a subtree child first, and Linux flushes once per table entry it clears,
    /// not for the tables freed below it.
    walks: Vec<(DomainId, u64, u64)>,
}

/// The IPMMU's invalidation. See the module docs.
///
/// Every request becomes a pending flush of its context, done at the next
/// [`Invalidator::sync`] (Linux's `iotlb_sync`): one flush per context per unmap however many
/// ranges it gathered. With [`IpmmuFlushConfig::flush_per_freed_table`], each table the unmap
/// removed whole (the outermost of each removed subtree) costs one flush more, Linux's
/// `tlb_flush_walk`.
///
/// One flush costs, in the caller's [`WorkRecord`]: `inval_domains` 1; `mmio_reads`
/// 1 + polls (Linux reads `IMCTR` to set the bit, then polls it); `mmio_writes` 1, or 2
/// behind a cache IPMMU; `polls` the configured polls (capped at [`TLB_LOOP_TIMEOUT`]).
/// Requests themselves count nothing.
#[derive(Debug)]
pub struct IpmmuInvalidator {
    polls_per_flush: AtomicU32,
    cache_ipmmu: bool,
    flush_per_freed_table: bool,
    /// Holding this lock across the flushes makes a sync that finds nothing pending wait for
    /// a flush another CPU is doing.
    pending: Mutex<Pending>,
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
            flush_per_freed_table: config.flush_per_freed_table,
            pending: Mutex::new(Pending {
                contexts: Vec::with_capacity(IPMMU_CTX_MAX),
                walks: Vec::new(),
            }),
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
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        IpmmuStats {
            flushes: l(&t.flushes),
            walk_flushes: l(&t.walk_flushes),
            polls: l(&t.polls),
            mmio_writes: l(&t.mmio_writes),
            mmio_reads: l(&t.mmio_reads),
            requests: l(&t.requests),
            timeouts: l(&t.timeouts),
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

    fn flush_walk(&self, domain: DomainId, work: &mut WorkRecord) {
        self.totals.walk_flushes.fetch_add(1, Ordering::Relaxed);
        self.flush_context(domain, work);
    }

    /// Records a pending flush of `domain`'s context. More distinct contexts than the
    /// hardware has ([`IPMMU_CTX_MAX`]) are flushed at once instead of queued (early is
    /// always safe: the page table was changed before the request).
    fn request(&self, pending: &mut Pending, domain: DomainId, work: &mut WorkRecord) {
        self.totals.requests.fetch_add(1, Ordering::Relaxed);
        if pending.contexts.contains(&domain) {
            return;
        }
        if pending.contexts.len() < IPMMU_CTX_MAX {
            pending.contexts.push(domain);
        } else {
            self.flush_context(domain, work);
        }
    }

    /// Whether a flush of `domain` is pending.
    pub fn is_pending(&self, domain: DomainId) -> bool {
        let p = self.pending.lock();
        p.contexts.contains(&domain) || p.walks.iter().any(|w| w.0 == domain)
    }
}

impl Invalidator for IpmmuInvalidator {
    fn invalidate_range(&self, domain: DomainId, range: &GatherRange, work: &mut WorkRecord) {
        let _ = range;
        let mut pending = self.pending.lock();
        self.request(&mut pending, domain, work);
    }

    fn invalidate_walk(&self, domain: DomainId, table: &FreedTable, work: &mut WorkRecord) {
        let mut pending = self.pending.lock();
        self.request(&mut pending, domain, work);
        if !self.flush_per_freed_table {
            return;
        }
        let (start, end) = (table.iova.get(), table.iova.get() + table.size);
        let walks = &mut pending.walks;
        if walks
            .iter()
            .any(|&(d, s, e)| d == domain && s <= start && end <= e)
        {
            return;
        }
        walks.retain(|&(d, s, e)| !(d == domain && start <= s && e <= end));
        if walks.len() < MAX_PENDING_WALKS {
            walks.push((domain, start, end));
        } else {
            self.flush_walk(domain, work);
        }
    }

    fn invalidate_domain(&self, domain: DomainId, work: &mut WorkRecord) {
        let mut pending = self.pending.lock();
        self.request(&mut pending, domain, work);
    }

    /// Does the pending flushes: one per removed table (outermost), then one per context.
    /// With nothing pending it costs nothing: the IPMMU has no separate completion wait, the
    /// flush itself waits.
    fn sync(&self, work: &mut WorkRecord) {
        let mut pending = self.pending.lock();
        for (domain, _, _) in std::mem::take(&mut pending.walks) {
            self.flush_walk(domain, work);
        }
        for domain in pending.contexts.drain(..) {
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

    /// Maps `size` bytes at `iova` to `pa`, read-only.
    fn map_read(
        t: &mut IpmmuPageTable,
        iova: u64,
        pa: u64,
        size: u64,
        w: &mut WorkRecord,
    ) -> Result<(), PgTableError> {
        t.map(Iova::new(iova), PhysAddr::new(pa), size, Prot::READ, w)
    }

    fn alloc_below(end: u64) -> Arc<dyn IovaAllocator> {
        Arc::new(LinuxIovaAllocator::new(IovaSpaceConfig::new(SZ_4K, Iova::new(end))).unwrap())
    }

    fn inv(polls: u32) -> Arc<IpmmuInvalidator> {
        Arc::new(
            IpmmuInvalidator::new(IpmmuFlushConfig {
                polls_per_flush: polls,
                cache_ipmmu: false,
                ..Default::default()
            })
            .unwrap(),
        )
    }

    #[test]
    fn first_map_cleans_two_table_descriptors_and_one_leaf_line() {
        let mut t = table();
        let mut w = WorkRecord::new();
        map_read(&mut t, 0x1000, 0x8000, SZ_4K, &mut w).unwrap();
        // Level-2 and level-3 tables linked in (a line each), one leaf line.
        assert_eq!(w.tables_allocated, 2);
        assert_eq!(w.cache_cleans, 2 + 1);
    }

    #[test]
    fn leaf_batches_count_the_lines_they_span() {
        let mut t = table();
        let mut w = WorkRecord::new();
        map_read(&mut t, 0, 0, SZ_4K, &mut w).unwrap();
        // 16 PTEs from index 16: 128 bytes on a line boundary = 2 lines.
        let mut w = WorkRecord::new();
        map_read(&mut t, 16 * SZ_4K, 0x10_0000, 16 * SZ_4K, &mut w).unwrap();
        assert_eq!((w.ptes_written, w.cache_cleans), (16, 2));
        // 8 PTEs from index 36: bytes 288..352 span lines 4 and 5.
        let mut w = WorkRecord::new();
        map_read(&mut t, 36 * SZ_4K, 0x20_0000, 8 * SZ_4K, &mut w).unwrap();
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
        map_read(&mut t, SZ_2M, SZ_2M, SZ_2M + SZ_4K, &mut w).unwrap();
        assert_eq!(w.tables_allocated, 2);
        assert_eq!(w.cache_cleans, 2 + 1 + 1);
    }

    #[test]
    fn an_unmap_that_empties_a_table_keeps_it() {
        let mut t = table();
        let mut w = WorkRecord::new();
        map_read(&mut t, 0x1000, 0x8000, SZ_4K, &mut w).unwrap();
        let mut w = WorkRecord::new();
        let mut g = UnmapGather::new();
        t.unmap(Iova::new(0x1000), SZ_4K, &mut g, &mut w).unwrap();
        assert_eq!((w.tables_freed, w.cache_cleans), (0, 1));
        assert!(g.freed_tables.is_empty());
    }

    #[test]
    fn removing_a_whole_table_cleans_only_the_descriptor_above_it() {
        let mut t = table();
        let mut w = WorkRecord::new();
        // 2 MiB at a 2 MiB-aligned IOVA but a 4 KiB-aligned PA: one full leaf table.
        map_read(&mut t, SZ_2M, SZ_4K, SZ_2M, &mut w).unwrap();
        assert_eq!((w.ptes_written, w.cache_cleans), (512 + 2, 2 + 64));
        let mut w = WorkRecord::new();
        let mut g = UnmapGather::new();
        t.unmap(Iova::new(SZ_2M), SZ_2M, &mut g, &mut w).unwrap();
        assert_eq!((w.tables_freed, w.cache_cleans), (1, 1));
        // Two adjacent 2 MiB spans and a page before them: the page's batch, two descriptors.
        let mut w = WorkRecord::new();
        map_read(&mut t, SZ_2M - SZ_4K, SZ_4K, 2 * SZ_2M + SZ_4K, &mut w).unwrap();
        let mut w = WorkRecord::new();
        let mut g = UnmapGather::new();
        t.unmap(Iova::new(SZ_2M - SZ_4K), 2 * SZ_2M + SZ_4K, &mut g, &mut w)
            .unwrap();
        assert_eq!((w.tables_freed, w.cache_cleans), (2, 1 + 2));
    }

    #[test]
    fn outermost_counts_only_the_top_of_each_subtree() {
        let mut spans = [
            (0, 0x20_0000),
            (0x20_0000, 0x40_0000),
            (0, 0x4000_0000),
            (0x8000_0000, 0x8020_0000),
        ];
        assert_eq!(outermost(&mut spans), 2);
        assert_eq!(outermost(&mut []), 0);
    }

    #[test]
    fn iovas_above_4g_cannot_be_mapped() {
        let mut t = table();
        let mut w = WorkRecord::new();
        let e = map_read(&mut t, SZ_4G, 0, SZ_4K, &mut w).unwrap_err();
        assert!(matches!(e, PgTableError::OutOfRange { end, .. } if end == SZ_4G));
        assert_eq!(t.iova_range(), (Iova::new(0), Iova::new(SZ_4G)));
        let e = map_read(&mut t, 0, 1 << 40, SZ_4K, &mut w).unwrap_err();
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
                cache_ipmmu: false,
                ..Default::default()
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
        // One gathered range, one flush; the emptied tables stay (Linux's reclaim).
        assert_eq!(w.inval_domains, 1);
        assert_eq!((w.mmio_writes, w.mmio_reads, w.polls), (1, 4, 3));
        assert_eq!((w.inval_ranges, w.inval_walks, w.inval_syncs), (0, 0, 0));
        let s = i.stats();
        assert_eq!((s.flushes, s.requests, s.timeouts), (1, 1, 0));
        assert!(!i.is_pending(DomainId(7)));
    }

    #[test]
    fn removing_whole_tables_adds_one_walk_flush_per_subtree() {
        for (per_table, flushes) in [(true, 3), (false, 1)] {
            let i = Arc::new(
                IpmmuInvalidator::new(IpmmuFlushConfig {
                    flush_per_freed_table: per_table,
                    ..Default::default()
                })
                .unwrap(),
            );
            let cfg = DomainConfig::new(DomainId(7), DomainMode::Strict);
            let d = ipmmu_domain(cfg, alloc_below(SZ_4G), i.clone()).unwrap();
            let dev = Device::new(1, 32).unwrap();
            let mut w = WorkRecord::new();
            // 4 MiB from a 4 KiB-aligned PA: the size-aligned IOVA covers two leaf tables
            // whole, mapped with 4 KiB pages.
            let m = d
                .map_page(
                    &dev,
                    PhysAddr::new(SZ_4K),
                    2 * SZ_2M,
                    Direction::ToDevice,
                    0,
                    &mut w,
                )
                .unwrap();
            let mut w = WorkRecord::new();
            d.unmap_page(m, 0, 0, &mut w).unwrap();
            assert_eq!(w.tables_freed, 2);
            assert_eq!(
                w.inval_domains, flushes,
                "flush_per_freed_table {per_table}"
            );
            assert_eq!(i.stats().walk_flushes, flushes - 1);
        }
    }

    #[test]
    fn a_removed_subtree_is_one_walk_flush() {
        let i = inv(1);
        let mut w = WorkRecord::new();
        let t = |level, iova, size| FreedTable {
            table_pa: PhysAddr::new(0),
            level,
            iova: Iova::new(iova),
            size,
        };
        // Children first, then their parent, then an unrelated table.
        i.invalidate_walk(DomainId(1), &t(3, 0, SZ_2M), &mut w);
        i.invalidate_walk(DomainId(1), &t(3, SZ_2M, SZ_2M), &mut w);
        i.invalidate_walk(DomainId(1), &t(2, 0, 1 << 30), &mut w);
        i.invalidate_walk(DomainId(1), &t(3, 1 << 31, SZ_2M), &mut w);
        assert!(w.is_empty());
        i.sync(&mut w);
        assert_eq!(w.inval_domains, 2 + 1);
        assert_eq!(i.stats().walk_flushes, 2);
    }

    #[test]
    fn polls_beyond_the_timeout_give_up_after_100_reads() {
        let i = IpmmuInvalidator::new(IpmmuFlushConfig {
            polls_per_flush: 250,
            cache_ipmmu: true,
            ..Default::default()
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
