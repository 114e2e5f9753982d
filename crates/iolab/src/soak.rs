//! `iolab soak`: the long pSeries TCP write and read soak of SEEDS.md #4 in virtual time,
//! with invariant checks at intervals (see `iolab_sim::soak`). The soak is not stored in the
//! results database: it reports stability, not an experiment's figures.

use std::path::Path;
use std::process::ExitCode;
use std::time::Instant;

use iolab_sim::experiments::pseries_ddw;
use iolab_sim::soak::{run_soak, SoakConfig, SoakDirection, SoakReport};

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
    /// A `pseries-ddw` scenario file (default: the bundled one).
    pub scenario: Option<&'a Path>,
    /// Virtual hours to run.
    pub hours: f64,
    /// Virtual seconds between checkpoints.
    pub interval_s: f64,
    /// Threads (default: the scenario's).
    pub threads: Option<usize>,
    /// Which streams to soak.
    pub directions: Directions,
    /// Soak the default window instead of the DDW.
    pub default_window: bool,
    /// Seed.
    pub seed: u64,
    /// JSON output.
    pub json: bool,
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
    let (text, origin) = match args.scenario {
        Some(p) => match std::fs::read_to_string(p) {
            Ok(t) => (t, p.display().to_string()),
            Err(e) => {
                eprintln!("iolab soak: cannot read {}: {e}", p.display());
                return ExitCode::from(2);
            }
        },
        None => (
            pseries_ddw::BUNDLED_SCENARIO.to_owned(),
            "scenarios/pseries-ddw.toml (bundled)".to_owned(),
        ),
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
    let mut reports = Vec::new();
    for &direction in args.directions.list() {
        let cfg = SoakConfig {
            duration_ns,
            interval_ns,
            threads: args.threads,
            ddw: !args.default_window,
            direction,
            seed: args.seed,
        };
        let started = Instant::now();
        match run_soak(&text, &origin, &cfg) {
            Ok(r) => {
                let wall = started.elapsed().as_secs_f64();
                if !args.json {
                    print!("{}", render(&r));
                }
                // Wall time is about this machine, not the result: standard error only.
                eprintln!(
                    "{}: simulated {:.3} virtual s in {wall:.1} wall s ({:.4} virtual s per wall s)",
                    direction.name(),
                    r.virtual_ns as f64 / 1e9,
                    r.virtual_ns as f64 / 1e9 / wall.max(1e-9)
                );
                reports.push(r);
            }
            Err(e) => {
                eprintln!("iolab soak ({}): {e}", direction.name());
                return ExitCode::from(if e.is_bad_input() { 2 } else { 1 });
            }
        }
    }
    if args.json {
        match serde_json::to_string_pretty(&reports) {
            Ok(s) => println!("{s}"),
            Err(e) => {
                eprintln!("iolab soak: cannot encode the report as JSON: {e}");
                return ExitCode::from(1);
            }
        }
    }
    ExitCode::SUCCESS
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
    let _ = writeln!(
        s,
        "throughput: mean {:.3} Gb/s, coefficient of variation {:.2}% (intervals after the first)",
        r.mean_gbps, r.cv_pct
    );
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
