//! The POWER TCE table: one level of 8-byte translation control entries over a DMA window.
//!
//! A PCI host bridge on POWER (pSeries under a hypervisor, or PowerNV) translates bus addresses
//! inside a DMA window through a flat table: entry `i` maps the TCE page at bus address
//! `window_offset + i * page_size`. The default window uses 4 KiB TCE pages; dynamic DMA
//! windows (DDW) use larger ones. This model supports 4 KiB, 64 KiB, 2 MiB and 16 MiB pages.
//!
//! There is one level, so a map or unmap touches exactly one entry per TCE page and no table
//! page is ever allocated or freed by an operation: [`IoPageTable::table_pages`] reports the
//! size of the whole table, as firmware or the hypervisor allocates it. The model stores the
//! entries sparsely (512-entry chunks materialised on first write), so a large window that is
//! mostly unmapped costs little memory.
//!
//! The later hypercall layer (H_PUT_TCE, H_STUFF_TCE, ...) reads raw entries with
//! [`TceTable::tce_at`] and converts between bus addresses and entry indices with
//! [`TceTable::index_of`] and [`TceTable::iova_of`].

use crate::addr::{Iova, PhysAddr, Prot};
use crate::pgtable::{IoPageTable, PgTableError, Translation, UnmapGather};
use crate::work::WorkRecord;

/// TCE encodings (Linux `arch/powerpc/include/asm/tce.h`).
///
/// A TCE holds the page-aligned real (physical) address of its TCE page in the address bits
/// and the access bits at the bottom: bit 0 lets the device read memory, bit 1 lets it write.
/// An entry with neither bit is invalid. Unlike ARM stage 1, write-only is expressible.
/// Linux fills the address as `(rpn & TCE_RPN_MASK) << page_shift` with a 40-bit real page
/// number, so real addresses must fit in `40 + page_shift` bits.
pub mod spec {
    use crate::addr::{PhysAddr, Prot};

    /// Bit 0: the device may read memory through the entry (`TCE_PCI_READ`).
    pub const TCE_PCI_READ: u64 = 1;
    /// Bit 1: the device may write memory through the entry (`TCE_PCI_WRITE`).
    pub const TCE_PCI_WRITE: u64 = 2;
    /// Both access bits.
    pub const TCE_PERM_MASK: u64 = TCE_PCI_READ | TCE_PCI_WRITE;
    /// Width of the real page number field (Linux `TCE_RPN_MASK` is 40 bits).
    pub const TCE_RPN_BITS: u32 = 40;

    /// Bits of real address a TCE with `2^page_shift`-byte pages can hold.
    #[inline]
    pub const fn phys_bits(page_shift: u32) -> u32 {
        let bits = TCE_RPN_BITS + page_shift;
        if bits > 64 {
            64
        } else {
            bits
        }
    }

    /// Encodes a TCE mapping the page at `pa` (aligned to `2^page_shift`) with `prot`.
    #[inline]
    pub const fn encode(pa: u64, prot: Prot, page_shift: u32) -> u64 {
        let mut tce = pa & !((1u64 << page_shift) - 1);
        if prot.read {
            tce |= TCE_PCI_READ;
        }
        if prot.write {
            tce |= TCE_PCI_WRITE;
        }
        tce
    }

    /// Decodes a TCE: the page's real address and access, or `None` for an invalid entry.
    #[inline]
    pub const fn decode(tce: u64, page_shift: u32) -> Option<(PhysAddr, Prot)> {
        if tce & TCE_PERM_MASK == 0 {
            return None;
        }
        let prot = Prot {
            read: tce & TCE_PCI_READ != 0,
            write: tce & TCE_PCI_WRITE != 0,
        };
        Some((PhysAddr::new(tce & !((1u64 << page_shift) - 1)), prot))
    }
}

/// TCE page sizes supported, as log2 of the bytes: 4 KiB, 64 KiB, 2 MiB and 16 MiB.
pub const TCE_PAGE_SHIFTS: [u32; 4] = [12, 16, 21, 24];

/// Cap on the entries of one table (a window of 1 TiB with 4 KiB pages, 4 PiB with 16 MiB).
pub const MAX_TCE_ENTRIES: u64 = 1 << 28;

/// Configuration of a [`TceTable`]: the DMA window it translates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TceConfig {
    /// Bus address of entry 0 (the window's start).
    pub window_offset: u64,
    /// Bytes of bus address space the window covers.
    pub window_size: u64,
    /// log2 of the TCE page size: 12, 16, 21 or 24.
    pub page_shift: u32,
}

impl TceConfig {
    /// A window of `window_size` bytes at bus address `window_offset`, with `2^page_shift`-byte
    /// TCE pages.
    pub const fn new(window_offset: u64, window_size: u64, page_shift: u32) -> Self {
        Self {
            window_offset,
            window_size,
            page_shift,
        }
    }
}

/// Why a [`TceConfig`] was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TceConfigError {
    /// The TCE page size is not 4K, 64K, 2M or 16M.
    #[error("Unsupported TCE page shift {page_shift}: expected 12, 16, 21 or 24")]
    UnsupportedPageSize {
        /// The shift asked for.
        page_shift: u32,
    },
    /// The window has no pages.
    #[error("The DMA window is empty")]
    EmptyWindow,
    /// The window's offset or size is not a multiple of the TCE page size.
    #[error("DMA window {offset:#x}+{size:#x} is not aligned to the {page_size:#x}-byte TCE page")]
    MisalignedWindow {
        /// The window offset.
        offset: u64,
        /// The window size.
        size: u64,
        /// The TCE page size.
        page_size: u64,
    },
    /// The window ends past the 64-bit bus address space.
    #[error("DMA window {offset:#x}+{size:#x} overflows the bus address space")]
    WindowOverflow {
        /// The window offset.
        offset: u64,
        /// The window size.
        size: u64,
    },
    /// The window needs more entries than the cap.
    #[error("DMA window needs {entries} TCEs, more than the cap of {limit}")]
    WindowTooLarge {
        /// Entries the window needs.
        entries: u64,
        /// [`MAX_TCE_ENTRIES`].
        limit: u64,
    },
}

/// log2 of the entries in one lazily allocated chunk: one 4 KiB page of 8-byte entries.
const CHUNK_SHIFT: u32 = 9;
const CHUNK_LEN: usize = 1 << CHUNK_SHIFT;

/// A flat array of 8-byte entries that reads as zero until written, allocated in 512-entry
/// chunks on first write. Shared by the single-level formats (TCE table, SBA I/O pdir).
#[derive(Clone, Debug)]
pub(super) struct SparseEntries {
    chunks: Vec<Option<Box<[u64; CHUNK_LEN]>>>,
    len: u64,
}

impl SparseEntries {
    /// `len` entries, all zero.
    pub(super) fn new(len: u64) -> Self {
        let chunks = len.div_ceil(CHUNK_LEN as u64) as usize;
        Self {
            chunks: (0..chunks).map(|_| None).collect(),
            len,
        }
    }

    /// Number of entries.
    pub(super) fn len(&self) -> u64 {
        self.len
    }

    /// Entry `index` (< `len`).
    #[inline]
    pub(super) fn get(&self, index: u64) -> u64 {
        match &self.chunks[(index >> CHUNK_SHIFT) as usize] {
            Some(chunk) => chunk[index as usize & (CHUNK_LEN - 1)],
            None => 0,
        }
    }

    /// Replaces entry `index` (< `len`) with `f(entry)`, looking its chunk up once; a chunk
    /// not yet materialised reads as zero and is materialised only for a non-zero result.
    #[inline]
    pub(super) fn update(&mut self, index: u64, f: impl FnOnce(u64) -> u64) {
        let slot = &mut self.chunks[(index >> CHUNK_SHIFT) as usize];
        let offset = index as usize & (CHUNK_LEN - 1);
        match slot {
            Some(chunk) => chunk[offset] = f(chunk[offset]),
            None => {
                let value = f(0);
                if value != 0 {
                    slot.insert(Box::new([0; CHUNK_LEN]))[offset] = value;
                }
            }
        }
    }

    /// Sets entry `index` (< `len`), materialising its chunk unless `value` is zero.
    #[inline]
    pub(super) fn set(&mut self, index: u64, value: u64) {
        let slot = &mut self.chunks[(index >> CHUNK_SHIFT) as usize];
        match slot {
            Some(chunk) => chunk[index as usize & (CHUNK_LEN - 1)] = value,
            None if value == 0 => {}
            None => {
                let chunk = slot.insert(Box::new([0; CHUNK_LEN]));
                chunk[index as usize & (CHUNK_LEN - 1)] = value;
            }
        }
    }
}

/// A POWER TCE table over one DMA window. See the [module docs](self).
#[derive(Clone)]
pub struct TceTable {
    config: TceConfig,
    table: OneLevelTable,
}

impl TceTable {
    /// Validates `config` and builds an empty table.
    pub fn new(config: TceConfig) -> Result<Self, TceConfigError> {
        let TceConfig {
            window_offset: offset,
            window_size: size,
            page_shift,
        } = config;
        if !TCE_PAGE_SHIFTS.contains(&page_shift) {
            return Err(TceConfigError::UnsupportedPageSize { page_shift });
        }
        let page_size = 1u64 << page_shift;
        if size == 0 {
            return Err(TceConfigError::EmptyWindow);
        }
        if (offset | size) & (page_size - 1) != 0 {
            return Err(TceConfigError::MisalignedWindow {
                offset,
                size,
                page_size,
            });
        }
        if offset.checked_add(size).is_none() {
            return Err(TceConfigError::WindowOverflow { offset, size });
        }
        let entries = size >> page_shift;
        if entries > MAX_TCE_ENTRIES {
            return Err(TceConfigError::WindowTooLarge {
                entries,
                limit: MAX_TCE_ENTRIES,
            });
        }
        let window = OneLevelWindow {
            start: offset,
            size,
            page_shift,
        };
        Ok(Self {
            config,
            table: OneLevelTable::new(window, entries),
        })
    }

    /// The configuration the table was built from.
    pub fn config(&self) -> &TceConfig {
        &self.config
    }

    /// The TCE page size in bytes.
    pub fn page_size(&self) -> u64 {
        1 << self.config.page_shift
    }

    /// Number of entries (TCE pages) in the window.
    pub fn entries(&self) -> u64 {
        self.table.entries.len()
    }

    /// The raw TCE at `index`, or `None` past the end of the table.
    pub fn tce_at(&self, index: u64) -> Option<u64> {
        self.table.entry_at(index)
    }

    /// The entry index that translates bus address `iova`, or `None` outside the window.
    pub fn index_of(&self, iova: Iova) -> Option<u64> {
        self.table.window.index_of(iova)
    }

    /// The bus address of the first byte entry `index` translates, or `None` past the end.
    pub fn iova_of(&self, index: u64) -> Option<Iova> {
        self.table.iova_of(index)
    }
}

impl std::fmt::Debug for TceTable {
    /// A summary: the window and occupancy, not the entries.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TceTable")
            .field(
                "window_offset",
                &format_args!("{:#x}", self.config.window_offset),
            )
            .field(
                "window_size",
                &format_args!("{:#x}", self.config.window_size),
            )
            .field("page_size", &format_args!("{:#x}", self.page_size()))
            .field("mapped_bytes", &self.table.mapped)
            .finish()
    }
}

impl IoPageTable for TceTable {
    fn format_name(&self) -> &'static str {
        "tce"
    }

    fn page_size_bitmap(&self) -> u64 {
        self.page_size()
    }

    fn iova_range(&self) -> (Iova, Iova) {
        let start = self.config.window_offset;
        (Iova::new(start), Iova::new(start + self.config.window_size))
    }

    fn map(
        &mut self,
        iova: Iova,
        pa: PhysAddr,
        size: u64,
        prot: Prot,
        work: &mut WorkRecord,
    ) -> Result<(), PgTableError> {
        let shift = self.config.page_shift;
        let entry_run = EntryRun {
            phys_bits: spec::phys_bits(shift),
            valid_mask: spec::TCE_PERM_MASK,
        };
        self.table
            .map(iova, pa, size, prot, entry_run, work, |page| {
                spec::encode(page, prot, shift)
            })
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
            spec::TCE_PERM_MASK,
            gather,
            work,
            |entries, index| entries.set(index, 0),
        )
    }

    fn translate(&self, iova: Iova, work: &mut WorkRecord) -> Option<Translation> {
        let shift = self.config.page_shift;
        self.table
            .translate(iova, work, |tce| spec::decode(tce, shift))
    }

    /// The whole table's size in 4 KiB pages (8-byte entries), fixed for the window: firmware
    /// or the hypervisor allocates it when the window is created, and maps never grow it.
    fn table_pages(&self) -> usize {
        self.table.table_pages()
    }

    fn mapped_bytes(&self) -> u64 {
        self.table.mapped
    }
}

/// The arithmetic of a one-level table over a window of `size` bytes at bus address `start`
/// with `2^page_shift`-byte entries, shared by the TCE table and the SBA pdir.
#[derive(Clone, Copy, Debug)]
pub(super) struct OneLevelWindow {
    pub(super) start: u64,
    pub(super) size: u64,
    pub(super) page_shift: u32,
}

impl OneLevelWindow {
    /// The entry index that translates `iova`, or `None` outside the window.
    pub(super) fn index_of(&self, iova: Iova) -> Option<u64> {
        let off = iova.get().checked_sub(self.start)?;
        (off < self.size).then_some(off >> self.page_shift)
    }

    /// The first IOVA entry `index` translates, or `None` at or past `entries`.
    pub(super) fn iova_of(&self, index: u64, entries: u64) -> Option<Iova> {
        (index < entries).then(|| Iova::new(self.start + (index << self.page_shift)))
    }

    /// Checks a range against the window and the page size; returns its first entry index.
    pub(super) fn check_range(&self, iova: u64, size: u64) -> Result<u64, PgTableError> {
        let granule = 1u64 << self.page_shift;
        if (iova | size) & (granule - 1) != 0 {
            return Err(PgTableError::Misaligned {
                addr: iova,
                size,
                granule,
            });
        }
        let (start, end) = (self.start, self.start + self.size);
        match iova.checked_add(size) {
            Some(last) if iova >= start && last <= end => Ok((iova - start) >> self.page_shift),
            _ => Err(PgTableError::OutOfRange {
                iova,
                size,
                start,
                end,
            }),
        }
    }
}

/// What a one-level format asks of [`OneLevelTable::map`]: the bits of physical address an
/// entry can hold, and the bits that make an entry valid.
#[derive(Clone, Copy, Debug)]
pub(super) struct EntryRun {
    pub(super) phys_bits: u32,
    pub(super) valid_mask: u64,
}

/// A one-level table: the window, its sparse entries and the bytes mapped. The TCE table and
/// the SBA pdir differ only in how an entry is encoded, invalidated and decoded, which they
/// pass in as closures (monomorphised, so no dynamic dispatch on the map/unmap paths).
#[derive(Clone, Debug)]
pub(super) struct OneLevelTable {
    pub(super) window: OneLevelWindow,
    pub(super) entries: SparseEntries,
    pub(super) mapped: u64,
}

impl OneLevelTable {
    /// An empty table of `entries` entries over `window`.
    pub(super) fn new(window: OneLevelWindow, entries: u64) -> Self {
        Self {
            window,
            entries: SparseEntries::new(entries),
            mapped: 0,
        }
    }

    /// The page size in bytes.
    #[inline]
    fn page_size(&self) -> u64 {
        1 << self.window.page_shift
    }

    /// The raw entry at `index`, or `None` past the end.
    pub(super) fn entry_at(&self, index: u64) -> Option<u64> {
        (index < self.entries.len()).then(|| self.entries.get(index))
    }

    /// The first IOVA entry `index` translates, or `None` past the end.
    pub(super) fn iova_of(&self, index: u64) -> Option<Iova> {
        self.window.iova_of(index, self.entries.len())
    }

    /// The whole table's size in 4 KiB pages of 8-byte entries.
    pub(super) fn table_pages(&self) -> usize {
        self.entries.len().div_ceil(512) as usize
    }

    /// Maps `size` bytes at `iova` to `pa`: checks the range, the physical address and
    /// `prot`, then that no entry in the run is valid, and writes `encode(page address)` into
    /// each. On error nothing is written.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub(super) fn map(
        &mut self,
        iova: Iova,
        pa: PhysAddr,
        size: u64,
        prot: Prot,
        format: EntryRun,
        work: &mut WorkRecord,
        encode: impl Fn(u64) -> u64,
    ) -> Result<(), PgTableError> {
        let (iova, pa) = (iova.get(), pa.get());
        let first = self.window.check_range(iova, size)?;
        let granule = self.page_size();
        if pa & (granule - 1) != 0 {
            return Err(PgTableError::Misaligned {
                addr: pa,
                size,
                granule,
            });
        }
        let bits = format.phys_bits;
        let fits = match pa.checked_add(size) {
            Some(end) => bits >= 64 || end <= 1u64 << bits,
            None => false,
        };
        if !fits {
            return Err(PgTableError::PhysOutOfRange { pa, bits });
        }
        if !prot.read && !prot.write {
            return Err(PgTableError::NoPermission);
        }
        let shift = self.window.page_shift;
        let count = size >> shift;
        for i in 0..count {
            work.pte_reads += 1;
            if self.entries.get(first + i) & format.valid_mask != 0 {
                return Err(PgTableError::AlreadyMapped {
                    iova: iova + (i << shift),
                });
            }
        }
        for i in 0..count {
            self.entries.set(first + i, encode(pa + (i << shift)));
        }
        work.ptes_written += count;
        self.mapped += size;
        Ok(())
    }

    /// Unmaps `size` bytes at `iova`: checks the range and that every entry in the run is
    /// valid (`valid_mask`), then invalidates each with `invalidate(entries, index)` and
    /// gathers the range at the page size. On error nothing is cleared.
    #[inline]
    pub(super) fn unmap(
        &mut self,
        iova: Iova,
        size: u64,
        valid_mask: u64,
        gather: &mut UnmapGather,
        work: &mut WorkRecord,
        invalidate: impl Fn(&mut SparseEntries, u64),
    ) -> Result<(), PgTableError> {
        let iova = iova.get();
        let first = self.window.check_range(iova, size)?;
        let shift = self.window.page_shift;
        let count = size >> shift;
        for i in 0..count {
            work.pte_reads += 1;
            if self.entries.get(first + i) & valid_mask == 0 {
                return Err(PgTableError::NotMapped {
                    iova: iova + (i << shift),
                });
            }
        }
        if count == 0 {
            return Ok(());
        }
        for i in 0..count {
            invalidate(&mut self.entries, first + i);
        }
        work.ptes_cleared += count;
        gather.add(Iova::new(iova), size, self.page_size());
        self.mapped -= size;
        Ok(())
    }

    /// Translates `iova` through the one entry that covers it; `decode` gives the entry's page
    /// address and access, or `None` for an invalid entry.
    #[inline]
    pub(super) fn translate(
        &self,
        iova: Iova,
        work: &mut WorkRecord,
        decode: impl Fn(u64) -> Option<(PhysAddr, Prot)>,
    ) -> Option<Translation> {
        let index = self.window.index_of(iova)?;
        work.pte_reads += 1;
        let page_size = self.page_size();
        let (pa, prot) = decode(self.entries.get(index))?;
        Some(Translation {
            pa: pa.add(iova.offset_in(page_size)),
            prot,
            page_size,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::addr::{SZ_16M, SZ_1G, SZ_2M, SZ_4K, SZ_64K};

    fn table(offset: u64, size: u64, page_shift: u32) -> TceTable {
        TceTable::new(TceConfig::new(offset, size, page_shift)).expect("valid config")
    }

    fn lookup(t: &TceTable, iova: u64) -> Option<Translation> {
        t.translate(Iova::new(iova), &mut WorkRecord::new())
    }

    // ---- Encodings, worked out by hand ----

    #[test]
    fn tce_holds_page_address_and_access_bits() {
        // Real address 0x1_2345_6000 with read (bit 0) and write (bit 1): 0x1_2345_6003.
        assert_eq!(
            spec::encode(0x1_2345_6000, Prot::READ_WRITE, 12),
            0x1_2345_6003
        );
        assert_eq!(spec::encode(0x1_2345_6000, Prot::READ, 12), 0x1_2345_6001);
        assert_eq!(spec::encode(0x1_2345_6000, Prot::WRITE, 12), 0x1_2345_6002);
    }

    #[test]
    fn tce_with_64k_pages_drops_bits_below_the_page() {
        // A 64K TCE page at 0x1234_0000: address bits [63:16] only.
        assert_eq!(spec::encode(0x1234_0000, Prot::READ, 16), 0x1234_0001);
        assert_eq!(spec::encode(0x1234_5000, Prot::READ, 16), 0x1234_0001);
    }

    #[test]
    fn decode_inverts_encode_and_rejects_empty_entries() {
        let tce = spec::encode(0x8000_2000, Prot::WRITE, 12);
        assert_eq!(
            spec::decode(tce, 12),
            Some((PhysAddr::new(0x8000_2000), Prot::WRITE))
        );
        assert_eq!(spec::decode(0x8000_2000, 12), None);
        assert_eq!(spec::phys_bits(12), 52);
        assert_eq!(spec::phys_bits(24), 64);
    }

    // ---- Configuration ----

    #[test]
    fn bad_configs_are_rejected() {
        let cases = [
            (
                TceConfig::new(0, SZ_1G, 13),
                TceConfigError::UnsupportedPageSize { page_shift: 13 },
            ),
            (TceConfig::new(0, 0, 12), TceConfigError::EmptyWindow),
            (
                TceConfig::new(0x1000, SZ_1G, 16),
                TceConfigError::MisalignedWindow {
                    offset: 0x1000,
                    size: SZ_1G,
                    page_size: SZ_64K,
                },
            ),
            (
                TceConfig::new(u64::MAX - 0xFFF, SZ_1G, 12),
                TceConfigError::WindowOverflow {
                    offset: u64::MAX - 0xFFF,
                    size: SZ_1G,
                },
            ),
            (
                TceConfig::new(0, 1 << 41, 12),
                TceConfigError::WindowTooLarge {
                    entries: 1 << 29,
                    limit: MAX_TCE_ENTRIES,
                },
            ),
        ];
        for (config, err) in cases {
            assert_eq!(TceTable::new(config).unwrap_err(), err);
        }
    }

    #[test]
    fn large_window_is_not_allocated_up_front() {
        // 256 GiB of 64K pages: 4M entries, 32 MiB if it were dense.
        let t = table(1 << 59, 256 * SZ_1G, 16);
        assert_eq!(t.entries(), 4 << 20);
        assert_eq!(t.table_pages(), 8192);
        assert!(t.table.entries.chunks.iter().all(Option::is_none));
    }

    // ---- Index helpers ----

    #[test]
    fn index_and_bus_address_convert_both_ways() {
        let t = table(0x8000_0000, SZ_1G, 12);
        assert_eq!(t.index_of(Iova::new(0x8000_3456)), Some(3));
        assert_eq!(t.iova_of(3), Some(Iova::new(0x8000_3000)));
        assert_eq!(t.index_of(Iova::new(0x7FFF_F000)), None);
        assert_eq!(t.index_of(Iova::new(0x8000_0000 + SZ_1G)), None);
        assert_eq!(t.iova_of(t.entries()), None);
        assert_eq!(t.tce_at(t.entries()), None);
    }

    // ---- Map, translate, unmap ----

    #[test]
    fn map_writes_one_tce_per_page() {
        let mut t = table(0x8000_0000, SZ_1G, 12);
        let mut work = WorkRecord::new();

        t.map(
            Iova::new(0x8000_1000),
            PhysAddr::new(0x4_0000_0000),
            2 * SZ_4K,
            Prot::READ,
            &mut work,
        )
        .unwrap();

        assert_eq!((work.ptes_written, work.pte_reads), (2, 2));
        assert_eq!(t.tce_at(1), Some(0x4_0000_0001));
        assert_eq!(t.tce_at(2), Some(0x4_0000_1001));
        assert_eq!(t.mapped_bytes(), 2 * SZ_4K);
    }

    #[test]
    fn translate_returns_address_access_and_page_size() {
        let mut t = table(0, SZ_1G, 21);
        t.map(
            Iova::new(SZ_2M),
            PhysAddr::new(0x1_0000_0000),
            SZ_2M,
            Prot::WRITE,
            &mut WorkRecord::new(),
        )
        .unwrap();
        let mut work = WorkRecord::new();

        let tr = t.translate(Iova::new(SZ_2M + 0x1234), &mut work).unwrap();

        assert_eq!(
            tr,
            Translation {
                pa: PhysAddr::new(0x1_0000_1234),
                prot: Prot::WRITE,
                page_size: SZ_2M
            }
        );
        assert_eq!(work.pte_reads, 1);
        assert_eq!(lookup(&t, 0), None);
    }

    #[test]
    fn unmap_clears_entries_and_gathers_at_tce_page_size() {
        let mut t = table(0, SZ_1G, 16);
        t.map(
            Iova::new(SZ_64K),
            PhysAddr::new(SZ_16M),
            3 * SZ_64K,
            Prot::READ_WRITE,
            &mut WorkRecord::new(),
        )
        .unwrap();
        let mut gather = UnmapGather::new();
        let mut work = WorkRecord::new();

        t.unmap(Iova::new(SZ_64K), 3 * SZ_64K, &mut gather, &mut work)
            .unwrap();

        assert_eq!(gather.ranges.len(), 1);
        assert_eq!(
            (gather.ranges[0].start, gather.ranges[0].size),
            (Iova::new(SZ_64K), 3 * SZ_64K)
        );
        assert_eq!(gather.ranges[0].page_size, SZ_64K);
        assert!(gather.freed_tables.is_empty());
        assert_eq!(work.ptes_cleared, 3);
        assert_eq!((t.tce_at(1), t.mapped_bytes()), (Some(0), 0));
    }

    // ---- Errors leave the table unchanged ----

    #[test]
    fn map_over_a_mapped_entry_fails_and_writes_nothing() {
        let mut t = table(0, SZ_1G, 12);
        t.map(
            Iova::new(0x3000),
            PhysAddr::new(0x3000),
            SZ_4K,
            Prot::READ,
            &mut WorkRecord::new(),
        )
        .unwrap();
        let mut work = WorkRecord::new();

        let err = t.map(
            Iova::new(0x1000),
            PhysAddr::new(0x9000),
            4 * SZ_4K,
            Prot::READ,
            &mut work,
        );

        assert_eq!(err, Err(PgTableError::AlreadyMapped { iova: 0x3000 }));
        assert_eq!(
            (t.tce_at(1), t.mapped_bytes(), work.ptes_written),
            (Some(0), SZ_4K, 0)
        );
    }

    #[test]
    fn unmap_of_a_partly_unmapped_range_fails_and_clears_nothing() {
        let mut t = table(0, SZ_1G, 12);
        t.map(
            Iova::new(0x1000),
            PhysAddr::new(0x1000),
            SZ_4K,
            Prot::READ,
            &mut WorkRecord::new(),
        )
        .unwrap();
        let mut gather = UnmapGather::new();

        let err = t.unmap(
            Iova::new(0x1000),
            2 * SZ_4K,
            &mut gather,
            &mut WorkRecord::new(),
        );

        assert_eq!(err, Err(PgTableError::NotMapped { iova: 0x2000 }));
        assert!(gather.is_empty());
        assert!(lookup(&t, 0x1000).is_some());
        assert_eq!(t.mapped_bytes(), SZ_4K);
    }

    #[test]
    fn bad_arguments_are_rejected() {
        let mut t = table(SZ_1G, SZ_1G, 16);
        let mut w = WorkRecord::new();
        let pa = PhysAddr::new(0);
        assert_eq!(
            t.map(Iova::new(SZ_1G + SZ_4K), pa, SZ_64K, Prot::READ, &mut w),
            Err(PgTableError::Misaligned {
                addr: SZ_1G + SZ_4K,
                size: SZ_64K,
                granule: SZ_64K
            })
        );
        assert_eq!(
            t.map(
                Iova::new(SZ_1G),
                PhysAddr::new(SZ_4K),
                SZ_64K,
                Prot::READ,
                &mut w
            ),
            Err(PgTableError::Misaligned {
                addr: SZ_4K,
                size: SZ_64K,
                granule: SZ_64K
            })
        );
        assert_eq!(
            t.map(Iova::new(0), pa, SZ_64K, Prot::READ, &mut w),
            Err(PgTableError::OutOfRange {
                iova: 0,
                size: SZ_64K,
                start: SZ_1G,
                end: 2 * SZ_1G
            })
        );
        assert_eq!(
            t.map(
                Iova::new(2 * SZ_1G - SZ_64K),
                pa,
                2 * SZ_64K,
                Prot::READ,
                &mut w
            ),
            Err(PgTableError::OutOfRange {
                iova: 2 * SZ_1G - SZ_64K,
                size: 2 * SZ_64K,
                start: SZ_1G,
                end: 2 * SZ_1G
            })
        );
        assert_eq!(
            t.map(
                Iova::new(SZ_1G),
                PhysAddr::new(1 << 56),
                SZ_64K,
                Prot::READ,
                &mut w
            ),
            Err(PgTableError::PhysOutOfRange {
                pa: 1 << 56,
                bits: 56
            })
        );
        assert_eq!(
            t.map(Iova::new(SZ_1G), pa, SZ_64K, Prot::NONE, &mut w),
            Err(PgTableError::NoPermission)
        );
        assert_eq!(t.mapped_bytes(), 0);
    }
}
