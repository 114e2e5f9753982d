//! rust-vmm interop (feature `vm-memory`): an iolab DMA domain as vm-memory's [`Iommu`].
//!
//! A vhost-user backend (or any VMM device model) that reads guest memory through
//! vm-memory's `IommuMemory` asks an [`Iommu`] to translate I/O virtual addresses. Here that
//! IOMMU is an iolab [`Domain`]: [`VmmIommu::translate`] first consults a vm-memory
//! [`Iotlb`] (the cache), and on a miss or a permission failure walks the domain's real page
//! table for the failing ranges (as a device access through [`Domain::translate`]) and fills
//! the IOTLB with what it found, then looks up again. A range the domain does not map, or
//! maps without the needed permission, is a translation error naming the fault.
//!
//! The IOTLB must forget what the domain unmaps. [`IotlbInvalidator`] is the domain's
//! [`Invalidator`]: it forwards every request to an inner invalidator (a hardware model, or
//! [`crate::dma::ImmediateInvalidator`]) and removes the invalidated ranges from the shared
//! IOTLB. So the IOTLB is exactly as stale as the domain's mode allows: in strict mode an
//! unmap removes the translation at once; in lazy mode it survives until the flush queue is
//! flushed, as on hardware.
//!
//! A fill races with an invalidation only if the invalidation lands between the page-table
//! walk and the insertion; an invalidation counter read before the walk and checked under
//! the IOTLB's write lock detects that, and the fill is redone.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::{RwLock, RwLockReadGuard};
use vm_memory::iommu::{Error as IommuError, IotlbIterator, IovaRange};
use vm_memory::{GuestAddress, Iommu, Iotlb, Permissions};

use crate::addr::{Access, DmaAddr};
use crate::dma::{Device, Domain, DomainId, Invalidator};
use crate::pgtable::{FreedTable, GatherRange};
use crate::work::WorkRecord;

/// How many times a translation refills the IOTLB before giving up (each round fills every
/// failing range, so one refill normally suffices; more only under concurrent invalidation).
const MAX_FILL_ROUNDS: usize = 8;

/// A vm-memory IOTLB shared by a [`VmmIommu`] (which fills it) and an [`IotlbInvalidator`]
/// (which empties it), with a counter of invalidations.
#[derive(Debug, Default, Clone)]
pub struct SharedIotlb {
    inner: Arc<IotlbState>,
}

#[derive(Debug, Default)]
struct IotlbState {
    iotlb: RwLock<Iotlb>,
    invalidations: AtomicU64,
}

impl SharedIotlb {
    /// An empty IOTLB.
    pub fn new() -> Self {
        Self::default()
    }

    /// How many invalidations (ranges or whole-domain) have reached this IOTLB.
    pub fn invalidations(&self) -> u64 {
        self.inner.invalidations.load(Ordering::Acquire)
    }

    /// Whether `iova..iova+len` is fully cached for `access` (without filling anything).
    pub fn caches(&self, iova: u64, len: usize, access: Permissions) -> bool {
        Iotlb::lookup(self.inner.iotlb.read(), GuestAddress(iova), len, access).is_ok()
    }

    fn invalidate_range(&self, iova: u64, len: u64) {
        let mut t = self.inner.iotlb.write();
        // vm-memory takes a usize length; split a range larger than that (32-bit hosts).
        let mut start = iova;
        let mut left = len;
        while left > 0 {
            let n = left.min(usize::MAX as u64);
            t.invalidate_mapping(GuestAddress(start), n as usize);
            start = start.wrapping_add(n);
            left -= n;
        }
        self.inner.invalidations.fetch_add(1, Ordering::AcqRel);
    }

    fn invalidate_all(&self) {
        let mut t = self.inner.iotlb.write();
        t.invalidate_all();
        self.inner.invalidations.fetch_add(1, Ordering::AcqRel);
    }
}

/// A domain's [`Invalidator`] that also removes invalidated translations from a
/// [`SharedIotlb`]; see the module docs.
pub struct IotlbInvalidator {
    domain: DomainId,
    iotlb: SharedIotlb,
    inner: Arc<dyn Invalidator>,
}

impl IotlbInvalidator {
    /// Invalidates `iotlb` for requests about `domain`, forwarding every request to `inner`.
    pub fn new(domain: DomainId, iotlb: SharedIotlb, inner: Arc<dyn Invalidator>) -> Self {
        Self {
            domain,
            iotlb,
            inner,
        }
    }
}

impl Invalidator for IotlbInvalidator {
    fn invalidate_range(&self, domain: DomainId, range: &GatherRange, work: &mut WorkRecord) {
        if domain == self.domain {
            self.iotlb.invalidate_range(range.start.get(), range.size);
        }
        self.inner.invalidate_range(domain, range, work);
    }

    fn invalidate_walk(&self, domain: DomainId, table: &FreedTable, work: &mut WorkRecord) {
        // vm-memory's IOTLB caches leaf translations only; there is no walk cache to clear.
        self.inner.invalidate_walk(domain, table, work);
    }

    fn invalidate_domain(&self, domain: DomainId, work: &mut WorkRecord) {
        if domain == self.domain {
            self.iotlb.invalidate_all();
        }
        self.inner.invalidate_domain(domain, work);
    }

    fn sync(&self, work: &mut WorkRecord) {
        self.inner.sync(work);
    }
}

/// An iolab domain seen through vm-memory's [`Iommu`] trait, for one device.
pub struct VmmIommu {
    domain: Arc<Domain>,
    device: Device,
    iotlb: SharedIotlb,
    fills: AtomicU64,
}

impl std::fmt::Debug for VmmIommu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VmmIommu")
            .field("domain", &self.domain)
            .field("device", &self.device.id())
            .field("fills", &self.fills())
            .finish()
    }
}

impl VmmIommu {
    /// Translates `device`'s accesses through `domain`, caching in `iotlb`. The domain must
    /// have been built with an [`IotlbInvalidator`] on the same `iotlb`, or unmaps would
    /// leave stale translations in it for good.
    pub fn new(domain: Arc<Domain>, device: Device, iotlb: SharedIotlb) -> Self {
        Self {
            domain,
            device,
            iotlb,
            fills: AtomicU64::new(0),
        }
    }

    /// The domain translated through.
    pub fn domain(&self) -> &Arc<Domain> {
        &self.domain
    }

    /// The IOTLB.
    pub fn iotlb(&self) -> &SharedIotlb {
        &self.iotlb
    }

    /// How many IOTLB fills (page-table walks of a missing or failing range) were made.
    pub fn fills(&self) -> u64 {
        self.fills.load(Ordering::Relaxed)
    }

    /// Walks the domain for `range` with `access` and returns the physical pieces.
    fn walk(
        &self,
        range: &IovaRange,
        access: Access,
    ) -> Result<Vec<crate::dma::PhysRange>, IommuError> {
        let mut work = WorkRecord::new();
        self.domain
            .translate(
                &self.device,
                DmaAddr(range.base.0),
                range.length as u64,
                access,
                &mut work,
            )
            .map_err(|fault| IommuError::CannotResolve {
                iova_range: IovaRange {
                    base: range.base,
                    length: range.length,
                },
                reason: format!("{fault}: {}", fault.reason),
            })
    }

    /// Fills the IOTLB for `range`: walks for the access needed (both directions for
    /// read-write), records the widest permission the mapping grants.
    fn fill(&self, range: &IovaRange, access: Permissions) -> Result<(), IommuError> {
        let before = self.iotlb.invalidations();
        let (pieces, perm) = match access {
            Permissions::Write => {
                let w = self.walk(range, Access::Write)?;
                let r_ok = self.walk(range, Access::Read).is_ok_and(|r| r == w);
                (
                    w,
                    if r_ok {
                        Permissions::ReadWrite
                    } else {
                        Permissions::Write
                    },
                )
            }
            Permissions::ReadWrite => {
                let r = self.walk(range, Access::Read)?;
                let w = self.walk(range, Access::Write)?;
                if r != w {
                    return Err(IommuError::IommuMisconfigured {
                        reason: "read and write walks disagree".to_owned(),
                    });
                }
                (r, Permissions::ReadWrite)
            }
            // Read (and No, which any mapping allows).
            _ => {
                let r = self.walk(range, Access::Read)?;
                let w_ok = self.walk(range, Access::Write).is_ok_and(|w| w == r);
                (
                    r,
                    if w_ok {
                        Permissions::ReadWrite
                    } else {
                        Permissions::Read
                    },
                )
            }
        };
        let mut t = self.iotlb.inner.iotlb.write();
        if self.iotlb.invalidations() != before {
            // An invalidation landed after the walk: what we found may be stale. The caller
            // retries the lookup, which walks again.
            return Ok(());
        }
        let mut iova = range.base.0;
        for p in pieces {
            t.set_mapping(
                GuestAddress(iova),
                GuestAddress(p.pa.get()),
                p.len as usize,
                perm,
            )?;
            iova = iova.wrapping_add(p.len);
        }
        self.fills.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

impl Iommu for VmmIommu {
    type IotlbGuard<'a> = RwLockReadGuard<'a, Iotlb>;

    fn translate(
        &self,
        iova: GuestAddress,
        length: usize,
        access: Permissions,
    ) -> Result<IotlbIterator<Self::IotlbGuard<'_>>, IommuError> {
        for _ in 0..MAX_FILL_ROUNDS {
            let fails = match Iotlb::lookup(self.iotlb.inner.iotlb.read(), iova, length, access) {
                Ok(hit) => return Ok(hit),
                Err(fails) => fails,
            };
            for range in fails.misses.iter().chain(&fails.access_fails) {
                self.fill(range, access)?;
            }
        }
        Err(IommuError::CannotResolve {
            iova_range: IovaRange { base: iova, length },
            reason: format!("the IOTLB was invalidated during each of {MAX_FILL_ROUNDS} fills"),
        })
    }
}
