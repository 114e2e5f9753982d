//! `iolab report` (in progress).
use std::path::Path;
use std::process::ExitCode;

/// Writes the report.
pub fn run(_db: &Path, _runs: &[String], _output: &Path, _svg: Option<&Path>) -> ExitCode {
    ExitCode::from(1)
}
