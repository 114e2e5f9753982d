//! The pSeries soak (SEEDS.md #4) over a short virtual time: every checkpoint's invariants
//! hold and the report adds up.

use iolab_sim::experiments::pseries_ddw::BUNDLED_SCENARIO;
use iolab_sim::soak::{mean_cv, run_soak, SoakConfig, SoakDirection, SoakError};

fn config(duration_ms: u64, interval_ms: u64, threads: Option<usize>, ddw: bool) -> SoakConfig {
    SoakConfig {
        duration_ns: duration_ms * 1_000_000,
        interval_ns: interval_ms * 1_000_000,
        threads,
        ddw,
        direction: SoakDirection::Write,
        seed: 7,
    }
}

fn read(mut c: SoakConfig) -> SoakConfig {
    c.direction = SoakDirection::Read;
    c
}

#[test]
fn a_short_64_thread_ddw_soak_passes_every_checkpoint() {
    let r = run_soak(BUNDLED_SCENARIO, "bundled", &config(20, 4, None, true)).expect("soak");
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
    let again = run_soak(BUNDLED_SCENARIO, "bundled", &config(20, 4, None, true)).unwrap();
    assert_eq!(r, again);
}

#[test]
fn a_short_64_thread_ddw_read_soak_passes_every_checkpoint() {
    let c = read(config(20, 4, None, true));
    let r = run_soak(BUNDLED_SCENARIO, "bundled", &c).expect("soak");
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
    let again = run_soak(BUNDLED_SCENARIO, "bundled", &c).unwrap();
    assert_eq!(r, again);
}

#[test]
fn the_default_window_read_soak_passes_too() {
    let r = run_soak(
        BUNDLED_SCENARIO,
        "bundled",
        &read(config(8, 4, Some(8), false)),
    )
    .expect("soak");
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
    let r = run_soak(BUNDLED_SCENARIO, "bundled", &config(8, 4, Some(8), false)).expect("soak");
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
}

#[test]
fn soak_parameters_out_of_range_are_bad_input() {
    for c in [
        config(0, 1, None, true),
        config(10, 0, None, true),
        config(10, 20, None, true),
        config(10, 1, Some(0), true),
        config(10, 1, Some(100_000), true),
        config(8 * 24 * 3600 * 1000, 3600 * 1000, None, true),
    ] {
        let e = run_soak(BUNDLED_SCENARIO, "bundled", &c).expect_err("rejected");
        assert!(matches!(e, SoakError::Param { .. }), "{e}");
        assert!(e.is_bad_input());
    }
    let e = run_soak("experiment = 3", "x.toml", &config(10, 1, None, true)).unwrap_err();
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
