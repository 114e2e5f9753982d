//! Lazy invalidation: per-CPU flush queues of IOVAs waiting for an IOTLB flush (Linux
//! "DMA-FQ", `queue_iova` / `fq_flush_iotlb` / `fq_ring_free` in dma-iommu.c).
//!
//! In lazy mode an unmap clears the page table but does not invalidate the IOTLB: the IOVA
//! goes onto the unmapping CPU's ring instead, stamped with the current flush-start counter.
//! A *flush* increments the start counter, invalidates the whole domain, waits for it
//! ([`Invalidator::sync`]) and increments the finish counter. An entry may be freed once a
//! flush that started after it was queued has finished: its stamp is below the finish
//! counter. A ring is flushed when it is full (a ring of `ring_size` slots holds
//! `ring_size - 1` entries, as Linux's does, so the 256th entry triggers the flush), and
//! every ring is flushed and drained when the timer expires: the timer is armed by the first
//! entry queued while it is off, and fires `timeout_ns` later (10 ms by default). There is no
//! clock here; callers pass `now_ns` and the timer fires on the first call at or past the
//! deadline ([`FlushQueue::poll_timeout`]).
//!
//! Two opt-in variants ([`FlushQueueVariant`], default: today's behaviour): one ring shared by
//! every CPU instead of one per CPU ([`FlushQueueShape::Single`], Linux 6.7, with its 32,768
//! slots and 1 s timeout in [`FlushQueueConfig::LINUX_SINGLE`]), and freeing the timer path's
//! entries on the CPU the timer fires on, as Linux does, instead of on each ring's CPU
//! ([`TimerFreeCpu`]), which decides whose per-CPU IOVA cache receives them.
//!
//! Freeing before flushing is hard to write: the rings hold [`StaleIova`]s, which have no
//! public constructor and no accessor to their range; the only way to the range is
//! [`StaleIova::release`], which takes a [`FlushCompleted`] token that only a finished
//! flush of the same queue hands out, and checks the stamp against it. The strict path uses
//! the same discipline with [`SyncCompleted`].
//!
//! ```compile_fail
//! use iolab_iommu::dma::flush_queue::StaleIova;
//! use iolab_iommu::iova::IovaBlock;
//! // The range inside a stale IOVA cannot be taken out to free it early.
//! fn sneak(stale: StaleIova) -> IovaBlock {
//!     stale.block
//! }
//! ```

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::iova::{IovaAllocator, IovaBlock, IovaError};
use crate::work::{LockId, WorkRecord};

use super::invalidate::{sync, Invalidator, SyncCompleted};
use super::{DmaError, DomainId};

/// Timer value meaning "not armed".
const TIMER_OFF: u64 = u64::MAX;

/// Source of queue identities, so a token from one queue cannot release another's entries.
static NEXT_QUEUE_ID: AtomicU64 = AtomicU64::new(1);

/// Sizing of a flush queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlushQueueConfig {
    /// Slots per CPU ring (Linux: 256). A ring holds one entry fewer than its slots.
    pub ring_size: usize,
    /// Time from the first queued entry to the timer flush (Linux: 10 ms).
    pub timeout_ns: u64,
}

impl FlushQueueConfig {
    /// Largest ring accepted (Linux's single-queue variant uses 32,768).
    pub const MAX_RING_SIZE: usize = 1 << 20;

    /// Linux's per-CPU sizing (`IOVA_DEFAULT_FQ_SIZE` 256, `IOVA_DEFAULT_FQ_TIMEOUT` 10 ms;
    /// unchanged since the flush queue appeared in 4.14). Same as [`Default`].
    pub const LINUX_PER_CPU: FlushQueueConfig = FlushQueueConfig {
        ring_size: 256,
        timeout_ns: 10_000_000,
    };

    /// Linux's single-queue sizing (`IOVA_SINGLE_FQ_SIZE` 32,768, `IOVA_SINGLE_FQ_TIMEOUT`
    /// 1000 ms): "iommu/dma: Use a large flush queue and timeout for shadow_on_flush",
    /// Niklas Schnelle, v6.7. Use with [`FlushQueueShape::Single`].
    pub const LINUX_SINGLE: FlushQueueConfig = FlushQueueConfig {
        ring_size: 32_768,
        timeout_ns: 1_000_000_000,
    };
}

/// How many rings a flush queue has.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum FlushQueueShape {
    /// One ring per CPU, each behind its own lock (the default; Linux's only shape before 6.7
    /// and its `IOMMU_DMA_OPTS_PER_CPU_QUEUE` since).
    #[default]
    PerCpu,
    /// One ring for the whole domain behind one lock, whichever CPU unmaps
    /// (`IOMMU_DMA_OPTS_SINGLE_QUEUE`: "iommu/dma: Allow a single FQ in addition to per-CPU
    /// FQs", Niklas Schnelle, v6.7). Linux picks it for devices whose IOMMU shadows its
    /// tables on each flush (`shadow_on_flush`: s390, and virtualised IOMMUs that set it),
    /// where a flush is expensive, together with [`FlushQueueConfig::LINUX_SINGLE`].
    Single,
}

/// Which CPU's allocator cache the timer path frees each entry into.
///
/// The free goes to [`IovaAllocator::free`] with a CPU number, and a per-CPU cache
/// (`iova::magazine`) keeps the range on that CPU's magazines: which CPU decides who can
/// reuse the range without a depot exchange.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum TimerFreeCpu {
    /// Each ring's entries are freed on the ring's own CPU (the default, iolab's behaviour so
    /// far; a single ring counts as CPU 0's).
    #[default]
    RingCpu,
    /// Every ring's entries are freed on the CPU the timer fires on, as Linux does:
    /// `fq_flush_timeout` walks every CPU's ring and `fq_ring_free` calls `free_iova_fast`,
    /// whose `iova_rcache_insert` puts the range in the *current* CPU's magazine
    /// (`raw_cpu_ptr`), in every version from 4.14 (iova.c) to today (dma-iommu.c). Here the
    /// timer fires on the CPU of the call that finds it due ([`FlushQueue::queue`] or
    /// [`FlushQueue::poll_timeout_on`]); [`FlushQueue::poll_timeout`], which has no CPU,
    /// falls back to each ring's CPU.
    TimerCpu,
}

/// The variant of the flush-queue algorithm: opt-in choices whose [`Default`] is iolab's
/// behaviour so far. `crate::linux` maps a kernel version to them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FlushQueueVariant {
    /// Per-CPU rings or one ring.
    pub shape: FlushQueueShape,
    /// Where the timer path frees.
    pub timer_free_cpu: TimerFreeCpu,
}

impl Default for FlushQueueConfig {
    fn default() -> Self {
        Self {
            ring_size: 256,
            timeout_ns: 10_000_000,
        }
    }
}

/// An IOVA range whose page-table entries are gone but which IOTLBs may still translate.
/// It cannot be freed until a flush that started after it was queued has finished.
#[derive(Debug)]
pub struct StaleIova {
    block: IovaBlock,
    queue: u64,
    /// The flush-start counter when the range was queued.
    stamp: u64,
}

impl StaleIova {
    /// Turns this range into a freeable one if `done` proves a flush covering it finished;
    /// gives it back unchanged otherwise.
    pub fn release(self, done: &FlushCompleted) -> Result<FreeableIova, StaleIova> {
        if done.queue == self.queue && self.stamp < done.finished {
            Ok(FreeableIova { block: self.block })
        } else {
            Err(self)
        }
    }
}

/// Proof that every flush of one queue up to a finish count has completed. Only a
/// [`FlushQueue`] makes them.
#[derive(Debug)]
pub struct FlushCompleted {
    queue: u64,
    finished: u64,
}

/// An IOVA range that no IOMMU cache can reach any more: safe to return to the allocator.
#[derive(Debug)]
#[must_use = "a freeable IOVA range leaks unless it is freed"]
pub struct FreeableIova {
    block: IovaBlock,
}

impl FreeableIova {
    /// A range whose invalidation was issued before `done`'s sync.
    pub(crate) fn after_sync(block: IovaBlock, done: SyncCompleted) -> Self {
        let _ = done;
        Self { block }
    }

    /// A range that was allocated but never mapped, so nothing can have cached it.
    pub(crate) fn never_mapped(block: IovaBlock) -> Self {
        Self { block }
    }

    /// The range.
    pub fn block(&self) -> IovaBlock {
        self.block
    }

    /// Returns the range to `allocator`.
    pub fn free(
        self,
        allocator: &dyn IovaAllocator,
        cpu: usize,
        work: &mut WorkRecord,
    ) -> Result<(), IovaError> {
        allocator.free(self.block, cpu, work)
    }
}

/// Per-CPU flush queues for one lazy domain. See the module docs.
pub struct FlushQueue {
    id: u64,
    domain: DomainId,
    config: FlushQueueConfig,
    variant: FlushQueueVariant,
    cpus: usize,
    rings: Box<[Mutex<VecDeque<StaleIova>>]>,
    start_cnt: AtomicU64,
    finish_cnt: AtomicU64,
    /// Deadline of the timer flush, or [`TIMER_OFF`].
    deadline: AtomicU64,
    invalidator: Arc<dyn Invalidator>,
    allocator: Arc<dyn IovaAllocator>,
}

impl std::fmt::Debug for FlushQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FlushQueue")
            .field("domain", &self.domain)
            .field("config", &self.config)
            .field("variant", &self.variant)
            .field("cpus", &self.cpus)
            .field("pending", &self.pending())
            .field("flush_counts", &self.flush_counts())
            .finish()
    }
}

impl FlushQueue {
    /// Queues for `cpus` CPUs of `domain`, flushing through `invalidator` and freeing to
    /// `allocator`, with the default [`FlushQueueVariant`].
    pub fn new(
        domain: DomainId,
        cpus: usize,
        config: FlushQueueConfig,
        invalidator: Arc<dyn Invalidator>,
        allocator: Arc<dyn IovaAllocator>,
    ) -> Result<Self, DmaError> {
        Self::with_variant(
            domain,
            cpus,
            config,
            FlushQueueVariant::default(),
            invalidator,
            allocator,
        )
    }

    /// As [`FlushQueue::new`], with a chosen variant (ring shape, timer-path free CPU).
    ///
    /// # Errors
    ///
    /// [`DmaError::Config`] for no CPUs or a ring size outside
    /// `2..=`[`FlushQueueConfig::MAX_RING_SIZE`].
    pub fn with_variant(
        domain: DomainId,
        cpus: usize,
        config: FlushQueueConfig,
        variant: FlushQueueVariant,
        invalidator: Arc<dyn Invalidator>,
        allocator: Arc<dyn IovaAllocator>,
    ) -> Result<Self, DmaError> {
        if cpus == 0 {
            return Err(DmaError::Config {
                reason: "a flush queue needs at least one CPU",
            });
        }
        if !(2..=FlushQueueConfig::MAX_RING_SIZE).contains(&config.ring_size) {
            return Err(DmaError::Config {
                reason: "flush queue rings need between 2 and 2^20 slots",
            });
        }
        let cap = config.ring_size.min(1024);
        let nrings = match variant.shape {
            FlushQueueShape::PerCpu => cpus,
            FlushQueueShape::Single => 1,
        };
        let rings = (0..nrings)
            .map(|_| Mutex::new(VecDeque::with_capacity(cap)))
            .collect();
        Ok(Self {
            id: NEXT_QUEUE_ID.fetch_add(1, Ordering::Relaxed),
            domain,
            config,
            variant,
            cpus,
            rings,
            start_cnt: AtomicU64::new(0),
            finish_cnt: AtomicU64::new(0),
            deadline: AtomicU64::new(TIMER_OFF),
            invalidator,
            allocator,
        })
    }

    /// The sizing the queue was built with.
    pub fn config(&self) -> FlushQueueConfig {
        self.config
    }

    /// The variant the queue was built with.
    pub fn variant(&self) -> FlushQueueVariant {
        self.variant
    }

    /// Queues `block`, whose page-table entries the caller has already cleared, on `cpu`'s
    /// ring (the one ring with [`FlushQueueShape::Single`]). Fires the timer first if `now_ns`
    /// is past its deadline; flushes the ring first if it is full; arms the timer if it is
    /// off. Returns the entry's stamp: the flush-start count when it was queued (a flush
    /// covers it once the finish count exceeds it).
    pub fn queue(
        &self,
        block: IovaBlock,
        cpu: usize,
        now_ns: u64,
        work: &mut WorkRecord,
    ) -> Result<u64, DmaError> {
        if cpu >= self.cpus {
            return Err(DmaError::BadCpu {
                cpu,
                cpus: self.cpus,
            });
        }
        let ring = &self.rings[cpu.min(self.rings.len() - 1)];
        self.fire_if_due(now_ns, Some(cpu), work);
        work.lock(LockId::FlushQueue);
        let mut ring = ring.lock();
        // Entries another CPU's flush already covered go first: that makes a full ring rarer.
        self.free_ready(&mut ring, &self.completed(), cpu, work);
        if ring.len() + 1 >= self.config.ring_size {
            let done = self.flush(work);
            self.free_ready(&mut ring, &done, cpu, work);
        }
        let stamp = self.start_cnt.load(Ordering::SeqCst);
        ring.push_back(StaleIova {
            block,
            queue: self.id,
            stamp,
        });
        work.flush_queue_adds += 1;
        drop(ring);
        let deadline = now_ns
            .saturating_add(self.config.timeout_ns)
            .min(TIMER_OFF - 1);
        let _ =
            self.deadline
                .compare_exchange(TIMER_OFF, deadline, Ordering::SeqCst, Ordering::SeqCst);
        Ok(stamp)
    }

    /// Flushes the domain's IOTLB: start counter up, whole-domain invalidation, sync, finish
    /// counter up. Returns the proof; nothing is freed here.
    pub fn flush(&self, work: &mut WorkRecord) -> FlushCompleted {
        self.start_cnt.fetch_add(1, Ordering::SeqCst);
        self.invalidator.invalidate_domain(self.domain, work);
        let _synced = sync(&*self.invalidator, work);
        let finished = self.finish_cnt.fetch_add(1, Ordering::SeqCst) + 1;
        work.flush_queue_flushes += 1;
        FlushCompleted {
            queue: self.id,
            finished,
        }
    }

    /// Fires the timer if it is armed and `now_ns` is at or past its deadline: flushes once
    /// and frees every ring's covered entries, each on its ring's CPU (no CPU is known here).
    /// Returns whether it fired.
    pub fn poll_timeout(&self, now_ns: u64, work: &mut WorkRecord) -> bool {
        self.fire_if_due(now_ns, None, work)
    }

    /// As [`FlushQueue::poll_timeout`], with the timer firing on `cpu`: with
    /// [`TimerFreeCpu::TimerCpu`] every entry is freed on `cpu`.
    pub fn poll_timeout_on(&self, now_ns: u64, cpu: usize, work: &mut WorkRecord) -> bool {
        self.fire_if_due(now_ns, Some(cpu), work)
    }

    fn fire_if_due(&self, now_ns: u64, cpu: Option<usize>, work: &mut WorkRecord) -> bool {
        let deadline = self.deadline.load(Ordering::SeqCst);
        if deadline == TIMER_OFF || now_ns < deadline {
            return false;
        }
        if self
            .deadline
            .compare_exchange(deadline, TIMER_OFF, Ordering::SeqCst, Ordering::SeqCst)
            .is_err()
        {
            return false; // Another caller fired it.
        }
        let done = self.flush(work);
        self.free_all_rings(&done, cpu, work);
        true
    }

    /// Flushes and frees everything queued (teardown), and turns the timer off. Entries are
    /// freed on their ring's CPU.
    pub fn flush_all(&self, work: &mut WorkRecord) {
        self.deadline.store(TIMER_OFF, Ordering::SeqCst);
        let done = self.flush(work);
        self.free_all_rings(&done, None, work);
    }

    /// Entries queued on all rings.
    pub fn pending(&self) -> usize {
        self.rings.iter().map(|r| r.lock().len()).sum()
    }

    /// The `(start, finish)` flush counters.
    pub fn flush_counts(&self) -> (u64, u64) {
        (
            self.start_cnt.load(Ordering::SeqCst),
            self.finish_cnt.load(Ordering::SeqCst),
        )
    }

    /// When the timer will fire, if it is armed.
    pub fn deadline(&self) -> Option<u64> {
        let d = self.deadline.load(Ordering::SeqCst);
        (d != TIMER_OFF).then_some(d)
    }

    /// Proof of every flush finished so far.
    fn completed(&self) -> FlushCompleted {
        FlushCompleted {
            queue: self.id,
            finished: self.finish_cnt.load(Ordering::SeqCst),
        }
    }

    /// Frees every ring's covered entries; `timer_cpu` is the CPU the timer fired on, if known.
    fn free_all_rings(
        &self,
        done: &FlushCompleted,
        timer_cpu: Option<usize>,
        work: &mut WorkRecord,
    ) {
        for (ring_cpu, ring) in self.rings.iter().enumerate() {
            let cpu = match (self.variant.timer_free_cpu, timer_cpu) {
                (TimerFreeCpu::TimerCpu, Some(cpu)) => cpu,
                _ => ring_cpu,
            };
            work.lock(LockId::FlushQueue);
            self.free_ready(&mut ring.lock(), done, cpu, work);
        }
    }

    /// Frees the entries at the head of `ring` that `done` covers (stamps only grow along
    /// a ring, so the first one it does not cover ends the scan).
    fn free_ready(
        &self,
        ring: &mut VecDeque<StaleIova>,
        done: &FlushCompleted,
        cpu: usize,
        work: &mut WorkRecord,
    ) {
        while let Some(stale) = ring.pop_front() {
            match stale.release(done) {
                Ok(freeable) => {
                    let freed = freeable.free(&*self.allocator, cpu, work);
                    // Every queued block was allocated from this allocator and is queued
                    // once (a StaleIova cannot be copied), so the free cannot fail.
                    debug_assert!(freed.is_ok(), "flush queue free failed: {freed:?}");
                    work.flush_queue_frees += 1;
                }
                Err(stale) => {
                    ring.push_front(stale);
                    break;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::addr::{Iova, SZ_4G};
    use crate::dma::invalidate::ImmediateInvalidator;
    use crate::dma::testutil::SimpleAllocator;
    use crate::iova::AllocRequest;

    struct Fixture {
        fq: FlushQueue,
        inv: Arc<ImmediateInvalidator>,
        alloc: Arc<SimpleAllocator>,
    }

    fn fixture(cpus: usize, ring_size: usize) -> Fixture {
        let inv = Arc::new(ImmediateInvalidator::new());
        let alloc = Arc::new(SimpleAllocator::new(
            4096,
            Iova::new(4096),
            Iova::new(SZ_4G),
        ));
        let config = FlushQueueConfig {
            ring_size,
            timeout_ns: 10_000_000,
        };
        let fq = FlushQueue::new(DomainId(7), cpus, config, inv.clone(), alloc.clone()).unwrap();
        Fixture { fq, inv, alloc }
    }

    fn block(f: &Fixture, w: &mut WorkRecord) -> IovaBlock {
        f.alloc
            .alloc(AllocRequest::new(1, Iova::new(SZ_4G), 0), w)
            .unwrap()
    }

    #[test]
    fn a_full_ring_flushes_once_on_the_256th_entry() {
        let f = fixture(1, 256);
        let mut w = WorkRecord::new();
        for _ in 0..255 {
            let b = block(&f, &mut w);
            f.fq.queue(b, 0, 0, &mut w).unwrap();
        }
        assert_eq!(f.inv.stats().domains, 0);
        assert_eq!(f.fq.pending(), 255);
        let b = block(&f, &mut w);
        f.fq.queue(b, 0, 0, &mut w).unwrap();
        assert_eq!(
            (w.inval_domains, w.inval_syncs, w.flush_queue_flushes),
            (1, 1, 1)
        );
        assert_eq!(w.flush_queue_frees, 255);
        assert_eq!(w.flush_queue_adds, 256);
        assert_eq!(f.fq.pending(), 1);
        assert_eq!(f.alloc.live_blocks(), 1);
    }

    #[test]
    fn the_timer_fires_at_the_deadline_and_frees_every_ring() {
        let f = fixture(2, 256);
        let mut w = WorkRecord::new();
        let (a, b) = (block(&f, &mut w), block(&f, &mut w));
        f.fq.queue(a, 0, 1_000, &mut w).unwrap();
        f.fq.queue(b, 1, 5_000_000, &mut w).unwrap();
        assert_eq!(f.fq.deadline(), Some(10_001_000));
        assert!(!f.fq.poll_timeout(10_000_999, &mut w));
        assert_eq!(f.inv.stats().domains, 0);
        assert!(f.fq.poll_timeout(10_001_000, &mut w));
        assert_eq!(f.inv.stats().domains, 1);
        assert_eq!(f.fq.pending(), 0);
        assert_eq!(f.alloc.live_blocks(), 0);
        assert_eq!(f.fq.deadline(), None);
    }

    #[test]
    fn an_overdue_timer_fires_before_the_next_entry_is_queued() {
        let f = fixture(1, 256);
        let mut w = WorkRecord::new();
        let a = block(&f, &mut w);
        f.fq.queue(a, 0, 0, &mut w).unwrap();
        let b = block(&f, &mut w);
        f.fq.queue(b, 0, 20_000_000, &mut w).unwrap();
        assert_eq!(w.flush_queue_flushes, 1);
        assert_eq!(
            f.fq.pending(),
            1,
            "only the entry queued before the flush is freed"
        );
        assert_eq!(
            f.fq.deadline(),
            Some(30_000_000),
            "the new entry re-arms the timer"
        );
    }

    #[test]
    fn entries_queued_after_a_flush_started_wait_for_the_next_one() {
        let f = fixture(1, 256);
        let mut w = WorkRecord::new();
        let before = f.fq.completed();
        let a = block(&f, &mut w);
        f.fq.queue(a, 0, 0, &mut w).unwrap();
        let mut ring = f.fq.rings[0].lock();
        f.fq.free_ready(&mut ring, &before, 0, &mut w);
        assert_eq!(
            ring.len(),
            1,
            "a token from before the entry releases nothing"
        );
        drop(ring);
        f.fq.flush_all(&mut w);
        assert_eq!(f.fq.pending(), 0);
    }

    #[test]
    fn a_token_from_another_queue_releases_nothing() {
        let f = fixture(1, 256);
        let g = fixture(1, 256);
        let mut w = WorkRecord::new();
        let a = block(&f, &mut w);
        f.fq.queue(a, 0, 0, &mut w).unwrap();
        let foreign = g.fq.flush(&mut w);
        let stale = f.fq.rings[0].lock().pop_front().unwrap();
        assert!(stale.release(&foreign).is_err());
    }

    #[test]
    fn flush_all_frees_everything_and_disarms_the_timer() {
        let f = fixture(3, 8);
        let mut w = WorkRecord::new();
        for i in 0..12 {
            let b = block(&f, &mut w);
            f.fq.queue(b, i % 3, 0, &mut w).unwrap();
        }
        f.fq.flush_all(&mut w);
        assert_eq!(f.fq.pending(), 0);
        assert_eq!(f.alloc.live_blocks(), 0);
        assert_eq!(f.fq.deadline(), None);
        assert_eq!(f.fq.flush_counts(), (1, 1));
        assert_eq!(w.lock_count(LockId::FlushQueue), 12 + 3);
    }

    #[test]
    fn a_bad_cpu_is_an_error_and_queues_nothing() {
        let f = fixture(2, 256);
        let mut w = WorkRecord::new();
        let b = block(&f, &mut w);
        assert_eq!(
            f.fq.queue(b, 2, 0, &mut w),
            Err(DmaError::BadCpu { cpu: 2, cpus: 2 })
        );
        assert_eq!(f.fq.pending(), 0);
        assert_eq!(f.fq.deadline(), None);
    }

    fn variant_fixture(
        cpus: usize,
        config: FlushQueueConfig,
        variant: FlushQueueVariant,
    ) -> Fixture {
        let inv = Arc::new(ImmediateInvalidator::new());
        let alloc = Arc::new(SimpleAllocator::new(
            4096,
            Iova::new(4096),
            Iova::new(SZ_4G),
        ));
        let fq = FlushQueue::with_variant(
            DomainId(7),
            cpus,
            config,
            variant,
            inv.clone(),
            alloc.clone(),
        )
        .unwrap();
        Fixture { fq, inv, alloc }
    }

    /// Entries queued on CPUs 0-2, the timer found due by CPU 3: where do the ranges land in
    /// a per-CPU IOVA cache? Returns (hits on CPU 3, hits on CPU 0) for three allocations
    /// each after the timer.
    fn timer_path_hits(timer_free_cpu: TimerFreeCpu) -> (u64, u64) {
        use crate::iova::linux::{IovaSpaceConfig, LinuxIovaAllocator};
        use crate::iova::magazine::{MagazineCache, MagazineConfig};
        let tree = LinuxIovaAllocator::new(IovaSpaceConfig::new(4096, Iova::new(SZ_4G))).unwrap();
        let cache: Arc<dyn IovaAllocator> =
            Arc::new(MagazineCache::new(tree, MagazineConfig::new(4)).unwrap());
        let variant = FlushQueueVariant {
            timer_free_cpu,
            ..FlushQueueVariant::default()
        };
        let fq = FlushQueue::with_variant(
            DomainId(1),
            4,
            FlushQueueConfig::default(),
            variant,
            Arc::new(ImmediateInvalidator::new()),
            cache.clone(),
        )
        .unwrap();
        let mut w = WorkRecord::new();
        for cpu in 0..3 {
            let b = cache
                .alloc(AllocRequest::new(1, Iova::new(SZ_4G), cpu), &mut w)
                .unwrap();
            fq.queue(b, cpu, 0, &mut w).unwrap();
        }

        assert!(fq.poll_timeout_on(10_000_000, 3, &mut w));

        assert_eq!(fq.pending(), 0);
        let hits = |cpu: usize| {
            let mut w = WorkRecord::new();
            for _ in 0..3 {
                cache
                    .alloc(AllocRequest::new(1, Iova::new(SZ_4G), cpu), &mut w)
                    .unwrap();
            }
            w.magazine_hits
        };
        let on3 = hits(3);
        (on3, hits(0))
    }

    #[test]
    fn the_linux_timer_path_frees_every_ring_into_the_timer_cpus_cache() {
        assert_eq!(timer_path_hits(TimerFreeCpu::TimerCpu), (3, 0));
    }

    #[test]
    fn by_default_the_timer_path_frees_each_ring_on_its_own_cpu() {
        // CPU 3 finds nothing cached; CPU 0 finds its own range (and misses twice).
        assert_eq!(timer_path_hits(TimerFreeCpu::RingCpu), (0, 1));
    }

    #[test]
    fn without_a_cpu_the_timer_cpu_variant_frees_on_each_rings_cpu() {
        let variant = FlushQueueVariant {
            timer_free_cpu: TimerFreeCpu::TimerCpu,
            ..FlushQueueVariant::default()
        };
        let f = variant_fixture(2, FlushQueueConfig::default(), variant);
        let mut w = WorkRecord::new();
        let b = block(&f, &mut w);
        f.fq.queue(b, 1, 0, &mut w).unwrap();

        assert!(f.fq.poll_timeout(10_000_000, &mut w));

        assert_eq!(f.alloc.live_blocks(), 0);
        assert_eq!(f.fq.variant(), variant);
    }

    #[test]
    fn a_single_queue_is_shared_by_every_cpu_and_fills_from_all_of_them() {
        let single = FlushQueueVariant {
            shape: FlushQueueShape::Single,
            ..FlushQueueVariant::default()
        };
        let config = FlushQueueConfig {
            ring_size: 8,
            timeout_ns: 10_000_000,
        };
        let s = variant_fixture(4, config, single);
        let p = variant_fixture(4, config, FlushQueueVariant::default());
        let (mut ws, mut wp) = (WorkRecord::new(), WorkRecord::new());
        for i in 0..7 {
            let (a, b) = (block(&s, &mut ws), block(&p, &mut wp));
            s.fq.queue(a, i % 4, 0, &mut ws).unwrap();
            p.fq.queue(b, i % 4, 0, &mut wp).unwrap();
        }
        assert_eq!((ws.flush_queue_flushes, wp.flush_queue_flushes), (0, 0));

        let (a, b) = (block(&s, &mut ws), block(&p, &mut wp));
        s.fq.queue(a, 3, 0, &mut ws).unwrap();
        p.fq.queue(b, 3, 0, &mut wp).unwrap();

        // The one ring holds 7 entries; the 8th, from any CPU, flushes it.
        assert_eq!((ws.flush_queue_flushes, ws.flush_queue_frees), (1, 7));
        assert_eq!(s.fq.pending(), 1);
        // Per-CPU rings hold 2 entries each here: nothing is full.
        assert_eq!(wp.flush_queue_flushes, 0);
        assert_eq!(p.fq.pending(), 8);
        assert_eq!(s.inv.stats().domains, 1);
    }

    #[test]
    fn the_linux_single_queue_holds_32767_entries_and_waits_a_second() {
        use crate::iova::linux::{IovaSpaceConfig, LinuxIovaAllocator};
        let single = FlushQueueVariant {
            shape: FlushQueueShape::Single,
            ..FlushQueueVariant::default()
        };
        let tree: Arc<dyn IovaAllocator> = Arc::new(
            LinuxIovaAllocator::new(IovaSpaceConfig::new(4096, Iova::new(SZ_4G))).unwrap(),
        );
        let fq = FlushQueue::with_variant(
            DomainId(7),
            4,
            FlushQueueConfig::LINUX_SINGLE,
            single,
            Arc::new(ImmediateInvalidator::new()),
            tree.clone(),
        )
        .unwrap();
        let mut w = WorkRecord::new();
        let queue = |cpu: usize, now: u64, w: &mut WorkRecord| {
            let b = tree
                .alloc(AllocRequest::new(1, Iova::new(SZ_4G), cpu), w)
                .unwrap();
            fq.queue(b, cpu, now, w).unwrap();
        };
        for i in 0..32_767 {
            queue(i % 4, 0, &mut w);
        }
        assert_eq!(w.flush_queue_flushes, 0);

        queue(2, 1, &mut w);

        assert_eq!((w.flush_queue_flushes, w.flush_queue_frees), (1, 32_767));
        assert_eq!(fq.deadline(), Some(1_000_000_000));
        assert!(!fq.poll_timeout_on(999_999_999, 0, &mut w));
        assert!(fq.poll_timeout_on(1_000_000_000, 0, &mut w));
        assert_eq!(tree.live_blocks(), 0);
        assert_eq!(FlushQueueConfig::LINUX_PER_CPU, FlushQueueConfig::default());
    }

    #[test]
    fn a_single_queue_still_rejects_cpus_past_its_count() {
        let single = FlushQueueVariant {
            shape: FlushQueueShape::Single,
            ..FlushQueueVariant::default()
        };
        let f = variant_fixture(2, FlushQueueConfig::default(), single);
        let mut w = WorkRecord::new();
        let b = block(&f, &mut w);
        assert_eq!(
            f.fq.queue(b, 2, 0, &mut w),
            Err(DmaError::BadCpu { cpu: 2, cpus: 2 })
        );
        assert_eq!(f.fq.pending(), 0);
    }

    #[test]
    fn bad_configurations_are_rejected() {
        let inv: Arc<dyn Invalidator> = Arc::new(ImmediateInvalidator::new());
        let alloc: Arc<dyn IovaAllocator> = Arc::new(SimpleAllocator::new(
            4096,
            Iova::new(4096),
            Iova::new(SZ_4G),
        ));
        let c = FlushQueueConfig {
            ring_size: 1,
            timeout_ns: 1,
        };
        assert!(FlushQueue::new(DomainId(1), 1, c, inv.clone(), alloc.clone()).is_err());
        assert!(FlushQueue::new(DomainId(1), 0, FlushQueueConfig::default(), inv, alloc).is_err());
    }
}
