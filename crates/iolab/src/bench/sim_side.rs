//! The lab's own speed: how many simulated I/Os the deterministic lab runs per second of host
//! time, and how much host memory a large simulated machine takes.
//!
//! Each row runs the smmuv3-cmdq experiment's `d05_nvme.lockfree` cell (fio 4 KiB random
//! reads on one NVMe SSD, every I/O mapped and unmapped through a strict SMMUv3 domain with
//! an LPAE table, the Linux IOVA tree behind per-CPU magazines, and the lock-free SMMUv3
//! command queue, on the HiSilicon D05 profile) through the lab (`lab::validate` and
//! `lab::run`, as `iolab run` does), the cell's scenario taken from the bundled experiment
//! file and scaled: one fio job per virtual CPU, iodepth 32. A short pilot run
//! measures the simulated I/O rate so that the timed run simulates about the requested
//! number of I/Os whatever the CPU count. The engine is single-threaded, so host time is the
//! on-CPU time of the running thread (`utime + stime` of /proc/thread-self/stat, 10 ms
//! ticks), which does not count time the loaded host gave to other processes; the wall
//! time is reported beside it.
//!
//! One more row, `sim/fio-nvme-strict/64`, measures a user's scenario on the same path: the bundled
//! example `fio-nvme-strict` scaled to 64 virtual CPUs and 64 fio jobs, run through the same
//! `lab::validate` and `lab::run` that `iolab run` calls, for 600 ms of virtual time (60 ms
//! when quick; about 470,000 and 52,000 simulated I/Os).

use std::time::Instant;

use iolab_iommu::mem::PhysMemory;
use iolab_sim::lab::{self, LabOptions};
use iolab_sim::reproduce::{bundled, Experiment};
use iolab_sim::tomlpatch;

/// The scenario name used in the row names.
pub const SCENARIO: &str = "nvme-randread-strict";

/// The bundled experiment and its cell the rows scale.
pub const CELL: (&str, &str) = ("smmuv3-cmdq", "d05_nvme.lockfree");

/// Virtual CPU counts the rows are run at.
pub const CPU_COUNTS: [usize; 4] = [1, 16, 64, 256];

/// The CPU count at which peak memory is measured (with 1 TiB of simulated RAM).
pub const RSS_CPUS: usize = 64;

/// The bundled example the lab-path row runs (`sim/<LAB_SCENARIO>/<LAB_CPUS>`).
pub const LAB_SCENARIO: &str = "fio-nvme-strict";

/// Virtual CPUs (and fio jobs) of the lab-path row.
pub const LAB_CPUS: usize = 64;

/// One row's result.
#[derive(Debug, Clone)]
pub struct SimFigure {
    /// Virtual CPUs.
    pub cpus: usize,
    /// Simulated I/Os (DMA maps, one per I/O) in the timed run.
    pub ios: u64,
    /// Host nanoseconds (on-CPU time of the thread) per simulated I/O.
    pub ns_per_io: f64,
    /// Host wall-clock nanoseconds per simulated I/O (includes time the loaded host gave to
    /// other processes).
    pub wall_ns_per_io: f64,
    /// Simulated I/Os per host (on-CPU) second.
    pub ios_per_host_sec: f64,
    /// Peak resident memory of the process during the run, MB (10^6 bytes), if measured.
    pub peak_rss_mb: Option<f64>,
}

impl SimFigure {
    /// The figures of a run of `ios` simulated I/Os (at least 1 counted) that took `secs`
    /// of host CPU and `wall` seconds of wall-clock time.
    fn new(cpus: usize, ios: u64, secs: f64, wall: f64, peak_rss_mb: Option<f64>) -> Self {
        let ios = ios.max(1);
        Self {
            cpus,
            ios,
            ns_per_io: secs * 1e9 / ios as f64,
            wall_ns_per_io: wall * 1e9 / ios as f64,
            ios_per_host_sec: ios as f64 / secs.max(1e-9),
            peak_rss_mb,
        }
    }
}

/// The scenario of [`CELL`] with `cpus` virtual CPUs, one fio job per CPU, `runtime_ms`
/// measured after a 1 ms ramp.
fn scenario(cpus: usize, runtime_ms: u64) -> Result<String, String> {
    let (name, cell_id) = CELL;
    let text = bundled::text(name).ok_or_else(|| format!("no bundled experiment {name}"))?;
    let e = Experiment::parse(text, &bundled::origin(name)).map_err(|e| e.to_string())?;
    let cell = e
        .file
        .cells()
        .into_iter()
        .find(|c| c.id == cell_id)
        .ok_or_else(|| format!("experiment {name} has no cell {cell_id}"))?;
    let mut t = e.cell_table(&cell, 1).map_err(|e| e.to_string())?;
    for (path, v) in [
        ("machine.cpus", cpus as u64),
        ("workload.numjobs", cpus as u64),
        ("workload.first_cpu", 0),
        ("workload.runtime_ms", runtime_ms),
        ("workload.ramp_ms", 1),
    ] {
        let steps = tomlpatch::parse_path(path)?;
        tomlpatch::set_field(&mut t, &steps, toml::Value::Integer(v as i64), true)
            .map_err(|e| format!("{name} cell {cell_id}: {path}: {e}"))?;
    }
    t.insert("name".into(), toml::Value::String("lab-speed".into()));
    toml::to_string(&t).map_err(|e| e.to_string())
}

/// This thread's CPU time (user + system) so far, from `CLOCK_THREAD_CPUTIME_ID` (nanosecond
/// resolution; /proc/thread-self/stat counts 10 ms ticks, which over a quick run of ~0.1 s
/// moved a row in steps of ~190 ns per I/O). `None` where the clock cannot be read.
fn thread_cpu() -> Option<cpu_time::ThreadTime> {
    cpu_time::ThreadTime::try_now().ok()
}

/// Seconds of this thread's CPU time since `start`, or `wall` where the clock could not be read.
fn thread_cpu_secs_since(start: Option<cpu_time::ThreadTime>, wall: f64) -> f64 {
    match start.map(|t| t.try_elapsed()) {
        Some(Ok(d)) if !d.is_zero() => d.as_secs_f64(),
        _ => wall,
    }
}

/// One run: simulated I/Os (all DMA maps: ramp, window and drain), the measured window's
/// IOPS, host CPU seconds and wall seconds.
struct Run {
    ios: u64,
    window_iops: f64,
    cpu_secs: f64,
    wall_secs: f64,
}

/// Runs the scenario once. The CPU seconds fall back to the wall seconds if the thread CPU clock
/// cannot be read.
fn run_once(cpus: usize, runtime_ms: u64) -> Result<Run, String> {
    let text = scenario(cpus, runtime_ms)?;
    let scenario =
        lab::validate(&text, "iolab bench (scaled cell)", None).map_err(|e| e.to_string())?;
    let cpu0 = thread_cpu();
    let start = Instant::now();
    let run = lab::run(
        &scenario,
        &LabOptions {
            runs: 1,
            seed: Some(1),
        },
    )
    .map_err(|e| e.to_string())?;
    let wall = start.elapsed().as_secs_f64();
    let cpu = thread_cpu_secs_since(cpu0, wall);
    let window_iops = run
        .report
        .measurements
        .first()
        .and_then(|m| m.get("read.iops"))
        .map_or(0.0, |m| m.value);
    Ok(Run {
        ios: run.dma_maps.unwrap_or(0),
        window_iops,
        cpu_secs: cpu,
        wall_secs: wall,
    })
}

/// Reads a `Vm...:  N kB` line of /proc/self/status, in bytes.
fn status_kb(field: &str) -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with(field))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Resets the process's peak-RSS mark (`echo 5 > /proc/self/clear_refs`, Linux 4.0+).
fn reset_peak_rss() -> bool {
    std::fs::write("/proc/self/clear_refs", "5").is_ok()
}

/// Runs one row: a pilot (4 ms window) to find the simulated I/O rate, then a timed run of about
/// `target_ios` I/Os. With `measure_rss`, 1 TiB of simulated RAM is created for the run and
/// the process's peak RSS during it is reported: the peak mark is reset before the run
/// (clear_refs) so VmHWM afterwards is the run's own peak (it includes the process's
/// baseline: binary, libraries, allocator). If the reset is refused, the VmHWM delta over
/// the run is reported instead (a lower bound).
pub fn run_row(cpus: usize, target_ios: u64, measure_rss: bool) -> Result<SimFigure, String> {
    let pilot = run_once(cpus, 4)?;
    // I/Os outside the window (ramp and drain) do not scale with the window's length.
    let fixed = pilot.ios as f64 - pilot.window_iops * 4e-3;
    let per_ms = (pilot.window_iops / 1e3).max(1.0);
    let runtime_ms =
        (((target_ios as f64 - fixed).max(0.0) / per_ms).ceil() as u64).clamp(1, 10_000);

    let hwm_before = status_kb("VmHWM");
    let reset = measure_rss && reset_peak_rss();
    let memory = if measure_rss {
        Some(PhysMemory::new(1 << 40).map_err(|e| e.to_string())?)
    } else {
        None
    };
    let Run {
        ios,
        cpu_secs: secs,
        wall_secs: wall,
        ..
    } = run_once(cpus, runtime_ms)?;
    let peak = if measure_rss {
        let after = status_kb("VmHWM");
        match (reset, after, hwm_before) {
            (true, Some(a), _) => Some(a as f64 / 1e6),
            (false, Some(a), Some(b)) => Some(a.saturating_sub(b) as f64 / 1e6),
            _ => None,
        }
    } else {
        None
    };
    drop(memory);
    Ok(SimFigure::new(cpus, ios, secs, wall, peak))
}

/// The rows whose CPU count `keep` accepts: about 50,000 simulated I/Os each when `quick`,
/// 500,000 otherwise.
pub fn sim_rows(quick: bool, keep: &dyn Fn(usize) -> bool) -> Vec<Result<SimFigure, String>> {
    let target = if quick { 50_000 } else { 500_000 };
    CPU_COUNTS
        .iter()
        .filter(|&&cpus| keep(cpus))
        .map(|&cpus| run_row(cpus, target, cpus == RSS_CPUS))
        .collect()
}

/// The bundled example [`LAB_SCENARIO`] with `cpus` virtual CPUs, one fio job per CPU and
/// `runtime_ms` of measured time. Every replaced setting must be found in the example, so a
/// reworded example is an error here rather than a silently different row.
fn lab_scenario(cpus: usize, runtime_ms: u64) -> Result<String, String> {
    let mut text = lab::examples::example(LAB_SCENARIO)
        .ok_or_else(|| format!("no bundled example {LAB_SCENARIO}"))?
        .to_owned();
    for (from, to) in [
        ("cpus = 32".to_owned(), format!("cpus = {cpus}")),
        ("numjobs = 16".to_owned(), format!("numjobs = {cpus}")),
        (
            "runtime_ms = 20".to_owned(),
            format!("runtime_ms = {runtime_ms}"),
        ),
    ] {
        if !text.contains(&from) {
            return Err(format!(
                "the example {LAB_SCENARIO} no longer sets `{from}`"
            ));
        }
        text = text.replacen(&from, &to, 1);
    }
    Ok(text)
}

/// Runs the lab-path row once: [`LAB_SCENARIO`] at `cpus` for `runtime_ms`, validated and
/// run as `iolab run` does. The simulated I/Os are the DMA maps of the whole run.
pub fn lab_row(cpus: usize, runtime_ms: u64) -> Result<SimFigure, String> {
    let text = lab_scenario(cpus, runtime_ms)?;
    let scenario =
        lab::validate(&text, "iolab bench (scaled example)", None).map_err(|e| e.to_string())?;
    let cpu0 = thread_cpu();
    let start = Instant::now();
    let run = lab::run(
        &scenario,
        &LabOptions {
            runs: 1,
            seed: None,
        },
    )
    .map_err(|e| e.to_string())?;
    let wall = start.elapsed().as_secs_f64();
    let secs = thread_cpu_secs_since(cpu0, wall);
    let ios = run
        .dma_maps
        .ok_or("the lab run reported no DMA map count")?
        .max(1);
    Ok(SimFigure::new(cpus, ios, secs, wall, None))
}

/// The lab-path row at [`LAB_CPUS`]: 600 ms of virtual time, 60 ms when `quick`.
pub fn lab_rows(quick: bool) -> Result<SimFigure, String> {
    lab_row(LAB_CPUS, if quick { 60 } else { 600 })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_generated_scenario_runs_and_counts_ios() {
        let text = scenario(4, 2).expect("the cell scales");
        let t: toml::Table = text.parse().expect("TOML");
        assert_eq!(t["machine"]["cpus"].as_integer(), Some(4));
        assert_eq!(t["workload"]["numjobs"].as_integer(), Some(4));
        assert_eq!(t["iommu"]["cmdq"].as_str(), Some("lockfree"));
        let f = run_row(4, 500, false).expect("runs");
        assert!(f.ios >= 100, "{f:?}");
        assert!(f.ns_per_io > 0.0 && f.ios_per_host_sec > 0.0);
    }

    #[test]
    fn the_scaled_example_runs_at_the_asked_size_and_counts_every_map() {
        let text = lab_scenario(4, 2).expect("the example has the settings");
        assert!(text.contains("cpus = 4") && text.contains("numjobs = 4"));
        assert!(text.contains("runtime_ms = 2") && !text.contains("runtime_ms = 20"));
        let f = lab_row(4, 2).expect("runs");
        // 4 jobs at iodepth 32 over 5 ms of ramp and 2 ms measured: every I/O is one map,
        // and at least the first iodepth of each job was issued.
        assert!(f.ios >= 4 * 32, "{f:?}");
        assert!(f.ns_per_io > 0.0 && f.ios_per_host_sec > 0.0);
        // Every map of the run (ramp, window and drain) is counted: the row's I/Os are the
        // maps the run's own report prints, more than the measured window's I/Os.
        let run = lab::run_scenario(&text, "scaled.toml", &LabOptions::default()).expect("runs");
        let report = &run.report.report_text;
        let maps: u64 = report
            .split("maps=")
            .nth(1)
            .and_then(|rest| rest.split(',').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("a map count in {report}"));
        assert_eq!(f.ios, maps, "{report}");
        let window = run.fio.expect("fio JSON").jobs[0].read.total_ios;
        assert!(
            f.ios > window,
            "{} maps vs {window} I/Os in the window",
            f.ios
        );
    }
}
