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
//! `2^k` exactly when `hi - roundup(lo, 2^k) >= s`; call `hi - roundup(lo, 2^k)` the gap's
//! *room at order k*. The search needs, for every subtree, an **exact** answer to "does some
//! gap in here hold the request?": then it never enters a subtree without a fit, which is
//! what makes it O(height). (A plain "largest gap" only allows either the conservative test
//! `gap >= s + 2^k - 1`, which misses gaps that fit thanks to a lucky alignment, or an
//! optimistic one that may enter subtrees without a fit, losing the bound: think of many
//! 3-page gaps at odd addresses and a 3-page request aligned to 4.)
//!
//! Requests come in three kinds, and each has an exact per-subtree summary:
//!
//! - **Unaligned** (and 1-page) requests of `s` pages: a gap fits iff it has `s` pages, so
//!   the subtree's largest gap, `max_gap`, answers exactly.
//! - **Aligned, `s = 2^k` pages** (by far the most common: storage stacks map powers of two):
//!   a gap fits iff it contains a naturally aligned block of `2^k` pages. A gap that contains
//!   an aligned block of order `j` also contains one of every order below `j` (its halves),
//!   so the single byte `block` = 1 + the largest order of aligned block any gap in the
//!   subtree contains (0: no free page) answers exactly for every order: fit iff `block > k`.
//!   For one gap it is computed in O(1): with `J = floor(log2(len))`, the gap always holds an
//!   aligned block of order `J - 1` (`len >= 2^J` pages cover `2^(J-1) - 1` pages of
//!   misalignment plus `2^(J-1)`), never one of order `J + 1`, and holds one of order `J`
//!   iff `roundup(lo, 2^J) + 2^J <= hi`.
//! - **Aligned, `2^(k-1) < s < 2^k`**: neither summary is exact, so the tree keeps, for each
//!   such order `k` that has been requested, the largest room at order `k` in every subtree.
//!   The first request of such an order pays one O(n) pass to compute it for every node
//!   (counted in `tree_nodes_visited`); after that the order is kept up to date. Workloads
//!   that only ask for powers of two never pay for this, and the per-node memory for it
//!   (`8 * orders` bytes, in a separate array) is only allocated on first use.
//!
//! # Layout
//!
//! Each node keeps the summaries (largest gap, height, block) of its **two subtrees**, not
//! its own: its own summary is computed from its line when needed. So the search decides
//! where to go, and the retrace rebalances and recomputes, from the lines of the nodes on the
//! path alone, never touching a sibling. A node (start, gap, two `u32` child indices, two
//! summaries) fills exactly one 64-byte cache line. The last page of a range is not stored:
//! it is one below the start of the successor's gap. (A software prefetch of both children
//! during the free walk helped a little in A/B runs but needs `unsafe` on x86-64 intrinsics
//! that miri cannot check here, so the crate stays free of `unsafe` instead.) Nothing is
//! allocated per operation once the arena and the path buffer have grown.
//!
//! # The operations, and their cost
//!
//! - **Search** walks down from the root towards the limit, remembering the path. A node at
//!   or above the limit only has its own gap (clipped at the limit) to offer, and that gap is
//!   above everything left on the way, so a fit there is the answer. Otherwise the walk ends
//!   and the path is scanned back up: each node below the limit offers its own gap, then its
//!   left subtree (entirely below the limit, so the summary applies), in descending address
//!   order. The first subtree with a fit is descended, preferring the right child whenever
//!   its summary says it holds a fit, then the node's own gap, else the left child (which the
//!   summary guarantees holds one). Both phases are O(height).
//! - **Allocation** splits the holder's gap: the new range becomes the holder's in-order
//!   predecessor, linked as the rightmost node of the holder's left subtree, continuing the
//!   path the search left behind (no second descent from the root).
//! - **Free** walks down to the range and on to its successor (whose gap absorbs the freed
//!   range and the gap below it), remembering the path, then unlinks the node (a node with
//!   two children takes its successor's place instead) with no second descent.
//! - Both then retrace the path upwards, recomputing height and summaries and restoring the
//!   AVL balance, and stop as soon as a subtree comes out unchanged (unless the node whose
//!   own gap changed is still above).
//!
//! Worst case per operation: O(log n) once its order is active (plus O(number of active
//! non-power-of-two orders) per recomputed node). The retrace goes as far up as summaries
//! change; with few, scattered holes among many ranges (a churning allocator) a new or
//! filled hole changes the summaries of every subtree too small to hold another hole of its
//! class, about `log2(ranges / holes)` levels, which is what an operation mostly costs.
//!
//! # Work counted
//!
//! One [`LockId::IovaTree`] acquisition per `alloc`/`free` past argument checks.
//! `tree_nodes_visited` counts every node stepped onto: the search's walk and descent, the
//! walk from the holder to the insertion point, the walk of a free to its range and on to
//! the successor, and every node of a one-off order activation. Retracing the remembered
//! path, and reading a child's summary or height, steps onto no new node and is not counted.
//! `tree_rotations` counts single rotations (a double rotation is two).
//!
//! Configuration is the same [`IovaSpaceConfig`] as the Linux allocator, including the cap on
//! live ranges.

use crate::addr::Iova;
use crate::iova::linux::{
    check_tree_block, check_tree_request, free_tree_blocks, order_base_2, IovaConfigError,
    IovaSpaceConfig,
};
use crate::iova::{AllocRequest, IovaAllocator, IovaBlock, IovaError};
use crate::work::{LockId, WorkRecord};
use parking_lot::Mutex;

const NIL: u32 = u32::MAX;

/// No node on the retraced path has had its own gap changed.
const NO_TOUCH: usize = usize::MAX;

/// The summary of a subtree: what the search and the balancing need to know about it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Sum {
    /// The largest gap.
    max_gap: u64,
    /// AVL height (0: empty).
    height: u8,
    /// 1 + the largest order of naturally aligned block some gap contains; 0 if every gap
    /// is empty.
    block: u8,
}

/// One allocated range, with the summaries of its two subtrees kept in the node itself, so
/// that deciding where to go, rebalancing, and recomputing a summary never read a sibling:
/// every operation only touches the cache lines of the nodes on its path.
#[derive(Clone, Copy, Debug)]
#[repr(align(64))]
struct Node {
    /// First page of the allocated range. Its last page is `succ.lo - succ.gap - 1`, for
    /// its in-order successor `succ` (the anchor's is its first).
    lo: u64,
    /// Free pages directly below `lo`.
    gap: u64,
    left: u32,
    right: u32,
    /// Summaries of the left and right subtrees.
    sub: [Sum; 2],
}

impl Node {
    /// The summary of the subtree rooted here.
    #[inline]
    fn sum(&self) -> Sum {
        let [l, r] = self.sub;
        Sum {
            max_gap: self.gap.max(l.max_gap).max(r.max_gap),
            height: 1 + l.height.max(r.height),
            block: block_of(self.lo - self.gap, self.lo)
                .max(l.block)
                .max(r.block),
        }
    }
}

/// What a request needs from a gap, and which summary answers it exactly.
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
    /// `max_gap >= s`.
    Gap,
    /// `s == 2^k`: `block > k`.
    Block,
    /// Anything else: the room at order `k` (an active order) `>= s`.
    Room,
}

/// The AVL tree with its summaries, in an arena.
#[derive(Debug)]
struct Tree {
    nodes: Vec<Node>,
    /// `room[i * orders + k]`: the largest room at order `k` in node `i`'s subtree, for the
    /// active orders. Empty until the first order is activated.
    room: Vec<u64>,
    free: Vec<u32>,
    orders: usize,
    /// The anchor's first page: the end of the space.
    end: u64,
    root: u32,
    len: usize,
    /// Orders whose room is maintained (bit `k`): the non-power-of-two aligned requests
    /// seen so far.
    active: u64,
    /// The path of the operation in progress, root first (kept to avoid allocating).
    path: Vec<u32>,
}

/// Room at order `k` of the gap `[gl, gh)`: how many pages fit above the first `2^k`-aligned
/// page at or after `gl`.
#[inline]
fn room_of(gl: u64, gh: u64, k: usize) -> u64 {
    let a = (1u64 << k) - 1;
    gh.saturating_sub((gl + a) & !a)
}

/// 1 + the largest order of naturally aligned block inside the gap `[gl, gh)`; 0 if empty.
/// See the module docs for why one test suffices.
#[inline]
fn block_of(gl: u64, gh: u64) -> u8 {
    let len = gh - gl;
    if len == 0 {
        return 0;
    }
    let j = 63 - len.leading_zeros();
    let b = 1u64 << j;
    let start = (gl + b - 1) & !(b - 1);
    if start + b <= gh {
        j as u8 + 1
    } else {
        j as u8
    }
}

/// Index of `i`'s side in its parent's `sub`.
const L: usize = 0;
const R: usize = 1;

impl Tree {
    fn new(orders: usize, end: u64) -> Self {
        Self {
            nodes: Vec::new(),
            room: Vec::new(),
            free: Vec::new(),
            orders,
            end,
            root: NIL,
            len: 0,
            active: 0,
            path: Vec::with_capacity(64),
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

    /// Summary of subtree `i` (all zero for an empty one).
    #[inline]
    fn sum(&self, i: u32) -> Sum {
        if i == NIL {
            Sum::default()
        } else {
            self.n(i).sum()
        }
    }

    #[inline]
    fn height(&self, i: u32) -> u8 {
        self.sum(i).height
    }

    /// Largest room at active order `k` in subtree `i` (0 for an empty subtree).
    #[inline]
    fn room(&self, i: u32, k: usize) -> u64 {
        if i == NIL {
            0
        } else {
            self.room[i as usize * self.orders + k]
        }
    }

    /// Whether some gap in the subtree `child` with summary `sum` holds the request (exact;
    /// see the module docs). Only the `Room` kind reads outside the summary.
    #[inline]
    fn holds(&self, sum: &Sum, child: u32, q: &Query) -> bool {
        match q.kind {
            Kind::Gap => sum.max_gap >= q.s,
            Kind::Block => usize::from(sum.block) > q.k,
            Kind::Room => self.room(child, q.k) >= q.s,
        }
    }

    /// Whether `n`'s subtree on `side` holds the request.
    #[inline]
    fn child_holds(&self, n: &Node, side: usize, q: &Query) -> bool {
        let c = if side == L { n.left } else { n.right };
        self.holds(&n.sub[side], c, q)
    }

    /// A new leaf.
    fn new_node(&mut self, lo: u64, gap: u64) -> u32 {
        let node = Node {
            lo,
            gap,
            left: NIL,
            right: NIL,
            sub: [Sum::default(); 2],
        };
        let i = match self.free.pop() {
            Some(i) => {
                self.nodes[i as usize] = node;
                i
            }
            None => {
                self.nodes.push(node);
                if !self.room.is_empty() {
                    self.room.resize(self.room.len() + self.orders, 0);
                }
                (self.nodes.len() - 1) as u32
            }
        };
        self.update_rooms(i);
        i
    }

    /// Links `child` as `parent`'s child on `side`, with its summary.
    #[inline]
    fn set_child(&mut self, parent: u32, side: usize, child: u32) {
        let sum = self.sum(child);
        let p = self.nm(parent);
        if side == L {
            p.left = child;
        } else {
            p.right = child;
        }
        p.sub[side] = sum;
    }

    /// Makes `new` take `old`'s place as the child of `parent` (the root if `NIL`).
    #[inline]
    fn relink(&mut self, parent: u32, old: u32, new: u32) {
        if parent == NIL {
            self.root = new;
        } else {
            let side = if self.n(parent).left == old { L } else { R };
            self.set_child(parent, side, new);
        }
    }

    /// Recomputes the room (at the active orders) of `i` from its own gap and its children;
    /// returns whether any changed. Nothing to do, and false, while no order is active.
    #[inline]
    fn update_rooms(&mut self, i: u32) -> bool {
        if self.active == 0 {
            return false;
        }
        self.update_rooms_active(i)
    }

    #[inline(never)]
    fn update_rooms_active(&mut self, i: u32) -> bool {
        let mut bits = self.active;
        let n = *self.n(i);
        let gl = n.lo - n.gap;
        let o = self.orders;
        let (base, lb, rb) = (i as usize * o, n.left as usize * o, n.right as usize * o);
        let mut changed = false;
        while bits != 0 {
            let k = bits.trailing_zeros() as usize;
            bits &= bits - 1;
            let mut r = room_of(gl, n.lo, k);
            if n.left != NIL {
                r = r.max(self.room[lb + k]);
            }
            if n.right != NIL {
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
            let own = room_of(n.lo - n.gap, n.lo, k);
            let r = own.max(fill(t, n.left, k, w)).max(fill(t, n.right, k, w));
            t.room[i as usize * t.orders + k] = r;
            r
        }
        if self.room.is_empty() {
            self.room = vec![0; self.nodes.len() * self.orders];
        }
        fill(self, self.root, k, w);
        self.active |= 1 << k;
    }

    fn rotate_right(&mut self, i: u32, w: &mut WorkRecord) -> u32 {
        w.tree_rotations += 1;
        let l = self.n(i).left;
        let lr = self.n(l).right;
        self.set_child(i, L, lr);
        self.update_rooms(i);
        self.set_child(l, R, i);
        self.update_rooms(l);
        l
    }

    fn rotate_left(&mut self, i: u32, w: &mut WorkRecord) -> u32 {
        w.tree_rotations += 1;
        let r = self.n(i).right;
        let rl = self.n(r).left;
        self.set_child(i, R, rl);
        self.update_rooms(i);
        self.set_child(r, L, i);
        self.update_rooms(r);
        r
    }

    /// Restores the AVL balance at `i` (whose children's summaries are up to date) and
    /// recomputes its room. Returns the subtree's new root and whether it was rotated or
    /// its room changed.
    #[inline(never)]
    fn rebalance(&mut self, i: u32, w: &mut WorkRecord) -> (u32, bool) {
        let changed = self.update_rooms(i);
        let n = *self.n(i);
        let (hl, hr) = (n.sub[L].height, n.sub[R].height);
        if hl > hr + 1 {
            let l = self.n(n.left);
            if l.sub[L].height < l.sub[R].height {
                let nl = self.rotate_left(n.left, w);
                self.set_child(i, L, nl);
            }
            return (self.rotate_right(i, w), true);
        }
        if hr > hl + 1 {
            let r = self.n(n.right);
            if r.sub[R].height < r.sub[L].height {
                let nr = self.rotate_right(n.right, w);
                self.set_child(i, R, nr);
            }
            return (self.rotate_left(i, w), true);
        }
        (i, changed)
    }

    /// After a structural change just below the last node of `self.path` (or to it), walks
    /// the path up: rebalances each node and stores its subtree's summary in its parent,
    /// and stops once a subtree comes out unchanged, unless the node at `touched` (whose own
    /// gap changed) is still ahead, in which case it skips to it.
    fn retrace(&mut self, touched: usize, w: &mut WorkRecord) {
        let mut dirty = true;
        let mut d = self.path.len();
        while d > 0 {
            d -= 1;
            if !dirty && d != touched {
                if touched < d {
                    d = touched;
                } else {
                    break;
                }
            }
            let i = self.path[d];
            let n = *self.n(i);
            // The common case, kept inline: balanced, and no room to maintain.
            let (root, sum, rotated) =
                if n.sub[L].height.abs_diff(n.sub[R].height) <= 1 && self.active == 0 {
                    (i, n.sum(), false)
                } else {
                    let (root, rotated) = self.rebalance(i, w);
                    (root, self.n(root).sum(), rotated)
                };
            if d == 0 {
                self.root = root;
                break;
            }
            let pn = self.nm(self.path[d - 1]);
            let side = if pn.left == i { L } else { R };
            dirty = rotated || pn.sub[side] != sum;
            pn.sub[side] = sum;
            if side == L {
                pn.left = root;
            } else {
                pn.right = root;
            }
        }
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

    /// The highest fit among gaps below `limit` (a straddling gap is clipped at it). Returns
    /// the placement; `self.path` then runs from the root to the node whose gap holds it.
    fn search(&mut self, limit: u64, q: &Query, w: &mut WorkRecord) -> Option<u64> {
        let (s, k) = (q.s, q.k);
        self.path.clear();
        if limit >= self.end {
            // No limit below the anchor: every gap is eligible whole, so the summaries
            // apply to the whole tree and the walk to the limit can be skipped.
            let root = self.root;
            return self
                .holds(&self.sum(root), root, q)
                .then(|| self.descend(root, q, w));
        }
        // Walk towards the limit.
        let mut i = self.root;
        while i != NIL {
            w.tree_nodes_visited += 1;
            self.path.push(i);
            let n = *self.n(i);
            if n.lo >= limit {
                // Everything to the right starts above the limit, everything still to come
                // on the walk lies below this gap.
                if let Some(a) = Self::fit(n.lo - n.gap, limit, s, k) {
                    return Some(a);
                }
                i = n.left;
            } else {
                i = n.right;
            }
        }
        // Back up: nodes below the limit offer their own gap, then their left subtree.
        for d in (0..self.path.len()).rev() {
            let n = *self.n(self.path[d]);
            if n.lo >= limit {
                continue;
            }
            if let Some(a) = Self::fit(n.lo - n.gap, n.lo, s, k) {
                self.path.truncate(d + 1);
                return Some(a);
            }
            if self.child_holds(&n, L, q) {
                self.path.truncate(d + 1);
                return Some(self.descend(n.left, q, w));
            }
        }
        None
    }

    /// The highest fit in subtree `i`, which is known to hold one; extends `self.path` down
    /// to the node whose gap holds it.
    fn descend(&mut self, mut i: u32, q: &Query, w: &mut WorkRecord) -> u64 {
        loop {
            w.tree_nodes_visited += 1;
            self.path.push(i);
            let n = *self.n(i);
            if self.child_holds(&n, R, q) {
                i = n.right;
                continue;
            }
            if let Some(a) = Self::fit(n.lo - n.gap, n.lo, q.s, q.k) {
                return a;
            }
            // The summary says the fit is in the left subtree.
            debug_assert!(self.child_holds(&n, L, q));
            i = n.left;
        }
    }

    /// Places `s` pages at `a` in the gap of the node at the end of `self.path`.
    fn insert_below_holder(&mut self, a: u64, s: u64, w: &mut WorkRecord) {
        let touched = self.path.len() - 1;
        let holder = self.path[touched];
        let h = *self.n(holder);
        let gl = h.lo - h.gap;
        self.nm(holder).gap = h.lo - (a + s);
        let x = self.new_node(a, a - gl);
        // The new range is the holder's in-order predecessor.
        if h.left == NIL {
            self.set_child(holder, L, x);
        } else {
            let mut c = h.left;
            loop {
                w.tree_nodes_visited += 1;
                self.path.push(c);
                let r = self.n(c).right;
                if r == NIL {
                    break;
                }
                c = r;
            }
            self.set_child(c, R, x);
        }
        self.retrace(touched, w);
        self.len += 1;
    }

    /// Removes the exact range `lo..=hi`; false (and no change) if it is not allocated so.
    fn remove(&mut self, lo: u64, hi: u64, w: &mut WorkRecord) -> bool {
        self.path.clear();
        // Walk to the range, remembering the last node where the walk went left: the
        // successor if the range has no right subtree.
        let mut succ_d = NO_TOUCH;
        let mut i = self.root;
        loop {
            if i == NIL {
                return false;
            }
            w.tree_nodes_visited += 1;
            self.path.push(i);
            let n = self.n(i);
            if lo < n.lo {
                succ_d = self.path.len() - 1;
                i = n.left;
            } else if lo > n.lo {
                i = n.right;
            } else {
                break;
            }
        }
        let xd = self.path.len() - 1;
        let x = *self.n(i);
        let xi = i;
        if x.right != NIL {
            let mut c = x.right;
            loop {
                w.tree_nodes_visited += 1;
                self.path.push(c);
                let l = self.n(c).left;
                if l == NIL {
                    break;
                }
                c = l;
            }
            succ_d = self.path.len() - 1;
        }
        // The anchor has no successor; a real range always has one (at worst the anchor).
        if succ_d == NO_TOUCH {
            return false;
        }
        let succ = self.path[succ_d];
        let sn = *self.n(succ);
        if sn.lo - sn.gap - 1 != hi {
            return false;
        }
        // The successor's gap absorbs the freed range and the gap below it.
        let merged = sn.lo - (x.lo - x.gap);
        let touched;
        if x.left != NIL && x.right != NIL {
            // The successor (the minimum of the right subtree, at the end of the path) moves
            // into the range's node, taking its merged gap along.
            self.path.pop();
            let parent = self.path[self.path.len() - 1];
            self.relink(parent, succ, sn.right);
            let m = self.nm(xi);
            m.lo = sn.lo;
            m.gap = merged;
            self.free.push(succ);
            touched = xd;
        } else {
            let child = if x.left == NIL { x.right } else { x.left };
            let parent = if xd == 0 { NIL } else { self.path[xd - 1] };
            self.relink(parent, xi, child);
            self.path.remove(xd);
            self.free.push(xi);
            self.nm(succ).gap = merged;
            // The successor is either an ancestor, or below the removed node.
            touched = if succ_d > xd { succ_d - 1 } else { succ_d };
        }
        self.retrace(touched, w);
        self.len -= 1;
        true
    }

    /// In-order ranges `(lo, hi, gap)`.
    fn in_order(&self) -> Vec<(u64, u64, u64)> {
        let mut out: Vec<(u64, u64, u64)> = Vec::with_capacity(self.len);
        let mut stack = Vec::new();
        let mut i = self.root;
        while i != NIL || !stack.is_empty() {
            while i != NIL {
                stack.push(i);
                i = self.n(i).left;
            }
            if let Some(top) = stack.pop() {
                let n = self.n(top);
                if let Some(prev) = out.last_mut() {
                    prev.1 = n.lo - n.gap - 1;
                }
                out.push((n.lo, n.lo, n.gap));
                i = n.right;
            }
        }
        out
    }

    /// Checks AVL balance and the summaries of subtree `i`; returns its summary.
    #[cfg(test)]
    fn check(&self, i: u32) -> Sum {
        if i == NIL {
            return Sum::default();
        }
        let n = *self.n(i);
        let sl = self.check(n.left);
        let sr = self.check(n.right);
        assert_eq!(n.sub, [sl, sr], "stored child summaries");
        assert!(sl.height.abs_diff(sr.height) <= 1, "AVL balance");
        let gl = n.lo - n.gap;
        // The block summary, against a brute-force scan of the orders.
        let own_block = (0..64)
            .filter(|&j| room_of(gl, n.lo, j) >= 1 << j)
            .map(|j| j as u8 + 1)
            .max()
            .unwrap_or(0);
        assert_eq!(block_of(gl, n.lo), own_block, "block of [{gl}, {})", n.lo);
        let want = Sum {
            max_gap: n.gap.max(sl.max_gap).max(sr.max_gap),
            height: 1 + sl.height.max(sr.height),
            block: own_block.max(sl.block).max(sr.block),
        };
        assert_eq!(n.sum(), want, "summary");
        for k in (0..self.orders).filter(|k| self.active & (1 << k) != 0) {
            let want = room_of(gl, n.lo, k)
                .max(self.room(n.left, k))
                .max(self.room(n.right, k));
            assert_eq!(self.room(i, k), want, "room at order {k}");
        }
        want
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
        let mut tree = Tree::new(orders, end_pfn);
        let anchor = tree.new_node(end_pfn, end_pfn - start_pfn);
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

    /// Checks every tree invariant (ordering, gaps, balance, summaries). For tests.
    #[cfg(test)]
    fn check(&self) {
        let st = self.state.lock();
        st.tree.check(st.tree.root);
        let mut prev_end = self.start_pfn;
        let all = st.tree.in_order();
        assert_eq!(all.len(), st.tree.len);
        assert_eq!(all.last().map(|r| r.0), Some(self.end_pfn), "anchor");
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
        let kind = if k == 0 {
            Kind::Gap
        } else if s.is_power_of_two() {
            Kind::Block
        } else {
            Kind::Room
        };
        let q = Query { s, k, kind };
        work.lock(LockId::IovaTree);
        let mut st = self.state.lock();
        let t = &mut st.tree;
        let found = if k < t.orders && t.len - 1 < self.max_live {
            if kind == Kind::Room && t.active & (1 << k) == 0 {
                t.activate(k, work);
            }
            t.search(limit, &q, work)
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
        t.insert_below_holder(a, s, work);
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
        if st.tree.remove(lo, hi, work) {
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
        let (start, end) = (self.start_pfn, self.end_pfn);
        free_tree_blocks(blocks, self.granule, start, end, |lo, hi| {
            st.tree.remove(lo, hi, work)
        })
    }

    fn live_blocks(&self) -> usize {
        self.state.lock().tree.len - 1
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
