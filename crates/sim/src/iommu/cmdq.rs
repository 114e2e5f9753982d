//! The SMMUv3 command queue in virtual time: the timing model every SMMUv3 DMA path of the
//! lab issues its invalidations through (the lab's block stack, on which the `smmuv3-cmdq` and
//! `protection` experiments run, hostile devices included).
//!
//! The functional queue of `iolab_iommu::smmuv3` builds the commands and counts the
//! commands written and the PROD writes ([`QueueWork`]); `SimCmdq` gives them their
//! time. The SMMU consumes commands at the profile's rate, a sync completes when the
//! consumer passes it plus the sync latency; the spinlock design ([`Mode::Spinlock`],
//! Linux <= 5.2) holds one engine [`SpinLock`] while writing and while waiting for the sync;
//! the lock-free design ([`Mode::LockFree`], Linux 5.4 onwards) reserves slots with the
//! driver's `cmpxchg` loop on the shared `{prod, cons | OWNED}` word, an engine
//! [`CacheLine`]: each attempt needs the line exclusively, attempts of all CPUs are granted
//! one transfer at a time, and an attempt fails when another CPU changed the word since this
//! CPU read it (with near atomics, a retry issued while the CPU still holds the line
//! succeeds; with far atomics every retry waits its turn at the line's home, so failures
//! grow with the contenders: docs/model/contention.md); [`Mode::AtomicAdd`] is John
//! Garry's unmerged 2020 variant that reserves with one atomic add instead. Both gather the
//! commands and syncs of CPUs that reserve while an owner's window is open (up to `batch_max` commands, one PROD write for
//! the batch), and waits for each CPU's sync without a lock. A CPU learns of a sync's
//! completion by an MSI or by polling the CONS register ([`SyncWait`]).
//!
//! See docs/model/smmuv3-cmdq.md for the model and its sources.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use serde::Serialize;

use iolab_iommu::hw::QueueWork;

use crate::accounting::Account;
use crate::cost::{CostError, PlatformProfile};
use crate::engine::{Completion, Ctx, Handle, SimDuration, SimError, SimTime, Spend};
use crate::resources::{CacheLine, LineParams, LockKind, SpinGuard, SpinLock, SpinParams};
use crate::trace::{Tracer, Track};

/// Why a timed command queue could not be built.
#[derive(Debug, thiserror::Error)]
pub enum CmdqError {
    /// The platform profile lacks the command-queue costs (`[iommu.cmdq]`) or is malformed.
    #[error(transparent)]
    Cost(#[from] CostError),
    /// The simulation refused one of the queue's resources (its lock or cache lines).
    #[error("Simulation failed: {0}")]
    Sim(#[from] SimError),
}

/// Which command queue (or none) a configuration runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Pre-2019: one spinlock around insertion, sync waited for under the lock.
    Spinlock,
    /// 2019 (Linux 5.4 onwards): lock-free insertion reserving slots with a `cmpxchg`
    /// loop, gathered batches with one sync.
    LockFree,
    /// John Garry's 2020 series (not merged): the lock-free queue reserving slots with one
    /// atomic add on the producer index instead of the `cmpxchg` loop.
    AtomicAdd,
    /// No IOMMU (DMA addresses are physical).
    Off,
}

impl Mode {
    /// The id used in figure and effect names.
    pub fn id(self) -> &'static str {
        match self {
            Mode::Spinlock => "spinlock",
            Mode::LockFree => "lockfree",
            Mode::AtomicAdd => "atomic-add",
            Mode::Off => "off",
        }
    }
}

/// The SMMU's command consumer: one command at a time at its rate.
#[derive(Debug, Default)]
struct Smmu {
    busy_until: Cell<u64>,
    consumed: Cell<u64>,
    syncs: Cell<u64>,
    /// When the consumer passes the last published command, if that command was a
    /// CMD_SYNC (Linux <= 5.2 with MSIs piggy-backs on it: `prev_cmd_opcode`).
    last_sync_passed: Cell<Option<u64>>,
}

impl Smmu {
    /// `n` commands published at `now` (`sync`: the last is a CMD_SYNC): when the consumer
    /// passes the last.
    fn publish(&self, tracer: &Tracer, now: u64, n: u64, consume_ns: u64, sync: bool) -> u64 {
        let start = now.max(self.busy_until.get());
        let end = start + n * consume_ns;
        if tracer.is_on() {
            tracer.slice(
                Track::Iommu("cmdq consumer".into()),
                "consume",
                start,
                end - start,
                &[("cmds", n)],
            );
        }
        self.busy_until.set(end);
        self.consumed.set(self.consumed.get() + n);
        self.syncs.set(self.syncs.get() + u64::from(sync));
        self.last_sync_passed.set(sync.then_some(end));
        end
    }
}

/// How a CPU learns that its `CMD_SYNC` completed (Linux `arm_smmu_cmdq_poll_until_sync`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncWait {
    /// The SMMU writes an MSI into the sync command (SMMU_IDR0.MSI with coherency): the
    /// CPU polls cacheable memory and sees the completion as it lands.
    Msi,
    /// No MSI: the CPU reads the SMMU's CONS register (`readl`) until it has passed the
    /// sync; each read is a non-posted MMIO read (`mmio.read` of the profile), so the
    /// completion is seen by the first read issued after it, one read later.
    ConsPoll,
}

/// What the simulated queue did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct CmdqStats {
    /// Issue calls (one per unmap that needed invalidation).
    pub issues: u64,
    /// Commands written by CPUs, syncs included.
    pub commands: u64,
    /// Commands the SMMU consumed.
    pub consumed: u64,
    /// Syncs the SMMU completed.
    pub syncs: u64,
    /// Batches published (lock-free: owners; spinlock: every issue).
    pub batches: u64,
    /// Issues whose commands joined another CPU's batch.
    pub gathered: u64,
    /// Failed compare-and-swap attempts (lock-free).
    pub cas_failures: u64,
    /// Compare-and-swap attempts (lock-free).
    pub cas_attempts: u64,
    /// Total ns CPUs spent waiting for syncs (polling).
    pub sync_wait_ns: u64,
    /// CONS register reads made while polling for syncs (0 with MSI completion).
    pub cons_reads: u64,
    /// Spinlock design with MSIs: syncs not inserted because the previous command was
    /// already a CMD_SYNC (the caller waits for that one).
    pub piggybacked: u64,
}

impl CmdqStats {
    /// Adds another queue's counts (the queues of several IOMMU instances).
    pub fn merge(&mut self, o: &CmdqStats) {
        self.issues += o.issues;
        self.commands += o.commands;
        self.consumed += o.consumed;
        self.syncs += o.syncs;
        self.batches += o.batches;
        self.gathered += o.gathered;
        self.cas_failures += o.cas_failures;
        self.cas_attempts += o.cas_attempts;
        self.sync_wait_ns += o.sync_wait_ns;
        self.cons_reads += o.cons_reads;
        self.piggybacked += o.piggybacked;
    }
}

struct Gather {
    open: bool,
    cmds: u64,
    /// When the last gathered slot is written and marked valid.
    valid_at: u64,
    /// Joiners: (their commands including their sync, their sync's completion; `None`
    /// for a list without a sync).
    waiters: Vec<Waiter>,
}

/// A joiner of a gathered batch: its commands including its sync, whether it has a sync,
/// and its sync's completion (`None` for a list without a sync).
type Waiter = (u64, bool, Option<Completion<u64>>);

/// The command queue of one SMMU in virtual time, for one of the three producer designs.
pub(crate) struct SimCmdq {
    mode: Mode,
    smmu: Smmu,
    lock: Option<SpinLock>,
    /// The costs of an atomic on a line and of moving a line between CPUs.
    line: LineParams,
    /// The shared `{prod, cons | OWNED}` word (`cmdq->q.llq`) the lock-free designs
    /// reserve slots on.
    prod: CacheLine,
    /// `cmdq->lock`, the counter taken shared by CPUs waiting on a sync.
    shared_line: CacheLine,
    /// `cmdq->valid_map`: the bitmap word a CPU toggles to mark its slots valid and the
    /// owner reads to see the gathered slots valid.
    valid_map: CacheLine,
    /// `cmdq->owner_prod`: read by an owner waiting for the previous owner, then set.
    owner_prod: CacheLine,
    /// CPUs holding the shared lock (waiting on a sync).
    shared_holders: Cell<u64>,
    gather: RefCell<Gather>,
    prev_owner_done: Cell<u64>,
    last_holder: Cell<Option<usize>>,
    lock_acquire_ns: u64,
    consume_ns: u64,
    sync_ns: u64,
    cmd_write_ns: u64,
    mmio_write_ns: u64,
    mmio_read_ns: u64,
    sync_wait: SyncWait,
    owner_ns: u64,
    batch_max: u64,
    stats: RefCell<CmdqStats>,
    /// Joiners' sync completions whose value was taken, reset for reuse (saves an
    /// allocation per joiner).
    spare_done: RefCell<Vec<Completion<u64>>>,
    h: Handle,
}

/// A busy wait that may be empty (the target time has passed): a [`Spend`] or nothing.
struct MaybeSpend<'a>(Option<Spend<'a>>);

impl Future for MaybeSpend<'_> {
    type Output = ();

    #[inline(always)]
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        match self.0.as_mut() {
            Some(spend) => Pin::new(spend).poll(cx),
            None => Poll::Ready(()),
        }
    }
}

impl SimCmdq {
    /// A queue of design `mode` timed with `p`'s costs, gathering up to `batch_max`
    /// commands, with `tag` appended to the names of the queue's engine resources (its lock
    /// and cache lines), so that the queues of several SMMU instances are told apart in
    /// reports and traces ("" for the first, as with one queue).
    pub(crate) fn new_tagged(
        h: &Handle,
        mode: Mode,
        p: &PlatformProfile,
        batch_max: u32,
        tag: &str,
        lock_kind: LockKind,
    ) -> Result<Self, CmdqError> {
        let cq = p.require_cmdq()?;
        let r = |x: f64| x.round() as u64;
        let lock = match mode {
            Mode::Spinlock => Some(SpinLock::new(
                h,
                format!("cmdq_lock{tag}"),
                SpinParams {
                    acquire_ns: r(p.sync.lock_acquire_release.ns() / 2.0),
                    release_ns: r(p.sync.lock_acquire_release.ns() / 2.0),
                    handoff_ns: r(p.sync.lock_handoff.ns()),
                    kind: lock_kind,
                },
            )?),
            _ => None,
        };
        let line = p.line_params();
        Ok(SimCmdq {
            mode,
            smmu: Smmu::default(),
            lock,
            line,
            prod: CacheLine::new(h, format!("cmdq_prod{tag}"), line)?,
            shared_line: CacheLine::new(h, format!("cmdq_shared_lock{tag}"), line)?,
            valid_map: CacheLine::new(h, format!("cmdq_valid_map{tag}"), line)?,
            owner_prod: CacheLine::new(h, format!("cmdq_owner_prod{tag}"), line)?,
            shared_holders: Cell::new(0),
            gather: RefCell::new(Gather {
                open: false,
                cmds: 0,
                valid_at: 0,
                waiters: Vec::new(),
            }),
            prev_owner_done: Cell::new(0),
            last_holder: Cell::new(None),
            lock_acquire_ns: r(p.sync.lock_acquire_release.ns() / 2.0),
            consume_ns: r(cq.command_consume.ns()),
            sync_ns: r(cq.sync_latency.ns()),
            cmd_write_ns: r(p.cpu.command_write.ns()),
            mmio_write_ns: r(p.mmio.write.ns()),
            mmio_read_ns: r(p.mmio.read.ns()).max(1),
            sync_wait: SyncWait::Msi,
            owner_ns: r(p.cpu.owner_election.ns()),
            batch_max: u64::from(batch_max),
            stats: RefCell::new(CmdqStats::default()),
            spare_done: RefCell::new(Vec::new()),
            h: h.clone(),
        })
    }

    /// The same queue with CPUs learning of sync completion by `wait` (default
    /// [`SyncWait::Msi`]).
    pub(crate) fn with_sync_wait(mut self, wait: SyncWait) -> Self {
        self.sync_wait = wait;
        self
    }

    /// When a CPU that starts polling at `now` sees a sync that completes at `t`.
    fn sync_seen_at(&self, now: u64, t: u64) -> (u64, u64) {
        match self.sync_wait {
            SyncWait::Msi => (t.max(now), 0),
            SyncWait::ConsPoll => {
                // Reads issued back to back from `now`; each samples CONS about half-way
                // through its round trip and returns a full read time after issue. The
                // first read always happens (the software copy of cons is behind).
                let r = self.mmio_read_ns;
                let need = t.saturating_sub(now + r / 2);
                let reads = need.div_ceil(r) + 1;
                (now + reads * r, reads)
            }
        }
    }

    /// Polls (busy, system time) until the sync completing at `t` is seen; `label` names
    /// the wait in a timeline trace. Counts its CONS reads when called (it is awaited at
    /// once): a plain function, so the wait is no extra state machine in the caller's.
    #[inline]
    fn poll_sync<'a>(&self, ctx: &'a Ctx, t: u64, label: &'static str) -> MaybeSpend<'a> {
        let now = ctx.now().as_ns();
        let (seen, reads) = self.sync_seen_at(now, t);
        {
            let mut s = self.stats.borrow_mut();
            s.cons_reads += reads;
        }
        self.poll_until(ctx, seen, label)
    }

    /// Polls (busy, system time) until `t`; `label` names the wait in a timeline trace.
    /// Like [`SimCmdq::poll_sync`], a plain function whose future is the spend itself.
    #[inline]
    fn poll_until<'a>(&self, ctx: &'a Ctx, t: u64, label: &'static str) -> MaybeSpend<'a> {
        let now = ctx.now().as_ns();
        MaybeSpend((t > now).then(|| {
            self.stats.borrow_mut().sync_wait_ns += t - now;
            ctx.cpu()
                .spend_labeled(SimDuration::ns(t - now), Account::System, label)
        }))
    }

    /// Issues the queue share of one DMA-API call (split off its work record with
    /// [`split_queue_work`]), if it ended in a `CMD_SYNC`: its invalidation commands plus a
    /// `CMD_SYNC`, and waits for the sync. Commands without a sync stay in the functional
    /// queue's batch and cost nothing here. `work.prod_writes` is the functional producer's
    /// count of PROD writes (the spinlock design writes PROD once per command).
    pub(crate) async fn issue_work(&self, ctx: &Ctx, work: &QueueWork) {
        if work.syncs == 0 {
            return;
        }
        let (cmds, prod_writes) = (work.invalidations(), work.prod_writes);
        {
            let mut s = self.stats.borrow_mut();
            s.issues += 1;
            s.commands += cmds + 1;
        }
        let t0 = ctx.now();
        match self.mode {
            Mode::Spinlock => self.issue_spinlock(ctx, cmds, prod_writes).await,
            Mode::LockFree | Mode::AtomicAdd => {
                // Linux 5.3 arm_smmu_tlb_inv_range: the TLBIs go in lists of up to
                // CMDQ_BATCH_ENTRIES (`batch_max`) without a sync, the last list with one.
                // Each list is Linux 5.3 `arm_smmu_cmdq_issue_cmdlist`: `n` commands, plus
                // a `CMD_SYNC` and the wait for it if `sync`. (Written out here rather than
                // as an `async fn` of its own: every poll of the issuing task descended
                // through that extra state machine, about 6.5 times per I/O at 64 vCPUs.)
                let mut left = cmds;
                loop {
                    let sync = left <= self.batch_max;
                    let n = if sync { left } else { self.batch_max };
                    let mine = n + u64::from(sync);
                    // 1. Reserve slots on the shared {prod, cons | OWNED} word. The queue
                    // (256 slots) never fills here: each CPU has at most one list in it.
                    let attempts = self.reserve(ctx).await;
                    {
                        let mut s = self.stats.borrow_mut();
                        s.cas_attempts += attempts;
                        s.cas_failures += attempts - 1;
                    }
                    // Whether this CPU owns the batch was decided by its CAS: the OWNED flag was
                    // clear. Gathering is bounded only by queue space (no batch limit in 5.3).
                    let write = mine * self.cmd_write_ns;
                    let join = {
                        let mut g = self.gather.borrow_mut();
                        if g.open {
                            g.cmds += mine;
                            // Our slots become valid once we have written them, taken the shared
                            // lock and toggled the valid bits.
                            let atomics = u64::from(sync) + 1;
                            let valid_at =
                                ctx.now().as_ns() + atomics * self.line_cost_hint() + write;
                            g.valid_at = g.valid_at.max(valid_at);
                            let c = sync.then(|| self.new_done());
                            g.waiters.push((mine, sync, c.clone()));
                            Some(c)
                        } else {
                            g.open = true;
                            g.cmds = mine;
                            g.valid_at = 0;
                            g.waiters.clear();
                            None
                        }
                    };
                    // 2. Write our commands and our own CMD_SYNC into the reserved slots.
                    ctx.cpu()
                        .spend(SimDuration::ns(write), Account::System)
                        .await;
                    // A CPU with a sync takes the queue lock shared (atomic_fetch_inc) so the queue
                    // cannot wrap twice under it.
                    if sync {
                        self.shared_line.rmw(ctx, Account::System).await;
                        self.shared_holders.set(self.shared_holders.get() + 1);
                    }
                    // 3. Mark our slots valid: atomic xor on the valid_map word.
                    self.valid_map.rmw(ctx, Account::System).await;
                    match join {
                        Some(done) => {
                            self.stats.borrow_mut().gathered += 1;
                            if let Some(done) = done {
                                let start = ctx.now().as_ns();
                                // The owner publishes; our sync completes when the SMMU passes it.
                                let completes = done.wait_polling(ctx, Account::System).await;
                                // We poll from when we started waiting: with CONS reads, the
                                // completion is seen by the first read issued after it.
                                let (seen, reads) = self.sync_seen_at(start, completes);
                                self.stats.borrow_mut().cons_reads += reads;
                                self.poll_until(ctx, seen, "cmdq sync wait").await;
                                ctx.trace_since("cmdq sync wait", SimTime::from_ns(start));
                                // (poll_until counted the part after the completion.)
                                self.stats.borrow_mut().sync_wait_ns +=
                                    completes.saturating_sub(start);
                                self.recycle_done(done);
                            }
                        }
                        None => {
                            // 4. Owner. a. Wait for the previous owner to have written PROD
                            // (reading owner_prod, last written by that owner).
                            ctx.cpu()
                                .spend(SimDuration::ns(self.owner_ns), Account::System)
                                .await;
                            let prev = self.prev_owner_done.get();
                            self.poll_until(ctx, prev, "cmdq previous owner wait").await;
                            self.owner_prod.rmw(ctx, Account::System).await;
                            // b. Clear the OWNED flag (atomic on the prod word): gathering stops.
                            self.prod.rmw(ctx, Account::System).await;
                            let (own, valid_at, waiters) = {
                                let mut g = self.gather.borrow_mut();
                                g.open = false;
                                let w = std::mem::take(&mut g.waiters);
                                let joined: u64 = w.iter().map(|x| x.0).sum();
                                (g.cmds - joined, g.valid_at, w)
                            };
                            // c. Wait until every gathered slot is valid (reading the valid_map the
                            // joiners toggled).
                            if !waiters.is_empty() {
                                self.poll_until(ctx, valid_at, "cmdq gathered slots wait")
                                    .await;
                                self.valid_map.rmw(ctx, Account::System).await;
                            }
                            // d. Write PROD once for the batch; e. release owner_prod (local line).
                            ctx.cpu()
                                .spend(SimDuration::ns(self.mmio_write_ns), Account::System)
                                .await;
                            self.owner_prod.rmw(ctx, Account::System).await;
                            let now = ctx.now().as_ns();
                            self.prev_owner_done.set(now);
                            // The SMMU consumes the batch in order; each CPU's sync completes when
                            // the consumer passes it plus the sync latency.
                            let mine_done =
                                self.smmu
                                    .publish(self.h.tracer(), now, own, self.consume_ns, sync)
                                    + self.sync_ns;
                            self.stats.borrow_mut().batches += 1;
                            for (n, has_sync, w) in waiters {
                                let passed = self.smmu.publish(
                                    self.h.tracer(),
                                    now,
                                    n,
                                    self.consume_ns,
                                    has_sync,
                                );
                                if let Some(w) = w {
                                    let done = passed + self.sync_ns;
                                    let _ = w.fire_at(SimTime::from_ns(done), done);
                                }
                            }
                            if sync {
                                // 5. Wait for our own sync.
                                self.poll_sync(ctx, mine_done, "cmdq sync wait").await;
                            }
                        }
                    }
                    if sync {
                        // arm_smmu_cmdq_shared_tryunlock: read the lock; the last reader out also
                        // writes the software cons into the shared prod/cons word, then decrements.
                        let last = self.shared_holders.get() == 1;
                        self.shared_holders.set(self.shared_holders.get() - 1);
                        if last {
                            self.prod.rmw(ctx, Account::System).await;
                        }
                        self.shared_line.rmw(ctx, Account::System).await;
                    }
                    if sync {
                        break;
                    }
                    left -= self.batch_max;
                }
            }
            Mode::Off => {}
        }
        ctx.trace_since("cmdq issue", t0);
    }

    /// One acquisition of the queue spinlock: an uncontended acquisition whose previous
    /// holder was another CPU still moves the lock word (and the queue's software
    /// prod/cons next to it) from that CPU's cache; contended hand-offs are charged by the
    /// lock itself.
    async fn spin_acquire<'a>(&'a self, ctx: &'a Ctx, lock: &'a SpinLock) -> SpinGuard<'a> {
        let t0 = ctx.now().as_ns();
        let g = lock.lock(ctx).await;
        let cpu = ctx.cpu().id();
        let waited = ctx.now().as_ns() - t0 > self.lock_acquire_ns;
        if let Some(last) = self.last_holder.get().filter(|&c| !waited && c != cpu) {
            let transfer = self.h.transfer_ns(last, cpu, self.line.transfer_ns);
            ctx.cpu()
                .spend(SimDuration::ns(transfer), Account::System)
                .await;
        }
        self.last_holder.set(Some(cpu));
        g
    }

    /// Linux <= 5.2: `arm_smmu_tlb_inv_range_nosync` issues each TLBI with
    /// `arm_smmu_cmdq_issue_cmd` (lock, write the command, write PROD, unlock), then
    /// `arm_smmu_cmdq_issue_sync` takes the lock again, writes the sync and PROD, and
    /// without MSIs (`__arm_smmu_cmdq_issue_sync`) polls CONS until the queue is empty
    /// while still holding the lock.
    async fn issue_spinlock(&self, ctx: &Ctx, cmds: u64, prod_writes: u64) {
        let Some(lock) = &self.lock else { return };
        // The functional producer writes PROD once per command.
        let sync_prod_writes = prod_writes.saturating_sub(cmds).max(1);
        for _ in 0..cmds {
            let g = self.spin_acquire(ctx, lock).await;
            ctx.cpu()
                .spend(
                    SimDuration::ns(self.cmd_write_ns + self.mmio_write_ns),
                    Account::System,
                )
                .await;
            self.smmu.publish(
                self.h.tracer(),
                ctx.now().as_ns(),
                1,
                self.consume_ns,
                false,
            );
            g.unlock().await;
        }
        let g = self.spin_acquire(ctx, lock).await;
        if self.sync_wait == SyncWait::Msi {
            // `__arm_smmu_cmdq_issue_sync_msi` (Linux 4.15-5.2, SMMU with MSIs and
            // coherency): under the lock, insert a CMD_SYNC whose MSI writes a sequence
            // number into `smmu->sync_count`, unless the last command inserted was
            // already a CMD_SYNC (it then covers our TLBIs too: piggy-back on it, 4.19
            // "Avoid back-to-back CMD_SYNC operations"); then poll `sync_count` in
            // memory outside the lock.
            let passed = match self.smmu.last_sync_passed.get() {
                Some(passed) => {
                    let mut s = self.stats.borrow_mut();
                    s.piggybacked += 1;
                    // No sync written: `issue` counted one.
                    s.commands -= 1;
                    passed
                }
                None => {
                    let write = self.cmd_write_ns + sync_prod_writes * self.mmio_write_ns;
                    ctx.cpu()
                        .spend(SimDuration::ns(write), Account::System)
                        .await;
                    self.stats.borrow_mut().batches += 1;
                    self.smmu
                        .publish(self.h.tracer(), ctx.now().as_ns(), 1, self.consume_ns, true)
                }
            };
            g.unlock().await;
            self.poll_sync(ctx, passed + self.sync_ns, "cmdq sync wait")
                .await;
            return;
        }
        let write = self.cmd_write_ns + sync_prod_writes * self.mmio_write_ns;
        ctx.cpu()
            .spend(SimDuration::ns(write), Account::System)
            .await;
        let passed =
            self.smmu
                .publish(self.h.tracer(), ctx.now().as_ns(), 1, self.consume_ns, true);
        self.stats.borrow_mut().batches += 1;
        self.poll_sync(ctx, passed + self.sync_ns, "cmdq sync wait")
            .await;
        g.unlock().await;
    }

    /// A joiner's sync completion, not fired: a reused one if there is one.
    fn new_done(&self) -> Completion<u64> {
        self.spare_done
            .borrow_mut()
            .pop()
            .unwrap_or_else(|| Completion::new(&self.h))
    }

    /// Keeps a joiner's completion whose value was taken for reuse (a completion still
    /// shared or not reusable is dropped).
    fn recycle_done(&self, done: Completion<u64>) {
        if done.is_unshared() && done.reset() {
            let mut spare = self.spare_done.borrow_mut();
            if spare.len() < 1024 {
                spare.push(done);
            }
        }
    }

    /// The time a joiner's atomic on a shared line is expected to take before its slots
    /// are valid: one cache-line transfer and one RMW.
    fn line_cost_hint(&self) -> u64 {
        self.line.transfer_ns + self.line.base_ns
    }

    /// Reserves slots on the `{prod, cons | OWNED}` word by `ctx`'s CPU; returns the
    /// attempts it took.
    ///
    /// [`Mode::LockFree`], Linux `arm_smmu_cmdq_issue_cmdlist`: read the word
    /// (`READ_ONCE(cmdq->q.llq.val)`), then `cmpxchg_relaxed` it to the new `prod`; a
    /// failed compare returns the current value and the loop retries with it at once. Each
    /// attempt is an exclusive access granted after those issued before it, and fails if
    /// another CPU's reservation, OWNED clear or `cons` update was granted since this CPU's
    /// read. [`Mode::AtomicAdd`]: one `atomic_fetch_add` on `prod`, which cannot fail.
    async fn reserve(&self, ctx: &Ctx) -> u64 {
        if self.mode == Mode::AtomicAdd {
            self.prod.rmw(ctx, Account::System).await;
            return 1;
        }
        let mut seen = self.prod.read(ctx, Account::System).await.version;
        let mut attempts = 0;
        loop {
            let a = self.prod.cas(ctx, Account::System, seen).await;
            attempts += u64::from(a.attempts);
            if a.succeeded {
                return attempts;
            }
            seen = a.version;
        }
    }

    /// What the queue did so far.
    pub(crate) fn stats(&self) -> CmdqStats {
        let mut s = *self.stats.borrow();
        s.consumed = self.smmu.consumed.get();
        s.syncs = self.smmu.syncs.get();
        s
    }
}
