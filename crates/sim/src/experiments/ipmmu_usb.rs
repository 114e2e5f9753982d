//! SEEDS.md experiment `ipmmu-usb` (being written).

use super::ExperimentError;
use crate::experiment::{ExperimentOptions, ExperimentReport};

/// The experiment's name.
pub const NAME: &str = "ipmmu-usb";

/// The bundled scenario.
pub const BUNDLED_SCENARIO: &str = include_str!("../../../../scenarios/ipmmu-usb.toml");

/// Runs a scenario file of this experiment.
pub fn run_scenario(
    _text: &str,
    _origin: &str,
    _options: &ExperimentOptions,
) -> Result<ExperimentReport, ExperimentError> {
    Err(ExperimentError::NotImplemented { name: NAME })
}
