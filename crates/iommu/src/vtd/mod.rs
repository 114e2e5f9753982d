//! Intel VT-d (Virtualization Technology for Directed I/O): one DMA-remapping unit and the
//! Linux intel-iommu driver's invalidation path. Facts come from /work/shared/X86.md §1–2
//! (Linux `drivers/iommu/intel/`, VirtualBox `iommu-intel.h`); each item cites its section.
//!
//! - [`spec`]: bit-exact encodings with encode/decode: legacy and scalable-mode root and
//!   context entries, PASID directory and table entries, second- and first-stage PTEs,
//!   CAP/ECAP decoders, fault records, and the 128-bit invalidation descriptors
//!   (context-cache, IOTLB, PASID-IOTLB, device-TLB, wait) with decode errors.
//! - [`pgtable`]: [`VtdPageTable`], second-stage (and first-stage, x86-64) tables of 3, 4 or
//!   5 levels with 2 MiB / 1 GiB superpages, written entry by entry into simulated memory.
//! - [`Dmar`] ([`device`]): the unit. Root and context tables in memory, a context cache,
//!   the IOTLB and paging-structure caches of [`crate::iotlb`] tagged by domain id, fault
//!   recording registers with overflow, the invalidation queue as a ring consumed in order
//!   (IQH/IQT/IQA, IQE with IQERCD), and Caching Mode (not-present entries cached, so the
//!   driver must invalidate after a map).
//! - [`scalable`]: scalable mode (RTADDR.TTM = 1, [`VtdTranslation`]): scalable root and
//!   context entries, the PASID directory and table behind a PASID cache, first-stage
//!   (4/5-level x86-64), second-stage, nested and pass-through walks with the scalable-mode
//!   fault reasons, requests with and without PASID ([`VtdRequest`]), the IOTLB tagged by
//!   (DID, PASID, stage), PASID-cache and PASID-based invalidation.
//! - [`devtlb`]: the device-TLB (ATS ATC) of a device attached with
//!   [`Dmar::attach_ats`], which only device-TLB invalidations (types 3 and 8) empty.
//! - [`VtdInvalidator`] ([`invalidator`]): Linux's `qi_submit_sync` and strict unmap path
//!   (page-selective invalidation with the smallest aligned mask, domain-selective beyond
//!   CAP.MAMV, one wait; PASID-based descriptors for first-stage domains; a device-TLB
//!   invalidation per ATS device), as the [`Invalidator`](crate::dma::Invalidator) of a
//!   [`DmarDomain`].
//!
//! Modelled: legacy- and scalable-mode translation, second- and first-stage walks, queued
//! invalidation, device-TLBs. Not modelled: register-based invalidation, interrupt
//! remapping, page requests, 256-bit descriptors (the queue stays 128-bit in scalable mode),
//! A/D-bit updates. docs/model/vtd.md summarises the model.
//!
//! # Work records
//!
//! | operation | counters |
//! |---|---|
//! | [`Dmar::translate`] | `translations`, `iotlb_hits` / `iotlb_misses` / `iotlb_stale_hits`, `walk_reads` (context-cache misses read 2 entries, then one per table level not cached) |
//! | [`Dmar::translate_request`] (scalable) | as above, plus 2 `walk_reads` per PASID-cache miss (directory and PASID-table entries); nested walks add a second-stage walk per first-stage pointer |
//! | [`Dmar::qi_submit_sync`] | `commands_written` (descriptors + wait), `mmio_writes` (one IQT write), `polls` and `mmio_reads` (FSTS) per look at an unfinished wait, `locks[CmdqLock]` (the unit's `q_lock`, taken once and again after each poll), `inval_syncs` |
//! | [`VtdInvalidator`] sync | the above plus `locks[Other]` (the domain's `cache_lock`) |
//! | [`VtdPageTable`] | `pte_reads`, `ptes_written`, `ptes_cleared`, `tables_allocated`, `tables_freed` |
//!
//! # Example
//!
//! ```
//! use std::sync::Arc;
//! use iolab_iommu::addr::{Access, Iova, PhysAddr, SZ_4G, SZ_4K};
//! use iolab_iommu::dma::{Device, Direction, DomainConfig, DomainId, DomainMode};
//! use iolab_iommu::iova::linux::{IovaSpaceConfig, LinuxIovaAllocator};
//! use iolab_iommu::mem::{PhysAllocator, PhysMemory};
//! use iolab_iommu::vtd::{Dmar, DmarConfig};
//! use iolab_iommu::work::WorkRecord;
//!
//! let mem = Arc::new(PhysMemory::new(64 << 20).unwrap());
//! let pages = PhysAllocator::new(mem, PhysAddr::new(32 << 20), PhysAddr::new(64 << 20)).unwrap();
//! // A Cascade-Lake-class unit: 4-level second-stage tables, PSI with MAMV 18, CM = 0.
//! let dmar = Dmar::new(DmarConfig::cascade_lake(), Arc::new(pages)).unwrap();
//! let iovas = Arc::new(LinuxIovaAllocator::new(IovaSpaceConfig::new(SZ_4K, Iova::new(SZ_4G))).unwrap());
//! let dom = dmar
//!     .new_domain(2, DomainConfig::new(DomainId(1), DomainMode::Strict), iovas)
//!     .unwrap();
//! let sid = 0x0300; // bus 3, device 0, function 0
//! dmar.attach(sid, &dom, &mut WorkRecord::new()).unwrap();
//!
//! let dev = Device::new(1, 64).unwrap();
//! let m = dom
//!     .domain()
//!     .map_page(&dev, PhysAddr::new(0x10_0000), SZ_4K, Direction::ToDevice, 0, &mut WorkRecord::new())
//!     .unwrap();
//! let iova = Iova::new(m.dma_addr().0);
//! let mut work = WorkRecord::new();
//! let t = dmar.translate(sid, iova, Access::Read, &mut work).unwrap();
//! assert_eq!(t.pa, PhysAddr::new(0x10_0000));
//! assert_eq!(work.walk_reads, 2 + 4); // root + context, then four levels
//!
//! // A strict unmap: one page-selective IOTLB invalidation and one wait, one tail write.
//! let mut work = WorkRecord::new();
//! dom.domain().unmap_page(m, 0, 0, &mut work).unwrap();
//! assert_eq!((work.commands_written, work.mmio_writes, work.inval_syncs), (2, 1, 1));
//! assert!(dmar.iotlb_probe(2, iova).is_none());
//! assert!(dmar.translate(sid, iova, Access::Read, &mut work).is_err());
//! ```

pub mod device;
pub mod devtlb;
pub mod invalidator;
pub mod pgtable;
pub mod scalable;
pub mod spec;

pub use device::{
    qi_status, Dmar, DmarConfig, DmarDomain, DmarError, DmarFault, DmarStats, DmarTranslation,
    NonLeafPsiScope,
};
pub use devtlb::{AtcEntry, AtcSelect, DevTlb};
pub use invalidator::{iotlb_flush_desc, psi_mask, QiError, VtdInvalidator};
pub use pgtable::{VtdPageTable, VtdStage, VtdTableConfig, VtdTableError};
pub use scalable::{VtdRequest, VtdTranslation};
