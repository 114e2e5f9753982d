//! The published experiments of SEEDS.md still run by programs of their own (the others are
//! experiment files, [`crate::reproduce`]; [`crate::reproduce::default_names`] lists all of
//! them in order).
//!
//! Each module owns its scenario file (bundled from `scenarios/`), its published figures
//! (yardsticks only: no model reads them), its runs and its report in the original format.
//! Every module exposes the same three items:
//!
//! - `NAME`: the name `iolab reproduce` knows it by;
//! - `BUNDLED_SCENARIO`: the scenario text compiled into the binary;
//! - `run_scenario(text, origin, options)`: runs a scenario file of that experiment's schema
//!   (the bundled one, or a user's modified copy) and returns its report.
//!
//! A published experiment that runs from its experiment file only (`sba-vmerge`:
//! scenarios/experiments/, [`crate::reproduce`]) keeps its name in [`NAMES`] and has no module.

use crate::cost::CostError;
use crate::experiment::{ExperimentOptions, ExperimentReport};
use crate::tomlfile::InputError;
use crate::SimError;

/// Why an experiment could not produce its report.
#[derive(Debug, thiserror::Error)]
pub enum ExperimentError {
    /// No experiment has this name.
    #[error("Unknown experiment `{name}`: expected one of {}", crate::reproduce::all_names().join(", "))]
    UnknownName {
        /// The name asked for.
        name: String,
    },
    /// The scenario file is malformed or names something impossible.
    #[error(transparent)]
    Input(#[from] InputError),
    /// The platform profile is malformed or lacks a group the scenario needs.
    #[error(transparent)]
    Cost(#[from] CostError),
    /// The simulation failed (a cap was exceeded, a model refused an operation).
    #[error("Simulation failed: {0}")]
    Sim(#[from] SimError),
    /// A model of the stack refused an operation the workload needed.
    #[error("Model error: {0}")]
    Model(String),
    /// The experiment runs from its experiment file only: it has no scenario schema of its own.
    #[error("Experiment `{name}` runs from its experiment file scenarios/experiments/{name}.toml (`iolab reproduce {name}`, docs/EXPERIMENTS.md): it has no scenario file of its own")]
    DataFileOnly {
        /// The experiment.
        name: String,
    },
    /// The experiment is not implemented yet.
    #[error("Experiment `{name}` is not implemented yet")]
    NotImplemented {
        /// The experiment.
        name: &'static str,
    },
}

impl From<crate::cmdq::CmdqError> for ExperimentError {
    fn from(e: crate::cmdq::CmdqError) -> Self {
        match e {
            crate::cmdq::CmdqError::Cost(e) => Self::Cost(e),
            crate::cmdq::CmdqError::Sim(e) => Self::Sim(e),
        }
    }
}

impl ExperimentError {
    /// Whether the error is the user's input (exit code 2) rather than a run failure (1).
    pub fn is_bad_input(&self) -> bool {
        matches!(
            self,
            Self::UnknownName { .. } | Self::DataFileOnly { .. } | Self::Input(_) | Self::Cost(_)
        )
    }
}

/// Published experiments `iolab reproduce` runs through a module of their own: none, every
/// published experiment is an experiment file (`crate::reproduce::bundled`; the order is
/// [`crate::reproduce::PUBLISHED_ORDER`]).
pub const NAMES: [&str; 0] = [];

/// The error for a name no module here runs: an experiment file's, or unknown.
fn not_a_module(name: &str) -> ExperimentError {
    if crate::reproduce::bundled::text(name).is_some() {
        ExperimentError::DataFileOnly {
            name: name.to_owned(),
        }
    } else {
        ExperimentError::UnknownName {
            name: name.to_owned(),
        }
    }
}

/// Whether `name` is an experiment a module here runs.
pub fn is_known(name: &str) -> bool {
    NAMES.contains(&name)
}

/// Every experiment name run by a module of its own, published first.
pub fn all_names() -> String {
    NAMES.to_vec().join(", ")
}

/// The bundled scenario text of experiment `name`.
pub fn bundled_scenario(name: &str) -> Result<&'static str, ExperimentError> {
    Err(not_a_module(name))
}

/// Runs a scenario file of experiment `name`.
pub fn run_scenario(
    name: &str,
    text: &str,
    origin: &str,
    options: &ExperimentOptions,
) -> Result<ExperimentReport, ExperimentError> {
    let _ = (text, origin, options);
    Err(not_a_module(name))
}

/// Runs experiment `name` on its bundled scenario.
pub fn run_bundled(
    name: &str,
    options: &ExperimentOptions,
) -> Result<ExperimentReport, ExperimentError> {
    let text = bundled_scenario(name)?;
    run_scenario(
        name,
        text,
        &format!("scenarios/{name}.toml (bundled)"),
        options,
    )
}
