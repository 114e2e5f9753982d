//! SMMUv3.2 range invalidation in the lab (issue 17, item 2; docs/model/kernel-versions.md):
//! the SMMU advertises it (`iommu.range_invalidation`, by default the platform profile's
//! `iommu.cmdq.range_invalidation`), and Linux 5.7+ sends one range command per gathered
//! range instead of one `CMD_TLBI_NH_VA` per page.

mod common;

use common::{metric, run};
use iolab_sim::lab::{self, LabOptions, LabRun};

const GRACE_STRICT: &str =
    include_str!("../../../scenarios/yardsticks/grace-fio-8nvme-strict.toml");

/// The Grace yardstick (128 CPUs, 8 NVMe drives, strict) with 64 KiB reads, and `extra`
/// lines in `[iommu]` and `[kernel]`. The drives' writes carry Relaxed Ordering, so the 16
/// walks of a fresh 64 KiB buffer never hold a drive's data (docs/MODEL.md, "DMA port") and
/// the command queue is what differs.
fn grace_64k(iommu: &str, kernel: &str) -> String {
    GRACE_STRICT
        .replace("bs = 4096", "bs = 65536")
        .replace(
            "kind = \"nvme\"",
            "kind = \"nvme\"\nrelaxed_ordering = true",
        )
        .replace(
            "cmdq = \"lockfree\"",
            &format!("cmdq = \"lockfree\"\n{iommu}"),
        )
        .replace("[kernel]", &format!("[kernel]\n{kernel}"))
}

fn commands_per_unmap(r: &LabRun) -> f64 {
    metric(r, "cmdq.commands") / metric(r, "dma.maps")
}

/// Grace's profile advertises RIL: a 64 KiB unmap is one range command and its sync; with
/// `iommu.range_invalidation = false` it is 16 TLBIs and the sync, and the command queue
/// bounds the IOPS.
#[test]
fn grace_with_range_invalidation_sends_two_commands_per_64k_unmap() {
    let with = run(&grace_64k("", ""));
    let without = run(&grace_64k("range_invalidation = false", ""));
    assert!((commands_per_unmap(&with) - 2.0).abs() < 0.01);
    assert!((commands_per_unmap(&without) - 17.0).abs() < 0.05);
    let iops = |r: &LabRun| metric(r, "read.iops");
    assert!(
        iops(&with) > 2.0 * iops(&without),
        "{} vs {}",
        iops(&with),
        iops(&without)
    );
}

/// Before 5.7 the driver does not use RIL even when the SMMU has it.
#[test]
fn a_release_before_5_7_ignores_ril() {
    let old = run(&grace_64k("", "version = \"5.4\""));
    let new = run(&grace_64k("", "version = \"5.7\""));
    assert!((commands_per_unmap(&old) - 17.0).abs() < 0.05);
    assert!((commands_per_unmap(&new) - 2.0).abs() < 0.01);
}

#[test]
fn range_invalidation_applies_to_smmuv3_only() {
    let text = grace_64k("", "").replace(
        "mode = \"strict\"\ncmdq = \"lockfree\"\n",
        "mode = \"passthrough\"\nrange_invalidation = true\n",
    );
    let e = lab::run_scenario(&text, "ril.toml", &LabOptions::default()).expect_err("refused");
    let msg = e.to_string();
    assert!(e.is_bad_input(), "{msg}");
    assert!(msg.contains("iommu.range_invalidation"), "{msg}");
}
