//! Intel VT-d (Virtualization Technology for Directed I/O).
//!
//! - [`spec`]: bit-exact encodings of the translation structures, page-table entries,
//!   CAP/ECAP, fault records and invalidation descriptors.

pub mod pgtable;
pub mod spec;

pub use pgtable::{VtdPageTable, VtdStage, VtdTableConfig, VtdTableError};
