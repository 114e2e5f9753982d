//! `protection`: what each DMA mode leaves a hostile device able to reach, and what the
//! protection costs in throughput. Not a published experiment: every figure is the lab's
//! own prediction (`published: None`), and `iolab reproduce` runs it only when named.
//!
//! One NVMe SSD doing fio-like random reads of sub-page buffers, and the same device probing
//! just-unmapped addresses and the neighbours of live buffers
//! ([`crate::workloads::hostile`]), on two machines:
//!
//! - the scenario's `platform` (POWER, `power-lpar`): no IOMMU, passthrough (identity
//!   domain), and POWER's DDW in direct and dynamic form;
//! - the `[smmu]` platform (an SMMUv3 machine, `hisilicon-d06`): no IOMMU, and strict and
//!   lazy over the SMMUv3 model ([`Smmuv3DevicePath`]): the device's DMA goes through the
//!   SMMU's IOTLB and walk cache, every invalidation is a real `CMD_TLBI_NH_VA` /
//!   `CMD_TLBI_NH_ASID` plus `CMD_SYNC` through the command queue, timed by the simulated
//!   queue with the profile's command consumption and sync latency; stale hits are measured
//!   IOTLB hits on entries whose mapping was removed; faults are SMMUv3 events in a bounded
//!   event queue that a driver thread drains periodically. A last row repeats strict with a
//!   fault storm (the device probes around every buffer) that overflows the event queue.
//!
//! "vs off" compares each row with the no-IOMMU row of its own platform. See
//! docs/model/protection.md and docs/SECURITY.md.

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
use iolab_iommu::hw::{DmaPath, PseriesConfig, PseriesIommu, Smmuv3DevicePath};
use iolab_iommu::iova::linux::{IovaSpaceConfig, LinuxIovaAllocator};
use iolab_iommu::pgtable::lpae::{LpaeConfig, LpaeTable};
use iolab_iommu::smmuv3::{CmdqConfig, ProducerKind, Smmuv3Config};
use iolab_iommu::work::WorkRecord;

use super::ExperimentError;
use crate::cmdq::{Mode as CmdqMode, SimCmdq};
use crate::cost::PlatformProfile;
use crate::devices::nvme::{Nvme, NvmeParams};
use crate::engine::{Sim, SimConfig, SimDuration, SimTime};
use crate::experiment::{ExperimentOptions, ExperimentReport, Figure, Role, Sourced};
use crate::metrics::protection::counts;
use crate::metrics::{protection_metrics, Measurement};
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
    smmu: SmmuScen,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SmmuScen {
    platform: String,
    queue_log2size: Sourced,
    batch_max: Sourced,
    evtq_log2size: Sourced,
    evtq_drain_interval_us: Sourced,
    storm_neighbour_every: Sourced,
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
    smmu: SmmuParams,
}

/// The SMMUv3 machine's part of the scenario.
struct SmmuParams {
    platform: String,
    profile: PlatformProfile,
    queue_log2size: u32,
    batch_max: u32,
    evtq_log2size: u32,
    evtq_drain_ns: u64,
    storm_every: u64,
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
    let sm = &s.smmu;
    let smmu_profile = PlatformProfile::bundled(&sm.platform)
        .map_err(|e| doc.field_error("smmu.platform", e.to_string()))?;
    if let Err(e) = smmu_profile.require_cmdq() {
        return Err(doc.field_error("smmu.platform", e.to_string()).into());
    }
    let smmu = SmmuParams {
        platform: sm.platform.clone(),
        profile: smmu_profile,
        queue_log2size: c("smmu.queue_log2size", &sm.queue_log2size, 2.0, 19.0)? as u32,
        batch_max: c("smmu.batch_max", &sm.batch_max, 1.0, 1024.0)? as u32,
        evtq_log2size: c("smmu.evtq_log2size", &sm.evtq_log2size, 1.0, 16.0)? as u32,
        evtq_drain_ns: (c(
            "smmu.evtq_drain_interval_us",
            &sm.evtq_drain_interval_us,
            0.1,
            1e6,
        )? * 1e3) as u64,
        storm_every: c(
            "smmu.storm_neighbour_every",
            &sm.storm_neighbour_every,
            1.0,
            1e6,
        )? as u64,
    };
    Ok(Validated {
        smmu,
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
    Smmu(Arc<Smmuv3DevicePath>),
}

impl Stack {
    fn path(&self) -> Arc<dyn DmaPath> {
        match self {
            Stack::Domain(d) => d.clone(),
            Stack::Pseries(p) => p.clone(),
            Stack::Smmu(p) => p.clone(),
        }
    }

    fn protection(&self) -> ProtectionStats {
        match self {
            Stack::Domain(d) => d.protection(),
            Stack::Pseries(p) => p.protection(),
            Stack::Smmu(p) => p.protection(),
        }
    }
}

/// One row of the table: a mode on a platform.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RowSpec {
    /// The DMA mode.
    pub mode: Mode,
    /// The platform profile it runs on.
    pub platform: String,
    /// Whether the DMA goes through the SMMUv3 model (strict and lazy).
    pub smmu: bool,
    /// The fault-storm variant (probes around every buffer).
    pub storm: bool,
}

impl RowSpec {
    /// The row's name in the table (`strict-storm` for the storm variant).
    pub fn name(&self) -> String {
        if self.storm {
            format!("{}-storm", self.mode.name())
        } else {
            self.mode.name().to_string()
        }
    }
}

/// The rows of a scenario, in table order: the POWER machine's four modes, then the SMMUv3
/// machine's no-IOMMU, strict, lazy and strict under a fault storm.
fn rows(v: &Validated) -> Vec<RowSpec> {
    let row = |mode, platform: &str, smmu, storm| RowSpec {
        mode,
        platform: platform.to_string(),
        smmu,
        storm,
    };
    let power = v.profile.name.as_str();
    let arm = v.smmu.platform.as_str();
    vec![
        row(Mode::NoIommu, power, false, false),
        row(Mode::Passthrough, power, false, false),
        row(Mode::DdwDirect, power, false, false),
        row(Mode::DdwDynamic, power, false, false),
        row(Mode::NoIommu, arm, false, false),
        row(Mode::Strict, arm, true, false),
        row(Mode::Lazy, arm, true, false),
        row(Mode::Strict, arm, true, true),
    ]
}

fn model<E: std::fmt::Display>(e: E) -> ExperimentError {
    ExperimentError::Model(e.to_string())
}

fn build(v: &Validated, row: &RowSpec, dev: &Device) -> Result<Stack, ExperimentError> {
    let mode = row.mode;
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
        Mode::Strict | Mode::Lazy if row.smmu => {
            let m = if mode == Mode::Strict {
                DomainMode::Strict
            } else {
                DomainMode::Lazy
            };
            let alloc = LinuxIovaAllocator::new(IovaSpaceConfig::new(SZ_4K, Iova::new(1 << 48)))
                .map_err(model)?;
            // D06's SMMU: SMMUv3.0/3.1 without range invalidation (one CMD_TLBI_NH_VA per
            // page), the 2019 lock-free producer, gem5's IOTLB and walk-cache geometry (as
            // the smmuv3-cmdq experiment: docs/model/smmuv3-cmdq.md).
            let smmu = Smmuv3Config {
                streams: dev.id() + 1,
                cmdq: CmdqConfig::with_log2size(v.smmu.queue_log2size),
                producer: ProducerKind::LockFree,
                range_invalidation: false,
                evtq_log2size: v.smmu.evtq_log2size,
                ..Smmuv3Config::default()
            };
            Stack::Smmu(Arc::new(
                Smmuv3DevicePath::new(
                    smmu,
                    1,
                    config(m),
                    LpaeConfig::new(SZ_4K, 48, 48),
                    Arc::new(alloc),
                    dev,
                )
                .map_err(model)?,
            ))
        }
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

/// The SMMUv3 event queue's record counts of a run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EventQueueCounts {
    /// Records written.
    pub written: u64,
    /// Records lost because the queue was full.
    pub lost: u64,
    /// Overflow episodes (`SMMU_EVTQ_PROD.OVFLG` toggles).
    pub overflows: u64,
}

impl EventQueueCounts {
    /// Adds `other`'s counts to these (the total over several runs).
    pub fn add(&mut self, other: &EventQueueCounts) {
        self.written += other.written;
        self.lost += other.lost;
        self.overflows += other.overflows;
    }

    /// Every count put through `f` (for example, a total over runs made a mean).
    pub fn map(&self, f: impl Fn(u64) -> u64) -> EventQueueCounts {
        EventQueueCounts {
            written: f(self.written),
            lost: f(self.lost),
            overflows: f(self.overflows),
        }
    }
}

/// One row's result (the mean of its runs).
#[derive(Clone, Debug)]
pub struct ModeResult {
    /// The mode.
    pub mode: Mode,
    /// The row (mode, platform, SMMU or not, storm).
    pub row: RowSpec,
    /// Read IOPS in the window.
    pub iops: f64,
    /// Read bandwidth, bytes per second.
    pub bw_bytes_per_s: f64,
    /// System CPU percent of the job CPUs.
    pub sys_pct: f64,
    /// What the hostile device reached.
    pub exposure: ExposureReport,
    /// What the stack counted (for lazy over the SMMU, `max_reachable_after_unmap_ns` is
    /// the window measured up to each flush's sync completion).
    pub protection: ProtectionStats,
    /// The SMMUv3 event queue (rows over the SMMU only).
    pub events: Option<EventQueueCounts>,
    /// Virtual length of the run, ns.
    pub run_ns: u64,
    /// Runs averaged.
    pub runs: u32,
    /// The configuration's measurement.
    pub measurement: Measurement,
}

fn run_mode(v: &Validated, row: &RowSpec, seed: u64) -> Result<ModeResult, ExperimentError> {
    let mode = row.mode;
    let profile = if row.platform == v.smmu.platform {
        &v.smmu.profile
    } else {
        &v.profile
    };
    let cpus = v.job.numjobs as usize;
    let mut sim = Sim::new(SimConfig { cpus, seed })?;
    let h = sim.handle().clone();
    let dev = Device::new(1, 64).map_err(model)?;
    let stack = build(v, row, &dev)?;
    let inflight = (v.job.iodepth as usize) * cpus + 1;
    let hostile = HostileParams {
        neighbour_every: if row.storm {
            v.smmu.storm_every
        } else {
            v.hostile.neighbour_every
        },
        ..v.hostile
    };
    let probed = ProbedNvme::new(
        &h,
        stack.path(),
        dev,
        Nvme::new(v.nvme),
        profile.cpu_cost_model(),
        v.kernel,
        hostile,
        cpus,
        BUF_BASE,
        u64::from(v.job.iodepth),
        inflight,
    );
    let spec = Rc::new(v.job.clone());
    let t0 = SimTime::ZERO + spec.ramp;
    let t1 = t0 + spec.runtime;
    if let Stack::Smmu(p) = &stack {
        let q = SimCmdq::new(&h, CmdqMode::LockFree, profile, v.smmu.batch_max)?;
        probed
            .set_command_queue(q, mode == Mode::Lazy)
            .map_err(ExperimentError::Model)?;
        // The driver's event-queue thread: reads every record and acknowledges an overflow,
        // every drain interval, until the end of the measured window.
        let (p, every, stop) = (p.clone(), v.smmu.evtq_drain_ns.max(1), t1.as_ns());
        h.spawn_agent(move |actx| async move {
            let mut next = every;
            while next <= stop {
                actx.sleep_until(SimTime::from_ns(next)).await;
                p.smmu().with_events(|q| {
                    q.drain();
                    q.ack_overflow();
                });
                next += every;
            }
        })?;
    }
    for cpu in 0..cpus {
        let p = probed.clone();
        sim.spawn_on(cpu, move |ctx| p.irq_loop(ctx, cpu))?;
    }
    let stats: SharedStats = Rc::new(RefCell::new(GroupStats::default()));
    let target = Rc::new(ProbedTarget(probed.clone()));
    for j in 0..cpus {
        let (spec, target, stats) = (spec.clone(), target.clone(), stats.clone());
        sim.spawn_on(j, move |ctx| fio::run_job(ctx, spec, j, target, stats))?;
    }
    let before = sim.run_until(t0)?;
    let after = sim.run_until(t1)?;
    let end = sim.run()?;
    if let Some(e) = probed.error().or(stats.borrow().error.clone()) {
        return Err(ExperimentError::Model(e));
    }
    let (usr, sys) = fio::cpu_usage(&before, &after, &spec.cpus);
    let g = stats.borrow();
    let json = fio::job_json(&spec, &g, usr, sys);
    let mut protection = stack.protection();
    let exposure = probed.exposure();
    let run_ns = end.end.as_ns();
    // Lazy over the SMMU: the window measured up to each flush's sync completion.
    if let Some(w) = probed.measured_window_ns(run_ns) {
        protection.max_reachable_after_unmap_ns = w;
    }
    // Untranslated: a freed buffer stays reachable for the whole run.
    let window_ns = if mode.untranslated() {
        run_ns
    } else {
        protection.max_reachable_after_unmap_ns
    };
    let events = match &stack {
        Stack::Smmu(p) => {
            let f = p.smmu().fault_stats();
            Some(EventQueueCounts {
                written: f.events_written,
                lost: f.events_lost,
                overflows: f.event_queue_overflows,
            })
        }
        _ => None,
    };
    let config = format!("nvme.{}.{}", row.platform, row.name());
    let measurement = protection_metrics(
        fio::measurement(&config, &spec, &g, usr, sys)
            .attr("iommu_mode", mode.name())
            .attr("device", "nvme")
            .attr("platform", &row.platform)
            .attr(
                "iommu_model",
                match &stack {
                    Stack::Smmu(_) => "smmuv3",
                    Stack::Pseries(_) => "pseries",
                    Stack::Domain(_) => "none",
                },
            )
            .attr("neighbour_every", hostile.neighbour_every)
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
    );
    let mut measurement = counts(
        measurement,
        &[
            ("hostile.stale_reads", "count", exposure.stale_reads),
            ("hostile.stale_writes", "count", exposure.stale_writes),
            ("hostile.stale_read_bytes", "B", exposure.stale_read_bytes),
            (
                "hostile.neighbour_readable_bytes",
                "B",
                exposure.neighbour_readable_bytes,
            ),
            (
                "hostile.neighbour_writable_bytes",
                "B",
                exposure.neighbour_writable_bytes,
            ),
        ],
    );
    if let Some(e) = events {
        measurement = counts(
            measurement,
            &[
                ("faults.event_queue_overflows", "count", e.overflows),
                ("faults.events_written", "count", e.written),
                ("faults.events_lost", "count", e.lost),
            ],
        );
    }
    Ok(ModeResult {
        mode,
        row: row.clone(),
        iops: json.read.iops,
        bw_bytes_per_s: json.read.bw * 1024.0,
        sys_pct: sys,
        exposure,
        protection,
        events,
        run_ns,
        runs: 1,
        measurement,
    })
}

/// The mean of `n` counts, rounded.
fn mean_u64(sum: u64, n: u64) -> u64 {
    (sum + n / 2) / n.max(1)
}

/// Averages the runs of one row: throughput, CPU, counts and every metric are means (counts
/// rounded); the maxima (longest window, largest sub-page excess) are the largest of any
/// run; the latency histogram merges every run's; the CPU breakdown sums them.
fn average(runs: Vec<ModeResult>) -> Result<ModeResult, ExperimentError> {
    let n = runs.len() as u64;
    let mut it = runs.into_iter();
    let mut acc = it
        .next()
        .ok_or_else(|| ExperimentError::Model("no run".into()))?;
    if n == 1 {
        return Ok(acc);
    }
    let first_metrics = acc.measurement.metrics.clone();
    let mut sums: Vec<f64> = first_metrics.iter().map(|m| m.value).collect();
    let (mut iops, mut bw, mut sys, mut run_ns) =
        (acc.iops, acc.bw_bytes_per_s, acc.sys_pct, acc.run_ns);
    let mut e = acc.exposure;
    let mut p = acc.protection;
    let mut ev = acc.events;
    for r in it {
        iops += r.iops;
        bw += r.bw_bytes_per_s;
        sys += r.sys_pct;
        run_ns += r.run_ns;
        e.add(&r.exposure);
        p.merge(&r.protection);
        if let (Some(a), Some(b)) = (ev.as_mut(), r.events) {
            a.add(&b);
        }
        for (i, m) in first_metrics.iter().enumerate() {
            let v = r.measurement.get(&m.name).map(|x| x.value).ok_or_else(|| {
                ExperimentError::Model(format!("metric {} missing in a repetition", m.name))
            })?;
            sums[i] += v;
        }
        if let (Some(a), Some(b)) = (acc.measurement.latency.as_mut(), &r.measurement.latency) {
            a.merge(b);
        }
        if let (Some(a), Some(b)) = (acc.measurement.cpu.as_mut(), &r.measurement.cpu) {
            a.user_ns += b.user_ns;
            a.system_ns += b.system_ns;
            a.spin_ns += b.spin_ns;
            a.idle_ns += b.idle_ns;
        }
    }
    let nf = n as f64;
    acc.iops = iops / nf;
    acc.bw_bytes_per_s = bw / nf;
    acc.sys_pct = sys / nf;
    acc.run_ns = run_ns / n;
    acc.runs = n as u32;
    let m = |x: u64| mean_u64(x, n);
    acc.exposure = e.map(m);
    acc.protection = ProtectionStats {
        stale_hits: m(p.stale_hits),
        stale_bytes: m(p.stale_bytes),
        deferred_unmaps: m(p.deferred_unmaps),
        subpage_exposed_bytes: m(p.subpage_exposed_bytes),
        bypass_accesses: m(p.bypass_accesses),
        translation_faults: m(p.translation_faults),
        permission_faults: m(p.permission_faults),
        ..p
    };
    acc.events = ev.map(|a| a.map(m));
    for (metric, sum) in acc.measurement.metrics.iter_mut().zip(sums) {
        metric.value = sum / nf;
    }
    // The maxima stay maxima.
    for metric in acc.measurement.metrics.iter_mut() {
        match metric.name.as_str() {
            "protection.max_reachable_after_unmap_ns" if !acc.mode.untranslated() => {
                metric.value = acc.protection.max_reachable_after_unmap_ns as f64;
            }
            "protection.max_subpage_exposed_bytes" => {
                metric.value = acc.protection.max_subpage_exposed_bytes as f64;
            }
            _ => {}
        }
    }
    acc.measurement = acc.measurement.clone().attr("runs", n);
    Ok(acc)
}

/// Runs every row `runs` times (seeds from [`crate::engine::rng::repetition_seed`]) and
/// averages.
pub fn run_results_runs(
    text: &str,
    origin: &str,
    seed: u64,
    runs: u32,
) -> Result<(String, Vec<ModeResult>), ExperimentError> {
    let v = validate(text, origin)?;
    let mut out = Vec::new();
    for row in rows(&v) {
        let mut rs = Vec::new();
        for r in 0..runs.max(1) {
            let s = crate::engine::rng::repetition_seed(seed, r);
            rs.push(run_mode(&v, &row, s)?);
        }
        out.push(average(rs)?);
    }
    Ok((v.title, out))
}

/// Runs every row once with `seed`.
pub fn run_results(
    text: &str,
    origin: &str,
    seed: u64,
) -> Result<(String, Vec<ModeResult>), ExperimentError> {
    run_results_runs(text, origin, seed, 1)
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

/// The table of rows by throughput and exposure.
pub fn table(results: &[ModeResult]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<13} {:<14} {:>7} {:>7} {:>5} {:>13} {:>13} {:>9} {:>9} {:>10} {:>8} {:>8} {:>13} {:>12}",
        "mode",
        "platform",
        "kIOPS",
        "vs off",
        "sys%",
        "stale reads",
        "stale writes",
        "nbr rd B",
        "nbr wr B",
        "max window",
        "subpg B",
        "bypass",
        "faults T/P",
        "evtq lost/ov"
    );
    for r in results {
        let e = &r.exposure;
        let base = results
            .iter()
            .find(|b| b.mode == Mode::NoIommu && b.row.platform == r.row.platform)
            .map_or(0.0, |b| b.iops);
        let vs = if base > 0.0 {
            format!("{:+.1}%", (r.iops - base) / base * 100.0)
        } else {
            "-".into()
        };
        let evtq = r
            .events
            .map_or("-".to_string(), |q| format!("{}/{}", q.lost, q.overflows));
        let _ = writeln!(
            out,
            "{:<13} {:<14} {:>7.1} {:>7} {:>5.1} {:>13} {:>13} {:>9} {:>9} {:>10} {:>8} {:>8} {:>13} {:>12}",
            r.row.name(),
            r.row.platform,
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
            format!(
                "{}/{}",
                r.protection.translation_faults, r.protection.permission_faults
            ),
            evtq,
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
    let runs = options.runs.max(1);
    let (title, results) = run_results_runs(text, origin, options.seed, runs)?;
    let mut figures = Vec::new();
    for r in &results {
        let m = format!("{}.{}", r.row.platform, r.row.name());
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
        "(vs off: against the no-IOMMU row of the same platform; strict and lazy run over the \
         SMMUv3 model (IOTLB, walk cache, TLBI + CMD_SYNC through the timed command queue), \
         the other rows as before; stale: probes of a just-unmapped buffer that succeeded / \
         tried, over the SMMU measured IOTLB hits on removed mappings; nbr: bytes after live \
         buffers the device could reach; max window: longest unmap-to-unreachable time, \
         'unbounded' where nothing translates; subpg B: largest page excess of one mapping; \
         faults T/P: translation / permission faults; evtq lost/ov: SMMUv3 event records lost \
         / overflow episodes; storm: the device probes around every buffer{})",
        if runs > 1 {
            format!("; means of {runs} runs")
        } else {
            String::new()
        }
    );
    Ok(ExperimentReport {
        name: NAME.into(),
        title,
        runs,
        figures,
        effects: Vec::new(),
        calibrated: Vec::new(),
        report_text: text,
        notes: vec![
            "Not a published experiment: every figure is the lab's prediction.".into(),
            "Strict and lazy run on the SMMUv3 model (hisilicon-d06 costs); the no-IOMMU, \
             passthrough and DDW rows on their own platform. See docs/SECURITY.md."
                .into(),
        ],
        measurements: results.into_iter().map(|r| r.measurement).collect(),
    })
}
