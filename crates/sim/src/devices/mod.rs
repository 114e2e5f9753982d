//! Device models. Every byte a device moves goes through the IOMMU's translation.
//!
//! Beside the models, the device side shared by the storage stacks that drive NVMe SSDs and
//! SAS HBAs (the `smmuv3-cmdq` experiment's and the lab's): `BlockDev`, which times an I/O
//! on either and names its completion vector, and `DeviceDma`, the device's DMA through
//! the IOMMU.
pub mod hostile;
pub mod nic;
pub mod nvme;
pub mod sas;
pub mod scsi;
pub mod usb;

use std::cell::RefCell;

use iolab_iommu::addr::{Access, DmaAddr};
use iolab_iommu::dma::{Device, Direction, PhysRange};
use iolab_iommu::hw::DmaPath;
use iolab_iommu::work::WorkRecord;

use crate::iommu::port::{DmaPort, DmaStream, Translated};

/// One block device's timing model.
pub(crate) enum BlockDev {
    /// An NVMe SSD.
    Nvme(nvme::Nvme),
    /// A SAS HBA with its disks.
    Sas(sas::SasHba),
}

/// What a block device is asked to do for one I/O.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BlockIo {
    /// Device to memory.
    pub is_read: bool,
    /// Byte offset on the device.
    pub offset: u64,
    /// Bytes moved.
    pub len: u64,
    /// The SAS stripe unit that places the I/O on a disk.
    pub stripe: u64,
}

impl BlockIo {
    /// The DMA direction of the I/O's buffer.
    pub(crate) fn direction(&self) -> Direction {
        if self.is_read {
            Direction::FromDevice
        } else {
            Direction::ToDevice
        }
    }

    /// What the device's DMA does to memory: a read writes it.
    pub(crate) fn access(&self) -> Access {
        if self.is_read {
            Access::Write
        } else {
            Access::Read
        }
    }

    /// The I/O's name on a device's trace track.
    pub(crate) fn name(&self) -> &'static str {
        if self.is_read {
            "read"
        } else {
            "write"
        }
    }
}

impl BlockDev {
    /// `io`, submitted on `cpu` at `now` (ns), its DMA through the IOMMU's port (`dma`):
    /// when the device completes it, and its completion vector (NVMe: the submitting CPU's
    /// queue; SAS: the queue of the disk holding the I/O), to be taken modulo the vectors
    /// there are.
    pub(crate) fn service(
        &self,
        now: u64,
        cpu: usize,
        io: BlockIo,
        dma: Option<PortedDma>,
    ) -> (u64, usize) {
        match self {
            BlockDev::Nvme(d) => (
                d.service(now, io.len, io.is_read, dma),
                d.queue_for_cpu(cpu),
            ),
            BlockDev::Sas(hba) => {
                let disk = hba.disk_for(io.offset, io.stripe);
                (
                    hba.service(now, disk, io.len, io.is_read, dma),
                    hba.queue_for_disk(disk),
                )
            }
        }
    }
}

/// One DMA as the [DMA port](crate::iommu::port) times it: the unit's port and what the
/// DMA's translation did in the unit's caches.
#[derive(Clone, Copy, Debug)]
pub struct PortedDma<'a> {
    /// The port of the unit the device sits behind.
    pub port: &'a DmaPort,
    /// The DMA's pages, misses and walk reads.
    pub translated: Translated,
}

/// When a DMA is through and when the device's DMA stream may move its next one.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PortTiming {
    /// The DMA's last byte is through, ns.
    pub done: f64,
    /// The device's stream is free for its next DMA, ns: `done` for writes to memory that
    /// may not be passed (a stall holds the stream), the end of the data otherwise.
    pub stream_free: f64,
}

impl PortedDma<'_> {
    /// Times a DMA whose data is ready at `ready` and takes `data_ns`, through `dma`'s port
    /// (or straight, without an IOMMU in the way), on the device's `stream`.
    pub fn time(
        dma: Option<PortedDma<'_>>,
        ready: f64,
        data_ns: f64,
        access: Access,
        stream: &DmaStream,
    ) -> PortTiming {
        let data_end = ready + data_ns;
        let link = stream.link();
        let done = match dma {
            Some(d) => d
                .port
                .transfer(ready, data_ns, d.translated, access, stream),
            None => data_end,
        };
        let ordered = access == Access::Write && !link.relaxed_ordering;
        PortTiming {
            done,
            stream_free: if ordered { done } else { data_end },
        }
    }
}

/// A device's DMA through the IOMMU: the DMA path's device side
/// ([`DmaPath::device_translate_into`]: an SMMUv3's or an x86 unit's IOTLB and walk caches,
/// a walk on a miss; another path's translation or its bypass), the physical ranges left in
/// a reused buffer.
pub(crate) struct DeviceDma<'a> {
    /// The DMA path the device's accesses go through.
    pub path: &'a dyn DmaPath,
    /// The device.
    pub device: &'a Device,
    /// The physical ranges of the last SMMUv3 translation (reused, not kept).
    pub ranges: &'a RefCell<Vec<PhysRange>>,
}

impl DeviceDma<'_> {
    /// Whether the device's access of `len` bytes at `dma` gets through (a hostile
    /// device's probe, [`hostile`]): the same translation as [`DeviceDma::transfer`], its
    /// work not charged (the device does it), a refusal a real fault.
    pub(crate) fn reaches(&self, dma: u64, len: u64, access: Access) -> bool {
        let mut w = WorkRecord::new();
        self.transfer(DmaAddr(dma), len, access, &mut w).is_ok()
    }

    /// [`DeviceDma::transfer`], returning what the translation did in the unit's caches
    /// for the [DMA port](crate::iommu::port): the pages looked up, the misses and walk
    /// reads (the differences of `tw`'s counters).
    pub(crate) fn translate(
        &self,
        dma: DmaAddr,
        len: u64,
        access: Access,
        tw: &mut WorkRecord,
    ) -> Result<Translated, String> {
        let before = (tw.translations, tw.iotlb_misses, tw.walk_reads);
        self.transfer(dma, len, access, tw)?;
        let span = if len == 0 {
            0
        } else {
            ((dma.0 + len - 1) >> 12) - (dma.0 >> 12) + 1
        };
        Ok(Translated {
            pages: (tw.translations - before.0).max(span),
            misses: tw.iotlb_misses - before.1,
            walk_reads: tw.walk_reads - before.2,
        })
    }

    /// The device moves `len` bytes at `dma` (`access` as the device sees it); `tw` counts
    /// the translation's work. A fault is the message a stack records.
    pub(crate) fn transfer(
        &self,
        dma: DmaAddr,
        len: u64,
        access: Access,
        tw: &mut WorkRecord,
    ) -> Result<(), String> {
        self.path
            .device_translate_into(
                self.device,
                dma,
                len,
                access,
                &mut self.ranges.borrow_mut(),
                tw,
            )
            .map_err(|e| format!("device DMA faulted: {e}"))
    }
}
