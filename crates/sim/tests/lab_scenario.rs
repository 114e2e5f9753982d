//! Workload scenarios (`iolab_sim::lab`): validation names the field and line, caps are
//! enforced, runs are deterministic, and the IOMMU modes order as their mechanisms say.

mod common;
use common::{metric, run};

use iolab_sim::lab::LabError;
use iolab_sim::lab::{self, caps, examples, LabOptions, LabRun};
use iolab_sim::tomlfile::InputError;

/// A small CPU-bound NVMe scenario: 4 CPUs, 4 jobs, a device rated far above what 4 CPUs
/// can drive, so the per-I/O CPU cost of the DMA path sets the IOPS.
fn nvme_cpu_bound(mode: &str, model: &str) -> String {
    format!(
        r#"
name = "cpu-bound-{mode}"
seed = 7
[machine]
platform = "hisilicon-d06"
cpus = 4
memory_gib = 16
[iommu]
model = "{model}"
mode = "{mode}"
[[device]]
kind = "nvme"
max_iops = 20000000
bandwidth_gb_per_s = 100
[workload]
kind = "fio"
ioengine = "libaio"
rw = "randread"
bs = 4096
iodepth = 32
numjobs = 4
runtime_ms = 10
ramp_ms = 2
"#
    )
}

fn run_seed(text: &str, seed: u64) -> LabRun {
    lab::run_scenario(
        text,
        "test.toml",
        &LabOptions {
            runs: 1,
            seed: Some(seed),
        },
    )
    .expect("scenario runs")
}

/// The input error of a scenario that must be refused: (field, line, message).
fn refused(text: &str) -> (String, Option<usize>, String) {
    match lab::run_scenario(text, "bad.toml", &LabOptions::default()) {
        Err(LabError::Input(e @ InputError::Field { .. })) => {
            let msg = e.to_string();
            let InputError::Field { field, line, .. } = e else {
                unreachable!()
            };
            (field, line, msg)
        }
        Err(e) => panic!("expected a field error, got {e:?}"),
        Ok(_) => panic!("expected the scenario to be refused"),
    }
}

fn base() -> String {
    nvme_cpu_bound("strict", "smmuv3")
}

// ---------------------------------------------------------------------------------------
// Validation
// ---------------------------------------------------------------------------------------

#[test]
fn a_misspelt_workload_field_is_named_with_its_line() {
    let text = base().replace("iodepth = 32", "iodepht = 32");
    let (field, line, msg) = refused(&text);
    assert_eq!(field, "workload.iodepht");
    assert_eq!(line, Some(20));
    assert!(msg.contains("bad.toml"), "{msg}");
    assert!(
        msg.contains("iodepth"),
        "the expected fields are listed: {msg}"
    );
}

#[test]
fn a_wrong_type_is_named() {
    let text = base().replace("cpus = 4", "cpus = \"four\"");
    let (field, line, _) = refused(&text);
    assert_eq!(field, "machine.cpus");
    assert_eq!(line, Some(6));
}

#[test]
fn a_block_size_must_be_a_multiple_of_512() {
    let (field, _, msg) = refused(&base().replace("bs = 4096", "bs = 1000"));
    assert_eq!(field, "workload.bs");
    assert!(msg.contains("multiple of 512"), "{msg}");
    let (field, _, _) = refused(&base().replace("bs = 4096", "bs = 0"));
    assert_eq!(field, "workload.bs");
}

#[test]
fn a_mode_of_another_model_is_refused() {
    let (field, line, msg) = refused(&nvme_cpu_bound("ddw-dynamic", "smmuv3"));
    assert_eq!(field, "iommu.mode");
    assert_eq!(line, Some(10));
    assert!(
        msg.contains("\"strict\""),
        "the valid modes are listed: {msg}"
    );
    let (field, _, _) = refused(&nvme_cpu_bound("lazy", "ipmmu"));
    assert_eq!(field, "iommu.mode");
    let (field, _, _) = refused(&nvme_cpu_bound("strict", "virtio-iommu"));
    assert_eq!(field, "iommu.model");
}

#[test]
fn a_field_of_another_device_kind_is_unknown_where_it_stands() {
    let text = base().replace("kind = \"nvme\"", "kind = \"nvme\"\ndisks = 8");
    let (field, line, _) = refused(&text);
    assert_eq!(field, "device[0].disks");
    assert_eq!(line, Some(13));
}

#[test]
fn devices_of_one_scenario_are_of_one_kind() {
    let text = base().replace("[workload]", "[[device]]\nkind = \"sas\"\n[workload]");
    let (field, line, _) = refused(&text);
    assert_eq!(field, "device[1].kind");
    assert!(line.is_some());
}

#[test]
fn a_workload_on_the_wrong_device_is_refused() {
    let text = base().replace("kind = \"nvme\"", "kind = \"usb\"");
    let (field, _, msg) = refused(&text);
    assert_eq!(field, "workload.kind");
    assert!(msg.contains("fio runs on nvme or sas"), "{msg}");
}

#[test]
fn model_specific_fields_are_refused_elsewhere() {
    let (field, _, _) = refused(
        &nvme_cpu_bound("off", "none")
            .replace("mode = \"off\"", "mode = \"off\"\ncmdq = \"lockfree\""),
    );
    assert_eq!(field, "iommu.cmdq");
    let (field, _, _) = refused(&base().replace(
        "mode = \"strict\"",
        "mode = \"strict\"\nflush_queue_size = 128",
    ));
    assert_eq!(field, "iommu.flush_queue_size");
}

#[test]
fn missing_required_fields_and_unknown_names_are_named() {
    let (field, _, _) = refused(&base().replace("runtime_ms = 10", ""));
    assert_eq!(field, "workload.runtime_ms");
    let (field, _, msg) = refused(&base().replace("hisilicon-d06", "nowhere"));
    assert_eq!(field, "machine.platform");
    assert!(msg.contains("hisilicon-d06"), "bundled names listed: {msg}");
    let (field, _, _) = refused(&base().replace("rw = \"randread\"", "rw = \"sideways\""));
    assert_eq!(field, "workload.rw");
}

#[test]
fn a_platform_without_the_needed_group_is_refused() {
    // hp-zx1 has no SMMUv3 command queue costs.
    let (field, _, msg) = refused(&base().replace("hisilicon-d06", "hp-zx1"));
    assert_eq!(field, "machine.platform");
    assert!(msg.contains("cmdq"), "{msg}");
}

#[test]
fn netperf_needs_the_power_tce_path_and_runs_through_a_direct_ddw() {
    let text = r#"
[machine]
platform = "hisilicon-d06"
cpus = 8
memory_gib = 300
[iommu]
model = "smmuv3"
mode = "strict"
[[device]]
kind = "nic"
[workload]
kind = "netperf"
run_ms = 5
"#;
    let (field, _, _) = refused(text);
    assert_eq!(field, "iommu.model");
    let direct = text
        .replace("hisilicon-d06", "power-lpar")
        .replace("model = \"smmuv3\"", "model = \"pseries\"")
        .replace("mode = \"strict\"", "mode = \"ddw-direct\"");
    // A direct DDW is a static map: netperf runs through it with no per-I/O hypercalls,
    // while the default window issues them for every fragment.
    let direct = direct
        .replace("run_ms = 5", "run_ms = 5\nwarmup_ms = 1")
        .replace("memory_gib = 300", "memory_gib = 64")
        .replace("kind = \"nic\"", "kind = \"nic\"\nqueues = 8");
    let direct_run = run(&direct);
    assert_eq!(metric(&direct_run, "dma.hypercalls_per_msg"), 0.0);
    assert!(metric(&direct_run, "net.throughput_gbps") > 0.0);
    let window = run(&direct.replace("ddw-direct", "default-window"));
    assert!(metric(&window, "dma.hypercalls_per_msg") >= 1.0);
    // No mapping work: the CPU-bound stream is faster, or as fast for less CPU.
    let (dg, wg) = (
        metric(&direct_run, "net.throughput_gbps"),
        metric(&window, "net.throughput_gbps"),
    );
    let (db, wb) = (
        metric(&direct_run, "cpu.busy_pct"),
        metric(&window, "cpu.busy_pct"),
    );
    assert!(
        dg > wg || (dg >= wg * 0.99 && db < wb),
        "{dg} {db} vs {wg} {wb}"
    );
}

#[test]
fn syntax_errors_give_the_line() {
    match lab::run_scenario(
        "name = \"x\"\n[machine\n",
        "bad.toml",
        &LabOptions::default(),
    ) {
        Err(LabError::Input(InputError::Syntax { line, .. })) => assert_eq!(line, 2),
        other => panic!("expected a syntax error, got {other:?}"),
    }
}

#[test]
fn experiment_files_are_told_apart() {
    use iolab_sim::reproduce::bundled;
    let file = bundled::text("smmuv3-cmdq").expect("bundled");
    assert!(bundled::is_experiment_file(file));
    assert!(bundled::refuse_experiment_key(file, "e.toml").is_err());
    assert!(!bundled::is_experiment_file(&base()));
    assert!(bundled::refuse_experiment_key(&base(), "s.toml").is_ok());
}

// ---------------------------------------------------------------------------------------
// Caps
// ---------------------------------------------------------------------------------------

#[test]
fn every_growth_has_a_cap_with_a_clear_error() {
    let cases: Vec<(String, &str, &str)> = vec![
        (
            base().replace("cpus = 4", &format!("cpus = {}", caps::MAX_CPUS + 1)),
            "machine.cpus",
            "MAX_CPUS",
        ),
        (
            base().replace("cpus = 4", "cpus = 0"),
            "machine.cpus",
            "1..=",
        ),
        (
            base().replace(
                "memory_gib = 16",
                &format!("memory_gib = {}", caps::MAX_MEMORY_GIB + 1),
            ),
            "machine.memory_gib",
            "MAX_MEMORY_GIB",
        ),
        (
            base().replace(
                "iodepth = 32",
                &format!("iodepth = {}", caps::MAX_IODEPTH + 1),
            ),
            "workload.iodepth",
            "MAX_IODEPTH",
        ),
        (
            base().replace("numjobs = 4", "numjobs = 5"),
            "workload.numjobs",
            "one job per CPU",
        ),
        (
            base().replace(
                "runtime_ms = 10",
                &format!("runtime_ms = {}", caps::MAX_RUN_MS + 1),
            ),
            "workload.runtime_ms",
            "MAX_RUN_MS",
        ),
        (
            base().replace(
                "runtime_ms = 10",
                &format!("runtime_ms = {}", caps::MAX_RUN_MS),
            ),
            "workload.ramp_ms",
            "MAX_RUN_MS",
        ),
        (
            base().replace("bs = 4096", &format!("bs = {}", caps::MAX_BLOCK_SIZE * 2)),
            "workload.bs",
            "MAX_BLOCK_SIZE",
        ),
        (
            base().replace("ramp_ms = 2", "ramp_ms = 2\nsize_gib = 0"),
            "workload.size_gib",
            "1..=",
        ),
        (
            base().replace("mode = \"strict\"", "mode = \"strict\"\ncmdq_log2size = 20"),
            "iommu.cmdq_log2size",
            "MAX_CMDQ_LOG2SIZE",
        ),
        (
            base().replace(
                "kind = \"nvme\"",
                &format!(
                    "kind = \"nvme\"\nio_queues = {}",
                    caps::MAX_DEVICE_QUEUES + 1
                ),
            ),
            "device[0].io_queues",
            "MAX_DEVICE_QUEUES",
        ),
        (
            base().replace(
                "[workload]",
                &("[[device]]\nkind = \"nvme\"\n".repeat(caps::MAX_DEVICES) + "[workload]"),
            ),
            "device",
            "MAX_DEVICES",
        ),
    ];
    for (text, field, needle) in cases {
        let (got, _, msg) = refused(&text);
        assert_eq!(got, field, "{msg}");
        assert!(msg.contains(needle), "{field}: {msg}");
    }
}

#[test]
fn in_flight_ios_are_capped_over_all_jobs() {
    let text = base()
        .replace("cpus = 4", "cpus = 1024")
        .replace("memory_gib = 16", "memory_gib = 65536")
        .replace("numjobs = 4", "numjobs = 1024")
        .replace("iodepth = 32", "iodepth = 4096");
    let (field, _, msg) = refused(&text);
    assert_eq!(field, "workload.iodepth");
    assert!(msg.contains("MAX_INFLIGHT"), "{msg}");
}

#[test]
fn buffers_must_fit_in_memory() {
    let text = base()
        .replace("memory_gib = 16", "memory_gib = 1")
        .replace("bs = 4096", "bs = 1048576");
    let (field, _, _) = refused(&text);
    assert_eq!(field, "machine.memory_gib");
}

#[test]
fn runs_are_capped() {
    let s = lab::validate(&base(), "t.toml", None).unwrap();
    let err = lab::run(
        &s,
        &LabOptions {
            runs: caps::MAX_RUNS + 1,
            seed: None,
        },
    )
    .unwrap_err();
    assert!(err.to_string().contains("MAX_RUNS"), "{err}");
}

// ---------------------------------------------------------------------------------------
// Determinism
// ---------------------------------------------------------------------------------------

#[test]
fn the_same_seed_gives_the_same_bytes() {
    let a = run(&base());
    let b = run(&base());
    assert_eq!(a.report.report_text, b.report.report_text);
    assert_eq!(a.report.measurements, b.report.measurements);
    assert_eq!(
        serde_json::to_string(&a.json()).unwrap(),
        serde_json::to_string(&b.json()).unwrap()
    );
}

#[test]
fn another_seed_gives_a_different_but_close_result() {
    let a = run_seed(&base(), 1);
    let b = run_seed(&base(), 2);
    assert_ne!(a.report.measurements, b.report.measurements);
    let (x, y) = (metric(&a, "read.iops"), metric(&b, "read.iops"));
    assert!((x - y).abs() / x < 0.05, "{x} vs {y}");
}

#[test]
fn the_scenario_seed_is_used_unless_overridden() {
    let own = run(&base()); // seed = 7 in the file
    let explicit = run_seed(&base(), 7);
    assert_eq!(own.seed, 7);
    assert_eq!(own.report.measurements, explicit.report.measurements);
}

#[test]
fn repeated_runs_give_one_measurement_each_with_its_seed() {
    let r = lab::run_scenario(
        &base(),
        "t.toml",
        &LabOptions {
            runs: 3,
            seed: Some(5),
        },
    )
    .unwrap();
    let ms = &r.report.measurements;
    assert_eq!(ms.len(), 3);
    let seeds: Vec<&str> = ms.iter().map(|m| m.attrs["seed"].as_str()).collect();
    assert_eq!(seeds[0], "5");
    assert!(seeds[0] != seeds[1] && seeds[1] != seeds[2] && seeds[0] != seeds[2]);
    assert_eq!(ms[1].config, "cpu-bound-strict#1");
    assert_eq!(r.fio.as_ref().unwrap().jobs.len(), 3);
}

// ---------------------------------------------------------------------------------------
// Mechanisms and outputs
// ---------------------------------------------------------------------------------------

#[test]
fn strict_costs_more_than_lazy_which_costs_more_than_off_when_cpu_bound() {
    let off = run(&nvme_cpu_bound("off", "smmuv3"));
    let lazy = run(&nvme_cpu_bound("lazy", "smmuv3"));
    let strict = run(&nvme_cpu_bound("strict", "smmuv3"));
    let iops = |r: &LabRun| metric(r, "read.iops");
    assert!(
        iops(&off) > iops(&lazy) && iops(&lazy) > iops(&strict),
        "off {} lazy {} strict {}",
        iops(&off),
        iops(&lazy),
        iops(&strict)
    );
    // The mechanism: strict syncs once per unmap; lazy flushes a whole ring at a time.
    let syncs = |r: &LabRun| metric(r, "dma.inval_syncs");
    assert!(
        syncs(&lazy) * 50.0 < syncs(&strict),
        "lazy {} strict {}",
        syncs(&lazy),
        syncs(&strict)
    );
    assert_eq!(syncs(&off), 0.0);
    assert!(metric(&lazy, "dma.flush_queue_flushes") > 0.0);
}

#[test]
fn a_fio_measurement_carries_the_configuration_and_cpu_breakdown() {
    let r = run(&base());
    let m = &r.report.measurements[0];
    for (k, v) in [
        ("iommu_model", "smmuv3"),
        ("iommu_mode", "strict"),
        ("cmdq", "lockfree"),
        ("device", "nvme"),
        ("workload", "fio"),
        ("numjobs", "4"),
        ("threads", "4"),
        ("iodepth", "32"),
        ("bs", "4096"),
        ("cpus", "4"),
    ] {
        assert_eq!(m.attrs.get(k).map(String::as_str), Some(v), "attr {k}");
    }
    let cpu = m.cpu.expect("CPU breakdown");
    // 4 CPUs over the 10 ms window.
    assert_eq!(cpu.total_ns(), 4 * 10_000_000);
    assert!(cpu.system_ns > cpu.user_ns);
    let lat = m.latency.as_ref().expect("latency histogram");
    let ios = metric(&r, "read.iops") * 0.010;
    assert!(
        (lat.count() as f64 - ios).abs() < 1.0,
        "{} vs {ios}",
        lat.count()
    );
    assert!(r.report.report_text.contains("clat percentiles (usec)"));
    let json = serde_json::to_value(r.json()).unwrap();
    let job = &json["jobs"][0];
    assert!(job["read"]["iops"].as_f64().unwrap() > 0.0);
    assert!(
        job["read"]["clat_ns"]["percentile"]["99.000000"]
            .as_u64()
            .unwrap()
            > 0
    );
    assert!(job["sys_cpu"].as_f64().is_some() && job["usr_cpu"].as_f64().is_some());
}

#[test]
fn every_bundled_example_runs_and_measures() {
    assert!(examples::EXAMPLES.len() >= 8);
    for (name, text) in examples::EXAMPLES {
        let r = lab::run_scenario(text, &format!("{name}.toml"), &LabOptions::default())
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(r.report.name, *name);
        let m = &r.report.measurements[0];
        for k in [
            "iommu_model",
            "iommu_mode",
            "device",
            "workload",
            "cpus",
            "threads",
        ] {
            assert!(m.attrs.contains_key(k), "{name}: attr {k}");
        }
        assert!(m.cpu.is_some(), "{name}: CPU breakdown");
        assert!(!r.report.report_text.is_empty(), "{name}");
        let on_disk = std::fs::read_to_string(format!(
            "{}/../../scenarios/examples/{name}.toml",
            env!("CARGO_MANIFEST_DIR")
        ))
        .unwrap();
        assert_eq!(&on_disk, text, "{name}: the bundled copy is the file");
    }
}

#[test]
fn bonnie_prints_a_bonnie_103_csv_row() {
    let r = run(examples::example("bonnie-usb-ipmmu").unwrap());
    let row = r.report.report_text.lines().next().unwrap();
    let cols: Vec<&str> = row.split(',').collect();
    // name, size, 5 x (K/s, %CP), seeks/s, %CP, files, 12 file-test fields.
    assert_eq!(cols.len(), 27, "{row}");
    assert_eq!(cols[0], "bonnie-usb-ipmmu");
    assert_eq!(cols[1], "8G", "bonnie++ prints -s 8192 as 8G");
    let out_block: f64 = cols[4].parse().unwrap();
    assert!((out_block - metric(&r, "bonnie.out_block_kps")).abs() < 1.0);
    assert!(
        metric(&r, "usb.flushes") > 0.0,
        "the IPMMU flushes on unmap"
    );
    let off = run(examples::example("bonnie-usb-off").unwrap());
    assert_eq!(metric(&off, "usb.flushes"), 0.0);
}

#[test]
fn a_usb_devices_flush_time_can_be_set_and_slows_the_seeks() {
    let with_files = examples::example("bonnie-usb-ipmmu").unwrap();
    // Without the file tests (bonnie++ -n 0) the seeks' fsyncs are the only flushes.
    let text = &with_files.replace("kind = \"bonnie\"", "kind = \"bonnie\"\nfiles = 0");
    let base = run(text);
    let slow = run(&text.replace(
        "speed = \"superspeed\"",
        "speed = \"superspeed\"\nmedia_flush_us = 4000",
    ));
    // 8000 seeks, each seeker's first and every tenth after it fsync()ed: two cache
    // flushes per update.
    let flushes = metric(&base, "usb.cache_flushes");
    assert!((1600.0..=1604.0).contains(&flushes), "{flushes}");
    assert_eq!(metric(&slow, "usb.cache_flushes"), flushes);
    // With them (bonnie++'s default -n 16; the lab runs 1,024 files per test), each of
    // 2 x 1,024 creates adds three flushes and each of 2 x 1,024 deletes two.
    let all = metric(&run(with_files), "usb.cache_flushes");
    assert_eq!(all - flushes, (2 * 1024 * 3 + 2 * 1024 * 2) as f64);
    // -n 1: 1,024 files, all of which the lab runs.
    let one = run(&with_files.replace("kind = \"bonnie\"", "kind = \"bonnie\"\nfiles = 1"));
    assert_eq!(metric(&one, "usb.cache_flushes"), all);
    assert!(
        one.report.report_text.contains(",1,"),
        "{}",
        one.report.report_text
    );
    let too_many = with_files.replace("kind = \"bonnie\"", "kind = \"bonnie\"\nfiles = 2000");
    let e = lab::run_scenario(&too_many, "n.toml", &LabOptions::default()).unwrap_err();
    assert!(e.to_string().contains("workload.files"), "{e}");
    let seeks = |r: &LabRun| metric(r, "bonnie.seeks_per_s");
    assert!(
        seeks(&slow) < 0.8 * seeks(&base),
        "{} vs {}",
        seeks(&slow),
        seeks(&base)
    );
    let bad = text.replace(
        "speed = \"superspeed\"",
        "speed = \"superspeed\"\nmedia_flush_us = -1",
    );
    let e = lab::run_scenario(&bad, "bad.toml", &LabOptions::default()).unwrap_err();
    assert!(e.to_string().contains("media_flush_us"), "{e}");
}

#[test]
fn a_dynamic_ddw_needs_fewer_hypercalls_per_message_than_the_default_window() {
    let ddw = run(examples::example("netperf-pseries-ddw").unwrap());
    let dflt = run(examples::example("netperf-pseries-default").unwrap());
    let h = |r: &LabRun| metric(r, "dma.hypercalls_per_msg");
    let t = |r: &LabRun| metric(r, "dma.tces_per_msg");
    assert!(
        t(&ddw) < t(&dflt),
        "64 KiB TCEs: {} vs {}",
        t(&ddw),
        t(&dflt)
    );
    assert!(h(&ddw) > 0.0 && h(&dflt) > 0.0, "{} {}", h(&ddw), h(&dflt));
    let json = serde_json::to_value(ddw.json()).unwrap();
    assert_eq!(json["name"], "netperf-pseries-ddw");
    assert!(json["measurements"][0]["metrics"].is_array());
}

#[test]
fn bypass_and_direct_windows_skip_the_mapping_work() {
    let sba = examples::example("fio-sas-sba").unwrap();
    let translated = run(sba);
    let bypass = run(&sba.replace("mode = \"translated\"", "mode = \"bypass\""));
    assert!(metric(&translated, "dma.map_ns") > 0.0);
    assert_eq!(metric(&bypass, "dma.map_ns"), 0.0);
    assert_eq!(bypass.report.measurements[0].attrs["iommu_mode"], "bypass");

    let power = |mode: &str| {
        base()
            .replace("hisilicon-d06", "power-lpar")
            .replace("model = \"smmuv3\"", "model = \"pseries\"")
            .replace("mode = \"strict\"", &format!("mode = \"{mode}\""))
    };
    let window = run(&power("default-window"));
    let direct = run(&power("ddw-direct"));
    assert!(metric(&window, "dma.map_ns") > 0.0, "a hypercall per map");
    assert_eq!(metric(&direct, "dma.map_ns"), 0.0, "pre-mapped once");
    assert!(metric(&direct, "read.iops") > metric(&window, "read.iops"));
}

// ---------------------------------------------------------------------------------------
// re-aim on a SCSI/SAS disk
// ---------------------------------------------------------------------------------------

/// A small re-aim ramp on a zx1 with one SCSI disk behind `model`/`mode`.
fn reaim_scenario(model: &str, mode: &str, device_extra: &str) -> String {
    format!(
        r#"
name = "reaim-{model}"
seed = 3
[machine]
platform = "hp-zx1"
cpus = 2
memory_gib = 8
[iommu]
model = "{model}"
mode = "{mode}"
[[device]]
kind = "scsi"
{device_extra}
[workload]
kind = "reaim"
start = 2
end = 6
increment = 2
"#
    )
}

#[test]
fn reaim_fields_are_validated_by_name() {
    let base = reaim_scenario("sba", "translated", "");
    let (field, line, msg) = refused(&base.replace("end = 6", "end = 1"));
    assert_eq!(field, "workload.end");
    assert!(line.is_some());
    assert!(msg.contains("from workload.start"), "{msg}");
    let (field, _, _) = refused(&base.replace("increment = 2", "incremnet = 2"));
    assert_eq!(field, "workload.incremnet");
    let (field, _, msg) = refused(&base.replace("end = 6", "end = 6000"));
    assert_eq!(field, "workload.end");
    assert!(msg.contains("MAX_USERS"), "{msg}");
    let (field, _, msg) = refused(&base.replace("kind = \"scsi\"", "kind = \"scsi\"\nrpm = 99"));
    assert_eq!(field, "device[0].rpm");
    assert!(msg.contains("1000"), "{msg}");
    let (field, _, _) = refused(&base.replace("memory_gib = 8", "memory_gib = 4"));
    assert_eq!(field, "machine.memory_gib");
    let bad_task = base.replace(
        "increment = 2",
        "increment = 2\n[[workload.task]]\nname = \"cpu\"\nweight = 0\nuser_kcycles = 10",
    );
    let (field, _, _) = refused(&bad_task);
    assert_eq!(field, "workload.task[0].weight");
    // fio fields do not belong to re-aim, and re-aim does not run on NVMe.
    let (field, _, _) = refused(&base.replace("increment = 2", "increment = 2\nbs = 4096"));
    assert_eq!(field, "workload.bs");
    let (field, _, msg) = refused(&base.replace("kind = \"scsi\"", "kind = \"nvme\""));
    assert_eq!(field, "workload.kind");
    assert!(msg.contains("reaim on scsi"), "{msg}");
    // The ramp is capped in task runs.
    let (field, _, msg) = refused(
        &base
            .replace("end = 6", "end = 5000")
            .replace("increment = 2", "increment = 100"),
    );
    assert_eq!(field, "workload.end");
    assert!(msg.contains("MAX_TASK_RUNS"), "{msg}");
}

#[test]
fn reaim_prints_the_reaim_table_and_is_deterministic() {
    let text = reaim_scenario("sba", "translated", "");
    let a = run(&text);
    let b = run(&text);
    assert_eq!(a.report.report_text, b.report.report_text);
    let rows = iolab_sim::workloads::reaim::parse_table(&a.report.report_text);
    assert_eq!(
        rows.iter().map(|r| r.forked).collect::<Vec<_>>(),
        vec![2, 4, 6]
    );
    assert!(a.report.report_text.contains("Max Jobs per Minute"));
    for r in &rows {
        assert!(r.jpm > 0.0 && r.jti <= 100, "{r:?}");
    }
    let max = rows.iter().map(|r| r.jpm).fold(0.0, f64::max);
    assert!((metric(&a, "reaim.max_jpm") - max).abs() / max < 1e-3);
    assert_eq!(a.report.measurements[0].attrs["workload"], "reaim");
    let other = run_seed(&text, 99);
    assert_ne!(a.report.report_text, other.report.report_text);
}

#[test]
fn reaim_jobs_per_minute_fall_when_the_disk_is_slower() {
    let fast = run(&reaim_scenario("none", "off", ""));
    let slow = run(&reaim_scenario(
        "none",
        "off",
        "rpm = 5400\nseek_read_ms = 9\nseek_write_ms = 10",
    ));
    let (f, s) = (
        metric(&fast, "reaim.max_jpm"),
        metric(&slow, "reaim.max_jpm"),
    );
    assert!(s < f * 0.8, "slow disk {s} vs fast {f}");
    // The fsync path really used the disk.
    assert!(metric(&fast, "scsi.requests") > 0.0);
    assert!(metric(&fast, "disk.busy_pct") > 10.0);
}

#[test]
fn reaim_maps_through_the_iommu_model_it_names() {
    let off = run(&reaim_scenario("none", "off", ""));
    let sba = run(&reaim_scenario("sba", "translated", ""));
    assert_eq!(metric(&off, "scsi.iommu_cpu_ns_per_request"), 0.0);
    assert!(metric(&sba, "scsi.iommu_cpu_ns_per_request") > 0.0);
    // The SBA coalesces page-aligned pieces into fewer DMA segments than pages.
    assert!(
        metric(&sba, "scsi.dma_segments_per_request")
            < metric(&off, "scsi.dma_segments_per_request")
    );
    let smmu = run(examples::example("reaim-sas-smmuv3").unwrap());
    assert!(metric(&smmu, "scsi.iommu_cpu_ns_per_request") > 0.0);
    assert_eq!(smmu.report.measurements[0].attrs["iommu_model"], "smmuv3");
}

// ---------------------------------------------------------------------------------------
// SMMUv3 IOTLB on the fio path
// ---------------------------------------------------------------------------------------

#[test]
fn smmuv3_fio_translates_through_the_iotlb() {
    let strict = run(examples::example("fio-nvme-smmuv3-strict").unwrap());
    let lazy = run(examples::example("fio-nvme-smmuv3-lazy").unwrap());
    for r in [&strict, &lazy] {
        let hit = metric(r, "iotlb.hit_pct");
        assert!((0.0..=100.0).contains(&hit));
        // 64 KiB I/Os: 16 pages each, every page a fresh IOVA, so a miss and at least one
        // walk read each; the walk cache keeps the walks short of 4 reads a page.
        let walks = metric(r, "iotlb.walk_reads_per_io");
        assert!((16.0..64.0).contains(&walks), "{walks}");
    }
    // Strict issues a CMD_TLBI_NH_VA per page and a sync per unmap; lazy a whole-ASID
    // invalidation per flush, which also empties the walk cache, so its walks are no
    // shorter than strict's.
    assert!(metric(&strict, "cmdq.commands") > 10.0 * metric(&lazy, "cmdq.commands"));
    assert!(metric(&lazy, "iotlb.walk_reads_per_io") >= metric(&strict, "iotlb.walk_reads_per_io"));
    let off = run(examples::example("fio-nvme-off").unwrap());
    assert!(off.report.measurements[0].get("iotlb.hit_pct").is_none());
}

#[test]
fn the_iova_tree_lock_is_an_engine_spinlock_contended_at_many_cpus() {
    // SAS completions run on the completion queues' CPUs, not the submitters': IOVAs are
    // freed into other CPUs' magazines, and the misses take the IOVA tree's lock.
    let tree = |cpus: usize| {
        let text = examples::example("fio-sas-lockfree")
            .unwrap()
            .replace("cpus = 64", &format!("cpus = {cpus}"))
            .replace("numjobs = 16", &format!("numjobs = {cpus}"))
            .replace("first_cpu = 16", "");
        let r = run(&text);
        (
            metric(&r, "lock.iova_tree.acquisitions"),
            metric(&r, "lock.iova_tree.contended"),
        )
    };
    let (few, many) = (tree(4), tree(64));
    assert!(
        few.0 > 0.0 && many.0 > 0.0,
        "the tree lock is taken: {few:?} {many:?}"
    );
    assert_eq!(few.1, 0.0, "4 CPUs do not contend: {few:?}");
    assert!(many.1 > 0.0, "64 CPUs contend: {many:?}");
}
