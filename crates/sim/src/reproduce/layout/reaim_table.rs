//! The `reaim-table` layout: for each cell, re-aim-7's results table with the published row
//! (from the figures' published values) above the lab's for every user count, and the
//! "Max Jobs per Minute" line, as re-aim prints them and SEEDS.md gives them.

use std::fmt::Write;

use crate::experiment::Figure;

use super::super::{CellResult, Experiment};

/// The columns: header, the per-user-count metric's suffix, decimals.
const COLUMNS: [(&str, &str, usize); 5] = [
    ("Parent Time", "parent_time_s", 2),
    ("Child SysTime", "child_sys_s", 2),
    ("Child UTime", "child_user_s", 2),
    ("Jobs per Minute", "jpm", 2),
    ("JTI", "jti", 0),
];

/// The user counts a cell measured, from its `reaim.users{u}.jpm` metrics, ascending.
fn user_counts(r: &CellResult) -> Vec<u64> {
    let mut out: Vec<u64> = r
        .run
        .report
        .measurements
        .first()
        .map(|m| {
            m.metrics
                .iter()
                .filter_map(|x| {
                    x.name
                        .strip_prefix("reaim.users")?
                        .strip_suffix(".jpm")?
                        .parse()
                        .ok()
                })
                .collect()
        })
        .unwrap_or_default();
    out.sort_unstable();
    out
}

/// Renders the layout into `out`.
pub fn render(out: &mut String, exp: &Experiment, results: &[CellResult], figures: &[Figure]) {
    let published = |cell: &str, metric: &str| {
        exp.file
            .figures
            .iter()
            .zip(figures)
            .find(|(s, _)| s.cell == cell && s.metric == metric)
            .and_then(|(_, f)| f.published)
    };
    let cell_text = |v: Option<f64>, decimals: usize| match v {
        Some(v) => format!("{v:.decimals$}"),
        None => "-".to_owned(),
    };
    for r in results {
        let id = &r.cell.id;
        let _ = writeln!(out, "# {id}: re-aim table, published row above the lab's");
        let _ = write!(out, "{:<16}{:>8}", "", "Forked");
        for (header, _, _) in COLUMNS {
            let _ = write!(out, " {header:>16}");
        }
        out.push('\n');
        for u in user_counts(r) {
            for (who, lab) in [("published", false), ("lab", true)] {
                let _ = write!(out, "{who:<16}{u:>8}");
                for (_, suffix, decimals) in COLUMNS {
                    let metric = format!("reaim.users{u}.{suffix}");
                    let v = if lab {
                        r.metric(&metric)
                    } else {
                        published(id, &metric)
                    };
                    let _ = write!(out, " {:>16}", cell_text(v, decimals));
                }
                out.push('\n');
            }
        }
        let _ = writeln!(
            out,
            "max jobs per minute: published {}, lab {}",
            cell_text(published(id, "reaim.max_jpm"), 2),
            cell_text(r.metric("reaim.max_jpm"), 2)
        );
        out.push('\n');
    }
}
