//! Device models. Every byte a device moves goes through the IOMMU's translation.
pub mod usb;
pub mod nvme;
pub mod sas;
pub mod scsi;
