//! The results database as a user meets it: `--db`, `--no-db` and `iolab runs`.

use std::path::Path;
use std::process::Command;

mod common;

use common::{iolab, s, stderr, stored_scenario_text, temp_dir};

#[test]
fn reproduce_stores_a_run_that_runs_list_show_and_rm_see() {
    let dir = temp_dir("roundtrip");
    let db = dir.join("results.db");
    let db = s(&db);

    let out = iolab(&["--db", db, "reproduce", "sba-vmerge"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("stored as run 1 in") && err.contains(db),
        "{err}"
    );
    // The report itself is still on standard output, with nothing about the database.
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("== sba-vmerge"), "{stdout}");
    assert!(!stdout.contains("stored as run"), "{stdout}");

    let out = iolab(&["runs", "list", "--format", "json", "--db", db]);
    assert!(out.status.success(), "{}", stderr(&out));
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    let list = list.as_array().expect("an array");
    assert_eq!(list.len(), 1, "{list:?}");
    assert_eq!(list[0]["id"], 1);
    assert_eq!(list[0]["experiment"], "sba-vmerge");
    assert_eq!(list[0]["seed"], 1);
    assert_eq!(list[0]["runs"], 1);
    assert!(list[0]["figures"].as_u64().expect("figure count") > 0);
    assert!(list[0]["started_at"]
        .as_str()
        .expect("started_at")
        .ends_with('Z'));

    let out = iolab(&["--db", db, "runs", "show", "1", "--format", "json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let run: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    assert_eq!(run["experiment"], "sba-vmerge");
    assert_eq!(run["kind"], "lab");
    let figures = run["figures"].as_array().expect("figures");
    assert_eq!(figures.len() as u64, list[0]["figures"].as_u64().unwrap());
    assert!(figures
        .iter()
        .all(|f| f["lab"].is_number() && f["unit"].is_string()));
    assert!(!run["effects"].as_array().expect("effects").is_empty());

    let out = iolab(&["--db", db, "runs", "show", "1"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(figures[0]["id"].as_str().unwrap()), "{text}");

    let out = iolab(&["--db", db, "runs", "rm", "1"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = iolab(&["--db", db, "runs", "list", "--format", "json"]);
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    assert_eq!(list, serde_json::json!([]));

    let out = iolab(&["--db", db, "runs", "rm", "999"]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(err.contains("999") && err.contains(db), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn no_db_stores_nothing() {
    let dir = temp_dir("nodb");
    let out = Command::new(env!("CARGO_BIN_EXE_iolab"))
        .args(["--no-db", "reproduce", "sba-vmerge"])
        .current_dir(&dir)
        .output()
        .expect("runs");
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(!stderr(&out).contains("stored as run"));
    assert_eq!(std::fs::read_dir(&dir).unwrap().count(), 0);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_default_database_is_in_the_current_directory() {
    let dir = temp_dir("default");
    let out = Command::new(env!("CARGO_BIN_EXE_iolab"))
        .args(["reproduce", "sba-vmerge"])
        .current_dir(&dir)
        .output()
        .expect("runs");
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("stored as run 1 in iolab-results.db"));
    assert!(dir.join("iolab-results.db").is_file());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_db_that_is_a_text_file_is_bad_input_and_left_unchanged() {
    let dir = temp_dir("text");
    let path = dir.join("notes.txt");
    let text = "these are my notes, not a database\n".repeat(10);
    std::fs::write(&path, &text).expect("write");
    for args in [
        vec!["--db", s(&path), "reproduce", "sba-vmerge"],
        vec!["--db", s(&path), "runs", "list"],
    ] {
        let out = iolab(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(err.contains(s(&path)), "{err}");
        assert!(out.stdout.is_empty());
        assert_eq!(std::fs::read_to_string(&path).unwrap(), text);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn run_stores_the_scenario_file_it_ran() {
    let dir = temp_dir("run");
    let db = dir.join("results.db");
    let scenario = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../scenarios/experiments/sba-vmerge/novmerge.toml");
    let out = iolab(&["run", s(&scenario), "--db", s(&db), "--seed", "7"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("stored as run 1 in"));
    let out = iolab(&["--db", s(&db), "runs", "show", "1", "--format", "json"]);
    let run: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    assert_eq!(run["seed"], 7);
    assert_eq!(run["scenario_origin"], s(&scenario));
    // The file's text itself is stored, byte for byte, not only its name.
    assert_eq!(
        stored_scenario_text(&db, 1),
        Some(std::fs::read_to_string(&scenario).unwrap())
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn run_repetitions_are_separate_runs_of_one_group() {
    let dir = temp_dir("group");
    let db = dir.join("results.db");
    let scenario = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../scenarios/examples/bonnie-usb-ipmmu.toml");
    // One repetition: no group, as before.
    let out = iolab(&["--db", s(&db), "run", s(&scenario)]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = iolab(&[
        "--db",
        s(&db),
        "run",
        s(&scenario),
        "--runs",
        "2",
        "--seed",
        "5",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("stored as run 2 in") && err.contains("stored as run 3 in"),
        "{err}"
    );
    assert!(err.contains("as group g2"), "{err}");
    let out = iolab(&["--db", s(&db), "runs", "list", "--format", "json"]);
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    let got: Vec<(serde_json::Value, serde_json::Value, u32)> = list
        .as_array()
        .expect("array")
        .iter()
        .map(|r| {
            (
                r["group_id"].clone(),
                r["seed"].clone(),
                r["runs"].as_u64().unwrap() as u32,
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            (serde_json::Value::Null, 1.into(), 1),
            (2.into(), 5.into(), 1),
            (2.into(), 6.into(), 1)
        ]
    );
    // Each repetition is its own report: runs with different seeds, stored apart.
    let out = iolab(&["--db", s(&db), "runs", "show", "3"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("seed 6") && text.contains("group: g2"),
        "{text}"
    );
    let out = iolab(&["--db", s(&db), "runs", "list"]);
    let text = String::from_utf8_lossy(&out.stdout);
    let header = text.lines().next().unwrap();
    assert!(header.contains("kind") && header.contains("group") && header.contains("label"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_database_in_a_missing_directory_is_bad_input_refused_before_the_run() {
    let dir = temp_dir("missing-dir");
    let db = dir.join("no-such-subdir").join("results.db");
    let out = iolab(&["--db", s(&db), "reproduce", "sba-vmerge"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains(s(&db)) && err.contains("does not exist") && err.contains("--no-db"),
        "{err}"
    );
    // Refused before running: no report on standard output, nothing created.
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(!dir.join("no-such-subdir").exists());
}

#[test]
fn every_command_that_reads_a_database_refuses_a_missing_one_alike_and_creates_none() {
    let dir = temp_dir("missing-db");
    let db = dir.join("typo.db");
    let html = dir.join("r.html");
    let out_db = dir.join("out.db");
    let want = format!("results database {} does not exist", s(&db));
    let cases: [&[&str]; 7] = [
        &["--db", s(&db), "runs", "list"],
        &["--db", s(&db), "runs", "list", "--format", "json"],
        &["--db", s(&db), "runs", "show", "1"],
        &["--db", s(&db), "runs", "rm", "1"],
        &["--db", s(&db), "compare", "1", "2"],
        &["--db", s(&db), "report", "1", "-o", s(&html)],
        &["db", "merge", s(&out_db), s(&db)],
    ];
    for args in cases {
        let out = iolab(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(err.contains(&want), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: one message: {err}");
        assert!(out.stdout.is_empty(), "{args:?}: nothing on stdout");
        assert!(!db.exists(), "{args:?} created the database");
    }
    assert!(!html.exists() && !out_db.exists());
    let _ = std::fs::remove_dir_all(&dir);
}

fn data(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
        .to_str()
        .expect("utf-8 path")
        .to_owned()
}

/// The ids of a `runs show --format json` array.
fn shown_ids(out: &std::process::Output) -> Vec<i64> {
    assert!(out.status.success(), "{}", stderr(out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    v.as_array()
        .expect("an array")
        .iter()
        .map(|r| r["id"].as_i64().expect("id"))
        .collect()
}

#[test]
fn runs_show_and_rm_take_groups_ranges_and_lists_and_ids_are_never_reused() {
    let dir = temp_dir("ids");
    let db = dir.join("r.db");
    let db = s(&db);
    // Runs 1 and 2 (group g1), 3, 4.
    for (tool, file) in [
        ("bonnie", "bonnie-2.00a-x2.csv"),
        ("fio", "fio-two-jobs.json"),
        ("reaim", "reaim-sba-vmerge-vmerge.txt"),
    ] {
        let out = iolab(&["--db", db, "import", tool, &data(file)]);
        assert!(out.status.success(), "{}", stderr(&out));
    }
    let show = |runs: &str| iolab(&["--db", db, "runs", "show", runs, "--format", "json"]);
    assert_eq!(shown_ids(&show("g1")), vec![1, 2]);
    assert_eq!(shown_ids(&show("G1")), vec![1, 2]);
    assert_eq!(shown_ids(&show("2-4")), vec![2, 3, 4]);
    assert_eq!(shown_ids(&show("4,g1,1")), vec![4, 1, 2]);
    // One plain id: one object, as before.
    let out = show("3");
    let one: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    assert_eq!(one["id"], 3);
    let out = iolab(&["--db", db, "runs", "show", "g1"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("run 1: bonnie") && text.contains("run 2: bonnie"),
        "{text}"
    );

    for (runs, says) in [
        ("x", "`x` is not one"),
        ("5-9", "has no run with an id in 5-9"),
        ("g3", "has no group g3"),
        ("3,7", "has no run 7"),
    ] {
        for action in ["show", "rm"] {
            let out = iolab(&["--db", db, "runs", action, runs]);
            assert_eq!(
                out.status.code(),
                Some(2),
                "{action} {runs}: {}",
                stderr(&out)
            );
            assert!(
                stderr(&out).contains(says),
                "{action} {runs}: {}",
                stderr(&out)
            );
        }
    }
    // A refused rm removed nothing (3 of `3,7` is still there).
    assert_eq!(shown_ids(&show("1-4")), vec![1, 2, 3, 4]);

    let out = iolab(&["--db", db, "runs", "rm", "g1"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stderr(&out);
    assert!(
        text.contains("removed run 1 ") && text.contains("removed run 2 "),
        "{text}"
    );
    let out = iolab(&["--db", db, "runs", "rm", "4"]);
    assert!(out.status.success(), "{}", stderr(&out));
    // The newest id (4) is not given to the next run.
    let out = iolab(&["--db", db, "import", "fio", &data("fio-two-jobs.json")]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stderr(&out).contains("as run 5 "), "{}", stderr(&out));
    assert_eq!(shown_ids(&show("1-9")), vec![3, 5]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn results_go_to_stdout_and_notes_about_what_was_stored_to_stderr() {
    let dir = temp_dir("streams");
    let db = dir.join("r.db");
    let db = s(&db);
    let out = iolab(&["--db", db, "run", "--example", "fio-nvme-strict"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("fio-nvme-strict"));
    assert!(
        stderr(&out).contains("stored as run 1 in"),
        "{}",
        stderr(&out)
    );
    // import, like run: the note on standard error, nothing on standard output.
    let out = iolab(&[
        "--db",
        db,
        "import",
        "fio",
        &data("fio-randread-grouped.json"),
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let err = stderr(&out);
    assert!(
        err.contains("imported ") && err.contains(" as run 2 "),
        "{err}"
    );
    assert!(err.contains(&format!("stored in {db}")), "{err}");
    let out = iolab(&["--db", db, "runs", "rm", "2"]);
    assert!(out.status.success() && out.stdout.is_empty());
    assert!(
        stderr(&out).contains("removed run 2 from"),
        "{}",
        stderr(&out)
    );
    // What a command is asked to print stays on standard output.
    let out = iolab(&["--db", db, "runs", "list"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("fio-nvme-strict"));
    assert!(out.stderr.is_empty(), "{}", stderr(&out));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn only_commands_that_use_a_database_take_db_and_no_db() {
    // Shown in the help of the commands that use it, not in the others'.
    for (cmd, shown) in [
        ("run", true),
        ("compare", true),
        ("runs", true),
        ("bench", false),
        ("host", false),
        ("trace", false),
    ] {
        let out = iolab(&[cmd, "--help"]);
        let help = String::from_utf8_lossy(&out.stdout);
        assert_eq!(help.contains("--db"), shown, "{cmd}: {help}");
    }
    // Given to a command that ignores it: bad input, naming the command.
    let out = iolab(&["--db", "x.db", "host", "--sysroot", "/nonexistent"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("iolab host: this command uses no results database"));
    // After the command's name as well as before it; both together is bad input.
    let dir = temp_dir("db-after");
    let db = dir.join("r.db");
    let out = iolab(&["run", "--db", s(&db), "--example", "fio-nvme-off"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = iolab(&["runs", "list", "--db", s(&db), "--format", "json"]);
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    assert_eq!(list.as_array().map(Vec::len), Some(1));
    let out = iolab(&[
        "--no-db",
        "run",
        "--db",
        s(&db),
        "--example",
        "fio-nvme-off",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_results_file_created_by_several_processes_at_once_stores_every_run() {
    let dir = temp_dir("concurrent-create");
    let db = dir.join("new.db");
    // Several processes start together on a file that does not exist yet: each opens it,
    // creates or finds the schema, and stores its run.
    let children: Vec<_> = (1..=6)
        .map(|seed| {
            Command::new(env!("CARGO_BIN_EXE_iolab"))
                .args(["run", "--example", "fio-nvme-strict", "--db"])
                .arg(&db)
                .args(["--seed", &seed.to_string()])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .expect("iolab starts")
        })
        .collect();
    for c in children {
        let out = c.wait_with_output().expect("iolab finishes");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let out = iolab(&["runs", "list", "--format", "json", "--db", s(&db)]);
    assert!(out.status.success(), "{}", stderr(&out));
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    let mut seeds: Vec<u64> = list
        .as_array()
        .expect("an array")
        .iter()
        .map(|r| r["seed"].as_u64().expect("a seed"))
        .collect();
    seeds.sort_unstable();
    assert_eq!(seeds, [1, 2, 3, 4, 5, 6]);
}
