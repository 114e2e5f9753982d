//! Synchronisation primitives for the command queue: `loom`'s under `--cfg loom`, `std`'s
//! otherwise (the crossbeam pattern), so the loom model tests check the very code the
//! library runs.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64};
#[cfg(loom)]
pub(crate) use loom::sync::{Mutex, MutexGuard};

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64};
#[cfg(not(loom))]
pub(crate) use std::sync::{Mutex, MutexGuard};

pub(crate) use std::sync::atomic::Ordering;
use std::sync::TryLockError;

/// `try_lock` that treats a poisoned lock as acquired: the protected state is counters that
/// stay consistent even if a panicking sink unwound through a holder.
pub(crate) fn try_lock<T>(m: &Mutex<T>) -> Option<MutexGuard<'_, T>> {
    match m.try_lock() {
        Ok(g) => Some(g),
        Err(TryLockError::Poisoned(p)) => Some(p.into_inner()),
        Err(TryLockError::WouldBlock) => None,
    }
}

/// Blocking `lock`, recovering from poisoning like [`try_lock`].
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Spin-wait backoff. Under loom every wait yields, which tells the model checker that the
/// thread cannot progress until another one does. On the host a waiter spins briefly and
/// then yields its CPU: the build machines have two cores and the tests run more threads
/// than that, so a pure spin would mostly measure the host scheduler.
pub(crate) struct Backoff {
    #[cfg(not(loom))]
    step: u32,
}

impl Backoff {
    #[cfg(not(loom))]
    const SPIN_LIMIT: u32 = 6;

    pub(crate) fn new() -> Self {
        Backoff {
            #[cfg(not(loom))]
            step: 0,
        }
    }

    /// Waits a little before the caller looks again.
    #[cfg(loom)]
    pub(crate) fn snooze(&mut self) {
        loom::thread::yield_now();
    }

    /// Waits a little before the caller looks again.
    #[cfg(not(loom))]
    pub(crate) fn snooze(&mut self) {
        if self.step <= Self::SPIN_LIMIT {
            for _ in 0..(1u32 << self.step) {
                std::hint::spin_loop();
            }
            self.step += 1;
        } else {
            std::thread::yield_now();
        }
    }
}
