//! `iolab fit`: fit a workload scenario's unknowns to stored runs (real tools' outputs brought
//! in by `iolab import`, or any stored run), then write the fitted scenario.
//!
//! Each `--to RUN[:CONFIG]` is one stored measurement. Its scenario is the base scenario,
//! and for a fio run the job's own options (the import's attributes `rw`, `rwmixread`, `bs`,
//! `iodepth`, `numjobs`) set the fio workload's fields, so one base stands for a QD1 and a
//! QD32 run alike; fio's synchronous engines (`sync`, `psync`, `vsync`, `pvsync`,
//! `pvsync2`, `mmap`, `splice`: `FIO_SYNCIO` in fio's engines) complete each I/O before
//! issuing the next, so their runs get `iodepth = 1` whatever the job file says, as fio's
//! own note does. `--as-is` keeps the base's workload for every run.
//!
//! The figures are `--metric` names (default: the run's `read.iops` and `write.iops`),
//! each compared with the same metric of the lab's run of that scenario. The unknowns
//! (`--unknown FIELD=LO..HI`) are fitted by [`iolab_sim::fit`]: a fixed grid, then
//! coordinate golden-section search, every point a lab run of every `--to` scenario with the
//! same seed. The points of a batch run in parallel on `--jobs` threads, as a sweep's do.
//!
//! The written scenario is the base (with one `--to` run: that run's twin) with each
//! unknown set to its fitted value and a `[[fitted]]` entry naming the runs it was fitted
//! to; the scenario checks that entry against the value, so it cannot outlive an edit.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::Ordering;

use iolab_sim::experiment::ExperimentOptions;
use iolab_sim::fit::{in_parallel, Evaluate, Fit, Fitter, LeftOut, Target, Unknown};
use iolab_sim::metrics::Measurement;
use iolab_sim::tomlpatch::{get_field, parse_path, set_field, Step};

use crate::db::ResultsDb;

/// What `iolab fit` was asked.
pub struct FitArgs<'a> {
    /// The base scenario file, or
    pub scenario: Option<&'a Path>,
    /// a bundled example's name.
    pub example: Option<&'a str>,
    /// `RUN[:CONFIG]` specs.
    pub to: &'a [String],
    /// Metrics to fit (empty: the runs' `read.iops` / `write.iops`).
    pub metrics: &'a [String],
    /// `FIELD=LO..HI` specs.
    pub unknowns: &'a [String],
    /// The fitted scenario to write.
    pub output: &'a Path,
    /// Worker threads.
    pub jobs: Option<usize>,
    /// The lab's seed (default: the scenario's, else 1).
    pub seed: Option<u64>,
    /// Keep the base scenario's workload for every run.
    pub as_is: bool,
    /// The results database holding the runs.
    pub db: &'a Path,
}

/// Why a fit stopped: the message and the exit code.
struct Stop(u8, String);

fn bad(msg: impl Into<String>) -> Stop {
    Stop(2, msg.into())
}

/// One `--to` run: its measurement, the scenario that stands for it and its figures.
struct RunTarget {
    run: i64,
    config: String,
    table: toml::Table,
    origin: String,
    /// The run's figures: (its metric name, observed value).
    metrics: Vec<(String, f64)>,
    /// Each figure's name in the lab's measurement (a re-aim row's `reaim.jobs_per_min` is
    /// the lab's `reaim.usersN.jpm`).
    lab_names: Vec<String>,
    notes: Vec<String>,
}

/// `iolab fit`: see the module docs.
pub fn run(args: &FitArgs<'_>) -> ExitCode {
    match fit(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Stop(code, msg)) => {
            eprintln!("iolab fit: {msg}");
            ExitCode::from(code)
        }
    }
}

fn fit(args: &FitArgs<'_>) -> Result<(), Stop> {
    let (text, origin) = base_text(args)?;
    crate::reproduce::validate_workload(&text, &origin).map_err(|e| bad(e.to_string()))?;
    let base: toml::Table = toml::from_str(&text).map_err(|e| bad(format!("{origin}: {e}")))?;
    let seed = args
        .seed
        .or_else(|| {
            base.get("seed")
                .and_then(toml::Value::as_integer)
                .map(|s| s as u64)
        })
        .unwrap_or(1);
    let mut unknowns = parse_unknowns(args.unknowns)?;
    if args.to.is_empty() {
        return Err(bad(
            "expected at least one --to RUN (a stored run id, `iolab runs list`)",
        ));
    }
    let db = ResultsDb::open_existing(args.db).map_err(|e| Stop(e.exit_code(), e.to_string()))?;
    let mut runs = Vec::new();
    let mut seen = BTreeSet::new();
    for spec in args.to {
        let r = run_target(&db, spec, &base, &origin, args)?;
        if !seen.insert((r.run, r.config.clone())) {
            return Err(bad(format!(
                "--to {spec}: run {} configuration \"{}\" is given twice",
                r.run, r.config
            )));
        }
        runs.push(r);
    }
    drop(db);
    check_unknowns(&mut unknowns, &runs)?;
    for r in &runs {
        for n in &r.notes {
            eprintln!("iolab fit: run {} ({}): {n}", r.run, r.config);
        }
    }

    // A run given twice (two of its configurations) names the configuration too.
    let shared = |id: i64| runs.iter().filter(|r| r.run == id).count() > 1;
    let targets: Vec<Target> = runs
        .iter()
        .enumerate()
        .flat_map(|(g, r)| {
            let who = if shared(r.run) {
                format!("run {}:{}", r.run, r.config)
            } else {
                format!("run {}", r.run)
            };
            r.metrics.iter().map(move |(m, v)| Target {
                name: format!("{who} {m}"),
                observed: *v,
                group: g,
            })
        })
        .collect();
    let jobs = args
        .jobs
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1);
    let mut lab = LabRuns {
        runs: &runs,
        steps: unknowns.iter().map(|(s, _)| s.clone()).collect(),
        integer: unknowns.iter().map(|(_, u)| u.integer).collect(),
        seed,
        jobs,
        lab_runs: 0,
    };
    let plain: Vec<Unknown> = unknowns.iter().map(|(_, u)| u.clone()).collect();
    let started = std::time::Instant::now();
    let (result, loo, evaluations) = {
        let mut fitter = Fitter::new(plain.clone(), targets.clone(), &mut lab).map_err(bad)?;
        let expected = fitter.expected_evaluations();
        let bar = crate::progress::bar(
            expected as u64,
            "{bar:30} {pos}/{len} points (about), {elapsed} elapsed, about {eta} left: {msg}",
        );
        let bar_in = bar.clone();
        let quiet_line = std::sync::atomic::AtomicU64::new(0);
        let count = targets.len() as f64;
        fitter.observe(move |n, best| {
            bar_in.set_position(n as u64);
            let rms = (best / count).sqrt() * 100.0;
            bar_in.set_message(format!("best RMS residual {rms:.2}%"));
            // Off a terminal: a line at most once a minute.
            if !crate::progress::enabled() && !crate::progress::is_quiet() {
                let now = started.elapsed().as_secs();
                if now >= quiet_line.load(Ordering::Relaxed) + 60 {
                    quiet_line.store(now, Ordering::Relaxed);
                    if now > 0 {
                        eprintln!("iolab fit: {n} points run, best RMS residual {rms:.2}%");
                    }
                }
            }
        });
        let result = fitter.fit();
        let loo = match &result {
            Ok(_) => Some(fitter.leave_one_out()),
            Err(_) => None,
        };
        let evaluations = fitter.evaluations();
        bar.finish_and_clear();
        (result, loo, evaluations)
    };
    let fit = result?;
    let loo = loo.transpose()?.unwrap_or_default();
    print!(
        "{}",
        render(
            &origin,
            &plain,
            &targets,
            &runs,
            &fit,
            &loo,
            evaluations,
            lab.lab_runs,
            seed
        )
    );
    write_fitted(args, &base, &origin, &runs, &unknowns, &fit, &targets)
}

/// The base scenario's text and origin.
fn base_text(args: &FitArgs<'_>) -> Result<(String, String), Stop> {
    match (args.scenario, args.example) {
        (Some(path), None) => std::fs::read_to_string(path)
            .map(|t| (t, path.display().to_string()))
            .map_err(|e| bad(format!("cannot read scenario {}: {e}", path.display()))),
        (None, Some(name)) => iolab_sim::lab::examples::example(name)
            .map(|t| {
                (
                    t.to_owned(),
                    format!("scenarios/examples/{name}.toml (bundled)"),
                )
            })
            .ok_or_else(|| {
                bad(format!(
                    "unknown example '{name}': expected one of {}",
                    iolab_sim::lab::examples::example_names().join(", ")
                ))
            }),
        _ => Err(bad("expected a scenario file or --example NAME")),
    }
}

/// Parses `FIELD=LO..HI` specs (integer-ness is decided later, by the scenario).
fn parse_unknowns(specs: &[String]) -> Result<Vec<(Vec<Step>, Unknown)>, Stop> {
    if specs.is_empty() {
        return Err(bad(
            "expected at least one --unknown FIELD=LO..HI (e.g. device[0].read_latency_us=10..500)",
        ));
    }
    let mut out: Vec<(Vec<Step>, Unknown)> = Vec::new();
    for spec in specs {
        let shape = || {
            bad(format!(
                "--unknown {spec}: expected FIELD=LO..HI, e.g. device[0].read_latency_us=10..500"
            ))
        };
        let (field, range) = spec.split_once('=').ok_or_else(shape)?;
        let (lo, hi) = range.split_once("..").ok_or_else(shape)?;
        let num = |s: &str| {
            s.trim().parse::<f64>().map_err(|_| {
                bad(format!(
                    "--unknown {spec}: `{}` is not a number (expected FIELD=LO..HI)",
                    s.trim()
                ))
            })
        };
        let field = field.trim();
        let steps = parse_path(field).map_err(|e| bad(format!("--unknown {spec}: {e}")))?;
        let u = Unknown {
            name: field.to_owned(),
            lo: num(lo)?,
            hi: num(hi)?,
            integer: false,
        };
        u.check().map_err(|e| bad(format!("--unknown {e}")))?;
        if out.iter().any(|(_, k)| k.name == u.name) {
            return Err(bad(format!("--unknown {field} is given twice")));
        }
        out.push((steps, u));
    }
    Ok(out)
}

/// Reads one `--to RUN[:CONFIG]` and builds the scenario that stands for it.
fn run_target(
    db: &ResultsDb,
    spec: &str,
    base: &toml::Table,
    origin: &str,
    args: &FitArgs<'_>,
) -> Result<RunTarget, Stop> {
    let (id, config) = match spec.split_once(':') {
        Some((i, c)) => (i, Some(c)),
        None => (spec, None),
    };
    let run: i64 = id.trim().parse().map_err(|_| {
        bad(format!(
            "--to {spec}: expected RUN or RUN:CONFIG with RUN a stored run id (`iolab runs list`)"
        ))
    })?;
    let m = crate::reproduce::stored_measurement(db, run, config, "as --to RUN:CONFIG")
        .map_err(|e| bad(format!("--to {spec}: {e}")))?;
    let names: Vec<String> = if args.metrics.is_empty() {
        let defaults: Vec<String> = ["read.iops", "write.iops", "reaim.jobs_per_min"]
            .iter()
            .filter(|n| m.get(n).is_some())
            .map(|n| (*n).to_owned())
            .collect();
        if defaults.is_empty() {
            return Err(bad(format!(
                "--to {spec}: run {run} has no read.iops, write.iops or reaim.jobs_per_min to fit to by default: name the figures with --metric (it has {})",
                metric_names(&m)
            )));
        }
        defaults
    } else {
        args.metrics.to_vec()
    };
    let mut metrics = Vec::new();
    for name in names {
        let v = crate::reproduce::metric_value(&m, run, &name)
            .map_err(|e| bad(format!("--metric {name}: {e}")))?;
        if !v.is_finite() || v == 0.0 {
            return Err(bad(format!(
                "--metric {name}: run {run} has {v}, and a relative residual needs a non-zero value"
            )));
        }
        metrics.push((name, v));
    }
    let mut table = base.clone();
    let mut notes = Vec::new();
    if !args.as_is {
        workload_of(&m, &mut table, &mut notes).map_err(|e| bad(format!("--to {spec}: {e}")))?;
    }
    // A re-aim row (one user count) is the lab run's row of that count.
    let users = (m.attrs.get("workload").map(String::as_str) == Some("reaim"))
        .then(|| m.attrs.get("users").and_then(|u| u.parse::<u64>().ok()))
        .flatten();
    let lab_names = metrics
        .iter()
        .map(|(name, _)| match users {
            Some(n) => iolab::vocab::reaim_row_metric(n, name),
            None => name.clone(),
        })
        .collect();
    Ok(RunTarget {
        run,
        config: m.config.clone(),
        table,
        origin: format!("{origin} (as run {run}, {})", m.config),
        metrics,
        lab_names,
        notes,
    })
}

fn metric_names(m: &Measurement) -> String {
    m.metrics
        .iter()
        .map(|x| x.name.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Sets the scenario's workload from the run's own: a fio job's options, or a re-aim row's
/// user count (the ramp becomes that one count).
fn workload_of(
    m: &Measurement,
    table: &mut toml::Table,
    notes: &mut Vec<String>,
) -> Result<(), String> {
    let kind = |t: &toml::Table| {
        t.get("workload")
            .and_then(|w| w.get("kind"))
            .and_then(toml::Value::as_str)
            .map(str::to_owned)
    };
    let run_kind = m.attrs.get("workload").map(String::as_str);
    if run_kind == Some("reaim") && kind(table).as_deref() == Some("reaim") {
        if let Some(users) = m.attrs.get("users").and_then(|u| u.parse::<i64>().ok()) {
            for key in ["start", "end"] {
                let steps = parse_path(&format!("workload.{key}")).map_err(|e| e.to_string())?;
                set_field(table, &steps, toml::Value::Integer(users), true)?;
            }
            notes.push(format!(
                "its row of {users} users set workload.start = workload.end = {users}"
            ));
        }
        return Ok(());
    }
    if run_kind != Some("fio") || kind(table).as_deref() != Some("fio") {
        return Ok(());
    }
    // A job that names no engine ran fio's default, psync.
    let sync = match m.attrs.get("ioengine") {
        None => Some("psync (fio's default)"),
        Some(e) if iolab::vocab::fio_engine_is_sync(&m.attrs) => Some(e.as_str()),
        Some(_) => None,
    };
    let mut set = Vec::new();
    for key in ["rw", "rwmixread", "bs", "iodepth", "numjobs"] {
        let Some(v) = m.attrs.get(key) else { continue };
        let value = match key {
            "rw" | "bs" => toml::Value::String(v.clone()),
            "iodepth" if sync.is_some() => toml::Value::Integer(1),
            _ => toml::Value::Integer(
                v.parse()
                    .map_err(|_| format!("its {key} `{v}` is not a whole number"))?,
            ),
        };
        let field = format!("workload.{key}");
        let steps = parse_path(&field).map_err(|e| e.to_string())?;
        set_field(table, &steps, value.clone(), true)?;
        let shown = match (key, sync) {
            ("iodepth", Some(engine)) => format!(
                "{field} = 1 ({engine} is synchronous; fio caps the depth at 1, the job says {v})"
            ),
            _ => format!("{field} = {value}"),
        };
        set.push(shown);
    }
    // The engine: fio's default psync when the job names none; the other synchronous
    // engines run as psync does; io_uring's options where the job sets them.
    let engine = m.attrs.get("ioengine").map_or("psync", String::as_str);
    let lab_engine = match engine {
        "psync" | "libaio" | "io_uring" => Some(engine),
        e if iolab::vocab::FIO_SYNC_ENGINES.contains(&e) => Some("psync"),
        _ => None,
    };
    match lab_engine {
        Some(e) => {
            let steps = parse_path("workload.ioengine").map_err(|e| e.to_string())?;
            set_field(table, &steps, toml::Value::String(e.to_owned()), true)?;
            set.push(if e == engine {
                format!("workload.ioengine = \"{e}\"")
            } else {
                format!("workload.ioengine = \"{e}\" (for {engine}, synchronous as psync is)")
            });
        }
        None => notes.push(format!(
            "its ioengine {engine} is not one the lab models (psync, libaio, io_uring): the scenario's engine stands"
        )),
    }
    if lab_engine == Some("io_uring") {
        for option in ["hipri", "sqthread_poll", "fixedbufs", "registerfiles"] {
            let Some(v) = m.attrs.get(option) else {
                continue;
            };
            // fio lists a flag given without a value with an empty value: set.
            let on = !matches!(v.trim(), "0" | "false");
            let steps = parse_path(&format!("workload.{option}")).map_err(|e| e.to_string())?;
            set_field(table, &steps, toml::Value::Boolean(on), true)?;
            set.push(format!("workload.{option} = {on}"));
        }
    }
    if !set.is_empty() {
        notes.push(format!("the job's options set {}", set.join(", ")));
    }
    Ok(())
}

/// Sets the unknowns at `values` in `table`.
fn set_values(
    table: &mut toml::Table,
    steps: &[Vec<Step>],
    integer: &[bool],
    values: &[f64],
) -> Result<(), String> {
    for ((s, &int), &v) in steps.iter().zip(integer).zip(values) {
        let value = if int {
            toml::Value::Integer(v as i64)
        } else {
            toml::Value::Float(v)
        };
        set_field(table, s, value, true)?;
    }
    Ok(())
}

/// Validates a derived scenario; a field's error is given without the derived text's line
/// (the user never saw that text).
fn validate_table(table: &toml::Table, origin: &str) -> Result<(), String> {
    use iolab_sim::lab::LabError;
    use iolab_sim::tomlfile::InputError;
    let text = toml::to_string(table).map_err(|e| e.to_string())?;
    match crate::reproduce::validate_workload(&text, origin) {
        Ok(_) => Ok(()),
        Err(LabError::Input(InputError::Field { field, problem, .. })) => {
            Err(format!("field `{field}`: {problem}"))
        }
        Err(e) => Err(e.to_string()),
    }
}

/// Checks each unknown on every run's scenario at both ends of its range, and decides
/// whether it takes whole numbers (the base holds an integer there, or the scenario refuses
/// a fraction).
fn check_unknowns(unknowns: &mut [(Vec<Step>, Unknown)], runs: &[RunTarget]) -> Result<(), Stop> {
    for (steps, u) in unknowns.iter_mut() {
        let held = get_field(&runs[0].table, steps);
        u.integer = matches!(held, Some(toml::Value::Integer(_)));
        if !u.integer && u.lo.fract() == 0.0 && u.hi.fract() == 0.0 && u.hi - u.lo >= 1.0 {
            let mut probe = runs[0].table.clone();
            let half = u.lo + 0.5;
            set_field(&mut probe, steps, toml::Value::Float(half), true)
                .map_err(|e| bad(format!("--unknown {}: {e}", u.name)))?;
            if let Err(e) = validate_table(&probe, &runs[0].origin) {
                if e.contains(&format!("`{}`", u.name)) && e.contains("integer") {
                    u.integer = true;
                }
            }
        }
        u.check().map_err(|e| bad(format!("--unknown {e}")))?;
        for r in runs {
            for end in [u.lo, u.hi] {
                let mut t = r.table.clone();
                set_values(&mut t, std::slice::from_ref(steps), &[u.integer], &[end])
                    .map_err(|e| bad(format!("--unknown {}: {e}", u.name)))?;
                validate_table(&t, &r.origin).map_err(|e| {
                    bad(format!(
                        "--unknown {}: the scenario refuses {end}: {e}",
                        u.name
                    ))
                })?;
            }
        }
    }
    Ok(())
}

/// The lab as the fitter sees it: every point runs every `--to` scenario.
struct LabRuns<'a> {
    runs: &'a [RunTarget],
    steps: Vec<Vec<Step>>,
    integer: Vec<bool>,
    seed: u64,
    jobs: usize,
    lab_runs: usize,
}

impl Evaluate for LabRuns<'_> {
    type Error = Stop;

    fn evaluate(&mut self, points: &[Vec<f64>]) -> Result<Vec<Vec<f64>>, Stop> {
        // One task per (point, run), in a fixed order; results come back in that order.
        let mut tasks = Vec::new();
        for (p, values) in points.iter().enumerate() {
            for (r, run) in self.runs.iter().enumerate() {
                let mut t = run.table.clone();
                set_values(&mut t, &self.steps, &self.integer, values).map_err(bad)?;
                let text = toml::to_string(&t).map_err(|e| Stop(1, e.to_string()))?;
                tasks.push((p, r, text));
            }
        }
        let options = ExperimentOptions {
            runs: 1,
            seed: self.seed,
        };
        let results = in_parallel(self.jobs, &tasks, |(_, r, text)| {
            let run = &self.runs[*r];
            crate::sweep::run_scenario_text(text, &run.origin, &options)
                .map_err(|e| Stop(if e.is_bad_input() { 2 } else { 1 }, e.to_string()))
                .and_then(|report| {
                    lab_measurement(report.measurements, &run.lab_names, &run.origin)
                })
        });
        let mut out = vec![Vec::new(); points.len()];
        for ((p, r, _), result) in tasks.iter().zip(results) {
            let m = result?;
            self.lab_runs += 1;
            for name in &self.runs[*r].lab_names {
                out[*p].push(m.get(name).map_or(f64::NAN, |x| x.value));
            }
        }
        Ok(out)
    }
}

/// The lab measurement holding every metric fitted (the first that does).
fn lab_measurement(
    ms: Vec<Measurement>,
    names: &[String],
    origin: &str,
) -> Result<Measurement, Stop> {
    let has_all = |m: &Measurement| names.iter().all(|n| m.get(n).is_some());
    match ms.iter().position(has_all) {
        Some(i) => Ok(ms.into_iter().nth(i).expect("index from position")),
        None => {
            let missing: Vec<&str> = names
                .iter()
                .filter(|n| !ms.first().is_some_and(|m| m.get(n).is_some()))
                .map(String::as_str)
                .collect();
            Err(bad(format!(
                "--metric {}: the lab's run of {origin} has no such metric (it has {})",
                missing.join(", "),
                ms.first().map(metric_names).unwrap_or_default()
            )))
        }
    }
}

pub(crate) fn pct(x: f64) -> String {
    let p = x * 100.0;
    // No "-0.00%": a residual that rounds to zero prints unsigned zero's way.
    format!("{:+.2}%", if p.abs() < 0.005 { 0.0 } else { p })
}

pub(crate) fn num(x: f64) -> String {
    if x.abs() >= 1e5 {
        format!("{x:.0}")
    } else if x.abs() >= 100.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.4}")
    }
}

/// The report on standard output.
#[allow(clippy::too_many_arguments)]
fn render(
    origin: &str,
    unknowns: &[Unknown],
    targets: &[Target],
    runs: &[RunTarget],
    fit: &Fit,
    loo: &[LeftOut],
    points: usize,
    lab_runs: usize,
    seed: u64,
) -> String {
    let mut s = String::new();
    let to: Vec<String> = runs
        .iter()
        .map(|r| format!("run {} ({})", r.run, r.config))
        .collect();
    s.push_str(&format!("fit of {origin} to {}\n\n", to.join(", ")));
    s.push_str(&fit_table(unknowns, targets, fit));
    if !loo.is_empty() {
        s.push_str("\nleave-one-out (each run left out of the fit, then predicted):\n");
        for l in loo {
            let r = &runs[l.group];
            let vals: Vec<String> = unknowns
                .iter()
                .zip(&l.values)
                .map(|(u, v)| format!("{} = {}", u.name, num_exact(u, *v)))
                .collect();
            s.push_str(&format!(
                "  without run {} ({}): {}\n",
                r.run,
                r.config,
                vals.join(", ")
            ));
            for &(i, lab) in &l.predicted {
                let t = &targets[i];
                s.push_str(&format!(
                    "    {:<30} observed {:>12}  predicted {:>12}  error {}\n",
                    t.name,
                    num(t.observed),
                    num(lab),
                    pct(lab / t.observed - 1.0)
                ));
            }
        }
    }
    s.push_str(&format!(
        "\n{lab_runs} lab runs: {points} points x {} run scenario{}, seed {seed}\n",
        runs.len(),
        if runs.len() == 1 { "" } else { "s" }
    ));
    s
}

/// The fitted unknowns (value, identifiability, elasticities) and each figure's residual:
/// what `iolab fit` and `iolab reproduce --refit` print.
pub(crate) fn fit_table(unknowns: &[Unknown], targets: &[Target], fit: &Fit) -> String {
    let mut s = String::new();
    s.push_str(&format!(
        "{:<34} {:>16} {:>12}  {}\n",
        "unknown", "range", "fitted", "identifiability"
    ));
    for ((u, sens), v) in unknowns.iter().zip(&fit.sensitivity).zip(&fit.values) {
        let range = format!("{}..{}", u.lo, u.hi);
        s.push_str(&format!(
            "{:<34} {:>16} {:>12}  {}\n",
            u.name,
            range,
            num_exact(u, *v),
            sens.verdict.describe()
        ));
        let el: Vec<String> = targets
            .iter()
            .zip(&sens.elasticity)
            .map(|(t, e)| {
                if e.is_finite() {
                    format!("{} {e:+.3}", t.name)
                } else {
                    format!("{} -", t.name)
                }
            })
            .collect();
        s.push_str(&format!("{:<34} elasticity: {}\n", "", el.join(", ")));
    }
    s.push('\n');
    s.push_str(&format!(
        "{:<34} {:>14} {:>14} {:>10}\n",
        "figure", "observed", "lab", "residual"
    ));
    for (i, t) in targets.iter().enumerate() {
        s.push_str(&format!(
            "{:<34} {:>14} {:>14} {:>10}\n",
            t.name,
            num(t.observed),
            num(fit.lab[i]),
            pct(fit.residual(targets, i))
        ));
    }
    let rms = (fit.objective / targets.len() as f64).sqrt();
    s.push_str(&format!(
        "RMS residual {}\n",
        pct(rms).trim_start_matches('+')
    ));
    for &(a, b) in &fit.confounded {
        s.push_str(&format!(
            "note: {} and {} move the figures alike: the figures identify a combination of the two, not each\n",
            unknowns[a].name, unknowns[b].name
        ));
    }
    if targets.len() < unknowns.len() {
        s.push_str(&format!(
            "note: {} unknowns from {} figures: the fit is under-determined\n",
            unknowns.len(),
            targets.len()
        ));
    }
    s
}

fn num_exact(u: &Unknown, v: f64) -> String {
    if u.integer {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

/// Writes the fitted scenario (see the module docs); the text is validated first.
fn write_fitted(
    args: &FitArgs<'_>,
    base: &toml::Table,
    origin: &str,
    runs: &[RunTarget],
    unknowns: &[(Vec<Step>, Unknown)],
    fit: &Fit,
    targets: &[Target],
) -> Result<(), Stop> {
    let mut table = if runs.len() == 1 {
        runs[0].table.clone()
    } else {
        base.clone()
    };
    let steps: Vec<Vec<Step>> = unknowns.iter().map(|(s, _)| s.clone()).collect();
    let integer: Vec<bool> = unknowns.iter().map(|(_, u)| u.integer).collect();
    set_values(&mut table, &steps, &integer, &fit.values).map_err(bad)?;
    let to: Vec<String> = runs
        .iter()
        .map(|r| {
            let figs: Vec<String> = r
                .metrics
                .iter()
                .map(|(m, v)| format!("{m} {}", num(*v)))
                .collect();
            format!("run {} ({}: {})", r.run, r.config, figs.join(", "))
        })
        .collect();
    let rms = (fit.objective / targets.len() as f64).sqrt();
    let mut entries: Vec<toml::Value> = match table.remove("fitted") {
        Some(toml::Value::Array(a)) => a,
        _ => Vec::new(),
    };
    for ((_, u), (v, sens)) in unknowns.iter().zip(fit.values.iter().zip(&fit.sensitivity)) {
        entries.retain(|e| e.get("field").and_then(toml::Value::as_str) != Some(&u.name));
        let mut e = toml::Table::new();
        e.insert("field".into(), toml::Value::String(u.name.clone()));
        e.insert("value".into(), toml::Value::Float(*v));
        e.insert(
            "source".into(),
            toml::Value::String(format!(
                "iolab fit of {origin} to {} in {}, range {}..{}, RMS residual {}, {}",
                to.join(", "),
                args.db.display(),
                u.lo,
                u.hi,
                pct(rms).trim_start_matches('+'),
                sens.verdict.describe()
            )),
        );
        entries.push(toml::Value::Table(e));
    }
    table.insert("fitted".into(), toml::Value::Array(entries));
    let text = toml::to_string(&table).map_err(|e| Stop(1, e.to_string()))?;
    let out_origin = args.output.display().to_string();
    crate::reproduce::validate_workload(&text, &out_origin)
        .map_err(|e| Stop(1, format!("the fitted scenario does not validate: {e}")))?;
    let header =
        format!("# Written by `iolab fit`: {origin} with its unknowns fitted (see [[fitted]]).\n");
    let tmp = temp_path(args.output);
    std::fs::write(&tmp, format!("{header}{text}"))
        .and_then(|()| std::fs::rename(&tmp, args.output))
        .map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            Stop(1, format!("cannot write {}: {e}", args.output.display()))
        })?;
    eprintln!("iolab fit: wrote {}", args.output.display());
    Ok(())
}

fn temp_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".tmp");
    path.with_file_name(name)
}
