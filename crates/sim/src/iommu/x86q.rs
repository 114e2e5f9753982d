//! The x86 IOMMUs' invalidation queues in virtual time: Intel VT-d's invalidation queue as
//! Linux's `qi_submit_sync` drives it, and AMD-Vi's command buffer as Linux's
//! `iommu_queue_command_sync` and `iommu_completion_wait` drive it (X86.md §2.4-2.5,
//! §4.1-4.2). The lab's fio and bonnie on block devices issue every strict unmap's (and
//! every lazy flush's) invalidation through it.
//!
//! The functional models (`iolab_iommu::vtd`, `iolab_iommu::amdvi`) build the descriptors,
//! apply them to the unit's caches and count what the driver wrote: descriptors or
//! commands (waits included), tail writes and waits ([`QueueWork`]). `SimX86Queue` gives
//! them their time, as `SimCmdq` (`crate::iommu::cmdq`) does for SMMUv3:
//!
//! - The unit consumes descriptors one at a time at the profile's
//!   `iommu.cmdq.command_consume`, in order, from when their tail write lands; a wait
//!   completes `iommu.cmdq.sync_latency` after the consumer passes it (the status write to
//!   memory).
//! - The domain's lock (VT-d `domain->cache_lock` since Linux 6.10, AMD-Vi `dom->lock`) is
//!   an engine [`SpinLock`] held across the whole flush and its wait: strict unmaps of one
//!   domain (the lab has one) serialise for a whole round trip, waiters spinning.
//! - VT-d: under `qi->q_lock` the CPU writes the batch's descriptors and the wait
//!   (`cpu.command_write` each) and one IQT write (`mmio.write`), then polls the wait's
//!   status word; each look that finds it not done reads FSTS (`qi_check_fault`: one
//!   `mmio.read`) and drops and retakes `q_lock` (one `sync.lock_acquire_release`), so the
//!   completion is seen at the first look after it.
//! - AMD-Vi: each command is queued under `iommu->lock` with its own Tail write; the
//!   `COMPLETION_WAIT` is queued and its semaphore polled under `iommu->lock`: a look that
//!   finds it not stored waits `udelay(1)` before looking again, so the wait is seen in
//!   whole microseconds ([`AMD_POLL_NS`]).
//!
//! The unit's own lock (`q_lock`, `iommu->lock`) is charged uncontended: every path to it
//! in the lab holds the domain's lock first, and the lab has one domain.

use std::cell::{Cell, RefCell};

use iolab_iommu::hw::{split_queue_work, QueueWork};
use iolab_iommu::work::{LockId, WorkRecord};

use crate::accounting::Account;
use crate::cost::PlatformProfile;
use crate::engine::{Ctx, Handle, SimDuration, SimTime};
use crate::iommu::cmdq::{CmdqError, CmdqStats};
use crate::resources::{LockKind, SpinLock, SpinParams};
use crate::trace::Track;

/// AMD-Vi: the delay between two looks at the completion-wait semaphore (Linux
/// `wait_on_sem`: `udelay(1)`), ns.
pub const AMD_POLL_NS: u64 = 1000;

/// Which driver's queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum X86QueueKind {
    /// Intel VT-d queued invalidation (`qi_submit_sync`).
    Vtd,
    /// AMD-Vi command buffer (`iommu_queue_command_sync`, `iommu_completion_wait`).
    AmdVi,
}

/// Moves the queue's part out of an x86 unmap's or map's work record: the descriptors or
/// commands, waits and tail writes ([`split_queue_work`], which also clears the producer's
/// polls, register reads and the unit's lock), and the domain lock taken per wait (VT-d
/// `cache_lock`, counted as [`LockId::Other`]; AMD-Vi `dom->lock`, counted as
/// [`LockId::PageTable`]): `SimX86Queue::issue` times and charges them. What is left is
/// the CPU's own work.
pub fn split_x86_queue_work(kind: X86QueueKind, w: &mut WorkRecord) -> QueueWork {
    let q = split_queue_work(w);
    let id = match kind {
        X86QueueKind::Vtd => LockId::Other,
        X86QueueKind::AmdVi => LockId::PageTable,
    } as usize;
    w.locks[id] = w.locks[id].saturating_sub(q.syncs);
    q
}

/// The invalidation queue (VT-d) or command buffer (AMD-Vi) of one unit in virtual time.
pub(crate) struct SimX86Queue {
    kind: X86QueueKind,
    /// The domain's lock, held across a flush and its wait.
    domain_lock: SpinLock,
    /// When the unit's consumer is free.
    busy_until: Cell<u64>,
    consume_ns: u64,
    sync_ns: u64,
    cmd_write_ns: u64,
    mmio_write_ns: u64,
    mmio_read_ns: u64,
    /// One uncontended acquire and release of the unit's lock.
    lock_ns: u64,
    stats: RefCell<CmdqStats>,
    h: Handle,
}

impl SimX86Queue {
    /// The queue of `kind` on `h` with `p`'s costs (`[iommu.cmdq]`, `cpu.command_write`,
    /// `mmio`, `sync`), `tag` appended to the name of the domain lock so that the queues of
    /// several units are told apart in reports and traces ("" for the first).
    pub(crate) fn new_tagged(
        h: &Handle,
        kind: X86QueueKind,
        p: &PlatformProfile,
        tag: &str,
        lock_kind: LockKind,
    ) -> Result<Self, CmdqError> {
        let q = p.require_cmdq()?;
        let r = |x: f64| x.round() as u64;
        let lock = SpinParams {
            acquire_ns: r(p.sync.lock_acquire_release.ns() / 2.0),
            release_ns: r(p.sync.lock_acquire_release.ns() / 2.0),
            handoff_ns: r(p.sync.lock_handoff.ns()),
            kind: lock_kind,
        };
        let name = match kind {
            X86QueueKind::Vtd => "vtd_cache_lock",
            X86QueueKind::AmdVi => "amdvi_dom_lock",
        };
        Ok(SimX86Queue {
            kind,
            domain_lock: SpinLock::new(h, format!("{name}{tag}"), lock)?,
            busy_until: Cell::new(0),
            consume_ns: r(q.command_consume.ns()),
            sync_ns: r(q.sync_latency.ns()),
            cmd_write_ns: r(p.cpu.command_write.ns()),
            mmio_write_ns: r(p.mmio.write.ns()),
            mmio_read_ns: r(p.mmio.read.ns()).max(1),
            lock_ns: r(p.sync.lock_acquire_release.ns()),
            stats: RefCell::new(CmdqStats::default()),
            h: h.clone(),
        })
    }

    /// The unit consumes `n` descriptors published at `now`: when it passes the last.
    fn publish(&self, now: u64, n: u64, sync: bool) -> u64 {
        let start = now.max(self.busy_until.get());
        let end = start + n * self.consume_ns;
        if self.h.tracer().is_on() {
            self.h.tracer().slice(
                Track::Iommu("invalidation queue".into()),
                "consume",
                start,
                end - start,
                &[("descs", n)],
            );
        }
        self.busy_until.set(end);
        let mut s = self.stats.borrow_mut();
        s.consumed += n;
        s.syncs += u64::from(sync);
        end
    }

    async fn busy(&self, ctx: &Ctx, ns: u64) {
        if ns > 0 {
            ctx.cpu().spend(SimDuration::ns(ns), Account::System).await;
        }
    }

    /// Issues what one map or unmap left for the queue (from [`split_x86_queue_work`]) on
    /// `ctx`'s CPU, returning when its last wait was seen complete.
    pub(crate) async fn issue(&self, ctx: &Ctx, q: &QueueWork) {
        if q.commands == 0 {
            return;
        }
        let t0 = ctx.now();
        {
            let mut s = self.stats.borrow_mut();
            s.issues += 1;
            s.commands += q.commands;
        }
        let g = self.domain_lock.lock(ctx).await;
        // Waits are the syncs; every submission ends with one (a record without one,
        // never produced by the drivers, is published without waiting).
        let waits = q.syncs.min(q.commands);
        let others = q.commands - waits;
        match self.kind {
            X86QueueKind::Vtd => {
                // One qi_submit_sync per wait; the other descriptors spread over them.
                let batches = waits.max(1);
                for b in 0..batches {
                    let n = others / batches + u64::from(b < others % batches);
                    let has_wait = waits > 0;
                    let descs = n + u64::from(has_wait);
                    // q_lock, the descriptors and the wait, one IQT write.
                    self.busy(
                        ctx,
                        self.lock_ns / 2 + descs * self.cmd_write_ns + self.mmio_write_ns,
                    )
                    .await;
                    let now = ctx.now().as_ns();
                    let passed = self.publish(now, descs, has_wait);
                    self.stats.borrow_mut().batches += 1;
                    if has_wait {
                        let done = passed + self.sync_ns;
                        // Each look that finds the status not done: FSTS read, unlock,
                        // cpu_relax, lock.
                        let step = self.mmio_read_ns + self.lock_ns;
                        let looks = done.saturating_sub(now).div_ceil(step);
                        {
                            let mut s = self.stats.borrow_mut();
                            s.cons_reads += looks;
                            s.sync_wait_ns += done.saturating_sub(now);
                        }
                        self.busy(ctx, looks * step).await;
                    }
                    self.busy(ctx, self.lock_ns - self.lock_ns / 2).await;
                }
            }
            X86QueueKind::AmdVi => {
                // Each command under iommu->lock with its own Tail write.
                for _ in 0..others {
                    self.busy(ctx, self.lock_ns + self.cmd_write_ns + self.mmio_write_ns)
                        .await;
                    self.publish(ctx.now().as_ns(), 1, false);
                }
                for _ in 0..waits {
                    // COMPLETION_WAIT queued and polled under iommu->lock.
                    self.busy(
                        ctx,
                        self.lock_ns / 2 + self.cmd_write_ns + self.mmio_write_ns,
                    )
                    .await;
                    let now = ctx.now().as_ns();
                    let done = self.publish(now, 1, true) + self.sync_ns;
                    self.stats.borrow_mut().batches += 1;
                    // A look at the semaphore; if not stored, udelay(1) and look again.
                    let delays = done.saturating_sub(now).div_ceil(AMD_POLL_NS);
                    {
                        let mut s = self.stats.borrow_mut();
                        s.cons_reads += delays;
                        s.sync_wait_ns += done.saturating_sub(now);
                    }
                    self.busy(
                        ctx,
                        delays * AMD_POLL_NS + (self.lock_ns - self.lock_ns / 2),
                    )
                    .await;
                }
            }
        }
        g.unlock().await;
        ctx.trace_since("x86 invalidation", SimTime::from_ns(t0.as_ns()));
    }

    /// Which driver's queue this is.
    pub(crate) fn kind(&self) -> X86QueueKind {
        self.kind
    }

    /// What the queue did so far. `cons_reads` counts the looks at a wait that found it not
    /// done: VT-d reads FSTS at each, AMD-Vi waits `udelay(1)` after each. `sync_wait_ns`
    /// is from the tail write to the wait's completion (the CPU sees it at its next look).
    pub(crate) fn stats(&self) -> CmdqStats {
        *self.stats.borrow()
    }
}
