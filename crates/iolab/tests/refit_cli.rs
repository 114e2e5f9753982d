//! `iolab reproduce --refit` and `--cross-validate` on a user's own experiment file: the
//! lock file written beside it, the report's fitted values, a stale lock refused, and
//! leave-one-out predictions.

mod common;

use common::{iolab, s, stderr, temp_dir};

/// An experiment with one declared unknown (the device's read latency) fitted to the QD1
/// row's IOPS, and a QD4 row whose IOPS is a prediction; `published` values come from a
/// lab run with a 150 us latency (6,510 and 26,040 IOPS at 2 CPUs).
fn experiment(range: &str, fitted_to: &str) -> String {
    format!(
        r#"experiment = "tiny"
title = "a device latency fitted at QD1, predicted at QD4"

[base]
[base.machine]
platform = "intel-icelake-2s"
cpus = 2
[base.iommu]
model = "none"
mode = "off"
[[base.device]]
kind = "nvme"
latency_distribution = "fixed"
[base.workload]
kind = "fio"
ioengine = "libaio"
rw = "randread"
bs = 4096
iodepth = 1
numjobs = 1
runtime_ms = 100
ramp_ms = 5

[[rows]]
id = "qd1"
[[rows]]
id = "qd4"
set = {{ workload = {{ iodepth = 4 }} }}

[[calibrations]]
field = "device[0].read_latency_us"
range = {range}
fitted_to = {fitted_to}
source = "declared unknown: the test drive's read latency"

[[figures]]
cell = "qd1"
metric = "read.iops"
unit = "IOPS"
published = {qd1}
role = "calibration"

[[figures]]
cell = "qd4"
metric = "read.iops"
unit = "IOPS"
published = {qd4}
"#,
        qd1 = TRUTH.0,
        qd4 = TRUTH.1,
    )
}

/// The lab's IOPS at QD1 and QD4 with `read_latency_us = 150` (measured below, once).
const TRUTH: (f64, f64) = (6510.0, 26040.0);

#[test]
fn a_refit_writes_the_lock_beside_the_file_and_the_report_uses_it() {
    let dir = temp_dir("refit");
    let file = dir.join("tiny.toml");
    std::fs::write(&file, experiment("[10, 500]", r#"["qd1"]"#)).unwrap();
    // Before any refit the unknown has no value: the run says what to do.
    let out = iolab(&["--no-db", "reproduce", s(&file)]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("--refit"), "{}", stderr(&out));
    let out = iolab(&["--no-db", "reproduce", "--refit", s(&file), "--jobs", "2"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("identified"), "{text}");
    let lock = dir.join("tiny.fit.toml");
    let t: toml::Table = toml::from_str(&std::fs::read_to_string(&lock).unwrap()).unwrap();
    let v = t["fitted"][0]["value"].as_float().unwrap();
    assert!((v / 150.0 - 1.0).abs() < 0.02, "fitted {v}\n{text}");
    // The report runs with the locked value and names it.
    let out = iolab(&["--no-db", "reproduce", s(&file)]);
    assert!(out.status.success(), "{}", stderr(&out));
    let report = String::from_utf8(out.stdout).unwrap();
    assert!(
        report.contains(&format!(
            "calibrated: device[0].read_latency_us = {v} (fitted by the tool in 10..500 to qd1"
        )),
        "{report}"
    );
    // The same refit again gives the same bytes.
    let first = std::fs::read(&lock).unwrap();
    let out = iolab(&["--no-db", "reproduce", "--refit", s(&file), "--jobs", "1"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(std::fs::read(&lock).unwrap(), first);
    // A changed declaration leaves the lock stale: refused with what to do.
    std::fs::write(&file, experiment("[20, 400]", r#"["qd1"]"#)).unwrap();
    let out = iolab(&["--no-db", "reproduce", s(&file)]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("another declaration") && err.contains("--refit"),
        "{err}"
    );
}

#[test]
fn cross_validation_predicts_each_figure_left_out() {
    let dir = temp_dir("crossval");
    let file = dir.join("tiny.toml");
    // Fitted to both rows: each left out is predicted from the other.
    let qd4 = format!("published = {}\n", TRUTH.1);
    let text = experiment("[10, 500]", r#"["qd1", "qd4"]"#)
        .replace(&qd4, &format!("{qd4}role = \"calibration\"\n"));
    std::fs::write(&file, text).unwrap();
    let out = iolab(&["--no-db", "reproduce", "--cross-validate", s(&file)]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8(out.stdout).unwrap();
    for id in ["qd1", "qd4"] {
        let line = text
            .lines()
            .find(|l| l.starts_with(id))
            .unwrap_or_else(|| panic!("{text}"));
        let err: f64 = line
            .split_whitespace()
            .last()
            .and_then(|e| e.trim_end_matches('%').parse().ok())
            .unwrap_or_else(|| panic!("{line}"));
        assert!(err.abs() < 3.0, "{line}");
    }
    // With one calibration figure, nothing is left to fit: said, not guessed.
    std::fs::write(&file, experiment("[10, 500]", r#"["qd1"]"#)).unwrap();
    let out = iolab(&["--no-db", "reproduce", "--cross-validate", s(&file)]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.contains("nothing is left to fit"), "{text}");
}

#[test]
fn bad_declarations_are_refused_naming_the_field() {
    let dir = temp_dir("refit-bad");
    let file = dir.join("tiny.toml");
    let cases = [
        (
            experiment("[500, 10]", r#"["qd1"]"#),
            "calibrations[0].range",
        ),
        (
            experiment("[10, 500]", r#"["qd1"]"#)
                .replace("range = [10, 500]", "range = [10, 500]\nvalue = 3"),
            "exactly one of `range`",
        ),
        (experiment("[10, 5000000]", r#"["qd1"]"#), "read_latency_us"),
    ];
    for (text, needle) in cases {
        std::fs::write(&file, text).unwrap();
        let out = iolab(&["--no-db", "reproduce", "--refit", s(&file)]);
        assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
        assert!(stderr(&out).contains(needle), "{needle}: {}", stderr(&out));
        assert!(!dir.join("tiny.fit.toml").exists());
    }
}
