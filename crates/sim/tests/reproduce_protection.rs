//! The lab's own `protection` experiment, now a data file run on the lab's one block stack
//! with a hostile NVMe device (`[device.hostile]`): each mode leaves open what it should,
//! strict shows no stale hit, lazy a bounded window, a fault storm overflows the SMMUv3
//! event queue, the run is deterministic, and bad input names its field.

mod common;
use common::value as v;

use iolab_sim::experiment::ExperimentOptions;
use iolab_sim::lab::{self, LabError, LabOptions};
use iolab_sim::metrics::Measurement;
use iolab_sim::reproduce::{self, bundled, Experiment};

fn experiment() -> Experiment {
    Experiment::parse(bundled::text("protection").unwrap(), "protection.toml").unwrap()
}

fn measurements() -> Vec<Measurement> {
    experiment()
        .run(&ExperimentOptions { runs: 1, seed: 1 })
        .unwrap()
        .measurements
}

fn cell<'a>(ms: &'a [Measurement], id: &str) -> &'a Measurement {
    ms.iter()
        .find(|m| m.config == id)
        .unwrap_or_else(|| panic!("no cell {id}"))
}

#[test]
fn each_mode_leaves_open_what_it_should() {
    let ms = measurements();
    assert_eq!(ms.len(), 8);
    let strict = cell(&ms, "d06.strict");
    assert_eq!(strict.attrs["iommu_model"], "smmuv3");
    assert_eq!(v(strict, "protection.stale_hits"), 0.0);
    assert_eq!(v(strict, "hostile.stale_reads"), 0.0);
    assert!(v(strict, "hostile.stale_read_attempts") > 1000.0);
    assert_eq!(v(strict, "protection.max_reachable_after_unmap_ns"), 0.0);
    // Strict's probes fault in the SMMU, and each fault is an event record (written or
    // lost).
    let faults = v(strict, "faults.translation") + v(strict, "faults.permission");
    assert!(v(strict, "faults.translation") >= v(strict, "hostile.stale_read_attempts"));
    assert_eq!(
        v(strict, "faults.events_written") + v(strict, "faults.events_lost"),
        faults
    );

    let lazy = cell(&ms, "d06.lazy");
    // Lazy's stale hits are measured IOTLB hits: every successful probe of a just-unmapped
    // buffer is one (neighbour probes can land on other unmapped buffers' entries too).
    let (reads, writes) = (
        v(lazy, "hostile.stale_reads"),
        v(lazy, "hostile.stale_writes"),
    );
    assert!(reads > 0.0);
    assert!(v(lazy, "protection.stale_hits") >= reads + writes);
    // Not the worst case: some entries were gone (evicted or flushed) when probed.
    assert!(reads < v(lazy, "hostile.stale_read_attempts"));
    // Strict pays for waiting on its invalidations; lazy does not.
    assert!(v(strict, "read.iops") < v(lazy, "read.iops"));
    // The lazy window is measured, and never outlasts the flush timer plus one I/O.
    let window = v(lazy, "protection.max_reachable_after_unmap_ns");
    assert!(window > 0.0 && window <= 11e6, "{window}");

    // The storm overflows the event queue between drains, and loses more than strict.
    let storm = cell(&ms, "d06.strict_storm");
    assert!(v(storm, "faults.event_queue_overflows") > 0.0);
    assert!(v(storm, "faults.events_lost") > v(strict, "faults.events_lost"));
    assert!(
        v(storm, "hostile.neighbour_attempts") > 10.0 * v(strict, "hostile.neighbour_attempts")
    );

    // Nothing translates: every probe of a freed buffer succeeds, every access bypasses.
    for id in [
        "power.off",
        "power.passthrough",
        "power.ddw_direct",
        "d06.off",
    ] {
        let m = cell(&ms, id);
        assert_eq!(
            v(m, "hostile.stale_reads"),
            v(m, "hostile.stale_read_attempts"),
            "{id}"
        );
        assert!(v(m, "protection.bypass_accesses") > 0.0, "{id}");
        assert_eq!(v(m, "protection.subpage_exposed_bytes"), 0.0, "{id}");
        assert!(m.get("faults.events_written").is_none(), "{id}: no SMMU");
    }
    let dynamic = cell(&ms, "power.ddw_dynamic");
    assert_eq!(
        v(dynamic, "hostile.stale_reads"),
        0.0,
        "TCE updates are synchronous"
    );
    // 2 KiB buffers in 64 KiB TCEs expose more than in 4 KiB pages.
    assert_eq!(
        v(dynamic, "protection.max_subpage_exposed_bytes"),
        65536.0 - 2048.0
    );
    assert_eq!(
        v(strict, "protection.max_subpage_exposed_bytes"),
        4096.0 - 2048.0
    );
    // Off and passthrough expose the neighbours of live buffers more than strict.
    for id in ["power.off", "power.passthrough", "d06.off"] {
        assert!(
            v(cell(&ms, id), "hostile.neighbour_readable_bytes")
                > v(strict, "hostile.neighbour_readable_bytes"),
            "{id}"
        );
    }
    for m in &ms {
        assert!(v(m, "read.iops") > 0.0);
        for name in [
            "protection.max_reachable_after_unmap_ns",
            "protection.subpage_exposed_bytes",
            "protection.bypass_accesses",
            "faults.translation",
            "faults.permission",
            "hostile.stale_reads",
            "hostile.neighbour_readable_bytes",
        ] {
            assert!(m.get(name).is_some(), "{name} in {}", m.config);
        }
    }
}

#[test]
fn the_report_is_deterministic_and_has_no_published_figure() {
    let o = ExperimentOptions { runs: 1, seed: 1 };
    let a = experiment().run(&o).unwrap();
    let b = experiment().run(&o).unwrap();
    assert_eq!(a, b);
    assert_eq!(a.figures.len(), 24);
    assert!(a.figures.iter().all(|f| f.published.is_none()));
    let json = serde_json::to_string(&a).unwrap();
    assert!(json.contains("\"published\":null"));
    // The table: a line per cell, "vs off" against the cell's own machine.
    let line = |id: &str| {
        a.report_text
            .lines()
            .find(|l| l.starts_with(id))
            .unwrap_or_else(|| panic!("no line {id}: {}", a.report_text))
            .to_owned()
    };
    assert!(line("power.off").contains("+0.0%"));
    assert!(line("d06.off").contains("+0.0%"));
    let pct = |id: &str, base: &str| {
        let m = |c: &str| v(cell(&a.measurements, c), "read.iops");
        format!("{:+.1}%", (m(id) - m(base)) / m(base) * 100.0)
    };
    assert!(line("d06.strict ").contains(&pct("d06.strict", "d06.off")));
    assert!(line("power.ddw_dynamic").contains(&pct("power.ddw_dynamic", "power.off")));
}

#[test]
fn protection_runs_only_when_named() {
    assert!(!reproduce::default_names().contains(&"protection"));
    assert!(reproduce::all_names().contains(&"protection"));
    assert!(reproduce::extra_names().contains(&"protection"));
}

#[test]
fn repetitions_are_averaged() {
    let e = experiment();
    let two = e.run(&ExperimentOptions { runs: 2, seed: 1 }).unwrap();
    assert_eq!(two.runs, 2);
    assert_eq!(two.measurements.len(), 16);
    let iops = |config: &str| {
        two.measurements
            .iter()
            .filter(|m| m.config.starts_with(config))
            .map(|m| v(m, "read.iops"))
            .sum::<f64>()
            / 2.0
    };
    let fig = two
        .figures
        .iter()
        .find(|f| f.id == "d06.strict.iops")
        .unwrap();
    assert!((fig.lab - iops("d06.strict#")).abs() < 1e-6, "{}", fig.lab);
}

/// The strict cell as a workload scenario (what `--emit-scenarios` writes).
fn strict_scenario() -> String {
    experiment()
        .cell_scenarios(1)
        .unwrap()
        .into_iter()
        .find(|(c, _)| c == "d06.strict")
        .unwrap()
        .1
}

fn refused(text: &str) -> String {
    match lab::run_scenario(text, "s.toml", &LabOptions::default()) {
        Err(e @ LabError::Input(_)) => e.to_string(),
        Err(e) => panic!("not an input error: {e}"),
        Ok(_) => panic!("accepted"),
    }
}

#[test]
fn a_bad_hostile_or_event_queue_field_is_named() {
    let s = strict_scenario();
    assert!(s.contains("neighbour_every = 16"), "{s}");
    let msg = refused(&s.replace("neighbour_every = 16", "neighbour_every = 0"));
    assert!(msg.contains("device[0].hostile.neighbour_every"), "{msg}");
    let msg = refused(&s.replace("probe_bytes = 64", "probe_bytes = 64\nsize = 1"));
    assert!(msg.contains("size"), "{msg}");
    let msg = refused(&s.replace("evtq_log2size = 7", "evtq_log2size = 40"));
    assert!(msg.contains("iommu.evtq_log2size"), "{msg}");
    // The event queue is SMMUv3's: refused without one.
    let off = s
        .replace("model = \"smmuv3\"", "model = \"none\"")
        .replace("mode = \"strict\"", "mode = \"off\"");
    let off: String = off
        .lines()
        .filter(|l| !l.starts_with("cmdq"))
        .collect::<Vec<_>>()
        .join("\n");
    let msg = refused(&off);
    assert!(msg.contains("iommu.evtq_log2size"), "{msg}");
}

#[test]
fn hostile_probing_applies_to_fio_only() {
    let text = r#"
[machine]
platform = "hisilicon-d06"
cpus = 4
[iommu]
model = "none"
[[device]]
kind = "nvme"
[device.hostile]
neighbour_every = 4
[workload]
kind = "dma_map_benchmark"
threads = 1
runtime_ms = 1
"#;
    let msg = refused(text);
    assert!(
        msg.contains("device[0].hostile") && msg.contains("fio"),
        "{msg}"
    );
}

#[test]
fn an_honest_device_reports_no_exposure() {
    let s = strict_scenario();
    let start = s.find("[device.hostile]").unwrap();
    let end = s[start..].find("\n\n").map_or(s.len(), |e| start + e);
    let honest = format!("{}{}", &s[..start], &s[end..]);
    let run = lab::run_scenario(&honest, "s.toml", &LabOptions::default()).unwrap();
    let m = &run.report.measurements[0];
    assert!(m.get("hostile.stale_reads").is_none());
    assert!(m.get("faults.events_written").is_none());
    assert_eq!(v(m, "faults.translation"), 0.0);
}

#[test]
fn a_bad_experiment_cell_names_the_cell_and_field() {
    let bad = bundled::text("protection").unwrap().replace(
        "ddw_page_kib = 64, ddw_window_gib",
        "ddw_page_kib = 48, ddw_window_gib",
    );
    let e = Experiment::parse(&bad, "p.toml").unwrap_err();
    assert!(e.is_bad_input());
    let msg = e.to_string();
    assert!(
        msg.contains("p.toml")
            && msg.contains("power.ddw_dynamic")
            && msg.contains("iommu.ddw_page_kib"),
        "{msg}"
    );
}
