//! Fuzzes the platform profile parser: any text gives a profile or a `CostError`, never a
//! panic; an accepted profile revalidates and yields a finite cost model.
#![no_main]

use iolab_sim::cost::PlatformProfile;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match PlatformProfile::from_toml_str(text, "fuzz.toml") {
        Ok(mut profile) => {
            profile
                .revalidate()
                .expect("an accepted profile must revalidate");
            for (path, cost) in profile.costs() {
                assert!(cost.ns().is_finite(), "cost {path} is not finite");
            }
            let _ = profile.cpu_cost_model();
            let _ = profile.markdown_table();
        }
        Err(e) => assert!(!e.to_string().is_empty()),
    }
});
