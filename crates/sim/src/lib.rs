//! # iolab-sim: the virtual-time lab
//!
//! A deterministic discrete-event simulator in virtual nanoseconds, in which simulated
//! threads are `async` tasks pinned to virtual CPUs:
//!
//! - [`engine`]: the executor ([`Sim`]), virtual time, virtual CPUs, timers, completions,
//!   channels and the seeded random-number generator;
//! - [`resources`]: spinlocks, sleeping locks and contended cache lines that cost what the
//!   real ones cost, including the CPU time their waiters burn;
//! - [`accounting`]: per-CPU user/system/spin/idle time and the [`RunReport`].
//!
//! A run is a pure function of its scenario and seed. See docs/ENGINE.md for the design,
//! its guarantees and the measured speed.
#![warn(missing_docs)]
#![forbid(unsafe_code)]

pub mod accounting;
pub mod engine;
pub mod resources;

pub use accounting::{Account, RunReport};
pub use engine::{Ctx, Handle, Sim, SimConfig, SimDuration, SimError, SimTime};
