//! Sparse simulated physical memory with real bytes, and a physical page allocator.
//!
//! [`PhysMemory`] models a machine's RAM of a configured size (1 TiB costs nothing): memory
//! is kept in 4 KiB pages that materialise on their first write. Reading a page that was
//! never written returns zeros and allocates nothing. The page map is sharded (64 shards,
//! each behind its own reader-writer lock) so concurrent DMA to different pages rarely
//! contends.
//!
//! [`PhysAllocator`] hands out page-aligned, zeroed ranges of that memory (first fit over a
//! coalescing free list, then a bump pointer), for coherent DMA buffers and test fixtures.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use crate::addr::{PhysAddr, PAGE_SHIFT_4K, SZ_4K};
use crate::work::{LockId, WorkRecord};

/// Size of a simulated memory page.
pub const PAGE_SIZE: u64 = SZ_4K;

/// Number of shards of the page map.
const SHARDS: usize = 64;

/// One materialised page.
type Page = Box<[u8; PAGE_SIZE as usize]>;

/// Why a memory operation failed. A failed call changes nothing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MemError {
    /// The access reaches beyond the end of memory (or wraps the address space).
    #[error("Access {pa:#x}+{len:#x} is outside memory of {size:#x} bytes")]
    OutOfRange {
        /// First byte of the access.
        pa: u64,
        /// Length of the access.
        len: u64,
        /// Size of the memory.
        size: u64,
    },
    /// A memory size that is zero or not a multiple of the page size.
    #[error("Memory size {size:#x} is zero or not a multiple of {PAGE_SIZE:#x}")]
    BadSize {
        /// The size asked for.
        size: u64,
    },
    /// An allocator range that is empty, misaligned, or outside memory.
    #[error("Allocator range {start:#x}..{end:#x} is empty, not page aligned, or outside memory")]
    BadRange {
        /// First byte of the range.
        start: u64,
        /// One past the last byte of the range.
        end: u64,
    },
    /// An allocation of zero pages, or an alignment that is not a power of two.
    #[error("Invalid allocation of {pages} pages aligned to {align_pages} pages")]
    BadRequest {
        /// Pages asked for.
        pages: u64,
        /// Alignment asked for, in pages.
        align_pages: u64,
    },
    /// No free range of the size asked for below the limit.
    #[error("Out of physical memory: no {pages} free pages below {limit:#x}")]
    OutOfMemory {
        /// Pages asked for.
        pages: u64,
        /// Exclusive upper bound on the range's end.
        limit: u64,
    },
    /// A free of a range that is not allocated exactly as given.
    #[error("Physical range {pa:#x} of {pages} pages is not allocated")]
    NotAllocated {
        /// Start passed to free.
        pa: u64,
        /// Pages passed to free.
        pages: u64,
    },
}

/// Sparse, page-granular simulated physical memory. See the module docs.
pub struct PhysMemory {
    size: u64,
    shards: Box<[RwLock<HashMap<u64, Page>>]>,
}

impl std::fmt::Debug for PhysMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PhysMemory")
            .field("size", &self.size)
            .field("resident_pages", &self.resident_pages())
            .finish()
    }
}

impl PhysMemory {
    /// Memory of `size` bytes (a non-zero multiple of 4 KiB), all zero, nothing resident.
    pub fn new(size: u64) -> Result<Self, MemError> {
        if size == 0 || size % PAGE_SIZE != 0 {
            return Err(MemError::BadSize { size });
        }
        let shards = (0..SHARDS).map(|_| RwLock::new(HashMap::new())).collect();
        Ok(Self { size, shards })
    }

    /// Size of the memory in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Number of pages that hold data (were written and not zeroed since).
    pub fn resident_pages(&self) -> usize {
        self.shards.iter().map(|s| s.read().len()).sum()
    }

    /// Checks that `pa..pa+len` lies within memory.
    pub fn check_range(&self, pa: PhysAddr, len: u64) -> Result<(), MemError> {
        match pa.get().checked_add(len) {
            Some(end) if end <= self.size => Ok(()),
            _ => Err(MemError::OutOfRange {
                pa: pa.get(),
                len,
                size: self.size,
            }),
        }
    }

    fn shard(&self, pfn: u64) -> &RwLock<HashMap<u64, Page>> {
        &self.shards[(pfn % SHARDS as u64) as usize]
    }

    /// Splits `pa..pa+len` into `(pfn, offset in page, chunk length)` pieces.
    fn chunks(pa: u64, len: u64) -> impl Iterator<Item = (u64, usize, usize)> {
        let mut cur = pa;
        let end = pa + len;
        std::iter::from_fn(move || {
            if cur >= end {
                return None;
            }
            let off = cur % PAGE_SIZE;
            let n = (PAGE_SIZE - off).min(end - cur);
            let item = (cur >> PAGE_SHIFT_4K, off as usize, n as usize);
            cur += n;
            Some(item)
        })
    }

    /// Reads `buf.len()` bytes at `pa` into `buf`. Never-written bytes read as zero.
    pub fn read(&self, pa: PhysAddr, buf: &mut [u8]) -> Result<(), MemError> {
        self.check_range(pa, buf.len() as u64)?;
        let mut done = 0;
        for (pfn, off, n) in Self::chunks(pa.get(), buf.len() as u64) {
            let dst = &mut buf[done..done + n];
            match self.shard(pfn).read().get(&pfn) {
                Some(page) => dst.copy_from_slice(&page[off..off + n]),
                None => dst.fill(0),
            }
            done += n;
        }
        Ok(())
    }

    /// Writes `data` at `pa`, materialising the pages it touches.
    pub fn write(&self, pa: PhysAddr, data: &[u8]) -> Result<(), MemError> {
        self.check_range(pa, data.len() as u64)?;
        let mut done = 0;
        for (pfn, off, n) in Self::chunks(pa.get(), data.len() as u64) {
            let mut shard = self.shard(pfn).write();
            let page = shard
                .entry(pfn)
                .or_insert_with(|| Box::new([0; PAGE_SIZE as usize]));
            page[off..off + n].copy_from_slice(&data[done..done + n]);
            done += n;
        }
        Ok(())
    }

    /// Sets `len` bytes at `pa` to zero. Whole pages in the range stop being resident.
    pub fn zero(&self, pa: PhysAddr, len: u64) -> Result<(), MemError> {
        self.check_range(pa, len)?;
        for (pfn, off, n) in Self::chunks(pa.get(), len) {
            let mut shard = self.shard(pfn).write();
            if n as u64 == PAGE_SIZE {
                shard.remove(&pfn);
            } else if let Some(page) = shard.get_mut(&pfn) {
                page[off..off + n].fill(0);
            }
        }
        Ok(())
    }
}

/// Allocator state: free ranges below the bump pointer, and what is handed out.
#[derive(Debug, Default)]
struct PhysAllocState {
    /// Free ranges below `bump`, as start -> length in bytes, coalesced.
    free: BTreeMap<u64, u64>,
    /// Allocated ranges, as start -> length in bytes.
    allocated: BTreeMap<u64, u64>,
    /// Everything from here to the end of the range has never been handed out.
    bump: u64,
}

/// A physical page allocator over a range of a [`PhysMemory`]: page-aligned, zeroed ranges,
/// first fit over a coalescing free list, then a bump pointer. Thread-safe.
///
/// Its lock is counted as [`LockId::Other`].
#[derive(Debug)]
pub struct PhysAllocator {
    memory: Arc<PhysMemory>,
    start: u64,
    end: u64,
    state: Mutex<PhysAllocState>,
}

impl PhysAllocator {
    /// An allocator handing out pages of `memory` within `start..end` (page aligned).
    pub fn new(memory: Arc<PhysMemory>, start: PhysAddr, end: PhysAddr) -> Result<Self, MemError> {
        let (s, e) = (start.get(), end.get());
        if s >= e || s % PAGE_SIZE != 0 || e % PAGE_SIZE != 0 || e > memory.size() {
            return Err(MemError::BadRange { start: s, end: e });
        }
        let state = PhysAllocState {
            bump: s,
            ..Default::default()
        };
        Ok(Self {
            memory,
            start: s,
            end: e,
            state: Mutex::new(state),
        })
    }

    /// The memory this allocator hands out.
    pub fn memory(&self) -> &Arc<PhysMemory> {
        &self.memory
    }

    /// Allocates `pages` zeroed 4 KiB pages aligned to `align_pages` pages (a power of two),
    /// ending at or below `limit` (exclusive upper bound, from a device's DMA mask).
    pub fn alloc(
        &self,
        pages: u64,
        align_pages: u64,
        limit: PhysAddr,
        work: &mut WorkRecord,
    ) -> Result<PhysAddr, MemError> {
        let bad = MemError::BadRequest { pages, align_pages };
        if pages == 0 || !align_pages.is_power_of_two() {
            return Err(bad);
        }
        let len = pages.checked_mul(PAGE_SIZE).ok_or(bad.clone())?;
        let align = align_pages.checked_mul(PAGE_SIZE).ok_or(bad)?;
        let limit_b = limit.get().min(self.end);
        let oom = MemError::OutOfMemory {
            pages,
            limit: limit.get(),
        };
        let fits = |start: u64, avail_end: u64| -> Option<u64> {
            let a = start.checked_add(align - 1)? & !(align - 1);
            let e = a.checked_add(len)?;
            (e <= avail_end && e <= limit_b).then_some(a)
        };

        work.lock(LockId::Other);
        let mut st = self.state.lock();
        let found = st
            .free
            .iter()
            .find_map(|(&s, &l)| fits(s, s + l).map(|a| (Some(s), a)));
        let (from_free, at) = match found {
            Some(x) => x,
            None => (None, fits(st.bump, self.end).ok_or(oom)?),
        };
        match from_free {
            Some(s) => {
                let l = st.free.remove(&s).unwrap_or(0);
                if at > s {
                    st.free.insert(s, at - s);
                }
                if at + len < s + l {
                    st.free.insert(at + len, s + l - at - len);
                }
            }
            None => {
                if at > st.bump {
                    let b = st.bump;
                    Self::insert_free(&mut st.free, b, at - b);
                }
                st.bump = at + len;
            }
        }
        st.allocated.insert(at, len);
        drop(st);
        // The range is inside memory (checked at construction), so zeroing cannot fail.
        let zeroed = self.memory.zero(PhysAddr::new(at), len);
        debug_assert!(zeroed.is_ok());
        Ok(PhysAddr::new(at))
    }

    /// Inserts a free range, coalescing with its neighbours.
    fn insert_free(free: &mut BTreeMap<u64, u64>, mut start: u64, mut len: u64) {
        if let Some((&ps, &pl)) = free.range(..start).next_back() {
            if ps + pl == start {
                free.remove(&ps);
                start = ps;
                len += pl;
            }
        }
        if let Some(nl) = free.remove(&(start + len)) {
            len += nl;
        }
        free.insert(start, len);
    }

    /// Returns `pages` pages at `pa`, exactly as allocated.
    pub fn free(&self, pa: PhysAddr, pages: u64, work: &mut WorkRecord) -> Result<(), MemError> {
        let err = MemError::NotAllocated {
            pa: pa.get(),
            pages,
        };
        work.lock(LockId::Other);
        let mut st = self.state.lock();
        let len = pages.checked_mul(PAGE_SIZE).ok_or(err.clone())?;
        if st.allocated.get(&pa.get()) != Some(&len) {
            return Err(err);
        }
        st.allocated.remove(&pa.get());
        Self::insert_free(&mut st.free, pa.get(), len);
        // Give the topmost free range back to the bump pointer.
        if let Some((&s, &l)) = st.free.iter().next_back() {
            if s + l == st.bump {
                st.free.remove(&s);
                st.bump = s;
            }
        }
        Ok(())
    }

    /// Whether `pages` pages at `pa` are allocated, exactly as given.
    pub fn is_allocated(&self, pa: PhysAddr, pages: u64) -> bool {
        let st = self.state.lock();
        pages
            .checked_mul(PAGE_SIZE)
            .is_some_and(|len| st.allocated.get(&pa.get()) == Some(&len))
    }

    /// Number of ranges currently allocated.
    pub fn live_allocations(&self) -> usize {
        self.state.lock().allocated.len()
    }

    /// Bytes currently allocated.
    pub fn allocated_bytes(&self) -> u64 {
        self.state.lock().allocated.values().sum()
    }

    /// The range this allocator manages, as `(first, one past last)`.
    pub fn range(&self) -> (PhysAddr, PhysAddr) {
        (PhysAddr::new(self.start), PhysAddr::new(self.end))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::addr::SZ_1G;

    const TIB: u64 = 1 << 40;

    #[test]
    fn sparse_terabyte_materialises_only_written_pages() {
        let mem = PhysMemory::new(TIB).unwrap();
        mem.write(PhysAddr::new(0), b"bottom").unwrap();
        mem.write(PhysAddr::new(TIB - 8), b"top!top!").unwrap();
        mem.write(PhysAddr::new(TIB / 2 + 5), &[7; 3]).unwrap();
        assert_eq!(mem.resident_pages(), 3);
    }

    #[test]
    fn reads_of_unwritten_memory_are_zero_and_allocate_nothing() {
        let mem = PhysMemory::new(TIB).unwrap();
        let mut buf = [0xffu8; 64];
        mem.read(PhysAddr::new(TIB - 64), &mut buf).unwrap();
        assert_eq!(buf, [0; 64]);
        assert_eq!(mem.resident_pages(), 0);
    }

    #[test]
    fn writes_and_reads_cross_page_boundaries() {
        let mem = PhysMemory::new(SZ_1G).unwrap();
        let data: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        let pa = PhysAddr::new(3 * PAGE_SIZE - 100);
        mem.write(pa, &data).unwrap();
        assert_eq!(mem.resident_pages(), 4);
        let mut back = vec![0; data.len()];
        mem.read(pa, &mut back).unwrap();
        assert_eq!(back, data);
    }

    #[test]
    fn out_of_range_access_is_an_error_and_writes_nothing() {
        let mem = PhysMemory::new(SZ_1G).unwrap();
        let err = mem.write(PhysAddr::new(SZ_1G - 2), &[1, 2, 3]).unwrap_err();
        assert_eq!(
            err,
            MemError::OutOfRange {
                pa: SZ_1G - 2,
                len: 3,
                size: SZ_1G
            }
        );
        assert_eq!(mem.resident_pages(), 0);
        let mut b = [0; 2];
        assert!(mem.read(PhysAddr::new(u64::MAX), &mut b).is_err());
    }

    #[test]
    fn bad_sizes_are_rejected() {
        assert_eq!(
            PhysMemory::new(0).unwrap_err(),
            MemError::BadSize { size: 0 }
        );
        assert_eq!(
            PhysMemory::new(100).unwrap_err(),
            MemError::BadSize { size: 100 }
        );
    }

    #[test]
    fn zero_drops_whole_pages_and_clears_partial_ones() {
        let mem = PhysMemory::new(SZ_1G).unwrap();
        mem.write(PhysAddr::new(0), &[9; 3 * PAGE_SIZE as usize])
            .unwrap();
        mem.zero(PhysAddr::new(10), 2 * PAGE_SIZE).unwrap();
        assert_eq!(mem.resident_pages(), 2);
        let mut b = [0u8; 12];
        mem.read(PhysAddr::new(2 * PAGE_SIZE + 4), &mut b).unwrap();
        assert_eq!(&b[..6], &[0; 6]);
        assert_eq!(&b[6..], &[9; 6]);
    }

    fn allocator() -> PhysAllocator {
        let mem = Arc::new(PhysMemory::new(SZ_1G).unwrap());
        PhysAllocator::new(mem, PhysAddr::new(SZ_4K), PhysAddr::new(SZ_1G)).unwrap()
    }

    #[test]
    fn allocations_are_aligned_disjoint_and_zeroed() {
        let a = allocator();
        let mut w = WorkRecord::new();
        let p1 = a.alloc(3, 1, PhysAddr::new(u64::MAX), &mut w).unwrap();
        a.memory().write(p1, &[5; 100]).unwrap();
        let p2 = a.alloc(4, 4, PhysAddr::new(u64::MAX), &mut w).unwrap();
        assert!(p2.is_aligned(4 * PAGE_SIZE));
        assert!(p2.get() >= p1.get() + 3 * PAGE_SIZE);
        a.free(p1, 3, &mut w).unwrap();
        let p3 = a.alloc(1, 1, PhysAddr::new(u64::MAX), &mut w).unwrap();
        assert_eq!(p3, p1, "first fit reuses the freed range");
        let mut b = [1u8; 100];
        a.memory().read(p3, &mut b).unwrap();
        assert_eq!(b, [0; 100]);
        assert_eq!(w.lock_count(LockId::Other), 4);
    }

    #[test]
    fn freeing_everything_returns_to_empty() {
        let a = allocator();
        let mut w = WorkRecord::new();
        let ps: Vec<_> = (1..6)
            .map(|n| (a.alloc(n, 1, PhysAddr::new(u64::MAX), &mut w).unwrap(), n))
            .collect();
        for (p, n) in ps.into_iter().rev() {
            a.free(p, n, &mut w).unwrap();
        }
        assert_eq!(a.live_allocations(), 0);
        let st = a.state.lock();
        assert!(st.free.is_empty());
        assert_eq!(st.bump, SZ_4K);
    }

    #[test]
    fn limit_is_respected_and_exhaustion_is_an_error() {
        let a = allocator();
        let mut w = WorkRecord::new();
        let err = a.alloc(2, 1, PhysAddr::new(2 * SZ_4K), &mut w).unwrap_err();
        assert_eq!(
            err,
            MemError::OutOfMemory {
                pages: 2,
                limit: 2 * SZ_4K
            }
        );
        assert_eq!(a.live_allocations(), 0);
        let p = a.alloc(1, 1, PhysAddr::new(2 * SZ_4K), &mut w).unwrap();
        assert_eq!(p, PhysAddr::new(SZ_4K));
    }

    #[test]
    fn bad_free_is_an_error_and_changes_nothing() {
        let a = allocator();
        let mut w = WorkRecord::new();
        let p = a.alloc(2, 1, PhysAddr::new(u64::MAX), &mut w).unwrap();
        assert_eq!(
            a.free(p, 1, &mut w).unwrap_err(),
            MemError::NotAllocated {
                pa: p.get(),
                pages: 1
            }
        );
        assert_eq!(a.live_allocations(), 1);
        a.free(p, 2, &mut w).unwrap();
        assert!(a.free(p, 2, &mut w).is_err());
    }

    #[test]
    fn bad_requests_are_rejected() {
        let a = allocator();
        let mut w = WorkRecord::new();
        assert!(matches!(
            a.alloc(0, 1, PhysAddr::new(u64::MAX), &mut w),
            Err(MemError::BadRequest { .. })
        ));
        assert!(matches!(
            a.alloc(1, 3, PhysAddr::new(u64::MAX), &mut w),
            Err(MemError::BadRequest { .. })
        ));
        let mem = Arc::new(PhysMemory::new(SZ_1G).unwrap());
        assert!(PhysAllocator::new(mem, PhysAddr::new(0), PhysAddr::new(2 * SZ_1G)).is_err());
    }
}
