//! SMMUv3: the Arm System MMU, version 3.
//!
//! - [`spec`]: command encodings (16-byte commands as two words) with decode errors.
//! - [`cmdq`]: the command queue as the hardware sees it, a ring with PROD and CONS
//!   registers and wrap bits, its consumer, and the [`CmdqProducer`] trait.
//! - [`SpinlockCmdq`]: the pre-2019 Linux producer, one spinlock around each insertion and
//!   the sync waited for under the lock.
//! - [`LockFreeCmdq`]: the 2019 Linux producer: slots reserved by compare-and-swap, written
//!   in parallel, published by an elected owner; a shared lock while waiting for syncs.
//! - [`CmdBatch`]: batches of up to 64 commands with one `CMD_SYNC`.
//! - [`Smmuv3`] ([`device`]): the SMMU itself: a linear stream table ([`stream`]), context
//!   descriptors, the IOTLB and walk cache the command queue's consumer invalidates
//!   ([`caches`]), the event queue ([`events`]), and translated domains whose
//!   [`Smmuv3Invalidator`] ([`invalidator`]) issues real TLBI commands.
//!
//! Both producers are real concurrent code on host threads; their synchronisation comes
//! from `loom` under `--cfg loom` so the model tests in `tests/loom_cmdq.rs` check the
//! code the library runs.
//!
//! # Work records
//!
//! `issue` adds to the caller's [`WorkRecord`](crate::work::WorkRecord):
//!
//! | counter | spinlock | lock-free |
//! |---|---|---|
//! | `commands_written` | every slot written, syncs included | same |
//! | `locks[CmdqLock]` | one per command and one per sync | - |
//! | `locks[CmdqSharedLock]` | - | one per sync (shared), one per CONS refresh (exclusive) |
//! | `cas_attempts` / `cas_failures` | - | reservation CAS on the `{prod, cons}` word |
//! | `owner_elections` | - | batches this CPU published as owner |
//! | `mmio_writes` | one PROD write per slot | one PROD write per owned batch |
//! | `mmio_reads` | CONS reads while the queue is full | CONS reads while waiting for space |
//! | `polls` | looks at the hardware that found it not done (sync MSI, free slots) | same |
//! | `inval_syncs` | one per sync waited for | same |
//!
//! Spinning on a lock or on another CPU (the previous owner, valid bits) is not counted:
//! how long that takes is the lab's business, from the counts above. With more than one
//! thread, `polls`, `mmio_reads` and the CAS counts depend on the host's scheduling; on a
//! single thread every count is deterministic.
//!
//! ```
//! use iolab_iommu::smmuv3::{CmdBatch, CmdqConfig, CmdqProducer, Command, LockFreeCmdq, NullSink};
//! use iolab_iommu::work::WorkRecord;
//!
//! let q = LockFreeCmdq::new(CmdqConfig::default(), NullSink).unwrap();
//! let mut work = WorkRecord::new();
//! let mut batch = CmdBatch::new(&q);
//! for page in 0..3u64 {
//!     let cmd = Command::TlbiNhVa {
//!         vmid: 0, asid: 1, addr: page << 12, leaf: true, ttl: 3, tg: 0, num: 0, scale: 0,
//!     };
//!     batch.add(cmd, &mut work).unwrap();
//! }
//! batch.submit(&mut work).unwrap();
//! // Three TLBIs and one CMD_SYNC, published with one PROD write.
//! assert_eq!(work.commands_written, 4);
//! assert_eq!(work.mmio_writes, 1);
//! assert_eq!(work.inval_syncs, 1);
//! assert!(q.cmdq().is_idle());
//! ```

mod batch;
pub mod caches;
pub mod cmdq;
pub mod device;
pub mod events;
pub mod invalidator;
mod lockfree;
pub mod spec;
mod spinlock;
pub mod stream;
mod sync;

pub use batch::{CmdBatch, CMDQ_BATCH_ENTRIES};
pub use caches::{SinkStats, TlbCaches};
pub use cmdq::{
    Cmdq, CmdqConfig, CmdqError, CmdqProducer, CommandSink, Consumer, ConsumerMode, ConsumerStats,
    NullSink, ProducerKind,
};
pub use device::{
    SmmuDomain, SmmuFault, SmmuFaultReason, SmmuFaultStats, Smmuv3, Smmuv3Config, Smmuv3Error,
    Smmuv3PageTable,
};
pub use events::{EventId, EventQueue, EventRecord};
pub use invalidator::Smmuv3Invalidator;
pub use lockfree::LockFreeCmdq;
pub use spec::{Command, CommandDecodeError, CommandEncodeError, StreamWorld, SyncCs};
pub use spinlock::SpinlockCmdq;
pub use stream::{ContextDescriptor, Ste, SteConfig};

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::work::{LockId, WorkRecord};
    use std::sync::{Arc, Mutex};

    #[derive(Default)]
    struct Log(Mutex<Vec<Command>>);

    impl CommandSink for Log {
        fn apply(&self, cmd: &Command) {
            self.0.lock().unwrap().push(*cmd);
        }
    }

    impl Log {
        fn take(&self) -> Vec<Command> {
            std::mem::take(&mut *self.0.lock().unwrap())
        }
    }

    fn tlbi(asid: u16, page: u64) -> Command {
        Command::TlbiNhVa {
            vmid: 0,
            asid,
            addr: page << 12,
            leaf: true,
            ttl: 3,
            tg: 0,
            num: 0,
            scale: 0,
        }
    }

    fn build(
        kind: ProducerKind,
        log2size: u32,
    ) -> (Arc<Log>, Box<dyn CmdqProducer<Sink = Arc<Log>>>) {
        let log = Arc::new(Log::default());
        let q = kind
            .build(CmdqConfig::with_log2size(log2size), log.clone())
            .unwrap();
        (log, q)
    }

    #[test]
    fn spinlock_counts_a_lock_and_a_prod_write_per_command() {
        let (log, q) = build(ProducerKind::Spinlock, 4);
        let mut work = WorkRecord::new();
        q.issue(&[tlbi(1, 1), tlbi(1, 2)], true, &mut work).unwrap();
        let seen = log.take();
        assert_eq!(&seen[..2], &[tlbi(1, 1), tlbi(1, 2)]);
        assert!(seen[2].is_sync());
        assert_eq!(work.commands_written, 3);
        assert_eq!(work.mmio_writes, 3);
        assert_eq!(work.lock_count(LockId::CmdqLock), 3);
        assert_eq!(work.inval_syncs, 1);
        assert_eq!(work.polls, 1);
        assert_eq!(work.cas_attempts, 0);
        assert!(q.cmdq().is_idle());
    }

    #[test]
    fn lock_free_publishes_a_batch_with_one_prod_write() {
        let (log, q) = build(ProducerKind::LockFree, 4);
        let mut work = WorkRecord::new();
        q.issue(&[tlbi(1, 1), tlbi(1, 2)], true, &mut work).unwrap();
        let seen = log.take();
        assert_eq!(&seen[..2], &[tlbi(1, 1), tlbi(1, 2)]);
        assert!(seen[2].is_sync());
        assert_eq!(work.commands_written, 3);
        assert_eq!(work.mmio_writes, 1);
        assert_eq!(work.cas_attempts, 1);
        assert_eq!(work.cas_failures, 0);
        assert_eq!(work.owner_elections, 1);
        assert_eq!(work.lock_count(LockId::CmdqSharedLock), 1);
        assert_eq!(work.lock_count(LockId::CmdqLock), 0);
        assert_eq!(work.inval_syncs, 1);
        assert_eq!(work.polls, 1);
        assert!(q.cmdq().is_idle());
    }

    #[test]
    fn both_designs_keep_order_across_many_laps_of_a_small_queue() {
        for kind in ProducerKind::ALL {
            let (log, q) = build(kind, 2);
            let mut work = WorkRecord::new();
            let mut expected = Vec::new();
            for i in 0..50u64 {
                // 1, 2 or 3 commands, a sync every other call: slots wrap at odd offsets.
                let cmds: Vec<_> = (0..1 + i % 3).map(|j| tlbi(7, i * 4 + j)).collect();
                let sync = i % 2 == 0;
                q.issue(&cmds, sync, &mut work).unwrap();
                expected.extend(cmds);
                if sync {
                    let seen: Vec<_> = log.take().into_iter().filter(|c| !c.is_sync()).collect();
                    assert_eq!(
                        seen, expected,
                        "{kind}: a sync returned before its commands ran"
                    );
                    expected.clear();
                }
            }
            q.cmdq().drain();
            let seen: Vec<_> = log.take().into_iter().filter(|c| !c.is_sync()).collect();
            assert_eq!(seen, expected, "{kind}");
            assert_eq!(q.cmdq().stats().illegal, 0);
        }
    }

    #[test]
    fn without_a_sync_commands_wait_for_the_next_waiter() {
        for kind in ProducerKind::ALL {
            let (log, q) = build(kind, 1);
            let mut work = WorkRecord::new();
            q.issue(&[tlbi(1, 1), tlbi(1, 2)], false, &mut work)
                .unwrap();
            // Published but nobody needed the hardware yet.
            assert_eq!(q.cmdq().prod(), 2, "{kind}");
            assert_eq!(q.cmdq().cons(), 0, "{kind}");
            // The queue is full: the next insertion runs the consumer to make room.
            q.issue(&[tlbi(1, 3)], false, &mut work).unwrap();
            assert_eq!(log.take(), vec![tlbi(1, 1), tlbi(1, 2)], "{kind}");
            assert!(work.polls >= 1 && work.mmio_reads >= 1, "{kind}: {work:?}");
        }
    }

    #[test]
    fn rejected_lists_write_nothing() {
        for kind in ProducerKind::ALL {
            let (_, q) = build(kind, 2);
            let mut work = WorkRecord::new();
            assert_eq!(
                q.issue(&[tlbi(1, 1), Command::sync_msi(0, 0)], false, &mut work),
                Err(CmdqError::SyncInList { index: 1 })
            );
            let bad = Command::CfgiCd {
                sid: 0,
                ssid: u32::MAX,
                leaf: true,
            };
            assert!(matches!(
                q.issue(&[bad], true, &mut work),
                Err(CmdqError::Encode { index: 0, .. })
            ));
            assert!(work.is_empty(), "{kind}: {work:?}");
            assert_eq!(q.cmdq().prod(), 0);
        }
        let (_, q) = build(ProducerKind::LockFree, 1);
        assert_eq!(
            q.issue(&[tlbi(1, 1), tlbi(1, 2)], true, &mut WorkRecord::new()),
            Err(CmdqError::TooManyCommands {
                slots: 3,
                capacity: 2
            })
        );
    }

    #[test]
    fn batch_flushes_every_64_commands_and_syncs_once() {
        let (log, q) = build(ProducerKind::LockFree, 8);
        let mut work = WorkRecord::new();
        let mut batch = CmdBatch::new(&*q);
        assert_eq!(batch.limit(), CMDQ_BATCH_ENTRIES);
        for i in 0..130 {
            batch.add(tlbi(2, i), &mut work).unwrap();
        }
        assert_eq!(batch.len(), 2);
        batch.submit(&mut work).unwrap();
        let seen = log.take();
        assert_eq!(seen.len(), 131);
        assert!(seen[130].is_sync());
        assert!(seen[..130]
            .iter()
            .enumerate()
            .all(|(i, c)| *c == tlbi(2, i as u64)));
        // Two flushes of 64 without sync, then 2 + sync: three reservations, three PROD
        // writes, one sync.
        assert_eq!(work.commands_written, 131);
        assert_eq!(work.cas_attempts, 3);
        assert_eq!(work.mmio_writes, 3);
        assert_eq!(work.inval_syncs, 1);
    }

    #[test]
    fn batch_fits_small_queues_and_rejects_syncs() {
        let (log, q) = build(ProducerKind::LockFree, 2);
        let mut work = WorkRecord::new();
        let mut batch = CmdBatch::new(&*q);
        assert_eq!(batch.limit(), 3);
        assert_eq!(
            batch.add(Command::sync_msi(0, 0), &mut work),
            Err(CmdqError::SyncInList { index: 0 })
        );
        for i in 0..7 {
            batch.add(tlbi(3, i), &mut work).unwrap();
        }
        batch.submit(&mut work).unwrap();
        let seen: Vec<_> = log.take().into_iter().filter(|c| !c.is_sync()).collect();
        assert_eq!(seen, (0..7).map(|i| tlbi(3, i)).collect::<Vec<_>>());
    }

    #[test]
    fn external_consumer_completes_syncs() {
        for kind in ProducerKind::ALL {
            let log = Arc::new(Log::default());
            let cfg = CmdqConfig {
                consumer: ConsumerMode::External,
                ..CmdqConfig::with_log2size(3)
            };
            let q: Arc<dyn CmdqProducer<Sink = Arc<Log>>> =
                kind.build(cfg, log.clone()).unwrap().into();
            let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let hw = {
                let (q, stop) = (q.clone(), stop.clone());
                std::thread::spawn(move || {
                    while !stop.load(std::sync::atomic::Ordering::Acquire) {
                        if q.cmdq().drain() == 0 {
                            std::thread::yield_now();
                        }
                    }
                })
            };
            let mut work = WorkRecord::new();
            for i in 0..20 {
                q.issue(&[tlbi(4, i)], true, &mut work).unwrap();
                assert!(log.0.lock().unwrap().contains(&tlbi(4, i)), "{kind}");
            }
            stop.store(true, std::sync::atomic::Ordering::Release);
            hw.join().unwrap();
            assert_eq!(work.inval_syncs, 20);
        }
    }
}
