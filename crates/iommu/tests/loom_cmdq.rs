//! Loom model tests of the SMMUv3 command-queue producers.
//!
//! Built only with `--cfg loom`, which swaps the queue's atomics and locks for loom's:
//!
//! ```text
//! RUSTFLAGS="--cfg loom" LOOM_MAX_PREEMPTIONS=2 \
//!     cargo test -p iolab-iommu --release --test loom_cmdq
//! ```
//!
//! Each model runs producer threads on a 2-8 slot queue and checks, over every interleaving
//! loom explores:
//!
//! - no command is lost or duplicated: after the threads finish and the queue is drained,
//!   the hardware applied exactly the commands issued, and exactly one `CMD_SYNC` per
//!   synced call;
//! - each producer's commands are applied in the order it issued them;
//! - a sync completes only after the commands before it: when `issue(.., sync = true)`
//!   returns, every command that thread issued has been applied, followed by a `CMD_SYNC`;
//! - no unconsumed slot is overwritten: the queue asserts it on every slot write under
//!   `cfg(loom)` (and an overwrite would also lose a command);
//! - the hardware never meets an illegal command (a torn or half-written slot).
//!
//! # Why at most two threads wait
//!
//! Waiters spin with `loom::thread::yield_now`. When two threads spin while a third must
//! make progress, loom may hand the CPU from one spinner to the other forever (a yield
//! re-activates the other yielded thread), so the model never ends; a toy model of one
//! worker and two yield-spinners on a flag shows the same. The models therefore run two
//! producers that may both wait, plus at most one thread that never waits: a "hardware"
//! thread that runs the consumer a bounded number of times, concurrently with the
//! producers' slot writes and PROD updates.

#![cfg(loom)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc as StdArc;
use std::sync::Mutex as StdMutex;

use iolab_iommu::smmuv3::{
    CmdqConfig, CmdqProducer, Command, CommandSink, ConsumerMode, LockFreeCmdq, SpinlockCmdq,
};
use iolab_iommu::work::WorkRecord;
use loom::sync::Arc;
use loom::thread;

/// Records every command the hardware applies, in order. Calls are serialised by the
/// queue's consumer lock, so a plain (non-loom) mutex is enough.
#[derive(Default)]
struct Recorder(StdMutex<Vec<Command>>);

impl CommandSink for Recorder {
    fn apply(&self, cmd: &Command) {
        self.0.lock().unwrap().push(*cmd);
    }
}

impl Recorder {
    fn snapshot(&self) -> Vec<Command> {
        self.0.lock().unwrap().clone()
    }
}

type Sink = StdArc<Recorder>;

/// Command `i` of producer `t`: unique, and its producer and sequence read back.
fn cmd(t: usize, i: usize) -> Command {
    Command::TlbiNhVa {
        vmid: 0,
        asid: t as u16,
        addr: (i as u64 + 1) << 12,
        leaf: true,
        ttl: 0,
        tg: 0,
        num: 0,
        scale: 0,
    }
}

fn owner_of(c: &Command) -> Option<(usize, usize)> {
    match *c {
        Command::TlbiNhVa { asid, addr, .. } => {
            Some((usize::from(asid), (addr >> 12) as usize - 1))
        }
        _ => None,
    }
}

/// Producer `t`'s commands as applied, in order.
fn applied_by(log: &[Command], t: usize) -> Vec<usize> {
    log.iter()
        .filter_map(owner_of)
        .filter(|&(o, _)| o == t)
        .map(|(_, i)| i)
        .collect()
}

/// Checks, right after a synced `issue` by producer `t` returned, that its first `upto`
/// commands were applied in order and a `CMD_SYNC` was applied after them.
fn check_synced(log: &Recorder, t: usize, upto: usize) {
    let seen = log.snapshot();
    assert_eq!(
        applied_by(&seen, t),
        (0..upto).collect::<Vec<_>>(),
        "producer {t}: sync returned before its commands were applied"
    );
    let last = seen
        .iter()
        .rposition(|c| owner_of(c).is_some_and(|(o, _)| o == t));
    let synced = match last {
        Some(p) => seen[p + 1..].iter().any(Command::is_sync),
        None => seen.iter().any(Command::is_sync),
    };
    assert!(
        synced,
        "producer {t}: no CMD_SYNC applied after its commands"
    );
}

/// One producer's job: `rounds` calls of `issue`, each with `cmds` new commands and, if
/// `sync`, a sync.
#[derive(Clone, Copy)]
struct Job {
    cmds: usize,
    sync: bool,
    rounds: usize,
}

const fn job(cmds: usize, sync: bool, rounds: usize) -> Job {
    Job { cmds, sync, rounds }
}

impl Job {
    fn commands(&self) -> usize {
        self.cmds * self.rounds
    }

    fn syncs(&self) -> usize {
        if self.sync {
            self.rounds
        } else {
            0
        }
    }
}

/// Runs `jobs` on concurrent producer threads against a fresh queue from `make`, plus a
/// hardware thread running the consumer `hw_runs` times if that is not zero, in every
/// interleaving loom explores, and checks the invariants in the module docs.
fn model<P, F>(make: F, jobs: &'static [Job], hw_runs: usize)
where
    P: CmdqProducer<Sink = Sink> + 'static,
    F: Fn(Sink) -> P + Sync + Send + 'static,
{
    let executions = StdArc::new(AtomicUsize::new(0));
    let counter = executions.clone();
    loom::model(move || {
        counter.fetch_add(1, Ordering::Relaxed);
        let log = Sink::default();
        let q = Arc::new(make(log.clone()));
        let producers: Vec<_> = jobs
            .iter()
            .enumerate()
            .map(|(t, &j)| {
                let (q, log) = (q.clone(), log.clone());
                thread::spawn(move || {
                    let mut work = WorkRecord::new();
                    for round in 0..j.rounds {
                        let first = round * j.cmds;
                        let cmds: Vec<_> = (first..first + j.cmds).map(|i| cmd(t, i)).collect();
                        q.issue(&cmds, j.sync, &mut work).unwrap();
                        if j.sync {
                            check_synced(&log, t, first + j.cmds);
                        }
                    }
                    let slots = j.commands() + j.syncs();
                    assert_eq!(work.commands_written, slots as u64);
                    assert_eq!(work.inval_syncs, j.syncs() as u64);
                })
            })
            .collect();
        // The hardware thread never waits: a bounded number of consumer runs that race
        // the producers.
        let hw = (hw_runs > 0).then(|| {
            let q = q.clone();
            thread::spawn(move || {
                for _ in 0..hw_runs {
                    q.cmdq().service();
                }
            })
        });
        for p in producers {
            p.join().unwrap();
        }
        if let Some(hw) = hw {
            hw.join().unwrap();
        }
        q.cmdq().drain();
        let seen = log.snapshot();
        for (t, j) in jobs.iter().enumerate() {
            assert_eq!(
                applied_by(&seen, t),
                (0..j.commands()).collect::<Vec<_>>(),
                "producer {t}: commands lost, duplicated or reordered: {seen:?}"
            );
        }
        let syncs: usize = jobs.iter().map(Job::syncs).sum();
        let commands: usize = jobs.iter().map(Job::commands).sum();
        assert_eq!(seen.iter().filter(|c| c.is_sync()).count(), syncs);
        assert_eq!(
            seen.len(),
            commands + syncs,
            "unexpected commands: {seen:?}"
        );
        let stats = q.cmdq().stats();
        assert_eq!(stats.illegal, 0, "illegal command: {:?}", stats.last_error);
        assert!(q.cmdq().is_idle());
    });
    eprintln!("explored {} executions", executions.load(Ordering::Relaxed));
}

fn lock_free(log2size: u32) -> impl Fn(Sink) -> LockFreeCmdq<Sink> {
    move |log| LockFreeCmdq::new(CmdqConfig::with_log2size(log2size), log).unwrap()
}

fn spinlock(log2size: u32) -> impl Fn(Sink) -> SpinlockCmdq<Sink> {
    move |log| SpinlockCmdq::new(CmdqConfig::with_log2size(log2size), log).unwrap()
}

/// Two producers, one command and a sync each. In a 4-slot queue both batches fit: owner
/// election, gathering and the shared lock without waiting for space.
const TWO_SYNCED: &[Job] = &[job(1, true, 1), job(1, true, 1)];
/// Two commands and a sync each (6 slots) in a 4-slot queue: the second producer waits
/// for space while the first may hold the shared lock, and slots are reused.
const TWO_WRAPPING: &[Job] = &[job(2, true, 1), job(2, true, 1)];
/// One producer without a sync (its commands are published by whichever CPU owns the
/// batch and consumed during the other's wait), one with.
const MIXED: &[Job] = &[job(2, false, 1), job(1, true, 1)];
/// One producer makes two synced calls, the other one: 6 slots through a 4-slot queue, so
/// later calls reuse slots whose syncs other threads may still be waiting on. (Two calls
/// each takes minutes to explore.)
const TWO_ROUNDS: &[Job] = &[job(1, true, 2), job(1, true, 1)];

/// Consumer runs by the hardware thread in the three-thread models.
const HW_RUNS: usize = 2;

#[test]
fn lock_free_two_producers_sync() {
    model(lock_free(2), TWO_SYNCED, 0);
}

#[test]
fn lock_free_two_producers_wrap_and_wait_for_space() {
    model(lock_free(2), TWO_WRAPPING, 0);
}

/// Each batch fills a 2-slot queue on its own: every reservation waits for the other's.
#[test]
fn lock_free_two_producers_full_queue() {
    model(lock_free(1), TWO_SYNCED, 0);
}

#[test]
fn lock_free_sync_and_no_sync() {
    model(lock_free(2), MIXED, 0);
}

#[test]
fn lock_free_two_rounds_each() {
    model(lock_free(2), TWO_ROUNDS, 0);
}

/// As above in a 2-slot queue: every call fills the queue, three laps in all.
#[test]
fn lock_free_two_rounds_full_queue() {
    model(lock_free(1), TWO_ROUNDS, 0);
}

#[test]
fn lock_free_three_threads_with_hardware() {
    model(lock_free(3), TWO_SYNCED, HW_RUNS);
}

#[test]
fn lock_free_three_threads_with_hardware_wrapping() {
    model(lock_free(2), TWO_WRAPPING, HW_RUNS);
}

#[test]
fn spinlock_two_producers_sync() {
    model(spinlock(2), TWO_SYNCED, 0);
}

#[test]
fn spinlock_two_producers_wrap_and_wait_for_space() {
    model(spinlock(2), TWO_WRAPPING, 0);
}

#[test]
fn spinlock_two_producers_full_queue() {
    model(spinlock(1), TWO_SYNCED, 0);
}

#[test]
fn spinlock_sync_and_no_sync() {
    model(spinlock(2), MIXED, 0);
}

#[test]
fn spinlock_two_rounds_each() {
    model(spinlock(2), TWO_ROUNDS, 0);
}

#[test]
fn spinlock_two_rounds_full_queue() {
    model(spinlock(1), TWO_ROUNDS, 0);
}

#[test]
fn spinlock_three_threads_with_hardware() {
    model(spinlock(3), TWO_SYNCED, HW_RUNS);
}

#[test]
fn spinlock_three_threads_with_hardware_wrapping() {
    model(spinlock(2), TWO_WRAPPING, HW_RUNS);
}

/// The hardware as its own thread ([`ConsumerMode::External`]): the producer only polls,
/// so the consumer runs concurrently with slot writes, PROD updates and the MSI poll. One
/// producer making two synced calls on a 2-slot queue, and the hardware thread: both may
/// wait, and no third thread needs to progress.
fn external_hardware<P, F>(make: F)
where
    P: CmdqProducer<Sink = Sink> + 'static,
    F: Fn(CmdqConfig, Sink) -> P + Sync + Send + 'static,
{
    let executions = StdArc::new(AtomicUsize::new(0));
    let counter = executions.clone();
    loom::model(move || {
        counter.fetch_add(1, Ordering::Relaxed);
        let log = Sink::default();
        let cfg = CmdqConfig {
            consumer: ConsumerMode::External,
            ..CmdqConfig::with_log2size(1)
        };
        let q = Arc::new(make(cfg, log.clone()));
        let done = Arc::new(loom::sync::atomic::AtomicBool::new(false));
        let hw = {
            let (q, done) = (q.clone(), done.clone());
            thread::spawn(move || {
                while !done.load(Ordering::Acquire) {
                    if q.cmdq().service() == 0 {
                        thread::yield_now();
                    }
                }
            })
        };
        let mut work = WorkRecord::new();
        for i in 0..2 {
            q.issue(&[cmd(0, i)], true, &mut work).unwrap();
            check_synced(&log, 0, i + 1);
        }
        done.store(true, Ordering::Release);
        hw.join().unwrap();
        assert_eq!(log.snapshot().len(), 4);
        assert_eq!(work.inval_syncs, 2);
        assert!(q.cmdq().is_idle());
    });
    eprintln!("explored {} executions", executions.load(Ordering::Relaxed));
}

#[test]
fn lock_free_external_hardware_thread() {
    external_hardware(|cfg, log| LockFreeCmdq::new(cfg, log).unwrap());
}

#[test]
fn spinlock_external_hardware_thread() {
    external_hardware(|cfg, log| SpinlockCmdq::new(cfg, log).unwrap());
}
