//! The experiment files compiled into the binary (also on disk in `scenarios/experiments/`),
//! and the check that keeps them (and scenarios of the published experiments' former
//! schemas) apart from workload scenarios.

use crate::tomlfile::{InputError, TomlDoc};

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
    (
        "fands-iotlb",
        include_str!("../../../../scenarios/experiments/fands-iotlb.toml"),
    ),
    // The lab's own (not published): run only when named (`super::extra_names`).
    (
        "protection",
        include_str!("../../../../scenarios/experiments/protection.toml"),
    ),
];

/// `(name, lock file text)` of the bundled experiments with declared unknowns: their
/// fitted values (`scenarios/experiments/NAME.fit.toml`, written by
/// `iolab reproduce --refit NAME`; see [`super::refit`]).
const LOCKS: &[(&str, &str)] = &[
    (
        "ipmmu-usb",
        include_str!("../../../../scenarios/experiments/ipmmu-usb.fit.toml"),
    ),
    (
        "smmuv3-cmdq",
        include_str!("../../../../scenarios/experiments/smmuv3-cmdq.fit.toml"),
    ),
    (
        "sba-vmerge",
        include_str!("../../../../scenarios/experiments/sba-vmerge.fit.toml"),
    ),
    (
        "pseries-ddw",
        include_str!("../../../../scenarios/experiments/pseries-ddw.fit.toml"),
    ),
];

/// The lock file of bundled experiment `name`, if it has one.
pub fn lock(name: &str) -> Option<&'static str> {
    LOCKS.iter().find(|(n, _)| *n == name).map(|(_, t)| *t)
}

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
/// scenario), rather than a workload scenario.
pub fn is_experiment_file(text: &str) -> bool {
    text.parse::<toml::Table>()
        .map(|t| t.contains_key("experiment") && t.contains_key("base"))
        .unwrap_or(false)
}

/// Why a scenario of published experiment `name`'s former schema (a top-level
/// `experiment = "NAME"` and that experiment's own fields) no longer runs, and what to run.
pub fn moved_to_experiment_file(name: &str) -> String {
    format!(
        "\"{name}\" has no scenario schema of its own any more: it runs from its experiment \
         file (`iolab reproduce {name}`; a modified copy of scenarios/experiments/{name}.toml \
         runs with `iolab reproduce FILE`, docs/EXPERIMENTS.md), and \
         `iolab reproduce {name} --emit-scenarios DIR` writes its cells as scenarios"
    )
}

/// Refuses `scenario` where one workload scenario is expected (`iolab run`, `iolab trace`, a
/// sweep's base) when it has a top-level `experiment` key: it is then an experiment file (a
/// table of scenarios, run by `iolab reproduce`) or a scenario of a published experiment's
/// former schema (that experiment now runs from its experiment file). The error names the
/// file and the `experiment` field and says what to run instead.
///
/// Text without the key, or not TOML at all, passes: the lab's own validation judges it.
pub fn refuse_experiment_key(scenario: &str, origin: &str) -> Result<(), InputError> {
    let Ok(table) = scenario.parse::<toml::Table>() else {
        return Ok(());
    };
    let Some(value) = table.get("experiment") else {
        return Ok(());
    };
    let problem = if is_experiment_file(scenario) {
        format!(
            "this is an experiment file (docs/EXPERIMENTS.md), a table of scenarios rather than \
             one: run it with `iolab reproduce {origin}`; `iolab reproduce {origin} \
             --emit-scenarios DIR` writes its cells as workload scenarios for `iolab run`"
        )
    } else {
        match value.as_str() {
            Some(name) if text(name).is_some() => moved_to_experiment_file(name),
            _ => format!(
                "a workload scenario has no `experiment` key (docs/SCENARIOS.md: [machine], \
                 [iommu], [[device]], [workload]); the published experiments are experiment \
                 files run by name with `iolab reproduce NAME`, NAME one of {}",
                super::all_names().join(", ")
            ),
        }
    };
    let doc = TomlDoc::parse(scenario, origin)?;
    Err(doc.field_error("experiment", problem))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(scenario: &str) -> String {
        match refuse_experiment_key(scenario, "x.toml") {
            Err(e @ InputError::Field { .. }) => e.to_string(),
            other => panic!("expected a field error, got {other:?}"),
        }
    }

    #[test]
    fn a_file_with_an_experiment_key_is_refused_as_a_workload_scenario_saying_what_runs() {
        // An experiment file: run it with reproduce, or write its cells out.
        let e = refused(text("smmuv3-cmdq").expect("bundled"));
        assert!(
            e.contains("x.toml") && e.contains("field `experiment`"),
            "{e}"
        );
        assert!(e.contains("iolab reproduce x.toml"), "{e}");
        assert!(e.contains("--emit-scenarios"), "{e}");
        // A published experiment's former schema: its experiment file now runs it.
        let e = refused("experiment = \"pseries-ddw\"\nruns = 1\n");
        assert!(e.contains("x.toml at line 1"), "{e}");
        assert!(e.contains("iolab reproduce pseries-ddw"), "{e}");
        assert!(e.contains("scenarios/experiments/pseries-ddw.toml"), "{e}");
        // Any other name or value: the names `iolab reproduce` knows.
        for bad in ["experiment = \"no-such\"\n", "experiment = 3\n"] {
            let e = refused(bad);
            assert!(e.contains("field `experiment`"), "{e}");
            assert!(e.contains("ipmmu-usb") && e.contains("protection"), "{e}");
        }
    }

    #[test]
    fn text_without_an_experiment_key_is_left_to_the_lab() {
        assert!(refuse_experiment_key("name = \"w\"\n[workload]\nkind = \"fio\"\n", "x").is_ok());
        assert!(refuse_experiment_key("not = toml = at all", "x").is_ok());
    }
}
