//! Contention as cache-coherent hardware pays it: compare-and-swap loops whose failures come
//! from the interleaving of the CPUs' accesses, line costs that never fall as contenders are
//! added, transfers priced by the distance between CPUs, and spinlock hand-offs that grow
//! with the waiters for ticket and test-and-set locks but not for queued (MCS) ones.

use std::cell::RefCell;
use std::rc::Rc;

use iolab_sim::resources::{AtomicsAt, CacheLine, LineParams, LockKind, SpinLock, SpinParams};
use iolab_sim::{Account, Sim, SimConfig, SimDuration, Topology, TransferCosts};

const NEAR: LineParams = LineParams {
    base_ns: 8,
    transfer_ns: 120,
    atomics: AtomicsAt::Near,
};
const FAR: LineParams = LineParams {
    base_ns: 8,
    transfer_ns: 120,
    atomics: AtomicsAt::Far { service_ns: 20 },
};

/// What a closed loop of compare-and-swap reservations did.
#[derive(Debug, Default, Clone, Copy)]
struct CasLoop {
    /// Successful reservations by all CPUs.
    reservations: u64,
    /// Attempts by all CPUs.
    attempts: u64,
    /// Most attempts one reservation took.
    max_attempts: u64,
    /// Mean time from a reservation's read to its success, ns.
    mean_reserve_ns: f64,
}

/// `k` CPUs each reserve with the Linux loop (read the word, then compare-and-swap until
/// it succeeds), then `think` ns of other work, for `horizon` ns.
fn cas_loop(k: usize, params: LineParams, think: u64, horizon: u64) -> CasLoop {
    let mut s = Sim::new(SimConfig { cpus: k, seed: 1 }).unwrap();
    let line = CacheLine::new(s.handle(), "prod", params).unwrap();
    let out = Rc::new(RefCell::new((CasLoop::default(), 0u64)));
    for cpu in 0..k {
        let (line, out) = (line.clone(), out.clone());
        s.spawn_on(cpu, move |ctx| async move {
            while ctx.now().as_ns() < horizon {
                let t0 = ctx.now().as_ns();
                let mut seen = line.read(&ctx, Account::System).await.version;
                let mut attempts = 0u64;
                loop {
                    let a = line.cas(&ctx, Account::System, seen).await;
                    attempts += u64::from(a.attempts);
                    if a.succeeded {
                        break;
                    }
                    seen = a.version;
                }
                {
                    let mut o = out.borrow_mut();
                    o.0.reservations += 1;
                    o.0.attempts += attempts;
                    o.0.max_attempts = o.0.max_attempts.max(attempts);
                    o.1 += ctx.now().as_ns() - t0;
                }
                ctx.cpu()
                    .spend(SimDuration::ns(think), Account::System)
                    .await;
            }
        })
        .unwrap();
    }
    let r = s.run().unwrap();
    assert!(r.is_conserved());
    let stats = r.cache_line("prod").unwrap();
    let (mut l, total) = *out.borrow();
    assert_eq!(
        stats.cas_attempts, l.attempts,
        "the line counts every attempt"
    );
    assert_eq!(stats.cas_failures, l.attempts - l.reservations);
    l.mean_reserve_ns = total as f64 / l.reservations as f64;
    l
}

#[test]
fn one_contender_never_fails_a_compare_and_swap() {
    for params in [NEAR, FAR] {
        let l = cas_loop(1, params, 100, 200_000);
        assert!(l.reservations > 100, "{l:?}");
        assert_eq!(l.attempts, l.reservations, "{params:?}: {l:?}");
        assert_eq!(l.max_attempts, 1);
    }
}

#[test]
fn far_compare_and_swap_failures_grow_with_contenders_without_a_cap() {
    let mut last_rate = 1.0;
    for k in [2usize, 4, 8, 16, 32, 64] {
        let l = cas_loop(k, FAR, 200, 400_000);
        let success_rate = l.reservations as f64 / l.attempts as f64;
        assert!(
            success_rate <= last_rate + 1e-9,
            "k={k}: success rate {success_rate} rose from {last_rate}"
        );
        last_rate = success_rate;
        if k >= 16 {
            // Retries come from the interleaving: some reservations fail many times.
            assert!(l.max_attempts > 4, "k={k}: {l:?}");
        }
    }
    // With 64 CPUs hammering one word, most attempts fail.
    assert!(last_rate < 0.25, "{last_rate}");
}

#[test]
fn a_near_retry_within_the_hold_succeeds_and_one_outside_waits_its_turn() {
    // Within the hold (base < transfer / 2): a failed compare's retry finds the line still
    // in the CPU's cache, so no reservation takes more than two attempts.
    let l = cas_loop(32, NEAR, 200, 400_000);
    assert!(l.attempts > l.reservations, "contended: {l:?}");
    assert_eq!(l.max_attempts, 2, "{l:?}");
    // A slow retry (an atomic longer than half a transfer) loses the line to the queue.
    let slow = LineParams {
        base_ns: 70,
        ..NEAR
    };
    let l = cas_loop(32, slow, 200, 400_000);
    assert!(l.max_attempts > 2, "{l:?}");
}

#[test]
fn a_shared_line_never_gets_faster_as_contenders_are_added() {
    for params in [NEAR, FAR] {
        let mut last = 0.0;
        for k in [1usize, 2, 4, 8, 16, 32, 64] {
            let l = cas_loop(k, params, 300, 300_000);
            assert!(
                l.mean_reserve_ns >= last,
                "{params:?} k={k}: {} ns < {last} ns",
                l.mean_reserve_ns
            );
            last = l.mean_reserve_ns;
        }
    }
}

#[test]
fn transfers_cost_the_distance_between_the_cpus() {
    let costs = TransferCosts {
        same_cluster_ns: 30,
        same_die_ns: 40,
        other_die_ns: 80,
        other_socket_ns: 160,
    };
    // CPU 0 takes the line, then CPU `to` takes it: the second access pays the transfer at
    // their distance.
    for (to, want) in [(1usize, 30u64), (5, 40), (33, 80), (65, 160)] {
        let mut s = Sim::new(SimConfig { cpus: 128, seed: 1 }).unwrap();
        s.handle().set_topology(Topology::new(4, 8, 2, costs));
        let line = CacheLine::new(s.handle(), "x", NEAR).unwrap();
        let got = Rc::new(RefCell::new(0));
        let l0 = line.clone();
        s.spawn_on(0, move |ctx| async move {
            l0.rmw(&ctx, Account::System).await;
        })
        .unwrap();
        let g = got.clone();
        s.spawn_on(to, move |ctx| async move {
            ctx.sleep(SimDuration::ns(1_000)).await;
            *g.borrow_mut() = line.rmw(&ctx, Account::System).await.cost_ns;
        })
        .unwrap();
        s.run().unwrap();
        assert_eq!(*got.borrow(), NEAR.base_ns + want, "CPU 0 -> CPU {to}");
    }
}

/// The mean hand-off of a spinlock of `kind` with `waiters` CPUs waiting: every CPU takes
/// the lock in turn, holding it 500 ns, so all but the holder wait; the hand-off is the
/// time from one release to the next holder's acquisition.
fn mean_handoff(kind: LockKind, waiters: usize) -> f64 {
    let k = waiters + 1;
    let params = SpinParams {
        acquire_ns: 20,
        release_ns: 0,
        handoff_ns: 100,
        kind,
    };
    let iters = 20u64;
    let hold = 500u64;
    let mut s = Sim::new(SimConfig { cpus: k, seed: 1 }).unwrap();
    let lock = SpinLock::new(s.handle(), "l", params).unwrap();
    for cpu in 0..k {
        let lock = lock.clone();
        s.spawn_on(cpu, move |ctx| async move {
            for _ in 0..iters {
                let g = lock.lock(&ctx).await;
                ctx.cpu()
                    .spend(SimDuration::ns(hold), Account::System)
                    .await;
                g.unlock().await;
            }
        })
        .unwrap();
    }
    let r = s.run().unwrap();
    let acquisitions = k as u64 * iters;
    // The lock is busy from the first acquisition (after its 20 ns) to the end: every
    // acquisition's hold plus every hand-off but the few at the edges.
    let busy = r.end.as_ns() - 20 - acquisitions * hold;
    busy as f64 / (acquisitions - 1) as f64
}

#[test]
fn a_queued_handoff_costs_the_same_with_2_or_64_waiters_where_ticket_and_test_and_set_grow() {
    let (q2, q64) = (
        mean_handoff(LockKind::Queued, 2),
        mean_handoff(LockKind::Queued, 64),
    );
    let (t2, t64) = (
        mean_handoff(LockKind::Ticket, 2),
        mean_handoff(LockKind::Ticket, 64),
    );
    let (s2, s64) = (
        mean_handoff(LockKind::TestAndSet, 2),
        mean_handoff(LockKind::TestAndSet, 64),
    );
    assert!((q64 - q2).abs() < 0.05 * q2, "queued {q2} vs {q64}");
    assert!(t64 > 10.0 * t2, "ticket {t2} vs {t64}");
    assert!(s64 > 1.5 * t64, "test-and-set {s64} vs ticket {t64}");
    assert!(s2 >= q2 && t2 >= q2);
}

#[test]
fn handoff_formula_by_kind() {
    assert_eq!(LockKind::Queued.handoff_ns(64, 50), 100);
    assert_eq!(LockKind::Ticket.handoff_ns(1, 50), 100);
    assert_eq!(LockKind::Ticket.handoff_ns(5, 50), 100 + 4 * 25);
    assert_eq!(LockKind::TestAndSet.handoff_ns(5, 50), 100 + 4 * 50);
}
