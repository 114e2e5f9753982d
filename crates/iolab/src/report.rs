//! `iolab report`: one self-contained HTML page about stored runs: a table per run and SVG
//! plots drawn with plotters' SVG backend (inline, no scripts, no network).
//!
//! Plots are drawn per family of measurements: an experiment's, or one workload's on one
//! device and platform across workload scenarios (whatever the scenario files are called).
//! Per family:
//!
//! - **scaling**: IOPS (or throughput) against the first of `threads`, `iodepth`,
//!   `numjobs`, `cpus` that takes several numeric values; a series per IOMMU mode, split
//!   further only by attributes that separate points the mode and x leave together (never
//!   `seed` or `run`), or per configuration name when measurements carry no attributes.
//!   Points of repeated runs are averaged.
//! - **latency**: per x value, a step CDF per series on a log-x axis (repetitions'
//!   histograms merged), above the share of I/Os per bucket.
//! - **cpu**: a bar per (series, x), CPU time split into user / system / spin / idle in
//!   percent of the measured CPU time, repetitions averaged.
//!
//! Output is a pure function of the database content: no clock is read, numbers are
//! formatted with fixed rules, and every collection is ordered.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::Path;
use std::process::ExitCode;

use iolab_sim::metrics::{LatencyHistogram, Measurement};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::db::{ResultsDb, StoredRun};
use crate::ids::RunSelection;

/// Attributes a scaling plot may put on its x axis, in order of preference.
const X_ATTRS: [&str; 4] = ["threads", "iodepth", "numjobs", "cpus"];

/// Series colours (the Okabe-Ito palette: distinguishable with colour-blindness).
const COLORS: [RGBColor; 8] = [
    RGBColor(0, 114, 178),
    RGBColor(213, 94, 0),
    RGBColor(0, 158, 115),
    RGBColor(204, 121, 167),
    RGBColor(230, 159, 0),
    RGBColor(86, 180, 233),
    RGBColor(0, 0, 0),
    RGBColor(240, 228, 66),
];

/// Room right of the CPU bars for their legend, in pixels.
const LEGEND_W: u32 = 100;

/// Plot size in pixels.
const SIZE: (u32, u32) = (760, 420);

/// One plot.
#[derive(Debug, Clone, PartialEq)]
pub struct Plot {
    /// File name (without `.svg`) when written alone; unique within a report.
    pub slug: String,
    /// Title, also the caption.
    pub title: String,
    /// The SVG document.
    pub svg: String,
}

/// A bad RUNS argument or a failed read; carries the exit code.
#[derive(Debug)]
struct Failure {
    message: String,
    code: u8,
}

impl Failure {
    fn bad(message: impl Into<String>) -> Self {
        Failure {
            message: message.into(),
            code: 2,
        }
    }
}

/// Runs `iolab report`.
pub fn run(db_path: &Path, specs: &[String], output: &Path, svg_dir: Option<&Path>) -> ExitCode {
    match run_inner(db_path, specs, output, svg_dir) {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            eprintln!("iolab report: {}", f.message);
            ExitCode::from(f.code)
        }
    }
}

fn run_inner(
    db_path: &Path,
    specs: &[String],
    output: &Path,
    svg_dir: Option<&Path>,
) -> Result<(), Failure> {
    let db = ResultsDb::open_existing(db_path).map_err(|e| Failure {
        message: e.to_string(),
        code: e.exit_code(),
    })?;
    let ids = select(&db, specs)?;
    let runs: Vec<StoredRun> = ids
        .iter()
        .map(|&id| db.show(id))
        .collect::<Result<_, _>>()
        .map_err(|e| Failure {
            message: e.to_string(),
            code: e.exit_code(),
        })?;
    let plots = plots(&runs).map_err(|e| Failure {
        message: format!("cannot draw a plot: {e}"),
        code: 1,
    })?;
    let html = render_html(&runs, &plots);
    std::fs::write(output, &html).map_err(|e| Failure {
        message: format!("cannot write {}: {e}", output.display()),
        code: 1,
    })?;
    if let Some(dir) = svg_dir {
        std::fs::create_dir_all(dir).map_err(|e| Failure {
            message: format!("cannot create {}: {e}", dir.display()),
            code: 1,
        })?;
        for p in &plots {
            let path = dir.join(format!("{}.svg", p.slug));
            std::fs::write(&path, &p.svg).map_err(|e| Failure {
                message: format!("cannot write {}: {e}", path.display()),
                code: 1,
            })?;
        }
    }
    eprintln!(
        "wrote {}: {} run(s), {} plot(s){}",
        output.display(),
        runs.len(),
        plots.len(),
        svg_dir.map_or(String::new(), |d| format!(
            "; {} .svg file(s) in {}",
            plots.len(),
            d.display()
        ))
    );
    Ok(())
}

/// Resolves RUNS arguments (`12`, `g12`, `29-34`, `3,5,g12`) to run ids, in the order
/// given, each once.
fn select(db: &ResultsDb, specs: &[String]) -> Result<Vec<i64>, Failure> {
    let mut ids = Vec::new();
    for spec in specs {
        let found = RunSelection::parse(spec)
            .map_err(Failure::bad)?
            .resolve(db)
            .map_err(|e| Failure {
                message: e.to_string(),
                code: e.exit_code(),
            })?;
        for id in found {
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
    }
    Ok(ids)
}

// ---------------------------------------------------------------------------------------
// Numbers and text
// ---------------------------------------------------------------------------------------

/// Escapes text for HTML element content and attribute values.
fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// A value for a table: integers in full, others with enough digits to compare.
fn num(v: f64) -> String {
    if !v.is_finite() {
        return format!("{v}");
    }
    let a = v.abs();
    if a >= 1000.0 || (v.fract() == 0.0 && a < 1e15) {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}")
    } else if a >= 0.01 || a == 0.0 {
        format!("{v:.3}")
    } else {
        format!("{v:.3e}")
    }
}

/// An axis label: 3 significant digits with an SI suffix (`886K`, `1.2M`, `45.0`).
fn si(v: f64) -> String {
    let a = v.abs();
    let (scaled, suffix) = if a >= 1e9 {
        (v / 1e9, "G")
    } else if a >= 1e6 {
        (v / 1e6, "M")
    } else if a >= 1e3 {
        (v / 1e3, "K")
    } else {
        (v, "")
    };
    let s = scaled.abs();
    if s >= 100.0 || scaled.fract() == 0.0 {
        format!("{scaled:.0}{suffix}")
    } else if s >= 10.0 {
        format!("{scaled:.1}{suffix}")
    } else {
        format!("{scaled:.2}{suffix}")
    }
}

/// A latency in ns as an axis label: `850ns`, `12µs`, `3.4ms`.
fn latency_label(ns: f64) -> String {
    if ns >= 1e9 {
        format!("{}s", si(ns / 1e9))
    } else if ns >= 1e6 {
        format!("{}ms", si(ns / 1e6))
    } else if ns >= 1e3 {
        format!("{}µs", si(ns / 1e3))
    } else {
        format!("{}ns", si(ns))
    }
}

/// A file-name-safe form of `s`.
fn slug(s: &str) -> String {
    let mut out: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .collect();
    out.truncate(80);
    out
}

// ---------------------------------------------------------------------------------------
// What the plots show
// ---------------------------------------------------------------------------------------

/// The measurement's rate: `(axis name, value)`. IOPS when it has them (a total if one is
/// named so, else the sum of the per-direction ones), else throughput in B/s, else another
/// rate (`Mb/s`, `K/sec`, `jobs/min`).
fn rate(m: &Measurement) -> Option<(&'static str, f64)> {
    let is_total = |n: &str| n == "iops" || n == "total.iops" || n.ends_with(".total.iops");
    if let Some(t) = m.metrics.iter().find(|x| is_total(&x.name)) {
        return Some(("IOPS", t.value));
    }
    let iops: Vec<f64> = m
        .metrics
        .iter()
        .filter(|x| x.name.ends_with(".iops"))
        .map(|x| x.value)
        .collect();
    if !iops.is_empty() {
        return Some(("IOPS", iops.iter().sum()));
    }
    let bw: Vec<f64> = m
        .metrics
        .iter()
        .filter(|x| x.unit == "B/s")
        .map(|x| x.value)
        .collect();
    if !bw.is_empty() {
        return Some(("throughput (B/s)", bw.iter().sum()));
    }
    for (unit, axis) in [
        ("MB/s", "throughput (MB/s)"),
        ("Mb/s", "throughput (Mb/s)"),
        ("K/sec", "throughput (K/sec)"),
        ("jobs/min", "jobs/min"),
    ] {
        if let Some(x) = m.metrics.iter().find(|x| x.unit == unit) {
            return Some((axis, x.value));
        }
    }
    // dma_map_benchmark: map+unmap pairs per thread per second.
    m.metrics
        .iter()
        .find(|x| x.name == "map_benchmark.pairs_per_thread_per_s")
        .map(|x| ("map+unmap pairs per thread per s", x.value))
}

/// A scaling plot's data: series name -> x -> the y values (one per run).
struct Scaling {
    experiment: String,
    x_attr: String,
    y_axis: &'static str,
    /// Series in legend order: name, x -> the y values (one per run).
    series: Vec<(String, BTreeMap<OrdF64, Vec<f64>>)>,
    /// Most runs averaged into one point.
    runs: usize,
}

/// An `f64` that orders (values here are finite attribute numbers).
#[derive(Clone, Copy, Debug, PartialEq)]
struct OrdF64(f64);
impl Eq for OrdF64 {}
impl PartialOrd for OrdF64 {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for OrdF64 {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// One measurement placed in a family: its series and x value, the run it came from.
struct Point<'a> {
    series: String,
    x: Option<f64>,
    m: &'a Measurement,
}

/// Measurements that belong on the same plots: an experiment's, or the workload scenarios'
/// runs of one workload on one device and platform (whatever their scenario names), so
/// that runs of `fio-nvme-off`, `-lazy` and `-strict` at several `numjobs` make one
/// scaling plot with a series per IOMMU mode.
struct Family<'a> {
    /// The experiment's name, or the workload's description.
    name: String,
    /// The attribute on the x axis: one of [`X_ATTRS`] that takes several values, else
    /// another numeric attribute that does (a sweep's axis, `workload.rwmixread`).
    x_attr: Option<&'a str>,
    /// Series names in legend order.
    series: Vec<String>,
    points: Vec<Point<'a>>,
}

/// A point's values of the series keys chosen so far, and its x.
type SeriesId<'a> = (Vec<Option<&'a String>>, Option<OrdF64>);

/// Attributes that tell repetitions apart; never a reason for a series of their own.
const REPETITION_ATTRS: [&str; 2] = ["seed", "run"];

/// The family of a measurement of `r`.
fn family_of(r: &StoredRun, m: &Measurement) -> String {
    if !m.attrs.contains_key("scenario") {
        return r.experiment.clone();
    }
    // A workload scenario: the workload and what it ran on.
    let a = |k: &str| m.attrs.get(k).map(String::as_str);
    let mut name = workload_of(m);
    if let Some(d) = a("device") {
        name = format!("{name} on {d}");
    }
    if let Some(p) = a("platform") {
        name = format!("{name} ({p})");
    }
    name
}

/// A measurement's workload, as the start of its family's name: `fio randread bs=4096`.
fn workload_of(m: &Measurement) -> String {
    let a = |k: &str| m.attrs.get(k).map(String::as_str);
    let mut name =
        iolab::vocab::canonical("workload", a("workload").unwrap_or("workload")).to_owned();
    for k in ["rw", "direction"] {
        if let Some(v) = a(k) {
            name = format!("{name} {v}");
        }
    }
    for k in ["bs", "message_bytes", "file_mib"] {
        if let Some(v) = a(k) {
            // Typed, so an import's `4k` reads as the lab's 4096.
            let v = match iolab::vocab::typed(k, v) {
                serde_json::Value::String(t) => t,
                n => n.to_string(),
            };
            name = format!("{name} {k}={v}");
        }
    }
    name
}

fn numeric(m: &Measurement, a: &str) -> Option<f64> {
    m.attrs
        .get(a)
        .and_then(|v| v.parse::<f64>().ok())
        .filter(|v| v.is_finite())
}

/// Groups every measurement of `runs` into families, in name order. An imported real run
/// joins the lab families of its workload (`fio randread bs=4096` joins `fio randread
/// bs=4096 on nvme (hisilicon-d06)`), as a series of its own named after its source, so its
/// rate and latency plot beside the lab's; without such a family it has its own.
fn families(runs: &[StoredRun]) -> Vec<Family<'_>> {
    let mut by_name: BTreeMap<String, Vec<&Measurement>> = BTreeMap::new();
    let mut imported: BTreeMap<*const Measurement, String> = BTreeMap::new();
    let is_import = |r: &StoredRun| r.kind.starts_with("import");
    for r in runs.iter().filter(|r| !is_import(r)) {
        for m in &r.measurements {
            by_name.entry(family_of(r, m)).or_default().push(m);
        }
    }
    for r in runs.iter().filter(|r| is_import(r)) {
        let source = r.label.clone().unwrap_or_else(|| r.experiment.clone());
        for m in &r.measurements {
            imported.insert(m, format!("{} (real: {source})", m.config));
            let workload = workload_of(m);
            let joins: Vec<String> = by_name
                .keys()
                .filter(|f| *f == &workload || f.starts_with(&format!("{workload} on ")))
                .cloned()
                .collect();
            if joins.is_empty() {
                by_name.entry(family_of(r, m)).or_default().push(m);
            }
            for f in joins {
                by_name.get_mut(&f).expect("a family").push(m);
            }
        }
    }
    let import_series = |m: &Measurement| imported.get(&(m as *const Measurement)).cloned();
    by_name
        .into_iter()
        .map(|(name, all)| {
            let varies = |a: &str| {
                let values: BTreeSet<OrdF64> = all
                    .iter()
                    .filter_map(|m| numeric(m, a))
                    .map(OrdF64)
                    .collect();
                values.len() >= 2
            };
            let x_attr: Option<&str> = X_ATTRS.into_iter().find(|a| varies(a)).or_else(|| {
                // Another attribute every measurement carries as a number (a sweep's axis,
                // stored under its field path): the first in name order that varies.
                let keys: BTreeSet<&str> = all
                    .iter()
                    .flat_map(|m| m.attrs.keys().map(String::as_str))
                    .collect();
                keys.into_iter().find(|k| {
                    !REPETITION_ATTRS.contains(k)
                        && all.iter().all(|m| numeric(m, k).is_some())
                        && varies(k)
                })
            });
            // With an x axis, only the measurements that have an x value are placed.
            let placed: Vec<(&Measurement, Option<f64>)> = match x_attr {
                Some(a) => all
                    .iter()
                    .filter_map(|m| numeric(m, a).map(|x| (*m, Some(x))))
                    .collect(),
                None => all.iter().map(|m| (*m, None)).collect(),
            };
            // Series keys: `iommu_mode` first, then the other attributes in name order; a
            // key is taken only where it separates measurements the keys taken so far (and
            // x) leave together. Attributes that follow the IOMMU mode (model, command
            // queue) or x (numjobs with threads, the scenario's name) add nothing.
            // Imported runs are series of their own: only the lab's attributes choose keys.
            let lab: Vec<(&Measurement, Option<f64>)> = placed
                .iter()
                .copied()
                .filter(|(m, _)| import_series(m).is_none())
                .collect();
            let mut candidates: Vec<&str> = lab
                .iter()
                .flat_map(|(m, _)| m.attrs.keys().map(String::as_str))
                .filter(|k| Some(*k) != x_attr && !REPETITION_ATTRS.contains(k))
                .collect::<BTreeSet<_>>()
                .into_iter()
                .collect();
            candidates.sort_by_key(|k| (*k != "iommu_mode", *k == "scenario", *k));
            let mut keys: Vec<&str> = Vec::new();
            for k in candidates {
                let mut seen: BTreeMap<SeriesId<'_>, Option<&String>> = BTreeMap::new();
                let splits = lab.iter().any(|(m, x)| {
                    let id = (
                        keys.iter().map(|kk| m.attrs.get(*kk)).collect(),
                        x.map(OrdF64),
                    );
                    let v = m.attrs.get(k);
                    *seen.entry(id).or_insert(v) != v
                });
                if splits {
                    keys.push(k);
                }
            }
            let points: Vec<Point> = placed
                .into_iter()
                .map(|(m, x)| {
                    let series = if let Some(s) = import_series(m) {
                        s
                    } else if keys.is_empty() {
                        match (x_attr, m.attrs.get("iommu_mode")) {
                            (_, Some(mode)) => mode.clone(),
                            (None, None) => m.config.clone(),
                            (Some(_), None) => name.clone(),
                        }
                    } else {
                        keys.iter()
                            .map(|k| match m.attrs.get(*k) {
                                Some(v) if *k == "iommu_mode" => v.clone(),
                                Some(v) => format!("{k}={v}"),
                                None => format!("{k}=-"),
                            })
                            .collect::<Vec<_>>()
                            .join(", ")
                    };
                    Point { series, x, m }
                })
                .collect();
            let mut series: Vec<String> = Vec::new();
            for p in &points {
                if !series.contains(&p.series) {
                    series.push(p.series.clone());
                }
            }
            series.sort_by_key(|s| mode_rank(s));
            Family {
                name,
                x_attr,
                series,
                points,
            }
        })
        .collect()
}

/// Legend order: no IOMMU first, then passthrough, lazy, strict (cheapest protection
/// first), then the rest by name.
fn mode_rank(series: &str) -> (usize, String) {
    let head = series.split(',').next().unwrap_or(series);
    let rank = ["off", "passthrough", "bypass", "lazy", "strict"]
        .iter()
        .position(|m| *m == head)
        .unwrap_or(5);
    (rank, series.to_owned())
}

/// Scaling plots: per family with an x axis, per rate kind.
fn scaling_data(families: &[Family<'_>]) -> Vec<Scaling> {
    let mut out = Vec::new();
    for f in families {
        let Some(x_attr) = f.x_attr else { continue };
        let mut kinds: Vec<&'static str> = f
            .points
            .iter()
            .filter_map(|p| rate(p.m))
            .map(|r| r.0)
            .collect();
        kinds.sort_unstable();
        kinds.dedup();
        for kind in kinds {
            let mut series: Vec<(String, BTreeMap<OrdF64, Vec<f64>>)> = f
                .series
                .iter()
                .map(|s| (s.clone(), BTreeMap::new()))
                .collect();
            for p in &f.points {
                let (Some(x), Some((k, y))) = (p.x, rate(p.m)) else {
                    continue;
                };
                if k != kind {
                    continue;
                }
                if let Some((_, pts)) = series.iter_mut().find(|(s, _)| *s == p.series) {
                    pts.entry(OrdF64(x)).or_default().push(y);
                }
            }
            series.retain(|(_, pts)| !pts.is_empty());
            let runs = series
                .iter()
                .flat_map(|(_, pts)| pts.values().map(Vec::len))
                .max()
                .unwrap_or(0);
            out.push(Scaling {
                experiment: f.name.clone(),
                x_attr: x_attr.to_owned(),
                y_axis: kind,
                series,
                runs,
            });
        }
    }
    out
}

// ---------------------------------------------------------------------------------------
// Drawing
// ---------------------------------------------------------------------------------------

type DrawResult<T> = Result<T, String>;

fn err<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

fn color(i: usize) -> RGBColor {
    COLORS[i % COLORS.len()]
}

/// Every plot of the report, in page order.
pub fn plots(runs: &[StoredRun]) -> DrawResult<Vec<Plot>> {
    let fams = families(runs);
    let mut out = Vec::new();
    for s in scaling_data(&fams) {
        let title = format!("{}: {} vs {}", s.experiment, s.y_axis, s.x_attr);
        let slug = slug(&format!(
            "scaling-{}-{}-{}",
            s.experiment,
            s.x_attr,
            s.y_axis.split(' ').next().unwrap_or("rate")
        ));
        out.push(Plot {
            svg: draw_scaling(&s, &title)?,
            slug,
            title,
        });
    }
    for f in &fams {
        latency_plots(f, &mut out)?;
        cpu_plot(f, &mut out)?;
    }
    Ok(out)
}

/// Most CDF lines on one plot.
const MAX_LINES: usize = 8;

/// The latency CDFs of a family: per x value (or one for the family), a line per series,
/// repetitions' histograms merged.
fn latency_plots(f: &Family<'_>, out: &mut Vec<Plot>) -> DrawResult<()> {
    let xs: BTreeSet<Option<OrdF64>> = f
        .points
        .iter()
        .filter(|p| p.m.latency.as_ref().is_some_and(|h| h.count() > 0))
        .map(|p| p.x.map(OrdF64))
        .collect();
    for x in xs {
        let mut lines: Vec<(String, LatencyHistogram, usize)> = Vec::new();
        for s in &f.series {
            let mut merged = LatencyHistogram::new();
            let mut n = 0;
            for p in f
                .points
                .iter()
                .filter(|p| p.series == *s && p.x.map(OrdF64) == x)
            {
                if let Some(h) = p.m.latency.as_ref().filter(|h| h.count() > 0) {
                    merged.merge(h);
                    n += 1;
                }
            }
            if n > 0 {
                lines.push((s.clone(), merged, n));
            }
        }
        let at = match (f.x_attr, x) {
            (Some(a), Some(x)) => format!(" at {a}={}", si(x.0)),
            _ => String::new(),
        };
        let chunks: Vec<&[(String, LatencyHistogram, usize)]> = lines.chunks(MAX_LINES).collect();
        for (k, chunk) in chunks.iter().enumerate() {
            let part = if chunks.len() > 1 {
                format!(" ({}/{})", k + 1, chunks.len())
            } else {
                String::new()
            };
            let title = format!("{}: latency{at}{part}", f.name);
            let reps = chunk.iter().map(|l| l.2).max().unwrap_or(1);
            out.push(Plot {
                svg: draw_latency(chunk, &title, reps)?,
                slug: slug(&format!(
                    "latency-{}{}{}",
                    f.name,
                    match (f.x_attr, x) {
                        (Some(a), Some(x)) => format!("-{a}{}", x.0),
                        _ => String::new(),
                    },
                    if chunks.len() > 1 {
                        format!("-{}", k + 1)
                    } else {
                        String::new()
                    }
                )),
                title,
            });
        }
    }
    Ok(())
}

/// The CPU time of a family: a bar per (series, x), repetitions averaged.
fn cpu_plot(f: &Family<'_>, out: &mut Vec<Plot>) -> DrawResult<()> {
    let mut rows: Vec<(String, [f64; 4])> = Vec::new();
    let mut reps = 0;
    for s in &f.series {
        let mut xs: BTreeMap<Option<OrdF64>, ([f64; 4], usize)> = BTreeMap::new();
        for p in f.points.iter().filter(|p| p.series == *s) {
            let Some(c) = p.m.cpu.filter(|c| c.total_ns() > 0) else {
                continue;
            };
            let total = c.total_ns() as f64;
            let e = xs.entry(p.x.map(OrdF64)).or_insert(([0.0; 4], 0));
            for (acc, v) in
                e.0.iter_mut()
                    .zip([c.user_ns, c.system_ns, c.spin_ns, c.idle_ns])
            {
                *acc += v as f64 * 100.0 / total;
            }
            e.1 += 1;
        }
        for (x, (sum, n)) in xs {
            reps = reps.max(n);
            let label = match (f.x_attr, x) {
                (Some(a), Some(x)) => format!("{s}, {a}={}", si(x.0)),
                _ => s.clone(),
            };
            rows.push((label, sum.map(|v| v / n as f64)));
        }
    }
    if rows.is_empty() {
        return Ok(());
    }
    let title = if reps > 1 {
        format!("{}: CPU time (mean of {reps} runs)", f.name)
    } else {
        format!("{}: CPU time", f.name)
    };
    out.push(Plot {
        svg: draw_cpu(&rows, &title)?,
        slug: slug(&format!("cpu-{}", f.name)),
        title,
    });
    Ok(())
}

fn draw_scaling(s: &Scaling, title: &str) -> DrawResult<String> {
    let mut svg = String::new();
    let xs: Vec<f64> = s
        .series
        .iter()
        .flat_map(|(_, p)| p.keys().map(|x| x.0))
        .collect();
    let means: Vec<(String, Vec<(f64, f64)>)> = s
        .series
        .iter()
        .map(|(name, pts)| {
            let line = pts
                .iter()
                .map(|(x, ys)| (x.0, ys.iter().sum::<f64>() / ys.len() as f64))
                .collect();
            (name.clone(), line)
        })
        .collect();
    let integral = xs.iter().all(|x| x.fract() == 0.0);
    let x_min = xs.iter().copied().fold(f64::INFINITY, f64::min);
    let x_max = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let y_max = means
        .iter()
        .flat_map(|(_, l)| l.iter().map(|p| p.1))
        .fold(0.0f64, f64::max);
    let pad = ((x_max - x_min) * 0.04).max(0.5);
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let caption = if s.runs > 1 {
            format!("{title} (mean of {} runs)", s.runs)
        } else {
            title.to_owned()
        };
        let mut chart = ChartBuilder::on(&root)
            .caption(caption, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(64)
            .build_cartesian_2d((x_min - pad)..(x_max + pad), 0.0..(y_max * 1.1).max(1.0))
            .map_err(err)?;
        chart
            .configure_mesh()
            .label_style(("sans-serif", 13))
            .axis_desc_style(("sans-serif", 14))
            .x_desc(s.x_attr.as_str())
            .y_desc(s.y_axis)
            .y_label_formatter(&|v| si(*v))
            .x_label_formatter(&|v| {
                // Whole-number attributes (threads, iodepth) get whole-number ticks only.
                if integral && (v - v.round()).abs() > 1e-9 {
                    String::new()
                } else {
                    si(*v)
                }
            })
            .draw()
            .map_err(err)?;
        for (i, (name, line)) in means.iter().enumerate() {
            let c = color(i);
            chart
                .draw_series(LineSeries::new(line.iter().copied(), c.stroke_width(2)).point_size(4))
                .map_err(err)?
                .label(name.as_str())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(2))
                });
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .label_font(("sans-serif", 14))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(err)?;
        root.present().map_err(err)?;
    }
    Ok(svg)
}

/// Lower bound of the histogram bucket whose upper bound is `upper` (see
/// [`LatencyHistogram`]: below 16 ns a bucket per value, above 16 per power of two).
fn bucket_lower(upper: u64) -> u64 {
    if upper < 16 {
        return upper;
    }
    let exp = 63 - upper.leading_zeros();
    let shift = exp - 4;
    upper + 1 - (1u64 << shift)
}

/// Tick values for a log axis over `lo..hi`: 1, 1.5, 2, 3, 5, 7 times each power of ten,
/// or, over a range too narrow for four of those, every integer multiple (1..9) of the
/// power of ten and halfway between them.
fn log_ticks(lo: f64, hi: f64) -> Vec<f64> {
    let ticks = |mults: &[f64]| {
        let mut out = Vec::new();
        let mut decade = 10f64.powi(lo.max(1.0).log10().floor() as i32);
        while decade <= hi {
            for m in mults {
                let v = decade * m;
                if v >= lo && v <= hi {
                    out.push(v);
                }
            }
            decade *= 10.0;
        }
        out
    };
    let coarse = ticks(&[1.0, 1.5, 2.0, 3.0, 5.0, 7.0]);
    if coarse.len() >= 4 {
        return coarse;
    }
    let fine = ticks(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0]);
    if fine.len() >= 4 {
        return fine;
    }
    ticks(&[
        1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 6.0, 7.0, 8.0, 9.0,
    ])
}

fn draw_latency(
    lines: &[(String, LatencyHistogram, usize)],
    title: &str,
    reps: usize,
) -> DrawResult<String> {
    let mut svg = String::new();
    let first = lines
        .iter()
        .filter_map(|l| l.1.buckets.first())
        .map(|b| b.0);
    let last = lines.iter().filter_map(|l| l.1.buckets.last()).map(|b| b.0);
    let lo = (bucket_lower(first.min().unwrap_or(1)).max(1) as f64) / 1.2;
    let hi = (last.max().unwrap_or(2) as f64 * 1.25).max(lo * 2.0);
    // Histograms as fractions of each line's samples, so lines of different sizes compare.
    let max_frac = lines
        .iter()
        .flat_map(|l| {
            let n = l.1.count().max(1) as f64;
            l.1.buckets.iter().map(move |b| b.1 as f64 / n)
        })
        .fold(0.0f64, f64::max);
    let single = lines.len() == 1;
    let legend_rows = if single { 0 } else { lines.len() as u32 };
    {
        let root = SVGBackend::with_string(&mut svg, (SIZE.0, SIZE.1 + 160 + 18 * legend_rows))
            .into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let mut caption = title.to_owned();
        if reps > 1 {
            let _ = write!(caption, " ({reps} runs merged)");
        }
        if single {
            let h = &lines[0].1;
            let _ = write!(
                caption,
                ": {} samples, p50 {}, p99 {}",
                h.count(),
                latency_label(h.percentile(50.0) as f64),
                latency_label(h.percentile(99.0) as f64)
            );
        }
        let root = root.titled(&caption, ("sans-serif", 17)).map_err(err)?;
        let (legend, plots) = root.split_vertically(18 * legend_rows);
        // The legend: a line per series with its sample count and percentiles.
        for (i, (name, h, _)) in lines.iter().enumerate().take(legend_rows as usize) {
            let y = 18 * i as i32 + 4;
            let c = color(i);
            legend
                .draw(&PathElement::new(
                    vec![(76, y + 7), (100, y + 7)],
                    c.stroke_width(3),
                ))
                .map_err(err)?;
            legend
                .draw(&Text::new(
                    format!(
                        "{name}: {} samples, p50 {}, p99 {}",
                        h.count(),
                        latency_label(h.percentile(50.0) as f64),
                        latency_label(h.percentile(99.0) as f64)
                    ),
                    (108, y),
                    ("sans-serif", 13),
                ))
                .map_err(err)?;
        }
        let (top, bottom) = plots.split_vertically(330);
        let mut chart = ChartBuilder::on(&top)
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(64)
            .build_cartesian_2d(
                (lo..hi).log_scale().with_key_points(log_ticks(lo, hi)),
                0.0..1.0,
            )
            .map_err(err)?;
        chart
            .configure_mesh()
            .label_style(("sans-serif", 13))
            .axis_desc_style(("sans-serif", 14))
            .x_desc("latency (log scale)")
            .y_desc("CDF: fraction of I/Os ≤ x")
            .x_label_formatter(&|v| latency_label(*v))
            .draw()
            .map_err(err)?;
        for (i, (_, h, _)) in lines.iter().enumerate() {
            // A step function: each bucket's fraction holds up to its upper bound.
            let cdf = h.cdf();
            let mut steps = Vec::with_capacity(cdf.len() * 2 + 1);
            let mut prev = 0.0;
            for &(upper, frac) in &cdf {
                let x0 = bucket_lower(upper).max(1) as f64;
                steps.push((x0, prev));
                steps.push((upper as f64, frac));
                prev = frac;
            }
            steps.push((hi, 1.0));
            chart
                .draw_series(LineSeries::new(steps, color(i).stroke_width(2)))
                .map_err(err)?;
        }
        let mut hist = ChartBuilder::on(&bottom)
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(64)
            .build_cartesian_2d(
                (lo..hi).log_scale().with_key_points(log_ticks(lo, hi)),
                0.0..(max_frac * 110.0).max(1e-9),
            )
            .map_err(err)?;
        hist.configure_mesh()
            .label_style(("sans-serif", 13))
            .axis_desc_style(("sans-serif", 14))
            .label_style(("sans-serif", 13))
            .axis_desc_style(("sans-serif", 14))
            .x_desc("latency (log scale)")
            .y_desc("% of I/Os per bucket")
            .x_label_formatter(&|v| latency_label(*v))
            .y_label_formatter(&|v| si(*v))
            .draw()
            .map_err(err)?;
        for (i, (_, h, _)) in lines.iter().enumerate() {
            let n = h.count().max(1) as f64;
            if single {
                hist.draw_series(h.buckets.iter().map(|&(upper, k)| {
                    let x0 = bucket_lower(upper).max(1) as f64;
                    Rectangle::new(
                        [(x0, 0.0), (upper as f64 + 1.0, k as f64 * 100.0 / n)],
                        color(1).filled(),
                    )
                }))
                .map_err(err)?;
            } else {
                // Several series: outlines, so that none hides another.
                let mut outline = Vec::with_capacity(h.buckets.len() * 4);
                for &(upper, k) in &h.buckets {
                    let x0 = bucket_lower(upper).max(1) as f64;
                    let y = k as f64 * 100.0 / n;
                    outline.extend([
                        (x0, 0.0),
                        (x0, y),
                        (upper as f64 + 1.0, y),
                        (upper as f64 + 1.0, 0.0),
                    ]);
                }
                hist.draw_series(LineSeries::new(outline, color(i).stroke_width(2)))
                    .map_err(err)?;
            }
        }
        root.present().map_err(err)?;
    }
    Ok(svg)
}

fn draw_cpu(rows: &[(String, [f64; 4])], title: &str) -> DrawResult<String> {
    let n = rows.len();
    let height = (120 + 28 * n as u32).max(260);
    let longest = rows.iter().map(|r| r.0.chars().count()).max().unwrap_or(4) as u32;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (SIZE.0, height)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        // Rows on a continuous axis, row i (from the top) in [n-1-i, n-i]: exactly n rows,
        // none empty; each labelled at its middle, left of the axis.
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 18))
            .margin(12)
            .margin_right(LEGEND_W)
            .x_label_area_size(40)
            .y_label_area_size((longest * 7 + 16).clamp(60, 360))
            .build_cartesian_2d(0.0..100.0, 0.0..n as f64)
            .map_err(err)?;
        chart
            .configure_mesh()
            .label_style(("sans-serif", 13))
            .axis_desc_style(("sans-serif", 14))
            .disable_y_mesh()
            .y_labels(0)
            .x_label_formatter(&|v| format!("{v:.0}"))
            .x_desc("% of the measured CPU time")
            .draw()
            .map_err(err)?;
        let label_style = ("sans-serif", 13)
            .into_font()
            .color(&BLACK)
            .pos(Pos::new(HPos::Right, VPos::Center));
        for (i, (label, _)) in rows.iter().enumerate() {
            let (px, py) = chart.backend_coord(&(0.0, (n - 1 - i) as f64 + 0.5));
            root.draw(&Text::new(label.clone(), (px - 6, py), label_style.clone()))
                .map_err(err)?;
        }
        let parts = ["user", "system", "spin", "idle"];
        let part_colors = [color(0), color(1), color(4), RGBColor(200, 200, 200)];
        for (p, c) in part_colors.iter().copied().enumerate() {
            chart
                .draw_series(rows.iter().enumerate().map(move |(i, (_, v))| {
                    let start: f64 = v[..p].iter().sum();
                    let end = start + v[p];
                    let y = (n - 1 - i) as f64;
                    Rectangle::new([(start, y + 0.15), (end, y + 0.85)], c.filled())
                }))
                .map_err(err)?;
        }
        // The legend, drawn beside the bars (right of the plotting area, where plotters'
        // own series labels would be clipped).
        let x = (SIZE.0 - LEGEND_W) as i32 + 4;
        for (j, (name, c)) in parts.iter().zip(part_colors).enumerate() {
            let y = 48 + 20 * j as i32;
            root.draw(&Rectangle::new([(x, y), (x + 12, y + 12)], c.filled()))
                .map_err(err)?;
            root.draw(&Text::new(*name, (x + 18, y), ("sans-serif", 13)))
                .map_err(err)?;
        }
        root.present().map_err(err)?;
    }
    Ok(svg)
}

// ---------------------------------------------------------------------------------------
// The page
// ---------------------------------------------------------------------------------------

const CSS: &str = "body{font-family:system-ui,-apple-system,'Segoe UI',sans-serif;margin:2em auto;max-width:1100px;padding:0 1em;color:#222}\
h1{font-size:1.6em}h2{font-size:1.3em;border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:2em}h3{font-size:1.05em}\
table{border-collapse:collapse;margin:.5em 0 1em;font-size:.9em}th,td{border:1px solid #ccc;padding:.25em .6em;text-align:left;vertical-align:top}\
td.n{text-align:right;font-variant-numeric:tabular-nums}th{background:#f3f3f3}\
dl.meta{display:grid;grid-template-columns:max-content auto;gap:.1em 1em;font-size:.9em}dl.meta dt{font-weight:600}dl.meta dd{margin:0}\
figure{margin:1em 0}figcaption{font-size:.9em;color:#555}svg{max-width:100%;height:auto}";

/// The page; the same runs and plots give the same bytes.
pub fn render_html(runs: &[StoredRun], plots: &[Plot]) -> String {
    let mut h = String::new();
    let ids = id_ranges(&runs.iter().map(|r| r.id).collect::<Vec<_>>());
    let _ = write!(
        h,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>iolab report: runs {}</title>\n<style>{CSS}</style>\n</head>\n<body>\n<h1>iolab report: runs {}</h1>\n",
        esc(&ids),
        esc(&ids)
    );
    h.push_str("<table>\n<tr><th>run</th><th>experiment</th><th>kind</th><th>label</th><th>seed</th><th>runs</th><th>started</th><th>measurements</th></tr>\n");
    for r in runs {
        let _ = writeln!(
            h,
            "<tr><td><a href=\"#run-{id}\">{id}</a></td><td>{}</td><td>{}</td><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td>{}</td><td class=\"n\">{}</td></tr>",
            esc(&r.experiment),
            esc(&r.kind),
            esc(r.label.as_deref().unwrap_or("")),
            r.seed,
            r.runs,
            esc(&r.started_at),
            r.measurements.len(),
            id = r.id
        );
    }
    h.push_str("</table>\n");
    if !plots.is_empty() {
        h.push_str("<h2 id=\"plots\">Plots</h2>\n");
        for p in plots {
            let _ = write!(
                h,
                "<figure id=\"plot-{}\">\n{}\n<figcaption>{}</figcaption>\n</figure>\n",
                esc(&p.slug),
                strip_xml_declaration(&p.svg),
                esc(&p.title)
            );
        }
    } else {
        h.push_str("<p>No plots: the selected runs have no measurements with rates against threads / iodepth / numjobs / cpus, latency histograms or CPU times.</p>\n");
    }
    group_sections(&mut h, runs);
    for r in runs {
        run_section(&mut h, r);
    }
    h.push_str("</body>\n</html>\n");
    h
}

/// A section per group of repetitions (two or more selected runs with one `group_id`, as
/// `iolab run --runs N` and `iolab reproduce --runs N` store them): each figure's and each
/// headline metric's mean ± sd, min and max over the repetitions, and whether they were
/// identical.
fn group_sections(h: &mut String, runs: &[StoredRun]) {
    let mut groups: Vec<i64> = runs.iter().filter_map(|r| r.group_id).collect();
    groups.sort_unstable();
    groups.dedup();
    for g in groups {
        let members: Vec<&StoredRun> = runs.iter().filter(|r| r.group_id == Some(g)).collect();
        if members.len() < 2 {
            continue;
        }
        let seeds: Vec<String> = members.iter().map(|r| r.seed.to_string()).collect();
        let _ = writeln!(
            h,
            "<h2 id=\"group-{g}\">Group g{g}: {} repetitions of {} (seeds {})</h2>",
            members.len(),
            esc(&members[0].experiment),
            esc(&seeds.join(", "))
        );
        let first = members[0];
        let same_figures = members.iter().all(|r| {
            r.figures.len() == first.figures.len()
                && r.figures
                    .iter()
                    .zip(&first.figures)
                    .all(|(a, b)| a.id == b.id)
        });
        if !first.figures.is_empty() && same_figures {
            h.push_str("<table>\n<tr><th>figure</th><th>published</th><th>lab mean ± sd</th><th>min</th><th>max</th></tr>\n");
            for (i, f) in first.figures.iter().enumerate() {
                let values: Vec<f64> = members.iter().map(|r| r.figures[i].lab).collect();
                let s = crate::compare::Summary::of(&values);
                let sd = s.sd.filter(|&sd| sd > 1e-12 * s.mean.abs()).unwrap_or(0.0);
                let min = values.iter().copied().fold(f64::INFINITY, f64::min);
                let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let _ = writeln!(
                    h,
                    "<tr><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{} ± {}</td><td class=\"n\">{}</td><td class=\"n\">{}</td></tr>",
                    esc(&f.id),
                    f.published.map_or(String::new(), num),
                    num(s.mean),
                    num(sd),
                    num(min),
                    num(max)
                );
            }
            h.push_str("</table>\n");
        }
        let ms: Vec<&[Measurement]> = members.iter().map(|r| &r.measurements[..]).collect();
        let spread = crate::repeat::metric_spread(&ms);
        if !spread.rows.is_empty() {
            h.push_str("<table>\n<tr><th>configuration</th><th>metric</th><th>lab mean ± sd</th><th>min</th><th>max</th></tr>\n");
            for row in &spread.rows {
                let _ = writeln!(
                    h,
                    "<tr><td>{}</td><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td></tr>",
                    esc(&row[0]),
                    esc(&row[1]),
                    esc(&row[2]),
                    esc(&row[3]),
                    esc(&row[4])
                );
            }
            h.push_str("</table>\n");
        }
        if spread.identical {
            let _ = writeln!(
                h,
                "<p>{}</p>",
                esc(&crate::repeat::identical_note(members.len()))
            );
        }
    }
}

/// Run ids as a short list: consecutive ids as ranges (`1-15, 18, 20-22`), in the order
/// given.
fn id_ranges(ids: &[i64]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < ids.len() {
        let mut j = i;
        while j + 1 < ids.len() && ids[j + 1] == ids[j] + 1 {
            j += 1;
        }
        parts.push(match j - i {
            0 => ids[i].to_string(),
            1 => format!("{}, {}", ids[i], ids[j]),
            _ => format!("{}-{}", ids[i], ids[j]),
        });
        i = j + 1;
    }
    parts.join(", ")
}

/// SVG as an inline element (an XML declaration is not allowed inside HTML).
fn strip_xml_declaration(svg: &str) -> &str {
    let s = svg.trim_start();
    if s.starts_with("<?xml") {
        s.find("?>").map_or(s, |i| s[i + 2..].trim_start())
    } else {
        s
    }
}

fn run_section(h: &mut String, r: &StoredRun) {
    let _ = writeln!(
        h,
        "<h2 id=\"run-{}\">Run {}: {}</h2>",
        r.id,
        r.id,
        esc(&r.experiment)
    );
    h.push_str("<dl class=\"meta\">");
    let meta: [(&str, String); 9] = [
        ("kind", r.kind.clone()),
        ("group", r.group_id.map_or(String::new(), |g| g.to_string())),
        ("label", r.label.clone().unwrap_or_default()),
        ("scenario", r.scenario_origin.clone().unwrap_or_default()),
        ("seed", r.seed.to_string()),
        ("runs per configuration", r.runs.to_string()),
        ("iolab", r.iolab_version.clone()),
        ("started", r.started_at.clone()),
        ("finished", r.finished_at.clone()),
    ];
    for (k, v) in meta {
        if !v.is_empty() {
            let _ = write!(h, "<dt>{}</dt><dd>{}</dd>", esc(k), esc(&v));
        }
    }
    h.push_str("</dl>\n");
    if !r.figures.is_empty() {
        h.push_str("<h3>Figures: published vs lab</h3>\n<table>\n<tr><th>figure</th><th>unit</th><th>published</th><th>lab</th><th>lab / published</th><th>role</th></tr>\n");
        for f in &r.figures {
            let ratio = match f.published {
                Some(p) if p != 0.0 => num(f.lab / p),
                _ => String::new(),
            };
            let _ = writeln!(
                h,
                "<tr><td>{}</td><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td><td>{}</td></tr>",
                esc(&f.id),
                esc(&f.unit),
                f.published.map_or(String::new(), num),
                num(f.lab),
                ratio,
                esc(&f.role)
            );
        }
        h.push_str("</table>\n");
    }
    if !r.effects.is_empty() {
        h.push_str("<h3>Effects (percent change)</h3>\n<table>\n<tr><th>effect</th><th>published %</th><th>lab %</th></tr>\n");
        for e in &r.effects {
            let _ = writeln!(
                h,
                "<tr><td>{}</td><td class=\"n\">{}</td><td class=\"n\">{}</td></tr>",
                esc(&e.id),
                num(e.published_pct),
                num(e.lab_pct)
            );
        }
        h.push_str("</table>\n");
    }
    if !r.measurements.is_empty() {
        h.push_str("<h3>Measurements</h3>\n<table>\n<tr><th>configuration</th><th>attributes</th><th>metric</th><th>value</th><th>unit</th></tr>\n");
        for m in &r.measurements {
            let attrs: Vec<String> = m.attrs.iter().map(|(k, v)| format!("{k}={v}")).collect();
            let mut rows: Vec<(String, String, String)> = m
                .metrics
                .iter()
                .map(|x| (x.name.clone(), num(x.value), x.unit.clone()))
                .collect();
            if let Some(l) = m.latency.as_ref().filter(|l| l.count() > 0) {
                rows.push((
                    "latency.samples".into(),
                    l.count().to_string(),
                    String::new(),
                ));
                for p in [50.0, 99.0, 99.9] {
                    rows.push((
                        format!("latency.p{p}"),
                        l.percentile(p).to_string(),
                        "ns".into(),
                    ));
                }
            }
            if let Some(c) = m.cpu {
                for (k, v) in [
                    ("cpu.user_ns", c.user_ns),
                    ("cpu.system_ns", c.system_ns),
                    ("cpu.spin_ns", c.spin_ns),
                    ("cpu.idle_ns", c.idle_ns),
                ] {
                    rows.push((k.into(), v.to_string(), "ns".into()));
                }
            }
            if rows.is_empty() {
                rows.push((String::new(), String::new(), String::new()));
            }
            let span = rows.len();
            for (i, (name, value, unit)) in rows.iter().enumerate() {
                h.push_str("<tr>");
                if i == 0 {
                    let _ = write!(
                        h,
                        "<td rowspan=\"{span}\">{}</td><td rowspan=\"{span}\">{}</td>",
                        esc(&m.config),
                        esc(&attrs.join(", "))
                    );
                }
                let _ = writeln!(
                    h,
                    "<td>{}</td><td class=\"n\">{}</td><td>{}</td></tr>",
                    esc(name),
                    esc(value),
                    esc(unit)
                );
            }
        }
        h.push_str("</table>\n");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bucket_lower_bounds_match_the_histogram() {
        for v in [0u64, 5, 15, 16, 17, 31, 32, 100, 1000, 123_456, 1 << 40] {
            let h = LatencyHistogram::from_samples(&[v]);
            let upper = h.buckets[0].0;
            let lower = bucket_lower(upper);
            assert!(lower <= v && v <= upper, "{v}: [{lower}, {upper}]");
            if v > 16 {
                // The bucket below ends right before this one starts.
                let below = LatencyHistogram::from_samples(&[lower - 1]).buckets[0].0;
                assert_eq!(below, lower - 1);
            }
        }
    }

    #[test]
    fn log_ticks_are_dense_enough_on_narrow_ranges() {
        assert_eq!(
            log_ticks(1_000.0, 100_000.0),
            [1e3, 1.5e3, 2e3, 3e3, 5e3, 7e3, 1e4, 1.5e4, 2e4, 3e4, 5e4, 7e4, 1e5]
        );
        // 200-400 µs: 200, 250, ... 400 µs rather than only 200 and 300.
        let t = log_ticks(200_000.0, 400_000.0);
        assert_eq!(t, [2e5, 2.5e5, 3e5, 3.5e5, 4e5]);
    }

    #[test]
    fn id_lists_shorten_to_ranges() {
        assert_eq!(id_ranges(&[1, 2, 3, 4, 7, 9, 10, 12]), "1-4, 7, 9, 10, 12");
        assert_eq!(id_ranges(&[5, 3]), "5, 3");
        assert_eq!(id_ranges(&[]), "");
    }

    #[test]
    fn escaping_and_numbers() {
        assert_eq!(esc("<a & \"b\">"), "&lt;a &amp; &quot;b&quot;&gt;");
        assert_eq!(num(886_860.4), "886860");
        assert_eq!(num(5.5428125), "5.543");
        assert_eq!(num(-0.4767), "-0.477");
        assert_eq!(si(886_860.0), "887K");
        assert_eq!(si(1_250_000.0), "1.25M");
        assert_eq!(latency_label(85_000.0), "85µs");
        assert_eq!(latency_label(12_500.0), "12.5µs");
        assert_eq!(latency_label(1_250_000.0), "1.25ms");
    }
}
