//! # iolab-sim: the virtual-time lab
//!
//! A deterministic discrete-event simulator in virtual nanoseconds, in which simulated
//! threads are `async` tasks pinned to virtual CPUs:
//!
//! - [`time`]: virtual time ([`SimTime`], [`SimDuration`]), a leaf every other module uses;
//! - [`engine`]: the executor ([`Sim`]), virtual CPUs, timers, completions, channels and the
//!   seeded random-number generator;
//! - [`resources`]: spinlocks, sleeping locks and contended cache lines that cost what the
//!   real ones cost, including the CPU time their waiters burn;
//! - [`accounting`]: per-CPU user/system/spin/idle time and the [`RunReport`].
//!
//! A run is a pure function of its scenario and seed. See docs/ENGINE.md for the design,
//! its guarantees and the measured speed.
//!
//! ```
//! use iolab_sim::engine::{Completion, Sim, SimConfig, SimDuration};
//! use iolab_sim::resources::{SpinLock, SpinParams};
//! use iolab_sim::Account;
//!
//! # fn main() -> Result<(), iolab_sim::SimError> {
//! let mut sim = Sim::new(SimConfig { cpus: 8, seed: 7 })?;
//! let lock = SpinLock::new(sim.handle(), "iova_tree", SpinParams::default())?;
//! for cpu in 0..8 {
//!     let lock = lock.clone();
//!     sim.spawn_on(cpu, move |ctx| async move {
//!         for _ in 0..100 {
//!             let g = lock.lock(&ctx).await; // spins (Account::Spin) while held
//!             ctx.cpu().spend(SimDuration::ns(300), Account::System).await;
//!             g.unlock().await; // hands the lock to the next waiter
//!             let done: Completion<()> = Completion::new(ctx.handle());
//!             let service = ctx.rng().jitter(80_000, 10); // this task's seeded stream
//!             done.fire_at(ctx.now() + SimDuration::ns(service), ()).unwrap(); // "device"
//!             done.wait(&ctx).await; // blocked: the CPU is idle meanwhile
//!         }
//!     })?;
//! }
//! let report = sim.run()?;
//! assert!(report.is_conserved()); // user + system + spin + idle == end, on every CPU
//! assert_eq!(report.spin_lock("iova_tree").unwrap().acquisitions, 800);
//! println!("{report}"); // an mpstat-like table and lock statistics
//! # Ok(())
//! # }
//! ```
#![warn(missing_docs)]
#![forbid(unsafe_code)]

pub mod accounting;
pub mod block;
pub mod cost;
pub mod devices;
pub mod engine;
pub mod experiment;
pub mod fit;
pub mod iommu;
pub mod lab;
pub mod metrics;
pub mod progress;
pub mod reproduce;
pub mod resources;
pub mod size;
pub mod soak;
pub mod time;
pub mod tomlfile;
pub mod tomlpatch;
pub mod trace;
pub mod workloads;

pub use accounting::{Account, RunReport};
pub use engine::{
    Ctx, Handle, Sim, SimConfig, SimDuration, SimError, SimTime, Topology, TransferCosts,
};
