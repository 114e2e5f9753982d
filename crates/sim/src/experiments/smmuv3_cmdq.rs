//! SEEDS.md experiment `smmuv3-cmdq` (being written).

use super::ExperimentError;
use crate::experiment::{ExperimentOptions, ExperimentReport};

/// The experiment's name.
pub const NAME: &str = "smmuv3-cmdq";

/// The bundled scenario.
pub const BUNDLED_SCENARIO: &str = include_str!("../../../../scenarios/smmuv3-cmdq.toml");

/// Runs a scenario file of this experiment.
pub fn run_scenario(
    _text: &str,
    _origin: &str,
    _options: &ExperimentOptions,
) -> Result<ExperimentReport, ExperimentError> {
    Err(ExperimentError::NotImplemented { name: NAME })
}
