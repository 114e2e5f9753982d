//! The DMA API as drivers see it, and the device side.
//!
//! A [`Domain`] is one IOMMU translation context (an address space devices are attached to)
//! in one of four [`DomainMode`]s:
//!
//! - [`DomainMode::NoIommu`]: no translation; the DMA address is the physical address, and
//!   the device's DMA mask must reach the buffer (Linux dma-direct).
//! - [`DomainMode::Identity`]: translation enabled with an identity (passthrough) map:
//!   addresses behave as with no IOMMU, but the IOMMU sees every access (counted as a
//!   translation that walks nothing).
//! - [`DomainMode::Strict`]: translated; unmap invalidates the IOTLB and waits before the
//!   IOVA is reused.
//! - [`DomainMode::Lazy`]: translated; unmap queues the IOVA on a per-CPU flush queue
//!   ([`flush_queue`]), and a whole-domain invalidation frees a batch at once (Linux
//!   "DMA-FQ").
//!
//! Drivers map with [`Domain::map_page`], [`Domain::map_sg`] and [`Domain::alloc_coherent`]
//! and get a `#[must_use]` handle back; they unmap by handing the handle back (a failed
//! unmap returns it inside [`Rejected`]) or by address with [`Domain::unmap_raw`], which
//! detects double and unknown unmaps through the domain's record of live mappings. Devices
//! access memory through [`Domain::translate`], [`Domain::dma_read`] and
//! [`Domain::dma_write`].
//!
//! Policy stays with the caller: a translated domain is assembled from a page table, an
//! IOVA allocator and an [`Invalidator`] the caller chose ([`Domain::translated`]).
//! Errors are values ([`DmaError`], [`DmaFault`]); a failed call leaves the domain, its page
//! table and its allocator as they were.

pub mod device;
pub mod domain;
pub mod flush_queue;
pub mod invalidate;
pub mod protection;
pub mod sg;

#[cfg(test)]
pub(crate) mod testutil;

use std::fmt;

use crate::addr::{Prot, SZ_64K};
use crate::iova::IovaError;
use crate::mem::MemError;
use crate::pgtable::PgTableError;

pub use device::{DmaFault, FaultReason, PhysRange};
pub use domain::{CoherentBuffer, DmaMapping, DmaSgMapping, Domain, DomainConfig, WindowClose};
pub use flush_queue::{
    FlushQueue, FlushQueueConfig, FlushQueueShape, FlushQueueVariant, TimerFreeCpu,
};
pub use invalidate::{ImmediateInvalidator, InvalStats, Invalidator};
pub use protection::{ProtectionCounters, ProtectionStats};
pub use sg::{DmaSegment, SgEntry};

/// Identifies a domain (an ASID / context); invalidations are tagged with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct DomainId(pub u32);

impl fmt::Display for DomainId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// How a domain turns DMA addresses into physical addresses. See the module docs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DomainMode {
    /// No IOMMU: the DMA address is the physical address.
    NoIommu,
    /// Passthrough: identity-mapped, the IOMMU bypasses translation.
    Identity,
    /// Translated, invalidating on every unmap.
    Strict,
    /// Translated, invalidating in batches through per-CPU flush queues.
    Lazy,
}

impl DomainMode {
    /// Whether DMA addresses are IOVAs translated through a page table.
    pub const fn is_translated(self) -> bool {
        matches!(self, DomainMode::Strict | DomainMode::Lazy)
    }
}

/// The direction of a DMA transfer, from the CPU's side (Linux `dma_data_direction`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Direction {
    /// The device reads the buffer (a transmit, a disk write).
    ToDevice,
    /// The device writes the buffer (a receive, a disk read).
    FromDevice,
    /// The device may do both.
    Bidirectional,
}

impl Direction {
    /// The page-table permissions a mapping in this direction gets.
    pub const fn prot(self) -> Prot {
        match self {
            Direction::ToDevice => Prot::READ,
            Direction::FromDevice => Prot::WRITE,
            Direction::Bidirectional => Prot::READ_WRITE,
        }
    }
}

/// Which call made a mapping (and so which call must undo it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MappingKind {
    /// [`Domain::map_page`].
    Single,
    /// [`Domain::map_sg`].
    Sg,
    /// [`Domain::alloc_coherent`].
    Coherent,
}

impl fmt::Display for MappingKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MappingKind::Single => "single",
            MappingKind::Sg => "scatter-gather",
            MappingKind::Coherent => "coherent",
        })
    }
}

/// A DMA-capable device as the DMA API sees it: its DMA mask and segment limits.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Device {
    id: u32,
    mask_bits: u32,
    max_segment_size: u64,
    segment_boundary_mask: u64,
    pci: bool,
}

impl Device {
    /// Default maximum DMA segment size (Linux's 64 KiB).
    pub const DEFAULT_MAX_SEGMENT_SIZE: u64 = SZ_64K;

    /// A device with a DMA mask of `mask_bits` bits (12 to 64), the default maximum
    /// segment size and no segment boundary.
    pub fn new(id: u32, mask_bits: u32) -> Result<Self, DmaError> {
        if !(12..=64).contains(&mask_bits) {
            return Err(DmaError::BadDevice {
                device: id,
                field: "dma_mask_bits",
                value: u64::from(mask_bits),
            });
        }
        Ok(Self {
            id,
            mask_bits,
            max_segment_size: Self::DEFAULT_MAX_SEGMENT_SIZE,
            segment_boundary_mask: u64::MAX,
            pci: false,
        })
    }

    /// The same device on (`true`) or off a PCI bus. dma-iommu gives PCI devices whose mask
    /// is wider than 32 bits a 32-bit IOVA first where the domain asks for it
    /// ([`DomainConfig::pci_32bit_first`](crate::dma::DomainConfig::pci_32bit_first)).
    /// Devices are not PCI by default.
    pub fn with_pci(mut self, pci: bool) -> Self {
        self.pci = pci;
        self
    }

    /// Whether the device is on a PCI bus.
    pub fn is_pci(&self) -> bool {
        self.pci
    }

    /// The same device with a maximum DMA segment size of `bytes` (at least 1).
    pub fn with_max_segment_size(mut self, bytes: u64) -> Result<Self, DmaError> {
        if bytes == 0 {
            return Err(DmaError::BadDevice {
                device: self.id,
                field: "max_segment_size",
                value: 0,
            });
        }
        self.max_segment_size = bytes;
        Ok(self)
    }

    /// The same device with a segment boundary mask: segments may not cross a multiple of
    /// `mask + 1`. The mask must be one less than a power of two, at least 4 KiB - 1;
    /// `u64::MAX` means no boundary.
    pub fn with_segment_boundary_mask(mut self, mask: u64) -> Result<Self, DmaError> {
        let ok = mask == u64::MAX || ((mask + 1).is_power_of_two() && mask >= 0xfff);
        if !ok {
            return Err(DmaError::BadDevice {
                device: self.id,
                field: "segment_boundary_mask",
                value: mask,
            });
        }
        self.segment_boundary_mask = mask;
        Ok(self)
    }

    /// The device's id.
    pub fn id(&self) -> u32 {
        self.id
    }

    /// Width of the device's DMA addresses in bits.
    pub fn mask_bits(&self) -> u32 {
        self.mask_bits
    }

    /// The highest address the device can put on the bus.
    pub fn dma_mask(&self) -> u64 {
        u64::MAX >> (64 - self.mask_bits)
    }

    /// Maximum length of one DMA segment.
    pub fn max_segment_size(&self) -> u64 {
        self.max_segment_size
    }

    /// Segment boundary mask (`u64::MAX`: none).
    pub fn segment_boundary_mask(&self) -> u64 {
        self.segment_boundary_mask
    }

    /// Whether the device can reach every byte of `addr..addr+len` (`len` at least 1).
    pub fn reaches(&self, addr: u64, len: u64) -> bool {
        addr.checked_add(len - 1)
            .is_some_and(|last| last <= self.dma_mask())
    }
}

/// Why a DMA API call failed. A failed call leaves the domain unchanged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DmaError {
    /// A buffer of length zero, or one that wraps the address space.
    #[error("Buffer {pa:#x}+{len:#x} is empty or wraps the address space")]
    BadBuffer {
        /// Physical address of the buffer.
        pa: u64,
        /// Its length.
        len: u64,
    },
    /// A scatter-gather list with no entries.
    #[error("Scatter-gather list is empty")]
    EmptySgList,
    /// A scatter-gather entry of length zero, or one that wraps the address space.
    #[error("Scatter-gather entry {index} ({pa:#x}+{len:#x}) is empty or wraps the address space")]
    BadSgEntry {
        /// Position of the entry in the list.
        index: usize,
        /// Its physical address.
        pa: u64,
        /// Its length.
        len: u64,
    },
    /// A scatter-gather list whose IOVA layout does not fit in 64 bits.
    #[error("Scatter-gather list needs more IOVA space than 64 bits can address")]
    SgTooLarge,
    /// The device's segment boundary is smaller than the IOMMU granule.
    #[error("Segment boundary mask {mask:#x} is smaller than the {granule:#x}-byte granule")]
    SegmentBoundaryTooSmall {
        /// The device's boundary mask.
        mask: u64,
        /// The domain's granule.
        granule: u64,
    },
    /// An invalid device description.
    #[error("Device {device}: invalid {field} {value:#x}")]
    BadDevice {
        /// The device's id.
        device: u32,
        /// The field that is invalid.
        field: &'static str,
        /// The value given.
        value: u64,
    },
    /// The device's DMA mask cannot reach the address it would need: the buffer (without
    /// translation) or the domain's first IOVA (with translation).
    #[error("Device {device} with a {mask_bits}-bit DMA mask cannot reach {addr:#x}")]
    MaskTooSmall {
        /// The device's id.
        device: u32,
        /// Its mask width.
        mask_bits: u32,
        /// The lowest address it would have to reach.
        addr: u64,
    },
    /// No IOVA space for the mapping.
    #[error("No IOVA space for {pages} pages below {limit:#x}")]
    IovaSpace {
        /// Pages needed.
        pages: u64,
        /// The exclusive limit from the device's mask and the domain's aperture.
        limit: u64,
        /// What the allocator said.
        #[source]
        source: IovaError,
    },
    /// The page table refused the mapping.
    #[error("Page table refused to map {iova:#x}+{len:#x}")]
    PageTable {
        /// IOVA of the failed map.
        iova: u64,
        /// Length of the failed map.
        len: u64,
        /// What the table said.
        #[source]
        source: PgTableError,
    },
    /// Physical memory for a coherent buffer could not be had.
    #[error("Cannot allocate {bytes:#x} bytes of coherent memory")]
    Memory {
        /// Bytes asked for.
        bytes: u64,
        /// What the physical allocator said.
        #[source]
        source: MemError,
    },
    /// Nothing is mapped at this DMA address (never mapped, already unmapped, or a stale
    /// handle).
    #[error("Nothing is mapped at DMA address {dma:#x} in domain {domain}")]
    NotMapped {
        /// The domain.
        domain: DomainId,
        /// The address given.
        dma: u64,
    },
    /// An unmap by address with a length other than the mapping's.
    #[error("Mapping at {dma:#x} is {mapped:#x} bytes, not {given:#x}")]
    SizeMismatch {
        /// The address given.
        dma: u64,
        /// The mapping's length.
        mapped: u64,
        /// The length given.
        given: u64,
    },
    /// An unmap by address with a direction other than the mapping's.
    #[error("Mapping at {dma:#x} was made {mapped:?}, not {given:?}")]
    DirectionMismatch {
        /// The address given.
        dma: u64,
        /// The mapping's direction.
        mapped: Direction,
        /// The direction given.
        given: Direction,
    },
    /// An unmap through the wrong call (a scatter-gather mapping through `unmap_raw`).
    #[error("Mapping at {dma:#x} is a {mapped} mapping, not a {given} one")]
    KindMismatch {
        /// The address given.
        dma: u64,
        /// How the mapping was made.
        mapped: MappingKind,
        /// How it was being unmapped.
        given: MappingKind,
    },
    /// A handle from another domain.
    #[error("Mapping belongs to domain {mapping_domain}, not domain {domain}")]
    WrongDomain {
        /// The domain the handle came from.
        mapping_domain: DomainId,
        /// The domain it was given to.
        domain: DomainId,
    },
    /// The domain's cap on live mappings was reached.
    #[error("Domain {domain} already has its maximum of {limit} live mappings")]
    TooManyMappings {
        /// The domain.
        domain: DomainId,
        /// The cap.
        limit: usize,
    },
    /// A CPU number beyond the domain's CPUs.
    #[error("CPU {cpu} is out of range: the domain serves {cpus} CPUs")]
    BadCpu {
        /// The CPU given.
        cpu: usize,
        /// CPUs the domain was configured for.
        cpus: usize,
    },
    /// An inconsistent domain configuration.
    #[error("Invalid domain configuration: {reason}")]
    Config {
        /// What is wrong.
        reason: &'static str,
    },
}

/// A failed call that consumed a handle gives it back, with the reason, so the caller can
/// retry (on the right domain, say). Converts into the bare [`DmaError`] with `?`.
#[derive(Debug, thiserror::Error)]
#[error("{error}")]
pub struct Rejected<T: fmt::Debug> {
    /// The handle, unchanged.
    pub handle: T,
    /// Why the call failed.
    pub error: DmaError,
}

impl<T: fmt::Debug> From<Rejected<T>> for DmaError {
    fn from(r: Rejected<T>) -> Self {
        r.error
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::addr::SZ_4G;

    #[test]
    fn device_masks_and_reach() {
        let d = Device::new(1, 32).unwrap();
        assert_eq!(d.dma_mask(), SZ_4G - 1);
        assert!(d.reaches(SZ_4G - 4096, 4096));
        assert!(!d.reaches(SZ_4G - 4096, 4097));
        assert_eq!(Device::new(2, 64).unwrap().dma_mask(), u64::MAX);
        assert!(Device::new(2, 64).unwrap().reaches(u64::MAX, 1));
    }

    #[test]
    fn invalid_devices_are_rejected() {
        assert!(matches!(
            Device::new(1, 65),
            Err(DmaError::BadDevice {
                field: "dma_mask_bits",
                ..
            })
        ));
        assert!(Device::new(1, 8).is_err());
        let d = Device::new(1, 64).unwrap();
        assert!(d.clone().with_max_segment_size(0).is_err());
        assert!(d.clone().with_segment_boundary_mask(0x1_0000).is_err());
        assert!(d.clone().with_segment_boundary_mask(0x7ff).is_err());
        assert!(d.with_segment_boundary_mask(0xffff).is_ok());
    }

    #[test]
    fn direction_maps_to_prot() {
        assert_eq!(Direction::ToDevice.prot(), Prot::READ);
        assert_eq!(Direction::FromDevice.prot(), Prot::WRITE);
        assert_eq!(Direction::Bidirectional.prot(), Prot::READ_WRITE);
    }

    #[test]
    fn errors_start_with_a_capital_and_keep_sources() {
        use std::error::Error;
        let e = DmaError::IovaSpace {
            pages: 2,
            limit: 0x1000,
            source: IovaError::Exhausted {
                pages: 2,
                limit: 0x1000,
            },
        };
        assert!(e.to_string().starts_with(char::is_uppercase));
        assert!(e.source().is_some());
        let r = Rejected {
            handle: 5u8,
            error: DmaError::EmptySgList,
        };
        assert_eq!(r.to_string(), "Scatter-gather list is empty");
        assert_eq!(DmaError::from(r), DmaError::EmptySgList);
    }
}
