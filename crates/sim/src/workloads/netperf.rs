//! A netperf/iperf-like TCP stream test: N threads, each with its own connection and its
//! own NIC queue (pinned to CPU `i`), streaming fixed-size messages for a run of a given
//! length, in one direction:
//!
//! - **write** (transmit-heavy): each thread `write()`s messages; the stack copies them into
//!   page fragments, builds TSO skbs (headers in a small linear part, payload in page
//!   fragments), and the driver maps the linear part and every fragment, rings the
//!   doorbell, and unmaps them when the completion is processed (completion moderation on
//!   the transmit queue). Throughput is the payload the wire finished inside the measured
//!   window; latency is the mean time from `write()` entry to the wire finishing the
//!   message's last byte.
//! - **read** (receive-heavy): a remote sender (an agent, its CPU is not modelled) keeps a
//!   TCP window of messages in flight over the shared wire; the NIC writes packets into
//!   mapped receive pages (fixed-size strides); each thread handles the interrupt (when it
//!   was idle), the per-packet and per-skb receive work, the copy to the user buffer, and
//!   refills consumed pages: recycled through the driver's page cache (still mapped) or
//!   unmapped and replaced by a freshly mapped page. Throughput is the payload the threads
//!   consumed, counted by wire delivery time inside the window; latency the mean time from the sender starting a message
//!   to the reader's `read()` returning it.
//!
//! The DMA path and its costs are the NIC's ([`TceDma`]); the stack's own per-skb and
//! per-packet costs are parameters ([`StackCosts`]).

use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::Arc;

use iolab_iommu::addr::Access;
use iolab_iommu::dma::{Device, Direction};
use iolab_iommu::hw::{DmaPath, MappedBuffer, PseriesIommu};

use crate::accounting::LockStats;
use crate::cost::PlatformProfile;
use crate::devices::nic::{
    spend, Coalescing, DmaTotals, HvSerialisation, Link, LinkConfig, NicError, RxPages, TceDma,
    TxEntry, TxRing,
};
use crate::engine::{Channel, Ctx, Sim, SimConfig, SimDuration, SimTime};
use crate::metrics::CpuBreakdown;

/// Which way the data flows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StreamDirection {
    /// Transmit-heavy: the threads write.
    Write,
    /// Receive-heavy: the threads read.
    Read,
}

/// The network stack's CPU costs (the DMA path's are the cost model's).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StackCosts {
    /// One system call entry and exit, ns.
    pub syscall_ns: f64,
    /// Copy bandwidth between user and kernel buffers, bytes per ns.
    pub copy_bytes_per_ns: f64,
    /// TCP/IP transmit work per TSO skb (segmentation bookkeeping, IP, qdisc, driver WQE).
    pub tx_per_skb_ns: f64,
    /// Driver and stack work per completed transmit skb (CQE, free skb, TCP ACK share).
    pub tx_completion_ns: f64,
    /// One completion interrupt (entry through the hypervisor, NAPI schedule, EOI).
    pub irq_ns: f64,
    /// Driver work per received packet (CQE, stride, GRO merge).
    pub rx_per_packet_ns: f64,
    /// TCP receive work per GRO'd skb.
    pub rx_per_skb_ns: f64,
    /// One doorbell write (MMIO).
    pub doorbell_ns: f64,
    /// Random spread of the stack costs, percent (uniform).
    pub jitter_pct: u32,
}

impl StackCosts {
    /// Takes the costs a platform profile prices (system call, copy bandwidth, doorbell
    /// write) from `profile`; the stack's own per-skb and per-packet costs stay.
    pub fn with_profile(mut self, profile: &PlatformProfile) -> Self {
        self.syscall_ns = profile.cpu.syscall.ns();
        self.copy_bytes_per_ns = profile.memory.memcpy_bandwidth.gb_per_s;
        self.doorbell_ns = profile.mmio.write.ns();
        self
    }
}

/// One stream test configuration.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StreamConfig {
    /// Threads (and connections, and NIC queues), 1..=CPUs.
    pub threads: usize,
    /// Write or read.
    pub direction: StreamDirection,
    /// Bytes per `write()` / `read()`.
    pub message_bytes: u64,
    /// Largest TSO / GRO skb payload.
    pub tso_max_bytes: u64,
    /// Page size of the fragment pages and receive pages (the kernel's PAGE_SIZE).
    pub page_bytes: u64,
    /// Bytes of an skb's linear part mapped separately (0: the driver inlines the headers
    /// into the descriptor and maps only the page fragments).
    pub linear_bytes: u64,
    /// Transmit descriptors per queue.
    pub tx_ring_entries: usize,
    /// Most payload bytes a connection keeps queued in the NIC (TCP small queues).
    pub tx_inflight_bytes: u64,
    /// Transmit completion moderation.
    pub tx_coalescing: Coalescing,
    /// Receive completion moderation.
    pub rx_coalescing: Coalescing,
    /// Messages the remote sender keeps in flight per connection (the receive window).
    pub rx_window_messages: usize,
    /// Receive stride size (one packet per stride).
    pub rx_stride_bytes: u64,
    /// Receive pages per queue (ring plus the driver's page cache), mapped at start.
    pub rx_ring_pages: usize,
    /// NIC queues (channels) the interface has; each keeps its receive pages mapped
    /// whether or not a thread uses it, so they occupy the DMA window in every test.
    pub queues: usize,
    /// Percent of consumed receive pages the driver's page cache recycles (still mapped).
    pub rx_recycle_pct: u32,
    /// Virtual run length, ns.
    pub run_ns: u64,
    /// Start of the measured window, ns (warm-up before it).
    pub warmup_ns: u64,
}

/// What one run of a stream test measured.
#[derive(Clone, Debug, PartialEq)]
pub struct StreamResult {
    /// Payload throughput in the measured window, Gb/s.
    pub throughput_gbps: f64,
    /// Mean message latency in the window, us.
    pub mean_latency_us: f64,
    /// Messages measured.
    pub messages: u64,
    /// Mean busy share of the CPUs running threads, percent.
    pub busy_pct: f64,
    /// Mean spin share of those CPUs, percent.
    pub spin_pct: f64,
    /// DMA totals.
    pub dma: DmaTotals,
    /// Spinlock statistics (pool locks, hypervisor table lock).
    pub locks: Vec<LockStats>,
    /// Wire busy share over the run, percent.
    pub link_busy_pct: f64,
    /// CPU time of the CPUs running threads, summed over them.
    pub cpu: CpuBreakdown,
}

/// The name of the hypervisor's per-table TCE lock in [`StreamResult::locks`] (every other
/// lock there is one of the guest's TCE pool locks); the NIC's TCE path names it.
pub use crate::devices::nic::HV_TABLE_LOCK;

/// The TCE path's figures of one stream run: what the pseries-ddw experiment reports and
/// the lab's netperf measurement carries, computed in one place.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct TceFigures {
    /// Hypercalls per message (per `message_bytes` the device moved).
    pub hypercalls_per_msg: f64,
    /// TCEs built or cleared per message.
    pub tces_per_msg: f64,
    /// Time spent waiting for the guest's TCE pool locks, summed over CPUs, ms.
    pub pool_lock_wait_ms: f64,
    /// Time spent waiting for the hypervisor's per-table lock, summed over CPUs, ms.
    pub hv_table_wait_ms: f64,
    /// Share of the run the hypervisor's per-table lock was held, percent (0 when the
    /// hypervisor does not serialise TCE updates).
    pub hv_table_busy_pct: f64,
    /// Peak share of the window's TCEs held by live mappings, percent.
    pub window_peak_pct: f64,
    /// Peak share of the window's large pool held by live mappings, percent.
    pub large_pool_peak_pct: f64,
}

impl StreamResult {
    /// The TCE path's figures of this run, for messages of `message_bytes` and a run of
    /// `run_ns` (the lock-busy share is over the whole run, warm-up included).
    pub fn tce_figures(&self, message_bytes: u64, run_ns: u64) -> TceFigures {
        let messages = self.dma.device_bytes.max(1) as f64 / message_bytes.max(1) as f64;
        let mut f = TceFigures {
            hypercalls_per_msg: self.dma.hypercalls as f64 / messages,
            tces_per_msg: self.dma.tces as f64 / messages,
            window_peak_pct: self.dma.window_peak_pct(),
            large_pool_peak_pct: self.dma.large_pool_peak_pct(),
            ..TceFigures::default()
        };
        for l in &self.locks {
            let ms = l.wait_total_ns as f64 / 1e6;
            if l.name == HV_TABLE_LOCK {
                f.hv_table_wait_ms += ms;
                f.hv_table_busy_pct += l.hold_total_ns as f64 / run_ns.max(1) as f64 * 100.0;
            } else {
                f.pool_lock_wait_ms += ms;
            }
        }
        f
    }
}

/// What a caller of the stream's transmit and receive loops observes of them, besides the
/// DMA path's own work: `iolab_sim::soak` checks its invariants through these calls, the
/// stream test measures through them. Every method has a no-op default.
pub trait StreamHooks {
    /// The error the loops stop with (the DMA path's errors convert into it).
    type Error: From<NicError>;

    /// Whether the run has failed (the loops stop at their next message).
    fn failed(&self) -> bool {
        false
    }

    /// A buffer of `len` bytes at physical `pa` was mapped for the device as `m`.
    fn mapped(&self, _ctx: &Ctx, _m: &MappedBuffer, _pa: u64) -> Result<(), Self::Error> {
        Ok(())
    }

    /// The device read or wrote `len` bytes at DMA address `dma` (after the IOMMU allowed it).
    fn accessed(
        &self,
        _ctx: &Ctx,
        _dma: u64,
        _len: u64,
        _access: Access,
    ) -> Result<(), Self::Error> {
        Ok(())
    }

    /// The driver is about to unmap `m`.
    fn unmapping(&self, _ctx: &Ctx, _m: &MappedBuffer) -> Result<(), Self::Error> {
        Ok(())
    }

    /// Connection `i` accepted a `write()` of `bytes` (copied, before its skbs are built).
    fn message_written(&self, _i: usize, _bytes: u64) {}

    /// Connection `i` handed an skb of `bytes` to the wire, which finishes it at `done`.
    fn skb_sent(
        &self,
        _ctx: &Ctx,
        _i: usize,
        _bytes: u64,
        _done: SimTime,
    ) -> Result<(), Self::Error> {
        Ok(())
    }

    /// The last byte of a message connection `i`'s `write()` took at `started` goes on the
    /// wire in an skb the wire finishes at `done`.
    fn message_on_wire(&self, _i: usize, _started: SimTime, _done: SimTime) {}

    /// Connection `i`'s completion handler frees `skb` (before unmapping its buffers).
    fn skb_completed(&self, _ctx: &Ctx, _i: usize, _skb: &TxEntry) -> Result<(), Self::Error> {
        Ok(())
    }

    /// The remote sender of connection `i` sent a message at `sent`; the wire delivers it
    /// at `arrival`.
    fn message_sent(&self, _i: usize, _sent: SimTime, _arrival: SimTime) {}

    /// Connection `i`'s reader returned the message sent at `sent` and delivered at
    /// `arrival` from `read()`, now.
    fn message_read(
        &self,
        _ctx: &Ctx,
        _i: usize,
        _sent: SimTime,
        _arrival: SimTime,
    ) -> Result<(), Self::Error> {
        Ok(())
    }
}

#[derive(Default)]
struct Meas {
    bytes: u64,
    lat_sum_ns: u128,
    lat_n: u64,
    error: Option<NicError>,
}

/// The stream test's measurement: throughput and latency inside the window.
struct Measure {
    meas: RefCell<Meas>,
    end: SimTime,
    warmup: SimTime,
    message_bytes: u64,
}

impl Measure {
    fn fail(&self, e: NicError) {
        let mut m = self.meas.borrow_mut();
        if m.error.is_none() {
            m.error = Some(e);
        }
    }

    fn in_window(&self, start: SimTime, end: SimTime) -> bool {
        start >= self.warmup && end <= self.end
    }
}

impl StreamHooks for Measure {
    type Error = NicError;

    fn failed(&self) -> bool {
        self.meas.borrow().error.is_some()
    }

    fn skb_sent(&self, _ctx: &Ctx, _i: usize, skb: u64, done: SimTime) -> Result<(), NicError> {
        if done > self.warmup && done <= self.end {
            self.meas.borrow_mut().bytes += skb;
        }
        Ok(())
    }

    fn message_on_wire(&self, _i: usize, started: SimTime, done: SimTime) {
        if self.in_window(started, done) {
            let mut m = self.meas.borrow_mut();
            m.lat_sum_ns += u128::from(done.0 - started.0);
            m.lat_n += 1;
        }
    }

    fn message_read(
        &self,
        ctx: &Ctx,
        _i: usize,
        sent: SimTime,
        arrival: SimTime,
    ) -> Result<(), NicError> {
        let now = ctx.now();
        let mut m = self.meas.borrow_mut();
        // Counted by when the wire delivered it (so the count never exceeds the
        // wire), if the reader consumed it within the run.
        if arrival > self.warmup && arrival <= self.end && now <= self.end {
            m.bytes += self.message_bytes;
        }
        if self.in_window(sent, now) {
            m.lat_sum_ns += u128::from(now.0 - sent.0);
            m.lat_n += 1;
        }
        Ok(())
    }
}

/// What the stream's transmit and receive loops share: the configuration, the stack's
/// costs, the DMA path, the wire, the end of the run and the caller's hooks.
pub struct StreamShared<H> {
    /// The stream configuration.
    pub cfg: StreamConfig,
    /// The stack's costs.
    pub costs: StackCosts,
    /// The NIC's DMA path.
    pub dma: TceDma,
    /// The wire.
    pub link: Link,
    /// The end of the run: no message starts at or after it.
    pub end: SimTime,
    /// The caller's hooks.
    pub hooks: H,
}

impl<H: StreamHooks> StreamShared<H> {
    fn failed(&self) -> bool {
        self.hooks.failed()
    }

    async fn stack(&self, ctx: &Ctx, ns: f64) {
        let j = ctx
            .rng()
            .jitter(ns.round() as u64, self.costs.jitter_pct.min(100));
        spend(ctx, j as f64).await;
    }
}

/// Physical layout of one thread's buffers: 4 GiB apart, fragment pages, receive pages and
/// skb heads in separate areas.
fn thread_base(i: usize) -> u64 {
    (i as u64 + 1) << 32
}
const FRAG_PAGES: u64 = 256;
const RX_AREA: u64 = 1 << 30;
const HEAD_AREA: u64 = 2 << 30;
const HEADS: u64 = 4096;

/// Physical address of receive page `k` of queue `q` (the refills cycle through
/// `4 * rx_ring_pages` of them).
pub fn rx_page_pa(cfg: &StreamConfig, q: usize, k: u64) -> u64 {
    thread_base(q) + RX_AREA + k * cfg.page_bytes
}

/// Maps every queue's receive pages, as the interface does when it comes up (before the run,
/// not timed): page `k` of queue `q` is at [`rx_page_pa`]`(cfg, q, k)`.
pub fn map_rx_rings(
    cfg: &StreamConfig,
    iommu: &PseriesIommu,
    dev: &Device,
    cpus: usize,
) -> Result<Vec<VecDeque<MappedBuffer>>, NicError> {
    let mut rings: Vec<VecDeque<MappedBuffer>> = Vec::new();
    for q in 0..cfg.queues.max(cfg.threads) {
        let mut ring = VecDeque::new();
        for k in 0..cfg.rx_ring_pages.max(1) as u64 {
            let mut w = iolab_iommu::work::WorkRecord::new();
            let pa = iolab_iommu::addr::PhysAddr::new(rx_page_pa(cfg, q, k));
            ring.push_back(iommu.map_single(
                dev,
                pa,
                cfg.page_bytes,
                Direction::FromDevice,
                q % cpus,
                &mut w,
            )?);
        }
        rings.push(ring);
    }
    Ok(rings)
}

/// Runs one stream test on `iommu` for `dev`, priced by `profile`, with `seed`.
#[allow(clippy::too_many_arguments)]
pub fn run_stream(
    cfg: &StreamConfig,
    costs: &StackCosts,
    link: LinkConfig,
    iommu: Arc<PseriesIommu>,
    dev: Device,
    profile: &PlatformProfile,
    serialisation: HvSerialisation,
    pool_lock: crate::resources::LockKind,
    seed: u64,
) -> Result<StreamResult, NicError> {
    let cpus = (profile.cpu.cores as usize).max(cfg.threads).max(1);
    let mut sim = Sim::for_machine(SimConfig { cpus, seed }, profile)?;
    // Every queue's receive pages are mapped when the interface comes up (before the
    // run, not timed), whether or not a thread reads from it: they occupy the window.
    let rings = map_rx_rings(cfg, &iommu, &dev, cpus)?;
    let dma = TceDma::new(sim.handle(), iommu, dev, profile, serialisation, pool_lock)?;
    for b in rings.iter().flatten() {
        dma.note_mapped(b);
    }
    let mut rings = rings.into_iter();
    let shared = Rc::new(StreamShared {
        cfg: *cfg,
        costs: *costs,
        dma,
        link: Link::new(link),
        end: SimTime(cfg.run_ns),
        hooks: Measure {
            meas: RefCell::new(Meas::default()),
            end: SimTime(cfg.run_ns),
            warmup: SimTime(cfg.warmup_ns.min(cfg.run_ns)),
            message_bytes: cfg.message_bytes,
        },
    });
    for i in 0..cfg.threads {
        let s = shared.clone();
        match cfg.direction {
            StreamDirection::Write => {
                sim.spawn_on(i, move |ctx| async move {
                    if let Err(e) = writer(&ctx, &s, i).await {
                        s.hooks.fail(e);
                    }
                })?;
            }
            StreamDirection::Read => {
                let h = sim.handle().clone();
                let data: Channel<(SimTime, SimTime)> =
                    Channel::new(&h, cfg.rx_window_messages.max(1) + 1);
                let credits: Channel<()> = Channel::new(&h, cfg.rx_window_messages.max(1) + 1);
                for _ in 0..cfg.rx_window_messages.max(1) {
                    let _ = credits.send(());
                }
                let rx = RxConnection::new(cfg, i, rings.next().unwrap_or_default());
                let (s2, d2, c2) = (shared.clone(), data.clone(), credits.clone());
                sim.spawn_agent(move |ctx| async move { sender(&ctx, &s2, i, &d2, &c2).await })?;
                sim.spawn_on(i, move |ctx| async move {
                    if let Err(e) = reader(&ctx, &s, rx, &data, &credits).await {
                        s.hooks.fail(e);
                    }
                })?;
            }
        }
    }
    let end = SimTime(cfg.run_ns + 1_000_000);
    let report = sim.run_until_observed(end, end)?;
    // The remaining queues' pages stay mapped to the end (the model is dropped with them).
    drop(rings);
    let mut meas = shared.hooks.meas.borrow_mut();
    if let Some(e) = meas.error.take() {
        return Err(e);
    }
    let window_ns = cfg.run_ns.saturating_sub(cfg.warmup_ns).max(1) as f64;
    let used = &report.cpus[..cfg.threads.min(report.cpus.len())];
    let horizon = cfg.run_ns.max(1) as f64 * used.len().max(1) as f64;
    let busy: u64 = used.iter().map(|c| c.busy()).sum();
    let spin: u64 = used.iter().map(|c| c.spin).sum();
    Ok(StreamResult {
        throughput_gbps: meas.bytes as f64 * 8.0 / window_ns,
        mean_latency_us: if meas.lat_n == 0 {
            0.0
        } else {
            meas.lat_sum_ns as f64 / meas.lat_n as f64 / 1000.0
        },
        messages: meas.lat_n,
        busy_pct: (busy as f64 / horizon * 100.0).min(100.0),
        spin_pct: (spin as f64 / horizon * 100.0).min(100.0),
        dma: shared.dma.totals(),
        locks: report.spin_locks.clone(),
        link_busy_pct: (shared.link.busy_ns() / cfg.run_ns.max(1) as f64 * 100.0).min(100.0),
        cpu: used.iter().fold(CpuBreakdown::default(), |mut a, c| {
            a.user_ns += c.user;
            a.system_ns += c.system;
            a.spin_ns += c.spin;
            a.idle_ns += c.idle;
            a
        }),
    })
}

/// Transmit side of one connection.
async fn writer(ctx: &Ctx, s: &StreamShared<Measure>, i: usize) -> Result<(), NicError> {
    let mut tx = TxConnection::new(&s.cfg, i);
    while ctx.now() < s.end && !s.failed() {
        tx.write_message(ctx, s).await?;
    }
    Ok(())
}

/// One connection's transmit state: its queue's ring and where its next skb head and
/// payload fragment go in its buffers.
#[derive(Debug)]
pub struct TxConnection {
    i: usize,
    base: u64,
    ring: TxRing,
    page: u64,
    off: u64,
    heads: u64,
    /// Stream bytes written but not yet in an skb.
    unsent: u64,
    /// Stream bytes put in skbs so far.
    sent_to: u64,
    /// Messages whose last byte is not yet in an skb: (stream offset of their end, when
    /// their `write()` started).
    pending: VecDeque<(u64, SimTime)>,
}

impl TxConnection {
    /// Connection `i` (queue and CPU `i`), nothing in flight.
    pub fn new(c: &StreamConfig, i: usize) -> Self {
        Self {
            i,
            base: thread_base(i),
            ring: TxRing::new(c.tx_ring_entries, c.tx_inflight_bytes, c.tx_coalescing),
            page: 0,
            off: 0,
            heads: 0,
            unsent: 0,
            sent_to: 0,
            pending: VecDeque::new(),
        }
    }

    /// The skbs in flight.
    pub fn ring(&self) -> &TxRing {
        &self.ring
    }

    /// One `write()` of a message: the copy, the TSO skbs it completes mapped, read by the
    /// device and put on the wire (waiting for completions when the ring is full), and the
    /// completion interrupt if one is due. TCP cuts the socket's byte stream, not each
    /// `write()`, into skbs of the size goal (`tso_max_bytes`): a write's tail waits in the
    /// last, partly filled skb for the next write's bytes (bulk streams keep the tail corked
    /// while data is in flight). The payload is copied into page fragments back to back, so
    /// an skb whose size is not a multiple of the page straddles two pages and is mapped as
    /// two fragments, as `tcp_sendmsg` and `skb_frag_dma_map` do.
    pub async fn write_message<H: StreamHooks>(
        &mut self,
        ctx: &Ctx,
        s: &StreamShared<H>,
    ) -> Result<(), H::Error> {
        let c = s.cfg;
        let i = self.i;
        let started = ctx.now();
        s.stack(
            ctx,
            s.costs.syscall_ns + c.message_bytes as f64 / s.costs.copy_bytes_per_ns,
        )
        .await;
        s.hooks.message_written(i, c.message_bytes);
        self.unsent += c.message_bytes;
        self.pending
            .push_back((self.sent_to + self.unsent, started));
        let tso = c.tso_max_bytes.max(1);
        while self.unsent >= tso {
            self.unsent -= tso;
            self.send_skb(ctx, s, tso, started).await?;
        }
        if self.ring.interrupt_at().is_some_and(|at| at <= ctx.now()) {
            self.complete(ctx, s).await?;
        }
        Ok(())
    }

    /// Pushes the stream's corked tail (bytes written but short of a full skb) to the wire
    /// as one last, short skb, as TCP does when the application stops writing.
    pub async fn flush<H: StreamHooks>(
        &mut self,
        ctx: &Ctx,
        s: &StreamShared<H>,
    ) -> Result<(), H::Error> {
        if self.unsent > 0 {
            let skb = std::mem::take(&mut self.unsent);
            self.send_skb(ctx, s, skb, ctx.now()).await?;
        }
        Ok(())
    }

    /// Builds one skb of `skb` stream bytes (waiting for ring room), maps it, lets the
    /// device read it and puts it on the wire; messages whose last byte it carries are on
    /// the wire when it finishes.
    async fn send_skb<H: StreamHooks>(
        &mut self,
        ctx: &Ctx,
        s: &StreamShared<H>,
        skb: u64,
        started: SimTime,
    ) -> Result<(), H::Error> {
        let c = s.cfg;
        let (i, base) = (self.i, self.base);
        while !self.ring.has_room(skb) {
            if let Some(at) = self.ring.interrupt_at() {
                if at > ctx.now() {
                    ctx.sleep_until(at).await;
                }
            }
            self.complete(ctx, s).await?;
        }
        s.stack(ctx, s.costs.tx_per_skb_ns).await;
        let mut maps = Vec::with_capacity(3);
        if c.linear_bytes > 0 {
            let head = base + HEAD_AREA + (self.heads % HEADS) * 4096 + 64;
            self.heads += 1;
            let m = s
                .dma
                .map(ctx, head, c.linear_bytes, Direction::ToDevice)
                .await?;
            s.hooks.mapped(ctx, &m, head)?;
            maps.push(m);
        }
        let mut rem = skb;
        while rem > 0 {
            let n = rem.min(c.page_bytes - self.off);
            let pa = base + (self.page % FRAG_PAGES) * c.page_bytes + self.off;
            let m = s.dma.map(ctx, pa, n, Direction::ToDevice).await?;
            s.hooks.mapped(ctx, &m, pa)?;
            maps.push(m);
            rem -= n;
            self.off += n;
            if self.off >= c.page_bytes {
                self.off = 0;
                self.page += 1;
            }
        }
        spend(ctx, s.costs.doorbell_ns).await;
        // The NIC reads the skb's buffers: their walks overlap through the DMA port.
        let at = ctx.now().0 as f64;
        let mut through = at;
        for m in &maps {
            let t = s
                .dma
                .device_access(at, m.dma_addr().0, m.len(), Access::Read)?;
            through = through.max(t);
            s.hooks
                .accessed(ctx, m.dma_addr().0, m.len(), Access::Read)?;
        }
        let ready = SimTime((through - at).round() as u64 + ctx.now().0);
        let done = s.link.transmit(ready, skb);
        ctx.handle().tracer().device(
            || format!("nic tx q{i}"),
            "tx skb",
            ready.0,
            done.0.saturating_sub(ready.0),
            &[("bytes", skb)],
        );
        s.hooks.skb_sent(ctx, i, skb, done)?;
        self.sent_to += skb;
        let first_started = self.pending.front().map_or(started, |p| p.1);
        let mut last = false;
        while let Some(&(end, st)) = self.pending.front() {
            if end > self.sent_to {
                break;
            }
            self.pending.pop_front();
            last = true;
            s.hooks.message_on_wire(i, st, done);
        }
        self.ring.push(TxEntry {
            maps,
            bytes: skb,
            done,
            started: first_started,
            last,
        });
        Ok(())
    }

    /// One transmit completion interrupt: the NAPI poll that frees completed skbs and
    /// unmaps their buffers.
    pub async fn complete<H: StreamHooks>(
        &mut self,
        ctx: &Ctx,
        s: &StreamShared<H>,
    ) -> Result<(), H::Error> {
        let done = self.ring.take_done(ctx.now());
        if done.is_empty() {
            return Ok(());
        }
        s.stack(ctx, s.costs.irq_ns).await;
        for e in done {
            s.hooks.skb_completed(ctx, self.i, &e)?;
            s.stack(ctx, s.costs.tx_completion_ns).await;
            for m in e.maps {
                s.hooks.unmapping(ctx, &m)?;
                s.dma.unmap(ctx, m).await?;
            }
        }
        Ok(())
    }
}

/// The remote sender of connection `i` (its CPU is not modelled): keeps the window full
/// until the end of the run.
pub async fn sender<H: StreamHooks>(
    ctx: &Ctx,
    s: &StreamShared<H>,
    i: usize,
    data: &Channel<(SimTime, SimTime)>,
    credits: &Channel<()>,
) {
    loop {
        credits.recv(ctx).await;
        if ctx.now() >= s.end || s.failed() {
            return;
        }
        let arrival = s.link.transmit(ctx.now(), s.cfg.message_bytes);
        s.hooks.message_sent(i, ctx.now(), arrival);
        if data.send((ctx.now(), arrival)).is_err() {
            return;
        }
    }
}

/// Receive side of one connection.
async fn reader(
    ctx: &Ctx,
    s: &StreamShared<Measure>,
    mut rx: RxConnection,
    data: &Channel<(SimTime, SimTime)>,
    credits: &Channel<()>,
) -> Result<(), NicError> {
    while ctx.now() < s.end && !s.failed() {
        rx.read_message(ctx, s, data, credits).await?;
    }
    Ok(())
}

/// One connection's receive state: its queue's mapped receive pages and the next page a
/// refill maps.
#[derive(Debug)]
pub struct RxConnection {
    i: usize,
    rx: RxPages,
    next_page: u64,
}

impl RxConnection {
    /// Connection `i` with its queue's receive pages `pages` (from [`map_rx_rings`]).
    pub fn new(c: &StreamConfig, i: usize, pages: VecDeque<MappedBuffer>) -> Self {
        Self {
            i,
            rx: RxPages {
                pages,
                used_strides: 0,
                strides_per_page: (c.page_bytes / c.rx_stride_bytes.max(1)).max(1),
            },
            next_page: c.rx_ring_pages.max(1) as u64,
        }
    }

    /// Takes the receive pages still mapped (when the interface goes down).
    pub fn into_pages(self) -> VecDeque<MappedBuffer> {
        self.rx.pages
    }

    /// One `read()` of a message: waits for it (the interrupt if the thread was idle), the
    /// device writes its packets into receive strides, the per-packet and per-skb work and
    /// the copy, the refill of used-up pages, and the credit back to the sender.
    pub async fn read_message<H: StreamHooks>(
        &mut self,
        ctx: &Ctx,
        s: &StreamShared<H>,
        data: &Channel<(SimTime, SimTime)>,
        credits: &Channel<()>,
    ) -> Result<(), H::Error> {
        let c = s.cfg;
        let (i, rx) = (self.i, &mut self.rx);
        let ring_pages = c.rx_ring_pages.max(1) as u64;
        let packets = s.link.config().packets(c.message_bytes);
        // GRO builds skbs of up to the same size goal from the byte stream, so a message
        // costs its share of skbs (not a whole number per message).
        let skbs = c.message_bytes as f64 / c.tso_max_bytes.max(1) as f64;
        let mut idle = data.is_empty();
        let (sent, arrival) = data.recv(ctx).await;
        ctx.handle().tracer().device(
            || format!("nic rx q{i}"),
            "rx message",
            sent.0,
            arrival.0.saturating_sub(sent.0),
            &[("bytes", c.message_bytes)],
        );
        if arrival > ctx.now() {
            let delay = if packets >= c.rx_coalescing.frames {
                0
            } else {
                c.rx_coalescing.usecs
            };
            ctx.sleep_until(arrival + SimDuration::us(delay)).await;
            idle = true;
        }
        if idle {
            s.stack(ctx, s.costs.irq_ns).await;
        }
        // The NIC wrote one packet per stride; pages whose strides are used up are
        // released to the page cache and refilled.
        let mut strides = packets;
        let mut released = Vec::new();
        while strides > 0 {
            let Some(p) = rx.pages.front() else { break };
            let room = rx.strides_per_page - rx.used_strides;
            let n = strides.min(room);
            let at = p.dma_addr().0 + rx.used_strides * c.rx_stride_bytes;
            s.dma
                .device_access(ctx.now().0 as f64, at, n * c.rx_stride_bytes, Access::Write)?;
            s.hooks
                .accessed(ctx, at, n * c.rx_stride_bytes, Access::Write)?;
            rx.used_strides += n;
            strides -= n;
            if rx.used_strides == rx.strides_per_page {
                rx.used_strides = 0;
                released.extend(rx.pages.pop_front());
            }
        }
        s.stack(
            ctx,
            packets as f64 * s.costs.rx_per_packet_ns
                + skbs * s.costs.rx_per_skb_ns
                + s.costs.syscall_ns
                + c.message_bytes as f64 / s.costs.copy_bytes_per_ns,
        )
        .await;
        for old in released {
            let recycle = ctx.rng().below(100) < u64::from(c.rx_recycle_pct);
            if recycle {
                rx.pages.push_back(old);
                continue;
            }
            s.hooks.unmapping(ctx, &old)?;
            s.dma.unmap(ctx, old).await?;
            let pa = rx_page_pa(&c, i, self.next_page % (4 * ring_pages));
            self.next_page += 1;
            let m = s
                .dma
                .map(ctx, pa, c.page_bytes, Direction::FromDevice)
                .await?;
            s.hooks.mapped(ctx, &m, pa)?;
            rx.pages.push_back(m);
        }
        s.hooks.message_read(ctx, i, sent, arrival)?;
        let _ = credits.send(());
        Ok(())
    }
}
