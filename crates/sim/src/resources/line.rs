//! What the spinlock and the sleeping lock share: registration with the simulation, and the
//! line of tasks (holder, FIFO waiters, hand-off time, statistics). The two differ only in
//! what a waiter does (spin or block) and what a hand-off costs.

use std::collections::VecDeque;
use std::task::Poll;

use crate::accounting::{Account, LockStats};
use crate::engine::kernel::{Burn, State, TaskRef, NO_TASK};
use crate::engine::{Ctx, Handle, SimError};

/// How a kind of lock is released: what [`Unlocking`] needs of it.
pub(crate) trait Release {
    /// Releases lock `idx` at the current time from CPU `cpu`, handing it to the first
    /// waiter if any; returns whether a waiter was handed it.
    fn release(st: &mut State, idx: usize, cpu: u32) -> bool;
    /// The system time the releaser spends (`woke`: a waiter was handed the lock).
    fn release_ns(st: &State, idx: usize, woke: bool) -> u64;
}

/// The unlock future both locks share: releases the lock when first polled, then spends
/// the release cost as system time; dropped before its first poll, it still releases (at
/// no cost).
#[derive(Default)]
pub(crate) struct Unlocking {
    started: bool,
    burn: Burn,
}

impl Unlocking {
    /// Polls the unlock of lock `idx` of kind `K` by the task of `ctx`.
    pub(crate) fn poll<K: Release>(&mut self, h: &Handle, ctx: &Ctx, idx: usize) -> Poll<()> {
        let cpu = ctx.cpu_index();
        let mut st = h.0.st.borrow_mut();
        if !self.started {
            self.started = true;
            let woke = K::release(&mut st, idx, cpu);
            let ns = K::release_ns(&st, idx, woke);
            if self.burn.start(&mut st, cpu, ctx.task, Account::System, ns) {
                return Poll::Ready(());
            }
            return Poll::Pending;
        }
        if self.burn.poll(&mut st, cpu) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }

    /// The unlock future is dropped: releases the lock if that has not happened yet, and
    /// cancels the release cost's busy span.
    pub(crate) fn abandon<K: Release>(&mut self, h: &Handle, ctx: &Ctx, idx: usize) {
        if let Ok(mut st) = h.0.st.try_borrow_mut() {
            if !self.started {
                K::release(&mut st, idx, ctx.cpu);
            }
            self.burn.cancel(&mut st, ctx.cpu);
        }
    }
}

/// Declares a lock kind's guard and unlock future (`$guard`, `$unlock`) over `$lock` (a
/// struct with `h: Handle` and `idx: usize` that implements [`Release`]): the guard releases
/// at no cost when dropped, `unlock` releases and spends the release cost through
/// [`Unlocking`]. One definition for the spinlock and the sleeping lock, which differ only in
/// what a release does (their `Release`).
macro_rules! lock_guard {
    ($lock:ident, $guard:ident, $unlock:ident, guard: $gdoc:literal, unlock: $udoc:literal) => {
        #[doc = $gdoc]
        #[must_use = "dropping the guard releases the lock without charging its release cost"]
        pub struct $guard<'a> {
            lock: &'a $lock,
            ctx: &'a Ctx,
            held: bool,
        }

        impl fmt::Debug for $guard<'_> {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_struct(stringify!($guard))
                    .field("lock", self.lock)
                    .finish()
            }
        }

        impl<'a> $guard<'a> {
            #[doc = $udoc]
            pub fn unlock(mut self) -> $unlock<'a> {
                self.held = false;
                $unlock {
                    lock: self.lock,
                    ctx: self.ctx,
                    unlocking: Unlocking::default(),
                }
            }
        }

        impl Drop for $guard<'_> {
            fn drop(&mut self) {
                if self.held {
                    if let Ok(mut st) = self.lock.h.0.st.try_borrow_mut() {
                        <$lock as Release>::release(&mut st, self.lock.idx, self.ctx.cpu);
                    }
                }
            }
        }

        #[doc = concat!("Future of [`", stringify!($guard), "::unlock`].")]
        #[must_use = "futures do nothing unless awaited; the lock is released when first polled"]
        pub struct $unlock<'a> {
            lock: &'a $lock,
            ctx: &'a Ctx,
            unlocking: Unlocking,
        }

        impl Future for $unlock<'_> {
            type Output = ();
            fn poll(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<()> {
                let this = &mut *self;
                this.unlocking
                    .poll::<$lock>(&this.lock.h, this.ctx, this.lock.idx)
            }
        }

        impl Drop for $unlock<'_> {
            fn drop(&mut self) {
                self.unlocking
                    .abandon::<$lock>(&self.lock.h, self.ctx, self.lock.idx);
            }
        }
    };
}
pub(crate) use lock_guard;

/// Registers a resource in one of the engine's resource tables (`table` picks it),
/// counting it against the resource cap; returns its index.
pub(crate) fn register<T>(
    h: &Handle,
    table: fn(&mut State) -> &mut Vec<T>,
    item: T,
) -> Result<usize, SimError> {
    let mut st = h.0.st.borrow_mut();
    st.check_resource_cap()?;
    let t = table(&mut st);
    t.push(item);
    Ok(t.len() - 1)
}

/// The CPU of a lock's task, or `None` after recording [`SimError::NoCpu`], which stops
/// the run: an agent has no CPU to pay the acquire cost (or to spin) on.
pub(crate) fn lock_cpu(st: &mut State, ctx: &Ctx, what: &'static str) -> Option<u32> {
    match ctx.cpu_id() {
        Some(c) => Some(c as u32),
        None => {
            st.fail(SimError::NoCpu {
                task: ctx.task_id(),
                what,
            });
            None
        }
    }
}

/// A lock's line: who holds it, from when they may use it, and who waits, in order.
pub(crate) struct WaitLine {
    holder: TaskRef,
    /// When the holder may proceed (a hand-off takes time to arrive).
    usable_from: u64,
    held_since: u64,
    /// Waiting tasks and their CPUs, in arrival order.
    waiters: VecDeque<(TaskRef, u32)>,
    pub(crate) stats: LockStats,
}

impl WaitLine {
    /// A free lock named `name`.
    pub(crate) fn new(name: String) -> Self {
        WaitLine {
            holder: NO_TASK,
            usable_from: 0,
            held_since: 0,
            waiters: VecDeque::new(),
            stats: LockStats {
                name,
                ..LockStats::default()
            },
        }
    }

    /// `me`, on CPU `cpu`, takes its place in line at `now`: it holds the lock at once if
    /// the lock is free and nobody waits. Returns whether the acquisition is contended.
    pub(crate) fn arrive(&mut self, me: TaskRef, cpu: u32, now: u64) -> bool {
        if self.holder == NO_TASK && self.waiters.is_empty() {
            self.holder = me;
            self.usable_from = now;
            false
        } else {
            self.waiters.push_back((me, cpu));
            true
        }
    }

    /// Whether `me` holds the lock and may use it at `now`.
    pub(crate) fn granted(&self, me: TaskRef, now: u64) -> bool {
        self.holder == me && self.usable_from <= now
    }

    /// `me` starts using the lock at `now`; its wait counts from `wait_from`.
    pub(crate) fn acquired(&mut self, now: u64, wait_from: u64, contended: bool) {
        self.held_since = now;
        self.stats
            .record_wait(now.saturating_sub(wait_from), contended);
    }

    /// The CPU of the waiter a release would hand the lock to, and how many wait.
    pub(crate) fn next_waiter(&self) -> Option<(u32, usize)> {
        self.waiters
            .front()
            .map(|&(_, cpu)| (cpu, self.waiters.len()))
    }

    /// Releases the lock at `now`: the first waiter, if any, holds it from `now + delay`
    /// and must be woken then (returned).
    pub(crate) fn release(&mut self, now: u64, delay: u64) -> Option<(u64, TaskRef)> {
        self.stats.hold_total_ns += now.saturating_sub(self.held_since);
        match self.waiters.pop_front() {
            Some((w, _)) => {
                self.holder = w;
                self.usable_from = now + delay;
                Some((self.usable_from, w))
            }
            None => {
                self.holder = NO_TASK;
                None
            }
        }
    }

    /// `me` abandons its acquisition at `now`: it leaves the line, or, if the lock was
    /// already handed to it, passes it on as [`WaitLine::release`] does (holding no time).
    pub(crate) fn abandon(&mut self, me: TaskRef, now: u64, delay: u64) -> Option<(u64, TaskRef)> {
        if let Some(i) = self.waiters.iter().position(|&(w, _)| w == me) {
            self.waiters.remove(i);
            None
        } else if self.holder == me {
            self.held_since = now;
            self.release(now, delay)
        } else {
            None
        }
    }
}
