//! `iolab run --format json` of an fio workload: fio's own `--output-format=json` document
//! (fio 3.x's field names and nesting), which `iolab import fio` and other fio readers read
//! back, with the lab's own figures in one extra object per job, `"iolab"`, that fio readers
//! ignore.
//!
//! What is fio's: `"fio version"`, `"jobs"` with one entry per repetition (a job group with
//! `group_reporting`: `jobname`, `groupid`, `error`, `elapsed`, `job options` (`name`, `rw`,
//! `bs`, `iodepth`, `numjobs`, `ioengine`, `runtime`, `ramp_time`, `rwmixread` for randrw, as
//! text the way fio echoes them), `read`, `write` and `trim` (`io_bytes`, `io_kbytes`,
//! `bw_bytes`, `bw`, `iops`, `runtime`, `total_ios`, `short_ios`, `drop_ios`, `slat_ns`,
//! `clat_ns` with `percentile`, `lat_ns`), `job_runtime`, `usr_cpu`, `sys_cpu`). The lab does not time submission on its own, so `slat_ns` is all zero
//! with `N` 0 (as fio writes it for a synchronous engine) and `lat_ns` equals `clat_ns`.
//! Left out (the lab measures no per-interval samples): `bw_min`/`bw_max`/`iops_*`
//! samples, `iodepth_level`, `latency_ns` buckets, `disk_util`, and the
//! counters the lab does not keep (`ctx`, `majf`, `minf`); the wall-clock `timestamp`
//! and `time` (a run's output depends only on its file and seed).
//!
//! The `"iolab"` object: `scenario`, `seed`, `run`, `attributes` (the stored measurement's,
//! typed: docs/VOCABULARY.md) and `metrics`, every metric of the run that fio's fields do not
//! carry (`dma.*`, `iotlb.*`, `cmdq.*`, `lock.*`, `window.*`, `protection.*`, `faults.*`,
//! `cpu.all.*`), each `{"value", "unit"}`.

use std::collections::BTreeMap;

use iolab_sim::lab::spec::FioSetup;
use iolab_sim::metrics::Measurement;
use iolab_sim::workloads::fio::{DirJson, JobJson};
use serde::Serialize;
use serde_json::Value;

/// Metrics that fio's own fields carry (not repeated in the `iolab` object).
fn is_fio_metric(name: &str) -> bool {
    name.starts_with("read.")
        || name.starts_with("write.")
        || name == "cpu.usr_pct"
        || name == "cpu.sys_pct"
}

/// The whole document.
#[derive(Serialize)]
pub struct FioDocument {
    /// `iolab-VERSION`: which program wrote the document.
    #[serde(rename = "fio version")]
    pub fio_version: String,
    /// One entry per repetition.
    pub jobs: Vec<Job>,
}

/// One entry of `jobs`.
#[derive(Serialize)]
pub struct Job {
    /// Job name (the scenario's name, `NAME#i` for repetition i of several).
    pub jobname: String,
    /// Always 0: one group per job.
    pub groupid: u32,
    /// 0: the run finished.
    pub error: u32,
    /// 0: nothing left to run.
    pub eta: u64,
    /// Virtual seconds of the run (ramp and measured window), rounded up.
    pub elapsed: u64,
    /// The job's options as fio echoes them (text).
    #[serde(rename = "job options")]
    pub job_options: BTreeMap<&'static str, String>,
    /// Reads.
    pub read: Dir,
    /// Writes.
    pub write: Dir,
    /// Trims (the lab issues none).
    pub trim: Dir,
    /// Measured time of all jobs, ms (fio: the sum over the group's jobs).
    pub job_runtime: u64,
    /// User CPU percent.
    pub usr_cpu: f64,
    /// System CPU percent.
    pub sys_cpu: f64,
    /// The lab's own figures, which fio readers ignore.
    pub iolab: Extra,
}

/// A latency summary (`slat_ns`, `clat_ns`, `lat_ns`).
#[derive(Serialize)]
pub struct Lat {
    /// Smallest, ns.
    pub min: u64,
    /// Largest, ns.
    pub max: u64,
    /// Mean, ns.
    pub mean: f64,
    /// Standard deviation, ns.
    pub stddev: f64,
    /// Samples.
    #[serde(rename = "N")]
    pub n: u64,
    /// Percentiles keyed as fio keys them (`"99.000000"`); `clat_ns` only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub percentile: Option<BTreeMap<String, u64>>,
}

/// `read`, `write`, `trim`.
#[derive(Serialize)]
pub struct Dir {
    /// Bytes moved.
    pub io_bytes: u64,
    /// KiB moved.
    pub io_kbytes: u64,
    /// Bandwidth, bytes/s.
    pub bw_bytes: u64,
    /// Bandwidth, KiB/s.
    pub bw: u64,
    /// I/Os per second.
    pub iops: f64,
    /// Measured time, ms (0 without I/O, as fio writes it).
    pub runtime: u64,
    /// I/Os completed.
    pub total_ios: u64,
    /// Short I/Os (0).
    pub short_ios: u64,
    /// Dropped I/Os (0).
    pub drop_ios: u64,
    /// Submission latency (not timed apart: zero, `N` 0).
    pub slat_ns: Lat,
    /// Completion latency.
    pub clat_ns: Lat,
    /// Total latency (equal to the completion latency).
    pub lat_ns: Lat,
}

/// The `iolab` object of a job.
#[derive(Serialize)]
pub struct Extra {
    /// The scenario's name.
    pub scenario: String,
    /// The repetition's seed.
    pub seed: u64,
    /// The repetition's index.
    pub run: u32,
    /// The stored measurement's attributes, typed.
    pub attributes: BTreeMap<String, Value>,
    /// The lab's metrics fio's fields do not carry.
    pub metrics: BTreeMap<String, MetricValue>,
}

/// One metric of the `iolab` object.
#[derive(Serialize)]
pub struct MetricValue {
    /// The value.
    pub value: f64,
    /// Its unit.
    pub unit: String,
}

fn zero_lat(percentiles: bool) -> Lat {
    Lat {
        min: 0,
        max: 0,
        mean: 0.0,
        stddev: 0.0,
        n: 0,
        percentile: percentiles.then(BTreeMap::new),
    }
}

fn dir(d: &DirJson) -> Dir {
    if d.total_ios == 0 {
        return Dir {
            io_bytes: 0,
            io_kbytes: 0,
            bw_bytes: 0,
            bw: 0,
            iops: 0.0,
            runtime: 0,
            total_ios: 0,
            short_ios: 0,
            drop_ios: 0,
            slat_ns: zero_lat(false),
            clat_ns: zero_lat(false),
            lat_ns: zero_lat(false),
        };
    }
    let c = &d.clat_ns;
    let lat = |percentile| Lat {
        min: c.min,
        max: c.max,
        mean: c.mean,
        stddev: c.stddev,
        n: d.total_ios,
        percentile,
    };
    Dir {
        io_bytes: d.io_bytes,
        io_kbytes: d.io_bytes >> 10,
        bw_bytes: (d.bw * 1024.0).round() as u64,
        bw: d.bw.round() as u64,
        iops: d.iops,
        runtime: d.runtime,
        total_ios: d.total_ios,
        short_ios: 0,
        drop_ios: 0,
        slat_ns: zero_lat(false),
        clat_ns: lat(Some(c.percentile.clone())),
        lat_ns: lat(None),
    }
}

/// One repetition: its fio job, its stored measurement and the scenario's fio setup.
pub struct Repetition<'a> {
    /// The fio job group the lab ran.
    pub job: &'a JobJson,
    /// The stored measurement of the repetition.
    pub measurement: &'a Measurement,
    /// The scenario's fio workload.
    pub setup: &'a FioSetup,
    /// The scenario's name.
    pub scenario: &'a str,
    /// The repetition's seed.
    pub seed: u64,
    /// The repetition's index.
    pub run: u32,
}

/// The fio JSON document of `repetitions` (one job each).
pub fn document(repetitions: &[Repetition<'_>]) -> FioDocument {
    let jobs = repetitions.iter().map(job).collect();
    FioDocument {
        fio_version: format!("iolab-{}", env!("CARGO_PKG_VERSION")),
        jobs,
    }
}

fn job(r: &Repetition<'_>) -> Job {
    let f = r.setup;
    let mut options = BTreeMap::new();
    options.insert("name", r.job.jobname.clone());
    options.insert("rw", f.rw.name().to_owned());
    options.insert("bs", f.bs.to_string());
    options.insert("iodepth", f.iodepth.to_string());
    options.insert("numjobs", f.numjobs.to_string());
    options.insert("ioengine", f.engine.kind.name().to_owned());
    for (on, option) in [
        (f.engine.hipri, "hipri"),
        (f.engine.sqthread_poll, "sqthread_poll"),
        (f.engine.fixedbufs, "fixedbufs"),
        (f.engine.registerfiles, "registerfiles"),
    ] {
        if on {
            options.insert(option, "1".to_owned());
        }
    }
    options.insert("runtime", format!("{}ms", f.runtime_ns / 1_000_000));
    options.insert("ramp_time", format!("{}ms", f.ramp_ns / 1_000_000));
    if f.rw.name() == "randrw" {
        options.insert("rwmixread", f.rwmixread.to_string());
    }
    let metrics = r
        .measurement
        .metrics
        .iter()
        .filter(|m| !is_fio_metric(&m.name))
        .map(|m| {
            (
                m.name.clone(),
                MetricValue {
                    value: m.value,
                    unit: m.unit.clone(),
                },
            )
        })
        .collect();
    let runtime_ms = f.runtime_ns / 1_000_000;
    Job {
        jobname: r.job.jobname.clone(),
        groupid: 0,
        error: 0,
        eta: 0,
        elapsed: (f.runtime_ns + f.ramp_ns).div_ceil(1_000_000_000),
        job_options: options,
        read: dir(&r.job.read),
        write: dir(&r.job.write),
        trim: dir(&DirJson::default()),
        job_runtime: runtime_ms * u64::from(f.numjobs),
        usr_cpu: r.job.usr_cpu,
        sys_cpu: r.job.sys_cpu,
        iolab: Extra {
            scenario: r.scenario.to_owned(),
            seed: r.seed,
            run: r.run,
            attributes: iolab::vocab::typed_attrs(&r.measurement.attrs),
            metrics,
        },
    }
}
