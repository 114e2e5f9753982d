//! Importers of real benchmark tools' outputs: each turns one output file into
//! [`Measurement`]s with the metric names the lab's own workloads use, so an imported run
//! compares with a lab run (and with another import) by configuration and metric name.
//!
//! - [`fio`]: `fio --output-format=json` or `json+` (several jobs, `group_reporting`);
//! - [`bonnie`]: bonnie++ CSV rows, 1.03 layout and 1.97/1.98 (bonnie++ 1.9x and 2.0x);
//! - [`reaim`]: the re-aim-7 results table.
//!
//! Every parser is a pure function from the file's text; a malformed or truncated file gives
//! one [`ImportError`] naming the line or field and what was expected.

pub mod bonnie;
pub mod fio;
pub mod reaim;

use iolab_sim::metrics::Measurement;

/// The tools whose outputs can be imported.
pub const TOOLS: [&str; 3] = ["fio", "bonnie", "reaim"];

/// Why a file could not be imported. Messages say where (line, field) and what was
/// expected; the caller adds the file name.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ImportError {
    /// The text is not valid JSON, or ends in the middle of it.
    #[error("line {line}, column {column}: {message}")]
    Json {
        /// 1-based line in the file.
        line: usize,
        /// 1-based column.
        column: usize,
        /// What is wrong.
        message: String,
    },
    /// A JSON field is missing or has the wrong type.
    #[error("field `{field}`: {expected}")]
    Field {
        /// Path of the field, e.g. `jobs[1].read.iops`.
        field: String,
        /// What was expected, and what was found.
        expected: String,
    },
    /// A line of a text format is malformed.
    #[error("line {line}: {expected}")]
    Line {
        /// 1-based line in the file.
        line: usize,
        /// What was expected, and what was found.
        expected: String,
    },
    /// One field (column) of a line is malformed.
    #[error("line {line}, field `{field}`: {expected}")]
    LineField {
        /// 1-based line in the file.
        line: usize,
        /// The column's name.
        field: String,
        /// What was expected, and what was found.
        expected: String,
    },
    /// The file holds nothing to import.
    #[error("{0}")]
    Empty(String),
}

/// Parses `text` as the output of `tool` (one of [`TOOLS`]).
pub fn parse(tool: &str, text: &str) -> Option<Result<Vec<Measurement>, ImportError>> {
    match tool {
        "fio" => Some(fio::parse(text)),
        "bonnie" => Some(bonnie::parse(text)),
        "reaim" => Some(reaim::parse(text)),
        _ => None,
    }
}

/// Gives configurations that occur more than once a `#k` suffix (k = 1, 2, ... in order),
/// so every configuration of a run is unique; unique names are kept as they are.
fn disambiguate(measurements: &mut [Measurement]) {
    let mut seen: std::collections::BTreeMap<String, usize> = Default::default();
    for m in measurements.iter() {
        *seen.entry(m.config.clone()).or_default() += 1;
    }
    let mut next: std::collections::BTreeMap<String, usize> = Default::default();
    for m in measurements.iter_mut() {
        if seen[&m.config] > 1 {
            let k = next.entry(m.config.clone()).or_default();
            *k += 1;
            m.config = format!("{}#{k}", m.config);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_configs_get_a_suffix_and_unique_ones_do_not() {
        let mut ms: Vec<Measurement> = ["a", "b", "a", "c", "a"]
            .iter()
            .map(|c| Measurement::new(*c))
            .collect();
        disambiguate(&mut ms);
        let names: Vec<&str> = ms.iter().map(|m| m.config.as_str()).collect();
        assert_eq!(names, ["a#1", "b", "a#2", "c", "a#3"]);
    }

    fn data(name: &str) -> String {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data")
            .join(name);
        std::fs::read_to_string(path).expect("test data")
    }

    /// Every prefix of a real output (a file cut anywhere) parses or fails cleanly; a fio
    /// document cut before its closing brace always fails.
    #[test]
    fn real_files_cut_anywhere_never_panic() {
        for (tool, file) in [
            ("fio", "fio-two-jobs.json"),
            ("fio", "fio-randread-grouped.jsonplus.json"),
            ("bonnie", "bonnie-2.00a-x2.csv"),
            ("bonnie", "bonnie-1.03-ipmmu-usb-iommu.csv"),
            ("reaim", "reaim-sba-vmerge-vmerge.txt"),
        ] {
            let text = data(file);
            assert!(parse(tool, &text).unwrap().is_ok(), "{file} parses whole");
            let last_brace = text.rfind('}').unwrap_or(0);
            let step = (text.len() / 400).max(1);
            for cut in (0..text.len()).step_by(step) {
                let result = parse(tool, &text[..cut]).unwrap();
                if tool == "fio" && cut <= last_brace {
                    assert!(result.is_err(), "{file} cut at {cut} must fail");
                }
            }
        }
    }

    #[test]
    fn unknown_tools_are_not_parsed() {
        assert!(parse("iozone", "").is_none());
        assert!(parse("fio", "").is_some());
    }
}
