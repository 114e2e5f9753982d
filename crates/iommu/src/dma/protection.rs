//! Protection accounting: what a domain leaves a device able to reach.
//!
//! Every [`Domain`](super::Domain) counts, as it works, the ways its mode falls short of
//! "a device reaches exactly the bytes it was given, for exactly as long as it was given
//! them", and reports them as a [`ProtectionStats`] ([`Domain::protection`](super::Domain::protection)):
//!
//! - **Stale hits**: device accesses that reached memory through an IOVA the driver had
//!   already unmapped, because the invalidation of the IOTLB had not completed yet (the lazy
//!   window). The generic domain has no IOTLB of its own, so it assumes the worst an IOTLB
//!   allows: in lazy mode, every page unmapped since the last completed flush is still
//!   cached and still translates to its old page, with its old permissions, until the flush
//!   queue's whole-domain invalidation completes. In strict mode the unmap waits for the
//!   invalidation, so nothing stays reachable and the count is zero by construction (a test
//!   checks it). (The SMMUv3 model has a real IOTLB and counts real stale hits in
//!   `WorkRecord::iotlb_stale_hits`.)
//! - **Reachable after unmap**: the longest time, on the caller's clock (the `now_ns` passed
//!   to unmap and to the flush-queue calls), from an unmap to the completion of the flush that
//!   made its page unreachable. Strict mode: 0. Pages still waiting are counted up to the
//!   latest clock the domain has seen.
//! - **Sub-page exposure**: an IOMMU maps whole pages, so a 512-byte buffer exposes the rest
//!   of its page to the device. For each translated mapping, the page-rounded length minus
//!   the length asked for; summed over every mapping made, and the largest one.
//! - **Bypass accesses**: device accesses that no page table checked (no IOMMU, or a
//!   passthrough / identity domain). The other models count theirs the same way (SBA bypass,
//!   pseries direct DDW).
//! - **Faults**: device accesses the IOMMU refused, as translation faults (nothing mapped)
//!   and permission faults (mapped, but not for this direction).
//!
//! The counters are atomics updated with relaxed ordering: they are statistics, read after
//! the work is done, and cost no lock on the hot paths.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};

use super::FaultReason;
use crate::addr::{PhysAddr, Prot};

/// What a domain (or another DMA path) has left a device able to reach. See the module docs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProtectionStats {
    /// Device accesses that hit a translation whose mapping the driver had removed.
    pub stale_hits: u64,
    /// Bytes those accesses moved.
    pub stale_bytes: u64,
    /// Longest time (ns, caller's clock) from an unmap until its page stopped translating.
    pub max_reachable_after_unmap_ns: u64,
    /// Pages (granules) unmapped whose invalidation was deferred (lazy mode).
    pub deferred_unmaps: u64,
    /// Bytes of whole IOMMU pages mapped beyond what the drivers asked for, summed over every
    /// mapping made.
    pub subpage_exposed_bytes: u64,
    /// The largest such excess of one mapping.
    pub max_subpage_exposed_bytes: u64,
    /// Device accesses that bypassed translation.
    pub bypass_accesses: u64,
    /// Device accesses refused because nothing was mapped (or beyond the DMA mask).
    pub translation_faults: u64,
    /// Device accesses refused for lack of permission.
    pub permission_faults: u64,
}

impl ProtectionStats {
    /// Adds `other` into `self` (sums; the maxima take the larger).
    pub fn merge(&mut self, other: &ProtectionStats) {
        self.stale_hits += other.stale_hits;
        self.stale_bytes += other.stale_bytes;
        self.max_reachable_after_unmap_ns = self
            .max_reachable_after_unmap_ns
            .max(other.max_reachable_after_unmap_ns);
        self.deferred_unmaps += other.deferred_unmaps;
        self.subpage_exposed_bytes += other.subpage_exposed_bytes;
        self.max_subpage_exposed_bytes = self
            .max_subpage_exposed_bytes
            .max(other.max_subpage_exposed_bytes);
        self.bypass_accesses += other.bypass_accesses;
        self.translation_faults += other.translation_faults;
        self.permission_faults += other.permission_faults;
    }
}

/// Running counters behind a [`ProtectionStats`]; thread-safe, lock-free.
#[derive(Debug, Default)]
pub struct ProtectionCounters {
    stale_hits: AtomicU64,
    stale_bytes: AtomicU64,
    max_reachable_ns: AtomicU64,
    deferred_unmaps: AtomicU64,
    subpage_exposed: AtomicU64,
    max_subpage_exposed: AtomicU64,
    bypass: AtomicU64,
    translation_faults: AtomicU64,
    permission_faults: AtomicU64,
    /// The latest caller clock seen (for windows still open).
    latest_now_ns: AtomicU64,
}

impl ProtectionCounters {
    /// All zero.
    pub fn new() -> Self {
        Self::default()
    }

    /// A mapping of `requested` bytes that maps `mapped` bytes of whole pages.
    pub fn record_mapping(&self, requested: u64, mapped: u64) {
        let excess = mapped.saturating_sub(requested);
        if excess > 0 {
            self.subpage_exposed.fetch_add(excess, Ordering::Relaxed);
            self.max_subpage_exposed
                .fetch_max(excess, Ordering::Relaxed);
        }
    }

    /// A device access that no page table checked.
    pub fn record_bypass(&self) {
        self.bypass.fetch_add(1, Ordering::Relaxed);
    }

    /// A device access of `bytes` that went through at least one stale translation.
    pub fn record_stale_hit(&self, bytes: u64) {
        self.stale_hits.fetch_add(1, Ordering::Relaxed);
        self.stale_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    /// A refused device access.
    pub fn record_fault(&self, reason: &FaultReason) {
        match reason {
            FaultReason::Permission { .. } => {
                self.permission_faults.fetch_add(1, Ordering::Relaxed);
            }
            FaultReason::Unmapped | FaultReason::BeyondMask { .. } => {
                self.translation_faults.fetch_add(1, Ordering::Relaxed);
            }
            // Translated, but to memory that is not there: not the IOMMU's refusal.
            FaultReason::OutsideMemory { .. } => {}
        }
    }

    /// A page unmapped at `unmapped_at_ns` stopped translating at `flushed_at_ns`.
    pub fn record_window(&self, unmapped_at_ns: u64, flushed_at_ns: u64) {
        self.max_reachable_ns.fetch_max(
            flushed_at_ns.saturating_sub(unmapped_at_ns),
            Ordering::Relaxed,
        );
    }

    /// An unmap whose invalidation was deferred.
    pub fn record_deferred_unmap(&self) {
        self.deferred_unmaps.fetch_add(1, Ordering::Relaxed);
    }

    /// Notes the caller's clock.
    pub fn observe_now(&self, now_ns: u64) {
        self.latest_now_ns.fetch_max(now_ns, Ordering::Relaxed);
    }

    /// The latest caller clock seen.
    pub fn latest_now_ns(&self) -> u64 {
        self.latest_now_ns.load(Ordering::Relaxed)
    }

    /// The counters as they stand.
    pub fn snapshot(&self) -> ProtectionStats {
        let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ProtectionStats {
            stale_hits: r(&self.stale_hits),
            stale_bytes: r(&self.stale_bytes),
            max_reachable_after_unmap_ns: r(&self.max_reachable_ns),
            deferred_unmaps: r(&self.deferred_unmaps),
            subpage_exposed_bytes: r(&self.subpage_exposed),
            max_subpage_exposed_bytes: r(&self.max_subpage_exposed),
            bypass_accesses: r(&self.bypass),
            translation_faults: r(&self.translation_faults),
            permission_faults: r(&self.permission_faults),
        }
    }
}

/// One unmapped run whose invalidation has not completed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct StaleRun {
    len: u64,
    pa: PhysAddr,
    prot: Prot,
    unmapped_at_ns: u64,
    /// The flush queue's start counter when the run was queued (`None`: not queued yet).
    stamp: Option<u64>,
}

/// What a lazy domain's IOTLB may still hold: runs unmapped from the page table whose flush
/// has not completed, keyed by IOVA. Bounded by the flush queue (every run in it is waiting
/// in a flush-queue ring).
///
/// Every operation costs O(log n) in the runs held (amortised: a run is stamped once and
/// retired once). Beside the runs by IOVA, two indexes: the runs not stamped yet (in the
/// order they were unmapped) and the stamped ones by stamp, so a completed flush retires the
/// runs it covers without looking at the others; and the unmap times held, for the longest
/// open window. At 128 CPUs a lazy domain holds tens of thousands of runs, and walking all of
/// them on every unmap was most of a run's host time (docs/model/scale.md).
#[derive(Debug, Default)]
pub(crate) struct StaleSet {
    runs: BTreeMap<u64, StaleRun>,
    /// IOVAs of runs inserted but not stamped yet. An entry whose run was replaced or is
    /// already stamped is skipped when it is drained.
    unstamped: Vec<u64>,
    /// Stamped runs by stamp: (stamp, IOVA). An entry whose run is gone or carries another
    /// stamp is skipped when it is retired.
    by_stamp: BTreeSet<(u64, u64)>,
    /// How many runs held were unmapped at each time (for the longest open window).
    unmapped_at: BTreeMap<u64, u32>,
}

/// A stale translation found for one address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct StaleTranslation {
    /// Physical address of the looked-up byte.
    pub pa: PhysAddr,
    /// The permissions the mapping had.
    pub prot: Prot,
    /// Bytes from the looked-up byte to the end of the run.
    pub remaining: u64,
}

impl StaleSet {
    /// Records `len` bytes at `iova` (mapped to `pa` with `prot`) as unmapped at
    /// `now_ns` but not yet invalidated.
    pub(crate) fn insert(&mut self, iova: u64, len: u64, pa: PhysAddr, prot: Prot, now_ns: u64) {
        let run = StaleRun {
            len,
            pa,
            prot,
            unmapped_at_ns: now_ns,
            stamp: None,
        };
        if let Some(old) = self.runs.insert(iova, run) {
            self.forget(iova, &old);
        }
        self.unstamped.push(iova);
        *self.unmapped_at.entry(now_ns).or_insert(0) += 1;
    }

    /// Drops `old` (no longer in `runs`, at `iova`) from the indexes that count it.
    fn forget(&mut self, iova: u64, old: &StaleRun) {
        if let Some(s) = old.stamp {
            self.by_stamp.remove(&(s, iova));
        }
        if let Some(n) = self.unmapped_at.get_mut(&old.unmapped_at_ns) {
            *n -= 1;
            if *n == 0 {
                self.unmapped_at.remove(&old.unmapped_at_ns);
            }
        }
    }

    /// Stamps every run not yet stamped with the flush-queue start counter it was queued at.
    pub(crate) fn stamp_pending(&mut self, stamp: u64) {
        for iova in self.unstamped.drain(..) {
            if let Some(r) = self.runs.get_mut(&iova) {
                if r.stamp.is_none() {
                    r.stamp = Some(stamp);
                    self.by_stamp.insert((stamp, iova));
                }
            }
        }
    }

    /// Drops every run a completed flush covers (stamp below `finished`), recording its
    /// window as closed at `now_ns`.
    pub(crate) fn retire(&mut self, finished: u64, now_ns: u64, counters: &ProtectionCounters) {
        while let Some(&(stamp, iova)) = self.by_stamp.first() {
            if stamp >= finished {
                break;
            }
            self.by_stamp.pop_first();
            let Some(run) = self.runs.remove(&iova) else {
                continue;
            };
            counters.record_window(run.unmapped_at_ns, now_ns);
            self.forget(iova, &run);
        }
    }

    /// The longest window still open at `now_ns`.
    pub(crate) fn open_window_ns(&self, now_ns: u64) -> u64 {
        self.unmapped_at
            .keys()
            .next()
            .map_or(0, |&t| now_ns.saturating_sub(t))
    }

    /// The stale translation of `iova`, if one is held.
    pub(crate) fn lookup(&self, iova: u64) -> Option<StaleTranslation> {
        let (&start, r) = self.runs.range(..=iova).next_back()?;
        let off = iova - start;
        (off < r.len).then(|| StaleTranslation {
            pa: r.pa.add(off),
            prot: r.prot,
            remaining: r.len - off,
        })
    }

    /// Runs held.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.runs.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mapping_excess_is_summed_and_its_maximum_kept() {
        let c = ProtectionCounters::new();
        c.record_mapping(512, 4096);
        c.record_mapping(4096, 4096);
        c.record_mapping(5000, 8192);
        let s = c.snapshot();
        assert_eq!(s.subpage_exposed_bytes, 3584 + 3192);
        assert_eq!(s.max_subpage_exposed_bytes, 3584);
    }

    #[test]
    fn stale_runs_translate_until_a_covering_flush_retires_them() {
        let c = ProtectionCounters::new();
        let mut s = StaleSet::default();
        s.insert(0x1000, 0x2000, PhysAddr::new(0x8000), Prot::READ, 100);
        assert_eq!(s.lookup(0x0fff), None);
        let t = s.lookup(0x1800).unwrap();
        assert_eq!((t.pa, t.remaining), (PhysAddr::new(0x8800), 0x1800));
        assert_eq!(s.lookup(0x3000), None);
        // Not stamped yet: no flush retires it.
        s.retire(u64::MAX, 500, &c);
        assert_eq!(s.len(), 1);
        s.stamp_pending(3);
        s.retire(3, 600, &c);
        assert_eq!(
            s.len(),
            1,
            "a flush that started before the queueing does not cover it"
        );
        assert_eq!(s.open_window_ns(700), 600);
        s.retire(4, 900, &c);
        assert_eq!(s.len(), 0);
        assert_eq!(c.snapshot().max_reachable_after_unmap_ns, 800);
    }

    /// The set as it was before it kept indexes: every operation walks all runs. The
    /// reference the indexed set must agree with.
    #[derive(Default)]
    struct NaiveStaleSet {
        runs: BTreeMap<u64, StaleRun>,
    }

    impl NaiveStaleSet {
        fn insert(&mut self, iova: u64, len: u64, now_ns: u64) {
            let run = StaleRun {
                len,
                pa: PhysAddr::new(iova << 1),
                prot: Prot::READ,
                unmapped_at_ns: now_ns,
                stamp: None,
            };
            self.runs.insert(iova, run);
        }
        fn stamp_pending(&mut self, stamp: u64) {
            for r in self.runs.values_mut().filter(|r| r.stamp.is_none()) {
                r.stamp = Some(stamp);
            }
        }
        fn retire(&mut self, finished: u64, now_ns: u64, c: &ProtectionCounters) {
            self.runs.retain(|_, r| match r.stamp {
                Some(s) if s < finished => {
                    c.record_window(r.unmapped_at_ns, now_ns);
                    false
                }
                _ => true,
            });
        }
        fn open_window_ns(&self, now_ns: u64) -> u64 {
            let oldest = self.runs.values().map(|r| r.unmapped_at_ns).min();
            oldest.map_or(0, |t| now_ns.saturating_sub(t))
        }
    }

    #[derive(Clone, Debug)]
    enum Op {
        Insert { page: u64, pages: u64 },
        Stamp(u64),
        Retire(u64),
        Tick(u64),
    }

    fn op() -> impl proptest::strategy::Strategy<Value = Op> {
        use proptest::prelude::*;
        prop_oneof![
            4 => (0u64..64, 1u64..4).prop_map(|(page, pages)| Op::Insert { page, pages }),
            2 => (0u64..12).prop_map(Op::Stamp),
            2 => (0u64..14).prop_map(Op::Retire),
            1 => (1u64..50).prop_map(Op::Tick),
        ]
    }

    proptest::proptest! {
        /// Any sequence of inserts (including replacing a held run), stamps (in any order)
        /// and retirements leaves the indexed set with the same runs, lookups, windows and
        /// open window as the walk-everything reference.
        #[test]
        fn indexed_stale_set_agrees_with_the_naive_one(ops in proptest::collection::vec(op(), 1..120)) {
            let (c_fast, c_ref) = (ProtectionCounters::new(), ProtectionCounters::new());
            let (mut fast, mut naive) = (StaleSet::default(), NaiveStaleSet::default());
            let mut now = 0u64;
            for op in ops {
                match op {
                    Op::Insert { page, pages } => {
                        let (iova, len) = (page << 12, pages << 12);
                        fast.insert(iova, len, PhysAddr::new(iova << 1), Prot::READ, now);
                        naive.insert(iova, len, now);
                    }
                    Op::Stamp(s) => {
                        fast.stamp_pending(s);
                        naive.stamp_pending(s);
                    }
                    Op::Retire(f) => {
                        fast.retire(f, now, &c_fast);
                        naive.retire(f, now, &c_ref);
                    }
                    Op::Tick(d) => now += d,
                }
                proptest::prop_assert_eq!(fast.len(), naive.runs.len());
                proptest::prop_assert_eq!(fast.open_window_ns(now + 7), naive.open_window_ns(now + 7));
                proptest::prop_assert_eq!(c_fast.snapshot(), c_ref.snapshot());
            }
            for (&iova, r) in &naive.runs {
                proptest::prop_assert_eq!(fast.runs.get(&iova), Some(r));
                let t = fast.lookup(iova + 5).unwrap();
                proptest::prop_assert_eq!(t.remaining, r.len - 5);
            }
        }
    }

    #[test]
    fn faults_are_sorted_by_kind() {
        let c = ProtectionCounters::new();
        c.record_fault(&FaultReason::Unmapped);
        c.record_fault(&FaultReason::BeyondMask { mask_bits: 32 });
        c.record_fault(&FaultReason::Permission {
            needed: Prot::WRITE,
            had: Prot::READ,
        });
        c.record_fault(&FaultReason::OutsideMemory { pa: 0 });
        let s = c.snapshot();
        assert_eq!((s.translation_faults, s.permission_faults), (2, 1));
    }
}
