//! How a CPU learns that its `CMD_SYNC` completed is a property of the platform: the
//! profiles' sourced `iommu.cmdq.sync_msi` (D05: no MSI, CONS-register polling; D06: MSI),
//! validated like every profile value and followed by workload scenarios' SMMUv3 queue.

use iolab_sim::cost::{CostError, PlatformProfile};
use iolab_sim::lab::{self, examples, LabOptions, LabRun};

fn d05_text() -> &'static str {
    PlatformProfile::bundled_toml("hisilicon-d05").unwrap()
}

#[test]
fn hisilicon_profiles_say_how_syncs_complete() {
    let flag = |name: &str| {
        let p = PlatformProfile::bundled(name).unwrap();
        let f = p
            .require_cmdq()
            .unwrap()
            .sync_msi
            .clone()
            .expect("sync_msi");
        assert!(
            !f.source.trim().is_empty(),
            "{name}: sync_msi has no source"
        );
        f.is_set()
    };
    assert!(!flag("hisilicon-d05"), "the D05's SMMU has no MSI");
    assert!(
        flag("hisilicon-d06"),
        "the D06's SMMU signals CMD_SYNC by MSI"
    );
}

#[test]
fn sync_msi_is_validated_by_field() {
    let field = |text: &str| match PlatformProfile::from_toml_str(text, "p.toml") {
        Err(CostError::Field { field, .. }) => field,
        Err(e) => panic!("expected a field error, got {e}"),
        Ok(_) => panic!("accepted: {text}"),
    };
    let two = d05_text().replace("sync_msi = { value = 0,", "sync_msi = { value = 2,");
    assert_eq!(field(&two), "iommu.cmdq.sync_msi.value");
    let start = d05_text().find("sync_msi = {").unwrap();
    let end = start + d05_text()[start..].find('\n').unwrap();
    let empty = format!(
        "{}sync_msi = {{ value = 0, source = \" \" }}{}",
        &d05_text()[..start],
        &d05_text()[end..]
    );
    assert_eq!(field(&empty), "iommu.cmdq.sync_msi.source");
    // Optional: a profile without it loads (the queue model's default, MSI, applies).
    let absent = format!("{}{}", &d05_text()[..start], &d05_text()[end + 1..]);
    let p = PlatformProfile::from_toml_str(&absent, "p.toml").unwrap();
    assert!(p.require_cmdq().unwrap().sync_msi.is_none());
}

/// fio-sas-spinlock without the smmuv3-cmdq experiment's sync-latency calibration (the
/// example carries it as a `machine.costs` override): the profile's own sync latency, with
/// which the spinlock queue, not the HBA, bounds the run.
fn spinlock_example() -> String {
    let text = examples::example("fio-sas-spinlock").unwrap();
    let mut t: toml::Table = text.parse().unwrap();
    let machine = t["machine"].as_table_mut().unwrap();
    assert!(
        machine.remove("costs").is_some(),
        "the example's calibration"
    );
    t.to_string()
}

/// [`spinlock_example`] on the D05 profile from a file, with `sync_msi` set to `value`.
fn spinlock_run(dir: &std::path::Path, value: u8) -> LabRun {
    let profile = d05_text().replace(
        "sync_msi = { value = 0,",
        &format!("sync_msi = {{ value = {value},"),
    );
    let path = dir.join(format!("d05-msi{value}.toml"));
    std::fs::write(&path, profile).unwrap();
    let scenario = spinlock_example().replace(
        "platform = \"hisilicon-d05\"",
        &format!("platform = \"{}\"", path.display()),
    );
    assert_ne!(scenario, spinlock_example());
    lab::run_scenario(&scenario, "test.toml", &LabOptions::default()).expect("runs")
}

#[test]
fn workload_scenarios_follow_the_profiles_sync_completion() {
    let dir = std::env::temp_dir().join(format!("iolab-sync-wait-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let poll = spinlock_run(&dir, 0);
    let msi = spinlock_run(&dir, 1);
    let _ = std::fs::remove_dir_all(&dir);
    let get = |r: &LabRun, m: &str| r.report.measurements[0].get(m).unwrap().value;
    // The bundled D05 is the CONS-polling file: the example gives the same bytes.
    let bundled = lab::run_scenario(&spinlock_example(), "x.toml", &LabOptions::default()).unwrap();
    assert_eq!(
        bundled
            .report
            .report_text
            .lines()
            .skip(1)
            .collect::<Vec<_>>(),
        poll.report.report_text.lines().skip(1).collect::<Vec<_>>()
    );
    // Polling CONS with non-posted reads (under the queue's lock, as Linux <= 5.2 does
    // without MSI) waits longer per sync than polling the MSI's memory word outside it.
    assert!(
        get(&poll, "cmdq.sync_wait_ns") > get(&msi, "cmdq.sync_wait_ns"),
        "poll {} vs msi {}",
        get(&poll, "cmdq.sync_wait_ns"),
        get(&msi, "cmdq.sync_wait_ns")
    );
    assert!(get(&poll, "read.iops") < get(&msi, "read.iops"));
}
