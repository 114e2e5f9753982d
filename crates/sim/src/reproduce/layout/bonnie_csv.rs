//! The `bonnie-csv` layout: for each cell, the published bonnie++ 1.03 CSV row (from the
//! figures' published values) above the lab's own row (the cell's native output), as
//! bonnie++ prints them and SEEDS.md gives them, then the figures with their errors.

use std::fmt::Write;

use crate::experiment::Figure;
use crate::workloads::bonnie::{CSV_COLUMNS, FILE_PHASES, PHASES};

use super::super::{CellResult, Experiment};

/// The lab metric of CSV column `i` (`None` for name, size and the file count) and how
/// bonnie++ 1.03 prints it (decimals).
fn column_metric(i: usize) -> Option<(String, usize)> {
    match i {
        2..=13 => {
            let (phase, cpu) = (PHASES[(i - 2) / 2], (i - 2) % 2 == 1);
            Some(match (phase, cpu) {
                (p, true) => (format!("bonnie.{p}_cpu_pct"), 0),
                ("seeks", false) => ("bonnie.seeks_per_s".to_owned(), 1),
                (p, false) => (format!("bonnie.{p}_kps"), 0),
            })
        }
        15..=26 => {
            let (test, cpu) = (FILE_PHASES[(i - 15) / 2], (i - 15) % 2 == 1);
            Some((
                format!("bonnie.{test}_{}", if cpu { "cpu_pct" } else { "per_s" }),
                0,
            ))
        }
        _ => None,
    }
}

/// The published row of a cell: the lab row's columns with every measured column replaced
/// by its figure's published value, empty where none is given; `+++++` / `+++` (a test too
/// fast to time) and the size and file-count columns stay as the lab printed them.
fn published_row(exp: &Experiment, cell: &str, lab_row: &str, figures: &[Figure]) -> String {
    let f = &exp.file;
    let published = |metric: &str| {
        f.figures
            .iter()
            .zip(figures)
            .find(|(s, _)| s.cell == cell && s.metric == metric)
            .and_then(|(_, fig)| fig.published)
    };
    lab_row
        .split(',')
        .enumerate()
        .map(|(i, lab)| match column_metric(i) {
            _ if i == 0 => cell.to_owned(),
            _ if lab.starts_with('+') => lab.to_owned(),
            Some((metric, decimals)) => published(&metric)
                .map(|v| format!("{v:.decimals$}"))
                .unwrap_or_default(),
            None => lab.to_owned(),
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// Renders the layout into `out`.
pub fn render(out: &mut String, exp: &Experiment, results: &[CellResult], figures: &[Figure]) {
    let _ = writeln!(out, "bonnie++ 1.03 CSV ({})", CSV_COLUMNS.join(","));
    for r in results {
        let id = &r.cell.id;
        let _ = writeln!(out, "# {id}");
        // A cell's own output is its CSV rows, one per repetition: the first stands for it.
        let Some(lab) = r.run.report.report_text.lines().next() else {
            continue;
        };
        let lab = lab.split_once(',').map_or(lab, |(_, rest)| rest);
        let lab = format!("{id},{lab}");
        let _ = writeln!(out, "published: {}", published_row(exp, id, &lab, figures));
        let _ = writeln!(out, "lab:       {lab}");
    }
    out.push('\n');
    super::figure_list(out, figures);
}

#[cfg(test)]
mod tests {
    use super::column_metric;

    #[test]
    fn the_columns_map_to_the_lab_metrics_in_bonnies_order() {
        assert_eq!(column_metric(0), None);
        assert_eq!(column_metric(2).unwrap().0, "bonnie.out_char_kps");
        assert_eq!(column_metric(5).unwrap().0, "bonnie.out_block_cpu_pct");
        assert_eq!(
            column_metric(12).unwrap(),
            ("bonnie.seeks_per_s".to_owned(), 1)
        );
        assert_eq!(column_metric(14), None);
        assert_eq!(column_metric(15).unwrap().0, "bonnie.seq_create_per_s");
        assert_eq!(column_metric(26).unwrap().0, "bonnie.ran_delete_cpu_pct");
    }
}
