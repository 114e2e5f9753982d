//! AMD-Vi: the AMD I/O Virtualization Technology IOMMU.
//!
//! - [`spec`]: bit-exact encodings (device table entry, v1 page-table entries, commands,
//!   event-log entries, the S-bit range encoding) with decode errors.

pub mod spec;
