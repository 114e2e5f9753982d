//! AMD-Vi: the AMD I/O Virtualization Technology IOMMU.
//!
//! - [`spec`]: bit-exact encodings (device table entry, v1 page-table entries, commands,
//!   event-log entries, the S-bit range encoding) with decode errors.
//! - [`pgtable`]: the v1 host page table ([`AmdV1Table`]), an [`IoPageTable`](crate::pgtable::IoPageTable).

pub mod pgtable;
pub mod spec;

pub use pgtable::{AmdV1Config, AmdV1ConfigError, AmdV1Table};
