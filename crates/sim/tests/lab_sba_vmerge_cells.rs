//! One model for sba-vmerge (issue 16): every cell of the experiment (a kernel
//! configuration run over the 100..500-user ramp) is a lab scenario in
//! scenarios/experiments/sba-vmerge/, and `lab::run_scenario` of that file measures exactly
//! the figures `iolab reproduce sba-vmerge` reports for the cell. Where the lab's report
//! intentionally differs (the protection report of bypass mode), the difference is bounded
//! here and explained in docs/model/sba-vmerge.md ("One model: lab vs experiment").

use std::path::PathBuf;

use iolab_sim::experiment::{ExperimentOptions, ExperimentReport};
use iolab_sim::experiments::{run_bundled, sba_vmerge};
use iolab_sim::lab::{self, defaults, LabOptions};
use iolab_sim::metrics::Measurement;

/// The experiment's cells, by id: the kernel configurations of scenarios/sba-vmerge.toml.
const CELLS: [&str; 2] = ["novmerge", "vmerge"];

/// The user counts of the bundled ramp.
const USERS: [u32; 5] = [100, 200, 300, 400, 500];

fn cell_path(cell: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../scenarios/experiments/sba-vmerge")
        .join(format!("{cell}.toml"))
}

fn cell_text(cell: &str) -> String {
    std::fs::read_to_string(cell_path(cell)).expect("the cell's scenario file exists")
}

/// The lab's measurement of a cell (one run, the file's own seed).
fn run_cell(cell: &str) -> Measurement {
    let path = cell_path(cell);
    let run = lab::run_scenario(
        &cell_text(cell),
        path.to_str().unwrap(),
        &LabOptions::default(),
    )
    .unwrap_or_else(|e| panic!("cell {cell}: {e}"));
    assert_eq!(run.report.measurements.len(), 1);
    run.report.measurements.into_iter().next().unwrap()
}

fn experiment() -> ExperimentReport {
    run_bundled(sba_vmerge::NAME, &ExperimentOptions::default()).expect("the experiment runs")
}

fn metric(m: &Measurement, name: &str) -> f64 {
    m.get(name)
        .unwrap_or_else(|| panic!("{}: no metric {name}", m.config))
        .value
}

/// The lab metric that carries an experiment figure of `cell`: `{cell}.users{u}[.suffix]`
/// and `{cell}.max`.
fn metric_of(cell: &str, figure: &str) -> String {
    let rest = figure
        .strip_prefix(cell)
        .and_then(|r| r.strip_prefix('.'))
        .unwrap_or_else(|| panic!("figure {figure} is not of cell {cell}"));
    if rest == "max" {
        return "reaim.max_jpm".to_owned();
    }
    let (users, column) = rest.split_once('.').unwrap_or((rest, ""));
    let name = match column {
        "" => "jpm",
        "parent_time" => "parent_time_s",
        "child_sys" => "child_sys_s",
        "child_user" => "child_user_s",
        "jti" => "jti",
        other => panic!("figure {figure}: unknown column {other}"),
    };
    format!("reaim.{users}.{name}")
}

/// The experiment's mechanism table (last run per user count): (kernel, users, requests,
/// DMA segments, lock contentions).
fn mechanism(text: &str) -> Vec<(String, u32, u64, u64, u64)> {
    text.lines()
        .skip_while(|l| !l.starts_with("Mechanism"))
        .filter_map(|l| {
            let c: Vec<&str> = l.split_whitespace().collect();
            if c.len() != 11 || !CELLS.contains(&c[0]) {
                return None;
            }
            Some((
                c[0].to_owned(),
                c[1].parse().ok()?,
                c[2].parse().ok()?,
                c[5].parse().ok()?,
                c[9].parse().ok()?,
            ))
        })
        .collect()
}

#[test]
fn every_cell_run_through_the_lab_gives_the_experiments_figures_exactly() {
    let exp = experiment();
    let mut lab_jpm: Vec<Vec<f64>> = Vec::new();
    for cell in CELLS {
        let m = run_cell(cell);
        let figures: Vec<_> = exp
            .figures
            .iter()
            .filter(|f| f.id.starts_with(&format!("{cell}.")))
            .collect();
        // Five columns per user count and the ramp's maximum.
        assert_eq!(figures.len(), USERS.len() * 5 + 1, "{cell}");
        for f in figures {
            let name = metric_of(cell, &f.id);
            let lab = metric(&m, &name);
            assert_eq!(
                lab.to_bits(),
                f.lab.to_bits(),
                "{}: lab {name} = {lab}, experiment {}",
                f.id,
                f.lab
            );
        }
        lab_jpm.push(
            USERS
                .iter()
                .map(|u| metric(&m, &format!("reaim.users{u}.jpm")))
                .collect(),
        );

        // The mechanism: the same requests and DMA segments over the ramp, and the same
        // waits on the SBA's resource lock.
        let rows: Vec<_> = mechanism(&exp.report_text)
            .into_iter()
            .filter(|r| r.0 == cell)
            .collect();
        assert_eq!(rows.len(), USERS.len(), "{}", exp.report_text);
        let requests: u64 = rows.iter().map(|r| r.2).sum();
        let segments: u64 = rows.iter().map(|r| r.3).sum();
        let contended: u64 = rows.iter().map(|r| r.4).sum();
        assert_eq!(metric(&m, "scsi.requests"), requests as f64, "{cell}");
        assert_eq!(
            metric(&m, "scsi.dma_segments_per_request").to_bits(),
            (segments as f64 / requests as f64).to_bits(),
            "{cell}"
        );
        assert_eq!(metric(&m, "lock.contended"), contended as f64, "{cell}");
    }
    // The effects are the figures' changes, so they are the experiment's too.
    for e in &exp.effects {
        let (a, b) = match e.id.strip_prefix("users") {
            Some(u) => {
                let i = USERS
                    .iter()
                    .position(|x| x.to_string() == u)
                    .expect("a ramp point");
                (lab_jpm[0][i], lab_jpm[1][i])
            }
            None => {
                let max = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
                (max(&lab_jpm[0]), max(&lab_jpm[1]))
            }
        };
        assert_eq!(
            ((b - a) / a * 100.0).to_bits(),
            e.lab_pct.to_bits(),
            "{}",
            e.id
        );
    }
}

/// The protection report is the one place where the lab reports on purpose what the
/// experiment does not: the experiment reports the SBA's unmap-to-purge window as the
/// longest time a freed page stays reachable, while the lab's bypass mode reports the run's
/// length (single buffers bypass the pdir, and a device with a 64-bit mask can reach their
/// pages for as long as it likes). The counters are the same, summed over the ramp.
#[test]
fn the_protection_report_differs_only_in_the_reachable_window_of_bypass_mode() {
    let exp = experiment();
    for cell in CELLS {
        let m = run_cell(cell);
        let rows: Vec<&Measurement> = exp
            .measurements
            .iter()
            .filter(|x| x.config.starts_with(&format!("{cell}.users")))
            .collect();
        assert_eq!(rows.len(), USERS.len(), "{cell}");
        let sum = |name: &str| rows.iter().map(|x| metric(x, name)).sum::<f64>();
        let max = |name: &str| rows.iter().map(|x| metric(x, name)).fold(0.0, f64::max);
        for name in [
            "protection.bypass_accesses",
            "protection.subpage_exposed_bytes",
            "faults.translation",
            "faults.permission",
        ] {
            assert_eq!(metric(&m, name), sum(name), "{cell}: {name}");
        }
        assert_eq!(
            metric(&m, "protection.max_subpage_exposed_bytes"),
            max("protection.max_subpage_exposed_bytes"),
            "{cell}"
        );
        assert!(sum("protection.bypass_accesses") > 0.0, "{cell}");
        // Bound: the lab's window is the longest run of the ramp (the 500-user parent time,
        // give or take the last I/O's completion), never shorter than the purge window the
        // experiment reports.
        let window = metric(&m, "protection.max_reachable_after_unmap_ns");
        let purge = max("protection.max_reachable_after_unmap_ns");
        let parent = metric(&m, "reaim.users500.parent_time_s") * 1e9;
        assert!(window >= purge, "{cell}: {window} < {purge}");
        assert!(
            (window - parent).abs() <= 0.01 * parent,
            "{cell}: window {window} ns, longest parent time {parent} ns"
        );
        // The experiment's extra counter the lab leaves out (docs/model/sba-vmerge.md).
        assert!(m.get("protection.deferred_unmaps").is_none());
        assert!(rows
            .iter()
            .all(|x| x.get("protection.deferred_unmaps").is_some()));
    }
}

/// The experiment's own scenario, parsed as TOML.
fn experiment_toml() -> toml::Table {
    sba_vmerge::BUNDLED_SCENARIO
        .parse()
        .expect("the bundled scenario is TOML")
}

fn table<'a>(t: &'a toml::Table, path: &str) -> &'a toml::Table {
    path.split('.').fold(t, |t, k| {
        t.get(k)
            .and_then(|v| v.as_table())
            .unwrap_or_else(|| panic!("no table {path}"))
    })
}

#[test]
fn the_cells_differ_only_in_the_kernel_switches_and_share_one_seed() {
    let exp = experiment_toml();
    let mut stripped = Vec::new();
    for cell in CELLS {
        let mut t: toml::Table = cell_text(cell).parse().unwrap();
        assert_eq!(t["name"].as_str(), Some(cell));
        // The kernel switches are the experiment's kernel of that name.
        let want = table(&exp, &format!("kernels.{cell}"));
        let kernel = t.get_mut("kernel").unwrap().as_table_mut().unwrap();
        assert_eq!(
            kernel.remove("virt_merge").and_then(|v| v.as_bool()),
            want["block_virt_merge"].as_bool(),
            "{cell}"
        );
        assert_eq!(
            kernel.remove("sba_coalesce").and_then(|v| v.as_bool()),
            want["sba_coalesce"].as_bool(),
            "{cell}"
        );
        t.remove("name");
        stripped.push(t);
    }
    // Everything else, the seed included, is the same: common random numbers.
    assert_eq!(stripped[0], stripped[1]);
    assert!(stripped[0].get("seed").is_some());
}

#[test]
fn the_cells_carry_the_experiments_recorded_calibration_and_its_ramp() {
    let exp = experiment_toml();
    let cal = table(&exp, "calibration");
    let ramp = table(&exp, "reaim");
    for cell in CELLS {
        let t: toml::Table = cell_text(cell).parse().unwrap();
        let w = table(&t, "workload");
        for (field, recorded) in [("user_scale", "user_scale"), ("sys_scale", "sys_scale")] {
            let cell_value = w[field].as_float().unwrap();
            let recorded = table(cal, recorded)["value"].as_float().unwrap();
            assert_eq!(cell_value.to_bits(), recorded.to_bits(), "{cell}: {field}");
        }
        for k in ["start", "end", "increment"] {
            assert_eq!(w[k], ramp[k], "{cell}: workload.{k}");
        }
        assert_eq!(w["workfile"].as_str(), ramp["workfile"].as_str());
    }
}

#[test]
fn the_lab_fit_gives_the_recorded_scale_factors() {
    // The declared calibration's procedure run on the lab's novmerge cell: scale 1, the
    // 100-user point, fitted to that row's published child UTime and SysTime (SEEDS.md #3).
    let path = cell_path("novmerge");
    let s = lab::validate(&cell_text("novmerge"), path.to_str().unwrap(), None).unwrap();
    let fit = lab::fit_task_scale(&s, 100, 206.35, 12.67, 1).unwrap();
    let t: toml::Table = cell_text("novmerge").parse().unwrap();
    let w = table(&t, "workload");
    assert_eq!(
        fit.user_scale.to_bits(),
        w["user_scale"].as_float().unwrap().to_bits(),
        "{fit:?}"
    );
    assert_eq!(
        fit.sys_scale.to_bits(),
        w["sys_scale"].as_float().unwrap().to_bits(),
        "{fit:?}"
    );
    // A point outside the ramp is refused, not extrapolated.
    assert!(lab::fit_task_scale(&s, 150, 206.35, 12.67, 1).is_err());
}

#[test]
fn the_labs_new_dbase_workfile_is_the_experiments() {
    let exp = experiment_toml();
    let tasks = table(&exp, "reaim")["task"].as_array().unwrap();
    assert_eq!(tasks.len(), defaults::REAIM_NEW_DBASE.len());
    for (t, &(name, weight, user, sys, bytes, _)) in tasks.iter().zip(defaults::REAIM_NEW_DBASE) {
        let t = t.as_table().unwrap();
        assert_eq!(t["name"].as_str(), Some(name));
        assert_eq!(t["weight"].as_integer(), Some(i64::from(weight)));
        // The experiment's microseconds are the lab's thousands of cycles at the hp-zx1
        // profile's 1.0 GHz.
        let us = |v: &toml::Value| v.as_float().or(v.as_integer().map(|i| i as f64));
        assert_eq!(us(&t["user_us"]), Some(user), "{name}");
        assert_eq!(us(&t["sys_us"]), Some(sys), "{name}");
        assert_eq!(
            t["sync_write_kib"].as_integer().map(|k| (k as u64) << 10),
            Some(bytes)
        );
    }
}

// ---------------------------------------------------------------------------------------
// The new fields' validation: each bad value is refused at its field.
// ---------------------------------------------------------------------------------------

/// The field a scenario is refused at, with the message.
fn refused(text: &str) -> (String, String) {
    use iolab_sim::tomlfile::InputError;
    match lab::run_scenario(text, "bad.toml", &LabOptions::default()) {
        Err(lab::LabError::Input(e @ InputError::Field { .. })) => {
            let msg = e.to_string();
            let InputError::Field { field, .. } = e else {
                unreachable!()
            };
            (field, msg)
        }
        Err(e) => panic!("expected a field error, got {e:?}"),
        Ok(_) => panic!("expected the scenario to be refused"),
    }
}

/// The novmerge cell with a 2-user ramp and `from` replaced by `to`.
fn small(from: &str, to: &str) -> String {
    let t = cell_text("novmerge")
        .replace("start = 100", "start = 2")
        .replace("end = 500", "end = 2");
    assert!(t.contains(from), "{from}");
    t.replacen(from, to, 1)
}

#[test]
fn a_virtual_merge_without_an_iommu_that_coalesces_is_refused() {
    let (field, msg) = refused(&small("virt_merge = false", "virt_merge = true"));
    assert_eq!(field, "kernel.virt_merge");
    assert!(msg.contains("sba_coalesce"), "{msg}");
    let t = small("mode = \"bypass\"", "mode = \"off\"")
        .replace("sba_coalesce = false", "")
        .replace("virt_merge = false", "virt_merge = true");
    let (field, msg) = refused(&t);
    assert_eq!(field, "kernel.virt_merge");
    assert!(msg.contains("sba"), "{msg}");
}

#[test]
fn the_kernel_switches_apply_where_their_mechanism_is() {
    // sba_coalesce is the SBA driver's.
    let t = small("mode = \"bypass\"", "mode = \"off\"");
    assert_eq!(refused(&t).0, "kernel.sba_coalesce");
    // page_size is re-aim's page cache; virt_merge the SCSI host's queue.
    let fio = r#"
[machine]
platform = "hp-zx1"
[iommu]
model = "sba"
mode = "translated"
[kernel]
FIELD
[[device]]
kind = "sas"
[workload]
kind = "fio"
rw = "randread"
runtime_ms = 1
"#;
    assert_eq!(
        refused(&fio.replace("FIELD", "page_size = 16384")).0,
        "kernel.page_size"
    );
    assert_eq!(
        refused(&fio.replace("FIELD", "virt_merge = true")).0,
        "kernel.virt_merge"
    );
}

#[test]
fn bad_page_sizes_windows_scales_and_workfiles_are_named() {
    for (from, to, field) in [
        ("page_size = 16384", "page_size = 12288", "kernel.page_size"),
        (
            "page_size = 16384",
            "page_size = 131072",
            "kernel.page_size",
        ),
        (
            "mode = \"bypass\"",
            "mode = \"bypass\"\nwindow_mib = 768",
            "iommu.window_mib",
        ),
        (
            "mode = \"bypass\"",
            "mode = \"bypass\"\nwindow_base_mib = 3584\nwindow_mib = 1024",
            "iommu.window_base_mib",
        ),
        (
            "mode = \"bypass\"",
            "mode = \"bypass\"\nwindow_base_mib = 4096",
            "iommu.window_base_mib",
        ),
        (
            "user_scale = 11.370507854681003",
            "user_scale = -1.0",
            "workload.user_scale",
        ),
        (
            "sys_scale = 6.879959404027607",
            "sys_scale = nan",
            "workload.sys_scale",
        ),
        // 4000 kcycles (sort_rtns_1) x 9999 is past the 1e7-kcycle cap of a task's cost.
        (
            "user_scale = 11.370507854681003",
            "user_scale = 9999.0",
            "workload.user_scale",
        ),
        (
            "workfile = \"new_dbase\"",
            "workfile = \"old_dbase\"",
            "workload.workfile",
        ),
        (
            "kind = \"scsi\"",
            "kind = \"scsi\"\ndma_mask_bits = 16",
            "device[0].dma_mask_bits",
        ),
    ] {
        assert_eq!(refused(&small(from, to)).0, field, "{to}");
    }
    // fs_block may reach the page size, not beyond it.
    let t = small(
        "timeslice_ms = 100",
        "timeslice_ms = 100\nfs_block = \"16k\"",
    );
    lab::validate(&t, "ok.toml", None).expect("a 16 KiB block on 16 KiB pages");
    let t = small(
        "timeslice_ms = 100",
        "timeslice_ms = 100\nfs_block = \"32k\"",
    );
    assert_eq!(refused(&t).0, "workload.fs_block");
}

#[test]
fn a_32_bit_hba_maps_every_buffer_through_the_window() {
    // The scsi device's DMA mask: with 32 bits the single buffers above 4 GiB cannot bypass.
    let wide = small("seed = 1", "seed = 1");
    let narrow = small("kind = \"scsi\"", "kind = \"scsi\"\ndma_mask_bits = 32");
    let bypass = |t: &str| {
        let run = lab::run_scenario(t, "t.toml", &LabOptions::default()).unwrap();
        metric(&run.report.measurements[0], "protection.bypass_accesses")
    };
    assert!(bypass(&wide) > 0.0);
    assert_eq!(bypass(&narrow), 0.0);
}

// ---------------------------------------------------------------------------------------
// The experiment as a data file (docs/EXPERIMENTS.md), run by the generic runner.
// ---------------------------------------------------------------------------------------

#[test]
fn the_data_file_reproduces_the_modules_figures_and_effects() {
    use iolab_sim::experiment::Role;
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../scenarios/experiments/sba-vmerge.toml");
    let text = std::fs::read_to_string(&path).expect("the experiment file exists");
    let exp = iolab_sim::reproduce::Experiment::parse(&text, path.to_str().unwrap())
        .unwrap_or_else(|e| panic!("{e}"));
    let data = exp.run(&ExperimentOptions::default()).unwrap();
    let module = experiment();
    assert_eq!(data.figures.len(), module.figures.len());
    for f in &module.figures {
        let d = data
            .figures
            .iter()
            .find(|x| x.id == f.id)
            .unwrap_or_else(|| panic!("the data file has no figure {}", f.id));
        assert_eq!(d.lab.to_bits(), f.lab.to_bits(), "{}", f.id);
        assert_eq!(d.published, f.published, "{}", f.id);
        // One role differs on purpose: the calibration row's JTI is fitted to nothing, so
        // the data file counts it as a prediction (the module marks the whole row).
        if f.id == "novmerge.users100.jti" {
            assert_eq!((f.role, d.role), (Role::Calibration, Role::Prediction));
        } else {
            assert_eq!(d.role, f.role, "{}", f.id);
        }
    }
    assert_eq!(data.effects.len(), module.effects.len());
    for (d, m) in data.effects.iter().zip(&module.effects) {
        assert_eq!(d.id, m.id);
        assert_eq!(d.lab_pct.to_bits(), m.lab_pct.to_bits(), "{}", d.id);
        assert!((d.published_pct - m.published_pct).abs() < 1e-4, "{}", d.id);
    }
    let (fd, fm) = (data.fidelity(), module.fidelity());
    assert_eq!(fd.effects.met, fd.effects.total);
    assert_eq!(fd.effects.total, fm.effects.total);
    assert_eq!(fm.predicted_figures.met, fm.predicted_figures.total);
    assert_eq!(fd.predicted_figures.met, fd.predicted_figures.total);
    assert_eq!(fd.predicted_figures.total, fm.predicted_figures.total + 1);
    // Its cells are the lab scenarios of scenarios/experiments/sba-vmerge/: the same
    // measurement, bit for bit, for every metric.
    let cells = exp.cell_scenarios(1).unwrap();
    assert_eq!(
        cells.iter().map(|(id, _)| id.as_str()).collect::<Vec<_>>(),
        CELLS
    );
    for (id, text) in cells {
        let emitted = lab::run_scenario(&text, "emitted.toml", &LabOptions::default()).unwrap();
        let file = run_cell(&id);
        let a = &emitted.report.measurements[0].metrics;
        assert_eq!(a.len(), file.metrics.len(), "{id}");
        for (x, y) in a.iter().zip(&file.metrics) {
            assert_eq!(x.name, y.name, "{id}");
            assert_eq!(x.value.to_bits(), y.value.to_bits(), "{id}: {}", x.name);
        }
    }
}
