//! The kernel's DMA-mapping benchmark as a lab workload (issue 17, item 4): its output
//! format, what it measures across modes and thread counts, and its input checks.

mod common;
use common::{metric, run};

use iolab_sim::lab::{self, LabError, LabOptions};
use iolab_sim::tomlfile::InputError;

fn scenario(mode: &str, workload: &str) -> String {
    format!(
        r#"
name = "map-bench"
seed = 1
[machine]
platform = "hisilicon-d06"
cpus = 8
[iommu]
model = "smmuv3"
mode = "{mode}"
[[device]]
kind = "nvme"
[workload]
kind = "dma_map_benchmark"
runtime_ms = 5
{workload}
"#
    )
}

#[test]
fn it_prints_the_tools_three_lines() {
    let r = run(&scenario(
        "strict",
        "threads = 8\ngranule = 8\ndir = \"from_device\"",
    ));
    let lines: Vec<&str> = r.report.report_text.lines().collect();
    assert_eq!(
        lines[0],
        "dma mapping benchmark: threads:8 seconds:0.005 node:-1 dir:FROM_DEVICE granule: 8"
    );
    assert!(
        lines[1].starts_with("average map latency(us):"),
        "{}",
        lines[1]
    );
    assert!(lines[1].contains(" standard deviation:"), "{}", lines[1]);
    assert!(
        lines[2].starts_with("average unmap latency(us):"),
        "{}",
        lines[2]
    );
    // The printed figure is the module's integer mean in 100 ns units, over 10.
    let printed: f64 = lines[2]["average unmap latency(us):".len()..]
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(printed, metric(&r, "map_benchmark.unmap_us"));
    let exact = metric(&r, "map_benchmark.unmap_mean_ns");
    // Each sample loses its part of 100 ns and the mean its fraction of a unit: the printed
    // figure is below the exact mean by less than 0.2 us, never above it.
    let lost = exact / 1000.0 - printed;
    assert!((0.0..0.2).contains(&lost), "{exact} ns vs {printed} us");
    assert!(metric(&r, "map_benchmark.loops") > 100.0);
}

#[test]
fn strict_unmaps_wait_for_the_command_queue_and_contend_with_more_threads() {
    let unmap = |mode: &str, threads: u32| {
        let r = run(&scenario(
            mode,
            &format!("threads = {threads}\ngranule = 8"),
        ));
        metric(&r, "map_benchmark.unmap_mean_ns")
    };
    let (strict1, strict8) = (unmap("strict", 1), unmap("strict", 8));
    let (lazy8, pt8) = (unmap("lazy", 8), unmap("passthrough", 8));
    // Strict waits for a TLBI per page and a CMD_SYNC; lazy queues the IOVA; passthrough
    // does nothing but its bookkeeping.
    assert!(
        strict1 > 2.0 * lazy8,
        "strict {strict1} ns, lazy {lazy8} ns"
    );
    assert!(lazy8 >= pt8, "lazy {lazy8} ns, passthrough {pt8} ns");
    // Eight threads share one command queue and its lines: an unmap never gets faster.
    assert!(
        strict8 > strict1,
        "1 thread {strict1} ns, 8 threads {strict8} ns"
    );
}

#[test]
fn from_device_skips_the_memset() {
    let loops = |dir: &str| {
        let r = run(&scenario(
            "passthrough",
            &format!("granule = 64\ndir = \"{dir}\""),
        ));
        metric(&r, "map_benchmark.loops")
    };
    assert!(loops("from_device") > loops("bidirectional"));
}

#[test]
fn bad_parameters_are_refused_naming_the_field() {
    for (workload, field) in [
        ("granule = 0", "workload.granule"),
        ("granule = 1025", "workload.granule"),
        ("threads = 9", "workload.threads"),
        ("dir = \"sideways\"", "workload.dir"),
        ("node = 1", "workload.node"),
        ("dma_trans_ns = 20000000", "workload.dma_trans_ns"),
    ] {
        match lab::run_scenario(
            &scenario("strict", workload),
            "bad.toml",
            &LabOptions::default(),
        ) {
            Err(e @ LabError::Input(InputError::Field { .. })) => {
                assert!(e.is_bad_input());
                let LabError::Input(InputError::Field { field: f, .. }) = e else {
                    unreachable!()
                };
                assert_eq!(f, field, "{workload}");
            }
            other => panic!("{workload}: expected a field error, got {:?}", other.err()),
        }
    }
}

#[test]
fn on_vtd_the_strict_unmaps_go_through_the_timed_invalidation_queue() {
    let text = r#"
name = "map-bench-vtd"
seed = 1
[machine]
platform = "intel-icelake-2s"
cpus = 4
[iommu]
model = "vtd"
mode = "strict"
[[device]]
kind = "nvme"
[workload]
kind = "dma_map_benchmark"
runtime_ms = 2
threads = 4
"#;
    let r = run(text);
    let loops = metric(&r, "map_benchmark.loops");
    // One page-selective descriptor and one wait per strict unmap, timed by the queue.
    assert!(loops > 100.0);
    assert!(
        metric(&r, "cmdq.commands") >= 2.0 * loops,
        "{}",
        r.report.report_text
    );
    assert!(metric(&r, "cmdq.sync_wait_ns") > 0.0);
}
