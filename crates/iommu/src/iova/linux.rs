//! The Linux IOVA allocator (`drivers/iommu/iova.c`), rebuilt from its published design.
//!
//! A red-black tree holds the *allocated* ranges, plus a permanent anchor node just above the
//! top of the space. Allocation is a top-down first fit (`__alloc_and_insert_iova_range`):
//!
//! 1. A request limited to 32 bits whose size is at least the size of the last failed request
//!    (`max32_alloc_size`) fails at once, without walking the tree (the O(1) 32-bit fast-fail).
//! 2. The walk starts at a cached cursor node (`cached32_node` for requests whose limit is at
//!    most 4 GiB, `cached_node` for the rest) and steps to lower nodes (`rb_prev`) until the gap
//!    below the current node can hold the request. With `size_aligned`, the candidate start is
//!    aligned down to the next power of two of the size.
//! 3. If that fails and the cursor was below the limit, a second pass starts at the limit
//!    (`iova_find_limit`) and covers the range above the cursor.
//! 4. A failure records its size in `max32_alloc_size`; a free below 4 GiB resets it.
//!
//! Steps 1 and 3 came late: Linux 4.19 has neither (every 32-bit request walks down to the
//! bottom of the 32-bit space before it fails), 5.0 added the fast-fail and 5.11 the retry
//! from the limit. [`LinuxTreeVariant`] turns them off ([`LinuxIovaAllocator::with_variant`]);
//! [`LinuxIovaAllocator::new`] has both, as Linux 6.12.
//!
//! The new node is linked starting from the node just above the gap and the cursor for its side
//! of 4 GiB moves to it. A free looks the range up, moves the cursors to the next node when the
//! freed node is at or above them (`__cached_rbnode_delete_update`) and erases it.
//!
//! # Work counted
//!
//! One [`LockId::IovaTree`] acquisition per `alloc` or `free` that gets past argument checks.
//! `tree_nodes_visited` counts every node the code steps onto: each node `rb_prev`/`rb_next`
//! moves through, each node of a search or insertion descent, the minimum search of an erase,
//! and in the rebalancing loops each parent, grandparent, uncle or sibling examined.
//! `tree_rotations` counts rotations. `alloc_failures` counts every failed `alloc`.
//!
//! # Differences from Linux
//!
//! - The anchor sits at the first page past the space (`end`) instead of at `~0`, and the
//!   request limit is clamped to `end` first (as dma-iommu clamps to the aperture). Limits are
//!   exclusive byte addresses, rounded down to the granule.
//! - Linux frees by any page inside the range; here a free must name a range exactly as it was
//!   allocated, otherwise it returns [`IovaError::NotAllocated`] and changes nothing.
//! - The number of live ranges is capped ([`IovaSpaceConfig::max_live_blocks`]); a request past
//!   the cap fails with [`IovaError::Exhausted`] (bounded state under untrusted input).

use crate::addr::{Iova, SZ_4G};
use crate::iova::{AllocRequest, IovaAllocator, IovaBlock, IovaError};
use crate::work::{LockId, WorkRecord};
use parking_lot::Mutex;

/// Smallest page size (granule) the tree allocators accept.
pub const MIN_GRANULE: u64 = 1 << 9;
/// Largest page size (granule) the tree allocators accept.
pub const MAX_GRANULE: u64 = 1 << 34;
/// Default cap on live ranges of the tree allocators.
pub const DEFAULT_MAX_LIVE_BLOCKS: usize = 1 << 22;
/// Largest cap on live ranges the tree allocators accept (node indices are `u32`).
pub const MAX_LIVE_BLOCKS: usize = (u32::MAX - 2) as usize;

/// An invalid allocator configuration. Constructors return it instead of panicking.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IovaConfigError {
    /// The page size (granule, TCE page size, IOMMU page size) is out of range.
    #[error("Page size {size:#x} is not a power of two in {min:#x}..={max:#x}")]
    BadPageSize {
        /// The page size given.
        size: u64,
        /// Smallest accepted.
        min: u64,
        /// Largest accepted.
        max: u64,
    },
    /// An address or size that must be a multiple of the page size is not.
    #[error("{field} {value:#x} is not a multiple of the page size {page:#x}")]
    Unaligned {
        /// Which field.
        field: &'static str,
        /// Its value.
        value: u64,
        /// The page size.
        page: u64,
    },
    /// The usable range is empty, or would include IOVA 0.
    #[error("The usable IOVA range {start:#x}..{end:#x} is empty or includes IOVA 0")]
    BadRange {
        /// First usable IOVA (bytes).
        start: u64,
        /// One past the last usable IOVA (bytes).
        end: u64,
    },
    /// A numeric parameter is outside what the allocator supports.
    #[error("{field} is {value}, outside the supported range {min}..={max}")]
    OutOfBounds {
        /// Which field.
        field: &'static str,
        /// Its value.
        value: u64,
        /// Smallest accepted.
        min: u64,
        /// Largest accepted.
        max: u64,
    },
}

/// The IOVA space of a tree allocator ([`LinuxIovaAllocator`], and the gap tree).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IovaSpaceConfig {
    /// Page size in bytes (a power of two, [`MIN_GRANULE`]..=[`MAX_GRANULE`]).
    pub granule: u64,
    /// First usable page (Linux `start_pfn`); at least 1, so IOVA 0 is never handed out.
    pub start_pfn: u64,
    /// One past the last usable IOVA, in bytes (a multiple of the granule): `1 << 48` for a
    /// 48-bit input address space, or the end of the domain's aperture.
    pub end: Iova,
    /// Cap on ranges live at once; allocations beyond it fail with `Exhausted`.
    pub max_live_blocks: usize,
}

impl IovaSpaceConfig {
    /// A space of `granule`-sized pages from page 1 up to `end` (exclusive), with the default
    /// cap on live ranges.
    pub fn new(granule: u64, end: Iova) -> Self {
        Self {
            granule,
            start_pfn: 1,
            end,
            max_live_blocks: DEFAULT_MAX_LIVE_BLOCKS,
        }
    }

    /// Checks the configuration; returns `(start_pfn, end_pfn)` in pages.
    pub fn validate(&self) -> Result<(u64, u64), IovaConfigError> {
        if !self.granule.is_power_of_two() || !(MIN_GRANULE..=MAX_GRANULE).contains(&self.granule) {
            return Err(IovaConfigError::BadPageSize {
                size: self.granule,
                min: MIN_GRANULE,
                max: MAX_GRANULE,
            });
        }
        let end = self.end.get();
        if end % self.granule != 0 {
            return Err(IovaConfigError::Unaligned {
                field: "end",
                value: end,
                page: self.granule,
            });
        }
        let end_pfn = end / self.granule;
        if self.start_pfn == 0 || self.start_pfn >= end_pfn {
            return Err(IovaConfigError::BadRange {
                start: self.start_pfn.saturating_mul(self.granule),
                end,
            });
        }
        if self.max_live_blocks == 0 || self.max_live_blocks > MAX_LIVE_BLOCKS {
            return Err(IovaConfigError::OutOfBounds {
                field: "max_live_blocks",
                value: self.max_live_blocks as u64,
                min: 1,
                max: MAX_LIVE_BLOCKS as u64,
            });
        }
        Ok((self.start_pfn, end_pfn))
    }
}

/// `ceil(log2(n))` for `n >= 1` (Linux `fls_long(n - 1)`).
#[inline]
pub(crate) fn order_base_2(n: u64) -> u32 {
    if n <= 1 {
        0
    } else {
        64 - (n - 1).leading_zeros()
    }
}

/// A red-black tree of page ranges in an arena, with parent links so the allocator can step
/// to neighbours the way Linux's `rb_prev`/`rb_next` do. Every step is counted.
///
/// The tree also keeps its lowest node and that node's depth, and marks the nodes of its left
/// spine (the path from the root to the lowest node), all updated in O(1) per link, rotation
/// and unlink. `rb_prev` of the lowest node walks every ancestor up to the root and finds
/// nothing; with many CPUs missing their magazines, every allocation starts there (the cursor
/// sits on the range allocated last, the lowest). [`Tree::prev`] then counts the walk's steps
/// (the depth) without taking them: the same count, not the host cost of the walk.
mod rb {
    use crate::work::WorkRecord;

    /// The null index.
    pub const NIL: u32 = u32::MAX;
    /// Index of the left child in [`Node::child`].
    pub const LEFT: usize = 0;
    /// Index of the right child in [`Node::child`].
    pub const RIGHT: usize = 1;

    #[derive(Clone, Copy, Debug)]
    pub struct Node {
        pub lo: u64,
        pub hi: u64,
        /// Children: `child[LEFT]` and `child[RIGHT]`.
        pub child: [u32; 2],
        pub parent: u32,
        pub red: bool,
        /// On the left spine: the root, or the left child of a node on it.
        pub spine: bool,
    }

    #[derive(Debug, Default)]
    pub struct Tree {
        nodes: Vec<Node>,
        free: Vec<u32>,
        pub root: u32,
        pub len: usize,
        /// The lowest node (the end of the left spine), or `NIL` when empty.
        min: u32,
        /// The number of ancestors of `min`.
        min_depth: u64,
    }

    impl Tree {
        pub fn new() -> Self {
            Self {
                nodes: Vec::new(),
                free: Vec::new(),
                root: NIL,
                len: 0,
                min: NIL,
                min_depth: 0,
            }
        }

        #[inline]
        pub fn node(&self, i: u32) -> &Node {
            &self.nodes[i as usize]
        }

        #[inline]
        fn n(&mut self, i: u32) -> &mut Node {
            &mut self.nodes[i as usize]
        }

        #[inline]
        fn is_red(&self, i: u32) -> bool {
            i != NIL && self.nodes[i as usize].red
        }

        /// Allocates an unlinked node.
        pub fn new_node(&mut self, lo: u64, hi: u64) -> u32 {
            let node = Node {
                lo,
                hi,
                child: [NIL, NIL],
                parent: NIL,
                red: true,
                spine: false,
            };
            match self.free.pop() {
                Some(i) => {
                    self.nodes[i as usize] = node;
                    i
                }
                None => {
                    self.nodes.push(node);
                    (self.nodes.len() - 1) as u32
                }
            }
        }

        /// In-order predecessor (Linux `rb_prev`).
        pub fn prev(&self, i: u32, w: &mut WorkRecord) -> u32 {
            self.step(i, LEFT, w)
        }

        /// In-order successor (Linux `rb_next`).
        pub fn next(&self, i: u32, w: &mut WorkRecord) -> u32 {
            self.step(i, RIGHT, w)
        }

        /// The in-order neighbour of `i` on side `dir` (`LEFT`: predecessor, `RIGHT`:
        /// successor), or `NIL`.
        #[inline(always)]
        fn step(&self, mut i: u32, dir: usize, w: &mut WorkRecord) -> u32 {
            if dir == LEFT && i == self.min {
                // The lowest node has no left child and is the left child of each of its
                // ancestors: the walk steps onto every one of them and ends at the root.
                w.tree_nodes_visited += self.min_depth;
                return NIL;
            }
            let nodes = &self.nodes[..];
            let other = 1 - dir;
            let mut steps = 0u64;
            let c = nodes[i as usize].child[dir];
            let found = if c != NIL {
                i = c;
                steps += 1;
                loop {
                    let d = nodes[i as usize].child[other];
                    if d == NIL {
                        break i;
                    }
                    i = d;
                    steps += 1;
                }
            } else {
                loop {
                    let p = nodes[i as usize].parent;
                    if p == NIL {
                        break NIL;
                    }
                    steps += 1;
                    if nodes[p as usize].child[dir] != i {
                        break p;
                    }
                    i = p;
                }
            };
            w.tree_nodes_visited += steps;
            found
        }

        /// The node whose range contains `pfn`, or `NIL` (Linux `private_find_iova`).
        pub fn find(&self, pfn: u64, w: &mut WorkRecord) -> u32 {
            let mut i = self.root;
            while i != NIL {
                w.tree_nodes_visited += 1;
                let n = self.node(i);
                if pfn < n.lo {
                    i = n.child[LEFT];
                } else if pfn > n.hi {
                    i = n.child[RIGHT];
                } else {
                    return i;
                }
            }
            NIL
        }

        /// Rotates the subtree at `x` towards side `dir`: `x`'s child on the other side
        /// takes its place and `x` becomes that child's `dir` child.
        fn rotate(&mut self, x: u32, dir: usize, w: &mut WorkRecord) {
            w.tree_rotations += 1;
            let other = 1 - dir;
            let y = self.node(x).child[other];
            let inner = self.node(y).child[dir];
            self.n(x).child[other] = inner;
            if inner != NIL {
                self.n(inner).parent = x;
            }
            let xp = self.node(x).parent;
            self.n(y).parent = xp;
            self.replace_child(xp, x, y);
            self.n(y).child[dir] = x;
            self.n(x).parent = y;
            // `y` takes `x`'s place; `inner` is a right child before and after. Rotating
            // left, `x` becomes `y`'s left child and the spine below it goes one deeper;
            // rotating right, `x` becomes a right child and the spine below `y` one shallower.
            let x_spine = self.node(x).spine;
            self.n(y).spine = x_spine;
            if dir == RIGHT {
                self.n(x).spine = false;
            }
            if x_spine {
                if dir == LEFT {
                    self.min_depth += 1;
                } else {
                    self.min_depth -= 1;
                }
            }
        }

        /// Makes `new` take `old`'s place as a child of `parent` (or as the root).
        fn replace_child(&mut self, parent: u32, old: u32, new: u32) {
            if parent == NIL {
                self.root = new;
            } else if self.node(parent).child[LEFT] == old {
                self.n(parent).child[LEFT] = new;
            } else {
                self.n(parent).child[RIGHT] = new;
            }
        }

        /// Links the unlinked node `z`, descending from `start` (or the root when `NIL`),
        /// which must be an ancestor of `z`'s in-order position (Linux `iova_insert_rbtree`).
        pub fn insert(&mut self, z: u32, start: u32, w: &mut WorkRecord) {
            let key = self.node(z).lo;
            let mut parent = NIL;
            let mut cur = if start == NIL { self.root } else { start };
            let mut go_left = false;
            while cur != NIL {
                w.tree_nodes_visited += 1;
                parent = cur;
                go_left = key < self.node(cur).lo;
                cur = if go_left {
                    self.node(cur).child[LEFT]
                } else {
                    self.node(cur).child[RIGHT]
                };
            }
            self.n(z).parent = parent;
            self.n(z).red = true;
            if parent == NIL {
                self.root = z;
                self.n(z).spine = true;
                self.min = z;
                self.min_depth = 0;
            } else if go_left {
                self.n(parent).child[LEFT] = z;
                // A left child of the lowest node is the new lowest node.
                let spine = self.node(parent).spine;
                self.n(z).spine = spine;
                if spine {
                    self.min = z;
                    self.min_depth += 1;
                }
            } else {
                self.n(parent).child[RIGHT] = z;
                self.n(z).spine = false;
            }
            self.len += 1;
            self.insert_fixup(z, w);
        }

        fn insert_fixup(&mut self, mut z: u32, w: &mut WorkRecord) {
            loop {
                let p = self.node(z).parent;
                if !self.is_red(p) {
                    break;
                }
                // A red parent is never the root, so the grandparent exists.
                let g = self.node(p).parent;
                w.tree_nodes_visited += 2;
                // `side`: which child of the grandparent the parent is; the uncle is the other.
                let side = if self.node(g).child[LEFT] == p {
                    LEFT
                } else {
                    RIGHT
                };
                let other = 1 - side;
                let u = self.node(g).child[other];
                if u != NIL {
                    w.tree_nodes_visited += 1;
                }
                if self.is_red(u) {
                    self.n(p).red = false;
                    self.n(u).red = false;
                    self.n(g).red = true;
                    z = g;
                    continue;
                }
                let mut p = p;
                if self.node(p).child[other] == z {
                    self.rotate(p, side, w);
                    z = p;
                    p = self.node(z).parent;
                }
                self.n(p).red = false;
                self.n(g).red = true;
                self.rotate(g, other, w);
                break;
            }
            let r = self.root;
            self.n(r).red = false;
        }

        /// Puts the subtree `v` where `u` was.
        fn transplant(&mut self, u: u32, v: u32) {
            let up = self.node(u).parent;
            self.replace_child(up, u, v);
            if v != NIL {
                self.n(v).parent = up;
            }
        }

        /// Unlinks and frees node `z`. Other nodes keep their indices.
        pub fn erase(&mut self, z: u32, w: &mut WorkRecord) {
            let zn = *self.node(z);
            let (x, xp, removed_red);
            if zn.child[LEFT] == NIL {
                x = zn.child[RIGHT];
                xp = zn.parent;
                removed_red = zn.red;
                self.transplant(z, zn.child[RIGHT]);
                if zn.spine {
                    // `z` was the lowest node: its right subtree's left spine joins the
                    // tree's, or, without one, its parent becomes the lowest.
                    self.relink_min(x, xp);
                }
            } else if zn.child[RIGHT] == NIL {
                x = zn.child[LEFT];
                xp = zn.parent;
                removed_red = zn.red;
                self.transplant(z, zn.child[LEFT]);
                if zn.spine {
                    // The spine below `z` (its left subtree) moves up one.
                    self.min_depth -= 1;
                }
            } else {
                let mut y = zn.child[RIGHT];
                w.tree_nodes_visited += 1;
                while self.node(y).child[LEFT] != NIL {
                    y = self.node(y).child[LEFT];
                    w.tree_nodes_visited += 1;
                }
                removed_red = self.node(y).red;
                x = self.node(y).child[RIGHT];
                if self.node(y).parent == z {
                    xp = y;
                } else {
                    xp = self.node(y).parent;
                    self.transplant(y, x);
                    self.n(y).child[RIGHT] = zn.child[RIGHT];
                    self.n(zn.child[RIGHT]).parent = y;
                }
                self.transplant(z, y);
                self.n(y).child[LEFT] = zn.child[LEFT];
                self.n(zn.child[LEFT]).parent = y;
                self.n(y).red = zn.red;
                // `y` takes `z`'s place; `z`'s left subtree keeps its depth. `x` takes `y`'s
                // place in `z`'s right subtree, off the spine as before.
                self.n(y).spine = zn.spine;
            }
            if !removed_red {
                self.erase_fixup(x, xp, w);
            }
            self.len -= 1;
            self.n(z).spine = false;
            self.free.push(z);
        }

        /// After the lowest node was unlinked with `x` (its right child, or `NIL`) put in its
        /// place under `xp`: marks `x`'s left spine and finds the new lowest node and its depth.
        fn relink_min(&mut self, x: u32, xp: u32) {
            if x == NIL {
                self.min = xp;
                self.min_depth = self.min_depth.saturating_sub(1);
                return;
            }
            // `x` sits at the old lowest node's depth.
            let mut i = x;
            loop {
                self.n(i).spine = true;
                let l = self.node(i).child[LEFT];
                if l == NIL {
                    break;
                }
                i = l;
                self.min_depth += 1;
            }
            self.min = i;
        }

        fn erase_fixup(&mut self, mut x: u32, mut xp: u32, w: &mut WorkRecord) {
            while x != self.root && !self.is_red(x) {
                // x is "doubly black", so its sibling exists.
                w.tree_nodes_visited += 1;
                // `side`: which child of its parent x is; the sibling is on the other side.
                let side = if self.node(xp).child[LEFT] == x {
                    LEFT
                } else {
                    RIGHT
                };
                let other = 1 - side;
                let mut s = self.node(xp).child[other];
                w.tree_nodes_visited += 1;
                if self.is_red(s) {
                    self.n(s).red = false;
                    self.n(xp).red = true;
                    self.rotate(xp, side, w);
                    s = self.node(xp).child[other];
                    w.tree_nodes_visited += 1;
                }
                let (near, far) = (self.node(s).child[side], self.node(s).child[other]);
                if !self.is_red(near) && !self.is_red(far) {
                    self.n(s).red = true;
                    x = xp;
                    xp = self.node(x).parent;
                    continue;
                }
                if !self.is_red(far) {
                    self.n(near).red = false;
                    self.n(s).red = true;
                    self.rotate(s, other, w);
                    s = self.node(xp).child[other];
                }
                self.n(s).red = self.node(xp).red;
                self.n(xp).red = false;
                let far = self.node(s).child[other];
                self.n(far).red = false;
                self.rotate(xp, side, w);
                x = self.root;
                break;
            }
            if x != NIL {
                self.n(x).red = false;
            }
        }

        /// `rb_prev` (`dir` = `LEFT`) or `rb_next` (`RIGHT`) taking every step, as Linux
        /// does: what [`Tree::step`] must match, result and count.
        #[cfg(test)]
        pub fn step_walked(&self, mut i: u32, dir: usize, w: &mut WorkRecord) -> u32 {
            let other = 1 - dir;
            let c = self.node(i).child[dir];
            if c != NIL {
                i = c;
                w.tree_nodes_visited += 1;
                while self.node(i).child[other] != NIL {
                    i = self.node(i).child[other];
                    w.tree_nodes_visited += 1;
                }
                return i;
            }
            loop {
                let p = self.node(i).parent;
                if p == NIL {
                    return NIL;
                }
                w.tree_nodes_visited += 1;
                if self.node(p).child[dir] != i {
                    return p;
                }
                i = p;
            }
        }

        /// Every linked node, in order.
        #[cfg(test)]
        pub fn linked(&self) -> Vec<u32> {
            let mut out = Vec::new();
            let mut stack = Vec::new();
            let mut i = self.root;
            while i != NIL || !stack.is_empty() {
                while i != NIL {
                    stack.push(i);
                    i = self.node(i).child[LEFT];
                }
                let n = stack.pop().unwrap();
                out.push(n);
                i = self.node(n).child[RIGHT];
            }
            out
        }

        /// Checks the red-black and ordering invariants; returns the ranges in order.
        #[cfg(test)]
        pub fn check(&self) -> Vec<(u64, u64)> {
            fn walk(t: &Tree, i: u32, parent: u32, out: &mut Vec<(u64, u64)>) -> usize {
                if i == NIL {
                    return 1;
                }
                let n = t.node(i);
                assert_eq!(n.parent, parent, "parent link");
                if n.red {
                    assert!(
                        !t.is_red(n.child[LEFT]) && !t.is_red(n.child[RIGHT]),
                        "red-red"
                    );
                }
                let bl = walk(t, n.child[LEFT], i, out);
                out.push((n.lo, n.hi));
                let br = walk(t, n.child[RIGHT], i, out);
                assert_eq!(bl, br, "black height");
                bl + usize::from(!n.red)
            }
            let mut out = Vec::new();
            assert!(!self.is_red(self.root));
            walk(self, self.root, NIL, &mut out);
            // The left spine, the lowest node and its depth.
            let (mut i, mut depth, mut min) = (self.root, 0u64, NIL);
            while i != NIL {
                assert!(self.node(i).spine, "spine mark missing");
                min = i;
                i = self.node(i).child[LEFT];
                depth += 1;
            }
            assert_eq!(self.min, min, "lowest node");
            if min != NIL {
                assert_eq!(self.min_depth, depth - 1, "lowest node's depth");
            }
            let spines = self.nodes.iter().filter(|n| n.spine).count() as u64;
            assert_eq!(
                spines,
                if min == NIL { 0 } else { depth },
                "stray spine marks"
            );
            assert_eq!(out.len(), self.len);
            for pair in out.windows(2) {
                assert!(pair[0].1 < pair[1].0, "overlap or disorder {pair:?}");
            }
            out
        }
    }
}

use rb::{LEFT, NIL, RIGHT};

/// Which steps of the first fit the allocator runs: the Linux release's variant of
/// `__alloc_and_insert_iova_range`. The default is Linux 5.11 and later (both steps).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LinuxTreeVariant {
    /// Failing from the cached cursor, retry once from the limit down to the cursor
    /// (5.11+: "iommu/iova: Retry from last rb tree node if iova search fails"). Without
    /// it, space freed above the cursor is found only once the cursor moves up.
    pub retry_from_limit: bool,
    /// A failed 32-bit-limited request records its size, and later 32-bit requests of that
    /// size or more fail at once until a free below 4 GiB (5.0+: `max32_alloc_size`).
    /// Without it, every such request walks the 32-bit space's nodes before failing.
    pub fast_fail_32bit: bool,
}

impl Default for LinuxTreeVariant {
    fn default() -> Self {
        Self {
            retry_from_limit: true,
            fast_fail_32bit: true,
        }
    }
}

/// Everything behind the tree lock.
#[derive(Debug)]
struct State {
    tree: rb::Tree,
    anchor: u32,
    cached_node: u32,
    cached32_node: u32,
    max32_alloc_size: u64,
}

/// The Linux IOVA allocator: a red-black tree of allocated ranges, top-down first fit from a
/// cached cursor, the 32-bit fast-fail. See the module docs.
#[derive(Debug)]
pub struct LinuxIovaAllocator {
    granule: u64,
    start_pfn: u64,
    end_pfn: u64,
    dma_32bit_pfn: u64,
    max_live: usize,
    variant: LinuxTreeVariant,
    state: Mutex<State>,
}

impl LinuxIovaAllocator {
    /// Builds an empty allocator over the configured space, with Linux 6.12's first fit.
    ///
    /// # Errors
    ///
    /// [`IovaConfigError`] for a configuration [`IovaSpaceConfig::validate`] refuses.
    pub fn new(config: IovaSpaceConfig) -> Result<Self, IovaConfigError> {
        Self::with_variant(config, LinuxTreeVariant::default())
    }

    /// Builds an empty allocator over the configured space whose first fit runs `variant`
    /// (an older Linux release's).
    ///
    /// # Errors
    ///
    /// [`IovaConfigError`] for a configuration [`IovaSpaceConfig::validate`] refuses.
    pub fn with_variant(
        config: IovaSpaceConfig,
        variant: LinuxTreeVariant,
    ) -> Result<Self, IovaConfigError> {
        let (start_pfn, end_pfn) = config.validate()?;
        let mut tree = rb::Tree::new();
        let anchor = tree.new_node(end_pfn, end_pfn);
        tree.insert(anchor, NIL, &mut WorkRecord::new());
        let dma_32bit_pfn = SZ_4G / config.granule;
        Ok(Self {
            granule: config.granule,
            start_pfn,
            end_pfn,
            dma_32bit_pfn,
            max_live: config.max_live_blocks,
            variant,
            state: Mutex::new(State {
                tree,
                anchor,
                cached_node: anchor,
                cached32_node: anchor,
                max32_alloc_size: dma_32bit_pfn,
            }),
        })
    }

    /// Number of tree nodes, the anchor included (what a walk can be slowed by).
    pub fn tree_len(&self) -> usize {
        self.state.lock().tree.len
    }

    /// The size (in pages) at or above which 32-bit-limited requests currently fail at once
    /// (Linux `max32_alloc_size`; `4 GiB / granule` when nothing has failed).
    pub fn max32_alloc_size(&self) -> u64 {
        self.state.lock().max32_alloc_size
    }

    /// The allocated ranges in address order, as `(first page, last page)`.
    pub fn ranges(&self) -> Vec<(u64, u64)> {
        let st = self.state.lock();
        let mut out = Vec::with_capacity(st.tree.len);
        let mut w = WorkRecord::new();
        // Start at the lowest node and step up; the anchor is last.
        let mut i = st.tree.root;
        while i != NIL && st.tree.node(i).child[LEFT] != NIL {
            i = st.tree.node(i).child[LEFT];
        }
        while i != NIL && i != st.anchor {
            let n = st.tree.node(i);
            out.push((n.lo, n.hi));
            i = st.tree.next(i, &mut w);
        }
        out
    }

    /// Checks arguments shared by the tree allocators; returns `(pages, limit_pfn)`.
    fn check_request(&self, req: &AllocRequest) -> Result<(u64, u64), IovaError> {
        check_tree_request(req, self.granule, self.start_pfn, self.end_pfn)
    }

    /// `__alloc_and_insert_iova_range`, with the lock held. Returns the first page.
    fn alloc_locked(
        &self,
        st: &mut State,
        size: u64,
        limit_pfn: u64,
        size_aligned: bool,
        w: &mut WorkRecord,
    ) -> Option<u64> {
        let align_mask = if size_aligned {
            !0u64 << order_base_2(size)
        } else {
            !0u64
        };
        if self.variant.fast_fail_32bit
            && limit_pfn <= self.dma_32bit_pfn
            && size >= st.max32_alloc_size
        {
            return None;
        }
        if st.tree.len > self.max_live {
            return None;
        }
        let mut curr = if limit_pfn <= self.dma_32bit_pfn {
            st.cached32_node
        } else {
            st.cached_node
        };
        w.tree_nodes_visited += 1;
        let retry_pfn = st.tree.node(curr).hi;
        let mut high_pfn = limit_pfn;
        let mut low_pfn = self.start_pfn;
        loop {
            let mut prev;
            let mut new_pfn;
            loop {
                high_pfn = high_pfn.min(st.tree.node(curr).lo);
                new_pfn = high_pfn.wrapping_sub(size) & align_mask;
                prev = curr;
                curr = st.tree.prev(curr, w);
                if curr == NIL || new_pfn > st.tree.node(curr).hi || new_pfn < low_pfn {
                    break;
                }
            }
            if high_pfn < size || new_pfn < low_pfn {
                if self.variant.retry_from_limit
                    && low_pfn == self.start_pfn
                    && retry_pfn < limit_pfn
                {
                    w.iova_tree_retries += 1;
                    high_pfn = limit_pfn;
                    low_pfn = retry_pfn + 1;
                    curr = self.find_limit(st, limit_pfn, w);
                    continue;
                }
                if self.variant.fast_fail_32bit {
                    st.max32_alloc_size = size;
                }
                return None;
            }
            let node = st.tree.new_node(new_pfn, new_pfn + size - 1);
            st.tree.insert(node, prev, w);
            if new_pfn + size - 1 < self.dma_32bit_pfn {
                st.cached32_node = node;
            } else {
                st.cached_node = node;
            }
            return Some(new_pfn);
        }
    }

    /// `remove_iova` for the exact range `lo..=hi`, with the lock held. False if the range is
    /// not allocated exactly so (nothing changes then).
    fn free_locked(&self, st: &mut State, lo: u64, hi: u64, w: &mut WorkRecord) -> bool {
        let node = st.tree.find(lo, w);
        if node == NIL || node == st.anchor {
            return false;
        }
        let n = *st.tree.node(node);
        if n.lo != lo || n.hi != hi {
            return false;
        }
        // __cached_rbnode_delete_update
        let c32 = *st.tree.node(st.cached32_node);
        if node == st.cached32_node || (n.hi < self.dma_32bit_pfn && n.lo >= c32.lo) {
            st.cached32_node = st.tree.next(node, w);
        }
        if n.lo < self.dma_32bit_pfn {
            st.max32_alloc_size = self.dma_32bit_pfn;
        }
        let c = *st.tree.node(st.cached_node);
        if n.lo >= c.lo {
            st.cached_node = st.tree.next(node, w);
        }
        st.tree.erase(node, w);
        true
    }

    /// `iova_find_limit`: a node to start the second pass from, at or just above the limit.
    fn find_limit(&self, st: &State, limit_pfn: u64, w: &mut WorkRecord) -> u32 {
        if limit_pfn > self.dma_32bit_pfn {
            return st.anchor;
        }
        let t = &st.tree;
        let mut node = t.root;
        w.tree_nodes_visited += 1;
        // The anchor (rightmost) has hi >= end_pfn >= limit_pfn, so this stops before NIL.
        while t.node(node).hi < limit_pfn {
            node = t.node(node).child[RIGHT];
            w.tree_nodes_visited += 1;
        }
        'search_left: loop {
            loop {
                let l = t.node(node).child[LEFT];
                if l != NIL && t.node(l).lo >= limit_pfn {
                    node = l;
                    w.tree_nodes_visited += 1;
                } else {
                    break;
                }
            }
            let l = t.node(node).child[LEFT];
            if l == NIL {
                return node;
            }
            let mut next = l;
            w.tree_nodes_visited += 1;
            while t.node(next).child[RIGHT] != NIL {
                next = t.node(next).child[RIGHT];
                w.tree_nodes_visited += 1;
                if t.node(next).lo >= limit_pfn {
                    node = next;
                    continue 'search_left;
                }
            }
            return node;
        }
    }
}

/// Argument checks shared by the tree allocators; returns `(pages, limit_pfn)` with the limit
/// rounded down to the granule and clamped to the end of the space.
pub(crate) fn check_tree_request(
    req: &AllocRequest,
    granule: u64,
    start_pfn: u64,
    end_pfn: u64,
) -> Result<(u64, u64), IovaError> {
    if req.pages == 0 || req.pages > end_pfn - start_pfn {
        return Err(IovaError::BadSize { pages: req.pages });
    }
    // The granule is a power of two (checked with the configuration): shifts, not divisions,
    // on the allocators' hot path.
    debug_assert!(granule.is_power_of_two());
    let shift = granule.trailing_zeros();
    let limit_pfn = (req.limit.get() >> shift).min(end_pfn);
    if limit_pfn <= start_pfn {
        return Err(IovaError::LimitTooLow {
            limit: req.limit.get(),
            start: start_pfn << shift,
        });
    }
    Ok((req.pages, limit_pfn))
}

/// Checks a block passed to free; returns `(first page, last page)`.
pub(crate) fn check_tree_block(
    block: &IovaBlock,
    granule: u64,
    start_pfn: u64,
    end_pfn: u64,
) -> Result<(u64, u64), IovaError> {
    let err = IovaError::NotAllocated {
        start: block.start.get(),
        pages: block.pages,
    };
    let s = block.start.get();
    debug_assert!(granule.is_power_of_two());
    if block.pages == 0 || s & (granule - 1) != 0 {
        return Err(err);
    }
    let lo = s >> granule.trailing_zeros();
    match lo.checked_add(block.pages - 1) {
        Some(hi) if lo >= start_pfn && hi < end_pfn => Ok((lo, hi)),
        _ => Err(err),
    }
}

/// Frees, with `free(first page, last page)`, each of `blocks` that passes
/// [`check_tree_block`]; returns how many `free` reported freed. The caller holds the tree
/// lock for the whole batch (the tree allocators' `free_batch`).
pub(crate) fn free_tree_blocks(
    blocks: &[IovaBlock],
    granule: u64,
    start_pfn: u64,
    end_pfn: u64,
    mut free: impl FnMut(u64, u64) -> bool,
) -> usize {
    let mut freed = 0;
    for block in blocks {
        if let Ok((lo, hi)) = check_tree_block(block, granule, start_pfn, end_pfn) {
            freed += usize::from(free(lo, hi));
        }
    }
    freed
}

impl IovaAllocator for LinuxIovaAllocator {
    fn name(&self) -> &'static str {
        "linux"
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
        let (pages, limit_pfn) = match self.check_request(&req) {
            Ok(v) => v,
            Err(e) => {
                work.alloc_failures += 1;
                return Err(e);
            }
        };
        work.lock(LockId::IovaTree);
        let mut st = self.state.lock();
        match self.alloc_locked(&mut st, pages, limit_pfn, req.size_aligned, work) {
            Some(pfn) => Ok(IovaBlock {
                start: Iova::new(pfn * self.granule),
                pages,
            }),
            None => {
                work.alloc_failures += 1;
                Err(IovaError::Exhausted {
                    pages,
                    limit: req.limit.get(),
                })
            }
        }
    }

    fn free(&self, block: IovaBlock, cpu: usize, work: &mut WorkRecord) -> Result<(), IovaError> {
        let _ = cpu;
        let (lo, hi) = check_tree_block(&block, self.granule, self.start_pfn, self.end_pfn)?;
        work.lock(LockId::IovaTree);
        let mut st = self.state.lock();
        if self.free_locked(&mut st, lo, hi, work) {
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
            self.free_locked(&mut st, lo, hi, work)
        })
    }

    fn live_blocks(&self) -> usize {
        self.state.lock().tree.len - 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::addr::{SZ_1G, SZ_4K};
    use crate::iova::test_support::assert_bad_frees_refused;

    const G: u64 = SZ_4K;
    /// A 64 GiB space of 4K pages.
    const END: u64 = 1 << 36;

    fn alloc_64(end: u64) -> LinuxIovaAllocator {
        LinuxIovaAllocator::new(IovaSpaceConfig::new(G, Iova::new(end))).unwrap()
    }

    fn req(pages: u64, limit: u64) -> AllocRequest {
        AllocRequest::new(pages, Iova::new(limit), 0)
    }

    fn check(a: &LinuxIovaAllocator) -> Vec<(u64, u64)> {
        let st = a.state.lock();
        st.tree.check()
    }

    #[test]
    fn first_alloc_is_the_highest_aligned_range() {
        let a = alloc_64(END);
        let mut w = WorkRecord::new();

        let b = a.alloc(req(3, END), &mut w).unwrap();

        assert_eq!(
            b,
            IovaBlock {
                start: Iova::new(END - 4 * G),
                pages: 3
            }
        );
    }

    #[test]
    fn unaligned_request_packs_against_the_top() {
        let a = alloc_64(END);
        let mut w = WorkRecord::new();

        let r = AllocRequest {
            size_aligned: false,
            ..req(3, END)
        };
        let b = a.alloc(r, &mut w).unwrap();

        assert_eq!(b.start, Iova::new(END - 3 * G));
    }

    #[test]
    fn size_aligned_blocks_are_aligned_to_the_next_power_of_two() {
        let a = alloc_64(END);
        let mut w = WorkRecord::new();
        a.alloc(req(1, END), &mut w).unwrap();

        let b = a.alloc(req(5, END), &mut w).unwrap();

        assert!(b.start.is_aligned(8 * G));
        assert_eq!(b.start, Iova::new(END - 8 * G));
    }

    #[test]
    fn allocations_go_down_from_the_top() {
        let a = alloc_64(END);
        let mut w = WorkRecord::new();

        let b1 = a.alloc(req(1, END), &mut w).unwrap();
        let b2 = a.alloc(req(1, END), &mut w).unwrap();

        assert_eq!(b2.start.get() + G, b1.start.get());
        check(&a);
    }

    #[test]
    fn iova_zero_is_never_returned_when_space_runs_out() {
        let a = alloc_64(16 * G);
        let mut w = WorkRecord::new();

        let mut got = Vec::new();
        while let Ok(b) = a.alloc(req(1, 16 * G), &mut w) {
            got.push(b.start.get());
        }

        assert_eq!(got.len(), 15);
        assert!(!got.contains(&0));
        assert_eq!(*got.last().unwrap(), G);
    }

    #[test]
    fn limit_below_the_top_is_respected() {
        let a = alloc_64(END);
        let mut w = WorkRecord::new();

        let b = a.alloc(req(2, SZ_4G), &mut w).unwrap();

        assert_eq!(b.start, Iova::new(SZ_4G - 2 * G));
    }

    #[test]
    fn failed_32bit_request_makes_larger_ones_fail_without_a_walk() {
        let a = alloc_64(END);
        let mut w = WorkRecord::new();
        let limit = 32 * G;
        // 8-aligned 8-page blocks at pages 24, 16, 8; the next one would need page 0.
        for _ in 0..3 {
            a.alloc(req(8, limit), &mut w).unwrap();
        }
        assert!(a.alloc(req(8, limit), &mut w).is_err());
        assert_eq!(a.max32_alloc_size(), 8);

        let mut w2 = WorkRecord::new();
        let r = a.alloc(req(16, SZ_4G), &mut w2);

        assert!(matches!(r, Err(IovaError::Exhausted { pages: 16, .. })));
        assert_eq!(w2.tree_nodes_visited, 0);
        assert_eq!(w2.lock_count(LockId::IovaTree), 1);
        assert_eq!(w2.alloc_failures, 1);
    }

    #[test]
    fn smaller_32bit_requests_still_walk_after_a_failure() {
        let a = alloc_64(END);
        let mut w = WorkRecord::new();
        for _ in 0..3 {
            a.alloc(req(8, 32 * G), &mut w).unwrap();
        }
        assert!(a.alloc(req(8, 32 * G), &mut w).is_err());

        let b = a.alloc(req(4, 32 * G), &mut w).unwrap();

        assert_eq!(b.start, Iova::new(4 * G));
    }

    #[test]
    fn free_below_4g_resets_the_32bit_fast_fail() {
        let a = alloc_64(END);
        let mut w = WorkRecord::new();
        let limit = 32 * G;
        let mut blocks = Vec::new();
        while let Ok(b) = a.alloc(req(4, limit), &mut w) {
            blocks.push(b);
        }
        assert!(a.alloc(req(4, limit), &mut w).is_err());

        // Two neighbouring 4-page blocks at pages 8 and 12 make an 8-aligned 8-page hole.
        for b in blocks
            .iter()
            .filter(|b| [8 * G, 12 * G].contains(&b.start.get()))
        {
            a.free(*b, 0, &mut w).unwrap();
        }
        let b = a.alloc(req(8, limit), &mut w).unwrap();

        assert_eq!(a.max32_alloc_size(), SZ_4G / G);
        assert_eq!(b.start, Iova::new(8 * G));
    }

    #[test]
    fn second_pass_covers_the_range_above_the_cursor() {
        // A 64-page space (all of it below 4 GiB, so one cursor serves every request).
        let a = alloc_64(64 * G);
        let mut w = WorkRecord::new();
        // Requests limited to 16 pages fill pages 15..1 and leave the cursor at page 1.
        for _ in 0..15 {
            a.alloc(req(1, 16 * G), &mut w).unwrap();
        }

        let b = a.alloc(req(1, 64 * G), &mut w).unwrap();

        // The first pass from the cursor finds nothing below it; the second pass from the
        // limit finds the top page.
        assert_eq!(b.start, Iova::new(63 * G));
        check(&a);
    }

    #[test]
    fn second_pass_finds_space_freed_above_the_32bit_cursor() {
        // 16 pages below 4 GiB and 4 above.
        let mut cfg = IovaSpaceConfig::new(G, Iova::new(SZ_4G + 4 * G));
        cfg.start_pfn = SZ_4G / G - 16;
        let a = LinuxIovaAllocator::new(cfg).unwrap();
        let mut w = WorkRecord::new();
        let unaligned = |pages, limit| AllocRequest {
            size_aligned: false,
            ..req(pages, limit)
        };
        // A 64-bit block straddling 4 GiB, then the 12 pages below it for 32-bit requests.
        let straddle = a.alloc(unaligned(8, 1 << 48), &mut w).unwrap();
        assert_eq!(straddle.start, Iova::new(SZ_4G - 4 * G));
        for _ in 0..12 {
            a.alloc(unaligned(1, SZ_4G), &mut w).unwrap();
        }
        // Freeing it does not move the 32-bit cursor (the block ends above 4 GiB).
        a.free(straddle, 0, &mut w).unwrap();

        let b = a.alloc(unaligned(1, SZ_4G), &mut w).unwrap();

        assert_eq!(b.start, Iova::new(SZ_4G - G));
        check(&a);
    }

    /// The 16-pages-below-4-GiB setup of the second-pass test, run with `variant`: the 32-bit
    /// cursor at the bottom, four pages freed above it. Returns the last request's result and
    /// its work.
    fn freed_above_the_cursor(
        variant: LinuxTreeVariant,
    ) -> (Result<IovaBlock, IovaError>, WorkRecord) {
        let mut cfg = IovaSpaceConfig::new(G, Iova::new(SZ_4G + 4 * G));
        cfg.start_pfn = SZ_4G / G - 16;
        let a = LinuxIovaAllocator::with_variant(cfg, variant).unwrap();
        let mut w = WorkRecord::new();
        let unaligned = |pages, limit| AllocRequest {
            size_aligned: false,
            ..req(pages, limit)
        };
        let straddle = a.alloc(unaligned(8, 1 << 48), &mut w).unwrap();
        for _ in 0..12 {
            a.alloc(unaligned(1, SZ_4G), &mut w).unwrap();
        }
        a.free(straddle, 0, &mut w).unwrap();
        let mut w2 = WorkRecord::new();
        let r = a.alloc(unaligned(1, SZ_4G), &mut w2);
        check(&a);
        (r, w2)
    }

    /// Before 5.11 the first fit does not retry from the limit: space freed above the
    /// 32-bit cursor is not found, the request fails.
    #[test]
    fn without_the_retry_space_above_the_cursor_is_not_found() {
        let (with, w) = freed_above_the_cursor(LinuxTreeVariant::default());
        assert_eq!(with.unwrap().start, Iova::new(SZ_4G - G));
        assert_eq!(w.iova_tree_retries, 1);

        let old = LinuxTreeVariant {
            retry_from_limit: false,
            ..LinuxTreeVariant::default()
        };
        let (without, w) = freed_above_the_cursor(old);
        assert!(matches!(
            without,
            Err(IovaError::Exhausted { pages: 1, .. })
        ));
        assert_eq!(w.iova_tree_retries, 0);
        assert_eq!(w.alloc_failures, 1);
    }

    /// Fills the space below 4 GiB with 64 MiB blocks (63 fit above page 0), frees the top
    /// one (the 32-bit cursor moves up past it), then asks twice for 128 MiB, which no gap
    /// holds; returns the work of the second ask and `max32_alloc_size` after it.
    fn second_full_32bit_request(variant: LinuxTreeVariant) -> (WorkRecord, u64) {
        let a = LinuxIovaAllocator::with_variant(IovaSpaceConfig::new(G, Iova::new(END)), variant)
            .unwrap();
        let mut w = WorkRecord::new();
        let pages = (64 << 20) / G;
        let held: Vec<_> = std::iter::from_fn(|| a.alloc(req(pages, SZ_4G), &mut w).ok()).collect();
        assert_eq!(held.len(), 63);
        a.free(held[0], 0, &mut w).unwrap();
        assert!(a.alloc(req(2 * pages, SZ_4G), &mut w).is_err());
        let mut w2 = WorkRecord::new();
        assert!(a.alloc(req(2 * pages, SZ_4G), &mut w2).is_err());
        (w2, a.max32_alloc_size())
    }

    /// Linux 4.19 has no `max32_alloc_size`: each 32-bit request that cannot fit walks the
    /// nodes below 4 GiB again (from the cursor down); 5.0 on fail it at once.
    #[test]
    fn without_the_fast_fail_a_full_32bit_space_is_walked_every_time() {
        let (w, max32) = second_full_32bit_request(LinuxTreeVariant::default());
        assert_eq!(w.tree_nodes_visited, 0);
        assert_eq!(max32, 2 * (64 << 20) / G);

        let old = LinuxTreeVariant {
            fast_fail_32bit: false,
            retry_from_limit: false,
        };
        let (w, max32) = second_full_32bit_request(old);
        assert!(w.tree_nodes_visited >= 62, "{w:?}");
        assert_eq!(max32, SZ_4G / G, "4.19 records nothing");
        assert_eq!(w.alloc_failures, 1);
    }

    #[test]
    fn freeing_above_the_cursor_moves_it_up() {
        let a = alloc_64(64 * G);
        let mut w = WorkRecord::new();
        let all: Vec<_> = std::iter::from_fn(|| a.alloc(req(1, 64 * G), &mut w).ok()).collect();
        assert_eq!(all.len(), 63);
        a.free(all[0], 0, &mut w).unwrap();

        let mut w2 = WorkRecord::new();
        let b = a.alloc(req(1, 64 * G), &mut w2).unwrap();

        assert_eq!(b, all[0]);
        assert!(w2.tree_nodes_visited < 20, "{w2:?}");
    }

    #[test]
    fn cursor_makes_the_walk_short_after_many_allocations() {
        let a = alloc_64(END);
        let mut w = WorkRecord::new();
        for _ in 0..1000 {
            a.alloc(req(1, END), &mut w).unwrap();
        }

        let mut w2 = WorkRecord::new();
        a.alloc(req(1, END), &mut w2).unwrap();

        // Cursor + one prev step + insertion descent and fixup: far below 1000.
        assert!(w2.tree_nodes_visited < 40, "{w2:?}");
        assert_eq!(w2.lock_count(LockId::IovaTree), 1);
    }

    #[test]
    fn double_free_is_rejected_and_changes_nothing() {
        let a = alloc_64(END);
        let mut w = WorkRecord::new();
        let b1 = a.alloc(req(2, END), &mut w).unwrap();
        let b2 = a.alloc(req(2, END), &mut w).unwrap();
        a.free(b1, 0, &mut w).unwrap();

        let r = a.free(b1, 0, &mut w);

        assert_eq!(
            r,
            Err(IovaError::NotAllocated {
                start: b1.start.get(),
                pages: 2
            })
        );
        assert_eq!(a.live_blocks(), 1);
        assert_eq!(a.alloc(req(2, END), &mut w).unwrap(), b1);
        assert!(a
            .ranges()
            .contains(&(b2.start.get() / G, b2.start.get() / G + 1)));
    }

    #[test]
    fn free_of_a_range_not_allocated_exactly_is_rejected() {
        let a = alloc_64(END);
        let mut w = WorkRecord::new();
        let b = a.alloc(req(4, END), &mut w).unwrap();

        let part = IovaBlock {
            start: b.start,
            pages: 2,
        };
        let inner = IovaBlock {
            start: b.start.add(G),
            pages: 3,
        };
        let never = IovaBlock {
            start: Iova::new(SZ_1G),
            pages: 1,
        };
        let anchor = IovaBlock {
            start: Iova::new(END),
            pages: 1,
        };

        assert_bad_frees_refused(&a, &[part, inner, never, anchor], &mut w);
        a.free(b, 0, &mut w).unwrap();
        assert_eq!(a.live_blocks(), 0);
    }

    #[test]
    fn zero_pages_and_too_low_limit_are_rejected() {
        let a = alloc_64(END);
        let mut w = WorkRecord::new();

        assert_eq!(
            a.alloc(req(0, END), &mut w),
            Err(IovaError::BadSize { pages: 0 })
        );
        assert_eq!(
            a.alloc(req(1, G), &mut w),
            Err(IovaError::LimitTooLow { limit: G, start: G })
        );
        assert_eq!(
            a.alloc(req(END / G, END), &mut w),
            Err(IovaError::BadSize { pages: END / G })
        );
        assert_eq!(a.live_blocks(), 0);
        assert_eq!(w.lock_count(LockId::IovaTree), 0);
        assert_eq!(
            a.alloc(req(1, END), &mut w).unwrap().start,
            Iova::new(END - G)
        );
    }

    #[test]
    fn free_batch_takes_the_tree_lock_once_and_skips_bad_ranges() {
        let a = alloc_64(END);
        let mut w = WorkRecord::new();
        let mut blocks: Vec<_> = (0..10)
            .map(|_| a.alloc(req(1, END), &mut w).unwrap())
            .collect();
        blocks.push(IovaBlock {
            start: Iova::new(G),
            pages: 1,
        });

        let mut w2 = WorkRecord::new();
        let freed = a.free_batch(&blocks, 0, &mut w2);

        assert_eq!(freed, 10);
        assert_eq!(w2.lock_count(LockId::IovaTree), 1);
        assert_eq!(a.live_blocks(), 0);
    }

    #[test]
    fn bad_configs_are_errors() {
        let bad = [
            IovaSpaceConfig::new(3000, Iova::new(END)),
            IovaSpaceConfig::new(G, Iova::new(END + 1)),
            IovaSpaceConfig {
                start_pfn: 0,
                ..IovaSpaceConfig::new(G, Iova::new(END))
            },
            IovaSpaceConfig::new(G, Iova::new(G)),
            IovaSpaceConfig {
                max_live_blocks: 0,
                ..IovaSpaceConfig::new(G, Iova::new(END))
            },
        ];
        for c in bad {
            assert!(LinuxIovaAllocator::new(c).is_err(), "{c:?}");
        }
    }

    #[test]
    fn live_block_cap_is_enforced() {
        let cfg = IovaSpaceConfig {
            max_live_blocks: 2,
            ..IovaSpaceConfig::new(G, Iova::new(END))
        };
        let a = LinuxIovaAllocator::new(cfg).unwrap();
        let mut w = WorkRecord::new();
        a.alloc(req(1, END), &mut w).unwrap();
        a.alloc(req(1, END), &mut w).unwrap();

        assert!(matches!(
            a.alloc(req(1, END), &mut w),
            Err(IovaError::Exhausted { .. })
        ));
    }

    /// `prev` and `next` of every node, with the lowest node's walk counted from its depth,
    /// find the node and count the steps that walking finds and counts, after every alloc and
    /// free of a churn that allocates downwards (the lowest node moves at each allocation) and
    /// frees at random (the lowest node too).
    #[test]
    fn neighbour_steps_count_what_the_walk_counts() {
        let a = alloc_64(1 << 24);
        let mut w = WorkRecord::new();
        let mut live = Vec::new();
        let mut x: u64 = 99;
        for i in 0..3000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            if i % 4 == 3 && !live.is_empty() {
                // Mostly the lowest range, sometimes any.
                let k = if x & 2 == 0 {
                    live.iter()
                        .enumerate()
                        .min_by_key(|(_, b): &(usize, &IovaBlock)| b.start)
                        .unwrap()
                        .0
                } else {
                    (x >> 33) as usize % live.len()
                };
                let b = live.swap_remove(k);
                a.free(b, 0, &mut w).unwrap();
            } else {
                let limit = if x & 1 == 0 { SZ_4G } else { 1 << 24 };
                if let Ok(b) = a.alloc(req(1 + (x >> 62), limit), &mut w) {
                    live.push(b);
                }
            }
            let st = a.state.lock();
            st.tree.check();
            if i % 7 == 0 || i > 2900 {
                for n in st.tree.linked() {
                    for dir in [LEFT, RIGHT] {
                        let (mut fast, mut slow) = (WorkRecord::new(), WorkRecord::new());
                        let got = if dir == LEFT {
                            st.tree.prev(n, &mut fast)
                        } else {
                            st.tree.next(n, &mut fast)
                        };
                        assert_eq!(got, st.tree.step_walked(n, dir, &mut slow));
                        assert_eq!(fast.tree_nodes_visited, slow.tree_nodes_visited);
                    }
                }
            }
        }
        assert!(w.tree_rotations > 0);
    }

    #[test]
    fn tree_stays_balanced_under_churn() {
        let a = alloc_64(END);
        let mut w = WorkRecord::new();
        let mut live = Vec::new();
        let mut x: u64 = 12345;
        for i in 0..5000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            if i % 3 != 2 || live.is_empty() {
                let pages = 1 + (x >> 60);
                let limit = if x & 1 == 0 { SZ_4G } else { END };
                if let Ok(b) = a.alloc(req(pages, limit), &mut w) {
                    live.push(b);
                }
            } else {
                let b = live.swap_remove((x >> 33) as usize % live.len());
                a.free(b, 0, &mut w).unwrap();
            }
        }
        let ranges = check(&a);
        assert_eq!(ranges.len(), live.len() + 1);
        assert!(w.tree_rotations > 0);
    }
}
