//! IOTLB and page-walk caches: what an IOMMU remembers between page-table walks.
//!
//! - [`Iotlb`]: a set-associative cache of leaf translations, tagged by [`Asid`] (the
//!   domain, ASID or context tag), holding any power-of-two page size from 4 KiB up.
//! - [`WalkCache`]: per-level caches of non-leaf table descriptors, so a walk that misses the
//!   IOTLB can start below the root.
//!
//! Both are built on one generic set-associative core with flat storage and a choice of
//! [`Replacement`] policy (LRU, round-robin, or seeded pseudo-random). Sizes are fixed at
//! construction and capped at [`MAX_CACHE_ENTRIES`]; lookups and inserts never allocate.
//!
//! # Stale entries are real
//!
//! A cache knows nothing of page-table changes. When software removes a mapping but has not
//! yet invalidated it (lazy mode, or a missing invalidation), the owner calls
//! [`Iotlb::mark_stale_range`]: the entries stay and **still translate** (the device can
//! still reach the old page), but every hit on them is also counted as
//! [`WorkRecord::iotlb_stale_hits`]. Only invalidation removes entries.
//!
//! # Looking up without knowing the page size
//!
//! An entry is indexed by its IOVA page number at its own page size, and a lookup does not
//! know which page size maps an address. The [`Iotlb`] therefore keeps a bitmap of the page
//! sizes it currently holds (with a count per size, so the bit clears when the last entry of
//! that size goes) and probes one set per size present, smallest size first. With 4 KiB
//! pages only, that is a single probe; a mix of 4 KiB and 2 MiB pages costs two. Real
//! multi-size TLBs approximate the same thing with parallel per-size lookups or a
//! size-prediction step. gem5's SMMUv3 model instead indexes every entry by `va >> 12`,
//! which cannot find a large-page entry from an address in another 4 KiB slice of it.
//!
//! If entries of two sizes both cover an address (a stale 2 MiB block and the 4 KiB page
//! that replaced it, say; Arm calls this a TLB conflict), the smallest page size wins.
//!
//! # Defaults
//!
//! [`IotlbConfig::gem5_micro_tlb`], [`IotlbConfig::gem5_main_tlb`] and
//! [`WalkCacheConfig::gem5`] reproduce the defaults of gem5's SMMUv3 model
//! (`src/dev/arm/SMMUv3.py`): a 32-entry fully associative micro-TLB, a 2048-entry 4-way
//! main TLB, and walk caches of 4/28/348/4 entries per level, 4-way, all round-robin.
//! gem5's walk-cache levels have 1, 7, 87 and 1 sets, so set counts need not be powers of
//! two: a power-of-two count is indexed by masking, any other by a modulo, as gem5 does.
//!
//! # Threads
//!
//! Both caches are plain single-owner structures (`&mut self` to look up, since a hit updates
//! replacement state). A hardware model that shares one between threads wraps it in a lock.

use std::fmt;

use crate::addr::{Iova, PhysAddr, Prot};
use crate::work::WorkRecord;

/// The most entries one cache (or all levels of one walk cache together) may have.
pub const MAX_CACHE_ENTRIES: usize = 1 << 20;
/// Base-2 logarithm of the smallest page size an [`Iotlb`] entry may have (4 KiB).
pub const MIN_PAGE_SHIFT: u32 = 12;
/// Base-2 logarithm of the largest page size an [`Iotlb`] entry may have (4 TiB, the
/// largest block of any LPAE granule with 52-bit addresses).
pub const MAX_PAGE_SHIFT: u32 = 42;
/// The most levels a [`WalkCache`] may have.
pub const MAX_WALK_LEVELS: usize = 8;

/// The tag that separates address spaces in a cache: a domain id, an SMMU ASID (or ASID and
/// VMID packed together), a VT-d domain id. Entries of one tag never hit for another.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug, Default)]
pub struct Asid(pub u32);

impl fmt::Display for Asid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// Which entry of a full set a cache evicts to make room.
///
/// Whatever the policy, an insert first fills an empty way of its set (lowest way first);
/// the policy only chooses among valid entries.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum Replacement {
    /// Evict the entry used (looked up or inserted) least recently.
    Lru,
    /// Evict ways in turn, ignoring use; each set has its own pointer. (gem5 keeps one
    /// pointer for the whole cache; a per-set pointer is what hardware builds.)
    RoundRobin,
    /// Evict a pseudo-random way. The generator (SplitMix64) is seeded from `seed`, so the
    /// same seed and the same sequence of operations evict the same entries.
    Random {
        /// Seed of the generator.
        seed: u64,
    },
}

/// Why a cache configuration was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CacheConfigError {
    /// The cache has no entries.
    #[error("A cache needs at least one entry")]
    ZeroEntries,
    /// The associativity is zero.
    #[error("A cache needs at least one way")]
    ZeroWays,
    /// More ways than entries.
    #[error("Associativity of {ways} ways exceeds the {entries} entries")]
    WaysExceedEntries {
        /// Ways requested.
        ways: usize,
        /// Entries requested.
        entries: usize,
    },
    /// The entries do not split into whole sets.
    #[error("{entries} entries do not divide into sets of {ways} ways")]
    NotWholeSets {
        /// Entries requested.
        entries: usize,
        /// Ways requested.
        ways: usize,
    },
    /// The cache would exceed [`MAX_CACHE_ENTRIES`].
    #[error("{entries} entries exceed the cap of {max}")]
    TooManyEntries {
        /// Entries requested (summed over levels for a walk cache).
        entries: usize,
        /// The cap.
        max: usize,
    },
    /// A walk cache with no levels.
    #[error("A walk cache needs at least one level")]
    NoLevels,
    /// A walk cache with more than [`MAX_WALK_LEVELS`] levels.
    #[error("{levels} walk-cache levels exceed the cap of {max}")]
    TooManyLevels {
        /// Levels requested.
        levels: usize,
        /// The cap.
        max: usize,
    },
    /// A walk-cache level's IOVA span is out of range or not smaller than the level above.
    #[error(
        "Walk-cache level {level} spans 2^{span_shift} bytes: expected {MIN_PAGE_SHIFT}..=63 \
         and less than the level above"
    )]
    BadSpan {
        /// The level.
        level: usize,
        /// Its span shift.
        span_shift: u32,
    },
    /// One level of a walk cache has a bad geometry.
    #[error("Walk-cache level {level} is misconfigured")]
    Level {
        /// The level.
        level: usize,
        /// What is wrong with it.
        #[source]
        source: Box<CacheConfigError>,
    },
}

/// Why a cache operation was rejected. The cache is unchanged when an error is returned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IotlbError {
    /// The page size is not a power of two between 2^[`MIN_PAGE_SHIFT`] and
    /// 2^[`MAX_PAGE_SHIFT`].
    #[error("Page size {page_size:#x} is not a power of two from 4 KiB to 4 TiB")]
    BadPageSize {
        /// The page size given.
        page_size: u64,
    },
    /// The IOVA or the physical address is not aligned to the page size.
    #[error(
        "IOVA {iova:#x} or physical address {pa:#x} is not aligned to page size {page_size:#x}"
    )]
    Misaligned {
        /// The IOVA given.
        iova: u64,
        /// The physical address given.
        pa: u64,
        /// The page size given.
        page_size: u64,
    },
    /// A walk-cache level that does not exist.
    #[error("Walk-cache level {level} does not exist (the cache has {levels})")]
    NoSuchLevel {
        /// The level given.
        level: usize,
        /// Levels the cache has.
        levels: usize,
    },
}

/// Checks an `entries`/`ways` geometry.
fn validate_geometry(entries: usize, ways: usize) -> Result<(), CacheConfigError> {
    if entries == 0 {
        return Err(CacheConfigError::ZeroEntries);
    }
    if ways == 0 {
        return Err(CacheConfigError::ZeroWays);
    }
    if entries > MAX_CACHE_ENTRIES {
        return Err(CacheConfigError::TooManyEntries {
            entries,
            max: MAX_CACHE_ENTRIES,
        });
    }
    if ways > entries {
        return Err(CacheConfigError::WaysExceedEntries { ways, entries });
    }
    if entries % ways != 0 {
        return Err(CacheConfigError::NotWholeSets { entries, ways });
    }
    Ok(())
}

/// The last byte of `size` bytes at `iova` (saturating at the top of the address space), or
/// `None` for an empty range.
fn range_last(iova: Iova, size: u64) -> Option<u64> {
    (size != 0).then(|| iova.get().saturating_add(size - 1))
}

/// The set-index hash of a page or prefix number under a tag. Mixing the tag in (as gem5's
/// main TLB does) spreads domains that use the same IOVAs over different sets.
#[inline]
fn tag_hash(asid: Asid, number: u64) -> u64 {
    number ^ u64::from(asid.0)
}

// ---------------------------------------------------------------------------------------
// The generic set-associative core.
// ---------------------------------------------------------------------------------------

/// SplitMix64: a tiny, well-mixed deterministic generator for random replacement.
#[derive(Clone, Debug)]
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A value in `0..n` (`n > 0`), by multiply-shift.
    fn below(&mut self, n: usize) -> usize {
        ((u128::from(self.next_u64()) * n as u128) >> 64) as usize
    }
}

/// One valid cache line.
#[derive(Clone, Copy, Debug)]
struct Line<K, V> {
    key: K,
    value: V,
    /// Replacement clock at the last use (LRU).
    stamp: u64,
}

/// A set-associative cache of `sets * ways` lines in one flat vector; set `s` is
/// `lines[s * ways..(s + 1) * ways]`. Callers pick the set with a hash (see
/// [`SetAssoc::set_of`]) and must use the same hash for a key every time.
#[derive(Clone, Debug)]
pub(crate) struct SetAssoc<K, V> {
    lines: Vec<Option<Line<K, V>>>,
    sets: usize,
    ways: usize,
    /// `Some(sets - 1)` when `sets` is a power of two.
    mask: Option<u64>,
    /// How a hash picks its set.
    index: SetIndex,
    policy: Replacement,
    /// Next round-robin victim per set (empty unless the policy is round-robin).
    rr_next: Vec<u32>,
    rng: SplitMix64,
    clock: u64,
    len: usize,
    /// Valid lines per set (derived: always the count of `Some` in the set's ways), so an
    /// empty set misses, and fills its way 0, without looking at its lines.
    occupied: Vec<u32>,
}

impl<K: Copy + Eq, V: Copy> SetAssoc<K, V> {
    /// A cache of `entries` lines in sets of `ways`; the geometry must be valid.
    fn new(entries: usize, ways: usize, policy: Replacement, index: SetIndex) -> Self {
        debug_assert!(validate_geometry(entries, ways).is_ok());
        let sets = entries / ways;
        let seed = match policy {
            Replacement::Random { seed } => seed,
            _ => 0,
        };
        Self {
            lines: vec![None; entries],
            sets,
            ways,
            mask: sets.is_power_of_two().then(|| sets as u64 - 1),
            index,
            policy,
            rr_next: if policy == Replacement::RoundRobin {
                vec![0; sets]
            } else {
                Vec::new()
            },
            rng: SplitMix64(seed),
            clock: 0,
            len: 0,
            occupied: vec![0; sets],
        }
    }

    /// The set a hash selects.
    #[inline]
    fn set_of(&self, hash: u64) -> usize {
        let hash = match self.index {
            SetIndex::LowBits => hash,
            // Fold the page number's higher bits onto the low ones, so pages a fixed
            // power-of-two stride apart spread over the sets.
            SetIndex::Folded => {
                let h = hash ^ (hash >> 4) ^ (hash >> 8) ^ (hash >> 12);
                h ^ (h >> 16) ^ (h >> 32)
            }
        };
        match self.mask {
            Some(mask) => (hash & mask) as usize,
            None => (hash % self.sets as u64) as usize,
        }
    }

    #[inline]
    fn set_range(&self, set: usize) -> std::ops::Range<usize> {
        set * self.ways..(set + 1) * self.ways
    }

    /// Index of the line holding `key` in `set`.
    #[inline]
    fn find(&self, set: usize, key: &K) -> Option<usize> {
        let range = self.set_range(set);
        let start = range.start;
        self.lines[range]
            .iter()
            .position(|l| matches!(l, Some(line) if line.key == *key))
            .map(|way| start + way)
    }

    #[inline]
    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// The value under `key`, marking it used. (One pass over the set: the line found is
    /// the one stamped, with no second index into the lines.)
    #[inline]
    fn get(&mut self, hash: u64, key: &K) -> Option<&mut V> {
        let set = self.set_of(hash);
        if self.occupied[set] == 0 {
            return None;
        }
        let range = self.set_range(set);
        let clock = &mut self.clock;
        for line in self.lines[range].iter_mut().flatten() {
            if line.key == *key {
                *clock += 1;
                line.stamp = *clock;
                return Some(&mut line.value);
            }
        }
        None
    }

    /// The value under `key`, without touching replacement state.
    #[inline]
    fn peek(&self, hash: u64, key: &K) -> Option<&V> {
        let idx = self.find(self.set_of(hash), key)?;
        self.lines[idx].as_ref().map(|l| &l.value)
    }

    /// Stores `value` under `key`, marking it used. A line already holding `key` is
    /// overwritten in place; otherwise an empty way or a victim chosen by the policy is
    /// used, and the evicted line is returned.
    fn insert(&mut self, hash: u64, key: K, value: V) -> Option<(K, V)> {
        let set = self.set_of(hash);
        if let Some(idx) = self.find(set, &key) {
            let stamp = self.tick();
            self.lines[idx] = Some(Line { key, value, stamp });
            return None;
        }
        self.fill(set, key, value)
    }

    /// [`SetAssoc::insert`] of a key the caller knows is not in the cache (a lookup of it
    /// just missed, with the cache held since): the same victim, clock and contents,
    /// without looking for the key first.
    #[inline]
    fn insert_absent(&mut self, hash: u64, key: K, value: V) -> Option<(K, V)> {
        let set = self.set_of(hash);
        debug_assert!(
            self.find(set, &key).is_none(),
            "insert_absent of a cached key"
        );
        self.fill(set, key, value)
    }

    /// Puts a line for `key` (not in `set`) into an empty way or the policy's victim.
    #[inline]
    fn fill(&mut self, set: usize, key: K, value: V) -> Option<(K, V)> {
        let stamp = self.tick();
        let idx = self.victim(set);
        let new = Line { key, value, stamp };
        match &mut self.lines[idx] {
            Some(line) => {
                let old = (line.key, line.value);
                *line = new;
                Some(old)
            }
            slot => {
                *slot = Some(new);
                self.len += 1;
                self.occupied[set] += 1;
                None
            }
        }
    }

    /// The line to fill in a set: the first empty way, else the policy's victim.
    #[inline]
    fn victim(&mut self, set: usize) -> usize {
        let range = self.set_range(set);
        let start = range.start;
        let occupied = self.occupied[set] as usize;
        if occupied == 0 {
            return start;
        }
        let lines = &self.lines[range];
        if occupied < self.ways {
            let way = lines.iter().position(Option::is_none);
            debug_assert!(way.is_some(), "occupancy out of step");
            return start + way.unwrap_or(0);
        }
        let way = match self.policy {
            Replacement::Lru => lines
                .iter()
                .enumerate()
                .min_by_key(|(_, l)| l.as_ref().map_or(0, |l| l.stamp))
                .map_or(0, |(way, _)| way),
            Replacement::RoundRobin => {
                let way = self.rr_next[set] as usize;
                self.rr_next[set] = ((way + 1) % self.ways) as u32;
                way
            }
            Replacement::Random { .. } => self.rng.below(self.ways),
        };
        start + way
    }

    /// Keeps the line holding `key` in `set` if `keep` returns true for it (it may also
    /// change its value) and removes it otherwise. An insert overwrites a line with the
    /// same key, so a set holds a key at most once: only that line is looked at. Returns
    /// how many were removed (0 or 1).
    #[inline]
    fn retain_key(&mut self, set: usize, key: &K, keep: impl FnOnce(&K, &mut V) -> bool) -> usize {
        let range = self.set_range(set);
        let Some(slot) = self.lines[range]
            .iter_mut()
            .find(|l| matches!(l, Some(line) if line.key == *key))
        else {
            return 0;
        };
        let Some(line) = slot else {
            return 0;
        };
        if keep(&line.key, &mut line.value) {
            return 0;
        }
        *slot = None;
        self.len -= 1;
        self.occupied[set] -= 1;
        1
    }

    /// Keeps the lines (of every set) for which `keep` returns true (it may also change
    /// their values) and removes the others. Returns how many were removed.
    fn retain_all(&mut self, mut keep: impl FnMut(&K, &mut V) -> bool) -> usize {
        let mut removed = 0;
        for (lines, occupied) in self
            .lines
            .chunks_exact_mut(self.ways)
            .zip(self.occupied.iter_mut())
        {
            if *occupied != 0 {
                let r = Self::retain_lines(lines, &mut keep);
                *occupied -= r as u32;
                removed += r;
            }
        }
        self.len -= removed;
        removed
    }

    fn retain_lines(
        lines: &mut [Option<Line<K, V>>],
        keep: &mut impl FnMut(&K, &mut V) -> bool,
    ) -> usize {
        let mut removed = 0;
        for slot in lines {
            if let Some(line) = slot {
                if !keep(&line.key, &mut line.value) {
                    *slot = None;
                    removed += 1;
                }
            }
        }
        removed
    }

    /// Removes every line; returns how many there were.
    fn clear(&mut self) -> usize {
        self.lines.fill(None);
        self.occupied.fill(0);
        std::mem::take(&mut self.len)
    }

    fn len(&self) -> usize {
        self.len
    }

    fn capacity(&self) -> usize {
        self.lines.len()
    }

    /// Valid lines in `set`.
    fn set_len(&self, set: usize) -> usize {
        self.occupied[set] as usize
    }

    /// Valid lines in `set`, counted in its ways (what `occupied` must match).
    #[cfg(test)]
    fn count_set(&self, set: usize) -> usize {
        self.lines[self.set_range(set)]
            .iter()
            .filter(|l| l.is_some())
            .count()
    }

    /// The fullest set's number of valid lines.
    fn max_set_len(&self) -> usize {
        (0..self.sets).map(|s| self.set_len(s)).max().unwrap_or(0)
    }

    fn iter(&self) -> impl Iterator<Item = (&K, &V)> + '_ {
        self.lines.iter().flatten().map(|l| (&l.key, &l.value))
    }
}

// ---------------------------------------------------------------------------------------
// The IOTLB.
// ---------------------------------------------------------------------------------------

/// How a set-associative cache picks a key's set.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub enum SetIndex {
    /// The page (or prefix) number's low bits: pages `sets` apart share a set.
    #[default]
    LowBits,
    /// The page number's bits folded together (XOR of its 4-bit-shifted copies): pages a
    /// fixed power-of-two stride apart spread over the sets, as hashed TLB indices do.
    Folded,
}

/// Geometry and replacement policy of an [`Iotlb`].
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct IotlbConfig {
    /// Total entries.
    pub entries: usize,
    /// Entries per set (associativity); `ways == entries` is fully associative.
    pub ways: usize,
    /// Which entry of a full set to evict.
    pub policy: Replacement,
    /// How a page picks its set.
    pub index: SetIndex,
}

impl IotlbConfig {
    /// A cache of `entries` entries in sets of `ways`.
    pub const fn new(entries: usize, ways: usize, policy: Replacement) -> Self {
        Self {
            entries,
            ways,
            policy,
            index: SetIndex::LowBits,
        }
    }

    /// The same cache with pages picking their set by `index`.
    pub const fn with_index(mut self, index: SetIndex) -> Self {
        self.index = index;
        self
    }

    /// A fully associative cache of `entries` entries (one set).
    pub const fn fully_associative(entries: usize, policy: Replacement) -> Self {
        Self {
            entries,
            ways: entries,
            policy,
            index: SetIndex::LowBits,
        }
    }

    /// gem5's SMMUv3 micro-TLB: 32 entries, fully associative, round-robin
    /// (`SMMUv3DeviceInterface.utlb_entries = 32`, `utlb_assoc = 0` meaning full,
    /// `utlb_policy = "rr"`, in gem5 `src/dev/arm/SMMUv3.py`; 1-cycle lookup).
    pub const fn gem5_micro_tlb() -> Self {
        Self::fully_associative(32, Replacement::RoundRobin)
    }

    /// gem5's SMMUv3 main TLB: 2048 entries, 4-way, round-robin
    /// (`SMMUv3DeviceInterface.tlb_entries = 2048`, `tlb_assoc = 4`, `tlb_policy = "rr"`, in
    /// gem5 `src/dev/arm/SMMUv3.py`; 3-cycle lookup).
    pub const fn gem5_main_tlb() -> Self {
        Self::new(2048, 4, Replacement::RoundRobin)
    }

    /// Number of sets (`entries / ways`).
    pub const fn sets(&self) -> usize {
        match self.entries.checked_div(self.ways) {
            Some(sets) => sets,
            None => 0,
        }
    }

    /// Checks the geometry: at least one entry and one way, no more ways than entries,
    /// whole sets, at most [`MAX_CACHE_ENTRIES`] entries.
    pub fn validate(&self) -> Result<(), CacheConfigError> {
        validate_geometry(self.entries, self.ways)
    }
}

/// Tag of an IOTLB entry: address space, page number at the entry's size, and that size.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct TlbKey {
    asid: Asid,
    vpn: u64,
    shift: u8,
}

impl TlbKey {
    #[inline]
    fn hash(&self) -> u64 {
        tag_hash(self.asid, self.vpn)
    }

    /// Whether the entry's page overlaps `first..=last`.
    #[inline]
    fn overlaps(&self, first: u64, last: u64) -> bool {
        let shift = u32::from(self.shift);
        self.vpn >= first >> shift && self.vpn <= last >> shift
    }
}

#[derive(Clone, Copy, Debug)]
struct TlbValue {
    pa_base: PhysAddr,
    prot: Prot,
    stale: bool,
}

/// A successful [`Iotlb::lookup`].
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct IotlbHit {
    /// The translated address (page base plus the IOVA's offset in the page).
    pub pa: PhysAddr,
    /// Permissions cached with the translation.
    pub prot: Prot,
    /// Size of the cached page.
    pub page_size: u64,
    /// Whether the mapping was already removed from the table (see
    /// [`Iotlb::mark_stale_range`]); the translation is still used.
    pub stale: bool,
}

/// One IOTLB entry, as reported by [`Iotlb::insert`] (the evicted entry) and
/// [`Iotlb::entries`].
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct IotlbEntry {
    /// Address-space tag.
    pub asid: Asid,
    /// First IOVA of the page.
    pub iova: Iova,
    /// Physical address of the page.
    pub pa: PhysAddr,
    /// Page size in bytes.
    pub page_size: u64,
    /// Cached permissions.
    pub prot: Prot,
    /// Whether the entry is marked stale.
    pub stale: bool,
}

impl IotlbEntry {
    fn from_parts(key: &TlbKey, value: &TlbValue) -> Self {
        Self {
            asid: key.asid,
            iova: Iova::new(key.vpn << key.shift),
            pa: value.pa_base,
            page_size: 1 << key.shift,
            prot: value.prot,
            stale: value.stale,
        }
    }
}

/// A set-associative IOTLB of leaf translations of any power-of-two page size. See the
/// module docs for indexing, stale entries and threading.
#[derive(Clone)]
pub struct Iotlb {
    config: IotlbConfig,
    core: SetAssoc<TlbKey, TlbValue>,
    /// Entries held per page shift.
    shift_counts: [u32; 64],
    /// Bit n set when some entry has a 2^n-byte page.
    shift_bitmap: u64,
}

impl fmt::Debug for Iotlb {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Iotlb")
            .field("config", &self.config)
            .field("len", &self.core.len())
            .field("page_sizes", &format_args!("{:#x}", self.shift_bitmap))
            .finish()
    }
}

/// Books one entry of `shift` in or out of the page-size counts.
#[inline]
fn count_shift(counts: &mut [u32; 64], bitmap: &mut u64, shift: u8, added: bool) {
    let c = &mut counts[usize::from(shift)];
    if added {
        *c += 1;
        *bitmap |= 1 << shift;
    } else {
        *c -= 1;
        if *c == 0 {
            *bitmap &= !(1 << shift);
        }
    }
}

/// The key (with its page shift) and the valid, not-stale value of a page entry of `asid`
/// mapping `iova_page_base` to `pa_base` with `page_size` and `prot`: what both insert
/// paths of [`Iotlb`] store.
#[inline]
fn fresh_entry(
    asid: Asid,
    iova_page_base: Iova,
    pa_base: PhysAddr,
    page_size: u64,
    prot: Prot,
) -> (u8, TlbKey, TlbValue) {
    let shift = page_size.trailing_zeros() as u8;
    let key = TlbKey {
        asid,
        vpn: iova_page_base.get() >> shift,
        shift,
    };
    let value = TlbValue {
        pa_base,
        prot,
        stale: false,
    };
    (shift, key, value)
}

impl Iotlb {
    /// An empty IOTLB, or the reason `config` is invalid.
    pub fn new(config: IotlbConfig) -> Result<Self, CacheConfigError> {
        config.validate()?;
        Ok(Self {
            config,
            core: SetAssoc::new(config.entries, config.ways, config.policy, config.index),
            shift_counts: [0; 64],
            shift_bitmap: 0,
        })
    }

    /// The configuration it was built with.
    pub fn config(&self) -> &IotlbConfig {
        &self.config
    }

    /// Translates `iova` in address space `asid` if a cached entry covers it.
    ///
    /// Counts one [`WorkRecord::iotlb_hits`] or [`WorkRecord::iotlb_misses`]; a hit on an
    /// entry marked stale also counts [`WorkRecord::iotlb_stale_hits`] (and still
    /// translates). A hit makes the entry most recently used. Probes one set per page size
    /// currently cached, smallest first.
    #[inline]
    pub fn lookup(&mut self, asid: Asid, iova: Iova, work: &mut WorkRecord) -> Option<IotlbHit> {
        let mut sizes = self.shift_bitmap;
        while sizes != 0 {
            let shift = sizes.trailing_zeros();
            sizes &= sizes - 1;
            let key = TlbKey {
                asid,
                vpn: iova.get() >> shift,
                shift: shift as u8,
            };
            if let Some(v) = self.core.get(key.hash(), &key) {
                work.iotlb_hits += 1;
                if v.stale {
                    work.iotlb_stale_hits += 1;
                }
                let page_size = 1u64 << shift;
                return Some(IotlbHit {
                    pa: v.pa_base.add(iova.offset_in(page_size)),
                    prot: v.prot,
                    page_size,
                    stale: v.stale,
                });
            }
        }
        work.iotlb_misses += 1;
        None
    }

    /// Like [`Self::lookup`] but counts nothing and leaves replacement state alone: for
    /// tests, reports and debuggers.
    pub fn probe(&self, asid: Asid, iova: Iova) -> Option<IotlbHit> {
        let mut sizes = self.shift_bitmap;
        while sizes != 0 {
            let shift = sizes.trailing_zeros();
            sizes &= sizes - 1;
            let key = TlbKey {
                asid,
                vpn: iova.get() >> shift,
                shift: shift as u8,
            };
            if let Some(v) = self.core.peek(key.hash(), &key) {
                let page_size = 1u64 << shift;
                return Some(IotlbHit {
                    pa: v.pa_base.add(iova.offset_in(page_size)),
                    prot: v.prot,
                    page_size,
                    stale: v.stale,
                });
            }
        }
        None
    }

    /// Caches the translation of the `page_size` page at `iova_page_base` to `pa_base`
    /// (typically after a walk). An entry with the same tag, page and size is overwritten
    /// (and is no longer stale); otherwise the policy picks a victim in the set, which is
    /// returned.
    ///
    /// `page_size` must be a power of two from 4 KiB to 2^[`MAX_PAGE_SHIFT`], and both
    /// addresses must be aligned to it.
    #[inline]
    pub fn insert(
        &mut self,
        asid: Asid,
        iova_page_base: Iova,
        pa_base: PhysAddr,
        page_size: u64,
        prot: Prot,
    ) -> Result<Option<IotlbEntry>, IotlbError> {
        if !page_size.is_power_of_two()
            || !(MIN_PAGE_SHIFT..=MAX_PAGE_SHIFT).contains(&page_size.trailing_zeros())
        {
            return Err(IotlbError::BadPageSize { page_size });
        }
        if !iova_page_base.is_aligned(page_size) || !pa_base.is_aligned(page_size) {
            return Err(IotlbError::Misaligned {
                iova: iova_page_base.get(),
                pa: pa_base.get(),
                page_size,
            });
        }
        Ok(self.insert_checked(asid, iova_page_base, pa_base, page_size, prot))
    }

    /// [`Iotlb::insert`] for a caller that has just seen [`Iotlb::lookup`] of an address in
    /// the page miss, with the IOTLB held (`&mut`) since: no entry of `asid` can hold the
    /// page at any size (the lookup probed every size cached), so the set is not searched
    /// for it before a way is filled. Same victim, contents and replacement state as
    /// [`Iotlb::insert`]. The page size and alignment must be valid (a walk's result is).
    #[inline]
    pub(crate) fn insert_after_miss(
        &mut self,
        asid: Asid,
        iova_page_base: Iova,
        pa_base: PhysAddr,
        page_size: u64,
        prot: Prot,
    ) -> Option<IotlbEntry> {
        debug_assert!(
            page_size.is_power_of_two()
                && (MIN_PAGE_SHIFT..=MAX_PAGE_SHIFT).contains(&page_size.trailing_zeros())
                && iova_page_base.is_aligned(page_size)
                && pa_base.is_aligned(page_size),
            "insert_after_miss of a bad page: {page_size:#x} at {iova_page_base}"
        );
        let (shift, key, value) = fresh_entry(asid, iova_page_base, pa_base, page_size, prot);
        let evicted = self.core.insert_absent(key.hash(), key, value);
        // The page was not cached: the insert filled an empty way or evicted another.
        if let Some((k, _)) = &evicted {
            count_shift(
                &mut self.shift_counts,
                &mut self.shift_bitmap,
                k.shift,
                false,
            );
        }
        count_shift(&mut self.shift_counts, &mut self.shift_bitmap, shift, true);
        evicted.map(|(k, v)| IotlbEntry::from_parts(&k, &v))
    }

    /// The insert of a valid page.
    #[inline]
    fn insert_checked(
        &mut self,
        asid: Asid,
        iova_page_base: Iova,
        pa_base: PhysAddr,
        page_size: u64,
        prot: Prot,
    ) -> Option<IotlbEntry> {
        let (shift, key, value) = fresh_entry(asid, iova_page_base, pa_base, page_size, prot);
        let before = self.core.len();
        let evicted = self.core.insert(key.hash(), key, value);
        if self.core.len() > before {
            count_shift(&mut self.shift_counts, &mut self.shift_bitmap, shift, true);
        }
        evicted.map(|(k, v)| {
            count_shift(
                &mut self.shift_counts,
                &mut self.shift_bitmap,
                k.shift,
                false,
            );
            count_shift(&mut self.shift_counts, &mut self.shift_bitmap, shift, true);
            IotlbEntry::from_parts(&k, &v)
        })
    }

    /// Applies `f` to every entry of `asid` whose page overlaps `first..=last`; entries for
    /// which it returns false are removed. Returns the number removed.
    ///
    /// Visits, per page size cached, the set of each page the range touches; when the range
    /// touches more pages of some size than there are sets, scans the whole cache once
    /// instead, so the cost is bounded by the cache size whatever the range.
    fn retain_range(
        &mut self,
        asid: Asid,
        first: u64,
        last: u64,
        mut f: impl FnMut(&mut TlbValue) -> bool,
    ) -> usize {
        let sets = self.core.sets as u64;
        let counts = &mut self.shift_counts;
        let bitmap = &mut self.shift_bitmap;
        let sizes = *bitmap;
        if sizes != 0 && first >> sizes.trailing_zeros() == last >> sizes.trailing_zeros() {
            // One page of the smallest size cached, so of every size: one key per size
            // (what the loops below do for such a range, without their bounds).
            let mut removed = 0;
            for shift in bit_iter(sizes) {
                let key = TlbKey {
                    asid,
                    vpn: first >> shift,
                    shift: shift as u8,
                };
                let set = self.core.set_of(key.hash());
                removed += self.core.retain_key(set, &key, |k, v| {
                    if f(v) {
                        return true;
                    }
                    count_shift(counts, bitmap, k.shift, false);
                    false
                });
            }
            return removed;
        }
        let full_scan = touches_sets_or_more(sizes, first, last, sets);
        if full_scan {
            return self.core.retain_all(|k, v| {
                if k.asid != asid || !k.overlaps(first, last) || f(v) {
                    return true;
                }
                count_shift(counts, bitmap, k.shift, false);
                false
            });
        }
        let mut removed = 0;
        for shift in bit_iter(sizes) {
            for vpn in (first >> shift)..(last >> shift) + 1 {
                let key = TlbKey {
                    asid,
                    vpn,
                    shift: shift as u8,
                };
                let set = self.core.set_of(key.hash());
                removed += self.core.retain_key(set, &key, |k, v| {
                    if f(v) {
                        return true;
                    }
                    count_shift(counts, bitmap, k.shift, false);
                    false
                });
            }
        }
        removed
    }

    /// Marks every entry of `asid` whose page overlaps `size` bytes at `iova` as stale: the
    /// owner removed those mappings from the table but has not invalidated them yet. The
    /// entries keep translating; hits on them count as stale hits. Returns how many entries
    /// were newly marked.
    pub fn mark_stale_range(&mut self, asid: Asid, iova: Iova, size: u64) -> usize {
        let Some(last) = range_last(iova, size) else {
            return 0;
        };
        let mut marked = 0;
        self.retain_range(asid, iova.get(), last, |v| {
            if !v.stale {
                v.stale = true;
                marked += 1;
            }
            true
        });
        marked
    }

    /// Removes the entries of `asid` whose page contains `iova` (an SMMU `TLBI VA`).
    /// Returns how many were removed.
    ///
    /// The IOTLB holds only leaf entries, so `leaf_only` changes nothing here; with
    /// `leaf_only == false` the owner also calls [`WalkCache::invalidate_va`].
    pub fn invalidate_va(&mut self, asid: Asid, iova: Iova, leaf_only: bool) -> usize {
        let _ = leaf_only;
        // `retain_range` of one address: one page per size cached, never a full scan.
        let counts = &mut self.shift_counts;
        let bitmap = &mut self.shift_bitmap;
        let mut removed = 0;
        for shift in bit_iter(*bitmap) {
            let key = TlbKey {
                asid,
                vpn: iova.get() >> shift,
                shift: shift as u8,
            };
            let set = self.core.set_of(key.hash());
            removed += self.core.retain_key(set, &key, |k, _| {
                count_shift(counts, bitmap, k.shift, false);
                false
            });
        }
        removed
    }

    /// Removes the entries of `asid` whose page overlaps `size` bytes at `iova` (a range
    /// invalidation). Returns how many were removed.
    pub fn invalidate_range(&mut self, asid: Asid, iova: Iova, size: u64) -> usize {
        match range_last(iova, size) {
            Some(last) => self.retain_range(asid, iova.get(), last, |_| false),
            None => 0,
        }
    }

    /// Removes every entry of `asid`. Returns how many were removed.
    pub fn invalidate_asid(&mut self, asid: Asid) -> usize {
        let counts = &mut self.shift_counts;
        let bitmap = &mut self.shift_bitmap;
        self.core.retain_all(|k, _| {
            if k.asid != asid {
                return true;
            }
            count_shift(counts, bitmap, k.shift, false);
            false
        })
    }

    /// Removes every entry. Returns how many were removed.
    pub fn invalidate_all(&mut self) -> usize {
        self.shift_counts = [0; 64];
        self.shift_bitmap = 0;
        self.core.clear()
    }

    /// Valid entries held.
    pub fn len(&self) -> usize {
        self.core.len()
    }

    /// Whether no entry is held.
    pub fn is_empty(&self) -> bool {
        self.core.len() == 0
    }

    /// Total entries (sets times ways).
    pub fn capacity(&self) -> usize {
        self.core.capacity()
    }

    /// Number of sets.
    pub fn sets(&self) -> usize {
        self.core.sets
    }

    /// Entries per set.
    pub fn ways(&self) -> usize {
        self.core.ways
    }

    /// Valid entries in set `set` (`set < self.sets()`).
    pub fn set_len(&self, set: usize) -> usize {
        self.core.set_len(set)
    }

    /// Valid entries in the fullest set.
    pub fn max_set_len(&self) -> usize {
        self.core.max_set_len()
    }

    /// Entries tagged `asid` (a scan of the whole cache).
    pub fn count_asid(&self, asid: Asid) -> usize {
        self.core.iter().filter(|(k, _)| k.asid == asid).count()
    }

    /// Entries marked stale (a scan of the whole cache).
    pub fn count_stale(&self) -> usize {
        self.core.iter().filter(|(_, v)| v.stale).count()
    }

    /// Bitmap of the page sizes currently cached (bit n set: some entry maps 2^n bytes).
    pub fn page_sizes_cached(&self) -> u64 {
        self.shift_bitmap
    }

    /// Every valid entry, in storage order.
    pub fn entries(&self) -> impl Iterator<Item = IotlbEntry> + '_ {
        self.core.iter().map(|(k, v)| IotlbEntry::from_parts(k, v))
    }
}

/// Whether `first..=last` touches at least `sets` pages of some page size in `sizes` (a
/// page-size bitmap). Pages touched only shrink as the page size grows, so the smallest
/// size decides: the same answer as asking every size, with one shift.
#[inline]
fn touches_sets_or_more(sizes: u64, first: u64, last: u64, sets: u64) -> bool {
    sizes != 0 && {
        let shift = sizes.trailing_zeros();
        (last >> shift) - (first >> shift) >= sets
    }
}

/// The set bits of `bits`, lowest first.
fn bit_iter(mut bits: u64) -> impl Iterator<Item = u32> {
    std::iter::from_fn(move || {
        (bits != 0).then(|| {
            let b = bits.trailing_zeros();
            bits &= bits - 1;
            b
        })
    })
}

// ---------------------------------------------------------------------------------------
// The walk cache.
// ---------------------------------------------------------------------------------------

/// Geometry of one [`WalkCache`] level.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct WalkLevelConfig {
    /// Entries at this level; 0 disables caching at this level.
    pub entries: usize,
    /// Entries per set; ignored when `entries` is 0.
    pub ways: usize,
    /// Base-2 logarithm of the IOVA range one descriptor at this level covers (39, 30, 21
    /// for levels 0 to 2 of a 4 KiB-granule LPAE table).
    pub span_shift: u32,
}

/// Geometry and replacement policy of a [`WalkCache`]: level `n` caches descriptors read
/// from level-`n` tables, each pointing to a level-`n + 1` table.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct WalkCacheConfig {
    /// Per-level geometry, root level first.
    pub levels: Vec<WalkLevelConfig>,
    /// Which entry of a full set to evict (shared by all levels; each level has its own
    /// replacement state).
    pub policy: Replacement,
}

impl WalkCacheConfig {
    /// gem5's SMMUv3 stage-1 walk cache: 4, 28, 348 and 4 entries for levels 0 to 3, 4-way,
    /// round-robin (`SMMUv3.walk_S1L0..walk_S1L3`, `walk_assoc = 4`, `walk_policy = "rr"`,
    /// in gem5 `src/dev/arm/SMMUv3.py`; 4-cycle lookup). Spans are those of a 4 KiB-granule
    /// LPAE table: 512 GiB, 1 GiB, 2 MiB and 4 KiB.
    ///
    /// gem5 also caches leaf descriptors in its walk cache; here leaves live in the
    /// [`Iotlb`], so with a 4 KiB granule (no level-3 table descriptors) level 3 stays empty.
    /// (gem5's default `wc_s1_levels = 7` leaves level 3 uncached too.) The level-1 and
    /// level-2 caches have 7 and 87 sets.
    pub fn gem5() -> Self {
        let level = |entries, span_shift| WalkLevelConfig {
            entries,
            ways: 4,
            span_shift,
        };
        Self {
            levels: vec![level(4, 39), level(28, 30), level(348, 21), level(4, 12)],
            policy: Replacement::RoundRobin,
        }
    }

    /// Checks every level's geometry, that spans shrink strictly from one level to the next
    /// within `12..=63`, and the caps on levels and total entries.
    pub fn validate(&self) -> Result<(), CacheConfigError> {
        if self.levels.is_empty() {
            return Err(CacheConfigError::NoLevels);
        }
        if self.levels.len() > MAX_WALK_LEVELS {
            return Err(CacheConfigError::TooManyLevels {
                levels: self.levels.len(),
                max: MAX_WALK_LEVELS,
            });
        }
        let mut total = 0usize;
        let mut above = 64;
        for (level, cfg) in self.levels.iter().enumerate() {
            if !(MIN_PAGE_SHIFT..=63).contains(&cfg.span_shift) || cfg.span_shift >= above {
                return Err(CacheConfigError::BadSpan {
                    level,
                    span_shift: cfg.span_shift,
                });
            }
            above = cfg.span_shift;
            if cfg.entries != 0 {
                validate_geometry(cfg.entries, cfg.ways).map_err(|e| CacheConfigError::Level {
                    level,
                    source: Box::new(e),
                })?;
            }
            total = total.saturating_add(cfg.entries);
        }
        if total > MAX_CACHE_ENTRIES {
            return Err(CacheConfigError::TooManyEntries {
                entries: total,
                max: MAX_CACHE_ENTRIES,
            });
        }
        Ok(())
    }
}

/// Tag of a walk-cache entry within its level: address space and IOVA prefix (the IOVA
/// shifted right by the level's span).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
struct WalkKey {
    asid: Asid,
    prefix: u64,
}

impl WalkKey {
    #[inline]
    fn hash(&self) -> u64 {
        tag_hash(self.asid, self.prefix)
    }
}

/// A cached table descriptor, as returned by [`WalkCache::lookup_deepest`] and
/// [`WalkCache::entries`].
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct WalkEntry {
    /// Address-space tag.
    pub asid: Asid,
    /// Level of the table the descriptor was read from.
    pub level: usize,
    /// First IOVA the descriptor covers.
    pub iova: Iova,
    /// Bytes of IOVA the descriptor covers.
    pub span: u64,
    /// Physical address of the next-level table it points to.
    pub table_pa: PhysAddr,
}

/// Lookup counts of one walk-cache level, kept by the cache itself: a walk-cache hit saves
/// walk reads, which the walker counts in [`WorkRecord::walk_reads`].
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct WalkLevelStats {
    /// Lookups at this level that hit.
    pub hits: u64,
    /// Lookups at this level that missed.
    pub misses: u64,
}

#[derive(Clone, Debug)]
struct WalkLevel {
    span_shift: u32,
    /// `None` when the level has no entries.
    core: Option<SetAssoc<WalkKey, PhysAddr>>,
    stats: WalkLevelStats,
}

impl WalkLevel {
    fn entry(&self, level: usize, key: &WalkKey, table_pa: PhysAddr) -> WalkEntry {
        WalkEntry {
            asid: key.asid,
            level,
            iova: Iova::new(key.prefix << self.span_shift),
            span: 1 << self.span_shift,
            table_pa,
        }
    }

    /// Removes the entries of `asid` at this level overlapping `first..=last`.
    fn invalidate_range(&mut self, asid: Asid, first: u64, last: u64) -> usize {
        let shift = self.span_shift;
        let Some(core) = self.core.as_mut() else {
            return 0;
        };
        let (lo, hi) = (first >> shift, last >> shift);
        let overlaps = |k: &WalkKey| k.asid == asid && k.prefix >= lo && k.prefix <= hi;
        if hi - lo >= core.sets as u64 {
            return core.retain_all(|k, _| !overlaps(k));
        }
        let mut removed = 0;
        for prefix in lo..=hi {
            let key = WalkKey { asid, prefix };
            let set = core.set_of(key.hash());
            removed += core.retain_key(set, &key, |_, _| false);
        }
        removed
    }
}

/// Per-level caches of non-leaf table descriptors, keyed by (address space, level, IOVA
/// prefix the descriptor covers), holding the next-level table's physical address. Each
/// level is its own set-associative cache with its own size. See the module docs for
/// threading.
#[derive(Clone)]
pub struct WalkCache {
    config: WalkCacheConfig,
    levels: Vec<WalkLevel>,
}

impl fmt::Debug for WalkCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WalkCache")
            .field("config", &self.config)
            .field("len", &self.len())
            .finish()
    }
}

impl WalkCache {
    /// An empty walk cache, or the reason `config` is invalid.
    pub fn new(config: WalkCacheConfig) -> Result<Self, CacheConfigError> {
        config.validate()?;
        let levels = config
            .levels
            .iter()
            .enumerate()
            .map(|(i, l)| {
                // Give each level its own random stream.
                let policy = match config.policy {
                    Replacement::Random { seed } => Replacement::Random {
                        seed: SplitMix64(seed ^ (i as u64)).next_u64(),
                    },
                    p => p,
                };
                WalkLevel {
                    span_shift: l.span_shift,
                    core: (l.entries != 0)
                        .then(|| SetAssoc::new(l.entries, l.ways, policy, SetIndex::LowBits)),
                    stats: WalkLevelStats::default(),
                }
            })
            .collect();
        Ok(Self { config, levels })
    }

    /// The configuration it was built with.
    pub fn config(&self) -> &WalkCacheConfig {
        &self.config
    }

    /// Number of levels.
    pub fn levels(&self) -> usize {
        self.levels.len()
    }

    fn check_level(&self, level: usize) -> Result<(), IotlbError> {
        if level < self.levels.len() {
            Ok(())
        } else {
            Err(IotlbError::NoSuchLevel {
                level,
                levels: self.levels.len(),
            })
        }
    }

    /// Caches the descriptor read from a level-`level` table for `iova` (any address in the
    /// range it covers), pointing to the next-level table at `table_pa`. Overwrites an entry
    /// for the same prefix; otherwise returns the entry evicted, if any. A level with no
    /// entries drops the insert.
    pub fn insert(
        &mut self,
        asid: Asid,
        level: usize,
        iova: Iova,
        table_pa: PhysAddr,
    ) -> Result<Option<WalkEntry>, IotlbError> {
        self.check_level(level)?;
        let lvl = &mut self.levels[level];
        let key = WalkKey {
            asid,
            prefix: iova.get() >> lvl.span_shift,
        };
        let Some(core) = lvl.core.as_mut() else {
            return Ok(None);
        };
        let evicted = core.insert(key.hash(), key, table_pa);
        Ok(evicted.map(|(k, pa)| lvl.entry(level, &k, pa)))
    }

    /// The next-level table for `iova` cached at `level`, marking it used and counting a
    /// hit or miss in that level's [`WalkLevelStats`]. `None` also for a level that does
    /// not exist.
    #[inline]
    pub fn lookup(&mut self, asid: Asid, level: usize, iova: Iova) -> Option<PhysAddr> {
        let lvl = self.levels.get_mut(level)?;
        let key = WalkKey {
            asid,
            prefix: iova.get() >> lvl.span_shift,
        };
        let hit = lvl
            .core
            .as_mut()
            .and_then(|c| c.get(key.hash(), &key).copied());
        if hit.is_some() {
            lvl.stats.hits += 1;
        } else {
            lvl.stats.misses += 1;
        }
        hit
    }

    /// The deepest cached descriptor for `iova`: probes levels from the deepest up and
    /// stops at the first hit, so a walker can resume at `level + 1` from `table_pa`.
    /// Counts a hit or miss at every level probed.
    pub fn lookup_deepest(&mut self, asid: Asid, iova: Iova) -> Option<WalkEntry> {
        let (level, table_pa) = self.lookup_deepest_table(asid, iova)?;
        let lvl = &self.levels[level];
        let key = WalkKey {
            asid,
            prefix: iova.get() >> lvl.span_shift,
        };
        Some(lvl.entry(level, &key, table_pa))
    }

    /// [`WalkCache::lookup_deepest`] as the walker uses it: the level of the deepest hit
    /// and the next-level table it points to (the same probes, counts and replacement
    /// state), without building the entry.
    #[inline]
    pub(crate) fn lookup_deepest_table(
        &mut self,
        asid: Asid,
        iova: Iova,
    ) -> Option<(usize, PhysAddr)> {
        for (level, lvl) in self.levels.iter_mut().enumerate().rev() {
            let key = WalkKey {
                asid,
                prefix: iova.get() >> lvl.span_shift,
            };
            // An empty level misses without a probe (the same miss, counted the same).
            let hit = match lvl.core.as_mut() {
                Some(c) if c.len != 0 => c.get(key.hash(), &key).copied(),
                _ => None,
            };
            match hit {
                Some(table_pa) => {
                    lvl.stats.hits += 1;
                    return Some((level, table_pa));
                }
                None => lvl.stats.misses += 1,
            }
        }
        None
    }

    /// Removes, at every level, the entries of `asid` covering `iova` (an SMMU `TLBI VA`
    /// with `Leaf = 0`). With `leaf_only` the walk cache is untouched (as an SMMU may, for
    /// `Leaf = 1`) and 0 is returned. Returns how many were removed.
    pub fn invalidate_va(&mut self, asid: Asid, iova: Iova, leaf_only: bool) -> usize {
        if leaf_only {
            return 0;
        }
        self.levels
            .iter_mut()
            .map(|l| l.invalidate_range(asid, iova.get(), iova.get()))
            .sum()
    }

    /// Removes, at every level, the entries of `asid` whose covered range overlaps `size`
    /// bytes at `iova`: what a freed table page needs (pass the table's
    /// [`FreedTable`](crate::pgtable::FreedTable) range). Returns how many were removed.
    pub fn invalidate_range(&mut self, asid: Asid, iova: Iova, size: u64) -> usize {
        let Some(last) = range_last(iova, size) else {
            return 0;
        };
        self.levels
            .iter_mut()
            .map(|l| l.invalidate_range(asid, iova.get(), last))
            .sum()
    }

    /// Removes every entry of `asid`. Returns how many were removed.
    pub fn invalidate_asid(&mut self, asid: Asid) -> usize {
        self.levels
            .iter_mut()
            .filter_map(|l| l.core.as_mut())
            .map(|c| c.retain_all(|k, _| k.asid != asid))
            .sum()
    }

    /// Removes every entry. Returns how many were removed.
    pub fn invalidate_all(&mut self) -> usize {
        self.levels
            .iter_mut()
            .filter_map(|l| l.core.as_mut())
            .map(SetAssoc::clear)
            .sum()
    }

    /// Valid entries over all levels.
    pub fn len(&self) -> usize {
        self.levels
            .iter()
            .filter_map(|l| l.core.as_ref())
            .map(SetAssoc::len)
            .sum()
    }

    /// Whether no entry is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Total entries over all levels.
    pub fn capacity(&self) -> usize {
        self.levels
            .iter()
            .filter_map(|l| l.core.as_ref())
            .map(SetAssoc::capacity)
            .sum()
    }

    /// Valid entries at `level` (0 for a level that does not exist).
    pub fn level_len(&self, level: usize) -> usize {
        self.levels
            .get(level)
            .and_then(|l| l.core.as_ref())
            .map_or(0, SetAssoc::len)
    }

    /// Capacity of `level` (0 for a disabled level or one that does not exist).
    pub fn level_capacity(&self, level: usize) -> usize {
        self.levels
            .get(level)
            .and_then(|l| l.core.as_ref())
            .map_or(0, SetAssoc::capacity)
    }

    /// Entries per set at `level` (0 for a disabled level or one that does not exist).
    pub fn level_ways(&self, level: usize) -> usize {
        self.levels
            .get(level)
            .and_then(|l| l.core.as_ref())
            .map_or(0, |c| c.ways)
    }

    /// Valid entries in the fullest set of `level`.
    pub fn level_max_set_len(&self, level: usize) -> usize {
        self.levels
            .get(level)
            .and_then(|l| l.core.as_ref())
            .map_or(0, SetAssoc::max_set_len)
    }

    /// Lookup counts at `level` (zeros for a level that does not exist).
    pub fn level_stats(&self, level: usize) -> WalkLevelStats {
        self.levels
            .get(level)
            .map_or_else(WalkLevelStats::default, |l| l.stats)
    }

    /// Entries tagged `asid` over all levels (a scan).
    pub fn count_asid(&self, asid: Asid) -> usize {
        self.entries().filter(|e| e.asid == asid).count()
    }

    /// Every valid entry, level by level.
    pub fn entries(&self) -> impl Iterator<Item = WalkEntry> + '_ {
        self.levels.iter().enumerate().flat_map(|(level, l)| {
            l.core
                .iter()
                .flat_map(move |c| c.iter().map(move |(k, pa)| l.entry(level, k, *pa)))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::addr::{SZ_1G, SZ_2M, SZ_4K};

    const A: Asid = Asid(1);
    const B: Asid = Asid(2);

    fn tlb(entries: usize, ways: usize, policy: Replacement) -> Iotlb {
        Iotlb::new(IotlbConfig::new(entries, ways, policy)).unwrap()
    }

    fn iova(v: u64) -> Iova {
        Iova::new(v)
    }

    fn pa(v: u64) -> PhysAddr {
        PhysAddr::new(v)
    }

    /// Inserts a 4 KiB page mapping page `n` to frame `0x1000 + n`.
    fn put4k(t: &mut Iotlb, asid: Asid, n: u64) -> Option<IotlbEntry> {
        t.insert(
            asid,
            iova(n * SZ_4K),
            pa((0x1000 + n) * SZ_4K),
            SZ_4K,
            Prot::READ_WRITE,
        )
        .unwrap()
    }

    fn hits(t: &mut Iotlb, asid: Asid, n: u64) -> bool {
        t.lookup(asid, iova(n * SZ_4K), &mut WorkRecord::new())
            .is_some()
    }

    #[test]
    fn hit_after_insert_translates_with_offset_and_counts() {
        let mut t = tlb(64, 4, Replacement::Lru);
        put4k(&mut t, A, 5);
        let mut w = WorkRecord::new();
        let hit = t.lookup(A, iova(5 * SZ_4K + 0x123), &mut w).unwrap();
        assert_eq!(hit.pa, pa(0x1005 * SZ_4K + 0x123));
        assert_eq!(
            (hit.prot, hit.page_size, hit.stale),
            (Prot::READ_WRITE, SZ_4K, false)
        );
        assert_eq!(
            (w.iotlb_hits, w.iotlb_misses, w.iotlb_stale_hits),
            (1, 0, 0)
        );
    }

    #[test]
    fn lookup_misses_for_another_asid() {
        let mut t = tlb(64, 4, Replacement::Lru);
        put4k(&mut t, A, 5);
        let mut w = WorkRecord::new();
        assert_eq!(t.lookup(B, iova(5 * SZ_4K), &mut w), None);
        assert_eq!((w.iotlb_hits, w.iotlb_misses), (0, 1));
    }

    #[test]
    fn insert_of_same_page_overwrites_in_place() {
        let mut t = tlb(64, 4, Replacement::Lru);
        put4k(&mut t, A, 5);
        t.insert(A, iova(5 * SZ_4K), pa(0x9000), SZ_4K, Prot::READ)
            .unwrap();
        assert_eq!(t.len(), 1);
        assert_eq!(t.probe(A, iova(5 * SZ_4K)).unwrap().pa, pa(0x9000));
    }

    #[test]
    fn lru_evicts_least_recently_used_in_full_set() {
        let mut t = tlb(4, 4, Replacement::Lru);
        for n in 0..4 {
            assert_eq!(put4k(&mut t, A, n), None);
        }
        assert!(hits(&mut t, A, 0));
        let evicted = put4k(&mut t, A, 4).unwrap();
        assert_eq!(evicted.iova, iova(SZ_4K), "page 1 was least recently used");
        assert!(hits(&mut t, A, 0));
    }

    #[test]
    fn round_robin_cycles_through_ways_ignoring_use() {
        let mut t = tlb(4, 4, Replacement::RoundRobin);
        for n in 0..4 {
            put4k(&mut t, A, n);
        }
        assert!(hits(&mut t, A, 0));
        let victims: Vec<u64> = (4..10)
            .map(|n| put4k(&mut t, A, n).unwrap().iova.get() / SZ_4K)
            .collect();
        assert_eq!(victims, [0, 1, 2, 3, 4, 5]);
    }

    #[test]
    fn random_with_same_seed_evicts_same_sequence() {
        let run = |seed| {
            let mut t = tlb(8, 8, Replacement::Random { seed });
            (0..200)
                .filter_map(|n| put4k(&mut t, A, n))
                .map(|e| e.iova)
                .collect::<Vec<_>>()
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
    }

    #[test]
    fn empty_ways_fill_before_any_eviction() {
        let mut t = tlb(16, 16, Replacement::Random { seed: 3 });
        for n in 0..16 {
            assert_eq!(put4k(&mut t, A, n), None);
        }
        assert_eq!(t.len(), 16);
    }

    #[test]
    fn two_mib_entry_covers_every_4k_page_inside() {
        let mut t = tlb(64, 4, Replacement::Lru);
        let base = 3 * SZ_2M;
        t.insert(A, iova(base), pa(7 * SZ_2M), SZ_2M, Prot::READ)
            .unwrap();
        let mut w = WorkRecord::new();
        for off in (0..SZ_2M).step_by(SZ_4K as usize) {
            let hit = t.lookup(A, iova(base + off + 8), &mut w).unwrap();
            assert_eq!((hit.pa, hit.page_size), (pa(7 * SZ_2M + off + 8), SZ_2M));
        }
        assert_eq!(w.iotlb_hits, 512);
        assert_eq!(t.probe(A, iova(base - 1)), None);
        assert_eq!(t.probe(A, iova(base + SZ_2M)), None);
    }

    #[test]
    fn lookup_probes_every_cached_page_size() {
        let mut t = tlb(64, 4, Replacement::Lru);
        put4k(&mut t, A, 1);
        t.insert(A, iova(SZ_1G), pa(SZ_1G), SZ_1G, Prot::READ)
            .unwrap();
        t.insert(A, iova(SZ_2M), pa(4 * SZ_2M), SZ_2M, Prot::READ)
            .unwrap();
        assert_eq!(t.page_sizes_cached(), SZ_4K | SZ_2M | SZ_1G);
        assert_eq!(t.probe(A, iova(SZ_4K)).unwrap().page_size, SZ_4K);
        assert_eq!(t.probe(A, iova(SZ_2M + 5)).unwrap().pa, pa(4 * SZ_2M + 5));
        assert_eq!(t.probe(A, iova(SZ_1G + SZ_2M)).unwrap().page_size, SZ_1G);
    }

    #[test]
    fn smallest_page_wins_when_sizes_overlap() {
        let mut t = tlb(64, 4, Replacement::Lru);
        t.insert(A, iova(0), pa(SZ_2M), SZ_2M, Prot::READ).unwrap();
        put4k(&mut t, A, 3);
        assert_eq!(t.probe(A, iova(3 * SZ_4K)).unwrap().pa, pa(0x1003 * SZ_4K));
        assert_eq!(
            t.probe(A, iova(4 * SZ_4K)).unwrap().pa,
            pa(SZ_2M + 4 * SZ_4K)
        );
    }

    #[test]
    fn evicting_last_entry_of_a_size_clears_its_bit() {
        let mut t = tlb(1, 1, Replacement::Lru);
        t.insert(A, iova(0), pa(0), SZ_2M, Prot::READ).unwrap();
        put4k(&mut t, A, 1);
        assert_eq!(t.page_sizes_cached(), SZ_4K);
    }

    #[test]
    fn stale_entries_keep_translating_and_count_stale_hits() {
        let mut t = tlb(64, 4, Replacement::Lru);
        for n in 0..4 {
            put4k(&mut t, A, n);
        }
        assert_eq!(t.mark_stale_range(A, iova(SZ_4K), 2 * SZ_4K), 2);
        assert_eq!(
            t.mark_stale_range(A, iova(SZ_4K), 2 * SZ_4K),
            0,
            "already stale"
        );
        let mut w = WorkRecord::new();
        let hit = t.lookup(A, iova(SZ_4K), &mut w).unwrap();
        assert_eq!((hit.pa, hit.stale), (pa(0x1001 * SZ_4K), true));
        assert!(!t.lookup(A, iova(0), &mut w).unwrap().stale);
        assert_eq!(
            (w.iotlb_hits, w.iotlb_stale_hits, w.iotlb_misses),
            (2, 1, 0)
        );
        assert_eq!((t.len(), t.count_stale()), (4, 2));
    }

    #[test]
    fn stale_marking_leaves_other_asids_alone() {
        let mut t = tlb(64, 4, Replacement::Lru);
        put4k(&mut t, A, 1);
        put4k(&mut t, B, 1);
        t.mark_stale_range(A, iova(0), SZ_2M);
        assert!(!t.probe(B, iova(SZ_4K)).unwrap().stale);
    }

    #[test]
    fn reinsert_clears_stale() {
        let mut t = tlb(64, 4, Replacement::Lru);
        put4k(&mut t, A, 1);
        t.mark_stale_range(A, iova(SZ_4K), SZ_4K);
        put4k(&mut t, A, 1);
        assert!(!t.probe(A, iova(SZ_4K)).unwrap().stale);
    }

    #[test]
    fn invalidate_va_removes_only_the_containing_page() {
        let mut t = tlb(64, 4, Replacement::Lru);
        for n in 0..4 {
            put4k(&mut t, A, n);
        }
        put4k(&mut t, B, 2);
        assert_eq!(t.invalidate_va(A, iova(2 * SZ_4K + 9), true), 1);
        assert_eq!(t.probe(A, iova(2 * SZ_4K)), None);
        assert!(t.probe(B, iova(2 * SZ_4K)).is_some());
        assert_eq!(t.count_asid(A), 3);
    }

    #[test]
    fn invalidate_va_removes_a_large_page_containing_it() {
        let mut t = tlb(64, 4, Replacement::Lru);
        t.insert(A, iova(SZ_2M), pa(0), SZ_2M, Prot::READ).unwrap();
        assert_eq!(t.invalidate_va(A, iova(SZ_2M + 0x5000), false), 1);
        assert!(t.is_empty());
        assert_eq!(t.page_sizes_cached(), 0);
    }

    #[test]
    fn invalidate_range_removes_overlapping_pages_only() {
        let mut t = tlb(64, 4, Replacement::Lru);
        for n in 0..8 {
            put4k(&mut t, A, n);
        }
        t.insert(A, iova(SZ_2M), pa(0), SZ_2M, Prot::READ).unwrap();
        put4k(&mut t, B, 3);
        assert_eq!(t.invalidate_range(A, iova(2 * SZ_4K + 1), 4 * SZ_4K - 1), 4);
        let mut left: Vec<u64> = t.entries().map(|e| e.iova.get() / SZ_4K).collect();
        left.sort_unstable();
        assert_eq!(
            left,
            [0, 1, 3, 6, 7, 512],
            "pages 2..=5 of A went, B's page 3 stayed"
        );
        // A range whose last byte is the block's first byte removes the block.
        assert_eq!(t.invalidate_range(A, iova(SZ_2M - 1), 2), 1);
        assert_eq!(t.page_sizes_cached(), SZ_4K);
    }

    #[test]
    fn invalidate_range_of_zero_bytes_removes_nothing() {
        let mut t = tlb(64, 4, Replacement::Lru);
        put4k(&mut t, A, 0);
        assert_eq!(t.invalidate_range(A, iova(0), 0), 0);
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn invalidate_range_larger_than_the_cache_scans_once() {
        let mut t = tlb(64, 4, Replacement::Lru);
        for n in 0..8 {
            put4k(&mut t, A, n);
            put4k(&mut t, B, n);
        }
        assert_eq!(t.invalidate_range(A, iova(SZ_4K), u64::MAX), 7);
        assert_eq!(t.count_asid(A), 1);
        assert_eq!(t.count_asid(B), 8);
    }

    #[test]
    fn invalidate_asid_removes_only_that_asid() {
        let mut t = tlb(64, 4, Replacement::Lru);
        for n in 0..5 {
            put4k(&mut t, A, n);
            put4k(&mut t, B, n);
        }
        assert_eq!(t.invalidate_asid(A), 5);
        assert_eq!((t.count_asid(A), t.count_asid(B)), (0, 5));
        assert!(!hits(&mut t, A, 1));
    }

    #[test]
    fn invalidate_all_empties_the_cache() {
        let mut t = tlb(64, 4, Replacement::Lru);
        for n in 0..5 {
            put4k(&mut t, A, n);
            put4k(&mut t, B, n);
        }
        assert_eq!(t.invalidate_all(), 10);
        assert!(t.is_empty());
        assert_eq!(t.page_sizes_cached(), 0);
        assert!(!hits(&mut t, B, 1));
    }

    #[test]
    fn non_power_of_two_set_count_holds_its_capacity() {
        let mut t = tlb(12, 4, Replacement::Lru);
        assert_eq!(t.sets(), 3);
        for n in 0..12 {
            assert_eq!(put4k(&mut t, A, n), None);
        }
        assert!((0..12).all(|n| hits(&mut t, A, n)));
        assert_eq!(t.max_set_len(), 4);
    }

    #[test]
    fn insert_rejects_bad_page_sizes_and_misalignment() {
        let mut t = tlb(64, 4, Replacement::Lru);
        let bad = |t: &mut Iotlb, iova_v, pa_v, size| {
            t.insert(A, iova(iova_v), pa(pa_v), size, Prot::READ)
                .unwrap_err()
        };
        assert_eq!(
            bad(&mut t, 0, 0, 0x3000),
            IotlbError::BadPageSize { page_size: 0x3000 }
        );
        assert_eq!(
            bad(&mut t, 0, 0, 0x800),
            IotlbError::BadPageSize { page_size: 0x800 }
        );
        assert_eq!(
            bad(&mut t, 0, 0, 1 << 43),
            IotlbError::BadPageSize { page_size: 1 << 43 }
        );
        assert!(matches!(
            bad(&mut t, SZ_4K, 0, SZ_2M),
            IotlbError::Misaligned { .. }
        ));
        assert!(matches!(
            bad(&mut t, 0, SZ_4K, SZ_2M),
            IotlbError::Misaligned { .. }
        ));
        assert!(t.is_empty());
    }

    #[test]
    fn config_errors_are_reported() {
        let err = |e, w| Iotlb::new(IotlbConfig::new(e, w, Replacement::Lru)).unwrap_err();
        assert_eq!(err(0, 0), CacheConfigError::ZeroEntries);
        assert_eq!(err(8, 0), CacheConfigError::ZeroWays);
        assert_eq!(
            err(4, 8),
            CacheConfigError::WaysExceedEntries {
                ways: 8,
                entries: 4
            }
        );
        assert_eq!(
            err(10, 4),
            CacheConfigError::NotWholeSets {
                entries: 10,
                ways: 4
            }
        );
        assert_eq!(
            err(MAX_CACHE_ENTRIES * 2, 4),
            CacheConfigError::TooManyEntries {
                entries: MAX_CACHE_ENTRIES * 2,
                max: MAX_CACHE_ENTRIES
            }
        );
    }

    #[test]
    fn gem5_presets_have_the_documented_geometry() {
        let micro = Iotlb::new(IotlbConfig::gem5_micro_tlb()).unwrap();
        assert_eq!((micro.capacity(), micro.sets(), micro.ways()), (32, 1, 32));
        let main = Iotlb::new(IotlbConfig::gem5_main_tlb()).unwrap();
        assert_eq!((main.capacity(), main.sets(), main.ways()), (2048, 512, 4));
        let walk = WalkCache::new(WalkCacheConfig::gem5()).unwrap();
        let caps: Vec<usize> = (0..4).map(|l| walk.level_capacity(l)).collect();
        assert_eq!(caps, [4, 28, 348, 4]);
        assert_eq!(walk.level_ways(2), 4);
    }

    // ---- walk cache ----

    /// Level spans of the gem5 preset (4 KiB granule).
    const L0: u64 = 1 << 39;

    fn walk() -> WalkCache {
        WalkCache::new(WalkCacheConfig::gem5()).unwrap()
    }

    /// Caches the levels 0..=2 descriptors of a walk for `va`.
    fn fill_walk(w: &mut WalkCache, asid: Asid, va: u64, tag: u64) {
        for level in 0..3 {
            w.insert(
                asid,
                level,
                iova(va),
                pa((tag * 16 + level as u64 + 1) * SZ_4K),
            )
            .unwrap();
        }
    }

    #[test]
    fn walk_cache_hits_at_each_level_for_covered_addresses() {
        let mut w = walk();
        fill_walk(&mut w, A, 5 * SZ_1G + 3 * SZ_2M, 0);
        assert_eq!(w.lookup(A, 0, iova(L0 - 1)), Some(pa(SZ_4K)));
        assert_eq!(w.lookup(A, 1, iova(5 * SZ_1G + 7)), Some(pa(2 * SZ_4K)));
        assert_eq!(
            w.lookup(A, 2, iova(5 * SZ_1G + 3 * SZ_2M + 0x1f_f000)),
            Some(pa(3 * SZ_4K))
        );
        assert_eq!(w.lookup(A, 2, iova(5 * SZ_1G + 4 * SZ_2M)), None);
        assert_eq!(w.lookup(B, 0, iova(0)), None);
        assert_eq!(w.level_stats(2), WalkLevelStats { hits: 1, misses: 1 });
    }

    #[test]
    fn lookup_deepest_returns_the_deepest_cached_level() {
        let mut w = walk();
        fill_walk(&mut w, A, SZ_1G, 0);
        let e = w.lookup_deepest(A, iova(SZ_1G + 0x1234)).unwrap();
        assert_eq!(
            (e.level, e.iova, e.span, e.table_pa),
            (2, iova(SZ_1G), SZ_2M, pa(3 * SZ_4K))
        );
        let e = w.lookup_deepest(A, iova(SZ_1G + SZ_2M)).unwrap();
        assert_eq!(e.level, 1);
        assert_eq!(w.lookup_deepest(B, iova(SZ_1G)), None);
    }

    #[test]
    fn walk_invalidate_va_removes_covering_entries_at_all_levels() {
        let mut w = walk();
        fill_walk(&mut w, A, SZ_1G, 0); // L0 [0, 512G), L1 [1G, 2G), L2 [1G, 1G + 2M)
        fill_walk(&mut w, A, 3 * SZ_1G, 1); // L0 same prefix (overwritten), L1 [3G, 4G), L2
        fill_walk(&mut w, B, SZ_1G, 2);
        assert_eq!(w.len(), 5 + 3);
        assert_eq!(w.invalidate_va(A, iova(SZ_1G + 0x42), false), 3);
        assert_eq!(w.lookup_deepest(A, iova(SZ_1G)), None);
        assert_eq!(w.lookup_deepest(A, iova(3 * SZ_1G)).unwrap().level, 2);
        assert_eq!(w.count_asid(B), 3);
    }

    #[test]
    fn walk_invalidate_va_leaf_only_keeps_the_walk_cache() {
        let mut w = walk();
        fill_walk(&mut w, A, SZ_1G, 0);
        assert_eq!(w.invalidate_va(A, iova(SZ_1G), true), 0);
        assert_eq!(w.len(), 3);
    }

    #[test]
    fn walk_invalidate_range_of_a_freed_table_drops_its_descriptor_and_below() {
        let mut w = walk();
        fill_walk(&mut w, A, SZ_1G, 0);
        fill_walk(&mut w, A, SZ_1G + 4 * SZ_2M, 1);
        // The level-2 table for [1G, 2G) was freed: its level-1 descriptor and every level-2
        // descriptor inside go; the level-0 descriptor covering a wider range does too, as an
        // overlapping non-leaf entry.
        assert_eq!(w.invalidate_range(A, iova(SZ_1G), SZ_1G), 1 + 1 + 2);
        assert!(w.is_empty());
    }

    #[test]
    fn walk_invalidate_range_leaves_disjoint_entries() {
        let mut w = walk();
        fill_walk(&mut w, A, SZ_1G, 0);
        fill_walk(&mut w, A, 2 * SZ_1G, 1);
        assert_eq!(w.invalidate_range(A, iova(2 * SZ_1G + SZ_2M), SZ_2M), 2);
        assert_eq!(
            w.level_len(2),
            2,
            "only [2G+2M, 2G+4M) was covered; no L2 entry there"
        );
        assert_eq!(w.level_len(1), 1);
    }

    #[test]
    fn walk_invalidate_asid_and_all() {
        let mut w = walk();
        fill_walk(&mut w, A, SZ_1G, 0);
        fill_walk(&mut w, B, SZ_1G, 1);
        assert_eq!(w.invalidate_asid(A), 3);
        assert_eq!((w.count_asid(A), w.count_asid(B)), (0, 3));
        assert_eq!(w.invalidate_all(), 3);
        assert!(w.is_empty());
    }

    #[test]
    fn walk_level_with_seven_sets_holds_its_capacity() {
        let mut w = walk();
        for n in 0..28 {
            assert_eq!(
                w.insert(A, 1, iova(n * SZ_1G), pa(n * SZ_4K)).unwrap(),
                None
            );
        }
        assert!((0..28).all(|n| w.lookup(A, 1, iova(n * SZ_1G)).is_some()));
        assert!(w.insert(A, 1, iova(28 * SZ_1G), pa(0)).unwrap().is_some());
        assert_eq!(w.level_len(1), 28);
    }

    #[test]
    fn disabled_walk_level_drops_inserts() {
        let mut cfg = WalkCacheConfig::gem5();
        cfg.levels[0].entries = 0;
        let mut w = WalkCache::new(cfg).unwrap();
        assert_eq!(w.insert(A, 0, iova(0), pa(SZ_4K)).unwrap(), None);
        assert_eq!(w.lookup(A, 0, iova(0)), None);
        assert_eq!(w.level_capacity(0), 0);
    }

    #[test]
    fn walk_insert_rejects_missing_level() {
        let mut w = walk();
        assert_eq!(
            w.insert(A, 4, iova(0), pa(0)).unwrap_err(),
            IotlbError::NoSuchLevel {
                level: 4,
                levels: 4
            }
        );
    }

    #[test]
    fn walk_config_errors_are_reported() {
        let base = WalkCacheConfig::gem5();
        let with = |f: &dyn Fn(&mut WalkCacheConfig)| {
            let mut c = base.clone();
            f(&mut c);
            WalkCache::new(c).unwrap_err()
        };
        assert_eq!(with(&|c| c.levels.clear()), CacheConfigError::NoLevels);
        assert_eq!(
            with(&|c| c.levels = vec![c.levels[0]; 9]),
            CacheConfigError::TooManyLevels {
                levels: 9,
                max: MAX_WALK_LEVELS
            }
        );
        assert_eq!(
            with(&|c| c.levels[2].span_shift = 30),
            CacheConfigError::BadSpan {
                level: 2,
                span_shift: 30
            }
        );
        assert_eq!(
            with(&|c| c.levels[3].span_shift = 11),
            CacheConfigError::BadSpan {
                level: 3,
                span_shift: 11
            }
        );
        assert_eq!(
            with(&|c| c.levels[1].entries = 30),
            CacheConfigError::Level {
                level: 1,
                source: Box::new(CacheConfigError::NotWholeSets {
                    entries: 30,
                    ways: 4
                }),
            }
        );
        assert!(matches!(
            with(&|c| c.levels[2].entries = MAX_CACHE_ENTRIES),
            CacheConfigError::TooManyEntries { .. }
        ));
    }

    #[test]
    fn walk_random_policy_is_deterministic_per_seed() {
        let run = |seed| {
            let mut cfg = WalkCacheConfig::gem5();
            cfg.policy = Replacement::Random { seed };
            let mut w = WalkCache::new(cfg).unwrap();
            (0..100)
                .filter_map(|n| w.insert(A, 2, iova(n * SZ_2M), pa(0)).unwrap())
                .map(|e| e.iova)
                .collect::<Vec<_>>()
        };
        assert_eq!(run(1), run(1));
    }

    /// A SplitMix64 stream for the randomized checks below.
    fn rand_ops(seed: u64) -> SplitMix64 {
        SplitMix64(seed)
    }

    /// Every set's `occupied` count matches its valid ways.
    fn assert_occupancy<K: Copy + Eq, V: Copy>(c: &SetAssoc<K, V>) {
        for set in 0..c.sets {
            assert_eq!(c.set_len(set), c.count_set(set), "set {set}");
        }
        assert_eq!(c.len(), (0..c.sets).map(|s| c.count_set(s)).sum::<usize>());
    }

    /// A mix of 4 KiB and 2 MiB lookups, inserts (checked and after a miss), stale
    /// marks, VA, range, ASID and full invalidations on random addresses.
    fn random_tlb_ops(t: &mut Iotlb, seed: u64, fast_fill: bool) -> Vec<String> {
        let mut r = rand_ops(seed);
        let mut log = Vec::new();
        for _ in 0..4000 {
            let asid = Asid(1 + r.below(3) as u32);
            let page = r.below(96) as u64;
            let (va, size) = if r.below(8) == 0 {
                ((page / 8) * SZ_2M, SZ_2M)
            } else {
                (page * SZ_4K, SZ_4K)
            };
            let op = r.below(100);
            let mut w = WorkRecord::new();
            if op < 60 {
                let hit = t.lookup(asid, iova(va), &mut w);
                log.push(format!("{hit:?}"));
                if hit.is_none() {
                    let frame = pa((0x4000 + page) * SZ_2M);
                    let ev = if fast_fill {
                        t.insert_after_miss(asid, iova(va), frame, size, Prot::READ_WRITE)
                    } else {
                        t.insert(asid, iova(va), frame, size, Prot::READ_WRITE)
                            .unwrap()
                    };
                    log.push(format!("{ev:?}"));
                }
            } else if op < 75 {
                let ev = t.insert(asid, iova(va), pa(page * SZ_2M), size, Prot::READ);
                log.push(format!("{ev:?}"));
            } else if op < 85 {
                // Within one 4 KiB page (the one-page path) or across three.
                let len = if r.below(2) == 0 {
                    SZ_4K - 0x10
                } else {
                    SZ_4K * 3
                };
                let (first, last) = (va + 0x8, va + 0x8 + len - 1);
                let hit = |e: &IotlbEntry| {
                    e.asid == asid && e.iova.get() <= last && e.iova.get() + e.page_size > first
                };
                let newly = t.entries().filter(|e| hit(e) && !e.stale).count();
                let want: Vec<_> = t
                    .entries()
                    .map(|mut e| {
                        e.stale |= hit(&e);
                        e
                    })
                    .collect();
                let n = t.mark_stale_range(asid, iova(first), len);
                assert_eq!((n, t.entries().collect::<Vec<_>>()), (newly, want));
                log.push(format!("{n}"));
            } else if op < 93 {
                let mut generic = t.clone();
                let n = t.invalidate_va(asid, iova(va + 0x123), true);
                assert_eq!(n, generic.invalidate_range(asid, iova(va + 0x123), 1));
                assert_eq!(
                    t.entries().collect::<Vec<_>>(),
                    generic.entries().collect::<Vec<_>>()
                );
                assert_eq!(t.page_sizes_cached(), generic.page_sizes_cached());
                log.push(format!("{n}"));
            } else if op < 97 {
                log.push(format!("{}", t.invalidate_range(asid, iova(va), SZ_2M)));
            } else if op < 99 {
                log.push(format!("{}", t.invalidate_asid(asid)));
            } else {
                log.push(format!("{}", t.invalidate_all()));
            }
            assert_occupancy(&t.core);
        }
        log.push(format!("{:?}", t.entries().collect::<Vec<_>>()));
        log
    }

    #[test]
    fn occupancy_tracks_valid_ways_and_fill_after_miss_matches_insert() {
        for (entries, ways, policy) in [
            (64, 4, Replacement::RoundRobin),
            (64, 4, Replacement::Lru),
            (60, 4, Replacement::Random { seed: 7 }),
            (16, 16, Replacement::RoundRobin),
            (12, 1, Replacement::Lru),
        ] {
            for seed in 0..4 {
                let mut a = tlb(entries, ways, policy);
                let mut b = tlb(entries, ways, policy);
                let slow = random_tlb_ops(&mut a, seed, false);
                let fast = random_tlb_ops(&mut b, seed, true);
                assert_eq!(slow, fast, "{entries}x{ways} {policy:?} seed {seed}");
                assert_eq!(a.core.clock, b.core.clock);
                assert_eq!(a.page_sizes_cached(), b.page_sizes_cached());
            }
        }
    }

    #[test]
    fn walk_occupancy_and_deepest_table_match_the_entry_lookup() {
        let mut w = walk();
        let mut v = walk();
        let mut r = rand_ops(3);
        for _ in 0..3000 {
            let asid = Asid(1 + r.below(2) as u32);
            let va = r.below(1 << 12) as u64 * SZ_2M / 4;
            match r.below(10) {
                0..=5 => {
                    let e = w.lookup_deepest(asid, iova(va));
                    let t = v.lookup_deepest_table(asid, iova(va));
                    assert_eq!(e.map(|e| (e.level, e.table_pa)), t);
                }
                6..=8 => {
                    let level = r.below(3);
                    let p = pa(r.below(1 << 20) as u64 * SZ_4K);
                    let a = w.insert(asid, level, iova(va), p).unwrap();
                    assert_eq!(a, v.insert(asid, level, iova(va), p).unwrap());
                }
                _ => {
                    let a = w.invalidate_range(asid, iova(va), SZ_1G);
                    assert_eq!(a, v.invalidate_range(asid, iova(va), SZ_1G));
                }
            }
            for l in w.levels.iter().filter_map(|l| l.core.as_ref()) {
                assert_occupancy(l);
            }
        }
        for level in 0..w.levels() {
            assert_eq!(w.level_stats(level), v.level_stats(level));
        }
        assert_eq!(
            w.entries().collect::<Vec<_>>(),
            v.entries().collect::<Vec<_>>()
        );
    }

    #[test]
    fn smallest_cached_size_decides_the_full_scan() {
        let mut r = rand_ops(11);
        for _ in 0..20000 {
            let sizes = r.next_u64() & (((1u64 << 31) - 1) << MIN_PAGE_SHIFT) & r.next_u64();
            let first = r.next_u64() >> r.below(64);
            let last = first.saturating_add(r.next_u64() >> r.below(64));
            let sets = 1 + r.below(600) as u64;
            let every = bit_iter(sizes).any(|shift| (last >> shift) - (first >> shift) >= sets);
            assert_eq!(touches_sets_or_more(sizes, first, last, sets), every);
        }
    }
}
