//! The AMD-Vi IOMMU unit: the device table, the IOTLB and page-directory cache, the command
//! buffer and its consumer, the event log, and the driver-side queueing and completion wait
//! of Linux's `amd/iommu.c`.
//!
//! # Hardware side
//!
//! - **Device table**: one 256-bit entry per DeviceID, stored encoded ([`spec::Dte`]); the
//!   IOMMU keeps decoded entries in a DTE cache that only `INVALIDATE_DEVTAB_ENTRY` (or
//!   `INVALIDATE_IOMMU_ALL`) empties, so a rewritten entry is not seen until invalidated.
//! - **Translation** ([`AmdVi::translate`]): DTE V = 0 passes the request through
//!   untranslated (as QEMU's AMD-Vi model, "DTE\[V\]=0, address is passed untranslated");
//!   V = 1 with TV = 0 has no translation information and faults; Mode 0 checks the DTE's
//!   IR/IW only; Mode 1-6 looks up the IOTLB by DomainID, then walks the v1 table from the
//!   deepest page-directory-cache hit (`X86.md` §3.4: separate PTE and PDE caches), reading
//!   real entries ([`AmdV1Table::read_entry`]) and decoding them ([`spec::decode_entry`]),
//!   level skipping included. Permissions are the AND of the leaf's, the PDEs' read in the
//!   walk and the DTE's IR/IW. Faults write an event-log entry: `IO_PAGE_FAULT` (not
//!   present, or PR | PE for a permission fault, RW for a write; RZ for an invalid entry)
//!   and `ILLEGAL_DEV_TABLE_ENTRY` (reserved Mode, or a DeviceID beyond the table), unless
//!   the DTE's SA bit suppresses them.
//! - **Command buffer**: a ring of 16-byte commands with byte-offset Head and Tail
//!   registers (`X86.md` §3.1, §3.5). Software writes commands at the tail and then the
//!   Tail register; the consumer ([`AmdVi::process_commands`]) decodes and applies them in
//!   order from the head, invalidating the caches, and `COMPLETION_WAIT` writes its store
//!   data to [`PhysMemory`]. A command that does not decode logs `ILLEGAL_COMMAND_ERROR`
//!   with its physical address and stops the consumer (CmdBufRun clear) with Head on it.
//!   The consumer runs when the driver waits (see below) or when called, like a
//!   self-servicing hardware thread; nothing runs it behind the caller's back, so every
//!   count is deterministic.
//! - **Event log**: a bounded ring of encoded entries; when full, new events are lost and
//!   the overflow flag is set ([`AmdVi::drain_events`] reads and acknowledges).
//!
//! # Driver side (Linux `amd/iommu.c`, `X86.md` §4.1)
//!
//! [`AmdVi::queue_command`] is `iommu_queue_command_sync`: under the IOMMU's command lock
//! (`iommu->lock`, counted as [`LockId::CmdqLock`]), check the free space against the cached
//! head (re-reading the Head register, one MMIO read, when 0x20 bytes or less are left,
//! waiting 1 us between tries), copy the command, and write the Tail register: **one MMIO
//! write per command**. [`AmdVi::completion_wait`] is `iommu_completion_wait`: under the
//! same lock, queue a `COMPLETION_WAIT` storing the next sequence number to the semaphore
//! and poll the semaphore, with a 1 us delay (one `polls`) before each re-check, up to
//! 100,000 times, **holding the lock throughout**. The hardware makes progress during each
//! delay, so a wait whose commands were not yet consumed costs exactly one poll.

use std::collections::BTreeMap;
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use super::pgtable::{AmdV1Config, AmdV1ConfigError, AmdV1Table, DEFAULT_MAX_TABLE_PAGES};
use super::spec::{
    self, fault_flags, Command, Dte, EncodeError, Entry, Event, InvSpan, RawCommand, RawDte,
    RawEvent, CMD_BYTES,
};
use crate::addr::{Access, Iova, PhysAddr, Prot};
use crate::dma::{DmaError, Domain, DomainConfig, DomainMode};
use crate::iotlb::{
    Asid, CacheConfigError, Iotlb, IotlbConfig, Replacement, WalkCache, WalkCacheConfig,
    WalkLevelConfig, MAX_PAGE_SHIFT,
};
use crate::iova::IovaAllocator;
use crate::mem::PhysMemory;
use crate::pgtable::{IoPageTable, PgTableError, Translation, UnmapGather};
use crate::work::{LockId, WorkRecord};

use super::invalidator::AmdViInvalidator;

/// Most device table entries (16-bit DeviceIDs).
pub const MAX_DEVICES: u32 = 1 << 16;
/// Smallest command buffer / event log: 2^8 entries (the length field's minimum, `X86.md`
/// §3.1 gives Linux's 2^9).
pub const MIN_RING_LOG2: u32 = 8;
/// Largest command buffer / event log: 2^15 entries.
pub const MAX_RING_LOG2: u32 = 15;
/// Linux's command buffer and event log: 512 entries of 16 bytes (8 KiB).
pub const LINUX_RING_LOG2: u32 = 9;
/// Linux's polling limit for a completion wait and for command-buffer space
/// (`LOOP_TIMEOUT`, 100,000 tries of `udelay(1)`).
pub const LOOP_TIMEOUT: u64 = 100_000;
/// Free bytes at or below which Linux re-reads the Head register before queueing.
pub const CMD_SPACE_SLACK: u64 = 0x20;
/// Where the table pages of the domain with DomainID `d` start by default: `TABLE_REGION +
/// d * TABLE_REGION_STRIDE`, so every domain's tables have distinct physical addresses.
pub const TABLE_REGION: u64 = 1 << 48;
/// Bytes of physical address space reserved per domain for its table pages (2^20 pages).
pub const TABLE_REGION_STRIDE: u64 = (DEFAULT_MAX_TABLE_PAGES as u64) << 12;

/// How to build an [`AmdVi`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AmdViConfig {
    /// Device table entries (DeviceIDs `0..devices`), 1 to [`MAX_DEVICES`].
    pub devices: u32,
    /// The IOTLB (PTE cache) geometry. No vendor sizes are published (`X86.md` §8); the
    /// default is gem5's SMMUv3 main TLB, 2048 entries 4-way.
    pub iotlb: IotlbConfig,
    /// The page-directory cache, one level per table level from 6 down to 2 (spans 2^57 to
    /// 2^21). Default: 4, 4, 16, 64 and 128 entries, 4-way (a model choice).
    pub pde_cache: WalkCacheConfig,
    /// Command buffer entries as log2, [`MIN_RING_LOG2`]..=[`MAX_RING_LOG2`].
    pub cmd_log2: u32,
    /// Event log entries as log2, [`MIN_RING_LOG2`]..=[`MAX_RING_LOG2`].
    pub event_log2: u32,
    /// Physical address of the command buffer (reported by `ILLEGAL_COMMAND_ERROR`).
    pub cmd_buf_base: PhysAddr,
    /// Physical address of the driver's completion-wait semaphore (8 bytes in memory).
    pub sem_addr: PhysAddr,
}

/// The page-directory cache's table levels, top first: walk-cache level `k` holds PDEs
/// read from level-`6 - k` tables.
const PDE_LEVELS: u32 = 5;

fn pde_level_index(table_level: u32) -> usize {
    (6 - table_level) as usize
}

impl Default for AmdViConfig {
    /// 256 devices, Linux's 512-entry command buffer and event log, the default caches,
    /// the command buffer at 16 MiB and the semaphore at 16 MiB + 64 KiB.
    fn default() -> Self {
        let level = |entries, table_level| WalkLevelConfig {
            entries,
            ways: 4,
            span_shift: spec::level_shift(table_level),
        };
        AmdViConfig {
            devices: 256,
            iotlb: IotlbConfig::gem5_main_tlb(),
            pde_cache: WalkCacheConfig {
                levels: vec![
                    level(4, 6),
                    level(4, 5),
                    level(16, 4),
                    level(64, 3),
                    level(128, 2),
                ],
                policy: Replacement::RoundRobin,
            },
            cmd_log2: LINUX_RING_LOG2,
            event_log2: LINUX_RING_LOG2,
            cmd_buf_base: PhysAddr::new(0x100_0000),
            sem_addr: PhysAddr::new(0x101_0000),
        }
    }
}

/// Why an IOMMU operation failed. The IOMMU is unchanged when a configuration error is
/// returned.
#[derive(Debug, thiserror::Error)]
pub enum AmdViError {
    /// The device table size is out of range.
    #[error("A device table of {devices} entries is outside 1..={MAX_DEVICES}")]
    BadDeviceTable {
        /// The size asked for.
        devices: u32,
    },
    /// A ring size is out of range.
    #[error("Ring log2 size {log2} is outside {MIN_RING_LOG2}..={MAX_RING_LOG2}")]
    BadRing {
        /// The size asked for.
        log2: u32,
    },
    /// The PDE cache does not have one level per table level 6..2.
    #[error("The page-directory cache needs {PDE_LEVELS} levels with spans 2^57..2^21")]
    BadPdeCache,
    /// The caches could not be built.
    #[error("Cannot build the IOMMU's caches")]
    Caches(#[from] CacheConfigError),
    /// A DeviceID beyond the device table.
    #[error("DeviceID {device_id:#06x} is beyond the {devices}-entry device table")]
    BadDeviceId {
        /// The DeviceID given.
        device_id: u16,
        /// Entries in the table.
        devices: u32,
    },
    /// The DomainID already has a domain.
    #[error("DomainID {domain_id} is already in use")]
    DomainInUse {
        /// The DomainID given.
        domain_id: u16,
    },
    /// A domain of another IOMMU.
    #[error("The domain with DomainID {domain_id} does not belong to this IOMMU")]
    ForeignDomain {
        /// The domain's DomainID.
        domain_id: u16,
    },
    /// A mode without translation (use [`AmdVi::attach_identity`] for pass-through).
    #[error("AMD-Vi DMA domains are translated: {mode:?} is not supported")]
    NotTranslated {
        /// The mode asked for.
        mode: DomainMode,
    },
    /// The page table could not be built.
    #[error("Cannot build the page table")]
    Table(#[from] AmdV1ConfigError),
    /// The DMA layer refused the assembled domain.
    #[error("Cannot assemble the domain")]
    Domain(#[from] DmaError),
    /// A command or entry could not be encoded.
    #[error("Cannot encode")]
    Encode(#[from] EncodeError),
    /// The command buffer stayed full for [`LOOP_TIMEOUT`] tries (Linux "Command buffer
    /// timeout"), or the consumer is stopped with the buffer full.
    #[error("Command buffer timeout")]
    CommandBufferTimeout,
    /// The completion wait's store did not arrive within [`LOOP_TIMEOUT`] polls (Linux
    /// "Completion-Wait loop timed out"), e.g. because the consumer stopped.
    #[error("Completion-Wait loop timed out")]
    CompletionWaitTimeout,
}

/// Why a request failed.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum AmdViFaultReason {
    /// The DTE is malformed (reserved Mode) or the DeviceID is beyond the table
    /// (`ILLEGAL_DEV_TABLE_ENTRY`).
    IllegalDte,
    /// The DTE is valid but holds no translation information (TV = 0): the request is
    /// aborted and logged as a not-present `IO_PAGE_FAULT` (the event is a model choice).
    NoTranslation,
    /// No present translation for the address, or an address beyond the DTE Mode's reach
    /// (`IO_PAGE_FAULT`).
    NotPresent,
    /// An entry on the walk is present but invalid for its level (`IO_PAGE_FAULT` with RZ).
    InvalidEntry,
    /// The translation does not allow the access (`IO_PAGE_FAULT` with PR and PE).
    Permission {
        /// What the translation (and DTE) grant.
        had: Prot,
    },
}

/// A failed request.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, thiserror::Error)]
#[error("Device {device_id:#06x} {access:?} fault at IOVA {iova}: {reason:?}")]
pub struct AmdViFault {
    /// The DeviceID.
    pub device_id: u16,
    /// The address requested.
    pub iova: Iova,
    /// The access.
    pub access: Access,
    /// Why.
    pub reason: AmdViFaultReason,
    /// Whether an event-log entry was written (false when suppressed or the log was full).
    pub event_logged: bool,
}

/// What the command consumer has done.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct CommandStats {
    /// `COMPLETION_WAIT` commands completed.
    pub completion_waits: u64,
    /// `INVALIDATE_DEVTAB_ENTRY` commands.
    pub inv_devtab: u64,
    /// `INVALIDATE_IOMMU_PAGES` commands.
    pub inv_pages: u64,
    /// `INVALIDATE_IOTLB_PAGES` commands (no device IOTLB is modelled: counted only).
    pub inv_iotlb: u64,
    /// `INVALIDATE_INTERRUPT_TABLE` commands (counted only).
    pub inv_irt: u64,
    /// `INVALIDATE_IOMMU_ALL` commands.
    pub inv_all: u64,
    /// Commands that did not decode (`ILLEGAL_COMMAND_ERROR`).
    pub illegal: u64,
    /// IOTLB entries removed by commands.
    pub iotlb_removed: u64,
    /// Page-directory-cache entries removed by commands.
    pub pde_removed: u64,
    /// Completion-wait stores that fell outside memory (dropped).
    pub store_errors: u64,
}

/// The IOTLB, page-directory cache and DTE cache, behind one lock.
#[derive(Debug)]
pub struct Caches {
    /// Leaf translations, tagged by DomainID.
    pub iotlb: Iotlb,
    /// Page-directory entries, tagged by DomainID.
    pub pde: WalkCache,
    /// Decoded device table entries.
    pub dte: BTreeMap<u16, Dte>,
}

/// The command buffer as the hardware sees it.
struct CmdBuf {
    ring: Vec<RawCommand>,
    /// Head register (byte offset of the next command to consume).
    head: u64,
    /// Tail register (byte offset one past the last command written).
    tail: u64,
    /// CmdBufRun: clear after an illegal command.
    running: bool,
    /// Status.ComWaitInt.
    com_wait_int: bool,
    stats: CommandStats,
}

/// The event log.
struct EventLog {
    ring: Vec<RawEvent>,
    head: usize,
    len: usize,
    overflow: bool,
    written: u64,
    lost: u64,
}

/// The driver's view of the command buffer (Linux `struct amd_iommu` fields protected by
/// `iommu->lock`).
struct DriverQueue {
    /// The head as last read from the Head register.
    cached_head: u64,
    /// Where the next command goes.
    tail: u64,
    /// Commands were queued since the last completion wait.
    need_sync: bool,
    /// The last completion-wait sequence number.
    seq: u64,
}

/// A domain's v1 table, shared by its DMA-layer wrapper and the IOMMU's walker.
type SharedTable = Arc<RwLock<AmdV1Table>>;

/// Shared state of the IOMMU (also held by domains' page tables and invalidators).
pub(crate) struct Inner {
    pub(crate) config: AmdViConfig,
    memory: Arc<PhysMemory>,
    device_table: RwLock<Vec<RawDte>>,
    /// Each domain's root table address and table (the model's stand-in for the memory the
    /// walker reads).
    domains: RwLock<BTreeMap<u16, (u64, SharedTable)>>,
    pub(crate) caches: Mutex<Caches>,
    cmd: Mutex<CmdBuf>,
    events: Mutex<EventLog>,
    driver: Mutex<DriverQueue>,
}

/// An AMD-Vi IOMMU. Thread-safe: every method takes `&self`. See the module docs.
#[derive(Clone)]
pub struct AmdVi {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for AmdVi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AmdVi")
            .field("devices", &self.inner.config.devices)
            .field("domains", &self.inner.domains.read().len())
            .finish_non_exhaustive()
    }
}

/// A translated domain built by [`AmdVi::new_domain`]: the DMA-API [`Domain`], its v1
/// table and its invalidator.
#[derive(Clone)]
pub struct AmdViDomain {
    domain: Arc<Domain>,
    domain_id: u16,
    table: Arc<RwLock<AmdV1Table>>,
    invalidator: Arc<AmdViInvalidator>,
}

impl std::fmt::Debug for AmdViDomain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AmdViDomain")
            .field("domain_id", &self.domain_id)
            .field("domain", &self.domain)
            .finish()
    }
}

impl AmdViDomain {
    /// The DMA-API domain (map, unmap, flush-queue control).
    pub fn domain(&self) -> &Arc<Domain> {
        &self.domain
    }

    /// The DomainID.
    pub fn domain_id(&self) -> u16 {
        self.domain_id
    }

    /// The domain's invalidator.
    pub fn invalidator(&self) -> &Arc<AmdViInvalidator> {
        &self.invalidator
    }

    /// Runs `f` on the domain's v1 table (read-only).
    pub fn with_table<R>(&self, f: impl FnOnce(&AmdV1Table) -> R) -> R {
        f(&self.table.read())
    }
}

/// The page table of an AMD-Vi domain: the v1 table shared with the IOMMU's walker, which
/// marks IOTLB entries stale when their mapping is removed (as the SMMUv3 model does), so
/// a missing or late invalidation shows as stale hits.
pub struct AmdViPageTable {
    table: Arc<RwLock<AmdV1Table>>,
    iommu: Arc<Inner>,
    tag: Asid,
    bitmap: u64,
    range: (Iova, Iova),
}

impl IoPageTable for AmdViPageTable {
    fn format_name(&self) -> &'static str {
        "amd-v1"
    }

    fn page_size_bitmap(&self) -> u64 {
        self.bitmap
    }

    fn iova_range(&self) -> (Iova, Iova) {
        self.range
    }

    fn map(
        &mut self,
        iova: Iova,
        pa: PhysAddr,
        size: u64,
        prot: Prot,
        work: &mut WorkRecord,
    ) -> Result<(), PgTableError> {
        self.table.write().map(iova, pa, size, prot, work)
    }

    fn unmap(
        &mut self,
        iova: Iova,
        size: u64,
        gather: &mut UnmapGather,
        work: &mut WorkRecord,
    ) -> Result<(), PgTableError> {
        let mut table = self.table.write();
        table.unmap(iova, size, gather, work)?;
        // Under the table lock: no walk can fill a fresh entry for the range in between.
        self.iommu
            .caches
            .lock()
            .iotlb
            .mark_stale_range(self.tag, iova, size);
        Ok(())
    }

    fn translate(&self, iova: Iova, work: &mut WorkRecord) -> Option<Translation> {
        self.table.read().translate(iova, work)
    }

    fn table_pages(&self) -> usize {
        self.table.read().table_pages()
    }

    fn mapped_bytes(&self) -> u64 {
        self.table.read().mapped_bytes()
    }
}

/// The result of a successful translation.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct AmdViTranslation {
    /// The physical address.
    pub pa: PhysAddr,
    /// What the translation grants (the DTE's IR/IW included).
    pub prot: Prot,
    /// Size of the page it came from (4 KiB for untranslated requests).
    pub page_size: u64,
}

fn check_ring(log2: u32) -> Result<(), AmdViError> {
    if (MIN_RING_LOG2..=MAX_RING_LOG2).contains(&log2) {
        Ok(())
    } else {
        Err(AmdViError::BadRing { log2 })
    }
}

impl AmdVi {
    /// An IOMMU with every DTE zero (V = 0), empty caches and rings, using `memory` for
    /// completion-wait stores.
    ///
    /// # Errors
    ///
    /// [`AmdViError`] for a device table or ring size out of range or a cache geometry
    /// that does not validate.
    pub fn new(config: AmdViConfig, memory: Arc<PhysMemory>) -> Result<Self, AmdViError> {
        if config.devices == 0 || config.devices > MAX_DEVICES {
            return Err(AmdViError::BadDeviceTable {
                devices: config.devices,
            });
        }
        check_ring(config.cmd_log2)?;
        check_ring(config.event_log2)?;
        let spans_ok = config.pde_cache.levels.len() == PDE_LEVELS as usize
            && config
                .pde_cache
                .levels
                .iter()
                .enumerate()
                .all(|(k, l)| l.span_shift == spec::level_shift(6 - k as u32));
        if !spans_ok {
            return Err(AmdViError::BadPdeCache);
        }
        let caches = Caches {
            iotlb: Iotlb::new(config.iotlb)?,
            pde: WalkCache::new(config.pde_cache.clone())?,
            dte: BTreeMap::new(),
        };
        let inner = Inner {
            memory,
            device_table: RwLock::new(vec![[0; 4]; config.devices as usize]),
            domains: RwLock::new(BTreeMap::new()),
            caches: Mutex::new(caches),
            cmd: Mutex::new(CmdBuf {
                ring: vec![[0; 2]; 1 << config.cmd_log2],
                head: 0,
                tail: 0,
                running: true,
                com_wait_int: false,
                stats: CommandStats::default(),
            }),
            events: Mutex::new(EventLog {
                ring: vec![[0; 2]; 1 << config.event_log2],
                head: 0,
                len: 0,
                overflow: false,
                written: 0,
                lost: 0,
            }),
            driver: Mutex::new(DriverQueue {
                cached_head: 0,
                tail: 0,
                need_sync: false,
                seq: 0,
            }),
            config,
        };
        Ok(AmdVi {
            inner: Arc::new(inner),
        })
    }

    /// The configuration it was built with.
    pub fn config(&self) -> &AmdViConfig {
        &self.inner.config
    }

    /// Locks the caches (for reports and tests).
    pub fn caches(&self) -> parking_lot::MutexGuard<'_, Caches> {
        self.inner.caches.lock()
    }

    /// What the command consumer has done.
    pub fn command_stats(&self) -> CommandStats {
        self.inner.cmd.lock().stats
    }

    /// The Head register (byte offset).
    pub fn cmd_head(&self) -> u64 {
        self.inner.cmd.lock().head
    }

    /// The Tail register (byte offset).
    pub fn cmd_tail(&self) -> u64 {
        self.inner.cmd.lock().tail
    }

    /// The raw command in ring slot `index` (software reading back its own buffer).
    pub fn cmd_ring_entry(&self, index: usize) -> Option<RawCommand> {
        self.inner.cmd.lock().ring.get(index).copied()
    }

    /// Status.CmdBufRun: false after an illegal command stopped the consumer.
    pub fn cmd_running(&self) -> bool {
        self.inner.cmd.lock().running
    }

    /// Status.ComWaitInt: set by a `COMPLETION_WAIT` with I = 1.
    pub fn com_wait_int(&self) -> bool {
        self.inner.cmd.lock().com_wait_int
    }

    /// The encoded device table entry of `device_id`.
    pub fn read_dte(&self, device_id: u16) -> Option<RawDte> {
        self.inner
            .device_table
            .read()
            .get(usize::from(device_id))
            .copied()
    }

    /// Software writes the device table entry of `device_id` (256 bits at once, as Linux
    /// does). The IOMMU keeps using a cached copy until `INVALIDATE_DEVTAB_ENTRY`.
    ///
    /// # Errors
    ///
    /// [`AmdViError::BadDeviceId`] beyond the table, [`AmdViError::Encode`] for an entry
    /// that does not encode.
    pub fn write_dte(&self, device_id: u16, dte: &Dte) -> Result<(), AmdViError> {
        let raw = dte.encode()?;
        self.write_raw_dte(device_id, raw)
    }

    /// Software writes raw words into the entry of `device_id` (to model a malformed
    /// entry).
    ///
    /// # Errors
    ///
    /// [`AmdViError::BadDeviceId`] beyond the table.
    pub fn write_raw_dte(&self, device_id: u16, raw: RawDte) -> Result<(), AmdViError> {
        let mut table = self.inner.device_table.write();
        let slot = table
            .get_mut(usize::from(device_id))
            .ok_or(AmdViError::BadDeviceId {
                device_id,
                devices: self.inner.config.devices,
            })?;
        *slot = raw;
        Ok(())
    }

    /// Builds a translated domain (strict or lazy) with DomainID `domain_id`: a v1 table
    /// from `table` (placed at [`TABLE_REGION`] + `domain_id` * [`TABLE_REGION_STRIDE`]
    /// unless it names a base) that this IOMMU walks, invalidated through this IOMMU's
    /// command buffer. Attach devices with [`AmdVi::attach`].
    ///
    /// # Errors
    ///
    /// [`AmdViError::NotTranslated`] for a direct mode, [`AmdViError::DomainInUse`], and
    /// the table's and the DMA layer's configuration errors.
    pub fn new_domain(
        &self,
        domain_id: u16,
        config: DomainConfig,
        table: AmdV1Config,
        allocator: Arc<dyn IovaAllocator>,
    ) -> Result<AmdViDomain, AmdViError> {
        if !config.mode.is_translated() {
            return Err(AmdViError::NotTranslated { mode: config.mode });
        }
        if self.inner.domains.read().contains_key(&domain_id) {
            return Err(AmdViError::DomainInUse { domain_id });
        }
        let mut table = table;
        if table.table_base.is_none() {
            table.table_base = Some(PhysAddr::new(
                TABLE_REGION + u64::from(domain_id) * TABLE_REGION_STRIDE,
            ));
            let cap = table
                .max_table_pages
                .unwrap_or(DEFAULT_MAX_TABLE_PAGES)
                .min(DEFAULT_MAX_TABLE_PAGES);
            table.max_table_pages = Some(cap);
        }
        let v1 = AmdV1Table::new(table)?;
        let root = v1.root_pa().get();
        let tag = Asid(u32::from(domain_id));
        let wrapper = AmdViPageTable {
            bitmap: v1.page_size_bitmap(),
            range: v1.iova_range(),
            table: Arc::new(RwLock::new(v1)),
            iommu: self.inner.clone(),
            tag,
        };
        let shared = wrapper.table.clone();
        let invalidator = Arc::new(AmdViInvalidator::new(self.clone(), domain_id));
        let domain = Domain::translated(config, Box::new(wrapper), allocator, invalidator.clone())?;
        let mut domains = self.inner.domains.write();
        if domains.contains_key(&domain_id) {
            return Err(AmdViError::DomainInUse { domain_id });
        }
        domains.insert(domain_id, (root, shared.clone()));
        Ok(AmdViDomain {
            domain: Arc::new(domain),
            domain_id,
            table: shared,
            invalidator,
        })
    }

    /// Points `device_id` at `domain` (V, TV, Mode = the table's levels, its root, IR, IW,
    /// the DomainID), then flushes the DTE as Linux does: `INVALIDATE_DEVTAB_ENTRY` and a
    /// completion wait.
    ///
    /// # Errors
    ///
    /// [`AmdViError::ForeignDomain`], [`AmdViError::BadDeviceId`], and the queueing errors
    /// of [`AmdVi::queue_command`] and [`AmdVi::completion_wait`].
    pub fn attach(
        &self,
        device_id: u16,
        domain: &AmdViDomain,
        work: &mut WorkRecord,
    ) -> Result<(), AmdViError> {
        let ours = self
            .inner
            .domains
            .read()
            .get(&domain.domain_id)
            .is_some_and(|(_, t)| Arc::ptr_eq(t, &domain.table));
        if !ours {
            return Err(AmdViError::ForeignDomain {
                domain_id: domain.domain_id,
            });
        }
        let (levels, root) = domain.with_table(|t| (t.levels(), t.root_pa().get()));
        // Levels are 1..=6, so the cast is exact.
        let dte = Dte::translated(domain.domain_id, levels as u8, root);
        self.set_dte(device_id, &dte, work)
    }

    /// Gives `device_id` an identity (pass-through) DTE: Mode 0 with TV, IR and IW, as
    /// Linux's identity domain (`X86.md` §3.2), then flushes it.
    ///
    /// # Errors
    ///
    /// As [`AmdVi::attach`].
    pub fn attach_identity(
        &self,
        device_id: u16,
        domain_id: u16,
        work: &mut WorkRecord,
    ) -> Result<(), AmdViError> {
        self.set_dte(device_id, &Dte::translated(domain_id, 0, 0), work)
    }

    fn set_dte(&self, device_id: u16, dte: &Dte, work: &mut WorkRecord) -> Result<(), AmdViError> {
        self.write_dte(device_id, dte)?;
        self.queue_command(&Command::InvalidateDevtabEntry { device_id }, work)?;
        self.completion_wait(work)
    }

    // --------------------------------------------------------------------------------------
    // Driver side.

    /// Linux `iommu_queue_command_sync`: takes the command lock, queues `cmd` and writes
    /// the Tail register. See the module docs for the counts.
    ///
    /// # Errors
    ///
    /// [`AmdViError::Encode`] for a command that does not encode (nothing is written),
    /// [`AmdViError::CommandBufferTimeout`] when no space appears.
    pub fn queue_command(&self, cmd: &Command, work: &mut WorkRecord) -> Result<(), AmdViError> {
        let raw = cmd.encode()?;
        self.queue_raw(raw, work)
    }

    /// [`AmdVi::queue_command`] with raw words (a buggy or hostile driver).
    ///
    /// # Errors
    ///
    /// [`AmdViError::CommandBufferTimeout`] when no space appears.
    pub fn queue_raw(&self, raw: RawCommand, work: &mut WorkRecord) -> Result<(), AmdViError> {
        work.lock(LockId::CmdqLock);
        let mut q = self.inner.driver.lock();
        self.queue_locked(&mut q, raw, work)
    }

    fn ring_bytes(&self) -> u64 {
        CMD_BYTES << self.inner.config.cmd_log2
    }

    /// Queues one command with the command lock held.
    fn queue_locked(
        &self,
        q: &mut DriverQueue,
        raw: RawCommand,
        work: &mut WorkRecord,
    ) -> Result<(), AmdViError> {
        let size = self.ring_bytes();
        let next_tail = (q.tail + CMD_BYTES) % size;
        let mut tries = 0;
        loop {
            let left = q.cached_head.wrapping_sub(next_tail) % size;
            if left > CMD_SPACE_SLACK {
                break;
            }
            if tries > 0 {
                // udelay(1): the hardware consumes meanwhile.
                work.polls += 1;
                self.process_commands();
            }
            tries += 1;
            work.mmio_reads += 1;
            let head = self.inner.cmd.lock().head;
            if tries > 1 && head == q.cached_head && !self.cmd_running() {
                return Err(AmdViError::CommandBufferTimeout);
            }
            q.cached_head = head;
            if tries as u64 > LOOP_TIMEOUT {
                return Err(AmdViError::CommandBufferTimeout);
            }
        }
        {
            let mut hw = self.inner.cmd.lock();
            let slot = (q.tail / CMD_BYTES) as usize;
            hw.ring[slot] = raw;
            // The Tail register write.
            hw.tail = next_tail;
        }
        q.tail = next_tail;
        q.need_sync = true;
        work.commands_written += 1;
        work.mmio_writes += 1;
        Ok(())
    }

    /// Linux `iommu_completion_wait`: if commands were queued since the last wait, queue a
    /// `COMPLETION_WAIT` storing the next sequence number at the semaphore and poll for it,
    /// all under the command lock. Counts one `inval_syncs` per wait.
    ///
    /// # Errors
    ///
    /// [`AmdViError::CompletionWaitTimeout`] when the store does not arrive (the consumer
    /// stopped), and the errors of queueing.
    pub fn completion_wait(&self, work: &mut WorkRecord) -> Result<(), AmdViError> {
        work.lock(LockId::CmdqLock);
        let mut q = self.inner.driver.lock();
        if !q.need_sync {
            return Ok(());
        }
        q.seq += 1;
        let data = q.seq;
        let sem = self.inner.config.sem_addr;
        let cmd = Command::completion_wait(sem.get(), data).encode()?;
        self.queue_locked(&mut q, cmd, work)?;
        q.need_sync = false;
        work.inval_syncs += 1;
        let mut polls = 0;
        while self.read_sem() != Some(data) {
            if polls == LOOP_TIMEOUT {
                return Err(AmdViError::CompletionWaitTimeout);
            }
            // udelay(1): the hardware consumes meanwhile.
            polls += 1;
            work.polls += 1;
            self.process_commands();
        }
        Ok(())
    }

    fn read_sem(&self) -> Option<u64> {
        let mut buf = [0u8; 8];
        self.inner
            .memory
            .read(self.inner.config.sem_addr, &mut buf)
            .ok()?;
        Some(u64::from_le_bytes(buf))
    }

    // --------------------------------------------------------------------------------------
    // Hardware side: the command consumer.

    /// The consumer: decodes and applies every command from Head to Tail in order, and
    /// returns how many it applied. Stops at a command that does not decode, logging
    /// `ILLEGAL_COMMAND_ERROR` and clearing CmdBufRun (Head stays on it). Does nothing
    /// while stopped.
    pub fn process_commands(&self) -> usize {
        let mut hw = self.inner.cmd.lock();
        let size = self.ring_bytes();
        let mut done = 0;
        while hw.running && hw.head != hw.tail {
            let raw = hw.ring[(hw.head / CMD_BYTES) as usize];
            match Command::decode(raw) {
                Ok(cmd) => {
                    self.apply(&mut hw, &cmd);
                    hw.head = (hw.head + CMD_BYTES) % size;
                    done += 1;
                }
                Err(_) => {
                    hw.running = false;
                    hw.stats.illegal += 1;
                    let cmd_addr = self.inner.config.cmd_buf_base.get() + hw.head;
                    self.log_event(&Event::IllegalCommand { cmd_addr });
                }
            }
        }
        done
    }

    /// Restarts a consumer stopped by an illegal command, skipping that command (software
    /// having dealt with it), as re-enabling CmdBufEn after moving Head does.
    pub fn restart_commands(&self) {
        let mut hw = self.inner.cmd.lock();
        if !hw.running {
            hw.head = (hw.head + CMD_BYTES) % self.ring_bytes();
            hw.running = true;
        }
    }

    fn apply(&self, hw: &mut CmdBuf, cmd: &Command) {
        match *cmd {
            Command::CompletionWait {
                store,
                interrupt,
                store_addr,
                store_data,
                ..
            } => {
                hw.stats.completion_waits += 1;
                if store {
                    let bytes = store_data.to_le_bytes();
                    if self
                        .inner
                        .memory
                        .write(PhysAddr::new(store_addr), &bytes)
                        .is_err()
                    {
                        hw.stats.store_errors += 1;
                    }
                }
                if interrupt {
                    hw.com_wait_int = true;
                }
            }
            Command::InvalidateDevtabEntry { device_id } => {
                hw.stats.inv_devtab += 1;
                self.inner.caches.lock().dte.remove(&device_id);
            }
            Command::InvalidateIommuPages {
                domain_id,
                pde,
                gn,
                address,
                ..
            } => {
                hw.stats.inv_pages += 1;
                if gn {
                    // Guest (PASID) translations: none are modelled.
                    return;
                }
                let tag = Asid(u32::from(domain_id));
                let mut c = self.inner.caches.lock();
                let (tlb, pdes) = match address.span() {
                    InvSpan::All => (
                        c.iotlb.invalidate_asid(tag),
                        if pde { c.pde.invalidate_asid(tag) } else { 0 },
                    ),
                    InvSpan::Range { start, size } => {
                        let start = Iova::new(start);
                        (
                            c.iotlb.invalidate_range(tag, start, size),
                            if pde {
                                c.pde.invalidate_range(tag, start, size)
                            } else {
                                0
                            },
                        )
                    }
                };
                hw.stats.iotlb_removed += tlb as u64;
                hw.stats.pde_removed += pdes as u64;
            }
            Command::InvalidateIotlbPages { .. } => hw.stats.inv_iotlb += 1,
            Command::InvalidateInterruptTable { .. } => hw.stats.inv_irt += 1,
            Command::InvalidateIommuAll => {
                hw.stats.inv_all += 1;
                let mut c = self.inner.caches.lock();
                hw.stats.iotlb_removed += c.iotlb.invalidate_all() as u64;
                hw.stats.pde_removed += c.pde.invalidate_all() as u64;
                c.dte.clear();
            }
        }
    }

    // --------------------------------------------------------------------------------------
    // Hardware side: the event log.

    /// Appends an event; returns whether it was written (false when the log is full).
    fn log_event(&self, event: &Event) -> bool {
        let Ok(raw) = event.encode() else {
            return false;
        };
        let mut log = self.inner.events.lock();
        if log.len == log.ring.len() {
            log.overflow = true;
            log.lost += 1;
            return false;
        }
        let slot = (log.head + log.len) % log.ring.len();
        log.ring[slot] = raw;
        log.len += 1;
        log.written += 1;
        true
    }

    /// Software reads every pending event-log entry (head to tail) and clears the
    /// overflow flag. Entries that do not decode are skipped (the model writes none).
    pub fn drain_events(&self) -> Vec<Event> {
        let mut log = self.inner.events.lock();
        let mut out = Vec::with_capacity(log.len);
        while log.len > 0 {
            if let Ok(ev) = Event::decode(log.ring[log.head]) {
                out.push(ev);
            }
            log.head = (log.head + 1) % log.ring.len();
            log.len -= 1;
        }
        log.overflow = false;
        out
    }

    /// `(written, lost, overflow flag)` of the event log.
    pub fn event_log_stats(&self) -> (u64, u64, bool) {
        let log = self.inner.events.lock();
        (log.written, log.lost, log.overflow)
    }

    // --------------------------------------------------------------------------------------
    // Hardware side: translation.

    /// The DTE of `device_id` as the IOMMU sees it: from the DTE cache, else read (one
    /// `walk_reads`) and cached. `Err` for a DeviceID beyond the table or a reserved Mode.
    fn dte(&self, device_id: u16, work: &mut WorkRecord) -> Result<Dte, ()> {
        if let Some(d) = self.inner.caches.lock().dte.get(&device_id) {
            return Ok(*d);
        }
        let raw = self
            .inner
            .device_table
            .read()
            .get(usize::from(device_id))
            .copied()
            .ok_or(())?;
        work.walk_reads += 1;
        let dte = Dte::decode(raw).map_err(|_| ())?;
        self.inner.caches.lock().dte.insert(device_id, dte);
        Ok(dte)
    }

    /// Records a fault: writes its event unless suppressed, and returns it.
    fn fault(
        &self,
        device_id: u16,
        domain_id: u16,
        iova: Iova,
        access: Access,
        reason: AmdViFaultReason,
        suppress: bool,
    ) -> AmdViFault {
        let rw = if access == Access::Write {
            fault_flags::RW
        } else {
            0
        };
        let event = match reason {
            AmdViFaultReason::IllegalDte => Event::IllegalDevTableEntry {
                device_id,
                pasid: 0,
                flags: rw,
                address: iova.get(),
            },
            AmdViFaultReason::NoTranslation | AmdViFaultReason::NotPresent => Event::IoPageFault {
                device_id,
                domain_id: domain_id.into(),
                flags: 0,
                address: iova.get(),
            },
            AmdViFaultReason::InvalidEntry => Event::IoPageFault {
                device_id,
                domain_id: domain_id.into(),
                flags: fault_flags::RZ,
                address: iova.get(),
            },
            AmdViFaultReason::Permission { .. } => Event::IoPageFault {
                device_id,
                domain_id: domain_id.into(),
                flags: fault_flags::PR | fault_flags::PE | rw,
                address: iova.get(),
            },
        };
        let event_logged = !suppress && self.log_event(&event);
        AmdViFault {
            device_id,
            iova,
            access,
            reason,
            event_logged,
        }
    }

    /// The IOMMU handles a request from `device_id` for `iova`: see the module docs.
    /// Counts one `translations`, `iotlb_hits` / `iotlb_misses` / `iotlb_stale_hits`, and
    /// `walk_reads` (one per DTE read and per page-table entry read).
    ///
    /// # Errors
    ///
    /// The [`AmdViFault`], after its event-log entry was written (unless suppressed).
    pub fn translate(
        &self,
        device_id: u16,
        iova: Iova,
        access: Access,
        work: &mut WorkRecord,
    ) -> Result<AmdViTranslation, AmdViFault> {
        work.translations += 1;
        let Ok(dte) = self.dte(device_id, work) else {
            return Err(self.fault(
                device_id,
                0,
                iova,
                access,
                AmdViFaultReason::IllegalDte,
                false,
            ));
        };
        let untranslated = AmdViTranslation {
            pa: PhysAddr::new(iova.get()),
            prot: Prot::READ_WRITE,
            page_size: 1 << 12,
        };
        if !dte.valid {
            return Ok(untranslated);
        }
        let fault = |reason| {
            self.fault(
                device_id,
                dte.domain_id,
                iova,
                access,
                reason,
                dte.suppress_all,
            )
        };
        if !dte.translation_valid {
            return Err(fault(AmdViFaultReason::NoTranslation));
        }
        let needed = access.prot();
        if dte.mode == 0 {
            let had = dte.prot();
            if !had.allows(needed) {
                return Err(fault(AmdViFaultReason::Permission { had }));
            }
            return Ok(AmdViTranslation {
                prot: had,
                ..untranslated
            });
        }
        let found = self.translate_paged(&dte, iova, work).map_err(fault)?;
        let prot = Prot {
            read: found.prot.read && dte.read,
            write: found.prot.write && dte.write,
        };
        if !prot.allows(needed) {
            return Err(fault(AmdViFaultReason::Permission { had: prot }));
        }
        Ok(AmdViTranslation { prot, ..found })
    }

    /// IOTLB lookup, else a walk from the deepest PDE-cache hit, filling both caches.
    fn translate_paged(
        &self,
        dte: &Dte,
        iova: Iova,
        work: &mut WorkRecord,
    ) -> Result<AmdViTranslation, AmdViFaultReason> {
        let mode = u32::from(dte.mode);
        let tag = Asid(u32::from(dte.domain_id));
        // Address bits above the root level's reach must be zero.
        let reach = spec::level_shift(mode) + 9;
        if reach < 64 && iova.get() >> reach != 0 {
            return Err(AmdViFaultReason::NotPresent);
        }
        let table = self
            .inner
            .domains
            .read()
            .values()
            .find(|(root, _)| *root == dte.root)
            .map(|(_, t)| t.clone());
        // A root that is no table the IOMMU knows reads as zeros: not present.
        let Some(table) = table else {
            return Err(AmdViFaultReason::NotPresent);
        };
        // The table's read lock is held until the result is in the IOTLB, so an unmap
        // cannot slip between the walk and the fill.
        let table = table.read();
        let mut caches = self.inner.caches.lock();
        if let Some(hit) = caches.iotlb.lookup(tag, iova, work) {
            return Ok(AmdViTranslation {
                pa: hit.pa,
                prot: hit.prot,
                page_size: hit.page_size,
            });
        }
        let (mut level, mut table_pa) = match caches.pde.lookup_deepest(tag, iova) {
            Some(e) if 6 - (e.level as u32) <= mode => (5 - e.level as u32, e.table_pa.get()),
            _ => {
                work.full_walks += 1;
                (mode, dte.root)
            }
        };
        let mut pde_prot = Prot::READ_WRITE;
        loop {
            let index = ((iova.get() >> spec::level_shift(level)) & 511) as usize;
            let entry = table
                .read_entry(PhysAddr::new(table_pa), index)
                .unwrap_or(0);
            work.walk_reads += 1;
            match spec::decode_entry(entry, level) {
                Entry::NotPresent => return Err(AmdViFaultReason::NotPresent),
                Entry::Invalid { .. } => return Err(AmdViFaultReason::InvalidEntry),
                Entry::Table {
                    next_level,
                    table_pa: next,
                } => {
                    // Skipped levels' address bits must be zero.
                    let lo = spec::level_shift(next_level) + 9;
                    let hi = spec::level_shift(level);
                    if hi > lo && (iova.get() >> lo) & ((1u64 << (hi - lo)) - 1) != 0 {
                        return Err(AmdViFaultReason::NotPresent);
                    }
                    pde_prot.read &= entry & spec::pte::IR != 0;
                    pde_prot.write &= entry & spec::pte::IW != 0;
                    if next_level == level - 1 {
                        let _ = caches.pde.insert(
                            tag,
                            pde_level_index(level),
                            iova,
                            PhysAddr::new(next),
                        );
                    }
                    level = next_level;
                    table_pa = next;
                }
                Entry::Page {
                    pa,
                    page_shift,
                    prot,
                } => {
                    let prot = Prot {
                        read: prot.read && pde_prot.read,
                        write: prot.write && pde_prot.write,
                    };
                    let page_size = 1u64 << page_shift;
                    let offset = iova.get() & (page_size - 1);
                    // Pages above the IOTLB's largest size are cached as a fragment.
                    let cached = page_shift.min(MAX_PAGE_SHIFT);
                    let frag = offset & !((1u64 << cached) - 1);
                    let _ = caches.iotlb.insert(
                        tag,
                        Iova::new(iova.get() - offset + frag),
                        PhysAddr::new(pa + frag),
                        1 << cached,
                        prot,
                    );
                    drop(caches);
                    drop(table);
                    return Ok(AmdViTranslation {
                        pa: PhysAddr::new(pa + offset),
                        prot,
                        page_size,
                    });
                }
            }
        }
    }
}
