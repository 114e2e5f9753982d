//! The IOMMU's timed side: its invalidation queues in virtual time; see docs/DECISIONS.md
//! ("One block stack; the timed SMMUv3 command queue is `sim::iommu::cmdq`") and
//! docs/MODEL.md for the models and their sources.
//!
//! The functional models of `iolab_iommu` build the commands or descriptors, apply them to
//! the units' caches and count what the driver wrote ([`QueueWork`](iolab_iommu::hw::QueueWork));
//! the modules here give that work its time:
//!
//! - [`cmdq`]: the SMMUv3 command queue (spinlock, lock-free and atomic-add producers);
//! - [`x86q`]: Intel VT-d's invalidation queue and AMD-Vi's command buffer;
//! - `queue`: `TimedQueue`, one IOMMU instance's queue whichever of the two it is, as the
//!   lab's stacks hold it (with the device path the queue's invalidations apply to).

pub mod cmdq;
pub(crate) mod queue;
pub mod x86q;

pub(crate) use queue::TimedQueue;
