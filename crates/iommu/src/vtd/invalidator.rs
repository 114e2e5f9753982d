//! The Linux intel-iommu invalidation path: `qi_submit_sync` on the driver's side of the
//! invalidation queue ([`Dmar::qi_submit_sync`]), the page-selective mask computation
//! ([`psi_mask`]), and the strict-mode [`Invalidator`] of second-stage domains
//! ([`VtdInvalidator`]).
//!
//! # `qi_submit_sync` (X86.md §2.5, Linux `dmar.c`)
//!
//! 1. Take the unit's queue lock (`q_lock`; counted as [`LockId::CmdqLock`]). While fewer
//!    than `count + 2` slots are free (descriptors, the wait, one gap), drop it, let the
//!    hardware run, retake it.
//! 2. Write the descriptors at `free_head` and mark their status slots in use; append a
//!    wait descriptor with SW = 1, STDATA = `QI_DONE`, STADDR = the wait slot's status
//!    word; one `commands_written` per descriptor, the wait included.
//! 3. One MMIO write of the new tail to IQT.
//! 4. Poll the status word. Each look that finds it not done counts one `polls`, reads FSTS
//!    (one `mmio_reads`; Linux `qi_check_fault`), and drops and retakes the lock (one more
//!    acquisition). An IQE whose IQH lies in this batch is handled as Linux does: the bad
//!    descriptor is overwritten with this batch's wait descriptor, IQE is cleared (one
//!    `mmio_writes`, plus the IQH read), and the call fails.
//! 5. Free the batch's slots and reclaim consecutive free slots from `free_tail`, unlock.
//!
//! The lab's hardware runs between polls (see [`Dmar::process_queue`]), so on one thread a
//! submission counts 2 lock acquisitions, 1 tail write, 1 poll and 1 FSTS read.
//!
//! # The strict path (X86.md §2.4)
//!
//! A strict unmap's gathered ranges and freed tables accumulate per thread (the DMA layer
//! calls `invalidate_range` / `invalidate_walk` and then `sync` on one thread). At `sync`,
//! each contiguous span becomes one IOTLB descriptor from [`iotlb_flush_desc`]: a PSI with
//! the smallest naturally aligned mask covering the span ([`psi_mask`], Linux
//! `calculate_psi_aligned_address`), or a domain-selective invalidation when the unit has no
//! PSI or the mask exceeds CAP.MAMV. DR/DW follow CAP.DRD/DWD. The descriptors and a wait go
//! in one `qi_submit_sync` under the domain's `cache_lock` (counted as [`LockId::Other`];
//! no [`LockId`] variant was added so the lab's lock tables stay as they are), as Linux
//! v6.12+ batches them. A disjoint range is its own descriptor in the same batch (Linux
//! would sync the gather early instead). So one strict unmap of one mapping is 2
//! descriptors, 1 tail write, 1 wait.
//!
//! IH: Linux's `qi_desc_iotlb` masks the IH bit away for second-stage domains (X86.md §2.4),
//! so every PSI also drops paging-structure-cache entries; [`VtdInvalidator::set_honour_ih`]
//! gives the F&S variant, IH = 1 when the span freed no table.
//!
//! A lazy flush (`invalidate_domain`) is one domain-selective descriptor and a wait
//! (Linux `cache_tag_flush_all`, X86.md §2.6).

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use super::device::{qi_status, Dmar};
use super::scalable::flush_all_desc;
use super::spec::{
    devtlb_addr, fsts, Cap, DescEncodeError, InvDesc, IotlbGranularity, PasidIotlbGranularity,
};
use crate::addr::{Iova, PhysAddr};
use crate::dma::{DomainId, Invalidator};
use crate::pgtable::{FreedTable, GatherRange};
use crate::work::{LockId, WorkRecord};

/// Linux's `MAX_AGAW_PFN_WIDTH`: the mask used when the two ends share no page-number bit.
pub const MAX_AGAW_PFN_WIDTH: u32 = 52;

/// The address and mask of the single page-selective invalidation covering the byte range
/// `start..=end` (Linux `calculate_psi_aligned_address`, X86.md §2.4): pages = the 4 KiB
/// pages the range touches, rounded up to a power of two, mask its log2; if the first page
/// number is not aligned to that, the mask becomes the lowest bit above it that both end
/// pages share (the smallest naturally aligned block holding both), or 52 if none. The
/// address is `start` rounded down to 4 KiB << mask.
pub fn psi_mask(start: u64, end: u64) -> (u64, u32) {
    let pfn = start >> 12;
    let end_pfn = end >> 12;
    let pages = end_pfn - pfn + 1;
    let aligned = pages.next_power_of_two();
    let bitmask = aligned - 1;
    let mut mask = aligned.trailing_zeros();
    if bitmask & pfn != 0 {
        let shared = !(pfn ^ end_pfn) & !bitmask;
        mask = if shared == 0 {
            MAX_AGAW_PFN_WIDTH
        } else {
            shared.trailing_zeros()
        };
    }
    let addr = if mask >= MAX_AGAW_PFN_WIDTH {
        0
    } else {
        start & !((4096u64 << mask) - 1)
    };
    (addr, mask)
}

/// The IOTLB descriptor Linux's strict path builds for `start..=end` of domain `did` on a
/// unit with `cap`: a PSI ([`psi_mask`]) unless CAP.PSI is clear or the mask exceeds
/// CAP.MAMV, then a domain-selective one; DR/DW set when CAP.DRD/DWD say the unit drains.
pub fn iotlb_flush_desc(cap: Cap, did: u16, start: u64, end: u64, ih: bool) -> InvDesc {
    let (addr, mask) = psi_mask(start, end);
    let granularity = if !cap.psi() || mask > cap.mamv() {
        IotlbGranularity::Domain { did }
    } else {
        IotlbGranularity::Page {
            did,
            addr,
            am: mask as u8,
            ih,
        }
    };
    InvDesc::Iotlb {
        granularity,
        drain_reads: cap.drd(),
        drain_writes: cap.dwd(),
    }
}

/// Why a `qi_submit_sync` failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum QiError {
    /// A descriptor could not be encoded (nothing was written).
    #[error("Cannot encode descriptor {index}")]
    Encode {
        /// Its index in the batch.
        index: usize,
        /// Why.
        source: DescEncodeError,
    },
    /// More descriptors than the queue can ever hold with a wait and a gap.
    #[error("{count} descriptors do not fit a queue of {entries}")]
    TooMany {
        /// Descriptors in the batch.
        count: usize,
        /// Queue entries.
        entries: usize,
    },
    /// The hardware raised an invalidation-queue error at this batch's descriptor
    /// `index` (the wait is index `count`).
    #[error("Invalidation queue error at descriptor {index} of the batch")]
    InvalidDescriptor {
        /// Index in the batch.
        index: usize,
    },
}

/// The driver's state of one unit's invalidation queue (Linux `struct q_inval`).
#[derive(Debug)]
pub(crate) struct Qi {
    entries: usize,
    queue: u64,
    status: u64,
    /// `q_lock` and what it protects.
    state: Mutex<QiState>,
}

#[derive(Debug)]
struct QiState {
    free_head: usize,
    free_tail: usize,
    free_cnt: usize,
}

impl Qi {
    pub(crate) fn new(entries: usize, queue: u64, status: u64) -> Self {
        Self {
            entries,
            queue,
            status,
            state: Mutex::new(QiState {
                free_head: 0,
                free_tail: 0,
                free_cnt: entries,
            }),
        }
    }
}

impl Dmar {
    fn status_pa(&self, slot: usize) -> PhysAddr {
        PhysAddr::new(self.qi().status + slot as u64 * 4)
    }

    fn read_status(&self, slot: usize) -> u32 {
        let mut b = [0u8; 4];
        let ok = self.memory().read(self.status_pa(slot), &mut b);
        debug_assert!(ok.is_ok());
        u32::from_le_bytes(b)
    }

    fn set_status(&self, slot: usize, value: u32) {
        let ok = self
            .memory()
            .write(self.status_pa(slot), &value.to_le_bytes());
        debug_assert!(ok.is_ok());
    }

    fn write_desc(&self, slot: usize, words: [u64; 2]) {
        let mut bytes = [0u8; 16];
        bytes[..8].copy_from_slice(&words[0].to_le_bytes());
        bytes[8..].copy_from_slice(&words[1].to_le_bytes());
        let pa = PhysAddr::new(self.qi().queue + slot as u64 * 16);
        let ok = self.memory().write(pa, &bytes);
        debug_assert!(ok.is_ok());
    }

    /// Submits `descs` followed by a wait and waits for it, as Linux's `qi_submit_sync`
    /// (see the module docs for the steps and the counts).
    pub fn qi_submit_sync(&self, descs: &[InvDesc], work: &mut WorkRecord) -> Result<(), QiError> {
        let encoded = descs
            .iter()
            .enumerate()
            .map(|(index, d)| {
                d.encode()
                    .map_err(|source| QiError::Encode { index, source })
            })
            .collect::<Result<Vec<_>, _>>()?;
        self.qi_submit_raw(&encoded, work)
    }

    /// [`Dmar::qi_submit_sync`] with descriptors as raw words (not checked: a malformed one
    /// makes the hardware raise IQE).
    pub fn qi_submit_raw(&self, descs: &[[u64; 2]], work: &mut WorkRecord) -> Result<(), QiError> {
        let qi = self.qi();
        let (n, count) = (qi.entries, descs.len());
        if count + 2 > n {
            return Err(QiError::TooMany { count, entries: n });
        }
        work.lock(LockId::CmdqLock);
        let mut st = qi.state.lock();
        while st.free_cnt < count + 2 {
            drop(st);
            work.polls += 1;
            self.process_queue();
            st = qi.state.lock();
            work.lock(LockId::CmdqLock);
        }
        let index = st.free_head;
        let wait_index = (index + count) % n;
        for (i, d) in descs.iter().enumerate() {
            let slot = (index + i) % n;
            self.write_desc(slot, *d);
            self.set_status(slot, qi_status::IN_USE);
        }
        let wait = InvDesc::Wait {
            interrupt: false,
            status_write: true,
            fence: false,
            page_drain: false,
            status_data: qi_status::DONE,
            status_addr: self.status_pa(wait_index).get(),
        };
        let wait_words = match wait.encode() {
            Ok(w) => w,
            Err(source) => {
                return Err(QiError::Encode {
                    index: count,
                    source,
                })
            }
        };
        self.write_desc(wait_index, wait_words);
        self.set_status(wait_index, qi_status::IN_USE);
        work.commands_written += count as u64 + 1;
        st.free_head = (index + count + 1) % n;
        st.free_cnt -= count + 1;
        self.write_iqt(st.free_head as u64 * 16, work);

        let mut rc = Ok(());
        while self.read_status(wait_index) != qi_status::DONE {
            work.polls += 1;
            if self.read_fsts(work) & fsts::IQE != 0 {
                work.mmio_reads += 1;
                let head = (self.iqh() / 16) as usize;
                let offset = (head + n - index) % n;
                if offset <= count {
                    // Linux `qi_check_fault`: replace the bad descriptor by the wait, clear IQE.
                    self.write_desc(head, wait_words);
                    self.write_fsts(fsts::IQE, work);
                    rc = Err(QiError::InvalidDescriptor { index: offset });
                    break;
                }
            }
            drop(st);
            self.process_queue();
            st = qi.state.lock();
            work.lock(LockId::CmdqLock);
        }
        for i in 0..=count {
            self.set_status((index + i) % n, qi_status::FREE);
        }
        while st.free_tail != st.free_head && self.read_status(st.free_tail) == qi_status::FREE {
            st.free_tail = (st.free_tail + 1) % n;
            st.free_cnt += 1;
        }
        drop(st);
        if rc.is_ok() {
            work.inval_syncs += 1;
        }
        rc
    }

    /// Free slots of the driver's ring (for tests: all but the gap when idle).
    pub fn qi_free_slots(&self) -> usize {
        self.qi().state.lock().free_cnt
    }
}

/// A pending span of one invalidator on one thread.
#[derive(Clone, Copy, Debug)]
struct Pending {
    id: u64,
    start: u64,
    /// One past the last byte.
    end: u64,
    /// Whether a table page under the span was freed (then IH must be 0).
    freed: bool,
    /// A whole-domain flush.
    all: bool,
}

thread_local! {
    /// Spans gathered on this thread and not yet synced, tagged by invalidator.
    static PENDING: RefCell<Vec<Pending>> = const { RefCell::new(Vec::new()) };
}

/// Source of invalidator identities.
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// The [`Invalidator`] of one second-stage domain on a [`Dmar`]: Linux's strict path. See
/// the module docs.
pub struct VtdInvalidator {
    id: u64,
    dmar: Arc<Dmar>,
    did: u16,
    /// First-stage domains: the PASID their PASID-based descriptors name.
    pasid: Option<u32>,
    /// Source ids attached with ATS: each flush also invalidates their device-TLBs.
    ats: Mutex<Vec<u16>>,
    honour_ih: AtomicBool,
    errors: AtomicU64,
}

impl std::fmt::Debug for VtdInvalidator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VtdInvalidator")
            .field("did", &self.did)
            .finish_non_exhaustive()
    }
}

impl VtdInvalidator {
    /// An invalidator for domain `did` on `dmar`.
    pub fn new(dmar: Arc<Dmar>, did: u16) -> Self {
        Self {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            dmar,
            did,
            pasid: None,
            ats: Mutex::new(Vec::new()),
            honour_ih: AtomicBool::new(false),
            errors: AtomicU64::new(0),
        }
    }

    /// The same for a first-stage domain in scalable mode: flushes are PASID-based IOTLB
    /// invalidations of `pasid` (type 6: page-selective with [`psi_mask`]'s mask, no MAMV
    /// limit, IH = 1 when the span freed no table; all of the PASID for a domain flush),
    /// as Linux's `qi_batch_add_piotlb` (X86.md §2.4). Caching Mode adds no flush after a
    /// map (first-stage updates need none).
    pub fn with_pasid(mut self, pasid: u32) -> Self {
        self.pasid = Some(pasid);
        self
    }

    /// Adds a source id attached with ATS: every flush then carries a device-TLB
    /// invalidation (type 3, PFSID = SID, QDEP 0) of the same range, encoded with the S bit
    /// ([`devtlb_addr`]), before the wait (Linux v6.12+ batching, X86.md §2.4).
    pub fn add_ats_device(&self, sid: u16) {
        let mut ats = self.ats.lock();
        if !ats.contains(&sid) {
            ats.push(sid);
        }
    }

    /// The IOTLB descriptor for `start..=end` (or the whole domain with `None`).
    fn iotlb_desc(&self, cap: Cap, span: Option<(u64, u64)>, ih: bool) -> InvDesc {
        match (self.pasid, span) {
            (Some(pasid), Some((start, end))) => {
                let (addr, am) = psi_mask(start, end);
                InvDesc::PasidIotlb {
                    did: self.did,
                    pasid,
                    granularity: PasidIotlbGranularity::Page {
                        addr,
                        am: am as u8,
                        ih,
                    },
                }
            }
            (Some(pasid), None) => flush_all_desc(self.did, pasid, true),
            (None, Some((start, end))) => iotlb_flush_desc(cap, self.did, start, end, ih),
            (None, None) => InvDesc::Iotlb {
                granularity: IotlbGranularity::Domain { did: self.did },
                drain_reads: cap.drd(),
                drain_writes: cap.dwd(),
            },
        }
    }

    /// The device-TLB descriptors for `start..=end` (or everything with `None`).
    fn devtlb_descs(&self, span: Option<(u64, u64)>, out: &mut Vec<InvDesc>) {
        let (addr, mask) = match span {
            Some((start, end)) => psi_mask(start, end),
            None => (0, MAX_AGAW_PFN_WIDTH),
        };
        let (addr, size) = devtlb_addr(addr, mask);
        for &sid in self.ats.lock().iter() {
            out.push(InvDesc::DeviceTlb {
                sid,
                pfsid: sid,
                qdep: 0,
                addr,
                size,
            });
        }
    }

    /// The domain id.
    pub fn did(&self) -> u16 {
        self.did
    }

    /// Sets IH = 1 on page-selective invalidations of spans that freed no table (the F&S
    /// patch); off by default, as Linux.
    pub fn set_honour_ih(&self, on: bool) {
        self.honour_ih.store(on, Ordering::Relaxed);
    }

    /// Submissions that failed (never expected: descriptors are built valid).
    pub fn errors(&self) -> u64 {
        self.errors.load(Ordering::Relaxed)
    }

    fn add(&self, start: u64, end: u64, freed: bool, all: bool) {
        PENDING.with(|p| {
            let mut p = p.borrow_mut();
            if !all {
                if let Some(last) = p
                    .iter_mut()
                    .rev()
                    .find(|s| s.id == self.id && !s.all)
                    .filter(|s| s.start <= end && start <= s.end)
                {
                    last.start = last.start.min(start);
                    last.end = last.end.max(end);
                    last.freed |= freed;
                    return;
                }
            }
            p.push(Pending {
                id: self.id,
                start,
                end,
                freed,
                all,
            });
        });
    }

    fn submit(&self, descs: &[InvDesc], work: &mut WorkRecord) -> Result<(), QiError> {
        // Linux holds the domain's cache_lock across the whole flush and wait.
        work.lock(LockId::Other);
        let r = self.dmar.qi_submit_sync(descs, work);
        if r.is_err() {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
        r
    }

    /// Linux's `iotlb_sync_map`: with Caching Mode, a PSI over the mapped range and a wait
    /// (the unit may have cached the not-present entries); nothing without it.
    pub fn sync_map(&self, iova: Iova, size: u64, work: &mut WorkRecord) -> Result<(), QiError> {
        let cap = self.dmar.config().cap;
        if !cap.cm() || size == 0 || self.pasid.is_some() {
            return Ok(());
        }
        work.inval_ranges += 1;
        work.inval_pages += size.div_ceil(4096);
        let end = iova.get() + (size - 1);
        self.submit(
            &[iotlb_flush_desc(cap, self.did, iova.get(), end, false)],
            work,
        )
    }
}

impl Invalidator for VtdInvalidator {
    fn invalidate_range(&self, _domain: DomainId, range: &GatherRange, work: &mut WorkRecord) {
        work.inval_ranges += 1;
        work.inval_pages += range.size / range.page_size.max(1);
        self.add(range.start.get(), range.end().get(), false, false);
    }

    fn invalidate_walk(&self, _domain: DomainId, table: &FreedTable, work: &mut WorkRecord) {
        work.inval_walks += 1;
        self.add(table.iova.get(), table.iova.get() + table.size, true, false);
    }

    fn invalidate_domain(&self, _domain: DomainId, work: &mut WorkRecord) {
        work.inval_domains += 1;
        self.add(0, 0, true, true);
    }

    fn sync(&self, work: &mut WorkRecord) {
        let mine: Vec<Pending> = PENDING.with(|p| {
            let mut p = p.borrow_mut();
            let mine = p.iter().filter(|s| s.id == self.id).copied().collect();
            p.retain(|s| s.id != self.id);
            mine
        });
        if mine.is_empty() {
            return;
        }
        let cap = self.dmar.config().cap;
        // Linux carries IH on PASID-based descriptors; second-stage ones lose it.
        let ih_ok = self.pasid.is_some() || self.honour_ih.load(Ordering::Relaxed);
        let mut descs = Vec::with_capacity(2 * mine.len());
        if mine.iter().any(|s| s.all) {
            descs.push(self.iotlb_desc(cap, None, false));
            self.devtlb_descs(None, &mut descs);
        } else {
            for s in &mine {
                let span = Some((s.start, s.end - 1));
                descs.push(self.iotlb_desc(cap, span, ih_ok && !s.freed));
                self.devtlb_descs(span, &mut descs);
            }
        }
        let r = self.submit(&descs, work);
        debug_assert!(r.is_ok(), "VT-d invalidation failed: {r:?}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The reference: the smallest naturally aligned block of 2^m pages holding both end
    /// pages (capped at Linux's 52).
    fn smallest_block(start: u64, end: u64) -> u32 {
        let (a, b) = (start >> 12, end >> 12);
        (0..MAX_AGAW_PFN_WIDTH)
            .find(|&m| a >> m == b >> m)
            .unwrap_or(MAX_AGAW_PFN_WIDTH)
    }

    proptest! {
        #[test]
        fn psi_mask_is_the_smallest_aligned_block(start in 0u64..1 << 48, len in 1u64..1 << 32) {
            let end = start + len - 1;
            let (addr, mask) = psi_mask(start, end);
            prop_assert_eq!(mask, smallest_block(start, end));
            let (lo, size) = spec_range(addr, mask);
            prop_assert_eq!(lo, addr);
            prop_assert!(lo <= start && end - lo < size);
        }
    }

    fn spec_range(addr: u64, mask: u32) -> (u64, u64) {
        super::super::spec::psi_range(addr, mask as u8)
    }

    #[test]
    fn the_whole_space_takes_mask_52() {
        assert_eq!(psi_mask(0x1000, u64::MAX), (0, 52));
        assert_eq!(smallest_block(0x1000, u64::MAX), 52);
    }
}
