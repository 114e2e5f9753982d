//! The lab's invariants on small real runs: determinism (same seed, same report; another seed,
//! a close report), conservation (every submitted I/O completes exactly once, bytes moved equal
//! bytes requested, per-CPU user + system + spin + idle equals the elapsed time) and physical
//! bounds (the NVMe model never exceeds its IOPS or bandwidth over any window).
//!
//! The USB High-Speed bound (the link never carries more than 480 Mb/s) is tested in
//! `exp_ipmmu_usb.rs` (`high_speed_is_link_bound_and_never_exceeds_the_link`) and not repeated.

use std::cell::{Cell, RefCell};
use std::collections::BTreeSet;
use std::rc::Rc;
use std::sync::Arc;

use iolab_iommu::addr::{Access, Iova, PhysAddr, SZ_4K};
use iolab_iommu::dma::invalidate::ImmediateInvalidator;
use iolab_iommu::dma::{Device, Direction, Domain, DomainConfig, DomainId, DomainMode};
use iolab_iommu::iova::linux::{IovaSpaceConfig, LinuxIovaAllocator};
use iolab_iommu::iova::magazine::{MagazineCache, MagazineConfig};
use iolab_iommu::pgtable::lpae::{LpaeConfig, LpaeTable};
use iolab_iommu::work::WorkRecord;
use iolab_sim::cost::{CpuCostModel, PlatformProfile};
use iolab_sim::devices::nvme::{Nvme, NvmeParams};
use iolab_sim::devices::PortedDma;
use iolab_sim::engine::{Ctx, Handle};
use iolab_sim::experiment::{ExperimentOptions, ExperimentReport};
use iolab_sim::iommu::port::{DmaPort, Translated};
use iolab_sim::reproduce::{bundled, Experiment};
use iolab_sim::workloads::fio::{
    self, BlockTarget, FioJob, GroupStats, IoCompletion, IoRequest, RwPattern, SharedStats,
};
use iolab_sim::{Account, RunReport, Sim, SimConfig, SimDuration, SimTime};

// ---------------------------------------------------------------------------------------------
// Determinism on a bundled experiment
// ---------------------------------------------------------------------------------------------

/// The bundled smmuv3-cmdq experiment file (SAS and NVMe rows, three queue designs) with
/// 8 ms measured windows.
fn short_cmdq() -> Experiment {
    let text = bundled::text("smmuv3-cmdq")
        .expect("bundled")
        .replace("runtime_ms = 50", "runtime_ms = 8")
        .replace("ramp_ms = 10", "ramp_ms = 1");
    Experiment::parse(&text, "short.toml").expect("the shortened experiment file parses")
}

fn cmdq_report(seed: u64) -> ExperimentReport {
    short_cmdq()
        .run(&ExperimentOptions { runs: 1, seed })
        .expect("the shortened bundled experiment runs")
}

#[test]
fn same_seed_same_report_other_seed_close_report() {
    let a = serde_json::to_string(&cmdq_report(7)).expect("json");
    let b = serde_json::to_string(&cmdq_report(7)).expect("json");
    assert_eq!(
        a, b,
        "same scenario and seed must give byte-identical reports"
    );

    let first = cmdq_report(7);
    let other = cmdq_report(8);
    let c = serde_json::to_string(&other).expect("json");
    assert_ne!(a, c, "another seed must change the run");
    assert!(
        first.figures.len() >= 7 * 3,
        "every cell's IOPS and CPU figures"
    );
    assert_eq!(first.figures.len(), other.figures.len());
    for (x, y) in first.figures.iter().zip(&other.figures) {
        assert_eq!(x.id, y.id);
        // Statistically close: within 5% (CPU percentages within 2.5 points, as they are
        // small numbers that move by whole interrupts).
        let close = if x.unit == "%CPU" {
            (x.lab - y.lab).abs() <= 2.5
        } else {
            (x.lab - y.lab).abs() <= 0.05 * x.lab.abs().max(1.0)
        };
        assert!(
            close,
            "{}: seed 7 gives {}, seed 8 gives {}",
            x.id, x.lab, y.lab
        );
    }
}

/// The other bundled experiments, shortened as their own tests shorten them: the same seed
/// twice gives byte-identical JSON.
#[test]
fn the_other_experiments_are_pure_functions_of_scenario_and_seed() {
    let ipmmu = iolab_sim::reproduce::bundled::text("ipmmu-usb")
        .expect("bundled")
        .replace("file_mib = 64\n", "file_mib = 16\nseeks = 300\n");
    // sba-vmerge's novmerge cell (its experiment file's cell, as a lab scenario), shortened.
    let sba = include_str!("../../../scenarios/experiments/sba-vmerge/novmerge.toml")
        .replace("start = 100", "start = 10")
        .replace("end = 500", "end = 20")
        .replace("increment = 100", "increment = 10");
    let options = ExperimentOptions { runs: 1, seed: 3 };
    let twice = |f: &dyn Fn() -> ExperimentReport| {
        let a = serde_json::to_string(&f()).expect("json");
        let b = serde_json::to_string(&f()).expect("json");
        assert_eq!(a, b);
    };
    let ipmmu = iolab_sim::reproduce::Experiment::parse(&ipmmu, "short.toml").expect("valid");
    twice(&|| ipmmu.run(&options).expect("runs"));
    twice(&|| {
        let lab_options = iolab_sim::lab::LabOptions {
            runs: options.runs,
            seed: Some(options.seed),
        };
        iolab_sim::lab::run_scenario(&sba, "short.toml", &lab_options)
            .expect("runs")
            .report
    });
}

// ---------------------------------------------------------------------------------------------
// A small machine built directly: fio -> strict DMA domain -> NVMe
// ---------------------------------------------------------------------------------------------

/// fio, a strict DMA domain (LPAE + Linux IOVA tree behind magazines, immediate
/// invalidation) and one NVMe device, with counters on every step.
struct Machine {
    domain: Domain,
    device: Device,
    nvme: Nvme,
    cost: CpuCostModel,
    /// The IOMMU's DMA port the NVMe's transfers go through.
    port: DmaPort,
    h: Handle,
    submitted: Cell<u64>,
    completed: Cell<u64>,
    bytes_requested: Cell<u64>,
    bytes_moved: Cell<u64>,
    inflight: RefCell<BTreeSet<(usize, u32)>>,
    double_completions: Cell<u64>,
    /// (completion time ns, bytes) of every NVMe command.
    completions: RefCell<Vec<(u64, u64)>>,
    errors: RefCell<Vec<String>>,
}

struct Target(Rc<Machine>);

const BUF: u64 = 0x10_0000_0000;

impl Machine {
    async fn submit(self: &Rc<Self>, ctx: &Ctx, req: IoRequest) -> Result<(), String> {
        let cpu = ctx.cpu().id();
        if !self.inflight.borrow_mut().insert((req.job, req.slot)) {
            return Err(format!("slot {:?} submitted twice", (req.job, req.slot)));
        }
        self.submitted.set(self.submitted.get() + 1);
        self.bytes_requested
            .set(self.bytes_requested.get() + req.len);
        let pa = BUF + (req.job as u64 * 64 + u64::from(req.slot)) * req.len;
        let mut w = WorkRecord::new();
        let mapping = self
            .domain
            .map_page(
                &self.device,
                PhysAddr::new(pa),
                req.len,
                Direction::FromDevice,
                cpu,
                &mut w,
            )
            .map_err(|e| e.to_string())?;
        let ns = self.cost.cpu_ns(&w).round() as u64 + 1_000;
        ctx.cpu().spend(SimDuration::ns(ns), Account::System).await;
        let mut tw = WorkRecord::new();
        let ranges = self
            .domain
            .translate(
                &self.device,
                mapping.dma_addr(),
                req.len,
                Access::Write,
                &mut tw,
            )
            .map_err(|e| e.to_string())?;
        let translated = Translated {
            pages: req.len.div_ceil(SZ_4K),
            misses: tw.iotlb_misses,
            walk_reads: tw.walk_reads,
        };
        let dma = PortedDma {
            port: &self.port,
            translated,
        };
        let at = self
            .nvme
            .service(ctx.now().as_ns(), req.len, req.is_read, Some(dma));
        self.completions.borrow_mut().push((at, req.len));
        let me = self.clone();
        // What the device's DMA reaches through the IOMMU: the translated physical ranges.
        let moved: u64 = ranges.iter().map(|r| r.len).sum();
        self.h
            .spawn_on(cpu, move |c| async move {
                c.sleep_until(SimTime::from_ns(at)).await;
                let mut w = WorkRecord::new();
                if let Err(e) = me.domain.unmap_page(mapping, cpu, c.now().as_ns(), &mut w) {
                    me.errors.borrow_mut().push(e.error.to_string());
                }
                let ns = me.cost.cpu_ns(&w).round() as u64 + 1_000;
                c.cpu().spend(SimDuration::ns(ns), Account::System).await;
                if !me.inflight.borrow_mut().remove(&(req.job, req.slot)) {
                    me.double_completions.set(me.double_completions.get() + 1);
                }
                me.completed.set(me.completed.get() + 1);
                me.bytes_moved.set(me.bytes_moved.get() + moved);
                let _ = req.done.send(IoCompletion {
                    slot: req.slot,
                    is_read: req.is_read,
                    len: req.len,
                    issued_at: req.issued_at,
                });
            })
            .map_err(|e| e.to_string())?;
        Ok(())
    }
}

impl BlockTarget for Target {
    fn submit<'a>(
        &'a self,
        ctx: &'a Ctx,
        req: IoRequest,
    ) -> impl std::future::Future<Output = Result<(), String>> + 'a {
        self.0.submit(ctx, req)
    }
}

struct Outcome {
    machine: Rc<Machine>,
    stats: GroupStats,
    report: RunReport,
}

/// Runs `cpus` fio jobs (one per CPU, iodepth 16, `bs` byte random reads) for `runtime_ms`
/// against an NVMe device of `max_iops` and `bandwidth` bytes/s, then drains.
fn run_machine(cpus: usize, bs: u64, max_iops: f64, bandwidth: f64, runtime_ms: u64) -> Outcome {
    let mut sim = Sim::new(SimConfig { cpus, seed: 11 }).expect("sim");
    let h = sim.handle().clone();
    let table = LpaeTable::new(LpaeConfig::new(SZ_4K, 48, 48)).expect("table");
    let tree =
        LinuxIovaAllocator::new(IovaSpaceConfig::new(SZ_4K, Iova::new(1 << 48))).expect("tree");
    let alloc = MagazineCache::new(tree, MagazineConfig::new(cpus)).expect("magazines");
    let domain = Domain::translated(
        DomainConfig {
            cpus,
            ..DomainConfig::new(DomainId(1), DomainMode::Strict)
        },
        Box::new(table),
        Arc::new(alloc),
        Arc::new(ImmediateInvalidator::new()),
    )
    .expect("domain");
    let profile = PlatformProfile::bundled("hisilicon-d05").expect("profile");
    let machine = Rc::new(Machine {
        domain,
        device: Device::new(1, 64).expect("device"),
        nvme: Nvme::new(NvmeParams {
            io_queues: cpus,
            max_iops,
            bandwidth,
            read_latency_ns: 80_000,
            write_latency_ns: 20_000,
            media_spread_pct: 0,
        }),
        cost: profile.cpu_cost_model(),
        port: profile.cpu_cost_model().dma_port(),
        h: h.clone(),
        submitted: Cell::new(0),
        completed: Cell::new(0),
        bytes_requested: Cell::new(0),
        bytes_moved: Cell::new(0),
        inflight: RefCell::new(BTreeSet::new()),
        double_completions: Cell::new(0),
        completions: RefCell::new(Vec::new()),
        errors: RefCell::new(Vec::new()),
    });
    let spec = Rc::new(FioJob {
        name: "lab".into(),
        rw: RwPattern::RandRead,
        rwmixread: 100,
        bs,
        iodepth: 16,
        batch_submit: 4,
        batch_complete_min: 1,
        numjobs: cpus as u32,
        size: 1 << 36,
        runtime: SimDuration::ms(runtime_ms),
        ramp: SimDuration::ms(1),
        cpus: (0..cpus).collect(),
        user_ns_per_io: 500,
        syscall_ns: 300,
        engine: fio::IoEngine::plain(fio::EngineKind::Libaio),
        sq_cpus: Vec::new(),
    });
    let stats: SharedStats = Rc::new(RefCell::new(GroupStats::default()));
    let target = Rc::new(Target(machine.clone()));
    for j in 0..cpus {
        let (spec, target, stats) = (spec.clone(), target.clone(), stats.clone());
        sim.spawn_on(j, move |ctx| fio::run_job(ctx, spec, j, target, stats))
            .expect("spawn");
    }
    let report = sim.run().expect("the run drains");
    let stats = stats.borrow().clone();
    Outcome {
        machine,
        stats,
        report,
    }
}

#[test]
fn every_io_completes_exactly_once_and_bytes_and_cpu_time_add_up() {
    let o = run_machine(4, 4096, 400_000.0, 3.2e9, 4);
    let m = &o.machine;
    assert!(o.stats.error.is_none(), "{:?}", o.stats.error);
    assert!(m.errors.borrow().is_empty(), "{:?}", m.errors.borrow());
    assert!(m.submitted.get() > 500, "a real run: {}", m.submitted.get());
    // Every I/O fio issued reached the target and completed exactly once.
    assert_eq!(o.stats.issued, m.submitted.get());
    assert_eq!(m.completed.get(), m.submitted.get());
    assert_eq!(m.double_completions.get(), 0);
    assert!(m.inflight.borrow().is_empty());
    assert_eq!(m.nvme.commands(), m.submitted.get());
    // Bytes the device moved through the IOMMU equal the bytes requested.
    assert_eq!(m.bytes_moved.get(), m.bytes_requested.get());
    assert_eq!(m.bytes_requested.get(), m.submitted.get() * 4096);
    // Every mapping was unmapped.
    assert_eq!(m.domain.live_mappings(), 0);
    // Per CPU, user + system + spin + idle is the elapsed time, and busy time is real.
    assert!(o.report.is_conserved());
    let elapsed = o.report.end.saturating_since(SimTime::ZERO);
    for c in &o.report.cpus {
        assert_eq!(c.user + c.system + c.spin + c.idle, elapsed.as_ns());
        assert!(c.user > 0 && c.system > 0);
    }
}

/// The most completions (and bytes) in any window of `window_ns` starting at a completion.
fn max_in_window(times: &[(u64, u64)], window_ns: u64) -> (u64, u64) {
    let mut t: Vec<(u64, u64)> = times.to_vec();
    t.sort_unstable();
    let (mut best_n, mut best_b) = (0u64, 0u64);
    let (mut j, mut bytes) = (0usize, 0u64);
    for i in 0..t.len() {
        while j < t.len() && t[j].0 < t[i].0 + window_ns {
            bytes += t[j].1;
            j += 1;
        }
        best_n = best_n.max((j - i) as u64);
        best_b = best_b.max(bytes);
        bytes -= t[i].1;
    }
    (best_n, best_b)
}

#[test]
fn nvme_never_exceeds_its_iops_over_any_window() {
    // 8 CPUs x depth 16 can issue far more than 100K IOPS: the device is the limit.
    let max_iops = 100_000.0;
    let o = run_machine(8, 4096, max_iops, 3.2e9, 6);
    let times = o.machine.completions.borrow();
    for window_us in [50u64, 200, 1000] {
        let (n, _) = max_in_window(&times, window_us * 1000);
        // At most one command per 1/max_iops, plus the one at the window's start and one
        // whose completion the translation time (under 1 us here) shifted into the window.
        let bound = (window_us as f64 * 1e-6 * max_iops).floor() as u64 + 2;
        assert!(n <= bound, "{n} completions in {window_us} us > {bound}");
    }
    // The bound is binding: the device ran near its rate over the whole run.
    let span = times.iter().map(|t| t.0).max().unwrap_or(0) as f64 * 1e-9;
    let rate = times.len() as f64 / span;
    assert!(
        rate > 0.8 * max_iops,
        "{rate} IOPS: the device was not the limit"
    );
}

#[test]
fn nvme_never_exceeds_its_bandwidth_over_any_window() {
    // 128 KiB reads at 1 GB/s: the link is the limit (7,600 I/Os per second), not the IOPS.
    let bw = 1e9;
    let bs = 128 << 10;
    let o = run_machine(4, bs, 1e6, bw, 6);
    let times = o.machine.completions.borrow();
    for window_us in [500u64, 2000] {
        let (_, bytes) = max_in_window(&times, window_us * 1000);
        // The bytes of every transfer that ended in the window, plus the one that was
        // under way when it opened.
        let bound = window_us as f64 * 1e-6 * bw + bs as f64;
        assert!(
            bytes as f64 <= bound,
            "{bytes} B in {window_us} us > {bound}"
        );
    }
    let span = times.iter().map(|t| t.0).max().unwrap_or(0) as f64 * 1e-9;
    let total: u64 = times.iter().map(|t| t.1).sum();
    assert!(total as f64 / span > 0.7 * bw, "the link was not the limit");
}
