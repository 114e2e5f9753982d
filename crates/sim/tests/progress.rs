//! A lab run observed for its progress reports its virtual time as it goes, and computes
//! exactly what an unobserved run computes.

mod common;

use std::cell::RefCell;
use std::rc::Rc;

const FIO: &str = include_str!("../../../scenarios/examples/fio-nvme-strict.toml");
const NETPERF: &str = include_str!("../../../scenarios/examples/netperf-pseries-ddw.toml");
const MAP_BENCH: &str = include_str!("../../../scenarios/examples/dma-map-benchmark-strict.toml");

#[test]
fn an_observed_run_reports_its_virtual_time_and_changes_nothing() {
    for scenario in [FIO, NETPERF, MAP_BENCH] {
        observed_run_reports_and_changes_nothing(scenario);
    }
}

fn observed_run_reports_and_changes_nothing(scenario: &'static str) {
    let plain = common::run(scenario);
    let seen = Rc::new(RefCell::new(Vec::new()));
    let s = seen.clone();
    let observed = iolab_sim::progress::observe(
        move |done, total| s.borrow_mut().push((done, total)),
        || common::run(scenario),
    );
    assert_eq!(plain.report.report_text, observed.report.report_text);
    let seen = seen.borrow();
    assert!(seen.len() >= 50, "{} reports", seen.len());
    let total = seen[0].1;
    assert!(seen.iter().all(|&(_, t)| t == total));
    assert!(
        seen.windows(2).all(|w| w[0].0 <= w[1].0),
        "done never goes back"
    );
    assert_eq!(seen.last().unwrap().0, total, "the last report is the end");
}
