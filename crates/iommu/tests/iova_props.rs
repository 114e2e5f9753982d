//! Property tests for every IOVA allocator: random alloc/free sequences (with random limits,
//! 32-bit ones included) keep the contract, the gap tree always picks the highest aligned fit,
//! and after freeing everything and draining caches an allocator is as good as new.
//! Plus a small multi-threaded stress test of the magazine cache over the Linux allocator.

use iolab_iommu::addr::{Iova, SZ_1G, SZ_4G, SZ_4K, SZ_64K};
use iolab_iommu::iova::gaptree::GapTreeAllocator;
use iolab_iommu::iova::linux::{IovaSpaceConfig, LinuxIovaAllocator};
use iolab_iommu::iova::magazine::{MagazineCache, MagazineConfig};
use iolab_iommu::iova::power::{PowerPoolAllocator, PowerPoolConfig};
use iolab_iommu::iova::sba::{SbaConfig, SbaResourceAllocator};
use iolab_iommu::iova::{AllocRequest, IovaAllocator, IovaBlock, IovaError};
use iolab_iommu::work::WorkRecord;
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

const G: u64 = SZ_4K;

/// One step of a random sequence.
#[derive(Clone, Debug)]
enum Op {
    /// Allocate `pages`; `limit` picks the limit (see [`limit_for`]); `cpu` the CPU.
    Alloc {
        pages: u64,
        limit: u8,
        aligned: bool,
        cpu: usize,
    },
    /// Free the live block at this index (modulo the number live), then try a double free.
    Free { idx: usize, cpu: usize },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (
            prop_oneof![6 => 1u64..=8, 3 => 9u64..=40, 1 => 41u64..=300],
            any::<u8>(),
            any::<bool>(),
            0usize..6,
        )
            .prop_map(|(pages, limit, aligned, cpu)| Op::Alloc { pages, limit, aligned, cpu }),
        2 => (any::<usize>(), 0usize..6).prop_map(|(idx, cpu)| Op::Free { idx, cpu }),
    ]
}

/// The limit for a request: no limit, 4 GiB, or a point inside (or just past) the range.
fn limit_for(sel: u8, range: (Iova, Iova), granule: u64) -> Iova {
    let (lo, hi) = (range.0.get(), range.1.get());
    match sel % 4 {
        0 => Iova::new(1 << 48),
        1 => Iova::new(SZ_4G),
        _ => {
            let span = (hi - lo) / granule + 4;
            let pages = u64::from(sel) * span / 256;
            Iova::new(lo + pages * granule)
        }
    }
}

/// What an allocator is expected to hand out for a request.
#[derive(Clone, Copy)]
enum Shape {
    /// Exactly the pages asked for; aligned when asked.
    Exact,
    /// Magazine: up to 32 pages rounded up to a power of two and always aligned.
    Magazine,
    /// SBA: always rounded up to a power of two and naturally aligned.
    PowerOfTwo,
}

impl Shape {
    fn pages(self, req: &AllocRequest) -> u64 {
        match self {
            Shape::Exact => req.pages,
            Shape::Magazine if req.pages <= 32 => req.pages.next_power_of_two(),
            Shape::Magazine => req.pages,
            Shape::PowerOfTwo => req.pages.next_power_of_two(),
        }
    }

    fn alignment(self, req: &AllocRequest, pages: u64) -> u64 {
        match self {
            Shape::Magazine if req.pages <= 32 => pages,
            Shape::PowerOfTwo => pages,
            _ if req.size_aligned => req.pages.next_power_of_two(),
            _ => 1,
        }
    }
}

/// The live blocks as the test sees them: start -> end (bytes, exclusive).
#[derive(Default)]
struct Model {
    live: BTreeMap<u64, u64>,
    order: Vec<IovaBlock>,
}

impl Model {
    fn overlaps(&self, start: u64, end: u64) -> bool {
        self.live
            .range(..end)
            .next_back()
            .is_some_and(|(_, &e)| e > start)
    }

    fn insert(&mut self, b: IovaBlock, granule: u64) {
        self.live
            .insert(b.start.get(), b.start.get() + b.pages * granule);
        self.order.push(b);
    }

    fn remove(&mut self, idx: usize) -> IovaBlock {
        let b = self.order.swap_remove(idx);
        self.live.remove(&b.start.get());
        b
    }
}

/// The highest aligned fit below the limit, from the model (the gap tree's contract), as a
/// start address.
fn highest_fit(
    model: &Model,
    range: (Iova, Iova),
    req: &AllocRequest,
    granule: u64,
) -> Option<u64> {
    let (lo, hi) = (range.0.get() / granule, range.1.get() / granule);
    let top = (req.limit.get() / granule).min(hi);
    let align = if req.size_aligned {
        req.pages.next_power_of_two()
    } else {
        1
    };
    let mut gap_hi = top;
    // Walk the allocated ranges downwards; each gap is (end of range, gap_hi).
    let mut ranges = model
        .live
        .iter()
        .rev()
        .map(|(&s, &e)| (s / granule, e / granule));
    loop {
        let below = ranges.by_ref().find(|&(s, _)| s < gap_hi);
        let gap_lo = below.map_or(lo, |(_, e)| e.max(lo));
        if gap_hi >= req.pages && gap_hi >= gap_lo {
            let a = (gap_hi - req.pages) / align * align;
            if a >= gap_lo && a + req.pages <= gap_hi {
                return Some(a * granule);
            }
        }
        match below {
            Some((s, _)) if s > lo => gap_hi = s,
            _ => return None,
        }
    }
}

/// Runs `ops` on `a`, checking the contract after every step. With `reference`, every result
/// must also equal the highest aligned fit.
fn run<A: IovaAllocator>(
    a: &A,
    ops: &[Op],
    shape: Shape,
    reference: bool,
) -> Result<(), TestCaseError> {
    run_checked(a, ops, shape, reference, |_| Ok(()))
}

/// [`run`], also calling `check` on the allocator after every step (and at the end).
fn run_checked<A: IovaAllocator>(
    a: &A,
    ops: &[Op],
    shape: Shape,
    reference: bool,
    check: impl Fn(&A) -> Result<(), String>,
) -> Result<(), TestCaseError> {
    let granule = a.granule();
    let range = a.range();
    let mut model = Model::default();
    let mut w = WorkRecord::new();
    for op in ops {
        match *op {
            Op::Alloc {
                pages,
                limit,
                aligned,
                cpu,
            } => {
                let req = AllocRequest {
                    pages,
                    limit: limit_for(limit, range, granule),
                    size_aligned: aligned,
                    cpu,
                };
                let want = reference.then(|| highest_fit(&model, range, &req, granule));
                match a.alloc(req, &mut w) {
                    Ok(b) => {
                        let p = shape.pages(&req);
                        let (s, e) = (b.start.get(), b.start.get() + b.pages * granule);
                        prop_assert_eq!(b.pages, p, "{:?} for {:?}", b, req);
                        prop_assert!(s != 0, "IOVA 0 handed out");
                        prop_assert!(s >= range.0.get() && e <= range.1.get(), "{:?} outside", b);
                        prop_assert!(e <= req.limit.get(), "{:?} above limit {:?}", b, req.limit);
                        let align = shape.alignment(&req, p) * granule;
                        prop_assert!(
                            b.start.is_aligned(align),
                            "{:?} not aligned to {:#x}",
                            b,
                            align
                        );
                        prop_assert!(!model.overlaps(s, e), "{:?} overlaps a live block", b);
                        if let Some(want) = want {
                            prop_assert_eq!(Some(s), want, "not the highest fit for {:?}", req);
                        }
                        model.insert(b, granule);
                    }
                    Err(IovaError::Exhausted { .. }) => {
                        if let Some(want) = want {
                            prop_assert_eq!(want, None, "failed though a fit exists for {:?}", req);
                        }
                    }
                    Err(IovaError::LimitTooLow { .. } | IovaError::BadSize { .. }) => {}
                    Err(e) => prop_assert!(false, "unexpected {e:?}"),
                }
            }
            Op::Free { idx, cpu } => {
                if model.order.is_empty() {
                    continue;
                }
                let b = model.remove(idx % model.order.len());
                prop_assert_eq!(a.free(b, cpu, &mut w), Ok(()));
                let again = a.free(b, cpu, &mut w);
                prop_assert!(
                    matches!(again, Err(IovaError::NotAllocated { .. })),
                    "{again:?}"
                );
            }
        }
        prop_assert_eq!(a.live_blocks(), model.order.len());
        check(a).map_err(TestCaseError::fail)?;
    }
    for b in std::mem::take(&mut model.order) {
        prop_assert_eq!(a.free(b, 0, &mut w), Ok(()));
    }
    a.drain_caches(&mut w);
    prop_assert_eq!(a.live_blocks(), 0);
    check(a).map_err(TestCaseError::fail)?;
    Ok(())
}

/// Allocates single pages until the space runs out; returns how many fit.
fn fill<A: IovaAllocator>(a: &A) -> usize {
    let mut w = WorkRecord::new();
    let mut n = 0;
    let req = AllocRequest {
        pages: 1,
        limit: Iova::new(u64::MAX),
        size_aligned: false,
        cpu: 0,
    };
    while a.alloc(req, &mut w).is_ok() {
        n += 1;
    }
    n
}

/// A tree-allocator space: `pages` pages, either low (from page 1) or straddling 4 GiB.
fn space(pages: u64, straddle: bool) -> IovaSpaceConfig {
    if straddle {
        let mut c = IovaSpaceConfig::new(G, Iova::new(SZ_4G + pages / 2 * G));
        c.start_pfn = SZ_4G / G - pages / 2;
        c
    } else {
        IovaSpaceConfig::new(G, Iova::new(pages * G))
    }
}

fn magazine<A: IovaAllocator>(inner: A, cpus: usize, eager: bool) -> MagazineCache<A> {
    let cfg = MagazineConfig {
        eager_depot_trim: eager,
        ..MagazineConfig::new(cpus)
    };
    MagazineCache::new(inner, cfg).unwrap()
}

/// Cases per property: 96, or `PROPTEST_CASES`.
fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(96)
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(op(), 1..250)
}

proptest! {
    // PROPTEST_CASES overrides the case count for a deeper run.
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn linux_keeps_the_contract(pages in 64u64..2048, straddle: bool, ops in ops()) {
        let a = LinuxIovaAllocator::new(space(pages, straddle)).unwrap();
        run(&a, &ops, Shape::Exact, false)?;
        let fresh = LinuxIovaAllocator::new(space(pages, straddle)).unwrap();
        prop_assert_eq!(fill(&a), fill(&fresh));
    }

    #[test]
    fn gaptree_returns_the_highest_aligned_fit(pages in 64u64..2048, straddle: bool, ops in ops()) {
        let a = GapTreeAllocator::new(space(pages, straddle)).unwrap();
        run(&a, &ops, Shape::Exact, true)?;
        let fresh = GapTreeAllocator::new(space(pages, straddle)).unwrap();
        prop_assert_eq!(fill(&a), fill(&fresh));
    }

    #[test]
    fn gaptree_holes_stay_coalesced_and_summaries_exact(
        pages in 64u64..2048, straddle: bool, ops in ops()
    ) {
        // After every step: holes sorted, never empty, overlapping or touching; holes and
        // allocated ranges cover the space exactly once; AVL balance; every subtree's largest
        // hole, largest aligned block and room at each active order recomputed from scratch.
        let a = GapTreeAllocator::new(space(pages, straddle)).unwrap();
        let check = |a: &GapTreeAllocator| a.check_invariants().map_err(|e| e.to_string());
        run_checked(&a, &ops, Shape::Exact, true, check)?;
        prop_assert_eq!(a.holes(), vec![(a.range().0.get() / G, a.range().1.get() / G)]);
        prop_assert_eq!(a.ranges(), vec![]);
    }

    #[test]
    fn magazine_over_linux_keeps_the_contract(
        pages in 64u64..2048, straddle: bool, cpus in 1usize..4, eager: bool, ops in ops()
    ) {
        let a = magazine(LinuxIovaAllocator::new(space(pages, straddle)).unwrap(), cpus, eager);
        run(&a, &ops, Shape::Magazine, false)?;
        prop_assert_eq!(a.inner().live_blocks(), 0);
        let fresh = LinuxIovaAllocator::new(space(pages, straddle)).unwrap();
        prop_assert_eq!(fill(&a), fill(&fresh));
    }

    #[test]
    fn magazine_over_gaptree_keeps_the_contract(
        pages in 64u64..2048, straddle: bool, cpus in 1usize..4, ops in ops()
    ) {
        let a = magazine(GapTreeAllocator::new(space(pages, straddle)).unwrap(), cpus, true);
        run(&a, &ops, Shape::Magazine, false)?;
        prop_assert_eq!(a.inner().live_blocks(), 0);
        let fresh = GapTreeAllocator::new(space(pages, straddle)).unwrap();
        prop_assert_eq!(fill(&a), fill(&fresh));
    }

    #[test]
    fn power_keeps_the_contract(
        entries in 16u64..4096, start_pages in 0u64..3, big: bool, ops in ops()
    ) {
        let cfg = if big {
            PowerPoolConfig::new(Iova::new(start_pages * SZ_1G), SZ_1G, SZ_64K)
        } else {
            PowerPoolConfig::new(Iova::new(start_pages * 64 * G), entries * G, G)
        };
        let a = PowerPoolAllocator::new(cfg).unwrap();
        run(&a, &ops, Shape::Exact, false)?;
        let fresh = PowerPoolAllocator::new(cfg).unwrap();
        prop_assert_eq!(fill(&a), fill(&fresh));
    }

    #[test]
    fn sba_keeps_the_contract(order in 6u32..13, base in 0u64..3, ops in ops()) {
        let size = (1u64 << order) * G;
        let cfg = SbaConfig { window_start: Iova::new(base * size), window_size: size, page_size: G };
        let a = SbaResourceAllocator::new(cfg).unwrap();
        run(&a, &ops, Shape::PowerOfTwo, false)?;
        let fresh = SbaResourceAllocator::new(cfg).unwrap();
        prop_assert_eq!(fill(&a), fill(&fresh));
    }
}

/// A tiny deterministic generator for the stress test.
fn next(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

#[test]
fn magazine_over_linux_never_hands_out_overlapping_ranges_across_threads() {
    let space = IovaSpaceConfig::new(G, Iova::new(8192 * G));
    let a = Arc::new(magazine(LinuxIovaAllocator::new(space).unwrap(), 2, true));
    // Live ranges (start -> end) and blocks handed between threads.
    let live = Arc::new(Mutex::new(BTreeMap::<u64, u64>::new()));
    let shared = Arc::new(Mutex::new(Vec::<IovaBlock>::new()));
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let (a, live, shared) = (a.clone(), live.clone(), shared.clone());
            std::thread::spawn(move || {
                let mut w = WorkRecord::new();
                let mut mine = Vec::new();
                let mut x = 0x9E37_79B9 + t;
                for _ in 0..4000 {
                    let r = next(&mut x);
                    let cpu = (t % 2) as usize;
                    if r % 5 < 3 {
                        let pages = [1, 1, 2, 3, 8, 16, 32, 40][(r >> 8) as usize % 8];
                        let req = AllocRequest::new(pages, Iova::new(1 << 48), cpu);
                        if let Ok(b) = a.alloc(req, &mut w) {
                            let (s, e) = (b.start.get(), b.start.get() + b.pages * G);
                            let mut l = live.lock().unwrap();
                            let clash = l.range(..e).next_back().is_some_and(|(_, &pe)| pe > s);
                            assert!(!clash, "{b:?} overlaps a live range");
                            l.insert(s, e);
                            drop(l);
                            if r % 7 == 0 {
                                shared.lock().unwrap().push(b);
                            } else {
                                mine.push(b);
                            }
                        }
                    } else {
                        let b = if r % 3 == 0 {
                            shared.lock().unwrap().pop()
                        } else {
                            mine.pop()
                        };
                        if let Some(b) = b {
                            // Forget the range before it can be handed out again.
                            live.lock().unwrap().remove(&b.start.get());
                            a.free(b, cpu, &mut w).unwrap();
                        }
                    }
                }
                for b in mine {
                    live.lock().unwrap().remove(&b.start.get());
                    a.free(b, (t % 2) as usize, &mut w).unwrap();
                }
                w
            })
        })
        .collect();
    let mut total = WorkRecord::new();
    for t in threads {
        total += t.join().unwrap();
    }
    let mut w = WorkRecord::new();
    for b in shared.lock().unwrap().drain(..) {
        a.free(b, 0, &mut w).unwrap();
    }
    a.drain_caches(&mut w);
    assert_eq!(a.live_blocks(), 0);
    assert_eq!(a.inner().live_blocks(), 0);
    assert!(total.magazine_hits > 0, "{total:?}");
}

#[test]
fn power_never_hands_out_overlapping_ranges_across_threads() {
    let cfg = PowerPoolConfig::new(Iova::new(0), SZ_1G, SZ_64K);
    let a = Arc::new(PowerPoolAllocator::new(cfg).unwrap());
    let live = Arc::new(Mutex::new(BTreeMap::<u64, u64>::new()));
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let (a, live) = (a.clone(), live.clone());
            std::thread::spawn(move || {
                let mut w = WorkRecord::new();
                let mut mine = Vec::new();
                let mut x = 0x1234_5678 + t;
                for _ in 0..3000 {
                    let r = next(&mut x);
                    if r % 5 < 3 {
                        let pages = 1 + (r >> 10) % 24;
                        // Some requests are confined below a limit, so searches cross pools.
                        let limit = if r % 4 == 0 { 5000 * SZ_64K } else { 1 << 48 };
                        let req = AllocRequest::new(pages, Iova::new(limit), t as usize);
                        if let Ok(b) = a.alloc(req, &mut w) {
                            let (s, e) = (b.start.get(), b.start.get() + b.pages * SZ_64K);
                            let mut l = live.lock().unwrap();
                            assert!(!l.range(..e).next_back().is_some_and(|(_, &pe)| pe > s));
                            l.insert(s, e);
                            mine.push(b);
                        }
                    } else if let Some(b) = mine.pop() {
                        live.lock().unwrap().remove(&b.start.get());
                        a.free(b, t as usize, &mut w).unwrap();
                    }
                }
                for b in mine {
                    live.lock().unwrap().remove(&b.start.get());
                    a.free(b, 0, &mut w).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(a.live_blocks(), 0);
}
