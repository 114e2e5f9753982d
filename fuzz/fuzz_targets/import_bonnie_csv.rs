//! Fuzzes the importer of bonnie++ CSV rows (`iolab::import::bonnie::parse`): any text gives measurements or one
//! `ImportError`, never a panic. An accepted file's configurations are named and its metric
//! names are not empty. (Rows with the same machine name are repetitions, `-x N`: the CLI
//! stores them as runs of one group, so configurations may repeat here.)
#![no_main]

use iolab::import::{bonnie, ImportError};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match bonnie::parse(text) {
        Ok(measurements) => {
            for m in &measurements {
                assert!(!m.config.is_empty(), "a configuration without a name");
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
