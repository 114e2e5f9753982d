//! The protection report of workload scenarios (issue 7): every bundled example's run
//! carries `protection.*` and `faults.*` read from the DMA path its devices went through;
//! strict mode leaves nothing reachable after an unmap, lazy mode leaves a window, no IOMMU
//! bypasses translation on every device access, and a sub-page buffer exposes the rest of
//! its IOMMU page.

mod common;
use common::{example, metric, run};

use iolab_sim::lab::examples;

/// The metrics every run carries, whatever the model.
const ALWAYS: [&str; 6] = [
    "protection.max_reachable_after_unmap_ns",
    "protection.subpage_exposed_bytes",
    "protection.max_subpage_exposed_bytes",
    "protection.bypass_accesses",
    "faults.translation",
    "faults.permission",
];

#[test]
fn every_example_run_carries_the_protection_report() {
    for name in examples::example_names() {
        let r = example(name);
        let m = &r.report.measurements[0];
        for metric in ALWAYS {
            assert!(m.get(metric).is_some(), "{name}: {metric} missing");
        }
        // The SBA model has no device-side I/O TLB to observe a stale hit in: the figure is
        // left out, not zero.
        let sba = m.attrs["iommu_model"] == "sba" && m.attrs["iommu_mode"] != "off";
        assert_eq!(
            m.get("protection.stale_hits").is_some(),
            !sba,
            "{name}: protection.stale_hits"
        );
        // No example maps anything wrongly: a fault would mean the drivers lost a mapping.
        assert_eq!(metric(&r, "faults.translation"), 0.0, "{name}");
        assert_eq!(metric(&r, "faults.permission"), 0.0, "{name}");
    }
}

#[test]
fn strict_examples_leave_nothing_reachable_after_unmap() {
    for name in [
        "fio-nvme-strict",
        "fio-nvme-smmuv3-strict",
        "bonnie-sas-smmuv3-strict",
        "bonnie-usb-ipmmu",
    ] {
        let r = example(name);
        assert_eq!(r.report.measurements[0].attrs["iommu_mode"], "strict");
        assert_eq!(metric(&r, "protection.stale_hits"), 0.0, "{name}");
        assert_eq!(
            metric(&r, "protection.max_reachable_after_unmap_ns"),
            0.0,
            "{name}"
        );
        assert_eq!(metric(&r, "protection.bypass_accesses"), 0.0, "{name}");
    }
    let text = example("fio-nvme-strict").report.report_text;
    assert!(
        text.contains("protection   : stale hits=0, max reachable after unmap=0 ns"),
        "{text}"
    );
}

#[test]
fn lazy_mode_leaves_freed_pages_reachable_until_its_flush() {
    for name in ["fio-nvme-lazy", "fio-nvme-smmuv3-lazy"] {
        let r = example(name);
        assert_eq!(r.report.measurements[0].attrs["iommu_mode"], "lazy");
        let window = metric(&r, "protection.max_reachable_after_unmap_ns");
        assert!(window > 0.0, "{name}: lazy mode defers its invalidations");
        assert_eq!(metric(&r, "protection.bypass_accesses"), 0.0, "{name}");
    }
}

#[test]
fn without_an_iommu_every_device_access_bypasses_translation() {
    for name in [
        "fio-nvme-off",
        "bonnie-sas-off",
        "bonnie-usb-off",
        "reaim-scsi-off",
    ] {
        let r = example(name);
        assert_eq!(r.report.measurements[0].attrs["iommu_mode"], "off");
        assert!(
            metric(&r, "protection.bypass_accesses") > 0.0,
            "{name}: no page table checked the device"
        );
        // A freed page stays reachable for the whole run.
        assert!(
            metric(&r, "protection.max_reachable_after_unmap_ns") > 0.0,
            "{name}"
        );
        assert_eq!(metric(&r, "protection.stale_hits"), 0.0, "{name}");
    }
    let reaim = example("reaim-scsi-off").report.report_text;
    assert!(reaim.contains("protection: stale hits=0"), "{reaim}");
    // Each DMA segment a device reads or writes is one access; with no IOMMU every one of
    // them bypasses translation, so the count equals the accesses, not just some of them.
    for (name, commands, segments, at_least) in [
        (
            "bonnie-sas-off",
            "block.commands",
            "dma.segments_per_command",
            1000.0,
        ),
        (
            "reaim-scsi-off",
            "scsi.requests",
            "scsi.dma_segments_per_request",
            100.0,
        ),
    ] {
        let r = example(name);
        let accesses = metric(&r, commands) * metric(&r, segments);
        assert!(accesses > at_least, "{name}: {accesses}");
        assert_eq!(
            metric(&r, "protection.bypass_accesses"),
            accesses.round(),
            "{name}"
        );
    }
    // fio maps one 4 KiB buffer per I/O and the device accesses each once.
    let fio = example("fio-nvme-off");
    let text = &fio.report.report_text;
    let maps = count_after(text, "maps=");
    assert!(maps > 1000.0, "{text}");
    assert_eq!(metric(&fio, "protection.bypass_accesses"), maps, "{text}");
    assert_eq!(count_after(text, "bypassed accesses="), maps, "{text}");
}

/// The number after `key` (up to the next non-digit) in `text`.
fn count_after(text: &str, key: &str) -> f64 {
    let at = text
        .find(key)
        .unwrap_or_else(|| panic!("`{key}` in {text}"))
        + key.len();
    let digits: String = text[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits
        .parse()
        .unwrap_or_else(|_| panic!("a count after `{key}`"))
}

#[test]
fn a_sub_page_buffer_exposes_the_rest_of_its_iommu_page() {
    let text = |bs: u32| {
        format!(
            r#"
name = "subpage"
[machine]
platform = "hisilicon-d06"
cpus = 4
[iommu]
model = "smmuv3"
mode = "strict"
[[device]]
kind = "nvme"
[workload]
kind = "fio"
ioengine = "libaio"
rw = "randread"
bs = {bs}
iodepth = 4
numjobs = 2
runtime_ms = 1
ramp_ms = 1
"#
        )
    };
    let small = run(&text(512));
    // Every 512-byte buffer is mapped as one whole 4 KiB page.
    assert_eq!(
        metric(&small, "protection.max_subpage_exposed_bytes"),
        3584.0
    );
    let total = metric(&small, "protection.subpage_exposed_bytes");
    assert!(total > 0.0 && total % 3584.0 == 0.0, "{total}");
    let whole = run(&text(4096));
    assert_eq!(metric(&whole, "protection.subpage_exposed_bytes"), 0.0);
}

#[test]
fn the_sba_keeps_unmapped_ranges_reachable_until_their_batched_purge() {
    // The SBA queues unmapped ranges and purges them 64 at a time: the window is measured
    // and is longer than zero; its IOMMU pages are larger than the blocks it maps.
    for name in ["bonnie-scsi-sba", "reaim-scsi-sba"] {
        let r = example(name);
        assert!(
            metric(&r, "protection.max_reachable_after_unmap_ns") > 0.0,
            "{name}"
        );
        assert!(
            metric(&r, "protection.subpage_exposed_bytes") > 0.0,
            "{name}"
        );
    }
}
