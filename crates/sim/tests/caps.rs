//! Caps on what a scenario or platform profile can grow: each exceeded cap is one clear
//! bad-input error naming the field and the limit.

use iolab_sim::cost::{
    PlatformProfile, MAX_BANDWIDTH_GB_PER_S, MAX_CLOCK_GHZ, MAX_CORES, MAX_COST_VALUE,
};
use iolab_sim::reproduce::{bundled, data::MAX_CELLS, Experiment};

fn replace_once(text: &str, from: &str, to: &str) -> String {
    assert_eq!(text.matches(from).count(), 1, "`{from}` occurs once");
    text.replacen(from, to, 1)
}

#[test]
fn bundled_experiment_files_are_within_every_cap() {
    for name in bundled::names() {
        let text = bundled::text(name).unwrap();
        Experiment::parse(text, &bundled::origin(name)).expect("bundled experiment is valid");
    }
}

#[test]
fn experiment_files_cap_their_cells() {
    let base = bundled::text("smmuv3-cmdq").unwrap();
    // One more row with every column than the cap allows: 3 cells a row.
    let mut many = base.to_owned();
    for i in 0..MAX_CELLS / 3 + 1 {
        many.push_str(&format!("\n[[rows]]\nid = \"extra{i}\"\n"));
    }
    let e = Experiment::parse(&many, "capped.toml").expect_err("over the cap");
    assert!(e.is_bad_input(), "{e}");
    let msg = e.to_string();
    assert!(msg.contains("capped.toml") && msg.contains("rows"), "{msg}");
    assert!(
        msg.contains(&MAX_CELLS.to_string()) && msg.contains("MAX_CELLS"),
        "{msg}"
    );
}

/// The ipmmu-usb experiment file's cells are lab scenarios: the lab's seeker cap holds.
#[test]
fn ipmmu_usb_caps_the_seeker_cpu_list() {
    let cap = iolab_sim::lab::caps::MAX_THREADS as usize;
    let list = vec!["0"; cap + 1].join(", ");
    let text = replace_once(
        bundled::text("ipmmu-usb").unwrap(),
        "file_mib = 64\n",
        &format!("file_mib = 64\nseeker_cpus = [{list}]\n"),
    );
    let e = Experiment::parse(&text, "capped.toml").expect_err("over the cap");
    assert!(e.is_bad_input(), "{e}");
    let msg = e.to_string();
    assert!(msg.contains("capped.toml"), "{msg}");
    assert!(msg.contains("workload.seeker_cpus"), "{msg}");
    assert!(msg.contains(&cap.to_string()), "{msg}");
    let at_cap = text.replace(
        &format!("[{list}]"),
        &format!("[{}]", vec!["0"; cap].join(", ")),
    );
    Experiment::parse(&at_cap, "capped.toml").expect("at the cap");
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
