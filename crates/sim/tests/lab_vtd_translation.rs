//! `iommu.vtd_translation`: the lab's VT-d unit in legacy mode or scalable mode with
//! first- or second-stage domains (docs/model/vtd.md). The walks follow the tables:
//! scalable mode adds the PASID directory and table entries to a context miss, the
//! table levels are the same 4, and the strict path's descriptor count stays 2 per unmap
//! (a PASID-based IOTLB descriptor for first-stage domains, whose IH keeps the
//! paging-structure caches).

mod common;

use common::{metric, run};
use iolab_sim::lab::{self, LabOptions, LabRun};

fn fio(mode: &str, extra: &str) -> String {
    format!(
        r#"
name = "vtd-translation"
seed = 1
[machine]
platform = "intel-icelake-2s"
cpus = 4
memory_gib = 64
[iommu]
model = "vtd"
mode = "{mode}"
{extra}
[[device]]
kind = "nvme"
[workload]
kind = "fio"
ioengine = "libaio"
rw = "randread"
bs = 4096
iodepth = 8
numjobs = 4
runtime_ms = 2
ramp_ms = 1
"#
    )
}

fn attr(r: &LabRun, name: &str) -> Option<String> {
    r.report.measurements[0].attrs.get(name).cloned()
}

#[test]
fn every_translation_runs_strict_with_two_descriptors_per_unmap() {
    let mut walks = Vec::new();
    for t in ["legacy", "scalable-second-stage", "scalable-first-stage"] {
        let r = run(&fio("strict", &format!("vtd_translation = \"{t}\"")));
        let expect_attr = (t != "legacy").then(|| t.to_owned());
        assert_eq!(attr(&r, "vtd_translation"), expect_attr);
        assert!(metric(&r, "read.iops") > 0.0, "{t}");
        let syncs = metric(&r, "dma.inval_syncs");
        assert!(syncs > 100.0, "{t}: {syncs}");
        // One IOTLB (or PASID-based IOTLB) descriptor and one wait per unmap.
        assert_eq!(metric(&r, "cmdq.commands"), 2.0 * syncs, "{t}");
        assert_eq!(metric(&r, "iotlb.stale_hits"), 0.0, "{t}");
        walks.push(metric(&r, "iotlb.walk_reads_per_io"));
    }
    // Second stage (either mode): every strict PSI drops the paging-structure caches
    // (Linux masks IH away), so each I/O reads at least the PD and PT entries. First
    // stage: PASID-based descriptors carry IH = 1 when no table was freed, so the caches
    // survive and an I/O reads about one entry, the leaf (X86.md §2.4).
    assert!(walks[0] >= 2.0 && walks[1] >= 2.0, "{walks:?}");
    assert!(walks[2] >= 1.0 && walks[2] < 1.2, "{walks:?}");
}

#[test]
fn lazy_runs_on_a_first_stage_domain() {
    let r = run(&fio("lazy", "vtd_translation = \"scalable-first-stage\""));
    assert!(metric(&r, "read.iops") > 0.0);
    assert_eq!(
        metric(&r, "protection.stale_hits"),
        metric(&r, "iotlb.stale_hits")
    );
}

#[test]
fn same_seed_same_bytes_in_scalable_mode() {
    let text = fio("strict", "vtd_translation = \"scalable-first-stage\"");
    assert_eq!(run(&text).report.report_text, run(&text).report.report_text);
}

#[test]
fn bad_values_are_refused_naming_the_field() {
    let e = lab::run_scenario(
        &fio("strict", "vtd_translation = \"nested\""),
        "t.toml",
        &LabOptions::default(),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("t.toml") && e.contains("iommu.vtd_translation"),
        "{e}"
    );
    assert!(e.contains("\"scalable-first-stage\""), "{e}");
    let amd = fio("strict", "vtd_translation = \"legacy\"")
        .replace("\"vtd\"", "\"amd-vi\"")
        .replace("intel-icelake-2s", "amd-epyc-genoa-2s");
    let e = lab::run_scenario(&amd, "t.toml", &LabOptions::default())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("iommu.vtd_translation") && e.contains("vtd"),
        "{e}"
    );
}
