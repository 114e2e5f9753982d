//! `iolab bench`'s x86 IOMMU rows: present, finite, and beside their peer in the same run.
//! No timing is asserted, only that the figures are sane.

mod common;

use common::{iolab, stderr};

#[test]
fn x86_rows_exist_with_finite_figures_and_their_peer() {
    let out = iolab(&[
        "bench", "--quick", "--filter", "pgtable/", "--filter", "inval/", "--format", "json",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    let results = json["results"].as_array().expect("a results array");
    let row = |name: &str| {
        results
            .iter()
            .find(|r| r["name"] == name)
            .unwrap_or_else(|| panic!("missing {name}"))
    };
    let positive = |v: &serde_json::Value, what: &str| {
        let x = v.as_f64().unwrap_or_else(|| panic!("{what} is a number"));
        assert!(x.is_finite() && x > 0.0, "{what} = {x}");
    };
    for format in ["vtd-second-stage", "amdv1"] {
        for op in ["map-unmap-seq", "map-unmap-rand", "translate"] {
            let name = format!("pgtable/{format}/{op}");
            let r = row(&name);
            positive(&r["ns_per_op"], &name);
            assert_eq!(r["peer"], "x86_64 OffsetPageTable", "{name}");
            positive(&r["peer_ns_per_op"], &name);
            positive(&r["speedup_vs_peer"], &name);
            assert_eq!(r["other_peers"][0]["peer"], "iolab LPAE (in-house ref)");
            positive(&r["other_peers"][0]["ns_per_op"], &name);
            // Same work on every pass: one walk of four levels per translation.
            let reads = r["work_per_op"]["pte_reads"].as_f64().expect("pte_reads");
            assert!(reads >= 4.0, "{name}: {reads}");
        }
    }
    for unit in ["immediate", "smmuv3", "vtd", "amdvi"] {
        let name = format!("inval/{unit}-strict-unmap");
        let r = row(&name);
        positive(&r["ns_per_op"], &name);
        assert_eq!(r["work_per_op"]["inval_syncs"], 1.0, "{name}");
        if unit != "immediate" {
            assert_eq!(r["work_per_op"]["commands_written"], 2.0, "{name}");
        }
    }
    assert_eq!(results.len(), 6 + 4, "only the filtered rows run");
}
