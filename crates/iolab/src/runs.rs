//! `iolab runs`: list, show and remove the runs kept in the results database; `iolab
//! import`: store real tools' outputs as runs.

use std::fmt::Write as _;
use std::path::Path;
use std::process::ExitCode;
use std::time::SystemTime;

use iolab::import;
use iolab_sim::experiment::ExperimentReport;
use iolab_sim::metrics::Measurement;

use crate::db::{DbError, NewRun, ResultsDb, RunSummary, StoredRun};
use crate::ids::RunSelection;
use crate::{Format, RunsCommand};

/// A tool whose output `iolab import` reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum ImportTool {
    /// fio `--output-format=json` or `json+`.
    Fio,
    /// bonnie++ CSV (1.03, 1.9x, 2.0x).
    Bonnie,
    /// The re-aim-7 results table.
    Reaim,
}

impl ImportTool {
    fn name(self) -> &'static str {
        match self {
            ImportTool::Fio => "fio",
            ImportTool::Bonnie => "bonnie",
            ImportTool::Reaim => "reaim",
        }
    }
}

/// One `--attr [CONFIG:]KEY=VALUE`: an optional configuration it is limited to (a row of
/// a multi-row file, by the name the import gives it), a key of lowercase letters, digits,
/// `_` and `.`, and a value.
fn parse_attr(text: &str) -> Result<(Option<String>, String, String), String> {
    let (k, v) = text.split_once('=').ok_or_else(|| {
        format!("--attr `{text}`: expected [CONFIG:]KEY=VALUE (e.g. iommu_mode=off, superspeed:usb_speed=superspeed)")
    })?;
    let (config, k) = match k.rsplit_once(':') {
        Some((c, k)) if !c.trim().is_empty() => (Some(c.trim().to_owned()), k),
        Some(_) => {
            return Err(format!(
                "--attr `{text}`: expected a configuration name before `:`"
            ))
        }
        None => (None, k),
    };
    let k = k.trim();
    let ok = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '.';
    if k.is_empty() || !k.chars().all(ok) {
        return Err(format!(
            "--attr `{text}`: expected a key of lowercase letters, digits, `_` and `.`, found `{k}`"
        ));
    }
    if v.trim().is_empty() {
        return Err(format!("--attr `{text}`: expected a value after `=`"));
    }
    Ok((config, k.to_owned(), v.trim().to_owned()))
}

/// `iolab import TOOL FILE`: parses the whole file first, then stores it in one
/// transaction; a bad file stores nothing (exit code 2). `attrs` (`KEY=VALUE`) are added
/// to every imported configuration, `CONFIG:KEY=VALUE` to configuration `CONFIG` only.
pub fn import(
    db_path: &Path,
    tool: ImportTool,
    file: &Path,
    label: Option<&str>,
    attrs: &[String],
) -> ExitCode {
    let name = tool.name();
    let shown = file.display().to_string();
    let extra = match attrs
        .iter()
        .map(|a| parse_attr(a))
        .collect::<Result<Vec<_>, _>>()
    {
        Ok(a) => a,
        Err(e) => {
            eprintln!("iolab import {name}: {e}");
            return ExitCode::from(2);
        }
    };
    let text = match std::fs::read_to_string(file) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("iolab import {name}: cannot read {shown}: {e}");
            return ExitCode::from(2);
        }
    };
    let parsed = match name {
        "fio" => import::fio::parse(&text),
        "bonnie" => import::bonnie::parse(&text),
        _ => import::reaim::parse(&text),
    };
    let measurements = match parsed {
        Ok(mut m) => {
            for (config, k, v) in &extra {
                if let Some(c) = config {
                    if !m.iter().any(|x| &x.config == c) {
                        let names: Vec<String> =
                            m.iter().map(|x| format!("\"{}\"", x.config)).collect();
                        eprintln!(
                            "iolab import {name}: --attr {c}:{k}={v}: {shown} has no configuration \"{c}\" (it has {}); nothing stored",
                            names.join(", ")
                        );
                        return ExitCode::from(2);
                    }
                }
                for x in &mut m {
                    if config.as_ref().map_or(true, |c| c == &x.config) {
                        x.attrs.insert(k.clone(), v.clone());
                    }
                }
            }
            m
        }
        Err(e) => {
            eprintln!("iolab import {name}: Invalid {shown}: {e}; nothing stored");
            return ExitCode::from(2);
        }
    };
    let label = label.map_or_else(
        || {
            file.file_name()
                .map_or_else(|| shown.clone(), |f| f.to_string_lossy().into_owned())
        },
        str::to_owned,
    );
    // bonnie++: a run per row (rows are often repetitions, `-x N`), the file's rows a group;
    // fio and re-aim: the file is one run.
    let per_run: Vec<Vec<Measurement>> = if tool == ImportTool::Bonnie {
        measurements.into_iter().map(|m| vec![m]).collect()
    } else {
        vec![measurements]
    };
    let reports: Vec<ExperimentReport> = per_run
        .into_iter()
        .map(|measurements| ExperimentReport {
            name: name.to_owned(),
            title: format!("{name} output imported from {shown}"),
            runs: 1,
            figures: Vec::new(),
            effects: Vec::new(),
            calibrated: Vec::new(),
            report_text: String::new(),
            notes: Vec::new(),
            measurements,
        })
        .collect();
    let kind = format!("import:{name}");
    let now = SystemTime::now();
    let runs: Vec<NewRun<'_>> = reports
        .iter()
        .map(|report| NewRun {
            kind: &kind,
            group_id: None,
            label: Some(&label),
            scenario_origin: Some(&shown),
            scenario_text: Some(&text),
            seed: 0,
            started_at: now,
            finished_at: now,
            report,
        })
        .collect();
    let stored = ResultsDb::open(db_path).and_then(|mut db| {
        let ids = db.store_group(&runs)?;
        Ok((ids, db.path().display().to_string()))
    });
    match stored {
        Ok((ids, path)) => {
            for (id, r) in ids.iter().zip(&reports) {
                let configs: Vec<&str> = r.measurements.iter().map(|m| m.config.as_str()).collect();
                eprintln!(
                    "imported {shown} as run {id} ({kind}): {} configuration(s): {}",
                    configs.len(),
                    configs.join(", ")
                );
            }
            if ids.len() > 1 {
                eprintln!(
                    "runs {}-{} form group g{} in {path}",
                    ids[0],
                    ids[ids.len() - 1],
                    ids[0]
                );
            } else {
                eprintln!("stored in {path}");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("iolab import {name}: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

/// Runs one `iolab runs` action against the database at `path`.
pub fn run(path: &Path, action: RunsCommand) -> ExitCode {
    match try_run(path, action) {
        Ok(Output::Report(out)) => {
            print!("{out}");
            ExitCode::SUCCESS
        }
        Ok(Output::Note(note)) => {
            eprint!("{note}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("iolab runs: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

/// What an action prints: a report on standard output (`list`, `show`), or a note about
/// what it changed on standard error (`rm`), as every command does.
enum Output {
    Report(String),
    Note(String),
}

fn try_run(path: &Path, action: RunsCommand) -> Result<Output, RunsError> {
    let selection = |text: &str| RunSelection::parse(text).map_err(RunsError::BadRuns);
    // The selection is checked before the database is opened.
    let chosen = match &action {
        RunsCommand::List { .. } => None,
        RunsCommand::Show { runs, .. } | RunsCommand::Rm { runs } => Some(selection(runs)?),
    };
    let mut db = ResultsDb::open_existing(path)?;
    let ids = match &chosen {
        Some(sel) => sel.resolve(&db)?,
        None => Vec::new(),
    };
    match action {
        RunsCommand::List { format } => Ok(Output::Report(render_list(&db.list()?, format))),
        RunsCommand::Show { format, .. } => {
            let runs = ids
                .iter()
                .map(|&id| db.show(id))
                .collect::<Result<Vec<_>, _>>()?;
            // JSON: an object for one run id, an array for a group, range or list.
            if format == Format::Json && !chosen.as_ref().is_some_and(RunSelection::is_single_run) {
                return Ok(Output::Report(json(&runs)));
            }
            let shown: Vec<String> = runs.iter().map(|r| render_run(r, format)).collect();
            Ok(Output::Report(shown.join("\n")))
        }
        RunsCommand::Rm { .. } => {
            db.remove_all(&ids)?;
            let path = db.path().display().to_string();
            Ok(Output::Note(
                ids.iter()
                    .map(|id| format!("removed run {id} from {path}\n"))
                    .collect(),
            ))
        }
    }
}

/// Why an `iolab runs` action failed.
#[derive(Debug, thiserror::Error)]
enum RunsError {
    /// The RUNS argument does not parse.
    #[error("{0}")]
    BadRuns(String),
    /// The database refused.
    #[error(transparent)]
    Db(#[from] DbError),
}

impl RunsError {
    fn exit_code(&self) -> u8 {
        match self {
            RunsError::BadRuns(_) => 2,
            RunsError::Db(e) => e.exit_code(),
        }
    }
}

fn json<T: serde::Serialize>(value: &T) -> String {
    // These types serialize infallibly (strings, numbers, options, vectors).
    let mut s = serde_json::to_string_pretty(value).unwrap_or_default();
    s.push('\n');
    s
}

fn render_list(runs: &[RunSummary], format: Format) -> String {
    if format == Format::Json {
        return json(&runs);
    }
    if runs.is_empty() {
        return "no stored runs\n".to_owned();
    }
    let group = |r: &RunSummary| {
        r.group_id
            .map_or_else(|| "-".to_owned(), |g| format!("g{g}"))
    };
    let kind_w = runs
        .iter()
        .map(|r| r.kind.len())
        .chain([4])
        .max()
        .unwrap_or(4);
    let exp_w = runs
        .iter()
        .map(|r| r.experiment.len())
        .chain([10])
        .max()
        .unwrap_or(10);
    let group_w = runs
        .iter()
        .map(|r| group(r).len())
        .chain([5])
        .max()
        .unwrap_or(5);
    let mut out = format!(
        "{:>5}  {:<kind_w$}  {:<group_w$}  {:<exp_w$}  {:>20}  {:>4}  {:<20}  {:>7}  {:>5}  label\n",
        "id", "kind", "group", "experiment", "seed", "runs", "started_at", "figures", "meas."
    );
    for r in runs {
        let _ = writeln!(
            out,
            "{:>5}  {:<kind_w$}  {:<group_w$}  {:<exp_w$}  {:>20}  {:>4}  {:<20}  {:>7}  {:>5}  {}",
            r.id,
            r.kind,
            group(r),
            r.experiment,
            r.seed,
            r.runs,
            r.started_at,
            r.figures,
            r.measurements,
            r.label.as_deref().unwrap_or("-")
        );
    }
    out
}

fn render_run(run: &StoredRun, format: Format) -> String {
    if format == Format::Json {
        return json(run);
    }
    let mut out = String::new();
    let _ = writeln!(
        out,
        "run {}: {} ({}), seed {}, {} run(s), iolab {}",
        run.id, run.experiment, run.kind, run.seed, run.runs, run.iolab_version
    );
    if let Some(g) = run.group_id {
        let _ = writeln!(out, "group: g{g}");
    }
    if let Some(label) = &run.label {
        let _ = writeln!(out, "label: {label}");
    }
    if let Some(origin) = &run.scenario_origin {
        let _ = writeln!(out, "scenario: {origin}");
    }
    let _ = writeln!(
        out,
        "started {}, finished {}",
        run.started_at, run.finished_at
    );
    if !run.figures.is_empty() {
        render_figures(&mut out, run);
    }
    for m in &run.measurements {
        render_measurement(&mut out, m);
    }
    out
}

fn render_figures(out: &mut String, run: &StoredRun) {
    let _ = writeln!(out);
    let id_w = run
        .figures
        .iter()
        .map(|f| f.id.len())
        .chain([6])
        .max()
        .unwrap_or(6);
    let _ = writeln!(
        out,
        "{:<id_w$}  {:<10} {:>14} {:>14}  role",
        "figure", "unit", "published", "lab"
    );
    for f in &run.figures {
        let published = f
            .published
            .map_or_else(|| "-".to_owned(), |p| format!("{p}"));
        let _ = writeln!(
            out,
            "{:<id_w$}  {:<10} {:>14} {:>14.3}  {}",
            f.id, f.unit, published, f.lab, f.role
        );
    }
    if !run.effects.is_empty() {
        let w = run
            .effects
            .iter()
            .map(|e| e.id.len())
            .chain([6])
            .max()
            .unwrap_or(6);
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "{:<w$}  {:>13} {:>13}",
            "effect", "published %", "lab %"
        );
        for e in &run.effects {
            let _ = writeln!(
                out,
                "{:<w$}  {:>13.1} {:>13.1}",
                e.id, e.published_pct, e.lab_pct
            );
        }
    }
}

fn render_measurement(out: &mut String, m: &Measurement) {
    let _ = writeln!(out);
    let attrs: Vec<String> = m.attrs.iter().map(|(k, v)| format!("{k}={v}")).collect();
    let _ = writeln!(out, "measurement {}  ({})", m.config, attrs.join(", "));
    let name_w = m
        .metrics
        .iter()
        .map(|x| x.name.len())
        .chain([6])
        .max()
        .unwrap_or(6);
    let unit_w = m
        .metrics
        .iter()
        .map(|x| x.unit.len())
        .chain([4])
        .max()
        .unwrap_or(4);
    if !m.metrics.is_empty() {
        let _ = writeln!(
            out,
            "  {:<name_w$}  {:<unit_w$}  {:>14}",
            "metric", "unit", "value"
        );
        for x in &m.metrics {
            let _ = writeln!(
                out,
                "  {:<name_w$}  {:<unit_w$}  {:>14}",
                x.name,
                x.unit,
                crate::compare::num(x.value, &x.unit)
            );
        }
    }
    if let Some(h) = &m.latency {
        // The histogram's percentiles are its buckets' upper bounds (at most 1/16 above the
        // exact value); the metrics above (`*.clat_p50_ns`, ...) are the exact ones.
        let t = |ns: u64| crate::compare::num(ns as f64, "ns");
        let _ = writeln!(
            out,
            "  latency histogram ({} samples; bucket upper bounds, within 6.25% above the exact \
             percentiles in the metrics): p50 {}, p99 {}, p99.9 {}, max {}",
            h.count(),
            t(h.percentile(50.0)),
            t(h.percentile(99.0)),
            t(h.percentile(99.9)),
            t(h.percentile(100.0))
        );
    }
    if let Some(c) = &m.cpu {
        let total = c.total_ns().max(1) as f64;
        let share = |v: u64| v as f64 / total * 100.0;
        // fio's `cpu.usr_pct`/`cpu.sys_pct` count the jobs' CPUs; this line every CPU.
        let _ = writeln!(
            out,
            "  cpu, all of the machine's CPUs (fio's cpu.usr_pct/sys_pct count the jobs' CPUs \
             only): user {:.1}%, system {:.1}%, spin {:.1}%, idle {:.1}% of {} CPU time",
            share(c.user_ns),
            share(c.system_ns),
            share(c.spin_ns),
            share(c.idle_ns),
            crate::compare::num(c.total_ns() as f64, "ns")
        );
    }
}
