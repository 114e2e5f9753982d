//! The same operations on peer crates.

use aarch64_paging::descriptor::El1Attributes;
use aarch64_paging::idmap::IdMap;
use aarch64_paging::paging::{El1And0, MemoryRegion};
use range_alloc::RangeAllocator;
use vm_allocator::{AddressAllocator, AllocPolicy};

use super::harness::{churn_op, median_ns_per_op, Op, Sampling};

/// The IOVA space every allocator benchmark uses: 4 KiB pages from 4 KiB up to 2^40.
pub const SPACE_START: u64 = 4096;
/// One past the last byte of the benchmark IOVA space.
pub const SPACE_END: u64 = 1 << 40;
/// Page size of the benchmarks.
pub const PAGE: u64 = 4096;

/// vm-allocator's `AddressAllocator` under the churn workload (size-aligned like IOVAs), as
/// an operation for [`super::harness::median_ns_per_op_interleaved`].
pub fn vm_allocator_churn(live: usize) -> Op<'static> {
    let a = AddressAllocator::new(SPACE_START, SPACE_END - SPACE_START).expect("valid range");
    // Place the live set top-down, packed and size-aligned, as the IOVA allocators do.
    let mut cursor = SPACE_END;
    churn_op(
        live,
        a,
        |a, pages| {
            let size = pages * PAGE;
            cursor = (cursor - size) & !(size.next_power_of_two() - 1);
            a.allocate(
                size,
                size.next_power_of_two(),
                AllocPolicy::ExactMatch(cursor),
            )
            .expect("free space at the cursor")
        },
        |a, pages| {
            let size = pages * PAGE;
            a.allocate(size, size.next_power_of_two(), AllocPolicy::FirstMatch)
                .expect("benchmark space is large enough")
        },
        |a, r| a.free(&r).expect("allocated range"),
    )
}

/// range-alloc's `RangeAllocator` under the churn workload, as an operation for
/// [`super::harness::median_ns_per_op_interleaved`].
pub fn range_alloc_churn(live: usize) -> Op<'static> {
    let alloc = |a: &mut RangeAllocator<u64>, pages: u64| {
        let size = pages * PAGE;
        a.allocate_range_aligned(size, size.next_power_of_two())
            .expect("benchmark space is large enough")
    };
    churn_op(
        live,
        RangeAllocator::new(SPACE_START..SPACE_END),
        alloc,
        alloc,
        |a, r| a.free_range(r),
    )
}

/// aarch64-paging's identity map: map `size` bytes then unmap them (remap as invalid).
pub fn aarch64_paging_map_unmap(size: u64, sampling: &Sampling) -> f64 {
    let mut idmap = IdMap::with_asid(1, 1, El1And0);
    let flags = El1Attributes::ATTRIBUTE_INDEX_1
        | El1Attributes::INNER_SHAREABLE
        | El1Attributes::VALID
        | El1Attributes::ACCESSED;
    let invalid = El1Attributes::ATTRIBUTE_INDEX_1 | El1Attributes::INNER_SHAREABLE;
    // Rotate over 64 slots so tables stay allocated, as in iolab's benchmark.
    let base = 0x4000_0000u64;
    median_ns_per_op(sampling, |i| {
        let start = (base + (i % 64) * size) as usize;
        let region = MemoryRegion::new(start, start + size as usize);
        idmap.map_range(&region, flags).expect("map");
        idmap.map_range(&region, invalid).expect("unmap");
    })
}
