//! The experiment files compiled into the binary (also on disk in `scenarios/experiments/`).

/// `(name, file text)` of every bundled experiment file.
const BUNDLED: &[(&str, &str)] = &[
    (
        "ipmmu-usb",
        include_str!("../../../../scenarios/experiments/ipmmu-usb.toml"),
    ),
    (
        "smmuv3-cmdq",
        include_str!("../../../../scenarios/experiments/smmuv3-cmdq.toml"),
    ),
    (
        "sba-vmerge",
        include_str!("../../../../scenarios/experiments/sba-vmerge.toml"),
    ),
    (
        "pseries-ddw",
        include_str!("../../../../scenarios/experiments/pseries-ddw.toml"),
    ),
    // The lab's own (not published): run only when named (`super::extra_names`).
    (
        "protection",
        include_str!("../../../../scenarios/experiments/protection.toml"),
    ),
];

/// The text of bundled experiment file `name`, if there is one.
pub fn text(name: &str) -> Option<&'static str> {
    BUNDLED.iter().find(|(n, _)| *n == name).map(|(_, t)| *t)
}

/// The names of the bundled experiment files.
pub fn names() -> Vec<&'static str> {
    BUNDLED.iter().map(|(n, _)| *n).collect()
}

/// Where bundled file `name` lives in the source tree, for messages and stored runs.
pub fn origin(name: &str) -> String {
    format!("scenarios/experiments/{name}.toml (bundled)")
}

/// Whether `text` is an experiment file (a top-level `experiment` name and a `base`
/// scenario), rather than a workload scenario or a legacy experiment scenario.
pub fn is_experiment_file(text: &str) -> bool {
    text.parse::<toml::Table>()
        .map(|t| t.contains_key("experiment") && t.contains_key("base"))
        .unwrap_or(false)
}
