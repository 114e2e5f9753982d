//! A queued (FIFO, ticket-like) spinlock.
//!
//! Model, per acquisition by a task on CPU `c` at time `t`:
//! 1. The task takes its place in line at `t` (the ticket `fetch_add`) and spends
//!    [`SpinParams::acquire_ns`] of system time on that atomic.
//! 2. If the lock was free and nobody was queued, it holds the lock from `t`: the
//!    uncontended cost is `acquire_ns` now and [`SpinParams::release_ns`] at unlock, and
//!    nothing else.
//! 3. Otherwise it spins, its CPU busy and charged to [`Account::Spin`], until the holder
//!    ahead of it releases at `r` and the release reaches it at `r + handoff_ns` (the
//!    cache-line transfer to the next waiter). Waiters are served in arrival order.
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
use crate::resources::line::{lock_cpu, register, Release, Unlocking, WaitLine};

/// Costs of a spinlock, in nanoseconds.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct SpinParams {
    /// The acquiring atomic (ticket `fetch_add` or queued-lock `xchg`). Assumed 20 ns: a
    /// locked read-modify-write on a line already in the local cache, about 40-60 cycles
    /// at 2-3 GHz.
    pub acquire_ns: u64,
    /// The releasing store. Assumed 5 ns (a plain store with release ordering).
    pub release_ns: u64,
    /// From a release to the next waiter seeing it: one cache-line transfer between
    /// cores. Assumed 70 ns (same socket, cross-core, typical of large servers).
    pub handoff_ns: u64,
}

impl Default for SpinParams {
    fn default() -> Self {
        SpinParams {
            acquire_ns: 20,
            release_ns: 5,
            handoff_ns: 70,
        }
    }
}

pub(crate) struct SpinState {
    params: SpinParams,
    /// The line; a hand-off takes `handoff_ns` to reach the next waiter.
    pub(crate) line: WaitLine,
}

impl Release for SpinLock {
    fn release(st: &mut State, idx: usize) -> bool {
        let now = st.now;
        let s = &mut st.spin[idx];
        match s.line.release(now, s.params.handoff_ns) {
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
                    this.contended = s.line.arrive(me, now);
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
        let s = &mut st.spin[idx];
        if let Some((at, w)) = s.line.abandon(me, now, s.params.handoff_ns) {
            st.schedule(at, w);
        }
    }
}

/// Proof that a task holds a [`SpinLock`]. Release it with [`SpinGuard::unlock`], which
/// charges the release cost; dropping the guard releases the lock at no cost.
#[must_use = "dropping the guard releases the lock without charging its release cost"]
pub struct SpinGuard<'a> {
    lock: &'a SpinLock,
    ctx: &'a Ctx,
    held: bool,
}

impl fmt::Debug for SpinGuard<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SpinGuard")
            .field("lock", self.lock)
            .finish()
    }
}

impl<'a> SpinGuard<'a> {
    /// Releases the lock (the next waiter sees it `handoff_ns` later) and spends the
    /// release cost as system time.
    pub fn unlock(mut self) -> SpinUnlock<'a> {
        self.held = false;
        SpinUnlock {
            lock: self.lock,
            ctx: self.ctx,
            unlocking: Unlocking::default(),
        }
    }
}

impl Drop for SpinGuard<'_> {
    fn drop(&mut self) {
        if self.held {
            if let Ok(mut st) = self.lock.h.0.st.try_borrow_mut() {
                SpinLock::release(&mut st, self.lock.idx);
            }
        }
    }
}

/// Future of [`SpinGuard::unlock`].
#[must_use = "futures do nothing unless awaited; the lock is released when first polled"]
pub struct SpinUnlock<'a> {
    lock: &'a SpinLock,
    ctx: &'a Ctx,
    unlocking: Unlocking,
}

impl Future for SpinUnlock<'_> {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<()> {
        let this = &mut *self;
        this.unlocking
            .poll::<SpinLock>(&this.lock.h, this.ctx, this.lock.idx)
    }
}

impl Drop for SpinUnlock<'_> {
    fn drop(&mut self) {
        self.unlocking
            .abandon::<SpinLock>(&self.lock.h, self.ctx, self.lock.idx);
    }
}
