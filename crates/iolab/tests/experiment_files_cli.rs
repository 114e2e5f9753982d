//! Experiment files through the CLI (docs/EXPERIMENTS.md): a user's own file with published
//! values taken from an imported run, `--emit-scenarios` files that `iolab run` accepts,
//! and clear errors (exit 2) for bad files.

mod common;

use common::{iolab, s, stderr, temp_dir};

const DATA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data");
const WORKED_EXAMPLE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../docs/examples/vm-disk-experiment.toml"
);

#[test]
fn the_worked_example_holds_the_lab_against_an_imported_fio_run() {
    let dir = temp_dir("worked");
    let db = dir.join("mine.db");
    let fio = format!("{DATA}/fio-randread-grouped.json");
    let out = iolab(&["--db", s(&db), "import", "fio", &fio]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = iolab(&[
        "--db",
        s(&db),
        "reproduce",
        WORKED_EXAMPLE,
        "--format",
        "json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let exp = &json["experiments"][0];
    assert_eq!(exp["name"], "vm-disk");
    let fig = |id: &str| {
        exp["figures"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["id"] == id)
            .unwrap_or_else(|| panic!("figure {id}"))
            .clone()
    };
    // The published values are the imported run's, in the figure's unit.
    let iops = fig("vm.off.iops");
    assert!(
        (iops["published"].as_f64().unwrap() - 21140.438).abs() < 0.01,
        "{iops}"
    );
    assert_eq!(iops["role"], "calibration");
    let clat = fig("vm.off.clat_mean");
    assert!(
        (clat["published"].as_f64().unwrap() - 93.406).abs() < 0.001,
        "{clat}"
    );
    // The calibrated latency brings the IOPS within 0.1% of the measured run.
    let lab = iops["lab"].as_f64().unwrap();
    assert!((lab - 21140.438).abs() / 21140.438 < 0.001, "{lab}");
    assert_eq!(
        fig("vm.vtd_strict.iops")["published"],
        serde_json::Value::Null
    );
    // The lock file beside the example holds the fit: refitting a copy gives its values.
    let copy = dir.join("vm-disk-experiment.toml");
    std::fs::copy(WORKED_EXAMPLE, &copy).unwrap();
    let out = iolab(&["--db", s(&db), "reproduce", "--refit", s(&copy)]);
    assert!(out.status.success(), "{}", stderr(&out));
    let values = |path: &std::path::Path| {
        let t: toml::Table = toml::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        t["fitted"].clone()
    };
    assert_eq!(
        values(&dir.join("vm-disk-experiment.fit.toml")),
        values(std::path::Path::new(&WORKED_EXAMPLE.replace(".toml", ".fit.toml"))),
        "docs/examples/vm-disk-experiment.fit.toml is no longer the fit: refit it (docs/EXPERIMENTS.md)"
    );
    // Without the database the stored values cannot be read: a clear refusal.
    let out = iolab(&["--no-db", "reproduce", WORKED_EXAMPLE]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("published_from"), "{}", stderr(&out));
    // A run id that is not stored names the figure's field and the file.
    let other = dir.join("other.db");
    let out = iolab(&["--db", s(&other), "import", "fio", &fio]);
    assert!(out.status.success());
    let text = std::fs::read_to_string(WORKED_EXAMPLE)
        .unwrap()
        .replace("run = 1,", "run = 9,");
    let bad = dir.join("bad.toml");
    std::fs::write(&bad, text).unwrap();
    let out = iolab(&["--db", s(&other), "reproduce", s(&bad)]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(
        err.contains("figures[0].published_from") && err.contains("run 9"),
        "{err}"
    );
}

#[test]
fn emitted_scenarios_run_with_iolab_run_and_measure_the_reproduced_cells() {
    let dir = temp_dir("emit");
    let out = iolab(&[
        "--no-db",
        "reproduce",
        "smmuv3-cmdq",
        "--emit-scenarios",
        s(&dir),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let listed = String::from_utf8_lossy(&out.stdout).into_owned();
    let files: Vec<&str> = listed.lines().collect();
    assert_eq!(files.len(), 7, "{listed}");
    assert!(dir.join("smmuv3-cmdq/d05_sas8.spinlock.toml").is_file());
    // The reproduced cell and the emitted file run through `iolab run` agree exactly.
    let out = iolab(&["--no-db", "reproduce", "smmuv3-cmdq", "--format", "json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let rep: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let reproduced = rep["experiments"][0]["figures"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["id"] == "d05_nvme.lockfree")
        .unwrap()["lab"]
        .as_f64()
        .unwrap();
    let file = dir.join("smmuv3-cmdq/d05_nvme.lockfree.toml");
    let out = iolab(&["--no-db", "run", s(&file), "--format", "json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let run: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let iops = run["jobs"][0]["read"]["iops"].as_f64().unwrap();
    assert_eq!(iops, reproduced);
}

/// The lab's own `protection` experiment: run only when named, its cells emitted as scenarios
/// `iolab run` accepts, the hostile device's figures the same through both.
#[test]
fn protection_runs_when_named_and_its_emitted_cells_report_the_same_exposure() {
    let out = iolab(&["--no-db", "reproduce", "--format", "json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let all: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let names: Vec<&str> = all["experiments"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert!(!names.contains(&"protection"), "{names:?}");
    let dir = temp_dir("emit-protection");
    let out = iolab(&[
        "--no-db",
        "reproduce",
        "protection",
        "--emit-scenarios",
        s(&dir),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 8);
    let out = iolab(&["--no-db", "reproduce", "protection", "--format", "json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let rep: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let lab = |id: &str| {
        rep["experiments"][0]["figures"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["id"] == id)
            .unwrap_or_else(|| panic!("no figure {id}"))["lab"]
            .as_f64()
            .unwrap()
    };
    let file = dir.join("protection/d06.lazy.toml");
    let out = iolab(&["--no-db", "run", s(&file)]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    let stale = lab("d06.lazy.stale_reads");
    assert!(stale > 0.0);
    assert!(
        text.contains(&format!("hostile      : stale reads={stale}/")),
        "{text}"
    );
}

#[test]
fn bad_experiment_files_name_the_file_and_field_with_exit_code_2() {
    let dir = temp_dir("bad");
    let base = std::fs::read_to_string(WORKED_EXAMPLE).unwrap();
    let cases: [(&str, &str, &str); 6] = [
        ("cell = \"vm.off\"", "cell = \"vm.on\"", "figures[0].cell"),
        (
            "role = \"calibration\"",
            "role = \"prediction\"",
            "calibrations[0].fitted_to[0]",
        ),
        ("layout = \"figures\"", "layout = \"bars\"", "report.layout"),
        ("{fig:vm.off.clat_p50}", "{fig:nope}", "report.notes[0]"),
        (
            "set = { iommu = { model = \"vtd\", mode = \"strict\" } }",
            "set = { iommu = { model = \"vtd\", mode = \"ddw-dynamic\" } }",
            "iommu.mode",
        ),
        ("numjobs = 2", "numjobs = 0", "workload.numjobs"),
    ];
    for (i, (from, to, field)) in cases.iter().enumerate() {
        assert!(base.contains(from), "case {i}: {from}");
        let path = dir.join(format!("case{i}.toml"));
        std::fs::write(&path, base.replacen(from, to, 1)).unwrap();
        let out = iolab(&["--no-db", "reproduce", s(&path)]);
        assert_eq!(out.status.code(), Some(2), "case {i}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(
            err.contains(field) && err.contains("case"),
            "case {i}: expected `{field}` and the file in: {err}"
        );
        assert_eq!(
            err.trim().lines().count(),
            1,
            "case {i}: one message: {err}"
        );
    }
    // A workload scenario is not an experiment file.
    let scenario = dir.join("scenario.toml");
    std::fs::write(
        &scenario,
        "[machine]\nplatform = \"hisilicon-d05\"\n[iommu]\nmodel = \"none\"\n",
    )
    .unwrap();
    let out = iolab(&["--no-db", "reproduce", s(&scenario)]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("iolab run"), "{}", stderr(&out));
}
