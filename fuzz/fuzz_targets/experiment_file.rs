//! Fuzzes the experiment-file parser (`iolab_sim::reproduce::Experiment::parse`, what
//! `iolab reproduce FILE` checks before any cell runs: the file's own structure, then every
//! cell's scenario through the lab's validation): any text gives an experiment or a
//! bad-input error naming what was wrong, never a panic and never a run failure. Platforms
//! are the bundled profiles only (the origin has no directory, so no file is read).
#![no_main]

use iolab_sim::reproduce::Experiment;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Err(e) = Experiment::parse(text, "fuzz.toml") {
        assert!(
            e.is_bad_input(),
            "parsing failed with a non-input error: {e}"
        );
        assert!(!e.to_string().is_empty());
    }
});
