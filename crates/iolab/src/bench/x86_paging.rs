//! The peer for the x86 page-table rows: the `x86_64` crate's [`OffsetPageTable`] over table
//! pages allocated from the host heap.
//!
//! The crate builds x86-64 CPU page tables: 4 levels of 512 eight-byte entries, the format
//! of VT-d's first stage and, for 4 KiB pages, the same radix walk as VT-d's second stage and
//! AMD-Vi's v1 table. It reads and writes its tables through a "physical memory offset"; here
//! the offset is 0 and every table page's "physical address" is its host address, so the
//! walks touch real memory as a kernel's would. Leaf frames are only recorded, never
//! dereferenced. The crate's TLB flush tokens are dropped with `ignore()`: there is no CPU
//! TLB for these tables (the iolab rows flush nothing either).
//!
//! This is the only `unsafe` code of the `iolab` crate; each block says why it is sound.
#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]

use std::alloc::{alloc_zeroed, dealloc, Layout};

use x86_64::structures::paging::mapper::Translate;
use x86_64::structures::paging::{
    FrameAllocator, Mapper, OffsetPageTable, Page, PageTable, PageTableFlags, PhysFrame, Size4KiB,
};
use x86_64::{PhysAddr, VirtAddr};

use super::harness::Op;

/// Table pages taken from the host heap, zeroed and 4 KiB aligned, freed on drop.
struct HostFrames {
    pages: Vec<*mut PageTable>,
}

impl HostFrames {
    fn new() -> Self {
        Self { pages: Vec::new() }
    }

    /// A zeroed, 4 KiB-aligned page that lives as long as `self`.
    fn page(&mut self) -> *mut PageTable {
        let layout = Layout::new::<PageTable>();
        // SAFETY: `PageTable` has a non-zero size (4096 bytes, 4096-aligned).
        let p = unsafe { alloc_zeroed(layout) }.cast::<PageTable>();
        assert!(!p.is_null(), "host allocation of a table page failed");
        self.pages.push(p);
        p
    }
}

impl Drop for HostFrames {
    fn drop(&mut self) {
        for &p in &self.pages {
            // SAFETY: `p` came from `alloc_zeroed` with this layout and is freed once.
            unsafe { dealloc(p.cast(), Layout::new::<PageTable>()) };
        }
    }
}

// SAFETY: every frame returned is a distinct, zeroed, 4 KiB-aligned host page that no one
// else uses and that stays allocated while the allocator (and so the mapper) lives.
unsafe impl FrameAllocator<Size4KiB> for HostFrames {
    fn allocate_frame(&mut self) -> Option<PhysFrame<Size4KiB>> {
        let p = self.page();
        PhysFrame::from_start_address(PhysAddr::new(p as u64)).ok()
    }
}

/// An x86-64 page table whose tables live in host memory (see the module docs).
pub struct HostPageTable {
    // Declared before `frames` so it is dropped first: it points into them.
    mapper: OffsetPageTable<'static>,
    frames: HostFrames,
}

impl HostPageTable {
    /// An empty 4-level table.
    pub fn new() -> Self {
        let mut frames = HostFrames::new();
        let root = frames.page();
        // SAFETY: with offset 0 every table frame's "physical" address is its host address:
        // the root and every table the mapper creates come from `frames`, which is owned by
        // the same struct and freed only after the mapper is dropped; nothing else refers to
        // those pages. The `'static` borrow of the root never escapes this struct.
        let mapper = unsafe { OffsetPageTable::new(&mut *root, VirtAddr::new(0)) };
        Self { mapper, frames }
    }

    /// Maps the 4 KiB page at `va` to `pa`, read-write.
    pub fn map(&mut self, va: u64, pa: u64) {
        let page = Page::<Size4KiB>::containing_address(VirtAddr::new(va));
        let frame = PhysFrame::containing_address(PhysAddr::new(pa));
        let flags = PageTableFlags::PRESENT | PageTableFlags::WRITABLE;
        // SAFETY: the leaf frame is never accessed through this table (it is an I/O page
        // table here, not the CPU's), so aliasing it cannot break memory safety.
        let flush = unsafe { self.mapper.map_to(page, frame, flags, &mut self.frames) };
        flush.expect("map").ignore();
    }

    /// Unmaps the 4 KiB page at `va`.
    pub fn unmap(&mut self, va: u64) {
        let page = Page::<Size4KiB>::containing_address(VirtAddr::new(va));
        let (_, flush) = self.mapper.unmap(page).expect("unmap");
        flush.ignore();
    }

    /// The physical address `va` translates to, if mapped.
    pub fn translate(&self, va: u64) -> Option<u64> {
        self.mapper
            .translate_addr(VirtAddr::new(va))
            .map(|p| p.as_u64())
    }
}

/// One round of the map+unmap rows on a fresh table: map every page of `iovas` (4 KiB, to
/// `pa_base + i * 4 KiB`) then unmap them all. The first round, which creates the tables, is
/// part of the harness's calibration.
pub fn map_unmap_op(iovas: &[u64], pa_base: u64) -> Op<'_> {
    let mut table = HostPageTable::new();
    Box::new(move |_| {
        for (i, &va) in iovas.iter().enumerate() {
            table.map(va, pa_base + i as u64 * 4096);
        }
        for &va in iovas {
            table.unmap(va);
        }
    })
}

/// One translation of the translate rows, with every page of `iovas` mapped: the pages in
/// turn, 8 bytes into each.
pub fn translate_op(iovas: &[u64], pa_base: u64) -> Op<'_> {
    let mut table = HostPageTable::new();
    for (i, &va) in iovas.iter().enumerate() {
        table.map(va, pa_base + i as u64 * 4096);
    }
    let n = iovas.len() as u64;
    Box::new(move |i| {
        let t = table.translate(iovas[(i % n) as usize] + 8);
        std::hint::black_box(t.expect("mapped"));
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_translates_and_unmaps_on_host_memory() {
        let mut t = HostPageTable::new();
        t.map(0x4000_1000, 0x8000_0000);
        t.map(0x7f_4000_0000, 0x8000_1000);
        assert_eq!(t.translate(0x4000_1008), Some(0x8000_0008));
        assert_eq!(t.translate(0x7f_4000_0010), Some(0x8000_1010));
        t.unmap(0x4000_1000);
        assert_eq!(t.translate(0x4000_1008), None);
        assert_eq!(t.translate(0x7f_4000_0010), Some(0x8000_1010));
    }
}
