//! Device models. Every byte a device moves goes through the IOMMU's translation.
pub mod nic;
