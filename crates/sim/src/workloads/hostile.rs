//! A hostile device beside a normal I/O workload: fio-like random reads on an NVMe SSD whose
//! DMA goes through any [`DmaPath`], while the same device (a compromised or buggy
//! controller) probes memory it should not reach:
//!
//! - **recently unmapped IOVAs**: right after the driver unmaps a completed I/O's buffer,
//!   the device tries to read and to write `probe_bytes` at the address it just used;
//! - **neighbours of live mappings**: every `neighbour_every`-th mapped buffer, the device
//!   tries to read and to write the bytes after the buffer, up to `neighbour_window` bytes,
//!   in pieces that end on 4 KiB boundaries.
//!
//! Every probe is a real device-side translation ([`DmaPath::translate`]): it succeeds
//! exactly when the platform's IOMMU (or its bypass) would let the access through. The
//! probes cost the host no CPU time (the device does them). The workload's buffers are
//! packed (`block_bytes` apart), so a buffer's neighbours are other I/Os' buffers.
//!
//! Over an SMMUv3 ([`Smmuv3DevicePath`](iolab_iommu::hw::Smmuv3DevicePath)) the unmap's
//! command-queue work is timed by the simulated queue (set with
//! `ProbedNvme::set_command_queue`): a strict unmap waits for its `CMD_TLBI_NH_VA` and
//! `CMD_SYNC`; a lazy unmap that fills its flush-queue ring waits for the flush's
//! `CMD_TLBI_NH_ASID` and `CMD_SYNC`. In lazy mode the stack also measures the window: from
//! an unmap to the completion of the sync of the first flush issued after it (the IOTLB
//! entry may have been evicted sooner: the longest time the page *could* still be reached).

use std::cell::{Cell, OnceCell, RefCell};
use std::rc::Rc;
use std::sync::Arc;

use iolab_iommu::addr::{Access, DmaAddr, PhysAddr};
use iolab_iommu::dma::{Device, Direction};
use iolab_iommu::hw::{split_queue_work, DmaPath, MappedBuffer};
use iolab_iommu::work::WorkRecord;

use crate::accounting::Account;
use crate::cmdq::SimCmdq;
use crate::cost::CpuCostModel;
use crate::devices::nvme::Nvme;
use crate::engine::{Channel, Ctx, Handle, SimDuration, SimTime};
use crate::workloads::fio::{BlockTarget, IoRequest};

/// What the hostile device tries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HostileParams {
    /// Bytes per probe of a just-unmapped buffer (read and write).
    pub probe_bytes: u64,
    /// Bytes after a live buffer the device tries to reach.
    pub neighbour_window: u64,
    /// Probe the neighbours of every n-th mapped buffer (at least 1).
    pub neighbour_every: u64,
}

/// What the hostile device reached.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExposureReport {
    /// Reads tried at just-unmapped addresses.
    pub stale_read_attempts: u64,
    /// Those that succeeded.
    pub stale_reads: u64,
    /// Bytes they could read.
    pub stale_read_bytes: u64,
    /// Writes tried at just-unmapped addresses.
    pub stale_write_attempts: u64,
    /// Those that succeeded.
    pub stale_writes: u64,
    /// Bytes they could write.
    pub stale_write_bytes: u64,
    /// Neighbour pieces tried (each read and write).
    pub neighbour_attempts: u64,
    /// Neighbour bytes readable.
    pub neighbour_readable_bytes: u64,
    /// Neighbour bytes writable.
    pub neighbour_writable_bytes: u64,
}

impl ExposureReport {
    /// Adds `other`'s counts to these (the total over several runs).
    pub fn add(&mut self, other: &ExposureReport) {
        *self = self.zip(other, |a, b| a + b);
    }

    /// Every count put through `f` (for example, a total over runs made a mean).
    pub fn map(&self, f: impl Fn(u64) -> u64) -> ExposureReport {
        self.zip(self, |a, _| f(a))
    }

    /// Each count made by `f` from this report's and `other`'s.
    fn zip(&self, other: &ExposureReport, f: impl Fn(u64, u64) -> u64) -> ExposureReport {
        ExposureReport {
            stale_read_attempts: f(self.stale_read_attempts, other.stale_read_attempts),
            stale_reads: f(self.stale_reads, other.stale_reads),
            stale_read_bytes: f(self.stale_read_bytes, other.stale_read_bytes),
            stale_write_attempts: f(self.stale_write_attempts, other.stale_write_attempts),
            stale_writes: f(self.stale_writes, other.stale_writes),
            stale_write_bytes: f(self.stale_write_bytes, other.stale_write_bytes),
            neighbour_attempts: f(self.neighbour_attempts, other.neighbour_attempts),
            neighbour_readable_bytes: f(
                self.neighbour_readable_bytes,
                other.neighbour_readable_bytes,
            ),
            neighbour_writable_bytes: f(
                self.neighbour_writable_bytes,
                other.neighbour_writable_bytes,
            ),
        }
    }
}

/// The probing side of the device.
pub struct HostileDevice {
    path: Arc<dyn DmaPath>,
    dev: Device,
    params: HostileParams,
    mapped: RefCell<u64>,
    report: RefCell<ExposureReport>,
}

impl HostileDevice {
    /// A device `dev` probing through `path`.
    pub fn new(path: Arc<dyn DmaPath>, dev: Device, params: HostileParams) -> Self {
        Self {
            path,
            dev,
            params,
            mapped: RefCell::new(0),
            report: RefCell::new(ExposureReport::default()),
        }
    }

    /// What it reached so far.
    pub fn report(&self) -> ExposureReport {
        *self.report.borrow()
    }

    fn reaches(&self, dma: u64, len: u64, access: Access) -> bool {
        let mut w = WorkRecord::new();
        self.path
            .translate(&self.dev, DmaAddr(dma), len, access, &mut w)
            .is_ok()
    }

    /// Probes a buffer of `len` bytes at `dma` the driver has just unmapped.
    pub fn probe_unmapped(&self, dma: u64, len: u64) {
        let n = len.min(self.params.probe_bytes).max(1);
        let read = self.reaches(dma, n, Access::Read);
        let write = self.reaches(dma, n, Access::Write);
        let mut r = self.report.borrow_mut();
        r.stale_read_attempts += 1;
        r.stale_write_attempts += 1;
        if read {
            r.stale_reads += 1;
            r.stale_read_bytes += n;
        }
        if write {
            r.stale_writes += 1;
            r.stale_write_bytes += n;
        }
    }

    /// Called for each buffer mapped (`len` bytes at `dma`): every `neighbour_every`-th
    /// time, probes the bytes after it.
    pub fn on_mapped(&self, dma: u64, len: u64) {
        let n = {
            let mut m = self.mapped.borrow_mut();
            *m += 1;
            *m
        };
        if n % self.params.neighbour_every.max(1) != 0 {
            return;
        }
        let Some(mut cur) = dma.checked_add(len) else {
            return;
        };
        let end = cur.saturating_add(self.params.neighbour_window);
        while cur < end {
            let piece = ((cur | 0xfff) + 1).min(end) - cur;
            let read = self.reaches(cur, piece, Access::Read);
            let write = self.reaches(cur, piece, Access::Write);
            let mut r = self.report.borrow_mut();
            r.neighbour_attempts += 1;
            if read {
                r.neighbour_readable_bytes += piece;
            }
            if write {
                r.neighbour_writable_bytes += piece;
            }
            cur += piece;
        }
    }
}

/// Kernel CPU costs of the storage path (the DMA path's are the cost model's).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelCosts {
    /// Block layer, per I/O submitted, ns.
    pub block_submit_ns: u64,
    /// NVMe driver submit (command build, doorbell), ns.
    pub nvme_submit_ns: u64,
    /// Interrupt entry, ns.
    pub irq_ns: u64,
    /// NVMe completion and block-layer completion, ns.
    pub complete_ns: u64,
}

/// A completed command on its way to the interrupt handler.
struct Done {
    req: IoRequest,
    buf: MappedBuffer,
}

/// The storage stack below the system call, with the hostile device watching: a
/// [`BlockTarget`] for fio jobs. Completions are handled on the submitting CPU.
pub struct ProbedNvme {
    path: Arc<dyn DmaPath>,
    dev: Device,
    nvme: Nvme,
    cost: CpuCostModel,
    k: KernelCosts,
    hostile: HostileDevice,
    vectors: Vec<Channel<Done>>,
    buf_base: u64,
    slots_per_job: u64,
    error: RefCell<Option<String>>,
    h: Handle,
    /// The timed command queue of an SMMUv3 path, and whether its unmaps are deferred (lazy).
    cmdq: OnceCell<(SimCmdq, bool)>,
    /// Lazy: the earliest unmap no flush has been issued for yet, ns.
    pending_since: Cell<Option<u64>>,
    /// Lazy: the longest unmap-to-flush-sync-completion time measured, ns.
    max_window_ns: Cell<u64>,
}

impl ProbedNvme {
    /// A stack over `path` with `cpus` completion vectors (one per CPU, affine), buffers
    /// packed from `buf_base` (`slots_per_job` per job, `block_bytes` apart).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        h: &Handle,
        path: Arc<dyn DmaPath>,
        dev: Device,
        nvme: Nvme,
        cost: CpuCostModel,
        k: KernelCosts,
        hostile: HostileParams,
        cpus: usize,
        buf_base: u64,
        slots_per_job: u64,
        inflight_cap: usize,
    ) -> Rc<Self> {
        Rc::new(Self {
            hostile: HostileDevice::new(path.clone(), dev.clone(), hostile),
            path,
            dev,
            nvme,
            cost,
            k,
            vectors: (0..cpus).map(|_| Channel::new(h, inflight_cap)).collect(),
            buf_base,
            slots_per_job,
            error: RefCell::new(None),
            h: h.clone(),
            cmdq: OnceCell::new(),
            pending_since: Cell::new(None),
            max_window_ns: Cell::new(0),
        })
    }

    /// Times the unmaps' command-queue work with `q` (an SMMUv3 path); `deferred`: the
    /// domain is lazy (unmaps queue their invalidation). Set once, before the run.
    pub(crate) fn set_command_queue(&self, q: SimCmdq, deferred: bool) -> Result<(), String> {
        self.cmdq
            .set((q, deferred))
            .map_err(|_| "the command queue is already set".to_string())
    }

    /// Lazy over a timed command queue: the longest time from an unmap to the completion of
    /// the `CMD_SYNC` of the first flush issued after it; unmaps still waiting at `end_ns`
    /// count up to it. `None` without a timed queue in lazy mode.
    pub fn measured_window_ns(&self, end_ns: u64) -> Option<u64> {
        match self.cmdq.get() {
            Some((_, true)) => {
                let open = self
                    .pending_since
                    .get()
                    .map_or(0, |t| end_ns.saturating_sub(t));
                Some(self.max_window_ns.get().max(open))
            }
            _ => None,
        }
    }

    /// What the hostile device reached.
    pub fn exposure(&self) -> ExposureReport {
        self.hostile.report()
    }

    /// The first error the stack hit, if any.
    pub fn error(&self) -> Option<String> {
        self.error.borrow().clone()
    }

    fn fail(&self, e: String) -> String {
        self.error.borrow_mut().get_or_insert(e).clone()
    }

    async fn submit(self: &Rc<Self>, ctx: &Ctx, req: IoRequest) -> Result<(), String> {
        let cpu = ctx.cpu().id();
        let slot = req.job as u64 * self.slots_per_job + u64::from(req.slot);
        let pa = self.buf_base + slot * req.len;
        let dir = if req.is_read {
            Direction::FromDevice
        } else {
            Direction::ToDevice
        };
        let mut w = WorkRecord::new();
        let buf = self
            .path
            .map_single(&self.dev, PhysAddr::new(pa), req.len, dir, cpu, &mut w)
            .map_err(|e| self.fail(format!("dma map failed: {e}")))?;
        let map_ns = self.cost.cpu_ns(&w).round() as u64;
        ctx.cpu()
            .spend(
                SimDuration::ns(self.k.block_submit_ns + map_ns + self.k.nvme_submit_ns),
                Account::System,
            )
            .await;
        self.hostile.on_mapped(buf.dma_addr().0, buf.len());
        // The legitimate transfer.
        let access = if req.is_read {
            Access::Write
        } else {
            Access::Read
        };
        let mut tw = WorkRecord::new();
        self.path
            .translate(&self.dev, buf.dma_addr(), req.len, access, &mut tw)
            .map_err(|e| self.fail(format!("device DMA faulted: {e}")))?;
        let tr_ns = self.cost.translation_ns(&tw);
        let at = self
            .nvme
            .service(ctx.now().as_ns(), req.len, req.is_read, tr_ns);
        let chan = self.vectors[cpu % self.vectors.len()].clone();
        let item = Done { req, buf };
        self.h
            .spawn_agent(move |actx| async move {
                actx.sleep_until(SimTime::from_ns(at)).await;
                let _ = chan.send(item);
            })
            .map_err(|e| self.fail(e.to_string()))?;
        Ok(())
    }

    /// The completion interrupt handler of CPU `cpu`'s vector: unmap, then the device
    /// probes the address it was just given back.
    pub async fn irq_loop(self: Rc<Self>, ctx: Ctx, cpu: usize) {
        let chan = self.vectors[cpu].clone();
        loop {
            let first = chan.recv(&ctx).await;
            ctx.cpu()
                .spend(SimDuration::ns(self.k.irq_ns), Account::System)
                .await;
            let mut next = Some(first);
            while let Some(d) = next {
                let (dma, len) = (d.buf.dma_addr().0, d.buf.len());
                let mut w = WorkRecord::new();
                let unmapped_at = ctx.now().as_ns();
                if let Err(e) = self.path.unmap_single(d.buf, cpu, unmapped_at, &mut w) {
                    self.fail(format!("dma unmap failed: {}", e.error));
                }
                // The device strikes at once: before anything else can map that address.
                self.hostile.probe_unmapped(dma, len);
                // Over an SMMUv3, the queue's part of the unmap is timed by the queue.
                let queue = self.cmdq.get().map(|(q, deferred)| {
                    let flushed = w.flush_queue_flushes > 0;
                    let covered = if *deferred && flushed {
                        // The flush's TLBI covers every unmap so far, this one included.
                        Some(self.pending_since.take().unwrap_or(unmapped_at))
                    } else {
                        if *deferred && self.pending_since.get().is_none() {
                            self.pending_since.set(Some(unmapped_at));
                        }
                        None
                    };
                    (q, split_queue_work(&mut w), covered)
                });
                let unmap_ns = self.cost.cpu_ns(&w).round() as u64;
                if let Some((q, work, covered)) = queue {
                    ctx.cpu()
                        .spend(SimDuration::ns(unmap_ns), Account::System)
                        .await;
                    q.issue_work(&ctx, &work).await;
                    if let Some(t) = covered {
                        let window = ctx.now().as_ns().saturating_sub(t);
                        self.max_window_ns.set(self.max_window_ns.get().max(window));
                    }
                    ctx.cpu()
                        .spend(SimDuration::ns(self.k.complete_ns), Account::System)
                        .await;
                } else {
                    ctx.cpu()
                        .spend(
                            SimDuration::ns(unmap_ns + self.k.complete_ns),
                            Account::System,
                        )
                        .await;
                }
                d.req.complete();
                next = chan.try_recv();
            }
        }
    }
}

/// [`ProbedNvme`] as a fio target.
pub struct ProbedTarget(pub Rc<ProbedNvme>);

impl BlockTarget for ProbedTarget {
    fn submit<'a>(
        &'a self,
        ctx: &'a Ctx,
        req: IoRequest,
    ) -> impl std::future::Future<Output = Result<(), String>> + 'a {
        self.0.submit(ctx, req)
    }
}
