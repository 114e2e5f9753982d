//! Hardware models: how each platform's IOMMU turns DMA-API calls into work.
//!
//! - [`ipmmu`]: Renesas IPMMU-VMSA. Plugs into the generic [`Domain`]: a non-coherent
//!   32-bit-input LPAE table ([`ipmmu::IpmmuPageTable`]) and a whole-context flush by register
//!   write and poll ([`ipmmu::IpmmuInvalidator`]); strict mode only.
//! - [`sba`]: HP zx1 SBA IOMMU ([`sba::SbaIommu`]): the I/O pdir and resource bitmap, purges
//!   batched after 64 frees, bypass for devices whose mask covers the buffer, and
//!   scatter-gather virtual merging (switchable).
//! - [`pseries`]: IBM POWER TCE windows under a hypervisor ([`pseries::PseriesIommu`]): the
//!   default window behind H_PUT_TCE / H_PUT_TCE_INDIRECT / H_STUFF_TCE, and dynamic DMA
//!   windows in direct or dynamic mode.
//!
//! The lab's device models call every platform through one trait, [`DmaPath`], implemented
//! here for the generic [`Domain`] (SMMUv3, IPMMU, or no IOMMU) and for the two models that
//! have their own mapping paths. Handles ([`MappedBuffer`], [`MappedSg`]) are
//! platform-neutral values that can only be undone by the path that made them; a handle
//! given to another path comes back in a [`Rejected`] with [`DmaError::WrongDomain`].
//!
//! Each model also keeps its own running statistics (bypasses, hypercalls by kind, flushes)
//! next to the [`WorkRecord`] counts, for things the work record has no field for.

pub mod ipmmu;
pub mod pseries;
pub mod sba;
pub mod smmuv3_path;
pub mod x86_path;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use crate::addr::{Access, DmaAddr, PhysAddr};
use crate::dma::{
    Device, Direction, DmaError, DmaFault, DmaMapping, DmaSegment, DmaSgMapping, DomainId,
    PhysRange, Rejected, SgEntry,
};
use crate::dma::{Domain, ProtectionCounters};
use crate::work::WorkRecord;

pub use ipmmu::{ipmmu_domain, IpmmuError, IpmmuInvalidator, IpmmuPageTable};
pub use pseries::{PseriesConfig, PseriesError, PseriesIommu};
pub use sba::{SbaError, SbaIommu, SbaIommuConfig};
pub use smmuv3_path::{split_queue_work, QueueWork, Smmuv3DevicePath};
pub use x86_path::{X86DevicePath, X86PathError, X86Unit};

/// A DMA mapping path as device drivers use it, whatever the platform: map and unmap single
/// buffers and scatter-gather lists, and (device side) translate an access.
///
/// Every call adds what it did to `work`. `cpu` is the calling CPU (per-CPU caches and pool
/// hashing use it); `now_ns` is the caller's clock (lazy flush-queue timers use it). A failed
/// call leaves the path's state unchanged; a failed unmap returns the handle.
pub trait DmaPath: Send + Sync {
    /// A short name for reports ("domain", "sba", "pseries").
    fn platform(&self) -> &'static str;

    /// Maps `len` bytes at `pa` for `dev` (Linux `dma_map_single` / `dma_map_page`).
    fn map_single(
        &self,
        dev: &Device,
        pa: PhysAddr,
        len: u64,
        dir: Direction,
        cpu: usize,
        work: &mut WorkRecord,
    ) -> Result<MappedBuffer, DmaError>;

    /// Unmaps a buffer mapped by [`DmaPath::map_single`] on this path.
    fn unmap_single(
        &self,
        buf: MappedBuffer,
        cpu: usize,
        now_ns: u64,
        work: &mut WorkRecord,
    ) -> Result<(), Rejected<MappedBuffer>>;

    /// Maps a scatter-gather list for `dev` (Linux `dma_map_sg`). The result's segments are
    /// what the driver puts in its descriptors: how many there are depends on the platform's
    /// merging.
    fn map_sg(
        &self,
        dev: &Device,
        entries: &[SgEntry],
        dir: Direction,
        cpu: usize,
        work: &mut WorkRecord,
    ) -> Result<MappedSg, DmaError>;

    /// Unmaps a list mapped by [`DmaPath::map_sg`] on this path.
    fn unmap_sg(
        &self,
        sg: MappedSg,
        cpu: usize,
        now_ns: u64,
        work: &mut WorkRecord,
    ) -> Result<(), Rejected<MappedSg>>;

    /// The device side: translates an access of `len` bytes at `dma` to physical ranges, as
    /// the platform's IOMMU (or its bypass) would, or reports the fault.
    fn translate(
        &self,
        dev: &Device,
        dma: DmaAddr,
        len: u64,
        access: Access,
        work: &mut WorkRecord,
    ) -> Result<Vec<PhysRange>, DmaFault>;

    /// The device side as a device model drives it: `dev`'s access of `len` bytes at `dma`
    /// translated into `out` (cleared first) through the unit's caches where the path
    /// models them (an SMMUv3's or an x86 unit's IOTLB and walk caches, counting
    /// `translations`, `iotlb_hits`, `iotlb_misses`, `iotlb_stale_hits` and `walk_reads`
    /// in `work`); a fault is the unit's message. By default [`DmaPath::translate`].
    fn device_translate_into(
        &self,
        dev: &Device,
        dma: DmaAddr,
        len: u64,
        access: Access,
        out: &mut Vec<PhysRange>,
        work: &mut WorkRecord,
    ) -> Result<(), String> {
        let ranges = self
            .translate(dev, dma, len, access, work)
            .map_err(|e| e.to_string())?;
        out.clear();
        out.extend(ranges);
        Ok(())
    }
}

/// The platform-specific part of a [`MappedBuffer`].
#[derive(Debug, PartialEq, Eq)]
enum BufferToken {
    Domain(DmaMapping),
    Sba(sba::SbaSingle),
    Pseries(pseries::PseriesSingle),
}

/// A buffer mapped through a [`DmaPath`]. Unmap it with [`DmaPath::unmap_single`] on the
/// same path; dropping it leaks the mapping, as forgetting to unmap does in a driver.
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a DMA mapping stays live until it is unmapped"]
pub struct MappedBuffer {
    dma: DmaAddr,
    len: u64,
    dir: Direction,
    owner: DomainId,
    untranslated: bool,
    token: BufferToken,
}

impl MappedBuffer {
    /// The address the device uses for the buffer's first byte.
    pub fn dma_addr(&self) -> DmaAddr {
        self.dma
    }

    /// Length of the buffer in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the buffer is empty (never: mappings are at least one byte).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The direction it was mapped for.
    pub fn direction(&self) -> Direction {
        self.dir
    }

    /// The id of the domain (or IOMMU instance) that mapped it.
    pub fn owner(&self) -> DomainId {
        self.owner
    }

    /// Whether the device reaches the buffer without translation (an SBA bypass or a
    /// direct DDW on POWER, or a domain without translation).
    pub fn is_untranslated(&self) -> bool {
        self.untranslated
    }
}

/// The platform-specific part of a [`MappedSg`]. Boxed: a scatter-gather mapping allocates
/// its segment list anyway, and a small handle keeps [`Rejected`] small.
#[derive(Debug, PartialEq, Eq)]
enum SgToken {
    Domain(Box<DmaSgMapping>),
    Sba(Box<sba::SbaSg>),
    Pseries(Box<pseries::PseriesSg>),
}

/// A scatter-gather list mapped through a [`DmaPath`]: the DMA segments for the device.
/// Unmap it with [`DmaPath::unmap_sg`] on the same path.
#[derive(Debug, PartialEq, Eq)]
#[must_use = "a DMA mapping stays live until it is unmapped"]
pub struct MappedSg {
    nents: usize,
    dir: Direction,
    owner: DomainId,
    token: SgToken,
}

impl MappedSg {
    /// The DMA segments, in order: what the driver writes into its descriptors.
    pub fn segments(&self) -> &[DmaSegment] {
        match &self.token {
            SgToken::Domain(m) => m.segments(),
            SgToken::Sba(s) => &s.segments,
            SgToken::Pseries(p) => &p.segments,
        }
    }

    /// Number of DMA segments.
    pub fn segment_count(&self) -> usize {
        self.segments().len()
    }

    /// Number of entries of the list that was mapped.
    pub fn nents(&self) -> usize {
        self.nents
    }

    /// The direction it was mapped for.
    pub fn direction(&self) -> Direction {
        self.dir
    }

    /// The id of the domain (or IOMMU instance) that mapped it.
    pub fn owner(&self) -> DomainId {
        self.owner
    }
}

/// A process-wide unique number for each model instance, so a handle from one instance is
/// never accepted by another even when both were given the same [`DomainId`].
pub(crate) fn next_instance() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// The error for a handle made by another path.
fn wrong_owner(handle_owner: DomainId, this: DomainId) -> DmaError {
    DmaError::WrongDomain {
        mapping_domain: handle_owner,
        domain: this,
    }
}

/// Checks that a handle made by model instance `instance` belongs to `this_instance`; if not,
/// the error names the handle's owner and `this` path's domain.
pub(crate) fn same_instance(
    instance: u64,
    this_instance: u64,
    handle_owner: DomainId,
    this: DomainId,
) -> Result<(), DmaError> {
    if instance == this_instance {
        Ok(())
    } else {
        Err(wrong_owner(handle_owner, this))
    }
}

/// Takes one slot of a cap of `limit` live mappings counted in `live` (the SBA and pSeries
/// paths), or says the cap of `domain` is reached and leaves the count as it was.
pub(crate) fn take_live_slot(
    live: &AtomicUsize,
    limit: usize,
    domain: DomainId,
) -> Result<(), DmaError> {
    if live.fetch_add(1, Ordering::Relaxed) >= limit {
        live.fetch_sub(1, Ordering::Relaxed);
        return Err(DmaError::TooManyMappings { domain, limit });
    }
    Ok(())
}

/// Checks a scatter-gather list as every path does: non-empty, every entry at least one
/// byte and not wrapping the address space, the total fitting in 64 bits.
pub(crate) fn check_sg(entries: &[SgEntry]) -> Result<u64, DmaError> {
    if entries.is_empty() {
        return Err(DmaError::EmptySgList);
    }
    let mut total: u64 = 0;
    for (index, e) in entries.iter().enumerate() {
        if e.len == 0 || e.pa.checked_add(e.len).is_none() {
            return Err(DmaError::BadSgEntry {
                index,
                pa: e.pa.get(),
                len: e.len,
            });
        }
        total = total.checked_add(e.len).ok_or(DmaError::SgTooLarge)?;
    }
    Ok(total)
}

/// Checks a single buffer: at least one byte, not wrapping the address space.
pub(crate) fn check_buffer(pa: PhysAddr, len: u64) -> Result<(), DmaError> {
    if len == 0 || pa.checked_add(len).is_none() {
        return Err(DmaError::BadBuffer { pa: pa.get(), len });
    }
    Ok(())
}

/// The fault for an access beyond the device's DMA mask, at its first unreachable byte.
fn beyond_mask(dev: &Device, dma: u64, access: Access) -> DmaFault {
    DmaFault {
        device: dev.id(),
        dma: DmaAddr(dma.max(dev.dma_mask().saturating_add(1))),
        access,
        reason: crate::dma::FaultReason::BeyondMask {
            mask_bits: dev.mask_bits(),
        },
    }
}

/// The device side every model shares: an empty access reaches nothing, one beyond the
/// device's DMA mask faults, anything else is the platform's to translate (`platform` gets
/// the address and says whether the access bypassed translation). Each outcome is counted in
/// `counters`: a bypass, a translation fault or a permission fault.
pub(crate) fn device_access(
    dev: &Device,
    dma: DmaAddr,
    len: u64,
    access: Access,
    counters: &ProtectionCounters,
    platform: impl FnOnce(u64) -> Result<(Vec<PhysRange>, bool), DmaFault>,
) -> Result<Vec<PhysRange>, DmaFault> {
    if len == 0 {
        return Ok(Vec::new());
    }
    let result = if dev.reaches(dma.0, len) {
        platform(dma.0)
    } else {
        Err(beyond_mask(dev, dma.0, access))
    };
    match result {
        Ok((ranges, bypass)) => {
            if bypass {
                counters.record_bypass();
            }
            Ok(ranges)
        }
        Err(fault) => {
            counters.record_fault(&fault.reason);
            Err(fault)
        }
    }
}

/// The generic domain (SMMUv3, IPMMU, no IOMMU, passthrough): a thin adapter over
/// [`Domain::map_page`], [`Domain::map_sg`] and [`Domain::translate`].
impl DmaPath for Domain {
    fn platform(&self) -> &'static str {
        "domain"
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
        let m = self.map_page(dev, pa, len, dir, cpu, work)?;
        Ok(MappedBuffer {
            dma: m.dma_addr(),
            len,
            dir,
            owner: self.id(),
            untranslated: !self.mode().is_translated(),
            token: BufferToken::Domain(m),
        })
    }

    fn unmap_single(
        &self,
        buf: MappedBuffer,
        cpu: usize,
        now_ns: u64,
        work: &mut WorkRecord,
    ) -> Result<(), Rejected<MappedBuffer>> {
        // The handle's other fields stay in `buf` to rebuild it around a rejected token.
        match buf.token {
            BufferToken::Domain(m) => self.unmap_page(m, cpu, now_ns, work).map_err(|r| Rejected {
                handle: MappedBuffer {
                    token: BufferToken::Domain(r.handle),
                    ..buf
                },
                error: r.error,
            }),
            token => Err(Rejected {
                error: wrong_owner(buf.owner, self.id()),
                handle: MappedBuffer { token, ..buf },
            }),
        }
    }

    fn map_sg(
        &self,
        dev: &Device,
        entries: &[SgEntry],
        dir: Direction,
        cpu: usize,
        work: &mut WorkRecord,
    ) -> Result<MappedSg, DmaError> {
        let m = Domain::map_sg(self, dev, entries, dir, cpu, work)?;
        Ok(MappedSg {
            nents: entries.len(),
            dir,
            owner: self.id(),
            token: SgToken::Domain(Box::new(m)),
        })
    }

    fn unmap_sg(
        &self,
        sg: MappedSg,
        cpu: usize,
        now_ns: u64,
        work: &mut WorkRecord,
    ) -> Result<(), Rejected<MappedSg>> {
        // As in `unmap_single`: the other fields stay in `sg` to rebuild a rejected handle.
        match sg.token {
            SgToken::Domain(m) => {
                Domain::unmap_sg(self, *m, cpu, now_ns, work).map_err(|r| Rejected {
                    handle: MappedSg {
                        token: SgToken::Domain(Box::new(r.handle)),
                        ..sg
                    },
                    error: r.error,
                })
            }
            token => Err(Rejected {
                error: wrong_owner(sg.owner, self.id()),
                handle: MappedSg { token, ..sg },
            }),
        }
    }

    fn translate(
        &self,
        dev: &Device,
        dma: DmaAddr,
        len: u64,
        access: Access,
        work: &mut WorkRecord,
    ) -> Result<Vec<PhysRange>, DmaFault> {
        Domain::translate(self, dev, dma, len, access, work)
    }
}

/// Helpers shared by the platform paths' unit tests.
#[cfg(test)]
pub(crate) mod test_support {
    use super::{DmaPath, MappedBuffer};
    use crate::addr::{Access, DmaAddr, PhysAddr};
    use crate::dma::{Device, Direction, DmaError, PhysRange};
    use crate::work::WorkRecord;

    /// Maps `len` bytes at physical address `pa` through `path` for `dev` to be read by the
    /// device (`Direction::ToDevice`), on CPU 0.
    pub(crate) fn map_to_device(
        path: &dyn DmaPath,
        dev: &Device,
        pa: u64,
        len: u64,
        w: &mut WorkRecord,
    ) -> Result<MappedBuffer, DmaError> {
        path.map_single(dev, PhysAddr::new(pa), len, Direction::ToDevice, 0, w)
    }

    /// Asserts that `dev` reaching `len` bytes at `dma` through `path` for `access` lands in
    /// one physically contiguous range: `len` bytes at `pa`.
    pub(crate) fn assert_translates_to(
        path: &dyn DmaPath,
        dev: &Device,
        dma: DmaAddr,
        len: u64,
        access: Access,
        pa: u64,
        w: &mut WorkRecord,
    ) {
        let ranges = path.translate(dev, dma, len, access, w).unwrap();
        let pa = PhysAddr::new(pa);
        assert_eq!(ranges, vec![PhysRange { pa, len }]);
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::{assert_translates_to, map_to_device};
    use super::*;
    use crate::addr::{Iova, SZ_4G, SZ_4K};
    use crate::dma::{DomainConfig, DomainMode, ImmediateInvalidator};
    use crate::iova::linux::{IovaSpaceConfig, LinuxIovaAllocator};
    use crate::pgtable::lpae::{LpaeConfig, LpaeTable};
    use std::sync::Arc;

    fn strict_domain(id: u32) -> Domain {
        let table = LpaeTable::new(LpaeConfig::new(SZ_4K, 48, 48)).unwrap();
        let alloc =
            LinuxIovaAllocator::new(IovaSpaceConfig::new(SZ_4K, Iova::new(1 << 48))).unwrap();
        Domain::translated(
            DomainConfig::new(DomainId(id), DomainMode::Strict),
            Box::new(table),
            Arc::new(alloc),
            Arc::new(ImmediateInvalidator::new()),
        )
        .unwrap()
    }

    #[test]
    fn passthrough_domain_reaches_the_physical_address_without_a_walk() {
        let d = Domain::direct(DomainConfig::new(DomainId(1), DomainMode::Identity)).unwrap();
        let dev = Device::new(1, 64).unwrap();
        let path: &dyn DmaPath = &d;
        let mut w = WorkRecord::new();
        let buf = map_to_device(path, &dev, 0x1234_5000, 8192, &mut w).unwrap();
        assert_eq!(buf.dma_addr(), DmaAddr(0x1234_5000));
        assert!(buf.is_untranslated());
        assert_translates_to(
            path,
            &dev,
            buf.dma_addr(),
            8192,
            Access::Read,
            0x1234_5000,
            &mut w,
        );
        assert_eq!((w.pte_reads, w.walk_reads, w.ptes_written), (0, 0, 0));
        path.unmap_single(buf, 0, 0, &mut w).unwrap();
    }

    #[test]
    fn domain_path_maps_translates_and_unmaps() {
        let d = strict_domain(2);
        let dev = Device::new(1, 32).unwrap();
        let mut w = WorkRecord::new();
        let buf = DmaPath::map_single(
            &d,
            &dev,
            PhysAddr::new(0x8000),
            100,
            Direction::FromDevice,
            0,
            &mut w,
        )
        .unwrap();
        assert!(buf.dma_addr().0 < SZ_4G);
        assert!(!buf.is_untranslated());
        let r = DmaPath::translate(&d, &dev, buf.dma_addr(), 100, Access::Write, &mut w).unwrap();
        assert_eq!(r[0].pa, PhysAddr::new(0x8000));
        DmaPath::unmap_single(&d, buf, 0, 0, &mut w).unwrap();
        assert_eq!(d.live_mappings(), 0);
        let list = [
            SgEntry::new(PhysAddr::new(0x10000), SZ_4K),
            SgEntry::new(PhysAddr::new(0x30000), SZ_4K),
        ];
        let sg = DmaPath::map_sg(&d, &dev, &list, Direction::ToDevice, 0, &mut w).unwrap();
        assert_eq!((sg.nents(), sg.segment_count()), (2, 1));
        DmaPath::unmap_sg(&d, sg, 0, 0, &mut w).unwrap();
    }

    #[test]
    fn a_handle_from_another_domain_comes_back() {
        let a = strict_domain(3);
        let b = strict_domain(4);
        let dev = Device::new(1, 64).unwrap();
        let mut w = WorkRecord::new();
        let buf = DmaPath::map_single(
            &a,
            &dev,
            PhysAddr::new(0x8000),
            1,
            Direction::ToDevice,
            0,
            &mut w,
        )
        .unwrap();
        let back = DmaPath::unmap_single(&b, buf, 0, 0, &mut w).unwrap_err();
        assert!(matches!(back.error, DmaError::WrongDomain { .. }));
        DmaPath::unmap_single(&a, back.handle, 0, 0, &mut w).unwrap();
    }

    #[test]
    fn sg_checks_reject_empty_and_wrapping_lists() {
        assert_eq!(check_sg(&[]), Err(DmaError::EmptySgList));
        let bad = [SgEntry::new(PhysAddr::new(u64::MAX), 2)];
        assert!(matches!(
            check_sg(&bad),
            Err(DmaError::BadSgEntry { index: 0, .. })
        ));
        assert!(check_buffer(PhysAddr::new(0), 0).is_err());
    }
}
