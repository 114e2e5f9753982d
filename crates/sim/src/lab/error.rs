//! The lab's error type: why a workload scenario could not be read or run.

use crate::cost::CostError;
use crate::engine::SimError;
use crate::iommu::cmdq::CmdqError;
use crate::tomlfile::InputError;

/// Why a workload scenario could not be validated or run.
///
/// [`LabError::is_bad_input`] tells the user's mistakes (a malformed scenario, an impossible
/// parameter, an unknown profile: exit code 2 in the CLI) from failures of a run (exit 1).
#[derive(Debug, thiserror::Error)]
pub enum LabError {
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
}

impl LabError {
    /// Whether the error is the user's input (exit code 2) rather than a run failure (1).
    pub fn is_bad_input(&self) -> bool {
        matches!(self, Self::Input(_) | Self::Cost(_))
    }
}

impl From<CmdqError> for LabError {
    fn from(e: CmdqError) -> Self {
        match e {
            CmdqError::Cost(e) => Self::Cost(e),
            CmdqError::Sim(e) => Self::Sim(e),
        }
    }
}
