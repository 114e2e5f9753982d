//! Experiments as data: one runner for every experiment file (docs/EXPERIMENTS.md).
//!
//! An experiment file names a lab scenario (`base`), the cells to run as patches of it,
//! declared calibrations, published figures, effects and a report layout. Every cell is
//! built into a lab scenario, checked by the lab's own validation and run by
//! [`crate::lab::run`]: what `iolab reproduce` validates is what `iolab run` gives, by
//! construction. [`Experiment::cell_scenarios`] gives each cell's scenario text, which
//! `iolab reproduce --emit-scenarios` writes out.

pub mod bundled;
pub mod data;
pub mod layout;
pub mod refit;

use std::path::{Path, PathBuf};

use crate::experiment::{Calibrated, Effect, ExperimentOptions, ExperimentReport, Figure, Role};
use crate::lab::{self, LabError, LabOptions};
use crate::metrics::Measurement;
use crate::tomlfile::{InputError, TomlDoc};
use crate::tomlpatch;

pub use data::{CellRef, ExperimentFile, PublishedFrom};
pub use refit::{FitLock, LockedValue};

/// The published experiments (SEEDS.md), in the order `iolab reproduce` runs them when no
/// name is given. Each is a bundled experiment file ([`bundled::names`]).
pub const PUBLISHED_ORDER: [&str; 5] = [
    "ipmmu-usb",
    "smmuv3-cmdq",
    "sba-vmerge",
    "pseries-ddw",
    "fands-iotlb",
];

/// The published experiments `iolab reproduce` runs when no name is given, in
/// [`PUBLISHED_ORDER`]: the bundled experiment files that are published experiments.
pub fn default_names() -> Vec<&'static str> {
    let bundled = bundled::names();
    PUBLISHED_ORDER
        .iter()
        .copied()
        .filter(|n| bundled.contains(n))
        .collect()
}

/// Every experiment name `iolab reproduce` knows: the published ones in order, then the
/// lab's own ([`extra_names`], run only when named).
pub fn all_names() -> Vec<&'static str> {
    let mut out = default_names();
    out.extend(extra_names());
    out
}

/// The bundled experiment files that are not published experiments (the lab's own, such as
/// `protection`: every figure a prediction): `iolab reproduce` runs them only when named.
pub fn extra_names() -> Vec<&'static str> {
    bundled::names()
        .into_iter()
        .filter(|n| !PUBLISHED_ORDER.contains(n))
        .collect()
}

/// Why an experiment file could not be read or run.
#[derive(Debug, thiserror::Error)]
pub enum ReproduceError {
    /// The experiment file is malformed or refers to something it does not define.
    #[error(transparent)]
    Input(#[from] InputError),
    /// A cell's scenario was refused by the lab, or its run failed.
    #[error("{}", cell_message(origin, cell, source))]
    Cell {
        /// The experiment file.
        origin: String,
        /// The cell's id.
        cell: String,
        /// What the lab said (boxed: a large error would make every `Result` large).
        #[source]
        source: Box<LabError>,
    },
}

/// A cell's error: the lab's own message when it already names the cell (a refused field
/// of the cell's scenario), else prefixed with the file and the cell.
fn cell_message(origin: &str, cell: &str, source: &LabError) -> String {
    match source {
        LabError::Input(_) => source.to_string(),
        _ => format!("{origin}: cell `{cell}`: {source}"),
    }
}

/// A lab error about a cell's generated scenario: its line and column are the generated
/// text's, which the user never sees, so they are dropped (the field's path names it).
pub(crate) fn without_position(e: LabError) -> LabError {
    match e {
        LabError::Input(InputError::Field {
            origin,
            field,
            problem,
            ..
        }) => LabError::Input(InputError::Field {
            origin,
            line: None,
            column: None,
            field,
            problem,
        }),
        other => other,
    }
}

impl ReproduceError {
    /// Whether the error is the user's input (exit code 2) rather than a run failure (1).
    pub fn is_bad_input(&self) -> bool {
        match self {
            Self::Input(_) => true,
            Self::Cell { source, .. } => source.is_bad_input(),
        }
    }
}

/// A parsed, checked experiment file.
#[derive(Clone, Debug)]
pub struct Experiment {
    /// The file's content.
    pub file: ExperimentFile,
    text: String,
    origin: String,
    base_dir: Option<PathBuf>,
    /// Per calibration: the fitted value of a declared unknown, from the lock file.
    fitted: Vec<Option<LockedValue>>,
    /// Per calibration: whether a declared unknown takes whole numbers only.
    integer: Vec<bool>,
    /// Why declared unknowns have no fitted value (no lock file, or a stale one).
    lock_problem: Option<String>,
}

/// One cell's outcome.
#[derive(Clone, Debug)]
pub struct CellResult {
    /// The cell.
    pub cell: CellRef,
    /// Its lab run (one measurement per repetition).
    pub run: lab::LabRun,
}

impl CellResult {
    /// The mean of `metric` over the repetitions; `None` when a repetition lacks it.
    pub fn metric(&self, metric: &str) -> Option<f64> {
        let ms = &self.run.report.measurements;
        if ms.is_empty() {
            return None;
        }
        let mut sum = 0.0;
        for m in ms {
            sum += m.metrics.iter().find(|x| x.name == metric)?.value;
        }
        Some(sum / ms.len() as f64)
    }

    fn metric_names(&self) -> Vec<String> {
        self.run
            .report
            .measurements
            .first()
            .map(|m| m.metrics.iter().map(|x| x.name.clone()).collect())
            .unwrap_or_default()
    }
}

impl Experiment {
    /// Parses and checks an experiment file. `origin` names it in errors; relative
    /// platform paths in its scenarios are resolved against `origin`'s directory.
    pub fn parse(text: &str, origin: &str) -> Result<Self, ReproduceError> {
        let doc = TomlDoc::parse(text, origin)?;
        let file: ExperimentFile = doc.deserialize()?;
        file.check(&doc)?;
        let base_dir = Path::new(origin)
            .parent()
            .filter(|p| p.is_dir())
            .map(Path::to_path_buf);
        let n = file.calibrations.len();
        let mut e = Self {
            file,
            text: text.to_owned(),
            origin: origin.to_owned(),
            base_dir,
            fitted: vec![None; n],
            integer: vec![false; n],
            lock_problem: None,
        };
        // Every cell's scenario must be one the lab accepts before anything runs; a declared
        // unknown is tried at both ends of its range.
        let ends = |pick: fn(&[f64; 2]) -> f64| -> Vec<(usize, f64)> {
            e.file
                .calibrations
                .iter()
                .enumerate()
                .filter_map(|(i, c)| c.range.as_ref().map(|r| (i, pick(r))))
                .collect()
        };
        let (low, high) = (ends(|r| r[0]), ends(|r| r[1]));
        // Whole ends are tried as integers (a float field takes them too); whether the
        // field refuses fractions is decided below.
        for (i, c) in e.file.calibrations.iter().enumerate() {
            if let Some([lo, hi]) = c.range {
                e.integer[i] = lo.fract() == 0.0 && hi.fract() == 0.0 && hi - lo >= 1.0;
            }
        }
        let mut applied = vec![false; n];
        let mut first_cell: Vec<Option<CellRef>> = vec![None; n];
        for cell in e.file.cells() {
            let (table, which) = e.build_cell_with(&cell, 1, &low)?;
            e.validate_cell(&cell, &table)?;
            e.check_calibration_overlap(&cell, &which)?;
            if which.iter().any(|&i| e.file.calibrations[i].is_unknown()) {
                let (table, _) = e.build_cell_with(&cell, 1, &high)?;
                e.validate_cell(&cell, &table)?;
            }
            for i in which {
                applied[i] = true;
                first_cell[i].get_or_insert_with(|| cell.clone());
            }
        }
        // An unknown takes whole numbers when its ends are whole and its field refuses a
        // fraction.
        for (i, c) in e.file.calibrations.iter().enumerate() {
            let (Some([lo, hi]), Some(cell)) = (c.range, &first_cell[i]) else {
                continue;
            };
            if lo.fract() != 0.0 || hi.fract() != 0.0 || hi - lo < 1.0 {
                continue;
            }
            let mut probe = low.clone();
            if let Some(p) = probe.iter_mut().find(|(k, _)| *k == i) {
                p.1 = lo + 0.5;
            }
            e.integer[i] = false;
            let (table, _) = e.build_cell_with(cell, 1, &probe)?;
            if let Err(err) = e.validate_cell(cell, &table) {
                e.integer[i] = err.to_string().contains("integer");
            }
        }
        e.load_lock();
        // A calibration whose filters match no cell (a misspelt platform, say) would change
        // nothing while the report declares it.
        if let Some(i) = applied.iter().position(|a| !a) {
            let k = &e.file.calibrations[i];
            let filter = if k.platforms.is_some() {
                "platforms"
            } else if k.rows.is_some() {
                "rows"
            } else {
                "cells"
            };
            return Err(e
                .doc()
                .field_error(
                    &format!("calibrations[{i}].{filter}"),
                    "the calibration applies to no cell: expected filters (platforms, rows, cells) that match at least one",
                )
                .into());
        }
        Ok(e)
    }

    /// Whether some figure takes its published value from a stored run
    /// ([`Experiment::resolve_published`] must fill them before the report means anything).
    pub fn needs_stored_runs(&self) -> bool {
        self.file.figures.iter().any(|f| f.published_from.is_some())
    }

    /// Fills the published value of every figure with `published_from`: `lookup(from,
    /// metric)` gives the stored value or says why there is none (the error then names the
    /// figure's field in the experiment file).
    pub fn resolve_published(
        &mut self,
        lookup: &mut dyn FnMut(&PublishedFrom, &str) -> Result<f64, String>,
    ) -> Result<(), ReproduceError> {
        let mut filled = Vec::new();
        {
            let doc = self.doc();
            for (i, f) in self.file.figures.iter().enumerate() {
                let Some(from) = &f.published_from else {
                    continue;
                };
                let metric = from.metric.as_deref().unwrap_or(&f.metric);
                let v = lookup(from, metric)
                    .map_err(|e| doc.field_error(&format!("figures[{i}].published_from"), e))?;
                // `scale` converts the metric's unit, the stored one's as the lab's.
                filled.push((i, v * f.scale.unwrap_or(1.0)));
            }
        }
        for (i, v) in filled {
            self.file.figures[i].published = Some(v);
        }
        Ok(())
    }

    /// The calibrations (indices, in file order) whose filters match `cell`, whose
    /// scenario before calibrations is `table`.
    fn calibrations_of(&self, cell: &CellRef, table: &toml::Table) -> Vec<usize> {
        let platform = table
            .get("machine")
            .and_then(|m| m.get("platform"))
            .and_then(toml::Value::as_str);
        let row = &self.file.rows[cell.row];
        self.file
            .calibrations
            .iter()
            .enumerate()
            .filter(|(_, k)| {
                k.platforms
                    .as_ref()
                    .map_or(true, |p| platform.is_some_and(|x| p.iter().any(|q| q == x)))
                    && k.rows.as_ref().map_or(true, |r| r.contains(&row.id))
                    && k.cells.as_ref().map_or(true, |c| c.contains(&cell.id))
            })
            .map(|(i, _)| i)
            .collect()
    }

    /// Two calibrations of one parameter that both apply to a cell: the later would
    /// silently win, so the file is refused.
    fn check_calibration_overlap(
        &self,
        cell: &CellRef,
        which: &[usize],
    ) -> Result<(), ReproduceError> {
        let cal = &self.file.calibrations;
        for (n, &j) in which.iter().enumerate() {
            if let Some(&i) = which[..n]
                .iter()
                .find(|&&i| cal[i].field == cal[j].field && cal[i].cost == cal[j].cost)
            {
                let what = if cal[j].field.is_some() {
                    "field"
                } else {
                    "cost"
                };
                return Err(self
                    .doc()
                    .field_error(
                        &format!("calibrations[{j}].{what}"),
                        format!(
                            "`{}` is calibrated by calibrations[{i}] too, both for cell {}: expected one value per parameter and cell",
                            cal[j].field.as_deref().or(cal[j].cost.as_deref()).unwrap_or_default(),
                            cell.id
                        ),
                    )
                    .into());
            }
        }
        Ok(())
    }

    /// The experiment's name.
    pub fn name(&self) -> &str {
        &self.file.experiment
    }

    /// Where the file came from.
    pub fn origin(&self) -> &str {
        &self.origin
    }

    fn doc(&self) -> TomlDoc<'_> {
        // The text parsed once already; a second parse cannot fail.
        TomlDoc::parse(&self.text, &self.origin).expect("parsed before")
    }

    /// The scenario of `cell` as a TOML table, with `seed` set.
    pub fn cell_table(&self, cell: &CellRef, seed: u64) -> Result<toml::Table, ReproduceError> {
        Ok(self.build_cell_with(cell, seed, &[])?.0)
    }

    /// The scenario of `cell` with `seed` set and the calibrations applied to it, declared
    /// unknowns at `overrides` (calibration index, value) or else at their fitted values.
    pub fn cell_table_with(
        &self,
        cell: &CellRef,
        seed: u64,
        overrides: &[(usize, f64)],
    ) -> Result<toml::Table, ReproduceError> {
        Ok(self.build_cell_with(cell, seed, overrides)?.0)
    }

    /// The value calibration `i` sets: its given value, or a declared unknown's override or
    /// fitted value.
    fn calibration_value(
        &self,
        doc: &TomlDoc<'_>,
        i: usize,
        overrides: &[(usize, f64)],
    ) -> Result<toml::Value, InputError> {
        let k = &self.file.calibrations[i];
        if let Some(v) = &k.value {
            return Ok(v.clone());
        }
        let x = overrides
            .iter()
            .find(|(j, _)| *j == i)
            .map(|(_, x)| *x)
            .or_else(|| self.fitted[i].as_ref().map(|l| l.value));
        match x {
            Some(x) if self.integer[i] => Ok(toml::Value::Integer(x.round() as i64)),
            Some(x) => Ok(toml::Value::Float(x)),
            None => Err(doc.field_error(
                &format!("calibrations[{i}].range"),
                format!(
                    "a declared unknown with no fitted value ({}): run `iolab reproduce --refit {}`, which fits it and writes the lock file beside the experiment file",
                    self.lock_problem.as_deref().unwrap_or("no lock file"),
                    self.refit_name()
                ),
            )),
        }
    }

    /// How `iolab reproduce --refit` names this experiment: its bundled name or its path.
    pub fn refit_name(&self) -> String {
        match self.origin.strip_suffix(" (bundled)") {
            Some(_) => self.file.experiment.clone(),
            None => self.origin.clone(),
        }
    }

    /// The scenario of `cell` with `seed` set, and the calibrations applied to it.
    fn build_cell_with(
        &self,
        cell: &CellRef,
        seed: u64,
        overrides: &[(usize, f64)],
    ) -> Result<(toml::Table, Vec<usize>), ReproduceError> {
        let doc = self.doc();
        let f = &self.file;
        let mut t = f.base.clone();
        let row = &f.rows[cell.row];
        apply(
            &doc,
            &mut t,
            &row.set,
            &row.unset,
            &format!("rows[{}]", cell.row),
        )?;
        if let Some(c) = cell.column {
            let col = &f.columns[c];
            apply(&doc, &mut t, &col.set, &col.unset, &format!("columns[{c}]"))?;
        }
        let which = self.calibrations_of(cell, &t);
        for &i in &which {
            let k = &f.calibrations[i];
            let at = format!("calibrations[{i}]");
            let value = self.calibration_value(&doc, i, overrides)?;
            if let Some(field) = &k.field {
                let steps = tomlpatch::parse_path(field)
                    .map_err(|e| doc.field_error(&format!("{at}.field"), e))?;
                tomlpatch::set_field(&mut t, &steps, value.clone(), true)
                    .map_err(|e| doc.field_error(&format!("{at}.field"), e))?;
            }
            if let Some(cost) = &k.cost {
                let mut entry = toml::Table::new();
                entry.insert("value".into(), value);
                if let Some(u) = &k.unit {
                    entry.insert("unit".into(), toml::Value::String(u.clone()));
                }
                entry.insert("source".into(), toml::Value::String(k.source.clone()));
                let mut costs = toml::Table::new();
                costs.insert(cost.clone(), toml::Value::Table(entry));
                let mut machine = toml::Table::new();
                machine.insert("costs".into(), toml::Value::Table(costs));
                let mut patch = toml::Table::new();
                patch.insert("machine".into(), toml::Value::Table(machine));
                tomlpatch::merge(&mut t, &patch).map_err(|e| doc.field_error(&at, e))?;
            }
        }
        t.insert("name".into(), toml::Value::String(cell.id.clone()));
        t.insert("seed".into(), toml::Value::Integer(seed as i64));
        Ok((t, which))
    }

    fn cell_origin(&self, cell: &CellRef) -> String {
        format!("{} (scenario of cell {})", self.origin, cell.id)
    }

    fn validate_cell(
        &self,
        cell: &CellRef,
        table: &toml::Table,
    ) -> Result<lab::LabScenario, ReproduceError> {
        let text = scenario_text(table);
        lab::validate(&text, &self.cell_origin(cell), self.base_dir.as_deref()).map_err(|source| {
            ReproduceError::Cell {
                origin: self.origin.clone(),
                cell: cell.id.clone(),
                source: Box::new(without_position(source)),
            }
        })
    }

    /// Every cell's scenario as a file `iolab run` accepts: `(cell id, text)`, in report
    /// order, each with its seed.
    pub fn cell_scenarios(&self, seed: u64) -> Result<Vec<(String, String)>, ReproduceError> {
        let mut out = Vec::new();
        for cell in self.file.cells() {
            let table = self.cell_table(&cell, seed)?;
            let header = format!(
                "# Cell {} of experiment {} ({}), as `iolab reproduce` runs it.\n\
                 # Emitted by `iolab reproduce --emit-scenarios`; `iolab run` on this file\n\
                 # measures what the experiment reports for the cell.\n",
                cell.id, self.file.experiment, self.origin
            );
            out.push((
                cell.id.clone(),
                format!("{header}{}", scenario_text(&table)),
            ));
        }
        Ok(out)
    }

    /// Runs every cell and assembles the report.
    pub fn run(&self, options: &ExperimentOptions) -> Result<ExperimentReport, ReproduceError> {
        self.run_with(options, &mut |_, _| {})
    }

    /// As [`Experiment::run`], calling `progress(done, total)` after each cell.
    pub fn run_with(
        &self,
        options: &ExperimentOptions,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<ExperimentReport, ReproduceError> {
        let runs = if options.runs > 1 {
            options.runs
        } else {
            self.file.runs.unwrap_or(1)
        };
        if let Some(i) = self
            .file
            .figures
            .iter()
            .position(|f| f.published_from.is_some() && f.published.is_none())
        {
            return Err(self
                .doc()
                .field_error(
                    &format!("figures[{i}].published_from"),
                    "the stored run was not looked up (the CLI reads it from the results database)",
                )
                .into());
        }
        let cells = self.file.cells();
        let mut results = Vec::with_capacity(cells.len());
        for (i, cell) in cells.iter().enumerate() {
            let table = self.cell_table(cell, options.seed)?;
            let scenario = self.validate_cell(cell, &table)?;
            let run = lab::run(&scenario, &LabOptions { runs, seed: None }).map_err(|source| {
                ReproduceError::Cell {
                    origin: self.origin.clone(),
                    cell: cell.id.clone(),
                    source: Box::new(source),
                }
            })?;
            results.push(CellResult {
                cell: cell.clone(),
                run,
            });
            progress(i + 1, cells.len());
        }
        self.report(runs, &results)
    }

    /// The figures of finished cells.
    pub fn figures(&self, results: &[CellResult]) -> Result<Vec<Figure>, ReproduceError> {
        let doc = self.doc();
        let mut out = Vec::with_capacity(self.file.figures.len());
        for (i, f) in self.file.figures.iter().enumerate() {
            let r = results
                .iter()
                .find(|r| r.cell.id == f.cell)
                .expect("checked: every figure's cell is a cell");
            let Some(v) = r.metric(&f.metric) else {
                return Err(doc
                    .field_error(
                        &format!("figures[{i}].metric"),
                        format!(
                            "cell {} measured no `{}`: it measured {}",
                            f.cell,
                            f.metric,
                            r.metric_names().join(", ")
                        ),
                    )
                    .into());
            };
            out.push(Figure {
                id: f.id().to_owned(),
                unit: f.unit.clone(),
                published: f.published,
                lab: v * f.scale.unwrap_or(1.0),
                role: f.role.unwrap_or(Role::Prediction),
            });
        }
        Ok(out)
    }

    fn report(
        &self,
        runs: u32,
        results: &[CellResult],
    ) -> Result<ExperimentReport, ReproduceError> {
        let figures = self.figures(results)?;
        let value = |id: &str| {
            figures
                .iter()
                .find(|f| f.id == id)
                .map(|f| f.lab)
                .expect("checked: effects name figures")
        };
        let effects: Vec<Effect> = self
            .file
            .effects
            .iter()
            .map(|e| {
                let (b, n) = (value(&e.base), value(&e.new));
                Effect {
                    id: e.id.clone(),
                    published_pct: e.published_pct,
                    lab_pct: if b == 0.0 { 0.0 } else { (n - b) / b * 100.0 },
                }
            })
            .collect();
        let calibrated = self
            .file
            .calibrations
            .iter()
            .enumerate()
            .map(|(i, c)| Calibrated {
                parameter: c.parameter(),
                value: self.fitted[i]
                    .as_ref()
                    .map_or_else(|| c.numeric_value(), |l| l.value),
                fitted_to: c.fitted_to.clone(),
                range: c.range,
                identifiability: self.fitted[i].as_ref().map(|l| {
                    if l.confounded_with.is_empty() {
                        l.identifiability.clone()
                    } else {
                        format!(
                            "{}, confounded with {}",
                            l.identifiability,
                            l.confounded_with.join(", ")
                        )
                    }
                }),
            })
            .collect();
        let notes = self
            .file
            .report
            .notes
            .iter()
            .map(|n| layout::fill_note(n, &figures, &effects))
            .collect();
        let report_text = layout::render(self, results, &figures, &effects, runs);
        let measurements: Vec<Measurement> = results
            .iter()
            .flat_map(|r| r.run.report.measurements.iter().cloned())
            .collect();
        Ok(ExperimentReport {
            name: self.file.experiment.clone(),
            title: self.file.title.clone(),
            runs,
            figures,
            effects,
            calibrated,
            report_text,
            notes,
            measurements,
        })
    }
}

/// Applies one patch (`set`, then `unset`) to a scenario table; errors name the patch.
fn apply(
    doc: &TomlDoc<'_>,
    t: &mut toml::Table,
    set: &toml::Table,
    unset: &[String],
    at: &str,
) -> Result<(), InputError> {
    tomlpatch::merge(t, set).map_err(|e| doc.field_error(&format!("{at}.set"), e))?;
    for (k, path) in unset.iter().enumerate() {
        if !tomlpatch::remove_field(t, path) {
            return Err(doc.field_error(
                &format!("{at}.unset[{k}]"),
                format!("`{path}` is not in the cell's scenario, so it cannot be removed"),
            ));
        }
    }
    Ok(())
}

/// A scenario table as TOML text.
fn scenario_text(t: &toml::Table) -> String {
    toml::to_string(t).expect("a table of TOML values always serialises")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_published_experiment_runs_by_default_once_in_order() {
        let names = default_names();
        // Every published experiment is a bundled experiment file: none is lost.
        assert_eq!(names, PUBLISHED_ORDER.to_vec());
        let all = all_names();
        assert!(all.starts_with(&names));
        // The lab's own experiment is known by name but never runs by default.
        assert!(all.contains(&"protection"));
        assert!(!names.contains(&"protection"));
        assert_eq!(extra_names(), vec!["protection"]);
    }
}
