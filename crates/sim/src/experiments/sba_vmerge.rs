//! SEEDS.md experiment `sba-vmerge`: block-layer virtual merging on an HP zx1 (SBA IOMMU,
//! LSI 53c1030, one Seagate ST373453LC, ext3), re-aim-7 `new_dbase`, 100 to 500 users.
//!
//! Two kernels: `BIO_VMERGE_BOUNDARY 0` (the block layer counts only physically contiguous
//! pieces as one segment) and `BIO_VMERGE_BOUNDARY = merge mask + 1` (it assumes the SBA will
//! coalesce page-aligned pieces). Each user count is one simulation: `N` re-aim children on
//! the machine's virtual CPUs, their tasks' CPU work time-sliced, their synchronous writes
//! going through the block layer, [`SbaIommu`] `map_sg`/`unmap_sg` and the SCSI host model
//! ([`ScsiHost`]). See docs/model/sba-vmerge.md.

use crate::experiment::Sourced as P;
use crate::metrics::{Measurement, Metric};
use std::fmt::Write as _;
use std::sync::Arc;

use iolab_iommu::dma::{Device, DomainId, ProtectionStats};
use iolab_iommu::hw::{SbaIommu, SbaIommuConfig};
use serde::Deserialize;

use super::ExperimentError;
use crate::block::QueueLimits;
use crate::cost::PlatformProfile;
use crate::devices::scsi::{ScsiHost, ScsiParams, ScsiStats};
use crate::engine::{Sim, SimConfig};
use crate::experiment::{Calibrated, Effect, ExperimentOptions, ExperimentReport, Figure, Role};
use crate::lab::reaim::{run_children, ChildrenRun};
use crate::metrics::exposure_metrics;
use crate::resources::SpinParams;
use crate::tomlfile::TomlDoc;
use crate::workloads::reaim::{self, ChildSetup, FsyncLayout, ReaimRow, Task, Workfile};

/// The experiment's name.
pub const NAME: &str = "sba-vmerge";

/// The bundled scenario.
pub const BUNDLED_SCENARIO: &str = include_str!("../../../../scenarios/sba-vmerge.toml");

/// Published rows (Grant Grundler, linux-kernel, 2003-07-29, "[RFC] block layer support for
/// DMA IOMMU bypass mode II", quoted by Cliff White 2003-08-01): users, parent time, child
/// sys, child user, jobs/min, JTI. Yardsticks only, except the calibration row.
const PUB_NOVMERGE: [(u32, f64, f64, f64, f64, u32); 5] = [
    (100, 110.25, 12.67, 206.35, 5605.19, 96),
    (200, 219.07, 25.56, 411.93, 5642.06, 96),
    (300, 327.59, 38.23, 615.83, 5659.46, 95),
    (400, 436.66, 51.19, 821.30, 5661.19, 95),
    (500, 548.21, 65.76, 1029.15, 5636.54, 95),
];
const PUB_VMERGE: [(u32, f64, f64, f64, f64, u32); 5] = [
    (100, 108.72, 12.47, 203.78, 5684.17, 95),
    (200, 217.64, 25.59, 408.90, 5679.16, 95),
    (300, 326.48, 37.88, 613.62, 5678.81, 95),
    (400, 434.87, 50.53, 817.64, 5684.46, 95),
    (500, 544.69, 65.23, 1022.92, 5672.92, 95),
];

/// The calibration row: the no-vmerge kernel at 100 users.
const CALIBRATION_ROW: &str = "novmerge.users100";

/// Caps on what a scenario may ask for.
const MAX_USERS: u64 = 5000;
const MAX_TASKS: usize = 256;
/// Most user counts one re-aim ramp may have (each is a run per kernel).
pub const MAX_RAMP_POINTS: usize = 64;

// ------------------------------------------------------------------------------------------
// Scenario schema
// ------------------------------------------------------------------------------------------

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Scenario {
    experiment: String,
    platform: String,
    calibrated_from: String,
    machine: Machine,
    iommu: Iommu,
    hba: Hba,
    driver: Driver,
    disk: Disk,
    fs: Fs,
    reaim: Reaim,
    kernels: Kernels,
    calibration: Calibration,
}

/// The declared calibration: the task-cost scale factors, recorded (fitted by
/// [`fit_task_scale`], not at every run).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Calibration {
    user_scale: P,
    sys_scale: P,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Machine {
    cpus: P,
    page_size: P,
    memory_gib: P,
    timeslice_ms: P,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Iommu {
    iova_base: P,
    iova_size_mib: P,
    delayed_frees: P,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Hba {
    bus_mb_per_s: P,
    per_command_us: P,
    per_sge_ns: P,
    sg_tablesize: P,
    max_sectors: P,
    max_segment_kib: P,
    dma_mask_bits: P,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Driver {
    submit_us: P,
    per_sge_ns: P,
    complete_us: P,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Disk {
    capacity_gb: P,
    rpm: P,
    seek_read_ms: P,
    seek_write_ms: P,
    media_mb_per_s: P,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Fs {
    block_size: P,
    journal_blocks_per_commit: P,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Reaim {
    workfile: String,
    start: u64,
    end: u64,
    increment: u64,
    jitter_pct: P,
    task: Vec<TaskSpec>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TaskSpec {
    name: String,
    weight: u32,
    user_us: f64,
    sys_us: f64,
    sync_write_kib: u64,
    source: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Kernels {
    novmerge: Kernel,
    vmerge: Kernel,
}

#[derive(Debug, Deserialize, Clone)]
#[serde(deny_unknown_fields)]
struct Kernel {
    block_virt_merge: bool,
    sba_coalesce: bool,
    source: String,
}

// ------------------------------------------------------------------------------------------
// Validated configuration
// ------------------------------------------------------------------------------------------

#[derive(Clone)]
struct Config {
    cpus: usize,
    page: u64,
    mem_pages: u64,
    slice_ns: u64,
    iova_base: u64,
    iova_size: u64,
    delayed_frees: usize,
    scsi: ScsiParams,
    sg_tablesize: usize,
    max_transfer: u64,
    max_segment: u64,
    mask_bits: u32,
    disk_bytes: u64,
    fs_block: u64,
    journal_blocks: u64,
    users: Vec<u32>,
    jitter: f64,
    workfile: Workfile,
    profile: PlatformProfile,
    /// The recorded task-cost scale factors (user, system).
    scale: (f64, f64),
}

fn check(doc: &TomlDoc<'_>, path: &str, v: f64, lo: f64, hi: f64) -> Result<f64, ExperimentError> {
    if !v.is_finite() || v < lo || v > hi {
        return Err(doc
            .field_error(
                path,
                format!("expected a number from {lo} to {hi}, got {v}"),
            )
            .into());
    }
    Ok(v)
}

fn check_int(
    doc: &TomlDoc<'_>,
    path: &str,
    v: f64,
    lo: f64,
    hi: f64,
) -> Result<u64, ExperimentError> {
    let v = check(doc, path, v, lo, hi)?;
    if v.fract() != 0.0 {
        return Err(doc
            .field_error(path, format!("expected a whole number, got {v}"))
            .into());
    }
    Ok(v as u64)
}

/// Every physical parameter must say where its value comes from.
fn check_sources(doc: &TomlDoc<'_>, s: &Scenario) -> Result<(), ExperimentError> {
    let params: [(&str, &P); 27] = [
        ("machine.cpus", &s.machine.cpus),
        ("machine.page_size", &s.machine.page_size),
        ("machine.memory_gib", &s.machine.memory_gib),
        ("machine.timeslice_ms", &s.machine.timeslice_ms),
        ("iommu.iova_base", &s.iommu.iova_base),
        ("iommu.iova_size_mib", &s.iommu.iova_size_mib),
        ("iommu.delayed_frees", &s.iommu.delayed_frees),
        ("hba.bus_mb_per_s", &s.hba.bus_mb_per_s),
        ("hba.per_command_us", &s.hba.per_command_us),
        ("hba.per_sge_ns", &s.hba.per_sge_ns),
        ("hba.sg_tablesize", &s.hba.sg_tablesize),
        ("hba.max_sectors", &s.hba.max_sectors),
        ("hba.max_segment_kib", &s.hba.max_segment_kib),
        ("hba.dma_mask_bits", &s.hba.dma_mask_bits),
        ("driver.submit_us", &s.driver.submit_us),
        ("driver.per_sge_ns", &s.driver.per_sge_ns),
        ("driver.complete_us", &s.driver.complete_us),
        ("disk.capacity_gb", &s.disk.capacity_gb),
        ("disk.rpm", &s.disk.rpm),
        ("disk.seek_read_ms", &s.disk.seek_read_ms),
        ("disk.seek_write_ms", &s.disk.seek_write_ms),
        ("disk.media_mb_per_s", &s.disk.media_mb_per_s),
        ("fs.block_size", &s.fs.block_size),
        (
            "fs.journal_blocks_per_commit",
            &s.fs.journal_blocks_per_commit,
        ),
        ("reaim.jitter_pct", &s.reaim.jitter_pct),
        ("calibration.user_scale", &s.calibration.user_scale),
        ("calibration.sys_scale", &s.calibration.sys_scale),
    ];
    for (path, p) in params {
        if p.source.trim().is_empty() {
            return Err(doc
                .field_error(
                    &format!("{path}.source"),
                    "expected a citation or an assumption",
                )
                .into());
        }
    }
    for (path, k) in [
        ("kernels.novmerge.source", &s.kernels.novmerge),
        ("kernels.vmerge.source", &s.kernels.vmerge),
    ] {
        if k.source.trim().is_empty() {
            return Err(doc
                .field_error(path, "expected a citation or an assumption")
                .into());
        }
    }
    Ok(())
}

fn validate(text: &str, origin: &str) -> Result<(Config, Scenario), ExperimentError> {
    let doc = TomlDoc::parse(text, origin)?;
    let s: Scenario = doc.deserialize()?;
    if s.experiment != NAME {
        return Err(doc
            .field_error(
                "experiment",
                format!("expected \"{NAME}\", got \"{}\"", s.experiment),
            )
            .into());
    }
    if s.calibrated_from != CALIBRATION_ROW {
        return Err(doc
            .field_error(
                "calibrated_from",
                format!("expected \"{CALIBRATION_ROW}\" (the only row this scenario fits)"),
            )
            .into());
    }
    check_sources(&doc, &s)?;
    let profile = PlatformProfile::bundled(&s.platform).map_err(|_| {
        doc.field_error(
            "platform",
            format!(
                "expected a bundled platform profile ({}), got \"{}\"",
                PlatformProfile::bundled_names().join(", "),
                s.platform
            ),
        )
    })?;
    profile.require_register_flush()?;
    let m = &s.machine;
    let cpus = check_int(&doc, "machine.cpus.value", m.cpus.value, 1.0, 1024.0)? as usize;
    let page = check_int(
        &doc,
        "machine.page_size.value",
        m.page_size.value,
        4096.0,
        65536.0,
    )?;
    if !page.is_power_of_two() {
        return Err(doc
            .field_error("machine.page_size.value", "expected a power of two")
            .into());
    }
    let mem = check(
        &doc,
        "machine.memory_gib.value",
        m.memory_gib.value,
        0.25,
        4096.0,
    )?;
    let slice_ms = check(
        &doc,
        "machine.timeslice_ms.value",
        m.timeslice_ms.value,
        0.1,
        10_000.0,
    )?;
    let io = &s.iommu;
    let iova_base = check_int(
        &doc,
        "iommu.iova_base.value",
        io.iova_base.value,
        0.0,
        (1u64 << 48) as f64,
    )?;
    let iova_size = check_int(
        &doc,
        "iommu.iova_size_mib.value",
        io.iova_size_mib.value,
        1.0,
        65536.0,
    )? << 20;
    if !iova_size.is_power_of_two() || iova_base % iova_size != 0 {
        return Err(doc
            .field_error(
                "iommu.iova_size_mib.value",
                "expected a power of two, with iommu.iova_base aligned to it",
            )
            .into());
    }
    let delayed_frees = check_int(
        &doc,
        "iommu.delayed_frees.value",
        io.delayed_frees.value,
        0.0,
        4096.0,
    )? as usize;
    let h = &s.hba;
    let bus = check(
        &doc,
        "hba.bus_mb_per_s.value",
        h.bus_mb_per_s.value,
        1.0,
        1e6,
    )?;
    let per_cmd = check(
        &doc,
        "hba.per_command_us.value",
        h.per_command_us.value,
        0.0,
        1e6,
    )?;
    let hba_sge = check(&doc, "hba.per_sge_ns.value", h.per_sge_ns.value, 0.0, 1e6)?;
    let sg_tablesize = check_int(
        &doc,
        "hba.sg_tablesize.value",
        h.sg_tablesize.value,
        1.0,
        4096.0,
    )? as usize;
    let max_sectors = check_int(&doc, "hba.max_sectors.value", h.max_sectors.value, 8.0, 1e6)?;
    let max_segment = check_int(
        &doc,
        "hba.max_segment_kib.value",
        h.max_segment_kib.value,
        4.0,
        1e6,
    )? << 10;
    let mask_bits = check_int(
        &doc,
        "hba.dma_mask_bits.value",
        h.dma_mask_bits.value,
        32.0,
        64.0,
    )? as u32;
    let d = &s.driver;
    let submit = check(&doc, "driver.submit_us.value", d.submit_us.value, 0.0, 1e6)?;
    let drv_sge = check(
        &doc,
        "driver.per_sge_ns.value",
        d.per_sge_ns.value,
        0.0,
        1e6,
    )?;
    let complete = check(
        &doc,
        "driver.complete_us.value",
        d.complete_us.value,
        0.0,
        1e6,
    )?;
    let k = &s.disk;
    let cap = check(
        &doc,
        "disk.capacity_gb.value",
        k.capacity_gb.value,
        0.1,
        1e6,
    )?;
    let rpm = check(&doc, "disk.rpm.value", k.rpm.value, 1000.0, 30_000.0)?;
    let seek_r = check(
        &doc,
        "disk.seek_read_ms.value",
        k.seek_read_ms.value,
        0.0,
        100.0,
    )?;
    let seek_w = check(
        &doc,
        "disk.seek_write_ms.value",
        k.seek_write_ms.value,
        0.0,
        100.0,
    )?;
    let media = check(
        &doc,
        "disk.media_mb_per_s.value",
        k.media_mb_per_s.value,
        1.0,
        1e5,
    )?;
    let fs_block = check_int(
        &doc,
        "fs.block_size.value",
        s.fs.block_size.value,
        512.0,
        65536.0,
    )?;
    if !fs_block.is_power_of_two() || fs_block > page {
        return Err(doc
            .field_error(
                "fs.block_size.value",
                "expected a power of two no larger than the page size",
            )
            .into());
    }
    let journal_blocks = check_int(
        &doc,
        "fs.journal_blocks_per_commit.value",
        s.fs.journal_blocks_per_commit.value,
        1.0,
        1024.0,
    )?;
    let r = &s.reaim;
    if r.start == 0 || r.start > MAX_USERS {
        return Err(doc
            .field_error("reaim.start", format!("expected 1 to {MAX_USERS}"))
            .into());
    }
    if r.end < r.start || r.end > MAX_USERS {
        return Err(doc
            .field_error("reaim.end", format!("expected reaim.start to {MAX_USERS}"))
            .into());
    }
    if r.increment == 0 {
        return Err(doc
            .field_error("reaim.increment", "expected at least 1")
            .into());
    }
    let users: Vec<u32> = (r.start..=r.end)
        .step_by(r.increment as usize)
        .map(|u| u as u32)
        .collect();
    if users.len() > MAX_RAMP_POINTS {
        return Err(doc
            .field_error(
                "reaim.increment",
                format!("expected at most {MAX_RAMP_POINTS} user counts in the ramp"),
            )
            .into());
    }
    let jitter = check(
        &doc,
        "reaim.jitter_pct.value",
        r.jitter_pct.value,
        0.0,
        90.0,
    )? / 100.0;
    if r.task.is_empty() || r.task.len() > MAX_TASKS {
        return Err(doc
            .field_error("reaim.task", format!("expected 1 to {MAX_TASKS} tasks"))
            .into());
    }
    let mut tasks = Vec::with_capacity(r.task.len());
    for t in &r.task {
        let bad = |what: &str| doc.field_error("reaim.task", format!("task `{}`: {what}", t.name));
        if t.weight == 0 || t.weight > 10_000 {
            return Err(bad("expected a weight from 1 to 10000").into());
        }
        if !(t.user_us.is_finite() && t.sys_us.is_finite())
            || t.user_us < 0.0
            || t.sys_us < 0.0
            || t.user_us + t.sys_us > 1e8
        {
            return Err(bad("expected user_us and sys_us from 0 to 1e8").into());
        }
        if t.sync_write_kib > 1 << 20 {
            return Err(bad("expected sync_write_kib at most 1048576").into());
        }
        if t.source.trim().is_empty() {
            return Err(bad("expected a source").into());
        }
        tasks.push(Task {
            name: t.name.clone(),
            weight: t.weight,
            user_ns: t.user_us * 1e3,
            sys_ns: t.sys_us * 1e3,
            sync_write_bytes: t.sync_write_kib << 10,
        });
    }
    let user_scale = check(
        &doc,
        "calibration.user_scale.value",
        s.calibration.user_scale.value,
        0.0,
        1e4,
    )?;
    let sys_scale = check(
        &doc,
        "calibration.sys_scale.value",
        s.calibration.sys_scale.value,
        0.0,
        1e4,
    )?;
    let cfg = Config {
        scale: (user_scale, sys_scale),
        cpus,
        page,
        mem_pages: ((mem * (1u64 << 30) as f64) as u64 / page).max(16),
        slice_ns: (slice_ms * 1e6) as u64,
        iova_base,
        iova_size,
        delayed_frees,
        scsi: ScsiParams {
            bus_bytes_per_s: bus * 1e6,
            hba_per_command_ns: per_cmd * 1e3,
            hba_per_sge_ns: hba_sge,
            driver_submit_ns: submit * 1e3,
            driver_per_sge_ns: drv_sge,
            driver_complete_ns: complete * 1e3,
            seek_read_ns: seek_r * 1e6,
            seek_write_ns: seek_w * 1e6,
            revolution_ns: 60e9 / rpm,
            media_bytes_per_s: media * 1e6,
        },
        sg_tablesize,
        max_transfer: max_sectors * 512,
        max_segment,
        mask_bits,
        disk_bytes: (cap * 1e9) as u64,
        fs_block,
        journal_blocks,
        users,
        jitter,
        workfile: Workfile {
            name: r.workfile.clone(),
            tasks,
        },
        profile,
    };
    Ok((cfg, s))
}

// ------------------------------------------------------------------------------------------
// One run: one kernel, one user count
// ------------------------------------------------------------------------------------------

/// What one run produced.
struct RunOut {
    row: ReaimRow,
    /// Children's user and system time from the workfile's CPU work only (before scaling
    /// matters), and system time of the I/O path, s.
    task_user: f64,
    task_sys: f64,
    io_sys: f64,
    scsi: ScsiStats,
    sba_streams: u64,
    sba_purges: u64,
    lock_contended: u64,
    /// What the SBA left the HBA able to reach: its device-side counters at the end of the run.
    protection: ProtectionStats,
}

fn run_one(
    cfg: &Config,
    kernel: &Kernel,
    users: u32,
    scale: (f64, f64),
    seed: u64,
) -> Result<RunOut, ExperimentError> {
    let mut sim = Sim::new(SimConfig {
        cpus: cfg.cpus,
        seed,
    })?;
    let h = sim.handle().clone();
    let mut sba_cfg = SbaIommuConfig::new(
        DomainId(1),
        cfg.iova_base,
        cfg.iova_size,
        cfg.page.min(1 << 16),
    );
    sba_cfg.merge = kernel.sba_coalesce;
    sba_cfg.delayed_frees = cfg.delayed_frees;
    let sba = Arc::new(SbaIommu::new(sba_cfg).map_err(|e| ExperimentError::Model(e.to_string()))?);
    let dev = Device::new(1, cfg.mask_bits)
        .and_then(|d| d.with_max_segment_size(cfg.max_segment))
        .map_err(|e| ExperimentError::Model(e.to_string()))?;
    let limits = QueueLimits {
        max_segments: cfg.sg_tablesize,
        max_segment_size: cfg.max_segment,
        max_transfer: cfg.max_transfer,
        virt_merge_granule: kernel.block_virt_merge.then_some(cfg.page.min(1 << 16)),
    };
    let sync = &cfg.profile.sync;
    let lock = SpinParams {
        acquire_ns: sync.lock_acquire_release.ns().round() as u64,
        release_ns: 0,
        handoff_ns: sync.lock_handoff.ns().round() as u64,
    };
    let purge_ns = cfg.profile.require_register_flush()?.flush_duration.ns();
    let host = ScsiHost::start(
        &h,
        cfg.scsi,
        limits,
        sba.clone(),
        dev,
        cfg.profile.cpu_cost_model(),
        purge_ns,
        lock,
    )?;
    let child = ChildSetup {
        slice_ns: cfg.slice_ns,
        jitter: cfg.jitter,
        scale,
        layout: FsyncLayout {
            page: cfg.page,
            // RAM sits at 4 GiB and up, away from the IOV window (scenario).
            first_pfn: (4u64 << 30) / cfg.page,
            mem_pages: cfg.mem_pages,
            disk_bytes: cfg.disk_bytes,
            fs_block: cfg.fs_block,
            journal_blocks: cfg.journal_blocks,
        },
    };
    let ChildrenRun {
        row,
        report,
        totals: t,
        ..
    } = run_children(&mut sim, &host, &cfg.workfile, &child, users, cfg.cpus)?;
    let contended = report.spin_lock("sba_res_lock").map_or(0, |l| l.contended);
    let st = sba.stats();
    Ok(RunOut {
        row,
        task_user: t.task_user as f64 * 1e-9,
        task_sys: t.task_sys as f64 * 1e-9,
        io_sys: t.io_sys as f64 * 1e-9,
        scsi: host.stats(),
        sba_streams: st.streams,
        sba_purges: st.purges,
        lock_contended: contended,
        protection: sba.protection(),
    })
}

/// Adds the protection report's metrics that the SBA model measures: device accesses that
/// bypassed translation (single buffers of a device whose DMA mask reaches them, as the
/// 53c1030's 64-bit mask does, are handed out as physical addresses), refused accesses,
/// sub-page exposure, deferred unmaps and the longest unmap-to-purge window (an unmapped
/// range waits in the batch of `DELAYED_RESOURCE_CNT` for its purge). Stale hits are left
/// out rather than reported as zero: the model has no device-side I/O TLB to observe one
/// ([`SbaIommu::protection`]).
fn sba_protection_metrics(m: Measurement, p: &ProtectionStats) -> Measurement {
    let m = m.metric(Metric::new(
        "protection.deferred_unmaps",
        "count",
        p.deferred_unmaps as f64,
    ));
    exposure_metrics(m, p, p.max_reachable_after_unmap_ns)
}

fn mean_rows(rows: &[ReaimRow]) -> ReaimRow {
    let n = rows.len().max(1) as f64;
    let avg = |f: fn(&ReaimRow) -> f64| rows.iter().map(f).sum::<f64>() / n;
    ReaimRow {
        forked: rows.first().map_or(0, |r| r.forked),
        parent_time: avg(|r| r.parent_time),
        child_sys: avg(|r| r.child_sys),
        child_user: avg(|r| r.child_user),
        jpm: avg(|r| r.jpm),
        jpm_per_child: avg(|r| r.jpm_per_child),
        std_dev_time: avg(|r| r.std_dev_time),
        std_dev_pct: avg(|r| r.std_dev_pct),
        jti: (rows.iter().map(|r| f64::from(r.jti)).sum::<f64>() / n).round() as u32,
    }
}

/// The seed of ramp point `i` (the `i`-th user count) in repetition `r` from base seed
/// `base`: the lab's rule for re-aim ramps (`lab::run_seed` of the repetition's seed), so a
/// lab scenario of one kernel reproduces this experiment's runs of that kernel.
fn point_seed(base: u64, r: u32, i: usize) -> u64 {
    crate::lab::run_seed(crate::lab::run_seed(base, r), i as u32)
}

/// The declared calibration's fitting procedure: scales the workfile's per-task user and
/// system CPU costs so the no-vmerge kernel at 100 users gives the published child UTime and
/// SysTime. Child times are sums of the scaled spends plus the I/O path's system time (not
/// scaled), so one probe run at scale 1 (the seed of that ramp point) gives the factors:
/// `published user / task user` and `(published sys - I/O sys) / task sys`. The scenario
/// records the result in `[calibration]`; reproduce does not refit.
///
/// # Errors
///
/// The scenario's validation errors and the probe run's.
pub fn fit_task_scale(text: &str, origin: &str, seed: u64) -> Result<(f64, f64), ExperimentError> {
    let (cfg, sc) = validate(text, origin)?;
    let (cal_users, _, cal_sys, cal_user, _, _) = PUB_NOVMERGE[0];
    let i = cfg
        .users
        .iter()
        .position(|&u| u == cal_users)
        .ok_or_else(|| {
            ExperimentError::Model(format!(
                "the ramp {:?} does not run the calibration row's {cal_users} users",
                cfg.users
            ))
        })?;
    let probe = run_one(
        &cfg,
        &sc.kernels.novmerge,
        cal_users,
        (1.0, 1.0),
        point_seed(seed, 0, i),
    )?;
    Ok((
        cal_user / probe.task_user,
        ((cal_sys - probe.io_sys) / probe.task_sys).max(0.0),
    ))
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
    let (cfg, sc) = validate(text, origin)?;
    let runs = options.runs.max(1);

    // Calibration: the recorded scale factors of the workfile's per-task CPU costs
    // (`[calibration]`, fitted by `fit_task_scale` against the published child times of
    // novmerge.users100; a test checks the recorded values are what the fit gives).
    let (user_scale, sys_scale) = cfg.scale;

    let mut rows: [Vec<ReaimRow>; 2] = [Vec::new(), Vec::new()];
    let mut mech: [Vec<(ScsiStats, u64, u64, u64)>; 2] = [Vec::new(), Vec::new()];
    let mut protection: [Vec<ProtectionStats>; 2] = [Vec::new(), Vec::new()];
    for (i, &u) in cfg.users.iter().enumerate() {
        for (k, kernel) in [&sc.kernels.novmerge, &sc.kernels.vmerge]
            .into_iter()
            .enumerate()
        {
            let mut per = Vec::new();
            let mut last = None;
            for r in 0..runs {
                // The lab's seed rule (`iolab run --runs`, one simulation per ramp point),
                // the same for both kernels at a user count: common random numbers.
                let seed = point_seed(options.seed, r, i);
                let out = run_one(&cfg, kernel, u, (user_scale, sys_scale), seed)?;
                per.push(out.row);
                last = Some(out);
            }
            rows[k].push(mean_rows(&per));
            if let Some(o) = last {
                mech[k].push((o.scsi, o.sba_streams, o.sba_purges, o.lock_contended));
                protection[k].push(o.protection);
            }
        }
    }

    // Report text.
    let mut text_out = String::new();
    let pub_of = |k: usize, users: u32| {
        let t = if k == 0 { &PUB_NOVMERGE } else { &PUB_VMERGE };
        t.iter().find(|r| r.0 == users).copied()
    };
    for (k, label) in [
        (
            0,
            "#define BIO_VMERGE_BOUNDARY     0 /* (ia64_max_iommu_merge_mask + 1) */",
        ),
        (
            1,
            "#define BIO_VMERGE_BOUNDARY     (ia64_max_iommu_merge_mask + 1)",
        ),
    ] {
        let published: Vec<Option<f64>> = rows[k]
            .iter()
            .map(|r| pub_of(k, r.forked).map(|p| p.4))
            .collect();
        let _ = writeln!(text_out, "{label}");
        let _ = writeln!(
            text_out,
            "reaim -f workfile.{} -s{} -e {} -i {}",
            cfg.workfile.name, sc.reaim.start, sc.reaim.end, sc.reaim.increment
        );
        text_out.push('\n');
        text_out.push_str(&reaim::format_table(&rows[k], &published));
        let pmax = if k == 0 { 5661.19 } else { 5684.46 };
        let _ = writeln!(text_out, "[published Max Jobs per Minute {pmax:.2}]\n");
    }
    let _ = writeln!(text_out, "Deltas (vmerge vs no vmerge), jobs per minute:");
    let _ = writeln!(
        text_out,
        "{:<8} {:>12} {:>12} {:>10} {:>12}",
        "users", "novmerge", "vmerge", "lab", "published"
    );
    for (a, b) in rows[0].iter().zip(&rows[1]) {
        let lab = (b.jpm - a.jpm) / a.jpm * 100.0;
        let p = match (pub_of(0, a.forked), pub_of(1, a.forked)) {
            (Some(x), Some(y)) => format!("{:+.2}%", (y.4 - x.4) / x.4 * 100.0),
            _ => "-".into(),
        };
        let _ = writeln!(
            text_out,
            "{:<8} {:>12.2} {:>12.2} {:>+9.3}% {:>12}",
            a.forked, a.jpm, b.jpm, lab, p
        );
    }
    let _ = writeln!(text_out, "\nMechanism (last run per user count):");
    let _ = writeln!(
        text_out,
        "{:<9} {:<6} {:>9} {:>10} {:>10} {:>10} {:>10} {:>8} {:>10} {:>9} {:>9}",
        "kernel",
        "users",
        "requests",
        "pieces",
        "hw_segs",
        "dma_segs",
        "sba_strms",
        "purges",
        "iommu_ms",
        "lock_cont",
        "disk_util"
    );
    for (k, name) in [(0, "novmerge"), (1, "vmerge")] {
        for (r, (s, streams, purges, cont)) in rows[k].iter().zip(&mech[k]) {
            let _ = writeln!(
                text_out,
                "{:<9} {:<6} {:>9} {:>10} {:>10} {:>10} {:>10} {:>8} {:>10.1} {:>9} {:>8.1}%",
                name,
                r.forked,
                s.requests,
                s.pieces,
                s.hw_segments,
                s.dma_segments,
                streams,
                purges,
                s.iommu_cpu_ns as f64 * 1e-6,
                cont,
                s.disk_busy_ns as f64 * 1e-9 / r.parent_time * 100.0
            );
        }
    }

    // Figures and effects.
    let mut figures = Vec::new();
    for (k, kname) in [(0, "novmerge"), (1, "vmerge")] {
        for r in &rows[k] {
            let p = pub_of(k, r.forked);
            let id = format!("{kname}.users{}", r.forked);
            let role = if id == CALIBRATION_ROW {
                Role::Calibration
            } else {
                Role::Prediction
            };
            let mut fig = |suffix: &str, unit: &str, published: Option<f64>, lab: f64| {
                figures.push(Figure {
                    id: format!("{id}{suffix}"),
                    unit: unit.into(),
                    published,
                    lab,
                    role,
                });
            };
            fig("", "jobs/min", p.map(|p| p.4), r.jpm);
            fig(".parent_time", "s", p.map(|p| p.1), r.parent_time);
            fig(".child_sys", "s", p.map(|p| p.2), r.child_sys);
            fig(".child_user", "s", p.map(|p| p.3), r.child_user);
            fig(".jti", "JTI", p.map(|p| f64::from(p.5)), f64::from(r.jti));
        }
        let max = rows[k].iter().map(|r| r.jpm).fold(0.0, f64::max);
        figures.push(Figure {
            id: format!("{kname}.max"),
            unit: "jobs/min".into(),
            published: Some(if k == 0 { 5661.19 } else { 5684.46 }),
            lab: max,
            role: Role::Prediction,
        });
    }
    let mut effects = Vec::new();
    for (a, b) in rows[0].iter().zip(&rows[1]) {
        if let (Some(x), Some(y)) = (pub_of(0, a.forked), pub_of(1, a.forked)) {
            effects.push(Effect {
                id: format!("users{}", a.forked),
                published_pct: (y.4 - x.4) / x.4 * 100.0,
                lab_pct: (b.jpm - a.jpm) / a.jpm * 100.0,
            });
        }
    }
    let max0 = rows[0].iter().map(|r| r.jpm).fold(0.0, f64::max);
    let max1 = rows[1].iter().map(|r| r.jpm).fold(0.0, f64::max);
    effects.push(Effect {
        id: "max".into(),
        published_pct: (5684.46 - 5661.19) / 5661.19 * 100.0,
        lab_pct: (max1 - max0) / max0 * 100.0,
    });

    let calibrated = vec![
        Calibrated {
            parameter: "reaim.task.user_us (common scale factor)".into(),
            value: user_scale,
            fitted_to: vec![format!("{CALIBRATION_ROW}.child_user")],
        },
        Calibrated {
            parameter: "reaim.task.sys_us (common scale factor)".into(),
            value: sys_scale,
            fitted_to: vec![format!("{CALIBRATION_ROW}.child_sys")],
        },
        // The workfile's weight total (task runs per job) is not public; it is read off the
        // baseline row through re-aim's own identity JPM = users * weights * 60 / parent time.
        Calibrated {
            parameter: "workfile weight total (sum of the task weights)".into(),
            value: cfg.workfile.weight_sum() as f64,
            fitted_to: vec![
                format!("{CALIBRATION_ROW}.jobs_per_minute"),
                format!("{CALIBRATION_ROW}.parent_time"),
            ],
        },
    ];

    let mut notes = vec![
        format!(
            "Calibrated from {CALIBRATION_ROW} (declared, recorded in the scenario's [calibration]): the workfile's per-task user and system CPU costs are scaled by {user_scale:.4} and {sys_scale:.4}, fitted so that row's Child UTime and SysTime match; parent time, jobs/min, JTI and every other row and the vmerge kernel are predictions."
        ),
        format!(
            "Kernels: novmerge = block virt merge {}, SBA coalescing {}; vmerge = block virt merge {}, SBA coalescing {}. Linux 2.6.0's sba_map_sg coalesces whatever BIO_VMERGE_BOUNDARY says; set kernels.novmerge.sba_coalesce = true to model that (the two kernels then differ only for requests that reach sg_tablesize, which this workfile never issues, and the runs are identical).",
            sc.kernels.novmerge.block_virt_merge, sc.kernels.novmerge.sba_coalesce,
            sc.kernels.vmerge.block_virt_merge, sc.kernels.vmerge.sba_coalesce
        ),
        "The new_dbase workfile's task list and weights were not found in a public source; the mix is approximated from AIM7's documented tasks with weights summing to 103 (the published rows all satisfy JPM * parent time / (60 * users) = 103.0). Per-task CPU costs are relative assumptions scaled by the calibration.".into(),
        "The published vmerge gain at 100 users (+1.4%) comes with 1.2% less child user time, which no DMA-path mechanism touches: the lab does not reproduce that part and treats it as run-to-run variation.".into(),
    ];
    // One measurement per kernel and user count: the re-aim row's figures and the
    // protection report of the last run.
    let measurements: Vec<Measurement> = ["novmerge", "vmerge"]
        .iter()
        .zip(rows.iter().zip(&protection))
        .flat_map(|(kernel, (kernel_rows, kernel_protection))| {
            kernel_rows
                .iter()
                .zip(kernel_protection)
                .map(move |(r, p)| {
                    let m = Measurement::new(format!("{kernel}.users{}", r.forked))
                        .attr("workload", "reaim")
                        .attr("kernel", kernel)
                        .attr(
                            "iommu_mode",
                            if *kernel == "vmerge" {
                                "sba-vmerge"
                            } else {
                                "sba"
                            },
                        )
                        .attr("threads", r.forked)
                        .metric(Metric::new("reaim.jobs_per_min", "jobs/min", r.jpm))
                        .metric(Metric::new("reaim.parent_time_s", "s", r.parent_time))
                        .metric(Metric::new("reaim.child_sys_s", "s", r.child_sys))
                        .metric(Metric::new("reaim.child_user_s", "s", r.child_user))
                        .metric(Metric::new("reaim.jti", "JTI", f64::from(r.jti)));
                    sba_protection_metrics(m, p)
                })
        })
        .collect();
    let jti_lab: Vec<u32> = rows[0].iter().chain(&rows[1]).map(|r| r.jti).collect();
    if jti_lab.iter().any(|&j| j > 96) {
        notes.push(format!(
            "JTI: lab {:?} vs published 95-96. Children are pinned round-robin to CPUs with equal work and a fair time-slicer, so they finish closer together than under the 2.6.0 O(1) scheduler (interactivity bonuses, load balancing); the spread comes only from task-cost jitter and I/O waits.",
            jti_lab
        ));
    }

    Ok(ExperimentReport {
        name: NAME.into(),
        title: "HP zx1 SBA IOMMU, LSI 53c1030 + ST373453LC, ext3: re-aim-7 new_dbase, BIO_VMERGE_BOUNDARY 0 vs merge mask + 1".into(),
        runs,
        figures,
        effects,
        calibrated,
        report_text: text_out,
        notes,
        measurements,
    })
}
