//! bonnie's 1.98 CSV layout (`[workload] csv = "1.98"`): the row the lab prints reads back
//! through `iolab import bonnie` with the values the run measured, and a bad `csv` value is
//! bad input naming the file, line and field.

use std::path::{Path, PathBuf};
use std::process::Command;

use iolab_sim::lab::{self, examples, LabOptions};
use iolab_sim::metrics::Measurement;
use iolab_sim::workloads::bonnie::{bonnie_latency, CSV_198_COLUMNS, FILE_PHASES, PHASES};

fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../../scenarios/examples/{name}.toml"))
}

fn value(m: &Measurement, name: &str) -> f64 {
    m.get(name)
        .unwrap_or_else(|| panic!("metric {name} missing"))
        .value
}

#[test]
fn a_198_row_round_trips_through_the_importer_with_the_measured_values() {
    let text = examples::example("bonnie-nvme-smmuv3-strict-198").expect("bundled example");
    let run = lab::run_scenario(text, "example.toml", &LabOptions::default()).expect("runs");
    let measured = &run.report.measurements[0];
    let row = run.report.report_text.lines().next().expect("one row");
    assert_eq!(row.split(',').count(), CSV_198_COLUMNS.len(), "{row}");

    let imported = iolab::import::parse("bonnie", row)
        .expect("bonnie is an import format")
        .expect("the row parses");
    assert_eq!(imported.len(), 1);
    let got = &imported[0];
    assert_eq!(got.attrs["format_version"], "1.98");
    assert_eq!(got.attrs["concurrency"], "1");
    assert_eq!(got.config, measured.config);

    for phase in PHASES {
        let rate = if phase == "seeks" {
            "seeks_per_s".to_owned()
        } else {
            format!("{phase}_kps")
        };
        let want = value(measured, &format!("bonnie.{rate}"));
        let have = value(got, &format!("bonnie.{rate}"));
        // bonnie++ 1.9x truncates K/s to an integer; seeks/s above 1000 print whole.
        let printed = if phase == "seeks" && want < 1000.0 {
            (want * 10.0).round() / 10.0
        } else if phase == "seeks" {
            want.round()
        } else {
            want.trunc()
        };
        assert_eq!(have, printed, "{rate}: measured {want}");
        let cpu = format!("bonnie.{phase}_cpu_pct");
        assert_eq!(value(got, &cpu), value(measured, &cpu).trunc(), "{cpu}");

        let lat = format!("bonnie.{phase}_latency_ns");
        let ns = value(measured, &lat);
        assert!(
            ns > 0.0,
            "{lat}: every modelled phase has a longest operation"
        );
        // What the row says, read back: the measured latency truncated to its unit.
        let shown = bonnie_latency(Some(ns as u64));
        let unit = if shown.ends_with("us") {
            1e3
        } else if shown.ends_with("ms") {
            1e6
        } else {
            1e9
        };
        assert_eq!(
            value(got, &lat),
            (ns / unit).trunc() * unit,
            "{lat} ({shown})"
        );
    }
    // The file tests: a rate and %CPU truncated as bonnie++ 1.9x prints them, or, for a
    // test too fast to measure (`+++++`), no metric at all (not a zero) on either side;
    // every test's longest operation in its latency column.
    let mut measured_tests = 0;
    for phase in FILE_PHASES {
        for (metric, what) in [("per_s", "rate"), ("cpu_pct", "%CPU")] {
            let name = format!("bonnie.{phase}_{metric}");
            match measured.get(&name) {
                Some(m) => {
                    assert_eq!(value(got, &name), m.value.trunc(), "{phase} {what}");
                    measured_tests += 1;
                }
                None => assert!(got.get(&name).is_none(), "{name}: too fast, absent"),
            }
        }
        let lat = format!("bonnie.{phase}_latency_ns");
        let ns = value(measured, &lat);
        assert!(ns > 0.0, "{lat}");
        assert!(value(got, &lat) <= ns && value(got, &lat) > 0.0, "{lat}");
    }
    assert_eq!(
        measured_tests, 8,
        "create and delete are measured, stat is too fast"
    );
}

#[test]
fn the_198_layout_is_the_same_run_as_the_103_layout() {
    let opts = LabOptions::default();
    let run = |name: &str| {
        let text = examples::example(name).expect("bundled example");
        lab::run_scenario(text, "example.toml", &opts).expect("runs")
    };
    let v103 = run("bonnie-nvme-smmuv3-strict");
    let v198 = run("bonnie-nvme-smmuv3-strict-198");
    let (a, b) = (&v103.report.measurements[0], &v198.report.measurements[0]);
    // Every metric of the 1.03 run has the same value in the 1.98 run, which adds only
    // the latency column of each phase and file test.
    assert!(a.metrics.len() > 2 * PHASES.len(), "{:?}", a.metrics);
    for m in &a.metrics {
        assert_eq!(value(b, &m.name), m.value, "{}", m.name);
    }
    let mut extra: Vec<&str> = b
        .metrics
        .iter()
        .filter(|m| a.get(&m.name).is_none())
        .map(|m| m.name.as_str())
        .collect();
    extra.sort_unstable();
    let mut latencies: Vec<String> = PHASES
        .iter()
        .chain(FILE_PHASES.iter())
        .map(|p| format!("bonnie.{p}_latency_ns"))
        .collect();
    latencies.sort_unstable();
    assert_eq!(extra, latencies);
    assert_eq!(a.cpu, b.cpu, "the same CPU breakdown");
    assert!(a.get("bonnie.out_block_latency_ns").is_none());
}

#[test]
fn a_bad_csv_value_is_bad_input_naming_file_line_and_field() {
    let dir = std::env::temp_dir().join(format!("iolab-bonnie198-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let text = std::fs::read_to_string(example("bonnie-nvme-smmuv3-strict-198")).unwrap();
    for (bad, says) in [
        (
            "csv = \"1.97\"",
            "unknown bonnie++ CSV layout \"1.97\": expected one of \"1.03\", \"1.98\"",
        ),
        (
            "csv = 1.98",
            "expected one of \"1.03\", \"1.98\" (a quoted string), found a float",
        ),
    ] {
        let file = dir.join("bad.toml");
        let line = text.lines().position(|l| l.starts_with("csv =")).unwrap() + 1;
        let body: String = text
            .lines()
            .map(|l| if l.starts_with("csv =") { bad } else { l })
            .collect::<Vec<_>>()
            .join("\n");
        std::fs::write(&file, body).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_iolab"))
            .args(["--no-db", "run", file.to_str().unwrap()])
            .output()
            .expect("the iolab binary runs");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(out.stdout.is_empty(), "no output for bad input");
        assert!(err.contains("bad.toml"), "{err}");
        assert!(err.contains(&format!("line {line}")), "{err}");
        assert!(err.contains("workload.csv"), "{err}");
        assert!(err.contains(says), "{err}");
        assert_eq!(err.trim().lines().count(), 1, "one message: {err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
