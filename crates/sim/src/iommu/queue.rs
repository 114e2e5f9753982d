//! One IOMMU instance's invalidation queue in virtual time, whichever IOMMU it is: the
//! SMMUv3 command queue ([`SimCmdq`]) or an x86 unit's invalidation queue or command
//! buffer ([`SimX86Queue`]), each with the device path whose invalidations it times. The
//! lab's stacks hold one `Option<TimedQueue>` per instance (`None`: the path has no timed
//! queue) and call it where a map or unmap hands its queue's work over.

use std::sync::Arc;

use iolab_iommu::dma::Domain;
use iolab_iommu::hw::{split_queue_work, QueueWork, Smmuv3DevicePath, X86DevicePath};
use iolab_iommu::work::WorkRecord;

use super::cmdq::{CmdqStats, SimCmdq};
use super::x86q::{split_x86_queue_work, SimX86Queue};
use crate::engine::Ctx;

/// An IOMMU instance's invalidation queue in virtual time, with the device path (the SMMU,
/// or the VT-d unit or AMD-Vi IOMMU) the device's DMA goes through and whose invalidations
/// the queue's consumer applies.
///
/// The variants are kept inline (the SMMUv3 one is the larger): a stack holds one per IOMMU
/// instance, built with the stack, and its map and unmap paths reach the queue without a
/// further indirection, as they did before the two kinds were one type.
#[allow(clippy::large_enum_variant)]
pub(crate) enum TimedQueue {
    /// The SMMUv3 command queue.
    Smmuv3 {
        /// The SMMU device model.
        path: Arc<Smmuv3DevicePath>,
        /// Its command queue in virtual time.
        queue: SimCmdq,
    },
    /// The VT-d invalidation queue or the AMD-Vi command buffer.
    X86 {
        /// The VT-d unit or AMD-Vi IOMMU.
        path: Arc<X86DevicePath>,
        /// Its invalidation queue (VT-d) or command buffer (AMD-Vi) in virtual time.
        queue: SimX86Queue,
    },
}

impl TimedQueue {
    /// Takes the queue's part out of a map's or unmap's work record (SMMUv3:
    /// [`split_queue_work`]; x86: [`split_x86_queue_work`], which also takes the domain
    /// lock the queue charges); what is left in `w` is the CPU's own work.
    pub(crate) fn split_work(&self, w: &mut WorkRecord) -> QueueWork {
        match self {
            TimedQueue::Smmuv3 { .. } => split_queue_work(w),
            TimedQueue::X86 { queue, .. } => split_x86_queue_work(queue.kind(), w),
        }
    }

    /// Issues what a map left for the queue (from [`TimedQueue::split_work`]) on `ctx`'s
    /// CPU: a lazy flush the map ran (its timer expired), and on VT-d with Caching Mode the
    /// map's own invalidation. SMMUv3: only when the work holds a sync (a map's share
    /// rarely does, and without one the command queue has nothing to time); x86: always
    /// (the queue returns at once without commands).
    pub(crate) async fn issue_after_map(&self, ctx: &Ctx, work: &QueueWork) {
        match self {
            TimedQueue::Smmuv3 { queue, .. } => {
                if work.syncs != 0 {
                    queue.issue_work(ctx, work).await;
                }
            }
            TimedQueue::X86 { queue, .. } => queue.issue(ctx, work).await,
        }
    }

    /// Issues what an unmap left for the queue (from [`TimedQueue::split_work`]) on
    /// `ctx`'s CPU, returning when its last sync or wait was seen complete; an error (the
    /// stack's failure message) when the queue's consumer refused a command or submission.
    pub(crate) async fn issue_after_unmap(
        &self,
        ctx: &Ctx,
        work: &QueueWork,
    ) -> Result<(), String> {
        match self {
            TimedQueue::Smmuv3 { path, queue } => {
                queue.issue_work(ctx, work).await;
                if path.invalidation_errors() > 0 {
                    return Err("the SMMUv3 command queue refused a command".to_string());
                }
            }
            TimedQueue::X86 { path, queue } => {
                queue.issue(ctx, work).await;
                if path.invalidation_errors() > 0 {
                    return Err(format!(
                        "the {} invalidation queue refused a submission",
                        path.model()
                    ));
                }
            }
        }
        Ok(())
    }

    /// What the queue did so far.
    pub(crate) fn stats(&self) -> CmdqStats {
        match self {
            TimedQueue::Smmuv3 { queue, .. } => queue.stats(),
            TimedQueue::X86 { queue, .. } => queue.stats(),
        }
    }

    /// The SMMU, when this is an SMMUv3 command queue.
    pub(crate) fn smmu_path(&self) -> Option<&Arc<Smmuv3DevicePath>> {
        match self {
            TimedQueue::Smmuv3 { path, .. } => Some(path),
            TimedQueue::X86 { .. } => None,
        }
    }

    /// The DMA domain the queue's invalidations are for (its flush queue, in lazy mode).
    pub(crate) fn domain(&self) -> &Arc<Domain> {
        match self {
            TimedQueue::Smmuv3 { path, .. } => path.domain(),
            TimedQueue::X86 { path, .. } => path.domain(),
        }
    }
}
