//! SEEDS.md experiment `sba-vmerge` (being written).

use super::ExperimentError;
use crate::experiment::{ExperimentOptions, ExperimentReport};

/// The experiment's name.
pub const NAME: &str = "sba-vmerge";

/// The bundled scenario.
pub const BUNDLED_SCENARIO: &str = include_str!("../../../../scenarios/sba-vmerge.toml");

/// Runs a scenario file of this experiment.
pub fn run_scenario(
    _text: &str,
    _origin: &str,
    _options: &ExperimentOptions,
) -> Result<ExperimentReport, ExperimentError> {
    Err(ExperimentError::NotImplemented { name: NAME })
}
