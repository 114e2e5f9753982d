//! An SMMUv3 as one device's DMA path, for timing models that need the device side to go
//! through the SMMU's caches.
//!
//! [`Smmuv3DevicePath`] builds a translated [`Domain`] on an [`Smmuv3`] (so every unmap's
//! invalidation is a real `CMD_TLBI_NH_VA` / `CMD_TLBI_NH_ASID`, or their EL2 forms with
//! E2H, plus `CMD_SYNC` that the queue's consumer applies to the IOTLB and walk cache) and
//! attaches the device's stream to it. The device's DMA then translates through [`Smmuv3::translate`]: an IOTLB hit, or a
//! walk that starts at the deepest walk-cache entry and counts one `walk_reads` per table
//! read it still has to make. In strict mode an unmap evicts the entries before it returns;
//! in lazy mode they stay (and a device can still hit them) until the flush queue's
//! invalidation runs.
//!
//! The CPU side and the queue's timing are separate concerns: the unmap's [`WorkRecord`]
//! holds both what the CPU did (IOVA free, PTE clears) and what the producer did on the
//! command queue (slots written, PROD writes, CAS, lock, polls). A lab that times the
//! queue itself takes the queue's part out with [`split_queue_work`] and charges only the
//! rest as CPU work.
//!
//! As a [`DmaPath`] (platform `"smmuv3"`), drivers map and unmap through the domain and the
//! device's accesses go through the SMMU; [`Smmuv3DevicePath::protection`] then reports
//! *measured* stale hits (device accesses that succeeded through an IOTLB entry whose
//! mapping had been removed) and the SMMU's translation and permission faults (each one an
//! event record in the bounded event queue, [`Smmuv3::fault_stats`]).

use std::sync::Arc;

use super::{DmaPath, MappedBuffer, MappedSg};
use crate::addr::{Access, DmaAddr, Iova, PhysAddr};
use crate::dma::{
    Device, Direction, DmaError, DmaFault, DmaMapping, Domain, DomainConfig, FaultReason,
    PhysRange, ProtectionCounters, ProtectionStats, Rejected, SgEntry,
};
use crate::iova::IovaAllocator;
use crate::pgtable::lpae::LpaeConfig;
use crate::smmuv3::{SmmuDomain, SmmuFault, SmmuFaultReason, Smmuv3, Smmuv3Config, Smmuv3Error};
use crate::work::{LockId, WorkRecord};

/// What an operation did on the command queue, taken out of its work record by
/// [`split_queue_work`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueWork {
    /// Commands written into the queue, syncs included.
    pub commands: u64,
    /// `CMD_SYNC`s among them (each one waited for).
    pub syncs: u64,
    /// PROD register writes (the spinlock producer writes one per slot, the lock-free one
    /// one per owned batch).
    pub prod_writes: u64,
}

impl QueueWork {
    /// Invalidation commands (the commands that are not syncs).
    pub fn invalidations(&self) -> u64 {
        self.commands - self.syncs.min(self.commands)
    }
}

/// Moves the command-queue producer's counters out of `work`: returns the commands, syncs
/// and PROD writes, and clears every producer counter (`commands_written`, `mmio_writes`,
/// `mmio_reads`, `cas_attempts`, `cas_failures`, `owner_elections`, `polls`, and the
/// command-queue locks), so what is left is the CPU's own work. `inval_syncs` stays: the
/// DMA layer's request for a sync is CPU work too.
///
/// Only meaningful for a record of DMA-API calls on a domain whose invalidations go through
/// an SMMUv3 command queue (the only producer of these counters on that path).
pub fn split_queue_work(work: &mut WorkRecord) -> QueueWork {
    let q = QueueWork {
        commands: work.commands_written,
        syncs: work.inval_syncs,
        prod_writes: work.mmio_writes,
    };
    work.commands_written = 0;
    work.mmio_writes = 0;
    work.mmio_reads = 0;
    work.cas_attempts = 0;
    work.cas_failures = 0;
    work.owner_elections = 0;
    work.polls = 0;
    work.locks[LockId::CmdqLock as usize] = 0;
    work.locks[LockId::CmdqSharedLock as usize] = 0;
    q
}

/// One device's DMA through an SMMUv3: the DMA-API domain the driver maps with, and the
/// device-side translation through the SMMU's IOTLB and walk cache. See the module docs.
pub struct Smmuv3DevicePath {
    smmu: Smmuv3,
    domain: SmmuDomain,
    sid: u32,
    /// Stale hits measured on the device side.
    stale: ProtectionCounters,
}

impl std::fmt::Debug for Smmuv3DevicePath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Smmuv3DevicePath")
            .field("sid", &self.sid)
            .field("domain", &self.domain)
            .finish_non_exhaustive()
    }
}

impl Smmuv3DevicePath {
    /// An SMMU built from `smmu`, a translated domain with ASID `asid` over an LPAE table
    /// `table` and IOVAs from `allocator`, and `device`'s stream (its id as StreamID)
    /// attached to it. `config.mode` must be strict or lazy. Attaching issues
    /// `CMD_CFGI_STE` and a `CMD_SYNC`; that set-up work is not returned.
    pub fn new(
        smmu: Smmuv3Config,
        asid: u16,
        config: DomainConfig,
        table: LpaeConfig,
        allocator: Arc<dyn IovaAllocator>,
        device: &Device,
    ) -> Result<Self, Smmuv3Error> {
        let smmu = Smmuv3::new(smmu)?;
        let domain = smmu.new_domain(asid, config, table, allocator)?;
        let sid = device.id();
        smmu.attach(sid, &domain, &mut WorkRecord::new())?;
        Ok(Smmuv3DevicePath {
            smmu,
            domain,
            sid,
            stale: ProtectionCounters::new(),
        })
    }

    /// What the path has left the device able to reach: the domain's figures (sub-page
    /// exposure, deferred unmaps, the unmap-to-flush window), the stale hits measured in the
    /// SMMU's IOTLB by the device's successful accesses through this path, and the SMMU's
    /// translation and permission faults (raised events, whether or not their records fit
    /// in the event queue).
    pub fn protection(&self) -> ProtectionStats {
        let mut p = self.domain().protection();
        let measured = self.stale.snapshot();
        p.stale_hits = measured.stale_hits;
        p.stale_bytes = measured.stale_bytes;
        let f = self.smmu.fault_stats();
        p.translation_faults += f.translation;
        p.permission_faults += f.permission;
        p
    }

    /// The DMA-API domain drivers map and unmap with.
    pub fn domain(&self) -> &Arc<Domain> {
        self.domain.domain()
    }

    /// The SMMU (caches, command queue statistics, event queue).
    pub fn smmu(&self) -> &Smmuv3 {
        &self.smmu
    }

    /// The device's StreamID.
    pub fn sid(&self) -> u32 {
        self.sid
    }

    /// Invalidation issues the command queue refused so far (never expected: the
    /// invalidator builds valid commands in batches that fit the queue).
    pub fn invalidation_errors(&self) -> u64 {
        self.domain.invalidator().errors()
    }

    /// Maps one buffer (Linux `dma_map_page`); see [`Domain::map_page`].
    pub fn map_page(
        &self,
        dev: &Device,
        pa: PhysAddr,
        len: u64,
        dir: Direction,
        cpu: usize,
        work: &mut WorkRecord,
    ) -> Result<DmaMapping, DmaError> {
        self.domain().map_page(dev, pa, len, dir, cpu, work)
    }

    /// The device moves `len` bytes at `addr`: the physical ranges it reaches through the
    /// IOTLB (or a walk through the walk cache), or the SMMU's fault. Adds `translations`,
    /// `iotlb_hits`, `iotlb_misses`, `iotlb_stale_hits` and `walk_reads` to `work`.
    pub fn device_translate(
        &self,
        addr: DmaAddr,
        len: u64,
        access: Access,
        work: &mut WorkRecord,
    ) -> Result<Vec<PhysRange>, SmmuFault> {
        self.translate_stream(self.sid, addr, len, access, work)
    }

    /// [`Smmuv3DevicePath::device_translate`] into a caller's buffer (cleared first), so a
    /// device model moving many buffers reuses one allocation.
    pub fn device_translate_into(
        &self,
        addr: DmaAddr,
        len: u64,
        access: Access,
        out: &mut Vec<PhysRange>,
        work: &mut WorkRecord,
    ) -> Result<(), SmmuFault> {
        self.translate_stream_into(self.sid, addr, len, access, out, work)
    }

    /// Translates for stream `sid`, counting a successful access that used a stale IOTLB
    /// entry as a stale hit.
    fn translate_stream(
        &self,
        sid: u32,
        addr: DmaAddr,
        len: u64,
        access: Access,
        work: &mut WorkRecord,
    ) -> Result<Vec<PhysRange>, SmmuFault> {
        let mut out = Vec::new();
        self.translate_stream_into(sid, addr, len, access, &mut out, work)?;
        Ok(out)
    }

    /// [`Self::translate_stream`] into `out`.
    fn translate_stream_into(
        &self,
        sid: u32,
        addr: DmaAddr,
        len: u64,
        access: Access,
        out: &mut Vec<PhysRange>,
        work: &mut WorkRecord,
    ) -> Result<(), SmmuFault> {
        let before = work.iotlb_stale_hits;
        let r = self
            .smmu
            .translate_into(sid, Iova::new(addr.0), len, access, out, work);
        if r.is_ok() && work.iotlb_stale_hits > before {
            self.stale.record_stale_hit(len);
        }
        r
    }
}

/// The DMA layer's view of an SMMU fault.
fn dma_fault(device: u32, access: Access, f: SmmuFault) -> DmaFault {
    let reason = match f.reason {
        SmmuFaultReason::Permission { had } => FaultReason::Permission {
            needed: access.prot(),
            had,
        },
        SmmuFaultReason::OutsideMemory { pa } => FaultReason::OutsideMemory { pa: pa.get() },
        SmmuFaultReason::Translation
        | SmmuFaultReason::BadStreamId
        | SmmuFaultReason::BadSte
        | SmmuFaultReason::Aborted => FaultReason::Unmapped,
    };
    DmaFault {
        device,
        dma: DmaAddr(f.iova.get()),
        access,
        reason,
    }
}

/// Drivers map and unmap through the domain; the device (its id is its StreamID) reaches
/// memory through the SMMU: IOTLB, walk cache, faults recorded in the event queue.
impl DmaPath for Smmuv3DevicePath {
    fn platform(&self) -> &'static str {
        "smmuv3"
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
        DmaPath::map_single(&**self.domain(), dev, pa, len, dir, cpu, work)
    }

    fn unmap_single(
        &self,
        buf: MappedBuffer,
        cpu: usize,
        now_ns: u64,
        work: &mut WorkRecord,
    ) -> Result<(), Rejected<MappedBuffer>> {
        DmaPath::unmap_single(&**self.domain(), buf, cpu, now_ns, work)
    }

    fn map_sg(
        &self,
        dev: &Device,
        entries: &[SgEntry],
        dir: Direction,
        cpu: usize,
        work: &mut WorkRecord,
    ) -> Result<MappedSg, DmaError> {
        DmaPath::map_sg(&**self.domain(), dev, entries, dir, cpu, work)
    }

    fn unmap_sg(
        &self,
        sg: MappedSg,
        cpu: usize,
        now_ns: u64,
        work: &mut WorkRecord,
    ) -> Result<(), Rejected<MappedSg>> {
        DmaPath::unmap_sg(&**self.domain(), sg, cpu, now_ns, work)
    }

    fn translate(
        &self,
        dev: &Device,
        dma: DmaAddr,
        len: u64,
        access: Access,
        work: &mut WorkRecord,
    ) -> Result<Vec<PhysRange>, DmaFault> {
        self.translate_stream(dev.id(), dma, len, access, work)
            .map_err(|f| dma_fault(dev.id(), access, f))
    }

    fn device_translate_into(
        &self,
        _dev: &Device,
        dma: DmaAddr,
        len: u64,
        access: Access,
        out: &mut Vec<PhysRange>,
        work: &mut WorkRecord,
    ) -> Result<(), String> {
        // The SMMU's own model (the device is the path's stream).
        Smmuv3DevicePath::device_translate_into(self, dma, len, access, out, work)
            .map_err(|f| f.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::addr::SZ_4K;
    use crate::dma::DomainMode;
    use crate::iova::linux::{IovaSpaceConfig, LinuxIovaAllocator};
    use crate::smmuv3::ProducerKind;

    fn path(mode: DomainMode) -> (Smmuv3DevicePath, Device) {
        let dev = Device::new(3, 64).unwrap();
        let alloc =
            LinuxIovaAllocator::new(IovaSpaceConfig::new(SZ_4K, Iova::new(1 << 40))).unwrap();
        let p = Smmuv3DevicePath::new(
            Smmuv3Config {
                producer: ProducerKind::LockFree,
                range_invalidation: false,
                ..Smmuv3Config::default()
            },
            5,
            DomainConfig::new(crate::dma::DomainId(1), mode),
            LpaeConfig::new(SZ_4K, 48, 48),
            Arc::new(alloc),
            &dev,
        )
        .unwrap();
        (p, dev)
    }

    /// Maps one 4 KiB page at `pa` for the device to write (as a read's buffer is mapped).
    fn map_4k(p: &Smmuv3DevicePath, dev: &Device, pa: u64, w: &mut WorkRecord) -> DmaMapping {
        p.map_page(dev, PhysAddr::new(pa), SZ_4K, Direction::FromDevice, 0, w)
            .unwrap()
    }

    #[test]
    fn first_access_walks_then_hits_the_iotlb() {
        let (p, dev) = path(DomainMode::Strict);
        let mut w = WorkRecord::new();
        let m = map_4k(&p, &dev, 0x8000_0000, &mut w);
        let mut first = WorkRecord::new();
        let r = p
            .device_translate(m.dma_addr(), SZ_4K, Access::Write, &mut first)
            .unwrap();
        assert_eq!(r[0].pa, PhysAddr::new(0x8000_0000));
        assert_eq!((first.iotlb_misses, first.iotlb_hits), (1, 0));
        // A cold walk of a 4-level table reads every level.
        assert_eq!(first.walk_reads, 4);
        let mut second = WorkRecord::new();
        p.device_translate(m.dma_addr(), SZ_4K, Access::Write, &mut second)
            .unwrap();
        assert_eq!((second.iotlb_hits, second.walk_reads), (1, 0));
    }

    #[test]
    fn translate_into_clears_the_buffer_and_matches_translate() {
        let (p, dev) = path(DomainMode::Strict);
        let mut w = WorkRecord::new();
        let a = map_4k(&p, &dev, 0x8000_0000, &mut w);
        let stale = PhysRange {
            pa: PhysAddr::new(1),
            len: 1,
        };
        // A buffer holding leftovers from an earlier use.
        let mut out = vec![stale; 3];
        let mut wi = WorkRecord::new();
        p.device_translate_into(a.dma_addr(), SZ_4K, Access::Write, &mut out, &mut wi)
            .unwrap();
        let mut wv = WorkRecord::new();
        let v = p
            .device_translate(a.dma_addr(), SZ_4K, Access::Write, &mut wv)
            .unwrap();
        assert_eq!(out, v);
        assert_eq!(
            out,
            vec![PhysRange {
                pa: PhysAddr::new(0x8000_0000),
                len: SZ_4K
            }]
        );
        assert_eq!(wi.translations, wv.translations);
        // A fault leaves an error and no stale entries from before the call.
        let unmapped = DmaAddr(a.dma_addr().0 + 16 * SZ_4K);
        let r = p.device_translate_into(unmapped, SZ_4K, Access::Write, &mut out, &mut wi);
        assert!(r.is_err());
        assert!(out.iter().all(|r| *r != stale));
    }

    #[test]
    fn walk_cache_shortens_the_walk_of_a_neighbour_page() {
        let (p, dev) = path(DomainMode::Strict);
        let mut w = WorkRecord::new();
        let a = map_4k(&p, &dev, 0x8000_0000, &mut w);
        let b = map_4k(&p, &dev, 0x8000_1000, &mut w);
        let mut wa = WorkRecord::new();
        p.device_translate(a.dma_addr(), SZ_4K, Access::Write, &mut wa)
            .unwrap();
        let mut wb = WorkRecord::new();
        p.device_translate(b.dma_addr(), SZ_4K, Access::Write, &mut wb)
            .unwrap();
        assert_eq!(wb.iotlb_misses, 1);
        assert!(
            wb.walk_reads < wa.walk_reads,
            "{} vs {}",
            wb.walk_reads,
            wa.walk_reads
        );
    }

    #[test]
    fn strict_unmap_evicts_the_entry_and_the_queue_work_splits_out() {
        let (p, dev) = path(DomainMode::Strict);
        let mut w = WorkRecord::new();
        let m = map_4k(&p, &dev, 0x8000_0000, &mut w);
        let dma = m.dma_addr();
        p.device_translate(dma, SZ_4K, Access::Write, &mut WorkRecord::new())
            .unwrap();
        assert_eq!(p.smmu().caches().lock().iotlb.len(), 1);
        let mut u = WorkRecord::new();
        p.domain().unmap_page(m, 0, 0, &mut u).unwrap();
        assert_eq!(
            p.smmu().caches().lock().iotlb.len(),
            0,
            "strict: evicted at unmap"
        );
        let q = split_queue_work(&mut u);
        // One CMD_TLBI_NH_VA and one CMD_SYNC, one PROD write for the batch.
        assert_eq!(
            q,
            QueueWork {
                commands: 2,
                syncs: 1,
                prod_writes: 1
            }
        );
        assert_eq!(q.invalidations(), 1);
        assert_eq!(
            (u.commands_written, u.mmio_writes, u.cas_attempts),
            (0, 0, 0)
        );
        assert!(u.ptes_cleared >= 1, "the CPU's part stays");
        // The device now faults.
        assert!(p
            .device_translate(dma, SZ_4K, Access::Write, &mut WorkRecord::new())
            .is_err());
    }

    #[test]
    fn lazy_unmap_leaves_the_entry_until_the_flush() {
        let (p, dev) = path(DomainMode::Lazy);
        let mut w = WorkRecord::new();
        let m = map_4k(&p, &dev, 0x8000_0000, &mut w);
        let dma = m.dma_addr();
        p.device_translate(dma, SZ_4K, Access::Write, &mut WorkRecord::new())
            .unwrap();
        let mut u = WorkRecord::new();
        p.domain().unmap_page(m, 0, 0, &mut u).unwrap();
        assert_eq!(
            split_queue_work(&mut u).commands,
            0,
            "lazy: no command at unmap"
        );
        // The stale entry still translates: the window lazy mode accepts.
        let mut s = WorkRecord::new();
        let r = p
            .device_translate(dma, SZ_4K, Access::Write, &mut s)
            .unwrap();
        assert_eq!(r[0].pa, PhysAddr::new(0x8000_0000));
        assert_eq!((s.iotlb_hits, s.iotlb_stale_hits), (1, 1));
        let mut f = WorkRecord::new();
        p.domain().flush_all(&mut f);
        assert!(split_queue_work(&mut f).syncs >= 1);
        assert_eq!(p.smmu().caches().lock().iotlb.len(), 0, "flushed");
        assert!(p
            .device_translate(dma, SZ_4K, Access::Write, &mut WorkRecord::new())
            .is_err());
    }

    #[test]
    fn as_a_dma_path_lazy_counts_measured_stale_hits_and_strict_faults() {
        for mode in [DomainMode::Strict, DomainMode::Lazy] {
            let (p, dev) = path(mode);
            let mut w = WorkRecord::new();
            let buf = DmaPath::map_single(
                &p,
                &dev,
                PhysAddr::new(0x8000_0000),
                512,
                Direction::ToDevice,
                0,
                &mut w,
            )
            .unwrap();
            let dma = buf.dma_addr();
            // The legitimate read fills the IOTLB; a write is a permission fault.
            DmaPath::translate(&p, &dev, dma, 512, Access::Read, &mut w).unwrap();
            let e = DmaPath::translate(&p, &dev, dma, 64, Access::Write, &mut w).unwrap_err();
            assert!(matches!(e.reason, FaultReason::Permission { .. }), "{e:?}");
            DmaPath::unmap_single(&p, buf, 0, 0, &mut w).unwrap();
            let after = DmaPath::translate(&p, &dev, dma, 64, Access::Read, &mut w);
            let s = p.protection();
            assert_eq!(s.permission_faults, 1, "{mode:?}");
            assert_eq!(s.max_subpage_exposed_bytes, SZ_4K - 512);
            if mode == DomainMode::Strict {
                assert!(after.is_err());
                assert_eq!((s.stale_hits, s.translation_faults), (0, 1));
            } else {
                assert_eq!(after.unwrap()[0].pa, PhysAddr::new(0x8000_0000));
                assert_eq!((s.stale_hits, s.stale_bytes), (1, 64));
                assert_eq!(s.translation_faults, 0);
            }
            let f = p.smmu().fault_stats();
            assert_eq!(
                f.events_written,
                s.translation_faults + s.permission_faults,
                "each fault is an event record"
            );
        }
    }
}
