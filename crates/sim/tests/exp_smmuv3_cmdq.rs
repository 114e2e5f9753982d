//! Tests of the smmuv3-cmdq experiment: input validation, report format, determinism and
//! the mechanism claims, on a shortened copy of the bundled scenario.

use iolab_sim::cmdq::Mode;
use iolab_sim::experiment::{ExperimentOptions, Role};
use iolab_sim::experiments::{smmuv3_cmdq, ExperimentError};

fn short() -> String {
    smmuv3_cmdq::BUNDLED_SCENARIO.replace(
        "runtime_ms = 50, ramp_ms = 10",
        "runtime_ms = 3, ramp_ms = 1",
    )
}

fn run(text: &str) -> Result<iolab_sim::experiment::ExperimentReport, ExperimentError> {
    smmuv3_cmdq::run_scenario(text, "test.toml", &ExperimentOptions::default())
}

fn field_of(e: ExperimentError) -> String {
    assert!(e.is_bad_input(), "{e}");
    e.to_string()
}

#[test]
fn bad_values_name_their_field() {
    let t = short().replace("iodepth = 32, numjobs = 16", "iodepth = 0, numjobs = 16");
    assert!(field_of(run(&t).unwrap_err()).contains("rows[0].fio.iodepth"));
    let t = short().replace("disks = { value = 8,", "disks = { value = 0,");
    assert!(field_of(run(&t).unwrap_err()).contains("sas.disks.value"));
    for bad in ["x", "d05_sas8.off"] {
        // Not a row; a configuration rather than a row.
        let t = short().replace(
            "calibrated_from = \"d05_sas8\"",
            &format!("calibrated_from = \"{bad}\""),
        );
        assert!(field_of(run(&t).unwrap_err()).contains("calibrated_from"));
    }
    let t = short().replace(
        "parameter = \"iommu.cmdq.sync_latency\"",
        "parameter = \"cpu.pte_write\"",
    );
    assert!(field_of(run(&t).unwrap_err()).contains("calibration[0].parameter"));
    let t = short().replace(
        "platforms = [\"hisilicon-d05\"]",
        "platforms = [\"hisilicon-d07\"]",
    );
    assert!(field_of(run(&t).unwrap_err()).contains("calibration[0].platforms"));
    // The same parameter calibrated twice.
    let dup = "[[calibration]]\nparameter = \"iommu.cmdq.sync_latency\"\nplatforms = \
               [\"hisilicon-d06\"]\nvalue = 100\nsource = \"x\"\n\n[[rows]]";
    let t = short().replacen("[[rows]]", dup, 1);
    assert!(field_of(run(&t).unwrap_err()).contains("calibration[1].parameter"));
    let t = short().replace("platform = \"hisilicon-d06\"", "platform = \"nope\"");
    assert!(field_of(run(&t).unwrap_err()).contains("rows[2].platform"));
    let t = short().replace("[cmdq]", "[cmdq]\nbogus = 1");
    assert!(run(&t).unwrap_err().is_bad_input());
    let t = short().replace("sync_msi = { value = 0,", "sync_msi = { value = 0.5,");
    assert!(field_of(run(&t).unwrap_err()).contains("cmdq.sync_msi.value"));
    let t = short().replace("sync_msi = { value = 1,", "sync_msi = { value = 2,");
    assert!(field_of(run(&t).unwrap_err()).contains("rows[2].sync_msi.value"));
}

#[test]
fn report_is_deterministic_and_has_the_required_ids() {
    let a = run(&short()).unwrap();
    let b = run(&short()).unwrap();
    assert_eq!(a.report_text, b.report_text);
    assert_eq!(a.figures, b.figures);
    for id in [
        "d05_sas8.spinlock",
        "d05_sas8.lockfree",
        "d05_sas8.off",
        "d05_nvme.spinlock",
        "d05_nvme.lockfree",
        "d06_nvme.spinlock",
        "d06_nvme.lockfree",
    ] {
        let f = a.figures.iter().find(|f| f.id == id).expect(id);
        assert_eq!(f.unit, "IOPS");
        assert_eq!(
            f.role,
            if id == "d05_sas8.off" || id == "d05_sas8.spinlock" {
                Role::Calibration
            } else {
                Role::Prediction
            }
        );
        assert!(a.figures.iter().any(|f| f.id == format!("{id}.sys_cpu")));
    }
    for id in [
        "d05_sas8.lockfree_vs_spinlock",
        "d05_nvme.lockfree_vs_spinlock",
        "d06_nvme.lockfree_vs_spinlock",
        "d05_sas8.off_vs_spinlock",
    ] {
        assert!(a.effects.iter().any(|e| e.id == id), "{id}");
    }
    let json = serde_json::to_value(&a).unwrap();
    assert!(json["figures"].as_array().unwrap().len() >= 7);
}

#[test]
fn iops_table_parses_in_the_published_column_order() {
    let r = run(&short()).unwrap();
    let rows: Vec<&str> = r
        .report_text
        .lines()
        .filter(|l| l.starts_with("| ") && l.contains("D0"))
        .collect();
    assert_eq!(rows.len(), 3);
    let cells: Vec<&str> = rows[0].split('|').map(str::trim).collect();
    assert_eq!(cells[1], "8x SAS disks, D05");
    // lab (published): spinlock, lock-free, no IOMMU.
    assert!(cells[2].ends_with("(839K)"), "{}", cells[2]);
    assert!(cells[3].ends_with("(835K)"), "{}", cells[3]);
    assert!(cells[4].ends_with("(918K)"), "{}", cells[4]);
    let lab: f64 = cells[2].split('K').next().unwrap().parse().unwrap();
    let fig = r
        .figures
        .iter()
        .find(|f| f.id == "d05_sas8.spinlock")
        .unwrap();
    assert!((lab * 1e3 - fig.lab).abs() <= 500.0);
}

#[test]
fn fio_json_and_mechanisms() {
    let res =
        smmuv3_cmdq::run_results(&short(), "test.toml", &ExperimentOptions::default()).unwrap();
    let json = serde_json::to_value(&res.fio).unwrap();
    let jobs = json["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 7);
    for j in jobs {
        assert!(j["read"]["iops"].as_f64().unwrap() > 0.0);
        assert!(j["read"]["bw"].as_f64().unwrap() > 0.0);
        assert!(
            j["read"]["clat_ns"]["percentile"]["99.000000"]
                .as_u64()
                .unwrap()
                > 0
        );
        assert!(j["usr_cpu"].as_f64().is_some() && j["sys_cpu"].as_f64().is_some());
    }
    for c in &res.cells {
        match c.mode {
            // Without an IOMMU no command is issued; with one, every unmap issues one
            // TLBI and one CMD_SYNC, and the SMMU consumes them all.
            Mode::Off => assert_eq!(c.cmdq.issues, 0),
            _ => {
                assert!(c.cmdq.issues > 0);
                // At least one TLBI and one sync each; unmaps that free a table page add a walk
                // invalidation.
                // (A sync skipped after another one is not written.)
                assert!(c.cmdq.commands + c.cmdq.piggybacked >= 2 * c.cmdq.issues);
                // Every issue carries its own CMD_SYNC (gathered ones too), except that
                // the <= 5.2 queue with MSIs skips a sync right after another (D06); the
                // SMMU consumes everything written.
                assert_eq!(c.cmdq.consumed, c.cmdq.commands);
                assert_eq!(c.cmdq.syncs + c.cmdq.piggybacked, c.cmdq.issues);
            }
        }
        if c.mode == Mode::Spinlock {
            assert_eq!(c.cmdq.cas_attempts, 0);
            // One lock acquisition per command, as Linux <= 5.2 issues the TLBI and the
            // sync separately (the lock's count stops at the window's end).
            assert!(c.cmdq_lock.0 > c.cmdq.issues && c.cmdq_lock.0 <= c.cmdq.commands);
        }
        if c.mode != Mode::Off && c.row.starts_with("d05") {
            // Without MSIs (D05) every sync is seen by CONS register reads, at least one
            // each, and the wait lasts at least one MMIO read (300 ns).
            assert!(c.cmdq.cons_reads >= c.cmdq.syncs);
            assert!(c.cmdq.sync_wait_ns >= 300 * c.cmdq.syncs);
        }
    }
    // The IOMMU costs IOPS on the SAS array (the controller's translation stall).
    let sas = |m| {
        res.cells
            .iter()
            .find(|c| c.row == "d05_sas8" && c.mode == m)
            .unwrap()
            .iops
    };
    assert!(sas(Mode::Off) > sas(Mode::Spinlock));
}

#[test]
fn spinlock_binds_nvme_when_the_device_is_not_the_limit() {
    // A hypothetical device far above the ES3000's rating: the spinlock (TLBI + sync
    // waited under it) becomes the bottleneck, its waiters spin, and the lock-free queue
    // does not hit that ceiling.
    let t = short()
        .replace("value = 770000,", "value = 3000000,")
        .replace(
            "bandwidth_gb_per_s = { value = 3.2",
            "bandwidth_gb_per_s = { value = 30",
        );
    let res = smmuv3_cmdq::run_results(&t, "test.toml", &ExperimentOptions::default()).unwrap();
    let cell = |m| {
        res.cells
            .iter()
            .find(|c| c.row == "d05_nvme" && c.mode == m)
            .unwrap()
    };
    let spin = cell(Mode::Spinlock);
    let free = cell(Mode::LockFree);
    let (acq, ctd, _) = spin.cmdq_lock;
    assert!(ctd as f64 > 0.5 * acq as f64, "{ctd}/{acq}");
    assert!(spin.irq_cpu.2 > 10.0, "spin% {}", spin.irq_cpu.2);
    assert!(
        free.iops > 1.5 * spin.iops,
        "{} vs {}",
        free.iops,
        spin.iops
    );
    // Gathering batches several CPUs' commands under one PROD write.
    assert!(free.cmdq.gathered > 0 && free.cmdq.batches < free.cmdq.issues);
}

#[test]
fn device_dma_translates_through_the_iotlb_and_walk_cache() {
    use iolab_sim::cost::PlatformProfile;
    let res =
        smmuv3_cmdq::run_results(&short(), "test.toml", &ExperimentOptions::default()).unwrap();
    for c in &res.cells {
        let d = &c.dma;
        let pages = d.iotlb_hits + d.iotlb_misses;
        if c.mode == Mode::Off {
            assert_eq!((pages, d.walk_reads), (0, 0));
            assert_eq!(d.translation_ns, 0.0);
            continue;
        }
        // Every mapped 4 KiB buffer is translated once, through the SMMU's IOTLB.
        assert_eq!(pages, d.maps, "{}", c.row);
        // Strict mode: an unmap evicts its entry before the IOVA can be reused, so a
        // device never finds a fresh mapping in the IOTLB.
        assert_eq!(d.iotlb_hits, 0, "{}", c.row);
        // Each miss reads at least the leaf PTE; the walk cache saves the upper levels
        // of most walks (a cold 4-level walk reads 4).
        assert!(d.walk_reads >= d.iotlb_misses);
        assert!(
            d.walk_reads < 2 * d.iotlb_misses,
            "{} {}",
            d.walk_reads,
            d.iotlb_misses
        );
        // Time: the profile's lookups per miss plus its read latency per table read.
        let platform = if c.row.starts_with("d06") {
            "hisilicon-d06"
        } else {
            "hisilicon-d05"
        };
        let p = PlatformProfile::bundled(platform).unwrap();
        let ns = |path: &str| p.cost(path).unwrap().ns();
        let want = d.iotlb_misses as f64
            * (ns("iommu.iotlb_lookup") + ns("iommu.walk_cache_lookup"))
            + d.walk_reads as f64 * ns("iommu.walk_read");
        assert!(
            (d.translation_ns - want).abs() <= 1e-6 * want,
            "{} vs {want}",
            d.translation_ns
        );
    }
}

/// The bundled scenario, shortened, with NVMe interrupt coalescing (feature 08h) set to
/// `threshold` (0's based) and `time_100us`.
fn coalesced(threshold: u32, time_100us: u32) -> String {
    short().replace(
        "[sas]",
        &format!(
            "coalesce_threshold = {{ value = {threshold}, source = \"test\" }}\n\
             coalesce_time_100us = {{ value = {time_100us}, source = \"test\" }}\n\n[sas]"
        ),
    )
}

#[test]
fn nvme_interrupt_coalescing_trades_latency_for_interrupts_and_cpu() {
    let opts = ExperimentOptions::default();
    // Below the device's rated IOPS (4 in flight per queue), so latency is not all
    // queueing at the device.
    let light = |t: String| t.replace("iodepth = 32, numjobs = 32", "iodepth = 4, numjobs = 32");
    let plain = smmuv3_cmdq::run_results(&light(short()), "test.toml", &opts).unwrap();
    let coal = smmuv3_cmdq::run_results(&light(coalesced(7, 1)), "test.toml", &opts).unwrap();
    let cell = |r: &smmuv3_cmdq::Results, id: &str| {
        r.cells
            .iter()
            .find(|c| format!("{}.{}", c.row, c.mode.id()) == id)
            .unwrap()
            .clone()
    };
    for id in [
        "d05_nvme.lockfree",
        "d05_nvme.spinlock",
        "d06_nvme.lockfree",
    ] {
        let (p, c) = (cell(&plain, id), cell(&coal, id));
        // Without coalescing the device raises one interrupt per completion.
        assert_eq!(p.interrupts, p.completions, "{id}");
        // With THR = 7 (8 completions) and 100 us, and 4 I/Os in flight per queue, the
        // timer fires first, with 3-4 completions pending.
        assert!(
            c.interrupts * 2 < c.completions,
            "{id}: {} {}",
            c.interrupts,
            c.completions
        );
        assert!(c.handler_runs < p.handler_runs, "{id}");
        assert!(c.handler_runs <= c.interrupts);
        // CPU per I/O, without spinning, falls (fewer handler entries); both runs use the
        // same CPUs (the completion CPUs are the fio CPUs) and window.
        let busy_per_io = |x: &smmuv3_cmdq::CellResult| (x.irq_cpu.0 + x.irq_cpu.1) / x.iops;
        assert!(busy_per_io(&c) < busy_per_io(&p), "{id}");
        let cpu_per_io = |x: &smmuv3_cmdq::CellResult| (x.fio.usr_cpu + x.fio.sys_cpu) / x.iops;
        if c.mode == Mode::LockFree {
            assert!(cpu_per_io(&c) < cpu_per_io(&p), "{id}");
        } else {
            // The spinlock queue: completions now arrive in bursts, so unmaps (each holding
            // the lock through its sync) collide more often and the spinning can outweigh
            // the saved interrupt entries.
            assert!(c.irq_cpu.2 > p.irq_cpu.2, "{id}: more spinning");
        }
        // Completions wait for the threshold or the timer: latency rises.
        assert!(
            c.fio.read.clat_ns.mean > p.fio.read.clat_ns.mean,
            "{id}: {} vs {}",
            c.fio.read.clat_ns.mean,
            p.fio.read.clat_ns.mean
        );
    }
    // Coalesced runs are deterministic too (the aggregation timers are engine events).
    let again = smmuv3_cmdq::run_results(&light(coalesced(7, 1)), "test.toml", &opts).unwrap();
    assert_eq!(
        serde_json::to_string(&coal).unwrap(),
        serde_json::to_string(&again).unwrap()
    );
    // SAS is unaffected by an NVMe feature.
    let (p, c) = (cell(&plain, "d05_sas8.off"), cell(&coal, "d05_sas8.off"));
    assert_eq!(p.interrupts, c.interrupts);
    // Half a setting is bad input naming the missing field.
    let half = short().replace(
        "[sas]",
        "coalesce_threshold = { value = 3, source = \"x\" }\n\n[sas]",
    );
    let e = smmuv3_cmdq::run_results(&half, "test.toml", &opts).unwrap_err();
    assert!(
        e.is_bad_input() && e.to_string().contains("nvme.coalesce_time_100us"),
        "{e}"
    );
}

#[test]
fn every_configuration_is_a_measurement() {
    let rep = run(&short()).unwrap();
    let iops: Vec<_> = rep.figures.iter().filter(|f| f.unit == "IOPS").collect();
    assert_eq!(rep.measurements.len(), iops.len());
    for (m, f) in rep.measurements.iter().zip(&iops) {
        assert_eq!(m.config, f.id);
        let (row, mode) = m.config.split_once('.').unwrap();
        assert_eq!(m.attrs["cmdq"], if mode == "off" { "none" } else { mode });
        assert_eq!(
            m.attrs["iommu_mode"],
            if mode == "off" { "off" } else { "strict" }
        );
        assert_eq!(
            m.attrs["device"],
            if row.ends_with("sas8") { "sas" } else { "nvme" }
        );
        let platform = if row.starts_with("d06") {
            "hisilicon-d06"
        } else {
            "hisilicon-d05"
        };
        assert_eq!(m.attrs["platform"], platform);
        // The figure is the measurement's IOPS (one run: the same number).
        assert_eq!(m.get("read.iops").unwrap().value, f.lab);
        let lat = m.latency.as_ref().unwrap();
        assert!(lat.count() > 0);
        let cpu = m.cpu.unwrap();
        assert!(cpu.system_ns > 0 && cpu.total_ns() > 0);
        assert!(m.get("irq.per_io").unwrap().value > 0.0);
        assert_eq!(m.get("iommu.translation_ns").is_some(), mode != "off");
    }
}

/// The bundled scenario without its `[[calibration]]` tables (the profile's own timings).
fn uncalibrated(text: &str) -> String {
    let start = text
        .find("\n[[calibration]]\n")
        .expect("a [[calibration]] table");
    let end = start + text[start..].find("\n[[rows]]").expect("rows after it");
    format!("{}{}", &text[..start], &text[end..])
}

#[test]
fn calibrated_sync_latency_reproduces_the_spinlock_baseline() {
    // Full-length run of the bundled scenario: the fitted D05 sync latency brings the SAS
    // spinlock figure as close to the published 839K as the model allows (~7.9% low: the
    // HBA bound with the profile's walk-read latency, documented in the scenario), where the
    // profile's 500 ns makes the lock bind and misses by ~24%.
    let text = smmuv3_cmdq::BUNDLED_SCENARIO;
    let report = run(text).unwrap();
    let spin = report
        .figures
        .iter()
        .find(|f| f.id == "d05_sas8.spinlock")
        .unwrap();
    assert_eq!(spin.role, Role::Calibration);
    let published = spin.published.unwrap();
    let err = (spin.lab / published - 1.0).abs();
    assert!(err < 0.085, "lab {} vs {published}", spin.lab);
    let cal = report
        .calibrated
        .iter()
        .find(|c| c.parameter.starts_with("iommu.cmdq.sync_latency"))
        .expect("sync latency declared as calibrated");
    assert_eq!(cal.parameter, "iommu.cmdq.sync_latency (hisilicon-d05)");
    assert_eq!(cal.fitted_to, vec!["d05_sas8.spinlock".to_string()]);
    assert!(cal.value > 0.0 && cal.value < 500.0, "{}", cal.value);
    // Without the fit the same figure is far off: the parameter is what moves it.
    let plain = run(&uncalibrated(text)).unwrap();
    let spin0 = plain
        .figures
        .iter()
        .find(|f| f.id == "d05_sas8.spinlock")
        .unwrap();
    assert!(spin0.lab < 0.85 * published, "{}", spin0.lab);
    assert!(plain
        .calibrated
        .iter()
        .all(|c| !c.parameter.starts_with("iommu.cmdq")));
}

#[test]
fn calibration_touches_only_the_declared_parameter_and_platform() {
    let opts = ExperimentOptions::default();
    let with = smmuv3_cmdq::run_results(&short(), "test.toml", &opts).unwrap();
    let without = smmuv3_cmdq::run_results(&uncalibrated(&short()), "test.toml", &opts).unwrap();
    assert_eq!(with.cells.len(), without.cells.len());
    let mut changed = 0;
    for (a, b) in with.cells.iter().zip(&without.cells) {
        assert_eq!((&a.row, a.mode), (&b.row, b.mode));
        let untouched = a.row == "d06_nvme" || a.mode == Mode::Off;
        if untouched {
            // D06 is not in `platforms`, and without an IOMMU no sync is waited for.
            assert_eq!(a.iops, b.iops, "{}.{:?}", a.row, a.mode);
            assert_eq!(a.cmdq, b.cmdq, "{}.{:?}", a.row, a.mode);
            assert_eq!(a.fio, b.fio, "{}.{:?}", a.row, a.mode);
        } else if a.cmdq != b.cmdq {
            changed += 1;
        }
    }
    assert!(changed > 0, "the fitted value changed no D05 configuration");
    // The report declares exactly the two fitted parameters.
    let r = run(&short()).unwrap();
    let mut params: Vec<&str> = r.calibrated.iter().map(|c| c.parameter.as_str()).collect();
    params.sort_unstable();
    assert_eq!(
        params,
        [
            "iommu.cmdq.sync_latency (hisilicon-d05)",
            "sas.hba_command_ns"
        ]
    );
}

#[test]
fn every_configuration_carries_the_protection_report() {
    let r = run(&short()).unwrap();
    let value = |m: &iolab_sim::metrics::Measurement, name: &str| {
        m.get(name)
            .unwrap_or_else(|| panic!("{}: no {name}", m.config))
            .value
    };
    for m in &r.measurements {
        let off = m.attrs["iommu_mode"] == "off";
        if off {
            // Without an IOMMU every device access bypasses translation and a freed buffer
            // stays reachable for the whole run.
            assert!(value(m, "protection.bypass_accesses") > 0.0, "{}", m.config);
            assert!(value(m, "protection.max_reachable_after_unmap_ns") > 0.0);
        } else {
            // Strict over the SMMU: no stale IOTLB hit, nothing reachable after the unmap.
            assert_eq!(value(m, "protection.stale_hits"), 0.0, "{}", m.config);
            assert_eq!(value(m, "protection.max_reachable_after_unmap_ns"), 0.0);
            assert_eq!(value(m, "protection.bypass_accesses"), 0.0);
        }
        assert_eq!(value(m, "faults.translation"), 0.0, "{}", m.config);
    }
}

#[test]
fn d06_syncs_complete_by_msi_outside_the_lock_and_d05_polls_cons() {
    let opts = ExperimentOptions::default();
    let r = smmuv3_cmdq::run_results(&short(), "test.toml", &opts).unwrap();
    let cell = |row: &str, mode: Mode| {
        r.cells
            .iter()
            .find(|c| c.row == row && c.mode == mode)
            .unwrap()
    };
    use Mode::{LockFree, Spinlock};
    // D05 (no MSI): every sync is waited for with CONS register reads.
    for mode in [Spinlock, LockFree] {
        let c = cell("d05_nvme", mode);
        assert!(c.cmdq.cons_reads >= c.cmdq.syncs, "{mode:?}: {:?}", c.cmdq);
        assert_eq!(c.cmdq.piggybacked, 0);
    }
    // D06 (MSI): no register reads, and the <= 5.2 queue skips a sync right after another
    // one (the caller waits for that one), so it completes fewer syncs than issues.
    let d06 = cell("d06_nvme", Spinlock);
    assert_eq!(d06.cmdq.cons_reads, 0);
    assert_eq!(d06.cmdq.syncs + d06.cmdq.piggybacked, d06.cmdq.issues);
    // Polling outside the lock: the lock is held for insertion only, so far shorter waits
    // than D05's, whose holder polls CONS under it.
    let d05 = cell("d05_nvme", Spinlock);
    assert!(
        d06.cmdq_lock.2 < d05.cmdq_lock.2,
        "{:?} vs {:?}",
        d06.cmdq_lock,
        d05.cmdq_lock
    );
    assert_eq!(cell("d06_nvme", LockFree).cmdq.cons_reads, 0);
}

#[test]
fn sas_array_is_bound_by_the_hba_so_the_queue_design_does_not_matter() {
    // Both queue designs give the same rate: the controller's per-command time (including
    // the translation stall of each command's DMA) binds, not the completion CPUs.
    let opts = ExperimentOptions::default();
    let r = smmuv3_cmdq::run_results(&short(), "test.toml", &opts).unwrap();
    let get = |mode: Mode| {
        r.cells
            .iter()
            .find(|c| c.row == "d05_sas8" && c.mode == mode)
            .unwrap()
    };
    let spin = get(Mode::Spinlock);
    let free = get(Mode::LockFree);
    let off = get(Mode::Off);
    assert!(
        (free.iops / spin.iops - 1.0).abs() < 0.01,
        "{} vs {}",
        free.iops,
        spin.iops
    );
    // The IOMMU's loss is the translation stall in the controller: off is faster.
    assert!(off.iops > 1.1 * spin.iops, "{} vs {}", off.iops, spin.iops);
    // A walk-read calibration moves the SAS figures through the controller: a faster walk
    // read gives a shorter stall and more IOPS, with no change without an IOMMU.
    let fast = short().replacen(
        "[[rows]]",
        "[[calibration]]\nparameter = \"iommu.walk_read\"\nplatforms = [\"hisilicon-d05\"]\n\
         value = 50\nsource = \"test\"\n\n[[rows]]",
        1,
    );
    let f = smmuv3_cmdq::run_results(&fast, "test.toml", &opts).unwrap();
    let fget = |mode: Mode| {
        f.cells
            .iter()
            .find(|c| c.row == "d05_sas8" && c.mode == mode)
            .unwrap()
    };
    assert!(fget(Mode::Spinlock).iops > spin.iops);
    assert!(
        fget(Mode::Spinlock).dma.translation_ns < spin.dma.translation_ns,
        "translation time falls with the walk read"
    );
    assert_eq!(fget(Mode::Off).iops, off.iops);
}
