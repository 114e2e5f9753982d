//! `iolab compare` end to end: groups of lab repetitions, imported files, every output
//! format, and bad sides.

use std::path::Path;
use std::process::Output;

use serde_json::Value;

mod common;

use common::{iolab, stderr, temp_dir};

fn repo(rel: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(rel)
        .to_str()
        .expect("utf-8 path")
        .to_owned()
}

fn ok(out: Output) -> String {
    assert!(out.status.success(), "{}", stderr(&out));
    String::from_utf8(out.stdout).expect("utf-8")
}

#[test]
fn groups_of_lab_repetitions_compare_with_statistics() {
    let dir = temp_dir("lab");
    let db = dir.join("r.db");
    let db = db.to_str().unwrap();
    // A netperf stream on POWER: its stack costs vary run to run (`workload.jitter_pct`),
    // so the repetitions differ.
    let scenario = repo("../../scenarios/examples/netperf-pseries-ddw.toml");
    let first = iolab(&["--db", db, "run", &scenario, "--runs", "3", "--seed", "1"]);
    let text = ok(first);
    // One report per repetition.
    assert_eq!(text.matches("TCP STREAM TEST (lab)").count(), 3, "{text}");
    ok(iolab(&[
        "--db", db, "run", &scenario, "--runs", "2", "--seed", "11",
    ]));

    let list: Value = serde_json::from_str(&ok(iolab(&[
        "--db", db, "runs", "list", "--format", "json",
    ])))
    .unwrap();
    let rows: Vec<(i64, Option<i64>, u64)> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["id"].as_i64().unwrap(),
                r["group_id"].as_i64(),
                r["seed"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        rows,
        [
            (1, Some(1), 1),
            (2, Some(1), 2),
            (3, Some(1), 3),
            (4, Some(4), 11),
            (5, Some(4), 12)
        ]
    );
    let text = ok(iolab(&["--db", db, "runs", "list"]));
    assert!(text.contains(" g4 "), "{text}");

    let json: Value = serde_json::from_str(&ok(iolab(&[
        "--db", db, "compare", "g1", "g4", "--format", "json",
    ])))
    .unwrap();
    assert_eq!(json["a"]["runs"], serde_json::json!([1, 2, 3]));
    assert_eq!(json["b"]["runs"], serde_json::json!([4, 5]));
    let rows = json["rows"].as_array().unwrap();
    assert!(!rows.is_empty());
    // Runs with measurements compare by (configuration, metric): every metric of every
    // measured configuration.
    let show = |run: i64| -> Value {
        serde_json::from_str(&ok(iolab(&[
            "--db",
            db,
            "runs",
            "show",
            &run.to_string(),
            "--format",
            "json",
        ])))
        .unwrap()
    };
    let first = show(1);
    let measurements = first["measurements"].as_array().unwrap();
    assert_eq!(measurements.len(), 1, "one measurement per lab run");
    let metric_count: usize = measurements
        .iter()
        .map(|m| m["metrics"].as_array().unwrap().len())
        .sum();
    assert_eq!(rows.len(), metric_count);
    // The stored value of `metric`, read as compare reads it
    // (`iolab::vocab::canonical_metric`: old names are aliases of the current ones).
    let value = |run: &Value, config: &str, metric: &str| -> f64 {
        run["measurements"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["config"] == config)
            .and_then(|m| {
                m["metrics"].as_array().unwrap().iter().find_map(|x| {
                    let (name, _, v) = iolab::vocab::canonical_metric(
                        x["name"].as_str().unwrap(),
                        x["unit"].as_str().unwrap(),
                        x["value"].as_f64().unwrap(),
                    );
                    (name == metric).then_some(v)
                })
            })
            .unwrap()
    };
    let group_a = [first, show(2), show(3)];
    for r in rows {
        assert_eq!(
            (r["a"]["n"].as_u64(), r["b"]["n"].as_u64()),
            (Some(3), Some(2))
        );
        // Each side's mean is the mean of its runs' values.
        let (config, id) = (r["config"].as_str().unwrap(), r["metric"].as_str().unwrap());
        let mean_a = group_a
            .iter()
            .map(|run| value(run, config, id))
            .sum::<f64>()
            / 3.0;
        assert!(
            (r["a"]["mean"].as_f64().unwrap() - mean_a).abs() <= 1e-9 * mean_a.abs().max(1.0),
            "{config} {id}"
        );
        let (lo, hi) = match &r["ci95"] {
            Value::Array(c) => (c[0].as_f64().unwrap(), c[1].as_f64().unwrap()),
            other => panic!("{id}: two groups of n >= 2 give an interval, got {other}"),
        };
        let diff = r["diff"].as_f64().unwrap();
        assert!(lo <= diff && diff <= hi, "{id}: {lo} <= {diff} <= {hi}");
        match r["p_value"].as_f64() {
            Some(p) => assert!((0.0..=1.0).contains(&p), "{id}: p {p}"),
            None => assert_eq!(r["note"], "zero variance on both sides", "{id}"),
        }
    }

    // Text, CSV and Markdown carry the same rows.
    let text = ok(iolab(&["--db", db, "compare", "g1", "g4"]));
    assert!(
        text.starts_with("A: g1 (runs 1, 2, 3)\nB: g4 (runs 4, 5)\n"),
        "{text}"
    );
    assert!(text.contains("p (Welch)"));
    let csv = ok(iolab(&[
        "--db", db, "compare", "g1", "g4", "--format", "csv",
    ]));
    assert_eq!(csv.lines().count(), rows.len() + 1);
    assert!(csv.lines().all(|l| l.split(',').count() == 17), "{csv}");
    let md = ok(iolab(&[
        "--db", db, "compare", "g1", "g4", "--format", "markdown",
    ]));
    assert_eq!(
        md.lines()
            .filter(|l| l.starts_with("| netperf-pseries-ddw"))
            .count(),
        rows.len()
    );
    // --metric filters by metric name.
    let lat: Value = serde_json::from_str(&ok(iolab(&[
        "--db",
        db,
        "compare",
        "g1",
        "g4",
        "--metric",
        "*.latency_mean_us",
        "--format",
        "json",
    ])))
    .unwrap();
    let lat = lat["rows"].as_array().unwrap();
    assert!(!lat.is_empty() && lat.len() < rows.len());
    assert!(
        lat.iter()
            .all(|r| r["metric"].as_str().unwrap() == "net.latency_mean_us"),
        "{lat:?}"
    );
    // A single run against a group: no interval, and the reason.
    let one: Value = serde_json::from_str(&ok(iolab(&[
        "--db", db, "compare", "1", "4,5", "--format", "json",
    ])))
    .unwrap();
    for r in one["rows"].as_array().unwrap() {
        assert!(r["ci95"].is_null() && r["p_value"].is_null());
        assert_eq!(r["note"], "n=1");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn imported_fio_runs_compare_by_job_and_metric() {
    let dir = temp_dir("fio");
    let db = dir.join("r.db");
    let db = db.to_str().unwrap();
    for f in [
        "fio-randread-grouped.json",
        "fio-randread-grouped-2.json",
        "fio-randread-grouped.jsonplus.json",
        "fio-randrw.json",
    ] {
        ok(iolab(&[
            "--db",
            db,
            "import",
            "fio",
            &repo(&format!("tests/data/{f}")),
        ]));
    }
    let json: Value = serde_json::from_str(&ok(iolab(&[
        "--db",
        db,
        "compare",
        "1,2",
        "3",
        "--metric",
        "read.iops",
        "--format",
        "json",
    ])))
    .unwrap();
    let rows = json["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 1);
    let r = &rows[0];
    assert_eq!(
        (r["config"].as_str(), r["metric"].as_str()),
        (Some("randread"), Some("read.iops"))
    );
    // The figures of the three files (fio's `iops` of the one grouped job).
    let iops = |f: &str| -> f64 {
        let t = std::fs::read_to_string(repo(&format!("tests/data/{f}"))).unwrap();
        let v: Value = serde_json::from_str(&t[t.find("\n{").unwrap() + 1..]).unwrap();
        v["jobs"][0]["read"]["iops"].as_f64().unwrap()
    };
    let (a1, a2) = (
        iops("fio-randread-grouped.json"),
        iops("fio-randread-grouped-2.json"),
    );
    let b = iops("fio-randread-grouped.jsonplus.json");
    let mean_a = (a1 + a2) / 2.0;
    assert!((r["a"]["mean"].as_f64().unwrap() - mean_a).abs() < 1e-9 * mean_a);
    let sd_a = ((a1 - mean_a).powi(2) + (a2 - mean_a).powi(2)).sqrt();
    assert!((r["a"]["sd"].as_f64().unwrap() - sd_a).abs() < 1e-9 * sd_a);
    let change = (b - mean_a) / mean_a * 100.0;
    assert!((r["change_pct"].as_f64().unwrap() - change).abs() < 1e-9);
    assert_eq!(r["note"], "n=1");
    // randrw has no `randread` job: nothing in common.
    let out = iolab(&["--db", db, "compare", "1", "4"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("nothing to compare"),
        "{}",
        stderr(&out)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_sides_are_refused_with_exit_2() {
    let dir = temp_dir("bad");
    let db = dir.join("r.db");
    let db = db.to_str().unwrap();
    let out = iolab(&["--db", db, "compare", "1", "2"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("does not exist"), "{}", stderr(&out));
    assert!(
        !Path::new(db).exists(),
        "compare does not create a database"
    );
    ok(iolab(&[
        "--db",
        db,
        "import",
        "reaim",
        &repo("tests/data/reaim-sba-vmerge-vmerge.txt"),
    ]));
    for (a, b, says) in [
        ("x", "1", "`x`: expected a run id (12), a group (g12)"),
        ("1", "g1", "has no group g1"),
        ("1", "7", "has no run 7"),
        ("1", "1,", "`1,`: expected"),
    ] {
        let out = iolab(&["--db", db, "compare", a, b]);
        assert_eq!(out.status.code(), Some(2), "{a} {b}");
        let err = stderr(&out);
        assert!(
            err.contains(says) && err.lines().count() == 1,
            "{a} {b}: {err}"
        );
    }
    let out = iolab(&["--db", db, "compare", "1", "1", "--metric", "nothing.*"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("matching `nothing.*`"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn two_variants_of_one_workload_scenario_pair_their_single_configurations() {
    let dir = temp_dir("paired");
    let db = dir.join("r.db");
    let db = db.to_str().unwrap();
    // Runs 1-2: strict; runs 3-4: lazy. Each run measures one configuration, named after
    // its scenario, so the names differ.
    for example in ["fio-nvme-strict", "fio-nvme-lazy"] {
        ok(iolab(&[
            "--db",
            db,
            "run",
            "--example",
            example,
            "--runs",
            "2",
        ]));
    }
    let json: Value = serde_json::from_str(&ok(iolab(&[
        "--db",
        db,
        "compare",
        "g1",
        "g3",
        "--format",
        "json",
        "--metric",
        "read.iops",
    ])))
    .unwrap();
    assert_eq!(
        json["paired"],
        serde_json::json!(["fio-nvme-strict", "fio-nvme-lazy"])
    );
    let rows = json["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["config"], "fio-nvme-strict");
    assert_eq!(
        (rows[0]["a"]["n"].as_u64(), rows[0]["b"]["n"].as_u64()),
        (Some(2), Some(2))
    );
    let text = ok(iolab(&["--db", db, "compare", "g1", "g3"]));
    assert!(
        text.contains("paired: configuration fio-nvme-strict (A) with fio-nvme-lazy (B)"),
        "{text}"
    );
    // Runs with several configurations are not paired by position: a run of the
    // sba-vmerge experiment (two cells) against a workload scenario has nothing in common.
    ok(iolab(&["--db", db, "reproduce", "sba-vmerge"]));
    let out = iolab(&["--db", db, "compare", "1", "5"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
}

#[test]
fn text_tables_print_numbers_with_units_and_json_keeps_raw_numbers() {
    let dir = temp_dir("human");
    let db = dir.join("r.db");
    let db = db.to_str().unwrap();
    for f in [
        "fio-randread-grouped.json",
        "fio-randread-grouped-2.json",
        "fio-randread-grouped.jsonplus.json",
    ] {
        ok(iolab(&[
            "--db",
            db,
            "import",
            "fio",
            &repo(&format!("tests/data/{f}")),
        ]));
    }
    let text = ok(iolab(&["--db", db, "compare", "1,2", "3"]));
    let row = |metric: &str| -> String {
        text.lines()
            .find(|l| l.split_whitespace().nth(1) == Some(metric))
            .unwrap_or_else(|| panic!("no {metric} row:\n{text}"))
            .to_owned()
    };
    // IOPS in full with separators, bytes/s with a prefix, nanoseconds in a fitting unit.
    assert!(row("read.iops").contains(" 21,431 "), "{text}");
    assert!(row("read.bw_bytes_per_s").contains(" 87.78 M "), "{text}");
    assert!(row("read.clat_mean_ns").contains(" 92.07 us "), "{text}");
    assert!(row("read.clat_p99_ns").contains(" 2.273 ms "), "{text}");
    // A two-run group against another: the interval reads "LOW to HIGH" (the numbers have
    // thousands separators, so no comma between them).
    let two = ok(iolab(&[
        "--db",
        db,
        "compare",
        "1,2",
        "1-2",
        "--metric",
        "read.iops",
    ]));
    assert!(two.contains(" -1,769 to 1,769 "), "{two}");
    // No exponents and no long raw decimals anywhere in the table.
    for line in text.lines().skip(3) {
        // After the config, metric and unit columns.
        for word in line.split_whitespace().skip(3) {
            let has_exp =
                word.contains('e') && word.chars().next().is_some_and(|c| c.is_ascii_digit());
            assert!(!has_exp, "exponent in `{word}`: {line}");
            // Decimal numbers carry at most four significant digits (the change column's
            // percentages aside).
            if word.contains('.') && !word.ends_with('%') {
                let significant = word
                    .trim_start_matches(['-', '0', '.'])
                    .chars()
                    .filter(char::is_ascii_digit)
                    .count();
                assert!(significant <= 4, "`{word}`: {line}");
            }
        }
    }
    let md = ok(iolab(&[
        "--db", db, "compare", "1,2", "3", "--format", "markdown",
    ]));
    assert!(md.contains("| 21,431 |"), "{md}");
    // JSON keeps the raw means.
    let json: Value = serde_json::from_str(&ok(iolab(&[
        "--db",
        db,
        "compare",
        "1,2",
        "3",
        "--metric",
        "read.iops",
        "--format",
        "json",
    ])))
    .unwrap();
    let mean = json["rows"][0]["a"]["mean"].as_f64().expect("a raw number");
    assert!(mean > 21_431.0 && mean < 21_432.0, "{mean}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A real fio run (tests/data: `--rw=randread --bs=4k --iodepth=8 --numjobs=2`, job name
/// `randread`) and the lab run of the same job (scenario `lab-randread`) pair up by their
/// attributes, typed (`bs = "4k"` is 4096, `iodepth = "8"` is 8), not by name; a lab job
/// with another iodepth does not.
#[test]
fn a_real_fio_import_and_the_lab_run_of_the_same_job_pair_by_attributes() {
    let dir = temp_dir("byattrs");
    let db = dir.join("r.db");
    let db = db.to_str().unwrap();
    for f in ["fio-randread-grouped.json", "fio-randread-grouped-2.json"] {
        ok(iolab(&[
            "--db",
            db,
            "import",
            "fio",
            &repo(&format!("tests/data/{f}")),
        ]));
    }
    let example = std::fs::read_to_string(repo("../../scenarios/examples/fio-nvme-strict.toml"))
        .unwrap()
        .replace("name = \"fio-nvme-strict\"", "name = \"lab-randread\"")
        .replace("bs = 4096", "bs = \"4k\"")
        .replace("iodepth = 32", "iodepth = 1")
        .replace("numjobs = 16", "numjobs = 2");
    // The real job said iodepth=8 with the psync engine, which fio runs at depth 1: its lab
    // twin has iodepth = 1.
    let same = dir.join("same.toml");
    std::fs::write(&same, &example).unwrap();
    ok(iolab(&[
        "--db",
        db,
        "run",
        same.to_str().unwrap(),
        "--runs",
        "2",
    ]));
    let json: Value = serde_json::from_str(&ok(iolab(&[
        "--db", db, "compare", "1,2", "g3", "--format", "json", "--metric", "read.*",
    ])))
    .unwrap();
    assert_eq!(
        json["paired_by_attributes"],
        serde_json::json!([{
            "a": "randread",
            "b": "lab-randread",
            "key": "workload=fio rw=randread bs=4096 iodepth=1 numjobs=2"
        }]),
        "{json}"
    );
    let rows = json["rows"].as_array().unwrap();
    let iops = rows
        .iter()
        .find(|r| r["metric"] == "read.iops")
        .expect("read.iops compared");
    assert_eq!(iops["config"], "randread");
    assert_eq!(
        (iops["a"]["n"].as_u64(), iops["b"]["n"].as_u64()),
        (Some(2), Some(2))
    );
    let text = ok(iolab(&["--db", db, "compare", "1,2", "g3"]));
    assert!(
        text.contains("paired by attributes: configuration randread (A) with lab-randread (B)"),
        "{text}"
    );
    // Another iodepth is another job, the job file's nominal 8 among them (psync ran it at
    // 1): nothing pairs, and the message says how pairs form.
    let other = dir.join("other.toml");
    std::fs::write(&other, example.replace("iodepth = 1", "iodepth = 8")).unwrap();
    ok(iolab(&["--db", db, "run", other.to_str().unwrap()]));
    let out = iolab(&["--db", db, "compare", "1", "5"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("by their workload's attributes"),
        "{}",
        stderr(&out)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sweep_points_pair_by_their_axis_values_and_are_never_pooled() {
    let dir = temp_dir("sweeps");
    let db = dir.join("r.db");
    let db = db.to_str().unwrap();
    let grid = |name: &str, set: &str| {
        let path = dir.join(format!("{name}.toml"));
        std::fs::write(
            &path,
            format!(
                "name = \"{name}\"\nscenario = \"fio-nvme-vtd-strict\"\n[set]\n\
                 \"workload.runtime_ms\" = 2\n\"workload.ramp_ms\" = 1\n{set}\n\
                 [[axis]]\nfield = \"workload.numjobs\"\nvalues = [1, 8]\n"
            ),
        )
        .unwrap();
        ok(iolab(&["--db", db, "sweep", path.to_str().unwrap()]));
    };
    grid("a", "");
    grid("b", "\"iommu.mode\" = \"passthrough\"");
    let out = ok(iolab(&[
        "--db",
        db,
        "compare",
        "sweep:a",
        "sweep:b",
        "--metric",
        "read.iops",
        "--format",
        "json",
    ]));
    let v: Value = serde_json::from_str(&out).expect("JSON");
    let rows = v["rows"].as_array().expect("rows");
    // One row per point, one run a side: numjobs 1 and 8 are not repetitions of each other.
    assert_eq!(rows.len(), 2, "{out}");
    let mut configs: Vec<&str> = rows.iter().map(|r| r["config"].as_str().unwrap()).collect();
    configs.sort_unstable();
    assert!(configs[0].contains("numjobs=1"), "{configs:?}");
    assert!(configs[1].contains("numjobs=8"), "{configs:?}");
    for r in rows {
        assert_eq!(r["a"]["n"], 1, "{r}");
        assert_eq!(r["b"]["n"], 1, "{r}");
    }
    // The text says which point each row is.
    let text = ok(iolab(&[
        "--db",
        db,
        "compare",
        "sweep:a",
        "sweep:b",
        "--metric",
        "read.iops",
    ]));
    assert!(
        text.contains("numjobs=1") && text.contains("numjobs=8"),
        "{text}"
    );
}
