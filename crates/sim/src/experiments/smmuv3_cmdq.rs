//! SEEDS.md experiment `smmuv3-cmdq`: the SMMUv3 command-queue rework of 2019 on HiSilicon
//! D05/D06, measured with fio 4 KiB random reads on 8 SAS disks and on one NVMe SSD, with
//! the spinlock command queue, the lock-free batched one, and without an IOMMU.
//!
//! Every I/O runs the real DMA path: `dma::Domain` in strict mode over an LPAE table with
//! Linux's IOVA tree behind per-CPU magazines maps the buffer at submission and unmaps it
//! at completion; the unmap's invalidation builds real SMMUv3 commands (one
//! `CMD_TLBI_NH_VA` per page of each gathered range, then a `CMD_SYNC`) and issues them
//! through the functional queue of `iolab_iommu::smmuv3` (spinlock or lock-free producer),
//! which counts the commands written and the PROD writes. The *timing* of the queue is the
//! lab's (`SimCmdq`, in [`crate::cmdq`]): the SMMU consumes commands at the profile's
//! rate, a sync completes when the consumer passes it plus the sync latency; the spinlock
//! design holds one engine spinlock while writing and while waiting for the sync; the
//! lock-free design reserves slots with compare-and-swap on a shared word
//! ([`CasWord`](crate::cmdq::CasWord)), gathers the commands and syncs of CPUs that reserve
//! while an owner's window is open (up to `batch_max` commands, one PROD write for the
//! batch), and waits for each CPU's sync without a lock.
//!
//! Published figures are constants here, used only for the report and the effects. See
//! docs/model/smmuv3-cmdq.md.

use std::cell::{Cell, RefCell};
use std::fmt::Write as _;
use std::rc::Rc;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use iolab_iommu::addr::{Iova, PhysAddr, SZ_4K};
use iolab_iommu::dma::{Device, DmaMapping, Domain, DomainConfig, DomainId, DomainMode, PhysRange};
use iolab_iommu::hw::{split_queue_work, Smmuv3DevicePath};
use iolab_iommu::iova::linux::{IovaSpaceConfig, LinuxIovaAllocator};
use iolab_iommu::iova::magazine::{MagazineCache, MagazineConfig};
use iolab_iommu::pgtable::lpae::LpaeConfig;
use iolab_iommu::smmuv3::{CmdqConfig, ProducerKind, Smmuv3Config};
use iolab_iommu::work::{LockId, WorkRecord};

use super::ExperimentError;
use crate::accounting::{Account, RunReport};
use crate::cmdq::{CmdqStats, Mode, SimCmdq, SyncWait};
use crate::cost::{CpuCostModel, PlatformProfile};
use crate::devices::nvme::{InterruptCoalescing, Nvme, NvmeParams, Post};
use crate::devices::sas::{SasHba, SasParams};
use crate::devices::{BlockDev, DeviceDma};
use crate::engine::{Channel, Ctx, Handle, Sim, SimConfig, SimDuration, SimTime};
use crate::experiment::{Calibrated, Effect, ExperimentOptions, ExperimentReport, Figure, Role};
use crate::lab::spec::BlockKernel;
use crate::metrics::{CpuBreakdown, Measurement, Metric};
use crate::tomlfile::{InputError, TomlDoc};
use crate::workloads::fio::{
    self, BlockTarget, FioJob, FioJson, GroupStats, IoRequest, JobJson, RwPattern, SharedStats,
};

/// The experiment's name.
pub const NAME: &str = "smmuv3-cmdq";

/// The bundled scenario.
pub const BUNDLED_SCENARIO: &str = include_str!("../../../../scenarios/smmuv3-cmdq.toml");

/// Published IOPS (SEEDS.md #2, John Garry's 2019 test of the lock-free queue): row id,
/// spinlock, lock-free, no IOMMU. Yardsticks only.
const PUBLISHED: [(&str, f64, f64, Option<f64>); 3] = [
    ("d05_sas8", 839_000.0, 835_000.0, Some(918_000.0)),
    ("d05_nvme", 454_000.0, 472_000.0, None),
    ("d06_nvme", 442_000.0, 459_000.0, None),
];

fn published(row: &str, mode: Mode) -> Option<f64> {
    let p = PUBLISHED.iter().find(|p| p.0 == row)?;
    match mode {
        Mode::Spinlock => Some(p.1),
        Mode::LockFree => Some(p.2),
        Mode::Off => p.3,
    }
}

// ---------------------------------------------------------------------------------------
// Scenario
// ---------------------------------------------------------------------------------------

/// A physical parameter with its source.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Param {
    value: f64,
    source: String,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Scenario {
    #[allow(dead_code)]
    experiment: String,
    calibrated_from: String,
    #[serde(default)]
    description: Option<String>,
    kernel: KernelScen,
    cmdq: CmdqScen,
    nvme: NvmeScen,
    sas: SasScen,
    /// `[[calibration]]`: the SMMU timings fitted against the calibrated row.
    #[serde(default)]
    calibration: Vec<CalibrationScen>,
    rows: Vec<RowScen>,
}

/// The one SMMU timing the scenario fits against its `calibrated_from` row, overriding
/// the platform profile's value on the listed platforms only.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CalibrationScen {
    /// The profile cost path it replaces (see [`CalibratedCost`]).
    parameter: String,
    /// Bundled platform profiles the fitted value applies to.
    platforms: Vec<String>,
    /// The fitted value, ns.
    value: f64,
    /// How it was fitted (the procedure and the figure).
    source: String,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct KernelScen {
    fio_user_per_io_ns: Param,
    block_submit_ns: Param,
    block_complete_ns: Param,
    irq_entry_ns: Param,
    nvme_submit_ns: Param,
    nvme_complete_ns: Param,
    sas_submit_ns: Param,
    sas_complete_ns: Param,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CmdqScen {
    queue_log2size: Param,
    batch_max: Param,
    /// 1: CMD_SYNC completion signalled by an MSI write into the sync (polled in memory);
    /// 0: no MSI, the CPU polls the SMMU's CONS register with MMIO reads.
    sync_msi: Param,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NvmeScen {
    io_queues: Param,
    max_iops: Param,
    bandwidth_gb_per_s: Param,
    read_latency_us: Param,
    write_latency_us: Param,
    /// Interrupt Coalescing (feature 08h) aggregation threshold, 0's based (absent: one
    /// interrupt per completion).
    #[serde(default)]
    coalesce_threshold: Option<Param>,
    /// Interrupt Coalescing aggregation time, 100 us units.
    #[serde(default)]
    coalesce_time_100us: Option<Param>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct SasScen {
    disks: Param,
    completion_queues: Param,
    hba_command_ns: Param,
    disk_read_latency_us: Param,
    disk_write_latency_us: Param,
    disk_max_iops: Param,
    link_gb_per_s: Param,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RowScen {
    id: String,
    label: String,
    platform: String,
    device: String,
    cpus: usize,
    modes: Vec<String>,
    /// Overrides `cmdq.sync_msi` for this row's SMMU (0 or 1), with its source.
    #[serde(default)]
    sync_msi: Option<Param>,
    fio: FioScen,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FioScen {
    rw: String,
    #[serde(default = "default_mix")]
    rwmixread: u32,
    #[serde(deserialize_with = "crate::size::bytes")]
    bs: u64,
    iodepth: u32,
    numjobs: u32,
    #[serde(default = "one")]
    iodepth_batch_submit: u32,
    #[serde(default = "one")]
    iodepth_batch_complete_min: u32,
    first_cpu: usize,
    runtime_ms: u64,
    ramp_ms: u64,
    size_gib: u64,
    source: String,
}

fn default_mix() -> u32 {
    50
}
fn one() -> u32 {
    1
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum DeviceKind {
    Nvme,
    Sas,
}

/// Validated kernel costs, ns.
#[derive(Clone, Copy, Debug)]
struct Kernel {
    fio_user: u64,
    block_submit: u64,
    block_complete: u64,
    irq_entry: u64,
    nvme_submit: u64,
    nvme_complete: u64,
    sas_submit: u64,
    sas_complete: u64,
}

impl Kernel {
    /// The per-I/O costs of the block path with `device`'s driver.
    fn block(&self, device: DeviceKind) -> BlockKernel {
        let (driver_submit_ns, driver_complete_ns) = match device {
            DeviceKind::Nvme => (self.nvme_submit, self.nvme_complete),
            DeviceKind::Sas => (self.sas_submit, self.sas_complete),
        };
        BlockKernel {
            block_submit_ns: self.block_submit,
            block_complete_ns: self.block_complete,
            irq_entry_ns: self.irq_entry,
            driver_submit_ns,
            driver_complete_ns,
        }
    }
}

/// A platform-profile command-queue timing the scenario may calibrate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CalibratedCost {
    /// `iommu.cmdq.sync_latency`: a CMD_SYNC's completion after the commands before it.
    SyncLatency,
    /// `iommu.cmdq.command_consume`: the SMMU's time per consumed command.
    CommandConsume,
    /// `mmio.read`: a non-posted register read; in this experiment the only MMIO read is
    /// the CPU's poll of the SMMU's CONS register while it waits for a CMD_SYNC.
    MmioRead,
    /// `iommu.walk_read`: one memory read by the SMMU's table walker, on an IOTLB miss of
    /// the device's DMA.
    WalkRead,
}

impl CalibratedCost {
    /// The profile cost path this replaces.
    pub fn path(self) -> &'static str {
        match self {
            CalibratedCost::SyncLatency => "iommu.cmdq.sync_latency",
            CalibratedCost::CommandConsume => "iommu.cmdq.command_consume",
            CalibratedCost::MmioRead => "mmio.read",
            CalibratedCost::WalkRead => "iommu.walk_read",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        [
            CalibratedCost::SyncLatency,
            CalibratedCost::CommandConsume,
            CalibratedCost::MmioRead,
            CalibratedCost::WalkRead,
        ]
        .into_iter()
        .find(|c| c.path() == s)
    }
}

/// The validated calibration: which cost, on which platforms, at what value (ns).
#[derive(Clone, Debug, PartialEq)]
struct Calibration {
    cost: CalibratedCost,
    platforms: Vec<String>,
    value_ns: f64,
}

struct Row {
    id: String,
    label: String,
    platform: String,
    profile: PlatformProfile,
    /// The calibrated SMMU costs that apply to this row's platform.
    cmdq_override: Vec<(CalibratedCost, u64)>,
    device: DeviceKind,
    cpus: usize,
    modes: Vec<Mode>,
    /// Whether this row's SMMU signals CMD_SYNC completion with an MSI.
    sync_msi: bool,
    job: FioJob,
}

struct Validated {
    calibrated_from: String,
    calibration: Vec<Calibration>,
    kernel: Kernel,
    queue_log2size: u32,
    batch_max: u32,
    nvme: NvmeParams,
    coalescing: InterruptCoalescing,
    sas: SasParams,
    rows: Vec<Row>,
}

fn check(doc: &TomlDoc<'_>, path: &str, p: &Param, lo: f64, hi: f64) -> Result<f64, InputError> {
    if !p.value.is_finite() || p.value < lo || p.value > hi {
        return Err(doc.field_error(
            &format!("{path}.value"),
            format!("expected a number in {lo}..={hi}, got {}", p.value),
        ));
    }
    if p.source.trim().is_empty() {
        return Err(doc.field_error(
            &format!("{path}.source"),
            "expected a citation or an `assumption: ...`",
        ));
    }
    Ok(p.value)
}

/// Most rows (machine and job configurations) one scenario may have.
pub const MAX_ROWS: usize = 64;
/// Most command-queue modes one row may list (there are three).
pub const MAX_MODES_PER_ROW: usize = 3;

/// A 0/1 `sync_msi` parameter at `path`.
fn msi_flag(doc: &TomlDoc<'_>, path: &str, p: &Param) -> Result<bool, InputError> {
    let msi = check(doc, path, p, 0.0, 1.0)?;
    if msi == 0.0 {
        Ok(false)
    } else if msi == 1.0 {
        Ok(true)
    } else {
        Err(doc.field_error(
            &format!("{path}.value"),
            "expected 0 (poll the CONS register) or 1 (MSI completion)",
        ))
    }
}

fn validate(text: &str, origin: &str) -> Result<Validated, ExperimentError> {
    let doc = TomlDoc::parse(text, origin)?;
    let s: Scenario = doc.deserialize()?;
    if s.experiment != NAME {
        return Err(doc
            .field_error("experiment", format!("expected \"{NAME}\""))
            .into());
    }
    let _ = &s.description;
    let k = &s.kernel;
    let ns = |path: &str, p: &Param| -> Result<u64, InputError> {
        Ok(check(&doc, &format!("kernel.{path}"), p, 0.0, 1e6)?.round() as u64)
    };
    let kernel = Kernel {
        fio_user: ns("fio_user_per_io_ns", &k.fio_user_per_io_ns)?,
        block_submit: ns("block_submit_ns", &k.block_submit_ns)?,
        block_complete: ns("block_complete_ns", &k.block_complete_ns)?,
        irq_entry: ns("irq_entry_ns", &k.irq_entry_ns)?,
        nvme_submit: ns("nvme_submit_ns", &k.nvme_submit_ns)?,
        nvme_complete: ns("nvme_complete_ns", &k.nvme_complete_ns)?,
        sas_submit: ns("sas_submit_ns", &k.sas_submit_ns)?,
        sas_complete: ns("sas_complete_ns", &k.sas_complete_ns)?,
    };
    let queue_log2size = check(
        &doc,
        "cmdq.queue_log2size",
        &s.cmdq.queue_log2size,
        4.0,
        16.0,
    )? as u32;
    let batch_max = check(&doc, "cmdq.batch_max", &s.cmdq.batch_max, 2.0, 1024.0)? as u32;
    if batch_max as u64 >= 1u64 << queue_log2size {
        return Err(doc
            .field_error(
                "cmdq.batch_max.value",
                "expected fewer commands per batch than queue slots",
            )
            .into());
    }
    let sync_msi = msi_flag(&doc, "cmdq.sync_msi", &s.cmdq.sync_msi)?;
    let n = &s.nvme;
    let nvme = NvmeParams {
        io_queues: check(&doc, "nvme.io_queues", &n.io_queues, 1.0, 65535.0)? as usize,
        max_iops: check(&doc, "nvme.max_iops", &n.max_iops, 1.0, 1e8)?,
        bandwidth: check(
            &doc,
            "nvme.bandwidth_gb_per_s",
            &n.bandwidth_gb_per_s,
            0.001,
            1000.0,
        )? * 1e9,
        read_latency_ns: (check(&doc, "nvme.read_latency_us", &n.read_latency_us, 0.0, 1e6)? * 1e3)
            as u64,
        write_latency_ns: (check(&doc, "nvme.write_latency_us", &n.write_latency_us, 0.0, 1e6)?
            * 1e3) as u64,
    };
    let coalescing = match (&n.coalesce_threshold, &n.coalesce_time_100us) {
        (None, None) => InterruptCoalescing::default(),
        (Some(t), Some(x)) => InterruptCoalescing {
            threshold: check(&doc, "nvme.coalesce_threshold", t, 0.0, 255.0)? as u8,
            time_100us: check(&doc, "nvme.coalesce_time_100us", x, 0.0, 255.0)? as u8,
        },
        (Some(_), None) => {
            return Err(doc
                .field_error(
                    "nvme.coalesce_time_100us",
                    "expected it together with nvme.coalesce_threshold",
                )
                .into())
        }
        (None, Some(_)) => {
            return Err(doc
                .field_error(
                    "nvme.coalesce_threshold",
                    "expected it together with nvme.coalesce_time_100us",
                )
                .into())
        }
    };
    let a = &s.sas;
    let sas = SasParams {
        disks: check(&doc, "sas.disks", &a.disks, 1.0, 1024.0)? as usize,
        completion_queues: check(
            &doc,
            "sas.completion_queues",
            &a.completion_queues,
            1.0,
            1024.0,
        )? as usize,
        hba_command_ns: check(&doc, "sas.hba_command_ns", &a.hba_command_ns, 0.0, 1e6)?,
        disk_read_latency_ns: (check(
            &doc,
            "sas.disk_read_latency_us",
            &a.disk_read_latency_us,
            0.0,
            1e6,
        )? * 1e3) as u64,
        disk_write_latency_ns: (check(
            &doc,
            "sas.disk_write_latency_us",
            &a.disk_write_latency_us,
            0.0,
            1e6,
        )? * 1e3) as u64,
        disk_max_iops: check(&doc, "sas.disk_max_iops", &a.disk_max_iops, 1.0, 1e8)?,
        link_bandwidth: check(&doc, "sas.link_gb_per_s", &a.link_gb_per_s, 0.001, 1000.0)? * 1e9,
    };
    if s.rows.is_empty() || s.rows.len() > MAX_ROWS {
        return Err(doc
            .field_error("rows", format!("expected 1 to {MAX_ROWS} rows"))
            .into());
    }
    let mut calibration: Vec<Calibration> = Vec::new();
    for (i, c) in s.calibration.iter().enumerate() {
        let at = |f: &str| format!("calibration[{i}].{f}");
        let cost = CalibratedCost::parse(&c.parameter).ok_or_else(|| {
            doc.field_error(
                &at("parameter"),
                "expected \"iommu.cmdq.sync_latency\", \"iommu.cmdq.command_consume\", \
                 \"mmio.read\" or \"iommu.walk_read\"",
            )
        })?;
        if calibration.iter().any(|k| k.cost == cost) {
            return Err(doc
                .field_error(&at("parameter"), "expected each parameter calibrated once")
                .into());
        }
        if !c.value.is_finite() || c.value < 0.0 || c.value > 1e6 {
            return Err(doc
                .field_error(&at("value"), "expected 0..=1000000 ns")
                .into());
        }
        if c.source.trim().is_empty() {
            return Err(doc.field_error(&at("source"), "expected a source").into());
        }
        let names = PlatformProfile::bundled_names();
        if c.platforms.is_empty() {
            return Err(doc
                .field_error(&at("platforms"), "expected at least one platform")
                .into());
        }
        for p in &c.platforms {
            if !names.iter().any(|n| n == p) {
                return Err(doc
                    .field_error(
                        &at("platforms"),
                        format!("expected platforms among {}", names.join(", ")),
                    )
                    .into());
            }
        }
        calibration.push(Calibration {
            cost,
            platforms: c.platforms.clone(),
            value_ns: c.value,
        });
    }
    let mut rows = Vec::new();
    for (i, r) in s.rows.iter().enumerate() {
        let at = |f: &str| format!("rows[{i}].{f}");
        let profile = PlatformProfile::bundled(&r.platform).map_err(|_| {
            doc.field_error(
                &at("platform"),
                format!(
                    "expected one of {}",
                    PlatformProfile::bundled_names().join(", ")
                ),
            )
        })?;
        profile.require_cmdq()?;
        let device = match r.device.as_str() {
            "nvme" => DeviceKind::Nvme,
            "sas" => DeviceKind::Sas,
            _ => {
                return Err(doc
                    .field_error(&at("device"), "expected \"nvme\" or \"sas\"")
                    .into())
            }
        };
        if r.cpus == 0 || r.cpus > 1024 {
            return Err(doc.field_error(&at("cpus"), "expected 1..=1024").into());
        }
        if r.modes.is_empty() || r.modes.len() > MAX_MODES_PER_ROW {
            return Err(doc
                .field_error(
                    &at("modes"),
                    format!("expected 1 to {MAX_MODES_PER_ROW} modes"),
                )
                .into());
        }
        let mut modes = Vec::new();
        for m in &r.modes {
            modes.push(Mode::parse(m).ok_or_else(|| {
                doc.field_error(
                    &at("modes"),
                    "expected \"spinlock\", \"lockfree\" or \"off\" (alias \"none\")",
                )
            })?);
        }
        let f = &r.fio;
        let rw = RwPattern::parse(&f.rw).ok_or_else(|| {
            doc.field_error(
                &at("fio.rw"),
                "expected read, write, randread, randwrite or randrw",
            )
        })?;
        if f.rwmixread > 100 {
            return Err(doc
                .field_error(&at("fio.rwmixread"), "expected 0..=100")
                .into());
        }
        if f.bs == 0 || f.bs % 512 != 0 || f.bs > 1 << 20 {
            return Err(doc
                .field_error(&at("fio.bs"), "expected a multiple of 512 up to 1 MiB")
                .into());
        }
        if f.bs > SZ_4K {
            return Err(doc
                .field_error(
                    &at("fio.bs"),
                    "this experiment models I/Os of at most 4 KiB",
                )
                .into());
        }
        if f.iodepth == 0 || f.iodepth > 4096 {
            return Err(doc
                .field_error(&at("fio.iodepth"), "expected 1..=4096")
                .into());
        }
        if f.numjobs == 0 || f.numjobs as usize > r.cpus {
            return Err(doc
                .field_error(&at("fio.numjobs"), format!("expected 1..={}", r.cpus))
                .into());
        }
        if f.first_cpu + f.numjobs as usize > r.cpus {
            return Err(doc
                .field_error(&at("fio.first_cpu"), "jobs must fit on the machine's CPUs")
                .into());
        }
        if f.runtime_ms == 0 || f.runtime_ms > 10_000 || f.ramp_ms > 10_000 {
            return Err(doc
                .field_error(
                    &at("fio.runtime_ms"),
                    "expected 1..=10000 (ramp_ms 0..=10000)",
                )
                .into());
        }
        if f.size_gib == 0 || f.size_gib > 1 << 20 {
            return Err(doc
                .field_error(&at("fio.size_gib"), "expected 1..=1048576")
                .into());
        }
        if f.source.trim().is_empty() {
            return Err(doc
                .field_error(&at("fio.source"), "expected a source")
                .into());
        }
        if device == DeviceKind::Sas && sas.completion_queues > r.cpus {
            return Err(doc
                .field_error(
                    "sas.completion_queues.value",
                    "expected no more completion queues than CPUs",
                )
                .into());
        }
        let job = FioJob {
            name: r.id.clone(),
            rw,
            rwmixread: f.rwmixread,
            bs: f.bs,
            iodepth: f.iodepth,
            batch_submit: f.iodepth_batch_submit.clamp(1, f.iodepth),
            batch_complete_min: f.iodepth_batch_complete_min.clamp(1, f.iodepth),
            numjobs: f.numjobs,
            size: f.size_gib << 30,
            runtime: SimDuration::ms(f.runtime_ms),
            ramp: SimDuration::ms(f.ramp_ms),
            cpus: (f.first_cpu..f.first_cpu + f.numjobs as usize).collect(),
            user_ns_per_io: kernel.fio_user,
            syscall_ns: profile.cpu.syscall.ns().round() as u64,
        };
        let row_msi = match &r.sync_msi {
            Some(p) => msi_flag(&doc, &at("sync_msi"), p)?,
            None => sync_msi,
        };
        rows.push(Row {
            id: r.id.clone(),
            label: r.label.clone(),
            platform: r.platform.clone(),
            profile,
            cmdq_override: calibration
                .iter()
                .filter(|c| c.platforms.contains(&r.platform))
                .map(|c| (c.cost, c.value_ns.round() as u64))
                .collect(),
            device,
            cpus: r.cpus,
            modes,
            sync_msi: row_msi,
            job,
        });
    }
    // The calibrated row: its baseline configurations (no IOMMU and the pre-2019 queue),
    // those of `off` and `spinlock` it lists, are the calibration figures.
    if !rows.iter().any(|r| r.id == s.calibrated_from) {
        let known: Vec<&str> = rows.iter().map(|r| r.id.as_str()).collect();
        return Err(doc
            .field_error(
                "calibrated_from",
                format!("expected the id of a row: {}", known.join(", ")),
            )
            .into());
    }
    Ok(Validated {
        calibrated_from: s.calibrated_from,
        calibration,
        kernel,
        queue_log2size,
        batch_max,
        nvme,
        coalescing,
        sas,
        rows,
    })
}

/// `q` with the profile timings the scenario calibrates on its row's platform replaced by
/// the calibrated values (ns).
fn calibrated(mut q: SimCmdq, over: &[(CalibratedCost, u64)]) -> SimCmdq {
    for &(cost, ns) in over {
        q = match cost {
            CalibratedCost::SyncLatency => q.with_sync_latency(ns),
            CalibratedCost::CommandConsume => q.with_command_consume(ns),
            CalibratedCost::MmioRead => q.with_mmio_read(ns),
            // A device-side timing: applied by the stack to the device's translation.
            CalibratedCost::WalkRead => q,
        };
    }
    q
}

// ---------------------------------------------------------------------------------------
// The storage stack below the system call
// ---------------------------------------------------------------------------------------

struct InFlight {
    req: IoRequest,
    mapping: DmaMapping,
}

/// Counters of the DMA path.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct DmaStats {
    /// Maps.
    pub maps: u64,
    /// Unmaps.
    pub unmaps: u64,
    /// CPU ns charged to maps (work records through the profile).
    pub map_ns: f64,
    /// CPU ns charged to unmaps before the command queue.
    pub unmap_ns: f64,
    /// IOVA magazine hits.
    pub magazine_hits: u64,
    /// IOVA magazine misses.
    pub magazine_misses: u64,
    /// Translation time added to device transfers, ns in total.
    pub translation_ns: f64,
    /// Device-side page translations that hit the SMMU's IOTLB.
    pub iotlb_hits: u64,
    /// Device-side page translations that missed it and walked.
    pub iotlb_misses: u64,
    /// Table reads those walks made (after the walk cache).
    pub walk_reads: u64,
}

struct Stack {
    mode: Mode,
    domain: Arc<Domain>,
    /// The SMMU the device's DMA goes through (`None` without an IOMMU).
    smmu: Option<Smmuv3DevicePath>,
    cmdq: Option<SimCmdq>,
    cost: CpuCostModel,
    /// Calibrated walk-read latency minus the profile's, ns per table read (0 unless the
    /// scenario calibrates `iommu.walk_read` on this row's platform).
    walk_read_delta_ns: f64,
    dev: BlockDev,
    device: Device,
    vectors: Vec<Channel<InFlight>>,
    /// NVMe completions posted but held by interrupt coalescing, per vector.
    held: Vec<RefCell<Vec<InFlight>>>,
    /// Interrupts the device raised.
    interrupts: Cell<u64>,
    /// Interrupt handler runs (one handler entry each).
    handler_runs: Cell<u64>,
    vector_cpu: Vec<usize>,
    k: BlockKernel,
    mmio_write_ns: u64,
    iodepth: u64,
    stats: RefCell<DmaStats>,
    error: RefCell<Option<String>>,
    /// The physical ranges of the last device translation (reused, not kept).
    ranges: RefCell<Vec<PhysRange>>,
    h: Handle,
}

const BUF_BASE: u64 = 0x10_0000_0000;

impl Stack {
    fn lock_ns(&self, w: &WorkRecord) -> f64 {
        // Linux's io-pgtable-arm takes no lock (it uses cmpxchg); the lab's page-table
        // lock protects the functional model only and is not charged.
        self.cost
            .locks_uncontended_ns_except(w, Some(LockId::PageTable))
    }

    fn fail(&self, e: String) -> String {
        let mut slot = self.error.borrow_mut();
        slot.get_or_insert(e).clone()
    }

    /// The device's DMA through the SMMU (its IOTLB and walk cache, into the stack's reused
    /// range buffer) or, without an IOMMU, the direct domain.
    fn device_dma(&self) -> DeviceDma<'_> {
        DeviceDma {
            x86: None,
            smmu: self.smmu.as_ref(),
            path: &*self.domain,
            device: &self.device,
            ranges: &self.ranges,
        }
    }

    async fn do_submit(self: &Rc<Self>, ctx: &Ctx, req: IoRequest) -> Result<(), String> {
        let cpu = ctx.cpu().id();
        ctx.cpu()
            .spend(SimDuration::ns(self.k.block_submit_ns), Account::System)
            .await;
        let pa = BUF_BASE + ((req.job as u64) * self.iodepth + u64::from(req.slot)) * SZ_4K;
        let io = req.block_io();
        // The work record is scoped to this block so that it is not kept in the future
        // across the await below (a record is about 400 bytes: zeroing it in the task's
        // future, cold by then, costs more than on the stack).
        let (mapping, map_ns) = {
            let mut w = WorkRecord::new();
            let mapping = self
                .domain
                .map_page(
                    &self.device,
                    PhysAddr::new(pa),
                    io.len,
                    io.direction(),
                    cpu,
                    &mut w,
                )
                .map_err(|e| self.fail(format!("dma map failed: {e}")))?;
            let map_ns = self.cost.cpu_ns(&w) + self.lock_ns(&w);
            let mut s = self.stats.borrow_mut();
            s.maps += 1;
            s.map_ns += map_ns;
            s.magazine_hits += w.magazine_hits;
            s.magazine_misses += w.magazine_misses;
            (mapping, map_ns)
        };
        ctx.cpu()
            .spend_labeled(
                SimDuration::ns(
                    map_ns.round() as u64 + self.k.driver_submit_ns + self.mmio_write_ns,
                ),
                Account::System,
                "dma map + driver submit",
            )
            .await;
        // The device's DMA goes through the IOMMU.
        let mut tw = WorkRecord::new();
        self.device_dma()
            .transfer(mapping.dma_addr(), io.len, io.access(), &mut tw)
            .map_err(|e| self.fail(e))?;
        let tr_ns = (self.cost.translation_ns(&tw)
            + tw.walk_reads as f64 * self.walk_read_delta_ns)
            .max(0.0);
        {
            let mut s = self.stats.borrow_mut();
            s.translation_ns += tr_ns;
            s.iotlb_hits += tw.iotlb_hits;
            s.iotlb_misses += tw.iotlb_misses;
            s.walk_reads += tw.walk_reads;
        }
        let now = ctx.now().as_ns();
        let (at, vector) = self.dev.service(now, cpu, io, tr_ns);
        let vector = vector % self.vectors.len();
        self.h.tracer().device(
            || match self.dev {
                BlockDev::Nvme(_) => format!("nvme q{vector}"),
                BlockDev::Sas(_) => format!("sas cq{vector}"),
            },
            io.name(),
            now,
            at.saturating_sub(now),
            &[("bytes", io.len)],
        );
        let item = InFlight { req, mapping };
        let stack = self.clone();
        self.h
            .call_at(SimTime::from_ns(at), move || {
                stack.post_completion(vector, item)
            })
            .map_err(|e| self.fail(e.to_string()))?;
        Ok(())
    }

    /// The device posts a completion on `vector`: the interrupt is raised now (every held
    /// completion and this one reach the handler), or held by NVMe interrupt coalescing
    /// until the threshold or the aggregation timer.
    fn post_completion(self: &Rc<Self>, vector: usize, item: InFlight) {
        let BlockDev::Nvme(d) = &self.dev else {
            self.interrupt(vector, Some(item));
            return;
        };
        match d.post_completion(vector, self.h.now().as_ns()) {
            Post::Interrupt => self.interrupt(vector, Some(item)),
            Post::Hold => self.held[vector].borrow_mut().push(item),
            Post::ArmTimer { at, token } => {
                self.held[vector].borrow_mut().push(item);
                let stack = self.clone();
                let armed = self.h.spawn_agent(move |actx| async move {
                    actx.sleep_until(SimTime::from_ns(at)).await;
                    if let BlockDev::Nvme(d) = &stack.dev {
                        if d.timer_expired(vector, token) {
                            stack.interrupt(vector, None);
                        }
                    }
                });
                if let Err(e) = armed {
                    self.fail(e.to_string());
                }
            }
        }
    }

    /// Raises `vector`'s interrupt: the held completions, then `item`, go to its handler.
    fn interrupt(&self, vector: usize, item: Option<InFlight>) {
        self.interrupts.set(self.interrupts.get() + 1);
        let chan = &self.vectors[vector];
        {
            let mut held = self.held[vector].borrow_mut();
            for f in held.drain(..) {
                let _ = chan.send(f);
            }
        }
        if let Some(f) = item {
            let _ = chan.send(f);
        }
    }

    /// The interrupt handler (and tasklet) of vector `v`, on its CPU.
    async fn irq_loop(self: Rc<Self>, ctx: Ctx, v: usize) {
        let chan = self.vectors[v].clone();
        let cpu = ctx.cpu().id();
        loop {
            let first = chan.recv(&ctx).await;
            self.handler_runs.set(self.handler_runs.get() + 1);
            ctx.cpu()
                .spend(SimDuration::ns(self.k.irq_entry_ns), Account::System)
                .await;
            let mut next = Some(first);
            while let Some(f) = next {
                // The completion of one I/O (inline rather than an `async fn`: one state
                // machine less to poll through on every wake-up).
                ctx.cpu()
                    .spend(SimDuration::ns(self.k.driver_complete_ns), Account::System)
                    .await;
                // The work record is scoped to this block, so it is not kept in the
                // future across the awaits below (as in `do_submit`).
                let (queue, unmap_ns) = {
                    let mut w = WorkRecord::new();
                    if let Err(e) =
                        self.domain
                            .unmap_page(f.mapping, cpu, ctx.now().as_ns(), &mut w)
                    {
                        self.fail(format!("dma unmap failed: {}", e.error));
                    }
                    // The command queue's work is timed by `SimCmdq`; the rest is the CPU's.
                    let queue = split_queue_work(&mut w);
                    let unmap_ns = self.cost.cpu_ns(&w) + self.lock_ns(&w);
                    let mut s = self.stats.borrow_mut();
                    s.unmaps += 1;
                    s.unmap_ns += unmap_ns;
                    s.magazine_hits += w.magazine_hits;
                    s.magazine_misses += w.magazine_misses;
                    (queue, unmap_ns)
                };
                ctx.cpu()
                    .spend_labeled(
                        SimDuration::ns(unmap_ns.round() as u64),
                        Account::System,
                        "dma unmap",
                    )
                    .await;
                if let (Some(p), Some(q)) = (&self.smmu, &self.cmdq) {
                    q.issue_work(&ctx, &queue).await;
                    if p.invalidation_errors() > 0 {
                        self.fail("Command queue refused a command".to_string());
                    }
                }
                ctx.cpu()
                    .spend(SimDuration::ns(self.k.block_complete_ns), Account::System)
                    .await;
                f.req.complete();
                next = chan.try_recv();
            }
        }
    }
}

/// The [`BlockTarget`] fio jobs submit to.
struct Target(Rc<Stack>);

impl BlockTarget for Target {
    fn submit<'a>(
        &'a self,
        ctx: &'a Ctx,
        req: IoRequest,
    ) -> impl std::future::Future<Output = Result<(), String>> + 'a {
        self.0.do_submit(ctx, req)
    }
}

// ---------------------------------------------------------------------------------------
// Runs
// ---------------------------------------------------------------------------------------

/// The result of one configuration (one cell of the IOPS table), one run.
#[derive(Clone, Debug, Serialize)]
pub struct CellResult {
    /// Row id, e.g. `d05_sas8`.
    pub row: String,
    /// The queue design or no IOMMU.
    pub mode: Mode,
    /// fio's JSON for the group.
    pub fio: JobJson,
    /// Total IOPS (reads and writes).
    pub iops: f64,
    /// CPU busy percent of the interrupt (completion) CPUs: (user, system, spin).
    pub irq_cpu: (f64, f64, f64),
    /// The simulated command queue's counters (zero without an IOMMU).
    pub cmdq: CmdqStats,
    /// The DMA path's counters.
    pub dma: DmaStats,
    /// Spinlock statistics of the command-queue lock: (acquisitions, contended, mean wait ns).
    pub cmdq_lock: (u64, u64, f64),
    /// Interrupts the device raised (whole run).
    pub interrupts: u64,
    /// Interrupt handler runs (whole run; one `irq_entry_ns` each).
    pub handler_runs: u64,
    /// I/Os completed (whole run).
    pub completions: u64,
    /// The configuration as a [`Measurement`]: fio's metrics and latency histogram over the
    /// measured window, the fio CPUs' time, and the queue, translation and interrupt counts.
    pub measurement: Measurement,
    /// The fio text summary.
    #[serde(skip)]
    pub text: String,
}

fn run_cell(
    v: &Validated,
    row: &Row,
    mode: Mode,
    seed: u64,
) -> Result<CellResult, ExperimentError> {
    let mut sim = Sim::new(SimConfig {
        cpus: row.cpus,
        seed,
    })?;
    let h = sim.handle().clone();
    let device = Device::new(1, 64).map_err(|e| ExperimentError::Model(e.to_string()))?;
    let domain_id = DomainId(1);
    let (domain, smmu) = match mode {
        Mode::Off => (
            Arc::new(
                Domain::direct(DomainConfig {
                    cpus: row.cpus,
                    ..DomainConfig::new(domain_id, DomainMode::NoIommu)
                })
                .map_err(|e| ExperimentError::Model(e.to_string()))?,
            ),
            None,
        ),
        Mode::Spinlock | Mode::LockFree => {
            let kind = if mode == Mode::Spinlock {
                ProducerKind::Spinlock
            } else {
                ProducerKind::LockFree
            };
            let tree = LinuxIovaAllocator::new(IovaSpaceConfig::new(SZ_4K, Iova::new(1 << 48)))
                .map_err(|e| ExperimentError::Model(e.to_string()))?;
            let alloc = MagazineCache::new(tree, MagazineConfig::new(row.cpus))
                .map_err(|e| ExperimentError::Model(e.to_string()))?;
            // The SMMU of D05/D06: SMMUv3.0/3.1 without range invalidation, one
            // CMD_TLBI_NH_VA per page; IOTLB and walk cache of gem5's SMMUv3 model (the
            // Hi16xx geometry is not published: docs/model/smmuv3-cmdq.md).
            let smmu = Smmuv3Config {
                streams: device.id() + 1,
                cmdq: CmdqConfig::with_log2size(v.queue_log2size),
                producer: kind,
                range_invalidation: false,
                ..Smmuv3Config::default()
            };
            let path = Smmuv3DevicePath::new(
                smmu,
                1,
                DomainConfig {
                    cpus: row.cpus,
                    ..DomainConfig::new(domain_id, DomainMode::Strict)
                },
                LpaeConfig::new(SZ_4K, 48, 48),
                Arc::new(alloc),
                &device,
            )
            .map_err(|e| ExperimentError::Model(e.to_string()))?;
            (path.domain().clone(), Some(path))
        }
    };
    let cmdq = match mode {
        Mode::Off => None,
        _ => Some(calibrated(
            SimCmdq::new(&h, mode, &row.profile, v.batch_max)?.with_sync_wait(if row.sync_msi {
                SyncWait::Msi
            } else {
                SyncWait::ConsPoll
            }),
            &row.cmdq_override,
        )),
    };
    let (dev, nvec, vector_cpu): (BlockDev, usize, Vec<usize>) = match row.device {
        DeviceKind::Nvme => {
            let queues = v.nvme.io_queues.min(row.cpus);
            let p = NvmeParams {
                io_queues: queues,
                ..v.nvme
            };
            // Queue q's vector is affine to CPU q (managed interrupts, one per queue).
            (
                BlockDev::Nvme(Nvme::new(p).with_coalescing(v.coalescing)),
                queues,
                (0..queues).collect(),
            )
        }
        DeviceKind::Sas => {
            let n = v.sas.completion_queues;
            // Completion queue q's interrupt is handled on CPU q.
            (BlockDev::Sas(SasHba::new(v.sas)), n, (0..n).collect())
        }
    };
    let inflight_cap = (row.job.iodepth as usize) * (row.job.numjobs as usize) + 1;
    let stack = Rc::new(Stack {
        mode,
        domain,
        smmu,
        cmdq,
        cost: row.profile.cpu_cost_model(),
        walk_read_delta_ns: row
            .cmdq_override
            .iter()
            .find(|(c, _)| *c == CalibratedCost::WalkRead)
            .map_or(0.0, |&(_, ns)| ns as f64 - row.profile.iommu.walk_read.ns()),
        dev,
        device,
        vectors: (0..nvec).map(|_| Channel::new(&h, inflight_cap)).collect(),
        held: (0..nvec).map(|_| RefCell::new(Vec::new())).collect(),
        interrupts: Cell::new(0),
        handler_runs: Cell::new(0),
        vector_cpu: vector_cpu.clone(),
        k: v.kernel.block(row.device),
        mmio_write_ns: row.profile.mmio.write.ns().round() as u64,
        iodepth: u64::from(row.job.iodepth),
        stats: RefCell::new(DmaStats::default()),
        error: RefCell::new(None),
        ranges: RefCell::new(Vec::new()),
        h: h.clone(),
    });
    let _ = stack.mode;
    for (vec, &cpu) in stack.vector_cpu.iter().enumerate() {
        let s = stack.clone();
        sim.spawn_on(cpu, move |ctx| s.irq_loop(ctx, vec))?;
    }
    let spec = Rc::new(row.job.clone());
    let stats: SharedStats = Rc::new(RefCell::new(GroupStats::default()));
    let target = Rc::new(Target(stack.clone()));
    for j in 0..spec.numjobs as usize {
        let cpu = spec.cpus[j % spec.cpus.len()];
        let (spec, target, stats) = (spec.clone(), target.clone(), stats.clone());
        sim.spawn_on(cpu, move |ctx| fio::run_job(ctx, spec, j, target, stats))?;
    }
    let t0 = SimTime::ZERO + spec.ramp;
    let t1 = t0 + spec.runtime;
    let before: RunReport = sim.run_until(t0)?;
    let after: RunReport = sim.run_until(t1)?;
    let _ = sim.run()?;
    if let Some(e) = stack
        .error
        .borrow()
        .clone()
        .or(stats.borrow().error.clone())
    {
        return Err(ExperimentError::Model(e));
    }
    let (usr, sys) = fio::cpu_usage(&before, &after, &spec.cpus);
    let g = stats.borrow();
    let json = fio::job_json(&spec, &g, usr, sys);
    let text = fio::summary_text(&spec, &json);
    let irq = irq_cpu_usage(&before, &after, &vector_cpu);
    let cmdq_lock = after
        .spin_lock("cmdq_lock")
        .map(|l| (l.acquisitions, l.contended, l.mean_wait_ns()))
        .unwrap_or_default();
    let dma = *stack.stats.borrow();
    let cmdq = stack.cmdq.as_ref().map(SimCmdq::stats).unwrap_or_default();
    // The protection report: over the SMMU, measured IOTLB hits on removed mappings and the
    // unmap-to-unreachable time; without an IOMMU every access bypasses translation and a
    // freed page stays reachable for the whole run.
    let (protection, max_reachable_ns) = match &stack.smmu {
        Some(path) => {
            let p = path.protection();
            let max = p.max_reachable_after_unmap_ns;
            (p, max)
        }
        None => (stack.domain.protection(), after.end.as_ns()),
    };
    let measurement = crate::metrics::protection_metrics(
        with_counts(
            cell_measurement(row, mode, &spec, &g, (usr, sys), (&before, &after)),
            &dma,
            &cmdq,
            stack.interrupts.get(),
            stack.handler_runs.get(),
        ),
        &protection,
        max_reachable_ns,
    );
    Ok(CellResult {
        row: row.id.clone(),
        mode,
        iops: json.read.iops + json.write.iops,
        fio: json,
        irq_cpu: irq,
        cmdq,
        dma,
        cmdq_lock,
        interrupts: stack.interrupts.get(),
        handler_runs: stack.handler_runs.get(),
        completions: dma.unmaps,
        measurement,
        text,
    })
}

/// The configuration's [`Measurement`] before the whole-run counts: fio's group over the
/// window, the attributes, and the fio CPUs' time in the window.
fn cell_measurement(
    row: &Row,
    mode: Mode,
    spec: &FioJob,
    g: &GroupStats,
    (usr, sys): (f64, f64),
    (before, after): (&RunReport, &RunReport),
) -> Measurement {
    let mut cpu = CpuBreakdown::default();
    for &c in &spec.cpus {
        if let (Some(b), Some(a)) = (before.cpus.get(c), after.cpus.get(c)) {
            let d = CpuBreakdown::between(b, a);
            cpu.user_ns += d.user_ns;
            cpu.system_ns += d.system_ns;
            cpu.spin_ns += d.spin_ns;
            cpu.idle_ns += d.idle_ns;
        }
    }
    fio::measurement(&format!("{}.{}", row.id, mode.id()), spec, g, usr, sys)
        .attr(
            "iommu_mode",
            if mode == Mode::Off { "off" } else { "strict" },
        )
        .attr("cmdq", if mode == Mode::Off { "none" } else { mode.id() })
        .attr(
            "device",
            match row.device {
                DeviceKind::Nvme => "nvme",
                DeviceKind::Sas => "sas",
            },
        )
        .attr("platform", &row.platform)
        .cpu(cpu)
}

/// `m` with the whole-run counts of the interrupt, DMA and command-queue paths as metrics.
fn with_counts(m: Measurement, dma: &DmaStats, q: &CmdqStats, irqs: u64, runs: u64) -> Measurement {
    {
        let per = |x: f64, n: u64| if n > 0 { x / n as f64 } else { 0.0 };
        let ios = dma.unmaps;
        let mut m = m
            .metric(Metric::new(
                "irq.per_io",
                "interrupts/I/O",
                per(irqs as f64, ios),
            ))
            .metric(Metric::new(
                "irq.handler_runs_per_io",
                "runs/I/O",
                per(runs as f64, ios),
            ));
        if q.issues > 0 {
            m = m
                .metric(Metric::new(
                    "iommu.map_ns",
                    "ns/map",
                    per(dma.map_ns, dma.maps),
                ))
                .metric(Metric::new(
                    "iommu.unmap_ns",
                    "ns/unmap",
                    per(dma.unmap_ns, dma.unmaps),
                ))
                .metric(Metric::new(
                    "iommu.translation_ns",
                    "ns/I/O",
                    per(dma.translation_ns, dma.maps),
                ))
                .metric(Metric::new(
                    "iommu.iotlb_hit_pct",
                    "%",
                    per(
                        dma.iotlb_hits as f64 * 100.0,
                        dma.iotlb_hits + dma.iotlb_misses,
                    ),
                ))
                .metric(Metric::new(
                    "cmdq.issues_per_batch",
                    "issues/batch",
                    per(q.issues as f64, q.batches),
                ))
                .metric(Metric::new(
                    "cmdq.sync_wait_ns",
                    "ns/issue",
                    per(q.sync_wait_ns as f64, q.issues),
                ))
                .metric(Metric::new(
                    "cmdq.cas_failure_pct",
                    "%",
                    per(q.cas_failures as f64 * 100.0, q.cas_attempts),
                ));
        }
        m
    }
}

fn irq_cpu_usage(before: &RunReport, after: &RunReport, cpus: &[usize]) -> (f64, f64, f64) {
    let span = after.end.as_ns().saturating_sub(before.end.as_ns()) as f64 * cpus.len() as f64;
    if span <= 0.0 {
        return (0.0, 0.0, 0.0);
    }
    let (mut u, mut s, mut p) = (0u64, 0u64, 0u64);
    for &c in cpus {
        if let (Some(a), Some(b)) = (after.cpus.get(c), before.cpus.get(c)) {
            u += a.user - b.user;
            s += a.system - b.system;
            p += a.spin - b.spin;
        }
    }
    (
        u as f64 / span * 100.0,
        s as f64 / span * 100.0,
        p as f64 / span * 100.0,
    )
}

/// Every cell of a scenario, averaged over runs: the module's structured result.
#[derive(Clone, Debug, Serialize)]
pub struct Results {
    /// One entry per (row, mode), first run's details, IOPS averaged over runs.
    pub cells: Vec<CellResult>,
    /// fio-shaped JSON, one job group per cell (first run).
    pub fio: FioJson,
}

/// Runs every configuration of a scenario and returns the structured results (fio JSON
/// included) without the report.
pub fn run_results(
    text: &str,
    origin: &str,
    options: &ExperimentOptions,
) -> Result<Results, ExperimentError> {
    let v = validate(text, origin)?;
    results_of(&v, options)
}

fn results_of(v: &Validated, options: &ExperimentOptions) -> Result<Results, ExperimentError> {
    let runs = options.runs.max(1);
    let mut cells = Vec::new();
    for (ri, row) in v.rows.iter().enumerate() {
        for (mi, &mode) in row.modes.iter().enumerate() {
            let mut first: Option<CellResult> = None;
            let mut sum = 0.0;
            for r in 0..runs {
                let seed = crate::engine::rng::derive_seed(
                    options.seed,
                    (ri as u64) << 32 | (mi as u64) << 16 | u64::from(r),
                );
                let c = run_cell(v, row, mode, seed)?;
                sum += c.iops;
                if first.is_none() {
                    first = Some(c);
                }
            }
            if let Some(mut c) = first {
                c.iops = sum / f64::from(runs);
                cells.push(c);
            }
        }
    }
    let fio = FioJson {
        jobs: cells
            .iter()
            .map(|c| JobJson {
                jobname: format!("{}.{}", c.row, c.mode.id()),
                ..c.fio.clone()
            })
            .collect(),
    };
    Ok(Results { cells, fio })
}

// ---------------------------------------------------------------------------------------
// Report
// ---------------------------------------------------------------------------------------

fn kiops(x: f64) -> String {
    format!("{:.0}K", x / 1e3)
}

/// Parses and validates a scenario file of this experiment without running it (the
/// step `run_scenario` starts with; fast enough to fuzz).
pub fn validate_scenario(text: &str, origin: &str) -> Result<(), ExperimentError> {
    validate(text, origin).map(drop)
}

/// Runs a scenario file of this experiment.
pub fn run_scenario(
    text: &str,
    origin: &str,
    options: &ExperimentOptions,
) -> Result<ExperimentReport, ExperimentError> {
    let v = validate(text, origin)?;
    let res = results_of(&v, options)?;
    let cell = |row: &str, mode: Mode| res.cells.iter().find(|c| c.row == row && c.mode == mode);

    let mut figures = Vec::new();
    for c in &res.cells {
        let id = format!("{}.{}", c.row, c.mode.id());
        let role = if c.row == v.calibrated_from && matches!(c.mode, Mode::Off | Mode::Spinlock) {
            Role::Calibration
        } else {
            Role::Prediction
        };
        figures.push(Figure {
            id: id.clone(),
            unit: "IOPS".into(),
            published: published(&c.row, c.mode),
            lab: c.iops,
            role,
        });
        figures.push(Figure {
            id: format!("{id}.usr_cpu"),
            unit: "%CPU".into(),
            published: None,
            lab: c.fio.usr_cpu,
            role: Role::Prediction,
        });
        figures.push(Figure {
            id: format!("{id}.sys_cpu"),
            unit: "%CPU".into(),
            published: None,
            lab: c.fio.sys_cpu,
            role: Role::Prediction,
        });
    }
    let mut effects = Vec::new();
    let mut effect = |id: &str, row: &str, a: Mode, b: Mode| {
        if let (Some(x), Some(y), Some(px), Some(py)) = (
            cell(row, a),
            cell(row, b),
            published(row, a),
            published(row, b),
        ) {
            if x.iops > 0.0 {
                effects.push(Effect {
                    id: id.into(),
                    published_pct: (py / px - 1.0) * 100.0,
                    lab_pct: (y.iops / x.iops - 1.0) * 100.0,
                });
            }
        }
    };
    effect(
        "d05_sas8.lockfree_vs_spinlock",
        "d05_sas8",
        Mode::Spinlock,
        Mode::LockFree,
    );
    effect(
        "d05_nvme.lockfree_vs_spinlock",
        "d05_nvme",
        Mode::Spinlock,
        Mode::LockFree,
    );
    effect(
        "d06_nvme.lockfree_vs_spinlock",
        "d06_nvme",
        Mode::Spinlock,
        Mode::LockFree,
    );
    effect(
        "d05_sas8.off_vs_spinlock",
        "d05_sas8",
        Mode::Spinlock,
        Mode::Off,
    );

    let mut t = String::new();
    let _ = writeln!(
        t,
        "fio 4 KiB random read IOPS, lab (published) — SMMUv3 strict mode"
    );
    let _ = writeln!(
        t,
        "| workload | baseline (spinlock cmdq) | lock-free batched cmdq | no IOMMU |"
    );
    let _ = writeln!(t, "|---|---|---|---|");
    for row in &v.rows {
        let mut cells = Vec::new();
        for mode in [Mode::Spinlock, Mode::LockFree, Mode::Off] {
            cells.push(match (cell(&row.id, mode), published(&row.id, mode)) {
                (Some(c), Some(p)) => format!("{} ({})", kiops(c.iops), kiops(p)),
                (Some(c), None) => format!("{} (-)", kiops(c.iops)),
                (None, Some(p)) => format!("- ({})", kiops(p)),
                (None, None) => "-".into(),
            });
        }
        let _ = writeln!(
            t,
            "| {} | {} | {} | {} |",
            row.label, cells[0], cells[1], cells[2]
        );
    }
    let _ = writeln!(t);
    let _ = writeln!(
        t,
        "{:<18} {:>8} {:>7} {:>7} {:>22} {:>9} {:>9} {:>8} {:>9}",
        "config",
        "IOPS",
        "usr%",
        "sys%",
        "irq CPUs usr/sys/spin%",
        "lock ctd%",
        "wait ns",
        "batch",
        "CAS fail%"
    );
    for c in &res.cells {
        let (acq, ctd, wait) = c.cmdq_lock;
        let batch = if c.cmdq.batches > 0 {
            c.cmdq.issues as f64 / c.cmdq.batches as f64
        } else {
            0.0
        };
        let casf = if c.cmdq.cas_attempts > 0 {
            c.cmdq.cas_failures as f64 / c.cmdq.cas_attempts as f64 * 100.0
        } else {
            0.0
        };
        let _ =
            writeln!(
            t,
            "{:<18} {:>8} {:>7.1} {:>7.1} {:>8.1}/{:>5.1}/{:>5.1}% {:>9.1} {:>9.0} {:>8.2} {:>9.1}",
            format!("{}.{}", c.row, c.mode.id()),
            kiops(c.iops),
            c.fio.usr_cpu,
            c.fio.sys_cpu,
            c.irq_cpu.0,
            c.irq_cpu.1,
            c.irq_cpu.2,
            if acq > 0 { ctd as f64 / acq as f64 * 100.0 } else { 0.0 },
            wait,
            batch,
            casf
        );
    }
    let _ = writeln!(t);
    let _ = writeln!(
        t,
        "{:<18} {:>8} {:>9} {:>8} {:>8} {:>8} {:>9} {:>9} {:>10} {:>9} {:>9}",
        "command queue",
        "issues",
        "commands",
        "syncs",
        "PROD bat",
        "gathered",
        "CAS att",
        "CAS fail%",
        "sync wt ns",
        "map ns",
        "unmap ns"
    );
    for c in &res.cells {
        let q = &c.cmdq;
        let per = |x: f64, n: u64| if n > 0 { x / n as f64 } else { 0.0 };
        let _ = writeln!(
            t,
            "{:<18} {:>8} {:>9} {:>8} {:>8} {:>8} {:>9} {:>9.1} {:>10.0} {:>9.0} {:>9.0}",
            format!("{}.{}", c.row, c.mode.id()),
            q.issues,
            q.commands,
            q.syncs,
            q.batches,
            q.gathered,
            q.cas_attempts,
            per(q.cas_failures as f64 * 100.0, q.cas_attempts),
            per(q.sync_wait_ns as f64, q.issues),
            per(c.dma.map_ns, c.dma.maps),
            per(c.dma.unmap_ns, c.dma.unmaps),
        );
    }
    let _ = writeln!(t);
    let _ = writeln!(
        t,
        "{:<18} {:>10} {:>10} {:>12} {:>14} {:>12}",
        "device DMA", "IOTLB hit%", "misses", "walk reads", "ns per I/O", "irqs per I/O"
    );
    for c in &res.cells {
        let d = &c.dma;
        let pages = d.iotlb_hits + d.iotlb_misses;
        let _ = writeln!(
            t,
            "{:<18} {:>10.1} {:>10} {:>12} {:>14.1} {:>12.3}",
            format!("{}.{}", c.row, c.mode.id()),
            if pages > 0 {
                d.iotlb_hits as f64 * 100.0 / pages as f64
            } else {
                0.0
            },
            d.iotlb_misses,
            d.walk_reads,
            if d.maps > 0 {
                d.translation_ns / d.maps as f64
            } else {
                0.0
            },
            if c.completions > 0 {
                c.interrupts as f64 / c.completions as f64
            } else {
                0.0
            },
        );
    }
    let _ = writeln!(t);
    for c in &res.cells {
        let _ = writeln!(t, "[{}.{}]", c.row, c.mode.id());
        t.push_str(&c.text);
    }

    let baseline_off = format!("{}.{}", v.calibrated_from, Mode::Off.id());
    let baseline_spin = format!("{}.{}", v.calibrated_from, Mode::Spinlock.id());
    let mut calibrated = vec![Calibrated {
        parameter: "sas.hba_command_ns".into(),
        value: v.sas.hba_command_ns,
        fitted_to: vec![baseline_off.clone()],
    }];
    for c in &v.calibration {
        calibrated.push(Calibrated {
            parameter: format!("{} ({})", c.cost.path(), c.platforms.join(", ")),
            value: c.value_ns,
            fitted_to: vec![baseline_spin.clone()],
        });
    }
    let notes = vec![
        "fio job parameters (numjobs, iodepth, CPU placement) of the 2019 runs were not found; \
         they are stated assumptions in the scenario."
            .to_string(),
        "Virtual run length is scaled down (tens of ms per configuration) to fit the runtime \
         budget; IOPS are rates over the measured window after a ramp."
            .to_string(),
        "Lock-free CAS model: a contender whose expected value went stale pays one failed \
         cmpxchg (one line transfer) and retries at once on the line it holds, so at most one \
         failure per reservation (hardware at 64 CPUs: ~1 in 12 succeed, RESEARCH.md), i.e. \
         the lab is optimistic about the CAS; no retry storm."
            .to_string(),
        "Queue algorithms as in Linux: spinlock (<= 5.2) takes the lock once per TLBI \
         (arm_smmu_cmdq_issue_cmd) and again for the CMD_SYNC, polling under it; lock-free \
         (5.3 arm_smmu_cmdq_issue_cmdlist) pays the cmpxchg, the shared-lock inc/dec, the \
         valid_map xor, the owner's owner_prod read/set and OWNED clear, and the last sync \
         waiter's write of cons into the prod/cons word; gathering has no batch limit."
            .to_string(),
        "Sync completion: the D05 SMMU (Hi1616) has no MSI (R. Murphy, 2017), so both \
         designs poll the CONS register with MMIO reads (mmio.read each) and see the sync one \
         read after it completes; the D06 SMMU (Hi1620) completes syncs with an MSI (B. Song, \
         2020), so the <= 5.2 queue inserts the sync under the lock (piggy-backing on a \
         preceding CMD_SYNC) and polls memory outside it, and its spinlock is barely \
         contended."
            .to_string(),
        "SAS bound: in the 2019 thread the lock-free series halved the unmap path's CPU \
         samples on the 8-disk D05 run (J. Garry, 2019-07-25) without moving its IOPS, so the \
         array is not bound by the completion CPUs; the lab binds it by the hisi_sas v2 \
         controller (hba_command_ns, fitted to the no-IOMMU figure), whose per-command time \
         includes the SMMU translation stall of the command's DMA (assumption), so both \
         queue designs give the same rate."
            .to_string(),
        format!(
            "Calibration: {baseline_off} and {baseline_spin} (the published row's baseline \
             configurations) are calibration figures, not predictions; \
             {row}.off_vs_spinlock follows from those two fitted figures, so it is no longer a \
             test of the model. Everything else (the lock-free column, both NVMe rows) is a \
             prediction.",
            row = v.calibrated_from
        ),
        "Calibrated SMMU timing: iommu.cmdq.sync_latency on D05 (Hi1616) only, fitted by \
         bisection against the published SAS spinlock baseline (procedure in the scenario and \
         docs/model/smmuv3-cmdq.md): the largest value that brings it as close to 839K as \
         the model allows. The lock's capacity is a staircase in it (CONS is polled with \
         whole 300 ns register reads): up to ~302 ns the row is HBA-bound (~773K, -7.9%), \
         from ~303 ns lock-bound (~635K at 500 ns). D06 keeps the profile's 500 ns."
            .to_string(),
        "NOT REACHED, and why: d05_sas8.spinlock (a calibration figure) is 7.9% low and \
         d05_sas8.off_vs_spinlock is about twice the published +9.4%: the HBA's translation \
         stall is the profile's IOTLB miss plus one 197 ns walk read (an x86 DRAM fit), \
         ~204 ns per command, where the published pair implies ~103 ns; not re-fitted. \
         Both NVMe rows sit at the assumed 770K ES3000-class drive rating (the 2019 drive \
         and fio job were not found) while the published NVMe figures are ~450K and move \
         +4% with the queue, which points to a CPU-side bound the sources do not describe; \
         so the NVMe effects are 0%."
            .to_string(),
        "Device DMA translates through the SMMU model's IOTLB and walk cache (gem5's \
         geometry; the Hi16xx one is not published): a hit costs the profile's IOTLB lookup, \
         a miss its walk-cache lookup plus one page-walk read latency per table read; strict \
         unmaps evict the entry through real CMD_TLBI_NH_VA + CMD_SYNC on the functional queue. \
         Each buffer is translated once when the device moves it."
            .to_string(),
    ];
    Ok(ExperimentReport {
        name: NAME.into(),
        title: "SMMUv3 command queue: spinlock vs lock-free batched vs no IOMMU (fio 4K randread, D05/D06)".into(),
        runs: options.runs.max(1),
        figures,
        effects,
        calibrated,
        report_text: t,
        notes,
        measurements: res.cells.iter().map(|c| c.measurement.clone()).collect(),
    })
}
