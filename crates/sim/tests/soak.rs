//! The pSeries soak (SEEDS.md #4) over a short virtual time, on lab scenarios: every
//! checkpoint's invariants hold and the report adds up; the soak runs the lab's own parts
//! (the default cell of the pseries-ddw experiment, the bundled netperf examples), and a
//! scenario it cannot soak is bad input naming the file and the field.

use iolab_sim::lab::{examples, spec::IommuMode};
use iolab_sim::soak::{
    default_cell_text, mean_cv, run_soak, SoakConfig, SoakDirection, SoakError, SoakScenario,
    DEFAULT_CELL,
};

fn config(duration_ms: u64, interval_ms: u64, threads: Option<usize>) -> SoakConfig {
    SoakConfig {
        duration_ns: duration_ms * 1_000_000,
        interval_ns: interval_ms * 1_000_000,
        threads,
        direction: SoakDirection::Write,
        seed: 7,
    }
}

fn read(mut c: SoakConfig) -> SoakConfig {
    c.direction = SoakDirection::Read;
    c
}

/// The default scenario: cell 64t.write.ddw of the pseries-ddw experiment, DDW or (with
/// `--default-window`) the default window.
fn cell(default_window: bool) -> SoakScenario {
    SoakScenario::default_cell(default_window).expect("the default cell prepares")
}

/// A scenario's fields for comparison: without its description, and each `machine.costs`
/// entry reduced to its value and unit (the source's wording is not the model).
fn fields(text: &str) -> toml::Table {
    let mut t: toml::Table = text.parse().expect("TOML");
    t.remove("description");
    if let Some(toml::Value::Table(costs)) = t
        .get_mut("machine")
        .and_then(|m| m.as_table_mut())
        .and_then(|m| m.get_mut("costs"))
    {
        for (_, v) in costs.iter_mut() {
            if let Some(entry) = v.as_table_mut() {
                entry.remove("source");
            }
        }
    }
    t
}

#[test]
fn the_default_scenario_is_the_experiments_64_thread_ddw_cell() {
    let s = cell(false);
    assert_eq!(s.scenario.name, DEFAULT_CELL);
    assert_eq!(s.scenario.iommu.mode, IommuMode::DdwDynamic);
    assert!(s.origin.contains("pseries-ddw") && s.origin.contains(DEFAULT_CELL));
    // The same scenario as the emitted cell file `iolab run` takes: the same fields and
    // values (the text differs in comments, key order and the calibration's wording).
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../scenarios/experiments/pseries-ddw/64t.write.ddw.toml"
    );
    let file = std::fs::read_to_string(path).unwrap();
    assert_eq!(fields(&s.text), fields(&file));
    // With --default-window: the experiment's default column, nothing else.
    let d = cell(true);
    assert_eq!(d.scenario.iommu.mode, IommuMode::DefaultWindow);
    assert!(d.origin.contains("--default-window"), "{}", d.origin);
    let default_col = std::fs::read_to_string(path.replace(".ddw.toml", ".default.toml")).unwrap();
    let mut expected = fields(&default_col);
    expected.insert("name".into(), DEFAULT_CELL.into());
    assert_eq!(fields(&d.text), expected);
    assert!(default_cell_text()
        .unwrap()
        .0
        .starts_with("# Cell 64t.write.ddw"));
}

#[test]
fn a_short_64_thread_ddw_soak_passes_every_checkpoint() {
    let s = cell(false);
    let r = run_soak(&s, &config(20, 4, None)).expect("soak");
    assert_eq!(r.scenario, DEFAULT_CELL);
    assert!(r.ddw);
    assert_eq!(r.threads, 64);
    assert_eq!(r.direction, SoakDirection::Write);
    assert_eq!(r.intervals.len(), 5);
    // Checkpoints saw skbs in flight and compared each with the reference.
    assert!(r.intervals.iter().any(|i| i.mappings_checked > 0));
    assert!(r
        .intervals
        .iter()
        .all(|i| i.live_mappings == i.mappings_checked));
    assert!(r.intervals.iter().all(|i| i.gbps > 0.0));
    assert_eq!(r.maps, r.unmaps);
    assert!(r.skbs > 0 && r.bytes > 0 && r.hypercalls > 0);
    assert!(r.mean_gbps > 0.0 && r.cv_pct.is_finite());
    // Same inputs, same result.
    let again = run_soak(&s, &config(20, 4, None)).unwrap();
    assert_eq!(r, again);
}

#[test]
fn a_short_64_thread_ddw_read_soak_passes_every_checkpoint() {
    let c = read(config(20, 4, None));
    let s = cell(false);
    let r = run_soak(&s, &c).expect("soak");
    assert_eq!(r.threads, 64);
    assert_eq!(r.direction, SoakDirection::Read);
    assert_eq!(r.intervals.len(), 5);
    // Every checkpoint before the end compared the receive pages with the reference (the
    // last one runs after the drain and the interface teardown).
    assert!(r.intervals[..4].iter().all(|i| i.mappings_checked > 0));
    assert!(r
        .intervals
        .iter()
        .all(|i| i.live_mappings == i.mappings_checked));
    assert!(r.intervals.iter().all(|i| i.gbps > 0.0));
    // Receive pages were refilled (unmapped and mapped) during the run; all went at the end.
    assert_eq!(r.maps, r.unmaps);
    assert!(r.hypercalls > 0);
    assert_eq!(r.skbs, 0);
    assert!(r.messages > 0);
    // The payload read is whole messages, and the device wrote at least that much.
    assert_eq!(r.bytes % (r.bytes / r.messages), 0);
    assert!(r.device_bytes >= r.bytes);
    assert!(r.mean_gbps > 0.0 && r.cv_pct.is_finite());
    let again = run_soak(&s, &c).unwrap();
    assert_eq!(r, again);
}

#[test]
fn the_default_window_read_soak_passes_too() {
    let r = run_soak(&cell(true), &read(config(8, 4, Some(8)))).expect("soak");
    assert!(!r.ddw);
    assert_eq!(r.threads, 8);
    assert_eq!(r.direction, SoakDirection::Read);
    // Both checkpoints ran; the one before the drain compared live receive pages with the
    // reference (the last runs after the teardown, with nothing left mapped).
    assert_eq!(r.intervals.len(), 2);
    assert!(r.intervals[0].mappings_checked > 0, "{:?}", r.intervals);
    assert!(r
        .intervals
        .iter()
        .all(|i| i.live_mappings == i.mappings_checked && i.gbps > 0.0));
    assert_eq!(r.maps, r.unmaps);
    assert!(r.hypercalls > 0 && r.messages > 0);
    assert!(r.bytes > 0 && r.device_bytes >= r.bytes);
}

#[test]
fn the_default_window_soak_passes_too() {
    let r = run_soak(&cell(true), &config(8, 4, Some(8))).expect("soak");
    assert!(!r.ddw);
    assert_eq!(r.threads, 8);
    assert_eq!(r.direction, SoakDirection::Write);
    // Both checkpoints ran and compared the skbs in flight with the reference.
    assert_eq!(r.intervals.len(), 2);
    assert!(
        r.intervals.iter().any(|i| i.mappings_checked > 0),
        "{:?}",
        r.intervals
    );
    assert!(r
        .intervals
        .iter()
        .all(|i| i.live_mappings == i.mappings_checked && i.gbps > 0.0));
    assert_eq!(r.maps, r.unmaps);
    assert!(r.skbs > 0 && r.bytes > 0 && r.hypercalls > 0);
    // The default window's 4 KiB TCEs (a TCE per 4 KiB, pool locks, the hypervisor's table
    // lock) carry less in the same time than the DDW's 64 KiB ones.
    let ddw = run_soak(&cell(false), &config(8, 4, Some(8))).unwrap();
    assert!(
        r.bytes * 10 < ddw.bytes * 9,
        "default {} bytes vs DDW {}",
        r.bytes,
        ddw.bytes
    );
}

/// The bundled netperf examples soak as they are: the example's 8 threads, its window.
#[test]
fn the_bundled_netperf_examples_soak() {
    for (name, ddw) in [
        ("netperf-pseries-ddw", true),
        ("netperf-pseries-default", false),
    ] {
        let text = examples::example(name).unwrap();
        let s = SoakScenario::prepare(text, name, None, false).unwrap();
        let r = run_soak(&s, &config(4, 2, None)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!((r.threads, r.ddw), (8, ddw), "{name}");
        assert_eq!(r.intervals.len(), 2, "{name}");
        assert!(r.mean_gbps > 0.0 && r.maps == r.unmaps, "{name}: {r:?}");
    }
}

#[test]
fn soak_parameters_out_of_range_are_bad_input() {
    let s = cell(false);
    for c in [
        config(0, 1, None),
        config(10, 0, None),
        config(10, 20, None),
        config(10, 1, Some(0)),
        config(10, 1, Some(100_000)),
        config(8 * 24 * 3600 * 1000, 3600 * 1000, None),
    ] {
        let e = run_soak(&s, &c).expect_err("rejected");
        assert!(matches!(e, SoakError::Param { .. }), "{e}");
        assert!(e.is_bad_input());
    }
}

/// A scenario the soak cannot run is refused before anything runs, as bad input naming the
/// file, the field and what the soak needs.
#[test]
fn scenarios_the_soak_cannot_run_are_bad_input_naming_the_field() {
    let fio = examples::example("fio-nvme-strict").unwrap();
    let e = SoakScenario::prepare(fio, "fio.toml", None, false).unwrap_err();
    let msg = e.to_string();
    assert!(e.is_bad_input(), "{msg}");
    assert!(msg.contains("fio.toml"), "{msg}");
    assert!(msg.contains("workload.kind"), "{msg}");
    assert!(msg.contains("expected \"netperf\""), "{msg}");
    assert!(msg.contains("found \"fio\""), "{msg}");

    let ddw = examples::example("netperf-pseries-ddw").unwrap();
    let direct = ddw.replace("mode = \"ddw-dynamic\"", "mode = \"ddw-direct\"");
    let e = SoakScenario::prepare(&direct, "direct.toml", None, false).unwrap_err();
    let msg = e.to_string();
    assert!(e.is_bad_input(), "{msg}");
    assert!(
        msg.contains("direct.toml") && msg.contains("iommu.mode"),
        "{msg}"
    );

    let e = SoakScenario::prepare("experiment = 3", "x.toml", None, false).unwrap_err();
    assert!(e.is_bad_input(), "{e}");
}

#[test]
fn coefficient_of_variation_is_computed_not_assumed() {
    assert_eq!(mean_cv(&[]), (0.0, 0.0));
    assert_eq!(mean_cv(&[5.0, 5.0]), (5.0, 0.0));
    let (m, cv) = mean_cv(&[1.0, 3.0]);
    assert_eq!(m, 2.0);
    assert!((cv - 50.0).abs() < 1e-12);
}
