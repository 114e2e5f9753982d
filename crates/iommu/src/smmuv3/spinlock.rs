//! The pre-2019 Linux producer: one spinlock around every insertion.
//!
//! Each command is inserted under the lock: wait for a free slot (re-reading CONS while the
//! queue is full), write the command, write PROD. A `CMD_SYNC` is inserted the same way and
//! then waited for *with the lock still held*, so every other CPU that wants to insert spins
//! on the lock for the whole duration of the sync. That serialisation is what the 2019
//! rework removed (SEEDS.md experiment 2).

use super::cmdq::{validate, Cmdq, CmdqConfig, CmdqError, CmdqProducer, CommandSink, ProducerKind};
use super::spec::{Command, RawCommand};
use super::sync::{AtomicBool, AtomicU32, Backoff, Ordering};
use crate::work::{LockId, WorkRecord};

/// A command queue whose producers serialise on one spinlock ([`LockId::CmdqLock`]).
pub struct SpinlockCmdq<S> {
    q: Cmdq<S>,
    locked: AtomicBool,
    /// The driver's copy of PROD (written under the lock only).
    prod: AtomicU32,
    /// The driver's copy of CONS, refreshed from the register when the queue looks full
    /// (under the lock only).
    cons: AtomicU32,
}

/// Releases the spinlock on drop, so a panicking sink cannot leave it held.
struct Held<'a>(&'a AtomicBool);

impl Drop for Held<'_> {
    fn drop(&mut self) {
        // A swap for loom's sake: see `LockFreeCmdq::exclusive_unlock`.
        self.0.swap(false, Ordering::Release);
    }
}

impl<S: CommandSink> SpinlockCmdq<S> {
    /// An empty queue.
    pub fn new(config: CmdqConfig, sink: S) -> Result<Self, CmdqError> {
        Ok(SpinlockCmdq {
            q: Cmdq::new(config, sink)?,
            locked: AtomicBool::new(false),
            prod: AtomicU32::new(0),
            cons: AtomicU32::new(0),
        })
    }

    /// Test-and-test-and-set acquisition; counts one acquisition of [`LockId::CmdqLock`].
    fn lock(&self, work: &mut WorkRecord) -> Held<'_> {
        work.lock(LockId::CmdqLock);
        let mut backoff = Backoff::new();
        while self
            .locked
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            while self.locked.load(Ordering::Relaxed) {
                backoff.snooze();
            }
        }
        Held(&self.locked)
    }

    /// Inserts one command (built from its position) and publishes it. Lock held.
    fn insert(&self, build: impl FnOnce(u32) -> RawCommand, work: &mut WorkRecord) -> u32 {
        let geo = self.q.geometry();
        let prod = self.prod.load(Ordering::Relaxed);
        let mut cons = self.cons.load(Ordering::Relaxed);
        if geo.is_full(prod, cons) {
            let mut backoff = Backoff::new();
            loop {
                cons = self.q.read_cons(work);
                if !geo.is_full(prod, cons) {
                    break;
                }
                work.polls += 1;
                if self.q.self_service() && self.q.service() > 0 {
                    continue;
                }
                backoff.snooze();
            }
            self.cons.store(cons, Ordering::Relaxed);
        }
        self.q.write_slot(prod, build(prod), work);
        let next = geo.inc(prod, 1);
        self.prod.store(next, Ordering::Relaxed);
        self.q.publish(next, work);
        prod
    }
}

impl<S: CommandSink> CmdqProducer for SpinlockCmdq<S> {
    type Sink = S;

    fn kind(&self) -> ProducerKind {
        ProducerKind::Spinlock
    }

    fn cmdq(&self) -> &Cmdq<S> {
        &self.q
    }

    fn issue(&self, cmds: &[Command], sync: bool, work: &mut WorkRecord) -> Result<(), CmdqError> {
        let encoded = validate(cmds)?;
        for (i, cmd) in cmds.iter().enumerate() {
            let _held = self.lock(work);
            self.insert(|_| encoded.get(i, cmd), work);
        }
        if sync {
            let _held = self.lock(work);
            let pos = self.insert(|pos| self.q.sync_for(pos), work);
            // Holding the lock keeps every other producer, and so any reuse of the sync's
            // slot, out until the MSI has landed.
            self.q.wait_sync(pos, work);
        }
        Ok(())
    }
}
