//! The workload-scenario file: its TOML schema and its validation into a [`LabScenario`].
//!
//! The file is read in two passes so every error keeps its line: a first, lenient pass reads
//! only `workload.kind` and each `device[].kind`; the second deserializes the whole file
//! strictly (`deny_unknown_fields`) with the workload and device tables of those kinds, so
//! a field that belongs to another kind is reported as unknown where it stands. Checks that
//! serde cannot express (ranges, caps, combinations) name their field through
//! [`TomlDoc::field_error`]. See docs/SCENARIOS.md for every field, default and cap.

use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::Deserialize;

use iolab_iommu::linux::{DmaPathVariants, KernelVersion};
use iolab_iommu::smmuv3::ProducerKind;

use super::LabError;
use crate::cost::PlatformProfile;
use crate::tomlfile::{InputError, TomlDoc};
use crate::workloads::fio::RwPattern;

use super::caps::*;
use super::defaults as d;

// ---------------------------------------------------------------------------------------
// The file as written
// ---------------------------------------------------------------------------------------

#[derive(Deserialize)]
struct KindOnly {
    #[serde(default)]
    kind: Option<toml::Value>,
}

/// First pass: only what picks the second pass's types.
#[derive(Deserialize)]
struct Probe {
    #[serde(default)]
    device: Option<Vec<KindOnly>>,
    #[serde(default)]
    workload: Option<KindOnly>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File<D, W> {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    seed: Option<u64>,
    machine: MachineSpec,
    iommu: IommuSpec,
    #[serde(default)]
    kernel: KernelSpec,
    device: Vec<D>,
    workload: W,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MachineSpec {
    platform: String,
    #[serde(default)]
    cpus: Option<usize>,
    #[serde(default)]
    memory_gib: Option<u64>,
    /// Profile costs this scenario overrides, by dotted cost path.
    #[serde(default)]
    costs: std::collections::BTreeMap<String, CostOverride>,
}

/// `machine.costs."PATH" = { value, unit?, source }`: one profile cost replaced.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CostOverride {
    value: f64,
    #[serde(default)]
    unit: Option<crate::cost::Unit>,
    source: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct IommuSpec {
    model: String,
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
    default_window_mib: Option<u64>,
    #[serde(default)]
    ddw_window_gib: Option<u64>,
    #[serde(default)]
    ddw_page_kib: Option<u64>,
    #[serde(default)]
    caching_mode: Option<bool>,
    #[serde(default)]
    instances: Option<usize>,
}

#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct KernelSpec {
    #[serde(default)]
    version: Option<String>,
    #[serde(default)]
    block_submit_ns: Option<u64>,
    #[serde(default)]
    block_complete_ns: Option<u64>,
    #[serde(default)]
    irq_entry_ns: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NvmeSpec {
    #[allow(dead_code)]
    kind: String,
    #[serde(default)]
    io_queues: Option<usize>,
    #[serde(default)]
    max_iops: Option<f64>,
    #[serde(default)]
    bandwidth_gb_per_s: Option<f64>,
    #[serde(default)]
    read_latency_us: Option<f64>,
    #[serde(default)]
    write_latency_us: Option<f64>,
    #[serde(default)]
    submit_ns: Option<u64>,
    #[serde(default)]
    complete_ns: Option<u64>,
    #[serde(default)]
    iommu_instance: Option<usize>,
    #[serde(default)]
    coalesce_threshold: Option<u64>,
    #[serde(default)]
    coalesce_time_100us: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SasSpec {
    #[allow(dead_code)]
    kind: String,
    #[serde(default)]
    disks: Option<usize>,
    #[serde(default)]
    completion_queues: Option<usize>,
    #[serde(default)]
    hba_command_ns: Option<f64>,
    #[serde(default)]
    disk_read_latency_us: Option<f64>,
    #[serde(default)]
    disk_write_latency_us: Option<f64>,
    #[serde(default)]
    disk_max_iops: Option<f64>,
    #[serde(default)]
    link_gb_per_s: Option<f64>,
    #[serde(default)]
    submit_ns: Option<u64>,
    #[serde(default)]
    complete_ns: Option<u64>,
    #[serde(default)]
    iommu_instance: Option<usize>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ScsiSpec {
    #[allow(dead_code)]
    kind: String,
    #[serde(default)]
    bus_mb_per_s: Option<f64>,
    #[serde(default)]
    hba_command_us: Option<f64>,
    #[serde(default)]
    hba_per_sge_ns: Option<f64>,
    #[serde(default)]
    sg_tablesize: Option<usize>,
    #[serde(default)]
    max_sectors: Option<u64>,
    #[serde(default)]
    max_segment_kib: Option<u64>,
    #[serde(default)]
    submit_kcycles: Option<f64>,
    #[serde(default)]
    per_sge_cycles: Option<f64>,
    #[serde(default)]
    complete_kcycles: Option<f64>,
    #[serde(default)]
    capacity_gb: Option<f64>,
    #[serde(default)]
    rpm: Option<f64>,
    #[serde(default)]
    seek_read_ms: Option<f64>,
    #[serde(default)]
    seek_write_ms: Option<f64>,
    #[serde(default)]
    media_mb_per_s: Option<f64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReaimSpec {
    #[allow(dead_code)]
    kind: String,
    #[serde(default)]
    workfile: Option<String>,
    start: u32,
    end: u32,
    increment: u32,
    #[serde(default)]
    timeslice_ms: Option<f64>,
    #[serde(default)]
    jitter_pct: Option<f64>,
    #[serde(default, deserialize_with = "crate::size::opt_bytes")]
    fs_block: Option<u64>,
    #[serde(default)]
    journal_blocks: Option<u64>,
    #[serde(default)]
    task: Option<Vec<ReaimTaskSpec>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ReaimTaskSpec {
    name: String,
    weight: u32,
    #[serde(default)]
    user_kcycles: f64,
    #[serde(default)]
    sys_kcycles: f64,
    #[serde(default)]
    sync_write_kib: u64,
    #[serde(default)]
    #[allow(dead_code)]
    source: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct UsbSpec {
    #[allow(dead_code)]
    kind: String,
    #[serde(default)]
    speed: Option<String>,
    #[serde(default)]
    command_overhead_ns: Option<u64>,
    #[serde(default)]
    per_segment_ns: Option<u64>,
    #[serde(default)]
    media_read_latency_us: Option<f64>,
    #[serde(default)]
    media_flush_us: Option<f64>,
    #[serde(default)]
    completion_ns: Option<u64>,
    #[serde(default)]
    storage_cpu: Option<usize>,
    #[serde(default)]
    irq_cpu: Option<usize>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NicSpec {
    #[allow(dead_code)]
    kind: String,
    #[serde(default)]
    link_gbps: Option<f64>,
    #[serde(default)]
    mtu: Option<u64>,
    #[serde(default)]
    queues: Option<usize>,
    #[serde(default)]
    tx_ring_entries: Option<usize>,
    #[serde(default)]
    rx_ring_pages: Option<usize>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BonnieSpec {
    #[allow(dead_code)]
    kind: String,
    #[serde(default)]
    file_mib: Option<u64>,
    #[serde(default)]
    logical_file_mib: Option<u64>,
    #[serde(default)]
    ram_mib: Option<u64>,
    #[serde(default, deserialize_with = "crate::size::opt_bytes")]
    chunk_bytes: Option<u64>,
    #[serde(default)]
    seeks: Option<u64>,
    #[serde(default)]
    seeker_cpus: Option<Vec<usize>>,
    #[serde(default)]
    bonnie_cpu: Option<usize>,
    #[serde(default)]
    flusher_cpu: Option<usize>,
    #[serde(default)]
    files: Option<u64>,
    #[serde(default)]
    csv: Option<toml::Value>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NetperfSpec {
    #[allow(dead_code)]
    kind: String,
    #[serde(default)]
    direction: Option<String>,
    #[serde(default)]
    threads: Option<usize>,
    #[serde(default, deserialize_with = "crate::size::opt_bytes")]
    message_bytes: Option<u64>,
    run_ms: u64,
    #[serde(default)]
    warmup_ms: Option<u64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DmaMapBenchmarkSpec {
    #[allow(dead_code)]
    kind: String,
    #[serde(default)]
    threads: Option<u32>,
    runtime_ms: u64,
    #[serde(default)]
    granule: Option<u32>,
    #[serde(default)]
    dir: Option<String>,
    #[serde(default)]
    dma_trans_ns: Option<u64>,
    #[serde(default)]
    node: Option<i64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FioSpec {
    #[allow(dead_code)]
    kind: String,
    rw: String,
    #[serde(default)]
    rwmixread: Option<u32>,
    #[serde(default, deserialize_with = "crate::size::opt_bytes")]
    bs: Option<u64>,
    #[serde(default)]
    iodepth: Option<u32>,
    #[serde(default)]
    numjobs: Option<u32>,
    #[serde(default)]
    iodepth_batch_submit: Option<u32>,
    #[serde(default)]
    iodepth_batch_complete_min: Option<u32>,
    #[serde(default)]
    first_cpu: Option<usize>,
    #[serde(default)]
    size_gib: Option<u64>,
    runtime_ms: u64,
    #[serde(default)]
    ramp_ms: Option<u64>,
    #[serde(default)]
    user_ns_per_io: Option<u64>,
}

// ---------------------------------------------------------------------------------------
// The validated scenario
// ---------------------------------------------------------------------------------------

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
            IommuModel::Pseries => &["default-window", "ddw-dynamic", "ddw-direct"],
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
    /// Lock-free reservation, gathered batches (Linux 5.3 onwards).
    LockFree,
}

impl CmdqDesign {
    /// The scenario spelling.
    pub fn name(self) -> &'static str {
        match self {
            CmdqDesign::Spinlock => "spinlock",
            CmdqDesign::LockFree => "lockfree",
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
    /// POWER: default window size, bytes.
    pub default_window_bytes: u64,
    /// POWER: DDW size, bytes.
    pub ddw_window_bytes: u64,
    /// POWER: log2 of the DDW's TCE page size.
    pub ddw_page_shift: u32,
    /// The DMA-path algorithms of the scenario's Linux release (`kernel.version`).
    pub kernel: DmaPathVariants,
    /// VT-d: Caching Mode (a virtual IOMMU): maps are invalidated, lazy mode unavailable.
    pub caching_mode: bool,
    /// IOMMU instances (SMMUs, DMAR units): each its own unit, domain, IOVA allocator and
    /// timed command or invalidation queue. 1 unless `iommu.instances` says more.
    pub instances: usize,
    /// Per device (block workloads), the instance it sits behind: `device[i].iommu_instance`,
    /// by default `i mod instances`. Empty for workloads with one device and one instance.
    pub device_instance: Vec<usize>,
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

/// Per-I/O kernel costs of the block path, ns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockKernel {
    /// io_submit per iocb down to the driver (aio, bio, blk-mq request).
    pub block_submit_ns: u64,
    /// Request completion up to the waiting fio thread's wake-up.
    pub block_complete_ns: u64,
    /// Interrupt entry and exit, per interrupt.
    pub irq_entry_ns: u64,
    /// The driver's submission path per command.
    pub driver_submit_ns: u64,
    /// The driver's completion path per command.
    pub driver_complete_ns: u64,
}

/// The devices of a scenario (all of one kind).
#[derive(Clone, Debug, PartialEq)]
pub enum Devices {
    /// NVMe SSDs.
    Nvme(Vec<NvmeSetup>),
    /// SAS HBAs, each with its disks.
    Sas(Vec<crate::devices::sas::SasParams>),
    /// One USB mass-storage device behind an xHCI.
    Usb(Box<UsbSetup>),
    /// One NIC (an SR-IOV VF of a 100 GbE adapter by default).
    Nic(crate::devices::nic::LinkConfig),
    /// One SCSI/SAS HBA with one rotating disk (re-aim).
    Scsi(Box<ScsiSetup>),
}

/// A validated NVMe SSD.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NvmeSetup {
    /// The device class (queues, rated IOPS, bandwidth, media latencies).
    pub params: crate::devices::nvme::NvmeParams,
    /// Interrupt Coalescing (Set Features, Feature ID 08h) as the driver set it; off
    /// (every completion raises its vector's interrupt) unless the scenario sets
    /// `coalesce_threshold` and `coalesce_time_100us`.
    pub coalescing: crate::devices::nvme::InterruptCoalescing,
}

/// A validated SCSI/SAS HBA with its disk ([`crate::devices::scsi`]).
#[derive(Clone, Debug, PartialEq)]
pub struct ScsiSetup {
    /// HBA, bus, driver and disk timing.
    pub params: crate::devices::scsi::ScsiParams,
    /// The block layer's queue limits.
    pub limits: crate::block::QueueLimits,
    /// Disk capacity, bytes.
    pub disk_bytes: u64,
}

/// A validated USB mass-storage device.
#[derive(Clone, Debug, PartialEq)]
pub struct UsbSetup {
    /// Device, link and host-controller parameters.
    pub config: crate::devices::usb::UsbStorageConfig,
    /// The DMA layer's maximum segment size, bytes.
    pub max_segment_size: u64,
    /// The block layer's maximum segments per request.
    pub max_segments: usize,
}

impl Devices {
    /// The scenario spelling of the kind.
    pub fn kind(&self) -> &'static str {
        match self {
            Devices::Nvme(_) => "nvme",
            Devices::Sas(_) => "sas",
            Devices::Usb(_) => "usb",
            Devices::Nic(_) => "nic",
            Devices::Scsi(_) => "scsi",
        }
    }

    /// How many devices.
    pub fn len(&self) -> usize {
        match self {
            Devices::Nvme(v) => v.len(),
            Devices::Sas(v) => v.len(),
            Devices::Usb(_) | Devices::Nic(_) | Devices::Scsi(_) => 1,
        }
    }

    /// Whether there are none (never, after validation).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A validated fio workload.
#[derive(Clone, Debug, PartialEq)]
pub struct FioSetup {
    /// Access pattern.
    pub rw: RwPattern,
    /// Percent reads for randrw.
    pub rwmixread: u32,
    /// Block size, bytes.
    pub bs: u64,
    /// I/Os in flight per job.
    pub iodepth: u32,
    /// Jobs.
    pub numjobs: u32,
    /// `iodepth_batch_submit`.
    pub batch_submit: u32,
    /// `iodepth_batch_complete_min`.
    pub batch_complete_min: u32,
    /// CPU of job 0 (job j runs on `first_cpu + j`).
    pub first_cpu: usize,
    /// Target size, bytes.
    pub size: u64,
    /// Measured time, ns.
    pub runtime_ns: u64,
    /// Ramp time, ns.
    pub ramp_ns: u64,
    /// fio's own user time per I/O, ns.
    pub user_ns_per_io: u64,
}

/// The direction of the benchmark's mappings (`dma_map_benchmark -d`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MapDirection {
    /// `DMA_BIDIRECTIONAL` (`-d 0`, the tool's default).
    Bidirectional,
    /// `DMA_TO_DEVICE` (`-d 1`).
    ToDevice,
    /// `DMA_FROM_DEVICE` (`-d 2`): the buffer is not written before each map.
    FromDevice,
}

impl MapDirection {
    /// The spellings a scenario accepts, in the tool's `-d` order.
    pub const NAMES: [&'static str; 3] = ["bidirectional", "to_device", "from_device"];

    /// The name the tool prints (`dir:BIDIRECTIONAL`).
    pub fn tool_name(self) -> &'static str {
        match self {
            MapDirection::Bidirectional => "BIDIRECTIONAL",
            MapDirection::ToDevice => "TO_DEVICE",
            MapDirection::FromDevice => "FROM_DEVICE",
        }
    }
}

/// A validated `dma_map_benchmark` workload: `threads` kernel threads, thread `i` on CPU
/// `i`, each mapping and unmapping one buffer of `granule` pages in a loop for `runtime_ns`.
#[derive(Clone, Debug, PartialEq)]
pub struct DmaMapBenchmarkSetup {
    /// Threads (`-t`).
    pub threads: u32,
    /// How long the threads run, ns (`-s`, in seconds there).
    pub runtime_ns: u64,
    /// Pages per mapping (`-g`).
    pub granule: u32,
    /// Direction (`-d`).
    pub dir: MapDirection,
    /// Busy delay between each map and its unmap, ns (`-x`).
    pub dma_trans_ns: u64,
}

/// A validated bonnie++ workload.
#[derive(Clone, Debug, PartialEq)]
pub struct BonnieSetup {
    /// The suite's configuration (file, page cache, placement).
    pub config: crate::workloads::bonnie::BonnieConfig,
    /// The size column of the CSV row, MiB (the logical file size bonnie++ reports).
    pub size_mib: u64,
    /// The CSV layout the run prints (`workload.csv`, default bonnie++ 1.03).
    pub csv: crate::workloads::bonnie::CsvLayout,
}

/// A validated netperf-like stream workload.
#[derive(Clone, Debug, PartialEq)]
pub struct NetperfSetup {
    /// Threads, direction, message size, rings, run length.
    pub stream: crate::workloads::netperf::StreamConfig,
    /// Network-stack CPU costs.
    pub costs: crate::workloads::netperf::StackCosts,
    /// Whether the hypervisor serialises TCE updates per table.
    pub serialisation: crate::devices::nic::HvSerialisation,
}

/// A validated re-aim workload.
#[derive(Clone, Debug, PartialEq)]
pub struct ReaimSetup {
    /// The workfile (task costs resolved to ns at the profile's clock).
    pub workfile: crate::workloads::reaim::Workfile,
    /// The user counts of the ramp.
    pub users: Vec<u32>,
    /// Scheduler timeslice, ns.
    pub slice_ns: u64,
    /// Per-run cost variation, fraction.
    pub jitter: f64,
    /// File-system block size, bytes.
    pub fs_block: u64,
    /// Journal blocks per commit.
    pub journal_blocks: u64,
}

/// The workload of a scenario.
#[derive(Clone, Debug, PartialEq)]
pub enum Workload {
    /// fio on block devices.
    Fio(FioSetup),
    /// bonnie++ on a USB disk, an NVMe SSD or a SAS HBA.
    Bonnie(Box<BonnieSetup>),
    /// netperf-like TCP streams on a NIC.
    Netperf(Box<NetperfSetup>),
    /// re-aim on a SCSI/SAS disk.
    Reaim(Box<ReaimSetup>),
    /// The kernel's DMA-mapping benchmark (`kernel/dma/map_benchmark.c`) bound to a block
    /// device.
    DmaMapBenchmark(DmaMapBenchmarkSetup),
}

impl Workload {
    /// The scenario spelling of the kind.
    pub fn kind(&self) -> &'static str {
        match self {
            Workload::Fio(_) => "fio",
            Workload::Bonnie(_) => "bonnie",
            Workload::Netperf(_) => "netperf",
            Workload::Reaim(_) => "reaim",
            Workload::DmaMapBenchmark(_) => "dma_map_benchmark",
        }
    }
}

/// A validated workload scenario: everything a run needs.
#[derive(Clone, Debug)]
pub struct LabScenario {
    /// The scenario's label (`name`, default `lab`).
    pub name: String,
    /// The scenario's description, if any.
    pub description: Option<String>,
    /// The scenario's own seed (`--seed` overrides it).
    pub seed: Option<u64>,
    /// The platform profile.
    pub profile: PlatformProfile,
    /// Virtual CPUs.
    pub cpus: usize,
    /// Memory, bytes.
    pub memory_bytes: u64,
    /// The IOMMU.
    pub iommu: IommuSetup,
    /// Block-path kernel costs (block workloads).
    pub kernel: BlockKernel,
    /// The devices.
    pub devices: Devices,
    /// The workload.
    pub workload: Workload,
}

// ---------------------------------------------------------------------------------------
// Validation
// ---------------------------------------------------------------------------------------

const DEVICE_KINDS: [&str; 5] = ["nvme", "sas", "usb", "nic", "scsi"];
const WORKLOAD_KINDS: [&str; 5] = ["fio", "bonnie", "netperf", "reaim", "dma_map_benchmark"];

fn one_of(names: &[&str]) -> String {
    let q: Vec<String> = names.iter().map(|n| format!("\"{n}\"")).collect();
    format!("expected one of {}", q.join(", "))
}

fn kind_of(
    doc: &TomlDoc<'_>,
    path: &str,
    k: &KindOnly,
    kinds: &[&str],
) -> Result<String, InputError> {
    match &k.kind {
        Some(toml::Value::String(s)) if kinds.contains(&s.as_str()) => Ok(s.clone()),
        Some(toml::Value::String(s)) => Err(doc.field_error(
            &format!("{path}.kind"),
            format!("unknown kind \"{s}\": {}", one_of(kinds)),
        )),
        Some(_) => Err(doc.field_error(&format!("{path}.kind"), one_of(kinds))),
        None => Err(doc.field_error(path, format!("missing field `kind`: {}", one_of(kinds)))),
    }
}

/// A range check on an integer field.
fn range<T: PartialOrd + Copy + std::fmt::Display>(
    doc: &TomlDoc<'_>,
    path: &str,
    v: T,
    lo: T,
    hi: T,
    what: &str,
) -> Result<T, InputError> {
    if v < lo || v > hi {
        return Err(doc.field_error(path, format!("expected {lo}..={hi} {what}, got {v}")));
    }
    Ok(v)
}

/// A range check on a real field (finite, within bounds).
fn real(doc: &TomlDoc<'_>, path: &str, v: f64, lo: f64, hi: f64) -> Result<f64, InputError> {
    if !v.is_finite() || v < lo || v > hi {
        return Err(doc.field_error(path, format!("expected a number in {lo}..={hi}, got {v}")));
    }
    Ok(v)
}

/// Microseconds as whole nanoseconds.
fn us_to_ns(us: f64) -> u64 {
    (us * 1e3).round() as u64
}

/// The checks of one table's optional fields (`device[0]`, `workload`, ...): each takes
/// the field's value or its default, checks it with [`range`], [`real`] or [`cpu`], and
/// names `{table}.{field}` in its error.
struct Fields<'a, 'd> {
    doc: &'a TomlDoc<'d>,
    table: String,
}

impl<'a, 'd> Fields<'a, 'd> {
    fn new(doc: &'a TomlDoc<'d>, table: impl Into<String>) -> Self {
        Fields {
            doc,
            table: table.into(),
        }
    }

    /// The field's path in errors.
    fn path(&self, field: &str) -> String {
        format!("{}.{field}", self.table)
    }

    /// An integer field's value `v`, which must be in `bounds` (`what` names its unit or
    /// cap).
    fn int<T: PartialOrd + Copy + std::fmt::Display>(
        &self,
        field: &str,
        v: T,
        bounds: RangeInclusive<T>,
        what: &str,
    ) -> Result<T, InputError> {
        let (lo, hi) = bounds.into_inner();
        range(self.doc, &self.path(field), v, lo, hi, what)
    }

    /// Replaces `target` with an integer field the table sets (checked as by
    /// [`Fields::int`]); leaves it as it is when the field is absent.
    fn set_int<T: PartialOrd + Copy + std::fmt::Display>(
        &self,
        target: &mut T,
        field: &str,
        v: Option<T>,
        bounds: RangeInclusive<T>,
        what: &str,
    ) -> Result<(), InputError> {
        if let Some(v) = v {
            *target = self.int(field, v, bounds, what)?;
        }
        Ok(())
    }

    /// A real field's value `v`, which must be finite and in `bounds`.
    fn real(&self, field: &str, v: f64, bounds: RangeInclusive<f64>) -> Result<f64, InputError> {
        let (lo, hi) = bounds.into_inner();
        real(self.doc, &self.path(field), v, lo, hi)
    }

    /// A time field written in microseconds (checked as by [`Fields::real`]), as whole
    /// nanoseconds.
    fn us_as_ns(
        &self,
        field: &str,
        v: f64,
        bounds: RangeInclusive<f64>,
    ) -> Result<u64, InputError> {
        Ok(us_to_ns(self.real(field, v, bounds)?))
    }

    /// A CPU index field, as [`cpu`] checks it.
    fn cpu(
        &self,
        field: &str,
        v: Option<usize>,
        default: usize,
        cpus: usize,
    ) -> Result<usize, InputError> {
        cpu(self.doc, &self.path(field), v, default, cpus)
    }
}

/// Resolves `machine.platform`: a bundled profile name, or a path (relative to the
/// scenario file's directory when the scenario came from a file).
fn load_profile(
    doc: &TomlDoc<'_>,
    platform: &str,
    base: Option<&Path>,
) -> Result<PlatformProfile, LabError> {
    if let Ok(p) = PlatformProfile::bundled(platform) {
        return Ok(p);
    }
    let looks_like_path = platform.ends_with(".toml") || platform.contains('/');
    if !looks_like_path {
        return Err(doc
            .field_error(
                "machine.platform",
                format!(
                    "unknown platform \"{platform}\": expected a bundled profile ({}) or a path to a profile TOML",
                    PlatformProfile::bundled_names().join(", ")
                ),
            )
            .into());
    }
    let mut path = PathBuf::from(platform);
    if path.is_relative() {
        if let Some(b) = base {
            path = b.join(path);
        }
    }
    if !path.is_file() {
        return Err(doc
            .field_error(
                "machine.platform",
                format!("no profile file at {}", path.display()),
            )
            .into());
    }
    Ok(PlatformProfile::from_file(&path)?)
}

/// Applies `machine.costs`: each entry replaces the profile's cost at its dotted path
/// (value, unit when given, and source), then the profile is checked again.
fn override_costs(
    doc: &TomlDoc<'_>,
    profile: &mut PlatformProfile,
    costs: &std::collections::BTreeMap<String, CostOverride>,
) -> Result<(), LabError> {
    for (path, o) in costs {
        let field = format!("machine.costs.\"{path}\"");
        let Some(cost) = profile.cost_mut(path) else {
            let known: Vec<String> = profile.costs().into_iter().map(|(p, _)| p).collect();
            return Err(doc
                .field_error(
                    &field,
                    format!(
                        "platform {} has no cost \"{path}\": expected one of {}",
                        profile.name,
                        known.join(", ")
                    ),
                )
                .into());
        };
        if o.source.trim().is_empty() {
            return Err(doc
                .field_error(
                    &format!("{field}.source"),
                    "expected a citation or `assumption: ...`, found an empty source",
                )
                .into());
        }
        cost.value = o.value;
        if let Some(u) = o.unit {
            cost.unit = u;
        }
        cost.source = o.source.clone();
        if let Err(e) = profile.revalidate() {
            return Err(doc
                .field_error(&format!("{field}.value"), e.to_string())
                .into());
        }
    }
    Ok(())
}

fn deserialize_as<D: DeserializeOwned, W: DeserializeOwned>(
    doc: &TomlDoc<'_>,
) -> Result<File<D, W>, InputError> {
    doc.deserialize::<File<D, W>>()
}

/// Validates a workload scenario. `base` is the directory relative profile paths are
/// resolved against (the scenario file's directory).
pub fn validate(text: &str, origin: &str, base: Option<&Path>) -> Result<LabScenario, LabError> {
    let doc = TomlDoc::parse(text, origin)?;
    let probe: Probe = doc.deserialize()?;
    let Some(devices) = probe.device else {
        return Err(doc
            .field_error(
                "device",
                "missing: expected at least one [[device]] table (or a top-level `experiment` key for the published experiments)",
            )
            .into());
    };
    let Some(workload) = probe.workload else {
        return Err(doc
            .field_error(
                "workload",
                "missing: expected a [workload] table with a `kind`",
            )
            .into());
    };
    let wkind = kind_of(&doc, "workload", &workload, &WORKLOAD_KINDS)?;
    if devices.is_empty() {
        return Err(doc
            .field_error("device", "expected at least one [[device]]")
            .into());
    }
    if devices.len() > MAX_DEVICES {
        return Err(doc
            .field_error(
                "device",
                format!(
                    "expected at most {MAX_DEVICES} devices (cap MAX_DEVICES), got {}",
                    devices.len()
                ),
            )
            .into());
    }
    let mut dkind = String::new();
    for (i, dev) in devices.iter().enumerate() {
        let k = kind_of(&doc, &format!("device[{i}]"), dev, &DEVICE_KINDS)?;
        if i == 0 {
            dkind = k;
        } else if k != dkind {
            return Err(doc
                .field_error(
                    &format!("device[{i}].kind"),
                    format!("expected \"{dkind}\" like device[0]: the devices of one scenario are of one kind"),
                )
                .into());
        }
    }
    match (wkind.as_str(), dkind.as_str()) {
        ("fio", "nvme") => fio_on::<NvmeSpec>(&doc, base),
        ("fio", "sas") => fio_on::<SasSpec>(&doc, base),
        ("dma_map_benchmark", "nvme") => dma_map_benchmark_on::<NvmeSpec>(&doc, base),
        ("dma_map_benchmark", "sas") => dma_map_benchmark_on::<SasSpec>(&doc, base),
        ("bonnie", "nvme") => bonnie_on::<NvmeSpec>(&doc, base),
        ("bonnie", "sas") => bonnie_on::<SasSpec>(&doc, base),
        ("bonnie", "scsi") => {
            let f: File<ScsiSpec, BonnieSpec> = deserialize_as(&doc)?;
            let common = common(&doc, &f, base)?;
            one_device(&doc, f.device.len(), "bonnie")?;
            instances(&doc, &common.iommu, &[None])?;
            let scsi = scsi(&doc, &f.device[0], &common.profile)?;
            let bundled = crate::experiments::ipmmu_usb::parse(
                crate::experiments::ipmmu_usb::BUNDLED_SCENARIO,
                "scenarios/ipmmu-usb.toml (bundled)",
            )?;
            let bonnie = bonnie(&doc, &f.workload, &bundled, &common, scsi.limits)?;
            let kernel = kernel(&doc, &f.kernel, 0, 0)?;
            Ok(common.finish(kernel, Devices::Scsi(Box::new(scsi)), Workload::Bonnie(Box::new(bonnie))))
        }
        ("bonnie", "usb") => {
            let f: File<UsbSpec, BonnieSpec> = deserialize_as(&doc)?;
            let common = common(&doc, &f, base)?;
            one_device(&doc, f.device.len(), "bonnie")?;
            instances(&doc, &common.iommu, &[None])?;
            if !matches!(common.iommu.model, IommuModel::None | IommuModel::Ipmmu) {
                return Err(doc
                    .field_error(
                        "iommu.model",
                        "bonnie on usb is modelled behind the R-Car xHCI: expected \"none\" or \"ipmmu\"",
                    )
                    .into());
            }
            let bundled = crate::experiments::ipmmu_usb::parse(
                crate::experiments::ipmmu_usb::BUNDLED_SCENARIO,
                "scenarios/ipmmu-usb.toml (bundled)",
            )?;
            let usb = usb(&doc, &f.device[0], &bundled, common.cpus)?;
            let limits = crate::block::QueueLimits {
                max_segments: usb.max_segments,
                max_segment_size: usb.max_segment_size,
                max_transfer: usb.config.link.max_transfer,
                virt_merge_granule: (common.iommu.mode != IommuMode::Off).then_some(4096),
            };
            let bonnie = bonnie(&doc, &f.workload, &bundled, &common, limits)?;
            let kernel = kernel(&doc, &f.kernel, 0, 0)?;
            Ok(common.finish(kernel, Devices::Usb(Box::new(usb)), Workload::Bonnie(Box::new(bonnie))))
        }
        ("netperf", "nic") => {
            let f: File<NicSpec, NetperfSpec> = deserialize_as(&doc)?;
            let common = common(&doc, &f, base)?;
            one_device(&doc, f.device.len(), "netperf")?;
            instances(&doc, &common.iommu, &[None])?;
            match common.iommu.mode {
                // A direct DDW is a static map: the NIC path maps by offset, with no pools
                // and no per-I/O hypercalls (devices::nic::TceDma).
                IommuMode::DefaultWindow | IommuMode::DdwDynamic | IommuMode::DdwDirect => {}
                _ => {
                    return Err(doc
                        .field_error(
                            "iommu.model",
                            "the NIC model's DMA path is the POWER TCE path: expected \"pseries\"",
                        )
                        .into())
                }
            }
            let bundled = crate::experiments::pseries_ddw::setup(
                crate::experiments::pseries_ddw::BUNDLED_SCENARIO,
                "scenarios/pseries-ddw.toml (bundled)",
            )?;
            let (link, nic) = nic(&doc, &f.device[0], &bundled)?;
            let netperf = netperf(&doc, &f.workload, &bundled, &common, nic)?;
            let kernel = kernel(&doc, &f.kernel, 0, 0)?;
            Ok(common.finish(kernel, Devices::Nic(link), Workload::Netperf(Box::new(netperf))))
        }
        ("reaim", "scsi") => {
            let f: File<ScsiSpec, ReaimSpec> = deserialize_as(&doc)?;
            let common = common(&doc, &f, base)?;
            one_device(&doc, f.device.len(), "reaim")?;
            instances(&doc, &common.iommu, &[None])?;
            let scsi = scsi(&doc, &f.device[0], &common.profile)?;
            let reaim = reaim(&doc, &f.workload, &common, &scsi)?;
            let kernel = kernel(&doc, &f.kernel, 0, 0)?;
            Ok(common.finish(kernel, Devices::Scsi(Box::new(scsi)), Workload::Reaim(Box::new(reaim))))
        }
        (w, dv) => Err(doc
            .field_error(
                "workload.kind",
                format!(
                    "a {w} workload does not run on {dv} devices: fio runs on nvme or sas, bonnie on nvme, sas, scsi or usb, netperf on nic, reaim on scsi"
                ),
            )
            .into()),
    }
}

/// A block device's `[[device]]` table (NVMe SSD or SAS HBA): what fio and bonnie share.
trait BlockSpec: DeserializeOwned {
    /// Validates every table (device `i` names `device[i]` in errors).
    fn devices(doc: &TomlDoc<'_>, specs: &[Self], cpus: usize) -> Result<Devices, InputError>;
    /// The driver's submit and complete costs of the first device, ns (defaults applied).
    fn driver_ns(&self) -> (u64, u64);
    /// The IOMMU instance the table names (`iommu_instance`), if it does.
    fn iommu_instance(&self) -> Option<usize>;
}

impl BlockSpec for NvmeSpec {
    fn devices(doc: &TomlDoc<'_>, specs: &[Self], cpus: usize) -> Result<Devices, InputError> {
        let devs = specs
            .iter()
            .enumerate()
            .map(|(i, s)| nvme(doc, i, s, cpus))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Devices::Nvme(devs))
    }

    fn driver_ns(&self) -> (u64, u64) {
        (
            self.submit_ns.unwrap_or(d::NVME_SUBMIT_NS.0),
            self.complete_ns.unwrap_or(d::NVME_COMPLETE_NS.0),
        )
    }

    fn iommu_instance(&self) -> Option<usize> {
        self.iommu_instance
    }
}

impl BlockSpec for SasSpec {
    fn devices(doc: &TomlDoc<'_>, specs: &[Self], _cpus: usize) -> Result<Devices, InputError> {
        let devs = specs
            .iter()
            .enumerate()
            .map(|(i, s)| sas(doc, i, s))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Devices::Sas(devs))
    }

    fn driver_ns(&self) -> (u64, u64) {
        (
            self.submit_ns.unwrap_or(d::SAS_SUBMIT_NS.0),
            self.complete_ns.unwrap_or(d::SAS_COMPLETE_NS.0),
        )
    }

    fn iommu_instance(&self) -> Option<usize> {
        self.iommu_instance
    }
}

/// The parts of a block-device scenario every workload shares, validated in order: the
/// file's shape, the common tables, (for a workload that drives one device) the device
/// count, the devices, the block kernel costs.
fn block_parts<D: BlockSpec, W: DeserializeOwned>(
    doc: &TomlDoc<'_>,
    base: Option<&Path>,
    one_device_for: Option<&str>,
) -> Result<(File<D, W>, Common, Devices, BlockKernel), LabError> {
    let f: File<D, W> = deserialize_as(doc)?;
    let mut common = common(doc, &f, base)?;
    if let Some(workload) = one_device_for {
        one_device(doc, f.device.len(), workload)?;
    }
    let devices = D::devices(doc, &f.device, common.cpus)?;
    let named: Vec<Option<usize>> = f.device.iter().map(|d| d.iommu_instance()).collect();
    common.iommu.device_instance = instances(doc, &common.iommu, &named)?;
    let (drv_s, drv_c) = f.device[0].driver_ns();
    let kernel = kernel(doc, &f.kernel, drv_s, drv_c)?;
    Ok((f, common, devices, kernel))
}

/// fio on NVMe SSDs or SAS HBAs.
fn fio_on<D: BlockSpec>(doc: &TomlDoc<'_>, base: Option<&Path>) -> Result<LabScenario, LabError> {
    let (f, common, devices, kernel) = block_parts::<D, FioSpec>(doc, base, None)?;
    let fio = fio(doc, &f.workload, &common)?;
    Ok(common.finish(kernel, devices, Workload::Fio(fio)))
}

/// The kernel's DMA-mapping benchmark bound to one NVMe SSD or SAS HBA (its IOMMU domain).
fn dma_map_benchmark_on<D: BlockSpec>(
    doc: &TomlDoc<'_>,
    base: Option<&Path>,
) -> Result<LabScenario, LabError> {
    let (f, common, devices, kernel) =
        block_parts::<D, DmaMapBenchmarkSpec>(doc, base, Some("dma_map_benchmark"))?;
    let b = dma_map_benchmark(doc, &f.workload, &common)?;
    Ok(common.finish(kernel, devices, Workload::DmaMapBenchmark(b)))
}

/// The benchmark's parameters, with the kernel module's own limits
/// (`map_benchmark_ioctl`: 1..=1024 threads, granule 1..=1024 pages, a transmission delay
/// of at most 10 ms) and the lab's (one thread per CPU, `MAX_RUN_MS`).
fn dma_map_benchmark(
    doc: &TomlDoc<'_>,
    s: &DmaMapBenchmarkSpec,
    c: &Common,
) -> Result<DmaMapBenchmarkSetup, InputError> {
    let wl = Fields::new(doc, "workload");
    let max_threads = c.cpus.min(1024) as u32;
    let threads = wl.int(
        "threads",
        s.threads.unwrap_or(1),
        1..=max_threads,
        "(one thread per CPU, at most 1024 as the kernel module allows)",
    )?;
    let runtime_ms = wl.int(
        "runtime_ms",
        s.runtime_ms,
        1..=MAX_RUN_MS,
        "ms of virtual time (cap MAX_RUN_MS)",
    )?;
    let granule = wl.int(
        "granule",
        s.granule.unwrap_or(1),
        1..=1024,
        "pages per mapping (the kernel module's range)",
    )?;
    let dir = match s.dir.as_deref().unwrap_or("bidirectional") {
        "bidirectional" => MapDirection::Bidirectional,
        "to_device" => MapDirection::ToDevice,
        "from_device" => MapDirection::FromDevice,
        other => {
            return Err(doc.field_error(
                "workload.dir",
                format!(
                    "unknown direction \"{other}\": {}",
                    one_of(&MapDirection::NAMES)
                ),
            ))
        }
    };
    let dma_trans_ns = wl.int(
        "dma_trans_ns",
        s.dma_trans_ns.unwrap_or(0),
        0..=10_000_000,
        "ns (the kernel module's cap: 10 ms)",
    )?;
    if let Some(node) = s.node.filter(|&n| n != -1) {
        return Err(doc.field_error(
            "workload.node",
            format!("{node}: the lab's machines have one memory node: expected -1 (NUMA_NO_NODE)"),
        ));
    }
    let buffers = u64::from(threads) * u64::from(granule) * 4096;
    if BUFFER_BASE + buffers > c.memory_bytes {
        return Err(doc.field_error(
            "machine.memory_gib",
            format!(
                "the benchmark's buffers (threads x granule pages = {} MiB above the first 4 GiB) do not fit in {} GiB",
                buffers >> 20,
                c.memory_bytes >> 30
            ),
        ));
    }
    Ok(DmaMapBenchmarkSetup {
        threads,
        runtime_ns: runtime_ms * 1_000_000,
        granule,
        dir,
        dma_trans_ns,
    })
}

/// bonnie on one NVMe SSD or SAS HBA.
fn bonnie_on<D: BlockSpec>(
    doc: &TomlDoc<'_>,
    base: Option<&Path>,
) -> Result<LabScenario, LabError> {
    let (f, common, devices, kernel) = block_parts::<D, BonnieSpec>(doc, base, Some("bonnie"))?;
    let bonnie = bonnie_on_block(doc, &f.workload, &common, &devices)?;
    Ok(common.finish(kernel, devices, Workload::Bonnie(Box::new(bonnie))))
}

/// The parts every kind shares, validated.
struct Common {
    name: String,
    description: Option<String>,
    seed: Option<u64>,
    profile: PlatformProfile,
    cpus: usize,
    memory_bytes: u64,
    iommu: IommuSetup,
}

impl Common {
    fn finish(self, kernel: BlockKernel, devices: Devices, workload: Workload) -> LabScenario {
        LabScenario {
            name: self.name,
            description: self.description,
            seed: self.seed,
            profile: self.profile,
            cpus: self.cpus,
            memory_bytes: self.memory_bytes,
            iommu: self.iommu,
            kernel,
            devices,
            workload,
        }
    }
}

fn common<D, W>(
    doc: &TomlDoc<'_>,
    f: &File<D, W>,
    base: Option<&Path>,
) -> Result<Common, LabError> {
    let machine = Fields::new(doc, "machine");
    let name = match &f.name {
        Some(n) if n.trim().is_empty() || n.len() > 200 => {
            return Err(doc
                .field_error(
                    "name",
                    "expected a non-empty label of at most 200 characters",
                )
                .into())
        }
        Some(n) => n.clone(),
        None => "lab".to_owned(),
    };
    let mut profile = load_profile(doc, &f.machine.platform, base)?;
    override_costs(doc, &mut profile, &f.machine.costs)?;
    let cpus = match f.machine.cpus {
        Some(c) => machine.int("cpus", c, 1..=MAX_CPUS, "(cap MAX_CPUS)")?,
        None => (profile.cpu.cores as usize).clamp(1, MAX_CPUS),
    };
    let memory_gib = machine.int(
        "memory_gib",
        f.machine.memory_gib.unwrap_or(d::MEMORY_GIB.0),
        1..=MAX_MEMORY_GIB,
        "GiB (cap MAX_MEMORY_GIB)",
    )?;
    let kernel = kernel_variants(doc, &f.kernel)?;
    let iommu = iommu(doc, &f.iommu, &profile, memory_gib, kernel)?;
    // The profile describes this machine: its core count is the scenario's.
    profile.cpu.cores = cpus as u32;
    Ok(Common {
        name,
        description: f.description.clone(),
        seed: f.seed,
        profile,
        cpus,
        memory_bytes: memory_gib << 30,
        iommu,
    })
}

/// The DMA-path algorithms of `kernel.version` (default [`d::KERNEL_VERSION`]).
fn kernel_variants(doc: &TomlDoc<'_>, k: &KernelSpec) -> Result<DmaPathVariants, InputError> {
    let text = k.version.as_deref().unwrap_or(d::KERNEL_VERSION.0);
    KernelVersion::parse(text)
        .and_then(DmaPathVariants::for_kernel)
        .map_err(|e| {
            doc.field_error(
                "kernel.version",
                format!(
                    "{e}: expected a Linux release from {} to {} such as \"6.6\"",
                    KernelVersion::OLDEST,
                    KernelVersion::NEWEST
                ),
            )
        })
}

fn iommu(
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
    let caching_mode = s.caching_mode.unwrap_or(false);
    if s.caching_mode.is_some() && model != IommuModel::Vtd {
        return Err(doc
            .field_error(
                "iommu.caching_mode",
                "applies to iommu.model = \"vtd\" only",
            )
            .into());
    }
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
    let sba = model == IommuModel::Sba && mode == IommuMode::Translated;
    let sba_to = "iommu.model = \"sba\" in mode translated";
    only("delayed_frees", s.delayed_frees.is_some(), sba, sba_to)?;
    only("page_size", s.page_size.is_some(), sba, sba_to)?;
    let power = model == IommuModel::Pseries;
    only(
        "default_window_mib",
        s.default_window_mib.is_some(),
        power,
        "iommu.model = \"pseries\"",
    )?;
    let ddw = matches!(mode, IommuMode::DdwDynamic | IommuMode::DdwDirect);
    let ddw_to = "the ddw-dynamic and ddw-direct modes";
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
        other => {
            return Err(doc
                .field_error(
                    "iommu.cmdq",
                    format!("unknown design \"{other}\": expected \"spinlock\" or \"lockfree\""),
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
        default_window_bytes: default_window_mib << 20,
        ddw_window_bytes: ddw_window_gib << 30,
        ddw_page_shift,
        kernel,
        caching_mode,
        instances,
        device_instance: Vec::new(),
    })
}

/// The IOMMU instance of every device: `device[i].iommu_instance` where `named[i]` is set,
/// else `i mod iommu.instances` (the devices spread over the instances in order, as a
/// platform's root complexes each sit behind their own SMMU or DMAR unit). Refuses more
/// instances than devices (an instance with no device behind it) and an instance number
/// out of range.
fn instances(
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

fn one_device(doc: &TomlDoc<'_>, n: usize, workload: &str) -> Result<(), InputError> {
    if n != 1 {
        return Err(doc.field_error(
            "device",
            format!("a {workload} workload drives exactly one device, got {n}"),
        ));
    }
    Ok(())
}

/// A CPU index field: explicit values must exist; defaults wrap onto the machine.
fn cpu(
    doc: &TomlDoc<'_>,
    path: &str,
    v: Option<usize>,
    default: usize,
    cpus: usize,
) -> Result<usize, InputError> {
    match v {
        Some(c) if c >= cpus => Err(doc.field_error(
            path,
            format!("expected a CPU in 0..{cpus} (machine.cpus = {cpus}), got {c}"),
        )),
        Some(c) => Ok(c),
        None => Ok(default % cpus),
    }
}

fn usb(
    doc: &TomlDoc<'_>,
    s: &UsbSpec,
    b: &crate::experiments::ipmmu_usb::Model,
    cpus: usize,
) -> Result<UsbSetup, InputError> {
    let mut c = b.usb_common.clone();
    c.link = match s.speed.as_deref().unwrap_or("superspeed") {
        "superspeed" => b.superspeed.clone(),
        "highspeed" => b.highspeed.clone(),
        other => {
            return Err(doc.field_error(
                "device[0].speed",
                format!("unknown speed \"{other}\": expected \"superspeed\" or \"highspeed\""),
            ))
        }
    };
    let dev = Fields::new(doc, "device[0]");
    dev.set_int(
        &mut c.command_overhead_ns,
        "command_overhead_ns",
        s.command_overhead_ns,
        0..=100_000_000,
        "ns",
    )?;
    dev.set_int(
        &mut c.per_segment_ns,
        "per_segment_ns",
        s.per_segment_ns,
        0..=1_000_000,
        "ns",
    )?;
    if let Some(us) = s.media_read_latency_us {
        c.media_read_latency_ns = dev.us_as_ns("media_read_latency_us", us, 0.0..=1e6)?;
    }
    if let Some(us) = s.media_flush_us {
        c.media_flush_ns = dev.us_as_ns("media_flush_us", us, 0.0..=1e6)?;
    }
    dev.set_int(
        &mut c.completion_ns,
        "completion_ns",
        s.completion_ns,
        0..=1_000_000,
        "ns",
    )?;
    c.storage_cpu = dev.cpu("storage_cpu", s.storage_cpu, c.storage_cpu, cpus)?;
    c.irq_cpu = dev.cpu("irq_cpu", s.irq_cpu, c.irq_cpu, cpus)?;
    Ok(UsbSetup {
        config: c,
        max_segment_size: b.max_segment_size,
        max_segments: b.max_segments,
    })
}

/// bonnie on an NVMe SSD or a SAS HBA: the page-cache and process costs of the bundled
/// ipmmu-usb scenario, the block devices' queue limits.
fn bonnie_on_block(
    doc: &TomlDoc<'_>,
    s: &BonnieSpec,
    c: &Common,
    devices: &Devices,
) -> Result<BonnieSetup, LabError> {
    let bundled = crate::experiments::ipmmu_usb::parse(
        crate::experiments::ipmmu_usb::BUNDLED_SCENARIO,
        "scenarios/ipmmu-usb.toml (bundled)",
    )?;
    let limits = super::block::bonnie_limits(devices).ok_or_else(|| {
        doc.field_error("device[0].kind", "expected a block device (nvme or sas)")
    })?;
    Ok(bonnie(doc, s, &bundled, c, limits)?)
}

fn bonnie(
    doc: &TomlDoc<'_>,
    s: &BonnieSpec,
    b: &crate::experiments::ipmmu_usb::Model,
    c: &Common,
    limits: crate::block::QueueLimits,
) -> Result<BonnieSetup, InputError> {
    let wl = Fields::new(doc, "workload");
    let mut cfg = b.bonnie.clone();
    let file_mib = wl.int(
        "file_mib",
        s.file_mib.unwrap_or(d::BONNIE_FILE_MIB.0),
        1..=MAX_FILE_MIB,
        "MiB (cap MAX_FILE_MIB)",
    )?;
    let logical = s.logical_file_mib.unwrap_or(cfg.logical_file_bytes >> 20);
    let logical = wl.int(
        "logical_file_mib",
        logical,
        file_mib..=MAX_TARGET_GIB << 10,
        "MiB (at least file_mib)",
    )?;
    // Dirty thresholds scale with the file, as in the bundled scenario.
    let scale = file_mib as f64 / (cfg.file_bytes as f64 / 1_048_576.0);
    cfg.dirty_background = ((cfg.dirty_background as f64 * scale) as u64).max(4096);
    cfg.dirty_limit = ((cfg.dirty_limit as f64 * scale) as u64).max(cfg.dirty_background + 4096);
    cfg.file_bytes = file_mib << 20;
    cfg.logical_file_bytes = logical << 20;
    let ram_mib = wl.int(
        "ram_mib",
        s.ram_mib
            .unwrap_or(cfg.ram_banks.iter().map(|&(_, b)| b).sum::<u64>() >> 20),
        1..=MAX_MEMORY_GIB << 10,
        "MiB",
    )?;
    // One bank above the first 4 GiB: the workload scenario's device reaches all of it
    // (no bounce buffering; see docs/SCENARIOS.md).
    cfg.ram_banks = vec![(BUFFER_BASE, ram_mib << 20)];
    if BUFFER_BASE + (ram_mib << 20) > c.memory_bytes {
        return Err(doc.field_error(
            "workload.ram_mib",
            format!(
                "the page cache ({ram_mib} MiB above the first 4 GiB) does not fit in machine.memory_gib = {}",
                c.memory_bytes >> 30
            ),
        ));
    }
    if let Some(ch) = s.chunk_bytes {
        if ch == 0 || ch % 512 != 0 || ch > 1 << 20 {
            return Err(doc.field_error(
                "workload.chunk_bytes",
                format!("expected a non-zero multiple of 512 up to 1 MiB, got {ch}"),
            ));
        }
        cfg.chunk = ch;
    }
    wl.set_int(&mut cfg.seeks, "seeks", s.seeks, 1..=1_000_000, "seeks")?;
    if let Some(cpus) = &s.seeker_cpus {
        if cpus.is_empty() || cpus.len() > MAX_THREADS as usize {
            return Err(doc.field_error(
                "workload.seeker_cpus",
                format!("expected 1..={MAX_THREADS} seekers (cap MAX_THREADS)"),
            ));
        }
        for &x in cpus {
            wl.cpu("seeker_cpus", Some(x), 0, c.cpus)?;
        }
        cfg.seeker_cpus = cpus.clone();
    } else {
        cfg.seeker_cpus = cfg.seeker_cpus.iter().map(|&x| x % c.cpus).collect();
    }
    cfg.seekers = cfg.seeker_cpus.len();
    cfg.bonnie_cpu = wl.cpu("bonnie_cpu", s.bonnie_cpu, cfg.bonnie_cpu, c.cpus)?;
    cfg.flusher_cpu = wl.cpu("flusher_cpu", s.flusher_cpu, cfg.flusher_cpu, c.cpus)?;
    cfg.syscall_ns = c.profile.cpu.syscall.ns().round() as u64;
    cfg.copy_bytes_per_ns = c.profile.memory.memcpy_bandwidth.gb_per_s;
    cfg.limits = limits;
    if let Some(n) = s.files {
        let n = wl.int(
            "files",
            n,
            0..=1024,
            "x 1024 files (bonnie++ -n; 0: no file tests)",
        )?;
        // The file tests' costs are the bundled ipmmu-usb scenario's; only bonnie's file
        // count changes (the lab runs at most the bundled count per test).
        let tests = cfg.file_tests.take().filter(|_| n > 0);
        cfg.file_tests = tests.map(|mut ft| {
            ft.files = n * 1024;
            ft.files_run = ft.files_run.min(ft.files);
            ft
        });
    }
    let csv = csv_layout(doc, s.csv.as_ref())?;
    Ok(BonnieSetup {
        config: cfg,
        size_mib: logical,
        csv,
    })
}

/// `workload.csv`: the bonnie++ CSV layout, a string naming a bonnie++ version.
fn csv_layout(
    doc: &TomlDoc<'_>,
    v: Option<&toml::Value>,
) -> Result<crate::workloads::bonnie::CsvLayout, InputError> {
    use crate::workloads::bonnie::CsvLayout;
    let expected = one_of(&CsvLayout::NAMES);
    match v {
        None => Ok(CsvLayout::default()),
        Some(toml::Value::String(name)) => CsvLayout::from_name(name).ok_or_else(|| {
            doc.field_error(
                "workload.csv",
                format!("unknown bonnie++ CSV layout \"{name}\": {expected}"),
            )
        }),
        Some(other) => Err(doc.field_error(
            "workload.csv",
            format!("{expected} (a quoted string), found a {}", other.type_str()),
        )),
    }
}

fn nic(
    doc: &TomlDoc<'_>,
    s: &NicSpec,
    b: &crate::experiments::pseries_ddw::Setup,
) -> Result<
    (
        crate::devices::nic::LinkConfig,
        crate::workloads::netperf::StreamConfig,
    ),
    InputError,
> {
    let dev = Fields::new(doc, "device[0]");
    let mut link = b.link;
    let mut stream = b.base;
    if let Some(g) = s.link_gbps {
        link.gbps = dev.real("link_gbps", g, 0.001..=10_000.0)?;
    }
    if let Some(mtu) = s.mtu {
        let mtu = dev.int("mtu", mtu, 576..=65_535, "bytes")?;
        let headers = b.sc.nic.tcpip_header_bytes.value;
        link.mss = mtu.saturating_sub(headers).max(1);
    }
    dev.set_int(
        &mut stream.queues,
        "queues",
        s.queues,
        1..=MAX_DEVICE_QUEUES,
        "(cap MAX_DEVICE_QUEUES)",
    )?;
    dev.set_int(
        &mut stream.tx_ring_entries,
        "tx_ring_entries",
        s.tx_ring_entries,
        1..=MAX_IODEPTH as usize,
        "(cap MAX_IODEPTH)",
    )?;
    dev.set_int(
        &mut stream.rx_ring_pages,
        "rx_ring_pages",
        s.rx_ring_pages,
        1..=MAX_IODEPTH as usize,
        "(cap MAX_IODEPTH)",
    )?;
    Ok((link, stream))
}

fn netperf(
    doc: &TomlDoc<'_>,
    s: &NetperfSpec,
    b: &crate::experiments::pseries_ddw::Setup,
    c: &Common,
    mut stream: crate::workloads::netperf::StreamConfig,
) -> Result<NetperfSetup, InputError> {
    let wl = Fields::new(doc, "workload");
    use crate::workloads::netperf::StreamDirection;
    stream.direction = match s.direction.as_deref().unwrap_or("write") {
        "write" => StreamDirection::Write,
        "read" => StreamDirection::Read,
        other => {
            return Err(doc.field_error(
                "workload.direction",
                format!(
                    "unknown direction \"{other}\": expected \"write\" (transmit) or \"read\" (receive)"
                ),
            ))
        }
    };
    let max_threads = c.cpus.min(MAX_THREADS as usize);
    stream.threads = wl.int(
        "threads",
        s.threads.unwrap_or(1),
        1..=max_threads,
        "(at most machine.cpus; cap MAX_THREADS)",
    )?;
    wl.set_int(
        &mut stream.message_bytes,
        "message_bytes",
        s.message_bytes,
        1..=16 << 20,
        "bytes",
    )?;
    let run_ms = wl.int(
        "run_ms",
        s.run_ms,
        1..=MAX_RUN_MS,
        "ms of virtual time (cap MAX_RUN_MS)",
    )?;
    let warmup_ms = s.warmup_ms.unwrap_or(b.base.warmup_ns / 1_000_000);
    if warmup_ms >= run_ms {
        return Err(doc.field_error(
            "workload.warmup_ms",
            format!("expected less than run_ms = {run_ms}"),
        ));
    }
    stream.run_ns = run_ms * 1_000_000;
    stream.warmup_ns = warmup_ms * 1_000_000;
    // Each queue's buffers live in their own 4 GiB of physical memory (workloads::netperf).
    let queues = stream.queues.max(stream.threads) as u64;
    let needed_gib = 4 * (queues + 1);
    if c.memory_bytes >> 30 < needed_gib {
        return Err(doc.field_error(
            "machine.memory_gib",
            format!(
                "the NIC model places each queue's buffers in its own 4 GiB: {queues} queues need at least {needed_gib} GiB"
            ),
        ));
    }
    let mut costs = b.costs;
    costs.syscall_ns = c.profile.cpu.syscall.ns();
    costs.copy_bytes_per_ns = c.profile.memory.memcpy_bandwidth.gb_per_s;
    costs.doorbell_ns = c.profile.mmio.write.ns();
    Ok(NetperfSetup {
        stream,
        costs,
        serialisation: b.serialisation,
    })
}

fn kernel(
    doc: &TomlDoc<'_>,
    k: &KernelSpec,
    driver_submit_ns: u64,
    driver_complete_ns: u64,
) -> Result<BlockKernel, InputError> {
    let (kernel, dev) = (Fields::new(doc, "kernel"), Fields::new(doc, "device[0]"));
    let ns = |t: &Fields<'_, '_>, field: &str, v: Option<u64>, default: u64| {
        t.int(field, v.unwrap_or(default), 0..=1_000_000, "ns")
    };
    Ok(BlockKernel {
        block_submit_ns: ns(
            &kernel,
            "block_submit_ns",
            k.block_submit_ns,
            d::BLOCK_SUBMIT_NS.0,
        )?,
        block_complete_ns: ns(
            &kernel,
            "block_complete_ns",
            k.block_complete_ns,
            d::BLOCK_COMPLETE_NS.0,
        )?,
        irq_entry_ns: ns(&kernel, "irq_entry_ns", k.irq_entry_ns, d::IRQ_ENTRY_NS.0)?,
        driver_submit_ns: ns(&dev, "submit_ns", Some(driver_submit_ns), 0)?,
        driver_complete_ns: ns(&dev, "complete_ns", Some(driver_complete_ns), 0)?,
    })
}

fn nvme(doc: &TomlDoc<'_>, i: usize, s: &NvmeSpec, cpus: usize) -> Result<NvmeSetup, InputError> {
    let dev = Fields::new(doc, format!("device[{i}]"));
    let io_queues = dev.int(
        "io_queues",
        s.io_queues.unwrap_or(d::NVME_IO_QUEUES.0),
        1..=MAX_DEVICE_QUEUES,
        "(cap MAX_DEVICE_QUEUES)",
    )?;
    // Interrupt Coalescing (feature 08h): both fields or neither.
    let coalescing = match (s.coalesce_threshold, s.coalesce_time_100us) {
        (None, None) => crate::devices::nvme::InterruptCoalescing {
            threshold: d::NVME_COALESCING.0 .0,
            time_100us: d::NVME_COALESCING.0 .1,
        },
        (Some(t), Some(x)) => crate::devices::nvme::InterruptCoalescing {
            threshold: dev.int(
                "coalesce_threshold",
                t,
                0..=255,
                "(the feature's 8-bit THR, 0's based)",
            )? as u8,
            time_100us: dev.int(
                "coalesce_time_100us",
                x,
                0..=255,
                "(the feature's 8-bit TIME, 100 us units)",
            )? as u8,
        },
        (Some(_), None) => {
            return Err(doc.field_error(
                &format!("device[{i}].coalesce_time_100us"),
                "missing: Interrupt Coalescing (feature 08h) takes coalesce_threshold and coalesce_time_100us together",
            ))
        }
        (None, Some(_)) => {
            return Err(doc.field_error(
                &format!("device[{i}].coalesce_threshold"),
                "missing: Interrupt Coalescing (feature 08h) takes coalesce_threshold and coalesce_time_100us together",
            ))
        }
    };
    let params = crate::devices::nvme::NvmeParams {
        // Linux creates one queue pair per CPU, up to the controller's count.
        io_queues: io_queues.min(cpus),
        max_iops: dev.real(
            "max_iops",
            s.max_iops.unwrap_or(d::NVME_MAX_IOPS.0),
            1.0..=1e8,
        )?,
        bandwidth: dev.real(
            "bandwidth_gb_per_s",
            s.bandwidth_gb_per_s.unwrap_or(d::NVME_BANDWIDTH_GB_PER_S.0),
            0.001..=1000.0,
        )? * 1e9,
        read_latency_ns: dev.us_as_ns(
            "read_latency_us",
            s.read_latency_us.unwrap_or(d::NVME_READ_LATENCY_US.0),
            0.0..=1e6,
        )?,
        write_latency_ns: dev.us_as_ns(
            "write_latency_us",
            s.write_latency_us.unwrap_or(d::NVME_WRITE_LATENCY_US.0),
            0.0..=1e6,
        )?,
    };
    Ok(NvmeSetup { params, coalescing })
}

fn sas(
    doc: &TomlDoc<'_>,
    i: usize,
    s: &SasSpec,
) -> Result<crate::devices::sas::SasParams, InputError> {
    let dev = Fields::new(doc, format!("device[{i}]"));
    Ok(crate::devices::sas::SasParams {
        disks: dev.int(
            "disks",
            s.disks.unwrap_or(d::SAS_DISKS.0),
            1..=MAX_DISKS,
            "(cap MAX_DISKS)",
        )?,
        completion_queues: dev.int(
            "completion_queues",
            s.completion_queues.unwrap_or(d::SAS_COMPLETION_QUEUES.0),
            1..=MAX_DEVICE_QUEUES,
            "(cap MAX_DEVICE_QUEUES)",
        )?,
        hba_command_ns: dev.real(
            "hba_command_ns",
            s.hba_command_ns.unwrap_or(d::SAS_HBA_COMMAND_NS.0),
            0.0..=1e6,
        )?,
        disk_read_latency_ns: dev.us_as_ns(
            "disk_read_latency_us",
            s.disk_read_latency_us
                .unwrap_or(d::SAS_DISK_READ_LATENCY_US.0),
            0.0..=1e6,
        )?,
        disk_write_latency_ns: dev.us_as_ns(
            "disk_write_latency_us",
            s.disk_write_latency_us
                .unwrap_or(d::SAS_DISK_WRITE_LATENCY_US.0),
            0.0..=1e6,
        )?,
        disk_max_iops: dev.real(
            "disk_max_iops",
            s.disk_max_iops.unwrap_or(d::SAS_DISK_MAX_IOPS.0),
            1.0..=1e8,
        )?,
        link_bandwidth: dev.real(
            "link_gb_per_s",
            s.link_gb_per_s.unwrap_or(d::SAS_LINK_GB_PER_S.0),
            0.001..=1000.0,
        )? * 1e9,
    })
}

fn scsi(
    doc: &TomlDoc<'_>,
    s: &ScsiSpec,
    profile: &PlatformProfile,
) -> Result<ScsiSetup, InputError> {
    let dev = Fields::new(doc, "device[0]");
    let ghz = profile.cpu.clock_ghz;
    let bus = dev.real(
        "bus_mb_per_s",
        s.bus_mb_per_s.unwrap_or(d::SCSI_BUS_MB_PER_S.0),
        1.0..=1e6,
    )?;
    let per_cmd = dev.real(
        "hba_command_us",
        s.hba_command_us.unwrap_or(d::SCSI_HBA_COMMAND_US.0),
        0.0..=1e6,
    )?;
    let hba_sge = dev.real(
        "hba_per_sge_ns",
        s.hba_per_sge_ns.unwrap_or(d::SCSI_HBA_PER_SGE_NS.0),
        0.0..=1e6,
    )?;
    let submit = dev.real(
        "submit_kcycles",
        s.submit_kcycles.unwrap_or(d::SCSI_SUBMIT_KCYCLES.0),
        0.0..=1e6,
    )?;
    let drv_sge = dev.real(
        "per_sge_cycles",
        s.per_sge_cycles.unwrap_or(d::SCSI_PER_SGE_CYCLES.0),
        0.0..=1e6,
    )?;
    let complete = dev.real(
        "complete_kcycles",
        s.complete_kcycles.unwrap_or(d::SCSI_COMPLETE_KCYCLES.0),
        0.0..=1e6,
    )?;
    let cap = dev.real(
        "capacity_gb",
        s.capacity_gb.unwrap_or(d::SCSI_CAPACITY_GB.0),
        1.0..=1e6,
    )?;
    let rpm = dev.real("rpm", s.rpm.unwrap_or(d::SCSI_RPM.0), 1000.0..=30_000.0)?;
    let seek_r = dev.real(
        "seek_read_ms",
        s.seek_read_ms.unwrap_or(d::SCSI_SEEK_READ_MS.0),
        0.0..=100.0,
    )?;
    let seek_w = dev.real(
        "seek_write_ms",
        s.seek_write_ms.unwrap_or(d::SCSI_SEEK_WRITE_MS.0),
        0.0..=100.0,
    )?;
    let media = dev.real(
        "media_mb_per_s",
        s.media_mb_per_s.unwrap_or(d::SCSI_MEDIA_MB_PER_S.0),
        1.0..=1e5,
    )?;
    let sg_tablesize = dev.int(
        "sg_tablesize",
        s.sg_tablesize.unwrap_or(d::SCSI_SG_TABLESIZE.0),
        1..=4096,
        "SG elements",
    )?;
    let max_sectors = dev.int(
        "max_sectors",
        s.max_sectors.unwrap_or(d::SCSI_MAX_SECTORS.0),
        8..=1 << 20,
        "sectors of 512 bytes",
    )?;
    let max_segment_kib = dev.int(
        "max_segment_kib",
        s.max_segment_kib.unwrap_or(d::SCSI_MAX_SEGMENT_KIB.0),
        4..=1 << 20,
        "KiB",
    )?;
    Ok(ScsiSetup {
        params: crate::devices::scsi::ScsiParams {
            bus_bytes_per_s: bus * 1e6,
            hba_per_command_ns: per_cmd * 1e3,
            hba_per_sge_ns: hba_sge,
            driver_submit_ns: submit * 1e3 / ghz,
            driver_per_sge_ns: drv_sge / ghz,
            driver_complete_ns: complete * 1e3 / ghz,
            seek_read_ns: seek_r * 1e6,
            seek_write_ns: seek_w * 1e6,
            revolution_ns: 60e9 / rpm,
            media_bytes_per_s: media * 1e6,
        },
        limits: crate::block::QueueLimits {
            max_segments: sg_tablesize,
            max_segment_size: max_segment_kib << 10,
            max_transfer: max_sectors * 512,
            virt_merge_granule: None,
        },
        disk_bytes: (cap * 1e9) as u64,
    })
}

fn reaim(
    doc: &TomlDoc<'_>,
    s: &ReaimSpec,
    c: &Common,
    scsi: &ScsiSetup,
) -> Result<ReaimSetup, InputError> {
    let wl = Fields::new(doc, "workload");
    use crate::workloads::reaim::{Task, Workfile};
    let start = wl.int("start", s.start, 1..=MAX_USERS, "users (cap MAX_USERS)")?;
    let end = wl.int(
        "end",
        s.end,
        start..=MAX_USERS,
        "users, from workload.start (cap MAX_USERS)",
    )?;
    let increment = wl.int("increment", s.increment, 1..=MAX_USERS, "users")?;
    let users: Vec<u32> = (start..=end).step_by(increment as usize).collect();
    if users.len() > MAX_RAMP_POINTS {
        return Err(doc.field_error(
            "workload.increment",
            format!(
                "the ramp has {} user counts, more than the cap MAX_RAMP_POINTS = {MAX_RAMP_POINTS}",
                users.len()
            ),
        ));
    }
    let ghz = c.profile.cpu.clock_ghz;
    let tasks: Vec<Task> = match &s.task {
        None => d::REAIM_TASKS
            .iter()
            .map(|&(name, weight, user, sys, bytes, _)| Task {
                name: name.to_owned(),
                weight,
                user_ns: user * 1e3 / ghz,
                sys_ns: sys * 1e3 / ghz,
                sync_write_bytes: bytes,
            })
            .collect(),
        Some(list) => {
            if list.is_empty() || list.len() > MAX_TASKS {
                return Err(doc.field_error(
                    "workload.task",
                    format!(
                        "expected 1..={MAX_TASKS} tasks (cap MAX_TASKS), got {}",
                        list.len()
                    ),
                ));
            }
            let mut v = Vec::with_capacity(list.len());
            for (i, t) in list.iter().enumerate() {
                let task = Fields::new(doc, format!("workload.task[{i}]"));
                if t.name.trim().is_empty() {
                    return Err(
                        doc.field_error(&task.path("name"), "expected a non-empty task name")
                    );
                }
                let weight = task.int("weight", t.weight, 1..=10_000, "runs per job")?;
                let user = task.real("user_kcycles", t.user_kcycles, 0.0..=1e7)?;
                let sys = task.real("sys_kcycles", t.sys_kcycles, 0.0..=1e7)?;
                let kib = task.int("sync_write_kib", t.sync_write_kib, 0..=1 << 20, "KiB")?;
                v.push(Task {
                    name: t.name.clone(),
                    weight,
                    user_ns: user * 1e3 / ghz,
                    sys_ns: sys * 1e3 / ghz,
                    sync_write_bytes: kib << 10,
                });
            }
            v
        }
    };
    let workfile = Workfile {
        name: s.workfile.clone().unwrap_or_else(|| "lab_mix".to_owned()),
        tasks,
    };
    let runs: u64 = users.iter().map(|&u| u64::from(u)).sum::<u64>() * workfile.weight_sum();
    if runs > MAX_TASK_RUNS {
        return Err(doc.field_error(
            "workload.end",
            format!(
                "the ramp runs {runs} tasks (users summed over the ramp x the workfile's weight {}), more than the cap MAX_TASK_RUNS = {MAX_TASK_RUNS}",
                workfile.weight_sum()
            ),
        ));
    }
    let slice_ms = wl.real(
        "timeslice_ms",
        s.timeslice_ms.unwrap_or(d::REAIM_TIMESLICE_MS.0),
        0.01..=10_000.0,
    )?;
    let jitter = wl.real(
        "jitter_pct",
        s.jitter_pct.unwrap_or(d::REAIM_JITTER_PCT.0),
        0.0..=90.0,
    )? / 100.0;
    let fs_block = s.fs_block.unwrap_or(d::REAIM_FS_BLOCK.0);
    if !(512..=d::REAIM_PAGE.0).contains(&fs_block) || !fs_block.is_power_of_two() {
        return Err(doc.field_error(
            "workload.fs_block",
            format!(
                "expected a power of two from 512 to the page size {}, got {fs_block}",
                d::REAIM_PAGE.0
            ),
        ));
    }
    let journal_blocks = wl.int(
        "journal_blocks",
        s.journal_blocks.unwrap_or(d::REAIM_JOURNAL_BLOCKS.0),
        1..=1024,
        "blocks",
    )?;
    if scsi.disk_bytes / fs_block < 1 << 16 {
        return Err(doc.field_error(
            "device[0].capacity_gb",
            "expected a disk of at least 65536 file-system blocks (the journal takes its last 1%)",
        ));
    }
    if c.memory_bytes < BUFFER_BASE + (1 << 30) {
        return Err(doc.field_error(
            "machine.memory_gib",
            "expected at least 5 GiB: re-aim's page cache lives above the first 4 GiB",
        ));
    }
    Ok(ReaimSetup {
        workfile,
        users,
        slice_ns: (slice_ms * 1e6).round() as u64,
        jitter,
        fs_block,
        journal_blocks,
    })
}

/// Physical address where I/O buffers and the page cache start: above the first 4 GiB, where
/// the 32-bit windows of the SBA and POWER live (assumption of scenarios/sba-vmerge.toml: no
/// DMA buffers there), so a bypass reaches them.
pub(crate) const BUFFER_BASE: u64 = 4 << 30;

fn fio(doc: &TomlDoc<'_>, s: &FioSpec, c: &Common) -> Result<FioSetup, InputError> {
    let wl = Fields::new(doc, "workload");
    let rw = RwPattern::parse(&s.rw).ok_or_else(|| {
        doc.field_error(
            "workload.rw",
            format!(
                "unknown pattern \"{}\": expected read, write, randread, randwrite or randrw",
                s.rw
            ),
        )
    })?;
    if s.rwmixread.is_some() && rw != RwPattern::RandRw {
        return Err(doc.field_error("workload.rwmixread", "applies to rw = \"randrw\" only"));
    }
    let rwmixread = wl.int(
        "rwmixread",
        s.rwmixread.unwrap_or(50),
        0..=100,
        "percent reads",
    )?;
    let bs = s.bs.unwrap_or(d::FIO_BS.0);
    if bs == 0 || bs % 512 != 0 {
        return Err(doc.field_error(
            "workload.bs",
            format!("expected a non-zero multiple of 512 bytes, got {bs}"),
        ));
    }
    let bs = wl.int("bs", bs, 512..=MAX_BLOCK_SIZE, "bytes (cap MAX_BLOCK_SIZE)")?;
    let iodepth = wl.int(
        "iodepth",
        s.iodepth.unwrap_or(d::FIO_IODEPTH.0),
        1..=MAX_IODEPTH,
        "(cap MAX_IODEPTH)",
    )?;
    let first_cpu = s.first_cpu.unwrap_or(0);
    if first_cpu >= c.cpus {
        return Err(doc.field_error(
            "workload.first_cpu",
            format!("expected 0..{} (machine.cpus = {})", c.cpus, c.cpus),
        ));
    }
    let max_jobs = (c.cpus - first_cpu).min(MAX_THREADS as usize) as u32;
    let numjobs = wl.int(
        "numjobs",
        s.numjobs.unwrap_or(1),
        1..=max_jobs,
        "(one job per CPU from first_cpu; cap MAX_THREADS)",
    )?;
    let inflight = u64::from(numjobs) * u64::from(iodepth);
    if inflight > MAX_INFLIGHT {
        return Err(doc.field_error(
            "workload.iodepth",
            format!("numjobs x iodepth = {inflight} I/Os in flight exceeds the cap MAX_INFLIGHT = {MAX_INFLIGHT}"),
        ));
    }
    let buffers = inflight * bs.next_multiple_of(4096);
    if BUFFER_BASE + buffers > c.memory_bytes {
        return Err(doc.field_error(
            "machine.memory_gib",
            format!(
                "the workload's I/O buffers (numjobs x iodepth x bs = {} MiB above the first 4 GiB) do not fit in {} GiB",
                buffers >> 20,
                c.memory_bytes >> 30
            ),
        ));
    }
    let size_gib = wl.int(
        "size_gib",
        s.size_gib.unwrap_or(d::FIO_SIZE_GIB.0),
        1..=MAX_TARGET_GIB,
        "GiB (cap MAX_TARGET_GIB)",
    )?;
    let runtime_ms = wl.int(
        "runtime_ms",
        s.runtime_ms,
        1..=MAX_RUN_MS,
        "ms of virtual time (cap MAX_RUN_MS)",
    )?;
    let ramp_ms = s.ramp_ms.unwrap_or(d::FIO_RAMP_MS.0);
    if runtime_ms + ramp_ms > MAX_RUN_MS {
        return Err(doc.field_error(
            "workload.ramp_ms",
            format!(
                "ramp_ms + runtime_ms = {} ms exceeds the cap MAX_RUN_MS = {MAX_RUN_MS} ms",
                runtime_ms + ramp_ms
            ),
        ));
    }
    let batch_submit = wl.int(
        "iodepth_batch_submit",
        s.iodepth_batch_submit.unwrap_or(1),
        1..=iodepth,
        "(at most iodepth)",
    )?;
    let batch_complete_min = wl.int(
        "iodepth_batch_complete_min",
        s.iodepth_batch_complete_min.unwrap_or(1),
        1..=iodepth,
        "(at most iodepth)",
    )?;
    let user_ns_per_io = wl.int(
        "user_ns_per_io",
        s.user_ns_per_io.unwrap_or(d::FIO_USER_NS_PER_IO.0),
        0..=1_000_000,
        "ns",
    )?;
    Ok(FioSetup {
        rw,
        rwmixread,
        bs,
        iodepth,
        numjobs,
        batch_submit,
        batch_complete_min,
        first_cpu,
        size: size_gib << 30,
        runtime_ns: runtime_ms * 1_000_000,
        ramp_ns: ramp_ms * 1_000_000,
        user_ns_per_io,
    })
}
