//! The device side: what a device's DMA goes through.
//!
//! [`Domain::translate`] turns a device's `(address, length)` into physical ranges the way
//! the IOMMU would: walking the page table page by page (each lookup counted in
//! `translations`), checking permissions, merging physically contiguous results. A fault
//! names the first address that failed and why ([`FaultReason`]).
//! [`Domain::dma_read`] and [`Domain::dma_write`] move real bytes between a device buffer
//! and [`PhysMemory`] through that translation, holding the page-table lock across the
//! translation and the copy so a concurrent unmap cannot slip in between.
//!
//! Without an IOMMU the address is the physical address (after checking the device's DMA
//! mask). In identity (passthrough) mode the same holds, but the IOMMU sees the access: it
//! counts as one translation that reads no page-table entries.
//!
//! There is no IOTLB here yet: a translation always reads the current page table. So in lazy
//! mode a device access after unmap faults at once, although on real hardware a stale IOTLB
//! entry could still translate it until the next flush. The IOTLB model (a later piece of
//! work) keeps stale entries and makes that window real.

use crate::addr::{Access, DmaAddr, Iova, PhysAddr, Prot};
use crate::mem::PhysMemory;
use crate::pgtable::IoPageTable;
use crate::work::{LockId, WorkRecord};

use super::domain::{Backend, Domain};
use super::{Device, DomainMode};

/// A physically contiguous piece of a translated access.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PhysRange {
    /// First byte.
    pub pa: PhysAddr,
    /// Length in bytes.
    pub len: u64,
}

/// Why a device access faulted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FaultReason {
    /// No translation for the address.
    #[error("Not mapped")]
    Unmapped,
    /// The mapping does not allow the access.
    #[error("Permission denied: needs {needed:?}, mapping allows {had:?}")]
    Permission {
        /// What the access needs.
        needed: Prot,
        /// What the mapping grants.
        had: Prot,
    },
    /// The address is beyond what the device's DMA mask can express.
    #[error("Beyond the device's {mask_bits}-bit DMA mask")]
    BeyondMask {
        /// The device's mask width.
        mask_bits: u32,
    },
    /// The translated physical address is outside memory.
    #[error("Physical address {pa:#x} is outside memory")]
    OutsideMemory {
        /// The first physical address outside memory.
        pa: u64,
    },
}

/// A faulting device access: which device, where, which way, and why.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("Device {device} {access:?} fault at DMA address {dma}")]
pub struct DmaFault {
    /// The device's id.
    pub device: u32,
    /// The first DMA address that faulted.
    pub dma: DmaAddr,
    /// The access that faulted.
    pub access: Access,
    /// Why.
    #[source]
    pub reason: FaultReason,
}

/// Walks `table` for `dma..dma+len`, page by page.
fn walk(
    table: &dyn IoPageTable,
    dev: &Device,
    dma: u64,
    len: u64,
    access: Access,
    work: &mut WorkRecord,
) -> Result<Vec<PhysRange>, DmaFault> {
    let fault = |at: u64, reason| DmaFault { device: dev.id(), dma: DmaAddr(at), access, reason };
    let needed = access.prot();
    let mut out: Vec<PhysRange> = Vec::new();
    let mut cur = dma;
    let mut remaining = len;
    while remaining > 0 {
        work.translations += 1;
        let t = table.translate(Iova::new(cur), work).ok_or(fault(cur, FaultReason::Unmapped))?;
        if !t.prot.allows(needed) {
            return Err(fault(cur, FaultReason::Permission { needed, had: t.prot }));
        }
        let chunk = remaining.min(t.page_size - (cur & (t.page_size - 1)));
        match out.last_mut() {
            Some(last) if last.pa.get() + last.len == t.pa.get() => last.len += chunk,
            _ => out.push(PhysRange { pa: t.pa, len: chunk }),
        }
        cur = cur.wrapping_add(chunk);
        remaining -= chunk;
    }
    Ok(out)
}

impl Domain {
    /// Translates a device access of `len` bytes at `dma_addr` to physical ranges, as the
    /// IOMMU would, or reports the fault. See the module docs.
    pub fn translate(
        &self,
        dev: &Device,
        dma_addr: DmaAddr,
        len: u64,
        access: Access,
        work: &mut WorkRecord,
    ) -> Result<Vec<PhysRange>, DmaFault> {
        self.with_translation(dev, dma_addr, len, access, work, |ranges, _| ranges.to_vec())
    }

    /// Translates and runs `f` on the ranges while the translation is still valid (the
    /// page-table lock held in translated modes).
    fn with_translation<R>(
        &self,
        dev: &Device,
        dma_addr: DmaAddr,
        len: u64,
        access: Access,
        work: &mut WorkRecord,
        f: impl FnOnce(&[PhysRange], &mut WorkRecord) -> R,
    ) -> Result<R, DmaFault> {
        let dma = dma_addr.0;
        if len == 0 {
            return Ok(f(&[], work));
        }
        if !dev.reaches(dma, len) {
            let at = dma.max(dev.dma_mask().saturating_add(1));
            let reason = FaultReason::BeyondMask { mask_bits: dev.mask_bits() };
            return Err(DmaFault { device: dev.id(), dma: DmaAddr(at), access, reason });
        }
        match &self.backend {
            Backend::Direct(_) => {
                if self.mode() == DomainMode::Identity {
                    work.translations += 1;
                }
                Ok(f(&[PhysRange { pa: PhysAddr::new(dma), len }], work))
            }
            Backend::Translated(t) => {
                work.lock(LockId::PageTable);
                let st = t.state.lock();
                let ranges = walk(&*st.table, dev, dma, len, access, work)?;
                Ok(f(&ranges, work))
            }
        }
    }

    /// Checks that every range lies in `mem`; faults at the DMA address of the first that
    /// does not.
    fn check_memory(
        mem: &PhysMemory,
        dev: &Device,
        dma: DmaAddr,
        access: Access,
        ranges: &[PhysRange],
    ) -> Result<(), DmaFault> {
        let mut off = 0;
        for r in ranges {
            if mem.check_range(r.pa, r.len).is_err() {
                // The first byte outside memory within this range.
                let inside = mem.size().saturating_sub(r.pa.get()).min(r.len);
                let reason = FaultReason::OutsideMemory { pa: r.pa.get() + inside };
                let at = DmaAddr(dma.0 + off + inside);
                return Err(DmaFault { device: dev.id(), dma: at, access, reason });
            }
            off += r.len;
        }
        Ok(())
    }

    /// The device reads `buf.len()` bytes of memory at `dma_addr` into `buf` (a transmit).
    /// Either every byte moves or none does.
    pub fn dma_read(
        &self,
        dev: &Device,
        mem: &PhysMemory,
        dma_addr: DmaAddr,
        buf: &mut [u8],
        work: &mut WorkRecord,
    ) -> Result<(), DmaFault> {
        let access = Access::Read;
        self.with_translation(dev, dma_addr, buf.len() as u64, access, work, |ranges, work| {
            Self::check_memory(mem, dev, dma_addr, access, ranges)?;
            let mut done = 0usize;
            for r in ranges {
                let n = r.len as usize;
                let read = mem.read(r.pa, &mut buf[done..done + n]);
                debug_assert!(read.is_ok(), "checked range failed: {read:?}");
                done += n;
            }
            work.dma_bytes += done as u64;
            Ok(())
        })?
    }

    /// The device writes `data` to memory at `dma_addr` (a receive). Either every byte
    /// moves or none does.
    pub fn dma_write(
        &self,
        dev: &Device,
        mem: &PhysMemory,
        dma_addr: DmaAddr,
        data: &[u8],
        work: &mut WorkRecord,
    ) -> Result<(), DmaFault> {
        let access = Access::Write;
        self.with_translation(dev, dma_addr, data.len() as u64, access, work, |ranges, work| {
            Self::check_memory(mem, dev, dma_addr, access, ranges)?;
            let mut done = 0usize;
            for r in ranges {
                let n = r.len as usize;
                let written = mem.write(r.pa, &data[done..done + n]);
                debug_assert!(written.is_ok(), "checked range failed: {written:?}");
                done += n;
            }
            work.dma_bytes += done as u64;
            Ok(())
        })?
    }
}
