//! The soak of SEEDS.md #4: a long many-thread TCP write stream through the pSeries DMA
//! path (the `pseries-ddw` scenario's partition, NIC, stack costs and DDW dynamic window),
//! in virtual time, with invariant checks at intervals and the throughput of every interval.
//!
//! The soak runs the real simulation for the whole requested virtual time: every message is
//! copied, every skb's head and page fragments are mapped through [`TceDma`] (pool locks,
//! TCE hypercalls), read by the device through the TCE table, sent on the wire, completed
//! under interrupt moderation and unmapped. Nothing is extrapolated.
//!
//! At every interval boundary a checker stops the world at message boundaries (each writer
//! parks before its next message; skbs already posted stay in flight, mapped) and checks:
//!
//! - **no leaked IOVA or table entry**: the IOMMU's live mappings and the window
//!   allocator's live blocks both equal the reference map's entries (the reference is the
//!   soak's own record of every mapping it holds);
//! - **page tables consistent with the reference**: every reference mapping translates,
//!   through a walk of the TCE table, to exactly its physical buffer;
//! - **no DMA lost or duplicated**: every mapping unmapped so far was read by the device
//!   exactly once, every skb completed exactly once and in order on its queue, and the
//!   payload written equals the payload completed plus the payload in flight.
//!
//! At the end the writers drain their queues, and the IOMMU must hold no mapping, the
//! allocator no block. Throughput stability is the coefficient of variation of the
//! per-interval throughput (the first interval, which includes the ramp, is left out).

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, VecDeque};
use std::rc::Rc;

use iolab_iommu::addr::{Access, DmaAddr};
use iolab_iommu::dma::{Direction, PhysRange};
use iolab_iommu::hw::{DmaPath, MappedBuffer};
use iolab_iommu::iova::IovaAllocator;
use iolab_iommu::work::WorkRecord;

use crate::devices::nic::{spend, Link, NicError, TceDma, TxEntry, TxRing};
use crate::engine::{Channel, Ctx, Sim, SimConfig, SimDuration, SimError, SimTime};
use crate::experiments::pseries_ddw::{self, SoakParts};
use crate::experiments::ExperimentError;
use crate::workloads::netperf::{StackCosts, StreamConfig};

/// Longest soak accepted, virtual seconds (a week).
pub const MAX_SOAK_SECONDS: u64 = 7 * 24 * 3600;
/// Most intervals (invariant checks) one soak may record.
pub const MAX_INTERVALS: u64 = 1_000_000;
/// Shortest interval between checks, virtual microseconds.
pub const MIN_INTERVAL_US: u64 = 100;

/// What to soak.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SoakConfig {
    /// Virtual time to run, nanoseconds.
    pub duration_ns: u64,
    /// Virtual time between invariant checks, nanoseconds.
    pub interval_ns: u64,
    /// Writer threads (`None`: the scenario's many-thread count, 64 in the bundled one).
    pub threads: Option<usize>,
    /// Use the DDW as a dynamic window (`true`, the change under test) or the default
    /// window only.
    pub ddw: bool,
    /// Seed of the run.
    pub seed: u64,
}

/// One interval: its throughput and what its checkpoint saw.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct IntervalReport {
    /// Virtual time of the checkpoint, nanoseconds.
    pub at_ns: u64,
    /// Payload the wire finished within the interval, Gb/s.
    pub gbps: f64,
    /// Live mappings at the checkpoint (skbs in flight).
    pub live_mappings: usize,
    /// Mappings translated and compared with the reference at the checkpoint.
    pub mappings_checked: usize,
}

/// The result of a soak that passed every check.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct SoakReport {
    /// Writer threads.
    pub threads: usize,
    /// Whether the DDW was used as a dynamic window.
    pub ddw: bool,
    /// Virtual time run, nanoseconds (to the end of the writers' drain).
    pub virtual_ns: u64,
    /// Every interval, in order.
    pub intervals: Vec<IntervalReport>,
    /// Mean throughput over the intervals after the first, Gb/s.
    pub mean_gbps: f64,
    /// Coefficient of variation of that throughput, percent.
    pub cv_pct: f64,
    /// Buffers mapped.
    pub maps: u64,
    /// Buffers unmapped.
    pub unmaps: u64,
    /// Skbs completed.
    pub skbs: u64,
    /// Payload bytes completed.
    pub bytes: u64,
    /// TCE hypercalls issued.
    pub hypercalls: u64,
}

/// Why a soak stopped.
#[derive(Debug, thiserror::Error)]
pub enum SoakError {
    /// The scenario or its platform is invalid.
    #[error(transparent)]
    Scenario(#[from] ExperimentError),
    /// A soak parameter is out of range.
    #[error("Soak parameter {field}: expected {expected}, found {found}")]
    Param {
        /// The parameter.
        field: &'static str,
        /// What is accepted.
        expected: String,
        /// What was given.
        found: u64,
    },
    /// The DMA path refused an operation.
    #[error("DMA path: {0}")]
    Nic(#[from] NicError),
    /// The engine failed.
    #[error("Simulation: {0}")]
    Sim(#[from] SimError),
    /// An invariant check failed.
    #[error("Invariant broken at {at_ns} ns: {what}")]
    Invariant {
        /// Virtual time of the failed check.
        at_ns: u64,
        /// What was wrong.
        what: String,
    },
}

impl SoakError {
    /// Whether the error is the user's input (exit code 2) rather than a failure (1).
    pub fn is_bad_input(&self) -> bool {
        match self {
            SoakError::Scenario(e) => e.is_bad_input(),
            SoakError::Param { .. } => true,
            _ => false,
        }
    }
}

/// A mapping the soak holds: its buffer and how often the device read it.
struct RefMapping {
    pa: u64,
    len: u64,
    reads: u32,
}

/// Per-skb bookkeeping beside the ring: its sequence number on its queue.
struct SkbMark {
    seq: u64,
}

struct State {
    cfg: StreamConfig,
    costs: StackCosts,
    dma: TceDma,
    link: Link,
    end: SimTime,
    interval_ns: u64,
    reference: RefCell<BTreeMap<u64, RefMapping>>,
    /// Payload bytes the wire finished, per interval.
    buckets: RefCell<Vec<u64>>,
    written: Cell<u64>,
    completed: Cell<u64>,
    in_flight: Cell<u64>,
    skbs: Cell<u64>,
    error: RefCell<Option<SoakError>>,
    /// Stop-the-world: set by the checker; writers park at their next message boundary.
    pause: Cell<bool>,
    parked: Cell<usize>,
    running: Cell<usize>,
    /// Virtual time the last writer finished draining.
    drained_at: Cell<u64>,
    resume: Vec<Channel<()>>,
}

impl State {
    fn fail(&self, e: SoakError) {
        let mut err = self.error.borrow_mut();
        if err.is_none() {
            *err = Some(e);
        }
    }

    fn failed(&self) -> bool {
        self.error.borrow().is_some()
    }

    fn broken(&self, now: SimTime, what: String) -> SoakError {
        SoakError::Invariant {
            at_ns: now.as_ns(),
            what,
        }
    }

    async fn stack(&self, ctx: &Ctx, ns: f64) {
        let j = ctx
            .rng()
            .jitter(ns.round() as u64, self.costs.jitter_pct.min(100));
        spend(ctx, j as f64).await;
    }

    async fn map(&self, ctx: &Ctx, pa: u64, len: u64) -> Result<MappedBuffer, SoakError> {
        let m = self.dma.map(ctx, pa, len, Direction::ToDevice).await?;
        let dma = m.dma_addr().0;
        let old = self
            .reference
            .borrow_mut()
            .insert(dma, RefMapping { pa, len, reads: 0 });
        if old.is_some() {
            return Err(self.broken(ctx.now(), format!("IOVA {dma:#x} handed out twice")));
        }
        Ok(m)
    }

    fn device_read(&self, ctx: &Ctx, m: &MappedBuffer) -> Result<f64, SoakError> {
        let dma = m.dma_addr().0;
        let ns = self.dma.device_access(dma, m.len(), Access::Read)?;
        match self.reference.borrow_mut().get_mut(&dma) {
            Some(r) => r.reads += 1,
            None => return Err(self.broken(ctx.now(), format!("device read unmapped {dma:#x}"))),
        }
        Ok(ns)
    }

    async fn unmap(&self, ctx: &Ctx, m: MappedBuffer) -> Result<(), SoakError> {
        let dma = m.dma_addr().0;
        let r = self.reference.borrow_mut().remove(&dma);
        match r {
            Some(r) if r.reads == 1 => {}
            Some(r) => {
                return Err(self.broken(
                    ctx.now(),
                    format!("mapping {dma:#x} was read {} times, not once", r.reads),
                ))
            }
            None => return Err(self.broken(ctx.now(), format!("unmap of unknown {dma:#x}"))),
        }
        self.dma.unmap(ctx, m).await?;
        Ok(())
    }
}

/// Physical layout of one writer's buffers (as the stream workload's): 4 GiB apart.
fn thread_base(i: usize) -> u64 {
    (i as u64 + 1) << 32
}
const FRAG_PAGES: u64 = 256;
const HEAD_AREA: u64 = 2 << 30;
const HEADS: u64 = 4096;

/// Runs the soak on a `pseries-ddw` scenario (`text`, named `origin` in errors).
pub fn run_soak(text: &str, origin: &str, soak: &SoakConfig) -> Result<SoakReport, SoakError> {
    let SoakParts {
        profile,
        costs,
        link,
        stream,
        threads: scenario_threads,
        serialisation,
        iommu,
        dev,
    } = pseries_ddw::soak_parts(text, origin, soak.ddw)?;
    let threads = soak.threads.unwrap_or(scenario_threads);
    let param = |field, expected: String, found: u64| SoakError::Param {
        field,
        expected,
        found,
    };
    if threads == 0 || threads > scenario_threads.max(1) {
        return Err(param(
            "threads",
            format!("1..={scenario_threads} (the scenario's thread count)"),
            threads as u64,
        ));
    }
    if soak.duration_ns == 0 || soak.duration_ns > MAX_SOAK_SECONDS * 1_000_000_000 {
        return Err(param(
            "duration",
            format!("1 ns..={MAX_SOAK_SECONDS} s"),
            soak.duration_ns,
        ));
    }
    if soak.interval_ns < MIN_INTERVAL_US * 1000 || soak.interval_ns > soak.duration_ns {
        return Err(param(
            "interval",
            format!("{MIN_INTERVAL_US} us..=the duration"),
            soak.interval_ns,
        ));
    }
    let intervals = soak.duration_ns / soak.interval_ns;
    if intervals > MAX_INTERVALS {
        return Err(param(
            "interval",
            format!("at most {MAX_INTERVALS} intervals in the duration"),
            soak.interval_ns,
        ));
    }
    let end_ns = intervals * soak.interval_ns;
    let cpus = (profile.cpu.cores as usize).max(threads);
    let mut sim = Sim::new(SimConfig {
        cpus,
        seed: soak.seed,
    })?;
    let h = sim.handle().clone();
    let dma = TceDma::new(&h, iommu.clone(), dev.clone(), &profile, serialisation)?;
    let state = Rc::new(State {
        cfg: stream,
        costs,
        dma,
        link: Link::new(link),
        end: SimTime(end_ns),
        interval_ns: soak.interval_ns,
        reference: RefCell::new(BTreeMap::new()),
        buckets: RefCell::new(vec![0; intervals as usize]),
        written: Cell::new(0),
        completed: Cell::new(0),
        in_flight: Cell::new(0),
        skbs: Cell::new(0),
        error: RefCell::new(None),
        pause: Cell::new(false),
        parked: Cell::new(0),
        running: Cell::new(threads),
        drained_at: Cell::new(0),
        resume: (0..threads).map(|_| Channel::new(&h, 1)).collect(),
    });
    for i in 0..threads {
        let s = state.clone();
        sim.spawn_on(i, move |ctx| async move {
            if let Err(e) = writer(&ctx, &s, i).await {
                s.fail(e);
            }
            s.running.set(s.running.get() - 1);
            s.drained_at.set(s.drained_at.get().max(ctx.now().as_ns()));
        })?;
    }
    let reports: Rc<RefCell<Vec<IntervalReport>>> = Rc::new(RefCell::new(Vec::new()));
    {
        let (s, r) = (state.clone(), reports.clone());
        let (iommu, dev) = (iommu.clone(), dev.clone());
        sim.spawn_agent(move |ctx| async move {
            for k in 1..=intervals {
                ctx.sleep_until(SimTime(k * s.interval_ns)).await;
                if s.failed() {
                    return;
                }
                // Stop the world at message boundaries.
                s.pause.set(true);
                while s.parked.get() < s.running.get() && !s.failed() {
                    ctx.sleep_until(ctx.now() + SimDuration::ns(200)).await;
                }
                match checkpoint(&ctx, &s, &iommu, &dev) {
                    Ok(checked) => r.borrow_mut().push(IntervalReport {
                        at_ns: k * s.interval_ns,
                        gbps: 0.0,
                        live_mappings: iommu.live_mappings(),
                        mappings_checked: checked,
                    }),
                    Err(e) => s.fail(e),
                }
                s.pause.set(false);
                for ch in &s.resume {
                    let _ = ch.send(());
                }
            }
        })?;
    }
    // Generous horizon for the drain; the run ends when every task has.
    let report = sim.run_until(SimTime(end_ns + end_ns / 10 + 1_000_000_000))?;
    if let Some(e) = state.error.borrow_mut().take() {
        return Err(e);
    }
    let _ = report;
    let now = SimTime(state.drained_at.get());
    let broken = |what: String| SoakError::Invariant {
        at_ns: now.as_ns(),
        what,
    };
    if state.running.get() != 0 {
        return Err(broken("writers did not finish draining".into()));
    }
    // Final: everything unmapped, nothing left in the table or the allocator.
    let live = iommu.live_mappings();
    let blocks = window_blocks(&iommu, &dev);
    if live != 0 || blocks != Some(0) || !state.reference.borrow().is_empty() {
        return Err(broken(format!(
            "after the drain: {live} live mappings, {blocks:?} allocator blocks, {} reference entries",
            state.reference.borrow().len()
        )));
    }
    let totals = state.dma.totals();
    if totals.maps != totals.unmaps {
        return Err(broken(format!(
            "{} maps but {} unmaps",
            totals.maps, totals.unmaps
        )));
    }
    if state.written.get() != state.completed.get() {
        return Err(broken(format!(
            "{} payload bytes written, {} completed",
            state.written.get(),
            state.completed.get()
        )));
    }
    let mut intervals_out = reports.borrow().clone();
    if intervals_out.len() as u64 != intervals {
        return Err(broken(format!(
            "{} checkpoints ran, {intervals} expected",
            intervals_out.len()
        )));
    }
    let buckets = state.buckets.borrow();
    for (iv, &bytes) in intervals_out.iter_mut().zip(buckets.iter()) {
        iv.gbps = bytes as f64 * 8.0 / soak.interval_ns as f64;
    }
    let steady: Vec<f64> = intervals_out.iter().skip(1).map(|i| i.gbps).collect();
    let (mean_gbps, cv_pct) = mean_cv(if steady.is_empty() { &[] } else { &steady });
    Ok(SoakReport {
        threads,
        ddw: soak.ddw,
        virtual_ns: now.as_ns(),
        intervals: intervals_out,
        mean_gbps,
        cv_pct,
        maps: totals.maps,
        unmaps: totals.unmaps,
        skbs: state.skbs.get(),
        bytes: state.completed.get(),
        hypercalls: totals.hypercalls,
    })
}

/// Mean and coefficient of variation (percent, population) of `xs`.
pub fn mean_cv(xs: &[f64]) -> (f64, f64) {
    if xs.is_empty() {
        return (0.0, 0.0);
    }
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n;
    let cv = if mean > 0.0 {
        var.sqrt() / mean * 100.0
    } else {
        0.0
    };
    (mean, cv)
}

fn window_blocks(
    iommu: &iolab_iommu::hw::PseriesIommu,
    dev: &iolab_iommu::dma::Device,
) -> Option<usize> {
    iommu.with_window_pool(dev, |pool, _, _| pool.live_blocks())
}

/// The checks of one stopped-world checkpoint; returns how many mappings were compared.
fn checkpoint(
    ctx: &Ctx,
    s: &State,
    iommu: &iolab_iommu::hw::PseriesIommu,
    dev: &iolab_iommu::dma::Device,
) -> Result<usize, SoakError> {
    let now = ctx.now();
    let reference = s.reference.borrow();
    let live = iommu.live_mappings();
    if live != reference.len() {
        return Err(s.broken(
            now,
            format!(
                "the IOMMU holds {live} mappings, the reference {}",
                reference.len()
            ),
        ));
    }
    let blocks = window_blocks(iommu, dev);
    if blocks != Some(reference.len()) {
        return Err(s.broken(
            now,
            format!(
                "the window allocator holds {blocks:?} blocks, the reference {} mappings",
                reference.len()
            ),
        ));
    }
    let mut work = WorkRecord::new();
    for (&dma, r) in reference.iter() {
        let got = iommu
            .translate(dev, DmaAddr(dma), r.len, Access::Read, &mut work)
            .map_err(|f| s.broken(now, format!("mapping {dma:#x} faults: {f:?}")))?;
        let merged = merge(got);
        let want = [PhysRange {
            pa: iolab_iommu::addr::PhysAddr::new(r.pa),
            len: r.len,
        }];
        if merged != want {
            return Err(s.broken(
                now,
                format!("mapping {dma:#x} translates to {merged:?}, not {want:?}"),
            ));
        }
    }
    if s.written.get() != s.completed.get() + s.in_flight.get() {
        return Err(s.broken(
            now,
            format!(
                "payload: {} written != {} completed + {} in flight",
                s.written.get(),
                s.completed.get(),
                s.in_flight.get()
            ),
        ));
    }
    let totals = s.dma.totals();
    if totals.maps - totals.unmaps != reference.len() as u64 {
        return Err(s.broken(
            now,
            format!(
                "{} maps - {} unmaps != {} live",
                totals.maps,
                totals.unmaps,
                reference.len()
            ),
        ));
    }
    Ok(reference.len())
}

fn merge(ranges: Vec<PhysRange>) -> Vec<PhysRange> {
    let mut out: Vec<PhysRange> = Vec::new();
    for r in ranges {
        match out.last_mut() {
            Some(last) if last.pa.get() + last.len == r.pa.get() => last.len += r.len,
            _ => out.push(r),
        }
    }
    out
}

/// One writer: the stream workload's transmit path, with the soak's bookkeeping.
async fn writer(ctx: &Ctx, s: &State, i: usize) -> Result<(), SoakError> {
    let c = s.cfg;
    let base = thread_base(i);
    let mut ring = TxRing::new(c.tx_ring_entries, c.tx_inflight_bytes, c.tx_coalescing);
    let mut marks: VecDeque<SkbMark> = VecDeque::new();
    let (mut next_seq, mut next_done) = (0u64, 0u64);
    let (mut page, mut off, mut heads) = (0u64, 0u64, 0u64);
    while ctx.now() < s.end && !s.failed() {
        if s.pause.get() {
            s.parked.set(s.parked.get() + 1);
            s.resume[i].recv(ctx).await;
            s.parked.set(s.parked.get() - 1);
            continue;
        }
        s.stack(
            ctx,
            s.costs.syscall_ns + c.message_bytes as f64 / s.costs.copy_bytes_per_ns,
        )
        .await;
        let started = ctx.now();
        let mut left = c.message_bytes;
        s.written.set(s.written.get() + left);
        s.in_flight.set(s.in_flight.get() + left);
        while left > 0 {
            let skb = left.min(c.tso_max_bytes);
            left -= skb;
            while !ring.has_room(skb) {
                if let Some(at) = ring.interrupt_at() {
                    if at > ctx.now() {
                        ctx.sleep_until(at).await;
                    }
                }
                complete(ctx, s, &mut ring, &mut marks, &mut next_done).await?;
            }
            s.stack(ctx, s.costs.tx_per_skb_ns).await;
            let mut maps = Vec::with_capacity(3);
            if c.linear_bytes > 0 {
                let head = base + HEAD_AREA + (heads % HEADS) * 4096 + 64;
                heads += 1;
                maps.push(s.map(ctx, head, c.linear_bytes).await?);
            }
            let mut rem = skb;
            while rem > 0 {
                let n = rem.min(c.page_bytes - off);
                let pa = base + (page % FRAG_PAGES) * c.page_bytes + off;
                maps.push(s.map(ctx, pa, n).await?);
                rem -= n;
                off += n;
                if off >= c.page_bytes {
                    off = 0;
                    page += 1;
                }
            }
            spend(ctx, s.costs.doorbell_ns).await;
            let mut xlat = 0.0;
            for m in &maps {
                xlat += s.device_read(ctx, m)?;
            }
            let ready = ctx.now() + SimDuration::ns(xlat.round() as u64);
            let done = s.link.transmit(ready, skb);
            let k = (done.as_ns() / s.interval_ns) as usize;
            if let Some(b) = s.buckets.borrow_mut().get_mut(k) {
                *b += skb;
            }
            ring.push(TxEntry {
                maps,
                bytes: skb,
                done,
                started,
                last: left == 0,
            });
            marks.push_back(SkbMark { seq: next_seq });
            next_seq += 1;
        }
        if ring.interrupt_at().is_some_and(|at| at <= ctx.now()) {
            complete(ctx, s, &mut ring, &mut marks, &mut next_done).await?;
        }
    }
    // Drain: the remaining completions arrive and are unmapped.
    while !ring.is_empty() && !s.failed() {
        if let Some(at) = ring.interrupt_at() {
            if at > ctx.now() {
                ctx.sleep_until(at).await;
            }
        }
        complete(ctx, s, &mut ring, &mut marks, &mut next_done).await?;
    }
    if !marks.is_empty() || next_done != next_seq {
        return Err(s.broken(
            ctx.now(),
            format!("queue {i}: {next_seq} skbs posted, {next_done} completed"),
        ));
    }
    Ok(())
}

/// One completion interrupt: frees the completed skbs and unmaps their buffers, checking
/// each skb completes once, in order.
async fn complete(
    ctx: &Ctx,
    s: &State,
    ring: &mut TxRing,
    marks: &mut VecDeque<SkbMark>,
    next_done: &mut u64,
) -> Result<(), SoakError> {
    let done = ring.take_done(ctx.now());
    if done.is_empty() {
        return Ok(());
    }
    s.stack(ctx, s.costs.irq_ns).await;
    for e in done {
        let mark = marks.pop_front();
        match mark {
            Some(m) if m.seq == *next_done => *next_done += 1,
            other => {
                return Err(s.broken(
                    ctx.now(),
                    format!(
                        "skb completed out of order or twice: got {:?}, expected {}",
                        other.map(|m| m.seq),
                        next_done
                    ),
                ))
            }
        }
        s.stack(ctx, s.costs.tx_completion_ns).await;
        s.in_flight.set(s.in_flight.get() - e.bytes);
        s.completed.set(s.completed.get() + e.bytes);
        s.skbs.set(s.skbs.get() + 1);
        for m in e.maps {
            s.unmap(ctx, m).await?;
        }
    }
    Ok(())
}
