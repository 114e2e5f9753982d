//! `iolab soak` as a user runs it: both directions by default, one with `--direction`, the
//! report's shape, a lab netperf scenario given by file, what it says while it runs, and bad
//! input with exit code 2.

mod common;

use std::path::Path;

use common::iolab;

fn repo(rel: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(rel)
        .to_str()
        .expect("utf-8 path")
        .to_owned()
}

/// The number after `label` in `text` (`label 123`), with any `,` or `.` it carries.
fn number_after(text: &str, label: &str) -> f64 {
    let at = text
        .find(label)
        .unwrap_or_else(|| panic!("`{label}` in {text}"));
    let rest = text[at + label.len()..].trim_start();
    let n: String = rest
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == '.')
        .collect();
    n.parse()
        .unwrap_or_else(|_| panic!("a number after `{label}`: {rest}"))
}

/// A short soak of a lab scenario file (the bundled netperf example on the DDW, 8 threads),
/// both directions: every check passes, and what it measured is not zero. Standard error
/// says what is soaked before the first checkpoint, and how long the soak took.
#[test]
fn a_short_soak_of_a_lab_netperf_scenario_passes_its_checks_with_real_figures() {
    let scenario = repo("scenarios/examples/netperf-pseries-ddw.toml");
    let out = iolab(&[
        "--no-db",
        "soak",
        &scenario,
        "--hours",
        "0.0000055556",
        "--interval-s",
        "0.004",
    ]);
    let err = common::stderr(&out);
    assert!(out.status.success(), "{err}");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    for dir in ["write", "read"] {
        let at = text
            .find(&format!("== soak: 8 {dir} threads, DDW dynamic window"))
            .unwrap_or_else(|| panic!("the {dir} report: {text}"));
        let report = &text[at..];
        assert!(
            report.contains("invariants: held at all 5 checkpoints and after the drain"),
            "{report}"
        );
        let mean = number_after(report, "throughput: mean");
        assert!(
            mean > 10.0 && mean < 100.0,
            "{dir}: {mean} Gb/s on a 100 Gb/s link"
        );
        assert!(number_after(report, "DMA:") > 0.0, "{report}");
        assert!(number_after(report, "unmaps,") > 0.0, "{report}");
    }
    assert!(!text.contains("mean 0.000"), "{text}");
    // Off a terminal: a line before the first checkpoint naming the scenario and the plan,
    // and one per direction when it is done.
    let first = err.lines().next().unwrap_or_default();
    assert!(first.starts_with("iolab soak: "), "{err}");
    assert!(first.contains("netperf-pseries-ddw.toml"), "{first}");
    assert!(first.contains("DDW dynamic window"), "{first}");
    assert!(first.contains("write then read"), "{first}");
    assert!(first.contains("5 per direction"), "{first}");
    assert!(err.contains("write: simulated"), "{err}");
    assert!(err.contains("read: simulated"), "{err}");
}

/// `--default-window` soaks the same scenario through the default window (the
/// experiment's default column): the report says so, and it streams less.
#[test]
fn the_default_window_flag_switches_the_scenarios_window() {
    let scenario = repo("scenarios/examples/netperf-pseries-ddw.toml");
    let run = |extra: &[&str]| {
        let mut args = vec![
            "--no-db",
            "soak",
            scenario.as_str(),
            "--hours",
            "0.0000022222",
            "--interval-s",
            "0.004",
            "--direction",
            "write",
            "--format",
            "json",
        ];
        args.extend(extra);
        let out = iolab(&args);
        assert!(out.status.success(), "{}", common::stderr(&out));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
        v[0].clone()
    };
    let (ddw, default) = (run(&[]), run(&["--default-window"]));
    assert_eq!(
        (ddw["ddw"].as_bool(), default["ddw"].as_bool()),
        (Some(true), Some(false))
    );
    // The default window's 4 KiB TCEs carry less in the same time than the DDW's 64 KiB
    // ones.
    let bytes = |r: &serde_json::Value| r["bytes"].as_f64().unwrap();
    assert!(bytes(&default) < 0.9 * bytes(&ddw), "{default} vs {ddw}");
}

/// A lab scenario without a netperf workload cannot be soaked: exit code 2, and the message
/// names the file, the field and what the soak expects. A file that does not exist is
/// refused the same way.
#[test]
fn a_scenario_that_is_not_a_netperf_stream_is_bad_input() {
    let scenario = repo("scenarios/examples/fio-nvme-strict.toml");
    let out = iolab(&["--no-db", "soak", &scenario, "--hours", "0.001"]);
    assert_eq!(out.status.code(), Some(2));
    let err = common::stderr(&out);
    assert!(err.contains("fio-nvme-strict.toml"), "{err}");
    assert!(err.contains("workload.kind"), "{err}");
    assert!(err.contains("expected \"netperf\""), "{err}");
    assert!(err.contains("found \"fio\""), "{err}");
    assert!(out.stdout.is_empty());

    let out = iolab(&["--no-db", "soak", "no-such-scenario.toml"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        common::stderr(&out).contains("no-such-scenario.toml"),
        "{}",
        common::stderr(&out)
    );
}

/// The experiment's own scenario schema is gone (issue 16): its former file is an ordinary
/// missing file, and the experiment runs from its data file.
#[test]
fn the_former_pseries_ddw_scenario_is_gone_and_the_experiment_still_reproduces() {
    let former = repo("scenarios/pseries-ddw.toml");
    let out = iolab(&["--no-db", "run", &former]);
    assert_eq!(out.status.code(), Some(2));
    let err = common::stderr(&out);
    assert!(err.contains(&former), "{err}");
    assert!(err.contains("No such file"), "{err}");
    let out = iolab(&["--no-db", "reproduce", "pseries-ddw"]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("64 thread write throughput:"), "{text}");
}

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
        assert_eq!(m["attrs"]["threads"], 8, "typed, as stored");
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

#[test]
fn an_interval_longer_than_the_soak_names_both_flags_in_their_units() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_iolab"))
        .args(["--no-db", "soak", "--hours", "0.002"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--interval-s 60") && err.contains("--hours 0.002 = 7.2 virtual s"),
        "{err}"
    );
    assert!(!err.contains("60000000000"), "{err}");
}
