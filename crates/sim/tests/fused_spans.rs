//! Fused spans (`Cpu::defer`): deferred CPU time is charged by the task's next spend as one
//! span, each part to its account. A run with fused spans charges every CPU exactly what
//! the same run with separate spends charges, at every instant a report is cut (also in
//! the middle of a fused span), ends at the same time and takes fewer events.

use std::cell::RefCell;
use std::rc::Rc;

use iolab_sim::engine::{Sim, SimConfig, SimDuration, SimTime};
use iolab_sim::{Account, RunReport};

/// CPU 0 runs user 300 ns, system 200 ns, user 50 ns, then system 100 ns (deferred and
/// fused, or four spends), three times, with a sleep between; CPU 1 spends 70 ns at a
/// time, so that other events fall inside CPU 0's spans. Returns the reports cut every
/// 10 ns, the final report and the local times CPU 0's task saw.
fn run(fused: bool) -> (Vec<RunReport>, RunReport, Vec<u64>) {
    let mut sim = Sim::new(SimConfig { cpus: 2, seed: 3 }).unwrap();
    let seen = Rc::new(RefCell::new(Vec::new()));
    let log = seen.clone();
    sim.spawn_on(0, move |ctx| async move {
        let parts = [
            (300, Account::User),
            (200, Account::System),
            (50, Account::User),
        ];
        for _ in 0..3 {
            for (ns, a) in parts {
                if fused {
                    ctx.cpu().defer(SimDuration::ns(ns), a);
                } else {
                    ctx.cpu().spend(SimDuration::ns(ns), a).await;
                }
            }
            log.borrow_mut().push(ctx.local_now().as_ns());
            ctx.cpu().spend(SimDuration::ns(100), Account::System).await;
            log.borrow_mut().push(ctx.now().as_ns());
            ctx.sleep(SimDuration::ns(130)).await;
        }
    })
    .unwrap();
    sim.spawn_on(1, |ctx| async move {
        for _ in 0..30 {
            ctx.cpu().spend(SimDuration::ns(70), Account::System).await;
        }
    })
    .unwrap();
    let mut cuts = Vec::new();
    for t in (10..2_000).step_by(10) {
        cuts.push(sim.run_until(SimTime::from_ns(t)).unwrap());
    }
    let end = sim.run().unwrap();
    let seen = seen.borrow().clone();
    (cuts, end, seen)
}

#[test]
fn a_fused_span_charges_each_part_to_its_account_at_every_cut() {
    let (cuts_f, end_f, seen_f) = run(true);
    let (cuts_s, end_s, seen_s) = run(false);
    assert_eq!(seen_f, seen_s, "local times before and after the spends");
    assert_eq!(seen_f[..2], [550, 650]);
    for (f, s) in cuts_f.iter().zip(&cuts_s) {
        assert_eq!(f.end, s.end);
        assert_eq!(f.cpus, s.cpus, "CPU times at {:?}", f.end);
        assert!(f.is_conserved());
    }
    assert_eq!(end_f.end, end_s.end);
    assert_eq!(end_f.cpus, end_s.cpus);
    assert_eq!(end_f.cpus[0].user, 3 * 350);
    assert_eq!(end_f.cpus[0].system, 3 * 300);
    // Three wake-ups fewer per round (the deferred parts' ends).
    assert_eq!(end_s.events - end_f.events, 9);
}

#[test]
fn a_zero_spend_charges_deferred_time_and_a_lone_fused_span_takes_the_shortcut() {
    let mut sim = Sim::new(SimConfig { cpus: 1, seed: 1 }).unwrap();
    sim.spawn_on(0, |ctx| async move {
        ctx.cpu().defer(SimDuration::ns(40), Account::User);
        ctx.cpu().defer(SimDuration::ZERO, Account::Spin);
        ctx.cpu().defer(SimDuration::ns(60), Account::User);
        assert_eq!(ctx.local_now().as_ns(), 100);
        assert_eq!(ctx.now().as_ns(), 0);
        assert_eq!(ctx.deferred(), SimDuration::ns(100));
        ctx.cpu().spend(SimDuration::ZERO, Account::System).await;
        assert_eq!(ctx.now().as_ns(), 100);
        assert_eq!(ctx.local_now().as_ns(), 100);
        assert_eq!(ctx.deferred(), SimDuration::ZERO);
    })
    .unwrap();
    let r = sim.run().unwrap();
    assert_eq!(r.end, SimTime::from_ns(100));
    assert_eq!(r.cpus[0].user, 100);
    assert_eq!(r.cpus[0].system, 0);
    assert!(r.is_conserved());
}
