//! The 2019 Linux producer (Will Deacon's design, `arm_smmu_cmdq_issue_cmdlist`): CPUs
//! reserve slots with one compare-and-swap, write them in parallel, and one *owner* per
//! gathered batch publishes PROD for everybody.
//!
//! Shared state:
//!
//! - `llq`: one 64-bit word holding the driver's PROD (low half, with the `OWNED` flag in
//!   bit 31) and its snapshot of CONS (high half). A CPU reserves `n` slots by CAS from
//!   `{prod, cons}` to `{prod + n | OWNED, cons}`; if `OWNED` was clear in the value it
//!   replaced, it has become the owner of the batch that starts at its `prod`.
//! - `valid`: one bit per slot. Writers *toggle* their bits after writing; a bit is valid
//!   when it differs from the slot position's wrap bit, so no one ever clears the map.
//! - `owner_prod`: where the previous owner stopped; the next owner waits for it.
//! - `lock`: a counter lock (Linux `arm_smmu_cmdq_shared_lock`). CPUs waiting for a
//!   `CMD_SYNC` hold it shared; a CPU that finds the queue full refreshes the `cons` half
//!   of `llq` from the CONS register only under `exclusive_trylock`. While anyone waits for
//!   a sync, the snapshot cannot move past that sync, so no producer can reserve (and
//!   overwrite) its slot before the waiter has seen the MSI land there. The last waiter out
//!   (`shared_tryunlock` fails) moves the snapshot past its own sync instead.
//!
//! `issue` then runs Linux's steps: 1. reserve; 2. write the commands (and the sync, taking
//! the lock shared); 3. toggle the valid bits; 4. as owner: a. wait for the previous owner,
//! b. clear `OWNED` (fetch-and), which closes the gathering window and yields the batch's
//! end, c. wait until the whole batch is valid, d. write PROD once, e. hand over through
//! `owner_prod`; 5. with a sync, wait for its MSI and leave the shared lock.

use super::cmdq::{
    validate_into, Cmdq, CmdqConfig, CmdqError, CmdqProducer, CommandSink, Encoded, Geometry,
    ProducerKind,
};
use super::spec::Command;
use super::sync::{AtomicI32, AtomicU32, AtomicU64, Backoff, Ordering};
use crate::work::{LockId, WorkRecord};

/// Bit 31 of the PROD half of `llq`: a CPU owns the batch being gathered.
const OWNED: u32 = 1 << 31;

fn pack(prod: u32, cons: u32) -> u64 {
    u64::from(prod) | (u64::from(cons) << 32)
}

fn unpack(v: u64) -> (u32, u32) {
    // Low and high halves; the casts select them.
    (v as u32, (v >> 32) as u32)
}

/// A command queue with Linux's lock-free multi-producer insertion.
pub struct LockFreeCmdq<S> {
    q: Cmdq<S>,
    llq: AtomicU64,
    owner_prod: AtomicU32,
    lock: AtomicI32,
    valid: Box<[AtomicU64]>,
}

impl<S: CommandSink> LockFreeCmdq<S> {
    /// An empty queue.
    pub fn new(config: CmdqConfig, sink: S) -> Result<Self, CmdqError> {
        let q = Cmdq::new(config, sink)?;
        let words = q.capacity().div_ceil(64);
        Ok(LockFreeCmdq {
            q,
            llq: AtomicU64::new(pack(0, 0)),
            owner_prod: AtomicU32::new(0),
            lock: AtomicI32::new(0),
            valid: (0..words).map(|_| AtomicU64::new(0)).collect(),
        })
    }

    // --- The cmdq lock (Linux's "bastardised rwlock"). ---

    /// Takes the lock shared; counts one acquisition of [`LockId::CmdqSharedLock`].
    fn shared_lock(&self, work: &mut WorkRecord) {
        work.lock(LockId::CmdqSharedLock);
        // Fast path: an increment. If the lock is held exclusive (i32::MIN + k) the value
        // stays negative and our increment is wiped by the exclusive unlock.
        if self.lock.fetch_add(1, Ordering::Acquire) >= 0 {
            return;
        }
        let mut backoff = Backoff::new();
        loop {
            let v = self.lock.load(Ordering::Relaxed);
            if v >= 0
                && self
                    .lock
                    .compare_exchange(v, v + 1, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
            {
                return;
            }
            backoff.snooze();
        }
    }

    fn shared_unlock(&self) {
        self.lock.fetch_sub(1, Ordering::Release);
    }

    /// Leaves the lock unless we appear to be the last holder (racy by design: two last
    /// holders may both leave, and then nobody moves the snapshot, which is only slower).
    fn shared_tryunlock(&self) -> bool {
        if self.lock.load(Ordering::Acquire) == 1 {
            return false;
        }
        self.shared_unlock();
        true
    }

    fn exclusive_trylock(&self) -> bool {
        self.lock
            .compare_exchange(0, i32::MIN, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    }

    /// Drops the exclusive hold, wiping the increments of sharers that tried meanwhile
    /// (they wait for the lock to be non-negative, then retry).
    fn exclusive_unlock(&self) {
        // A swap rather than Linux's plain store: same effect, but loom only keeps
        // read-modify-writes atomic with respect to other read-modify-writes, and a plain
        // store racing a sharer's increment lets it explore impossible executions.
        self.lock.swap(0, Ordering::Release);
    }

    /// Replaces the CONS snapshot in `llq`, leaving PROD and `OWNED` alone.
    fn set_cons_snapshot(&self, cons: u32) {
        // The closure always returns `Some`, so this cannot fail.
        let _ = self
            .llq
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
                Some(pack(unpack(v).0, cons))
            });
    }

    /// The queue looks too full for us: make the hardware progress (self-service), then, if
    /// the CONS register has moved past our snapshot, refresh the snapshot under
    /// `exclusive_trylock`. If the lock is held shared, a sync waiter will move the snapshot
    /// when it leaves. Returns a fresh `llq`.
    ///
    /// Linux takes the exclusive lock on every attempt; looking at CONS first (one more
    /// MMIO read) means a waiter only takes it when that helps, so it cannot keep a CPU
    /// that wants the lock shared out by grabbing it over and over (loom finds that
    /// starvation).
    fn wait_for_space(&self, snapshot: u32, work: &mut WorkRecord, backoff: &mut Backoff) -> u64 {
        work.polls += 1;
        let consumed = self.q.self_service() && self.q.service() > 0;
        if self.q.read_cons(work) != snapshot && self.exclusive_trylock() {
            work.lock(LockId::CmdqSharedLock);
            // Read again under the lock: a sync waiter may have moved the snapshot further
            // since, and the snapshot must never move backwards.
            let cons = self.q.read_cons(work);
            self.set_cons_snapshot(cons);
            self.exclusive_unlock();
        } else if !consumed {
            // Whatever we are waiting for (an unpublished batch, a sync waiter leaving the
            // shared lock) is another CPU's progress.
            backoff.snooze();
        }
        self.llq.load(Ordering::Acquire)
    }

    // --- The valid map. ---

    /// Calls `f(word, mask, wrap)` for each run of positions in `[start, end)` that shares a
    /// bitmap word (runs never cross the end of the queue, so each has one wrap value).
    fn for_each_run(geo: Geometry, start: u32, end: u32, mut f: impl FnMut(usize, u64, u32)) {
        let word_bits = geo.run_bits();
        let mut pos = start;
        let mut left = geo.distance(start, end);
        while left > 0 {
            let idx = geo.idx(pos);
            let bit = idx % 64;
            let len = (word_bits - bit).min(left);
            // `len` is 1..=64: the low `len` bits.
            let ones = u64::MAX >> (64 - len);
            f((idx / 64) as usize, ones << bit, geo.wrp(pos));
            pos = geo.inc(pos, len);
            left -= len;
        }
    }

    /// Marks `[start, end)` valid by toggling its bits; releases the slot writes.
    fn set_valid(&self, start: u32, end: u32) {
        Self::for_each_run(self.q.geometry(), start, end, |w, mask, _| {
            self.valid[w].fetch_xor(mask, Ordering::Release);
        });
    }

    /// Waits until all of `[start, end)` is valid: bits set on an even lap, clear on an odd
    /// one.
    fn poll_valid(&self, start: u32, end: u32) {
        Self::for_each_run(self.q.geometry(), start, end, |w, mask, wrap| {
            let want = if wrap == 0 { mask } else { 0 };
            let mut backoff = Backoff::new();
            while self.valid[w].load(Ordering::Acquire) & mask != want {
                backoff.snooze();
            }
        });
    }
}

impl<S: CommandSink> CmdqProducer for LockFreeCmdq<S> {
    type Sink = S;

    fn kind(&self) -> ProducerKind {
        ProducerKind::LockFree
    }

    fn cmdq(&self) -> &Cmdq<S> {
        &self.q
    }

    fn issue(&self, cmds: &[Command], sync: bool, work: &mut WorkRecord) -> Result<(), CmdqError> {
        let mut encoded = Encoded::new();
        validate_into(cmds, &mut encoded)?;
        let slots = cmds.len() + usize::from(sync);
        if slots == 0 {
            return Ok(());
        }
        if slots > self.q.capacity() {
            return Err(CmdqError::TooManyCommands {
                slots,
                capacity: self.q.capacity(),
            });
        }
        // `slots` fits the queue, which has at most 2^16 slots.
        let n = slots as u32;
        let geo = self.q.geometry();

        // 1. Reserve `n` slots and find out whether we own the batch.
        let mut old = self.llq.load(Ordering::Acquire);
        let mut backoff = Backoff::new();
        let (start, end, owner) = loop {
            let (prod_flags, cons) = unpack(old);
            let prod = prod_flags & !OWNED;
            if !geo.has_space(prod, cons, n) {
                old = self.wait_for_space(cons, work, &mut backoff);
                continue;
            }
            let end = geo.inc(prod, n);
            work.cas_attempts += 1;
            match self.llq.compare_exchange(
                old,
                pack(end | OWNED, cons),
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => break (prod, end, prod_flags & OWNED == 0),
                Err(now) => {
                    work.cas_failures += 1;
                    old = now;
                }
            }
        };

        // 2. Write our commands, and our sync (taking the lock shared before the sync can
        //    become visible, so the queue cannot lap it while we wait).
        for (i, cmd) in cmds.iter().enumerate() {
            self.q
                .write_slot(geo.inc(start, i as u32), encoded.get(i, cmd), work);
        }
        let sync_pos = geo.inc(start, cmds.len() as u32);
        if sync {
            self.q.write_slot(sync_pos, self.q.sync_for(sync_pos), work);
            self.shared_lock(work);
        }

        // 3. Mark our slots valid.
        self.set_valid(start, end);

        // 4. As owner, publish the whole gathered batch.
        if owner {
            work.owner_elections += 1;
            // a. Wait for the previous owner to hand over.
            let mut backoff = Backoff::new();
            while self.owner_prod.load(Ordering::Acquire) != start {
                backoff.snooze();
            }
            // b. Close the gathering window; the PROD we clear OWNED from ends our batch.
            //    OWNED is set (every reservation since ours kept it, and only the owner
            //    clears it), so subtracting it clears it: Linux's fetch-andnot, as one
            //    atomic add rather than a compare-and-swap loop.
            let closed = self.llq.fetch_sub(u64::from(OWNED), Ordering::AcqRel);
            debug_assert!(unpack(closed).0 & OWNED != 0, "owner found OWNED clear");
            let batch_end = unpack(closed).0 & !OWNED;
            // c. Wait for every gathered slot to be written.
            self.poll_valid(start, batch_end);
            // d. One PROD write for everybody.
            self.q.publish(batch_end, work);
            // e. Hand over to the next owner.
            self.owner_prod.store(batch_end, Ordering::Release);
        }

        // 5. Wait for our sync, then leave the lock; the last one out moves the CONS
        //    snapshot past its sync.
        if sync {
            self.q.wait_sync(sync_pos, work);
            if !self.shared_tryunlock() {
                self.set_cons_snapshot(geo.inc(sync_pos, 1));
                self.shared_unlock();
            }
        }
        Ok(())
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::smmuv3::NullSink;

    fn runs(log2size: u32, start: u32, end: u32) -> Vec<(usize, u64, u32)> {
        let mut v = Vec::new();
        LockFreeCmdq::<NullSink>::for_each_run(
            Geometry::new(log2size),
            start,
            end,
            |w, m, wrap| v.push((w, m, wrap)),
        );
        v
    }

    #[test]
    fn valid_map_runs_split_at_words_and_at_the_queue_end() {
        // 128 slots, two words. Positions 60..70 cross from word 0 into word 1.
        assert_eq!(runs(7, 60, 70), vec![(0, 0xf << 60, 0), (1, 0x3f, 0)]);
        // 125..131 crosses the end of the queue: slots 125..128 on lap 0, 0..3 on lap 1.
        assert_eq!(runs(7, 125, 131), vec![(1, 0x7 << 61, 0), (0, 0x7, 1)]);
        // A whole lap from 64: word 1 then word 0 of the next lap.
        assert_eq!(runs(7, 64, 192), vec![(1, u64::MAX, 0), (0, u64::MAX, 1)]);
        // Queues smaller than a word use its low bits: 4 slots, 3..6 wraps after slot 3.
        assert_eq!(runs(2, 3, 6), vec![(0, 0x8, 0), (0, 0x3, 1)]);
        assert!(runs(2, 5, 5).is_empty());
    }

    #[test]
    fn valid_bits_toggle_per_lap() {
        let q = LockFreeCmdq::new(CmdqConfig::with_log2size(2), NullSink).unwrap();
        // Lap 0: a slot is valid when its bit is set.
        q.set_valid(0, 4);
        assert_eq!(q.valid[0].load(Ordering::Relaxed), 0xf);
        q.poll_valid(0, 4);
        // Lap 1: the same slots are valid again once toggled back to clear.
        q.set_valid(4, 6);
        assert_eq!(q.valid[0].load(Ordering::Relaxed), 0xc);
        q.poll_valid(4, 6);
    }
}
