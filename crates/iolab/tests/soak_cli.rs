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

/// The soak is stored in the results database: one run, experiment `soak`, a measurement
/// per direction with its throughput.
#[test]
fn the_soak_is_stored_as_a_run_with_a_measurement_per_direction() {
    let dir = common::temp_dir("stored");
    let db = dir.join("r.db");
    let mut args = SHORT.to_vec();
    args[0] = "--db";
    args.insert(1, common::s(&db));
    let out = iolab(&args);
    assert!(out.status.success(), "{}", common::stderr(&out));
    assert!(
        common::stderr(&out).contains("stored as run 1 in"),
        "{}",
        common::stderr(&out)
    );
    let out = iolab(&[
        "--db",
        common::s(&db),
        "runs",
        "show",
        "1",
        "--format",
        "json",
    ]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    let run: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(run["experiment"], "soak", "{run}");
    let ms = run["measurements"].as_array().unwrap();
    let configs: Vec<&str> = ms.iter().map(|m| m["config"].as_str().unwrap()).collect();
    assert_eq!(configs, ["soak.write", "soak.read"]);
    for m in ms {
        let gbps = m["metrics"]
            .as_array()
            .unwrap()
            .iter()
            .find(|x| x["name"] == "net.throughput_gbps")
            .expect("a throughput");
        assert!(gbps["value"].as_f64().unwrap() > 0.0, "{m}");
        assert_eq!(m["attrs"]["threads"], "8");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// With one checkpoint there is no mean over the intervals after the first: the report
/// gives the one interval's throughput and says why there is no mean, never `mean 0.000`.
#[test]
fn one_checkpoint_reports_its_interval_not_a_zero_mean() {
    let args = [
        "--no-db",
        "soak",
        "--hours",
        "0.0000013889",
        "--interval-s",
        "0.005",
        "--threads",
        "8",
        "--direction",
        "write",
    ];
    let out = iolab(&args);
    assert!(out.status.success(), "{}", common::stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!text.contains("mean 0.000"), "{text}");
    assert!(text.contains("in the one interval"), "{text}");
    assert!(text.contains("need two or more checkpoints"), "{text}");
    let mut json = args.to_vec();
    json.extend(["--format", "json"]);
    let out = iolab(&json);
    let reports: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert!(reports[0]["mean_gbps"].is_null(), "{reports}");
}

/// On a terminal the soak draws a progress bar over its checkpoints on standard error;
/// off a terminal (this test's pipes) and with `--quiet` there is none. The terminal is
/// `script`'s pseudo-terminal (util-linux); without `script` that half is skipped.
#[test]
fn a_progress_bar_follows_the_checkpoints_on_a_terminal_only() {
    let out = iolab(&SHORT);
    assert!(out.status.success());
    assert!(!common::stderr(&out).contains("checkpoints,"));
    let bin = env!("CARGO_BIN_EXE_iolab");
    let command = |extra: &str| {
        format!(
            "{bin} {extra} --no-db soak --hours 0.0000055556 --interval-s 0.005 --threads 8 \
             --direction read"
        )
    };
    let run = |extra: &str| {
        std::process::Command::new("script")
            .args(["-qec", &command(extra), "/dev/null"])
            .output()
    };
    let Ok(shown) = run("") else {
        eprintln!("no `script` here: the terminal half is skipped");
        return;
    };
    let shown = String::from_utf8_lossy(&shown.stdout).into_owned();
    assert!(shown.contains("/4 checkpoints"), "{shown}");
    assert!(shown.contains("about"), "an ETA: {shown}");
    let quiet = run("--quiet").expect("script ran before");
    let quiet = String::from_utf8_lossy(&quiet.stdout).into_owned();
    assert!(!quiet.contains("checkpoints,"), "{quiet}");
    assert!(quiet.contains("== soak: 8 read threads"), "{quiet}");
}
