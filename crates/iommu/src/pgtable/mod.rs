//! IO page tables: the formats an IOMMU walks to translate an IOVA, behind one trait.
//!
//! - [`lpae`]: ARM VMSAv8-64 long-descriptor tables (SMMUv3, IPMMU-VMSA): 4K/16K/64K
//!   granules, 32- to 48-bit inputs, block mappings.
//! - [`tce`]: the POWER TCE table: one level of 8-byte entries over a DMA window.
//! - [`sba_pdir`]: the HP zx1 SBA I/O page directory: one level, valid bit plus page number.
//!
//! A table never issues invalidation itself. [`IoPageTable::unmap`] reports what it removed
//! into an [`UnmapGather`]; the caller (the DMA layer, or a hardware model) decides how and
//! when to invalidate it.

pub mod lpae;
pub mod sba_pdir;
pub mod tce;

use crate::addr::{Iova, PhysAddr, Prot};
use crate::work::WorkRecord;

/// Why a page-table operation failed. The table is unchanged when an error is returned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PgTableError {
    /// An address or size is not a multiple of the table's smallest page size.
    #[error(
        "Address {addr:#x} or size {size:#x} is not aligned to the {granule:#x}-byte page size"
    )]
    Misaligned {
        /// The offending address (IOVA or physical).
        addr: u64,
        /// The size of the operation.
        size: u64,
        /// The smallest page size of the table.
        granule: u64,
    },
    /// The IOVA range lies outside the table's input range or window.
    #[error("IOVA range {iova:#x}+{size:#x} is outside the table's range {start:#x}..{end:#x}")]
    OutOfRange {
        /// Start of the requested range.
        iova: u64,
        /// Size of the requested range.
        size: u64,
        /// First IOVA the table covers.
        start: u64,
        /// One past the last IOVA the table covers.
        end: u64,
    },
    /// The physical address does not fit the format's output address size.
    #[error("Physical address {pa:#x} does not fit in {bits} output address bits")]
    PhysOutOfRange {
        /// The offending physical address.
        pa: u64,
        /// The format's output address size.
        bits: u32,
    },
    /// Part of the range is already mapped.
    #[error("IOVA {iova:#x} is already mapped")]
    AlreadyMapped {
        /// The first IOVA found mapped.
        iova: u64,
    },
    /// Part of the range is not mapped.
    #[error("IOVA {iova:#x} is not mapped")]
    NotMapped {
        /// The first IOVA found unmapped.
        iova: u64,
    },
    /// The range would cut a block mapping in two (partial unmap of a large page).
    #[error("Unmapping {iova:#x}+{size:#x} would split the {block_size:#x}-byte block at {block_iova:#x}")]
    SplitsBlock {
        /// Start of the requested range.
        iova: u64,
        /// Size of the requested range.
        size: u64,
        /// Start of the block that would be split.
        block_iova: u64,
        /// Size of that block.
        block_size: u64,
    },
    /// A mapping must grant at least one permission.
    #[error("A mapping must allow read, write or both")]
    NoPermission,
    /// The table cannot grow further (its cap on table pages was reached).
    #[error("Page-table page limit of {limit} reached")]
    TooManyTables {
        /// The cap.
        limit: usize,
    },
}

/// One translation found by a lookup.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Translation {
    /// The physical address the IOVA translates to (page base plus offset).
    pub pa: PhysAddr,
    /// Permissions of the mapping.
    pub prot: Prot,
    /// Size of the page or block that maps it.
    pub page_size: u64,
}

/// A contiguous IOVA range removed at one page size: the unit of leaf invalidation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GatherRange {
    /// First IOVA removed.
    pub start: Iova,
    /// Bytes removed (a multiple of `page_size`).
    pub size: u64,
    /// The page size of every entry removed in this range.
    pub page_size: u64,
}

impl GatherRange {
    /// One past the last IOVA of the range.
    pub fn end(&self) -> Iova {
        self.start.add(self.size)
    }
}

/// A page-table page freed by an unmap. Walk caches may still hold it, so it needs a
/// non-leaf (walk) invalidation before the memory can be reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FreedTable {
    /// Physical address of the freed table page.
    pub table_pa: PhysAddr,
    /// The level of the table (0 is the root level of LPAE; formats with one level never free).
    pub level: u32,
    /// The IOVA range the table translated.
    pub iova: Iova,
    /// Size of that IOVA range.
    pub size: u64,
}

/// What an unmap removed: leaf ranges to invalidate and table pages to invalidate and free.
///
/// Ranges are merged while they stay contiguous and of one page size; a disjoint range or a
/// different page size starts a new [`GatherRange`] (Linux syncs the gather at that point).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UnmapGather {
    /// Leaf ranges removed, in the order they were removed.
    pub ranges: Vec<GatherRange>,
    /// Table pages freed.
    pub freed_tables: Vec<FreedTable>,
}

impl UnmapGather {
    /// An empty gather.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records the removal of `size` bytes at `start` mapped with `page_size` pages, extending
    /// the last range when contiguous and of the same page size.
    #[inline]
    pub fn add(&mut self, start: Iova, size: u64, page_size: u64) {
        if let Some(last) = self.ranges.last_mut() {
            if last.page_size == page_size && last.end() == start {
                last.size += size;
                return;
            }
        }
        self.ranges.push(GatherRange {
            start,
            size,
            page_size,
        });
    }

    /// Records a freed table page.
    pub fn add_freed_table(&mut self, table: FreedTable) {
        self.freed_tables.push(table);
    }

    /// Total bytes of leaf mappings removed.
    pub fn bytes(&self) -> u64 {
        self.ranges.iter().map(|r| r.size).sum()
    }

    /// Whether nothing was removed.
    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty() && self.freed_tables.is_empty()
    }

    /// Empties the gather, keeping its allocations.
    pub fn clear(&mut self) {
        self.ranges.clear();
        self.freed_tables.clear();
    }
}

/// An IO page-table format: the functional state an IOMMU walks.
///
/// Implementations are plain single-owner data structures (`&mut self` to change them); the
/// DMA layer puts each domain's table behind a lock. See docs/DECISIONS.md.
pub trait IoPageTable: Send {
    /// A short name of the format, for reports ("lpae-4k", "tce", "sba-pdir").
    fn format_name(&self) -> &'static str;

    /// Bitmap of supported page sizes (bit n set: 2^n-byte pages).
    fn page_size_bitmap(&self) -> u64;

    /// The smallest page size: every address and size passed in must be a multiple of it.
    fn granule(&self) -> u64 {
        1 << self.page_size_bitmap().trailing_zeros()
    }

    /// The IOVA range the table can translate, as `(first, one past last)`.
    fn iova_range(&self) -> (Iova, Iova);

    /// Maps `size` bytes at `iova` to `pa` with `prot`, using the largest page sizes the
    /// alignment of both addresses allows. On error nothing is mapped.
    fn map(
        &mut self,
        iova: Iova,
        pa: PhysAddr,
        size: u64,
        prot: Prot,
        work: &mut WorkRecord,
    ) -> Result<(), PgTableError>;

    /// Unmaps `size` bytes at `iova`, recording what was removed in `gather`. The whole range
    /// must be mapped; on error nothing is unmapped and `gather` is unchanged.
    fn unmap(
        &mut self,
        iova: Iova,
        size: u64,
        gather: &mut UnmapGather,
        work: &mut WorkRecord,
    ) -> Result<(), PgTableError>;

    /// Looks up the translation of one IOVA, counting the entries read.
    fn translate(&self, iova: Iova, work: &mut WorkRecord) -> Option<Translation>;

    /// Number of page-table pages currently allocated, the root included.
    fn table_pages(&self) -> usize;

    /// Bytes currently mapped.
    fn mapped_bytes(&self) -> u64;
}
