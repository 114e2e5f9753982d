//! `iolab reproduce` and `iolab run`: run experiments and print them beside the published
//! figures, in text (each report in its own format) or JSON.

use std::path::Path;
use std::process::ExitCode;
use std::time::SystemTime;

use iolab_sim::experiment::{
    render_effects, render_fidelity_summary, render_figure_goals, ExperimentOptions,
    ExperimentReport,
};
use iolab_sim::lab::{self, LabError, LabOptions};
use iolab_sim::reproduce;
use serde::Serialize;

use crate::db::{NewRun, ResultsDb};
use crate::progress;

/// What a lab run tells of its virtual time as it goes: on a terminal, the bar's message
/// (`ORIGIN: 42% of virtual time, about 12s left`); off one (and without `--quiet`), a line
/// on standard error at most once a minute, so a long batch run shows it is alive.
fn virtual_time_hook(
    cmd: &str,
    origin: &str,
    bar: &indicatif::ProgressBar,
    repetition: u32,
    repetitions: u32,
) -> impl FnMut(u64, u64, iolab_sim::progress::Measure) + 'static {
    let (cmd, origin, bar) = (cmd.to_owned(), origin.to_owned(), bar.clone());
    let started = std::time::Instant::now();
    let mut last_line = started;
    let lines = !progress::enabled() && !progress::is_quiet();
    let which = if repetitions > 1 {
        format!(" (repetition {} of {repetitions})", repetition + 1)
    } else {
        String::new()
    };
    move |done: u64, total: u64, measure: iolab_sim::progress::Measure| {
        if total == 0 {
            return;
        }
        let of = match measure {
            iolab_sim::progress::Measure::VirtualTime => "virtual time",
            iolab_sim::progress::Measure::Work(what) => what,
        };
        let frac = done as f64 / total as f64;
        let elapsed = started.elapsed().as_secs_f64();
        let left = if frac > 0.0 {
            format!(", about {:.0}s left", elapsed * (1.0 - frac) / frac)
        } else {
            String::new()
        };
        let text = format!("{origin}{which}: {:.0}% of {of}{left}", 100.0 * frac);
        if lines {
            if last_line.elapsed() >= std::time::Duration::from_secs(60) {
                last_line = std::time::Instant::now();
                eprintln!("iolab {cmd}: {text}");
            }
        } else {
            bar.set_message(text);
        }
    }
}

/// The progress bar of `count` runs: a bar with an ETA over several, a spinner with the
/// elapsed time for one (hidden off a terminal or with `--quiet`).
fn runs_progress(count: u64, what: &str) -> indicatif::ProgressBar {
    if count > 1 {
        progress::runs_bar(count, what)
    } else {
        progress::bar(count, "{spinner} running {msg}, {elapsed} elapsed")
    }
}

#[derive(Serialize)]
struct JsonOutput<'a> {
    experiments: Vec<JsonExperiment<'a>>,
}

/// An experiment's report in JSON; with `--runs N` above 1 its figures and effects are
/// means over the repetitions, and `repetitions` gives each figure's spread and each
/// repetition's seed.
#[derive(Serialize)]
struct JsonExperiment<'a> {
    #[serde(flatten)]
    report: &'a ExperimentReport,
    #[serde(skip_serializing_if = "Option::is_none")]
    repetitions: Option<JsonRepetitions>,
}

/// The repetitions behind a mean report.
#[derive(Serialize)]
struct JsonRepetitions {
    /// The repetitions' seeds, in order.
    seeds: Vec<u64>,
    /// Each figure's mean, standard deviation, minimum and maximum.
    figures: Vec<crate::repeat::Spread>,
    /// Whether every repetition gave exactly the same figures.
    identical: bool,
}

/// The repetitions of one experiment run with `--runs N` (N > 1), first seed `seed`.
struct Repeated {
    seed: u64,
    reports: Vec<ExperimentReport>,
}

/// Opens the results database, if storing; on failure prints the error and gives the exit code.
fn open_db(cmd: &str, path: Option<&Path>) -> Result<Option<ResultsDb>, ExitCode> {
    match path.map(ResultsDb::open).transpose() {
        Ok(db) => Ok(db),
        Err(e) => {
            eprintln!("iolab {cmd}: {e}");
            Err(ExitCode::from(e.exit_code()))
        }
    }
}

/// What one name on `iolab reproduce`'s command line is: an experiment file
/// (docs/EXPERIMENTS.md), bundled or the user's own, with its text.
struct Selected {
    experiment: reproduce::Experiment,
    text: String,
}

/// Resolves one name: a bundled experiment file or a path to an experiment file. The error
/// is the message to print (exit code 2).
fn select(name: &str, db_path: Option<&Path>) -> Result<Selected, String> {
    let mut selected = select_file(name)?;
    let experiment = &mut selected.experiment;
    if experiment.needs_stored_runs() {
        let Some(path) = db_path else {
            return Err(format!(
                "{}: figures take published values from stored runs (published_from), which needs the results database: drop --no-db",
                experiment.origin()
            ));
        };
        let db = ResultsDb::open_existing(path).map_err(|e| e.to_string())?;
        experiment
            .resolve_published(&mut |from, metric| stored_value(&db, from, metric))
            .map_err(|e| e.to_string())?;
    }
    Ok(selected)
}

/// The value of `metric` in stored run `from.run` (its configuration `from.config`, or its
/// only one), with a message naming what is there when it is not.
fn stored_value(
    db: &ResultsDb,
    from: &reproduce::PublishedFrom,
    metric: &str,
) -> Result<f64, String> {
    let m = stored_measurement(db, from.run, from.config.as_deref(), "with `config`")?;
    metric_value(&m, from.run, metric)
}

/// Stored run `run`'s configuration `config` (or its only one), with a message naming what
/// is there when it is not; `how` says how the caller names a configuration (`with
/// `config``, `as --to RUN:CONFIG`).
pub(crate) fn stored_measurement(
    db: &ResultsDb,
    run: i64,
    config: Option<&str>,
    how: &str,
) -> Result<iolab_sim::metrics::Measurement, String> {
    if !db.has_run(run).map_err(|e| e.to_string())? {
        return Err(format!(
            "run {run} is not in {} (`iolab runs list` shows what is)",
            db.path().display()
        ));
    }
    let mut ms = db.measurements(run).map_err(|e| e.to_string())?;
    let configs = |ms: &[iolab_sim::metrics::Measurement]| {
        ms.iter()
            .map(|m| format!("\"{}\"", m.config))
            .collect::<Vec<_>>()
            .join(", ")
    };
    match config {
        Some(c) => match ms.iter().position(|m| m.config == c) {
            Some(i) => Ok(ms.swap_remove(i)),
            None => Err(format!(
                "run {run} has no configuration \"{c}\": it has {}",
                configs(&ms)
            )),
        },
        None if ms.len() == 1 => Ok(ms.remove(0)),
        None => Err(format!(
            "run {run} has {} configurations: say which {how} (one of {})",
            ms.len(),
            configs(&ms)
        )),
    }
}

/// The value of `metric` in `m` (of stored run `run`), with a message naming the metrics
/// there when it is not.
pub(crate) fn metric_value(
    m: &iolab_sim::metrics::Measurement,
    run: i64,
    metric: &str,
) -> Result<f64, String> {
    m.metrics
        .iter()
        .find(|x| x.name == metric)
        .map(|x| x.value)
        .ok_or_else(|| {
            format!(
                "run {run} configuration \"{}\" has no metric `{metric}`: it has {}",
                m.config,
                m.metrics
                    .iter()
                    .map(|x| x.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })
}

fn select_file(name: &str) -> Result<Selected, String> {
    if let Some(text) = reproduce::bundled::text(name) {
        let experiment = reproduce::Experiment::parse(text, &reproduce::bundled::origin(name))
            .map_err(|e| e.to_string())?;
        return Ok(Selected {
            experiment,
            text: text.to_owned(),
        });
    }
    let path = Path::new(name);
    if name.ends_with(".toml") || path.is_file() {
        let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {name}: {e}"))?;
        if !reproduce::bundled::is_experiment_file(&text) {
            return Err(format!(
                "{name} is not an experiment file (docs/EXPERIMENTS.md): expected top-level \
                 `experiment` and `[base]`; a workload scenario runs with `iolab run {name}`"
            ));
        }
        let experiment = reproduce::Experiment::parse(&text, name).map_err(|e| e.to_string())?;
        return Ok(Selected { experiment, text });
    }
    Err(format!(
        "unknown experiment '{name}': expected one of {} or a path to an experiment file",
        reproduce::all_names().join(", ")
    ))
}

/// Writes every cell of the selected experiment files as a workload scenario file
/// `DIR/EXPERIMENT/CELL.toml`, which `iolab run` accepts, and prints the paths.
fn emit_scenarios(selected: &[Selected], dir: &Path, seed: u64) -> ExitCode {
    for Selected { experiment, .. } in selected {
        let cells = match experiment.cell_scenarios(seed) {
            Ok(c) => c,
            Err(e) => {
                eprintln!("iolab reproduce: {e}");
                return ExitCode::from(if e.is_bad_input() { 2 } else { 1 });
            }
        };
        let sub = dir.join(experiment.name());
        if let Err(e) = std::fs::create_dir_all(&sub) {
            eprintln!("iolab reproduce: cannot create {}: {e}", sub.display());
            return ExitCode::from(2);
        }
        for (cell, text) in cells {
            let path = sub.join(format!("{cell}.toml"));
            if let Err(e) = std::fs::write(&path, text) {
                eprintln!("iolab reproduce: cannot write {}: {e}", path.display());
                return ExitCode::from(2);
            }
            println!("{}", path.display());
        }
    }
    ExitCode::SUCCESS
}

/// Runs the named experiments (all when `names` is empty), storing each report in the
/// results database at `db_path` (when given) as soon as it completes. With `emit`, writes
/// each cell of the experiment files as a scenario file under that directory instead.
pub fn reproduce(
    names: &[String],
    options: ExperimentOptions,
    json: bool,
    db_path: Option<&Path>,
    emit: Option<&Path>,
) -> ExitCode {
    let wanted = wanted_names(names);
    let mut selected = Vec::with_capacity(wanted.len());
    for name in &wanted {
        match select(name, db_path) {
            Ok(s) => selected.push(s),
            Err(e) => {
                eprintln!("iolab reproduce: {e}");
                return ExitCode::from(2);
            }
        }
    }
    if let Some(dir) = emit {
        return emit_scenarios(&selected, dir, options.seed);
    }
    let mut db = match open_db("reproduce", db_path) {
        Ok(db) => db,
        Err(code) => return code,
    };
    let repetitions = options.runs.max(1);
    let mut reports = Vec::new();
    let mut spreads = Vec::new();
    for Selected { experiment, text } in &selected {
        let name = experiment.name();
        let run_one = |o: &ExperimentOptions| experiment.run(o);
        let reps = match run_repetitions(
            "reproduce",
            db.as_mut(),
            options,
            experiment.origin(),
            text,
            run_one,
        ) {
            Ok(r) => r,
            Err(Stopped::Store(code)) => return code,
            Err(Stopped::Run(e)) => {
                eprintln!("iolab reproduce: {name}: {e}");
                return ExitCode::from(if e.is_bad_input() { 2 } else { 1 });
            }
        };
        if repetitions > 1 {
            reports.push(crate::repeat::mean_report(&reps));
            spreads.push(Some(Repeated {
                seed: options.seed,
                reports: reps,
            }));
        } else {
            spreads.push(None);
            reports.extend(reps);
        }
    }
    let summary = reports.len() > 1;
    print_reports(&reports, &spreads, json, summary)
}

/// The experiments named on the command line, or the published ones when none is.
fn wanted_names(names: &[String]) -> Vec<String> {
    if names.is_empty() {
        reproduce::default_names()
            .into_iter()
            .map(str::to_owned)
            .collect()
    } else {
        names.to_vec()
    }
}

/// `iolab reproduce --refit` (`write_lock`) or `--cross-validate`: fits each selected
/// experiment's declared unknowns ([`reproduce::refit`]) and writes its lock file, or
/// reports the leave-one-out predictions of its calibration figures.
pub fn refit(
    names: &[String],
    seed: u64,
    jobs: Option<usize>,
    write_lock: bool,
    db_path: Option<&Path>,
) -> ExitCode {
    let wanted = wanted_names(names);
    let jobs = jobs
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1);
    for name in &wanted {
        let selected = match select(name, db_path) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("iolab reproduce: {e}");
                return ExitCode::from(2);
            }
        };
        let exp = &selected.experiment;
        let code = if write_lock {
            refit_one(exp, &selected.text, seed, jobs)
        } else {
            cross_validate_one(exp, seed, jobs)
        };
        if code != ExitCode::SUCCESS {
            return code;
        }
    }
    ExitCode::SUCCESS
}

fn refit_one(exp: &reproduce::Experiment, text: &str, seed: u64, jobs: usize) -> ExitCode {
    let lock_file = match lock_destination(exp, text) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("iolab reproduce: --refit {}: {e}", exp.refit_name());
            return ExitCode::from(2);
        }
    };
    let count = exp.unknowns().len();
    if count == 0 {
        println!(
            "{}: no declared unknowns (no calibration has a `range`): nothing to fit\n",
            exp.name()
        );
        return ExitCode::SUCCESS;
    }
    let bar = progress::bar(
        0,
        "{spinner} fitting {prefix}: {pos} points, {elapsed} elapsed: {msg}",
    );
    bar.set_prefix(exp.name().to_owned());
    let bar_in = bar.clone();
    let observer: reproduce::refit::Observer<'_> = Box::new(move |n, best| {
        bar_in.set_position(n as u64);
        bar_in.set_message(format!("best objective {best:.3e}"));
    });
    let result = reproduce::refit::refit(exp, seed, jobs, Some(observer));
    bar.finish_and_clear();
    let r = match result {
        Ok(Some(r)) => r,
        Ok(None) => return ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("iolab reproduce: --refit {}: {e}", exp.refit_name());
            return ExitCode::from(if e.is_bad_input() { 2 } else { 1 });
        }
    };
    println!(
        "refit of {} ({}), seed {seed}: {} declared unknown{}, {} figure{}",
        exp.name(),
        exp.origin(),
        count,
        if count == 1 { "" } else { "s" },
        r.targets.len(),
        if r.targets.len() == 1 { "" } else { "s" }
    );
    println!();
    print!("{}", crate::fit::fit_table(&r.unknowns, &r.targets, &r.fit));
    println!(
        "{} lab runs of cells ({} points)",
        r.lock.lab_runs, r.points
    );
    println!();
    // The header names the experiment file as it sits beside the lock (no absolute path).
    let named = if exp.origin().ends_with(" (bundled)") {
        format!("scenarios/experiments/{}.toml", exp.name())
    } else {
        Path::new(exp.origin()).file_name().map_or_else(
            || exp.origin().to_owned(),
            |f| f.to_string_lossy().into_owned(),
        )
    };
    let text = reproduce::refit::lock_text(&r.lock, &named);
    let tmp = lock_file.with_extension("toml.tmp");
    if let Err(e) = std::fs::write(&tmp, text).and_then(|()| std::fs::rename(&tmp, &lock_file)) {
        let _ = std::fs::remove_file(&tmp);
        eprintln!("iolab reproduce: cannot write {}: {e}", lock_file.display());
        return ExitCode::from(1);
    }
    eprintln!("iolab reproduce: wrote {}", lock_file.display());
    ExitCode::SUCCESS
}

/// Where `--refit` writes an experiment's lock file: beside a file; for a bundled
/// experiment, beside its source in scenarios/experiments/ under the current directory,
/// which must hold the same text.
fn lock_destination(exp: &reproduce::Experiment, text: &str) -> Result<std::path::PathBuf, String> {
    if exp.origin().ends_with(" (bundled)") {
        let source = Path::new("scenarios/experiments").join(format!("{}.toml", exp.name()));
        let on_disk = std::fs::read_to_string(&source).map_err(|_| {
            format!(
                "a bundled experiment's lock file is written beside its source, {}, which is not under the current directory: run from the iolab repository, or give the path of a copy of the experiment file",
                source.display()
            )
        })?;
        if on_disk != text {
            return Err(format!(
                "{} differs from the bundled experiment: rebuild iolab, or give the file's path",
                source.display()
            ));
        }
        Ok(reproduce::refit::lock_path(&source))
    } else {
        Ok(reproduce::refit::lock_path(Path::new(exp.origin())))
    }
}

fn cross_validate_one(exp: &reproduce::Experiment, seed: u64, jobs: usize) -> ExitCode {
    let out = match reproduce::refit::cross_validate(exp, seed, jobs) {
        Ok(o) => o,
        Err(e) => {
            eprintln!(
                "iolab reproduce: --cross-validate {}: {e}",
                exp.refit_name()
            );
            return ExitCode::from(if e.is_bad_input() { 2 } else { 1 });
        }
    };
    println!(
        "cross-validation of {} ({}), seed {seed}: each calibration figure left out of the fit, then predicted",
        exp.name(),
        exp.origin()
    );
    if out.is_empty() {
        println!(
            "no declared unknowns (no calibration has a `range`): nothing to cross-validate\n"
        );
        return ExitCode::SUCCESS;
    }
    println!(
        "{:<36} {:>14} {:>14} {:>10}",
        "figure", "published", "predicted", "error"
    );
    for c in &out {
        match c.predicted {
            Some(p) => println!(
                "{:<36} {:>14} {:>14} {:>10}",
                c.id,
                crate::fit::num(c.observed),
                crate::fit::num(p),
                crate::fit::pct(p / c.observed - 1.0)
            ),
            None if out.len() < 2 => println!(
                "{:<36} {:>14} {:>14} {:>10}  (the only calibration figure: nothing is left to fit)",
                c.id,
                crate::fit::num(c.observed),
                "-",
                "-"
            ),
            None => println!(
                "{:<36} {:>14} {:>14} {:>10}  (without it nothing fits {})",
                c.id,
                crate::fit::num(c.observed),
                "-",
                "-",
                c.unidentified.join(", ")
            ),
        }
    }
    println!("(an effect's values are ratios: 1 + change / 100)");
    println!();
    ExitCode::SUCCESS
}

/// Each fitted figure or effect with the lab's residual against its published value:
/// `d05_sas8.off +0.01%`, `ddw_1t_write +20.5% vs +20.4%`.
fn fitted_residuals(r: &ExperimentReport, ids: &[String]) -> Vec<String> {
    ids.iter()
        .map(|id| {
            if let Some(f) = r.figures.iter().find(|f| &f.id == id) {
                match f.error_pct() {
                    Some(e) => format!("{id} {}", crate::fit::pct(e / 100.0)),
                    None => id.clone(),
                }
            } else if let Some(e) = r.effects.iter().find(|e| &e.id == id) {
                format!(
                    "{id} lab {:+.1}% vs published {:+.1}%",
                    e.lab_pct, e.published_pct
                )
            } else {
                id.clone()
            }
        })
        .collect()
}

/// Runs one scenario file: an experiment file (docs/EXPERIMENTS.md) as `iolab reproduce
/// FILE` does, any other file as a workload scenario ([`iolab_sim::lab`]). The report is
/// stored in the results database at `db_path` when given.
pub fn run_file(
    path: &Path,
    runs: u32,
    seed: Option<u64>,
    json: bool,
    db_path: Option<&Path>,
) -> ExitCode {
    let origin = path.display().to_string();
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("iolab run: cannot read {origin}: {e}");
            return ExitCode::from(2);
        }
    };
    if reproduce::bundled::is_experiment_file(&text) {
        return self::reproduce(
            &[origin],
            ExperimentOptions {
                runs,
                seed: seed.unwrap_or(1),
            },
            json,
            db_path,
            None,
        );
    }
    run_lab(&text, &origin, runs, seed, json, db_path)
}

/// Why [`run_repetitions`] stopped early.
enum Stopped<E> {
    /// A repetition failed.
    Run(E),
    /// Storing failed (the message is printed); the exit code.
    Store(ExitCode),
}

/// Runs `options.runs` repetitions of a scenario, each a run of its own (`runs = 1`) with
/// seeds `options.seed`, `options.seed + 1`, ..., and stores each report as soon as it
/// completes. With more than one repetition the stored runs form a group: the first run's
/// id is every repetition's `group_id`, so `iolab compare gID ...` treats them as samples.
fn run_repetitions<E>(
    cmd: &str,
    mut db: Option<&mut ResultsDb>,
    options: ExperimentOptions,
    origin: &str,
    text: &str,
    mut run_one: impl FnMut(&ExperimentOptions) -> Result<ExperimentReport, E>,
) -> Result<Vec<ExperimentReport>, Stopped<E>> {
    let repetitions = options.runs.max(1);
    let mut reports = Vec::with_capacity(repetitions as usize);
    let mut group_id = None;
    let bar = runs_progress(u64::from(repetitions), "repetitions");
    bar.set_message(origin.to_owned());
    for i in 0..repetitions {
        let one = ExperimentOptions {
            runs: 1,
            seed: options.seed.wrapping_add(u64::from(i)),
        };
        let started_at = SystemTime::now();
        let hook = virtual_time_hook(cmd, origin, &bar, i, repetitions);
        let result = iolab_sim::progress::observe(hook, || run_one(&one));
        bar.inc(1);
        let report = match result {
            Ok(r) => r,
            Err(e) => {
                bar.finish_and_clear();
                return Err(Stopped::Run(e));
            }
        };
        if let Some(db) = db.as_deref_mut() {
            let run = NewRun {
                kind: "lab",
                group_id,
                label: None,
                scenario_origin: Some(origin),
                scenario_text: Some(text),
                seed: one.seed,
                started_at,
                finished_at: SystemTime::now(),
                report: &report,
            };
            let stored = if repetitions > 1 && group_id.is_none() {
                db.store_group_start(&run)
            } else {
                db.store(&run)
            };
            match stored {
                Ok(id) => {
                    progress::note(
                        &bar,
                        &format!("stored as run {id} in {}", db.path().display()),
                    );
                    group_id = group_id.or((repetitions > 1).then_some(id));
                }
                Err(e) => {
                    bar.finish_and_clear();
                    eprintln!("iolab {cmd}: {e}");
                    return Err(Stopped::Store(ExitCode::from(e.exit_code())));
                }
            }
        }
        reports.push(report);
    }
    bar.finish_and_clear();
    if let (Some(g), Some(db)) = (group_id, db) {
        eprintln!(
            "stored {repetitions} repetitions as group g{g} in {} (compare with `iolab compare g{g} ...`)",
            db.path().display()
        );
    }
    Ok(reports)
}

/// Runs the bundled example workload scenario `name`.
pub fn run_example(
    name: &str,
    runs: u32,
    seed: Option<u64>,
    json: bool,
    db_path: Option<&Path>,
) -> ExitCode {
    match lab::examples::example(name) {
        Some(text) => {
            let origin = format!("scenarios/examples/{name}.toml (bundled)");
            run_lab(text, &origin, runs, seed, json, db_path)
        }
        None => {
            eprintln!(
                "iolab run: unknown example '{name}': expected one of {}",
                lab::examples::example_names().join(", ")
            );
            ExitCode::from(2)
        }
    }
}

/// Validates a workload scenario completely, as `iolab run` and `iolab trace` take it: a
/// file with a top-level `experiment` key is refused with what to run instead
/// ([`reproduce::bundled::refuse_experiment_key`]); relative profile paths are resolved
/// against the file's directory when `origin` is a path.
pub(crate) fn validate_workload(text: &str, origin: &str) -> Result<lab::LabScenario, LabError> {
    reproduce::bundled::refuse_experiment_key(text, origin)?;
    let base = Path::new(origin).parent().filter(|p| p.is_dir());
    lab::validate(text, origin, base)
}

/// Runs a workload scenario: validates it completely before opening the database, so a
/// bad file stores nothing.
fn run_lab(
    text: &str,
    origin: &str,
    runs: u32,
    seed: Option<u64>,
    json: bool,
    db_path: Option<&Path>,
) -> ExitCode {
    let scenario = match validate_workload(text, origin) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("iolab run: {e}");
            return ExitCode::from(if e.is_bad_input() { 2 } else { 1 });
        }
    };
    let mut db = match open_db("run", db_path) {
        Ok(db) => db,
        Err(code) => return code,
    };
    let options = ExperimentOptions {
        runs,
        seed: seed.or(scenario.seed).unwrap_or(1),
    };
    // Each repetition is a lab run of its own; the workload outputs are kept for printing.
    let mut outputs = Vec::new();
    let run_one = |o: &ExperimentOptions| {
        let out = lab::run(
            &scenario,
            &LabOptions {
                runs: 1,
                seed: Some(o.seed),
            },
        )?;
        let report = out.report.clone();
        outputs.push(out);
        Ok::<_, LabError>(report)
    };
    match run_repetitions("run", db.as_mut(), options, origin, text, run_one) {
        Ok(_) => {}
        Err(Stopped::Store(code)) => return code,
        Err(Stopped::Run(e)) => {
            eprintln!("iolab run: {origin}: {e}");
            return ExitCode::from(if e.is_bad_input() { 2 } else { 1 });
        }
    }
    if json {
        // One document for all repetitions: fio's shape with a job group per repetition,
        // or the measurements of every repetition.
        // With several repetitions, each job group is named `NAME#i` (repetition i).
        let several = outputs.len() > 1;
        let encoded = match &scenario.workload {
            lab::spec::Workload::Fio(setup) => {
                let names: Vec<String> = (0..outputs.len())
                    .map(|i| {
                        if several {
                            format!("{}#{i}", scenario.name)
                        } else {
                            scenario.name.clone()
                        }
                    })
                    .collect();
                let jobs: Vec<_> = outputs
                    .iter()
                    .zip(&names)
                    .flat_map(|(o, name)| {
                        let jobs = o.fio.as_ref().map_or(&[][..], |f| &f.jobs[..]);
                        jobs.iter().zip(&o.report.measurements).map(move |(j, m)| {
                            let mut j = j.clone();
                            j.jobname = name.clone();
                            (j, m, o.seed)
                        })
                    })
                    .collect();
                let reps: Vec<_> = jobs
                    .iter()
                    .enumerate()
                    .map(|(i, (job, measurement, seed))| crate::fiojson::Repetition {
                        job,
                        measurement,
                        setup,
                        scenario: &scenario.name,
                        seed: *seed,
                        run: i as u32,
                    })
                    .collect();
                serde_json::to_string_pretty(&crate::fiojson::document(&reps))
            }
            _ => {
                let measurements: Vec<_> = outputs
                    .iter()
                    .flat_map(|o| o.report.measurements.iter().cloned())
                    .collect();
                let name = outputs.first().map_or("", |o| o.report.name.as_str());
                serde_json::to_string_pretty(&lab::LabJson::Measurements {
                    name,
                    seed: options.seed,
                    measurements: &measurements,
                })
            }
        };
        match encoded {
            Ok(s) => println!("{s}"),
            Err(e) => {
                eprintln!("iolab run: cannot encode the report as JSON: {e}");
                return ExitCode::from(1);
            }
        }
    } else {
        for out in &outputs {
            println!(
                "== {}: {} (seed {})",
                out.report.name, out.report.title, out.seed
            );
            print!("{}", out.report.report_text);
            for n in &out.report.notes {
                println!("note: {n}");
            }
        }
        // Several repetitions: every metric's mean ± sd over them, and whether they were
        // identical.
        if outputs.len() > 1 {
            let runs: Vec<&[_]> = outputs.iter().map(|o| &o.report.measurements[..]).collect();
            println!();
            print!(
                "{}",
                crate::repeat::render_metric_spread(&runs, options.seed)
            );
        }
    }
    ExitCode::SUCCESS
}

/// Prints experiment reports: one JSON document, or each report's text with its effects and
/// predicted-figure goals, then (with `summary`, for a text run over several experiments)
/// one line per experiment with its counts against both fidelity goals.
fn print_reports(
    reports: &[ExperimentReport],
    repeated: &[Option<Repeated>],
    json: bool,
    summary: bool,
) -> ExitCode {
    if json {
        let out = JsonOutput {
            experiments: reports
                .iter()
                .zip(repeated)
                .map(|(report, rep)| JsonExperiment {
                    report,
                    repetitions: rep.as_ref().map(|r| JsonRepetitions {
                        seeds: (0..r.reports.len() as u64)
                            .map(|i| r.seed.wrapping_add(i))
                            .collect(),
                        figures: crate::repeat::spreads(&r.reports),
                        identical: crate::repeat::identical(&r.reports),
                    }),
                })
                .collect(),
        };
        match serde_json::to_string_pretty(&out) {
            Ok(s) => println!("{s}"),
            Err(e) => {
                eprintln!("iolab: cannot encode the report as JSON: {e}");
                return ExitCode::from(1);
            }
        }
        return ExitCode::SUCCESS;
    }
    for (r, rep) in reports.iter().zip(repeated) {
        println!("== {}: {}", r.name, r.title);
        if let Some(rep) = rep {
            println!(
                "(the table is repetition 1 of {}, seed {}; figures, effects and goals below \
                 are means over the repetitions)",
                rep.reports.len(),
                rep.seed
            );
        }
        println!("{}", r.report_text.trim_end());
        println!();
        if let Some(rep) = rep {
            println!(
                "{}",
                crate::repeat::render_spread(&rep.reports, rep.seed).trim_end()
            );
            println!();
        }
        print!("{}", render_effects(r));
        print!("{}", render_figure_goals(r));
        for c in &r.calibrated {
            // A value that is not a number (a workfile's name) is in the parameter's text.
            let value = if c.value.is_nan() {
                String::new()
            } else {
                format!(" = {}", c.value)
            };
            match (c.range, &c.identifiability) {
                (Some([lo, hi]), Some(how)) => println!(
                    "calibrated: {}{value} (fitted by the tool in {lo}..{hi} to {}; {how})",
                    c.parameter,
                    fitted_residuals(r, &c.fitted_to).join(", ")
                ),
                _ => println!(
                    "calibrated: {}{value} (fitted to {})",
                    c.parameter,
                    c.fitted_to.join(", ")
                ),
            }
        }
        for n in &r.notes {
            println!("note: {n}");
        }
        println!();
    }
    if summary {
        print!("{}", render_fidelity_summary(reports));
    }
    ExitCode::SUCCESS
}
