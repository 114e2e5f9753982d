//! A lock taken from an agent (a task without a CPU) is an error value from the run, not a
//! panic; the lock and the tasks on CPUs are unaffected until the run stops.

use iolab_sim::resources::{SleepLock, SleepParams, SpinLock, SpinParams};
use iolab_sim::{Account, Sim, SimConfig, SimDuration, SimError, SimTime};

#[test]
fn spinlock_from_an_agent_stops_the_run_with_an_error() {
    let mut s = Sim::new(SimConfig { cpus: 2, seed: 1 }).unwrap();
    let lock = SpinLock::new(s.handle(), "l", SpinParams::default()).unwrap();
    let l2 = lock.clone();
    let agent = s
        .spawn_agent(move |ctx| async move {
            ctx.sleep(SimDuration::ns(100)).await;
            let g = l2.lock(&ctx).await;
            drop(g);
        })
        .unwrap();
    let err = s.run().unwrap_err();
    assert_eq!(
        err,
        SimError::NoCpu {
            task: agent,
            what: "spin on a spinlock"
        }
    );
    assert!(err.to_string().contains("agent"), "{err}");
    // It stopped when the agent asked, and the lock was never taken.
    assert_eq!(s.now(), SimTime::from_ns(100));
    assert_eq!(lock.stats().acquisitions, 0);
}

#[test]
fn sleeplock_from_an_agent_stops_the_run_and_cpu_tasks_still_lock() {
    let mut s = Sim::new(SimConfig { cpus: 1, seed: 1 }).unwrap();
    let lock = SleepLock::new(s.handle(), "m", SleepParams::default()).unwrap();
    let l1 = lock.clone();
    s.spawn_on(0, move |ctx| async move {
        let g = l1.lock(&ctx).await;
        ctx.cpu().spend(SimDuration::ns(50), Account::System).await;
        g.unlock().await;
    })
    .unwrap();
    let l2 = lock.clone();
    let agent = s
        .spawn_agent(move |ctx| async move {
            ctx.sleep(SimDuration::ns(1_000)).await;
            let _g = l2.lock(&ctx).await;
        })
        .unwrap();
    let err = s.run().unwrap_err();
    assert!(
        matches!(err, SimError::NoCpu { task, .. } if task == agent),
        "{err}"
    );
    // The CPU task's acquisition completed before the agent's attempt.
    assert_eq!(lock.stats().acquisitions, 1);
    assert_eq!(s.now(), SimTime::from_ns(1_000));
}
