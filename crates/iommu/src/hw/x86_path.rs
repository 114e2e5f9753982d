//! An Intel VT-d unit or an AMD-Vi IOMMU as one device's DMA path, for timing models that
//! need the device side to go through the IOMMU's caches (as [`Smmuv3DevicePath`] does
//! for SMMUv3).
//!
//! [`X86DevicePath`] builds a translated [`Domain`] on a [`Dmar`] (Linux intel-iommu's
//! strict path, [`crate::vtd::VtdInvalidator`]: page-selective IOTLB descriptors with the
//! smallest aligned mask, domain-selective beyond CAP.MAMV, one wait descriptor per
//! `qi_submit_sync`) or on an [`AmdVi`] (Linux amd_iommu's: `INVALIDATE_IOMMU_PAGES` and
//! `COMPLETION_WAIT`, one Tail write each), and attaches the device to it. The device's DMA
//! translates page by page through the unit's IOTLB and paging-structure (or
//! page-directory) caches, counting one `walk_reads` per table read; a successful access
//! through an IOTLB entry whose mapping was already removed is a measured stale hit. In
//! strict mode an unmap's invalidation is carried out by the unit's queue consumer before
//! the unmap returns; in lazy mode the entries stay until the flush queue's domain-wide
//! invalidation.
//!
//! With Caching Mode (a virtual VT-d), every map is followed by Linux's `iotlb_sync_map`: a
//! page-selective invalidation of the mapped range and a wait (X86.md §1.7), added to the
//! map's work record.
//!
//! The queue's timing is not here: the work records hold the descriptors (commands), the
//! tail writes and the waits the driver issued; a lab times them (the `iolab-sim` crate's
//! x86 queue model) and charges the rest as CPU work.
//!
//! [`Smmuv3DevicePath`]: super::Smmuv3DevicePath

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::{DmaPath, MappedBuffer, MappedSg};
use crate::addr::{Access, DmaAddr, Iova, PhysAddr, SZ_4G, SZ_4K};
use crate::amdvi::{AmdV1Config, AmdVi, AmdViConfig, AmdViDomain, AmdViError};
use crate::dma::{
    Device, Direction, DmaError, DmaFault, DomainConfig, FaultReason, PhysRange,
    ProtectionCounters, ProtectionStats, Rejected, SgEntry,
};
use crate::dma::{Domain, DomainMode};
use crate::iova::IovaAllocator;
use crate::mem::{PhysAllocator, PhysMemory};
use crate::vtd::spec::Ecap;
use crate::vtd::{Dmar, DmarConfig, DmarDomain, DmarError, VtdTranslation};
use crate::work::WorkRecord;

/// Why an x86 device path could not be built.
#[derive(Debug, thiserror::Error)]
pub enum X86PathError {
    /// The VT-d model refused the configuration.
    #[error("VT-d: {0}")]
    Vtd(#[from] DmarError),
    /// The AMD-Vi model refused the configuration.
    #[error("AMD-Vi: {0}")]
    AmdVi(#[from] AmdViError),
    /// The simulated memory for the unit's tables could not be set up.
    #[error("memory: {0}")]
    Memory(String),
    /// A device id the unit cannot address (VT-d source ids and AMD-Vi DeviceIDs are 16
    /// bits).
    #[error("device id {0} does not fit a 16-bit requester id")]
    DeviceId(u32),
    /// The path's domain must be translated (strict or lazy).
    #[error("an x86 device path needs a translated domain, not {0:?}")]
    NotTranslated(DomainMode),
}

/// Which x86 IOMMU a path is built on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum X86Unit {
    /// An Intel VT-d DMA-remapping unit.
    Vtd(DmarConfig),
    /// An AMD-Vi IOMMU with v1 tables of the given input width in bits (Linux starts a
    /// domain at 3 levels and grows it; the width bounds the IOVAs the domain may hand out).
    AmdVi(AmdViConfig, AmdV1Config),
}

enum Unit {
    Vtd { dmar: Arc<Dmar>, dom: DmarDomain },
    AmdVi { iommu: AmdVi, dom: AmdViDomain },
}

/// One device's DMA through a VT-d unit or an AMD-Vi IOMMU. See the module docs.
pub struct X86DevicePath {
    unit: Unit,
    /// The device's requester id (VT-d source id, AMD-Vi DeviceID).
    rid: u16,
    /// Caching Mode: every map is followed by a page-selective invalidation and a wait.
    caching_mode: bool,
    stale: ProtectionCounters,
    /// Caching Mode map-time invalidations the unit refused.
    map_sync_errors: AtomicU64,
}

impl std::fmt::Debug for X86DevicePath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("X86DevicePath")
            .field("model", &self.model())
            .field("rid", &self.rid)
            .finish_non_exhaustive()
    }
}

/// Domain id of the path's one domain (VT-d DID; DIDs 0 and 1 are reserved by Linux, X86.md
/// §1.3; the AMD-Vi DomainID uses the same value).
pub const X86_PATH_DID: u16 = 2;

/// ECAP bits of a scalable-mode unit: PSS = 19 (20-bit PASIDs), PASID b40, SMTS b43,
/// SLTS b46, FLTS b47 (X86.md §1.2).
const SCALABLE_ECAP_BITS: u64 = 19 << 35 | 1 << 40 | 1 << 43 | 1 << 46 | 1 << 47;

/// Input bits of the lab's AMD-Vi domain: 3 levels, Linux's starting depth.
const AMD_IAS: u32 = 39;

/// The simulated memory the unit's tables live in: sparse, so its size only bounds it.
const TABLE_MEMORY: (u64, u64) = (32 << 20, 1 << 30);

impl X86DevicePath {
    /// A unit built from `unit`, a translated domain (`config.mode` strict or lazy) over
    /// IOVAs from `allocator`, and `device` (its id as requester id) attached to it. The
    /// set-up work (attach, Caching Mode flushes) is not returned.
    pub fn new(
        unit: X86Unit,
        config: DomainConfig,
        allocator: Arc<dyn IovaAllocator>,
        device: &Device,
    ) -> Result<Self, X86PathError> {
        if !config.mode.is_translated() {
            return Err(X86PathError::NotTranslated(config.mode));
        }
        let rid = u16::try_from(device.id()).map_err(|_| X86PathError::DeviceId(device.id()))?;
        let mut setup = WorkRecord::new();
        let (unit, caching_mode) = match unit {
            X86Unit::Vtd(cfg) => {
                let cm = cfg.cap.cm();
                let mem = Arc::new(
                    PhysMemory::new(TABLE_MEMORY.1)
                        .map_err(|e| X86PathError::Memory(e.to_string()))?,
                );
                let pages = PhysAllocator::new(
                    mem,
                    PhysAddr::new(TABLE_MEMORY.0),
                    PhysAddr::new(TABLE_MEMORY.1),
                )
                .map_err(|e| X86PathError::Memory(e.to_string()))?;
                let dmar = Dmar::new(cfg, Arc::new(pages))?;
                let dom = dmar.new_domain(X86_PATH_DID, config, allocator)?;
                dmar.attach(rid, &dom, &mut setup)?;
                (Unit::Vtd { dmar, dom }, cm)
            }
            X86Unit::AmdVi(cfg, table) => {
                let mem = Arc::new(
                    PhysMemory::new(TABLE_MEMORY.1)
                        .map_err(|e| X86PathError::Memory(e.to_string()))?,
                );
                let iommu = AmdVi::new(cfg, mem)?;
                let dom = iommu.new_domain(X86_PATH_DID, config, table, allocator)?;
                iommu.attach(rid, &dom, &mut setup)?;
                (Unit::AmdVi { iommu, dom }, false)
            }
        };
        Ok(X86DevicePath {
            unit,
            rid,
            caching_mode,
            stale: ProtectionCounters::new(),
            map_sync_errors: AtomicU64::new(0),
        })
    }

    /// A VT-d unit as the lab's default: the Cascade-Lake-class registers of X86.md §1.2
    /// (4-level second-stage tables, PSI with MAMV 18), with Caching Mode if `caching_mode`.
    pub fn vtd_unit(caching_mode: bool) -> X86Unit {
        Self::vtd_unit_in(caching_mode, VtdTranslation::Legacy)
    }

    /// [`X86DevicePath::vtd_unit`] in `translation` mode. For the scalable modes the ECAP
    /// also reports SMTS, SLTS, FLTS and PASID (20 bits) (assumption: a Sapphire-Rapids-class
    /// unit, which runs scalable mode (X86.md §1.2), with the Cascade Lake unit's other
    /// fields; its CAP has FL1GP clear, so first-stage tables use 4 KiB and 2 MiB pages).
    pub fn vtd_unit_in(caching_mode: bool, translation: VtdTranslation) -> X86Unit {
        let mut cfg = DmarConfig::cascade_lake();
        if translation.is_scalable() {
            cfg.ecap = Ecap(cfg.ecap.0 | SCALABLE_ECAP_BITS);
            cfg = cfg.with_translation(translation);
        }
        X86Unit::Vtd(if caching_mode {
            cfg.caching_mode()
        } else {
            cfg
        })
    }

    /// An AMD-Vi IOMMU as the lab's default: Linux's 512-entry command buffer, the model's
    /// default caches, and a 3-level v1 table (39 bits): Linux starts every domain at 3
    /// levels and adds one only when a mapping lies above its reach, which dma-iommu's
    /// 32-bit-first IOVAs do not reach in practice (X86.md §3.3); the table model does not
    /// grow, so the path's IOVA space stops at 2^39 ([`X86DevicePath::iova_limit`]).
    pub fn amdvi_unit() -> X86Unit {
        X86Unit::AmdVi(AmdViConfig::default(), AmdV1Config::new(AMD_IAS))
    }

    /// The IOVA space a domain of this path can use: the DMA layer's allocator should not
    /// hand out addresses beyond it (4 GiB is always inside).
    pub fn iova_limit(unit: &X86Unit) -> Iova {
        match unit {
            // First-stage IOVAs are canonical: Linux's aperture is the lower half.
            X86Unit::Vtd(c) if c.translation == VtdTranslation::ScalableFirstStage => {
                Iova::new(1 << 47)
            }
            X86Unit::Vtd(_) => Iova::new(1 << 48),
            X86Unit::AmdVi(_, t) => Iova::new(1 << t.ias),
        }
        .max(Iova::new(SZ_4G))
    }

    /// `"vtd"` or `"amd-vi"`.
    pub fn model(&self) -> &'static str {
        match self.unit {
            Unit::Vtd { .. } => "vtd",
            Unit::AmdVi { .. } => "amd-vi",
        }
    }

    /// The DMA-API domain drivers map and unmap with.
    pub fn domain(&self) -> &Arc<Domain> {
        match &self.unit {
            Unit::Vtd { dom, .. } => dom.domain(),
            Unit::AmdVi { dom, .. } => dom.domain(),
        }
    }

    /// The VT-d unit, if the path is VT-d.
    pub fn dmar(&self) -> Option<&Arc<Dmar>> {
        match &self.unit {
            Unit::Vtd { dmar, .. } => Some(dmar),
            Unit::AmdVi { .. } => None,
        }
    }

    /// The AMD-Vi IOMMU, if the path is AMD-Vi.
    pub fn amdvi(&self) -> Option<&AmdVi> {
        match &self.unit {
            Unit::AmdVi { iommu, .. } => Some(iommu),
            Unit::Vtd { .. } => None,
        }
    }

    /// Whether maps are followed by an invalidation (VT-d Caching Mode).
    pub fn caching_mode(&self) -> bool {
        self.caching_mode
    }

    /// Invalidation submissions the unit refused so far (never expected).
    pub fn invalidation_errors(&self) -> u64 {
        self.map_sync_errors.load(Ordering::Relaxed)
            + match &self.unit {
                Unit::Vtd { dom, .. } => dom.invalidator().errors(),
                Unit::AmdVi { dom, .. } => dom.invalidator().errors(),
            }
    }

    /// The domain's protection figures with the stale hits measured on the device side.
    pub fn protection(&self) -> ProtectionStats {
        let mut p = self.domain().protection();
        let measured = self.stale.snapshot();
        p.stale_hits = measured.stale_hits;
        p.stale_bytes = measured.stale_bytes;
        p
    }

    /// The device moves `len` bytes at `addr`: the physical ranges it reaches, page by page
    /// through the unit (IOTLB, paging-structure caches, walks), into `out` (cleared
    /// first). Adds `translations`, `iotlb_hits`, `iotlb_misses`, `iotlb_stale_hits` and
    /// `walk_reads` to `work`. A fault is returned as the unit's message.
    pub fn device_translate_into(
        &self,
        addr: DmaAddr,
        len: u64,
        access: Access,
        out: &mut Vec<PhysRange>,
        work: &mut WorkRecord,
    ) -> Result<(), String> {
        out.clear();
        let before = work.iotlb_stale_hits;
        let mut at = addr.0;
        let end = addr
            .0
            .checked_add(len)
            .ok_or_else(|| format!("DMA of {len} bytes at {:#x} wraps", addr.0))?;
        while at < end {
            let iova = Iova::new(at);
            let (pa, page) = match &self.unit {
                Unit::Vtd { dmar, .. } => {
                    let t = dmar
                        .translate(self.rid, iova, access, work)
                        .map_err(|f| f.to_string())?;
                    (t.pa.get(), t.page_size)
                }
                Unit::AmdVi { iommu, .. } => {
                    let t = iommu
                        .translate(self.rid, iova, access, work)
                        .map_err(|f| f.to_string())?;
                    (t.pa.get(), t.page_size)
                }
            };
            let page = page.max(SZ_4K);
            let chunk = (page - (at & (page - 1))).min(end - at);
            match out.last_mut() {
                Some(r) if r.pa.get() + r.len == pa => r.len += chunk,
                _ => out.push(PhysRange {
                    pa: PhysAddr::new(pa),
                    len: chunk,
                }),
            }
            at += chunk;
        }
        if work.iotlb_stale_hits > before {
            self.stale.record_stale_hit(len);
        }
        Ok(())
    }

    /// Linux's `iotlb_sync_map` after a map of `len` bytes at `dma`: with Caching Mode, a
    /// page-selective invalidation and a wait (VT-d); nothing otherwise.
    /// A failed submission (never expected) is counted in
    /// [`X86DevicePath::invalidation_errors`]; the mapping stands.
    fn sync_map(&self, dma: DmaAddr, len: u64, work: &mut WorkRecord) {
        if let Unit::Vtd { dom, .. } = &self.unit {
            if self.caching_mode && len > 0 && dom.sync_map(Iova::new(dma.0), len, work).is_err() {
                self.map_sync_errors.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// Drivers map and unmap through the domain; the device (its id is its requester id)
/// reaches memory through the unit.
impl DmaPath for X86DevicePath {
    fn platform(&self) -> &'static str {
        self.model()
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
        let m = DmaPath::map_single(&**self.domain(), dev, pa, len, dir, cpu, work)?;
        self.sync_map(m.dma_addr(), len, work);
        Ok(m)
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
        let sg = DmaPath::map_sg(&**self.domain(), dev, entries, dir, cpu, work)?;
        if self.caching_mode {
            // One `iotlb_sync_map` over the list's IOVA span (iommu_map_sg).
            let lo = sg.segments().iter().map(|s| s.dma.0).min();
            let hi = sg.segments().iter().map(|s| s.dma.0 + s.len).max();
            if let (Some(lo), Some(hi)) = (lo, hi) {
                self.sync_map(DmaAddr(lo), hi - lo, work);
            }
        }
        Ok(sg)
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
        let mut out = Vec::new();
        self.device_translate_into(dma, len, access, &mut out, work)
            .map_err(|_| DmaFault {
                device: dev.id(),
                dma,
                access,
                reason: FaultReason::Unmapped,
            })?;
        Ok(out)
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
        // The unit's own model (the device is the path's requester id).
        X86DevicePath::device_translate_into(self, dma, len, access, out, work)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dma::DomainId;
    use crate::iova::linux::{IovaSpaceConfig, LinuxIovaAllocator};

    fn path(unit: X86Unit, mode: DomainMode) -> (X86DevicePath, Device) {
        let dev = Device::new(1, 64).unwrap();
        let alloc = LinuxIovaAllocator::new(IovaSpaceConfig::new(
            SZ_4K,
            X86DevicePath::iova_limit(&unit),
        ))
        .unwrap();
        let p = X86DevicePath::new(
            unit,
            DomainConfig::new(DomainId(1), mode),
            Arc::new(alloc),
            &dev,
        )
        .unwrap();
        (p, dev)
    }

    fn units() -> [X86Unit; 2] {
        [X86DevicePath::vtd_unit(false), X86DevicePath::amdvi_unit()]
    }

    /// Maps a 4 KiB buffer, lets the device write it twice (a walk, then an IOTLB hit),
    /// unmaps it and lets the device write it again: the last access's result.
    fn after_unmap(p: &X86DevicePath, dev: &Device) -> (Result<(), String>, WorkRecord) {
        let mut w = WorkRecord::new();
        let m = p
            .map_single(
                dev,
                PhysAddr::new(0x4000_0000),
                SZ_4K,
                Direction::FromDevice,
                0,
                &mut w,
            )
            .unwrap();
        let mut out = Vec::new();
        let mut first = WorkRecord::new();
        p.device_translate_into(m.dma_addr(), SZ_4K, Access::Write, &mut out, &mut first)
            .unwrap();
        assert_eq!(
            out,
            vec![PhysRange {
                pa: PhysAddr::new(0x4000_0000),
                len: SZ_4K
            }]
        );
        assert_eq!((first.iotlb_misses, first.iotlb_hits), (1, 0));
        assert!(first.walk_reads >= 3, "{} walk reads", first.walk_reads);
        let mut second = WorkRecord::new();
        p.device_translate_into(m.dma_addr(), SZ_4K, Access::Write, &mut out, &mut second)
            .unwrap();
        assert_eq!((second.iotlb_hits, second.walk_reads), (1, 0));
        let dma = m.dma_addr();
        let mut uw = WorkRecord::new();
        p.unmap_single(m, 0, 0, &mut uw).unwrap();
        let mut tw = WorkRecord::new();
        let r = p.device_translate_into(dma, SZ_4K, Access::Write, &mut out, &mut tw);
        (r, uw)
    }

    #[test]
    fn strict_unmap_leaves_no_stale_translation_and_issues_the_drivers_commands() {
        for unit in units() {
            let (p, dev) = path(unit, DomainMode::Strict);
            let (r, uw) = after_unmap(&p, &dev);
            assert!(
                r.is_err(),
                "{}: the device still reached an unmapped page",
                p.model()
            );
            assert_eq!(p.protection().stale_hits, 0);
            // Both drivers: one invalidation and one wait (2 descriptors or commands).
            assert_eq!(
                (uw.commands_written, uw.inval_syncs),
                (2, 1),
                "{}",
                p.model()
            );
            // VT-d: one IQT write; AMD-Vi: one Tail write per command.
            let tails = if p.model() == "vtd" { 1 } else { 2 };
            assert_eq!(uw.mmio_writes, tails, "{}", p.model());
        }
    }

    #[test]
    fn lazy_unmap_leaves_the_iotlb_entry_until_the_flush() {
        for unit in units() {
            let (p, dev) = path(unit, DomainMode::Lazy);
            let (r, uw) = after_unmap(&p, &dev);
            assert!(
                r.is_ok(),
                "{}: lazy unmap should leave the entry",
                p.model()
            );
            assert_eq!(uw.commands_written, 0);
            assert_eq!(p.protection().stale_hits, 1, "{}", p.model());
        }
    }

    #[test]
    fn caching_mode_invalidates_every_map() {
        let (p, dev) = path(X86DevicePath::vtd_unit(true), DomainMode::Strict);
        assert!(p.caching_mode());
        let mut w = WorkRecord::new();
        let _m = p
            .map_single(
                &dev,
                PhysAddr::new(0x4000_0000),
                SZ_4K,
                Direction::ToDevice,
                0,
                &mut w,
            )
            .unwrap();
        assert_eq!((w.commands_written, w.inval_syncs), (2, 1));
        let (q, qdev) = path(X86DevicePath::vtd_unit(false), DomainMode::Strict);
        let mut w = WorkRecord::new();
        let _m = q
            .map_single(
                &qdev,
                PhysAddr::new(0x4000_0000),
                SZ_4K,
                Direction::ToDevice,
                0,
                &mut w,
            )
            .unwrap();
        assert_eq!(w.commands_written, 0);
    }

    #[test]
    fn a_direct_domain_is_refused() {
        let dev = Device::new(1, 64).unwrap();
        let alloc = LinuxIovaAllocator::new(IovaSpaceConfig::new(SZ_4K, Iova::new(SZ_4G))).unwrap();
        let e = X86DevicePath::new(
            X86DevicePath::vtd_unit(false),
            DomainConfig::new(DomainId(1), DomainMode::Identity),
            Arc::new(alloc),
            &dev,
        )
        .unwrap_err();
        assert!(matches!(
            e,
            X86PathError::NotTranslated(DomainMode::Identity)
        ));
    }
}
