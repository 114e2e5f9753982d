//! `iolab fit`: a synthetic recovery (a lab run made with a known device latency, imported
//! as if real, fitted back), identifiability, determinism, the written scenario's
//! provenance, and bad input refused with exit 2.

use std::path::{Path, PathBuf};

mod common;

use common::{iolab, s, stderr, temp_dir};

/// A QD1 fio job on one NVMe device with a fixed media latency of `latency_us`.
fn scenario(latency_us: Option<f64>) -> String {
    let latency = latency_us.map_or(String::new(), |l| format!("read_latency_us = {l}\n"));
    format!(
        r#"name = "qd1"
[machine]
platform = "intel-icelake-2s"
cpus = 2
[iommu]
model = "none"
mode = "off"
[[device]]
kind = "nvme"
latency_distribution = "fixed"
{latency}[workload]
kind = "fio"
ioengine = "libaio"
rw = "randread"
bs = "4k"
iodepth = 1
numjobs = 1
runtime_ms = 100
ramp_ms = 5
"#
    )
}

/// A database holding, as run 1, the lab's run of the scenario with a 150 us read latency,
/// written as fio JSON and imported as a real run would be; and the base scenario to fit
/// (the latency left out).
fn setup(name: &str) -> (PathBuf, PathBuf, PathBuf) {
    setup_with(name, &scenario(Some(150.0)))
}

/// [`setup`] with the "real" run made from scenario `truth`.
fn setup_with(name: &str, truth_text: &str) -> (PathBuf, PathBuf, PathBuf) {
    let dir = temp_dir(name);
    let truth = dir.join("truth.toml");
    std::fs::write(&truth, truth_text).unwrap();
    let out = iolab(&["run", s(&truth), "--no-db", "--format", "json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let json = dir.join("truth.json");
    std::fs::write(&json, &out.stdout).unwrap();
    let db = dir.join("r.db");
    let out = iolab(&["--db", s(&db), "import", "fio", s(&json)]);
    assert!(out.status.success(), "{}", stderr(&out));
    let base = dir.join("base.toml");
    std::fs::write(&base, scenario(None)).unwrap();
    (dir, db, base)
}

fn fit(db: &Path, args: &[&str]) -> std::process::Output {
    let mut all = vec!["--db", s(db), "fit"];
    all.extend_from_slice(args);
    iolab(&all)
}

/// `iolab fit BASE --to 1 --unknown device[0].read_latency_us=10..500 EXTRA... -o OUT`:
/// the synthetic runs' one unknown fitted to run 1 (and whatever `extra` adds).
fn fit_latency(db: &Path, base: &Path, extra: &[&str], out: &Path) -> std::process::Output {
    let mut args = vec![
        s(base),
        "--to",
        "1",
        "--unknown",
        "device[0].read_latency_us=10..500",
    ];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["-o", s(out)]);
    fit(db, &args)
}

/// The fitted value of `field` in a written scenario's `[[fitted]]`.
fn fitted_value(path: &Path, field: &str) -> f64 {
    let t: toml::Table = toml::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    t["fitted"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["field"].as_str() == Some(field))
        .and_then(|e| e["value"].as_float())
        .expect("a fitted entry")
}

#[test]
fn a_known_latency_is_recovered_within_two_percent() {
    let (dir, db, base) = setup("fit-recover");
    let out_file = dir.join("fitted.toml");
    let out = fit_latency(&db, &base, &[], &out_file);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8(out.stdout).unwrap();
    let v = fitted_value(&out_file, "device[0].read_latency_us");
    assert!(
        (v / 150.0 - 1.0).abs() < 0.02,
        "fitted {v}, truth 150\n{text}"
    );
    assert!(text.contains("identified"), "{text}");
    assert!(text.contains("lab runs"), "{text}");
    // The written scenario holds the value and runs as it is.
    let written = std::fs::read_to_string(&out_file).unwrap();
    let t: toml::Table = toml::from_str(&written).unwrap();
    assert_eq!(t["device"][0]["read_latency_us"].as_float(), Some(v));
    let run = iolab(&["run", s(&out_file), "--no-db"]);
    assert!(run.status.success(), "{}", stderr(&run));
    // ... and refuses an edit of the fitted value that leaves the provenance stale.
    let edited = dir.join("edited.toml");
    std::fs::write(
        &edited,
        written.replace(&format!("read_latency_us = {v}"), "read_latency_us = 99.0"),
    )
    .unwrap();
    let run = iolab(&["run", s(&edited), "--no-db"]);
    assert_eq!(run.status.code(), Some(2), "{}", stderr(&run));
    assert!(stderr(&run).contains("fitted[0].value"), "{}", stderr(&run));
}

#[test]
fn an_unknown_no_figure_responds_to_is_reported_not_identifiable() {
    let (dir, db, base) = setup("fit-flat");
    let out = fit_latency(
        &db,
        &base,
        &["--unknown", "device[0].write_latency_us=1..500"],
        &dir.join("f.toml"),
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8(out.stdout).unwrap();
    let line = text
        .lines()
        .find(|l| l.starts_with("device[0].write_latency_us"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(line.contains("NOT identifiable"), "{text}");
    let line = text
        .lines()
        .find(|l| l.starts_with("device[0].read_latency_us"))
        .unwrap();
    assert!(line.contains("identified"), "{text}");
    assert!(text.contains("under-determined"), "{text}");
}

#[test]
fn a_fit_is_the_same_bytes_at_any_thread_count() {
    let (dir, db, base) = setup("fit-determinism");
    let run = |jobs: &str, name: &str| {
        let file = dir.join(name);
        let out = fit_latency(&db, &base, &["--jobs", jobs], &file);
        assert!(out.status.success(), "{}", stderr(&out));
        (out.stdout, std::fs::read(&file).unwrap())
    };
    assert_eq!(run("1", "a.toml"), run("2", "b.toml"));
}

#[test]
fn several_runs_are_fitted_together_and_each_is_predicted_without_itself() {
    let (dir, db, base) = setup("fit-loo");
    // A second "real" run: the same job at depth 4, from the same truth.
    let truth4 = dir.join("truth4.toml");
    std::fs::write(
        &truth4,
        scenario(Some(150.0)).replace("iodepth = 1", "iodepth = 4"),
    )
    .unwrap();
    let out = iolab(&["run", s(&truth4), "--no-db", "--format", "json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let json = dir.join("truth4.json");
    std::fs::write(&json, &out.stdout).unwrap();
    let out = iolab(&["--db", s(&db), "import", "fio", s(&json)]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out_file = dir.join("f.toml");
    let out = fit_latency(&db, &base, &["--to", "2"], &out_file);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8(out.stdout.clone()).unwrap();
    // Run 2's depth came from its own job options.
    assert!(
        stderr(&out).contains("workload.iodepth = 4"),
        "{}",
        stderr(&out)
    );
    assert!(
        text.contains("without run 1") && text.contains("without run 2"),
        "{text}"
    );
    let v = fitted_value(&out_file, "device[0].read_latency_us");
    assert!((v / 150.0 - 1.0).abs() < 0.02, "fitted {v}\n{text}");
    // Each left-out run is predicted within a few percent: the truth is one latency.
    for line in text.lines().filter(|l| l.contains(" error ")) {
        let err: f64 = line
            .rsplit("error ")
            .next()
            .and_then(|e| e.trim().trim_end_matches('%').parse().ok())
            .unwrap_or_else(|| panic!("{line}"));
        assert!(err.abs() < 3.0, "{line}");
    }
}

#[test]
fn bad_input_is_refused_naming_it() {
    let (dir, db, base) = setup("fit-bad");
    let o = dir.join("never.toml");
    let cases: [(&[&str], &str); 8] = [
        (
            &["--to", "1", "--unknown", "device[0].bogus=1..2"],
            "device[0].bogus",
        ),
        (
            &["--to", "1", "--unknown", "device[0].read_latency_us=5..5"],
            "LO < HI",
        ),
        (
            &[
                "--to",
                "1",
                "--unknown",
                "device[0].read_latency_us=500..10",
            ],
            "LO < HI",
        ),
        (
            &[
                "--to",
                "1",
                "--unknown",
                "device[0].read_latency_us=ten..500",
            ],
            "not a number",
        ),
        (
            &["--to", "1", "--unknown", "device[0].read_latency_us"],
            "FIELD=LO..HI",
        ),
        (
            &[
                "--to",
                "1",
                "--metric",
                "write.iops",
                "--unknown",
                "device[0].read_latency_us=10..500",
            ],
            "write.iops",
        ),
        (
            &[
                "--to",
                "7",
                "--unknown",
                "device[0].read_latency_us=10..500",
            ],
            "run 7",
        ),
        (
            &[
                "--to",
                "1",
                "--unknown",
                "device[0].read_latency_us=10..5000000",
            ],
            "device[0].read_latency_us",
        ),
    ];
    for (args, needle) in cases {
        let mut all = vec![s(&base)];
        all.extend_from_slice(args);
        all.extend_from_slice(&["-o", s(&o)]);
        let out = fit(&db, &all);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(err.contains(needle), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: one message: {err}");
        assert!(!o.exists(), "{args:?} wrote a file");
    }
}

#[test]
fn a_reaim_row_is_fitted_to_the_lab_run_of_its_user_count() {
    let dir = temp_dir("fit-reaim");
    let db = dir.join("r.db");
    let data =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/reaim-sba-vmerge-novmerge.txt");
    let out = iolab(&["--db", s(&db), "import", "reaim", s(&data)]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = fit(
        &db,
        &[
            "--example",
            "reaim-scsi-sba",
            "--to",
            "1:users_100",
            "--to",
            "1:users_200",
            "--unknown",
            "workload.user_scale=1..100",
            "-o",
            s(&dir.join("f.toml")),
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8(out.stdout.clone()).unwrap();
    // Each row's own user count ran, and its jobs per minute is the figure.
    assert!(
        stderr(&out).contains("workload.start = workload.end = 200"),
        "{}",
        stderr(&out)
    );
    let residuals: Vec<f64> = text
        .lines()
        .filter(|l| l.starts_with("run 1:users_") && l.contains("reaim.jobs_per_min"))
        .map(|l| {
            l.split_whitespace()
                .last()
                .and_then(|r| r.trim_end_matches('%').parse().ok())
                .unwrap_or_else(|| panic!("{l}"))
        })
        .collect();
    assert_eq!(residuals.len(), 2, "{text}");
    assert!(residuals.iter().all(|r| r.abs() < 5.0), "{text}");
    assert!(text.contains("identified"), "{text}");
}

#[test]
fn a_run_s_engine_and_io_uring_options_set_its_twin() {
    // The "real" run: io_uring with polled completions and registered buffers at depth 4;
    // the base says libaio at depth 1, and the run's options replace both.
    let truth = scenario(Some(150.0))
        .replace(
            "ioengine = \"libaio\"",
            "ioengine = \"io_uring\"\nhipri = true\nfixedbufs = true",
        )
        .replace("iodepth = 1", "iodepth = 4");
    let (dir, db, base) = setup_with("fit-engine", &truth);
    let fitted = dir.join("fitted.toml");
    let out = fit_latency(&db, &base, &[], &fitted);
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    for said in [
        "workload.ioengine = \"io_uring\"",
        "workload.hipri = true",
        "workload.fixedbufs = true",
        "workload.iodepth = 4",
    ] {
        assert!(err.contains(said), "{said}: {err}");
    }
    let t: toml::Table = toml::from_str(&std::fs::read_to_string(&fitted).unwrap()).unwrap();
    let w = t["workload"].as_table().unwrap();
    assert_eq!(w["ioengine"].as_str(), Some("io_uring"));
    assert_eq!(w["hipri"].as_bool(), Some(true));
    assert_eq!(w["fixedbufs"].as_bool(), Some(true));
    let v = fitted_value(&fitted, "device[0].read_latency_us");
    assert!((v / 150.0 - 1.0).abs() < 0.02, "fitted {v}");
}
