//! Device models. Every byte a device moves goes through the IOMMU's translation.
pub mod nic;
pub mod nvme;
pub mod sas;
pub mod scsi;
pub mod usb;
