//! Invalidation: how a domain tells the IOMMU that translations it may cache are gone.
//!
//! The DMA layer decides *when* to invalidate (now, in strict mode; in batches, in lazy
//! mode); an [`Invalidator`] decides *how*: the hardware models (SMMUv3 command queue,
//! IPMMU register flush, SBA purge, TCE hypercalls) implement it. [`ImmediateInvalidator`]
//! is the functional stand-in: every request completes at once, and it only counts.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::pgtable::{FreedTable, GatherRange};
use crate::work::WorkRecord;

use super::DomainId;

/// Issues IOTLB and walk-cache invalidations for domains. Requests may complete
/// asynchronously; they are only known complete once [`Invalidator::sync`] returns.
pub trait Invalidator: Send + Sync {
    /// Invalidates the leaf translations of one gathered range of `domain`.
    fn invalidate_range(&self, domain: DomainId, range: &GatherRange, work: &mut WorkRecord);

    /// Invalidates walk-cache entries that may point into a freed table page of `domain`.
    fn invalidate_walk(&self, domain: DomainId, table: &FreedTable, work: &mut WorkRecord);

    /// Invalidates every cached translation of `domain` (by ASID / context).
    fn invalidate_domain(&self, domain: DomainId, work: &mut WorkRecord);

    /// Waits until every invalidation issued before it has completed.
    fn sync(&self, work: &mut WorkRecord);

    /// [`Invalidator::invalidate_range`] of `range` followed by [`Invalidator::sync`]:
    /// the last invalidation of a strict unmap and its sync, in one call. Implementations
    /// may override it to do both at once, but must issue exactly what the two calls in
    /// turn issue (the default body), in the same order and batches, with the same counts.
    #[inline]
    fn invalidate_range_and_sync(
        &self,
        domain: DomainId,
        range: &GatherRange,
        work: &mut WorkRecord,
    ) {
        self.invalidate_range(domain, range, work);
        self.sync(work);
    }
}

/// Totals of what an [`ImmediateInvalidator`] was asked to do.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct InvalStats {
    /// Range invalidations.
    pub ranges: u64,
    /// Pages (entries of the range's page size) covered by range invalidations.
    pub pages: u64,
    /// Walk-cache invalidations.
    pub walks: u64,
    /// Whole-domain invalidations.
    pub domains: u64,
    /// Syncs.
    pub syncs: u64,
}

/// An invalidator whose requests complete immediately. It counts each request in the
/// caller's [`WorkRecord`] (`inval_ranges`, `inval_pages`, `inval_walks`, `inval_domains`,
/// `inval_syncs`) and keeps running totals ([`ImmediateInvalidator::stats`]).
#[derive(Debug, Default)]
pub struct ImmediateInvalidator {
    ranges: AtomicU64,
    pages: AtomicU64,
    walks: AtomicU64,
    domains: AtomicU64,
    syncs: AtomicU64,
}

impl ImmediateInvalidator {
    /// A new invalidator with zero totals.
    pub fn new() -> Self {
        Self::default()
    }

    /// Totals since creation.
    pub fn stats(&self) -> InvalStats {
        InvalStats {
            ranges: self.ranges.load(Ordering::Relaxed),
            pages: self.pages.load(Ordering::Relaxed),
            walks: self.walks.load(Ordering::Relaxed),
            domains: self.domains.load(Ordering::Relaxed),
            syncs: self.syncs.load(Ordering::Relaxed),
        }
    }
}

impl Invalidator for ImmediateInvalidator {
    fn invalidate_range(&self, _domain: DomainId, range: &GatherRange, work: &mut WorkRecord) {
        let pages = range.size / range.page_size.max(1);
        work.inval_ranges += 1;
        work.inval_pages += pages;
        self.ranges.fetch_add(1, Ordering::Relaxed);
        self.pages.fetch_add(pages, Ordering::Relaxed);
    }

    fn invalidate_walk(&self, _domain: DomainId, _table: &FreedTable, work: &mut WorkRecord) {
        work.inval_walks += 1;
        self.walks.fetch_add(1, Ordering::Relaxed);
    }

    fn invalidate_domain(&self, _domain: DomainId, work: &mut WorkRecord) {
        work.inval_domains += 1;
        self.domains.fetch_add(1, Ordering::Relaxed);
    }

    fn sync(&self, work: &mut WorkRecord) {
        work.inval_syncs += 1;
        self.syncs.fetch_add(1, Ordering::Relaxed);
    }
}

/// Proof that an invalidation sync has completed: made only by the DMA layer right after an
/// [`Invalidator::sync`] returns, and spent to release one IOVA range whose invalidation was
/// issued before it (see [`super::flush_queue::FreeableIova`]).
#[derive(Debug)]
#[must_use = "a completed sync is what allows the IOVA to be freed"]
pub struct SyncCompleted(());

/// Waits for `invalidator`'s outstanding invalidations and returns the proof.
pub(crate) fn sync(invalidator: &dyn Invalidator, work: &mut WorkRecord) -> SyncCompleted {
    invalidator.sync(work);
    SyncCompleted(())
}

/// Invalidates `range` of `domain`, waits for every invalidation issued before (through
/// [`Invalidator::invalidate_range_and_sync`]) and returns the proof.
pub(crate) fn invalidate_range_and_sync(
    invalidator: &dyn Invalidator,
    domain: DomainId,
    range: &GatherRange,
    work: &mut WorkRecord,
) -> SyncCompleted {
    invalidator.invalidate_range_and_sync(domain, range, work);
    SyncCompleted(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::addr::{Iova, PhysAddr, SZ_2M, SZ_4K};

    #[test]
    fn immediate_invalidator_counts_ranges_in_pages_of_their_size() {
        let inv = ImmediateInvalidator::new();
        let mut w = WorkRecord::new();
        let r = GatherRange {
            start: Iova::new(0x1000),
            size: 3 * SZ_4K,
            page_size: SZ_4K,
        };
        inv.invalidate_range(DomainId(1), &r, &mut w);
        let b = GatherRange {
            start: Iova::new(0),
            size: 2 * SZ_2M,
            page_size: SZ_2M,
        };
        inv.invalidate_range(DomainId(1), &b, &mut w);
        assert_eq!((w.inval_ranges, w.inval_pages), (2, 5));
        assert_eq!(
            inv.stats(),
            InvalStats {
                ranges: 2,
                pages: 5,
                ..Default::default()
            }
        );
    }

    #[test]
    fn immediate_invalidator_counts_walks_domains_and_syncs() {
        let inv = ImmediateInvalidator::new();
        let mut w = WorkRecord::new();
        let t = FreedTable {
            table_pa: PhysAddr::new(0),
            level: 3,
            iova: Iova::new(0),
            size: SZ_2M,
        };
        inv.invalidate_walk(DomainId(2), &t, &mut w);
        inv.invalidate_domain(DomainId(2), &mut w);
        let _done = sync(&inv, &mut w);
        assert_eq!((w.inval_walks, w.inval_domains, w.inval_syncs), (1, 1, 1));
        assert_eq!(
            inv.stats(),
            InvalStats {
                walks: 1,
                domains: 1,
                syncs: 1,
                ..Default::default()
            }
        );
    }
}
