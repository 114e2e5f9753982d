//! bonnie on the SCSI disk (the re-aim disk model) through the lab's `BlockQueue` adapter:
//! the bundled examples print bonnie++ 1.03 rows, every byte the page cache submits reaches
//! the disk once and every mapping is undone, the SBA costs CPU per request that dma-direct
//! does not, and runs are deterministic.

use iolab_sim::lab::{self, examples, LabOptions, LabRun};
use iolab_sim::workloads::bonnie::CSV_COLUMNS;

fn example(name: &str) -> LabRun {
    lab::run_scenario(
        examples::example(name).unwrap(),
        "test.toml",
        &LabOptions::default(),
    )
    .expect("scenario runs")
}

fn metric(r: &LabRun, name: &str) -> f64 {
    r.report.measurements[0]
        .get(name)
        .unwrap_or_else(|| panic!("metric {name} missing"))
        .value
}

#[test]
fn scsi_examples_print_rows_in_bonnies_column_order() {
    for name in ["bonnie-scsi-sba", "bonnie-scsi-off"] {
        let r = example(name);
        let row = r.report.report_text.lines().next().unwrap();
        let cols: Vec<&str> = row.split(',').collect();
        assert_eq!(cols.len(), CSV_COLUMNS.len(), "{name}: {row}");
        let col = |c: &str| cols[CSV_COLUMNS.iter().position(|x| *x == c).unwrap()];
        assert_eq!(col("name"), name);
        for (c, m) in [
            ("putc_kps", "bonnie.out_char_kps"),
            ("write_kps", "bonnie.out_block_kps"),
            ("read_kps", "bonnie.in_block_kps"),
        ] {
            let v: f64 = col(c).parse().unwrap_or_else(|_| panic!("{name}: {c}"));
            assert!(v > 0.0, "{name}: {c}");
            assert_eq!(v, metric(&r, m).round(), "{name}: {c}");
        }
    }
}

#[test]
fn every_submitted_byte_reaches_the_disk_once() {
    for name in ["bonnie-scsi-sba", "bonnie-scsi-off"] {
        let r = example(name);
        let submitted = metric(&r, "block.read_bytes") + metric(&r, "block.write_bytes");
        assert!(submitted > 0.0);
        assert_eq!(metric(&r, "scsi.bytes"), submitted, "{name}");
        // The 16 MiB file is written whole (per-char, then block) at least twice.
        assert!(
            metric(&r, "block.write_bytes") >= 2.0 * 16.0 * 1048576.0,
            "{name}"
        );
    }
}

#[test]
fn the_sba_costs_cpu_per_request_and_translates_every_access() {
    let sba = example("bonnie-scsi-sba");
    let off = example("bonnie-scsi-off");
    assert!(metric(&sba, "scsi.iommu_cpu_ns_per_request") > 0.0);
    assert_eq!(metric(&off, "scsi.iommu_cpu_ns_per_request"), 0.0);
    assert_eq!(metric(&sba, "protection.bypass_accesses"), 0.0);
    assert!(metric(&off, "protection.bypass_accesses") > 0.0);
}

#[test]
fn scsi_runs_are_deterministic() {
    let a = example("bonnie-scsi-sba");
    let b = example("bonnie-scsi-sba");
    assert_eq!(a.report.report_text, b.report.report_text);
    assert_eq!(a.report.measurements, b.report.measurements);
}
