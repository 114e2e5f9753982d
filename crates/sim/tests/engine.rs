//! Executor behaviour: caps, CPU ownership and run queues, timers, completions, channels,
//! event order, conservation of CPU time.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

use iolab_sim::engine::{Channel, Completion, Limits, SimError, MAX_CPUS};
use iolab_sim::resources::{SleepLock, SleepParams, SpinLock, SpinParams};
use iolab_sim::{Account, Sim, SimConfig, SimDuration, SimTime};
use proptest::prelude::*;

fn sim(cpus: usize) -> Sim {
    Sim::new(SimConfig { cpus, seed: 1 }).expect("valid config")
}

fn ns(n: u64) -> SimDuration {
    SimDuration::ns(n)
}

type Log = Rc<RefCell<Vec<(u64, &'static str)>>>;

fn log() -> Log {
    Rc::new(RefCell::new(Vec::new()))
}

#[test]
fn cpu_count_out_of_range_is_an_error() {
    for cpus in [0, MAX_CPUS + 1, 2000] {
        let err = Sim::new(SimConfig { cpus, seed: 0 }).unwrap_err();
        assert_eq!(
            err,
            SimError::CpuCount {
                cpus,
                max: MAX_CPUS
            }
        );
    }
    assert!(Sim::new(SimConfig { cpus: 1, seed: 0 }).is_ok());
    assert!(Sim::new(SimConfig {
        cpus: MAX_CPUS,
        seed: 0
    })
    .is_ok());
}

#[test]
fn spawning_on_a_missing_cpu_is_an_error() {
    let s = sim(4);
    let err = s.spawn_on(4, |_ctx| async {}).unwrap_err();
    assert_eq!(err, SimError::NoSuchCpu { cpu: 4, cpus: 4 });
}

#[test]
fn task_cap_is_enforced() {
    let limits = Limits {
        max_tasks: 3,
        ..Limits::default()
    };
    let mut s = Sim::with_limits(SimConfig { cpus: 1, seed: 0 }, limits).unwrap();
    for _ in 0..3 {
        s.spawn_on(0, |_ctx| async {}).unwrap();
    }
    assert_eq!(
        s.spawn_on(0, |_ctx| async {}).unwrap_err(),
        SimError::TooManyTasks { max: 3 }
    );
    // Finished tasks free their slots.
    s.run().unwrap();
    assert!(s.spawn_on(0, |_ctx| async {}).is_ok());
}

#[test]
fn pending_event_cap_is_enforced() {
    let limits = Limits {
        max_pending_events: 8,
        ..Limits::default()
    };
    // At spawn time: every new task needs a first wake-up.
    let s = Sim::with_limits(SimConfig { cpus: 1, seed: 0 }, limits).unwrap();
    for _ in 0..8 {
        s.spawn_agent(|_ctx| async {}).unwrap();
    }
    assert_eq!(
        s.spawn_agent(|_ctx| async {}).unwrap_err(),
        SimError::TooManyEvents { max: 8 }
    );

    // During a run: one task arming many timers at once stops the run with an error.
    let mut s = Sim::with_limits(SimConfig { cpus: 1, seed: 0 }, limits).unwrap();
    s.spawn_agent(|ctx| async move {
        let mut sleeps: Vec<_> = (1..=20).map(|i| ctx.sleep(ns(i))).collect();
        std::future::poll_fn(|cx| {
            let mut all = true;
            for sl in sleeps.iter_mut() {
                all &= Pin::new(sl).poll(cx).is_ready();
            }
            if all {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
        .await;
    })
    .unwrap();
    assert_eq!(s.run().unwrap_err(), SimError::TooManyEvents { max: 8 });
}

#[test]
fn resource_cap_is_enforced() {
    let limits = Limits {
        max_resources: 2,
        ..Limits::default()
    };
    let s = Sim::with_limits(SimConfig { cpus: 1, seed: 0 }, limits).unwrap();
    let h = s.handle();
    SpinLock::new(h, "a", SpinParams::default()).unwrap();
    SleepLock::new(h, "b", SleepParams::default()).unwrap();
    assert_eq!(
        SpinLock::new(h, "c", SpinParams::default()).unwrap_err(),
        SimError::TooManyResources { max: 2 }
    );
}

#[test]
fn spend_charges_its_account_and_sleep_is_idle() {
    let mut s = sim(1);
    s.spawn_on(0, |ctx| async move {
        ctx.cpu().spend(ns(100), Account::User).await;
        ctx.cpu().spend(ns(30), Account::System).await;
        ctx.sleep(ns(70)).await;
        ctx.cpu().spend(ns(0), Account::User).await;
    })
    .unwrap();
    let r = s.run().unwrap();
    assert_eq!(r.end, SimTime(200));
    let c = r.cpus[0];
    assert_eq!((c.user, c.system, c.spin, c.idle), (100, 30, 0, 70));
    assert!((c.busy_pct() - 65.0).abs() < 1e-9);
}

#[test]
fn tasks_sharing_a_cpu_run_one_at_a_time_in_fifo_order() {
    let mut s = sim(2);
    let l = log();
    for (i, name) in ["a", "b", "c"].into_iter().enumerate() {
        let l = l.clone();
        s.spawn_on(0, move |ctx| async move {
            ctx.cpu()
                .spend(ns(100 * (i as u64 + 1)), Account::User)
                .await;
            l.borrow_mut().push((ctx.now().as_ns(), name));
        })
        .unwrap();
    }
    let r = s.run().unwrap();
    assert_eq!(*l.borrow(), vec![(100, "a"), (300, "b"), (600, "c")]);
    assert_eq!(r.cpus[0].user, 600);
    assert_eq!(r.cpus[1].idle, 600);
}

#[test]
fn a_task_keeps_its_cpu_across_spends_until_it_blocks() {
    let mut s = sim(1);
    let l = log();
    let la = l.clone();
    s.spawn_on(0, move |ctx| async move {
        ctx.cpu().spend(ns(10), Account::User).await;
        ctx.cpu().spend(ns(10), Account::User).await;
        la.borrow_mut().push((ctx.now().as_ns(), "a-spent"));
        ctx.sleep(ns(100)).await; // blocks: b runs meanwhile
        la.borrow_mut().push((ctx.now().as_ns(), "a-woke"));
    })
    .unwrap();
    let lb = l.clone();
    s.spawn_on(0, move |ctx| async move {
        lb.borrow_mut().push((ctx.now().as_ns(), "b-start"));
        ctx.cpu().spend(ns(50), Account::System).await;
        lb.borrow_mut().push((ctx.now().as_ns(), "b-done"));
    })
    .unwrap();
    let r = s.run().unwrap();
    assert_eq!(
        *l.borrow(),
        vec![
            (20, "a-spent"),
            (20, "b-start"),
            (70, "b-done"),
            (120, "a-woke")
        ]
    );
    assert_eq!(r.cpus[0].idle, 50);
}

#[test]
fn a_woken_task_waits_for_its_busy_cpu() {
    let mut s = sim(1);
    let l = log();
    let la = l.clone();
    s.spawn_on(0, move |ctx| async move {
        ctx.sleep(ns(10)).await;
        la.borrow_mut().push((ctx.now().as_ns(), "a"));
    })
    .unwrap();
    s.spawn_on(0, |ctx| async move {
        ctx.cpu().spend(ns(500), Account::User).await;
    })
    .unwrap();
    s.run().unwrap();
    assert_eq!(*l.borrow(), vec![(500, "a")]);
}

#[test]
fn yield_now_round_robins() {
    let mut s = sim(1);
    let l = log();
    for name in ["a", "b"] {
        let l = l.clone();
        s.spawn_on(0, move |ctx| async move {
            for _ in 0..2 {
                ctx.cpu().spend(ns(5), Account::User).await;
                l.borrow_mut().push((ctx.now().as_ns(), name));
                ctx.yield_now().await;
            }
        })
        .unwrap();
    }
    s.run().unwrap();
    assert_eq!(*l.borrow(), vec![(5, "a"), (10, "b"), (15, "a"), (20, "b")]);
}

#[test]
fn same_instant_wakeups_run_in_scheduling_order() {
    let mut s = sim(8);
    let l = log();
    const NAMES: [&str; 8] = ["0", "1", "2", "3", "4", "5", "6", "7"];
    for (i, name) in NAMES.into_iter().enumerate() {
        let l = l.clone();
        s.spawn_on(i, move |ctx| async move {
            ctx.sleep_until(SimTime(1_000)).await;
            l.borrow_mut().push((ctx.now().as_ns(), name));
        })
        .unwrap();
    }
    s.run().unwrap();
    let got: Vec<_> = l.borrow().iter().map(|e| e.1).collect();
    assert_eq!(got, NAMES);
}

#[test]
fn completion_fired_in_the_future_wakes_at_its_time() {
    let mut s = sim(1);
    let h = s.handle().clone();
    let early: Completion<u32> = Completion::new(&h);
    let late: Completion<u32> = Completion::new(&h);
    let (e2, l2) = (early.clone(), late.clone());
    let got = Rc::new(RefCell::new(Vec::new()));
    let g = got.clone();
    s.spawn_agent(move |ctx| async move {
        // Fired before the waiter arrives, for a time still in the future.
        e2.fire_at(SimTime(300), 7).unwrap();
        ctx.sleep(ns(100)).await;
        // Fired after the waiter is already waiting.
        l2.fire_at(SimTime(900), 9).unwrap();
        assert_eq!(l2.fire(1), Err(1), "a completion fires once");
    })
    .unwrap();
    s.spawn_on(0, move |ctx| async move {
        ctx.sleep(ns(50)).await;
        let v = early.wait(&ctx).await;
        g.borrow_mut().push((ctx.now().as_ns(), v));
        let v = late.wait(&ctx).await;
        g.borrow_mut().push((ctx.now().as_ns(), v));
    })
    .unwrap();
    let r = s.run().unwrap();
    assert_eq!(*got.borrow(), vec![(300, 7), (900, 9)]);
    assert_eq!(r.cpus[0].idle, 900, "a blocked waiter leaves its CPU idle");
}

#[test]
fn polling_wait_keeps_the_cpu_busy() {
    let mut s = sim(1);
    let c: Completion<()> = Completion::new(s.handle());
    c.fire_at(SimTime(400), ()).unwrap();
    s.spawn_on(0, move |ctx| async move {
        ctx.cpu().spend(ns(100), Account::User).await;
        c.wait_polling(&ctx, Account::System).await;
    })
    .unwrap();
    let r = s.run().unwrap();
    assert_eq!(r.end, SimTime(400));
    assert_eq!((r.cpus[0].user, r.cpus[0].system), (100, 300));
}

#[test]
fn channel_delivers_in_order_and_wakes_receivers_fifo() {
    let mut s = sim(2);
    let ch: Channel<u32> = Channel::new(s.handle(), 4);
    let l = Rc::new(RefCell::new(Vec::new()));
    for cpu in 0..2 {
        let (ch, l) = (ch.clone(), l.clone());
        s.spawn_on(cpu, move |ctx| async move {
            for _ in 0..2 {
                let v = ch.recv(&ctx).await;
                l.borrow_mut().push((ctx.now().as_ns(), cpu, v));
                ctx.cpu().spend(ns(10), Account::System).await;
            }
        })
        .unwrap();
    }
    let tx = ch.clone();
    s.spawn_agent(move |ctx| async move {
        for v in 0..4u32 {
            ctx.sleep(ns(100)).await;
            tx.send(v).unwrap();
        }
        ctx.sleep(ns(1)).await;
        for v in 0..4u32 {
            tx.send(v).unwrap();
        }
        assert_eq!(tx.send(99), Err(iolab_sim::engine::Full(99)));
    })
    .unwrap();
    s.run().unwrap();
    assert_eq!(
        *l.borrow(),
        vec![(100, 0, 0), (200, 1, 1), (300, 0, 2), (400, 1, 3)]
    );
    assert_eq!(ch.len(), 4);
}

#[test]
fn interrupts_wake_a_handler_on_their_cpu() {
    // A device agent raises an interrupt per completed command; the handler thread pinned
    // to CPU 1 spends 500 ns of system time per interrupt.
    let mut s = sim(2);
    let irq: Channel<u32> = Channel::new(s.handle(), 16);
    let seen = Rc::new(RefCell::new(Vec::new()));
    let (rx, seen2) = (irq.clone(), seen.clone());
    s.spawn_on(1, move |ctx| async move {
        for _ in 0..3 {
            let cmd = rx.recv(&ctx).await;
            seen2.borrow_mut().push((ctx.now().as_ns(), cmd));
            ctx.cpu().spend(ns(500), Account::System).await;
        }
    })
    .unwrap();
    s.spawn_agent(move |ctx| async move {
        for cmd in 0..3u32 {
            ctx.sleep(ns(10_000)).await;
            irq.send(cmd).unwrap();
        }
    })
    .unwrap();
    let r = s.run().unwrap();
    assert_eq!(*seen.borrow(), vec![(10_000, 0), (20_000, 1), (30_000, 2)]);
    assert_eq!(r.cpus[1].system, 1_500);
    assert_eq!(r.cpus[0].busy(), 0);
    assert_eq!(r.end, SimTime(30_500));
}

#[test]
fn run_until_clips_accounting_and_can_continue() {
    let mut s = sim(2);
    s.spawn_on(0, |ctx| async move {
        ctx.cpu().spend(ns(1_000), Account::System).await;
    })
    .unwrap();
    let r = s.run_until(SimTime(400)).unwrap();
    assert_eq!(r.end, SimTime(400));
    assert_eq!((r.cpus[0].system, r.cpus[0].idle), (400, 0));
    assert_eq!(r.tasks.live, 1);
    assert!(r.is_conserved());
    let r = s.run().unwrap();
    assert_eq!(r.end, SimTime(1_000));
    assert_eq!(r.cpus[0].system, 1_000);
    assert_eq!(r.cpus[1].idle, 1_000);
    assert_eq!(r.tasks.finished, 1);
}

/// A future that is not the engine's: it is woken through `std::task::Waker`.
struct Flag(Rc<RefCell<(bool, Option<Waker>)>>);

impl Future for Flag {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut f = self.0.borrow_mut();
        if f.0 {
            Poll::Ready(())
        } else {
            f.1 = Some(cx.waker().clone());
            Poll::Pending
        }
    }
}

#[test]
fn foreign_futures_are_woken_through_their_waker() {
    let mut s = sim(1);
    let flag = Rc::new(RefCell::new((false, None::<Waker>)));
    let done = Rc::new(RefCell::new(None));
    let (f1, d1) = (flag.clone(), done.clone());
    s.spawn_on(0, move |ctx| async move {
        Flag(f1).await;
        *d1.borrow_mut() = Some(ctx.now());
    })
    .unwrap();
    s.spawn_agent(move |ctx| async move {
        ctx.sleep(ns(250)).await;
        let w = {
            let mut f = flag.borrow_mut();
            f.0 = true;
            f.1.take()
        };
        w.expect("the task registered its waker").wake();
    })
    .unwrap();
    s.run().unwrap();
    assert_eq!(*done.borrow(), Some(SimTime(250)));
}

#[test]
fn dropping_the_sim_drops_blocked_tasks() {
    struct Canary(Rc<RefCell<bool>>);
    impl Drop for Canary {
        fn drop(&mut self) {
            *self.0.borrow_mut() = true;
        }
    }
    let dropped = Rc::new(RefCell::new(false));
    {
        let mut s = sim(1);
        let c: Completion<()> = Completion::new(s.handle());
        let canary = Canary(dropped.clone());
        s.spawn_on(0, move |ctx| async move {
            let _canary = canary;
            c.wait(&ctx).await; // never fired
        })
        .unwrap();
        let r = s.run().unwrap();
        assert_eq!(r.tasks.live, 1);
    }
    assert!(*dropped.borrow());
}

/// One step of a random scenario for the conservation property.
#[derive(Clone, Debug)]
enum Step {
    Spend(u64, Account),
    Sleep(u64),
    Spin(u64),
    Mutex(u64),
    Yield,
}

fn step() -> impl Strategy<Value = Step> {
    let acct = prop_oneof![
        Just(Account::User),
        Just(Account::System),
        Just(Account::Spin)
    ];
    prop_oneof![
        (0..500u64, acct).prop_map(|(n, a)| Step::Spend(n, a)),
        (0..500u64).prop_map(Step::Sleep),
        (0..300u64).prop_map(Step::Spin),
        (0..300u64).prop_map(Step::Mutex),
        Just(Step::Yield),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// user + system + spin + idle == elapsed time, exactly, on every CPU, whatever the
    /// tasks do and wherever the run is cut.
    #[test]
    fn cpu_time_is_conserved(
        cpus in 1usize..6,
        tasks in prop::collection::vec((0usize..6, prop::collection::vec(step(), 0..12)), 1..12),
        cut in prop::option::of(0u64..3_000),
    ) {
        let mut s = sim(cpus);
        let spin = SpinLock::new(s.handle(), "spin", SpinParams::default()).unwrap();
        let mutex = SleepLock::new(s.handle(), "mutex", SleepParams::default()).unwrap();
        for (cpu, steps) in tasks {
            let (spin, mutex) = (spin.clone(), mutex.clone());
            s.spawn_on(cpu % cpus, move |ctx| async move {
                for st in steps {
                    match st {
                        Step::Spend(n, a) => ctx.cpu().spend(ns(n), a).await,
                        Step::Sleep(n) => ctx.sleep(ns(n)).await,
                        Step::Spin(hold) => {
                            let g = spin.lock(&ctx).await;
                            ctx.cpu().spend(ns(hold), Account::System).await;
                            g.unlock().await;
                        }
                        Step::Mutex(hold) => {
                            let g = mutex.lock(&ctx).await;
                            ctx.cpu().spend(ns(hold), Account::System).await;
                            g.unlock().await;
                        }
                        Step::Yield => ctx.yield_now().await,
                    }
                }
            }).unwrap();
        }
        let r = match cut {
            Some(t) => s.run_until(SimTime(t)).unwrap(),
            None => s.run().unwrap(),
        };
        for (i, c) in r.cpus.iter().enumerate() {
            prop_assert_eq!(c.total(), r.end.as_ns(), "cpu {}: {:?}", i, c);
        }
        prop_assert!(r.is_conserved());
        if cut.is_none() {
            prop_assert_eq!(r.tasks.live, 0, "every task finishes");
        }
    }
}

/// Polls a future once and drops it (an abandoned await, as in a `select`).
struct PollOnceThenDrop<F>(Option<Pin<Box<F>>>);

impl<F: Future> Future for PollOnceThenDrop<F> {
    type Output = bool;
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<bool> {
        let mut f = self.0.take().expect("polled once");
        Poll::Ready(f.as_mut().poll(cx).is_ready())
    }
}

#[test]
fn abandoned_spends_waits_and_receives_close_their_state() {
    // Another task keeps an event queued earlier than the spend's end, so the spend is a
    // busy interval with a wake-up (no shortcut); dropping it closes the interval at once.
    let mut s = sim(2);
    s.spawn_on(1, |ctx| async move {
        ctx.sleep(ns(10)).await;
    })
    .unwrap();
    let c: Completion<()> = Completion::new(s.handle());
    let ch: Channel<u32> = Channel::new(s.handle(), 4);
    let got = Rc::new(RefCell::new(None));
    {
        let (c, ch) = (c.clone(), ch.clone());
        s.spawn_on(0, move |ctx| async move {
            let spend = ctx.cpu().spend(ns(1_000), Account::User);
            assert!(!PollOnceThenDrop(Some(Box::pin(spend))).await);
            // A polling wait, armed then abandoned: its busy interval closes too.
            let wait = c.wait_polling(&ctx, Account::System);
            assert!(!PollOnceThenDrop(Some(Box::pin(wait))).await);
            // A receive abandoned while waiting leaves the channel's line of waiters.
            let recv = ch.recv(&ctx);
            assert!(!PollOnceThenDrop(Some(Box::pin(recv))).await);
        })
        .unwrap();
    }
    {
        let (ch, got) = (ch.clone(), got.clone());
        s.spawn_agent(move |ctx| async move {
            *got.borrow_mut() = Some(ch.recv(&ctx).await);
        })
        .unwrap();
    }
    {
        let ch = ch.clone();
        s.spawn_agent(move |ctx| async move {
            ctx.sleep(ns(50)).await;
            ch.send(7).unwrap();
        })
        .unwrap();
    }
    let r = s.run().unwrap();
    // Nothing was spent on CPU 0: both intervals closed the instant they were abandoned.
    assert_eq!(r.cpus[0].user + r.cpus[0].system + r.cpus[0].spin, 0);
    // The item went to the receiver still waiting.
    assert_eq!(*got.borrow(), Some(7));
    assert_eq!(r.tasks.live, 0);
}
