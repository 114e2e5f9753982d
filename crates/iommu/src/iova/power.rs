//! The POWER TCE-table allocator (`arch/powerpc/kernel/iommu.c`), rebuilt from its design.
//!
//! One bit per TCE (an entry of the window, [`PowerPoolConfig::tce_page_size`] bytes) in a
//! bitmap. The table is split into pools, each with its own lock and allocation hint:
//!
//! - windows of 1 GiB or more: four pools sharing the bottom three quarters equally;
//!   smaller windows: one pool over the bottom three quarters;
//! - in both cases a large pool over the top quarter.
//!
//! A request goes to the pool picked by hashing its CPU (`hash_32(cpu, 2)`, the golden-ratio
//! multiplicative hash, masked by the pool count), or to the large pool when it wants more
//! than 15 pages. The search is a first fit upward from the pool's hint within the pool (the
//! last entry of the searched range is never used, as `iommu_area_alloc`'s "we don't want the
//! last of the limit"). On failure Linux's fallback runs: the same pool again from its start,
//! then the next pools in order (`(pool + 1) % pools`, as many times as there are pools, so
//! the first pool is retried last), then the large pool, each from its start; then the
//! request fails. After a success the hint moves past the block, rounded up to the next
//! 16-entry block (`it_blocksize`) for small requests. A device limit below a pool's end
//! confines the search below the limit and, on retries, to a scan from pool 0's start.
//!
//! Entry 0 of the window is reserved and never handed out (Linux reserves it only when the
//! window starts at address 0; here always). A block never crosses a segment boundary
//! ([`PowerPoolConfig::segment_boundary`], 4 GiB by default as for a device that sets none).
//!
//! # Alignment
//!
//! Linux passes an `align_order` only on some paths (coherent allocations, page-sized pieces
//! when TCEs are smaller than pages). Here `size_aligned` aligns the block's IOVA to the next
//! power of two of its size (the alignment is of the absolute entry number, so it holds for
//! windows that do not start at 0).
//!
//! # Work counted
//!
//! Pool lock acquisitions as Linux takes them ([`LockId::TcePool`], [`LockId::TceLargePool`]):
//! one for the first pool, one per switch to another pool, one per free. `bitmap_words_scanned`
//! counts the 64-bit words examined by the zero-area search of an allocation.
//!
//! # Concurrency
//!
//! Bits of a pool's region are only claimed with that pool's lock held. When a device limit
//! makes a search run across pool boundaries, the locks of every pool in the searched range
//! are taken in pool order (Linux holds only one; these extra acquisitions are not counted).
//! The bitmap words are atomics, so a free (which, as Linux, takes only the lock of the pool
//! holding the block's first entry) never loses a neighbour's update. A free must name a block
//! exactly as allocated: a second bitmap marks block starts, and a free of anything else
//! returns [`IovaError::NotAllocated`] and changes nothing.

use crate::addr::{Iova, SZ_1G, SZ_4G};
use crate::iova::linux::{order_base_2, IovaConfigError};
use crate::iova::{AllocRequest, IovaAllocator, IovaBlock, IovaError};
use crate::work::{LockId, WorkRecord};
use parking_lot::{Mutex, MutexGuard};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Pools for windows of 1 GiB or more (Linux `IOMMU_NR_POOLS`, `1 << IOMMU_POOL_HASHBITS`).
pub const NR_POOLS: usize = 4;
/// Requests of more pages than this go to the large pool.
pub const LARGE_ALLOC_PAGES: u64 = 15;
/// Smallest TCE page size accepted.
pub const MIN_TCE_PAGE: u64 = 1 << 12;
/// Largest TCE page size accepted (16 GiB, the largest DDW page size).
pub const MAX_TCE_PAGE: u64 = 1 << 34;
/// Fewest entries a window may have.
pub const MIN_ENTRIES: u64 = 16;
/// Most entries a window may have (two bitmaps of 32 MiB each).
pub const MAX_ENTRIES: u64 = 1 << 28;

/// A bitmap of atomic words, with the scans the bitmap allocators need. Callers serialise
/// writers to any one bit with their own locks; the atomics keep neighbours' bits intact.
#[derive(Debug)]
pub(crate) struct Bitmap {
    words: Box<[AtomicU64]>,
}

impl Bitmap {
    pub(crate) fn new(bits: u64) -> Self {
        Self {
            words: (0..bits.div_ceil(64)).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    #[inline]
    fn word(&self, i: u64) -> u64 {
        self.words[(i / 64) as usize].load(Ordering::Acquire)
    }

    /// Word `wi` of the bitmap (bits `64 * wi..64 * wi + 64`).
    #[inline]
    pub(crate) fn load_word(&self, wi: u64) -> u64 {
        self.words[wi as usize].load(Ordering::Acquire)
    }

    /// Whether bit `i` is set.
    #[inline]
    pub(crate) fn get(&self, i: u64) -> bool {
        self.word(i) >> (i % 64) & 1 == 1
    }

    /// The first clear bit in `from..to`, or `to` (Linux `find_next_zero_bit`).
    pub(crate) fn next_zero(&self, from: u64, to: u64, w: &mut WorkRecord) -> u64 {
        self.next(from, to, true, w)
    }

    /// The first set bit in `from..to`, or `to` (Linux `find_next_bit`).
    pub(crate) fn next_set(&self, from: u64, to: u64, w: &mut WorkRecord) -> u64 {
        self.next(from, to, false, w)
    }

    fn next(&self, from: u64, to: u64, zero: bool, w: &mut WorkRecord) -> u64 {
        let mut i = from;
        while i < to {
            w.bitmap_words_scanned += 1;
            let mut word = self.word(i);
            if zero {
                word = !word;
            }
            word &= !0u64 << (i % 64);
            if word != 0 {
                let bit = (i & !63) + u64::from(word.trailing_zeros());
                return bit.min(to);
            }
            i = (i & !63) + 64;
        }
        to
    }

    /// Applies `f(word, mask)` to every word overlapping `from..to`.
    fn for_words(&self, from: u64, to: u64, mut f: impl FnMut(&AtomicU64, u64)) {
        let mut i = from;
        while i < to {
            let base = i & !63;
            let hi = to.min(base + 64);
            let len = hi - i;
            let mask = if len == 64 {
                !0
            } else {
                ((1u64 << len) - 1) << (i - base)
            };
            f(&self.words[(base / 64) as usize], mask);
            i = hi;
        }
    }

    /// Sets bits `from..to`.
    pub(crate) fn set_range(&self, from: u64, to: u64) {
        self.for_words(from, to, |a, m| {
            a.fetch_or(m, Ordering::AcqRel);
        });
    }

    /// Clears bits `from..to`.
    pub(crate) fn clear_range(&self, from: u64, to: u64) {
        self.for_words(from, to, |a, m| {
            a.fetch_and(!m, Ordering::AcqRel);
        });
    }

    /// Whether every bit in `from..to` is set.
    pub(crate) fn all_set(&self, from: u64, to: u64) -> bool {
        let mut ok = true;
        self.for_words(from, to, |a, m| ok &= a.load(Ordering::Acquire) & m == m);
        ok
    }

    /// Whether any bit in `from..to` is set.
    pub(crate) fn any_set(&self, from: u64, to: u64) -> bool {
        let mut any = false;
        self.for_words(from, to, |a, m| any |= a.load(Ordering::Acquire) & m != 0);
        any
    }
}

/// An allocation map plus a map of block starts, so frees can be checked exactly.
#[derive(Debug)]
pub(crate) struct BlockMap {
    pub(crate) map: Bitmap,
    pub(crate) starts: Bitmap,
    pub(crate) bits: u64,
}

impl BlockMap {
    pub(crate) fn new(bits: u64) -> Self {
        Self {
            map: Bitmap::new(bits),
            starts: Bitmap::new(bits),
            bits,
        }
    }

    /// Marks `from..from + n` allocated as one block (start first, see the module docs).
    pub(crate) fn claim(&self, from: u64, n: u64) {
        self.starts.set_range(from, from + 1);
        self.map.set_range(from, from + n);
    }

    /// Whether `from..from + n` is exactly one allocated block.
    pub(crate) fn is_block(&self, from: u64, n: u64) -> bool {
        let end = from + n;
        self.starts.get(from)
            && self.map.all_set(from, end)
            && !self.starts.any_set(from + 1, end)
            && (end >= self.bits || !self.map.get(end) || self.starts.get(end))
    }

    /// Releases the block `from..from + n` (allocation bits first, see the module docs).
    pub(crate) fn release(&self, from: u64, n: u64) {
        self.map.clear_range(from, from + n);
        self.starts.clear_range(from, from + 1);
    }
}

/// Configuration of a [`PowerPoolAllocator`]: one DMA window.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PowerPoolConfig {
    /// First IOVA of the window (`it_offset` times the TCE page size); a multiple of the TCE
    /// page size.
    pub window_start: Iova,
    /// Window size in bytes (a multiple of the TCE page size).
    pub window_size: u64,
    /// TCE page size (power of two, [`MIN_TCE_PAGE`]..=[`MAX_TCE_PAGE`]); the allocator's
    /// granule.
    pub tce_page_size: u64,
    /// Hint rounding for small allocations, in entries (Linux `it_blocksize`, 16); a power
    /// of two.
    pub block_size: u64,
    /// Blocks never cross a multiple of this many bytes (the device's segment boundary;
    /// 4 GiB when the device sets none). A power of two.
    pub segment_boundary: u64,
}

impl PowerPoolConfig {
    /// A window with Linux's defaults: 16-entry hint blocks, a 4 GiB segment boundary.
    pub fn new(window_start: Iova, window_size: u64, tce_page_size: u64) -> Self {
        Self {
            window_start,
            window_size,
            tce_page_size,
            block_size: 16,
            segment_boundary: SZ_4G,
        }
    }
}

/// One pool: its entry range and its lock, which guards the hint.
#[derive(Debug)]
#[repr(align(128))]
struct Pool {
    start: u64,
    end: u64,
    hint: Mutex<u64>,
}

/// Which pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PoolId {
    Small(usize),
    Large,
}

/// The POWER TCE bitmap allocator with per-CPU-hashed pools and a large pool. See the module
/// docs.
#[derive(Debug)]
pub struct PowerPoolAllocator {
    page: u64,
    page_shift: u32,
    /// First entry number of the window (`it_offset`).
    offset: u64,
    /// Entries in the window (`it_size`).
    size: u64,
    nr_pools: usize,
    poolsize: u64,
    blocksize: u64,
    boundary: u64,
    pools: Vec<Pool>,
    large: Pool,
    bits: BlockMap,
    live: AtomicUsize,
}

/// Linux `hash_32(cpu, 2)`.
fn pool_hash(cpu: usize) -> usize {
    ((cpu as u32).wrapping_mul(0x61C8_8647) >> (32 - 2)) as usize
}

impl PowerPoolAllocator {
    /// Builds an empty table for the configured window.
    pub fn new(config: PowerPoolConfig) -> Result<Self, IovaConfigError> {
        let page = config.tce_page_size;
        if !page.is_power_of_two() || !(MIN_TCE_PAGE..=MAX_TCE_PAGE).contains(&page) {
            return Err(IovaConfigError::BadPageSize {
                size: page,
                min: MIN_TCE_PAGE,
                max: MAX_TCE_PAGE,
            });
        }
        for (field, value) in [
            ("window_start", config.window_start.get()),
            ("window_size", config.window_size),
        ] {
            if value % page != 0 {
                return Err(IovaConfigError::Unaligned { field, value, page });
            }
        }
        let size = config.window_size / page;
        if !(MIN_ENTRIES..=MAX_ENTRIES).contains(&size) {
            return Err(IovaConfigError::OutOfBounds {
                field: "window entries",
                value: size,
                min: MIN_ENTRIES,
                max: MAX_ENTRIES,
            });
        }
        if config
            .window_start
            .checked_add(config.window_size)
            .is_none()
        {
            return Err(IovaConfigError::BadRange {
                start: config.window_start.get(),
                end: u64::MAX,
            });
        }
        if !config.block_size.is_power_of_two() || config.block_size > size {
            return Err(IovaConfigError::OutOfBounds {
                field: "block_size",
                value: config.block_size,
                min: 1,
                max: size,
            });
        }
        if !config.segment_boundary.is_power_of_two() {
            return Err(IovaConfigError::OutOfBounds {
                field: "segment_boundary",
                value: config.segment_boundary,
                min: 1,
                max: 1 << 63,
            });
        }
        let nr_pools = if config.window_size >= SZ_1G {
            NR_POOLS
        } else {
            1
        };
        let poolsize = (size * 3 / 4) / nr_pools as u64;
        let mk = |start: u64, end: u64| Pool {
            start,
            end,
            hint: Mutex::new(start),
        };
        let pools = (0..nr_pools as u64)
            .map(|i| mk(poolsize * i, poolsize * (i + 1)))
            .collect();
        let large = mk(poolsize * nr_pools as u64, size);
        let bits = BlockMap::new(size);
        // Entry 0 is reserved: allocated, but not a block anyone can free.
        bits.map.set_range(0, 1);
        Ok(Self {
            page,
            page_shift: page.trailing_zeros(),
            offset: config.window_start.get() / page,
            size,
            nr_pools,
            poolsize,
            blocksize: config.block_size,
            boundary: ((config.segment_boundary - 1) >> page.trailing_zeros()) + 1,
            pools,
            large,
            bits,
            live: AtomicUsize::new(0),
        })
    }

    /// Number of small pools (4 for windows of 1 GiB or more, else 1).
    pub fn nr_pools(&self) -> usize {
        self.nr_pools
    }

    /// The small pool a CPU's requests start in.
    pub fn pool_for_cpu(&self, cpu: usize) -> usize {
        pool_hash(cpu) & (self.nr_pools - 1)
    }

    /// Entry ranges `(start, end)` of the small pools, then of the large pool.
    pub fn pool_bounds(&self) -> Vec<(u64, u64)> {
        self.pools
            .iter()
            .chain(std::iter::once(&self.large))
            .map(|p| (p.start, p.end))
            .collect()
    }

    /// Current hints of the small pools, then of the large pool.
    pub fn hints(&self) -> Vec<u64> {
        self.pools
            .iter()
            .chain(std::iter::once(&self.large))
            .map(|p| *p.hint.lock())
            .collect()
    }

    fn pool(&self, id: PoolId) -> &Pool {
        match id {
            PoolId::Small(i) => &self.pools[i],
            PoolId::Large => &self.large,
        }
    }

    fn count_lock(w: &mut WorkRecord, id: PoolId) {
        w.lock(match id {
            PoolId::Small(_) => LockId::TcePool,
            PoolId::Large => LockId::TceLargePool,
        });
    }

    /// Linux `get_pool`: the pool holding entry `e`.
    fn pool_of(&self, e: u64) -> PoolId {
        if e >= self.large.start {
            PoolId::Large
        } else {
            PoolId::Small(((e / self.poolsize) as usize).min(self.nr_pools - 1))
        }
    }

    /// Pool order for locking: small pools by number, then the large pool.
    fn rank(&self, id: PoolId) -> usize {
        match id {
            PoolId::Small(i) => i,
            PoolId::Large => self.nr_pools,
        }
    }

    /// Locks `hint_pool` and every pool overlapping `from..to`, in pool order. Returns the
    /// guards and the position of `hint_pool`'s guard among them.
    fn lock_range(
        &self,
        hint_pool: PoolId,
        from: u64,
        to: u64,
    ) -> (Vec<MutexGuard<'_, u64>>, usize) {
        let h = self.rank(hint_pool);
        let (mut lo, mut hi) = (h, h);
        if from < to {
            lo = lo.min(self.rank(self.pool_of(from)));
            hi = hi.max(self.rank(self.pool_of(to - 1)));
        }
        let guards = (lo..=hi)
            .map(|r| {
                if r == self.nr_pools {
                    &self.large
                } else {
                    &self.pools[r]
                }
            })
            .map(|p| p.hint.lock())
            .collect();
        (guards, h - lo)
    }

    /// `iommu_area_alloc`: a free, aligned run of `nr` entries in `start..limit - 1` that does
    /// not cross a segment boundary. Claims it.
    fn area_alloc(
        &self,
        start: u64,
        limit: u64,
        nr: u64,
        align: u64,
        w: &mut WorkRecord,
    ) -> Option<u64> {
        // We don't want the last of the limit.
        let size = limit.checked_sub(1)?;
        let mut from = start;
        loop {
            let zero = self.bits.map.next_zero(from, size, w);
            // Align the absolute entry number.
            let index = ((zero + self.offset + align - 1) & !(align - 1)) - self.offset;
            let end = index.checked_add(nr)?;
            if end > size {
                return None;
            }
            let busy = self.bits.map.next_set(index, end, w);
            if busy < end {
                from = busy + 1;
                continue;
            }
            let in_seg = (self.offset + index) & (self.boundary - 1);
            if in_seg + nr > self.boundary {
                let next = ((self.offset + index) | (self.boundary - 1)).checked_add(1)?;
                from = next - self.offset;
                continue;
            }
            self.bits.claim(index, nr);
            return Some(index);
        }
    }
}

impl IovaAllocator for PowerPoolAllocator {
    fn name(&self) -> &'static str {
        "power"
    }

    fn granule(&self) -> u64 {
        self.page
    }

    fn range(&self) -> (Iova, Iova) {
        (
            Iova::new((self.offset + 1) << self.page_shift),
            Iova::new((self.offset + self.size) << self.page_shift),
        )
    }

    fn alloc(&self, req: AllocRequest, work: &mut WorkRecord) -> Result<IovaBlock, IovaError> {
        let npages = req.pages;
        if npages == 0 || npages >= self.size {
            work.alloc_failures += 1;
            return Err(IovaError::BadSize { pages: npages });
        }
        // The highest entry the device can reach (Linux `mask`, in entries).
        let limit_entries = req.limit.get() >> self.page_shift;
        if limit_entries <= self.offset + 1 {
            work.alloc_failures += 1;
            return Err(IovaError::LimitTooLow {
                limit: req.limit.get(),
                start: (self.offset + 1) << self.page_shift,
            });
        }
        let mask = limit_entries - 1;
        let align = if req.size_aligned {
            1u64 << order_base_2(npages)
        } else {
            1
        };
        let largealloc = npages > LARGE_ALLOC_PAGES;
        let mut pool_nr = self.pool_for_cpu(req.cpu);
        let mut pool = if largealloc {
            PoolId::Large
        } else {
            PoolId::Small(pool_nr)
        };
        Self::count_lock(work, pool);
        let mut pass = 0usize;
        loop {
            let p = self.pool(pool);
            let mut limit = p.end;
            let mut cur = pool;
            // Peek at the hint; the real locks for this pass are taken below.
            let mut start = *p.hint.lock();
            if start >= limit {
                start = p.start;
            }
            let constrained = limit + self.offset > mask;
            if constrained {
                limit = mask - self.offset + 1;
                if (start & mask) >= limit || pass > 0 {
                    cur = PoolId::Small(0);
                    Self::count_lock(work, cur);
                    start = self.pools[0].start;
                } else {
                    start &= mask;
                }
            }
            let search_end = limit.saturating_sub(1).min(self.size);
            let found = {
                let (mut guards, at) = self.lock_range(cur, start, search_end);
                let found = self.area_alloc(start, limit, npages, align, work);
                let hint = &mut *guards[at];
                match found {
                    Some(n) => {
                        let end = n + npages;
                        *hint = if largealloc {
                            end
                        } else {
                            (end + self.blocksize - 1) & !(self.blocksize - 1)
                        };
                    }
                    None if pass == 0 => *hint = self.pool(cur).start,
                    None => {}
                }
                found
            };
            if let Some(n) = found {
                self.live.fetch_add(1, Ordering::Relaxed);
                return Ok(IovaBlock {
                    start: Iova::new((self.offset + n) << self.page_shift),
                    pages: npages,
                });
            }
            pool = cur;
            if pass == 0 {
                // First try the pool from the start (its hint was reset above).
            } else if pass <= self.nr_pools {
                pool_nr = (pool_nr + 1) & (self.nr_pools - 1);
                pool = PoolId::Small(pool_nr);
                Self::count_lock(work, pool);
                *self.pool(pool).hint.lock() = self.pool(pool).start;
            } else if pass == self.nr_pools + 1 {
                pool = PoolId::Large;
                Self::count_lock(work, pool);
                *self.large.hint.lock() = self.large.start;
            } else {
                work.alloc_failures += 1;
                return Err(IovaError::Exhausted {
                    pages: npages,
                    limit: req.limit.get(),
                });
            }
            pass += 1;
        }
    }

    fn free(&self, block: IovaBlock, cpu: usize, work: &mut WorkRecord) -> Result<(), IovaError> {
        let _ = cpu;
        let err = IovaError::NotAllocated {
            start: block.start.get(),
            pages: block.pages,
        };
        let s = block.start.get();
        if s & (self.page - 1) != 0 || block.pages == 0 {
            return Err(err);
        }
        let Some(e) = (s >> self.page_shift).checked_sub(self.offset) else {
            return Err(err);
        };
        if e == 0 || e >= self.size || block.pages > self.size - e {
            return Err(err);
        }
        let pool = self.pool_of(e);
        Self::count_lock(work, pool);
        let _guard = self.pool(pool).hint.lock();
        if !self.bits.is_block(e, block.pages) {
            return Err(err);
        }
        self.bits.release(e, block.pages);
        self.live.fetch_sub(1, Ordering::Relaxed);
        Ok(())
    }

    fn live_blocks(&self) -> usize {
        self.live.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::addr::{SZ_4K, SZ_64K};
    use crate::iova::test_support::assert_bad_frees_refused;

    const P: u64 = SZ_4K;

    fn small(entries: u64) -> PowerPoolAllocator {
        PowerPoolAllocator::new(PowerPoolConfig::new(Iova::new(0), entries * P, P)).unwrap()
    }

    /// A 1 GiB window of 64 KiB TCEs: 16384 entries, four pools of 3072, large from 12288.
    fn big() -> PowerPoolAllocator {
        PowerPoolAllocator::new(PowerPoolConfig::new(Iova::new(0), SZ_1G, SZ_64K)).unwrap()
    }

    fn req(pages: u64, cpu: usize) -> AllocRequest {
        AllocRequest {
            size_aligned: false,
            ..AllocRequest::new(pages, Iova::new(1 << 48), cpu)
        }
    }

    fn entry(a: &PowerPoolAllocator, b: IovaBlock) -> u64 {
        b.start.get() / a.granule()
    }

    #[test]
    fn small_windows_have_one_pool_and_the_large_pool_on_top() {
        let a = small(1024);

        assert_eq!(a.nr_pools(), 1);
        assert_eq!(a.pool_bounds(), vec![(0, 768), (768, 1024)]);
    }

    #[test]
    fn windows_of_1g_have_four_pools_under_the_large_pool() {
        let a = big();

        assert_eq!(a.nr_pools(), 4);
        assert_eq!(
            a.pool_bounds(),
            vec![
                (0, 3072),
                (3072, 6144),
                (6144, 9216),
                (9216, 12288),
                (12288, 16384)
            ]
        );
    }

    #[test]
    fn cpus_hash_to_pools_with_the_golden_ratio_hash() {
        let a = big();

        let pools: Vec<_> = (0..4).map(|c| a.pool_for_cpu(c)).collect();

        assert_eq!(pools, vec![0, 1, 3, 0]);
    }

    #[test]
    fn first_allocation_lands_at_the_hashed_pools_start() {
        let a = big();
        let mut w = WorkRecord::new();

        let b = a.alloc(req(1, 2), &mut w).unwrap();

        assert_eq!(entry(&a, b), 9216);
        assert_eq!(w.lock_count(LockId::TcePool), 1);
        assert!(w.bitmap_words_scanned >= 1);
    }

    #[test]
    fn entry_zero_is_reserved() {
        let a = small(64);
        let mut w = WorkRecord::new();

        let b = a.alloc(req(1, 0), &mut w).unwrap();

        assert_eq!(entry(&a, b), 1);
    }

    #[test]
    fn hint_moves_to_the_next_16_entry_block() {
        let a = small(1024);
        let mut w = WorkRecord::new();
        a.alloc(req(1, 0), &mut w).unwrap();

        let b = a.alloc(req(3, 0), &mut w).unwrap();

        assert_eq!(entry(&a, b), 16);
        assert_eq!(a.hints()[0], 32);
    }

    #[test]
    fn more_than_15_pages_go_to_the_large_pool_without_rounding_the_hint() {
        let a = big();
        let mut w = WorkRecord::new();

        let b = a.alloc(req(16, 1), &mut w).unwrap();

        assert_eq!(entry(&a, b), 12288);
        assert_eq!(a.hints()[4], 12288 + 16);
        assert_eq!(w.lock_count(LockId::TceLargePool), 1);
        assert_eq!(w.lock_count(LockId::TcePool), 0);
    }

    #[test]
    fn a_full_pool_falls_back_to_the_next_pool() {
        let a = big();
        let mut w = WorkRecord::new();
        // Fill pool 1 (CPU 1) until an allocation lands elsewhere.
        let mut last = a.alloc(req(8, 1), &mut w).unwrap();
        while (3072..6144).contains(&entry(&a, last)) {
            w = WorkRecord::new();
            last = a.alloc(req(8, 1), &mut w).unwrap();
        }

        // Pass 0 from the hint and pass 1 from the start fail; pool 2 is next.
        assert_eq!(entry(&a, last), 6144);
        assert_eq!(w.lock_count(LockId::TcePool), 2);
    }

    #[test]
    fn the_large_pool_is_the_last_resort_for_small_requests() {
        let a = small(64);
        let mut w = WorkRecord::new();
        let mut last = a.alloc(req(4, 0), &mut w).unwrap();
        while entry(&a, last) < 48 {
            w = WorkRecord::new();
            last = a.alloc(req(4, 0), &mut w).unwrap();
        }

        // One pool: hint, start, the "next" pool (itself), then the large pool.
        assert_eq!(entry(&a, last), 48);
        assert_eq!(w.lock_count(LockId::TcePool), 2);
        assert_eq!(w.lock_count(LockId::TceLargePool), 1);
    }

    #[test]
    fn exhaustion_fails_after_every_pool_was_tried() {
        let a = small(64);
        let mut w = WorkRecord::new();
        let mut n = 0;
        while a.alloc(req(1, 0), &mut w).is_ok() {
            n += 1;
        }

        // 64 entries minus entry 0 minus the last entry of each searched range (47 and 63).
        assert_eq!(n, 61);
        assert_eq!(a.live_blocks(), 61);
        assert_eq!(w.alloc_failures, 1);
    }

    #[test]
    fn device_limit_keeps_blocks_below_it() {
        let a = big();
        let mut w = WorkRecord::new();
        let limit = Iova::new(1000 * SZ_64K);

        let b = a.alloc(AllocRequest::new(4, limit, 2), &mut w).unwrap();

        assert!(b.start.get() + 4 * SZ_64K <= limit.get(), "{b:?}");
    }

    #[test]
    fn size_aligned_blocks_are_aligned_in_absolute_iova() {
        let cfg = PowerPoolConfig::new(Iova::new(3 * P), 1024 * P, P);
        let a = PowerPoolAllocator::new(cfg).unwrap();
        let mut w = WorkRecord::new();

        let b = a
            .alloc(AllocRequest::new(3, Iova::new(1 << 40), 0), &mut w)
            .unwrap();

        assert!(b.start.is_aligned(4 * P), "{b:?}");
    }

    #[test]
    fn blocks_do_not_cross_the_segment_boundary() {
        let cfg = PowerPoolConfig {
            segment_boundary: 16 * P,
            ..PowerPoolConfig::new(Iova::new(0), 1024 * P, P)
        };
        let a = PowerPoolAllocator::new(cfg).unwrap();
        let mut w = WorkRecord::new();
        a.alloc(req(10, 0), &mut w).unwrap(); // 1..11, hint 16

        let b1 = a.alloc(req(10, 0), &mut w).unwrap(); // 16..26, hint 32
        let mut w2 = WorkRecord::new();
        let b2 = a.alloc(req(12, 0), &mut w2).unwrap(); // 32..44

        for b in [b1, b2] {
            let e = entry(&a, b);
            assert_eq!(e / 16, (e + b.pages - 1) / 16, "{b:?}");
        }
    }

    #[test]
    fn bad_frees_are_rejected_and_change_nothing() {
        let a = small(1024);
        let mut w = WorkRecord::new();
        let b = a.alloc(req(4, 0), &mut w).unwrap();
        let c = a.alloc(req(4, 0), &mut w).unwrap();
        a.free(b, 0, &mut w).unwrap();

        let bad = [
            b,
            IovaBlock {
                start: c.start,
                pages: 2,
            },
            IovaBlock {
                start: c.start,
                pages: 5,
            },
            IovaBlock {
                start: c.start.add(P),
                pages: 3,
            },
            IovaBlock {
                start: Iova::new(0),
                pages: 1,
            },
            IovaBlock {
                start: Iova::new(1024 * P),
                pages: 1,
            },
        ];
        assert_bad_frees_refused(&a, &bad, &mut w);
        a.free(c, 0, &mut w).unwrap();
        assert_eq!(a.live_blocks(), 0);
    }

    #[test]
    fn adjacent_blocks_free_independently() {
        let a = small(1024);
        let mut w = WorkRecord::new();
        let b = a.alloc(req(16, 0), &mut w).unwrap();
        let c = a.alloc(req(16, 0), &mut w).unwrap();
        assert_eq!(entry(&a, c), entry(&a, b) + 16);

        let merged = IovaBlock {
            start: b.start,
            pages: 32,
        };
        assert!(a.free(merged, 0, &mut w).is_err());
        a.free(b, 0, &mut w).unwrap();
        a.free(c, 0, &mut w).unwrap();
        assert_eq!(a.live_blocks(), 0);
    }

    #[test]
    fn zero_pages_and_too_low_limits_are_rejected() {
        let a = small(1024);
        let mut w = WorkRecord::new();

        assert_eq!(
            a.alloc(req(0, 0), &mut w),
            Err(IovaError::BadSize { pages: 0 })
        );
        let low = a.alloc(AllocRequest::new(1, Iova::new(P), 0), &mut w);
        assert!(matches!(low, Err(IovaError::LimitTooLow { .. })), "{low:?}");
        assert_eq!(a.live_blocks(), 0);
    }

    #[test]
    fn bad_configs_are_errors() {
        let ok = PowerPoolConfig::new(Iova::new(0), 1024 * P, P);
        let bad = [
            PowerPoolConfig {
                tce_page_size: 1000,
                ..ok
            },
            PowerPoolConfig {
                window_size: 1024 * P + 1,
                ..ok
            },
            PowerPoolConfig {
                window_start: Iova::new(5),
                ..ok
            },
            PowerPoolConfig {
                window_size: 4 * P,
                ..ok
            },
            PowerPoolConfig {
                block_size: 3,
                ..ok
            },
            PowerPoolConfig {
                segment_boundary: 3,
                ..ok
            },
        ];
        for c in bad {
            assert!(PowerPoolAllocator::new(c).is_err(), "{c:?}");
        }
    }
}
