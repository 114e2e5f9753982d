//! The direct-DMA NIC path on x86: a netperf scenario on VT-d or AMD-Vi (or no IOMMU) runs
//! an iperf-like receive test (or, with `direction = "write"`, a send test) whose NIC DMAs
//! translate through the unit's IOTLB and paging-structure caches and are timed by the DMA
//! port. Misses per 4 KiB rise with flows in strict mode, are zero without an IOMMU, and
//! strict costs throughput on receive and CPU on send; bad input is refused with the field
//! named.

use iolab_sim::lab::{self, LabOptions, LabRun};

/// An iperf-like receive of `flows` flows on a 100 Gb/s NIC behind `model` in `mode`.
fn rx(model: &str, mode: &str, flows: usize, extra_device: &str) -> String {
    let platform = if model == "amd-vi" {
        "amd-epyc-genoa-2s"
    } else {
        "intel-cascadelake-4s"
    };
    format!(
        r#"
name = "rx-{model}-{mode}-{flows}"
seed = 1
[machine]
platform = "{platform}"
cpus = 32
memory_gib = 384
[iommu]
model = "{model}"
mode = "{mode}"
[[device]]
kind = "nic"
link_gbps = 100
mtu = 4000
rx_ring_pages = 256
tx_ring_entries = 256
rx_stride_bytes = 4096
rx_page_cache_pages = 0
rx_coalesce_usecs = 64
rx_coalesce_frames = 64
{extra_device}
[workload]
kind = "netperf"
direction = "read"
threads = {flows}
run_ms = 6
warmup_ms = 2
page_bytes = 4096
"#
    )
}

fn run(text: &str) -> LabRun {
    lab::run_scenario(text, "rx.toml", &LabOptions::default()).expect("scenario runs")
}

fn metric(r: &LabRun, name: &str) -> f64 {
    r.report.measurements[0]
        .get(name)
        .unwrap_or_else(|| panic!("metric {name} missing"))
        .value
}

fn refused(text: &str) -> String {
    match lab::run_scenario(text, "rx.toml", &LabOptions::default()) {
        Ok(_) => panic!("expected the scenario to be refused:\n{text}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn vtd_strict_misses_per_4k_rise_with_flows_and_are_zero_without_an_iommu() {
    let misses: Vec<f64> = [5, 20, 40]
        .iter()
        .map(|&f| metric(&run(&rx("vtd", "strict", f, "")), "iotlb.misses_per_4k"))
        .collect();
    // At least one miss per 4 KiB: every buffer page is fresh (strict unmaps each used one).
    assert!(misses[0] >= 1.0, "{misses:?}");
    assert!(
        misses[0] < misses[1] && misses[1] < misses[2],
        "misses per 4 KiB should rise with flows: {misses:?}"
    );
    let reads: Vec<f64> = [5, 40]
        .iter()
        .map(|&f| metric(&run(&rx("vtd", "strict", f, "")), "iotlb.walk_reads_per_4k"))
        .collect();
    assert!(reads[0] < reads[1], "{reads:?}");
    for f in [5, 40] {
        let off = run(&rx("none", "off", f, ""));
        assert_eq!(metric(&off, "iotlb.misses_per_4k"), 0.0);
        assert_eq!(metric(&off, "iotlb.walk_reads_per_4k"), 0.0);
        assert!(metric(&off, "net.packets") > 1000.0);
    }
    // Passthrough translates nothing either.
    let pt = run(&rx("vtd", "passthrough", 5, ""));
    assert_eq!(metric(&pt, "iotlb.misses",), 0.0);
}

#[test]
fn strict_costs_throughput_lazy_less_and_off_fills_the_wire() {
    let gbps =
        |model: &str, mode: &str| metric(&run(&rx(model, mode, 10, "")), "net.throughput_gbps");
    let off = gbps("none", "off");
    let strict = gbps("vtd", "strict");
    let lazy = gbps("vtd", "lazy");
    // 4000-byte frames of 3948 bytes of payload at 100 Gb/s (4000 + 38 bytes on the wire).
    let wire = 100.0 * 3948.0 / 4038.0;
    assert!((off - wire).abs() < 0.5, "off {off} vs wire {wire}");
    assert!(strict < off * 0.9, "strict {strict} off {off}");
    assert!(lazy > strict, "lazy {lazy} strict {strict}");
    // Strict invalidates every used page; lazy batches through the flush queue.
    let s = run(&rx("vtd", "strict", 10, ""));
    let l = run(&rx("vtd", "lazy", 10, ""));
    assert!(metric(&s, "dma.inval_syncs") > 10.0 * metric(&l, "dma.inval_syncs").max(1.0));
    // AMD-Vi runs the same path.
    let a = run(&rx("amd-vi", "strict", 10, ""));
    assert!(metric(&a, "iotlb.misses_per_4k") >= 1.0);
}

#[test]
fn the_dma_cost_per_4k_bounds_throughput_without_an_iommu() {
    // 1000 ns per 4 KiB: the DMA engine, not the wire, is the limit (4014 bytes a packet).
    let r = run(&rx("none", "off", 5, "dma_ns_per_4k = 1000"));
    let bound = 3948.0 * 8.0 / (1000.0 * 4014.0 / 4096.0);
    let got = metric(&r, "net.throughput_gbps");
    assert!((got - bound).abs() / bound < 0.02, "{got} vs {bound}");
    assert!(metric(&r, "dma.engine_busy_pct") > 99.0);
}

#[test]
fn direct_rx_input_errors_name_the_field() {
    let e = refused(
        &rx("vtd", "strict", 5, "").replace("direction = \"read\"", "direction = \"sideways\""),
    );
    assert!(e.contains("workload.direction"), "{e}");
    let e = refused(&rx("vtd", "strict", 5, "dma_outstanding_pages = 0"));
    assert!(e.contains("device[0].dma_outstanding_pages"), "{e}");
    let e = refused(&rx("vtd", "strict", 5, "relaxed_ordering = \"yes\""));
    assert!(e.contains("relaxed_ordering"), "{e}");
    let e = refused(&rx("vtd", "strict", 5, "").replace("mtu = 4000", "mtu = 9000"));
    assert!(
        e.contains("device[0].mtu") && e.contains("at most 4082"),
        "{e}"
    );
    let e = refused(&rx("vtd", "strict", 5, "dma_ns_per_4k = -1"));
    assert!(e.contains("device[0].dma_ns_per_4k"), "{e}");
    let e =
        refused(&rx("smmuv3", "strict", 5, "").replace("intel-cascadelake-4s", "hisilicon-d05"));
    assert!(e.contains("iommu.model") && e.contains("direct-DMA"), "{e}");
    // The POWER TCE path refuses the direct path's fields.
    let power = "[machine]\nplatform = \"power-lpar\"\ncpus = 16\nmemory_gib = 128\n[iommu]\nmodel = \"pseries\"\nmode = \"default-window\"\n[[device]]\nkind = \"nic\"\nqueues = 16\nrx_fifo_bytes = 65536\n[workload]\nkind = \"netperf\"\nrun_ms = 20\n";
    let e = refused(power);
    assert!(
        e.contains("device[0].rx_fifo_bytes") && e.contains("POWER TCE path"),
        "{e}"
    );
    let e = refused(
        &power
            .replace("rx_fifo_bytes = 65536\n", "")
            .replace("run_ms = 20", "run_ms = 20\nack_ns = 1"),
    );
    assert!(e.contains("workload.ack_ns"), "{e}");
    for (field, line) in [
        (
            "device[0].rx_page_cache_pages",
            "rx_page_cache_pages = 16\n",
        ),
        ("device[0].rx_adaptive", "rx_adaptive = true\n"),
        ("workload.flow_cpus", ""),
    ] {
        let text = power.replace("rx_fifo_bytes = 65536\n", line);
        let text = if line.is_empty() {
            text.replace("run_ms = 20", "run_ms = 20\nflow_cpus = 4")
        } else {
            text
        };
        let e = refused(&text);
        assert!(e.contains(field) && e.contains("POWER TCE path"), "{e}");
    }
    // The direct path recycles through the page cache, not the POWER NIC's share, and its
    // flows run on at most the machine's cores.
    let e = refused(
        &rx("vtd", "strict", 5, "").replace("rx_page_cache_pages = 0", "rx_recycle_pct = 90"),
    );
    assert!(
        e.contains("device[0].rx_recycle_pct") && e.contains("rx_page_cache_pages"),
        "{e}"
    );
    let e =
        refused(&rx("vtd", "strict", 5, "").replace("threads = 5", "threads = 5\nflow_cpus = 33"));
    assert!(
        e.contains("workload.flow_cpus") && e.contains("at most machine.cpus"),
        "{e}"
    );
}

/// The receive counters of mlx5's page cache (`ethtool -S` names) and the driver's unmaps.
fn cache(r: &LabRun) -> [f64; 5] {
    [
        "net.rx_cache_reuse",
        "net.rx_cache_busy",
        "net.rx_cache_empty",
        "net.rx_cache_full",
        "dma.inval_syncs",
    ]
    .map(|m| metric(r, m))
}

/// ACKs sent in the measured window (4014-byte frames).
fn acks_of(r: &LabRun) -> f64 {
    metric(r, "net.acks_per_4k") * metric(r, "net.packets") * 4014.0 / 4096.0
}

#[test]
fn the_page_cache_gives_pages_back_once_read_and_out_of_order_data_holds_its_head() {
    let with_cache =
        |extra: &str| rx("vtd", "strict", 40, extra).replace("rx_page_cache_pages = 0\n", "");
    // Lossless: every page's data is read after the poll that took it, so the ring is
    // refilled from the cache's head and no used page is unmapped; the unmaps left are the
    // ACK buffers', one per ACK.
    let lossless = run(&with_cache(""));
    let [reuse, busy, empty, full, inval] = cache(&lossless);
    // A refill finds its own poll's pages at the head only while the cache holds less
    // than that poll's worth: then it maps fresh pages, which the cache keeps (it grows);
    // none is unmapped.
    assert!(reuse > 0.0 && busy < reuse, "{busy} busy, {reuse} reused");
    assert_eq!((empty, full), (0.0, 0.0));
    let acks = acks_of(&lossless);
    assert!(
        (inval - acks).abs() <= 0.05 * acks + 50.0,
        "{inval} invalidations for about {acks} ACKs"
    );
    // Pause frames off, the forty flows on five cores (eight per queue): a drop leaves the
    // flow's later segments out of order; their pages stay held until the hole is filled,
    // the cache's head is busy, the ring takes fresh pages and the cache, full, unmaps the
    // pages given to it.
    let lossy =
        run(&with_cache("pause_frames = false")
            .replace("threads = 40", "threads = 40\nflow_cpus = 5"));
    let [reuse, busy, _, full, inval_lossy] = cache(&lossy);
    assert!(metric(&lossy, "net.drops") > 0.0);
    assert!(
        reuse > 0.0 && busy > 0.0 && full > 0.0,
        "{reuse} {busy} {full}"
    );
    let acks = acks_of(&lossy);
    assert!(
        (inval_lossy - acks - full).abs() <= 0.05 * (acks + full) + 50.0,
        "{inval_lossy} invalidations for about {acks} ACKs and {full} pages"
    );
    // No cache: every used page is unmapped and the ring refilled with fresh pages.
    let none = run(&rx("vtd", "strict", 40, ""));
    let [reuse, busy, empty, full, _] = cache(&none);
    assert_eq!((reuse, busy), (0.0, 0.0));
    assert!(empty > 0.0 && full > 0.0, "{empty} {full}");
    assert!(
        (empty - full).abs() <= 0.02 * full + 70.0,
        "each page unmapped ({full}) is replaced ({empty})"
    );
}

#[test]
fn dim_chooses_each_queue_s_moderation_unless_the_scenario_fixes_it() {
    let fixed = run(&rx("vtd", "strict", 8, ""));
    assert_eq!(metric(&fixed, "net.rx_usecs_per_interrupt"), 64.0);
    // Neither rx_coalesce field: mlx5's default, DIM, which starts at 8 us and steps
    // through its CQE profiles (2 to 64 us).
    let adaptive_text = rx("vtd", "strict", 8, "")
        .replace("rx_coalesce_usecs = 64\n", "")
        .replace("rx_coalesce_frames = 64\n", "");
    let adaptive = run(&adaptive_text);
    let usecs = metric(&adaptive, "net.rx_usecs_per_interrupt");
    assert!((2.0..=64.0).contains(&usecs), "{usecs} us");
    assert!(usecs != 8.0, "DIM left its starting profile: {usecs} us");
    assert_eq!(
        run(&adaptive_text.replace("kind = \"nic\"", "kind = \"nic\"\nrx_adaptive = true"))
            .report
            .measurements,
        adaptive.report.measurements
    );
    // Fixed moderation stated with DIM on is a contradiction.
    let e = refused(&rx("vtd", "strict", 8, "rx_adaptive = true"));
    assert!(
        e.contains("device[0].rx_adaptive") && e.contains("rx_coalesce_usecs"),
        "{e}"
    );
}

#[test]
fn flows_beyond_their_cores_share_a_queue_and_its_polls() {
    // Eight flows without an IOMMU, wire-bound either way: on eight cores each flow has its
    // queue and poll; on four cores two flows share each queue, so each core does the work
    // of two and the polls take more completions.
    let spread = run(&rx("none", "off", 8, ""));
    let shared =
        run(&rx("none", "off", 8, "").replace("threads = 8", "threads = 8\nflow_cpus = 4"));
    let gbps = |r: &LabRun| metric(r, "net.throughput_gbps");
    assert!((gbps(&spread) - gbps(&shared)).abs() / gbps(&spread) < 0.05);
    let busy = |r: &LabRun| metric(r, "cpu.busy_pct");
    assert!(
        busy(&shared) > 1.6 * busy(&spread),
        "{} vs {} % busy",
        busy(&shared),
        busy(&spread)
    );
    let per_poll = |r: &LabRun| metric(r, "net.packets_per_poll");
    assert!(
        per_poll(&shared) > per_poll(&spread),
        "{} vs {} packets per poll",
        per_poll(&shared),
        per_poll(&spread)
    );
}

#[test]
fn a_direct_rx_run_is_a_pure_function_of_its_scenario() {
    let a = run(&rx("vtd", "strict", 8, ""));
    let b = run(&rx("vtd", "strict", 8, ""));
    assert_eq!(a.report.measurements, b.report.measurements);
}

/// The send test on the same NIC (`direction = "write"`): TSO skbs mapped per 4 KiB
/// fragment, the NIC's reads through the DMA port, completions unmapping every fragment.
fn tx(model: &str, mode: &str) -> String {
    rx(model, mode, 8, "")
        .replace("direction = \"read\"", "direction = \"write\"")
        .replace("mtu = 4000", "mtu = 1500")
        .replace("rx_stride_bytes = 4096", "rx_stride_bytes = 2048")
}

#[test]
fn sending_maps_every_fragment_and_strict_pays_for_each_unmap_in_cpu() {
    let off = run(&tx("none", "off"));
    let strict = run(&tx("vtd", "strict"));
    let lazy = run(&tx("vtd", "lazy"));
    // 45 MSS of 1448 bytes per TSO skb in 16 fragments of 4 KiB: about one map per 4 KiB.
    for r in [&off, &strict, &lazy] {
        let maps = metric(r, "dma.maps_per_4k");
        assert!((0.95..1.1).contains(&maps), "{maps} maps per 4 KiB");
    }
    // Every fragment's fresh IOVA misses the IOTLB; without an IOMMU nothing does.
    assert_eq!(metric(&off, "iotlb.misses_per_4k"), 0.0);
    assert!(metric(&strict, "iotlb.misses_per_4k") >= 1.0);
    // Strict: one invalidation and wait per unmapped fragment, which costs CPU; lazy
    // batches them into the flush queues' few syncs.
    let (ss, ls) = (
        metric(&strict, "dma.inval_syncs"),
        metric(&lazy, "dma.inval_syncs"),
    );
    assert!(ss > 100.0 * ls.max(1.0), "strict {ss} syncs, lazy {ls}");
    let cpu = |r: &LabRun| metric(r, "cpu.busy_pct");
    assert!(
        cpu(&strict) > 1.3 * cpu(&lazy) && cpu(&lazy) > cpu(&off),
        "CPU strict {} lazy {} off {}",
        cpu(&strict),
        cpu(&lazy),
        cpu(&off)
    );
    // The reads' walks overlap on the unit's walkers and the wire stays the bound.
    let g = |r: &LabRun| metric(r, "net.throughput_gbps");
    assert!(g(&strict) > 0.95 * g(&off), "{} vs {}", g(&strict), g(&off));
}

#[test]
fn two_frames_share_a_receive_page_at_mtu_1500() {
    // MTU 1500 in 2 KiB fragments: one page mapped per two packets; at MTU 4000 in 4 KiB
    // strides, one per packet. Strict unmaps each used page, so the invalidations count
    // the pages the driver released.
    let small = rx("vtd", "strict", 5, "")
        .replace("mtu = 4000", "mtu = 1500")
        .replace("rx_stride_bytes = 4096", "rx_stride_bytes = 2048");
    let (a, b) = (run(&small), run(&rx("vtd", "strict", 5, "")));
    let per_packet = |r: &LabRun| metric(r, "dma.inval_syncs") / metric(r, "net.packets");
    let (pa, pb) = (per_packet(&a), per_packet(&b));
    assert!(
        pa < 0.75 * pb,
        "{pa} syncs per packet at MTU 1500 vs {pb} at MTU 4000"
    );
}

#[test]
fn a_named_nic_sets_the_port_and_the_host_link() {
    // A ConnectX-7 at 200 Gb/s on PCIe 5.0 x16: without an IOMMU the wire, not the DMA
    // engine, is the bound (the default PCIe 3.0 figure would cap it near 128 Gb/s).
    let text = rx("none", "off", 8, "model = \"connectx-7-200g\"")
        .replace("link_gbps = 100\n", "")
        .replace("mtu = 4000", "mtu = 1500")
        .replace("rx_stride_bytes = 4096", "rx_stride_bytes = 2048");
    let r = run(&text);
    let g = metric(&r, "net.throughput_gbps");
    assert!(g > 180.0, "{g} Gb/s");
    let e = refused(&rx("none", "off", 8, "model = \"connectx-99\""));
    assert!(
        e.contains("device[0].model") && e.contains("connectx-7-400g"),
        "{e}"
    );
}

/// Pause frames off (`device.pause_frames = false`, as F&S's runs): a packet that finds
/// the FIFO full is dropped and each flow runs TCP's loss recovery.
#[test]
fn without_pause_frames_a_slow_nic_drops_and_tcp_recovers_with_more_acks() {
    let lossy = "pause_frames = false";
    // Without an IOMMU the NIC keeps up: nothing drops, the wire is full either way.
    let off_lossless = run(&rx("none", "off", 40, ""));
    let off_lossy = run(&rx("none", "off", 40, lossy));
    assert_eq!(metric(&off_lossy, "net.drops"), 0.0);
    assert_eq!(metric(&off_lossy, "net.retransmits"), 0.0);
    let (a, b) = (
        metric(&off_lossless, "net.throughput_gbps"),
        metric(&off_lossy, "net.throughput_gbps"),
    );
    assert!((a - b).abs() / a < 0.02, "pause on {a} vs off {b} Gb/s");
    // Strict VT-d at 40 flows: the NIC falls behind the wire; with pause frames on the
    // sender waits and nothing is lost, with them off packets drop, the flows resend
    // them, and the out-of-order arrivals are acknowledged one by one.
    // The driver's page cache (the lab's default, mlx5's 256 slots) gives most pages back
    // still mapped: with every page unmapped, each invalidation would empty the unit's
    // paging-structure caches and the walks alone would hold the NIC far below the wire.
    let strict =
        |extra: &str| rx("vtd", "strict", 40, extra).replace("rx_page_cache_pages = 0\n", "");
    let strict_lossless = run(&strict(""));
    let strict_lossy = run(&strict(lossy));
    assert_eq!(metric(&strict_lossless, "net.drops"), 0.0);
    let drops = metric(&strict_lossy, "net.drops");
    let resent = metric(&strict_lossy, "net.retransmits");
    let drop_pct = metric(&strict_lossy, "net.drop_pct");
    assert!(
        drops > 0.0 && resent > 0.0,
        "drops {drops}, retransmits {resent}"
    );
    assert!(drop_pct > 0.0 && drop_pct < 50.0, "{drop_pct}% dropped");
    // Out-of-order arrivals are acknowledged at once, but GRO merges a run of them that
    // follow each other in sequence into one skb: one ACK (its SACK block covering the run)
    // per run, so fewer immediate ACKs than out-of-order arrivals; none without drops.
    let out_of_order = metric(&strict_lossy, "net.out_of_order");
    let immediate = metric(&strict_lossy, "net.immediate_acks");
    assert!(
        out_of_order > 0.0 && immediate > 0.0 && immediate < out_of_order,
        "{immediate} immediate ACKs for {out_of_order} out-of-order arrivals"
    );
    assert_eq!(metric(&strict_lossless, "net.immediate_acks"), 0.0);
    // TCP keeps the pipe full: strict still moves most of what it could.
    let t = metric(&strict_lossy, "net.throughput_gbps");
    assert!(
        t > 0.3 * b && t < b,
        "{t} Gb/s against {b} without an IOMMU"
    );
    // The lossy run is a pure function of its scenario too.
    let again = run(&strict(lossy));
    assert_eq!(strict_lossy.report.measurements, again.report.measurements);
}

#[test]
fn tcp_fields_need_pause_frames_off_and_the_receive_test() {
    let e = refused(&rx("vtd", "strict", 5, "").replace(
        "page_bytes = 4096",
        "page_bytes = 4096\ntcp_ack_delay_us = 5",
    ));
    assert!(
        e.contains("workload.tcp_ack_delay_us") && e.contains("pause_frames = false"),
        "{e}"
    );
    let lossy_with = |line: &str| {
        rx("vtd", "strict", 5, "pause_frames = false")
            .replace("page_bytes = 4096", &format!("page_bytes = 4096\n{line}"))
    };
    let e = refused(&lossy_with("tcp_rwnd_bytes = 100"));
    assert!(
        e.contains("workload.tcp_rwnd_bytes") && e.contains("at least one segment"),
        "{e}"
    );
    let e = refused(&lossy_with("tcp_init_cwnd = 0"));
    assert!(e.contains("workload.tcp_init_cwnd"), "{e}");
    let e = refused(&tx("vtd", "strict").replace(
        "rx_coalesce_frames = 64",
        "rx_coalesce_frames = 64\npause_frames = false",
    ));
    assert!(
        e.contains("device[0].pause_frames") && e.contains("receive test"),
        "{e}"
    );
    // The POWER TCE path refuses the NIC's pause frames like its other direct-path fields.
    let power = "[machine]\nplatform = \"power-lpar\"\ncpus = 16\nmemory_gib = 128\n[iommu]\nmodel = \"pseries\"\nmode = \"default-window\"\n[[device]]\nkind = \"nic\"\nqueues = 16\npause_frames = false\n[workload]\nkind = \"netperf\"\nrun_ms = 20\n";
    let e = refused(power);
    assert!(e.contains("device[0].pause_frames"), "{e}");
}

#[test]
fn a_napi_poll_takes_at_most_its_budget_and_moderation_sets_the_batch() {
    // 5 flows at the wire's 97 Gb/s: a packet per ~1.7 us per flow, so the 64 us
    // moderation gathers more than the 64-completion budget and polls run full.
    let few = run(&rx("none", "off", 5, ""));
    // 40 flows: a packet per ~13 us per flow; the moderation timer fires on ~5.
    let many = run(&rx("none", "off", 40, ""));
    for r in [&few, &many] {
        let max = metric(r, "net.max_packets_per_poll");
        assert!(max > 0.0 && max <= 64.0, "{max} completions in one poll");
    }
    let (a, b) = (
        metric(&few, "net.packets_per_poll"),
        metric(&many, "net.packets_per_poll"),
    );
    assert!(a > 32.0 && b < 10.0, "{a} and {b} completions per poll");
    // Batches amortise the interrupt and the GRO skb: the CPUs keep up with room to spare.
    let cpu = metric(&few, "cpu.busy_pct");
    assert!(cpu < 90.0, "{cpu}% busy");
}

#[test]
fn the_vtd_nonleaf_invalidation_scope_is_a_named_choice() {
    let with = |v: &str| {
        rx("vtd", "strict", 5, "").replace(
            "mode = \"strict\"",
            &format!("mode = \"strict\"\nvtd_nonleaf_psi = \"{v}\""),
        )
    };
    let e = refused(&with("page"));
    assert!(
        e.contains("iommu.vtd_nonleaf_psi") && e.contains("\"domain\" or \"range\""),
        "{e}"
    );
    // Every unmap empties the domain's paging-structure caches (the default, Intel's IIO),
    // or only the entries over its page: the first costs more page-table reads per miss.
    let domain = run(&with("domain"));
    let range = run(&with("range"));
    let per_miss =
        |r: &LabRun| metric(r, "iotlb.walk_reads_per_4k") / metric(r, "iotlb.misses_per_4k");
    assert_eq!(
        domain.report.measurements,
        run(&rx("vtd", "strict", 5, "")).report.measurements
    );
    assert!(
        per_miss(&domain) > per_miss(&range),
        "{} vs {} reads per miss",
        per_miss(&domain),
        per_miss(&range)
    );
}
