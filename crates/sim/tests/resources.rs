//! Spinlocks, sleeping locks and contended cache lines cost what the model says.

use std::cell::RefCell;
use std::rc::Rc;

use iolab_sim::accounting::{LineStats, LockStats};
use iolab_sim::resources::{
    CacheLine, LineParams, LockKind, SleepLock, SleepParams, SpinLock, SpinParams,
};
use iolab_sim::{Account, RunReport, Sim, SimConfig, SimDuration, SimTime};

fn ns(n: u64) -> SimDuration {
    SimDuration::ns(n)
}

const SPIN: SpinParams = SpinParams {
    acquire_ns: 20,
    release_ns: 5,
    handoff_ns: 70,
    kind: LockKind::Queued,
};

/// `k` CPUs each take the lock `iters` times, holding it `hold` ns and thinking `think` ns
/// between acquisitions.
fn hammer_spinlock(k: usize, iters: u32, hold: u64, think: u64) -> (RunReport, LockStats) {
    let mut s = Sim::new(SimConfig { cpus: k, seed: 3 }).unwrap();
    let lock = SpinLock::new(s.handle(), "l", SPIN).unwrap();
    for cpu in 0..k {
        let lock = lock.clone();
        s.spawn_on(cpu, move |ctx| async move {
            for _ in 0..iters {
                let g = lock.lock(&ctx).await;
                ctx.cpu().spend(ns(hold), Account::System).await;
                g.unlock().await;
                ctx.cpu().spend(ns(think), Account::User).await;
            }
        })
        .unwrap();
    }
    let r = s.run().unwrap();
    let st = r.spin_lock("l").unwrap().clone();
    (r, st)
}

#[test]
fn uncontended_spinlock_costs_only_acquire_and_release() {
    let (r, st) = hammer_spinlock(1, 10, 100, 0);
    let c = r.cpus[0];
    assert_eq!(c.spin, 0);
    assert_eq!(c.system, 10 * (SPIN.acquire_ns + 100 + SPIN.release_ns));
    assert_eq!(r.end.as_ns(), c.system);
    assert_eq!(st.acquisitions, 10);
    assert_eq!(st.contended, 0);
    assert_eq!((st.wait_total_ns, st.wait_max_ns), (0, 0));
    assert_eq!(st.hold_total_ns, 10 * 100);
}

#[test]
fn spinlock_waiting_and_spin_time_grow_with_contending_cpus() {
    let mut last: Option<(u64, f64)> = None;
    for k in [1usize, 2, 4, 8, 16] {
        let (r, st) = hammer_spinlock(k, 50, 200, 100);
        assert!(r.is_conserved());
        assert_eq!(st.acquisitions, 50 * k as u64);
        let spin = r.total.spin;
        let wait = st.mean_wait_ns();
        // Spinning is exactly the waiting, and it is all CPU time.
        assert_eq!(spin, st.wait_total_ns, "k={k}");
        if k == 1 {
            assert_eq!(spin, 0);
        }
        if let Some((s0, w0)) = last {
            assert!(spin > s0, "k={k}: spin {spin} <= {s0}");
            assert!(wait > w0, "k={k}: mean wait {wait} <= {w0}");
        }
        last = Some((spin, wait));
    }
}

#[test]
fn spinlock_hands_off_fifo_after_the_transfer_cost() {
    let mut s = Sim::new(SimConfig { cpus: 9, seed: 0 }).unwrap();
    let lock = SpinLock::new(s.handle(), "l", SPIN).unwrap();
    let order = Rc::new(RefCell::new(Vec::new()));
    let l0 = lock.clone();
    s.spawn_on(0, move |ctx| async move {
        let g = l0.lock(&ctx).await;
        ctx.cpu().spend(ns(10_000), Account::System).await;
        g.unlock().await;
    })
    .unwrap();
    // CPUs 1..=8 arrive in a scrambled order while CPU 0 holds the lock.
    let arrival = [5u64, 1, 7, 3, 8, 2, 6, 4];
    for (i, &a) in arrival.iter().enumerate() {
        let (lock, order) = (lock.clone(), order.clone());
        s.spawn_on(i + 1, move |ctx| async move {
            ctx.sleep(ns(a * 100)).await;
            let g = lock.lock(&ctx).await;
            order.borrow_mut().push((a, ctx.now().as_ns()));
            ctx.cpu().spend(ns(50), Account::System).await;
            g.unlock().await;
        })
        .unwrap();
    }
    let r = s.run().unwrap();
    let got = order.borrow().clone();
    let arrivals: Vec<u64> = got.iter().map(|x| x.0).collect();
    assert_eq!(arrivals, (1..=8).collect::<Vec<_>>(), "FIFO by arrival");
    // The first waiter gets it one transfer after the holder's release at 20 + 10_000.
    let release0 = SPIN.acquire_ns + 10_000;
    assert_eq!(got[0].1, release0 + SPIN.handoff_ns);
    // Each next one: previous grant + hold + one transfer.
    for w in got.windows(2) {
        assert_eq!(w[1].1, w[0].1 + 50 + SPIN.handoff_ns);
    }
    let st = r.spin_lock("l").unwrap();
    assert_eq!(st.contended, 8);
    assert_eq!(st.acquisitions, 9);
}

#[test]
fn sleeping_lock_waiters_do_not_spin_and_free_their_cpu() {
    let params = SleepParams {
        acquire_ns: 20,
        release_ns: 20,
        wakeup_ns: 2_000,
        wake_cost_ns: 500,
    };
    let mut s = Sim::new(SimConfig { cpus: 2, seed: 0 }).unwrap();
    let m = SleepLock::new(s.handle(), "m", params).unwrap();
    let got = Rc::new(RefCell::new(None));
    let m0 = m.clone();
    s.spawn_on(0, move |ctx| async move {
        let g = m0.lock(&ctx).await;
        ctx.cpu().spend(ns(10_000), Account::System).await;
        g.unlock().await;
    })
    .unwrap();
    let (m1, g1) = (m.clone(), got.clone());
    s.spawn_on(1, move |ctx| async move {
        ctx.sleep(ns(100)).await;
        let g = m1.lock(&ctx).await;
        *g1.borrow_mut() = Some(ctx.now());
        g.unlock().await;
    })
    .unwrap();
    // Another task on CPU 1 gets the CPU while the first one sleeps on the lock.
    s.spawn_on(1, |ctx| async move {
        ctx.sleep(ns(200)).await;
        ctx.cpu().spend(ns(3_000), Account::User).await;
    })
    .unwrap();
    let r = s.run().unwrap();
    assert_eq!(r.total.spin, 0);
    // Released at 20 + 10_000; the waiter runs wakeup_ns later.
    assert_eq!(*got.borrow(), Some(SimTime(10_020 + 2_000)));
    let c1 = r.cpus[1];
    assert_eq!(c1.user, 3_000);
    assert_eq!(c1.system, 20 + 20, "acquire + release only");
    // The releaser paid the wake-up.
    assert_eq!(r.cpus[0].system, 20 + 10_000 + 20 + 500);
    let st = r.sleep_lock("m").unwrap();
    assert_eq!((st.acquisitions, st.contended), (2, 1));
    assert_eq!(st.wait_max_ns, 12_020 - 120);
    assert!(r.is_conserved());
}

fn hammer_line(k: usize, ops: u32) -> LineStats {
    let mut s = Sim::new(SimConfig { cpus: k, seed: 0 }).unwrap();
    let line = CacheLine::new(s.handle(), "ctr", LineParams::default()).unwrap();
    for cpu in 0..k {
        let line = line.clone();
        s.spawn_on(cpu, move |ctx| async move {
            for _ in 0..ops {
                line.rmw(&ctx, Account::System).await;
                ctx.cpu().spend(ns(50), Account::User).await;
            }
        })
        .unwrap();
    }
    let r = s.run().unwrap();
    assert!(r.is_conserved());
    r.cache_line("ctr").unwrap().clone()
}

#[test]
fn same_cpu_rmw_costs_only_base() {
    let p = LineParams::default();
    let st = hammer_line(1, 100);
    assert_eq!(st.ops, 100);
    assert_eq!(st.transfers, 0);
    assert_eq!(st.total_ns, 100 * p.base_ns);
    assert_eq!(st.max_ns, p.base_ns);
}

#[test]
fn rmw_cost_grows_with_cpus_hammering_the_line() {
    let p = LineParams::default();
    let mut last = 0.0;
    for k in [1usize, 2, 4, 8, 16, 32] {
        let st = hammer_line(k, 100);
        let mean = st.mean_ns();
        assert!(mean > last, "k={k}: mean {mean} <= {last}");
        if k > 1 {
            assert!(mean >= (p.base_ns + p.transfer_ns) as f64 * 0.9, "k={k}");
        }
        last = mean;
    }
}

#[test]
fn simultaneous_rmws_serialise_in_arrival_order() {
    let p = LineParams::default();
    let mut s = Sim::new(SimConfig { cpus: 4, seed: 0 }).unwrap();
    let line = CacheLine::new(s.handle(), "x", p).unwrap();
    let costs = Rc::new(RefCell::new(Vec::new()));
    for cpu in 0..4 {
        let (line, costs) = (line.clone(), costs.clone());
        s.spawn_on(cpu, move |ctx| async move {
            let c = line.rmw(&ctx, Account::System).await.cost_ns;
            costs.borrow_mut().push((cpu, c, ctx.now().as_ns()));
        })
        .unwrap();
    }
    s.run().unwrap();
    let t = p.base_ns + p.transfer_ns;
    // The first access pays no transfer (the line was in no cache); each next one waits
    // for the previous and pays a transfer.
    assert_eq!(
        *costs.borrow(),
        vec![
            (0, p.base_ns, p.base_ns),
            (1, p.base_ns + t, p.base_ns + t),
            (2, p.base_ns + 2 * t, p.base_ns + 2 * t),
            (3, p.base_ns + 3 * t, p.base_ns + 3 * t),
        ]
    );
}
