//! The `kernel.version` axis (issue 17, item 2; docs/model/kernel-versions.md): a scenario
//! names the Linux release it models and the lab runs that release's DMA-path algorithms.

use iolab_sim::lab::{self, LabError, LabOptions, LabRun};
use iolab_sim::tomlfile::InputError;

/// fio 4 KiB random reads on a D06: `cpus` jobs at iodepth 32 on `drives` NVMe drives.
fn fio(cpus: u32, drives: usize, mode: &str, extra_iommu: &str, kernel: &str) -> String {
    let drives = "[[device]]\nkind = \"nvme\"\n".repeat(drives);
    format!(
        r#"
name = "kernel"
seed = 1
[machine]
platform = "hisilicon-d06"
cpus = {cpus}
memory_gib = 256
[iommu]
model = "smmuv3"
mode = "{mode}"
{extra_iommu}
{drives}
[workload]
kind = "fio"
ioengine = "libaio"
rw = "randread"
bs = 4096
iodepth = 32
numjobs = {cpus}
runtime_ms = 10
ramp_ms = 30
[kernel]
{kernel}
"#
    )
}

fn run(text: &str) -> LabRun {
    lab::run_scenario(text, "kernel.toml", &LabOptions::default()).expect("scenario runs")
}

fn metric(r: &LabRun, name: &str) -> f64 {
    r.report.measurements[0]
        .get(name)
        .unwrap_or_else(|| panic!("metric {name} missing"))
        .value
}

fn refused_field(text: &str) -> (String, String) {
    match lab::run_scenario(text, "kernel.toml", &LabOptions::default()) {
        Err(e @ LabError::Input(InputError::Field { .. })) => {
            assert!(e.is_bad_input());
            let msg = e.to_string();
            let LabError::Input(InputError::Field { field, .. }) = e else {
                unreachable!()
            };
            (field, msg)
        }
        Err(e) => panic!("expected a field error, got {e:?}"),
        Ok(_) => panic!("expected the scenario to be refused"),
    }
}

#[test]
fn an_unknown_or_unsupported_release_is_refused_naming_the_field() {
    for v in ["\"banana\"", "\"9.9\"", "\"3.10\""] {
        let (field, msg) = refused_field(&fio(4, 1, "strict", "", &format!("version = {v}")));
        assert_eq!(field, "kernel.version", "{msg}");
        assert!(msg.contains("4.19") && msg.contains("6.12"), "{msg}");
    }
}

#[test]
fn smmuv3_lazy_before_4_20_is_refused() {
    let (field, msg) = refused_field(&fio(4, 1, "lazy", "", "version = \"4.19\""));
    assert_eq!(field, "iommu.mode");
    assert!(msg.contains("4.20"), "{msg}");
    // 4.20 has it.
    run(&fio(4, 1, "lazy", "", "version = \"4.20\""));
}

#[test]
fn the_command_queue_defaults_to_the_releases_own() {
    let text = |v: &str| fio(4, 1, "strict", "", &format!("version = \"{v}\""));
    let line = |r: &LabRun| {
        r.report
            .report_text
            .lines()
            .find(|l| l.contains("iommu        :"))
            .unwrap()
            .to_owned()
    };
    assert!(line(&run(&text("5.3"))).contains("cmdq spinlock"));
    assert!(line(&run(&text("5.4"))).contains("cmdq lockfree"));
    // A scenario's own choice wins.
    let chosen = fio(4, 1, "strict", "cmdq = \"lockfree\"", "version = \"5.3\"");
    assert!(line(&run(&chosen)).contains("cmdq lockfree"));
}

#[test]
fn before_6_7_the_bounded_depot_sends_cross_cpu_frees_to_the_tree() {
    // 128 CPUs, completions on the 64 interrupt CPUs: IOVAs move from the freeing CPUs to
    // the allocating ones through the depot. 6.6's depot holds 32 magazines and frees the
    // rest to the tree; 6.7's scalable depot keeps one per CPU.
    let lockfree = "cmdq = \"lockfree\"";
    let old = run(&fio(128, 8, "lazy", lockfree, "version = \"6.6\""));
    let new = run(&fio(128, 8, "lazy", lockfree, "version = \"6.12\""));
    let tree = |r: &LabRun| metric(r, "lock.iova_tree.acquisitions");
    let spin = |r: &LabRun| metric(r, "cpu.all.spin_pct");
    assert!(
        tree(&old) > 2.0 * tree(&new),
        "tree acquisitions 6.6 {} vs 6.12 {}",
        tree(&old),
        tree(&new)
    );
    assert!(
        spin(&old) > spin(&new) + 1.0,
        "spin 6.6 {} vs 6.12 {}",
        spin(&old),
        spin(&new)
    );
    // Unset, the version is the newest long-term release.
    let default = run(&fio(128, 8, "lazy", lockfree, ""));
    assert_eq!(default.report.report_text, new.report.report_text);
}
