//! Published experiments re-run in the lab: the common shape of their results.
//!
//! Each experiment (see ../shared/SEEDS.md) runs one or more scenarios and reports:
//! - its own *report text*, in the format the original report used (bonnie++ CSV rows, an
//!   IOPS table, a re-aim table, a percent list), with the published figure beside each lab
//!   figure;
//! - *figures*: every absolute number, with its published value, whether it was a
//!   calibration point (a declared parameter was fitted against it) or a prediction;
//! - *effects*: percent changes of one configuration over another, published and lab.
//!
//! Published figures are yardsticks, never inputs: an experiment may fit only the parameters
//! it declares in [`ExperimentReport::calibrated`], against the figures it marks
//! [`Role::Calibration`]; everything else is a prediction of the model.

use std::fmt;

use serde::Serialize;

/// Whether a published figure was used to fit a declared parameter, or predicted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// A declared parameter was fitted so the lab reproduces this figure.
    Calibration,
    /// The model's output: nothing was fitted to it.
    Prediction,
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::Calibration => "calibration",
            Role::Prediction => "prediction",
        })
    }
}

/// One absolute figure: published and lab values in one unit.
///
/// Serialised with its fields in declaration order followed by `within_goal`
/// ([`figure_within_goal`]: `true`/`false` for a prediction with a published value, `null`
/// otherwise).
#[derive(Clone, Debug, PartialEq)]
pub struct Figure {
    /// Stable id, e.g. `superspeed.iommu.out_block`.
    pub id: String,
    /// Unit, e.g. `K/s`, `IOPS`, `jobs/min`, `%CPU`.
    pub unit: String,
    /// The published value, if the report gave one.
    pub published: Option<f64>,
    /// The lab's value (mean over runs).
    pub lab: f64,
    /// Calibration point or prediction.
    pub role: Role,
}

impl Figure {
    /// Lab relative to published, in percent (`None` without a published value or when it
    /// is zero).
    pub fn error_pct(&self) -> Option<f64> {
        let p = self.published?;
        (p != 0.0).then(|| (self.lab - p) / p * 100.0)
    }
}

/// A percent change of one configuration over another.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Effect {
    /// Stable id, e.g. `superspeed.out_block` or `d05_nvme.lockfree_vs_spinlock`.
    pub id: String,
    /// The published percent change.
    pub published_pct: f64,
    /// The lab's percent change.
    pub lab_pct: f64,
}

/// Whether an effect meets the project's fidelity goal: same sign, and within +-35% of the
/// published change where that is 10% or more, within 3 percentage points where smaller.
pub fn effect_within_goal(e: &Effect) -> bool {
    let sign_ok = (e.published_pct >= 0.0) == (e.lab_pct >= 0.0);
    let magnitude_ok = if e.published_pct.abs() >= 10.0 {
        (e.lab_pct - e.published_pct).abs() <= 0.35 * e.published_pct.abs()
    } else {
        (e.lab_pct - e.published_pct).abs() <= 3.0
    };
    sign_ok && magnitude_ok
}

impl Serialize for Figure {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        // Destructured without `..`: a new field fails to compile until it is serialised.
        let Figure {
            id,
            unit,
            published,
            lab,
            role,
        } = self;
        let mut s = serializer.serialize_struct("Figure", 6)?;
        s.serialize_field("id", id)?;
        s.serialize_field("unit", unit)?;
        s.serialize_field("published", published)?;
        s.serialize_field("lab", lab)?;
        s.serialize_field("role", role)?;
        s.serialize_field("within_goal", &figure_within_goal(self))?;
        s.end()
    }
}

/// The fidelity goal for predicted absolute figures: within this many percent of the
/// published value.
pub const FIGURE_GOAL_PCT: f64 = 25.0;

/// Whether a predicted absolute figure meets the fidelity goal: `|lab - published|` at most
/// [`FIGURE_GOAL_PCT`] percent of `|published|` (so a published zero asks for exactly zero).
/// `None` for a calibration figure (fitted, so not a test of the model) and for a figure
/// without a published value.
pub fn figure_within_goal(f: &Figure) -> Option<bool> {
    if f.role != Role::Prediction {
        return None;
    }
    let p = f.published?;
    Some((f.lab - p).abs() <= FIGURE_GOAL_PCT / 100.0 * p.abs())
}

/// How many of a report's checked items meet their fidelity goal.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct GoalCount {
    /// Items within the goal.
    pub met: usize,
    /// Items checked against the goal.
    pub total: usize,
}

/// A report's standing against the project's two fidelity goals (issue 5): every effect
/// ([`effect_within_goal`]) and every predicted figure with a published value
/// ([`figure_within_goal`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Fidelity {
    /// Effects within the effect goal, of all effects.
    pub effects: GoalCount,
    /// Predicted figures within +-25% of published, of the predictions with a published
    /// value (calibration figures and figures without one are not counted).
    pub predicted_figures: GoalCount,
}

/// A parameter fitted against a published figure.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Calibrated {
    /// The scenario field, e.g. `usb.per_transfer_overhead_ns`.
    pub parameter: String,
    /// The value the scenario uses.
    pub value: f64,
    /// The figure id(s) it was fitted against.
    pub fitted_to: Vec<String>,
    /// A declared unknown's range (the tool fitted the value within it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub range: Option<[f64; 2]>,
    /// A declared unknown's identifiability at the fit (`identified`, `flat`, `plateau`,
    /// `at-lower-bound`, `at-upper-bound`; with `, confounded with ...` when another
    /// unknown moves its figures alike).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub identifiability: Option<String>,
}

/// What one experiment produced.
///
/// Serialised with its fields in declaration order (without `report_text`, and without
/// `measurements` when empty), with `fidelity` ([`ExperimentReport::fidelity`]) after
/// `effects`.
#[derive(Clone, Debug, PartialEq)]
pub struct ExperimentReport {
    /// `ipmmu-usb`, `smmuv3-cmdq`, `sba-vmerge` or `pseries-ddw`.
    pub name: String,
    /// One line saying what was re-run.
    pub title: String,
    /// Runs averaged per configuration.
    pub runs: u32,
    /// Absolute figures.
    pub figures: Vec<Figure>,
    /// Percent effects.
    pub effects: Vec<Effect>,
    /// Parameters fitted against published figures.
    pub calibrated: Vec<Calibrated>,
    /// The report in the original format, published beside lab values.
    pub report_text: String,
    /// Plain statements of what the lab does not (yet) reach, and why.
    pub notes: Vec<String>,
    /// Every measured configuration, with its metrics, latencies and CPU time (for the
    /// results database, `iolab compare` and `iolab report`).
    pub measurements: Vec<crate::metrics::Measurement>,
}

impl ExperimentReport {
    /// Counts the effects and predicted figures that meet the fidelity goals.
    pub fn fidelity(&self) -> Fidelity {
        let checked: Vec<bool> = self.figures.iter().filter_map(figure_within_goal).collect();
        Fidelity {
            effects: GoalCount {
                met: self
                    .effects
                    .iter()
                    .filter(|e| effect_within_goal(e))
                    .count(),
                total: self.effects.len(),
            },
            predicted_figures: GoalCount {
                met: checked.iter().filter(|&&met| met).count(),
                total: checked.len(),
            },
        }
    }
}

impl Serialize for ExperimentReport {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        // Destructured without `..`: a new field fails to compile until it is serialised
        // (or deliberately left out, as the report text is).
        let ExperimentReport {
            name,
            title,
            runs,
            figures,
            effects,
            calibrated,
            report_text: _,
            notes,
            measurements,
        } = self;
        let mut s = serializer.serialize_struct("ExperimentReport", 9)?;
        s.serialize_field("name", name)?;
        s.serialize_field("title", title)?;
        s.serialize_field("runs", runs)?;
        s.serialize_field("figures", figures)?;
        s.serialize_field("effects", effects)?;
        s.serialize_field("fidelity", &self.fidelity())?;
        s.serialize_field("calibrated", calibrated)?;
        s.serialize_field("notes", notes)?;
        if measurements.is_empty() {
            s.skip_field("measurements")?;
        } else {
            s.serialize_field("measurements", measurements)?;
        }
        s.end()
    }
}

/// Options every experiment takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExperimentOptions {
    /// Repetitions per configuration (different seeds derived from `seed`).
    pub runs: u32,
    /// Base seed.
    pub seed: u64,
}

impl Default for ExperimentOptions {
    fn default() -> Self {
        Self { runs: 1, seed: 1 }
    }
}

/// Renders the effects of a report as a table (for the text output).
pub fn render_effects(report: &ExperimentReport) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    if report.effects.is_empty() {
        return out;
    }
    let _ = writeln!(
        out,
        "{:<36} {:>11} {:>9} {:>8}",
        "effect", "published", "lab", "goal"
    );
    for e in &report.effects {
        let _ = writeln!(
            out,
            "{:<36} {:>+10.1}% {:>+8.1}% {:>8}",
            e.id,
            e.published_pct,
            e.lab_pct,
            if effect_within_goal(e) {
                "met"
            } else {
                "MISSED"
            }
        );
    }
    out
}

/// A figure's value for the text tables: whole numbers from 10,000 up (IOPS, K/s), one
/// decimal from 1 (seeks/s, %CPU), three below.
pub(crate) fn figure_value_text(v: f64) -> String {
    if v.abs() >= 10_000.0 {
        format!("{v:.0}")
    } else if v.abs() >= 1.0 || v == 0.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.3}")
    }
}

/// Renders a report's standing against the predicted-figure goal (for the text output): one
/// line with the count of predictions within +-25% of their published value (saying how
/// many calibration figures and predictions without a published value were not counted),
/// then a table of the misses only.
pub fn render_figure_goals(report: &ExperimentReport) -> String {
    use std::fmt::Write;
    let goal = report.fidelity().predicted_figures;
    let calibration = report
        .figures
        .iter()
        .filter(|f| f.role == Role::Calibration)
        .count();
    let unpublished = report
        .figures
        .iter()
        .filter(|f| f.role == Role::Prediction && f.published.is_none())
        .count();
    let mut not_counted = Vec::new();
    if calibration > 0 {
        not_counted.push(format!(
            "{calibration} calibration figure{} not counted",
            if calibration == 1 { "" } else { "s" }
        ));
    }
    if unpublished > 0 {
        not_counted.push(format!(
            "{unpublished} prediction{} without a published value",
            if unpublished == 1 { "" } else { "s" }
        ));
    }
    let verdict = if goal.total == 0 {
        ", none to check"
    } else if goal.met == goal.total {
        ", all met"
    } else {
        ""
    };
    let mut out = format!(
        "predicted figures within +-{FIGURE_GOAL_PCT:.0}% of published: {} of {}{verdict}",
        goal.met, goal.total
    );
    if !not_counted.is_empty() {
        let _ = write!(out, " ({})", not_counted.join(", "));
    }
    out.push('\n');
    let missed: Vec<&Figure> = report
        .figures
        .iter()
        .filter(|f| figure_within_goal(f) == Some(false))
        .collect();
    if missed.is_empty() {
        return out;
    }
    let _ = writeln!(
        out,
        "{:<36} {:<8} {:>11} {:>11} {:>14} {:>8}",
        "figure", "unit", "published", "lab", "vs published", "goal"
    );
    for f in missed {
        let vs = f
            .error_pct()
            .map_or_else(|| "-".to_owned(), |e| format!("{e:+.1}%"));
        let _ = writeln!(
            out,
            "{:<36} {:<8} {:>11} {:>11} {:>14} {:>8}",
            f.id,
            f.unit,
            f.published
                .map_or_else(|| "-".to_owned(), figure_value_text),
            figure_value_text(f.lab),
            vs,
            "MISSED"
        );
    }
    out
}

/// Renders one line per report with its counts against both fidelity goals (for the end of
/// a text run over several experiments).
pub fn render_fidelity_summary(reports: &[ExperimentReport]) -> String {
    use std::fmt::Write;
    let width = reports.iter().map(|r| r.name.len()).max().unwrap_or(0);
    let mut out = format!(
        "fidelity goals met (effects: sign and magnitude; predicted figures: within +-{FIGURE_GOAL_PCT:.0}% of published)\n"
    );
    for r in reports {
        let f = r.fidelity();
        let _ = writeln!(
            out,
            "{:<width$}  effects {} of {}, predicted figures {} of {}",
            r.name,
            f.effects.met,
            f.effects.total,
            f.predicted_figures.met,
            f.predicted_figures.total
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn effect(published: f64, lab: f64) -> Effect {
        Effect {
            id: "x".into(),
            published_pct: published,
            lab_pct: lab,
        }
    }

    #[test]
    fn large_effects_need_the_same_sign_and_35_percent() {
        assert!(effect_within_goal(&effect(20.0, 26.9)));
        assert!(!effect_within_goal(&effect(20.0, 27.1)));
        assert!(!effect_within_goal(&effect(-20.0, 20.0)));
    }

    #[test]
    fn small_effects_need_three_points() {
        assert!(effect_within_goal(&effect(4.0, 6.9)));
        assert!(!effect_within_goal(&effect(4.0, 7.1)));
        assert!(!effect_within_goal(&effect(-4.0, 1.5)));
    }

    #[test]
    fn figure_error_is_relative_to_published() {
        let f = Figure {
            id: "a".into(),
            unit: "IOPS".into(),
            published: Some(200.0),
            lab: 150.0,
            role: Role::Prediction,
        };
        assert_eq!(f.error_pct(), Some(-25.0));
        assert_eq!(figure_within_goal(&f), Some(true));
    }

    fn figure(id: &str, unit: &str, published: Option<f64>, lab: f64, role: Role) -> Figure {
        Figure {
            id: id.into(),
            unit: unit.into(),
            published,
            lab,
            role,
        }
    }

    fn report(figures: Vec<Figure>, effects: Vec<Effect>) -> ExperimentReport {
        ExperimentReport {
            name: "x".into(),
            title: "t".into(),
            runs: 1,
            figures,
            effects,
            calibrated: Vec::new(),
            report_text: "text".into(),
            notes: Vec::new(),
            measurements: Vec::new(),
        }
    }

    /// Figures covering every case of the goal: met, missed both ways, exactly at both
    /// bounds, a calibration figure off by far, a prediction without a published value.
    fn mixed_figures() -> Vec<Figure> {
        vec![
            figure("met", "IOPS", Some(770_000.0), 800_000.0, Role::Prediction),
            figure("low", "%CPU", Some(4.0), 2.2, Role::Prediction),
            figure("at_minus", "IOPS", Some(200.0), 150.0, Role::Prediction),
            figure("at_plus", "K/s", Some(80.0), 100.0, Role::Prediction),
            figure("high", "seeks/s", Some(2133.3), 3772.5, Role::Prediction),
            figure("cal", "K/s", Some(82_598.0), 10.0, Role::Calibration),
            figure("unpub", "Gb/s", None, 94.0, Role::Prediction),
        ]
    }

    #[test]
    fn figure_goal_is_25_percent_of_published_inclusive_for_predictions_only() {
        let p = |published, lab| figure("f", "u", published, lab, Role::Prediction);
        assert_eq!(figure_within_goal(&p(Some(200.0), 150.0)), Some(true));
        assert_eq!(figure_within_goal(&p(Some(200.0), 250.0)), Some(true));
        assert_eq!(figure_within_goal(&p(Some(200.0), 149.9)), Some(false));
        assert_eq!(figure_within_goal(&p(Some(200.0), 250.1)), Some(false));
        assert_eq!(figure_within_goal(&p(Some(-200.0), -150.0)), Some(true));
        assert_eq!(figure_within_goal(&p(Some(0.0), 0.0)), Some(true));
        assert_eq!(figure_within_goal(&p(Some(0.0), 0.1)), Some(false));
        assert_eq!(figure_within_goal(&p(None, 150.0)), None);
        let cal = figure("c", "u", Some(200.0), 1.0, Role::Calibration);
        assert_eq!(figure_within_goal(&cal), None);
    }

    #[test]
    fn fidelity_counts_effects_and_only_published_predictions() {
        let r = report(
            mixed_figures(),
            vec![effect(20.0, 26.9), effect(20.0, 27.1), effect(4.0, 6.9)],
        );
        assert_eq!(
            r.fidelity(),
            Fidelity {
                effects: GoalCount { met: 2, total: 3 },
                predicted_figures: GoalCount { met: 3, total: 5 },
            }
        );
        assert_eq!(
            report(Vec::new(), Vec::new()).fidelity(),
            Fidelity {
                effects: GoalCount { met: 0, total: 0 },
                predicted_figures: GoalCount { met: 0, total: 0 },
            }
        );
    }

    #[test]
    fn figure_goals_list_the_misses_only_with_readable_numbers() {
        let text = render_figure_goals(&report(mixed_figures(), Vec::new()));
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "predicted figures within +-25% of published: 3 of 5 \
             (1 calibration figure not counted, 1 prediction without a published value)"
        );
        assert_eq!(lines.len(), 4, "{text}");
        assert!(lines[1].starts_with("figure ") && lines[1].ends_with("goal"));
        let low: Vec<&str> = lines[2].split_whitespace().collect();
        assert_eq!(low, ["low", "%CPU", "4.0", "2.2", "-45.0%", "MISSED"]);
        let high: Vec<&str> = lines[3].split_whitespace().collect();
        assert_eq!(
            high,
            ["high", "seeks/s", "2133.3", "3772.5", "+76.8%", "MISSED"]
        );
        // The columns line up under the header.
        let goal_col = lines[1].len();
        assert!(lines[2..].iter().all(|l| l.len() == goal_col), "{text}");
    }

    #[test]
    fn figure_goals_say_all_met_or_none_to_check_without_a_table() {
        let met = vec![
            figure("a", "IOPS", Some(770_000.0), 770_080.0, Role::Prediction),
            figure("b", "IOPS", Some(839_000.0), 773_000.0, Role::Calibration),
            figure("c", "IOPS", Some(839_000.0), 773_000.0, Role::Calibration),
        ];
        assert_eq!(
            render_figure_goals(&report(met, Vec::new())),
            "predicted figures within +-25% of published: 1 of 1, all met \
             (2 calibration figures not counted)\n"
        );
        let unpublished = vec![figure("a", "us", None, 36.5, Role::Prediction)];
        assert_eq!(
            render_figure_goals(&report(unpublished, Vec::new())),
            "predicted figures within +-25% of published: 0 of 0, none to check \
             (1 prediction without a published value)\n"
        );
    }

    #[test]
    fn figure_values_keep_large_and_small_numbers_readable() {
        assert_eq!(figure_value_text(770_080.4), "770080");
        assert_eq!(figure_value_text(82_598.0), "82598");
        assert_eq!(figure_value_text(2133.3), "2133.3");
        assert_eq!(figure_value_text(4.0), "4.0");
        assert_eq!(figure_value_text(0.0), "0.0");
        assert_eq!(figure_value_text(0.0425), "0.043");
    }

    #[test]
    fn the_summary_has_one_line_per_report_with_both_counts() {
        let mut a = report(mixed_figures(), vec![effect(20.0, 26.9), effect(4.0, 9.0)]);
        a.name = "ipmmu-usb".into();
        let mut b = report(Vec::new(), Vec::new());
        b.name = "pseries-ddw".into();
        let text = render_fidelity_summary(&[a, b]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert_eq!(
            lines[1],
            "ipmmu-usb    effects 1 of 2, predicted figures 3 of 5"
        );
        assert_eq!(
            lines[2],
            "pseries-ddw  effects 0 of 0, predicted figures 0 of 0"
        );
    }

    #[test]
    fn json_adds_within_goal_per_figure_and_fidelity_after_effects() {
        let r = report(mixed_figures(), vec![effect(20.0, 26.9)]);
        // serde_json's Value sorts keys: the order is checked on the text itself.
        let text = serde_json::to_string(&r).unwrap();
        let at = |key: &str| text.find(&format!("\"{key}\":")).unwrap_or(usize::MAX);
        let order = [
            "name",
            "title",
            "runs",
            "figures",
            "effects",
            "fidelity",
            "calibrated",
            "notes",
        ]
        .map(at);
        assert!(order.windows(2).all(|w| w[0] < w[1]), "{text}");
        assert!(!text.contains("report_text") && !text.contains("measurements"));
        let first = serde_json::to_string(&r.figures[0]).unwrap();
        assert_eq!(
            first,
            r#"{"id":"met","unit":"IOPS","published":770000.0,"lab":800000.0,"role":"prediction","within_goal":true}"#
        );
        let json = serde_json::to_value(&r).unwrap();
        let goals: Vec<&serde_json::Value> = json["figures"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| &f["within_goal"])
            .collect();
        use serde_json::Value::{Bool, Null};
        assert_eq!(
            goals,
            [
                &Bool(true),
                &Bool(false),
                &Bool(true),
                &Bool(true),
                &Bool(false),
                &Null,
                &Null
            ]
        );
        assert_eq!(
            json["fidelity"],
            serde_json::json!({
                "effects": {"met": 1, "total": 1},
                "predicted_figures": {"met": 3, "total": 5}
            })
        );
    }
}
