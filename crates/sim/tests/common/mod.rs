//! Helpers the lab's integration tests share: run a scenario text, read a metric.
// Each test binary compiles this module and uses a part of it.
#![allow(dead_code)]

use iolab_sim::lab::{self, examples, LabOptions, LabRun};
use iolab_sim::metrics::Measurement;

/// Runs a scenario text (named `test.toml` in any message) with the default options.
pub fn run(text: &str) -> LabRun {
    lab::run_scenario(text, "test.toml", &LabOptions::default()).expect("scenario runs")
}

/// Runs the bundled example `name`.
pub fn example(name: &str) -> LabRun {
    let text = examples::example(name).unwrap_or_else(|| panic!("no bundled example {name}"));
    run(text)
}

/// The value of metric `name` in the run's first measurement.
pub fn metric(r: &LabRun, name: &str) -> f64 {
    r.report.measurements[0]
        .get(name)
        .unwrap_or_else(|| panic!("{}: metric {name} missing", r.report.name))
        .value
}

/// The value of metric `name` in `m`.
pub fn value(m: &Measurement, name: &str) -> f64 {
    m.get(name)
        .unwrap_or_else(|| panic!("{}: metric {name} missing", m.config))
        .value
}

/// Experiment-file `text` with declared unknown `field` (a calibration with a `range`) given
/// as `value` instead: what the calibration would be if the fit had found that value.
pub fn with_calibration_value(text: &str, field: &str, value: &str) -> String {
    let at = format!("field = \"{field}\"\nrange = [");
    let start = text
        .find(&at)
        .unwrap_or_else(|| panic!("the experiment file no longer declares `{field}` unknown"));
    let range_start = start + at.len() - "range = [".len();
    let range_end = range_start + text[range_start..].find('\n').expect("a line");
    format!(
        "{}value = {value}{}",
        &text[..range_start],
        &text[range_end..]
    )
}
