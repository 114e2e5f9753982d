//! A sleeping lock (a mutex whose waiters block).
//!
//! Model, per acquisition by a task at time `t`:
//! 1. The task takes its place in line at `t` and spends [`SleepParams::acquire_ns`] of
//!    system time on the atomic.
//! 2. If the lock was free and nobody was queued, it holds the lock from `t`.
//! 3. Otherwise it blocks: its CPU is free (idle, or running another task). When the
//!    holder releases at `r`, the lock passes directly to the first waiter (FIFO hand-off,
//!    no barging), which becomes runnable at `r + wakeup_ns` and resumes when its CPU is
//!    free. The releaser pays [`SleepParams::wake_cost_ns`] of system time for waking it.
//!
//! Real mutexes spin optimistically for a while before sleeping; this model does not
//! (model that with a [`SpinLock`](crate::resources::SpinLock) if it matters).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use crate::accounting::{Account, LockStats};
use crate::engine::kernel::{Burn, State};
use crate::engine::{Ctx, Handle, SimError};
use crate::resources::line::{lock_cpu, lock_guard, register, Release, Unlocking, WaitLine};

/// Costs of a sleeping lock, in nanoseconds.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct SleepParams {
    /// The acquiring atomic. Assumed 20 ns, as for a spinlock.
    pub acquire_ns: u64,
    /// The release (atomic plus wait-list check). Assumed 20 ns.
    pub release_ns: u64,
    /// From the release to the woken waiter being runnable (scheduler wake-up latency).
    /// Assumed 2000 ns, the order of an idle-CPU wake-up on Linux.
    pub wakeup_ns: u64,
    /// System time the releaser spends waking a waiter (`try_to_wake_up`). Assumed
    /// 500 ns.
    pub wake_cost_ns: u64,
}

impl Default for SleepParams {
    fn default() -> Self {
        SleepParams {
            acquire_ns: 20,
            release_ns: 20,
            wakeup_ns: 2_000,
            wake_cost_ns: 500,
        }
    }
}

pub(crate) struct SleepState {
    params: SleepParams,
    /// The line; a hand-off makes the next waiter runnable `wakeup_ns` later.
    pub(crate) line: WaitLine,
}

impl Release for SleepLock {
    /// Releases the lock at `now`; returns whether a waiter was woken.
    fn release(st: &mut State, idx: usize, _cpu: u32) -> bool {
        let now = st.now;
        let s = &mut st.sleep[idx];
        match s.line.release(now, s.params.wakeup_ns) {
            Some((at, w)) => {
                st.schedule(at, w);
                true
            }
            None => false,
        }
    }

    fn release_ns(st: &State, idx: usize, woke: bool) -> u64 {
        let p = st.sleep[idx].params;
        p.release_ns + if woke { p.wake_cost_ns } else { 0 }
    }
}

/// A sleeping lock registered with a simulation. Clones share the lock.
#[derive(Clone)]
pub struct SleepLock {
    h: Handle,
    idx: usize,
}

impl fmt::Debug for SleepLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SleepLock")
            .field("name", &self.stats().name)
            .finish()
    }
}

impl SleepLock {
    /// A free sleeping lock named `name`.
    pub fn new(h: &Handle, name: impl Into<String>, params: SleepParams) -> Result<Self, SimError> {
        let state = SleepState {
            params,
            line: WaitLine::new(name.into()),
        };
        let idx = register(h, |st| &mut st.sleep, state)?;
        Ok(SleepLock { h: h.clone(), idx })
    }

    /// The lock's costs.
    pub fn params(&self) -> SleepParams {
        self.h.0.st.borrow().sleep[self.idx].params
    }

    /// The lock's statistics so far.
    pub fn stats(&self) -> LockStats {
        self.h.0.st.borrow().sleep[self.idx].line.stats.clone()
    }

    /// Acquires the lock, blocking while it is held.
    ///
    /// The acquire cost needs a CPU: if the task is an agent, the future never completes
    /// and the run stops with [`SimError::NoCpu`].
    pub fn lock<'a>(&'a self, ctx: &'a Ctx) -> SleepLockFuture<'a> {
        ctx.debug_assert_no_debt();
        SleepLockFuture {
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
    Waiting,
    Done,
}

/// Future of [`SleepLock::lock`].
#[must_use = "futures do nothing unless awaited"]
pub struct SleepLockFuture<'a> {
    lock: &'a SleepLock,
    ctx: &'a Ctx,
    phase: Phase,
    contended: bool,
    acquired_at: u64,
    burn: Burn,
}

impl<'a> Future for SleepLockFuture<'a> {
    type Output = SleepGuard<'a>;

    fn poll(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<SleepGuard<'a>> {
        let this = &mut *self;
        let me = this.ctx.task;
        let idx = this.lock.idx;
        let mut st = this.lock.h.0.st.borrow_mut();
        let Some(cpu) = lock_cpu(&mut st, this.ctx, "acquire a sleeping lock") else {
            return Poll::Pending;
        };
        if this.phase == Phase::Start {
            let now = st.now;
            let s = &mut st.sleep[idx];
            this.contended = s.line.arrive(me, cpu, now);
            let acquire = s.params.acquire_ns;
            this.acquired_at = now + acquire;
            this.phase = Phase::Acquiring;
            if !this.burn.start(&mut st, cpu, me, Account::System, acquire) {
                return Poll::Pending;
            }
        }
        if this.phase == Phase::Acquiring {
            if !this.burn.poll(&mut st, cpu) {
                return Poll::Pending;
            }
            this.phase = Phase::Waiting;
        }
        assert!(
            this.phase == Phase::Waiting,
            "SleepLockFuture polled after completion"
        );
        let now = st.now;
        let line = &mut st.sleep[idx].line;
        if line.granted(me, now) {
            line.acquired(now, this.acquired_at, this.contended);
            this.phase = Phase::Done;
            return Poll::Ready(SleepGuard {
                lock: this.lock,
                ctx: this.ctx,
                held: true,
            });
        }
        // Blocked: no `keep_cpu`, so the CPU is released.
        Poll::Pending
    }
}

impl Drop for SleepLockFuture<'_> {
    fn drop(&mut self) {
        if matches!(self.phase, Phase::Start | Phase::Done) {
            return;
        }
        let Ok(mut st) = self.lock.h.0.st.try_borrow_mut() else {
            return;
        };
        self.burn.cancel(&mut st, self.ctx.cpu);
        let me = self.ctx.task;
        let idx = self.lock.idx;
        let now = st.now;
        let s = &mut st.sleep[idx];
        if let Some((at, w)) = s.line.abandon(me, now, s.params.wakeup_ns) {
            st.schedule(at, w);
        }
    }
}

lock_guard!(
    SleepLock,
    SleepGuard,
    SleepUnlock,
    guard: "Proof that a task holds a [`SleepLock`]. Release it with [`SleepGuard::unlock`]; dropping the guard releases the lock at no cost.",
    unlock: "Releases the lock, handing it to the first waiter, and spends the release cost (plus the wake-up cost if a waiter was woken) as system time."
);
