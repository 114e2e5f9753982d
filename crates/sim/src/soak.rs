//! The soak of SEEDS.md #4: a long many-thread TCP stream, write (transmit) or read
//! (receive), through the pSeries DMA path of a lab netperf scenario (by default
//! [`DEFAULT_CELL`] of the bundled [`DEFAULT_EXPERIMENT`] experiment: its partition, NIC,
//! stack costs, calibration and DDW dynamic window), in virtual time, with invariant checks
//! at intervals and the throughput of every interval.
//!
//! The scenario is any lab scenario with a netperf workload ([`crate::lab`],
//! docs/SCENARIOS.md): [`SoakScenario::prepare`] validates it with the lab's own validation
//! and the soak builds its parts with [`crate::lab::netperf_parts`], the construction
//! `iolab run` of the same file uses, so a soak streams through exactly the model a run
//! measures. The scenario's `workload.run_ms` and `warmup_ms` are replaced by the soak's
//! duration; its `workload.direction` by the soak's direction.
//!
//! The soak runs the stream workload's own transmit and receive loops
//! ([`TxConnection::write_message`], [`RxConnection::read_message`] of
//! [`crate::workloads::netperf`]) for the whole requested virtual time, and watches them
//! through [`StreamHooks`]: every message is copied, every skb's head and page fragments are
//! mapped through [`TceDma`] (pool locks, TCE hypercalls), read by the device through the TCE
//! table, sent on the wire, completed under interrupt moderation and unmapped; every
//! received packet is written by the device into a mapped receive stride, and used-up pages
//! are recycled or unmapped and replaced. As in the stream test, every queue's receive
//! pages are mapped when the interface comes up, in both directions. Nothing is
//! extrapolated.
//!
//! At every interval boundary a checker stops the world at message boundaries (each thread
//! parks before its next message; skbs already posted and messages already sent stay in
//! flight, mapped) and checks:
//!
//! - **no leaked IOVA or table entry**: the IOMMU's live mappings and the window
//!   allocator's live blocks both equal the reference map's entries (the reference is the
//!   soak's own record of every mapping it holds);
//! - **page tables consistent with the reference**: every reference mapping translates,
//!   through a walk of the TCE table, to exactly its physical buffer;
//! - **no DMA lost or duplicated**: write: every mapping unmapped so far was read by the
//!   device exactly once, every skb completed exactly once and in order on its queue, and
//!   the payload written equals the payload completed plus the payload in flight; read:
//!   every message the remote sender sent was read once and in order on its connection, the
//!   device wrote every receive page's strides in order, each once per posting, and only
//!   used-up pages were unmapped, and the bytes the device wrote are exactly one stride
//!   per packet of the messages read.
//!
//! At the end the threads drain their queues (writers: the remaining completions; readers:
//! the messages already sent), the interface goes down (its receive pages are unmapped),
//! and the IOMMU must hold no mapping, the allocator no block. Throughput stability is the
//! coefficient of variation of the per-interval throughput (the first interval, which
//! includes the ramp, is left out).

use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, VecDeque};
use std::path::Path;
use std::rc::Rc;

use iolab_iommu::addr::{Access, DmaAddr};
use iolab_iommu::dma::{Direction, PhysRange};
use iolab_iommu::hw::{DmaPath, MappedBuffer};
use iolab_iommu::iova::IovaAllocator;
use iolab_iommu::work::WorkRecord;

use crate::devices::nic::{Link, NicError, TceDma, TxEntry};
use crate::engine::{Channel, Ctx, Sim, SimConfig, SimDuration, SimError, SimTime};
use crate::lab::spec::{IommuMode, Workload};
use crate::lab::{self, LabError, LabScenario, NetperfParts};
use crate::reproduce::{self, Experiment, ReproduceError};
use crate::tomlfile::{InputError, TomlDoc};
use crate::tomlpatch;
use crate::workloads::netperf::{
    map_rx_rings, sender, RxConnection, StreamDirection, StreamHooks, StreamShared, TxConnection,
};

/// Longest soak accepted, virtual seconds (a week).
pub const MAX_SOAK_SECONDS: u64 = 7 * 24 * 3600;
/// Most intervals (invariant checks) one soak may record.
pub const MAX_INTERVALS: u64 = 1_000_000;
/// Shortest interval between checks, virtual microseconds.
pub const MIN_INTERVAL_US: u64 = 100;

/// Which way the soak's stream flows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SoakDirection {
    /// Transmit: the threads write.
    Write,
    /// Receive: the threads read what a remote sender streams.
    Read,
}

impl SoakDirection {
    /// "write" or "read".
    pub fn name(self) -> &'static str {
        match self {
            SoakDirection::Write => "write",
            SoakDirection::Read => "read",
        }
    }
}

/// What to soak.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SoakConfig {
    /// Virtual time to run, nanoseconds.
    pub duration_ns: u64,
    /// Virtual time between invariant checks, nanoseconds.
    pub interval_ns: u64,
    /// Threads (`None`: the scenario's `workload.threads`, 64 in the default cell).
    pub threads: Option<usize>,
    /// Write or read.
    pub direction: SoakDirection,
    /// Seed of the run.
    pub seed: u64,
}

/// One interval: its throughput and what its checkpoint saw.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct IntervalReport {
    /// Virtual time of the checkpoint, nanoseconds.
    pub at_ns: u64,
    /// Payload within the interval, Gb/s: write, what the wire finished; read, what the wire
    /// delivered (and the readers consumed).
    pub gbps: f64,
    /// Live mappings at the checkpoint (skbs in flight, receive pages).
    pub live_mappings: usize,
    /// Mappings translated and compared with the reference at the checkpoint.
    pub mappings_checked: usize,
}

/// The result of a soak that passed every check.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct SoakReport {
    /// The scenario's name (`name`).
    pub scenario: String,
    /// Write or read.
    pub direction: SoakDirection,
    /// Threads.
    pub threads: usize,
    /// Whether the NIC mapped through the DDW kept as a dynamic window (`iommu.mode =
    /// "ddw-dynamic"`) rather than the default window.
    pub ddw: bool,
    /// Virtual time run, nanoseconds (to the end of the threads' drain).
    pub virtual_ns: u64,
    /// Every interval, in order.
    pub intervals: Vec<IntervalReport>,
    /// Mean throughput over the intervals after the first, Gb/s.
    pub mean_gbps: f64,
    /// Coefficient of variation of that throughput, percent.
    pub cv_pct: f64,
    /// Buffers mapped (including the receive pages mapped when the interface came up).
    pub maps: u64,
    /// Buffers unmapped (including the receive pages unmapped when it went down).
    pub unmaps: u64,
    /// Skbs completed (write; 0 for read).
    pub skbs: u64,
    /// Messages written (write) or read (read).
    pub messages: u64,
    /// Payload bytes completed (write) or read (read).
    pub bytes: u64,
    /// Bytes the device moved by DMA: read from transmit buffers, written into receive
    /// strides.
    pub device_bytes: u64,
    /// TCE hypercalls issued.
    pub hypercalls: u64,
}

/// Why a soak stopped.
#[derive(Debug, thiserror::Error)]
pub enum SoakError {
    /// The scenario or its platform is invalid, or the lab could not build its parts.
    #[error(transparent)]
    Scenario(#[from] LabError),
    /// A soak parameter is out of range.
    #[error("Soak parameter {field}: expected {expected}, found {found}")]
    Param {
        /// The parameter.
        field: &'static str,
        /// What is accepted.
        expected: String,
        /// What was given, with its unit.
        found: String,
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

/// The experiment whose cell the soak runs by default (SEEDS.md #4).
pub const DEFAULT_EXPERIMENT: &str = "pseries-ddw";
/// The cell of [`DEFAULT_EXPERIMENT`] the soak runs by default: SEEDS.md #4's soak ran the
/// experiment's 64-thread write and read streams through the DDW dynamic window (the
/// direction is the soak's own).
pub const DEFAULT_CELL: &str = "64t.write.ddw";

/// What `--default-window` sets: the experiment's `default` column (the pre-2020 kernel
/// refuses a DDW too small to map all memory and maps through the default window only).
pub const DEFAULT_WINDOW_PATCH: [(&str, &str); 2] =
    [("mode", "default-window"), ("ddw_policy", "direct-only")];

/// A validated lab scenario the soak can run: a netperf workload on a NIC whose DMA goes
/// through a TCE window of the POWER IOMMU model.
#[derive(Clone, Debug)]
pub struct SoakScenario {
    /// The validated scenario.
    pub scenario: LabScenario,
    /// The scenario text the soak runs (with `--default-window`'s fields set, if asked).
    pub text: String,
    /// Where it came from, for messages and the results database.
    pub origin: String,
}

impl SoakScenario {
    /// Validates `text` (named `origin`; relative profile paths resolve against `base`)
    /// with the lab's own validation and checks the soak can run it: a netperf workload,
    /// and a window with an allocator and TCEs to check (`default-window` or
    /// `ddw-dynamic`, not a direct DDW). With `default_window`, a scenario in a DDW mode
    /// is run through the default window instead ([`DEFAULT_WINDOW_PATCH`]).
    pub fn prepare(
        text: &str,
        origin: &str,
        base: Option<&Path>,
        default_window: bool,
    ) -> Result<Self, SoakError> {
        let scenario = lab::validate(text, origin, base)?;
        let field = |path: &str, problem: String| -> SoakError {
            let e = match TomlDoc::parse(text, origin) {
                Ok(doc) => doc.field_error(path, problem),
                Err(e) => e,
            };
            SoakError::Scenario(LabError::Input(e))
        };
        if !matches!(scenario.workload, Workload::Netperf(_)) {
            return Err(field(
                "workload.kind",
                format!(
                    "expected \"netperf\": the soak streams TCP through the POWER TCE path (a netperf workload on a nic, iommu.model = \"pseries\"; e.g. scenarios/examples/netperf-pseries-ddw.toml), found \"{}\"",
                    scenario.workload.kind()
                ),
            ));
        }
        if scenario.iommu.mode == IommuMode::DdwDirect {
            return Err(field(
                "iommu.mode",
                "expected \"ddw-dynamic\" or \"default-window\": the soak checks a TCE window's allocator and table entries, and a direct DDW maps by offset with neither, found \"ddw-direct\"".to_owned(),
            ));
        }
        if !default_window || scenario.iommu.mode == IommuMode::DefaultWindow {
            return Ok(SoakScenario {
                scenario,
                text: text.to_owned(),
                origin: origin.to_owned(),
            });
        }
        let mut table: toml::Table =
            toml::from_str(text).map_err(|e| field("iommu", e.to_string()))?;
        let set: Vec<String> = DEFAULT_WINDOW_PATCH
            .iter()
            .map(|(k, v)| format!("iommu.{k} = \"{v}\""))
            .collect();
        for (k, v) in DEFAULT_WINDOW_PATCH {
            let path = format!("iommu.{k}");
            let steps = tomlpatch::parse_path(&path).map_err(|e| field(&path, e))?;
            tomlpatch::set_field(&mut table, &steps, toml::Value::String(v.to_owned()), true)
                .map_err(|e| field(&path, e))?;
        }
        let patched = format!(
            "# {origin} with --default-window: {}\n{}",
            set.join(", "),
            toml::to_string(&table).map_err(|e| field("iommu", e.to_string()))?
        );
        let origin = format!("{origin} (with --default-window: {})", set.join(", "));
        // The patched text is generated: its lines are not the user's, so errors name the
        // field only.
        let scenario = lab::validate(&patched, &origin, base)
            .map_err(|e| SoakError::Scenario(reproduce::without_position(e)))?;
        Ok(SoakScenario {
            scenario,
            text: patched,
            origin,
        })
    }

    /// The soak's default scenario: [`DEFAULT_CELL`] of the bundled [`DEFAULT_EXPERIMENT`]
    /// experiment (scenarios/experiments/pseries-ddw.toml), built as `iolab reproduce`
    /// builds it (`iolab reproduce pseries-ddw --emit-scenarios DIR` writes the same
    /// scenario as DIR/64t.write.ddw.toml).
    pub fn default_cell(default_window: bool) -> Result<Self, SoakError> {
        let (text, origin) = default_cell_text()?;
        Self::prepare(&text, &origin, None, default_window)
    }
}

/// The text and origin of the soak's default scenario (see [`SoakScenario::default_cell`]).
pub fn default_cell_text() -> Result<(String, String), SoakError> {
    let lab_err = |e: ReproduceError| match e {
        ReproduceError::Input(e) => LabError::Input(e),
        ReproduceError::Cell { source, .. } => *source,
    };
    let name = DEFAULT_EXPERIMENT;
    let file_origin = reproduce::bundled::origin(name);
    let text = reproduce::bundled::text(name)
        .ok_or_else(|| LabError::Model(format!("the bundled experiment `{name}` is missing")))?;
    let exp = Experiment::parse(text, &file_origin).map_err(lab_err)?;
    let cell = exp
        .file
        .cells()
        .into_iter()
        .find(|c| c.id == DEFAULT_CELL)
        .ok_or_else(|| {
            LabError::Input(InputError::Field {
                origin: file_origin.clone(),
                line: None,
                column: None,
                field: "rows".to_owned(),
                problem: format!("the soak's default cell `{DEFAULT_CELL}` is not a cell"),
            })
        })?;
    let table = exp.cell_table(&cell, 1).map_err(lab_err)?;
    let body = toml::to_string(&table).map_err(|e| LabError::Model(e.to_string()))?;
    Ok((
        format!(
            "# Cell {DEFAULT_CELL} of experiment {name} ({file_origin}): the soak's default scenario.\n{body}"
        ),
        format!("{file_origin}, cell {DEFAULT_CELL}"),
    ))
}

/// A mapping the soak holds: its buffer, and what the device did with it.
struct RefMapping {
    pa: u64,
    len: u64,
    dir: Direction,
    /// Device reads of the whole buffer (transmit).
    reads: u32,
    /// Bytes the device wrote since the mapping was made (receive: strides, in order,
    /// wrapping when the driver's page cache recycles the page).
    written: u64,
}

impl RefMapping {
    /// The record of `m`, a fresh mapping of the buffer at physical `pa`.
    fn of(m: &MappedBuffer, pa: u64) -> Self {
        RefMapping {
            pa,
            len: m.len(),
            dir: m.direction(),
            reads: 0,
            written: 0,
        }
    }
}

/// The soak's record of everything in flight, checked at every checkpoint: the hooks the
/// stream's loops call.
struct Checks {
    interval_ns: u64,
    message_bytes: u64,
    /// Bytes the device writes per message received (one stride per packet).
    rx_bytes_per_message: u64,
    reference: RefCell<BTreeMap<u64, RefMapping>>,
    /// Payload bytes per interval (write: by wire completion; read: by wire delivery).
    buckets: RefCell<Vec<u64>>,
    written: Cell<u64>,
    completed: Cell<u64>,
    in_flight: Cell<u64>,
    skbs: Cell<u64>,
    messages: Cell<u64>,
    device_bytes: Cell<u64>,
    /// Receive: bytes the device wrote into receive strides.
    rx_device_bytes: Cell<u64>,
    /// Maps and unmaps outside the timed DMA path (the interface's receive pages).
    untimed_maps: Cell<u64>,
    untimed_unmaps: Cell<u64>,
    /// Receive pages handed back by the threads when they finished, for the teardown.
    down: RefCell<Vec<VecDeque<MappedBuffer>>>,
    /// Per connection: the skbs posted and not yet completed (wire completion, bytes), in
    /// order.
    tx_posted: Vec<RefCell<VecDeque<(SimTime, u64)>>>,
    /// Per connection: the messages the remote sender sent and nobody read yet, in order.
    rx_sent: Vec<RefCell<VecDeque<(SimTime, SimTime)>>>,
    error: RefCell<Option<SoakError>>,
    /// Stop-the-world: set by the checker; threads park at their next message boundary.
    pause: Cell<bool>,
    parked: Cell<usize>,
    running: Cell<usize>,
    /// Virtual time the last thread finished draining.
    drained_at: Cell<u64>,
    resume: Vec<Channel<()>>,
}

type Shared = StreamShared<Checks>;

impl Checks {
    fn fail(&self, e: SoakError) {
        let mut err = self.error.borrow_mut();
        if err.is_none() {
            *err = Some(e);
        }
    }

    fn broken(&self, now: SimTime, what: String) -> SoakError {
        SoakError::Invariant {
            at_ns: now.as_ns(),
            what,
        }
    }

    fn count(&self, at: SimTime, bytes: u64) {
        let k = (at.as_ns() / self.interval_ns) as usize;
        if let Some(b) = self.buckets.borrow_mut().get_mut(k) {
            *b += bytes;
        }
    }

    /// Removes `dma` from the reference; `check` says whether the device must have used it
    /// fully first (a driver unmap), not at interface teardown.
    fn forget(&self, now: SimTime, m: &MappedBuffer, check: bool) -> Result<(), SoakError> {
        let dma = m.dma_addr().0;
        let r = self.reference.borrow_mut().remove(&dma);
        let Some(r) = r else {
            return Err(self.broken(now, format!("unmap of unknown {dma:#x}")));
        };
        if !check {
            return Ok(());
        }
        match r.dir {
            Direction::FromDevice if r.written == 0 || r.written % r.len != 0 => Err(self.broken(
                now,
                format!(
                    "receive page {dma:#x} unmapped after {} bytes written, not a whole number of pages",
                    r.written
                ),
            )),
            Direction::FromDevice => Ok(()),
            _ if r.reads == 1 => Ok(()),
            _ => Err(self.broken(
                now,
                format!("mapping {dma:#x} was read {} times, not once", r.reads),
            )),
        }
    }
}

impl StreamHooks for Checks {
    type Error = SoakError;

    fn failed(&self) -> bool {
        self.error.borrow().is_some()
    }

    fn mapped(&self, ctx: &Ctx, m: &MappedBuffer, pa: u64) -> Result<(), SoakError> {
        let dma = m.dma_addr().0;
        let old = self
            .reference
            .borrow_mut()
            .insert(dma, RefMapping::of(m, pa));
        if old.is_some() {
            return Err(self.broken(ctx.now(), format!("IOVA {dma:#x} handed out twice")));
        }
        Ok(())
    }

    fn accessed(&self, ctx: &Ctx, dma: u64, len: u64, access: Access) -> Result<(), SoakError> {
        let now = ctx.now();
        let mut reference = self.reference.borrow_mut();
        let Some((&start, r)) = reference.range_mut(..=dma).next_back() else {
            return Err(self.broken(now, format!("device access of unmapped {dma:#x}")));
        };
        if dma + len > start + r.len {
            return Err(self.broken(
                now,
                format!("device access {dma:#x}+{len} beyond the mapping at {start:#x}"),
            ));
        }
        match access {
            Access::Read if dma == start && len == r.len => r.reads += 1,
            Access::Write if dma - start == r.written % r.len => {
                r.written += len;
                self.rx_device_bytes.set(self.rx_device_bytes.get() + len);
            }
            _ => {
                return Err(self.broken(
                    now,
                    format!(
                        "device {access:?} of {dma:#x}+{len} out of order in the mapping at {start:#x} ({} bytes written)",
                        r.written
                    ),
                ))
            }
        }
        self.device_bytes.set(self.device_bytes.get() + len);
        Ok(())
    }

    fn unmapping(&self, ctx: &Ctx, m: &MappedBuffer) -> Result<(), SoakError> {
        self.forget(ctx.now(), m, true)
    }

    fn message_written(&self, _i: usize, bytes: u64) {
        self.written.set(self.written.get() + bytes);
        self.in_flight.set(self.in_flight.get() + bytes);
        self.messages.set(self.messages.get() + 1);
    }

    fn skb_sent(&self, _ctx: &Ctx, i: usize, bytes: u64, done: SimTime) -> Result<(), SoakError> {
        self.count(done, bytes);
        self.tx_posted[i].borrow_mut().push_back((done, bytes));
        Ok(())
    }

    fn skb_completed(&self, ctx: &Ctx, i: usize, skb: &TxEntry) -> Result<(), SoakError> {
        let expected = self.tx_posted[i].borrow_mut().pop_front();
        if expected != Some((skb.done, skb.bytes)) {
            return Err(self.broken(
                ctx.now(),
                format!(
                    "queue {i}: skb ({:?}, {} bytes) completed out of order or twice; expected {expected:?}",
                    skb.done, skb.bytes
                ),
            ));
        }
        self.in_flight.set(self.in_flight.get() - skb.bytes);
        self.completed.set(self.completed.get() + skb.bytes);
        self.skbs.set(self.skbs.get() + 1);
        Ok(())
    }

    fn message_sent(&self, i: usize, sent: SimTime, arrival: SimTime) {
        self.rx_sent[i].borrow_mut().push_back((sent, arrival));
    }

    fn message_read(
        &self,
        ctx: &Ctx,
        i: usize,
        sent: SimTime,
        arrival: SimTime,
    ) -> Result<(), SoakError> {
        let expected = self.rx_sent[i].borrow_mut().pop_front();
        if expected != Some((sent, arrival)) {
            return Err(self.broken(
                ctx.now(),
                format!(
                    "connection {i}: message ({sent:?}, {arrival:?}) read out of order, twice or never sent; expected {expected:?}"
                ),
            ));
        }
        self.count(arrival, self.message_bytes);
        self.completed
            .set(self.completed.get() + self.message_bytes);
        self.messages.set(self.messages.get() + 1);
        Ok(())
    }
}

/// Runs the soak on a prepared scenario.
pub fn run_soak(s: &SoakScenario, soak: &SoakConfig) -> Result<SoakReport, SoakError> {
    run_soak_observed(s, soak, |_| {})
}

/// [`run_soak`], calling `on_checkpoint(at_ns)` after each checkpoint passes (virtual time
/// of the checkpoint): for progress reports. It sees nothing else and changes nothing.
pub fn run_soak_observed(
    sc: &SoakScenario,
    soak: &SoakConfig,
    on_checkpoint: impl Fn(u64) + 'static,
) -> Result<SoakReport, SoakError> {
    let NetperfParts {
        profile,
        costs,
        link,
        stream,
        serialisation,
        pool_lock,
        iommu,
        dev,
        ..
    } = lab::netperf_parts(&sc.scenario)?;
    let scenario_threads = stream.threads;
    let threads = soak.threads.unwrap_or(scenario_threads);
    let param = |field, expected: String, found: String| SoakError::Param {
        field,
        expected,
        found,
    };
    let time = |ns: u64| crate::engine::SimDuration::ns(ns).to_string();
    if threads == 0 || threads > scenario_threads.max(1) {
        return Err(param(
            "threads",
            format!("1..={scenario_threads} (the scenario's workload.threads)"),
            threads.to_string(),
        ));
    }
    if soak.duration_ns == 0 || soak.duration_ns > MAX_SOAK_SECONDS * 1_000_000_000 {
        return Err(param(
            "duration",
            format!("1 ns..={MAX_SOAK_SECONDS} s"),
            time(soak.duration_ns),
        ));
    }
    if soak.interval_ns < MIN_INTERVAL_US * 1000 || soak.interval_ns > soak.duration_ns {
        return Err(param(
            "interval",
            format!(
                "{MIN_INTERVAL_US} us..=the duration ({})",
                time(soak.duration_ns)
            ),
            time(soak.interval_ns),
        ));
    }
    let intervals = soak.duration_ns / soak.interval_ns;
    if intervals > MAX_INTERVALS {
        return Err(param(
            "interval",
            format!("at most {MAX_INTERVALS} intervals in the duration"),
            time(soak.interval_ns),
        ));
    }
    let end_ns = intervals * soak.interval_ns;
    let mut cfg = stream;
    cfg.threads = threads;
    cfg.direction = match soak.direction {
        SoakDirection::Write => StreamDirection::Write,
        SoakDirection::Read => StreamDirection::Read,
    };
    cfg.run_ns = end_ns;
    cfg.warmup_ns = 0;
    let cpus = (profile.cpu.cores as usize).max(threads);
    let mut sim = Sim::for_machine(
        SimConfig {
            cpus,
            seed: soak.seed,
        },
        &profile,
    )?;
    let h = sim.handle().clone();
    // The interface comes up: every queue's receive pages are mapped (not timed), as in
    // the stream test.
    let rings = map_rx_rings(&cfg, &iommu, &dev, cpus)?;
    let dma = TceDma::new(
        &h,
        iommu.clone(),
        dev.clone(),
        &profile,
        serialisation,
        pool_lock,
    )?;
    let lnk = Link::new(link);
    let rx_bytes_per_message = lnk.config().packets(cfg.message_bytes) * cfg.rx_stride_bytes;
    let state = Rc::new(StreamShared {
        cfg,
        costs,
        dma,
        link: lnk,
        end: SimTime(end_ns),
        hooks: Checks {
            interval_ns: soak.interval_ns,
            message_bytes: cfg.message_bytes,
            rx_bytes_per_message,
            reference: RefCell::new(BTreeMap::new()),
            buckets: RefCell::new(vec![0; intervals as usize]),
            written: Cell::new(0),
            completed: Cell::new(0),
            in_flight: Cell::new(0),
            skbs: Cell::new(0),
            messages: Cell::new(0),
            device_bytes: Cell::new(0),
            rx_device_bytes: Cell::new(0),
            untimed_maps: Cell::new(0),
            untimed_unmaps: Cell::new(0),
            down: RefCell::new(Vec::new()),
            tx_posted: (0..threads)
                .map(|_| RefCell::new(VecDeque::new()))
                .collect(),
            rx_sent: (0..threads)
                .map(|_| RefCell::new(VecDeque::new()))
                .collect(),
            error: RefCell::new(None),
            pause: Cell::new(false),
            parked: Cell::new(0),
            running: Cell::new(threads),
            drained_at: Cell::new(0),
            resume: (0..threads).map(|_| Channel::new(&h, 1)).collect(),
        },
    });
    let c = &state.hooks;
    let mut rings: VecDeque<VecDeque<MappedBuffer>> = rings.into_iter().collect();
    for (q, ring) in rings.iter().enumerate() {
        for (k, m) in ring.iter().enumerate() {
            let pa = crate::workloads::netperf::rx_page_pa(&cfg, q, k as u64);
            c.reference
                .borrow_mut()
                .insert(m.dma_addr().0, RefMapping::of(m, pa));
            c.untimed_maps.set(c.untimed_maps.get() + 1);
        }
    }
    for i in 0..threads {
        let s = state.clone();
        let pages = rings.pop_front().unwrap_or_default();
        let finish = move |s: &Shared, ctx: &Ctx, r: Result<(), SoakError>| {
            if let Err(e) = r {
                s.hooks.fail(e);
            }
            s.hooks.running.set(s.hooks.running.get() - 1);
            s.hooks
                .drained_at
                .set(s.hooks.drained_at.get().max(ctx.now().as_ns()));
        };
        match soak.direction {
            SoakDirection::Write => {
                sim.spawn_on(i, move |ctx| async move {
                    let r = writer(&ctx, &s, i, pages).await;
                    finish(&s, &ctx, r);
                })?;
            }
            SoakDirection::Read => {
                let window = cfg.rx_window_messages.max(1);
                let data: Channel<(SimTime, SimTime)> = Channel::new(&h, window + 1);
                let credits: Channel<()> = Channel::new(&h, window + 1);
                for _ in 0..window {
                    let _ = credits.send(());
                }
                let (s2, d2, c2) = (s.clone(), data.clone(), credits.clone());
                sim.spawn_agent(move |ctx| async move { sender(&ctx, &s2, i, &d2, &c2).await })?;
                sim.spawn_on(i, move |ctx| async move {
                    let rx = RxConnection::new(&s.cfg, i, pages);
                    let r = reader(&ctx, &s, i, rx, &data, &credits).await;
                    finish(&s, &ctx, r);
                })?;
            }
        }
    }
    let reports: Rc<RefCell<Vec<IntervalReport>>> = Rc::new(RefCell::new(Vec::new()));
    {
        let (s, r) = (state.clone(), reports.clone());
        let (iommu, dev) = (iommu.clone(), dev.clone());
        sim.spawn_agent(move |ctx| async move {
            let c = &s.hooks;
            let on_checkpoint = &on_checkpoint;
            for k in 1..=intervals {
                ctx.sleep_until(SimTime(k * c.interval_ns)).await;
                if c.failed() {
                    return;
                }
                // Stop the world at message boundaries.
                c.pause.set(true);
                while c.parked.get() < c.running.get() && !c.failed() {
                    ctx.sleep_until(ctx.now() + SimDuration::ns(200)).await;
                }
                match checkpoint(&ctx, &s, &iommu, &dev) {
                    Ok(checked) => {
                        r.borrow_mut().push(IntervalReport {
                            at_ns: k * c.interval_ns,
                            gbps: 0.0,
                            live_mappings: iommu.live_mappings(),
                            mappings_checked: checked,
                        });
                        on_checkpoint(k * c.interval_ns);
                    }
                    Err(e) => c.fail(e),
                }
                c.pause.set(false);
                for ch in &c.resume {
                    let _ = ch.send(());
                }
            }
        })?;
    }
    // Generous horizon for the drain; the run ends when every task has.
    let _ = sim.run_until(SimTime(end_ns + end_ns / 10 + 1_000_000_000))?;
    if let Some(e) = c.error.borrow_mut().take() {
        return Err(e);
    }
    let now = SimTime(c.drained_at.get());
    let broken = |what: String| SoakError::Invariant {
        at_ns: now.as_ns(),
        what,
    };
    if c.running.get() != 0 {
        return Err(broken("threads did not finish draining".into()));
    }
    // The interface goes down (untimed, as it came up): every queue's receive pages are
    // unmapped, the threads' and the unused queues'.
    let down: Vec<VecDeque<MappedBuffer>> = c.down.borrow_mut().drain(..).collect();
    for ring in down.into_iter().chain(rings) {
        for m in ring {
            c.forget(now, &m, false)?;
            let mut w = WorkRecord::new();
            iommu
                .unmap_single(m, 0, now.as_ns(), &mut w)
                .map_err(|r| broken(format!("interface teardown: {}", r.error)))?;
            c.untimed_unmaps.set(c.untimed_unmaps.get() + 1);
        }
    }
    // Final: everything unmapped, nothing left in the table or the allocator.
    let live = iommu.live_mappings();
    let blocks = window_blocks(&iommu, &dev);
    if live != 0 || blocks != Some(0) || !c.reference.borrow().is_empty() {
        return Err(broken(format!(
            "after the drain: {live} live mappings, {blocks:?} allocator blocks, {} reference entries",
            c.reference.borrow().len()
        )));
    }
    let totals = state.dma.totals();
    let (maps, unmaps) = (
        totals.maps + c.untimed_maps.get(),
        totals.unmaps + c.untimed_unmaps.get(),
    );
    if maps != unmaps {
        return Err(broken(format!("{maps} maps but {unmaps} unmaps")));
    }
    if c.written.get() != c.completed.get() && soak.direction == SoakDirection::Write {
        return Err(broken(format!(
            "{} payload bytes written, {} completed",
            c.written.get(),
            c.completed.get()
        )));
    }
    if let Some((i, q)) = c
        .rx_sent
        .iter()
        .enumerate()
        .find(|(_, q)| !q.borrow().is_empty())
    {
        return Err(broken(format!(
            "connection {i}: {} messages sent and never read",
            q.borrow().len()
        )));
    }
    let mut intervals_out = reports.borrow().clone();
    if intervals_out.len() as u64 != intervals {
        return Err(broken(format!(
            "{} checkpoints ran, {intervals} expected",
            intervals_out.len()
        )));
    }
    let buckets = c.buckets.borrow();
    for (iv, &bytes) in intervals_out.iter_mut().zip(buckets.iter()) {
        iv.gbps = bytes as f64 * 8.0 / soak.interval_ns as f64;
    }
    let steady: Vec<f64> = intervals_out.iter().skip(1).map(|i| i.gbps).collect();
    let (mean_gbps, cv_pct) = mean_cv(&steady);
    Ok(SoakReport {
        scenario: sc.scenario.name.clone(),
        direction: soak.direction,
        threads,
        ddw: sc.scenario.iommu.mode == IommuMode::DdwDynamic,
        virtual_ns: now.as_ns(),
        intervals: intervals_out,
        mean_gbps,
        cv_pct,
        maps,
        unmaps,
        skbs: c.skbs.get(),
        messages: c.messages.get(),
        bytes: c.completed.get(),
        device_bytes: c.device_bytes.get(),
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
    s: &Shared,
    iommu: &iolab_iommu::hw::PseriesIommu,
    dev: &iolab_iommu::dma::Device,
) -> Result<usize, SoakError> {
    let now = ctx.now();
    let c = &s.hooks;
    let reference = c.reference.borrow();
    let live = iommu.live_mappings();
    if live != reference.len() {
        return Err(c.broken(
            now,
            format!(
                "the IOMMU holds {live} mappings, the reference {}",
                reference.len()
            ),
        ));
    }
    let blocks = window_blocks(iommu, dev);
    if blocks != Some(reference.len()) {
        return Err(c.broken(
            now,
            format!(
                "the window allocator holds {blocks:?} blocks, the reference {} mappings",
                reference.len()
            ),
        ));
    }
    let mut work = WorkRecord::new();
    for (&dma, r) in reference.iter() {
        let access = match r.dir {
            Direction::FromDevice => Access::Write,
            _ => Access::Read,
        };
        let got = iommu
            .translate(dev, DmaAddr(dma), r.len, access, &mut work)
            .map_err(|f| c.broken(now, format!("mapping {dma:#x} faults: {f:?}")))?;
        let merged = PhysRange::coalesce(got);
        let want = [PhysRange {
            pa: iolab_iommu::addr::PhysAddr::new(r.pa),
            len: r.len,
        }];
        if merged != want {
            return Err(c.broken(
                now,
                format!("mapping {dma:#x} translates to {merged:?}, not {want:?}"),
            ));
        }
    }
    if c.written.get() != c.completed.get() + c.in_flight.get()
        && s.cfg.direction == StreamDirection::Write
    {
        return Err(c.broken(
            now,
            format!(
                "payload: {} written != {} completed + {} in flight",
                c.written.get(),
                c.completed.get(),
                c.in_flight.get()
            ),
        ));
    }
    if s.cfg.direction == StreamDirection::Read {
        let want = (c.completed.get() / c.message_bytes.max(1)) * c.rx_bytes_per_message;
        if c.rx_device_bytes.get() != want {
            return Err(c.broken(
                now,
                format!(
                    "the device wrote {} bytes of receive strides for {} messages read, not {want}",
                    c.rx_device_bytes.get(),
                    c.completed.get() / c.message_bytes.max(1)
                ),
            ));
        }
    }
    let totals = s.dma.totals();
    if totals.maps + c.untimed_maps.get() - totals.unmaps - c.untimed_unmaps.get()
        != reference.len() as u64
    {
        return Err(c.broken(
            now,
            format!(
                "{} maps - {} unmaps != {} live",
                totals.maps + c.untimed_maps.get(),
                totals.unmaps + c.untimed_unmaps.get(),
                reference.len()
            ),
        ));
    }
    Ok(reference.len())
}

/// Parks a thread at a message boundary while the checker holds the world stopped.
async fn park(ctx: &Ctx, s: &Shared, i: usize) {
    let c = &s.hooks;
    c.parked.set(c.parked.get() + 1);
    c.resume[i].recv(ctx).await;
    c.parked.set(c.parked.get() - 1);
}

/// Hands a connection's receive pages back for the interface teardown (after the run,
/// untimed, as they were mapped).
fn teardown(s: &Shared, pages: VecDeque<MappedBuffer>) -> Result<(), SoakError> {
    s.hooks.down.borrow_mut().push(pages);
    Ok(())
}

/// One writer: the stream workload's transmit path, parked at checkpoints; then the drain.
async fn writer(
    ctx: &Ctx,
    s: &Shared,
    i: usize,
    rx_pages: VecDeque<MappedBuffer>,
) -> Result<(), SoakError> {
    let mut tx = TxConnection::new(&s.cfg, i);
    while ctx.now() < s.end && !s.hooks.failed() {
        if s.hooks.pause.get() {
            park(ctx, s, i).await;
            continue;
        }
        tx.write_message(ctx, s).await?;
    }
    // Drain: the corked tail goes out, the remaining completions arrive and are unmapped.
    if !s.hooks.failed() {
        tx.flush(ctx, s).await?;
    }
    while !tx.ring().is_empty() && !s.hooks.failed() {
        if let Some(at) = tx.ring().interrupt_at() {
            if at > ctx.now() {
                ctx.sleep_until(at).await;
            }
        }
        tx.complete(ctx, s).await?;
    }
    let left = s.hooks.tx_posted[i].borrow().len();
    if left != 0 && !s.hooks.failed() {
        return Err(s
            .hooks
            .broken(ctx.now(), format!("queue {i}: {left} skbs never completed")));
    }
    teardown(s, rx_pages)
}

/// One reader: the stream workload's receive path, parked at checkpoints; then it reads
/// what the remote sender had already sent.
async fn reader(
    ctx: &Ctx,
    s: &Shared,
    i: usize,
    mut rx: RxConnection,
    data: &Channel<(SimTime, SimTime)>,
    credits: &Channel<()>,
) -> Result<(), SoakError> {
    while ctx.now() < s.end && !s.hooks.failed() {
        if s.hooks.pause.get() {
            park(ctx, s, i).await;
            continue;
        }
        rx.read_message(ctx, s, data, credits).await?;
    }
    while !data.is_empty() && !s.hooks.failed() {
        rx.read_message(ctx, s, data, credits).await?;
    }
    teardown(s, rx.into_pages())
}
