//! The gap tree: iolab's O(log n) IOVA allocator with the Linux allocator's contract.
//!
//! It allocates top down like [`super::linux`]: a request gets the **highest** range below its
//! limit that fits, aligned down to the next power of two of its size when `size_aligned`.
//! Unlike Linux there is no cursor and no linear walk: the result is always the highest fit,
//! found in O(log n) in the worst case.
//!
//! # Two indexes: free holes in a tree, allocated ranges by page
//!
//! The free space is kept as **holes**: maximal runs of free pages, `[lo, hi)`, never empty,
//! never overlapping and never touching (a freed range is coalesced with the holes on either
//! side). They are the entries of a B+-tree ordered by address, in an arena (see `btree`),
//! except one, the *frontier*, kept beside it (see below). The allocated
//! ranges are only needed to check that a free is of a range allocated exactly as given, so
//! they live in a separate index, a byte per page holding the length of the range that starts
//! there, in 64-page chunks (see `index`). The tree is therefore as large as the number of
//! holes, not of ranges: under the random churn of `iolab bench` about 100 holes at 10,000
//! live ranges and 11,000 at 100,000 (an earlier version kept every allocated range in the
//! tree, with the gap below it, and was 2.5-4x slower than range-alloc: docs/PERFORMANCE.md).
//! Every page of the space is in exactly one hole or one allocated range.
//!
//! # The augmentation, and why the search is exact
//!
//! A hole `[lo, hi)` can hold a block of `s` pages aligned to `2^k` exactly when
//! `hi - roundup(lo, 2^k) >= s`; call `hi - roundup(lo, 2^k)` the hole's *room at order k*.
//! The search needs, for every subtree (every entry of a B-tree node), an **exact** answer to "does some hole in here hold
//! the request?": then it never enters a subtree without a fit, which is what makes it
//! O(height). (A plain "largest hole" only allows either the conservative test
//! `len >= s + 2^k - 1`, which misses holes that fit thanks to a lucky alignment, or an
//! optimistic one that may enter subtrees without a fit, losing the bound: think of many
//! 3-page holes at odd addresses and a 3-page request aligned to 4.)
//!
//! Requests come in three kinds, and each has an exact per-subtree summary:
//!
//! - **Unaligned** (and 1-page) requests of `s` pages: a hole fits iff it has `s` pages, so
//!   the subtree's largest hole, `max_len`, answers exactly.
//! - **Aligned, `s = 2^k` pages** (by far the most common: storage stacks map powers of two):
//!   a hole fits iff it contains a naturally aligned block of `2^k` pages. A hole that
//!   contains an aligned block of order `j` also contains one of every order below `j` (its
//!   halves), so the single byte `block` = 1 + the largest order of aligned block any hole in
//!   the subtree contains answers exactly for every order: fit iff `block > k`. For one hole
//!   it is computed in O(1): with `J = floor(log2(len))`, the hole always holds an aligned
//!   block of order `J - 1` (`len >= 2^J` pages cover `2^(J-1) - 1` pages of misalignment
//!   plus `2^(J-1)`), never one of order `J + 1`, and holds one of order `J` iff
//!   `roundup(lo, 2^J) + 2^J <= hi`.
//! - **Aligned, `2^(k-1) < s < 2^k`**: neither summary is exact, so the tree keeps, for each
//!   such order `k` that has been requested, the largest room at order `k` in every subtree.
//!   The first request of such an order pays one O(holes) pass to compute it for every node
//!   (counted in `tree_nodes_visited`); after that the order is kept up to date. Workloads
//!   that only ask for powers of two never pay for this, and the per-node memory for it
//!   (`8 * orders` bytes per entry, in a separate array) is only allocated on first use.
//!
//! Each entry of a node carries these summaries of its own subtree (a leaf's entry, of its
//! hole), so deciding whether to enter a child reads the parent's arrays, not the child.
//!
//! # The operations, and their cost
//!
//! - **Search** looks at a node's entries that start below the limit from the highest down:
//!   a leaf's hole is tried (clipped at the limit); a child entirely below the limit is
//!   entered only if its summary holds the request, and then descended exactly (at each
//!   level, the highest entry that holds it); the one child that straddles the limit is
//!   searched the same way recursively, and skipped if it has no fit. So at most one child
//!   per level is entered without a guaranteed fit: O(height x entries per node).
//! - **Allocation** cuts the range out of the holder hole, leaving a part below it, above it
//!   (less than the alignment), both, or neither: the hole shrinks in place, gains its upper
//!   part as a new entry just after it, or is deleted. The range goes into the index.
//! - **Free** removes the range from the index (refusing it if it is not there exactly as
//!   given), then walks down by address to the leaf where the range belongs, which holds the
//!   hole just below it and, unless the range falls after the leaf's last hole, the one just
//!   above (else one more walk finds it). The range then extends the hole below, the hole
//!   above, merges the two (one is deleted, the other takes the merged extent), or becomes a
//!   new entry.
//! - **The frontier**: one hole is kept out of the tree: at first the whole space, which
//!   top-down allocation then eats from the top, so usually the large hole below every live
//!   range. An allocation also computes the frontier's fit (O(1)) and takes the higher of it
//!   and the tree's; taking from the frontier shrinks it in place, and when it splits, the
//!   larger part stays the frontier and the other becomes a tree hole. A free that touches
//!   the frontier extends it (absorbing the tree hole on the range's other side, if any);
//!   with nothing live the tree is empty and every operation is O(1). Without it, every
//!   allocation from that large hole changed its length, and so the largest-hole summary of
//!   every node above it, up to the root. If the frontier is used up, the tree holds every
//!   hole until a free with no hole anywhere becomes the new frontier.
//! - Both then refresh each ancestor's entry for the changed node, upwards, and stop as soon
//!   as one comes out unchanged. A node that fills up splits in two (and may split its
//!   parent); one that falls below half full borrows an entry from a sibling or merges with
//!   it (and may empty its parent), so all leaves stay at the same depth.
//!
//! Worst case per operation: O(log holes) nodes of at most 16 entries each, plus one index
//! operation (O(1)), once its order is active (plus O(number of active non-power-of-two
//! orders) per refreshed entry).
//!
//! # Work counted
//!
//! One [`LockId::IovaTree`] acquisition per `alloc`/`free` past argument checks.
//! `tree_nodes_visited` counts every B-tree node stepped onto, and the frontier as one node
//! when an allocation looks at it or a free extends it: the search's nodes, the walks of a
//! free (and of an insertion) down the tree, the sibling a shrunk node borrows from or merges
//! with, and every node of a one-off order activation. Refreshing the remembered path steps
//! onto no new node and is not counted; nor are the index's lookups, which are not tree
//! nodes. `tree_rotations` counts restructurings: node splits, merges and borrows (the AVL
//! tree this replaced counted its rotations there).
//!
//! Configuration is the same [`IovaSpaceConfig`] as the Linux allocator, including the cap on
//! live ranges. The index's chunk directory is a hash map with `foldhash`'s fixed-seed hasher:
//! it is only ever looked up, and [`GapTreeAllocator::ranges`] sorts what it lists, so no
//! output depends on its order.

mod btree;
mod index;

use btree::HoleTree;

use crate::addr::Iova;
use crate::iova::linux::{self, order_base_2, IovaConfigError, IovaSpaceConfig};
use crate::iova::{AllocRequest, IovaAllocator, IovaBlock, IovaError};
use crate::work::{LockId, WorkRecord};
use parking_lot::Mutex;

/// What a request needs from a hole, and which summary answers it exactly.
#[derive(Clone, Copy, Debug)]
struct Query {
    /// Pages.
    s: u64,
    /// Alignment order (0: unaligned).
    k: usize,
    kind: Kind,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// `max_len >= s`.
    Len,
    /// `s == 2^k`: `block > k`.
    Block,
    /// Anything else: the room at order `k` (an active order) `>= s`.
    Room,
}

/// Room at order `k` of the hole `[lo, hi)`: how many pages fit above the first
/// `2^k`-aligned page at or after `lo`.
#[inline]
fn room_of(lo: u64, hi: u64, k: usize) -> u64 {
    let a = (1u64 << k) - 1;
    hi.saturating_sub((lo + a) & !a)
}

/// 1 + the largest order of naturally aligned block inside `[lo, hi)`; 0 if empty.
/// See the module docs for why one test suffices.
#[inline]
fn block_of(lo: u64, hi: u64) -> u8 {
    let len = hi - lo;
    if len == 0 {
        return 0;
    }
    let j = 63 - len.leading_zeros();
    let b = 1u64 << j;
    let start = (lo + b - 1) & !(b - 1);
    if start + b <= hi {
        j as u8 + 1
    } else {
        j as u8
    }
}

/// The highest placement of `s` pages aligned to `2^k` in `[lo, hi)`.
#[inline]
fn fit(lo: u64, hi: u64, s: u64, k: usize) -> Option<u64> {
    if hi < s {
        return None;
    }
    let a = (hi - s) & !((1u64 << k) - 1);
    (a >= lo).then_some(a)
}

/// An invariant of the gap tree does not hold (found by
/// [`GapTreeAllocator::check_invariants`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("gap tree invariant broken: {0}")]
pub struct InvariantViolation(pub String);

#[derive(Debug)]
struct State {
    holes: HoleTree,
    /// Allocated ranges by first page.
    allocated: index::RangeIndex,
}

/// The O(log n) gap-tree IOVA allocator. See the module docs.
#[derive(Debug)]
pub struct GapTreeAllocator {
    granule: u64,
    start_pfn: u64,
    end_pfn: u64,
    max_live: usize,
    state: Mutex<State>,
}

impl GapTreeAllocator {
    /// Builds an empty allocator over the configured space.
    pub fn new(config: IovaSpaceConfig) -> Result<Self, IovaConfigError> {
        let (start_pfn, end_pfn) = config.validate()?;
        let orders = order_base_2(end_pfn) as usize + 1;
        let mut holes = HoleTree::new(orders);
        holes.frontier = Some((start_pfn, end_pfn));
        Ok(Self {
            granule: config.granule,
            start_pfn,
            end_pfn,
            max_live: config.max_live_blocks,
            state: Mutex::new(State {
                holes,
                allocated: index::RangeIndex::new(),
            }),
        })
    }

    /// The allocated ranges in address order, as `(first page, last page)`.
    pub fn ranges(&self) -> Vec<(u64, u64)> {
        let st = self.state.lock();
        let v = st.allocated.sorted();
        v.into_iter()
            .map(|(lo, pages)| (lo, lo + pages - 1))
            .collect()
    }

    /// The free holes in address order, as `(first page, one past the last page)`.
    pub fn holes(&self) -> Vec<(u64, u64)> {
        self.state.lock().holes.in_order()
    }

    /// Height of the B-tree of holes in nodes (0 when every hole, if any, is the frontier),
    /// for checking the O(log n) bound.
    pub fn tree_height(&self) -> usize {
        self.state.lock().holes.height()
    }

    /// Checks every invariant: the hole tree's order, node fill, leaf depth and summaries
    /// (largest hole, largest aligned block, room at every active order); holes neither empty,
    /// overlapping nor touching; and holes and allocated ranges together covering the space
    /// exactly once. O(n); for tests.
    pub fn check_invariants(&self) -> Result<(), InvariantViolation> {
        let st = self.state.lock();
        let bad = |m: String| Err(InvariantViolation(m));
        st.holes.check().map_err(InvariantViolation)?;
        let holes = st.holes.in_order();
        if let Some((lo, hi)) = st.holes.frontier {
            if lo >= hi {
                return bad(format!("empty frontier [{lo:#x}, {hi:#x})"));
            }
        }
        let counted = st.holes.len + usize::from(st.holes.frontier.is_some());
        if holes.len() != counted {
            return bad(format!(
                "{} holes in the tree and frontier, {counted} counted",
                holes.len()
            ));
        }
        for pair in holes.windows(2) {
            if pair[0].1 >= pair[1].0 {
                return bad(format!(
                    "holes {:?} and {:?} overlap or touch (or are out of order)",
                    pair[0], pair[1]
                ));
            }
        }
        let mut pieces: Vec<(u64, u64, bool)> =
            holes.iter().map(|&(lo, hi)| (lo, hi, true)).collect();
        st.allocated.check().map_err(InvariantViolation)?;
        let ranges = st.allocated.sorted();
        pieces.extend(ranges.iter().map(|&(lo, pages)| (lo, lo + pages, false)));
        pieces.sort_unstable();
        let mut at = self.start_pfn;
        for (lo, hi, hole) in pieces {
            let what = if hole { "hole" } else { "range" };
            if lo != at || hi <= lo {
                return bad(format!(
                    "{what} [{lo:#x}, {hi:#x}) where page {at:#x} was expected next"
                ));
            }
            at = hi;
        }
        if at != self.end_pfn {
            return bad(format!(
                "holes and ranges end at page {at:#x}, not {:#x}",
                self.end_pfn
            ));
        }
        Ok(())
    }

    /// Checks every invariant. For unit tests.
    #[cfg(test)]
    fn check(&self) {
        if let Err(e) = self.check_invariants() {
            panic!("{e}");
        }
    }
}

impl IovaAllocator for GapTreeAllocator {
    fn name(&self) -> &'static str {
        "gaptree"
    }

    fn granule(&self) -> u64 {
        self.granule
    }

    fn range(&self) -> (Iova, Iova) {
        (
            Iova::new(self.start_pfn * self.granule),
            Iova::new(self.end_pfn * self.granule),
        )
    }

    fn alloc(&self, req: AllocRequest, work: &mut WorkRecord) -> Result<IovaBlock, IovaError> {
        let (s, limit) = match self.check_request(&req) {
            Ok(v) => v,
            Err(e) => {
                work.alloc_failures += 1;
                return Err(e);
            }
        };
        let k = if req.size_aligned {
            order_base_2(s) as usize
        } else {
            0
        };
        let kind = if k == 0 {
            Kind::Len
        } else if s.is_power_of_two() {
            Kind::Block
        } else {
            Kind::Room
        };
        let q = Query { s, k, kind };
        work.lock(LockId::IovaTree);
        let mut st = self.state.lock();
        let st = &mut *st;
        let t = &mut st.holes;
        let found = if k < t.orders && st.allocated.len() < self.max_live {
            if kind == Kind::Room && t.active & (1 << k) == 0 {
                t.activate(k, work);
            }
            t.alloc(limit, &q, work)
        } else {
            None
        };
        let Some(a) = found else {
            work.alloc_failures += 1;
            return Err(IovaError::Exhausted {
                pages: s,
                limit: req.limit.get(),
            });
        };
        st.allocated.insert(a, s);
        Ok(IovaBlock {
            start: Iova::new(a * self.granule),
            pages: s,
        })
    }

    fn free(&self, block: IovaBlock, cpu: usize, work: &mut WorkRecord) -> Result<(), IovaError> {
        let _ = cpu;
        let (lo, hi) = self.check_block(&block)?;
        work.lock(LockId::IovaTree);
        let mut st = self.state.lock();
        if st.free(lo, hi, work) {
            Ok(())
        } else {
            Err(IovaError::NotAllocated {
                start: block.start.get(),
                pages: block.pages,
            })
        }
    }

    fn free_batch(&self, blocks: &[IovaBlock], cpu: usize, work: &mut WorkRecord) -> usize {
        let _ = cpu;
        if blocks.is_empty() {
            return 0;
        }
        work.lock(LockId::IovaTree);
        let mut st = self.state.lock();
        let mut freed = 0;
        for block in blocks {
            if let Ok((lo, hi)) = self.check_block(block) {
                freed += usize::from(st.free(lo, hi, work));
            }
        }
        freed
    }

    fn live_blocks(&self) -> usize {
        self.state.lock().allocated.len()
    }
}

impl GapTreeAllocator {
    /// Checks an allocation request; returns `(pages, limit page)`: the Linux allocator's
    /// checks and errors.
    #[inline]
    fn check_request(&self, req: &AllocRequest) -> Result<(u64, u64), IovaError> {
        linux::check_tree_request(req, self.granule, self.start_pfn, self.end_pfn)
    }

    /// Checks a block passed to free; returns `(first page, last page)`: the Linux
    /// allocator's check.
    #[inline]
    fn check_block(&self, block: &IovaBlock) -> Result<(u64, u64), IovaError> {
        linux::check_tree_block(block, self.granule, self.start_pfn, self.end_pfn)
    }
}

impl State {
    /// Frees the exact range `lo..=hi`; false (and no change) if it is not allocated so.
    fn free(&mut self, lo: u64, hi: u64, work: &mut WorkRecord) -> bool {
        if !self.allocated.remove_exact(lo, hi - lo + 1) {
            return false;
        }
        self.holes.free_range(lo, hi + 1, work);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::addr::{SZ_4G, SZ_4K};
    use crate::iova::test_support::assert_bad_frees_refused;

    const G: u64 = SZ_4K;
    const END: u64 = 1 << 36;

    fn gap(end: u64) -> GapTreeAllocator {
        GapTreeAllocator::new(IovaSpaceConfig::new(G, Iova::new(end))).unwrap()
    }

    fn req(pages: u64, limit: u64) -> AllocRequest {
        AllocRequest::new(pages, Iova::new(limit), 0)
    }

    #[test]
    fn first_alloc_is_the_highest_aligned_range() {
        let a = gap(END);
        let mut w = WorkRecord::new();

        let b = a.alloc(req(3, END), &mut w).unwrap();

        assert_eq!(
            b,
            IovaBlock {
                start: Iova::new(END - 4 * G),
                pages: 3
            }
        );
        a.check();
    }

    #[test]
    fn unaligned_requests_pack_against_the_top() {
        let a = gap(END);
        let mut w = WorkRecord::new();
        let r = AllocRequest {
            size_aligned: false,
            ..req(3, END)
        };

        let b1 = a.alloc(r, &mut w).unwrap();
        let b2 = a.alloc(r, &mut w).unwrap();

        assert_eq!(b1.start, Iova::new(END - 3 * G));
        assert_eq!(b2.start, Iova::new(END - 6 * G));
    }

    #[test]
    fn a_lucky_aligned_small_gap_above_wins_over_a_big_gap_below() {
        // Pages 56..64 free (8 pages, 8-aligned), 8..56 allocated, below that free.
        let a = gap(64 * G);
        let mut w = WorkRecord::new();
        let top = a.alloc(req(8, 64 * G), &mut w).unwrap();
        for _ in 0..6 {
            a.alloc(req(8, 64 * G), &mut w).unwrap();
        }
        a.free(top, 0, &mut w).unwrap();

        let b = a.alloc(req(8, 64 * G), &mut w).unwrap();

        // A conservative "gap >= 8 + 8 - 1" test would have skipped the exact-size gap.
        assert_eq!(b, top);
        a.check();
    }

    #[test]
    fn misaligned_gap_above_is_skipped_for_an_aligned_request() {
        // Free pages 60..64 only after 4-page blocks; ask for 4 pages aligned: fits at 60.
        // Ask for 3 pages aligned to 4 in a 3-page gap at 61..64: does not fit there.
        let a = gap(64 * G);
        let mut w = WorkRecord::new();
        let un = |p| AllocRequest {
            size_aligned: false,
            ..req(p, 64 * G)
        };
        a.alloc(un(3), &mut w).unwrap(); // 61..64
        a.alloc(un(1), &mut w).unwrap(); // 60
        a.free(
            IovaBlock {
                start: Iova::new(61 * G),
                pages: 3,
            },
            0,
            &mut w,
        )
        .unwrap();

        let b = a.alloc(req(3, 64 * G), &mut w).unwrap();

        // 61..64 cannot hold a 4-aligned block, so the next is 56.
        assert_eq!(b.start, Iova::new(56 * G));
        a.check();
    }

    #[test]
    fn the_frontier_shrinks_splits_vanishes_and_grows_back_with_exact_counts() {
        // Pages 1..64, all in the frontier at first. Every step: the placement, the holes
        // after it, and the nodes visited (the frontier counts as one).
        let a = gap(64 * G);
        let un = |p, limit| AllocRequest {
            size_aligned: false,
            ..req(p, limit)
        };
        let step = |r: AllocRequest| {
            let mut w = WorkRecord::new();
            let got = a.alloc(r, &mut w).map(|b| b.start.get() / G);
            a.check();
            (got.ok(), a.holes(), w.tree_nodes_visited)
        };
        let free = |lo: u64, pages: u64| {
            let mut w = WorkRecord::new();
            let b = IovaBlock {
                start: Iova::new(lo * G),
                pages,
            };
            a.free(b, 0, &mut w).unwrap();
            a.check();
            (a.holes(), w.tree_nodes_visited)
        };

        // Shrinks from the top, then grows back.
        assert_eq!(step(req(4, 64 * G)), (Some(60), vec![(1, 60)], 1));
        assert_eq!(free(60, 4), (vec![(1, 64)], 1));
        // A limit inside the hole clips it, and the hole splits in two: the larger part stays
        // the frontier, the other goes into the (empty) tree.
        assert_eq!(step(req(2, 32 * G)), (Some(30), vec![(1, 30), (32, 64)], 1));
        assert_eq!(a.tree_height(), 1);
        // The frontier takes the freed range and the tree hole below it back.
        assert_eq!(free(30, 2), (vec![(1, 64)], 2));
        assert_eq!(a.tree_height(), 0);
        // Shrinks from the bottom; then a limit at or below the hole's start finds nothing.
        assert_eq!(step(un(31, 32 * G)), (Some(1), vec![(32, 64)], 1));
        assert_eq!(step(req(1, 32 * G)), (None, vec![(32, 64)], 1));
        // Vanishes, then comes back (a free with no hole anywhere) and is extended.
        assert_eq!(step(un(32, 64 * G)), (Some(32), vec![], 1));
        assert_eq!(free(1, 31), (vec![(1, 32)], 0));
        // An unlimited request the frontier cannot hold (no aligned 32-page block).
        assert_eq!(step(req(32, 64 * G)), (None, vec![(1, 32)], 1));
        assert_eq!(free(32, 32), (vec![(1, 64)], 1));
        // A range that does not touch the frontier becomes a hole in the tree.
        assert_eq!(step(req(1, 64 * G)), (Some(63), vec![(1, 63)], 1));
        assert_eq!(step(req(1, 64 * G)), (Some(62), vec![(1, 62)], 1));
        assert_eq!(free(63, 1), (vec![(1, 62), (63, 64)], 0));
        assert_eq!(a.tree_height(), 1);
    }

    #[test]
    fn request_and_block_checks_keep_the_division_semantics() {
        // The shared checks shift by log2(granule); this is what they computed with
        // divisions before, for a power-of-two granule.
        fn by_division(r: &AllocRequest, start: u64, end: u64) -> Result<(u64, u64), IovaError> {
            if r.pages == 0 || r.pages > end - start {
                return Err(IovaError::BadSize { pages: r.pages });
            }
            let limit = (r.limit.get() / G).min(end);
            if limit <= start {
                return Err(IovaError::LimitTooLow {
                    limit: r.limit.get(),
                    start: start * G,
                });
            }
            Ok((r.pages, limit))
        }
        fn block_by_division(b: &IovaBlock, start: u64, end: u64) -> Result<(u64, u64), IovaError> {
            let err = IovaError::NotAllocated {
                start: b.start.get(),
                pages: b.pages,
            };
            let s = b.start.get();
            if b.pages == 0 || s % G != 0 {
                return Err(err);
            }
            match (s / G).checked_add(b.pages - 1) {
                Some(hi) if s / G >= start && hi < end => Ok((s / G, hi)),
                _ => Err(err),
            }
        }
        let a = GapTreeAllocator::new(IovaSpaceConfig::new(G, Iova::new(64 * G))).unwrap();
        let (start, end) = (a.start_pfn, a.end_pfn);
        let addresses = [
            0,
            1,
            G - 1,
            G,
            G + 1,
            2 * G,
            63 * G,
            64 * G,
            64 * G + 1,
            65 * G,
        ];
        let addresses = addresses.into_iter().chain([u64::MAX - G + 1, u64::MAX]);
        let mut checked = 0;
        for addr in addresses {
            for pages in [0, 1, 2, 3, 62, 63, 64, 65, u64::MAX] {
                let r = req(pages, addr);
                assert_eq!(a.check_request(&r), by_division(&r, start, end), "{r:?}");
                let b = IovaBlock {
                    start: Iova::new(addr),
                    pages,
                };
                assert_eq!(
                    a.check_block(&b),
                    block_by_division(&b, start, end),
                    "{b:?}"
                );
                checked += 1;
            }
        }
        assert_eq!(checked, 12 * 9);
    }

    #[test]
    fn limit_clips_a_straddling_gap() {
        let a = gap(END);
        let mut w = WorkRecord::new();

        let b = a.alloc(req(2, SZ_4G + G), &mut w).unwrap();

        assert_eq!(b.start, Iova::new(SZ_4G - 2 * G));
    }

    #[test]
    fn iova_zero_is_never_returned_when_space_runs_out() {
        let a = gap(16 * G);
        let mut w = WorkRecord::new();

        let got: Vec<_> = std::iter::from_fn(|| a.alloc(req(1, 16 * G), &mut w).ok()).collect();

        assert_eq!(got.len(), 15);
        assert!(got.iter().all(|b| b.start.get() != 0));
        assert_eq!(got.last().unwrap().start, Iova::new(G));
    }

    #[test]
    fn space_freed_anywhere_is_found_again() {
        let a = gap(64 * G);
        let mut w = WorkRecord::new();
        let all: Vec<_> = std::iter::from_fn(|| a.alloc(req(1, 64 * G), &mut w).ok()).collect();
        a.free(all[40], 0, &mut w).unwrap();
        a.free(all[3], 0, &mut w).unwrap();

        let b = a.alloc(req(1, 64 * G), &mut w).unwrap();

        assert_eq!(b, all[3]);
        a.check();
    }

    #[test]
    fn worst_case_work_is_logarithmic() {
        // Many 1-page holes that cannot hold a 2-page aligned request, then one at the bottom.
        let a = gap(1 << 24);
        let mut w = WorkRecord::new();
        let lim = 1 << 24;
        let un = AllocRequest {
            size_aligned: false,
            ..req(1, lim)
        };
        let blocks: Vec<_> = (0..4000).map(|_| a.alloc(un, &mut w).unwrap()).collect();
        // Free every other page: 2000 one-page holes.
        for b in blocks.iter().step_by(2) {
            a.free(*b, 0, &mut w).unwrap();
        }
        let height = a.tree_height() as u64;
        // Warm up the path (no order activation is needed for powers of two).
        let first = a.alloc(req(2, lim), &mut w).unwrap();
        a.free(first, 0, &mut w).unwrap();

        let mut w2 = WorkRecord::new();
        let b = a.alloc(req(2, lim), &mut w2).unwrap();

        assert!(b.start.get() < (lim - 4000 * G));
        assert!(
            w2.tree_nodes_visited <= 4 * height + 4,
            "{w2:?} height {height}"
        );
        a.check();
    }

    #[test]
    fn block_of_is_the_largest_aligned_block() {
        for gl in 1..80u64 {
            for gh in gl..200 {
                let want = (0..8)
                    .filter(|&j| room_of(gl, gh, j) >= 1 << j)
                    .map(|j| j as u8 + 1)
                    .max()
                    .unwrap_or(0);
                assert_eq!(block_of(gl, gh), want, "[{gl}, {gh})");
            }
        }
    }

    #[test]
    fn worst_case_work_is_logarithmic_for_other_sizes_too() {
        // 3-page holes at addresses 1 mod 4 can never hold 3 pages aligned to 4; nor can
        // unaligned 4-page requests use them. Both must skip them in O(log n).
        let a = gap(1 << 30);
        let mut w = WorkRecord::new();
        let lim = 1 << 30;
        let un = |p| AllocRequest {
            size_aligned: false,
            ..req(p, lim)
        };
        let mut holes = Vec::new();
        for _ in 0..1000 {
            holes.push(a.alloc(un(3), &mut w).unwrap());
            a.alloc(un(1), &mut w).unwrap();
        }
        assert!(holes.iter().all(|b| b.start.get() / G % 4 == 1));
        for b in &holes {
            a.free(*b, 0, &mut w).unwrap();
        }
        let height = a.tree_height() as u64;
        for r in [req(3, lim), un(4)] {
            // The first request of each kind may start maintaining its summary.
            let first = a.alloc(r, &mut w).unwrap();
            a.free(first, 0, &mut w).unwrap();

            let mut w2 = WorkRecord::new();
            let b = a.alloc(r, &mut w2).unwrap();

            assert_eq!(b, first);
            assert!(b.start.get() < lim - 4000 * G);
            assert!(
                w2.tree_nodes_visited <= 4 * height + 4,
                "{w2:?} height {height}"
            );
            a.free(b, 0, &mut w).unwrap();
            a.check();
        }
    }

    #[test]
    fn double_free_and_partial_frees_are_rejected() {
        let a = gap(END);
        let mut w = WorkRecord::new();
        let b = a.alloc(req(4, END), &mut w).unwrap();
        let keep = a.alloc(req(4, END), &mut w).unwrap();
        a.free(b, 0, &mut w).unwrap();

        let bad = [
            b,
            IovaBlock {
                start: keep.start,
                pages: 2,
            },
            IovaBlock {
                start: keep.start.add(G),
                pages: 3,
            },
            IovaBlock {
                start: Iova::new(END),
                pages: 1,
            },
            IovaBlock {
                start: Iova::new(END - G),
                pages: 1,
            },
        ];
        assert_bad_frees_refused(&a, &bad, &mut w);
        assert_eq!(a.alloc(req(4, END), &mut w).unwrap(), b);
        a.check();
    }

    #[test]
    fn zero_pages_and_too_low_limits_are_rejected() {
        let a = gap(END);
        let mut w = WorkRecord::new();

        assert_eq!(
            a.alloc(req(0, END), &mut w),
            Err(IovaError::BadSize { pages: 0 })
        );
        assert!(matches!(
            a.alloc(req(1, G), &mut w),
            Err(IovaError::LimitTooLow { .. })
        ));
        assert_eq!(w.lock_count(LockId::IovaTree), 0);
        assert_eq!(a.live_blocks(), 0);
    }

    #[test]
    fn a_request_too_big_for_any_aligned_place_is_exhausted() {
        // 63 usable pages: 33 pages aligned to 64 cannot be placed anywhere above page 0.
        let a = gap(64 * G);
        let mut w = WorkRecord::new();

        let r = a.alloc(req(33, 64 * G), &mut w);

        assert!(matches!(r, Err(IovaError::Exhausted { .. })));
        assert_eq!(w.alloc_failures, 1);
    }

    #[test]
    fn churn_keeps_the_tree_valid_and_balanced() {
        let a = gap(END);
        let mut w = WorkRecord::new();
        let mut live = Vec::new();
        let mut x: u64 = 99;
        for i in 0..4000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            if i % 3 != 2 || live.is_empty() {
                let r = AllocRequest {
                    size_aligned: x & 2 == 0,
                    ..req(1 + (x >> 59), if x & 1 == 0 { SZ_4G } else { END })
                };
                live.push(a.alloc(r, &mut w).unwrap());
            } else {
                let b = live.swap_remove((x >> 33) as usize % live.len());
                a.free(b, 0, &mut w).unwrap();
            }
        }
        a.check();
        assert_eq!(a.live_blocks(), live.len());
        assert!(a.tree_height() <= 2 * (64 - (live.len() as u64 + 1).leading_zeros()) as usize);
        assert!(w.tree_rotations > 0);
    }

    #[test]
    fn holes_over_many_nodes_split_borrow_and_merge() {
        // 6,000 one-page ranges, then every other one freed: 3,000 holes, over several levels
        // of B-tree nodes. Then a mix of aligned allocations (which split and consume holes)
        // and frees in a scrambled order (which merge holes across leaves), checked throughout.
        let end = 1u64 << 20;
        let a = gap(end * G);
        let mut w = WorkRecord::new();
        let un = AllocRequest {
            size_aligned: false,
            ..req(1, end * G)
        };
        let mut live: Vec<IovaBlock> = (0..6000).map(|_| a.alloc(un, &mut w).unwrap()).collect();
        let kept: Vec<IovaBlock> = live.iter().copied().skip(1).step_by(2).collect();
        for b in live.iter().step_by(2) {
            a.free(*b, 0, &mut w).unwrap();
        }
        live = kept;
        a.check();
        assert_eq!(a.holes().len(), 3001);
        assert!(a.tree_height() >= 3, "height {}", a.tree_height());
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        let mut step = 0;
        while !live.is_empty() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if x % 3 == 0 {
                let pages = 1 << ((x >> 8) % 3);
                live.push(a.alloc(req(pages, end * G), &mut w).unwrap());
            } else {
                let i = (x >> 20) as usize % live.len();
                a.free(live.swap_remove(i), 0, &mut w).unwrap();
            }
            step += 1;
            if step % 97 == 0 {
                a.check();
            }
        }
        a.check();
        assert_eq!(a.holes(), vec![(1, end)]);
        assert_eq!(a.tree_height(), 0, "everything is back in the frontier");
        assert!(w.tree_rotations > 0);
    }

    #[test]
    fn free_batch_takes_the_lock_once() {
        let a = gap(END);
        let mut w = WorkRecord::new();
        let blocks: Vec<_> = (0..20)
            .map(|_| a.alloc(req(2, END), &mut w).unwrap())
            .collect();

        let mut w2 = WorkRecord::new();
        let n = a.free_batch(&blocks, 0, &mut w2);

        assert_eq!(n, 20);
        assert_eq!(w2.lock_count(LockId::IovaTree), 1);
        assert_eq!(a.live_blocks(), 0);
        a.check();
    }
}
