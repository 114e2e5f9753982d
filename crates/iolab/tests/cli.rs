//! The `iolab` binary as a user runs it: exit codes, messages and output shapes.

use std::process::Command;

mod common;

use common::{iolab, stderr};

#[test]
fn version_prints_the_crate_version() {
    let out = iolab(&["version"]);
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("iolab {}", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn help_lists_the_commands() {
    let out = iolab(&["--help"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for cmd in ["reproduce", "bench", "calibrate", "version"] {
        assert!(text.contains(cmd), "--help lacks {cmd}: {text}");
    }
}

#[test]
fn an_unknown_flag_is_bad_input_with_exit_code_2() {
    let out = iolab(&["bench", "--no-such-flag"]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn an_unknown_experiment_is_bad_input_naming_the_choices() {
    let out = iolab(&["--no-db", "reproduce", "no-such-experiment"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no-such-experiment") && err.contains("smmuv3-cmdq"),
        "{err}"
    );
}

#[test]
fn bench_filter_runs_only_the_named_rows_and_refuses_a_filter_matching_none() {
    let out = iolab(&[
        "bench",
        "--quick",
        "--filter",
        "translate/lpae",
        "--filter",
        "iotlb_lookup/main-tlb-hit",
        "--format",
        "json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    let names: Vec<&str> = json["results"]
        .as_array()
        .expect("a results array")
        .iter()
        .map(|r| r["name"].as_str().expect("a name"))
        .collect();
    assert_eq!(
        names,
        ["translate/lpae-4k-walk", "iotlb_lookup/main-tlb-hit"],
        "the filter keeps exactly the rows whose name contains one of its texts"
    );

    let out = iolab(&["bench", "--quick", "--filter", "no-such-row"]);
    assert_eq!(out.status.code(), Some(2));
    let err = stderr(&out);
    assert!(
        err.contains("no-such-row") && err.contains("iova_alloc_free/"),
        "{err}"
    );
}

#[test]
fn bench_json_has_every_record_the_issue_names() {
    let out = iolab(&["bench", "--quick", "--format", "json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    let results = json["results"].as_array().expect("a results array");
    let names: Vec<&str> = results
        .iter()
        .map(|r| r["name"].as_str().expect("a name"))
        .collect();
    for live in [0, 10_000, 100_000] {
        for allocator in ["linux", "magazine", "gaptree"] {
            let name = format!("iova_alloc_free/{allocator}/{live}");
            assert!(
                names.contains(&name.as_str()),
                "missing {name} in {names:?}"
            );
        }
    }
    for name in [
        "pgtable_map_unmap/lpae-4k/4k",
        "pgtable_map_unmap/lpae-4k/2m",
        "translate/lpae-4k-walk",
    ] {
        assert!(names.contains(&name), "missing {name}");
    }
    let lockfree = results
        .iter()
        .find(|r| r["name"] == "cmdq_issue/lockfree/2")
        .expect("cmdq row");
    assert!(lockfree["commands_per_sec"].as_f64().expect("commands/s") > 0.0);
    assert!(lockfree["work_per_op"]["cas_failures_per_command"].is_number());
    for cpus in [1, 16, 64, 256] {
        let name = format!("sim/nvme-randread-strict/{cpus}");
        let r = results
            .iter()
            .find(|r| r["name"] == name.as_str())
            .unwrap_or_else(|| panic!("missing {name}"));
        assert!(r["sim_ios_per_host_sec"].as_f64().expect("sim IO/s") > 0.0);
        assert!(r["simulated_ios"].as_u64().expect("simulated I/Os") > 0);
        if cpus == 64 {
            assert!(r["peak_rss_mb"].as_f64().expect("peak RSS") > 0.0);
        }
    }
    // The lab's scenario path (`iolab run`'s block stack), on the scaled bundled example.
    let lab = results
        .iter()
        .find(|r| r["name"] == "sim/fio-nvme-strict/64")
        .expect("the lab-path row");
    assert!(lab["sim_ios_per_host_sec"].as_f64().expect("sim IO/s") > 0.0);
    assert!(lab["simulated_ios"].as_u64().expect("simulated I/Os") > 0);
    for r in results {
        assert!(r["ns_per_op"].as_f64().expect("ns_per_op is a number") > 0.0);
        if r["name"].as_str().unwrap().starts_with("iova_alloc_free/") {
            assert_eq!(r["peer"], "vm-allocator AddressAllocator");
            assert!(r["peer_ns_per_op"].as_f64().expect("peer figure") > 0.0);
        }
    }
}

#[test]
fn calibrate_writes_a_host_profile_that_loads_and_refuses_to_overwrite() {
    let dir = std::env::temp_dir().join(format!("iolab-calibrate-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("host.toml");
    let _ = std::fs::remove_file(&path);
    let p = path.to_str().expect("utf-8 path");
    let out = iolab(&["calibrate", "--quick", "-o", p]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let profile = iolab_sim::cost::PlatformProfile::from_file(&path).expect("the profile loads");
    assert_eq!(profile.name, "host");
    assert!(profile
        .cost("cpu.pte_write")
        .expect("pte_write")
        .source
        .starts_with("measured by iolab calibrate on "));
    // An existing file is not replaced without --force.
    let out = iolab(&["calibrate", "--quick", "-o", p]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("already exists") && err.contains("--force"),
        "{err}"
    );
    let out = iolab(&["calibrate", "--quick", "--force", "-o", p]);
    assert!(out.status.success());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_reader_that_stops_early_ends_the_run_quietly() {
    use std::io::Read;
    use std::process::Stdio;
    // The JSON report is far bigger than a pipe's buffer, so the writes after the reader
    // has gone fail with a broken pipe, as under `iolab ... | head`.
    let mut child = Command::new(env!("CARGO_BIN_EXE_iolab"))
        .args(["--no-db", "reproduce", "--format", "json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the iolab binary runs");
    let mut first = [0u8; 64];
    child
        .stdout
        .take()
        .expect("piped stdout")
        .read_exact(&mut first)
        .expect("the report starts");
    // The read end is closed here (the handle was taken and dropped).
    let out = child.wait_with_output().expect("iolab ends");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "status {:?}: {stderr}", out.status);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(
        first.starts_with(b"{"),
        "{:?}",
        String::from_utf8_lossy(&first)
    );
}

/// The issue's effect goal, restated from its text: the same sign, and within +-35% of the
/// published change where that is 10% or more, within 3 points where smaller.
fn effect_meets_goal(published: f64, lab: f64) -> bool {
    let magnitude = if published.abs() >= 10.0 {
        (lab - published).abs() <= 0.35 * published.abs()
    } else {
        (lab - published).abs() <= 3.0
    };
    (published >= 0.0) == (lab >= 0.0) && magnitude
}

#[test]
fn reproduce_reports_both_fidelity_goals_consistently_in_json_and_text() {
    let out = iolab(&["--no-db", "reproduce", "--format", "json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    let experiments = json["experiments"].as_array().expect("experiments");
    // Every published experiment, experiment file or module of its own, in one order.
    let names: Vec<&str> = experiments
        .iter()
        .map(|e| e["name"].as_str().expect("a name"))
        .collect();
    assert_eq!(
        names,
        [
            "ipmmu-usb",
            "smmuv3-cmdq",
            "sba-vmerge",
            "pseries-ddw",
            "fands-iotlb"
        ]
    );
    let out = iolab(&["--no-db", "reproduce"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (mut checked, mut unchecked) = (0, 0);
    for e in experiments {
        let name = e["name"].as_str().expect("a name");
        // within_goal, recomputed from each figure's own published and lab values.
        let mut missed = Vec::new();
        let (mut met, mut total) = (0, 0);
        for f in e["figures"].as_array().expect("figures") {
            let published = f["published"].as_f64();
            let lab = f["lab"].as_f64().expect("a lab value");
            let want = match (f["role"].as_str(), published) {
                (Some("prediction"), Some(p)) => Some((lab - p).abs() <= 0.25 * p.abs()),
                (Some("prediction" | "calibration"), _) => None,
                other => panic!("{name}: unexpected role/published {other:?}"),
            };
            assert_eq!(f["within_goal"].as_bool(), want, "{name}: {f}");
            assert!(want.is_some() || f["within_goal"].is_null(), "{f}");
            match want {
                Some(ok) => {
                    total += 1;
                    met += usize::from(ok);
                    if !ok {
                        missed.push(f["id"].as_str().expect("an id").to_owned());
                    }
                }
                None => unchecked += 1,
            }
        }
        checked += total;
        let effects = e["effects"].as_array().expect("effects");
        let effects_met = effects
            .iter()
            .filter(|x| {
                effect_meets_goal(
                    x["published_pct"].as_f64().expect("published_pct"),
                    x["lab_pct"].as_f64().expect("lab_pct"),
                )
            })
            .count();
        assert_eq!(
            e["fidelity"],
            serde_json::json!({
                "effects": {"met": effects_met, "total": effects.len()},
                "predicted_figures": {"met": met, "total": total},
            }),
            "{name}"
        );

        // The text says the same: the count line, exactly the missed ids, the summary line.
        let section = text
            .split("\n== ")
            .find(|s| s.trim_start_matches("== ").starts_with(&format!("{name}:")))
            .unwrap_or_else(|| panic!("no text section for {name}"));
        let line = format!("predicted figures within +-25% of published: {met} of {total}");
        assert!(section.contains(&line), "{name}: no `{line}` in\n{section}");
        let listed: Vec<&str> = section
            .lines()
            .filter(|l| l.ends_with(" MISSED"))
            .filter_map(|l| l.split_whitespace().next())
            .filter(|id| !effects.iter().any(|x| x["id"] == *id))
            .collect();
        assert_eq!(listed, missed, "{name}: missed figures in the text");
        let summary = format!(
            "effects {effects_met} of {}, predicted figures {met} of {total}",
            effects.len()
        );
        assert!(
            text.lines()
                .any(|l| l.starts_with(name) && l.ends_with(&summary)),
            "{name}: no summary line `{summary}`"
        );
    }
    // Not vacuous: both checked predictions and unchecked figures occur.
    assert!(checked > 0 && unchecked > 0, "{checked} {unchecked}");
}

#[test]
fn reproduce_help_lists_every_experiment_it_accepts() {
    let out = iolab(&["reproduce", "--help"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let help = String::from_utf8_lossy(&out.stdout);
    for name in iolab_sim::reproduce::all_names() {
        assert!(help.contains(name), "{name} missing from:\n{help}");
        // ... and reproduce accepts it: every name is a bundled experiment file.
        assert!(
            iolab_sim::reproduce::bundled::text(name).is_some(),
            "{name}"
        );
    }
    assert!(
        help.contains("protection") && help.contains("smmuv3-cmdq"),
        "{help}"
    );
}

/// A scenario of ipmmu-usb's former schema (the experiment now runs only from its
/// experiment file): `iolab run` and `iolab sweep` refuse it as bad input, saying what runs.
#[test]
fn a_scenario_of_a_removed_experiment_schema_says_to_use_the_experiment_file() {
    let dir = common::temp_dir("moved");
    let old = dir.join("ipmmu-usb.toml");
    std::fs::write(&old, "experiment = \"ipmmu-usb\"\nruns = 1\n").unwrap();
    let out = iolab(&["--no-db", "run", old.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("field `experiment`"), "{err}");
    assert!(err.contains("iolab reproduce ipmmu-usb"), "{err}");
    assert!(
        err.contains("scenarios/experiments/ipmmu-usb.toml"),
        "{err}"
    );

    let grid = dir.join("grid.toml");
    std::fs::write(&grid, "scenario = \"ipmmu-usb\"\nseeds = [1, 2]\n").unwrap();
    let out = iolab(&["--no-db", "sweep", grid.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("iolab reproduce ipmmu-usb"), "{err}");

    // The old file as a sweep's base, and traced: refused the same way, before any run.
    let grid = dir.join("grid-file.toml");
    std::fs::write(&grid, "scenario = \"ipmmu-usb.toml\"\nseeds = [1, 2]\n").unwrap();
    let trace_out = dir.join("t.json");
    for args in [
        vec!["--no-db", "sweep", grid.to_str().unwrap()],
        vec![
            "trace",
            old.to_str().unwrap(),
            "-o",
            trace_out.to_str().unwrap(),
        ],
    ] {
        let out = iolab(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(err.contains("field `experiment`"), "{args:?}: {err}");
        assert!(err.contains("iolab reproduce ipmmu-usb"), "{args:?}: {err}");
        assert!(!trace_out.exists());
    }
    let _ = std::fs::remove_dir_all(&dir);
}
