//! `[iommu]`: the hardware model, its mode and each model's fields, validated into an
//! [`IommuSetup`]; the devices' IOMMU instances.

use iolab_iommu::hw::pseries::DdwPolicy;
use iolab_iommu::linux::DmaPathVariants;
use iolab_iommu::smmuv3::ProducerKind;
use iolab_iommu::vtd::{NonLeafPsiScope, VtdTranslation};
use serde::Deserialize;

use crate::cost::PlatformProfile;
use crate::lab::caps::*;
use crate::lab::defaults as d;
use crate::lab::spec::fields::{one_of, Fields};
use crate::lab::spec::BUFFER_BASE;
use crate::lab::LabError;
use crate::tomlfile::{InputError, TomlDoc};

/// `iommu.vtd_translation` values.
const VTD_TRANSLATIONS: [&str; 3] = ["legacy", "scalable-first-stage", "scalable-second-stage"];

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct IommuSpec {
    pub(super) model: String,
    #[serde(default)]
    mode: Option<String>,
    #[serde(default)]
    cmdq: Option<String>,
    #[serde(default)]
    cmdq_log2size: Option<u32>,
    #[serde(default)]
    cmdq_batch_max: Option<u32>,
    #[serde(default)]
    flush_queue_size: Option<usize>,
    #[serde(default)]
    flush_timeout_ms: Option<u64>,
    #[serde(default)]
    delayed_frees: Option<usize>,
    #[serde(default)]
    page_size: Option<u64>,
    #[serde(default)]
    window_base_mib: Option<u64>,
    #[serde(default)]
    window_mib: Option<u64>,
    #[serde(default)]
    default_window_mib: Option<u64>,
    #[serde(default)]
    ddw_window_gib: Option<u64>,
    #[serde(default)]
    ddw_page_kib: Option<u64>,
    #[serde(default)]
    ddw_policy: Option<String>,
    #[serde(default)]
    serialise_tce_updates: Option<bool>,
    #[serde(default)]
    caching_mode: Option<bool>,
    #[serde(default)]
    vtd_translation: Option<String>,
    #[serde(default)]
    vtd_nonleaf_psi: Option<String>,
    #[serde(default)]
    instances: Option<usize>,
    #[serde(default)]
    evtq_log2size: Option<u32>,
    #[serde(default)]
    evtq_drain_interval_us: Option<f64>,
    #[serde(default)]
    range_invalidation: Option<bool>,
}

/// The IOMMU hardware a scenario's devices sit behind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IommuModel {
    /// No IOMMU at all: DMA addresses are physical.
    None,
    /// Arm SMMUv3 (HiSilicon D05/D06).
    Smmuv3,
    /// Renesas IPMMU-VMSA (R-Car H3).
    Ipmmu,
    /// HP zx1 SBA IOMMU.
    Sba,
    /// IBM POWER TCE windows under PowerVM.
    Pseries,
    /// Intel VT-d (one DMA-remapping unit, Linux intel-iommu's queued invalidation).
    Vtd,
    /// AMD-Vi (one IOMMU, Linux amd_iommu's command buffer).
    AmdVi,
}

impl IommuModel {
    /// Every model name a scenario may use.
    pub const NAMES: [&'static str; 7] =
        ["none", "smmuv3", "ipmmu", "sba", "pseries", "vtd", "amd-vi"];

    /// The scenario spelling.
    pub fn name(self) -> &'static str {
        match self {
            IommuModel::None => "none",
            IommuModel::Smmuv3 => "smmuv3",
            IommuModel::Ipmmu => "ipmmu",
            IommuModel::Sba => "sba",
            IommuModel::Pseries => "pseries",
            IommuModel::Vtd => "vtd",
            IommuModel::AmdVi => "amd-vi",
        }
    }

    /// The modes this model supports, first the default.
    pub fn modes(self) -> &'static [&'static str] {
        match self {
            IommuModel::None => &["off"],
            IommuModel::Smmuv3 => &["strict", "lazy", "passthrough", "off"],
            IommuModel::Ipmmu => &["strict", "off"],
            IommuModel::Sba => &["translated", "bypass", "off"],
            IommuModel::Pseries => &["default-window", "ddw-dynamic", "ddw-direct", "passthrough"],
            // Lazy first: Linux's default on x86 (IOMMU_DEFAULT_DMA_LAZY, X86.md §2.7).
            IommuModel::Vtd | IommuModel::AmdVi => &["lazy", "strict", "passthrough", "off"],
        }
    }

    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "none" => IommuModel::None,
            "smmuv3" => IommuModel::Smmuv3,
            "ipmmu" => IommuModel::Ipmmu,
            "sba" => IommuModel::Sba,
            "pseries" => IommuModel::Pseries,
            "vtd" => IommuModel::Vtd,
            "amd-vi" => IommuModel::AmdVi,
            _ => return None,
        })
    }
}

/// How the devices' DMA is translated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IommuMode {
    /// No translation (no IOMMU, or the IOMMU disabled).
    Off,
    /// Identity-mapped: the IOMMU is on but bypasses translation.
    Passthrough,
    /// Translated, every unmap invalidated before it returns.
    Strict,
    /// Translated, invalidations batched through per-CPU flush queues.
    Lazy,
    /// SBA: translated through the I/O pdir, purges batched after `delayed_frees` unmaps
    /// (the driver's only translated behaviour).
    Translated,
    /// SBA: buffers the device's 64-bit mask reaches bypass the IOMMU (`ALLOW_IOV_BYPASS`).
    Bypass,
    /// POWER: the default 32-bit window with 4 KiB TCEs, one hypercall per map and unmap.
    DefaultWindow,
    /// POWER: a dynamic DMA window (64 KiB TCEs), mapped per I/O.
    DdwDynamic,
    /// POWER: a DDW that maps all memory once (no per-I/O hypercalls).
    DdwDirect,
}

impl IommuMode {
    /// The scenario spelling.
    pub fn name(self) -> &'static str {
        match self {
            IommuMode::Off => "off",
            IommuMode::Passthrough => "passthrough",
            IommuMode::Strict => "strict",
            IommuMode::Lazy => "lazy",
            IommuMode::Translated => "translated",
            IommuMode::Bypass => "bypass",
            IommuMode::DefaultWindow => "default-window",
            IommuMode::DdwDynamic => "ddw-dynamic",
            IommuMode::DdwDirect => "ddw-direct",
        }
    }

    /// The mode `s` names; `none` is an alias of `off` (printed as `off`).
    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "off" | "none" => IommuMode::Off,
            "passthrough" => IommuMode::Passthrough,
            "strict" => IommuMode::Strict,
            "lazy" => IommuMode::Lazy,
            "translated" => IommuMode::Translated,
            "bypass" => IommuMode::Bypass,
            "default-window" => IommuMode::DefaultWindow,
            "ddw-dynamic" => IommuMode::DdwDynamic,
            "ddw-direct" => IommuMode::DdwDirect,
            _ => return None,
        })
    }
}

/// The SMMUv3 command-queue producer design.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CmdqDesign {
    /// One spinlock around insertion; the sync is waited for under it (before Linux 5.3).
    Spinlock,
    /// Lock-free reservation with a `cmpxchg` loop, gathered batches (Linux 5.4 onwards).
    LockFree,
    /// John Garry's unmerged 2020 variant of the lock-free queue: slots reserved with one
    /// atomic add instead of the `cmpxchg` loop.
    AtomicAdd,
}

impl CmdqDesign {
    /// The scenario spelling.
    pub fn name(self) -> &'static str {
        match self {
            CmdqDesign::Spinlock => "spinlock",
            CmdqDesign::LockFree => "lockfree",
            CmdqDesign::AtomicAdd => "atomic-add",
        }
    }
}

/// The validated IOMMU section.
#[derive(Clone, Debug, PartialEq)]
pub struct IommuSetup {
    /// The hardware.
    pub model: IommuModel,
    /// The mode.
    pub mode: IommuMode,
    /// SMMUv3 queue design (SMMUv3 only).
    pub cmdq: CmdqDesign,
    /// SMMUv3 queue size, log2 of slots.
    pub cmdq_log2size: u32,
    /// Largest gathered batch of the lock-free queue, commands.
    pub cmdq_batch_max: u32,
    /// Lazy mode: flush-queue slots per CPU.
    pub flush_queue_size: usize,
    /// Lazy mode: flush timer, ns.
    pub flush_timeout_ns: u64,
    /// SBA: unmaps queued before a purge.
    pub sba_delayed_frees: usize,
    /// SBA: IOMMU page size, bytes.
    pub sba_page_size: u64,
    /// SBA: the IOV window, (base, size) in bytes.
    pub sba_window: (u64, u64),
    /// SBA: whether `sba_map_sg` coalesces a list's pieces into virtually contiguous
    /// streams (`kernel.sba_coalesce`).
    pub sba_coalesce: bool,
    /// POWER: default window size, bytes.
    pub default_window_bytes: u64,
    /// POWER: DDW size, bytes.
    pub ddw_window_bytes: u64,
    /// POWER: log2 of the DDW's TCE page size.
    pub ddw_page_shift: u32,
    /// POWER: the kernel's DDW policy (`iommu.ddw_policy`): whether a DDW the hypervisor
    /// offers is created, and as what.
    pub ddw_policy: DdwPolicy,
    /// POWER: whether the hypervisor serialises one table's TCE updates under a per-table
    /// lock (`iommu.serialise_tce_updates`; timed on the NIC path).
    pub serialise_tce_updates: bool,
    /// The DMA-path algorithms of the scenario's Linux release (`kernel.version`).
    pub kernel: DmaPathVariants,
    /// VT-d: Caching Mode (a virtual IOMMU): maps are invalidated, lazy mode unavailable.
    pub caching_mode: bool,
    /// VT-d: legacy mode or scalable mode with first- or second-stage domains
    /// (`iommu.vtd_translation`).
    pub vtd_translation: VtdTranslation,
    /// VT-d: what a page-selective invalidation without IH removes from the
    /// paging-structure caches (`iommu.vtd_nonleaf_psi`: the domain's entries, as Intel's
    /// server IIO documents, or only the range's).
    pub vtd_nonleaf_psi: NonLeafPsiScope,
    /// IOMMU instances (SMMUs, DMAR units): each its own unit, domain, IOVA allocator and
    /// timed command or invalidation queue. 1 unless `iommu.instances` says more.
    pub instances: usize,
    /// Per device (block workloads), the instance it sits behind: `device[i].iommu_instance`,
    /// by default `i mod instances`. Empty for workloads with one device and one instance.
    pub device_instance: Vec<usize>,
    /// SMMUv3: the event queue's size, log2 of records (`iommu.evtq_log2size`).
    pub evtq_log2size: u32,
    /// SMMUv3: how often the driver's event thread drains the event queue, ns
    /// (`iommu.evtq_drain_interval_us`; it runs while a hostile device can fault).
    pub evtq_drain_ns: u64,
    /// SMMUv3: whether the SMMU implements range invalidation (`IDR3.RIL`;
    /// `iommu.range_invalidation`, default the profile's `iommu.cmdq.range_invalidation`).
    /// The driver uses it from Linux 5.7 (`kernel.range_invalidation`).
    pub range_invalidation: bool,
}

impl IommuSetup {
    /// The instance device `dev` sits behind (0 with one instance).
    pub fn instance_of(&self, dev: usize) -> usize {
        self.device_instance.get(dev).copied().unwrap_or(0)
    }

    /// Whether the SMMUv3 command queue is in use (SMMUv3 in a translated mode).
    pub fn uses_cmdq(&self) -> bool {
        self.model == IommuModel::Smmuv3 && matches!(self.mode, IommuMode::Strict | IommuMode::Lazy)
    }

    /// Whether an x86 invalidation queue is in use (VT-d or AMD-Vi in a translated mode).
    pub fn uses_x86_queue(&self) -> bool {
        matches!(self.model, IommuModel::Vtd | IommuModel::AmdVi)
            && matches!(self.mode, IommuMode::Strict | IommuMode::Lazy)
    }
}

/// Whether `iommu` is the SBA mapping scatter-gather lists through its pdir (translated or
/// bypass mode: only single buffers bypass it).
pub(super) fn sba_maps_lists(iommu: &IommuSetup) -> bool {
    iommu.model == IommuModel::Sba
        && matches!(iommu.mode, IommuMode::Translated | IommuMode::Bypass)
}

pub(super) fn iommu(
    doc: &TomlDoc<'_>,
    s: &IommuSpec,
    profile: &PlatformProfile,
    memory_gib: u64,
    kernel: DmaPathVariants,
) -> Result<IommuSetup, LabError> {
    let table = Fields::new(doc, "iommu");
    let model = IommuModel::parse(&s.model).ok_or_else(|| {
        doc.field_error(
            "iommu.model",
            format!(
                "unknown model \"{}\": {}",
                s.model,
                one_of(&IommuModel::NAMES)
            ),
        )
    })?;
    let modes = model.modes();
    // The VT-d fields apply to a VT-d unit only.
    for (given, field) in [
        (s.caching_mode.is_some(), "iommu.caching_mode"),
        (s.vtd_translation.is_some(), "iommu.vtd_translation"),
        (s.vtd_nonleaf_psi.is_some(), "iommu.vtd_nonleaf_psi"),
    ] {
        if given && model != IommuModel::Vtd {
            return Err(doc
                .field_error(field, "applies to iommu.model = \"vtd\" only")
                .into());
        }
    }
    let caching_mode = s.caching_mode.unwrap_or(false);
    let vtd_translation = match s.vtd_translation.as_deref() {
        None | Some("legacy") => VtdTranslation::Legacy,
        Some("scalable-second-stage") => VtdTranslation::ScalableSecondStage,
        Some("scalable-first-stage") => VtdTranslation::ScalableFirstStage,
        Some(other) => {
            return Err(doc
                .field_error(
                    "iommu.vtd_translation",
                    format!(
                        "unknown VT-d translation \"{other}\": {}",
                        one_of(&VTD_TRANSLATIONS)
                    ),
                )
                .into())
        }
    };
    let vtd_nonleaf_psi = match s.vtd_nonleaf_psi.as_deref() {
        None | Some("domain") => NonLeafPsiScope::Domain,
        Some("range") => NonLeafPsiScope::Range,
        Some(other) => {
            return Err(doc
                .field_error(
                    "iommu.vtd_nonleaf_psi",
                    format!("unknown scope \"{other}\": expected \"domain\" or \"range\""),
                )
                .into())
        }
    };
    // Linux forces strict on a unit with Caching Mode (X86.md §1.7): the default follows.
    let default_mode = if caching_mode { "strict" } else { modes[0] };
    let mode_name = s.mode.clone().unwrap_or_else(|| default_mode.to_owned());
    let mode = match IommuMode::parse(&mode_name) {
        // Checked by the mode's printed name, so the alias `none` is `off` here too.
        Some(m) if modes.contains(&m.name()) => m,
        Some(_) => {
            return Err(doc
                .field_error(
                    "iommu.mode",
                    format!(
                        "mode \"{mode_name}\" does not apply to iommu.model = \"{}\": {}",
                        model.name(),
                        one_of(modes)
                    ),
                )
                .into())
        }
        None => {
            return Err(doc
                .field_error(
                    "iommu.mode",
                    format!(
                        "unknown mode \"{mode_name}\": for iommu.model = \"{}\" {}",
                        model.name(),
                        one_of(modes)
                    ),
                )
                .into())
        }
    };
    if caching_mode && mode == IommuMode::Lazy {
        return Err(doc
            .field_error(
                "iommu.mode",
                "mode \"lazy\" is unavailable with iommu.caching_mode = true: Linux forces strict on a VT-d unit with Caching Mode (a virtual IOMMU: \"IOMMU batching disallowed due to virtualization\", X86.md §1.7); expected \"strict\", \"passthrough\" or \"off\"",
            )
            .into());
    }
    let uses_cmdq =
        model == IommuModel::Smmuv3 && matches!(mode, IommuMode::Strict | IommuMode::Lazy);
    let x86_queue = matches!(model, IommuModel::Vtd | IommuModel::AmdVi)
        && matches!(mode, IommuMode::Strict | IommuMode::Lazy);
    let only = |field: &str, set: bool, applies: bool, to: &str| -> Result<(), InputError> {
        if set && !applies {
            return Err(doc.field_error(&format!("iommu.{field}"), format!("applies to {to} only")));
        }
        Ok(())
    };
    let smmu = "iommu.model = \"smmuv3\" in mode strict or lazy";
    only("cmdq", s.cmdq.is_some(), uses_cmdq, smmu)?;
    only("cmdq_log2size", s.cmdq_log2size.is_some(), uses_cmdq, smmu)?;
    only(
        "cmdq_batch_max",
        s.cmdq_batch_max.is_some(),
        uses_cmdq,
        smmu,
    )?;
    only(
        "range_invalidation",
        s.range_invalidation.is_some(),
        uses_cmdq,
        smmu,
    )?;
    let profile_ril = profile
        .iommu
        .cmdq
        .as_ref()
        .and_then(|q| q.range_invalidation.as_ref())
        .is_some_and(|f| f.is_set());
    let range_invalidation = uses_cmdq && s.range_invalidation.unwrap_or(profile_ril);
    let lazy = mode == IommuMode::Lazy;
    only(
        "flush_queue_size",
        s.flush_queue_size.is_some(),
        lazy,
        "mode = \"lazy\"",
    )?;
    only(
        "flush_timeout_ms",
        s.flush_timeout_ms.is_some(),
        lazy,
        "mode = \"lazy\"",
    )?;
    // Bypass mode still maps scatter-gather lists through the pdir (only single buffers
    // the mask reaches bypass it), so the pdir's fields apply to it too.
    let sba = model == IommuModel::Sba && matches!(mode, IommuMode::Translated | IommuMode::Bypass);
    let sba_to = "iommu.model = \"sba\" in mode translated or bypass";
    only("delayed_frees", s.delayed_frees.is_some(), sba, sba_to)?;
    only("page_size", s.page_size.is_some(), sba, sba_to)?;
    only("window_base_mib", s.window_base_mib.is_some(), sba, sba_to)?;
    only("window_mib", s.window_mib.is_some(), sba, sba_to)?;
    let power = model == IommuModel::Pseries;
    only(
        "default_window_mib",
        s.default_window_mib.is_some(),
        power,
        "iommu.model = \"pseries\"",
    )?;
    only(
        "ddw_policy",
        s.ddw_policy.is_some(),
        power,
        "iommu.model = \"pseries\"",
    )?;
    only(
        "serialise_tce_updates",
        s.serialise_tce_updates.is_some(),
        power,
        "iommu.model = \"pseries\"",
    )?;
    // POWER passthrough is an identity domain: no window, so no DDW policy either.
    let power_windows = power && mode != IommuMode::Passthrough;
    only(
        "ddw_policy",
        s.ddw_policy.is_some(),
        power_windows,
        "iommu.model = \"pseries\" in a window mode (not passthrough)",
    )?;
    let ddw_policy = if power_windows {
        ddw_policy(doc, mode, s.ddw_policy.as_deref())?
    } else {
        DdwPolicy::Disabled
    };
    // The hypervisor's DDW offer matters in the DDW modes, and in mode default-window when
    // the policy asks for a DDW (which it then refuses as too small).
    let ddw = matches!(mode, IommuMode::DdwDynamic | IommuMode::DdwDirect)
        || (power && ddw_policy != DdwPolicy::Disabled);
    let ddw_to = "the ddw-dynamic and ddw-direct modes, and default-window with ddw_policy = \"direct-only\"";
    only("ddw_window_gib", s.ddw_window_gib.is_some(), ddw, ddw_to)?;
    only("ddw_page_kib", s.ddw_page_kib.is_some(), ddw, ddw_to)?;
    only(
        "instances",
        s.instances.is_some(),
        uses_cmdq || x86_queue,
        "iommu.model = \"smmuv3\", \"vtd\" or \"amd-vi\" in mode strict or lazy",
    )?;
    let instances = table.int(
        "instances",
        s.instances.unwrap_or(1),
        1..=MAX_DEVICES,
        "(at most one per device; cap MAX_DEVICES)",
    )?;

    if model == IommuModel::Smmuv3 && mode == IommuMode::Lazy && !kernel.arm64_lazy_available {
        return Err(doc
            .field_error(
                "iommu.mode",
                format!(
                    "Linux {} has no lazy mode for SMMUv3 (arm64 non-strict mode came in 4.20): \
                     expected \"strict\", or kernel.version 4.20 or later",
                    kernel.kernel
                ),
            )
            .into());
    }
    let release_cmdq = match kernel.cmdq {
        ProducerKind::Spinlock => "spinlock",
        _ => "lockfree",
    };
    let cmdq = match s.cmdq.as_deref().unwrap_or(release_cmdq) {
        "spinlock" => CmdqDesign::Spinlock,
        "lockfree" => CmdqDesign::LockFree,
        "atomic-add" => CmdqDesign::AtomicAdd,
        other => {
            return Err(doc
                .field_error(
                    "iommu.cmdq",
                    format!(
                        "unknown design \"{other}\": expected \"spinlock\", \"lockfree\" or \"atomic-add\""
                    ),
                )
                .into())
        }
    };
    let cmdq_log2size = table.int(
        "cmdq_log2size",
        s.cmdq_log2size.unwrap_or(d::CMDQ_LOG2SIZE.0),
        4..=MAX_CMDQ_LOG2SIZE,
        "(cap MAX_CMDQ_LOG2SIZE)",
    )?;
    let cmdq_batch_max = table.int(
        "cmdq_batch_max",
        s.cmdq_batch_max.unwrap_or(d::CMDQ_BATCH_MAX.0),
        2..=(1u32 << cmdq_log2size) - 1,
        "commands (fewer than the queue's slots)",
    )?;
    let flush_queue_size = table.int(
        "flush_queue_size",
        s.flush_queue_size.unwrap_or(d::FLUSH_QUEUE_SIZE.0),
        2..=MAX_FLUSH_QUEUE,
        "slots per CPU (cap MAX_FLUSH_QUEUE)",
    )?;
    let flush_timeout_ms = table.int(
        "flush_timeout_ms",
        s.flush_timeout_ms.unwrap_or(d::FLUSH_TIMEOUT_MS.0),
        1..=MAX_RUN_MS,
        "ms",
    )?;
    let sba_delayed_frees = table.int(
        "delayed_frees",
        s.delayed_frees.unwrap_or(d::SBA_DELAYED_FREES.0),
        0..=iolab_iommu::hw::sba::MAX_DELAYED_FREES,
        "unmaps (the model's cap)",
    )?;
    let sba_page_size = s.page_size.unwrap_or(d::SBA_PAGE_SIZE.0);
    if !sba_page_size.is_power_of_two() || !(4096..=65536).contains(&sba_page_size) {
        return Err(doc
            .field_error(
                "iommu.page_size",
                format!("expected a power of two in 4096..=65536 bytes, got {sba_page_size}"),
            )
            .into());
    }
    let (base_default, size_default) = d::SBA_WINDOW.0;
    let window_mib = table.int(
        "window_mib",
        s.window_mib.unwrap_or(size_default >> 20),
        1..=2048,
        "MiB (below the first 4 GiB)",
    )?;
    if !window_mib.is_power_of_two() {
        return Err(doc
            .field_error(
                "iommu.window_mib",
                format!("expected a power of two (the IOC decodes a naturally aligned window), got {window_mib}"),
            )
            .into());
    }
    let window_base_mib = table.int(
        "window_base_mib",
        s.window_base_mib.unwrap_or(base_default >> 20),
        1..=4095,
        "MiB",
    )?;
    if window_base_mib % window_mib != 0 || window_base_mib + window_mib > BUFFER_BASE >> 20 {
        return Err(doc
            .field_error(
                "iommu.window_base_mib",
                format!(
                    "expected a multiple of iommu.window_mib = {window_mib} with the window ending at or below 4096 MiB (the lab's buffers live above the first 4 GiB), got {window_base_mib}"
                ),
            )
            .into());
    }
    let sba_window = (window_base_mib << 20, window_mib << 20);
    let default_window_mib = table.int(
        "default_window_mib",
        s.default_window_mib.unwrap_or(d::DEFAULT_WINDOW_MIB.0),
        256..=4096,
        "MiB (a 32-bit window)",
    )?;
    let ddw_default = if mode == IommuMode::DdwDirect {
        memory_gib
    } else {
        (memory_gib / 2).max(1)
    };
    let ddw_window_gib = table.int(
        "ddw_window_gib",
        s.ddw_window_gib.unwrap_or(ddw_default),
        1..=MAX_MEMORY_GIB,
        "GiB",
    )?;
    if mode == IommuMode::DdwDynamic && ddw_window_gib >= memory_gib {
        return Err(doc
            .field_error(
                "iommu.ddw_window_gib",
                format!(
                    "a DDW of {ddw_window_gib} GiB maps all {memory_gib} GiB of memory, which makes it direct: expected less than machine.memory_gib for ddw-dynamic (or use mode = \"ddw-direct\")"
                ),
            )
            .into());
    }
    if mode == IommuMode::DefaultWindow
        && ddw_policy == DdwPolicy::DirectOnly
        && ddw_window_gib >= memory_gib
    {
        return Err(doc
            .field_error(
                "iommu.ddw_window_gib",
                format!(
                    "with ddw_policy = \"direct-only\" a DDW of {ddw_window_gib} GiB maps all {memory_gib} GiB of memory and is created as a direct map: expected less than machine.memory_gib for mode default-window (or use mode = \"ddw-direct\")"
                ),
            )
            .into());
    }
    if mode == IommuMode::DdwDirect && ddw_window_gib < memory_gib {
        return Err(doc
            .field_error(
                "iommu.ddw_window_gib",
                format!(
                    "a direct DDW maps all memory: expected at least machine.memory_gib = {memory_gib}"
                ),
            )
            .into());
    }
    let ddw_page_kib = s.ddw_page_kib.unwrap_or(d::DDW_PAGE_KIB.0);
    let ddw_page_shift = match ddw_page_kib {
        4 => 12,
        64 => 16,
        2048 => 21,
        16384 => 24,
        other => {
            return Err(doc
                .field_error(
                    "iommu.ddw_page_kib",
                    format!(
                    "expected 4, 64, 2048 or 16384 (a TCE page size PowerVM offers), got {other}"
                ),
                )
                .into())
        }
    };
    // SMMUv3's event queue (faults): where records go and how often the driver drains it.
    only("evtq_log2size", s.evtq_log2size.is_some(), uses_cmdq, smmu)?;
    only(
        "evtq_drain_interval_us",
        s.evtq_drain_interval_us.is_some(),
        uses_cmdq,
        smmu,
    )?;
    let evtq_log2size = table.int(
        "evtq_log2size",
        s.evtq_log2size.unwrap_or(d::EVTQ_LOG2SIZE.0),
        iolab_iommu::smmuv3::events::MIN_EVTQ_LOG2SIZE
            ..=iolab_iommu::smmuv3::events::MAX_EVTQ_LOG2SIZE,
        "(log2 of event records; the model's bounds)",
    )?;
    let evtq_drain_ns = table.us_as_ns(
        "evtq_drain_interval_us",
        s.evtq_drain_interval_us
            .unwrap_or(d::EVTQ_DRAIN_INTERVAL_US.0),
        0.1..=1e6,
    )?;
    let needs = |what: Result<(), crate::cost::CostError>, group: &str| -> Result<(), InputError> {
        what.map_err(|e| {
            doc.field_error(
                "machine.platform",
                format!(
                    "iommu.model = \"{}\" in mode {} needs a profile with a {group} group: {e}",
                    model.name(),
                    mode.name()
                ),
            )
        })
    };
    if uses_cmdq || x86_queue {
        needs(profile.require_cmdq().map(|_| ()), "[iommu.cmdq]")?;
    }
    if model == IommuModel::Ipmmu && mode == IommuMode::Strict {
        needs(
            profile.require_register_flush().map(|_| ()),
            "[iommu.register_flush]",
        )?;
    }
    if model == IommuModel::Pseries {
        needs(profile.require_hypervisor().map(|_| ()), "[hypervisor]")?;
    }
    Ok(IommuSetup {
        model,
        mode,
        cmdq,
        cmdq_log2size,
        cmdq_batch_max,
        flush_queue_size,
        flush_timeout_ns: flush_timeout_ms * 1_000_000,
        sba_delayed_frees,
        sba_page_size,
        sba_window,
        // Set from `kernel.sba_coalesce` once the kernel table is read (`common`).
        sba_coalesce: d::SBA_COALESCE.0,
        default_window_bytes: default_window_mib << 20,
        ddw_window_bytes: ddw_window_gib << 30,
        ddw_page_shift,
        ddw_policy,
        serialise_tce_updates: s
            .serialise_tce_updates
            .unwrap_or(d::SERIALISE_TCE_UPDATES.0),
        kernel,
        caching_mode,
        vtd_translation,
        vtd_nonleaf_psi,
        instances,
        device_instance: Vec::new(),
        evtq_log2size,
        evtq_drain_ns,
        range_invalidation,
    })
}

/// `iommu.ddw_policy`: the kernel's DDW policy, checked against the mode (which names the
/// window the device must end up mapping through). The default follows the mode
/// ([`d::DDW_POLICY_DEFAULT_WINDOW`], [`d::DDW_POLICY_DDW`]).
fn ddw_policy(
    doc: &TomlDoc<'_>,
    mode: IommuMode,
    v: Option<&str>,
) -> Result<DdwPolicy, InputError> {
    let default = if mode == IommuMode::DefaultWindow {
        d::DDW_POLICY_DEFAULT_WINDOW.0
    } else {
        d::DDW_POLICY_DDW.0
    };
    let policy = match v.unwrap_or(default) {
        "disabled" => DdwPolicy::Disabled,
        "direct-only" => DdwPolicy::DirectOnly,
        "direct-or-dynamic" => DdwPolicy::DirectOrDynamic,
        other => {
            return Err(doc.field_error(
                "iommu.ddw_policy",
                format!(
                    "unknown policy \"{other}\": expected \"disabled\" (no DDW), \"direct-only\" (Linux before 2020: only a DDW that maps all memory) or \"direct-or-dynamic\" (since 2020: else a dynamic DDW)"
                ),
            ))
        }
    };
    let fits = matches!(
        (mode, policy),
        (
            IommuMode::DefaultWindow,
            DdwPolicy::Disabled | DdwPolicy::DirectOnly
        ) | (IommuMode::DdwDynamic, DdwPolicy::DirectOrDynamic)
            | (
                IommuMode::DdwDirect,
                DdwPolicy::DirectOnly | DdwPolicy::DirectOrDynamic
            )
    );
    if !fits {
        let why = match mode {
            IommuMode::DefaultWindow => "\"direct-or-dynamic\" keeps a DDW too small for a direct map as a dynamic window: expected \"disabled\" or \"direct-only\" for mode default-window",
            IommuMode::DdwDynamic => "only \"direct-or-dynamic\" creates a dynamic DDW",
            _ => "\"disabled\" creates no DDW: expected \"direct-only\" or \"direct-or-dynamic\" for mode ddw-direct",
        };
        return Err(doc.field_error("iommu.ddw_policy", why.to_owned()));
    }
    Ok(policy)
}

/// The IOMMU instance of every device: `device[i].iommu_instance` where `named[i]` is set,
/// else `i mod iommu.instances` (the devices spread over the instances in order, as a
/// platform's root complexes each sit behind their own SMMU or DMAR unit). Refuses more
/// instances than devices (an instance with no device behind it) and an instance number
/// out of range.
pub(super) fn instances(
    doc: &TomlDoc<'_>,
    iommu: &IommuSetup,
    named: &[Option<usize>],
) -> Result<Vec<usize>, InputError> {
    let n = iommu.instances;
    if n > named.len() {
        return Err(doc.field_error(
            "iommu.instances",
            format!(
                "expected at most one instance per device ({} device{}), got {n}: an instance with no device behind it does nothing",
                named.len(),
                if named.len() == 1 { "" } else { "s" }
            ),
        ));
    }
    let out: Vec<usize> = named
        .iter()
        .enumerate()
        .map(|(i, k)| k.unwrap_or(i % n))
        .collect();
    for (i, k) in named.iter().enumerate() {
        if let Some(k) = *k {
            if k >= n {
                return Err(doc.field_error(
                    &format!("device[{i}].iommu_instance"),
                    format!("expected an instance in 0..{n} (iommu.instances = {n}), got {k}"),
                ));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lab::spec::testing::*;

    #[test]
    fn iommu_defaults_follow_the_model_and_the_kernel_release() {
        let s = ok(FIO_NVME);
        let i = &s.iommu;
        assert_eq!(
            (i.model, i.mode, i.cmdq),
            (IommuModel::Smmuv3, IommuMode::Strict, CmdqDesign::LockFree)
        );
        assert!(i.uses_cmdq() && !i.uses_x86_queue());
        assert_eq!(
            (i.cmdq_log2size, i.cmdq_batch_max),
            (d::CMDQ_LOG2SIZE.0, d::CMDQ_BATCH_MAX.0)
        );
        assert_eq!((i.instances, i.instance_of(0)), (1, 0));
        assert_eq!(i.evtq_log2size, d::EVTQ_LOG2SIZE.0);
        // Without a mode the model's first: strict for the SMMUv3.
        let s = ok(&FIO_NVME.replace("mode = \"strict\"\n", ""));
        assert_eq!(s.iommu.mode, IommuMode::Strict);
        // A release before 5.4 has the spinlock queue.
        let s = ok(&with(FIO_NVME, "kernel", "version = \"5.2\""));
        assert_eq!(s.iommu.cmdq, CmdqDesign::Spinlock);
        let s = ok(&with(
            FIO_NVME,
            "iommu",
            "cmdq = \"spinlock\"\ncmdq_log2size = 10",
        ));
        assert_eq!(
            (s.iommu.cmdq, s.iommu.cmdq_log2size),
            (CmdqDesign::Spinlock, 10)
        );
        // `none` is an alias of `off`.
        let s = ok(&FIO_SAS.replace("model = \"none\"", "model = \"none\"\nmode = \"none\""));
        assert_eq!(
            (s.iommu.model, s.iommu.mode),
            (IommuModel::None, IommuMode::Off)
        );
    }

    #[test]
    fn iommu_fields_out_of_range_of_the_wrong_type_or_unknown_are_refused() {
        refused(
            &with(FIO_NVME, "iommu", "cmdq_log2size = 2"),
            "iommu.cmdq_log2size",
            &format!("expected 4..={MAX_CMDQ_LOG2SIZE} (cap MAX_CMDQ_LOG2SIZE), got 2"),
        );
        refused(
            &with(FIO_NVME, "iommu", "cmdq_log2size = 4\ncmdq_batch_max = 16"),
            "iommu.cmdq_batch_max",
            "expected 2..=15 commands (fewer than the queue's slots), got 16",
        );
        refused(
            &with(FIO_NVME, "iommu", "cmdq_log2size = \"x\""),
            "iommu.cmdq_log2size",
            "invalid type: string \"x\", expected a non-negative integer",
        );
        refused(
            &with(FIO_NVME, "iommu", "cmdq = \"ticket\""),
            "iommu.cmdq",
            "unknown design \"ticket\": expected \"spinlock\", \"lockfree\" or \"atomic-add\"",
        );
        refused(
            &with(FIO_NVME, "iommu", "stage = 2"),
            "iommu.stage",
            "unknown field `stage`, expected one of `model`, `mode`, `cmdq`",
        );
        refused(
            &FIO_NVME.replace("\"smmuv3\"", "\"dart\""),
            "iommu.model",
            "unknown model \"dart\": expected one of \"none\", \"smmuv3\", \"ipmmu\"",
        );
        refused(
            &FIO_NVME.replace("\"strict\"", "\"ddw-direct\""),
            "iommu.mode",
            "mode \"ddw-direct\" does not apply to iommu.model = \"smmuv3\": expected one of \"strict\", \"lazy\", \"passthrough\", \"off\"",
        );
        refused(
            &FIO_NVME.replace("\"strict\"", "\"eager\""),
            "iommu.mode",
            "unknown mode \"eager\": for iommu.model = \"smmuv3\" expected one of",
        );
        refused(
            &with(FIO_NVME, "kernel", "version = \"4.19\"").replace("\"strict\"", "\"lazy\""),
            "iommu.mode",
            "Linux 4.19 has no lazy mode for SMMUv3",
        );
    }

    #[test]
    fn iommu_fields_that_do_not_apply_to_the_model_or_mode_are_refused() {
        let passthrough = FIO_NVME.replace("\"strict\"", "\"passthrough\"");
        refused(
            &with(&passthrough, "iommu", "cmdq = \"lockfree\""),
            "iommu.cmdq",
            "applies to iommu.model = \"smmuv3\" in mode strict or lazy only",
        );
        refused(
            &with(FIO_NVME, "iommu", "flush_queue_size = 64"),
            "iommu.flush_queue_size",
            "applies to mode = \"lazy\" only",
        );
        refused(
            &with(FIO_NVME, "iommu", "caching_mode = true"),
            "iommu.caching_mode",
            "applies to iommu.model = \"vtd\" only",
        );
        refused(
            &with(FIO_NVME, "iommu", "vtd_nonleaf_psi = \"range\""),
            "iommu.vtd_nonleaf_psi",
            "applies to iommu.model = \"vtd\" only",
        );
        refused(
            &with(FIO_NVME, "iommu", "window_mib = 256"),
            "iommu.window_mib",
            "applies to iommu.model = \"sba\" in mode translated or bypass only",
        );
        refused(
            &with(FIO_NVME, "iommu", "ddw_policy = \"disabled\""),
            "iommu.ddw_policy",
            "applies to iommu.model = \"pseries\" only",
        );
        refused(
            &with(&passthrough, "iommu", "evtq_log2size = 8"),
            "iommu.evtq_log2size",
            "applies to iommu.model = \"smmuv3\" in mode strict or lazy only",
        );
        refused(
            &with(
                &NETPERF_NIC.replace("\"default-window\"", "\"passthrough\""),
                "iommu",
                "ddw_policy = \"disabled\"",
            ),
            "iommu.ddw_policy",
            "applies to iommu.model = \"pseries\" in a window mode (not passthrough) only",
        );
        refused(
            &with(&passthrough, "iommu", "instances = 1"),
            "iommu.instances",
            "applies to iommu.model = \"smmuv3\", \"vtd\" or \"amd-vi\" in mode strict or lazy only",
        );
    }

    #[test]
    fn sba_and_pseries_fields_are_checked_against_their_hardware() {
        let s = ok(&with(
            BONNIE_SCSI,
            "iommu",
            "window_mib = 512\nwindow_base_mib = 1024",
        ));
        assert_eq!(s.iommu.sba_window, (1 << 30, 512 << 20));
        assert_eq!(s.iommu.sba_page_size, d::SBA_PAGE_SIZE.0);
        refused(
            &with(BONNIE_SCSI, "iommu", "window_mib = 384"),
            "iommu.window_mib",
            "expected a power of two (the IOC decodes a naturally aligned window), got 384",
        );
        refused(
            &with(BONNIE_SCSI, "iommu", "page_size = 8000"),
            "iommu.page_size",
            "expected a power of two in 4096..=65536 bytes, got 8000",
        );
        let s = ok(NETPERF_NIC);
        assert_eq!(s.iommu.ddw_policy, DdwPolicy::Disabled);
        assert_eq!(s.iommu.default_window_bytes, d::DEFAULT_WINDOW_MIB.0 << 20);
        refused(
            &with(NETPERF_NIC, "iommu", "ddw_policy = \"direct-or-dynamic\""),
            "iommu.ddw_policy",
            "\"direct-or-dynamic\" keeps a DDW too small for a direct map as a dynamic window",
        );
        refused(
            &with(NETPERF_NIC, "iommu", "ddw_page_kib = 4"),
            "iommu.ddw_page_kib",
            "applies to the ddw-dynamic and ddw-direct modes",
        );
        let direct = NETPERF_NIC.replace("\"default-window\"", "\"ddw-direct\"");
        let s = ok(&direct);
        assert_eq!(s.iommu.ddw_window_bytes, 128 << 30);
        refused(
            &with(&direct, "iommu", "ddw_window_gib = 64"),
            "iommu.ddw_window_gib",
            "a direct DDW maps all memory: expected at least machine.memory_gib = 128",
        );
        refused(
            &with(&direct, "iommu", "ddw_page_kib = 8"),
            "iommu.ddw_page_kib",
            "expected 4, 64, 2048 or 16384 (a TCE page size PowerVM offers), got 8",
        );
    }

    #[test]
    fn instances_spread_the_devices_or_follow_each_device() {
        let two = format!(
            "{}\n[[device]]\nkind = \"nvme\"\n",
            with(FIO_NVME, "iommu", "instances = 2")
        );
        let s = ok(&two);
        assert_eq!(s.iommu.device_instance, vec![0, 1]);
        let s = ok(&two.replace(
            "[[device]]\nkind = \"nvme\"\n",
            "[[device]]\nkind = \"nvme\"\niommu_instance = 1\n",
        ));
        assert_eq!(s.iommu.device_instance, vec![1, 1]);
        refused(
            &two.replace(
                "[[device]]\nkind = \"nvme\"\n",
                "[[device]]\nkind = \"nvme\"\niommu_instance = 2\n",
            ),
            "device[0].iommu_instance",
            "expected an instance in 0..2 (iommu.instances = 2), got 2",
        );
        refused(
            &with(FIO_NVME, "iommu", "instances = 2"),
            "iommu.instances",
            "expected at most one instance per device (1 device), got 2",
        );
    }
}
