//! Fuzzes the smmuv3-cmdq scenario parser: any text gives `Ok` or a bad-input error, never a
//! panic, never a run failure.
#![no_main]

use iolab_sim::experiments::smmuv3_cmdq;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Err(e) = smmuv3_cmdq::validate_scenario(text, "fuzz.toml") {
        assert!(
            e.is_bad_input(),
            "validation failed with a non-input error: {e}"
        );
        assert!(!e.to_string().is_empty());
    }
});
