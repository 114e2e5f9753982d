//! `iolab report`: one self-contained HTML page about stored runs: a table per run and SVG
//! plots drawn with plotters' SVG backend (inline, no scripts, no network).
//!
//! Plots:
//! - **scaling**: IOPS (or throughput) against the first of `threads`, `iodepth`,
//!   `numjobs`, `cpus` that takes several numeric values among an experiment's
//!   measurements; a series per value of the other attributes that vary (`iommu_mode`
//!   first), or per configuration name when measurements carry no attributes. Points of
//!   repeated runs (a group) are averaged.
//! - **latency**: per measurement with a latency histogram, the CDF on a log-x axis above
//!   the histogram itself (bucket counts, same axis).
//! - **cpu**: per run, every measurement's CPU time split into user / system / spin / idle,
//!   as stacked horizontal bars in percent of the measured CPU time.
//!
//! Output is a pure function of the database content: no clock is read, numbers are
//! formatted with fixed rules, and every collection is ordered.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::Path;
use std::process::ExitCode;

use iolab_sim::metrics::{LatencyHistogram, Measurement};
use plotters::prelude::*;

use crate::db::{ResultsDb, StoredRun};

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
    if !db_path.exists() {
        return Err(Failure::bad(format!(
            "results database {} does not exist; store runs with `iolab run` or `iolab reproduce`, or pass --db",
            db_path.display()
        )));
    }
    let db = ResultsDb::open(db_path).map_err(|e| Failure {
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

/// Resolves RUNS arguments (`12`, `g12`, `3,5,g12`) to run ids, in the order given, each
/// once.
fn select(db: &ResultsDb, specs: &[String]) -> Result<Vec<i64>, Failure> {
    let mut ids = Vec::new();
    let mut seen = BTreeSet::new();
    let mut listed = None;
    for spec in specs {
        for part in spec.split(',') {
            let part = part.trim();
            if part.is_empty() {
                return Err(Failure::bad(format!(
                    "RUNS `{spec}`: empty item; expected run ids (12), groups (g12) or comma lists of them"
                )));
            }
            let found: Vec<i64> = if let Some(g) = part.strip_prefix(['g', 'G']) {
                let group: i64 = g.parse().map_err(|_| {
                    Failure::bad(format!(
                        "RUNS `{part}`: expected g followed by a group number, e.g. g12"
                    ))
                })?;
                if listed.is_none() {
                    listed = Some(db.list().map_err(|e| Failure {
                        message: e.to_string(),
                        code: e.exit_code(),
                    })?);
                }
                // A group is named by its first run's id; that run may carry the group id
                // or none.
                let members: Vec<i64> = listed
                    .iter()
                    .flatten()
                    .filter(|r| {
                        r.group_id == Some(group)
                            || (r.id == group && r.group_id.map_or(true, |g| g == group))
                    })
                    .map(|r| r.id)
                    .collect();
                if members.is_empty() {
                    return Err(Failure::bad(format!(
                        "RUNS `{part}`: no run belongs to group {group} in {}",
                        db.path().display()
                    )));
                }
                members
            } else {
                let id: i64 = part.parse().map_err(|_| {
                    Failure::bad(format!(
                        "RUNS `{part}`: expected a run id (a number, see `iolab runs list`) or a group (g12)"
                    ))
                })?;
                vec![id]
            };
            for id in found {
                if seen.insert(id) {
                    ids.push(id);
                }
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
    None
}

/// A scaling plot's data: series name -> x -> the y values (one per run).
struct Scaling {
    experiment: String,
    x_attr: &'static str,
    y_axis: &'static str,
    series: BTreeMap<String, BTreeMap<OrdF64, Vec<f64>>>,
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

/// Scaling plots: per experiment, per rate kind, against the first attribute of
/// [`X_ATTRS`] with several numeric values.
fn scaling_data(runs: &[StoredRun]) -> Vec<Scaling> {
    let mut experiments: Vec<&str> = runs.iter().map(|r| r.experiment.as_str()).collect();
    experiments.sort_unstable();
    experiments.dedup();
    let mut out = Vec::new();
    for exp in experiments {
        let mine: Vec<&StoredRun> = runs.iter().filter(|r| r.experiment == exp).collect();
        let all: Vec<&Measurement> = mine.iter().flat_map(|r| &r.measurements).collect();
        let numeric = |m: &Measurement, a: &str| -> Option<f64> {
            m.attrs
                .get(a)
                .and_then(|v| v.parse::<f64>().ok())
                .filter(|v| v.is_finite())
        };
        let Some(x_attr) = X_ATTRS.into_iter().find(|a| {
            let values: BTreeSet<OrdF64> = all
                .iter()
                .filter_map(|m| numeric(m, a))
                .map(OrdF64)
                .collect();
            values.len() >= 2
        }) else {
            continue;
        };
        let mut kinds: Vec<&'static str> =
            all.iter().filter_map(|m| rate(m)).map(|r| r.0).collect();
        kinds.sort_unstable();
        kinds.dedup();
        for kind in kinds {
            let points: Vec<(&Measurement, f64, f64)> = all
                .iter()
                .filter_map(|m| {
                    let x = numeric(m, x_attr)?;
                    let (k, y) = rate(m)?;
                    (k == kind).then_some((*m, x, y))
                })
                .collect();
            // The attributes (other than x) that vary among these points name the series.
            let keys: BTreeSet<&String> = points
                .iter()
                .flat_map(|(m, _, _)| m.attrs.keys())
                .filter(|k| k.as_str() != x_attr)
                .collect();
            let mut varying: Vec<&String> = keys
                .into_iter()
                .filter(|k| {
                    let vals: BTreeSet<Option<&String>> =
                        points.iter().map(|(m, _, _)| m.attrs.get(*k)).collect();
                    vals.len() > 1
                })
                .collect();
            varying.sort_by_key(|k| (k.as_str() != "iommu_mode", k.as_str()));
            let mut series: BTreeMap<String, BTreeMap<OrdF64, Vec<f64>>> = BTreeMap::new();
            for (m, x, y) in points {
                let name = if varying.is_empty() {
                    if m.attrs.contains_key("iommu_mode") {
                        m.attrs["iommu_mode"].clone()
                    } else if m.attrs.len() <= 1 {
                        m.config.clone()
                    } else {
                        kind.to_owned()
                    }
                } else {
                    varying
                        .iter()
                        .map(|k| match m.attrs.get(*k) {
                            Some(v) if k.as_str() == "iommu_mode" => v.clone(),
                            Some(v) => format!("{k}={v}"),
                            None => format!("{k}=-"),
                        })
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                series
                    .entry(name)
                    .or_default()
                    .entry(OrdF64(x))
                    .or_default()
                    .push(y);
            }
            out.push(Scaling {
                experiment: exp.to_owned(),
                x_attr,
                y_axis: kind,
                series,
                runs: mine.len(),
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
    let mut out = Vec::new();
    for s in scaling_data(runs) {
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
    for r in runs {
        for (i, m) in r.measurements.iter().enumerate() {
            if let Some(h) = m.latency.as_ref().filter(|h| h.count() > 0) {
                let title = format!("run {}: {} latency", r.id, m.config);
                out.push(Plot {
                    svg: draw_latency(h, &title)?,
                    slug: slug(&format!("latency-run{}-{}-{}", r.id, i, m.config)),
                    title,
                });
            }
        }
        if r.measurements
            .iter()
            .any(|m| m.cpu.is_some_and(|c| c.total_ns() > 0))
        {
            let title = format!("run {}: {} CPU time", r.id, r.experiment);
            out.push(Plot {
                svg: draw_cpu(r, &title)?,
                slug: slug(&format!("cpu-run{}", r.id)),
                title,
            });
        }
    }
    Ok(out)
}

fn draw_scaling(s: &Scaling, title: &str) -> DrawResult<String> {
    let mut svg = String::new();
    let xs: Vec<f64> = s
        .series
        .values()
        .flat_map(|p| p.keys().map(|x| x.0))
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
            .x_desc(s.x_attr)
            .y_desc(s.y_axis)
            .y_label_formatter(&|v| si(*v))
            .x_label_formatter(&|v| si(*v))
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

/// Tick values for a log axis over `lo..hi`: 1, 1.5, 2, 3, 5, 7 times each power of ten.
fn log_ticks(lo: f64, hi: f64) -> Vec<f64> {
    let mut out = Vec::new();
    let mut decade = 10f64.powi(lo.max(1.0).log10().floor() as i32);
    while decade <= hi {
        for m in [1.0, 1.5, 2.0, 3.0, 5.0, 7.0] {
            let v = decade * m;
            if v >= lo && v <= hi {
                out.push(v);
            }
        }
        decade *= 10.0;
    }
    out
}

fn draw_latency(h: &LatencyHistogram, title: &str) -> DrawResult<String> {
    let mut svg = String::new();
    let cdf = h.cdf();
    let lo = (bucket_lower(h.buckets[0].0).max(1) as f64) / 1.2;
    let hi = (h.buckets[h.buckets.len() - 1].0 as f64 * 1.25).max(lo * 2.0);
    let max_count = h.buckets.iter().map(|b| b.1).max().unwrap_or(1) as f64;
    {
        let root = SVGBackend::with_string(&mut svg, (SIZE.0, SIZE.1 + 160)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let root = root
            .titled(
                &format!(
                    "{title}: {} samples, p50 {}, p99 {}",
                    h.count(),
                    latency_label(h.percentile(50.0) as f64),
                    latency_label(h.percentile(99.0) as f64)
                ),
                ("sans-serif", 17),
            )
            .map_err(err)?;
        let (top, bottom) = root.split_vertically(330);
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
            .x_desc("latency (log scale)")
            .y_desc("CDF: fraction of I/Os ≤ x")
            .x_label_formatter(&|v| latency_label(*v))
            .draw()
            .map_err(err)?;
        // A step function: each bucket's fraction holds up to its upper bound.
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
            .draw_series(LineSeries::new(steps, color(0).stroke_width(2)))
            .map_err(err)?;
        let mut hist = ChartBuilder::on(&bottom)
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(64)
            .build_cartesian_2d(
                (lo..hi).log_scale().with_key_points(log_ticks(lo, hi)),
                0.0..max_count * 1.1,
            )
            .map_err(err)?;
        hist.configure_mesh()
            .x_desc("latency (log scale)")
            .y_desc("I/Os per bucket")
            .x_label_formatter(&|v| latency_label(*v))
            .y_label_formatter(&|v| si(*v))
            .draw()
            .map_err(err)?;
        hist.draw_series(h.buckets.iter().map(|&(upper, n)| {
            let x0 = bucket_lower(upper).max(1) as f64;
            Rectangle::new(
                [(x0, 0.0), (upper as f64 + 1.0, n as f64)],
                color(1).filled(),
            )
        }))
        .map_err(err)?;
        root.present().map_err(err)?;
    }
    Ok(svg)
}

fn draw_cpu(r: &StoredRun, title: &str) -> DrawResult<String> {
    let rows: Vec<(&str, [f64; 4])> = r
        .measurements
        .iter()
        .filter_map(|m| {
            let c = m.cpu?;
            let total = c.total_ns() as f64;
            (total > 0.0).then(|| {
                (
                    m.config.as_str(),
                    [c.user_ns, c.system_ns, c.spin_ns, c.idle_ns]
                        .map(|v| v as f64 * 100.0 / total),
                )
            })
        })
        .collect();
    let n = rows.len();
    let height = (120 + 28 * n as u32).max(260);
    let labels: Vec<String> = rows.iter().map(|r| r.0.to_owned()).collect();
    let longest = labels.iter().map(|l| l.chars().count()).max().unwrap_or(4) as u32;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (SIZE.0, height)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 18))
            .margin(12)
            .margin_right(LEGEND_W)
            .x_label_area_size(40)
            .y_label_area_size((longest * 7 + 16).clamp(60, 320))
            .build_cartesian_2d(0.0..100.0, (0..n).into_segmented())
            .map_err(err)?;
        let label_of = |v: &SegmentValue<usize>| match v {
            SegmentValue::CenterOf(i) | SegmentValue::Exact(i) => {
                labels.get(*i).cloned().unwrap_or_default()
            }
            SegmentValue::Last => String::new(),
        };
        chart
            .configure_mesh()
            .disable_y_mesh()
            .x_desc("% of the measured CPU time")
            .y_labels(n.max(1))
            .y_label_formatter(&label_of)
            .draw()
            .map_err(err)?;
        let parts = ["user", "system", "spin", "idle"];
        let part_colors = [color(0), color(1), color(4), RGBColor(200, 200, 200)];
        for (p, c) in part_colors.iter().copied().enumerate() {
            chart
                .draw_series(rows.iter().enumerate().map(move |(i, (_, v))| {
                    let start: f64 = v[..p].iter().sum();
                    let end = start + v[p];
                    let mut bar = Rectangle::new(
                        [
                            (start, SegmentValue::Exact(i)),
                            (end, SegmentValue::Exact(i + 1)),
                        ],
                        c.filled(),
                    );
                    bar.set_margin(4, 4, 0, 0);
                    bar
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
    let ids: Vec<String> = runs.iter().map(|r| r.id.to_string()).collect();
    let _ = write!(
        h,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>iolab report: runs {}</title>\n<style>{CSS}</style>\n</head>\n<body>\n<h1>iolab report: runs {}</h1>\n",
        esc(&ids.join(", ")),
        esc(&ids.join(", "))
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
    for r in runs {
        run_section(&mut h, r);
    }
    h.push_str("</body>\n</html>\n");
    h
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
