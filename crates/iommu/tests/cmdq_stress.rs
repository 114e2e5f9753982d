//! Stress tests of the SMMUv3 command-queue producers on real host threads.
//!
//! Four threads per run, a bounded number of calls each, over both producer designs, small
//! and larger queues, and both consumer modes (self-service waiters, or a separate hardware
//! thread). A recording sink checks, as the hardware applies commands, that each thread's
//! commands arrive exactly once and in issue order; each thread checks after every synced
//! call that all its commands so far were applied; the end state and the work records are
//! checked against the totals. In debug builds the queue also asserts on every slot write
//! that no unconsumed slot is overwritten.

#![cfg(not(loom))]

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;

use iolab_iommu::smmuv3::{
    CmdBatch, CmdqConfig, CmdqProducer, Command, CommandSink, ConsumerMode, ProducerKind,
};
use iolab_iommu::work::{LockId, WorkRecord};

const THREADS: usize = 4;
const CALLS: usize = 2000;

/// What the hardware applied, checked as it happens.
#[derive(Default)]
struct Checker {
    state: Mutex<CheckState>,
}

#[derive(Default)]
struct CheckState {
    /// Next sequence number expected from each thread.
    next: [u64; THREADS],
    syncs: u64,
    errors: Vec<String>,
}

impl CommandSink for Checker {
    fn apply(&self, cmd: &Command) {
        let mut s = self.state.lock().unwrap();
        match *cmd {
            Command::TlbiNhVa { asid, addr, .. } => {
                let (t, seq) = (usize::from(asid), addr >> 12);
                if s.next[t] != seq && s.errors.len() < 8 {
                    let msg = format!("thread {t}: expected command {}, got {seq}", s.next[t]);
                    s.errors.push(msg);
                }
                s.next[t] = seq + 1;
            }
            Command::Sync { .. } => s.syncs += 1,
            other => s.errors.push(format!("unexpected command {other:?}")),
        }
    }
}

impl Checker {
    fn applied(&self, t: usize) -> u64 {
        self.state.lock().unwrap().next[t]
    }
}

fn cmd(t: usize, seq: u64) -> Command {
    Command::TlbiNhVa {
        vmid: 0,
        asid: t as u16,
        addr: seq << 12,
        leaf: true,
        ttl: 3,
        tg: 0,
        num: 0,
        scale: 0,
    }
}

/// A small deterministic generator, one per thread.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self, bound: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % bound
    }
}

/// What one thread did.
#[derive(Default)]
struct Issued {
    work: WorkRecord,
    commands: u64,
    syncs: u64,
    issues: u64,
}

fn run(kind: ProducerKind, log2size: u32, mode: ConsumerMode, max_cmds: u64) {
    let checker = Arc::new(Checker::default());
    let cfg = CmdqConfig {
        consumer: mode,
        ..CmdqConfig::with_log2size(log2size)
    };
    let q: Arc<dyn CmdqProducer<Sink = Arc<Checker>>> =
        kind.build(cfg, checker.clone()).unwrap().into();
    let max_cmds = max_cmds.min(q.cmdq().capacity() as u64 - 1);
    let stop = Arc::new(AtomicBool::new(false));
    let hw = (mode == ConsumerMode::External).then(|| {
        let (q, stop) = (q.clone(), stop.clone());
        thread::spawn(move || {
            while !stop.load(Ordering::Acquire) {
                if q.cmdq().service() == 0 {
                    thread::yield_now();
                }
            }
        })
    });
    let producers: Vec<_> = (0..THREADS)
        .map(|t| {
            let (q, checker) = (q.clone(), checker.clone());
            thread::spawn(move || {
                let mut rng = Lcg(t as u64 + 1);
                let mut me = Issued::default();
                for _ in 0..CALLS {
                    let n = 1 + rng.next(max_cmds);
                    let sync = rng.next(3) == 0;
                    let first = me.commands;
                    if rng.next(4) == 0 {
                        // Through a batch: submit always syncs.
                        let mut batch = CmdBatch::new(&*q);
                        // A full batch is flushed (issued without a sync) before the next add.
                        me.issues += (n - 1) / batch.limit() as u64 + 1;
                        for seq in first..first + n {
                            batch.add(cmd(t, seq), &mut me.work).unwrap();
                        }
                        batch.submit(&mut me.work).unwrap();
                        me.syncs += 1;
                    } else {
                        let cmds: Vec<_> = (first..first + n).map(|seq| cmd(t, seq)).collect();
                        q.issue(&cmds, sync, &mut me.work).unwrap();
                        me.syncs += u64::from(sync);
                        me.issues += 1;
                        if !sync {
                            me.commands += n;
                            continue;
                        }
                    }
                    me.commands += n;
                    assert_eq!(
                        checker.applied(t),
                        me.commands,
                        "{kind} thread {t}: a sync returned before the thread's commands were applied"
                    );
                }
                me
            })
        })
        .collect();
    let issued: Vec<Issued> = producers.into_iter().map(|p| p.join().unwrap()).collect();
    stop.store(true, Ordering::Release);
    if let Some(hw) = hw {
        hw.join().unwrap();
    }
    q.cmdq().drain();

    let state = checker.state.lock().unwrap();
    assert!(state.errors.is_empty(), "{kind}: {:?}", state.errors);
    for (t, me) in issued.iter().enumerate() {
        assert_eq!(
            state.next[t], me.commands,
            "{kind} thread {t}: commands lost"
        );
    }
    let syncs: u64 = issued.iter().map(|i| i.syncs).sum();
    assert_eq!(state.syncs, syncs, "{kind}: CMD_SYNCs applied");
    let stats = q.cmdq().stats();
    assert_eq!(stats.illegal, 0, "{kind}: {:?}", stats.last_error);
    assert!(q.cmdq().is_idle());

    let mut work = WorkRecord::new();
    for i in &issued {
        work += &i.work;
    }
    let commands: u64 = issued.iter().map(|i| i.commands).sum();
    let issues: u64 = issued.iter().map(|i| i.issues).sum();
    assert_eq!(work.commands_written, commands + syncs, "{kind}: {work:?}");
    assert_eq!(work.inval_syncs, syncs, "{kind}: {work:?}");
    assert_eq!(stats.consumed, commands + syncs, "{kind}");
    match kind {
        ProducerKind::Spinlock => {
            // One lock and one PROD write per slot.
            assert_eq!(work.lock_count(LockId::CmdqLock), commands + syncs);
            assert_eq!(work.mmio_writes, commands + syncs);
            assert_eq!(work.cas_attempts, 0);
        }
        ProducerKind::LockFree => {
            // Every call reserves once (batches may flush more often); one owner per
            // published batch; one PROD write per owner.
            assert!(work.cas_attempts >= issues, "{work:?}");
            assert_eq!(work.cas_attempts - work.cas_failures, issues);
            assert!(work.owner_elections >= 1 && work.owner_elections <= issues);
            assert_eq!(work.mmio_writes, work.owner_elections);
            assert!(work.lock_count(LockId::CmdqSharedLock) >= syncs);
            assert_eq!(work.lock_count(LockId::CmdqLock), 0);
        }
    }
}

#[test]
fn spinlock_small_queue() {
    run(ProducerKind::Spinlock, 2, ConsumerMode::SelfService, 5);
}

#[test]
fn spinlock_larger_queue() {
    run(ProducerKind::Spinlock, 6, ConsumerMode::SelfService, 5);
}

#[test]
fn spinlock_hardware_thread() {
    run(ProducerKind::Spinlock, 3, ConsumerMode::External, 5);
}

#[test]
fn lock_free_small_queue() {
    run(ProducerKind::LockFree, 2, ConsumerMode::SelfService, 5);
}

#[test]
fn lock_free_larger_queue() {
    run(ProducerKind::LockFree, 6, ConsumerMode::SelfService, 5);
}

#[test]
fn lock_free_hardware_thread() {
    run(ProducerKind::LockFree, 3, ConsumerMode::External, 5);
}

#[test]
fn lock_free_tiny_queue() {
    // Two slots: every synced call fills the queue.
    run(ProducerKind::LockFree, 1, ConsumerMode::SelfService, 5);
}

#[test]
fn lock_free_multiword_valid_map() {
    // 256 slots (four bitmap words) and up to 70 commands a call: reserved ranges cross
    // bitmap words and the end of the queue, and batches flush at 64.
    run(ProducerKind::LockFree, 8, ConsumerMode::SelfService, 70);
}

#[test]
fn spinlock_long_lists() {
    run(ProducerKind::Spinlock, 8, ConsumerMode::SelfService, 70);
}
