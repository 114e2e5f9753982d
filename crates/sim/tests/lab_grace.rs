//! The `nvidia-grace` platform profile (docs/MODEL.md): it loads, every cost carries a source,
//! and the yardstick scenarios (scenarios/yardsticks/grace-fio-8nvme-*.toml: 128 CPUs, 8 NVMe
//! drives, fio 4 KiB random reads, warm) order the IOMMU modes strict < lazy <= passthrough.
//!
//! The published Grace figure (RESEARCH.md [mail]: passthrough 16.5M, lazy 16.4M, strict
//! 2.8M IOPS) is a yardstick: this test checks the ordering only, never the values.

mod common;
use common::metric;

use iolab_sim::cost::PlatformProfile;
use iolab_sim::lab::{self, LabOptions, LabRun};

const STRICT: &str = include_str!("../../../scenarios/yardsticks/grace-fio-8nvme-strict.toml");
const LAZY: &str = include_str!("../../../scenarios/yardsticks/grace-fio-8nvme-lazy.toml");
const PASSTHROUGH: &str =
    include_str!("../../../scenarios/yardsticks/grace-fio-8nvme-passthrough.toml");

#[test]
fn grace_profile_loads_with_a_source_for_every_value() {
    let p = PlatformProfile::bundled("nvidia-grace").expect("bundled");
    assert_eq!(p.name, "nvidia-grace");
    assert_eq!(p.cpu.model, "Neoverse V2");
    assert!(p.cpu.cores >= 128, "a 128+ core system: {}", p.cpu.cores);
    for s in [
        &p.cpu.source,
        &p.iommu.source,
        &p.memory.memcpy_bandwidth.source,
    ] {
        assert!(!s.trim().is_empty());
    }
    let costs = p.costs();
    assert!(costs.len() >= 30, "{} costs", costs.len());
    for (path, c) in costs {
        assert!(!c.source.trim().is_empty(), "{path} has no source");
        assert!(c.ns().is_finite() && c.ns() >= 0.0, "{path}");
    }
    let cmdq = p.require_cmdq().expect("an SMMUv3 command queue");
    let msi = cmdq.sync_msi.as_ref().expect("sync_msi is stated");
    assert!(!msi.is_set(), "CMDQV syncs are CS_NONE: the CPU polls CONS");
    assert!(!msi.source.trim().is_empty());
}

fn run(text: &str, name: &str) -> LabRun {
    lab::run_scenario(text, name, &LabOptions::default()).expect("scenario runs")
}

#[test]
fn warm_128_cpus_8_nvme_order_strict_below_lazy_below_passthrough() {
    let strict = run(STRICT, "grace-fio-8nvme-strict.toml");
    let lazy = run(LAZY, "grace-fio-8nvme-lazy.toml");
    let pt = run(PASSTHROUGH, "grace-fio-8nvme-passthrough.toml");
    let iops = |r: &LabRun| metric(r, "read.iops");
    let (s, l, p) = (iops(&strict), iops(&lazy), iops(&pt));
    assert!(s > 0.0, "strict ran: {s}");
    assert!(s < l, "strict {s} should be below lazy {l}");
    assert!(l <= p, "lazy {l} should not exceed passthrough {p}");
    // Warm: the measured window is steady in every mode.
    for r in [&strict, &lazy, &pt] {
        assert!(metric(r, "window.iops_change_pct").abs() <= 5.0);
        assert!(!r.report.report_text.contains("steady state : no"));
    }
}
