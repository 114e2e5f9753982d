//! Caps on what a scenario or platform profile can grow: each exceeded cap is one clear
//! bad-input error naming the field and the limit.

use iolab_sim::cost::{
    PlatformProfile, MAX_BANDWIDTH_GB_PER_S, MAX_CLOCK_GHZ, MAX_CORES, MAX_COST_VALUE,
};
use iolab_sim::experiments::{self, ipmmu_usb, smmuv3_cmdq};

fn replace_once(text: &str, from: &str, to: &str) -> String {
    assert_eq!(text.matches(from).count(), 1, "`{from}` occurs once");
    text.replacen(from, to, 1)
}

fn rejected(name: &str, text: &str, field: &str, limit: &str) {
    let e = experiments::validate_scenario(name, text, "capped.toml").expect_err("over the cap");
    assert!(e.is_bad_input(), "{e}");
    let msg = e.to_string();
    assert!(msg.contains("capped.toml"), "{msg}");
    assert!(msg.contains(field), "`{field}` named in: {msg}");
    assert!(msg.contains(limit), "`{limit}` named in: {msg}");
}

#[test]
fn bundled_scenarios_are_within_every_cap() {
    let mut modules = 0;
    for name in experiments::NAMES {
        match experiments::bundled_scenario(name) {
            Ok(text) => {
                experiments::validate_scenario(name, text, "bundled")
                    .expect("bundled scenario is valid");
                modules += 1;
            }
            // An experiment that runs from its experiment file only has no scenario of its
            // own (sba-vmerge: its ramp cap is the lab's, lab_sba_vmerge_cells.rs).
            Err(e) => assert!(
                matches!(e, experiments::ExperimentError::DataFileOnly { .. })
                    && iolab_sim::reproduce::bundled::text(name).is_some(),
                "{name}: {e}"
            ),
        }
    }
    assert!(modules > 0, "some published experiment still has a module");
}

#[test]
fn smmuv3_cmdq_caps_rows_and_modes() {
    let base = smmuv3_cmdq::BUNDLED_SCENARIO;
    let at = base.find("[[rows]]").expect("a row");
    let one_row_end = base[at + 8..]
        .find("[[rows]]")
        .map_or(base.len(), |i| at + 8 + i);
    let row = &base[at..one_row_end];
    let mut many = base.to_owned();
    for _ in 0..smmuv3_cmdq::MAX_ROWS {
        many.push('\n');
        many.push_str(row);
    }
    rejected(
        smmuv3_cmdq::NAME,
        &many,
        "rows",
        &smmuv3_cmdq::MAX_ROWS.to_string(),
    );

    let modes = replace_once(
        base,
        "modes = [\"spinlock\", \"lockfree\", \"off\"]",
        "modes = [\"spinlock\", \"lockfree\", \"off\", \"spinlock\"]",
    );
    rejected(smmuv3_cmdq::NAME, &modes, "modes", "1 to 3 modes");
}

#[test]
fn ipmmu_usb_caps_the_seeker_cpu_list() {
    let list = vec!["0"; ipmmu_usb::MAX_SEEKER_CPUS + 1].join(", ");
    let text = replace_once(
        ipmmu_usb::BUNDLED_SCENARIO,
        "seeker_cpus = [0, 2, 3]",
        &format!("seeker_cpus = [{list}]"),
    );
    rejected(
        ipmmu_usb::NAME,
        &text,
        "placement.seeker_cpus",
        &ipmmu_usb::MAX_SEEKER_CPUS.to_string(),
    );
}

fn profile_rejected(text: &str, field: &str, limit: &str) {
    let e = PlatformProfile::from_toml_str(text, "capped.toml").expect_err("over the cap");
    let msg = e.to_string();
    assert!(msg.contains("capped.toml") && msg.contains(field), "{msg}");
    assert!(msg.contains(limit), "`{limit}` named in: {msg}");
}

#[test]
fn platform_profiles_cap_cores_clock_costs_and_bandwidth() {
    let base = PlatformProfile::bundled_toml("rcar-h3").unwrap();
    let cores = replace_once(base, "cores = 4", &format!("cores = {}", MAX_CORES + 1));
    profile_rejected(&cores, "cpu.cores", &MAX_CORES.to_string());
    assert!(PlatformProfile::from_toml_str(
        &replace_once(base, "cores = 4", &format!("cores = {MAX_CORES}")),
        "at-cap.toml"
    )
    .is_ok());

    let slow = replace_once(base, "clock_ghz = 1.5", "clock_ghz = 1e-300");
    profile_rejected(&slow, "cpu.clock_ghz", &MAX_CLOCK_GHZ.to_string());

    let huge = replace_once(
        base,
        "pte_write = { value = 15,",
        "pte_write = { value = 1e300,",
    );
    profile_rejected(&huge, "pte_write.value", &format!("{MAX_COST_VALUE:e}"));

    let bw = replace_once(base, "gb_per_s = 5.0", "gb_per_s = 1e-300");
    profile_rejected(
        &bw,
        "memcpy_bandwidth.gb_per_s",
        &MAX_BANDWIDTH_GB_PER_S.to_string(),
    );
}

/// Every cost of an accepted profile is finite, even at the edges of every cap.
#[test]
fn profiles_at_the_caps_give_finite_costs() {
    let base = PlatformProfile::bundled_toml("rcar-h3").unwrap();
    let edge = replace_once(base, "clock_ghz = 1.5", "clock_ghz = 0.01");
    let edge = replace_once(
        &edge,
        "pte_write = { value = 15,",
        "pte_write = { value = 1e12,",
    );
    let p = PlatformProfile::from_toml_str(&edge, "edge.toml").expect("at the caps");
    for (path, c) in p.costs() {
        assert!(c.ns().is_finite(), "{path}");
    }
}
