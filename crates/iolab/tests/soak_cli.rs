//! `iolab soak` as a user runs it: both directions by default, one with `--direction`, the
//! report's shape, and bad input with exit code 2.

mod common;

use common::iolab;

/// 20 virtual ms (5.6e-6 h), a checkpoint every 5 ms, 8 threads.
const SHORT: [&str; 8] = [
    "--no-db",
    "soak",
    "--hours",
    "0.0000055556",
    "--interval-s",
    "0.005",
    "--threads",
    "8",
];

#[test]
fn by_default_the_soak_runs_write_then_read_and_reports_each() {
    let mut args = SHORT.to_vec();
    args.extend(["--format", "json"]);
    let out = iolab(&args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let reports: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let reports = reports.as_array().expect("an array of reports");
    let directions: Vec<&str> = reports
        .iter()
        .map(|r| r["direction"].as_str().unwrap())
        .collect();
    assert_eq!(directions, ["write", "read"]);
    for r in reports {
        assert_eq!(r["threads"], 8);
        assert_eq!(r["intervals"].as_array().unwrap().len(), 4);
        assert_eq!(r["maps"], r["unmaps"]);
        assert!(r["mean_gbps"].as_f64().unwrap() > 0.0);
        assert!(r["cv_pct"].as_f64().unwrap().is_finite());
    }
}

#[test]
fn one_direction_in_text_names_it_and_its_coefficient_of_variation() {
    let mut args = SHORT.to_vec();
    args.extend(["--direction", "read"]);
    let out = iolab(&args);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("== soak: 8 read threads"), "{text}");
    assert!(!text.contains("write threads"), "{text}");
    assert!(text.contains("coefficient of variation"), "{text}");
    assert!(
        text.contains("invariants: held at all 4 checkpoints"),
        "{text}"
    );
}

#[test]
fn an_unknown_direction_and_an_impossible_thread_count_are_bad_input() {
    let mut args = SHORT.to_vec();
    args.extend(["--direction", "sideways"]);
    assert_eq!(iolab(&args).status.code(), Some(2));
    let out = iolab(&[
        "--no-db",
        "soak",
        "--hours",
        "0.0000055556",
        "--interval-s",
        "0.005",
        "--threads",
        "100000",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("threads"), "{err}");
}
