//! Device models. Every byte a device moves goes through the IOMMU's translation.
<<<<<<< HEAD
pub mod nic;
=======
>>>>>>> wt-cmdq-fix
pub mod nvme;
pub mod sas;
pub mod scsi;
pub mod usb;
