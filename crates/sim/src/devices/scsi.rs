//! A parallel-SCSI host bus adapter with one disk behind an IOMMU (the zx1 / LSI 53c1030 /
//! Seagate Cheetah set-up of SEEDS.md #3).
//!
//! Submission runs on the caller's virtual CPU: the block layer cuts the pieces into requests
//! under the queue limits ([`QueueLimits`], `sg_tablesize`, `max_sectors`, the virtual merge
//! granule), the driver maps each request's scatter-gather list through the IOMMU
//! ([`DmaPath::map_sg`], under the IOMMU's resource lock, its work costed by the platform
//! profile), writes one SG element per DMA segment into the command frame and rings the
//! doorbell. One agent task plays the HBA firmware and the disk: per command it pays the
//! firmware overhead and one SG-element fetch per DMA segment, translates every DMA segment
//! through the IOMMU (the bytes the device moves), moves the data over the SCSI bus and
//! serves it from the media (seek + rotational latency + media transfer), in FIFO order,
//! one command at a time (no tagged reordering: stated in docs/model/sba-vmerge.md). The
//! completion runs on the submitter's CPU: the interrupt and completion path, then the unmap.
//!
//! [`ScsiHost::start`] puts the host behind the zx1's SBA (under its resource lock, as an
//! engine spin lock); [`ScsiHost::start_on`] behind any [`DmaPath`] ([`HostDma`]).

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;

use iolab_iommu::addr::{Access, PhysAddr};
use iolab_iommu::dma::{Device, Direction, DmaSegment, SgEntry};
use iolab_iommu::hw::{DmaPath, MappedSg, SbaIommu};
use iolab_iommu::work::WorkRecord;

use crate::accounting::Account;
use crate::block::{Piece, QueueLimits};
use crate::cost::CpuCostModel;
use crate::devices::PortedDma;
use crate::engine::{Channel, Completion, Ctx, Handle, SimDuration, SimError};
use crate::iommu::port::{DeviceLink, DmaPort, DmaStream, Translated};
use crate::resources::{SpinLock, SpinParams};

/// Timing of the HBA, the bus, the driver and the disk, in nanoseconds and bytes per second.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ScsiParams {
    /// SCSI bus data rate, bytes per second.
    pub bus_bytes_per_s: f64,
    /// HBA firmware time per command.
    pub hba_per_command_ns: f64,
    /// HBA time to fetch and process one SG element.
    pub hba_per_sge_ns: f64,
    /// CPU time of the block layer, SCSI mid-layer and driver to issue one request.
    pub driver_submit_ns: f64,
    /// CPU time to write one SG element into the command frame.
    pub driver_per_sge_ns: f64,
    /// CPU time of the interrupt and completion path per request.
    pub driver_complete_ns: f64,
    /// Average seek time of a read, ns.
    pub seek_read_ns: f64,
    /// Average seek time of a write, ns.
    pub seek_write_ns: f64,
    /// One revolution, ns (average rotational latency is half of it).
    pub revolution_ns: f64,
    /// Media transfer rate, bytes per second.
    pub media_bytes_per_s: f64,
}

/// Running totals of a [`ScsiHost`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScsiStats {
    /// Requests issued.
    pub requests: u64,
    /// Bytes moved.
    pub bytes: u64,
    /// Physical pieces handed to the block layer.
    pub pieces: u64,
    /// Segments the block layer counted (hardware segments, after assumed virtual merging).
    pub hw_segments: u64,
    /// DMA segments the IOMMU returned (SG elements the HBA fetched).
    pub dma_segments: u64,
    /// Requests that were cut because of a queue limit (more requests than writes).
    pub splits: u64,
    /// Nanoseconds the disk was busy.
    pub disk_busy_ns: u64,
    /// IOMMU map/unmap CPU time charged, ns.
    pub iommu_cpu_ns: u64,
    /// Seeks done.
    pub seeks: u64,
}

impl ScsiStats {
    /// Adds another host's (or run's) totals.
    pub fn add(&mut self, o: &ScsiStats) {
        self.requests += o.requests;
        self.bytes += o.bytes;
        self.pieces += o.pieces;
        self.hw_segments += o.hw_segments;
        self.dma_segments += o.dma_segments;
        self.splits += o.splits;
        self.disk_busy_ns += o.disk_busy_ns;
        self.iommu_cpu_ns += o.iommu_cpu_ns;
        self.seeks += o.seeks;
    }
}

/// Why the device refused an I/O.
#[derive(Debug, thiserror::Error)]
pub enum ScsiError {
    /// The IOMMU refused the mapping.
    #[error("IOMMU mapping failed: {0}")]
    Dma(String),
    /// The command queue is full (a cap, not expected with synchronous submitters).
    #[error("HBA command queue full")]
    QueueFull,
    /// The engine refused an operation.
    #[error(transparent)]
    Sim(#[from] SimError),
}

struct Cmd {
    segments: Vec<DmaSegment>,
    offset: u64,
    len: u64,
    write: bool,
    done: Completion<()>,
}

/// What a [`ScsiHost`] maps its DMA through.
pub struct HostDma {
    /// The DMA path (IOMMU, bypass or none).
    pub path: Arc<dyn DmaPath>,
    /// Time of a map or unmap call's work that the profile's step costs do not cover
    /// (waits for the hardware: purges, flush polls, queue syncs, hypervisor time), ns.
    pub extra_ns: Box<dyn Fn(&WorkRecord) -> f64>,
    /// The lock map and unmap calls run under, modelled by the engine, with its name.
    pub lock: Option<(&'static str, SpinParams)>,
}

struct Inner {
    params: ScsiParams,
    limits: QueueLimits,
    path: Arc<dyn DmaPath>,
    dev: Device,
    cost: CpuCostModel,
    /// The IOMMU's DMA port (the profile's unit), and the HBA's stream at it.
    port: DmaPort,
    stream: DmaStream,
    extra_ns: Box<dyn Fn(&WorkRecord) -> f64>,
    lock_ns: f64,
    res_lock: Option<SpinLock>,
    live: Cell<usize>,
    queue: Channel<Cmd>,
    stats: RefCell<ScsiStats>,
}

/// The HBA and its disk. Clones share the device.
#[derive(Clone)]
pub struct ScsiHost {
    inner: Rc<Inner>,
}

/// Capacity of the HBA's command queue (LSI `can_queue` for SCSI is 127; requests beyond wait
/// in the block layer, which the synchronous submitters here never need).
pub const HBA_QUEUE_DEPTH: usize = 4096;

/// CPU time a submitter spent in one I/O, split the way `times()` reports it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IoCpu {
    /// System time (including spinning on the IOMMU lock), ns.
    pub sys_ns: u64,
}

/// The requests of one transfer mapped and queued by [`ScsiHost::issue`], each with its
/// mapping and its completion, for [`ScsiHost::complete`] to wait for and unmap.
#[derive(Debug)]
pub struct ScsiPending {
    inflight: Vec<(MappedSg, Completion<()>)>,
}

impl ScsiHost {
    /// Builds the host and starts its HBA/disk agent on `h`.
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        h: &Handle,
        params: ScsiParams,
        limits: QueueLimits,
        sba: Arc<SbaIommu>,
        dev: Device,
        cost: CpuCostModel,
        purge_ns: f64,
        lock_params: SpinParams,
    ) -> Result<Self, SimError> {
        let dma = HostDma {
            path: sba,
            extra_ns: Box::new(move |w: &WorkRecord| w.purges as f64 * purge_ns),
            lock: Some(("sba_res_lock", lock_params)),
        };
        Self::start_on(h, params, limits, dma, dev, cost)
    }

    /// Builds the host behind `dma` and starts its HBA/disk agent on `h`.
    pub fn start_on(
        h: &Handle,
        params: ScsiParams,
        limits: QueueLimits,
        dma: HostDma,
        dev: Device,
        cost: CpuCostModel,
    ) -> Result<Self, SimError> {
        let (res_lock, lock_ns) = match dma.lock {
            Some((name, p)) => (
                Some(SpinLock::new(h, name, p)?),
                (p.acquire_ns + p.release_ns) as f64,
            ),
            None => (None, 0.0),
        };
        let inner = Rc::new(Inner {
            params,
            limits,
            path: dma.path,
            dev,
            port: cost.dma_port(),
            stream: DmaStream::new(SCSI_LINK),
            cost,
            extra_ns: dma.extra_ns,
            lock_ns,
            res_lock,
            live: Cell::new(0),
            queue: Channel::new(h, HBA_QUEUE_DEPTH),
            stats: RefCell::new(ScsiStats::default()),
        });
        let agent = inner.clone();
        h.spawn_agent(move |ctx| async move { hba_agent(ctx, agent).await })?;
        Ok(Self { inner })
    }

    /// Totals so far.
    pub fn stats(&self) -> ScsiStats {
        *self.inner.stats.borrow()
    }

    /// Live IOMMU mappings of this host's I/O (zero when every I/O has completed).
    pub fn live_mappings(&self) -> usize {
        self.inner.live.get()
    }

    /// The queue limits the block layer uses.
    pub fn limits(&self) -> QueueLimits {
        self.inner.limits
    }

    /// Writes `pieces` (physical pages in file order) to the disk at byte `offset` and waits
    /// until every request has completed. Runs on the caller's CPU; returns the system time
    /// it spent.
    pub async fn write(
        &self,
        ctx: &Ctx,
        offset: u64,
        pieces: &[Piece],
    ) -> Result<IoCpu, ScsiError> {
        self.submit(ctx, offset, pieces, true).await
    }

    /// Reads from the disk at byte `offset` into `pieces` and waits for every request.
    pub async fn read(&self, ctx: &Ctx, offset: u64, pieces: &[Piece]) -> Result<IoCpu, ScsiError> {
        self.submit(ctx, offset, pieces, false).await
    }

    /// Issues `pieces` as one transfer in direction `write` (device reads memory) or not,
    /// cut into requests by the queue limits, and waits for all of them.
    pub async fn submit(
        &self,
        ctx: &Ctx,
        offset: u64,
        pieces: &[Piece],
        write: bool,
    ) -> Result<IoCpu, ScsiError> {
        let (pending, submit_ns) = self.issue(ctx, offset, pieces, write).await?;
        let complete_ns = self.complete(ctx, pending).await?;
        Ok(IoCpu {
            sys_ns: submit_ns + complete_ns,
        })
    }

    /// The submission half of [`ScsiHost::submit`]: cuts `pieces` into requests, maps each
    /// (`dma_map_sg`) and queues it to the HBA, in the caller's task. Returns the requests in
    /// flight, for [`ScsiHost::complete`], and the system time spent, ns.
    pub async fn issue(
        &self,
        ctx: &Ctx,
        offset: u64,
        pieces: &[Piece],
        write: bool,
    ) -> Result<(ScsiPending, u64), ScsiError> {
        let dir = if write {
            Direction::ToDevice
        } else {
            Direction::FromDevice
        };
        let inn = &self.inner;
        let reqs = inn.limits.split(offset, pieces);
        let mut sys = 0u64;
        let mut inflight: Vec<(MappedSg, Completion<()>)> = Vec::with_capacity(reqs.len());
        {
            let mut st = inn.stats.borrow_mut();
            st.pieces += pieces.len() as u64;
            st.splits += reqs.len().saturating_sub(1) as u64;
        }
        for r in &reqs {
            let hw = inn.limits.count_segments(&r.pieces) as u64;
            let entries: Vec<SgEntry> =
                r.pieces.iter().map(|p| SgEntry::new(p.pa, p.len)).collect();
            sys += spend(ctx, inn.params.driver_submit_ns).await;
            // dma_map_sg under the IOMMU's resource lock.
            let t0 = ctx.now();
            let g = match &inn.res_lock {
                Some(l) => Some(l.lock(ctx).await),
                None => None,
            };
            let mut work = WorkRecord::new();
            let mapped = inn
                .path
                .map_sg(&inn.dev, &entries, dir, ctx.cpu().id(), &mut work)
                .map_err(|e| ScsiError::Dma(e.to_string()))?;
            inn.live.set(inn.live.get() + 1);
            let ns = self.work_ns(&work);
            spend(ctx, ns).await;
            if let Some(g) = g {
                g.unlock().await;
            }
            ctx.trace_since("dma map_sg", t0);
            let held = (ctx.now() - t0).as_ns();
            sys += held;
            let segments = mapped.segments().to_vec();
            sys += spend(ctx, inn.params.driver_per_sge_ns * segments.len() as f64).await;
            {
                let mut st = inn.stats.borrow_mut();
                st.requests += 1;
                st.bytes += r.len();
                st.hw_segments += hw;
                st.dma_segments += segments.len() as u64;
                st.iommu_cpu_ns += held;
            }
            let done = Completion::new(ctx.handle());
            let cmd = Cmd {
                segments,
                offset: r.offset,
                len: r.len(),
                write,
                done: done.clone(),
            };
            inn.queue.send(cmd).map_err(|_| ScsiError::QueueFull)?;
            inflight.push((mapped, done));
        }
        Ok((ScsiPending { inflight }, sys))
    }

    /// The completion half of [`ScsiHost::submit`]: waits for each request of `pending` and
    /// unmaps it (`dma_unmap_sg`), in the caller's task. Returns the system time spent, ns.
    pub async fn complete(&self, ctx: &Ctx, pending: ScsiPending) -> Result<u64, ScsiError> {
        let inn = &self.inner;
        let mut sys = 0u64;
        for (mapped, done) in pending.inflight {
            done.wait(ctx).await;
            sys += spend(ctx, inn.params.driver_complete_ns).await;
            let t0 = ctx.now();
            let g = match &inn.res_lock {
                Some(l) => Some(l.lock(ctx).await),
                None => None,
            };
            let mut work = WorkRecord::new();
            let now = ctx.now().as_ns();
            inn.path
                .unmap_sg(mapped, ctx.cpu().id(), now, &mut work)
                .map_err(|r| ScsiError::Dma(r.error.to_string()))?;
            inn.live.set(inn.live.get() - 1);
            let ns = self.work_ns(&work);
            spend(ctx, ns).await;
            if let Some(g) = g {
                g.unlock().await;
            }
            ctx.trace_since("dma unmap_sg", t0);
            let held = (ctx.now() - t0).as_ns();
            sys += held;
            inn.stats.borrow_mut().iommu_cpu_ns += held;
        }
        Ok(sys)
    }

    /// CPU time of an IOMMU call: its counted steps, the hardware waits of
    /// [`HostDma::extra_ns`] (the SBA's purges), and the uncontended cost of every lock it
    /// took beyond the one the engine models.
    fn work_ns(&self, work: &WorkRecord) -> f64 {
        let inn = &self.inner;
        let locks = (inn.cost.locks_uncontended_ns(work) - inn.lock_ns).max(0.0);
        inn.cost.cpu_ns(work) + (inn.extra_ns)(work) + locks
    }
}

/// Spends `ns` of system time (rounded) and returns what was spent.
async fn spend(ctx: &Ctx, ns: f64) -> u64 {
    let d = ns.max(0.0).round() as u64;
    if d > 0 {
        ctx.cpu().spend(SimDuration::ns(d), Account::System).await;
    }
    d
}

async fn hba_agent(ctx: Ctx, inn: Rc<Inner>) {
    let p = inn.params;
    let mut head_end: Option<u64> = None;
    loop {
        let cmd = inn.queue.recv(&ctx).await;
        // Firmware: the command and one SG element fetch per DMA segment.
        let mut ns = p.hba_per_command_ns + p.hba_per_sge_ns * cmd.segments.len() as f64;
        // The device side of the IOMMU: every segment it moves is translated.
        let mut work = WorkRecord::new();
        let access = if cmd.write {
            Access::Read
        } else {
            Access::Write
        };
        let mut translated = 0u64;
        let mut pages = 0u64;
        for s in &cmd.segments {
            if let Ok(ranges) = inn
                .path
                .translate(&inn.dev, s.dma, s.len, access, &mut work)
            {
                translated += ranges.iter().map(|r| r.len).sum::<u64>();
            }
            if s.len > 0 {
                pages += ((s.dma.0 + s.len - 1) >> 12) - (s.dma.0 >> 12) + 1;
            }
        }
        debug_assert_eq!(translated, cmd.len, "a DMA segment did not translate");
        // Bus: the data phase, through the IOMMU's DMA port.
        let bus = cmd.len as f64 / p.bus_bytes_per_s * 1e9;
        let dma = PortedDma {
            port: &inn.port,
            translated: Translated {
                pages,
                misses: work.iotlb_misses,
                walk_reads: work.walk_reads,
            },
        };
        let now = ctx.now().as_ns() as f64;
        let t = PortedDma::time(Some(dma), now + ns, bus, access, &inn.stream);
        ns = t.done - now;
        // Disk: seek unless the head is already there, rotational latency, media transfer.
        let sequential = head_end == Some(cmd.offset);
        let mut disk = 0.0;
        if !sequential {
            let avg = if cmd.write {
                p.seek_write_ns
            } else {
                p.seek_read_ns
            };
            // Uniform around the datasheet average (random offsets over the whole disk).
            let f = 0.5 + ctx.rng().next_f64();
            disk += avg * f;
            disk += ctx.rng().next_f64() * p.revolution_ns;
            inn.stats.borrow_mut().seeks += 1;
        }
        disk += cmd.len as f64 / p.media_bytes_per_s * 1e9;
        head_end = Some(cmd.offset + cmd.len);
        ns += disk;
        let d = ns.round() as u64;
        inn.stats.borrow_mut().disk_busy_ns += disk.round() as u64;
        ctx.handle().tracer().device(
            || "scsi hba".to_owned(),
            if cmd.write { "write" } else { "read" },
            ctx.now().as_ns(),
            d,
            &[("bytes", cmd.len), ("segments", cmd.segments.len() as u64)],
        );
        ctx.sleep(SimDuration::ns(d)).await;
        let _ = cmd.done.fire(());
    }
}

/// How far the SCSI HBA's DMA requests run ahead, for the [DMA port](crate::iommu::port):
/// assumption: a PCI-X-era HBA (LSI 53C1030 class) keeps one page of reads in flight, and
/// its writes to memory are ordered.
pub const SCSI_LINK: DeviceLink = DeviceLink {
    outstanding_pages: 1,
    relaxed_ordering: false,
};

/// The physical address of page frame `pfn` for pages of `page_size` bytes.
pub fn page_addr(pfn: u64, page_size: u64) -> PhysAddr {
    PhysAddr::new(pfn * page_size)
}
