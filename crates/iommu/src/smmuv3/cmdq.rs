//! The SMMUv3 command queue as the hardware sees it: a ring of `2^log2size` 16-byte slots,
//! a PROD register the driver writes and a CONS register the SMMU advances, and the SMMU's
//! consumer that applies commands in order.
//!
//! Both producer designs ([`SpinlockCmdq`](super::SpinlockCmdq),
//! [`LockFreeCmdq`](super::LockFreeCmdq)) own a [`Cmdq`] and implement [`CmdqProducer`].
//!
//! # Indices
//!
//! A queue position is `(wrap << log2size) | idx`, as in the PROD and CONS registers: `idx`
//! selects the slot and the wrap bit flips on every lap. The queue is empty when PROD and
//! CONS have the same index and the same wrap bit, and full when the indices match but the
//! wrap bits differ.
//!
//! # Who runs the hardware
//!
//! The crate knows nothing of time, so the SMMU's consumer cannot run "in the background".
//! Instead it is a plain function, [`Consumer::consume`], behind a mutex: whoever holds the
//! [`Consumer`] is the hardware for that moment. With [`ConsumerMode::SelfService`] (the
//! default) a driver thread that must wait for the hardware (for a `CMD_SYNC` to complete
//! or for free slots) runs the consumer itself ([`Cmdq::service`]) before looking again:
//! "self-service hardware". If another thread is running it, the waiter waits for that run
//! to end rather than spinning on it. No extra thread is needed, a single-threaded caller
//! never deadlocks, its work records are deterministic, and the loom models stay small.
//! Commands issued without a sync stay in the queue until some waiter (or
//! [`Cmdq::drain`]) runs the consumer, as they would sit in a real queue until the SMMU
//! got to them. With [`ConsumerMode::External`] waiters only poll, and the embedder (the
//! lab's IOMMU model, a test's hardware thread) runs the consumer at its own pace through
//! [`Cmdq::drain`] or [`Cmdq::consumer`].
//!
//! The effect of each command goes to a [`CommandSink`] (for example an IOTLB model).

use std::fmt;

use thiserror::Error;

use super::spec::{
    opcode, Command, CommandDecodeError, CommandEncodeError, RawCommand, SyncCs, CMD_BYTES,
    SYNC_MSIADDR_BITS,
};
use super::sync::{self, AtomicU32, AtomicU64, Backoff, Mutex, MutexGuard, Ordering};
use crate::addr::PhysAddr;
use crate::work::WorkRecord;

/// Smallest queue: two slots (`log2size` 1).
pub const MIN_LOG2SIZE: u32 = 1;
/// Largest queue this model allows: 2^16 slots (1 MiB of commands). The spec allows up to
/// 2^19; the cap keeps a scenario from allocating unbounded memory.
pub const MAX_LOG2SIZE: u32 = 16;
/// The value the queue's own `CMD_SYNC`s write into their slot on completion (as Linux: the
/// MSI clears the first 32 bits of the command, which hold the non-zero opcode).
pub const SYNC_MSI_DATA: u32 = 0;

/// Who runs the SMMU's consumer. See the module docs.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub enum ConsumerMode {
    /// A thread that waits for the hardware runs the consumer itself (default).
    #[default]
    SelfService,
    /// Only the embedder runs the consumer ([`Cmdq::drain`], [`Cmdq::consumer`]); waiters
    /// poll until it has. A wait with nobody running the consumer never ends.
    External,
}

/// How to build a command queue.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct CmdqConfig {
    /// Base-2 logarithm of the number of slots, in `MIN_LOG2SIZE..=MAX_LOG2SIZE`.
    pub log2size: u32,
    /// Physical address of slot 0 (`SMMU_CMDQ_BASE`), aligned to the queue's size in bytes
    /// (at least 32). `CMD_SYNC` MSIs target the sync's own slot at `base + idx * 16`.
    pub base: PhysAddr,
    /// Who runs the consumer.
    pub consumer: ConsumerMode,
}

impl Default for CmdqConfig {
    /// 256 slots (the queue size of the pre-2019 Linux driver) at 1 GiB, self-service.
    fn default() -> Self {
        CmdqConfig {
            log2size: 8,
            base: PhysAddr::new(0x4000_0000),
            consumer: ConsumerMode::SelfService,
        }
    }
}

impl CmdqConfig {
    /// The default configuration with `2^log2size` slots.
    pub fn with_log2size(log2size: u32) -> Self {
        CmdqConfig {
            log2size,
            ..Self::default()
        }
    }
}

/// Why a queue could not be built or a command list could not be issued. A failed `issue`
/// has written nothing to the queue.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum CmdqError {
    /// `log2size` is out of range.
    #[error("Command-queue log2size {log2size} is outside {min}..={max}")]
    BadSize {
        /// The size asked for.
        log2size: u32,
        /// [`MIN_LOG2SIZE`].
        min: u32,
        /// [`MAX_LOG2SIZE`].
        max: u32,
    },
    /// The base address is not aligned to the queue's size in bytes.
    #[error("Command-queue base {base} is not aligned to {align:#x} bytes")]
    MisalignedBase {
        /// The base given.
        base: PhysAddr,
        /// The alignment required.
        align: u64,
    },
    /// More slots (commands plus sync) than the queue holds in one go.
    #[error("Cannot issue {slots} commands at once into a queue of {capacity} slots")]
    TooManyCommands {
        /// Slots needed.
        slots: usize,
        /// Slots in the queue.
        capacity: usize,
    },
    /// The list holds a `CMD_SYNC`; the queue inserts and waits for syncs itself.
    #[error("Command {index} is a CMD_SYNC: ask for a sync with `sync = true` instead")]
    SyncInList {
        /// Position in the list.
        index: usize,
    },
    /// A command cannot be encoded.
    #[error("Command {index} cannot be encoded")]
    Encode {
        /// Position in the list.
        index: usize,
        /// What is wrong with it.
        #[source]
        source: CommandEncodeError,
    },
}

/// Where the hardware applies commands: an IOTLB model, a recorder in tests.
///
/// Calls are serialised (they happen while the [`Consumer`] is held) and come in queue
/// order, `CMD_SYNC`s included. A sink must not issue commands into the queue that calls
/// it: the consumer is held, so a wait for a sync would never end.
pub trait CommandSink: Send + Sync {
    /// Applies one command.
    fn apply(&self, cmd: &Command);

    /// An MSI write by a `CMD_SYNC` to an address outside the command queue (writes into
    /// the queue itself are performed by the queue). Ignored by default.
    fn msi_write(&self, addr: PhysAddr, data: u32) {
        let _ = (addr, data);
    }
}

/// A sink that ignores every command.
#[derive(Clone, Copy, Debug, Default)]
pub struct NullSink;

impl CommandSink for NullSink {
    fn apply(&self, _cmd: &Command) {}
}

impl<T: CommandSink + ?Sized> CommandSink for std::sync::Arc<T> {
    #[inline]
    fn apply(&self, cmd: &Command) {
        (**self).apply(cmd);
    }

    fn msi_write(&self, addr: PhysAddr, data: u32) {
        (**self).msi_write(addr, data);
    }
}

impl<T: CommandSink + ?Sized> CommandSink for &T {
    #[inline]
    fn apply(&self, cmd: &Command) {
        (**self).apply(cmd);
    }

    fn msi_write(&self, addr: PhysAddr, data: u32) {
        (**self).msi_write(addr, data);
    }
}

/// Which producer algorithm a queue uses.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum ProducerKind {
    /// One spinlock around every insertion (Linux before 5.4).
    Spinlock,
    /// Will Deacon's lock-free insertion with owner election (Linux 5.4, 2019; see `crate::linux`).
    LockFree,
}

impl ProducerKind {
    /// Both designs.
    pub const ALL: [ProducerKind; 2] = [ProducerKind::Spinlock, ProducerKind::LockFree];

    /// A stable snake_case name for reports.
    pub const fn name(self) -> &'static str {
        match self {
            ProducerKind::Spinlock => "spinlock",
            ProducerKind::LockFree => "lock_free",
        }
    }

    /// Builds a queue of this kind.
    pub fn build<S: CommandSink + 'static>(
        self,
        config: CmdqConfig,
        sink: S,
    ) -> Result<Box<dyn CmdqProducer<Sink = S>>, CmdqError> {
        Ok(match self {
            ProducerKind::Spinlock => Box::new(super::SpinlockCmdq::new(config, sink)?),
            ProducerKind::LockFree => Box::new(super::LockFreeCmdq::new(config, sink)?),
        })
    }
}

impl fmt::Display for ProducerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A driver-side command-queue producer: how CPUs insert commands.
pub trait CmdqProducer: Send + Sync {
    /// The sink the queue's hardware applies commands to.
    type Sink: CommandSink;

    /// Which algorithm this is.
    fn kind(&self) -> ProducerKind;

    /// The queue, its registers and its consumer.
    fn cmdq(&self) -> &Cmdq<Self::Sink>;

    /// Inserts `cmds` in order, then, if `sync`, a `CMD_SYNC`, and waits until the sync has
    /// completed (every command before it in the queue has been applied). Adds the work
    /// done (commands written, locks, CAS attempts, MMIO accesses, polls, syncs) to `work`.
    ///
    /// `cmds` must not contain a `CMD_SYNC`. Validation happens before anything is written.
    fn issue(&self, cmds: &[Command], sync: bool, work: &mut WorkRecord) -> Result<(), CmdqError>;
}

/// How many commands of a list [`validate`] keeps encoded (the common lists are a TLBI or
/// two; longer ones are encoded again when written).
const KEPT_ENCODINGS: usize = 4;

/// The encodings [`validate`] computed, so a producer does not encode a command twice.
pub(crate) struct Encoded {
    raw: [RawCommand; KEPT_ENCODINGS],
}

impl Encoded {
    /// Room for the encodings (all zero until [`validate_into`] fills them).
    #[inline]
    pub(crate) fn new() -> Self {
        Encoded {
            raw: [[0, 0]; KEPT_ENCODINGS],
        }
    }

    /// The encoding of `cmds[index]`, where `cmd` is that command of the validated list.
    #[inline]
    pub(crate) fn get(&self, index: usize, cmd: &Command) -> RawCommand {
        match self.raw.get(index) {
            Some(raw) => *raw,
            None => encode_valid(cmd),
        }
    }
}

/// Checks a command list before anything is written: no syncs, every command encodable.
/// Returns the encodings of the first commands.
#[inline]
pub(crate) fn validate(cmds: &[Command]) -> Result<Encoded, CmdqError> {
    let mut kept = Encoded::new();
    validate_into(cmds, &mut kept)?;
    Ok(kept)
}

/// [`validate`] into a caller's [`Encoded`] (which it overwrites), so that the encodings
/// are not copied out through the result.
#[inline]
pub(crate) fn validate_into(cmds: &[Command], kept: &mut Encoded) -> Result<(), CmdqError> {
    for (index, cmd) in cmds.iter().enumerate() {
        if cmd.is_sync() {
            return Err(CmdqError::SyncInList { index });
        }
        let raw = cmd
            .encode()
            .map_err(|source| CmdqError::Encode { index, source })?;
        if let Some(slot) = kept.raw.get_mut(index) {
            *slot = raw;
        }
    }
    Ok(())
}

/// Encodes a command that [`validate`] accepted.
pub(crate) fn encode_valid(cmd: &Command) -> RawCommand {
    // `validate` ran on this very command, so encoding succeeds; the fallback is
    // unreachable and would only ever enqueue an all-zero (illegal) command.
    cmd.encode().unwrap_or([0, 0])
}

/// Queue-position arithmetic for a ring of `2^log2size` slots.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Geometry {
    log2size: u32,
    /// `size - 1`: the index bits of a position.
    idx_mask: u32,
    /// `2 * size - 1`: the index and wrap bits of a position.
    pos_mask: u32,
    /// `min(size, 64)`: the bits of a valid-map word the queue uses.
    run_bits: u32,
}

impl Geometry {
    pub(crate) fn new(log2size: u32) -> Self {
        // Queues have at most 2^16 slots, so neither mask overflows.
        Geometry {
            log2size,
            idx_mask: (1 << log2size) - 1,
            pos_mask: (2 << log2size) - 1,
            run_bits: (1 << log2size).min(64),
        }
    }

    pub(crate) fn size(self) -> u32 {
        self.idx_mask + 1
    }

    /// The slots one word of a one-bit-per-slot map covers: `min(size, 64)`.
    pub(crate) fn run_bits(self) -> u32 {
        self.run_bits
    }

    /// Slot index of a position.
    pub(crate) fn idx(self, pos: u32) -> u32 {
        pos & self.idx_mask
    }

    /// Wrap bit of a position (0 or 1).
    pub(crate) fn wrp(self, pos: u32) -> u32 {
        (pos >> self.log2size) & 1
    }

    /// The position `n` slots after `pos`.
    pub(crate) fn inc(self, pos: u32, n: u32) -> u32 {
        pos.wrapping_add(n) & self.pos_mask
    }

    /// How many slots from `from` forward to `to`, for `to` at most one lap ahead.
    pub(crate) fn distance(self, from: u32, to: u32) -> u32 {
        to.wrapping_sub(from) & self.pos_mask
    }

    /// Free slots between producer and consumer, from the wrap bits as the hardware does.
    pub(crate) fn space(self, prod: u32, cons: u32) -> u32 {
        let (p, c) = (self.idx(prod), self.idx(cons));
        if self.wrp(prod) == self.wrp(cons) {
            self.size() - (p - c)
        } else {
            c - p
        }
    }

    pub(crate) fn has_space(self, prod: u32, cons: u32, n: u32) -> bool {
        self.space(prod, cons) >= n
    }

    /// Whether the queue is empty (same index, same wrap).
    pub(crate) fn is_empty(self, prod: u32, cons: u32) -> bool {
        prod == cons
    }

    /// Whether the queue is full (same index, different wrap).
    pub(crate) fn is_full(self, prod: u32, cons: u32) -> bool {
        self.idx(prod) == self.idx(cons) && self.wrp(prod) != self.wrp(cons)
    }
}

/// One 16-byte slot of queue memory.
struct Slot {
    words: [AtomicU64; 2],
}

/// What the consumer has done so far.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub struct ConsumerStats {
    /// Commands consumed (applied or skipped), `CMD_SYNC`s included.
    pub consumed: u64,
    /// `CMD_SYNC`s completed.
    pub syncs: u64,
    /// MSI writes performed (into the queue or to the sink).
    pub msi_writes: u64,
    /// Illegal commands skipped.
    pub illegal: u64,
    /// Why the most recent illegal command was illegal.
    pub last_error: Option<CommandDecodeError>,
}

/// An SMMUv3 command queue: slot memory, the PROD and CONS registers, and the consumer.
pub struct Cmdq<S> {
    geo: Geometry,
    base: PhysAddr,
    mode: ConsumerMode,
    slots: Box<[Slot]>,
    /// `SMMU_CMDQ_PROD`: written by the driver, read by the consumer.
    prod_reg: AtomicU32,
    /// `SMMU_CMDQ_CONS`: written by the consumer only, read by the driver.
    cons_reg: AtomicU32,
    consumer: Mutex<ConsumerStats>,
    sink: S,
    /// Word 0 of the queue's own `CMD_SYNC` (the same in every slot; only MSIADDR, in
    /// word 1, differs), or 0 if it cannot be encoded.
    sync_word0: u64,
    /// The queue's size in bytes.
    bytes: u64,
}

impl<S: fmt::Debug> fmt::Debug for Cmdq<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cmdq")
            .field("log2size", &self.geo.log2size)
            .field("base", &self.base)
            .field("mode", &self.mode)
            .field("prod", &self.prod_reg.load(Ordering::Relaxed))
            .field("cons", &self.cons_reg.load(Ordering::Relaxed))
            .field("sink", &self.sink)
            .finish_non_exhaustive()
    }
}

impl<S: CommandSink> Cmdq<S> {
    /// An empty queue (PROD = CONS = 0, all slots zero).
    pub fn new(config: CmdqConfig, sink: S) -> Result<Self, CmdqError> {
        if !(MIN_LOG2SIZE..=MAX_LOG2SIZE).contains(&config.log2size) {
            return Err(CmdqError::BadSize {
                log2size: config.log2size,
                min: MIN_LOG2SIZE,
                max: MAX_LOG2SIZE,
            });
        }
        let geo = Geometry::new(config.log2size);
        let align = (u64::from(geo.size()) * CMD_BYTES).max(32);
        if !config.base.is_aligned(align) {
            return Err(CmdqError::MisalignedBase {
                base: config.base,
                align,
            });
        }
        let slots = (0..geo.size())
            .map(|_| Slot {
                words: [AtomicU64::new(0), AtomicU64::new(0)],
            })
            .collect();
        Ok(Cmdq {
            geo,
            base: config.base,
            mode: config.consumer,
            slots,
            prod_reg: AtomicU32::new(0),
            cons_reg: AtomicU32::new(0),
            consumer: Mutex::new(ConsumerStats::default()),
            sink,
            sync_word0: encode_valid(&Command::sync_msi(config.base.get(), SYNC_MSI_DATA))[0],
            bytes: u64::from(geo.size()) * CMD_BYTES,
        })
    }

    /// Number of slots.
    pub fn capacity(&self) -> usize {
        self.geo.size() as usize
    }

    /// Base-2 logarithm of the number of slots.
    pub fn log2size(&self) -> u32 {
        self.geo.log2size
    }

    /// Physical address of slot 0.
    pub fn base(&self) -> PhysAddr {
        self.base
    }

    /// Who runs the consumer.
    pub fn consumer_mode(&self) -> ConsumerMode {
        self.mode
    }

    /// Physical address of the slot at queue position `pos`.
    pub fn slot_addr(&self, pos: u32) -> PhysAddr {
        self.base.add(u64::from(self.geo.idx(pos)) * CMD_BYTES)
    }

    /// The sink commands are applied to.
    pub fn sink(&self) -> &S {
        &self.sink
    }

    /// The PROD register: the position after the last command published to the hardware.
    pub fn prod(&self) -> u32 {
        self.prod_reg.load(Ordering::Acquire)
    }

    /// The CONS register: the position of the next command the hardware will consume.
    pub fn cons(&self) -> u32 {
        self.cons_reg.load(Ordering::Acquire)
    }

    /// Whether every published command has been consumed.
    pub fn is_idle(&self) -> bool {
        self.geo.is_empty(self.prod(), self.cons())
    }

    /// The raw words of the slot at `pos` (diagnostics).
    pub fn read_slot(&self, pos: u32) -> RawCommand {
        let slot = &self.slots[self.geo.idx(pos) as usize];
        [
            slot.words[0].load(Ordering::Acquire),
            slot.words[1].load(Ordering::Acquire),
        ]
    }

    /// Takes the consumer (the hardware) if nobody else is running it.
    pub fn try_consumer(&self) -> Option<Consumer<'_, S>> {
        sync::try_lock(&self.consumer).map(|stats| Consumer { q: self, stats })
    }

    /// Takes the consumer, waiting for whoever runs it now.
    pub fn consumer(&self) -> Consumer<'_, S> {
        Consumer {
            q: self,
            stats: sync::lock(&self.consumer),
        }
    }

    /// The self-service step waiters take: runs the consumer over every published command
    /// into the queue's sink, first waiting for a run in progress on another thread to end
    /// (runs are short and never wait themselves). When it returns, everything published
    /// before the call has completed, MSIs included. Returns the number of commands this
    /// call consumed. It adds nothing to a [`WorkRecord`]: it is the SMMU's work, not the
    /// CPU's.
    ///
    /// Waiting on a run in progress rather than spinning until it ends keeps at most one
    /// thread busy-waiting on the consumer, which also keeps the loom models finite.
    pub fn service(&self) -> usize {
        self.drain()
    }

    /// Runs the consumer until every published command is consumed, waiting for the
    /// consumer if another thread holds it. Returns the number consumed by this call.
    pub fn drain(&self) -> usize {
        self.consumer()
            .consume(usize::MAX, |cmd| self.sink.apply(cmd))
    }

    /// The consumer's counters (waits for the consumer if it is running).
    pub fn stats(&self) -> ConsumerStats {
        *sync::lock(&self.consumer)
    }

    pub(crate) fn geometry(&self) -> Geometry {
        self.geo
    }

    pub(crate) fn self_service(&self) -> bool {
        self.mode == ConsumerMode::SelfService
    }

    /// Writes an encoded command into the slot at `pos`, which the caller has reserved.
    /// Counts one command written.
    pub(crate) fn write_slot(&self, pos: u32, raw: RawCommand, work: &mut WorkRecord) {
        // Checker (debug builds and loom models): the slot's previous occupant, one lap
        // back, must have been consumed. This reads the CONS register, which the real
        // algorithms do not do here, so release builds leave it out.
        #[cfg(any(debug_assertions, loom))]
        {
            let cons = self.cons_reg.load(Ordering::Acquire);
            assert!(
                self.geo.distance(cons, pos) < self.geo.size(),
                "command queue overwrote an unconsumed slot: writing position {pos:#x} with CONS at {cons:#x}"
            );
        }
        let slot = &self.slots[self.geo.idx(pos) as usize];
        slot.words[0].store(raw[0], Ordering::Relaxed);
        slot.words[1].store(raw[1], Ordering::Relaxed);
        work.commands_written += 1;
    }

    /// The `CMD_SYNC` that goes into position `pos`: an MSI into its own slot.
    pub(crate) fn sync_for(&self, pos: u32) -> RawCommand {
        let addr = self.slot_addr(pos).get();
        // Word 0 does not depend on the address, and word 1 is the address itself when it
        // fits MSIADDR: exactly the encoding, without re-checking every field. Every slot's
        // address fits when slot 0's does (the base is aligned to the queue's size, so a
        // slot's address is the base with index bits below bit 21 added), and slot 0's fits
        // exactly when `sync_word0` could be encoded.
        if self.sync_word0 != 0 {
            debug_assert_eq!(addr & !SYNC_MSIADDR_BITS, 0);
            [self.sync_word0, addr]
        } else {
            encode_valid(&Command::sync_msi(addr, SYNC_MSI_DATA))
        }
    }

    /// Publishes everything before `prod` to the hardware: one MMIO write of PROD.
    pub(crate) fn publish(&self, prod: u32, work: &mut WorkRecord) {
        self.prod_reg.store(prod, Ordering::Release);
        work.mmio_writes += 1;
    }

    /// Reads the CONS register: one MMIO read.
    pub(crate) fn read_cons(&self, work: &mut WorkRecord) -> u32 {
        work.mmio_reads += 1;
        self.cons_reg.load(Ordering::Acquire)
    }

    /// Whether the queue's own sync at `pos` has written its MSI.
    fn sync_done(&self, pos: u32) -> bool {
        let w0 = self.slots[self.geo.idx(pos) as usize].words[0].load(Ordering::Acquire);
        w0 as u32 == SYNC_MSI_DATA
    }

    /// Waits for the queue's own `CMD_SYNC` at `pos` to complete by polling its slot for
    /// the MSI write, running the consumer meanwhile in self-service mode. The caller must
    /// keep the slot from being reused until this returns (the spinlock, or the shared lock
    /// of the lock-free design). Counts one poll per look that found it not yet done, and
    /// one sync.
    pub(crate) fn wait_sync(&self, pos: u32, work: &mut WorkRecord) {
        let mut backoff = Backoff::new();
        while !self.sync_done(pos) {
            work.polls += 1;
            if self.self_service() && self.service() > 0 {
                continue;
            }
            backoff.snooze();
        }
        work.inval_syncs += 1;
    }

    /// Performs a 32-bit MSI write: into queue memory when `addr` falls in the queue,
    /// otherwise to the sink.
    fn msi_write(&self, addr: u64, data: u32) {
        let offset = addr.wrapping_sub(self.base.get());
        if offset < self.bytes {
            let slot = &self.slots[(offset / CMD_BYTES) as usize];
            let word = &slot.words[((offset / 8) & 1) as usize];
            // MSIADDR is 4-byte aligned: the write hits the low or the high half.
            let shift = (offset & 4) * 8;
            let old = word.load(Ordering::Relaxed);
            let new = (old & !(0xffff_ffffu64 << shift)) | (u64::from(data) << shift);
            word.store(new, Ordering::Release);
        } else {
            self.sink.msi_write(PhysAddr::new(addr), data);
        }
    }
}

/// Exclusive access to the queue's consumer: whoever holds it is the SMMU.
pub struct Consumer<'a, S> {
    q: &'a Cmdq<S>,
    stats: MutexGuard<'a, ConsumerStats>,
}

impl<S: CommandSink> Consumer<'_, S> {
    /// Commands published and not yet consumed.
    pub fn pending(&self) -> usize {
        let geo = self.q.geo;
        geo.distance(
            self.q.cons_reg.load(Ordering::Relaxed),
            self.q.prod_reg.load(Ordering::Acquire),
        ) as usize
    }

    /// Consumes up to `max` published commands in queue order, calling `apply` on each
    /// (the queue's own sink is not called: pass `|c| q.sink().apply(c)` for that). Returns
    /// how many were consumed.
    ///
    /// CONS advances past each command as it completes. A `CMD_SYNC` with `CS = SIG_IRQ`
    /// and a non-zero MSIADDR then performs its MSI write; the write comes after CONS has
    /// passed the sync, so a waiter that sees it may treat the slot as free (Linux does).
    /// An illegal command (`CERROR_ILL`) is counted in [`ConsumerStats`] and skipped, as
    /// Linux's error handler does by rewriting it into a `CMD_SYNC`.
    pub fn consume(&mut self, max: usize, mut apply: impl FnMut(&Command)) -> usize {
        let q = self.q;
        let geo = q.geo;
        let prod = q.prod_reg.load(Ordering::Acquire);
        // Only the consumer writes CONS, and we are the consumer.
        let mut cons = q.cons_reg.load(Ordering::Relaxed);
        let mut done = 0;
        while done < max && cons != prod {
            let slot = &q.slots[geo.idx(cons) as usize];
            let raw = [
                slot.words[0].load(Ordering::Relaxed),
                slot.words[1].load(Ordering::Relaxed),
            ];
            cons = geo.inc(cons, 1);
            // The two commands of every strict unmap have their own decoding arm, so each
            // arm hands on a command of one known kind (one shared decoding would first
            // rebuild every command in a common form). Same decoding, same effects.
            match Command::raw_opcode(raw) {
                opcode::TLBI_NH_VA => {
                    self.complete(Command::decode_tlbi_nh_va(raw), cons, &mut apply);
                }
                opcode::CMD_SYNC => self.complete(Command::decode_sync(raw), cons, &mut apply),
                _ => self.complete(Command::decode(raw), cons, &mut apply),
            }
            self.stats.consumed += 1;
            done += 1;
        }
        done
    }

    /// The consumer's counters.
    pub fn stats(&self) -> ConsumerStats {
        *self.stats
    }

    /// Completes one consumed command (CONS already advanced to `cons`): applies it and
    /// performs a sync's MSI, or counts it illegal.
    #[inline(always)]
    fn complete(
        &mut self,
        decoded: Result<Command, CommandDecodeError>,
        cons: u32,
        apply: &mut impl FnMut(&Command),
    ) {
        let q = self.q;
        // By reference: `apply` reads the decoded command where decoding left it.
        match decoded {
            Ok(ref cmd) => {
                apply(cmd);
                q.cons_reg.store(cons, Ordering::Release);
                if let Command::Sync {
                    cs,
                    msi_addr,
                    msi_data,
                    ..
                } = *cmd
                {
                    self.stats.syncs += 1;
                    if cs == SyncCs::Irq && msi_addr != 0 {
                        q.msi_write(msi_addr, msi_data);
                        self.stats.msi_writes += 1;
                    }
                }
            }
            Err(e) => {
                self.stats.illegal += 1;
                self.stats.last_error = Some(e);
                q.cons_reg.store(cons, Ordering::Release);
            }
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn geometry_full_and_empty_from_wrap_bits() {
        let g = Geometry::new(2);
        // 4 slots: positions 0..8, wrap bit is bit 2.
        assert!(g.is_empty(0, 0));
        assert!(g.is_empty(5, 5));
        assert!(g.is_full(4, 0));
        assert!(g.is_full(1, 5));
        assert!(!g.is_full(3, 0));
        assert_eq!(g.space(0, 0), 4);
        assert_eq!(g.space(3, 0), 1);
        assert_eq!(g.space(4, 0), 0);
        // prod wrapped to idx 1 (pos 5), cons at idx 2 (pos 2): 1 free slot.
        assert_eq!(g.space(5, 2), 1);
        assert_eq!(g.inc(7, 1), 0);
        assert_eq!(g.inc(6, 3), 1);
        assert_eq!(g.distance(6, 1), 3);
    }

    #[test]
    fn geometry_space_matches_modular_distance() {
        for log2 in 1..=4 {
            let g = Geometry::new(log2);
            let n = g.size();
            for cons in 0..2 * n {
                for used in 0..=n {
                    let prod = g.inc(cons, used);
                    assert_eq!(
                        g.space(prod, cons),
                        n - used,
                        "log2 {log2} cons {cons} used {used}"
                    );
                    assert_eq!(g.is_full(prod, cons), used == n);
                    assert_eq!(g.is_empty(prod, cons), used == 0);
                }
            }
        }
    }

    /// The precomputed masks give the arithmetic of the plain formulas on every queue size.
    #[test]
    fn geometry_masks_match_the_formulas() {
        for log2 in MIN_LOG2SIZE..=MAX_LOG2SIZE {
            let g = Geometry::new(log2);
            let size = 1u32 << log2;
            assert_eq!(g.size(), size);
            assert_eq!(g.run_bits(), size.min(64));
            for pos in [
                0,
                1,
                size - 1,
                size,
                size + 1,
                2 * size - 1,
                0x1234_5678,
                u32::MAX,
            ] {
                assert_eq!(g.idx(pos), pos % size, "log2 {log2} pos {pos:#x}");
                for n in [0, 1, size - 1, size] {
                    assert_eq!(g.inc(pos, n), pos.wrapping_add(n) % (2 * size));
                    assert_eq!(g.distance(pos, n), n.wrapping_sub(pos) % (2 * size));
                }
            }
        }
    }

    #[test]
    fn config_is_validated() {
        assert!(matches!(
            Cmdq::new(CmdqConfig::with_log2size(0), NullSink),
            Err(CmdqError::BadSize { .. })
        ));
        assert!(matches!(
            Cmdq::new(CmdqConfig::with_log2size(17), NullSink),
            Err(CmdqError::BadSize { .. })
        ));
        let cfg = CmdqConfig {
            base: PhysAddr::new(0x1010),
            ..CmdqConfig::with_log2size(4)
        };
        assert_eq!(
            Cmdq::new(cfg, NullSink).unwrap_err(),
            CmdqError::MisalignedBase {
                base: PhysAddr::new(0x1010),
                align: 0x100
            }
        );
    }

    #[test]
    fn consumer_applies_in_order_and_writes_sync_msi_into_its_slot() {
        let q = Cmdq::new(CmdqConfig::with_log2size(2), NullSink).unwrap();
        let mut work = WorkRecord::new();
        let a = Command::TlbiNhAsid { vmid: 0, asid: 1 };
        q.write_slot(0, a.encode().unwrap(), &mut work);
        q.write_slot(1, q.sync_for(1), &mut work);
        q.publish(2, &mut work);
        assert!(!q.sync_done(1));
        let mut seen = Vec::new();
        assert_eq!(q.consumer().consume(usize::MAX, |c| seen.push(*c)), 2);
        assert_eq!(seen[0], a);
        assert!(seen[1].is_sync());
        assert!(q.sync_done(1));
        // The MSI cleared the low 32 bits of word 0 only; word 1 still holds MSIADDR.
        assert_eq!(q.read_slot(1)[1], q.slot_addr(1).get());
        assert_eq!(q.cons(), 2);
        let stats = q.stats();
        assert_eq!((stats.consumed, stats.syncs, stats.msi_writes), (2, 1, 1));
        assert_eq!(work.commands_written, 2);
        assert_eq!(work.mmio_writes, 1);
    }

    #[test]
    fn sync_for_is_the_encoding_of_the_slot_sync() {
        for (log2, base) in [(1, 0x20u64), (4, 0x4000_0000), (8, 0xf_ffff_f000), (16, 0)] {
            let cfg = CmdqConfig {
                base: PhysAddr::new(base),
                ..CmdqConfig::with_log2size(log2)
            };
            let q = Cmdq::new(cfg, NullSink).unwrap();
            for pos in 0..(2u32 << log2).min(600) {
                let want = encode_valid(&Command::sync_msi(q.slot_addr(pos).get(), SYNC_MSI_DATA));
                assert_eq!(
                    q.sync_for(pos),
                    want,
                    "log2 {log2} base {base:#x} pos {pos}"
                );
            }
        }
        // A queue whose slots MSIADDR cannot hold (bit 52 and up) gets the fallback.
        let cfg = CmdqConfig {
            base: PhysAddr::new(1 << 52),
            ..CmdqConfig::with_log2size(2)
        };
        let q = Cmdq::new(cfg, NullSink).unwrap();
        assert_eq!(q.sync_for(1), [0, 0]);
    }

    #[test]
    fn validate_keeps_the_encodings_of_the_first_commands() {
        let cmds: Vec<Command> = (0..7u16)
            .map(|asid| Command::TlbiNhAsid { vmid: 0, asid })
            .collect();
        let kept = validate(&cmds).unwrap();
        for (i, cmd) in cmds.iter().enumerate() {
            assert_eq!(kept.get(i, cmd), cmd.encode().unwrap(), "command {i}");
        }
        assert_eq!(
            validate(&[Command::TlbiNsnhAll, Command::sync_msi(0, 0)]).err(),
            Some(CmdqError::SyncInList { index: 1 })
        );
    }

    #[test]
    fn consumer_respects_max_and_skips_illegal_commands() {
        let q = Cmdq::new(CmdqConfig::with_log2size(2), NullSink).unwrap();
        let mut work = WorkRecord::new();
        q.write_slot(0, [0xff, 0], &mut work);
        q.write_slot(1, Command::TlbiNsnhAll.encode().unwrap(), &mut work);
        q.publish(2, &mut work);
        let mut seen = Vec::new();
        assert_eq!(q.consumer().consume(1, |c| seen.push(*c)), 1);
        assert!(seen.is_empty());
        assert_eq!(q.consumer().pending(), 1);
        assert_eq!(q.consumer().consume(9, |c| seen.push(*c)), 1);
        assert_eq!(seen, vec![Command::TlbiNsnhAll]);
        let stats = q.stats();
        assert_eq!(stats.illegal, 1);
        assert_eq!(
            stats.last_error,
            Some(CommandDecodeError::UnknownOpcode { opcode: 0xff })
        );
    }

    #[test]
    fn msi_outside_the_queue_goes_to_the_sink() {
        struct Msis(std::sync::Mutex<Vec<(PhysAddr, u32)>>);
        impl CommandSink for Msis {
            fn apply(&self, _cmd: &Command) {}
            fn msi_write(&self, addr: PhysAddr, data: u32) {
                self.0.lock().unwrap().push((addr, data));
            }
        }
        let q = Cmdq::new(CmdqConfig::with_log2size(1), Msis(Default::default())).unwrap();
        let mut work = WorkRecord::new();
        let sync = Command::sync_msi(0x9000, 7);
        q.write_slot(0, sync.encode().unwrap(), &mut work);
        q.publish(1, &mut work);
        assert_eq!(q.drain(), 1);
        assert_eq!(
            *q.sink().0.lock().unwrap(),
            vec![(PhysAddr::new(0x9000), 7)]
        );
    }

    #[test]
    #[should_panic(expected = "overwrote an unconsumed slot")]
    #[cfg(debug_assertions)]
    fn overwriting_an_unconsumed_slot_is_caught() {
        let q = Cmdq::new(CmdqConfig::with_log2size(1), NullSink).unwrap();
        let mut work = WorkRecord::new();
        // Position 2 is slot 0 one lap on, while CONS is still at 0.
        q.write_slot(2, [0x30, 0], &mut work);
    }
}
