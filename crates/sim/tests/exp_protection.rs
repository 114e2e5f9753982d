//! The `protection` experiment: the hostile device reaches what each mode leaves open, strict
//! mode shows no stale hit, the run is deterministic, and the report serialises without
//! published figures.

use iolab_sim::experiment::ExperimentOptions;
use iolab_sim::experiments::protection::{self, Mode, ModeResult};
use iolab_sim::experiments::{self, ExperimentError};

fn results() -> Vec<ModeResult> {
    protection::run_results(protection::BUNDLED_SCENARIO, "protection.toml", 1)
        .unwrap()
        .1
}

fn of(rs: &[ModeResult], m: Mode) -> &ModeResult {
    rs.iter().find(|r| r.mode == m && !r.row.storm).unwrap()
}

#[test]
fn each_mode_leaves_open_what_it_should() {
    let rs = results();
    let strict = of(&rs, Mode::Strict);
    assert_eq!(strict.protection.stale_hits, 0);
    assert_eq!(strict.exposure.stale_reads, 0);
    assert!(strict.exposure.stale_read_attempts > 1000);
    assert_eq!(strict.protection.max_reachable_after_unmap_ns, 0);
    assert!(strict.row.smmu, "strict runs over the SMMUv3 model");
    // Strict's probes fault in the SMMU, and each fault is an event (written or lost).
    let ev = strict.events.unwrap();
    assert!(strict.protection.translation_faults >= strict.exposure.stale_read_attempts);
    assert_eq!(
        ev.written + ev.lost,
        strict.protection.translation_faults + strict.protection.permission_faults
    );
    let lazy = of(&rs, Mode::Lazy);
    // Lazy's stale hits are measured IOTLB hits: every successful probe of a just-unmapped
    // buffer is one (neighbour probes can land on other unmapped buffers' entries too).
    assert!(lazy.exposure.stale_reads > 0);
    assert!(lazy.protection.stale_hits >= lazy.exposure.stale_reads + lazy.exposure.stale_writes);
    // Not the worst case: some entries were gone (evicted or flushed) when probed.
    assert!(lazy.exposure.stale_reads < lazy.exposure.stale_read_attempts);
    // Strict pays for waiting on its invalidations; lazy does not.
    assert!(strict.iops < lazy.iops);
    let storm = rs.iter().find(|r| r.row.storm).unwrap();
    let se = storm.events.unwrap();
    assert!(se.overflows > 0 && se.lost > 0, "{se:?}");
    assert!(
        storm
            .measurement
            .get("faults.event_queue_overflows")
            .unwrap()
            .value
            > 0.0
    );
    assert!(lazy.protection.max_reachable_after_unmap_ns > 0);
    // The lazy window never outlasts the flush timer plus one I/O's time.
    assert!(lazy.protection.max_reachable_after_unmap_ns <= 11_000_000);
    for m in [Mode::NoIommu, Mode::Passthrough, Mode::DdwDirect] {
        let r = of(&rs, m);
        assert_eq!(
            r.exposure.stale_reads, r.exposure.stale_read_attempts,
            "{m:?}"
        );
        assert!(r.protection.bypass_accesses > 0, "{m:?}");
        assert_eq!(r.protection.subpage_exposed_bytes, 0, "{m:?}");
    }
    let dynamic = of(&rs, Mode::DdwDynamic);
    assert_eq!(
        dynamic.exposure.stale_reads, 0,
        "TCE updates are synchronous"
    );
    // 2 KiB buffers in 64 KiB TCEs expose more than in 4 KiB pages.
    assert_eq!(dynamic.protection.max_subpage_exposed_bytes, 65536 - 2048);
    assert_eq!(strict.protection.max_subpage_exposed_bytes, 4096 - 2048);
    for r in &rs {
        assert!(r.iops > 0.0);
        for name in [
            "protection.stale_hits",
            "protection.max_reachable_after_unmap_ns",
            "protection.subpage_exposed_bytes",
            "protection.bypass_accesses",
            "faults.translation",
            "faults.permission",
        ] {
            assert!(r.measurement.get(name).is_some(), "{name} in {:?}", r.mode);
        }
    }
}

#[test]
fn the_report_is_deterministic_and_serialises_without_published_figures() {
    let o = ExperimentOptions::default();
    let a = experiments::run_bundled(protection::NAME, &o).unwrap();
    let b = experiments::run_bundled(protection::NAME, &o).unwrap();
    assert_eq!(a, b);
    assert!(a.figures.iter().all(|f| f.published.is_none()));
    assert_eq!(a.measurements.len(), 8);
    let json = serde_json::to_string(&a).unwrap();
    assert!(json.contains("\"published\":null"));
    assert!(a.report_text.contains("ddw-dynamic"));
}

#[test]
fn protection_runs_only_when_named() {
    assert!(!experiments::NAMES.contains(&protection::NAME));
    assert!(experiments::is_known(protection::NAME));
}

#[test]
fn a_bad_scenario_names_the_field() {
    let bad = protection::BUNDLED_SCENARIO
        .replace("ddw_page_kib = { value = 64", "ddw_page_kib = { value = 48");
    let e = protection::run_results(&bad, "p.toml", 1).unwrap_err();
    assert!(matches!(e, ExperimentError::Input(_)));
    let msg = e.to_string();
    assert!(
        msg.contains("p.toml") && msg.contains("iommu.ddw_page_kib"),
        "{msg}"
    );
}

#[test]
fn repetitions_are_averaged() {
    let o = ExperimentOptions { runs: 2, seed: 1 };
    let r = experiments::run_bundled(protection::NAME, &o).unwrap();
    assert_eq!(r.runs, 2);
    assert!(r.measurements.iter().all(|m| m.attrs["runs"] == "2"));
    let (_, one) = protection::run_results(protection::BUNDLED_SCENARIO, "p.toml", 1).unwrap();
    let (_, two) =
        protection::run_results_runs(protection::BUNDLED_SCENARIO, "p.toml", 1, 2).unwrap();
    let strict = |rs: &[ModeResult]| of(rs, Mode::Strict).iops;
    let second = protection::run_results(
        protection::BUNDLED_SCENARIO,
        "p.toml",
        1u64.wrapping_add(0x9e37_79b9),
    )
    .unwrap()
    .1;
    let mean = (strict(&one) + strict(&second)) / 2.0;
    assert!(
        (strict(&two) - mean).abs() < 1e-6,
        "{} vs {mean}",
        strict(&two)
    );
    assert_eq!(of(&two, Mode::Strict).protection.stale_hits, 0);
}
