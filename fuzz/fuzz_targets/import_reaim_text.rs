//! Fuzzes the importer of the re-aim-7 results table (`iolab::import::reaim::parse`): any text gives measurements or one
//! `ImportError`, never a panic. An accepted file's configurations are unique and named, and
//! its metric names are not empty.
#![no_main]

use iolab::import::{reaim, ImportError};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match reaim::parse(text) {
        Ok(measurements) => {
            let mut seen = std::collections::BTreeSet::new();
            for m in &measurements {
                assert!(!m.config.is_empty(), "a configuration without a name");
                assert!(seen.insert(m.config.clone()), "configuration {} twice", m.config);
                for metric in &m.metrics {
                    assert!(!metric.name.is_empty(), "a metric without a name in {}", m.config);
                }
            }
        }
        Err(e) => {
            let e: ImportError = e;
            assert!(!e.to_string().is_empty());
        }
    }
});
