//! Per-CPU IOVA magazine caches over any allocator (Linux "rcache", after Peleg et al.,
//! USENIX ATC'15).
//!
//! Requests of up to [`MAX_CACHED_PAGES`] pages are rounded up to a power of two and served
//! from one of six size classes (1, 2, 4, 8, 16, 32 pages). Each class has, per CPU, a
//! `loaded` and a `prev` magazine of [`MAGAZINE_SIZE`] ranges behind a per-CPU lock
//! ([`LockId::RcacheCpu`]), and a shared depot of full magazines behind its own lock
//! ([`LockId::RcacheDepot`]). The ranges in the caches stay allocated in the inner allocator.
//!
//! - **alloc**: `loaded` non-empty: take the last range that fits below the limit (a hit; if
//!   none fits, a miss); else `prev` non-empty: swap and take; else a full magazine from the
//!   depot replaces the empty `loaded` (a depot exchange); else a miss: the inner allocator is
//!   asked for the rounded size, size-aligned (as Linux's fast path always is). Bigger requests
//!   go straight to the inner allocator. If the inner allocator is exhausted, every CPU's
//!   magazines and the depots are flushed back to it once (`rcache_flushes`) and the request
//!   is retried once (Linux `alloc_iova_fast`).
//! - **free**: `loaded` not full: push; else `prev` empty: swap and push; else `loaded` goes to
//!   the depot (a depot exchange) and a new empty magazine takes its place.
//!
//! The per-CPU lock is a small spin lock (as Linux's `spin_lock_irqsave`) whose release is a
//! plain store, and the magazines it guards are arrays of atomics accessed with relaxed loads
//! and stores, so a hit costs one atomic read-modify-write for the lock and two for the live
//! set below, with no unsafe code. Each CPU's state sits on its own cache lines. Swapping
//! `loaded` and `prev` flips an index; depot exchanges copy a magazine.
//!
//! # Depot trimming
//!
//! Linux trims each depot by one magazine every 100 ms while it holds more magazines than there
//! are online CPUs. There is no time here, so [`MagazineConfig::eager_depot_trim`] chooses:
//!
//! - `true` (the default): a push that would take a depot past `ncpus` magazines frees the
//!   pushed magazine's ranges to the inner allocator instead. The depot is a stack and the
//!   trim pops its top, so this is exactly Linux's push followed by one trim, without the delay.
//! - `false`: the depot keeps growing (up to [`MagazineConfig::max_depot`] magazines, a bound
//!   on state; past it the pushed magazine is freed) and the caller runs
//!   [`MagazineCache::trim_depot`] as its 100 ms timer.
//!
//! # Depot designs
//!
//! [`MagazineConfig::depot`] chooses between today's scalable depot ([`DepotKind::Scalable`],
//! Linux 6.7 and later, the default, trimmed as above) and the fixed array of 32 magazines per
//! size class that Linux used from 4.19 to 6.6 ([`DepotKind::Bounded`]): once that array is
//! full, every further magazine a CPU gives up goes back to the tree, whatever the CPU count,
//! so with many CPUs freeing on other CPUs than they allocate on, far more ranges go back to
//! the tree and come out of it again. [`MagazineConfig::exhaustion_flush`] chooses whether an
//! exhausted inner allocator makes the retry flush the depots as well (Linux 5.11 and later,
//! the default) or only the CPUs' magazines (before 5.11). `crate::linux` maps a kernel
//! version to these choices.
//!
//! # Checking frees
//!
//! Linux trusts the caller of `free_iova_fast`. Here a free of a range that is not live returns
//! [`IovaError::NotAllocated`], so the cache keeps a lock-free set of the small ranges it has
//! handed out (two atomic read-modify-writes per alloc and per free: the range's bit in a
//! bitmap leaf, or a hash-table slot, and the live count). It has room for twice
//! [`MagazineConfig::max_live`] live small ranges (rounded up to a power of two); past that,
//! allocations fail with [`IovaError::Exhausted`]. Its atomics are not counted as locks
//! (Linux has no such table). Large ranges are checked by the inner allocator. Setting
//! [`MagazineConfig::check_frees`] to `false` drops the table and trusts frees as Linux does.
//!
//! On the 2-core AMD EPYC build machine (`iolab bench --filter iova_alloc_free/magazine`, an
//! alloc plus its free with the check), a pair takes about 25 ns with no other range live,
//! 31-35 ns with 10,000 live and 70-80 ns with 100,000 (the bitmap leaves' directory probe
//! costs about 3 ns at the first against the hash table alone, which took 22, 35-42 and 93-167
//! ns; docs/PERFORMANCE.md, "The magazine cache's live set").
//!
//! # Work counted
//!
//! `magazine_hits` and `magazine_misses` count requests of cacheable size served from a
//! magazine or passed to the inner allocator; bigger requests count as neither.
//! `depot_exchanges` counts magazines taken from or given to a depot. Flushed or trimmed
//! magazines go back to the inner allocator with [`IovaAllocator::free_batch`] (one tree lock
//! per magazine, as `iova_magazine_free_pfns`). The inner allocator counts its own work,
//! failures included.

use crate::addr::Iova;
use crate::iova::linux::{order_base_2, IovaConfigError};
use crate::iova::{AllocRequest, IovaAllocator, IovaBlock, IovaError};
use crate::work::{LockId, WorkRecord};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

/// Ranges per magazine (Linux `IOVA_MAG_SIZE`).
pub const MAGAZINE_SIZE: usize = 127;
/// Number of size classes (1, 2, 4, 8, 16 and 32 pages).
pub const SIZE_CLASSES: usize = 6;
/// The largest request, in pages, that the caches serve.
pub const MAX_CACHED_PAGES: u64 = 1 << (SIZE_CLASSES - 1);
/// Largest number of CPUs a cache accepts.
pub const MAX_CPUS: usize = 4096;
/// Largest `max_live` accepted.
pub const MAX_LIVE_CACHED: usize = 1 << 26;

/// Linux's fixed depot size before 6.7 (`MAX_GLOBAL_MAGS`, full magazines per size class).
pub const LINUX_MAX_GLOBAL_MAGS: usize = 32;

/// Which depot design holds the full magazines of a size class.
///
/// Both keep full magazines only and exchange them whole with the per-CPU caches; they differ
/// in what bounds the depot and in what happens to a magazine pushed past the bound.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum DepotKind {
    /// Linux 6.7 and later (the default): a list with no fixed size, trimmed towards one
    /// magazine per CPU ("iommu/iova: Make the rcache depot scale better" and "iommu/iova:
    /// Manage the depot list size", Robin Murphy, v6.7). How the trim is modelled is chosen by
    /// [`MagazineConfig::eager_depot_trim`] (module docs, "Depot trimming").
    #[default]
    Scalable,
    /// Linux 4.19 to 6.6: a fixed array of `max_magazines` full magazines per size class
    /// (`MAX_GLOBAL_MAGS`, [`LINUX_MAX_GLOBAL_MAGS`] = 32) whatever the CPU count. A CPU that
    /// must give up its full `loaded` magazine while the depot is full frees that magazine's
    /// ranges to the inner allocator (`mag_to_free` in `__iova_rcache_insert`, one tree lock
    /// for the magazine). There is no timer: [`MagazineCache::trim_depot`] does nothing.
    Bounded {
        /// Full magazines the depot holds (Linux: 32), at least 1.
        max_magazines: usize,
    },
}

impl DepotKind {
    /// Linux's depot before 6.7: 32 magazines per size class.
    pub const LINUX_BOUNDED: DepotKind = DepotKind::Bounded {
        max_magazines: LINUX_MAX_GLOBAL_MAGS,
    };
}

/// What an allocation that finds the inner allocator exhausted gives back before its one retry
/// (`alloc_iova_fast` with `flush_rcache`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ExhaustionFlush {
    /// Every CPU's magazines, then every depot (the default; Linux 5.11 and later: "iommu/iova:
    /// Free global iova rcache on iova alloc failure", Vijayanand Jitta, v5.11).
    #[default]
    CpusAndDepots,
    /// Every CPU's magazines only; full magazines in the depots stay cached (Linux 4.19 to
    /// 5.10, `free_cpu_cached_iovas` for each online CPU).
    CpusOnly,
}

/// Configuration of a [`MagazineCache`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MagazineConfig {
    /// Number of CPUs (1..=[`MAX_CPUS`]). A request's CPU index is taken modulo this.
    pub ncpus: usize,
    /// Trim depots when pushing rather than by [`MagazineCache::trim_depot`]. See the module
    /// docs.
    pub eager_depot_trim: bool,
    /// Hard cap on magazines per depot (at least `ncpus`); only reached without eager trims.
    pub max_depot: usize,
    /// Small (at most 32-page) ranges that can be live at once through the cache (at least 1).
    pub max_live: usize,
    /// Check frees against a table of live small ranges (the default). Without it, frees are
    /// trusted as in Linux: a double free is not detected and the range can be handed out
    /// twice. The check costs four atomic read-modify-writes per alloc/free pair.
    pub check_frees: bool,
    /// The depot design (default: today's scalable depot).
    pub depot: DepotKind,
    /// What exhaustion flushes before the retry (default: CPUs and depots).
    pub exhaustion_flush: ExhaustionFlush,
}

impl MagazineConfig {
    /// Defaults for `ncpus` CPUs: eager trimming, a depot cap of 64 magazines per CPU and
    /// room for 32K live small ranges.
    pub fn new(ncpus: usize) -> Self {
        Self {
            ncpus,
            eager_depot_trim: true,
            max_depot: ncpus.saturating_mul(64),
            max_live: 1 << 15,
            check_frees: true,
            depot: DepotKind::Scalable,
            exhaustion_flush: ExhaustionFlush::CpusAndDepots,
        }
    }
}

/// A full magazine in a depot.
type FullMagazine = Box<[u64; MAGAZINE_SIZE]>;

/// A test-and-set spin lock whose release is a plain store. It guards only atomics, so it
/// needs no unsafe code: it provides ordering and exclusion, the atomics provide soundness.
#[derive(Debug, Default)]
struct SpinFlag(AtomicBool);

/// Holds a [`SpinFlag`]; releases it on drop.
struct SpinGuard<'a>(&'a SpinFlag);

impl SpinFlag {
    #[inline(always)]
    fn lock(&self) -> SpinGuard<'_> {
        if self
            .0
            .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            self.lock_slow();
        }
        SpinGuard(self)
    }

    #[cold]
    fn lock_slow(&self) {
        let mut spins = 0u32;
        loop {
            while self.0.load(Ordering::Relaxed) {
                if spins < 100 {
                    spins += 1;
                    std::hint::spin_loop();
                } else {
                    // The holder may have been preempted on a shared machine.
                    std::thread::yield_now();
                }
            }
            if self
                .0
                .compare_exchange_weak(false, true, Ordering::Acquire, Ordering::Relaxed)
                .is_ok()
            {
                return;
            }
        }
    }
}

impl Drop for SpinGuard<'_> {
    #[inline]
    fn drop(&mut self) {
        self.0 .0.store(false, Ordering::Release);
    }
}

/// One CPU's `loaded` and `prev` magazines of one size class, behind its lock, on its own
/// cache lines. Magazine `loaded` is `mags[loaded]`, `prev` is the other one. All fields
/// other than `lock` are read and written only with the lock held.
///
/// `repr(C)` keeps the lock, `loaded` and the sizes together on the slot's first cache line
/// (Rust's own layout put them after the magazines, astride two lines), so a hit touches
/// that line and the magazine entry's.
#[derive(Debug)]
#[repr(C, align(128))]
struct CpuSlot {
    lock: SpinFlag,
    loaded: AtomicUsize,
    sizes: [AtomicUsize; 2],
    mags: [[AtomicU64; MAGAZINE_SIZE]; 2],
}

impl CpuSlot {
    fn new() -> Self {
        Self {
            lock: SpinFlag::default(),
            loaded: AtomicUsize::new(0),
            sizes: [AtomicUsize::new(0), AtomicUsize::new(0)],
            mags: std::array::from_fn(|_| std::array::from_fn(|_| AtomicU64::new(0))),
        }
    }

    #[inline]
    fn get(a: &AtomicUsize) -> usize {
        a.load(Ordering::Relaxed)
    }

    #[inline]
    fn set(a: &AtomicUsize, v: usize) {
        a.store(v, Ordering::Relaxed);
    }

    /// Swaps `loaded` and `prev`.
    #[inline(always)]
    fn swap(&self, _g: &SpinGuard<'_>) {
        Self::set(&self.loaded, 1 - Self::get(&self.loaded));
    }

    /// Which magazine is `loaded`, and its size.
    #[inline(always)]
    fn loaded(&self, _g: &SpinGuard<'_>) -> (usize, usize) {
        let l = Self::get(&self.loaded);
        (l, Self::get(&self.sizes[l]))
    }

    /// Takes the last start of magazine `l` (of `size` ranges) that is at most `max_start`
    /// (`iova_magazine_pop`).
    #[inline(always)]
    fn pop(&self, _g: &SpinGuard<'_>, (l, size): (usize, usize), max_start: u64) -> Option<u64> {
        let mag = &self.mags[l];
        let mut i = size.min(MAGAZINE_SIZE);
        while i > 0 {
            i -= 1;
            let s = mag[i].load(Ordering::Relaxed);
            if s <= max_start {
                let last = mag[size - 1].load(Ordering::Relaxed);
                mag[i].store(last, Ordering::Relaxed);
                Self::set(&self.sizes[l], size - 1);
                return Some(s);
            }
        }
        None
    }

    /// Pushes onto magazine `l` (of `size < MAGAZINE_SIZE` ranges).
    #[inline(always)]
    fn push(&self, _g: &SpinGuard<'_>, (l, size): (usize, usize), start: u64) {
        self.mags[l][size].store(start, Ordering::Relaxed);
        Self::set(&self.sizes[l], size + 1);
    }

    /// Sizes of `(loaded, prev)`.
    #[inline(always)]
    fn sizes(&self, _g: &SpinGuard<'_>) -> (usize, usize) {
        let l = Self::get(&self.loaded);
        (Self::get(&self.sizes[l]), Self::get(&self.sizes[1 - l]))
    }

    /// Replaces the (empty) `loaded` magazine with a full one from the depot.
    fn load_full(&self, _g: &SpinGuard<'_>, full: &[u64; MAGAZINE_SIZE]) {
        let l = Self::get(&self.loaded);
        for (slot, &s) in self.mags[l].iter().zip(full.iter()) {
            slot.store(s, Ordering::Relaxed);
        }
        Self::set(&self.sizes[l], MAGAZINE_SIZE);
    }

    /// Takes the full `loaded` magazine out, leaving an empty one.
    fn take_full(&self, _g: &SpinGuard<'_>) -> FullMagazine {
        let l = Self::get(&self.loaded);
        let full = Box::new(std::array::from_fn(|i| {
            self.mags[l][i].load(Ordering::Relaxed)
        }));
        Self::set(&self.sizes[l], 0);
        full
    }

    /// Empties both magazines into `out` as blocks of `pages` pages.
    fn drain_into(&self, _g: &SpinGuard<'_>, pages: u64, out: &mut Vec<IovaBlock>) {
        for (mag, size) in self.mags.iter().zip(self.sizes.iter()) {
            let n = Self::get(size);
            out.extend(mag[..n].iter().map(|s| IovaBlock {
                start: Iova::new(s.load(Ordering::Relaxed)),
                pages,
            }));
            Self::set(size, 0);
        }
    }
}

/// A size class's depot of full magazines, on its own cache lines.
///
/// `len` mirrors the number of magazines, stored under the lock by [`DepotGuard`]'s drop, so a
/// CPU whose magazines are both empty can see an empty depot without taking the lock (with
/// many CPUs, most misses). Such a look counts the depot lock all the same: Linux takes it.
#[derive(Debug)]
#[repr(align(128))]
struct Depot {
    mags: Mutex<Vec<FullMagazine>>,
    len: AtomicUsize,
}

/// The locked magazines of a [`Depot`]; publishes their number on release.
struct DepotGuard<'a> {
    len: &'a AtomicUsize,
    mags: parking_lot::MutexGuard<'a, Vec<FullMagazine>>,
}

impl Depot {
    fn new() -> Self {
        Self {
            mags: Mutex::new(Vec::new()),
            len: AtomicUsize::new(0),
        }
    }

    fn lock(&self) -> DepotGuard<'_> {
        DepotGuard {
            len: &self.len,
            mags: self.mags.lock(),
        }
    }

    /// No magazine, as last published under the lock. A push racing with this look may be
    /// missed, as if the look came just before it.
    #[inline(always)]
    fn looks_empty(&self) -> bool {
        self.len.load(Ordering::Acquire) == 0
    }
}

impl std::ops::Deref for DepotGuard<'_> {
    type Target = Vec<FullMagazine>;
    fn deref(&self) -> &Self::Target {
        &self.mags
    }
}

impl std::ops::DerefMut for DepotGuard<'_> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.mags
    }
}

impl Drop for DepotGuard<'_> {
    fn drop(&mut self) {
        // Still under the lock: the mutex guard drops after this.
        self.len.store(self.mags.len(), Ordering::Release);
    }
}

/// One size class: per-CPU caches and the depot.
#[derive(Debug)]
struct Rcache {
    cpus: Box<[CpuSlot]>,
    depot: Depot,
}

fn blocks_of(mag: &[u64; MAGAZINE_SIZE], pages: u64) -> Vec<IovaBlock> {
    mag.iter()
        .map(|&s| IovaBlock {
            start: Iova::new(s),
            pages,
        })
        .collect()
}

const EMPTY: u64 = 0;
const TOMBSTONE: u64 = u64::MAX;

/// Bits of a range start's page number that index within one [`LiveSet`] bitmap leaf.
const LEAF_BITS: u32 = 12;
/// A bitmap leaf: one bit per page of `1 << LEAF_BITS` consecutive pages, for one size
/// class (512 bytes).
type Leaf = [AtomicU64; 1 << (LEAF_BITS - 6)];
/// Slots of a [`LiveSet`]'s leaf directory (a bound on the bitmap's memory: 256 KiB).
const LEAF_SLOTS: usize = 512;

/// A lock-free set of live small ranges with room for a fixed number of keys.
///
/// Keys are `start | class`: starts are granule-aligned (granule >= 8) and never 0, so a key
/// is never [`EMPTY`] or [`TOMBSTONE`].
///
/// Most keys are bits in bitmap leaves, one leaf per size class and aligned run of
/// `1 << LEAF_BITS` pages, found through a small directory: the ranges an allocator hands
/// out cluster (Linux's allocates downwards from the top), so the bits of thousands of live
/// ranges share a few kilobytes that stay in the host's caches, where a hash table spreads
/// them over its whole size (a cache miss at every alloc and free once the table outgrows
/// the L2, as with 256 CPUs x 32 I/Os in flight). The directory never forgets a leaf; once
/// a leaf's probe sequence is full, keys of leaves not in it go to `table`, a fixed-size
/// hash set (open addressing, linear probing), so a key is always looked for where it was
/// put. `count` bounds the set at `table`'s size, the number of keys the hash set alone
/// held before an insert failed.
#[derive(Debug)]
struct LiveSet {
    /// Directory tags: `(leaf number << 3 | class) + 1`, or 0 for a free slot.
    tags: Box<[AtomicU64]>,
    /// The leaf of each directory slot, created by the first key that claims the slot.
    leaves: Box<[std::sync::OnceLock<Box<Leaf>>]>,
    table: Box<[AtomicU64]>,
    mask: usize,
    shift: u32,
    hash_shift: u32,
    /// Live keys, at most `table.len()`.
    count: AtomicUsize,
}

impl LiveSet {
    fn new(max_live: usize, granule: u64) -> Self {
        let len = (max_live * 2).next_power_of_two().max(2);
        Self {
            tags: (0..LEAF_SLOTS).map(|_| AtomicU64::new(0)).collect(),
            leaves: (0..LEAF_SLOTS)
                .map(|_| std::sync::OnceLock::new())
                .collect(),
            table: (0..len).map(|_| AtomicU64::new(EMPTY)).collect(),
            mask: len - 1,
            shift: granule.trailing_zeros(),
            hash_shift: 64 - len.trailing_zeros(),
            count: AtomicUsize::new(0),
        }
    }

    #[inline(always)]
    fn home(&self, key: u64) -> usize {
        ((key >> self.shift).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> self.hash_shift) as usize
    }

    /// The leaf holding `key`'s bit, and the bit's word and mask; with `claim`, a slot is
    /// claimed for the leaf if it has none yet. `None`: the key lives in `table`.
    #[inline(always)]
    fn leaf(&self, key: u64, claim: bool) -> Option<(&AtomicU64, u64)> {
        let page = key >> self.shift;
        let tag = ((page >> LEAF_BITS) << 3 | (key & 7)) + 1;
        let home = (tag.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - LEAF_SLOTS.trailing_zeros()))
            as usize;
        for step in 0..LEAF_SLOTS {
            let i = (home + step) & (LEAF_SLOTS - 1);
            let mut t = self.tags[i].load(Ordering::Acquire);
            if t == 0 {
                if !claim {
                    return None;
                }
                t = match self.tags[i].compare_exchange(0, tag, Ordering::AcqRel, Ordering::Acquire)
                {
                    Ok(_) => tag,
                    Err(now) => now,
                };
            }
            if t == tag {
                let leaf = self.leaves[i]
                    .get_or_init(|| Box::new(std::array::from_fn(|_| AtomicU64::new(0))));
                let bit = page & ((1 << LEAF_BITS) - 1);
                return Some((&leaf[(bit >> 6) as usize], 1 << (bit & 63)));
            }
        }
        None
    }

    /// Adds a key that is not present. False if the set is full.
    #[inline(always)]
    fn insert(&self, key: u64) -> bool {
        if self.count.fetch_add(1, Ordering::AcqRel) >= self.table.len() {
            self.count.fetch_sub(1, Ordering::AcqRel);
            return false;
        }
        if let Some((word, bit)) = self.leaf(key, true) {
            let was = word.fetch_or(bit, Ordering::AcqRel);
            debug_assert!(was & bit == 0, "live key inserted again");
            return true;
        }
        self.table_insert(key)
    }

    /// Removes a key. False if it is not present.
    #[inline(always)]
    fn remove(&self, key: u64) -> bool {
        let removed = match self.leaf(key, false) {
            Some((word, bit)) => word.fetch_and(!bit, Ordering::AcqRel) & bit != 0,
            None => self.table_remove(key),
        };
        if removed {
            self.count.fetch_sub(1, Ordering::AcqRel);
        }
        removed
    }

    /// Adds a key to the hash set (which has room: `count` is at most its size).
    #[cold]
    #[inline(never)]
    fn table_insert(&self, key: u64) -> bool {
        let mut i = self.home(key);
        for _ in 0..self.table.len() {
            let slot = &self.table[i];
            let mut v = slot.load(Ordering::Relaxed);
            while v == EMPTY || v == TOMBSTONE {
                match slot.compare_exchange_weak(v, key, Ordering::AcqRel, Ordering::Relaxed) {
                    Ok(_) => return true,
                    Err(now) => v = now,
                }
            }
            i = (i + 1) & self.mask;
        }
        self.count.fetch_sub(1, Ordering::AcqRel);
        false
    }

    /// Removes a key from the hash set. False if it is not present.
    #[cold]
    #[inline(never)]
    fn table_remove(&self, key: u64) -> bool {
        let mut i = self.home(key);
        for _ in 0..self.table.len() {
            let slot = &self.table[i];
            let v = slot.load(Ordering::Acquire);
            if v == key {
                // A failed exchange: someone else removed it at the same moment.
                return slot
                    .compare_exchange(key, TOMBSTONE, Ordering::AcqRel, Ordering::Relaxed)
                    .is_ok();
            }
            if v == EMPTY {
                return false;
            }
            i = (i + 1) & self.mask;
        }
        false
    }
}

/// Per-CPU magazine caches over an inner allocator. See the module docs.
#[derive(Debug)]
pub struct MagazineCache<A: IovaAllocator> {
    inner: A,
    granule: u64,
    ncpus: usize,
    eager_trim: bool,
    max_depot: usize,
    depot_kind: DepotKind,
    exhaustion_flush: ExhaustionFlush,
    rcaches: [Rcache; SIZE_CLASSES],
    live: LiveSet,
    check_frees: bool,
}

impl<A: IovaAllocator> MagazineCache<A> {
    /// Wraps `inner` with empty caches.
    pub fn new(inner: A, config: MagazineConfig) -> Result<Self, IovaConfigError> {
        if config.ncpus == 0 || config.ncpus > MAX_CPUS {
            return Err(IovaConfigError::OutOfBounds {
                field: "ncpus",
                value: config.ncpus as u64,
                min: 1,
                max: MAX_CPUS as u64,
            });
        }
        if config.max_depot < config.ncpus || config.max_depot > MAX_CPUS * 1024 {
            return Err(IovaConfigError::OutOfBounds {
                field: "max_depot",
                value: config.max_depot as u64,
                min: config.ncpus as u64,
                max: (MAX_CPUS * 1024) as u64,
            });
        }
        if let DepotKind::Bounded { max_magazines } = config.depot {
            if max_magazines == 0 || max_magazines > MAX_CPUS * 1024 {
                return Err(IovaConfigError::OutOfBounds {
                    field: "depot.max_magazines",
                    value: max_magazines as u64,
                    min: 1,
                    max: (MAX_CPUS * 1024) as u64,
                });
            }
        }
        if config.max_live == 0 || config.max_live > MAX_LIVE_CACHED {
            return Err(IovaConfigError::OutOfBounds {
                field: "max_live",
                value: config.max_live as u64,
                min: 1,
                max: MAX_LIVE_CACHED as u64,
            });
        }
        let granule = inner.granule();
        if !granule.is_power_of_two() || granule < 8 {
            return Err(IovaConfigError::BadPageSize {
                size: granule,
                min: 8,
                max: 1 << 63,
            });
        }
        let rcaches = std::array::from_fn(|_| Rcache {
            cpus: (0..config.ncpus).map(|_| CpuSlot::new()).collect(),
            depot: Depot::new(),
        });
        Ok(Self {
            live: LiveSet::new(
                if config.check_frees {
                    config.max_live
                } else {
                    1
                },
                granule,
            ),
            check_frees: config.check_frees,
            inner,
            granule,
            ncpus: config.ncpus,
            eager_trim: config.eager_depot_trim,
            max_depot: config.max_depot,
            depot_kind: config.depot,
            exhaustion_flush: config.exhaustion_flush,
            rcaches,
        })
    }

    /// The allocator underneath.
    pub fn inner(&self) -> &A {
        &self.inner
    }

    /// Number of CPUs the caches are built for.
    pub fn ncpus(&self) -> usize {
        self.ncpus
    }

    /// Ranges sitting in magazines and depots (allocated in the inner allocator, free here).
    pub fn cached_ranges(&self) -> usize {
        let mut n = 0;
        for rc in &self.rcaches {
            for slot in rc.cpus.iter() {
                let g = slot.lock.lock();
                let (l, p) = slot.sizes(&g);
                n += l + p;
            }
            n += rc.depot.lock().len() * MAGAZINE_SIZE;
        }
        n
    }

    /// Magazines in each size class's depot, smallest class first.
    pub fn depot_lens(&self) -> [usize; SIZE_CLASSES] {
        std::array::from_fn(|i| self.rcaches[i].depot.lock().len())
    }

    /// One tick of Linux's 100 ms depot timer: every depot holding more than `ncpus`
    /// magazines gives its top magazine's ranges back to the inner allocator. Returns the
    /// number of magazines trimmed.
    ///
    /// A [`DepotKind::Bounded`] depot has no timer in Linux: this returns 0 and takes no lock.
    pub fn trim_depot(&self, work: &mut WorkRecord) -> usize {
        if matches!(self.depot_kind, DepotKind::Bounded { .. }) {
            return 0;
        }
        let mut trimmed = 0;
        for (class, rc) in self.rcaches.iter().enumerate() {
            work.lock(LockId::RcacheDepot);
            let mag = {
                let mut depot = rc.depot.lock();
                if depot.len() > self.ncpus {
                    depot.pop()
                } else {
                    None
                }
            };
            if let Some(mag) = mag {
                self.inner.free_batch(&blocks_of(&mag, 1 << class), 0, work);
                trimmed += 1;
            }
        }
        trimmed
    }

    /// Gives every cached range back to the inner allocator: each CPU's magazines
    /// (`free_cpu_cached_iovas`), then, if `depots`, the depots (`free_global_cached_iovas`).
    fn flush_all(&self, depots: bool, work: &mut WorkRecord) {
        let mut blocks = Vec::new();
        for (class, rc) in self.rcaches.iter().enumerate() {
            let pages = 1u64 << class;
            for (cpu, slot) in rc.cpus.iter().enumerate() {
                work.lock(LockId::RcacheCpu);
                let g = slot.lock.lock();
                blocks.clear();
                slot.drain_into(&g, pages, &mut blocks);
                if !blocks.is_empty() {
                    self.inner.free_batch(&blocks, cpu, work);
                }
            }
            if !depots {
                continue;
            }
            work.lock(LockId::RcacheDepot);
            let mags = std::mem::take(&mut *rc.depot.lock());
            for mag in mags {
                self.inner.free_batch(&blocks_of(&mag, pages), 0, work);
            }
        }
    }

    /// `__iova_rcache_get`: a cached start at most `max_start`, or `None`.
    #[inline(always)]
    fn cache_get(
        &self,
        class: usize,
        cpu: usize,
        max_start: u64,
        w: &mut WorkRecord,
    ) -> Option<u64> {
        let slot = &self.rcaches[class].cpus[cpu];
        w.lock(LockId::RcacheCpu);
        let g = slot.lock.lock();
        let loaded = slot.loaded(&g);
        if loaded.1 == 0 {
            if slot.sizes(&g).1 == 0 && self.rcaches[class].depot.looks_empty() {
                // Both magazines and the depot empty: a miss, after the depot lock.
                w.lock(LockId::RcacheDepot);
                return None;
            }
            return self.cache_get_refill(class, slot, &g, max_start, w);
        }
        slot.pop(&g, loaded, max_start)
    }

    /// The rest of `__iova_rcache_get` when `loaded` is empty: swap in `prev`, or take a full
    /// magazine from the depot.
    #[cold]
    #[inline(never)]
    fn cache_get_refill(
        &self,
        class: usize,
        slot: &CpuSlot,
        g: &SpinGuard<'_>,
        max_start: u64,
        w: &mut WorkRecord,
    ) -> Option<u64> {
        if slot.sizes(g).1 != 0 {
            slot.swap(g);
        } else {
            w.lock(LockId::RcacheDepot);
            let full = self.rcaches[class].depot.lock().pop()?;
            w.depot_exchanges += 1;
            slot.load_full(g, &full);
        }
        slot.pop(g, slot.loaded(g), max_start)
    }

    /// `__iova_rcache_insert`. Always succeeds; a magazine pushed out of a full depot comes
    /// back to be freed to the inner allocator.
    #[inline(always)]
    fn cache_put(
        &self,
        class: usize,
        cpu: usize,
        start: u64,
        w: &mut WorkRecord,
    ) -> Option<FullMagazine> {
        let slot = &self.rcaches[class].cpus[cpu];
        w.lock(LockId::RcacheCpu);
        let g = slot.lock.lock();
        let loaded = slot.loaded(&g);
        if loaded.1 >= MAGAZINE_SIZE {
            return self.cache_put_full(class, slot, &g, start, w);
        }
        slot.push(&g, loaded, start);
        None
    }

    /// The rest of `__iova_rcache_insert` when `loaded` is full: swap with an empty `prev`,
    /// or move `loaded` to the depot (or out, if the depot is at its cap: the bounded depot's
    /// size, or the scalable depot's eager trim or hard cap).
    #[cold]
    #[inline(never)]
    fn cache_put_full(
        &self,
        class: usize,
        slot: &CpuSlot,
        g: &SpinGuard<'_>,
        start: u64,
        w: &mut WorkRecord,
    ) -> Option<FullMagazine> {
        let mut overflow = None;
        if slot.sizes(g).1 == 0 {
            slot.swap(g);
        } else {
            let full = slot.take_full(g);
            w.lock(LockId::RcacheDepot);
            let mut depot = self.rcaches[class].depot.lock();
            let cap = match self.depot_kind {
                DepotKind::Bounded { max_magazines } => max_magazines,
                DepotKind::Scalable if self.eager_trim => self.ncpus,
                DepotKind::Scalable => self.max_depot,
            };
            if depot.len() < cap {
                depot.push(full);
                w.depot_exchanges += 1;
            } else {
                overflow = Some(full);
            }
        }
        slot.push(g, slot.loaded(g), start);
        overflow
    }

    /// A cache hit whose range could not be entered in the full live table: put it back, fail.
    #[cold]
    #[inline(never)]
    fn alloc_table_full(
        &self,
        req: AllocRequest,
        class: usize,
        cpu: usize,
        start: u64,
        w: &mut WorkRecord,
    ) -> Result<IovaBlock, IovaError> {
        if let Some(mag) = self.cache_put(class, cpu, start, w) {
            self.free_magazine(&mag, 1 << class, req.cpu, w);
        }
        w.alloc_failures += 1;
        Err(IovaError::Exhausted {
            pages: 1 << class,
            limit: req.limit.get(),
        })
    }

    /// An allocation: the hit path inline, everything else out of line so this stays small;
    /// `flush`: whether an exhausted inner allocator is retried after flushing the caches.
    /// Inlined into both callers (a call layer less per allocation).
    #[inline(always)]
    fn alloc_flushing(
        &self,
        req: AllocRequest,
        flush: bool,
        work: &mut WorkRecord,
    ) -> Result<IovaBlock, IovaError> {
        if req.pages.wrapping_sub(1) < MAX_CACHED_PAGES {
            let class = order_base_2(req.pages) as usize;
            let bytes = self.granule << class;
            if let Some(max_start) = req.limit.get().checked_sub(bytes) {
                let cpu = self.cpu_index(req.cpu);
                if let Some(start) = self.cache_get(class, cpu, max_start, work) {
                    if !self.check_frees || self.live.insert(Self::key(start, class)) {
                        work.magazine_hits += 1;
                        return Ok(IovaBlock {
                            start: Iova::new(start),
                            pages: 1 << class,
                        });
                    }
                    return self.alloc_table_full(req, class, cpu, start, work);
                }
            }
        }
        self.alloc_slow(req, flush, work)
    }

    /// Everything but a hit: bad sizes, large requests, misses.
    #[cold]
    #[inline(never)]
    fn alloc_slow(
        &self,
        req: AllocRequest,
        flush: bool,
        w: &mut WorkRecord,
    ) -> Result<IovaBlock, IovaError> {
        if req.pages == 0 {
            w.alloc_failures += 1;
            return Err(IovaError::BadSize { pages: 0 });
        }
        if req.pages > MAX_CACHED_PAGES {
            return self.inner_alloc(req, flush, w);
        }
        let class = order_base_2(req.pages) as usize;
        let pages = 1u64 << class;
        w.magazine_misses += 1;
        let inner_req = AllocRequest {
            pages,
            limit: req.limit,
            size_aligned: true,
            cpu: req.cpu,
        };
        let b = self.inner_alloc(inner_req, flush, w)?;
        if !self.check_frees || self.live.insert(Self::key(b.start.get(), class)) {
            Ok(b)
        } else {
            let _ = self.inner.free(b, req.cpu, w);
            w.alloc_failures += 1;
            Err(IovaError::Exhausted {
                pages,
                limit: req.limit.get(),
            })
        }
    }

    /// Frees of large ranges and of ranges that cannot be cached ones.
    #[cold]
    #[inline(never)]
    fn free_slow(&self, block: IovaBlock, cpu: usize, w: &mut WorkRecord) -> Result<(), IovaError> {
        if block.pages > MAX_CACHED_PAGES {
            return self.inner.free(block, cpu, w);
        }
        Err(IovaError::NotAllocated {
            start: block.start.get(),
            pages: block.pages,
        })
    }

    /// Returns a magazine's ranges to the inner allocator.
    #[cold]
    #[inline(never)]
    fn free_magazine(
        &self,
        mag: &[u64; MAGAZINE_SIZE],
        pages: u64,
        cpu: usize,
        w: &mut WorkRecord,
    ) {
        self.inner.free_batch(&blocks_of(mag, pages), cpu, w);
    }

    /// The cache slot for a CPU index (modulo the CPU count, without a division in the
    /// common case).
    #[inline(always)]
    fn cpu_index(&self, cpu: usize) -> usize {
        if cpu < self.ncpus {
            cpu
        } else {
            cpu % self.ncpus
        }
    }

    #[inline(always)]
    fn key(start: u64, class: usize) -> u64 {
        start | class as u64
    }

    /// Inner allocation with Linux's flush-and-retry on exhaustion.
    fn inner_alloc(
        &self,
        req: AllocRequest,
        flush: bool,
        w: &mut WorkRecord,
    ) -> Result<IovaBlock, IovaError> {
        match self.inner.alloc(req, w) {
            Err(IovaError::Exhausted { .. }) if flush => {
                w.rcache_flushes += 1;
                self.flush_all(self.exhaustion_flush == ExhaustionFlush::CpusAndDepots, w);
                self.inner.alloc(req, w)
            }
            r => r,
        }
    }
}

impl<A: IovaAllocator> IovaAllocator for MagazineCache<A> {
    fn name(&self) -> &'static str {
        "magazine"
    }

    fn granule(&self) -> u64 {
        self.granule
    }

    fn range(&self) -> (Iova, Iova) {
        self.inner.range()
    }

    fn alloc(&self, req: AllocRequest, work: &mut WorkRecord) -> Result<IovaBlock, IovaError> {
        self.alloc_flushing(req, true, work)
    }

    /// As [`IovaAllocator::alloc`], but an exhausted inner allocator is not retried after
    /// flushing the caches (Linux `alloc_iova_fast` with `flush_rcache = false`).
    fn alloc_without_flush(
        &self,
        req: AllocRequest,
        work: &mut WorkRecord,
    ) -> Result<IovaBlock, IovaError> {
        self.alloc_flushing(req, false, work)
    }

    fn free(&self, block: IovaBlock, cpu: usize, work: &mut WorkRecord) -> Result<(), IovaError> {
        let start = block.start.get();
        if block.pages <= MAX_CACHED_PAGES
            && block.pages.is_power_of_two()
            && start & (self.granule - 1) == 0
        {
            let class = block.pages.trailing_zeros() as usize;
            if self.check_frees && !self.live.remove(Self::key(start, class)) {
                return Err(IovaError::NotAllocated {
                    start,
                    pages: block.pages,
                });
            }
            if let Some(mag) = self.cache_put(class, self.cpu_index(cpu), start, work) {
                self.free_magazine(&mag, block.pages, cpu, work);
            }
            return Ok(());
        }
        self.free_slow(block, cpu, work)
    }

    fn live_blocks(&self) -> usize {
        // Cached ranges are allocated in the inner allocator but free here. Read the cache
        // first: under concurrent use the answer is a snapshot, exact when quiescent.
        let cached = self.cached_ranges();
        self.inner.live_blocks().saturating_sub(cached)
    }

    fn drain_caches(&self, work: &mut WorkRecord) {
        self.flush_all(true, work);
        self.inner.drain_caches(work);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::addr::SZ_4K;
    use crate::iova::linux::{IovaSpaceConfig, LinuxIovaAllocator};

    const G: u64 = SZ_4K;
    const END: u64 = 1 << 36;

    fn linux(end: u64) -> LinuxIovaAllocator {
        LinuxIovaAllocator::new(IovaSpaceConfig::new(G, Iova::new(end))).unwrap()
    }

    fn cache(end: u64, ncpus: usize) -> MagazineCache<LinuxIovaAllocator> {
        MagazineCache::new(linux(end), MagazineConfig::new(ncpus)).unwrap()
    }

    fn req(pages: u64, cpu: usize) -> AllocRequest {
        AllocRequest::new(pages, Iova::new(END), cpu)
    }

    /// The live set answers as a hash set of `max_live * 2` (rounded up) keys would: keys
    /// in bitmap leaves, keys past the leaf directory in the hash table, wrong classes and
    /// pages, double removes, and a full set.
    #[test]
    fn live_set_is_exact_in_leaves_and_past_the_directory() {
        let set = LiveSet::new(1024, G);
        let cap = 2048;
        // One key per leaf: the first LEAF_SLOTS claim the directory, the rest go to the table.
        let key = |i: u64, class: u64| (((i << LEAF_BITS) + 1) * G) | class;
        let n = LEAF_SLOTS as u64 + 100;
        for i in 0..n {
            assert!(set.insert(key(i, 0)), "{i}");
        }
        assert!(set.tags.iter().all(|t| t.load(Ordering::Relaxed) != 0));
        for i in 0..n {
            assert!(!set.remove(key(i, 1)), "wrong class {i}");
            assert!(!set.remove(key(i, 0) + G), "wrong page {i}");
        }
        for i in 0..n {
            assert!(set.remove(key(i, 0)), "{i}");
            assert!(!set.remove(key(i, 0)), "double remove {i}");
        }
        // Full at `cap` live keys, wherever they are; a remove makes room again.
        for i in 0..cap as u64 {
            assert!(set.insert(key(i, 2)), "{i}");
        }
        assert!(!set.insert(key(0, 3)));
        assert!(!set.insert(key(cap as u64, 2)));
        assert!(set.remove(key(7, 2)));
        assert!(set.insert(key(cap as u64, 2)));
        assert!(!set.insert(key(0, 3)));
    }

    #[test]
    fn first_alloc_misses_and_a_reuse_hits() {
        let c = cache(END, 2);
        let mut w = WorkRecord::new();
        let b = c.alloc(req(1, 0), &mut w).unwrap();
        c.free(b, 0, &mut w).unwrap();

        let mut w2 = WorkRecord::new();
        let again = c.alloc(req(1, 0), &mut w2).unwrap();

        assert_eq!(again, b);
        assert_eq!((w.magazine_misses, w.magazine_hits), (1, 0));
        assert_eq!(w2.magazine_hits, 1);
        assert_eq!(w2.lock_count(LockId::RcacheCpu), 1);
        assert_eq!(w2.lock_count(LockId::IovaTree), 0);
    }

    /// A miss with both magazines and the depot empty counts the depot lock (Linux takes it)
    /// though the cache only looks at the depot's published length; a magazine another CPU
    /// put in the depot is found through that length; trims and flushes publish theirs.
    #[test]
    fn the_depot_s_published_length_follows_its_magazines() {
        let c = cache(END, 2);
        let looks = |c: &MagazineCache<LinuxIovaAllocator>| {
            let empty = c.rcaches[0].depot.looks_empty();
            assert_eq!(empty, c.depot_lens()[0] == 0);
            empty
        };
        let mut w = WorkRecord::new();
        c.alloc(req(1, 0), &mut w).unwrap();
        assert_eq!(w.magazine_misses, 1);
        assert_eq!(w.lock_count(LockId::RcacheCpu), 1);
        assert_eq!(w.lock_count(LockId::RcacheDepot), 1);
        assert_eq!(w.lock_count(LockId::IovaTree), 1);
        assert_eq!(w.depot_exchanges, 0);

        // CPU 1 fills its two magazines and gives a third to the depot.
        let blocks: Vec<_> = (0..2 * MAGAZINE_SIZE + 1)
            .map(|_| c.alloc(req(1, 1), &mut w).unwrap())
            .collect();
        assert!(looks(&c));
        for b in &blocks {
            c.free(*b, 1, &mut w).unwrap();
        }
        assert!(!looks(&c));

        let mut w2 = WorkRecord::new();
        c.alloc(req(1, 0), &mut w2).unwrap();
        assert_eq!((w2.magazine_hits, w2.depot_exchanges), (1, 1));
        assert_eq!(w2.lock_count(LockId::RcacheDepot), 1);
        assert_eq!(w2.lock_count(LockId::IovaTree), 0);
        assert!(looks(&c));

        // A flush empties the depot (CPU 1's magazines hold at most 254 of these).
        let more: Vec<_> = (0..3 * MAGAZINE_SIZE)
            .map(|_| c.alloc(req(1, 1), &mut w).unwrap())
            .collect();
        for b in &more {
            c.free(*b, 1, &mut w).unwrap();
        }
        assert!(!looks(&c));
        c.flush_all(true, &mut w);
        assert!(looks(&c));
    }

    #[test]
    fn small_sizes_are_rounded_up_to_a_power_of_two() {
        let c = cache(END, 1);
        let mut w = WorkRecord::new();

        let b = c
            .alloc(
                AllocRequest {
                    size_aligned: false,
                    ..req(3, 0)
                },
                &mut w,
            )
            .unwrap();

        assert_eq!(b.pages, 4);
        assert!(b.start.is_aligned(4 * G));
        c.free(b, 0, &mut w).unwrap();
    }

    #[test]
    fn large_requests_bypass_the_caches() {
        let c = cache(END, 1);
        let mut w = WorkRecord::new();

        let b = c.alloc(req(33, 0), &mut w).unwrap();
        c.free(b, 0, &mut w).unwrap();

        assert_eq!(b.pages, 33);
        assert_eq!((w.magazine_hits, w.magazine_misses), (0, 0));
        assert_eq!(c.cached_ranges(), 0);
        assert_eq!(c.inner().live_blocks(), 0);
    }

    #[test]
    fn scripted_sequence_counts_hits_misses_and_depot_exchanges() {
        let c = cache(END, 1);
        let mut w = WorkRecord::new();
        let n = 2 * MAGAZINE_SIZE + 1;
        let blocks: Vec<_> = (0..n)
            .map(|_| c.alloc(req(1, 0), &mut w).unwrap())
            .collect();
        for b in &blocks {
            c.free(*b, 0, &mut w).unwrap();
        }
        // loaded and prev full, then loaded went to the depot and a new one holds the last.
        assert_eq!(w.magazine_misses, n as u64);
        assert_eq!(w.depot_exchanges, 1);
        assert_eq!(c.depot_lens()[0], 1);

        let mut w2 = WorkRecord::new();
        for _ in 0..n {
            c.alloc(req(1, 0), &mut w2).unwrap();
        }

        // 1 from loaded, 127 after swapping in prev, 127 from the depot's magazine.
        assert_eq!((w2.magazine_hits, w2.magazine_misses), (n as u64, 0));
        assert_eq!(w2.depot_exchanges, 1);
        assert_eq!(w2.lock_count(LockId::IovaTree), 0);
        assert_eq!(c.live_blocks(), n);
    }

    #[test]
    fn eager_trim_frees_a_magazine_pushed_past_the_cap() {
        let c = cache(END, 1);
        let mut w = WorkRecord::new();
        let n = 3 * MAGAZINE_SIZE + 1;
        let blocks: Vec<_> = (0..n)
            .map(|_| c.alloc(req(1, 0), &mut w).unwrap())
            .collect();

        let mut w2 = WorkRecord::new();
        for b in &blocks {
            c.free(*b, 0, &mut w2).unwrap();
        }

        // The depot holds one magazine (ncpus); the second push went back to the tree.
        assert_eq!(c.depot_lens()[0], 1);
        assert_eq!(c.inner().live_blocks(), n - MAGAZINE_SIZE);
        assert_eq!(w2.lock_count(LockId::IovaTree), 1);
        assert_eq!(c.live_blocks(), 0);
    }

    #[test]
    fn trim_depot_drops_one_magazine_per_tick_down_to_ncpus() {
        let cfg = MagazineConfig {
            eager_depot_trim: false,
            ..MagazineConfig::new(1)
        };
        let c = MagazineCache::new(linux(END), cfg).unwrap();
        let mut w = WorkRecord::new();
        let n = 4 * MAGAZINE_SIZE + 1;
        let blocks: Vec<_> = (0..n)
            .map(|_| c.alloc(req(1, 0), &mut w).unwrap())
            .collect();
        for b in &blocks {
            c.free(*b, 0, &mut w).unwrap();
        }
        assert_eq!(c.depot_lens()[0], 3);

        let t1 = c.trim_depot(&mut w);
        let t2 = c.trim_depot(&mut w);
        let t3 = c.trim_depot(&mut w);

        assert_eq!((t1, t2, t3), (1, 1, 0));
        assert_eq!(c.depot_lens()[0], 1);
        assert_eq!(c.inner().live_blocks(), n - 2 * MAGAZINE_SIZE);
    }

    /// Allocates on the first half of `ncpus` CPUs and frees each range on the CPU half the
    /// machine away, in `rounds` bursts of `burst` ranges per CPU (a NIC's receive rings
    /// refilled on one set of CPUs and completed on another). Returns the work of the
    /// measured rounds: all but the first two, which fill the magazines and the depot.
    fn cross_cpu_rounds(depot: DepotKind, ncpus: usize, burst: usize, rounds: usize) -> WorkRecord {
        let cfg = MagazineConfig {
            depot,
            max_live: 1 << 20,
            ..MagazineConfig::new(ncpus)
        };
        let c = MagazineCache::new(linux(END), cfg).unwrap();
        let half = ncpus / 2;
        let mut warm = WorkRecord::new();
        let mut w = WorkRecord::new();
        for round in 0..rounds {
            let w = if round < 2 { &mut warm } else { &mut w };
            let held: Vec<Vec<IovaBlock>> = (0..half)
                .map(|cpu| {
                    (0..burst)
                        .map(|_| c.alloc(req(1, cpu), w).unwrap())
                        .collect()
                })
                .collect();
            for (cpu, blocks) in held.iter().enumerate() {
                for b in blocks {
                    c.free(*b, cpu + half, w).unwrap();
                }
            }
        }
        assert_eq!(c.live_blocks(), 0);
        w
    }

    /// With 64 CPUs, each round moves 32 x 2 full magazines from the freeing CPUs to the
    /// allocating ones through the depot. The scalable depot (trimmed to one magazine per CPU,
    /// 64) holds them all, so the measured rounds never touch the tree. The bounded depot
    /// (Linux 4.19-6.6) holds 32: the other 32 magazines go back to the tree (one lock each)
    /// and the allocating CPUs then miss once per range, taking the tree lock each time.
    #[test]
    fn the_bounded_depot_sends_far_more_work_to_the_tree_at_many_cpus() {
        let burst = 2 * MAGAZINE_SIZE;
        let scalable = cross_cpu_rounds(DepotKind::Scalable, 64, burst, 6);
        let bounded = cross_cpu_rounds(DepotKind::LINUX_BOUNDED, 64, burst, 6);

        let tree = |w: &WorkRecord| w.lock_count(LockId::IovaTree);
        // 4 measured rounds: 32 magazines freed to the tree and 32 x 127 misses each.
        let per_round = 32 + 32 * MAGAZINE_SIZE as u64;
        assert_eq!(tree(&scalable), 0);
        assert_eq!(scalable.magazine_misses, 0);
        assert_eq!(tree(&bounded), 4 * per_round);
        assert_eq!(bounded.magazine_misses, 4 * 32 * MAGAZINE_SIZE as u64);
        assert!(bounded.tree_nodes_visited > 100_000);
    }

    /// At 16 CPUs the same traffic (16 x 2 magazines a round) fits in both depots: the bounded
    /// depot only costs tree work once more CPUs than it has magazines push at once.
    #[test]
    fn the_bounded_depot_matches_the_scalable_one_at_few_cpus() {
        let burst = 2 * MAGAZINE_SIZE;
        let scalable = cross_cpu_rounds(DepotKind::Scalable, 32, burst, 4);
        let bounded = cross_cpu_rounds(DepotKind::LINUX_BOUNDED, 32, burst, 4);

        assert_eq!(bounded.lock_count(LockId::IovaTree), 0);
        assert_eq!(scalable.lock_count(LockId::IovaTree), 0);
        assert_eq!(bounded.magazine_hits, scalable.magazine_hits);
    }

    #[test]
    fn a_bounded_depot_is_never_trimmed_and_overflows_to_the_tree() {
        let cfg = MagazineConfig {
            depot: DepotKind::Bounded { max_magazines: 2 },
            ..MagazineConfig::new(1)
        };
        let c = MagazineCache::new(linux(END), cfg).unwrap();
        let mut w = WorkRecord::new();
        let n = 4 * MAGAZINE_SIZE + 1;
        let blocks: Vec<_> = (0..n)
            .map(|_| c.alloc(req(1, 0), &mut w).unwrap())
            .collect();

        let mut w2 = WorkRecord::new();
        for b in &blocks {
            c.free(*b, 0, &mut w2).unwrap();
        }
        let trimmed = c.trim_depot(&mut w2);

        // loaded + prev, two in the depot (more than ncpus = 1), one back to the tree.
        assert_eq!(trimmed, 0);
        assert_eq!(c.depot_lens()[0], 2);
        assert_eq!(w2.lock_count(LockId::IovaTree), 1);
        assert_eq!(c.inner().live_blocks(), n - MAGAZINE_SIZE);
        assert_eq!(w2.lock_count(LockId::RcacheDepot), 3);
    }

    #[test]
    fn exhaustion_before_5_11_leaves_the_depot_cached() {
        // 383 usable pages, 382 of them cached after use: CPU 0's two magazines (128 ranges)
        // and two full magazines in the depot (its trim cap is ncpus = 2).
        let end = (3 * MAGAZINE_SIZE as u64 + 3) * G;
        let lim = Iova::new(end);
        let run = |flush: ExhaustionFlush| {
            let cfg = MagazineConfig {
                exhaustion_flush: flush,
                ..MagazineConfig::new(2)
            };
            let c = MagazineCache::new(linux(end), cfg).unwrap();
            let mut w = WorkRecord::new();
            let blocks: Vec<_> = (0..3 * MAGAZINE_SIZE + 1)
                .map(|_| c.alloc(AllocRequest::new(1, lim, 0), &mut w).unwrap())
                .collect();
            for b in &blocks {
                c.free(*b, 0, &mut w).unwrap();
            }
            assert_eq!(c.depot_lens()[0], 2);
            // A 2-page request misses, finds the tree full, flushes and retries.
            let mut w2 = WorkRecord::new();
            let r = c.alloc(AllocRequest::new(2, lim, 1), &mut w2);
            (r.is_ok(), w2.rcache_flushes, c.depot_lens()[0])
        };

        assert_eq!(run(ExhaustionFlush::CpusAndDepots), (true, 1, 0));
        assert_eq!(run(ExhaustionFlush::CpusOnly), (true, 1, 2));
    }

    #[test]
    fn a_bounded_depot_of_zero_is_a_config_error() {
        let cfg = MagazineConfig {
            depot: DepotKind::Bounded { max_magazines: 0 },
            ..MagazineConfig::new(1)
        };
        assert!(MagazineCache::new(linux(END), cfg).is_err());
    }

    #[test]
    fn exhaustion_flushes_all_caches_once_and_retries() {
        // 15 usable pages, all cached on CPU 0 after use.
        let c = cache(16 * G, 2);
        let mut w = WorkRecord::new();
        let lim = Iova::new(16 * G);
        let blocks: Vec<_> = (0..15)
            .map(|_| c.alloc(AllocRequest::new(1, lim, 0), &mut w).unwrap())
            .collect();
        for b in &blocks {
            c.free(*b, 0, &mut w).unwrap();
        }

        let mut w2 = WorkRecord::new();
        let b = c.alloc(AllocRequest::new(2, lim, 1), &mut w2).unwrap();

        assert_eq!(
            b,
            IovaBlock {
                start: Iova::new(14 * G),
                pages: 2
            }
        );
        assert_eq!(w2.rcache_flushes, 1);
        assert_eq!(w2.magazine_misses, 1);
        assert_eq!(c.cached_ranges(), 0);
    }

    #[test]
    fn exhaustion_after_the_flush_is_an_error() {
        let c = cache(16 * G, 1);
        let mut w = WorkRecord::new();
        let lim = Iova::new(16 * G);
        let _held: Vec<_> = (0..15)
            .map(|_| c.alloc(AllocRequest::new(1, lim, 0), &mut w).unwrap())
            .collect();

        let mut w2 = WorkRecord::new();
        let r = c.alloc(AllocRequest::new(1, lim, 0), &mut w2);

        assert!(matches!(r, Err(IovaError::Exhausted { .. })));
        assert_eq!(w2.rcache_flushes, 1);
        assert_eq!(c.live_blocks(), 15);
    }

    #[test]
    fn out_of_range_cpu_wraps_modulo_ncpus() {
        let c = cache(END, 2);
        let mut w = WorkRecord::new();
        let b = c.alloc(req(1, 0), &mut w).unwrap();
        c.free(b, 5, &mut w).unwrap();

        let mut w2 = WorkRecord::new();
        let again = c.alloc(req(1, 1), &mut w2).unwrap();

        assert_eq!(again, b);
        assert_eq!(w2.magazine_hits, 1);
    }

    #[test]
    fn cached_ranges_above_the_limit_are_not_used() {
        let c = cache(END, 1);
        let mut w = WorkRecord::new();
        let high = c.alloc(req(1, 0), &mut w).unwrap();
        c.free(high, 0, &mut w).unwrap();

        let mut w2 = WorkRecord::new();
        let low = c
            .alloc(AllocRequest::new(1, Iova::new(1 << 32), 0), &mut w2)
            .unwrap();

        assert!(low.start.get() < 1 << 32);
        assert_eq!(w2.magazine_misses, 1);
        assert_eq!(c.cached_ranges(), 1);
    }

    #[test]
    fn bad_frees_are_rejected_and_change_nothing() {
        let c = cache(END, 1);
        let mut w = WorkRecord::new();
        let b = c.alloc(req(4, 0), &mut w).unwrap();
        let keep = c.alloc(req(4, 0), &mut w).unwrap();
        c.free(b, 0, &mut w).unwrap();

        let double = c.free(b, 0, &mut w);
        let unrounded = c.free(
            IovaBlock {
                start: keep.start,
                pages: 3,
            },
            0,
            &mut w,
        );
        let other_class = c.free(
            IovaBlock {
                start: keep.start,
                pages: 2,
            },
            0,
            &mut w,
        );
        let never = c.free(
            IovaBlock {
                start: Iova::new(1 << 30),
                pages: 1,
            },
            0,
            &mut w,
        );
        let never_large = c.free(
            IovaBlock {
                start: Iova::new(1 << 30),
                pages: 64,
            },
            0,
            &mut w,
        );

        for r in [double, unrounded, other_class, never, never_large] {
            assert!(matches!(r, Err(IovaError::NotAllocated { .. })), "{r:?}");
        }
        assert_eq!(c.live_blocks(), 1);
        assert_eq!(c.alloc(req(4, 0), &mut w).unwrap(), b);
        c.free(keep, 0, &mut w).unwrap();
    }

    #[test]
    fn zero_pages_and_low_limits_are_rejected() {
        let c = cache(END, 1);
        let mut w = WorkRecord::new();

        assert_eq!(
            c.alloc(req(0, 0), &mut w),
            Err(IovaError::BadSize { pages: 0 })
        );
        let low = c.alloc(AllocRequest::new(1, Iova::new(G), 0), &mut w);
        assert!(matches!(low, Err(IovaError::LimitTooLow { .. })), "{low:?}");
        assert_eq!(c.live_blocks(), 0);
        assert_eq!(w.rcache_flushes, 0);
    }

    #[test]
    fn drain_returns_everything_to_the_inner_allocator() {
        let c = cache(END, 2);
        let mut w = WorkRecord::new();
        let blocks: Vec<_> = (0..300)
            .map(|i| c.alloc(req(1 << (i % 6), i % 3), &mut w).unwrap())
            .collect();
        for (i, b) in blocks.iter().enumerate() {
            c.free(*b, i % 2, &mut w).unwrap();
        }
        assert!(c.cached_ranges() > 0);

        c.drain_caches(&mut w);

        assert_eq!(c.cached_ranges(), 0);
        assert_eq!(c.inner().live_blocks(), 0);
        assert_eq!(c.live_blocks(), 0);
    }

    #[test]
    fn bad_configs_are_errors() {
        let bad = [
            MagazineConfig::new(0),
            MagazineConfig {
                max_depot: 1,
                ..MagazineConfig::new(4)
            },
            MagazineConfig {
                max_live: 0,
                ..MagazineConfig::new(1)
            },
        ];
        for cfg in bad {
            assert!(MagazineCache::new(linux(END), cfg).is_err(), "{cfg:?}");
        }
    }

    #[test]
    fn unchecked_frees_are_trusted_like_linux() {
        let cfg = MagazineConfig {
            check_frees: false,
            ..MagazineConfig::new(1)
        };
        let c = MagazineCache::new(linux(END), cfg).unwrap();
        let mut w = WorkRecord::new();
        let b = c.alloc(req(1, 0), &mut w).unwrap();
        c.free(b, 0, &mut w).unwrap();

        let r = c.free(b, 0, &mut w);

        assert_eq!(r, Ok(()));
        assert_eq!(c.cached_ranges(), 2);
    }

    #[test]
    fn live_table_full_fails_cleanly() {
        let cfg = MagazineConfig {
            max_live: 2,
            ..MagazineConfig::new(1)
        };
        let c = MagazineCache::new(linux(END), cfg).unwrap();
        let mut w = WorkRecord::new();
        // Four slots: four live small ranges fit, the fifth does not.
        let held: Vec<_> = (0..4)
            .map(|_| c.alloc(req(1, 0), &mut w).unwrap())
            .collect();

        let r = c.alloc(req(1, 0), &mut w);

        assert!(matches!(r, Err(IovaError::Exhausted { .. })), "{r:?}");
        assert_eq!(c.live_blocks(), 4);
        for b in held {
            c.free(b, 0, &mut w).unwrap();
        }
        assert_eq!(c.live_blocks(), 0);
    }
}
