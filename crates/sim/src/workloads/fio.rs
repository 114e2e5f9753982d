//! A fio-like workload: jobs that keep `iodepth` I/Os in flight against a block target,
//! libaio style (submit a batch with one `io_submit`, reap at least one completion with one
//! `io_getevents`), and report in fio's shapes (the text summary and the JSON fields people
//! read: `jobs[].read.iops`, `.bw`, `.clat_ns.percentile`, `usr_cpu`, `sys_cpu`).
//!
//! The workload owns only what fio and the syscall layer do: the per-I/O user-space cost,
//! the system-call entry and exit, the random offsets and the bookkeeping. Everything below
//! the system call (block layer, driver, DMA mapping, the device, the completion interrupt)
//! is the [`BlockTarget`]'s, which spends its own CPU time and delivers each completion to
//! the job's channel.
//!
//! Every job is a task pinned to one virtual CPU; nothing here reads a wall clock.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::future::Future;
use std::rc::Rc;

use serde::Serialize;

use crate::accounting::{Account, RunReport};
use crate::devices::BlockIo;
use crate::engine::{Channel, Ctx, SimDuration, SimTime};

/// fio's `rw=` patterns.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RwPattern {
    /// Sequential reads.
    Read,
    /// Sequential writes.
    Write,
    /// Random reads.
    RandRead,
    /// Random writes.
    RandWrite,
    /// Random mixed reads and writes (`rwmixread` percent reads).
    RandRw,
}

impl RwPattern {
    /// Parses fio's spelling (`read`, `write`, `randread`, `randwrite`, `randrw`).
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "read" => RwPattern::Read,
            "write" => RwPattern::Write,
            "randread" => RwPattern::RandRead,
            "randwrite" => RwPattern::RandWrite,
            "randrw" => RwPattern::RandRw,
            _ => return None,
        })
    }

    /// fio's spelling.
    pub fn name(self) -> &'static str {
        match self {
            RwPattern::Read => "read",
            RwPattern::Write => "write",
            RwPattern::RandRead => "randread",
            RwPattern::RandWrite => "randwrite",
            RwPattern::RandRw => "randrw",
        }
    }

    fn is_random(self) -> bool {
        matches!(
            self,
            RwPattern::RandRead | RwPattern::RandWrite | RwPattern::RandRw
        )
    }
}

/// fio's `ioengine`: how a job issues its I/O and learns of its completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum EngineKind {
    /// `psync`: one `pread`/`pwrite` per I/O, the thread asleep until it completes (fio's
    /// default; one I/O in flight per job whatever `iodepth` says).
    Psync,
    /// `libaio`: `io_submit` per batch, `io_getevents` per reap.
    Libaio,
    /// `io_uring`: `io_uring_enter` per batch submitted; completions read from the ring,
    /// with a system call only when the job must wait for one.
    IoUring,
}

impl EngineKind {
    /// Parses fio's spelling (`psync`, `libaio`, `io_uring`).
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "psync" => EngineKind::Psync,
            "libaio" => EngineKind::Libaio,
            "io_uring" => EngineKind::IoUring,
            _ => return None,
        })
    }

    /// fio's spelling.
    pub fn name(self) -> &'static str {
        match self {
            EngineKind::Psync => "psync",
            EngineKind::Libaio => "libaio",
            EngineKind::IoUring => "io_uring",
        }
    }
}

/// fio's `ioengine` with the io_uring engine's options (fio's names).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct IoEngine {
    /// The engine.
    pub kind: EngineKind,
    /// `hipri`: polled completions (`IORING_SETUP_IOPOLL`): no interrupt, the job's CPU
    /// spins on the queue.
    pub hipri: bool,
    /// `sqthread_poll`: a kernel thread polls the submission ring, so the job makes no
    /// system call to submit; the thread's CPU is never idle.
    pub sqthread_poll: bool,
    /// `fixedbufs`: buffers registered once, so no page pinning per I/O.
    pub fixedbufs: bool,
    /// `registerfiles`: the file registered once, so no file reference per I/O.
    pub registerfiles: bool,
}

impl IoEngine {
    /// An engine with none of io_uring's options.
    pub const fn plain(kind: EngineKind) -> Self {
        Self {
            kind,
            hipri: false,
            sqthread_poll: false,
            fixedbufs: false,
            registerfiles: false,
        }
    }

    /// Whether the engine is synchronous (one I/O in flight per job).
    pub fn is_sync(&self) -> bool {
        self.kind == EngineKind::Psync
    }

    /// fio's name with the options set, e.g. `io_uring (hipri, fixedbufs)`.
    pub fn label(&self) -> String {
        let opts: Vec<&str> = [
            (self.hipri, "hipri"),
            (self.sqthread_poll, "sqthread_poll"),
            (self.fixedbufs, "fixedbufs"),
            (self.registerfiles, "registerfiles"),
        ]
        .iter()
        .filter(|(on, _)| *on)
        .map(|(_, n)| *n)
        .collect();
        if opts.is_empty() {
            self.kind.name().to_owned()
        } else {
            format!("{} ({})", self.kind.name(), opts.join(", "))
        }
    }
}

/// What fio's `steadystate` judges: IOPS or bandwidth, by their spread about the mean or by
/// the slope of their least-squares line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum SsCriterion {
    /// `iops`: every sample within the limit of the samples' mean.
    Iops,
    /// `iops_slope`: the least-squares slope (per sample) within the limit.
    IopsSlope,
    /// `bw`: as `iops`, on bandwidth.
    Bw,
    /// `bw_slope`: as `iops_slope`, on bandwidth.
    BwSlope,
}

impl SsCriterion {
    /// fio's spelling.
    pub fn name(self) -> &'static str {
        match self {
            SsCriterion::Iops => "iops",
            SsCriterion::IopsSlope => "iops_slope",
            SsCriterion::Bw => "bw",
            SsCriterion::BwSlope => "bw_slope",
        }
    }
}

/// fio's `steadystate` (`ss`), `ss_dur`, `ss_ramp` and `ss_interval`: the job ends once the
/// criterion holds over the last `dur` of samples taken every `interval` after `ramp`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct SteadyState {
    /// What is judged.
    pub criterion: SsCriterion,
    /// The limit: a percent of the samples' mean when `percent`, else absolute (IOPS, or
    /// KiB/s for bandwidth, fio's unit).
    pub limit: f64,
    /// Whether `limit` is a percentage.
    pub percent: bool,
    /// `ss_dur`: the rolling window judged, ns.
    pub dur_ns: u64,
    /// `ss_ramp`: time after the job's ramp before samples are taken, ns.
    pub ramp_ns: u64,
    /// `ss_interval`: one sample per this many ns.
    pub interval_ns: u64,
}

impl SteadyState {
    /// Parses fio's `criterion:limit` (`"iops:2%"`, `"iops_slope:0.1%"`, `"bw:20000"`).
    pub fn parse_criterion(text: &str) -> Option<(SsCriterion, f64, bool)> {
        let (name, limit) = text.split_once(':')?;
        let criterion = match name.trim() {
            "iops" => SsCriterion::Iops,
            "iops_slope" => SsCriterion::IopsSlope,
            "bw" => SsCriterion::Bw,
            "bw_slope" => SsCriterion::BwSlope,
            _ => return None,
        };
        let limit = limit.trim();
        let (number, percent) = match limit.strip_suffix('%') {
            Some(n) => (n, true),
            None => (limit, false),
        };
        let value: f64 = number.trim().parse().ok()?;
        (value.is_finite() && value >= 0.0).then_some((criterion, value, percent))
    }

    /// Samples per judged window (`dur / interval`, at least 2).
    pub fn samples(&self) -> usize {
        ((self.dur_ns / self.interval_ns.max(1)) as usize).max(2)
    }

    /// The criterion's value over `samples` (IOPS, or KiB/s for bandwidth) and whether it
    /// is within the limit, as fio's steadystate.c judges: for `iops`/`bw` the largest
    /// distance of a sample from their mean, for the slopes the least-squares slope per
    /// sample; as a percent of the mean when the limit is one.
    pub fn judge(&self, samples: &[f64]) -> (f64, bool) {
        let n = samples.len() as f64;
        if samples.is_empty() {
            return (f64::INFINITY, false);
        }
        let mean = samples.iter().sum::<f64>() / n;
        let raw = match self.criterion {
            SsCriterion::Iops | SsCriterion::Bw => {
                samples.iter().map(|y| (y - mean).abs()).fold(0.0, f64::max)
            }
            SsCriterion::IopsSlope | SsCriterion::BwSlope => {
                let xm = (n - 1.0) / 2.0;
                let (mut sxy, mut sxx) = (0.0, 0.0);
                for (i, y) in samples.iter().enumerate() {
                    let dx = i as f64 - xm;
                    sxy += dx * (y - mean);
                    sxx += dx * dx;
                }
                if sxx > 0.0 {
                    (sxy / sxx).abs()
                } else {
                    0.0
                }
            }
        };
        let value = if self.percent {
            if mean > 0.0 {
                100.0 * raw / mean
            } else {
                f64::INFINITY
            }
        } else {
            raw
        };
        (value, value <= self.limit)
    }

    /// Whether bandwidth (not IOPS) is judged.
    pub fn on_bandwidth(&self) -> bool {
        matches!(self.criterion, SsCriterion::Bw | SsCriterion::BwSlope)
    }
}

/// One fio job group (`numjobs` identical jobs).
#[derive(Clone, Debug, PartialEq)]
pub struct FioJob {
    /// Job name (for the report).
    pub name: String,
    /// Access pattern.
    pub rw: RwPattern,
    /// Percent of reads for [`RwPattern::RandRw`].
    pub rwmixread: u32,
    /// Block size in bytes.
    pub bs: u64,
    /// I/Os each job keeps in flight.
    pub iodepth: u32,
    /// I/Os submitted per `io_submit` (fio `iodepth_batch_submit`, at least 1).
    pub batch_submit: u32,
    /// Completions `io_getevents` waits for at least (fio `iodepth_batch_complete_min`).
    pub batch_complete_min: u32,
    /// Number of identical jobs.
    pub numjobs: u32,
    /// Size of the target the offsets fall in, in bytes.
    pub size: u64,
    /// Time measured, after the ramp.
    pub runtime: SimDuration,
    /// Time run before measuring (fio `ramp_time`).
    pub ramp: SimDuration,
    /// CPUs the jobs run on, in order (job `j` on `cpus[j % cpus.len()]`).
    pub cpus: Vec<usize>,
    /// fio's own user-space CPU time per I/O (issue and reap bookkeeping).
    pub user_ns_per_io: u64,
    /// System-call entry and exit (one per `io_submit` and per `io_getevents`).
    pub syscall_ns: u64,
    /// fio's `ioengine`: which system calls the job makes.
    pub engine: IoEngine,
    /// The CPU of job `j`'s submission-polling thread (`engine.sqthread_poll`), by job.
    pub sq_cpus: Vec<usize>,
}

/// One I/O handed to a [`BlockTarget`].
#[derive(Clone, Debug)]
pub struct IoRequest {
    /// The job that issued it.
    pub job: usize,
    /// The job's slot (0..iodepth): identifies the buffer.
    pub slot: u32,
    /// Read (device to memory) or write.
    pub is_read: bool,
    /// Byte offset on the target.
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
    /// When fio issued it.
    pub issued_at: SimTime,
    /// Where the completion goes.
    pub done: Channel<IoCompletion>,
}

impl IoRequest {
    /// What a block device is asked to do: one block of `len` bytes at `offset`, a SAS
    /// HBA's disks striped in units of the block size.
    pub(crate) fn block_io(&self) -> BlockIo {
        BlockIo {
            is_read: self.is_read,
            offset: self.offset,
            len: self.len,
            stripe: self.len,
        }
    }

    /// Sends this request's [`IoCompletion`] to the job that issued it (a job that has
    /// already stopped no longer listens; that is not an error).
    pub fn complete(self) {
        self.into_pending().complete();
    }

    /// What is left of the request once the device has it: the completion to send and where
    /// (smaller than the request, so a stack keeps less per I/O in flight).
    pub(crate) fn into_pending(self) -> PendingCompletion {
        PendingCompletion {
            completion: IoCompletion {
                slot: self.slot,
                is_read: self.is_read,
                len: self.len,
                issued_at: self.issued_at,
            },
            done: self.done,
        }
    }
}

/// An [`IoRequest`]'s completion, kept until the I/O completes ([`IoRequest::into_pending`]).
pub(crate) struct PendingCompletion {
    completion: IoCompletion,
    done: Channel<IoCompletion>,
}

impl PendingCompletion {
    /// Sends the completion to the job that issued the request, as [`IoRequest::complete`].
    pub(crate) fn complete(self) {
        let _ = self.done.send(self.completion);
    }
}

/// A completed I/O, as `io_getevents` returns it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IoCompletion {
    /// The job's slot.
    pub slot: u32,
    /// Read or write.
    pub is_read: bool,
    /// Length in bytes.
    pub len: u64,
    /// When fio issued it.
    pub issued_at: SimTime,
}

/// The kernel below the system call: submits an I/O (spending the submitting CPU's kernel
/// time) and later sends its [`IoCompletion`] to `req.done`.
pub trait BlockTarget {
    /// Submits `req` from the task of `ctx`. An error stops the job (the message is kept).
    ///
    /// The future is the implementation's own type (no box per I/O): [`run_job`] is generic
    /// over the target and holds it in place.
    fn submit<'a>(
        &'a self,
        ctx: &'a Ctx,
        req: IoRequest,
    ) -> impl Future<Output = Result<(), String>> + 'a;

    /// Whether [`BlockTarget::submit`] spends CPU time before it interacts with anything
    /// another task can see, so that it may be called with the job's CPU time deferred
    /// ([`crate::engine::Cpu::defer`]: the system call's and fio's own time, charged by the
    /// target's first spend as one fused span). `false` (the default): [`run_job`] spends
    /// the deferred time before it submits.
    fn charges_deferred(&self) -> bool {
        false
    }
}

/// io_uring's submission ring under a polling kernel thread (`sqthread_poll`): the job
/// places each request in the ring, with no system call; [`run_sq_thread`] submits them to
/// the block target on the thread's own CPU.
pub struct SqRing {
    ring: Channel<IoRequest>,
}

impl SqRing {
    /// A ring of `entries` slots (the job's `iodepth`).
    pub fn new(h: &crate::engine::Handle, entries: usize) -> Self {
        Self {
            ring: Channel::new(h, entries.max(1)),
        }
    }
}

impl BlockTarget for SqRing {
    fn submit<'a>(
        &'a self,
        _ctx: &'a Ctx,
        req: IoRequest,
    ) -> impl Future<Output = Result<(), String>> + 'a {
        let placed = self
            .ring
            .send(req)
            .map_err(|_| "io_uring submission ring full (more I/Os than iodepth)".to_owned());
        std::future::ready(placed)
    }
}

/// The submission-polling kernel thread of one job's ring, on `ctx`'s CPU: takes each
/// request placed in `ring` and submits it to `target` (the block layer's work is charged
/// here, not on the job's CPU). An error stops the job as a failed submission would.
pub async fn run_sq_thread<T: BlockTarget + ?Sized>(
    ctx: Ctx,
    ring: Rc<SqRing>,
    target: Rc<T>,
    stats: SharedStats,
) {
    loop {
        let req = ring.ring.recv(&ctx).await;
        if let Err(e) = target.submit(&ctx, req).await {
            let mut s = stats.borrow_mut();
            if s.error.is_none() {
                s.error = Some(e);
            }
        }
    }
}

/// Completions and latencies of one direction, measured in the window.
#[derive(Clone, Debug, Default)]
pub struct DirStats {
    /// Completion latencies in ns (issue to reap), in the window.
    pub clat_ns: Vec<u64>,
    /// Bytes completed in the window.
    pub bytes: u64,
}

/// What the jobs of a group measured.
#[derive(Clone, Debug, Default)]
pub struct GroupStats {
    /// Reads.
    pub read: DirStats,
    /// Writes.
    pub write: DirStats,
    /// I/Os issued in total (window or not).
    pub issued: u64,
    /// The first error a job hit, if any.
    pub error: Option<String>,
    /// When non-zero, completions are also counted in slices of this many ns from
    /// `slices_from_ns` on (`slices[k]`: reaped in slice `k`), window or not: how the lab
    /// finds where a run's transient ends.
    pub slice_ns: u64,
    /// Start of slice 0, ns.
    pub slices_from_ns: u64,
    /// Completions reaped per slice.
    pub slices: Vec<u64>,
}

impl GroupStats {
    /// Counts `n` completions reaped at `now` in their slice, when slices are counted
    /// ([`GroupStats::slice_ns`]).
    fn count_reaped(&mut self, now: SimTime, n: u64) {
        if self.slice_ns == 0 || now.as_ns() < self.slices_from_ns {
            return;
        }
        let k = ((now.as_ns() - self.slices_from_ns) / self.slice_ns) as usize;
        if self.slices.len() <= k {
            self.slices.resize(k + 1, 0);
        }
        self.slices[k] += n;
    }
}

/// Shared, single-threaded stats cell.
pub type SharedStats = Rc<std::cell::RefCell<GroupStats>>;

/// Runs job `job` of `spec` on its CPU until the end of the window, then drains. Spawn one
/// per job with [`crate::engine::Sim::spawn_on`].
pub async fn run_job<T: BlockTarget + ?Sized>(
    ctx: Ctx,
    spec: Rc<FioJob>,
    job: usize,
    target: Rc<T>,
    stats: SharedStats,
) {
    let start = ctx.now();
    let window_start = start + spec.ramp;
    let end = window_start + spec.runtime;
    let depth = spec.iodepth.max(1);
    let done: Channel<IoCompletion> = Channel::new(ctx.handle(), depth as usize);
    let mut free: Vec<u32> = (0..depth).rev().collect();
    let mut inflight = 0u32;
    let blocks = (spec.size / spec.bs.max(1)).max(1);
    let mut seq_block = (job as u64 * blocks / u64::from(spec.numjobs.max(1))) % blocks;
    let user = SimDuration::ns(spec.user_ns_per_io);
    let syscall = SimDuration::ns(spec.syscall_ns);
    // Reaped completions, reused across reaps (no allocation per reap).
    let mut got: Vec<IoCompletion> = Vec::with_capacity(depth as usize);
    // The job's own CPU time (the system calls' entry and fio's user time per I/O) touches
    // nothing another task sees, so it is deferred (`Cpu::defer`) and charged with the next
    // spend as one fused span: the target's first spend when it takes deferred time, else
    // a zero spend before the job submits, waits or ends. Times the job reads are its local
    // time (`Ctx::local_now`), the time the separate spends would have reached.
    let zero = SimDuration::ZERO;
    let fused = target.charges_deferred();
    loop {
        let running = ctx.local_now() < end;
        if running && stats.borrow().error.is_none() {
            // Submit in batches until the queue is full.
            while !free.is_empty() {
                let n = (free.len() as u32).min(spec.batch_submit.max(1));
                // One system call per batch (psync's `pread` is the I/O's whole call), none
                // when a kernel thread polls the submission ring.
                if !spec.engine.sqthread_poll {
                    ctx.cpu().defer(syscall, Account::System);
                }
                for _ in 0..n {
                    let Some(slot) = free.pop() else { break };
                    ctx.cpu().defer(user, Account::User);
                    let is_read = match spec.rw {
                        RwPattern::Read | RwPattern::RandRead => true,
                        RwPattern::Write | RwPattern::RandWrite => false,
                        RwPattern::RandRw => ctx.rng().below(100) < u64::from(spec.rwmixread),
                    };
                    let block = if spec.rw.is_random() {
                        ctx.rng().below(blocks)
                    } else {
                        seq_block = (seq_block + 1) % blocks;
                        seq_block
                    };
                    let req = IoRequest {
                        job,
                        slot,
                        is_read,
                        offset: block * spec.bs,
                        len: spec.bs,
                        issued_at: ctx.local_now(),
                        done: done.clone(),
                    };
                    stats.borrow_mut().issued += 1;
                    if !fused && ctx.deferred() != zero {
                        ctx.cpu().spend(zero, Account::System).await;
                    }
                    if let Err(e) = target.submit(&ctx, req).await {
                        let mut s = stats.borrow_mut();
                        if s.error.is_none() {
                            s.error = Some(e);
                        }
                        free.push(slot);
                        break;
                    }
                    inflight += 1;
                }
                if stats.borrow().error.is_some() {
                    break;
                }
            }
        }
        // Whatever is still deferred is spent before the job waits or ends.
        if ctx.deferred() != zero {
            ctx.cpu().spend(zero, Account::System).await;
        }
        if inflight == 0 {
            break;
        }
        // Reap: io_getevents(min_nr, nr = iodepth).
        let min = spec.batch_complete_min.clamp(1, inflight);
        got.clear();
        while let Some(c) = done.try_recv() {
            got.push(c);
        }
        // libaio reaps with `io_getevents`; io_uring reads its completion ring and enters
        // the kernel only to wait (or, polled, to poll); psync's call already returned.
        let reap_call = match spec.engine.kind {
            EngineKind::Libaio => true,
            EngineKind::IoUring => (got.len() as u32) < min || spec.engine.hipri,
            EngineKind::Psync => false,
        };
        while (got.len() as u32) < min {
            got.push(done.recv(&ctx).await);
        }
        while let Some(c) = done.try_recv() {
            got.push(c);
        }
        if reap_call {
            ctx.cpu().defer(syscall, Account::System);
        }
        let now = ctx.local_now();
        stats.borrow_mut().count_reaped(now, got.len() as u64);
        for c in got.drain(..) {
            ctx.cpu().defer(user, Account::User);
            inflight -= 1;
            free.push(c.slot);
            if now > window_start && now <= end {
                let mut s = stats.borrow_mut();
                let d = if c.is_read { &mut s.read } else { &mut s.write };
                d.clat_ns.push((now - c.issued_at).as_ns());
                d.bytes += c.len;
            }
        }
    }
}

/// fio's default completion-latency percentiles.
pub const PERCENTILES: [f64; 17] = [
    1.0, 5.0, 10.0, 20.0, 30.0, 40.0, 50.0, 60.0, 70.0, 80.0, 90.0, 95.0, 99.0, 99.5, 99.9, 99.95,
    99.99,
];

/// `clat_ns` of fio's JSON.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ClatJson {
    /// Smallest latency.
    pub min: u64,
    /// Largest latency.
    pub max: u64,
    /// Mean latency.
    pub mean: f64,
    /// Standard deviation of the latencies (divisor n - 1, as fio computes it; 0 for fewer
    /// than two samples).
    pub stddev: f64,
    /// Percentiles keyed as fio keys them (`"99.000000"`).
    pub percentile: BTreeMap<String, u64>,
}

/// `jobs[].read` / `jobs[].write` of fio's JSON.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct DirJson {
    /// Bytes moved.
    pub io_bytes: u64,
    /// Bandwidth in KiB/s.
    pub bw: f64,
    /// I/Os per second.
    pub iops: f64,
    /// Measured time in ms.
    pub runtime: u64,
    /// I/Os completed.
    pub total_ios: u64,
    /// Completion latency.
    pub clat_ns: ClatJson,
}

/// One entry of fio's `jobs[]` (a job group with `group_reporting`).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct JobJson {
    /// Job name.
    pub jobname: String,
    /// Group id.
    pub groupid: u32,
    /// Reads.
    pub read: DirJson,
    /// Writes.
    pub write: DirJson,
    /// User CPU percent of the jobs' CPUs.
    pub usr_cpu: f64,
    /// System CPU percent of the jobs' CPUs (spinning included, as the kernel counts it).
    pub sys_cpu: f64,
}

/// fio's JSON output (the fields the lab fills).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct FioJson {
    /// One entry per job group.
    pub jobs: Vec<JobJson>,
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn dir_json(d: &DirStats, runtime: SimDuration) -> DirJson {
    let mut v = d.clat_ns.clone();
    // A radix sort: the same order as a comparison sort (u64 keys have one sorted order),
    // in about 60% of its instructions on a run's tens of thousands of latencies (7.8 M
    // against 13.1 M for the 46,203 of `scenarios/perf/fio-nvme-strict-64cpu.toml`).
    radsort::sort(&mut v);
    let secs = runtime.as_secs_f64().max(1e-12);
    let n = v.len() as u64;
    let mean = if v.is_empty() {
        0.0
    } else {
        v.iter().map(|&x| x as f64).sum::<f64>() / v.len() as f64
    };
    let stddev = if v.len() > 1 {
        let ss: f64 = v.iter().map(|&x| (x as f64 - mean).powi(2)).sum();
        (ss / (v.len() - 1) as f64).sqrt()
    } else {
        0.0
    };
    let clat = ClatJson {
        min: v.first().copied().unwrap_or(0),
        max: v.last().copied().unwrap_or(0),
        mean,
        stddev,
        percentile: PERCENTILES
            .iter()
            .map(|&p| (format!("{p:.6}"), percentile(&v, p)))
            .collect(),
    };
    DirJson {
        io_bytes: d.bytes,
        bw: d.bytes as f64 / 1024.0 / secs,
        iops: n as f64 / secs,
        runtime: runtime.as_ns() / 1_000_000,
        total_ios: n,
        clat_ns: clat,
    }
}

/// CPU percentages of `cpus` between two reports: (user, system + spin).
pub fn cpu_usage(before: &RunReport, after: &RunReport, cpus: &[usize]) -> (f64, f64) {
    let span = after.end.as_ns().saturating_sub(before.end.as_ns()) as f64;
    if span <= 0.0 || cpus.is_empty() {
        return (0.0, 0.0);
    }
    let (mut usr, mut sys) = (0.0, 0.0);
    for &c in cpus {
        let (Some(a), Some(b)) = (after.cpus.get(c), before.cpus.get(c)) else {
            continue;
        };
        usr += a.user.saturating_sub(b.user) as f64;
        sys += (a.system + a.spin).saturating_sub(b.system + b.spin) as f64;
    }
    let total = span * cpus.len() as f64;
    (usr / total * 100.0, sys / total * 100.0)
}

/// Builds the JSON entry of one group.
pub fn job_json(spec: &FioJob, stats: &GroupStats, usr_cpu: f64, sys_cpu: f64) -> JobJson {
    JobJson {
        jobname: spec.name.clone(),
        groupid: 0,
        read: dir_json(&stats.read, spec.runtime),
        write: dir_json(&stats.write, spec.runtime),
        usr_cpu,
        sys_cpu,
    }
}

pub(crate) fn human_iops(iops: f64) -> String {
    if iops >= 1e6 {
        format!("{:.2}M", iops / 1e6)
    } else if iops >= 1e3 {
        format!("{:.0}k", iops / 1e3)
    } else {
        format!("{iops:.0}")
    }
}

/// A byte count (or rate) as fio's summary writes it: at most four digits, scaled by 1024
/// (`pow2`: KiB, MiB, ...) or 1000 (kB, MB, ...) until it fits, and a scaled figure shown
/// with as many decimals as the four digits leave (fio: `BW=18.8MiB/s (19.7MB/s)`,
/// `(22.0MiB/1173msec)`, `BW=3008MiB/s`).
pub(crate) fn fio_bytes(bytes: f64, pow2: bool) -> String {
    const MAXLEN: i32 = 4;
    let (base, units): (f64, [&str; 6]) = if pow2 {
        (1024.0, ["B", "KiB", "MiB", "GiB", "TiB", "PiB"])
    } else {
        (1000.0, ["B", "kB", "MB", "GB", "TB", "PB"])
    };
    let mut v = bytes.max(0.0);
    let mut i = 0;
    while v.round() >= 10f64.powi(MAXLEN) && i + 1 < units.len() {
        v /= base;
        i += 1;
    }
    if i == 0 {
        return format!("{v:.0}{}", units[0]);
    }
    let digits = (v.trunc() as u64).to_string().len() as i32;
    let decimals = (MAXLEN - digits - 1).max(0) as usize;
    format!("{v:.decimals$}{}", units[i])
}

/// fio's text summary of one group (`group_reporting`), in fio's layout.
pub fn summary_text(spec: &FioJob, j: &JobJson) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{}: (groupid=0, jobs={}): err= 0: rw={}, bs={}, iodepth={}",
        spec.name,
        spec.numjobs,
        spec.rw.name(),
        spec.bs,
        spec.iodepth
    );
    for (label, d) in [("read", &j.read), ("write", &j.write)] {
        if d.total_ios == 0 {
            continue;
        }
        let _ = writeln!(
            out,
            "  {label}: IOPS={}, BW={}/s ({}/s)({}/{}msec)",
            human_iops(d.iops),
            fio_bytes(d.bw * 1024.0, true),
            fio_bytes(d.bw * 1024.0, false),
            fio_bytes(d.io_bytes as f64, true),
            d.runtime
        );
        let _ = writeln!(
            out,
            "    clat (usec): min={:.0}, max={:.0}, avg={:.2}",
            d.clat_ns.min as f64 / 1e3,
            d.clat_ns.max as f64 / 1e3,
            d.clat_ns.mean / 1e3
        );
        let _ = writeln!(out, "    clat percentiles (usec):");
        for row in PERCENTILES.chunks(4) {
            let cells: Vec<String> = row
                .iter()
                .map(|p| {
                    let v = d.clat_ns.percentile[&format!("{p:.6}")];
                    format!("{:>6.2}th=[{:>5}]", p, (v + 500) / 1000)
                })
                .collect();
            let _ = writeln!(out, "     | {}", cells.join(", "));
        }
    }
    let _ = writeln!(
        out,
        "  cpu          : usr={:.2}%, sys={:.2}%",
        j.usr_cpu, j.sys_cpu
    );
    out
}

/// The [`Measurement`](crate::metrics::Measurement) of one fio group: `read.*` and `write.*`
/// metrics (`iops`, `bw_bytes_per_s`, `clat_mean_ns`, `clat_p50_ns`, `clat_p99_ns`,
/// `clat_p99.9_ns`) for each direction that completed I/O, `cpu.usr_pct` and `cpu.sys_pct`,
/// the completion-latency histogram of both directions together, and the attributes
/// `workload`, `rw`, `bs`, `iodepth`, `numjobs`. Add the configuration's own attributes
/// (`iommu_mode`, `device` ...) with [`Measurement::attr`](crate::metrics::Measurement::attr).
pub fn measurement(
    config: &str,
    spec: &FioJob,
    stats: &GroupStats,
    usr_cpu: f64,
    sys_cpu: f64,
) -> crate::metrics::Measurement {
    use crate::metrics::{LatencyHistogram, Measurement, Metric};
    let j = job_json(spec, stats, usr_cpu, sys_cpu);
    let mut m = Measurement::new(config)
        .attr("workload", "fio")
        .attr("rw", spec.rw.name())
        .attr("bs", spec.bs)
        .attr("iodepth", spec.iodepth)
        .attr("numjobs", spec.numjobs)
        .attr("ioengine", spec.engine.kind.name());
    for (on, option) in [
        (spec.engine.hipri, "hipri"),
        (spec.engine.sqthread_poll, "sqthread_poll"),
        (spec.engine.fixedbufs, "fixedbufs"),
        (spec.engine.registerfiles, "registerfiles"),
    ] {
        if on {
            m = m.attr(option, 1);
        }
    }
    let mut lat = LatencyHistogram::from_samples(&stats.read.clat_ns);
    lat.merge(&LatencyHistogram::from_samples(&stats.write.clat_ns));
    for (dir, d) in [("read", &j.read), ("write", &j.write)] {
        if d.total_ios == 0 {
            continue;
        }
        let pct = |p: &str| d.clat_ns.percentile.get(p).copied().unwrap_or(0) as f64;
        m = m
            .metric(Metric::new(format!("{dir}.iops"), "IOPS", d.iops))
            .metric(Metric::new(
                format!("{dir}.bw_bytes_per_s"),
                "B/s",
                d.bw * 1024.0,
            ))
            .metric(Metric::new(
                format!("{dir}.clat_mean_ns"),
                "ns",
                d.clat_ns.mean,
            ))
            .metric(Metric::new(
                format!("{dir}.clat_p50_ns"),
                "ns",
                pct("50.000000"),
            ))
            .metric(Metric::new(
                format!("{dir}.clat_p99_ns"),
                "ns",
                pct("99.000000"),
            ))
            .metric(Metric::new(
                format!("{dir}.clat_p99.9_ns"),
                "ns",
                pct("99.900000"),
            ));
    }
    m.metric(Metric::new("cpu.usr_pct", "%", usr_cpu))
        .metric(Metric::new("cpu.sys_pct", "%", sys_cpu))
        .latency(lat)
}

#[cfg(test)]
mod tests {
    #[test]
    fn byte_figures_read_as_fio_writes_them() {
        use super::fio_bytes;
        // fio 3.x summaries: `BW=18.8MiB/s (19.7MB/s)(22.0MiB/1173msec)`,
        // `BW=11.0MiB/s (12.6MB/s)(4096MiB/341704msec)`.
        assert_eq!(fio_bytes(18.8 * 1048576.0, true), "18.8MiB");
        assert_eq!(fio_bytes(18.8 * 1048576.0, false), "19.7MB");
        assert_eq!(fio_bytes(22.0 * 1048576.0, true), "22.0MiB");
        assert_eq!(fio_bytes(4096.0 * 1048576.0, true), "4096MiB");
        assert_eq!(fio_bytes(3008.0 * 1048576.0, true), "3008MiB");
        assert_eq!(fio_bytes(3008.0 * 1048576.0, false), "3154MB");
        assert_eq!(fio_bytes(12.5e9, false), "12.5GB");
        assert_eq!(fio_bytes(1.25e9, false), "1250MB");
        assert_eq!(fio_bytes(15.0 * 1048576.0 * 1024.0, true), "15.0GiB");
        assert_eq!(fio_bytes(512.0, true), "512B");
        assert_eq!(fio_bytes(9999.0, false), "9999B");
        assert_eq!(fio_bytes(10_000.0, false), "10.0kB");
    }

    use super::*;

    #[test]
    fn steadystate_criteria_parse_and_judge_as_fio_s() {
        assert_eq!(
            SteadyState::parse_criterion("iops_slope:0.1%"),
            Some((SsCriterion::IopsSlope, 0.1, true))
        );
        assert_eq!(
            SteadyState::parse_criterion("bw:20000"),
            Some((SsCriterion::Bw, 20000.0, false))
        );
        for bad in ["iops", "lat:1%", "iops:-1%", "iops:x", "iops:inf"] {
            assert_eq!(SteadyState::parse_criterion(bad), None, "{bad}");
        }
        let ss = |criterion, limit, percent| SteadyState {
            criterion,
            limit,
            percent,
            dur_ns: 4_000_000,
            ramp_ns: 0,
            interval_ns: 1_000_000,
        };
        assert_eq!(ss(SsCriterion::Iops, 1.0, true).samples(), 4);
        // Deviation: the largest distance from the mean (100): 10, i.e. 10%.
        let (v, ok) = ss(SsCriterion::Iops, 10.0, true).judge(&[90.0, 100.0, 110.0, 100.0]);
        assert!((v - 10.0).abs() < 1e-9 && ok, "{v}");
        assert!(
            !ss(SsCriterion::Iops, 9.9, true)
                .judge(&[90.0, 100.0, 110.0, 100.0])
                .1
        );
        // Slope: 1, 2, 3 rise by 1 per sample, 50% of their mean 2; absolute 1.
        let (v, _) = ss(SsCriterion::IopsSlope, 50.0, true).judge(&[1.0, 2.0, 3.0]);
        assert!((v - 50.0).abs() < 1e-9, "{v}");
        let (v, ok) = ss(SsCriterion::BwSlope, 1.0, false).judge(&[3.0, 2.0, 1.0]);
        assert!((v - 1.0).abs() < 1e-9 && ok, "{v}");
        // Flat samples are steady by any criterion; no samples never are.
        assert!(ss(SsCriterion::IopsSlope, 0.0, true).judge(&[5.0; 4]).1);
        assert!(!ss(SsCriterion::Iops, 100.0, true).judge(&[]).1);
    }

    #[test]
    fn clat_summary_matches_a_comparison_sort() {
        // `dir_json` sorts with a radix sort: its figures must be those of the sorted order
        // a comparison sort gives (latencies with repeats and a wide range, as runs have).
        let mut rng = crate::engine::Rng::seed_from_u64(7);
        let clat_ns: Vec<u64> = (0..20_000)
            .map(|i| match i % 3 {
                0 => 600_000 + rng.below(64),
                1 => rng.below(1 << 40),
                _ => rng.below(5_000),
            })
            .collect();
        let mut sorted = clat_ns.clone();
        sorted.sort_unstable();
        let d = super::DirStats { clat_ns, bytes: 0 };
        let j = super::dir_json(&d, crate::engine::SimDuration::ns(1_000_000));
        assert_eq!(j.clat_ns.min, sorted[0]);
        assert_eq!(j.clat_ns.max, *sorted.last().unwrap());
        let mean = sorted.iter().map(|&x| x as f64).sum::<f64>() / sorted.len() as f64;
        assert_eq!(j.clat_ns.mean.to_bits(), mean.to_bits());
        assert_eq!(j.clat_ns.percentile.len(), super::PERCENTILES.len());
        for p in super::PERCENTILES {
            let v = j.clat_ns.percentile[&format!("{p:.6}")];
            assert_eq!(v, super::percentile(&sorted, p), "p{p}");
        }
    }

    #[test]
    fn percentiles_follow_the_nearest_rank() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&v, 50.0), 50);
        assert_eq!(percentile(&v, 99.0), 99);
        assert_eq!(percentile(&v, 99.99), 100);
        assert_eq!(percentile(&[], 50.0), 0);
    }

    #[test]
    fn rw_names_round_trip() {
        for rw in [
            RwPattern::Read,
            RwPattern::Write,
            RwPattern::RandRead,
            RwPattern::RandWrite,
            RwPattern::RandRw,
        ] {
            assert_eq!(RwPattern::parse(rw.name()), Some(rw));
        }
        assert_eq!(RwPattern::parse("rw"), None);
    }
}
