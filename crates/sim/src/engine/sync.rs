//! Completions and channels: how device models and tasks wake each other.
//!
//! Both keep their state in an `Rc` shared by their clones and wake waiting tasks through
//! the engine's wake-up queue, so a wake-up is ordered like every other event. Waiting
//! blocks the task (its CPU is free), except [`Completion::wait_polling`], which models a
//! driver polling for completion with its CPU busy.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};

use crate::accounting::Account;
use crate::engine::kernel::{Kernel, TaskRef, NO_TASK};
use crate::engine::{Ctx, Handle, SimTime};

struct CompletionState<T> {
    value: Option<T>,
    fired: bool,
    at: u64,
    waiter: TaskRef,
}

/// A one-shot completion carrying a `T`: a device model fires it, now or at a future time
/// (an interrupt, a completion-queue entry), and one task waits for it.
///
/// Firing at a future time costs no event unless a task is already waiting: a waiter
/// that arrives later sees the fire time and sleeps until then.
pub struct Completion<T> {
    inner: Rc<RefCell<CompletionState<T>>>,
    h: Handle,
}

impl<T> Clone for Completion<T> {
    fn clone(&self) -> Self {
        Completion {
            inner: self.inner.clone(),
            h: self.h.clone(),
        }
    }
}

impl<T> fmt::Debug for Completion<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.inner.borrow();
        f.debug_struct("Completion")
            .field("fired", &s.fired)
            .field("at", &SimTime(s.at))
            .finish()
    }
}

impl<T> Completion<T> {
    /// A completion not yet fired.
    pub fn new(h: &Handle) -> Self {
        Completion {
            inner: Rc::new(RefCell::new(CompletionState {
                value: None,
                fired: false,
                at: 0,
                waiter: NO_TASK,
            })),
            h: h.clone(),
        }
    }

    /// Fires now. Returns the value back if the completion had already fired.
    pub fn fire(&self, value: T) -> Result<(), T> {
        let now = self.h.now();
        self.fire_at(now, value)
    }

    /// Fires at `at` (or now, if `at` is in the past): the waiter resumes then. Returns the
    /// value back if the completion had already fired.
    pub fn fire_at(&self, at: SimTime, value: T) -> Result<(), T> {
        let mut s = self.inner.borrow_mut();
        if s.fired {
            return Err(value);
        }
        let mut st = self.h.0.st.borrow_mut();
        s.fired = true;
        s.value = Some(value);
        s.at = at.0.max(st.now);
        if s.waiter != NO_TASK {
            st.schedule(s.at, s.waiter);
            s.waiter = NO_TASK;
        }
        Ok(())
    }

    /// Makes a completion whose value was taken reusable, like a driver recycling a
    /// command slot. Returns `false` (and does nothing) if it has fired but its value was
    /// not taken yet, or a task is waiting for it.
    pub fn reset(&self) -> bool {
        let mut s = self.inner.borrow_mut();
        if s.value.is_some() || s.waiter != NO_TASK {
            return false;
        }
        s.fired = false;
        s.at = 0;
        true
    }

    /// Whether this is the only handle to the completion (no clone of it is alive).
    pub(crate) fn is_unshared(&self) -> bool {
        Rc::strong_count(&self.inner) == 1
    }

    /// Whether the completion has fired (its time may still be in the future).
    pub fn is_fired(&self) -> bool {
        self.inner.borrow().fired
    }

    /// When the completion fires, if it has been fired.
    pub fn fire_time(&self) -> Option<SimTime> {
        let s = self.inner.borrow();
        s.fired.then_some(SimTime(s.at))
    }

    /// Waits (blocked, CPU free) until the completion fires, and takes its value.
    ///
    /// # Panics
    ///
    /// If the value was already taken by another wait (a completion has one consumer).
    pub fn wait<'a>(&'a self, ctx: &'a Ctx) -> Wait<'a, T> {
        ctx.debug_assert_no_debt();
        Wait {
            c: self,
            ctx,
            polling: None,
            armed: false,
        }
    }

    /// Waits with the CPU busy (a polling driver), charging the wait to `account`.
    ///
    /// # Panics
    ///
    /// If the task is an agent (it has no CPU to keep busy), or as [`Completion::wait`].
    pub fn wait_polling<'a>(&'a self, ctx: &'a Ctx, account: Account) -> Wait<'a, T> {
        ctx.debug_assert_no_debt();
        Wait {
            c: self,
            ctx,
            polling: Some(account),
            armed: false,
        }
    }
}

/// Future of [`Completion::wait`] and [`Completion::wait_polling`].
#[must_use = "futures do nothing unless awaited"]
pub struct Wait<'a, T> {
    c: &'a Completion<T>,
    ctx: &'a Ctx,
    polling: Option<Account>,
    armed: bool,
}

impl<T> Future for Wait<'_, T> {
    type Output = T;
    fn poll(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<T> {
        let this = &mut *self;
        let mut s = this.c.inner.borrow_mut();
        let mut st = this.ctx.h.0.st.borrow_mut();
        let me = this.ctx.task;
        if s.fired && s.at <= st.now {
            if this.armed && this.polling.is_some() {
                st.end_busy(this.ctx.cpu_index());
            }
            this.armed = false;
            let v = s.value.take().expect("a completion's value is taken once");
            return Poll::Ready(v);
        }
        if !this.armed {
            this.armed = true;
            if let Some(a) = this.polling {
                st.begin_busy(this.ctx.cpu_index(), a);
            }
            if s.fired {
                st.schedule(s.at, me);
            } else {
                s.waiter = me;
            }
        }
        if this.polling.is_some() {
            st.keep_cpu = true;
        }
        Poll::Pending
    }
}

impl<T> Drop for Wait<'_, T> {
    /// Inlined: a wait is almost always dropped after it returned (disarmed), so the usual
    /// drop is one test; abandoning an armed wait is a call.
    #[inline]
    fn drop(&mut self) {
        if self.armed {
            self.disarm();
        }
    }
}

impl<T> Wait<'_, T> {
    /// Withdraws an abandoned wait: it no longer waits, and a polling wait stops its CPU's
    /// busy interval.
    #[cold]
    #[inline(never)]
    fn disarm(&mut self) {
        if let (Ok(mut s), Ok(mut st)) = (
            self.c.inner.try_borrow_mut(),
            self.ctx.h.0.st.try_borrow_mut(),
        ) {
            if s.waiter == self.ctx.task {
                s.waiter = NO_TASK;
            }
            if self.polling.is_some() {
                st.end_busy(self.ctx.cpu);
            }
        }
    }
}

/// The value handed back by [`Channel::send`] when the channel is full.
#[derive(Clone, Copy, PartialEq, Eq, Debug, thiserror::Error)]
#[error("Channel is full")]
pub struct Full<T>(pub T);

struct ChannelState<T> {
    items: VecDeque<T>,
    cap: usize,
    waiters: VecDeque<TaskRef>,
}

/// A bounded FIFO queue between tasks (a submission queue, a work list). Any number of
/// senders and receivers; receivers wait in FIFO order.
pub struct Channel<T> {
    inner: Rc<RefCell<ChannelState<T>>>,
    h: Handle,
}

impl<T> Clone for Channel<T> {
    fn clone(&self) -> Self {
        Channel {
            inner: self.inner.clone(),
            h: self.h.clone(),
        }
    }
}

impl<T> fmt::Debug for Channel<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.inner.borrow();
        f.debug_struct("Channel")
            .field("len", &s.items.len())
            .field("cap", &s.cap)
            .field("waiters", &s.waiters.len())
            .finish()
    }
}

impl<T> Channel<T> {
    /// An empty channel holding at most `cap` items (at least 1).
    pub fn new(h: &Handle, cap: usize) -> Self {
        Channel {
            inner: Rc::new(RefCell::new(ChannelState {
                items: VecDeque::new(),
                cap: cap.max(1),
                waiters: VecDeque::new(),
            })),
            h: h.clone(),
        }
    }

    /// Queues `item` and wakes the first waiting receiver (now). Takes no virtual time.
    pub fn send(&self, item: T) -> Result<(), Full<T>> {
        let mut s = self.inner.borrow_mut();
        if s.items.len() >= s.cap {
            return Err(Full(item));
        }
        s.items.push_back(item);
        if let Some(w) = s.waiters.pop_front() {
            let mut st = self.h.0.st.borrow_mut();
            let now = st.now;
            st.schedule(now, w);
        }
        Ok(())
    }

    /// Takes an item without waiting.
    pub fn try_recv(&self) -> Option<T> {
        self.inner.borrow_mut().items.pop_front()
    }

    /// Items queued.
    pub fn len(&self) -> usize {
        self.inner.borrow().items.len()
    }

    /// Whether no item is queued.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Waits (blocked) for an item.
    pub fn recv<'a>(&'a self, ctx: &'a Ctx) -> Recv<'a, T> {
        ctx.debug_assert_no_debt();
        Recv {
            ch: self,
            k: &ctx.h.0,
            task: ctx.task,
        }
    }
}

/// Future of [`Channel::recv`].
#[must_use = "futures do nothing unless awaited"]
pub struct Recv<'a, T> {
    ch: &'a Channel<T>,
    /// The kernel and the receiving task, copied from its context when created (a poll
    /// then does not read the context).
    k: &'a Kernel,
    task: TaskRef,
}

impl<T> Future for Recv<'_, T> {
    type Output = T;
    #[inline]
    fn poll(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<T> {
        let mut s = self.ch.inner.borrow_mut();
        let me = self.task;
        if let Some(v) = s.items.pop_front() {
            if !s.waiters.is_empty() {
                if let Some(i) = s.waiters.iter().position(|&w| w == me) {
                    s.waiters.remove(i);
                }
            }
            // Another receiver may be waiting for the next item.
            if !s.items.is_empty() {
                if let Some(w) = s.waiters.pop_front() {
                    let mut st = self.k.st.borrow_mut();
                    let now = st.now;
                    st.schedule(now, w);
                }
            }
            return Poll::Ready(v);
        }
        // Usually the only receiver: an empty line needs no search.
        if s.waiters.is_empty() || !s.waiters.contains(&me) {
            s.waiters.push_back(me);
        }
        Poll::Pending
    }
}

impl<T> Drop for Recv<'_, T> {
    /// Inlined: with nobody waiting (the usual case once the item is taken) there is no
    /// search.
    #[inline]
    fn drop(&mut self) {
        if let Ok(mut s) = self.ch.inner.try_borrow_mut() {
            if !s.waiters.is_empty() {
                let me = self.task;
                if let Some(i) = s.waiters.iter().position(|&w| w == me) {
                    s.waiters.remove(i);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::{Sim, SimConfig, SimDuration};
    use std::cell::Cell;

    /// What the command queue's reuse of joiners' completions relies on: a completion whose
    /// value was taken, and that no clone shares, resets to a fresh one (fired again, it
    /// wakes its next waiter at the new time with the new value); a shared one is told
    /// apart.
    #[test]
    fn a_taken_unshared_completion_is_reused_like_a_new_one() {
        let mut sim = Sim::new(SimConfig { cpus: 1, seed: 3 }).unwrap();
        let seen = Rc::new(Cell::new((0u64, 0u64, 0u64, 0u64)));
        let out = seen.clone();
        sim.spawn_on(0, move |ctx| async move {
            let c: Completion<u64> = Completion::new(ctx.handle());
            let other = c.clone();
            assert!(!c.is_unshared());
            other.fire_at(ctx.now() + SimDuration::ns(100), 7).unwrap();
            drop(other);
            let a = c.wait(&ctx).await;
            assert!(c.is_unshared());
            assert!(c.reset());
            assert!(!c.is_fired());
            let t1 = ctx.now().as_ns();
            c.fire_at(ctx.now() + SimDuration::ns(50), 9).unwrap();
            let b = c.wait_polling(&ctx, Account::System).await;
            out.set((a, t1, b, ctx.now().as_ns()));
        })
        .unwrap();
        sim.run().unwrap();
        assert_eq!(seen.get(), (7, 100, 9, 150));
    }
}
