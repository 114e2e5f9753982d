//! An iperf-like receive test on a NIC that DMAs through an x86 IOMMU (VT-d or AMD-Vi) or
//! none: N flows on `cpus` cores, one channel (receive and send queues) per core that aRFS
//! steers the core's flows to, a remote sender filling the wire, the NIC writing every
//! packet into a mapped receive buffer through the IOMMU's IOTLB and paging-structure
//! caches, and the receiving CPUs recycling used buffers, mapping fresh ones and answering
//! with TCP ACKs that the NIC reads through the same IOMMU.
//!
//! The pieces, each a stated model (docs/model/fands-iotlb.md):
//!
//! - **Wire**: the sender paces packets at line rate, `burst_packets` of one flow at a time,
//!   flows in turn. Packets wait in the NIC's receive FIFO (`fifo_bytes`). With pause
//!   frames on (`loss = None`) the sender waits while it is full: lossless, throughput is
//!   what the bottleneck passes. With pause frames off (`loss = Some`), a packet that finds
//!   the FIFO full is dropped, and each flow is a TCP connection
//!   ([`crate::workloads::tcp_flow`]): its window decides what the sender may put on the
//!   wire, out-of-order arrivals are acknowledged at once with a SACK, and the sender finds
//!   and resends what was lost and halves its window, the ACKs reaching it `ack_delay_ns`
//!   after the NIC has sent them.
//! - **DMA engine**: the NIC's writes to memory in order, `dma_ns_per_4k` per 4 KiB moved,
//!   each DMA translated through the unit (the devices module's `DeviceDma`: the misses
//!   and walk reads are the unit's own) and timed by the DMA port (`crate::iommu::port`):
//!   a miss on a frame or completion holds the writes behind it for its walk, as Rubin et
//!   al.'s serial model (SOSP'24 §2.2) has it, unless the NIC sets Relaxed Ordering. Per
//!   received packet the NIC reads its receive descriptor (one 64-byte line of four 16-byte
//!   WQEs every fourth packet, read ahead: its walk takes a walker, its latency is hidden),
//!   writes the frame into the next `stride_bytes` fragment of a receive page and writes a
//!   64-byte completion (CQE); per ACK it reads the send descriptor and the ACK's header
//!   buffer (reads: their walks overlap) and writes a send completion.
//! - **Receive processing**: per channel, completions raise an interrupt after
//!   `coalesce_usecs` or `coalesce_frames`, whichever first. A NAPI poll on the channel's
//!   CPU runs in virtual time, step by step (it pauses whenever another event falls due
//!   before its next step, so each unmap's invalidation meets the NIC's walks when the CPU
//!   issues it): the send completions' buffers, then the completions that have landed, at
//!   most 64 (Linux's NAPI budget); a poll that used its whole budget polls again, one that
//!   took fewer completes and the interrupt is armed again. Per completion: GRO merges
//!   consecutive packets of each flow up to `gro_bytes` (8 skbs per hash bucket); the
//!   used page goes to the channel's page cache (mlx5's: a FIFO of `page_cache_pages`
//!   slots), or is unmapped when the cache is full (strict: a page-selective invalidation
//!   and a wait). At the poll's end the ring is refilled: from the cache's head when the
//!   stack has let go of that page, else with a freshly mapped page; then the application
//!   reads what TCP holds in order, letting go of those pages (out-of-order data holds its
//!   pages until the hole is filled). TCP acknowledges in-order data when the application
//!   reads it, if two or more full segments await an ACK (the unread data keeps the
//!   window's right edge still until then), and out-of-order, duplicate and hole-filling
//!   skbs at once (an ACK is one mapped header buffer, unmapped when its send completion is
//!   processed in the channel's next poll). CPU time is the stack costs plus
//!   the map and unmap work as the profile prices it (hardware waits uncontended).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use iolab_iommu::addr::{Access, PhysAddr};
use iolab_iommu::dma::{Device, Direction};
use iolab_iommu::hw::{DmaPath, MappedBuffer};
use iolab_iommu::work::WorkRecord;

use crate::cost::CpuCostModel;
use crate::devices::nic::LinkConfig;
use crate::devices::{DeviceDma, PortTiming};
use crate::iommu::port::{DeviceLink, DmaStream, Translated};
use crate::workloads::net_dim::{NetDim, Sample, DEFAULT_PROFILE, RX_CQE_PROFILES};
use crate::workloads::nic_dma::{dma_err, per_4k, NicDma};
use crate::workloads::tcp_flow::{Arrival, TcpParams, TcpReceiver, TcpSender};

/// Bytes of one receive or send completion entry (mlx5 CQE).
const CQE_BYTES: u64 = 64;
/// Bytes of one receive descriptor (mlx5 WQE with one data segment).
const RX_WQE_BYTES: u64 = 16;
/// Bytes of one send descriptor (mlx5 WQE: control, Ethernet and data segments).
const TX_WQE_BYTES: u64 = 64;
/// Bytes of a TCP ACK frame the NIC reads (Ethernet 14 + IP 20 + TCP 20 + timestamps 12).
const ACK_BYTES: u64 = 66;
/// Ethernet header bytes the NIC writes ahead of the IP packet.
pub const ETH_HEADER_BYTES: u64 = 14;

/// One receive test's configuration.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RxStreamConfig {
    /// Flows.
    pub flows: usize,
    /// Cores the flows run on: flow `i` on core `i % cpus`, each core one channel (a
    /// receive and a send queue) that aRFS steers its flows to.
    pub cpus: usize,
    /// Receive buffers posted per queue (descriptors of one page each).
    pub ring_pages: usize,
    /// Send descriptors per queue (the send ring the ACKs use).
    pub tx_ring_entries: usize,
    /// Receive buffer page size (the kernel's page size).
    pub page_bytes: u64,
    /// Bytes of page each packet takes (the driver's fragment stride: mlx5 puts two 2 KiB
    /// buffers in a 4 KiB page at MTU 1500); at least `frame_bytes`, at most `page_bytes`.
    /// A page is unmapped (or recycled) once its last fragment's packet is processed.
    pub stride_bytes: u64,
    /// Bytes the NIC writes per packet (the IP MTU plus the Ethernet header), at most
    /// `page_bytes`.
    pub frame_bytes: u64,
    /// Packets of one flow the sender puts on the wire back to back.
    pub burst_packets: u64,
    /// The NIC's receive FIFO, bytes.
    pub fifo_bytes: u64,
    /// How far the NIC's DMA runs ahead at the IOMMU's port.
    pub dma_link: DeviceLink,
    /// DMA engine time per 4 KiB moved, ns (without translation).
    pub dma_ns_per_4k: f64,
    /// Interrupt moderation: completions per interrupt.
    pub coalesce_frames: u64,
    /// Interrupt moderation: longest hold of a completion, ns.
    pub coalesce_ns: u64,
    /// Adaptive moderation (`ethtool -C adaptive-rx on`): each queue's DIM
    /// ([`crate::workloads::net_dim`]) chooses its moderation from the CQE-mode profiles,
    /// starting at (8 us, 128); `coalesce_*` are then not used.
    pub adaptive: bool,
    /// Largest GRO skb, bytes of payload.
    pub gro_bytes: u64,
    /// Slots of each receive queue's page cache (mlx5's `MLX5E_CACHE_SIZE`; one stays
    /// empty): used pages wait there still mapped until the ring takes them back; 0: every
    /// used page is unmapped and replaced.
    pub page_cache_pages: usize,
    /// Virtual run length, ns.
    pub run_ns: u64,
    /// Start of the measured window, ns.
    pub warmup_ns: u64,
    /// Pause frames off: the NIC drops what finds its FIFO full and the flows run TCP's
    /// loss recovery; `None`: pause frames on, the sender waits (lossless).
    pub loss: Option<LossyTransport>,
}

/// The transport when the NIC drops (pause frames off).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LossyTransport {
    /// Each flow's TCP parameters.
    pub tcp: TcpParams,
    /// From the NIC sending an ACK to the sender acting on it, ns (the switch, the
    /// sender's NIC and its receive processing).
    pub ack_delay_ns: u64,
}

/// The network stack's CPU costs on the receiving host, ns.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RxCosts {
    /// One interrupt and NAPI poll start.
    pub irq_ns: f64,
    /// Driver work per received packet.
    pub per_packet_ns: f64,
    /// TCP receive work per GRO skb.
    pub per_skb_ns: f64,
    /// Building and sending one ACK (TCP output, driver, doorbell).
    pub ack_ns: f64,
    /// Copy bandwidth to the user buffer, bytes per ns.
    pub copy_bytes_per_ns: f64,
}

/// What one receive test measured (the window after the warm-up).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RxStreamResult {
    /// Payload delivered, Gb/s.
    pub throughput_gbps: f64,
    /// Frame bytes the NIC wrote into receive buffers.
    pub rx_bytes: u64,
    /// Packets received.
    pub packets: u64,
    /// Packets the NIC dropped: no posted buffer, or (pause frames off) a full FIFO.
    pub drops: u64,
    /// Packets sent again by the senders (pause frames off).
    pub retransmits: u64,
    /// Packets that arrived out of order or twice (each acknowledged at once).
    pub out_of_order: u64,
    /// Packets the senders put on the wire.
    pub sent: u64,
    /// Packets that arrived twice (needless retransmissions; not counted as throughput).
    pub duplicates: u64,
    /// ACKs sent.
    pub acks: u64,
    /// Of those, ACKs sent at once: for an out-of-order, duplicate or hole-filling skb.
    pub immediate_acks: u64,
    /// NAPI polls that began in the measured window.
    pub polls: u64,
    /// Completions those polls took.
    pub polled_packets: u64,
    /// The most completions one poll took (at most the NAPI budget, 64).
    pub max_poll_packets: u64,
    /// Interrupts in the measured window.
    pub interrupts: u64,
    /// The sum of those interrupts' moderation periods, us.
    pub interrupt_usecs: u64,
    /// Ring refills from the page cache (mlx5's `rx_cache_reuse`).
    pub cache_reuse: u64,
    /// Refills that found the cache's head page still held by the stack, so mapped a fresh
    /// page (mlx5's `rx_cache_busy`).
    pub cache_busy: u64,
    /// Refills that found the cache empty (mlx5's `rx_cache_empty`).
    pub cache_empty: u64,
    /// Used pages unmapped because the cache was full (mlx5's `rx_cache_full`).
    pub cache_full: u64,
    /// The device's translations (IOTLB hits and misses, walk reads) over every DMA.
    pub translation: WorkRecord,
    /// Map and unmap work of the driver.
    pub dma_work: WorkRecord,
    /// DMA engine busy share, percent.
    pub dma_busy_pct: f64,
    /// Wire busy share, percent.
    pub link_busy_pct: f64,
    /// Mean busy share of the CPUs running flows, percent.
    pub cpu_busy_pct: f64,
}

impl RxStreamResult {
    /// IOTLB misses per 4 KiB of received data.
    pub fn iotlb_misses_per_4k(&self) -> f64 {
        per_4k(self.translation.iotlb_misses, self.rx_bytes)
    }

    /// Page-table memory reads per 4 KiB of received data.
    pub fn walk_reads_per_4k(&self) -> f64 {
        per_4k(self.translation.walk_reads, self.rx_bytes)
    }
}

/// Why a receive test failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RxStreamError {
    /// A map or unmap was refused, or a device access faulted.
    #[error("{0}")]
    Dma(String),
}

/// How the test prices the driver's map and unmap work.
pub struct RxPricing<'a> {
    /// The profile's CPU costs (counted steps, locks, translations).
    pub cost: &'a CpuCostModel,
    /// The hardware waits of a map or unmap (invalidation queue), ns.
    pub hardware_wait: &'a dyn Fn(&WorkRecord) -> f64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Ev {
    /// The DMA engine takes the next packet off the FIFO.
    Rx,
    /// A channel's interrupt or NAPI repoll (generation).
    Poll(usize, u64),
    /// A channel's paused poll goes on.
    PollResume(usize),
    /// The sender's wire is free (pause frames off).
    Send,
    /// Segment `.1` of flow `.0` has arrived at the NIC (pause frames off).
    Arrive(usize, u64),
    /// An ACK reaches flow `.0`'s sender: cumulative `.1`, SACK of `.2` (pause frames off).
    Ack(usize, u64, Option<(u64, u64)>),
    /// Flow `.0`'s probe timeout (generation).
    Probe(usize, u64),
}

/// The TCP side of the test with pause frames off.
struct Lossy {
    params: LossyTransport,
    senders: Vec<TcpSender>,
    receivers: Vec<TcpReceiver>,
    /// Probe timer generation per flow, and whether one is armed.
    probe: Vec<(u64, bool)>,
    /// Packets waiting in the FIFO: (flow, segment).
    fifo: VecDeque<(usize, u64)>,
    /// The DMA engine has no `Rx` event pending.
    dma_idle: bool,
    /// The sender's wire: the flow whose burst is on it and what is left of that burst.
    send_flow: usize,
    burst_left: u64,
    /// No `Send` event pending: no flow's window allowed a packet.
    wire_idle: bool,
    /// When the wire is next free, ns.
    wire_at: f64,
}

/// A receive page: its mapping and its slot in [`State::held`].
struct RxPage {
    buf: MappedBuffer,
    id: usize,
}

/// A packet the NIC has written and completed, not yet processed.
struct Landed {
    flow: usize,
    /// The page, when this packet filled its last fragment.
    page: Option<RxPage>,
    /// Completion time, ns.
    done: u64,
    /// TCP segment.
    seq: u64,
}

/// One core's channel: its receive and send queues, their NAPI context and the receive
/// queue's page cache; the flows aRFS steers to the core share it.
struct Channel {
    rx_ring: VecDeque<RxPage>,
    /// Fragments already filled in the front page of `rx_ring`.
    front_used: u64,
    done: VecDeque<Landed>,
    rq: MappedBuffer,
    cq: MappedBuffer,
    sq: MappedBuffer,
    txcq: MappedBuffer,
    rx_index: u64,
    tx_index: u64,
    /// ACK buffers whose send completion the next poll processes.
    acks_out: Vec<MappedBuffer>,
    /// Whether an interrupt (or repoll) is pending, and its generation.
    armed: bool,
    gen: u64,
    /// The poll under way, paused while the NIC's events due meanwhile run.
    paused: Option<PollCursor>,
    /// mlx5's page cache: used pages, still mapped, oldest first.
    cache: VecDeque<RxPage>,
    /// The queue's moderation: longest hold of a completion (ns) and completions per
    /// interrupt; DIM's choice when adaptive.
    coalesce_ns: u64,
    coalesce_frames: u64,
    dim: NetDim,
    /// Interrupts, packets and bytes so far (the counters DIM samples).
    events: u64,
    rx_packets: u64,
    rx_bytes: u64,
    /// The pending poll is NAPI's repoll, not an interrupt.
    repoll: bool,
}

/// The receiving side of one flow.
#[derive(Default)]
struct FlowRx {
    /// Full segments received since the last ACK.
    unacked: u64,
    /// Pages holding data the application has not read: (segment, page id).
    held: Vec<(u64, usize)>,
}

/// GRO skbs a NAPI context holds per hash bucket (Linux `MAX_GRO_SKBS`), and its buckets
/// (`GRO_HASH_BUCKETS`); a flow's bucket here is its index modulo the buckets.
const MAX_GRO_SKBS: usize = 8;
const GRO_HASH_BUCKETS: usize = 8;

/// A GRO skb being built: its flow, payload bytes, segments, its last segment, and whether
/// TCP acknowledges it at once (with the SACK of its segments beyond a hole).
struct GroSkb {
    flow: usize,
    bytes: u64,
    segs: u64,
    last_seq: u64,
    urgent: Option<Option<(u64, u64)>>,
}

/// Completions one NAPI poll takes at most (Linux `NAPI_POLL_WEIGHT`, the budget mlx5
/// registers its channels with).
const NAPI_BUDGET: u64 = 64;

/// Where a paused NAPI poll stands.
struct PollCursor {
    /// Whether the poll began in the measured window (its completions are counted).
    counted: bool,
    /// Completions taken so far (at most [`NAPI_BUDGET`]).
    taken: u64,
    /// Send completions' ACK buffers still to unmap.
    acks: Vec<MappedBuffer>,
    /// The GRO skbs held, oldest first.
    gro: Vec<GroSkb>,
    /// Pages taken off the ring, to post again at the poll's end.
    refill: u64,
    /// The completion queue is done with: the poll is at its end (what lands now waits for
    /// the next interrupt).
    ending: bool,
}

struct State<'a> {
    cfg: RxStreamConfig,
    link: LinkConfig,
    costs: RxCosts,
    path: &'a dyn DmaPath,
    /// The NIC's DMA through the unit and its port, and the driver's priced work.
    nic: NicDma<'a>,
    /// How far the NIC's requests run ahead, and where its walks have got to.
    stream: DmaStream,
    dev: &'a Device,
    channels: Vec<Channel>,
    flows: Vec<FlowRx>,
    /// Per receive page (by id): whether the stack still holds it (an skb or the
    /// socket's queues), so the page cache cannot give it back yet.
    held: Vec<bool>,
    /// Ids of pages unmapped, for the next fresh page.
    free_ids: Vec<usize>,
    core_free: Vec<u64>,
    /// A poll is paused on this CPU (it holds the CPU until its end).
    cpu_polling: Vec<bool>,
    cpu_busy: Vec<f64>,
    dma_free: f64,
    dma_busy: f64,
    next_pa: u64,
    heap: BinaryHeap<Reverse<(u64, u64, Ev)>>,
    seq: u64,
    /// Departure times of the packets still counted in the FIFO window.
    departures: VecDeque<u64>,
    fifo_packets: usize,
    last_arrival: f64,
    wire_busy: f64,
    packet: u64,
    out: RxStreamResult,
    /// Pause frames off: the TCP flows, the FIFO and the wire.
    lossy: Option<Lossy>,
}

impl State<'_> {
    fn push(&mut self, t: u64, ev: Ev) {
        self.seq += 1;
        self.heap.push(Reverse((t, self.seq, ev)));
    }

    fn in_window(&self, t: u64) -> bool {
        self.nic.in_window(t)
    }

    fn fresh_pa(&mut self) -> PhysAddr {
        let pa = PhysAddr::new(self.next_pa);
        self.next_pa += self.cfg.page_bytes;
        pa
    }

    fn map(
        &mut self,
        len: u64,
        dir: Direction,
        cpu: usize,
        w: &mut WorkRecord,
    ) -> Result<MappedBuffer, RxStreamError> {
        let pa = self.fresh_pa();
        self.path
            .map_single(self.dev, pa, len, dir, cpu, w)
            .map_err(dma_err)
    }

    fn unmap(
        &mut self,
        buf: MappedBuffer,
        cpu: usize,
        now: u64,
        w: &mut WorkRecord,
    ) -> Result<(), RxStreamError> {
        self.path
            .unmap_single(buf, cpu, now, w)
            .map_err(|r| dma_err(r.error))
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

    /// A DMA through the port whose data is ready at `ready` and takes `data_ns`.
    fn ported(&self, ready: f64, data_ns: f64, t: Translated, access: Access) -> PortTiming {
        self.nic.timed(ready, data_ns, t, access, &self.stream)
    }

    /// CPU time of the driver's map and unmap work `w`, ns.
    fn work_ns(&mut self, w: &WorkRecord, now: u64) -> f64 {
        self.nic.work_ns(w, now)
    }

    fn flow_of(&self, packet: u64) -> usize {
        ((packet / self.cfg.burst_packets.max(1)) % self.cfg.flows as u64) as usize
    }

    /// The channel (and core) flow `f` is steered to.
    fn channel_of(&self, f: usize) -> usize {
        f % self.channels.len().max(1)
    }

    /// A freshly mapped receive page, on `cpu`.
    fn fresh_page(&mut self, cpu: usize, w: &mut WorkRecord) -> Result<RxPage, RxStreamError> {
        let buf = self.map(self.cfg.page_bytes, Direction::FromDevice, cpu, w)?;
        let id = match self.free_ids.pop() {
            Some(id) => id,
            None => {
                self.held.push(false);
                self.held.len() - 1
            }
        };
        self.held[id] = false;
        Ok(RxPage { buf, id })
    }

    /// The DMA engine takes packet `self.packet` at `now`.
    fn rx(&mut self, now: u64) -> Result<(), RxStreamError> {
        let (f, seq) = match self.lossy.as_mut() {
            Some(l) => match l.fifo.pop_front() {
                Some(p) => p,
                None => {
                    l.dma_idle = true;
                    return Ok(());
                }
            },
            None => (self.flow_of(self.packet), 0),
        };
        let c = self.channel_of(f);
        let frame = self.cfg.frame_bytes;
        let mut ns = 0.0;
        let start = self.dma_free.max(now as f64);
        let per_page = (self.cfg.page_bytes / self.cfg.stride_bytes.max(1)).max(1);
        let slot = self.channels[c].rx_ring.front().map(|p| {
            let used = self.channels[c].front_used;
            (
                p.buf.dma_addr().0 + used * self.cfg.stride_bytes,
                used + 1 == per_page,
            )
        });
        let delivered = match slot {
            None => {
                if self.in_window(now) {
                    self.out.drops += 1;
                }
                false
            }
            Some((buf_at, last_fragment)) => {
                let ch = &mut self.channels[c];
                let page = if last_fragment {
                    ch.front_used = 0;
                    ch.rx_ring.pop_front()
                } else {
                    ch.front_used += 1;
                    None
                };
                let idx = ch.rx_index;
                ch.rx_index += 1;
                let ring = self.cfg.ring_pages as u64;
                // The receive descriptors are read ahead (a 64-byte line of four WQEs every
                // fourth packet): the read's walk takes a walker, its latency is hidden.
                if idx % 4 == 0 {
                    let at = self.channels[c].rq.dma_addr().0 + (idx % ring) * RX_WQE_BYTES;
                    let t = self.device(at, 64.min(RX_WQE_BYTES * 4), Access::Read, now)?;
                    self.ported(start, 0.0, t, Access::Read);
                }
                // The frame and its completion are posted writes, in order.
                let t = self.device(buf_at, frame, Access::Write, now)?;
                let data = self.cfg.dma_ns_per_4k * frame as f64 / 4096.0;
                let framed = self.ported(start, data, t, Access::Write);
                // The completion follows its frame; with Relaxed Ordering the next frames
                // may pass a completion still waiting.
                let at = self.channels[c].cq.dma_addr().0 + (idx % ring) * CQE_BYTES;
                let t = self.device(at, CQE_BYTES, Access::Write, now)?;
                let cqe = self.ported(framed.done, 0.0, t, Access::Write);
                ns = if self.cfg.dma_link.relaxed_ordering {
                    framed.stream_free - start
                } else {
                    cqe.stream_free - start
                };
                let done = cqe.done.ceil() as u64;
                self.channels[c].done.push_back(Landed {
                    flow: f,
                    page,
                    done,
                    seq,
                });
                self.completion(c, done);
                true
            }
        };
        self.dma_free = start + ns;
        if self.in_window(now) {
            self.dma_busy += ns;
            if delivered {
                self.out.packets += 1;
                self.out.rx_bytes += frame;
            }
        }
        if let Some(l) = self.lossy.as_mut() {
            // Pause frames off: the sender does not wait for the FIFO; the engine takes
            // the next packet waiting, or idles until one arrives.
            if l.fifo.is_empty() {
                l.dma_idle = true;
            } else {
                let at = self.dma_free.ceil() as u64;
                self.push(at, Ev::Rx);
            }
            return Ok(());
        }
        // The next packet: on the wire after this one, and into the FIFO once a packet
        // has left it when it is full.
        let end = self.dma_free.ceil() as u64;
        self.departures.push_back(end);
        let wire = self.link.wire_ns(self.link.mss);
        let mut arrival = self.last_arrival + wire;
        if self.departures.len() >= self.fifo_packets {
            let freed = self.departures.pop_front().unwrap_or(0) as f64;
            arrival = arrival.max(freed);
        }
        if self.in_window(arrival as u64) {
            self.wire_busy += wire;
        }
        self.last_arrival = arrival;
        self.packet += 1;
        let next = arrival.max(self.dma_free).ceil() as u64;
        self.push(next, Ev::Rx);
        Ok(())
    }

    /// NAPI of channel `c` completed with `queued` completions in flight, the first
    /// landing at `first`: the interrupt fires after the moderation time from it, or when
    /// the `coalesce_frames`-th lands.
    fn rearm(&mut self, c: usize, first: u64, queued: u64) {
        let ch = &mut self.channels[c];
        ch.armed = true;
        ch.gen += 1;
        let g = ch.gen;
        let frames = ch.coalesce_frames.max(1);
        let at = if frames <= 1 {
            first
        } else if queued >= frames {
            ch.done
                .get(frames as usize - 1)
                .map_or(first, |d| d.done)
                .min(first + ch.coalesce_ns)
        } else {
            first + ch.coalesce_ns
        };
        self.push(at, Ev::Poll(c, g));
    }

    /// Channel `c` has a completion at `done`: arm its interrupt.
    fn completion(&mut self, c: usize, done: u64) {
        let ch = &mut self.channels[c];
        if ch.armed {
            // Enough frames: the moderation fires now.
            if ch.done.len() as u64 == ch.coalesce_frames {
                ch.gen += 1;
                let g = ch.gen;
                self.push(done, Ev::Poll(c, g));
            }
            return;
        }
        ch.armed = true;
        ch.gen += 1;
        let g = ch.gen;
        let at = if ch.coalesce_frames <= 1 {
            done
        } else {
            done + ch.coalesce_ns
        };
        self.push(at, Ev::Poll(c, g));
    }

    /// NAPI poll of channel `c` (on CPU `c`) at `now`.
    fn poll(&mut self, c: usize, now: u64) -> Result<(), RxStreamError> {
        if self.channels[c].paused.is_some() {
            // This channel's poll is under way; it polls again at its end if work is left.
            return Ok(());
        }
        if self.core_free[c] > now || self.cpu_polling[c] {
            let g = self.channels[c].gen;
            let at = self.core_free[c];
            self.push(at, Ev::Poll(c, g));
            return Ok(());
        }
        let ch = &mut self.channels[c];
        let interrupt = !std::mem::take(&mut ch.repoll);
        ch.events += u64::from(interrupt);
        let usecs = ch.coalesce_ns / 1000;
        let mut acks = std::mem::take(&mut ch.acks_out);
        // Taken from the back: oldest first.
        acks.reverse();
        if self.in_window(now) {
            self.out.polls += 1;
            if interrupt {
                self.out.interrupts += 1;
                self.out.interrupt_usecs += usecs;
            }
        }
        let cursor = PollCursor {
            counted: self.in_window(now),
            taken: 0,
            acks,
            gro: Vec::new(),
            refill: 0,
            ending: false,
        };
        self.poll_steps(c, now, self.costs.irq_ns, cursor)
    }

    /// Channel `c`'s paused poll goes on at `now`.
    fn poll_resume(&mut self, c: usize, now: u64) -> Result<(), RxStreamError> {
        let Some(cursor) = self.channels[c].paused.take() else {
            return Ok(());
        };
        self.poll_steps(c, now, 0.0, cursor)
    }

    /// Whether an event other than this poll's is due before `t`: the poll then pauses
    /// at `t` so that what the NIC does meanwhile meets the unit as the CPU has left it
    /// by then (each unmap's invalidation lands when the CPU issues it).
    fn event_before(&self, t: u64) -> bool {
        self.heap.peek().is_some_and(|Reverse((at, _, _))| *at < t)
    }

    /// Whether another event falls due before the poll's next step, `ns` into its slice
    /// from `now` (none in a slice's first instant).
    fn due_first(&self, now: u64, ns: f64) -> bool {
        ns > 0.0 && self.event_before(now + ns.ceil() as u64)
    }

    /// Channel `c`'s poll pauses `ns` into its slice from `now`, holding its CPU, and goes on
    /// then.
    fn pause(&mut self, c: usize, now: u64, ns: f64, cur: PollCursor) {
        let t = now + ns.ceil() as u64;
        self.channels[c].paused = Some(cur);
        self.cpu_polling[c] = true;
        self.core_free[c] = t;
        self.count_cpu(c, now, ns);
        self.push(t, Ev::PollResume(c));
    }

    /// Channel `c`'s poll steps from `now` on its CPU, `ns` of CPU time already spent in
    /// this slice: the send completions' buffers, then each completed packet, one at a
    /// time in virtual time; the poll pauses when another event falls due before its next
    /// step.
    fn poll_steps(
        &mut self,
        c: usize,
        now: u64,
        mut ns: f64,
        mut cur: PollCursor,
    ) -> Result<(), RxStreamError> {
        let cpu = c;
        while !cur.ending {
            let t = now + ns.ceil() as u64;
            let ack_left = !cur.acks.is_empty();
            let packet_left = cur.taken < NAPI_BUDGET
                && self.channels[c].done.front().is_some_and(|l| l.done <= t);
            if !ack_left && !packet_left {
                break;
            }
            if self.due_first(now, ns) {
                self.pause(c, now, ns, cur);
                return Ok(());
            }
            // Send completions: the ACK buffers go.
            if let Some(b) = cur.acks.pop() {
                let mut w = WorkRecord::new();
                self.unmap(b, cpu, t, &mut w)?;
                ns += self.work_ns(&w, t);
                continue;
            }
            let Some(Landed {
                flow, page, seq, ..
            }) = self.channels[c].done.pop_front()
            else {
                break;
            };
            cur.taken += 1;
            let ch = &mut self.channels[c];
            ch.rx_packets += 1;
            ch.rx_bytes += self.cfg.frame_bytes;
            let arrival = self.lossy.as_mut().map(|l| l.receivers[flow].receive(seq));
            let payload = self.link.mss;
            ns +=
                self.costs.per_packet_ns + payload as f64 / self.costs.copy_bytes_per_ns.max(1e-9);
            // The page goes once its last fragment's packet is processed
            // (`mlx5e_free_rx_wqe`): into the page cache, still mapped and still held by
            // the skb, or unmapped when the cache is full.
            if let Some(page) = page {
                cur.refill += 1;
                self.held[page.id] = true;
                let counted = self.in_window(t);
                let ch = &mut self.channels[c];
                if ch.cache.len() + 1 < self.cfg.page_cache_pages {
                    self.flows[flow].held.push((seq, page.id));
                    ch.cache.push_back(page);
                } else {
                    if counted {
                        self.out.cache_full += 1;
                    }
                    let mut w = WorkRecord::new();
                    self.unmap(page.buf, cpu, t, &mut w)?;
                    self.free_ids.push(page.id);
                    ns += self.work_ns(&w, t);
                }
            }
            // Out of order, a duplicate or a filled hole: TCP acknowledges the skb at once,
            // with a SACK naming it when it lies beyond a hole.
            let urgent = arrival.filter(|&a| a != Arrival::InOrder).map(|a| {
                if self.in_window(t) {
                    self.out.out_of_order += u64::from(a != Arrival::FilledHole);
                    self.out.duplicates += u64::from(a == Arrival::Duplicate);
                }
                (a == Arrival::OutOfOrder).then_some(seq)
            });
            // GRO merges segments of a flow that follow each other in sequence, up to its
            // size: a run of segments beyond a hole is one skb and one ACK. A segment that
            // does not continue its flow's skb, or that TCP treats otherwise, flushes it
            // first; a flow with no skb held when its bucket holds 8 flushes the bucket's oldest.
            let held = cur.gro.iter().position(|g| g.flow == flow);
            let flush = match held {
                Some(i) => {
                    let g = &cur.gro[i];
                    let continues = self.lossy.is_none() || seq == g.last_seq + 1;
                    (g.bytes + payload > self.cfg.gro_bytes
                        || !continues
                        || urgent.is_some() != g.urgent.is_some())
                    .then_some(i)
                }
                None => {
                    let bucket = |g: &GroSkb| g.flow % GRO_HASH_BUCKETS;
                    let mine = flow % GRO_HASH_BUCKETS;
                    let held = cur.gro.iter().filter(|g| bucket(g) == mine).count();
                    (held == MAX_GRO_SKBS)
                        .then(|| cur.gro.iter().position(|g| bucket(g) == mine))
                        .flatten()
                }
            };
            if let Some(i) = flush {
                let skb = cur.gro.remove(i);
                ns += self.flush_skb(c, t, skb)?;
            }
            let i = match cur.gro.iter().position(|g| g.flow == flow) {
                Some(i) => i,
                None => {
                    cur.gro.push(GroSkb {
                        flow,
                        bytes: 0,
                        segs: 0,
                        last_seq: seq,
                        urgent: None,
                    });
                    cur.gro.len() - 1
                }
            };
            let g = &mut cur.gro[i];
            g.bytes += payload;
            g.segs += 1;
            g.last_seq = seq;
            if let Some(sack) = urgent {
                // The SACK block: from the skb's first segment beyond the hole to this one.
                let block = sack.map(|s| (g.urgent.flatten().map_or(s, |(a, _)| a), s));
                g.urgent = Some(block.or(g.urgent.flatten()));
            }
        }
        cur.ending = true;
        // The poll's end, each part when the CPU reaches it (a part already done is a no-op
        // when a paused poll comes back here): GRO's flush, the ring's refill, the
        // application's reads and their ACKs.
        if self.due_first(now, ns) {
            self.pause(c, now, ns, cur);
            return Ok(());
        }
        for skb in std::mem::take(&mut cur.gro) {
            let t = now + ns.ceil() as u64;
            ns += self.flush_skb(c, t, skb)?;
        }
        if self.due_first(now, ns) {
            self.pause(c, now, ns, cur);
            return Ok(());
        }
        // The ring is posted again (`mlx5e_post_rx_wqes`): from the page cache's head
        // when the stack has let go of it, else with a freshly mapped page.
        if cur.refill > 0 {
            let t = now + ns.ceil() as u64;
            let counted = self.in_window(t);
            let mut w = WorkRecord::new();
            for _ in 0..cur.refill {
                let ch = &mut self.channels[c];
                let head = ch.cache.front().map(|p| self.held[p.id]);
                let page = match head {
                    Some(false) => ch.cache.pop_front(),
                    _ => None,
                };
                let page = match page {
                    Some(p) => {
                        self.out.cache_reuse += u64::from(counted);
                        p
                    }
                    None => {
                        if counted {
                            self.out.cache_busy += u64::from(head.is_some());
                            self.out.cache_empty += u64::from(head.is_none());
                        }
                        self.fresh_page(cpu, &mut w)?
                    }
                };
                self.channels[c].rx_ring.push_back(page);
            }
            ns += self.work_ns(&w, t);
            cur.refill = 0;
        }
        // After the softirq the application reads what TCP holds in order: those pages
        // are let go of; out-of-order data keeps its pages until the hole is filled.
        let step = self.channels.len();
        for f in (c..self.cfg.flows).step_by(step.max(1)) {
            let upto = self
                .lossy
                .as_ref()
                .map_or(u64::MAX, |l| l.receivers[f].rcv_nxt());
            let held = &mut self.held;
            self.flows[f].held.retain(|&(seq, id)| {
                let read = seq < upto;
                if read {
                    held[id] = false;
                }
                !read
            });
            // The read lets the window's right edge move: TCP acknowledges what it holds
            // when two or more full segments await an ACK (`tcp_cleanup_rbuf`).
            if self.flows[f].unacked >= 2 {
                if self.due_first(now, ns) {
                    self.pause(c, now, ns, cur);
                    return Ok(());
                }
                let t = now + ns.ceil() as u64;
                ns += self.send_ack(c, f, t, Ack::Delayed)?;
            }
        }
        let end = now + ns.ceil() as u64;
        self.core_free[cpu] = end;
        self.cpu_polling[cpu] = false;
        if cur.counted {
            self.out.polled_packets += cur.taken;
            self.out.max_poll_packets = self.out.max_poll_packets.max(cur.taken);
        }
        self.count_cpu(cpu, now, ns);
        let ch = &mut self.channels[c];
        ch.gen += 1;
        if cur.taken == NAPI_BUDGET {
            // The whole budget went: NAPI polls again at once.
            let g = ch.gen;
            ch.repoll = true;
            self.push(end, Ev::Poll(c, g));
        } else {
            // NAPI completes and the interrupt is armed again: completions still in flight
            // raise it as moderation allows, with the moderation DIM has chosen.
            if self.cfg.adaptive {
                let sample = Sample {
                    now_ns: end,
                    events: ch.events,
                    packets: ch.rx_packets,
                    bytes: ch.rx_bytes,
                };
                if let Some(m) = ch.dim.on_poll_complete(sample) {
                    ch.coalesce_ns = m.usecs * 1000;
                    ch.coalesce_frames = m.frames;
                }
            }
            ch.armed = false;
            let first = ch.done.front().map(|d| d.done);
            let queued = ch.done.len() as u64;
            if let Some(first) = first {
                self.rearm(c, first, queued);
            }
        }
        Ok(())
    }

    /// Counts `ns` of CPU `cpu`'s time from `now`: the part inside the measured window (a
    /// poll may straddle its ends).
    fn count_cpu(&mut self, cpu: usize, now: u64, ns: f64) {
        let end = now + ns.ceil() as u64;
        let (from, to) = (self.cfg.warmup_ns, self.cfg.run_ns);
        let inside = (end.min(to) as f64 - now.max(from) as f64).clamp(0.0, ns);
        if inside > 0.0 {
            self.cpu_busy[cpu] += inside;
        }
    }

    /// GRO hands `skb` to TCP at `now` on channel `c`: its cost.
    fn flush_skb(&mut self, c: usize, now: u64, skb: GroSkb) -> Result<f64, RxStreamError> {
        let ack = match skb.urgent {
            Some(sack) => Ack::Now(sack),
            None => Ack::Delayed,
        };
        self.skb(c, skb.flow, skb.segs, now, ack)
    }

    /// One GRO skb of `segs` segments handed to TCP on flow `f` of channel `c`: its cost,
    /// and an ACK when `ack` asks for one now. An in-order skb is acknowledged when the
    /// application reads (Linux's `__tcp_ack_snd_check` sends the every-second-segment ACK
    /// only if the window's right edge advances, and with unread data in the socket's queue
    /// a window at its clamp does not).
    fn skb(
        &mut self,
        c: usize,
        f: usize,
        segs: u64,
        now: u64,
        ack: Ack,
    ) -> Result<f64, RxStreamError> {
        let mut ns = self.costs.per_skb_ns;
        self.flows[f].unacked += segs;
        // In order: the unread data shrinks the window, so its right edge does not move and
        // the ACK waits for the application's read (see `poll_steps`).
        if ack == Ack::Delayed {
            return Ok(ns);
        }
        ns += self.send_ack(c, f, now, ack)?;
        Ok(ns)
    }

    /// TCP sends an ACK on flow `f` of channel `c` at `now`: its CPU cost.
    fn send_ack(&mut self, c: usize, f: usize, now: u64, ack: Ack) -> Result<f64, RxStreamError> {
        let cpu = c;
        self.flows[f].unacked = 0;
        let mut ns = self.costs.ack_ns;
        let mut w = WorkRecord::new();
        let buf = self.map(ACK_BYTES, Direction::ToDevice, cpu, &mut w)?;
        ns += self.work_ns(&w, now);
        // The NIC reads the send descriptor and the frame and writes the completion.
        let ch = &mut self.channels[c];
        let idx = ch.tx_index;
        ch.tx_index += 1;
        let ring = self.cfg.tx_ring_entries as u64;
        let sq = ch.sq.dma_addr().0 + (idx % ring) * TX_WQE_BYTES;
        let cq = ch.txcq.dma_addr().0 + (idx % ring) * CQE_BYTES;
        // The two reads overlap on the walkers; the completion is a posted write in the
        // device's write stream.
        let at = now as f64;
        let t = self.device(sq, TX_WQE_BYTES, Access::Read, now)?;
        let wqe = self.ported(at, 0.0, t, Access::Read).done;
        let t = self.device(buf.dma_addr().0, ACK_BYTES, Access::Read, now)?;
        let data = self.cfg.dma_ns_per_4k * ACK_BYTES as f64 / 4096.0;
        let frame = self.ported(at, 0.0, t, Access::Read).done.max(wqe);
        let t = self.device(cq, CQE_BYTES, Access::Write, now)?;
        let start = self.dma_free.max(frame);
        let end = self.ported(start, data, t, Access::Write).stream_free;
        let dns = end - start;
        self.dma_free = end;
        if self.in_window(now) {
            self.dma_busy += dns;
            self.out.acks += 1;
            self.out.immediate_acks += u64::from(ack != Ack::Delayed);
        }
        self.channels[c].acks_out.push(buf);
        if let Some(l) = self.lossy.as_ref() {
            let cum = l.receivers[f].rcv_nxt();
            let sack = match ack {
                Ack::Now(sack) => sack,
                Ack::Delayed => None,
            };
            let at = end.ceil() as u64 + l.params.ack_delay_ns;
            self.push(at, Ev::Ack(f, cum, sack));
        }
        Ok(ns)
    }

    /// The sender's wire is free at `now` (pause frames off): the next packet of the
    /// flow whose burst is on the wire, or of the next flow whose window allows one.
    fn send(&mut self, now: u64) {
        let wire = self.link.wire_ns(self.link.mss);
        let flows = self.cfg.flows;
        let burst = self.cfg.burst_packets.max(1);
        let in_window = self.in_window(now);
        let Some(l) = self.lossy.as_mut() else {
            return;
        };
        let mut f = l.send_flow;
        if l.burst_left == 0 || !l.senders[f].can_send() {
            let Some(next) = (1..=flows)
                .map(|k| (l.send_flow + k) % flows)
                .find(|&j| l.senders[j].can_send())
            else {
                l.wire_idle = true;
                return;
            };
            f = next;
            l.send_flow = f;
            l.burst_left = burst;
        }
        l.burst_left -= 1;
        let (seq, resent) = l.senders[f].send(now);
        let t = l.wire_at.max(now as f64) + wire;
        l.wire_at = t;
        if in_window {
            self.wire_busy += wire;
            self.out.sent += 1;
            self.out.retransmits += u64::from(resent);
        }
        let probe = (!l.probe[f].1).then(|| {
            l.probe[f].1 = true;
            (l.probe[f].0, l.senders[f].probe_timeout_ns())
        });
        let at = t.ceil() as u64;
        self.push(at, Ev::Arrive(f, seq));
        self.push(at, Ev::Send);
        if let Some((gen, pto)) = probe {
            self.push(now + pto, Ev::Probe(f, gen));
        }
    }

    /// Segment `seq` of flow `f` reaches the NIC at `now`: into the FIFO, or dropped
    /// when it is full (pause frames off).
    fn arrive(&mut self, f: usize, seq: u64, now: u64) {
        let in_service = usize::from(self.dma_free > now as f64);
        let in_window = self.in_window(now);
        let fifo_packets = self.fifo_packets;
        let Some(l) = self.lossy.as_mut() else {
            return;
        };
        if l.fifo.len() + in_service >= fifo_packets {
            if in_window {
                self.out.drops += 1;
            }
            return;
        }
        l.fifo.push_back((f, seq));
        if l.dma_idle {
            l.dma_idle = false;
            let at = self.dma_free.max(now as f64).ceil() as u64;
            self.push(at, Ev::Rx);
        }
    }

    /// Flow `f`'s sender hears an ACK (`Some((cum, sack))`) or its probe timeout fires
    /// (`None`) at `now`; its probe timer restarts and an idle wire wakes.
    fn sender_event(&mut self, f: usize, ack: Option<(u64, Option<(u64, u64)>)>, now: u64) {
        let Some(l) = self.lossy.as_mut() else {
            return;
        };
        match ack {
            Some((cum, sack)) => l.senders[f].on_ack(cum, sack, now),
            None => l.senders[f].probe(),
        }
        l.probe[f].0 += 1;
        l.probe[f].1 = l.senders[f].outstanding();
        let probe = l.probe[f]
            .1
            .then(|| (l.probe[f].0, l.senders[f].probe_timeout_ns()));
        let wake = l.wire_idle && l.senders.iter().any(TcpSender::can_send);
        let wire_at = l.wire_at;
        if wake {
            l.wire_idle = false;
        }
        if let Some((gen, pto)) = probe {
            self.push(now + pto, Ev::Probe(f, gen));
        }
        if wake {
            self.push(now.max(wire_at.ceil() as u64), Ev::Send);
        }
    }
}

/// Whether a segment handed to TCP calls for an ACK now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ack {
    /// In order: when the application reads, if two or more full segments await one.
    Delayed,
    /// At once, with a SACK block (first, last segment) when the skb lies beyond a hole.
    Now(Option<(u64, u64)>),
}

/// Runs the receive test: `path` is what the driver maps through, `dma` how the device's
/// accesses reach memory (both from the lab's IOMMU builder).
pub(crate) fn run_rx_stream(
    cfg: &RxStreamConfig,
    link: LinkConfig,
    costs: RxCosts,
    pricing: RxPricing<'_>,
    path: &dyn DmaPath,
    dma: DeviceDma<'_>,
    dev: &Device,
) -> Result<RxStreamResult, RxStreamError> {
    let frame = cfg.frame_bytes;
    let mut st = State {
        cfg: *cfg,
        link,
        costs,
        nic: NicDma::new(dma, pricing, cfg.warmup_ns, cfg.run_ns),
        stream: DmaStream::new(cfg.dma_link),
        path,
        dev,
        channels: Vec::new(),
        flows: (0..cfg.flows).map(|_| FlowRx::default()).collect(),
        held: Vec::new(),
        free_ids: Vec::new(),
        core_free: vec![0; cfg.cpus.max(1)],
        cpu_polling: vec![false; cfg.cpus.max(1)],
        cpu_busy: vec![0.0; cfg.cpus.max(1)],
        dma_free: 0.0,
        dma_busy: 0.0,
        next_pa: 1 << 32,
        heap: BinaryHeap::new(),
        seq: 0,
        departures: VecDeque::new(),
        fifo_packets: (cfg.fifo_bytes / frame.max(1)).max(1) as usize,
        last_arrival: 0.0,
        wire_busy: 0.0,
        packet: 0,
        out: RxStreamResult::default(),
        lossy: cfg.loss.map(|params| Lossy {
            params,
            senders: vec![TcpSender::new(params.tcp); cfg.flows],
            receivers: vec![TcpReceiver::default(); cfg.flows],
            probe: vec![(0, false); cfg.flows],
            fifo: VecDeque::new(),
            dma_idle: true,
            send_flow: cfg.flows.saturating_sub(1),
            burst_left: 0,
            wire_idle: false,
            wire_at: 0.0,
        }),
    };
    // Set-up: each channel's rings (coherent, mapped once) and posted buffers, mapped on
    // the channel's CPU.
    // Each queue's moderation to begin with: DIM's starting profile, or the fixed one.
    let start = if cfg.adaptive {
        let m = RX_CQE_PROFILES[DEFAULT_PROFILE];
        (m.usecs * 1000, m.frames)
    } else {
        (cfg.coalesce_ns, cfg.coalesce_frames)
    };
    for cpu in 0..cfg.cpus.min(cfg.flows).max(1) {
        let mut w = WorkRecord::new();
        let ring = cfg.ring_pages as u64;
        let tx = cfg.tx_ring_entries as u64;
        let rq = st.map(ring * RX_WQE_BYTES, Direction::Bidirectional, cpu, &mut w)?;
        let cq = st.map(ring * CQE_BYTES, Direction::Bidirectional, cpu, &mut w)?;
        let sq = st.map(tx * TX_WQE_BYTES, Direction::Bidirectional, cpu, &mut w)?;
        let txcq = st.map(tx * CQE_BYTES, Direction::Bidirectional, cpu, &mut w)?;
        st.next_pa += 64 << 10;
        let mut rx_ring = VecDeque::with_capacity(cfg.ring_pages);
        for _ in 0..cfg.ring_pages {
            rx_ring.push_back(st.fresh_page(cpu, &mut w)?);
        }
        st.channels.push(Channel {
            rx_ring,
            front_used: 0,
            done: VecDeque::new(),
            rq,
            cq,
            sq,
            txcq,
            rx_index: 0,
            tx_index: 0,
            acks_out: Vec::new(),
            armed: false,
            gen: 0,
            paused: None,
            cache: VecDeque::with_capacity(cfg.page_cache_pages),
            coalesce_ns: start.0,
            coalesce_frames: start.1,
            dim: NetDim::new(),
            events: 0,
            rx_packets: 0,
            rx_bytes: 0,
            repoll: false,
        });
    }
    st.push(0, if st.lossy.is_some() { Ev::Send } else { Ev::Rx });
    while let Some(Reverse((t, _, ev))) = st.heap.pop() {
        if t >= cfg.run_ns {
            break;
        }
        match ev {
            Ev::Rx => st.rx(t)?,
            Ev::Poll(c, g) if st.channels[c].gen == g => st.poll(c, t)?,
            Ev::Poll(..) => {}
            Ev::PollResume(c) => st.poll_resume(c, t)?,
            Ev::Send => st.send(t),
            Ev::Arrive(f, seq) => st.arrive(f, seq, t),
            Ev::Ack(f, cum, sack) => st.sender_event(f, Some((cum, sack)), t),
            Ev::Probe(f, g) if st.lossy.as_ref().is_some_and(|l| l.probe[f].0 == g) => {
                st.sender_event(f, None, t)
            }
            Ev::Probe(..) => {}
        }
    }
    let window = (cfg.run_ns - cfg.warmup_ns).max(1) as f64;
    let mut out = st.out;
    out.translation = st.nic.translation;
    out.dma_work = st.nic.dma_work;
    out.throughput_gbps =
        out.packets.saturating_sub(out.duplicates) as f64 * link.mss as f64 * 8.0 / window;
    out.dma_busy_pct = (st.dma_busy / window * 100.0).min(100.0);
    out.link_busy_pct = (st.wire_busy / window * 100.0).min(100.0);
    let used = cfg.cpus.min(cfg.flows).max(1);
    out.cpu_busy_pct = st.cpu_busy.iter().sum::<f64>() / (used as f64 * window) * 100.0;
    Ok(out)
}
