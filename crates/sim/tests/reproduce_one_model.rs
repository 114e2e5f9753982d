//! One model (issue 16): every cell of every bundled experiment file, emitted as a workload
//! scenario, measures through the `iolab run` path exactly what the experiment reports for
//! that cell.

use iolab_sim::experiment::ExperimentOptions;
use iolab_sim::lab::{self, LabOptions};
use iolab_sim::reproduce::{bundled, Experiment};

/// Shortens a bundled experiment so the check stays quick: every fio window to 3 ms after
/// a 1 ms ramp (the equality holds at any length).
fn short(text: &str) -> String {
    text.replace("runtime_ms = 50", "runtime_ms = 3")
        .replace("ramp_ms = 10", "ramp_ms = 1")
}

#[test]
fn every_emitted_cell_measures_what_reproduce_reports() {
    assert!(!bundled::names().is_empty());
    // The lab's own experiments are bundled files too, and checked the same way.
    assert!(bundled::names().contains(&"protection"));
    for name in bundled::names() {
        let text = short(bundled::text(name).unwrap());
        let exp = Experiment::parse(&text, "test.toml").unwrap();
        let seed = 7;
        let report = exp.run(&ExperimentOptions { runs: 1, seed }).unwrap();
        let cells = exp.cell_scenarios(seed).unwrap();
        assert_eq!(cells.len(), report.measurements.len(), "{name}");
        for ((cell, scenario), reproduced) in cells.iter().zip(&report.measurements) {
            let run = lab::run_scenario(scenario, "emitted.toml", &LabOptions::default())
                .unwrap_or_else(|e| panic!("{name} {cell}: {e}"));
            assert_eq!(
                run.seed, seed,
                "{name} {cell}: the emitted file carries the seed"
            );
            let ran = &run.report.measurements[0];
            assert_eq!(ran.config, reproduced.config, "{name} {cell}");
            assert_eq!(
                ran.metrics, reproduced.metrics,
                "{name} {cell}: metrics differ between run and reproduce"
            );
            assert_eq!(ran.latency, reproduced.latency, "{name} {cell}");
            assert_eq!(ran.cpu, reproduced.cpu, "{name} {cell}");
        }
        // Every figure is one of those measurements' metrics.
        for f in &report.figures {
            assert!(f.lab.is_finite(), "{name} {}", f.id);
        }
    }
}

#[test]
fn the_seed_is_written_into_every_emitted_file() {
    let text = short(bundled::text("smmuv3-cmdq").unwrap());
    let exp = Experiment::parse(&text, "test.toml").unwrap();
    let a = exp.cell_scenarios(1).unwrap();
    let b = exp.cell_scenarios(2).unwrap();
    for ((_, x), (_, y)) in a.iter().zip(&b) {
        assert!(x.contains("seed = 1"), "{x}");
        assert!(y.contains("seed = 2"), "{y}");
    }
}

#[test]
fn calibrations_reach_only_the_cells_they_name() {
    let text = short(bundled::text("smmuv3-cmdq").unwrap());
    let exp = Experiment::parse(&text, "test.toml").unwrap();
    for (cell, scenario) in exp.cell_scenarios(1).unwrap() {
        let on_d05 = cell.starts_with("d05_");
        assert_eq!(
            scenario.contains("\"iommu.cmdq.sync_latency\""),
            on_d05,
            "{cell}: the sync-latency calibration applies on hisilicon-d05 only"
        );
        assert_eq!(
            scenario.contains("hba_command_ns = "),
            cell.starts_with("d05_sas8"),
            "{cell}: the HBA calibration applies to the SAS row only"
        );
    }
}

#[test]
fn the_reaim_layout_prints_the_published_row_above_the_labs_per_user_count() {
    let text = bundled::text("sba-vmerge").unwrap();
    let exp = Experiment::parse(text, "test.toml").unwrap();
    let report = exp.run(&ExperimentOptions { runs: 1, seed: 1 }).unwrap();
    let novmerge = &report.measurements[0];
    for users in [100, 500] {
        let jpm = novmerge
            .metrics
            .iter()
            .find(|m| m.name == format!("reaim.users{users}.jpm"))
            .unwrap()
            .value;
        let row = |who: &str| {
            let start = format!("{who:<16}{users:>8}");
            let at = report
                .report_text
                .find(&start)
                .unwrap_or_else(|| panic!("no {who} row for {users}: {}", report.report_text));
            report.report_text[at..].lines().next().unwrap().to_owned()
        };
        assert!(row("lab").contains(&format!("{jpm:.2}")), "{}", row("lab"));
        let published = report
            .figures
            .iter()
            .find(|f| f.id == format!("novmerge.users{users}"))
            .unwrap()
            .published
            .unwrap();
        let line = row("published");
        assert!(line.contains(&format!("{published:.2}")), "{line}");
        // The published row comes first (the novmerge cell's table comes first).
        assert!(report.report_text.find(&line) < report.report_text.find(&row("lab")));
    }
}

/// The bundled examples that say they are an experiment's cell are that cell: the same lab
/// scenario (name and description aside), so `iolab run --example` gives the validated answer.
#[test]
fn examples_that_name_a_cell_are_that_cell() {
    let exp = Experiment::parse(bundled::text("smmuv3-cmdq").unwrap(), "smmuv3-cmdq.toml").unwrap();
    let cells = exp.cell_scenarios(1).unwrap();
    let strip = |text: &str| {
        let mut t: toml::Table = text.parse().unwrap();
        t.remove("name");
        t.remove("description");
        t
    };
    for (example, cell) in [
        ("fio-sas-spinlock", "d05_sas8.spinlock"),
        ("fio-sas-lockfree", "d05_sas8.lockfree"),
    ] {
        let emitted = &cells.iter().find(|(c, _)| c == cell).unwrap().1;
        let bundled = lab::examples::example(example).unwrap();
        assert_eq!(strip(bundled), strip(emitted), "{example} is not {cell}");
    }
}
