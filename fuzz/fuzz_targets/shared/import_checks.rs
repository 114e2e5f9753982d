//! What every importer fuzz target checks: any text gives measurements or one
//! `ImportError` with a message, never a panic; an accepted file's configurations are named
//! (and unique where `unique_configs`) and its metric names are not empty.

use iolab::import::ImportError;
use iolab_sim::metrics::Measurement;

/// Runs `parse` on `data` (skipping bytes that are not UTF-8) and checks its outcome.
pub fn check_import(
    data: &[u8],
    unique_configs: bool,
    parse: impl FnOnce(&str) -> Result<Vec<Measurement>, ImportError>,
) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match parse(text) {
        Ok(measurements) => {
            let mut seen = std::collections::BTreeSet::new();
            for m in &measurements {
                assert!(!m.config.is_empty(), "a configuration without a name");
                if unique_configs {
                    assert!(
                        seen.insert(m.config.clone()),
                        "configuration {} twice",
                        m.config
                    );
                }
                for metric in &m.metrics {
                    assert!(
                        !metric.name.is_empty(),
                        "a metric without a name in {}",
                        m.config
                    );
                }
            }
        }
        Err(e) => assert!(!e.to_string().is_empty()),
    }
}
