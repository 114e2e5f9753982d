//! The gap tree's index of free holes: a B+-tree in an arena, with a summary per entry.
//!
//! Leaves hold holes `[lo, hi)` in address order, up to [`B`] per node; an internal node
//! holds up to [`B`] children, each entry with the lowest hole start and highest hole end in
//! that child's subtree and the child's summaries (largest hole, largest aligned block, room
//! at every active order). A leaf entry carries the same summaries of its own hole, so the
//! search asks the same exact question of every entry (see the parent module's docs). Every
//! node but the root holds at least [`MIN`] entries and all leaves are at the same depth, so
//! the height is O(log holes) with a base of 8 to 16.
//!
//! Why a B-tree rather than the AVL tree it replaced: under random churn an operation walked
//! 15-30 binary nodes, each a dependent load of a 40-byte node scattered over the arena, and
//! retraced several of them (recomputing every summary from two children's). Here a walk is
//! 3-4 nodes whose entries sit in a few consecutive cache lines, and the summaries a search
//! reads are in the parent's arrays, not in the children.

use super::{block_of, fit, room_of, Kind, Query};
use crate::work::WorkRecord;

/// Most entries per node.
pub(super) const B: usize = 16;
/// Fewest entries per node, but the root.
const MIN: usize = B / 2;
/// No node.
const NIL: u32 = u32::MAX;

/// One node: a leaf's entries are holes, an internal node's are children. Aligned to a cache
/// line, so that each array starts on one: a binary search of `lo` reads two lines.
#[derive(Clone, Debug)]
#[repr(align(64))]
struct Node {
    /// Entries in use.
    n: usize,
    /// Height above the leaves (0: a leaf).
    level: u8,
    /// Leaf: each hole's first page. Internal: the lowest hole start in each child.
    /// `u64::MAX` past `n`, so a binary search of the whole array counts the entries below
    /// a page.
    lo: [u64; B],
    /// Leaf: each hole's end. Internal: the highest hole end in each child.
    hi: [u64; B],
    /// The largest hole in each entry (a leaf entry: its own length); 0 past `n`.
    max_len: [u64; B],
    /// 1 + the largest order of aligned block in each entry (see `block_of`); 0 past `n`.
    block: [u8; B],
    /// Internal: the children.
    child: [u32; B],
}

impl Node {
    fn new(level: u8) -> Self {
        Node {
            n: 0,
            level,
            lo: [u64::MAX; B],
            hi: [0; B],
            max_len: [0; B],
            block: [0; B],
            child: [NIL; B],
        }
    }
}

/// What goes into an entry.
#[derive(Clone, Copy, Debug)]
enum Entry {
    Hole(u64, u64),
    Child(u32),
}

/// The B+-tree of holes, with the frontier kept beside it.
#[derive(Debug)]
pub(super) struct HoleTree {
    nodes: Vec<Node>,
    /// Arena slots free for reuse.
    spare: Vec<u32>,
    root: u32,
    /// Number of holes in the tree (not counting the frontier).
    pub(super) len: usize,
    /// Number of alignment orders a request can have (`room` stride).
    pub(super) orders: usize,
    /// Orders whose room is maintained (bit `k`): the non-power-of-two aligned requests
    /// seen so far.
    pub(super) active: u64,
    /// `room[(node * B + entry) * orders + k]`: the largest room at order `k` in the entry,
    /// for the active orders. Empty until the first order is activated.
    room: Vec<u64>,
    /// The path of the operation in progress, root first: `(node, entry)`.
    path: Vec<(u32, usize)>,
    /// The frontier: one hole kept out of the tree (see the parent module), `[lo, hi)`.
    pub(super) frontier: Option<(u64, u64)>,
}

impl HoleTree {
    pub(super) fn new(orders: usize) -> Self {
        Self {
            nodes: Vec::new(),
            spare: Vec::new(),
            root: NIL,
            len: 0,
            orders,
            active: 0,
            room: Vec::new(),
            path: Vec::with_capacity(16),
            frontier: None,
        }
    }

    /// Height of the tree (0: empty, 1: a lone leaf).
    pub(super) fn height(&self) -> usize {
        if self.root == NIL {
            0
        } else {
            usize::from(self.nodes[self.root as usize].level) + 1
        }
    }

    #[inline]
    fn node(&self, x: u32) -> &Node {
        &self.nodes[x as usize]
    }

    #[inline]
    fn node_mut(&mut self, x: u32) -> &mut Node {
        &mut self.nodes[x as usize]
    }

    #[inline]
    fn room_at(&self, x: u32, e: usize, k: usize) -> u64 {
        self.room[(x as usize * B + e) * self.orders + k]
    }

    fn new_node(&mut self, level: u8) -> u32 {
        match self.spare.pop() {
            Some(x) => {
                self.nodes[x as usize] = Node::new(level);
                x
            }
            None => {
                self.nodes.push(Node::new(level));
                if self.active != 0 {
                    self.room.resize(self.room.len() + B * self.orders, 0);
                }
                (self.nodes.len() - 1) as u32
            }
        }
    }

    fn release(&mut self, x: u32) {
        self.spare.push(x);
    }

    /// Whether entry `e` of node `x` holds the request (exact; see the parent module).
    #[inline]
    fn holds(&self, x: u32, e: usize, q: &Query) -> bool {
        let node = self.node(x);
        match q.kind {
            Kind::Len => node.max_len[e] >= q.s,
            Kind::Block => usize::from(node.block[e]) > q.k,
            Kind::Room => self.room_at(x, e, q.k) >= q.s,
        }
    }

    /// Writes entry `e` of node `x`; returns whether any of its fields changed.
    fn set(&mut self, x: u32, e: usize, entry: Entry) -> bool {
        let (lo, hi, max_len, block, child) = match entry {
            Entry::Hole(lo, hi) => (lo, hi, hi - lo, block_of(lo, hi), NIL),
            Entry::Child(c) => {
                // Entries past `n` are zero (see `close`), so all `B` are taken, which
                // compiles to fixed, unrolled code.
                let cn = self.node(c);
                let n = cn.n;
                let max_len = cn.max_len.iter().fold(0, |m, &v| m.max(v));
                let block = cn.block.iter().fold(0, |m, &v| m.max(v));
                (cn.lo[0], cn.hi[n - 1], max_len, block, c)
            }
        };
        let node = self.node_mut(x);
        let changed = node.lo[e] != lo
            || node.hi[e] != hi
            || node.max_len[e] != max_len
            || node.block[e] != block
            || node.child[e] != child;
        node.lo[e] = lo;
        node.hi[e] = hi;
        node.max_len[e] = max_len;
        node.block[e] = block;
        node.child[e] = child;
        if self.active != 0 {
            changed | self.set_rooms(x, e, entry)
        } else {
            changed
        }
    }

    /// Recomputes the rooms (at the active orders) of entry `e` of node `x`.
    #[inline(never)]
    fn set_rooms(&mut self, x: u32, e: usize, entry: Entry) -> bool {
        let o = self.orders;
        let base = (x as usize * B + e) * o;
        let mut bits = self.active;
        let mut changed = false;
        while bits != 0 {
            let k = bits.trailing_zeros() as usize;
            bits &= bits - 1;
            let r = match entry {
                Entry::Hole(lo, hi) => room_of(lo, hi, k),
                Entry::Child(c) => (0..self.node(c).n)
                    .map(|i| self.room_at(c, i, k))
                    .max()
                    .unwrap_or(0),
            };
            changed |= self.room[base + k] != r;
            self.room[base + k] = r;
        }
        changed
    }

    /// Moves `count` entries of node `from` starting at `at` to node `to` starting at
    /// `to_at` (whose entries there are overwritten; counts are the caller's).
    fn copy_entries(&mut self, from: u32, at: usize, to: u32, to_at: usize, count: usize) {
        if count == 0 {
            return;
        }
        let src = self.node(from).clone();
        let dst = self.node_mut(to);
        dst.lo[to_at..to_at + count].copy_from_slice(&src.lo[at..at + count]);
        dst.hi[to_at..to_at + count].copy_from_slice(&src.hi[at..at + count]);
        dst.max_len[to_at..to_at + count].copy_from_slice(&src.max_len[at..at + count]);
        dst.block[to_at..to_at + count].copy_from_slice(&src.block[at..at + count]);
        dst.child[to_at..to_at + count].copy_from_slice(&src.child[at..at + count]);
        if self.active != 0 {
            let o = self.orders;
            let s = (from as usize * B + at) * o;
            let d = (to as usize * B + to_at) * o;
            self.room.copy_within(s..s + count * o, d);
        }
    }

    /// Drops the entries of node `x` from `n` on.
    fn truncate(&mut self, x: u32, n: usize) {
        let node = self.node_mut(x);
        node.lo[n..].fill(u64::MAX);
        node.max_len[n..].fill(0);
        node.block[n..].fill(0);
        node.n = n;
    }

    /// Opens a gap at entry `e` of node `x` (which has room): entries from `e` move up one.
    fn open(&mut self, x: u32, e: usize) {
        let node = self.node_mut(x);
        let n = node.n;
        // A loop rather than five `copy_within` calls: a few entries move.
        for i in (e..n).rev() {
            node.lo[i + 1] = node.lo[i];
            node.hi[i + 1] = node.hi[i];
            node.max_len[i + 1] = node.max_len[i];
            node.block[i + 1] = node.block[i];
            node.child[i + 1] = node.child[i];
        }
        node.n += 1;
        if self.active != 0 {
            let o = self.orders;
            let base = x as usize * B * o;
            self.room
                .copy_within(base + e * o..base + n * o, base + (e + 1) * o);
        }
    }

    /// Removes entry `e` of node `x`: entries above it move down one.
    fn close(&mut self, x: u32, e: usize) {
        let node = self.node_mut(x);
        let n = node.n;
        for i in e + 1..n {
            node.lo[i - 1] = node.lo[i];
            node.hi[i - 1] = node.hi[i];
            node.max_len[i - 1] = node.max_len[i];
            node.block[i - 1] = node.block[i];
            node.child[i - 1] = node.child[i];
        }
        node.n -= 1;
        node.lo[n - 1] = u64::MAX;
        node.max_len[n - 1] = 0;
        node.block[n - 1] = 0;
        if self.active != 0 {
            let o = self.orders;
            let base = x as usize * B * o;
            self.room
                .copy_within(base + (e + 1) * o..base + n * o, base + e * o);
        }
    }

    /// After node `self.path[d].0` changed: refreshes its entry in each ancestor, upwards,
    /// until one comes out unchanged.
    fn fix_up(&mut self, d: usize) {
        for dd in (0..d).rev() {
            let (p, pe) = self.path[dd];
            let c = self.path[dd + 1].0;
            if !self.set(p, pe, Entry::Child(c)) {
                break;
            }
        }
    }

    /// Inserts `entry` at position `pos` of node `self.path[d].0`, splitting it (and its
    /// ancestors) when full.
    fn insert_at(&mut self, d: usize, pos: usize, entry: Entry, w: &mut WorkRecord) {
        let x = self.path[d].0;
        if self.node(x).n < B {
            self.open(x, pos);
            self.set(x, pos, entry);
            self.fix_up(d);
            return;
        }
        // Split: the upper half moves to a new right sibling.
        w.tree_rotations += 1;
        let level = self.node(x).level;
        let y = self.new_node(level);
        self.copy_entries(x, MIN, y, 0, B - MIN);
        self.truncate(x, MIN);
        self.node_mut(y).n = B - MIN;
        let (t, tp) = if pos <= MIN { (x, pos) } else { (y, pos - MIN) };
        self.open(t, tp);
        self.set(t, tp, entry);
        if d == 0 {
            let r = self.new_node(level + 1);
            self.node_mut(r).n = 2;
            self.set(r, 0, Entry::Child(x));
            self.set(r, 1, Entry::Child(y));
            self.root = r;
        } else {
            let (p, pe) = self.path[d - 1];
            self.set(p, pe, Entry::Child(x));
            self.insert_at(d - 1, pe + 1, Entry::Child(y), w);
        }
    }

    /// Removes entry `pos` of node `self.path[d].0`, borrowing from or merging with a
    /// sibling when the node falls below [`MIN`] entries.
    fn delete_at(&mut self, d: usize, pos: usize, w: &mut WorkRecord) {
        let x = self.path[d].0;
        self.close(x, pos);
        let n = self.node(x).n;
        if d == 0 {
            if n == 0 {
                self.release(x);
                self.root = NIL;
            } else if n == 1 && self.node(x).level > 0 {
                self.root = self.node(x).child[0];
                self.release(x);
            }
            return;
        }
        if n >= MIN {
            self.fix_up(d);
            return;
        }
        let (p, pe) = self.path[d - 1];
        // A non-root node's parent has at least two entries.
        let le = if pe > 0 { pe - 1 } else { pe };
        let (left, right) = (self.node(p).child[le], self.node(p).child[le + 1]);
        w.tree_nodes_visited += 1;
        w.tree_rotations += 1;
        let (nl, nr) = (self.node(left).n, self.node(right).n);
        if nl + nr <= B {
            self.copy_entries(right, 0, left, nl, nr);
            self.node_mut(left).n = nl + nr;
            self.release(right);
            self.set(p, le, Entry::Child(left));
            self.delete_at(d - 1, le + 1, w);
        } else {
            if x == right {
                // The left sibling's last entry moves to the front of `x`.
                self.open(right, 0);
                self.copy_entries(left, nl - 1, right, 0, 1);
                self.truncate(left, nl - 1);
            } else {
                // The right sibling's first entry moves to the end of `x`.
                self.copy_entries(right, 0, left, nl, 1);
                self.node_mut(left).n = nl + 1;
                self.close(right, 0);
            }
            self.set(p, le, Entry::Child(left));
            self.set(p, le + 1, Entry::Child(right));
            self.fix_up(d - 1);
        }
    }

    /// Starts maintaining the room at order `k`: computes it for every entry (post-order).
    pub(super) fn activate(&mut self, k: usize, w: &mut WorkRecord) {
        fn fill(t: &mut HoleTree, x: u32, k: usize, w: &mut WorkRecord) -> u64 {
            w.tree_nodes_visited += 1;
            let node = t.node(x).clone();
            let mut best = 0;
            for e in 0..node.n {
                let r = if node.level == 0 {
                    room_of(node.lo[e], node.hi[e], k)
                } else {
                    fill(t, node.child[e], k, w)
                };
                t.room[(x as usize * B + e) * t.orders + k] = r;
                best = best.max(r);
            }
            best
        }
        if self.room.is_empty() {
            self.room = vec![0; self.nodes.len() * B * self.orders];
        }
        if self.root != NIL {
            fill(self, self.root, k, w);
        }
        self.active |= 1 << k;
    }

    /// Allocates: finds the highest fit below `limit` in the tree ([`Self::search`]) and in
    /// the frontier, and cuts it out of its hole. Returns the placement, or `None`.
    #[inline]
    pub(super) fn alloc(&mut self, limit: u64, q: &Query, w: &mut WorkRecord) -> Option<u64> {
        let outside = match self.frontier {
            Some((lo, hi)) => {
                w.tree_nodes_visited += 1;
                fit(lo, hi.min(limit), q.s, q.k)
            }
            None => None,
        };
        if let Some(a) = self.search(limit, q, w) {
            // Holes are disjoint, so the two placements differ.
            if outside.map_or(true, |f| a > f) {
                self.take(a, q.s, w);
                return Some(a);
            }
        }
        let a = outside?;
        self.take_frontier(a, q.s, w);
        Some(a)
    }

    /// The highest fit among the tree's holes below `limit` (a straddling hole is clipped
    /// at it). `self.path` then runs from the root to the holder's entry.
    fn search(&mut self, limit: u64, q: &Query, w: &mut WorkRecord) -> Option<u64> {
        self.path.clear();
        if self.root == NIL {
            return None;
        }
        self.search_in(self.root, limit, q, w)
    }

    fn search_in(&mut self, x: u32, limit: u64, q: &Query, w: &mut WorkRecord) -> Option<u64> {
        w.tree_nodes_visited += 1;
        let depth = self.path.len();
        let node = self.node(x);
        let leaf = node.level == 0;
        let mut e = node.lo.partition_point(|&l| l < limit);
        while e > 0 {
            e -= 1;
            let node = self.node(x);
            let (lo, hi) = (node.lo[e], node.hi[e]);
            if leaf {
                if let Some(a) = fit(lo, hi.min(limit), q.s, q.k) {
                    self.path.push((x, e));
                    return Some(a);
                }
            } else if hi <= limit {
                // Entirely below the limit: the summary is exact.
                if self.holds(x, e, q) {
                    let c = node.child[e];
                    self.path.push((x, e));
                    return Some(self.descend(c, q, w));
                }
            } else {
                // The one child that straddles the limit.
                let c = node.child[e];
                self.path.push((x, e));
                if let Some(a) = self.search_in(c, limit, q, w) {
                    return Some(a);
                }
                self.path.truncate(depth);
            }
        }
        None
    }

    /// The highest fit in subtree `x`, which is known to hold one; extends `self.path`.
    fn descend(&mut self, mut x: u32, q: &Query, w: &mut WorkRecord) -> u64 {
        loop {
            w.tree_nodes_visited += 1;
            let mut e = self.node(x).n;
            loop {
                // The summary promised a fit, so some entry holds it.
                e -= 1;
                if self.holds(x, e, q) || e == 0 {
                    break;
                }
            }
            self.path.push((x, e));
            let node = self.node(x);
            if node.level == 0 {
                let a = fit(node.lo[e], node.hi[e], q.s, q.k);
                debug_assert!(a.is_some(), "the summary promised a fit");
                return a.unwrap_or(node.lo[e]);
            }
            x = node.child[e];
        }
    }

    /// Cuts `s` pages at `a` out of the hole at the end of `self.path`.
    fn take(&mut self, a: u64, s: u64, w: &mut WorkRecord) {
        let d = self.path.len() - 1;
        let (leaf, e) = self.path[d];
        let (lo, hi) = (self.node(leaf).lo[e], self.node(leaf).hi[e]);
        let end = a + s;
        match (a > lo, end < hi) {
            (false, false) => {
                self.len -= 1;
                self.delete_at(d, e, w);
            }
            (true, false) => {
                self.set(leaf, e, Entry::Hole(lo, a));
                self.fix_up(d);
            }
            (false, true) => {
                self.set(leaf, e, Entry::Hole(end, hi));
                self.fix_up(d);
            }
            (true, true) => {
                self.set(leaf, e, Entry::Hole(lo, a));
                self.len += 1;
                self.insert_at(d, e + 1, Entry::Hole(end, hi), w);
            }
        }
    }

    /// Cuts `s` pages at `a` out of the frontier. Of the parts left below and above, the
    /// larger stays the frontier and the other becomes a hole in the tree.
    fn take_frontier(&mut self, a: u64, s: u64, w: &mut WorkRecord) {
        let Some((lo, hi)) = self.frontier else {
            return;
        };
        let end = a + s;
        self.frontier = match (a > lo, end < hi) {
            (false, false) => None,
            (true, false) => Some((lo, a)),
            (false, true) => Some((end, hi)),
            (true, true) => {
                if a - lo >= hi - end {
                    self.insert_hole(end, hi, w);
                    Some((lo, a))
                } else {
                    self.insert_hole(lo, a, w);
                    Some((end, hi))
                }
            }
        };
    }

    /// Walks down to the leaf where a hole starting at `lo` belongs; `self.path` ends with
    /// `(leaf, number of its holes starting below lo)`.
    fn locate(&mut self, lo: u64, w: &mut WorkRecord) {
        self.path.clear();
        let mut x = self.root;
        loop {
            w.tree_nodes_visited += 1;
            let node = self.node(x);
            let below = node.lo.partition_point(|&l| l < lo);
            if node.level == 0 {
                self.path.push((x, below));
                return;
            }
            // The last child starting below `lo` (the first if none does).
            let e = below.saturating_sub(1);
            let c = node.child[e];
            self.path.push((x, e));
            x = c;
        }
    }

    /// Links the hole `[lo, hi)`, which touches no hole, into the tree.
    fn insert_hole(&mut self, lo: u64, hi: u64, w: &mut WorkRecord) {
        self.len += 1;
        if self.root == NIL {
            let x = self.new_node(0);
            self.node_mut(x).n = 1;
            self.set(x, 0, Entry::Hole(lo, hi));
            self.root = x;
            return;
        }
        self.locate(lo, w);
        let d = self.path.len() - 1;
        let p = self.path[d].1;
        self.insert_at(d, p, Entry::Hole(lo, hi), w);
    }

    /// Returns the free range `[lo, end)` (known to be allocated) to the holes.
    pub(super) fn free_range(&mut self, lo: u64, end: u64, w: &mut WorkRecord) {
        let (f_below, f_above) = match self.frontier {
            Some((flo, fhi)) => (fhi == lo, flo == end),
            None => (false, false),
        };
        if self.root == NIL {
            // No hole in the tree: the range extends the frontier, becomes it, or (when it
            // does not touch the frontier) the tree's only hole.
            match self.frontier {
                Some((flo, fhi)) if f_below || f_above => {
                    w.tree_nodes_visited += 1;
                    self.frontier = Some((flo.min(lo), fhi.max(end)));
                }
                None => self.frontier = Some((lo, end)),
                Some(_) => self.insert_hole(lo, end, w),
            }
            return;
        }
        // The hole just below the range is in the leaf the walk reaches; the one just above
        // is there too unless the range falls after the leaf's last hole.
        self.locate(lo, w);
        let d = self.path.len() - 1;
        let (leaf, p) = self.path[d];
        let node = self.node(leaf);
        let pred = (p > 0 && node.hi[p - 1] == lo).then(|| (node.lo[p - 1], p - 1));
        let succ = if p < node.n {
            (node.lo[p] == end).then_some(node.hi[p])
        } else if f_above {
            // The hole above is the frontier.
            None
        } else {
            self.hole_at(end, w)
        };
        if let Some((flo, fhi)) = self.frontier.filter(|_| f_below || f_above) {
            // The frontier takes the range, and the tree hole on its other side if any.
            w.tree_nodes_visited += 1;
            let (mut new_lo, mut new_hi) = (flo.min(lo), fhi.max(end));
            if f_below {
                if let Some(shi) = succ {
                    new_hi = shi;
                    self.delete_hole(end, w);
                }
            } else if let Some((plo, pe)) = pred {
                new_lo = plo;
                self.len -= 1;
                self.delete_at(d, pe, w);
            }
            self.frontier = Some((new_lo, new_hi));
            return;
        }
        match (pred, succ) {
            (Some((plo, pe)), Some(shi)) => {
                if p < self.node(leaf).n {
                    // Both in this leaf: the lower takes the merged extent.
                    self.set(leaf, pe, Entry::Hole(plo, shi));
                    self.len -= 1;
                    self.delete_at(d, p, w);
                } else {
                    self.delete_hole(end, w);
                    self.locate(lo, w);
                    let d = self.path.len() - 1;
                    let (leaf, p) = self.path[d];
                    self.set(leaf, p - 1, Entry::Hole(plo, shi));
                    self.fix_up(d);
                }
            }
            (Some((plo, pe)), None) => {
                self.set(leaf, pe, Entry::Hole(plo, end));
                self.fix_up(d);
            }
            (None, Some(shi)) => {
                let (d, leaf, e) = if p < self.node(leaf).n {
                    (d, leaf, p)
                } else {
                    // The walk for `end + 1` ends just past the hole starting at `end`.
                    self.locate(end + 1, w);
                    let d = self.path.len() - 1;
                    let (leaf, e) = self.path[d];
                    (d, leaf, e - 1)
                };
                self.set(leaf, e, Entry::Hole(lo, shi));
                self.fix_up(d);
            }
            (None, None) => {
                self.len += 1;
                self.insert_at(d, p, Entry::Hole(lo, end), w);
            }
        }
    }

    /// The end of the tree hole starting at `at`, if there is one (a walk of its own; the
    /// path is kept).
    fn hole_at(&self, at: u64, w: &mut WorkRecord) -> Option<u64> {
        let mut x = self.root;
        loop {
            w.tree_nodes_visited += 1;
            let node = self.node(x);
            let e = node.lo.partition_point(|&l| l <= at);
            if node.level == 0 {
                return (e > 0 && node.lo[e - 1] == at).then(|| node.hi[e - 1]);
            }
            x = node.child[e.saturating_sub(1)];
        }
    }

    /// Deletes the tree hole starting at `at` (which exists).
    fn delete_hole(&mut self, at: u64, w: &mut WorkRecord) {
        // The walk for `at + 1` ends just past the hole starting at `at`.
        self.locate(at + 1, w);
        let d = self.path.len() - 1;
        let e = self.path[d].1;
        debug_assert!(e > 0 && self.node(self.path[d].0).lo[e - 1] == at);
        self.len -= 1;
        self.delete_at(d, e - 1, w);
    }

    /// The holes in address order, as `[lo, hi)`, the frontier among them.
    pub(super) fn in_order(&self) -> Vec<(u64, u64)> {
        fn walk(t: &HoleTree, x: u32, out: &mut Vec<(u64, u64)>) {
            let node = t.node(x);
            for e in 0..node.n {
                if node.level == 0 {
                    out.push((node.lo[e], node.hi[e]));
                } else {
                    walk(t, node.child[e], out);
                }
            }
        }
        let mut out = Vec::with_capacity(self.len + 1);
        if self.root != NIL {
            walk(self, self.root, &mut out);
        }
        if let Some(f) = self.frontier {
            let at = out.partition_point(|&(lo, _)| lo < f.0);
            out.insert(at, f);
        }
        out
    }

    /// Checks the tree: node fill, leaf depth, entry order, and every entry's bounds and
    /// summaries (a leaf's block against a brute-force scan of the orders).
    pub(super) fn check(&self) -> Result<(), String> {
        if self.root == NIL {
            return if self.len == 0 {
                Ok(())
            } else {
                Err(format!("empty tree, {} holes counted", self.len))
            };
        }
        let mut holes = 0;
        self.check_node(self.root, true, &mut holes)?;
        if holes != self.len {
            return Err(format!("{holes} holes in the tree, {} counted", self.len));
        }
        Ok(())
    }

    fn check_node(&self, x: u32, root: bool, holes: &mut usize) -> Result<(), String> {
        let node = self.node(x);
        let n = node.n;
        let least = if root {
            if node.level > 0 {
                2
            } else {
                1
            }
        } else {
            MIN
        };
        if n < least || n > B {
            return Err(format!("node {x}: {n} entries"));
        }
        if node.max_len[n..].iter().any(|&v| v != 0)
            || node.block[n..].iter().any(|&v| v != 0)
            || node.lo[n..].iter().any(|&v| v != u64::MAX)
        {
            return Err(format!("node {x}: summaries past its {n} entries"));
        }
        for e in 0..n {
            let here = format!("node {x} entry {e} [{:#x}, {:#x})", node.lo[e], node.hi[e]);
            if node.lo[e] >= node.hi[e] || (e > 0 && node.hi[e - 1] >= node.lo[e]) {
                return Err(format!("{here}: empty, or out of order"));
            }
            let (want_len, want_block, rooms): (u64, u8, Vec<u64>) = if node.level == 0 {
                *holes += 1;
                let own_block = (0..64)
                    .filter(|&j| room_of(node.lo[e], node.hi[e], j) >= 1 << j)
                    .map(|j| j as u8 + 1)
                    .max()
                    .unwrap_or(0);
                let rooms = (0..self.orders)
                    .map(|k| room_of(node.lo[e], node.hi[e], k))
                    .collect();
                (node.hi[e] - node.lo[e], own_block, rooms)
            } else {
                let c = node.child[e];
                let cn = self.node(c);
                if usize::from(cn.level) + 1 != usize::from(node.level) {
                    return Err(format!("{here}: child {c} at level {}", cn.level));
                }
                self.check_node(c, false, holes)?;
                if cn.lo[0] != node.lo[e] || cn.hi[cn.n - 1] != node.hi[e] {
                    return Err(format!("{here}: child {c} spans other bounds"));
                }
                let rooms = (0..self.orders)
                    .map(|k| {
                        (0..cn.n)
                            .map(|i| {
                                if self.active == 0 {
                                    0
                                } else {
                                    self.room_at(c, i, k)
                                }
                            })
                            .max()
                            .unwrap_or(0)
                    })
                    .collect();
                (
                    cn.max_len[..cn.n].iter().copied().max().unwrap_or(0),
                    cn.block[..cn.n].iter().copied().max().unwrap_or(0),
                    rooms,
                )
            };
            if node.max_len[e] != want_len || node.block[e] != want_block {
                return Err(format!(
                    "{here}: summary ({}, {}), want ({want_len}, {want_block})",
                    node.max_len[e], node.block[e]
                ));
            }
            for (k, want) in rooms.iter().enumerate() {
                if self.active & (1 << k) != 0 && self.room_at(x, e, k) != *want {
                    return Err(format!(
                        "{here}: room at order {k} is {}, want {want}",
                        self.room_at(x, e, k)
                    ));
                }
            }
        }
        Ok(())
    }
}
