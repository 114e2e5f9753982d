//! The bundled lock files are the fit: refitting each bundled experiment's declared unknowns
//! (calibrations with a `range`) gives exactly the values its `NAME.fit.toml` holds. When a
//! mechanism moves the figures, this fails until `iolab reproduce --refit NAME` is run.

use iolab_sim::reproduce::{bundled, refit, Experiment, FitLock};

#[test]
fn every_bundled_lock_file_holds_the_current_fit() {
    let mut checked = 0;
    for name in bundled::names() {
        let Some(lock_text) = bundled::lock(name) else {
            continue;
        };
        let stored: FitLock = toml::from_str(lock_text).expect("a bundled lock parses");
        let exp = Experiment::parse(bundled::text(name).unwrap(), &bundled::origin(name))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let jobs = std::thread::available_parallelism().map_or(1, |n| n.get());
        let fresh = refit::refit(&exp, stored.seed, jobs, None)
            .unwrap_or_else(|e| panic!("{name}: {e}"))
            .expect("a lock file means declared unknowns");
        assert_eq!(
            fresh.lock, stored,
            "{name}: the bundled lock is no longer the fit: run `iolab reproduce --refit {name}` from the repository root"
        );
        // The lock's values are the ones a run uses.
        assert_eq!(
            exp.fitted_values().expect("every unknown has its value"),
            stored
                .fitted
                .iter()
                .map(|l| (l.calibration, l.value))
                .collect::<Vec<_>>()
        );
        checked += 1;
    }
    assert!(checked >= 1, "no bundled experiment declares unknowns");
}

#[test]
fn every_bundled_calibration_with_a_number_is_a_declared_unknown_or_says_why_not() {
    for name in bundled::names() {
        let exp = Experiment::parse(bundled::text(name).unwrap(), &bundled::origin(name)).unwrap();
        for (i, c) in exp.file.calibrations.iter().enumerate() {
            if c.range.is_some() || c.numeric_value().is_nan() {
                continue;
            }
            // A given number is a value taken over from its source, never fitted by hand.
            assert!(
                c.source.contains("taken over") || c.source.contains("as published"),
                "{name}: calibrations[{i}] ({}) carries a hand-typed value: declare its range instead",
                c.parameter()
            );
        }
    }
}

/// The lab's bonnie++ and USB defaults are the ipmmu-usb experiment's fit (their sources say
/// so): a refit that moves the fit fails here until the defaults follow it.
#[test]
fn the_bonnie_and_usb_defaults_are_the_ipmmu_usb_fit() {
    use iolab_sim::lab::defaults as d;
    let lock: FitLock = toml::from_str(bundled::lock("ipmmu-usb").unwrap()).unwrap();
    let fitted = |p: &str| {
        lock.fitted
            .iter()
            .find(|l| l.parameter == p)
            .map(|l| l.value)
            .unwrap_or_else(|| panic!("no fitted {p}"))
    };
    assert_eq!(
        d::BONNIE_PUTC_NS_PER_BYTE.0,
        fitted("workload.putc_ns_per_byte")
    );
    assert_eq!(
        d::BONNIE_GETC_NS_PER_BYTE.0,
        fitted("workload.getc_ns_per_byte")
    );
    assert_eq!(
        d::BONNIE_WRITE_PAGE_NS.0 as f64,
        fitted("workload.write_page_ns")
    );
    assert_eq!(
        d::BONNIE_READ_PAGE_NS.0 as f64,
        fitted("workload.read_page_ns")
    );
    assert_eq!(
        d::USB_SUPERSPEED.protocol_efficiency.0,
        fitted("device[0].protocol_efficiency")
    );
    assert_eq!(
        d::USB_COMMAND_OVERHEAD_NS.0 as f64,
        fitted("device[0].command_overhead_ns")
    );
}
