//! USB mass storage (Bulk-Only Transport) behind an xHCI host controller.
//!
//! The model follows one SCSI command through usb-storage and the xHCI:
//!
//! 1. **Map** (the `usb-storage` kernel thread, on its CPU): the request's physical pieces
//!    (already cut by the block layer's [`QueueLimits`](crate::block::QueueLimits)) are
//!    coalesced where physically contiguous and mapped with [`DmaPath::map_sg`]. The work
//!    record of that call, costed by the platform profile, is CPU time of that thread.
//! 2. **The link** (one command at a time: BOT has no command queueing, and usb-storage
//!    runs one command at a time): the CBW phase, the data phase and the CSW phase. The
//!    data phase moves every byte at the link's payload rate (signalling rate x encoding x
//!    protocol efficiency), pays the host controller's per-segment (per-TRB) cost for each
//!    DMA segment, and waits for the IOMMU's translations: every page of every segment is
//!    translated through [`DmaPath::translate`] (so a missing or wrong mapping faults), and
//!    each page of a freshly mapped range costs one IOTLB miss and its walk reads (the
//!    IPMMU flushes the whole context on every unmap, so nothing survives between
//!    commands). A read that does not continue the previous read also pays the medium's
//!    access latency.
//! 3. **Unmap** (the xHCI interrupt, on the interrupt CPU): [`DmaPath::unmap_sg`]; with a
//!    strict IPMMU domain that is a whole-context flush polled in 1 µs steps. The interrupt
//!    preempts whatever runs on that CPU: its time is *stolen* from the task running there
//!    ([`IrqCpu`]), as tick-based accounting charges it, and it delays the command's
//!    completion by its duration.
//!
//! The per-command device overhead (CBW/CSW handling in the device and the host, bridge
//! firmware) is one number, `command_overhead_ns`, plus the link's latency per phase.
//!
//! **Bounce buffering** ([`Swiotlb`]): without an IOMMU, Linux's dma-direct can only hand the
//! device physical addresses its DMA mask reaches. The R-Car xHCI cannot address above
//! 4 GiB (xhci-rcar sets `XHCI_NO_64BIT_SUPPORT`), while most of an H3 board's RAM lies
//! above 4 GiB; every scatter-gather entry beyond the mask is then bounced through the
//! software IO TLB: slots are allocated under its lock, a write's data is copied into the
//! bounce buffer at map time (on the usb-storage thread) and a read's data is copied out
//! at unmap time (in the interrupt), before the slots are freed. With the IPMMU every page
//! gets a 32-bit IOVA and nothing is bounced.

use std::cell::{Cell, RefCell};
use std::rc::Rc;
use std::sync::Arc;

use iolab_iommu::addr::{Access, PhysAddr};
use iolab_iommu::dma::{Device, Direction, SgEntry};
use iolab_iommu::hw::DmaPath;
use iolab_iommu::work::{LockId, WorkRecord};

use crate::block::Piece;
use crate::cost::{CpuCostModel, PlatformProfile};
use crate::devices::PortedDma;
use crate::engine::{Channel, Ctx, Handle, SimDuration};
use crate::iommu::port::{DeviceLink, DmaPort, DmaStream, Translated};
use crate::{Account, SimError};

/// One USB link speed, as the storage device sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct LinkSpeed {
    /// `superspeed` or `highspeed`.
    pub name: String,
    /// Signalling rate in bits per second (5e9 or 480e6).
    pub signal_bits_per_s: f64,
    /// Data bits per line bit (0.8 for 8b/10b; 1.0 for High-Speed NRZI, whose bit stuffing is
    /// folded into the protocol efficiency).
    pub encoding: f64,
    /// Fraction of the encoded rate that carries payload (packet headers, handshakes,
    /// scheduling gaps).
    pub protocol_efficiency: f64,
    /// Link latency of one short BOT phase (the CBW or the CSW transaction), ns.
    pub phase_latency_ns: u64,
    /// Largest transfer usb-storage lets the block layer build (`max_sectors * 512`).
    pub max_transfer: u64,
}

impl LinkSpeed {
    /// Payload bytes per nanosecond.
    pub fn payload_bytes_per_ns(&self) -> f64 {
        self.signal_bits_per_s / 8.0 * self.encoding * self.protocol_efficiency / 1e9
    }
}

/// The storage device and host-controller parameters.
#[derive(Clone, Debug, PartialEq)]
pub struct UsbStorageConfig {
    /// The link.
    pub link: LinkSpeed,
    /// Fixed cost of one BOT command besides its phases' link latency, ns.
    pub command_overhead_ns: u64,
    /// Host-controller cost per DMA segment (one TRB each), ns.
    pub per_segment_ns: u64,
    /// Medium access latency for a read that does not continue the previous read, ns.
    pub media_read_latency_ns: u64,
    /// Time the device takes to write its volatile cache to the medium on a cache flush
    /// (SCSI SYNCHRONIZE CACHE, passed on by the bridge), ns.
    pub media_flush_ns: u64,
    /// IOMMU page-table reads per IOTLB miss (the walk cache holds the upper levels).
    pub walk_reads_per_miss: u64,
    /// CPU time of the interrupt handler, URB give-back and SCSI/block completion per
    /// command, besides the unmap, ns.
    pub completion_ns: u64,
    /// CPU of the usb-storage kernel thread.
    pub storage_cpu: usize,
    /// CPU that takes the xHCI interrupt (and does the unmap).
    pub irq_cpu: usize,
}

/// Transfer direction, from the host's point of view (the block layer's).
pub type UsbDir = crate::block::BlockDir;

/// What runs when a command completes (in interrupt context: it may only update state and
/// wake tasks).
pub type OnDone = crate::block::OnDone;

/// One SCSI command: a block request.
pub type UsbCommand = crate::block::BlockCommand;

/// The interrupt CPU: interrupt time is stolen from the task running there.
#[derive(Debug, Default)]
pub struct IrqCpu {
    running: Cell<bool>,
    stolen: Cell<u64>,
    total_ns: Cell<u64>,
    charged_ns: Cell<u64>,
}

impl IrqCpu {
    /// A CPU with nothing running.
    pub fn new() -> Rc<Self> {
        Rc::new(Self::default())
    }

    /// Marks whether a process runs on the interrupt CPU (not blocked).
    pub fn set_running(&self, running: bool) {
        self.running.set(running);
    }

    /// Records `ns` of interrupt work: stolen from the running process, if any.
    pub fn interrupt(&self, ns: u64) {
        self.total_ns.set(self.total_ns.get() + ns);
        if self.running.get() {
            self.stolen.set(self.stolen.get() + ns);
        }
    }

    /// Takes the interrupt time stolen since the last call (the running process pays it).
    pub fn take_stolen(&self) -> u64 {
        let s = self.stolen.replace(0);
        self.charged_ns.set(self.charged_ns.get() + s);
        s
    }

    /// All interrupt time so far, ns.
    pub fn total_ns(&self) -> u64 {
        self.total_ns.get()
    }

    /// Interrupt time charged to processes so far, ns.
    pub fn charged_ns(&self) -> u64 {
        self.charged_ns.get()
    }
}

/// Running totals of the device.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct UsbStats {
    /// Commands completed.
    pub commands: u64,
    /// Read commands.
    pub reads: u64,
    /// Payload bytes moved.
    pub bytes: u64,
    /// DMA segments (TRBs) moved.
    pub segments: u64,
    /// Time the link spent in data phases, ns.
    pub data_ns: u64,
    /// Time the link was busy with commands (CBW, data, CSW, overheads), ns.
    pub busy_ns: u64,
    /// Pages translated by the IOMMU.
    pub pages_translated: u64,
    /// Translation time added to data phases, ns.
    pub translation_ns: u64,
    /// CPU time of map calls (usb-storage thread), ns.
    pub map_ns: u64,
    /// CPU time of unmap calls (interrupt), ns, including flush polling.
    pub unmap_ns: u64,
    /// Of which busy-wait steps polling the IOMMU flush, ns.
    pub poll_wait_ns: u64,
    /// Whole-context flushes (from work records).
    pub flushes: u64,
    /// Flush polls (register reads that waited).
    pub polls: u64,
    /// Largest data-phase rate seen, bytes per ns.
    pub max_data_rate: f64,
    /// Cache flushes (SYNCHRONIZE CACHE commands; not counted in `commands`).
    pub cache_flushes: u64,
    /// Scatter-gather entries bounced through the software IO TLB.
    pub bounced_entries: u64,
    /// Bytes bounced (copied by the CPU into or out of the bounce buffer).
    pub bounced_bytes: u64,
    /// CPU time of the bouncing (slot allocation and freeing, copies), ns; included in
    /// `map_ns` / `unmap_ns`.
    pub bounce_ns: u64,
}

/// Linux's software IO TLB (`swiotlb`), the bounce buffer of dma-direct: a pool of 2 KiB
/// slots below the device's DMA mask, grouped in segments of `segment_slots`; a mapping
/// takes contiguous free slots inside one segment, searched from a rotating index (with a
/// stride of one page for mappings of a page or more), as `swiotlb_tbl_map_single` does.
#[derive(Clone, Debug)]
pub struct Swiotlb {
    base: u64,
    slot_bytes: u64,
    segment_slots: usize,
    used: Vec<bool>,
    index: usize,
    /// Slots in use.
    pub slots_in_use: usize,
}

/// A bounce mapping: where the data really lives and where the device sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bounce {
    /// The original buffer.
    pub orig: u64,
    /// The bounce buffer (below the mask).
    pub bounce: u64,
    /// Bytes.
    pub len: u64,
}

/// Errors of the bounce-buffer pool.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SwiotlbError {
    /// A pool parameter is out of range.
    #[error("swiotlb: {0}")]
    Config(String),
    /// No run of free slots is large enough.
    #[error("swiotlb: no {slots} contiguous free slots")]
    Full {
        /// Slots requested.
        slots: usize,
    },
}

impl Swiotlb {
    /// A pool of `pool_bytes` at physical address `base`, `slot_bytes` per slot,
    /// `segment_slots` slots per segment (Linux: 2 KiB slots, 128 per segment, 64 MiB).
    pub fn new(
        base: u64,
        pool_bytes: u64,
        slot_bytes: u64,
        segment_slots: usize,
    ) -> Result<Self, SwiotlbError> {
        if slot_bytes == 0 || !slot_bytes.is_power_of_two() {
            return Err(SwiotlbError::Config(format!(
                "slot size {slot_bytes} is not a power of two"
            )));
        }
        let nslots = (pool_bytes / slot_bytes) as usize;
        if segment_slots == 0 || nslots < segment_slots || nslots % segment_slots != 0 {
            return Err(SwiotlbError::Config(format!(
                "pool of {nslots} slots is not a whole number of {segment_slots}-slot segments"
            )));
        }
        Ok(Self {
            base,
            slot_bytes,
            segment_slots,
            used: vec![false; nslots],
            index: 0,
            slots_in_use: 0,
        })
    }

    /// The largest mapping one bounce can take.
    pub fn max_mapping(&self) -> u64 {
        self.slot_bytes * self.segment_slots as u64
    }

    /// Allocates bounce slots for `len` bytes; counts the slot entries it checked and the
    /// ones it marked in `work.bitmap_words_scanned` and its lock in `work`.
    pub fn map(
        &mut self,
        orig: u64,
        len: u64,
        work: &mut WorkRecord,
    ) -> Result<Bounce, SwiotlbError> {
        let nslots = len.div_ceil(self.slot_bytes).max(1) as usize;
        if nslots > self.segment_slots {
            return Err(SwiotlbError::Full { slots: nslots });
        }
        work.lock(LockId::Other);
        let total = self.used.len();
        let stride = if len >= 4096 {
            (4096 / self.slot_bytes).max(1) as usize
        } else {
            1
        };
        let mut idx = self.index - self.index % stride;
        let mut checked = 0usize;
        while checked < total {
            checked += stride;
            let seg_end = (idx / self.segment_slots + 1) * self.segment_slots;
            let fits = idx + nslots <= seg_end && self.used[idx..idx + nslots].iter().all(|u| !u);
            if fits {
                for u in &mut self.used[idx..idx + nslots] {
                    *u = true;
                }
                self.slots_in_use += nslots;
                work.bitmap_words_scanned += (checked / stride + nslots) as u64;
                self.index = (idx + nslots) % total;
                return Ok(Bounce {
                    orig,
                    bounce: self.base + idx as u64 * self.slot_bytes,
                    len,
                });
            }
            idx = (idx + stride) % total;
        }
        work.bitmap_words_scanned += (checked / stride) as u64;
        Err(SwiotlbError::Full { slots: nslots })
    }

    /// Frees a bounce mapping's slots.
    pub fn unmap(&mut self, b: &Bounce, work: &mut WorkRecord) {
        work.lock(LockId::Other);
        let first = ((b.bounce - self.base) / self.slot_bytes) as usize;
        let n = b.len.div_ceil(self.slot_bytes).max(1) as usize;
        let end = (first + n).min(self.used.len());
        for u in &mut self.used[first..end] {
            if *u {
                *u = false;
                self.slots_in_use -= 1;
            }
        }
        work.bitmap_words_scanned += n as u64;
    }
}

/// The DMA side the device uses.
pub struct DmaSide {
    /// The mapping path (a strict IPMMU domain, or a direct domain).
    pub path: Arc<dyn DmaPath>,
    /// The device as the DMA API sees it (mask, max segment size).
    pub device: Device,
    /// Busy-wait per flush poll step beyond the first read, ns.
    pub poll_interval_ns: u64,
    /// Whether the path translates (an IOMMU domain): pages then miss the flushed IOTLB.
    pub translated: bool,
    /// The bounce buffer dma-direct uses for entries beyond the device's DMA mask (`None`:
    /// an entry beyond the mask is an error, as with an IOMMU, which never needs one).
    pub swiotlb: Option<RefCell<Swiotlb>>,
    /// The CPU's copy rate for bounce copies, bytes per ns (the profile's memcpy bandwidth).
    pub copy_bytes_per_ns: f64,
    /// The IOMMU's DMA port (the profile's unit).
    pub port: DmaPort,
    /// The controller's stream at the port (of [`USB_LINK`]).
    pub stream: DmaStream,
}

/// How far the USB host controller's DMA runs ahead, for the [DMA port](crate::iommu::port):
/// assumption: one page (the xHCI moves a bulk transfer's TRBs in order, and its AXI
/// master's outstanding transactions on the SoC are not published), ordered writes.
pub const USB_LINK: DeviceLink = DeviceLink {
    outstanding_pages: 1,
    relaxed_ordering: false,
};

/// A USB storage device with its usb-storage thread. Submit commands with
/// [`UsbStorage::submit`] and cache flushes with [`UsbStorage::flush`].
#[derive(Clone)]
pub struct UsbStorage {
    queue: Channel<Queued>,
    stats: Rc<RefCell<UsbStats>>,
}

/// What the usb-storage thread takes from its queue, one at a time and in order.
enum Queued {
    /// A data command.
    Command(UsbCommand),
    /// A cache flush, with its completion.
    Flush(OnDone),
}

/// Errors of the device model (a mapping or translation refused).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum UsbError {
    /// The DMA path refused an operation.
    #[error("USB storage DMA failed: {0}")]
    Dma(String),
}

impl UsbStorage {
    /// Starts the usb-storage thread on `config.storage_cpu`. A DMA error stops the thread
    /// and is recorded in `error`.
    pub fn start(
        h: &Handle,
        config: UsbStorageConfig,
        dma: DmaSide,
        profile: &PlatformProfile,
        irq: Rc<IrqCpu>,
        error: Rc<RefCell<Option<UsbError>>>,
    ) -> Result<Self, SimError> {
        let queue: Channel<Queued> = Channel::new(h, 1 << 16);
        let stats = Rc::new(RefCell::new(UsbStats::default()));
        let cost = profile.cpu_cost_model();
        let dev = UsbStorage {
            queue: queue.clone(),
            stats: stats.clone(),
        };
        h.spawn_on(config.storage_cpu, move |ctx| async move {
            let mut next_read = u64::MAX;
            loop {
                let cmd = match queue.recv(&ctx).await {
                    Queued::Command(cmd) => cmd,
                    Queued::Flush(on_done) => {
                        run_flush(&ctx, &config, &irq, &stats, on_done).await;
                        continue;
                    }
                };
                if let Err(e) = run_command(
                    &ctx,
                    &config,
                    &dma,
                    &cost,
                    &irq,
                    &stats,
                    &mut next_read,
                    cmd,
                )
                .await
                {
                    *error.borrow_mut() = Some(e);
                    return;
                }
            }
        })?;
        Ok(dev)
    }

    /// Queues a command (the SCSI layer's request queue).
    pub fn submit(&self, cmd: UsbCommand) {
        // The queue's capacity is far above anything a workload keeps in flight; a full
        // queue would mean a runaway submitter, and the command is then dropped.
        let _ = self.queue.send(Queued::Command(cmd));
    }

    /// Queues a cache flush (SYNCHRONIZE CACHE) behind the commands already queued.
    pub fn flush(&self, on_done: OnDone) {
        let _ = self.queue.send(Queued::Flush(on_done));
    }

    /// Totals so far.
    pub fn stats(&self) -> UsbStats {
        *self.stats.borrow()
    }
}

/// The usb-storage thread does the mapping: submitting only queues the command (no CPU on
/// the caller's side).
impl crate::block::BlockQueue for UsbStorage {
    fn submit<'a>(&'a self, _ctx: &'a Ctx, cmd: UsbCommand) -> crate::block::SubmitCommand<'a> {
        UsbStorage::submit(self, cmd);
        Box::pin(std::future::ready(()))
    }

    fn flush<'a>(&'a self, _ctx: &'a Ctx, on_done: OnDone) -> crate::block::SubmitCommand<'a> {
        UsbStorage::flush(self, on_done);
        Box::pin(std::future::ready(()))
    }
}

/// Coalesces physically contiguous pieces into scatter-gather entries of at most
/// `max_segment` bytes (what `blk_rq_map_sg` builds).
pub fn sg_entries(pieces: &[Piece], max_segment: u64) -> Vec<SgEntry> {
    let mut out: Vec<SgEntry> = Vec::with_capacity(pieces.len());
    for p in pieces {
        match out.last_mut() {
            Some(last)
                if last.pa.get() + last.len == p.pa.get() && last.len + p.len <= max_segment =>
            {
                last.len += p.len
            }
            _ => out.push(SgEntry::new(PhysAddr::new(p.pa.get()), p.len)),
        }
    }
    out
}

/// A cache flush: a BOT command with no data phase (CBW, the device's flush of its cache
/// to the medium, CSW) and the completion interrupt; nothing is mapped.
async fn run_flush(
    ctx: &Ctx,
    config: &UsbStorageConfig,
    irq: &IrqCpu,
    stats: &RefCell<UsbStats>,
    on_done: OnDone,
) {
    let before_ns =
        config.command_overhead_ns + config.link.phase_latency_ns + config.media_flush_ns;
    ctx.handle().tracer().device(
        || "usb bot".to_owned(),
        "flush",
        ctx.now().as_ns(),
        before_ns,
        &[],
    );
    ctx.sleep(SimDuration::ns(before_ns)).await;
    irq.interrupt(config.completion_ns);
    ctx.sleep(SimDuration::ns(
        config.completion_ns + config.link.phase_latency_ns,
    ))
    .await;
    {
        let mut s = stats.borrow_mut();
        s.cache_flushes += 1;
        s.busy_ns += before_ns + config.completion_ns + config.link.phase_latency_ns;
    }
    on_done();
}

#[allow(clippy::too_many_arguments)]
async fn run_command(
    ctx: &Ctx,
    config: &UsbStorageConfig,
    dma: &DmaSide,
    cost: &CpuCostModel,
    irq: &IrqCpu,
    stats: &RefCell<UsbStats>,
    next_read: &mut u64,
    cmd: UsbCommand,
) -> Result<(), UsbError> {
    let UsbCommand {
        dir,
        offset,
        pieces,
        on_done,
    } = cmd;
    let bytes: u64 = pieces.iter().map(|p| p.len).sum();
    let (direction, access) = match dir {
        UsbDir::Read => (Direction::FromDevice, Access::Write),
        UsbDir::Write => (Direction::ToDevice, Access::Read),
    };
    let cpu = ctx.cpu().id();
    // 1. Map, on the usb-storage thread's CPU.
    let mut entries = sg_entries(&pieces, dma.device.max_segment_size());
    let mut work = WorkRecord::new();
    // dma-direct bounces every entry the device's mask cannot reach.
    let mut bounces: Vec<Bounce> = Vec::new();
    let mut bwork = WorkRecord::new();
    let mut copied = 0u64;
    if let Some(tlb) = &dma.swiotlb {
        let mut tlb = tlb.borrow_mut();
        for e in entries.iter_mut() {
            if e.pa.get() + e.len - 1 > dma.device.dma_mask() {
                let b = tlb
                    .map(e.pa.get(), e.len, &mut bwork)
                    .map_err(|err| UsbError::Dma(err.to_string()))?;
                if dir == UsbDir::Write {
                    copied += e.len;
                }
                *e = SgEntry::new(PhysAddr::new(b.bounce), e.len);
                bounces.push(b);
            }
        }
    }
    let sg = dma
        .path
        .map_sg(&dma.device, &entries, direction, cpu, &mut work)
        .map_err(|e| UsbError::Dma(e.to_string()))?;
    let bounce_map_ns = (cost.cpu_ns(&bwork)
        + cost.locks_uncontended_ns(&bwork)
        + copied as f64 / dma.copy_bytes_per_ns.max(1e-9))
    .round() as u64;
    let map_ns =
        (cost.cpu_ns(&work) + cost.locks_uncontended_ns(&work)).round() as u64 + bounce_map_ns;
    ctx.cpu()
        .spend_labeled(SimDuration::ns(map_ns), Account::System, "dma map_sg")
        .await;

    // 2. The link: CBW, data (translated page by page), CSW.
    let mut twork = WorkRecord::new();
    let mut pages = 0u64;
    for seg in sg.segments() {
        dma.path
            .translate(&dma.device, seg.dma, seg.len, access, &mut twork)
            .map_err(|e| UsbError::Dma(format!("{e:?}")))?;
        if dma.translated {
            let first = seg.dma.0 / 4096;
            let last = (seg.dma.0 + seg.len - 1) / 4096;
            pages += last - first + 1;
        }
    }
    // Every page of a fresh mapping misses the flushed IOTLB once and walks the leaf level.
    twork.iotlb_misses += pages;
    twork.walk_reads += pages * config.walk_reads_per_miss;
    let nseg = sg.segment_count() as u64;
    let wire_ns = (bytes as f64 / config.link.payload_bytes_per_ns()).round() as u64;
    // The data phase moves through the IOMMU's DMA port: the wire and the per-TRB work,
    // each page's walk as the controller's window lets it overlap them.
    let moved_ns = wire_ns + nseg * config.per_segment_ns;
    let now = ctx.now().as_ns() as f64;
    let ported = dma.translated.then_some(PortedDma {
        port: &dma.port,
        translated: Translated {
            pages,
            misses: twork.iotlb_misses,
            walk_reads: twork.walk_reads,
        },
    });
    let t = PortedDma::time(ported, now, moved_ns as f64, access, &dma.stream);
    let translation_ns = ((t.done - now).round() as u64).saturating_sub(moved_ns);
    let data_ns = moved_ns + translation_ns;
    let media_ns = if dir == UsbDir::Read && offset != *next_read {
        config.media_read_latency_ns
    } else {
        0
    };
    if dir == UsbDir::Read {
        *next_read = offset + bytes;
    }
    let before_ns = config.command_overhead_ns + config.link.phase_latency_ns + media_ns;
    ctx.handle().tracer().device(
        || "usb bot".to_owned(),
        if dir == UsbDir::Read { "read" } else { "write" },
        ctx.now().as_ns(),
        before_ns + data_ns,
        &[("bytes", bytes), ("segments", nseg)],
    );
    ctx.sleep(SimDuration::ns(before_ns + data_ns)).await;

    // 3. The interrupt: unmap (and the IOMMU flush), then the CSW phase.
    let mut uwork = WorkRecord::new();
    dma.path
        .unmap_sg(sg, config.irq_cpu, ctx.now().as_ns(), &mut uwork)
        .map_err(|r| UsbError::Dma(r.error.to_string()))?;
    let flushes = uwork.inval_domains;
    let poll_steps = uwork.polls.saturating_sub(flushes);
    let poll_wait_ns = poll_steps * dma.poll_interval_ns;
    // A read's data is copied out of the bounce buffer, then the slots are freed.
    let mut bfree = WorkRecord::new();
    let mut copied_out = 0u64;
    if let Some(tlb) = &dma.swiotlb {
        let mut tlb = tlb.borrow_mut();
        for b in &bounces {
            if dir == UsbDir::Read {
                copied_out += b.len;
            }
            tlb.unmap(b, &mut bfree);
        }
    }
    let bounce_unmap_ns = (cost.cpu_ns(&bfree)
        + cost.locks_uncontended_ns(&bfree)
        + copied_out as f64 / dma.copy_bytes_per_ns.max(1e-9))
    .round() as u64;
    let unmap_ns = (cost.cpu_ns(&uwork) + cost.locks_uncontended_ns(&uwork)).round() as u64
        + poll_wait_ns
        + bounce_unmap_ns;
    let irq_ns = unmap_ns + config.completion_ns;
    irq.interrupt(irq_ns);
    ctx.handle().tracer().slice(
        crate::trace::Track::Cpu(config.irq_cpu as u32),
        "irq: dma unmap_sg",
        ctx.now().as_ns(),
        irq_ns,
        &[("unmap_ns", unmap_ns)],
    );
    ctx.sleep(SimDuration::ns(irq_ns + config.link.phase_latency_ns))
        .await;
    {
        let mut s = stats.borrow_mut();
        s.commands += 1;
        s.reads += u64::from(dir == UsbDir::Read);
        s.bytes += bytes;
        s.segments += nseg;
        s.data_ns += data_ns;
        s.busy_ns += before_ns + data_ns + irq_ns + config.link.phase_latency_ns;
        s.pages_translated += pages;
        s.translation_ns += translation_ns;
        s.map_ns += map_ns;
        s.unmap_ns += unmap_ns;
        s.poll_wait_ns += poll_wait_ns;
        s.flushes += flushes;
        s.polls += uwork.polls;
        s.bounced_entries += bounces.len() as u64;
        s.bounced_bytes += bounces.iter().map(|b| b.len).sum::<u64>();
        s.bounce_ns += bounce_map_ns + bounce_unmap_ns;
        if data_ns > 0 {
            s.max_data_rate = s.max_data_rate.max(bytes as f64 / data_ns as f64);
        }
    }
    on_done();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn superspeed_payload_rate_is_signal_times_encoding_times_efficiency() {
        let l = LinkSpeed {
            name: "superspeed".into(),
            signal_bits_per_s: 5e9,
            encoding: 0.8,
            protocol_efficiency: 0.5,
            phase_latency_ns: 0,
            max_transfer: 1 << 20,
        };
        assert!((l.payload_bytes_per_ns() - 0.25).abs() < 1e-12);
    }

    #[test]
    fn contiguous_pieces_coalesce_up_to_the_segment_size() {
        let p = |pa: u64| Piece {
            pa: PhysAddr::new(pa),
            len: 4096,
        };
        let pieces = [p(0), p(4096), p(8192), p(0x10_0000)];
        let e = sg_entries(&pieces, 8192);
        assert_eq!(e.len(), 3);
        assert_eq!(e[0].len, 8192);
    }

    #[test]
    fn swiotlb_mappings_stay_inside_one_segment_and_free_their_slots() {
        // 4 segments of 8 slots of 2 KiB (16 KiB per segment).
        let mut t = Swiotlb::new(0x1000_0000, 4 * 8 * 2048, 2048, 8).unwrap();
        let mut w = WorkRecord::new();
        let a = t.map(0x5_0000_0000, 12 * 1024, &mut w).unwrap();
        assert_eq!(a.bounce, 0x1000_0000);
        assert_eq!(t.slots_in_use, 6);
        // 8 KiB more does not fit in the first segment's 2 free slots: next segment.
        let b = t.map(0x5_0001_0000, 8192, &mut w).unwrap();
        assert_eq!(b.bounce, 0x1000_0000 + 16 * 1024);
        assert!(
            t.map(0, 17 * 1024, &mut w).is_err(),
            "larger than a segment"
        );
        assert_eq!(
            w.locks[LockId::Other as usize],
            2,
            "a request larger than a segment fails before the lock"
        );
        t.unmap(&a, &mut w);
        t.unmap(&b, &mut w);
        assert_eq!(t.slots_in_use, 0);
        // Fill the pool, then one more mapping fails.
        let mut held = Vec::new();
        for _ in 0..4 {
            held.push(t.map(0, 16 * 1024, &mut w).unwrap());
        }
        assert!(matches!(
            t.map(0, 4096, &mut w),
            Err(SwiotlbError::Full { slots: 2 })
        ));
        assert!(Swiotlb::new(0, 3 * 2048, 2048, 2).is_err());
        assert!(Swiotlb::new(0, 4096, 3000, 2).is_err());
    }
}
