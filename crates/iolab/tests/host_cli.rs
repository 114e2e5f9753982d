//! `iolab host` on fake /sys and /proc trees (`--sysroot`): an Intel machine with lazy
//! (DMA-FQ) groups, an ARM SMMUv3 machine booted strict, an x86 passthrough machine, and a
//! machine with no IOMMU at all.

use std::path::{Path, PathBuf};

mod common;

use common::iolab;

/// Builds a fake root: IOMMU units, groups `(id, type, devices)`, and a command line.
fn fake_root(
    name: &str,
    units: &[&str],
    groups: &[(u32, &str, &[&str])],
    cmdline: Option<&str>,
) -> PathBuf {
    let root = std::env::temp_dir().join(format!("iolab-host-cli-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(root.join("sys/class")).unwrap();
    std::fs::create_dir_all(root.join("proc")).unwrap();
    for u in units {
        std::fs::create_dir_all(root.join("sys/class/iommu").join(u)).unwrap();
    }
    for (id, ty, devs) in groups {
        let g = root.join(format!("sys/kernel/iommu_groups/{id}"));
        std::fs::create_dir_all(g.join("devices")).unwrap();
        std::fs::write(g.join("type"), format!("{ty}\n")).unwrap();
        for d in *devs {
            std::fs::create_dir_all(g.join("devices").join(d)).unwrap();
        }
    }
    if let Some(c) = cmdline {
        std::fs::write(root.join("proc/cmdline"), format!("{c}\n")).unwrap();
    }
    root
}

fn host_json(root: &Path) -> serde_json::Value {
    let out = iolab(&[
        "host",
        "--sysroot",
        root.to_str().unwrap(),
        "--format",
        "json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON")
}

fn host_text(root: &Path) -> String {
    let out = iolab(&["host", "--sysroot", root.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn intel_with_flush_queues_is_lazy() {
    let root = fake_root(
        "intel",
        &["dmar0", "dmar1"],
        &[
            (10, "DMA-FQ", &["0000:00:1f.6"]),
            (2, "DMA-FQ", &["0000:01:00.0", "0000:00:01.0"]),
        ],
        Some("BOOT_IMAGE=/vmlinuz ro quiet intel_iommu=on"),
    );
    let j = host_json(&root);
    assert_eq!(j["iommu_units"], serde_json::json!(["dmar0", "dmar1"]));
    // Groups in numeric order, devices sorted.
    assert_eq!(j["groups"][0]["id"], 2);
    assert_eq!(
        j["groups"][0]["devices"],
        serde_json::json!(["0000:00:01.0", "0000:01:00.0"])
    );
    assert_eq!(j["groups"][1]["id"], 10);
    assert_eq!(j["groups"][1]["domain_type"], "DMA-FQ");
    assert_eq!(j["cmdline_mode"], "kernel-default");
    assert_eq!(j["groups_mode"], "lazy");
    assert_eq!(j["mode"], "lazy");
    let t = host_text(&root);
    assert!(t.contains("intel_iommu=on: driver enabled"), "{t}");
    assert!(t.contains("DMA mode: lazy"), "{t}");
}

#[test]
fn arm_booted_strict_is_strict() {
    let root = fake_root(
        "arm",
        &["smmu3.0x0000000148000000"],
        &[(0, "DMA", &["0000:74:02.0"]), (1, "DMA", &["0000:7a:01.0"])],
        Some("console=ttyAMA0 iommu.strict=1"),
    );
    let j = host_json(&root);
    assert_eq!(j["cmdline_mode"], "strict");
    assert_eq!(j["groups_mode"], "strict");
    assert_eq!(j["mode"], "strict");
    assert_eq!(j["params"][0]["param"], "iommu.strict=1");
}

#[test]
fn passthrough_and_mixed_groups_are_reported_as_such() {
    let root = fake_root(
        "pt",
        &["ivhd0"],
        &[(0, "identity", &["0000:00:00.2"]), (1, "identity", &[])],
        Some("root=/dev/sda1 amd_iommu=on iommu=pt"),
    );
    let j = host_json(&root);
    assert_eq!(j["cmdline_mode"], "passthrough");
    assert_eq!(j["mode"], "passthrough");
    assert!(host_text(&root).contains("no devices"));

    // One group handed to VFIO, the others passthrough: the kernel's state is mixed.
    let root = fake_root(
        "mixed",
        &["dmar0"],
        &[
            (0, "identity", &["0000:00:02.0"]),
            (1, "unmanaged", &["0000:03:00.0"]),
        ],
        Some("intel_iommu=on iommu=pt"),
    );
    let j = host_json(&root);
    assert_eq!(j["groups"][1]["mode"], "unmanaged");
    assert_eq!(j["mode"], "mixed");
}

#[test]
fn nothing_present_is_none_not_an_error() {
    let root = fake_root("none", &[], &[], None);
    let j = host_json(&root);
    assert_eq!(j["iommu_units"], serde_json::json!([]));
    assert_eq!(j["groups"], serde_json::json!([]));
    assert_eq!(j["cmdline"], serde_json::Value::Null);
    assert_eq!(j["mode"], "none");
    let t = host_text(&root);
    assert!(t.contains("IOMMU units (/sys/class/iommu): none"), "{t}");
    assert!(t.contains("DMA mode: none"), "{t}");

    // The driver switched off on the command line, with no sysfs entries.
    let root = fake_root("off", &[], &[], Some("intel_iommu=off"));
    assert_eq!(host_json(&root)["mode"], "none");

    let out = iolab(&["host", "--sysroot", "/no/such/root"]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn vtd_and_amdvi_registers_are_decoded_with_the_lab_setting() {
    let root = fake_root(
        "x86-regs",
        &["dmar0", "dmar1", "ivhd0"],
        &[(0, "DMA-FQ", &["0000:00:00.0"])],
        Some("intel_iommu=on"),
    );
    // X86.md §1.2's Cascade-Lake-class unit; dmar1 the same with Caching Mode (CAP bit 7).
    for (unit, cap) in [("dmar0", "8d2078c106f0466"), ("dmar1", "8d2078c106f04e6")] {
        let d = root.join("sys/class/iommu").join(unit).join("intel-iommu");
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("version"), "1:0\n").unwrap();
        std::fs::write(d.join("cap"), format!("{cap}\n")).unwrap();
        std::fs::write(d.join("ecap"), "f020df\n").unwrap();
    }
    // X86.md §3.1's EPYC Milan EFR.
    let d = root.join("sys/class/iommu/ivhd0/amd-iommu");
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(d.join("cap"), "190b640f\n").unwrap();
    std::fs::write(d.join("features"), "841f77e022094ace:0\n").unwrap();

    let text = host_text(&root);
    assert!(
        text.contains("dmar0 (vtd): version=1:0 cap=8d2078c106f0466 ecap=f020df"),
        "{text}"
    );
    assert!(text.contains("psi                  yes, MAMV 18"), "{text}");
    assert!(text.contains("lab: iommu.model = \"vtd\"\n"), "{text}");
    assert!(
        text.contains("lab: iommu.model = \"vtd\", caching_mode = true"),
        "{text}"
    );
    assert!(text.contains("host_levels          up to 6"), "{text}");
    assert!(text.contains("lab: iommu.model = \"amd-vi\""), "{text}");
    // The mode is still the groups'.
    assert!(text.contains("DMA mode: lazy"), "{text}");

    let j = host_json(&root);
    let units = j["unit_registers"].as_array().unwrap();
    assert_eq!(units.len(), 3);
    assert_eq!(units[0]["unit"], "dmar0");
    assert_eq!(units[0]["model"], "vtd");
    let domains = units[0]["decoded"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == "domains")
        .unwrap();
    assert_eq!(domains["value"], "65536");
    assert_eq!(units[2]["model"], "amd-vi");
    let _ = std::fs::remove_dir_all(&root);
}
