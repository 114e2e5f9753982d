//! The AMD-Vi v1 (host) IO page table, as Linux's `io_pgtable.c` builds it.
//!
//! Geometry (`X86.md` §3.3): 4 KiB tables of 512 eight-byte entries; levels are 1-based, a
//! level-1 table holds 4 KiB entries and each level above resolves nine more address bits.
//! An input address size of `ias` bits needs `ceil((ias - 12) / 9)` levels (a 32-bit space
//! three, a 48-bit space four); that number is the DTE Mode of devices attached to it.
//!
//! Page sizes: every power of two from 4 KiB to 2^51 except 512 GiB (Linux
//! `AMD_IOMMU_PGSIZES`, "not supported due to a hardware bug"), limited to what the levels
//! and the input range hold, or 4 KiB only (Linux `amd_iommu=nohugepages`). A page of a
//! level's natural size (4 KiB, 2 MiB, 1 GiB, ...) is one entry with NextLevel 0; any other
//! size is written with NextLevel 7 and its size encoded in the address, **replicated** in
//! every entry it covers of the table of the level below it (a 64 KiB page is 16 entries of
//! a level-1 table, a 4 MiB page two entries of a level-2 table), as Linux's `alloc_pte` and
//! `PAGE_SIZE_PTE` do. Mapping picks, piece by piece, the largest size the alignment of the
//! IOVA and the physical address and the remaining length allow (Linux `iommu_pgsize`).
//!
//! Table pages live in an arena with simulated physical addresses (`table_base + slot *
//! 4 KiB`, slot 0 the root), so directory entries hold the real address of the next table
//! and a hardware walker ([`AmdV1Table::read_entry`]) decodes it.
//!
//! Unmap clears leaf entries only (every replica of a sized page) and never frees a table:
//! Linux's v1 unmap leaves intermediate tables in place (`X86.md` §3.3), so gathers carry
//! leaf ranges and no freed tables. A later map whose range could take a large page where an
//! empty table was kept maps through that table with smaller pages (Linux would replace the
//! table and flush inside the map; [`IoPageTable::map`] has no gather to report that in).
//! Unmap never splits a large page ([`PgTableError::SplitsBlock`]).
//!
//! Every operation validates first and then writes, so an error leaves the table unchanged.
//! Work counted: `ptes_written` (each replica and each directory entry), `ptes_cleared`,
//! `pte_reads` (entries examined while validating or translating), `tables_allocated`.

use crate::addr::{Iova, PhysAddr, Prot};
use crate::pgtable::{IoPageTable, PgTableError, Translation, UnmapGather};
use crate::work::WorkRecord;

use super::spec::{self, pte, Entry};

/// Entries per table page.
pub const ENTRIES_PER_TABLE: usize = 512;
/// Bytes per table page.
pub const TABLE_BYTES: u64 = 4096;
/// Smallest input address size (one level: 2 MiB).
pub const MIN_IAS: u32 = 21;
/// Largest input address size (six levels; 2^63 keeps one past the last IOVA in a `u64`).
pub const MAX_IAS: u32 = 63;
/// Output (physical) address bits an entry holds.
pub const OAS: u32 = pte::ADDR_TOP_BIT + 1;
/// Default cap on table pages.
pub const DEFAULT_MAX_TABLE_PAGES: usize = 1 << 20;
/// The page size Linux leaves out of `AMD_IOMMU_PGSIZES`: 512 GiB.
pub const SZ_512G: u64 = 1 << 39;

/// Linux's default v1 page-size bitmap, `GENMASK_ULL(51, 12) ^ SZ_512G` (`X86.md` §3.3).
pub const LINUX_PGSIZES: u64 = (((1u64 << 52) - 1) & !((1u64 << 12) - 1)) ^ SZ_512G;

/// How to build an [`AmdV1Table`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AmdV1Config {
    /// Input (IOVA) address bits, [`MIN_IAS`]..=[`MAX_IAS`].
    pub ias: u32,
    /// Use every page size Linux uses (`true`) or 4 KiB only (`amd_iommu=nohugepages`).
    pub huge_pages: bool,
    /// Physical address of the first table page (the root). Default: the top of the
    /// 52-bit output space, below the region the cap needs.
    pub table_base: Option<PhysAddr>,
    /// Cap on table pages, the root included (default [`DEFAULT_MAX_TABLE_PAGES`]).
    pub max_table_pages: Option<usize>,
}

impl AmdV1Config {
    /// A table of `ias` input bits with Linux's page sizes.
    pub const fn new(ias: u32) -> Self {
        AmdV1Config {
            ias,
            huge_pages: true,
            table_base: None,
            max_table_pages: None,
        }
    }

    /// The same with 4 KiB pages only.
    pub const fn with_huge_pages(mut self, huge: bool) -> Self {
        self.huge_pages = huge;
        self
    }

    /// The same with the table pages placed from `base`.
    pub const fn with_table_base(mut self, base: PhysAddr) -> Self {
        self.table_base = Some(base);
        self
    }

    /// The same with a cap of `pages` table pages.
    pub const fn with_max_table_pages(mut self, pages: usize) -> Self {
        self.max_table_pages = Some(pages);
        self
    }
}

/// Why an [`AmdV1Config`] is invalid.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AmdV1ConfigError {
    /// The input size is outside [`MIN_IAS`]..=[`MAX_IAS`].
    #[error("Input address size {ias} is outside {MIN_IAS}..={MAX_IAS}")]
    UnsupportedInputSize {
        /// The size given.
        ias: u32,
    },
    /// The table cap is zero.
    #[error("The table page cap must be at least one page")]
    ZeroTableCap,
    /// The table region is misaligned or does not fit below 2^52.
    #[error("Table region at {base:#x} for {pages} pages is misaligned or beyond 2^52")]
    BadTableRegion {
        /// The base.
        base: u64,
        /// The cap.
        pages: usize,
    },
}

/// An AMD-Vi v1 host page table. See the [module docs](self).
#[derive(Clone)]
pub struct AmdV1Table {
    config: AmdV1Config,
    levels: u32,
    page_sizes: u64,
    table_base: u64,
    max_pages: usize,
    /// 512 entries per table page; slot `s` holds `entries[s * 512..]`, slot 0 the root.
    entries: Vec<u64>,
    mapped: u64,
}

impl std::fmt::Debug for AmdV1Table {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AmdV1Table")
            .field("ias", &self.config.ias)
            .field("levels", &self.levels)
            .field("root_pa", &self.root_pa())
            .field("table_pages", &self.table_pages())
            .field("mapped_bytes", &self.mapped)
            .finish()
    }
}

/// What a map does: the translation `pa - iova` and the permissions.
#[derive(Clone, Copy)]
struct Plan {
    delta: u64,
    prot: Prot,
}

/// A leaf found by [`AmdV1Table::find_leaf`].
#[derive(Clone, Copy)]
struct Leaf {
    slot: usize,
    /// Index of the first replica.
    index: usize,
    /// First IOVA of the page.
    base: u64,
    page_shift: u32,
}

impl AmdV1Table {
    /// Validates `config` and builds an empty table: just the root.
    ///
    /// # Errors
    ///
    /// [`AmdV1ConfigError`] for an input size out of range, a zero cap, or a table region
    /// that is misaligned or does not fit in 52 bits.
    pub fn new(config: AmdV1Config) -> Result<Self, AmdV1ConfigError> {
        if !(MIN_IAS..=MAX_IAS).contains(&config.ias) {
            return Err(AmdV1ConfigError::UnsupportedInputSize { ias: config.ias });
        }
        let max_pages = config.max_table_pages.unwrap_or(DEFAULT_MAX_TABLE_PAGES);
        if max_pages == 0 {
            return Err(AmdV1ConfigError::ZeroTableCap);
        }
        let region = (max_pages as u64).saturating_mul(TABLE_BYTES);
        let limit = 1u64 << OAS;
        let base = match config.table_base {
            Some(b) => b.get(),
            None => limit.saturating_sub(region),
        };
        let fits = base.checked_add(region).is_some_and(|end| end <= limit);
        if base % TABLE_BYTES != 0 || !fits {
            return Err(AmdV1ConfigError::BadTableRegion {
                base,
                pages: max_pages,
            });
        }
        let levels = (config.ias - 12).div_ceil(9);
        let page_sizes = if config.huge_pages {
            // Sizes a level of this table holds and the input range can contain.
            let top = config.ias.min(spec::level_shift(levels) + 8);
            LINUX_PGSIZES & (u64::MAX >> (63 - top))
        } else {
            1 << 12
        };
        Ok(AmdV1Table {
            config,
            levels,
            page_sizes,
            table_base: base,
            max_pages,
            entries: vec![0; ENTRIES_PER_TABLE],
            mapped: 0,
        })
    }

    /// The configuration it was built from.
    pub fn config(&self) -> &AmdV1Config {
        &self.config
    }

    /// Number of levels (the DTE Mode of devices attached to it).
    pub fn levels(&self) -> u32 {
        self.levels
    }

    /// Physical address of the root table.
    pub fn root_pa(&self) -> PhysAddr {
        PhysAddr::new(self.table_base)
    }

    /// The cap on table pages.
    pub fn max_table_pages(&self) -> usize {
        self.max_pages
    }

    /// Entry `index` of the table page at `table_pa`, as a hardware walker's memory read
    /// would see it; `None` when `table_pa` is not an allocated table page or `index` is
    /// not below 512.
    pub fn read_entry(&self, table_pa: PhysAddr, index: usize) -> Option<u64> {
        let slot = self.slot_at(table_pa.get())?;
        (index < ENTRIES_PER_TABLE).then(|| self.entries[slot * ENTRIES_PER_TABLE + index])
    }

    fn slot_at(&self, pa: u64) -> Option<usize> {
        let off = pa.checked_sub(self.table_base)?;
        if off % TABLE_BYTES != 0 {
            return None;
        }
        let slot = usize::try_from(off / TABLE_BYTES).ok()?;
        (slot < self.slots()).then_some(slot)
    }

    fn slots(&self) -> usize {
        self.entries.len() / ENTRIES_PER_TABLE
    }

    fn slot_pa(&self, slot: usize) -> u64 {
        self.table_base + slot as u64 * TABLE_BYTES
    }

    /// The slot a directory entry written by this table points at.
    fn child_slot(&self, entry: u64) -> usize {
        (((entry & pte::ADDR_MASK) - self.table_base) / TABLE_BYTES) as usize
    }

    fn index(level: u32, iova: u64) -> usize {
        ((iova >> spec::level_shift(level)) & (ENTRIES_PER_TABLE as u64 - 1)) as usize
    }

    fn entry(&self, slot: usize, index: usize) -> u64 {
        self.entries[slot * ENTRIES_PER_TABLE + index]
    }

    fn set(&mut self, slot: usize, index: usize, value: u64) {
        self.entries[slot * ENTRIES_PER_TABLE + index] = value;
    }

    fn alloc_table(&mut self, work: &mut WorkRecord) -> usize {
        let slot = self.slots();
        self.entries
            .resize(self.entries.len() + ENTRIES_PER_TABLE, 0);
        work.tables_allocated += 1;
        slot
    }

    fn check_args(&self, iova: u64, size: u64, pa: Option<u64>) -> Result<(), PgTableError> {
        let granule = 1u64 << 12;
        for addr in [Some(iova), pa].into_iter().flatten() {
            if addr % granule != 0 || size % granule != 0 {
                return Err(PgTableError::Misaligned {
                    addr,
                    size,
                    granule,
                });
            }
        }
        let end = 1u64 << self.config.ias;
        if !iova.checked_add(size).is_some_and(|e| e <= end) {
            return Err(PgTableError::OutOfRange {
                iova,
                size,
                start: 0,
                end,
            });
        }
        if let Some(pa) = pa {
            if !pa.checked_add(size).is_some_and(|e| e <= 1u64 << OAS) {
                return Err(PgTableError::PhysOutOfRange { pa, bits: OAS });
            }
        }
        Ok(())
    }

    /// The largest page size for a piece at `iova` (mapping to `iova + delta`) of at most
    /// `len` bytes that a table of `level` or below holds.
    fn pick(&self, iova: u64, len: u64, delta: u64, level: u32) -> u32 {
        let align = (iova | iova.wrapping_add(delta)).trailing_zeros();
        let top = align
            .min(63 - len.leading_zeros())
            .min(spec::level_shift(level) + 8);
        let fits = self.page_sizes & (u64::MAX >> (63 - top));
        // 4 KiB is always in the bitmap and `iova` and `len` are 4 KiB multiples.
        63 - fits.leading_zeros()
    }

    /// Places `[start, end)` in the table at `slot` (or, with `None`, in a table a dry run
    /// would have created: all empty) of `level`. A dry run only validates and counts the
    /// tables it would allocate in `new_tables` and the entries it reads in `reads`.
    #[allow(clippy::too_many_arguments)]
    fn place(
        &mut self,
        slot: Option<usize>,
        level: u32,
        start: u64,
        end: u64,
        plan: Plan,
        dry: bool,
        new_tables: &mut usize,
        work: &mut WorkRecord,
    ) -> Result<(), PgTableError> {
        let shift = spec::level_shift(level);
        let mut i = start;
        while i < end {
            let sub_end = end.min(((i >> shift) + 1) << shift);
            let idx = Self::index(level, i);
            let entry = match slot {
                Some(s) => {
                    if dry {
                        work.pte_reads += 1;
                    }
                    self.entry(s, idx)
                }
                None => 0,
            };
            if entry & pte::PR != 0 {
                match spec::decode_entry(entry, level) {
                    Entry::Table { .. } => {
                        let child = self.child_slot(entry);
                        self.place(
                            Some(child),
                            level - 1,
                            i,
                            sub_end,
                            plan,
                            dry,
                            new_tables,
                            work,
                        )?;
                        i = sub_end;
                        continue;
                    }
                    _ => return Err(PgTableError::AlreadyMapped { iova: i }),
                }
            }
            let mut p = self.pick(i, end - i, plan.delta, level);
            // A sized page needs all its replica entries empty; a kept table among them
            // makes the piece smaller (a present leaf is reported when the loop reaches it).
            while p >= shift {
                let count = spec::page_replicas(p) as usize;
                let busy = slot
                    .is_some_and(|s| (idx..idx + count).any(|j| self.entry(s, j) & pte::PR != 0));
                if !busy {
                    break;
                }
                let smaller = self.page_sizes & ((1u64 << p) - 1);
                p = 63 - smaller.leading_zeros();
            }
            if p >= shift {
                let count = spec::page_replicas(p) as usize;
                if !dry {
                    let leaf = spec::encode_leaf(i.wrapping_add(plan.delta), p, plan.prot);
                    let s = slot.expect("a real pass has real tables");
                    for j in idx..idx + count {
                        self.set(s, j, leaf);
                    }
                    work.ptes_written += count as u64;
                }
                i += 1u64 << p;
            } else {
                let child = if dry {
                    *new_tables += 1;
                    None
                } else {
                    let s = slot.expect("a real pass has real tables");
                    let child = self.alloc_table(work);
                    self.set(s, idx, spec::encode_pde(self.slot_pa(child), level - 1));
                    work.ptes_written += 1;
                    Some(child)
                };
                self.place(child, level - 1, i, sub_end, plan, dry, new_tables, work)?;
                i = sub_end;
            }
        }
        Ok(())
    }

    /// The leaf mapping `iova`, counting the entries read in `reads`.
    fn find_leaf(&self, iova: u64, reads: &mut u64) -> Option<Leaf> {
        let mut slot = 0;
        let mut level = self.levels;
        loop {
            let idx = Self::index(level, iova);
            let entry = self.entry(slot, idx);
            *reads += 1;
            match spec::decode_entry(entry, level) {
                Entry::Table { .. } => {
                    slot = self.child_slot(entry);
                    level -= 1;
                }
                Entry::Page { page_shift, .. } => {
                    let count = spec::page_replicas(page_shift) as usize;
                    return Some(Leaf {
                        slot,
                        index: idx & !(count - 1),
                        base: iova & !((1u64 << page_shift) - 1),
                        page_shift,
                    });
                }
                Entry::NotPresent | Entry::Invalid { .. } => return None,
            }
        }
    }
}

impl IoPageTable for AmdV1Table {
    fn format_name(&self) -> &'static str {
        "amd-v1"
    }

    fn page_size_bitmap(&self) -> u64 {
        self.page_sizes
    }

    fn iova_range(&self) -> (Iova, Iova) {
        (Iova::new(0), Iova::new(1u64 << self.config.ias))
    }

    fn map(
        &mut self,
        iova: Iova,
        pa: PhysAddr,
        size: u64,
        prot: Prot,
        work: &mut WorkRecord,
    ) -> Result<(), PgTableError> {
        let (start, pa) = (iova.get(), pa.get());
        self.check_args(start, size, Some(pa))?;
        if !prot.read && !prot.write {
            return Err(PgTableError::NoPermission);
        }
        if size == 0 {
            return Ok(());
        }
        let plan = Plan {
            delta: pa.wrapping_sub(start),
            prot,
        };
        let end = start + size;
        let mut needed = 0;
        self.place(
            Some(0),
            self.levels,
            start,
            end,
            plan,
            true,
            &mut needed,
            work,
        )?;
        if self.slots().saturating_add(needed) > self.max_pages {
            return Err(PgTableError::TooManyTables {
                limit: self.max_pages,
            });
        }
        self.place(
            Some(0),
            self.levels,
            start,
            end,
            plan,
            false,
            &mut needed,
            work,
        )
        .expect("validated by the dry run");
        self.mapped += size;
        Ok(())
    }

    fn unmap(
        &mut self,
        iova: Iova,
        size: u64,
        gather: &mut UnmapGather,
        work: &mut WorkRecord,
    ) -> Result<(), PgTableError> {
        let start = iova.get();
        self.check_args(start, size, None)?;
        let end = start + size;
        let mut reads = 0;
        let mut i = start;
        while i < end {
            let Some(leaf) = self.find_leaf(i, &mut reads) else {
                work.pte_reads += reads;
                return Err(PgTableError::NotMapped { iova: i });
            };
            let page = 1u64 << leaf.page_shift;
            if leaf.base < start || leaf.base + page > end {
                work.pte_reads += reads;
                return Err(PgTableError::SplitsBlock {
                    iova: start,
                    size,
                    block_iova: leaf.base,
                    block_size: page,
                });
            }
            i = leaf.base + page;
        }
        work.pte_reads += reads;
        let mut i = start;
        while i < end {
            let leaf = self
                .find_leaf(i, &mut 0)
                .expect("validated by the first pass");
            let count = spec::page_replicas(leaf.page_shift) as usize;
            for j in leaf.index..leaf.index + count {
                self.set(leaf.slot, j, 0);
            }
            work.ptes_cleared += count as u64;
            let page = 1u64 << leaf.page_shift;
            gather.add(Iova::new(leaf.base), page, page);
            i = leaf.base + page;
        }
        self.mapped -= size;
        Ok(())
    }

    fn translate(&self, iova: Iova, work: &mut WorkRecord) -> Option<Translation> {
        let iova = iova.get();
        if iova >> self.config.ias != 0 {
            return None;
        }
        let mut slot = 0;
        let mut level = self.levels;
        loop {
            let entry = self.entry(slot, Self::index(level, iova));
            work.pte_reads += 1;
            match spec::decode_entry(entry, level) {
                Entry::Table { .. } => {
                    slot = self.child_slot(entry);
                    level -= 1;
                }
                Entry::Page {
                    pa,
                    page_shift,
                    prot,
                } => {
                    let page_size = 1u64 << page_shift;
                    return Some(Translation {
                        pa: PhysAddr::new(pa | (iova & (page_size - 1))),
                        prot,
                        page_size,
                    });
                }
                Entry::NotPresent | Entry::Invalid { .. } => return None,
            }
        }
    }

    fn table_pages(&self) -> usize {
        self.slots()
    }

    fn mapped_bytes(&self) -> u64 {
        self.mapped
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::addr::{SZ_1G, SZ_2M, SZ_4K, SZ_64K};

    fn table(ias: u32) -> AmdV1Table {
        AmdV1Table::new(AmdV1Config::new(ias).with_table_base(PhysAddr::new(0x10_0000))).unwrap()
    }

    fn map(t: &mut AmdV1Table, iova: u64, pa: u64, size: u64) -> WorkRecord {
        let mut w = WorkRecord::new();
        t.map(
            Iova::new(iova),
            PhysAddr::new(pa),
            size,
            Prot::READ_WRITE,
            &mut w,
        )
        .unwrap();
        w
    }

    fn lookup(t: &AmdV1Table, iova: u64) -> Option<Translation> {
        t.translate(Iova::new(iova), &mut WorkRecord::new())
    }

    #[test]
    fn levels_follow_the_input_size() {
        let levels = |ias| table(ias).levels();
        assert_eq!(
            [21, 30, 32, 39, 40, 48, 57, 63].map(levels),
            [1, 2, 3, 3, 4, 4, 5, 6]
        );
        assert!(AmdV1Table::new(AmdV1Config::new(20)).is_err());
        assert!(AmdV1Table::new(AmdV1Config::new(64)).is_err());
        assert!(AmdV1Table::new(AmdV1Config::new(48).with_max_table_pages(0)).is_err());
        assert!(
            AmdV1Table::new(AmdV1Config::new(48).with_table_base(PhysAddr::new(0x1234))).is_err()
        );
    }

    #[test]
    fn page_sizes_are_linuxs_minus_512g_and_capped_by_the_range() {
        // 48 bits, four levels: every power of two from 4 KiB to 2^47 (256 replicas in the
        // root) except 2^39; a 2^48 page would need a fifth level.
        let t = table(48);
        let expected = (((1u64 << 48) - 1) & !0xfff) & !(1 << 39);
        assert_eq!(t.page_size_bitmap(), expected);
        // 32 bits, three levels: 4 KiB .. 4 GiB.
        assert_eq!(table(32).page_size_bitmap(), ((1u64 << 33) - 1) & !0xfff);
        // Six levels stop at 2^51.
        assert_eq!(table(63).page_size_bitmap(), LINUX_PGSIZES);
        let small = AmdV1Table::new(AmdV1Config::new(48).with_huge_pages(false)).unwrap();
        assert_eq!(small.page_size_bitmap(), SZ_4K);
    }

    #[test]
    fn a_4k_map_builds_one_table_per_level_with_real_entries() {
        let mut t = table(48);
        let w = map(&mut t, 0x1234_5000, 0xabc_d000, SZ_4K);
        // Three new tables (levels 3, 2, 1), three PDEs and one leaf.
        assert_eq!((w.tables_allocated, w.ptes_written), (3, 4));
        assert_eq!(t.table_pages(), 4);
        // Walk by hand. 0x1234_5000: level-4 index 0, level-3 index 0, level-2 index
        // 0x91 (0x1234_5000 >> 21), level-1 index 0x145.
        let root = t.root_pa();
        let l4 = t.read_entry(root, 0).unwrap();
        assert_eq!(l4, spec::encode_pde(0x10_1000, 3));
        let l3 = t.read_entry(PhysAddr::new(0x10_1000), 0).unwrap();
        assert_eq!(l3, spec::encode_pde(0x10_2000, 2));
        let l2 = t.read_entry(PhysAddr::new(0x10_2000), 0x91).unwrap();
        assert_eq!(l2, spec::encode_pde(0x10_3000, 1));
        let l1 = t.read_entry(PhysAddr::new(0x10_3000), 0x145).unwrap();
        assert_eq!(l1, 0x7000_0000_0abc_d001);
        let tr = lookup(&t, 0x1234_5678).unwrap();
        assert_eq!(tr.pa, PhysAddr::new(0xabc_d678));
        assert_eq!(tr.page_size, SZ_4K);
        assert_eq!(t.read_entry(PhysAddr::new(0x10_4000), 0), None);
        assert_eq!(t.read_entry(root, 512), None);
    }

    #[test]
    fn a_64k_map_is_sixteen_sized_replicas() {
        let mut t = table(48);
        let w = map(&mut t, 0x1_0000, 0x50_0000, SZ_64K);
        assert_eq!(w.ptes_written, 3 + 16);
        let leaf = spec::encode_leaf(0x50_0000, 16, Prot::READ_WRITE);
        // Level-1 table at 0x10_3000; entries 16..32 (0x1_0000 >> 12 = 16).
        for i in 0..ENTRIES_PER_TABLE {
            let e = t.read_entry(PhysAddr::new(0x10_3000), i).unwrap();
            assert_eq!(e, if (16..32).contains(&i) { leaf } else { 0 }, "entry {i}");
        }
        let tr = lookup(&t, 0x1_f123).unwrap();
        assert_eq!((tr.pa.get(), tr.page_size), (0x50_f123, SZ_64K));
        // Unmap gathers one 64 KiB page and clears all 16 replicas.
        let mut g = UnmapGather::new();
        let mut w = WorkRecord::new();
        t.unmap(Iova::new(0x1_0000), SZ_64K, &mut g, &mut w)
            .unwrap();
        assert_eq!(w.ptes_cleared, 16);
        assert_eq!(g.ranges.len(), 1);
        assert_eq!((g.ranges[0].size, g.ranges[0].page_size), (SZ_64K, SZ_64K));
        assert!(g.freed_tables.is_empty());
        assert!(lookup(&t, 0x1_0000).is_none());
    }

    #[test]
    fn an_aligned_6m_map_is_a_4m_page_and_a_2m_page() {
        let mut t = table(48);
        let w = map(&mut t, 0x4_0000_0000, 0x8000_0000, 3 * SZ_2M);
        // Two tables (levels 3 and 2), two PDEs, 2 replicas of 4 MiB, one 2 MiB entry.
        assert_eq!((w.tables_allocated, w.ptes_written), (2, 5));
        assert_eq!(lookup(&t, 0x4_0030_0000).unwrap().page_size, 2 * SZ_2M);
        assert_eq!(lookup(&t, 0x4_0050_0000).unwrap().page_size, SZ_2M);
        assert_eq!(
            lookup(&t, 0x4_0050_0000).unwrap().pa,
            PhysAddr::new(0x8050_0000)
        );
    }

    #[test]
    fn an_aligned_1g_map_is_one_level_3_entry() {
        let mut t = table(48);
        let w = map(&mut t, SZ_1G, 0x4000_0000, SZ_1G);
        assert_eq!((w.tables_allocated, w.ptes_written), (1, 2));
        let e = t.read_entry(PhysAddr::new(0x10_1000), 1).unwrap();
        assert_eq!(e, spec::encode_leaf(0x4000_0000, 30, Prot::READ_WRITE));
    }

    #[test]
    fn misaligned_physical_address_forces_4k_pages() {
        let mut t = table(48);
        let w = map(&mut t, 0, 0x1000, SZ_2M);
        assert_eq!(w.ptes_written, 3 + 512);
        assert_eq!(lookup(&t, 0x1f_f000).unwrap().pa, PhysAddr::new(0x20_0000));
    }

    #[test]
    fn unmap_keeps_tables_and_a_later_large_map_goes_through_them() {
        let mut t = table(48);
        map(&mut t, 0, 0x4000_0000, SZ_4K);
        let pages = t.table_pages();
        let mut g = UnmapGather::new();
        t.unmap(Iova::new(0), SZ_4K, &mut g, &mut WorkRecord::new())
            .unwrap();
        assert_eq!(t.table_pages(), pages);
        assert_eq!(t.mapped_bytes(), 0);
        // 2 MiB at 0 could be one level-2 entry, but the kept level-1 table sits there:
        // it becomes two 1 MiB pages of 256 replicas each in that table.
        let w = map(&mut t, 0, 0x4000_0000, SZ_2M);
        assert_eq!((w.tables_allocated, w.ptes_written), (0, 512));
        assert_eq!(lookup(&t, 0x1f_f000).unwrap().page_size, 1 << 20);
    }

    #[test]
    fn errors_leave_the_table_unchanged() {
        let mut t = table(32);
        map(&mut t, 0x20_0000, 0x20_0000, SZ_2M);
        let before = (t.table_pages(), t.mapped_bytes(), t.entries.clone());
        let mut w = WorkRecord::new();
        let mut g = UnmapGather::new();
        let pa = PhysAddr::new(0x100_0000);
        assert_eq!(
            t.map(Iova::new(0x1f_f000), pa, 0x2000, Prot::READ, &mut w),
            Err(PgTableError::AlreadyMapped { iova: 0x20_0000 })
        );
        assert_eq!(
            t.unmap(Iova::new(0x20_0000), SZ_4K, &mut g, &mut w),
            Err(PgTableError::SplitsBlock {
                iova: 0x20_0000,
                size: SZ_4K,
                block_iova: 0x20_0000,
                block_size: SZ_2M
            })
        );
        assert_eq!(
            t.unmap(Iova::new(0x20_0000), 2 * SZ_2M, &mut g, &mut w),
            Err(PgTableError::NotMapped { iova: 0x40_0000 })
        );
        assert!(matches!(
            t.map(Iova::new(0x800), pa, SZ_4K, Prot::READ, &mut w),
            Err(PgTableError::Misaligned { .. })
        ));
        assert!(matches!(
            t.map(Iova::new(0xffff_f000), pa, 0x2000, Prot::READ, &mut w),
            Err(PgTableError::OutOfRange { .. })
        ));
        assert!(matches!(
            t.map(
                Iova::new(0),
                PhysAddr::new(1 << 52),
                SZ_4K,
                Prot::READ,
                &mut w
            ),
            Err(PgTableError::PhysOutOfRange { .. })
        ));
        assert_eq!(
            t.map(Iova::new(0), pa, SZ_4K, Prot::NONE, &mut w),
            Err(PgTableError::NoPermission)
        );
        assert!(g.is_empty());
        assert_eq!(
            (t.table_pages(), t.mapped_bytes(), t.entries.clone()),
            before
        );
    }

    #[test]
    fn a_six_level_table_maps_high_addresses() {
        let mut t = table(63);
        assert_eq!(t.levels(), 6);
        // 0x7000_0000_0000_0000: level-6 index 0x38 (bits 62:57).
        let w = map(&mut t, 0x7000_0000_0000_0000, 0x1234_5000, SZ_4K);
        assert_eq!((w.tables_allocated, w.ptes_written), (5, 6));
        assert_eq!(
            t.read_entry(t.root_pa(), 0x38),
            Some(spec::encode_pde(0x10_1000, 5))
        );
        let mut w = WorkRecord::new();
        let tr = t
            .translate(Iova::new(0x7000_0000_0000_0abc), &mut w)
            .unwrap();
        assert_eq!((tr.pa.get(), w.pte_reads), (0x1234_5abc, 6));
        assert_eq!(lookup(&t, 0x7000_0000_0000_1000), None);
        assert_eq!(lookup(&t, 1 << 63), None, "beyond the 63-bit input range");
    }

    #[test]
    fn the_table_cap_is_checked_before_writing() {
        let mut t = AmdV1Table::new(
            AmdV1Config::new(48)
                .with_table_base(PhysAddr::new(0))
                .with_max_table_pages(3),
        )
        .unwrap();
        let mut w = WorkRecord::new();
        assert_eq!(
            t.map(Iova::new(0), PhysAddr::new(0), SZ_4K, Prot::READ, &mut w),
            Err(PgTableError::TooManyTables { limit: 3 })
        );
        assert_eq!(t.table_pages(), 1);
        // A 1 GiB page needs only the level-3 table.
        t.map(Iova::new(0), PhysAddr::new(0), SZ_1G, Prot::READ, &mut w)
            .unwrap();
        assert_eq!(t.table_pages(), 2);
    }
}
