//! A run is a pure function of its scenario and seed.

use std::cell::RefCell;
use std::rc::Rc;

use iolab_sim::engine::{Channel, Completion};
use iolab_sim::resources::{CacheLine, LineParams, SleepLock, SleepParams, SpinLock, SpinParams};
use iolab_sim::{Account, RunReport, Sim, SimConfig, SimDuration};

/// A busy little machine: 16 CPUs, 48 threads submitting I/O to a device agent through a
/// queue, with random service times, a spinlock, a sleeping lock and a shared counter.
/// Returns the report and a trace of every completion (who, when, what).
fn scenario(seed: u64) -> (RunReport, Vec<(u32, u64, u64)>) {
    let mut s = Sim::new(SimConfig { cpus: 16, seed }).unwrap();
    let h = s.handle().clone();
    let spin = SpinLock::new(&h, "queue_lock", SpinParams::default()).unwrap();
    let mutex = SleepLock::new(&h, "config_mutex", SleepParams::default()).unwrap();
    let ctr = CacheLine::new(&h, "stats_counter", LineParams::default()).unwrap();
    let sq: Channel<(u32, Completion<(u32, u64)>)> = Channel::new(&h, 1024);
    let trace = Rc::new(RefCell::new(Vec::new()));

    // The device: one request at a time, random service time.
    let dev_q = sq.clone();
    s.spawn_agent(move |ctx| async move {
        loop {
            let (id, done) = dev_q.recv(&ctx).await;
            let service = ctx.rng().exponential(3_000) + 500;
            let at = ctx.now() + SimDuration::ns(service);
            done.fire_at(at, (id, service)).unwrap();
        }
    })
    .unwrap();

    for t in 0..48u32 {
        let (spin, mutex, ctr, sq, trace, h) = (
            spin.clone(),
            mutex.clone(),
            ctr.clone(),
            sq.clone(),
            trace.clone(),
            h.clone(),
        );
        s.spawn_on(t as usize % 16, move |ctx| async move {
            for i in 0..40u32 {
                let work = ctx.rng().jitter(2_000, 50);
                ctx.cpu().spend(SimDuration::ns(work), Account::User).await;
                let g = spin.lock(&ctx).await;
                let hold = ctx.rng().range_inclusive(50, 400);
                ctx.cpu()
                    .spend(SimDuration::ns(hold), Account::System)
                    .await;
                g.unlock().await;
                ctr.rmw(&ctx, Account::System).await;
                if ctx.rng().below(10) == 0 {
                    let g = mutex.lock(&ctx).await;
                    ctx.cpu().spend(SimDuration::us(1), Account::System).await;
                    g.unlock().await;
                }
                let done = Completion::new(&h);
                sq.send((t * 1000 + i, done.clone())).unwrap();
                let (id, v) = done.wait(&ctx).await;
                assert_eq!(id, t * 1000 + i);
                trace.borrow_mut().push((t, ctx.now().as_ns(), v));
            }
        })
        .unwrap();
    }
    let r = s.run().unwrap();
    let tr = trace.borrow().clone();
    (r, tr)
}

#[test]
fn same_seed_gives_identical_results() {
    let (a, ta) = scenario(42);
    let (b, tb) = scenario(42);
    assert_eq!(format!("{a:?}"), format!("{b:?}"));
    assert_eq!(
        serde_json::to_string(&a).unwrap(),
        serde_json::to_string(&b).unwrap()
    );
    assert_eq!(ta, tb);
    assert!(a.is_conserved());
    assert_eq!(a.tasks.finished, 48);
    assert!(a.spin_lock("queue_lock").unwrap().contended > 0);
    assert!(a.total.spin > 0);
}

#[test]
fn different_seed_gives_different_results() {
    let (a, ta) = scenario(42);
    let (b, tb) = scenario(43);
    assert_ne!(format!("{a:?}"), format!("{b:?}"));
    assert_ne!(ta, tb);
    assert!(b.is_conserved());
}
