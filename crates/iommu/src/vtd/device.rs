//! One VT-d remapping unit (a DRHD): root and context tables in memory, the context cache,
//! the IOTLB and paging-structure caches, fault recording, and the invalidation queue as
//! the hardware consumes it.
//!
//! # Translation
//!
//! [`Dmar::translate`] is what the unit does with a DMA request from source id `sid`
//! (bus << 8 | devfn) in legacy mode (X86.md §1.3):
//!
//! 1. Context cache by source id; on a miss, read the root entry (RTADDR + bus × 16) and
//!    the context entry (CTP + devfn × 16), two `walk_reads`, and fill the cache. A clear
//!    P bit, reserved bits, an AW the unit does not support (SAGAW) or pass-through without
//!    ECAP.PT fault (reasons 0x1, 0x2, 0xA, 0xB, 0x3).
//! 2. Pass-through (TT = 2): the output address is the input address.
//! 3. An address at or above 2^width of the table faults (0x4, beyond MGAW/AGAW).
//! 4. IOTLB, tagged by DID ([`Asid`] = DID): a hit translates (stale entries still do, and
//!    count `iotlb_stale_hits`).
//! 5. On a miss, the page walk from the deepest paging-structure-cache hit: one
//!    `walk_reads` per entry read from memory; non-leaf entries fill the paging-structure
//!    cache, the leaf fills the IOTLB. A not-present entry faults with 0x6 (read) or 0x5
//!    (write), as does a leaf without the permission (X86.md §1.8).
//!
//! # Caching Mode
//!
//! With CAP.CM set the unit also caches not-present leaves: a walk that finds nothing
//! leaves a negative IOTLB entry (4 KiB, no permission) and later requests fault from it
//! without a walk until an invalidation covering it. That is what CM licenses ("any
//! software updates to remapping structures ... requires explicit invalidation", VT-d §6.1
//! via Linux cache.c, X86.md §1.7), and what a virtual IOMMU relies on to shadow the guest's
//! tables: **the driver must invalidate after a map** (Linux `iotlb_sync_map` issues a PSI
//! for second-stage domains when CM is set), and must not use the flush queue (Linux forces
//! strict mode). [`DmarDomain::sync_map`] is that invalidation.
//!
//! # Faults
//!
//! A fault is recorded, unless the context entry has FPD, in the next of CAP.NFR fault
//! recording registers, round robin; FSTS.PPF says one is pending and FSTS.FRI points at the
//! oldest. When the next register still holds an unread record (F set) the fault is
//! dropped and FSTS.PFO set (X86.md §1.8). Software clears a record's F bit
//! ([`Dmar::clear_fault_record`]) and PFO with [`Dmar::write_fsts`].
//!
//! # The invalidation queue
//!
//! A ring of 128-bit descriptors in memory (IQA), IQH the hardware's byte offset, IQT
//! software's (X86.md §1.6). [`Dmar::process_queue`] consumes from IQH to IQT in order:
//!
//! - context-cache: global, by DID, or one source id (with the function mask);
//! - IOTLB: global, domain-selective (IOTLB and paging-structure caches of the DID), or
//!   page-selective: the 2^AM pages containing ADDR, aligned (address bits below the mask
//!   ignored), from the IOTLB; unless IH is set, also the paging-structure caches: all of the
//!   DID's entries by default, as Intel's server IIO does, or only those over the pages
//!   ([`DmarConfig::nonleaf_psi`]);
//! - PASID-based IOTLB: in legacy mode as the DID's page-selective or domain-selective
//!   invalidation; in scalable mode on the (DID, PASID) first-stage tags ([`super::scalable`]);
//! - PASID-cache: by DID, by DID and PASID, or all;
//! - device-TLB and PASID-based device-TLB: the ATS device's ATC entries in the range
//!   ([`super::devtlb`]);
//! - wait: with SW, writes STDATA to STADDR; with IF, sets ICS.IWC.
//!
//! A descriptor that does not decode (unknown type, reserved bits, reserved granularity)
//! stops the queue: FSTS.IQE set, IQERCD.IQEI = 3 (a type the model does not implement) or
//! 4 (reserved bits or granularity; `spec::iqei`), IQH left pointing at it, and nothing
//! more is fetched until software clears IQE. A tail that is not a multiple of 16, or lies
//! beyond the queue, sets IQE with IQEI = 1 (invalid tail pointer).
//!
//! The hardware runs only when asked ([`Dmar::process_queue`]): the driver
//! ([`Dmar::qi_submit_sync`], in `invalidator`) asks between its polls, which stands for
//! the time the hardware takes, so a single-threaded submission always finds its wait
//! pending at the first poll and done at the second.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use parking_lot::Mutex;

use super::devtlb::{AtcSelect, DevTlb};
use super::invalidator::{Qi, QiError, VtdInvalidator};
use super::pgtable::{read_u64, VtdPageTable, VtdStage, VtdTableConfig, VtdTableError};
use super::scalable::{SmCaches, VtdRequest, VtdTranslation};
use super::spec::{
    self, fsts, iqei, psi_range, reason, Cap, CcGranularity, ContextEntry, Ecap, FaultRecord,
    FlExecControl, InvDesc, IotlbGranularity, PasidIotlbGranularity, RootEntry, SmContextEntry,
    TranslationType,
};
use crate::addr::{Access, Iova, PhysAddr, Prot, SZ_4K};
use crate::dma::{DmaError, Domain, DomainConfig, DomainId, DomainMode};
use crate::iotlb::{
    Asid, CacheConfigError, Iotlb, IotlbConfig, Replacement, WalkCacheConfig, WalkLevelConfig,
};
use crate::iova::IovaAllocator;
use crate::mem::{MemError, PhysAllocator, PhysMemory};
use crate::pgtable::{IoPageTable, PgTableError, Translation, UnmapGather};
use crate::work::WorkRecord;

/// How to build a [`Dmar`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DmarConfig {
    /// The capability register.
    pub cap: Cap,
    /// The extended capability register.
    pub ecap: Ecap,
    /// IOTLB geometry (default 64 entries, 4-way, LRU: the ~64-entry reach measured on
    /// Ivy Bridge to Broadwell, X86.md §1.5; the organisation is not published).
    pub iotlb: IotlbConfig,
    /// Paging-structure cache entries per non-leaf level, root first (`levels − 1` of
    /// them). Default for 4 levels: 4 PML4, 16 PDPT, 64 PD entries (F&S's estimate of
    /// 64–128 PD entries; the small upper levels cover everything live, X86.md §1.5).
    pub pscache: Vec<usize>,
    /// Context-cache entries (not published; default 64).
    pub context_cache: usize,
    /// Invalidation-queue entries (Linux `QI_LENGTH`, 256).
    pub qi_entries: usize,
    /// Legacy or scalable mode, and the stage scalable-mode domains use.
    pub translation: VtdTranslation,
    /// PASID-cache entries (scalable mode; not published, default 64).
    pub pasid_cache: usize,
    /// What the driver writes for execute control in first-stage domains: XD on their
    /// entries, NXE in their PASID-table entry. Default: Linux 6.12's, neither; a scenario's
    /// release gives its own (`linux::DmaPathVariants::vtd_first_stage`).
    pub fl_exec: FlExecControl,
    /// What a page-selective IOTLB invalidation with IH = 0 removes from the
    /// paging-structure caches (default [`NonLeafPsiScope::Domain`], Intel's server IIO).
    pub nonleaf_psi: NonLeafPsiScope,
}

/// The paging-structure-cache entries a page-selective-within-domain IOTLB invalidation
/// removes when its Invalidation Hint is clear.
///
/// The spec requires the non-leaf entries used to translate the range to go and lets an
/// implementation invalidate more. Intel's server IIO documents that it does: "IIO performs
/// a domain-level invalidation on non-leaf entries and page-selective-domain-level
/// invalidation at the leaf level" (Xeon E7 v2 datasheet vol. 2, `VTD_IOTLBINV.ih`,
/// docs/MODEL.md).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum NonLeafPsiScope {
    /// Every paging-structure-cache entry of the domain (Intel server IIO).
    #[default]
    Domain,
    /// Only the entries covering the invalidated range (the spec's minimum).
    Range,
}

impl DmarConfig {
    /// A unit with the given registers and default cache sizes.
    pub fn new(cap: Cap, ecap: Ecap) -> Self {
        let levels = Self::levels_of(cap).unwrap_or(4);
        let mut pscache = vec![4; levels as usize - 1];
        if let Some(pd) = pscache.last_mut() {
            *pd = 64;
        }
        if levels >= 4 {
            pscache[levels as usize - 3] = 16;
        }
        Self {
            cap,
            ecap,
            iotlb: IotlbConfig::new(64, 4, Replacement::Lru),
            pscache,
            context_cache: 64,
            qi_entries: 256,
            translation: VtdTranslation::Legacy,
            pasid_cache: 64,
            fl_exec: FlExecControl::LINUX_6_11,
            nonleaf_psi: NonLeafPsiScope::Domain,
        }
    }

    /// The same unit in scalable mode with domains of the given stage (RTADDR.TTM = 1).
    /// [`Dmar::new`] checks ECAP.SMTS and ECAP.FLTS / SLTS.
    pub fn with_translation(mut self, translation: VtdTranslation) -> Self {
        self.translation = translation;
        self
    }

    /// The same unit driven by a kernel that writes first-stage execute control as `exec`
    /// (XD on first-stage entries, NXE in the PASID entry: [`DmarConfig::fl_exec`]).
    pub fn with_fl_exec(mut self, exec: FlExecControl) -> Self {
        self.fl_exec = exec;
        self
    }

    /// The Skylake/Cascade-Lake-class profile of X86.md §1.2 (4-level, CM = 0, MAMV 18).
    pub fn cascade_lake() -> Self {
        Self::new(spec::CAP_CASCADE_LAKE, spec::ECAP_CASCADE_LAKE)
    }

    /// The same unit with Caching Mode set, as a virtual IOMMU (QEMU `caching-mode=on`).
    pub fn caching_mode(mut self) -> Self {
        self.cap = Cap(self.cap.0 | 1 << 7);
        self
    }

    /// The levels Linux uses on this unit: the largest SAGAW not above 5 levels
    /// (X86.md §1.4); `None` if SAGAW offers none of 3, 4, 5.
    pub fn levels_of(cap: Cap) -> Option<u32> {
        (3..=5)
            .rev()
            .find(|&l| cap.sagaw() & (1 << spec::agaw_of_levels(l)) != 0)
    }

    fn walk_cache_config(&self, levels: u32) -> WalkCacheConfig {
        WalkCacheConfig {
            levels: (0..levels - 1)
                .map(|d| {
                    let entries = self.pscache.get(d as usize).copied().unwrap_or(0);
                    WalkLevelConfig {
                        entries,
                        ways: entries.clamp(1, 4),
                        span_shift: 12 + 9 * (levels - 1 - d),
                    }
                })
                .collect(),
            policy: Replacement::Lru,
        }
    }
}

/// Why a [`Dmar`] operation failed. The unit is unchanged.
#[derive(Debug, thiserror::Error)]
pub enum DmarError {
    /// SAGAW offers no 3-, 4- or 5-level table.
    #[error("CAP.SAGAW {sagaw:#x} offers no 3-, 4- or 5-level table")]
    NoAgaw {
        /// SAGAW.
        sagaw: u32,
    },
    /// The unit has no queued invalidation (ECAP.QI clear); register-based invalidation is
    /// not modelled.
    #[error("ECAP.QI is clear: register-based invalidation is not modelled")]
    NoQueuedInvalidation,
    /// The queue size is not a power of two from 2 to 2^15 entries (QS ≤ 7, X86.md §1.1).
    #[error("Invalidation queue of {entries} entries: need a power of two, 2..=32768")]
    BadQueue {
        /// Entries asked for.
        entries: usize,
    },
    /// A cache could not be built.
    #[error("Cannot build the unit's caches")]
    Caches(#[from] CacheConfigError),
    /// Simulated memory ran out or was misused.
    #[error("Memory error")]
    Memory(#[from] MemError),
    /// The domain's table could not be built.
    #[error("Cannot build the domain's page table")]
    Table(#[from] VtdTableError),
    /// The DMA domain could not be built.
    #[error("Cannot build the DMA domain")]
    Dma(#[from] DmaError),
    /// A domain id outside 1..CAP.ND's count or already used (DID 0 is reserved: with CM,
    /// hardware tags invalid translations with it).
    #[error("Domain id {did} is reserved, in use or beyond the unit's {domains} domains")]
    BadDid {
        /// The DID.
        did: u16,
        /// Domains the unit supports.
        domains: u64,
    },
    /// A translated domain needs strict or lazy mode.
    #[error("A VT-d domain is translated, not {mode:?}")]
    NotTranslated {
        /// The mode asked for.
        mode: DomainMode,
    },
    /// The table's levels are not in SAGAW.
    #[error("A {levels}-level table is not in CAP.SAGAW {sagaw:#x}")]
    LevelsNotSupported {
        /// Levels.
        levels: u32,
        /// SAGAW.
        sagaw: u32,
    },
    /// The source id already has a present context entry.
    #[error("Source id {sid:#06x} is already attached")]
    AlreadyAttached {
        /// The source id.
        sid: u16,
    },
    /// The domain was built by another unit.
    #[error("Domain {did} belongs to another unit")]
    ForeignDomain {
        /// The domain's DID.
        did: u16,
    },
    /// An invalidation the attach issued failed.
    #[error("Invalidation failed")]
    Qi(#[from] QiError),
    /// Scalable mode asked of a unit whose ECAP lacks a bit it needs.
    #[error("{translation:?} needs ECAP.{missing}, which this unit does not report")]
    NoScalableMode {
        /// The translation asked for.
        translation: VtdTranslation,
        /// The missing ECAP field.
        missing: &'static str,
    },
}

/// A translation fault: what the unit records (if not suppressed by FPD).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "DMAR fault {reason:#x} for source {sid:#06x} at {addr:#x} ({access:?}), recorded: {recorded}"
)]
pub struct DmarFault {
    /// The fault reason ([`spec::reason`]).
    pub reason: u8,
    /// Source id.
    pub sid: u16,
    /// The request address.
    pub addr: u64,
    /// The access.
    pub access: Access,
    /// Whether it went into a fault recording register (not FPD, not dropped on overflow).
    pub recorded: bool,
    /// The request's PASID, if it carried one.
    pub pasid: Option<u32>,
}

/// A successful translation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DmarTranslation {
    /// The output address.
    pub pa: PhysAddr,
    /// Size of the page that mapped it (the input address itself for pass-through: 4 KiB).
    pub page_size: u64,
    /// Whether the IOTLB answered.
    pub iotlb_hit: bool,
    /// Whether that IOTLB entry's mapping was already removed (stale).
    pub stale: bool,
    /// The permissions the translation grants (what an ATS completion reports).
    pub prot: Prot,
}

impl DmarTranslation {
    /// A pass-through translation: the input address itself, read-write, no IOTLB involved.
    pub fn passthrough(addr: u64) -> Self {
        Self {
            pa: PhysAddr::new(addr),
            page_size: SZ_4K,
            iotlb_hit: false,
            stale: false,
            prot: Prot::READ_WRITE,
        }
    }
}

/// Counts kept by the unit's hardware side.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DmarStats {
    /// Context-cache hits.
    pub context_hits: u64,
    /// Context-cache misses (root + context entries read).
    pub context_misses: u64,
    /// Negative (not-present) IOTLB entries filled under Caching Mode.
    pub negative_fills: u64,
    /// Faults seen (recorded or not).
    pub faults: u64,
    /// Faults dropped because every fault recording register was full (PFO).
    pub faults_dropped: u64,
    /// Descriptors processed, by type: context-cache, IOTLB, device-TLB, wait, PASID-IOTLB,
    /// PASID-cache, PASID-based device-TLB.
    pub descriptors: [u64; 7],
    /// Page-selective IOTLB invalidations (type 2 with G = 3, and type 6 with G = 3).
    pub psi: u64,
    /// Domain-selective IOTLB invalidations.
    pub dsi: u64,
    /// Global IOTLB invalidations.
    pub global: u64,
    /// IOTLB entries removed by invalidations.
    pub iotlb_removed: u64,
    /// Paging-structure-cache entries removed by invalidations.
    pub pscache_removed: u64,
    /// Invalidation-queue errors raised.
    pub queue_errors: u64,
    /// PASID-cache hits (scalable mode).
    pub pasid_hits: u64,
    /// PASID-cache misses (PASID directory and table entries read).
    pub pasid_misses: u64,
    /// PASID-cache entries removed by invalidations.
    pub pasid_removed: u64,
    /// Device-TLB (ATC) hits.
    pub devtlb_hits: u64,
    /// Device-TLB misses (translation requests to the unit).
    pub devtlb_misses: u64,
    /// Device-TLB entries removed by invalidations.
    pub devtlb_removed: u64,
}

/// A context-cache entry: what a present context entry said.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct CachedContext {
    pub(super) sid: u16,
    pub(super) did: u16,
    pub(super) fpd: bool,
    pub(super) tt: TranslationType,
    pub(super) root: u64,
    pub(super) levels: u32,
    /// The scalable-mode context entry (then `did`, `tt`, `root`, `levels` are unused).
    pub(super) sm: Option<SmContextEntry>,
}

/// The unit's caches.
pub(super) struct Caches {
    pub(super) iotlb: Iotlb,
    pub(super) walk: crate::iotlb::WalkCache,
    /// Fully associative, FIFO replacement.
    pub(super) context: VecDeque<CachedContext>,
    pub(super) context_capacity: usize,
    /// Scalable mode: the PASID cache and the (DID, PASID, stage) tags of the IOTLB.
    pub(super) sm: SmCaches,
}

impl Caches {
    /// The IOTLB / paging-structure-cache tags of domain `did` (every PASID and stage in
    /// scalable mode).
    pub(super) fn tags_of(&self, did: u16, scalable: bool) -> Vec<Asid> {
        if scalable {
            self.sm.tags_where(|t| t.did == did)
        } else {
            vec![Asid(u32::from(did))]
        }
    }
}

/// The registers the model keeps.
#[derive(Debug)]
pub(super) struct Regs {
    /// RTADDR: the root table and TTM.
    rtaddr: u64,
    iqa_base: u64,
    iqh: u64,
    iqt: u64,
    fsts: u32,
    iqercd: u64,
    ics: u32,
    records: Vec<Option<FaultRecord>>,
    next_record: usize,
}

/// One VT-d remapping unit. See the module docs.
pub struct Dmar {
    pub(super) config: DmarConfig,
    pub(super) levels: u32,
    pub(super) alloc: Arc<PhysAllocator>,
    pub(super) regs: Mutex<Regs>,
    pub(super) caches: Arc<Mutex<Caches>>,
    pub(super) stats: Mutex<DmarStats>,
    qi: Qi,
    dids: Mutex<Vec<u16>>,
    /// Device-TLBs (ATCs) of the source ids attached with ATS, by source id.
    pub(super) devtlbs: Mutex<BTreeMap<u16, DevTlb>>,
}

impl std::fmt::Debug for Dmar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dmar")
            .field("cap", &format_args!("{:#x}", self.config.cap.0))
            .field("ecap", &format_args!("{:#x}", self.config.ecap.0))
            .field("levels", &self.levels)
            .finish_non_exhaustive()
    }
}

/// Linux's status values in `desc_status` (`QI_FREE`, `QI_IN_USE`, `QI_DONE`, `QI_ABORT`).
pub mod qi_status {
    /// Slot free.
    pub const FREE: u32 = 0;
    /// Slot holds a descriptor not yet known complete.
    pub const IN_USE: u32 = 1;
    /// The wait descriptor's status write.
    pub const DONE: u32 = 2;
    /// Aborted by a device-TLB time-out.
    pub const ABORT: u32 = 3;
}

impl Dmar {
    /// A unit whose root table, invalidation queue and the driver's status array are
    /// allocated from `alloc`, with translation and queued invalidation enabled and every
    /// root entry clear.
    pub fn new(config: DmarConfig, alloc: Arc<PhysAllocator>) -> Result<Arc<Self>, DmarError> {
        let levels = DmarConfig::levels_of(config.cap).ok_or(DmarError::NoAgaw {
            sagaw: config.cap.sagaw(),
        })?;
        if !config.ecap.qi() {
            return Err(DmarError::NoQueuedInvalidation);
        }
        config.translation.check(config.ecap)?;
        let n = config.qi_entries;
        if !n.is_power_of_two() || !(2..=1 << 15).contains(&n) {
            return Err(DmarError::BadQueue { entries: n });
        }
        let iotlb = Iotlb::new(config.iotlb)?;
        let walk = crate::iotlb::WalkCache::new(config.walk_cache_config(levels))?;
        let mut scratch = WorkRecord::new();
        let limit = PhysAddr::new(u64::MAX);
        let root = alloc.alloc(1, 1, limit, &mut scratch)?;
        let queue_pages = (n as u64 * 16).div_ceil(SZ_4K);
        let queue = alloc.alloc(queue_pages, queue_pages, limit, &mut scratch)?;
        let status_pages = (n as u64 * 4).div_ceil(SZ_4K);
        let status = alloc.alloc(status_pages, 1, limit, &mut scratch)?;
        let nfr = config.cap.nfr() as usize;
        Ok(Arc::new(Self {
            levels,
            regs: Mutex::new(Regs {
                rtaddr: spec::rtaddr_encode(root.get(), config.translation.is_scalable()),
                iqa_base: queue.get(),
                iqh: 0,
                iqt: 0,
                fsts: 0,
                iqercd: 0,
                ics: 0,
                records: vec![None; nfr],
                next_record: 0,
            }),
            caches: Arc::new(Mutex::new(Caches {
                iotlb,
                walk,
                context: VecDeque::with_capacity(config.context_cache),
                context_capacity: config.context_cache,
                sm: SmCaches::new(config.pasid_cache),
            })),
            stats: Mutex::new(DmarStats::default()),
            qi: Qi::new(n, queue.get(), status.get()),
            dids: Mutex::new(Vec::new()),
            devtlbs: Mutex::new(BTreeMap::new()),
            alloc,
            config,
        }))
    }

    /// The configuration.
    pub fn config(&self) -> &DmarConfig {
        &self.config
    }

    /// The table levels this unit's domains use.
    pub fn levels(&self) -> u32 {
        self.levels
    }

    /// The simulated memory the unit reads.
    pub fn memory(&self) -> &Arc<PhysMemory> {
        self.alloc.memory()
    }

    /// The allocator the unit's structures come from.
    pub fn allocator(&self) -> &Arc<PhysAllocator> {
        &self.alloc
    }

    /// The driver side of the invalidation queue.
    pub(crate) fn qi(&self) -> &Qi {
        &self.qi
    }

    /// Hardware-side counts.
    pub fn stats(&self) -> DmarStats {
        *self.stats.lock()
    }

    // -----------------------------------------------------------------------------------
    // Registers.
    // -----------------------------------------------------------------------------------

    /// The root table (RTADDR bits 63:12).
    pub fn root_table(&self) -> PhysAddr {
        PhysAddr::new(self.regs.lock().rtaddr & spec::ADDR_MASK_63_12)
    }

    /// RTADDR as software reads it: the root table and TTM (bit 10 set in scalable mode).
    pub fn rtaddr(&self) -> u64 {
        self.regs.lock().rtaddr
    }

    /// Whether RTADDR.TTM selects scalable mode.
    pub fn is_scalable(&self) -> bool {
        self.config.translation.is_scalable()
    }

    /// The invalidation queue's base (IQA bits 63:12).
    pub fn queue_base(&self) -> PhysAddr {
        PhysAddr::new(self.regs.lock().iqa_base)
    }

    /// IQA as software would read it (base, DW = 0, QS).
    pub fn iqa(&self) -> u64 {
        let pages = (self.config.qi_entries as u64 * 16).div_ceil(SZ_4K);
        spec::iqa_encode(
            self.regs.lock().iqa_base,
            false,
            pages.trailing_zeros() as u8,
        )
    }

    /// IQH (byte offset of the next descriptor the hardware fetches).
    pub fn iqh(&self) -> u64 {
        self.regs.lock().iqh
    }

    /// IQT (byte offset one past the last descriptor software published).
    pub fn iqt(&self) -> u64 {
        self.regs.lock().iqt
    }

    /// IQERCD.
    pub fn iqercd(&self) -> u64 {
        self.regs.lock().iqercd
    }

    /// ICS (bit 0 = IWC).
    pub fn ics(&self) -> u32 {
        self.regs.lock().ics
    }

    /// FSTS without counting an MMIO read (for tests and reports).
    pub fn fsts(&self) -> u32 {
        let r = self.regs.lock();
        Self::fsts_of(&r)
    }

    fn fsts_of(r: &Regs) -> u32 {
        let n = r.records.len();
        let fri = (0..n)
            .map(|i| (r.next_record + i) % n)
            .find(|&i| r.records[i].is_some());
        match fri {
            Some(i) => r.fsts | fsts::PPF | ((i as u32) << fsts::FRI_SHIFT),
            None => r.fsts & !fsts::PPF,
        }
    }

    /// Software reads FSTS: one `mmio_reads`.
    pub fn read_fsts(&self, work: &mut WorkRecord) -> u32 {
        work.mmio_reads += 1;
        self.fsts()
    }

    /// Software writes FSTS: the write-1-to-clear bits PFO, IQE, ICE, ITE it sets are
    /// cleared. One `mmio_writes`.
    pub fn write_fsts(&self, w1c: u32, work: &mut WorkRecord) {
        work.mmio_writes += 1;
        let mut r = self.regs.lock();
        r.fsts &= !(w1c & (fsts::PFO | fsts::IQE | fsts::ICE | fsts::ITE));
    }

    /// Software writes IQT: one `mmio_writes`. A tail not aligned to a 128-bit descriptor, or
    /// beyond the queue, raises IQE (IQEI 1, invalid tail pointer).
    pub fn write_iqt(&self, tail: u64, work: &mut WorkRecord) {
        work.mmio_writes += 1;
        let mut r = self.regs.lock();
        if tail % 16 != 0 || tail >= self.config.qi_entries as u64 * 16 {
            r.fsts |= fsts::IQE;
            r.iqercd = spec::iqercd_encode(iqei::INVALID_TAIL, 0, 0);
            self.stats.lock().queue_errors += 1;
            return;
        }
        r.iqt = tail;
    }

    /// Fault recording register `index` as 128 bits (F clear if empty).
    pub fn fault_record(&self, index: usize) -> Option<[u64; 2]> {
        let r = self.regs.lock();
        r.records
            .get(index)
            .map(|f| f.map_or([0, 0], |f| f.encode()))
    }

    /// Software clears a record's F bit (write 1 to F): one `mmio_writes`.
    pub fn clear_fault_record(&self, index: usize, work: &mut WorkRecord) {
        work.mmio_writes += 1;
        if let Some(slot) = self.regs.lock().records.get_mut(index) {
            *slot = None;
        }
    }

    // -----------------------------------------------------------------------------------
    // Driver side: context entries and domains.
    // -----------------------------------------------------------------------------------

    pub(super) fn write_u64s(&self, pa: u64, words: &[u64]) {
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        let ok = self.memory().write(PhysAddr::new(pa), &bytes);
        debug_assert!(ok.is_ok(), "unit structures lie inside memory");
    }

    /// Writes the legacy context entry of `sid`, allocating the bus's context table (and
    /// setting its root entry) if needed. No invalidation: the caller issues what the
    /// change needs.
    pub fn write_context(&self, sid: u16, entry: &ContextEntry) -> Result<(), DmarError> {
        let (bus, devfn) = (u64::from(sid >> 8), u64::from(sid & 0xFF));
        let root_pa = self.root_table().get() + bus * spec::ROOT_ENTRY_BYTES;
        let root = [
            read_u64(self.memory(), root_pa),
            read_u64(self.memory(), root_pa + 8),
        ];
        let table = match RootEntry::decode(root) {
            Some(r) if r.present => r.context_table,
            _ => {
                let t = self
                    .alloc
                    .alloc(1, 1, PhysAddr::new(u64::MAX), &mut WorkRecord::new())?
                    .get();
                let r = RootEntry {
                    present: true,
                    context_table: t,
                };
                self.write_u64s(root_pa, &r.encode());
                t
            }
        };
        self.write_u64s(table + devfn * spec::CONTEXT_ENTRY_BYTES, &entry.encode());
        Ok(())
    }

    /// The context entry of `sid` as memory holds it (`None` if the bus has no table or the
    /// entry does not decode).
    pub fn read_context(&self, sid: u16) -> Option<ContextEntry> {
        let (bus, devfn) = (u64::from(sid >> 8), u64::from(sid & 0xFF));
        let root_pa = self.root_table().get() + bus * spec::ROOT_ENTRY_BYTES;
        let root = RootEntry::decode([
            read_u64(self.memory(), root_pa),
            read_u64(self.memory(), root_pa + 8),
        ])?;
        if !root.present {
            return None;
        }
        let at = root.context_table + devfn * spec::CONTEXT_ENTRY_BYTES;
        ContextEntry::decode([read_u64(self.memory(), at), read_u64(self.memory(), at + 8)])
    }

    /// Builds a translated domain with domain id `did`: a second-stage table of this unit's
    /// levels (superpages per CAP.SLLPS) in the unit's memory, and the Linux strict-path
    /// invalidator ([`VtdInvalidator`]). Attach source ids with [`Dmar::attach`]. A unit in
    /// scalable mode with first-stage domains builds a first-stage table instead: 5 levels
    /// if the unit's are 5 and CAP.FL5LP, else 4; 1 GiB pages if CAP.FL1GP.
    pub fn new_domain(
        self: &Arc<Self>,
        did: u16,
        config: DomainConfig,
        allocator: Arc<dyn IovaAllocator>,
    ) -> Result<DmarDomain, DmarError> {
        let cap = self.config.cap;
        let table = if self.config.translation == VtdTranslation::ScalableFirstStage {
            let levels = if self.levels == 5 && cap.fl5lp() {
                5
            } else {
                4
            };
            VtdTableConfig::first_stage(levels, cap.fl1gp()).with_exec_control(self.config.fl_exec)
        } else {
            VtdTableConfig::second_stage(self.levels).with_large_pages(cap.sllps())
        };
        self.new_domain_with(did, config, table, allocator)
    }

    /// [`Dmar::new_domain`] with an explicit table configuration (its levels must be in
    /// SAGAW).
    pub fn new_domain_with(
        self: &Arc<Self>,
        did: u16,
        config: DomainConfig,
        table: VtdTableConfig,
        allocator: Arc<dyn IovaAllocator>,
    ) -> Result<DmarDomain, DmarError> {
        if !config.mode.is_translated() {
            return Err(DmarError::NotTranslated { mode: config.mode });
        }
        let sagaw = self.config.cap.sagaw();
        let levels_ok = match table.stage {
            VtdStage::Second => sagaw & (1 << spec::agaw_of_levels(table.levels)) != 0,
            // First stage: FLPM offers 4 levels, and 5 with CAP.FL5LP.
            VtdStage::First => table.levels == 4 || (table.levels == 5 && self.config.cap.fl5lp()),
        };
        if !levels_ok {
            return Err(DmarError::LevelsNotSupported {
                levels: table.levels,
                sagaw,
            });
        }
        let domains = self.config.cap.domains();
        let bad = DmarError::BadDid { did, domains };
        if did == 0 || u64::from(did) >= domains || self.dids.lock().contains(&did) {
            return Err(bad);
        }
        let t = VtdPageTable::new(table, self.alloc.clone())?;
        let root = t.root_pa();
        let agaw = t.agaw();
        let wrapper = DmarPageTable {
            table: t,
            caches: self.caches.clone(),
            did,
            scalable: self.is_scalable(),
        };
        let mut inv = VtdInvalidator::new(self.clone(), did);
        if table.stage == VtdStage::First {
            // Linux flushes first-stage domains with PASID-based descriptors.
            inv = inv.with_pasid(spec::RID_PASID_LINUX);
        }
        let invalidator = Arc::new(inv);
        let domain = Domain::translated(config, Box::new(wrapper), allocator, invalidator.clone())?;
        let mut dids = self.dids.lock();
        if dids.contains(&did) {
            return Err(bad);
        }
        dids.push(did);
        Ok(DmarDomain {
            domain: Arc::new(domain),
            did,
            root,
            agaw,
            stage: table.stage,
            levels: table.levels,
            exec: table.exec,
            invalidator,
            unit: Arc::as_ptr(self) as usize,
        })
    }

    /// Points `sid` at `domain`: a present legacy context entry (TT = 0, the domain's table,
    /// AW, DID). As Linux's `domain_context_mapping_one`: with Caching Mode, a
    /// device-selective context-cache invalidation (DID 0) and a domain-selective IOTLB
    /// invalidation follow, with one wait; without it nothing is needed (a not-present
    /// context entry is never cached).
    ///
    /// In scalable mode the entry is a scalable-mode context entry pointing at a PASID
    /// directory with the domain's PASID-table entry at RID_PASID 0 (see [`super::scalable`]).
    pub fn attach(
        &self,
        sid: u16,
        domain: &DmarDomain,
        work: &mut WorkRecord,
    ) -> Result<(), DmarError> {
        if domain.unit != self as *const Self as usize {
            return Err(DmarError::ForeignDomain { did: domain.did });
        }
        if self.is_scalable() {
            return self.attach_sm(sid, domain, false, work);
        }
        self.attach_legacy(sid, domain, TranslationType::MultiLevel, work)
    }

    /// The legacy-mode attach with translation type `tt`.
    pub(super) fn attach_legacy(
        &self,
        sid: u16,
        domain: &DmarDomain,
        tt: TranslationType,
        work: &mut WorkRecord,
    ) -> Result<(), DmarError> {
        if self.read_context(sid).is_some_and(|c| c.present) {
            return Err(DmarError::AlreadyAttached { sid });
        }
        let entry = ContextEntry {
            present: true,
            fpd: false,
            tt,
            slptptr: domain.root.get(),
            aw: domain.agaw,
            did: domain.did,
        };
        self.write_context(sid, &entry)?;
        if self.config.cap.cm() {
            let descs = [
                InvDesc::ContextCache(CcGranularity::Device { did: 0, sid, fm: 0 }),
                InvDesc::Iotlb {
                    granularity: IotlbGranularity::Domain { did: domain.did },
                    drain_reads: false,
                    drain_writes: false,
                },
            ];
            self.qi_submit_sync(&descs, work)?;
        }
        Ok(())
    }

    /// Clears `sid`'s context entry and invalidates it: device-selective context-cache and
    /// domain-selective IOTLB invalidation, one wait (Linux `domain_context_clear_one`).
    pub fn detach(&self, sid: u16, work: &mut WorkRecord) -> Result<(), DmarError> {
        self.devtlbs.lock().remove(&sid);
        if self.is_scalable() {
            return self.detach_sm(sid, work);
        }
        let Some(old) = self.read_context(sid).filter(|c| c.present) else {
            return Ok(());
        };
        self.write_context(sid, &ContextEntry::default())?;
        let descs = [
            InvDesc::ContextCache(CcGranularity::Device {
                did: old.did,
                sid,
                fm: 0,
            }),
            InvDesc::Iotlb {
                granularity: IotlbGranularity::Domain { did: old.did },
                drain_reads: false,
                drain_writes: false,
            },
        ];
        self.qi_submit_sync(&descs, work)?;
        Ok(())
    }

    // -----------------------------------------------------------------------------------
    // Hardware side: translation.
    // -----------------------------------------------------------------------------------

    /// Looks up (or reads and caches) the legacy context of `sid`.
    fn context(&self, sid: u16, work: &mut WorkRecord) -> Result<CachedContext, (u8, bool)> {
        {
            let c = self.caches.lock();
            if let Some(ctx) = c.context.iter().find(|c| c.sid == sid).copied() {
                drop(c);
                self.stats.lock().context_hits += 1;
                return Ok(ctx);
            }
        }
        self.stats.lock().context_misses += 1;
        let (bus, devfn) = (u64::from(sid >> 8), u64::from(sid & 0xFF));
        let root_pa = self.root_table().get() + bus * spec::ROOT_ENTRY_BYTES;
        work.walk_reads += 1;
        let raw = [
            read_u64(self.memory(), root_pa),
            read_u64(self.memory(), root_pa + 8),
        ];
        let root = RootEntry::decode(raw).ok_or((reason::ROOT_RESERVED, false))?;
        if !root.present {
            return Err((reason::ROOT_NOT_PRESENT, false));
        }
        let at = root.context_table + devfn * spec::CONTEXT_ENTRY_BYTES;
        work.walk_reads += 1;
        let raw = [read_u64(self.memory(), at), read_u64(self.memory(), at + 8)];
        let ce = ContextEntry::decode(raw).ok_or((reason::CONTEXT_RESERVED, false))?;
        if !ce.present {
            return Err((reason::CONTEXT_NOT_PRESENT, false));
        }
        let levels = spec::levels_of_agaw(u32::from(ce.aw));
        let sagaw_ok = ce.aw <= 3 && self.config.cap.sagaw() & (1 << ce.aw) != 0;
        let tt_ok = match ce.tt {
            TranslationType::MultiLevel => true,
            TranslationType::MultiLevelDevTlb => self.config.ecap.dt(),
            TranslationType::PassThrough => self.config.ecap.pt(),
        };
        if !tt_ok || (ce.tt != TranslationType::PassThrough && !sagaw_ok) {
            return Err((reason::CONTEXT_INVALID, ce.fpd));
        }
        let ctx = CachedContext {
            sid,
            did: ce.did,
            fpd: ce.fpd,
            tt: ce.tt,
            root: ce.slptptr,
            levels,
            sm: None,
        };
        let mut c = self.caches.lock();
        if c.context_capacity > 0 {
            if c.context.len() >= c.context_capacity {
                c.context.pop_front();
            }
            c.context.push_back(ctx);
        }
        Ok(ctx)
    }

    /// Records a fault of a request without PASID (unless suppressed) and builds its error.
    fn fault(&self, reason: u8, sid: u16, addr: u64, access: Access, fpd: bool) -> DmarFault {
        self.fault_pasid(reason, sid, None, addr, access, fpd)
    }

    /// Records a fault (unless suppressed) and builds its error.
    pub(super) fn fault_pasid(
        &self,
        reason: u8,
        sid: u16,
        pasid: Option<u32>,
        addr: u64,
        access: Access,
        fpd: bool,
    ) -> DmarFault {
        let mut recorded = false;
        let mut dropped = false;
        if !fpd {
            let mut r = self.regs.lock();
            let i = r.next_record;
            if r.records[i].is_some() {
                r.fsts |= fsts::PFO;
                dropped = true;
            } else {
                r.records[i] = Some(FaultRecord {
                    addr,
                    sid,
                    reason,
                    pasid,
                    read: access == Access::Read,
                });
                r.next_record = (i + 1) % r.records.len();
                recorded = true;
            }
        }
        let mut s = self.stats.lock();
        s.faults += 1;
        s.faults_dropped += u64::from(dropped);
        DmarFault {
            reason,
            sid,
            addr,
            access,
            recorded,
            pasid,
        }
    }

    /// The unit translates a request without PASID from `sid` for `iova` (see the module
    /// docs). Counts `translations`, `iotlb_hits` / `iotlb_misses` / `iotlb_stale_hits` and
    /// `walk_reads` (context reads included). In scalable mode this is
    /// [`Dmar::translate_request`] with the context's RID_PASID.
    ///
    /// # Errors
    ///
    /// The fault the unit raises (and records unless FPD or overflow).
    pub fn translate(
        &self,
        sid: u16,
        iova: Iova,
        access: Access,
        work: &mut WorkRecord,
    ) -> Result<DmarTranslation, DmarFault> {
        if self.is_scalable() {
            return self.translate_request(&VtdRequest::new(sid, iova, access), work);
        }
        work.translations += 1;
        let addr = iova.get();
        let ctx = self
            .context(sid, work)
            .map_err(|(r, fpd)| self.fault(r, sid, addr, access, fpd))?;
        if ctx.tt == TranslationType::PassThrough {
            return Ok(DmarTranslation::passthrough(addr));
        }
        let fail = |r| Err(self.fault(r, sid, addr, access, ctx.fpd));
        if addr >> spec::width_of_levels(ctx.levels) != 0 {
            return fail(reason::BEYOND_MGAW);
        }
        let denied = match access {
            Access::Read => reason::PTE_NO_READ,
            Access::Write => reason::PTE_NO_WRITE,
        };
        let tag = Asid(u32::from(ctx.did));
        let mut caches = self.caches.lock();
        if let Some(hit) = caches.iotlb.lookup(tag, iova, work) {
            drop(caches);
            if !hit.prot.allows(access.prot()) {
                return fail(denied);
            }
            return Ok(DmarTranslation {
                pa: hit.pa,
                page_size: hit.page_size,
                iotlb_hit: true,
                stale: hit.stale,
                prot: hit.prot,
            });
        }
        let leaf =
            match self.walk_second(&mut caches, tag, (ctx.root, ctx.levels), addr, denied, work) {
                Ok(leaf) => leaf,
                Err(r) => {
                    drop(caches);
                    return fail(r);
                }
            };
        let ok = caches.iotlb.insert(
            tag,
            iova.align_down(leaf.size),
            PhysAddr::new(leaf.pa),
            leaf.size,
            leaf.prot,
        );
        debug_assert!(ok.is_ok());
        drop(caches);
        if !leaf.prot.allows(access.prot()) {
            return fail(denied);
        }
        Ok(DmarTranslation {
            pa: PhysAddr::new(leaf.pa + (addr & (leaf.size - 1))),
            page_size: leaf.size,
            iotlb_hit: false,
            stale: false,
            prot: leaf.prot,
        })
    }

    /// Whether the IOTLB holds an entry of `did` (any PASID in scalable mode) covering
    /// `iova` (stale or not, negative or not), without counting or touching replacement
    /// state.
    pub fn iotlb_probe(&self, did: u16, iova: Iova) -> Option<crate::iotlb::IotlbHit> {
        let c = self.caches.lock();
        c.tags_of(did, self.is_scalable())
            .into_iter()
            .find_map(|t| c.iotlb.probe(t, iova))
    }

    /// IOTLB entries marked stale (mapping removed, not yet invalidated).
    pub fn iotlb_stale(&self) -> usize {
        self.caches.lock().iotlb.count_stale()
    }

    /// IOTLB entries of `did` (every PASID in scalable mode).
    pub fn iotlb_count(&self, did: u16) -> usize {
        let c = self.caches.lock();
        c.tags_of(did, self.is_scalable())
            .into_iter()
            .map(|t| c.iotlb.count_asid(t))
            .sum()
    }

    /// Paging-structure-cache entries of `did` (every PASID in scalable mode).
    pub fn pscache_count(&self, did: u16) -> usize {
        let c = self.caches.lock();
        c.tags_of(did, self.is_scalable())
            .into_iter()
            .map(|t| c.walk.count_asid(t))
            .sum()
    }

    /// Context-cache entries.
    pub fn context_cache_len(&self) -> usize {
        self.caches.lock().context.len()
    }

    // -----------------------------------------------------------------------------------
    // Hardware side: the invalidation queue.
    // -----------------------------------------------------------------------------------

    /// The hardware consumes descriptors from IQH to IQT, in order, until the queue is
    /// empty or a descriptor does not decode (then FSTS.IQE, IQERCD.IQEI 3 or 4, IQH left at
    /// it). Nothing is fetched while IQE is set. Returns the descriptors completed.
    pub fn process_queue(&self) -> usize {
        let mut r = self.regs.lock();
        let size = self.config.qi_entries as u64 * 16;
        let mut done = 0;
        while r.fsts & fsts::IQE == 0 && r.iqh != r.iqt {
            let at = r.iqa_base + r.iqh;
            let raw = [read_u64(self.memory(), at), read_u64(self.memory(), at + 8)];
            match InvDesc::decode(raw) {
                Ok(desc) => {
                    self.apply(&desc, &mut r);
                    r.iqh = (r.iqh + 16) % size;
                    done += 1;
                }
                Err(e) => {
                    r.fsts |= fsts::IQE;
                    r.iqercd = spec::iqercd_encode(iqei::of(&e), 0, 0);
                    self.stats.lock().queue_errors += 1;
                }
            }
        }
        done
    }

    /// Carries out one descriptor. In scalable mode the IOTLB and paging-structure caches
    /// are tagged by (DID, PASID, stage): IOTLB descriptors (type 2) reach the
    /// second-stage and pass-through tags of their DID, PASID-based ones (type 6) the
    /// first-stage and nested tags of their DID and PASID.
    fn apply(&self, desc: &InvDesc, r: &mut Regs) {
        let mut stats = self.stats.lock();
        let mut c = self.caches.lock();
        let c = &mut *c;
        let scalable = self.is_scalable();
        let nonleaf = self.config.nonleaf_psi;
        // The tags a type-2 descriptor of `did` reaches.
        let ss_tags = |c: &Caches, did: u16| -> Vec<Asid> {
            if scalable {
                c.sm.tags_where(|t| t.did == did && !t.first_stage)
            } else {
                vec![Asid(u32::from(did))]
            }
        };
        // The tags a type-6 descriptor of `did` and `pasid` reaches.
        let fs_tags = |c: &Caches, did: u16, pasid: u32| -> Vec<Asid> {
            if scalable {
                c.sm.tags_where(|t| t.did == did && t.pasid == pasid && t.first_stage)
            } else {
                vec![Asid(u32::from(did))]
            }
        };
        let page = |c: &mut Caches,
                    stats: &mut DmarStats,
                    tags: Vec<Asid>,
                    (addr, am, ih): (u64, u8, bool)| {
            let (start, size) = psi_range(addr, am);
            stats.psi += 1;
            for t in tags {
                stats.iotlb_removed += c.iotlb.invalidate_range(t, Iova::new(start), size) as u64;
                if !ih {
                    stats.pscache_removed += match nonleaf {
                        NonLeafPsiScope::Domain => c.walk.invalidate_asid(t),
                        NonLeafPsiScope::Range => {
                            c.walk.invalidate_range(t, Iova::new(start), size)
                        }
                    } as u64;
                }
            }
        };
        let domain = |c: &mut Caches, stats: &mut DmarStats, tags: Vec<Asid>| {
            stats.dsi += 1;
            for t in tags {
                stats.iotlb_removed += c.iotlb.invalidate_asid(t) as u64;
                stats.pscache_removed += c.walk.invalidate_asid(t) as u64;
            }
        };
        match *desc {
            InvDesc::ContextCache(g) => {
                stats.descriptors[0] += 1;
                match g {
                    CcGranularity::Global => c.context.clear(),
                    // Scalable-mode context entries carry no DID: a domain-selective
                    // invalidation drops them all.
                    CcGranularity::Domain { did } => {
                        c.context.retain(|e| e.sm.is_none() && e.did != did)
                    }
                    CcGranularity::Device { sid, fm, .. } => {
                        // FM masks the top 0..3 bits of the function number (from
                        // memory, unverified).
                        let mask = !((((1u16 << fm) - 1) << (3 - fm)) & 0x7);
                        c.context.retain(|e| e.sid & mask != sid & mask);
                    }
                }
            }
            InvDesc::Iotlb { granularity, .. } => {
                stats.descriptors[1] += 1;
                match granularity {
                    IotlbGranularity::Global => {
                        stats.global += 1;
                        stats.iotlb_removed += c.iotlb.invalidate_all() as u64;
                        stats.pscache_removed += c.walk.invalidate_all() as u64;
                    }
                    IotlbGranularity::Domain { did } => {
                        let tags = ss_tags(c, did);
                        domain(c, &mut stats, tags)
                    }
                    IotlbGranularity::Page { did, addr, am, ih } => {
                        let tags = ss_tags(c, did);
                        page(c, &mut stats, tags, (addr, am, ih))
                    }
                }
            }
            InvDesc::DeviceTlb {
                sid, addr, size, ..
            } => {
                stats.descriptors[2] += 1;
                let (start, len) = spec::devtlb_range(addr, size);
                if let Some(atc) = self.devtlbs.lock().get_mut(&sid) {
                    stats.devtlb_removed += atc.invalidate(AtcSelect::NoPasid, start, len) as u64;
                }
            }
            InvDesc::Wait {
                interrupt,
                status_write,
                status_data,
                status_addr,
                ..
            } => {
                stats.descriptors[3] += 1;
                if status_write {
                    let ok = self
                        .memory()
                        .write(PhysAddr::new(status_addr), &status_data.to_le_bytes());
                    debug_assert!(ok.is_ok(), "status address outside memory");
                }
                if interrupt {
                    r.ics |= 1;
                }
            }
            InvDesc::PasidIotlb {
                did,
                pasid,
                granularity,
            } => {
                stats.descriptors[4] += 1;
                let tags = fs_tags(c, did, pasid);
                match granularity {
                    PasidIotlbGranularity::AllOfPasid => domain(c, &mut stats, tags),
                    PasidIotlbGranularity::Page { addr, am, ih } => {
                        page(c, &mut stats, tags, (addr, am, ih))
                    }
                }
            }
            InvDesc::PasidCache { did, granularity } => {
                stats.descriptors[5] += 1;
                stats.pasid_removed += c.sm.invalidate_pasid_cache(did, granularity) as u64;
            }
            InvDesc::PasidDeviceTlb {
                sid,
                pasid,
                global,
                addr,
                size,
                ..
            } => {
                stats.descriptors[6] += 1;
                let (start, len) = spec::devtlb_range(addr, size);
                if let Some(atc) = self.devtlbs.lock().get_mut(&sid) {
                    let which = if global {
                        AtcSelect::AnyPasid
                    } else {
                        AtcSelect::Pasid(pasid)
                    };
                    stats.devtlb_removed += atc.invalidate(which, start, len) as u64;
                }
            }
        }
    }
}

/// A translated domain on a [`Dmar`]: the DMA [`Domain`], its DID and table root, and its
/// invalidator.
pub struct DmarDomain {
    domain: Arc<Domain>,
    pub(super) did: u16,
    pub(super) root: PhysAddr,
    pub(super) agaw: u8,
    pub(super) stage: VtdStage,
    pub(super) levels: u32,
    /// First stage: the execute control its entries were written with (NXE follows it).
    pub(super) exec: FlExecControl,
    pub(super) invalidator: Arc<VtdInvalidator>,
    pub(super) unit: usize,
}

impl std::fmt::Debug for DmarDomain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DmarDomain")
            .field("did", &self.did)
            .field("root", &self.root)
            .finish_non_exhaustive()
    }
}

impl DmarDomain {
    /// The DMA domain.
    pub fn domain(&self) -> &Arc<Domain> {
        &self.domain
    }

    /// The domain id.
    pub fn did(&self) -> u16 {
        self.did
    }

    /// The DMA layer's id of the domain.
    pub fn id(&self) -> DomainId {
        self.domain.id()
    }

    /// The table's root (second-stage, or first-stage for a first-stage domain).
    pub fn root(&self) -> PhysAddr {
        self.root
    }

    /// The table's format.
    pub fn stage(&self) -> VtdStage {
        self.stage
    }

    /// The table's levels.
    pub fn levels(&self) -> u32 {
        self.levels
    }

    /// The invalidator.
    pub fn invalidator(&self) -> &Arc<VtdInvalidator> {
        &self.invalidator
    }

    /// What Linux's `iotlb_sync_map` does after a map: with Caching Mode, a page-selective
    /// invalidation of the mapped range and a wait; nothing otherwise (X86.md §1.7, §2.3).
    pub fn sync_map(&self, iova: Iova, size: u64, work: &mut WorkRecord) -> Result<(), QiError> {
        self.invalidator.sync_map(iova, size, work)
    }
}

/// The page table of a [`DmarDomain`]: a [`VtdPageTable`] that marks the unit's IOTLB
/// entries of a range stale when the range is unmapped (they keep translating until
/// invalidated, as in the SMMUv3 model).
struct DmarPageTable {
    table: VtdPageTable,
    caches: Arc<Mutex<Caches>>,
    did: u16,
    scalable: bool,
}

impl IoPageTable for DmarPageTable {
    fn format_name(&self) -> &'static str {
        self.table.format_name()
    }

    fn page_size_bitmap(&self) -> u64 {
        self.table.page_size_bitmap()
    }

    fn iova_range(&self) -> (Iova, Iova) {
        self.table.iova_range()
    }

    fn map(
        &mut self,
        iova: Iova,
        pa: PhysAddr,
        size: u64,
        prot: Prot,
        work: &mut WorkRecord,
    ) -> Result<(), PgTableError> {
        self.table.map(iova, pa, size, prot, work)
    }

    fn unmap(
        &mut self,
        iova: Iova,
        size: u64,
        gather: &mut UnmapGather,
        work: &mut WorkRecord,
    ) -> Result<(), PgTableError> {
        self.table.unmap(iova, size, gather, work)?;
        let mut c = self.caches.lock();
        for t in c.tags_of(self.did, self.scalable) {
            c.iotlb.mark_stale_range(t, iova, size);
        }
        Ok(())
    }

    fn translate(&self, iova: Iova, work: &mut WorkRecord) -> Option<Translation> {
        self.table.translate(iova, work)
    }

    fn table_pages(&self) -> usize {
        self.table.table_pages()
    }

    fn mapped_bytes(&self) -> u64 {
        self.table.mapped_bytes()
    }
}
