//! Releases before the lab's dma-iommu table (4.19): accepted only for IOMMU models whose Linux
//! DMA path has no release variants in the lab (sba, pseries), so the published experiments
//! can state theirs (sba-vmerge: Linux 2.6.0); refused for every other model at
//! `kernel.version` (docs/model/kernel-versions.md).

use iolab_sim::lab::{self, LabError, LabOptions};
use iolab_sim::tomlfile::InputError;

const NOVMERGE: &str = include_str!("../../../scenarios/experiments/sba-vmerge/novmerge.toml");
const PSERIES: &str = include_str!("../../../scenarios/experiments/pseries-ddw/1t.write.ddw.toml");

fn report(text: &str) -> String {
    lab::run_scenario(text, "old.toml", &LabOptions::default())
        .expect("scenario runs")
        .report
        .report_text
}

/// The release is a record on these paths: the run is the same with or without it.
#[test]
fn sba_and_pseries_accept_an_older_release_and_run_the_same() {
    assert!(NOVMERGE.contains("version = \"2.6.0\""));
    let without = NOVMERGE.replace("version = \"2.6.0\"", "");
    assert_eq!(report(NOVMERGE), report(&without));
    let old = PSERIES.replace("version = \"5.15\"", "version = \"3.10\"");
    assert_eq!(report(&old), report(PSERIES));
}

#[test]
fn other_models_refuse_an_older_release_naming_the_field() {
    let text = r#"
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
bs = 4096
iodepth = 4
numjobs = 4
runtime_ms = 1
[kernel]
version = "2.6.0"
"#;
    match lab::run_scenario(text, "old.toml", &LabOptions::default()) {
        Err(e @ LabError::Input(InputError::Field { .. })) => {
            assert!(e.is_bad_input());
            let msg = e.to_string();
            assert!(msg.contains("kernel.version"), "{msg}");
            assert!(msg.contains("\"sba\" or \"pseries\""), "{msg}");
        }
        Err(e) => panic!("expected a field error, got {e:?}"),
        Ok(_) => panic!("expected the scenario to be refused"),
    }
    // A release after the newest is refused for sba too.
    let newer = NOVMERGE.replace("version = \"2.6.0\"", "version = \"7.0\"");
    assert!(lab::run_scenario(&newer, "old.toml", &LabOptions::default()).is_err());
}
