//! A spinlock, with the hand-off cost of the lock algorithm the real code uses.
//!
//! Model, per acquisition by a task on CPU `c` at time `t`:
//! 1. The task takes its place in line at `t` (the ticket `fetch_add`, the queued lock's
//!    `xchg`, the test-and-set's first atomic) and spends [`SpinParams::acquire_ns`] of
//!    system time on that atomic.
//! 2. If the lock was free and nobody was queued, it holds the lock from `t`: the
//!    uncontended cost is `acquire_ns` now and [`SpinParams::release_ns`] at unlock, and
//!    nothing else.
//! 3. Otherwise it spins, its CPU busy and charged to [`Account::Spin`], until the holder
//!    ahead of it releases at `r` and the lock reaches it at `r + hand-off`. Waiters are
//!    served in arrival order.
//!
//! The hand-off depends on how the waiters spin ([`LockKind`]), with `n` CPUs waiting and
//! `x` the line transfer from the releasing CPU to the next holder (the engine's topology
//! distance, or half of [`SpinParams::handoff_ns`] without one):
//! - [`LockKind::Queued`] (MCS, Linux's qspinlock): each waiter spins on its own node, so
//!   a release moves one line to one waiter: `2x` (it reads the release, then takes the
//!   lock word), whatever `n`;
//! - [`LockKind::Ticket`]: every waiter spins reading the one lock word; the release
//!   invalidates all their copies and they re-read it one transfer at a time, the next
//!   ticket's holder among them: `2x + (n - 1) x / 2` on average (Boyd-Wickizer et al.,
//!   "Non-scalable locks are dangerous", Linux Symposium 2012: hand-off time grows with
//!   the waiters);
//! - [`LockKind::TestAndSet`]: every waiter sees the release and tries its atomic; the
//!   line serves them one at a time and the losers' attempts hold the line the new
//!   holder then needs: `2x + (n - 1) x`. (Who wins is not modelled: the line stays
//!   FIFO, only the cost grows.)
//!
//! Statistics: a *wait* is the time from the end of the acquire cost to holding the lock
//! (zero when uncontended); *contended* counts acquisitions that found the lock held or
//! waiters queued.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use crate::accounting::{Account, LockStats};
use crate::engine::kernel::{Burn, State};
use crate::engine::{Ctx, Handle, SimError};
use crate::resources::line::{lock_cpu, lock_guard, register, Release, Unlocking, WaitLine};

/// Costs of a spinlock, in nanoseconds.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct SpinParams {
    /// The acquiring atomic (ticket `fetch_add` or queued-lock `xchg`). Assumed 20 ns: a
    /// locked read-modify-write on a line already in the local cache, about 40-60 cycles
    /// at 2-3 GHz.
    pub acquire_ns: u64,
    /// The releasing store. Assumed 5 ns (a plain store with release ordering).
    pub release_ns: u64,
    /// From a release to one waiter holding the lock when it is the only waiter: two
    /// cache-line transfers between cores (the waiter reads the release, then takes the
    /// lock word). Assumed 70 ns. With a topology, the two transfers cost the distance
    /// between the releasing and the next holder's CPU instead.
    pub handoff_ns: u64,
    /// How the waiters spin, which sets how a hand-off grows with them.
    pub kind: LockKind,
}

impl Default for SpinParams {
    fn default() -> Self {
        SpinParams {
            acquire_ns: 20,
            release_ns: 5,
            handoff_ns: 70,
            kind: LockKind::Queued,
        }
    }
}

/// The spinlock algorithm: how waiters spin and so what a hand-off costs with `n` waiting.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub enum LockKind {
    /// An MCS-style queued lock (Linux's qspinlock: x86 from 4.2, arm64 from 4.19, powerpc
    /// from 5.13): a constant hand-off.
    #[default]
    Queued,
    /// A ticket lock (arm64 before 4.19, ia64 from 2.6.29): every waiter re-reads the one
    /// word, so a hand-off grows with the waiters.
    Ticket,
    /// A test-and-set (test-and-test-and-set) lock (powerpc before 5.13, ia64 before
    /// 2.6.29): every waiter retries its atomic on a release, so a hand-off grows faster.
    TestAndSet,
}

impl LockKind {
    /// The hand-off with `waiting` CPUs waiting (at least 1), `transfer_ns` the line
    /// transfer from the releasing CPU to the next holder.
    pub fn handoff_ns(self, waiting: usize, transfer_ns: u64) -> u64 {
        let others = waiting.saturating_sub(1) as u64;
        2 * transfer_ns
            + match self {
                LockKind::Queued => 0,
                LockKind::Ticket => others * transfer_ns / 2,
                LockKind::TestAndSet => others * transfer_ns,
            }
    }
}

pub(crate) struct SpinState {
    params: SpinParams,
    /// The line; a hand-off takes `handoff_ns` to reach the next waiter.
    pub(crate) line: WaitLine,
}

/// The hand-off of spinlock `idx` released by CPU `cpu` to its next waiter (0 if none).
fn handoff_of(st: &State, idx: usize, cpu: u32) -> u64 {
    let s = &st.spin[idx];
    match s.line.next_waiter() {
        Some((to, waiting)) => {
            let flat = s.params.handoff_ns / 2;
            let x = if st.topology.is_some() {
                st.transfer_ns(cpu, to, flat)
            } else {
                flat
            };
            s.params.kind.handoff_ns(waiting, x)
        }
        None => 0,
    }
}

impl Release for SpinLock {
    fn release(st: &mut State, idx: usize, cpu: u32) -> bool {
        let now = st.now;
        let delay = handoff_of(st, idx, cpu);
        let s = &mut st.spin[idx];
        match s.line.release(now, delay) {
            Some((at, w)) => {
                st.schedule(at, w);
                true
            }
            None => false,
        }
    }

    fn release_ns(st: &State, idx: usize, _woke: bool) -> u64 {
        st.spin[idx].params.release_ns
    }
}

/// A spinlock registered with a simulation. Clones share the lock.
#[derive(Clone)]
pub struct SpinLock {
    h: Handle,
    idx: usize,
}

impl fmt::Debug for SpinLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SpinLock")
            .field("name", &self.stats().name)
            .finish()
    }
}

impl SpinLock {
    /// A free spinlock named `name` (the name identifies it in reports).
    pub fn new(h: &Handle, name: impl Into<String>, params: SpinParams) -> Result<Self, SimError> {
        let state = SpinState {
            params,
            line: WaitLine::new(name.into()),
        };
        let idx = register(h, |st| &mut st.spin, state)?;
        Ok(SpinLock { h: h.clone(), idx })
    }

    /// The lock's costs.
    pub fn params(&self) -> SpinParams {
        self.h.0.st.borrow().spin[self.idx].params
    }

    /// The lock's statistics so far.
    pub fn stats(&self) -> LockStats {
        self.h.0.st.borrow().spin[self.idx].line.stats.clone()
    }

    /// Acquires the lock for the task of `ctx`, spinning on its CPU while it waits.
    ///
    /// An agent has no CPU to spin on: if the task is one, the future never completes and
    /// the run stops with [`SimError::NoCpu`].
    pub fn lock<'a>(&'a self, ctx: &'a Ctx) -> SpinLockFuture<'a> {
        ctx.debug_assert_no_debt();
        SpinLockFuture {
            lock: self,
            ctx,
            phase: Phase::Start,
            contended: false,
            acquired_at: 0,
            burn: Burn::default(),
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    Start,
    Acquiring,
    Spinning,
    Done,
}

/// Future of [`SpinLock::lock`].
#[must_use = "futures do nothing unless awaited"]
pub struct SpinLockFuture<'a> {
    lock: &'a SpinLock,
    ctx: &'a Ctx,
    phase: Phase,
    contended: bool,
    /// End of the acquire cost: waiting is measured from here.
    acquired_at: u64,
    burn: Burn,
}

impl<'a> Future for SpinLockFuture<'a> {
    type Output = SpinGuard<'a>;

    fn poll(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<SpinGuard<'a>> {
        let this = &mut *self;
        let me = this.ctx.task;
        let idx = this.lock.idx;
        let mut st = this.lock.h.0.st.borrow_mut();
        let Some(cpu) = lock_cpu(&mut st, this.ctx, "spin on a spinlock") else {
            return Poll::Pending;
        };
        loop {
            match this.phase {
                Phase::Start => {
                    let now = st.now;
                    let s = &mut st.spin[idx];
                    this.contended = s.line.arrive(me, cpu, now);
                    let acquire = s.params.acquire_ns;
                    this.acquired_at = now + acquire;
                    this.phase = Phase::Acquiring;
                    if !this.burn.start(&mut st, cpu, me, Account::System, acquire) {
                        return Poll::Pending;
                    }
                }
                Phase::Acquiring => {
                    if !this.burn.poll(&mut st, cpu) {
                        return Poll::Pending;
                    }
                    this.phase = Phase::Spinning;
                    let now = st.now;
                    if !st.spin[idx].line.granted(me, now) {
                        st.begin_busy(cpu, Account::Spin);
                        st.keep_cpu = true;
                        return Poll::Pending;
                    }
                    // Granted while acquiring: no spin at all.
                    return Poll::Ready(this.finish(&mut st, false));
                }
                Phase::Spinning => {
                    let now = st.now;
                    if st.spin[idx].line.granted(me, now) {
                        return Poll::Ready(this.finish(&mut st, true));
                    }
                    st.keep_cpu = true;
                    return Poll::Pending;
                }
                Phase::Done => panic!("SpinLockFuture polled after completion"),
            }
        }
    }
}

impl<'a> SpinLockFuture<'a> {
    fn finish(&mut self, st: &mut State, spun: bool) -> SpinGuard<'a> {
        if spun {
            st.end_busy(self.ctx.cpu);
        }
        let now = st.now;
        let tracer = self.lock.h.tracer();
        if spun && tracer.is_on() {
            tracer.slice(
                crate::trace::Track::Cpu(self.ctx.cpu),
                format!("spin {}", st.spin[self.lock.idx].line.stats.name),
                self.acquired_at,
                now.saturating_sub(self.acquired_at),
                &[],
            );
        }
        st.spin[self.lock.idx]
            .line
            .acquired(now, self.acquired_at, self.contended);
        self.phase = Phase::Done;
        SpinGuard {
            lock: self.lock,
            ctx: self.ctx,
            held: true,
        }
    }
}

impl Drop for SpinLockFuture<'_> {
    /// Abandons a pending acquisition: leaves the queue, or passes the lock on if it was
    /// already handed over.
    fn drop(&mut self) {
        if matches!(self.phase, Phase::Start | Phase::Done) {
            return;
        }
        let Ok(mut st) = self.lock.h.0.st.try_borrow_mut() else {
            return;
        };
        let me = self.ctx.task;
        let idx = self.lock.idx;
        self.burn.cancel(&mut st, self.ctx.cpu);
        if self.phase == Phase::Spinning {
            st.end_busy(self.ctx.cpu);
        }
        let now = st.now;
        let delay = handoff_of(&st, idx, self.ctx.cpu);
        let s = &mut st.spin[idx];
        if let Some((at, w)) = s.line.abandon(me, now, delay) {
            st.schedule(at, w);
        }
    }
}

lock_guard!(
    SpinLock,
    SpinGuard,
    SpinUnlock,
    guard: "Proof that a task holds a [`SpinLock`]. Release it with [`SpinGuard::unlock`], which charges the release cost; dropping the guard releases the lock at no cost.",
    unlock: "Releases the lock (the next waiter sees it `handoff_ns` later) and spends the release cost as system time."
);
