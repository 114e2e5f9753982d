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
