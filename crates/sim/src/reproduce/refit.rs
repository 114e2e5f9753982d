//! Declared unknowns of experiment files: their fit (`iolab reproduce --refit`), the lock
//! file that keeps the fitted values beside the experiment file, and leave-one-out
//! cross-validation (`iolab reproduce --cross-validate`).
//!
//! A calibration with a `range` is a declared unknown. [`refit`] fits every declared
//! unknown of an experiment together ([`crate::fit`]) to the published values of the
//! figures (and effects) their `fitted_to` lists, running only the cells those figures need
//! with the run's seed. The result is a [`FitLock`], written as `NAME.fit.toml` beside
//! `NAME.toml`; the bundled experiments' lock files are compiled in beside them
//! ([`super::bundled`]). [`super::Experiment::parse`] reads the lock file beside a file
//! (or, for any text of a bundled experiment, the bundled lock) and uses a locked value
//! only while the declaration it was fitted for (parameter, range, figures) is unchanged;
//! otherwise the unknown has no value and the run says to refit.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::{CellRef, CellResult, Experiment, ReproduceError};
use crate::fit::{in_parallel, Evaluate, Fit, Fitter, Target, Unknown, Verdict};
use crate::lab::{self, LabOptions};

/// The fitted values of one experiment file's declared unknowns (`NAME.fit.toml`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FitLock {
    /// The experiment's name.
    pub experiment: String,
    /// The seed every cell ran with during the fit.
    pub seed: u64,
    /// Lab runs of cells the fit took.
    pub lab_runs: u64,
    /// One entry per declared unknown, in calibration order.
    pub fitted: Vec<LockedValue>,
}

/// One declared unknown's fitted value, with the declaration it was fitted for.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LockedValue {
    /// Index of the calibration in the experiment file.
    pub calibration: usize,
    /// The parameter, as the report names it.
    pub parameter: String,
    /// The declared range.
    pub range: [f64; 2],
    /// The declared figures and effects.
    pub fitted_to: Vec<String>,
    /// The fitted value.
    pub value: f64,
    /// `identified`, `flat`, `plateau`, `at-lower-bound` or `at-upper-bound`.
    pub identifiability: String,
    /// Per fitted figure: percent change of the figure per percent change of the value.
    pub elasticity: BTreeMap<String, f64>,
    /// The other unknowns that move the figures alike (the figures identify a combination).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub confounded_with: Vec<String>,
}

/// The lock file's name beside an experiment file: `NAME.fit.toml` for `NAME.toml`.
pub fn lock_path(experiment_file: &Path) -> std::path::PathBuf {
    let stem = experiment_file
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    experiment_file.with_file_name(format!("{stem}.fit.toml"))
}

/// The lock file's text: a header saying what wrote it, then the values.
pub fn lock_text(lock: &FitLock, experiment_origin: &str) -> String {
    format!(
        "# Fitted values of the declared unknowns (calibrations with a `range`) of\n\
         # {experiment_origin}, written by `iolab reproduce --refit`.\n\
         # Do not edit: refit. A test fails when these are no longer the fit.\n{}",
        toml::to_string(lock).expect("a lock serialises")
    )
}

fn verdict_key(v: Verdict) -> &'static str {
    match v {
        Verdict::Identified => "identified",
        Verdict::Flat => "flat",
        Verdict::Plateau => "plateau",
        Verdict::AtLowerBound => "at-lower-bound",
        Verdict::AtUpperBound => "at-upper-bound",
    }
}

impl Experiment {
    /// Reads the lock file that applies (beside a file origin, else the bundled one of the
    /// same experiment) and takes each value whose declaration is unchanged.
    pub(super) fn load_lock(&mut self) {
        if !self.file.calibrations.iter().any(|c| c.is_unknown()) {
            return;
        }
        let beside = (!self.origin.ends_with(" (bundled)"))
            .then(|| lock_path(Path::new(&self.origin)))
            .filter(|p| p.is_file());
        let (text, lock_origin) = match beside {
            Some(p) => match std::fs::read_to_string(&p) {
                Ok(t) => (t, p.display().to_string()),
                Err(e) => {
                    self.lock_problem = Some(format!("cannot read {}: {e}", p.display()));
                    return;
                }
            },
            None => match super::bundled::lock(&self.file.experiment) {
                Some(t) => (
                    t.to_owned(),
                    format!(
                        "scenarios/experiments/{}.fit.toml (bundled)",
                        self.file.experiment
                    ),
                ),
                None => {
                    self.lock_problem = Some(format!(
                        "no lock file {}",
                        lock_path(Path::new(self.origin.trim_end_matches(" (bundled)"))).display()
                    ));
                    return;
                }
            },
        };
        if let Err(problem) = self.apply_lock(&text) {
            self.lock_problem = Some(format!("{lock_origin}: {problem}"));
        }
    }

    /// Takes the values of lock file `text` whose declarations match; the problem when one
    /// does not (the values already taken stay).
    pub fn apply_lock(&mut self, text: &str) -> Result<(), String> {
        let lock: FitLock =
            toml::from_str(text).map_err(|e| format!("not a lock file: {}", e.message()))?;
        if lock.experiment != self.file.experiment {
            return Err(format!(
                "it is the lock file of experiment \"{}\", not \"{}\"",
                lock.experiment, self.file.experiment
            ));
        }
        let mut problem = None;
        for (i, c) in self.file.calibrations.iter().enumerate() {
            let Some(range) = c.range else { continue };
            // The entry fitted for this declaration (parameter, range, figures); among
            // several, the one at this index (an edited copy may have moved it).
            let same = |l: &&LockedValue| {
                l.parameter == c.parameter() && l.range == range && l.fitted_to == c.fitted_to
            };
            let matching: Vec<&LockedValue> = lock.fitted.iter().filter(same).collect();
            let entry = match matching.as_slice() {
                [one] => Some(*one),
                [] => None,
                several => several.iter().find(|l| l.calibration == i).copied(),
            };
            match entry {
                Some(l) if (range[0]..=range[1]).contains(&l.value) => {
                    self.fitted[i] = Some(l.clone());
                }
                Some(_) => {
                    problem.get_or_insert(format!(
                        "calibrations[{i}]'s locked value is outside its range"
                    ));
                }
                None if lock.fitted.iter().any(|l| l.calibration == i) => {
                    problem.get_or_insert(format!(
                        "calibrations[{i}] was fitted for another declaration (parameter, range or fitted_to changed)"
                    ));
                }
                None => {
                    problem.get_or_insert(format!("calibrations[{i}] has no fitted value"));
                }
            }
        }
        problem.map_or(Ok(()), Err)
    }

    /// The declared unknowns: (calibration index, unknown), in file order.
    pub fn unknowns(&self) -> Vec<(usize, Unknown)> {
        self.file
            .calibrations
            .iter()
            .enumerate()
            .filter_map(|(i, c)| {
                c.range.map(|[lo, hi]| {
                    (
                        i,
                        Unknown {
                            name: c.parameter(),
                            lo,
                            hi,
                            integer: self.integer[i],
                        },
                    )
                })
            })
            .collect()
    }

    /// The fitted value of every declared unknown, if the lock gave them all.
    pub fn fitted_values(&self) -> Option<Vec<(usize, f64)>> {
        self.unknowns()
            .iter()
            .map(|(i, _)| self.fitted[*i].as_ref().map(|l| (*i, l.value)))
            .collect()
    }

    /// The figures and effects the declared unknowns are fitted to, each once, with their
    /// published values; an error names a figure without one.
    pub fn fit_targets(&self) -> Result<Vec<FitTarget>, ReproduceError> {
        let doc = self.doc();
        let mut out: Vec<FitTarget> = Vec::new();
        for (i, c) in self.file.calibrations.iter().enumerate() {
            if !c.is_unknown() {
                continue;
            }
            for (k, id) in c.fitted_to.iter().enumerate() {
                if let Some(t) = out.iter_mut().find(|t| &t.id == id) {
                    t.calibrations.push(i);
                    continue;
                }
                let (kind, observed) = if let Some(e) =
                    self.file.effects.iter().position(|e| &e.id == id)
                {
                    (
                        TargetKind::Effect(e),
                        1.0 + self.file.effects[e].published_pct / 100.0,
                    )
                } else {
                    let f = self
                        .file
                        .figures
                        .iter()
                        .position(|f| f.id() == id)
                        .expect("checked: fitted_to names figures or effects");
                    let Some(p) = self.file.figures[f].published else {
                        return Err(doc
                            .field_error(
                                &format!("calibrations[{i}].fitted_to[{k}]"),
                                format!(
                                    "figure \"{id}\" has no published value to fit to (fit to an effect, or give the figure `published`)"
                                ),
                            )
                            .into());
                    };
                    (TargetKind::Figure(f), p)
                };
                out.push(FitTarget {
                    id: id.clone(),
                    kind,
                    observed,
                    calibrations: vec![i],
                });
            }
        }
        Ok(out)
    }

    /// The cells the targets' figures are measured in, in report order.
    fn cells_of(&self, targets: &[FitTarget]) -> Vec<CellRef> {
        let mut figures: Vec<usize> = Vec::new();
        for t in targets {
            match t.kind {
                TargetKind::Figure(f) => figures.push(f),
                TargetKind::Effect(e) => {
                    let e = &self.file.effects[e];
                    for id in [&e.base, &e.new] {
                        if let Some(f) = self.file.figures.iter().position(|f| f.id() == id) {
                            figures.push(f);
                        }
                    }
                }
            }
        }
        self.file
            .cells()
            .into_iter()
            .filter(|c| figures.iter().any(|&f| self.file.figures[f].cell == c.id))
            .collect()
    }

    /// A figure's lab value in finished cells.
    fn figure_value(&self, f: usize, results: &[CellResult]) -> Result<f64, ReproduceError> {
        let spec = &self.file.figures[f];
        let r = results
            .iter()
            .find(|r| r.cell.id == spec.cell)
            .expect("the figure's cell ran");
        let v = r.metric(&spec.metric).ok_or_else(|| {
            ReproduceError::from(self.doc().field_error(
                &format!("figures[{f}].metric"),
                format!(
                    "cell {} measured no `{}`: it measured {}",
                    spec.cell,
                    spec.metric,
                    r.metric_names().join(", ")
                ),
            ))
        })?;
        Ok(v * spec.scale.unwrap_or(1.0))
    }

    /// A target's lab value: a figure's value, or an effect's ratio new / base.
    fn target_value(&self, t: &FitTarget, results: &[CellResult]) -> Result<f64, ReproduceError> {
        match t.kind {
            TargetKind::Figure(f) => self.figure_value(f, results),
            TargetKind::Effect(e) => {
                let e = &self.file.effects[e];
                let idx = |id: &str| {
                    self.file
                        .figures
                        .iter()
                        .position(|f| f.id() == id)
                        .expect("checked: effects name figures")
                };
                let base = self.figure_value(idx(&e.base), results)?;
                let new = self.figure_value(idx(&e.new), results)?;
                Ok(if base == 0.0 { f64::NAN } else { new / base })
            }
        }
    }

    /// Runs `cells` once each with `seed`, the declared unknowns at `overrides`.
    fn run_cell(
        &self,
        cell: &CellRef,
        seed: u64,
        overrides: &[(usize, f64)],
    ) -> Result<CellResult, ReproduceError> {
        let table = self.cell_table_with(cell, seed, overrides)?;
        let scenario = self.validate_cell(cell, &table)?;
        let run = lab::run(
            &scenario,
            &LabOptions {
                runs: 1,
                seed: None,
            },
        )
        .map_err(|source| ReproduceError::Cell {
            origin: self.origin.clone(),
            cell: cell.id.clone(),
            source: Box::new(source),
        })?;
        Ok(CellResult {
            cell: cell.clone(),
            run,
        })
    }
}

/// What a declared unknown is fitted to.
#[derive(Clone, Debug, PartialEq)]
pub struct FitTarget {
    /// The figure's or effect's id.
    pub id: String,
    /// Which it is.
    pub kind: TargetKind,
    /// Its published value (an effect's as the ratio `1 + change / 100`).
    pub observed: f64,
    /// The calibrations that list it.
    pub calibrations: Vec<usize>,
}

/// A figure or an effect, by index in the experiment file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TargetKind {
    /// `figures[i]`.
    Figure(usize),
    /// `effects[i]`: its published change, as the ratio of its two figures.
    Effect(usize),
}

/// The lab as the fitter sees an experiment: every point runs the targets' cells.
struct ExperimentLab<'e> {
    exp: &'e Experiment,
    unknowns: Vec<usize>,
    targets: Vec<FitTarget>,
    cells: Vec<CellRef>,
    seed: u64,
    jobs: usize,
    lab_runs: u64,
}

impl Evaluate for ExperimentLab<'_> {
    type Error = ReproduceError;

    fn evaluate(&mut self, points: &[Vec<f64>]) -> Result<Vec<Vec<f64>>, ReproduceError> {
        let tasks: Vec<(usize, usize)> = (0..points.len())
            .flat_map(|p| (0..self.cells.len()).map(move |c| (p, c)))
            .collect();
        let overrides: Vec<Vec<(usize, f64)>> = points
            .iter()
            .map(|p| {
                self.unknowns
                    .iter()
                    .copied()
                    .zip(p.iter().copied())
                    .collect()
            })
            .collect();
        let results = in_parallel(self.jobs, &tasks, |&(p, c)| {
            self.exp.run_cell(&self.cells[c], self.seed, &overrides[p])
        });
        let mut per_point: Vec<Vec<CellResult>> = vec![Vec::new(); points.len()];
        for (&(p, _), result) in tasks.iter().zip(results) {
            self.lab_runs += 1;
            per_point[p].push(result?);
        }
        per_point
            .iter()
            .map(|results| {
                self.targets
                    .iter()
                    .map(|t| self.exp.target_value(t, results))
                    .collect()
            })
            .collect()
    }
}

/// A finished refit: the lock to write and what to print.
#[derive(Clone, Debug)]
pub struct Refit {
    /// The lock file's content.
    pub lock: FitLock,
    /// The fit itself.
    pub fit: Fit,
    /// The unknowns, in calibration order.
    pub unknowns: Vec<Unknown>,
    /// The targets, as the fitter saw them.
    pub targets: Vec<Target>,
    /// Points evaluated.
    pub points: usize,
}

/// Progress of a fit: (points evaluated, best objective).
pub type Observer<'o> = Box<dyn FnMut(usize, f64) + 'o>;

fn lab_for<'e>(
    exp: &'e Experiment,
    seed: u64,
    jobs: usize,
) -> Result<Option<ExperimentLab<'e>>, ReproduceError> {
    let unknowns = exp.unknowns();
    if unknowns.is_empty() {
        return Ok(None);
    }
    let targets = exp.fit_targets()?;
    let cells = exp.cells_of(&targets);
    Ok(Some(ExperimentLab {
        exp,
        unknowns: unknowns.iter().map(|(i, _)| *i).collect(),
        targets,
        cells,
        seed,
        jobs,
        lab_runs: 0,
    }))
}

fn plain_targets(targets: &[FitTarget], group_by_target: bool) -> Vec<Target> {
    targets
        .iter()
        .enumerate()
        .map(|(g, t)| Target {
            name: t.id.clone(),
            observed: t.observed,
            group: if group_by_target { g } else { 0 },
        })
        .collect()
}

/// Fits `exp`'s declared unknowns (None when it has none), on `jobs` threads.
pub fn refit(
    exp: &Experiment,
    seed: u64,
    jobs: usize,
    observer: Option<Observer<'_>>,
) -> Result<Option<Refit>, ReproduceError> {
    let Some(mut lab) = lab_for(exp, seed, jobs)? else {
        return Ok(None);
    };
    let unknowns: Vec<Unknown> = exp.unknowns().into_iter().map(|(_, u)| u).collect();
    let targets = plain_targets(&lab.targets, false);
    let fit_targets = lab.targets.clone();
    let (fit, points) = {
        let mut fitter = Fitter::new(unknowns.clone(), targets.clone(), &mut lab)
            .map_err(|e| ReproduceError::from(exp.doc().field_error("calibrations", e)))?;
        if let Some(o) = observer {
            fitter.observe(o);
        }
        let fit = fitter.fit()?;
        (fit, fitter.evaluations())
    };
    let fitted = exp
        .unknowns()
        .iter()
        .enumerate()
        .map(|(j, (i, u))| {
            let c = &exp.file.calibrations[*i];
            LockedValue {
                calibration: *i,
                parameter: c.parameter(),
                range: [u.lo, u.hi],
                fitted_to: c.fitted_to.clone(),
                value: fit.values[j],
                identifiability: verdict_key(fit.sensitivity[j].verdict).to_owned(),
                elasticity: fit_targets
                    .iter()
                    .zip(&fit.sensitivity[j].elasticity)
                    .filter(|(t, _)| t.calibrations.contains(i))
                    .map(|(t, e)| (t.id.clone(), if e.is_finite() { round3(*e) } else { 0.0 }))
                    .collect(),
                confounded_with: fit
                    .confounded
                    .iter()
                    .filter_map(|&(a, b)| {
                        (a == j)
                            .then_some(b)
                            .or((b == j).then_some(a))
                            .map(|o| unknowns[o].name.clone())
                    })
                    .collect(),
            }
        })
        .collect();
    Ok(Some(Refit {
        lock: FitLock {
            experiment: exp.file.experiment.clone(),
            seed,
            lab_runs: lab.lab_runs,
            fitted,
        },
        fit,
        unknowns,
        targets,
        points,
    }))
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// One calibration figure left out of the fit, then predicted.
#[derive(Clone, Debug, PartialEq)]
pub struct CrossValidated {
    /// The figure or effect left out.
    pub id: String,
    /// Its published value (an effect's as a ratio).
    pub observed: f64,
    /// The lab's prediction without it, or `None` when some unknown has no other figure to
    /// be fitted to (the prediction would be a guess).
    pub predicted: Option<f64>,
    /// The unknowns left without a figure when it is left out.
    pub unidentified: Vec<String>,
}

/// Refits `exp` with each calibration figure left out in turn and predicts it.
pub fn cross_validate(
    exp: &Experiment,
    seed: u64,
    jobs: usize,
) -> Result<Vec<CrossValidated>, ReproduceError> {
    let Some(mut lab) = lab_for(exp, seed, jobs)? else {
        return Ok(Vec::new());
    };
    let unknowns = exp.unknowns();
    let fit_targets = lab.targets.clone();
    let targets = plain_targets(&fit_targets, true);
    let plain: Vec<Unknown> = unknowns.iter().map(|(_, u)| u.clone()).collect();
    let mut fitter = Fitter::new(plain, targets.clone(), &mut lab)
        .map_err(|e| ReproduceError::from(exp.doc().field_error("calibrations", e)))?;
    let mut out = Vec::new();
    for (g, t) in fit_targets.iter().enumerate() {
        // The unknowns with no other target once this one is out: refitting would only
        // guess them, so nothing is predicted.
        let unidentified: Vec<String> = unknowns
            .iter()
            .filter(|(i, _)| {
                !fit_targets
                    .iter()
                    .enumerate()
                    .any(|(h, o)| h != g && o.calibrations.contains(i))
            })
            .map(|(_, u)| u.name.clone())
            .collect();
        let predicted = if unidentified.is_empty() && fit_targets.len() > 1 {
            fitter.leave_group_out(g)?.predicted.first().map(|p| p.1)
        } else {
            None
        };
        out.push(CrossValidated {
            id: t.id.clone(),
            observed: t.observed,
            predicted,
            unidentified,
        });
    }
    if fit_targets.len() < 2 {
        out.iter_mut().for_each(|c| c.predicted = None);
    }
    Ok(out)
}
