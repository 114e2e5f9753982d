//! The SMMUv3 as a whole: a linear stream table, context descriptors, the IOTLB and walk
//! cache, the command queue that invalidates them, and the event queue that records faults.
//!
//! # Driver side
//!
//! [`Smmuv3::new_domain`] builds a translated [`Domain`] whose page table is an LPAE table
//! the SMMU can walk ([`Smmuv3PageTable`]) and whose [`Invalidator`](crate::dma::Invalidator)
//! issues real commands through the SMMU's command queue ([`Smmuv3Invalidator`]).
//! [`Smmuv3::attach`] points a stream's STE at the domain's context descriptor (and issues
//! `CMD_CFGI_STE` + `CMD_SYNC`, as a driver does after writing an STE);
//! [`Smmuv3::attach_bypass`] and [`Smmuv3::attach_abort`] set the other configurations.
//!
//! # Device side
//!
//! [`Smmuv3::translate`] is what the SMMU does with a device's transaction: read the STE;
//! for a bypass STE the physical address is the input address (no lookup, no walk); for a
//! stage-1 STE, look up the IOTLB page by page (`iotlb_hits` / `iotlb_misses`, and
//! `iotlb_stale_hits` for entries whose mapping is gone), and on a miss walk the table from
//! the deepest walk-cache hit (`walk_reads`, one per descriptor read), fill the walk cache
//! and the IOTLB. A fault records an event (`F_TRANSLATION`, `F_PERMISSION`, `C_BAD_STE`,
//! `C_BAD_STREAMID`) in the bounded event queue; an abort STE terminates the transaction
//! without an event, as the architecture says.
//!
//! # Stale entries
//!
//! [`Smmuv3PageTable`] wraps the domain's LPAE table. When the DMA layer unmaps, the wrapper
//! clears the entries and, under the same table lock, marks the IOTLB entries of the range
//! stale ([`Iotlb::mark_stale_range`](crate::iotlb::Iotlb::mark_stale_range)). They keep
//! translating until a TLBI removes them: at once in strict mode (the gathered ranges are
//! invalidated before the unmap returns), at the next flush in lazy mode (the flush queue's
//! `CMD_TLBI_NH_ASID`). Every hit on them in between is a counted stale hit. Seeing the
//! removal in the page table itself needs no change to the DMA layer or the
//! [`Invalidator`](crate::dma::Invalidator) trait, covers both modes and the map error paths,
//! and leaves no window in which a removed mapping hits as fresh.
//!
//! # Locks
//!
//! Order: domain state, then the LPAE table, then the caches. A walk holds the table's read
//! lock until its result is in the IOTLB, so an unmap cannot slip between the walk and the
//! fill (the filled entry would never be marked stale). The consumer takes only the caches'
//! lock; nothing holding the caches' lock issues commands.

use std::collections::BTreeSet;
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use super::caches::{tlb_tag, Caches, SinkStats, TlbCaches};
use super::cmdq::{CmdqConfig, CmdqError, CmdqProducer, ProducerKind};
use super::events::{EventId, EventQueue, EventRecord, MAX_EVTQ_LOG2SIZE, MIN_EVTQ_LOG2SIZE};
use super::invalidator::Smmuv3Invalidator;
use super::spec::{Command, StreamWorld};
use super::stream::{ContextDescriptor, Ste, SteConfig, CD_BYTES};
use crate::addr::{Access, Iova, PhysAddr, Prot};
use crate::dma::{DmaError, Domain, DomainConfig, DomainMode, PhysRange};
use crate::iotlb::{Asid, CacheConfigError, IotlbConfig, WalkCacheConfig};
use crate::iova::IovaAllocator;
use crate::mem::PhysMemory;
use crate::pgtable::lpae::{spec as lpae_spec, LpaeConfig, LpaeConfigError, LpaeTable, WalkStep};
use crate::pgtable::{IoPageTable, PgTableError, Translation, UnmapGather};
use crate::work::WorkRecord;

/// Most stream table entries (a linear table of 2^16 StreamIDs).
pub const MAX_STREAMS: u32 = 1 << 16;
/// Most context descriptors (one per 16-bit ASID).
pub const MAX_CONTEXTS: usize = 1 << 16;
/// Simulated physical address of context descriptor 0; descriptor `n` is `n * 64` above.
pub const CD_TABLE_BASE: PhysAddr = PhysAddr::new(0x3000_0000);

/// How to build an [`Smmuv3`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Smmuv3Config {
    /// Stream table entries (StreamIDs `0..streams`), 1 to [`MAX_STREAMS`].
    pub streams: u32,
    /// IOTLB geometry (default: gem5's main TLB, 2048 entries 4-way).
    pub iotlb: IotlbConfig,
    /// Walk-cache geometry (default: gem5's, 4/28/348/4 entries per level).
    pub walk_cache: WalkCacheConfig,
    /// Command queue size, placement and consumer mode.
    pub cmdq: CmdqConfig,
    /// Which producer design inserts commands.
    pub producer: ProducerKind,
    /// Whether the SMMU implements range invalidation (SMMUv3.2, `IDR3.RIL`): what
    /// [`Smmuv3::idr3`] advertises.
    pub range_invalidation: bool,
    /// Whether the driver sends range commands when [`Smmuv3::idr3`] advertises `RIL`
    /// (Linux 5.7 and later: "iommu/arm-smmu-v3: Add support for TLB range invalidation
    /// operations"; `linux::DmaPathVariants::range_invalidation`). Default: yes.
    pub driver_range_invalidation: bool,
    /// Event queue size as log2 of records, `MIN_EVTQ_LOG2SIZE..=MAX_EVTQ_LOG2SIZE`.
    pub evtq_log2size: u32,
    /// Without range invalidation, replace a range needing at least this many single-page
    /// commands by one `CMD_TLBI_NH_ASID` (Linux's `CMDQ_MAX_TLBI_OPS`, 512, used for SVA).
    /// `None` (default): always per page, as Linux's DMA path.
    pub max_tlbi_ops: Option<u64>,
    /// Whether the SMMU supports hypervisor stage-1 contexts (`IDR0.HYP`, bit 9): what
    /// [`Smmuv3::idr0`] advertises. Default: no.
    pub hyp: bool,
    /// Whether the kernel runs at EL2 with VHE (arm64 `ARM64_HAS_VIRT_HOST_EXTN`, as a KVM
    /// host on ARMv8.1+). With [`Smmuv3Config::hyp`] it gives the driver E2H
    /// ([`Smmuv3::uses_e2h`]). Default: no.
    pub host_vhe: bool,
    /// Whether the driver uses E2H when the SMMU and the kernel allow it (Linux 5.12 and
    /// later: "iommu/arm-smmu-v3: Add support for VHE";
    /// `linux::DmaPathVariants::smmuv3_e2h`). Default: yes.
    pub driver_e2h: bool,
}

impl Default for Smmuv3Config {
    /// 256 streams, gem5's main TLB and walk cache, a 256-slot self-service command queue
    /// with the lock-free producer, range invalidation, a 128-record event queue.
    fn default() -> Self {
        Smmuv3Config {
            streams: 256,
            iotlb: IotlbConfig::gem5_main_tlb(),
            walk_cache: WalkCacheConfig::gem5(),
            cmdq: CmdqConfig::default(),
            producer: ProducerKind::LockFree,
            range_invalidation: true,
            driver_range_invalidation: true,
            evtq_log2size: 7,
            max_tlbi_ops: None,
            hyp: false,
            host_vhe: false,
            driver_e2h: true,
        }
    }
}

/// Why an SMMU operation failed. The SMMU is unchanged when an error is returned.
#[derive(Debug, thiserror::Error)]
pub enum Smmuv3Error {
    /// The stream table size is out of range.
    #[error("A stream table of {streams} entries is outside 1..={max}")]
    BadStreamTable {
        /// The size asked for.
        streams: u32,
        /// [`MAX_STREAMS`].
        max: u32,
    },
    /// The event queue size is out of range.
    #[error(
        "Event-queue log2size {log2size} is outside {MIN_EVTQ_LOG2SIZE}..={MAX_EVTQ_LOG2SIZE}"
    )]
    BadEventQueue {
        /// The size asked for.
        log2size: u32,
    },
    /// The caches could not be built.
    #[error("Cannot build the SMMU's caches")]
    Caches(#[from] CacheConfigError),
    /// The command queue could not be built or refused commands.
    #[error("Command queue error")]
    Cmdq(#[from] CmdqError),
    /// A StreamID beyond the stream table.
    #[error("StreamID {sid} is beyond the {streams}-entry stream table")]
    BadStreamId {
        /// The StreamID given.
        sid: u32,
        /// Entries in the table.
        streams: u32,
    },
    /// The ASID already belongs to a context.
    #[error("ASID {asid} is already in use")]
    AsidInUse {
        /// The ASID given.
        asid: u16,
    },
    /// A domain of another SMMU.
    #[error("The domain with ASID {asid} does not belong to this SMMU")]
    ForeignDomain {
        /// The domain's ASID.
        asid: u16,
    },
    /// A mode without translation (use [`Smmuv3::attach_bypass`] for passthrough).
    #[error("SMMUv3 domains are translated: {mode:?} is not supported")]
    NotTranslated {
        /// The mode asked for.
        mode: DomainMode,
    },
    /// The page table could not be built.
    #[error("Cannot build the page table")]
    Table(#[from] LpaeConfigError),
    /// The DMA layer refused the assembled domain.
    #[error("Cannot assemble the domain")]
    Domain(#[from] DmaError),
}

/// Why a transaction failed.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum SmmuFaultReason {
    /// The StreamID is beyond the stream table (`C_BAD_STREAMID`).
    BadStreamId,
    /// The STE is invalid (`C_BAD_STE`).
    BadSte,
    /// The STE aborts the stream's transactions (no event).
    Aborted,
    /// No translation (`F_TRANSLATION`).
    Translation,
    /// The translation does not allow the access (`F_PERMISSION`).
    Permission {
        /// What the cached or walked translation grants.
        had: Prot,
    },
    /// The translated physical address is outside memory (an external abort; no event).
    OutsideMemory {
        /// The first physical address outside memory.
        pa: PhysAddr,
    },
}

impl SmmuFaultReason {
    /// The event the SMMU records for this fault, if any.
    pub const fn event_id(self) -> Option<EventId> {
        match self {
            SmmuFaultReason::BadStreamId => Some(EventId::BadStreamId),
            SmmuFaultReason::BadSte => Some(EventId::BadSte),
            SmmuFaultReason::Translation => Some(EventId::Translation),
            SmmuFaultReason::Permission { .. } => Some(EventId::Permission),
            SmmuFaultReason::Aborted | SmmuFaultReason::OutsideMemory { .. } => None,
        }
    }
}

/// A failed transaction: which stream, where, which way, why, and whether its event made it
/// into the event queue.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, thiserror::Error)]
#[error("Stream {stream_id} {access:?} fault at IOVA {iova}: {reason:?}")]
pub struct SmmuFault {
    /// The StreamID.
    pub stream_id: u32,
    /// The first input address that faulted.
    pub iova: Iova,
    /// The access.
    pub access: Access,
    /// Why.
    pub reason: SmmuFaultReason,
    /// Whether an event was written (false when the fault has none or the queue was full).
    pub event_recorded: bool,
}

/// Faults an SMMU raised and what became of their event records ([`Smmuv3::fault_stats`]).
/// The counts are exact whether or not the records fit in the event queue.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub struct SmmuFaultStats {
    /// `F_TRANSLATION` events raised.
    pub translation: u64,
    /// `F_PERMISSION` events raised.
    pub permission: u64,
    /// `C_BAD_STE` events raised.
    pub bad_ste: u64,
    /// `C_BAD_STREAMID` events raised.
    pub bad_stream_id: u64,
    /// Records written to the event queue.
    pub events_written: u64,
    /// Records lost because the queue was full.
    pub events_lost: u64,
    /// Overflow episodes (`SMMU_EVTQ_PROD.OVFLG` toggles).
    pub event_queue_overflows: u64,
    /// Records waiting in the queue now.
    pub event_queue_len: usize,
    /// Records the queue holds.
    pub event_queue_capacity: usize,
}

/// One context: its descriptor and the table its TTB points at (the model's stand-in for
/// the memory the walker reads).
struct Context {
    cd: ContextDescriptor,
    table: Arc<RwLock<LpaeTable>>,
}

/// The stream table and the context descriptors.
struct Streams {
    ste: Vec<Ste>,
    contexts: Vec<Context>,
    asids: BTreeSet<u16>,
}

/// What an STE lookup resolved to.
enum Target<'a> {
    Bypass,
    Translate {
        asid: u16,
        world: StreamWorld,
        input_bits: u32,
        table: &'a RwLock<LpaeTable>,
    },
}

/// An SMMUv3. Thread-safe: every method takes `&self`. See the module docs.
pub struct Smmuv3 {
    config: Smmuv3Config,
    caches: Arc<TlbCaches>,
    cmdq: Arc<dyn CmdqProducer<Sink = Arc<TlbCaches>>>,
    streams: RwLock<Streams>,
    events: Mutex<EventQueue>,
}

impl std::fmt::Debug for Smmuv3 {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Smmuv3")
            .field("streams", &self.config.streams)
            .field("producer", &self.config.producer)
            .field("range_invalidation", &self.config.range_invalidation)
            .field(
                "driver_range_invalidation",
                &self.config.driver_range_invalidation,
            )
            .field("e2h", &self.uses_e2h())
            .field("contexts", &self.streams.read().contexts.len())
            .finish_non_exhaustive()
    }
}

/// A translated domain built by [`Smmuv3::new_domain`]: the DMA-API [`Domain`] and its
/// SMMU context.
#[derive(Clone)]
pub struct SmmuDomain {
    domain: Arc<Domain>,
    asid: u16,
    cd: usize,
    table: Arc<RwLock<LpaeTable>>,
    invalidator: Arc<Smmuv3Invalidator>,
}

impl std::fmt::Debug for SmmuDomain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SmmuDomain")
            .field("asid", &self.asid)
            .field("cd", &self.cd)
            .field("domain", &self.domain)
            .finish()
    }
}

impl SmmuDomain {
    /// The DMA-API domain (map, unmap, flush-queue control).
    pub fn domain(&self) -> &Arc<Domain> {
        &self.domain
    }

    /// The domain's ASID.
    pub fn asid(&self) -> u16 {
        self.asid
    }

    /// Index of its context descriptor in the SMMU's context table.
    pub fn cd_index(&self) -> usize {
        self.cd
    }

    /// The domain's invalidator.
    pub fn invalidator(&self) -> &Arc<Smmuv3Invalidator> {
        &self.invalidator
    }

    /// Runs `f` on the domain's LPAE table (read-only).
    pub fn with_table<R>(&self, f: impl FnOnce(&LpaeTable) -> R) -> R {
        f(&self.table.read())
    }
}

/// The page table of an SMMUv3 domain: an [`LpaeTable`] shared with the SMMU's walker,
/// which marks IOTLB entries stale when their mapping is removed. See the module docs.
pub struct Smmuv3PageTable {
    table: Arc<RwLock<LpaeTable>>,
    caches: Arc<TlbCaches>,
    asid: Asid,
    name: &'static str,
    bitmap: u64,
    range: (Iova, Iova),
}

impl IoPageTable for Smmuv3PageTable {
    fn format_name(&self) -> &'static str {
        self.name
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
        self.caches
            .lock()
            .iotlb
            .mark_stale_range(self.asid, iova, size);
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

impl Smmuv3 {
    /// An SMMU with every STE invalid and empty caches and queues.
    pub fn new(config: Smmuv3Config) -> Result<Self, Smmuv3Error> {
        if config.streams == 0 || config.streams > MAX_STREAMS {
            return Err(Smmuv3Error::BadStreamTable {
                streams: config.streams,
                max: MAX_STREAMS,
            });
        }
        if !(MIN_EVTQ_LOG2SIZE..=MAX_EVTQ_LOG2SIZE).contains(&config.evtq_log2size) {
            return Err(Smmuv3Error::BadEventQueue {
                log2size: config.evtq_log2size,
            });
        }
        let caches = Arc::new(TlbCaches::new(config.iotlb, config.walk_cache.clone())?);
        let cmdq: Arc<dyn CmdqProducer<Sink = Arc<TlbCaches>>> =
            config.producer.build(config.cmdq, caches.clone())?.into();
        Ok(Smmuv3 {
            caches,
            cmdq,
            streams: RwLock::new(Streams {
                ste: vec![Ste::INVALID; config.streams as usize],
                contexts: Vec::new(),
                asids: BTreeSet::new(),
            }),
            events: Mutex::new(EventQueue::new(config.evtq_log2size)),
            config,
        })
    }

    /// The configuration it was built with.
    pub fn config(&self) -> &Smmuv3Config {
        &self.config
    }

    /// `SMMU_IDR3` as the driver reads it: [`IDR3_RIL`](super::spec::IDR3_RIL) when the SMMU
    /// implements range invalidation (the register's other fields are not modelled).
    pub fn idr3(&self) -> u32 {
        if self.config.range_invalidation {
            super::spec::IDR3_RIL
        } else {
            0
        }
    }

    /// `SMMU_IDR0` as the driver reads it: [`IDR0_HYP`](super::spec::IDR0_HYP) when the SMMU
    /// supports hypervisor contexts (the register's other fields are not modelled).
    pub fn idr0(&self) -> u32 {
        if self.config.hyp {
            super::spec::IDR0_HYP
        } else {
            0
        }
    }

    /// Whether the driver uses E2H (Linux `ARM_SMMU_FEAT_E2H`): the SMMU advertises
    /// `IDR0.HYP`, the kernel runs at EL2 with VHE ([`Smmuv3Config::host_vhe`]) and the
    /// driver has E2H support ([`Smmuv3Config::driver_e2h`], 5.12 and later). Then stage-1
    /// STEs say `STRW` = EL2 and the domains' TLBIs take their EL2 forms.
    pub fn uses_e2h(&self) -> bool {
        self.idr0() & super::spec::IDR0_HYP != 0 && self.config.host_vhe && self.config.driver_e2h
    }

    /// The regime of this SMMU's stage-1 streams as the driver configures them:
    /// [`StreamWorld::El2`] with E2H, else [`StreamWorld::NsEl1`].
    pub fn stream_world(&self) -> StreamWorld {
        if self.uses_e2h() {
            StreamWorld::El2
        } else {
            StreamWorld::NsEl1
        }
    }

    /// Whether the driver invalidates ranges with range commands: the SMMU advertises
    /// `IDR3.RIL` and the driver uses it ([`Smmuv3Config::driver_range_invalidation`]).
    pub fn uses_range_invalidation(&self) -> bool {
        self.idr3() & super::spec::IDR3_RIL != 0 && self.config.driver_range_invalidation
    }

    /// The command queue (its registers, consumer statistics and producer).
    pub fn cmdq(&self) -> &dyn CmdqProducer<Sink = Arc<TlbCaches>> {
        &*self.cmdq
    }

    /// The IOTLB and walk cache.
    pub fn caches(&self) -> &TlbCaches {
        &self.caches
    }

    /// What the command-queue consumer has applied to the caches.
    pub fn sink_stats(&self) -> SinkStats {
        self.caches.stats()
    }

    /// The stream table entry of `sid`.
    pub fn ste(&self, sid: u32) -> Option<Ste> {
        self.streams.read().ste.get(sid as usize).copied()
    }

    /// Context descriptor `index`.
    pub fn context_descriptor(&self, index: usize) -> Option<ContextDescriptor> {
        self.streams.read().contexts.get(index).map(|c| c.cd)
    }

    /// Builds a translated domain (strict or lazy) with ASID `asid`: an LPAE table from
    /// `table` that the SMMU walks, invalidated through this SMMU's command queue, and its
    /// context descriptor. Attach streams to it with [`Smmuv3::attach`].
    pub fn new_domain(
        &self,
        asid: u16,
        config: DomainConfig,
        table: LpaeConfig,
        allocator: Arc<dyn IovaAllocator>,
    ) -> Result<SmmuDomain, Smmuv3Error> {
        if !config.mode.is_translated() {
            return Err(Smmuv3Error::NotTranslated { mode: config.mode });
        }
        if self.streams.read().asids.contains(&asid) {
            return Err(Smmuv3Error::AsidInUse { asid });
        }
        let lpae = LpaeTable::new(table)?;
        let cd = ContextDescriptor {
            asid,
            ttb: lpae.root_pa(),
            granule: table.granule,
            t0sz: (64 - table.ias) as u8,
            oas: table.oas,
            coherent_walk: table.coherent_walk,
        };
        let granule_shift = lpae.granule_shift();
        let world = self.stream_world();
        let wrapper = Smmuv3PageTable {
            name: lpae.format_name(),
            bitmap: lpae.page_size_bitmap(),
            range: lpae.iova_range(),
            table: Arc::new(RwLock::new(lpae)),
            caches: self.caches.clone(),
            asid: tlb_tag(asid, world),
        };
        let table = wrapper.table.clone();
        let invalidator = Arc::new(
            Smmuv3Invalidator::new(
                asid,
                granule_shift,
                self.uses_range_invalidation(),
                self.config.max_tlbi_ops,
                self.cmdq.clone(),
            )
            .with_world(world),
        );
        let domain = Domain::translated(config, Box::new(wrapper), allocator, invalidator.clone())?;
        let mut streams = self.streams.write();
        if !streams.asids.insert(asid) {
            return Err(Smmuv3Error::AsidInUse { asid });
        }
        let index = streams.contexts.len();
        debug_assert!(index < MAX_CONTEXTS, "one context per 16-bit ASID");
        streams.contexts.push(Context {
            cd,
            table: table.clone(),
        });
        Ok(SmmuDomain {
            domain: Arc::new(domain),
            asid,
            cd: index,
            table,
            invalidator,
        })
    }

    /// Points stream `sid` at `domain` (a stage-1 STE with the domain's context descriptor,
    /// `STRW` = EL2 with E2H, else NS-EL1), then issues `CMD_CFGI_STE` and a `CMD_SYNC` as a
    /// driver does after writing an STE.
    pub fn attach(
        &self,
        sid: u32,
        domain: &SmmuDomain,
        work: &mut WorkRecord,
    ) -> Result<(), Smmuv3Error> {
        {
            let streams = self.streams.read();
            let ours = streams
                .contexts
                .get(domain.cd)
                .is_some_and(|c| Arc::ptr_eq(&c.table, &domain.table));
            if !ours {
                return Err(Smmuv3Error::ForeignDomain { asid: domain.asid });
            }
        }
        let cd_addr = CD_TABLE_BASE.add(domain.cd as u64 * CD_BYTES);
        self.set_ste(
            sid,
            Ste {
                valid: true,
                config: SteConfig::Translate {
                    cd: domain.cd,
                    cd_addr,
                    strw: self.stream_world(),
                },
            },
            work,
        )
    }

    /// Makes stream `sid` bypass translation (passthrough): the physical address is the
    /// input address.
    pub fn attach_bypass(&self, sid: u32, work: &mut WorkRecord) -> Result<(), Smmuv3Error> {
        let ste = Ste {
            valid: true,
            config: SteConfig::Bypass,
        };
        self.set_ste(sid, ste, work)
    }

    /// Makes stream `sid` abort every transaction, without recording events.
    pub fn attach_abort(&self, sid: u32, work: &mut WorkRecord) -> Result<(), Smmuv3Error> {
        let ste = Ste {
            valid: true,
            config: SteConfig::Abort,
        };
        self.set_ste(sid, ste, work)
    }

    /// Invalidates stream `sid`'s STE: its transactions then fault with `C_BAD_STE`.
    pub fn detach(&self, sid: u32, work: &mut WorkRecord) -> Result<(), Smmuv3Error> {
        self.set_ste(sid, Ste::INVALID, work)
    }

    fn set_ste(&self, sid: u32, ste: Ste, work: &mut WorkRecord) -> Result<(), Smmuv3Error> {
        {
            let mut streams = self.streams.write();
            let streams_len = streams.ste.len() as u32;
            let slot = streams
                .ste
                .get_mut(sid as usize)
                .ok_or(Smmuv3Error::BadStreamId {
                    sid,
                    streams: streams_len,
                })?;
            *slot = ste;
        }
        self.cmdq
            .issue(&[Command::CfgiSte { sid, leaf: true }], true, work)?;
        Ok(())
    }

    /// Records the event of `reason` (if it has one) and builds the fault.
    fn fault(&self, sid: u32, iova: Iova, access: Access, reason: SmmuFaultReason) -> SmmuFault {
        let event_recorded = reason.event_id().is_some_and(|id| {
            self.events
                .lock()
                .push(&EventRecord::new(id, sid, iova, access))
        });
        SmmuFault {
            stream_id: sid,
            iova,
            access,
            reason,
            event_recorded,
        }
    }

    /// What stream `sid`'s STE says to do, from the stream table `streams` (the caller
    /// keeps its read lock while it uses the target: no reference count to take).
    fn target(streams: &Streams, sid: u32) -> Result<Target<'_>, SmmuFaultReason> {
        let ste = streams
            .ste
            .get(sid as usize)
            .ok_or(SmmuFaultReason::BadStreamId)?;
        if !ste.valid {
            return Err(SmmuFaultReason::BadSte);
        }
        match ste.config {
            SteConfig::Abort => Err(SmmuFaultReason::Aborted),
            SteConfig::Bypass => Ok(Target::Bypass),
            SteConfig::Translate { cd, strw, .. } => {
                let c = streams.contexts.get(cd).ok_or(SmmuFaultReason::BadSte)?;
                Ok(Target::Translate {
                    asid: c.cd.asid,
                    world: strw,
                    input_bits: c.cd.input_bits(),
                    table: &c.table,
                })
            }
        }
    }

    /// Translates one address: IOTLB, else a walk from the deepest walk-cache hit, filling
    /// both caches. `None` on a translation fault.
    #[inline]
    fn translate_one(
        &self,
        asid: Asid,
        table: &RwLock<LpaeTable>,
        iova: Iova,
        work: &mut WorkRecord,
    ) -> Option<(PhysAddr, Prot, u64)> {
        let mut c = self.caches.lock();
        if let Some(hit) = c.iotlb.lookup(asid, iova, work) {
            return Some((hit.pa, hit.prot, hit.page_size));
        }
        // The lock order is table before caches: holding the caches, only try the table's
        // read lock (never wait for it). Got at once, the caches were held since the miss,
        // so the fill knows the page is not cached; else let go and take both in order.
        // Both held until the IOTLB is filled.
        let (t, mut c, missed) = match table.try_read() {
            Some(t) => (t, c, true),
            None => {
                drop(c);
                let t = table.read();
                (t, self.caches.lock(), false)
            }
        };
        Self::walk_and_fill(&t, &mut c, asid, iova, work, missed)
    }

    /// The walk after an IOTLB miss of `iova`, from the deepest walk-cache hit: counts its
    /// reads, fills the walk cache and the IOTLB. `missed`: the caches have been held since
    /// the IOTLB lookup missed (the fill need not look for the page).
    #[inline]
    fn walk_and_fill(
        t: &LpaeTable,
        c: &mut Caches,
        asid: Asid,
        iova: Iova,
        work: &mut WorkRecord,
        missed: bool,
    ) -> Option<(PhysAddr, Prot, u64)> {
        let resume = c.walk.lookup_deepest_table(asid, iova);
        work.full_walks += u64::from(resume.is_none());
        let gshift = t.granule_shift();
        let on_step = |step: &WalkStep| {
            work.walk_reads += 1;
            if let lpae_spec::Descriptor::Table { next_table } =
                lpae_spec::decode(step.desc, step.level, gshift)
            {
                let level = step.level as usize;
                // Cache only at levels whose span matches the table's geometry.
                let fits = c
                    .walk
                    .config()
                    .levels
                    .get(level)
                    .is_some_and(|l| l.span_shift == t.level_shift(step.level));
                if fits {
                    let _ = c.walk.insert(asid, level, iova, next_table);
                }
            }
        };
        let walked = match resume {
            Some((level, table_pa)) if level < 3 => {
                t.walk_from_each(level as u32 + 1, table_pa, iova, on_step)
            }
            _ => t.walk_each(iova, on_step),
        };
        let tr = walked?;
        let offset = iova.offset_in(tr.page_size);
        let base_pa = PhysAddr::new(tr.pa.get() - offset);
        let page = iova.align_down(tr.page_size);
        if missed {
            c.iotlb
                .insert_after_miss(asid, page, base_pa, tr.page_size, tr.prot);
        } else {
            let _ = c.iotlb.insert(asid, page, base_pa, tr.page_size, tr.prot);
        }
        Some((tr.pa, tr.prot, tr.page_size))
    }

    /// The SMMU handles a transaction of `len` bytes at `iova` from stream `sid`: the
    /// physical ranges it reaches, or the fault (recorded in the event queue when the fault
    /// has an event). See the module docs. Counts `translations` (one per page looked up),
    /// `iotlb_hits`, `iotlb_misses`, `iotlb_stale_hits` and `walk_reads`.
    pub fn translate(
        &self,
        sid: u32,
        iova: Iova,
        len: u64,
        access: Access,
        work: &mut WorkRecord,
    ) -> Result<Vec<PhysRange>, SmmuFault> {
        let mut out = Vec::new();
        self.translate_into(sid, iova, len, access, &mut out, work)?;
        Ok(out)
    }

    /// [`Smmuv3::translate`] into a caller's buffer (cleared first; on a fault it holds
    /// the ranges before the faulting page), so a hot loop can reuse one allocation.
    pub fn translate_into(
        &self,
        sid: u32,
        iova: Iova,
        len: u64,
        access: Access,
        out: &mut Vec<PhysRange>,
        work: &mut WorkRecord,
    ) -> Result<(), SmmuFault> {
        out.clear();
        if len == 0 {
            return Ok(());
        }
        // Held for the whole translation (the lock order: stream table, page table, caches;
        // only STE and context updates write it).
        let streams = self.streams.read();
        let target =
            Self::target(&streams, sid).map_err(|reason| self.fault(sid, iova, access, reason))?;
        let last = iova.get().checked_add(len - 1);
        match target {
            Target::Bypass => {
                work.translations += 1;
                if last.is_none() {
                    // The access wraps the address space: it faults where it wraps.
                    return Err(self.fault(
                        sid,
                        Iova::new(0),
                        access,
                        SmmuFaultReason::Translation,
                    ));
                }
                out.push(PhysRange {
                    pa: PhysAddr::new(iova.get()),
                    len,
                });
                Ok(())
            }
            Target::Translate {
                asid,
                world,
                input_bits,
                table,
            } => {
                let tag = tlb_tag(asid, world);
                let limit = 1u64 << input_bits;
                let needed = access.prot();
                let mut cur = iova.get();
                let mut remaining = len;
                while remaining > 0 {
                    work.translations += 1;
                    // An input address beyond T0SZ's range is a translation fault.
                    let found = if cur < limit {
                        self.translate_one(tag, table, Iova::new(cur), work)
                    } else {
                        None
                    };
                    let at = Iova::new(cur);
                    let Some((pa, prot, page_size)) = found else {
                        return Err(self.fault(sid, at, access, SmmuFaultReason::Translation));
                    };
                    if !prot.allows(needed) {
                        let reason = SmmuFaultReason::Permission { had: prot };
                        return Err(self.fault(sid, at, access, reason));
                    }
                    let chunk = remaining.min(page_size - (cur & (page_size - 1)));
                    match out.last_mut() {
                        Some(l) if l.pa.get() + l.len == pa.get() => l.len += chunk,
                        _ => out.push(PhysRange { pa, len: chunk }),
                    }
                    cur = cur.wrapping_add(chunk);
                    remaining -= chunk;
                }
                Ok(())
            }
        }
    }

    /// Translates and checks every range lies in `mem`.
    fn translate_in(
        &self,
        sid: u32,
        mem: &PhysMemory,
        iova: Iova,
        len: u64,
        access: Access,
        work: &mut WorkRecord,
    ) -> Result<Vec<PhysRange>, SmmuFault> {
        let ranges = self.translate(sid, iova, len, access, work)?;
        let mut off = 0;
        for r in &ranges {
            if mem.check_range(r.pa, r.len).is_err() {
                let inside = mem.size().saturating_sub(r.pa.get()).min(r.len);
                let reason = SmmuFaultReason::OutsideMemory {
                    pa: r.pa.add(inside),
                };
                return Err(self.fault(sid, iova.add(off + inside), access, reason));
            }
            off += r.len;
        }
        Ok(ranges)
    }

    /// Stream `sid` reads `buf.len()` bytes at `iova` (a transmit). Either every byte
    /// moves or none does. A stale IOTLB entry still reaches the old page.
    pub fn dma_read(
        &self,
        sid: u32,
        mem: &PhysMemory,
        iova: Iova,
        buf: &mut [u8],
        work: &mut WorkRecord,
    ) -> Result<(), SmmuFault> {
        let ranges = self.translate_in(sid, mem, iova, buf.len() as u64, Access::Read, work)?;
        let mut done = 0usize;
        for r in &ranges {
            let n = r.len as usize;
            let read = mem.read(r.pa, &mut buf[done..done + n]);
            debug_assert!(read.is_ok(), "checked range failed: {read:?}");
            done += n;
        }
        work.dma_bytes += done as u64;
        Ok(())
    }

    /// Stream `sid` writes `data` at `iova` (a receive). Either every byte moves or none
    /// does.
    pub fn dma_write(
        &self,
        sid: u32,
        mem: &PhysMemory,
        iova: Iova,
        data: &[u8],
        work: &mut WorkRecord,
    ) -> Result<(), SmmuFault> {
        let ranges = self.translate_in(sid, mem, iova, data.len() as u64, Access::Write, work)?;
        let mut done = 0usize;
        for r in &ranges {
            let n = r.len as usize;
            let written = mem.write(r.pa, &data[done..done + n]);
            debug_assert!(written.is_ok(), "checked range failed: {written:?}");
            done += n;
        }
        work.dma_bytes += done as u64;
        Ok(())
    }

    /// Runs `f` on the event queue (read records, check or acknowledge overflow).
    pub fn with_events<R>(&self, f: impl FnOnce(&mut EventQueue) -> R) -> R {
        f(&mut self.events.lock())
    }

    /// Reads and removes every event record, oldest first.
    pub fn drain_events(&self) -> Vec<EventRecord> {
        self.events.lock().drain()
    }

    /// The faults the SMMU has raised so far, by kind, and what became of their records.
    pub fn fault_stats(&self) -> SmmuFaultStats {
        let q = self.events.lock();
        SmmuFaultStats {
            translation: q.raised(EventId::Translation),
            permission: q.raised(EventId::Permission),
            bad_ste: q.raised(EventId::BadSte),
            bad_stream_id: q.raised(EventId::BadStreamId),
            events_written: q.written(),
            events_lost: q.lost(),
            event_queue_overflows: q.overflows(),
            event_queue_len: q.len(),
            event_queue_capacity: q.capacity(),
        }
    }
}
