//! `iolab soak`: the long pSeries TCP write and read soak of SEEDS.md #4 in virtual time,
//! with invariant checks at intervals (see `iolab_sim::soak`), on a lab netperf scenario
//! (default: cell 64t.write.ddw of the bundled pseries-ddw experiment). It says what it
//! soaks when it starts; a progress bar with an ETA follows the checkpoints on a terminal
//! ([`crate::progress`]), and off a terminal a progress line goes to standard error at most
//! once a minute. The result is stored in the results database as one run (experiment
//! `soak`) with a measurement per direction (`soak.write`, `soak.read`).

use std::path::Path;
use std::process::ExitCode;
use std::time::{Instant, SystemTime};

use iolab_sim::experiment::ExperimentReport;
use iolab_sim::metrics::{Measurement, Metric};
use iolab_sim::soak::{
    run_soak_observed, SoakConfig, SoakDirection, SoakError, SoakReport, SoakScenario,
};

use crate::db::{NewRun, ResultsDb};

/// Which streams a soak runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Directions {
    /// The write (transmit) stream only.
    Write,
    /// The read (receive) stream only.
    Read,
    /// Write, then read, each for the whole duration.
    Both,
}

impl Directions {
    fn list(self) -> &'static [SoakDirection] {
        match self {
            Directions::Write => &[SoakDirection::Write],
            Directions::Read => &[SoakDirection::Read],
            Directions::Both => &[SoakDirection::Write, SoakDirection::Read],
        }
    }
}

/// Options of one soak, as the command line gives them.
pub struct SoakArgs<'a> {
    /// A lab scenario file with a netperf workload (default: cell 64t.write.ddw of the
    /// bundled pseries-ddw experiment).
    pub scenario: Option<&'a Path>,
    /// Virtual hours to run.
    pub hours: f64,
    /// Virtual seconds between checkpoints.
    pub interval_s: f64,
    /// Threads (default: the scenario's).
    pub threads: Option<usize>,
    /// Which streams to soak.
    pub directions: Directions,
    /// Soak the default window instead of the scenario's DDW
    /// ([`iolab_sim::soak::DEFAULT_WINDOW_PATCH`]).
    pub default_window: bool,
    /// Seed.
    pub seed: u64,
    /// JSON output.
    pub json: bool,
    /// The results database to store the soak in (`None`: `--no-db`).
    pub db: Option<&'a Path>,
}

/// The exit code of a soak that failed: 2 for the user's input, 1 for a failed run.
fn exit_code(e: &SoakError) -> u8 {
    if e.is_bad_input() {
        2
    } else {
        1
    }
}

/// How the scenario's NIC maps: through the DDW kept as a dynamic window, or the default
/// window.
fn window_label(s: &SoakScenario) -> &'static str {
    if s.scenario.iommu.mode == iolab_sim::lab::spec::IommuMode::DdwDynamic {
        "DDW dynamic window"
    } else {
        "default window"
    }
}

/// Progress lines for standard error when it is not a terminal: at most one a minute (wall
/// time), with the checkpoints done and an estimate of the time left.
struct ProgressLog {
    started: Instant,
    last: Instant,
    total: u64,
}

impl ProgressLog {
    /// Minimum wall time between two lines.
    const EVERY: std::time::Duration = std::time::Duration::from_secs(60);

    fn new(started: Instant, total: u64) -> Self {
        ProgressLog {
            started,
            last: Instant::now(),
            total,
        }
    }

    /// Checkpoint `done` of the whole soak passed at `at` (a description of where).
    fn checkpoint(&mut self, done: u64, at: &str) {
        if self.last.elapsed() < Self::EVERY || done >= self.total {
            return;
        }
        self.last = Instant::now();
        let elapsed = self.started.elapsed().as_secs_f64();
        let left = elapsed / done.max(1) as f64 * (self.total - done) as f64;
        eprintln!(
            "iolab soak: checkpoint {done} of {} ({at}), {} elapsed, about {} left",
            self.total,
            wall(elapsed),
            wall(left)
        );
    }
}

/// A virtual time for people: `5 virtual h`, `60 virtual s`, `4 virtual ms`.
fn virtual_time(ns: u64) -> String {
    let trim = |x: f64| {
        let t = format!("{x:.3}");
        t.trim_end_matches('0').trim_end_matches('.').to_owned()
    };
    let ns = ns as f64;
    if ns >= 3600e9 {
        format!("{} virtual h", trim(ns / 3600e9))
    } else if ns >= 1e9 {
        format!("{} virtual s", trim(ns / 1e9))
    } else {
        format!("{} virtual ms", trim(ns / 1e6))
    }
}

/// A wall-clock duration for people: `42s`, `17m`, `3h05m`.
fn wall(secs: f64) -> String {
    let s = secs.round() as u64;
    match s {
        0..=99 => format!("{s}s"),
        100..=5999 => format!("{}m", (s + 30) / 60),
        _ => format!("{}h{:02}m", s / 3600, s % 3600 / 60),
    }
}

/// Converts virtual seconds to nanoseconds, refusing what is not a positive finite time.
fn to_ns(what: &str, secs: f64) -> Result<u64, String> {
    let ns = secs * 1e9;
    if !(ns.is_finite() && ns >= 1.0 && ns <= u64::MAX as f64 / 2.0) {
        return Err(format!(
            "--{what}: expected a positive number of seconds, found {secs}"
        ));
    }
    Ok(ns.round() as u64)
}

/// Runs the soak and prints its report.
pub fn run(args: &SoakArgs<'_>) -> ExitCode {
    let prepared = match args.scenario {
        Some(p) => match std::fs::read_to_string(p) {
            Ok(t) => SoakScenario::prepare(
                &t,
                &p.display().to_string(),
                p.parent().filter(|d| d.is_dir()),
                args.default_window,
            ),
            Err(e) => {
                eprintln!("iolab soak: cannot read {}: {e}", p.display());
                return ExitCode::from(2);
            }
        },
        None => SoakScenario::default_cell(args.default_window),
    };
    let scenario = match prepared {
        Ok(s) => s,
        Err(e) => {
            eprintln!("iolab soak: {e}");
            return ExitCode::from(exit_code(&e));
        }
    };
    let duration = to_ns("hours", args.hours * 3600.0);
    let interval = to_ns("interval-s", args.interval_s);
    let (duration_ns, interval_ns) = match (duration, interval) {
        (Ok(d), Ok(i)) => (d, i),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("iolab soak: {e}");
            return ExitCode::from(2);
        }
    };
    if interval_ns > duration_ns {
        eprintln!(
            "iolab soak: --interval-s {} is longer than the soak (--hours {} = {}): expected an \
             interval of at most the duration (or more --hours)",
            args.interval_s,
            args.hours,
            virtual_time(duration_ns)
        );
        return ExitCode::from(2);
    }
    let mut db = match args.db.map(ResultsDb::open).transpose() {
        Ok(db) => db,
        Err(e) => {
            eprintln!("iolab soak: {e}");
            return ExitCode::from(e.exit_code());
        }
    };
    let directions = args.directions.list();
    let checkpoints = duration_ns / interval_ns.max(1);
    let names: Vec<&str> = directions.iter().map(|d| d.name()).collect();
    // What is soaked, before the first checkpoint: a long soak must not start silently.
    let named = if scenario.origin.contains(&scenario.scenario.name) {
        String::new()
    } else {
        format!(" ({})", scenario.scenario.name)
    };
    eprintln!(
        "iolab soak: {}{named}, {}: {} for {} each, invariant checks every {} ({checkpoints} per direction)",
        scenario.origin,
        window_label(&scenario),
        names.join(" then "),
        virtual_time(duration_ns),
        virtual_time(interval_ns),
    );
    let total = checkpoints * directions.len() as u64;
    let bar = crate::progress::runs_bar(total, "checkpoints");
    let started_at = SystemTime::now();
    let soak_started = Instant::now();
    let mut reports = Vec::new();
    for (d, &direction) in directions.iter().enumerate() {
        let cfg = SoakConfig {
            duration_ns,
            interval_ns,
            threads: args.threads,
            direction,
            seed: args.seed,
        };
        let started = Instant::now();
        let (b, name) = (bar.clone(), direction.name());
        let done_before = d as u64 * checkpoints;
        // Off a terminal (a log, a pipe) no bar is drawn: a line at most once a minute.
        let log = std::cell::RefCell::new(
            (!crate::progress::enabled() && !crate::progress::is_quiet())
                .then(|| ProgressLog::new(soak_started, total)),
        );
        let on_checkpoint = move |at_ns: u64| {
            let done = done_before + at_ns / interval_ns.max(1);
            b.set_position(done);
            // Whole seconds for a long soak, milliseconds for a short one.
            let digits = if duration_ns >= 100_000_000_000 { 0 } else { 3 };
            let at = format!(
                "{name}, {:.digits$} of {:.digits$} virtual s",
                at_ns as f64 / 1e9,
                duration_ns as f64 / 1e9
            );
            if let Some(log) = log.borrow_mut().as_mut() {
                log.checkpoint(done, &at);
            }
            b.set_message(at);
        };
        match run_soak_observed(&scenario, &cfg, on_checkpoint) {
            Ok(r) => {
                let wall = started.elapsed().as_secs_f64();
                // Wall time is about this machine, not the result: standard error only.
                crate::progress::note(
                    &bar,
                    &format!(
                        "{}: simulated {:.3} virtual s in {wall:.1} wall s ({:.4} virtual s per wall s)",
                        direction.name(),
                        r.virtual_ns as f64 / 1e9,
                        r.virtual_ns as f64 / 1e9 / wall.max(1e-9)
                    ),
                );
                reports.push(r);
            }
            Err(e) => {
                bar.finish_and_clear();
                eprintln!("iolab soak ({}): {e}", direction.name());
                return ExitCode::from(exit_code(&e));
            }
        }
    }
    bar.finish_and_clear();
    let text_out: String = reports.iter().map(render).collect();
    if let Some(db) = db.as_mut() {
        let report = stored_report(&reports, &text_out, args, interval_ns);
        let run = NewRun {
            kind: "lab",
            group_id: None,
            label: None,
            scenario_origin: Some(&scenario.origin),
            scenario_text: Some(&scenario.text),
            seed: args.seed,
            started_at,
            finished_at: SystemTime::now(),
            report: &report,
        };
        match db.store(&run) {
            Ok(id) => eprintln!("stored as run {id} in {}", db.path().display()),
            Err(e) => {
                eprintln!("iolab soak: {e}");
                return ExitCode::from(e.exit_code());
            }
        }
    }
    if args.json {
        // A mean and a coefficient of variation need two checkpoints (the first interval,
        // which holds the ramp, is left out): `null` rather than a made-up 0.
        let mut value = match serde_json::to_value(&reports) {
            Ok(v) => v,
            Err(e) => {
                eprintln!("iolab soak: cannot encode the report as JSON: {e}");
                return ExitCode::from(1);
            }
        };
        if let Some(list) = value.as_array_mut() {
            for (v, r) in list.iter_mut().zip(&reports) {
                if r.intervals.len() < 2 {
                    v["mean_gbps"] = serde_json::Value::Null;
                    v["cv_pct"] = serde_json::Value::Null;
                }
            }
        }
        match serde_json::to_string_pretty(&value) {
            Ok(s) => println!("{s}"),
            Err(e) => {
                eprintln!("iolab soak: cannot encode the report as JSON: {e}");
                return ExitCode::from(1);
            }
        }
    } else {
        print!("{text_out}");
    }
    ExitCode::SUCCESS
}

/// The soak as a stored run: one measurement per direction, named `soak.<direction>`.
fn stored_report(
    reports: &[SoakReport],
    text: &str,
    args: &SoakArgs<'_>,
    interval_ns: u64,
) -> ExperimentReport {
    let measurements = reports
        .iter()
        .map(|r| {
            let mut m = Measurement::new(format!("soak.{}", r.direction.name()))
                .attr("scenario", &r.scenario)
                .attr("workload", "netperf")
                .attr("direction", r.direction.name())
                .attr("threads", r.threads)
                .attr("iommu_model", "pseries")
                .attr(
                    "iommu_mode",
                    if r.ddw {
                        "ddw-dynamic"
                    } else {
                        "default-window"
                    },
                )
                .attr("seed", args.seed)
                .attr("interval_s", interval_ns as f64 / 1e9)
                .metric(Metric::new(
                    "soak.checkpoints",
                    "count",
                    r.intervals.len() as f64,
                ))
                .metric(Metric::new(
                    "soak.virtual_s",
                    "s",
                    r.virtual_ns as f64 / 1e9,
                ));
            if r.intervals.len() >= 2 {
                m = m
                    .metric(Metric::new("net.throughput_gbps", "Gb/s", r.mean_gbps))
                    .metric(Metric::new("net.throughput_cv_pct", "%", r.cv_pct));
            } else if let Some(first) = r.intervals.first() {
                m = m.metric(Metric::new("soak.first_interval_gbps", "Gb/s", first.gbps));
            }
            m.metric(Metric::new("dma.maps", "count", r.maps as f64))
                .metric(Metric::new("dma.unmaps", "count", r.unmaps as f64))
                .metric(Metric::new("net.messages", "count", r.messages as f64))
                .metric(Metric::new("net.bytes", "bytes", r.bytes as f64))
                .metric(Metric::new("tce.hypercalls", "count", r.hypercalls as f64))
        })
        .collect();
    let directions: Vec<&str> = reports.iter().map(|r| r.direction.name()).collect();
    ExperimentReport {
        name: "soak".to_owned(),
        title: format!(
            "pSeries TCP soak ({}), {} virtual h, invariant checks every {} virtual s",
            directions.join(" then "),
            args.hours,
            args.interval_s
        ),
        runs: 1,
        figures: Vec::new(),
        effects: Vec::new(),
        calibrated: Vec::new(),
        report_text: text.to_owned(),
        notes: Vec::new(),
        measurements,
    }
}

fn render(r: &SoakReport) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let window = if r.ddw {
        "DDW dynamic window"
    } else {
        "default window"
    };
    let _ = writeln!(
        s,
        "== soak: {} {} threads, {window}, {:.3} virtual s",
        r.threads,
        r.direction.name(),
        r.virtual_ns as f64 / 1e9
    );
    let _ = writeln!(s, "{:>14} {:>10} {:>10}", "checkpoint_s", "Gb/s", "mapped");
    for i in &r.intervals {
        let _ = writeln!(
            s,
            "{:>14.3} {:>10.3} {:>10}",
            i.at_ns as f64 / 1e9,
            i.gbps,
            i.live_mappings
        );
    }
    match r.intervals.as_slice() {
        [] => {
            let _ = writeln!(s, "throughput: no checkpoint ran");
        }
        [only] => {
            let _ = writeln!(
                s,
                "throughput: {:.3} Gb/s in the one interval (ramp included); a mean and a \
                 coefficient of variation need two or more checkpoints (a shorter --interval-s \
                 or more --hours)",
                only.gbps
            );
        }
        _ => {
            let _ = writeln!(
                s,
                "throughput: mean {:.3} Gb/s, coefficient of variation {:.2}% (intervals after the first)",
                r.mean_gbps, r.cv_pct
            );
        }
    }
    let _ = match r.direction {
        SoakDirection::Write => writeln!(
            s,
            "DMA: {} maps, {} unmaps, {} messages written, {} skbs, {} payload bytes, {} bytes read by the device, {} TCE hypercalls",
            r.maps, r.unmaps, r.messages, r.skbs, r.bytes, r.device_bytes, r.hypercalls
        ),
        SoakDirection::Read => writeln!(
            s,
            "DMA: {} maps, {} unmaps, {} messages read, {} payload bytes, {} bytes written by the device, {} TCE hypercalls",
            r.maps, r.unmaps, r.messages, r.bytes, r.device_bytes, r.hypercalls
        ),
    };
    let _ = writeln!(
        s,
        "invariants: held at all {} checkpoints and after the drain (no leaked IOVA or TCE, tables match the reference, no DMA lost or duplicated)",
        r.intervals.len()
    );
    s
}
