//! The gap tree: iolab's O(log n) IOVA allocator with the Linux allocator's contract.
//!
//! Like [`super::linux`] it keeps the *allocated* ranges in a balanced tree (here an AVL tree
//! in an arena) with a permanent anchor node at the top of the space, and it allocates top
//! down: a request gets the **highest** range below its limit that fits, aligned down to the
//! next power of two of its size when `size_aligned`. Unlike Linux there is no cursor and no
//! linear walk: the result is always the highest fit, found in O(log n) in the worst case.
//!
//! # The augmentation, and why the search is exact
//!
//! Each node owns the free gap directly below it (between its predecessor's end, or the start
//! of the space, and its own start). A gap `[lo, hi)` can hold a block of `s` pages aligned to
//! `2^k` exactly when `hi - roundup(lo, 2^k) >= s`. Call `hi - roundup(lo, 2^k)` the gap's
//! *room at order k*. Every node stores, for every order `k` the space can need, the largest
//! room at order `k` in its subtree. A plain "largest gap" would only allow the conservative
//! test `gap >= s + 2^k - 1` (which misses gaps that fit thanks to a lucky alignment), or an
//! exact test that may descend into subtrees that turn out not to fit (losing the O(log n)
//! bound). With the room per order the test is exact *and* never wrong about a subtree, so:
//!
//! - the search follows the path to the limit, and on the way back checks each node's own gap
//!   (clipped at the limit where it straddles it) and the room of each left subtree it passed,
//!   in descending address order: O(height);
//! - once a subtree is known to hold a fit it descends into it, preferring the right child:
//!   O(height), and every subtree entered holds a fit.
//!
//! Insertion and removal are AVL operations that recompute the room on the way back up and in
//! each rotation, stopping as soon as a subtree's height and room come out unchanged.
//!
//! The room is only maintained for the orders requests have used so far: the first request of
//! a new order pays one O(n) pass to compute it for every node (counted in
//! `tree_nodes_visited`), after which that order is kept up to date. A workload uses a handful
//! of orders (pages rounded to powers of two), so an update costs a handful of maxima per node
//! instead of one per possible order. Memory is `8 * orders` bytes per node (orders = bits of
//! the space in pages plus one: 37 for a 48-bit space of 4 KiB pages). Worst case per
//! operation, once its order is active: O(orders * log n).
//!
//! # Work counted
//!
//! One [`LockId::IovaTree`] acquisition per `alloc`/`free` past argument checks.
//! `tree_nodes_visited` counts every node stepped onto: search path and descent, insertion and
//! deletion descents, the successor lookup of a free, the minimum removal of a deletion.
//! `tree_rotations` counts single rotations (a double rotation is two).
//!
//! Configuration is the same [`IovaSpaceConfig`] as the Linux allocator, including the cap on
//! live ranges.

use crate::addr::Iova;
use crate::iova::linux::{
    check_tree_block, check_tree_request, order_base_2, IovaConfigError, IovaSpaceConfig,
};
use crate::iova::{AllocRequest, IovaAllocator, IovaBlock, IovaError};
use crate::work::{LockId, WorkRecord};
use parking_lot::Mutex;

const NIL: u32 = u32::MAX;

#[derive(Clone, Copy, Debug)]
struct Node {
    /// First page of the allocated range.
    lo: u64,
    /// Last page of the allocated range.
    hi: u64,
    /// Free pages directly below `lo`.
    gap: u64,
    left: u32,
    right: u32,
    height: u8,
}

/// The AVL tree with per-order room, in an arena.
#[derive(Debug)]
struct Tree {
    nodes: Vec<Node>,
    /// `room[i * orders + k]`: the largest room at order `k` in node `i`'s subtree.
    room: Vec<u64>,
    free: Vec<u32>,
    orders: usize,
    root: u32,
    len: usize,
    /// The node whose own gap was just changed by the operation in progress (or `NIL`):
    /// it must be recomputed even if nothing below it changed.
    touched: u32,
    /// Orders whose room is maintained (bit `k`): those requests have asked for so far.
    active: u64,
}

/// Room at order `k` of the gap `[gl, gh)`: how many pages fit above the first `2^k`-aligned
/// page at or after `gl`.
#[cfg(test)]
fn room_of(gl: u64, gh: u64, k: usize) -> u64 {
    let a = (1u64 << k) - 1;
    gh.saturating_sub((gl + a) & !a)
}

impl Tree {
    fn new(orders: usize) -> Self {
        Self {
            nodes: Vec::new(),
            room: Vec::new(),
            free: Vec::new(),
            orders,
            root: NIL,
            len: 0,
            touched: NIL,
            active: 0,
        }
    }

    #[inline]
    fn n(&self, i: u32) -> &Node {
        &self.nodes[i as usize]
    }

    #[inline]
    fn nm(&mut self, i: u32) -> &mut Node {
        &mut self.nodes[i as usize]
    }

    #[inline]
    fn height(&self, i: u32) -> u8 {
        if i == NIL {
            0
        } else {
            self.n(i).height
        }
    }

    /// Largest room at order `k` in subtree `i` (0 for an empty subtree).
    #[inline]
    fn room(&self, i: u32, k: usize) -> u64 {
        if i == NIL {
            0
        } else {
            self.room[i as usize * self.orders + k]
        }
    }

    fn new_node(&mut self, lo: u64, hi: u64, gap: u64) -> u32 {
        let node = Node {
            lo,
            hi,
            gap,
            left: NIL,
            right: NIL,
            height: 1,
        };
        let i = match self.free.pop() {
            Some(i) => {
                self.nodes[i as usize] = node;
                i
            }
            None => {
                self.nodes.push(node);
                self.room.resize(self.room.len() + self.orders, 0);
                (self.nodes.len() - 1) as u32
            }
        };
        self.update(i);
        i
    }

    /// Recomputes height and room of `i` from its children.
    /// Recomputes height and room (at the active orders) of `i` from its own gap and its
    /// children; returns whether either changed.
    fn update(&mut self, i: u32) -> bool {
        let Node {
            lo,
            gap,
            left,
            right,
            height,
            ..
        } = *self.n(i);
        let h = 1 + self.height(left).max(self.height(right));
        self.nm(i).height = h;
        let gl = lo - gap;
        let o = self.orders;
        let (base, lb, rb) = (i as usize * o, left as usize * o, right as usize * o);
        let mut changed = h != height;
        let mut bits = self.active;
        while bits != 0 {
            let k = bits.trailing_zeros() as usize;
            bits &= bits - 1;
            let a = (1u64 << k) - 1;
            let mut r = lo.saturating_sub((gl + a) & !a);
            if left != NIL {
                r = r.max(self.room[lb + k]);
            }
            if right != NIL {
                r = r.max(self.room[rb + k]);
            }
            let slot = &mut self.room[base + k];
            changed |= *slot != r;
            *slot = r;
        }
        changed
    }

    /// Starts maintaining the room at order `k`: computes it for every node (post-order).
    fn activate(&mut self, k: usize, w: &mut WorkRecord) {
        fn fill(t: &mut Tree, i: u32, k: usize, w: &mut WorkRecord) -> u64 {
            if i == NIL {
                return 0;
            }
            w.tree_nodes_visited += 1;
            let n = *t.n(i);
            let a = (1u64 << k) - 1;
            let own = n.lo.saturating_sub((n.lo - n.gap + a) & !a);
            let r = own.max(fill(t, n.left, k, w)).max(fill(t, n.right, k, w));
            t.room[i as usize * t.orders + k] = r;
            r
        }
        fill(self, self.root, k, w);
        self.active |= 1 << k;
    }

    fn rotate_right(&mut self, i: u32, w: &mut WorkRecord) -> u32 {
        w.tree_rotations += 1;
        let l = self.n(i).left;
        self.nm(i).left = self.n(l).right;
        self.nm(l).right = i;
        self.update(i);
        self.update(l);
        l
    }

    fn rotate_left(&mut self, i: u32, w: &mut WorkRecord) -> u32 {
        w.tree_rotations += 1;
        let r = self.n(i).right;
        self.nm(i).right = self.n(r).left;
        self.nm(r).left = i;
        self.update(i);
        self.update(r);
        r
    }

    /// After a change below `i` (`dirty`) or to `i`'s own gap: updates `i` and restores the
    /// AVL balance at it. Returns the subtree's new root and whether its height or room
    /// changed. A clean node with clean children is left alone, so the recomputation stops
    /// as soon as the aggregate stops changing.
    fn rebalance(&mut self, i: u32, dirty: bool, w: &mut WorkRecord) -> (u32, bool) {
        if !dirty && i != self.touched {
            return (i, false);
        }
        let changed = self.update(i);
        let (l, r) = (self.n(i).left, self.n(i).right);
        let (hl, hr) = (self.height(l), self.height(r));
        if hl > hr + 1 {
            if self.height(self.n(l).left) < self.height(self.n(l).right) {
                let nl = self.rotate_left(l, w);
                self.nm(i).left = nl;
            }
            return (self.rotate_right(i, w), true);
        }
        if hr > hl + 1 {
            if self.height(self.n(r).right) < self.height(self.n(r).left) {
                let nr = self.rotate_right(r, w);
                self.nm(i).right = nr;
            }
            return (self.rotate_left(i, w), true);
        }
        (i, changed)
    }

    /// Links the leaf `x` into subtree `i`; returns the subtree's new root and whether it
    /// changed.
    fn insert(&mut self, i: u32, x: u32, w: &mut WorkRecord) -> (u32, bool) {
        if i == NIL {
            return (x, true);
        }
        w.tree_nodes_visited += 1;
        let dirty = if self.n(x).lo < self.n(i).lo {
            let (l, d) = self.insert(self.n(i).left, x, w);
            self.nm(i).left = l;
            d
        } else {
            let (r, d) = self.insert(self.n(i).right, x, w);
            self.nm(i).right = r;
            d
        };
        self.rebalance(i, dirty, w)
    }

    /// Detaches the minimum of subtree `i`; returns the new root, whether it changed, and the
    /// detached node.
    fn remove_min(&mut self, i: u32, w: &mut WorkRecord) -> (u32, bool, u32) {
        w.tree_nodes_visited += 1;
        let l = self.n(i).left;
        if l == NIL {
            return (self.n(i).right, true, i);
        }
        let (nl, d, m) = self.remove_min(l, w);
        self.nm(i).left = nl;
        let (root, changed) = self.rebalance(i, d, w);
        (root, changed, m)
    }

    /// Removes the node starting at page `lo` (which must exist) from subtree `i`; returns
    /// the new root and whether the subtree changed.
    fn delete(&mut self, i: u32, lo: u64, w: &mut WorkRecord) -> (u32, bool) {
        w.tree_nodes_visited += 1;
        let n = *self.n(i);
        let dirty = if lo < n.lo {
            let (l, d) = self.delete(n.left, lo, w);
            self.nm(i).left = l;
            d
        } else if lo > n.lo {
            let (r, d) = self.delete(n.right, lo, w);
            self.nm(i).right = r;
            d
        } else if n.left == NIL || n.right == NIL {
            let child = if n.left == NIL { n.right } else { n.left };
            self.free.push(i);
            if child != NIL {
                // The child may be the successor, whose gap just grew.
                self.update(child);
            }
            return (child, true);
        } else {
            let (nr, _, m) = self.remove_min(n.right, w);
            let mn = *self.n(m);
            let node = self.nm(i);
            node.lo = mn.lo;
            node.hi = mn.hi;
            node.gap = mn.gap;
            node.right = nr;
            self.free.push(m);
            true
        };
        self.rebalance(i, dirty, w)
    }

    /// Finds the node starting at `lo`; returns it and its in-order successor.
    fn find_with_successor(&self, lo: u64, w: &mut WorkRecord) -> Option<(u32, u32)> {
        let mut i = self.root;
        let mut succ = NIL;
        while i != NIL {
            w.tree_nodes_visited += 1;
            let n = self.n(i);
            if lo < n.lo {
                succ = i;
                i = n.left;
            } else if lo > n.lo {
                i = n.right;
            } else {
                if n.right != NIL {
                    succ = n.right;
                    w.tree_nodes_visited += 1;
                    while self.n(succ).left != NIL {
                        succ = self.n(succ).left;
                        w.tree_nodes_visited += 1;
                    }
                }
                return Some((i, succ));
            }
        }
        None
    }

    /// The highest placement of `s` pages aligned to `2^k` in the gap `[gl, gh)`.
    #[inline]
    fn fit(gl: u64, gh: u64, s: u64, k: usize) -> Option<u64> {
        if gh < s {
            return None;
        }
        let a = (gh - s) & !((1u64 << k) - 1);
        (a >= gl).then_some(a)
    }

    /// The highest fit in subtree `i` among gaps below `limit` (clipped at it); returns the
    /// placement and the node whose gap holds it.
    fn search(
        &self,
        i: u32,
        limit: u64,
        s: u64,
        k: usize,
        w: &mut WorkRecord,
    ) -> Option<(u64, u32)> {
        if i == NIL {
            return None;
        }
        w.tree_nodes_visited += 1;
        let n = self.n(i);
        let gl = n.lo - n.gap;
        if n.lo >= limit {
            // Everything to the right starts above the limit; this gap may straddle it.
            if let Some(a) = Self::fit(gl, limit, s, k) {
                return Some((a, i));
            }
            return self.search(n.left, limit, s, k, w);
        }
        if let Some(found) = self.search(n.right, limit, s, k, w) {
            return Some(found);
        }
        if let Some(a) = Self::fit(gl, n.lo, s, k) {
            return Some((a, i));
        }
        if self.room(n.left, k) >= s {
            return Some(self.descend(n.left, s, k, w));
        }
        None
    }

    /// The highest fit in subtree `i`, which is known to hold one.
    fn descend(&self, mut i: u32, s: u64, k: usize, w: &mut WorkRecord) -> (u64, u32) {
        loop {
            w.tree_nodes_visited += 1;
            let n = self.n(i);
            if self.room(n.right, k) >= s {
                i = n.right;
                continue;
            }
            if let Some(a) = Self::fit(n.lo - n.gap, n.lo, s, k) {
                return (a, i);
            }
            // The room says the fit is in the left subtree.
            i = n.left;
        }
    }

    /// In-order ranges `(lo, hi, gap)`.
    fn in_order(&self) -> Vec<(u64, u64, u64)> {
        let mut out = Vec::with_capacity(self.len);
        let mut stack = Vec::new();
        let mut i = self.root;
        while i != NIL || !stack.is_empty() {
            while i != NIL {
                stack.push(i);
                i = self.n(i).left;
            }
            if let Some(top) = stack.pop() {
                let n = self.n(top);
                out.push((n.lo, n.hi, n.gap));
                i = n.right;
            }
        }
        out
    }

    /// Checks AVL balance and the augmentation of subtree `i`; returns its height.
    #[cfg(test)]
    fn check(&self, i: u32) -> u8 {
        if i == NIL {
            return 0;
        }
        let n = *self.n(i);
        let hl = self.check(n.left);
        let hr = self.check(n.right);
        assert!(hl.abs_diff(hr) <= 1, "AVL balance");
        assert_eq!(n.height, 1 + hl.max(hr), "height");
        for k in (0..self.orders).filter(|k| self.active & (1 << k) != 0) {
            let want = room_of(n.lo - n.gap, n.lo, k)
                .max(self.room(n.left, k))
                .max(self.room(n.right, k));
            assert_eq!(self.room(i, k), want, "room at order {k}");
        }
        n.height
    }
}

#[derive(Debug)]
struct State {
    tree: Tree,
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
        let mut tree = Tree::new(orders);
        let anchor = tree.new_node(end_pfn, end_pfn, end_pfn - start_pfn);
        tree.root = anchor;
        tree.len = 1;
        Ok(Self {
            granule: config.granule,
            start_pfn,
            end_pfn,
            max_live: config.max_live_blocks,
            state: Mutex::new(State { tree }),
        })
    }

    /// The allocated ranges in address order, as `(first page, last page)`.
    pub fn ranges(&self) -> Vec<(u64, u64)> {
        let st = self.state.lock();
        let mut v: Vec<_> = st
            .tree
            .in_order()
            .into_iter()
            .map(|(lo, hi, _)| (lo, hi))
            .collect();
        v.pop(); // the anchor
        v
    }

    /// Height of the tree (the anchor counts), for checking the O(log n) bound.
    pub fn tree_height(&self) -> usize {
        let st = self.state.lock();
        st.tree.height(st.tree.root) as usize
    }

    /// Checks every tree invariant (ordering, gaps, balance, augmentation). For tests.
    #[cfg(test)]
    fn check(&self) {
        let st = self.state.lock();
        st.tree.check(st.tree.root);
        let mut prev_end = self.start_pfn;
        let all = st.tree.in_order();
        assert_eq!(all.len(), st.tree.len);
        for (lo, hi, gap) in all {
            assert!(lo >= prev_end && hi >= lo, "order");
            assert_eq!(gap, lo - prev_end, "gap");
            prev_end = hi + 1;
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
        let (s, limit) = match check_tree_request(&req, self.granule, self.start_pfn, self.end_pfn)
        {
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
        work.lock(LockId::IovaTree);
        let mut st = self.state.lock();
        let t = &mut st.tree;
        let found = if k < t.orders && t.len - 1 < self.max_live {
            if t.active & (1 << k) == 0 {
                t.activate(k, work);
            }
            t.search(t.root, limit, s, k, work)
        } else {
            None
        };
        let Some((a, holder)) = found else {
            work.alloc_failures += 1;
            return Err(IovaError::Exhausted {
                pages: s,
                limit: req.limit.get(),
            });
        };
        // Split the holder's gap: the new node takes the part below it.
        let h = *t.n(holder);
        let gl = h.lo - h.gap;
        t.nm(holder).gap = h.lo - (a + s);
        let x = t.new_node(a, a + s - 1, a - gl);
        // The holder is the new leaf's successor, hence its ancestor: the insertion path
        // recomputes its room.
        t.touched = holder;
        t.root = t.insert(t.root, x, work).0;
        t.touched = NIL;
        t.len += 1;
        Ok(IovaBlock {
            start: Iova::new(a * self.granule),
            pages: s,
        })
    }

    fn free(&self, block: IovaBlock, cpu: usize, work: &mut WorkRecord) -> Result<(), IovaError> {
        let _ = cpu;
        let (lo, hi) = check_tree_block(&block, self.granule, self.start_pfn, self.end_pfn)?;
        work.lock(LockId::IovaTree);
        let mut st = self.state.lock();
        if Self::free_locked(&mut st.tree, lo, hi, work) {
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
        for b in blocks {
            if let Ok((lo, hi)) = check_tree_block(b, self.granule, self.start_pfn, self.end_pfn) {
                freed += usize::from(Self::free_locked(&mut st.tree, lo, hi, work));
            }
        }
        freed
    }

    fn live_blocks(&self) -> usize {
        self.state.lock().tree.len - 1
    }
}

impl GapTreeAllocator {
    /// Removes the exact range `lo..=hi`; false (and no change) if it is not allocated so.
    fn free_locked(t: &mut Tree, lo: u64, hi: u64, w: &mut WorkRecord) -> bool {
        let Some((x, succ)) = t.find_with_successor(lo, w) else {
            return false;
        };
        let n = *t.n(x);
        // The anchor has no successor; a real range always has one (at worst the anchor).
        if n.hi != hi || succ == NIL {
            return false;
        }
        // The successor's gap absorbs the freed range and the gap below it. The successor is
        // on the deletion path (an ancestor, the replacement, or the promoted child), so its
        // room is recomputed there.
        t.nm(succ).gap += n.gap + (n.hi - n.lo + 1);
        t.touched = succ;
        t.root = t.delete(t.root, lo, w).0;
        t.touched = NIL;
        t.len -= 1;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::addr::{SZ_4G, SZ_4K};

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
        // The first 2-page aligned request starts maintaining order 1 (a one-off full pass).
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
        for x in bad {
            assert!(
                matches!(a.free(x, 0, &mut w), Err(IovaError::NotAllocated { .. })),
                "{x:?}"
            );
        }
        assert_eq!(a.live_blocks(), 1);
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
