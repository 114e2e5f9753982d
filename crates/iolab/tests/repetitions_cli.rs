//! One meaning of `--runs N` (docs/VOCABULARY.md, Repetitions): `run`, `reproduce` and a
//! sweep's `runs` all mean N repetitions with seeds seed, seed + 1, ..., seed + N - 1, each
//! stored as a run of its own (`run` and `reproduce` in one group); the output gives
//! mean ± sd over them, and `report` a section per group with the spread.

use std::path::Path;

mod common;

use common::{iolab, s, stderr, temp_dir};

fn json(out: &std::process::Output) -> serde_json::Value {
    assert!(out.status.success(), "{}", stderr(out));
    serde_json::from_slice(&out.stdout).expect("JSON on standard output")
}

/// Every stored run as `runs list --format json` gives them.
fn listed(db: &Path) -> Vec<serde_json::Value> {
    let list = json(&iolab(&["--db", s(db), "runs", "list", "--format", "json"]));
    list.as_array().expect("an array").clone()
}

/// `reproduce --runs 2 --seed 5` stores two runs (seeds 5 and 6) in one group, each
/// exactly what `reproduce --seed 5` and `--seed 6` give alone, and prints figures as mean
/// ± sd over them. (Before, it stored one run averaging two repetitions.)
#[test]
fn reproduce_runs_n_stores_a_group_of_n_repetitions_each_equal_to_its_seed_alone() {
    let dir = temp_dir("reproduce-group");
    let db = dir.join("r.db");
    let out = iolab(&[
        "--db",
        s(&db),
        "reproduce",
        "smmuv3-cmdq",
        "--runs",
        "2",
        "--seed",
        "5",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("figures over 2 repetitions (seeds 5..=6): mean ± sd"),
        "{text}"
    );
    assert!(stderr(&out).contains("stored 2 repetitions as group g1"));
    let runs = listed(&db);
    assert_eq!(runs.len(), 2, "{runs:?}");
    for (r, seed) in runs.iter().zip([5, 6]) {
        assert_eq!(r["group_id"], 1);
        assert_eq!(r["seed"], seed);
        assert_eq!(r["runs"], 1, "each repetition is one run");
    }
    // Repetition 2 is the run of seed 6 alone; the JSON mean is the two seeds' mean.
    let figures = |v: &serde_json::Value| -> Vec<f64> {
        v["figures"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["lab"].as_f64().unwrap())
            .collect()
    };
    let alone = |seed: &str| {
        let v = json(&iolab(&[
            "--no-db",
            "reproduce",
            "smmuv3-cmdq",
            "--seed",
            seed,
            "--format",
            "json",
        ]));
        figures(&v["experiments"][0])
    };
    let (five, six) = (alone("5"), alone("6"));
    let stored = json(&iolab(&[
        "--db",
        s(&db),
        "runs",
        "show",
        "2",
        "--format",
        "json",
    ]));
    assert_eq!(figures(&stored), six);
    let mean = json(&iolab(&[
        "--no-db",
        "reproduce",
        "smmuv3-cmdq",
        "--runs",
        "2",
        "--seed",
        "5",
        "--format",
        "json",
    ]));
    let e = &mean["experiments"][0];
    assert_eq!(e["runs"], 2);
    assert_eq!(e["repetitions"]["seeds"], serde_json::json!([5, 6]));
    for ((m, a), b) in figures(e).iter().zip(&five).zip(&six) {
        assert!(
            (m - (a + b) / 2.0).abs() <= 1e-9 * m.abs().max(1.0),
            "{m} {a} {b}"
        );
    }
    // A figure that differs between the seeds has a spread above zero in the JSON.
    let spread = e["repetitions"]["figures"].as_array().unwrap();
    let varies = five.iter().zip(&six).position(|(a, b)| a != b);
    let i = varies.expect("SAS figures depend on the seed");
    assert!(spread[i]["sd"].as_f64().unwrap() > 0.0, "{:?}", spread[i]);
    // The report of the group has a section with the spread.
    let html = dir.join("r.html");
    let out = iolab(&["--db", s(&db), "report", "g1", "-o", s(&html)]);
    assert!(out.status.success(), "{}", stderr(&out));
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(
        page.contains("Group g1: 2 repetitions of smmuv3-cmdq (seeds 5, 6)"),
        "no group section"
    );
    assert!(page.contains("lab mean ± sd"));
}

/// `run --runs 2` prints each repetition and then every headline metric's mean ± sd.
#[test]
fn run_runs_n_prints_the_spread_of_the_metrics() {
    let out = iolab(&[
        "--no-db",
        "run",
        "--example",
        "fio-sas-lockfree",
        "--runs",
        "2",
        "--seed",
        "3",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("over 2 repetitions (seeds 3..=4): mean ± sd"),
        "{text}"
    );
    let iops = text
        .lines()
        .find(|l| l.starts_with("fio-sas-lockfree") && l.contains(" read.iops "))
        .expect("a read.iops row");
    assert!(iops.contains(" ± "), "{iops}");
    assert!(
        !iops.contains(" ± 0 "),
        "the SAS disks vary with the seed: {iops}"
    );
}

/// A sweep's `runs = N` is the seed axis seed..seed+N-1, each repetition a point of its
/// own; with `seeds` as well it is refused.
#[test]
fn a_sweep_s_runs_are_repetitions_with_consecutive_seeds() {
    let dir = temp_dir("sweep-runs");
    let grid = dir.join("g.toml");
    std::fs::write(
        &grid,
        "scenario = \"fio-sas-lockfree\"\nseed = 4\nruns = 2\n\
         [set]\n\"workload.runtime_ms\" = 2\n\"workload.ramp_ms\" = 1\n\
         [[axis]]\nfield = \"workload.iodepth\"\nvalues = [4]\n",
    )
    .unwrap();
    let db = dir.join("s.db");
    let out = iolab(&["--db", s(&db), "sweep", s(&grid), "--jobs", "1"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let runs = listed(&db);
    let seeds: Vec<i64> = runs.iter().map(|r| r["seed"].as_i64().unwrap()).collect();
    assert_eq!(seeds, [4, 5]);
    assert!(runs.iter().all(|r| r["runs"] == 1));
    std::fs::write(
        &grid,
        "scenario = \"fio-sas-lockfree\"\nruns = 2\nseeds = [1, 2]\n",
    )
    .unwrap();
    let out = iolab(&["--no-db", "sweep", s(&grid)]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("`runs = 2` and `seeds` both given"));
}
