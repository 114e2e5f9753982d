//! The HP zx1 SBA I/O page directory: one level of 8-byte entries over an IOVA window.
//!
//! The zx1 I/O controller translates bus addresses inside its IOV space (`IBASE`/`IMASK`:
//! a power-of-two window aligned to its size) through a flat page directory (pdir): entry `i`
//! maps the IOMMU page at `base + i * page_size`. Linux's `sba_iommu` uses an IOMMU page size
//! of `min(PAGE_SIZE, 64 KiB)`; this model takes any power of two from 4 KiB to 64 KiB.
//!
//! The hardware keeps no access permissions in a pdir entry: every valid entry allows reads
//! and writes. `map` still requires a non-empty [`Prot`] (the trait's contract) but does not
//! store it, and `translate` reports [`Prot::READ_WRITE`].
//!
//! Unmap clears the valid bit and leaves the page number in place, as Linux does ("Do NOT
//! clear the rest - save it for debugging"); [`SbaPdir::pdir_entry`] shows it. There is one
//! level, so no table page is ever allocated or freed by an operation, and
//! [`IoPageTable::table_pages`] reports the whole pdir's size. Entries are stored sparsely
//! (512-entry chunks materialised on first write).

use crate::addr::{Iova, PhysAddr, Prot};
use crate::pgtable::tce::{EntryRun, OneLevelTable, OneLevelWindow};
use crate::pgtable::{IoPageTable, PgTableError, Translation, UnmapGather};
use crate::work::WorkRecord;

/// I/O pdir entry encodings (Linux `sba_iommu.c`).
///
/// ```text
///  63  62         40 39                    12 11     0
/// +---+-------------+------------------------+--------+
/// | V |   unused    |        PPN[39:12]      | unused |
/// +---+-------------+------------------------+--------+
/// ```
///
/// `V` is `IOPDIR_VALID`; the page number is the page-aligned physical address, so physical
/// addresses must fit in 40 bits.
pub mod spec {
    use crate::addr::PhysAddr;

    /// Bit 63: the entry is valid (`IOPDIR_VALID`).
    pub const IOPDIR_VALID: u64 = 1 << 63;
    /// The physical page number field, bits `[39:12]`.
    pub const PPN_MASK: u64 = 0x0000_00FF_FFFF_F000;
    /// Bits of physical address an entry can hold.
    pub const PHYS_BITS: u32 = 40;
    /// Bits Linux clears to invalidate an entry: the valid bit and the low byte (which some
    /// variants fill with ones).
    pub const INVALIDATE_MASK: u64 = IOPDIR_VALID | 0xFF;

    /// Encodes a valid entry for the IOMMU page at `pa` (page-aligned).
    #[inline]
    pub const fn encode(pa: u64) -> u64 {
        (pa & PPN_MASK) | IOPDIR_VALID
    }

    /// The entry after an unmap: invalid, page number kept for debugging.
    #[inline]
    pub const fn invalidate(entry: u64) -> u64 {
        entry & !INVALIDATE_MASK
    }

    /// The page address of a valid entry, or `None` for an invalid one.
    #[inline]
    pub const fn decode(entry: u64) -> Option<PhysAddr> {
        if entry & IOPDIR_VALID == 0 {
            None
        } else {
            Some(PhysAddr::new(entry & PPN_MASK))
        }
    }
}

/// Smallest IOMMU page size, as log2 of the bytes (4 KiB).
pub const MIN_PAGE_SHIFT: u32 = 12;
/// Largest IOMMU page size, as log2 of the bytes (64 KiB).
pub const MAX_PAGE_SHIFT: u32 = 16;
/// Cap on the entries of one pdir.
pub const MAX_PDIR_ENTRIES: u64 = 1 << 28;

/// Configuration of an [`SbaPdir`]: the IOV window and the IOMMU page size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SbaConfig {
    /// First IOVA of the window (`IBASE`); aligned to the window size.
    pub iova_base: u64,
    /// Bytes of IOVA space (`~IMASK + 1`); a power of two.
    pub iova_size: u64,
    /// log2 of the IOMMU page size, 12..=16.
    pub page_shift: u32,
}

impl SbaConfig {
    /// A window of `iova_size` bytes at `iova_base` with `2^page_shift`-byte IOMMU pages.
    pub const fn new(iova_base: u64, iova_size: u64, page_shift: u32) -> Self {
        Self {
            iova_base,
            iova_size,
            page_shift,
        }
    }
}

/// Why an [`SbaConfig`] was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SbaConfigError {
    /// The IOMMU page size is not a power of two from 4 KiB to 64 KiB.
    #[error("Unsupported SBA IOMMU page shift {page_shift}: expected 12 to 16")]
    UnsupportedPageSize {
        /// The shift asked for.
        page_shift: u32,
    },
    /// The window size is not a power of two of at least one page.
    #[error("SBA IOV window size {size:#x} is not a power of two of at least one page")]
    BadWindowSize {
        /// The size asked for.
        size: u64,
    },
    /// The window base is not aligned to the window size (IBASE/IMASK cannot express it).
    #[error("SBA IOV window base {base:#x} is not aligned to its size {size:#x}")]
    MisalignedWindow {
        /// The base asked for.
        base: u64,
        /// The window size.
        size: u64,
    },
    /// The window needs more entries than the cap.
    #[error("SBA IOV window needs {entries} pdir entries, more than the cap of {limit}")]
    WindowTooLarge {
        /// Entries the window needs.
        entries: u64,
        /// [`MAX_PDIR_ENTRIES`].
        limit: u64,
    },
}

/// An HP zx1 SBA I/O page directory. See the [module docs](self).
#[derive(Clone)]
pub struct SbaPdir {
    config: SbaConfig,
    table: OneLevelTable,
}

impl SbaPdir {
    /// Validates `config` and builds an empty pdir.
    pub fn new(config: SbaConfig) -> Result<Self, SbaConfigError> {
        let SbaConfig {
            iova_base: base,
            iova_size: size,
            page_shift,
        } = config;
        if !(MIN_PAGE_SHIFT..=MAX_PAGE_SHIFT).contains(&page_shift) {
            return Err(SbaConfigError::UnsupportedPageSize { page_shift });
        }
        if !size.is_power_of_two() || size < 1 << page_shift {
            return Err(SbaConfigError::BadWindowSize { size });
        }
        if base & (size - 1) != 0 {
            return Err(SbaConfigError::MisalignedWindow { base, size });
        }
        let entries = size >> page_shift;
        if entries > MAX_PDIR_ENTRIES {
            return Err(SbaConfigError::WindowTooLarge {
                entries,
                limit: MAX_PDIR_ENTRIES,
            });
        }
        let window = OneLevelWindow {
            start: base,
            size,
            page_shift,
        };
        Ok(Self {
            config,
            table: OneLevelTable::new(window, entries),
        })
    }

    /// The configuration the pdir was built from.
    pub fn config(&self) -> &SbaConfig {
        &self.config
    }

    /// The IOMMU page size in bytes.
    pub fn page_size(&self) -> u64 {
        1 << self.config.page_shift
    }

    /// Number of pdir entries.
    pub fn entries(&self) -> u64 {
        self.table.entries.len()
    }

    /// The raw pdir entry at `index`, or `None` past the end.
    pub fn pdir_entry(&self, index: u64) -> Option<u64> {
        self.table.entry_at(index)
    }

    /// The pdir index that translates `iova`, or `None` outside the window.
    pub fn index_of(&self, iova: Iova) -> Option<u64> {
        self.table.window.index_of(iova)
    }

    /// The first IOVA entry `index` translates, or `None` past the end.
    pub fn iova_of(&self, index: u64) -> Option<Iova> {
        self.table.iova_of(index)
    }
}

impl std::fmt::Debug for SbaPdir {
    /// A summary: the window and occupancy, not the entries.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SbaPdir")
            .field("iova_base", &format_args!("{:#x}", self.config.iova_base))
            .field("iova_size", &format_args!("{:#x}", self.config.iova_size))
            .field("page_size", &format_args!("{:#x}", self.page_size()))
            .field("mapped_bytes", &self.table.mapped)
            .finish()
    }
}

impl IoPageTable for SbaPdir {
    fn format_name(&self) -> &'static str {
        "sba-pdir"
    }

    fn page_size_bitmap(&self) -> u64 {
        self.page_size()
    }

    fn iova_range(&self) -> (Iova, Iova) {
        let start = self.config.iova_base;
        (Iova::new(start), Iova::new(start + self.config.iova_size))
    }

    /// Maps the range. `prot` must allow something but is not recorded: SBA entries carry no
    /// permissions.
    fn map(
        &mut self,
        iova: Iova,
        pa: PhysAddr,
        size: u64,
        prot: Prot,
        work: &mut WorkRecord,
    ) -> Result<(), PgTableError> {
        let entry_run = EntryRun {
            phys_bits: spec::PHYS_BITS,
            valid_mask: spec::IOPDIR_VALID,
        };
        self.table
            .map(iova, pa, size, prot, entry_run, work, spec::encode)
    }

    fn unmap(
        &mut self,
        iova: Iova,
        size: u64,
        gather: &mut UnmapGather,
        work: &mut WorkRecord,
    ) -> Result<(), PgTableError> {
        self.table.unmap(
            iova,
            size,
            spec::IOPDIR_VALID,
            gather,
            work,
            |entries, index| entries.update(index, spec::invalidate),
        )
    }

    /// Translates `iova`; the permission is always [`Prot::READ_WRITE`] (see the module docs).
    fn translate(&self, iova: Iova, work: &mut WorkRecord) -> Option<Translation> {
        self.table.translate(iova, work, |entry| {
            spec::decode(entry).map(|pa| (pa, Prot::READ_WRITE))
        })
    }

    /// The whole pdir's size in 4 KiB pages, fixed for the window.
    fn table_pages(&self) -> usize {
        self.table.table_pages()
    }

    fn mapped_bytes(&self) -> u64 {
        self.table.mapped
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::addr::{SZ_1G, SZ_4K, SZ_64K};

    fn pdir(base: u64, size: u64, page_shift: u32) -> SbaPdir {
        SbaPdir::new(SbaConfig::new(base, size, page_shift)).expect("valid config")
    }

    fn lookup(p: &SbaPdir, iova: u64) -> Option<Translation> {
        p.translate(Iova::new(iova), &mut WorkRecord::new())
    }

    // ---- Encodings, worked out by hand ----

    #[test]
    fn entry_is_valid_bit_plus_page_address() {
        // PA 0x12_3456_7000 (PPN field, bits [39:12]) | V (bit 63) = 0x8000_0012_3456_7000.
        assert_eq!(spec::encode(0x12_3456_7000), 0x8000_0012_3456_7000);
    }

    #[test]
    fn invalidate_clears_valid_bit_and_keeps_page_number() {
        assert_eq!(
            spec::invalidate(0x8000_0012_3456_7000),
            0x0000_0012_3456_7000
        );
        assert_eq!(spec::decode(0x0000_0012_3456_7000), None);
        assert_eq!(
            spec::decode(0x8000_0012_3456_7000),
            Some(PhysAddr::new(0x12_3456_7000))
        );
    }

    // ---- Configuration ----

    #[test]
    fn bad_configs_are_rejected() {
        let cases = [
            (
                SbaConfig::new(0, SZ_1G, 11),
                SbaConfigError::UnsupportedPageSize { page_shift: 11 },
            ),
            (
                SbaConfig::new(0, SZ_1G, 17),
                SbaConfigError::UnsupportedPageSize { page_shift: 17 },
            ),
            (
                SbaConfig::new(0, 3 << 20, 12),
                SbaConfigError::BadWindowSize { size: 3 << 20 },
            ),
            (
                SbaConfig::new(0, SZ_4K, 16),
                SbaConfigError::BadWindowSize { size: SZ_4K },
            ),
            (
                SbaConfig::new(SZ_1G / 2, SZ_1G, 12),
                SbaConfigError::MisalignedWindow {
                    base: SZ_1G / 2,
                    size: SZ_1G,
                },
            ),
            (
                SbaConfig::new(0, 1 << 41, 12),
                SbaConfigError::WindowTooLarge {
                    entries: 1 << 29,
                    limit: MAX_PDIR_ENTRIES,
                },
            ),
        ];
        for (config, err) in cases {
            assert_eq!(SbaPdir::new(config).unwrap_err(), err);
        }
    }

    // ---- Map, translate, unmap ----

    #[test]
    fn map_writes_valid_entries_and_translate_reports_read_write() {
        let mut p = pdir(SZ_1G, SZ_1G, 12);
        let mut work = WorkRecord::new();

        p.map(
            Iova::new(SZ_1G + SZ_4K),
            PhysAddr::new(0x7000_0000),
            2 * SZ_4K,
            Prot::READ,
            &mut work,
        )
        .unwrap();

        assert_eq!(work.ptes_written, 2);
        assert_eq!(p.pdir_entry(2), Some(0x8000_0000_7000_1000));
        let tr = lookup(&p, SZ_1G + 0x2abc).unwrap();
        assert_eq!(
            tr,
            Translation {
                pa: PhysAddr::new(0x7000_1abc),
                prot: Prot::READ_WRITE,
                page_size: SZ_4K
            }
        );
    }

    #[test]
    fn unmap_invalidates_and_gathers_at_iommu_page_size() {
        let mut p = pdir(0, SZ_1G, 16);
        p.map(
            Iova::new(SZ_64K),
            PhysAddr::new(0x10_0000),
            2 * SZ_64K,
            Prot::READ_WRITE,
            &mut WorkRecord::new(),
        )
        .unwrap();
        let mut gather = UnmapGather::new();
        let mut work = WorkRecord::new();

        p.unmap(Iova::new(SZ_64K), 2 * SZ_64K, &mut gather, &mut work)
            .unwrap();

        assert_eq!(gather.ranges.len(), 1);
        assert_eq!(
            (gather.ranges[0].size, gather.ranges[0].page_size),
            (2 * SZ_64K, SZ_64K)
        );
        assert_eq!(work.ptes_cleared, 2);
        assert_eq!(p.pdir_entry(1), Some(0x10_0000));
        assert_eq!((lookup(&p, SZ_64K), p.mapped_bytes()), (None, 0));
    }

    #[test]
    fn remap_after_unmap_overwrites_the_stale_page_number() {
        let mut p = pdir(0, SZ_1G, 12);
        let mut w = WorkRecord::new();
        p.map(
            Iova::new(0),
            PhysAddr::new(0x5000),
            SZ_4K,
            Prot::READ,
            &mut w,
        )
        .unwrap();
        p.unmap(Iova::new(0), SZ_4K, &mut UnmapGather::new(), &mut w)
            .unwrap();

        p.map(
            Iova::new(0),
            PhysAddr::new(0x9000),
            SZ_4K,
            Prot::WRITE,
            &mut w,
        )
        .unwrap();

        assert_eq!(lookup(&p, 0).unwrap().pa, PhysAddr::new(0x9000));
    }

    // ---- Errors leave the pdir unchanged ----

    #[test]
    fn map_over_a_mapped_entry_fails_and_writes_nothing() {
        let mut p = pdir(0, SZ_1G, 12);
        p.map(
            Iova::new(0x2000),
            PhysAddr::new(0x2000),
            SZ_4K,
            Prot::READ,
            &mut WorkRecord::new(),
        )
        .unwrap();

        let err = p.map(
            Iova::new(0),
            PhysAddr::new(0x8000),
            3 * SZ_4K,
            Prot::READ,
            &mut WorkRecord::new(),
        );

        assert_eq!(err, Err(PgTableError::AlreadyMapped { iova: 0x2000 }));
        assert_eq!((p.pdir_entry(0), p.mapped_bytes()), (Some(0), SZ_4K));
    }

    #[test]
    fn unmap_of_a_partly_unmapped_range_fails_and_clears_nothing() {
        let mut p = pdir(0, SZ_1G, 12);
        p.map(
            Iova::new(0x1000),
            PhysAddr::new(0x1000),
            SZ_4K,
            Prot::READ,
            &mut WorkRecord::new(),
        )
        .unwrap();
        let mut gather = UnmapGather::new();

        let err = p.unmap(Iova::new(0), 2 * SZ_4K, &mut gather, &mut WorkRecord::new());

        assert_eq!(err, Err(PgTableError::NotMapped { iova: 0 }));
        assert!(gather.is_empty() && lookup(&p, 0x1000).is_some());
    }

    #[test]
    fn bad_arguments_are_rejected() {
        let mut p = pdir(SZ_1G, SZ_1G, 12);
        let mut w = WorkRecord::new();
        assert_eq!(
            p.map(Iova::new(0), PhysAddr::new(0), SZ_4K, Prot::READ, &mut w),
            Err(PgTableError::OutOfRange {
                iova: 0,
                size: SZ_4K,
                start: SZ_1G,
                end: 2 * SZ_1G
            })
        );
        assert_eq!(
            p.map(
                Iova::new(SZ_1G),
                PhysAddr::new(1 << 40),
                SZ_4K,
                Prot::READ,
                &mut w
            ),
            Err(PgTableError::PhysOutOfRange {
                pa: 1 << 40,
                bits: 40
            })
        );
        assert_eq!(
            p.map(
                Iova::new(SZ_1G),
                PhysAddr::new(0x800),
                SZ_4K,
                Prot::READ,
                &mut w
            ),
            Err(PgTableError::Misaligned {
                addr: 0x800,
                size: SZ_4K,
                granule: SZ_4K
            })
        );
        assert_eq!(
            p.map(
                Iova::new(SZ_1G),
                PhysAddr::new(0),
                SZ_4K,
                Prot::NONE,
                &mut w
            ),
            Err(PgTableError::NoPermission)
        );
        assert_eq!(p.mapped_bytes(), 0);
    }
}
