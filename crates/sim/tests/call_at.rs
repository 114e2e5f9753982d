//! `Handle::call_at` runs exactly like an agent spawned at the same point whose body is
//! `sleep_until(at).await; f()`: same event order, same random streams for tasks spawned
//! later, same report (events and task counts included).

use std::cell::RefCell;
use std::rc::Rc;

use iolab_sim::engine::{Channel, Handle, Sim, SimConfig, SimDuration, SimTime};
use iolab_sim::Account;

#[derive(Clone, Copy)]
enum Timer {
    Agent,
    CallAt,
}

/// Posts `v` into `ch` at `at`, one way or the other.
fn post(h: &Handle, how: Timer, at: u64, ch: Rc<Channel<u64>>, v: u64) {
    match how {
        Timer::Agent => {
            h.spawn_agent(move |ctx| async move {
                ctx.sleep_until(SimTime::from_ns(at)).await;
                let _ = ch.send(v);
            })
            .unwrap();
        }
        Timer::CallAt => h
            .call_at(SimTime::from_ns(at), move || {
                let _ = ch.send(v);
            })
            .unwrap(),
    }
}

/// Four CPUs submit I/Os whose "device" posts completions at random times (some at the
/// current instant, many at equal times); handlers receive them and record what they see;
/// a task spawned mid-run records its random numbers.
fn run(how: Timer, seed: u64) -> (Vec<(u64, usize, u64, u64)>, String) {
    let mut sim = Sim::new(SimConfig { cpus: 4, seed }).unwrap();
    let log = Rc::new(RefCell::new(Vec::new()));
    for cpu in 0..4 {
        let ch = Rc::new(Channel::new(sim.handle(), 64));
        let (log2, ch2) = (log.clone(), ch.clone());
        sim.spawn_on(cpu, move |ctx| async move {
            for _ in 0..60 {
                let v = ch2.recv(&ctx).await;
                let draw = ctx.rng().below(1000);
                log2.borrow_mut().push((ctx.now().as_ns(), cpu, v, draw));
                ctx.cpu()
                    .spend(SimDuration::ns(50 + draw), Account::System)
                    .await;
            }
        })
        .unwrap();
        let log3 = log.clone();
        sim.spawn_on(cpu, move |ctx| async move {
            for i in 0..60u64 {
                let d = ctx.rng().below(4) * 100;
                ctx.cpu().spend(SimDuration::ns(d), Account::User).await;
                // Coarse completion times, so many fall on the same instant.
                let at = ctx.now().as_ns() + ctx.rng().below(3) * 500;
                post(ctx.handle(), how, at, ch.clone(), cpu as u64 * 1000 + i);
                if i == 30 && cpu == 0 {
                    let log4 = log3.clone();
                    ctx.handle()
                        .spawn_agent(move |c| async move {
                            let x = c.rng().next_u64();
                            log4.borrow_mut().push((c.now().as_ns(), 99, x, 0));
                        })
                        .unwrap();
                }
            }
        })
        .unwrap();
    }
    let report = sim.run().unwrap();
    let log = log.borrow().clone();
    (log, format!("{report:?}"))
}

#[test]
fn call_at_runs_exactly_like_a_sleeping_agent() {
    for seed in [1, 2, 3] {
        let (log_a, rep_a) = run(Timer::Agent, seed);
        let (log_b, rep_b) = run(Timer::CallAt, seed);
        assert_eq!(log_a.len(), 4 * 60 + 1);
        assert_eq!(log_a, log_b, "seed {seed}");
        assert_eq!(rep_a, rep_b, "seed {seed}");
    }
}
