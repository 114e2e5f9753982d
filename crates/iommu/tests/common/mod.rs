//! Helpers shared by the integration tests (`mod common;` in each test that uses them).
//! Each test crate compiles the whole module but uses only some of it, hence the
//! `allow(dead_code)` on every helper.

use iolab_iommu::addr::{Access, PhysAddr};
use iolab_iommu::dma::{Device, Direction, DmaError, PhysRange};
use iolab_iommu::hw::{DmaPath, MappedBuffer};
use iolab_iommu::work::WorkRecord;

/// Maps `len` bytes at physical address `pa` through `path` for `dev` to be read by the
/// device (`Direction::ToDevice`), on CPU `cpu`.
#[allow(dead_code)]
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

/// How a device touches a buffer mapped for `dir`: it reads a `ToDevice` buffer and writes
/// the others.
#[allow(dead_code)]
pub fn device_access(dir: Direction) -> Access {
    match dir {
        Direction::ToDevice => Access::Read,
        _ => Access::Write,
    }
}

/// Merges physically contiguous neighbours: the canonical form of a list of ranges.
#[allow(dead_code)]
pub fn canonical(ranges: impl IntoIterator<Item = PhysRange>) -> Vec<PhysRange> {
    PhysRange::coalesce(ranges)
}
