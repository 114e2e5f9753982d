//! `iolab sweep` as a user meets it: grids over the bundled example fio-sas-lockfree (the
//! smmuv3-cmdq experiment's D05 SAS array, shortened with `[set]`), points stored with their
//! axis values, shards, and bad grids.

use std::path::{Path, PathBuf};

use rusqlite::Connection;

mod common;

use common::{iolab, s, stderr, temp_dir};

/// Fixed fields that make each run short (5 ms measured after a 1 ms ramp).
const SHORT: &str = r#"
[set]
"workload.runtime_ms" = 5
"workload.ramp_ms" = 1
"#;

/// The bundled example every grid here sweeps.
const BASE: &str = "fio-sas-lockfree";

/// A 2 x 2 grid: the jobs' iodepth (slowest), then the command batch size (a field the
/// base leaves at its default).
fn write_grid(dir: &Path) -> PathBuf {
    let grid = dir.join("grid.toml");
    let text = format!(
        "name = \"depth-batch\"\nscenario = \"{BASE}\"\nseed = 7\n{SHORT}\n\
         [[axis]]\nfield = \"workload.iodepth\"\nvalues = [4, 32]\n\n\
         [[axis]]\nfield = \"iommu.cmdq_batch_max\"\nvalues = [2, 64]\n"
    );
    std::fs::write(&grid, text).unwrap();
    grid
}

/// `(point, axes JSON, scenario text, seed)` of every stored sweep point, by point.
fn points(db: &Path) -> Vec<(i64, String, String, i64)> {
    let c = Connection::open(db).unwrap();
    let mut st = c
        .prepare(
            "SELECT p.point, p.axes, r.scenario_text, r.seed FROM sweep_points p
             JOIN runs r ON r.id = p.run_id ORDER BY p.point",
        )
        .unwrap();
    let rows = st
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))
        .unwrap();
    rows.collect::<Result<_, _>>().unwrap()
}

/// Metric `name` of the run stored for sweep point `point`.
fn metric(db: &Path, point: i64, name: &str) -> f64 {
    let c = Connection::open(db).unwrap();
    c.query_row(
        "SELECT m.value FROM metrics m JOIN sweep_points p ON p.run_id = m.run_id
         WHERE p.point = ?1 AND m.name = ?2",
        rusqlite::params![point, name],
        |r| r.get(0),
    )
    .unwrap()
}

#[test]
fn every_point_is_stored_with_its_axis_values_and_equals_iolab_run_of_its_scenario() {
    let dir = temp_dir("full");
    let grid = write_grid(&dir);
    let db = dir.join("r.db");
    let out = iolab(&["--db", s(&db), "sweep", s(&grid), "--jobs", "2"]);
    assert!(out.status.success(), "{}", stderr(&out));
    // Where the points went is a note on standard error, as `iolab run`'s "stored as run";
    // standard output is the result table, a row per point and configuration.
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.starts_with("sweep depth-batch ("), "{table}");
    assert!(
        table
            .lines()
            .nth(1)
            .is_some_and(|h| h.starts_with("point  workload.iodepth  iommu.cmdq_batch_max  config")),
        "{table}"
    );
    for point in 0..4 {
        assert!(
            table
                .lines()
                .any(|l| l.split_whitespace().next() == Some(&point.to_string())),
            "point {point}: {table}"
        );
    }
    let stdout = String::from_utf8_lossy(&out.stderr);
    assert!(stdout.contains("4 of 4 points run"), "{stdout}");

    let pts = points(&db);
    let axes: Vec<&str> = pts.iter().map(|p| p.1.as_str()).collect();
    // First axis slowest, in the order of the values.
    assert_eq!(
        axes,
        [
            r#"{"iommu.cmdq_batch_max":2,"workload.iodepth":4}"#,
            r#"{"iommu.cmdq_batch_max":64,"workload.iodepth":4}"#,
            r#"{"iommu.cmdq_batch_max":2,"workload.iodepth":32}"#,
            r#"{"iommu.cmdq_batch_max":64,"workload.iodepth":32}"#,
        ]
    );
    assert!(
        pts.iter().all(|p| p.3 == 7),
        "the grid's seed is every point's seed"
    );

    // The stored text is the base scenario with the axes and the [set] fields applied.
    let text: toml::Table = toml::from_str(&pts[1].2).unwrap();
    assert_eq!(text["iommu"]["cmdq_batch_max"].as_integer(), Some(64));
    assert_eq!(text["workload"]["iodepth"].as_integer(), Some(4));
    assert_eq!(text["workload"]["runtime_ms"].as_integer(), Some(5));

    // A point is exactly what `iolab run` makes of its scenario with its seed.
    let point_file = dir.join("point1.toml");
    std::fs::write(&point_file, &pts[1].2).unwrap();
    let run = iolab(&[
        "--no-db",
        "run",
        s(&point_file),
        "--seed",
        "7",
        "--format",
        "json",
    ]);
    assert!(run.status.success(), "{}", stderr(&run));
    let json: serde_json::Value = serde_json::from_slice(&run.stdout).unwrap();
    let job = &json["jobs"][0];
    for (name, from_run) in [
        ("read.iops", job["read"]["iops"].as_f64().unwrap()),
        (
            "dma.inval_syncs",
            job["iolab"]["metrics"]["dma.inval_syncs"]["value"]
                .as_f64()
                .unwrap(),
        ),
    ] {
        let stored = metric(&db, 1, name);
        // serde_json's default float parsing may miss the last bit; the values are equal.
        assert!(
            (stored - from_run).abs() <= 1e-12 * stored.abs().max(1.0),
            "{name}: {stored} vs {from_run}"
        );
    }

    // The axis changes the lab: queue depth 4 runs fewer I/Os than depth 32.
    let (d4, d32) = (metric(&db, 0, "read.iops"), metric(&db, 2, "read.iops"));
    assert!(d4 < d32, "depth 4: {d4} IOPS, depth 32: {d32} IOPS");
}

#[test]
fn shards_run_disjoint_points_that_together_make_the_grid() {
    let dir = temp_dir("shards");
    let grid = write_grid(&dir);
    let mut seen = Vec::new();
    for i in 0..3 {
        let db = dir.join(format!("shard-{i}.db"));
        let shard = format!("{i}/3");
        let out = iolab(&[
            "--db",
            s(&db),
            "sweep",
            s(&grid),
            "--shard",
            &shard,
            "--jobs",
            "1",
        ]);
        assert!(out.status.success(), "{}", stderr(&out));
        let pts: Vec<i64> = points(&db).into_iter().map(|p| p.0).collect();
        assert!(pts.iter().all(|p| p % 3 == i), "shard {i}: {pts:?}");
        seen.extend(pts);
    }
    seen.sort_unstable();
    assert_eq!(seen, [0, 1, 2, 3]);
}

#[test]
fn a_field_the_scenario_lacks_is_an_error_naming_grid_axis_and_path() {
    let dir = temp_dir("unknown");
    let grid = dir.join("bad.toml");
    std::fs::write(
        &grid,
        "scenario = \"fio-sas-lockfree\"\n[[axis]]\nfield = \"workload.iodepth\"\nvalues = [1]\n\
         [[axis]]\nfield = \"device[5].disks\"\nvalues = [1, 2]\n",
    )
    .unwrap();
    let db = dir.join("r.db");
    let out = iolab(&["--db", s(&db), "sweep", s(&grid)]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(
        err.contains(s(&grid)) && err.contains("axis 2") && err.contains("device[5].disks"),
        "{err}"
    );
    assert!(err.contains("1 elements"), "{err}");
    assert!(!db.exists(), "nothing runs, nothing is stored");

    std::fs::write(
        &grid,
        "scenario = \"fio-sas-lockfree\"\n[[axis]]\nfield = \"iommu.no_such_knob\"\nvalues = [1]\n",
    )
    .unwrap();
    let out = iolab(&["--db", s(&db), "sweep", s(&grid)]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("`iommu.no_such_knob`"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn bad_grids_and_shards_are_refused_with_exit_2() {
    let dir = temp_dir("bad");
    let grid = write_grid(&dir);
    let db = dir.join("r.db");
    for shard in ["3/3", "1", "a/b", "0/0"] {
        let out = iolab(&["--db", s(&db), "sweep", s(&grid), "--shard", shard]);
        assert_eq!(out.status.code(), Some(2), "--shard {shard}");
        assert!(stderr(&out).contains("--shard"), "{}", stderr(&out));
    }
    let typo = dir.join("typo.toml");
    std::fs::write(&typo, "scenario = \"fio-sas-lockfree\"\naxes = []\n").unwrap();
    let out = iolab(&["--db", s(&db), "sweep", s(&typo)]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("axes"), "{}", stderr(&out));
    let missing = dir.join("missing-base.toml");
    std::fs::write(&missing, "scenario = \"nowhere.toml\"\n").unwrap();
    let out = iolab(&["--db", s(&db), "sweep", s(&missing)]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("nowhere.toml"), "{}", stderr(&out));
    // An experiment file is a table of scenarios, not a base: the error says how to sweep
    // one of its cells.
    let exp = dir.join("experiment-base.toml");
    std::fs::write(&exp, "scenario = \"smmuv3-cmdq\"\n").unwrap();
    let out = iolab(&["--db", s(&db), "sweep", s(&exp)]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(
        err.contains("experiment file") && err.contains("--emit-scenarios"),
        "{err}"
    );
    assert!(!db.exists());
}

#[test]
fn a_value_the_scenario_rejects_fails_the_point_with_exit_2() {
    let dir = temp_dir("badvalue");
    let grid = dir.join("g.toml");
    std::fs::write(
        &grid,
        format!(
            "scenario = \"{BASE}\"\n{SHORT}\n[[axis]]\nfield = \"workload.iodepth\"\n\
             values = [\"deep\"]\n"
        ),
    )
    .unwrap();
    let out = iolab(&["--no-db", "sweep", s(&grid)]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(err.contains("point 0") && err.contains("iodepth"), "{err}");
}

#[test]
fn a_workload_scenario_sweeps_with_its_measurements_stored() {
    let dir = temp_dir("workload");
    let scenario =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scenarios/examples/fio-nvme-strict.toml");
    std::fs::copy(&scenario, dir.join("base.toml")).unwrap();
    let grid = dir.join("grid.toml");
    std::fs::write(
        &grid,
        "name = \"jobs\"\nscenario = \"base.toml\"\n\n\
         [[axis]]\nfield = \"workload.numjobs\"\nvalues = [1, 4]\n",
    )
    .unwrap();
    let db = dir.join("sweep.db");
    let out = iolab(&["--db", s(&db), "sweep", s(&grid), "--jobs", "2"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let pts = points(&db);
    assert_eq!(pts.len(), 2);
    assert!(pts[0].2.contains("numjobs = 1") && pts[1].2.contains("numjobs = 4"));
    // Each point is the workload scenario's run: one measurement with read IOPS, and four
    // jobs complete more I/O than one.
    let c = Connection::open(&db).unwrap();
    let iops = |point: i64| -> f64 {
        c.query_row(
            "SELECT m.value FROM metrics m JOIN sweep_points p ON p.run_id = m.run_id
             WHERE p.point = ?1 AND m.name = 'read.iops'",
            [point],
            |r| r.get(0),
        )
        .unwrap()
    };
    assert!(iops(1) > iops(0) * 2.0, "{} vs {}", iops(1), iops(0));
}

/// A bundled example is a sweep's base; `iommu.mode` over strict, lazy and passthrough runs
/// every point: the base's `iommu.cmdq`, which passthrough does not take, is dropped from
/// that point and the sweep says so once; a result table ends the sweep on stdout.
#[test]
fn a_bundled_example_sweeps_over_modes_dropping_fields_that_do_not_apply() {
    let dir = temp_dir("modes");
    let grid = dir.join("modes.toml");
    std::fs::write(
        &grid,
        "scenario = \"fio-nvme-strict\"\n\
         [set]\n\"workload.runtime_ms\" = 4\n\"workload.ramp_ms\" = 2\n\
         [[axis]]\nfield = \"iommu.mode\"\nvalues = [\"strict\", \"lazy\", \"passthrough\"]\n",
    )
    .unwrap();
    let db = dir.join("sweep.db");
    let out = iolab(&["--db", s(&db), "sweep", s(&grid), "--jobs", "2"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    assert_eq!(
        err.matches("dropped where they do not apply").count(),
        1,
        "{err}"
    );
    assert!(
        err.contains("`iommu.cmdq` (applies to iommu.model = \"smmuv3\" in mode strict or lazy only) at point 2 (iommu.mode=\"passthrough\")"),
        "{err}"
    );
    let pts = points(&db);
    assert_eq!(pts.len(), 3);
    assert!(pts[0].2.contains("cmdq = \"lockfree\""), "{}", pts[0].2);
    assert!(!pts[2].2.contains("cmdq"), "{}", pts[2].2);
    assert!(pts[2].2.contains("mode = \"passthrough\""), "{}", pts[2].2);
    // The table: a header with the axis and key metrics, a row per point in order.
    let table = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = table.lines().collect();
    assert!(lines[1].starts_with("point  iommu.mode"), "{table}");
    assert!(lines[1].contains("read.iops (IOPS)"), "{table}");
    for (i, mode) in ["strict", "lazy", "passthrough"].iter().enumerate() {
        let row: Vec<&str> = lines[2 + i].split_whitespace().collect();
        assert_eq!(
            (row[0], row[1], row[2]),
            (i.to_string().as_str(), *mode, "fio-nvme-strict"),
            "{table}"
        );
    }
    // The sweep is a selection by its name: every point, in point order.
    let out = iolab(&["--db", s(&db), "compare", "sweep:modes", "1"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let first = text.lines().next().unwrap_or_default();
    assert!(first.starts_with("A: sweep:modes (runs "), "{text}");
    assert_eq!(first.matches(',').count(), 2, "three points: {text}");
    let out = iolab(&["--db", s(&db), "compare", "sweep:other", "1"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("no sweep has the id or name `other`"),
        "{}",
        stderr(&out)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// An optional field the base leaves out can be an axis; the scenario itself judges it, so
/// a misspelt one is refused before anything runs, naming the axis and the fields it takes.
#[test]
fn an_optional_field_absent_from_the_base_is_an_axis_and_a_misspelt_one_is_refused() {
    let dir = temp_dir("optional");
    let grid = dir.join("qsize.toml");
    std::fs::write(
        &grid,
        "scenario = \"fio-nvme-strict\"\n\
         [set]\n\"workload.runtime_ms\" = 4\n\
         [[axis]]\nfield = \"iommu.cmdq_log2size\"\nvalues = [8, 10]\n",
    )
    .unwrap();
    let db = dir.join("sweep.db");
    let out = iolab(&["--db", s(&db), "sweep", s(&grid), "--jobs", "1"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let pts = points(&db);
    assert_eq!(pts.len(), 2);
    assert!(pts[1].2.contains("cmdq_log2size = 10"), "{}", pts[1].2);
    let typo = dir.join("typo.toml");
    std::fs::write(
        &typo,
        "scenario = \"fio-nvme-strict\"\n[[axis]]\nfield = \"iommu.cmdq_log2sizz\"\nvalues = [8]\n",
    )
    .unwrap();
    let out = iolab(&["--db", s(&db), "sweep", s(&typo)]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("axis 1 (field `iommu.cmdq_log2sizz`)") && err.contains("unknown field"),
        "{err}"
    );
    assert_eq!(points(&db).len(), 2, "nothing more stored");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn swept_axes_and_the_kernel_are_stored_attributes_and_report_plots_an_axis() {
    let dir = std::env::temp_dir().join(format!("iolab-sweep-axes-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let grid = dir.join("g.toml");
    std::fs::write(
        &grid,
        "name = \"mix\"\nscenario = \"fio-nvme-strict\"\n[set]\n\"workload.runtime_ms\" = 2\n\
         \"workload.rw\" = \"randrw\"\n[[axis]]\nfield = \"kernel.version\"\n\
         values = [\"6.1\", \"6.10\"]\n[[axis]]\nfield = \"workload.rwmixread\"\n\
         values = [30, 70]\n",
    )
    .unwrap();
    let db = dir.join("a.db");
    let run = |args: &[&str]| {
        let out = iolab(&[&["--db", s(&db)], args].concat());
        assert!(out.status.success(), "{}", stderr(&out));
        String::from_utf8(out.stdout).unwrap()
    };
    run(&["sweep", grid.to_str().unwrap()]);
    let shown: serde_json::Value =
        serde_json::from_str(&run(&["runs", "show", "1-4", "--format", "json"])).unwrap();
    let mut seen = std::collections::BTreeSet::new();
    for r in shown.as_array().expect("runs") {
        let a = &r["measurements"][0]["attrs"];
        // The kernel is text (6.1 and 6.10 are different releases); the axis is typed.
        let kernel = a["kernel"].as_str().expect("kernel as text").to_owned();
        let mix = a["workload.rwmixread"].as_u64().expect("the axis, typed");
        seen.insert((kernel, mix));
    }
    assert_eq!(seen.len(), 4, "{seen:?}");
    assert!(seen.contains(&("6.10".to_owned(), 70)));
    // The report plots the rate against the swept axis.
    let svg = dir.join("svg");
    run(&[
        "report",
        "sweep:mix",
        "-o",
        dir.join("r.html").to_str().unwrap(),
        "--svg",
        svg.to_str().unwrap(),
    ]);
    let plots: Vec<String> = std::fs::read_dir(&svg)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        plots
            .iter()
            .any(|p| p.starts_with("scaling-") && p.contains("workload.rwmixread")),
        "{plots:?}"
    );
}
