//! The `pseries-ddw` experiment: scenario validation, the report's format, determinism,
//! and the mechanisms the effects come from. Run with `--release` (shortened scenarios).

use std::sync::Arc;

use iolab_iommu::addr::SZ_1G;
use iolab_iommu::dma::{Device, DomainId};
use iolab_iommu::hw::pseries::{ddw_page, DdwConfig, DdwPolicy, PseriesConfig, WindowConfig};
use iolab_iommu::hw::PseriesIommu;
use iolab_iommu::work::WorkRecord;
use iolab_sim::cost::PlatformProfile;
use iolab_sim::devices::nic::{Coalescing, HvSerialisation, LinkConfig};
use iolab_sim::experiment::{ExperimentOptions, ExperimentReport, Role};
use iolab_sim::experiments::{pseries_ddw, ExperimentError};
use iolab_sim::tomlfile::InputError;
use iolab_sim::workloads::netperf::{
    run_stream, StackCosts, StreamConfig, StreamDirection, StreamResult,
};

const EFFECT_IDS: [&str; 6] = [
    "64t.write.throughput",
    "64t.read.throughput",
    "1t.write.throughput",
    "1t.read.throughput",
    "write.latency",
    "read.latency",
];

/// The bundled scenario with short runs (tests stay fast).
fn short_scenario() -> String {
    pseries_ddw::BUNDLED_SCENARIO
        .replace("run_ms = { value = 100,", "run_ms = { value = 12,")
        .replace("warmup_ms = { value = 10,", "warmup_ms = { value = 2,")
}

fn run(text: &str, seed: u64) -> Result<ExperimentReport, ExperimentError> {
    pseries_ddw::run_scenario(text, "test.toml", &ExperimentOptions { runs: 1, seed })
}

fn input_error(text: &str) -> InputError {
    match run(text, 1) {
        Err(ExperimentError::Input(e)) => e,
        other => panic!("expected an input error, got {other:?}"),
    }
}

fn field_of(e: &InputError) -> String {
    match e {
        InputError::Field { field, .. } => field.clone(),
        other => panic!("expected a field error, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Validation
// ---------------------------------------------------------------------------------------------

#[test]
fn a_missing_field_is_named() {
    let text = short_scenario().replace("link_gbps = {", "# link_gbps = {");
    let e = input_error(&text);
    assert_eq!(field_of(&e), "nic.link_gbps", "{e}");
    assert!(ExperimentError::Input(e).is_bad_input());
}

#[test]
fn out_of_range_values_name_the_field_and_the_range() {
    let text = short_scenario().replace("mtu = { value = 1500,", "mtu = { value = 100,");
    let e = input_error(&text);
    assert_eq!(field_of(&e), "nic.mtu.value");
    assert!(e.to_string().contains("576..=9216"), "{e}");
    assert!(e.to_string().contains("test.toml"), "{e}");

    let text = short_scenario().replace("threads = { value = 64,", "threads = { value = 0,");
    assert_eq!(field_of(&input_error(&text)), "workload.threads.value");

    let text = short_scenario().replace(
        "rx_recycle_pct = { value = 90,",
        "rx_recycle_pct = { value = 101,",
    );
    assert_eq!(field_of(&input_error(&text)), "nic.rx_recycle_pct.value");
}

#[test]
fn a_ddw_that_maps_all_memory_is_refused() {
    let text =
        short_scenario().replace("memory_gib = { value = 512,", "memory_gib = { value = 256,");
    let e = input_error(&text);
    assert_eq!(field_of(&e), "partition.ddw_window_gib.value");
    assert!(e.to_string().contains("dynamic"), "{e}");
}

#[test]
fn unknown_fields_wrong_types_and_empty_sources_are_rejected() {
    let text = short_scenario().replace("[nic]\n", "[nic]\nspeed = 3\n");
    assert!(input_error(&text).to_string().contains("speed"));

    let text = short_scenario().replace("mtu = { value = 1500,", "mtu = { value = \"big\",");
    assert_eq!(field_of(&input_error(&text)), "nic.mtu.value");

    let text = short_scenario().replace(
        "irq_ns = { value = 2000, source = \"",
        "irq_ns = { value = 2000, source = \" \", x = \"",
    );
    assert!(input_error(&text).to_string().contains("irq_ns"));

    let start = short_scenario();
    let i = start.find("irq_ns = { value = 2000, source = \"").unwrap();
    let j = start[i..].find("\" }").unwrap();
    let text = format!(
        "{}irq_ns = {{ value = 2000, source = \"\" }}{}",
        &start[..i],
        &start[i + j + 3..]
    );
    assert_eq!(field_of(&input_error(&text)), "stack.irq_ns.source");
}

#[test]
fn the_experiment_name_platform_and_calibration_target_are_checked() {
    let text = short_scenario().replace("experiment = \"pseries-ddw\"", "experiment = \"x\"");
    assert_eq!(field_of(&input_error(&text)), "experiment");
    let text = short_scenario().replace("platform = \"power-lpar\"", "platform = \"nope\"");
    assert_eq!(field_of(&input_error(&text)), "platform");
    let text = short_scenario().replace(
        "calibrated_from = \"1t.write.throughput\"",
        "calibrated_from = \"64t.anything\"",
    );
    assert_eq!(field_of(&input_error(&text)), "calibrated_from");
}

#[test]
fn a_platform_without_hypervisor_is_refused() {
    let text = short_scenario().replace("platform = \"power-lpar\"", "platform = \"rcar-h3\"");
    match run(&text, 1) {
        Err(e) => assert!(e.is_bad_input(), "{e}"),
        Ok(_) => panic!("rcar-h3 has no hypervisor group"),
    }
}

// ---------------------------------------------------------------------------------------------
// Output
// ---------------------------------------------------------------------------------------------

#[test]
fn the_report_prints_the_mails_percent_list_with_lab_values_and_json_has_the_ids() {
    let r = run(&short_scenario(), 3).unwrap();
    // Parse the percent list in the mail's order: metric, published, lab.
    let labels = [
        ("64 thread write throughput:", "+203.0%"),
        ("64 thread read throughput:", "+17.5%"),
        ("1 thread write throughput:", "+20.5%"),
        ("1 thread read throughput:", "+3.43%"),
        ("Average write latency:", "-23.0%"),
        ("Average read latency:", "-2.26%"),
    ];
    for ((label, published), id) in labels.iter().zip(EFFECT_IDS) {
        let line = r
            .report_text
            .lines()
            .find(|l| l.starts_with(label))
            .unwrap_or_else(|| panic!("no line for {label} in\n{}", r.report_text));
        let cols: Vec<&str> = line[label.len()..].split_whitespace().collect();
        assert_eq!(cols[0], *published, "{line}");
        let lab: f64 = cols[1].trim_end_matches('%').parse().unwrap();
        let effect = r.effects.iter().find(|e| e.id == id).unwrap();
        assert!((lab - effect.lab_pct).abs() < 0.006, "{line} vs {effect:?}");
    }
    assert!(r.report_text.contains("(calibration)"));

    let json = serde_json::to_value(&r).unwrap();
    let ids: Vec<&str> = json["effects"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, EFFECT_IDS);
    let figures = json["figures"].as_array().unwrap();
    assert_eq!(figures.len(), 16);
    for f in figures {
        assert!(f["published"].is_null());
        let unit = f["unit"].as_str().unwrap();
        assert!(unit == "Gb/s" || unit == "us", "{f}");
    }
    assert_eq!(
        json["calibrated"][0]["parameter"],
        "hypervisor.tce_put_cycles"
    );
    for f in &r.figures {
        let calibration = f.id.ends_with(".1t.write.throughput");
        assert_eq!(f.role == Role::Calibration, calibration, "{}", f.id);
    }
}

#[test]
fn same_seed_same_report_other_seed_other_numbers() {
    let text = short_scenario();
    let a = run(&text, 11).unwrap();
    let b = run(&text, 11).unwrap();
    assert_eq!(a.report_text, b.report_text);
    assert_eq!(
        serde_json::to_string(&a).unwrap(),
        serde_json::to_string(&b).unwrap()
    );
    let c = run(&text, 12).unwrap();
    assert_ne!(a.figures, c.figures);
}

#[test]
fn no_throughput_exceeds_the_wire() {
    let r = run(&short_scenario(), 5).unwrap();
    // 100 Gb/s, MSS 1448, 90 bytes of headers and framing per packet.
    let goodput = 100.0 * 1448.0 / 1538.0;
    // Every throughput figure is checked, and there are some (a filter on the unit alone
    // would pass vacuously if the unit were renamed).
    let throughputs: Vec<_> = r
        .figures
        .iter()
        .filter(|f| f.id.ends_with(".throughput"))
        .collect();
    assert!(throughputs.len() >= 4, "{:?}", r.figures);
    for f in throughputs {
        assert_eq!(f.unit, "Gb/s", "{}", f.id);
        assert!(
            f.lab > 0.0 && f.lab <= goodput + 1e-6,
            "{} = {}",
            f.id,
            f.lab
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Mechanisms
// ---------------------------------------------------------------------------------------------

fn iommu(ddw: bool) -> (Arc<PseriesIommu>, Device) {
    iommu_with_memory(ddw, 512)
}

/// The partition with `memory_gib` of memory: with 256 GiB or less the 256 GiB DDW maps it
/// all and becomes a direct window.
fn iommu_with_memory(ddw: bool, memory_gib: u64) -> (Arc<PseriesIommu>, Device) {
    let mut cfg = PseriesConfig::new(DomainId(1), memory_gib * SZ_1G);
    cfg.default_window = WindowConfig {
        offset: 0,
        size: 2 * SZ_1G,
        page_shift: 12,
    };
    cfg.ddw = Some(DdwConfig::with_window(256 * SZ_1G, ddw_page::PS_64K));
    cfg.policy = if ddw {
        DdwPolicy::DirectOrDynamic
    } else {
        DdwPolicy::DirectOnly
    };
    let m = PseriesIommu::new(cfg).unwrap();
    let info = m.enable_ddw(&mut WorkRecord::new()).unwrap();
    assert_eq!(info.is_some(), ddw || memory_gib <= 256);
    (Arc::new(m), Device::new(1, 64).unwrap())
}

fn stream(ddw: bool, threads: usize, direction: StreamDirection) -> StreamResult {
    stream_on(iommu(ddw), threads, direction, 65536)
}

fn stream_on(
    (m, dev): (Arc<PseriesIommu>, Device),
    threads: usize,
    direction: StreamDirection,
    tso_max_bytes: u64,
) -> StreamResult {
    let profile = PlatformProfile::bundled("power-lpar").unwrap();
    let costs = StackCosts {
        syscall_ns: 300.0,
        copy_bytes_per_ns: 15.0,
        tx_per_skb_ns: 4000.0,
        tx_completion_ns: 1000.0,
        irq_ns: 2000.0,
        rx_per_packet_ns: 250.0,
        rx_per_skb_ns: 2000.0,
        doorbell_ns: 100.0,
        jitter_pct: 0,
    };
    let link = LinkConfig {
        gbps: 100.0,
        mss: 1448,
        per_packet_overhead: 90,
    };
    let cfg = StreamConfig {
        threads,
        direction,
        message_bytes: 65536,
        tso_max_bytes,
        page_bytes: 65536,
        linear_bytes: 0,
        tx_ring_entries: 1024,
        tx_inflight_bytes: 1 << 20,
        tx_coalescing: Coalescing {
            frames: 32,
            usecs: 16,
        },
        rx_coalescing: Coalescing {
            frames: 32,
            usecs: 8,
        },
        rx_window_messages: 16,
        rx_stride_bytes: 2048,
        rx_ring_pages: 8,
        queues: threads,
        rx_recycle_pct: 90,
        run_ns: 5_000_000,
        warmup_ns: 1_000_000,
    };
    run_stream(
        &cfg,
        &costs,
        link,
        m,
        dev,
        &profile,
        HvSerialisation::PerTable,
        9,
    )
    .unwrap()
}

#[test]
fn a_64k_fragment_takes_16_tces_in_the_default_window_and_1_in_the_ddw() {
    let d = stream(false, 1, StreamDirection::Write);
    let n = stream(true, 1, StreamDirection::Write);
    // One fragment per 64 KiB message: one map (one call) and one clear (one call).
    // (Buffers still in flight at the end are mapped but not yet unmapped.)
    assert_eq!(d.dma.hypercalls, d.dma.maps + d.dma.unmaps);
    assert_eq!(n.dma.hypercalls, n.dma.maps + n.dma.unmaps);
    // 16 TCEs built + 16 cleared per buffer, vs 1 + 1.
    assert_eq!(d.dma.tces, 16 * (d.dma.maps + d.dma.unmaps));
    assert_eq!(n.dma.tces, n.dma.maps + n.dma.unmaps);
    // A 16-page request is over the 15-page threshold: the single large pool's lock.
    assert_eq!(d.dma.pool_locks[0], 0);
    assert!(d.dma.pool_locks[1] >= 2 * d.dma.unmaps);
    assert_eq!(n.dma.pool_locks[1], 0);
    // Fewer TCEs per send: the single thread writes faster through the DDW.
    assert!(
        n.throughput_gbps > d.throughput_gbps * 1.1,
        "{n:?} vs {d:?}"
    );
    assert!(n.mean_latency_us < d.mean_latency_us);
}

#[test]
fn one_thread_never_waits_for_a_lock() {
    let d = stream(false, 1, StreamDirection::Write);
    assert_eq!(d.spin_pct, 0.0);
    assert!(d.locks.iter().all(|l| l.contended == 0), "{:?}", d.locks);
}

#[test]
fn many_threads_contend_on_the_hypervisor_table_far_more_in_the_default_window() {
    let d = stream(false, 16, StreamDirection::Write);
    let n = stream(true, 16, StreamDirection::Write);
    let waits = |r: &StreamResult| {
        r.locks
            .iter()
            .find(|l| l.name == "phyp_tce_table")
            .unwrap()
            .wait_total_ns
    };
    assert!(waits(&d) > 3 * waits(&n), "{} vs {}", waits(&d), waits(&n));
    assert!(d.spin_pct > n.spin_pct);
}

#[test]
fn reads_map_far_less_than_writes() {
    let w = stream(false, 1, StreamDirection::Write);
    let r = stream(false, 1, StreamDirection::Read);
    let per_gb = |x: &StreamResult| x.dma.maps as f64 / x.dma.device_bytes as f64 * 1e9;
    // Receive pages are recycled by the page cache; only 1 in 10 is remapped.
    assert!(
        per_gb(&r) * 5.0 < per_gb(&w),
        "{} vs {}",
        per_gb(&r),
        per_gb(&w)
    );
}

#[test]
fn every_configuration_is_a_measurement_with_its_attributes_and_metrics() {
    let r = run(&short_scenario(), 7).unwrap();
    assert_eq!(r.measurements.len(), 8);
    let mut configs: Vec<&str> = r.measurements.iter().map(|m| m.config.as_str()).collect();
    configs.sort_unstable();
    configs.dedup();
    assert_eq!(configs.len(), 8, "configuration ids are unique");
    for m in &r.measurements {
        for key in ["iommu_mode", "window", "threads", "workload"] {
            assert!(m.attrs.contains_key(key), "{} lacks {key}", m.config);
        }
        let mbps = m.get("netperf.throughput_mbps").unwrap().value;
        // The wire's goodput bounds every configuration (100 Gb/s line rate).
        assert!(mbps > 0.0 && mbps <= 100_000.0, "{}: {mbps}", m.config);
        assert!(m.get("netperf.latency_us").unwrap().value > 0.0);
        let cpu = m.cpu.expect("a CPU breakdown");
        assert!(cpu.system_ns + cpu.user_ns > 0);
    }
    // A 65160-byte skb spans two 64 KiB fragment pages: about 17 TCEs built (and as many
    // cleared) in the default window, 2 in the DDW.
    let tces = |c: &str| {
        r.measurements
            .iter()
            .find(|m| m.config == c)
            .and_then(|m| m.get("tce.tces_per_msg"))
            .unwrap()
            .value
    };
    assert!(tces("1t.write.default") > 6.0 * tces("1t.write.ddw"));
}

#[test]
fn skbs_of_the_tcp_size_goal_straddle_fragment_pages() {
    // 45 x 1448 = 65160-byte skbs cut from the stream: most span two 64 KiB pages, so two
    // fragment maps per skb, each under 16 TCEs (mostly from the CPU's small pool).
    let d = stream_on(iommu(false), 1, StreamDirection::Write, 65160);
    let n = stream_on(iommu(true), 1, StreamDirection::Write, 65160);
    let skbs = d.dma.device_bytes / 65160;
    assert!(d.dma.maps as f64 > 1.9 * skbs as f64, "{:?}", d.dma);
    assert!(d.dma.pool_locks[0] > d.dma.pool_locks[1], "{:?}", d.dma);
    // 64 KiB TCEs: a fragment takes one or two.
    assert!(n.dma.tces <= 2 * (n.dma.maps + n.dma.unmaps), "{:?}", n.dma);
    assert!(d.dma.tces > 7 * n.dma.tces, "{:?} vs {:?}", d.dma, n.dma);
    // Every message still completes once: the stream's bytes and the messages agree.
    let msgs = d.messages as f64;
    assert!(msgs > 0.0);
}

#[test]
fn a_direct_ddw_maps_by_offset_with_no_hypercalls_and_counts_bypassed_accesses() {
    let (m, dev) = iommu_with_memory(false, 128);
    assert_eq!(
        m.ddw().map(|i| i.mode),
        Some(iolab_iommu::hw::pseries::DdwMode::Direct)
    );
    let direct = stream_on((m.clone(), dev), 4, StreamDirection::Write, 65160);
    assert_eq!(direct.dma.hypercalls, 0);
    assert_eq!(direct.dma.direct_maps, direct.dma.maps);
    assert!(direct.dma.maps > 0);
    assert_eq!(direct.dma.window_peak_pct(), 0.0, "no window to fill");
    assert!(m.protection().bypass_accesses > 0);
    // The dynamic window translates every access: nothing bypassed.
    let (w, wdev) = iommu(true);
    let dynamic = stream_on((w.clone(), wdev), 4, StreamDirection::Write, 65160);
    assert!(dynamic.dma.hypercalls > 0);
    assert_eq!(w.protection().bypass_accesses, 0);
    assert!(direct.busy_pct < dynamic.busy_pct);
}

#[test]
fn window_occupancy_counts_live_mappings() {
    // 64 queues x 8 receive pages of 16 TCEs are mapped before the run, all in the
    // large pool (16 > 15 entries); transmit fragments come and go on top.
    let d = stream_on(iommu(false), 4, StreamDirection::Write, 65536);
    let rx_tces = 4 * 8 * 16;
    assert!(d.dma.peak_live_tces[1] >= rx_tces, "{:?}", d.dma);
    assert!(d.dma.peak_live_tces[0] >= d.dma.peak_live_tces[1]);
    let entries = d.dma.window_tces[0] + d.dma.window_tces[1];
    assert!((524_288 - 16..=524_288).contains(&entries), "{entries}");
    assert!(d.dma.window_peak_pct() > 0.0 && d.dma.window_peak_pct() < 5.0);
}

#[test]
fn measurements_carry_the_protection_metrics_and_window_occupancy() {
    let r = run(&short_scenario(), 7).unwrap();
    for m in &r.measurements {
        for k in [
            "protection.stale_hits",
            "protection.bypass_accesses",
            "faults.translation",
            "tce.window_peak_pct",
        ] {
            assert!(m.get(k).is_some(), "{} lacks {k}", m.config);
        }
        // Both windows translate every access and clear TCEs synchronously.
        assert_eq!(m.get("protection.bypass_accesses").unwrap().value, 0.0);
        assert_eq!(m.get("protection.stale_hits").unwrap().value, 0.0);
        assert_eq!(m.get("faults.translation").unwrap().value, 0.0);
    }
    let peak = |c: &str| {
        r.measurements
            .iter()
            .find(|m| m.config.ends_with(c))
            .and_then(|m| m.get("tce.window_peak_pct"))
            .unwrap()
            .value
    };
    assert!(peak("write.default") > 10.0 * peak("write.ddw"));
}
