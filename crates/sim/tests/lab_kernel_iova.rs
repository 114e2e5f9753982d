//! PCI 32-bit-first IOVA allocation and the IOVA tree's variants by `kernel.version` (issue
//! 17, item 2; docs/model/kernel-versions.md): 8,192 one-MiB reads in flight on two NVMe
//! drives behind SMMUv3 need 8 GiB of IOVA space, twice what lies below 4 GiB.

mod common;

use common::run;
use iolab_sim::lab::{self, LabOptions, LabRun};

/// fio 1 MiB random reads, 64 jobs at iodepth 128 on two NVMe drives of a D06, strict.
fn fill(kernel: &str, mask_bits: u32) -> String {
    let drive =
        format!("[[device]]\nkind = \"nvme\"\nio_queues = 64\ndma_mask_bits = {mask_bits}\n");
    format!(
        r#"
name = "fill"
seed = 1
[machine]
platform = "hisilicon-d06"
cpus = 64
memory_gib = 256
[iommu]
model = "smmuv3"
mode = "strict"
{drive}{drive}
[workload]
kind = "fio"
ioengine = "libaio"
rw = "randread"
bs = 1048576
iodepth = 128
numjobs = 64
runtime_ms = 200
ramp_ms = 200
[kernel]
version = "{kernel}"
"#
    )
}

/// Metric `name` of the run's first measurement, if reported (the `dma.iova_*` metrics are
/// reported only when one of them happened).
fn metric(r: &LabRun, name: &str) -> Option<f64> {
    r.report.measurements[0].get(name).map(|m| m.value)
}

/// 6.1 tries below 4 GiB on every allocation: once the 32-bit space is full each try fails
/// (thousands of failures, each followed by a full-range allocation) and maps cost more;
/// 6.6 fails once and then allocates from the full range only.
#[test]
fn from_6_6_a_full_32_bit_space_costs_one_failure() {
    let old = run(&fill("6.1", 64));
    let new = run(&fill("6.6", 64));
    let fails = |r: &LabRun| metric(r, "dma.iova_32bit_failures").expect("reported");
    let full = |r: &LabRun| metric(r, "dma.iova_full_range_allocs").expect("reported");
    assert!(fails(&old) > 2000.0, "{}", fails(&old));
    assert_eq!(fails(&new), 1.0);
    // 6.1: one full-range allocation per failure; 6.6: every allocation after the first
    // failure.
    assert_eq!(full(&old), fails(&old));
    assert!(full(&new) > full(&old), "{} vs {}", full(&new), full(&old));
    let map_ns = |r: &LabRun| metric(r, "dma.map_ns").unwrap();
    assert!(
        map_ns(&old) > 1.05 * map_ns(&new),
        "{} vs {}",
        map_ns(&old),
        map_ns(&new)
    );
}

/// 4.19 has neither the tree's retry from the limit nor the 32-bit fast-fail; 5.11+ retry.
#[test]
fn the_tree_retries_only_from_5_11() {
    let retries = |v: &str| metric(&run(&fill(v, 64)), "dma.iova_tree_retries").unwrap();
    assert_eq!(retries("4.19"), 0.0);
    assert_eq!(retries("5.10"), 0.0);
    assert!(retries("6.1") > 0.0);
}

/// A controller limited to 32 bits is never given the trick: nothing to report (with a
/// quarter of the load, 2 GiB in flight, which fits below 4 GiB).
#[test]
fn a_32_bit_controller_makes_no_32_bit_first_tries() {
    let r = run(&fill("6.1", 32).replace("iodepth = 128", "iodepth = 32"));
    assert_eq!(metric(&r, "dma.iova_32bit_failures"), None);
    assert_eq!(metric(&r, "dma.iova_full_range_allocs"), None);
    // The same load with a 64-bit mask stays below 4 GiB too: no failure either.
    let r = run(&fill("6.1", 64).replace("iodepth = 128", "iodepth = 32"));
    assert_eq!(metric(&r, "dma.iova_32bit_failures"), None);
}

#[test]
fn nvme_devices_must_share_one_mask() {
    let text = fill("6.12", 64).replacen("dma_mask_bits = 64", "dma_mask_bits = 40", 1);
    let e = lab::run_scenario(&text, "fill.toml", &LabOptions::default()).expect_err("refused");
    let msg = e.to_string();
    assert!(e.is_bad_input(), "{msg}");
    assert!(msg.contains("device[1].dma_mask_bits"), "{msg}");
}
