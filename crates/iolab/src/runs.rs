//! `iolab runs`: list, show and remove the runs kept in the results database.

use std::fmt::Write as _;
use std::path::Path;
use std::process::ExitCode;

use crate::db::{DbError, ResultsDb, RunSummary, StoredRun};
use crate::{Format, RunsCommand};

/// Runs one `iolab runs` action against the database at `path`.
pub fn run(path: &Path, action: RunsCommand) -> ExitCode {
    match try_run(path, action) {
        Ok(out) => {
            print!("{out}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("iolab runs: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

fn try_run(path: &Path, action: RunsCommand) -> Result<String, DbError> {
    // Listing a database that does not exist yet shows no runs, without creating it.
    if !path.exists() {
        return match action {
            RunsCommand::List { format } => Ok(render_list(&[], format)),
            RunsCommand::Show { id, .. } | RunsCommand::Rm { id } => Err(DbError::NoSuchRun {
                path: path.to_owned(),
                id,
            }),
        };
    }
    let db = ResultsDb::open(path)?;
    match action {
        RunsCommand::List { format } => Ok(render_list(&db.list()?, format)),
        RunsCommand::Show { id, format } => Ok(render_run(&db.show(id)?, format)),
        RunsCommand::Rm { id } => {
            db.remove(id)?;
            Ok(format!("removed run {id} from {}\n", db.path().display()))
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
    let mut out = format!(
        "{:>5}  {:<14} {:>20} {:>5}  {:<20}  {:>7}\n",
        "id", "experiment", "seed", "runs", "started_at", "figures"
    );
    for r in runs {
        let _ = writeln!(
            out,
            "{:>5}  {:<14} {:>20} {:>5}  {:<20}  {:>7}",
            r.id, r.experiment, r.seed, r.runs, r.started_at, r.figures
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
    if let Some(origin) = &run.scenario_origin {
        let _ = writeln!(out, "scenario: {origin}");
    }
    let _ = writeln!(
        out,
        "started {}, finished {}",
        run.started_at, run.finished_at
    );
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
    out
}
