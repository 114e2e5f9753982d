//! `[[device]]`: the devices of a scenario, one module per kind, validated into [`Devices`].

pub(super) mod nic;
pub(super) mod nvme;
pub(super) mod sas;
pub(super) mod scsi;
pub(super) mod usb;

use serde::de::DeserializeOwned;

use crate::tomlfile::{InputError, TomlDoc};

pub use nvme::NvmeSetup;
pub use scsi::ScsiSetup;
pub use usb::{SwiotlbSetup, UsbSetup};

/// The devices of a scenario (all of one kind).
#[derive(Clone, Debug, PartialEq)]
pub enum Devices {
    /// NVMe SSDs.
    Nvme(Vec<NvmeSetup>),
    /// SAS HBAs, each with its disks.
    Sas(Vec<crate::devices::sas::SasParams>),
    /// One USB mass-storage device behind an xHCI.
    Usb(Box<UsbSetup>),
    /// One NIC (an SR-IOV VF of a 100 GbE adapter by default).
    Nic(crate::devices::nic::LinkConfig),
    /// One SCSI/SAS HBA with one rotating disk (re-aim).
    Scsi(Box<ScsiSetup>),
}

impl Devices {
    /// The scenario spelling of the kind.
    pub fn kind(&self) -> &'static str {
        match self {
            Devices::Nvme(_) => "nvme",
            Devices::Sas(_) => "sas",
            Devices::Usb(_) => "usb",
            Devices::Nic(_) => "nic",
            Devices::Scsi(_) => "scsi",
        }
    }

    /// How many devices.
    pub fn len(&self) -> usize {
        match self {
            Devices::Nvme(v) => v.len(),
            Devices::Sas(v) => v.len(),
            Devices::Usb(_) | Devices::Nic(_) | Devices::Scsi(_) => 1,
        }
    }

    /// Whether there are none (never, after validation).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A block device's `[[device]]` table (NVMe SSD or SAS HBA): what fio and bonnie share.
pub(super) trait BlockSpec: DeserializeOwned {
    /// Validates every table (device `i` names `device[i]` in errors).
    fn devices(doc: &TomlDoc<'_>, specs: &[Self], cpus: usize) -> Result<Devices, InputError>;
    /// The driver's submit and complete costs of the first device, ns (defaults applied:
    /// the NVMe driver's from the platform profile's `io_path`, the SAS HBA's the lab's).
    fn driver_ns(&self, profile: &crate::cost::PlatformProfile) -> (u64, u64);
    /// The IOMMU instance the table names (`iommu_instance`), if it does.
    fn iommu_instance(&self) -> Option<usize>;
}

pub(super) fn one_device(doc: &TomlDoc<'_>, n: usize, workload: &str) -> Result<(), InputError> {
    if n != 1 {
        return Err(doc.field_error(
            "device",
            format!("a {workload} workload drives exactly one device, got {n}"),
        ));
    }
    Ok(())
}

/// A device's side of the DMA port from its `dma_outstanding_pages` and `relaxed_ordering`
/// fields (defaults: [`crate::lab::defaults::DMA_OUTSTANDING_PAGES`] and
/// [`crate::lab::defaults::DMA_RELAXED_ORDERING`]).
pub(super) fn dma_link(
    dev: &super::fields::Fields<'_, '_>,
    outstanding_pages: Option<u32>,
    relaxed_ordering: Option<bool>,
) -> Result<crate::iommu::port::DeviceLink, InputError> {
    use crate::lab::defaults as d;
    Ok(crate::iommu::port::DeviceLink {
        outstanding_pages: dev.int(
            "dma_outstanding_pages",
            outstanding_pages.unwrap_or(d::DMA_OUTSTANDING_PAGES.0),
            1..=4096,
            "pages",
        )?,
        relaxed_ordering: relaxed_ordering.unwrap_or(d::DMA_RELAXED_ORDERING.0),
    })
}
