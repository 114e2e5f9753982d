//! An Ethernet NIC behind a POWER TCE IOMMU (a ConnectX-4 SR-IOV virtual function in a
//! PowerVM partition, as driven by mlx5 in 2020).
//!
//! Three pieces:
//!
//! - [`Link`]: the wire, a FIFO serialiser at the port's line rate. A transfer of a TCP
//!   payload is cut into MSS-sized packets, each carrying the per-packet header and framing
//!   overhead; the link is busy for the bytes on the wire and hands back the time the last
//!   bit leaves. Transfers queue behind each other, so the link never exceeds its rate.
//! - [`TceDma`]: the driver's DMA-mapping path, through the functional
//!   [`PseriesIommu`] (a real pool allocator and a real hypervisor TCE table), turned into
//!   virtual time: the CPU steps of the work record (cost model), the allocator's pool locks
//!   as engine [`SpinLock`]s (one per small pool plus the large pool, the pool taken from what
//!   the allocator actually locked), and each hypercall as the profile's hypervisor group
//!   prices it (base round trip, TCE-cache kill, per-TCE work of that call kind), the TCE
//!   part optionally serialised on a per-table hypervisor lock. Every byte the device moves
//!   is translated through the same path ([`TceDma::device_access`]).
//! - [`TxRing`] and [`RxPages`]: the transmit ring (mapped skbs in flight until their
//!   completion is processed, with the NIC's completion moderation) and the receive buffer
//!   pages (mapped once, recycled by the driver's page cache or replaced by a fresh mapping).

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::sync::Arc;

use iolab_iommu::addr::{Access, PhysAddr};
use iolab_iommu::dma::{Device, Direction, DmaError, DmaFault};
use iolab_iommu::hw::pseries::PseriesStats;
use iolab_iommu::hw::{DmaPath, MappedBuffer, PseriesIommu};
use iolab_iommu::work::{LockId, WorkRecord};

use crate::cost::{CpuCostModel, HypervisorCosts, PlatformProfile, TceCall};
use crate::engine::{Ctx, Handle, SimDuration, SimError, SimTime};
use crate::iommu::port::{DeviceLink, DmaPort, DmaStream, Translated};
use crate::resources::{LockKind, SpinLock, SpinParams};
use crate::Account;

/// How the hypervisor's per-table TCE lock spins. PowerVM's internal locking is not public
/// (RESEARCH.md, "Linux locks"); assumption: a test-and-set lock built from `lwarx`/`stwcx.`,
/// as powerpc's own Linux spinlocks were until the queued lock became the default in 5.13,
/// so a hand-off grows with the CPUs waiting. docs/model/contention.md gives the figures'
/// sensitivity to it (with [`LockKind::Queued`] instead).
pub const HV_TABLE_LOCK_KIND: LockKind = LockKind::Queued;

/// How far a NIC's DMA requests run ahead, for the [DMA port](crate::iommu::port):
/// assumption: 256 PCIe tags of 512-byte reads (RESEARCH.md "PCIe tags"), 32 pages in
/// flight; its writes to memory are ordered (Relaxed Ordering off, as F&S's serial fit of
/// their receive runs implies).
pub const NIC_LINK: DeviceLink = DeviceLink {
    outstanding_pages: 32,
    relaxed_ordering: false,
};

/// The name of the hypervisor's per-table TCE lock (`HvSerialisation::PerTable`).
pub const HV_TABLE_LOCK: &str = "phyp_tce_table";

/// Why the NIC's DMA path failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum NicError {
    /// A map or unmap was refused by the IOMMU model.
    #[error("DMA mapping failed: {0}")]
    Dma(#[from] DmaError),
    /// The device's access faulted.
    #[error("DMA access faulted: {0:?}")]
    Fault(DmaFault),
    /// The platform profile has no hypervisor group.
    #[error("The platform profile has no hypervisor group (needed for TCE hypercalls)")]
    NoHypervisor,
    /// The engine refused something (a resource cap).
    #[error("Engine: {0}")]
    Sim(#[from] SimError),
}

// ---------------------------------------------------------------------------------------------
// The wire
// ---------------------------------------------------------------------------------------------

/// The port and framing.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LinkConfig {
    /// Line rate in Gb/s (10^9 bits per second).
    pub gbps: f64,
    /// TCP payload bytes per packet (MSS).
    pub mss: u64,
    /// Bytes each packet adds on the wire: TCP/IP headers plus Ethernet header, FCS,
    /// preamble and inter-frame gap.
    pub per_packet_overhead: u64,
}

impl LinkConfig {
    /// A port of `gbps` with IP MTU `mtu`: MSS = `mtu - tcpip_header_bytes` (at least 1),
    /// and each packet adds its TCP/IP headers and `ethernet_overhead_bytes` of framing on
    /// the wire.
    pub fn from_mtu(
        gbps: f64,
        mtu: u64,
        tcpip_header_bytes: u64,
        ethernet_overhead_bytes: u64,
    ) -> Self {
        Self {
            gbps,
            mss: mtu.saturating_sub(tcpip_header_bytes).max(1),
            per_packet_overhead: tcpip_header_bytes + ethernet_overhead_bytes,
        }
    }

    /// Packets needed for `payload` bytes.
    pub fn packets(&self, payload: u64) -> u64 {
        payload.div_ceil(self.mss).max(1)
    }

    /// Nanoseconds the wire is busy for `payload` bytes of TCP payload.
    pub fn wire_ns(&self, payload: u64) -> f64 {
        let bytes = payload + self.packets(payload) * self.per_packet_overhead;
        bytes as f64 * 8.0 / self.gbps
    }
}

#[derive(Debug, Default)]
struct LinkState {
    /// When the wire is free again (ns, fractional so rounding never accumulates).
    free_at: f64,
    busy_ns: f64,
    payload_bytes: u64,
    transfers: u64,
}

/// A FIFO serialiser at line rate (one direction of the port). Clones share the wire.
#[derive(Clone, Debug)]
pub struct Link {
    cfg: LinkConfig,
    st: std::rc::Rc<RefCell<LinkState>>,
}

impl Link {
    /// An idle wire.
    pub fn new(cfg: LinkConfig) -> Self {
        Self {
            cfg,
            st: std::rc::Rc::new(RefCell::new(LinkState::default())),
        }
    }

    /// The configuration.
    pub fn config(&self) -> LinkConfig {
        self.cfg
    }

    /// Queues `payload` bytes ready at `ready`; returns when the last bit has left.
    pub fn transmit(&self, ready: SimTime, payload: u64) -> SimTime {
        let mut st = self.st.borrow_mut();
        let start = st.free_at.max(ready.0 as f64);
        let d = self.cfg.wire_ns(payload);
        st.free_at = start + d;
        st.busy_ns += d;
        st.payload_bytes += payload;
        st.transfers += 1;
        SimTime(st.free_at.ceil() as u64)
    }

    /// Nanoseconds the wire has been busy so far (scheduled transfers included).
    pub fn busy_ns(&self) -> f64 {
        self.st.borrow().busy_ns
    }

    /// Payload bytes queued so far.
    pub fn payload_bytes(&self) -> u64 {
        self.st.borrow().payload_bytes
    }
}

// ---------------------------------------------------------------------------------------------
// The DMA-mapping path in virtual time
// ---------------------------------------------------------------------------------------------

/// Totals of a [`TceDma`], for reports and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct DmaTotals {
    /// Buffers mapped.
    pub maps: u64,
    /// Buffers unmapped.
    pub unmaps: u64,
    /// Per-I/O hypercalls issued (maps and clears).
    pub hypercalls: u64,
    /// TCEs written or cleared by them.
    pub tces: u64,
    /// Bytes the device translated (read or written).
    pub device_bytes: u64,
    /// Nanoseconds of hypervisor time charged.
    pub hypervisor_ns: f64,
    /// Nanoseconds the IOMMU added to device accesses.
    pub translation_ns: f64,
    /// Pool-lock acquisitions modelled (small pools, large pool).
    pub pool_locks: [u64; 2],
    /// Maps through a direct (pre-mapped) DDW: an offset, no allocation, no hypercall.
    pub direct_maps: u64,
    /// TCEs of the dynamic window held by live mappings now (small pools, large pool).
    pub live_tces: [u64; 2],
    /// The most TCEs live mappings held at once (all pools, then the large pool alone).
    pub peak_live_tces: [u64; 2],
    /// Entries of the window's pools (small pools together, large pool); zero through a
    /// direct window.
    pub window_tces: [u64; 2],
}

impl DmaTotals {
    /// Peak share of the window's TCEs held by live mappings, percent (0 through a direct
    /// window).
    pub fn window_peak_pct(&self) -> f64 {
        let all = self.window_tces[0] + self.window_tces[1];
        if all == 0 {
            0.0
        } else {
            self.peak_live_tces[0] as f64 / all as f64 * 100.0
        }
    }

    /// Peak share of the large pool's TCEs held by live mappings, percent.
    pub fn large_pool_peak_pct(&self) -> f64 {
        if self.window_tces[1] == 0 {
            0.0
        } else {
            self.peak_live_tces[1] as f64 / self.window_tces[1] as f64 * 100.0
        }
    }
}

/// Where the pools of the device's window are, read once from the functional allocator.
#[derive(Clone, Debug)]
struct PoolLayout {
    /// Entry ranges of the small pools, then of the large pool (window-relative entries).
    bounds: Vec<(u64, u64)>,
    offset: u64,
    page_shift: u32,
    /// Small pool each CPU hashes to.
    cpu_pool: Vec<usize>,
}

impl PoolLayout {
    fn small_pools(&self) -> usize {
        self.bounds.len() - 1
    }

    /// TCEs a mapping of `len` bytes at bus address `dma` occupies.
    fn entries(&self, dma: u64, len: u64) -> u64 {
        let first = dma >> self.page_shift;
        let last = (dma + len.max(1) - 1) >> self.page_shift;
        last - first + 1
    }

    /// The pool (index into the locks) holding the block that starts at bus address `dma`.
    fn pool_of(&self, dma: u64) -> usize {
        let entry = (dma - self.offset) >> self.page_shift;
        self.bounds
            .iter()
            .position(|&(s, e)| entry >= s && entry < e)
            .unwrap_or(self.small_pools())
    }
}

/// Whether TCE updates serialise in the hypervisor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HvSerialisation {
    /// Hypercalls on one table run in parallel on their CPUs.
    None,
    /// The per-TCE work and the TCE-cache kill of each hypercall hold one lock per table.
    PerTable,
}

/// The mlx5 driver's DMA-mapping path on a POWER partition, in virtual time. See the
/// module docs. Single-threaded (engine tasks share it through `Rc`).
pub struct TceDma {
    iommu: Arc<PseriesIommu>,
    dev: Device,
    model: CpuCostModel,
    /// The IOMMU's DMA port (the profile's unit), and the NIC's stream at it.
    port: DmaPort,
    stream: DmaStream,
    hv: HypervisorCosts,
    scan_ns: f64,
    pools: Vec<SpinLock>,
    /// The CPU that last held each pool lock: a new holder pulls the pool's hint and the
    /// bitmap words it touches from that CPU's cache.
    last_holder: RefCell<Vec<usize>>,
    line_ns: f64,
    hv_lock: Option<SpinLock>,
    /// The pools of the device's dynamic window; `None` through a direct DDW (static map:
    /// no allocator, no per-I/O hypercalls).
    layout: Option<PoolLayout>,
    totals: Cell<DmaTotals>,
    work: RefCell<WorkRecord>,
}

impl TceDma {
    /// The path for `dev` through `iommu`, on `cpus` CPUs, priced by `profile`. Creates the
    /// pool locks (named `tce_pool0..`, `tce_large_pool`) and, with
    /// [`HvSerialisation::PerTable`], the hypervisor's table lock (`phyp_tce_table`).
    /// Through a direct DDW there are no pools: maps are the functional model's offset
    /// (CPU steps only) and unmaps do nothing but bookkeeping.
    pub fn new(
        h: &Handle,
        iommu: Arc<PseriesIommu>,
        dev: Device,
        profile: &PlatformProfile,
        serialisation: HvSerialisation,
        pool_lock: LockKind,
    ) -> Result<Self, NicError> {
        let hv = profile.hypervisor.clone().ok_or(NicError::NoHypervisor)?;
        let model = profile.cpu_cost_model();
        let cpus = h.cpus();
        let layout = iommu.with_window_pool(&dev, |pool, offset, page_shift| PoolLayout {
            bounds: pool.pool_bounds(),
            offset,
            page_shift,
            cpu_pool: (0..cpus).map(|c| pool.pool_for_cpu(c)).collect(),
        });
        let params = SpinParams {
            acquire_ns: profile.sync.lock_acquire_release.ns().round() as u64,
            release_ns: 0,
            handoff_ns: profile.sync.lock_handoff.ns().round() as u64,
            kind: pool_lock,
        };
        let mut pools = Vec::new();
        let mut totals = DmaTotals::default();
        if let Some(layout) = &layout {
            for i in 0..layout.small_pools() {
                pools.push(SpinLock::new(h, format!("tce_pool{i}"), params)?);
            }
            pools.push(SpinLock::new(h, "tce_large_pool", params)?);
            let size = |&(s, e): &(u64, u64)| e - s;
            let n = layout.small_pools();
            totals.window_tces = [
                layout.bounds[..n].iter().map(size).sum(),
                layout.bounds[n..].iter().map(size).sum(),
            ];
        }
        let hv_lock = match serialisation {
            HvSerialisation::None => None,
            HvSerialisation::PerTable => Some(SpinLock::new(
                h,
                HV_TABLE_LOCK,
                SpinParams {
                    kind: HV_TABLE_LOCK_KIND,
                    ..params
                },
            )?),
        };
        let scan_ns = model.cpu_weight("bitmap_words_scanned").unwrap_or(0.0);
        let last_holder = RefCell::new(vec![usize::MAX; pools.len()]);
        Ok(Self {
            last_holder,
            line_ns: profile.sync.cacheline_transfer.ns(),
            iommu,
            dev,
            port: model.dma_port(),
            stream: DmaStream::new(NIC_LINK),
            model,
            hv,
            scan_ns,
            pools,
            hv_lock,
            layout,
            totals: Cell::new(totals),
            work: RefCell::new(WorkRecord::new()),
        })
    }

    /// Totals so far.
    pub fn totals(&self) -> DmaTotals {
        self.totals.get()
    }

    /// Every work record of this path, summed.
    pub fn work(&self) -> WorkRecord {
        *self.work.borrow()
    }

    /// The functional model.
    pub fn iommu(&self) -> &PseriesIommu {
        &self.iommu
    }

    fn add(&self, f: impl FnOnce(&mut DmaTotals)) {
        let mut t = self.totals.get();
        f(&mut t);
        self.totals.set(t);
    }

    /// Whether the device maps through a direct DDW (no pools, no per-I/O hypercalls).
    pub fn is_direct(&self) -> bool {
        self.layout.is_none()
    }

    /// Counts `buf` (mapped outside this path, e.g. receive pages mapped when the interface
    /// came up) as live in the window's occupancy.
    pub fn note_mapped(&self, buf: &MappedBuffer) {
        self.track(buf.dma_addr().0, buf.len(), true);
    }

    /// Live-TCE bookkeeping of one map (`add`) or unmap.
    fn track(&self, dma: u64, len: u64, add: bool) {
        let Some(layout) = &self.layout else { return };
        let n = layout.entries(dma, len);
        let large = usize::from(layout.pool_of(dma) == layout.small_pools());
        self.add(|t| {
            if add {
                t.live_tces[large] += n;
            } else {
                t.live_tces[large] = t.live_tces[large].saturating_sub(n);
            }
            let all = t.live_tces[0] + t.live_tces[1];
            t.peak_live_tces[0] = t.peak_live_tces[0].max(all);
            t.peak_live_tces[1] = t.peak_live_tces[1].max(t.live_tces[1]);
        });
    }

    /// Maps `len` bytes at `pa` for the device (`dma_map_single` / `skb_frag_dma_map`) on
    /// the task's CPU: the allocation under its pool lock, then the TCE hypercalls.
    pub async fn map(
        &self,
        ctx: &Ctx,
        pa: u64,
        len: u64,
        dir: Direction,
    ) -> Result<MappedBuffer, NicError> {
        let (cpu, t0) = (ctx.cpu().id(), ctx.now());
        let before = self.iommu.stats();
        let mut w = WorkRecord::new();
        let buf = self
            .iommu
            .map_single(&self.dev, PhysAddr::new(pa), len, dir, cpu, &mut w)?;
        let after = self.iommu.stats();
        *self.work.borrow_mut() += &w;
        let Some(layout) = &self.layout else {
            // A direct DDW: the bus address is an offset of the physical one.
            spend(ctx, self.model.cpu_ns(&w)).await;
            self.add(|t| {
                t.maps += 1;
                t.direct_maps += 1;
            });
            ctx.trace_since("dma map", t0);
            return Ok(buf);
        };
        self.track(buf.dma_addr().0, buf.len(), true);
        // The zero-area search runs under the pool lock(s); the rest of the CPU work
        // (argument checks, the hypervisor's table writes counted as PTE writes) outside.
        let held = w.bitmap_words_scanned as f64 * self.scan_ns;
        let outside = (self.model.cpu_ns(&w) - held).max(0.0);
        spend(ctx, outside).await;
        let small = w.lock_count(LockId::TcePool) as usize;
        let large = w.lock_count(LockId::TceLargePool) as usize;
        let n_locks = (small + large).max(1);
        let first = layout.cpu_pool.get(cpu).copied().unwrap_or(0);
        let np = layout.small_pools();
        let words = w.bitmap_words_scanned / n_locks as u64;
        for k in 0..small {
            self.locked(ctx, (first + k) % np, held / n_locks as f64, words)
                .await;
        }
        for _ in 0..large {
            self.locked(ctx, np, held / n_locks as f64, words).await;
        }
        self.add(|t| {
            t.maps += 1;
            t.pool_locks[0] += small as u64;
            t.pool_locks[1] += large as u64;
        });
        let calls = [
            (TceCall::Put, after.put_tce - before.put_tce),
            (
                TceCall::PutIndirect,
                after.put_tce_indirect - before.put_tce_indirect,
            ),
        ];
        self.hypercalls(ctx, &calls, after.tces_put - before.tces_put)
            .await;
        ctx.trace_since("dma map", t0);
        Ok(buf)
    }

    /// Unmaps a buffer: the clearing hypercalls first, then the bitmap under the lock of
    /// the pool holding the block (Linux `__iommu_free`).
    pub async fn unmap(&self, ctx: &Ctx, buf: MappedBuffer) -> Result<(), NicError> {
        let (cpu, t0) = (ctx.cpu().id(), ctx.now());
        let (dma, len) = (buf.dma_addr().0, buf.len());
        let before = self.iommu.stats();
        let mut w = WorkRecord::new();
        let now = ctx.now().0;
        self.iommu
            .unmap_single(buf, cpu, now, &mut w)
            .map_err(|r| NicError::Dma(r.error))?;
        let after: PseriesStats = self.iommu.stats();
        *self.work.borrow_mut() += &w;
        spend(ctx, self.model.cpu_ns(&w)).await;
        let Some(layout) = &self.layout else {
            self.add(|t| t.unmaps += 1);
            ctx.trace_since("dma unmap", t0);
            return Ok(());
        };
        self.track(dma, len, false);
        let cleared = after.tces_cleared - before.tces_cleared;
        let calls = [
            (TceCall::Stuff, after.stuff_tce - before.stuff_tce),
            (TceCall::Put, after.put_tce - before.put_tce),
        ];
        self.hypercalls(ctx, &calls, cleared).await;
        let locks = w.lock_count(LockId::TcePool) + w.lock_count(LockId::TceLargePool);
        let pool = layout.pool_of(dma);
        // bitmap_clear over the block's words.
        let words = 1 + cleared / 64;
        let hold = words as f64 * self.scan_ns;
        for _ in 0..locks {
            self.locked(ctx, pool, hold, words).await;
        }
        let large = u64::from(pool == layout.small_pools()) * locks;
        self.add(|t| {
            t.unmaps += 1;
            t.pool_locks[0] += locks - large;
            t.pool_locks[1] += large;
        });
        ctx.trace_since("dma unmap", t0);
        Ok(())
    }

    /// The device reads or writes `len` bytes at `dma`, ready at `at_ns`: translated
    /// through the IOMMU (faulting if unmapped) and timed through its DMA port; returns
    /// when the translation lets the access through (`at_ns` when it adds nothing).
    pub fn device_access(
        &self,
        at_ns: f64,
        dma: u64,
        len: u64,
        access: Access,
    ) -> Result<f64, NicError> {
        let mut w = WorkRecord::new();
        self.iommu
            .translate(
                &self.dev,
                iolab_iommu::addr::DmaAddr(dma),
                len,
                access,
                &mut w,
            )
            .map_err(NicError::Fault)?;
        let span = ((dma + len.max(1) - 1) >> 12) - (dma >> 12) + 1;
        let t = Translated {
            pages: w.translations.max(span),
            misses: w.iotlb_misses,
            walk_reads: w.walk_reads,
        };
        let done = self.port.transfer(at_ns, 0.0, t, access, &self.stream);
        let ns = done - at_ns;
        *self.work.borrow_mut() += &w;
        self.add(|t| {
            t.device_bytes += len;
            t.translation_ns += ns;
        });
        Ok(done)
    }

    /// Takes pool lock `pool`, does `hold_ns` of work on `words` bitmap words under it
    /// (plus the pool's hint), and releases it. When another CPU held it last, the hint's
    /// line and the touched bitmap lines move to this CPU first (`sync.cacheline_transfer`
    /// each): the lock's data bounces between CPUs as the lock does.
    async fn locked(&self, ctx: &Ctx, pool: usize, hold_ns: f64, words: u64) {
        let pool = pool.min(self.pools.len() - 1);
        let lock = &self.pools[pool];
        let g = lock.lock(ctx).await;
        let cpu = ctx.cpu().id();
        let moved = {
            let mut last = self.last_holder.borrow_mut();
            let moved = last[pool] != cpu && last[pool] != usize::MAX;
            last[pool] = cpu;
            moved
        };
        let lines = if moved { 1 + words.div_ceil(8) } else { 0 };
        spend(ctx, hold_ns + lines as f64 * self.line_ns).await;
        g.unlock().await;
    }

    /// Issues `calls` (kind, count) touching `tces` TCEs in all, spread evenly over them.
    async fn hypercalls(&self, ctx: &Ctx, calls: &[(TceCall, u64)], tces: u64) {
        let n: u64 = calls.iter().map(|c| c.1).sum();
        if n == 0 {
            return;
        }
        let mut left = tces;
        let mut i = 0;
        for &(kind, count) in calls {
            for _ in 0..count {
                i += 1;
                let k = if i == n { left } else { tces / n };
                left -= k;
                let total = self.hv.call_ns(kind, k);
                let base = self.hv.call.ns();
                spend(ctx, base).await;
                match &self.hv_lock {
                    Some(lock) => {
                        let g = lock.lock(ctx).await;
                        spend(ctx, total - base).await;
                        g.unlock().await;
                    }
                    None => spend(ctx, total - base).await,
                }
                self.add(|t| {
                    t.hypercalls += 1;
                    t.tces += k;
                    t.hypervisor_ns += total;
                });
            }
        }
    }
}

/// Spends `ns` (rounded) of system time on the task's CPU.
pub async fn spend(ctx: &Ctx, ns: f64) {
    let ns = ns.round();
    if ns >= 1.0 {
        ctx.cpu()
            .spend(SimDuration::ns(ns as u64), Account::System)
            .await;
    }
}

// ---------------------------------------------------------------------------------------------
// Rings
// ---------------------------------------------------------------------------------------------

/// NIC completion moderation (mlx5 CQ moderation: a completion interrupt after `frames`
/// completions or `usecs` after the first, whichever comes first).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Coalescing {
    /// Completions per interrupt.
    pub frames: u64,
    /// Microseconds from the first pending completion to the interrupt.
    pub usecs: u64,
}

/// One transmitted skb awaiting its completion: its mappings, bytes and when the wire
/// finished it.
#[derive(Debug)]
pub struct TxEntry {
    /// The mappings (linear part, then page fragments).
    pub maps: Vec<MappedBuffer>,
    /// Payload bytes.
    pub bytes: u64,
    /// When the last bit left (the completion is written then).
    pub done: SimTime,
    /// When the workload started the message this skb belongs to.
    pub started: SimTime,
    /// Whether this is the last skb of its message.
    pub last: bool,
}

/// A transmit queue: skbs in flight, bounded by descriptors and bytes (the byte bound is
/// the stack's: TCP small queues / BQL).
#[derive(Debug)]
pub struct TxRing {
    entries: VecDeque<TxEntry>,
    max_entries: usize,
    max_bytes: u64,
    bytes: u64,
    coalescing: Coalescing,
}

impl TxRing {
    /// An empty ring of `max_entries` skbs and at most `max_bytes` in flight.
    pub fn new(max_entries: usize, max_bytes: u64, coalescing: Coalescing) -> Self {
        Self {
            entries: VecDeque::new(),
            max_entries: max_entries.max(1),
            max_bytes: max_bytes.max(1),
            bytes: 0,
            coalescing,
        }
    }

    /// Whether an skb of `bytes` can be posted now.
    pub fn has_room(&self, bytes: u64) -> bool {
        self.entries.is_empty()
            || (self.entries.len() < self.max_entries && self.bytes + bytes <= self.max_bytes)
    }

    /// Posts an skb.
    pub fn push(&mut self, e: TxEntry) {
        self.bytes += e.bytes;
        self.entries.push_back(e);
    }

    /// Skbs in flight.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing is in flight.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// When the completion interrupt for what is in flight fires: `usecs` after the oldest
    /// completion, or at the `frames`-th completion if earlier. `None` when empty.
    pub fn interrupt_at(&self) -> Option<SimTime> {
        let oldest = self.entries.front()?.done;
        let by_time = oldest + SimDuration::us(self.coalescing.usecs);
        let by_frames = self
            .entries
            .get(self.coalescing.frames.saturating_sub(1) as usize)
            .map(|e| e.done);
        Some(match by_frames {
            Some(t) if t < by_time => t,
            _ => by_time,
        })
    }

    /// Takes every skb completed by `now`.
    pub fn take_done(&mut self, now: SimTime) -> Vec<TxEntry> {
        let mut out = Vec::new();
        while self.entries.front().is_some_and(|e| e.done <= now) {
            if let Some(e) = self.entries.pop_front() {
                self.bytes -= e.bytes;
                out.push(e);
            }
        }
        out
    }
}

/// A receive queue's buffer pages: each page is mapped for the device, filled with packet
/// strides, then either recycled by the driver's page cache (still mapped) or released
/// (unmapped) and replaced by a freshly mapped page.
#[derive(Debug)]
pub struct RxPages {
    /// The mapped pages, in ring order (front is being filled).
    pub pages: VecDeque<MappedBuffer>,
    /// Strides already used in the front page.
    pub used_strides: u64,
    /// Strides per page.
    pub strides_per_page: u64,
}
