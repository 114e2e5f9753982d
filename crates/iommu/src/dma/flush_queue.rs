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
            .field("cpus", &self.rings.len())
            .field("pending", &self.pending())
            .field("flush_counts", &self.flush_counts())
            .finish()
    }
}

impl FlushQueue {
    /// Queues for `cpus` CPUs of `domain`, flushing through `invalidator` and freeing to
    /// `allocator`.
    pub fn new(
        domain: DomainId,
        cpus: usize,
        config: FlushQueueConfig,
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
        let rings = (0..cpus)
            .map(|_| Mutex::new(VecDeque::with_capacity(cap)))
            .collect();
        Ok(Self {
            id: NEXT_QUEUE_ID.fetch_add(1, Ordering::Relaxed),
            domain,
            config,
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

    /// Queues `block`, whose page-table entries the caller has already cleared, on `cpu`'s
    /// ring. Fires the timer first if `now_ns` is past its deadline; flushes the ring first
    /// if it is full; arms the timer if it is off. Returns the entry's stamp: the flush-start
    /// count when it was queued (a flush covers it once the finish count exceeds it).
    pub fn queue(
        &self,
        block: IovaBlock,
        cpu: usize,
        now_ns: u64,
        work: &mut WorkRecord,
    ) -> Result<u64, DmaError> {
        let ring = self.rings.get(cpu).ok_or(DmaError::BadCpu {
            cpu,
            cpus: self.rings.len(),
        })?;
        self.poll_timeout(now_ns, work);
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
    /// and frees every ring's covered entries. Returns whether it fired.
    pub fn poll_timeout(&self, now_ns: u64, work: &mut WorkRecord) -> bool {
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
        self.free_all_rings(&done, work);
        true
    }

    /// Flushes and frees everything queued (teardown), and turns the timer off.
    pub fn flush_all(&self, work: &mut WorkRecord) {
        self.deadline.store(TIMER_OFF, Ordering::SeqCst);
        let done = self.flush(work);
        self.free_all_rings(&done, work);
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

    fn free_all_rings(&self, done: &FlushCompleted, work: &mut WorkRecord) {
        for (cpu, ring) in self.rings.iter().enumerate() {
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
