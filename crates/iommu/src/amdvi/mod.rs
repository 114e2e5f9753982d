//! AMD-Vi: the AMD I/O Virtualization Technology IOMMU.
//!
//! - [`spec`]: bit-exact encodings (device table entry, v1 page-table entries, commands,
//!   event-log entries, the S-bit range encoding) with decode errors.
//! - [`pgtable`]: the v1 host page table ([`AmdV1Table`]), an
//!   [`IoPageTable`](crate::pgtable::IoPageTable).
//! - [`AmdVi`] ([`device`]): the IOMMU: device table and DTE cache, IOTLB and
//!   page-directory cache, the command buffer and its in-order consumer, the event log,
//!   and the driver's command queueing and completion wait.
//! - [`AmdViInvalidator`] ([`invalidator`]): Linux's strict unmap flush as an
//!   [`Invalidator`](crate::dma::Invalidator).

//!
//! Facts come from the shared research notes `X86.md` (§3 hardware, §4 the Linux
//! `amd_iommu` driver), which read them in Linux's `drivers/iommu/amd/` and VirtualBox's
//! `iommu-amd.h`; each item cites its source.
//!
//! # Work records
//!
//! A strict unmap through the DMA layer with an [`AmdViInvalidator`] adds to the caller's
//! [`WorkRecord`](crate::work::WorkRecord) what Linux's path does on one IOMMU without ATS
//! (`X86.md` §4.2):
//!
//! | counter | per strict unmap | why |
//! |---|---|---|
//! | `commands_written` | 2 | `INVALIDATE_IOMMU_PAGES` + `COMPLETION_WAIT` |
//! | `mmio_writes` | 2 | one Tail write per command |
//! | `inval_syncs` | 1 | one completion wait |
//! | `polls` | 1 | the semaphore is checked, a 1 us delay, checked again |
//! | `locks[CmdqLock]` | 2 | `iommu->lock` per queued command, held across the wait |
//! | `locks[PageTable]` | +1 | `dom->lock` across flush and wait (the DMA layer counts its own table lock too) |
//! | `mmio_reads` | 0 | Head is re-read only when the ring is nearly full |
//!
//! On the device side, [`AmdVi::translate`] counts `translations`, `iotlb_hits`,
//! `iotlb_misses`, `iotlb_stale_hits` and `walk_reads` (a DTE read on a DTE-cache miss and
//! each page-table entry read).
//!
//! ```
//! use std::sync::Arc;
//!
//! use iolab_iommu::addr::{Access, Iova, PhysAddr, SZ_4G, SZ_4K};
//! use iolab_iommu::amdvi::{AmdV1Config, AmdVi, AmdViConfig, Command, InvAddress};
//! use iolab_iommu::dma::{Device, Direction, DomainConfig, DomainId, DomainMode};
//! use iolab_iommu::iova::linux::{IovaSpaceConfig, LinuxIovaAllocator};
//! use iolab_iommu::mem::PhysMemory;
//! use iolab_iommu::work::WorkRecord;
//!
//! let memory = Arc::new(PhysMemory::new(1 << 30).unwrap());
//! let iommu = AmdVi::new(AmdViConfig::default(), memory).unwrap();
//! let allocator = LinuxIovaAllocator::new(IovaSpaceConfig::new(SZ_4K, Iova::new(SZ_4G))).unwrap();
//! let domain = iommu
//!     .new_domain(
//!         1,
//!         DomainConfig::new(DomainId(1), DomainMode::Strict),
//!         AmdV1Config::new(48),
//!         Arc::new(allocator),
//!     )
//!     .unwrap();
//! let device_id = 0x18; // 00:03.0
//! iommu.attach(device_id, &domain, &mut WorkRecord::new()).unwrap();
//!
//! let dev = Device::new(1, 64).unwrap();
//! let mut work = WorkRecord::new();
//! let m = domain
//!     .domain()
//!     .map_page(&dev, PhysAddr::new(0x10_0000), SZ_4K, Direction::ToDevice, 0, &mut work)
//!     .unwrap();
//! let iova = Iova::new(m.dma_addr().0);
//! let tr = iommu.translate(device_id, iova, Access::Read, &mut work).unwrap();
//! assert_eq!(tr.pa, PhysAddr::new(0x10_0000));
//!
//! let mut work = WorkRecord::new();
//! domain.domain().unmap_page(m, 0, 0, &mut work).unwrap();
//! assert_eq!((work.commands_written, work.mmio_writes, work.polls), (2, 2, 1));
//! assert!(iommu.translate(device_id, iova, Access::Read, &mut work).is_err());
//!
//! // Two pages across a 2 MiB boundary are flushed as the 4 MiB block holding them.
//! let cmd = Command::invalidate_pages(1, 0x1f_f000, 2 * SZ_4K);
//! let Command::InvalidateIommuPages { address, .. } = cmd else { unreachable!() };
//! assert_eq!(address, InvAddress { addr: 0x1f_f000, s: true });
//! ```

pub mod device;
pub mod invalidator;
pub mod pgtable;
pub mod spec;

pub use device::{
    AmdVi, AmdViConfig, AmdViDomain, AmdViError, AmdViFault, AmdViFaultReason, AmdViPageTable,
    AmdViTranslation, Caches, CommandStats,
};
pub use invalidator::AmdViInvalidator;
pub use pgtable::{AmdV1Config, AmdV1ConfigError, AmdV1Table};
pub use spec::{Command, DecodeError, Dte, EncodeError, Event, InvAddress, InvSpan};
