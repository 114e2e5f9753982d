//! The discrete-event executor: virtual time, virtual CPUs and simulated threads.
//!
//! A [`Sim`] owns a machine of 1 to [`MAX_CPUS`] virtual CPUs. Simulated threads are
//! `async` tasks: [`Sim::spawn_on`] pins one to a CPU, [`Sim::spawn_agent`] starts one that
//! needs no CPU (a device model, a load generator, an interrupt source). Tasks pass time
//! only by awaiting the engine's primitives:
//!
//! - [`Cpu::spend`] keeps the task's CPU busy for a span, charged to an [`Account`];
//! - [`Ctx::sleep`] / [`Ctx::sleep_until`] block the task (its CPU is free meanwhile);
//! - [`Completion`] and [`Channel`] (in [`sync`]) block until another task or a device
//!   model fires or sends;
//! - the [`resources`](crate::resources) (spinlocks, sleeping locks, cache lines).
//!
//! # Scheduling model
//!
//! A CPU runs one task at a time. A task *owns* its CPU from the moment it is scheduled
//! until it blocks (awaits something that is not a spend or a spin) or finishes; spends
//! and spins in between keep the CPU. Tasks woken while their CPU is owned wait on that
//! CPU's FIFO run queue. There is no preemption and no migration: a simulated thread
//! runs until it blocks, as a kernel thread with preemption disabled would. Code between
//! two awaits takes no virtual time.
//!
//! # Determinism
//!
//! Wake-ups are totally ordered by `(time, sequence number)`; there are no host threads,
//! no wall clock and no hash-order dependence; each task's random numbers come from its
//! own xoshiro256** stream derived from the run seed and the task's spawn index. A run is
//! therefore a pure function of the scenario and the seed. (A foreign future that wakes
//! its task from another host thread would break this; the engine's own primitives never
//! do.)

pub(crate) mod kernel;
pub(crate) mod queue;
pub mod rng;
pub mod sync;
pub mod topology;

use std::cell::{Cell, RefCell, RefMut};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};

use crate::accounting::{Account, RunReport};
/// Virtual time lives in [`crate::time`], a leaf module that the engine and the accounting
/// both use; it is re-exported here, where the engine's users have always found it.
pub use crate::time::{self, SimDuration, SimTime};
use kernel::{Burn, Kernel, TaskRef, NO_CPU};
pub use rng::Rng;
pub use sync::{Channel, Completion, Full};
pub use topology::{Topology, TransferCosts};

/// The largest number of virtual CPUs a machine may have.
pub const MAX_CPUS: usize = 1024;

/// Errors of the engine. Library code returns them; nothing panics on bad input.
#[derive(Clone, PartialEq, Eq, Debug, thiserror::Error)]
pub enum SimError {
    /// The machine's CPU count is out of range.
    #[error("CPU count {cpus} is outside 1..={max}")]
    CpuCount {
        /// The requested count.
        cpus: usize,
        /// The largest allowed count.
        max: usize,
    },
    /// A task was pinned to a CPU the machine does not have.
    #[error("CPU {cpu} does not exist (the machine has {cpus})")]
    NoSuchCpu {
        /// The requested CPU.
        cpu: usize,
        /// The machine's CPU count.
        cpus: usize,
    },
    /// Spawning would exceed the live-task cap.
    #[error("Too many live tasks (the cap is {max})")]
    TooManyTasks {
        /// The cap.
        max: usize,
    },
    /// Scheduling would exceed the pending-event cap; the run stops.
    #[error("Too many pending events (the cap is {max})")]
    TooManyEvents {
        /// The cap.
        max: usize,
    },
    /// Creating a lock or cache line would exceed the resource cap.
    #[error("Too many resources (the cap is {max})")]
    TooManyResources {
        /// The cap.
        max: usize,
    },
    /// A task without a CPU (an agent) tried to acquire a lock: the acquire cost (and a
    /// spinlock's spinning) needs a CPU. The run stops with this error.
    #[error("{task:?} is an agent and has no CPU to {what}")]
    NoCpu {
        /// The agent.
        task: TaskId,
        /// What it tried to do.
        what: &'static str,
    },
}

/// The machine to simulate.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct SimConfig {
    /// Virtual CPUs, 1 to [`MAX_CPUS`].
    pub cpus: usize,
    /// The run's seed; every random number in the run derives from it.
    pub seed: u64,
}

/// Caps on the state a scenario can grow (see STYLE.md, "bounded state").
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Limits {
    /// Live tasks at once.
    pub max_tasks: usize,
    /// Wake-ups pending at once.
    pub max_pending_events: usize,
    /// Locks and cache lines created.
    pub max_resources: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_tasks: 1 << 20,
            max_pending_events: 1 << 24,
            max_resources: 1 << 16,
        }
    }
}

/// A task's identity, stable for the task's life (slots are reused after it finishes,
/// with a new generation).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TaskId(pub(crate) TaskRef);

impl fmt::Debug for TaskId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "task{}.{}", self.0 & 0xffff_ffff, self.0 >> 32)
    }
}

/// A cheap, clonable handle to a running simulation: the clock, spawning, and the factory
/// argument of resources. Single-threaded (`!Send`).
#[derive(Clone)]
pub struct Handle(pub(crate) Rc<Kernel>);

impl Handle {
    /// The current virtual time.
    pub fn now(&self) -> SimTime {
        SimTime(self.0.st.borrow().now)
    }

    /// The machine's CPU count.
    pub fn cpus(&self) -> usize {
        self.0.st.borrow().cpu_count()
    }

    /// What moving a cache line from CPU `from` to CPU `to` costs: the topology's distance
    /// cost, or `flat_ns` without a topology (0 for the same CPU).
    pub fn transfer_ns(&self, from: usize, to: usize, flat_ns: u64) -> u64 {
        self.0
            .st
            .borrow()
            .transfer_ns(from as u32, to as u32, flat_ns)
    }

    /// Places the CPUs in `topology`: from now on a cache line (and a lock's hand-off)
    /// moving between two CPUs costs the transfer at their distance.
    pub fn set_topology(&self, topology: Topology) {
        self.0.st.borrow_mut().topology = Some(Box::new(topology));
    }

    /// Spawns a task pinned to `cpu`; it first runs at the current time.
    pub fn spawn_on<F, Fut>(&self, cpu: usize, f: F) -> Result<TaskId, SimError>
    where
        F: FnOnce(Ctx) -> Fut,
        Fut: Future<Output = ()> + 'static,
    {
        self.0.spawn(Some(cpu), f)
    }

    /// Spawns an agent: a task with no CPU (device models, load generators). It may sleep
    /// and wait, but not spend CPU time.
    pub fn spawn_agent<F, Fut>(&self, f: F) -> Result<TaskId, SimError>
    where
        F: FnOnce(Ctx) -> Fut,
        Fut: Future<Output = ()> + 'static,
    {
        self.0.spawn(None, f)
    }

    /// Runs `f` at virtual time `at`: a timer callback for device models (a completion
    /// posted when the device finishes). The run is exactly that of
    /// `spawn_agent(move |ctx| async move { ctx.sleep_until(at).await; f() })` (same events,
    /// same order, same spawn index consumed, same task counts), without the task: no
    /// future, waker or task slot is allocated. `f` runs outside any task, so it cannot
    /// await; it may send, fire completions and spawn. Errors as `spawn_agent`.
    pub fn call_at(&self, at: SimTime, f: impl FnOnce() + 'static) -> Result<(), SimError> {
        self.0.call_at(at.0, f)
    }

    /// The report as of now (the run may continue afterwards).
    pub fn report(&self) -> RunReport {
        self.0.report()
    }

    /// The simulation's timeline recorder (see [`crate::trace`]); off unless tracing.
    #[inline]
    pub fn tracer(&self) -> &crate::trace::Tracer {
        &self.0.tracer
    }
}

impl fmt::Debug for Handle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Handle").field("now", &self.now()).finish()
    }
}

/// A simulation: a machine, its tasks and its resources.
///
/// ```
/// use iolab_sim::engine::{Sim, SimConfig, SimDuration, SimTime};
/// use iolab_sim::accounting::Account;
///
/// let mut sim = Sim::new(SimConfig { cpus: 2, seed: 1 }).unwrap();
/// sim.spawn_on(0, |ctx| async move {
///     ctx.cpu().spend(SimDuration::us(3), Account::System).await;
///     ctx.sleep(SimDuration::us(7)).await;
/// })
/// .unwrap();
/// let report = sim.run().unwrap();
/// assert_eq!(report.end, SimTime::from_us(10));
/// assert_eq!(report.cpus[0].system, 3_000);
/// assert_eq!(report.cpus[0].idle, 7_000);
/// assert!(report.is_conserved());
/// ```
pub struct Sim {
    h: Handle,
}

impl Sim {
    /// A machine with default [`Limits`].
    pub fn new(config: SimConfig) -> Result<Sim, SimError> {
        Sim::with_limits(config, Limits::default())
    }

    /// A machine with default [`Limits`] whose CPUs sit in `profile`'s topology (if it has
    /// one): what every lab run builds.
    pub fn for_machine(
        config: SimConfig,
        profile: &crate::cost::PlatformProfile,
    ) -> Result<Sim, SimError> {
        let sim = Sim::new(config)?;
        if let Some(t) = profile.engine_topology() {
            sim.handle().set_topology(t);
        }
        Ok(sim)
    }

    /// A machine with explicit caps.
    pub fn with_limits(config: SimConfig, limits: Limits) -> Result<Sim, SimError> {
        if config.cpus == 0 || config.cpus > MAX_CPUS {
            return Err(SimError::CpuCount {
                cpus: config.cpus,
                max: MAX_CPUS,
            });
        }
        Ok(Sim {
            h: Handle(Rc::new(Kernel::new(config.cpus, config.seed, limits))),
        })
    }

    /// A handle for creating resources and spawning from outside tasks.
    pub fn handle(&self) -> &Handle {
        &self.h
    }

    /// The current virtual time.
    pub fn now(&self) -> SimTime {
        self.h.now()
    }

    /// Spawns a task pinned to `cpu` (see [`Handle::spawn_on`]).
    pub fn spawn_on<F, Fut>(&self, cpu: usize, f: F) -> Result<TaskId, SimError>
    where
        F: FnOnce(Ctx) -> Fut,
        Fut: Future<Output = ()> + 'static,
    {
        self.h.spawn_on(cpu, f)
    }

    /// Spawns an agent task with no CPU (see [`Handle::spawn_agent`]).
    pub fn spawn_agent<F, Fut>(&self, f: F) -> Result<TaskId, SimError>
    where
        F: FnOnce(Ctx) -> Fut,
        Fut: Future<Output = ()> + 'static,
    {
        self.h.spawn_agent(f)
    }

    /// Runs until no wake-up is pending. The run ends at the last wake-up's time; tasks
    /// still blocked then are counted as live in the report.
    pub fn run(&mut self) -> Result<RunReport, SimError> {
        self.h.0.run_until(u64::MAX)?;
        Ok(self.h.report())
    }

    /// Runs every wake-up at or before `t`, then sets the clock to `t` (if it is
    /// earlier). Can be called again to continue.
    pub fn run_until(&mut self, t: SimTime) -> Result<RunReport, SimError> {
        self.h.0.run_until(t.0)?;
        Ok(self.h.report())
    }

    /// [`Sim::run_until`], telling the thread's progress hook ([`crate::progress::observe`])
    /// how far the run has come towards `total` after each of about a hundred steps; in one
    /// go when no hook is installed. The events processed, and so every result, are the same.
    pub fn run_until_observed(
        &mut self,
        t: SimTime,
        total: SimTime,
    ) -> Result<RunReport, SimError> {
        if crate::progress::observed() {
            let step = (total.0 / 100).max(100_000);
            let mut at = self.h.now().0;
            while at < t.0 {
                at = at.saturating_add(step).min(t.0);
                self.h.0.run_until(at)?;
                crate::progress::report(at, total.0);
            }
        }
        self.run_until(t)
    }

    /// The report as of now.
    pub fn report(&self) -> RunReport {
        self.h.report()
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        self.h.0.tracer.finish(self.h.now().0);
        self.h.0.clear_tasks();
    }
}

impl fmt::Debug for Sim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sim").field("now", &self.now()).finish()
    }
}

/// A task's context: its identity, its CPU, its random numbers and the clock.
pub struct Ctx {
    pub(crate) h: Handle,
    pub(crate) task: TaskRef,
    pub(crate) cpu: u32,
    rng: RefCell<Rng>,
    /// CPU time deferred with [`Cpu::defer`], charged by the task's next spend.
    debt: Debt,
}

/// CPU time a task has deferred ([`Cpu::defer`]) and not yet spent: its total and its
/// segments as (ns, account) in order (adjacent segments of one account merged).
#[derive(Default)]
pub(crate) struct Debt {
    ns: Cell<u64>,
    segs: RefCell<Vec<(u64, Account)>>,
}

impl Ctx {
    pub(crate) fn new(h: Handle, task: TaskRef, cpu: u32, seed: u64) -> Ctx {
        Ctx {
            h,
            task,
            cpu,
            rng: RefCell::new(Rng::seed_from_u64(seed)),
            debt: Debt::default(),
        }
    }

    /// The current virtual time.
    pub fn now(&self) -> SimTime {
        self.h.now()
    }

    /// This task's local time: the current time plus the CPU time it has deferred with
    /// [`Cpu::defer`] (the time its next spend starts from its own point of view).
    pub fn local_now(&self) -> SimTime {
        SimTime(self.h.now().0.saturating_add(self.debt.ns.get()))
    }

    /// The CPU time this task has deferred with [`Cpu::defer`] and not yet spent.
    pub fn deferred(&self) -> SimDuration {
        SimDuration::ns(self.debt.ns.get())
    }

    /// Checks (in debug builds) that the task has no deferred CPU time: every primitive
    /// that interacts with other tasks must be preceded by a spend that charges it.
    #[inline]
    pub(crate) fn debug_assert_no_debt(&self) {
        debug_assert!(
            self.debt.ns.get() == 0,
            "{:?} interacts with other tasks with {} ns of deferred CPU time not spent",
            self.task_id(),
            self.debt.ns.get()
        );
    }

    /// This task's id.
    pub fn task_id(&self) -> TaskId {
        TaskId(self.task)
    }

    /// The simulation handle.
    pub fn handle(&self) -> &Handle {
        &self.h
    }

    /// This task's CPU, or `None` for an agent.
    pub fn cpu_id(&self) -> Option<usize> {
        (self.cpu != NO_CPU).then_some(self.cpu as usize)
    }

    /// This task's CPU.
    ///
    /// # Panics
    ///
    /// If the task is an agent (spawned without a CPU): that is a bug in the scenario code,
    /// like spending CPU time in a device model.
    pub fn cpu(&self) -> Cpu<'_> {
        assert!(self.cpu != NO_CPU, "an agent task has no CPU to spend on");
        Cpu { ctx: self }
    }

    /// This task's random-number stream (xoshiro256**, seeded from the run seed and the
    /// task's spawn index).
    pub fn rng(&self) -> RefMut<'_, Rng> {
        self.rng.borrow_mut()
    }

    /// Blocks for `d` (the CPU is free meanwhile). Zero returns at once.
    pub fn sleep(&self, d: SimDuration) -> Sleep<'_> {
        let until = self.now() + d;
        self.sleep_until(until)
    }

    /// Blocks until `t` (returns at once if `t` is not in the future).
    pub fn sleep_until(&self, t: SimTime) -> Sleep<'_> {
        self.debug_assert_no_debt();
        Sleep {
            ctx: self,
            until: t.0,
            armed: false,
        }
    }

    /// Gives up the CPU: the task goes to the back of its CPU's run queue.
    pub fn yield_now(&self) -> YieldNow<'_> {
        YieldNow {
            ctx: self,
            yielded: false,
        }
    }

    /// Spawns a task pinned to `cpu`.
    pub fn spawn_on<F, Fut>(&self, cpu: usize, f: F) -> Result<TaskId, SimError>
    where
        F: FnOnce(Ctx) -> Fut,
        Fut: Future<Output = ()> + 'static,
    {
        self.h.spawn_on(cpu, f)
    }

    /// Spawns an agent task.
    pub fn spawn_agent<F, Fut>(&self, f: F) -> Result<TaskId, SimError>
    where
        F: FnOnce(Ctx) -> Fut,
        Fut: Future<Output = ()> + 'static,
    {
        self.h.spawn_agent(f)
    }

    /// Records a slice named `name` on this task's CPU track from `start` to now, when
    /// tracing (see [`crate::trace`]); for spans made of several awaits, such as a wait for
    /// a command-queue sync. Does nothing for an agent or when tracing is off.
    #[inline]
    pub fn trace_since(&self, name: &'static str, start: SimTime) {
        let tracer = self.h.tracer();
        if tracer.is_on() && self.cpu != NO_CPU {
            let now = self.now().0;
            tracer.slice(
                crate::trace::Track::Cpu(self.cpu),
                name,
                start.0,
                now.saturating_sub(start.0),
                &[],
            );
        }
    }

    #[inline]
    pub(crate) fn cpu_index(&self) -> u32 {
        assert!(self.cpu != NO_CPU, "an agent task has no CPU to spend on");
        self.cpu
    }
}

impl fmt::Debug for Ctx {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ctx")
            .field("task", &self.task_id())
            .field("cpu", &self.cpu_id())
            .finish()
    }
}

/// A task's CPU, for spending time on it.
#[derive(Clone, Copy, Debug)]
pub struct Cpu<'a> {
    ctx: &'a Ctx,
}

impl<'a> Cpu<'a> {
    /// The CPU's index.
    pub fn id(&self) -> usize {
        self.ctx.cpu as usize
    }

    /// Keeps the CPU busy for `d`, charged to `account`. Zero returns at once (unless CPU
    /// time was deferred, see [`Cpu::defer`]).
    pub fn spend(self, d: SimDuration, account: Account) -> Spend<'a> {
        self.spend_labeled(d, account, "")
    }

    /// Defers `d` of CPU time charged to `account`: the task's next spend (its next
    /// [`Cpu::spend`] or [`Cpu::spend_labeled`]) first spends everything deferred, in
    /// order and each part to its account, then its own span, as **one** span with one
    /// wake-up at its end (a fused span). Use it for pure CPU work that touches nothing
    /// another task can see (the task's own bookkeeping, its own random numbers) and that
    /// is followed by more CPU time: the run is that of separate spends, except that the
    /// intermediate wake-ups are gone, so the task's place among other events at the
    /// fused span's end is that of a wake-up scheduled at the span's start (see
    /// docs/ENGINE.md, "Fused spans"). [`Ctx::local_now`] is the time the task's next
    /// spend starts from its point of view.
    ///
    /// The deferred time must be spent before the task interacts with another task (a
    /// lock, a cache line, a channel, a completion, a sleep, a device): debug builds check
    /// the blocking primitives. A task that ends with deferred time never charges it.
    pub fn defer(self, d: SimDuration, account: Account) {
        if d.0 == 0 {
            return;
        }
        let debt = &self.ctx.debt;
        debt.ns.set(debt.ns.get().saturating_add(d.0));
        let mut segs = debt.segs.borrow_mut();
        match segs.last_mut() {
            Some((ns, a)) if *a == account => *ns += d.0,
            _ => segs.push((d.0, account)),
        }
    }

    /// [`Cpu::spend`] with a name for the timeline trace (`"dma map"`, `"dma unmap"` ...);
    /// an unlabeled spend is traced under its account's name. The label changes nothing
    /// else.
    pub fn spend_labeled(self, d: SimDuration, account: Account, label: &'static str) -> Spend<'a> {
        Spend {
            k: &self.ctx.h.0,
            task: self.ctx.task,
            cpu: self.ctx.cpu,
            ns: d.0,
            account,
            label,
            started: false,
            burn: Burn::default(),
            debt: (self.ctx.debt.ns.get() != 0).then_some(&self.ctx.debt),
        }
    }
}

/// Future of [`Cpu::spend`].
#[must_use = "futures do nothing unless awaited"]
pub struct Spend<'a> {
    /// The kernel, the task and its CPU, copied from the task's context when the spend is
    /// created (the context is at hand then): a poll then reads only the spend itself and
    /// the kernel, not the context in another part of the task's future.
    k: &'a Kernel,
    task: TaskRef,
    cpu: u32,
    ns: u64,
    account: Account,
    label: &'static str,
    started: bool,
    burn: Burn,
    /// The task's deferred CPU time, when it had some as the spend was created: the span
    /// is then fused ([`Cpu::defer`]).
    debt: Option<&'a Debt>,
}

impl Future for Spend<'_> {
    type Output = ();
    /// The poll that resumes a span (at its end, after a queue round trip) is a few
    /// instructions and is inlined at each await; the first poll is a call.
    #[inline(always)]
    fn poll(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<()> {
        let this = &mut *self;
        if !this.started {
            return this.first_poll();
        }
        let mut st = this.k.st.borrow_mut();
        if this.burn.poll(&mut st, this.cpu) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}

impl Spend<'_> {
    /// Starts the span: at once if its end is the next event, else by a wake-up at its end.
    #[inline(never)]
    fn first_poll(&mut self) -> Poll<()> {
        if let Some(debt) = self.debt {
            return self.first_poll_fused(debt);
        }
        let mut st = self.k.st.borrow_mut();
        self.started = true;
        let tracer = &self.k.tracer;
        if tracer.is_on() && self.ns != 0 {
            trace_spend(tracer, self, st.now);
        }
        if self
            .burn
            .begin(&mut st, self.cpu, self.task, self.account, self.ns)
        {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}

impl Spend<'_> {
    /// [`Spend::first_poll`] of a fused span: the task's deferred CPU time, then this
    /// spend's, as one span.
    #[inline(never)]
    fn first_poll_fused(&mut self, debt: &Debt) -> Poll<()> {
        let mut st = self.k.st.borrow_mut();
        self.started = true;
        let pre_ns = debt.ns.replace(0);
        let mut segs = debt.segs.borrow_mut();
        let tracer = &self.k.tracer;
        if tracer.is_on() {
            trace_fused(tracer, self, &segs, st.now);
        }
        let done = self.burn.begin_planned(
            &mut st,
            (self.cpu, self.task),
            &segs,
            pre_ns,
            self.account,
            self.ns,
        );
        segs.clear();
        if done {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }
}

/// Records a fused span that starts at `now`: each deferred segment, then the spend.
#[cold]
fn trace_fused(tracer: &crate::trace::Tracer, s: &Spend<'_>, segs: &[(u64, Account)], now: u64) {
    let mut at = now;
    for &(ns, account) in segs {
        tracer.slice(
            crate::trace::Track::Cpu(s.cpu),
            account_name(account),
            at,
            ns,
            &[],
        );
        at += ns;
    }
    if s.ns != 0 {
        trace_spend(tracer, s, at);
    }
}

/// The trace name of an unlabeled span of `account`.
fn account_name(account: Account) -> &'static str {
    match account {
        Account::User => "user",
        Account::System => "system",
        Account::Spin => "spin",
    }
}

/// Records a spend that starts at `now` (the task owns its CPU, so it runs to its end).
#[cold]
fn trace_spend(tracer: &crate::trace::Tracer, s: &Spend<'_>, now: u64) {
    let name = if s.label.is_empty() {
        account_name(s.account)
    } else {
        s.label
    };
    tracer.slice(crate::trace::Track::Cpu(s.cpu), name, now, s.ns, &[]);
}

impl Drop for Spend<'_> {
    /// Inlined: a spend is almost always dropped after its span is over, so the usual drop
    /// is one test; closing an abandoned span is a call.
    #[inline]
    fn drop(&mut self) {
        self.burn.release(self.k, self.cpu);
    }
}

/// Future of [`Ctx::sleep`] and [`Ctx::sleep_until`].
#[must_use = "futures do nothing unless awaited"]
pub struct Sleep<'a> {
    ctx: &'a Ctx,
    until: u64,
    armed: bool,
}

impl Future for Sleep<'_> {
    type Output = ();
    #[inline]
    fn poll(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<()> {
        let mut st = self.ctx.h.0.st.borrow_mut();
        if st.now >= self.until {
            return Poll::Ready(());
        }
        if !self.armed {
            let (until, task) = (self.until, self.ctx.task);
            st.schedule(until, task);
            drop(st);
            self.armed = true;
        }
        Poll::Pending
    }
}

/// Future of [`Ctx::yield_now`].
#[must_use = "futures do nothing unless awaited"]
pub struct YieldNow<'a> {
    ctx: &'a Ctx,
    yielded: bool,
}

impl Future for YieldNow<'_> {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<()> {
        if self.yielded {
            return Poll::Ready(());
        }
        self.yielded = true;
        let mut st = self.ctx.h.0.st.borrow_mut();
        let now = st.now;
        st.schedule(now, self.ctx.task);
        Poll::Pending
    }
}
