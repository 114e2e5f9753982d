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

/// A physical parameter in a scenario file, with where its value comes from:
/// `{ value = X, source = "citation, or assumption: why" }`.
#[derive(Clone, Debug, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Sourced<T = f64> {
    /// The value.
    pub value: T,
    /// A citation, or `assumption: ...` with the reasoning.
    pub source: String,
}

/// Whether a published figure was used to fit a declared parameter, or predicted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
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
#[derive(Clone, Debug, PartialEq, Serialize)]
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

/// Whether a predicted absolute figure is within +-25% of its published value.
pub fn figure_within_goal(f: &Figure) -> Option<bool> {
    f.error_pct().map(|e| e.abs() <= 25.0)
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
}

/// What one experiment produced.
#[derive(Clone, Debug, PartialEq, Serialize)]
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
    #[serde(skip)]
    pub report_text: String,
    /// Plain statements of what the lab does not (yet) reach, and why.
    pub notes: Vec<String>,
    /// Every measured configuration, with its metrics, latencies and CPU time (for the
    /// results database, `iolab compare` and `iolab report`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub measurements: Vec<crate::metrics::Measurement>,
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
}
