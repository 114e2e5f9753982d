//! Invalidation through the AMD-Vi command buffer: the [`Invalidator`] of domains attached
//! to an [`AmdVi`], as Linux's strict unmap path builds it (`X86.md` §4.1-4.2,
//! `amd_iommu_iotlb_gather_add_page`, `amd_iommu_iotlb_sync`,
//! `amd_iommu_domain_flush_pages`, `domain_flush_complete`).
//!
//! - Gathered leaf ranges (and the spans of freed tables, which the v1 table never
//!   reports) extend one pending range per thread, **even when disjoint**, as Linux does on
//!   bare metal (one over-flush rather than several commands; Nadav Amit's "AMD's IOMMU can
//!   flush efficiently any range").
//! - [`Invalidator::sync`] takes the domain's lock (`dom->lock`), queues one
//!   `INVALIDATE_IOMMU_PAGES` for the pending range, with the S-bit encoding of the
//!   smallest naturally aligned power-of-two block covering it and PDE set (Linux always
//!   sets it: "we want to flush everything, not only the PTEs"), then one
//!   `COMPLETION_WAIT`, polled in 1 us steps with the IOMMU's command lock held, and
//!   releases the domain's lock.
//! - A whole-domain invalidation (the lazy flush) is the same sequence with the all-pages
//!   address (`amd_iommu_domain_flush_all`).
//!
//! Per strict unmap on one IOMMU without ATS: **2 commands, 2 Tail writes, 1 completion
//! wait** with one poll; locks: the domain's lock once and the command lock twice (once per
//! queued command). The domain's lock is counted as [`LockId::PageTable`] (the
//! `WorkRecord` has no separate per-domain flush lock; `dom->lock` is the protection
//! domain's lock, which Linux also takes to grow the page table) and the command lock as
//! [`LockId::CmdqLock`].

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use super::device::{AmdVi, AmdViError};
use super::spec::{Command, InvAddress};
use crate::dma::{DomainId, Invalidator};
use crate::pgtable::{FreedTable, GatherRange};
use crate::work::{LockId, WorkRecord};

/// A pending flush: `[start, end)` or everything.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Pending {
    Range { start: u64, end: u64 },
    All,
}

thread_local! {
    /// Flushes gathered on this thread and not yet synced, by invalidator.
    static PENDING: RefCell<Vec<(u64, Pending)>> = const { RefCell::new(Vec::new()) };
}

/// Source of invalidator identities (to tell their pending flushes apart).
static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// The [`Invalidator`] of one AMD-Vi domain. See the module docs.
pub struct AmdViInvalidator {
    id: u64,
    iommu: AmdVi,
    domain_id: u16,
    /// Linux `protection_domain::lock`, held across the flush and the wait.
    dom_lock: Mutex<()>,
    errors: AtomicU64,
}

impl std::fmt::Debug for AmdViInvalidator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AmdViInvalidator")
            .field("domain_id", &self.domain_id)
            .finish_non_exhaustive()
    }
}

impl AmdViInvalidator {
    pub(crate) fn new(iommu: AmdVi, domain_id: u16) -> Self {
        AmdViInvalidator {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            iommu,
            domain_id,
            dom_lock: Mutex::new(()),
            errors: AtomicU64::new(0),
        }
    }

    /// The DomainID it invalidates.
    pub fn domain_id(&self) -> u16 {
        self.domain_id
    }

    /// Flushes that failed (a stopped command buffer: the completion wait timed out).
    pub fn errors(&self) -> u64 {
        self.errors.load(Ordering::Relaxed)
    }

    /// Linux `amd_iommu_domain_flush_pages` + `domain_flush_complete` under the domain's
    /// lock: one `INVALIDATE_IOMMU_PAGES` for `address`, then a completion wait.
    ///
    /// # Errors
    ///
    /// The queueing and completion-wait errors of [`AmdVi`].
    pub fn flush(&self, address: InvAddress, work: &mut WorkRecord) -> Result<(), AmdViError> {
        work.lock(LockId::PageTable);
        let _dom = self.dom_lock.lock();
        let cmd = Command::InvalidateIommuPages {
            pasid: 0,
            domain_id: self.domain_id,
            pde: true,
            gn: false,
            address,
        };
        self.iommu.queue_command(&cmd, work)?;
        self.iommu.completion_wait(work)
    }

    /// Merges `p` into this thread's pending flush.
    fn add(&self, p: Pending) {
        PENDING.with(|cell| {
            let mut v = cell.borrow_mut();
            match v.iter_mut().find(|(id, _)| *id == self.id) {
                Some((_, cur)) => {
                    *cur = match (*cur, p) {
                        (Pending::Range { start: a, end: b }, Pending::Range { start, end }) => {
                            Pending::Range {
                                start: a.min(start),
                                end: b.max(end),
                            }
                        }
                        _ => Pending::All,
                    }
                }
                None => v.push((self.id, p)),
            }
        });
    }

    fn take(&self) -> Option<Pending> {
        PENDING.with(|cell| {
            let mut v = cell.borrow_mut();
            let i = v.iter().position(|(id, _)| *id == self.id)?;
            Some(v.swap_remove(i).1)
        })
    }

    fn add_range(&self, start: u64, size: u64) {
        match start.checked_add(size) {
            Some(end) => self.add(Pending::Range { start, end }),
            None => self.add(Pending::All),
        }
    }
}

impl Invalidator for AmdViInvalidator {
    fn invalidate_range(&self, _domain: DomainId, range: &GatherRange, work: &mut WorkRecord) {
        work.inval_ranges += 1;
        work.inval_pages += range.size / range.page_size.max(1);
        self.add_range(range.start.get(), range.size);
    }

    fn invalidate_walk(&self, _domain: DomainId, table: &FreedTable, work: &mut WorkRecord) {
        work.inval_walks += 1;
        self.add_range(table.iova.get(), table.size);
    }

    fn invalidate_domain(&self, _domain: DomainId, work: &mut WorkRecord) {
        work.inval_domains += 1;
        self.add(Pending::All);
    }

    fn sync(&self, work: &mut WorkRecord) {
        let address = match self.take() {
            None => return,
            Some(Pending::All) => InvAddress::ALL,
            Some(Pending::Range { start, end }) => InvAddress::for_range(start, end - start),
        };
        if self.flush(address, work).is_err() {
            self.errors.fetch_add(1, Ordering::Relaxed);
        }
    }
}
