//! Property tests of the IOTLB and walk cache against reference models.
//!
//! The IOTLB runs against an unbounded map of the valid translations (the "page table"):
//! fills come only from that map, unmaps either invalidate at once (strict) or mark the
//! cache stale and invalidate later (lazy). Whatever the policy and geometry, a non-stale
//! entry must agree with the map, invalidation must remove exactly the overlapping entries,
//! and no set may hold more than its ways.

use std::collections::BTreeMap;

use iolab_iommu::addr::{Iova, PhysAddr, Prot, SZ_2M, SZ_4K};
use iolab_iommu::iotlb::{
    Asid, Iotlb, IotlbConfig, IotlbEntry, Replacement, WalkCache, WalkCacheConfig, WalkEntry,
    WalkLevelConfig,
};
use iolab_iommu::work::WorkRecord;
use proptest::prelude::*;

/// IOVA space the tests use: four 2 MiB blocks.
const SPACE: u64 = 4 * SZ_2M;

fn policy() -> impl Strategy<Value = Replacement> {
    prop_oneof![
        Just(Replacement::Lru),
        Just(Replacement::RoundRobin),
        any::<u64>().prop_map(|seed| Replacement::Random { seed }),
    ]
}

fn tlb_config() -> impl Strategy<Value = IotlbConfig> {
    (
        prop_oneof![
            Just((4, 4)),
            Just((8, 2)),
            Just((12, 4)),
            Just((16, 4)),
            Just((32, 32))
        ],
        policy(),
    )
        .prop_map(|((entries, ways), policy)| IotlbConfig::new(entries, ways, policy))
}

#[derive(Clone, Debug)]
enum TlbOp {
    /// Map a 4 KiB page (or the 2 MiB block) containing `addr` if nothing overlaps it.
    Map {
        asid: u32,
        addr: u64,
        big: bool,
        frame: u64,
        write: bool,
    },
    /// A device access: look up, and on a miss walk the reference and fill.
    Touch {
        asid: u32,
        addr: u64,
    },
    /// Remove the mapping containing `addr`; strict invalidates now, lazy marks stale.
    Unmap {
        asid: u32,
        addr: u64,
        lazy: bool,
    },
    /// Invalidate every lazily unmapped range.
    Flush,
    InvalidateVa {
        asid: u32,
        addr: u64,
    },
    InvalidateRange {
        asid: u32,
        addr: u64,
        size: u64,
    },
    InvalidateAsid {
        asid: u32,
    },
    InvalidateAll,
}

fn tlb_op() -> impl Strategy<Value = TlbOp> {
    let asid = 0u32..3;
    let addr = 0..SPACE;
    prop_oneof![
        4 => (asid.clone(), addr.clone(), prop::bool::weighted(0.2), 0u64..1024, any::<bool>())
            .prop_map(|(asid, addr, big, frame, write)| TlbOp::Map { asid, addr, big, frame, write }),
        8 => (asid.clone(), addr.clone()).prop_map(|(asid, addr)| TlbOp::Touch { asid, addr }),
        2 => (asid.clone(), addr.clone(), any::<bool>())
            .prop_map(|(asid, addr, lazy)| TlbOp::Unmap { asid, addr, lazy }),
        1 => Just(TlbOp::Flush),
        1 => (asid.clone(), addr.clone()).prop_map(|(asid, addr)| TlbOp::InvalidateVa { asid, addr }),
        1 => (asid.clone(), addr.clone(), 1..SPACE)
            .prop_map(|(asid, addr, size)| TlbOp::InvalidateRange { asid, addr, size }),
        1 => asid.prop_map(|asid| TlbOp::InvalidateAsid { asid }),
        1 => Just(TlbOp::InvalidateAll),
    ]
}

/// One valid translation of the reference page table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Mapping {
    size: u64,
    pa: u64,
    prot: Prot,
}

/// The reference: valid translations keyed by (ASID, page base), non-overlapping per ASID.
#[derive(Default)]
struct Reference {
    maps: BTreeMap<(u32, u64), Mapping>,
}

impl Reference {
    /// The mapping containing `addr`, with its base.
    fn find(&self, asid: u32, addr: u64) -> Option<(u64, Mapping)> {
        [SZ_4K, SZ_2M].into_iter().find_map(|size| {
            let base = addr & !(size - 1);
            self.maps
                .get(&(asid, base))
                .filter(|m| m.size == size)
                .map(|m| (base, *m))
        })
    }

    fn overlaps(&self, asid: u32, base: u64, size: u64) -> bool {
        let last = base + size - 1;
        self.maps
            .range((asid, 0)..=(asid, last))
            .any(|(&(_, b), m)| b + m.size > base)
    }
}

type Sorted = Vec<(u32, u64, u64, u64, bool, bool, bool)>;

fn sorted_entries(t: &Iotlb) -> Sorted {
    let mut v: Sorted = t
        .entries()
        .map(|e: IotlbEntry| {
            (
                e.asid.0,
                e.iova.get(),
                e.page_size,
                e.pa.get(),
                e.prot.read,
                e.prot.write,
                e.stale,
            )
        })
        .collect();
    v.sort_unstable();
    v
}

/// Entries of `before` that an invalidation of `asid` over `first..=last` must keep.
fn keep_outside(before: &Sorted, asid: u32, first: u64, last: u64) -> Sorted {
    before
        .iter()
        .filter(|e| e.0 != asid || e.1 + e.2 - 1 < first || e.1 > last)
        .copied()
        .collect()
}

fn check_tlb_invariants(t: &Iotlb, reference: &Reference) -> Result<(), TestCaseError> {
    prop_assert!(t.len() <= t.capacity());
    prop_assert_eq!(t.len(), t.entries().count());
    prop_assert!(t.max_set_len() <= t.ways());
    for set in 0..t.sets() {
        prop_assert!(t.set_len(set) <= t.ways());
    }
    for e in t.entries().filter(|e| !e.stale) {
        let m = reference.maps.get(&(e.asid.0, e.iova.get()));
        prop_assert_eq!(
            m.copied(),
            Some(Mapping {
                size: e.page_size,
                pa: e.pa.get(),
                prot: e.prot
            }),
            "non-stale entry {:?} disagrees with the table",
            e
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn iotlb_agrees_with_reference(cfg in tlb_config(), ops in prop::collection::vec(tlb_op(), 1..200)) {
        let mut t = Iotlb::new(cfg).unwrap();
        let mut reference = Reference::default();
        let mut pending: Vec<(u32, u64, u64)> = Vec::new();
        for op in ops {
            match op {
                TlbOp::Map { asid, addr, big, frame, write } => {
                    let size = if big { SZ_2M } else { SZ_4K };
                    let base = addr & !(size - 1);
                    if !reference.overlaps(asid, base, size) {
                        let prot = if write { Prot::READ_WRITE } else { Prot::READ };
                        reference.maps.insert((asid, base), Mapping { size, pa: frame * size, prot });
                    }
                }
                TlbOp::Touch { asid, addr } => {
                    let mut w = WorkRecord::new();
                    let hit = t.lookup(Asid(asid), Iova::new(addr), &mut w);
                    prop_assert_eq!(w.iotlb_hits + w.iotlb_misses, 1);
                    match hit {
                        Some(hit) => {
                            prop_assert_eq!(w.iotlb_stale_hits, u64::from(hit.stale));
                            if !hit.stale {
                                let (base, m) = reference.find(asid, addr)
                                    .ok_or_else(|| TestCaseError::fail("hit on an unmapped IOVA"))?;
                                prop_assert_eq!(hit.pa.get(), m.pa + (addr - base));
                                prop_assert_eq!((hit.prot, hit.page_size), (m.prot, m.size));
                            }
                        }
                        None => {
                            prop_assert_eq!(w.iotlb_misses, 1);
                            if let Some((base, m)) = reference.find(asid, addr) {
                                t.insert(Asid(asid), Iova::new(base), PhysAddr::new(m.pa), m.size, m.prot)
                                    .unwrap();
                                let again = t.probe(Asid(asid), Iova::new(addr)).unwrap();
                                prop_assert_eq!(again.pa.get(), m.pa + (addr - base));
                            }
                        }
                    }
                }
                TlbOp::Unmap { asid, addr, lazy } => {
                    if let Some((base, m)) = reference.find(asid, addr) {
                        reference.maps.remove(&(asid, base));
                        if lazy {
                            t.mark_stale_range(Asid(asid), Iova::new(base), m.size);
                            pending.push((asid, base, m.size));
                        } else {
                            t.invalidate_range(Asid(asid), Iova::new(base), m.size);
                        }
                    }
                }
                TlbOp::Flush => {
                    for (asid, base, size) in pending.drain(..) {
                        t.invalidate_range(Asid(asid), Iova::new(base), size);
                    }
                    prop_assert_eq!(t.count_stale(), 0);
                }
                TlbOp::InvalidateVa { asid, addr } => {
                    let before = sorted_entries(&t);
                    let removed = t.invalidate_va(Asid(asid), Iova::new(addr), false);
                    let expected = keep_outside(&before, asid, addr, addr);
                    prop_assert_eq!(removed, before.len() - expected.len());
                    prop_assert_eq!(sorted_entries(&t), expected);
                    prop_assert!(t.probe(Asid(asid), Iova::new(addr)).is_none());
                }
                TlbOp::InvalidateRange { asid, addr, size } => {
                    let before = sorted_entries(&t);
                    let removed = t.invalidate_range(Asid(asid), Iova::new(addr), size);
                    let expected = keep_outside(&before, asid, addr, addr + size - 1);
                    prop_assert_eq!(removed, before.len() - expected.len());
                    prop_assert_eq!(sorted_entries(&t), expected);
                }
                TlbOp::InvalidateAsid { asid } => {
                    let others = t.len() - t.count_asid(Asid(asid));
                    t.invalidate_asid(Asid(asid));
                    prop_assert_eq!(t.count_asid(Asid(asid)), 0);
                    prop_assert_eq!(t.len(), others);
                    for addr in (0..SPACE).step_by(SZ_4K as usize * 61) {
                        prop_assert!(t.probe(Asid(asid), Iova::new(addr)).is_none());
                    }
                    // Entries of that ASID are gone, so its pending lazy ranges are flushed.
                    pending.retain(|p| p.0 != asid);
                }
                TlbOp::InvalidateAll => {
                    t.invalidate_all();
                    prop_assert!(t.is_empty());
                    prop_assert_eq!(t.page_sizes_cached(), 0);
                    let mut w = WorkRecord::new();
                    for asid in 0..3 {
                        prop_assert!(t.lookup(Asid(asid), Iova::new(0), &mut w).is_none());
                    }
                    pending.clear();
                }
            }
            check_tlb_invariants(&t, &reference)?;
        }
    }

    #[test]
    fn iotlb_holds_a_working_set_that_fits_one_way_per_set(
        cfg in tlb_config(),
        asid in 0u32..3,
    ) {
        // `sets` consecutive pages spread over the sets (one per set when the set count is a
        // power of two) and never overflow one, so whatever the policy every page stays.
        let mut t = Iotlb::new(cfg).unwrap();
        let sets = t.sets() as u64;
        for n in 0..sets {
            t.insert(Asid(asid), Iova::new(n * SZ_4K), PhysAddr::new(n * SZ_4K), SZ_4K, Prot::READ)
                .unwrap();
        }
        let mut w = WorkRecord::new();
        for n in 0..sets {
            prop_assert!(t.lookup(Asid(asid), Iova::new(n * SZ_4K), &mut w).is_some());
        }
        prop_assert_eq!(w.iotlb_hits, sets);
    }
}

// ---- walk cache ----

/// Three levels of a 4 KiB-granule table with small caches (the last has 3 sets).
fn walk_config(policy: Replacement) -> WalkCacheConfig {
    let level = |entries, ways, span_shift| WalkLevelConfig {
        entries,
        ways,
        span_shift,
    };
    WalkCacheConfig {
        levels: vec![level(4, 2, 39), level(8, 4, 30), level(12, 4, 21)],
        policy,
    }
}

/// Addresses spread over two level-0 entries, eight level-1 entries and many level-2 ones.
fn walk_addr() -> impl Strategy<Value = u64> {
    (0u64..2, 0u64..8, 0u64..64, 0u64..SZ_2M)
        .prop_map(|(l0, l1, l2, off)| (l0 << 39) | (l1 << 30) | (l2 << 21) | off)
}

#[derive(Clone, Debug)]
enum WalkOp {
    Insert {
        asid: u32,
        level: usize,
        addr: u64,
        table: u64,
    },
    Lookup {
        asid: u32,
        addr: u64,
    },
    InvalidateVa {
        asid: u32,
        addr: u64,
        leaf_only: bool,
    },
    InvalidateRange {
        asid: u32,
        addr: u64,
        size: u64,
    },
    InvalidateAsid {
        asid: u32,
    },
    InvalidateAll,
}

fn walk_op() -> impl Strategy<Value = WalkOp> {
    let asid = 0u32..3;
    prop_oneof![
        6 => (asid.clone(), 0usize..3, walk_addr(), 1u64..1 << 20)
            .prop_map(|(asid, level, addr, table)| WalkOp::Insert { asid, level, addr, table }),
        6 => (asid.clone(), walk_addr()).prop_map(|(asid, addr)| WalkOp::Lookup { asid, addr }),
        1 => (asid.clone(), walk_addr(), any::<bool>())
            .prop_map(|(asid, addr, leaf_only)| WalkOp::InvalidateVa { asid, addr, leaf_only }),
        1 => (asid.clone(), walk_addr(), 1u64..1 << 33)
            .prop_map(|(asid, addr, size)| WalkOp::InvalidateRange { asid, addr, size }),
        1 => asid.prop_map(|asid| WalkOp::InvalidateAsid { asid }),
        1 => Just(WalkOp::InvalidateAll),
    ]
}

type WalkSorted = Vec<(u32, usize, u64, u64, u64)>;

fn walk_entries(w: &WalkCache) -> WalkSorted {
    let mut v: WalkSorted = w
        .entries()
        .map(|e: WalkEntry| (e.asid.0, e.level, e.iova.get(), e.span, e.table_pa.get()))
        .collect();
    v.sort_unstable();
    v
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn iotlb_walk_cache_agrees_with_reference(
        policy in policy(),
        ops in prop::collection::vec(walk_op(), 1..200),
    ) {
        let mut w = WalkCache::new(walk_config(policy)).unwrap();
        let spans = [39u32, 30, 21];
        // Every descriptor inserted and not invalidated since: (asid, level, prefix) -> table.
        let mut reference: BTreeMap<(u32, usize, u64), u64> = BTreeMap::new();
        for op in ops {
            match op {
                WalkOp::Insert { asid, level, addr, table } => {
                    let table = table * SZ_4K;
                    w.insert(Asid(asid), level, Iova::new(addr), PhysAddr::new(table)).unwrap();
                    reference.insert((asid, level, addr >> spans[level]), table);
                }
                WalkOp::Lookup { asid, addr } => {
                    if let Some(e) = w.lookup_deepest(Asid(asid), Iova::new(addr)) {
                        let want = reference.get(&(asid, e.level, addr >> spans[e.level]));
                        prop_assert_eq!(want.copied(), Some(e.table_pa.get()));
                        prop_assert!(e.iova.get() <= addr && addr - e.iova.get() < e.span);
                    }
                }
                WalkOp::InvalidateVa { asid, addr, leaf_only } => {
                    let before = walk_entries(&w);
                    let removed = w.invalidate_va(Asid(asid), Iova::new(addr), leaf_only);
                    let expected: WalkSorted = before
                        .iter()
                        .filter(|e| leaf_only || e.0 != asid || addr < e.2 || addr - e.2 >= e.3)
                        .copied()
                        .collect();
                    prop_assert_eq!(removed, before.len() - expected.len());
                    prop_assert_eq!(walk_entries(&w), expected);
                    if !leaf_only {
                        reference.retain(|k, _| k.0 != asid || k.2 != addr >> spans[k.1]);
                    }
                }
                WalkOp::InvalidateRange { asid, addr, size } => {
                    let last = addr + size - 1;
                    let before = walk_entries(&w);
                    let removed = w.invalidate_range(Asid(asid), Iova::new(addr), size);
                    let expected: WalkSorted = before
                        .iter()
                        .filter(|e| e.0 != asid || e.2 + e.3 - 1 < addr || e.2 > last)
                        .copied()
                        .collect();
                    prop_assert_eq!(removed, before.len() - expected.len());
                    prop_assert_eq!(walk_entries(&w), expected);
                    reference.retain(|k, _| {
                        k.0 != asid || k.2 < addr >> spans[k.1] || k.2 > last >> spans[k.1]
                    });
                }
                WalkOp::InvalidateAsid { asid } => {
                    w.invalidate_asid(Asid(asid));
                    prop_assert_eq!(w.count_asid(Asid(asid)), 0);
                    reference.retain(|k, _| k.0 != asid);
                }
                WalkOp::InvalidateAll => {
                    w.invalidate_all();
                    prop_assert!(w.is_empty());
                    reference.clear();
                }
            }
            prop_assert!(w.len() <= w.capacity());
            for level in 0..w.levels() {
                prop_assert!(w.level_len(level) <= w.level_capacity(level));
                prop_assert!(w.level_max_set_len(level) <= w.level_ways(level));
            }
            // Every cached descriptor is one the reference still holds.
            for e in w.entries() {
                let key = (e.asid.0, e.level, e.iova.get() >> spans[e.level]);
                prop_assert_eq!(reference.get(&key).copied(), Some(e.table_pa.get()));
            }
        }
    }
}
