//! An iperf-like send test on a NIC that DMAs through an x86 IOMMU (VT-d or AMD-Vi) or none:
//! N flows, one send queue each, the sending CPUs building TSO skbs and mapping them per
//! fragment as the driver does (`dma_map_single` of the linear part, `skb_frag_dma_map` of
//! each page fragment), the NIC reading each skb's descriptor and buffers through the IOMMU
//! and putting it on the wire, and the completions unmapping every mapping (strict: one
//! invalidation and wait per unmap). The receive side is the same receive test's NIC
//! (`rx_stream`); this is its send half, for per-packet strict costs on transmit.
//!
//! The pieces (docs/model/dma-port.md):
//!
//! - **Sender**: per flow, on CPU `i % cpus`, TSO skbs of `tso_max_bytes` while the flow's
//!   bytes in flight stay within `tx_inflight_bytes` (TCP small queues) and its ring has
//!   room; per skb the CPU pays the stack's `tx_per_skb_ns`, the copy from the user at the
//!   profile's copy bandwidth, the maps and the doorbell.
//! - **NIC**: reads the descriptor (64 bytes plus 16 per data segment) and the buffers
//!   (non-posted reads through the DMA port, `dma_ns_per_4k` per 4 KiB on its read engine,
//!   walks overlapping up to the device's window and the unit's walkers), then the wire at
//!   line rate; at the end it writes the completion (a posted write) and receives the
//!   peer's ACK for the skb (a posted write of the ACK frame into a recycled receive buffer
//!   and its completion).
//! - **Completions**: transmit moderation (`tx_coalescing`); a NAPI poll on the flow's CPU
//!   unmaps every mapping of each completed skb and pays `tx_completion_ns` per skb.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use iolab_iommu::addr::{Access, PhysAddr};
use iolab_iommu::dma::{Device, Direction};
use iolab_iommu::hw::{DmaPath, MappedBuffer};
use iolab_iommu::work::WorkRecord;

use crate::devices::nic::{Coalescing, LinkConfig};
use crate::devices::{DeviceDma, PortTiming};
use crate::engine::SimTime;
use crate::iommu::port::{DmaStream, Translated};
use crate::workloads::nic_dma::{dma_err, per_4k, NicDma};
use crate::workloads::rx_stream::{RxPricing, RxStreamConfig, RxStreamError};

/// Bytes of one completion entry (mlx5 CQE).
const CQE_BYTES: u64 = 64;
/// Bytes of a send descriptor's control and Ethernet segments (mlx5: 48 of a 64-byte
/// basic block), before its 16-byte data segments.
const TX_WQE_HEADER_BYTES: u64 = 48;
/// Bytes of one data segment (pointer) of a send descriptor.
const TX_WQE_SEGMENT_BYTES: u64 = 16;
/// Bytes of a TCP ACK frame the NIC writes on receive.
const ACK_BYTES: u64 = 66;
/// Receive buffers (2 KiB fragments of mapped pages) each flow's ACKs cycle through.
const ACK_BUFFERS: u64 = 64;

/// The send side's own configuration.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TxParams {
    /// Largest TSO skb payload, bytes.
    pub tso_max_bytes: u64,
    /// Bytes of an skb's linear part mapped on its own (0: headers inlined in the
    /// descriptor).
    pub linear_bytes: u64,
    /// Most payload bytes a flow keeps queued in the NIC (TCP small queues).
    pub inflight_bytes: u64,
    /// Transmit completion moderation.
    pub coalescing: Coalescing,
    /// Stack work per TSO skb sent, ns.
    pub per_skb_ns: f64,
    /// Driver and stack work per completed skb (CQE, free, the ACK's share), ns.
    pub completion_ns: f64,
    /// One doorbell write, ns.
    pub doorbell_ns: f64,
    /// One completion interrupt and NAPI poll start, ns.
    pub irq_ns: f64,
    /// Copy bandwidth from the user buffer, bytes per ns.
    pub copy_bytes_per_ns: f64,
}

/// What one send test measured (the window after the warm-up).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TxStreamResult {
    /// Payload put on the wire, Gb/s.
    pub throughput_gbps: f64,
    /// Payload bytes put on the wire.
    pub bytes: u64,
    /// TSO skbs sent.
    pub skbs: u64,
    /// Buffers mapped and unmapped by the driver.
    pub maps: u64,
    /// The device's translations (IOTLB hits and misses, walk reads) over every DMA.
    pub translation: WorkRecord,
    /// Map and unmap work of the driver.
    pub dma_work: WorkRecord,
    /// The NIC's read engine busy share, percent.
    pub dma_busy_pct: f64,
    /// Wire busy share, percent.
    pub link_busy_pct: f64,
    /// Mean busy share of the CPUs running flows, percent.
    pub cpu_busy_pct: f64,
}

impl TxStreamResult {
    /// IOTLB misses per 4 KiB sent.
    pub fn iotlb_misses_per_4k(&self) -> f64 {
        per_4k(self.translation.iotlb_misses, self.bytes)
    }

    /// Page-table memory reads per 4 KiB sent.
    pub fn walk_reads_per_4k(&self) -> f64 {
        per_4k(self.translation.walk_reads, self.bytes)
    }

    /// Driver maps per 4 KiB sent.
    pub fn maps_per_4k(&self) -> f64 {
        per_4k(self.maps, self.bytes)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    /// A flow's CPU may build its next skb.
    Send(usize),
    /// A flow's completion interrupt or repoll (generation).
    Poll(usize, u64),
}

/// One skb in the NIC: its mappings, payload and when its completion is written.
struct InFlight {
    maps: Vec<MappedBuffer>,
    bytes: u64,
    done: u64,
}

struct Flow {
    sq: MappedBuffer,
    txcq: MappedBuffer,
    rxbuf: Vec<MappedBuffer>,
    rxcq: MappedBuffer,
    tx_index: u64,
    ack_index: u64,
    /// Skbs in the NIC, oldest first.
    inflight: VecDeque<InFlight>,
    bytes_inflight: u64,
    /// Whether a send event is pending.
    sending: bool,
    armed: bool,
    gen: u64,
}

struct State<'a> {
    cfg: RxStreamConfig,
    tx: TxParams,
    path: &'a dyn DmaPath,
    /// The NIC's DMA through the unit and its port, and the driver's priced work.
    nic: NicDma<'a>,
    /// The NIC's read requests and its posted writes reach the unit as two streams (its
    /// reads run ahead of the wire, its completions follow it).
    reads: DmaStream,
    writes: DmaStream,
    dev: &'a Device,
    flows: Vec<Flow>,
    core_free: Vec<u64>,
    cpu_busy: Vec<f64>,
    /// The NIC's read engine and its write stream, free again at (ns).
    read_free: f64,
    write_free: f64,
    read_busy: f64,
    wire: crate::devices::nic::Link,
    next_pa: u64,
    heap: BinaryHeap<Reverse<(u64, u64, Ev)>>,
    seq: u64,
    out: TxStreamResult,
}

impl State<'_> {
    fn push(&mut self, t: u64, ev: Ev) {
        self.seq += 1;
        self.heap.push(Reverse((t, self.seq, ev)));
    }

    fn in_window(&self, t: u64) -> bool {
        self.nic.in_window(t)
    }

    fn map(
        &mut self,
        len: u64,
        dir: Direction,
        cpu: usize,
        w: &mut WorkRecord,
    ) -> Result<MappedBuffer, RxStreamError> {
        let pa = PhysAddr::new(self.next_pa);
        self.next_pa += len.div_ceil(4096).max(1) * 4096;
        self.path
            .map_single(self.dev, pa, len, dir, cpu, w)
            .map_err(dma_err)
    }

    /// The device moves `len` bytes at `dma`: translated through the unit.
    fn device(
        &mut self,
        dma: u64,
        len: u64,
        access: Access,
        now: u64,
    ) -> Result<Translated, RxStreamError> {
        self.nic.translate(dma, len, access, now)
    }

    /// A DMA through the port on the NIC's read or write stream.
    fn ported(&self, ready: f64, data_ns: f64, t: Translated, access: Access) -> PortTiming {
        let stream = match access {
            Access::Read => &self.reads,
            _ => &self.writes,
        };
        self.nic.timed(ready, data_ns, t, access, stream)
    }

    /// CPU time of the driver's map and unmap work `w`, ns.
    fn work_ns(&mut self, w: &WorkRecord, now: u64) -> f64 {
        self.nic.work_ns(w, now)
    }

    /// Flow `f`'s CPU builds, maps and posts one skb at `now`, if TCP small queues and the
    /// ring let it.
    fn send(&mut self, f: usize, now: u64) -> Result<(), RxStreamError> {
        self.flows[f].sending = false;
        let cpu = f % self.cfg.cpus.max(1);
        let skb = self.tx.tso_max_bytes.max(1);
        let fl = &self.flows[f];
        let room = fl.inflight.len() < self.cfg.tx_ring_entries.max(1)
            && (fl.inflight.is_empty() || fl.bytes_inflight + skb <= self.tx.inflight_bytes);
        if !room {
            // The next completion poll sends again.
            return Ok(());
        }
        let start = now.max(self.core_free[cpu]);
        let mut ns = self.tx.per_skb_ns + skb as f64 / self.tx.copy_bytes_per_ns.max(1e-9);
        let mut w = WorkRecord::new();
        let mut maps = Vec::new();
        if self.tx.linear_bytes > 0 {
            maps.push(self.map(self.tx.linear_bytes, Direction::ToDevice, cpu, &mut w)?);
        }
        let page = self.cfg.page_bytes.max(1);
        let mut left = skb;
        while left > 0 {
            let n = left.min(page);
            maps.push(self.map(n, Direction::ToDevice, cpu, &mut w)?);
            left -= n;
        }
        if self.in_window(start) {
            self.out.maps += maps.len() as u64;
        }
        ns += self.work_ns(&w, start) + self.tx.doorbell_ns;
        let end = start + ns.ceil() as u64;
        self.core_free[cpu] = end;
        if self.in_window(start) {
            self.cpu_busy[cpu] += ns;
        }
        self.nic(f, end, maps, skb)?;
        self.flows[f].sending = true;
        self.push(end, Ev::Send(f));
        Ok(())
    }

    /// The NIC takes the skb rung in at `at`: descriptor and buffer reads, the wire, the
    /// completion and the peer's ACK.
    fn nic(
        &mut self,
        f: usize,
        at: u64,
        maps: Vec<MappedBuffer>,
        bytes: u64,
    ) -> Result<(), RxStreamError> {
        let ring = self.cfg.tx_ring_entries.max(1) as u64;
        let idx = self.flows[f].tx_index;
        self.flows[f].tx_index += 1;
        let wqe_bytes =
            (TX_WQE_HEADER_BYTES + TX_WQE_SEGMENT_BYTES * maps.len() as u64).next_multiple_of(64);
        // The descriptor's 64-byte blocks, from where the ring's producer index is (the
        // read stops at the ring's end; the NIC reads the wrapped part with the next).
        let sq_len = self.flows[f].sq.len();
        let off = (idx * wqe_bytes / 64 % (sq_len / 64).max(1)) * 64;
        let sq = self.flows[f].sq.dma_addr().0 + off;
        let ready = (at as f64).max(self.read_free);
        let t = self.device(sq, wqe_bytes.min(sq_len - off), Access::Read, at)?;
        let wqe = self.ported(ready, 0.0, t, Access::Read).done;
        // The buffers: one read stream at the engine's rate, walks overlapping.
        let mut t = Translated::default();
        let mut moved = 0;
        for m in &maps {
            t.add(self.device(m.dma_addr().0, m.len(), Access::Read, at)?);
            moved += m.len();
        }
        let data_ns = self.cfg.dma_ns_per_4k * moved as f64 / 4096.0;
        let read = self.ported(wqe, data_ns, t, Access::Read);
        self.read_free = read.stream_free;
        if self.in_window(at) {
            self.read_busy += data_ns;
        }
        let sent = self.wire.transmit(SimTime(read.done.ceil() as u64), bytes);
        // The completion (a posted write) and the peer's ACK for the skb.
        let cq = self.flows[f].txcq.dma_addr().0 + (idx % ring) * CQE_BYTES;
        let t = self.device(cq, CQE_BYTES, Access::Write, at)?;
        let cqe = self.ported(self.write_free.max(sent.0 as f64), 0.0, t, Access::Write);
        self.write_free = cqe.stream_free;
        let a = self.flows[f].ack_index;
        self.flows[f].ack_index += 1;
        let buf = self.flows[f].rxbuf[(a / 2 % ACK_BUFFERS.div_ceil(2)) as usize]
            .dma_addr()
            .0
            + (a % 2) * 2048;
        let t = self.device(buf, ACK_BYTES, Access::Write, at)?;
        let data = self.cfg.dma_ns_per_4k * ACK_BYTES as f64 / 4096.0;
        let ack = self.ported(self.write_free, data, t, Access::Write);
        let rxcq = self.flows[f].rxcq.dma_addr().0 + (a % ACK_BUFFERS) * CQE_BYTES;
        let t = self.device(rxcq, CQE_BYTES, Access::Write, at)?;
        let acked = self.ported(ack.done, 0.0, t, Access::Write);
        self.write_free = acked.stream_free;
        let done = cqe.done.ceil() as u64;
        if self.in_window(sent.0) {
            self.out.bytes += bytes;
            self.out.skbs += 1;
        }
        let fl = &mut self.flows[f];
        fl.bytes_inflight += bytes;
        fl.inflight.push_back(InFlight { maps, bytes, done });
        self.completion(f, done);
        Ok(())
    }

    /// Flow `f` has a completion at `done`: arm its interrupt.
    fn completion(&mut self, f: usize, done: u64) {
        let c = self.tx.coalescing;
        let fl = &mut self.flows[f];
        if fl.armed {
            if fl.inflight.len() as u64 == c.frames {
                fl.gen += 1;
                let g = fl.gen;
                self.push(done, Ev::Poll(f, g));
            }
            return;
        }
        fl.armed = true;
        fl.gen += 1;
        let g = fl.gen;
        let at = if c.frames <= 1 {
            done
        } else {
            done + c.usecs * 1000
        };
        self.push(at, Ev::Poll(f, g));
    }

    /// NAPI poll of flow `f`'s send completions at `now`.
    fn poll(&mut self, f: usize, now: u64) -> Result<(), RxStreamError> {
        let cpu = f % self.cfg.cpus.max(1);
        if self.core_free[cpu] > now {
            let g = self.flows[f].gen;
            let at = self.core_free[cpu];
            self.push(at, Ev::Poll(f, g));
            return Ok(());
        }
        let mut ns = self.tx.irq_ns;
        while self.flows[f]
            .inflight
            .front()
            .is_some_and(|s| s.done <= now)
        {
            let Some(s) = self.flows[f].inflight.pop_front() else {
                break;
            };
            self.flows[f].bytes_inflight -= s.bytes;
            let mut w = WorkRecord::new();
            for m in s.maps {
                self.path
                    .unmap_single(m, cpu, now, &mut w)
                    .map_err(|r| dma_err(r.error))?;
            }
            ns += self.tx.completion_ns + self.work_ns(&w, now);
        }
        let end = now + ns.ceil() as u64;
        self.core_free[cpu] = end;
        if self.in_window(now) {
            self.cpu_busy[cpu] += ns;
        }
        let fl = &mut self.flows[f];
        match fl.inflight.front() {
            Some(s) => {
                fl.gen += 1;
                let g = fl.gen;
                let at = s.done.max(end);
                self.push(at, Ev::Poll(f, g));
            }
            None => fl.armed = false,
        }
        if !self.flows[f].sending {
            self.flows[f].sending = true;
            self.push(end, Ev::Send(f));
        }
        Ok(())
    }
}

/// Runs the send test: `path` is what the driver maps through, `dma` how the device's
/// accesses reach memory (both from the lab's IOMMU builder). `cfg` gives the flows, CPUs,
/// rings, pages, the NIC's DMA and the window; `tx` the send side.
pub(crate) fn run_tx_stream(
    cfg: &RxStreamConfig,
    tx: TxParams,
    link: LinkConfig,
    pricing: RxPricing<'_>,
    path: &dyn DmaPath,
    dma: DeviceDma<'_>,
    dev: &Device,
) -> Result<TxStreamResult, RxStreamError> {
    let mut st = State {
        cfg: *cfg,
        tx,
        nic: NicDma::new(dma, pricing, cfg.warmup_ns, cfg.run_ns),
        reads: DmaStream::new(cfg.dma_link),
        writes: DmaStream::new(cfg.dma_link),
        path,
        dev,
        flows: Vec::new(),
        core_free: vec![0; cfg.cpus.max(1)],
        cpu_busy: vec![0.0; cfg.cpus.max(1)],
        read_free: 0.0,
        write_free: 0.0,
        read_busy: 0.0,
        wire: crate::devices::nic::Link::new(link),
        next_pa: 1 << 32,
        heap: BinaryHeap::new(),
        seq: 0,
        out: TxStreamResult::default(),
    };
    // Set-up: each queue's rings (coherent, mapped once) and the ACK receive buffers.
    for f in 0..cfg.flows {
        let cpu = f % cfg.cpus.max(1);
        let mut w = WorkRecord::new();
        let tx_ring = cfg.tx_ring_entries.max(1) as u64;
        let sq = st.map(tx_ring * 64, Direction::Bidirectional, cpu, &mut w)?;
        let txcq = st.map(tx_ring * CQE_BYTES, Direction::Bidirectional, cpu, &mut w)?;
        let rxcq = st.map(
            ACK_BUFFERS * CQE_BYTES,
            Direction::Bidirectional,
            cpu,
            &mut w,
        )?;
        let rxbuf = (0..ACK_BUFFERS.div_ceil(2))
            .map(|_| st.map(4096, Direction::FromDevice, cpu, &mut w))
            .collect::<Result<Vec<_>, _>>()?;
        st.flows.push(Flow {
            sq,
            txcq,
            rxbuf,
            rxcq,
            tx_index: 0,
            ack_index: 0,
            inflight: VecDeque::new(),
            bytes_inflight: 0,
            sending: true,
            armed: false,
            gen: 0,
        });
        st.push(0, Ev::Send(f));
    }
    while let Some(Reverse((t, _, ev))) = st.heap.pop() {
        if t >= cfg.run_ns {
            break;
        }
        match ev {
            Ev::Send(f) => st.send(f, t)?,
            Ev::Poll(f, g) if st.flows[f].gen == g => st.poll(f, t)?,
            Ev::Poll(..) => {}
        }
    }
    let window = (cfg.run_ns - cfg.warmup_ns).max(1) as f64;
    let mut out = st.out;
    out.translation = st.nic.translation;
    out.dma_work = st.nic.dma_work;
    out.throughput_gbps = out.bytes as f64 * 8.0 / window;
    out.dma_busy_pct = (st.read_busy / window * 100.0).min(100.0);
    out.link_busy_pct = (st.wire.busy_ns() / cfg.run_ns.max(1) as f64 * 100.0).min(100.0);
    let used = cfg.cpus.min(cfg.flows).max(1);
    out.cpu_busy_pct = st.cpu_busy.iter().sum::<f64>() / (used as f64 * window) * 100.0;
    Ok(out)
}
