//! The ipmmu-usb experiment file (scenarios/experiments/ipmmu-usb.toml, run by the generic
//! runner) and the mechanisms its cells exercise on the lab: the report's bonnie++ rows,
//! determinism, the link bounds, the IPMMU's segment merging and flushes, the swiotlb bounce
//! without it, the protection report, the calibration's claims (docs/model/ipmmu-usb.md),
//! the fsync and file-test cache flushes, and the overwrite cost.
//!
//! Most tests edit the experiment file (its base scenario or a calibration) and run one or
//! two of its cells as lab scenarios (`Experiment::cell_scenarios`, `lab::run_scenario`):
//! exactly what `iolab reproduce` measures for those cells (tests/reproduce_one_model.rs).

mod common;
use common::value;
use common::with_calibration_value;

use std::sync::OnceLock;

use iolab_sim::experiment::{ExperimentOptions, ExperimentReport, Role};
use iolab_sim::lab::{self, LabError, LabOptions};
use iolab_sim::metrics::Measurement;
use iolab_sim::reproduce::{bundled, Experiment, ReproduceError};
use iolab_sim::tomlfile::InputError;

/// The cells, in report order.
const CELLS: [&str; 4] = [
    "superspeed.no_iommu",
    "highspeed.no_iommu",
    "superspeed.iommu",
    "highspeed.iommu",
];

fn bundled_text() -> &'static str {
    bundled::text("ipmmu-usb").expect("ipmmu-usb is bundled")
}

/// `text` with its single occurrence of `from` replaced.
#[track_caller]
fn replace_once(text: &str, from: &str, to: &str) -> String {
    assert_eq!(
        text.matches(from).count(),
        1,
        "the experiment file no longer has `{from}` once"
    );
    text.replacen(from, to, 1)
}

/// `text` with `line` added to the base workload (`[base.workload]`).
fn with_workload(text: &str, line: &str) -> String {
    replace_once(
        text,
        "kind = \"bonnie\"\n",
        &format!("kind = \"bonnie\"\n{line}\n"),
    )
}

/// `text` with `line` added to the base device (`[[base.device]]`).
fn with_device(text: &str, line: &str) -> String {
    replace_once(
        text,
        "dma_mask_bits = 32\n",
        &format!("dma_mask_bits = 32\n{line}\n"),
    )
}

/// `text` with `line` added to the base kernel (`[base.kernel]`).
fn with_kernel(text: &str, line: &str) -> String {
    replace_once(
        text,
        "block_virt_merge = false\n",
        &format!("block_virt_merge = false\n{line}\n"),
    )
}

/// The experiment file with a 16 MiB file (dirty thresholds scale with it), 300 seeks and
/// 64 files per file test.
fn shortened() -> String {
    replace_once(
        bundled_text(),
        "file_mib = 64\n",
        "file_mib = 16\nseeks = 300\nfiles_run = 64\n",
    )
}

fn parse(text: &str) -> Experiment {
    Experiment::parse(text, "test.toml").unwrap_or_else(|e| panic!("{e}"))
}

fn run(text: &str) -> ExperimentReport {
    parse(text)
        .run(&ExperimentOptions { runs: 1, seed: 1 })
        .unwrap_or_else(|e| panic!("{e}"))
}

/// The shortened experiment's report (seed 1), run once for the tests that only read it.
fn short_report() -> &'static ExperimentReport {
    static REPORT: OnceLock<ExperimentReport> = OnceLock::new();
    REPORT.get_or_init(|| run(&shortened()))
}

/// Cell `id` of experiment file `text` run as a lab scenario on seed 1 (the seed
/// `short_report` runs every cell on).
fn measure(text: &str, id: &str) -> Measurement {
    let (_, scenario) = parse(text)
        .cell_scenarios(1)
        .unwrap_or_else(|e| panic!("{e}"))
        .into_iter()
        .find(|(c, _)| c == id)
        .unwrap_or_else(|| panic!("no cell {id}"));
    let run = lab::run_scenario(&scenario, &format!("{id}.toml"), &LabOptions::default())
        .unwrap_or_else(|e| panic!("{id}: {e}"));
    run.report
        .measurements
        .into_iter()
        .next()
        .expect("a measurement")
}

fn cell<'a>(r: &'a ExperimentReport, id: &str) -> &'a Measurement {
    r.measurements
        .iter()
        .find(|m| m.config == id)
        .unwrap_or_else(|| panic!("no measurement {id}"))
}

fn figure(r: &ExperimentReport, id: &str) -> f64 {
    r.figures
        .iter()
        .find(|f| f.id == id)
        .unwrap_or_else(|| panic!("no figure {id}"))
        .lab
}

/// The field an edited experiment file is refused at: a bad-input error from the lab about
/// one cell's scenario.
#[track_caller]
fn refused_at(text: &str) -> String {
    let e = Experiment::parse(text, "bad.toml").expect_err("refused");
    assert!(e.is_bad_input(), "{e}");
    assert!(e.to_string().contains("bad.toml"), "{e}");
    match e {
        ReproduceError::Cell { source, .. } => match *source {
            LabError::Input(InputError::Field { field, .. }) => field,
            other => panic!("expected a field error, got {other}"),
        },
        other => panic!("expected a cell's error, got {other}"),
    }
}

#[test]
fn bad_values_in_the_file_are_refused_with_the_field_named() {
    // A calibration out of range (a link cannot move more than it signals).
    assert_eq!(
        refused_at(&with_calibration_value(
            bundled_text(),
            "device[0].protocol_efficiency",
            "1.5"
        )),
        "device[0].protocol_efficiency"
    );
    assert_eq!(
        refused_at(&with_device(bundled_text(), "signal_bits_per_s = -5e9")),
        "device[0].signal_bits_per_s"
    );
    assert_eq!(
        refused_at(&with_kernel(bundled_text(), "bogus = 1")),
        "kernel.bogus"
    );
    assert_eq!(
        refused_at(&with_workload(bundled_text(), "flusher_cpu = 9")),
        "workload.flusher_cpu"
    );
    // jbd2 sends at most a flush before and one after the commit block.
    assert_eq!(
        refused_at(&with_kernel(bundled_text(), "fsync_commit_flushes = 3")),
        "kernel.fsync_commit_flushes"
    );
    assert_eq!(
        refused_at(&with_device(bundled_text(), "media_flush_us = -1.0")),
        "device[0].media_flush_us"
    );
    assert_eq!(
        refused_at(&with_workload(bundled_text(), "overwrite_page_ns = -1")),
        "workload.overwrite_page_ns"
    );
}

#[test]
fn report_rows_parse_in_bonnie_column_order() {
    let r = short_report();
    let rows = |prefix: &str| -> Vec<&str> {
        r.report_text
            .lines()
            .filter(|l| l.starts_with(prefix) && l.contains(",8G,"))
            .collect()
    };
    assert_eq!(rows("published:").len(), 4);
    let lab = rows("lab:");
    assert_eq!(lab.len(), 4);
    // Rows, then columns.
    let order = [
        "superspeed.no_iommu",
        "superspeed.iommu",
        "highspeed.no_iommu",
        "highspeed.iommu",
    ];
    for (row, id) in lab.iter().zip(order) {
        let cols: Vec<&str> = row.trim_start_matches("lab:").trim().split(',').collect();
        assert_eq!(cols.len(), 27, "{row}");
        assert_eq!(cols[0], id);
        assert_eq!(cols[1], "8G");
        for c in &cols[2..12] {
            let v: f64 = c.parse().unwrap_or_else(|e| panic!("{c}: {e} in {row}"));
            assert!(v > 0.0, "{row}");
        }
        let seeks: f64 = cols[12].parse().unwrap();
        assert!(seeks > 0.0, "{row}");
        assert_eq!(cols[14], "16");
        // Create and delete rates and %CPU are numbers; the stat ("read") tests are too
        // fast to measure: `+++++` and `+++`.
        for k in [0, 2, 3, 5] {
            let rate: f64 = cols[15 + 2 * k].parse().unwrap();
            assert!(rate > 100.0, "{row}");
            let _cpu: f64 = cols[16 + 2 * k].parse().unwrap();
        }
        for k in [1, 4] {
            assert_eq!(&cols[15 + 2 * k..17 + 2 * k], &["+++++", "+++"], "{row}");
        }
    }
}

#[test]
fn same_seed_same_report_and_required_ids() {
    let a = short_report();
    let b = run(&shortened());
    assert_eq!(*a, b);
    for speed in ["superspeed", "highspeed"] {
        for m in [
            "out_char",
            "out_block",
            "rewrite",
            "in_char",
            "in_block",
            "seeks",
        ] {
            let id = format!("{speed}.{m}");
            assert!(a.effects.iter().any(|e| e.id == id), "no effect {id}");
        }
    }
    let f = a
        .figures
        .iter()
        .find(|f| f.id == "superspeed.iommu.out_block")
        .unwrap();
    assert_eq!((f.unit.as_str(), f.role), ("K/sec", Role::Prediction));
    assert!(a
        .figures
        .iter()
        .any(|f| f.id == "superspeed.iommu.out_block_cpu" && f.unit == "%CPU"));
    let c = a
        .figures
        .iter()
        .find(|f| f.id == "superspeed.no_iommu.in_block")
        .unwrap();
    assert_eq!(c.role, Role::Calibration);
    assert_eq!(a.calibrated.len(), 6);
    for m in &a.measurements {
        let (speed, column) = m.config.split_once('.').unwrap();
        assert_eq!(m.attrs["usb_speed"], speed);
        let mode = if column == "iommu" { "strict" } else { "off" };
        assert_eq!(m.attrs["iommu_mode"], mode, "{}", m.config);
    }
}

#[test]
fn high_speed_is_link_bound_and_never_exceeds_the_link() {
    let r = short_report();
    // 480 Mb/s = 60 MB/s = 58594 KiB/s: no phase may exceed it.
    for case in ["highspeed.no_iommu", "highspeed.iommu"] {
        for m in ["out_block", "in_block", "out_char", "in_char", "rewrite"] {
            let id = format!("{case}.{m}");
            assert!(figure(r, &id) < 58594.0, "{id}");
        }
    }
    // 5 Gb/s with 8b/10b = 500 MB/s.
    for case in ["superspeed.no_iommu", "superspeed.iommu"] {
        for m in ["out_block", "in_block"] {
            let id = format!("{case}.{m}");
            assert!(figure(r, &id) < 488281.0, "{id}");
        }
    }
    // Link-bound: the IOMMU changes block throughput by little at High-Speed.
    let e = r
        .effects
        .iter()
        .find(|e| e.id == "highspeed.in_block")
        .unwrap();
    assert!(e.lab_pct.abs() < 5.0, "{}", e.lab_pct);
}

/// Linux v5.1: usb-storage on the xHCI has the same block limits with and without the IPMMU,
/// and the block layer does not know that dma-iommu merges pages, so the IPMMU must not
/// change the commands the device sees; the strict IPMMU flushes once per command (its
/// unmap), dma-direct never.
#[test]
fn the_iommu_flushes_once_per_command_and_keeps_the_commands() {
    let r = short_report();
    for speed in ["superspeed", "highspeed"] {
        let off = cell(r, &format!("{speed}.no_iommu"));
        let on = cell(r, &format!("{speed}.iommu"));
        let (off_cmds, on_cmds) = (value(off, "usb.commands"), value(on, "usb.commands"));
        assert!(off_cmds > 100.0, "{speed}: {off_cmds} commands");
        assert!(
            (off_cmds - on_cmds).abs() <= 0.005 * off_cmds,
            "{speed}: {off_cmds} vs {on_cmds} commands"
        );
        assert_eq!(value(off, "usb.flushes"), 0.0, "{speed}");
        assert_eq!(value(on, "usb.flushes"), on_cmds, "{speed}");
        assert!(value(on, "usb.unmap_ns") > 0.0, "{speed}");
    }
}

/// Milliseconds per MiB of a cell's block read and block write.
fn block_ms_per_mib(m: &Measurement) -> [f64; 2] {
    let ms = |kps: f64| 1024.0 / kps * 1000.0;
    [
        ms(value(m, "bonnie.in_block_kps")),
        ms(value(m, "bonnie.out_block_kps")),
    ]
}

/// dma-iommu merges each command's pages into 64 KiB DMA segments; dma-direct hands the
/// xHCI one TRB per page. A dearer TRB therefore costs the block phases ~10-16 times more
/// time per MiB without the IPMMU (256 TRBs per MiB) than with it (16 for 1 MiB commands;
/// 24 for High-Speed reads, whose 128 KiB readahead goes as a 120 KiB command of two
/// segments and an 8 KiB one).
#[test]
fn the_iommu_merges_each_commands_pages_into_fewer_segments() {
    let text = shortened();
    let dearer = with_device(&text, "per_segment_ns = 10500");
    for speed in ["superspeed", "highspeed"] {
        let grew = |column: &str| {
            let id = format!("{speed}.{column}");
            let (a, b) = (
                block_ms_per_mib(&measure(&text, &id)),
                block_ms_per_mib(&measure(&dearer, &id)),
            );
            // Per ms of TRB cost: TRBs per MiB.
            [0, 1].map(|i| (b[i] - a[i]) / 0.01)
        };
        let (off, on) = (grew("no_iommu"), grew("iommu"));
        for i in 0..2 {
            assert!(
                (230.0..270.0).contains(&off[i]),
                "{speed}: {off:?} TRBs per MiB without the IPMMU"
            );
            assert!(
                (10.0..=24.5).contains(&on[i]),
                "{speed}: {on:?} TRBs per MiB with the IPMMU"
            );
        }
    }
}

/// Half of the H3's RAM (the 2 GiB bank at 0x5_0000_0000) is beyond the xHCI's 32-bit
/// mask: without the IPMMU dma-direct bounces those pages through swiotlb, a CPU copy in
/// map and unmap. The bounce time is about half of what it is when every page lies above
/// 4 GiB, and nothing bounces once the mask reaches all of memory.
#[test]
fn without_the_iommu_pages_above_4_gib_are_bounced() {
    let text = shortened();
    let dma_ns = |t: &str| {
        let m = measure(t, "superspeed.no_iommu");
        (value(&m, "usb.map_ns") + value(&m, "usb.unmap_ns")) * value(&m, "usb.commands")
    };
    let h3 = dma_ns(&text);
    let reaches_all = dma_ns(&replace_once(
        &text,
        "dma_mask_bits = 32\n",
        "dma_mask_bits = 40\n",
    ));
    let banks = text
        .lines()
        .find(|l| l.starts_with("memory_banks"))
        .expect("a memory_banks line");
    let all_above =
        dma_ns(&replace_once(&text, banks, "").replace("memory_gib = 4\n", "memory_gib = 8\n"));
    assert!(
        reaches_all < h3 && h3 < all_above,
        "{reaches_all} {h3} {all_above}"
    );
    let bounced = (h3 - reaches_all) / (all_above - reaches_all);
    assert!((0.35..0.70).contains(&bounced), "bounced {bounced}");
    // With the IPMMU every page gets a 32-bit IOVA: the mask changes nothing.
    let on = |t: &str| value(&measure(t, "superspeed.iommu"), "bonnie.in_block_kps");
    let wide = replace_once(&text, "dma_mask_bits = 32\n", "dma_mask_bits = 40\n");
    let (narrow, wide) = (on(&text), on(&wide));
    assert!((narrow / wide - 1.0).abs() < 0.001, "{narrow} vs {wide}");
}

#[test]
fn every_configuration_carries_the_protection_report_of_its_domain() {
    let r = short_report();
    assert_eq!(r.measurements.len(), 4);
    for m in &r.measurements {
        if m.attrs["iommu_mode"] == "off" {
            // dma-direct: every xHCI access bypasses translation, and a freed buffer stays
            // reachable for the whole run.
            assert!(value(m, "protection.bypass_accesses") > 0.0, "{}", m.config);
            assert!(
                value(m, "protection.max_reachable_after_unmap_ns") > 0.0,
                "{}",
                m.config
            );
            assert_eq!(value(m, "protection.stale_hits"), 0.0, "{}", m.config);
        } else {
            // Strict IPMMU (whole-context flush before the unmap returns): no stale hit,
            // nothing reachable after the unmap, every access translated.
            assert_eq!(m.attrs["iommu_mode"], "strict");
            assert_eq!(value(m, "protection.stale_hits"), 0.0, "{}", m.config);
            assert_eq!(
                value(m, "protection.max_reachable_after_unmap_ns"),
                0.0,
                "{}",
                m.config
            );
            assert_eq!(value(m, "protection.bypass_accesses"), 0.0, "{}", m.config);
        }
        // Bonnie's buffers are whole pages: nothing beyond them is exposed, nothing faults.
        assert_eq!(value(m, "protection.subpage_exposed_bytes"), 0.0);
        assert_eq!(value(m, "protection.max_subpage_exposed_bytes"), 0.0);
        assert_eq!(value(m, "faults.translation"), 0.0, "{}", m.config);
        assert_eq!(value(m, "faults.permission"), 0.0, "{}", m.config);
    }
}

/// The experiment file with the SuperSpeed link's three parameters set: the two calibrated
/// ones (`protocol_efficiency`, `command_overhead_ns`) and `per_segment_ns`.
fn with_link(efficiency: f64, command_overhead_ns: u64, per_segment_ns: u64) -> String {
    let t = with_calibration_value(
        bundled_text(),
        "device[0].protocol_efficiency",
        &format!("{efficiency:?}"),
    );
    let t = with_calibration_value(
        &t,
        "device[0].command_overhead_ns",
        &command_overhead_ns.to_string(),
    );
    with_device(&t, &format!("per_segment_ns = {per_segment_ns}"))
}

/// The published value of figure `id` of the experiment file.
fn published(id: &str) -> f64 {
    parse(bundled_text())
        .file
        .figures
        .iter()
        .find(|f| f.id.as_deref() == Some(id))
        .and_then(|f| f.published)
        .unwrap_or_else(|| panic!("no published {id}"))
}

/// The calibration's claims (docs/model/ipmmu-usb.md, "Calibration"), checked from runs of
/// the full-size superspeed.no_iommu cell: the baseline row's block read and write land where
/// the docs say; per MiB, reads pay 8 commands and writes 1, both ~256 TRBs, so the row fixes
/// one combination of the link parameters; the write/read difference asks a negative cost per
/// command; and at the sourced SuperSpeed bulk efficiency (0.80, ~400 MB/s) the row would put
/// ~5 us on each TRB, which predicts block effects far above the published +14..16%.
#[test]
fn the_baseline_row_cannot_identify_a_physical_command_or_trb_cost() {
    const BASE: &str = "superspeed.no_iommu";
    let ms = |kps: f64| 1024.0 / kps * 1000.0;
    let published = [
        ms(published("superspeed.no_iommu.in_block")),
        ms(published("superspeed.no_iommu.out_block")),
    ];
    let lab = block_ms_per_mib(&measure(bundled_text(), BASE));
    let off = |i: usize| published[i] / lab[i] * 100.0 - 100.0; // lab K/s vs published, %
    assert!(off(0).abs() < 2.0, "in_block {:+.1}%", off(0));
    assert!((0.0..10.0).contains(&off(1)), "out_block {:+.1}%", off(1));

    // Sensitivities at the calibrated efficiency, by finite differences (ms per MiB per ms).
    let at = |e: f64, c: u64, s: u64| block_ms_per_mib(&measure(&with_link(e, c, s), BASE));
    let base = at(0.60, 0, 0);
    let plus_command = at(0.60, 100_000, 0);
    let plus_segment = at(0.60, 0, 10_000);
    let per_command = [0, 1].map(|i| (plus_command[i] - base[i]) / 0.1);
    let per_segment = [0, 1].map(|i| (plus_segment[i] - base[i]) / 0.01);
    assert!((per_command[0] - 8.0).abs() < 0.3, "{per_command:?}");
    assert!((per_command[1] - 1.0).abs() < 0.3, "{per_command:?}");
    for s in per_segment {
        assert!((240.0..270.0).contains(&s), "{per_segment:?}");
    }
    // Solve published = base + per_command * C + per_segment * S for C (ms).
    let residual = [0, 1].map(|i| published[i] - base[i]);
    let det = per_command[0] * per_segment[1] - per_command[1] * per_segment[0];
    let command_ms = (residual[0] * per_segment[1] - residual[1] * per_segment[0]) / det;
    assert!(command_ms < -0.005, "command cost {command_ms} ms");

    // At the sourced efficiency, with no command cost (the bound the row pushes it to), the
    // cost per TRB that fits both rates best (least squares in relative terms).
    let base = at(0.80, 0, 0);
    let residual = [0, 1].map(|i| published[i] - base[i]);
    let weight = [0, 1].map(|i| 1.0 / published[i].powi(2));
    let segment_ms = (0..2)
        .map(|i| weight[i] * per_segment[i] * residual[i])
        .sum::<f64>()
        / (0..2)
            .map(|i| weight[i] * per_segment[i].powi(2))
            .sum::<f64>();
    assert!(
        (0.004..0.006).contains(&segment_ms),
        "{segment_ms} ms per TRB"
    );
    let fitted = with_link(0.80, 0, (segment_ms * 1e6).round() as u64);
    let (off, on) = (measure(&fitted, BASE), measure(&fitted, "superspeed.iommu"));
    let lab = block_ms_per_mib(&off);
    for i in 0..2 {
        assert!(
            (lab[i] / published[i] - 1.0).abs() < 0.04,
            "{lab:?} vs {published:?}"
        );
    }
    let effects = parse(bundled_text()).file.effects;
    for phase in ["out_block", "in_block"] {
        let metric = format!("bonnie.{phase}_kps");
        let lab_pct = (value(&on, &metric) / value(&off, &metric) - 1.0) * 100.0;
        let published_pct = effects
            .iter()
            .find(|e| e.id == format!("superspeed.{phase}"))
            .unwrap()
            .published_pct;
        // Above the goal's +-35% band around the published +14.3% / +15.5%.
        assert!(
            lab_pct > 1.35 * published_pct + 5.0,
            "{phase} {lab_pct:+.1}% against {published_pct:+.1}%"
        );
    }
}

/// bonnie++ 1.03 with `-b` fsync()s after each seek's update (a seeker's first seek and
/// every tenth after it): the chunk, then the journal commit with a cache flush before and
/// after the commit block. The cache flushes are the device's `sync cache` commands, and
/// they are what make a seek slow: without them (a write-through cache) the seek rate rises;
/// with a slower flush it falls.
#[test]
fn each_seek_update_fsyncs_with_two_cache_flushes_and_they_cost_seek_rate() {
    let no_file_tests = with_workload(&shortened().replace("files_run = 64\n", ""), "files = 0");
    let with_flushes = |flushes: u32, flush_us: f64, id: &str| {
        let t = with_kernel(&no_file_tests, &format!("fsync_commit_flushes = {flushes}"));
        measure(
            &with_device(&t, &format!("media_flush_us = {flush_us:?}")),
            id,
        )
    };
    for case in ["superspeed.no_iommu", "superspeed.iommu", "highspeed.iommu"] {
        let sync = value(&with_flushes(2, 1000.0, case), "usb.cache_flushes");
        // 300 seeks over 3 seekers: each seeker updates ceil(n_i / 10) times, 30 to 32 in
        // all; two flushes per update; the write phases' own fsyncs commit nothing.
        assert!(
            (60.0..=64.0).contains(&sync),
            "{case}: {sync} cache flushes for 300 seeks"
        );
    }
    for case in ["superspeed.no_iommu", "highspeed.iommu"] {
        let none = with_flushes(0, 1000.0, case);
        assert_eq!(value(&none, "usb.cache_flushes"), 0.0, "{case}");
        let seeks = |m: &Measurement| value(m, "bonnie.seeks_per_s");
        let (n, b, s) = (
            seeks(&none),
            seeks(&with_flushes(2, 1000.0, case)),
            seeks(&with_flushes(2, 3000.0, case)),
        );
        assert!(
            n > b && b > s,
            "{case}: seeks/s {n} (no flush) {b} (1 ms) {s} (3 ms)"
        );
        // Two more ms per flush, two flushes per update, one update in ten seeks: the
        // device-serialised time per seek grows by ~0.4 ms, which must show.
        let per_seek_ms = |rate: f64| 1000.0 / rate;
        let grew = per_seek_ms(s) - per_seek_ms(b);
        assert!(
            (0.3..=0.5).contains(&grew),
            "{case}: {grew} ms more per seek"
        );
    }
}

/// A `write()` into a page already in the cache (the rewrite's page, just read) costs
/// `overwrite_page_ns`; a new page (block write) `write_page_ns`. Raising the first moves
/// only the rewrite's CPU, not the block write's.
#[test]
fn only_writes_into_cached_pages_pay_the_overwrite_cost() {
    for case in ["superspeed.no_iommu", "highspeed.iommu"] {
        let with = |ns: u64| {
            measure(
                &with_workload(&shortened(), &format!("overwrite_page_ns = {ns}")),
                case,
            )
        };
        let (cheap, dear) = (with(1000), with(8000));
        let rw = "bonnie.rewrite_cpu_pct";
        assert!(
            value(&dear, rw) > value(&cheap, rw) * 1.2,
            "{case} {rw}: {} vs {}",
            value(&dear, rw),
            value(&cheap, rw)
        );
        let ob = "bonnie.out_block_cpu_pct";
        assert_eq!(value(&dear, ob), value(&cheap, ob), "{case} {ob}");
    }
}

/// Left out, `workload.overwrite_page_ns` is `write_page_ns - read_page_ns` (8474 - 4163 ns
/// as the experiment's fit gives them), and it follows either of them.
#[test]
fn the_overwrite_cost_is_derived_unless_set() {
    const CASE: &str = "superspeed.no_iommu";
    let text = shortened();
    assert!(!text.contains("overwrite_page_ns"));
    let explicit = |t: &str, ns: u64| with_workload(t, &format!("overwrite_page_ns = {ns}"));
    let derived = measure(&text, CASE);
    assert_eq!(
        derived.metrics,
        measure(&explicit(&text, 8474 - 4163), CASE).metrics
    );
    assert_ne!(
        derived.metrics,
        measure(&explicit(&text, 5000), CASE).metrics
    );
    // write_page_ns is a declared unknown of the file: given as 9000 instead of its fit.
    let refit = with_calibration_value(&text, "workload.write_page_ns", "9000");
    assert_eq!(
        measure(&refit, CASE).metrics,
        measure(&explicit(&refit, 9000 - 4163), CASE).metrics
    );
}

#[test]
fn file_tests_pay_three_flushes_per_create_and_two_per_delete() {
    let base = short_report();
    let no_file_tests = with_workload(&shortened().replace("files_run = 64\n", ""), "files = 0");
    for case in CELLS {
        let with_tests = cell(base, case);
        let without = measure(&no_file_tests, case);
        assert!(without.get("bonnie.seq_create_per_s").is_none(), "{case}");
        // 64 files per test: 2 x 64 creates (the commit's two flushes and the directory
        // fsync's one) and 2 x 64 deletes (the commit's two); the stat tests flush nothing.
        assert_eq!(
            value(with_tests, "usb.cache_flushes") - value(&without, "usb.cache_flushes"),
            (2 * 64 * 3 + 2 * 64 * 2) as f64,
            "{case}"
        );
        let fig = |id: &str| {
            base.figures
                .iter()
                .find(|f| f.id == format!("{case}.{id}"))
                .unwrap_or_else(|| panic!("no figure {case}.{id}"))
                .clone()
        };
        let (create, delete) = (fig("seq_create"), fig("seq_delete"));
        assert_eq!(create.role, Role::Prediction);
        assert!(create.published.is_some() && fig("ran_create").published.is_none());
        // A create waits for one more ~1 ms flush than a delete.
        let gap_ms = 1000.0 / create.lab - 1000.0 / delete.lab;
        assert!((0.9..1.3).contains(&gap_ms), "{case}: {gap_ms} ms");
    }
    // Each flush costs media_flush_us: 3 ms instead of 1 ms costs a create ~6 ms more.
    let slow = measure(
        &with_device(&shortened(), "media_flush_us = 3000.0"),
        "superspeed.iommu",
    );
    let rate = value(&slow, "bonnie.seq_create_per_s");
    let grew_ms = 1000.0 / rate - 1000.0 / figure(base, "superspeed.iommu.seq_create");
    assert!((5.8..6.2).contains(&grew_ms), "{grew_ms} ms");
}
