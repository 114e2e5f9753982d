//! How an experiment's report is printed: the layouts of docs/EXPERIMENTS.md, metric
//! tables, each cell's own tool output, and notes with placeholders.

mod percent_list;

use std::fmt::Write;

use crate::experiment::{figure_value_text, Effect, Figure};

use super::{CellResult, Experiment};

mod bonnie_csv;
mod reaim_table;

/// The report text (without effects, fidelity, calibrations and notes, which every
/// report prints the same way after it).
pub fn render(
    exp: &Experiment,
    results: &[CellResult],
    figures: &[Figure],
    effects: &[Effect],
    runs: u32,
) -> String {
    let f = &exp.file;
    let mut out = String::new();
    if let Some(s) = &f.summary {
        let _ = writeln!(out, "{s}");
    }
    let source = if exp.origin().ends_with("(bundled)") {
        f.experiment.as_str()
    } else {
        exp.origin()
    };
    let _ = writeln!(
        out,
        "lab: {runs} run(s) per cell, {} cells, each a lab scenario (`iolab reproduce {source} --emit-scenarios DIR` writes them)",
        results.len(),
    );
    out.push('\n');
    if let Some(h) = &f.report.heading {
        let _ = writeln!(out, "{h}");
    }
    match f.report.layout.as_deref().unwrap_or("figures") {
        "pivot" => pivot(&mut out, exp, results, figures),
        "percent-list" => percent_list::render(&mut out, exp, figures, effects),
        "bonnie-csv" => bonnie_csv::render(&mut out, exp, results, figures),
        "reaim-table" => reaim_table::render(&mut out, exp, results, figures),
        // Only the metric tables below.
        "tables" => {}
        _ => figure_list(&mut out, figures),
    }
    for (k, t) in f.report.tables.iter().enumerate() {
        if k > 0 || f.report.layout.as_deref() != Some("tables") {
            out.push('\n');
        }
        let width = results
            .iter()
            .map(|r| r.cell.id.len())
            .max()
            .unwrap_or(0)
            .max(t.heading.len());
        let _ = write!(out, "{:<width$}", t.heading);
        for c in &t.columns {
            let _ = write!(out, " {:>12}", c.header);
        }
        out.push('\n');
        for r in results {
            let _ = write!(out, "{:<width$}", r.cell.id);
            for c in &t.columns {
                let text = match (r.metric(&c.metric), &c.vs) {
                    (None, _) => "-".to_owned(),
                    (Some(v), Some(vs)) => vs_text(exp, results, r, &c.metric, vs, v),
                    (Some(v), None) => {
                        let v = v * c.scale.unwrap_or(1.0);
                        match c.decimals {
                            Some(d) => format!("{v:.d$}"),
                            None => figure_value_text(v),
                        }
                    }
                };
                let _ = write!(out, " {text:>12}");
            }
            out.push('\n');
        }
    }
    if f.report.native {
        out.push('\n');
        for r in results {
            let _ = writeln!(out, "[{}]", r.cell.id);
            let _ = writeln!(out, "{}", r.run.report.report_text.trim_end());
        }
    }
    out
}

/// The percent change of `metric` (`v` in `r`) against the cell of `r`'s row in column
/// `vs`; `-` when the row does not run that column or its value is zero.
fn vs_text(
    exp: &Experiment,
    results: &[CellResult],
    r: &CellResult,
    metric: &str,
    vs: &str,
    v: f64,
) -> String {
    let col = exp.file.columns.iter().position(|c| c.id == vs);
    let base = results
        .iter()
        .find(|b| b.cell.row == r.cell.row && b.cell.column.is_some() && b.cell.column == col)
        .and_then(|b| b.metric(metric));
    match base {
        Some(b) if b != 0.0 => format!("{:+.1}%", (v - b) / b * 100.0),
        _ => "-".to_owned(),
    }
}

/// A value for a table cell: millions and thousands with a suffix, smaller values as
/// figures are printed.
fn compact(v: f64) -> String {
    if v.abs() >= 1e6 {
        format!("{:.2}M", v / 1e6)
    } else if v.abs() >= 1e4 {
        format!("{:.0}K", v / 1e3)
    } else {
        figure_value_text(v)
    }
}

fn pivot(out: &mut String, exp: &Experiment, results: &[CellResult], figures: &[Figure]) {
    let f = &exp.file;
    let metric = f.report.metric.as_deref().unwrap_or_default();
    let _ = write!(out, "| |");
    for c in &f.columns {
        let _ = write!(out, " {} |", c.label.as_deref().unwrap_or(&c.id));
    }
    out.push('\n');
    let _ = writeln!(out, "|---|{}", "---|".repeat(f.columns.len()));
    for row in &f.rows {
        let _ = write!(out, "| {} |", row.label.as_deref().unwrap_or(&row.id));
        for c in &f.columns {
            let id = format!("{}.{}", row.id, c.id);
            let lab = results
                .iter()
                .find(|r| r.cell.id == id)
                .and_then(|r| r.metric(metric));
            // The published value of the figure that shows this cell's pivot metric.
            let published = f
                .figures
                .iter()
                .zip(figures)
                .find(|(s, _)| s.cell == id && s.metric == metric)
                .and_then(|(_, fig)| fig.published);
            let text = match (lab, published) {
                (None, _) => "-".to_owned(),
                (Some(l), Some(p)) => format!("{} ({})", compact(l), compact(p)),
                (Some(l), None) => compact(l),
            };
            let _ = write!(out, " {text} |");
        }
        out.push('\n');
    }
}

fn figure_list(out: &mut String, figures: &[Figure]) {
    let width = figures.iter().map(|f| f.id.len()).max().unwrap_or(6).max(6);
    let _ = writeln!(
        out,
        "{:<width$} {:<10} {:>12} {:>12} {:>9}  role",
        "figure", "unit", "lab", "published", "error"
    );
    for f in figures {
        let _ = writeln!(
            out,
            "{:<width$} {:<10} {:>12} {:>12} {:>9}  {}",
            f.id,
            f.unit,
            figure_value_text(f.lab),
            f.published
                .map_or_else(|| "-".to_owned(), figure_value_text),
            f.error_pct()
                .map_or_else(|| "-".to_owned(), |e| format!("{e:+.1}%")),
            f.role
        );
    }
}

/// A note with its placeholders filled: `{fig:ID}` the lab value of figure ID, `{pub:ID}`
/// its published value (`-` when none), `{eff:ID}` the lab percent change of effect ID.
pub fn fill_note(note: &str, figures: &[Figure], effects: &[Effect]) -> String {
    let mut out = String::new();
    let mut rest = note;
    while let Some(open) = rest.find('{') {
        let Some(close) = rest[open..].find('}') else {
            break;
        };
        out.push_str(&rest[..open]);
        let key = &rest[open + 1..open + close];
        let fig = |id: &str| figures.iter().find(|f| f.id == id);
        let text = match key.split_once(':') {
            Some(("fig", id)) => fig(id).map(|f| figure_value_text(f.lab)),
            Some(("pub", id)) => fig(id).map(|f| {
                f.published
                    .map_or_else(|| "-".to_owned(), figure_value_text)
            }),
            Some(("eff", id)) => effects
                .iter()
                .find(|e| e.id == id)
                .map(|e| format!("{:+.1}%", e.lab_pct)),
            _ => None,
        };
        out.push_str(&text.unwrap_or_else(|| format!("{{{key}}}")));
        rest = &rest[open + close + 1..];
    }
    out.push_str(rest);
    out
}
