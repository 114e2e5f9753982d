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

use iolab_iommu::hw::pseries::DdwPolicy;
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
    #[serde(default)]
    kernel: Option<toml::Table>,
    #[serde(default)]
    machine: Option<toml::Table>,
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
    #[serde(default)]
    memory_banks: Option<Vec<BankSpec>>,
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

/// One RAM bank of `machine.memory_banks`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BankSpec {
    base: u64,
    mib: u64,
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
    instances: Option<usize>,
    #[serde(default)]
    evtq_log2size: Option<u32>,
    #[serde(default)]
    evtq_drain_interval_us: Option<f64>,
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
    #[serde(default)]
    page_size: Option<u64>,
    #[serde(default)]
    virt_merge: Option<bool>,
    #[serde(default)]
    sba_coalesce: Option<bool>,
    #[serde(default)]
    dirty_background_mib: Option<f64>,
    #[serde(default)]
    dirty_limit_mib: Option<f64>,
    #[serde(default)]
    writeback_chunk_kib: Option<u64>,
    #[serde(default)]
    readahead_kib: Option<u64>,
    #[serde(default)]
    block_queue_depth: Option<usize>,
    #[serde(default)]
    fsync_journal_blocks: Option<u64>,
    #[serde(default)]
    fsync_commit_flushes: Option<u64>,
    #[serde(default)]
    create_journal_blocks: Option<u64>,
    #[serde(default)]
    delete_journal_blocks: Option<u64>,
    #[serde(default)]
    block_virt_merge: Option<bool>,
    #[serde(default)]
    swiotlb_mib: Option<u64>,
    #[serde(default)]
    swiotlb_slot_bytes: Option<u64>,
    #[serde(default)]
    swiotlb_segment_slots: Option<usize>,
}

/// `[kernel]` fields of bonnie's page cache and file system (refused for other workloads).
const BONNIE_KERNEL_FIELDS: [&str; 9] = [
    "dirty_background_mib",
    "dirty_limit_mib",
    "writeback_chunk_kib",
    "readahead_kib",
    "block_queue_depth",
    "fsync_journal_blocks",
    "fsync_commit_flushes",
    "create_journal_blocks",
    "delete_journal_blocks",
];

/// `[kernel]` fields of the usb device's DMA path (refused for other devices).
const USB_KERNEL_FIELDS: [&str; 4] = [
    "block_virt_merge",
    "swiotlb_mib",
    "swiotlb_slot_bytes",
    "swiotlb_segment_slots",
];

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
    /// `[device.hostile]`: the device probes what it should not reach (see `hostile`).
    #[serde(default)]
    hostile: Option<HostileSpec>,
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
    #[serde(default)]
    dma_mask_bits: Option<u32>,
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
    user_scale: Option<f64>,
    #[serde(default)]
    sys_scale: Option<f64>,
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
    #[serde(default)]
    dma_mask_bits: Option<u32>,
    #[serde(default)]
    signal_bits_per_s: Option<f64>,
    #[serde(default)]
    encoding: Option<f64>,
    #[serde(default)]
    protocol_efficiency: Option<f64>,
    #[serde(default)]
    phase_latency_ns: Option<u64>,
    #[serde(default)]
    max_sectors: Option<u64>,
    #[serde(default)]
    walk_reads_per_miss: Option<u64>,
    #[serde(default)]
    max_segments: Option<usize>,
    #[serde(default)]
    max_segment_kib: Option<u64>,
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
    #[serde(default)]
    tcpip_header_bytes: Option<u64>,
    #[serde(default)]
    ethernet_overhead_bytes: Option<u64>,
    #[serde(default)]
    tx_coalesce_frames: Option<u64>,
    #[serde(default)]
    tx_coalesce_usecs: Option<u64>,
    #[serde(default)]
    rx_coalesce_frames: Option<u64>,
    #[serde(default)]
    rx_coalesce_usecs: Option<u64>,
    #[serde(default, deserialize_with = "crate::size::opt_bytes")]
    rx_stride_bytes: Option<u64>,
    #[serde(default)]
    rx_recycle_pct: Option<u32>,
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
    #[serde(default, deserialize_with = "crate::size::opt_bytes")]
    stdio_buffer_bytes: Option<u64>,
    #[serde(default)]
    seek_update_every: Option<u64>,
    #[serde(default)]
    putc_ns_per_byte: Option<f64>,
    #[serde(default)]
    getc_ns_per_byte: Option<f64>,
    #[serde(default)]
    write_page_ns: Option<u64>,
    #[serde(default)]
    overwrite_page_ns: Option<u64>,
    #[serde(default)]
    read_page_ns: Option<u64>,
    #[serde(default)]
    writeback_page_ns: Option<u64>,
    #[serde(default)]
    cpu_slice_ns: Option<u64>,
    #[serde(default)]
    files_run: Option<u64>,
    #[serde(default)]
    create_ns: Option<u64>,
    #[serde(default)]
    unlink_ns: Option<u64>,
    #[serde(default)]
    stat_ns: Option<u64>,
    #[serde(default)]
    readdir_entry_ns: Option<u64>,
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
    #[serde(default, deserialize_with = "crate::size::opt_bytes")]
    tso_max_bytes: Option<u64>,
    #[serde(default, deserialize_with = "crate::size::opt_bytes")]
    page_bytes: Option<u64>,
    #[serde(default, deserialize_with = "crate::size::opt_bytes")]
    linear_bytes: Option<u64>,
    #[serde(default, deserialize_with = "crate::size::opt_bytes")]
    tx_inflight_bytes: Option<u64>,
    #[serde(default)]
    rx_window_messages: Option<usize>,
    #[serde(default)]
    tx_per_skb_ns: Option<f64>,
    #[serde(default)]
    tx_completion_ns: Option<f64>,
    #[serde(default)]
    irq_ns: Option<f64>,
    #[serde(default)]
    rx_per_packet_ns: Option<f64>,
    #[serde(default)]
    rx_per_skb_ns: Option<f64>,
    #[serde(default)]
    jitter_pct: Option<u32>,
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
    /// `[device.hostile]`: the device probes just-unmapped addresses and the neighbours of
    /// live buffers (fio only); `None`, an honest device, unless the table is given.
    pub hostile: Option<crate::devices::hostile::HostileParams>,
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
    /// The HBA's DMA mask, bits.
    pub dma_mask_bits: u32,
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
    /// The xHCI's DMA mask, bits (`device[0].dma_mask_bits`).
    pub dma_mask_bits: u32,
    /// The swiotlb pool dma-direct bounces through (used without an IOMMU).
    pub swiotlb: SwiotlbSetup,
}

/// A validated swiotlb pool (`devices::usb::Swiotlb`): where it lies and its geometry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SwiotlbSetup {
    /// Physical address of the pool.
    pub base: u64,
    /// Pool size, bytes.
    pub bytes: u64,
    /// Slot size, bytes.
    pub slot_bytes: u64,
    /// Slots per segment (a bounce mapping stays inside one).
    pub segment_slots: usize,
}

impl SwiotlbSetup {
    /// The pool, empty.
    pub fn build(&self) -> Result<crate::devices::usb::Swiotlb, crate::devices::usb::SwiotlbError> {
        crate::devices::usb::Swiotlb::new(
            self.base,
            self.bytes,
            self.slot_bytes,
            self.segment_slots,
        )
    }
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
    /// The kernel's page size (page-cache pages), bytes.
    pub page: u64,
    /// Factors on every task's user and system CPU cost.
    pub scale: (f64, f64),
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

/// `machine.costs` path of `H_PUT_TCE`'s per-TCE cost.
const TCE_PUT: &str = "hypervisor.tce_put";
/// `machine.costs` path of `H_PUT_TCE_INDIRECT`'s per-TCE cost, derived from [`TCE_PUT`].
const TCE_INDIRECT: &str = "hypervisor.tce_indirect";

/// Applies `machine.costs`: each entry replaces the profile's cost at its dotted path
/// (value, unit when given, and source), then the profile is checked again. An override of
/// `hypervisor.tce_put` moves `hypervisor.tce_indirect` with it (the profile's list-page
/// read stays on top, [`crate::cost::HypervisorCosts::set_tce_put`]) unless the scenario
/// overrides that too.
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
        let unit = o.unit.unwrap_or(cost.unit);
        if path == TCE_PUT && !costs.contains_key(TCE_INDIRECT) {
            // H_PUT_TCE_INDIRECT's per-TCE cost is tce_put's plus the list-page read: it
            // moves with tce_put unless the scenario sets it too.
            let clock = profile.cpu.clock_ghz;
            if let Some(hv) = profile.hypervisor.as_mut() {
                hv.set_tce_put(clock, o.value, unit, &o.source);
            }
        } else {
            cost.value = o.value;
            cost.unit = unit;
            cost.source = o.source.clone();
        }
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
    applicable_fields(&doc, &probe.kernel, &probe.machine, &wkind, &dkind)?;
    if let Some(k) = &probe.kernel {
        if k.contains_key("page_size") && wkind != "reaim" {
            return Err(doc
                .field_error(
                    "kernel.page_size",
                    "applies to reaim workloads only (the page size of re-aim's page cache; the other workloads' buffers are 4 KiB pages)",
                )
                .into());
        }
        if k.contains_key("virt_merge") && dkind != "scsi" {
            return Err(doc
                .field_error(
                    "kernel.virt_merge",
                    "applies to scsi devices only (the block layer's virtual merge on the SCSI host's queue)",
                )
                .into());
        }
    }
    let scenario = match (wkind.as_str(), dkind.as_str()) {
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
            let mut scsi = scsi(&doc, &f.device[0], &common.profile)?;
            virt_merge(&doc, &f.kernel, &common.iommu, &mut scsi)?;
            let bonnie = bonnie(&doc, &f.workload, &f.kernel, &common, scsi.limits)?;
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
            let usb = usb(&doc, &f.device[0], &f.kernel, &common)?;
            let virt_merge = f.kernel.block_virt_merge.unwrap_or(d::BLOCK_VIRT_MERGE.0);
            if virt_merge && common.iommu.mode == IommuMode::Off {
                return Err(doc
                    .field_error(
                        "kernel.block_virt_merge",
                        "true needs an IOMMU that merges page-aligned pieces (iommu.model = \"ipmmu\"): without one nothing merges",
                    )
                    .into());
            }
            let limits = crate::block::QueueLimits {
                max_segments: usb.max_segments,
                max_segment_size: usb.max_segment_size,
                max_transfer: usb.config.link.max_transfer,
                virt_merge_granule: virt_merge.then_some(4096),
            };
            let mut bonnie = bonnie(&doc, &f.workload, &f.kernel, &common, limits)?;
            if common.memory_banks.is_some() {
                // The swiotlb pool was taken from the start of the first bank at boot: the
                // page cache has the rest.
                let first = &mut bonnie.config.ram_banks[0];
                first.0 += usb.swiotlb.bytes;
                first.1 -= usb.swiotlb.bytes;
            }
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
            let (link, nic) = nic(&doc, &f.device[0])?;
            let netperf = netperf(&doc, &f.workload, &common, nic)?;
            let kernel = kernel(&doc, &f.kernel, 0, 0)?;
            Ok(common.finish(kernel, Devices::Nic(link), Workload::Netperf(Box::new(netperf))))
        }
        ("reaim", "scsi") => {
            let f: File<ScsiSpec, ReaimSpec> = deserialize_as(&doc)?;
            let common = common(&doc, &f, base)?;
            one_device(&doc, f.device.len(), "reaim")?;
            instances(&doc, &common.iommu, &[None])?;
            let mut scsi = scsi(&doc, &f.device[0], &common.profile)?;
            virt_merge(&doc, &f.kernel, &common.iommu, &mut scsi)?;
            let reaim = reaim(&doc, &f.workload, &f.kernel, &common, &scsi)?;
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
    }?;
    hostile_needs_fio(&doc, &scenario)?;
    Ok(scenario)
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
    let bonnie = bonnie_on_block(doc, &f.workload, &f.kernel, &common, &devices)?;
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
    /// `machine.memory_banks`: `(base, bytes)` each, ascending.
    memory_banks: Option<Vec<(u64, u64)>>,
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
    let memory_banks = f
        .machine
        .memory_banks
        .as_deref()
        .map(|b| memory_banks(doc, b, memory_gib))
        .transpose()?;
    let kernel = kernel_variants(doc, &f.kernel)?;
    let mut iommu = iommu(doc, &f.iommu, &profile, memory_gib, kernel)?;
    if let Some(coalesce) = f.kernel.sba_coalesce {
        if !sba_maps_lists(&iommu) {
            return Err(doc
                .field_error(
                    "kernel.sba_coalesce",
                    "applies to iommu.model = \"sba\" in mode translated or bypass (the SBA driver's sba_map_sg)",
                )
                .into());
        }
        iommu.sba_coalesce = coalesce;
    }
    // The profile describes this machine: its core count is the scenario's.
    profile.cpu.cores = cpus as u32;
    Ok(Common {
        name,
        description: f.description.clone(),
        seed: f.seed,
        profile,
        cpus,
        memory_bytes: memory_gib << 30,
        memory_banks,
        iommu,
    })
}

/// Whether `iommu` is the SBA mapping scatter-gather lists through its pdir (translated or
/// bypass mode: only single buffers bypass it).
fn sba_maps_lists(iommu: &IommuSetup) -> bool {
    iommu.model == IommuModel::Sba
        && matches!(iommu.mode, IommuMode::Translated | IommuMode::Bypass)
}

/// `kernel.virt_merge` on a scsi device: with it the block layer counts pieces that meet at
/// an IOMMU page boundary as one segment (`BIO_VMERGE_BOUNDARY` = the SBA's page size), which
/// is only right where the IOMMU then coalesces them (the SBA with `kernel.sba_coalesce`).
fn virt_merge(
    doc: &TomlDoc<'_>,
    k: &KernelSpec,
    iommu: &IommuSetup,
    scsi: &mut ScsiSetup,
) -> Result<(), InputError> {
    if !k.virt_merge.unwrap_or(d::VIRT_MERGE.0) {
        scsi.limits.virt_merge_granule = None;
        return Ok(());
    }
    if !sba_maps_lists(iommu) {
        return Err(doc.field_error(
            "kernel.virt_merge",
            format!(
                "needs an IOMMU that coalesces what the block layer merged: iommu.model = \"sba\" in mode translated or bypass, got {} in mode {}",
                iommu.model.name(),
                iommu.mode.name()
            ),
        ));
    }
    if !iommu.sba_coalesce {
        return Err(doc.field_error(
            "kernel.virt_merge",
            "needs kernel.sba_coalesce = true: a request the block layer counted as one segment would reach the HBA as several DMA segments, past sg_tablesize (Linux sets BIO_VMERGE_BOUNDARY only where the IOMMU merges)",
        ));
    }
    scsi.limits.virt_merge_granule = Some(iommu.sba_page_size);
    Ok(())
}

/// `machine.memory_banks`: page-aligned, ascending, non-overlapping banks below 2^48 whose
/// total fits in `machine.memory_gib`.
fn memory_banks(
    doc: &TomlDoc<'_>,
    banks: &[BankSpec],
    memory_gib: u64,
) -> Result<Vec<(u64, u64)>, InputError> {
    if banks.is_empty() || banks.len() > MAX_MEMORY_BANKS {
        return Err(doc.field_error(
            "machine.memory_banks",
            format!("expected 1..={MAX_MEMORY_BANKS} banks (cap MAX_MEMORY_BANKS)"),
        ));
    }
    let mut out = Vec::with_capacity(banks.len());
    let mut prev_end = 0u64;
    let mut total_mib = 0u64;
    for (i, b) in banks.iter().enumerate() {
        let path = format!("machine.memory_banks[{i}]");
        let bytes = range(
            doc,
            &format!("{path}.mib"),
            b.mib,
            1,
            MAX_MEMORY_GIB << 10,
            "MiB",
        )? << 20;
        let end = b.base.checked_add(bytes).filter(|&e| e <= 1 << 48);
        if b.base % 4096 != 0 || b.base < prev_end || end.is_none() {
            return Err(doc.field_error(
                &format!("{path}.base"),
                format!(
                    "expected a page-aligned address at or above the previous bank's end ({prev_end:#x}) with the bank ending at or below 2^48, got {:#x}",
                    b.base
                ),
            ));
        }
        prev_end = end.unwrap_or(u64::MAX);
        total_mib += b.mib;
        out.push((b.base, bytes));
    }
    if total_mib > memory_gib << 10 {
        return Err(doc.field_error(
            "machine.memory_banks",
            format!("the banks hold {total_mib} MiB, more than machine.memory_gib = {memory_gib}"),
        ));
    }
    Ok(out)
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
        instances,
        device_instance: Vec::new(),
        evtq_log2size,
        evtq_drain_ns,
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

/// Refuses `[kernel]` and `[machine]` fields the scenario's workload and device do not use:
/// bonnie's page cache and file-system costs and `machine.memory_banks` (bonnie only), the
/// usb DMA path's (`block_virt_merge`, swiotlb; bonnie on usb only).
fn applicable_fields(
    doc: &TomlDoc<'_>,
    kernel: &Option<toml::Table>,
    machine: &Option<toml::Table>,
    wkind: &str,
    dkind: &str,
) -> Result<(), InputError> {
    let has = |t: &Option<toml::Table>, k: &str| t.as_ref().is_some_and(|t| t.contains_key(k));
    if wkind != "bonnie" {
        if has(machine, "memory_banks") {
            return Err(doc.field_error(
                "machine.memory_banks",
                format!("places bonnie's page cache; a {wkind} workload has none"),
            ));
        }
        for k in BONNIE_KERNEL_FIELDS {
            if has(kernel, k) {
                return Err(doc.field_error(
                    &format!("kernel.{k}"),
                    format!("applies to bonnie's page cache and file system; a {wkind} workload has none"),
                ));
            }
        }
    }
    if wkind != "bonnie" || dkind != "usb" {
        for k in USB_KERNEL_FIELDS {
            if has(kernel, k) {
                return Err(doc.field_error(
                    &format!("kernel.{k}"),
                    format!(
                        "applies to bonnie on a usb device's DMA path, not to {wkind} on {dkind}"
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// One USB link speed, its defaults overridden by the device table's link fields.
fn usb_link(
    dev: &Fields<'_, '_>,
    s: &UsbSpec,
    l: &d::UsbLinkDefaults,
) -> Result<crate::devices::usb::LinkSpeed, InputError> {
    let max_sectors = dev.int(
        "max_sectors",
        s.max_sectors.unwrap_or(l.max_sectors.0),
        8..=65536,
        "512-byte sectors per command",
    )?;
    Ok(crate::devices::usb::LinkSpeed {
        name: l.name.to_owned(),
        signal_bits_per_s: dev.real(
            "signal_bits_per_s",
            s.signal_bits_per_s.unwrap_or(l.signal_bits_per_s.0),
            1e6..=1e11,
        )?,
        encoding: dev.real("encoding", s.encoding.unwrap_or(l.encoding.0), 0.1..=1.0)?,
        protocol_efficiency: dev.real(
            "protocol_efficiency",
            s.protocol_efficiency.unwrap_or(l.protocol_efficiency.0),
            0.01..=1.0,
        )?,
        phase_latency_ns: dev.int(
            "phase_latency_ns",
            s.phase_latency_ns.unwrap_or(l.phase_latency_ns.0),
            0..=10_000_000,
            "ns",
        )?,
        max_transfer: max_sectors * 512,
    })
}

fn usb(doc: &TomlDoc<'_>, s: &UsbSpec, k: &KernelSpec, c: &Common) -> Result<UsbSetup, InputError> {
    let dev = Fields::new(doc, "device[0]");
    let link = match s.speed.as_deref().unwrap_or("superspeed") {
        "superspeed" => usb_link(&dev, s, &d::USB_SUPERSPEED)?,
        "highspeed" => usb_link(&dev, s, &d::USB_HIGHSPEED)?,
        other => {
            return Err(doc.field_error(
                "device[0].speed",
                format!("unknown speed \"{other}\": expected \"superspeed\" or \"highspeed\""),
            ))
        }
    };
    let config = crate::devices::usb::UsbStorageConfig {
        link,
        command_overhead_ns: dev.int(
            "command_overhead_ns",
            s.command_overhead_ns
                .unwrap_or(d::USB_COMMAND_OVERHEAD_NS.0),
            0..=100_000_000,
            "ns",
        )?,
        per_segment_ns: dev.int(
            "per_segment_ns",
            s.per_segment_ns.unwrap_or(d::USB_PER_SEGMENT_NS.0),
            0..=1_000_000,
            "ns",
        )?,
        media_read_latency_ns: dev.us_as_ns(
            "media_read_latency_us",
            s.media_read_latency_us
                .unwrap_or(d::USB_MEDIA_READ_LATENCY_US.0),
            0.0..=1e6,
        )?,
        media_flush_ns: dev.us_as_ns(
            "media_flush_us",
            s.media_flush_us.unwrap_or(d::USB_MEDIA_FLUSH_US.0),
            0.0..=1e6,
        )?,
        walk_reads_per_miss: dev.int(
            "walk_reads_per_miss",
            s.walk_reads_per_miss
                .unwrap_or(d::USB_WALK_READS_PER_MISS.0),
            0..=4,
            "table reads (an LPAE walk has at most 4 levels)",
        )?,
        completion_ns: dev.int(
            "completion_ns",
            s.completion_ns.unwrap_or(d::USB_COMPLETION_NS.0),
            0..=1_000_000,
            "ns",
        )?,
        storage_cpu: dev.cpu("storage_cpu", s.storage_cpu, d::USB_STORAGE_CPU.0, c.cpus)?,
        irq_cpu: dev.cpu("irq_cpu", s.irq_cpu, d::USB_IRQ_CPU.0, c.cpus)?,
    };
    let max_segments = dev.int(
        "max_segments",
        s.max_segments.unwrap_or(d::USB_MAX_SEGMENTS.0),
        1..=65535,
        "segments per request",
    )?;
    let max_segment_size = dev.int(
        "max_segment_kib",
        s.max_segment_kib.unwrap_or(d::USB_MAX_SEGMENT_KIB.0),
        4..=4096,
        "KiB",
    )? << 10;
    let dma_mask_bits = dev.int(
        "dma_mask_bits",
        s.dma_mask_bits.unwrap_or(d::USB_DMA_MASK_BITS.0),
        24..=64,
        "bits",
    )?;
    let swiotlb = swiotlb(doc, k, c, dma_mask_bits)?;
    Ok(UsbSetup {
        config,
        max_segment_size,
        max_segments,
        dma_mask_bits,
        swiotlb,
    })
}

/// The swiotlb pool of a usb scenario: `kernel.swiotlb_*`, at the start of the first memory
/// bank (`machine.memory_banks`), else ending at [`d::SWIOTLB_END_WITHOUT_BANKS`]. Without an
/// IOMMU dma-direct bounces through it, so it must lie below the device's DMA mask.
fn swiotlb(
    doc: &TomlDoc<'_>,
    k: &KernelSpec,
    c: &Common,
    dma_mask_bits: u32,
) -> Result<SwiotlbSetup, InputError> {
    let kernel = Fields::new(doc, "kernel");
    let bytes = kernel.int(
        "swiotlb_mib",
        k.swiotlb_mib.unwrap_or(d::SWIOTLB_MIB.0),
        1..=4096,
        "MiB",
    )? << 20;
    let slot_bytes = kernel.int(
        "swiotlb_slot_bytes",
        k.swiotlb_slot_bytes.unwrap_or(d::SWIOTLB_SLOT_BYTES.0),
        512..=65536,
        "bytes (a power of two)",
    )?;
    let segment_slots = kernel.int(
        "swiotlb_segment_slots",
        k.swiotlb_segment_slots
            .unwrap_or(d::SWIOTLB_SEGMENT_SLOTS.0),
        1..=4096,
        "slots",
    )?;
    let base = match &c.memory_banks {
        Some(banks) => {
            if bytes >= banks[0].1 {
                return Err(doc.field_error(
                    "kernel.swiotlb_mib",
                    format!(
                        "the pool ({} MiB) must fit in the first of machine.memory_banks ({} MiB), where it is allocated at boot",
                        bytes >> 20,
                        banks[0].1 >> 20
                    ),
                ));
            }
            banks[0].0
        }
        None => d::SWIOTLB_END_WITHOUT_BANKS.0 - bytes,
    };
    let mask = u64::MAX >> (64 - dma_mask_bits);
    if c.iommu.mode == IommuMode::Off && base + bytes - 1 > mask {
        return Err(doc.field_error(
            "device[0].dma_mask_bits",
            format!(
                "dma-direct bounces through the swiotlb pool at {base:#x}..{:#x}, beyond a {dma_mask_bits}-bit mask: declare machine.memory_banks with a first bank below the mask",
                base + bytes
            ),
        ));
    }
    let setup = SwiotlbSetup {
        base,
        bytes,
        slot_bytes,
        segment_slots,
    };
    setup.build().map_err(|e| {
        doc.field_error(
            if slot_bytes.is_power_of_two() {
                "kernel.swiotlb_segment_slots"
            } else {
                "kernel.swiotlb_slot_bytes"
            },
            e.to_string(),
        )
    })?;
    Ok(setup)
}

/// bonnie on an NVMe SSD or a SAS HBA: the lab's bonnie defaults, the block devices' queue
/// limits.
fn bonnie_on_block(
    doc: &TomlDoc<'_>,
    s: &BonnieSpec,
    k: &KernelSpec,
    c: &Common,
    devices: &Devices,
) -> Result<BonnieSetup, LabError> {
    let limits = super::block::bonnie_limits(devices).ok_or_else(|| {
        doc.field_error("device[0].kind", "expected a block device (nvme or sas)")
    })?;
    Ok(bonnie(doc, s, k, c, limits)?)
}

/// bonnie++ 1.03 on `limits`: every field's default from [`d`], the page cache on
/// `machine.memory_banks` or one bank of `workload.ram_mib` at [`d::PAGE_CACHE_BASE`].
fn bonnie(
    doc: &TomlDoc<'_>,
    s: &BonnieSpec,
    k: &KernelSpec,
    c: &Common,
    limits: crate::block::QueueLimits,
) -> Result<BonnieSetup, InputError> {
    use crate::workloads::bonnie::{BonnieConfig, FileTestConfig};
    let wl = Fields::new(doc, "workload");
    let kernel = Fields::new(doc, "kernel");
    let file_mib = wl.int(
        "file_mib",
        s.file_mib.unwrap_or(d::BONNIE_FILE_MIB.0),
        1..=MAX_FILE_MIB,
        "MiB (cap MAX_FILE_MIB)",
    )?;
    let logical = wl.int(
        "logical_file_mib",
        s.logical_file_mib.unwrap_or(d::BONNIE_LOGICAL_FILE_MIB.0),
        file_mib..=MAX_TARGET_GIB << 10,
        "MiB (at least file_mib)",
    )?;
    // Dirty thresholds: as set, else the defaults (stated for a 64 MiB file) scaled with
    // the file.
    let scale = file_mib as f64 / d::DIRTY_REFERENCE_FILE_MIB.0 as f64;
    let default_background =
        (((d::DIRTY_BACKGROUND_MIB.0 * 1_048_576.0) as u64 as f64 * scale) as u64).max(4096);
    let dirty_background = match k.dirty_background_mib {
        Some(v) => (kernel.real("dirty_background_mib", v, 0.0..=1e6)? * 1_048_576.0) as u64,
        None => default_background,
    };
    let dirty_limit = match k.dirty_limit_mib {
        Some(v) => (kernel.real("dirty_limit_mib", v, 0.1..=1e6)? * 1_048_576.0) as u64,
        None => (((d::DIRTY_LIMIT_MIB.0 * 1_048_576.0) as u64 as f64 * scale) as u64)
            .max(default_background + 4096),
    };
    if dirty_background >= dirty_limit {
        let field = if k.dirty_limit_mib.is_some() {
            "kernel.dirty_limit_mib"
        } else {
            "kernel.dirty_background_mib"
        };
        return Err(doc.field_error(
            field,
            format!(
                "the background threshold ({dirty_background} bytes) must be below the dirty limit ({dirty_limit} bytes)"
            ),
        ));
    }
    let ram_banks = match &c.memory_banks {
        Some(banks) => {
            if s.ram_mib.is_some() {
                return Err(doc.field_error(
                    "workload.ram_mib",
                    "the page cache is machine.memory_banks' RAM: set one of the two",
                ));
            }
            banks.clone()
        }
        None => {
            let ram_mib = wl.int(
                "ram_mib",
                s.ram_mib.unwrap_or(d::BONNIE_RAM_MIB.0),
                1..=MAX_MEMORY_GIB << 10,
                "MiB",
            )?;
            // One bank above the first 4 GiB (docs/SCENARIOS.md).
            let base = d::PAGE_CACHE_BASE.0;
            if base + (ram_mib << 20) > c.memory_bytes {
                return Err(doc.field_error(
                    "workload.ram_mib",
                    format!(
                        "the page cache ({ram_mib} MiB above the first 4 GiB) does not fit in machine.memory_gib = {}",
                        c.memory_bytes >> 30
                    ),
                ));
            }
            vec![(base, ram_mib << 20)]
        }
    };
    let chunk = match s.chunk_bytes {
        Some(ch) if ch == 0 || ch % 512 != 0 || ch > 1 << 20 => {
            return Err(doc.field_error(
                "workload.chunk_bytes",
                format!("expected a non-zero multiple of 512 up to 1 MiB, got {ch}"),
            ))
        }
        Some(ch) => ch,
        None => d::BONNIE_CHUNK_BYTES.0,
    };
    let seeks = wl.int(
        "seeks",
        s.seeks.unwrap_or(d::BONNIE_SEEKS.0),
        1..=1_000_000,
        "seeks",
    )?;
    let seeker_cpus = if let Some(cpus) = &s.seeker_cpus {
        if cpus.is_empty() || cpus.len() > MAX_THREADS as usize {
            return Err(doc.field_error(
                "workload.seeker_cpus",
                format!("expected 1..={MAX_THREADS} seekers (cap MAX_THREADS)"),
            ));
        }
        for &x in cpus {
            wl.cpu("seeker_cpus", Some(x), 0, c.cpus)?;
        }
        cpus.clone()
    } else {
        d::BONNIE_SEEKER_CPUS
            .0
            .iter()
            .map(|&x| x % c.cpus)
            .collect()
    };
    let ns = |field: &str, v: Option<u64>, default: u64| {
        wl.int(field, v.unwrap_or(default), 0..=10_000_000, "ns")
    };
    let write_page_ns = ns("write_page_ns", s.write_page_ns, d::BONNIE_WRITE_PAGE_NS.0)?;
    let read_page_ns = ns("read_page_ns", s.read_page_ns, d::BONNIE_READ_PAGE_NS.0)?;
    let overwrite_page_ns = ns(
        "overwrite_page_ns",
        s.overwrite_page_ns,
        write_page_ns.saturating_sub(read_page_ns),
    )?;
    let files_k = wl.int(
        "files",
        s.files.unwrap_or(d::BONNIE_FILES_K.0),
        0..=1024,
        "x 1024 files (bonnie++ -n; 0: no file tests)",
    )?;
    let blocks = |field: &str, v: Option<u64>, default: u64| {
        kernel.int(field, v.unwrap_or(default), 1..=64, "journal blocks")
    };
    let file_tests = if files_k == 0 {
        None
    } else {
        let files = files_k * 1024;
        // The lab runs at most the default count per test unless told otherwise.
        let files_run = match s.files_run {
            Some(n) => wl.int(
                "files_run",
                n,
                1..=files,
                "files per test (at most files x 1024)",
            )?,
            None => d::BONNIE_FILES_RUN.0.min(files),
        };
        Some(FileTestConfig {
            files,
            files_run,
            create_ns: ns("create_ns", s.create_ns, d::BONNIE_CREATE_NS.0)?,
            unlink_ns: ns("unlink_ns", s.unlink_ns, d::BONNIE_UNLINK_NS.0)?,
            stat_ns: ns("stat_ns", s.stat_ns, d::BONNIE_STAT_NS.0)?,
            readdir_entry_ns: ns(
                "readdir_entry_ns",
                s.readdir_entry_ns,
                d::BONNIE_READDIR_ENTRY_NS.0,
            )?,
            create_journal_blocks: blocks(
                "create_journal_blocks",
                k.create_journal_blocks,
                d::CREATE_JOURNAL_BLOCKS.0,
            )?,
            delete_journal_blocks: blocks(
                "delete_journal_blocks",
                k.delete_journal_blocks,
                d::DELETE_JOURNAL_BLOCKS.0,
            )?,
        })
    };
    let config = BonnieConfig {
        file_bytes: file_mib << 20,
        logical_file_bytes: logical << 20,
        chunk,
        stdio_buffer: wl.int(
            "stdio_buffer_bytes",
            s.stdio_buffer_bytes
                .unwrap_or(d::BONNIE_STDIO_BUFFER_BYTES.0),
            512..=1 << 20,
            "bytes",
        )?,
        seeks,
        seekers: seeker_cpus.len(),
        seek_update_every: wl.int(
            "seek_update_every",
            s.seek_update_every.unwrap_or(d::BONNIE_SEEK_UPDATE_EVERY.0),
            1..=1_000_000,
            "seeks",
        )?,
        fsync_journal_blocks: kernel.int(
            "fsync_journal_blocks",
            k.fsync_journal_blocks.unwrap_or(d::FSYNC_JOURNAL_BLOCKS.0),
            0..=64,
            "journal blocks",
        )?,
        fsync_commit_flushes: kernel.int(
            "fsync_commit_flushes",
            k.fsync_commit_flushes.unwrap_or(d::FSYNC_COMMIT_FLUSHES.0),
            0..=2,
            "cache flushes (before and after the commit block)",
        )?,
        putc_ns_per_byte: wl.real(
            "putc_ns_per_byte",
            s.putc_ns_per_byte.unwrap_or(d::BONNIE_PUTC_NS_PER_BYTE.0),
            0.0..=1e4,
        )?,
        getc_ns_per_byte: wl.real(
            "getc_ns_per_byte",
            s.getc_ns_per_byte.unwrap_or(d::BONNIE_GETC_NS_PER_BYTE.0),
            0.0..=1e4,
        )?,
        write_page_ns,
        overwrite_page_ns,
        read_page_ns,
        writeback_page_ns: ns(
            "writeback_page_ns",
            s.writeback_page_ns,
            d::BONNIE_WRITEBACK_PAGE_NS.0,
        )?,
        syscall_ns: c.profile.cpu.syscall.ns().round() as u64,
        copy_bytes_per_ns: c.profile.memory.memcpy_bandwidth.gb_per_s,
        dirty_background,
        dirty_limit,
        writeback_chunk: kernel.int(
            "writeback_chunk_kib",
            k.writeback_chunk_kib.unwrap_or(d::WRITEBACK_CHUNK_KIB.0),
            4..=1_000_000,
            "KiB",
        )? << 10,
        readahead: kernel.int(
            "readahead_kib",
            k.readahead_kib.unwrap_or(d::READAHEAD_KIB.0),
            4..=1_000_000,
            "KiB",
        )? << 10,
        queue_depth: kernel.int(
            "block_queue_depth",
            k.block_queue_depth.unwrap_or(d::BLOCK_QUEUE_DEPTH.0),
            1..=MAX_IODEPTH as usize,
            "requests (cap MAX_IODEPTH)",
        )?,
        limits,
        ram_banks,
        bonnie_cpu: wl.cpu("bonnie_cpu", s.bonnie_cpu, d::BONNIE_CPU.0, c.cpus)?,
        flusher_cpu: wl.cpu(
            "flusher_cpu",
            s.flusher_cpu,
            d::BONNIE_FLUSHER_CPU.0,
            c.cpus,
        )?,
        seeker_cpus,
        slice_ns: wl.int(
            "cpu_slice_ns",
            s.cpu_slice_ns.unwrap_or(d::BONNIE_CPU_SLICE_NS.0),
            100..=10_000_000,
            "ns",
        )?,
        file_tests,
    };
    let csv = csv_layout(doc, s.csv.as_ref())?;
    Ok(BonnieSetup {
        config,
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

/// The NIC's `[[device]]` table: the port, its framing, rings, moderation and receive
/// pages (defaults: [`d::NIC_LINK_GBPS`] and the other `NIC_*` constants). Returns the
/// wire and a stream configuration with the NIC's part set (the workload sets the rest).
fn nic(
    doc: &TomlDoc<'_>,
    s: &NicSpec,
) -> Result<
    (
        crate::devices::nic::LinkConfig,
        crate::workloads::netperf::StreamConfig,
    ),
    InputError,
> {
    use crate::devices::nic::{Coalescing, LinkConfig};
    use crate::workloads::netperf::{StreamConfig, StreamDirection};
    let dev = Fields::new(doc, "device[0]");
    let gbps = dev.real(
        "link_gbps",
        s.link_gbps.unwrap_or(d::NIC_LINK_GBPS.0),
        0.001..=10_000.0,
    )?;
    let mtu = dev.int("mtu", s.mtu.unwrap_or(d::NIC_MTU.0), 576..=65_535, "bytes")?;
    let headers = dev.int(
        "tcpip_header_bytes",
        s.tcpip_header_bytes.unwrap_or(d::NIC_TCPIP_HEADER_BYTES.0),
        20..=200,
        "bytes",
    )?;
    let framing = dev.int(
        "ethernet_overhead_bytes",
        s.ethernet_overhead_bytes
            .unwrap_or(d::NIC_ETHERNET_OVERHEAD_BYTES.0),
        0..=200,
        "bytes",
    )?;
    let coalescing = |frames: &str, f: Option<u64>, fd: u64, usecs: &str, u: Option<u64>, ud| {
        Ok::<_, InputError>(Coalescing {
            frames: dev.int(
                frames,
                f.unwrap_or(fd),
                1..=1 << 16,
                "completions per interrupt",
            )?,
            usecs: dev.int(usecs, u.unwrap_or(ud), 0..=100_000, "us")?,
        })
    };
    let stream = StreamConfig {
        threads: 1,
        direction: StreamDirection::Write,
        message_bytes: d::NETPERF_MESSAGE_BYTES.0,
        tso_max_bytes: d::NETPERF_TSO_MAX_BYTES.0,
        page_bytes: d::NETPERF_PAGE_BYTES.0,
        linear_bytes: d::NETPERF_LINEAR_BYTES.0,
        tx_ring_entries: dev.int(
            "tx_ring_entries",
            s.tx_ring_entries.unwrap_or(d::NIC_TX_RING_ENTRIES.0),
            1..=MAX_IODEPTH as usize,
            "(cap MAX_IODEPTH)",
        )?,
        tx_inflight_bytes: d::NETPERF_TX_INFLIGHT_BYTES.0,
        tx_coalescing: coalescing(
            "tx_coalesce_frames",
            s.tx_coalesce_frames,
            d::NIC_TX_COALESCE_FRAMES.0,
            "tx_coalesce_usecs",
            s.tx_coalesce_usecs,
            d::NIC_TX_COALESCE_USECS.0,
        )?,
        rx_coalescing: coalescing(
            "rx_coalesce_frames",
            s.rx_coalesce_frames,
            d::NIC_RX_COALESCE_FRAMES.0,
            "rx_coalesce_usecs",
            s.rx_coalesce_usecs,
            d::NIC_RX_COALESCE_USECS.0,
        )?,
        rx_window_messages: d::NETPERF_RX_WINDOW_MESSAGES.0,
        // Checked against the workload's page size in `netperf`.
        rx_stride_bytes: s.rx_stride_bytes.unwrap_or(d::NIC_RX_STRIDE_BYTES.0),
        rx_ring_pages: dev.int(
            "rx_ring_pages",
            s.rx_ring_pages.unwrap_or(d::NIC_RX_RING_PAGES.0),
            1..=MAX_IODEPTH as usize,
            "(cap MAX_IODEPTH)",
        )?,
        queues: dev.int(
            "queues",
            s.queues.unwrap_or(d::NIC_QUEUES.0),
            1..=MAX_DEVICE_QUEUES,
            "(cap MAX_DEVICE_QUEUES)",
        )?,
        rx_recycle_pct: dev.int(
            "rx_recycle_pct",
            s.rx_recycle_pct.unwrap_or(d::NIC_RX_RECYCLE_PCT.0),
            0..=100,
            "percent",
        )?,
        run_ns: 0,
        warmup_ns: 0,
    };
    if mtu <= headers {
        return Err(doc.field_error(
            "device[0].tcpip_header_bytes",
            format!("expected less than mtu = {mtu} (MSS = MTU - TCP/IP headers), got {headers}"),
        ));
    }
    Ok((LinkConfig::from_mtu(gbps, mtu, headers, framing), stream))
}

/// The netperf `[workload]` table: threads, direction, message and skb sizes, the TCP byte
/// bounds, the stack's CPU costs (defaults: the `NETPERF_*` constants of [`d`]).
fn netperf(
    doc: &TomlDoc<'_>,
    s: &NetperfSpec,
    c: &Common,
    mut stream: crate::workloads::netperf::StreamConfig,
) -> Result<NetperfSetup, InputError> {
    let wl = Fields::new(doc, "workload");
    use crate::devices::nic::HvSerialisation;
    use crate::workloads::netperf::{StackCosts, StreamDirection};
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
    let page_bytes = wl.int(
        "page_bytes",
        s.page_bytes.unwrap_or(d::NETPERF_PAGE_BYTES.0),
        4096..=1 << 16,
        "bytes (a kernel page size)",
    )?;
    if !page_bytes.is_power_of_two() {
        return Err(doc.field_error(
            "workload.page_bytes",
            format!("expected a power of two, got {page_bytes}"),
        ));
    }
    stream.page_bytes = page_bytes;
    range(
        doc,
        "device[0].rx_stride_bytes",
        stream.rx_stride_bytes,
        64,
        page_bytes,
        "bytes (at most workload.page_bytes)",
    )?;
    stream.tso_max_bytes = wl.int(
        "tso_max_bytes",
        s.tso_max_bytes.unwrap_or(d::NETPERF_TSO_MAX_BYTES.0),
        1..=1 << 18,
        "bytes",
    )?;
    stream.linear_bytes = wl.int(
        "linear_bytes",
        s.linear_bytes.unwrap_or(d::NETPERF_LINEAR_BYTES.0),
        0..=4096 - 64,
        "bytes (headers in the skb's linear part)",
    )?;
    stream.tx_inflight_bytes = wl.int(
        "tx_inflight_bytes",
        s.tx_inflight_bytes
            .unwrap_or(d::NETPERF_TX_INFLIGHT_BYTES.0),
        1..=1 << 30,
        "bytes",
    )?;
    stream.rx_window_messages = wl.int(
        "rx_window_messages",
        s.rx_window_messages
            .unwrap_or(d::NETPERF_RX_WINDOW_MESSAGES.0),
        1..=1 << 16,
        "messages",
    )?;
    let run_ms = wl.int(
        "run_ms",
        s.run_ms,
        1..=MAX_RUN_MS,
        "ms of virtual time (cap MAX_RUN_MS)",
    )?;
    let warmup_ms = s.warmup_ms.unwrap_or(d::NETPERF_WARMUP_MS.0);
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
    let ns =
        |field: &str, v: Option<f64>, default: f64| wl.real(field, v.unwrap_or(default), 0.0..=1e9);
    let costs = StackCosts {
        syscall_ns: 0.0,
        copy_bytes_per_ns: 0.0,
        tx_per_skb_ns: ns("tx_per_skb_ns", s.tx_per_skb_ns, d::NETPERF_TX_PER_SKB_NS.0)?,
        tx_completion_ns: ns(
            "tx_completion_ns",
            s.tx_completion_ns,
            d::NETPERF_TX_COMPLETION_NS.0,
        )?,
        irq_ns: ns("irq_ns", s.irq_ns, d::NETPERF_IRQ_NS.0)?,
        rx_per_packet_ns: ns(
            "rx_per_packet_ns",
            s.rx_per_packet_ns,
            d::NETPERF_RX_PER_PACKET_NS.0,
        )?,
        rx_per_skb_ns: ns("rx_per_skb_ns", s.rx_per_skb_ns, d::NETPERF_RX_PER_SKB_NS.0)?,
        doorbell_ns: 0.0,
        jitter_pct: wl.int(
            "jitter_pct",
            s.jitter_pct.unwrap_or(d::NETPERF_JITTER_PCT.0),
            0..=50,
            "percent",
        )?,
    }
    .with_profile(&c.profile);
    Ok(NetperfSetup {
        stream,
        costs,
        serialisation: if c.iommu.serialise_tce_updates {
            HvSerialisation::PerTable
        } else {
            HvSerialisation::None
        },
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
    let hostile = s.hostile.as_ref().map(|h| hostile(doc, i, h)).transpose()?;
    Ok(NvmeSetup {
        params,
        coalescing,
        hostile,
    })
}

// ---------------------------------------------------------------------------------------
// `[device.hostile]`: a hostile NVMe device (devices::hostile), fio only
// ---------------------------------------------------------------------------------------

/// `[device.hostile]` as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HostileSpec {
    #[serde(default)]
    probe_bytes: Option<u64>,
    #[serde(default)]
    neighbour_window_bytes: Option<u64>,
    #[serde(default)]
    neighbour_every: Option<u64>,
}

/// Validates device `i`'s `[device.hostile]` table (defaults: [`d::HOSTILE_PROBE_BYTES`],
/// [`d::HOSTILE_NEIGHBOUR_WINDOW_BYTES`], [`d::HOSTILE_NEIGHBOUR_EVERY`]).
fn hostile(
    doc: &TomlDoc<'_>,
    i: usize,
    s: &HostileSpec,
) -> Result<crate::devices::hostile::HostileParams, InputError> {
    let t = Fields::new(doc, format!("device[{i}].hostile"));
    Ok(crate::devices::hostile::HostileParams {
        probe_bytes: t.int(
            "probe_bytes",
            s.probe_bytes.unwrap_or(d::HOSTILE_PROBE_BYTES.0),
            1..=1 << 20,
            "bytes",
        )?,
        neighbour_window: t.int(
            "neighbour_window_bytes",
            s.neighbour_window_bytes
                .unwrap_or(d::HOSTILE_NEIGHBOUR_WINDOW_BYTES.0),
            1..=16 << 20,
            "bytes",
        )?,
        neighbour_every: t.int(
            "neighbour_every",
            s.neighbour_every.unwrap_or(d::HOSTILE_NEIGHBOUR_EVERY.0),
            1..=1_000_000,
            "(probe around every n-th buffer mapped)",
        )?,
    })
}

/// Refuses `[device.hostile]` outside fio: only fio's block path runs the probes.
fn hostile_needs_fio(doc: &TomlDoc<'_>, s: &LabScenario) -> Result<(), InputError> {
    if let (Devices::Nvme(devs), false) = (&s.devices, matches!(s.workload, Workload::Fio(_))) {
        if let Some(i) = devs.iter().position(|d| d.hostile.is_some()) {
            return Err(doc.field_error(
                &format!("device[{i}].hostile"),
                format!(
                    "applies to fio workloads only (the probes run on fio's block path), not {}",
                    s.workload.kind()
                ),
            ));
        }
    }
    Ok(())
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
    let dma_mask_bits = dev.int(
        "dma_mask_bits",
        s.dma_mask_bits.unwrap_or(d::SCSI_DMA_MASK_BITS.0),
        32..=64,
        "bits",
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
        dma_mask_bits,
    })
}

fn reaim(
    doc: &TomlDoc<'_>,
    s: &ReaimSpec,
    k: &KernelSpec,
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
        None => {
            let name = s.workfile.as_deref().unwrap_or("lab_mix");
            let Some((_, list)) = d::REAIM_WORKFILES.iter().find(|(n, _)| *n == name) else {
                let names: Vec<&str> = d::REAIM_WORKFILES.iter().map(|(n, _)| *n).collect();
                return Err(doc.field_error(
                    "workload.workfile",
                    format!(
                        "unknown workfile \"{name}\": without [[workload.task]] tables {}",
                        one_of(&names)
                    ),
                ));
            };
            list.iter()
                .map(|&(name, weight, user, sys, bytes, _)| Task {
                    name: name.to_owned(),
                    weight,
                    user_ns: user * 1e3 / ghz,
                    sys_ns: sys * 1e3 / ghz,
                    sync_write_bytes: bytes,
                })
                .collect()
        }
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
    let page = k.page_size.unwrap_or(d::REAIM_PAGE.0);
    if !page.is_power_of_two() || !(4096..=65536).contains(&page) {
        return Err(doc.field_error(
            "kernel.page_size",
            format!("expected a power of two in 4096..=65536 bytes, got {page}"),
        ));
    }
    let fs_block = s.fs_block.unwrap_or(d::REAIM_FS_BLOCK.0);
    if !(512..=page).contains(&fs_block) || !fs_block.is_power_of_two() {
        return Err(doc.field_error(
            "workload.fs_block",
            format!(
                "expected a power of two from 512 to the page size {page} (kernel.page_size), got {fs_block}"
            ),
        ));
    }
    let user_scale = wl.real(
        "user_scale",
        s.user_scale.unwrap_or(d::REAIM_TASK_SCALE.0),
        0.0..=1e4,
    )?;
    let sys_scale = wl.real(
        "sys_scale",
        s.sys_scale.unwrap_or(d::REAIM_TASK_SCALE.0),
        0.0..=1e4,
    )?;
    // A scaled cost is held to the cap of a written one (1e7 kcycles per run), which bounds
    // the time-slicer's events and so the host time.
    let max_ns = 1e7 * 1e3 / ghz;
    for (field, scale, cost) in [
        (
            "user_scale",
            user_scale,
            workfile.tasks.iter().map(|t| t.user_ns).fold(0.0, f64::max),
        ),
        (
            "sys_scale",
            sys_scale,
            workfile.tasks.iter().map(|t| t.sys_ns).fold(0.0, f64::max),
        ),
    ] {
        if cost * scale > max_ns {
            return Err(doc.field_error(
                &wl.path(field),
                format!(
                    "{scale} makes a task cost more than 1e7 kcycles per run (the cap of user_kcycles and sys_kcycles)"
                ),
            ));
        }
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
        page,
        scale: (user_scale, sys_scale),
    })
}

/// Physical address where I/O buffers and the page cache start: above the first 4 GiB, where
/// the 32-bit windows of the SBA and POWER live (assumption of docs/model/sba-vmerge.md: no
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
