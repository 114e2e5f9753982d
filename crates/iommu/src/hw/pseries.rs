//! IBM POWER TCE windows under PowerVM, as Linux's `arch/powerpc/kernel/iommu.c` and
//! `arch/powerpc/platforms/pseries/iommu.c` drive them.
//!
//! A logical partition does not own its TCE tables: the hypervisor does, and the partition
//! changes them through hypercalls. [`Hcall`] names the three the DMA path uses:
//!
//! - `H_PUT_TCE`: one TCE (a mapping, or 0 to clear it);
//! - `H_PUT_TCE_INDIRECT`: up to 512 TCEs from one 4 KiB page of TCE values
//!   (`FW_FEATURE_PUT_TCE_IND`);
//! - `H_STUFF_TCE`: the same value (0, to clear) into up to 512 TCEs (`FW_FEATURE_STUFF_TCE`).
//!
//! Building TCEs (`tce_buildmulti_pSeriesLP`): one page, or no indirect capability, takes one
//! `H_PUT_TCE` per TCE; otherwise `ceil(n / 512)` `H_PUT_TCE_INDIRECT` calls. Clearing
//! (`tce_freemulti_pSeriesLP`): `ceil(n / 512)` `H_STUFF_TCE` calls, or without that capability
//! one `H_PUT_TCE(0)` per TCE (`tce_free_pSeriesLP`). Each hypercall is counted in the work
//! record (`hypercalls`, `tces_touched`) and by kind in [`PseriesStats`]. The hypervisor's
//! table is a real [`TceTable`], so every hypercall changes real state and the device side
//! translates through it. The hypervisor kills its TCE cache within the hypercall, so a
//! cleared TCE is unreachable when the call returns and its entry goes back to the allocator
//! right after (Linux's `__iommu_free` order).
//!
//! # Windows
//!
//! - The **default window** (configured offset, size and TCE page size, 4 KiB by default)
//!   allocates from a [`PowerPoolAllocator`] (4 pools and a large pool for windows of 1 GiB
//!   or more, each with its own lock, counted as [`LockId::TcePool`] /
//!   [`LockId::TceLargePool`]).
//! - A **dynamic DMA window** (DDW): [`PseriesIommu::query_pe_dma_window`],
//!   [`PseriesIommu::create_ddw`], [`PseriesIommu::remove_ddw`], and
//!   [`PseriesIommu::enable_ddw`] for Linux's decision (`enable_ddw`): take the largest TCE
//!   page the hypervisor offers; if the largest available block of TCEs maps all partition
//!   memory, create a window of `2^order_base_2(memory)` bytes used as a **direct** map
//!   (pre-mapped once at creation, counted separately; per-I/O mapping is `pa + window
//!   address`, no hypercall); otherwise, with [`DdwPolicy::DirectOrDynamic`] (the 2020
//!   change), create the largest power-of-two window the block allows and use it as a
//!   **dynamic** window: its own TCE table and pool allocator at the large page size, mapped
//!   and unmapped through hypercalls like the default window. With [`DdwPolicy::DirectOnly`]
//!   (before 2020) a DDW that cannot map everything is not created and the default window
//!   stays in use.
//!
//! Only devices with a 64-bit DMA mask use a DDW (Linux creates one when a driver asks for a
//! 64-bit mask); others keep the default window.
//!
//! # Scatter-gather
//!
//! `ppc_iommu_map_sg`: every element gets its own allocation and its own TCE build (so its
//! own hypercalls); an element is merged into the previous DMA segment when its DMA address
//! is exactly where the previous one ended (which needs the previous element to end on a TCE
//! page boundary and the allocator to place the next one right after it) and the segment
//! stays within the device's maximum segment size. Unmapping clears each DMA segment's TCEs
//! with one build of clear hypercalls, as `ppc_iommu_unmap_sg` does.

use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};

use parking_lot::{Mutex, RwLock};

use crate::addr::{Access, DmaAddr, Iova, PhysAddr, Prot, SZ_1G};
use crate::dma::{
    Device, Direction, DmaError, DmaFault, DmaSegment, DomainId, FaultReason, PhysRange,
    ProtectionCounters, ProtectionStats, Rejected, SgEntry,
};
use crate::iova::linux::IovaConfigError;
use crate::iova::power::{PowerPoolAllocator, PowerPoolConfig};
use crate::iova::{AllocRequest, IovaAllocator, IovaBlock};
use crate::pgtable::tce::{TceConfig, TceConfigError, TceTable};
use crate::pgtable::{IoPageTable, PgTableError, UnmapGather};
use crate::work::{LockId, WorkRecord};

use super::{
    check_buffer, check_sg, device_access, next_instance, same_instance, take_live_slot,
    wrong_owner, BufferToken, DmaPath, MappedBuffer, MappedSg, SgToken,
};

/// Most TCEs one `H_PUT_TCE_INDIRECT` or `H_STUFF_TCE` touches (one 4 KiB page of TCEs).
pub const TCE_BATCH: u64 = 512;
/// The default window size on older systems (2 GB per host bridge).
pub const DEFAULT_WINDOW_SIZE: u64 = 2 * SZ_1G;
/// Where PowerVM usually places a DDW.
pub const DEFAULT_DDW_ADDR: u64 = 0x0800_0000_0000_0000;

/// DDW page-size mask bits of `ibm,query-pe-dma-window` (LoPAR; Linux
/// `iommu_get_page_shift`): bit `i` set means the `i`-th size is supported.
pub mod ddw_page {
    /// 4 KiB.
    pub const PS_4K: u32 = 1 << 0;
    /// 64 KiB.
    pub const PS_64K: u32 = 1 << 1;
    /// 16 MiB.
    pub const PS_16M: u32 = 1 << 2;
    /// 32 MiB.
    pub const PS_32M: u32 = 1 << 3;
    /// 64 MiB.
    pub const PS_64M: u32 = 1 << 4;
    /// 128 MiB.
    pub const PS_128M: u32 = 1 << 5;
    /// 256 MiB.
    pub const PS_256M: u32 = 1 << 6;
    /// 16 GiB.
    pub const PS_16G: u32 = 1 << 7;
    /// 2 MiB (out of order, as in LoPAR).
    pub const PS_2M: u32 = 1 << 8;

    /// Page shift of each mask bit, in bit order.
    pub const SHIFTS: [u32; 9] = [12, 16, 24, 25, 26, 27, 28, 34, 21];

    /// The mask bit for a page shift, if LoPAR defines one.
    pub fn bit_for_shift(shift: u32) -> Option<u32> {
        SHIFTS.iter().position(|&s| s == shift).map(|i| 1 << i)
    }

    /// The largest page shift in `mask` (Linux `iommu_get_page_shift`), or `None`.
    pub fn largest_shift(mask: u32) -> Option<u32> {
        SHIFTS
            .iter()
            .enumerate()
            .filter(|(i, _)| mask & (1 << i) != 0)
            .map(|(_, &s)| s)
            .max()
    }
}

/// A hypercall the DMA path issues, with the TCEs it covers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Hcall {
    /// `H_PUT_TCE`: one TCE.
    PutTce,
    /// `H_PUT_TCE_INDIRECT`: `count` (1..=512) TCEs.
    PutTceIndirect {
        /// TCEs written.
        count: u16,
    },
    /// `H_STUFF_TCE`: `count` (1..=512) TCEs set to one value.
    StuffTce {
        /// TCEs written.
        count: u16,
    },
}

impl Hcall {
    /// TCEs the call touches.
    pub fn tces(self) -> u64 {
        match self {
            Hcall::PutTce => 1,
            Hcall::PutTceIndirect { count } | Hcall::StuffTce { count } => u64::from(count),
        }
    }
}

/// Which multi-TCE hypercalls the hypervisor offers (`FW_FEATURE_PUT_TCE_IND`,
/// `FW_FEATURE_STUFF_TCE`; together once called `FW_FEATURE_MULTITCE`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HcallFeatures {
    /// `H_PUT_TCE_INDIRECT` is available.
    pub put_tce_indirect: bool,
    /// `H_STUFF_TCE` is available.
    pub stuff_tce: bool,
}

impl HcallFeatures {
    /// Both multi-TCE calls (PowerVM today).
    pub const MULTI_TCE: Self = Self {
        put_tce_indirect: true,
        stuff_tce: true,
    };
    /// Only `H_PUT_TCE` (`multitce=off`).
    pub const SINGLE_TCE: Self = Self {
        put_tce_indirect: false,
        stuff_tce: false,
    };
}

/// A TCE window: bus offset, size and TCE page size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WindowConfig {
    /// Bus address of the window's first byte.
    pub offset: u64,
    /// Bytes.
    pub size: u64,
    /// log2 of the TCE page size (12, 16, 21 or 24).
    pub page_shift: u32,
}

/// Whether and how a DDW is used. See the module docs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DdwPolicy {
    /// Never create a DDW (`disable_ddw`): the default window only.
    Disabled,
    /// Only a DDW that maps all memory, as a direct map (before 2020); otherwise the default
    /// window.
    DirectOnly,
    /// A direct DDW when it maps all memory, else a dynamic one (since 2020).
    DirectOrDynamic,
}

/// What the hypervisor offers for a DDW (the answers of `ibm,query-pe-dma-window` and
/// where `ibm,create-pe-dma-window` places the window).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DdwConfig {
    /// Windows the PE may still create (usually 1).
    pub windows_available: u32,
    /// The largest block of TCEs the hypervisor can give the window.
    pub largest_available_block: u64,
    /// Supported TCE page sizes (bits of [`ddw_page`]).
    pub page_size_mask: u32,
    /// Bus address of a created window.
    pub window_addr: u64,
}

impl DdwConfig {
    /// One window of up to `size` bytes at the largest page in `page_size_mask`, at
    /// [`DEFAULT_DDW_ADDR`].
    pub fn with_window(size: u64, page_size_mask: u32) -> Self {
        let shift = ddw_page::largest_shift(page_size_mask).unwrap_or(12);
        Self {
            windows_available: 1,
            largest_available_block: size >> shift,
            page_size_mask,
            window_addr: DEFAULT_DDW_ADDR,
        }
    }
}

/// Configuration of a [`PseriesIommu`]: one partitionable endpoint.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PseriesConfig {
    /// The id reported in handles and errors.
    pub id: DomainId,
    /// Partition memory in bytes (its highest address + 1).
    pub memory_size: u64,
    /// The default window.
    pub default_window: WindowConfig,
    /// Multi-TCE hypercalls available.
    pub features: HcallFeatures,
    /// What the hypervisor offers for a DDW; `None`: no DDW support.
    pub ddw: Option<DdwConfig>,
    /// Whether and how to use a DDW.
    pub policy: DdwPolicy,
    /// Merge scatter-gather elements into one segment when their DMA addresses are
    /// contiguous (Linux's default; `iommu=novmerge` turns it off).
    pub vmerge: bool,
    /// Cap on live mappings (single buffers and scatter-gather lists).
    pub max_mappings: usize,
}

impl PseriesConfig {
    /// Default cap on live mappings.
    pub const DEFAULT_MAX_MAPPINGS: usize = 1 << 20;

    /// A partition with `memory_size` bytes, a 2 GB default window at 0 with 4 KiB TCEs,
    /// multi-TCE hypercalls, no DDW offered, the 2020 policy, merging on.
    pub fn new(id: DomainId, memory_size: u64) -> Self {
        Self {
            id,
            memory_size,
            default_window: WindowConfig {
                offset: 0,
                size: DEFAULT_WINDOW_SIZE,
                page_shift: 12,
            },
            features: HcallFeatures::MULTI_TCE,
            ddw: None,
            policy: DdwPolicy::DirectOrDynamic,
            vmerge: true,
            max_mappings: Self::DEFAULT_MAX_MAPPINGS,
        }
    }
}

/// Why a POWER IOMMU operation (setup or DDW management) failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PseriesError {
    /// A TCE table could not be built.
    #[error("Invalid TCE table for the window")]
    Table(#[from] TceConfigError),
    /// A pool allocator could not be built.
    #[error("Invalid TCE pool allocator for the window")]
    Pool(#[from] IovaConfigError),
    /// Memory size zero.
    #[error("The partition has no memory")]
    NoMemory,
    /// The mapping cap is zero.
    #[error("The mapping cap must be at least 1")]
    ZeroMappingCap,
    /// The hypervisor offers no DDW, or the policy disables it.
    #[error("Dynamic DMA windows are not available")]
    NoDdwSupport,
    /// No window left to create.
    #[error("No dynamic DMA window is available")]
    NoWindowAvailable,
    /// A DDW exists already.
    #[error("A dynamic DMA window already exists")]
    DdwExists,
    /// There is no DDW to remove.
    #[error("There is no dynamic DMA window")]
    NoDdw,
    /// A page shift the hypervisor does not offer (or the TCE table cannot hold).
    #[error("TCE page shift {shift} is not supported (page-size mask {mask:#x})")]
    UnsupportedPageShift {
        /// The shift asked for.
        shift: u32,
        /// The hypervisor's mask.
        mask: u32,
    },
    /// A window larger than the hypervisor's largest block.
    #[error("A window of 2^{window_shift} bytes needs more than the {available} TCEs available")]
    WindowTooLarge {
        /// log2 of the window size asked for.
        window_shift: u32,
        /// TCEs available.
        available: u64,
    },
    /// A window size that is not a power of two.
    #[error("DDW size {size:#x} is not a power of two")]
    BadWindowSize {
        /// The size asked for.
        size: u64,
    },
    /// The window would overflow the bus address space or overlap the default window.
    #[error("A DDW of {size:#x} bytes at {addr:#x} overflows or overlaps the default window")]
    BadWindowPlace {
        /// The window address.
        addr: u64,
        /// The window size.
        size: u64,
    },
    /// The window does not map all memory and the policy allows only direct windows.
    #[error("A window of 2^{window_shift} bytes cannot map all {memory:#x} bytes of memory")]
    NotDirect {
        /// log2 of the window size.
        window_shift: u32,
        /// Partition memory.
        memory: u64,
    },
    /// The DDW still has live mappings.
    #[error("The dynamic DMA window still has {live} live mappings")]
    DdwInUse {
        /// Live mappings in it.
        live: usize,
    },
}

/// How a created DDW is used.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DdwMode {
    /// Maps all memory at a fixed offset, pre-mapped once.
    Direct,
    /// A second TCE table at the large page size, mapped per I/O.
    Dynamic,
}

/// A created DDW.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DdwInfo {
    /// Direct or dynamic.
    pub mode: DdwMode,
    /// Bus address of the window.
    pub addr: u64,
    /// Window size in bytes.
    pub size: u64,
    /// log2 of its TCE page size.
    pub page_shift: u32,
}

/// The answer of [`PseriesIommu::query_pe_dma_window`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DdwQuery {
    /// Windows the PE may still create.
    pub windows_available: u32,
    /// The largest block of TCEs available.
    pub largest_available_block: u64,
    /// Supported TCE page sizes (bits of [`ddw_page`]).
    pub page_size_mask: u32,
}

/// Running totals of a [`PseriesIommu`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PseriesStats {
    /// Per-I/O `H_PUT_TCE` calls (mappings and clears).
    pub put_tce: u64,
    /// Per-I/O `H_PUT_TCE_INDIRECT` calls.
    pub put_tce_indirect: u64,
    /// Per-I/O `H_STUFF_TCE` calls.
    pub stuff_tce: u64,
    /// TCEs written by per-I/O mapping hypercalls.
    pub tces_put: u64,
    /// TCEs cleared by per-I/O hypercalls.
    pub tces_cleared: u64,
    /// Maps through a direct DDW (no hypercall).
    pub direct_maps: u64,
    /// Hypercalls of direct-window pre-mapping.
    pub premap_hypercalls: u64,
    /// TCEs written by direct-window pre-mapping.
    pub premap_tces: u64,
    /// Hypercalls clearing a window when it is removed.
    pub teardown_hypercalls: u64,
    /// TCEs cleared when a window is removed.
    pub teardown_tces: u64,
    /// DDWs created.
    pub ddw_created: u64,
    /// DDWs removed.
    pub ddw_removed: u64,
}

#[derive(Debug, Default)]
struct Totals {
    put_tce: AtomicU64,
    put_tce_indirect: AtomicU64,
    stuff_tce: AtomicU64,
    tces_put: AtomicU64,
    tces_cleared: AtomicU64,
    direct_maps: AtomicU64,
    premap_hypercalls: AtomicU64,
    premap_tces: AtomicU64,
    teardown_hypercalls: AtomicU64,
    teardown_tces: AtomicU64,
    ddw_created: AtomicU64,
    ddw_removed: AtomicU64,
}

impl Totals {
    /// Counts one per-I/O hypercall in `work` and by kind.
    fn hcall(&self, call: Hcall, clears: bool, work: &mut WorkRecord) {
        work.hypercalls += 1;
        work.tces_touched += call.tces();
        let kind = match call {
            Hcall::PutTce => &self.put_tce,
            Hcall::PutTceIndirect { .. } => &self.put_tce_indirect,
            Hcall::StuffTce { .. } => &self.stuff_tce,
        };
        kind.fetch_add(1, Ordering::Relaxed);
        let tces = if clears {
            &self.tces_cleared
        } else {
            &self.tces_put
        };
        tces.fetch_add(call.tces(), Ordering::Relaxed);
    }
}

/// A sequence of hypercalls as at most two runs of `(call, times)`: what building or
/// clearing `n` TCEs takes. No heap allocation (it sits on every map and unmap).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallPlan {
    runs: [(Hcall, u64); 2],
    len: usize,
}

impl CallPlan {
    fn one(call: Hcall, times: u64) -> Self {
        Self {
            runs: [(call, times), (call, 0)],
            len: usize::from(times > 0),
        }
    }

    /// `n` TCEs in calls of up to [`TCE_BATCH`].
    fn batched(n: u64, make: impl Fn(u16) -> Hcall) -> Self {
        let full = n / TCE_BATCH;
        let rest = n % TCE_BATCH;
        let mut plan = Self::one(make(TCE_BATCH as u16), 0);
        if full > 0 {
            plan.runs[plan.len] = (make(TCE_BATCH as u16), full);
            plan.len += 1;
        }
        if rest > 0 {
            plan.runs[plan.len] = (make(rest as u16), 1);
            plan.len += 1;
        }
        plan
    }

    /// The runs, in order: `times` calls of `call` each.
    pub fn runs(&self) -> &[(Hcall, u64)] {
        &self.runs[..self.len]
    }

    /// Total hypercalls.
    pub fn calls(&self) -> u64 {
        self.runs().iter().map(|&(_, times)| times).sum()
    }
}

/// The TCE permissions Linux writes for a mapping in direction `dir`: the powerpc IOMMU code
/// (`arch/powerpc/platforms/pseries/iommu.c`, `tce_build_pSeriesLP` and `tce_build_pSeries`;
/// PowerNV's `pnv_tce_build` the same) always sets `TCE_PCI_READ` and adds `TCE_PCI_WRITE`
/// unless the transfer is `DMA_TO_DEVICE`. So a receive buffer (`DMA_FROM_DEVICE`) is
/// readable by the device too, unlike dma-iommu's `dma_info_to_prot` (write only).
pub const fn tce_prot(dir: Direction) -> Prot {
    match dir {
        Direction::ToDevice => Prot::READ,
        Direction::FromDevice | Direction::Bidirectional => Prot::READ_WRITE,
    }
}

/// The calls that build `n` TCEs with `features` (`tce_buildmulti_pSeriesLP`): one
/// `H_PUT_TCE` per TCE for a single TCE or without the indirect call, else batches of up to
/// 512 `H_PUT_TCE_INDIRECT`.
pub fn build_calls(n: u64, features: HcallFeatures) -> CallPlan {
    if n == 1 || !features.put_tce_indirect {
        return CallPlan::one(Hcall::PutTce, n);
    }
    CallPlan::batched(n, |count| Hcall::PutTceIndirect { count })
}

/// The calls that clear `n` TCEs with `features` (`tce_freemulti_pSeriesLP`): batches of up
/// to 512 `H_STUFF_TCE`, or one `H_PUT_TCE(0)` per TCE without it.
pub fn clear_calls(n: u64, features: HcallFeatures) -> CallPlan {
    if !features.stuff_tce {
        return CallPlan::one(Hcall::PutTce, n);
    }
    CallPlan::batched(n, |count| Hcall::StuffTce { count })
}

/// The hypervisor interface of a partition: which calls exist, and where to count them.
#[derive(Clone, Copy)]
struct Hv<'a> {
    features: HcallFeatures,
    totals: &'a Totals,
}

/// Which window a mapping lives in: 0 is the default window, a DDW has its creation number
/// (kept small so single-buffer handles stay small).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct WindowId(u32);

impl WindowId {
    const DEFAULT: WindowId = WindowId(0);
}

/// One TCE-mapped allocation, compactly: first IOVA, TCE count, window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct TceMap {
    start: u64,
    pages: u32,
    window: WindowId,
}

impl TceMap {
    fn new(window: WindowId, block: IovaBlock) -> Self {
        debug_assert!(block.pages <= u64::from(u32::MAX));
        Self {
            start: block.start.get(),
            pages: block.pages as u32,
            window,
        }
    }

    fn block(&self) -> IovaBlock {
        IovaBlock {
            start: Iova::new(self.start),
            pages: u64::from(self.pages),
        }
    }
}

/// The POWER part of a [`MappedBuffer`].
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct PseriesSingle {
    instance: u64,
    /// `None`: through a direct DDW.
    map: Option<TceMap>,
}

/// The POWER part of a [`MappedSg`].
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct PseriesSg {
    instance: u64,
    pub(super) segments: Vec<DmaSegment>,
    /// One per element; empty through a direct DDW.
    maps: Vec<TceMap>,
    /// Elements per segment (for the per-segment clears); empty through a direct DDW.
    per_segment: Vec<usize>,
}

/// A TCE-mapped window: the hypervisor's table and the partition's pool allocator.
#[derive(Debug)]
struct TceWindow {
    id: WindowId,
    offset: u64,
    size: u64,
    page_shift: u32,
    table: Mutex<TceTable>,
    pool: PowerPoolAllocator,
    live: AtomicUsize,
}

impl TceWindow {
    fn new(id: WindowId, w: WindowConfig) -> Result<Self, PseriesError> {
        let table = TceTable::new(TceConfig::new(w.offset, w.size, w.page_shift))?;
        let pool = PowerPoolAllocator::new(PowerPoolConfig::new(
            Iova::new(w.offset),
            w.size,
            1 << w.page_shift,
        ))?;
        Ok(Self {
            id,
            offset: w.offset,
            size: w.size,
            page_shift: w.page_shift,
            table: Mutex::new(table),
            pool,
            live: AtomicUsize::new(0),
        })
    }

    fn page(&self) -> u64 {
        1 << self.page_shift
    }

    fn contains(&self, dma: u64) -> bool {
        dma >= self.offset && dma - self.offset < self.size
    }

    /// TCE pages `len` bytes at `pa` span (Linux `iommu_num_pages`).
    fn npages(&self, pa: u64, len: u64) -> u64 {
        ((pa & (self.page() - 1)) + len).div_ceil(self.page())
    }

    /// Allocates `npages` TCEs below what `dev` reaches. The limit is the device's mask, not
    /// capped at the window's end: Linux's `iommu_range_alloc` compares each pool's end with
    /// the mask (`dma_get_mask(dev) >> it_page_shift`), so a device that reaches past the
    /// window is not address-constrained, and its retries stay in the pools.
    fn alloc(
        &self,
        dev: &Device,
        npages: u64,
        cpu: usize,
        work: &mut WorkRecord,
    ) -> Result<IovaBlock, DmaError> {
        let limit = dev.dma_mask().saturating_add(1);
        let req = AllocRequest {
            pages: npages,
            limit: Iova::new(limit),
            size_aligned: false,
            cpu,
        };
        self.pool.alloc(req, work).map_err(|source| match source {
            crate::iova::IovaError::LimitTooLow { start, .. } => DmaError::MaskTooSmall {
                device: dev.id(),
                mask_bits: dev.mask_bits(),
                addr: start,
            },
            source => DmaError::IovaSpace {
                pages: npages,
                limit,
                source,
            },
        })
    }

    /// Builds `n` TCEs at `iova` for the pages from `pa` (page-aligned) through hypercalls.
    /// A call the hypervisor refuses (a real address it cannot hold) is still a call; the
    /// TCEs built before it are cleared again, as `tce_buildmulti_pSeriesLP` does on error.
    fn build(
        &self,
        iova: u64,
        pa: u64,
        n: u64,
        prot: Prot,
        hv: Hv<'_>,
        work: &mut WorkRecord,
    ) -> Result<(), PgTableError> {
        let page = self.page();
        let mut table = self.table.lock();
        let mut done = 0;
        for &(call, times) in build_calls(n, hv.features).runs() {
            for _ in 0..times {
                let k = call.tces();
                let at = done * page;
                let put = table.map(
                    Iova::new(iova + at),
                    PhysAddr::new(pa + at),
                    k * page,
                    prot,
                    work,
                );
                hv.totals.hcall(call, false, work);
                if let Err(e) = put {
                    if done > 0 {
                        Self::clear_in(&mut table, iova, done, page, hv, work);
                    }
                    return Err(e);
                }
                done += k;
            }
        }
        Ok(())
    }

    /// Clears `n` TCEs at `iova` through hypercalls.
    fn clear(&self, iova: u64, n: u64, hv: Hv<'_>, work: &mut WorkRecord) {
        let mut table = self.table.lock();
        Self::clear_in(&mut table, iova, n, self.page(), hv, work);
    }

    fn clear_in(
        table: &mut TceTable,
        iova: u64,
        n: u64,
        page: u64,
        hv: Hv<'_>,
        work: &mut WorkRecord,
    ) {
        let mut gather = UnmapGather::new();
        let mut done = 0;
        for &(call, times) in clear_calls(n, hv.features).runs() {
            for _ in 0..times {
                let k = call.tces();
                let cleared =
                    table.unmap(Iova::new(iova + done * page), k * page, &mut gather, work);
                debug_assert!(cleared.is_ok(), "clearing built TCEs failed: {cleared:?}");
                gather.clear();
                hv.totals.hcall(call, true, work);
                done += k;
            }
        }
    }

    /// Maps one buffer: allocate, build. Returns the block and the DMA address.
    #[allow(clippy::too_many_arguments)]
    fn map(
        &self,
        dev: &Device,
        pa: u64,
        len: u64,
        prot: Prot,
        hv: Hv<'_>,
        cpu: usize,
        work: &mut WorkRecord,
    ) -> Result<(IovaBlock, u64), DmaError> {
        let n = self.npages(pa, len);
        let block = self.alloc(dev, n, cpu, work)?;
        let page_pa = pa & !(self.page() - 1);
        if let Err(source) = self.build(block.start.get(), page_pa, n, prot, hv, work) {
            let freed = self.pool.free(block, cpu, work);
            debug_assert!(freed.is_ok());
            return Err(DmaError::PageTable {
                iova: block.start.get(),
                len: n << self.page_shift,
                source,
            });
        }
        self.live.fetch_add(1, Ordering::Relaxed);
        Ok((block, block.start.get() + (pa & (self.page() - 1))))
    }

    /// Clears and frees one block (`iommu_free`: TCEs first, then the bitmap).
    fn unmap(&self, block: IovaBlock, hv: Hv<'_>, cpu: usize, work: &mut WorkRecord) {
        self.clear(block.start.get(), block.pages, hv, work);
        self.free_block(block, cpu, work);
    }

    fn free_block(&self, block: IovaBlock, cpu: usize, work: &mut WorkRecord) {
        let freed = self.pool.free(block, cpu, work);
        debug_assert!(freed.is_ok(), "freeing a mapped block failed: {freed:?}");
        self.live.fetch_sub(1, Ordering::Relaxed);
    }

    /// Walks the table for `[dma, dma + len)` (inside the window).
    fn walk(
        &self,
        dev: &Device,
        dma: u64,
        len: u64,
        access: Access,
        work: &mut WorkRecord,
    ) -> Result<Vec<PhysRange>, DmaFault> {
        let fault = |at: u64, reason| DmaFault {
            device: dev.id(),
            dma: DmaAddr(at),
            access,
            reason,
        };
        let page = self.page();
        let table = self.table.lock();
        let mut out = Vec::new();
        let mut cur = dma;
        let end = dma + len;
        while cur < end {
            work.translations += 1;
            let t = table
                .translate(Iova::new(cur), work)
                .ok_or(fault(cur, FaultReason::Unmapped))?;
            if !t.prot.allows(access.prot()) {
                let reason = FaultReason::Permission {
                    needed: access.prot(),
                    had: t.prot,
                };
                return Err(fault(cur, reason));
            }
            let chunk = (end - cur).min(page - (cur & (page - 1)));
            PhysRange::append_to(&mut out, t.pa, chunk);
            cur += chunk;
        }
        Ok(out)
    }
}

/// A created DDW.
#[derive(Debug)]
enum Ddw {
    Direct {
        info: DdwInfo,
    },
    Dynamic {
        info: DdwInfo,
        window: Box<TceWindow>,
    },
}

impl Ddw {
    fn info(&self) -> DdwInfo {
        match self {
            Ddw::Direct { info, .. } | Ddw::Dynamic { info, .. } => *info,
        }
    }
}

/// Where a device's mapping goes.
enum Route<'a> {
    Window(&'a TceWindow),
    Direct { addr: u64 },
}

/// One POWER partitionable endpoint's DMA: default window, hypercalls, and a DDW.
/// Thread-safe. See the module docs.
#[derive(Debug)]
pub struct PseriesIommu {
    cfg: PseriesConfig,
    instance: u64,
    default: TceWindow,
    ddw: RwLock<Option<Ddw>>,
    /// Creation number of the next DDW (wraps, skipping 0, after 2^32 - 1 creations).
    ddw_number: AtomicU32,
    /// Live direct-DDW mappings (the windows count their own).
    direct_live: AtomicUsize,
    live: AtomicUsize,
    totals: Totals,
    /// Bypasses and faults of device accesses (see [`crate::dma::protection`]).
    protection: ProtectionCounters,
}

impl PseriesIommu {
    /// Builds the default window (its hypervisor table and pool allocator). No DDW exists
    /// until [`PseriesIommu::enable_ddw`] or [`PseriesIommu::create_ddw`].
    pub fn new(cfg: PseriesConfig) -> Result<Self, PseriesError> {
        if cfg.memory_size == 0 {
            return Err(PseriesError::NoMemory);
        }
        if cfg.max_mappings == 0 {
            return Err(PseriesError::ZeroMappingCap);
        }
        let default = TceWindow::new(WindowId::DEFAULT, cfg.default_window)?;
        Ok(Self {
            cfg,
            instance: next_instance(),
            default,
            ddw: RwLock::new(None),
            ddw_number: AtomicU32::new(1),
            direct_live: AtomicUsize::new(0),
            live: AtomicUsize::new(0),
            totals: Totals::default(),
            protection: ProtectionCounters::new(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &PseriesConfig {
        &self.cfg
    }

    /// The id reported in handles and errors.
    pub fn id(&self) -> DomainId {
        self.cfg.id
    }
    /// What this IOMMU has left devices able to reach: bypassed accesses (an SBA bypass, a
    /// direct DDW) and refused ones (translation and permission faults), and the sub-page
    /// exposure of single buffers mapped through a TCE window. TCE updates are synchronous
    /// hypercalls, so there is no stale window: the stale fields stay 0.
    pub fn protection(&self) -> ProtectionStats {
        self.protection.snapshot()
    }

    /// Totals since creation.
    pub fn stats(&self) -> PseriesStats {
        let t = &self.totals;
        let l = |a: &AtomicU64| a.load(Ordering::Relaxed);
        PseriesStats {
            put_tce: l(&t.put_tce),
            put_tce_indirect: l(&t.put_tce_indirect),
            stuff_tce: l(&t.stuff_tce),
            tces_put: l(&t.tces_put),
            tces_cleared: l(&t.tces_cleared),
            direct_maps: l(&t.direct_maps),
            premap_hypercalls: l(&t.premap_hypercalls),
            premap_tces: l(&t.premap_tces),
            teardown_hypercalls: l(&t.teardown_hypercalls),
            teardown_tces: l(&t.teardown_tces),
            ddw_created: l(&t.ddw_created),
            ddw_removed: l(&t.ddw_removed),
        }
    }

    /// Live mappings (single buffers and scatter-gather lists).
    pub fn live_mappings(&self) -> usize {
        self.live.load(Ordering::Relaxed)
    }

    /// The default window's pool allocator (for inspection).
    pub fn default_pool(&self) -> &PowerPoolAllocator {
        &self.default.pool
    }

    /// Bytes the default window's table maps now.
    pub fn default_mapped_bytes(&self) -> u64 {
        self.default.table.lock().mapped_bytes()
    }

    /// Runs `f` on the pool allocator of the window `dev` maps through (the dynamic DDW's
    /// for a 64-bit device when one exists, else the default window's), with the window's
    /// bus offset and TCE page shift; `None` through a direct DDW (no allocator). For
    /// callers that model the pool locks themselves (which pool a CPU hashes to, which pool
    /// holds a block).
    pub fn with_window_pool<R>(
        &self,
        dev: &Device,
        f: impl FnOnce(&PowerPoolAllocator, u64, u32) -> R,
    ) -> Option<R> {
        let ddw = self.ddw.read();
        match self.route(&ddw, dev) {
            Route::Window(w) => Some(f(&w.pool, w.offset, w.page_shift)),
            Route::Direct { .. } => None,
        }
    }

    /// The DDW, if one exists.
    pub fn ddw(&self) -> Option<DdwInfo> {
        self.ddw.read().as_ref().map(Ddw::info)
    }

    fn ddw_config(&self) -> Result<DdwConfig, PseriesError> {
        match (self.cfg.ddw, self.cfg.policy) {
            (Some(d), DdwPolicy::DirectOnly | DdwPolicy::DirectOrDynamic) => Ok(d),
            _ => Err(PseriesError::NoDdwSupport),
        }
    }

    /// `ibm,query-pe-dma-window`: windows left, largest TCE block, page-size mask.
    pub fn query_pe_dma_window(&self) -> Result<DdwQuery, PseriesError> {
        let d = self.ddw_config()?;
        let used = u32::from(self.ddw.read().is_some());
        Ok(DdwQuery {
            windows_available: d.windows_available.saturating_sub(used),
            largest_available_block: d.largest_available_block,
            page_size_mask: d.page_size_mask,
        })
    }

    /// log2 of the smallest power of two holding all memory (Linux `max_ram_len`).
    fn max_ram_len(&self) -> u32 {
        64 - (self.cfg.memory_size - 1).leading_zeros()
    }

    /// `ibm,create-pe-dma-window` with TCE pages of `2^page_shift` bytes and a window of
    /// `window_size` bytes (a power of two), then its setup: a direct map when the window
    /// holds all memory (pre-mapped now, counted in `work` and
    /// [`PseriesStats::premap_hypercalls`]), else a dynamic window if the policy allows it.
    pub fn create_ddw(
        &self,
        page_shift: u32,
        window_size: u64,
        work: &mut WorkRecord,
    ) -> Result<DdwInfo, PseriesError> {
        let d = self.ddw_config()?;
        if !window_size.is_power_of_two() {
            return Err(PseriesError::BadWindowSize { size: window_size });
        }
        let window_shift = window_size.trailing_zeros();
        let mut slot = self.ddw.write();
        if slot.is_some() {
            return Err(PseriesError::DdwExists);
        }
        if d.windows_available == 0 {
            return Err(PseriesError::NoWindowAvailable);
        }
        let unsupported = PseriesError::UnsupportedPageShift {
            shift: page_shift,
            mask: d.page_size_mask,
        };
        match ddw_page::bit_for_shift(page_shift) {
            Some(bit) if d.page_size_mask & bit != 0 => {}
            _ => return Err(unsupported),
        }
        if window_shift < page_shift || window_shift >= 64 {
            return Err(PseriesError::WindowTooLarge {
                window_shift,
                available: d.largest_available_block,
            });
        }
        if 1u64 << (window_shift - page_shift) > d.largest_available_block {
            return Err(PseriesError::WindowTooLarge {
                window_shift,
                available: d.largest_available_block,
            });
        }
        let size = window_size;
        let overlaps_default = d.window_addr < self.default.offset + self.default.size
            && self.default.offset < d.window_addr.saturating_add(size);
        if d.window_addr.checked_add(size).is_none() || overlaps_default {
            return Err(PseriesError::BadWindowPlace {
                addr: d.window_addr,
                size,
            });
        }
        let number = match self.ddw_number.fetch_add(1, Ordering::Relaxed) {
            0 => self.ddw_number.fetch_add(1, Ordering::Relaxed),
            n => n,
        };
        let direct = window_shift >= self.max_ram_len();
        let ddw = if direct {
            let info = DdwInfo {
                mode: DdwMode::Direct,
                addr: d.window_addr,
                size,
                page_shift,
            };
            self.premap(page_shift, work);
            Ddw::Direct { info }
        } else if self.cfg.policy == DdwPolicy::DirectOrDynamic {
            let window = TceWindow::new(
                WindowId(number),
                WindowConfig {
                    offset: d.window_addr,
                    size,
                    page_shift,
                },
            )
            .map_err(|e| match e {
                PseriesError::Table(TceConfigError::UnsupportedPageSize { .. }) => unsupported,
                e => e,
            })?;
            let info = DdwInfo {
                mode: DdwMode::Dynamic,
                addr: d.window_addr,
                size,
                page_shift,
            };
            Ddw::Dynamic {
                info,
                window: Box::new(window),
            }
        } else {
            return Err(PseriesError::NotDirect {
                window_shift,
                memory: self.cfg.memory_size,
            });
        };
        let info = ddw.info();
        *slot = Some(ddw);
        self.totals.ddw_created.fetch_add(1, Ordering::Relaxed);
        Ok(info)
    }

    /// Linux's `enable_ddw`: query, pick the largest page, and create a direct window if the
    /// block maps all memory, else (policy permitting) the largest dynamic window the block
    /// allows. `Ok(None)`: no DDW (not offered, disabled, or too small for the policy); the
    /// default window stays in use. An existing DDW is returned as it is.
    pub fn enable_ddw(&self, work: &mut WorkRecord) -> Result<Option<DdwInfo>, PseriesError> {
        if let Some(info) = self.ddw() {
            return Ok(Some(info));
        }
        let Ok(q) = self.query_pe_dma_window() else {
            return Ok(None);
        };
        if q.windows_available == 0 {
            return Ok(None);
        }
        let Some(page_shift) = ddw_page::largest_shift(q.page_size_mask) else {
            return Ok(None);
        };
        let len = self.max_ram_len().max(page_shift);
        let covers =
            len - page_shift < 64 && q.largest_available_block >= 1u64 << (len - page_shift);
        let window_shift = if covers {
            len
        } else if self.cfg.policy == DdwPolicy::DirectOrDynamic {
            let tces = q.largest_available_block;
            if tces == 0 {
                return Ok(None);
            }
            // The largest power-of-two window the block holds. Linux takes
            // `order_base_2(block << page_shift)`, which rounds up and only equals this when
            // the hypervisor offers a power-of-two block (as it does); rounding down never
            // asks for more TCEs than offered.
            (63 - tces.leading_zeros()) + page_shift
        } else {
            return Ok(None);
        };
        self.create_ddw(page_shift, 1u64 << window_shift, work)
            .map(Some)
    }

    /// Pre-maps all memory into a direct window: `tce_setrange_multi_pSeriesLP` over one
    /// memory range from 0.
    fn premap(&self, page_shift: u32, work: &mut WorkRecord) {
        let tces = self.cfg.memory_size.div_ceil(1 << page_shift);
        let calls = build_calls(tces, self.cfg.features).calls();
        work.hypercalls += calls;
        work.tces_touched += tces;
        self.totals
            .premap_hypercalls
            .fetch_add(calls, Ordering::Relaxed);
        self.totals.premap_tces.fetch_add(tces, Ordering::Relaxed);
    }

    /// `remove_ddw`: clears the whole window (`clean_dma_window`: `H_STUFF_TCE` in batches
    /// of 512, counted in `work` and [`PseriesStats::teardown_hypercalls`]) and removes it.
    /// Refused while the window has live mappings.
    pub fn remove_ddw(&self, work: &mut WorkRecord) -> Result<(), PseriesError> {
        let mut slot = self.ddw.write();
        let live = match slot.as_ref() {
            None => return Err(PseriesError::NoDdw),
            Some(Ddw::Direct { .. }) => self.direct_live.load(Ordering::Relaxed),
            Some(Ddw::Dynamic { window, .. }) => window.live.load(Ordering::Relaxed),
        };
        if live > 0 {
            return Err(PseriesError::DdwInUse { live });
        }
        let info = slot.as_ref().map(Ddw::info).ok_or(PseriesError::NoDdw)?;
        let tces = info.size >> info.page_shift;
        let calls = tces.div_ceil(TCE_BATCH);
        work.hypercalls += calls;
        work.tces_touched += tces;
        self.totals
            .teardown_hypercalls
            .fetch_add(calls, Ordering::Relaxed);
        self.totals.teardown_tces.fetch_add(tces, Ordering::Relaxed);
        self.totals.ddw_removed.fetch_add(1, Ordering::Relaxed);
        *slot = None;
        Ok(())
    }

    fn hv(&self) -> Hv<'_> {
        Hv {
            features: self.cfg.features,
            totals: &self.totals,
        }
    }

    fn take_slot(&self) -> Result<(), DmaError> {
        take_live_slot(&self.live, self.cfg.max_mappings, self.cfg.id)
    }

    fn release_slot(&self) {
        self.live.fetch_sub(1, Ordering::Relaxed);
    }

    /// The window a device maps through: a DDW for 64-bit devices, else the default.
    fn route<'a>(&'a self, ddw: &'a Option<Ddw>, dev: &Device) -> Route<'a> {
        match ddw {
            Some(Ddw::Direct { info }) if dev.mask_bits() == 64 => {
                Route::Direct { addr: info.addr }
            }
            Some(Ddw::Dynamic { window, .. }) if dev.mask_bits() == 64 => Route::Window(window),
            _ => Route::Window(&self.default),
        }
    }

    /// The window a mapping was made in, if it still exists.
    fn window<'a>(&'a self, ddw: &'a Option<Ddw>, id: WindowId) -> Option<&'a TceWindow> {
        match (id, ddw) {
            (WindowId::DEFAULT, _) => Some(&self.default),
            (n, Some(Ddw::Dynamic { window, .. })) if window.id == n => Some(window),
            _ => None,
        }
    }

    fn check_direct(&self, pa: u64, len: u64) -> Result<(), DmaError> {
        if pa + len > self.cfg.memory_size {
            return Err(DmaError::BadBuffer { pa, len });
        }
        Ok(())
    }

    fn check_instance(&self, instance: u64, owner: DomainId) -> Result<(), DmaError> {
        same_instance(instance, self.instance, owner, self.cfg.id)
    }

    /// Undoes element maps `maps` (grouped by `per_segment`), clearing each segment's TCEs
    /// with one run of clear hypercalls.
    fn unmap_elements(
        &self,
        ddw: &Option<Ddw>,
        maps: &[TceMap],
        per_segment: &[usize],
        cpu: usize,
        work: &mut WorkRecord,
    ) {
        let mut i = 0;
        for &n in per_segment {
            let group = &maps[i..i + n];
            i += n;
            let Some(first) = group.first() else { continue };
            let Some(w) = self.window(ddw, first.window) else {
                debug_assert!(false, "a live mapping's window is gone");
                continue;
            };
            let tces: u64 = group.iter().map(|m| u64::from(m.pages)).sum();
            w.clear(first.start, tces, self.hv(), work);
            for m in group {
                w.free_block(m.block(), cpu, work);
            }
        }
    }
}

impl DmaPath for PseriesIommu {
    fn platform(&self) -> &'static str {
        "pseries"
    }

    fn map_single(
        &self,
        dev: &Device,
        pa: PhysAddr,
        len: u64,
        dir: Direction,
        cpu: usize,
        work: &mut WorkRecord,
    ) -> Result<MappedBuffer, DmaError> {
        check_buffer(pa, len)?;
        let ddw = self.ddw.read();
        let handle = |dma: u64, map: Option<TceMap>| MappedBuffer {
            dma: DmaAddr(dma),
            len,
            dir,
            owner: self.cfg.id,
            untranslated: map.is_none(),
            token: BufferToken::Pseries(PseriesSingle {
                instance: self.instance,
                map,
            }),
        };
        match self.route(&ddw, dev) {
            Route::Direct { addr, .. } => {
                self.check_direct(pa.get(), len)?;
                self.take_slot()?;
                self.direct_live.fetch_add(1, Ordering::Relaxed);
                self.totals.direct_maps.fetch_add(1, Ordering::Relaxed);
                Ok(handle(addr + pa.get(), None))
            }
            Route::Window(w) => {
                self.take_slot()?;
                let prot = tce_prot(dir);
                match w.map(dev, pa.get(), len, prot, self.hv(), cpu, work) {
                    Ok((block, dma)) => {
                        let page = 1u64 << w.page_shift;
                        let first = pa.get() & !(page - 1);
                        let end = (pa.get() + len).div_ceil(page) * page;
                        self.protection.record_mapping(len, end - first);
                        Ok(handle(dma, Some(TceMap::new(w.id, block))))
                    }
                    Err(e) => {
                        self.release_slot();
                        Err(e)
                    }
                }
            }
        }
    }

    fn unmap_single(
        &self,
        buf: MappedBuffer,
        cpu: usize,
        now_ns: u64,
        work: &mut WorkRecord,
    ) -> Result<(), Rejected<MappedBuffer>> {
        let _ = now_ns;
        let ddw = self.ddw.read();
        let map = match &buf.token {
            BufferToken::Pseries(p) => self.check_instance(p.instance, buf.owner).map(|()| p.map),
            _ => Err(wrong_owner(buf.owner, self.cfg.id)),
        };
        let map = match map {
            Ok(m) => m,
            Err(error) => return Err(Rejected { handle: buf, error }),
        };
        match map {
            None => {
                self.direct_live.fetch_sub(1, Ordering::Relaxed);
            }
            Some(m) => {
                let Some(w) = self.window(&ddw, m.window) else {
                    let error = DmaError::NotMapped {
                        domain: self.cfg.id,
                        dma: buf.dma.0,
                    };
                    return Err(Rejected { handle: buf, error });
                };
                w.unmap(m.block(), self.hv(), cpu, work);
            }
        }
        self.release_slot();
        Ok(())
    }

    fn map_sg(
        &self,
        dev: &Device,
        entries: &[SgEntry],
        dir: Direction,
        cpu: usize,
        work: &mut WorkRecord,
    ) -> Result<MappedSg, DmaError> {
        check_sg(entries)?;
        let ddw = self.ddw.read();
        let handle = |segments, maps, per_segment| MappedSg {
            nents: entries.len(),
            dir,
            owner: self.cfg.id,
            token: SgToken::Pseries(Box::new(PseriesSg {
                instance: self.instance,
                segments,
                maps,
                per_segment,
            })),
        };
        let w = match self.route(&ddw, dev) {
            Route::Direct { addr } => {
                for e in entries {
                    self.check_direct(e.pa.get(), e.len)?;
                }
                self.take_slot()?;
                self.direct_live.fetch_add(1, Ordering::Relaxed);
                self.totals.direct_maps.fetch_add(1, Ordering::Relaxed);
                // dma-direct with an offset: one segment per element.
                let segments = entries
                    .iter()
                    .map(|e| DmaSegment {
                        dma: DmaAddr(addr + e.pa.get()),
                        len: e.len,
                    })
                    .collect();
                return Ok(handle(segments, Vec::new(), Vec::new()));
            }
            Route::Window(w) => w,
        };
        self.take_slot()?;
        let max_seg = dev.max_segment_size();
        let prot = tce_prot(dir);
        let mut maps: Vec<TceMap> = Vec::with_capacity(entries.len());
        let mut segments: Vec<DmaSegment> = Vec::new();
        let mut per_segment: Vec<usize> = Vec::new();
        let mut dma_next = None;
        for e in entries {
            let mapped = w.map(dev, e.pa.get(), e.len, prot, self.hv(), cpu, work);
            let (block, dma) = match mapped {
                Ok(ok) => ok,
                Err(err) => {
                    self.unmap_elements(&ddw, &maps, &per_segment, cpu, work);
                    self.release_slot();
                    return Err(err);
                }
            };
            maps.push(TceMap::new(w.id, block));
            let merge = self.cfg.vmerge
                && dma_next == Some(dma)
                && segments
                    .last()
                    .is_some_and(|s| s.len.checked_add(e.len).is_some_and(|n| n <= max_seg));
            match (merge, segments.last_mut(), per_segment.last_mut()) {
                (true, Some(seg), Some(n)) => {
                    seg.len += e.len;
                    *n += 1;
                }
                _ => {
                    segments.push(DmaSegment {
                        dma: DmaAddr(dma),
                        len: e.len,
                    });
                    per_segment.push(1);
                }
            }
            dma_next = Some(dma + e.len);
        }
        Ok(handle(segments, maps, per_segment))
    }

    fn unmap_sg(
        &self,
        sg: MappedSg,
        cpu: usize,
        now_ns: u64,
        work: &mut WorkRecord,
    ) -> Result<(), Rejected<MappedSg>> {
        let _ = now_ns;
        let ddw = self.ddw.read();
        let check = match &sg.token {
            SgToken::Pseries(p) => self.check_instance(p.instance, sg.owner),
            _ => Err(wrong_owner(sg.owner, self.cfg.id)),
        };
        if let Err(error) = check {
            return Err(Rejected { handle: sg, error });
        }
        if let SgToken::Pseries(p) = &sg.token {
            if p.maps.is_empty() {
                self.direct_live.fetch_sub(1, Ordering::Relaxed);
            } else {
                let gone = p.maps.iter().any(|m| self.window(&ddw, m.window).is_none());
                if gone {
                    let error = DmaError::NotMapped {
                        domain: self.cfg.id,
                        dma: p.segments[0].dma.0,
                    };
                    return Err(Rejected { handle: sg, error });
                }
                self.unmap_elements(&ddw, &p.maps, &p.per_segment, cpu, work);
            }
        }
        self.release_slot();
        Ok(())
    }

    fn translate(
        &self,
        dev: &Device,
        dma: DmaAddr,
        len: u64,
        access: Access,
        work: &mut WorkRecord,
    ) -> Result<Vec<PhysRange>, DmaFault> {
        device_access(dev, dma, len, access, &self.protection, |dma| {
            let unmapped = |at: u64| DmaFault {
                device: dev.id(),
                dma: DmaAddr(at),
                access,
                reason: FaultReason::Unmapped,
            };
            if self.default.contains(dma) {
                return Ok((self.default.walk(dev, dma, len, access, work)?, false));
            }
            let ddw = self.ddw.read();
            match ddw.as_ref() {
                Some(Ddw::Direct { info, .. })
                    if dma >= info.addr && dma - info.addr < info.size =>
                {
                    // The pre-mapped window: an offset, no table walk by the partition's
                    // model, and nothing checked: a bypass of translation.
                    let pa = dma - info.addr;
                    if pa >= self.cfg.memory_size {
                        return Err(unmapped(dma));
                    }
                    if pa + len > self.cfg.memory_size {
                        return Err(unmapped(info.addr + self.cfg.memory_size));
                    }
                    work.translations += 1;
                    let ranges = vec![PhysRange {
                        pa: PhysAddr::new(pa),
                        len,
                    }];
                    Ok((ranges, true))
                }
                Some(Ddw::Dynamic { window, .. }) if window.contains(dma) => {
                    Ok((window.walk(dev, dma, len, access, work)?, false))
                }
                _ => Err(unmapped(dma)),
            }
        })
    }
}

/// Pool lock acquisitions recorded in `work` (small pools and large pool together).
pub fn pool_locks(work: &WorkRecord) -> u64 {
    work.lock_count(LockId::TcePool) + work.lock_count(LockId::TceLargePool)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::addr::{SZ_4K, SZ_64K};
    use crate::hw::test_support::{assert_translates_to, map_to_device};

    const GIB: u64 = SZ_1G;

    fn pseries(f: impl FnOnce(&mut PseriesConfig)) -> PseriesIommu {
        let mut c = PseriesConfig::new(DomainId(9), 64 * GIB);
        f(&mut c);
        PseriesIommu::new(c).unwrap()
    }

    fn dev64() -> Device {
        Device::new(1, 64).unwrap()
    }

    #[test]
    fn tces_carry_the_read_bit_in_every_direction_as_linux_builds_them() {
        // tce_build_pSeriesLP: `proto_tce = TCE_PCI_READ; if (direction != DMA_TO_DEVICE)
        // proto_tce |= TCE_PCI_WRITE;` with TCE_PCI_READ 0x1 and TCE_PCI_WRITE 0x2
        // (arch/powerpc/include/asm/tce.h), the real page number from bit 12 up.
        for (dir, bits) in [
            (Direction::ToDevice, 0x1u64),
            (Direction::FromDevice, 0x3),
            (Direction::Bidirectional, 0x3),
        ] {
            let p = pseries(|_| {});
            let mut w = WorkRecord::new();
            let b = p
                .map_single(&dev64(), PhysAddr::new(0x20_0000), 4096, dir, 0, &mut w)
                .unwrap();
            let window = &p.default;
            let index = (b.dma_addr().0 - window.offset) >> window.page_shift;
            assert_eq!(
                window.table.lock().tce_at(index),
                Some(0x20_0000 | bits),
                "{dir:?}"
            );
            // The device may read a receive buffer: no permission fault.
            assert!(p
                .translate(&dev64(), b.dma_addr(), 4096, Access::Read, &mut w)
                .is_ok());
        }
    }

    #[test]
    fn build_and_clear_plans_follow_the_linux_helpers() {
        let m = HcallFeatures::MULTI_TCE;
        let s = HcallFeatures::SINGLE_TCE;
        assert_eq!(build_calls(1, m).runs(), &[(Hcall::PutTce, 1)]);
        assert_eq!(
            build_calls(16, m).runs(),
            &[(Hcall::PutTceIndirect { count: 16 }, 1)]
        );
        assert_eq!(
            build_calls(600, m).runs(),
            &[
                (Hcall::PutTceIndirect { count: 512 }, 1),
                (Hcall::PutTceIndirect { count: 88 }, 1)
            ]
        );
        assert_eq!(build_calls(600, s).runs(), &[(Hcall::PutTce, 600)]);
        assert_eq!(
            clear_calls(1, m).runs(),
            &[(Hcall::StuffTce { count: 1 }, 1)]
        );
        assert_eq!(
            clear_calls(1024, m).runs(),
            &[(Hcall::StuffTce { count: 512 }, 2)]
        );
        assert_eq!(clear_calls(16, s).runs(), &[(Hcall::PutTce, 16)]);
        assert_eq!(
            (build_calls(600, m).calls(), build_calls(0, m).calls()),
            (2, 0)
        );
    }

    #[test]
    fn the_window_pool_follows_the_route() {
        let p = pseries(|c| c.ddw = Some(DdwConfig::with_window(16 * GIB, ddw_page::PS_64K)));
        let layout = |p: &PseriesIommu, d: &Device| {
            p.with_window_pool(d, |pool, off, shift| (pool.pool_bounds().len(), off, shift))
        };
        // No DDW yet: the default window (4 pools + large, 4 KiB TCEs at 0).
        assert_eq!(layout(&p, &dev64()), Some((5, 0, 12)));
        p.enable_ddw(&mut WorkRecord::new()).unwrap();
        // A dynamic DDW for 64-bit devices; 32-bit devices keep the default window.
        assert_eq!(layout(&p, &dev64()), Some((5, DEFAULT_DDW_ADDR, 16)));
        let d32 = Device::new(1, 32).unwrap();
        assert_eq!(layout(&p, &d32), Some((5, 0, 12)));
        // A direct DDW has no allocator.
        let q = pseries(|c| c.ddw = Some(DdwConfig::with_window(64 * GIB, ddw_page::PS_64K)));
        q.enable_ddw(&mut WorkRecord::new()).unwrap();
        assert_eq!(layout(&q, &dev64()), None);
    }

    #[test]
    fn page_size_mask_decoding() {
        use ddw_page::*;
        assert_eq!(largest_shift(PS_4K | PS_64K), Some(16));
        assert_eq!(largest_shift(PS_4K | PS_2M), Some(21));
        assert_eq!(largest_shift(PS_16M | PS_2M), Some(24));
        assert_eq!(largest_shift(0), None);
        assert_eq!(bit_for_shift(21), Some(PS_2M));
        assert_eq!(bit_for_shift(13), None);
    }

    #[test]
    fn a_default_window_map_touches_the_table_and_a_pool() {
        let p = pseries(|_| {});
        let dev = Device::new(1, 32).unwrap();
        let mut w = WorkRecord::new();
        let b = p
            .map_single(
                &dev,
                PhysAddr::new(0x1234_0100),
                2 * SZ_4K,
                Direction::ToDevice,
                3,
                &mut w,
            )
            .unwrap();
        // Offset 0x100 spills into a third TCE page.
        assert_eq!((w.hypercalls, w.tces_touched, w.ptes_written), (1, 3, 3));
        assert_eq!(w.lock_count(LockId::TcePool), 1);
        assert_eq!(b.dma_addr().0 & 0xfff, 0x100);
        assert_translates_to(
            &p,
            &dev,
            b.dma_addr(),
            2 * SZ_4K,
            Access::Read,
            0x1234_0100,
            &mut w,
        );
        assert!(p
            .translate(&dev, b.dma_addr(), 1, Access::Write, &mut w)
            .is_err());
        let mut w = WorkRecord::new();
        p.unmap_single(b, 3, 0, &mut w).unwrap();
        assert_eq!((w.hypercalls, w.tces_touched, w.ptes_cleared), (1, 3, 3));
        assert_eq!(p.default_mapped_bytes(), 0);
        assert_eq!(p.live_mappings(), 0);
    }

    #[test]
    fn large_requests_use_the_large_pool() {
        let p = pseries(|_| {});
        let dev = Device::new(1, 32).unwrap();
        let mut w = WorkRecord::new();
        let b = map_to_device(&p, &dev, 0, 600 * SZ_4K, &mut w).unwrap();
        assert_eq!(w.lock_count(LockId::TceLargePool), 1);
        assert_eq!(pool_locks(&w), 1);
        p.unmap_single(b, 0, 0, &mut w).unwrap();
    }

    #[test]
    fn sg_elements_merge_only_when_dma_addresses_continue() {
        let p = pseries(|_| {});
        let dev = Device::new(1, 32).unwrap();
        let mut w = WorkRecord::new();
        let list = [
            SgEntry::new(PhysAddr::new(0x10_0000), SZ_4K),
            SgEntry::new(PhysAddr::new(0x30_0000), SZ_4K),
            SgEntry::new(PhysAddr::new(0x50_0000), SZ_4K),
        ];
        let m = p
            .map_sg(&dev, &list, Direction::ToDevice, 0, &mut w)
            .unwrap();
        // One H_PUT_TCE per element.
        assert_eq!(w.hypercalls, 3);
        // Small allocations round the pool hint up to 16-entry blocks, so elements are not
        // adjacent: one segment each.
        assert_eq!(m.segment_count(), 3);
        let mut w = WorkRecord::new();
        p.unmap_sg(m, 0, 0, &mut w).unwrap();
        assert_eq!(w.hypercalls, 3);
        assert_eq!(p.default_mapped_bytes(), 0);
    }

    #[test]
    fn direct_ddw_is_premapped_once_and_maps_by_offset() {
        let p = pseries(|c| {
            c.memory_size = 16 * GIB;
            c.ddw = Some(DdwConfig::with_window(
                1 << 40,
                ddw_page::PS_4K | ddw_page::PS_64K,
            ));
        });
        let mut w = WorkRecord::new();
        let info = p.enable_ddw(&mut w).unwrap().unwrap();
        assert_eq!(
            (info.mode, info.size, info.page_shift),
            (DdwMode::Direct, 16 * GIB, 16)
        );
        // 16 GiB / 64 KiB = 262144 TCEs in 512 indirect calls.
        assert_eq!((w.hypercalls, w.tces_touched), (512, 262_144));
        assert_eq!(p.stats().premap_hypercalls, 512);
        let mut w = WorkRecord::new();
        let b = map_to_device(&p, &dev64(), 0x4000_1234, 9000, &mut w).unwrap();
        assert_eq!(b.dma_addr(), DmaAddr(DEFAULT_DDW_ADDR + 0x4000_1234));
        assert!(b.is_untranslated());
        assert!(w.is_empty());
        assert_eq!(
            p.remove_ddw(&mut w),
            Err(PseriesError::DdwInUse { live: 1 })
        );
        p.unmap_single(b, 0, 0, &mut w).unwrap();
        assert!(w.is_empty());
        p.remove_ddw(&mut w).unwrap();
        assert_eq!(w.hypercalls, 512);
        assert_eq!(p.ddw(), None);
    }

    #[test]
    fn a_small_ddw_becomes_dynamic_or_is_refused_by_the_old_policy() {
        let ddw = DdwConfig::with_window(256 * GIB, ddw_page::PS_4K | ddw_page::PS_64K);
        let p = pseries(|c| {
            c.memory_size = 512 * GIB;
            c.ddw = Some(ddw);
        });
        let mut w = WorkRecord::new();
        let info = p.enable_ddw(&mut w).unwrap().unwrap();
        assert_eq!(
            (info.mode, info.size, info.page_shift),
            (DdwMode::Dynamic, 256 * GIB, 16)
        );
        assert!(w.is_empty(), "a dynamic window is not pre-mapped");
        let old = pseries(|c| {
            c.memory_size = 512 * GIB;
            c.ddw = Some(ddw);
            c.policy = DdwPolicy::DirectOnly;
        });
        assert_eq!(old.enable_ddw(&mut w), Ok(None));
        assert!(matches!(
            old.create_ddw(16, 256 * GIB, &mut w),
            Err(PseriesError::NotDirect { .. })
        ));
        let off = pseries(|c| {
            c.ddw = Some(ddw);
            c.policy = DdwPolicy::Disabled;
        });
        assert_eq!(off.query_pe_dma_window(), Err(PseriesError::NoDdwSupport));
    }

    #[test]
    fn dynamic_ddw_maps_64k_in_one_tce() {
        let p = pseries(|c| {
            c.memory_size = 512 * GIB;
            c.ddw = Some(DdwConfig::with_window(
                256 * GIB,
                ddw_page::PS_4K | ddw_page::PS_64K,
            ));
        });
        let mut w = WorkRecord::new();
        p.enable_ddw(&mut w).unwrap();
        let b = p
            .map_single(
                &dev64(),
                PhysAddr::new(0x20_0000),
                SZ_64K,
                Direction::FromDevice,
                0,
                &mut w,
            )
            .unwrap();
        assert_eq!((w.hypercalls, w.tces_touched), (1, 1));
        assert!(b.dma_addr().0 >= DEFAULT_DDW_ADDR);
        let r = p
            .translate(&dev64(), b.dma_addr(), SZ_64K, Access::Write, &mut w)
            .unwrap();
        assert_eq!(r[0].pa, PhysAddr::new(0x20_0000));
        p.unmap_single(b, 0, 0, &mut w).unwrap();
        // A 32-bit device keeps the default window and its 4 KiB TCEs.
        let mut w = WorkRecord::new();
        let d32 = Device::new(2, 32).unwrap();
        let b = p
            .map_single(
                &d32,
                PhysAddr::new(0x20_0000),
                SZ_64K,
                Direction::FromDevice,
                0,
                &mut w,
            )
            .unwrap();
        assert_eq!((w.hypercalls, w.tces_touched), (1, 16));
        p.unmap_single(b, 0, 0, &mut w).unwrap();
    }

    #[test]
    fn ddw_create_checks_the_offer() {
        let p = pseries(|c| {
            c.ddw = Some(DdwConfig::with_window(
                GIB,
                ddw_page::PS_4K | ddw_page::PS_64K,
            ));
        });
        let mut w = WorkRecord::new();
        let q = p.query_pe_dma_window().unwrap();
        assert_eq!(
            (q.windows_available, q.largest_available_block),
            (1, GIB >> 16)
        );
        assert!(matches!(
            p.create_ddw(21, GIB, &mut w),
            Err(PseriesError::UnsupportedPageShift { shift: 21, .. })
        ));
        assert!(matches!(
            p.create_ddw(16, 2 * GIB, &mut w),
            Err(PseriesError::WindowTooLarge { .. })
        ));
        assert_eq!(
            p.create_ddw(16, GIB + 1, &mut w),
            Err(PseriesError::BadWindowSize { size: GIB + 1 })
        );
        p.create_ddw(16, GIB, &mut w).unwrap();
        assert_eq!(p.create_ddw(16, GIB, &mut w), Err(PseriesError::DdwExists));
        assert_eq!(p.query_pe_dma_window().unwrap().windows_available, 0);
        p.remove_ddw(&mut w).unwrap();
        assert_eq!(p.remove_ddw(&mut w), Err(PseriesError::NoDdw));
    }

    #[test]
    fn exhausted_windows_and_oversized_requests_are_errors() {
        let p = pseries(|c| {
            c.default_window.size = 64 * SZ_4K;
        });
        let dev = Device::new(1, 32).unwrap();
        let mut w = WorkRecord::new();
        let e = map_to_device(&p, &dev, 0, 64 * SZ_4K, &mut w).unwrap_err();
        assert!(matches!(e, DmaError::IovaSpace { .. }));
        let mut held = Vec::new();
        let err = loop {
            match map_to_device(&p, &dev, 0, 8 * SZ_4K, &mut w) {
                Ok(b) => held.push(b),
                Err(e) => break e,
            }
        };
        assert!(matches!(err, DmaError::IovaSpace { .. }));
        // 64 TCEs: one small pool over entries 0..48 (entry 0 reserved), the large pool
        // over 48..64; Linux's iommu_area_alloc never hands out a pool's last entry ("we
        // don't want the last of the limit"). First fit from the hint, which moves to the
        // next 16-entry block after each success: 1, 16, 32; then the pool again from its
        // start: 24 (9..16 is one entry short; 40..48 would use the pool's last entry);
        // then the large pool, the last resort: 48 (56..64 would use its last entry). The
        // device reaches past the window, so it is not address-constrained: before
        // session 5 the model capped the limit at the window's end, which made the large
        // pool look constrained and sent its retry to pool 0, handing out 40 as well.
        let entries: Vec<u64> = held.iter().map(|b| b.dma_addr().0 / SZ_4K).collect();
        assert_eq!(entries, [1, 16, 32, 24, 48], "{entries:?}");
        let mut sorted = entries.clone();
        sorted.sort_unstable();
        assert!(
            sorted[0] >= 1 && sorted[sorted.len() - 1] + 8 <= 64,
            "{entries:?}"
        );
        assert!(sorted.windows(2).all(|w| w[0] + 8 <= w[1]), "{entries:?}");
        for b in held {
            p.unmap_single(b, 0, 0, &mut w).unwrap();
        }
        assert_eq!(p.default_pool().live_blocks(), 0);
    }

    #[test]
    fn a_refused_build_clears_what_it_built() {
        // 4 KiB TCEs hold 52-bit real addresses: a buffer across that limit fails on its
        // second indirect call.
        let p = pseries(|_| {});
        let dev = Device::new(1, 32).unwrap();
        let mut w = WorkRecord::new();
        let pa = (1u64 << 52) - 512 * SZ_4K;
        let e = map_to_device(&p, &dev, pa, 600 * SZ_4K, &mut w).unwrap_err();
        assert!(matches!(e, DmaError::PageTable { .. }), "{e}");
        // Two builds (one refused) and one clear of the 512 built.
        assert_eq!((w.hypercalls, w.tces_touched), (3, 512 + 88 + 512));
        assert_eq!(p.default_mapped_bytes(), 0);
        assert_eq!((p.live_mappings(), p.default_pool().live_blocks()), (0, 0));
    }

    #[test]
    fn bad_configurations_are_rejected() {
        let mut c = PseriesConfig::new(DomainId(1), 0);
        assert_eq!(PseriesIommu::new(c).unwrap_err(), PseriesError::NoMemory);
        c.memory_size = GIB;
        c.default_window.page_shift = 13;
        assert!(matches!(PseriesIommu::new(c), Err(PseriesError::Table(_))));
    }
}
