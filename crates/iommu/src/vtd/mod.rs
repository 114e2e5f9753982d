//! Intel VT-d (Virtualization Technology for Directed I/O).
//!
//! - [`spec`]: bit-exact encodings of the translation structures, page-table entries,
//!   CAP/ECAP, fault records and invalidation descriptors.
//! - [`pgtable`]: second- and first-stage page tables in simulated memory.
//! - [`Dmar`] ([`device`]): one remapping unit.
//! - [`VtdInvalidator`] ([`invalidator`]): Linux's `qi_submit_sync` and strict path.

pub mod device;
pub mod invalidator;
pub mod pgtable;
pub mod spec;

pub use device::{
    qi_status, Dmar, DmarConfig, DmarDomain, DmarError, DmarFault, DmarStats, DmarTranslation,
};
pub use invalidator::{iotlb_flush_desc, psi_mask, QiError, VtdInvalidator};
pub use pgtable::{VtdPageTable, VtdStage, VtdTableConfig, VtdTableError};
