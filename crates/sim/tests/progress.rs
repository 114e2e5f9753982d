//! A lab run observed for its progress reports how far it has come as it goes (fio, netperf
//! and `dma_map_benchmark` their virtual time, bonnie its phases, re-aim its children), and
//! computes exactly what an unobserved run computes.

mod common;

use std::cell::RefCell;
use std::rc::Rc;

const FIO: &str = include_str!("../../../scenarios/examples/fio-nvme-strict.toml");
const NETPERF: &str = include_str!("../../../scenarios/examples/netperf-pseries-ddw.toml");
const MAP_BENCH: &str = include_str!("../../../scenarios/examples/dma-map-benchmark-strict.toml");
const BONNIE: &str = include_str!("../../../scenarios/examples/bonnie-scsi-off.toml");
const REAIM: &str = include_str!("../../../scenarios/examples/reaim-scsi-off.toml");

use iolab_sim::progress::Measure;

#[test]
fn an_observed_run_reports_its_virtual_time_and_changes_nothing() {
    for scenario in [FIO, NETPERF, MAP_BENCH] {
        observed_run_reports_and_changes_nothing(scenario, Measure::VirtualTime, 50);
    }
}

#[test]
fn bonnie_reports_its_phases_and_re_aim_its_children() {
    observed_run_reports_and_changes_nothing(BONNIE, Measure::Work("bonnie's phases"), 50);
    observed_run_reports_and_changes_nothing(REAIM, Measure::Work("re-aim's children"), 4);
}

fn observed_run_reports_and_changes_nothing(
    scenario: &'static str,
    measure: Measure,
    least: usize,
) {
    let plain = common::run(scenario);
    let seen = Rc::new(RefCell::new(Vec::new()));
    let s = seen.clone();
    let observed = iolab_sim::progress::observe(
        move |done, total, m| s.borrow_mut().push((done, total, m)),
        || common::run(scenario),
    );
    assert_eq!(plain.report.report_text, observed.report.report_text);
    assert_eq!(
        serde_json::to_string(&plain.report.measurements).unwrap(),
        serde_json::to_string(&observed.report.measurements).unwrap()
    );
    let seen: Vec<(u64, u64)> = seen
        .borrow()
        .iter()
        .map(|&(d, t, m)| {
            assert_eq!(m, measure);
            (d, t)
        })
        .collect();
    assert!(seen.len() >= least, "{} reports", seen.len());
    let total = seen[0].1;
    assert!(seen.iter().all(|&(_, t)| t == total));
    assert!(
        seen.windows(2).all(|w| w[0].0 <= w[1].0),
        "done never goes back"
    );
    assert_eq!(seen.last().unwrap().0, total, "the last report is the end");
}
