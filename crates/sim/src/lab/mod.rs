//! Workload scenarios: one machine, one IOMMU configuration, devices and one workload,
//! described in a TOML file and run on their own (`iolab run FILE`).
//!
//! A workload scenario is the one form every run takes: a platform profile, CPUs and
//! memory, an IOMMU model and mode, devices and a workload with its parameters. The
//! published experiments are experiment files ([`crate::reproduce`]) whose every cell is
//! one. Its report is the workload's own output (fio's summary) and one
//! [`Measurement`] per run for the results database, `iolab compare` and sweeps.
//!
//! ```
//! use iolab_sim::lab::{self, LabOptions};
//!
//! let text = r#"
//! name = "nvme-strict"
//! [machine]
//! platform = "hisilicon-d06"
//! cpus = 8
//! [iommu]
//! model = "smmuv3"
//! mode = "strict"
//! [[device]]
//! kind = "nvme"
//! [workload]
//! kind = "fio"
//! ioengine = "libaio"
//! rw = "randread"
//! iodepth = 8
//! numjobs = 4
//! runtime_ms = 2
//! ramp_ms = 1
//! "#;
//! let run = lab::run_scenario(text, "doc.toml", &LabOptions::default()).unwrap();
//! let m = &run.report.measurements[0];
//! assert_eq!(m.attrs["iommu_mode"], "strict");
//! assert!(m.get("read.iops").unwrap().value > 0.0);
//! assert!(run.report.report_text.contains("IOPS="));
//! ```
//!
//! File schema, defaults with their sources, and caps: docs/SCENARIOS.md.

mod block;
pub mod caps;
pub mod defaults;
mod dma_metrics;
pub mod error;
pub mod examples;
mod iommu;
mod map_bench;
mod net;
pub(crate) mod presets;
pub use net::{netperf_parts, NetperfParts};
pub(crate) mod reaim;
pub use reaim::{fit_task_scale, TaskScaleFit};
mod scsi;
pub mod spec;
mod usb;

use std::fmt::Write as _;
use std::path::Path;

use iolab_iommu::vtd::VtdTranslation;
use serde::Serialize;

use crate::experiment::ExperimentReport;
use crate::metrics::{Measurement, Metric};
use crate::workloads::fio::{FioJson, JobJson};

pub use error::LabError;
pub use spec::{validate, LabScenario};

/// How to run a scenario.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LabOptions {
    /// Repetitions (each with its own seed derived from the base seed), 1..=[`caps::MAX_RUNS`].
    pub runs: u32,
    /// Base seed; `None` uses the scenario's `seed` (default 1).
    pub seed: Option<u64>,
}

impl Default for LabOptions {
    fn default() -> Self {
        Self {
            runs: 1,
            seed: None,
        }
    }
}

/// A finished scenario run.
#[derive(Clone, Debug)]
pub struct LabRun {
    /// The report: `report_text` is the workload's native output, `measurements` one per run.
    pub report: ExperimentReport,
    /// fio-shaped JSON (one job group per run), for fio workloads.
    pub fio: Option<FioJson>,
    /// The base seed used.
    pub seed: u64,
    /// DMA maps over every run (ramp, measured window and drain), one per simulated I/O:
    /// the simulated work behind the run, for speed measurements (`iolab bench`). Set for
    /// fio workloads; `None` for the others. Not part of any printed output.
    pub dma_maps: Option<u64>,
}

/// What `iolab run --format json` prints for a workload scenario: fio's JSON shape for fio
/// workloads, else the run's measurements.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum LabJson<'a> {
    /// fio's `--output-format=json` shape (one job group per run).
    Fio(&'a FioJson),
    /// The measurements of a non-fio workload.
    Measurements {
        /// The scenario's name.
        name: &'a str,
        /// The base seed.
        seed: u64,
        /// One per run.
        measurements: &'a [Measurement],
    },
}

impl LabRun {
    /// The JSON view of the run (serialize it with any serde format).
    pub fn json(&self) -> LabJson<'_> {
        match &self.fio {
            Some(f) => LabJson::Fio(f),
            None => LabJson::Measurements {
                name: &self.report.name,
                seed: self.seed,
                measurements: &self.report.measurements,
            },
        }
    }
}

/// The seed of repetition `r` of a run with base seed `base`: the base itself for the
/// first (so `--seed` reruns it), [`derive_seed`](crate::engine::rng::derive_seed) after.
pub fn run_seed(base: u64, r: u32) -> u64 {
    crate::engine::rng::repetition_seed(base, r)
}

/// Validates and runs a workload scenario given as text. `origin` names it in errors and,
/// when it is a file path, relative profile paths are resolved against its directory.
pub fn run_scenario(text: &str, origin: &str, options: &LabOptions) -> Result<LabRun, LabError> {
    let base = Path::new(origin).parent().filter(|p| p.is_dir());
    let s = validate(text, origin, base)?;
    run(&s, options)
}

/// Runs a validated scenario.
pub fn run(s: &LabScenario, options: &LabOptions) -> Result<LabRun, LabError> {
    if options.runs == 0 || options.runs > caps::MAX_RUNS {
        return Err(LabError::Model(format!(
            "runs must be 1..={} (cap MAX_RUNS), got {}",
            caps::MAX_RUNS,
            options.runs
        )));
    }
    let base = options.seed.or(s.seed).unwrap_or(1);
    let mut out = run_workload(s, options, base)?;
    if let Some(note) = identical_runs_note(&out.report.measurements) {
        out.report.report_text.push_str(&note);
    }
    Ok(out)
}

/// A note for repetitions whose figures are all identical: the seed drives the lab's random
/// draws (fio's offsets, arrival jitter, re-aim's job mix ...), and a configuration whose
/// service times depend on none of them is deterministic, so its repetitions carry no
/// run-to-run variance. `None` for one run, or when any figure differs.
pub fn identical_runs_note(measurements: &[Measurement]) -> Option<String> {
    let (first, rest) = measurements.split_first()?;
    if rest.is_empty() {
        return None;
    }
    let figures = |m: &Measurement| {
        m.metrics
            .iter()
            .map(|x| (x.name.clone(), x.value.to_bits()))
            .collect::<Vec<_>>()
    };
    let reference = figures(first);
    if rest.iter().any(|m| figures(m) != reference) {
        return None;
    }
    Some(format!(
        "note: the {} runs gave identical figures: the seed drives the lab's random draws \
         (offsets, jitter), and nothing this configuration measures depends on them, so it is \
         deterministic and its repetitions show no run-to-run variance\n",
        measurements.len()
    ))
}

/// Runs a validated scenario's workload `options.runs` times from seed `base`.
fn run_workload(s: &LabScenario, options: &LabOptions, base: u64) -> Result<LabRun, LabError> {
    match (&s.workload, &s.devices) {
        (spec::Workload::Fio(f), _) => run_fio(s, f, base, options.runs),
        (
            spec::Workload::Bonnie(b),
            spec::Devices::Usb(_)
            | spec::Devices::Nvme(_)
            | spec::Devices::Sas(_)
            | spec::Devices::Scsi(_),
        ) => run_bonnie(s, b, base, options.runs),
        (spec::Workload::Netperf(n), spec::Devices::Nic(link)) => {
            run_netperf(s, n, *link, base, options.runs)
        }
        (spec::Workload::Reaim(r), spec::Devices::Scsi(d)) => {
            run_reaim(s, r, d, base, options.runs)
        }
        (spec::Workload::DmaMapBenchmark(b), _) => run_map_benchmark(s, b, base, options.runs),
        (w, d) => Err(LabError::Model(format!(
            "a {} workload cannot drive {} devices",
            w.kind(),
            d.kind()
        ))),
    }
}

/// The attributes every measurement of `s` carries.
fn base_attrs(s: &LabScenario, m: Measurement) -> Measurement {
    let mut m = m
        .attr("scenario", &s.name)
        .attr("platform", &s.profile.name)
        .attr("cpus", s.cpus)
        .attr("memory_gib", s.memory_bytes >> 30)
        .attr("iommu_model", s.iommu.model.name())
        .attr("iommu_mode", s.iommu.mode.name())
        .attr("device", s.devices.kind())
        .attr("devices", s.devices.len())
        .attr("kernel", s.iommu.kernel.kernel);
    if s.iommu.uses_cmdq() {
        m = m.attr("cmdq", s.iommu.cmdq.name());
    }
    if s.iommu.caching_mode {
        m = m.attr("caching_mode", true);
    }
    if s.iommu.vtd_translation != VtdTranslation::Legacy {
        m = m.attr(
            "vtd_translation",
            vtd_translation_name(s.iommu.vtd_translation),
        );
    }
    if s.iommu.instances > 1 {
        m = m.attr("iommu_instances", s.iommu.instances);
    }
    m
}

/// The measurement id of run `r` of `runs`.
fn config_id(s: &LabScenario, r: u32, runs: u32) -> String {
    if runs == 1 {
        s.name.clone()
    } else {
        format!("{}#{r}", s.name)
    }
}

/// The `iommu.vtd_translation` name of a mode.
fn vtd_translation_name(t: VtdTranslation) -> &'static str {
    match t {
        VtdTranslation::Legacy => "legacy",
        VtdTranslation::ScalableFirstStage => "scalable-first-stage",
        VtdTranslation::ScalableSecondStage => "scalable-second-stage",
    }
}

/// "smmuv3 strict (cmdq lockfree)" and the like.
fn iommu_label(s: &LabScenario) -> String {
    let mut t = format!("{} {}", s.iommu.model.name(), s.iommu.mode.name());
    if s.iommu.uses_cmdq() {
        let _ = write!(t, " (cmdq {})", s.iommu.cmdq.name());
    }
    if s.iommu.caching_mode {
        t.push_str(" (caching mode)");
    }
    if s.iommu.vtd_translation != VtdTranslation::Legacy {
        let _ = write!(t, " ({})", vtd_translation_name(s.iommu.vtd_translation));
    }
    if s.iommu.instances > 1 {
        let _ = write!(t, " x{} instances", s.iommu.instances);
    }
    t
}

fn report(
    s: &LabScenario,
    title: String,
    runs: u32,
    text: String,
    measurements: Vec<Measurement>,
) -> ExperimentReport {
    ExperimentReport {
        name: s.name.clone(),
        // The kernel release whose DMA-path algorithms ran, in every run's header.
        title: format!("{title}, Linux {}", s.iommu.kernel.kernel),
        runs,
        figures: Vec::new(),
        effects: Vec::new(),
        calibrated: Vec::new(),
        report_text: text,
        notes: Vec::new(),
        measurements,
    }
}

/// `total` per item of `count` (0 when there are none).
fn per(total: f64, count: u64) -> f64 {
    if count > 0 {
        total / count as f64
    } else {
        0.0
    }
}

/// Adds the run's protection report (`protection.*`, `faults.*`, as the published
/// experiments carry it: [`crate::metrics::protection_metrics`]) to `m`.
/// Where the model has no device-side cache to observe stale hits in (SBA), that figure is
/// left out, not reported as zero.
fn with_protection(m: Measurement, p: &iommu::LabProtection) -> Measurement {
    use crate::metrics::{exposure_metrics, protection_metrics};
    if p.stale_hits_measured {
        protection_metrics(m, &p.stats, p.max_reachable_ns)
    } else {
        exposure_metrics(m, &p.stats, p.max_reachable_ns)
    }
}

/// The protection report as one line of text (after fio's summary and re-aim's table).
fn protection_line(p: &iommu::LabProtection) -> String {
    let st = &p.stats;
    let mut t = String::new();
    if p.stale_hits_measured {
        let _ = write!(t, "stale hits={}, ", st.stale_hits);
    }
    let _ = write!(
        t,
        "max reachable after unmap={}, sub-page exposed={}B (max {}B), ",
        crate::time::human_ns(p.max_reachable_ns),
        st.subpage_exposed_bytes,
        st.max_subpage_exposed_bytes
    );
    let _ = write!(
        t,
        "bypassed accesses={}, faults={} translation/{} permission",
        st.bypass_accesses, st.translation_faults, st.permission_faults
    );
    t
}

/// One bonnie run on whichever device the scenario has.
struct BonnieOut {
    result: crate::workloads::bonnie::BonnieResult,
    cpu: crate::metrics::CpuBreakdown,
    /// Device attributes of the measurement.
    attrs: Vec<(&'static str, String)>,
    /// The device's own totals.
    metrics: Vec<Metric>,
    /// The run's protection report.
    protection: iommu::LabProtection,
}

fn bonnie_once(s: &LabScenario, b: &spec::BonnieSetup, seed: u64) -> Result<BonnieOut, LabError> {
    match &s.devices {
        spec::Devices::Usb(u) => {
            let out = usb::run_bonnie(s, b, u, seed)?;
            let c = &out.usb;
            Ok(BonnieOut {
                result: out.result,
                cpu: out.cpu,
                attrs: vec![("usb_speed", u.config.link.name.clone())],
                metrics: vec![
                    Metric::new("usb.commands", "count", c.commands as f64),
                    Metric::new("usb.map_ns", "ns", per(c.map_ns as f64, c.commands)),
                    Metric::new("usb.unmap_ns", "ns", per(c.unmap_ns as f64, c.commands)),
                    Metric::new("usb.flushes", "count", c.flushes as f64),
                    Metric::new("usb.cache_flushes", "count", c.cache_flushes as f64),
                ],
                protection: out.protection,
            })
        }
        spec::Devices::Scsi(disk) => {
            let out = scsi::run_bonnie(s, b, disk, seed)?;
            let q = &out.scsi;
            Ok(BonnieOut {
                result: out.result,
                cpu: out.cpu,
                attrs: Vec::new(),
                metrics: vec![
                    Metric::new("scsi.requests", "count", q.requests as f64),
                    Metric::new("block.read_bytes", "bytes", out.submitted_bytes.0 as f64),
                    Metric::new("block.write_bytes", "bytes", out.submitted_bytes.1 as f64),
                    Metric::new("scsi.bytes", "bytes", q.bytes as f64),
                    Metric::new(
                        "scsi.dma_segments_per_request",
                        "count",
                        per(q.dma_segments as f64, q.requests),
                    ),
                    Metric::new(
                        "scsi.iommu_cpu_ns_per_request",
                        "ns",
                        per(q.iommu_cpu_ns as f64, q.requests),
                    ),
                    Metric::new("scsi.seeks", "count", q.seeks as f64),
                ],
                protection: out.protection,
            })
        }
        _ => {
            let out = block::run_bonnie(s, b, seed)?;
            let d = &out.dma;
            Ok(BonnieOut {
                result: out.result,
                cpu: out.cpu,
                attrs: Vec::new(),
                metrics: vec![
                    Metric::new("block.commands", "count", d.ios as f64),
                    Metric::new("block.read_bytes", "bytes", out.submitted_bytes.0 as f64),
                    Metric::new("block.write_bytes", "bytes", out.submitted_bytes.1 as f64),
                    Metric::new("device.read_bytes", "bytes", d.device_read_bytes as f64),
                    Metric::new("device.write_bytes", "bytes", d.device_write_bytes as f64),
                    Metric::new(
                        "dma.segments_per_command",
                        "count",
                        per(d.dma_segments as f64, d.ios),
                    ),
                    Metric::new("dma.map_ns", "ns", per(d.map_ns, d.maps)),
                    Metric::new("dma.unmap_ns", "ns", per(d.unmap_ns, d.unmaps)),
                    Metric::new("dma.inval_syncs", "count", d.inval_syncs as f64),
                    Metric::new("irq.cpus", "count", out.irq_cpus as f64),
                ],
                protection: out.protection,
            })
        }
    }
}

fn run_bonnie(
    s: &LabScenario,
    b: &spec::BonnieSetup,
    base: u64,
    runs: u32,
) -> Result<LabRun, LabError> {
    use crate::workloads::bonnie::{csv_row, csv_row_198, Csv198Params, CsvLayout, CsvValues};
    let mut text = String::new();
    let mut measurements = Vec::new();
    for r in 0..runs {
        let seed = run_seed(base, r);
        let config = config_id(s, r, runs);
        let out = bonnie_once(s, b, seed)?;
        let v = CsvValues::from_result(&out.result);
        let mut m = base_attrs(s, Measurement::new(&config)).attr("workload", "bonnie");
        for (k, val) in &out.attrs {
            m = m.attr(*k, val);
        }
        let mut m = m
            .attr("size", b.size_mib << 20)
            .attr("file_mib", b.config.file_bytes >> 20)
            .attr("threads", b.config.seekers)
            .attr("seed", seed)
            .attr("run", r)
            .cpu(out.cpu);
        for (i, phase) in crate::workloads::bonnie::PHASES.iter().enumerate() {
            let (unit, stem) = if *phase == "seeks" {
                ("/sec", "per_s")
            } else {
                ("K/sec", "kps")
            };
            m = m
                .metric(Metric::new(
                    format!("bonnie.{phase}_{stem}"),
                    unit,
                    v.v[2 * i],
                ))
                .metric(Metric::new(
                    format!("bonnie.{phase}_cpu_pct"),
                    "%",
                    v.v[2 * i + 1],
                ));
        }
        if let Some(f) = &v.files {
            for metric in f.metrics() {
                m = m.metric(metric);
            }
        }
        if b.csv == CsvLayout::V198 {
            // bonnie++ 1.9x's latency columns: the longest operation of each phase.
            let r = &out.result;
            let phases = [
                r.out_char,
                r.out_block,
                r.rewrite,
                r.in_char,
                r.in_block,
                r.seeks,
            ];
            for (phase, p) in crate::workloads::bonnie::PHASES.iter().zip(phases) {
                m = m.metric(Metric::new(
                    format!("bonnie.{phase}_latency_ns"),
                    "ns",
                    p.max_op_ns as f64,
                ));
            }
            if let Some(f) = &r.files {
                let tests = crate::workloads::bonnie::FILE_PHASES.iter().zip(f.tests());
                for (phase, p) in tests {
                    m = m.metric(Metric::new(
                        format!("bonnie.{phase}_latency_ns"),
                        "ns",
                        p.max_op_ns as f64,
                    ));
                }
            }
        }
        for metric in out.metrics {
            m = m.metric(metric);
        }
        // bonnie's output is its CSV rows only: the report is in the measurement.
        let m = with_protection(m, &out.protection);
        let row = match b.csv {
            CsvLayout::V103 => csv_row(
                &config,
                &if b.size_mib % 1024 == 0 {
                    format!("{}G", b.size_mib / 1024)
                } else {
                    format!("{}M", b.size_mib)
                },
                &v,
            ),
            CsvLayout::V198 => csv_row_198(
                &Csv198Params {
                    name: &config,
                    size_mib: b.size_mib,
                    chunk: b.config.chunk,
                    seed,
                    seeks: b.config.seeks,
                    seekers: b.config.seekers,
                },
                &out.result,
            ),
        };
        let _ = writeln!(text, "{row}");
        measurements.push(m);
    }
    let on = match &s.devices {
        spec::Devices::Usb(u) => format!("USB {}", u.config.link.name),
        spec::Devices::Sas(p) => format!("a SAS HBA with {} disks", p[0].disks),
        d => d.kind().to_uppercase(),
    };
    let title = format!(
        "bonnie++ {} CSV, {} MiB file on {on} ({}), {} ({} CPUs)",
        b.csv.name(),
        b.config.file_bytes >> 20,
        s.profile.name,
        iommu_label(s),
        s.cpus
    );
    Ok(LabRun {
        report: report(s, title, runs, text, measurements),
        fio: None,
        seed: base,
        dma_maps: None,
    })
}

/// The metrics of one re-aim row (user count `u`), named `reaim.users{u}.*`: the re-aim
/// table's columns and the children's I/O-path system time.
fn reaim_row_metrics(
    m: Measurement,
    row: &crate::workloads::reaim::ReaimRow,
    t: &crate::workloads::reaim::TaskTotals,
) -> Measurement {
    let u = row.forked;
    let name = |what: &str| format!("reaim.users{u}.{what}");
    m.metric(Metric::new(name("jpm"), "jobs/min", row.jpm))
        .metric(Metric::new(name("parent_time_s"), "s", row.parent_time))
        .metric(Metric::new(name("jti"), "index", f64::from(row.jti)))
        .metric(Metric::new(name("child_sys_s"), "s", row.child_sys))
        .metric(Metric::new(name("child_user_s"), "s", row.child_user))
        .metric(Metric::new(
            name("jpm_per_child"),
            "jobs/min",
            row.jpm_per_child,
        ))
        .metric(Metric::new(name("std_dev_time_s"), "s", row.std_dev_time))
        .metric(Metric::new(name("std_dev_pct"), "%", row.std_dev_pct))
        .metric(Metric::new(name("io_sys_s"), "s", t.io_sys as f64 * 1e-9))
}

fn run_reaim(
    s: &LabScenario,
    r: &spec::ReaimSetup,
    d: &spec::ScsiSetup,
    base: u64,
    runs: u32,
) -> Result<LabRun, LabError> {
    let mut text = String::new();
    let mut measurements = Vec::new();
    let first = r.users.first().copied().unwrap_or(0);
    let last = r.users.last().copied().unwrap_or(0);
    for run in 0..runs {
        let seed = run_seed(base, run);
        let out = reaim::run_reaim(s, r, d, seed)?;
        let config = config_id(s, run, runs);
        let max = out.rows.iter().map(|x| x.jpm).fold(0.0, f64::max);
        let jti = out.rows.iter().map(|x| x.jti).min().unwrap_or(0);
        let mut m = base_attrs(s, Measurement::new(&config))
            .attr("workload", "reaim")
            .attr("workfile", &r.workfile.name)
            .attr("virt_merge", d.limits.virt_merge_granule.is_some())
            .attr(
                "users",
                format!(
                    "{first}..={last} step {}",
                    r.users.get(1).map_or(1, |u| u - first)
                ),
            )
            .attr("threads", last)
            .attr("seed", seed)
            .attr("run", run)
            .cpu(out.cpu)
            .metric(Metric::new("reaim.max_jpm", "jobs/min", max))
            .metric(Metric::new("reaim.min_jti", "index", f64::from(jti)));
        for (row, t) in out.rows.iter().zip(&out.totals) {
            m = reaim_row_metrics(m, row, t);
        }
        let q = &out.scsi;
        m = m
            .metric(Metric::new("scsi.requests", "count", q.requests as f64))
            .metric(Metric::new(
                "scsi.dma_segments_per_request",
                "count",
                per(q.dma_segments as f64, q.requests),
            ))
            .metric(Metric::new(
                "scsi.iommu_cpu_ns_per_request",
                "ns",
                per(q.iommu_cpu_ns as f64, q.requests),
            ))
            .metric(Metric::new("disk.busy_pct", "%", out.disk_busy_pct))
            .metric(Metric::new(
                "lock.contended",
                "count",
                out.lock_contended as f64,
            ));
        m = with_protection(m, &out.protection);
        if runs > 1 {
            let _ = writeln!(text, "[run {run}, seed {seed}]");
        }
        text.push_str(&crate::workloads::reaim::format_table(&out.rows, &[]));
        let _ = writeln!(
            text,
            "disk: requests={}, dma segments/request={:.2}, iommu cpu/request={:.0}ns, busy={:.1}%",
            q.requests,
            per(q.dma_segments as f64, q.requests),
            per(q.iommu_cpu_ns as f64, q.requests),
            out.disk_busy_pct
        );
        let _ = writeln!(text, "protection: {}", protection_line(&out.protection));
        measurements.push(m);
    }
    let title = format!(
        "re-aim-like, workfile {} (weight {}), {first}..={last} users on a SCSI disk ({}), {} ({} CPUs)",
        r.workfile.name,
        r.workfile.weight_sum(),
        s.profile.name,
        iommu_label(s),
        s.cpus
    );
    Ok(LabRun {
        report: report(s, title, runs, text, measurements),
        fio: None,
        seed: base,
        dma_maps: None,
    })
}

/// The direct-DMA receive test (x86 IOMMUs or none) `runs` times from seed `base`: an
/// iperf-like table, and per run the throughput, the IOTLB misses and page-table reads per
/// 4 KiB received, the DMA engine's and CPUs' busy shares.
fn run_direct_rx(
    s: &LabScenario,
    d: &spec::DirectRx,
    link: crate::devices::nic::LinkConfig,
    base: u64,
    runs: u32,
) -> Result<LabRun, LabError> {
    if let Some(tx) = d.send {
        return run_direct_tx(s, d, tx, link, base, runs);
    }
    let c = &d.config;
    let secs = (c.run_ns - c.warmup_ns) as f64 / 1e9;
    let mut text = String::new();
    let _ = writeln!(
        text,
        "TCP RECEIVE TEST (lab, iperf-like): {} flows, {:.0} Gb/s link, MTU {} B, {} receive buffers per queue, {}",
        c.flows,
        link.gbps,
        c.frame_bytes - crate::workloads::rx_stream::ETH_HEADER_BYTES,
        c.ring_pages,
        iommu_label(s)
    );
    let _ = writeln!(
        text,
        "Elapsed  Throughput  IOTLB misses  walk reads  DMA busy  CPU busy  drops"
    );
    let _ = writeln!(
        text,
        "secs.    Gb/s        per 4 KiB     per 4 KiB   %         %         packets"
    );
    let mut measurements = Vec::new();
    for r in 0..runs {
        let seed = run_seed(base, r);
        let (out, protection) = net::run_direct_rx(s, d, link)?;
        let per_4k = |n: u64| per(n as f64 * 4096.0, out.rx_bytes);
        let receive = [
            ("net.packets", "count", out.packets as f64),
            ("net.drops", "count", out.drops as f64),
            (
                "net.drop_pct",
                "%",
                per(out.drops as f64 * 100.0, out.packets + out.drops),
            ),
            ("net.retransmits", "count", out.retransmits as f64),
            ("net.out_of_order", "count", out.out_of_order as f64),
            ("net.acks_per_4k", "count", per_4k(out.acks)),
            ("net.immediate_acks", "count", out.immediate_acks as f64),
            (
                "net.packets_per_poll",
                "count",
                per(out.polled_packets as f64, out.polls),
            ),
            (
                "net.max_packets_per_poll",
                "count",
                out.max_poll_packets as f64,
            ),
            (
                "iotlb.full_walks_per_4k",
                "count",
                per_4k(out.translation.full_walks),
            ),
            ("net.rx_cache_reuse", "count", out.cache_reuse as f64),
            ("net.rx_cache_busy", "count", out.cache_busy as f64),
            ("net.rx_cache_empty", "count", out.cache_empty as f64),
            ("net.rx_cache_full", "count", out.cache_full as f64),
            (
                "net.rx_usecs_per_interrupt",
                "us",
                per(out.interrupt_usecs as f64, out.interrupts),
            ),
        ];
        let head = nic_head(
            s,
            c,
            "read",
            (seed, r, runs),
            out.throughput_gbps,
            out.cpu_busy_pct,
        );
        let m = receive.into_iter().fold(head, |m, (name, unit, v)| {
            m.metric(Metric::new(name, unit, v))
        });
        let m = nic_metrics(
            m,
            [out.cpu_busy_pct, out.link_busy_pct, out.dma_busy_pct],
            &out.dma_work,
            &out.translation,
            [out.iotlb_misses_per_4k(), out.walk_reads_per_4k()],
        );
        let m = with_protection(m, &protection);
        let _ = writeln!(
            text,
            "{:<8.3} {:<11.2} {:<13.2} {:<11.2} {:<9.1} {:<9.1} {}",
            secs,
            out.throughput_gbps,
            out.iotlb_misses_per_4k(),
            out.walk_reads_per_4k(),
            out.dma_busy_pct,
            out.cpu_busy_pct,
            out.drops
        );
        measurements.push(m);
    }
    let title = format!(
        "iperf-like TCP receive, {} flows on a {:.0} Gb/s NIC (direct DMA), {} ({} CPUs)",
        c.flows, link.gbps, s.profile.name, s.cpus
    );
    Ok(LabRun {
        report: report(s, title, runs, text, measurements),
        fio: None,
        seed: base,
        dma_maps: None,
    })
}

/// The start of a direct-DMA NIC test's measurement: its attributes (`direction`, flows,
/// `(seed, run, runs)`), throughput and CPU breakdown.
fn nic_head(
    s: &LabScenario,
    c: &crate::workloads::rx_stream::RxStreamConfig,
    direction: &str,
    (seed, r, runs): (u64, u32, u32),
    throughput_gbps: f64,
    cpu_busy_pct: f64,
) -> Measurement {
    base_attrs(s, Measurement::new(config_id(s, r, runs)))
        .attr("workload", "netperf")
        .attr("direction", direction)
        .attr("flows", c.flows)
        .attr("threads", c.flows)
        .attr("seed", seed)
        .attr("run", r)
        .metric(Metric::new("net.throughput_gbps", "Gb/s", throughput_gbps))
        .cpu(direct_cpu(cpu_busy_pct, c, s.cpus))
}

/// The metrics a direct-DMA NIC test's measurement ends with: the CPUs', wire's and DMA
/// engine's busy shares (`busy`), the driver's syncs (`work`), and the device's IOTLB
/// figures (`t`, and its misses and walk reads per 4 KiB moved).
fn nic_metrics(
    m: Measurement,
    busy: [f64; 3],
    work: &iolab_iommu::work::WorkRecord,
    t: &iolab_iommu::work::WorkRecord,
    per_4k: [f64; 2],
) -> Measurement {
    let lookups = t.iotlb_hits + t.iotlb_misses;
    m.metric(Metric::new("cpu.busy_pct", "%", busy[0]))
        .metric(Metric::new("link.busy_pct", "%", busy[1]))
        .metric(Metric::new("dma.engine_busy_pct", "%", busy[2]))
        .metric(Metric::new(
            "dma.inval_syncs",
            "count",
            work.inval_syncs as f64,
        ))
        .metric(Metric::new("iotlb.misses_per_4k", "count", per_4k[0]))
        .metric(Metric::new("iotlb.walk_reads_per_4k", "count", per_4k[1]))
        .metric(Metric::new(
            "iotlb.hit_pct",
            "%",
            per(t.iotlb_hits as f64 * 100.0, lookups),
        ))
        .metric(Metric::new("iotlb.misses", "count", t.iotlb_misses as f64))
        .metric(Metric::new(
            "iotlb.walk_reads",
            "count",
            t.walk_reads as f64,
        ))
}

/// The CPU breakdown of a direct-DMA test's window: the flows' CPUs busy `busy_pct` of the
/// time in the kernel (the stack, the copies and the driver's maps and unmaps all run there),
/// the machine's other CPUs idle.
fn direct_cpu(
    busy_pct: f64,
    c: &crate::workloads::rx_stream::RxStreamConfig,
    cpus: usize,
) -> crate::metrics::CpuBreakdown {
    let window = c.run_ns.saturating_sub(c.warmup_ns);
    let used = c.cpus.min(c.flows).max(1) as f64;
    let system_ns = (busy_pct / 100.0 * used * window as f64).round() as u64;
    let all = window * cpus.max(1) as u64;
    crate::metrics::CpuBreakdown {
        user_ns: 0,
        system_ns: system_ns.min(all),
        spin_ns: 0,
        idle_ns: all.saturating_sub(system_ns),
    }
}

/// The direct-DMA send test (x86 IOMMUs or none) `runs` times from seed `base`: an
/// iperf-like table, and per run the throughput, the IOTLB misses, page-table reads and
/// driver maps per 4 KiB sent, the NIC's read engine and the CPUs' busy shares.
fn run_direct_tx(
    s: &LabScenario,
    d: &spec::DirectRx,
    tx: crate::workloads::tx_stream::TxParams,
    link: crate::devices::nic::LinkConfig,
    base: u64,
    runs: u32,
) -> Result<LabRun, LabError> {
    let c = &d.config;
    let secs = (c.run_ns - c.warmup_ns) as f64 / 1e9;
    let mut text = String::new();
    let _ = writeln!(
        text,
        "TCP SEND TEST (lab, iperf-like): {} flows, {:.0} Gb/s link, MTU {} B, {} KiB TSO skbs, {}",
        c.flows,
        link.gbps,
        c.frame_bytes - crate::workloads::rx_stream::ETH_HEADER_BYTES,
        tx.tso_max_bytes / 1024,
        iommu_label(s)
    );
    let _ = writeln!(
        text,
        "Elapsed  Throughput  IOTLB misses  walk reads  maps       DMA busy  CPU busy  inval"
    );
    let _ = writeln!(
        text,
        "secs.    Gb/s        per 4 KiB     per 4 KiB   per 4 KiB  %         %         syncs"
    );
    let mut measurements = Vec::new();
    for r in 0..runs {
        let seed = run_seed(base, r);
        let (out, protection) = net::run_direct_tx(s, d, tx, link)?;
        let m = nic_head(
            s,
            c,
            "write",
            (seed, r, runs),
            out.throughput_gbps,
            out.cpu_busy_pct,
        )
        .metric(Metric::new("net.skbs", "count", out.skbs as f64))
        .metric(Metric::new("dma.maps_per_4k", "count", out.maps_per_4k()));
        let m = nic_metrics(
            m,
            [out.cpu_busy_pct, out.link_busy_pct, out.dma_busy_pct],
            &out.dma_work,
            &out.translation,
            [out.iotlb_misses_per_4k(), out.walk_reads_per_4k()],
        );
        let m = with_protection(m, &protection);
        let _ = writeln!(
            text,
            "{:<8.3} {:<11.2} {:<13.2} {:<11.2} {:<10.2} {:<9.1} {:<9.1} {}",
            secs,
            out.throughput_gbps,
            out.iotlb_misses_per_4k(),
            out.walk_reads_per_4k(),
            out.maps_per_4k(),
            out.dma_busy_pct,
            out.cpu_busy_pct,
            out.dma_work.inval_syncs
        );
        measurements.push(m);
    }
    let title = format!(
        "iperf-like TCP send, {} flows on a {:.0} Gb/s NIC (direct DMA), {} ({} CPUs)",
        c.flows, link.gbps, s.profile.name, s.cpus
    );
    Ok(LabRun {
        report: report(s, title, runs, text, measurements),
        fio: None,
        seed: base,
        dma_maps: None,
    })
}

fn run_netperf(
    s: &LabScenario,
    n: &spec::NetperfSetup,
    link: crate::devices::nic::LinkConfig,
    base: u64,
    runs: u32,
) -> Result<LabRun, LabError> {
    use crate::workloads::netperf::StreamDirection;
    if let Some(d) = &n.direct {
        return run_direct_rx(s, d, link, base, runs);
    }
    let dir = match n.stream.direction {
        StreamDirection::Write => "write",
        StreamDirection::Read => "read",
    };
    let secs = (n.stream.run_ns - n.stream.warmup_ns) as f64 / 1e9;
    let mut text = String::new();
    let _ = writeln!(
        text,
        "TCP STREAM TEST (lab): {dir}, {} threads, {:.0} Gb/s link, {}",
        n.stream.threads,
        link.gbps,
        iommu_label(s)
    );
    let _ = writeln!(text, "Message  Elapsed  Throughput    Latency  CPU     CPU");
    let _ = writeln!(
        text,
        "Size     Time     10^6bits/sec  avg      util    spin"
    );
    let _ = writeln!(text, "bytes    secs.                  us       %       %");
    let mut measurements = Vec::new();
    for r in 0..runs {
        let seed = run_seed(base, r);
        let (out, protection) = net::run_netperf(s, seed)?;
        let config = config_id(s, r, runs);
        let messages =
            (out.dma.device_bytes as f64 / n.stream.message_bytes.max(1) as f64).max(1.0);
        let tce = out.tce_figures(n.stream.message_bytes, n.stream.run_ns);
        let m = base_attrs(s, Measurement::new(&config))
            .attr("workload", "netperf")
            .attr("direction", dir)
            .attr("threads", n.stream.threads)
            .attr("message_bytes", n.stream.message_bytes)
            .attr("seed", seed)
            .attr("run", r)
            .cpu(out.cpu)
            .metric(Metric::new(
                "net.throughput_gbps",
                "Gb/s",
                out.throughput_gbps,
            ))
            .metric(Metric::new(
                "net.latency_mean_us",
                "us",
                out.mean_latency_us,
            ))
            .metric(Metric::new("net.messages", "count", out.messages as f64))
            .metric(Metric::new("cpu.busy_pct", "%", out.busy_pct))
            .metric(Metric::new("cpu.spin_pct", "%", out.spin_pct))
            .metric(Metric::new("link.busy_pct", "%", out.link_busy_pct))
            .metric(Metric::new(
                "dma.hypercalls_per_msg",
                "count",
                out.dma.hypercalls as f64 / messages,
            ))
            .metric(Metric::new(
                "dma.tces_per_msg",
                "count",
                out.dma.tces as f64 / messages,
            ))
            // The TCE path's pool and hypervisor locks and window occupancy, under the
            // pseries-ddw experiment's names.
            .metric(Metric::new(
                "tce.pool_lock_wait_ms",
                "ms",
                tce.pool_lock_wait_ms,
            ))
            .metric(Metric::new(
                "tce.hv_table_wait_ms",
                "ms",
                tce.hv_table_wait_ms,
            ))
            .metric(Metric::new(
                "tce.hv_table_busy_pct",
                "%",
                tce.hv_table_busy_pct,
            ))
            .metric(Metric::new("tce.window_peak_pct", "%", tce.window_peak_pct))
            .metric(Metric::new(
                "tce.large_pool_peak_pct",
                "%",
                tce.large_pool_peak_pct,
            ));
        // netperf's output is its table: the report is in the measurement.
        let m = with_protection(m, &protection);
        let _ = writeln!(
            text,
            "{:<8} {:<8.3} {:<13.2} {:<8.1} {:<7.1} {:.1}",
            n.stream.message_bytes,
            secs,
            out.throughput_gbps * 1000.0,
            out.mean_latency_us,
            out.busy_pct,
            out.spin_pct
        );
        measurements.push(m);
    }
    let title = format!(
        "netperf-like TCP stream, {dir}, {} threads x {} B on a {:.0} Gb/s NIC ({}), {} ({} CPUs)",
        n.stream.threads,
        n.stream.message_bytes,
        link.gbps,
        s.profile.name,
        iommu_label(s),
        s.cpus
    );
    Ok(LabRun {
        report: report(s, title, runs, text, measurements),
        fio: None,
        seed: base,
        dma_maps: None,
    })
}

/// The line a fio run with `steadystate` prints: attained or not, and what was measured.
fn steadystate_note(
    o: &block::SteadyStateOutcome,
    ss: &crate::workloads::fio::SteadyState,
) -> String {
    let ms = |ns: u64| ns as f64 / 1e6;
    let limit = if ss.percent {
        format!("{}%", ss.limit)
    } else {
        format!("{}", ss.limit)
    };
    let value = if ss.percent {
        format!("{:.3}%", o.criterion)
    } else {
        format!("{:.1}", o.criterion)
    };
    match o.attained_at_ns {
        Some(at) => format!(
            "steadystate  : {}:{limit} attained at {} ms ({value} over the last {} ms, sampled every {} ms); the job ended there and those {} ms were measured",
            ss.criterion.name(),
            ms(at),
            ms(ss.dur_ns),
            ms(ss.interval_ns),
            ms(ss.dur_ns)
        ),
        None => format!(
            "steadystate  : {}:{limit} not attained within the runtime (last {value} over {} ms); the window after ramp_ms was measured",
            ss.criterion.name(),
            ms(ss.dur_ns)
        ),
    }
}

/// The note a fio run prints when the lab moved its window past a transient.
fn extended_note(w: &block::WindowUse) -> String {
    let ms = |ns: u64| ns as f64 / 1e6;
    format!(
        "window       : ramp extended from {} ms to {} ms: the first {} ms after the ramp were a \
         transient (caches, magazines, flush queues or device queues warming); the window \
         after it is {} (workload.exact_window = true measures right after ramp_ms)",
        ms(w.asked_ramp_ns),
        ms(w.ramp_ns),
        ms(w.transient_ns()),
        if w.steady {
            "steady"
        } else {
            "still not steady"
        }
    )
}

/// What a run whose window is not steady can do about it.
#[derive(Clone, Copy)]
enum Remedy {
    /// `exact_window` kept the window: drop it or lengthen the ramp.
    ExactWindow,
    /// The lab's extension found no steady window.
    Extension,
    /// fio's `steadystate` was not attained.
    SteadyState,
}

/// The note a fio run prints when its measured window was not in steady state.
fn unsteady_note(
    h: &block::WindowHalves,
    job: &crate::workloads::fio::FioJob,
    remedy: Remedy,
) -> String {
    let half_s = job.runtime.as_ns() as f64 / 2e9;
    let iops = |n: u64| crate::workloads::fio::human_iops(n as f64 / half_s.max(1e-12));
    let what = match remedy {
        Remedy::ExactWindow => {
            "lengthen ramp_ms, or drop workload.exact_window so the lab finds the steady window"
        }
        Remedy::Extension => {
            "no steady window within the lab's extension of the ramp; lengthen ramp_ms"
        }
        Remedy::SteadyState => {
            "its steadystate criterion was not attained; lengthen runtime_ms or ramp_ms"
        }
    };
    format!(
        "steady state : no: IOPS={} in the first half of the measured window, {} in the second \
         ({:+.1}%); the IOVA tree lock was taken {} then {} times; {what} \
         (docs/model/scale.md)",
        iops(h.ios[0]),
        iops(h.ios[1]),
        h.iops_change_pct(),
        h.tree_allocs[0],
        h.tree_allocs[1]
    )
}

/// Runs the kernel's DMA-mapping benchmark (docs/SCENARIOS.md, `dma_map_benchmark`).
fn run_map_benchmark(
    s: &LabScenario,
    b: &spec::DmaMapBenchmarkSetup,
    base: u64,
    runs: u32,
) -> Result<LabRun, LabError> {
    let mut text = String::new();
    let mut measurements = Vec::new();
    let mut dma_maps = 0u64;
    for r in 0..runs {
        let seed = run_seed(base, r);
        let out = map_bench::run(s, b, seed)?;
        dma_maps += out.dma.maps;
        let m = base_attrs(s, Measurement::new(config_id(s, r, runs)))
            .attr("workload", "dma_map_benchmark")
            .attr("threads", b.threads)
            .attr("granule", b.granule)
            .attr("direction", b.dir.tool_name())
            .attr("dma_trans_ns", b.dma_trans_ns)
            .attr("seed", seed)
            .attr("run", r)
            .cpu(out.cpu);
        let m = map_bench::metrics(m, b, &out.sums);
        let m = dma_metrics::invalidations(m, &out.dma);
        let mut m = dma_metrics::iova_tree_lock(m, out.tree_lock);
        if let Some(q) = &out.cmdq {
            m = dma_metrics::cmdq_core(m, "cmdq", q);
            m = dma_metrics::cmdq_reservations(m, q);
        }
        m = with_protection(m, &out.protection);
        if runs > 1 {
            let _ = writeln!(text, "[run {r}, seed {seed}]");
        }
        text.push_str(&map_bench::tool_text(b, &out.sums));
        let _ = writeln!(
            text,
            "  iommu        : {}, loops={}, syncs={}, fq flushes={}, iova tree lock {} of {} contended",
            iommu_label(s),
            out.sums.loops,
            out.dma.inval_syncs,
            out.dma.flush_queue_flushes,
            out.tree_lock.1,
            out.tree_lock.0
        );
        if let Some(q) = out.cmdq.filter(|q| q.cas_attempts > 0) {
            let _ = writeln!(
                text,
                "  cmdq         : {} reservations, {} cmpxchg attempts ({} failed, 1 in {:.2} succeeds), {:.0} ns sync wait per unmap",
                q.cas_attempts - q.cas_failures,
                q.cas_attempts,
                q.cas_failures,
                q.cas_attempts as f64 / (q.cas_attempts - q.cas_failures).max(1) as f64,
                per(q.sync_wait_ns as f64, q.issues)
            );
        }
        let _ = writeln!(
            text,
            "  protection   : {}",
            protection_line(&out.protection)
        );
        measurements.push(m);
    }
    let title = format!(
        "dma_map_benchmark threads={} granule={} dir={} on {} ({}), {} {} ({} CPUs)",
        b.threads,
        b.granule,
        b.dir.tool_name(),
        s.devices.kind(),
        s.profile.name,
        s.iommu.model.name(),
        s.iommu.mode.name(),
        s.cpus
    );
    Ok(LabRun {
        report: report(s, title, runs, text, measurements),
        fio: None,
        seed: base,
        dma_maps: Some(dma_maps),
    })
}

fn run_fio(s: &LabScenario, f: &spec::FioSetup, base: u64, runs: u32) -> Result<LabRun, LabError> {
    let mut text = String::new();
    let mut jobs: Vec<JobJson> = Vec::new();
    let mut measurements = Vec::new();
    let mut dma_maps = 0u64;
    for r in 0..runs {
        let seed = run_seed(base, r);
        let out = block::run_fio(s, f, seed)?;
        dma_maps += out.dma.maps;
        let config = if runs == 1 {
            s.name.clone()
        } else {
            format!("{}#{r}", s.name)
        };
        let m = crate::workloads::fio::measurement(
            &config,
            &out.job,
            &out.stats,
            out.json.usr_cpu,
            out.json.sys_cpu,
        );
        let mut m = base_attrs(s, m)
            .attr("threads", f.numjobs)
            .attr("seed", seed)
            .attr("run", r)
            .cpu(out.cpu);
        m = dma_metrics::map_path_and_irqs(m, &out.dma);
        m = dma_metrics::iova_variants(m, &out.dma);
        m = dma_metrics::iova_tree_lock(m, out.tree_lock);
        m = dma_metrics::iova_depot_lock(m, out.depot_lock);
        m = m
            .metric(Metric::new(
                "window.iops_change_pct",
                "%",
                out.halves.iops_change_pct(),
            ))
            .metric(Metric::new(
                "window.ramp_ms",
                "ms",
                out.window.ramp_ns as f64 / 1e6,
            ))
            .metric(Metric::new(
                "window.transient_ms",
                "ms",
                out.window.transient_ns() as f64 / 1e6,
            ))
            .metric(Metric::new(
                "window.steady",
                "bool",
                f64::from(u8::from(out.window.steady)),
            ));
        if let Some(o) = &out.steadystate {
            m = m
                .metric(Metric::new(
                    "steadystate.attained",
                    "bool",
                    f64::from(u8::from(o.attained_at_ns.is_some())),
                ))
                .metric(Metric::new(
                    "steadystate.criterion",
                    if f.steadystate.is_some_and(|s| s.percent) {
                        "%"
                    } else {
                        "value"
                    },
                    if o.criterion.is_finite() {
                        o.criterion
                    } else {
                        -1.0
                    },
                ));
            if let Some(at) = o.attained_at_ns {
                m = m.metric(Metric::new(
                    "steadystate.attained_ms",
                    "ms",
                    at as f64 / 1e6,
                ));
            }
        }
        if out.iotlb {
            m = dma_metrics::iotlb(m, &out.dma);
        }
        if let Some(q) = &out.cmdq {
            m = dma_metrics::cmdq_detail(dma_metrics::cmdq_core(m, "cmdq", q), q);
            if !s.iommu.uses_x86_queue() {
                let (acq, ctd, wait) = out.cmdq_lock;
                m = m.metrics(&[
                    ("lock.cmdq.acquisitions", "count", acq as f64),
                    ("lock.cmdq.contended", "count", ctd as f64),
                    ("lock.cmdq.wait_ns", "ns", wait as f64),
                ]);
            } else {
                // VT-d: FSTS reads while polling; AMD-Vi: udelay(1) steps.
                m = m.metric(Metric::new(
                    "cmdq.wait_polls",
                    "count",
                    per(q.cons_reads as f64, q.syncs),
                ));
            }
        }
        if out.queues.len() > 1 {
            // Several IOMMU instances: each queue's own figures (the `cmdq.*` above are
            // their sums).
            for (k, q) in out.queues.iter().enumerate() {
                m = dma_metrics::cmdq_core(m, &format!("cmdq.instance{k}"), q);
            }
        }
        m = with_protection(m, &out.protection);
        // A hostile device (`[device.hostile]`): what it reached, and over SMMUv3 what its
        // faults did to the event queue.
        if let Some(e) = &out.exposure {
            m = crate::metrics::protection::counts(m, &e.metrics());
        }
        if let Some(q) = &out.events {
            m = crate::metrics::protection::counts(
                m,
                &[
                    ("faults.event_queue_overflows", "count", q.overflows),
                    ("faults.events_written", "count", q.written),
                    ("faults.events_lost", "count", q.lost),
                ],
            );
        }
        m = dma_metrics::cpu_shares(m, &out.cpu);
        if runs > 1 {
            let _ = writeln!(text, "[run {r}, seed {seed}]");
        }
        text.push_str(&crate::workloads::fio::summary_text(&out.job, &out.json));
        let _ = writeln!(
            text,
            "  iommu        : {}, maps={}, map={:.0}ns, unmap={:.0}ns, syncs={}, fq flushes={}, irq cpus={}",
            iommu_label(s),
            out.dma.maps,
            per(out.dma.map_ns, out.dma.maps),
            per(out.dma.unmap_ns, out.dma.unmaps),
            out.dma.inval_syncs,
            out.dma.flush_queue_flushes,
            out.irq_cpus
        );
        let d = &out.dma;
        if d.iova_32bit_failures | d.iova_full_range_allocs | d.iova_tree_retries != 0 {
            let _ = writeln!(
                text,
                "  iova         : 32-bit tries failed={}, full-range allocs={}, tree retries={} (kernel {})",
                d.iova_32bit_failures,
                d.iova_full_range_allocs,
                d.iova_tree_retries,
                s.iommu.kernel.kernel
            );
        }
        if out.queues.len() > 1 {
            let per_instance: Vec<String> = out
                .queues
                .iter()
                .enumerate()
                .map(|(k, q)| {
                    format!(
                        "#{k} {} cmds, {:.0}ns sync wait/issue",
                        q.commands,
                        per(q.sync_wait_ns as f64, q.issues)
                    )
                })
                .collect();
            let _ = writeln!(text, "  instances    : {}", per_instance.join("; "));
        }
        if let Some(line) = iommu_time_line(&out) {
            let _ = writeln!(text, "  iommu time   : {line}");
        }
        if out.iotlb {
            let d = &out.dma;
            let _ = writeln!(
                text,
                "  iotlb        : hits={}, misses={}, stale hits={}, walk reads={} ({:.2}/io)",
                d.iotlb_hits,
                d.iotlb_misses,
                d.iotlb_stale_hits,
                d.walk_reads,
                per(d.walk_reads as f64, d.translated_ios)
            );
        }
        let _ = writeln!(
            text,
            "  protection   : {}",
            protection_line(&out.protection)
        );
        if let Some(e) = &out.exposure {
            let _ = writeln!(
                text,
                "  hostile      : stale reads={}/{}, stale writes={}/{}, neighbour bytes readable={}, writable={}{}",
                e.stale_reads,
                e.stale_read_attempts,
                e.stale_writes,
                e.stale_write_attempts,
                e.neighbour_readable_bytes,
                e.neighbour_writable_bytes,
                out.events.map_or(String::new(), |q| format!(
                    ", event records written={}, lost={}, overflows={}",
                    q.written, q.lost, q.overflows
                ))
            );
        }
        if let (Some(o), Some(ss)) = (&out.steadystate, &f.steadystate) {
            let _ = writeln!(text, "  {}", steadystate_note(o, ss));
        }
        if out.window.transient_ns() > 0 {
            let _ = writeln!(text, "  {}", extended_note(&out.window));
        }
        if !out.halves.is_steady() {
            let remedy = if f.steadystate.is_some() {
                Remedy::SteadyState
            } else if f.exact_window {
                Remedy::ExactWindow
            } else {
                Remedy::Extension
            };
            let _ = writeln!(text, "  {}", unsteady_note(&out.halves, &out.job, remedy));
        }
        jobs.push(JobJson {
            jobname: config,
            ..out.json
        });
        measurements.push(m);
    }
    let title = format!(
        "fio {} bs={} iodepth={} numjobs={} on {} x{} ({}), {} {} ({} CPUs)",
        f.rw.name(),
        f.bs,
        f.iodepth,
        f.numjobs,
        s.devices.kind(),
        s.devices.len(),
        s.profile.name,
        s.iommu.model.name(),
        s.iommu.mode.name(),
        s.cpus
    );
    Ok(LabRun {
        report: report(s, title, runs, text, measurements),
        fio: Some(FioJson { jobs }),
        seed: base,
        dma_maps: Some(dma_maps),
    })
}

/// Where a fio run's IOMMU time went, for the fio text's `iommu time` line: the CPU time
/// spent spinning per lock (share of all CPU time in the window), the mean sync wait per
/// queue issue, and walk reads per translated I/O; `None` when there is none of these.
fn iommu_time_line(out: &block::FioRun) -> Option<String> {
    let c = &out.cpu;
    let total = (c.user_ns + c.system_ns + c.spin_ns + c.idle_ns).max(1) as f64;
    let mut parts = Vec::new();
    let spun: u64 = out.spin_by_lock.iter().map(|(_, ns)| ns).sum();
    if spun > 0 {
        let locks: Vec<String> = out
            .spin_by_lock
            .iter()
            .take(3)
            .map(|(name, ns)| format!("{name} {:.1}%", 100.0 * *ns as f64 / total))
            .collect();
        parts.push(format!(
            "spin {:.1}% of all CPU time ({})",
            100.0 * spun as f64 / total,
            locks.join(", ")
        ));
    }
    let (wait, issues) = out
        .queues
        .iter()
        .fold((0u64, 0u64), |(w, n), q| (w + q.sync_wait_ns, n + q.issues));
    if issues > 0 {
        parts.push(format!(
            "sync wait {:.0} ns per issue",
            wait as f64 / issues as f64
        ));
    }
    if out.iotlb && out.dma.translated_ios > 0 {
        parts.push(format!(
            "walk reads {:.2} per I/O",
            out.dma.walk_reads as f64 / out.dma.translated_ios as f64
        ));
    }
    (!parts.is_empty()).then(|| parts.join(", "))
}
