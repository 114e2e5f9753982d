//! A contended cache line: the cost model of loads, atomics and compare-and-swap on shared
//! data, as cache-coherence protocols price them.
//!
//! The line is a resource with a *last writer* (the CPU whose cache holds the newest
//! copy), the set of CPUs holding a copy of the current value, a *version* (how many times
//! the value changed) and a *busy-until* time. An access by CPU `c` issued at `t`:
//! - is granted the line after every access issued before it (`start = max(t,
//!   busy_until)`): transfers of one line serialise, in issue order;
//! - a load ([`CacheLine::read`]) by a CPU that holds a copy of the current value is a
//!   hit (free, no wait); otherwise it costs the transfer from the last writer and makes
//!   `c` a sharer;
//! - an atomic or store ([`CacheLine::rmw`]) needs the line exclusively: it costs
//!   [`LineParams::base_ns`] plus the transfer from the last writer (or one transfer to
//!   invalidate other sharers when `c` already has a copy), changes the version and
//!   leaves `c` the only holder;
//! - a compare-and-swap ([`CacheLine::cas`]) costs the same as an atomic and succeeds only
//!   if the version is still the one the CPU expected when the line is granted to it. A
//!   failed one returns the current version, so a retry loop's failures come from the
//!   interleaving of the CPUs' accesses, with no cap;
//! - the issuing CPU is busy from `t` until the access ends (a stalled core is a busy
//!   core), charged to the caller's account.
//!
//! A transfer costs the engine's [`Topology`](crate::engine::Topology) distance between
//! the two CPUs when the simulation has one, otherwise [`LineParams::transfer_ns`]. So one
//! CPU hammering a line pays `base_ns` per atomic, and `k` CPUs hammering it pay about
//! `k * (base_ns + transfer)` each.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use crate::accounting::{Account, LineStats};
use crate::engine::kernel::{Burn, Kernel, TaskRef, NO_CPU};
use crate::engine::{Ctx, Handle, SimError};

/// Costs of atomics on a shared cache line, in nanoseconds.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct LineParams {
    /// An atomic read-modify-write on a line already owned by the issuing CPU. Assumed
    /// 10 ns (about 20-30 cycles).
    pub base_ns: u64,
    /// Extra cost when the line must come from another CPU's cache (without a topology),
    /// and the round trip to the line's home for far atomics. Assumed 70 ns (same socket,
    /// cross-core).
    pub transfer_ns: u64,
    /// Where atomics execute.
    pub atomics: AtomicsAt,
}

/// Where a CPU's atomics (and compare-and-swaps) on a shared line execute.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub enum AtomicsAt {
    /// In the CPU's own cache (x86 locked instructions, Arm load/store-exclusive loops and
    /// near LSE atomics): the line moves to the CPU, which holds it until the next
    /// requester's snoop arrives, about half a transfer after the line reached it. A
    /// compare-and-swap that fails because the line changed since the CPU's read is retried
    /// at once by the caller's loop (in about one atomic's time, [`LineParams::base_ns`]):
    /// if that is within the hold, the retry finds the line still here and succeeds within
    /// the same grant; otherwise it waits its turn behind the other requesters.
    #[default]
    Near,
    /// At the line's home (Arm LSE far atomics, executed by the interconnect or the shared
    /// cache): the line never moves to the CPUs; the home executes atomics one at a time,
    /// each occupying it `service_ns`, in the order they arrive, and each CPU waits the
    /// round trip to the home (the topology's same-die transfer: homes are spread over the
    /// die's shared-cache slices; [`LineParams::transfer_ns`] without a topology) plus its
    /// turn, even uncontended. A failed compare-and-swap's
    /// retry goes back to the home and waits behind every request that arrived meanwhile.
    Far {
        /// The home's time per atomic, ns.
        service_ns: u64,
    },
}

impl Default for LineParams {
    fn default() -> Self {
        LineParams {
            base_ns: 10,
            transfer_ns: 70,
            atomics: AtomicsAt::Near,
        }
    }
}

/// What a CPU does to a line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    /// A plain load: needs a copy of the current value (shared ownership).
    Read,
    /// An atomic read-modify-write or a store: needs the line exclusively, always changes it.
    Rmw,
    /// A compare-and-swap expecting the value of this version: needs the line exclusively,
    /// changes it only if nothing else did since.
    Cas(u64),
}

pub(crate) struct LineState {
    params: LineParams,
    /// The CPU that last took the line exclusively (its cache holds the newest copy).
    last_cpu: u32,
    busy_until: u64,
    /// How many times the line's value changed (its version).
    version: u64,
    /// CPUs holding a copy of the current version (bit per CPU), the last writer included.
    sharers: Vec<u64>,
    pub(crate) stats: LineStats,
}

impl LineState {
    #[inline]
    fn shares(&self, cpu: u32) -> bool {
        cpu == self.last_cpu
            || self
                .sharers
                .get(cpu as usize / 64)
                .is_some_and(|w| w & (1 << (cpu % 64)) != 0)
    }

    /// Whether a CPU other than `cpu` holds a copy (which a write must invalidate).
    #[inline]
    fn others_share(&self, cpu: u32) -> bool {
        let (word, bit) = (cpu as usize / 64, 1u64 << (cpu % 64));
        self.sharers
            .iter()
            .enumerate()
            .any(|(i, &w)| (if i == word { w & !bit } else { w }) != 0)
    }

    #[inline]
    fn set_only_sharer(&mut self, cpu: u32) {
        self.sharers.iter_mut().for_each(|w| *w = 0);
        self.add_sharer(cpu);
    }

    #[inline]
    fn add_sharer(&mut self, cpu: u32) {
        let word = cpu as usize / 64;
        if self.sharers.len() <= word {
            self.sharers.resize(word + 1, 0);
        }
        self.sharers[word] |= 1 << (cpu % 64);
    }
}

/// What one access to a line did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Access {
    /// Its cost to the issuing CPU, waiting for the line included, ns.
    pub cost_ns: u64,
    /// For a compare-and-swap, whether it succeeded (always `true` otherwise).
    pub succeeded: bool,
    /// Compare-and-swap attempts the access made: 2 when a near attempt failed and its
    /// retry succeeded within the CPU's hold of the line ([`AtomicsAt::Near`]), else 1 (0
    /// for loads and plain atomics).
    pub attempts: u32,
    /// The version of the line's value the CPU saw (after its own change, if any): what a
    /// later compare-and-swap by this CPU must expect.
    pub version: u64,
}

/// A shared cache line registered with a simulation. Clones share the line.
#[derive(Clone)]
pub struct CacheLine {
    h: Handle,
    idx: usize,
}

impl fmt::Debug for CacheLine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CacheLine")
            .field("name", &self.stats().name)
            .finish()
    }
}

impl CacheLine {
    /// A line no CPU has touched yet (its first access pays no transfer).
    pub fn new(h: &Handle, name: impl Into<String>, params: LineParams) -> Result<Self, SimError> {
        let mut st = h.0.st.borrow_mut();
        st.check_resource_cap()?;
        st.lines.push(LineState {
            params,
            last_cpu: NO_CPU,
            busy_until: 0,
            version: 0,
            sharers: Vec::new(),
            stats: LineStats {
                name: name.into(),
                ..LineStats::default()
            },
        });
        Ok(CacheLine {
            h: h.clone(),
            idx: st.lines.len() - 1,
        })
    }

    /// The line's costs.
    pub fn params(&self) -> LineParams {
        self.h.0.st.borrow().lines[self.idx].params
    }

    /// The line's statistics so far.
    pub fn stats(&self) -> LineStats {
        self.h.0.st.borrow().lines[self.idx].stats.clone()
    }

    /// One atomic read-modify-write (or store) by the task's CPU, charged to `account`.
    /// The future resolves to what the access did (its cost, waiting for the line
    /// included).
    ///
    /// # Panics
    ///
    /// If the task is an agent (when called).
    pub fn rmw<'a>(&'a self, ctx: &'a Ctx, account: Account) -> LineAccess<'a> {
        self.access(ctx, account, Op::Rmw)
    }

    /// One plain load by the task's CPU: free if the CPU holds a copy of the current value,
    /// otherwise a transfer from the last writer, serialised with the line's other
    /// accesses. Resolves to the version read (what a compare-and-swap must expect).
    pub fn read<'a>(&'a self, ctx: &'a Ctx, account: Account) -> LineAccess<'a> {
        self.access(ctx, account, Op::Read)
    }

    /// A compare-and-swap by the task's CPU expecting the value of version `expected` (from
    /// an earlier [`CacheLine::read`] or access). It needs the line exclusively, like any
    /// atomic; it succeeds only if the value is still that version when the line is
    /// granted to it (accesses are granted in the order they are issued), and a failed one
    /// returns the current version, so retries and failures come from the interleaving.
    pub fn cas<'a>(&'a self, ctx: &'a Ctx, account: Account, expected: u64) -> LineAccess<'a> {
        self.access(ctx, account, Op::Cas(expected))
    }

    fn access<'a>(&'a self, ctx: &'a Ctx, account: Account, op: Op) -> LineAccess<'a> {
        ctx.debug_assert_no_debt();
        LineAccess {
            k: &self.h.0,
            idx: self.idx,
            task: ctx.task,
            cpu: ctx.cpu_index(),
            account,
            op,
            done: None,
            burn: Burn::default(),
        }
    }
}

/// Future of [`CacheLine::rmw`], [`CacheLine::read`] and [`CacheLine::cas`]; resolves to
/// the [`Access`].
#[must_use = "futures do nothing unless awaited"]
pub struct LineAccess<'a> {
    /// The kernel, the line's index, the task and its CPU, copied when the operation is
    /// created (a poll then reads only the future itself and the kernel).
    k: &'a Kernel,
    idx: usize,
    task: TaskRef,
    cpu: u32,
    account: Account,
    op: Op,
    done: Option<Access>,
    burn: Burn,
}

impl Future for LineAccess<'_> {
    type Output = Access;
    /// As for [`crate::engine::Spend`], the poll that resumes the operation at its end is
    /// inlined at each await and the first poll is a call.
    #[inline(always)]
    fn poll(mut self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<Access> {
        let this = &mut *self;
        let Some(done) = this.done else {
            return this.first_poll();
        };
        let mut st = this.k.st.borrow_mut();
        if this.burn.poll(&mut st, this.cpu) {
            Poll::Ready(done)
        } else {
            Poll::Pending
        }
    }
}

impl LineAccess<'_> {
    /// Takes the line (in issue order: the access is granted after every access issued
    /// before it) and starts the operation's span (at once if its end is the next event).
    #[inline(never)]
    fn first_poll(&mut self) -> Poll<Access> {
        let cpu = self.cpu;
        let mut st = self.k.st.borrow_mut();
        let now = st.now;
        let l = &st.lines[self.idx];
        if self.op == Op::Read && l.shares(cpu) {
            // A hit on the CPU's own copy of the current value.
            let done = Access {
                cost_ns: 0,
                succeeded: true,
                attempts: 0,
                version: l.version,
            };
            st.lines[self.idx].stats.reads += 1;
            self.done = Some(done);
            return Poll::Ready(done);
        }
        let (from, flat, base) = (l.last_cpu, l.params.transfer_ns, l.params.base_ns);
        let exclusive = self.op != Op::Read;
        let stale = matches!(self.op, Op::Cas(expected) if expected != l.version);
        let mut attempts = u32::from(matches!(self.op, Op::Cas(_)));
        let mut succeeded = !stale;
        let cost = match l.params.atomics {
            AtomicsAt::Far { service_ns } if exclusive => {
                // Executed at the home in arrival order; the CPU waits the round trip.
                let rt = st.home_round_trip_ns(flat);
                let arrive = now + rt / 2;
                let l = &mut st.lines[self.idx];
                let start = arrive.max(l.busy_until);
                l.busy_until = start + service_ns;
                l.last_cpu = NO_CPU;
                l.sharers.iter_mut().for_each(|w| *w = 0);
                l.busy_until + (rt - rt / 2) - now
            }
            AtomicsAt::Far { .. } => {
                // A load from the home: a round trip, no turn at the home's atomic unit.
                let rt = st.home_round_trip_ns(flat);
                st.lines[self.idx].add_sharer(cpu);
                rt
            }
            AtomicsAt::Near => {
                // The newest copy comes from the last writer; a write also invalidates the
                // other copies (in parallel with that transfer, or as one transfer when the
                // CPU already has the line shared).
                let mut transfer = st.transfer_ns(from, cpu, flat);
                if exclusive && transfer == 0 && l.others_share(cpu) {
                    transfer = flat;
                }
                let mut op = if exclusive { base } else { 0 } + transfer;
                if stale && base < transfer / 2 {
                    // The failed compare returned the current value; the loop's retry is
                    // issued before the next requester's snoop takes the line away.
                    op += 2 * base;
                    attempts = 2;
                    succeeded = true;
                }
                let l = &mut st.lines[self.idx];
                let start = now.max(l.busy_until);
                l.busy_until = start + op;
                if exclusive {
                    l.last_cpu = cpu;
                    l.set_only_sharer(cpu);
                } else {
                    l.add_sharer(cpu);
                }
                l.stats.transfers += u64::from(transfer > 0);
                l.busy_until - now
            }
        };
        let l = &mut st.lines[self.idx];
        match self.op {
            Op::Read => l.stats.reads += 1,
            Op::Rmw => {
                l.version += 1;
                l.stats.ops += 1;
            }
            Op::Cas(_) => {
                l.version += u64::from(succeeded);
                l.stats.ops += 1;
                l.stats.cas_attempts += u64::from(attempts);
                l.stats.cas_failures += u64::from(attempts) - u64::from(succeeded);
            }
        }
        l.stats.total_ns += cost;
        l.stats.max_ns = l.stats.max_ns.max(cost);
        let done = Access {
            cost_ns: cost,
            succeeded,
            attempts,
            version: l.version,
        };
        self.done = Some(done);
        if self.burn.begin(&mut st, cpu, self.task, self.account, cost) {
            Poll::Ready(done)
        } else {
            Poll::Pending
        }
    }
}

impl Drop for LineAccess<'_> {
    /// Inlined: the usual drop (the operation is over) is one test.
    #[inline]
    fn drop(&mut self) {
        self.burn.release(self.k, self.cpu);
    }
}
