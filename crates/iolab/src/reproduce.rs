//! `iolab reproduce` and `iolab run`: run experiments and print them beside the published
//! figures, in text (each report in its own format) or JSON.

use std::path::Path;
use std::process::ExitCode;
use std::time::SystemTime;

use iolab_sim::experiment::{render_effects, ExperimentOptions, ExperimentReport};
use iolab_sim::experiments::{self, ExperimentError, NAMES};
use serde::Serialize;

use crate::db::{NewRun, ResultsDb};

#[derive(Serialize)]
struct JsonOutput<'a> {
    experiments: Vec<&'a ExperimentReport>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    not_implemented: Vec<&'static str>,
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

/// Stores a finished report (when storing) and says so on standard error.
fn store(cmd: &str, db: Option<&mut ResultsDb>, run: &NewRun<'_>) -> Result<(), ExitCode> {
    let Some(db) = db else { return Ok(()) };
    match db.store(run) {
        Ok(id) => {
            eprintln!("stored as run {id} in {}", db.path().display());
            Ok(())
        }
        Err(e) => {
            eprintln!("iolab {cmd}: {e}");
            Err(ExitCode::from(e.exit_code()))
        }
    }
}

/// Runs the named experiments (all when `names` is empty), storing each report in the
/// results database at `db_path` (when given) as soon as it completes.
pub fn reproduce(
    names: &[String],
    options: ExperimentOptions,
    json: bool,
    db_path: Option<&Path>,
) -> ExitCode {
    let selected: Vec<&str> = if names.is_empty() {
        NAMES.to_vec()
    } else {
        names.iter().map(String::as_str).collect()
    };
    if let Some(unknown) = selected.iter().find(|n| !NAMES.contains(n)) {
        eprintln!(
            "iolab reproduce: unknown experiment '{unknown}': expected one of {}",
            NAMES.join(", ")
        );
        return ExitCode::from(2);
    }
    let mut db = match open_db("reproduce", db_path) {
        Ok(db) => db,
        Err(code) => return code,
    };
    let mut reports = Vec::new();
    let mut not_implemented = Vec::new();
    for name in selected {
        let started_at = SystemTime::now();
        match experiments::run_bundled(name, &options) {
            Ok(r) => {
                let origin = format!("scenarios/{name}.toml (bundled)");
                let run = NewRun {
                    kind: "lab",
                    group_id: None,
                    label: None,
                    scenario_origin: Some(&origin),
                    scenario_text: experiments::bundled_scenario(name).ok(),
                    seed: options.seed,
                    started_at,
                    finished_at: SystemTime::now(),
                    report: &r,
                };
                if let Err(code) = store("reproduce", db.as_mut(), &run) {
                    return code;
                }
                reports.push(r);
            }
            Err(ExperimentError::NotImplemented { name }) => not_implemented.push(name),
            Err(e) => {
                eprintln!("iolab reproduce: {name}: {e}");
                return ExitCode::from(if e.is_bad_input() { 2 } else { 1 });
            }
        }
    }
    print_reports(&reports, &not_implemented, json)
}

/// Runs one scenario file; its top-level `experiment` key names the experiment schema. The
/// report is stored in the results database at `db_path` when given.
pub fn run_file(
    path: &Path,
    options: ExperimentOptions,
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
    let name = match experiment_of(&text, &origin) {
        Ok(n) => n,
        Err(e) => {
            eprintln!("iolab run: {e}");
            return ExitCode::from(2);
        }
    };
    let mut db = match open_db("run", db_path) {
        Ok(db) => db,
        Err(code) => return code,
    };
    let started_at = SystemTime::now();
    match experiments::run_scenario(&name, &text, &origin, &options) {
        Ok(r) => {
            let run = NewRun {
                kind: "lab",
                group_id: None,
                label: None,
                scenario_origin: Some(&origin),
                scenario_text: Some(&text),
                seed: options.seed,
                started_at,
                finished_at: SystemTime::now(),
                report: &r,
            };
            if let Err(code) = store("run", db.as_mut(), &run) {
                return code;
            }
            print_reports(&[r], &[], json)
        }
        Err(ExperimentError::NotImplemented { name }) => print_reports(&[], &[name], json),
        Err(e) => {
            eprintln!("iolab run: {e}");
            ExitCode::from(if e.is_bad_input() { 2 } else { 1 })
        }
    }
}

/// Reads the `experiment` key of a scenario, with a clear error naming the file.
pub(crate) fn experiment_of(text: &str, origin: &str) -> Result<String, String> {
    let doc = iolab_sim::tomlfile::TomlDoc::parse(text, origin).map_err(|e| e.to_string())?;
    let table: toml::Table = toml::from_str(text).map_err(|e| e.to_string())?;
    match table.get("experiment") {
        Some(toml::Value::String(s)) if NAMES.contains(&s.as_str()) => Ok(s.clone()),
        Some(_) => Err(doc
            .field_error(
                "experiment",
                format!("expected one of {}", NAMES.join(", ")),
            )
            .to_string()),
        None => Err(format!(
            "Invalid {origin}: field `experiment`: missing; expected one of {}",
            NAMES.join(", ")
        )),
    }
}

fn print_reports(
    reports: &[ExperimentReport],
    not_implemented: &[&'static str],
    json: bool,
) -> ExitCode {
    if json {
        let out = JsonOutput {
            experiments: reports.iter().collect(),
            not_implemented: not_implemented.to_vec(),
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
    for r in reports {
        println!("== {}: {}", r.name, r.title);
        println!("{}", r.report_text.trim_end());
        println!();
        print!("{}", render_effects(r));
        for c in &r.calibrated {
            println!(
                "calibrated: {} = {} (fitted to {})",
                c.parameter,
                c.value,
                c.fitted_to.join(", ")
            );
        }
        for n in &r.notes {
            println!("note: {n}");
        }
        println!();
    }
    for name in not_implemented {
        println!("== {name}: not implemented yet (the lab cannot run this experiment so far)");
    }
    ExitCode::SUCCESS
}
