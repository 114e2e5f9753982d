//! The IOMMU's timed side: what the unit's hardware adds in virtual time; see
//! docs/DECISIONS.md ("One block stack; the timed SMMUv3 command queue is
//! `sim::iommu::cmdq`") and docs/MODEL.md ("DMA port") for the models and their sources.
//!
//! The functional models of `iolab_iommu` translate device accesses through the units'
//! caches, build the commands or descriptors, apply them and count what the driver wrote
//! ([`QueueWork`](iolab_iommu::hw::QueueWork)); the modules here give that work its time:
//!
//! - [`port`]: the DMA port, where every device's DMA is timed with one model (the unit's
//!   walkers, the device's outstanding requests, posted-write ordering);
//! - [`cmdq`]: the SMMUv3 command queue (spinlock, lock-free and atomic-add producers);
//! - [`x86q`]: Intel VT-d's invalidation queue and AMD-Vi's command buffer;
//! - `queue`: `TimedQueue`, one IOMMU instance's queue whichever of the two it is, as the
//!   lab's stacks hold it (with the device path the queue's invalidations apply to).

pub mod cmdq;
pub mod port;
pub(crate) mod queue;
pub mod x86q;

pub(crate) use queue::TimedQueue;
