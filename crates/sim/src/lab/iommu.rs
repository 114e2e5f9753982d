//! Builds the DMA path a scenario's devices use: the IOMMU model in the chosen mode (the same
//! functional models and assembly the published experiments use), and for SMMUv3 in a
//! translated mode the whole SMMU device model ([`Smmuv3DevicePath`]: the device's DMA
//! through its IOTLB and walk cache, invalidations as real commands its queue's consumer
//! applies) with its command queue timed in virtual time ([`SimCmdq`]); for VT-d and AMD-Vi
//! the unit model with its invalidation queue timed ([`SimX86Queue`]). Either is the path's
//! [`TimedQueue`].

use std::sync::Arc;

use iolab_iommu::addr::{Iova, SZ_4K};
use iolab_iommu::dma::flush_queue::FlushQueueConfig;
use iolab_iommu::dma::protection::ProtectionStats;
use iolab_iommu::dma::{Device, Domain, DomainConfig, DomainId, DomainMode, WindowClose};
use iolab_iommu::hw::ipmmu::IpmmuFlushConfig;
use iolab_iommu::hw::pseries::{ddw_page, DdwConfig, DdwMode, WindowConfig};
use iolab_iommu::hw::{
    ipmmu_domain, DmaPath, IpmmuInvalidator, PseriesConfig, PseriesIommu, SbaIommu, SbaIommuConfig,
    Smmuv3DevicePath, X86DevicePath, X86Unit,
};
use iolab_iommu::iova::linux::{IovaSpaceConfig, LinuxIovaAllocator};
use iolab_iommu::iova::magazine::MagazineCache;
use iolab_iommu::pgtable::lpae::LpaeConfig;
use iolab_iommu::smmuv3::{CmdqConfig, ProducerKind, Smmuv3Config};
use iolab_iommu::work::WorkRecord;

use super::LabError;
use crate::cost::PlatformProfile;
use crate::engine::Handle;
use crate::iommu::cmdq::{Mode as CmdqMode, SimCmdq, SyncWait};
use crate::iommu::x86q::{SimX86Queue, X86QueueKind};
use crate::iommu::TimedQueue;

use super::spec::{CmdqDesign, IommuMode, IommuModel, LabScenario};

/// The DMA path of one run.
pub(crate) struct IommuPath {
    /// What drivers map and unmap through.
    pub path: Arc<dyn DmaPath>,
    /// SMMUv3, VT-d and AMD-Vi translated modes: the SMMU or unit the device's DMA goes
    /// through, and its queue timed in virtual time.
    pub queue: Option<TimedQueue>,
    /// IPMMU: busy-wait per flush poll beyond the first register read, ns.
    pub poll_interval_ns: u64,
    /// POWER: the model itself (the NIC's TCE path needs it).
    pub pseries: Option<Arc<PseriesIommu>>,
    /// Whether device addresses are translated (IOTLB misses, virtual merging).
    pub translated: bool,
    /// Where the run's protection report is read from.
    pub protection: ProtectionProbe,
}

/// The model a run's protection report ([`ProtectionStats`]) is read from: the same object
/// the devices' DMA went through, so its counters are the run's own.
#[derive(Clone)]
pub(crate) enum ProtectionProbe {
    /// A DMA-API domain: dma-direct (no IOMMU), identity (passthrough), or the IPMMU's
    /// translated domain.
    Domain(Arc<Domain>),
    /// The SMMUv3 device path: the domain's figures with the stale hits measured in the
    /// SMMU's IOTLB and the SMMU's faults.
    Smmuv3(Arc<Smmuv3DevicePath>),
    /// The SBA IOMMU: bypassed and refused accesses, sub-page exposure and the deferred-purge
    /// window (no stale hits: its model has no device-side I/O TLB).
    Sba(Arc<SbaIommu>),
    /// The POWER partition IOMMU (TCE clears are synchronous hypercalls: no stale window).
    Pseries(Arc<PseriesIommu>),
    /// A VT-d unit or an AMD-Vi IOMMU: the domain's figures with the stale hits measured in
    /// the unit's IOTLB.
    X86(Arc<X86DevicePath>),
}

/// A run's protection report, as the lab's measurements carry it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct LabProtection {
    /// The model's counters.
    pub stats: ProtectionStats,
    /// The longest time a freed page stayed reachable, ns: the model's figure where the
    /// device's addresses are translated, the run's length where they are not (a freed page
    /// stays reachable for as long as the device can address memory).
    pub max_reachable_ns: u64,
    /// Whether the model can observe stale hits (all but SBA, which has no device-side I/O
    /// TLB model; its purge window and sub-page exposure are measured).
    pub stale_hits_measured: bool,
}

impl LabProtection {
    /// Adds another simulation's report (re-aim runs one simulation per user count).
    pub fn merge(&mut self, other: &LabProtection) {
        self.stats.merge(&other.stats);
        self.max_reachable_ns = self.max_reachable_ns.max(other.max_reachable_ns);
        self.stale_hits_measured = other.stale_hits_measured;
    }
}

impl ProtectionProbe {
    /// The report now, for a run of `run_ns` (its virtual length) on a path that does
    /// (`translated`) or does not translate device addresses.
    pub fn read(&self, translated: bool, run_ns: u64) -> LabProtection {
        let (stats, stale_hits_measured) = match self {
            ProtectionProbe::Domain(d) => (d.protection(), true),
            ProtectionProbe::Smmuv3(p) => (p.protection(), true),
            ProtectionProbe::Sba(s) => (s.protection(), false),
            ProtectionProbe::Pseries(p) => (p.protection(), true),
            ProtectionProbe::X86(p) => (p.protection(), true),
        };
        let max_reachable_ns = match self {
            _ if !translated => run_ns,
            // TCE updates and clears are synchronous hypercalls: an unmapped page stops
            // translating before the unmap returns.
            ProtectionProbe::Pseries(_) => 0,
            _ => stats.max_reachable_after_unmap_ns,
        };
        LabProtection {
            stats,
            max_reachable_ns,
            stale_hits_measured,
        }
    }
}

/// The device (and SMMUv3 StreamID) every scenario's devices share: one DMA domain.
pub(crate) const LAB_DEVICE_ID: u32 = 1;

/// The scenario's DMA device with `mask_bits` of DMA addressing, on PCI (the lab's NVMe
/// controllers, SAS and SCSI HBAs and NICs are PCI devices; the usb path's R-Car xHCI, a
/// platform device, builds its own).
pub(crate) fn lab_device(mask_bits: u32) -> Result<Device, LabError> {
    Ok(Device::new(LAB_DEVICE_ID, mask_bits)
        .map_err(model_err)?
        .with_pci(true))
}

/// The Linux IOVA tree of the scenario's release over `[4 KiB, end)`, behind the release's
/// per-CPU magazines.
fn iova_allocator(
    s: &LabScenario,
    end: Iova,
) -> Result<MagazineCache<LinuxIovaAllocator>, LabError> {
    let tree = LinuxIovaAllocator::with_variant(
        IovaSpaceConfig::new(SZ_4K, end),
        s.iommu.kernel.iova_tree_variant(),
    )
    .map_err(model_err)?;
    MagazineCache::new(tree, s.iommu.kernel.magazine_config(s.cpus)).map_err(model_err)
}

pub(crate) fn model_err(e: impl std::fmt::Display) -> LabError {
    LabError::Model(e.to_string())
}

/// Flush polls of one IPMMU whole-context flush on `profile`: the driver writes FLUSH, reads
/// IMCTR (still set while the flush runs), then polls every poll interval until it reads the
/// bit clear (as the ipmmu-usb experiment derives it).
pub(crate) fn ipmmu_polls(profile: &PlatformProfile) -> Result<(u32, u64), LabError> {
    let rf = profile.require_register_flush()?;
    let first_read = profile.mmio.write.ns() + profile.mmio.read.ns();
    let steps =
        ((rf.flush_duration.ns() - first_read).max(0.0) / rf.poll_interval.ns().max(1.0)).ceil();
    Ok((1 + steps as u32, rf.poll_interval.ns().round() as u64))
}

/// How CPUs learn that a `CMD_SYNC` completed on `profile`'s SMMU: its `iommu.cmdq.sync_msi`
/// (the D05's SMMU has no MSI and is polled through its CONS register, the D06's signals by
/// MSI), or the command-queue model's default (MSI) where the profile does not say.
pub(crate) fn sync_wait(profile: &PlatformProfile) -> SyncWait {
    match profile
        .iommu
        .cmdq
        .as_ref()
        .and_then(|q| q.sync_msi.as_ref())
    {
        Some(f) if !f.is_set() => SyncWait::ConsPoll,
        _ => SyncWait::Msi,
    }
}

/// Builds the path of `s` on the simulation of `h`.
pub(crate) fn build(s: &LabScenario, h: &Handle) -> Result<IommuPath, LabError> {
    build_instance(s, h, 0, WindowClose::AtFlush)
}

/// Builds IOMMU instance `k` of `s` (`iommu.instances`) on the simulation of `h`: a path of
/// its own (unit, domain, IOVA allocator, timed queue), the queue's engine resources named
/// with `#k` after the first (instance 0 is the one-instance path exactly).
/// `window_close`: [`WindowClose::Reported`] where the caller reports each timed sync's
/// completion to the lazy domain (the block stack), so a freed page's window ends there.
pub(crate) fn build_instance(
    s: &LabScenario,
    h: &Handle,
    k: usize,
    window_close: WindowClose,
) -> Result<IommuPath, LabError> {
    let tag = if k == 0 {
        String::new()
    } else {
        format!("#{k}")
    };
    let id = DomainId(1);
    let mut cfg = DomainConfig::new(id, DomainMode::NoIommu);
    cfg.cpus = s.cpus;
    cfg.window_close = window_close;
    let direct = |d: Arc<Domain>| IommuPath {
        path: d.clone(),
        queue: None,
        poll_interval_ns: 0,
        pseries: None,
        translated: false,
        protection: ProtectionProbe::Domain(d),
    };
    match (s.iommu.model, s.iommu.mode) {
        (_, IommuMode::Off) => Ok(direct(Arc::new(Domain::direct(cfg).map_err(model_err)?))),
        (IommuModel::Smmuv3 | IommuModel::Pseries, IommuMode::Passthrough) => {
            cfg.mode = DomainMode::Identity;
            Ok(direct(Arc::new(Domain::direct(cfg).map_err(model_err)?)))
        }
        (IommuModel::Smmuv3, mode @ (IommuMode::Strict | IommuMode::Lazy)) => {
            cfg.mode = if mode == IommuMode::Strict {
                DomainMode::Strict
            } else {
                DomainMode::Lazy
            };
            cfg.flush_queue = FlushQueueConfig {
                ring_size: s.iommu.flush_queue_size,
                timeout_ns: s.iommu.flush_timeout_ns,
            };
            cfg.flush_queue_variant = s.iommu.kernel.flush_queue_for(false).1;
            let (kind, qmode) = match s.iommu.cmdq {
                CmdqDesign::Spinlock => (ProducerKind::Spinlock, CmdqMode::Spinlock),
                CmdqDesign::LockFree => (ProducerKind::LockFree, CmdqMode::LockFree),
                // The functional queue is the lock-free one: the atomic-add reservation
                // changes only how the slots are reserved, so only their timing.
                CmdqDesign::AtomicAdd => (ProducerKind::LockFree, CmdqMode::AtomicAdd),
            };
            // dma-iommu gives PCI devices a 32-bit IOVA first (the release's variant).
            cfg.pci_32bit_first = Some(s.iommu.kernel.pci_32bit_first);
            let alloc = iova_allocator(s, Iova::new(1 << 48))?;
            // Range invalidation when the SMMU has it (`iommu.range_invalidation`, by default
            // the profile's: SMMUv3.2 `IDR3.RIL`) and the release's driver uses it (5.7+);
            // otherwise one CMD_TLBI_NH_VA per page. IOTLB and walk cache of gem5's SMMUv3
            // model (docs/model/smmuv3-cmdq.md).
            let smmu = Smmuv3Config {
                streams: LAB_DEVICE_ID + 1,
                cmdq: CmdqConfig::with_log2size(s.iommu.cmdq_log2size),
                producer: kind,
                range_invalidation: s.iommu.range_invalidation,
                driver_range_invalidation: s.iommu.kernel.range_invalidation,
                evtq_log2size: s.iommu.evtq_log2size,
                // The release's driver uses the EL2 forms on an E2H-capable SMMU under a VHE
                // host (5.12+); the lab's SMMU and host are neither, so this stays NH.
                driver_e2h: s.iommu.kernel.smmuv3_e2h,
                ..Smmuv3Config::default()
            };
            let path = Smmuv3DevicePath::new(
                smmu,
                1,
                cfg,
                LpaeConfig::new(SZ_4K, 48, 48),
                Arc::new(alloc),
                &lab_device(64)?,
            )
            .map_err(model_err)?;
            let q = SimCmdq::new_tagged(
                h,
                qmode,
                &s.profile,
                s.iommu.cmdq_batch_max,
                &tag,
                super::block::kernel_lock_kind(s),
            )?
            .with_sync_wait(sync_wait(&s.profile));
            let path = Arc::new(path);
            Ok(IommuPath {
                path: path.clone(),
                queue: Some(TimedQueue::Smmuv3 {
                    path: path.clone(),
                    queue: q,
                }),
                poll_interval_ns: 0,
                pseries: None,
                translated: true,
                protection: ProtectionProbe::Smmuv3(path),
            })
        }
        (IommuModel::Vtd | IommuModel::AmdVi, IommuMode::Passthrough) => {
            // Linux's identity domain (VT-d context TT = 2, AMD-Vi DTE Mode 0): no
            // translation, no invalidation.
            cfg.mode = DomainMode::Identity;
            Ok(direct(Arc::new(Domain::direct(cfg).map_err(model_err)?)))
        }
        (
            model @ (IommuModel::Vtd | IommuModel::AmdVi),
            mode @ (IommuMode::Strict | IommuMode::Lazy),
        ) => x86(s, h, cfg, model, mode, &tag),
        (IommuModel::Ipmmu, IommuMode::Strict) => {
            cfg.mode = DomainMode::Strict;
            let (polls, poll_interval_ns) = ipmmu_polls(&s.profile)?;
            let inv = Arc::new(
                IpmmuInvalidator::new(IpmmuFlushConfig {
                    polls_per_flush: polls,
                    ..Default::default()
                })
                .map_err(model_err)?,
            );
            let alloc = iova_allocator(s, Iova::new(1 << 32))?;
            let d = Arc::new(ipmmu_domain(cfg, Arc::new(alloc), inv).map_err(model_err)?);
            Ok(IommuPath {
                path: d.clone(),
                queue: None,
                poll_interval_ns,
                pseries: None,
                translated: true,
                protection: ProtectionProbe::Domain(d),
            })
        }
        (IommuModel::Sba, mode @ (IommuMode::Translated | IommuMode::Bypass)) => {
            let (base, size) = s.iommu.sba_window;
            let mut c = SbaIommuConfig::new(id, base, size, s.iommu.sba_page_size);
            c.delayed_frees = s.iommu.sba_delayed_frees;
            c.merge = s.iommu.sba_coalesce;
            c.allow_bypass = mode == IommuMode::Bypass;
            let sba = Arc::new(SbaIommu::new(c).map_err(model_err)?);
            Ok(IommuPath {
                path: sba.clone(),
                queue: None,
                poll_interval_ns: 0,
                pseries: None,
                translated: mode == IommuMode::Translated,
                protection: ProtectionProbe::Sba(sba),
            })
        }
        (IommuModel::Pseries, mode) => {
            let iommu = Arc::new(pseries(s, mode)?);
            Ok(IommuPath {
                path: iommu.clone(),
                queue: None,
                poll_interval_ns: 0,
                pseries: Some(iommu.clone()),
                translated: mode != IommuMode::DdwDirect,
                protection: ProtectionProbe::Pseries(iommu),
            })
        }
        (model, mode) => Err(model_err(format!(
            "iommu model {} in mode {} is not built (validation should have refused it)",
            model.name(),
            mode.name()
        ))),
    }
}

/// A VT-d unit or an AMD-Vi IOMMU in strict or lazy mode: the unit model (its IOTLB
/// translating the device's DMA, its invalidations carried out by its queue's consumer) and
/// the queue timed in virtual time ([`SimX86Queue`]). IOVAs as dma-iommu hands them out
/// (size-aligned from the tree, per-CPU magazines; 48-bit space).
fn x86(
    s: &LabScenario,
    h: &Handle,
    mut cfg: DomainConfig,
    model: IommuModel,
    mode: IommuMode,
    tag: &str,
) -> Result<IommuPath, LabError> {
    cfg.mode = if mode == IommuMode::Strict {
        DomainMode::Strict
    } else {
        DomainMode::Lazy
    };
    cfg.flush_queue = FlushQueueConfig {
        ring_size: s.iommu.flush_queue_size,
        timeout_ns: s.iommu.flush_timeout_ns,
    };
    cfg.flush_queue_variant = s.iommu.kernel.flush_queue_for(false).1;
    let (unit, kind) = match model {
        IommuModel::Vtd => (
            X86DevicePath::vtd_unit_in(s.iommu.caching_mode, s.iommu.vtd_translation),
            X86QueueKind::Vtd,
        ),
        _ => (X86DevicePath::amdvi_unit(), X86QueueKind::AmdVi),
    };
    // The profile's IOTLB geometry, where it gives one (validated when loaded).
    let mut unit = unit;
    // First-stage XD and PASID NXE as the scenario's release writes them.
    if let X86Unit::Vtd(d) = &mut unit {
        d.fl_exec = s.iommu.kernel.vtd_first_stage;
        d.nonleaf_psi = s.iommu.vtd_nonleaf_psi;
    }
    if let Some(c) = s.profile.iommu.iotlb.as_ref().and_then(|g| g.config()) {
        match &mut unit {
            X86Unit::Vtd(d) => d.iotlb = c,
            X86Unit::AmdVi(a, _) => a.iotlb = c,
        }
    }
    // dma-iommu (and before 5.11 intel-iommu's and amd_iommu's own allocators, with the same
    // rule) gives PCI devices a 32-bit IOVA first.
    cfg.pci_32bit_first = Some(s.iommu.kernel.pci_32bit_first);
    let alloc = iova_allocator(s, X86DevicePath::iova_limit(&unit))?;
    let path =
        X86DevicePath::new(unit, cfg, Arc::new(alloc), &lab_device(64)?).map_err(model_err)?;
    let q = SimX86Queue::new_tagged(h, kind, &s.profile, tag, super::block::kernel_lock_kind(s))?;
    let path = Arc::new(path);
    Ok(IommuPath {
        path: path.clone(),
        queue: Some(TimedQueue::X86 {
            path: path.clone(),
            queue: q,
        }),
        poll_interval_ns: 0,
        pseries: None,
        translated: true,
        protection: ProtectionProbe::X86(path),
    })
}

/// The partition's IOMMU: the default window, with a DDW created as the policy
/// (`iommu.ddw_policy`) decides for what the hypervisor offers, and a check that the
/// hypervisor's answer made it the window the mode names.
fn pseries(s: &LabScenario, mode: IommuMode) -> Result<PseriesIommu, LabError> {
    let mut cfg = PseriesConfig::new(DomainId(1), s.memory_bytes);
    cfg.default_window = WindowConfig {
        offset: 0,
        size: s.iommu.default_window_bytes,
        page_shift: 12,
    };
    let mask = ddw_page::bit_for_shift(s.iommu.ddw_page_shift)
        .ok_or_else(|| model_err("unsupported DDW page size"))?;
    cfg.ddw = Some(DdwConfig::with_window(s.iommu.ddw_window_bytes, mask));
    // Validation matched the policy to the mode (`iommu.ddw_policy`).
    cfg.policy = s.iommu.ddw_policy;
    let iommu = PseriesIommu::new(cfg).map_err(model_err)?;
    let mut w = WorkRecord::new();
    let ddw = iommu.enable_ddw(&mut w).map_err(model_err)?;
    match (mode, ddw.map(|d| d.mode)) {
        (IommuMode::DefaultWindow, None)
        | (IommuMode::DdwDynamic, Some(DdwMode::Dynamic))
        | (IommuMode::DdwDirect, Some(DdwMode::Direct)) => Ok(iommu),
        (_, got) => Err(model_err(format!(
            "the hypervisor model's DDW answer ({got:?}) does not give mode {}",
            mode.name()
        ))),
    }
}

/// The time a map or unmap waits for the IOMMU hardware beyond its counted CPU steps, for
/// paths that charge hardware waits per call rather than through a timed model (the SCSI
/// host of re-aim and bonnie on `scsi`): the SBA's purges, the IPMMU's flush polls beyond
/// the first register read, POWER's hypervisor time, and for SMMUv3 the command queue's
/// consumption and `CMD_SYNC` latency, uncontended.
pub(crate) fn hardware_wait(
    s: &LabScenario,
    poll_interval_ns: u64,
) -> Box<dyn Fn(&WorkRecord) -> f64> {
    let cost = s.profile.cpu_cost_model();
    let purge_ns = s
        .profile
        .require_register_flush()
        .map(|r| r.flush_duration.ns())
        .unwrap_or(0.0);
    let (consume_ns, sync_ns) = match s.profile.require_cmdq() {
        // x86 units: the wait is seen as it completes (VT-d polls back to back; AMD-Vi's
        // 1 us steps are not modelled on this per-call path).
        Ok(q) if s.iommu.uses_x86_queue() => (q.command_consume.ns(), q.sync_latency.ns()),
        Ok(q) if s.iommu.uses_cmdq() => {
            let sync = q.sync_latency.ns();
            // Without MSI the CPU sees the sync by reading CONS back to back from the
            // write: the read that samples it after completion (about half-way through its
            // round trip) returns a whole read later (as the timed queue, SimCmdq, polls).
            let seen = match sync_wait(&s.profile) {
                SyncWait::Msi => sync,
                SyncWait::ConsPoll => {
                    let r = s.profile.mmio.read.ns().max(1.0);
                    (((sync - r / 2.0).max(0.0) / r).ceil() + 1.0) * r
                }
            };
            (q.command_consume.ns(), seen)
        }
        _ => (0.0, 0.0),
    };
    let poll = poll_interval_ns as f64;
    Box::new(move |w: &WorkRecord| {
        let syncs = w.inval_syncs.min(w.commands_written);
        w.purges as f64 * purge_ns
            + w.polls.saturating_sub(w.inval_domains) as f64 * poll
            + cost.hypervisor_ns(w).unwrap_or(0.0)
            + (w.commands_written - syncs) as f64 * consume_ns
            + syncs as f64 * sync_ns
    })
}
