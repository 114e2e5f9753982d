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
//! The generic domain has no IOTLB of its own: a translation reads the current page table.
//! In lazy mode it then falls back to the domain's record of unmapped runs whose flush has
//! not completed, standing in for the worst an IOTLB allows (every such page still cached):
//! an access through one of them succeeds with the old page and permissions and is counted
//! as a stale hit ([`super::protection`]). Strict mode keeps no such runs. Every access is
//! also counted for the protection report: a bypass in the direct modes, a translation or
//! permission fault when refused.

use crate::addr::{Access, DmaAddr, Iova, PhysAddr, Prot};
use crate::mem::PhysMemory;
use crate::pgtable::IoPageTable;
use crate::work::{LockId, WorkRecord};

use super::domain::{Backend, Domain};
use super::protection::StaleSet;
use super::{Device, DomainMode};

/// A physically contiguous piece of a translated access.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PhysRange {
    /// First byte.
    pub pa: PhysAddr,
    /// Length in bytes.
    pub len: u64,
}

impl PhysRange {
    /// Appends `len` bytes at `pa` to `ranges`, growing the last range instead when the
    /// new piece starts where it ends: how a translation builds its list of physically
    /// contiguous pieces.
    #[inline]
    pub fn append_to(ranges: &mut Vec<PhysRange>, pa: PhysAddr, len: u64) {
        match ranges.last_mut() {
            Some(last) if last.pa.get() + last.len == pa.get() => last.len += len,
            _ => ranges.push(PhysRange { pa, len }),
        }
    }

    /// The canonical form of a list of ranges: neighbours that are physically contiguous
    /// merged into one, order kept.
    pub fn coalesce(ranges: impl IntoIterator<Item = PhysRange>) -> Vec<PhysRange> {
        let mut out = Vec::new();
        for r in ranges {
            PhysRange::append_to(&mut out, r.pa, r.len);
        }
        out
    }
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

/// Walks `table` for `dma..dma+len`, page by page; where the table has nothing, `stale`'s
/// runs still translate. Returns the ranges and whether any stale run was used.
fn walk(
    table: &dyn IoPageTable,
    stale: &StaleSet,
    dev: &Device,
    dma: u64,
    len: u64,
    access: Access,
    work: &mut WorkRecord,
) -> Result<(Vec<PhysRange>, bool), DmaFault> {
    let fault = |at: u64, reason| DmaFault {
        device: dev.id(),
        dma: DmaAddr(at),
        access,
        reason,
    };
    let needed = access.prot();
    let mut out: Vec<PhysRange> = Vec::new();
    let mut cur = dma;
    let mut remaining = len;
    let mut used_stale = false;
    while remaining > 0 {
        work.translations += 1;
        let (pa, prot, span) = match table.translate(Iova::new(cur), work) {
            Some(t) => (t.pa, t.prot, t.page_size - (cur & (t.page_size - 1))),
            None => {
                let s = stale.lookup(cur).ok_or(fault(cur, FaultReason::Unmapped))?;
                used_stale = true;
                (s.pa, s.prot, s.remaining)
            }
        };
        if !prot.allows(needed) {
            return Err(fault(cur, FaultReason::Permission { needed, had: prot }));
        }
        let chunk = remaining.min(span);
        PhysRange::append_to(&mut out, pa, chunk);
        cur = cur.wrapping_add(chunk);
        remaining -= chunk;
    }
    Ok((out, used_stale))
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
        self.with_translation(dev, dma_addr, len, access, work, |ranges, _| {
            ranges.to_vec()
        })
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
            let reason = FaultReason::BeyondMask {
                mask_bits: dev.mask_bits(),
            };
            self.protection.record_fault(&reason);
            return Err(DmaFault {
                device: dev.id(),
                dma: DmaAddr(at),
                access,
                reason,
            });
        }
        match &self.backend {
            Backend::Direct(_) => {
                if self.mode() == DomainMode::Identity {
                    work.translations += 1;
                }
                self.protection.record_bypass();
                Ok(f(
                    &[PhysRange {
                        pa: PhysAddr::new(dma),
                        len,
                    }],
                    work,
                ))
            }
            Backend::Translated(t) => {
                work.lock(LockId::PageTable);
                let st = t.state.lock();
                match walk(&*st.table, &st.stale, dev, dma, len, access, work) {
                    Ok((ranges, used_stale)) => {
                        if used_stale {
                            self.protection.record_stale_hit(len);
                        }
                        Ok(f(&ranges, work))
                    }
                    Err(fault) => {
                        self.protection.record_fault(&fault.reason);
                        Err(fault)
                    }
                }
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
                let reason = FaultReason::OutsideMemory {
                    pa: r.pa.get() + inside,
                };
                let at = DmaAddr(dma.0 + off + inside);
                return Err(DmaFault {
                    device: dev.id(),
                    dma: at,
                    access,
                    reason,
                });
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
        self.with_translation(
            dev,
            dma_addr,
            buf.len() as u64,
            access,
            work,
            |ranges, work| {
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
            },
        )?
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
        self.with_translation(
            dev,
            dma_addr,
            data.len() as u64,
            access,
            work,
            |ranges, work| {
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
            },
        )?
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::addr::{SZ_4G, SZ_4K};
    use crate::dma::testutil::{dev32, dev64, lpae_domain, memory, Fx};
    use crate::dma::{Direction, DmaError, DmaMapping, DomainConfig, DomainId, SgEntry};

    fn pa(v: u64) -> PhysAddr {
        PhysAddr::new(v)
    }

    /// Maps `len` bytes at physical address `addr` in `fx`'s domain for the 64-bit test
    /// device, on CPU 0.
    fn map64(
        fx: &Fx,
        addr: u64,
        len: u64,
        dir: Direction,
        w: &mut WorkRecord,
    ) -> Result<DmaMapping, DmaError> {
        fx.domain.map_page(&dev64(), pa(addr), len, dir, 0, w)
    }

    #[test]
    fn translate_merges_physically_contiguous_pages() {
        let fx = lpae_domain(DomainMode::Strict, |_| {});
        let mut w = WorkRecord::new();
        let m = map64(&fx, 0x10_0800, 3 * SZ_4K, Direction::ToDevice, &mut w).unwrap();
        let mut t = WorkRecord::new();
        let r = fx
            .domain
            .translate(&dev64(), m.dma_addr(), 3 * SZ_4K, Access::Read, &mut t)
            .unwrap();
        assert_eq!(
            r,
            vec![PhysRange {
                pa: pa(0x10_0800),
                len: 3 * SZ_4K
            }]
        );
        assert_eq!(t.translations, 4, "one lookup per page touched");
        assert_eq!(t.lock_count(LockId::PageTable), 1);
        fx.domain.unmap_page(m, 0, 0, &mut w).unwrap();
    }

    #[test]
    fn translate_splits_where_the_pieces_of_a_segment_are_not_contiguous() {
        let fx = lpae_domain(DomainMode::Strict, |_| {});
        let mut w = WorkRecord::new();
        let list = [
            SgEntry::new(pa(0x10000), SZ_4K),
            SgEntry::new(pa(0x30000), SZ_4K),
        ];
        let m = fx
            .domain
            .map_sg(&dev64(), &list, Direction::ToDevice, 0, &mut w)
            .unwrap();
        let s = m.segments()[0];
        let r = fx
            .domain
            .translate(&dev64(), s.dma, s.len, Access::Read, &mut w)
            .unwrap();
        assert_eq!(
            r,
            vec![
                PhysRange {
                    pa: pa(0x10000),
                    len: SZ_4K
                },
                PhysRange {
                    pa: pa(0x30000),
                    len: SZ_4K
                }
            ]
        );
        fx.domain.unmap_sg(m, 0, 0, &mut w).unwrap();
    }

    #[test]
    fn a_write_to_a_to_device_mapping_is_a_permission_fault() {
        let fx = lpae_domain(DomainMode::Strict, |_| {});
        let mut w = WorkRecord::new();
        let m = map64(&fx, 0x1000, 16, Direction::ToDevice, &mut w).unwrap();
        let f = fx
            .domain
            .translate(&dev64(), m.dma_addr(), 16, Access::Write, &mut w)
            .unwrap_err();
        assert_eq!(f.dma, m.dma_addr());
        assert_eq!(
            f.reason,
            FaultReason::Permission {
                needed: Prot::WRITE,
                had: Prot::READ
            }
        );
        fx.domain.unmap_page(m, 0, 0, &mut w).unwrap();
    }

    #[test]
    fn an_access_after_unmap_faults_in_strict_mode_and_hits_stale_in_lazy_mode() {
        for mode in [DomainMode::Strict, DomainMode::Lazy] {
            let fx = lpae_domain(mode, |_| {});
            let mut w = WorkRecord::new();
            let m = map64(&fx, 0x1000, SZ_4K, Direction::ToDevice, &mut w).unwrap();
            let dma = m.dma_addr();
            fx.domain.unmap_page(m, 0, 100, &mut w).unwrap();
            let got = fx.domain.translate(&dev64(), dma, 1, Access::Read, &mut w);
            let p = fx.domain.protection();
            if mode == DomainMode::Strict {
                let f = got.unwrap_err();
                assert_eq!((f.dma, f.reason), (dma, FaultReason::Unmapped));
                assert_eq!((p.stale_hits, p.translation_faults), (0, 1));
            } else {
                // Not flushed yet: the old page is still reachable, with its old rights.
                assert_eq!(
                    got.unwrap(),
                    vec![PhysRange {
                        pa: pa(0x1000),
                        len: 1
                    }]
                );
                assert_eq!((p.stale_hits, p.stale_bytes, p.deferred_unmaps), (1, 1, 1));
                let f = fx
                    .domain
                    .translate(&dev64(), dma, 1, Access::Write, &mut w)
                    .unwrap_err();
                assert!(matches!(f.reason, FaultReason::Permission { .. }));
                fx.domain.poll_timeout(100 + 10_000_000, &mut w);
                let f = fx
                    .domain
                    .translate(&dev64(), dma, 1, Access::Read, &mut w)
                    .unwrap_err();
                assert_eq!(f.reason, FaultReason::Unmapped, "gone after the flush");
                let p = fx.domain.protection();
                assert_eq!(p.max_reachable_after_unmap_ns, 10_000_000);
                assert_eq!((p.translation_faults, p.permission_faults), (1, 1));
            }
        }
    }

    #[test]
    fn an_access_running_past_the_mapping_faults_at_the_first_unmapped_byte() {
        let fx = lpae_domain(DomainMode::Strict, |_| {});
        let (mem, _) = memory();
        let mut w = WorkRecord::new();
        let m = map64(&fx, 0x1000, SZ_4K, Direction::FromDevice, &mut w).unwrap();
        let f = fx
            .domain
            .dma_write(
                &dev64(),
                &mem,
                m.dma_addr(),
                &[1; 2 * SZ_4K as usize],
                &mut w,
            )
            .unwrap_err();
        assert_eq!(f.dma, DmaAddr(m.dma_addr().0 + SZ_4K));
        assert_eq!(f.reason, FaultReason::Unmapped);
        assert_eq!(mem.resident_pages(), 0, "nothing moves on a fault");
        fx.domain.unmap_page(m, 0, 0, &mut w).unwrap();
    }

    #[test]
    fn addresses_beyond_the_device_mask_fault() {
        let fx = lpae_domain(DomainMode::Strict, |_| {});
        let mut w = WorkRecord::new();
        let f = fx
            .domain
            .translate(&dev32(), DmaAddr(SZ_4G - 8), 16, Access::Read, &mut w)
            .unwrap_err();
        assert_eq!(f.dma, DmaAddr(SZ_4G));
        assert_eq!(f.reason, FaultReason::BeyondMask { mask_bits: 32 });
        let d = Domain::direct(DomainConfig::new(DomainId(5), DomainMode::NoIommu)).unwrap();
        assert!(d
            .translate(&dev32(), DmaAddr(SZ_4G), 1, Access::Read, &mut w)
            .is_err());
    }

    #[test]
    fn dma_moves_real_bytes_both_ways() {
        let fx = lpae_domain(DomainMode::Strict, |_| {});
        let (mem, _) = memory();
        let mut w = WorkRecord::new();
        let m = map64(&fx, 0x7_0ff0, 0x20, Direction::Bidirectional, &mut w).unwrap();
        let data: Vec<u8> = (0..0x20).collect();
        let mut d = WorkRecord::new();
        fx.domain
            .dma_write(&dev64(), &mem, m.dma_addr(), &data, &mut d)
            .unwrap();
        let mut cpu = vec![0; 0x20];
        mem.read(pa(0x7_0ff0), &mut cpu).unwrap();
        assert_eq!(cpu, data);
        mem.write(pa(0x7_0ff0), &[9; 0x20]).unwrap();
        let mut dev_buf = vec![0; 0x20];
        fx.domain
            .dma_read(&dev64(), &mem, m.dma_addr(), &mut dev_buf, &mut d)
            .unwrap();
        assert_eq!(dev_buf, vec![9; 0x20]);
        assert_eq!((d.dma_bytes, d.translations), (0x40, 4));
        fx.domain.unmap_page(m, 0, 0, &mut w).unwrap();
    }

    #[test]
    fn translations_outside_memory_fault_and_move_nothing() {
        let fx = lpae_domain(DomainMode::Strict, |_| {});
        let mem = PhysMemory::new(1 << 20).unwrap();
        let mut w = WorkRecord::new();
        let m = map64(
            &fx,
            (1 << 20) - SZ_4K,
            2 * SZ_4K,
            Direction::FromDevice,
            &mut w,
        )
        .unwrap();
        let f = fx
            .domain
            .dma_write(
                &dev64(),
                &mem,
                m.dma_addr(),
                &[1; 2 * SZ_4K as usize],
                &mut w,
            )
            .unwrap_err();
        assert_eq!(f.reason, FaultReason::OutsideMemory { pa: 1 << 20 });
        assert_eq!(f.dma, DmaAddr(m.dma_addr().0 + SZ_4K));
        assert_eq!(mem.resident_pages(), 0);
        fx.domain.unmap_page(m, 0, 0, &mut w).unwrap();
    }

    #[test]
    fn direct_modes_pass_the_address_through_and_identity_counts_the_bypass() {
        let (mem, _) = memory();
        for (mode, translations) in [(DomainMode::NoIommu, 0), (DomainMode::Identity, 1)] {
            let d = Domain::direct(DomainConfig::new(DomainId(5), mode)).unwrap();
            let mut w = WorkRecord::new();
            let r = d
                .translate(&dev64(), DmaAddr(0x1234), 10, Access::Write, &mut w)
                .unwrap();
            assert_eq!(
                r,
                vec![PhysRange {
                    pa: pa(0x1234),
                    len: 10
                }]
            );
            assert_eq!((w.translations, w.pte_reads), (translations, 0));
            d.dma_write(&dev64(), &mem, DmaAddr(0x1234), b"hello", &mut w)
                .unwrap();
            let mut b = [0; 5];
            mem.read(pa(0x1234), &mut b).unwrap();
            assert_eq!(&b, b"hello");
        }
    }

    #[test]
    fn a_zero_length_access_translates_to_nothing() {
        let fx = lpae_domain(DomainMode::Strict, |_| {});
        let mut w = WorkRecord::new();
        assert_eq!(
            fx.domain
                .translate(&dev64(), DmaAddr(0x1000), 0, Access::Read, &mut w),
            Ok(vec![])
        );
        assert!(w.is_empty());
    }

    #[test]
    fn faults_print_the_device_address_and_reason() {
        use std::error::Error;
        let f = DmaFault {
            device: 3,
            dma: DmaAddr(0x1000),
            access: Access::Write,
            reason: FaultReason::Unmapped,
        };
        assert_eq!(f.to_string(), "Device 3 Write fault at DMA address 0x1000");
        assert_eq!(f.source().unwrap().to_string(), "Not mapped");
    }
}
