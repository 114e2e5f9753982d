//! `iolab run` on workload scenarios as a user runs it: exit codes, messages, output shapes
//! and what reaches the results database.

use std::path::{Path, PathBuf};

mod common;

use common::{iolab, s, stderr, stored_scenario_text, temp_dir};

fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../../scenarios/examples/{name}.toml"))
}

#[test]
fn a_bad_scenario_is_bad_input_naming_file_line_and_field_and_stores_nothing() {
    let dir = temp_dir("bad");
    let db = dir.join("results.db");
    let text = std::fs::read_to_string(example("fio-nvme-strict"))
        .unwrap()
        .replace("bs = 4096", "bs = 1000");
    let bad = dir.join("bad.toml");
    std::fs::write(&bad, text).unwrap();
    let out = iolab(&["run", s(&bad), "--db", s(&db)]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("bad.toml"), "{err}");
    assert!(err.contains("at line 23"), "{err}");
    assert!(err.contains("workload.bs"), "{err}");
    assert!(err.contains("multiple of 512"), "{err}");
    assert_eq!(err.lines().count(), 1, "one message: {err}");
    assert!(out.stdout.is_empty());
    assert!(!db.exists(), "a refused scenario creates no database");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_cap_exceeded_is_bad_input() {
    let dir = temp_dir("cap");
    let text = std::fs::read_to_string(example("fio-nvme-strict"))
        .unwrap()
        .replace("cpus = 32", "cpus = 4096");
    let bad = dir.join("big.toml");
    std::fs::write(&bad, text).unwrap();
    let out = iolab(&["--no-db", "run", s(&bad)]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(
        err.contains("machine.cpus") && err.contains("MAX_CPUS"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_missing_file_and_an_unknown_example_are_bad_input() {
    let out = iolab(&["--no-db", "run", "/nonexistent/scenario.toml"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("/nonexistent/scenario.toml"));
    let out = iolab(&["--no-db", "run", "--example", "no-such-example"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("fio-nvme-strict"), "{}", stderr(&out));
}

#[test]
fn fio_json_has_fio_s_shape() {
    let out = iolab(&[
        "--no-db",
        "run",
        s(&example("fio-nvme-strict")),
        "--format",
        "json",
        "--runs",
        "2",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    let jobs = v["jobs"].as_array().expect("jobs[]");
    assert_eq!(jobs.len(), 2, "one job group per run");
    for job in jobs {
        let read = &job["read"];
        let num = |v: &serde_json::Value| v.as_f64().unwrap_or_else(|| panic!("a number: {v}"));
        // fio's units: `runtime` in ms, `bw` in KiB/s, `iops` per second, `io_bytes` the
        // bytes moved; the example runs 4 KiB reads for 20 ms.
        let (ios, bytes) = (num(&read["total_ios"]), num(&read["io_bytes"]));
        assert_eq!(read["runtime"], 20);
        let secs = 0.020;
        assert!(ios > 1000.0, "{read}");
        assert_eq!(bytes, ios * 4096.0, "every I/O moves bs bytes");
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * b;
        assert!(close(num(&read["iops"]), ios / secs), "iops: {read}");
        // fio writes `bw` as whole KiB/s.
        assert!(
            (num(&read["bw"]) - bytes / 1024.0 / secs).abs() <= 0.5,
            "bw: {read}"
        );
        // Latencies: min <= mean <= max, the percentiles ordered and within [min, max].
        let clat = &read["clat_ns"];
        let (min, mean, max) = (num(&clat["min"]), num(&clat["mean"]), num(&clat["max"]));
        assert!(0.0 < min && min <= mean && mean <= max, "{clat}");
        let mut last = min;
        for p in ["1.000000", "50.000000", "99.000000", "99.990000"] {
            let v = num(&clat["percentile"][p]);
            assert!(last <= v && v <= max, "percentile {p}: {clat}");
            last = v;
        }
        assert!(job["usr_cpu"].as_f64().unwrap() > 0.0);
        assert!(job["sys_cpu"].as_f64().unwrap() > 0.0);
        assert_eq!(job["write"]["total_ios"], 0, "randread writes nothing");
    }
    assert_eq!(jobs[0]["jobname"], "fio-nvme-strict#0");
}

#[test]
fn the_text_is_fio_s_summary_and_the_same_seed_gives_the_same_bytes() {
    let a = iolab(&[
        "--no-db",
        "run",
        "--example",
        "fio-nvme-lazy",
        "--seed",
        "3",
    ]);
    let b = iolab(&[
        "--no-db",
        "run",
        s(&example("fio-nvme-lazy")),
        "--seed",
        "3",
    ]);
    assert!(a.status.success() && b.status.success());
    assert_eq!(
        a.stdout, b.stdout,
        "bundled example and file are the same run"
    );
    let text = String::from_utf8_lossy(&a.stdout);
    assert!(text.contains("(groupid=0, jobs=16)"), "{text}");
    assert!(text.contains("read: IOPS="), "{text}");
    assert!(text.contains("smmuv3 lazy"), "{text}");
    // Bandwidth as fio writes it: binary units, then SI ones, then the I/O size
    // (`BW=3008MiB/s (3154MB/s)(60.0MiB/20msec)`), never fio-foreign kB/s in full.
    let bw = text
        .lines()
        .find(|l| l.contains("read: IOPS="))
        .and_then(|l| l.split("BW=").nth(1))
        .unwrap_or_default();
    assert!(
        bw.contains("MiB/s (") && bw.contains("MB/s)(") && bw.contains("MiB/"),
        "{bw}"
    );
    assert!(!bw.contains("kB/s"), "{bw}");
    // The reachable window in a unit that suits it, not raw nanoseconds.
    let window = text
        .split("max reachable after unmap=")
        .nth(1)
        .and_then(|t| t.split(',').next())
        .unwrap_or_default();
    assert!(
        window.ends_with(" ms") || window.ends_with(" us"),
        "{window}"
    );
}

#[test]
fn non_fio_json_lists_the_measurements() {
    let out = iolab(&[
        "--no-db",
        "run",
        "--example",
        "bonnie-usb-ipmmu",
        "--format",
        "json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    assert_eq!(v["name"], "bonnie-usb-ipmmu");
    let m = &v["measurements"][0];
    assert_eq!(m["attrs"]["workload"], "bonnie");
    assert_eq!(m["attrs"]["iommu_model"], "ipmmu");
    let names: Vec<&str> = m["metrics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"bonnie.out_block_kps"), "{names:?}");
}

#[test]
fn a_lab_run_is_stored_with_its_scenario_and_seed() {
    let dir = temp_dir("store");
    let db = dir.join("results.db");
    let scenario = example("fio-sas-sba");
    let out = iolab(&["run", s(&scenario), "--db", s(&db)]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("stored as run 1 in"),
        "{}",
        stderr(&out)
    );
    let out = iolab(&["--db", s(&db), "runs", "show", "1", "--format", "json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let run: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    assert_eq!(run["seed"], 1, "the scenario's own seed");
    assert_eq!(run["scenario_origin"], s(&scenario));
    // The scenario's text is stored with the run, byte for byte.
    assert_eq!(
        stored_scenario_text(&db, 1),
        Some(std::fs::read_to_string(&scenario).unwrap())
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_scenario_with_an_unknown_experiment_key_is_bad_input_naming_what_runs() {
    let dir = temp_dir("exp");
    let bad = dir.join("exp.toml");
    std::fs::write(&bad, "experiment = \"no-such\"\n").unwrap();
    let out = iolab(&["--no-db", "run", s(&bad)]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(
        err.contains("exp.toml") && err.contains("field `experiment`"),
        "{err}"
    );
    // The names that do run, with the command that runs them.
    assert!(
        err.contains("iolab reproduce NAME") && err.contains("smmuv3-cmdq"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn reaim_prints_the_reaim_table_and_a_bad_ramp_is_bad_input() {
    let out = iolab(&["--no-db", "run", "--example", "reaim-scsi-sba"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("Num     Parent"), "{text}");
    assert!(text.contains("Max Jobs per Minute"), "{text}");
    let rows = iolab_sim::workloads::reaim::parse_table(&text);
    assert_eq!(rows.len(), 4, "{text}");
    let dir = temp_dir("reaim-bad");
    let bad = dir.join("bad.toml");
    let t = std::fs::read_to_string(example("reaim-scsi-sba"))
        .unwrap()
        .replace("increment = 2", "increment = 0");
    std::fs::write(&bad, t).unwrap();
    let out = iolab(&["--no-db", "run", s(&bad)]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("workload.increment") && err.contains("bad.toml"),
        "{err}"
    );
}

#[test]
fn fio_style_sizes_read_as_their_bytes() {
    let dir = temp_dir("sizes");
    let text = std::fs::read_to_string(example("fio-nvme-strict")).unwrap();
    let plain = iolab(&["--no-db", "run", s(&example("fio-nvme-strict"))]);
    assert!(plain.status.success(), "{}", stderr(&plain));
    for written in ["\"4k\"", "\"4K\""] {
        let f = dir.join("k.toml");
        std::fs::write(&f, text.replace("bs = 4096", &format!("bs = {written}"))).unwrap();
        let out = iolab(&["--no-db", "run", s(&f)]);
        assert!(out.status.success(), "{written}: {}", stderr(&out));
        assert_eq!(out.stdout, plain.stdout, "bs = {written} runs as bs = 4096");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_bad_size_is_bad_input_naming_the_field() {
    let dir = temp_dir("badsize");
    let text = std::fs::read_to_string(example("fio-nvme-strict")).unwrap();
    for (written, says) in [
        ("\"4x\"", "Invalid size \"4x\""),
        ("\"\"", "Empty size"),
        ("\"-4k\"", "Negative size \"-4k\""),
        ("-4", "Negative size \"-4\""),
        ("\"99999999999t\"", "too large"),
    ] {
        let f = dir.join("bad.toml");
        std::fs::write(&f, text.replace("bs = 4096", &format!("bs = {written}"))).unwrap();
        let out = iolab(&["--no-db", "run", s(&f)]);
        assert_eq!(out.status.code(), Some(2), "{written}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(err.contains("workload.bs"), "{written}: {err}");
        assert!(err.contains("at line 23"), "{written}: {err}");
        assert!(err.contains(says), "{written}: {err}");
        assert_eq!(err.lines().count(), 1, "one message: {err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn iommu_mode_none_is_an_alias_of_off_and_prints_as_off() {
    let dir = temp_dir("none");
    let db = dir.join("r.db");
    let text = std::fs::read_to_string(example("fio-nvme-off")).unwrap();
    let off = iolab(&["--no-db", "run", s(&example("fio-nvme-off"))]);
    assert!(off.status.success(), "{}", stderr(&off));
    for (model, mode) in [("none", "none"), ("none", "off"), ("smmuv3", "none")] {
        let f = dir.join(format!("{model}-{mode}.toml"));
        let t = text.replace(
            "model = \"none\"",
            &format!("model = \"{model}\"\nmode = \"{mode}\""),
        );
        std::fs::write(&f, t).unwrap();
        let out = iolab(&["--db", s(&db), "run", s(&f), "--format", "json"]);
        assert!(out.status.success(), "{model}/{mode}: {}", stderr(&out));
    }
    // Stored and printed as `off`, whichever way it was written.
    let out = iolab(&["--db", s(&db), "runs", "show", "1-3", "--format", "json"]);
    let runs: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    for r in runs.as_array().unwrap() {
        assert_eq!(r["measurements"][0]["attrs"]["iommu_mode"], "off", "{r}");
    }
    // model none with mode none runs exactly as the bundled off example.
    let f = dir.join("none-none.toml");
    let out = iolab(&["--no-db", "run", s(&f)]);
    assert_eq!(out.stdout, off.stdout);
    // A model with no `off` refuses the alias as it refuses `off`.
    let f = dir.join("pseries.toml");
    std::fs::write(
        &f,
        text.replace("model = \"none\"", "model = \"pseries\"\nmode = \"none\""),
    )
    .unwrap();
    let out = iolab(&["--no-db", "run", s(&f)]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("does not apply"), "{}", stderr(&out));
    let _ = std::fs::remove_dir_all(&dir);
}

/// `run --runs N` draws a bar over its repetitions on a terminal (standard error, via
/// `script`'s pseudo-terminal; skipped without `script`), and none off a terminal.
#[test]
fn repetitions_show_progress_on_a_terminal_only() {
    let example = example("fio-nvme-strict");
    let out = iolab(&["--no-db", "run", s(&example), "--runs", "3"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!stderr(&out).contains("repetitions,"), "{}", stderr(&out));
    let command = format!(
        "{} --no-db run {} --runs 3",
        env!("CARGO_BIN_EXE_iolab"),
        s(&example)
    );
    let Ok(out) = std::process::Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .output()
    else {
        eprintln!("no `script` here: the terminal half is skipped");
        return;
    };
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(shown.contains("/3 repetitions"), "{shown}");
    assert!(shown.contains("== fio-nvme-strict"), "{shown}");
}

/// Repetitions that measured exactly the same say so (the configuration is deterministic:
/// nothing it measures depends on the seed's draws); ones that differ, or a single run, do
/// not.
#[test]
fn identical_repetitions_say_the_configuration_is_deterministic() {
    let note = "runs gave identical figures";
    let run = |name: &str, runs: &str| {
        let example = example(name);
        let out = iolab(&["--no-db", "run", s(&example), "--runs", runs]);
        assert!(out.status.success(), "{}", stderr(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    // The kernel's DMA-mapping benchmark draws nothing from the seed.
    let bench = run("dma-map-benchmark-strict", "2");
    assert!(bench.contains(&format!("note: the 2 {note}")), "{bench}");
    assert!(bench.contains("deterministic"), "{bench}");
    assert!(!run("dma-map-benchmark-strict", "1").contains(note));
    // The NVMe drive's media latencies are drawn from the seed (docs/MODEL.md): its
    // repetitions differ, as the SAS disks' do (service depends on where each I/O lands).
    assert!(!run("fio-nvme-strict", "2").contains(note));
    assert!(!run("fio-sas-lockfree", "2").contains(note));
}

#[test]
fn the_fio_text_says_where_the_iommus_time_goes() {
    let out = common::iolab(&["--no-db", "run", "--example", "fio-nvme-amdvi-strict"]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.starts_with("  iommu time   : "))
        .unwrap_or_else(|| panic!("no iommu time line in\n{text}"));
    // AMD-Vi strict: CPUs spin on the domain lock around each completion wait, wait for
    // the wait's completion, and the IOMMU walks the tables on each fresh mapping.
    assert!(
        line.contains("spin ") && line.contains("amdvi_dom_lock"),
        "{line}"
    );
    assert!(
        line.contains("sync wait ") && line.contains("walk reads "),
        "{line}"
    );
}
