//! One model for ipmmu-usb (../shared/ONE-MODEL.md, issue 16): every cell of the experiment
//! is a lab scenario under scenarios/experiments/ipmmu-usb/ (one file per cell, named by its
//! id), and `iolab run` of that file measures exactly what the experiment file
//! scenarios/experiments/ipmmu-usb.toml (`iolab reproduce ipmmu-usb`) measures for the cell
//! on the cell file's seed: every metric, the CPU breakdown and the latencies. The data file
//! still reports what the experiment's own model (crates/sim/src/experiments/ipmmu_usb.rs,
//! deleted) reported, but for the seed draws: its last report is recorded below.
//!
//! Run with `--release` (each cell moves 64 MiB through the page cache and runs bonnie's
//! 8000 seeks and 4 x 1024 file operations).

mod common;
use common::value;

use std::path::PathBuf;

use iolab_sim::engine::rng::derive_seed;
use iolab_sim::experiment::{ExperimentOptions, Role};
use iolab_sim::lab::{run_scenario, validate, LabOptions};
use iolab_sim::metrics::Measurement;
use iolab_sim::reproduce::{bundled, Experiment};

/// The experiment's cells, in the order it runs them (its seed label is the index).
const CELLS: [&str; 4] = [
    "superspeed.no_iommu",
    "highspeed.no_iommu",
    "superspeed.iommu",
    "highspeed.iommu",
];

fn cell_path(id: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../scenarios/experiments/ipmmu-usb")
        .join(format!("{id}.toml"))
}

fn cell_text(id: &str) -> String {
    let p = cell_path(id);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn run_cell(id: &str) -> Measurement {
    let p = cell_path(id);
    let run = run_scenario(
        &cell_text(id),
        &p.display().to_string(),
        &LabOptions::default(),
    )
    .unwrap_or_else(|e| panic!("{id}: {e}"));
    assert_eq!(run.report.measurements.len(), 1);
    run.report.measurements.into_iter().next().unwrap()
}

/// The bundled experiment file, parsed.
fn data_file() -> Experiment {
    Experiment::parse(
        bundled::text("ipmmu-usb").expect("bundled"),
        &bundled::origin("ipmmu-usb"),
    )
    .expect("valid")
}

/// The lab metric a figure of the experiment is: `out_block` -> `bonnie.out_block_kps`,
/// `out_block_cpu` -> `bonnie.out_block_cpu_pct`, `seeks` -> `bonnie.seeks_per_s`, a file
/// test `seq_create` -> `bonnie.seq_create_per_s`.
fn lab_metric(figure_suffix: &str) -> String {
    const IO: [&str; 5] = ["out_char", "out_block", "rewrite", "in_char", "in_block"];
    if let Some(phase) = figure_suffix.strip_suffix("_cpu") {
        return format!("bonnie.{phase}_cpu_pct");
    }
    if IO.contains(&figure_suffix) {
        format!("bonnie.{figure_suffix}_kps")
    } else {
        format!("bonnie.{figure_suffix}_per_s")
    }
}

#[test]
fn every_cell_file_measures_what_the_experiment_file_measures_on_its_seed() {
    let exp = data_file();
    for (i, id) in CELLS.iter().enumerate() {
        // The cell file's seed is the older experiment module's seed of cell i.
        let cells = exp.cell_scenarios(derive_seed(1, i as u64)).expect("cells");
        let (_, emitted) = cells
            .iter()
            .find(|(c, _)| c == id)
            .unwrap_or_else(|| panic!("no cell {id} in the experiment file"));
        let from_data = run_scenario(emitted, "emitted.toml", &LabOptions::default())
            .unwrap_or_else(|e| panic!("{id}: {e}"));
        let reference = &from_data.report.measurements[0];
        let lab = run_cell(id);
        assert_eq!(lab.metrics, reference.metrics, "{id}: metrics");
        assert_eq!(lab.cpu, reference.cpu, "{id}: CPU");
        assert_eq!(lab.latency, reference.latency, "{id}: latency");
        // The device's totals and the protection report are among them.
        for name in [
            "usb.commands",
            "usb.cache_flushes",
            "usb.flushes",
            "usb.map_ns",
        ] {
            assert!(value(&lab, name) >= 0.0, "{id}: {name}");
        }
        let protection = lab
            .metrics
            .iter()
            .filter(|m| m.name.starts_with("protection.") || m.name.starts_with("faults."))
            .count();
        assert!(protection >= 3, "{id}: {protection} protection metrics");
        // Every figure of the cell is the lab metric bonnie's column names: 6 columns x
        // (rate, %CPU) and the four timed file tests x (rate, %CPU).
        let prefix = format!("{id}.");
        let mut figures = 0;
        for f in exp.file.figures.iter().filter(|f| f.cell == *id) {
            let fid = f.id.as_deref().expect("every figure has an id");
            let suffix = fid.strip_prefix(&prefix).expect("named by its cell");
            assert_eq!(f.metric, lab_metric(suffix), "{fid}");
            value(&lab, &f.metric);
            figures += 1;
        }
        assert_eq!(figures, 20, "{id}: figures");
    }
}

#[test]
fn each_cell_file_is_its_experiment_cell() {
    for (i, id) in CELLS.iter().enumerate() {
        let s = validate(&cell_text(id), id, None).unwrap_or_else(|e| panic!("{id}: {e}"));
        assert_eq!(s.name, *id);
        // The experiment's seed of cell i (its first repetition).
        assert_eq!(s.seed, Some(derive_seed(1, i as u64)), "{id}");
        assert_eq!(s.profile.name, "rcar-h3");
        assert_eq!(s.cpus, 4);
        let iommu = id.ends_with(".iommu");
        assert_eq!(s.iommu.model.name(), if iommu { "ipmmu" } else { "none" });
        let iolab_sim::lab::spec::Devices::Usb(u) = &s.devices else {
            panic!("{id}: expected a usb device")
        };
        assert_eq!(u.config.link.name, id.split('.').next().unwrap());
        assert_eq!(u.dma_mask_bits, 32);
        let iolab_sim::lab::spec::Workload::Bonnie(b) = &s.workload else {
            panic!("{id}: expected bonnie")
        };
        assert_eq!(b.config.file_bytes, 64 << 20);
        assert_eq!(b.config.limits.virt_merge_granule, None);
        // The H3's two banks, the first less the swiotlb pool at its start.
        assert_eq!(
            b.config.ram_banks,
            vec![
                (0x4800_0000 + (64 << 20), (1920 - 64) << 20),
                (0x5_0000_0000, 2048 << 20)
            ]
        );
        assert_eq!(u.swiotlb.base, 0x4800_0000);
    }
}

/// The mechanisms the cells set are live: the H3's banks and the 32-bit mask make half the
/// pages bounce without the IPMMU (slower block phases than a mask that reaches them all);
/// the same page cache above 4 GiB only bounces more.
#[test]
fn the_mask_and_the_banks_move_the_no_iommu_cell() {
    let text = cell_text("superspeed.no_iommu");
    let run = |t: &str| {
        let r = run_scenario(t, "cell.toml", &LabOptions::default()).expect("runs");
        value(&r.report.measurements[0], "bonnie.in_block_kps")
    };
    let h3 = run(&text);
    let reaches_all = run(&text.replace("dma_mask_bits = 32", "dma_mask_bits = 40"));
    assert!(
        reaches_all > h3 * 1.01,
        "no bounce {reaches_all} vs half bounced {h3}"
    );
    let banks_line = text
        .lines()
        .find(|l| l.starts_with("memory_banks"))
        .expect("a memory_banks line");
    // Without banks the page cache (the same 3,904 MiB) lies above 4 GiB: every page bounces.
    let above = run(&text
        .replace(banks_line, "")
        .replace("memory_gib = 4", "memory_gib = 8"));
    assert!(above < h3 * 0.99, "all bounced {above} vs half {h3}");
}

/// The field a bad scenario is refused at (it must be bad input, exit code 2).
#[track_caller]
fn refused_at(text: &str) -> String {
    match validate(text, "bad.toml", None) {
        Err(e) => {
            assert!(e.is_bad_input(), "{e}");
            match e {
                iolab_sim::lab::LabError::Input(iolab_sim::tomlfile::InputError::Field {
                    field,
                    ..
                }) => field,
                other => panic!("expected a field error, got {other}"),
            }
        }
        Ok(_) => panic!("accepted"),
    }
}

#[test]
fn the_new_fields_are_validated_with_the_field_named() {
    let off = cell_text("superspeed.no_iommu");
    let on = cell_text("superspeed.iommu");
    let banks =
        "memory_banks = [ { base = 0x48000000, mib = 1920 }, { base = 0x500000000, mib = 2048 } ]";
    assert!(off.contains(banks) && on.contains(banks));
    // Banks overlapping, unaligned, or more than the machine's memory.
    assert_eq!(
        refused_at(&off.replace("base = 0x500000000", "base = 0x50000000")),
        "machine.memory_banks[1].base"
    );
    assert_eq!(
        refused_at(&off.replace("base = 0x48000000", "base = 0x48000001")),
        "machine.memory_banks[0].base"
    );
    assert_eq!(
        refused_at(&off.replace("memory_gib = 4", "memory_gib = 2")),
        "machine.memory_banks"
    );
    assert_eq!(
        refused_at(&off.replace("mib = 1920", "mib = 0")),
        "machine.memory_banks[0].mib"
    );
    // The page cache is the banks' RAM: ram_mib would say it twice.
    assert_eq!(
        refused_at(&off.replace("file_mib = 64", "file_mib = 64\nram_mib = 4096")),
        "workload.ram_mib"
    );
    // A mask out of range; a pool the mask cannot reach without an IOMMU.
    assert_eq!(
        refused_at(&off.replace("dma_mask_bits = 32", "dma_mask_bits = 16")),
        "device[0].dma_mask_bits"
    );
    assert_eq!(
        refused_at(&off.replace("dma_mask_bits = 32", "dma_mask_bits = 30")),
        "device[0].dma_mask_bits"
    );
    assert!(validate(
        &on.replace("dma_mask_bits = 32", "dma_mask_bits = 30"),
        "ok.toml",
        None
    )
    .is_ok());
    // swiotlb geometry: a power-of-two slot, a pool that fits the first bank.
    assert_eq!(
        refused_at(&off.replace(
            "version = \"5.1\"",
            "version = \"5.1\"\nswiotlb_slot_bytes = 3000"
        )),
        "kernel.swiotlb_slot_bytes"
    );
    assert_eq!(
        refused_at(&off.replace("version = \"5.1\"", "version = \"5.1\"\nswiotlb_mib = 2048")),
        "kernel.swiotlb_mib"
    );
    // The block layer's virtual merge needs an IOMMU that merges.
    assert_eq!(
        refused_at(&off.replace("block_virt_merge = false", "block_virt_merge = true")),
        "kernel.block_virt_merge"
    );
    let merged = validate(
        &on.replace("block_virt_merge = false", "block_virt_merge = true"),
        "ok.toml",
        None,
    )
    .expect("valid");
    let iolab_sim::lab::spec::Workload::Bonnie(b) = &merged.workload else {
        panic!("bonnie")
    };
    assert_eq!(b.config.limits.virt_merge_granule, Some(4096));
    // Link and cost fields are range-checked.
    assert_eq!(
        refused_at(&off.replace(
            "speed = \"superspeed\"",
            "speed = \"superspeed\"\nprotocol_efficiency = 1.5"
        )),
        "device[0].protocol_efficiency"
    );
    assert_eq!(
        refused_at(&off.replace("file_mib = 64", "file_mib = 64\nputc_ns_per_byte = -1.0")),
        "workload.putc_ns_per_byte"
    );
    assert_eq!(
        refused_at(&off.replace(
            "version = \"5.1\"",
            "version = \"5.1\"\ndirty_background_mib = 9.0"
        )),
        "kernel.dirty_background_mib"
    );
    assert_eq!(
        refused_at(&off.replace(
            "file_mib = 64",
            "file_mib = 64\nfiles = 1\nfiles_run = 2000"
        )),
        "workload.files_run"
    );
}

#[test]
fn fields_of_bonnie_and_the_usb_path_are_refused_elsewhere() {
    let fio = r#"
[machine]
platform = "hisilicon-d06"
cpus = 4
memory_gib = 64
[iommu]
model = "smmuv3"
mode = "strict"
[[device]]
kind = "nvme"
[workload]
kind = "fio"
ioengine = "libaio"
rw = "randread"
runtime_ms = 1
"#;
    if let Err(e) = validate(fio, "fio.toml", None) {
        panic!("{e}");
    }
    assert_eq!(
        refused_at(&fio.replace(
            "memory_gib = 64",
            "memory_gib = 64\nmemory_banks = [ { base = 0, mib = 1024 } ]"
        )),
        "machine.memory_banks"
    );
    assert_eq!(
        refused_at(&fio.replace("[iommu]", "[kernel]\nreadahead_kib = 256\n[iommu]")),
        "kernel.readahead_kib"
    );
    let bonnie_nvme = fio.replace(
        "kind = \"fio\"\nioengine = \"libaio\"\nrw = \"randread\"\nruntime_ms = 1",
        "kind = \"bonnie\"",
    );
    assert!(validate(&bonnie_nvme, "b.toml", None).is_ok());
    assert_eq!(
        refused_at(&bonnie_nvme.replace("[iommu]", "[kernel]\nblock_virt_merge = false\n[iommu]")),
        "kernel.block_virt_merge"
    );
    // Banks and page-cache fields apply to bonnie on any device.
    let placed = bonnie_nvme
        .replace(
            "memory_gib = 64",
            "memory_gib = 64\nmemory_banks = [ { base = 0x80000000, mib = 2048 } ]",
        )
        .replace("[iommu]", "[kernel]\nreadahead_kib = 256\n[iommu]");
    let s = validate(&placed, "b.toml", None).expect("valid");
    let iolab_sim::lab::spec::Workload::Bonnie(b) = &s.workload else {
        panic!("bonnie")
    };
    assert_eq!(b.config.ram_banks, vec![(0x8000_0000, 2048 << 20)]);
    assert_eq!(b.config.readahead, 256 << 10);
}

/// The last report of the experiment's own model (crates/sim/src/experiments/ipmmu_usb.rs
/// with its schema scenarios/ipmmu-usb.toml, both deleted; `iolab run scenarios/ipmmu-usb.toml
/// --format json` at commit 2fe59cf): fidelity 5 of 12 effects, 41 of 50 predicted figures.
/// Its figures, one a line: id, role, published value (`-`: none), lab value.
const MODULE_FIGURES: &str = "\
superspeed.no_iommu.out_char calibration 82598.0 81010.43969382791
superspeed.no_iommu.out_char_cpu prediction 99.0 98.09286880758559
superspeed.no_iommu.out_block calibration 242161.0 260763.3104239672
superspeed.no_iommu.out_block_cpu calibration 58.0 58.373997756677944
superspeed.no_iommu.rewrite prediction 102489.0 130773.8340889911
superspeed.no_iommu.rewrite_cpu prediction 25.0 32.81938161608275
superspeed.no_iommu.in_char calibration 73719.0 74645.85187012269
superspeed.no_iommu.in_char_cpu prediction 98.0 99.91960296862781
superspeed.no_iommu.in_block calibration 254089.0 253218.56420344795
superspeed.no_iommu.in_block_cpu calibration 32.0 31.3516234804394
superspeed.no_iommu.seeks prediction 2133.3 2035.7138336949345
superspeed.no_iommu.seeks_cpu prediction 6.0 2.283501913942776
highspeed.no_iommu.out_char prediction 41971.0 41502.13045008461
highspeed.no_iommu.out_char_cpu prediction 53.0 50.236335052135125
highspeed.no_iommu.out_block prediction 39983.0 42587.76620316325
highspeed.no_iommu.out_block_cpu prediction 9.0 9.532372284095683
highspeed.no_iommu.rewrite prediction 16459.0 21295.906256413706
highspeed.no_iommu.rewrite_cpu prediction 4.0 5.409272264294911
highspeed.no_iommu.in_char prediction 37900.0 42297.871524841576
highspeed.no_iommu.in_char_cpu prediction 51.0 56.182936871851815
highspeed.no_iommu.in_block prediction 37833.0 42338.04701488692
highspeed.no_iommu.in_block_cpu prediction 5.0 5.241979446030687
highspeed.no_iommu.seeks prediction 1585.7 1453.5790443678163
highspeed.no_iommu.seeks_cpu prediction 5.0 1.630509394268051
superspeed.iommu.out_char prediction 66139.0 80785.31381867862
superspeed.iommu.out_char_cpu prediction 99.0 98.14390268375467
superspeed.iommu.out_block prediction 276686.0 266954.8412459649
superspeed.iommu.out_block_cpu prediction 65.0 59.831098597421885
superspeed.iommu.rewrite prediction 132297.0 133674.86565284376
superspeed.iommu.rewrite_cpu prediction 33.0 33.547432931834436
superspeed.iommu.in_char prediction 69732.0 74941.69811246361
superspeed.iommu.in_char_cpu prediction 99.0 99.9205554649024
superspeed.iommu.in_block prediction 293396.0 258356.92564341347
superspeed.iommu.in_block_cpu prediction 37.0 31.987816856225127
superspeed.iommu.seeks prediction 2099.2 2027.3551804898464
superspeed.iommu.seeks_cpu prediction 7.0 2.274390385903835
highspeed.iommu.out_char prediction 43191.0 41628.48945885322
highspeed.iommu.out_char_cpu prediction 50.0 50.40576854952542
highspeed.iommu.out_block prediction 40446.0 42728.745720195606
highspeed.iommu.out_block_cpu prediction 9.0 9.565202145535661
highspeed.iommu.rewrite prediction 17432.0 21356.863417501958
highspeed.iommu.rewrite_cpu prediction 4.0 5.442030335426841
highspeed.iommu.in_char prediction 38541.0 42410.05823126325
highspeed.iommu.in_char_cpu prediction 51.0 56.366205608516786
highspeed.iommu.in_block prediction 38481.0 42450.34124770014
highspeed.iommu.in_block_cpu prediction 5.0 5.255882875730873
highspeed.iommu.seeks prediction 1619.4 1448.2180272573237
highspeed.iommu.seeks_cpu prediction 4.0 1.6246848058912051
superspeed.no_iommu.seq_create prediction 385.0 302.7218250830169
superspeed.no_iommu.seq_create_cpu prediction - 0.48641342854339154
superspeed.no_iommu.seq_delete prediction 385.0 439.0434124188235
superspeed.no_iommu.seq_delete_cpu prediction - 0.5590778813741297
superspeed.no_iommu.ran_create prediction - 302.71263007903525
superspeed.no_iommu.ran_create_cpu prediction - 0.48639865401099386
superspeed.no_iommu.ran_delete prediction - 439.08096544561823
superspeed.no_iommu.ran_delete_cpu prediction - 0.550344082089538
highspeed.no_iommu.seq_create prediction 300.0 259.2059520758059
highspeed.no_iommu.seq_create_cpu prediction - 0.4164921237954049
highspeed.no_iommu.seq_delete prediction 300.0 343.9947986158977
highspeed.no_iommu.seq_delete_cpu prediction - 0.43804297655748414
highspeed.no_iommu.ran_create prediction - 259.20513808331947
highspeed.no_iommu.ran_create_cpu prediction - 0.4164908158722777
highspeed.no_iommu.ran_delete prediction - 344.0171334615665
highspeed.no_iommu.ran_delete_cpu prediction - 0.4311910750807275
superspeed.iommu.seq_create prediction 385.0 302.57067496648284
superspeed.iommu.seq_create_cpu prediction - 0.48617056053614466
superspeed.iommu.seq_delete prediction 385.0 438.83151509666124
superspeed.iommu.seq_delete_cpu prediction - 0.5588080513240884
superspeed.iommu.ran_create prediction - 302.5817570943437
superspeed.iommu.ran_create_cpu prediction - 0.48618836729919146
superspeed.iommu.ran_delete prediction - 438.8700330969721
superspeed.iommu.ran_delete_cpu prediction - 0.5500796994837448
highspeed.iommu.seq_create prediction 300.0 259.0944861865566
highspeed.iommu.seq_create_cpu prediction - 0.41631302040455914
highspeed.iommu.seq_delete prediction 300.0 343.86347528264747
highspeed.iommu.seq_delete_cpu prediction - 0.43787574942492324
highspeed.iommu.ran_create prediction - 259.1026715793073
highspeed.iommu.ran_create_cpu prediction - 0.4163261726936309
highspeed.iommu.ran_delete prediction - 343.8871253270514
highspeed.iommu.ran_delete_cpu prediction - 0.43102812288492626
";
/// Its effects: id, published %, lab %.
const MODULE_EFFECTS: &str = "\
superspeed.out_char -19.92663260611637 -0.27789736236481394
superspeed.out_block 14.257043867509633 2.3743872602058578
superspeed.rewrite 29.0840968299037 2.2183578114552414
superspeed.in_char -5.408375045781956 0.3963331316195155
superspeed.in_block 15.4697763382122 2.0292198781433393
superspeed.seeks -1.598462475976204 -0.4106005994917606
highspeed.out_char 2.9067689595196686 0.3044639091975872
highspeed.out_block 1.1579921466623315 0.33103289888419773
highspeed.rewrite 5.91165927456103 0.28623886842051466
highspeed.in_char 1.691292875989446 0.26523014605069173
highspeed.in_block 1.7127904210609786 0.26523243449026945
highspeed.seeks 2.125244371570918 -0.36881496959281135
";
/// Its calibrated parameters (the last part of the name) and values.
const MODULE_CALIBRATED: &str = "\
command_overhead_ns 30000.0
getc_ns_per_byte 11.7
protocol_efficiency 0.6
putc_ns_per_byte 9.6
read_page_ns 4000.0
write_page_ns 8000.0
";

/// The whitespace-separated words of each line of a recorded table.
fn rows(table: &str) -> impl Iterator<Item = Vec<&str>> {
    table.lines().map(|l| l.split_whitespace().collect())
}

fn number(word: &str) -> f64 {
    word.parse()
        .unwrap_or_else(|e| panic!("recorded value {word}: {e}"))
}

/// The data file scenarios/experiments/ipmmu-usb.toml (docs/EXPERIMENTS.md) run by the
/// generic runner reports the same figures, effects and calibrations as the experiment's
/// deleted model, and the same fidelity. Its cells all run on the base seed (the runner's
/// rule: common random numbers), where the module gave each case a seed of its own, so the
/// page-cache and seek draws differ: every figure stays within 0.1% of the module's (the
/// seek rates move most, ~0.05-0.06%), and no effect moves by more than 0.25 percentage
/// points (the largest, highspeed.seeks, by 0.11: -0.26% against -0.37%, both against a
/// published +2.1%).
///
/// The module's calibrations were typed by hand; the data file's are declared unknowns the
/// tool fits (scenarios/experiments/ipmmu-usb.fit.toml), so this port check gives the data
/// file the module's values as its lock.
#[test]
fn the_data_file_reports_what_the_module_reported_but_for_the_seed_draws() {
    let mut exp = data_file();
    let mut lock: iolab_sim::reproduce::FitLock =
        toml::from_str(bundled::lock("ipmmu-usb").expect("a bundled lock")).unwrap();
    for l in &mut lock.fitted {
        let name = l.parameter.rsplit('.').next().unwrap();
        l.value = rows(MODULE_CALIBRATED)
            .find(|r| r[0] == name)
            .map(|r| number(r[1]))
            .unwrap_or_else(|| panic!("no module value for {name}"));
    }
    exp.apply_lock(&toml::to_string(&lock).unwrap())
        .expect("the module's values are inside the declared ranges");
    let data = exp.run(&ExperimentOptions::default()).expect("runs");
    let fidelity = data.fidelity();
    assert_eq!(
        (fidelity.effects.met, fidelity.effects.total),
        (5, 12),
        "effects within their goal"
    );
    assert_eq!(
        (
            fidelity.predicted_figures.met,
            fidelity.predicted_figures.total
        ),
        (41, 50),
        "predicted figures within their goal"
    );
    assert_eq!(data.figures.len(), rows(MODULE_FIGURES).count());
    for row in rows(MODULE_FIGURES) {
        let [id, role, published, lab] = row[..] else {
            panic!("recorded figure {row:?}")
        };
        let role = match role {
            "calibration" => Role::Calibration,
            "prediction" => Role::Prediction,
            other => panic!("recorded role {other}"),
        };
        let published = (published != "-").then(|| number(published));
        let lab = number(lab);
        let d = data
            .figures
            .iter()
            .find(|x| x.id == id)
            .unwrap_or_else(|| panic!("no figure {id} in the data file"));
        assert_eq!((d.published, d.role), (published, role), "{id}");
        let rel = (d.lab - lab).abs() / lab.abs().max(1e-9);
        assert!(rel < 1e-3, "{id}: data {} module {lab}", d.lab);
    }
    assert_eq!(data.effects.len(), rows(MODULE_EFFECTS).count());
    for row in rows(MODULE_EFFECTS) {
        let [id, published_pct, lab_pct] = row[..] else {
            panic!("recorded effect {row:?}")
        };
        let (published_pct, lab_pct) = (number(published_pct), number(lab_pct));
        let d = data
            .effects
            .iter()
            .find(|x| x.id == id)
            .unwrap_or_else(|| panic!("no effect {id}"));
        assert!((d.published_pct - published_pct).abs() < 0.01, "{id}");
        assert!(
            (d.lab_pct - lab_pct).abs() < 0.25,
            "{id}: {} vs {lab_pct}",
            d.lab_pct
        );
    }
    let mut params: Vec<(String, f64)> = data
        .calibrated
        .iter()
        .map(|c| {
            let name = c.parameter.rsplit('.').next().unwrap().to_owned();
            (name, c.value)
        })
        .collect();
    params.sort_by(|a, b| a.0.cmp(&b.0));
    let recorded: Vec<(String, f64)> = rows(MODULE_CALIBRATED)
        .map(|r| (r[0].to_owned(), number(r[1])))
        .collect();
    assert_eq!(params, recorded);
}
