//! `iolab sweep`: run a parameter grid over a base scenario, in parallel, storing every point.
//!
//! A grid file names a base scenario and a list of axes:
//!
//! ```toml
//! name = "cmdq-depth"             # optional; default: the grid file's stem
//! scenario = "fio-nvme-strict"    # a bundled example, or a path relative to this file
//! seed = 1                        # optional base seed (default 1)
//! runs = 1                        # optional repetitions: the seed axis seed..seed+runs-1
//! seeds = [1, 2, 3]               # optional: a seed axis (the innermost one; not with runs)
//!
//! [set]                           # optional: fields fixed for every point
//! "workload.runtime_ms" = 10
//!
//! [[axis]]
//! field = "workload.iodepth"      # a dotted path of TOML keys and array indices
//! values = [8, 16, 32]
//! ```
//!
//! The points are the cartesian product of the axes, enumerated in a fixed order: the first
//! axis varies slowest, the seed axis fastest. Point `i` is the base scenario parsed as TOML,
//! each axis' field set to the point's value, and written out again. Setting a field that
//! holds a `{ value = ..., source = "..." }` table to a plain value replaces its `value`
//! and keeps the source. A path the base scenario does not have is an error naming the grid
//! file, the axis and the path, found before anything runs.
//!
//! The base is a workload scenario (docs/SCENARIOS.md): a file, or a bundled example
//! (`scenario = "fio-nvme-strict"`). An experiment file is a table of scenarios, not a base
//! (sweep one of its cells, written out by `iolab reproduce NAME --emit-scenarios DIR`).
//! A workload scenario refuses unknown fields itself, so an axis or `[set]` field may
//! be an optional field the base leaves out (the scenario judges it when the grid loads);
//! and a field of the base that does not apply to a point ("applies to ... only", say
//! `iommu.cmdq` at `iommu.mode = "passthrough"`) is dropped from that point, once said on
//! standard error. When the points have run, a result table (point, axis values,
//! configuration, key metrics) is printed on standard output.
//!
//! `--shard i/n` (0-based `i`, `0 <= i < n`) keeps the points whose index is `i` modulo `n`,
//! so `n` machines (a Slurm array job, a Kubernetes Indexed Job) together run each point
//! exactly once; `iolab db merge` joins their databases. The sweep id, a hash of the base
//! scenario text, the axes, the seeds and the runs, is the same on every machine.
//!
//! Points run on `--jobs` worker threads; each builds and runs its whole lab inside its own
//! thread (a lab run is single-threaded and shares nothing). The calling thread owns the
//! results database and stores each finished point in one transaction, run and sweep point
//! together, so a sweep killed midway keeps every point it finished.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::SystemTime;

use iolab_sim::experiment::{ExperimentOptions, ExperimentReport};
use iolab_sim::lab::LabError;
use iolab_sim::metrics::Measurement;
use iolab_sim::tomlpatch::{parse_path, remove_field, set_field, Step};
use serde::Deserialize;

use crate::db::{NewRun, ResultsDb, SweepPoint};

/// Cap on the points of one grid (each point's scenario text is built before any runs).
pub const MAX_POINTS: u64 = 1_000_000;

/// Why a grid cannot be swept; every variant names the grid file.
#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    /// The grid file could not be read.
    #[error("Cannot read grid file {}: {message}", path.display())]
    ReadGrid {
        /// The grid file.
        path: PathBuf,
        /// The operating system's message.
        message: String,
    },
    /// The grid file is not valid TOML or has a field of the wrong kind.
    #[error("{0}")]
    GridField(#[from] iolab_sim::tomlfile::InputError),
    /// The grid is well-formed TOML but describes no valid sweep.
    #[error("Invalid grid {}: {problem}", path.display())]
    Grid {
        /// The grid file.
        path: PathBuf,
        /// What is wrong.
        problem: String,
    },
    /// The base scenario could not be read or is not TOML.
    #[error("Grid {}: base scenario {origin}: {message}", path.display())]
    Base {
        /// The grid file.
        path: PathBuf,
        /// The base scenario.
        origin: String,
        /// What went wrong.
        message: String,
    },
    /// An axis names a field the base scenario does not have.
    #[error("Invalid grid {}: axis {axis} (field `{field}`): {problem}", path.display())]
    UnknownField {
        /// The grid file.
        path: PathBuf,
        /// 1-based axis number, in file order.
        axis: usize,
        /// The field path as written.
        field: String,
        /// What was not found.
        problem: String,
    },
}

/// The grid file as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct GridFile {
    name: Option<String>,
    scenario: String,
    seed: Option<u64>,
    runs: Option<u32>,
    seeds: Option<Vec<u64>>,
    #[serde(default)]
    set: toml::Table,
    #[serde(default)]
    axis: Vec<AxisFile>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AxisFile {
    field: String,
    values: Vec<toml::Value>,
}

/// A parsed, checked grid.
#[derive(Debug)]
pub struct Grid {
    /// The grid file.
    pub path: PathBuf,
    /// The sweep's name.
    pub name: String,
    /// The sweep id (see the module docs).
    pub sweep_id: String,
    /// Where the base scenario came from.
    pub base_origin: String,
    base: toml::Table,
    axes: Vec<(String, Vec<Step>, Vec<toml::Value>)>,
    seeds: Vec<u64>,
    /// The directory the base scenario's relative paths are resolved against.
    base_dir: Option<PathBuf>,
    /// The fields the grid sets: `[set]` keys and axes (never dropped from a point).
    user_fields: Vec<String>,
}

/// One point of a grid, ready to run.
#[derive(Debug, Clone)]
pub struct Point {
    /// Index in the grid's enumeration order.
    pub index: u64,
    /// `(field, value)` per axis, the seed last when there is a seed axis.
    pub values: Vec<(String, toml::Value)>,
    /// The point's scenario text.
    pub text: String,
    /// The point's seed.
    pub seed: u64,
    /// Fields of the base scenario left out of this point because they do not apply to it
    /// (`iommu.cmdq` at an `iommu.mode = "passthrough"` point): (field, the scenario's reason).
    pub dropped: Vec<(String, String)>,
}

/// What a workload scenario says about `field` in `table`, when it refuses that field as
/// unknown or out of place; `None` when it accepts it (or refuses something else).
fn field_problem(
    table: &toml::Table,
    field: &str,
    origin: &str,
    base_dir: &Option<PathBuf>,
) -> Option<String> {
    let text = toml::to_string(table).ok()?;
    match iolab_sim::lab::validate(&text, origin, base_dir.as_deref()) {
        Err(iolab_sim::lab::LabError::Input(iolab_sim::tomlfile::InputError::Field {
            field: f,
            problem,
            ..
        })) if f == field || field.starts_with(&format!("{f}.")) => {
            Some(format!("the scenario refuses it: field `{f}`: {problem}"))
        }
        _ => None,
    }
}

/// FNV-1a, 64 bits: a stable hash for the sweep id (the same on every machine and build).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

impl Grid {
    /// Reads and checks a grid file: every axis path must exist in the base scenario.
    pub fn load(path: &Path) -> Result<Self, SweepError> {
        let origin = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| SweepError::ReadGrid {
            path: path.to_owned(),
            message: e.to_string(),
        })?;
        let file: GridFile = iolab_sim::tomlfile::parse(&text, &origin)?;
        let grid_err = |problem: String| SweepError::Grid {
            path: path.to_owned(),
            problem,
        };
        if iolab_sim::reproduce::bundled::text(&file.scenario).is_some() {
            return Err(grid_err(format!(
                "scenario = \"{name}\" is an experiment file ({}, docs/EXPERIMENTS.md), a table of scenarios rather than one: sweep one of its cells, written out as workload scenarios by `iolab reproduce {name} --emit-scenarios DIR` (scenario = \"DIR/{name}/CELL.toml\")",
                iolab_sim::reproduce::bundled::origin(&file.scenario),
                name = file.scenario
            )));
        }
        let (base_origin, base_text) =
            if let Some(text) = iolab_sim::lab::examples::example(&file.scenario) {
                // A bundled example workload scenario, as `iolab run --example NAME` takes it.
                (
                    format!("scenarios/examples/{}.toml (bundled)", file.scenario),
                    text.to_owned(),
                )
            } else {
                let p = path.parent().unwrap_or(Path::new(".")).join(&file.scenario);
                let text = std::fs::read_to_string(&p).map_err(|e| SweepError::Base {
                    path: path.to_owned(),
                    origin: p.display().to_string(),
                    message: format!(
                        "cannot read it ({e}); `scenario` is a path relative to the grid file \
                     or a bundled example ({})",
                        iolab_sim::lab::examples::example_names().join(", ")
                    ),
                })?;
                (p.display().to_string(), text)
            };
        let mut base: toml::Table = toml::from_str(&base_text).map_err(|e| SweepError::Base {
            path: path.to_owned(),
            origin: base_origin.clone(),
            message: e.to_string(),
        })?;
        // An experiment file, or a scenario of a published experiment's former schema, is
        // no workload scenario: refused before anything runs, saying what to run instead.
        iolab_sim::reproduce::bundled::refuse_experiment_key(&base_text, &base_origin).map_err(
            |e| SweepError::Base {
                path: path.to_owned(),
                origin: base_origin.clone(),
                message: e.to_string(),
            },
        )?;
        let base_dir = if iolab_sim::lab::examples::example(&file.scenario).is_some() {
            None
        } else {
            Path::new(&base_origin).parent().map(Path::to_path_buf)
        };
        // A workload scenario refuses unknown fields itself, so its optional fields may be
        // set or swept even where the base leaves them out.
        for (field, value) in &file.set {
            let bad = |problem: String| SweepError::Grid {
                path: path.to_owned(),
                problem: format!("[set] field `{field}`: {problem} (base scenario {base_origin})"),
            };
            let steps = parse_path(field).map_err(bad)?;
            set_field(&mut base, &steps, value.clone(), true).map_err(bad)?;
        }
        let mut axes = Vec::new();
        for (i, a) in file.axis.iter().enumerate() {
            let bad = |problem: String| SweepError::UnknownField {
                path: path.to_owned(),
                axis: i + 1,
                field: a.field.clone(),
                problem,
            };
            let steps = parse_path(&a.field).map_err(bad)?;
            if a.values.is_empty() {
                return Err(bad("`values` is empty".to_owned()));
            }
            if axes.iter().any(|(f, _, _)| *f == a.field) {
                return Err(bad("the field is already an earlier axis".to_owned()));
            }
            // Check the path once on a copy, so a wrong path is reported before any run.
            let mut probe = base.clone();
            let absent = set_field(&mut probe.clone(), &steps, a.values[0].clone(), false).is_err();
            set_field(&mut probe, &steps, a.values[0].clone(), true)
                .map_err(|p| bad(format!("{p} (base scenario {base_origin})")))?;
            if absent {
                // A field the base leaves out: the scenario itself says whether it has one.
                if let Some(problem) = field_problem(&probe, &a.field, &base_origin, &base_dir) {
                    return Err(bad(format!("{problem} (base scenario {base_origin})")));
                }
            }
            axes.push((a.field.clone(), steps, a.values.clone()));
        }
        let runs = file.runs.unwrap_or(1);
        if !(1..=100).contains(&runs) {
            return Err(grid_err(format!("`runs` is {runs}; expected 1 to 100")));
        }
        // `runs = N` means what `iolab run --runs N` means: N repetitions, seeds `seed`,
        // `seed + 1`, ..., each a run of its own, so it is the seed axis.
        let seeds = match file.seeds {
            Some(_) if runs > 1 => {
                return Err(grid_err(format!(
                    "`runs = {runs}` and `seeds` both given: `runs = N` is the seed axis \
                     seed, seed + 1, ..., seed + N - 1 (as `iolab run --runs N`); give one of them"
                )))
            }
            Some(s) if s.is_empty() => return Err(grid_err("`seeds` is empty".to_owned())),
            Some(s) => s,
            None => {
                let first = file.seed.unwrap_or(1);
                (0..u64::from(runs))
                    .map(|i| first.wrapping_add(i))
                    .collect()
            }
        };
        let points = axes
            .iter()
            .map(|(_, _, v)| v.len() as u128)
            .product::<u128>()
            * seeds.len() as u128;
        if points > MAX_POINTS as u128 {
            return Err(grid_err(format!(
                "the grid has {points} points; at most {MAX_POINTS} are allowed (split it into several grids)"
            )));
        }
        let name = file.name.clone().unwrap_or_else(|| {
            path.file_stem()
                .map_or("sweep".to_owned(), |s| s.to_string_lossy().into_owned())
        });
        // The id hashes what determines the results, not where the files are.
        let mut key = base_text.clone();
        key.push_str(&format!("\n#set {:?}", file.set));
        for (f, _, vals) in &axes {
            key.push_str(&format!("\n#axis {f} = {vals:?}"));
        }
        // (`#runs 1` kept so ids of grids without `runs` are what they were.)
        key.push_str(&format!("\n#seeds {seeds:?}\n#runs 1"));
        let sweep_id = format!("{:016x}", fnv1a(key.as_bytes()));
        let mut user_fields: Vec<String> = file.set.keys().cloned().collect();
        user_fields.extend(axes.iter().map(|(f, _, _)| f.clone()));
        Ok(Grid {
            path: path.to_owned(),
            name,
            sweep_id,
            base_origin,
            base,
            axes,
            seeds,
            base_dir,
            user_fields,
        })
    }

    /// How many points the whole grid has.
    pub fn len(&self) -> u64 {
        self.axes
            .iter()
            .map(|(_, _, v)| v.len() as u64)
            .product::<u64>()
            * self.seeds.len() as u64
    }

    /// Point `index` (`0 <= index < len()`).
    pub fn point(&self, index: u64) -> Result<Point, SweepError> {
        let mut rem = index;
        let seed = self.seeds[(rem % self.seeds.len() as u64) as usize];
        rem /= self.seeds.len() as u64;
        let mut picks = vec![0usize; self.axes.len()];
        for (i, (_, _, vals)) in self.axes.iter().enumerate().rev() {
            picks[i] = (rem % vals.len() as u64) as usize;
            rem /= vals.len() as u64;
        }
        let mut table = self.base.clone();
        let mut values = Vec::new();
        for (i, (field, steps, vals)) in self.axes.iter().enumerate() {
            let v = vals[picks[i]].clone();
            set_field(&mut table, steps, v.clone(), true).map_err(|problem| {
                SweepError::UnknownField {
                    path: self.path.clone(),
                    axis: i + 1,
                    field: field.clone(),
                    problem,
                }
            })?;
            values.push((field.clone(), v));
        }
        if self.seeds.len() > 1 {
            values.push(("seed".to_owned(), toml::Value::Integer(seed as i64)));
        }
        let write = |table: &toml::Table| {
            toml::to_string(table).map_err(|e| SweepError::Grid {
                path: self.path.clone(),
                problem: format!("cannot write point {index} as TOML: {e}"),
            })
        };
        let mut text = write(&table)?;
        let mut dropped = Vec::new();
        // A field of the base that does not apply to this point (the scenario says
        // "applies to ... only") is dropped from it, unless the grid set it.
        while let Some((field, problem)) = self.inapplicable_field(&text) {
            if self.user_fields.contains(&field)
                || dropped.iter().any(|(f, _)| *f == field)
                || !remove_field(&mut table, &field)
            {
                break;
            }
            dropped.push((field, problem));
            text = write(&table)?;
        }
        Ok(Point {
            index,
            values,
            text,
            seed,
            dropped,
        })
    }

    /// The field a workload scenario refuses as not applying to its model, mode or pattern
    /// ("applies to ... only"), with the scenario's words.
    fn inapplicable_field(&self, text: &str) -> Option<(String, String)> {
        match iolab_sim::lab::validate(text, &self.base_origin, self.base_dir.as_deref()) {
            Err(iolab_sim::lab::LabError::Input(iolab_sim::tomlfile::InputError::Field {
                field,
                problem,
                ..
            })) if problem.starts_with("applies to ") => Some((field, problem)),
            _ => None,
        }
    }

    /// A point's label: `field=value, ...`.
    pub fn label(point: &Point) -> String {
        point
            .values
            .iter()
            .map(|(f, v)| format!("{f}={v}"))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Where a point's scenario came from, as stored and as named in its errors.
    pub fn origin(&self, point: &Point) -> String {
        format!(
            "{} point {} of {} ({}; base {})",
            self.path.display(),
            point.index,
            self.len(),
            Self::label(point),
            self.base_origin
        )
    }
}

/// Which 1/n of the points to run: index `i` of `n`, 0-based.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shard {
    /// This shard's index, `0 <= index < count`.
    pub index: u64,
    /// How many shards.
    pub count: u64,
}

impl Shard {
    /// Parses `i/n`.
    pub fn parse(s: &str) -> Result<Self, String> {
        let bad = || {
            format!("--shard {s}: expected i/n with 0 <= i < n (0-based, as SLURM_ARRAY_TASK_ID and JOB_COMPLETION_INDEX are)")
        };
        let (i, n) = s.split_once('/').ok_or_else(bad)?;
        let index: u64 = i.trim().parse().map_err(|_| bad())?;
        let count: u64 = n.trim().parse().map_err(|_| bad())?;
        if count == 0 || index >= count {
            return Err(bad());
        }
        Ok(Shard { index, count })
    }

    /// Whether point `index` belongs to this shard.
    pub fn owns(&self, index: u64) -> bool {
        index % self.count == self.index
    }
}

/// Runs one point's workload scenario (docs/SCENARIOS.md): validated whole, then run. The
/// one place a sweep calls the lab, so the entry point can change in one line.
pub(crate) fn run_scenario_text(
    text: &str,
    origin: &str,
    options: &ExperimentOptions,
) -> Result<ExperimentReport, LabError> {
    let base = std::path::Path::new(origin).parent().filter(|p| p.is_dir());
    let scenario = iolab_sim::lab::validate(text, origin, base)?;
    let out = iolab_sim::lab::run(
        &scenario,
        &iolab_sim::lab::LabOptions {
            runs: options.runs,
            seed: Some(options.seed),
        },
    )?;
    Ok(out.report)
}

/// One finished point, sent from a worker to the storing thread.
struct Finished {
    point: Point,
    started_at: SystemTime,
    finished_at: SystemTime,
    result: Result<ExperimentReport, LabError>,
}

/// What a sweep did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Points in this shard.
    pub selected: u64,
    /// Points run and stored.
    pub stored: u64,
    /// Run ids, in point order.
    pub run_ids: Vec<(u64, i64)>,
}

/// `iolab sweep`: see the module docs.
pub fn run(
    grid_path: &Path,
    jobs: Option<usize>,
    shard: Option<&str>,
    db_path: Option<&Path>,
) -> ExitCode {
    let fail = |code: u8, msg: String| {
        eprintln!("iolab sweep: {msg}");
        ExitCode::from(code)
    };
    let shard = match shard.map(Shard::parse).transpose() {
        Ok(s) => s.unwrap_or(Shard { index: 0, count: 1 }),
        Err(e) => return fail(2, e),
    };
    let grid = match Grid::load(grid_path) {
        Ok(g) => g,
        Err(e) => return fail(2, e.to_string()),
    };
    // Build every point of this shard first: a bad value fails before anything runs.
    let mut points = Vec::new();
    for i in (0..grid.len()).filter(|&i| shard.owns(i)) {
        match grid.point(i) {
            Ok(p) => points.push(p),
            Err(e) => return fail(2, e.to_string()),
        }
    }
    if let Some(note) = dropped_note(&points) {
        eprint!("{note}");
    }
    let mut db = match db_path.map(ResultsDb::open).transpose() {
        Ok(db) => db,
        Err(e) => return fail(e.exit_code(), e.to_string()),
    };
    let jobs = jobs
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .clamp(1, points.len().max(1));
    eprintln!(
        "sweep {} ({}): {} of {} points (shard {}/{}), {} jobs",
        grid.name,
        grid.sweep_id,
        points.len(),
        grid.len(),
        shard.index,
        shard.count,
        jobs
    );
    let bar = crate::progress::bar(
        points.len() as u64,
        "{bar:40} {pos}/{len} points, {elapsed} elapsed, about {eta} left",
    );
    let options = |seed| ExperimentOptions { runs: 1, seed };
    let next = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let (tx, rx) = mpsc::channel::<Finished>();
    let mut outcome = Outcome {
        selected: points.len() as u64,
        ..Outcome::default()
    };
    let mut first_error: Option<(u8, String)> = None;
    let mut results: Vec<(Point, Vec<Measurement>)> = Vec::new();
    std::thread::scope(|s| {
        for _ in 0..jobs {
            let tx = tx.clone();
            let (points, next, stop, grid) = (&points, &next, &stop, &grid);
            s.spawn(move || loop {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let Some(point) = points.get(next.fetch_add(1, Ordering::Relaxed)) else {
                    break;
                };
                let started_at = SystemTime::now();
                let result =
                    run_scenario_text(&point.text, &grid.origin(point), &options(point.seed));
                let done = Finished {
                    point: point.clone(),
                    started_at,
                    finished_at: SystemTime::now(),
                    result,
                };
                if tx.send(done).is_err() {
                    break;
                }
            });
        }
        drop(tx);
        for done in rx {
            bar.inc(1);
            let label = Grid::label(&done.point);
            let mut report = match done.result {
                Ok(r) => r,
                Err(e) => {
                    let code = if e.is_bad_input() { 2 } else { 1 };
                    bar.suspend(|| {
                        eprintln!("iolab sweep: point {} ({label}): {e}", done.point.index)
                    });
                    first_error.get_or_insert((code, String::new()));
                    stop.store(true, Ordering::Relaxed);
                    continue;
                }
            };
            axis_attributes(&done.point, &mut report.measurements);
            results.push((done.point.clone(), report.measurements.clone()));
            let Some(db) = db.as_mut() else {
                outcome.stored += 1;
                continue;
            };
            let origin = grid.origin(&done.point);
            let axes: BTreeMap<&str, serde_json::Value> = done
                .point
                .values
                .iter()
                .map(|(f, v)| (f.as_str(), toml_to_json(v)))
                .collect();
            let label = format!("sweep {} point {}: {label}", grid.name, done.point.index);
            let run = NewRun {
                kind: "lab",
                group_id: None,
                label: Some(&label),
                scenario_origin: Some(&origin),
                scenario_text: Some(&done.point.text),
                seed: done.point.seed,
                started_at: done.started_at,
                finished_at: done.finished_at,
                report: &report,
            };
            let sp = SweepPoint {
                sweep_id: grid.sweep_id.clone(),
                sweep_name: grid.name.clone(),
                point: done.point.index,
                points: grid.len(),
                axes_json: serde_json::to_string(&axes).unwrap_or_else(|_| "{}".to_owned()),
            };
            match db.store_sweep_point(&run, &sp) {
                Ok(id) => {
                    outcome.stored += 1;
                    outcome.run_ids.push((done.point.index, id));
                }
                Err(e) => {
                    bar.suspend(|| eprintln!("iolab sweep: {e}"));
                    first_error.get_or_insert((e.exit_code(), String::new()));
                    stop.store(true, Ordering::Relaxed);
                }
            }
        }
    });
    bar.finish_and_clear();
    outcome.run_ids.sort_unstable();
    let where_ = db.as_ref().map_or("not stored (--no-db)".to_owned(), |d| {
        format!("stored in {}", d.path().display())
    });
    eprintln!(
        "sweep {} ({}): {} of {} points run, {where_}",
        grid.name, grid.sweep_id, outcome.stored, outcome.selected
    );
    for (point, id) in &outcome.run_ids {
        eprintln!("  point {point:>4} -> run {id}");
    }
    results.sort_by_key(|(p, _)| p.index);
    print!("{}", result_table(&grid, &results));
    match first_error {
        Some((code, _)) => ExitCode::from(code),
        None => ExitCode::SUCCESS,
    }
}

/// The note, printed once before a sweep runs, of the base scenario's fields dropped from
/// points they do not apply to: per field, the scenario's reason and the points.
fn dropped_note(points: &[Point]) -> Option<String> {
    let mut by_field: BTreeMap<&str, (&str, Vec<&Point>)> = BTreeMap::new();
    for p in points {
        for (field, problem) in &p.dropped {
            by_field
                .entry(field)
                .or_insert_with(|| (problem, Vec::new()))
                .1
                .push(p);
        }
    }
    if by_field.is_empty() {
        return None;
    }
    let mut out = String::from("fields of the base scenario dropped where they do not apply:\n");
    for (field, (problem, pts)) in by_field {
        let list: Vec<String> = if pts.len() <= 6 {
            pts.iter()
                .map(|p| format!("{} ({})", p.index, Grid::label(p)))
                .collect()
        } else {
            pts.iter().map(|p| p.index.to_string()).collect()
        };
        out.push_str(&format!(
            "  `{field}` ({problem}) at point{} {}\n",
            if pts.len() == 1 { "" } else { "s" },
            list.join(", ")
        ));
    }
    Some(out)
}

/// Stores each axis value of `point` as an attribute of its measurements, named by the
/// axis's field path (`workload.rwmixread`), so `compare` pairs points by it and `report`
/// can plot against it. An axis the lab already records under its last path segment
/// (`workload.numjobs` as `numjobs`) or under its path joined with `_` (`iommu.mode` as
/// `iommu_mode`), the kernel release (`kernel`) and the seed add nothing.
fn axis_attributes(point: &Point, measurements: &mut [iolab_sim::metrics::Measurement]) {
    for (field, value) in &point.values {
        if field == "seed" || field == "kernel.version" {
            continue;
        }
        let last = field.rsplit('.').next().unwrap_or(field);
        // `iommu.mode` is recorded as `iommu_mode`.
        let joined = field.replace('.', "_");
        let text = match value {
            toml::Value::String(s) => s.clone(),
            v => v.to_string(),
        };
        for m in measurements.iter_mut() {
            if !m.attrs.contains_key(last) && !m.attrs.contains_key(&joined) {
                m.attrs.insert(field.clone(), text.clone());
            }
        }
    }
}

/// Metrics shown in the result table, in this order, where any point has them.
const TABLE_METRICS: [&str; 15] = [
    "map_benchmark.pairs_per_thread_per_s",
    "map_benchmark.unmap_mean_ns",
    "cmdq.cas_success_rate",
    "read.iops",
    "write.iops",
    "read.clat_mean_ns",
    "read.clat_p99_ns",
    "write.clat_p99_ns",
    "cpu.sys_pct",
    "net.throughput_gbps",
    "bonnie.out_block_kps",
    "bonnie.in_block_kps",
    "bonnie.seeks_per_s",
    "reaim.max_jpm",
    "protection.stale_hits",
];

/// The table printed when a sweep ends: a row per point and measured configuration, with
/// the axis values and the key metrics ([`TABLE_METRICS`]) any point has.
fn result_table(grid: &Grid, results: &[(Point, Vec<Measurement>)]) -> String {
    let mut columns: Vec<(&str, String)> = Vec::new();
    for name in TABLE_METRICS {
        let unit = results
            .iter()
            .flat_map(|(_, ms)| ms.iter())
            .find_map(|m| m.get(name).map(|x| x.unit.clone()));
        if let Some(unit) = unit {
            columns.push((name, unit));
        }
    }
    let mut header: Vec<String> = vec!["point".to_owned()];
    let axis_names: Vec<String> = results
        .first()
        .map(|(p, _)| p.values.iter().map(|(f, _)| f.clone()).collect())
        .unwrap_or_default();
    header.extend(axis_names.iter().cloned());
    header.push("config".to_owned());
    header.extend(columns.iter().map(|(n, u)| format!("{n} ({u})")));
    let mut rows: Vec<Vec<String>> = Vec::new();
    for (p, ms) in results {
        for m in ms {
            let mut row = vec![p.index.to_string()];
            row.extend(p.values.iter().map(|(_, v)| match v {
                toml::Value::String(s) => s.clone(),
                v => v.to_string(),
            }));
            row.push(m.config.clone());
            for (name, unit) in &columns {
                row.push(
                    m.get(name)
                        .map_or("-".to_owned(), |x| crate::compare::num(x.value, unit)),
                );
            }
            rows.push(row);
        }
    }
    if rows.is_empty() {
        return String::new();
    }
    let widths: Vec<usize> = (0..header.len())
        .map(|i| {
            rows.iter()
                .map(|r| r[i].chars().count())
                .chain([header[i].chars().count()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    // Text columns (axis values, config) to the left, numbers to the right.
    let left = |i: usize| i > 0 && i <= axis_names.len() + 1;
    let line = |cells: &[String]| {
        let parts: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, c)| {
                if left(i) {
                    format!("{c:<w$}", w = widths[i])
                } else {
                    format!("{c:>w$}", w = widths[i])
                }
            })
            .collect();
        format!("{}\n", parts.join("  ").trim_end())
    };
    let mut out = format!(
        "sweep {} ({}): {} point(s)\n",
        grid.name,
        grid.sweep_id,
        results.len()
    );
    out.push_str(&line(&header));
    for r in &rows {
        out.push_str(&line(r));
    }
    out
}

fn toml_to_json(v: &toml::Value) -> serde_json::Value {
    serde_json::to_value(v).unwrap_or(serde_json::Value::Null)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        std::fs::create_dir_all(dir).unwrap();
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    #[test]
    fn points_enumerate_first_axis_slowest_and_seeds_fastest() {
        let dir = std::env::temp_dir().join(format!("iolab-sweep-unit-{}", std::process::id()));
        write(
            &dir,
            "base.toml",
            "[a]\nn = 0\n[b]\nm = { value = 0, source = \"s\" }\n",
        );
        let grid_text = "scenario = \"base.toml\"\nseeds = [5, 6]\n\
                         [[axis]]\nfield = \"a.n\"\nvalues = [1, 2, 3]\n\
                         [[axis]]\nfield = \"b.m\"\nvalues = [10, 20]\n";
        let g = Grid::load(&write(&dir, "g.toml", grid_text)).unwrap();
        assert_eq!(g.len(), 12);
        let p = g.point(7).unwrap();
        // 7 = ((a=1) * 2 + (m=1)) * 2 + (seed=1): a=2, m=20, seed 6.
        assert_eq!(Grid::label(&p), "a.n=2, b.m=20, seed=6");
        assert_eq!(p.seed, 6);
        let t: toml::Table = toml::from_str(&p.text).unwrap();
        assert_eq!(t["a"]["n"].as_integer(), Some(2));
        assert_eq!(t["b"]["m"]["value"].as_integer(), Some(20));
        assert_eq!(t["b"]["m"]["source"].as_str(), Some("s"));
        // The id depends on the content, not on where the grid file is.
        let other = dir.join("elsewhere");
        write(
            &other,
            "base.toml",
            &std::fs::read_to_string(dir.join("base.toml")).unwrap(),
        );
        let g2 = Grid::load(&write(&other, "renamed.toml", grid_text)).unwrap();
        assert_eq!(g.sweep_id, g2.sweep_id);
        let g3 = Grid::load(&write(
            &other,
            "g3.toml",
            &grid_text.replace("[5, 6]", "[5, 7]"),
        ))
        .unwrap();
        assert_ne!(g.sweep_id, g3.sweep_id);
        // Too many points is refused before any is built.
        let huge = format!(
            "scenario = \"base.toml\"\n[[axis]]\nfield = \"a.n\"\nvalues = [{}]\n\
             [[axis]]\nfield = \"b.m\"\nvalues = [{}]\n",
            vec!["1"; 1001].join(","),
            vec!["1"; 1000].join(",")
        );
        let e = Grid::load(&write(&dir, "huge.toml", &huge)).unwrap_err();
        assert!(e.to_string().contains("1001000 points"), "{e}");
    }

    #[test]
    fn shards_partition_the_points() {
        assert_eq!(
            Shard::parse("3/16"),
            Ok(Shard {
                index: 3,
                count: 16
            })
        );
        assert!(Shard::parse("16/16").is_err());
        assert!(Shard::parse("0/0").is_err());
        assert!(Shard::parse("1").is_err());
        let shards: Vec<Shard> = (0..4).map(|i| Shard { index: i, count: 4 }).collect();
        for p in 0..37 {
            assert_eq!(shards.iter().filter(|s| s.owns(p)).count(), 1);
        }
    }
}
