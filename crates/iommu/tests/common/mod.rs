//! Helpers shared by the integration tests (`mod common;` in each test that uses them).

use iolab_iommu::addr::PhysAddr;
use iolab_iommu::dma::{Device, Direction, DmaError};
use iolab_iommu::hw::{DmaPath, MappedBuffer};
use iolab_iommu::work::WorkRecord;

/// Maps `len` bytes at physical address `pa` through `path` for `dev` to be read by the
/// device (`Direction::ToDevice`), on CPU `cpu`.
pub fn map_to_device(
    path: &dyn DmaPath,
    dev: &Device,
    pa: u64,
    len: u64,
    cpu: usize,
    w: &mut WorkRecord,
) -> Result<MappedBuffer, DmaError> {
    path.map_single(dev, PhysAddr::new(pa), len, Direction::ToDevice, cpu, w)
}
