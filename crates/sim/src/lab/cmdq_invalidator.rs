//! The command-queue invalidator of workload scenarios on an SMMUv3: builds the SMMUv3
//! commands each invalidation needs and issues them, with a `CMD_SYNC`, through the
//! functional queue, leaving their timing to [`SimCmdq`](crate::experiments::smmuv3_cmdq::SimCmdq).
//! (The smmuv3-cmdq experiment now drives a whole SMMUv3 device model instead; workload
//! scenarios keep this lighter path: see docs/SCENARIOS.md.)

use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
use std::sync::Mutex;

use iolab_iommu::addr::SZ_4K;
use iolab_iommu::dma::{DomainId, Invalidator};
use iolab_iommu::pgtable::{FreedTable, GatherRange};
use iolab_iommu::smmuv3::{CmdqConfig, CmdqProducer, Command, NullSink, ProducerKind};
use iolab_iommu::work::WorkRecord;

use crate::experiments::ExperimentError;

#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Issued {
    /// Invalidation commands (syncs excluded) since the last take.
    pub(crate) cmds: u64,
    /// PROD writes the functional producer made since the last take.
    pub(crate) prod_writes: u64,
    /// Syncs requested since the last take.
    pub(crate) syncs: u64,
}

/// Builds the commands each invalidation needs and issues them, with a `CMD_SYNC`, through
/// the functional SMMUv3 queue (which applies them in order and counts the work). Timing is
/// left to [`SimCmdq`]: the caller takes the counts with [`CmdqInvalidator::take`].
pub(crate) struct CmdqInvalidator {
    asid: u16,
    producer: Box<dyn CmdqProducer<Sink = NullSink>>,
    /// Everything mutable behind one lock (taken a few times per I/O).
    state: Mutex<InvState>,
    /// Set once an error is recorded, so the per-I/O check needs no lock.
    failed: AtomicBool,
    chunk: usize,
}

/// The invalidator's mutable state.
#[derive(Default)]
struct InvState {
    /// Commands built since the last sync.
    pending: Vec<Command>,
    /// An empty buffer swapped in for `pending` at each sync (reused, not reallocated).
    spare: Vec<Command>,
    issued: Issued,
    error: Option<String>,
}

impl CmdqInvalidator {
    pub(crate) fn new(
        kind: ProducerKind,
        log2size: u32,
        asid: u16,
    ) -> Result<Self, ExperimentError> {
        let producer = kind
            .build(CmdqConfig::with_log2size(log2size), NullSink)
            .map_err(|e| ExperimentError::Model(e.to_string()))?;
        Ok(CmdqInvalidator {
            asid,
            producer,
            state: Mutex::new(InvState::default()),
            failed: AtomicBool::new(false),
            chunk: ((1usize << log2size) - 1).min(63),
        })
    }

    fn push(&self, c: Command) {
        if let Ok(mut st) = self.state.lock() {
            st.pending.push(c);
        }
    }

    pub(crate) fn take(&self) -> Issued {
        self.state
            .lock()
            .map(|mut st| std::mem::take(&mut st.issued))
            .unwrap_or_default()
    }

    pub(crate) fn error(&self) -> Option<String> {
        if !self.failed.load(AtomicOrdering::Relaxed) {
            return None;
        }
        self.state.lock().ok().and_then(|st| st.error.clone())
    }
}

impl Invalidator for CmdqInvalidator {
    fn invalidate_range(&self, _domain: DomainId, range: &GatherRange, work: &mut WorkRecord) {
        let page = range.page_size.max(SZ_4K);
        let pages = range.size / page;
        work.inval_ranges += 1;
        work.inval_pages += pages;
        // One CMD_TLBI_NH_VA per page (SMMUv3.0/3.1 have no range invalidation), leaf, with
        // the level hint of the page size.
        let ttl = match page {
            p if p >= 1 << 30 => 1,
            p if p >= 2 << 20 => 2,
            _ => 3,
        };
        for i in 0..pages {
            self.push(Command::TlbiNhVa {
                vmid: 0,
                asid: self.asid,
                addr: range.start.get() + i * page,
                leaf: true,
                ttl,
                tg: 0,
                num: 0,
                scale: 0,
            });
        }
    }

    fn invalidate_walk(&self, _domain: DomainId, table: &FreedTable, work: &mut WorkRecord) {
        work.inval_walks += 1;
        self.push(Command::TlbiNhVa {
            vmid: 0,
            asid: self.asid,
            addr: table.iova.get() & !(SZ_4K - 1),
            leaf: false,
            ttl: 0,
            tg: 0,
            num: 0,
            scale: 0,
        });
    }

    fn invalidate_domain(&self, _domain: DomainId, work: &mut WorkRecord) {
        work.inval_domains += 1;
        self.push(Command::TlbiNhAsid {
            vmid: 0,
            asid: self.asid,
        });
    }

    fn sync(&self, work: &mut WorkRecord) {
        work.inval_syncs += 1;
        // The pending commands, taken without giving up their buffer: `spare` keeps the
        // previous sync's (cleared) buffer, so neither side allocates per sync.
        let mut cmds = Vec::new();
        if let Ok(mut st) = self.state.lock() {
            let st = &mut *st;
            cmds = std::mem::take(&mut st.spare);
            std::mem::swap(&mut st.pending, &mut cmds);
        }
        let mut w = WorkRecord::new();
        let mut result = Ok(());
        if cmds.is_empty() {
            result = self.producer.issue(&[], true, &mut w);
        }
        let nchunks = cmds.len().div_ceil(self.chunk);
        for (i, c) in cmds.chunks(self.chunk).enumerate() {
            result = result.and_then(|()| self.producer.issue(c, i + 1 == nchunks, &mut w));
        }
        if let Ok(mut st) = self.state.lock() {
            if let Err(e) = result {
                st.error
                    .get_or_insert_with(|| format!("Command queue refused a command: {e}"));
                self.failed.store(true, AtomicOrdering::Relaxed);
            }
            st.issued.cmds += cmds.len() as u64;
            st.issued.prod_writes += w.mmio_writes;
            st.issued.syncs += 1;
            cmds.clear();
            st.spare = cmds;
        }
    }
}
