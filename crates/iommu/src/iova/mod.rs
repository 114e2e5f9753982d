//! IOVA allocators: who hands out ranges of I/O virtual address space, behind one trait.
//!
//! - [`linux`]: the Linux design: a balanced tree of allocated ranges, top-down first fit from
//!   a cached cursor (one for 32-bit limited requests), the O(1) 32-bit fast-fail.
//! - [`magazine`]: per-CPU magazine caches ("rcache") over any allocator.
//! - [`gaptree`]: iolab's own: a tree augmented with the largest free gap per subtree, so
//!   allocation is O(log n) in the worst case, with the same contract as [`linux`].
//! - [`power`]: the POWER TCE bitmap with four per-CPU-hashed pools and a large pool.
//! - [`sba`]: the HP zx1 SBA resource bitmap: power-of-two sizes, circular search from a hint.
//!
//! All allocators work in pages of their granule and address IOVA space in bytes ([`Iova`]).
//! They are thread-safe (`&self`); locks taken are counted in the [`WorkRecord`].

pub mod gaptree;
pub mod linux;
pub mod magazine;
pub mod power;
pub mod sba;

use crate::addr::Iova;
use crate::work::WorkRecord;

/// Why an allocation or free failed. A failed call leaves the allocator unchanged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IovaError {
    /// No free range of the requested size below the limit.
    #[error("IOVA space exhausted: no free range of {pages} pages below {limit:#x}")]
    Exhausted {
        /// Pages requested.
        pages: u64,
        /// The exclusive upper bound requested.
        limit: u64,
    },
    /// A request for zero pages, or more than the allocator can ever hold.
    #[error("Invalid IOVA allocation size of {pages} pages")]
    BadSize {
        /// Pages requested.
        pages: u64,
    },
    /// The limit is below the allocator's first usable IOVA.
    #[error("IOVA limit {limit:#x} is below the allocator's start {start:#x}")]
    LimitTooLow {
        /// The exclusive upper bound requested.
        limit: u64,
        /// The allocator's first usable IOVA.
        start: u64,
    },
    /// A free of a range that is not currently allocated exactly as given.
    #[error("IOVA range {start:#x} of {pages} pages is not allocated")]
    NotAllocated {
        /// Start of the range passed to free.
        start: u64,
        /// Pages passed to free.
        pages: u64,
    },
}

/// A request for IOVA space.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllocRequest {
    /// Number of granule-sized pages wanted (at least 1).
    pub pages: u64,
    /// Exclusive upper bound: the whole range must lie below this IOVA (from the device's
    /// DMA mask: a 32-bit device passes 4 GiB).
    pub limit: Iova,
    /// Align the range to the next power of two of `pages` (Linux's `size_aligned`).
    pub size_aligned: bool,
    /// The CPU making the request (per-CPU caches and pool hashing use it).
    pub cpu: usize,
}

impl AllocRequest {
    /// A size-aligned request for `pages` pages below `limit` from `cpu`.
    pub fn new(pages: u64, limit: Iova, cpu: usize) -> Self {
        Self {
            pages,
            limit,
            size_aligned: true,
            cpu,
        }
    }
}

/// A range of IOVA space handed out by an allocator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IovaBlock {
    /// First IOVA of the range.
    pub start: Iova,
    /// Length in granule-sized pages.
    pub pages: u64,
}

impl IovaBlock {
    /// Length in bytes for a given granule.
    pub fn bytes(&self, granule: u64) -> u64 {
        self.pages * granule
    }
}

/// An IOVA allocator. See the module docs for the designs.
pub trait IovaAllocator: Send + Sync {
    /// A short name for reports and benchmarks ("linux", "magazine", "gaptree", ...).
    fn name(&self) -> &'static str;

    /// The page size the allocator counts in.
    fn granule(&self) -> u64;

    /// The usable IOVA range, as `(first, one past last)`. IOVA 0 is never handed out.
    fn range(&self) -> (Iova, Iova);

    /// Allocates a range. Ranges handed out never overlap each other, lie within
    /// [`IovaAllocator::range`] and below `req.limit`, and are aligned as requested.
    fn alloc(&self, req: AllocRequest, work: &mut WorkRecord) -> Result<IovaBlock, IovaError>;

    /// As [`IovaAllocator::alloc`], but a cache in front of the allocator that finds it
    /// exhausted does not flush itself and retry (Linux `alloc_iova_fast` with
    /// `flush_rcache = false`: dma-iommu's 32-bit-first try). Allocators without such a
    /// cache allocate as `alloc` does.
    fn alloc_without_flush(
        &self,
        req: AllocRequest,
        work: &mut WorkRecord,
    ) -> Result<IovaBlock, IovaError> {
        self.alloc(req, work)
    }

    /// Returns a range to the allocator. `cpu` is the CPU freeing it.
    ///
    /// The caller promises the IOMMU can no longer reach the range (its invalidation has
    /// completed); the DMA layer enforces that with types, see `dma::flush_queue`.
    fn free(&self, block: IovaBlock, cpu: usize, work: &mut WorkRecord) -> Result<(), IovaError>;

    /// Returns many ranges at once, as a magazine cache does when it flushes a magazine back
    /// (Linux `iova_magazine_free_pfns`). Allocators with one lock take it once for the whole
    /// batch. Ranges that are not allocated are skipped; returns how many were freed.
    fn free_batch(&self, blocks: &[IovaBlock], cpu: usize, work: &mut WorkRecord) -> usize {
        blocks
            .iter()
            .filter(|b| self.free(**b, cpu, work).is_ok())
            .count()
    }

    /// Number of ranges currently handed out and not freed (cached ranges count as free).
    fn live_blocks(&self) -> usize;

    /// Releases any per-CPU or cached state back to the underlying allocator, so that
    /// after everything has been freed the allocator is back to empty.
    fn drain_caches(&self, work: &mut WorkRecord) {
        let _ = work;
    }
}

/// Checks shared by the allocators' unit tests.
#[cfg(test)]
pub(crate) mod test_support {
    use super::{IovaAllocator, IovaBlock, IovaError};
    use crate::work::WorkRecord;

    /// Frees each of `bad` (blocks that are not allocated exactly as given) and asserts that
    /// every one is refused with [`IovaError::NotAllocated`] and that the allocator still has
    /// exactly one live block.
    pub(crate) fn assert_bad_frees_refused(
        a: &impl IovaAllocator,
        bad: &[IovaBlock],
        w: &mut WorkRecord,
    ) {
        for &x in bad {
            assert!(
                matches!(a.free(x, 0, w), Err(IovaError::NotAllocated { .. })),
                "{x:?}"
            );
        }
        assert_eq!(a.live_blocks(), 1);
    }
}
