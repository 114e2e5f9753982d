//! `iolab import` on real tools' outputs (tests/data, see its README for the commands that
//! made them): what is stored, and that bad files store nothing.

use std::path::Path;
use std::process::Output;

use serde_json::Value;

mod common;

use common::{iolab, stderr, temp_dir};

fn data(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
        .to_str()
        .expect("utf-8 path")
        .to_owned()
}

fn import(db: &str, tool: &str, file: &str) -> Output {
    iolab(&["--db", db, "import", tool, &data(file)])
}

fn show(db: &str, id: i64) -> Value {
    let out = iolab(&[
        "--db",
        db,
        "runs",
        "show",
        &id.to_string(),
        "--format",
        "json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    serde_json::from_slice(&out.stdout).expect("JSON")
}

/// The metric `name` of a stored measurement, if present.
fn metric(m: &Value, name: &str) -> Option<f64> {
    m["metrics"]
        .as_array()
        .expect("metrics")
        .iter()
        .find(|x| x["name"] == name)
        .map(|x| x["value"].as_f64().expect("value"))
}

/// The JSON document of a fio output file (fio prints notes before it).
fn fio_doc(file: &str) -> Value {
    let text = std::fs::read_to_string(data(file)).unwrap();
    let start = text.find("\n{").map_or(0, |i| i + 1);
    serde_json::from_str(&text[start..]).expect("fio JSON")
}

#[test]
fn fio_json_and_json_plus_store_the_files_figures() {
    let dir = temp_dir("fio");
    let db = dir.join("r.db");
    let db = db.to_str().unwrap();
    for (id, file) in [
        (1, "fio-randread-grouped.json"),
        (2, "fio-randread-grouped.jsonplus.json"),
        (3, "fio-randrw.json"),
        (4, "fio-two-jobs.json"),
    ] {
        let out = import(db, "fio", file);
        assert!(out.status.success(), "{file}: {}", stderr(&out));
        let run = show(db, id);
        assert_eq!(run["kind"], "import:fio");
        assert_eq!(run["label"], file);
        let doc = fio_doc(file);
        let jobs = doc["jobs"].as_array().unwrap();
        let ms = run["measurements"].as_array().unwrap();
        assert_eq!(ms.len(), jobs.len(), "{file}: a measurement per job entry");
        for (m, job) in ms.iter().zip(jobs) {
            assert_eq!(m["config"], job["jobname"]);
            assert_eq!(m["attrs"]["workload"], "fio");
            for dir in ["read", "write"] {
                let d = &job[dir];
                let did_io = d["total_ios"].as_u64().unwrap() > 0;
                let iops = metric(m, &format!("{dir}.iops"));
                assert_eq!(iops.is_some(), did_io, "{file} {dir}");
                if did_io {
                    assert_eq!(iops, d["iops"].as_f64());
                    assert_eq!(
                        metric(m, &format!("{dir}.bw_bytes_per_s")),
                        d["bw_bytes"].as_f64()
                    );
                    assert_eq!(
                        metric(m, &format!("{dir}.clat_mean_ns")),
                        d["clat_ns"]["mean"].as_f64()
                    );
                    assert_eq!(
                        metric(m, &format!("{dir}.clat_p99_ns")),
                        d["clat_ns"]["percentile"]["99.000000"].as_f64()
                    );
                }
            }
            assert_eq!(metric(m, "cpu.sys_pct"), job["sys_cpu"].as_f64());
            // json+ carries fio's latency bins: the histogram holds every completion.
            let bins = job["read"]["clat_ns"].get("bins");
            match bins {
                Some(bins) => {
                    let h = &m["latency"]["buckets"];
                    let count: u64 = h
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|b| b[1].as_u64().unwrap())
                        .sum();
                    let bin_sum: u64 = bins
                        .as_object()
                        .unwrap()
                        .values()
                        .map(|v| v.as_u64().unwrap())
                        .sum();
                    assert_eq!(count, bin_sum);
                    assert_eq!(count, job["read"]["clat_ns"]["N"].as_u64().unwrap());
                }
                None => assert!(m["latency"].is_null(), "{file}: json has no bins"),
            }
        }
    }
    // The two non-grouped jobs of one file are two configurations of one run.
    let two = show(db, 4);
    let configs: Vec<&str> = two["measurements"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["config"].as_str().unwrap())
        .collect();
    assert_eq!(configs, ["seqread", "randwrite"]);
    // runs show (text) prints a table per measurement, with the histogram's summary.
    let out = iolab(&["--db", db, "runs", "show", "2"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("measurement randread"), "{text}");
    assert!(text.contains("read.clat_p99_ns"), "{text}");
    assert!(text.contains("latency histogram (72328 samples"), "{text}");
    // Values read with their units, and each of the two p50s says what it is.
    assert!(text.contains("bucket upper bounds"), "{text}");
    let p50 = text
        .lines()
        .find(|l| l.trim_start().starts_with("read.clat_p50_ns"))
        .unwrap_or_default();
    assert!(p50.ends_with(" us") || p50.ends_with(" ms"), "{p50}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bonnie_rows_become_runs_and_plus_fields_stay_absent() {
    let dir = temp_dir("bonnie");
    let db = dir.join("r.db");
    let db = db.to_str().unwrap();
    // bonnie++ 2.00a, one row (format 1.98): get_block is `+++++`.
    let out = import(db, "bonnie", "bonnie-2.00a.csv");
    assert!(out.status.success(), "{}", stderr(&out));
    let run = show(db, 1);
    assert!(run["group_id"].is_null(), "a single row is no group");
    let m = &run["measurements"][0];
    assert_eq!(m["config"], "vm");
    assert_eq!(m["attrs"]["bonnie_version"], "2.00a");
    assert_eq!(metric(m, "bonnie.out_char_kps"), Some(319.0));
    assert_eq!(metric(m, "bonnie.out_block_kps"), Some(369242.0));
    assert_eq!(metric(m, "bonnie.seeks_per_s"), Some(15173.0));
    assert_eq!(metric(m, "bonnie.in_block_kps"), None, "+++++ is absent");
    assert_eq!(metric(m, "bonnie.in_block_cpu_pct"), None, "+++ is absent");
    assert_eq!(metric(m, "bonnie.seq_create_per_s"), Some(1927.0));
    assert_eq!(metric(m, "bonnie.out_char_latency_ns"), Some(221e6));
    assert_eq!(metric(m, "bonnie.seq_read_latency_ns"), Some(53e3));

    // Two rows (`-x 2`, with bonnie's header line): two runs in one group.
    let out = import(db, "bonnie", "bonnie-2.00a-x2.csv");
    assert!(out.status.success(), "{}", stderr(&out));
    let (a, b) = (show(db, 2), show(db, 3));
    assert_eq!(
        (a["group_id"].as_i64(), b["group_id"].as_i64()),
        (Some(2), Some(2))
    );
    assert_eq!(metric(&a["measurements"][0], "bonnie.in_block_kps"), None);
    assert_eq!(
        metric(&b["measurements"][0], "bonnie.in_block_kps"),
        Some(571116.0)
    );

    // bonnie++ 1.03 rows (SEEDS.md #1).
    let out = import(db, "bonnie", "bonnie-1.03-ipmmu-usb-iommu.csv");
    assert!(out.status.success(), "{}", stderr(&out));
    let ss = show(db, 4);
    let m = &ss["measurements"][0];
    assert_eq!(m["config"], "superspeed");
    assert_eq!(metric(m, "bonnie.out_block_kps"), Some(276686.0));
    assert_eq!(metric(m, "bonnie.out_block_cpu_pct"), Some(65.0));
    assert_eq!(metric(m, "bonnie.seeks_per_s"), Some(2099.2));
    assert_eq!(metric(m, "bonnie.seq_create_per_s"), None, "empty field");
    assert_eq!(show(db, 5)["measurements"][0]["config"], "highspeed");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn reaim_table_rows_become_measurements() {
    let dir = temp_dir("reaim");
    let db = dir.join("r.db");
    let db = db.to_str().unwrap();
    let out = import(db, "reaim", "reaim-sba-vmerge-vmerge.txt");
    assert!(out.status.success(), "{}", stderr(&out));
    let run = show(db, 1);
    assert_eq!(run["kind"], "import:reaim");
    let ms = run["measurements"].as_array().unwrap();
    let jpm: Vec<f64> = ms
        .iter()
        .map(|m| metric(m, "reaim.jobs_per_min").unwrap())
        .collect();
    assert_eq!(jpm, [5684.17, 5679.16, 5678.81, 5684.46, 5672.92]);
    assert_eq!(ms[2]["config"], "users_300");
    assert_eq!(ms[2]["attrs"]["users"], 300, "typed, as stored");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn malformed_and_truncated_files_store_nothing_and_exit_2() {
    let dir = temp_dir("bad");
    let db = dir.join("r.db");
    let db = db.to_str().unwrap();
    let out = import(db, "fio", "fio-randrw.json");
    assert!(out.status.success(), "{}", stderr(&out));
    let before = std::fs::read(db).unwrap();
    for (tool, file, says) in [
        (
            "fio",
            "fio-truncated.json",
            "line 498, column 5: the file ends inside",
        ),
        (
            "fio",
            "fio-malformed.json",
            "field `jobs[0].read.iops`: expected a number",
        ),
        (
            "bonnie",
            "bonnie-2.00a-truncated.csv",
            "line 3: expected 50 comma-separated columns",
        ),
        (
            "bonnie",
            "bonnie-1.03-truncated.csv",
            "line 2: expected 27 comma-separated columns",
        ),
        (
            "bonnie",
            "bonnie-1.03-malformed.csv",
            "line 1, field `out_block_kps`",
        ),
        ("reaim", "reaim-truncated.txt", "line 7: expected 9 columns"),
        (
            "reaim",
            "reaim-malformed.txt",
            "line 6, field `Parent Time`",
        ),
        // The wrong tool for a file is malformed input too.
        ("bonnie", "reaim-sba-vmerge-vmerge.txt", "line 1"),
        ("reaim", "fio-randrw.json", "no re-aim table header"),
    ] {
        let out = import(db, tool, file);
        assert_eq!(out.status.code(), Some(2), "{file}: {}", stderr(&out));
        let err = stderr(&out);
        assert_eq!(err.lines().count(), 1, "one message: {err}");
        assert!(err.contains(file) && err.contains(says), "{file}: {err}");
        assert!(out.stdout.is_empty());
        assert_eq!(
            std::fs::read(db).unwrap(),
            before,
            "{file}: database unchanged"
        );
    }
    let out = iolab(&["--db", db, "import", "fio", "/nonexistent/fio.json"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("cannot read /nonexistent/fio.json"));
    assert_eq!(std::fs::read(db).unwrap(), before);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `iolab run --format json` of an fio scenario is fio's JSON, which `iolab import fio`
/// reads back: the imported run's figures are the lab run's, the lab's own figures ride in
/// the `iolab` object, and fio's field names are there for other fio readers.
#[test]
fn a_lab_fio_json_document_imports_back_with_the_lab_s_figures() {
    let dir = temp_dir("roundtrip");
    let db = dir.join("r.db");
    let db = db.to_str().unwrap();
    let out = iolab(&[
        "--db",
        db,
        "run",
        "--example",
        "fio-nvme-strict",
        "--format",
        "json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let doc: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert!(
        doc["fio version"].as_str().unwrap().starts_with("iolab-"),
        "{doc}"
    );
    let job = &doc["jobs"][0];
    assert_eq!(job["jobname"], "fio-nvme-strict");
    assert_eq!(job["job options"]["rw"], "randread");
    assert_eq!(job["job options"]["bs"], "4096");
    assert_eq!(job["job options"]["iodepth"], "32");
    assert_eq!(job["job options"]["numjobs"], "16");
    for key in ["bw_bytes", "io_kbytes", "slat_ns", "lat_ns", "total_ios"] {
        assert!(!job["read"][key].is_null(), "read.{key}: {job}");
    }
    assert_eq!(job["read"]["clat_ns"]["N"], job["read"]["total_ios"]);
    assert!(job["trim"].is_object());
    let extra = &job["iolab"];
    assert_eq!(extra["attributes"]["iommu_mode"], "strict");
    assert_eq!(extra["attributes"]["iodepth"], 32, "attributes are typed");
    assert_eq!(extra["metrics"]["protection.stale_hits"]["unit"], "count");
    assert!(extra["metrics"]["dma.map_ns"]["value"].as_f64().unwrap() > 0.0);
    assert!(
        extra["metrics"]["read.iops"].is_null(),
        "fio's own fields carry it"
    );

    let file = dir.join("lab.json");
    std::fs::write(&file, &out.stdout).unwrap();
    let out = iolab(&["--db", db, "import", "fio", file.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let (lab, imported) = (show(db, 1), show(db, 2));
    let (lm, im) = (&lab["measurements"][0], &imported["measurements"][0]);
    assert_eq!(im["config"], lm["config"]);
    assert_eq!(metric(im, "read.iops"), metric(lm, "read.iops"));
    assert!(metric(im, "read.iops").unwrap() > 100_000.0);
    for name in [
        "read.clat_mean_ns",
        "read.clat_p99_ns",
        "cpu.sys_pct",
        "dma.map_ns",
        "protection.max_reachable_after_unmap_ns",
        "iotlb.walk_reads_per_io",
    ] {
        assert_eq!(metric(im, name), metric(lm, name), "{name}");
    }
    assert_eq!(im["attrs"]["iommu_mode"], "strict");
    assert_eq!(im["attrs"]["fio_version"], doc["fio version"]);
    let _ = std::fs::remove_dir_all(&dir);
}
