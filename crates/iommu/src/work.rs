//! Work records: exact counts of the primitive steps an operation took.
//!
//! The functional stack knows nothing of time. Every operation instead adds what it did to a
//! [`WorkRecord`] the caller passes in (PTEs written, tree nodes visited, locks taken, ...).
//! The lab turns those counts into virtual time through a platform profile, so the counts
//! must be exact: a magazine miss costs a tree walk in the lab because the walk happened.
//!
//! Records are plain counters, cheap to update on hot paths, and can be summed with `+=`.

use std::fmt;
use std::ops::AddAssign;

/// A lock (or lock class) whose acquisitions are counted.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, PartialOrd, Ord)]
#[repr(usize)]
pub enum LockId {
    /// The IOVA tree's lock (Linux `iova_rbtree_lock`, or the gap tree's lock).
    IovaTree,
    /// A per-CPU IOVA magazine cache lock.
    RcacheCpu,
    /// The shared magazine depot lock.
    RcacheDepot,
    /// One of the POWER bitmap allocator's per-CPU-hashed pool locks.
    TcePool,
    /// The POWER bitmap allocator's large-pool lock.
    TceLargePool,
    /// The SBA resource-map lock.
    SbaResource,
    /// A domain's page-table lock.
    PageTable,
    /// A per-CPU lazy-invalidation flush queue lock.
    FlushQueue,
    /// An IOMMU command queue's lock (spinlock producer design).
    CmdqLock,
    /// The command queue's shared lock held while waiting for a sync (lock-free design).
    CmdqSharedLock,
    /// Any other lock.
    Other,
}

impl LockId {
    /// Number of lock ids.
    pub const COUNT: usize = 11;
    /// All lock ids, in declaration order.
    pub const ALL: [LockId; Self::COUNT] = [
        LockId::IovaTree,
        LockId::RcacheCpu,
        LockId::RcacheDepot,
        LockId::TcePool,
        LockId::TceLargePool,
        LockId::SbaResource,
        LockId::PageTable,
        LockId::FlushQueue,
        LockId::CmdqLock,
        LockId::CmdqSharedLock,
        LockId::Other,
    ];

    /// A stable snake_case name for reports and JSON.
    pub const fn name(self) -> &'static str {
        match self {
            LockId::IovaTree => "iova_tree",
            LockId::RcacheCpu => "rcache_cpu",
            LockId::RcacheDepot => "rcache_depot",
            LockId::TcePool => "tce_pool",
            LockId::TceLargePool => "tce_large_pool",
            LockId::SbaResource => "sba_resource",
            LockId::PageTable => "page_table",
            LockId::FlushQueue => "flush_queue",
            LockId::CmdqLock => "cmdq_lock",
            LockId::CmdqSharedLock => "cmdq_shared_lock",
            LockId::Other => "other",
        }
    }
}

macro_rules! work_counters {
    ($( $(#[$doc:meta])* $field:ident ),* $(,)?) => {
        /// Counts of the primitive steps one or more operations took. See the module docs.
        #[derive(Clone, Copy, PartialEq, Eq, Default)]
        pub struct WorkRecord {
            $( $(#[$doc])* pub $field: u64, )*
            /// Lock acquisitions, indexed by [`LockId`] (use [`WorkRecord::lock`]).
            pub locks: [u64; LockId::COUNT],
        }

        impl WorkRecord {
            /// Every plain counter as `(name, value)`, in declaration order (locks excluded).
            pub fn counters(&self) -> [(&'static str, u64); WORK_COUNTER_COUNT] {
                [ $( (stringify!($field), self.$field), )* ]
            }
        }

        impl AddAssign<&WorkRecord> for WorkRecord {
            fn add_assign(&mut self, rhs: &WorkRecord) {
                $( self.$field += rhs.$field; )*
                for (a, b) in self.locks.iter_mut().zip(rhs.locks.iter()) {
                    *a += *b;
                }
            }
        }

        /// Number of plain counters in a [`WorkRecord`].
        pub const WORK_COUNTER_COUNT: usize = [ $( stringify!($field), )* ].len();
    };
}

work_counters! {
    // Page tables.
    /// Page-table entries written (a new leaf or table descriptor).
    ptes_written,
    /// Page-table entries cleared.
    ptes_cleared,
    /// Page-table entries read while walking (software walks on map, unmap and lookup).
    pte_reads,
    /// Page-table pages allocated.
    tables_allocated,
    /// Page-table pages freed.
    tables_freed,
    /// Cache-line cleans for a non-coherent table walker (one per PTE write batch).
    cache_cleans,
    // IOVA allocators.
    /// Tree nodes visited by an IOVA allocator (search, insert, delete, rebalance).
    tree_nodes_visited,
    /// Tree rotations performed while rebalancing.
    tree_rotations,
    /// Per-CPU magazine cache hits.
    magazine_hits,
    /// Per-CPU magazine cache misses (the request fell through to the tree).
    magazine_misses,
    /// Magazines exchanged with the shared depot.
    depot_exchanges,
    /// Whole-cache flushes after an allocation failure.
    rcache_flushes,
    /// 64-bit bitmap words scanned by a bitmap allocator.
    bitmap_words_scanned,
    /// IOVA allocations that failed.
    alloc_failures,
    // DMA API and invalidation.
    /// Range invalidations issued (one per gathered range).
    inval_ranges,
    /// Pages covered by range invalidations.
    inval_pages,
    /// Walk-cache (non-leaf) invalidations for freed table pages.
    inval_walks,
    /// Whole-domain (by ASID / context) invalidations.
    inval_domains,
    /// Invalidation syncs waited for.
    inval_syncs,
    /// IOVAs queued on a lazy flush queue.
    flush_queue_adds,
    /// Lazy flush-queue flushes (full queue or timeout).
    flush_queue_flushes,
    /// IOVAs returned to the allocator after their flush completed.
    flush_queue_frees,
    /// Bytes copied by the device side (`dma_read` / `dma_write`).
    dma_bytes,
    /// Translations performed by the device side.
    translations,
    // Hardware models (issue 3 and later).
    /// Commands written to an IOMMU command queue.
    commands_written,
    /// Compare-and-swap attempts on a shared index.
    cas_attempts,
    /// Compare-and-swap attempts that failed and had to retry.
    cas_failures,
    /// Command-queue owner elections won.
    owner_elections,
    /// Register or memory polls while waiting for hardware.
    polls,
    /// Hypercalls issued.
    hypercalls,
    /// TCEs written or cleared by hypercalls.
    tces_touched,
    /// Batched purges (SBA) issued.
    purges,
    /// IOTLB lookups that hit.
    iotlb_hits,
    /// IOTLB lookups that missed.
    iotlb_misses,
    /// IOTLB hits on entries whose mapping was already removed.
    iotlb_stale_hits,
    /// Memory reads by the hardware page-table walker.
    walk_reads,
    /// Hardware walks that found no walk-cache (paging-structure-cache) entry and read every
    /// level from the root: a subset of the walks behind `walk_reads`.
    full_walks,
    /// MMIO register writes.
    mmio_writes,
    /// MMIO register reads.
    mmio_reads,
    // IOVA allocation variants (issue 17): subsets of work counted above.
    /// Second passes of the IOVA tree's first fit, from the request's limit down to the
    /// cursor (Linux 5.11+, `iova_find_limit`).
    iova_tree_retries,
    /// PCI 32-bit-first tries that found nothing below 4 GiB (dma-iommu's SAC trick).
    iova_32bit_failures,
    /// Allocations of a PCI device with a wider-than-32-bit mask made from the full range:
    /// after a failed 32-bit try, or (6.6+) once the device stopped trying.
    iova_full_range_allocs,
}

impl WorkRecord {
    /// An empty record.
    #[inline]
    pub fn new() -> Self {
        Self::default()
    }

    /// Counts one acquisition of `lock`.
    #[inline]
    pub fn lock(&mut self, lock: LockId) {
        self.locks[lock as usize] += 1;
    }

    /// Acquisitions of `lock` so far.
    #[inline]
    pub fn lock_count(&self, lock: LockId) -> u64 {
        self.locks[lock as usize]
    }

    /// Whether nothing was counted.
    pub fn is_empty(&self) -> bool {
        *self == WorkRecord::default()
    }
}

impl AddAssign for WorkRecord {
    fn add_assign(&mut self, rhs: WorkRecord) {
        *self += &rhs;
    }
}

impl fmt::Debug for WorkRecord {
    /// Prints only the non-zero counters, which keeps test failures readable.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut map = f.debug_map();
        for (name, value) in self.counters() {
            if value != 0 {
                map.entry(&name, &value);
            }
        }
        for id in LockId::ALL {
            let n = self.locks[id as usize];
            if n != 0 {
                map.entry(&format_args!("lock.{}", id.name()), &n);
            }
        }
        map.finish()
    }
}
