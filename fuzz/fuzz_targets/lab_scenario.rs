//! Fuzzes the lab's workload-scenario validation (`iolab_sim::lab::validate`, what
//! `iolab run` checks before anything runs): any text gives a scenario or a bad-input error
//! naming what was wrong, never a panic and never a run failure. Platforms are the bundled
//! profiles only (no base directory, so no file is read).
#![no_main]

use iolab_sim::lab;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Err(e) = lab::validate(text, "fuzz.toml", None) {
        assert!(
            e.is_bad_input(),
            "validation failed with a non-input error: {e}"
        );
        assert!(!e.to_string().is_empty());
    }
});
