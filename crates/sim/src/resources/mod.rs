//! Shared resources that behave like the real ones: spinlocks whose waiters spin (their
//! CPUs busy, charged to [`Account::Spin`](crate::accounting::Account::Spin)), sleeping
//! locks whose waiters give up their CPU, and cache lines whose atomic read-modify-writes
//! serialise and pay for moving between CPUs.
//!
//! Every cost is a field of a parameter struct; the defaults are assumptions, documented
//! on each field, to be replaced by a platform profile's measured or sourced values.
//! Every resource is registered with the simulation, counts toward
//! [`Limits::max_resources`](crate::engine::Limits::max_resources), and reports its
//! statistics in the [`RunReport`](crate::accounting::RunReport).

pub mod cacheline;
mod line;
pub mod sleeplock;
pub mod spinlock;

pub use cacheline::{Access, AtomicsAt, CacheLine, LineAccess, LineParams};
pub use sleeplock::{SleepGuard, SleepLock, SleepParams};
pub use spinlock::{LockKind, SpinGuard, SpinLock, SpinParams};
