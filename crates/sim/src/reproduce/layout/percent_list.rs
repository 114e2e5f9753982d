//! The `percent-list` layout: one line per effect, its label, the published percent change
//! as the source printed it and the lab's, marking the effects a declared calibration was
//! fitted to — the form of a mailing-list benchmark summary (the pseries-ddw mail:
//! "64 thread write throughput: +203.0%").

use std::fmt::Write;

use crate::experiment::{Effect, Figure, Role};

use super::Experiment;

/// The published change as a source prints it: its own decimals (`+3.43%`, `-2.26%`), one
/// decimal for a whole number (`+203.0%`).
pub(super) fn published_text(pct: f64) -> String {
    if pct.fract() == 0.0 {
        format!("{pct:+.1}%")
    } else {
        format!("{pct:+}%")
    }
}

/// Appends the list: a header, then per effect `label:`, published, lab (two decimals),
/// and `(calibration)` where both of its figures are calibration figures.
pub(super) fn render(out: &mut String, exp: &Experiment, figures: &[Figure], effects: &[Effect]) {
    let role = |id: &str| figures.iter().find(|f| f.id == id).map(|f| f.role);
    let _ = writeln!(out, "{:<34} {:>10} {:>10}", "metric", "published", "lab");
    for (spec, e) in exp.file.effects.iter().zip(effects) {
        let label = format!("{}:", spec.label.as_deref().unwrap_or(&spec.id));
        let calibration = role(&spec.base) == Some(Role::Calibration)
            && role(&spec.new) == Some(Role::Calibration);
        let mark = if calibration { "  (calibration)" } else { "" };
        let _ = writeln!(
            out,
            "{label:<34} {:>10} {:>+9.2}%{mark}",
            published_text(e.published_pct),
            e.lab_pct
        );
    }
}

#[cfg(test)]
mod tests {
    use super::published_text;

    #[test]
    fn published_changes_keep_their_printed_decimals() {
        assert_eq!(published_text(203.0), "+203.0%");
        assert_eq!(published_text(3.43), "+3.43%");
        assert_eq!(published_text(-2.26), "-2.26%");
        assert_eq!(published_text(-23.0), "-23.0%");
        assert_eq!(published_text(17.5), "+17.5%");
    }
}
