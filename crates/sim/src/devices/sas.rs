//! A SAS HBA with N disks, modelled on HiSilicon's hisi_sas v2 hardware (Hi1616, D05).
//!
//! - The HBA processes commands one at a time (delivery-queue fetch, I/O context set-up,
//!   completion-queue write): [`SasParams::hba_command_ns`] each, serialised. Behind an
//!   IOMMU the controller's DMA for a command also waits for the translation of its buffer
//!   (an IOTLB miss and table walk in strict mode, the caller's `dma_extra_ns`), and that
//!   stall is part of the serialised per-command time (assumption: one DMA context in the
//!   controller; the 2019 posting found the SAS array's IOMMU loss insensitive to the
//!   CPUs' unmap cost, docs/model/smmuv3-cmdq.md).
//! - Each disk services commands with its own latency and rated IOPS.
//! - Completions go to one of the HBA's completion queues, each with its own interrupt
//!   vector. hisi_sas v2 (2019) gives every device one delivery queue,
//!   `device id % queue count`, and completes on the matching completion queue; so with
//!   8 disks only 8 completion queues, and so 8 interrupt vectors, carry all completions.
//!   The interrupt handler schedules a tasklet on the CPU that took the interrupt, which
//!   completes every slot of that queue, DMA unmap included.

use std::cell::RefCell;

use iolab_iommu::addr::Access;

use super::PortedDma;
use crate::iommu::port::{DeviceLink, DmaStream};

/// The HBA and its disks.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SasParams {
    /// Disks attached (one per phy).
    pub disks: usize,
    /// Completion queues (interrupt vectors) of the HBA.
    pub completion_queues: usize,
    /// HBA processing per command, ns (serialised in the HBA).
    pub hba_command_ns: f64,
    /// Per-disk 4 KiB random-read latency, ns.
    pub disk_read_latency_ns: u64,
    /// Per-disk 4 KiB write latency, ns.
    pub disk_write_latency_ns: u64,
    /// Per-disk rated 4 KiB random IOPS.
    pub disk_max_iops: f64,
    /// Per-phy link bandwidth, bytes per second.
    pub link_bandwidth: f64,
}

#[derive(Debug, Default)]
struct State {
    hba_free_at: f64,
    disk_free_at: Vec<f64>,
    link_free_at: Vec<f64>,
    commands: u64,
}

/// One HBA.
#[derive(Debug)]
pub struct SasHba {
    params: SasParams,
    state: RefCell<State>,
    /// The HBA's DMA streams at the IOMMU's port, one per disk: a disk's data moves in the
    /// order its commands' transfers start (the disks' transfers interleave in time but
    /// reach the model command by command, so one stream for all would impose the
    /// commands' order on walks that happen in the transfers' order).
    streams: Vec<DmaStream>,
}

impl SasHba {
    /// An HBA of `params` (at least one disk and one queue are assumed by the caller).
    pub fn new(params: SasParams) -> Self {
        let n = params.disks.max(1);
        SasHba {
            params,
            state: RefCell::new(State {
                disk_free_at: vec![0.0; n],
                link_free_at: vec![0.0; n],
                ..State::default()
            }),
            streams: (0..n).map(|_| DmaStream::new(SAS_LINK)).collect(),
        }
    }

    /// The HBA's parameters.
    pub fn params(&self) -> &SasParams {
        &self.params
    }

    /// The disk holding byte `offset` of a striped target (fio over N files: round-robin by
    /// block).
    pub fn disk_for(&self, offset: u64, bs: u64) -> usize {
        ((offset / bs.max(1)) % self.params.disks.max(1) as u64) as usize
    }

    /// The completion queue (and interrupt vector) of `disk`: hisi_sas v2's
    /// `device id % queue count`.
    pub fn queue_for_disk(&self, disk: usize) -> usize {
        disk % self.params.completion_queues.max(1)
    }

    /// Commands serviced so far.
    pub fn commands(&self) -> u64 {
        self.state.borrow().commands
    }

    /// A command for `disk` delivered at `now_ns`: returns when the HBA writes its
    /// completion entry. Its data moves through the IOMMU's DMA port (`dma`,
    /// [`crate::iommu::port`]; `None` without an IOMMU): what a walk holds up on the HBA's
    /// stream of writes to memory (a read's data: posted writes may not pass each other)
    /// also holds the controller (serialised with other commands), and every stall delays
    /// the completion.
    pub fn service(
        &self,
        now_ns: u64,
        disk: usize,
        bytes: u64,
        is_read: bool,
        dma: Option<PortedDma>,
    ) -> u64 {
        let p = self.params;
        let mut s = self.state.borrow_mut();
        s.commands += 1;
        let d = disk % p.disks.max(1);
        // The HBA fetches the command, sets up its I/O context and later writes its
        // completion entry: hba_command_ns of controller time per command, serialised.
        let issue = (now_ns as f64).max(s.hba_free_at);
        // The disk accepts commands at its rated rate and answers after its latency.
        let start = (issue + p.hba_command_ns).max(s.disk_free_at[d]);
        s.disk_free_at[d] = start + 1e9 / p.disk_max_iops.max(1.0);
        let lat = if is_read {
            p.disk_read_latency_ns
        } else {
            p.disk_write_latency_ns
        } as f64;
        let xfer = bytes as f64 * 1e9 / p.link_bandwidth.max(1.0);
        let xfer_start = (start + lat).max(s.link_free_at[d]);
        s.link_free_at[d] = xfer_start + xfer;
        let access = if is_read { Access::Write } else { Access::Read };
        let t = PortedDma::time(dma, xfer_start, xfer, access, &self.streams[d]);
        let stall = t.done - (xfer_start + xfer);
        let held = t.stream_free - (xfer_start + xfer);
        s.hba_free_at = issue + p.hba_command_ns + held;
        (s.link_free_at[d] + stall).ceil() as u64
    }
}

/// How far a SAS HBA's DMA requests run ahead, for the [DMA port](crate::iommu::port):
/// assumption, as an NVMe drive's ([`super::nvme::NVME_LINK`]): 32 pages of reads in
/// flight, ordered writes to memory.
pub const SAS_LINK: DeviceLink = DeviceLink {
    outstanding_pages: 32,
    relaxed_ordering: false,
};

#[cfg(test)]
mod tests {
    use super::*;

    fn hba() -> SasHba {
        SasHba::new(SasParams {
            disks: 8,
            completion_queues: 16,
            hba_command_ns: 400.0,
            disk_read_latency_ns: 100_000,
            disk_write_latency_ns: 30_000,
            disk_max_iops: 200_000.0,
            link_bandwidth: 1.2e9,
        })
    }

    #[test]
    fn eight_disks_use_eight_of_sixteen_queues() {
        let h = hba();
        let mut qs: Vec<usize> = (0..8).map(|d| h.queue_for_disk(d)).collect();
        qs.dedup();
        assert_eq!(qs.len(), 8);
        assert!(qs.iter().all(|&q| q < 8));
    }

    #[test]
    fn a_disk_never_exceeds_its_rated_rate() {
        let h = hba();
        let mut last = 0;
        for _ in 0..100 {
            last = h.service(0, 3, 4096, true, None);
        }
        assert!(last as f64 >= 99.0 * 5_000.0 + 100_000.0, "{last}");
    }
}
