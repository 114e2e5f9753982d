//! fio and bonnie on block devices (NVMe SSDs, SAS HBAs) behind any DMA path.
//!
//! Each I/O takes the path Linux takes: on the submitting CPU, the block layer
//! (`kernel.block_submit_ns`), `dma_map` through the scenario's IOMMU (the work the stack
//! really did, priced by the platform profile), the driver's submission and the doorbell
//! write; the device's DMA is translated by the IOMMU (its translation time added to the
//! transfer; with SMMUv3, through its IOTLB and walk cache, each walk read costed); the
//! completion interrupt lands on the CPU its queue's vector is affine to, where the driver
//! completes the command, `dma_unmap` runs (with SMMUv3, the invalidation commands and
//! `CMD_SYNC` the SMMU model applies go through the timed command queue,
//! [`crate::iommu::cmdq`], as in the `smmuv3-cmdq` experiment; with VT-d or AMD-Vi, through
//! the unit's timed invalidation queue, [`crate::iommu::x86q`]) and the block layer completes
//! the request to fio.
//!
//! The IOVA tree's lock and the per-CPU flush queues' locks are engine [`SpinLock`]s: a
//! map or unmap that took one holds it for the work done under it (the tree walk and
//! rotations; the flush-queue ring operations), so waiters spin when many CPUs contend.
//!
//! fio maps one buffer per I/O (`dma_map_single` of its slot's buffer). bonnie's page
//! cache hands the stack block commands ([`BlockQueue`]) whose pages the block layer already
//! cut under the queue limits; the stack coalesces physically contiguous pages
//! (`blk_rq_map_sg`) and maps the list with `dma_map_sg`; the device's DMA is translated
//! segment by segment. A SAS HBA's disks hold the bonnie file striped in units of
//! [`BONNIE_SAS_STRIPE`]; a command goes to the disk holding its first byte.
//!
//! An NVMe device with `[device.hostile]` ([`crate::devices::hostile`]) probes, through the
//! same DMA route as its own transfers, the neighbours of fio's buffers as they are mapped
//! and each buffer's address right after its unmap; over SMMUv3 its refused probes are
//! event records the driver's event thread drains every `iommu.evtq_drain_interval_us`.
//! In lazy mode over SMMUv3 the stack measures the window a freed page stays reachable:
//! from its unmap to the completion of the `CMD_SYNC` of the first flush after it.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

use iolab_iommu::addr::{PhysAddr, SZ_4K};
use iolab_iommu::dma::{Device, Direction, Domain, PhysRange};
use iolab_iommu::hw::{DmaPath, MappedBuffer, MappedSg, QueueWork};
use iolab_iommu::work::{LockId, WorkRecord};

use super::LabError;
use crate::accounting::{Account, RunReport};
use crate::block::{BlockCommand, BlockDir, BlockQueue, OnDone, QueueLimits, SubmitCommand};
use crate::cost::{CpuCostModel, RecordCost};
use crate::devices::hostile::{ExposureReport, HostileDevice};
use crate::devices::nvme::{Nvme, Post};
use crate::devices::sas::SasHba;
use crate::devices::usb::{sg_entries, IrqCpu};
use crate::devices::{BlockDev, BlockIo, DeviceDma, PortedDma};
use crate::engine::{Channel, Ctx, Handle, Sim, SimConfig, SimDuration, SimTime};
use crate::iommu::port::{DmaPort, Translated};
use crate::iommu::TimedQueue;
use crate::lab::defaults as d;
use crate::metrics::CpuBreakdown;
use crate::resources::{LockKind, SpinLock, SpinParams};
use crate::time::round_ns;
use crate::workloads::bonnie::{self, BonnieResult};
use crate::workloads::fio::{
    self, BlockTarget, FioJob, GroupStats, IoRequest, JobJson, PendingCompletion, SharedStats,
};

use super::iommu::{self, model_err, LabProtection, ProtectionProbe};
use super::spec::{BlockKernel, BonnieSetup, Devices, FioSetup, LabScenario, BUFFER_BASE};

/// A DMA mapping of one I/O: fio's buffer, or a block command's scatter-gather list.
enum Mapping {
    Single(MappedBuffer),
    Sg(MappedSg),
}

/// Who hears of an I/O's completion.
enum Done {
    /// The fio job that issued it (the request's completion, not the whole request: what
    /// is kept per I/O in flight, and moved through its device timer, stays small).
    Fio(PendingCompletion),
    /// A block command's callback (bonnie's page cache).
    Command(OnDone),
}

/// What is submitted to the stack.
enum Submission {
    /// A fio request (one buffer).
    Fio(IoRequest),
    /// A block command (bonnie's page cache: a scatter-gather list).
    Command(BlockCommand),
}

struct InFlight {
    done: Done,
    mapping: Mapping,
}

/// What the device is asked to do for one I/O, and which device.
struct IoShape {
    io: BlockIo,
    /// The device (index into the stack's devices).
    devno: usize,
}

/// Counters of the DMA path over the whole run.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct DmaCounters {
    pub maps: u64,
    pub unmaps: u64,
    pub map_ns: f64,
    pub unmap_ns: f64,
    pub translation_ns: f64,
    pub inval_syncs: u64,
    pub flush_queue_flushes: u64,
    /// Device-side page translations that hit the SMMU's IOTLB (SMMUv3 only).
    pub iotlb_hits: u64,
    /// ... that missed it and walked.
    pub iotlb_misses: u64,
    /// ... that hit an entry whose mapping was already unmapped (lazy mode's window).
    pub iotlb_stale_hits: u64,
    /// Table reads of those walks (after the walk cache).
    pub walk_reads: u64,
    /// I/Os whose DMA was translated.
    pub translated_ios: u64,
    /// I/Os submitted to the devices.
    pub ios: u64,
    /// Bytes the devices were asked to read (device to memory).
    pub device_read_bytes: u64,
    /// Bytes the devices were asked to write (memory to device).
    pub device_write_bytes: u64,
    /// DMA segments the devices were handed (after the DMA layer's merging).
    pub dma_segments: u64,
    /// Interrupts the devices raised (one per completion unless an NVMe device coalesces).
    pub interrupts: u64,
    /// Interrupt handler runs (one handler entry each; a run drains every completion
    /// queued on its vector, so there are at most as many as interrupts).
    pub irq_handler_runs: u64,
    /// Completions the handlers processed (one per I/O).
    pub completions: u64,
    /// PCI 32-bit-first tries that failed (`WorkRecord::iova_32bit_failures`).
    pub iova_32bit_failures: u64,
    /// Allocations from the device's full range after a failed try or once the device
    /// stopped trying (`WorkRecord::iova_full_range_allocs`).
    pub iova_full_range_allocs: u64,
    /// Second passes of the IOVA tree's first fit (`WorkRecord::iova_tree_retries`).
    pub iova_tree_retries: u64,
}

/// One IOMMU instance (an SMMU or DMAR unit) of the stack: its DMA path (its own domain,
/// IOVA allocator and magazines), its timed queue and its domain's locks.
pub(super) struct Unit {
    path: Arc<dyn DmaPath>,
    /// SMMUv3, VT-d or AMD-Vi in a translated mode: the SMMU or unit the device's DMA goes
    /// through, and its timed queue.
    queue: Option<TimedQueue>,
    /// The IOVA tree's lock (Linux `iova_rbtree_lock`).
    tree_lock: SpinLock,
    /// Per CPU: its flush queue's lock (lazy mode).
    fq_locks: Vec<SpinLock>,
    /// The IOVA magazine depot's lock (Linux `rcache->lock`), taken when a CPU's two
    /// magazines are both full or both empty; one for the size classes together.
    depot_lock: SpinLock,
    /// The instance's DMA port: its walkers, shared by the devices behind it.
    port: DmaPort,
    /// Where this instance's protection report is read.
    protection: ProtectionProbe,
    /// Lazy mode over a timed queue: what closes the domain's stale windows.
    window_closer: Option<WindowCloser>,
}

/// Lazy mode over a timed queue: the domain whose stale windows the queue's syncs close.
/// The functional flush runs at once; the timed queue says when its sync completes, and
/// [`Domain::invalidations_completed`] closes the windows of the pages it covered then (a
/// page freed lazily stays reachable until that sync, not until the flush was issued).
struct WindowCloser {
    domain: Arc<Domain>,
}

impl WindowCloser {
    /// The flush count to report once the work of a record that ran `flushes` flushes has
    /// completed on the timed queue (`None`: nothing to close).
    fn finished_after(&self, flushes: u64) -> Option<u64> {
        if flushes == 0 {
            return None;
        }
        self.domain.flush_queue().map(|fq| fq.flush_counts().1)
    }

    /// The sync covering flushes up to `finished` completed at `now_ns`.
    fn closed(&self, finished: Option<u64>, now_ns: u64) {
        if let Some(f) = finished {
            self.domain.invalidations_completed(f, now_ns);
        }
    }
}

/// The SMMUv3 event queues' record counts of a run (summed over the instances).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct EventCounts {
    /// Records written.
    pub written: u64,
    /// Records lost because the queue was full.
    pub lost: u64,
    /// Overflow episodes (`SMMU_EVTQ_PROD.OVFLG` toggles).
    pub overflows: u64,
}

/// The IOVA-tree lock's name on instance `k` (instance 0 keeps the one-instance name).
pub(super) fn tree_lock_name(k: usize) -> String {
    if k == 0 {
        "iova_tree_lock".to_owned()
    } else {
        format!("iova_tree_lock#{k}")
    }
}

/// The engine name of IOMMU instance `k`'s magazine-depot lock.
fn depot_lock_name(k: usize) -> String {
    if k == 0 {
        "iova_depot_lock".to_owned()
    } else {
        format!("iova_depot_lock#{k}")
    }
}

/// A map's or unmap's work record, priced ([`Stack::charge`]).
struct Charge {
    queue: QueueWork,
    critical: Critical,
    ns: Result<f64, String>,
    locks: Option<EngineLocks>,
}

/// The locks the engine models for a map or unmap, in this order: the IOVA tree's lock, the
/// CPU's flush-queue lock and the magazine depot's lock.
const ENGINE_LOCKS: [LockId; 3] = [LockId::IovaTree, LockId::FlushQueue, LockId::RcacheDepot];
/// Acquisitions of each of [`ENGINE_LOCKS`] in one work record.
type EngineLocks = [u64; 3];
/// CPU time of the work done under each of [`ENGINE_LOCKS`], ns.
type Critical = [f64; 3];

pub(super) struct Stack {
    /// The IOMMU instances (one unless `iommu.instances` says more).
    units: Vec<Unit>,
    /// Per device, its instance (index into `units`).
    dev_unit: Vec<usize>,
    cost: CpuCostModel,
    devs: Vec<BlockDev>,
    /// Per device, per interrupt vector: the completions it delivers.
    vectors: Vec<Vec<Channel<InFlight>>>,
    /// Per device, per interrupt vector: completions an NVMe device posted but whose
    /// interrupt its Interrupt Coalescing holds back (empty without coalescing).
    held: Vec<Vec<RefCell<Vec<InFlight>>>>,
    device: Device,
    k: BlockKernel,
    mmio_write_ns: u64,
    poll_interval_ns: u64,
    /// One magazine exchange with the depot (`cpu.depot_exchange`), ns.
    depot_exchange_ns: f64,
    iodepth: u64,
    slot_bytes: u64,
    pub(super) counters: RefCell<DmaCounters>,
    /// The physical ranges of the last device-side translation (reused, SMMUv3 only).
    ranges: RefCell<Vec<PhysRange>>,
    pub(super) error: RefCell<Option<String>>,
    /// Whether the path translates device addresses.
    pub(super) translated: bool,
    /// Per device, its hostile side (`[device.hostile]`), if it has one.
    hostile: Vec<Option<HostileDevice>>,
    h: Handle,
}

impl Stack {
    fn fail(&self, e: String) -> String {
        self.error.borrow_mut().get_or_insert(e).clone()
    }

    /// Takes the timed queue's part out of a map's or unmap's work record (SMMUv3's
    /// command queue, the x86 units' invalidation queues); nothing without a timed queue.
    fn split_queue(&self, w: &mut WorkRecord) -> QueueWork {
        match &self.units[0].queue {
            Some(q) => q.split_work(w),
            None => QueueWork::default(),
        }
    }

    /// What one map's or unmap's work record charges, computed once: the timed queue's part
    /// (taken out of `w`), the work done under the engine-modelled locks, the CPU time
    /// outside them (an error when the profile cannot price it) and those locks'
    /// acquisitions. Every map and unmap of the stack goes through it.
    #[inline(always)]
    fn charge(&self, w: &mut WorkRecord) -> Charge {
        if w.iova_32bit_failures | w.iova_full_range_allocs | w.iova_tree_retries != 0 {
            let mut c = self.counters.borrow_mut();
            c.iova_32bit_failures += w.iova_32bit_failures;
            c.iova_full_range_allocs += w.iova_full_range_allocs;
            c.iova_tree_retries += w.iova_tree_retries;
        }
        let queue = self.split_queue(w);
        // Every conversion of the record at once (kept for the records that repeat).
        let cost = self.cost.record_cost(w);
        let critical = self.critical_ns(w, &cost);
        Charge {
            queue,
            critical,
            ns: self.work_ns(w, &cost, critical),
            locks: Self::engine_locks(w),
        }
    }

    /// CPU time of a map or unmap outside the locks the engine models: the counted steps,
    /// the other locks (uncontended), the hypervisor's time for TCE hypercalls (POWER) and
    /// the IPMMU's flush polling. The work done under the IOVA-tree and flush-queue locks
    /// (`critical`, from [`Stack::critical_ns`]) is charged by [`Stack::locked`] instead.
    /// `cost` is the record's [`RecordCost`].
    fn work_ns(
        &self,
        w: &WorkRecord,
        cost: &RecordCost,
        critical: Critical,
    ) -> Result<f64, String> {
        let hv = match cost.hypervisor_ns {
            Some(hv) => hv,
            // Not priced: the profile has no hypervisor group; say so.
            None => self
                .cost
                .hypervisor_ns(w)
                .map_err(|e| self.fail(e.to_string()))?,
        };
        let polls = w.polls.saturating_sub(w.inval_domains) * self.poll_interval_ns;
        // The locks the engine models are charged by `locked`, not here.
        // A lock not taken adds +0.0, what `0 × cost` is for the profile's finite,
        // non-negative lock costs (as `CpuCostModel::locks_uncontended_ns` skips them).
        let engine_locks = ENGINE_LOCKS.map(|id| match w.lock_count(id) {
            0 => 0.0,
            n => n as f64 * self.cost.lock_uncontended_ns(id),
        });
        let [tree, fq, depot] = critical;
        Ok(cost.cpu_ns - tree - fq - depot + cost.locks_uncontended_ns
            - (engine_locks[0] + engine_locks[1] + engine_locks[2])
            + hv
            + polls as f64)
    }

    /// The acquisitions of the engine-modelled locks in `w` ([`ENGINE_LOCKS`]), for
    /// [`Stack::locked`] (so the record itself need not be kept across its awaits); `None`
    /// when `w` took none.
    fn engine_locks(w: &WorkRecord) -> Option<EngineLocks> {
        let locks = ENGINE_LOCKS.map(|id| w.lock_count(id));
        (locks != [0; 3]).then_some(locks)
    }

    /// CPU time of the work done under the IOVA tree's lock (tree walk, rotations) and
    /// under a flush queue's lock (ring adds, frees, flushes' bookkeeping), from the
    /// record's `cost`. Computed once per map or unmap and handed to [`Stack::work_ns`] and
    /// [`Stack::locked`].
    fn critical_ns(&self, w: &WorkRecord, cost: &RecordCost) -> Critical {
        // Work is charged under a lock only if the record took it (most maps and unmaps
        // take neither: the IOVA caches hit, strict mode has no flush queue).
        let tree = if w.lock_count(LockId::IovaTree) > 0 {
            cost.tree_ns
        } else {
            0.0
        };
        let fq = if w.lock_count(LockId::FlushQueue) > 0 {
            cost.flush_queue_ns
        } else {
            0.0
        };
        // The depot's magazine exchanges are done under its lock.
        let depot = if w.lock_count(LockId::RcacheDepot) > 0 {
            w.depot_exchanges as f64 * self.depot_exchange_ns
        } else {
            0.0
        };
        [tree, fq, depot]
    }

    /// Takes the IOVA-tree and flush-queue locks a work record took (`locks`, from
    /// [`Stack::engine_locks`]), each for its share of the work done under it, on `ctx`'s
    /// CPU (waiters spin). `critical` is [`Stack::critical_ns`] of the record.
    async fn locked(&self, u: &Unit, ctx: &Ctx, locks: EngineLocks, critical: Critical) {
        let [tree, fq, depot] = critical;
        let cpu = ctx.cpu().id();
        for (lock, n, ns) in [
            (&u.tree_lock, locks[0], tree),
            (&u.fq_locks[cpu % u.fq_locks.len()], locks[1], fq),
            (&u.depot_lock, locks[2], depot),
        ] {
            for i in 0..n {
                let g = lock.lock(ctx).await;
                if i == 0 && ns >= 0.5 {
                    ctx.cpu()
                        .spend(SimDuration::ns(round_ns(ns)), Account::System)
                        .await;
                }
                g.unlock().await;
            }
        }
    }

    /// Maps fio's buffer for `req` (`dma_map_single` of its slot's buffer) on `cpu`.
    #[inline(always)]
    fn map_fio(
        &self,
        req: IoRequest,
        cpu: usize,
        w: &mut WorkRecord,
    ) -> Result<(Mapping, IoShape, Done), String> {
        let pa =
            BUFFER_BASE + (req.job as u64 * self.iodepth + u64::from(req.slot)) * self.slot_bytes;
        let io = req.block_io();
        let devno = req.job % self.devs.len();
        let mapping = self
            .unit(devno)
            .path
            .map_single(
                &self.device,
                PhysAddr::new(pa),
                io.len,
                io.direction(),
                cpu,
                w,
            )
            .map_err(|e| self.fail(format!("dma map failed: {e}")))?;
        let shape = IoShape { io, devno };
        Ok((
            Mapping::Single(mapping),
            shape,
            Done::Fio(req.into_pending()),
        ))
    }

    /// Maps a block command (bonnie's page cache): `dma_map_sg` of its pages (physically
    /// contiguous ones coalesced) on `cpu`.
    fn map_command(
        &self,
        cmd: BlockCommand,
        cpu: usize,
        w: &mut WorkRecord,
    ) -> Result<(Mapping, IoShape, Done), String> {
        let io = BlockIo {
            is_read: cmd.dir == BlockDir::Read,
            offset: cmd.offset,
            len: cmd.pieces.iter().map(|p| p.len).sum(),
            stripe: BONNIE_SAS_STRIPE,
        };
        let entries = sg_entries(&cmd.pieces, self.device.max_segment_size());
        let sg = self
            .unit(0)
            .path
            .map_sg(&self.device, &entries, io.direction(), cpu, w)
            .map_err(|e| self.fail(format!("dma map_sg failed: {e}")))?;
        let shape = IoShape { io, devno: 0 };
        Ok((Mapping::Sg(sg), shape, Done::Command(cmd.on_done)))
    }

    /// One I/O's submission on `ctx`'s CPU: the block layer, the DMA map, the map's CPU time
    /// and locks, the driver and doorbell, the device's translated DMA, and the device's
    /// completion sent to its vector. One `async fn` for fio's requests and block commands
    /// (one state machine to poll through, not two nested ones).
    async fn submit(self: &Rc<Self>, ctx: &Ctx, sub: Submission) -> Result<(), String> {
        let cpu = ctx.cpu().id();
        ctx.cpu()
            .spend(SimDuration::ns(self.k.block_submit_ns), Account::System)
            .await;
        // One work record for the map and then the device's transfer (one record to zero
        // per submission, not two): the transfer's counters are read as what it added.
        let mut w = WorkRecord::new();
        let (u, mapping, io, devno, done, queue, critical, map_ns, locks, covered) = {
            let (mapping, IoShape { io, devno }, done) = match sub {
                Submission::Fio(req) => self.map_fio(req, cpu, &mut w)?,
                Submission::Command(cmd) => self.map_command(cmd, cpu, &mut w)?,
            };
            // A lazy flush the map ran closes the window of the unmaps before it.
            let u = self.unit(devno);
            let covered = u
                .window_closer
                .as_ref()
                .and_then(|c| c.finished_after(w.flush_queue_flushes));
            let ch = self.charge(&mut w);
            // A record that took neither lock has nothing to wait for or charge there.
            (
                u,
                mapping,
                io,
                devno,
                done,
                ch.queue,
                ch.critical,
                ch.ns?,
                ch.locks,
                covered,
            )
        };
        if let Some(locks) = locks {
            self.locked(u, ctx, locks, critical).await;
        }
        {
            let mut c = self.counters.borrow_mut();
            c.maps += 1;
            c.map_ns += map_ns;
        }
        // The trace's slice only when tracing (its arguments are not computed otherwise).
        if ctx.handle().tracer().is_on() {
            crate::trace::cpu_part(ctx, "dma map", ctx.now().as_ns(), map_ns.round() as u64);
        }
        ctx.cpu()
            .spend_labeled(
                SimDuration::ns(round_ns(map_ns) + self.k.driver_submit_ns + self.mmio_write_ns),
                Account::System,
                "dma map + driver submit",
            )
            .await;
        if let Some(q) = &u.queue {
            // A lazy flush run from the map path (its timer expired), if any; with VT-d
            // Caching Mode the map's own invalidation.
            q.issue_after_map(ctx, &queue).await;
        }
        if let Some(c) = &u.window_closer {
            c.closed(covered, ctx.now().as_ns());
        }
        let dma = self.device_dma(u);
        // A hostile device probes the bytes after the buffer it was just given.
        if let (Some(h), Mapping::Single(m)) = (&self.hostile[devno], &mapping) {
            h.on_mapped(m.dma_addr().0, m.len(), |a, n, acc| dma.reaches(a, n, acc));
        }
        // The device's DMA goes through the IOMMU (its IOTLB and walk cache for SMMUv3) or
        // its bypass, segment by segment, counted in the map's record: what the transfer
        // did is what it added to these counters. The unit's DMA port then times it.
        let tw = &mut w;
        let before = [tw.iotlb_hits, tw.iotlb_stale_hits, tw.translations];
        let access = io.access();
        let mut translated = Translated::default();
        let segments = match &mapping {
            Mapping::Single(m) => {
                translated = dma
                    .translate(m.dma_addr(), io.len, access, tw)
                    .map_err(|e| self.fail(e))?;
                1
            }
            Mapping::Sg(sg) => {
                for seg in sg.segments() {
                    translated.add(
                        dma.translate(seg.dma, seg.len, access, tw)
                            .map_err(|e| self.fail(e))?,
                    );
                }
                sg.segments().len()
            }
        };
        let [hits, stale_hits, translations] = [
            tw.iotlb_hits - before[0],
            tw.iotlb_stale_hits - before[1],
            tw.translations - before[2],
        ];
        let now = ctx.now().as_ns();
        let port = &self.unit(devno).port;
        let stalled = port.stats().stall_ns;
        let ported = (translations > 0).then_some(PortedDma { port, translated });
        let (at, vector) = self.devs[devno].service(now, cpu, io, ported);
        {
            let mut c = self.counters.borrow_mut();
            c.translation_ns += port.stats().stall_ns - stalled;
            c.iotlb_hits += hits;
            c.iotlb_misses += translated.misses;
            c.iotlb_stale_hits += stale_hits;
            c.walk_reads += translated.walk_reads;
            c.translated_ios += u64::from(translations > 0);
            c.ios += 1;
            if io.is_read {
                c.device_read_bytes += io.len;
            } else {
                c.device_write_bytes += io.len;
            }
            c.dma_segments += segments as u64;
        }
        let vector = vector % self.vectors[devno].len();
        let tracer = self.h.tracer();
        if tracer.is_on() {
            tracer.device(
                || match self.devs[devno] {
                    BlockDev::Nvme(_) => format!("nvme{devno} q{vector}"),
                    BlockDev::Sas(_) => format!("sas{devno} cq{vector}"),
                },
                io.name(),
                now,
                at.saturating_sub(now),
                &[("bytes", io.len)],
            );
        }
        let item = InFlight { done, mapping };
        // The device's completion at `at`: a timer callback, the same run as an agent that
        // sleeps until `at` and sends (see `Handle::call_at`) without a task per I/O. The
        // indices ride as `u32`s: with them the callback's capture stays within 128 bytes,
        // which the compiler moves inline rather than with a `memcpy` call.
        let stack = self.clone();
        let (d32, v32) = (devno as u32, vector as u32);
        self.h
            .call_at(SimTime::from_ns(at), move || {
                stack.post_completion(d32 as usize, v32 as usize, item)
            })
            .map_err(|e| self.fail(e.to_string()))?;
        Ok(())
    }

    /// Device `devno` posts a completion on its vector `vector`: the interrupt is raised
    /// now, or, on an NVMe device with Interrupt Coalescing (feature 08h), held until the
    /// aggregation threshold or time ([`Nvme::post_completion`]).
    fn post_completion(self: &Rc<Self>, devno: usize, vector: usize, item: InFlight) {
        let nvme = match &self.devs[devno] {
            BlockDev::Nvme(d) if d.coalescing().is_active() => d,
            // No coalescing: the interrupt now, `item` sent as is (not through an `Option`).
            _ => {
                let _ = self.raise(devno, vector).send(item);
                return;
            }
        };
        match nvme.post_completion(vector, self.h.now().as_ns()) {
            Post::Interrupt => self.interrupt(devno, vector, Some(item)),
            Post::Hold => self.held[devno][vector].borrow_mut().push(item),
            Post::ArmTimer { at, token } => {
                self.held[devno][vector].borrow_mut().push(item);
                let stack = self.clone();
                let armed = self.h.call_at(SimTime::from_ns(at), move || {
                    if let BlockDev::Nvme(d) = &stack.devs[devno] {
                        if d.timer_expired(vector, token) {
                            stack.interrupt(devno, vector, None);
                        }
                    }
                });
                if let Err(e) = armed {
                    self.fail(e.to_string());
                }
            }
        }
    }

    /// Raises vector `vector` of device `devno`: the completions coalescing held, then
    /// `item`, go to its handler.
    fn interrupt(&self, devno: usize, vector: usize, item: Option<InFlight>) {
        let chan = self.raise(devno, vector);
        if let Some(f) = item {
            let _ = chan.send(f);
        }
    }

    /// The interrupt of vector `vector` of device `devno` (counted), the completions
    /// coalescing held sent to its handler; returns the vector's channel for the one that
    /// raised it, sent after them.
    #[inline]
    fn raise(&self, devno: usize, vector: usize) -> &Channel<InFlight> {
        self.counters.borrow_mut().interrupts += 1;
        let chan = &self.vectors[devno][vector];
        let mut held = self.held[devno][vector].borrow_mut();
        if !held.is_empty() {
            for f in held.drain(..) {
                let _ = chan.send(f);
            }
        }
        chan
    }

    /// `dma_map_single` of `len` bytes at `pa` on `ctx`'s CPU, charged as the fio path charges
    /// its map (the counted work, the engine-modelled locks, a lazy flush the map path ran),
    /// without the block layer or the device (`dma_map_benchmark`).
    pub(super) async fn map_single_timed(
        &self,
        ctx: &Ctx,
        pa: u64,
        len: u64,
        dir: Direction,
    ) -> Result<MappedBuffer, String> {
        let cpu = ctx.cpu().id();
        let (mapped, queue, critical, map_ns, locks, covered) = {
            let mut w = WorkRecord::new();
            let mapped = self.units[0]
                .path
                .map_single(&self.device, PhysAddr::new(pa), len, dir, cpu, &mut w)
                .map_err(|e| self.fail(format!("dma map failed: {e}")))?;
            let covered = self.units[0]
                .window_closer
                .as_ref()
                .and_then(|c| c.finished_after(w.flush_queue_flushes));
            let ch = self.charge(&mut w);
            (mapped, ch.queue, ch.critical, ch.ns?, ch.locks, covered)
        };
        let u = &self.units[0];
        if let Some(locks) = locks {
            self.locked(u, ctx, locks, critical).await;
        }
        {
            let mut c = self.counters.borrow_mut();
            c.maps += 1;
            c.map_ns += map_ns;
        }
        ctx.cpu()
            .spend_labeled(
                SimDuration::ns(round_ns(map_ns)),
                Account::System,
                "dma map",
            )
            .await;
        if let Some(q) = &u.queue {
            q.issue_after_map(ctx, &queue).await;
        }
        if let Some(c) = &u.window_closer {
            c.closed(covered, ctx.now().as_ns());
        }
        Ok(mapped)
    }

    /// `dma_unmap_single` of `buf` on `ctx`'s CPU, charged as the fio path's completion
    /// charges its unmap (the counted work, the engine-modelled locks, the invalidation in
    /// the command queue).
    pub(super) async fn unmap_single_timed(
        &self,
        ctx: &Ctx,
        buf: MappedBuffer,
    ) -> Result<(), String> {
        let cpu = ctx.cpu().id();
        let (queue, critical, unmap_ns, locks, covered) = {
            let mut w = WorkRecord::new();
            self.units[0]
                .path
                .unmap_single(buf, cpu, ctx.now().as_ns(), &mut w)
                .map_err(|e| self.fail(format!("dma unmap failed: {}", e.error)))?;
            let covered = self.units[0]
                .window_closer
                .as_ref()
                .and_then(|c| c.finished_after(w.flush_queue_flushes));
            let ch = self.charge(&mut w);
            let unmap_ns = ch.ns?;
            let mut c = self.counters.borrow_mut();
            c.unmaps += 1;
            c.unmap_ns += unmap_ns;
            c.inval_syncs += w.inval_syncs;
            c.flush_queue_flushes += w.flush_queue_flushes;
            (ch.queue, ch.critical, unmap_ns, ch.locks, covered)
        };
        ctx.cpu()
            .spend_labeled(
                SimDuration::ns(round_ns(unmap_ns)),
                Account::System,
                "dma unmap",
            )
            .await;
        let u = &self.units[0];
        if let Some(locks) = locks {
            self.locked(u, ctx, locks, critical).await;
        }
        if let Some(q) = &u.queue {
            q.issue_after_unmap(ctx, &queue)
                .await
                .map_err(|e| self.fail(e))?;
        }
        if let Some(c) = &u.window_closer {
            c.closed(covered, ctx.now().as_ns());
        }
        Ok(())
    }

    /// The queue statistics of every instance (SMMUv3 command queues or x86 invalidation
    /// queues), in instance order; empty without a timed queue.
    pub(super) fn queue_stats(&self) -> Vec<crate::iommu::cmdq::CmdqStats> {
        self.units
            .iter()
            .filter_map(|u| u.queue.as_ref().map(TimedQueue::stats))
            .collect()
    }

    /// The queue statistics summed over the instances, when the path has a timed queue.
    pub(super) fn cmdq_stats(&self) -> Option<crate::iommu::cmdq::CmdqStats> {
        let all = self.queue_stats();
        let (first, rest) = all.split_first()?;
        let mut t = *first;
        for q in rest {
            t.merge(q);
        }
        Some(t)
    }

    /// The run's protection report: every instance's, merged.
    pub(super) fn protection(&self, run_ns: u64) -> LabProtection {
        let read = |u: &Unit| u.protection.read(self.translated, run_ns);
        let mut p = read(&self.units[0]);
        for u in &self.units[1..] {
            p.merge(&read(u));
        }
        p
    }

    /// What the hostile devices reached, summed; `None` when no device is hostile.
    pub(super) fn exposure(&self) -> Option<ExposureReport> {
        let mut it = self.hostile.iter().flatten();
        let mut r = it.next()?.report();
        for h in it {
            r.add(&h.report());
        }
        Some(r)
    }

    /// The SMMUv3 event queues' counts summed over the instances; `None` without an SMMUv3
    /// in a translated mode.
    pub(super) fn event_counts(&self) -> Option<EventCounts> {
        let mut out: Option<EventCounts> = None;
        for p in self
            .units
            .iter()
            .filter_map(|u| u.queue.as_ref()?.smmu_path())
        {
            let f = p.smmu().fault_stats();
            let e = out.get_or_insert_with(EventCounts::default);
            e.written += f.events_written;
            e.lost += f.events_lost;
            e.overflows += f.event_queue_overflows;
        }
        out
    }

    /// Starts the SMMUv3 driver's event thread of every instance: it reads every record
    /// and acknowledges an overflow each `every_ns` until `stop_ns`. Only a hostile device
    /// faults in the lab, so it runs only when one is present.
    fn start_event_threads(&self, every_ns: u64, stop_ns: u64) -> Result<(), LabError> {
        if self.hostile.iter().all(Option::is_none) {
            return Ok(());
        }
        for p in self
            .units
            .iter()
            .filter_map(|u| u.queue.as_ref()?.smmu_path())
        {
            let (p, every) = (p.clone(), every_ns.max(1));
            self.h.spawn_agent(move |actx| async move {
                let mut next = every;
                while next <= stop_ns {
                    actx.sleep_until(SimTime::from_ns(next)).await;
                    p.smmu().with_events(|q| {
                        q.drain();
                        q.ack_overflow();
                    });
                    next += every;
                }
            })?;
        }
        Ok(())
    }

    /// The instance device `devno` sits behind.
    fn unit(&self, devno: usize) -> &Unit {
        &self.units[self.dev_unit[devno]]
    }

    /// The device's DMA through the IOMMU instance `u` (its path's device side: the unit's
    /// IOTLB and walk caches, into the stack's reused range buffer) or its bypass.
    fn device_dma<'a>(&'a self, u: &'a Unit) -> DeviceDma<'a> {
        DeviceDma {
            path: &*u.path,
            device: &self.device,
            ranges: &self.ranges,
        }
    }

    /// The interrupt handler of one vector, on its CPU: drains every completion queued.
    async fn irq_loop(self: Rc<Self>, ctx: Ctx, dev: usize, v: usize) {
        let chan = self.vectors[dev][v].clone();
        let cpu = ctx.cpu().id();
        let u = self.unit(dev);
        let hostile = self.hostile[dev].as_ref();
        loop {
            let mut f = chan.recv(&ctx).await;
            {
                // The run and its first completion, counted at once (no await between).
                let mut c = self.counters.borrow_mut();
                c.irq_handler_runs += 1;
                c.completions += 1;
            }
            // The entry touches nothing another CPU sees: one fused span with the first
            // completion's driver time (`Cpu::defer`).
            ctx.cpu()
                .defer(SimDuration::ns(self.k.irq_entry_ns), Account::System);
            loop {
                // The completion of one I/O (inline rather than an `async fn`: one state
                // machine less to poll through on every wake-up).
                ctx.cpu()
                    .spend(SimDuration::ns(self.k.driver_complete_ns), Account::System)
                    .await;
                // The work record is scoped to this block, so it is not kept in the
                // future across the awaits below (as in `submit`).
                let (queue, critical, unmap_ns, locks, covered) = {
                    let mut w = WorkRecord::new();
                    let probe = match (hostile, &f.mapping) {
                        (Some(h), Mapping::Single(m)) => Some((h, m.dma_addr().0, m.len())),
                        _ => None,
                    };
                    let unmapped = match f.mapping {
                        Mapping::Single(m) => u
                            .path
                            .unmap_single(m, cpu, ctx.now().as_ns(), &mut w)
                            .map_err(|e| e.error),
                        Mapping::Sg(sg) => u
                            .path
                            .unmap_sg(sg, cpu, ctx.now().as_ns(), &mut w)
                            .map_err(|e| e.error),
                    };
                    if let Err(e) = unmapped {
                        self.fail(format!("dma unmap failed: {e}"));
                    }
                    // A hostile device strikes at once, before anything can map that
                    // address again.
                    if let Some((h, addr, len)) = probe {
                        let dma = self.device_dma(u);
                        h.probe_unmapped(addr, len, |a, n, acc| dma.reaches(a, n, acc));
                    }
                    let covered = u
                        .window_closer
                        .as_ref()
                        .and_then(|c| c.finished_after(w.flush_queue_flushes));
                    // The queue's work is timed by the unit's `TimedQueue`; the rest is the
                    // CPU's.
                    let ch = self.charge(&mut w);
                    let unmap_ns = ch.ns.unwrap_or(0.0);
                    let mut c = self.counters.borrow_mut();
                    c.unmaps += 1;
                    c.unmap_ns += unmap_ns;
                    c.inval_syncs += w.inval_syncs;
                    c.flush_queue_flushes += w.flush_queue_flushes;
                    (ch.queue, ch.critical, unmap_ns, ch.locks, covered)
                };
                ctx.cpu()
                    .spend_labeled(
                        SimDuration::ns(round_ns(unmap_ns)),
                        Account::System,
                        "dma unmap",
                    )
                    .await;
                if let Some(locks) = locks {
                    self.locked(u, &ctx, locks, critical).await;
                }
                if let Some(q) = &u.queue {
                    if let Err(e) = q.issue_after_unmap(&ctx, &queue).await {
                        self.fail(e);
                    }
                }
                if let Some(c) = &u.window_closer {
                    c.closed(covered, ctx.now().as_ns());
                }
                ctx.cpu()
                    .spend(SimDuration::ns(self.k.block_complete_ns), Account::System)
                    .await;
                match f.done {
                    Done::Fio(pending) => pending.complete(),
                    Done::Command(on_done) => on_done(),
                }
                // The next completion queued, if any, counted as it is taken.
                match chan.try_recv() {
                    Some(n) => {
                        self.counters.borrow_mut().completions += 1;
                        f = n;
                    }
                    None => break,
                }
            }
        }
    }
}

struct Target(Rc<Stack>);

impl BlockTarget for Target {
    fn submit<'a>(
        &'a self,
        ctx: &'a Ctx,
        req: IoRequest,
    ) -> impl std::future::Future<Output = Result<(), String>> + 'a {
        self.0.submit(ctx, Submission::Fio(req))
    }

    /// [`Stack::submit`] spends the block layer's time before it maps.
    fn charges_deferred(&self) -> bool {
        true
    }
}

/// What one fio run produced.
pub(crate) struct FioRun {
    pub job: FioJob,
    pub stats: GroupStats,
    pub json: JobJson,
    pub cpu: CpuBreakdown,
    pub dma: DmaCounters,
    pub cmdq: Option<crate::iommu::cmdq::CmdqStats>,
    /// Per IOMMU instance, its queue's statistics (`cmdq` is their sum).
    pub queues: Vec<crate::iommu::cmdq::CmdqStats>,
    pub irq_cpus: usize,
    /// Whether the device's DMA went through the SMMUv3 model's IOTLB.
    pub iotlb: bool,
    /// The IOVA tree's lock over the measured window: (acquisitions, contended).
    pub tree_lock: (u64, u64),
    /// The IOVA magazine depot's lock over the measured window: (acquisitions, contended).
    pub depot_lock: (u64, u64),
    /// CPU time spent spinning on each kind of spinlock over the measured window, ns, the
    /// most first (per-CPU and per-instance locks summed under one name: `flush_queue_lock`).
    pub spin_by_lock: Vec<(String, u64)>,
    /// The SMMUv3 spinlock command queue's lock over the measured window, summed over the
    /// instances: (acquisitions, contended, total wait ns); zeros for other queues.
    pub cmdq_lock: (u64, u64, u64),
    /// The measured window's two halves, for the steady-state check.
    pub halves: WindowHalves,
    /// Where the measured window was placed.
    pub window: WindowUse,
    /// What fio's `steadystate` found, when the job set it.
    pub steadystate: Option<SteadyStateOutcome>,
    /// The protection report over the whole run.
    pub protection: LabProtection,
    /// What the hostile devices reached (`[device.hostile]`), if any is.
    pub exposure: Option<ExposureReport>,
    /// The SMMUv3 event queues, when a hostile device probed through an SMMUv3.
    pub events: Option<EventCounts>,
}

/// What the two halves of a fio run's measured window saw: a run still warming up (caches
/// filling, queues growing) shows it as a difference between them. fio's own `steadystate`
/// option judges the same way, from the trend of IOPS over a window.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct WindowHalves {
    /// I/Os completed (and counted) in the first and the second half.
    pub ios: [u64; 2],
    /// IOVA tree lock acquisitions in the first and the second half.
    pub tree_allocs: [u64; 2],
    /// I/Os the jobs keep in flight (`iodepth x numjobs`).
    pub inflight: u64,
}

impl WindowHalves {
    /// The IOPS change from the first half to the second, in percent (0 without I/O).
    pub(crate) fn iops_change_pct(&self) -> f64 {
        let [a, b] = self.ios;
        if a == 0 {
            return 0.0;
        }
        (b as f64 - a as f64) / a as f64 * 100.0
    }

    /// Whether the window looks like steady state: the halves' I/O counts differ by at most
    /// [`Self::STEADY_PCT`] percent, or by at most twice the I/Os in flight (a batch of up
    /// to that many completions reaped together can fall on either side of the midpoint,
    /// which moves it from one half to the other and changes the difference by twice its
    /// size; so can one at the window's end).
    pub(crate) fn is_steady(&self) -> bool {
        let [a, b] = self.ios;
        let allowed = (a as f64 * Self::STEADY_PCT / 100.0).max(2.0 * self.inflight as f64);
        (b as f64 - a as f64).abs() <= allowed
    }

    /// The largest IOPS change between the halves still called steady, in percent, once the
    /// halves hold more I/Os than are in flight. A stated assumption: the lab is
    /// deterministic, and a steady run's halves differ by the randomness of its offsets and
    /// arrivals alone, well under 1% at the bundled examples' scale; 5% leaves room for short
    /// windows.
    pub(crate) const STEADY_PCT: f64 = 5.0;
}

/// The fio job of a scenario.
pub(crate) fn fio_job(s: &LabScenario, f: &FioSetup) -> FioJob {
    FioJob {
        name: s.name.clone(),
        rw: f.rw,
        rwmixread: f.rwmixread,
        bs: f.bs,
        iodepth: f.iodepth,
        batch_submit: f.batch_submit,
        batch_complete_min: f.batch_complete_min,
        numjobs: f.numjobs,
        size: f.size,
        runtime: SimDuration::ns(f.runtime_ns),
        ramp: SimDuration::ns(f.ramp_ns),
        cpus: (f.first_cpu..f.first_cpu + f.numjobs as usize).collect(),
        user_ns_per_io: f.user_ns_per_io,
        syscall_ns: s.profile.cpu.syscall.ns().round() as u64,
        engine: f.engine,
        sq_cpus: f.sq_cpus.clone(),
    }
}

/// The label [`derive_seed`](crate::engine::rng::derive_seed) takes, plus the device's
/// index, for an NVMe drive's media-latency stream.
const NVME_MEDIA_STREAM: u64 = 0x6e76_6d65_0000_0000;

/// The block stack of `s` on `sim` with its interrupt handlers started: vectors hold up to
/// `inflight_cap` completions; fio's buffers are `slot_bytes` each, `iodepth` per job.
/// Returns the stack and how many CPUs take its interrupts.
pub(super) fn start_stack(
    s: &LabScenario,
    sim: &mut Sim,
    seed: u64,
    inflight_cap: usize,
    iodepth: u64,
    slot_bytes: u64,
) -> Result<(Rc<Stack>, usize), LabError> {
    let h = sim.handle().clone();
    // One IOMMU instance per `iommu.instances`, each built as the one-instance path is (its
    // own SMMU or DMAR unit, domain, IOVA tree and magazines, timed queue), in order.
    let mut built = Vec::with_capacity(s.iommu.instances);
    for k in 0..s.iommu.instances.max(1) {
        built.push(iommu::build_instance(
            s,
            &h,
            k,
            iolab_iommu::dma::WindowClose::Reported,
        )?);
    }
    // The NVMe controllers' DMA mask (`device[i].dma_mask_bits`, one for all); the SAS HBA's
    // is 64 bits.
    let mask_bits = match &s.devices {
        Devices::Nvme(ps) => ps.first().map_or(64, |p| p.dma_mask_bits),
        _ => 64,
    };
    let device = iommu::lab_device(mask_bits)?;
    let translated = built[0].translated;
    let poll_interval_ns = built[0].poll_interval_ns;
    // Interrupt vectors and the CPUs they are affine to: NVMe queue q on CPU q (managed
    // interrupts, one queue per CPU); SAS completion queue q on CPU q (mod CPUs).
    let (devs, vector_cpus): (Vec<BlockDev>, Vec<Vec<usize>>) = match &s.devices {
        Devices::Nvme(ps) => ps
            .iter()
            .enumerate()
            .map(|(k, p)| {
                // Each drive's media latencies come from a stream of its own, derived from
                // the run's seed, so they move no other random draw.
                let stream = crate::engine::rng::derive_seed(seed, NVME_MEDIA_STREAM + k as u64);
                (
                    BlockDev::Nvme(
                        Nvme::new(p.params)
                            .with_coalescing(p.coalescing)
                            .with_dma_link(p.dma_link)
                            .with_seed(stream),
                    ),
                    (0..p.params.io_queues).map(|q| q % s.cpus).collect(),
                )
            })
            .unzip(),
        Devices::Sas(ps) => ps
            .iter()
            .map(|p| {
                (
                    BlockDev::Sas(SasHba::new(*p)),
                    (0..p.completion_queues).map(|q| q % s.cpus).collect(),
                )
            })
            .unzip(),
        other => {
            return Err(model_err(format!(
                "a block workload needs nvme or sas devices, not {}",
                other.kind()
            )))
        }
    };
    let cost = s.profile.cpu_cost_model();
    let mut units = Vec::with_capacity(built.len());
    for (k, b) in built.into_iter().enumerate() {
        let tag = if k == 0 {
            String::new()
        } else {
            format!("#{k}")
        };
        // Lazy mode over a timed queue: its syncs close the domain's stale windows.
        let window_closer = (b.queue.as_ref())
            .map(|q| q.domain().clone())
            .filter(|d| d.flush_queue().is_some())
            .map(|domain| WindowCloser { domain });
        units.push(Unit {
            window_closer,
            path: b.path,
            queue: b.queue,
            tree_lock: SpinLock::new(&h, tree_lock_name(k), lock_params(s))?,
            fq_locks: (0..s.cpus)
                .map(|c| SpinLock::new(&h, format!("flush_queue_lock{c}{tag}"), lock_params(s)))
                .collect::<Result<Vec<_>, _>>()?,
            depot_lock: SpinLock::new(&h, depot_lock_name(k), lock_params(s))?,
            port: DmaPort::new(s.profile.port_params()),
            protection: b.protection,
        });
    }
    let dev_unit = (0..devs.len()).map(|d| s.iommu.instance_of(d)).collect();
    let stack = Rc::new(Stack {
        units,
        dev_unit,
        poll_interval_ns,
        depot_exchange_ns: cost.cpu_weight("depot_exchanges").unwrap_or(0.0),
        cost,
        devs,
        vectors: vector_cpus
            .iter()
            .map(|v| v.iter().map(|_| Channel::new(&h, inflight_cap)).collect())
            .collect(),
        held: vector_cpus
            .iter()
            .map(|v| v.iter().map(|_| RefCell::new(Vec::new())).collect())
            .collect(),
        device,
        k: s.kernel,
        mmio_write_ns: s.profile.mmio.write.ns().round() as u64,
        iodepth,
        slot_bytes,
        counters: RefCell::new(DmaCounters::default()),
        ranges: RefCell::new(Vec::new()),
        error: RefCell::new(None),
        translated,
        hostile: match &s.devices {
            Devices::Nvme(ps) => ps
                .iter()
                .map(|p| p.hostile.map(HostileDevice::new))
                .collect(),
            other => (0..other.len()).map(|_| None).collect(),
        },
        h: h.clone(),
    });
    let mut irq_cpus: Vec<usize> = Vec::new();
    for (d, cpus) in vector_cpus.iter().enumerate() {
        for (v, &cpu) in cpus.iter().enumerate() {
            let st = stack.clone();
            sim.spawn_on(cpu, move |ctx| st.irq_loop(ctx, d, v))?;
            if !irq_cpus.contains(&cpu) {
                irq_cpus.push(cpu);
            }
        }
    }
    Ok((stack, irq_cpus.len()))
}

/// Runs fio of `s` once with `seed`.
/// How the measured window was placed: the ramp asked for, the ramp used, and whether the
/// window is steady.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct WindowUse {
    /// `workload.ramp_ms`, ns: the least ramp.
    pub asked_ramp_ns: u64,
    /// The ramp the measured window followed, ns: longer than asked when the lab extended
    /// it past a transient.
    pub ramp_ns: u64,
    /// Whether the measured window is steady ([`WindowHalves::is_steady`]).
    pub steady: bool,
}

impl WindowUse {
    /// How long the transient ran past the ramp asked for, ns (0 when not extended).
    pub(crate) fn transient_ns(&self) -> u64 {
        self.ramp_ns - self.asked_ramp_ns
    }
}

/// Runs a fio workload and, unless `workload.exact_window` is set, makes its window stand
/// for the long run: when the window after `ramp_ms` is not steady, the lab looks for the
/// first window-long span after the ramp, in steps of half a window, whose halves are
/// steady, up to [`d::FIO_RAMP_EXTENSION_WINDOWS`] windows past the ramp, and measures
/// there. The run is deterministic, so the events before that window are the probe's.
pub(crate) fn run_fio(s: &LabScenario, f: &FioSetup, seed: u64) -> Result<FioRun, LabError> {
    if let Some(ss) = f.steadystate {
        return run_fio_steadystate(s, f, seed, ss);
    }
    let mut out = run_fio_window(s, f, seed)?;
    if out.halves.is_steady() || f.exact_window {
        return Ok(out);
    }
    let Some(ramp_ns) = steady_ramp(s, f, seed)? else {
        return Ok(out);
    };
    let mut later = f.clone();
    later.ramp_ns = ramp_ns;
    out = run_fio_window(s, &later, seed)?;
    out.window.asked_ramp_ns = f.ramp_ns;
    Ok(out)
}

/// fio's `steadystate`: samples every `ss.interval_ns` from `ramp + ss_ramp` on; the job ends
/// at the first sample at which the criterion holds over the last `ss_dur`, and those
/// `ss_dur` are measured. Not attained within the runtime, the run is the window given.
fn run_fio_steadystate(
    s: &LabScenario,
    f: &FioSetup,
    seed: u64,
    ss: fio::SteadyState,
) -> Result<FioRun, LabError> {
    let (mut sim, _spec, stats, stack, _) = start_fio(s, f, seed)?;
    let from = f.ramp_ns + ss.ramp_ns;
    {
        let mut st = stats.borrow_mut();
        st.slice_ns = ss.interval_ns;
        st.slices_from_ns = from;
    }
    let end_ns = f.ramp_ns + f.runtime_ns;
    let end = SimTime::ZERO + SimDuration::ns(end_ns);
    let n = ss.samples();
    let per_sample = |count: u64| {
        let iops = count as f64 / (ss.interval_ns as f64 / 1e9);
        if ss.on_bandwidth() {
            iops * f.bs as f64 / 1024.0
        } else {
            iops
        }
    };
    let mut attained = None;
    let mut last = f64::INFINITY;
    let mut k = 0u64;
    while from + (k + 1) * ss.interval_ns <= end_ns {
        let t = SimTime::ZERO + SimDuration::ns(from + (k + 1) * ss.interval_ns);
        advance(&mut sim, &stack, &stats, t, end)?;
        if k + 1 >= n as u64 {
            let st = stats.borrow();
            let samples: Vec<f64> = (k + 1 - n as u64..=k)
                .map(|i| per_sample(st.slices.get(i as usize).copied().unwrap_or(0)))
                .collect();
            let (value, holds) = ss.judge(&samples);
            last = value;
            if holds {
                attained = Some(from + (k + 1) * ss.interval_ns);
                break;
            }
        }
        k += 1;
    }
    drop(sim);
    let mut out = match attained {
        Some(at) => {
            let mut judged = f.clone();
            judged.ramp_ns = at - n as u64 * ss.interval_ns;
            judged.runtime_ns = n as u64 * ss.interval_ns;
            judged.steadystate = None;
            let mut out = run_fio_window(s, &judged, seed)?;
            out.window.asked_ramp_ns = out.window.ramp_ns;
            out
        }
        None => run_fio_window(s, f, seed)?,
    };
    out.steadystate = Some(SteadyStateOutcome {
        attained_at_ns: attained,
        criterion: last,
    });
    Ok(out)
}

/// Runs a probe's simulation to `t` (of `end`, for the progress hook); the first error the
/// stack or a job hit stops it.
fn advance(
    sim: &mut Sim,
    stack: &Stack,
    stats: &SharedStats,
    t: SimTime,
    end: SimTime,
) -> Result<(), LabError> {
    sim.run_until_observed(t, end)?;
    match stack
        .error
        .borrow()
        .clone()
        .or(stats.borrow().error.clone())
    {
        Some(e) => Err(LabError::Model(e)),
        None => Ok(()),
    }
}

/// What fio's `steadystate` found.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct SteadyStateOutcome {
    /// When the criterion held (the job's end), ns; `None` if never within the runtime.
    pub attained_at_ns: Option<u64>,
    /// The criterion's last value (in the limit's unit).
    pub criterion: f64,
}

/// The first ramp (at least `f.ramp_ns`, in steps of half the window) after which a
/// window-long span is steady, or `None` within the cap.
fn steady_ramp(s: &LabScenario, f: &FioSetup, seed: u64) -> Result<Option<u64>, LabError> {
    let half = (f.runtime_ns / 2).max(1);
    let cap = f.ramp_ns + d::FIO_RAMP_EXTENSION_WINDOWS.0 * f.runtime_ns;
    let mut probe = f.clone();
    // The jobs run through every candidate window.
    probe.ramp_ns = cap;
    let (mut sim, spec, stats, stack, _) = start_fio(s, &probe, seed)?;
    {
        let mut st = stats.borrow_mut();
        st.slice_ns = half;
        st.slices_from_ns = f.ramp_ns;
    }
    let end = SimTime::ZERO + SimDuration::ns(cap + f.runtime_ns);
    let inflight = u64::from(f.iodepth) * u64::from(f.numjobs);
    // Slices k and k + 1 are the halves of the window after a ramp of ramp + k x half.
    let mut k = 0u64;
    while f.ramp_ns + k * half <= cap {
        let t = SimTime::ZERO + SimDuration::ns(f.ramp_ns + (k + 2) * half);
        advance(&mut sim, &stack, &stats, t, end)?;
        let st = stats.borrow();
        let at = |i: u64| st.slices.get(i as usize).copied().unwrap_or(0);
        let halves = WindowHalves {
            ios: [at(k), at(k + 1)],
            inflight,
            tree_allocs: [0, 0],
        };
        // Past the ramp asked for (k = 0 was the window already found unsteady).
        if k > 0 && halves.is_steady() {
            return Ok(Some(f.ramp_ns + k * half));
        }
        k += 1;
    }
    drop(spec);
    Ok(None)
}

/// A fio simulation with its jobs spawned: the sim, the job, the shared stats, the block
/// stack, and how many CPUs take its interrupts.
type StartedFio = (Sim, Rc<FioJob>, SharedStats, Rc<Stack>, usize);

/// The simulation of a fio workload, its jobs spawned.
fn start_fio(s: &LabScenario, f: &FioSetup, seed: u64) -> Result<StartedFio, LabError> {
    let mut sim = Sim::for_machine(SimConfig { cpus: s.cpus, seed }, &s.profile)?;
    let inflight_cap = f.iodepth as usize * f.numjobs as usize + 1;
    let (stack, irq_cpus) = start_stack(
        s,
        &mut sim,
        seed,
        inflight_cap,
        u64::from(f.iodepth),
        // fio carves each job's buffers `bs` apart from one area (`iomem_align` aligns the
        // first only): sub-page buffers share pages, as they do under fio.
        f.bs,
    )?;
    let spec = Rc::new(fio_job(s, f));
    let stats: SharedStats = Rc::new(RefCell::new(GroupStats::default()));
    let target = Rc::new(Target(stack.clone()));
    for j in 0..spec.numjobs as usize {
        let cpu = spec.cpus[j % spec.cpus.len()];
        let (job_spec, stats) = (spec.clone(), stats.clone());
        if spec.engine.sqthread_poll {
            // The job places its requests in its ring; its polling thread submits them.
            let ring = Rc::new(fio::SqRing::new(sim.handle(), spec.iodepth as usize));
            let (r, t, st) = (ring.clone(), target.clone(), stats.clone());
            sim.spawn_on(spec.sq_cpus[j], move |ctx| {
                fio::run_sq_thread(ctx, r, t, st)
            })?;
            sim.spawn_on(cpu, move |ctx| fio::run_job(ctx, job_spec, j, ring, stats))?;
        } else {
            let target = target.clone();
            sim.spawn_on(cpu, move |ctx| {
                fio::run_job(ctx, job_spec, j, target, stats)
            })?;
        }
    }
    Ok((sim, spec, stats, stack, irq_cpus))
}

/// One fio run measured in the window after `f.ramp_ns`.
fn run_fio_window(s: &LabScenario, f: &FioSetup, seed: u64) -> Result<FioRun, LabError> {
    let (mut sim, spec, stats, stack, irq_cpus) = start_fio(s, f, seed)?;
    let job = (*spec).clone();
    let t0 = SimTime::ZERO + spec.ramp;
    let t1 = t0 + spec.runtime;
    let t_mid = t0 + SimDuration::ns(spec.runtime.as_ns() / 2);
    stack.start_event_threads(s.iommu.evtq_drain_ns, t1.as_ns())?;
    let counted = |g: &GroupStats| (g.read.clat_ns.len() + g.write.clat_ns.len()) as u64;
    // CPUs that poll never idle: the jobs' with polled completions, the submission threads'.
    let mut polling: Vec<usize> = Vec::new();
    if s.kernel.polled {
        polling.extend(&spec.cpus);
    }
    polling.extend(&spec.sq_cpus);
    let polled = |mut r: RunReport| {
        polling_is_busy(&mut r, &polling);
        r
    };
    let before: RunReport = polled(sim.run_until_observed(t0, t1)?);
    let mid: RunReport = polled(sim.run_until_observed(t_mid, t1)?);
    let ios_first = counted(&stats.borrow());
    let after: RunReport = polled(sim.run_until_observed(t1, t1)?);
    let end = sim.run()?.end.as_ns();
    if let Some(e) = stack
        .error
        .borrow()
        .clone()
        .or(stats.borrow().error.clone())
    {
        return Err(LabError::Model(e));
    }
    let (usr, sys) = fio::cpu_usage(&before, &after, &spec.cpus);
    let cpu = CpuBreakdown::between(&sum_cpus(&before), &sum_cpus(&after));
    let g = stats.borrow().clone();
    let ios_total = counted(&g);
    let json = fio::job_json(&spec, &g, usr, sys);
    let dma = *stack.counters.borrow();
    let cmdq = stack.cmdq_stats();
    let queues = stack.queue_stats();
    let spin_by_lock = spin_by_lock(&before, &after);
    let window_of = |name: fn(usize) -> String, a: &RunReport, b: &RunReport| {
        (0..stack.units.len()).fold((0, 0), |(n, c), k| {
            let (n1, c1) = lock_window(a, b, &name(k));
            (n + n1, c + c1)
        })
    };
    let tree_window = |a: &RunReport, b: &RunReport| window_of(tree_lock_name, a, b);
    let cmdq_lock = (0..stack.units.len()).fold((0, 0, 0), |(n, c, w), k| {
        let (n1, c1, w1) = lock_window_wait(&before, &after, &cmdq_lock_name(k));
        (n + n1, c + c1, w + w1)
    });
    let halves = WindowHalves {
        ios: [ios_first, ios_total.saturating_sub(ios_first)],
        inflight: u64::from(f.iodepth) * u64::from(f.numjobs),
        tree_allocs: [tree_window(&before, &mid).0, tree_window(&mid, &after).0],
    };
    Ok(FioRun {
        job,
        stats: g,
        json,
        cpu,
        dma,
        iotlb: cmdq.is_some(),
        tree_lock: tree_window(&before, &after),
        depot_lock: window_of(depot_lock_name, &before, &after),
        spin_by_lock,
        cmdq_lock,
        halves,
        window: WindowUse {
            asked_ramp_ns: f.ramp_ns,
            ramp_ns: f.ramp_ns,
            steady: halves.is_steady(),
        },
        steadystate: None,
        cmdq,
        queues,
        irq_cpus,
        protection: stack.protection(end),
        exposure: stack.exposure(),
        events: stack.exposure().and(stack.event_counts()),
    })
}

/// The stripe unit of bonnie's file over a SAS HBA's disks (an md RAID-0 of its disks with
/// mdadm's default 512 KiB chunk; stated assumption, docs/SCENARIOS.md).
pub(crate) const BONNIE_SAS_STRIPE: u64 = 512 << 10;

/// Completions one interrupt vector can hold for bonnie: far above what its page cache,
/// readahead and seekers keep in flight.
const BONNIE_VECTOR_CAP: usize = 1 << 12;

/// The block queue limits bonnie's page cache cuts requests under on the devices of `s`:
/// `max_sectors` (512 KiB: `BLK_DEF_MAX_SECTORS`-era default of 1024 sectors for SCSI,
/// `SCSI_DEFAULT_MAX_SECTORS`; an NVMe SSD with MDTS 7 at 4 KiB pages), the SG list length
/// (hisi_sas v2: `HISI_SAS_SGE_PAGE_CNT` = 124; nvme-pci: `NVME_MAX_SEGS` = 127) and the
/// block layer's default 64 KiB segment (`BLK_MAX_SEGMENT_SIZE`). Pages that are not
/// physically contiguous never merge in the block layer (no virtual merging on arm64 or
/// x86 since Linux 2.6.3x); the IOMMU may still merge them into one DMA segment.
pub(crate) fn bonnie_limits(devices: &Devices) -> Option<QueueLimits> {
    let max_segments = match devices {
        Devices::Nvme(_) => 127,
        Devices::Sas(_) => 124,
        _ => return None,
    };
    Some(QueueLimits {
        max_segments,
        max_segment_size: 64 << 10,
        max_transfer: 512 << 10,
        virt_merge_granule: None,
    })
}

/// bonnie's view of the stack: block commands mapped with `dma_map_sg` on the submitting
/// task's CPU.
struct CommandTarget(Rc<Stack>);

impl BlockQueue for CommandTarget {
    fn submit<'a>(&'a self, ctx: &'a Ctx, cmd: BlockCommand) -> SubmitCommand<'a> {
        Box::pin(async move {
            // A failed map is recorded in the stack; the run reports it when it ends.
            let _ = self.0.submit(ctx, Submission::Command(cmd)).await;
        })
    }
}

/// What one bonnie run on a block device produced.
pub(crate) struct BonnieBlockRun {
    pub result: BonnieResult,
    pub dma: DmaCounters,
    pub cpu: CpuBreakdown,
    pub irq_cpus: usize,
    /// Bytes bonnie's page cache submitted: (reads, writes).
    pub submitted_bytes: (u64, u64),
    /// The protection report over the whole run.
    pub protection: LabProtection,
}

/// Counts the bytes of every command it passes on: (reads, writes).
struct Counting<Q> {
    inner: Q,
    bytes: Rc<std::cell::Cell<(u64, u64)>>,
}

impl<Q: BlockQueue> BlockQueue for Counting<Q> {
    fn submit<'a>(&'a self, ctx: &'a Ctx, cmd: BlockCommand) -> SubmitCommand<'a> {
        let n: u64 = cmd.pieces.iter().map(|p| p.len).sum();
        let (r, w) = self.bytes.get();
        self.bytes.set(match cmd.dir {
            BlockDir::Read => (r + n, w),
            BlockDir::Write => (r, w + n),
        });
        self.inner.submit(ctx, cmd)
    }

    fn flush<'a>(&'a self, ctx: &'a Ctx, on_done: OnDone) -> SubmitCommand<'a> {
        self.inner.flush(ctx, on_done)
    }
}

/// Runs bonnie of `s` once with `seed` on its NVMe SSD or SAS HBA (the first device).
pub(crate) fn run_bonnie(
    s: &LabScenario,
    b: &BonnieSetup,
    seed: u64,
) -> Result<BonnieBlockRun, LabError> {
    let mut sim = Sim::for_machine(SimConfig { cpus: s.cpus, seed }, &s.profile)?;
    let (stack, irq_cpus) = start_stack(s, &mut sim, seed, BONNIE_VECTOR_CAP, 1, SZ_4K)?;
    let bytes = Rc::new(std::cell::Cell::new((0, 0)));
    let target = Counting {
        inner: CommandTarget(stack.clone()),
        bytes: bytes.clone(),
    };
    // Interrupts run as tasks on their vectors' CPUs (the engine does not preempt): no
    // interrupt time is stolen from bonnie's processes.
    let out = bonnie::start(
        sim.handle(),
        b.config.clone(),
        target,
        IrqCpu::new(),
        usize::MAX,
        seed,
    )?;
    let report = sim.run()?;
    if let Some(e) = stack.error.borrow().clone() {
        return Err(LabError::Model(e));
    }
    let result = out
        .borrow_mut()
        .take()
        .ok_or_else(|| model_err("bonnie did not finish (a task blocked forever)"))?;
    let dma = *stack.counters.borrow();
    Ok(BonnieBlockRun {
        result,
        dma,
        cpu: CpuBreakdown::from(report.total),
        irq_cpus,
        submitted_bytes: bytes.get(),
        protection: stack.protection(report.end.as_ns()),
    })
}

/// The wait (spin) time of every spinlock between two reports, summed per kind of lock (the
/// name without its CPU number or `#instance`), the most first; locks nobody waited on are
/// left out.
fn spin_by_lock(before: &RunReport, after: &RunReport) -> Vec<(String, u64)> {
    let mut by: std::collections::BTreeMap<String, u64> = std::collections::BTreeMap::new();
    for l in &after.spin_locks {
        let was = before.spin_lock(&l.name).map_or(0, |b| b.wait_total_ns);
        let waited = l.wait_total_ns.saturating_sub(was);
        if waited > 0 {
            let base = l.name.split('#').next().unwrap_or(&l.name);
            let kind = base.trim_end_matches(|c: char| c.is_ascii_digit());
            *by.entry(kind.to_owned()).or_default() += waited;
        }
    }
    let mut out: Vec<(String, u64)> = by.into_iter().collect();
    out.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    out
}

/// Acquisitions and contended acquisitions of spin lock `name` between two reports.
pub(super) fn lock_window(before: &RunReport, after: &RunReport, name: &str) -> (u64, u64) {
    let (a, c, _) = lock_window_wait(before, after, name);
    (a, c)
}

/// Acquisitions, contended acquisitions and total wait (ns) of spin lock `name` between two
/// reports (zeros for a lock the run does not have).
pub(super) fn lock_window_wait(
    before: &RunReport,
    after: &RunReport,
    name: &str,
) -> (u64, u64, u64) {
    let get = |r: &RunReport| {
        r.spin_lock(name).map_or((0, 0, 0), |l| {
            (l.acquisitions, l.contended, l.wait_total_ns)
        })
    };
    let (a0, c0, w0) = get(before);
    let (a1, c1, w1) = get(after);
    (
        a1.saturating_sub(a0),
        c1.saturating_sub(c0),
        w1.saturating_sub(w0),
    )
}

/// The engine name of IOMMU instance `k`'s spinlock command-queue lock (as
/// `SimCmdq::new_tagged` names it).
fn cmdq_lock_name(k: usize) -> String {
    if k == 0 {
        "cmdq_lock".to_owned()
    } else {
        format!("cmdq_lock#{k}")
    }
}

/// The profile's spinlock costs: an uncontended acquire and release, and the hand-off of
/// the lock's line to a waiting CPU, with the kernel's spinlock algorithm.
pub(crate) fn lock_params(s: &LabScenario) -> SpinParams {
    let sync = &s.profile.sync;
    SpinParams {
        acquire_ns: sync.lock_acquire_release.ns().round() as u64,
        release_ns: 0,
        handoff_ns: sync.lock_handoff.ns().round() as u64,
        kind: kernel_lock_kind(s),
    }
}

/// The spinlock algorithm of the scenario's kernel release on its architecture (the
/// architecture follows the IOMMU model; with none, a profile with a hypervisor is POWER):
/// - x86 and arm64: queued (qspinlock; x86 from 4.2, d73a33973f16; arm64 from 4.19,
///   c11090474d70), every release the lab models (4.19 onwards);
/// - powerpc: test-and-set (`lwarx`/`stwcx.` with yielding on shared processors) before
///   5.13, when 64-bit Book3S made the queued lock the default (RESEARCH.md, "Linux locks");
/// - ia64 (the HP zx1): ticket locks (from 2.6.29, every release the lab models).
pub(crate) fn kernel_lock_kind(s: &LabScenario) -> LockKind {
    use super::spec::IommuModel;
    let powerpc = match s.iommu.model {
        IommuModel::Pseries => true,
        IommuModel::None => s.profile.hypervisor.is_some(),
        _ => false,
    };
    if powerpc {
        if s.iommu.kernel.kernel < iolab_iommu::linux::KernelVersion::new(5, 13) {
            LockKind::TestAndSet
        } else {
            LockKind::Queued
        }
    } else if s.iommu.model == IommuModel::Sba {
        LockKind::Ticket
    } else {
        LockKind::Queued
    }
}

/// Counts the idle time of `cpus` (each once) as system time: a CPU that polls a queue
/// spins in the kernel while it waits, as `top` and fio's `sys_cpu` show it.
fn polling_is_busy(r: &mut RunReport, cpus: &[usize]) {
    let mut seen = std::collections::BTreeSet::new();
    for &c in cpus {
        if !seen.insert(c) {
            continue;
        }
        if let Some(t) = r.cpus.get_mut(c) {
            t.system += t.idle;
            t.idle = 0;
        }
    }
}

/// CPU times summed over every CPU of a report.
pub(super) fn sum_cpus(r: &RunReport) -> crate::accounting::CpuTimes {
    let mut t = crate::accounting::CpuTimes::default();
    for c in &r.cpus {
        t.user += c.user;
        t.system += c.system;
        t.spin += c.spin;
        t.idle += c.idle;
    }
    t
}
