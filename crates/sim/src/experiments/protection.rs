//! `protection`: what each DMA mode leaves a hostile device able to reach, and what the
//! protection costs in throughput. Not a published experiment: every figure is the lab's
//! own prediction (`published: None`), and `iolab reproduce` runs it only when named.
//!
//! One machine (the scenario's platform profile for every CPU cost), one NVMe SSD doing
//! fio-like random reads of sub-page buffers, and the same device probing just-unmapped
//! addresses and the neighbours of live buffers ([`crate::workloads::hostile`]), in six
//! modes: no IOMMU, passthrough (identity domain), strict and lazy (a translated domain
//! with an LPAE table and the Linux IOVA allocator), and POWER's DDW in direct and dynamic
//! form. See docs/model/protection.md and docs/SECURITY.md.

use std::cell::RefCell;
use std::fmt::Write as _;
use std::rc::Rc;
use std::sync::Arc;

use serde::Deserialize;

use iolab_iommu::addr::{Iova, SZ_4K};
use iolab_iommu::dma::{
    Device, Domain, DomainConfig, DomainId, DomainMode, FlushQueueConfig, ImmediateInvalidator,
    ProtectionStats,
};
use iolab_iommu::hw::pseries::{ddw_page, DdwConfig, DdwPolicy};
use iolab_iommu::hw::{DmaPath, PseriesConfig, PseriesIommu};
use iolab_iommu::iova::linux::{IovaSpaceConfig, LinuxIovaAllocator};
use iolab_iommu::pgtable::lpae::{LpaeConfig, LpaeTable};
use iolab_iommu::work::WorkRecord;

use super::ExperimentError;
use crate::cost::PlatformProfile;
use crate::devices::nvme::{Nvme, NvmeParams};
use crate::engine::{Sim, SimConfig, SimDuration, SimTime};
use crate::experiment::{ExperimentOptions, ExperimentReport, Figure, Role, Sourced};
use crate::metrics::{Measurement, Metric};
use crate::tomlfile::{InputError, TomlDoc};
use crate::workloads::fio::{self, FioJob, GroupStats, RwPattern, SharedStats};
use crate::workloads::hostile::{
    ExposureReport, HostileParams, KernelCosts, ProbedNvme, ProbedTarget,
};

/// The name `iolab reproduce` knows it by.
pub const NAME: &str = "protection";
/// The bundled scenario.
pub const BUNDLED_SCENARIO: &str = include_str!("../../../../scenarios/protection.toml");

const GIB: u64 = 1 << 30;
/// Where the workload's buffers start (physical).
const BUF_BASE: u64 = GIB;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Scenario {
    experiment: String,
    title: String,
    platform: String,
    workload: WorkloadScen,
    nvme: NvmeScen,
    kernel: KernelScen,
    hostile: HostileScen,
    iommu: IommuScen,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WorkloadScen {
    numjobs: Sourced,
    iodepth: Sourced,
    block_bytes: Sourced,
    runtime_ms: Sourced,
    ramp_ms: Sourced,
    fio_user_per_io_ns: Sourced,
    syscall_ns: Sourced,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NvmeScen {
    max_iops: Sourced,
    bandwidth_gb_per_s: Sourced,
    read_latency_us: Sourced,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct KernelScen {
    block_submit_ns: Sourced,
    nvme_submit_ns: Sourced,
    irq_ns: Sourced,
    complete_ns: Sourced,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HostileScen {
    probe_bytes: Sourced,
    neighbour_window_bytes: Sourced,
    neighbour_every: Sourced,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct IommuScen {
    memory_gib: Sourced,
    lazy_timeout_ms: Sourced,
    lazy_ring_size: Sourced,
    ddw_page_kib: Sourced,
    ddw_dynamic_window_gib: Sourced,
}

/// The six modes, in the order of the table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// No IOMMU.
    NoIommu,
    /// Identity domain.
    Passthrough,
    /// Translated, strict invalidation.
    Strict,
    /// Translated, lazy invalidation.
    Lazy,
    /// POWER DDW mapping all memory directly.
    DdwDirect,
    /// POWER DDW as a dynamic TCE window.
    DdwDynamic,
}

impl Mode {
    /// Every mode, in table order.
    pub const ALL: [Mode; 6] = [
        Mode::NoIommu,
        Mode::Passthrough,
        Mode::Strict,
        Mode::Lazy,
        Mode::DdwDirect,
        Mode::DdwDynamic,
    ];

    /// The name in the table and the `iommu_mode` attribute.
    pub fn name(self) -> &'static str {
        match self {
            Mode::NoIommu => "off",
            Mode::Passthrough => "passthrough",
            Mode::Strict => "strict",
            Mode::Lazy => "lazy",
            Mode::DdwDirect => "ddw-direct",
            Mode::DdwDynamic => "ddw-dynamic",
        }
    }

    /// Whether a freed buffer stays reachable for good (nothing translates).
    fn untranslated(self) -> bool {
        matches!(self, Mode::NoIommu | Mode::Passthrough | Mode::DdwDirect)
    }
}

struct Validated {
    title: String,
    profile: PlatformProfile,
    job: FioJob,
    nvme: NvmeParams,
    kernel: KernelCosts,
    hostile: HostileParams,
    memory: u64,
    fq: FlushQueueConfig,
    ddw_page_shift: u32,
    ddw_dynamic_window: u64,
}

fn check(doc: &TomlDoc<'_>, path: &str, p: &Sourced, lo: f64, hi: f64) -> Result<f64, InputError> {
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

fn validate(text: &str, origin: &str) -> Result<Validated, ExperimentError> {
    let doc = TomlDoc::parse(text, origin)?;
    let s: Scenario = doc.deserialize()?;
    if s.experiment != NAME {
        return Err(doc
            .field_error("experiment", format!("expected \"{NAME}\""))
            .into());
    }
    let profile = PlatformProfile::bundled(&s.platform)?;
    let c = |path: &str, p: &Sourced, lo: f64, hi: f64| check(&doc, path, p, lo, hi);
    let w = &s.workload;
    let numjobs = c("workload.numjobs", &w.numjobs, 1.0, 64.0)? as u32;
    let iodepth = c("workload.iodepth", &w.iodepth, 1.0, 1024.0)? as u32;
    let bs = c("workload.block_bytes", &w.block_bytes, 512.0, 1048576.0)? as u64;
    if bs % 512 != 0 {
        return Err(doc
            .field_error("workload.block_bytes.value", "expected a multiple of 512")
            .into());
    }
    let runtime_ms = c("workload.runtime_ms", &w.runtime_ms, 1.0, 10_000.0)?;
    let ramp_ms = c("workload.ramp_ms", &w.ramp_ms, 0.0, 10_000.0)?;
    let job = FioJob {
        name: "hostile".into(),
        rw: RwPattern::RandRead,
        rwmixread: 100,
        bs,
        iodepth,
        batch_submit: 1,
        batch_complete_min: 1,
        numjobs,
        size: 64 * GIB,
        runtime: SimDuration::ns((runtime_ms * 1e6) as u64),
        ramp: SimDuration::ns((ramp_ms * 1e6) as u64),
        cpus: (0..numjobs as usize).collect(),
        user_ns_per_io: c(
            "workload.fio_user_per_io_ns",
            &w.fio_user_per_io_ns,
            0.0,
            1e6,
        )? as u64,
        syscall_ns: c("workload.syscall_ns", &w.syscall_ns, 0.0, 1e6)? as u64,
    };
    let n = &s.nvme;
    let nvme = NvmeParams {
        io_queues: numjobs as usize,
        max_iops: c("nvme.max_iops", &n.max_iops, 1.0, 1e8)?,
        bandwidth: c(
            "nvme.bandwidth_gb_per_s",
            &n.bandwidth_gb_per_s,
            0.001,
            1000.0,
        )? * 1e9,
        read_latency_ns: (c("nvme.read_latency_us", &n.read_latency_us, 0.0, 1e6)? * 1e3) as u64,
        write_latency_ns: 0,
    };
    let k = &s.kernel;
    let ns = |path: &str, p: &Sourced| -> Result<u64, InputError> {
        Ok(check(&doc, &format!("kernel.{path}"), p, 0.0, 1e6)?.round() as u64)
    };
    let kernel = KernelCosts {
        block_submit_ns: ns("block_submit_ns", &k.block_submit_ns)?,
        nvme_submit_ns: ns("nvme_submit_ns", &k.nvme_submit_ns)?,
        irq_ns: ns("irq_ns", &k.irq_ns)?,
        complete_ns: ns("complete_ns", &k.complete_ns)?,
    };
    let h = &s.hostile;
    let hostile = HostileParams {
        probe_bytes: c("hostile.probe_bytes", &h.probe_bytes, 1.0, 1048576.0)? as u64,
        neighbour_window: c(
            "hostile.neighbour_window_bytes",
            &h.neighbour_window_bytes,
            1.0,
            16.0 * 1048576.0,
        )? as u64,
        neighbour_every: c("hostile.neighbour_every", &h.neighbour_every, 1.0, 1e6)? as u64,
    };
    let i = &s.iommu;
    let memory = c("iommu.memory_gib", &i.memory_gib, 4.0, 4096.0)? as u64 * GIB;
    let fq = FlushQueueConfig {
        ring_size: c("iommu.lazy_ring_size", &i.lazy_ring_size, 2.0, 65536.0)? as usize,
        timeout_ns: (c("iommu.lazy_timeout_ms", &i.lazy_timeout_ms, 0.001, 10_000.0)? * 1e6) as u64,
    };
    let page_kib = c("iommu.ddw_page_kib", &i.ddw_page_kib, 4.0, 16384.0)? as u64;
    let ddw_page_shift = match page_kib {
        4 => 12,
        64 => 16,
        16384 => 24,
        _ => {
            return Err(doc
                .field_error("iommu.ddw_page_kib.value", "expected 4, 64 or 16384")
                .into())
        }
    };
    let ddw_dynamic_window = c(
        "iommu.ddw_dynamic_window_gib",
        &i.ddw_dynamic_window_gib,
        1.0,
        4096.0,
    )? as u64
        * GIB;
    if ddw_dynamic_window >= memory {
        return Err(doc
            .field_error(
                "iommu.ddw_dynamic_window_gib.value",
                "expected a window smaller than the memory (else the DDW maps it directly)",
            )
            .into());
    }
    let buffers = u64::from(numjobs) * u64::from(iodepth) * bs;
    if BUF_BASE + buffers + hostile.neighbour_window > memory {
        return Err(doc
            .field_error(
                "iommu.memory_gib.value",
                "expected room for the buffers above 1 GiB",
            )
            .into());
    }
    Ok(Validated {
        title: s.title,
        profile,
        job,
        nvme,
        kernel,
        hostile,
        memory,
        fq,
        ddw_page_shift,
        ddw_dynamic_window,
    })
}

/// Where the protection figures come from.
enum Stack {
    Domain(Arc<Domain>),
    Pseries(Arc<PseriesIommu>),
}

impl Stack {
    fn path(&self) -> Arc<dyn DmaPath> {
        match self {
            Stack::Domain(d) => d.clone(),
            Stack::Pseries(p) => p.clone(),
        }
    }

    fn protection(&self) -> ProtectionStats {
        match self {
            Stack::Domain(d) => d.protection(),
            Stack::Pseries(p) => p.protection(),
        }
    }
}

fn model<E: std::fmt::Display>(e: E) -> ExperimentError {
    ExperimentError::Model(e.to_string())
}

fn build(v: &Validated, mode: Mode) -> Result<Stack, ExperimentError> {
    let cpus = v.job.numjobs as usize;
    let config = |m| DomainConfig {
        cpus,
        flush_queue: v.fq,
        ..DomainConfig::new(DomainId(1), m)
    };
    Ok(match mode {
        Mode::NoIommu => Stack::Domain(Arc::new(
            Domain::direct(config(DomainMode::NoIommu)).map_err(model)?,
        )),
        Mode::Passthrough => Stack::Domain(Arc::new(
            Domain::direct(config(DomainMode::Identity)).map_err(model)?,
        )),
        Mode::Strict | Mode::Lazy => {
            let m = if mode == Mode::Strict {
                DomainMode::Strict
            } else {
                DomainMode::Lazy
            };
            let table = LpaeTable::new(LpaeConfig::new(SZ_4K, 48, 48)).map_err(model)?;
            let alloc = LinuxIovaAllocator::new(IovaSpaceConfig::new(SZ_4K, Iova::new(1 << 48)))
                .map_err(model)?;
            Stack::Domain(Arc::new(
                Domain::translated(
                    config(m),
                    Box::new(table),
                    Arc::new(alloc),
                    Arc::new(ImmediateInvalidator::new()),
                )
                .map_err(model)?,
            ))
        }
        Mode::DdwDirect | Mode::DdwDynamic => {
            let window = if mode == Mode::DdwDirect {
                v.memory
            } else {
                v.ddw_dynamic_window
            };
            let mask = match v.ddw_page_shift {
                12 => ddw_page::PS_4K,
                16 => ddw_page::PS_64K | ddw_page::PS_4K,
                _ => ddw_page::PS_16M | ddw_page::PS_64K | ddw_page::PS_4K,
            };
            let mut cfg = PseriesConfig::new(DomainId(1), v.memory);
            cfg.ddw = Some(DdwConfig::with_window(window, mask));
            cfg.policy = DdwPolicy::DirectOrDynamic;
            let p = PseriesIommu::new(cfg).map_err(model)?;
            let info = p.enable_ddw(&mut WorkRecord::new()).map_err(model)?;
            if info.is_none() {
                return Err(ExperimentError::Model("the DDW was not created".into()));
            }
            Stack::Pseries(Arc::new(p))
        }
    })
}

/// One mode's run.
#[derive(Clone, Debug)]
pub struct ModeResult {
    /// The mode.
    pub mode: Mode,
    /// Read IOPS in the window.
    pub iops: f64,
    /// Read bandwidth, bytes per second.
    pub bw_bytes_per_s: f64,
    /// System CPU percent of the job CPUs.
    pub sys_pct: f64,
    /// What the hostile device reached.
    pub exposure: ExposureReport,
    /// What the stack counted.
    pub protection: ProtectionStats,
    /// Virtual length of the run, ns.
    pub run_ns: u64,
    /// The configuration's measurement.
    pub measurement: Measurement,
}

fn run_mode(v: &Validated, mode: Mode, seed: u64) -> Result<ModeResult, ExperimentError> {
    let cpus = v.job.numjobs as usize;
    let mut sim = Sim::new(SimConfig { cpus, seed })?;
    let h = sim.handle().clone();
    let stack = build(v, mode)?;
    let dev = Device::new(1, 64).map_err(model)?;
    let inflight = (v.job.iodepth as usize) * cpus + 1;
    let probed = ProbedNvme::new(
        &h,
        stack.path(),
        dev,
        Nvme::new(v.nvme),
        v.profile.cpu_cost_model(),
        v.kernel,
        v.hostile,
        cpus,
        BUF_BASE,
        u64::from(v.job.iodepth),
        inflight,
    );
    for cpu in 0..cpus {
        let p = probed.clone();
        sim.spawn_on(cpu, move |ctx| p.irq_loop(ctx, cpu))?;
    }
    let spec = Rc::new(v.job.clone());
    let stats: SharedStats = Rc::new(RefCell::new(GroupStats::default()));
    let target = Rc::new(ProbedTarget(probed.clone()));
    for j in 0..cpus {
        let (spec, target, stats) = (spec.clone(), target.clone(), stats.clone());
        sim.spawn_on(j, move |ctx| fio::run_job(ctx, spec, j, target, stats))?;
    }
    let t0 = SimTime::ZERO + spec.ramp;
    let t1 = t0 + spec.runtime;
    let before = sim.run_until(t0)?;
    let after = sim.run_until(t1)?;
    let end = sim.run()?;
    if let Some(e) = probed.error().or(stats.borrow().error.clone()) {
        return Err(ExperimentError::Model(e));
    }
    let (usr, sys) = fio::cpu_usage(&before, &after, &spec.cpus);
    let g = stats.borrow();
    let json = fio::job_json(&spec, &g, usr, sys);
    let protection = stack.protection();
    let exposure = probed.exposure();
    let run_ns = end.end.as_ns();
    // Untranslated: a freed buffer stays reachable for the whole run.
    let window_ns = if mode.untranslated() {
        run_ns
    } else {
        protection.max_reachable_after_unmap_ns
    };
    let config = format!("nvme.{}", mode.name());
    let measurement = protection_metrics(
        fio::measurement(&config, &spec, &g, usr, sys)
            .attr("iommu_mode", mode.name())
            .attr("device", "nvme")
            .attr(
                "exposure_window",
                if mode.untranslated() {
                    "unbounded"
                } else {
                    "bounded"
                },
            ),
        &protection,
        window_ns,
    )
    .metric(Metric::new(
        "hostile.stale_reads",
        "count",
        exposure.stale_reads as f64,
    ))
    .metric(Metric::new(
        "hostile.stale_writes",
        "count",
        exposure.stale_writes as f64,
    ))
    .metric(Metric::new(
        "hostile.stale_read_bytes",
        "B",
        exposure.stale_read_bytes as f64,
    ))
    .metric(Metric::new(
        "hostile.neighbour_readable_bytes",
        "B",
        exposure.neighbour_readable_bytes as f64,
    ))
    .metric(Metric::new(
        "hostile.neighbour_writable_bytes",
        "B",
        exposure.neighbour_writable_bytes as f64,
    ));
    Ok(ModeResult {
        mode,
        iops: json.read.iops,
        bw_bytes_per_s: json.read.bw * 1024.0,
        sys_pct: sys,
        exposure,
        protection,
        run_ns,
        measurement,
    })
}

/// Adds the protection report's metrics (`protection.*`, `faults.*`) to `m`.
/// `max_reachable_ns` is the stack's figure, or the run length where nothing translates.
pub fn protection_metrics(
    m: Measurement,
    p: &ProtectionStats,
    max_reachable_ns: u64,
) -> Measurement {
    m.metric(Metric::new(
        "protection.stale_hits",
        "count",
        p.stale_hits as f64,
    ))
    .metric(Metric::new(
        "protection.max_reachable_after_unmap_ns",
        "ns",
        max_reachable_ns as f64,
    ))
    .metric(Metric::new(
        "protection.subpage_exposed_bytes",
        "B",
        p.subpage_exposed_bytes as f64,
    ))
    .metric(Metric::new(
        "protection.max_subpage_exposed_bytes",
        "B",
        p.max_subpage_exposed_bytes as f64,
    ))
    .metric(Metric::new(
        "protection.bypass_accesses",
        "count",
        p.bypass_accesses as f64,
    ))
    .metric(Metric::new(
        "faults.translation",
        "count",
        p.translation_faults as f64,
    ))
    .metric(Metric::new(
        "faults.permission",
        "count",
        p.permission_faults as f64,
    ))
}

/// Runs every mode once with `seed`.
pub fn run_results(
    text: &str,
    origin: &str,
    seed: u64,
) -> Result<(String, Vec<ModeResult>), ExperimentError> {
    let v = validate(text, origin)?;
    let mut out = Vec::new();
    for mode in Mode::ALL {
        out.push(run_mode(&v, mode, seed)?);
    }
    Ok((v.title, out))
}

fn window_text(r: &ModeResult) -> String {
    if r.mode.untranslated() {
        "unbounded".into()
    } else {
        format!(
            "{:.3} ms",
            r.protection.max_reachable_after_unmap_ns as f64 / 1e6
        )
    }
}

/// The table of modes by throughput and exposure.
pub fn table(results: &[ModeResult]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<12} {:>9} {:>8} {:>7} {:>13} {:>13} {:>11} {:>11} {:>12} {:>10} {:>9}",
        "mode",
        "kIOPS",
        "vs off",
        "sys%",
        "stale reads",
        "stale writes",
        "nbr read B",
        "nbr write B",
        "max window",
        "subpage B",
        "bypasses"
    );
    let base = results
        .iter()
        .find(|r| r.mode == Mode::NoIommu)
        .map_or(0.0, |r| r.iops);
    for r in results {
        let e = &r.exposure;
        let vs = if base > 0.0 {
            format!("{:+.1}%", (r.iops - base) / base * 100.0)
        } else {
            "-".into()
        };
        let _ = writeln!(
            out,
            "{:<12} {:>9.1} {:>8} {:>7.1} {:>13} {:>13} {:>11} {:>11} {:>12} {:>10} {:>9}",
            r.mode.name(),
            r.iops / 1e3,
            vs,
            r.sys_pct,
            format!("{}/{}", e.stale_reads, e.stale_read_attempts),
            format!("{}/{}", e.stale_writes, e.stale_write_attempts),
            e.neighbour_readable_bytes,
            e.neighbour_writable_bytes,
            window_text(r),
            r.protection.max_subpage_exposed_bytes,
            r.protection.bypass_accesses,
        );
    }
    out
}

/// Runs a `protection` scenario and reports it.
pub fn run_scenario(
    text: &str,
    origin: &str,
    options: &ExperimentOptions,
) -> Result<ExperimentReport, ExperimentError> {
    let (title, results) = run_results(text, origin, options.seed)?;
    let mut figures = Vec::new();
    for r in &results {
        let m = r.mode.name();
        let fig = |id: String, unit: &str, lab: f64| Figure {
            id,
            unit: unit.into(),
            published: None,
            lab,
            role: Role::Prediction,
        };
        figures.push(fig(format!("{m}.iops"), "IOPS", r.iops));
        figures.push(fig(
            format!("{m}.stale_reads"),
            "count",
            r.exposure.stale_reads as f64,
        ));
        figures.push(fig(
            format!("{m}.neighbour_readable_bytes"),
            "B",
            r.exposure.neighbour_readable_bytes as f64,
        ));
    }
    let mut text = table(&results);
    let _ = writeln!(
        text,
        "(stale: probes of a just-unmapped buffer that succeeded / tried; nbr: bytes after live \
         buffers the device could reach; max window: longest unmap-to-unreachable time, \
         'unbounded' where nothing translates; subpage B: largest page excess of one mapping)"
    );
    Ok(ExperimentReport {
        name: NAME.into(),
        title,
        runs: 1,
        figures,
        effects: Vec::new(),
        calibrated: Vec::new(),
        report_text: text,
        notes: vec![
            "Not a published experiment: every figure is the lab's prediction.".into(),
            "Strict and lazy use a generic translated domain (LPAE table, Linux IOVA allocator, \
             invalidation that completes at once); lazy assumes the IOTLB keeps every \
             unmapped page until the flush (the worst case). See docs/SECURITY.md."
                .into(),
        ],
        measurements: results.into_iter().map(|r| r.measurement).collect(),
    })
}
