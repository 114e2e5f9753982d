//! VT-d page tables in simulated physical memory: the second-stage format (and the
//! first-stage, x86-64 format) as an [`IoPageTable`].
//!
//! Geometry (X86.md §1.4): 4 KiB table pages of 512 eight-byte entries, 9 bits per level,
//! 3, 4 or 5 levels (39, 48 or 57 input bits). Levels are numbered as the VT-d walk does,
//! from `levels` at the root down to 1, whose entries map 4 KiB pages; a level-2 entry with
//! PS maps 2 MiB and a level-3 entry 1 GiB, when the unit allows them (CAP.SLLPS for the
//! second stage, always 2 MiB and FL1GP for 1 GiB on the first stage).
//!
//! Every table page is a real page of a [`PhysMemory`], taken from a [`PhysAllocator`], and
//! every entry is written there in the bit-exact format of [`super::spec`], so a
//! remapping unit ([`Dmar`](super::Dmar)) walks the same bytes from the context entry's
//! pointer. Entries are encoded as Linux does: second-stage non-leaf entries carry R and W,
//! leaves R/W from the mapping and PS above level 1; first-stage entries pre-set A, U/S and
//! (writable leaves) D, and XD on every entry when the table's [`FlExecControl`] says
//! (Linux 5.6 to 6.10; not by default, as Linux 6.12).
//!
//! - Map picks, for each piece, the largest page the alignment of IOVA and physical address
//!   and the remaining length allow (Linux `hardware_largepage_caps`). A superpage slot that
//!   already holds a (kept, empty) table is mapped through that table with smaller pages
//!   instead of Linux's `switch_to_super_page` (which frees the table inside map, with no
//!   gather to report it in).
//! - Unmap clears leaves and, like Linux `dma_pte_clear_level`, unlinks and frees every table
//!   whose whole span the range covers (children first, reported in the gather). A table
//!   emptied by a partial unmap stays until [`VtdPageTable::reclaim_empty_tables`].
//! - Both validate before writing: a failed call writes nothing. Unmap never splits a
//!   superpage ([`PgTableError::SplitsBlock`]); Linux widens such an unmap instead.
//!
//! Freed pages go back to the allocator at once: the gather's walk invalidation must run
//! before the next allocation may reuse them, as with Linux's freelist.
//!
//! Work counted: `pte_reads` (each entry examined once by the validating walk), `ptes_written`,
//! `ptes_cleared`, `tables_allocated`, `tables_freed`. The allocator's lock is not counted
//! (the LPAE table counts none for its page arena either).

use std::sync::Arc;

use super::spec::{self, FlExecControl, FlPte, SlPte};
use crate::addr::{Iova, PhysAddr, Prot, SZ_1G, SZ_2M, SZ_4K};
use crate::mem::{MemError, PhysAllocator, PhysMemory};
use crate::pgtable::{FreedTable, IoPageTable, PgTableError, Translation, UnmapGather};
use crate::work::WorkRecord;

/// Entries per table page.
pub const ENTRIES: u64 = 512;
/// Highest output-address bit an entry holds (bits 51:12).
pub const OA_BITS: u32 = 52;

/// Which VT-d page-table format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum VtdStage {
    /// Second stage ("second level"): R/W bits, PS superpages, present = R|W.
    Second,
    /// First stage: x86-64 long-mode paging; input addresses must be canonical, so the
    /// table covers the lower half of its width (Linux's aperture 2^(gaw−1)).
    First,
}

/// How to build a [`VtdPageTable`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct VtdTableConfig {
    /// The format.
    pub stage: VtdStage,
    /// 3, 4 or 5.
    pub levels: u32,
    /// Large pages allowed, in CAP.SLLPS layout: bit 0 = 2 MiB, bit 1 = 1 GiB.
    pub large_pages: u32,
    /// Most table pages in use at once, the root included.
    pub max_table_pages: usize,
    /// First stage: whether entries carry XD, as the modelled Linux release writes them
    /// (default: Linux 6.12's, no XD). Ignored for the second stage.
    pub exec: FlExecControl,
}

impl VtdTableConfig {
    /// A second-stage table of `levels` levels with 2 MiB and 1 GiB pages (Linux with a
    /// unit whose SLLPS is 0b11) and no practical cap on table pages.
    pub const fn second_stage(levels: u32) -> Self {
        Self {
            stage: VtdStage::Second,
            levels,
            large_pages: 0b11,
            max_table_pages: 1 << 20,
            exec: FlExecControl::LINUX_6_11,
        }
    }

    /// A first-stage table of `levels` levels with 2 MiB pages (and 1 GiB if `fl1gp`).
    pub const fn first_stage(levels: u32, fl1gp: bool) -> Self {
        Self {
            stage: VtdStage::First,
            levels,
            large_pages: if fl1gp { 0b11 } else { 0b01 },
            max_table_pages: 1 << 20,
            exec: FlExecControl::LINUX_6_11,
        }
    }

    /// The same with first-stage entries encoded per `exec` (XD or not; NXE belongs to the
    /// PASID entry, which [`Dmar::attach`](super::Dmar::attach) writes from it).
    pub const fn with_exec_control(mut self, exec: FlExecControl) -> Self {
        self.exec = exec;
        self
    }

    /// The same with superpages limited to `sllps` (as a unit's CAP.SLLPS, or 0 for
    /// `intel_iommu=sp_off`).
    pub const fn with_large_pages(mut self, sllps: u32) -> Self {
        self.large_pages = sllps & 0b11;
        self
    }

    /// The same with a cap on table pages.
    pub const fn with_max_table_pages(mut self, max: usize) -> Self {
        self.max_table_pages = max;
        self
    }
}

/// Why a [`VtdPageTable`] could not be built.
#[derive(Debug, thiserror::Error)]
pub enum VtdTableError {
    /// Levels other than 3, 4 or 5.
    #[error("VT-d tables have 3, 4 or 5 levels, not {levels}")]
    BadLevels {
        /// Levels asked for.
        levels: u32,
    },
    /// A cap below one page (the root).
    #[error("A table needs at least its root page")]
    NoRoom,
    /// The root page could not be allocated.
    #[error("Cannot allocate the root table page")]
    Memory(#[from] MemError),
}

/// What an entry means.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Entry {
    None,
    Table(u64),
    Leaf(u64, Prot),
}

/// A VT-d page table in simulated memory. See the module docs.
pub struct VtdPageTable {
    config: VtdTableConfig,
    alloc: Arc<PhysAllocator>,
    root: u64,
    tables: usize,
    mapped: u64,
}

impl std::fmt::Debug for VtdPageTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VtdPageTable")
            .field("config", &self.config)
            .field("root", &format_args!("{:#x}", self.root))
            .field("tables", &self.tables)
            .field("mapped", &self.mapped)
            .finish()
    }
}

/// log2 of the bytes one entry at `level` maps.
#[inline]
const fn level_shift(level: u32) -> u32 {
    12 + 9 * (level - 1)
}

impl VtdPageTable {
    /// An empty table whose root page comes from `alloc`.
    pub fn new(config: VtdTableConfig, alloc: Arc<PhysAllocator>) -> Result<Self, VtdTableError> {
        if !(3..=5).contains(&config.levels) {
            return Err(VtdTableError::BadLevels {
                levels: config.levels,
            });
        }
        if config.max_table_pages == 0 {
            return Err(VtdTableError::NoRoom);
        }
        let root = alloc
            .alloc(1, 1, PhysAddr::new(u64::MAX), &mut WorkRecord::new())?
            .get();
        Ok(Self {
            config,
            alloc,
            root,
            tables: 1,
            mapped: 0,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &VtdTableConfig {
        &self.config
    }

    /// Physical address of the root table (what a context or PASID entry points at).
    pub fn root_pa(&self) -> PhysAddr {
        PhysAddr::new(self.root)
    }

    /// Number of levels.
    pub fn levels(&self) -> u32 {
        self.config.levels
    }

    /// The AGAW code for context / PASID entries (levels − 2).
    pub fn agaw(&self) -> u8 {
        spec::agaw_of_levels(self.config.levels) as u8
    }

    /// The memory the table lives in.
    pub fn memory(&self) -> &Arc<PhysMemory> {
        self.alloc.memory()
    }

    fn read(&self, table: u64, index: u64) -> u64 {
        read_u64(self.memory(), table + index * 8)
    }

    fn write(&self, table: u64, index: u64, value: u64) {
        let ok = self
            .memory()
            .write(PhysAddr::new(table + index * 8), &value.to_le_bytes());
        debug_assert!(ok.is_ok(), "table pages lie inside memory");
    }

    fn decode(&self, raw: u64, level: u32) -> Entry {
        match self.config.stage {
            VtdStage::Second => match SlPte::decode(raw, level) {
                SlPte::NotPresent => Entry::None,
                SlPte::Table { next } => Entry::Table(next),
                SlPte::Leaf { pa, prot } => Entry::Leaf(pa, prot),
            },
            VtdStage::First => match FlPte::decode(raw, level) {
                FlPte::NotPresent => Entry::None,
                FlPte::Table { next, .. } => Entry::Table(next),
                FlPte::Leaf { pa, write } => Entry::Leaf(pa, Prot { read: true, write }),
            },
        }
    }

    fn leaf_bits(&self, pa: u64, prot: Prot, level: u32) -> u64 {
        match self.config.stage {
            VtdStage::Second => SlPte::leaf(pa, prot, level > 1),
            VtdStage::First => FlPte::leaf_with(pa, prot.write, level > 1, self.config.exec),
        }
    }

    fn table_bits(&self, next: u64) -> u64 {
        match self.config.stage {
            VtdStage::Second => SlPte::table(next),
            VtdStage::First => FlPte::table_with(next, self.config.exec),
        }
    }

    /// Whether a leaf may be written at `level` for `cur..end` mapping to `pa`.
    fn leaf_fits(&self, level: u32, cur: u64, end: u64, pa: u64) -> bool {
        if level == 1 {
            return true;
        }
        let size = 1u64 << level_shift(level);
        self.page_size_bitmap() & size != 0
            && cur % size == 0
            && pa % size == 0
            && end - cur >= size
    }

    /// Table pages a map of `cur..end` needs below a not-present entry at `level + 1`
    /// (tables at `level` and below).
    fn fresh_tables(&self, level: u32, cur: u64, end: u64, pa_of: &impl Fn(u64) -> u64) -> usize {
        let span = 1u64 << level_shift(level);
        let mut n = 1;
        let mut c = cur;
        while c < end && level > 1 {
            let chunk_end = end.min((c & !(span - 1)) + span);
            if !self.leaf_fits(level, c, chunk_end, pa_of(c)) {
                n += self.fresh_tables(level - 1, c, chunk_end, pa_of);
            }
            c = chunk_end;
        }
        n
    }

    /// The validating walk of a map: the first mapped IOVA, and the tables needed.
    #[allow(clippy::too_many_arguments)]
    fn check_map(
        &self,
        table: u64,
        level: u32,
        cur: u64,
        end: u64,
        pa_of: &impl Fn(u64) -> u64,
        needed: &mut usize,
        work: &mut WorkRecord,
    ) -> Result<(), PgTableError> {
        let span = 1u64 << level_shift(level);
        let mut c = cur;
        while c < end {
            let chunk_end = end.min((c & !(span - 1)) + span);
            let index = (c >> level_shift(level)) % ENTRIES;
            work.pte_reads += 1;
            match self.decode(self.read(table, index), level) {
                Entry::Leaf(..) => return Err(PgTableError::AlreadyMapped { iova: c }),
                Entry::Table(next) => {
                    self.check_map(next, level - 1, c, chunk_end, pa_of, needed, work)?
                }
                Entry::None => {
                    if !self.leaf_fits(level, c, chunk_end, pa_of(c)) {
                        *needed += self.fresh_tables(level - 1, c, chunk_end, pa_of);
                    }
                }
            }
            c = chunk_end;
        }
        Ok(())
    }

    fn alloc_table(&mut self, work: &mut WorkRecord) -> Result<u64, PgTableError> {
        let pa = self
            .alloc
            .alloc(1, 1, PhysAddr::new(u64::MAX), &mut WorkRecord::new())
            .map_err(|_| PgTableError::TooManyTables { limit: self.tables })?;
        self.tables += 1;
        work.tables_allocated += 1;
        Ok(pa.get())
    }

    fn free_table(&mut self, pa: u64, work: &mut WorkRecord) {
        let ok = self
            .alloc
            .free(PhysAddr::new(pa), 1, &mut WorkRecord::new());
        debug_assert!(ok.is_ok(), "a table page is freed once");
        self.tables -= 1;
        work.tables_freed += 1;
    }

    /// The writing walk of a validated map.
    #[allow(clippy::too_many_arguments)]
    fn do_map(
        &mut self,
        table: u64,
        level: u32,
        cur: u64,
        end: u64,
        pa_of: &impl Fn(u64) -> u64,
        prot: Prot,
        work: &mut WorkRecord,
    ) -> Result<(), PgTableError> {
        let shift = level_shift(level);
        let span = 1u64 << shift;
        let mut c = cur;
        while c < end {
            let chunk_end = end.min((c & !(span - 1)) + span);
            let index = (c >> shift) % ENTRIES;
            let next = match self.decode(self.read(table, index), level) {
                Entry::Table(next) => Some(next),
                Entry::Leaf(..) => return Err(PgTableError::AlreadyMapped { iova: c }),
                Entry::None if self.leaf_fits(level, c, chunk_end, pa_of(c)) => {
                    self.write(table, index, self.leaf_bits(pa_of(c), prot, level));
                    work.ptes_written += 1;
                    self.mapped += span;
                    None
                }
                Entry::None => {
                    let next = self.alloc_table(work)?;
                    self.write(table, index, self.table_bits(next));
                    work.ptes_written += 1;
                    Some(next)
                }
            };
            if let Some(next) = next {
                self.do_map(next, level - 1, c, chunk_end, pa_of, prot, work)?;
            }
            c = chunk_end;
        }
        Ok(())
    }

    /// The validating walk of an unmap: the first hole or cut superpage, in IOVA order.
    fn check_unmap(
        &self,
        table: u64,
        level: u32,
        cur: u64,
        end: u64,
        req: (u64, u64),
        work: &mut WorkRecord,
    ) -> Result<(), PgTableError> {
        let span = 1u64 << level_shift(level);
        let mut c = cur;
        while c < end {
            let start = c & !(span - 1);
            let chunk_end = end.min(start + span);
            let index = (c >> level_shift(level)) % ENTRIES;
            work.pte_reads += 1;
            match self.decode(self.read(table, index), level) {
                Entry::None => return Err(PgTableError::NotMapped { iova: c }),
                Entry::Leaf(..) => {
                    if start < req.0 || start + span > req.0 + req.1 {
                        return Err(PgTableError::SplitsBlock {
                            iova: req.0,
                            size: req.1,
                            block_iova: start,
                            block_size: span,
                        });
                    }
                }
                Entry::Table(next) => self.check_unmap(next, level - 1, c, chunk_end, req, work)?,
            }
            c = chunk_end;
        }
        Ok(())
    }

    /// Gathers the leaves of the table at `level` covering from `base`, frees its subtables,
    /// children first (the caller frees `table` itself).
    fn free_subtree(
        &mut self,
        table: u64,
        level: u32,
        base: u64,
        gather: &mut UnmapGather,
        work: &mut WorkRecord,
    ) {
        let span = 1u64 << level_shift(level);
        let entries = read_table(self.memory(), table);
        for (i, raw) in entries.into_iter().enumerate() {
            let at = base + i as u64 * span;
            match self.decode(raw, level) {
                Entry::None => {}
                Entry::Leaf(..) => {
                    gather.add(Iova::new(at), span, span);
                    self.mapped -= span;
                }
                Entry::Table(next) => {
                    self.free_subtree(next, level - 1, at, gather, work);
                    self.release(next, level - 1, at, span, gather, work);
                }
            }
        }
    }

    /// Frees the table at `level` that translated `span` bytes from `iova`, reporting it.
    fn release(
        &mut self,
        table: u64,
        level: u32,
        iova: u64,
        span: u64,
        gather: &mut UnmapGather,
        work: &mut WorkRecord,
    ) {
        self.free_table(table, work);
        gather.add_freed_table(FreedTable {
            table_pa: PhysAddr::new(table),
            level: self.config.levels - level,
            iova: Iova::new(iova),
            size: span,
        });
    }

    /// The clearing walk of a validated unmap.
    fn do_unmap(
        &mut self,
        table: u64,
        level: u32,
        cur: u64,
        end: u64,
        gather: &mut UnmapGather,
        work: &mut WorkRecord,
    ) {
        let span = 1u64 << level_shift(level);
        let mut c = cur;
        while c < end {
            let start = c & !(span - 1);
            let chunk_end = end.min(start + span);
            let index = (c >> level_shift(level)) % ENTRIES;
            match self.decode(self.read(table, index), level) {
                Entry::None => {}
                Entry::Leaf(..) => {
                    self.write(table, index, 0);
                    work.ptes_cleared += 1;
                    gather.add(Iova::new(start), span, span);
                    self.mapped -= span;
                }
                Entry::Table(next) if c == start && chunk_end == start + span => {
                    // The whole span goes: unlink the table and free it with everything below.
                    self.write(table, index, 0);
                    work.ptes_cleared += 1;
                    self.free_subtree(next, level - 1, start, gather, work);
                    self.release(next, level - 1, start, span, gather, work);
                }
                Entry::Table(next) => self.do_unmap(next, level - 1, c, chunk_end, gather, work),
            }
            c = chunk_end;
        }
    }

    fn check_range(&self, iova: u64, size: u64) -> Result<u64, PgTableError> {
        if iova % SZ_4K != 0 || size % SZ_4K != 0 || size == 0 {
            return Err(PgTableError::Misaligned {
                addr: iova,
                size,
                granule: SZ_4K,
            });
        }
        let (lo, hi) = self.iova_range();
        match iova.checked_add(size) {
            Some(end) if iova >= lo.get() && end <= hi.get() => Ok(end),
            _ => Err(PgTableError::OutOfRange {
                iova,
                size,
                start: lo.get(),
                end: hi.get(),
            }),
        }
    }

    /// Frees every table page (the root aside) holding no entry, children first, clearing
    /// the entries that pointed at them, as a teardown or memory-pressure pass would.
    /// Returns the number freed; each is reported in `gather` for walk invalidation.
    pub fn reclaim_empty_tables(
        &mut self,
        gather: &mut UnmapGather,
        work: &mut WorkRecord,
    ) -> usize {
        let before = work.tables_freed;
        self.reclaim_rec(self.root, self.config.levels, 0, gather, work);
        (work.tables_freed - before) as usize
    }

    /// Returns whether the table is empty after reclaiming below it.
    fn reclaim_rec(
        &mut self,
        table: u64,
        level: u32,
        base: u64,
        gather: &mut UnmapGather,
        work: &mut WorkRecord,
    ) -> bool {
        let span = 1u64 << level_shift(level);
        let entries = read_table(self.memory(), table);
        let mut empty = true;
        for (i, raw) in entries.into_iter().enumerate() {
            let at = base + i as u64 * span;
            match self.decode(raw, level) {
                Entry::None if raw == 0 => {}
                Entry::Table(next) if self.reclaim_rec(next, level - 1, at, gather, work) => {
                    self.write(table, i as u64, 0);
                    work.ptes_cleared += 1;
                    self.release(next, level - 1, at, span, gather, work);
                }
                _ => empty = false,
            }
        }
        empty
    }
}

/// Reads the 64-bit little-endian word at `pa` (zero outside memory).
pub(crate) fn read_u64(memory: &PhysMemory, pa: u64) -> u64 {
    let mut buf = [0u8; 8];
    let ok = memory.read(PhysAddr::new(pa), &mut buf);
    debug_assert!(ok.is_ok(), "read of {pa:#x} outside memory");
    u64::from_le_bytes(buf)
}

/// Reads a whole table page.
fn read_table(memory: &PhysMemory, pa: u64) -> Vec<u64> {
    let mut buf = vec![0u8; SZ_4K as usize];
    let ok = memory.read(PhysAddr::new(pa), &mut buf);
    debug_assert!(ok.is_ok(), "table page {pa:#x} outside memory");
    buf.chunks_exact(8)
        .map(|c| u64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
        .collect()
}

impl IoPageTable for VtdPageTable {
    fn format_name(&self) -> &'static str {
        match (self.config.stage, self.config.levels) {
            (VtdStage::Second, 3) => "vtd-sl-3level",
            (VtdStage::Second, 4) => "vtd-sl-4level",
            (VtdStage::Second, _) => "vtd-sl-5level",
            (VtdStage::First, 3) => "vtd-fl-3level",
            (VtdStage::First, 4) => "vtd-fl-4level",
            (VtdStage::First, _) => "vtd-fl-5level",
        }
    }

    fn page_size_bitmap(&self) -> u64 {
        let mut b = SZ_4K;
        if self.config.large_pages & 1 != 0 {
            b |= SZ_2M;
        }
        if self.config.large_pages & 2 != 0 {
            b |= SZ_1G;
        }
        b
    }

    fn iova_range(&self) -> (Iova, Iova) {
        let width = spec::width_of_levels(self.config.levels);
        let width = match self.config.stage {
            VtdStage::Second => width,
            VtdStage::First => width - 1,
        };
        (Iova::new(0), Iova::new(1u64 << width))
    }

    fn map(
        &mut self,
        iova: Iova,
        pa: PhysAddr,
        size: u64,
        prot: Prot,
        work: &mut WorkRecord,
    ) -> Result<(), PgTableError> {
        let (iova, pa) = (iova.get(), pa.get());
        let end = self.check_range(iova, size)?;
        if pa % SZ_4K != 0 {
            return Err(PgTableError::Misaligned {
                addr: pa,
                size,
                granule: SZ_4K,
            });
        }
        if !pa.checked_add(size).is_some_and(|e| e <= 1 << OA_BITS) {
            return Err(PgTableError::PhysOutOfRange { pa, bits: OA_BITS });
        }
        if prot == Prot::NONE {
            return Err(PgTableError::NoPermission);
        }
        let pa_of = move |c: u64| pa + (c - iova);
        let mut needed = 0;
        let levels = self.config.levels;
        self.check_map(self.root, levels, iova, end, &pa_of, &mut needed, work)?;
        if self.tables + needed > self.config.max_table_pages {
            return Err(PgTableError::TooManyTables {
                limit: self.config.max_table_pages,
            });
        }
        self.do_map(self.root, levels, iova, end, &pa_of, prot, work)
    }

    fn unmap(
        &mut self,
        iova: Iova,
        size: u64,
        gather: &mut UnmapGather,
        work: &mut WorkRecord,
    ) -> Result<(), PgTableError> {
        let iova = iova.get();
        let end = self.check_range(iova, size)?;
        let levels = self.config.levels;
        self.check_unmap(self.root, levels, iova, end, (iova, size), work)?;
        self.do_unmap(self.root, levels, iova, end, gather, work);
        Ok(())
    }

    fn translate(&self, iova: Iova, work: &mut WorkRecord) -> Option<Translation> {
        let iova = iova.get();
        if iova >= self.iova_range().1.get() {
            return None;
        }
        let mut table = self.root;
        for level in (1..=self.config.levels).rev() {
            let shift = level_shift(level);
            work.pte_reads += 1;
            match self.decode(self.read(table, (iova >> shift) % ENTRIES), level) {
                Entry::None => return None,
                Entry::Table(next) => table = next,
                Entry::Leaf(pa, prot) => {
                    let size = 1u64 << shift;
                    return Some(Translation {
                        pa: PhysAddr::new(pa + (iova & (size - 1))),
                        prot,
                        page_size: size,
                    });
                }
            }
        }
        None
    }

    fn table_pages(&self) -> usize {
        self.tables
    }

    fn mapped_bytes(&self) -> u64 {
        self.mapped
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::addr::SZ_1G;

    fn alloc() -> Arc<PhysAllocator> {
        let mem = Arc::new(PhysMemory::new(64 << 20).unwrap());
        Arc::new(
            PhysAllocator::new(mem, PhysAddr::new(0x10_0000), PhysAddr::new(64 << 20)).unwrap(),
        )
    }

    #[test]
    fn a_4k_map_writes_one_table_per_level_and_real_entries() {
        let a = alloc();
        let mut t = VtdPageTable::new(VtdTableConfig::second_stage(4), a.clone()).unwrap();
        let mut w = WorkRecord::new();
        // IOVA 0x8040_3000: indices L4 0, L3 2, L2 2, L1 3.
        t.map(
            Iova::new(0x8040_3000),
            PhysAddr::new(0x1234_5000),
            SZ_4K,
            Prot::READ,
            &mut w,
        )
        .unwrap();
        assert_eq!(w.tables_allocated, 3);
        assert_eq!(w.ptes_written, 4);
        assert_eq!(t.table_pages(), 4);
        let mem = a.memory();
        let l4 = read_u64(mem, t.root_pa().get());
        assert_eq!(l4 & 3, 3, "non-leaf entries carry R and W");
        let l3 = read_u64(mem, (l4 & spec::PTE_ADDR_MASK) + 2 * 8);
        let l2 = read_u64(mem, (l3 & spec::PTE_ADDR_MASK) + 2 * 8);
        let l1 = read_u64(mem, (l2 & spec::PTE_ADDR_MASK) + 3 * 8);
        assert_eq!(l1, 0x1234_5001);
        let tr = t.translate(Iova::new(0x8040_3abc), &mut w).unwrap();
        assert_eq!(tr.pa, PhysAddr::new(0x1234_5abc));
        assert_eq!(tr.page_size, SZ_4K);
    }

    #[test]
    fn superpages_follow_alignment_and_sllps() {
        let mut t = VtdPageTable::new(VtdTableConfig::second_stage(4), alloc()).unwrap();
        let mut w = WorkRecord::new();
        t.map(
            Iova::new(SZ_1G),
            PhysAddr::new(2 * SZ_1G),
            SZ_1G + SZ_2M,
            Prot::READ_WRITE,
            &mut w,
        )
        .unwrap();
        // One 1 GiB leaf at level 3 and one 2 MiB leaf at level 2 (one new level-2 table).
        assert_eq!(w.ptes_written, 1 + 1 + 1 + 1);
        assert_eq!(
            t.translate(Iova::new(SZ_1G + 5), &mut w).unwrap().page_size,
            SZ_1G
        );
        assert_eq!(
            t.translate(Iova::new(2 * SZ_1G), &mut w).unwrap().page_size,
            SZ_2M
        );

        let mut sp_off =
            VtdPageTable::new(VtdTableConfig::second_stage(4).with_large_pages(0), alloc())
                .unwrap();
        assert_eq!(sp_off.page_size_bitmap(), SZ_4K);
        sp_off
            .map(Iova::new(0), PhysAddr::new(0), SZ_2M, Prot::READ, &mut w)
            .unwrap();
        assert_eq!(
            sp_off.translate(Iova::new(0), &mut w).unwrap().page_size,
            SZ_4K
        );
    }

    #[test]
    fn unmap_frees_covered_tables_and_gathers() {
        let mut t = VtdPageTable::new(VtdTableConfig::second_stage(5), alloc()).unwrap();
        assert_eq!(t.iova_range().1, Iova::new(1 << 57));
        let mut w = WorkRecord::new();
        t.map(
            Iova::new(SZ_2M),
            PhysAddr::new(SZ_4K),
            SZ_2M,
            Prot::READ,
            &mut w,
        )
        .unwrap();
        assert_eq!(t.table_pages(), 5);
        let mut g = UnmapGather::new();
        let mut w = WorkRecord::new();
        t.unmap(Iova::new(SZ_2M), SZ_2M, &mut g, &mut w).unwrap();
        assert_eq!(g.bytes(), SZ_2M);
        assert_eq!(g.ranges.len(), 1);
        assert_eq!(g.ranges[0].page_size, SZ_4K);
        // The level-1 table's whole span went: it is freed (depth 4 of a 5-level table).
        assert_eq!(g.freed_tables.len(), 1);
        assert_eq!(g.freed_tables[0].level, 4);
        assert_eq!(g.freed_tables[0].size, SZ_2M);
        assert_eq!(w.ptes_cleared, 1);
        assert_eq!(t.table_pages(), 4);
        assert_eq!(t.mapped_bytes(), 0);
        let mut g = UnmapGather::new();
        assert_eq!(t.reclaim_empty_tables(&mut g, &mut w), 3);
        assert_eq!(t.table_pages(), 1);
    }

    #[test]
    fn first_stage_entries_and_canonical_range() {
        let a = alloc();
        let mut w = WorkRecord::new();
        // A table of `cfg` with 2 MiB at IOVA 0 mapped writable, and its PML4 and PD entries.
        let mapped = |cfg: VtdTableConfig, w: &mut WorkRecord| {
            let mut t = VtdPageTable::new(cfg, a.clone()).unwrap();
            t.map(Iova::new(0), PhysAddr::new(SZ_2M), SZ_2M, Prot::WRITE, w)
                .unwrap();
            let l4 = read_u64(a.memory(), t.root_pa().get());
            let l3 = read_u64(a.memory(), l4 & spec::PTE_ADDR_MASK);
            let l2 = read_u64(a.memory(), l3 & spec::PTE_ADDR_MASK);
            (t, l4, l2)
        };
        let (mut t, l4, l2) = mapped(VtdTableConfig::first_stage(4, false), &mut w);
        assert_eq!(t.iova_range().1, Iova::new(1 << 47));
        assert_eq!(t.page_size_bitmap(), SZ_4K | SZ_2M);
        assert_eq!(l4 & 0xFFF, 0x27);
        assert_eq!(l2, FlPte::leaf(SZ_2M, true, true));
        let tr = t.translate(Iova::new(0x1000), &mut w).unwrap();
        assert_eq!(tr.prot, Prot::READ_WRITE);
        // With Linux 6.3's encoding every entry carries XD, and the walk reads through it.
        let cfg = VtdTableConfig::first_stage(4, false).with_exec_control(FlExecControl::LINUX_6_3);
        let (x, l4, l2) = mapped(cfg, &mut w);
        assert_eq!(l4 & !spec::PTE_ADDR_MASK, spec::fl::XD | 0x27);
        assert_eq!(l2, spec::fl::XD | FlPte::leaf(SZ_2M, true, true));
        let tr = x.translate(Iova::new(0x1000), &mut w).unwrap();
        assert_eq!(
            (tr.pa, tr.prot),
            (PhysAddr::new(SZ_2M + 0x1000), Prot::READ_WRITE)
        );
        assert!(matches!(
            t.map(
                Iova::new(1 << 47),
                PhysAddr::new(0),
                SZ_4K,
                Prot::READ,
                &mut w
            ),
            Err(PgTableError::OutOfRange { .. })
        ));
    }
}
