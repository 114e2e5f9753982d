//! `[workload]`: the workload of a scenario, one module per kind, validated into [`Workload`].

pub(super) mod bonnie;
pub(super) mod dma_map_benchmark;
pub(super) mod fio;
pub(super) mod netperf;
pub(super) mod reaim;

pub use bonnie::BonnieSetup;
pub use dma_map_benchmark::{DmaMapBenchmarkSetup, MapDirection};
pub use fio::FioSetup;
pub use netperf::{DirectRx, NetperfSetup};
pub use reaim::ReaimSetup;

/// The workload of a scenario.
#[derive(Clone, Debug, PartialEq)]
pub enum Workload {
    /// fio on block devices.
    Fio(FioSetup),
    /// bonnie++ on a USB disk, an NVMe SSD or a SAS HBA.
    Bonnie(Box<BonnieSetup>),
    /// netperf-like TCP streams on a NIC.
    Netperf(Box<NetperfSetup>),
    /// re-aim on a SCSI/SAS disk.
    Reaim(Box<ReaimSetup>),
    /// The kernel's DMA-mapping benchmark (`kernel/dma/map_benchmark.c`) bound to a block
    /// device.
    DmaMapBenchmark(DmaMapBenchmarkSetup),
}

impl Workload {
    /// The scenario spelling of the kind.
    pub fn kind(&self) -> &'static str {
        match self {
            Workload::Fio(_) => "fio",
            Workload::Bonnie(_) => "bonnie",
            Workload::Netperf(_) => "netperf",
            Workload::Reaim(_) => "reaim",
            Workload::DmaMapBenchmark(_) => "dma_map_benchmark",
        }
    }
}
