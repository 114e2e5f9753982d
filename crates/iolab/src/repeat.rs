//! Repetitions of one experiment (`iolab reproduce --runs N`): every repetition is a stored
//! run of its own, seeds `seed`, `seed + 1`, ..., `seed + N - 1`, in one group; the printed
//! report takes each figure's mean over the repetitions and shows its spread.

use std::fmt::Write as _;

use iolab_sim::experiment::ExperimentReport;
use iolab_sim::metrics::Measurement;
use serde::Serialize;

use crate::compare::{num, Summary};

/// One figure's values over the repetitions.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Spread {
    /// The figure's id.
    pub id: String,
    /// The figure's unit.
    pub unit: String,
    /// The published value, if any.
    pub published: Option<f64>,
    /// Mean over the repetitions.
    pub mean: f64,
    /// Sample standard deviation (divisor n - 1).
    pub sd: f64,
    /// The smallest value.
    pub min: f64,
    /// The largest value.
    pub max: f64,
}

/// The report of `reports` (repetitions of one experiment, at least one, each with the same
/// figures and effects in the same order): each figure's and effect's lab value is its mean
/// over the repetitions, `runs` their number; the text, notes and measurements are the
/// first repetition's.
pub fn mean_report(reports: &[ExperimentReport]) -> ExperimentReport {
    let mut out = reports[0].clone();
    out.runs = reports.len() as u32;
    let n = reports.len() as f64;
    for (i, f) in out.figures.iter_mut().enumerate() {
        f.lab = reports.iter().map(|r| r.figures[i].lab).sum::<f64>() / n;
    }
    for (i, e) in out.effects.iter_mut().enumerate() {
        e.lab_pct = reports.iter().map(|r| r.effects[i].lab_pct).sum::<f64>() / n;
    }
    out
}

/// Each figure's mean, standard deviation, minimum and maximum over `reports`.
pub fn spreads(reports: &[ExperimentReport]) -> Vec<Spread> {
    reports[0]
        .figures
        .iter()
        .enumerate()
        .map(|(i, f)| {
            let values: Vec<f64> = reports.iter().map(|r| r.figures[i].lab).collect();
            let s = Summary::of(&values);
            Spread {
                id: f.id.clone(),
                unit: f.unit.clone(),
                published: f.published,
                mean: s.mean,
                // A spread below 1e-12 of the mean is floating-point rounding.
                sd: s.sd.filter(|&sd| sd > 1e-12 * s.mean.abs()).unwrap_or(0.0),
                min: values.iter().copied().fold(f64::INFINITY, f64::min),
                max: values.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            }
        })
        .collect()
}

/// Whether every repetition gave exactly the figures of the first.
pub fn identical(reports: &[ExperimentReport]) -> bool {
    let bits = |r: &ExperimentReport| {
        r.figures
            .iter()
            .map(|f| f.lab.to_bits())
            .collect::<Vec<_>>()
    };
    let first = bits(&reports[0]);
    reports[1..].iter().all(|r| bits(r) == first)
}

/// The table of figures over `reports` (repetitions from seed `seed` on): `mean ± sd`,
/// min and max per figure, and a line saying when the repetitions were identical.
pub fn render_spread(reports: &[ExperimentReport], seed: u64) -> String {
    let n = reports.len();
    let last = seed.wrapping_add(n as u64 - 1);
    let mut out = format!("figures over {n} repetitions (seeds {seed}..={last}): mean ± sd\n");
    let rows: Vec<[String; 5]> = spreads(reports)
        .iter()
        .map(|s| {
            [
                s.id.clone(),
                s.published
                    .map_or_else(|| "-".to_owned(), |p| num(p, &s.unit)),
                mean_sd(s.mean, s.sd, &s.unit),
                num(s.min, &s.unit),
                num(s.max, &s.unit),
            ]
        })
        .collect();
    let header = ["figure", "published", "lab mean ± sd", "min", "max"].map(str::to_owned);
    let rows: Vec<[String; 5]> = std::iter::once(header).chain(rows).collect();
    table(&mut out, &rows, 1);
    if n > 1 && identical(reports) {
        let _ = writeln!(out, "{}", identical_note(n));
    }
    out
}

/// The workloads' own figures, always shown in [`render_metric_spread`]; the lab's other
/// metrics (`dma.*`, `cmdq.*`, `iotlb.*` ...) are shown when they vary.
const HEADLINE: [&str; 7] = [
    "read.", "write.", "cpu.", "net.", "bonnie.", "reaim.", "netperf.",
];

/// What [`metric_spread`] found.
pub struct MetricSpread {
    /// `[configuration, metric, "mean ± sd", min, max]`, the values with their units.
    pub rows: Vec<[String; 5]>,
    /// Metrics left out: not headline figures and the same in every repetition.
    pub hidden: usize,
    /// Whether every repetition gave exactly the same metrics.
    pub identical: bool,
}

/// Configurations' metrics over repetitions (`runs[i]` the measurements of repetition i):
/// `mean ± sd`, min and max of the workload's own figures ([`HEADLINE`]) and of any other
/// metric that varies.
pub fn metric_spread(runs: &[&[Measurement]]) -> MetricSpread {
    let n = runs.len();
    let mut out = MetricSpread {
        rows: Vec::new(),
        hidden: 0,
        identical: true,
    };
    for m in runs[0] {
        for x in &m.metrics {
            let values: Vec<f64> = runs
                .iter()
                .filter_map(|ms| ms.iter().find(|o| o.config == m.config))
                .filter_map(|o| o.metrics.iter().find(|y| y.name == x.name))
                .map(|y| y.value)
                .collect();
            let same = values.len() == n && values.iter().all(|v| v.to_bits() == x.value.to_bits());
            out.identical &= same;
            if same && !HEADLINE.iter().any(|h| x.name.starts_with(h)) {
                out.hidden += 1;
                continue;
            }
            let s = Summary::of(&values);
            let sd = s.sd.filter(|&sd| sd > 1e-12 * s.mean.abs()).unwrap_or(0.0);
            let min = values.iter().copied().fold(f64::INFINITY, f64::min);
            let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            out.rows.push([
                m.config.clone(),
                x.name.clone(),
                mean_sd(s.mean, sd, &x.unit),
                num(min, &x.unit),
                num(max, &x.unit),
            ]);
        }
    }
    out
}

/// The note for `n` repetitions that gave identical figures.
pub fn identical_note(n: usize) -> String {
    format!(
        "note: the {n} runs gave identical figures: the seed drives the lab's random draws \
         (offsets, jitter, service times), and nothing this configuration measures depends on \
         them, so it is deterministic and its repetitions show no run-to-run variance"
    )
}

/// The table of [`metric_spread`] over repetitions from seed `seed`, and a line saying when
/// the repetitions were identical.
pub fn render_metric_spread(runs: &[&[Measurement]], seed: u64) -> String {
    let n = runs.len();
    let last = seed.wrapping_add(n as u64 - 1);
    let mut out = format!("over {n} repetitions (seeds {seed}..={last}): mean ± sd\n");
    let spread = metric_spread(runs);
    let header = ["configuration", "metric", "lab mean ± sd", "min", "max"].map(str::to_owned);
    let rows: Vec<[String; 5]> = std::iter::once(header).chain(spread.rows).collect();
    table(&mut out, &rows, 2);
    if spread.hidden > 0 {
        let _ = writeln!(
            out,
            "({} other metrics were the same in every repetition; \
             `iolab compare gID ...` shows them all)",
            spread.hidden
        );
    }
    if n > 1 && spread.identical {
        let _ = writeln!(out, "{}", identical_note(n));
    }
    out
}

/// Writes `rows` (the first the header) as aligned columns, the first `names` left-aligned.
fn table(out: &mut String, rows: &[[String; 5]], names: usize) {
    let mut width = [0usize; 5];
    for r in rows {
        for (w, c) in width.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    for r in rows {
        let mut line = String::new();
        for (i, (c, w)) in r.iter().zip(width).enumerate() {
            let pad = " ".repeat(w - c.chars().count());
            if i < names {
                let _ = write!(line, "{c}{pad}  ");
            } else {
                let _ = write!(line, "{pad}{c}  ");
            }
        }
        let _ = writeln!(out, "{}", line.trim_end());
    }
}

/// `mean ± sd` as the tables print them. A spread that would print in scientific notation
/// and is below a thousandth of the mean (below the four significant digits the mean shows)
/// reads `± <0.1%` rather than a bare `6.145e-4` without its unit.
fn mean_sd(mean: f64, sd: f64, unit: &str) -> String {
    let spread = num(sd, unit);
    if spread.contains('e') && sd < 1e-3 * mean.abs() {
        format!("{} ± <0.1%", num(mean, unit))
    } else {
        format!("{} ± {spread}", num(mean, unit))
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_spread_too_small_for_the_means_digits_reads_as_a_bound() {
        assert_eq!(super::mean_sd(75.23, 1.179e-5, "ns"), "75.23 ns ± <0.1%");
        assert_eq!(super::mean_sd(19_686.0, 1.0, "count"), "19,686 ± 1");
        assert_eq!(super::mean_sd(85.38, 0.0, "ns"), "85.38 ns ± 0");
    }

    use super::*;
    use iolab_sim::experiment::{Effect, Figure, Role};
    use iolab_sim::metrics::Metric;

    fn report(values: &[f64], effect: f64) -> ExperimentReport {
        ExperimentReport {
            name: "x".into(),
            title: "t".into(),
            runs: 1,
            figures: values
                .iter()
                .enumerate()
                .map(|(i, &v)| Figure {
                    id: format!("f{i}"),
                    unit: "IOPS".into(),
                    published: Some(100.0),
                    lab: v,
                    role: Role::Prediction,
                })
                .collect(),
            effects: vec![Effect {
                id: "e".into(),
                published_pct: 10.0,
                lab_pct: effect,
            }],
            calibrated: Vec::new(),
            report_text: String::new(),
            notes: Vec::new(),
            measurements: Vec::new(),
        }
    }

    #[test]
    fn the_mean_report_averages_figures_and_effects_and_counts_the_repetitions() {
        let reps = [report(&[100.0, 10.0], 4.0), report(&[110.0, 10.0], 8.0)];
        let m = mean_report(&reps);
        assert_eq!(m.runs, 2);
        assert_eq!(m.figures[0].lab, 105.0);
        assert_eq!(m.figures[1].lab, 10.0);
        assert_eq!(m.effects[0].lab_pct, 6.0);
        let s = spreads(&reps);
        assert_eq!((s[0].min, s[0].max), (100.0, 110.0));
        assert!((s[0].sd - 50f64.sqrt()).abs() < 1e-12);
        assert_eq!(s[1].sd, 0.0);
        assert!(!identical(&reps));
    }

    #[test]
    fn metric_spread_per_configuration_says_when_repetitions_were_identical() {
        let m = |v: f64| vec![Measurement::new("c").metric(Metric::new("read.iops", "IOPS", v))];
        let (a, b, c) = (m(100.0), m(110.0), m(100.0));
        let text = render_metric_spread(&[&a, &b], 3);
        assert!(text.contains("seeds 3..=4"), "{text}");
        assert!(text.contains("105 ± 7.071"), "{text}");
        assert!(!text.contains("identical"), "{text}");
        let same = render_metric_spread(&[&a, &c], 3);
        assert!(same.contains("100 ± 0"), "{same}");
        assert!(same.contains("runs gave identical figures"), "{same}");
    }

    #[test]
    fn identical_repetitions_are_said_so() {
        let reps = [report(&[100.0], 4.0), report(&[100.0], 4.0)];
        let text = render_spread(&reps, 7);
        assert!(text.contains("seeds 7..=8"), "{text}");
        assert!(text.contains("identical figures"), "{text}");
        let differ = [report(&[100.0], 4.0), report(&[101.0], 4.0)];
        assert!(!render_spread(&differ, 1).contains("identical"));
    }
}
