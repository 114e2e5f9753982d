//! ARM VMSAv8-64 long-descriptor (LPAE) stage-1 translation tables, as walked by SMMUv3 and
//! IPMMU-VMSA.
//!
//! The geometry follows the architecture (and Linux's `io-pgtable-arm.c`):
//!
//! - A granule of 4 KiB, 16 KiB or 64 KiB (`g` = 12, 14 or 16 bits). Each table page holds
//!   `2^(g-3)` 8-byte descriptors, so each level resolves `g - 3` bits of the input address.
//! - Level 3 is the leaf level. `levels = ceil((IAS - g) / (g - 3))` and the walk starts at
//!   level `4 - levels`. The start-level (root) table holds only as many entries as the input
//!   address size needs (4 entries for a 32-bit IAS with 4K granule), like a stage-1 TTBR table.
//! - Block mappings: 2 MiB (level 2) and 1 GiB (level 1) with a 4K granule; 32 MiB (level 2)
//!   with 16K; 512 MiB (level 2) with 64K. Larger blocks need FEAT_LPA/LPA2 and are not modelled.
//!
//! Table pages live in an arena. Each page has a simulated physical address
//! (`table_base + slot * granule`), so table descriptors hold the real output address of the
//! next-level table and every walk decodes it, as the hardware walker does. [`LpaeTable::walk`]
//! and [`LpaeTable::read_descriptor`] expose those reads to hardware models (walk caches).
//!
//! Mapping picks, for every piece of the range, the largest page size the alignment of both the
//! IOVA and the physical address and the remaining size allow (Linux's `iommu_pgsize`).
//! Operations validate first and then mutate, so an error leaves the table unchanged. Unmap
//! never splits a block ([`PgTableError::SplitsBlock`]). Which table pages it frees is set by
//! [`LpaeConfig::table_reclaim`]:
//!
//! - [`TableReclaim::WholeSpan`], the default, as Linux's `__arm_lpae_unmap`: a table is freed,
//!   with everything below it, only when the unmap covers the whole span of the entry pointing
//!   at it and that entry's level can hold a block (Linux's unmap then reaches the entry with
//!   the block size). With a 4K granule, unmapping an aligned 2 MiB frees its leaf table and an
//!   aligned 1 GiB its level-2 table and the leaf tables below. Tables emptied any other way
//!   (the last 4K page of a leaf table, say) stay in place for later maps, so such unmaps free
//!   nothing and need no walk invalidation. [`LpaeTable::reclaim_empty_tables`] frees what is
//!   left empty, as a domain teardown or a memory-pressure pass would.
//! - [`TableReclaim::WhenEmpty`]: every table page an unmap leaves empty is freed.
//!
//! Freed pages are reported in the gather, children before their parent. A freed page goes on
//! a free list and the next map that needs a table may take it (same physical address), so
//! the walk-cache invalidation the gather asks for must be done before the next map, as in
//! Linux, where the page returns to the allocator only after the gather is synced. Reusing
//! pages keeps map and unmap free of heap allocation once the arena has grown; the number of
//! pages in use, kept empty tables included, is capped ([`PgTableError::TooManyTables`]).
//!
//! A map whose range could take a block where an empty table was kept maps through that table
//! with the next level's pages. Linux instead replaces the table with the block and frees it
//! with a synchronous walk invalidation inside its map; [`IoPageTable::map`] has no gather to
//! report a freed table in, and freeing it unreported would leave walk caches pointing at it.
//!
//! Maps and unmaps that stay within one table at one page size (the common DMA case) take a
//! single walk down; anything else takes a recursive validate-then-write path.
//!
//! Work counted: `ptes_written` (leaf and table descriptors), `ptes_cleared`,
//! `tables_allocated`, `tables_freed`, `pte_reads` (each descriptor examined once per
//! operation: map and unmap validate with one walk over the range and then write without
//! re-reading) and, for a non-coherent walker, `cache_cleans` (one per batch of contiguous
//! descriptor writes in one table, plus one per newly allocated table page, as Linux syncs them).

use crate::addr::{Iova, PhysAddr, Prot};
use crate::pgtable::{FreedTable, IoPageTable, PgTableError, Translation, UnmapGather};
use crate::work::WorkRecord;

/// Descriptor encodings of the VMSAv8-64 long-descriptor format, as used for stage-1 IOMMU
/// mappings. Bit positions come from the Arm ARM (D8.3); the attribute choices are Linux's
/// (`arm_lpae_prot_to_pte` for a coherent stage-1 domain).
///
/// Leaf attributes written for every mapping:
///
/// - `AF` (access flag) set, so the walker never takes an access-flag fault;
/// - `SH` = inner shareable and `AttrIndx` = 1 (Linux's `ARM_LPAE_MAIR_ATTR_IDX_CACHE`), the
///   `IOMMU_CACHE` case of a coherent device;
/// - `nG` set (stage-1 IOMMU mappings are per-ASID);
/// - `AP[1]` set (`ARM_LPAE_PTE_AP_UNPRIV`: the mapping is not privileged-only) and `AP[2]` set
///   only for read-only mappings;
/// - no execute-never bits: Linux sets `ARM_LPAE_PTE_XN` only for `IOMMU_NOEXEC`, which the
///   DMA API never asks for (`dma_info_to_prot` gives `IOMMU_READ`, `IOMMU_WRITE`,
///   `IOMMU_CACHE` and `IOMMU_PRIV` only).
///
/// Stage-1 access permissions cannot express write-only: `AP[2] = 0` grants read and write.
/// As in Linux, a mapping asked for with write but not read gets read/write.
pub mod spec {
    use crate::addr::{PhysAddr, Prot};

    /// Bit 0: the descriptor is valid.
    pub const DESC_VALID: u64 = 1 << 0;
    /// Bits `[1:0]` of a descriptor.
    pub const DESC_TYPE_MASK: u64 = 0b11;
    /// Bits `[1:0]` of a block descriptor (levels 0 to 2).
    pub const DESC_TYPE_BLOCK: u64 = 0b01;
    /// Bits `[1:0]` of a table descriptor (levels 0 to 2).
    pub const DESC_TYPE_TABLE: u64 = 0b11;
    /// Bits `[1:0]` of a page descriptor (level 3).
    pub const DESC_TYPE_PAGE: u64 = 0b11;

    /// Shift of `AttrIndx[2:0]`, bits `[4:2]`: index into MAIR.
    pub const ATTR_INDX_SHIFT: u32 = 2;
    /// Mask of `AttrIndx[2:0]`.
    pub const ATTR_INDX_MASK: u64 = 0b111 << ATTR_INDX_SHIFT;
    /// MAIR index of normal non-cacheable memory (Linux `ARM_LPAE_MAIR_ATTR_IDX_NC`).
    pub const MAIR_ATTR_IDX_NC: u64 = 0;
    /// MAIR index of normal write-back cacheable memory (Linux `ARM_LPAE_MAIR_ATTR_IDX_CACHE`).
    pub const MAIR_ATTR_IDX_CACHE: u64 = 1;
    /// MAIR index of device memory (Linux `ARM_LPAE_MAIR_ATTR_IDX_DEV`).
    pub const MAIR_ATTR_IDX_DEV: u64 = 2;

    /// `AP[1]`, bit 6: accessible at EL0 (Linux `ARM_LPAE_PTE_AP_UNPRIV`).
    pub const AP_UNPRIV: u64 = 1 << 6;
    /// `AP[2]`, bit 7: read-only (Linux `ARM_LPAE_PTE_AP_RDONLY`).
    pub const AP_RDONLY: u64 = 1 << 7;

    /// Shift of `SH[1:0]`, bits `[9:8]`: shareability.
    pub const SH_SHIFT: u32 = 8;
    /// Mask of `SH[1:0]`.
    pub const SH_MASK: u64 = 0b11 << SH_SHIFT;
    /// Outer shareable.
    pub const SH_OS: u64 = 0b10 << SH_SHIFT;
    /// Inner shareable.
    pub const SH_IS: u64 = 0b11 << SH_SHIFT;

    /// Bit 10: access flag.
    pub const AF: u64 = 1 << 10;
    /// Bit 11: not global (the translation is tagged with the ASID).
    pub const NG: u64 = 1 << 11;
    /// Bit 53: privileged execute-never.
    pub const PXN: u64 = 1 << 53;
    /// Bit 54: unprivileged execute-never.
    pub const UXN: u64 = 1 << 54;
    /// Both execute-never bits (Linux `ARM_LPAE_PTE_XN`).
    pub const XN: u64 = PXN | UXN;

    /// Highest output-address bit a descriptor holds without FEAT_LPA (bit 47).
    pub const OA_TOP_BIT: u32 = 47;

    /// The attribute bits of every leaf this table writes, permissions aside.
    pub const LEAF_ATTRS: u64 =
        AF | SH_IS | NG | AP_UNPRIV | (MAIR_ATTR_IDX_CACHE << ATTR_INDX_SHIFT);

    /// Mask of the output-address field for a granule of `2^granule_shift` bytes: bits
    /// `[47:granule_shift]`.
    #[inline]
    pub const fn oa_mask(granule_shift: u32) -> u64 {
        ((1u64 << (OA_TOP_BIT + 1)) - 1) & !((1u64 << granule_shift) - 1)
    }

    /// Number of input-address bits one level resolves with this granule (`granule_shift - 3`).
    #[inline]
    pub const fn bits_per_level(granule_shift: u32) -> u32 {
        granule_shift - 3
    }

    /// log2 of the bytes one entry at `level` (0..=3) maps with this granule.
    #[inline]
    pub const fn level_shift(granule_shift: u32, level: u32) -> u32 {
        granule_shift + (3 - level) * bits_per_level(granule_shift)
    }

    /// Encodes a leaf: a page descriptor at level 3, a block descriptor above it. `pa` must be
    /// aligned to the leaf size and fit in 48 bits.
    #[inline]
    pub const fn encode_leaf(pa: u64, prot: Prot, level: u32, granule_shift: u32) -> u64 {
        let kind = if level == 3 {
            DESC_TYPE_PAGE
        } else {
            DESC_TYPE_BLOCK
        };
        (pa & oa_mask(granule_shift)) | LEAF_ATTRS | prot_bits(prot) | kind
    }

    /// The access-permission bits for `prot`: `AP[2]` when the mapping cannot be written.
    #[inline]
    pub const fn prot_bits(prot: Prot) -> u64 {
        if prot.write {
            0
        } else {
            AP_RDONLY
        }
    }

    /// Encodes a table descriptor pointing at the next-level table at `table_pa`.
    #[inline]
    pub const fn encode_table(table_pa: u64, granule_shift: u32) -> u64 {
        (table_pa & oa_mask(granule_shift)) | DESC_TYPE_TABLE
    }

    /// What a descriptor means at a given level.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Descriptor {
        /// Bit 0 clear (or the reserved type `0b01` at level 3): a translation fault.
        Invalid,
        /// A table descriptor: the next level's table is at `next_table`.
        Table {
            /// Physical address of the next-level table.
            next_table: PhysAddr,
        },
        /// A page (level 3) or block (levels 0 to 2) descriptor.
        Leaf {
            /// Physical address of the page or block (aligned to its size).
            pa: PhysAddr,
            /// log2 of the page or block size.
            size_shift: u32,
            /// The access the descriptor grants (stage 1: read always, write unless `AP[2]`).
            prot: Prot,
        },
    }

    /// Decodes `desc` read at `level` of a table with granule `2^granule_shift`. Whether the
    /// level may hold blocks at all is not checked here.
    #[inline]
    pub const fn decode(desc: u64, level: u32, granule_shift: u32) -> Descriptor {
        if desc & DESC_VALID == 0 {
            return Descriptor::Invalid;
        }
        let kind = desc & DESC_TYPE_MASK;
        if level == 3 {
            if kind != DESC_TYPE_PAGE {
                return Descriptor::Invalid;
            }
        } else if kind == DESC_TYPE_TABLE {
            return Descriptor::Table {
                next_table: PhysAddr::new(desc & oa_mask(granule_shift)),
            };
        }
        let size_shift = level_shift(granule_shift, level);
        let pa = desc & oa_mask(granule_shift) & !((1u64 << size_shift) - 1);
        Descriptor::Leaf {
            pa: PhysAddr::new(pa),
            size_shift,
            prot: decode_prot(desc),
        }
    }

    /// The permissions of a leaf descriptor. Stage 1 always allows reads.
    #[inline]
    pub const fn decode_prot(desc: u64) -> Prot {
        if desc & AP_RDONLY != 0 {
            Prot::READ
        } else {
            Prot::READ_WRITE
        }
    }
}

/// Default cap on table pages (the root included), as cloud-hypervisor caps mappings per
/// domain. Lowered automatically for small output address sizes; see [`LpaeConfig`].
pub const DEFAULT_MAX_TABLE_PAGES: usize = 1 << 20;

/// Output address sizes the architecture defines without FEAT_LPA (`TCR.IPS` values).
pub const SUPPORTED_OAS: [u32; 6] = [32, 36, 40, 42, 44, 48];

/// Smallest input address size accepted.
pub const MIN_IAS: u32 = 32;
/// Largest input address size accepted (48 bits; 52 needs FEAT_LVA).
pub const MAX_IAS: u32 = 48;

/// When an unmap frees the table pages it empties. See the [module docs](self).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum TableReclaim {
    /// Linux's `__arm_lpae_unmap`: a table is freed only when the unmap covers the whole span
    /// of the entry pointing at it, at a level that can hold a block (so Linux's unmap reaches
    /// that entry with the block size and frees the subtree). Any other table the unmap
    /// empties stays in place for later maps; [`LpaeTable::reclaim_empty_tables`] frees those.
    #[default]
    WholeSpan,
    /// Every table page an unmap leaves empty is freed at once (the root excepted).
    WhenEmpty,
}

/// Configuration of an [`LpaeTable`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LpaeConfig {
    /// Translation granule in bytes: 4096, 16384 or 65536.
    pub granule: u64,
    /// Input (IOVA) address size in bits, 32..=48.
    pub ias: u32,
    /// Output (physical) address size in bits: 32, 36, 40, 42, 44 or 48.
    pub oas: u32,
    /// Simulated physical address of table page slot 0 (the root). `None` places the table
    /// region at the top of the output address space. Must be granule-aligned.
    pub table_base_pa: Option<PhysAddr>,
    /// Cap on table pages, the root included. `None` means [`DEFAULT_MAX_TABLE_PAGES`], or
    /// half the output address space in table pages if that is smaller.
    pub max_table_pages: Option<usize>,
    /// Whether the walker snoops CPU caches. A non-coherent walker (IPMMU-VMSA) needs a cache
    /// clean after each batch of descriptor writes; those are counted as `cache_cleans`.
    pub coherent_walk: bool,
    /// Which emptied tables an unmap frees ([`TableReclaim::WholeSpan`] by default).
    pub table_reclaim: TableReclaim,
}

impl LpaeConfig {
    /// A coherent table with the given granule (bytes) and address sizes (bits), default table
    /// placement and cap.
    pub const fn new(granule: u64, ias: u32, oas: u32) -> Self {
        Self {
            granule,
            ias,
            oas,
            table_base_pa: None,
            max_table_pages: None,
            coherent_walk: true,
            table_reclaim: TableReclaim::WholeSpan,
        }
    }

    /// Places table page slot 0 at `pa`.
    pub const fn with_table_base(mut self, pa: PhysAddr) -> Self {
        self.table_base_pa = Some(pa);
        self
    }

    /// Caps the number of table pages (the root included).
    pub const fn with_max_table_pages(mut self, pages: usize) -> Self {
        self.max_table_pages = Some(pages);
        self
    }

    /// Sets whether the walker is cache coherent.
    pub const fn with_coherent_walk(mut self, coherent: bool) -> Self {
        self.coherent_walk = coherent;
        self
    }

    /// Sets which emptied tables an unmap frees.
    pub const fn with_table_reclaim(mut self, reclaim: TableReclaim) -> Self {
        self.table_reclaim = reclaim;
        self
    }
}

/// Why an [`LpaeConfig`] was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LpaeConfigError {
    /// The granule is not 4 KiB, 16 KiB or 64 KiB.
    #[error("Unsupported LPAE granule {granule:#x}: expected 4K, 16K or 64K")]
    UnsupportedGranule {
        /// The granule asked for.
        granule: u64,
    },
    /// The input address size is outside 32..=48 bits.
    #[error("Unsupported input address size {ias} bits: expected 32 to 48")]
    UnsupportedInputSize {
        /// The size asked for.
        ias: u32,
    },
    /// The output address size is not one the architecture defines.
    #[error("Unsupported output address size {oas} bits: expected 32, 36, 40, 42, 44 or 48")]
    UnsupportedOutputSize {
        /// The size asked for.
        oas: u32,
    },
    /// The table cap is zero (the root needs a page).
    #[error("The table page cap must allow at least the root table")]
    ZeroTableCap,
    /// The table base is not aligned to the granule.
    #[error("Table base {base:#x} is not aligned to the {granule:#x}-byte granule")]
    MisalignedTableBase {
        /// The base asked for.
        base: u64,
        /// The granule.
        granule: u64,
    },
    /// The table region does not fit in the output address space.
    #[error(
        "Table region at {base:#x} for {pages} pages does not fit in {oas} output address bits"
    )]
    TableRegionOutOfRange {
        /// The table base.
        base: u64,
        /// The table cap.
        pages: usize,
        /// The output address size.
        oas: u32,
    },
}

/// One descriptor read by a walk.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct WalkStep {
    /// The level of the table read (the start level for the root).
    pub level: u32,
    /// Physical address of the table read.
    pub table_pa: PhysAddr,
    /// Index of the descriptor within that table.
    pub index: usize,
    /// The descriptor read.
    pub desc: u64,
}

impl WalkStep {
    /// Physical address of the descriptor itself (what a walker's memory read targets).
    pub fn desc_pa(&self) -> PhysAddr {
        self.table_pa.add(self.index as u64 * 8)
    }
}

/// The result of a read-only walk: every descriptor read, in order, and the translation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LpaeWalk {
    steps: [WalkStep; 4],
    len: usize,
    /// The translation, or `None` on a translation fault (invalid descriptor, out-of-range
    /// IOVA, or a table address that is not a live table page).
    pub translation: Option<Translation>,
}

impl LpaeWalk {
    /// The descriptors read, from the first table to the last (at most four).
    pub fn steps(&self) -> &[WalkStep] {
        &self.steps[..self.len]
    }
}

/// A level as an index into the per-level arrays (levels are 0..=3; the mask lets the
/// compiler drop the bounds check).
#[inline(always)]
fn lv(level: u32) -> usize {
    (level & 3) as usize
}

/// Bookkeeping of one table page of the arena.
#[derive(Clone, Copy, Debug, Default)]
struct PageMeta {
    /// Number of valid descriptors: zero means the page is empty (and may be freed).
    valid: u32,
    /// Whether the page is in use (freed pages keep their zeroed memory for reuse).
    live: bool,
}

/// An ARM LPAE stage-1 IO page table. See the [module docs](self).
#[derive(Clone)]
pub struct LpaeTable {
    config: LpaeConfig,
    granule_shift: u32,
    start_level: u32,
    /// Bytes mapped by one entry at each level (log2), indexed by level.
    shifts: [u32; 4],
    /// Index mask of a table at each level (the root may be smaller than a page).
    index_masks: [u64; 4],
    /// Whether a leaf (page or block) may sit at each level.
    leaf_level: [bool; 4],
    /// The level whose entries map `2^shift` bytes, indexed by `shift` (leaf sizes only).
    level_of_shift: [u8; 64],
    /// The 4 KiB granule, 48-bit input geometry (levels 0 to 3, 512 entries a table, shifts
    /// 39/30/21/12), for which the one-granule shortcuts use constant shifts and masks.
    fixed_4k48: bool,
    page_sizes: u64,
    table_base: u64,
    max_pages: usize,
    /// log2 of the descriptors per table page: slot `s` holds `entries[s << stride..]`.
    stride: u32,
    /// Every table page's descriptors, one page-sized stride per slot; slot 0 is the root.
    entries: Vec<u64>,
    /// Per-slot bookkeeping.
    meta: Vec<PageMeta>,
    /// Slots of freed pages, reused last-freed first.
    free: Vec<usize>,
    live_pages: usize,
    mapped: u64,
}

/// Where a mapping is going: the translation `pa - iova` and the leaf bits to write.
#[derive(Clone, Copy)]
struct MapPlan {
    /// `pa - iova` (wrapping): the physical address of IOVA `x` is `x + delta`.
    delta: u64,
    /// Leaf attribute and permission bits (without type bits or address).
    attrs: u64,
}

impl std::fmt::Debug for LpaeTable {
    /// A summary: the geometry and occupancy, not the descriptors.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LpaeTable")
            .field("format", &self.format_name())
            .field("ias", &self.config.ias)
            .field("oas", &self.config.oas)
            .field("start_level", &self.start_level)
            .field("root_pa", &self.root_pa())
            .field("table_pages", &self.live_pages)
            .field("mapped_bytes", &self.mapped)
            .finish()
    }
}

/// Outcome of a single-table fast path: done (either way), or take the general path.
enum Fast {
    Done(Result<(), PgTableError>),
    General,
}

impl LpaeTable {
    /// Validates `config` and builds an empty table: just the root.
    pub fn new(config: LpaeConfig) -> Result<Self, LpaeConfigError> {
        let granule_shift = match config.granule {
            0x1000 => 12,
            0x4000 => 14,
            0x1_0000 => 16,
            granule => return Err(LpaeConfigError::UnsupportedGranule { granule }),
        };
        if !(MIN_IAS..=MAX_IAS).contains(&config.ias) {
            return Err(LpaeConfigError::UnsupportedInputSize { ias: config.ias });
        }
        if !SUPPORTED_OAS.contains(&config.oas) {
            return Err(LpaeConfigError::UnsupportedOutputSize { oas: config.oas });
        }
        let max_pages = config.max_table_pages.unwrap_or_else(|| {
            DEFAULT_MAX_TABLE_PAGES.min(((1u64 << (config.oas - 1)) >> granule_shift) as usize)
        });
        if max_pages == 0 {
            return Err(LpaeConfigError::ZeroTableCap);
        }
        let oa_limit = 1u64 << config.oas;
        let region = (max_pages as u64).checked_mul(config.granule);
        let table_base = match config.table_base_pa {
            Some(base) => base.get(),
            None => oa_limit.saturating_sub(region.unwrap_or(u64::MAX)),
        };
        if table_base & (config.granule - 1) != 0 {
            return Err(LpaeConfigError::MisalignedTableBase {
                base: table_base,
                granule: config.granule,
            });
        }
        match region.and_then(|r| table_base.checked_add(r)) {
            Some(end) if end <= oa_limit => {}
            _ => {
                return Err(LpaeConfigError::TableRegionOutOfRange {
                    base: table_base,
                    pages: max_pages,
                    oas: config.oas,
                })
            }
        }

        let stride = spec::bits_per_level(granule_shift);
        let levels = (config.ias - granule_shift).div_ceil(stride);
        let start_level = 4 - levels;
        let mut shifts = [0; 4];
        let mut index_masks = [0; 4];
        let mut leaf_level = [false; 4];
        let mut level_of_shift = [0u8; 64];
        let mut page_sizes = 0;
        for level in start_level..4 {
            let shift = spec::level_shift(granule_shift, level);
            shifts[level as usize] = shift;
            let bits = if level == start_level {
                config.ias - shift
            } else {
                stride
            };
            index_masks[level as usize] = (1u64 << bits) - 1;
            // Blocks: 4K granule at levels 1 and 2; 16K and 64K at level 2 only.
            let leaf = level == 3 || level == 2 || (granule_shift == 12 && level == 1);
            leaf_level[level as usize] = leaf;
            level_of_shift[shift as usize] = level as u8;
            if leaf {
                page_sizes |= 1u64 << shift;
            }
        }
        Ok(Self {
            config,
            granule_shift,
            start_level,
            shifts,
            index_masks,
            leaf_level,
            level_of_shift,
            fixed_4k48: granule_shift == 12 && config.ias == 48,
            page_sizes,
            table_base,
            max_pages,
            stride,
            entries: vec![0u64; 1 << stride],
            meta: vec![PageMeta {
                valid: 0,
                live: true,
            }],
            free: Vec::new(),
            live_pages: 1,
            mapped: 0,
        })
    }

    /// The configuration the table was built from.
    pub fn config(&self) -> &LpaeConfig {
        &self.config
    }

    /// log2 of the granule.
    pub fn granule_shift(&self) -> u32 {
        self.granule_shift
    }

    /// The level of the root table: 0 to 2, so a walk reads `4 - start_level` levels.
    pub fn start_level(&self) -> u32 {
        self.start_level
    }

    /// Number of levels walked.
    pub fn levels(&self) -> u32 {
        4 - self.start_level
    }

    /// Number of descriptors in the root table.
    pub fn root_entries(&self) -> usize {
        self.index_masks[self.start_level as usize] as usize + 1
    }

    /// log2 of the bytes one entry at `level` (0..=3) maps.
    pub fn level_shift(&self, level: u32) -> u32 {
        spec::level_shift(self.granule_shift, level)
    }

    /// Physical address of the root table (what TTBR / the context descriptor holds).
    pub fn root_pa(&self) -> PhysAddr {
        PhysAddr::new(self.table_base)
    }

    /// The cap on table pages, the root included.
    pub fn max_table_pages(&self) -> usize {
        self.max_pages
    }

    /// Frees every table page below the root that holds no valid descriptor, bottom-up (a
    /// table holding only emptied tables goes too), and reports each in `gather` as an unmap
    /// does, children before their parent. Returns the number of pages freed. Mappings are
    /// untouched. This is what a domain teardown or a memory-pressure pass does with the
    /// tables [`TableReclaim::WholeSpan`] leaves in place; with [`TableReclaim::WhenEmpty`]
    /// there are none.
    ///
    /// Like Linux's `__arm_lpae_free_pgtable`, it reads every descriptor of the non-leaf tables
    /// (`pte_reads`); whether a leaf-level table is empty comes from the per-page count of valid
    /// descriptors. Each page freed is counted as an unmap counts it (`ptes_cleared` for the
    /// table descriptor, `tables_freed`, and a `cache_cleans` for a non-coherent walker). As
    /// after an unmap, the walk invalidation the gather asks for must be done before the next
    /// map, which may reuse the pages.
    pub fn reclaim_empty_tables(
        &mut self,
        gather: &mut UnmapGather,
        work: &mut WorkRecord,
    ) -> usize {
        let before = self.live_pages;
        self.reclaim_under(0, self.start_level, 0, gather, work);
        before - self.live_pages
    }

    /// Reads descriptor `index` of the live table page at `table_pa`, as a hardware walker's
    /// memory read would. `None` when `table_pa` is not a live table page (freed, never
    /// allocated, or not a table address) or `index` is past its end.
    pub fn read_descriptor(&self, table_pa: PhysAddr, index: usize) -> Option<u64> {
        let slot = self.slot_at(table_pa.get())?;
        let len = if slot == 0 {
            self.root_entries()
        } else {
            1 << self.stride
        };
        (index < len).then(|| self.entries[(slot << self.stride) + index])
    }

    /// Walks the table for `iova` from the root, recording every descriptor read. Counts
    /// nothing: a hardware model counts `walk_reads` from [`LpaeWalk::steps`].
    pub fn walk(&self, iova: Iova) -> LpaeWalk {
        self.walk_from(self.start_level, self.root_pa(), iova)
    }

    /// Walks for `iova` starting at the table of `level` at `table_pa` (a walk-cache hit
    /// resumes here). A `table_pa` that is not a live table page ends the walk with a fault.
    pub fn walk_from(&self, level: u32, table_pa: PhysAddr, iova: Iova) -> LpaeWalk {
        let mut walk = LpaeWalk {
            steps: [WalkStep::default(); 4],
            len: 0,
            translation: None,
        };
        walk.translation = self.walk_from_each(level, table_pa, iova, |step| {
            walk.steps[walk.len] = *step;
            walk.len += 1;
        });
        walk
    }

    /// [`LpaeTable::walk`] that hands each descriptor read to `on_step`, in order, instead
    /// of collecting them: the same reads, steps and translation, without building an
    /// [`LpaeWalk`] (a hardware model's hot path reads each step once).
    #[inline]
    pub fn walk_each(&self, iova: Iova, on_step: impl FnMut(&WalkStep)) -> Option<Translation> {
        self.walk_from_each(self.start_level, self.root_pa(), iova, on_step)
    }

    /// [`LpaeTable::walk_from`] that hands each descriptor read to `on_step`, in order (see
    /// [`LpaeTable::walk_each`]). Returns the translation, `None` on a fault.
    #[inline]
    pub fn walk_from_each(
        &self,
        level: u32,
        table_pa: PhysAddr,
        iova: Iova,
        mut on_step: impl FnMut(&WalkStep),
    ) -> Option<Translation> {
        let iova = iova.get();
        if iova >> self.config.ias != 0 || level < self.start_level || level > 3 {
            return None;
        }
        let mut level = level;
        let mut table_pa = table_pa.get();
        loop {
            let slot = self.slot_at(table_pa)?;
            let index = self.index(level, iova);
            let desc = self.entries[(slot << self.stride) + index];
            on_step(&WalkStep {
                level,
                table_pa: PhysAddr::new(table_pa),
                index,
                desc,
            });
            match spec::decode(desc, level, self.granule_shift) {
                spec::Descriptor::Table { next_table } if level < 3 => {
                    table_pa = next_table.get();
                    level += 1;
                }
                spec::Descriptor::Leaf {
                    pa,
                    size_shift,
                    prot,
                } if self.leaf_level[lv(level)] => {
                    let page_size = 1u64 << size_shift;
                    return Some(Translation {
                        pa: pa.add(iova & (page_size - 1)),
                        prot,
                        page_size,
                    });
                }
                _ => return None,
            }
        }
    }

    /// The arena slot of the live table page at `pa`, if there is one.
    fn slot_at(&self, pa: u64) -> Option<usize> {
        let off = pa.checked_sub(self.table_base)?;
        if off & (self.config.granule - 1) != 0 {
            return None;
        }
        let slot = usize::try_from(off >> self.granule_shift).ok()?;
        self.meta.get(slot).filter(|m| m.live).map(|_| slot)
    }

    /// The slot a (valid, table) descriptor points at.
    #[inline]
    fn slot_of_desc(&self, desc: u64) -> usize {
        (((desc & spec::oa_mask(self.granule_shift)) - self.table_base) >> self.granule_shift)
            as usize
    }

    #[inline]
    fn slot_pa(&self, slot: usize) -> u64 {
        self.table_base + ((slot as u64) << self.granule_shift)
    }

    /// Index of the descriptor for `iova` in a table at `level`.
    #[inline]
    fn index(&self, level: u32, iova: u64) -> usize {
        ((iova >> self.shifts[lv(level)]) & self.index_masks[lv(level)]) as usize
    }

    /// [`Self::pos`] with constant shifts and masks when `FIXED` (the table is
    /// `fixed_4k48`: 512-entry tables, level `l` maps `2^(12 + 9 * (3 - l))` bytes).
    #[inline(always)]
    fn gpos<const FIXED: bool>(&self, slot: usize, level: u32, iova: u64) -> usize {
        if FIXED {
            let shift = 12 + 9 * (3 - (level & 3));
            (slot << 9) + ((iova >> shift) & 511) as usize
        } else {
            self.pos(slot, level, iova)
        }
    }

    /// The start level: constant 0 when `FIXED` (see [`Self::gpos`]).
    #[inline(always)]
    fn gstart<const FIXED: bool>(&self) -> u32 {
        if FIXED {
            0
        } else {
            self.start_level
        }
    }

    /// Position in `entries` of the descriptor for `iova` in the table in `slot` at `level`.
    #[inline]
    fn pos(&self, slot: usize, level: u32, iova: u64) -> usize {
        (slot << self.stride) + self.index(level, iova)
    }

    /// Whether a descriptor read at `level` is a table descriptor (the table's own invariant:
    /// it only ever writes valid tables, pages and legal blocks).
    #[inline]
    fn is_table(desc: u64, level: u32) -> bool {
        level < 3 && desc & spec::DESC_TYPE_MASK == spec::DESC_TYPE_TABLE
    }

    /// Whether a whole entry at `level` can be one leaf for a mapping with this `delta`.
    #[inline]
    fn leaf_fits(&self, level: u32, delta: u64) -> bool {
        self.leaf_level[lv(level)] && delta & ((1u64 << self.shifts[lv(level)]) - 1) == 0
    }

    /// Whether `[start, end)` lies under one entry of the table at `level - 1`, that is in
    /// one table at `level`.
    #[inline]
    fn in_one_table(&self, level: u32, start: u64, end: u64) -> bool {
        level == self.start_level || {
            let parent = self.shifts[lv(level - 1)];
            start >> parent == (end - 1) >> parent
        }
    }

    #[inline]
    fn check_args(&self, iova: u64, size: u64, pa: Option<u64>) -> Result<(), PgTableError> {
        let granule = self.config.granule;
        let mask = granule - 1;
        if (iova | size) & mask != 0 {
            return Err(PgTableError::Misaligned {
                addr: iova,
                size,
                granule,
            });
        }
        if let Some(pa) = pa {
            if pa & mask != 0 {
                return Err(PgTableError::Misaligned {
                    addr: pa,
                    size,
                    granule,
                });
            }
        }
        let limit = 1u64 << self.config.ias;
        match iova.checked_add(size) {
            Some(end) if end <= limit => {}
            _ => {
                return Err(PgTableError::OutOfRange {
                    iova,
                    size,
                    start: 0,
                    end: limit,
                })
            }
        }
        if let Some(pa) = pa {
            match pa.checked_add(size) {
                Some(end) if end <= 1u64 << self.config.oas => {}
                _ => {
                    return Err(PgTableError::PhysOutOfRange {
                        pa,
                        bits: self.config.oas,
                    })
                }
            }
        }
        Ok(())
    }

    /// Takes a zeroed table page from the free list or grows the arena. The caller has
    /// checked the cap.
    #[inline]
    fn alloc_table(&mut self, work: &mut WorkRecord) -> usize {
        debug_assert!(self.live_pages < self.max_pages, "table cap not checked");
        work.tables_allocated += 1;
        if !self.config.coherent_walk {
            work.cache_cleans += 1;
        }
        self.live_pages += 1;
        if let Some(slot) = self.free.pop() {
            self.meta[slot].live = true;
            return slot;
        }
        self.entries
            .resize(self.entries.len() + (1 << self.stride), 0);
        self.meta.push(PageMeta {
            valid: 0,
            live: true,
        });
        self.meta.len() - 1
    }

    /// Returns an emptied table page to the free list.
    #[inline]
    fn free_table(&mut self, slot: usize, work: &mut WorkRecord) {
        debug_assert!(self.meta[slot].valid == 0);
        debug_assert!(self.entries[slot << self.stride..][..1 << self.stride]
            .iter()
            .all(|&d| d == 0));
        self.meta[slot].live = false;
        self.free.push(slot);
        self.live_pages -= 1;
        work.tables_freed += 1;
    }

    /// Writes a table descriptor for a new table at `pos` (in `slot`) and returns the new
    /// table's slot.
    #[inline(always)]
    fn install_table(&mut self, slot: usize, pos: usize, work: &mut WorkRecord) -> usize {
        let child = self.alloc_table(work);
        self.entries[pos] = spec::encode_table(self.slot_pa(child), self.granule_shift);
        self.meta[slot].valid += 1;
        work.ptes_written += 1;
        if !self.config.coherent_walk {
            work.cache_cleans += 1;
        }
        child
    }

    /// Clears the table descriptor for `iova` in `slot` (at `level`), which points at the
    /// emptied table `child`, frees the child and reports it.
    #[inline(always)]
    fn remove_table(
        &mut self,
        slot: usize,
        level: u32,
        child: usize,
        iova: u64,
        gather: &mut UnmapGather,
        work: &mut WorkRecord,
    ) {
        let pos = self.pos(slot, level, iova);
        self.entries[pos] = 0;
        self.meta[slot].valid -= 1;
        work.ptes_cleared += 1;
        if !self.config.coherent_walk {
            work.cache_cleans += 1;
        }
        self.free_table(child, work);
        let shift = self.shifts[lv(level)];
        gather.add_freed_table(FreedTable {
            table_pa: PhysAddr::new(self.slot_pa(child)),
            level: level + 1,
            iova: Iova::new(iova & !((1u64 << shift) - 1)),
            size: 1u64 << shift,
        });
    }

    /// [`Self::reclaim_empty_tables`] below the table in `slot` at `level` (`level < 3`),
    /// whose span starts at `base`.
    fn reclaim_under(
        &mut self,
        slot: usize,
        level: u32,
        base: u64,
        gather: &mut UnmapGather,
        work: &mut WorkRecord,
    ) {
        let shift = self.shifts[lv(level)];
        let len = if slot == 0 {
            self.root_entries()
        } else {
            1 << self.stride
        };
        work.pte_reads += len as u64;
        for i in 0..len {
            let desc = self.entries[(slot << self.stride) + i];
            if !Self::is_table(desc, level) {
                continue;
            }
            let child = self.slot_of_desc(desc);
            let iova = base + ((i as u64) << shift);
            if level + 1 < 3 {
                self.reclaim_under(child, level + 1, iova, gather, work);
            }
            if self.meta[child].valid == 0 {
                self.remove_table(slot, level, child, iova, gather, work);
            }
        }
    }

    // ---- Map ----

    /// The map of `[start, end)` when it is a run of leaves of one size in one table, the
    /// common DMA case: one walk down, then the writes.
    #[inline]
    fn map_fast(&mut self, start: u64, end: u64, plan: MapPlan, work: &mut WorkRecord) -> Fast {
        let size = end - start;
        // The largest page size every piece can use: the largest supported size that divides
        // the IOVA, the size and the physical address (the granule always does).
        let align = start | size | plan.delta;
        let low = align & align.wrapping_neg();
        let fits = self.page_sizes & (low | (low - 1));
        let leaf_shift = 63 - fits.leading_zeros();
        let leaf = u32::from(self.level_of_shift[leaf_shift as usize & 63]);
        // Within one table at `leaf`, no larger page fits (the leaf level above would have
        // qualified), so this is exactly the general path's plan.
        if !self.in_one_table(leaf, start, end) {
            return Fast::General;
        }
        let mut reads = 0;
        let mut slot = 0;
        let mut level = self.start_level;
        while level < leaf {
            let desc = self.entries[self.pos(slot, level, start)];
            reads += 1;
            if desc & spec::DESC_VALID == 0 {
                break;
            }
            if !Self::is_table(desc, level) {
                work.pte_reads += reads;
                return Fast::Done(Err(PgTableError::AlreadyMapped { iova: start }));
            }
            slot = self.slot_of_desc(desc);
            level += 1;
        }
        let shift = self.shifts[lv(leaf)];
        let first = self.pos(slot, leaf, start);
        let count = (size >> shift) as usize;
        if level == leaf {
            for (i, &desc) in self.entries[first..first + count].iter().enumerate() {
                reads += 1;
                if desc & spec::DESC_VALID != 0 {
                    if Self::is_table(desc, leaf) {
                        // A table where a block would go: the general path finds the first
                        // mapped IOVA below it.
                        return Fast::General;
                    }
                    work.pte_reads += reads;
                    let iova = start + ((i as u64) << shift);
                    return Fast::Done(Err(PgTableError::AlreadyMapped { iova }));
                }
            }
        } else {
            let needed = (leaf - level) as usize;
            if self.live_pages + needed > self.max_pages {
                work.pte_reads += reads;
                return Fast::Done(Err(PgTableError::TooManyTables {
                    limit: self.max_pages,
                }));
            }
        }
        work.pte_reads += reads;
        // Commit: new tables from `level` down, then the leaves.
        let mut first = first;
        while level < leaf {
            let pos = self.pos(slot, level, start);
            slot = self.install_table(slot, pos, work);
            level += 1;
            first = self.pos(slot, leaf, start);
        }
        let kind = if leaf == 3 {
            spec::DESC_TYPE_PAGE
        } else {
            spec::DESC_TYPE_BLOCK
        };
        let oa_mask = spec::oa_mask(self.granule_shift);
        let mut pa = start.wrapping_add(plan.delta);
        for desc in &mut self.entries[first..first + count] {
            *desc = (pa & oa_mask) | plan.attrs | kind;
            pa = pa.wrapping_add(1 << shift);
        }
        self.meta[slot].valid += count as u32;
        work.ptes_written += count as u64;
        if !self.config.coherent_walk {
            work.cache_cleans += 1;
        }
        self.mapped += size;
        Fast::Done(Ok(()))
    }

    /// [`Self::map_fast`] for a map of one granule at `start` (aligned, in range) to `pa`
    /// with leaf bits `attrs`: the leaf is a page at level 3, so the walk and the checks need
    /// none of the general plan. Same reads, writes, counts and errors as `map_fast`.
    #[inline]
    fn map_granule<const FIXED: bool>(
        &mut self,
        start: u64,
        pa: u64,
        attrs: u64,
        work: &mut WorkRecord,
    ) -> Result<(), PgTableError> {
        let mut reads = 0;
        let mut slot = 0;
        let mut level = self.gstart::<FIXED>();
        while level < 3 {
            let desc = self.entries[self.gpos::<FIXED>(slot, level, start)];
            reads += 1;
            if desc & spec::DESC_VALID == 0 {
                break;
            }
            if !Self::is_table(desc, level) {
                work.pte_reads += reads;
                return Err(PgTableError::AlreadyMapped { iova: start });
            }
            slot = self.slot_of_desc(desc);
            level += 1;
        }
        if level == 3 {
            reads += 1;
            if self.entries[self.gpos::<FIXED>(slot, 3, start)] & spec::DESC_VALID != 0 {
                work.pte_reads += reads;
                return Err(PgTableError::AlreadyMapped { iova: start });
            }
        } else if self.live_pages + (3 - level) as usize > self.max_pages {
            work.pte_reads += reads;
            return Err(PgTableError::TooManyTables {
                limit: self.max_pages,
            });
        }
        work.pte_reads += reads;
        // Commit: new tables from `level` down, then the page.
        while level < 3 {
            let pos = self.gpos::<FIXED>(slot, level, start);
            slot = self.install_table(slot, pos, work);
            level += 1;
        }
        let pos = self.gpos::<FIXED>(slot, 3, start);
        self.entries[pos] = (pa & spec::oa_mask(self.granule_shift)) | attrs | spec::DESC_TYPE_PAGE;
        self.meta[slot].valid += 1;
        work.ptes_written += 1;
        if !self.config.coherent_walk {
            work.cache_cleans += 1;
        }
        self.mapped += self.config.granule;
        Ok(())
    }

    /// Validation walk for a map of `[start, end)` under the table in `slot` at `level`:
    /// fails if anything in the range is mapped, else returns the table pages the map needs.
    fn check_map(
        &self,
        slot: usize,
        level: u32,
        start: u64,
        end: u64,
        delta: u64,
        work: &mut WorkRecord,
    ) -> Result<usize, PgTableError> {
        let size = 1u64 << self.shifts[lv(level)];
        let mut needed = 0usize;
        let mut x = start;
        while x < end {
            let entry_start = x & !(size - 1);
            let sub_end = end.min(entry_start + size);
            let desc = self.entries[self.pos(slot, level, x)];
            work.pte_reads += 1;
            if desc & spec::DESC_VALID == 0 {
                let whole = x == entry_start && sub_end - x == size;
                if !(whole && self.leaf_fits(level, delta)) {
                    needed = needed.saturating_add(self.fresh_tables(level + 1, x, sub_end, delta));
                }
            } else if Self::is_table(desc, level) {
                let child = self.slot_of_desc(desc);
                let below = self.check_map(child, level + 1, x, sub_end, delta, work)?;
                needed = needed.saturating_add(below);
            } else {
                return Err(PgTableError::AlreadyMapped { iova: x });
            }
            x = sub_end;
        }
        Ok(needed)
    }

    /// Table pages needed to map `[start, end)` below an invalid entry, starting with a new
    /// table at `level`. Computed without reading anything.
    fn fresh_tables(&self, level: u32, start: u64, end: u64, delta: u64) -> usize {
        let shift = self.shifts[lv(level)];
        let size = 1u64 << shift;
        let mut needed = 1usize;
        let mut x = start;
        while x < end {
            let entry_start = x & !(size - 1);
            if x == entry_start && end - x >= size {
                let whole = (end - x) >> shift;
                if !self.leaf_fits(level, delta) {
                    let each = self.full_subtree_tables(level + 1, delta);
                    needed = needed.saturating_add((whole as usize).saturating_mul(each));
                }
                x += whole << shift;
            } else {
                let sub_end = end.min(entry_start + size);
                needed = needed.saturating_add(self.fresh_tables(level + 1, x, sub_end, delta));
                x = sub_end;
            }
        }
        needed
    }

    /// Table pages needed to map the whole span of one new table at `level`.
    fn full_subtree_tables(&self, level: u32, delta: u64) -> usize {
        if self.leaf_fits(level, delta) {
            return 1;
        }
        let per_table = 1usize << self.stride;
        per_table
            .saturating_mul(self.full_subtree_tables(level + 1, delta))
            .saturating_add(1)
    }

    /// Writes the mapping of `[start, end)` under the table in `slot` at `level`. The range
    /// has been validated by [`Self::check_map`].
    fn do_map(
        &mut self,
        slot: usize,
        level: u32,
        start: u64,
        end: u64,
        plan: MapPlan,
        work: &mut WorkRecord,
    ) {
        let size = 1u64 << self.shifts[lv(level)];
        let leaf_fits = self.leaf_fits(level, plan.delta);
        let kind = if level == 3 {
            spec::DESC_TYPE_PAGE
        } else {
            spec::DESC_TYPE_BLOCK
        };
        let oa_mask = spec::oa_mask(self.granule_shift);
        let mut in_batch = false;
        let mut x = start;
        while x < end {
            let entry_start = x & !(size - 1);
            let sub_end = end.min(entry_start + size);
            let pos = self.pos(slot, level, x);
            let desc = self.entries[pos];
            if desc & spec::DESC_VALID != 0 {
                // Validated: a valid entry in range is a table with room below it.
                let child = self.slot_of_desc(desc);
                self.do_map(child, level + 1, x, sub_end, plan, work);
                in_batch = false;
            } else if leaf_fits && x == entry_start && sub_end - x == size {
                let pa = x.wrapping_add(plan.delta);
                self.entries[pos] = (pa & oa_mask) | plan.attrs | kind;
                self.meta[slot].valid += 1;
                work.ptes_written += 1;
                if !in_batch && !self.config.coherent_walk {
                    work.cache_cleans += 1;
                }
                in_batch = true;
            } else {
                let child = self.install_table(slot, pos, work);
                self.do_map(child, level + 1, x, sub_end, plan, work);
                in_batch = false;
            }
            x = sub_end;
        }
    }

    // ---- Unmap ----

    /// The unmap of `[start, end)` when it is a run of leaves of one size in one table: one
    /// walk down, the clears, then back up freeing the emptied tables the policy frees.
    #[inline]
    fn unmap_fast(
        &mut self,
        start: u64,
        end: u64,
        gather: &mut UnmapGather,
        work: &mut WorkRecord,
    ) -> Fast {
        // The slot of the table read at each level.
        let mut path = [0usize; 4];
        let mut reads = 0;
        let mut slot = 0;
        let mut level = self.start_level;
        // Down to the leaf that maps `start`.
        loop {
            let desc = self.entries[self.pos(slot, level, start)];
            reads += 1;
            path[lv(level)] = slot;
            if desc & spec::DESC_VALID == 0 {
                work.pte_reads += reads;
                return Fast::Done(Err(PgTableError::NotMapped { iova: start }));
            }
            if !Self::is_table(desc, level) {
                break;
            }
            slot = self.slot_of_desc(desc);
            level += 1;
        }
        let shift = self.shifts[lv(level)];
        let size = end - start;
        if start & ((1u64 << shift) - 1) != 0 {
            work.pte_reads += reads;
            let block_size = 1u64 << shift;
            return Fast::Done(Err(PgTableError::SplitsBlock {
                iova: start,
                size,
                block_iova: start & !(block_size - 1),
                block_size,
            }));
        }
        if size & ((1u64 << shift) - 1) != 0 || !self.in_one_table(level, start, end) {
            return Fast::General;
        }
        let first = self.pos(slot, level, start);
        let count = (size >> shift) as usize;
        // The first entry was read on the way down.
        for (i, &desc) in self.entries[first..first + count]
            .iter()
            .enumerate()
            .skip(1)
        {
            reads += 1;
            if desc & spec::DESC_VALID == 0 {
                work.pte_reads += reads;
                let iova = start + ((i as u64) << shift);
                return Fast::Done(Err(PgTableError::NotMapped { iova }));
            }
            if Self::is_table(desc, level) {
                return Fast::General;
            }
        }
        work.pte_reads += reads;
        if count == 1 {
            // The common single-page unmap; `fill` would call memset.
            self.entries[first] = 0;
        } else {
            self.entries[first..first + count].fill(0);
        }
        self.meta[slot].valid -= count as u32;
        work.ptes_cleared += count as u64;
        if !self.config.coherent_walk {
            work.cache_cleans += 1;
        }
        gather.add(Iova::new(start), size, 1u64 << shift);
        self.mapped -= size;
        if self.meta[slot].valid == 0 && level > self.start_level {
            match self.config.table_reclaim {
                TableReclaim::WholeSpan => {
                    // A run in one table covers the span of the entry above only when it fills
                    // the table, and never covers an entry further up.
                    if count == 1 << self.stride && self.leaf_level[lv(level - 1)] {
                        let parent = path[lv(level - 1)];
                        self.remove_table(parent, level - 1, slot, start, gather, work);
                    }
                }
                TableReclaim::WhenEmpty => {
                    while level > self.start_level && self.meta[slot].valid == 0 {
                        let parent = path[lv(level - 1)];
                        self.remove_table(parent, level - 1, slot, start, gather, work);
                        slot = parent;
                        level -= 1;
                    }
                }
            }
        }
        Fast::Done(Ok(()))
    }

    /// [`Self::unmap_fast`] for an unmap of one granule at `start` (aligned, in range) that
    /// finds a page at level 3: same reads, clears, counts, gather and errors. Finding a
    /// block instead, it counts nothing and leaves the unmap to the general paths.
    #[inline]
    fn unmap_granule<const FIXED: bool>(
        &mut self,
        start: u64,
        gather: &mut UnmapGather,
        work: &mut WorkRecord,
    ) -> Fast {
        // The slot of the table read at each level.
        let mut path = [0usize; 4];
        let mut reads = 0;
        let mut slot = 0;
        let mut level = self.gstart::<FIXED>();
        let pos = loop {
            let pos = self.gpos::<FIXED>(slot, level, start);
            let desc = self.entries[pos];
            reads += 1;
            path[lv(level)] = slot;
            if desc & spec::DESC_VALID == 0 {
                work.pte_reads += reads;
                return Fast::Done(Err(PgTableError::NotMapped { iova: start }));
            }
            if !Self::is_table(desc, level) {
                if level != 3 {
                    return Fast::General;
                }
                break pos;
            }
            slot = self.slot_of_desc(desc);
            level += 1;
        };
        work.pte_reads += reads;
        let granule = self.config.granule;
        self.entries[pos] = 0;
        self.meta[slot].valid -= 1;
        work.ptes_cleared += 1;
        if !self.config.coherent_walk {
            work.cache_cleans += 1;
        }
        gather.add(Iova::new(start), granule, granule);
        self.mapped -= granule;
        // A single page never fills a table, so `WholeSpan` frees nothing here.
        if self.config.table_reclaim == TableReclaim::WhenEmpty {
            while level > self.gstart::<FIXED>() && self.meta[slot].valid == 0 {
                let parent = path[lv(level - 1)];
                self.remove_table(parent, level - 1, slot, start, gather, work);
                slot = parent;
                level -= 1;
            }
        }
        Fast::Done(Ok(()))
    }

    /// Validation walk for an unmap of `[start, end)`: every entry must be valid, and no
    /// leaf may be cut. `request` is the caller's `(iova, size)` for error reports.
    fn check_unmap(
        &self,
        slot: usize,
        level: u32,
        start: u64,
        end: u64,
        request: (u64, u64),
        work: &mut WorkRecord,
    ) -> Result<(), PgTableError> {
        let size = 1u64 << self.shifts[lv(level)];
        let mut x = start;
        while x < end {
            let entry_start = x & !(size - 1);
            let sub_end = end.min(entry_start + size);
            let desc = self.entries[self.pos(slot, level, x)];
            work.pte_reads += 1;
            if desc & spec::DESC_VALID == 0 {
                return Err(PgTableError::NotMapped { iova: x });
            } else if Self::is_table(desc, level) {
                self.check_unmap(
                    self.slot_of_desc(desc),
                    level + 1,
                    x,
                    sub_end,
                    request,
                    work,
                )?;
            } else if x != entry_start || sub_end - x != size {
                return Err(PgTableError::SplitsBlock {
                    iova: request.0,
                    size: request.1,
                    block_iova: entry_start,
                    block_size: size,
                });
            }
            x = sub_end;
        }
        Ok(())
    }

    /// Clears `[start, end)` under the table in `slot` at `level`, freeing the emptied table
    /// pages the reclaim policy frees (children first). Returns the bytes of leaves removed.
    /// Validated by [`Self::check_unmap`].
    fn do_unmap(
        &mut self,
        slot: usize,
        level: u32,
        start: u64,
        end: u64,
        gather: &mut UnmapGather,
        work: &mut WorkRecord,
    ) -> u64 {
        let size = 1u64 << self.shifts[lv(level)];
        let coherent = self.config.coherent_walk;
        let mut removed = 0;
        // The run of leaves cleared since the last descent: one gather range, one clean.
        let mut run_start = start;
        let mut run_len = 0u64;
        let mut x = start;
        while x < end {
            let entry_start = x & !(size - 1);
            let sub_end = end.min(entry_start + size);
            let pos = self.pos(slot, level, x);
            let desc = self.entries[pos];
            if Self::is_table(desc, level) {
                if run_len != 0 {
                    gather.add(Iova::new(run_start), run_len, size);
                    removed += run_len;
                    run_len = 0;
                    if !coherent {
                        work.cache_cleans += 1;
                    }
                }
                let child = self.slot_of_desc(desc);
                removed += self.do_unmap(child, level + 1, x, sub_end, gather, work);
                let free = match self.config.table_reclaim {
                    // Validation found the covered span fully mapped, so the child is empty.
                    TableReclaim::WholeSpan => {
                        x == entry_start && sub_end - x == size && self.leaf_level[lv(level)]
                    }
                    TableReclaim::WhenEmpty => self.meta[child].valid == 0,
                };
                if free {
                    self.remove_table(slot, level, child, x, gather, work);
                }
            } else {
                self.entries[pos] = 0;
                self.meta[slot].valid -= 1;
                work.ptes_cleared += 1;
                if run_len == 0 {
                    run_start = x;
                }
                run_len += size;
            }
            x = sub_end;
        }
        if run_len != 0 {
            gather.add(Iova::new(run_start), run_len, size);
            removed += run_len;
            if !coherent {
                work.cache_cleans += 1;
            }
        }
        removed
    }
}

impl IoPageTable for LpaeTable {
    fn format_name(&self) -> &'static str {
        match self.granule_shift {
            12 => "lpae-4k",
            14 => "lpae-16k",
            _ => "lpae-64k",
        }
    }

    fn page_size_bitmap(&self) -> u64 {
        self.page_sizes
    }

    fn granule(&self) -> u64 {
        self.config.granule
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
        // The common DMA map, one granule: the checks below pass exactly when these do (the
        // table's input and output spans are whole numbers of granules).
        let granule = self.config.granule;
        if size == granule
            && (start | pa) & (granule - 1) == 0
            && start >> self.config.ias == 0
            && pa >> self.config.oas == 0
            && (prot.read || prot.write)
        {
            let attrs = spec::LEAF_ATTRS | spec::prot_bits(prot);
            return if self.fixed_4k48 {
                self.map_granule::<true>(start, pa, attrs, work)
            } else {
                self.map_granule::<false>(start, pa, attrs, work)
            };
        }
        self.map_range(start, pa, size, prot, work)
    }

    fn unmap(
        &mut self,
        iova: Iova,
        size: u64,
        gather: &mut UnmapGather,
        work: &mut WorkRecord,
    ) -> Result<(), PgTableError> {
        let start = iova.get();
        // The common DMA unmap, one granule (aligned and in range, so the checks pass).
        let granule = self.config.granule;
        if size == granule && start & (granule - 1) == 0 && start >> self.config.ias == 0 {
            let fast = if self.fixed_4k48 {
                self.unmap_granule::<true>(start, gather, work)
            } else {
                self.unmap_granule::<false>(start, gather, work)
            };
            if let Fast::Done(result) = fast {
                return result;
            }
        }
        self.unmap_range(start, size, gather, work)
    }

    fn translate(&self, iova: Iova, work: &mut WorkRecord) -> Option<Translation> {
        self.translate_iova(iova, work)
    }

    fn table_pages(&self) -> usize {
        self.live_pages
    }

    fn mapped_bytes(&self) -> u64 {
        self.mapped
    }
}

impl LpaeTable {
    /// [`IoPageTable::map`] without the one-granule shortcut: any size.
    fn map_range(
        &mut self,
        start: u64,
        pa: u64,
        size: u64,
        prot: Prot,
        work: &mut WorkRecord,
    ) -> Result<(), PgTableError> {
        self.check_args(start, size, Some(pa))?;
        if !prot.read && !prot.write {
            return Err(PgTableError::NoPermission);
        }
        if size == 0 {
            return Ok(());
        }
        let end = start + size;
        let delta = pa.wrapping_sub(start);
        let plan = MapPlan {
            delta,
            attrs: spec::LEAF_ATTRS | spec::prot_bits(prot),
        };
        if let Fast::Done(result) = self.map_fast(start, end, plan, work) {
            return result;
        }
        let needed = self.check_map(0, self.start_level, start, end, delta, work)?;
        if self.live_pages.saturating_add(needed) > self.max_pages {
            return Err(PgTableError::TooManyTables {
                limit: self.max_pages,
            });
        }
        self.do_map(0, self.start_level, start, end, plan, work);
        self.mapped += size;
        Ok(())
    }

    /// [`IoPageTable::unmap`] without the one-granule shortcut: any size.
    fn unmap_range(
        &mut self,
        start: u64,
        size: u64,
        gather: &mut UnmapGather,
        work: &mut WorkRecord,
    ) -> Result<(), PgTableError> {
        self.check_args(start, size, None)?;
        if size == 0 {
            return Ok(());
        }
        let end = start + size;
        if let Fast::Done(result) = self.unmap_fast(start, end, gather, work) {
            return result;
        }
        self.check_unmap(0, self.start_level, start, end, (start, size), work)?;
        let removed = self.do_unmap(0, self.start_level, start, end, gather, work);
        debug_assert_eq!(removed, size);
        self.mapped -= removed;
        Ok(())
    }

    /// [`IoPageTable::translate`].
    #[inline]
    fn translate_iova(&self, iova: Iova, work: &mut WorkRecord) -> Option<Translation> {
        let iova = iova.get();
        if iova >> self.config.ias != 0 {
            return None;
        }
        let mut slot = 0;
        let mut level = self.start_level;
        let mut reads = 0;
        let result = loop {
            let desc = self.entries[self.pos(slot, level, iova)];
            reads += 1;
            if desc & spec::DESC_VALID == 0 {
                break None;
            }
            if Self::is_table(desc, level) {
                slot = self.slot_of_desc(desc);
                level += 1;
                continue;
            }
            let page_size = 1u64 << self.shifts[lv(level)];
            let base = desc & spec::oa_mask(self.granule_shift) & !(page_size - 1);
            break Some(Translation {
                pa: PhysAddr::new(base | (iova & (page_size - 1))),
                prot: spec::decode_prot(desc),
                page_size,
            });
        };
        work.pte_reads += reads;
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::addr::{SZ_16K, SZ_1G, SZ_2M, SZ_32M, SZ_4K, SZ_512M, SZ_64K};
    use crate::pgtable::GatherRange;

    const SZ_4M: u64 = 4 << 20;

    fn table(granule: u64, ias: u32) -> LpaeTable {
        LpaeTable::new(LpaeConfig::new(granule, ias, 48)).expect("valid config")
    }

    fn table_with(granule: u64, ias: u32, reclaim: TableReclaim) -> LpaeTable {
        let config = LpaeConfig::new(granule, ias, 48).with_table_reclaim(reclaim);
        LpaeTable::new(config).expect("valid config")
    }

    /// Unmaps and returns the gather and the work.
    fn unmap(t: &mut LpaeTable, iova: u64, size: u64) -> (UnmapGather, WorkRecord) {
        let mut gather = UnmapGather::new();
        let mut work = WorkRecord::new();
        t.unmap(Iova::new(iova), size, &mut gather, &mut work)
            .expect("unmap");
        (gather, work)
    }

    /// The table page the walk for `iova` reads at `level`.
    fn table_at(t: &LpaeTable, iova: u64, level: u32) -> PhysAddr {
        let walk = t.walk(Iova::new(iova));
        let step = walk.steps().iter().find(|s| s.level == level);
        step.expect("the walk reaches the level").table_pa
    }

    fn map(t: &mut LpaeTable, iova: u64, pa: u64, size: u64, prot: Prot) -> WorkRecord {
        let mut work = WorkRecord::new();
        t.map(Iova::new(iova), PhysAddr::new(pa), size, prot, &mut work)
            .expect("map");
        work
    }

    fn lookup(t: &LpaeTable, iova: u64) -> Option<Translation> {
        t.translate(Iova::new(iova), &mut WorkRecord::new())
    }

    /// Everything observable about a table, to check that a failed call changed nothing.
    fn snapshot(t: &LpaeTable, probes: &[u64]) -> (u64, usize, Vec<Option<Translation>>) {
        (
            t.mapped_bytes(),
            t.table_pages(),
            probes.iter().map(|&i| lookup(t, i)).collect(),
        )
    }

    /// Everything a table holds, for comparing two tables exactly.
    fn state(t: &LpaeTable) -> (Vec<u64>, String, Vec<usize>, usize, u64) {
        (
            t.entries.clone(),
            format!("{:?}", t.meta),
            t.free.clone(),
            t.live_pages,
            t.mapped,
        )
    }

    /// The one-granule map and unmap shortcuts (`map_granule`, `unmap_granule`) do what the
    /// general paths do: same results, errors, counts, gathers and table contents, over
    /// random single-granule maps and unmaps (with blocks, misaligned, out-of-range and
    /// unreadable requests, a small table cap, both reclaim policies, all granules).
    /// The walk as it was written before the visitor walk (`walk_from_each`): collects the
    /// steps into an array. The reference the visitor walks are checked against.
    fn reference_walk_from(
        t: &LpaeTable,
        level: u32,
        table_pa: PhysAddr,
        iova: u64,
    ) -> (Vec<WalkStep>, Option<Translation>) {
        let mut steps = Vec::new();
        if iova >> t.config.ias != 0 || level < t.start_level || level > 3 {
            return (steps, None);
        }
        let (mut level, mut table_pa) = (level, table_pa.get());
        loop {
            let Some(slot) = t.slot_at(table_pa) else {
                return (steps, None);
            };
            let index = t.index(level, iova);
            let desc = t.entries[(slot << t.stride) + index];
            steps.push(WalkStep {
                level,
                table_pa: PhysAddr::new(table_pa),
                index,
                desc,
            });
            match spec::decode(desc, level, t.granule_shift) {
                spec::Descriptor::Table { next_table } => {
                    table_pa = next_table.get();
                    level += 1;
                }
                spec::Descriptor::Leaf {
                    pa,
                    size_shift,
                    prot,
                } if t.leaf_level[lv(level)] => {
                    let page_size = 1u64 << size_shift;
                    let tr = Translation {
                        pa: pa.add(iova & (page_size - 1)),
                        prot,
                        page_size,
                    };
                    return (steps, Some(tr));
                }
                _ => return (steps, None),
            }
        }
    }

    /// `walk`, `walk_from`, `walk_each` and `walk_from_each` (from the root and resumed at
    /// every step's table, as after a walk-cache hit, and at a bogus table) all match the
    /// reference walk for `iova` (and a few neighbours).
    fn check_walks(t: &LpaeTable, iova: u64, what: &str) {
        for iova in [iova, iova ^ 0x1234, iova.wrapping_add(1 << 21), u64::MAX] {
            let root = reference_walk_from(t, t.start_level, t.root_pa(), iova);
            let walk = t.walk(Iova::new(iova));
            assert_eq!((walk.steps().to_vec(), walk.translation), root, "{what}");
            let mut seen = Vec::new();
            let tr = t.walk_each(Iova::new(iova), |s| seen.push(*s));
            assert_eq!((seen, tr), root, "{what}");
            let starts = root.0.iter().map(|s| (s.level, s.table_pa));
            let bogus = [
                (t.start_level, PhysAddr::new(t.table_base + 8)),
                (3, t.root_pa()),
            ];
            for (level, table_pa) in starts.chain(bogus) {
                let want = reference_walk_from(t, level, table_pa, iova);
                let walk = t.walk_from(level, table_pa, Iova::new(iova));
                assert_eq!((walk.steps().to_vec(), walk.translation), want, "{what}");
                let mut seen = Vec::new();
                let tr = t.walk_from_each(level, table_pa, Iova::new(iova), |s| seen.push(*s));
                assert_eq!((seen, tr), want, "{what}");
            }
        }
    }

    #[test]
    fn fixed_4k48_geometry_is_the_tables_own() {
        for (granule, ias) in [(SZ_4K, 48), (SZ_4K, 39), (SZ_16K, 48), (SZ_64K, 48)] {
            let t = table(granule, ias);
            let fixed = t.fixed_4k48;
            assert_eq!(fixed, granule == SZ_4K && ias == 48);
            if fixed {
                assert_eq!((t.start_level, t.stride), (0, 9));
                assert_eq!(t.shifts, [39, 30, 21, 12]);
                assert_eq!(t.index_masks, [511; 4]);
                for level in 0..4 {
                    for iova in [0, 0x1234_5678_9abc, (1 << 48) - 1] {
                        for slot in [0, 1, 7] {
                            let want = t.pos(slot, level, iova);
                            assert_eq!(t.gpos::<true>(slot, level, iova), want);
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn granule_shortcuts_match_the_general_paths() {
        let mut rng = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let configs = [
            (SZ_4K, 48),
            (SZ_4K, 39),
            (SZ_4K, 32),
            (SZ_16K, 47),
            (SZ_64K, 42),
        ];
        // Which errors came up, and the most tables one call freed (coverage).
        let mut seen = Vec::new();
        let mut most_freed = 0;
        for (ci, &(granule, ias)) in configs.iter().enumerate() {
            for reclaim in [TableReclaim::WholeSpan, TableReclaim::WhenEmpty] {
                for coherent in [true, false] {
                    let config = LpaeConfig::new(granule, ias, 48)
                        .with_table_reclaim(reclaim)
                        .with_coherent_walk(coherent)
                        .with_max_table_pages(12);
                    let mut fast = LpaeTable::new(config).unwrap();
                    let mut slow = LpaeTable::new(config).unwrap();
                    let block = 1u64 << fast.shifts[2];
                    // Four blocks at the bottom and four at the top of the range.
                    let top = (1u64 << ias) - 4 * block;
                    for op in 0..3000 {
                        let r = next();
                        let base = if r & 1 == 0 { 0 } else { top };
                        // Pages clustered in four blocks, so maps and unmaps meet.
                        let mut iova = base + (next() % 4) * block + (next() % 4) * granule;
                        let pa = (next() % (1 << 20)) * granule;
                        let prot = match r >> 1 & 7 {
                            0 => Prot::NONE,
                            1 => Prot::READ,
                            2 => Prot::WRITE,
                            _ => Prot::READ_WRITE,
                        };
                        if r >> 4 & 31 == 0 {
                            iova += 8; // misaligned
                        }
                        if r >> 9 & 63 == 0 {
                            iova = 1u64 << ias; // out of range
                        }
                        let what = format!("config {ci} {reclaim:?} {coherent} op {op}");
                        let (mut wf, mut ws) = (WorkRecord::new(), WorkRecord::new());
                        let (mut gf, mut gs) = (UnmapGather::new(), UnmapGather::new());
                        // Phases that fill the windows, then empty them (freeing tables).
                        let filling = op / 200 % 2 == 0;
                        let at = iova & !(block - 1);
                        let (rf, rs) = match r >> 15 & 15 {
                            0 => {
                                // A block map, for both tables through the general path.
                                let pa = pa & !(block - 1);
                                let go = |t: &mut LpaeTable, w: &mut WorkRecord| {
                                    t.map(Iova::new(at), PhysAddr::new(pa), block, prot, w)
                                };
                                (go(&mut fast, &mut wf), go(&mut slow, &mut ws))
                            }
                            1 => (
                                fast.unmap(Iova::new(at), block, &mut gf, &mut wf),
                                slow.unmap_range(at, block, &mut gs, &mut ws),
                            ),
                            k if (k < 12) == filling => (
                                fast.map(
                                    Iova::new(iova),
                                    PhysAddr::new(pa),
                                    granule,
                                    prot,
                                    &mut wf,
                                ),
                                slow.map_range(iova, pa, granule, prot, &mut ws),
                            ),
                            _ => (
                                fast.unmap(Iova::new(iova), granule, &mut gf, &mut wf),
                                slow.unmap_range(iova, granule, &mut gs, &mut ws),
                            ),
                        };
                        assert_eq!(rf, rs, "{what}");
                        assert!(wf == ws, "{what}: work differs");
                        match rf {
                            Err(e) => seen.push(std::mem::discriminant(&e)),
                            Ok(()) => most_freed = most_freed.max(wf.tables_freed),
                        }
                        assert_eq!(gf, gs, "{what}");
                        assert_eq!(state(&fast), state(&slow), "{what}");
                        check_walks(&fast, iova, &what);
                    }
                }
            }
        }
        let iova = 0x1000;
        for e in [
            PgTableError::Misaligned {
                addr: 0,
                size: 0,
                granule: 0,
            },
            PgTableError::OutOfRange {
                iova,
                size: 0,
                start: 0,
                end: 0,
            },
            PgTableError::AlreadyMapped { iova },
            PgTableError::NotMapped { iova },
            PgTableError::SplitsBlock {
                iova,
                size: 0,
                block_iova: 0,
                block_size: 0,
            },
            PgTableError::NoPermission,
            PgTableError::TooManyTables { limit: 0 },
        ] {
            assert!(
                seen.contains(&std::mem::discriminant(&e)),
                "never saw {e:?}"
            );
        }
        assert!(most_freed >= 2, "no call freed a table and its parent");
    }

    // ---- Descriptor encodings, worked out by hand ----

    #[test]
    fn page_descriptor_4k_read_write_matches_hand_encoding() {
        // PA 0x8000_1000 | AF 0x400 | nG 0x800 | SH=IS 0x300 | AP[1] 0x40 | AttrIndx=1 0x4
        // | type 0b11 = 0x8000_1F47: what arm_lpae_prot_to_pte writes for the DMA API's
        // IOMMU_READ | IOMMU_WRITE | IOMMU_CACHE (no IOMMU_NOEXEC, so no XN bits).
        let desc = spec::encode_leaf(0x8000_1000, Prot::READ_WRITE, 3, 12);
        assert_eq!(desc, 0x8000_1F47);
    }

    #[test]
    fn page_descriptor_read_only_sets_ap2() {
        // As above plus AP[2] (bit 7, 0x80): 0xF47 | 0x80 = 0xFC7.
        let desc = spec::encode_leaf(0x8000_1000, Prot::READ, 3, 12);
        assert_eq!(desc, 0x8000_1FC7);
    }

    #[test]
    fn block_descriptor_2m_uses_type_01() {
        // 2M block at PA 0x4020_0000: same attributes, type 0b01: 0xF44 | 0x1 = 0xF45.
        let desc = spec::encode_leaf(0x4020_0000, Prot::READ_WRITE, 2, 12);
        assert_eq!(desc, 0x4020_0F45);
    }

    #[test]
    fn table_descriptor_holds_next_table_address_and_type_11() {
        // Next-level table at PA 0x1_2345_6000: address bits [47:12] plus type 0b11.
        assert_eq!(spec::encode_table(0x1_2345_6000, 12), 0x0000_0001_2345_6003);
    }

    #[test]
    fn page_descriptor_64k_masks_address_below_granule() {
        // 64K granule: output address bits [47:16]; 0x1234_0000 keeps all its bits.
        assert_eq!(
            spec::encode_leaf(0x1234_0000, Prot::READ_WRITE, 3, 16),
            0x1234_0F47
        );
        // Bits [15:12] are not address bits with a 64K granule.
        assert_eq!(spec::oa_mask(16), 0x0000_FFFF_FFFF_0000);
    }

    #[test]
    fn decode_inverts_encode() {
        let page = spec::encode_leaf(0x8000_1000, Prot::READ, 3, 12);
        let block = spec::encode_leaf(0x4020_0000, Prot::READ_WRITE, 2, 12);
        let tbl = spec::encode_table(0x1_2345_6000, 12);
        assert_eq!(
            spec::decode(page, 3, 12),
            spec::Descriptor::Leaf {
                pa: PhysAddr::new(0x8000_1000),
                size_shift: 12,
                prot: Prot::READ
            }
        );
        assert_eq!(
            spec::decode(block, 2, 12),
            spec::Descriptor::Leaf {
                pa: PhysAddr::new(0x4020_0000),
                size_shift: 21,
                prot: Prot::READ_WRITE
            }
        );
        assert_eq!(
            spec::decode(tbl, 1, 12),
            spec::Descriptor::Table {
                next_table: PhysAddr::new(0x1_2345_6000)
            }
        );
        assert_eq!(spec::decode(0, 1, 12), spec::Descriptor::Invalid);
        // Type 0b01 is reserved at level 3.
        assert_eq!(spec::decode(block, 3, 12), spec::Descriptor::Invalid);
    }

    // ---- Geometry and configuration ----

    #[test]
    fn geometry_follows_granule_and_ias() {
        // (granule, ias) -> (start level, root entries)
        let cases = [
            (SZ_4K, 48, 0, 512),   // 9+9+9+9+12
            (SZ_4K, 39, 1, 512),   // 9+9+9+12
            (SZ_4K, 32, 1, 4),     // 2+9+9+12
            (SZ_16K, 48, 0, 2),    // 1+11+11+11+14
            (SZ_16K, 36, 2, 2048), // 11+11+14
            (SZ_64K, 48, 1, 64),   // 6+13+13+16
            (SZ_64K, 32, 2, 8),    // 3+13+16
        ];
        for (granule, ias, start, root) in cases {
            let t = table(granule, ias);
            assert_eq!(
                (t.start_level(), t.root_entries()),
                (start, root),
                "{granule:#x}/{ias}"
            );
        }
    }

    #[test]
    fn page_size_bitmap_lists_pages_and_blocks() {
        assert_eq!(table(SZ_4K, 48).page_size_bitmap(), SZ_4K | SZ_2M | SZ_1G);
        assert_eq!(table(SZ_4K, 32).page_size_bitmap(), SZ_4K | SZ_2M | SZ_1G);
        assert_eq!(table(SZ_16K, 48).page_size_bitmap(), SZ_16K | SZ_32M);
        assert_eq!(table(SZ_64K, 32).page_size_bitmap(), SZ_64K | SZ_512M);
    }

    #[test]
    fn bad_configs_are_rejected() {
        let bad = [
            (
                LpaeConfig::new(0x2000, 48, 48),
                LpaeConfigError::UnsupportedGranule { granule: 0x2000 },
            ),
            (
                LpaeConfig::new(SZ_4K, 31, 48),
                LpaeConfigError::UnsupportedInputSize { ias: 31 },
            ),
            (
                LpaeConfig::new(SZ_4K, 49, 48),
                LpaeConfigError::UnsupportedInputSize { ias: 49 },
            ),
            (
                LpaeConfig::new(SZ_4K, 48, 38),
                LpaeConfigError::UnsupportedOutputSize { oas: 38 },
            ),
            (
                LpaeConfig::new(SZ_4K, 48, 48).with_max_table_pages(0),
                LpaeConfigError::ZeroTableCap,
            ),
            (
                LpaeConfig::new(SZ_4K, 48, 48).with_table_base(PhysAddr::new(0x1800)),
                LpaeConfigError::MisalignedTableBase {
                    base: 0x1800,
                    granule: SZ_4K,
                },
            ),
            (
                LpaeConfig::new(SZ_4K, 48, 32)
                    .with_table_base(PhysAddr::new(0xFFFF_F000))
                    .with_max_table_pages(2),
                LpaeConfigError::TableRegionOutOfRange {
                    base: 0xFFFF_F000,
                    pages: 2,
                    oas: 32,
                },
            ),
        ];
        for (config, err) in bad {
            assert_eq!(LpaeTable::new(config).unwrap_err(), err);
        }
    }

    #[test]
    fn default_table_region_sits_at_top_of_output_space() {
        // 1<<20 pages of 4K = 4 GiB below 2^48.
        assert_eq!(
            table(SZ_4K, 48).root_pa(),
            PhysAddr::new((1 << 48) - (1 << 32))
        );
        // A 32-bit OAS caps the region at half the space: 2 GiB of 64K pages.
        let small = LpaeTable::new(LpaeConfig::new(SZ_64K, 32, 32)).unwrap();
        assert_eq!(small.max_table_pages(), 1 << 15);
        assert_eq!(small.root_pa(), PhysAddr::new(0x8000_0000));
    }

    // ---- Page-size choice ----

    #[test]
    fn aligned_4m_maps_as_two_2m_blocks() {
        let mut t = table(SZ_4K, 48);
        let work = map(&mut t, 0x4000_0000, 0x8000_0000, SZ_4M, Prot::READ_WRITE);
        // Root -> new L1 table -> new L2 table holding two blocks.
        assert_eq!((work.tables_allocated, work.ptes_written), (2, 4));
        assert_eq!(lookup(&t, 0x4020_0123).unwrap().page_size, SZ_2M);
        assert_eq!(
            lookup(&t, 0x4020_0123).unwrap().pa,
            PhysAddr::new(0x8020_0123)
        );
    }

    #[test]
    fn misaligned_pa_forces_4k_pages() {
        let mut t = table(SZ_4K, 48);
        let work = map(&mut t, 0x4000_0000, 0x8000_1000, SZ_4M, Prot::READ_WRITE);
        // L1 + L2 + two L3 tables; 1024 pages plus 3 + 1 table descriptors.
        assert_eq!((work.tables_allocated, work.ptes_written), (4, 1028));
        assert_eq!(lookup(&t, 0x4020_0000).unwrap().page_size, SZ_4K);
        assert_eq!(
            lookup(&t, 0x403F_F000).unwrap().pa,
            PhysAddr::new(0x8040_0000)
        );
    }

    #[test]
    fn unaligned_ends_use_pages_around_a_block() {
        let mut t = table(SZ_4K, 48);
        map(
            &mut t,
            0x1F_F000,
            0x21F_F000,
            SZ_2M + 2 * SZ_4K,
            Prot::READ_WRITE,
        );
        let sizes: Vec<u64> = [0x1F_F000, 0x20_0000, 0x3F_F000, 0x40_0000]
            .iter()
            .map(|&i| lookup(&t, i).unwrap().page_size)
            .collect();
        assert_eq!(sizes, [SZ_4K, SZ_2M, SZ_2M, SZ_4K]);
    }

    #[test]
    fn aligned_1g_maps_as_one_block() {
        let mut t = table(SZ_4K, 48);
        let work = map(&mut t, SZ_1G, 3 * SZ_1G, SZ_1G, Prot::READ_WRITE);
        assert_eq!((work.tables_allocated, work.ptes_written), (1, 2));
        assert_eq!(lookup(&t, SZ_1G + 5).unwrap().page_size, SZ_1G);
    }

    #[test]
    fn root_level_block_needs_no_table_with_32_bit_input() {
        let mut t = table(SZ_4K, 32);
        let work = map(&mut t, SZ_1G, SZ_1G, SZ_1G, Prot::READ_WRITE);
        assert_eq!((work.tables_allocated, work.ptes_written), (0, 1));
    }

    #[test]
    fn larger_granules_use_their_blocks() {
        let mut t16 = table(SZ_16K, 48);
        map(
            &mut t16,
            SZ_32M,
            2 * SZ_32M,
            SZ_32M + SZ_16K,
            Prot::READ_WRITE,
        );
        assert_eq!(lookup(&t16, SZ_32M).unwrap().page_size, SZ_32M);
        assert_eq!(lookup(&t16, 2 * SZ_32M).unwrap().page_size, SZ_16K);
        let mut t64 = table(SZ_64K, 42);
        map(
            &mut t64,
            SZ_512M,
            SZ_512M,
            SZ_512M + SZ_64K,
            Prot::READ_WRITE,
        );
        assert_eq!(lookup(&t64, SZ_512M).unwrap().page_size, SZ_512M);
        assert_eq!(lookup(&t64, 2 * SZ_512M).unwrap().page_size, SZ_64K);
    }

    #[test]
    fn write_only_is_mapped_read_write_and_read_only_stays_read_only() {
        let mut t = table(SZ_4K, 48);
        map(&mut t, 0x1000, 0x1000, SZ_4K, Prot::WRITE);
        map(&mut t, 0x2000, 0x2000, SZ_4K, Prot::READ);
        assert_eq!(lookup(&t, 0x1000).unwrap().prot, Prot::READ_WRITE);
        assert_eq!(lookup(&t, 0x2000).unwrap().prot, Prot::READ);
    }

    #[test]
    fn translate_counts_one_read_per_level() {
        let mut t = table(SZ_4K, 48);
        map(&mut t, 0x1000, 0x1000, SZ_4K, Prot::READ);
        map(&mut t, SZ_2M, SZ_2M, SZ_2M, Prot::READ);
        let mut work = WorkRecord::new();
        t.translate(Iova::new(0x1000), &mut work);
        assert_eq!(work.pte_reads, 4);
        let mut work = WorkRecord::new();
        t.translate(Iova::new(SZ_2M), &mut work);
        assert_eq!(work.pte_reads, 3);
        assert_eq!(lookup(&t, 1 << 48), None);
    }

    #[test]
    fn non_coherent_walker_counts_cache_cleans() {
        let config = LpaeConfig::new(SZ_4K, 48, 48).with_coherent_walk(false);
        let mut t = LpaeTable::new(config).unwrap();
        let work = map(&mut t, 0x1000, 0x1000, 2 * SZ_4K, Prot::READ);
        // Three new tables (one clean each), three table descriptors, one batch of leaves.
        assert_eq!(work.cache_cleans, 7);
    }

    #[test]
    fn non_coherent_unmap_counts_one_clean_per_batch() {
        // One batch of two leaves; with WhenEmpty, then three table descriptors as the tables
        // empty. WholeSpan keeps the tables.
        for (reclaim, expected) in [
            (TableReclaim::WholeSpan, (2, 1)),
            (TableReclaim::WhenEmpty, (5, 4)),
        ] {
            let config = LpaeConfig::new(SZ_4K, 48, 48)
                .with_coherent_walk(false)
                .with_table_reclaim(reclaim);
            let mut t = LpaeTable::new(config).unwrap();
            map(&mut t, 0x1000, 0x1000, 2 * SZ_4K, Prot::READ);

            let (_, work) = unmap(&mut t, 0x1000, 2 * SZ_4K);

            assert_eq!(
                (work.ptes_cleared, work.cache_cleans),
                expected,
                "{reclaim:?}"
            );
        }
    }

    #[test]
    fn read_descriptor_rejects_addresses_that_are_not_live_tables() {
        let t = table(SZ_4K, 39);
        let root = t.root_pa();
        assert_eq!(t.read_descriptor(root, 511), Some(0));
        assert_eq!(t.read_descriptor(root, 512), None);
        assert_eq!(t.read_descriptor(root.add(8), 0), None);
        assert_eq!(t.read_descriptor(root.add(SZ_4K), 0), None);
        assert_eq!(t.read_descriptor(PhysAddr::new(0), 0), None);
    }

    // ---- Unmap and the gather ----

    #[test]
    fn when_empty_unmap_gathers_blocks_and_frees_emptied_tables() {
        let mut t = table_with(SZ_4K, 48, TableReclaim::WhenEmpty);
        map(&mut t, 0x4000_0000, 0x8000_0000, SZ_4M, Prot::READ_WRITE);
        let l1 = PhysAddr::new(t.walk(Iova::new(0x4000_0000)).steps()[1].table_pa.get());
        let l2 = PhysAddr::new(t.walk(Iova::new(0x4000_0000)).steps()[2].table_pa.get());
        let mut gather = UnmapGather::new();
        let mut work = WorkRecord::new();

        t.unmap(Iova::new(0x4000_0000), SZ_4M, &mut gather, &mut work)
            .unwrap();

        assert_eq!(
            gather.ranges,
            [GatherRange {
                start: Iova::new(0x4000_0000),
                size: SZ_4M,
                page_size: SZ_2M
            }]
        );
        assert_eq!(
            gather.freed_tables,
            [
                FreedTable {
                    table_pa: l2,
                    level: 2,
                    iova: Iova::new(0x4000_0000),
                    size: SZ_1G
                },
                FreedTable {
                    table_pa: l1,
                    level: 1,
                    iova: Iova::new(0),
                    size: 1 << 39
                },
            ]
        );
        assert_eq!((work.ptes_cleared, work.tables_freed), (4, 2));
        assert_eq!((t.table_pages(), t.mapped_bytes()), (1, 0));
    }

    #[test]
    fn unmap_of_some_pages_keeps_the_table() {
        let mut t = table(SZ_4K, 48);
        map(&mut t, 0x10_0000, 0x10_0000, 3 * SZ_4K, Prot::READ);
        let mut gather = UnmapGather::new();

        t.unmap(
            Iova::new(0x10_1000),
            SZ_4K,
            &mut gather,
            &mut WorkRecord::new(),
        )
        .unwrap();

        assert_eq!(gather.ranges.len(), 1);
        assert_eq!(gather.bytes(), SZ_4K);
        assert!(gather.freed_tables.is_empty());
        assert_eq!(t.table_pages(), 4);
        assert!(lookup(&t, 0x10_0000).is_some() && lookup(&t, 0x10_1000).is_none());
    }

    #[test]
    fn unmap_across_page_and_block_sizes_splits_gather_ranges() {
        let mut t = table(SZ_4K, 48);
        map(&mut t, 0x1F_F000, 0x21F_F000, SZ_2M + SZ_4K, Prot::READ);
        let mut gather = UnmapGather::new();

        t.unmap(
            Iova::new(0x1F_F000),
            SZ_2M + SZ_4K,
            &mut gather,
            &mut WorkRecord::new(),
        )
        .unwrap();

        let sizes: Vec<(u64, u64, u64)> = gather
            .ranges
            .iter()
            .map(|r| (r.start.get(), r.size, r.page_size))
            .collect();
        assert_eq!(
            sizes,
            [(0x1F_F000, SZ_4K, SZ_4K), (0x20_0000, SZ_2M, SZ_2M)]
        );
        // The one 4K page did not cover its leaf table's 2M span: every table stays.
        assert!(gather.freed_tables.is_empty());
        assert_eq!((t.table_pages(), t.mapped_bytes()), (4, 0));
    }

    #[test]
    fn freed_table_pages_are_reused() {
        let mut t = table_with(SZ_4K, 48, TableReclaim::WhenEmpty);
        map(&mut t, 0x1000, 0x1000, SZ_4K, Prot::READ);
        let before = t.walk(Iova::new(0x1000));
        t.unmap(
            Iova::new(0x1000),
            SZ_4K,
            &mut UnmapGather::new(),
            &mut WorkRecord::new(),
        )
        .unwrap();
        let freed = before.steps()[3].table_pa;
        assert_eq!(t.read_descriptor(freed, 1), None);

        let work = map(&mut t, 0x1000, 0x1000, SZ_4K, Prot::READ);

        assert_eq!(work.tables_allocated, 3);
        assert_eq!(t.walk(Iova::new(0x1000)), before);
    }

    // ---- Table reclaim policies ----

    #[test]
    fn whole_span_is_the_default() {
        assert_eq!(
            LpaeConfig::new(SZ_4K, 48, 48).table_reclaim,
            TableReclaim::WholeSpan
        );
        assert_eq!(TableReclaim::default(), TableReclaim::WholeSpan);
    }

    #[test]
    fn whole_span_keeps_the_tables_of_a_lone_4k_page_for_the_next_map() {
        let mut t = table(SZ_4K, 48);
        map(&mut t, 0x4000_1000, 0x8000_1000, SZ_4K, Prot::READ_WRITE);
        let before = t.walk(Iova::new(0x4000_1000));

        let (gather, work) = unmap(&mut t, 0x4000_1000, SZ_4K);

        assert_eq!(gather.bytes(), SZ_4K);
        assert!(gather.freed_tables.is_empty());
        assert_eq!((work.ptes_cleared, work.tables_freed), (1, 0));
        assert_eq!((t.table_pages(), t.mapped_bytes()), (4, 0));
        let leaf_table = before.steps()[3].table_pa;
        assert_eq!(t.read_descriptor(leaf_table, 1), Some(0));
        assert_eq!(lookup(&t, 0x4000_1000), None);

        // The same page and its neighbour map into the kept tables.
        let again = map(&mut t, 0x4000_1000, 0x8000_1000, SZ_4K, Prot::READ_WRITE);
        let next = map(&mut t, 0x4000_2000, 0x8000_2000, SZ_4K, Prot::READ_WRITE);

        assert_eq!((again.tables_allocated, again.ptes_written), (0, 1));
        assert_eq!((next.tables_allocated, next.ptes_written), (0, 1));
        assert_eq!(t.walk(Iova::new(0x4000_1000)), before);
        assert_eq!(table_at(&t, 0x4000_2000, 3), leaf_table);
    }

    #[test]
    fn whole_span_unmap_of_2m_of_4k_pages_frees_their_leaf_table() {
        let mut t = table(SZ_4K, 48);
        // A physical address off by 4K forces 4K pages: one full leaf table.
        map(&mut t, 0x4000_0000, 0x8000_1000, SZ_2M, Prot::READ_WRITE);
        let leaf_table = table_at(&t, 0x4000_0000, 3);
        assert_eq!(lookup(&t, 0x4000_0000).unwrap().page_size, SZ_4K);

        let (gather, work) = unmap(&mut t, 0x4000_0000, SZ_2M);

        assert_eq!(
            gather.freed_tables,
            [FreedTable {
                table_pa: leaf_table,
                level: 3,
                iova: Iova::new(0x4000_0000),
                size: SZ_2M
            }]
        );
        assert_eq!((work.ptes_cleared, work.tables_freed), (513, 1));
        // Root, level 1 and level 2 stay: the unmap did not cover their spans.
        assert_eq!((t.table_pages(), t.mapped_bytes()), (3, 0));
        assert_eq!(t.read_descriptor(leaf_table, 0), None);
    }

    #[test]
    fn whole_span_frees_only_the_tables_whose_span_the_unmap_covers() {
        let mut t = table(SZ_4K, 48);
        // 2M + 4K of 4K pages: a full leaf table and one page of the next.
        map(&mut t, 0x4000_0000, 0x8000_1000, SZ_2M + SZ_4K, Prot::READ);
        let full = table_at(&t, 0x4000_0000, 3);
        let partial = table_at(&t, 0x4020_0000, 3);

        let (gather, work) = unmap(&mut t, 0x4000_0000, SZ_2M + SZ_4K);

        assert_eq!(gather.bytes(), SZ_2M + SZ_4K);
        let freed: Vec<PhysAddr> = gather.freed_tables.iter().map(|f| f.table_pa).collect();
        assert_eq!(freed, [full]);
        assert_eq!(work.tables_freed, 1);
        assert_eq!(t.read_descriptor(partial, 0), Some(0));
        assert_eq!(t.table_pages(), 4);
    }

    #[test]
    fn whole_span_unmap_of_1g_frees_the_level_2_table_and_everything_below() {
        let mut t = table(SZ_4K, 48);
        // The first 2M as 4K pages, the rest of the gigabyte as 2M blocks.
        map(&mut t, SZ_1G, 0x8000_1000, SZ_2M, Prot::READ);
        map(
            &mut t,
            SZ_1G + SZ_2M,
            0x8020_0000,
            SZ_1G - SZ_2M,
            Prot::READ,
        );
        let (l1, l2, l3) = (
            table_at(&t, SZ_1G, 1),
            table_at(&t, SZ_1G, 2),
            table_at(&t, SZ_1G, 3),
        );

        let (gather, work) = unmap(&mut t, SZ_1G, SZ_1G);

        assert_eq!(
            gather.freed_tables,
            [
                FreedTable {
                    table_pa: l3,
                    level: 3,
                    iova: Iova::new(SZ_1G),
                    size: SZ_2M
                },
                FreedTable {
                    table_pa: l2,
                    level: 2,
                    iova: Iova::new(SZ_1G),
                    size: SZ_1G
                },
            ]
        );
        assert_eq!(work.tables_freed, 2);
        // Level 0 holds no blocks: Linux never unmaps at its 512G size, so level 1 stays.
        assert_eq!(t.read_descriptor(l1, 1), Some(0));
        assert_eq!((t.table_pages(), t.mapped_bytes()), (2, 0));
    }

    #[test]
    fn whole_span_unmap_of_a_full_table_of_blocks_takes_the_fast_path_and_frees_it() {
        let mut t = table(SZ_4K, 48);
        // 2M-aligned but not 1G-aligned physical address: 512 blocks in one level-2 table.
        map(&mut t, SZ_1G, 0x8020_0000, SZ_1G, Prot::READ);
        let l2 = table_at(&t, SZ_1G, 2);

        let (gather, work) = unmap(&mut t, SZ_1G, SZ_1G);

        let freed: Vec<(PhysAddr, u32)> = gather
            .freed_tables
            .iter()
            .map(|f| (f.table_pa, f.level))
            .collect();
        assert_eq!(freed, [(l2, 2)]);
        // The run, its table, and the one table descriptor read above it on the way down.
        assert_eq!((work.ptes_cleared, work.pte_reads), (513, 514));
        assert_eq!(t.table_pages(), 2);
    }

    #[test]
    fn whole_span_frees_no_table_above_the_block_levels() {
        // 16K granule: blocks only at level 2, so covering a level-1 entry's 64G span frees
        // nothing (Linux unmaps it as 2048 blocks of 32M), while WhenEmpty frees both tables.
        for (reclaim, pages) in [(TableReclaim::WholeSpan, 3), (TableReclaim::WhenEmpty, 1)] {
            let mut t = table_with(SZ_16K, 48, reclaim);
            let span = 64 << 30;
            map(&mut t, span, span + SZ_32M, span, Prot::READ);

            let (gather, _) = unmap(&mut t, span, span);

            assert_eq!(gather.freed_tables.len() + pages, 3, "{reclaim:?}");
            assert_eq!(t.table_pages(), pages, "{reclaim:?}");
        }
    }

    #[test]
    fn when_empty_frees_the_tables_of_a_lone_4k_page() {
        let mut t = table_with(SZ_4K, 48, TableReclaim::WhenEmpty);
        map(&mut t, 0x4000_1000, 0x8000_1000, SZ_4K, Prot::READ);
        let walk = t.walk(Iova::new(0x4000_1000));

        let (gather, work) = unmap(&mut t, 0x4000_1000, SZ_4K);

        let freed: Vec<(PhysAddr, u32)> = gather
            .freed_tables
            .iter()
            .map(|f| (f.table_pa, f.level))
            .collect();
        let expected: Vec<(PhysAddr, u32)> = walk.steps()[1..]
            .iter()
            .rev()
            .map(|s| (s.table_pa, s.level))
            .collect();
        assert_eq!(freed, expected);
        assert_eq!((work.ptes_cleared, work.tables_freed), (4, 3));
        assert_eq!(t.table_pages(), 1);
        let again = map(&mut t, 0x4000_1000, 0x8000_1000, SZ_4K, Prot::READ);
        assert_eq!(again.tables_allocated, 3);
    }

    #[test]
    fn reclaim_frees_kept_empty_tables_bottom_up_and_keeps_live_ones() {
        let mut t = table(SZ_4K, 48);
        let (a, b, live) = (0x1000, 1 << 39, SZ_1G);
        map(&mut t, a, 0x1000, SZ_4K, Prot::READ);
        map(&mut t, b, 0x2000, SZ_4K, Prot::READ);
        map(&mut t, live, 0x3000, SZ_4K, Prot::READ);
        let (wa, wb) = (t.walk(Iova::new(a)), t.walk(Iova::new(b)));
        unmap(&mut t, a, SZ_4K);
        unmap(&mut t, b, SZ_4K);
        // Root; level 1 shared by a and live; level 2 and 3 of each of a, b and live; level 1
        // of b.
        assert_eq!(t.table_pages(), 9);
        let mut gather = UnmapGather::new();
        let mut work = WorkRecord::new();

        let freed = t.reclaim_empty_tables(&mut gather, &mut work);

        let tables: Vec<(PhysAddr, u32, u64, u64)> = gather
            .freed_tables
            .iter()
            .map(|f| (f.table_pa, f.level, f.iova.get(), f.size))
            .collect();
        let (sa, sb) = (wa.steps(), wb.steps());
        assert_eq!(
            tables,
            [
                (sa[3].table_pa, 3, 0, SZ_2M),
                (sa[2].table_pa, 2, 0, SZ_1G),
                (sb[3].table_pa, 3, b, SZ_2M),
                (sb[2].table_pa, 2, b, SZ_1G),
                (sb[1].table_pa, 1, b, 1 << 39),
            ]
        );
        assert!(gather.ranges.is_empty());
        assert_eq!(freed, 5);
        assert_eq!((work.tables_freed, work.ptes_cleared), (5, 5));
        // Every descriptor of the six non-leaf tables: root, both level-1 tables, and the
        // level-2 tables of a, b and live.
        assert_eq!(work.pte_reads, 6 * 512);
        assert_eq!(t.table_pages(), 4);
        assert_eq!(lookup(&t, live).unwrap().pa, PhysAddr::new(0x3000));
        assert_eq!(lookup(&t, a), None);

        // Nothing is left to reclaim; a map under a's old span allocates again.
        let mut again = UnmapGather::new();
        assert_eq!(
            t.reclaim_empty_tables(&mut again, &mut WorkRecord::new()),
            0
        );
        assert!(again.is_empty());
        assert_eq!(
            map(&mut t, a, 0x1000, SZ_4K, Prot::READ).tables_allocated,
            2
        );
    }

    #[test]
    fn reclaim_finds_nothing_when_tables_are_freed_as_they_empty() {
        let mut t = table_with(SZ_4K, 48, TableReclaim::WhenEmpty);
        map(&mut t, 0x1000, 0x1000, SZ_4K, Prot::READ);
        map(&mut t, 0x2000, 0x2000, SZ_4K, Prot::READ);
        unmap(&mut t, 0x1000, SZ_4K);
        let mut gather = UnmapGather::new();

        assert_eq!(
            t.reclaim_empty_tables(&mut gather, &mut WorkRecord::new()),
            0
        );

        assert!(gather.is_empty());
        assert_eq!(t.table_pages(), 4);
        unmap(&mut t, 0x2000, SZ_4K);
        assert_eq!(t.table_pages(), 1);
    }

    #[test]
    fn block_map_over_a_kept_empty_table_uses_pages_until_it_is_reclaimed() {
        let mut t = table(SZ_4K, 48);
        map(&mut t, SZ_2M, SZ_2M, SZ_4K, Prot::READ);
        unmap(&mut t, SZ_2M, SZ_4K);
        let mut reclaimed = t.clone();
        let mut gather = UnmapGather::new();
        assert_eq!(
            reclaimed.reclaim_empty_tables(&mut gather, &mut WorkRecord::new()),
            3
        );

        // Linux would replace the kept table with the block; this table cannot report the
        // freed page from a map, so it maps through the table.
        let kept = map(&mut t, SZ_2M, SZ_2M, SZ_2M, Prot::READ);
        let fresh = map(&mut reclaimed, SZ_2M, SZ_2M, SZ_2M, Prot::READ);

        assert_eq!((kept.tables_allocated, kept.ptes_written), (0, 512));
        assert_eq!(lookup(&t, SZ_2M + 5).unwrap().page_size, SZ_4K);
        assert_eq!((fresh.tables_allocated, fresh.ptes_written), (2, 3));
        assert_eq!(lookup(&reclaimed, SZ_2M + 5).unwrap().page_size, SZ_2M);
        // Unmapping the whole 2M frees the leaf table, and the next map gets the block.
        let (gather, _) = unmap(&mut t, SZ_2M, SZ_2M);
        assert_eq!(gather.freed_tables.len(), 1);
        map(&mut t, SZ_2M, SZ_2M, SZ_2M, Prot::READ);
        assert_eq!(lookup(&t, SZ_2M).unwrap().page_size, SZ_2M);
    }

    // ---- Errors leave the table unchanged ----

    #[test]
    fn unmap_of_partly_unmapped_range_fails_and_changes_nothing() {
        let mut t = table(SZ_4K, 48);
        map(&mut t, 0x10_0000, 0x10_0000, 2 * SZ_4K, Prot::READ);
        let probes = [0x10_0000, 0x10_1000];
        let before = snapshot(&t, &probes);
        let mut gather = UnmapGather::new();

        let err = t.unmap(
            Iova::new(0x10_0000),
            3 * SZ_4K,
            &mut gather,
            &mut WorkRecord::new(),
        );

        assert_eq!(err, Err(PgTableError::NotMapped { iova: 0x10_2000 }));
        assert_eq!(snapshot(&t, &probes), before);
        assert!(gather.is_empty());
    }

    #[test]
    fn partial_unmap_of_block_fails_with_splits_block() {
        let mut t = table(SZ_4K, 48);
        map(&mut t, SZ_2M, SZ_2M, SZ_2M, Prot::READ);
        let before = snapshot(&t, &[SZ_2M]);

        let err = t.unmap(
            Iova::new(SZ_2M + SZ_4K),
            SZ_4K,
            &mut UnmapGather::new(),
            &mut WorkRecord::new(),
        );

        assert_eq!(
            err,
            Err(PgTableError::SplitsBlock {
                iova: SZ_2M + SZ_4K,
                size: SZ_4K,
                block_iova: SZ_2M,
                block_size: SZ_2M
            })
        );
        assert_eq!(snapshot(&t, &[SZ_2M]), before);
    }

    #[test]
    fn map_over_existing_mapping_fails_and_leaks_no_tables() {
        let mut t = table(SZ_4K, 48);
        map(&mut t, 0x8000_0000, 0x8000_0000, SZ_4K, Prot::READ);
        let probes = [0x8000_0000, 0x0];
        let before = snapshot(&t, &probes);

        // Would need new tables for the first 2 GiB (misaligned pa) before reaching the conflict.
        let err = t.map(
            Iova::new(0),
            PhysAddr::new(0x1000),
            0x8000_1000,
            Prot::READ,
            &mut WorkRecord::new(),
        );

        assert_eq!(err, Err(PgTableError::AlreadyMapped { iova: 0x8000_0000 }));
        assert_eq!(snapshot(&t, &probes), before);
    }

    #[test]
    fn map_block_over_mapped_page_fails() {
        let mut t = table(SZ_4K, 48);
        map(&mut t, SZ_2M + SZ_4K, 0x1000, SZ_4K, Prot::READ);
        let mut work = WorkRecord::new();

        let err = t.map(
            Iova::new(SZ_2M),
            PhysAddr::new(SZ_2M),
            SZ_2M,
            Prot::READ,
            &mut work,
        );

        assert_eq!(
            err,
            Err(PgTableError::AlreadyMapped {
                iova: SZ_2M + SZ_4K
            })
        );
        assert_eq!(work.ptes_written, 0);
    }

    #[test]
    fn table_cap_is_enforced_before_writing() {
        let config = LpaeConfig::new(SZ_4K, 48, 48).with_max_table_pages(3);
        let mut t = LpaeTable::new(config).unwrap();
        let mut work = WorkRecord::new();

        // A 4K page in a 4-level table needs three tables below the root.
        let err = t.map(Iova::new(0), PhysAddr::new(0), SZ_4K, Prot::READ, &mut work);

        assert_eq!(err, Err(PgTableError::TooManyTables { limit: 3 }));
        assert_eq!((t.table_pages(), work.tables_allocated), (1, 0));
        // Two tables fit: a 2M block.
        map(&mut t, 0, 0, SZ_2M, Prot::READ);
    }

    #[test]
    fn bad_arguments_are_rejected() {
        let mut t = table(SZ_4K, 39);
        let mut w = WorkRecord::new();
        let pa = PhysAddr::new(0x1000);
        assert_eq!(
            t.map(Iova::new(0x800), pa, SZ_4K, Prot::READ, &mut w),
            Err(PgTableError::Misaligned {
                addr: 0x800,
                size: SZ_4K,
                granule: SZ_4K
            })
        );
        assert_eq!(
            t.map(
                Iova::new(0),
                PhysAddr::new(0x1800),
                SZ_4K,
                Prot::READ,
                &mut w
            ),
            Err(PgTableError::Misaligned {
                addr: 0x1800,
                size: SZ_4K,
                granule: SZ_4K
            })
        );
        assert_eq!(
            t.map(Iova::new(1 << 39), pa, SZ_4K, Prot::READ, &mut w),
            Err(PgTableError::OutOfRange {
                iova: 1 << 39,
                size: SZ_4K,
                start: 0,
                end: 1 << 39
            })
        );
        assert_eq!(
            t.map(
                Iova::new(0),
                PhysAddr::new(1 << 48),
                SZ_4K,
                Prot::READ,
                &mut w
            ),
            Err(PgTableError::PhysOutOfRange {
                pa: 1 << 48,
                bits: 48
            })
        );
        assert_eq!(
            t.map(Iova::new(0), pa, SZ_4K, Prot::NONE, &mut w),
            Err(PgTableError::NoPermission)
        );
        assert_eq!(
            t.unmap(Iova::new(0), SZ_4K + 1, &mut UnmapGather::new(), &mut w),
            Err(PgTableError::Misaligned {
                addr: 0,
                size: SZ_4K + 1,
                granule: SZ_4K
            })
        );
        assert_eq!((t.table_pages(), t.mapped_bytes()), (1, 0));
    }

    // ---- The read-only walk ----

    #[test]
    fn walk_reports_each_level_and_decodes_table_addresses() {
        let mut t = table(SZ_4K, 48);
        map(&mut t, 0x1234_5000, 0x8000_1000, SZ_4K, Prot::READ_WRITE);

        let walk = t.walk(Iova::new(0x1234_5678));

        let steps = walk.steps();
        assert_eq!(steps.len(), 4);
        assert_eq!(steps[0].table_pa, t.root_pa());
        for pair in steps.windows(2) {
            let spec::Descriptor::Table { next_table } =
                spec::decode(pair[0].desc, pair[0].level, 12)
            else {
                panic!("expected a table descriptor");
            };
            assert_eq!(next_table, pair[1].table_pa);
        }
        // Level-3 index of 0x1234_5678 is bits [20:12] = 0x145.
        assert_eq!(steps[3].index, 0x145);
        assert_eq!(steps[3].desc, 0x8000_1F47);
        assert_eq!(steps[3].desc_pa(), steps[3].table_pa.add(0x145 * 8));
        assert_eq!(
            t.read_descriptor(steps[3].table_pa, 0x145),
            Some(steps[3].desc)
        );
        assert_eq!(walk.translation.unwrap().pa, PhysAddr::new(0x8000_1678));
        let resumed = t.walk_from(3, steps[3].table_pa, Iova::new(0x1234_5678));
        assert_eq!(resumed.translation, walk.translation);
    }

    #[test]
    fn walk_of_unmapped_iova_stops_at_invalid_descriptor() {
        let t = table(SZ_4K, 48);
        let walk = t.walk(Iova::new(0x1000));
        assert_eq!((walk.steps().len(), walk.translation), (1, None));
    }
}
