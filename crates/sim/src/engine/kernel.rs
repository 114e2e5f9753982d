//! The executor's state and main loop (crate-private).
//!
//! Layout, chosen for speed without `unsafe`:
//! - one [`State`] in a `RefCell`, borrowed briefly by the loop and by every primitive's
//!   `poll` (never across a task poll);
//! - task futures in a separate `RefCell<Vec<..>>` slab, borrowed during a task's poll;
//!   tasks spawned meanwhile wait in a side list and are installed right after the poll;
//! - a hierarchical timing wheel ([`EventQueue`]) of future wake-ups, and a FIFO `ready` queue for
//!   wake-ups at the current instant (see [`State::next_event`] for why this preserves the
//!   total `(time, scheduling order)` order);
//! - wake-ups name a task by slot and generation, so stale wake-ups of a finished task are
//!   dropped and spurious wake-ups of a live task are harmless (every primitive re-checks
//!   its condition when polled).

use std::any::{Any, TypeId};
use std::cell::{Cell, RefCell, RefMut};
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};

use crate::accounting::{Account, CpuTimes, RunReport, TaskCounts};
use crate::engine::queue::EventQueue;
use crate::engine::rng::task_seed;
use crate::engine::{Ctx, Handle, Limits, SimError, SimTime, TaskId};
use crate::resources::cacheline::LineState;
use crate::resources::sleeplock::SleepState;
use crate::resources::spinlock::SpinState;

/// A task reference: `(generation << 32) | slot`.
pub(crate) type TaskRef = u64;
/// "No task".
pub(crate) const NO_TASK: TaskRef = u64::MAX;
/// "No CPU" (an agent task).
pub(crate) const NO_CPU: u32 = u32::MAX;

#[inline]
fn slot_of(t: TaskRef) -> usize {
    (t & 0xffff_ffff) as usize
}

/// Marks a queued event as a timer callback (`Handle::call_at`), not a task wake-up; the
/// low 32 bits are the timer's slot. Task generations are kept below 2^30, so no task
/// reference has this bit or [`TIMER_ARM`].
const TIMER: TaskRef = 1 << 63;
/// With [`TIMER`]: the timer's first event, which queues its expiry.
const TIMER_ARM: TaskRef = 1 << 62;
/// Task generations wrap within 30 bits (see [`TIMER`]).
const GEN_MASK: u32 = (1 << 30) - 1;

/// A timer's callback: a closure in a box that outlives its call, so the box can carry
/// the next closure of the same type (see [`Timers::spare`]).
trait TimerFn: Any {
    /// Runs the closure, leaving the box empty. Does nothing if it is empty.
    fn fire(&mut self);
    /// The box's contents, for refilling it with a closure of the same type.
    fn as_any_mut(&mut self) -> &mut dyn Any;
}

/// A closure that runs once.
struct OnceFn<F>(Option<F>);

impl<F: FnOnce() + 'static> TimerFn for OnceFn<F> {
    fn fire(&mut self) {
        if let Some(f) = self.0.take() {
            f();
        }
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

/// A timer's callback, boxed, with the type of its contents.
type Callback = (TypeId, Box<dyn TimerFn>);

/// Empty callback boxes kept per closure type (at most this many of each).
const SPARE_CALLBACKS: usize = 4096;

/// Pending timer callbacks by slot, with their expiry times.
#[derive(Default)]
struct Timers {
    slots: Vec<(u64, Option<Callback>)>,
    free: Vec<u32>,
    /// Emptied callback boxes by closure type, reused by the next `call_at` with a
    /// closure of that type (saves an allocation per timer). Few types ever use timers,
    /// so a list searched in order is enough.
    spare: Vec<(TypeId, Vec<Box<dyn TimerFn>>)>,
}

impl Timers {
    /// `f` in a box: a spare one of its type if there is one, else a new one.
    fn boxed<F: FnOnce() + 'static>(&mut self, f: F) -> Callback {
        let ty = TypeId::of::<OnceFn<F>>();
        let spare = self
            .spare
            .iter_mut()
            .find(|(t, _)| *t == ty)
            .and_then(|(_, boxes)| boxes.pop());
        if let Some(mut b) = spare {
            if let Some(slot) = b.as_any_mut().downcast_mut::<OnceFn<F>>() {
                slot.0 = Some(f);
                return (ty, b);
            }
        }
        (ty, Box::new(OnceFn(Some(f))))
    }

    /// Keeps a fired (empty) callback box for reuse.
    fn recycle(&mut self, (ty, b): Callback) {
        match self.spare.iter_mut().find(|(t, _)| *t == ty) {
            Some((_, boxes)) => {
                if boxes.len() < SPARE_CALLBACKS {
                    boxes.push(b);
                }
            }
            None => self.spare.push((ty, vec![b])),
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum TaskState {
    /// Waiting for a wake-up; not on a CPU.
    Blocked,
    /// On its CPU's run queue.
    Queued,
    /// Owns its CPU (or, for an agent, is being polled).
    Running,
    /// Finished; the slot is free.
    Done,
}

pub(crate) struct TaskSlot {
    gen: u32,
    state: TaskState,
    cpu: u32,
}

pub(crate) struct CpuState {
    occupant: TaskRef,
    runq: VecDeque<TaskRef>,
    busy: Option<Account>,
    since: u64,
    acct: [u64; 3],
    /// The deferred segments of a fused span in progress ([`State::begin_busy_planned`]),
    /// as (end time, account), before its final segment (charged to `busy`); empty for a
    /// plain busy interval. Reused, so a fused span allocates nothing once it has grown.
    plan: Vec<(u64, Account)>,
}

impl CpuState {
    /// Charges the busy interval in progress, from `since` to `now`, into `a`: the fused
    /// span's segments in order, then the final account up to `now`.
    #[inline]
    fn charge_busy(&self, now: u64, a: &mut [u64; 3]) {
        let Some(k) = self.busy else { return };
        let mut start = self.since;
        for &(end, acct) in &self.plan {
            if now <= start {
                return;
            }
            a[acct as usize] += end.min(now) - start;
            start = end;
        }
        if now > start {
            a[k as usize] += now - start;
        }
    }
}

pub(crate) struct State {
    pub(crate) now: u64,
    queue: EventQueue,
    ready: VecDeque<TaskRef>,
    events: u64,
    tasks: Vec<TaskSlot>,
    free: Vec<u32>,
    cpus: Vec<CpuState>,
    /// Set by a primitive that returns `Pending` while its task keeps the CPU (spending or
    /// spinning). Cleared before every poll.
    pub(crate) keep_cpu: bool,
    error: Option<SimError>,
    /// The time limit of the `run_until` in progress.
    run_limit: u64,
    /// The kernel's foreign wake-ups (a pending one must be scheduled before time moves).
    foreign: Arc<ForeignWakes>,
    limits: Limits,
    seed: u64,
    spawned: u64,
    finished: u64,
    live: u64,
    pub(crate) spin: Vec<SpinState>,
    pub(crate) sleep: Vec<SleepState>,
    pub(crate) lines: Vec<LineState>,
    /// CPU placement and line-transfer costs (`None`: every line's flat transfer cost).
    pub(crate) topology: Option<Box<super::topology::Topology>>,
}

impl State {
    /// Wakes `task` at `at` (at once if `at <= now`). Records an error, which stops the
    /// run, if the pending-event cap is reached.
    #[inline(always)]
    pub(crate) fn schedule(&mut self, at: u64, task: TaskRef) {
        if !self.room_for_event() {
            return;
        }
        if at <= self.now {
            self.ready.push_back(task);
        } else {
            self.queue.push(at, task);
        }
    }

    /// [`State::schedule`] of a wake-up known to be later than now (the end of a span of
    /// at least 1 ns): no test for the current instant.
    #[inline(always)]
    pub(crate) fn schedule_later(&mut self, at: u64, task: TaskRef) {
        debug_assert!(at > self.now);
        if self.room_for_event() {
            self.queue.push(at, task);
        }
    }

    /// Whether one more event fits under the pending-event cap; records the error when not.
    #[inline(always)]
    fn room_for_event(&mut self) -> bool {
        if self.queue.len() + self.ready.len() >= self.limits.max_pending_events {
            self.too_many_events();
            return false;
        }
        true
    }

    #[cold]
    #[inline(never)]
    fn too_many_events(&mut self) {
        if self.error.is_none() {
            self.error = Some(SimError::TooManyEvents {
                max: self.limits.max_pending_events,
            });
        }
    }

    /// The next wake-up at or before `limit`, advancing the clock to it.
    ///
    /// Wake-ups for the current instant that were scheduled earlier (in the event queue)
    /// come before those scheduled at this instant (in `ready`): they were pushed while
    /// the clock was earlier. The clock only advances when `ready` is empty, and then all
    /// of the next instant's wake-ups move to the front at once. Together this is exactly
    /// the order of `(time, scheduling order)`.
    #[inline]
    fn next_event(&mut self, limit: u64) -> Option<TaskRef> {
        if let Some(t) = self.queue.pop_at_base() {
            return Some(t);
        }
        if let Some(t) = self.ready.pop_front() {
            return Some(t);
        }
        let (at, t) = self.queue.pop_next(limit)?;
        self.now = at;
        Some(t)
    }

    /// Spends `ns` on `cpu` for the running task at once, without a wake-up, when that
    /// wake-up would be the very next event the loop takes: nothing is ready at this
    /// instant, every queued event is later than the span's end, the end is within the
    /// current run's limit, and scheduling would not hit the pending-event cap. The clock
    /// then moves to the end exactly as popping the wake-up would have (and the event is
    /// counted), so the run is unchanged; only the queue round trip and the re-poll are
    /// saved. Returns whether it did.
    #[inline]
    pub(crate) fn spend_now(&mut self, cpu: u32, account: Account, ns: u64) -> bool {
        let end = self.now.saturating_add(ns);
        // The usual refusal with many CPUs (another CPU's event comes first) is tested
        // first.
        if end >= self.queue.earliest()
            || !self.ready.is_empty()
            || end > self.run_limit
            || self.error.is_some()
            || self.foreign.pending.load(Ordering::Acquire)
            // (`ready` is empty here.)
            || self.queue.len() >= self.limits.max_pending_events
        {
            return false;
        }
        let c = &mut self.cpus[cpu as usize];
        debug_assert!(c.busy.is_none(), "CPU {cpu} is already busy");
        c.acct[account as usize] += ns;
        self.now = end;
        self.events += 1;
        true
    }

    /// [`State::spend_now`] for a fused span: the deferred segments `pre` (as (ns,
    /// account), in order, `pre_ns` in all), then `ns` charged to `account`.
    #[inline]
    pub(crate) fn spend_now_planned(
        &mut self,
        cpu: u32,
        pre: &[(u64, Account)],
        pre_ns: u64,
        account: Account,
        ns: u64,
    ) -> bool {
        let total = pre_ns.saturating_add(ns);
        if !self.spend_now(cpu, account, total) {
            return false;
        }
        // `spend_now` charged the whole span to `account`; move the segments to theirs.
        let c = &mut self.cpus[cpu as usize];
        for &(d, a) in pre {
            c.acct[account as usize] -= d;
            c.acct[a as usize] += d;
        }
        true
    }

    /// Starts a fused busy interval on `cpu`: the deferred segments `pre` (as (ns,
    /// account), in order) from now, then the final segment charged to `account` until the
    /// interval ends. Reports cut through it charge each segment exactly as separate
    /// spends would have.
    #[inline]
    pub(crate) fn begin_busy_planned(
        &mut self,
        cpu: u32,
        pre: &[(u64, Account)],
        account: Account,
    ) {
        let now = self.now;
        let c = &mut self.cpus[cpu as usize];
        debug_assert!(c.busy.is_none(), "CPU {cpu} is already busy");
        c.busy = Some(account);
        c.since = now;
        c.plan.clear();
        let mut end = now;
        for &(d, a) in pre {
            end = end.saturating_add(d);
            c.plan.push((end, a));
        }
    }

    /// Starts a busy interval on `cpu`.
    #[inline]
    pub(crate) fn begin_busy(&mut self, cpu: u32, account: Account) {
        let c = &mut self.cpus[cpu as usize];
        debug_assert!(c.busy.is_none(), "CPU {cpu} is already busy");
        c.busy = Some(account);
        c.since = self.now;
    }

    /// Ends the busy interval on `cpu`, if any, charging it to its account.
    #[inline]
    pub(crate) fn end_busy(&mut self, cpu: u32) {
        let now = self.now;
        let c = &mut self.cpus[cpu as usize];
        if let Some(a) = c.busy {
            if c.plan.is_empty() {
                c.acct[a as usize] += now - c.since;
            } else {
                let mut acct = c.acct;
                c.charge_busy(now, &mut acct);
                c.acct = acct;
                c.plan.clear();
            }
            c.busy = None;
        }
    }

    fn release_cpu(&mut self, cpu: u32) {
        let c = &mut self.cpus[cpu as usize];
        c.occupant = NO_TASK;
        if let Some(next) = c.runq.pop_front() {
            c.occupant = next;
            self.tasks[slot_of(next)].state = TaskState::Running;
            // Not counted against the pending-event cap: it replaces the wake-up that put
            // the task on the run queue.
            self.ready.push_back(next);
        }
    }

    fn finish(&mut self, task: TaskRef) {
        let slot = slot_of(task);
        let t = &mut self.tasks[slot];
        t.state = TaskState::Done;
        t.gen = t.gen.wrapping_add(1) & GEN_MASK;
        let cpu = t.cpu;
        self.free.push(slot as u32);
        self.live -= 1;
        self.finished += 1;
        if cpu != NO_CPU {
            // A finished future cannot be mid-spend, unless it leaked one; close it anyway.
            self.end_busy(cpu);
            if self.cpus[cpu as usize].occupant == task {
                self.release_cpu(cpu);
            }
        }
    }

    fn block(&mut self, task: TaskRef) {
        let t = &mut self.tasks[slot_of(task)];
        t.state = TaskState::Blocked;
        let cpu = t.cpu;
        if cpu != NO_CPU && self.cpus[cpu as usize].occupant == task {
            self.release_cpu(cpu);
        }
    }

    fn cpu_times(&self) -> Vec<CpuTimes> {
        self.cpus
            .iter()
            .map(|c| {
                let mut a = c.acct;
                c.charge_busy(self.now, &mut a);
                let busy = a[0] + a[1] + a[2];
                debug_assert!(busy <= self.now, "busy time exceeds elapsed time");
                CpuTimes {
                    user: a[0],
                    system: a[1],
                    spin: a[2],
                    idle: self.now.saturating_sub(busy),
                }
            })
            .collect()
    }

    pub(crate) fn cpu_count(&self) -> usize {
        self.cpus.len()
    }

    /// Records `e`, which stops the run (the first error recorded wins).
    /// What moving a cache line from CPU `from` to CPU `to` costs: the topology's
    /// distance cost, or `flat_ns` without a topology (0 for the same CPU or no CPU).
    #[inline]
    pub(crate) fn transfer_ns(&self, from: u32, to: u32, flat_ns: u64) -> u64 {
        if from == to || from == NO_CPU || to == NO_CPU {
            return 0;
        }
        match &self.topology {
            Some(t) => t.transfer_ns(from, to),
            None => flat_ns,
        }
    }

    /// The round trip from a CPU to a line's home in the shared cache, for far atomics: the
    /// topology's same-die transfer, or `flat_ns` without a topology.
    #[inline]
    pub(crate) fn home_round_trip_ns(&self, flat_ns: u64) -> u64 {
        self.topology
            .as_ref()
            .map_or(flat_ns, |t| t.costs().same_die_ns)
    }

    pub(crate) fn fail(&mut self, e: SimError) {
        if self.error.is_none() {
            self.error = Some(e);
        }
    }

    pub(crate) fn check_resource_cap(&self) -> Result<(), SimError> {
        let n = self.spin.len() + self.sleep.len() + self.lines.len();
        if n >= self.limits.max_resources {
            Err(SimError::TooManyResources {
                max: self.limits.max_resources,
            })
        } else {
            Ok(())
        }
    }
}

/// Wake-ups through a `std::task::Waker`, for futures that are not the engine's own
/// (the engine's primitives wake tasks by id). Rare path; a mutex keeps it safe code.
struct ForeignWakes {
    pending: AtomicBool,
    list: Mutex<Vec<TaskRef>>,
}

struct TaskWaker {
    /// The task it wakes; rewritten when a finished task's waker is reused for a new task
    /// (only when nothing else holds it, so no stale waker can see the change).
    task: AtomicU64,
    shared: Arc<ForeignWakes>,
}

impl Wake for TaskWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        let mut l = self.shared.list.lock().unwrap_or_else(|e| e.into_inner());
        l.push(self.task.load(Ordering::Relaxed));
        self.shared.pending.store(true, Ordering::Release);
    }
}

struct TaskFuture {
    fut: Pin<Box<dyn Future<Output = ()>>>,
    waker: Waker,
    /// The waker's shared part, kept to reuse it for a later task.
    inner: Arc<TaskWaker>,
}

fn install(futs: &mut Vec<Option<TaskFuture>>, slot: usize, tf: TaskFuture) {
    if futs.len() <= slot {
        futs.resize_with(slot + 1, || None);
    }
    futs[slot] = Some(tf);
}

pub(crate) struct Kernel {
    pub(crate) st: RefCell<State>,
    /// Task futures by slot. Borrowed for the whole of a task's poll.
    futs: RefCell<Vec<Option<TaskFuture>>>,
    /// Futures of tasks spawned while `futs` was borrowed (by a task being polled).
    spawned: RefCell<Vec<(usize, TaskFuture)>>,
    /// Whether `spawned` may hold futures (set when one is put there, cleared when they
    /// are installed): the test after every event is one flag, not a borrow.
    has_spawned: Cell<bool>,
    foreign: Arc<ForeignWakes>,
    /// Wakers of finished tasks that nothing else holds, reused by new tasks (saves an
    /// allocation per spawn).
    spare_wakers: RefCell<Vec<Arc<TaskWaker>>>,
    /// The timeline recorder (off unless the simulation was created under
    /// [`crate::trace::capture`]).
    pub(crate) tracer: crate::trace::Tracer,
    /// Timer callbacks (`Handle::call_at`).
    timers: RefCell<Timers>,
}

impl Kernel {
    /// A waker for `task`: a reused one if available.
    fn waker_for(&self, task: TaskRef) -> (Waker, Arc<TaskWaker>) {
        let inner = match self.spare_wakers.borrow_mut().pop() {
            Some(w) => {
                w.task.store(task, Ordering::Relaxed);
                w
            }
            None => Arc::new(TaskWaker {
                task: AtomicU64::new(task),
                shared: self.foreign.clone(),
            }),
        };
        (Waker::from(inner.clone()), inner)
    }

    /// Drops a finished task's future and keeps its waker for reuse if nothing else holds
    /// it.
    fn retire(&self, tf: TaskFuture) {
        let TaskFuture { fut, waker, inner } = tf;
        drop(fut);
        drop(waker);
        if Arc::strong_count(&inner) == 1 {
            let mut spare = self.spare_wakers.borrow_mut();
            if spare.len() < 4096 {
                spare.push(inner);
            }
        }
    }

    pub(crate) fn new(cpus: usize, seed: u64, limits: Limits) -> Self {
        let tracer = crate::trace::Tracer::for_new_sim(cpus);
        let cpus = (0..cpus)
            .map(|_| CpuState {
                occupant: NO_TASK,
                runq: VecDeque::new(),
                busy: None,
                since: 0,
                acct: [0; 3],
                plan: Vec::new(),
            })
            .collect();
        let foreign = Arc::new(ForeignWakes {
            pending: AtomicBool::new(false),
            list: Mutex::new(Vec::new()),
        });
        Kernel {
            st: RefCell::new(State {
                foreign: foreign.clone(),
                now: 0,
                queue: EventQueue::new(),
                ready: VecDeque::new(),
                events: 0,
                tasks: Vec::new(),
                free: Vec::new(),
                cpus,
                keep_cpu: false,
                error: None,
                run_limit: 0,
                limits,
                seed,
                spawned: 0,
                finished: 0,
                live: 0,
                spin: Vec::new(),
                sleep: Vec::new(),
                lines: Vec::new(),
                topology: None,
            }),
            futs: RefCell::new(Vec::new()),
            spawned: RefCell::new(Vec::new()),
            has_spawned: Cell::new(false),
            foreign,
            spare_wakers: RefCell::new(Vec::new()),
            tracer,
            timers: RefCell::new(Timers::default()),
        }
    }

    /// Runs `f` at virtual time `at` (at once, in this instant's order, if `at` is not
    /// later than now): exactly the run of an agent spawned now whose body is
    /// `sleep_until(at).await; f()`, with the same events in the same order, the same spawn
    /// index consumed (so later tasks' random streams do not move) and the same task
    /// counts, but without a task, a future, a waker or a task slot.
    ///
    /// The closure's box is reused from an earlier timer with a closure of the same type
    /// when one has fired (no allocation per timer in the steady state).
    pub(crate) fn call_at<F: FnOnce() + 'static>(&self, at: u64, f: F) -> Result<(), SimError> {
        let mut st = self.st.borrow_mut();
        if st.live >= st.limits.max_tasks as u64 {
            return Err(SimError::TooManyTasks {
                max: st.limits.max_tasks,
            });
        }
        if st.queue.len() + st.ready.len() >= st.limits.max_pending_events {
            return Err(SimError::TooManyEvents {
                max: st.limits.max_pending_events,
            });
        }
        let mut timers = self.timers.borrow_mut();
        let f = timers.boxed(f);
        let id = match timers.free.pop() {
            Some(id) => {
                timers.slots[id as usize] = (at, Some(f));
                id
            }
            None => {
                timers.slots.push((at, Some(f)));
                (timers.slots.len() - 1) as u32
            }
        };
        st.spawned += 1;
        st.live += 1;
        let now = st.now;
        st.schedule(now, TIMER | TIMER_ARM | TaskRef::from(id));
        Ok(())
    }

    pub(crate) fn spawn<F, Fut>(
        self: &Rc<Self>,
        cpu: Option<usize>,
        make: F,
    ) -> Result<TaskId, SimError>
    where
        F: FnOnce(Ctx) -> Fut,
        Fut: Future<Output = ()> + 'static,
    {
        let (task, cpu, seed) = {
            let mut st = self.st.borrow_mut();
            let cpu = match cpu {
                Some(c) if c >= st.cpus.len() => {
                    return Err(SimError::NoSuchCpu {
                        cpu: c,
                        cpus: st.cpus.len(),
                    })
                }
                Some(c) => c as u32,
                None => NO_CPU,
            };
            if st.live >= st.limits.max_tasks as u64 {
                return Err(SimError::TooManyTasks {
                    max: st.limits.max_tasks,
                });
            }
            if st.queue.len() + st.ready.len() >= st.limits.max_pending_events {
                return Err(SimError::TooManyEvents {
                    max: st.limits.max_pending_events,
                });
            }
            let slot = match st.free.pop() {
                Some(s) => s as usize,
                None => {
                    st.tasks.push(TaskSlot {
                        gen: 0,
                        state: TaskState::Done,
                        cpu: NO_CPU,
                    });
                    st.tasks.len() - 1
                }
            };
            let t = &mut st.tasks[slot];
            t.state = TaskState::Blocked;
            t.cpu = cpu;
            let task = (u64::from(t.gen) << 32) | slot as u64;
            // Each task gets its own stream, derived from the run seed and its spawn index,
            // so adding a task does not shift the random numbers of the others.
            let seed = task_seed(st.seed, st.spawned);
            st.spawned += 1;
            st.live += 1;
            let now = st.now;
            st.schedule(now, task);
            (task, cpu, seed)
        };
        let ctx = Ctx::new(Handle(self.clone()), task, cpu, seed);
        let fut: Pin<Box<dyn Future<Output = ()>>> = Box::pin(make(ctx));
        let (waker, inner) = self.waker_for(task);
        let tf = TaskFuture { fut, waker, inner };
        match self.futs.try_borrow_mut() {
            Ok(mut futs) => install(&mut futs, slot_of(task), tf),
            // Spawned by a task being polled: installed right after its poll.
            Err(_) => {
                self.spawned.borrow_mut().push((slot_of(task), tf));
                self.has_spawned.set(true);
            }
        }
        Ok(TaskId(task))
    }

    /// Runs wake-ups up to and including virtual time `limit`; then, if the clock is
    /// earlier and `limit` is finite, moves it to `limit`.
    pub(crate) fn run_until(&self, limit: u64) -> Result<(), SimError> {
        // The state stays borrowed from one event to the next: it is released only for a
        // task's poll, a timer callback and what may touch the engine (a retired future,
        // foreign wake-ups), which saves a borrow per event.
        let mut st = self.st.borrow_mut();
        st.run_limit = limit;
        loop {
            // Tested before taking it: moving the `Option` out costs on every event.
            if st.error.is_some() {
                if let Some(e) = st.error.take() {
                    return Err(e);
                }
            }
            let Some(task) = st.next_event(limit) else {
                if limit != u64::MAX && st.now < limit {
                    st.now = limit;
                }
                return Ok(());
            };
            if task & TIMER != 0 {
                // Counted as the agent's poll it stands for.
                st.events += 1;
                let id = slot_of(task);
                let fire = {
                    let mut timers = self.timers.borrow_mut();
                    let at = timers.slots[id].0;
                    if task & TIMER_ARM != 0 && at > st.now {
                        st.schedule(at, TIMER | id as TaskRef);
                        None
                    } else {
                        st.live -= 1;
                        st.finished += 1;
                        timers.free.push(id as u32);
                        timers.slots[id].1.take()
                    }
                };
                // Outside every borrow: the callback may schedule, send and spawn.
                if let Some(mut f) = fire {
                    drop(st);
                    f.1.fire();
                    self.timers.borrow_mut().recycle(f);
                    st = self.st.borrow_mut();
                }
                st = self.after_event(st);
                continue;
            }
            let slot = slot_of(task);
            let t = &mut st.tasks[slot];
            if t.gen != (task >> 32) as u32 {
                continue; // stale wake-up of a finished task
            }
            match t.state {
                TaskState::Done | TaskState::Queued => continue,
                TaskState::Running => {}
                TaskState::Blocked => {
                    let cpu = t.cpu;
                    if cpu == NO_CPU {
                        t.state = TaskState::Running;
                    } else {
                        let c = &mut st.cpus[cpu as usize];
                        if c.occupant == NO_TASK {
                            c.occupant = task;
                            st.tasks[slot].state = TaskState::Running;
                        } else {
                            c.runq.push_back(task);
                            st.tasks[slot].state = TaskState::Queued;
                            continue;
                        }
                    }
                }
            }
            st.keep_cpu = false;
            st.events += 1;
            drop(st);
            let mut futs = self.futs.borrow_mut();
            let tf = futs[slot].as_mut().expect("a live task has its future");
            let poll = tf.fut.as_mut().poll(&mut Context::from_waker(&tf.waker));
            match poll {
                Poll::Ready(()) => {
                    let done = futs[slot].take();
                    drop(futs);
                    self.st.borrow_mut().finish(task);
                    // Outside any borrow: dropping may touch the engine.
                    if let Some(tf) = done {
                        self.retire(tf);
                    }
                    st = self.st.borrow_mut();
                }
                Poll::Pending => {
                    drop(futs);
                    st = self.st.borrow_mut();
                    if !st.keep_cpu {
                        st.block(task);
                    }
                }
            }
            st = self.after_event(st);
        }
    }

    /// What follows every event: install the tasks spawned during it, take foreign
    /// wake-ups. Takes and hands back the loop's borrow of the state.
    #[inline(always)]
    fn after_event<'a>(&'a self, st: RefMut<'a, State>) -> RefMut<'a, State> {
        if self.has_spawned.get() {
            self.install_spawned();
        }
        if self.foreign.pending.load(Ordering::Acquire) {
            drop(st);
            self.drain_foreign();
            return self.st.borrow_mut();
        }
        st
    }

    /// Installs the futures of the tasks spawned during a poll.
    #[inline(never)]
    fn install_spawned(&self) {
        self.has_spawned.set(false);
        let mut new = std::mem::take(&mut *self.spawned.borrow_mut());
        let mut futs = self.futs.borrow_mut();
        for (slot, tf) in new.drain(..) {
            install(&mut futs, slot, tf);
        }
        // Installing spawns nothing: hand the (empty) buffer back, keeping its capacity, so
        // a spawn per event does not allocate the side list each time.
        let mut side = self.spawned.borrow_mut();
        if side.is_empty() {
            *side = new;
        }
    }

    fn drain_foreign(&self) {
        let woken = {
            let mut l = self.foreign.list.lock().unwrap_or_else(|e| e.into_inner());
            self.foreign.pending.store(false, Ordering::Release);
            std::mem::take(&mut *l)
        };
        let mut st = self.st.borrow_mut();
        for t in woken {
            let now = st.now;
            st.schedule(now, t);
        }
    }

    pub(crate) fn report(&self) -> RunReport {
        let st = self.st.borrow();
        let cpus = st.cpu_times();
        RunReport {
            end: SimTime(st.now),
            events: st.events,
            total: RunReport::total_of(&cpus),
            cpus,
            spin_locks: st.spin.iter().map(|s| s.line.stats.clone()).collect(),
            sleep_locks: st.sleep.iter().map(|s| s.line.stats.clone()).collect(),
            cache_lines: st.lines.iter().map(|s| s.stats.clone()).collect(),
            tasks: TaskCounts {
                spawned: st.spawned,
                finished: st.finished,
                live: st.live,
            },
        }
    }

    /// Drops every task future (breaking `Rc` cycles through their contexts).
    pub(crate) fn clear_tasks(&self) {
        let futs = std::mem::take(&mut *self.futs.borrow_mut());
        let spawned = std::mem::take(&mut *self.spawned.borrow_mut());
        let timers = std::mem::take(&mut *self.timers.borrow_mut());
        drop(futs);
        drop(spawned);
        drop(timers);
    }
}

/// A helper for primitives that keep their task's CPU busy for a fixed span: starts the
/// busy interval, schedules the wake-up, and closes the interval when the span is over.
#[derive(Default)]
pub(crate) struct Burn {
    end: u64,
    active: bool,
}

impl Burn {
    /// Spends `ns` on `cpu` for `task`: at once when the span's end is the next event
    /// ([`State::spend_now`]), else by starting the burn. Returns `true` if the span is
    /// already over (spent at once, or nothing to burn).
    #[inline]
    pub(crate) fn begin(
        &mut self,
        st: &mut State,
        cpu: u32,
        task: TaskRef,
        account: Account,
        ns: u64,
    ) -> bool {
        (ns != 0 && st.spend_now(cpu, account, ns)) || self.start(st, cpu, task, account, ns)
    }

    /// Starts burning `ns` on `cpu` for `task`. Returns `true` if there is nothing to burn.
    #[inline]
    pub(crate) fn start(
        &mut self,
        st: &mut State,
        cpu: u32,
        task: TaskRef,
        account: Account,
        ns: u64,
    ) -> bool {
        if ns == 0 {
            return true;
        }
        st.begin_busy(cpu, account);
        self.end = st.now + ns;
        self.active = true;
        st.schedule_later(self.end, task);
        st.keep_cpu = true;
        false
    }

    /// Whether the span is over; closes the busy interval when it is.
    #[inline]
    pub(crate) fn poll(&mut self, st: &mut State, cpu: u32) -> bool {
        if !self.active {
            return true;
        }
        if st.now < self.end {
            st.keep_cpu = true;
            return false;
        }
        st.end_busy(cpu);
        self.active = false;
        true
    }

    /// Starts burning a fused span on `cpu` for `task`: the deferred segments `pre`
    /// (`pre_ns` in all), then `ns` charged to `account`; at once when its end is the next
    /// event. Returns `true` if the span is already over.
    #[inline]
    pub(crate) fn begin_planned(
        &mut self,
        st: &mut State,
        (cpu, task): (u32, TaskRef),
        pre: &[(u64, Account)],
        pre_ns: u64,
        account: Account,
        ns: u64,
    ) -> bool {
        let total = pre_ns.saturating_add(ns);
        if total == 0 || st.spend_now_planned(cpu, pre, pre_ns, account, ns) {
            return true;
        }
        st.begin_busy_planned(cpu, pre, account);
        self.end = st.now + total;
        self.active = true;
        st.schedule_later(self.end, task);
        st.keep_cpu = true;
        false
    }

    /// Closes the busy interval early (the future was dropped).
    pub(crate) fn cancel(&mut self, st: &mut State, cpu: u32) {
        if self.active {
            st.end_busy(cpu);
            self.active = false;
        }
    }

    /// What dropping the future that owns this span does: nothing when the span is over
    /// (the usual case, one inlined test); an abandoned span closes its CPU's busy
    /// interval, in a cold call.
    #[inline]
    pub(crate) fn release(&mut self, k: &Kernel, cpu: u32) {
        if self.active {
            self.release_abandoned(k, cpu);
        }
    }

    #[cold]
    #[inline(never)]
    fn release_abandoned(&mut self, k: &Kernel, cpu: u32) {
        if let Ok(mut st) = k.st.try_borrow_mut() {
            self.cancel(&mut st, cpu);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn timer_boxes_are_reused_per_closure_type_and_carry_the_new_captures() {
        let mut timers = Timers::default();
        let seen = Rc::new(Cell::new(0u64));
        let make = |v: u64| {
            let seen = seen.clone();
            move || seen.set(seen.get() * 10 + v)
        };
        let mut a = timers.boxed(make(1));
        let first = &*a.1 as *const dyn TimerFn as *const u8;
        a.1.fire();
        // Fired once: firing the emptied box again does nothing.
        a.1.fire();
        assert_eq!(seen.get(), 1);
        timers.recycle(a);
        // The next closure of the same type goes into the same box.
        let mut b = timers.boxed(make(2));
        assert_eq!(&*b.1 as *const dyn TimerFn as *const u8, first);
        // A closure of another type gets its own box.
        let other = seen.clone();
        let mut c = timers.boxed(move || other.set(other.get() * 10 + 3));
        assert_ne!(c.0, b.0);
        b.1.fire();
        c.1.fire();
        assert_eq!(seen.get(), 123);
        timers.recycle(b);
        timers.recycle(c);
        assert_eq!(timers.spare.len(), 2);
    }
}
